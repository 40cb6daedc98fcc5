"""Typed sink writes: a batch staged as text, claimed (exactly-once), then cast into the user's table.

Inside the caller's transaction:

1. COPY the staged rows (:mod:`kdg.mapping.rows`) into a per-connection temp table;
2. exactly-once: claim every row's idempotency key in ``kdg_dedup`` (the same claim the generic
   sink makes: by COPY when every key is new, else in SQL, dropping the staged rows whose key was
   claimed before);
3. ONE statement casts the staged values and writes them: ``insert``, or ``upsert`` (``INSERT …
   ON CONFLICT (key) DO UPDATE``, the latest record of each key in Kafka order winning), with
   tombstones deleting by key when asked.

A Debezium truncate (``on_truncate = "apply"``) that is not a duplicate empties the table at its place in
the batch, after the claims and before step 3: ``DELETE FROM`` the table, and the staged rows before the
last truncate dropped (they are superseded; the rows after it are written). A DELETE, not a TRUNCATE: it
takes row locks, not the ACCESS EXCLUSIVE lock that would queue every reader and every other member's
batch behind this transaction (and risk a deadlock with the tables it has written already), and a reader's
older snapshot still sees the rows, as MVCC promises. A column staged with Debezium's unavailable-value
placeholder (listed in ``kdg_tkeep``) keeps its value under upsert: the latest earlier version of the key in
the batch that has one, else the table's current value.

Under ``--reprocess`` (:mod:`kdg.store.reprocess`) a row whose key was claimed before is applied again, not
dropped: an UPDATE of its key's row where that row came from the same partition at no later an offset.

A statement Postgres refuses for a row's data (SQLSTATE class 22, a bad value or cast; class 23,
a NOT NULL, CHECK, unique or foreign-key violation — deferred constraints are checked at once, for
this) is run again on each half of the rows, each
under a savepoint, until the refused rows stand alone. Those come back as ``rejected`` for the
sink to dead-letter; the rest are written in the same transaction, and stay claimed with them.
"""

import hashlib
from dataclasses import dataclass, field

import asyncpg

from kdg.mapping.rows import STAGE_PREFIX, StagedRows, keepable
from kdg.mapping.spec import Mapping
from kdg.store.claims import CLAIM, OUTSIDE, Claims, copy_claims, prepare_claims
from kdg.store.reprocess import again_sql, check_reprocess, reprocess_claim_sql
from kdg.store.windows import Window

# the rows, not the server: data exceptions and integrity violations; an upsert's two rows whose keys are equal
# only once the column's modifier applied them (timestamptz(0), char(4)), which rows written apart do not meet;
# a value too large for an index row (program_limit_exceeded, only that one of its class)
ROW_ERROR_CLASSES = ("22", "23", "21")
ROW_ERROR_STATES = ("54000",)
_LAST = 2**31 - 1
KEEP = "kdg_tkeep"  # (seq, column index) of each placeholder of the part being written
_KEEP_DDL = f"CREATE TEMP TABLE IF NOT EXISTS {KEEP} (seq integer, col integer) ON COMMIT DELETE ROWS"

