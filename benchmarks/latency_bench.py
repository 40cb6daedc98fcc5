"""The latency part of `make bench`: how long a record takes from `kdg produce` to where `kdg consume` puts it.

For each guarantee (at-most-once, at-least-once, exactly-once) and each sink (Postgres, kafka:OUT), once:

  1. a fresh input topic (3 partitions) and `kdg consume IN -G <fresh group> -g G` started as a subprocess
     into a fresh table (--table) or --sink kafka:OUT (a fresh topic), with kdg's defaults otherwise;
  2. one warm-up record per partition, waited for at the sink, so the group has joined and every partition
     is being read before the clock matters (warm-up records are not counted);
  3. `kdg produce IN -g G --rate R --count R*S --size B --no-ledger`: a steady producer on kdg's own path and
     settings (exactly-once commits a transaction every --txn-interval-ms, kdg's default); no ledger, so the
     producer puts no load on Postgres that a pipeline fed by another producer would not have;
  4. a watcher in this process stamps when each record first becomes visible: for Postgres a poller that
     selects the rows added since its last look (by the sink table's bigserial row_id) every 5 ms — under
     exactly-once each row is then stamped exactly from when the group's kdg_offsets (polled every 5 ms too)
     moved past it, since pipelined batches commit in order but interleave their row_ids — for Kafka
     a read_committed consumer of OUT (fetch.wait.max.ms 10). Both read the record's kdg-seq header (the
     producer's sequence number; kdg consume keeps headers in the row and on the output record). A second
     watcher, a read_committed consumer of IN, stamps when each record became visible there, so each latency
     splits in two on one clock: upstream (produce → in the input topic: the producer's transactions and the
     brokers) and pipeline (input topic → sink: kdg consume's own share);
  5. once the producer is done and the watcher has seen every record sent (or nothing new for 10 s), the
     consumer is stopped with SIGINT and its CPU seconds read (os.wait4; startup and warm-up included). The
     input topic is then read back, at the guarantee's isolation level, for each record's CreateTime: the
     time kdg's producer handed the record to librdkafka.

Before measuring, each pipeline's sustainable rate is found (:func:`sustainable_rate`, unless a rate is given):
the highest rate whose lag stays bounded for 30 s, that is whose last record is seen within BEHIND_S (2 s) of
the producer finishing, with the producer reaching the rate. The measured run then produces at half of it, so
its percentiles are kdg's, not a backlog's.

Latency = first seen − CreateTime, in ms (CreateTime has ms resolution; both clocks are this machine's). It
includes the watcher's own delay: up to one poll period plus the query, or the read_committed fetch.
Under the other guarantees one connection writes batch after batch, so row_id order is commit order; a row
committed with a smaller row_id after the poller moved past it would be counted as missed by the poller.
"""

import asyncio
import bisect
import json
import os
import resource
import sys
import threading
import time
from array import array
from typing import Callable

from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_CREATE_TIME, KafkaError, TopicPartition

from bench_report import BEHIND_S
from common import Child, drop_topic, fresh_topic
from consume_bench import drop_sink, fresh_table

from kdg.guarantees import CommitMode, policy_for
from kdg.kafka.admin import ensure_topic
from kdg.kafka.clients import Role, client_config, new_consumer, new_producer
from kdg.records import ID_HEADER, SEQ_HEADER

GUARANTEES = ("at-most-once", "at-least-once", "exactly-once")
SINKS = ("postgres", "kafka")
PARTITIONS = 3
PG_POLL_S = 0.005
KAFKA_FETCH_WAIT_MS = 10
QUIET_S = 10.0       # after the producer: give up waiting once nothing new was seen for this long
WARM_UP_S = 120.0
SEARCH_SECONDS = 30.0  # each probe of the sustainable-rate search produces this long
SEARCH_FROM, SEARCH_MIN, SEARCH_MAX = 2_000.0, 250.0, 256_000.0  # records/s: the first probe and the bounds
SEARCH_BISECTIONS = 2


