"""`make bench`: kdg's throughput against references measured in the same run, and its end-to-end latency.

    .venv/bin/python benchmarks/produce_bench.py [--records N] [--consume-records N] [--upsert-records N]
        [--repeat K] [--only PARTS] [--baseline DIR] [--latency-rate R] [--latency-seconds S] [--latency-size B]
        [--latency-batch-ms N]
        [--json PATH] [--chart PATH]

Flags (defaults are what `make bench` runs; `make bench BENCH_ARGS="..."` passes more):
  --records N          records of 100 B in the produce part, N/2 of 1 KB in eos and commit (500000)
  --consume-records N  records the consume part reads (1000000)
  --upsert-records N   records the upsert part reads: half as many ids, two versions each (1000000)
  --repeat K           repetitions of the produce, eos, commit, consume and upsert parts; medians are shown (3)
  --only PARTS         comma-separated parts: produce, eos, commit, consume, upsert, latency (all)
  --baseline DIR       a directory holding another kdg package (`git archive <rev> | tar -x -C DIR`): its kdg
                       runs are measured interleaved with this tree's, in every part but commit
  --latency-rate R     records per second of the latency part's steady producer, or auto (the default): half of
                       each pipeline's sustainable rate, searched first (latency_bench.sustainable_rate)
  --latency-seconds S  how long it produces, per guarantee and sink (60)
  --latency-size B     record size in bytes in the latency part (100)
  --latency-batch-ms N `kdg consume --batch-ms N` in the latency part (kdg's default if not given): the aim for
                       exactly-once into Postgres is p99 <= N + 200 ms
  --json PATH          everything measured (benchmarks/results/produce_bench.json)
  --chart PATH         the chart, PNG (docs/bench.png); "" for none

Rows of the table (msg/s; medians of K repetitions; each repetition runs every measurement of its part
once, in an order rotated between repetitions, so drift on a shared machine hits all of them alike):

  produce  100 B at-least-once --no-ledger   vs kafka-producer-perf-test, same producer properties
           100 B at-least-once, ledger        vs the same --no-ledger
  eos      1 KB at-least-once --no-ledger     vs kafka-producer-perf-test
           1 KB exactly-once --no-ledger      vs 1 KB at-least-once --no-ledger
           1 KB exactly-once --no-ledger      vs kafka-producer-perf-test --transactional-id …
                                                 --transaction-duration-ms 100
           1 KB exactly-once, ledger          vs the same --no-ledger
  commit   where an exactly-once commit's time goes: each 100 ms transaction of 1 KB records flushed first,
           then committed (EndTxn, nothing left to flush), timed apart, in this process
  consume  exactly-once → Postgres (rows/s)   vs one asyncpg COPY of the same rows into the same kind of table
           at-least-once → Postgres (rows/s)  vs the same COPY
           exactly-once, --pipeline 0         vs kdg's default, if `kdg consume --help` lists --pipeline
           (benchmarks/consume_bench.py)
  upsert   Connect upsert exactly-once        vs one COPY + one upsert statement of the same final rows
           the same                           vs kdg's at-least-once (issue 48's goal: at least 0.9x)
           the same, CPU per record           vs the bare confluent-kafka loop (CPU-s/M ratio)
           (benchmarks/connect_upsert_bench.py: JsonConverter records into a typed table, upsert on id;
           `make bench-upsert` runs it alone, with steady rates)
  latency  a steady `kdg produce --rate` under each guarantee, `kdg consume` into Postgres and into
           kafka:OUT: p50/p95/p99/max ms from the record's CreateTime until a watcher sees it at the sink,
           the rate achieved, records seen against sent, the consumer's CPU seconds
           (benchmarks/latency_bench.py; one run per guarantee × sink, --repeat does not apply)

N records of 100 B, N/2 of 1 KB; kdg's exactly-once commits every 100 ms (--txn-interval-ms 100).
kafka-producer-perf-test is org.apache.kafka.tools.ProducerPerformance from the stack's own jars, run with
the same java. kdg records carry two headers (kdg-id, kdg-seq) the Java tool does not send.

Every run also records its process's CPU seconds (all threads; per million records in the table), its peak
RSS, how many of the machine's cores were busy while it ran, and in the consume part the Postgres server's
CPU seconds (postmaster and backends): they tell what bounds a figure. The table is printed, written as
JSON with the latency results, and drawn (--chart). The stack is the local one (KDG_STATE_DIR), started if
needed.
"""

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from bench_report import draw_chart, print_latency, print_table  # noqa: E402
from common import drop_topic, fresh_topic, machine, run_measured, sql, stack  # noqa: E402
from connect_upsert_bench import upsert_rows  # noqa: E402
from consume_bench import consume_rows  # noqa: E402
from latency_bench import kdg_defaults, latency_part  # noqa: E402
from measures import BASELINE, Measures, row  # noqa: E402

