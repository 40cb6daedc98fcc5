"""`kdg audit`: compare what the producer ledger says was acknowledged (or, without a ledger of the topic, what
the topic holds: :mod:`kdg.audit_topic`) with what reached the sink."""

from datetime import datetime, timezone
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace

from kdg.audit_groups import load_positions, standings
from kdg.audit_topic import FILTERED, LEDGER, PER_RECORD, SOURCE_HEADER, TOPIC, TOPIC_JOIN, TOPIC_NOTE, has_ledger, \
    iter_topic, key_resolver, load_topic, output_key_picker, require_topic
from kdg.errors import UsageError
from kdg.records import GROUP_HEADER, ID_HEADER
from kdg.settings import Connection, table_name
from kdg.sinks import parse_sink
from kdg.sinks.dead_letters import REASON_HEADER, SQLSTATE_HEADER, dlq_topic, reason_class
from kdg.store.claims import CLAIMED_RECORDS

EXAMPLES = 5
# what the producer ledger alone can tell: left out of a report whose truth is the topic
_LEDGER_ONLY = ("acked", "failed", "unexpected", "ledger_horizon")


@dataclass
class AuditReport:
    topic: str
    sink: str
    group: str | None
    truth: str = LEDGER         # what says which records should be in the sink: the producer ledger, or the topic
    records: int | None = None  # truth "topic": records read from the topic (to its end)
    keys: int | None = None     # truth "topic": their distinct keys (as --id-from makes them): the unit counted
    acked: int = 0              # records the producer saw acknowledged (or sent, under acks=0)
    failed: int = 0             # records the producer was told failed
    processed_unique: int = 0   # distinct keys in the sink
    rows: int = 0               # rows in the sink table (of this topic and group, in a kdg-shaped table), or
                                # records in an output topic; duplicates included
    claims: int | None = None   # exactly-once claims (kdg_dedup) of this table and topic; None: not a table
    dead_lettered: int = 0      # distinct keys in the dead-letter topic
    filtered: int = 0           # keys not in the sink that its table's transform filtered out (exactly-once claims
                                # them as filtered): read on purpose, not lost
    lost: int = 0               # acked, neither in the sink nor dead-lettered, and the group's position passed it
    pending: int = 0            # acked, not in the sink yet, at or after the group's position: not read yet
    written_by_other_groups: int = 0  # acked, passed, not written by this group but by another into the same
                                      # table (exactly-once groups share its claims): not lost
    duplicates: int = 0         # rows beyond the first per key
    unexpected: int = 0         # keys in the sink the ledger never acked
    outside_window: int = 0     # keys left out: their ledger row (or claim) expired, or outside --since/--until
    duplicates_beyond_dedup_window: int = 0  # rows beyond the first of keys older than the table's claim horizon:
                                             # exactly-once could no longer recognise them (kdg policy explains)
    positions_of: str | None = None  # the group whose positions tell lost from pending (several, comma-joined,
                                     # when they stand alike; None: no group known, all is lost)
    basis: str = "sink rows"    # what the sink's keys were counted from
    since: str | None = None    # --since/--until: only records the producer recorded in [since, until) (UTC)
    until: str | None = None
    ledger_horizon: str | None = None  # ledger rows recorded before this were dropped (its retention window)
    note: str | None = None     # what that basis can and cannot tell
    pending_by_partition: dict = field(default_factory=dict)
    dead_letter_reasons: dict = field(default_factory=dict)  # {reason without particulars: keys (keyless: records)}
    examples: dict = field(default_factory=dict)

    @property
    def balanced(self) -> bool:
        return self.lost == 0 and self.duplicates == 0 and self.unexpected == 0

    def to_dict(self) -> dict:
        """The report as JSON shows it: without what its truth cannot tell (a topic: nothing is unexpected)."""
        found = asdict(self) | {"balanced": self.balanced}
        if self.truth == TOPIC:
            for name in _LEDGER_ONLY:
                found.pop(name)
                found["examples"].pop(name, None)
        else:
            found.pop("records"), found.pop("keys")
        return found


