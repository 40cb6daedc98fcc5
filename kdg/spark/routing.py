"""Routes on Spark: which table each topic's records go to, prepared on the driver before a task writes them.

The routes are :mod:`kdg.flow.routes`' (the command line as one route, or ``--pipeline FILE``'s). Each
topic gets one :class:`~kdg.spark.writer.WriteSpec`: its route's table (created, or checked against the
route's mapping), its dead-letter topic (``TOPIC.dlq``) and, under exactly-once, the table's claim
window, decided once per table. Executors pick their task's topic's spec from a
:class:`~kdg.spark.writer.RoutedSpec`; Spark's Kafka source gives each task one topic-partition, so a
task writes one route's table (a fan-out's: its routes' tables).

A fan-out's topic (``[[route.into]]``) gets one WriteSpec per route, its tasks writing every route's table in
one transaction per chunk. A route's ``transform`` and the ``--handler`` run on the executors
(:mod:`kdg.spark.logic`), imported here first. A ``{source.table}`` template (a table read from each event)
is ``kdg consume``'s only, for now. A route with ``columns = "from-schema"`` gets its table from the records'
schemas, met on the driver before each write (:meth:`SparkRoutes.follow`, :mod:`kdg.spark.schemas`).
"""

import re

from kdg.errors import UsageError
from kdg.flow.routes import Router, command_line_router


def spark_router(topics: list[str], pattern: str | None, table: str | None, mapping, id_from: str | None,
                 routes: Router | None = None, transform=None, handler=None) -> Router:
    """The routes of a Spark command: ``--pipeline``'s, or the command line as one route (``--table`` may be a
    template, ``mt_{topic}``; ``transform``: its ``--transform``); refused here: no topic at all, a table read
    from each event, or a transform or ``handler`` that cannot be imported."""
    from kdg.spark.logic import check_logic

    if transform is not None and routes is not None:
        raise UsageError("--transform is the command line's route's; in a pipeline file each route says "
                         "transform = \"module:function\"")
    router = command_line_router(topics, pattern, table, mapping, id_from, routes, transform)
    for route in router.routes:
        if route.per_record:
            raise UsageError(f"{route.name}: table {route.table!r} is read from each event's source block, which only "
                             "kdg consume does for now; on Spark, name the table by {topic} or the pattern's groups")
        if route.mapping is not None and route.mapping.from_schema and (
                route.transform is not None or route.fan is not None or handler is not None):
            raise UsageError(f'{route.name}: columns = "from-schema" on Spark takes no transform, --handler or '
                             "[[route.into]] yet; kdg consume runs such a route")
        if route.mapping is not None and route.mapping.from_schema and route.mapping.value_format != "json":
            raise UsageError(f'{route.name}: columns = "from-schema" on Spark reads Kafka Connect JsonConverter '
                             f"schemas only yet, not value_format {route.mapping.value_format}'s; kdg consume "
                             "runs such a route")
    check_logic(router, handler)  # before anything is read
    return router


def key_sql(router: Router, required: bool) -> str:
    """The Spark SQL of every route's idempotency key (:func:`kdg.spark.job.key_expression`): one for all
    the routes, since one frame holds every topic's records."""
    from kdg.replay import _id_from
    from kdg.spark.job import key_expression

    found = {key_expression(*_id_from(r.id_from), required=required): r for r in router.routes}
    if len(found) > 1:
        a, b = list(found.values())[:2]
        raise UsageError(f"routes {a.name} and {b.name} key their records differently (id_from {a.id_from!r} and "
                         f"{b.id_from!r}); on Spark the routes of one pipeline share one id_from, for now")
    return next(iter(found))