@dataclass(frozen=True)
class TypedTarget:
    """A mapping checked against its table (key resolved), and the SQL that writes it. Picklable."""

    mapping: Mapping
    reprocess: bool = False  # exactly-once: a key claimed before is applied again, not suppressed (upsert only)

    @property
    def stage(self) -> str:
        layout = ",".join(c.type.staged for c in self.mapping.columns)
        return f"kdg_tstage_{hashlib.sha1(layout.encode()).hexdigest()[:10]}"

    @property
    def copy_columns(self) -> tuple[str, ...]:
        return tuple(name for name, _ in STAGE_PREFIX) + tuple(f"c{i}" for i in range(len(self.mapping.columns)))

    def stage_ddl(self) -> str:
        cols = [f'"{name}" {pg_type}' for name, pg_type in STAGE_PREFIX]
        cols += [f"c{i} {c.type.staged}" for i, c in enumerate(self.mapping.columns)]
        return f"CREATE TEMP TABLE IF NOT EXISTS {self.stage} ({', '.join(cols)}) ON COMMIT DELETE ROWS"

    def claim_sql(self, claims: str) -> str:
        """Claim the staged keys into ``claims`` (the table's claim table); delete the staged rows whose key
        was claimed already (a duplicate). Rows too old to be claimed stay (:data:`~kdg.store.claims.OUTSIDE`).
        Returns one row: the duplicates deleted, and how many of them were tombstones or deletes."""
        return f"""WITH claimed AS ({CLAIM.format(claims=claims, stage=self.stage)}),
                   gone AS (DELETE FROM {self.stage} s WHERE NOT EXISTS (
                       SELECT 1 FROM claimed c WHERE c.idempotency_key = s.idempotency_key
                       AND c."partition" = s."partition" AND c."offset" = s."offset") AND NOT {OUTSIDE}
                       RETURNING s.tomb)
                   SELECT count(*) AS duplicates, count(*) FILTER (WHERE tomb) AS tombs FROM gone"""

    def reprocessing(self, topics: int = 1) -> "TypedTarget":
        """This target under ``--reprocess`` (:mod:`kdg.store.reprocess`), refused where it would be wrong;
        ``topics``: how many topics its route reads (a pattern: 2)."""
        check_reprocess(self.mapping, topics)
        return TypedTarget(self.mapping, reprocess=True)

    def write_sql(self, keeping: bool = False, again: bool = False) -> list[str]:
        """The statements writing the staged rows with ``$1 <= seq <= $2`` (the last one's count is rows written);
        ``keeping``: an upsert reads :data:`KEEP` for the columns whose value is kept; ``again``: it leaves out
        the rows claimed before (seqs ``$3``: :func:`kdg.store.reprocess.again_sql` writes them)."""
        m = self.mapping
        target, names = m.table.sql, ", ".join(c.sql for c in m.columns)
        deleting = m.on_tombstone == "delete"
        if m.mode == "upsert":
            return [self._upsert_sql(deleting, keeping, again)]
        insert = (f"INSERT INTO {target} ({names}) SELECT {self._casts('s')} FROM {self.stage} s "
                  f"WHERE s.seq BETWEEN $1 AND $2 AND NOT s.tomb")
        if not deleting:
            return [insert + " ORDER BY s.seq"]
        # rows after a key's last tombstone in the range survive it; everything before is deleted
        later_tomb = (f"SELECT 1 FROM {self.stage} x WHERE x.tomb AND x.seq > s.seq AND x.seq <= $2 AND "
                      + " AND ".join(f"{self._key_cast(k, 'x')} = {self._key_cast(k, 's')}" for k in m.key))
        keys = ", ".join(f"{self._key_cast(k, 's')} AS k{i}" for i, k in enumerate(m.key))
        delete = (f"DELETE FROM {target} t USING (SELECT DISTINCT {keys} FROM {self.stage} s "
                  f"WHERE s.tomb AND s.seq BETWEEN $1 AND $2) d WHERE "
                  + " AND ".join(f"t.{m.column(k).sql} = d.k{i}" for i, k in enumerate(m.key)))
        return [delete, f"{insert} AND NOT EXISTS ({later_tomb}) ORDER BY s.seq"]

    def truncate_sql(self) -> str:
        return f"DELETE FROM {self.mapping.table.sql}"

    def _upsert_sql(self, deleting: bool, keeping: bool = False, again: bool = False) -> str:
        m = self.mapping
        target, names = m.table.sql, ", ".join(c.sql for c in m.columns)
        latest = self.latest_sql(deleting)
        others = [c for c in m.columns if c.name not in m.key]
        # every column a key: a row already there is still this record's row, and counted as written (DO NOTHING
        # would leave it out of the statement's count)
        update = "DO UPDATE SET " + ", ".join(f"{c.sql} = EXCLUDED.{c.sql}" for c in others or m.columns[:1])
        gone = ""
        if deleting:
            gone = (f", gone AS (DELETE FROM {target} t USING latest l WHERE l.tomb AND "
                    + " AND ".join(f"t.{m.column(k).sql} = {self._key_cast(k, 'l')}" for k in m.key) + ")")
        conflict = ", ".join(m.column(k).sql for k in m.key)
        values = ", ".join(self.kept_values()) if keeping else self._casts("l")
        new = " AND l.seq <> ALL($3::integer[])" if again else ""
        return (f"WITH latest AS ({latest}){gone} INSERT INTO {target} ({names}) "
                f"SELECT {values} FROM latest l WHERE NOT l.tomb{new} ON CONFLICT ({conflict}) {update}")

    def latest_sql(self, deleting: bool) -> str:
        """The latest staged row of each key with ``$1 <= seq <= $2`` (in Kafka order)."""
        keys = [self._key_cast(k, "s") for k in self.mapping.key]
        # rows with a NULL key never merge: each stands alone (and fails, or not, on its own)
        guard = f"CASE WHEN {' OR '.join(f's.c{self._index(k)} IS NULL' for k in self.mapping.key)} THEN s.seq END"
        return (f"SELECT DISTINCT ON ({', '.join(keys)}, {guard}) s.* FROM {self.stage} s "
                f"WHERE s.seq BETWEEN $1 AND $2{'' if deleting else ' AND NOT s.tomb'} "
                f"ORDER BY {', '.join(keys)}, {guard}, s.seq DESC")

    def kept_values(self) -> list[str]:
        """:meth:`_casts` of ``latest l``, each column a placeholder may stand in for (:func:`keepable`) taking,
        where :data:`KEEP` lists it for the row, the latest earlier version of the key in the range that has a
        value for it (NULL if that is a delete), else the table's current value."""
        m = self.mapping
        same = " AND ".join(f"{self._key_cast(k, 'x')} = {self._key_cast(k, 'l')}" for k in m.key)
        in_table = " AND ".join(f"t.{m.column(k).sql} = {self._key_cast(k, 'l')}" for k in m.key)
        casts, kept_ones = [], set(keepable(m))
        for i, c in enumerate(m.columns):
            value = c.type.cast(f"l.c{i}")
            if i in kept_ones:
                kept = f"EXISTS (SELECT 1 FROM {KEEP} k WHERE k.seq = {{0}}.seq AND k.col = {i})"
                earlier = (f"FROM {self.stage} x WHERE x.seq < l.seq AND x.seq >= $1 AND {same} AND "
                           f"(x.tomb OR NOT {kept.format('x')})")
                value = (f"CASE WHEN NOT {kept.format('l')} THEN {value} "
                         f"WHEN EXISTS (SELECT 1 {earlier}) THEN (SELECT CASE WHEN x.tomb THEN NULL ELSE "
                         f"{c.type.cast(f'x.c{i}')} END {earlier} ORDER BY x.seq DESC LIMIT 1) "
                         f"ELSE (SELECT t.{c.sql} FROM {m.table.sql} t WHERE {in_table}) END")
            casts.append(value)
        return casts

    def _index(self, name: str) -> int:
        return next(i for i, c in enumerate(self.mapping.columns) if c.name == name)

    def _key_cast(self, name: str, alias: str) -> str:
        return self.mapping.column(name).type.cast(f"{alias}.c{self._index(name)}")

    def _casts(self, alias: str) -> str:
        return ", ".join(c.type.cast(f"{alias}.c{i}") for i, c in enumerate(self.mapping.columns))