@dataclass
class GroupAudits:
    """The audits of one topic, one per consumer group that wrote into a sink split per group."""

    reports: list[AuditReport]

    @property
    def balanced(self) -> bool:
        return all(r.balanced for r in self.reports)

    def to_dict(self) -> dict:
        return {"groups": [r.to_dict() for r in self.reports], "balanced": self.balanced}


# Every count is made in Postgres, so an audit of 100M records needs no more client memory than
# one of 100: the ledger, the sink's keys and the dead-lettered keys are joined server-side.
# ``passed``: the group's stored position is past one of the key's acknowledged copies, so a
# missing key is lost; otherwise it is pending. Without known positions ($2 false) all is passed.
# ``outside``: left out of every count. A key with ledger rows, none recorded in [$3, $4) (--since,
# --until), or, counted from claims ($8), missing while older than the table's claim horizon $6 (they expired).
# A key without ledger rows whose row expired with the ledger's window (horizon $5): its time (a
# UUIDv7's) is below the horizon, or it was read from before the ledger's first kept offset.
# ``beyond``: a key written more than once whose time is below that horizon: a duplicate exactly-once
# could no longer recognise (its first claim had expired), counted apart from the duplicates.
_JOIN = """INSERT INTO kdg_audit (k, ok, n, dlq, passed, p, outside, beyond, elsewhere, filtered)
WITH led AS (SELECT l.idempotency_key, bool_or(l.status <> 'failed') AS ok, min(l."partition") AS p,
                    bool_or(l.status <> 'failed' AND CASE WHEN NOT $2 THEN true
                                                          WHEN pos.next_offset IS NULL THEN false
                                                          WHEN l."offset" IS NULL THEN true
                                                          ELSE l."offset" < pos.next_offset END) AS passed,
                    bool_or(($3::timestamptz IS NULL OR l.recorded_at >= $3)
                            AND ($4::timestamptz IS NULL OR l.recorded_at < $4)) AS inside,
                    min(extract(epoch FROM l.recorded_at) * 1000)::bigint AS t
             FROM kdg_ledger_keys l LEFT JOIN kdg_audit_pos pos ON pos."partition" = l."partition"
             WHERE l.topic = $1 GROUP BY l.idempotency_key),
     {per_record},
     arg AS (SELECT $7::text AS sink_arg),  -- typed here, so a got query may use $7 or not
     kept AS (SELECT "partition", min("offset") AS first FROM kdg_ledger
              WHERE $5::bigint IS NOT NULL AND topic = $1 AND "offset" IS NOT NULL GROUP BY "partition"),
     dead AS (SELECT DISTINCT idempotency_key, true AS present FROM kdg_audit_dl),
     {filtered},
     elsewhere AS ({elsewhere})
SELECT idempotency_key, led.ok, got.n, coalesce(dead.present, false), coalesce(led.passed, true), led.p,
       CASE WHEN led.idempotency_key IS NOT NULL
            THEN NOT led.inside OR coalesce($8 AND got.n IS NULL AND coalesce(kdg_key_ms(idempotency_key), led.t) < $6,
                                               false)  -- no horizon yet: nothing expired
            ELSE coalesce(kdg_key_ms(idempotency_key) < $5, false) OR coalesce(got.go < kept.first, false)
                 OR coalesce(to_timestamp(kdg_key_ms(idempotency_key) / 1000.0) < $3, false)
                 OR coalesce(to_timestamp(kdg_key_ms(idempotency_key) / 1000.0) >= $4, false) END,
       coalesce(got.n > 1 AND coalesce(kdg_key_ms(idempotency_key), led.t) < $6, false),
       elsewhere.idempotency_key IS NOT NULL, coalesce(filt.present, false)
FROM led FULL JOIN got USING (idempotency_key) LEFT JOIN dead USING (idempotency_key)
     LEFT JOIN elsewhere USING (idempotency_key) LEFT JOIN kept ON kept."partition" = got.gp
     LEFT JOIN filt USING (idempotency_key)""".replace("{per_record}", PER_RECORD).replace("{filtered}", FILTERED)
