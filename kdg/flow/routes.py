"""Routes: which table each record goes to.

A pipeline is a list of :class:`Route`. Each takes topics, by name or by a pattern, and writes one
table or a table *template*: ``mt_{topic}``, ``{1}`` or ``{name}`` for the pattern's groups, and for
Debezium envelopes ``{source.schema}`` / ``{source.table}``. With no pipeline file, the command line
is one route.

The :class:`Router` answers, per topic, which route takes it and which table it writes, once; a topic
two routes take, or a template that yields no valid table name, is refused for that topic (a
:class:`~kdg.errors.UsageError` naming the route, the topic and the name). A refused topic is never
skipped: its records would be lost.
"""

import re
from dataclasses import dataclass, field, replace

from kdg.errors import UsageError
from kdg.settings import TableName, table_name

_FIELD = re.compile(r"\{([^{}]*)\}")
SOURCE_FIELDS = ("source.schema", "source.table", "source.db")


@dataclass(frozen=True)
class Route:
    """Topics (names, or a pattern) into a table or table template; a mapping makes it a typed route."""

    name: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None          # a regular expression every topic it takes matches whole
    table: str = "kdg_events"           # a table name, or a template of one
    mapping: object = None              # kdg.mapping.Mapping (its table is the template's; see table_for)
    id_from: str | None = None          # --id-from: the key of records without a kdg-id header
    transform: object = None            # module:function (or a function): kdg.flow.transform
    fan: str | None = None              # a fan-out's name ([[route.into]]): its routes take the same topics
    options: dict = field(default_factory=dict, compare=False)  # what else the file said (kept for reports)

    def __post_init__(self) -> None:
        if not self.topics and not self.pattern:
            raise UsageError(f"{self.name}: give topics or a topic pattern")
        if self.pattern is not None:
            try:
                compiled = re.compile(self.pattern)
            except re.error as exc:
                raise UsageError(f"{self.name}: topic pattern {self.pattern!r} is not a regular expression "
                                 f"({exc})") from None
            unread = unread_by_librdkafka(_anchored(self.pattern))
            if unread is not None:
                raise UsageError(f"{self.name}: topic pattern {self.pattern!r}: the Kafka client's regular expressions "
                                 f"cannot read {unread!r} (no lookarounds, inline flags or backreferences)")
        else:
            compiled = None
        for name in _FIELD.findall(self.table):
            if name == "topic" or name in SOURCE_FIELDS:
                if name in SOURCE_FIELDS and (self.mapping is None or self.mapping.envelope != "debezium"):
                    raise UsageError(f"{self.name}: table {self.table!r}: {{{name}}} reads a Debezium event's "
                                     "source block; give the route envelope = \"debezium\"")
                continue
            if compiled is not None and (name.isdigit() and 0 < int(name) <= compiled.groups
                                         or name in compiled.groupindex):
                continue
            fields = ["{topic}", *(f"{{{f}}}" for f in SOURCE_FIELDS)]
            if compiled is not None:
                fields += [f"{{{i}}}" for i in range(1, compiled.groups + 1)] + [f"{{{g}}}" for g in compiled.groupindex]
            raise UsageError(f"{self.name}: table {self.table!r}: unknown field {{{name}}}; a template may use "
                             + ", ".join(fields))
        if not self.templated:
            table_name(self.table)  # a plain name is checked now

    @property
    def templated(self) -> bool:
        return bool(_FIELD.search(self.table))

    @property
    def per_record(self) -> bool:
        """The table is read from each topic's events (their source block), not from the topic's name."""
        return any(f in SOURCE_FIELDS for f in _FIELD.findall(self.table))

    def takes(self, topic: str) -> re.Match | bool:
        """Whether this route reads ``topic``: listed, or matched by the pattern — which never takes a dead-letter
        topic (``….dlq``: its records would come back as rows) nor one of Kafka's own (``__…``)."""
        if topic in self.topics:
            return True
        if self.pattern is None or topic.endswith(".dlq") or topic.startswith("__"):
            return False
        return re.fullmatch(self.pattern, topic)

    def subscription(self) -> list[str]:
        """What the consumer subscribes to for this route (librdkafka reads ``^…`` as a pattern)."""
        return list(self.topics) + ([_anchored(self.pattern)] if self.pattern is not None else [])

    def describe(self) -> str:
        taken = ", ".join(self.topics + ((f"/{self.pattern}/",) if self.pattern else ()))
        return f"{self.name}: {taken} → {self.table}" + (" (typed)" if self.mapping is not None else "")

    def fill(self, topic: str, source: dict | None = None) -> TableName:
        """The table this route writes ``topic``'s records to; ``source``: an event's source block."""
        if not self.templated:
            return table_name(self.table)
        found = self.takes(topic)
        groups = found if isinstance(found, re.Match) else None

        def value(m: re.Match) -> str:
            name = m.group(1)
            if name == "topic":
                return topic
            if name in SOURCE_FIELDS:
                got = (source or {}).get(name.split(".", 1)[1])
                if not isinstance(got, str) or not got:
                    raise UsageError(f"{self.name}: table {self.table!r} for topic {topic!r}: its events carry no "
                                     f"{name}")
                return got
            got = groups.group(int(name) if name.isdigit() else name) if groups is not None else None
            if got is None:
                raise UsageError(f"{self.name}: table {self.table!r} for topic {topic!r}: the pattern's group "
                                 f"{{{name}}} matched nothing")
            return got

        text = _FIELD.sub(value, self.table)
        try:
            return table_name(text)
        except UsageError as exc:
            raise UsageError(f"{self.name}: table {self.table!r} for topic {topic!r} is {text!r}, not a table "
                             f"name ({exc}); such a topic is refused, never skipped") from None