from kdg.guarantees import policy_for  # noqa: E402
from kdg.kafka.admin import ensure_topic  # noqa: E402
from kdg.kafka.producer import producer_config  # noqa: E402
from kdg.stack.jars import java_classpath, require_java  # noqa: E402

PARTS = ("produce", "eos", "commit", "consume", "upsert", "latency")
TXN_MS = 100
# librdkafka-only keys (and kdg's logging hooks) have no Java equivalent; the rest are the same names in both
_NOT_JAVA = {"queue.buffering.max.messages", "queue.buffering.max.kbytes", "logger", "log_level", "log.queue",
             "bootstrap.servers"}


# -- the measurements ----------------------------------------------------------------------------
def java_perf(layout, size: int, records: int, guarantee: str, txn_ms: int | None = None) -> dict:
    """kafka-producer-perf-test with the producer properties kdg's ``guarantee`` uses (transactional if ``txn_ms``)."""
    topic = fresh_topic(f"java{size}")
    ensure_topic(layout.bootstrap_servers, topic, partitions=3)
    props = producer_config(policy_for(guarantee), layout.bootstrap_servers, {}, "unused")
    java_props = {k: v for k, v in props.items() if k not in _NOT_JAVA and k != "transactional.id"}
    java_props["bootstrap.servers"] = layout.bootstrap_servers
    cmd = [require_java(), "-Xmx512m", "-cp", java_classpath(), "org.apache.kafka.tools.ProducerPerformance",
           "--topic", topic, "--num-records", str(records), "--record-size", str(size), "--throughput", "-1",
           "--producer-props", *[f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in java_props.items()]]
    if txn_ms is not None:
        cmd += ["--transactional-id", f"{topic}-txn", "--transaction-duration-ms", str(txn_ms)]
    try:
        out, usage = run_measured(cmd)
    finally:
        drop_topic(layout, topic)
    last = [line for line in out.splitlines() if "records sent" in line][-1]
    return {"rate": float(re.search(r"([\d.]+) records/sec", last).group(1)), "records": records, **usage.to_dict()}


def kdg_produce(layout, size: int, records: int, guarantee: str, ledger: bool, kdg_path: str) -> dict:
    """`kdg produce --count records --size size` into a fresh topic, with the kdg package found in ``kdg_path``."""
    topic = fresh_topic(f"kdg{size}")
    args = ["produce", topic, "-g", guarantee, "--count", records, "--size", size, "--json"]
    if guarantee == "exactly-once":
        args += ["--txn-interval-ms", TXN_MS, "--txn-size", 1_000_000]
    if not ledger:
        args.append("--no-ledger")
    env = {**os.environ, "PYTHONPATH": kdg_path, "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers,
           "KDG_PG_DSN": layout.pg_dsn}
    try:
        out, usage = run_measured([sys.executable, "-P", "-m", "kdg", *map(str, args)], env)
    finally:
        drop_topic(layout, topic)
        if ledger:
            sql(layout.pg_dsn, ("DELETE FROM kdg_ledger WHERE topic = $1", topic),
                ("DELETE FROM kdg_producer_runs WHERE topic = $1", topic))
    report = json.loads(out)
    assert report["sent"] == records and report["failed"] == 0, report
    return {"rate": report["msgs_per_s"], "records": records, "transactions": report["transactions"],
            **usage.to_dict()}