@dataclass
class TypedResult:
    """Where each staged row of a batch ended: every one in exactly one of written, superseded, deleted,
    filtered, duplicates and rejected (the records the mapping could not read are ``rows.dead``)."""

    written: int = 0               # rows inserted or updated
    duplicates: int = 0            # exactly-once: rows whose key was claimed before
    outside: int = 0               # exactly-once: rows written without a claim, their key older than the window
    rejected: list = field(default_factory=list)  # (seq, sqlstate, message) of rows Postgres refused
    superseded: int = 0            # an upsert's earlier versions of a key in the batch (or rows a later delete of
    #                                their key in the batch took back): never reach the table as themselves
    deleted: int = 0               # tombstones and change-data-capture deletes applied (on_tombstone = delete)
    filtered: int = 0              # tombstones and deletes left out on purpose (on_tombstone = ignore); heartbeats
    #                                and schema-change events (no rows)
    truncated: int = 0             # truncates applied (counted deleted)
    again: list = field(default_factory=list)  # --reprocess: seqs of the rows claimed before, applied again (each
    #                                then written or superseded, as any row)

    @property
    def reprocessed(self) -> int:
        return len(self.again)

    def account(self, rows: StagedRows, duplicate_tombs: int, deleting: bool) -> "TypedResult":
        """Fill in superseded, deleted and filtered from what was staged, claimed and written."""
        rejected_tombs = sum(1 for seq, *_ in self.rejected if seq in rows.tombs)
        tombs = len(rows.tombs) - duplicate_tombs - rejected_tombs
        values = (rows.count - len(rows.tombs)) - (self.duplicates - duplicate_tombs)
        self.superseded = values - self.written - (len(self.rejected) - rejected_tombs)
        if deleting:
            self.deleted = tombs
        else:
            self.deleted, self.filtered = self.truncated, tombs - self.truncated
        self.filtered += sum(rows.skipped.values())
        return self