# ``elsewhere``: keys another group wrote into the same kdg-shaped table. Exactly-once groups share a table's
# claims, so a group skips (as duplicates) what another wrote first: such a key, passed and not written by
# the audited group, is counted apart, not lost (a group renamed, or two feeding one table)
_ELSEWHERE = """SELECT DISTINCT idempotency_key FROM {table}
                WHERE topic = $1 AND $7::text IS NOT NULL AND consumer_group <> $7"""
_NOWHERE = "SELECT NULL::text AS idempotency_key WHERE false"

# each got query: a key, its rows, and (where known) the partition and offset it was read from
_GOT_PG = """SELECT idempotency_key, count(*) AS n, min("partition") AS gp, min("offset") AS go FROM {table}
             WHERE topic = $1 AND ($7::text IS NULL OR consumer_group = $7) GROUP BY idempotency_key"""
# an output topic's records name the group that wrote them (kdg-group); a record without one counts for every group
_GOT_TOPIC = """SELECT idempotency_key, count(*) AS n, NULL::int AS gp, NULL::bigint AS go FROM kdg_audit_got
                WHERE $7::text IS NULL OR consumer_group IS NULL OR consumer_group = $7 GROUP BY idempotency_key"""
# a user's table (a typed sink): exactly-once claims, else the table's own idempotency_key column
_GOT_CLAIMS = """SELECT idempotency_key, count(*) AS n, min("partition") AS gp, min("offset") AS go FROM kdg_claim_keys
                 WHERE sink_table = $7 AND topic = $1 AND filtered IS NOT TRUE GROUP BY idempotency_key"""
_GOT_KEYED = """SELECT idempotency_key::text, count(*) AS n, NULL::int AS gp, NULL::bigint AS go FROM {table}
                WHERE {where} GROUP BY idempotency_key"""
# both: the column holds every inserted row for good, the claims (while kept) the versions an upsert replaced
_GOT_KEYED_CLAIMS = _GOT_KEYED + """
                UNION ALL
                SELECT d.idempotency_key, 1, min(d."partition"), min(d."offset") FROM kdg_claim_keys d
                WHERE d.sink_table = $7 AND d.topic = $1 AND d.filtered IS NOT TRUE
                  AND NOT EXISTS (SELECT 1 FROM {table} t WHERE t.idempotency_key::text = d.idempotency_key)
                GROUP BY d.idempotency_key"""
# a key with no claims (NULL), or a claim from the audited topic among its claims; an offset key inside a run of
# claims (migration 010) is found by neither, and is its topic's (the one it names)
_OTHER_TOPICS = """coalesce((SELECT bool_or(d.topic = $1) FROM kdg_dedup d
                             WHERE d.sink_table = $7 AND d.idempotency_key = {table}.idempotency_key::text),
                            CASE WHEN {table}.idempotency_key::text ~ '^[A-Za-z0-9._-]+/[0-9]+/[0-9]+$'
                                 THEN split_part({table}.idempotency_key::text, '/', 1) = $1 END, true)"""
_KDG_SHAPE = {"idempotency_key", "consumer_group", "topic"}
CLAIMS_NOTE = ("counted from kdg_dedup: exactly-once claims every key it handled (written, replaced by a later "
               "version, deleted or refused); writes under weaker guarantees leave no claims, and at-least-once "
               "upserts cannot be told apart")
KEYED_CLAIMS_NOTE = ("counted from the table's idempotency_key column, and from kdg_dedup claims for keys the "
                     "column lacks (versions an upsert replaced, deletes, refusals) while those claims are kept")
KEYED_NOTE = ("counted from the table's idempotency_key column: an upsert keeps only the latest version of each "
              "row, so the versions it replaced count as lost and at-least-once upserts cannot be told apart; "
              "audit upsert tables written under exactly-once (kdg_dedup claims)")

