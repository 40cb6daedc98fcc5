"""`kdg audit --pipeline FILE`: every route audited, each topic it takes against the table it resolves to.

A route takes the topics it lists and the cluster's topics its pattern matches; each is audited as
``kdg audit TOPIC --table TABLE`` audits it (:func:`kdg.audit.run_audits`: the producer ledger, else the
topic itself, keyed as the route keyed it). A route is balanced when every one of its audits is.
"""

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from kdg.audit import AuditReport, run_audits
from kdg.errors import UsageError
from kdg.flow.check import EVENTS_READ, source_of
from kdg.flow.pipeline_file import load_pipeline
from kdg.flow.routes import Route, Router
from kdg.settings import Connection


@dataclass
class RouteAudit:
    """One route's audits: one per topic it takes (and per group, when several wrote a kdg-shaped table)."""

    route: str
    topics: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    reports: list[AuditReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def total(self, name: str) -> int:
        return sum(getattr(r, name) for r in self.reports)

    @property
    def balanced(self) -> bool:
        return all(r.balanced for r in self.reports)

    def to_dict(self) -> dict:
        return {"route": self.route, "topics": self.topics, "tables": self.tables,
                **{n: self.total(n) for n in ("lost", "duplicates", "unexpected", "pending", "filtered")},
                "balanced": self.balanced, "notes": self.notes, "audits": [r.to_dict() for r in self.reports]}


@dataclass
class PipelineAudit:
    file: str
    group: str | None
    routes: list[RouteAudit]

    @property
    def balanced(self) -> bool:
        return all(r.balanced for r in self.routes)

    def to_dict(self) -> dict:
        return {"file": self.file, "group": self.group, "routes": [r.to_dict() for r in self.routes],
                "balanced": self.balanced}


def run_pipeline_audit(path: Path, conn: Connection, *, group: str | None = None, since: datetime | None = None,
                       until: datetime | None = None, id_from: str | None = None, envelope: str | None = None,
                       value_format: str | None = None) -> PipelineAudit:
    """Audit every route of the pipeline file at ``path``: each topic it takes against its table.

    ``id_from``, ``envelope`` and ``value_format`` are the consume's, for a route that does not say
    (a route's ``id_from``, a typed route's mapping's envelope and value format win). A topic two routes
    take, or whose table cannot be told, is a :class:`~kdg.errors.UsageError`, as it is for ``kdg consume``.
    """
    from kdg.kafka.admin import topic_names

    router = load_pipeline(path)
    for route in router.routes:  # a listed topic's table that cannot be named: refused before anything is read
        for topic in route.topics if not route.per_record else ():
            router.target(topic)
    existing = topic_names(conn.bootstrap_servers, conn.extra)
    audits = []
    for route in router.routes:
        found = RouteAudit(route.name)
        found.topics = sorted(set(route.topics) | {t for t in existing if route.takes(t)})
        if not found.topics:
            found.notes.append(f"no topic matches /{route.pattern}/ yet: nothing to audit")
        for topic in found.topics:
            table = _table(router, route, topic, conn, found)
            if table is None:
                continue
            if table not in found.tables:
                found.tables.append(table)
            typed = route.mapping
            found.reports += run_audits(
                topic, conn, table=table, group=group, since=since, until=until, id_from=route.id_from or id_from,
                envelope=typed.envelope if typed is not None else envelope,
                value_format=typed.value_format if typed is not None else value_format).reports
        audits.append(found)
    return PipelineAudit(str(path), group, audits)


def _table(router: Router, route: Route, topic: str, conn: Connection, found: RouteAudit) -> str | None:
    """The table ``topic``'s records went to (None: an empty topic a ``{source.*}`` template cannot name yet)."""
    router.route(topic)  # a topic two routes take is refused, naming both
    if not route.per_record:
        return router.target(topic).table.text
    from kdg.mapping.check import latest_records

    records = latest_records(conn, topic, EVENTS_READ)
    target = router.target(topic, lambda: source_of(conn, route, records))
    if target.table is not None:
        return target.table.text
    if not records:
        found.notes.append(f"{topic}: empty, so no event names its table: nothing to audit")
        return None
    raise UsageError(f"{route.name}: topic {topic!r}: none of its {len(records)} latest events has a source block "
                     f"to fill {route.table!r}; audit it alone (kdg audit {topic} --table TABLE)")