async def stage_batch(conn: asyncpg.Connection, target: TypedTarget, rows: StagedRows) -> None:
    """Stage ``rows`` in the target's temp table, in the open transaction. Rows not made yet are made as the
    COPY reads them; the records they could not be made from are then in ``rows.dead``."""
    # a deferred constraint would fail the whole transaction at COMMIT, with no row to blame: check
    # every constraint at its statement, so a refused row is found below like any other
    await conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
    await conn.copy_records_to_table(target.stage, records=rows, columns=target.copy_columns)


async def prepare_batch(conn: asyncpg.Connection, window: Window, rows: StagedRows,
                        also: int | None = None, early: bool = False) -> Claims | None:
    """Exactly-once: the claims of ``rows`` (made) prepared in the open transaction (:func:`prepare_claims`, its
    ``also``, and ``early``: copied in before the locks where they can be), before anything reads the table;
    None when no row is staged."""
    if not rows.count:
        return None
    keyed = rows.claims()
    claims = await prepare_claims(conn, window, keyed[0], also=also, early=keyed if early else None)
    claims.split(keyed)  # (once: write_batch's COPY takes the claims from here)
    return claims


async def write_batch(conn: asyncpg.Connection, target: TypedTarget, rows: StagedRows, *,
                      claims: Claims | None, on_claimed=None) -> TypedResult:
    """Claim (exactly-once: ``claims``, prepared by :func:`~kdg.store.claims.prepare_claims`) and write ``rows``,
    staged by :func:`stage_batch`, in the open transaction. ``on_claimed()``: called once the claims are made,
    before the table is written."""
    result = TypedResult()
    if not rows.count:
        return result
    deleting, duplicate_tombs = target.mapping.on_tombstone == "delete", 0
    if claims is not None:
        window = claims.window
        result.outside = claims.outside
        if not await copy_claims(conn, claims, claims.keyed):
            if target.reprocess:
                result.duplicates, duplicate_tombs, result.again = await conn.fetchrow(
                    reprocess_claim_sql(target, window.sql), *claims.args)
            else:
                result.duplicates, duplicate_tombs = await conn.fetchrow(target.claim_sql(window.sql), *claims.args)
            if result.duplicates == rows.count:
                return result.account(rows, duplicate_tombs, deleting)
    if on_claimed is not None:
        on_claimed()
    if rows.truncates:
        await _truncate(conn, target, rows, result, claims is not None)
    keeping = bool(rows.keeps) and target.mapping.mode == "upsert"
    if keeping:
        await conn.execute(_KEEP_DDL)
        await conn.execute(f"DELETE FROM {KEEP}")  # an earlier part of this transaction's
        await conn.copy_records_to_table(KEEP, records=rows.keeps, columns=("seq", "col"))
    again = (again_sql(target, keeping), result.again) if result.again else None  # --reprocess: rows claimed before
    statements = target.write_sql(keeping, again is not None)
    seqs: list[int] | None = None

    async def attempt(lo: int, hi: int) -> int:
        async with conn.transaction():  # a savepoint: a refused statement takes back only itself
            if again is None:
                status = ""
                for sql in statements:
                    status = await conn.execute(sql, lo, hi)
                return int(status.split()[-1])
            updated = int((await conn.execute(again[0], lo, hi, again[1])).split()[-1])
            return updated + int((await conn.execute(statements[-1], lo, hi, again[1])).split()[-1])

    async def bisect(i: int, j: int) -> None:
        try:
            result.written += await attempt(seqs[i], seqs[j])
        except asyncpg.PostgresError as exc:
            if not _row_error(exc):
                raise
            if i == j:
                result.rejected.append((seqs[i], exc.sqlstate, _message(exc)))
                return
            middle = (i + j) // 2
            await bisect(i, middle)
            await bisect(middle + 1, j)

    try:
        result.written = await attempt(0, _LAST)
    except asyncpg.PostgresError as exc:
        if not _row_error(exc):
            raise
        seqs = [r["seq"] for r in await conn.fetch(f"SELECT seq FROM {target.stage} ORDER BY seq")]
        await bisect(0, len(seqs) - 1)
    return result.account(rows, duplicate_tombs, deleting)


