"""Bounded state: how long dedup claims and ledger rows are kept, and the partitions that hold them.

Every sink table that exactly-once writes has a claim table of its own (``kdg_dedup_<n>``, a
partition of ``kdg_dedup``), and the producer ledger is ``kdg_ledger``; each is range-partitioned
by time (migration 004). ``kdg_windows`` holds, per table, its **retention** (how long state is
kept; NULL: for ever), the **width** of the partitions made from now on and its **horizon**: state of
times below it was dropped. :meth:`WindowsMixin.maintain` drops, whole, every partition that ended
more than the retention ago and raises the horizon to its end; nothing is deleted row by row.

The time of a claim is ``key_ms``: the milliseconds a UUIDv7 key carries (kdg's own ids), else
the time the key was first claimed. A duplicate is recognised while its first claim is kept, so a
key below the horizon is written without a claim (it can be proven neither new nor old): the
window must cover every record kdg may be asked to read again (:mod:`kdg.retention`).

A batch's claims and maintenance never cross: a claiming transaction holds its window's advisory
lock shared, then reads the horizon; maintenance holds it exclusively while it raises the horizon and
drops partitions. (An advisory lock, not ``SELECT … FOR SHARE``: that would write the window's row,
and make a MultiXact of it, on every batch.)

A claim table or partition dropped outside kdg (by hand, to free space) is forgotten the next time its
window is read or maintained (:func:`forget_dropped`), and made again, empty, when a key needs it. Its
claims are gone, so a record claimed in it and read again is written again: kdg says so, once.
"""

import operator
import re
import time
from dataclasses import asdict, dataclass, field

from kdg.errors import PostgresRefused
from kdg.records import OffsetKeys
from kdg.settings import TableName

DAY_MS = 86_400_000
MIN_WIDTH_MS = 100
_V7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_LOCK = 0x6B646777  # "kdgw": one maintainer at a time per window
_HORIZON = 0x6B646768  # "kdgh": claiming transactions (shared) against maintenance (exclusive), per window


def key_ms(key: str) -> int | None:
    """The Unix milliseconds a UUIDv7 key carries (lower-case, as kdg writes it); None for any other key.

    The same function as SQL's ``kdg_key_ms`` (migration 004). Example:
    ``key_ms('019a6f0e-4a1b-7c3d-9e4f-5a6b7c8d9e0f') == 1762799798811``.
    """
    if len(key) == 36 and key[14] == "7" and _V7.fullmatch(key):
        return int(key[:8] + key[9:13], 16)
    return None


def keys_ms(keys: list[str]) -> list[int | None]:
    """:func:`key_ms` of each of ``keys``, per batch. When every key is a UUIDv7 as kdg writes them, a few passes
    over the batch's bytes (in C) check them all, and a key's time is read once per distinct time prefix (kdg
    makes one head per 0.1 s), not once per key. A batch of offset keys (:class:`~kdg.records.OffsetKeys`), or
    without a key of a UUID's length, has no time to read; any other batch goes key by key."""
    n = len(keys)
    if type(keys) is OffsetKeys or 36 not in set(map(len, keys)):  # (an offset key of 36 characters is one too)
        return [None] * n
    raw = ("\n".join(keys) + "\n").encode()
    if (n and len(raw) == 37 * n and not raw.translate(None, b"0123456789abcdef-\n")  # 36 hex or '-', a newline
            and raw.count(b"-") == 4 * n and raw.count(b"\n") == n  # ... each in its place:
            and raw[8::37] == raw[13::37] == raw[18::37] == raw[23::37] == b"-" * n and raw[36::37] == b"\n" * n
            and raw[14::37] == b"7" * n and not raw[19::37].translate(None, b"89ab")):
        prefixes = list(map(_PREFIX, keys))
        times = {p: int(p[:8] + p[9:], 16) for p in set(prefixes)}
        return list(map(times.__getitem__, prefixes))
    return [key_ms(k) for k in keys]


