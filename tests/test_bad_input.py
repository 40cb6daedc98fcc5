"""Issue 10: no tracebacks for anything a user can type.

Each row runs the real `kdg` with one bad input and checks what the README promises: the exit code
(2 bad input or a refused property, 5 Kafka or Postgres unreachable, 7 a check found a problem),
one `error:` line naming the problem, no traceback, no password — and nothing written: no record
in a topic the row named, no ledger, sink, claim, stored offset or replay row for it.

Placeholders in a row: ``{new}`` a topic nobody made (fresh per row), ``{src}`` a 1-partition topic
holding 5 records (so a consume or replay that wrongly went ahead would write rows), ``{group}`` a fresh
group, ``{tmp}`` a folder with the bad files.
"""

import asyncio
import subprocess
import uuid
from pathlib import Path

import asyncpg
import pytest

from conftest import as_json
from kdg.errors import UsageError
from kdg.kafka.admin import watermarks
from kdg.kafka.clients import admin_client

SECRET = "SECRETPW"
DEAD_PG = f"postgresql://u:{SECRET}@127.0.0.1:1/db"
DEAD_KAFKA = "127.0.0.1:1"
HANDLERS = {"PYTHONPATH": str(Path(__file__).parent)}
ANSWER_WITHIN_S = 45  # a bad input is answered in seconds; an unreachable server within its timeouts (~10 s)
BRIEF_WAIT = {"KDG_WAIT_TIMEOUT": "2"}  # long-running commands wait for a server at start-up (60 s by default)


def bad(row_id: str, *argv: str, code: int = 2, says: str = "", stdin: str | None = None,
        env: dict | None = None, typer: bool = False, streamed: bool = False):
    """One row: ``kdg ARGV`` exits ``code`` with ``says`` in its error.

    ``typer``: Typer's own usage box, not an ``error:`` line. ``streamed``: stdin is read while
    records are sent, so a bad first line is seen after the run began: the topic exists and an
    empty run (sent 0) is recorded in ``kdg_producer_runs``, but no record and no ledger row.
    """
    return pytest.param(argv, code, says, stdin, env, typer, streamed, id=row_id)



