"""Exactly-once claims: each row's idempotency key is claimed once in ``kdg_dedup``, and only rows
whose claim is new reach the sink.

The claim itself (:data:`CLAIM`, :func:`copy_claims`) is shared with the typed sink
(:mod:`kdg.store.typed`); :class:`ClaimsMixin` claims and inserts the generic table's rows, inside the
transaction :mod:`kdg.store.unit` opens for a batch (or its own, for Spark), mixed into
:class:`kdg.store.pg.Store`. A key that is its record's own coordinates (an offset key) is claimed by them,
in a run of its partition's consecutive offsets: one claim row a run (:data:`IN_RUN`, migration 010).
"""

import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain, repeat

import asyncpg

from kdg.records import OffsetKeys, offset_key, offset_prefix
from kdg.settings import TableName, table_name
from kdg.store.rows import GROUP_SINK_COLUMNS, SINK_COLUMNS, SinkRows
from kdg.store.windows import Window, claim_window, ensure_parts, hold_horizons, keys_ms, now_ms

# A key that is its record's own coordinates (``--id-from offset``, or a key's fallback) is claimed by them,
# as a run of consecutive offsets (migration 010): ``"offset"`` the first, ``last_offset`` the last. OWN is that
# key of a row alias's coordinates (kdg.records.offset_key, in SQL); IN_RUN whether a run of the claim table
# ($1 the sink table) holds any offset of ``{lo}`` to ``{hi}`` of the row's partition: runs never overlap (each
# is made under the lock for keys without a time, after this look-up), so only the run starting last at or
# before ``{hi}`` can, one step down index kdg_dedup_runs.
OWN = """({row}.topic || '/' || {row}."partition" || '/' || {row}."offset")"""
IN_RUN = """coalesce((SELECT d.last_offset FROM {{claims}} d WHERE d.sink_table = $1 AND d.last_offset IS NOT NULL
                   AND d.topic = {row}.topic AND d."partition" = {row}."partition" AND d."offset" <= {hi}
                   ORDER BY d."offset" DESC LIMIT 1) >= {lo}, false)"""
# the records a claim row stands for (a run's offsets, else one)
CLAIMED_RECORDS = 'coalesce(last_offset - "offset" + 1, 1)'


def claimable(row: str, key: str, ms: str) -> str:
    """The condition under which a row (alias ``row``, its key ``key``, the time it carries ``ms``: NULL for none)
    is claimed now, in a statement whose $1 is the sink table's identity, $2 the time a key without one is
    claimed at, $3 the window's horizon: a key below the horizon is not claimed, nor is a key without a time
    that a partition holds already, as itself or (an offset key) in a run. :data:`CLAIM` and
    :data:`kdg.store.filtered.MARK` share it."""
    own = OWN.format(row=row)
    return f"""($3::bigint IS NULL OR coalesce({ms}, $2) >= $3)
               AND ({ms} IS NOT NULL OR NOT EXISTS (
                    SELECT 1 FROM {{claims}} d WHERE d.sink_table = $1 AND d.idempotency_key = {key})
                    AND ({key} <> {own} OR NOT {IN_RUN.format(row=row, lo=f'{row}."offset"', hi=f'{row}."offset"')}))"""


def run_end(row: str, key: str) -> str:
    """A claim's ``last_offset``: its own offset for an offset key (a run of one), else NULL."""
    return f'CASE WHEN {key} = {OWN.format(row=row)} THEN {row}."offset" END'


# Claim each staged key in its table's claim table (``kdg_dedup_<n>``, a partition of kdg_dedup); the
# generic sink's fallback path (below) and the typed sink's TypedTarget.claim_sql use the same statement.
# $1 the sink table's identity, $2 the time a key without one is claimed at, $3 the window's horizon.
# A key whose time is below the horizon is not claimed (:data:`OUTSIDE`); a key without a time is
# claimed only if no partition holds it yet — under the lock :func:`prepare_claims` took.
CLAIM = f"""INSERT INTO {{claims}} (sink_table, idempotency_key, key_ms, topic, "partition", "offset", last_offset)
           SELECT $1, s.idempotency_key, coalesce(kdg_key_ms(s.idempotency_key), $2), s.topic, s."partition",
                  s."offset", {run_end("s", "s.idempotency_key")}
           FROM {{stage}} s
           WHERE {claimable("s", "s.idempotency_key", "kdg_key_ms(s.idempotency_key)")}
           ON CONFLICT DO NOTHING RETURNING idempotency_key, "partition", "offset\""""