# One definition of each discrepancy, for the counts and for the example keys alike.
_EXAMPLES = {"lost": "ok AND n IS NULL AND NOT dlq AND NOT filtered AND passed AND NOT outside AND NOT elsewhere",
             "written_by_other_groups": "ok AND n IS NULL AND NOT dlq AND NOT filtered AND passed AND NOT outside "
                                        "AND elsewhere",
             "pending": "ok AND n IS NULL AND NOT dlq AND NOT filtered AND NOT passed AND NOT outside",
             "duplicated": "n > 1 AND NOT outside AND NOT beyond",
             "duplicated_beyond_dedup_window": "beyond AND NOT outside",
             "unexpected": "n IS NOT NULL AND ok IS NOT TRUE AND NOT outside",
             "outside_window": "outside"}

_TOTALS = f"""SELECT count(*) FILTER (WHERE ok AND NOT outside) AS acked,
                     count(*) FILTER (WHERE NOT ok AND NOT outside) AS failed,
                     count(n) FILTER (WHERE NOT outside) AS processed_unique,
                     coalesce(sum(n) FILTER (WHERE NOT outside), 0)::bigint AS rows,
                     count(*) FILTER (WHERE {_EXAMPLES["lost"]}) AS lost,
                     count(*) FILTER (WHERE {_EXAMPLES["pending"]}) AS pending,
                     count(*) FILTER (WHERE {_EXAMPLES["written_by_other_groups"]}) AS written_by_other_groups,
                     coalesce(sum(n - 1) FILTER (WHERE NOT outside AND NOT beyond), 0)::bigint AS duplicates,
                     coalesce(sum(n - 1) FILTER (WHERE beyond AND NOT outside), 0)::bigint
                         AS duplicates_beyond_dedup_window,
                     count(*) FILTER (WHERE {_EXAMPLES["unexpected"]}) AS unexpected,
                     count(*) FILTER (WHERE outside) AS outside_window,
                     count(*) FILTER (WHERE ok AND n IS NULL AND NOT dlq AND filtered AND NOT outside) AS filtered,
                     (SELECT count(DISTINCT coalesce(idempotency_key, 'at ' || source)) FROM kdg_audit_dl)
                         AS dead_lettered
              FROM kdg_audit"""


def _load_output_keys(store, conn: Connection, out_topic: str, topic: str, resolver) -> None:
    """Stream the keys (``kdg-id``, else as ``resolver`` keys a copied record) and ``kdg-group`` headers of
    output topic ``out_topic`` into temp table ``kdg_audit_got``, a batch at a time; shaped as a kdg sink table
    (``topic`` is the audited one) so the audit tells the groups that wrote into it apart (:mod:`kdg.audit_groups`)."""
    store.execute("CREATE TEMP TABLE kdg_audit_got (idempotency_key text NOT NULL, consumer_group text, topic text)")
    pick = output_key_picker(resolver)
    found_in = (iter_topic_headers(conn.bootstrap_servers, out_topic, conn.extra, (ID_HEADER, GROUP_HEADER))
                if pick is None else iter_topic(conn.bootstrap_servers, out_topic, conn.extra, pick))
    for found in found_in:
        store.copy_rows("kdg_audit_got", [(k, g, topic) for k, g in found if k is not None],
                        ("idempotency_key", "consumer_group", "topic"))


def _load_dead_letters(store, conn: Connection, topic: str) -> None:
    """Stream the dead-letter topic into temp table ``kdg_audit_dead``: each record's key, grouped reason, the
    group that dead-lettered it (``kdg-group``; NULL in dead letters written before it was stamped) and where
    it was read (``kdg-source``: TOPIC/PARTITION/OFFSET; a record whose key could not be read is known by it)."""
    store.execute("CREATE TEMP TABLE kdg_audit_dead (idempotency_key text, reason text NOT NULL, consumer_group text, "
                  "source text)")
    for found in iter_topic_headers(conn.bootstrap_servers, dlq_topic(topic), conn.extra,
                                    (ID_HEADER, REASON_HEADER, SQLSTATE_HEADER, GROUP_HEADER, SOURCE_HEADER)):
        store.copy_rows("kdg_audit_dead", [(key, reason_class(reason, state), group, source)
                                           for key, reason, state, group, source in found],
                        ("idempotency_key", "reason", "consumer_group", "source"))