def _anchored(pattern: str) -> str:
    """The pattern as librdkafka subscribes to it (``^…``, its own regular expressions: no ``(?…)`` groups),
    matching whole topic names as the route does."""
    body = pattern.removeprefix("^").removesuffix("$")
    return "^(" + re.sub(r"\(\?(?:P<\w+>|:)", "(", body) + ")$"


def unread_by_librdkafka(subscribed: str) -> str | None:
    """What in a subscription's pattern (``^…``, named and non-capturing groups already made plain) librdkafka's
    regular expressions cannot read: a ``(?`` construct or a backreference; None when it can."""
    for found in re.finditer(r"\\.|\(\?(?:<[=!]|[^)]?)", subscribed):
        text = found.group()
        if not text.startswith("\\") or text[1] in "123456789":
            return text
    return None



@dataclass(frozen=True)
class Target:
    """Where one topic's records go: its route and its table (None: read from each batch's events)."""

    route: Route
    table: TableName | None
    mapping: object = None  # the route's mapping with this table, for a typed route


class Router:
    """Topic → route → table, decided once per topic (a ``{source.*}`` template: from the topic's first event)."""

    def __init__(self, routes: list[Route]):
        if not routes:
            raise UsageError("a pipeline needs at least one [[route]]")
        names = [r.name for r in routes]
        if len(set(names)) != len(names):
            raise UsageError(f"two routes are named {next(n for n in names if names.count(n) > 1)!r}")
        self.routes = list(routes)
        for i, a in enumerate(routes):  # names two routes list: refused before anything is read
            for b in routes[i + 1:]:
                both = sorted(t for t in a.topics if b.takes(t)) or sorted(t for t in b.topics if a.takes(t))
                if both and not (a.fan is not None and a.fan == b.fan):
                    raise UsageError(_overlap(both[0], a, b))
        self._targets: dict[tuple[str, str | None], Target] = {}

    @property
    def typed(self) -> bool:
        return any(r.mapping is not None for r in self.routes)

    def subscription(self) -> list[str]:
        return list(dict.fromkeys(s for r in self.routes for s in r.subscription()))  # a fan-out's once

    @property
    def names(self) -> list[str]:
        """The topic names the routes list (patterns aside)."""
        return list(dict.fromkeys(t for r in self.routes for t in r.topics))

    def takes(self, topic: str) -> bool:
        """Whether any route reads ``topic`` (a pattern's subscription may bring others: a ``TOPIC.dlq``)."""
        return any(r.takes(topic) for r in self.routes)

    def route(self, topic: str) -> Route:
        """The one route that takes ``topic`` (of a fan-out, its first); two, or none, is a usage error naming them."""
        return self.fanned(topic)[0]

    def fanned(self, topic: str) -> list[Route]:
        """The routes that take ``topic``: one, or a fan-out's, each into its own table."""
        taking = [r for r in self.routes if r.takes(topic)]
        if len(taking) > 1 and (taking[0].fan is None or any(r.fan != taking[0].fan for r in taking)):
            other = next(r for r in taking[1:] if taking[0].fan is None or r.fan != taking[0].fan)
            raise UsageError(_overlap(topic, taking[0], other))
        if not taking:
            raise UsageError(f"topic {topic!r} is taken by no route ({'; '.join(r.describe() for r in self.routes)})")
        return taking

    def target(self, topic: str, read_source=None, route: str | None = None) -> Target:
        """Where ``topic``'s records go (of a fan-out, route ``route``'s). ``read_source()`` gives the source block
        of one of its events, for a ``{source.*}`` template (None: no event yet; the target's table is then None)."""
        found = self._targets.get((topic, route))
        if found is not None:
            return found
        taking = self.fanned(topic)
        route_of = next((r for r in taking if r.name == route), taking[0])
        if route_of.per_record:
            source = read_source() if read_source is not None else None
            if source is None:
                return Target(route_of, None)
            table = route_of.fill(topic, source)
        else:
            table = route_of.fill(topic)
        mapping = replace(route_of.mapping, table=table) if route_of.mapping is not None else None
        found = self._targets[topic, route] = Target(route_of, table, mapping)
        return found

    def resolve(self, topics) -> list[Target]:
        """Check ``topics`` (the cluster's, say) against the routes: each one's target; refusals raised."""
        return [self.target(t, route=r.name) for t in topics if self.takes(t) for r in self.fanned(t)]