# a staged row whose key is older than the window: written without a claim
OUTSIDE = "coalesce(kdg_key_ms(s.idempotency_key) < $3, false)"
# Whether any of the keys ($2, keys without a time) is claimed in any partition of the table's claims: one
# walk of the primary key over the sorted keys (``= ANY`` of an array), where the NOT EXISTS of CLAIM is
# planned as a hash of every claim of the table, rebuilt for each batch
CLAIMED_BEFORE = """SELECT EXISTS (SELECT 1 FROM {claims} d WHERE d.sink_table = $1
                                  AND d.idempotency_key = ANY($2::text[]))"""
# The same, and whether a run ($3..$6: topics, partitions, first and last offsets) overlaps a run claimed before:
# one look-up of a batch's keys and runs (a run's first key is among the keys, in case another kind of key was
# spelled the same).
CLAIMED_OR_RUN = CLAIMED_BEFORE + """ OR EXISTS (
    SELECT 1 FROM unnest($3::text[], $4::int[], $5::bigint[], $6::bigint[]) AS b(topic, "partition", lo, hi)
    WHERE """ + IN_RUN.format(row="b", lo="b.lo", hi="b.hi") + ")"

# The same, for keys this transaction copied in already (:attr:`Claims.early`), claimed at $3: a claim of one of
# them at another time was made by another transaction (at the same time it would have failed that COPY).
# Two walks of the primary key, each bounded by key_ms (an index condition), so this transaction's own
# claims, not yet visible to any other, cost no heap visit.
CLAIMED_ELSEWHERE = """SELECT EXISTS (SELECT 1 FROM {claims} d WHERE d.sink_table = $1
                                     AND d.idempotency_key = ANY($2::text[]) AND d.key_ms < $3)
                           OR EXISTS (SELECT 1 FROM {claims} d WHERE d.sink_table = $1
                                     AND d.idempotency_key = ANY($2::text[]) AND d.key_ms > $3)"""
EARLY = "kdg_early_claims"  # the savepoint an early COPY of claims goes in under

DEDUP_COLUMNS = ("sink_table", "idempotency_key", "key_ms", "topic", "partition", "offset")  # a claim
RUN_COLUMNS = (*DEDUP_COLUMNS, "last_offset")  # a claim as COPY writes it: a run, or one key (None)
_TIMELESS_LOCK = 0x6B646774  # "kdgt": claims of keys without a time, one transaction at a time per table