ROWS = [
    # -- produce ---------------------------------------------------------------------------------
    bad("produce-unknown-property", "produce", "{new}", "--count", "3", "-X", "lingerx.ms=5", says="lingerx.ms"),
    bad("produce-mistyped-value", "produce", "{new}", "--count", "3", "-X", "linger.ms=abc", says="linger.ms=abc"),
    bad("produce-malformed-X", "produce", "{new}", "--count", "3", "-X", "novalue", says="novalue"),
    bad("produce-eos-mistyped-value", "produce", "{new}", "-g", "exactly-once", "--count", "3", "-X",
        "linger.ms=abc", says="linger.ms=abc"),  # read before librdkafka, to size the transaction timeout
    bad("produce-eos-acks", "produce", "{new}", "-g", "exactly-once", "--count", "3", "-X", "acks=1", says="acks"),
    bad("produce-eos-idempotence", "produce", "{new}", "-g", "exactly-once", "--count", "3",
        "-X", "enable.idempotence=false", says="enable.idempotence"),
    bad("produce-alo-idempotence-owned", "produce", "{new}", "-g", "at-least-once", "--count", "3",
        "-X", "enable.idempotence=true", says="enable.idempotence"),
    bad("produce-auto-commit", "produce", "{new}", "--count", "3", "-X", "enable.auto.commit=true",
        says="enable.auto.commit"),
    bad("produce-transactional-id", "produce", "{new}", "--count", "3", "-X", "transactional.id=x",
        says="transactional.id"),
    bad("produce-unknown-guarantee", "produce", "{new}", "-g", "twice", "--count", "3", says="twice"),
    bad("produce-not-a-dsn", "produce", "{new}", "--count", "3", "--pg-dsn", "notadsn", says="--pg-dsn"),
    bad("produce-dsn-bad-port", "produce", "{new}", "--count", "3", "--pg-dsn",
        f"postgresql://u:{SECRET}@127.0.0.1:abc/db", says="port"),
    bad("consume-dsn-password-with-hash", "consume", "{new}", "-G", "g", "--pg-dsn",
        f"postgresql://u:{SECRET}#x@127.0.0.1:1/db", says="percent-encode"),  # read as host u, "port" SECRETPW
    bad("produce-dsn-bad-parameter", "produce", "{new}", "--count", "3", "--pg-dsn", f"{DEAD_PG}?sslmode=bogus",
        says="sslmode"),
    bad("produce-pg-unreachable", "produce", "{new}", "--count", "3", "--pg-dsn", DEAD_PG, code=5, env=BRIEF_WAIT,
        says="Postgres"),
    bad("produce-kafka-unreachable", "produce", "{new}", "--count", "3", "-b", DEAD_KAFKA, code=5, env=BRIEF_WAIT,
        says="Kafka"),
    bad("produce-eos-kafka-unreachable", "produce", "{new}", "-g", "exactly-once", "--count", "3", "-b", DEAD_KAFKA,
        code=5, env=BRIEF_WAIT, says="Kafka"),
    bad("produce-missing-file", "produce", "{new}", "--file", "/nonexistent", says="/nonexistent"),
    bad("produce-file-and-count", "produce", "{new}", "--file", "{tmp}/bad.jsonl", "--count", "5", says="--file"),
    bad("produce-topic-name", "produce", "bad topic name", "--count", "3", says="a Kafka topic name"),
    bad("produce-rate-inf", "produce", "{new}", "--count", "5", "--rate", "inf", says="--rate"),
    bad("produce-directory-file", "produce", "{new}", "--file", "{tmp}", says="directory"),
    bad("produce-bad-envelope-file", "produce", "{new}", "--format", "json", "--file", "{tmp}/bad.jsonl",
        says="bad.jsonl:2"),
    bad("produce-binary-file", "produce", "{new}", "--file", "{tmp}/binary.txt", says="UTF-8"),
    bad("produce-bad-envelope-stdin", "produce", "{new}", "--format", "json", stdin="{not json\n", says="<stdin>:1",
        streamed=True),
    bad("produce-no-key-delimiter", "produce", "{new}", "-K", "|", stdin="no delimiter here\n", says="delimiter",
        streamed=True),
    bad("produce-bad-format", "produce", "{new}", "--format", "xml", says="--format"),
    bad("produce-count-0", "produce", "{new}", "--count", "0", says="--count"),
    bad("produce-count-negative", "produce", "{new}", "--count", "-1", says="--count"),
    bad("produce-size-negative", "produce", "{new}", "--count", "3", "--size", "-5", says="--size"),
    bad("produce-rate-0", "produce", "{new}", "--count", "3", "--rate", "0", says="--rate"),
    bad("produce-txn-size-0", "produce", "{new}", "-g", "exactly-once", "--count", "3", "--txn-size", "0",
        says="--txn-size"),
    bad("produce-partitions-0", "produce", "{new}", "--count", "3", "--partitions", "0", says="--partitions"),
    bad("produce-partition-negative", "produce", "{new}", "--count", "3", "-p", "-1", says="-p"),
    bad("produce-bad-header", "produce", "{new}", "--count", "3", "-H", "novalue", says="-H"),
    bad("produce-id-without-seq", "produce", "{new}", "--count", "3", "--id", "order", says="{seq}"),
    bad("produce-id-unknown-field", "produce", "{new}", "--count", "3", "--id", "order-{n}", says="--id"),
    # templates whose keys repeat: exactly-once would keep one record of each key and the audit see nothing amiss
    bad("produce-id-rounded", "produce", "{new}", "--count", "20", "--id", "o-{seq:.0e}", says="one key"),
    bad("produce-id-attribute", "produce", "{new}", "--count", "20", "--id", "o-{seq.imag}", says="one key"),
    bad("produce-count-not-a-number", "produce", "{new}", "--count", "abc", says="Invalid value", typer=True),
    # -- consume ---------------------------------------------------------------------------------
    bad("consume-unknown-property", "consume", "{src}", "-G", "{group}", "-e", "-X", "lingerx.ms=5", says="lingerx.ms"),
    bad("consume-mistyped-value", "consume", "{src}", "-G", "{group}", "-e", "-X", "fetch.max.bytes=abc",
        says="fetch.max.bytes"),
    bad("consume-malformed-X", "consume", "{src}", "-G", "{group}", "-e", "-X", "novalue", says="novalue"),
    bad("consume-eos-read-uncommitted", "consume", "{src}", "-G", "{group}", "-g", "exactly-once", "-e",
        "-X", "isolation.level=read_uncommitted", says="isolation.level"),
    bad("consume-kafka-sink-eos-acks", "consume", "{src}", "-G", "{group}", "-g", "exactly-once", "-e",
        "--sink", "kafka:{new}", "-X", "acks=1", says="acks"),
    bad("consume-auto-commit", "consume", "{src}", "-G", "{group}", "-e", "-X", "enable.auto.commit=true",
        says="enable.auto.commit"),
    bad("consume-transactional-id", "consume", "{src}", "-G", "{group}", "-e", "-X", "transactional.id=x",
        says="transactional.id"),
    bad("consume-unknown-guarantee", "consume", "{src}", "-G", "{group}", "-g", "twice", "-e", says="twice"),
    bad("consume-not-a-dsn", "consume", "{src}", "-G", "{group}", "-e", "--pg-dsn", "notadsn", says="--pg-dsn"),
    bad("consume-pg-unreachable", "consume", "{src}", "-G", "{group}", "-e", "--pg-dsn", DEAD_PG, code=5,
        env=BRIEF_WAIT, says="Postgres"),
    bad("consume-kafka-unreachable", "consume", "{src}", "-G", "{group}", "-e", "-b", DEAD_KAFKA, code=5,
        env=BRIEF_WAIT, says="Kafka"),
    bad("consume-missing-topic", "consume", "{new}", "-G", "{group}", "-e", says="does not exist"),
    bad("consume-table-sql", "consume", "{src}", "-G", "{group}", "-e", "--table", "drop table x",
        says="drop table x"),
    bad("consume-table-digit", "consume", "{src}", "-G", "{group}", "-e", "--table", "1abc", says="1abc"),
    bad("consume-count-0", "consume", "{src}", "-G", "{group}", "-c", "0", says="-c"),
    bad("consume-count-negative", "consume", "{src}", "-G", "{group}", "-c", "-1", says="-c"),
    bad("consume-batch-size-0", "consume", "{src}", "-G", "{group}", "-e", "--batch-size", "0", says="--batch-size"),
    bad("consume-batch-size-over-a-poll", "consume", "{src}", "-G", "{group}", "-e", "--batch-size", "1000001",
        says="--batch-size"),
    bad("consume-empty-table", "consume", "{src}", "-G", "{group}", "-e", "--table", "", says="table ''"),
    bad("consume-shutdown-timeout-inf", "consume", "{src}", "-G", "{group}", "-e", "--shutdown-timeout", "inf",
        says="--shutdown-timeout"),
    bad("consume-shutdown-timeout-nan", "consume", "{src}", "-G", "{group}", "-e", "--shutdown-timeout", "nan",
        says="--shutdown-timeout"),
    bad("consume-keyword-dsn", "consume", "{src}", "-G", "{group}", "-e", "--pg-dsn",
        f"host=127.0.0.1 PASSWORD = {SECRET}", says="--pg-dsn"),
    bad("consume-idle-timeout-negative", "consume", "{src}", "-G", "{group}", "--idle-timeout", "-1",
        says="--idle-timeout"),
    bad("consume-max-bytes-negative", "consume", "{src}", "-G", "{group}", "-e", "--max-bytes", "-1",
        says="--max-bytes"),
    bad("consume-pg-wait-negative", "consume", "{src}", "-G", "{group}", "-e", "--pg-wait", "-1", says="--pg-wait"),
    bad("consume-offset", "consume", "{src}", "-G", "{group}", "-e", "-o", "nonsense", says="nonsense"),
    bad("consume-sink", "consume", "{src}", "-G", "{group}", "-e", "--sink", "nowhere", says="--sink"),
    bad("consume-eos-stdout", "consume", "{src}", "-G", "{group}", "-g", "exactly-once", "-e", "--sink", "stdout",
        says="stdout"),
    bad("consume-id-from", "consume", "{src}", "-G", "{group}", "-e", "--id-from", "json:", says="--id-from"),
    bad("consume-handler-module", "consume", "{src}", "-G", "{group}", "-e", "--handler", "nomodule:fn",
        says="nomodule"),
    bad("consume-handler-no-function", "consume", "{src}", "-G", "{group}", "-e", "--handler",
        "sample_handler:nosuch", env=HANDLERS, says="nosuch"),
    bad("consume-handler-no-colon", "consume", "{src}", "-G", "{group}", "-e", "--handler", "sample_handler",
        env=HANDLERS, says="module:function"),
    bad("consume-empty-group", "consume", "{src}", "-G", "", "-e", says="--group"),
    bad("consume-bad-format", "consume", "{src}", "-G", "{group}", "-e", "--format", "xml", says="--format"),
    bad("consume-misspelled-fault", "consume", "{src}", "-G", "{group}", "-e", env={"KDG_FAULT": "typo"},
        says="KDG_FAULT"),
    bad("consume-no-group", "consume", "{src}", "-e", says="Missing option", typer=True),
    # -- spark-replay ----------------------------------------------------------------------------
    bad("replay-unknown-property", "spark-replay", "{src}", "-G", "{group}", "-X", "lingerx.ms=5", says="lingerx.ms"),
    bad("replay-eos-read-uncommitted", "spark-replay", "{src}", "-G", "{group}", "-g", "exactly-once",
        "-X", "isolation.level=read_uncommitted", says="isolation.level"),
    bad("replay-transactional-id", "spark-replay", "{src}", "-G", "{group}", "-X", "transactional.id=x",
        says="transactional.id"),
    bad("replay-malformed-X", "spark-replay", "{src}", "-G", "{group}", "-X", "novalue", says="novalue"),
    bad("replay-from-offset", "spark-replay", "{src}", "-G", "{group}", "--from", "0:abc", says="--from"),
    bad("replay-from-time", "spark-replay", "{src}", "-G", "{group}", "--from", "@notatime", says="--from"),
    bad("replay-to-partition", "spark-replay", "{src}", "-G", "{group}", "--to", "99:5", says="99"),
    bad("replay-missing-topic", "spark-replay", "{new}", "-G", "{group}", says="does not exist"),
    bad("replay-table-sql", "spark-replay", "{src}", "-G", "{group}", "--table", "drop table x", says="drop table x"),
    bad("replay-table-digit", "spark-replay", "{src}", "-G", "{group}", "--table", "1abc", says="1abc"),
    bad("replay-chunk-rows-0", "spark-replay", "{src}", "-G", "{group}", "--chunk-rows", "0", says="--chunk-rows"),
    bad("replay-task-retries", "spark-replay", "{src}", "-G", "{group}", "--conf", "spark.task.maxFailures=9",
        says="spark.task.maxFailures"),
    bad("replay-malformed-conf", "spark-replay", "{src}", "-G", "{group}", "--conf", "novalue", says="--conf"),
    bad("replay-unknown-guarantee", "spark-replay", "{src}", "-G", "{group}", "-g", "twice", says="twice"),
    bad("replay-id-from", "spark-replay", "{src}", "-G", "{group}", "--id-from", "json:", says="--id-from"),
    bad("replay-empty-group", "spark-replay", "{src}", "-G", " ", says="--group"),
    bad("replay-not-a-dsn", "spark-replay", "{src}", "-G", "{group}", "--pg-dsn", "notadsn", says="--pg-dsn"),
    bad("replay-pg-unreachable", "spark-replay", "{src}", "-G", "{group}", "--pg-dsn", DEAD_PG, code=5,
        env=BRIEF_WAIT, says="Postgres"),
    bad("replay-kafka-unreachable", "spark-replay", "{src}", "-G", "{group}", "-b", DEAD_KAFKA, code=5, env=BRIEF_WAIT,
        says="Kafka"),
    # -- audit -----------------------------------------------------------------------------------
    bad("audit-read-uncommitted", "audit", "{src}", "-X", "isolation.level=read_uncommitted", says="isolation.level"),
    bad("audit-auto-commit", "audit", "{src}", "-X", "enable.auto.commit=true", says="enable.auto.commit"),
    bad("audit-unknown-property", "audit", "{src}", "-X", "lingerx.ms=5", says="lingerx.ms"),
    bad("audit-mistyped-value", "audit", "{src}", "-X", "fetch.max.bytes=abc", says="fetch.max.bytes"),
    bad("audit-transactional-id", "audit", "{src}", "-X", "transactional.id=x", says="transactional.id"),
    bad("audit-no-such-table", "audit", "{src}", "--table", "no_such_table_here", says="does not exist"),
    bad("audit-since-out-of-range", "audit", "{src}", "--since", "99999999999999999", says="--since"),
    bad("audit-malformed-X", "audit", "{src}", "-X", "novalue", says="novalue"),
    bad("audit-sink", "audit", "{src}", "--sink", "nowhere", says="--sink"),
    bad("audit-table-sql", "audit", "{src}", "--table", "drop table x", says="drop table x"),
    bad("audit-not-a-dsn", "audit", "{src}", "--pg-dsn", "notadsn", says="--pg-dsn"),
    bad("audit-pg-unreachable", "audit", "{src}", "--pg-dsn", DEAD_PG, code=5, says="Postgres"),
    bad("audit-kafka-unreachable", "audit", "{src}", "-b", DEAD_KAFKA, code=5, says="Kafka"),
    # -- doctor, policy, stack, chaos ------------------------------------------------------------
    bad("doctor-not-a-dsn", "doctor", "--pg-dsn", "notadsn", says="--pg-dsn"),
    bad("doctor-pg-unreachable", "doctor", "--pg-dsn", DEAD_PG, code=7, says="postgres"),
    bad("doctor-kafka-unreachable", "doctor", "-b", DEAD_KAFKA, code=7, says="brokers"),
    bad("db-migrate-not-a-dsn", "db", "migrate", "--pg-dsn", "notadsn", says="--pg-dsn"),
    bad("db-status-pg-unreachable", "db", "status", "--pg-dsn", DEAD_PG, code=5, says="Postgres"),
    bad("policy-unknown-guarantee", "policy", "twice", says="twice"),
    bad("policy-json-unknown-guarantee", "policy", "--json", "twice", says="twice"),
    bad("policy-misspelled-fault", "policy", env={"KDG_FAULT": "typo"}, says="KDG_FAULT"),
    bad("no-such-command", "nosuch", says="No such command", typer=True),
    bad("stack-status-nothing-there", "stack", "status", "--state-dir", "{tmp}/no-stack", code=7, says="down"),
    bad("stack-up-zero-brokers", "stack", "up", "--brokers", "0", "--state-dir", "{tmp}/no-stack", says="--brokers"),
    bad("stack-kill-no-such-node", "stack", "kill", "99", says="99"),
    bad("chaos-unknown-guarantee", "chaos", "run", "-g", "twice", says="twice"),
    bad("chaos-unknown-fault", "chaos", "run", "--faults", "typo", says="typo"),
    bad("chaos-too-few-messages", "chaos", "run", "-g", "exactly-once", "--faults", "min-isr", "--messages", "5",
        says="--messages"),
    bad("chaos-sink", "chaos", "run", "-g", "exactly-once", "--faults", "min-isr", "--sink", "nowhere", says="--sink"),
    bad("chaos-repeat-0", "chaos", "run", "-g", "exactly-once", "--faults", "min-isr", "--repeat", "0",
        says="--repeat"),
    bad("chaos-report-missing", "chaos", "report", "{tmp}/missing.json", says="no such file"),
    bad("chaos-report-directory", "chaos", "report", "{tmp}", says="not a chaos results file"),
    bad("chaos-report-not-results", "chaos", "report", "{tmp}/bad.jsonl", says="not a chaos results file"),
    bad("chaos-unknown-scenario", "chaos", "scenario", "nosuch", says="nosuch"),
]