def _load_filtered(store, table, topic: str) -> None:
    """The keys of ``topic``'s records that ``table``'s transform filtered out (claimed as filtered,
    :mod:`kdg.store.filtered`) into temp table ``kdg_audit_filtered``; none for an output topic (``table`` None)."""
    store.execute("CREATE TEMP TABLE kdg_audit_filtered AS SELECT DISTINCT idempotency_key FROM kdg_claim_keys "
                  "WHERE sink_table = $1 AND topic = $2 AND filtered", table.text if table is not None else None, topic)


def iter_topic_headers(bootstrap: str, topic: str, extra: dict, names: tuple[str, ...]) -> Iterator[list[tuple]]:
    """Yield, per record of ``topic`` (read_committed, beginning to end), a batch at a time, the
    values of the headers ``names`` as text (the last of a repeated name; None when absent)."""
    def pick(msg) -> tuple:
        headers = dict(msg.headers() or [])
        return tuple(_text(headers.get(name)) for name in names)

    return iter_topic(bootstrap, topic, extra, pick)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode(errors="replace").replace("\x00", "\ufffd")  # text holds no NUL


def run_audit(topic: str, conn: Connection, *, sink: str = "postgres", table: str = "kdg_events",
              group: str | None = None, since: datetime | None = None, until: datetime | None = None,
              id_from: str | None = None, envelope: str | None = None,
              value_format: str | None = None) -> AuditReport:
    """One report: of ``group``, or of the one group that consumed ``topic``; several groups are a usage error."""
    audits = run_audits(topic, conn, sink=sink, table=table, group=group, since=since, until=until, id_from=id_from,
                        envelope=envelope, value_format=value_format)
    if len(audits.reports) > 1:
        raise UsageError(f"{len(audits.reports)} groups wrote {topic!r} into the sink "
                         f"({', '.join(r.group for r in audits.reports)}): pass the group to audit one")
    return audits.reports[0]


def run_audits(topic: str, conn: Connection, *, sink: str = "postgres", table: str = "kdg_events",
               group: str | None = None, since: datetime | None = None, until: datetime | None = None,
               id_from: str | None = None, envelope: str | None = None,
               value_format: str | None = None) -> GroupAudits:
    """Audit ``topic`` against the sink: one report, or one per group when several wrote into a kdg-shaped sink.

    The truth is kdg's producer ledger when it holds records of ``topic``; else the topic itself, each
    record keyed as ``--id-from`` (``id_from``, read under ``envelope`` from values in ``value_format``)
    keyed it for the consumer (:mod:`kdg.audit_topic`). A topic neither in Kafka nor in the ledger is a
    :class:`~kdg.errors.UnknownTopic` (exit 2).
    A record missing from the sink is lost only if its group's position passed it, else pending
    (:mod:`kdg.audit_groups` tells whose positions count; it refuses when it cannot tell).
    """
    from kdg.store.pg import Store

    from kdg.kafka.clients import vet_unguarded

    kind, out_topic = parse_sink(sink)
    spelled = table_name(table)  # a malformed name is refused before anything is read
    vet_unguarded(conn.bootstrap_servers, conn.extra)  # a property the audit's readers refuse, refused up front
    resolver = key_resolver(id_from, envelope, value_format, conn.registry)  # a bad --id-from too
    base = AuditReport(topic=topic, sink=sink, group=group, since=since and since.isoformat(),
                       until=until and until.isoformat())
    claims_horizon, identity = None, None
    with Store(conn.pg_dsn) as store:
        ledger_horizon = store.ledger_window().horizon_ms
        if ledger_horizon is not None:
            base.ledger_horizon = datetime.fromtimestamp(ledger_horizon / 1000, timezone.utc).isoformat()
        if not has_ledger(store, topic):
            require_topic(conn.bootstrap_servers, topic, conn.extra)
            base.truth = TOPIC
            base.records, base.keys = load_topic(store, conn.bootstrap_servers, topic, conn.extra, resolver)
        _load_dead_letters(store, conn, topic)
        if kind == "kafka":
            _load_output_keys(store, conn, out_topic, topic, resolver)
            got, sink_arg, rows_table, shown = _GOT_TOPIC, None, "kdg_audit_got", sink
            base.basis = "output topic"
        else:
            identity = store.resolve_table(spelled)  # the key its claims were made under
            if not store.fetchval("SELECT to_regclass($1) IS NOT NULL", identity.sql):
                raise UsageError(f"table {identity.text} does not exist: --table names the table the consumer wrote")
            got, sink_arg, kdg_shaped = _sink_keys(store, identity, topic, base)
            rows_table, shown = identity.sql if kdg_shaped else None, identity.text
            claims_horizon = _claims_horizon(store, identity)
        _load_filtered(store, identity, topic)
        if base.truth == TOPIC:
            base.note = TOPIC_NOTE + (f"; {base.note}" if base.note else "")
            join = TOPIC_JOIN.replace("{tombs}", "false" if rows_table is not None or kind == "kafka" else "true")
        else:
            join = _JOIN
        reports = []
        for standing in standings(store, conn, topic, group, rows_table=rows_table, sink=shown,
                                  from_topic=base.truth == TOPIC):
            report = replace(base, group=standing.rows_of, positions_of=standing.positions_of)
            known = load_positions(store, standing.next_offsets)
            elsewhere = _ELSEWHERE.format(table=rows_table) if rows_table is not None else _NOWHERE
            _count(store, report, standing.group, join.format(got=got, elsewhere=elsewhere), topic, known, since,
                   until, ledger_horizon, claims_horizon, standing.rows_of if rows_table is not None else sink_arg,
                   "kdg_dedup claims" in report.basis)
            if identity is not None:
                _count_table(store, report, identity, topic, rows_table is not None)
            if report.truth == TOPIC and report.processed_unique == 0 and report.rows:
                report.note = (f"none of the sink's keys is a key of the topic's records as --id-from "
                               f"{id_from or '(none)'} makes them: was the consume's --id-from another? {report.note}")
            reports.append(report)
    return GroupAudits(reports)


