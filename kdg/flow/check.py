"""`kdg pipeline check FILE`: a pipeline file's routes, held against the cluster's topics and the tables they
resolve to, writing nothing.

Offline, the file alone: its keys, templates and mappings, and the topics its routes list. Online, also the
cluster: the topics each route takes, the table each resolves to (a ``{source.*}`` template's from one of the
topic's events), a topic two routes take, and each table as Postgres has it (a typed route's checked against
its mapping, as ``kdg mapping check`` does). Each refused topic or table is a *problem* naming the route, the
topic and the name; a pattern that matches nothing yet is only a note (CDC topics appear with their first change).
A ``columns = "from-schema"`` route's table is held against the schema of its topic's newest record: what
evolution would do to it (:mod:`kdg.mapping.preview`), and a change that would stop the route is a problem.
"""

from dataclasses import asdict, dataclass, field
from pathlib import Path

from kdg.errors import UsageError
from kdg.flow.pipeline_file import load_pipeline
from kdg.flow.routes import Route, Router, source_block
from kdg.settings import Connection, redact_dsn

FROM_EVENTS = "from each topic's first event"
EVENTS_READ = 5  # a topic's latest records read for its source block (a tombstone or a delete may have none)


@dataclass
class TopicTarget:
    """One topic a route takes, and the table its records go to."""

    topic: str
    table: str | None           # None: told by the topic's first event, none read
    table_state: str = "not checked"  # exists | would be created | created on first write | not checked | refused
    problem: str | None = None  # why the topic (or its table) is refused
    evolution: dict | None = None  # columns from the schema: what the newest record's asks of the table (a preview)


@dataclass
class RouteCheck:
    name: str
    takes: list[str]            # the topics it lists, and /pattern/
    table: str                  # a table or a template
    typed: bool
    topics: list[TopicTarget] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class PipelineCheckReport:
    file: str
    offline: bool
    routes: list[RouteCheck]
    problems: list[str] = field(default_factory=list)  # refused topics and tables: route, topic and name each
    cluster_topics: int | None = None  # topics in the cluster (None: offline)
    dsn: str | None = None      # without its password

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok}


def run_pipeline_check(path: Path, conn: Connection | None = None) -> PipelineCheckReport:
    """Check the pipeline file at ``path``; with ``conn``, against its cluster and database too (nothing is written).

    A file that cannot be read as routes is a :class:`~kdg.errors.UsageError`; the topics and tables refused
    are the report's ``problems``.
    """
    router = load_pipeline(path)
    checks = {r.name: RouteCheck(r.name, list(r.topics) + ([f"/{r.pattern}/"] if r.pattern else []), r.table,
                                 r.mapping is not None) for r in router.routes}
    report = PipelineCheckReport(str(path), conn is None, list(checks.values()))
    if conn is None:
        for route in router.routes:
            for topic in route.topics:
                _add_target(report, checks[route.name], router, topic, None)
            if route.pattern is not None:
                checks[route.name].notes.append(f"/{route.pattern}/: the cluster's topics are not looked at offline")
        return report
    from kdg.kafka.admin import topic_names

    existing = topic_names(conn.bootstrap_servers, conn.extra)
    report.cluster_topics, report.dsn = len(existing), redact_dsn(conn.pg_dsn)
    for route in router.routes:
        for topic in route.topics:
            if topic not in existing:
                report.problems.append(f"{route.name}: topic {topic!r} does not exist (a topic a route lists must; "
                                       "a pattern's may appear later)")
                checks[route.name].topics.append(TopicTarget(topic, None, "refused", "it does not exist"))
    for topic in existing:
        taking = [r for r in router.routes if r.takes(topic)]
        if len(taking) > 1:
            _refuse(report, checks, router, topic)
        elif taking:
            _add_target(report, checks[taking[0].name], router, topic, conn)
    for route in router.routes:
        if route.pattern is not None and not any(route.takes(t) for t in existing):
            checks[route.name].notes.append(f"no topic matches /{route.pattern}/ yet: its topics are read as they "
                                            "appear (not an error)")
    _check_tables(report, router, checks, conn)
    return report


def _refuse(report: PipelineCheckReport, checks: dict[str, RouteCheck], router: Router, topic: str) -> None:
    """A topic two routes take: shown under both, refused once."""
    try:
        router.route(topic)
    except UsageError as exc:
        report.problems.append(str(exc))
        for route in router.routes:
            if route.takes(topic):
                checks[route.name].topics.append(TopicTarget(topic, None, "refused", "taken by two routes"))