def commit_split(layout, records: int) -> dict:
    """One exactly-once `run_produce` (1 KB, --no-ledger) whose every commit is a flush, then EndTxn, timed apart.

    A second transactional producer could only overlap the EndTxn with the next transaction's sends: the
    flush must come first, or records of the two transactions could interleave within a partition.
    """
    from kdg import sources
    from kdg.kafka.producer import KdgProducer
    from kdg.produce import ProduceRequest, run_produce
    from kdg.settings import Connection

    spans: dict[str, list[float]] = {"flush": [], "EndTxn": []}
    commit = KdgProducer.commit

    def timed_commit(producer) -> None:
        started = time.perf_counter()
        producer.flush(60)
        flushed = time.perf_counter()
        commit(producer)
        spans["flush"].append(flushed - started)
        spans["EndTxn"].append(time.perf_counter() - flushed)

    KdgProducer.commit = timed_commit
    topic = fresh_topic("split")
    try:
        report = run_produce(ProduceRequest(
            topic=topic, guarantee="exactly-once", ledger=False, txn_size=1_000_000,
            txn_interval_ms=TXN_MS, records=sources.synthetic(records, 1000, None, sources.LineOptions()),
            conn=Connection(bootstrap_servers=layout.bootstrap_servers, pg_dsn=layout.pg_dsn)))
    finally:
        KdgProducer.commit = commit
        drop_topic(layout, topic)
    out = {"msgs_per_s": report.msgs_per_s, "duration_s": report.duration_s, "transactions": report.transactions}
    for name, xs in spans.items():
        xs = sorted(xs)
        out[name] = {"median_ms": round(statistics.median(xs) * 1e3, 1),
                     "p90_ms": round(xs[int(len(xs) * 0.9)] * 1e3, 1),
                     "total_s": round(sum(xs), 2), "share": round(sum(xs) / report.duration_s, 3)}
    return out


# -- the parts -----------------------------------------------------------------------------------
def kdg_variants(layout, baseline: str | None, **variants) -> dict:
    """name -> measurement for each kdg variant, and the same with the baseline's kdg when there is one."""
    out = {}
    for name, (size, records, guarantee, ledger) in variants.items():
        out[name] = lambda s=size, n=records, g=guarantee, l=ledger: kdg_produce(layout, s, n, g, l, HERE)
        if baseline:
            out[name + BASELINE] = (lambda s=size, n=records, g=guarantee, l=ledger:
                                         kdg_produce(layout, s, n, g, l, baseline))
    return out


def kdg_startup(layout, repeat: int) -> dict:
    """What a kdg run costs before its first record: `kdg produce --count 1 --no-ledger`, medians."""
    runs = [kdg_produce(layout, 100, 1, "at-least-once", False, HERE) for _ in range(repeat)]
    return {k: round(statistics.median(r[k] for r in runs), 2) for k in ("cpu_s", "wall_s")}