@dataclass
class Claims:
    """A batch's keys sorted out against its table's window, inside the claiming transaction."""

    window: Window
    now: int                       # the time keys without one are claimed at
    times: list[int | None]        # each row's key_ms (None: the key carries no time)
    outside: int = 0               # rows whose key is below the horizon: written without a claim
    also: bool = False             # the lock :func:`prepare_claims` was asked to take ``also`` is taken
    early: bool = False            # copied in before the locks, under savepoint :data:`EARLY` (not looked up yet)

    timeless: list[str] = field(default_factory=list)  # the keys without a time (claimed at ``now``)
    runs: list | None = None       # :meth:`split`: runs of offset keys, [topic, partition, first, last] each
    singles: list[int] | None = None  # :meth:`split`: the rows whose key is claimed as such (None: every row)
    keyed: tuple = ()              # :meth:`split`: the claims' keys, topics, partitions and offsets (columns)

    @property
    def fast(self) -> bool:
        """No key is below the horizon: claims can go in by COPY (keys without a time once
        :data:`CLAIMED_BEFORE` found none of them claimed)."""
        return not self.outside

    @cached_property
    def certain(self) -> bool:
        """Every key is without a time and comes once: once :data:`CLAIMED_OR_RUN` found none of them claimed
        (under the lock :func:`prepare_claims` took, so no other writer can claim one meanwhile), their COPY
        cannot fail on a key. (Read once the keys are sorted out; offset keys that made runs come once.)"""
        if len(self.timeless) != len(self.times):
            return False
        if self.runs and self.runs is not _BROKEN and not self.singles:
            return True
        return len(set(self.timeless)) == len(self.timeless)

    def split(self, keyed) -> bool:
        """Sort a batch's claims into runs of offset keys (a key that is its record's coordinates, claimed by
        them: :data:`IN_RUN`) and keys claimed as such, once; ``keyed`` as :meth:`rows` takes it. False if an
        offset key comes twice or goes back in its partition: such a batch is claimed in SQL (:data:`CLAIM`).
        A batch with no offset key (every key with a time, or none spelling its stretch's prefix) is told in C,
        and keeps every key as such (``singles`` None)."""
        if self.runs is not None:
            return self.runs is not _BROKEN
        keys, topics, partitions, offsets = self.keyed = _columns(keyed)
        self.runs, self.singles = [], None
        if not self.timeless:  # (an offset key carries no time)
            return True
        if keys[0] != offset_key(topics[0], partitions[0], offsets[0]):  # a batch of other keys is told at once
            text = "\n".join(keys)
            if not any(offset_prefix(t, p) in text for t, p in set(zip(topics, partitions))):
                return True
        runs, singles, last = [], [], {}
        made = type(keys) is OffsetKeys  # each key made as its record's offset key: nothing to read
        for s, e in _stretches(topics, partitions, offsets):
            t, p, lo, hi = topics[s], partitions[s], offsets[s], offsets[e - 1]
            head = offset_prefix(t, p)  # the stretch's keys are its offsets' (the common case: one compare in C)
            if made:
                pieces = [[lo, hi]]
            elif (text := "\n".join(keys[s:e])) == head + ("\n" + head).join(map(str, range(lo, hi + 1))):
                pieces = [[lo, hi]]
            elif head not in text:  # none is (a key of another kind: in C too)
                singles.extend(range(s, e))
                continue
            else:
                pieces = []
                for i in range(s, e):
                    if keys[i] != head + str(offsets[i]):
                        singles.append(i)
                    elif pieces and pieces[-1][1] == offsets[i] - 1:
                        pieces[-1][1] = offsets[i]
                    else:
                        pieces.append([offsets[i], offsets[i]])
            for lo, hi in pieces:
                run = last.get((t, p))
                if run is not None and lo <= run[3]:
                    self.runs = _BROKEN
                    return False
                if run is not None and lo == run[3] + 1:
                    run[3] = hi
                else:
                    last[(t, p)] = run = [t, p, lo, hi]
                    runs.append(run)
        self.runs, self.singles = runs, singles if runs else None  # (no run: every row is a key as such)
        return True

    def rows(self, keyed) -> Iterator[tuple]:
        """Claim rows in :data:`RUN_COLUMNS` order, one at a time (COPY encodes each as it comes: a batch's rows
        never all exist twice): each key claimed as such (zipped in C when all are), then each run of offset
        keys (:meth:`split`), from a batch's :class:`SinkRows`, its ``(keys, topics, partitions, offsets)``
        columns, or ``(key, topic, partition, offset)`` tuples."""
        if not self.split(keyed):
            raise ValueError("an offset key comes twice in this batch: claim it in SQL")
        table, now = self.window.sink_table, self.now
        keys, topics, partitions, offsets = self.keyed
        times = [now if t is None else t for t in self.times] if self.timeless else self.times
        if self.singles is None:
            singles = zip(repeat(table), keys, times, topics, partitions, offsets, repeat(None))
        else:
            singles = ((table, keys[i], times[i], topics[i], partitions[i], offsets[i], None) for i in self.singles)
        return chain(singles, ((table, offset_key(t, p, lo), now, t, p, lo, hi) for t, p, lo, hi in self.runs))

    def looked_up(self) -> tuple:
        """:data:`CLAIMED_OR_RUN`'s parameters after :meth:`split`: the keys without a time claimed as such, each
        run's first key, and the runs as columns."""
        keys, times = self.keyed[0], self.times
        found = self.timeless if self.singles is None else [keys[i] for i in self.singles if times[i] is None]
        runs = list(zip(*self.runs)) or [(), (), (), ()]
        return (self.window.sink_table, found + [offset_key(t, p, lo) for t, p, lo, _ in self.runs], *map(list, runs))

    @property
    def args(self) -> tuple:
        """:data:`CLAIM`'s parameters."""
        return self.window.sink_table, self.now, self.window.horizon_ms