@pytest.fixture(scope="module")
def src(session_kdg) -> str:
    """A 1-partition topic with 5 records (no transaction markers) and no ledger: every row must leave it unread."""
    name = f"bad-src-{uuid.uuid4().hex[:8]}"
    session_kdg("produce", name, "-g", "at-least-once", "--count", "5", "--partitions", "1", "--no-ledger")
    return name


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bad-input")
    (folder / "bad.jsonl").write_text('{"value": "fine"}\n{"value": \n')
    (folder / "binary.txt").write_bytes(b"text\n\xff\xfe not utf-8\n")
    return folder


def _fill(arg: str, names: dict[str, str]) -> str:
    for placeholder, value in names.items():
        arg = arg.replace(placeholder, value)
    return arg


def _records(conn, topic: str) -> int:
    """Records in ``topic``, uncommitted ones included; 0 when it does not exist."""
    try:
        ends = watermarks(conn.bootstrap_servers, topic, isolation="read_uncommitted")
    except UsageError:  # no such topic
        return 0
    return sum(high - low for low, high in ends.values())


async def _rows(dsn: str, topics: list[str]) -> dict[str, int]:
    db = await asyncpg.connect(dsn)
    try:
        return dict(await db.fetchrow(
            """SELECT (SELECT count(*) FROM kdg_ledger WHERE topic = ANY($1)) AS ledger,
                      (SELECT count(*) FROM kdg_producer_runs WHERE topic = ANY($1)) AS producer_runs,
                      (SELECT count(*) FROM kdg_events WHERE topic = ANY($1)) AS sink_rows,
                      (SELECT count(*) FROM kdg_dedup WHERE topic = ANY($1)) AS claims,
                      (SELECT count(*) FROM kdg_offsets WHERE topic = ANY($1) AND next_offset IS NOT NULL)
                          AS stored_offsets,
                      (SELECT count(*) FROM kdg_replays WHERE topic = ANY($1)) AS replays""", topics))
    finally:
        await db.close()