def _overlap(topic: str, a: Route, b: Route) -> str:
    return (f"topic {topic!r} is taken by two routes, {a.name} and {b.name}; a topic goes to one route "
            "(narrow a pattern, or list the topic in one route only)")


def source_block(event) -> dict | None:
    """A Debezium event's ``source`` block (the event decoded: plain, or JsonConverter's ``payload``)."""
    if isinstance(event, dict) and "payload" in event and "schema" in event:
        event = event["payload"]
    source = event.get("source") if isinstance(event, dict) else None
    return source if isinstance(source, dict) else None


COMMAND_LINE = "the command line"


def command_line_router(topics: list[str], pattern: str | None, table: str | None, mapping=None,
                        id_from: str | None = None, routes: "Router | None" = None, transform=None) -> Router:
    """The routes of a command: ``--pipeline``'s (``routes``), or the command line as one route (its ``--table``
    may be a template; a mapping built with the placeholder table takes it)."""
    if routes is not None:
        if topics or pattern:
            raise UsageError("--pipeline names the topics in its routes; give no TOPIC or --topic-pattern too")
        return routes
    if not topics and not pattern:
        raise UsageError("give a TOPIC, several, --topic-pattern REGEX or --pipeline FILE")
    from kdg.flow.pipeline_file import PLACEHOLDER_TABLE

    if mapping is not None and mapping.table.text != PLACEHOLDER_TABLE:
        table = mapping.table.text
    return Router([Route(COMMAND_LINE, tuple(topics), pattern, table or "kdg_events", mapping, id_from, transform)])
