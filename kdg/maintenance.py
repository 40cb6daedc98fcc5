"""`kdg db maintain`: retention changes, then one maintenance pass over every state window.

Running consumers make the same pass over their own table's claims (:mod:`kdg.sinks.postgres`);
the windows and partitions themselves are :mod:`kdg.store.windows`'s.
"""

from dataclasses import asdict, dataclass, field

from kdg.errors import UsageError
from kdg.retention import parse_retention, show
from kdg.settings import redact_dsn


@dataclass
class MaintenanceReport:
    dsn: str
    changed: list[str] = field(default_factory=list)   # retention changes, in words
    windows: list = field(default_factory=list)        # kdg.store.windows.Maintained, one per window

    def to_dict(self) -> dict:
        return {"dsn": self.dsn, "changed": self.changed, "windows": [asdict(m) for m in self.windows]}


def run_maintenance(dsn: str, *, table: str | None = None, dedup_retention: str | None = None,
                    ledger_retention: str | None = None) -> MaintenanceReport:
    from kdg.store.pg import Store

    dedup_ms = parse_retention(dedup_retention) if dedup_retention is not None else None
    ledger_ms = parse_retention(ledger_retention, "--ledger-retention") if ledger_retention is not None else None
    report = MaintenanceReport(redact_dsn(dsn))
    with Store(dsn) as store:
        if table is not None:
            identity = store.resolve_table(table)
            known = store.fetchval("SELECT to_regclass($1) IS NOT NULL OR EXISTS (SELECT 1 FROM kdg_windows "
                                   "WHERE sink_table = $2)", identity.sql, identity.text)
            if not known:  # a typo would otherwise get a claim table of its own
                raise UsageError(f"--table {table}: no table {identity.text} in {report.dsn}, and no claims kept "
                                 "for one")
            window = store.claim_window(identity)
            report.changed.append(_change(store, window, dedup_ms, f"claims of {window.sink_table}"))
        if ledger_retention is not None:
            report.changed.append(_change(store, store.ledger_window(), ledger_ms, "the producer ledger"))
        report.windows = store.maintain(sizes=True)
    return report


def _change(store, window, retention_ms: int | None, what: str) -> str:
    before = window.retention_ms if window.retention_from is not None else "unset"
    store.set_retention(window, retention_ms, "kdg db maintain")
    return f"{what}: kept {show(retention_ms)} (was {show(before) if before != 'unset' else 'unset'})"