def _add_target(report: PipelineCheckReport, check: RouteCheck, router: Router, topic: str,
                conn: Connection | None) -> None:
    route = router.route(topic)
    read = (lambda: first_source(conn, route, topic)) if conn is not None else None
    try:
        target = router.target(topic, read)
    except UsageError as exc:
        report.problems.append(str(exc))
        check.topics.append(TopicTarget(topic, None, "refused", "its table cannot be named"))
        return
    check.topics.append(TopicTarget(topic, target.table.text if target.table is not None else None))


def first_source(conn: Connection, route: Route, topic: str) -> dict | None:
    """The source block of one of ``topic``'s latest events, read under ``route``'s mapping (None: none has one)."""
    from kdg.mapping.check import latest_records

    return source_of(conn, route, latest_records(conn, topic, EVENTS_READ))


def source_of(conn: Connection, route: Route, records) -> dict | None:
    """The source block of the first of ``records`` (:class:`kdg.records.Record`) that has one."""
    from kdg.mapping import RowMaker

    reader = RowMaker(route.mapping, conn.registry)._reader
    for rec in records:
        if rec.value is None:
            continue
        try:
            found = source_block(reader.document(rec).event)
        except ValueError:  # an unreadable event names no table; another may
            continue
        if found is not None:
            return found
    return None


def _check_tables(report: PipelineCheckReport, router: Router, checks: dict[str, RouteCheck],
                  conn: Connection) -> None:
    """Each resolved table as Postgres has it: a typed route's held against its mapping (a dry run)."""
    from kdg.store.pg import Store

    states: dict[tuple[str, str], str] = {}
    with Store(conn.pg_dsn) as store:
        for route in router.routes:
            for found in checks[route.name].topics:
                if found.problem is not None:
                    continue
                if found.table is None:
                    found.table_state = f"{FROM_EVENTS} (none read yet)"
                    continue
                if route.mapping is not None and route.mapping.from_schema:
                    found.table_state = _evolution(store, conn, router.target(found.topic), found, report)
                    continue
                key = (route.name, found.table)
                if key not in states:
                    states[key] = _table_state(store, router.target(found.topic), report)
                found.table_state = states[key]


def _evolution(store, conn: Connection, target, found: TopicTarget, report: PipelineCheckReport) -> str:
    """Columns from the schema: the newest record of ``found.topic`` that carries one, planned against the table
    (nothing altered); returns the table's state. A change that would stop the route is a problem."""
    from kdg.mapping.check import latest_records
    from kdg.mapping.preview import EvolutionPreview, preview_records

    where = f"{target.route.name}: topic {found.topic}: table {target.table.text}"
    try:
        preview = preview_records(store, target.mapping, latest_records(conn, found.topic, EVENTS_READ),
                                  conn.registry)
    except UsageError as exc:
        report.problems.append(f"{where}: {exc}")
        return "refused"
    if preview is None:  # the table as it is, and no schema to hold against it yet
        identity = store.resolve_table(target.table)
        there = store.fetchval("SELECT to_regclass($1) IS NOT NULL", identity.sql)
        state = "exists" if there else "would be created" if target.mapping.create_table else "does not exist"
        preview = EvolutionPreview(identity.text, state, lines=[
            "no record with a schema read yet: the columns come with the first" if state != "does not exist" else
            f"table {identity.text} does not exist: create it, or set create_table = true (--create-table)"])
    found.evolution = asdict(preview)
    if preview.state == "does not exist":
        report.problems.append(f"{where}: {preview.lines[0]}")
    elif preview.stops is not None:
        report.problems.append(f"{where}: its newest record would stop the route: {preview.stops}")
    return preview.state


def _table_state(store, target, report: PipelineCheckReport) -> str:
    try:
        if target.mapping is None:
            identity = store.resolve_table(target.table)
            there = store.fetchval("SELECT to_regclass($1) IS NOT NULL", identity.sql)
            return "exists" if there else "created on first write"
        _, shape = store.prepare_typed(target.mapping, dry_run=True)
    except UsageError as exc:
        report.problems.append(f"{target.route.name}: table {target.table.text}: {exc}")
        return "refused"
    return "exists" if shape is not None else "would be created"