def subscription(router: Router) -> dict[str, str]:
    r"""Spark's Kafka source option for the routes' topics: ``subscribe`` (a comma list) with names only,
    else ``subscribePattern``: one Java regular expression matching every topic a route takes, whole.

    >>> from kdg.flow.routes import Route
    >>> subscription(Router([Route("r", ("a.b",), r"x\.(?P<t>\w+)")]))["subscribePattern"]
    '(?:a\\.b)|(?:(?!__)(?!.*\\.dlq$)(?:x\\.(?:\\w+)))'
    """
    if not any(r.pattern for r in router.routes):
        return {"subscribe": ",".join(dict.fromkeys(router.names))}
    parts = [re.escape(t) for t in dict.fromkeys(router.names)]
    # Python's named groups are not Java's, and two routes may name alike: Spark only filters, so none capture.
    # As Route.takes: a pattern never takes a dead-letter topic (its records would come back) nor Kafka's own
    parts += [r"(?!__)(?!.*\.dlq$)(?:" + re.sub(r"\(\?P<\w+>", "(?:", r.pattern) + ")"
              for r in router.routes if r.pattern]
    return {"subscribePattern": "|".join(f"(?:{p})" for p in parts)}


def describe(router: Router) -> str:
    """The topics, as the report and the query's name say them: ``a``, ``a,b`` or ``a,/b\\..*/``."""
    return ",".join(s for r in router.routes for s in r.topics + ((f"/{r.pattern}/",) if r.pattern else ()))


