"""Claims belong to one table, not to a name: the oid of the table each claim table was made for.

A sink table's exactly-once claims (``kdg_dedup_<n>``, :mod:`kdg.store.windows`) are kept under its
identity, a name. A table dropped and made again under that name is another table, and the old one's
claims would suppress every record read into it as a duplicate: nothing written, exit 0. So each window
records the oid of its table (``kdg_windows.sink_oid``, migration 007):

- a table kdg has just created (``--create-table``, the generic sink's own table) takes the claims kept
  under its name with it (:func:`follow_new_table`), in the transaction that creates it;
- an exactly-once writer whose table is not the one the claims were made for (someone made it again)
  stops before it reads a record (:func:`check_owner`), naming ``kdg db forget`` (:mod:`kdg.store.forget`);
- claims with no oid recorded (made before 007, or forgotten) are given the table found now.

One catalog look-up when a writer starts, none per batch. (An oid can be reused by a later table, after
the database's 2**32 oids wrapped round; kdg cannot tell that table from the old one.)
"""

import shlex

from kdg.errors import StaleClaims
from kdg.settings import TableName
from kdg.store.claims import CLAIMED_RECORDS
from kdg.store.windows import _HORIZON, _WINDOW, Window, _window, forget_dropped

_OID = "SELECT to_regclass($1)::oid"
# record `oid` as the window's table unless another was recorded meanwhile; the table recorded now
_RECORD = """UPDATE kdg_windows SET sink_oid = CASE WHEN sink_oid IS NOT DISTINCT FROM $3 THEN $2 ELSE sink_oid END
             WHERE relation = $1 RETURNING sink_oid"""


async def check_owner(conn, window: Window, table: TableName) -> None:
    """Before an exactly-once writer reads anything: its claim ``window`` must have been made for the table
    ``table`` names now. Not recorded yet (claims from before migration 007, or forgotten), or no claim kept:
    this table is recorded. Another table's: :class:`~kdg.errors.StaleClaims`."""
    oid = await conn.fetchval(_OID, table.sql)
    if oid is None or oid == window.sink_oid:
        return  # the same table (or none: `kdg db maintain` of a dropped table's claims)
    if window.sink_oid is None or not await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {window.sql})"):
        window.sink_oid = await conn.fetchval(_RECORD, window.relation, oid, window.sink_oid)
        if window.sink_oid == oid:
            return
    raise StaleClaims(
        f"{table.text} is not the table its exactly-once claims were made for: it was dropped and made again, "
        "and the old table's claims would suppress its records as duplicates. To fill it from the records "
        f"again, forget them first: kdg db forget --table {shlex.quote(table.text)}")


async def follow_new_table(conn, table: TableName) -> list[str]:
    """In the transaction that created ``table``: claims kept under its name were made for an older table of
    that name, and are dropped; the new table is recorded as the window's. What was done, in words."""
    relation = await conn.fetchval("SELECT relation FROM kdg_windows WHERE sink_table = $1", table.text)
    if relation is None:
        return []  # no claims: the window, when one is made, records this table then
    notes = [note for _, found in (await forget_dropped(conn, [relation])).values() for note in found]
    oid = await conn.fetchval(_OID, table.sql)
    claims = await drop_claims(conn, relation, oid)
    if claims is not None and sum(claims.values()):
        notes.append(f"dropped {sum(claims.values())} exactly-once claims of {table.text}: they were made for "
                     "an older table of that name, and kdg has just created this one")
    return notes


async def count_claims(conn, window: Window) -> dict[str, int]:
    """The claims ``window`` holds, per topic their records came from."""
    return {r["topic"]: r["n"] for r in await conn.fetch(
        f"SELECT topic, sum({CLAIMED_RECORDS})::bigint AS n FROM {window.sql} GROUP BY topic ORDER BY topic")}


async def drop_claims(conn, relation: str, oid: int | None) -> dict[str, int] | None:
    """Inside a transaction: delete every claim of window ``relation`` (emptied whole, never row by row) and
    record ``oid`` as its table (None: the next writer records the table it finds). The window stays, its
    retention too; its horizon goes, as no claim is left to be older than. The claims deleted, per topic;
    None if the window is gone (its claim table dropped outside kdg)."""
    # exclusively, as maintenance does: claiming transactions in flight end first, later ones wait and then
    # read the window again (updated_at moves)
    await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _HORIZON, relation)
    row = await conn.fetchrow(_WINDOW, relation)
    if row is None:
        return None
    window = _window(row)
    if window.sink_oid == oid and oid is not None:
        return {}  # made again and recorded by another kdg meanwhile: its claims are this table's
    claims = await count_claims(conn, window)
    await conn.execute(f"TRUNCATE {window.sql}")
    await conn.execute("UPDATE kdg_windows SET horizon_ms = NULL, sink_oid = $2, updated_at = now() "
                       "WHERE relation = $1", relation, oid)
    return claims