HERE = str(Path(__file__).resolve().parent.parent)  # the kdg package this tree holds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=500_000, help="records of 100 B; half as many of 1 KB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--consume-records", type=int, default=1_000_000)
    ap.add_argument("--upsert-records", type=int, default=1_000_000)
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts to run: {', '.join(PARTS)}")
    ap.add_argument("--baseline", help="a directory holding another kdg package to measure alongside")
    ap.add_argument("--latency-rate", default="auto",
                    help="records/s of the latency part's producer, or auto: half of each pipeline's sustainable rate")
    ap.add_argument("--latency-seconds", type=float, default=60, help="seconds it produces, per guarantee and sink")
    ap.add_argument("--latency-size", type=int, default=100, help="record size in the latency part")
    ap.add_argument("--latency-batch-ms", type=int, help="kdg consume --batch-ms in the latency part (kdg's default)")
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "produce_bench.json"))
    ap.add_argument("--chart", default=str(Path(__file__).resolve().parent.parent / "docs" / "bench.png"),
                    help='PNG of the ratios and latencies ("" for none)')
    args = ap.parse_args()
    parts = {p.strip() for p in args.only.split(",")}
    if unknown := parts - set(PARTS):
        ap.error(f"--only: unknown part(s) {', '.join(sorted(unknown))}")
    if args.baseline:
        args.baseline = str(Path(args.baseline).resolve())
        if not (Path(args.baseline) / "kdg" / "__init__.py").exists():
            ap.error(f"--baseline {args.baseline}: no kdg package there")
    try:
        args.latency_rate = None if args.latency_rate == "auto" else float(args.latency_rate)
    except ValueError:
        ap.error(f"--latency-rate {args.latency_rate!r}: a number of records/s, or auto")
    if args.latency_batch_ms is not None and args.latency_batch_ms < 1:
        ap.error("--latency-batch-ms must be at least 1")
    if (args.latency_rate is not None and args.latency_rate <= 0) or args.latency_seconds <= 0:
        ap.error("--latency-rate and --latency-seconds must be more than 0")
    layout = stack()
    print(f"machine: {machine()}; stack: {layout.brokers} brokers on loopback")
    measures, rows = Measures(), []
    small, big = args.records, args.records // 2
    startup = kdg_startup(layout, args.repeat)
    if "produce" in parts:
        print(f"produce: {small} records of 100 B")
        measures.repeat(args.repeat, {
            "java 100 B": lambda: java_perf(layout, 100, small, "at-least-once"),
            **kdg_variants(layout, args.baseline, **{"ALO 100 B no-ledger": (100, small, "at-least-once", False),
                                                     "ALO 100 B ledger": (100, small, "at-least-once", True)})})
        rows.append(row(measures, "produce 100 B at-least-once, --no-ledger", "ALO 100 B no-ledger", "java 100 B",
                        "kafka-producer-perf-test"))
        rows.append(row(measures, "produce 100 B at-least-once, with the ledger", "ALO 100 B ledger",
                        "ALO 100 B no-ledger", "kdg --no-ledger"))
    if "eos" in parts:
        print(f"eos: {big} records of 1 KB, transactions of {TXN_MS} ms")
        measures.repeat(args.repeat, {
            "java 1 KB": lambda: java_perf(layout, 1000, big, "at-least-once"),
            "java 1 KB txn": lambda: java_perf(layout, 1000, big, "exactly-once", txn_ms=TXN_MS),
            **kdg_variants(layout, args.baseline, **{"ALO 1 KB no-ledger": (1000, big, "at-least-once", False),
                                                     "EOS 1 KB no-ledger": (1000, big, "exactly-once", False),
                                                     "EOS 1 KB ledger": (1000, big, "exactly-once", True)})})
        rows.append(row(measures, "produce 1 KB at-least-once, --no-ledger", "ALO 1 KB no-ledger", "java 1 KB",
                        "kafka-producer-perf-test"))
        rows.append(row(measures, f"produce 1 KB exactly-once ({TXN_MS} ms txns), --no-ledger", "EOS 1 KB no-ledger",
                        "ALO 1 KB no-ledger", "kdg at-least-once --no-ledger"))
        rows.append(row(measures, f"produce 1 KB exactly-once ({TXN_MS} ms txns), --no-ledger", "EOS 1 KB no-ledger",
                        "java 1 KB txn", f"kafka-producer-perf-test --transaction-duration-ms {TXN_MS}"))
        rows.append(row(measures, f"produce 1 KB exactly-once ({TXN_MS} ms txns), with the ledger", "EOS 1 KB ledger",
                        "EOS 1 KB no-ledger", "kdg --no-ledger"))
    splits = []
    if "commit" in parts:
        print(f"commit: {big} records of 1 KB, exactly-once, {TXN_MS} ms transactions, flush and EndTxn timed apart")
        for r in range(args.repeat):
            splits.append(commit_split(layout, big))
            print(f"  [{r + 1}/{args.repeat}] {splits[-1]['msgs_per_s']:,.0f}/s, {splits[-1]['transactions']} "
                  "transactions; " + "; ".join(f"{k} median {v['median_ms']} ms, p90 {v['p90_ms']} ms, "
                                              f"{v['share']:.0%} of the run"
                                              for k, v in splits[-1].items() if isinstance(v, dict)), flush=True)
    if "consume" in parts:
        rows += consume_rows(layout, measures, args.consume_records, args.repeat, HERE, args.baseline)
    if "upsert" in parts:
        rows += upsert_rows(layout, measures, args.upsert_records, args.repeat, HERE, args.baseline)
    latency = []
    if "latency" in parts:
        shown = "half of each pipeline's sustainable rate" if args.latency_rate is None else \
            f"{args.latency_rate:,.0f} records/s"
        print(f"latency: {shown}, records of {args.latency_size} B for {args.latency_seconds:g} s per guarantee and sink")
        latency = latency_part(layout, args.latency_rate, args.latency_seconds, args.latency_size, HERE,
                               args.baseline, args.latency_batch_ms)
    defaults = kdg_defaults()
    if args.latency_batch_ms is not None:
        defaults["consume_poll_timeout_s"] = args.latency_batch_ms / 1000  # what the latency part ran with
    if rows:
        print_table(rows, startup)
    print_latency(latency, defaults)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    finished = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    out.write_text(json.dumps({"machine": machine(), "brokers": layout.brokers, "args": vars(args),
                               "finished": finished, "kdg_startup": startup, "kdg_defaults": defaults,
                               "rows": rows, "runs": measures.runs, "commit_split": splits, "latency": latency},
                              indent=1) + "\n")
    print(f"\nwritten: {out}")
    if args.chart:
        draw_chart(args.chart, rows, latency, f"kdg bench, {finished[:10]}: {machine()}, {layout.brokers} brokers")
        print(f"chart: {args.chart}")


if __name__ == "__main__":
    main()