class Watcher(threading.Thread):
    """Stamps (time.time()) when each record of the measured run is first seen, by its kdg-seq."""

    def __init__(self, records: int):
        super().__init__(daemon=True)
        self.first_seen = array("d", bytes(8 * records))  # 0.0: not seen yet
        self.seen = 0            # measured records seen, repeats included
        self.distinct = 0
        self.warm = 0            # warm-up records (kdg-seq -1)
        self.foreign = 0         # records with no or an unknown kdg-seq
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def note(self, seq: str | None, now: float) -> None:
        try:
            n = int(seq)
        except (TypeError, ValueError):
            self.foreign += 1
            return
        if n < 0:
            self.warm += 1
        elif n >= len(self.first_seen):
            self.foreign += 1
        else:
            self.seen += 1
            if not self.first_seen[n]:
                self.first_seen[n] = now
                self.distinct += 1

    def run(self) -> None:
        try:
            self.watch()
        except BaseException as exc:  # reported by the run, not lost in a thread
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(60)


class PostgresWatcher(Watcher):
    def __init__(self, dsn: str, table, records: int, offsets_of: tuple[str, str] | None = None):
        super().__init__(records)
        self.dsn, self.table = dsn, table
        self.rows = 0                # every row the poller read, warm-up and repeats included
        self.last_row_id = 0
        self.missed: int | None = None  # rows committed behind the poller's row_id mark, found at the end
        # exactly-once: (group, topic) whose kdg_offsets rows commit with the sink rows; their moves time each row
        self.offsets_of = offsets_of
        self.moves: dict[int, list[tuple[int, float]]] = {}  # partition -> [(next_offset, first seen at)]

    def watch(self) -> None:
        asyncio.run(self._watch())

    async def _watch(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            while await conn.fetchval("SELECT to_regclass($1)::text", self.table.sql) is None:
                if self.stopping.is_set():
                    return
                await asyncio.sleep(0.05)
            # an index scan from the last row_id seen, whatever the plan cache decides: a prepared statement's
            # generic plan (no estimate for $1, a fresh table without statistics) seq-scans the whole sink table,
            # every 5 ms, and took 0.7 of the machine's 2 cores from the pipeline it measures (2026-11-26)
            await conn.execute("SET enable_seqscan = off")
            new_rows = await conn.prepare(f"SELECT row_id, headers->>($2::text) FROM {self.table.sql} "
                                          "WHERE row_id > $1 ORDER BY row_id")
            stored = await conn.prepare('SELECT "partition", next_offset FROM kdg_offsets '
                                        "WHERE consumer_group = $1 AND topic = $2 AND next_offset IS NOT NULL")
            while True:
                stopping = self.stopping.is_set()  # one more look after stop() was asked
                rows = await new_rows.fetch(self.last_row_id, SEQ_HEADER)
                now = time.time()
                for _, seq in rows:
                    self.note(seq, now)
                if rows:
                    self.rows += len(rows)
                    self.last_row_id = rows[-1][0]
                if self.offsets_of is not None:
                    for partition, next_offset in await stored.fetch(*self.offsets_of):
                        moves = self.moves.setdefault(partition, [])
                        if not moves or moves[-1][0] != next_offset:
                            moves.append((next_offset, now))
                if stopping:
                    break
                await asyncio.sleep(PG_POLL_S)
            if self.offsets_of is not None:
                await self._stamp_by_offsets(conn)
            behind = await conn.fetchval(f"SELECT count(*) FROM {self.table.sql} WHERE row_id <= $1",
                                         self.last_row_id)
            self.missed = behind - self.rows
        finally:
            await conn.close()

    async def _stamp_by_offsets(self, conn) -> None:
        """Exactly-once: a row became visible with the transaction that moved its partition's stored offset past
        it. Pipelined batches commit in order but their row_ids interleave, so row_id order is not commit order:
        every row is stamped again, exactly, from the offsets' moves (each polled every PG_POLL_S like the rows)."""
        self.first_seen = array("d", bytes(8 * len(self.first_seen)))
        self.seen = self.distinct = self.warm = self.foreign = self.rows = 0
        ends = {p: [n for n, _ in moves] for p, moves in self.moves.items()}
        now = time.time()
        for partition, offset, seq in await conn.fetch(
                f'SELECT "partition", "offset", headers->>($1::text) FROM {self.table.sql}', SEQ_HEADER):
            i = bisect.bisect_right(ends.get(partition, []), offset)
            self.note(seq, self.moves[partition][i][1] if i < len(ends.get(partition, [])) else now)
            self.rows += 1
        self.last_row_id = await conn.fetchval(f"SELECT coalesce(max(row_id), 0) FROM {self.table.sql}")


class KafkaWatcher(Watcher):
    def __init__(self, bootstrap: str, topic: str, records: int):
        super().__init__(records)
        self.bootstrap, self.topic = bootstrap, topic
        self.missed = 0

    def watch(self) -> None:
        consumer = new_consumer(client_config(Role.READER, self.bootstrap, None, None, **{
            "group.id": "kdg-bench-watch", "isolation.level": "read_committed",
            "fetch.wait.max.ms": KAFKA_FETCH_WAIT_MS}), Role.READER)
        try:
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
            while not self.stopping.is_set():
                msgs = consumer.consume(10_000, 0.05)
                now = time.time()
                for msg in msgs:
                    if msg.error() is None:
                        self.note(_header(msg, SEQ_HEADER), now)
        finally:
            consumer.close()


def _header(msg, name: str) -> str | None:
    for key, value in msg.headers() or ():
        if key == name:
            return value.decode() if value is not None else None
    return None


def create_times(bootstrap: str, topic: str, isolation: str, records: int) -> tuple[array, dict]:
    """CreateTime (ms) of each measured record of ``topic`` by kdg-seq (-1: not in the topic), read at
    ``isolation``; and counts: records read, repeats, timestamps that were not CreateTime."""
    created = array("q", [-1]) * records
    counts = {"read": 0, "repeats": 0, "not_create_time": 0}
    consumer = new_consumer(client_config(Role.READER, bootstrap, None, None, **{
        "group.id": "kdg-bench-index", "isolation.level": isolation, "enable.partition.eof": True}), Role.READER)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        at_end, deadline = set(), time.monotonic() + 300
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition())
                        continue
                    raise RuntimeError(f"reading {topic} back: {msg.error().str()}")
                seq = int(_header(msg, SEQ_HEADER) or -1)
                if not 0 <= seq < records:
                    continue
                kind, ts = msg.timestamp()
                counts["read"] += 1
                counts["not_create_time"] += kind != TIMESTAMP_CREATE_TIME
                if created[seq] >= 0:
                    counts["repeats"] += 1
                    ts = min(ts, created[seq])
                created[seq] = ts
        if len(at_end) < PARTITIONS:
            raise RuntimeError(f"reading {topic} back: not at its end after 300 s")
    finally:
        consumer.close()
    return created, counts