_BROKEN: list = []  # Claims.runs of a batch whose offset keys do not make runs


def _columns(keyed) -> tuple[list, list, list, list]:
    """A batch's claims as four columns: keys, topics, partitions, offsets (see :meth:`Claims.rows`)."""
    if isinstance(keyed, SinkRows):
        return tuple(keyed.columns[:4])
    if isinstance(keyed, tuple) and len(keyed) == 4 and isinstance(keyed[0], list):
        return keyed
    found = list(zip(*keyed))
    return tuple(map(list, found)) if found else ([], [], [], [])


def _stretches(topics: list, partitions: list, offsets: list) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each stretch of a batch's records that are one partition's consecutive offsets, in
    order (found in C: a stretch ends where the next record is not the offset after)."""
    n = len(offsets)
    follows = list(map(operator.and_, map(operator.eq, offsets[1:], map(operator.add, offsets, repeat(1))),
                       map(operator.eq, partitions[1:], partitions)))
    if topics.count(topics[0] if n else None) != n:
        follows = list(map(operator.and_, follows, map(operator.eq, topics[1:], topics)))
    start = 0
    while start < n:
        try:
            end = follows.index(False, start) + 1
        except ValueError:
            end = n
        yield start, end
        start = end


async def prepare_claims(conn: asyncpg.Connection, window: Window, keys: list[str], held: bool = False,
                         also: int | None = None, early=None) -> Claims:
    """Inside the batch's transaction: hold the horizon (unless ``held``: :func:`hold_horizons` did, for every
    table of the transaction), make the partitions the keys need, and take the table's lock for keys without a
    time (their look-up across partitions must not race another's). ``also``: an advisory lock (one 64-bit key:
    a pipeline's) taken in the same statement as that one, saving a round trip (:attr:`Claims.also` says so).

    ``early``: the claims' ``keyed`` rows (as :meth:`Claims.rows` takes them), copied in *before* the locks when
    every key is without a time and comes once (:attr:`Claims.certain`), under savepoint :data:`EARLY`: a
    pipelined batch's COPY then overlaps the batch before's upsert instead of following its commit. Nothing
    else sees them before this transaction commits; :func:`copy_all_claims` looks the keys up once the lock
    is held and takes the COPY back if another transaction claimed one (:attr:`Claims.early`)."""
    if not held:
        await hold_horizons(conn, [window])
    claims = Claims(window, now_ms(), keys_ms(keys))
    times, horizon = claims.times, window.horizon_ms
    timeless = None in times
    timed = [t for t in times if t is not None] if timeless else times
    if horizon is not None and timed and min(timed) < horizon:
        claims.outside = sum(1 for t in timed if t < horizon)
    await ensure_parts(conn, window, timed + [claims.now] if timeless else timed)
    if timeless:
        claims.timeless = [k for k, t in zip(keys, times) if t is None] if timed else list(keys)
        if early is not None and claims.split(early) and not claims.runs and claims.certain:
            claims.early = await _copy_early(conn, claims, early)  # (runs are a few rows: copied once looked up)
        if also is None:
            await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _TIMELESS_LOCK, window.relation)
        else:
            await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2)), pg_advisory_xact_lock($3)",
                               _TIMELESS_LOCK, window.relation, also)
            claims.also = True
    return claims


async def _copy_early(conn: asyncpg.Connection, claims: Claims, keyed) -> bool:
    """:func:`prepare_claims`'s ``early`` COPY; False (taken back) if a claim at the same time had the same key:
    one a transaction committed (or, waited for here, before the locks, committed meanwhile)."""
    await conn.execute(f"SAVEPOINT {EARLY}")
    try:
        await _copy(conn, claims, keyed)
        return True
    except asyncpg.exceptions.UniqueViolationError:
        await conn.execute(f"ROLLBACK TO SAVEPOINT {EARLY}")
        return False


async def _copy(conn: asyncpg.Connection, claims: Claims, keyed) -> None:
    await conn.copy_records_to_table(claims.window.relation, schema_name=claims.window.schema,
                                     records=claims.rows(keyed), columns=RUN_COLUMNS)


async def copy_claims(conn: asyncpg.Connection, claims: Claims, keyed) -> bool:
    """:func:`copy_all_claims` of one table's keys."""
    return await copy_all_claims(conn, [(claims, keyed)])


async def copy_all_claims(conn: asyncpg.Connection, tables: list[tuple[Claims, object]]) -> bool:
    """Claim keys by COPY straight into each table's claim table, all under one savepoint; False (nothing
    claimed) if any key was claimed before or comes twice, or a table's batch is not :attr:`Claims.fast` —
    then the caller claims through :data:`CLAIM`, in SQL. ``tables``: ``(claims, keyed)`` of each table.

    The common case (every key new) costs one COPY a table instead of an INSERT … SELECT that returns each claim.
    A key with a time claimed before, or twice, has the same primary key and fails the COPY; a key without one
    is claimed at ``now``, so a claim of it made earlier is looked for first (:data:`CLAIMED_OR_RUN`, under
    the lock :func:`prepare_claims` took), and twice in the batch fails the COPY like any other. Offset keys
    go in as runs (:meth:`Claims.split`), looked up in the same statement; one that comes twice sends the batch
    to SQL. Claims copied in already (:attr:`Claims.early`: a batch without offset keys) are looked up the
    same way (:data:`CLAIMED_ELSEWHERE`), and taken back if one was claimed before.
    """
    if not all(claims.fast for claims, _ in tables):
        return False
    if any(claims.early for claims, _ in tables):
        (claims, _), = tables  # (only a batch of one table copies early)
        if not await conn.fetchval(CLAIMED_ELSEWHERE.format(claims=claims.window.sql), claims.window.sink_table,
                                   claims.timeless, claims.now):
            return True
        await conn.execute(f"ROLLBACK TO SAVEPOINT {EARLY}")
        claims.early = False
        return False
    if not all(claims.split(keyed) for claims, keyed in tables):
        return False
    for claims, _ in tables:
        if claims.timeless and await conn.fetchval(CLAIMED_OR_RUN.format(claims=claims.window.sql),
                                                   *claims.looked_up()):
            return False

    async def copy():
        for claims, keyed in tables:
            await _copy(conn, claims, keyed)

    if all(claims.certain for claims, _ in tables):
        await copy()  # no savepoint (two round trips a batch): nothing can fail it
        return True
    try:
        async with conn.transaction():
            await copy()
        return True
    except asyncpg.exceptions.UniqueViolationError:
        return False


@dataclass
class Claiming:
    """One generic table's share of a batch on its way in: its claims, made by COPY (``copied``: its rows may go
    in as they are), or still to be made in SQL as its rows go in."""

    table: TableName
    rows: SinkRows
    claims: Claims
    copied: bool = False


class ClaimsMixin:
    """The generic sink's exactly-once writes: owns claiming keys and inserting the newly claimed rows.

    Touches ``kdg_dedup`` (the claims), the temp ``kdg_stage`` table (the fallback path) and the sink
    table named by the caller; the batch's offsets are :mod:`kdg.store.unit`'s to move.
    """

    def write_claimed(self, table: str | TableName, group: str, rows: list[tuple]) -> int:
        """One transaction: claim keys, insert newly claimed rows (no offsets). Returns rows inserted."""
        async def write():
            async with self.conn.transaction():
                return await self._claim_and_insert(table, group, rows)

        return self._run(write()) if rows else 0

    async def _claim_and_insert(self, table: str | TableName, group: str, rows, written=None) -> int:
        """Claim each row's key in ``kdg_dedup`` and insert the rows whose claim is new (inside a transaction):
        :meth:`_claim_tables` and :meth:`_insert_claimed` of one table. Returns rows inserted."""
        rows = SinkRows.of(rows)
        if not rows:
            return 0
        claiming, = await self._claim_tables([(table_name(table), rows)])
        return await self._insert_claimed(claiming, group, written)

    async def _claim_tables(self, tables: list[tuple[TableName, SinkRows]]) -> list[Claiming]:
        """Claim the keys of every ``(table, rows)`` of a transaction: the horizons held in two statements, then
        every table's claims by COPY under one savepoint (:func:`copy_all_claims`). Keys never claimed before
        (the common case) are then claimed, and each table's rows may go in by COPY; a key claimed earlier, or
        twice, rolls the savepoint back, and :meth:`_insert_claimed` claims in SQL only what is new."""
        windows = [await self._claim_window(table) for table, _ in tables]
        await hold_horizons(self.conn, windows)
        found = []
        for (table, rows), window in zip(tables, windows):
            claims = await prepare_claims(self.conn, window, rows.keys, held=True)
            self.unclaimed += claims.outside
            found.append(Claiming(table, rows, claims))
        if await copy_all_claims(self.conn, [(c.claims, c.rows) for c in found]):
            for claiming in found:
                claiming.copied = True
        return found

    async def _insert_claimed(self, claiming: Claiming, group: str, written=None) -> int:
        """Insert a table's rows whose claim is new (:meth:`_claim_tables`); the count. ``written``, when given,
        gets ``(key, partition, offset)`` of each row inserted if not all of them were."""
        table, rows, claims = claiming.table, claiming.rows, claiming.claims
        if claiming.copied:
            await self.conn.copy_records_to_table(table.name, schema_name=table.schema, records=rows.grouped(group),
                                                  columns=GROUP_SINK_COLUMNS)
            return len(rows)
        await self.conn.copy_records_to_table("kdg_stage", records=rows.tuples(), columns=SINK_COLUMNS)
        # ON CONFLICT DO NOTHING also skips a key repeated within the batch: the first
        # staged copy wins, and only the claimed (key, partition, offset) rows are inserted,
        # with the rows too old to be claimed.
        insert = f"""
            WITH claimed AS ({CLAIM.format(claims=claims.window.sql, stage="kdg_stage")})
            INSERT INTO {table.sql} (idempotency_key, consumer_group, topic, "partition", "offset",
                                 key, value, headers)
            SELECT s.idempotency_key, $4, s.topic, s."partition", s."offset", s.key, s.value, s.headers
            FROM kdg_stage s LEFT JOIN claimed c ON c.idempotency_key = s.idempotency_key
                 AND c."partition" = s."partition" AND c."offset" = s."offset"
            WHERE c.idempotency_key IS NOT NULL OR {OUTSIDE}"""
        if written is None:
            return int((await self.conn.execute(insert, *claims.args, group)).split()[-1])
        found = await self.conn.fetch(insert + ' RETURNING idempotency_key, "partition", "offset"', *claims.args, group)
        written.update(map(tuple, found))
        return len(found)

    async def _claim_window(self, table: TableName) -> Window:
        """The table's claim window, read once per store and kept up to date by the claims themselves."""
        window = self._windows.get(table.text)
        if window is None:
            window = self._windows[table.text] = await claim_window(self.conn, table)
            self.healed.extend(window.healed)  # a pipeline's other connection may be the one to find the gap
        return window