_PREFIX = operator.itemgetter(slice(0, 13))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def width_for(retention_ms: int | None) -> int:
    """Partitions an eighth of the retention wide (a day at most), so state is kept at most 1⅛ retentions."""
    return DAY_MS if retention_ms is None else max(MIN_WIDTH_MS, min(DAY_MS, retention_ms // 8))


@dataclass
class Window:
    """One partitioned state table's window, as ``kdg_windows`` holds it."""

    relation: str
    sink_table: str | None
    retention_ms: int | None
    retention_from: str | None
    width_ms: int
    horizon_ms: int | None
    parts: list[tuple[int, int]] = field(default_factory=list)   # [lo, hi) of each partition, as last read
    schema: str = "public"   # where kdg's state lives (kdg_windows' schema): every partition is made there
    version: object = None   # kdg_windows.updated_at as read: a change means the partitions changed shape
    healed: list[str] = field(default_factory=list)  # what was found dropped outside kdg as it was read
    sink_oid: int | None = None  # the sink table its claims were made for (None: not recorded yet; owners.py)

    def to_dict(self) -> dict:
        return asdict(self) | {"parts": len(self.parts)}

    @property
    def sql(self) -> str:
        """The state table, schema-qualified: the session's search path may name another schema first."""
        return f"{quote_ident(self.schema)}.{quote_ident(self.relation)}"

    def part_sql(self, part: str) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(part)}"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass
class Maintained:
    """What one maintenance pass did to one window."""

    relation: str
    sink_table: str | None
    retention_ms: int | None
    width_ms: int = 0
    dropped: int = 0
    kept: int = 0
    horizon_ms: int | None = None
    bytes: int = 0
    narrowed: int = 0              # partitions of a wider width cut at the end of today's slot
    skipped: str | None = None     # why nothing was done (another maintainer, a lock not granted in time)
    healed: list[str] = field(default_factory=list)  # found dropped outside kdg, and forgotten (forget_dropped)


_WINDOW = """SELECT w.relation, w.sink_table, w.retention_ms, w.retention_from, w.width_ms, w.horizon_ms, w.sink_oid,
                    coalesce(array_agg(ARRAY[p.lo_ms, p.hi_ms] ORDER BY p.lo_ms) FILTER (WHERE p.part IS NOT NULL),
                             '{}') AS parts,
                    (SELECT nspname FROM pg_namespace n JOIN pg_class c ON c.relnamespace = n.oid
                     WHERE c.oid = 'kdg_windows'::regclass) AS schema, w.updated_at
             FROM kdg_windows w LEFT JOIN kdg_window_parts p USING (relation)
             WHERE w.relation = $1 GROUP BY w.relation"""


# The bytes on disk of one window's partitions (the partitions live in kdg_windows' schema)
SIZE = """SELECT coalesce(sum(pg_total_relation_size(to_regclass(quote_ident(n.nspname) || '.' || quote_ident(p.part)))),
                          0)::bigint
          FROM kdg_window_parts p, pg_namespace n JOIN pg_class c ON c.relnamespace = n.oid
          WHERE c.oid = 'kdg_windows'::regclass AND p.relation = $1"""


def _window(row) -> Window:
    return Window(row["relation"], row["sink_table"], row["retention_ms"], row["retention_from"], row["width_ms"],
                  row["horizon_ms"], [(lo, hi) for lo, hi in row["parts"]], row["schema"], row["updated_at"],
                  sink_oid=row["sink_oid"])


async def _windows(conn, relations: list[str] | None = None) -> list[Window]:
    """Every window, or those of ``relations``."""
    rows = await conn.fetch(_WINDOW.replace("w.relation = $1", "($1::text[] IS NULL OR w.relation = ANY($1))")
                            + " ORDER BY 1", relations)
    return [_window(r) for r in rows]


_HOME = "(SELECT n.nspname FROM pg_namespace n JOIN pg_class c ON c.relnamespace = n.oid " \
        "WHERE c.oid = 'kdg_windows'::regclass)"
_GONE = "to_regclass(quote_ident(" + _HOME + ") || '.' || quote_ident({name})) IS NULL"
# Claim tables and partitions that kdg_windows and kdg_window_parts list but the catalog does not hold
_FORGET_TABLES = f"""DELETE FROM kdg_windows w
    WHERE w.sink_table IS NOT NULL AND ($1::text[] IS NULL OR w.relation = ANY($1))
      AND {_GONE.format(name="w.relation")}
    RETURNING w.relation, w.sink_table"""
_FORGET_PARTS = f"""WITH gone AS (
        DELETE FROM kdg_window_parts p
        WHERE ($1::text[] IS NULL OR p.relation = ANY($1)) AND {_GONE.format(name="p.part")}
        RETURNING p.relation, p.part),
    touched AS (UPDATE kdg_windows w SET updated_at = now() FROM gone WHERE w.relation = gone.relation)
    SELECT g.relation, w.sink_table, g.part FROM gone g JOIN kdg_windows w USING (relation) ORDER BY g.part"""


async def forget_dropped(conn, relations: list[str] | None = None) -> dict[str, tuple[str | None, list[str]]]:
    """Forget the claim tables and partitions of windows (all, or ``relations``) dropped outside kdg: per window,
    ``(sink table, what was found gone, in words)``.

    Left listed, a dropped partition made every write of a key in its range fail ("no partition of relation
    found for row", for ever: kdg would not make a partition it lists), and a dropped claim table failed every
    write and every maintenance pass of every window. Forgotten, a partition is made again, empty, when a key
    needs it (a running writer re-reads its window: its version moved), and a claim table when its sink table
    is next written. The claims they held are gone: a record claimed there and read again is written again."""
    found: dict[str, tuple[str | None, list[str]]] = {}
    for row in await conn.fetch(_FORGET_TABLES, relations):
        found[row["relation"]] = (row["sink_table"], [
            f"claim table {row['relation']} was dropped outside kdg: forgotten, and made again, empty, when "
            f"{row['sink_table']} is next written; a record claimed in it and read again is written again"])
    for row in await conn.fetch(_FORGET_PARTS, relations):
        _, notes = found.setdefault(row["relation"], (row["sink_table"], []))
        notes.append(f"partition {row['part']} was dropped outside kdg: forgotten, and made again, empty, when a "
                     "key needs it; a record claimed in it and read again is written again")
    return found


async def claim_window(conn, table: TableName) -> Window:
    """The claim window of sink table ``table`` (an identity), its claim table made if missing (or dropped
    outside kdg: :attr:`Window.healed` then says what was forgotten)."""
    known = await conn.fetchval("SELECT relation FROM kdg_windows WHERE sink_table = $1", table.text)
    healed = await forget_dropped(conn, [known]) if known is not None else {}
    relation = await conn.fetchval("SELECT kdg_claim_table($1)", table.text)
    window = _window(await conn.fetchrow(_WINDOW, relation))
    window.healed = [note for _, notes in healed.values() for note in notes]
    return window


async def ensure_parts(conn, window: Window, times: list[int]) -> None:
    """Make sure a partition exists for each of ``times`` at or above the horizon (``window.parts`` updated)."""
    if not times:
        return
    first, last = min(times), max(times)
    if any(lo <= first and last < hi for lo, hi in window.parts):
        return  # the common case, a batch of keys from one partition: no per-key work
    lo = hi = 0
    for t in sorted(set(times)):
        if lo <= t < hi:
            continue  # in the partition found for the time before
        found = next(((a, b) for a, b in window.parts if a <= t < b), None)
        if found is not None:
            lo, hi = found
            continue
        if window.horizon_ms is not None and t < window.horizon_ms:
            continue
        name = await conn.fetchval("SELECT kdg_window_part($1, $2)", window.relation, t)
        if name is not None:
            lo, hi = (int(x) for x in name.rsplit("_", 2)[1:])
            window.parts = sorted({*window.parts, (lo, hi)})


def dropped_while_writing(window: Window) -> PostgresRefused:
    """A writer's whole claim table was dropped outside kdg: it stops, and its next start makes a new one (with
    the retention its window is given then; a writer carrying on would fill a table nobody expires)."""
    return PostgresRefused(
        f"the claim table of {window.sink_table} ({window.relation}) was dropped outside kdg while this writer "
        "ran: start it again to make a new, empty one (a record claimed in the old one and read again is then "
        "written again)")


async def hold_horizon(conn, window: Window) -> None:
    """Inside a claiming transaction: read the horizon, holding it until commit (maintenance waits); the
    window read again if maintenance changed it since (a horizon raised, partitions cut or made)."""
    await hold_horizons(conn, [window])


async def hold_horizons(conn, windows: list[Window]) -> None:
    """:func:`hold_horizon` for the windows of every table a transaction claims in: two statements, however many."""
    relations = sorted({w.relation for w in windows})
    await conn.execute("SELECT pg_advisory_xact_lock_shared($1, hashtext(r)) FROM unnest($2::text[]) AS r",
                       _HORIZON, relations)
    # a statement of its own, so its snapshot is taken after the locks: it sees what maintenance committed
    versions = dict(await conn.fetch("SELECT relation, updated_at FROM kdg_windows WHERE relation = ANY($1::text[])",
                                     relations))
    for window in windows:
        if versions.get(window.relation) == window.version:
            continue
        row = await conn.fetchrow(_WINDOW, window.relation)
        if row is None:  # forget_dropped, in another process: the claim table was dropped outside kdg
            raise dropped_while_writing(window)
        fresh = _window(row)
        window.horizon_ms, window.parts, window.width_ms, window.version = (
            fresh.horizon_ms, fresh.parts, fresh.width_ms, fresh.version)


class WindowsMixin:
    """Retention windows: owns ``kdg_windows`` and ``kdg_window_parts``, and makes and drops the
    partitions of ``kdg_dedup_<n>`` and ``kdg_ledger``."""

    def claim_window(self, table: TableName) -> Window:
        """The claim window of sink table ``table`` (an identity), its claim table made if missing, checked to
        hold the claims of the table there now (:func:`kdg.store.owners.check_owner`: else StaleClaims). Its
        ``healed`` says what was found dropped, and what the store's preparing of the table dropped."""
        from kdg.store.owners import check_owner

        window = self._run(claim_window(self.conn, table))
        self._run(check_owner(self.conn, window, table))
        window.healed[:0] = self.healed  # a table kdg has just created took its name's claims with it
        self.healed.clear()
        return window

    def ledger_window(self) -> Window:
        return _window(self._run(self.conn.fetchrow(_WINDOW, "kdg_ledger")))

    def set_retention(self, window: Window, retention_ms: int | None, source: str) -> None:
        """Keep ``window``'s state for ``retention_ms`` (None: for ever); ``source`` says who chose it."""
        width = width_for(retention_ms)
        self._run(self.conn.execute(
            """UPDATE kdg_windows SET retention_ms = $2, retention_from = $3, width_ms = $4, updated_at = now()
               WHERE relation = $1""", window.relation, retention_ms, source, width))
        window.retention_ms, window.retention_from, window.width_ms = retention_ms, source, width

    def maintain(self, *, at_ms: int | None = None, lock_timeout_s: float = 2.0,
                 relations: list[str] | None = None, sizes: bool = False) -> list[Maintained]:
        """One maintenance pass over every window (or ``relations``): expired partitions dropped, the
        horizon raised, partitions made ahead. Skipped, with the reason, where another process is
        maintaining or a partition's lock is not granted within ``lock_timeout_s`` (a long audit). ``sizes``:
        also each window's bytes on disk (for people; a consumer's pass does not need them)."""
        return self._run(self._maintain(now_ms() if at_ms is None else at_ms, lock_timeout_s, relations, sizes))

    async def _maintain(self, at: int, lock_timeout_s: float, relations, sizes: bool) -> list[Maintained]:
        import asyncpg

        done = []
        healed = await forget_dropped(self.conn, relations)
        self.healed.extend(note for _, notes in healed.values() for note in notes)  # for a writer's own upkeep
        windows = {w.relation: w for w in await _windows(self.conn, relations)}
        for relation, (sink_table, notes) in healed.items():
            if relation not in windows:  # the whole claim table went, and with it its window
                done.append(Maintained(relation, sink_table, None, healed=notes))
        for window in windows.values():
            report = Maintained(window.relation, window.sink_table, window.retention_ms, window.width_ms,
                                horizon_ms=window.horizon_ms, healed=healed.get(window.relation, (None, []))[1])
            done.append(report)
            try:
                async with self.conn.transaction():
                    if await self.conn.fetchval("SELECT pg_try_advisory_xact_lock($1, hashtext($2))",
                                                _LOCK, window.relation):
                        await self.conn.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_s * 1000)}")
                        await self._expire(window, at, report)
                    else:
                        report.skipped = "another process is maintaining it"
            except asyncpg.exceptions.LockNotAvailableError:
                report.skipped = f"a lock was not granted within {lock_timeout_s:g} s (a long read?); next time"
            await ensure_parts(self.conn, window, (at, at + window.width_ms))
            report.kept = len(window.parts)
            if sizes:
                report.bytes = await self.conn.fetchval(SIZE, window.relation)
        return done

    async def _expire(self, window: Window, at: int, report: Maintained) -> None:
        if window.retention_ms is None:
            return
        await self.conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _HORIZON, window.relation)
        report.narrowed = await self._narrow(window, at)
        cut = at - window.retention_ms
        expired = await self.conn.fetch(
            "SELECT part, hi_ms FROM kdg_window_parts WHERE relation = $1 AND hi_ms <= $2 ORDER BY lo_ms",
            window.relation, cut)
        if not expired:
            return
        for row in expired:
            await self.conn.execute(f'DROP TABLE IF EXISTS {window.part_sql(row["part"])}')
        horizon = max(window.horizon_ms or expired[-1]["hi_ms"], expired[-1]["hi_ms"])
        await self.conn.execute("DELETE FROM kdg_window_parts WHERE relation = $1 AND hi_ms <= $2",
                                window.relation, cut)
        await self.conn.execute("UPDATE kdg_windows SET horizon_ms = $2, updated_at = now() WHERE relation = $1",
                                window.relation, horizon)
        window.horizon_ms = report.horizon_ms = horizon
        window.parts = [(lo, hi) for lo, hi in window.parts if hi > cut]
        report.dropped = len(expired)

    async def _narrow(self, window: Window, at: int) -> int:
        """Cut each partition made under a wider width (before the retention was shortened) at the end of
        the slot of today's width that holds ``at``, so it expires on today's schedule, not up to a day
        later; rows past the cut move to partitions of today's width. Under the horizon lock, so no
        claiming transaction is between; a writer without it (the ledger's) waits for the DETACH's lock."""
        width, column = await self.conn.fetchrow("SELECT width_ms, time_column FROM kdg_windows WHERE relation = $1",
                                                 window.relation)
        split = at - at % width + width
        wide = await self.conn.fetch(
            "SELECT part, lo_ms FROM kdg_window_parts WHERE relation = $1 AND hi_ms - lo_ms > $2 AND hi_ms > $3 "
            "ORDER BY lo_ms", window.relation, width, split)
        if not wide:
            return 0
        if column == "key_ms":
            t, bound = "key_ms", "$1::bigint"
        else:
            t, bound = "floor(extract(epoch FROM recorded_at) * 1000)::bigint", "to_timestamp($1::bigint / 1000.0)"
        for row in wide:
            old = window.part_sql(row["part"])
            await self.conn.execute(f"ALTER TABLE {window.sql} DETACH PARTITION {old}")
            if row["lo_ms"] < split:
                name = f"{window.relation}_{row['lo_ms']}_{split}"
                await self.conn.execute("UPDATE kdg_window_parts SET hi_ms = $2, part = $3 WHERE part = $1",
                                        row["part"], split, name)
            else:
                await self.conn.execute("DELETE FROM kdg_window_parts WHERE part = $1", row["part"])
            past = f"{column} >= {bound}"
            for (ms,) in await self.conn.fetch(f"SELECT DISTINCT {t} FROM {old} WHERE {past} ORDER BY 1", split):
                await self.conn.execute("SELECT kdg_window_part($1, $2)", window.relation, ms)
            await self.conn.execute(f"WITH moved AS (DELETE FROM {old} WHERE {past} RETURNING *) "
                                    f"INSERT INTO {window.sql} SELECT * FROM moved", split)
            if row["lo_ms"] < split:
                await self.conn.execute(f"ALTER TABLE {old} RENAME TO {quote_ident(name)}")
                lo, hi = [await self.conn.fetchval(f"SELECT format('%L', {bound})", ms) for ms in (row["lo_ms"], split)]
                await self.conn.execute(f"ALTER TABLE {window.sql} ATTACH PARTITION {window.part_sql(name)} "
                                        f"FOR VALUES FROM ({lo}) TO ({hi})")
            else:
                await self.conn.execute(f"DROP TABLE {old}")
        await self.conn.execute("UPDATE kdg_windows SET updated_at = now() WHERE relation = $1", window.relation)
        fresh = _window(await self.conn.fetchrow(_WINDOW, window.relation))
        window.parts, window.version = fresh.parts, fresh.version
        return len(wide)