async def _truncate(conn: asyncpg.Connection, target: TypedTarget, rows: StagedRows, result: TypedResult,
                    claimed: bool) -> None:
    """The truncates staged that are not duplicates: the table emptied, and the staged rows before the last one
    dropped (they would have been deleted by it); ``result.truncated`` counts them."""
    if claimed:  # a truncate claimed before was applied then: never again
        live, last = await conn.fetchrow(f"SELECT count(*), max(seq) FROM {target.stage} WHERE seq = ANY($1::integer[])",
                                         rows.truncates)
    else:
        live, last = len(rows.truncates), max(rows.truncates)
    if live:
        result.truncated = live
        await conn.execute(target.truncate_sql())
        await conn.execute(f"DELETE FROM {target.stage} WHERE seq < $1", last)


async def written_rows(conn: asyncpg.Connection, target: TypedTarget, rows: StagedRows, result: TypedResult) -> list:
    """The staged rows a ``--handler`` is given: those this transaction writes. A duplicate (its key claimed
    before; also one ``--reprocess`` applies again) and a row Postgres refused are left out, so the handler's own
    writes apply once per record."""
    kept = rows.kept
    if not result.duplicates and not result.rejected and not result.truncated and not result.again:
        return kept
    alive = {r["seq"] for r in await conn.fetch(f"SELECT seq FROM {target.stage}")}
    alive -= {seq for seq, *_ in result.rejected}
    alive -= set(result.again)  # --reprocess: the handler had them when they were first written
    return [row for row in kept if row[0] in alive]


def _row_error(exc: asyncpg.PostgresError) -> bool:
    state = exc.sqlstate or ""
    return state[:2] in ROW_ERROR_CLASSES or state in ROW_ERROR_STATES


def _message(exc: asyncpg.PostgresError) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    detail = getattr(exc, "detail", None)
    return f"{text} ({detail})" if detail else text