def _count_table(store, report: AuditReport, table, topic: str, kdg_shaped: bool) -> None:
    """``rows``: the table's own rows, whatever the keys were counted from (of this topic where the table
    tells: a ``topic`` column, else the claims of its ``idempotency_key``s; a kdg-shaped table's of the report's
    group too, if it has one); ``claims``: its exactly-once claims from this topic."""
    if kdg_shaped:
        report.rows = store.fetchval(f"SELECT count(*) FROM {table.sql} WHERE topic = $1 "
                                     "AND ($2::text IS NULL OR consumer_group = $2)", topic, report.group)
    elif "topic" in (columns := _columns(store, table)):
        report.rows = store.fetchval(f"SELECT count(*) FROM {table.sql} WHERE topic = $1", topic)
    elif "idempotency_key" in columns:
        theirs = _OTHER_TOPICS.format(table=table.sql).replace("$7", "$2")
        report.rows = store.fetchval(f"SELECT count(*) FROM {table.sql} WHERE {theirs}", topic, table.text)
    else:
        report.rows = store.fetchval(f"SELECT count(*) FROM {table.sql}")
    report.claims = store.fetchval(f"SELECT coalesce(sum({CLAIMED_RECORDS}), 0)::bigint FROM kdg_dedup "
                                   "WHERE sink_table = $1 AND topic = $2 "
                                   "AND filtered IS NOT TRUE", table.text, topic)


