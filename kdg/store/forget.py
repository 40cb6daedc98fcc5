"""`kdg db forget`: delete a sink table's exactly-once claims, and a group's stored positions, to fill it again.

A claim says "this record is in the table already". When the table was emptied, dropped or made again
outside kdg, its claims are wrong: every record read again would be suppressed as a duplicate. Forgetting
them is the user's decision (kdg cannot know the table's rows went), and it is undone only by reading
the records again. The claims of records a transform filtered out (marked filtered, :mod:`kdg.store.filtered`)
go with the rest: read again, they are filtered again. See docs/guide/rebuilding-a-table.md.
"""

from dataclasses import asdict, dataclass, field
from typing import Callable

from kdg.errors import KdgError, UsageError
from kdg.settings import redact_dsn
from kdg.store.identity import resolve_table
from kdg.store.owners import count_claims, drop_claims
from kdg.store.windows import _WINDOW, _window, forget_dropped


@dataclass
class ForgetReport:
    """What ``kdg db forget`` removes (before confirmation: would remove) in one database."""

    dsn: str
    table: str                                          # the table's identity, as its claims are kept
    claims: int = 0                                     # exactly-once claims deleted
    topics: list[str] = field(default_factory=list)     # whose records they were (and the group's positions)
    group: str | None = None
    offsets: int = 0                                    # the group's stored positions (kdg_offsets rows) deleted
    done: bool = False                                  # False: not (yet) removed

    def to_dict(self) -> dict:
        return asdict(self)


def forget_claims(dsn: str, table: str, *, group: str | None = None, topics: list[str] | None = None,
                  confirm: Callable[[ForgetReport], bool] | None = None) -> ForgetReport:
    """Delete ``table``'s exactly-once claims; with ``group``, also the positions ``kdg_offsets`` stores for it
    in ``topics`` (default: the topics the claims came from), so the group reads them from the beginning.

    ``confirm``, if given, is asked with what would be removed before anything is; a False answer removes
    nothing (a :class:`~kdg.errors.KdgError`). Returns what was removed. The window of the table (its
    retention) stays; the next exactly-once writer records the table it then finds as the claims' own.

    Example: ``forget_claims(dsn, "shop.orders", group="orders-pg")``.
    """
    from kdg.store.pg import Store

    with Store(dsn) as store:  # (its errors are kdg's: a refused statement, a lost connection)
        return store._run(_forget(store, table, group, topics, confirm))


async def _forget(store, table, group, topics, confirm) -> ForgetReport:
    conn, shown = store.conn, redact_dsn(store.dsn)
    identity = await resolve_table(conn, table, where=f" in {shown}")
    report = ForgetReport(shown, identity.text, group=group)
    find = "SELECT relation FROM kdg_windows WHERE sink_table = $1"
    relation = await conn.fetchval(find, identity.text)
    if relation is not None and await forget_dropped(conn, [relation]):  # state dropped outside kdg, forgotten
        relation = await conn.fetchval(find, identity.text)
    if relation is None and group is None:
        raise UsageError(f"no exactly-once claims are kept for {identity.text} in {shown} (kdg db maintain "
                         "lists the tables whose claims are kept)")
    await _count(conn, report, relation, topics)
    if confirm is not None and not confirm(report):
        raise KdgError(f"nothing removed: {identity.text}'s claims are kept")
    async with conn.transaction():
        claims = await drop_claims(conn, relation, None) if relation is not None else None
        report.claims = sum(claims.values()) if claims else 0
        if group is not None:
            status = await conn.execute("DELETE FROM kdg_offsets WHERE consumer_group = $1 AND topic = ANY($2)",
                                        group, report.topics)
            report.offsets = int(status.split()[-1])
    report.done = True
    return report


async def _count(conn, report: ForgetReport, relation: str | None, topics: list[str] | None) -> None:
    """Fill ``report`` with what would be removed now."""
    row = await conn.fetchrow(_WINDOW, relation) if relation is not None else None
    claims = await count_claims(conn, _window(row)) if row is not None else {}
    report.claims = sum(claims.values())
    report.topics = sorted(set(topics)) if topics else list(claims)
    if report.group is None:
        return
    if not report.topics:
        raise UsageError(f"no claims of {report.table} say which topics group {report.group!r} read into it: "
                         "name them (--topic)")
    report.offsets = await conn.fetchval("SELECT count(*) FROM kdg_offsets WHERE consumer_group = $1 "
                                         "AND topic = ANY($2)", report.group, report.topics)