class SparkRoutes:
    """Topic → its :class:`~kdg.spark.writer.WriteSpec`, made once per topic on the driver."""

    def __init__(self, router: Router, store, conn, policy, *, group: str, chunk_rows: int, value_format: str,
                 dedup_retention: str | None, echo, handler=None, resume: str = "run it again"):
        """``handler``: the ``--handler`` (``module:function`` or a function), imported here with every route's
        transform (:func:`kdg.spark.logic.check_logic`): one that cannot be is refused before any table is made."""
        from kdg.spark.logic import check_logic

        self.roots = check_logic(router, handler)
        self.router, self.store, self.conn, self.policy, self.handler = router, store, conn, policy, handler
        self.group, self.chunk_rows, self.value_format = group, chunk_rows, value_format or "json"
        self.dedup_retention, self.echo, self.resume = dedup_retention, echo, resume
        self.specs: dict = {}            # topic → WriteSpec
        self.routes: dict[str, str] = {}  # topic → its route's name
        self.windows: dict = {}          # table (identity text) → its claim window (exactly-once)
        self._tables: dict = {}          # (route, table as routed) → (TypedTarget | None, identity)
        self.follower = None             # columns = "from-schema": kdg.spark.schemas.SchemaFollower, made on first use

    def check(self, topics) -> None:
        """Each topic's routes and tables, refused (no route, two, a bad name) before any table is made."""
        for topic in topics:
            routes = self.router.fanned(topic)
            for route in routes:
                self.router.target(topic, route=route.name if len(routes) > 1 else None)

    def prepare(self, topic: str):
        """``topic``'s WriteSpec: its table made (or checked against the mapping) and its window decided, once. A
        fan-out's topic: the first route's, holding every route's own spec in ``fans``."""
        from dataclasses import replace

        if topic in self.specs:
            return self.specs[topic]
        routes = self.router.fanned(topic)
        if len(routes) == 1:
            spec = self._spec(topic, None)
        else:
            fans = tuple((r.name, self._spec(topic, r.name)) for r in routes)
            spec = replace(fans[0][1], fans=fans)
        self.specs[topic] = spec
        self.routes[topic] = routes[0].fan or routes[0].name
        return spec

    def _spec(self, topic: str, route: str | None):
        target = self.router.target(topic, route=route)
        made = (target.route.name, target.table)
        if target.mapping is not None and target.mapping.from_schema:
            return self._followed_spec(topic, target, made)
        if made not in self._tables:
            if target.mapping is not None:
                typed, _ = self.store.prepare_typed(target.mapping)
                self._tables[made] = (typed, typed.mapping.table)
            else:
                self._tables[made] = (None, self.store.ensure_sink_table(target.table))
        typed, identity = self._tables[made]
        self._decide_window(topic, identity)
        return self._spec_of(topic, target, typed, identity)

    def _spec_of(self, topic: str, target, typed, identity):
        from kdg.replay import _id_from
        from kdg.spark.writer import DeadLetterSpec, WriteSpec

        kind, _ = _id_from(target.route.id_from)
        return WriteSpec(
            self.conn.pg_dsn, identity.text, self.group, self.policy.dedup, self.chunk_rows, typed=typed,
            id_from=target.route.id_from if kind == "json" else None,
            value_format=typed.mapping.value_format if typed is not None else self.value_format,
            registry=self.conn.registry, transform=target.route.transform, handler=self.handler, roots=self.roots,
            dead_letters=DeadLetterSpec(self.policy.guarantee.value, self.conn.bootstrap_servers, topic,
                                        self.conn.extra, self.group))

    def _decide_window(self, topic: str, identity) -> None:
        if self.policy.dedup and identity.text not in self.windows:
            from kdg.retention import decide_dedup_window

            self.windows[identity.text] = decide_dedup_window(self.store, self.conn, topic, identity,
                                                              self.dedup_retention, self.echo)

    def _followed_spec(self, topic: str, target, made):
        """A from-schema route's spec: its table as the schemas met so far made it (:meth:`follow`); before any,
        its table's identity only, which no executor writes (and no claim window yet, if the table is still to
        be made: one decided for a missing table would go with the table when it is made)."""
        from dataclasses import replace

        from kdg.spark.schemas import SchemaFollower

        if self.follower is None:
            self.follower = SchemaFollower(self.store, self.echo, self.resume)
        followed = self.follower.tables.get(made)
        typed = followed.typed if followed is not None else None
        identity = typed.mapping.table if typed is not None else self.store.resolve_table(target.table)
        if typed is not None or self.store.table_shape(identity) is not None:
            self._decide_window(topic, identity)
        spec = self._spec_of(topic, target, typed, identity)
        return replace(spec, from_schema=True, schemas=frozenset(followed.heads) if followed else frozenset(),
                       refused=tuple(followed.refused.items()) if followed else ())

    def follow(self, rows) -> list[dict]:
        """Meet the record schemas of ``rows`` (the sink rows about to be written) with their from-schema routes'
        tables (:class:`kdg.spark.schemas.SchemaFollower`), then give those topics' specs the tables as they are
        now; the changes made (or, under evolve = none, asked), each said once."""
        from kdg.spark.schemas import distinct_schemas

        topics = [t for t, s in self.specs.items() if s.from_schema]
        if not topics:
            return []
        for topic, head, value, key in distinct_schemas(rows, topics):
            target = self.router.target(topic)
            self.follower.meet((target.route.name, target.table), target, head, value, key)
        for topic in topics:
            del self.specs[topic]
            self.prepare(topic)
        return self.follower.take_said()

    def table(self, topic: str) -> str:
        """``topic``'s table (a fan-out's: its first route's, where its replay is recorded)."""
        return self.specs[topic].table

    def tables(self, topic: str) -> list[str]:
        """Every table ``topic``'s records go to (a fan-out's: each route's)."""
        spec = self.specs[topic]
        return [s.table for _, s in spec.fans] if spec.fans else [spec.table]

    def shown(self, topic: str) -> str:
        """The report's name for where ``topic`` goes: its table, or a fan-out's tables joined by ``+`` (the
        executors count per topic, so a fan-out's tables share one entry)."""
        return "+".join(self.tables(topic))

    @property
    def typed(self) -> bool:
        return any(s.typed is not None for s in self.specs.values())

    @property
    def modules(self) -> list:
        """The user's modules a cluster's executors need (:func:`kdg.spark.logic.module_roots`)."""
        from kdg.spark.logic import module_roots

        return module_roots(self.router, self.handler)

    @property
    def whole_records(self) -> bool:
        """The executors rebuild each record (its timestamp, its headers' bytes): a mapping, a transform or a
        handler reads them (:func:`kdg.spark.job.sink_rows`'s ``with_timestamp``)."""
        return self.router.typed or self.handler is not None or any(r.transform is not None or r.fan is not None
                                                                    for r in self.router.routes)

    @property
    def in_order(self) -> bool:
        """Some route keeps the latest version of a key (an upsert, or deletes): one task per partition."""
        return any(r.mapping is not None and (r.mapping.mode == "upsert" or r.mapping.on_tombstone == "delete")
                   for r in self.router.routes)

    def routed(self):
        from kdg.spark.writer import RoutedSpec

        return RoutedSpec(dict(self.specs))

    def tables_entry(self, topic: str, entries: dict) -> dict:
        """The report's entry of ``topic``'s table (:meth:`shown`; made on first use)."""
        return entries.setdefault(self.shown(topic), {"route": self.routes[topic], "topics": []})