def warm_up(bootstrap: str, topic: str, watcher: Watcher, consumer: Child) -> float:
    """One record per partition (kdg-seq -1), waited for at the sink; seconds it took."""
    started = time.monotonic()
    producer = new_producer(client_config(Role.PRODUCER, bootstrap, None, policy_for("at-least-once")))
    for p in range(PARTITIONS):
        producer.produce(topic, b"warm-up", None, p, headers=[(ID_HEADER, f"bench-warm-{p}"), (SEQ_HEADER, "-1")])
    if producer.flush(30):
        raise RuntimeError("warm-up records were not delivered in 30 s")
    while watcher.warm < PARTITIONS:
        if watcher.error is not None:
            raise RuntimeError(f"watcher failed: {watcher.error!r}")
        if consumer.wait(0):
            raise RuntimeError(f"{' '.join(consumer.cmd[3:5])} exited {consumer.returncode} during warm-up:\n"
                               f"{consumer.output()[1][-3000:]}")
        if time.monotonic() - started > WARM_UP_S:
            raise RuntimeError(f"warm-up records not seen at the sink after {WARM_UP_S:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - started


def drain(watcher: Watcher, expected: int, consumer: Child) -> None:
    """Wait until the watcher has seen ``expected`` records, or nothing new for QUIET_S seconds."""
    last, quiet_since = -1, time.monotonic()
    while watcher.distinct < expected and watcher.error is None:
        if watcher.seen != last:
            last, quiet_since = watcher.seen, time.monotonic()
        elif time.monotonic() - quiet_since > QUIET_S or consumer.wait(0) and time.monotonic() - quiet_since > 2:
            return
        time.sleep(0.05)


def percentiles(values: list[float]) -> dict:
    if not values:
        return {k: None for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")}
    values.sort()
    at = lambda q: round(values[min(len(values) - 1, int(q * len(values)))], 1)  # noqa: E731
    return {"p50_ms": at(0.50), "p95_ms": at(0.95), "p99_ms": at(0.99), "max_ms": round(values[-1], 1)}


def verdict(guarantee: str, sent: int, observed: int, repeats: int, missed_by_watcher: int) -> str:
    """What the counts say about the guarantee: every record sent seen once, or what is off and whether allowed."""
    policy = policy_for(guarantee)
    lost = sent - observed - missed_by_watcher
    notes = []
    if lost > 0:
        notes.append(f"{lost} lost" + (f" (allowed: {guarantee} may lose)" if policy.may_lose
                                       else f" — NOT ALLOWED under {guarantee}"))
    if repeats > 0:
        notes.append(f"{repeats} repeated" + ("" if policy.may_duplicate else f" — NOT ALLOWED under {guarantee}"))
    if missed_by_watcher:
        notes.append(f"{missed_by_watcher} in the sink but missed by the watcher (committed out of row_id order)")
    return "; ".join(notes) or f"all {sent} seen once"


def consume_pipeline(topic: str, group: str, guarantee: str, sink_args: list[str]) -> list[str]:
    """The pipeline measured by default: `kdg consume` with kdg's defaults (an idle timeout as a safety net)."""
    return ["consume", topic, "-G", group, "-g", guarantee, *sink_args, "--idle-timeout", "120", "--json"]


def latency_run(layout, guarantee: str, sink: str, rate: float, seconds: float, size: int, kdg_path: str,
                pipeline: Callable[[str, str, str, list[str]], list[str]] = consume_pipeline) -> dict:
    """One measured run; ``pipeline(topic, group, guarantee, sink_args)`` gives the kdg command that moves the
    records (`kdg consume` by default; benchmarks/spark_stream_bench.py passes `kdg spark-stream`)."""
    records = max(1, int(rate * seconds))
    bootstrap = layout.bootstrap_servers
    topic = fresh_topic("lat-in")
    group = fresh_topic("lat-g")
    ensure_topic(bootstrap, topic, partitions=PARTITIONS)
    table = out_topic = None
    if sink == "postgres":
        table = fresh_table("lat")
        offsets_of = (group, topic) if policy_for(guarantee).commit_mode is CommitMode.IN_SINK_TRANSACTION else None
        watcher, sink_args = PostgresWatcher(layout.pg_dsn, table, records, offsets_of), ["--table", table.text]
    else:
        out_topic = fresh_topic("lat-out")
        ensure_topic(bootstrap, out_topic, partitions=PARTITIONS)
        watcher, sink_args = KafkaWatcher(bootstrap, out_topic, records), ["--sink", f"kafka:{out_topic}"]
    env = {**os.environ, "PYTHONPATH": kdg_path, "KDG_BOOTSTRAP_SERVERS": bootstrap, "KDG_PG_DSN": layout.pg_dsn}
    kdg = [sys.executable, "-P", "-m", "kdg"]
    consumer = producer = None
    me = resource.getrusage(resource.RUSAGE_SELF)  # the watcher's cost, in this process
    started = time.monotonic()
    watcher.start()
    upstream = KafkaWatcher(bootstrap, topic, records)  # the same records, visible in the input topic
    upstream.start()
    try:
        consumer = Child([*kdg, *pipeline(topic, group, guarantee, sink_args)], env)
        warm_s = warm_up(bootstrap, topic, watcher, consumer)
        producer = Child([*kdg, "produce", topic, "-g", guarantee, "--count", str(records), "--rate", str(rate),
                          "--size", str(size), "--no-ledger", "--json"], env)
        produced = json.loads(producer.result()[0])
        producer_done = time.time()
        drain(watcher, produced["sent"] - produced["failed"], consumer)
        consumer.stop()
        watcher.stop()
        upstream.stop()
        watcher_cpu = _cpu_since(me)
        for w in (watcher, upstream):
            if w.error is not None:
                raise RuntimeError(f"watcher failed: {w.error!r}")
        consumer_out, consumer_err = consumer.output()
        created, counts = create_times(bootstrap, topic, policy_for(guarantee).isolation_level, records)
    finally:
        for child in (producer, consumer):
            if child is not None:
                child.stop(grace=10)
        watcher.stop()
        upstream.stop()
        drop_topic(layout, topic)
        if out_topic:
            drop_topic(layout, out_topic)
        if table is not None:
            drop_sink(layout, table, group)
    run_s = time.monotonic() - started
    first_seen, in_topic_seen = watcher.first_seen, upstream.first_seen
    latencies = [first_seen[s] * 1000 - created[s] for s in range(records) if created[s] >= 0 and first_seen[s]]
    # the two stages: produce → visible in the input topic (the producer's and the brokers' share), and from
    # there → visible at the sink (the pipeline's share), each record stamped by both watchers on one clock
    upstream_ms = [in_topic_seen[s] * 1000 - created[s] for s in range(records) if created[s] >= 0 and in_topic_seen[s]]
    pipeline_ms = [(first_seen[s] - in_topic_seen[s]) * 1000 for s in range(records) if first_seen[s] and in_topic_seen[s]]
    in_topic = sum(1 for ts in created if ts >= 0)
    report = _last_report(consumer_out, consumer_err)
    return {"guarantee": guarantee, "sink": "postgres" if sink == "postgres" else "kafka", "kdg": kdg_path,
            "target_rate": rate, "achieved_rate": produced["msgs_per_s"], "sent": produced["sent"],
            "producer_failed": produced["failed"], "in_input_topic": in_topic, "observed": watcher.distinct,
            "repeats_seen": watcher.seen - watcher.distinct, "repeats_in_input": counts["repeats"],
            "missed_by_watcher": watcher.missed or 0, "not_create_time": counts["not_create_time"],
            "measured": len(latencies), **percentiles(latencies),
            "upstream": percentiles(upstream_ms), "pipeline": percentiles(pipeline_ms),
            "verdict": verdict(guarantee, produced["sent"], watcher.distinct, watcher.seen - watcher.distinct,
                               watcher.missed or 0),
            "consumer_cpu_s": round(consumer.usage.cpu_s, 2), "consumer_wall_s": round(consumer.usage.wall_s, 1),
            "consumer_cpu_s_per_m": round(consumer.usage.cpu_s / records * 1e6, 1),
            "consumer_rss_mb": round(consumer.usage.rss_mb, 1), "consumer_batches": report.get("batches"),
            "consumer_exit": consumer.returncode, "consumer_stopped_by": report.get("stopped_by"),
            # > a few seconds: the consumer did not keep up, and latencies grow with the run's length
            "last_seen_after_producer_s": round(max(first_seen) - producer_done, 1),
            "watcher_cpu_s": round(watcher_cpu, 2), "warm_up_s": round(warm_s, 1), "run_wall_s": round(run_s, 1),
            "machine_busy_cores": round(consumer.usage.busy_cores, 2)}


def _last_report(out: str, err: str) -> dict:
    """The pipeline's --json report: its whole stdout (`kdg consume`), or its last line (`kdg spark-stream`
    prints one object per batch before it)."""
    for text in (out, out.strip().rsplit("\n", 1)[-1]):
        try:
            return json.loads(text)
        except ValueError:
            continue
    return {"unreadable": err[-2000:]}


def _cpu_since(before) -> float:
    now = resource.getrusage(resource.RUSAGE_SELF)
    return now.ru_utime + now.ru_stime - before.ru_utime - before.ru_stime


def kdg_defaults() -> dict:
    """The consume and produce defaults that set the pace of a batch (read from this kdg's code)."""
    from kdg.consume import ConsumeRequest
    from kdg.produce import ProduceRequest

    fields = ConsumeRequest.__dataclass_fields__
    return {"consume_batch_size": fields["batch_size"].default,
            # --batch-ms since the pipelined consumer; a fixed 0.5 s poll before it
            "consume_poll_timeout_s": fields["batch_ms"].default / 1000 if "batch_ms" in fields else 0.5,
            "produce_txn_interval_ms": ProduceRequest.__dataclass_fields__["txn_interval_ms"].default,
            "produce_txn_size": ProduceRequest.__dataclass_fields__["txn_size"].default}


def kept_up(result: dict) -> bool:
    """Whether a run's pipeline kept up: its last record seen within BEHIND_S of the producer finishing, the
    producer within 5 % of its target rate, and every record delivered to the input seen."""
    return (result["last_seen_after_producer_s"] <= BEHIND_S and result["achieved_rate"] >= 0.95 * result["target_rate"]
            and result["observed"] + result["missed_by_watcher"] >= result["sent"] - result["producer_failed"])


def sustainable_rate(layout, guarantee: str, sink: str, size: int, kdg_path: str,
                     pipeline: Callable[[str, str, str, list[str]], list[str]] = consume_pipeline) -> tuple[float, list]:
    """The highest rate at which ``pipeline`` keeps up (:func:`kept_up`) for SEARCH_SECONDS, and the probes made.

    From SEARCH_FROM records/s the rate doubles until a probe falls behind (or halves until one keeps up), then
    SEARCH_BISECTIONS bisections narrow it. Each probe is a whole :func:`latency_run` on fresh topics, so one
    backlog never spills into the next probe."""
    probes = []

    def probe(rate: float) -> bool:
        r = latency_run(layout, guarantee, sink, rate, SEARCH_SECONDS, size, kdg_path, pipeline)
        probes.append({"rate": rate, "kept_up": kept_up(r), "achieved_rate": r["achieved_rate"],
                       "last_seen_after_producer_s": r["last_seen_after_producer_s"], "p99_ms": r["p99_ms"]})
        print(f"    probe {guarantee} → {sink} at {rate:,.0f}/s: {'kept up' if probes[-1]['kept_up'] else 'behind'} "
              f"(produced {r['achieved_rate']:,.0f}/s, last seen {r['last_seen_after_producer_s']} s after the "
              f"producer, p99 {r['p99_ms']} ms)", flush=True)
        return probes[-1]["kept_up"]

    good, bad, rate = 0.0, None, SEARCH_FROM
    if probe(rate):
        good, rate = rate, rate * 2
        while rate <= SEARCH_MAX and probe(rate):
            good, rate = rate, rate * 2
        bad = rate if rate <= SEARCH_MAX else None
    else:
        bad, rate = rate, rate / 2
        while rate >= SEARCH_MIN and not probe(rate):
            bad, rate = rate, rate / 2
        good = rate if rate >= SEARCH_MIN else 0.0
    for _ in range(SEARCH_BISECTIONS if good and bad else 0):
        mid = round((good + bad) / 2, -2)
        good, bad = (mid, bad) if probe(mid) else (good, mid)
    return good, probes


def latency_part(layout, rate: float | None, seconds: float, size: int, here: str,
                 baseline: str | None, batch_ms: int | None = None) -> list[dict]:
    """Every guarantee × sink, with the baseline's kdg right after the current one when there is one; at
    ``rate``, or (None) at half the pipeline's sustainable rate, searched for each kdg. ``batch_ms``: `kdg
    consume --batch-ms` in the search and the measured run (None: kdg's default)."""
    pipeline = consume_pipeline if batch_ms is None else (
        lambda topic, group, guarantee, sink_args: [*consume_pipeline(topic, group, guarantee, sink_args),
                                                    "--batch-ms", str(batch_ms)])
    results = []
    for guarantee in GUARANTEES:
        for sink in SINKS:
            for label, path in (("kdg", here), ("baseline", baseline)):
                if path is None:
                    continue
                found, probes = (sustainable_rate(layout, guarantee, sink, size, path, pipeline) if rate is None
                                 else (None, []))
                if rate is None and not found:
                    print(f"  {guarantee} → {sink} ({label}): kept up at no rate from {SEARCH_MIN:,.0f}/s; not measured")
                    continue
                result = latency_run(layout, guarantee, sink, rate or found / 2, seconds, size, path, pipeline)
                result.update(which=label, sustainable_rate=found, search=probes, consume_batch_ms=batch_ms)
                results.append(result)
                print(f"  {guarantee} → {sink} ({label}): p50 {result['p50_ms']} ms, p95 {result['p95_ms']} ms, "
                      f"p99 {result['p99_ms']} ms, max {result['max_ms']} ms at {result['achieved_rate']:,.0f}/s; "
                      f"{result['verdict']}; consumer {result['consumer_cpu_s']} CPU-s", flush=True)
    return results