def _nothing_written(conn, names: dict[str, str], run_recorded: bool = False) -> None:
    new, src = names["{new}"], names["{src}"]
    existing = admin_client(conn.bootstrap_servers).list_topics(timeout=10).topics  # one look, not one per topic
    kafka = {t: _records(conn, t) for t in (new, f"{new}.dlq", f"{src}.dlq") if t in existing}
    assert not any(kafka.values()), f"records written to Kafka: {kafka}"
    pg = asyncio.run(_rows(conn.pg_dsn, [new, src]))
    if run_recorded:
        assert pg.pop("producer_runs") <= 1
    assert not any(pg.values()), f"rows written to Postgres: {pg}"


def _error_line(stderr: str) -> str:
    """The one `error:` line (rich soft-wraps it: never split, however long)."""
    assert stderr.count("error:") == 1, f"expected exactly one 'error:' in stderr:\n{stderr}"
    return stderr[stderr.index("error:"):].split("\n", 1)[0]


@pytest.mark.parametrize("argv, code, says, stdin, env, typer, streamed", ROWS)
def test_bad_input_is_one_line_a_documented_code_and_writes_nothing(kdg, conn, src, tmp, argv, code, says,
                                                                    stdin, env, typer, streamed):
    names = {"{new}": f"bad-{uuid.uuid4().hex[:10]}", "{src}": src, "{group}": f"g-{uuid.uuid4().hex[:10]}",
             "{tmp}": str(tmp)}
    try:
        proc = kdg(*[_fill(a, names) for a in argv], env=env, check=False, stdin=stdin or "", timeout=ANSWER_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no answer within {ANSWER_WITHIN_S} s")
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert SECRET not in output, output
    assert proc.returncode == code, f"exit {proc.returncode}, want {code}:\n{output}"
    if typer:  # Typer's own usage box for what it parses itself
        assert says in proc.stderr, proc.stderr
    else:
        assert says in _error_line(proc.stderr), proc.stderr
    _nothing_written(conn, names, run_recorded=streamed)


def test_an_unexpected_error_is_one_line_and_its_traceback_is_kept_for_kdg_debug(kdg, conn, src):
    """A bug in a user's handler is no kdg error: one line and exit 1; KDG_DEBUG=1 shows where it happened."""
    group = f"g-{uuid.uuid4().hex[:10]}"
    argv = ("consume", src, "-G", group, "-g", "exactly-once", "-e", "--handler", "sample_handler:explode")
    proc = kdg(*argv, env=HANDLERS, check=False, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    line = _error_line(proc.stderr)
    assert line.startswith("error: unexpected HandlerBug: boom after") and "KDG_DEBUG=1" in line, line
    debug = kdg(*argv, env={**HANDLERS, "KDG_DEBUG": "1"}, check=False, timeout=120)
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "sample_handler.py" in debug.stderr, debug.stderr
    # the handler ran inside the batch's transaction: its failure took the rows and offsets back with it
    pg = asyncio.run(_rows(conn.pg_dsn, [src]))
    assert pg["sink_rows"] == pg["claims"] == pg["stored_offsets"] == 0, pg


@pytest.mark.parametrize("guarantee", ["at-most-once", "at-least-once", "exactly-once"])
def test_empty_stdin_sends_nothing_and_is_no_error(kdg, conn, guarantee):
    """Nothing to send is not a failure (a pipe that produced nothing): exit 0, sent 0."""
    topic = f"bad-{uuid.uuid4().hex[:10]}"
    proc = kdg("produce", topic, "-g", guarantee, "--json", stdin="", check=False)
    assert proc.returncode == 0 and "error:" not in proc.stderr, proc.stderr
    assert as_json(proc)["sent"] == 0
    assert _records(conn, topic) == 0


def test_a_bad_line_mid_stdin_stops_after_what_was_sent_is_in_the_ledger(kdg, conn):
    """Lines read from stdin go out as they come, so a bad one is found after others were sent: those are
    delivered and written to the ledger before kdg stops (they were in Kafka and missing from the ledger, and
    the audit called them unexpected)."""
    topic = f"bad-{uuid.uuid4().hex[:10]}"
    proc = kdg("produce", topic, "-K", "|", stdin="k1|a\nk2|b\nno delimiter\nk3|c\n", check=False)
    assert proc.returncode == 2 and "<stdin>:3: no key delimiter" in proc.stderr, proc.stderr
    assert _records(conn, topic) == 2

    async def acked() -> int:  # kdg_ledger_keys: a key per record, whether the ledger keeps rows or ranges
        db = await asyncpg.connect(conn.pg_dsn)
        try:
            return await db.fetchval("SELECT count(*) FROM kdg_ledger_keys WHERE topic = $1 AND status = 'acked'",
                                     topic)
        finally:
            await db.close()
    assert asyncio.run(acked()) == 2
