"""`kdg db maintain`: retention changes, then one maintenance pass over every state window.

Running consumers make the same pass over their own table's claims (:mod:`kdg.sinks.postgres`);
the windows and partitions themselves are :mod:`kdg.store.windows`'s.
"""

from dataclasses import asdict, dataclass, field

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
            window = store.claim_window(store.resolve_table(table))
            report.changed.append(_change(store, window, dedup_ms, f"claims of {window.sink_table}"))
        if ledger_retention is not None:
            report.changed.append(_change(store, store.ledger_window(), ledger_ms, "the producer ledger"))
        report.windows = store.maintain()
    return report


def _change(store, window, retention_ms: int | None, what: str) -> str:
    before = window.retention_ms if window.retention_from is not None else "unset"
    store.set_retention(window, retention_ms, "kdg db maintain")
    return f"{what}: kept {show(retention_ms)} (was {show(before) if before != 'unset' else 'unset'})"