def _count(store, report: AuditReport, group: str | None, join: str, *args) -> None:
    """Run ``join`` with ``args`` (:data:`_JOIN`'s $1…$8) into a fresh ``kdg_audit``; fill ``report``'s counts.

    A record another group dead-lettered is not accounted for by it: the dead letters that count are
    ``group``'s (the one group whose positions count; None: every group's) and those that name no group."""
    store.execute("DROP TABLE IF EXISTS kdg_audit_dl")
    store.execute("CREATE TEMP TABLE kdg_audit_dl AS SELECT idempotency_key, reason, source FROM kdg_audit_dead "
                  "WHERE $1::text IS NULL OR consumer_group IS NULL OR consumer_group = $1", group)
    store.execute("DROP TABLE IF EXISTS kdg_audit")
    store.execute("CREATE TEMP TABLE kdg_audit (k text, ok boolean, n bigint, dlq boolean, passed boolean, p int, "
                  "outside boolean NOT NULL, beyond boolean NOT NULL, elsewhere boolean NOT NULL, "
                  "filtered boolean NOT NULL)")
    store.execute(join, *args)
    for name, value in store.fetch(_TOTALS)[0].items():
        setattr(report, name, value)
    report.dead_letter_reasons = {r["reason"]: r["n"] for r in store.fetch(
        "SELECT reason, count(DISTINCT idempotency_key) + count(*) FILTER (WHERE idempotency_key IS NULL) AS n "
        "FROM kdg_audit_dl GROUP BY reason ORDER BY n DESC, reason")}
    report.pending_by_partition = {r["p"]: r["n"] for r in store.fetch(
        f'SELECT p, count(*) AS n FROM kdg_audit WHERE {_EXAMPLES["pending"]} GROUP BY p ORDER BY p')}
    report.examples = {name: [r["k"] for r in store.fetch(
        f'SELECT k FROM kdg_audit WHERE {where} ORDER BY k COLLATE "C" LIMIT {EXAMPLES}')] for name, where in _EXAMPLES.items()}


def _claims_horizon(store, table) -> int | None:
    """The time below which ``table``'s exactly-once claims were dropped (None: none were, or it has none)."""
    return store.fetchval("SELECT horizon_ms FROM kdg_windows WHERE sink_table = $1", table.text)


def _columns(store, table) -> set[str]:
    """The column names of ``table`` (none when it does not exist)."""
    return {r["attname"] for r in store.fetch(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
        table.sql)}


def _sink_keys(store, table, topic: str, report: AuditReport) -> tuple[str, str | None, bool]:
    """How to count the sink's keys: (SQL, its argument $7, whether the table is shaped like kdg_events).

    A kdg-shaped table's $7 is the group whose rows count (the caller's; None: every row).

    A user's table (a typed sink) is counted from its own ``idempotency_key`` column, which keeps every
    inserted row for good, and from exactly-once claims in ``kdg_dedup`` (expiring with the table's
    window) for the keys the column lacks; from either alone when it has only one; with neither, it
    cannot be audited.
    """
    columns = _columns(store, table)
    if not columns or _KDG_SHAPE <= columns:  # kdg's shape (or no table: Postgres says so)
        return _GOT_PG.format(table=table.sql), None, True
    # (a transform's filtered marks, kept under any guarantee, do not make a table one written under exactly-once)
    claims = store.fetchval("SELECT EXISTS (SELECT 1 FROM kdg_dedup WHERE sink_table = $1 AND topic = $2 "
                            "AND filtered IS NOT TRUE)", table.text, topic)
    # without a topic column, a key claimed from another topic only (two topics feeding one table) is that topic's
    where = "topic = $1" if "topic" in columns else _OTHER_TOPICS.format(table=table.sql)
    if claims and "idempotency_key" in columns:
        report.basis, report.note = "idempotency_key column and kdg_dedup claims", KEYED_CLAIMS_NOTE
        return _GOT_KEYED_CLAIMS.format(table=table.sql, where=where), table.text, False
    if claims:
        report.basis, report.note = "kdg_dedup claims", CLAIMS_NOTE
        return _GOT_CLAIMS, table.text, False
    if "idempotency_key" in columns:
        report.basis, report.note = "idempotency_key column", KEYED_NOTE
        return _GOT_KEYED.format(table=table.sql, where="topic = $1" if "topic" in columns else "true"), None, False
    raise UsageError(f"cannot audit {table.text}: it has no idempotency_key column, and kdg_dedup holds no "
                     f"exactly-once claims for it and topic {topic!r}; at-least-once upserts cannot be told apart. "
                     "Map a column 'idempotency_key text = idempotency_key' to audit it")
