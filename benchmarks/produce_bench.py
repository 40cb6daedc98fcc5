"""Producer and consumer throughput of kdg against references measured in the same run.

    .venv/bin/python benchmarks/produce_bench.py [--records N] [--repeat K] [--only PARTS] [--json PATH]
                                                 [--baseline DIR]

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
  consume  exactly-once → Postgres (rows/s)   vs one asyncpg COPY of the same rows into the same table

N records of 100 B, N/2 of 1 KB; kdg's exactly-once commits every 100 ms (--txn-interval-ms 100).
kafka-producer-perf-test is org.apache.kafka.tools.ProducerPerformance from the stack's own jars, run with
the same java. kdg records carry two headers (kdg-id, kdg-seq) the Java tool does not send.

--baseline DIR runs every kdg measurement a second time with the kdg package in DIR (for instance
`git archive <branch point> | tar -x -C DIR`), interleaved with the current one, so "before" and
"after" share the machine's state; the table then shows both.

Every run also records its process's CPU seconds (all threads) and how many of the machine's cores
were busy while it ran: they tell what bounds a figure. The table is printed and written as JSON
(--json, default benchmarks/results/produce_bench.json).
"""

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import drop_topic, fresh_topic, machine, median, run_measured, stack  # noqa: E402

from kdg.guarantees import policy_for  # noqa: E402
from kdg.kafka.admin import ensure_topic  # noqa: E402
from kdg.kafka.producer import producer_config  # noqa: E402
from kdg.stack.jars import java_classpath, require_java  # noqa: E402

PARTS = ("produce", "eos", "commit", "consume")
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
    return {"rate": float(re.search(r"([\d.]+) records/sec", last).group(1)), **usage.to_dict()}


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
        out, usage = run_measured([sys.executable, "-m", "kdg", *map(str, args)], env)
    finally:
        drop_topic(layout, topic)
        if ledger:
            asyncio.run(_sql(layout.pg_dsn, ("DELETE FROM kdg_ledger WHERE topic = $1", topic),
                             ("DELETE FROM kdg_producer_runs WHERE topic = $1", topic)))
    report = json.loads(out)
    assert report["sent"] == records and report["failed"] == 0, report
    return {"rate": report["msgs_per_s"], "transactions": report["transactions"], **usage.to_dict()}


async def _sql(dsn: str, *statements: tuple) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        for sql, *args in statements:
            await conn.execute(sql, *args)
    finally:
        await conn.close()


async def raw_copy(dsn: str, table: str, rows: list[tuple]) -> float:
    """The reference: one asyncpg COPY of the same rows into a fresh table shaped like kdg's sink."""
    import asyncpg

    await _sql(dsn, (f"CREATE TABLE {table} (LIKE kdg_events INCLUDING DEFAULTS INCLUDING INDEXES)",))
    conn = await asyncpg.connect(dsn)
    try:
        started = time.perf_counter()
        async with conn.transaction():
            await conn.copy_records_to_table(
                table, records=rows,
                columns=["idempotency_key", "consumer_group", "topic", "partition", "offset", "key", "value", "headers"])
        return len(rows) / (time.perf_counter() - started)
    finally:
        await conn.close()


def consume_with_rss(layout, topic: str, group: str, table: str) -> tuple[dict, int]:
    """`kdg consume` exactly-once into a fresh sink table (its keys claimed for the first time)."""
    import subprocess

    env = {**os.environ, "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers, "KDG_PG_DSN": layout.pg_dsn}
    proc = subprocess.Popen([sys.executable, "-m", "kdg", "consume", topic, "-G", group, "-g", "exactly-once",
                             "--table", table, "-e", "--batch-size", "10000", "--json"],
                            stdout=subprocess.PIPE, env=env, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    return json.loads(out), usage.ru_maxrss // 1024


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


# -- repetitions, medians and the table ----------------------------------------------------------
class Measures:
    """Runs of named measurements, repeated in rotated order; medians of each."""

    def __init__(self):
        self.runs: dict[str, list[dict]] = {}

    def repeat(self, repeat: int, measures: dict) -> None:
        names = list(measures)
        for r in range(repeat):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                run = measures[name]()
                self.runs.setdefault(name, []).append(run)
                print(f"  [{r + 1}/{repeat}] {name}: {run['rate']:,.0f}/s  cpu {run['cpu_s']} s over "
                      f"{run['wall_s']} s, machine {run['busy_cores']} cores busy", flush=True)

    def median(self, name: str) -> float:
        return median([run["rate"] for run in self.runs[name]])

    def summary(self, name: str) -> dict:
        runs = self.runs[name]
        return {"median": self.median(name), "runs": [run["rate"] for run in runs],
                "median_cpu_s": round(statistics.median(run["cpu_s"] for run in runs), 2),
                "median_wall_s": round(statistics.median(run["wall_s"] for run in runs), 2),
                "median_busy_cores": round(statistics.median(run["busy_cores"] for run in runs), 2),
                "details": runs}


def row(measures: Measures, what: str, kdg: str, ref: str, ref_label: str, baseline: str | None) -> dict:
    entry = {"what": what, "kdg": measures.summary(kdg), "reference": {"what": ref_label, **measures.summary(ref)}}
    entry["ratio"] = round(measures.median(kdg) / measures.median(ref), 2)
    if baseline:
        before_kdg = f"{kdg} (baseline)"
        # a reference that is itself a kdg run is compared with the baseline's own
        before_ref = f"{ref} (baseline)" if f"{ref} (baseline)" in measures.runs else ref
        entry["baseline"] = {"kdg": measures.summary(before_kdg),
                             "ratio": round(measures.median(before_kdg) / measures.median(before_ref), 2)}
    return entry


def kdg_variants(layout, baseline: str | None, **variants) -> dict:
    """name -> measurement for each kdg variant, and the same with the baseline's kdg when there is one."""
    here = str(Path(__file__).resolve().parent.parent)
    out = {}
    for name, (size, records, guarantee, ledger) in variants.items():
        out[name] = lambda s=size, n=records, g=guarantee, l=ledger: kdg_produce(layout, s, n, g, l, here)
        if baseline:
            out[f"{name} (baseline)"] = (lambda s=size, n=records, g=guarantee, l=ledger:
                                         kdg_produce(layout, s, n, g, l, baseline))
    return out


def kdg_startup(layout, repeat: int) -> dict:
    """What a kdg run costs before its first record: `kdg produce --count 1 --no-ledger`, medians."""
    here = str(Path(__file__).resolve().parent.parent)
    runs = [kdg_produce(layout, 100, 1, "at-least-once", False, here) for _ in range(repeat)]
    return {k: round(statistics.median(r[k] for r in runs), 2) for k in ("cpu_s", "wall_s")}


def print_table(rows: list[dict], baseline: bool, startup: dict) -> None:
    head = "| what | kdg | reference | ratio |" + (" kdg, baseline | ratio, baseline |" if baseline else "")
    print("\n" + head)
    print("|" + "---|" * head.count(" |"))
    for r in rows:
        line = (f"| {r['what']} | {r['kdg']['median']:,.0f} | {r['reference']['what']} "
                f"{r['reference']['median']:,.0f} | {r['ratio']:.2f} |")
        if baseline and "baseline" in r:
            line += f" {r['baseline']['kdg']['median']:,.0f} | {r['baseline']['ratio']:.2f} |"
        print(line)
    print("\nwhat bounds each figure (medians: process CPU seconds / process wall seconds; machine busy cores "
          f"of {os.cpu_count()}); a kdg process spends {startup['cpu_s']} s CPU / {startup['wall_s']} s wall "
          "before its first record (kdg produce --count 1), the Java tool its JVM's start:")
    for r in rows:
        for label, m in (("kdg", r["kdg"]), (r["reference"]["what"], r["reference"])):
            print(f"  {r['what']} — {label}: cpu {m['median_cpu_s']} s / wall {m['median_wall_s']} s, "
                  f"machine {m['median_busy_cores']} cores; runs {m['runs']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=500_000, help="records of 100 B; half as many of 1 KB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--consume-records", type=int, default=1_000_000)
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts to run: {', '.join(PARTS)}")
    ap.add_argument("--baseline", help="a directory holding another kdg package to measure alongside")
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "produce_bench.json"))
    args = ap.parse_args()
    parts = {p.strip() for p in args.only.split(",")}
    if unknown := parts - set(PARTS):
        ap.error(f"--only: unknown part(s) {', '.join(sorted(unknown))}")
    if args.baseline and not (Path(args.baseline) / "kdg" / "__init__.py").exists():
        ap.error(f"--baseline {args.baseline}: no kdg package there")
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
                        "kafka-producer-perf-test", args.baseline))
        rows.append(row(measures, "produce 100 B at-least-once, with the ledger", "ALO 100 B ledger",
                        "ALO 100 B no-ledger", "kdg --no-ledger", args.baseline))
    if "eos" in parts:
        print(f"eos: {big} records of 1 KB, transactions of {TXN_MS} ms")
        measures.repeat(args.repeat, {
            "java 1 KB": lambda: java_perf(layout, 1000, big, "at-least-once"),
            "java 1 KB txn": lambda: java_perf(layout, 1000, big, "exactly-once", txn_ms=TXN_MS),
            **kdg_variants(layout, args.baseline, **{"ALO 1 KB no-ledger": (1000, big, "at-least-once", False),
                                                     "EOS 1 KB no-ledger": (1000, big, "exactly-once", False),
                                                     "EOS 1 KB ledger": (1000, big, "exactly-once", True)})})
        rows.append(row(measures, "produce 1 KB at-least-once, --no-ledger", "ALO 1 KB no-ledger", "java 1 KB",
                        "kafka-producer-perf-test", args.baseline))
        rows.append(row(measures, f"produce 1 KB exactly-once ({TXN_MS} ms txns), --no-ledger", "EOS 1 KB no-ledger",
                        "ALO 1 KB no-ledger", "kdg at-least-once --no-ledger", args.baseline))
        rows.append(row(measures, f"produce 1 KB exactly-once ({TXN_MS} ms txns), --no-ledger", "EOS 1 KB no-ledger",
                        "java 1 KB txn", f"kafka-producer-perf-test --transaction-duration-ms {TXN_MS}",
                        args.baseline))
        rows.append(row(measures, f"produce 1 KB exactly-once ({TXN_MS} ms txns), with the ledger", "EOS 1 KB ledger",
                        "EOS 1 KB no-ledger", "kdg --no-ledger", args.baseline))
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
        rows.append(consume_row(layout, args))
    print_table(rows, bool(args.baseline), startup)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "brokers": layout.brokers, "args": vars(args),
                               "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "kdg_startup": startup,
                               "rows": rows, "runs": measures.runs, "commit_split": splits}, indent=1) + "\n")
    print(f"\nwritten: {out}")


def consume_row(layout, args) -> dict:
    from common import kdg_json

    topic = fresh_topic("consume")
    kdg_json(layout, "produce", topic, "-g", "exactly-once", "--count", args.consume_records, "--size", 100,
             "--txn-size", 100_000)
    rows = [(f"raw-{i}", "bench", topic, i % 3, i, None, b"x" * 100, "{}")
            for i in range(min(args.consume_records, 500_000))]
    kdg_rates, copy_rates, rss = [], [], []
    for _ in range(args.repeat):  # interleaved, so both see the same machine
        sink, ref = (fresh_topic(t).replace("-", "_") for t in ("sink", "copy"))
        report, rss_mb = consume_with_rss(layout, topic, fresh_topic("g"), sink)
        kdg_rates.append(report["msgs_per_s"])
        rss.append(rss_mb)
        copy_rates.append(round(asyncio.run(raw_copy(layout.pg_dsn, ref, rows)), 1))
        asyncio.run(_sql(layout.pg_dsn, (f"DROP TABLE {sink}",), (f"DROP TABLE {ref}",),
                         ("DELETE FROM kdg_dedup WHERE sink_table = $1", sink)))
    drop_topic(layout, topic)
    asyncio.run(_sql(layout.pg_dsn, ("DELETE FROM kdg_ledger WHERE topic = $1", topic),
                     ("DELETE FROM kdg_producer_runs WHERE topic = $1", topic)))
    print(f"consume exactly-once -> postgres x {report['consumed']}: consumer peak RSS {max(rss)} MB")
    nan = {"median_cpu_s": None, "median_wall_s": None, "median_busy_cores": None}
    return {"what": "consume exactly-once → Postgres (rows/s)",
            "kdg": {"median": median(kdg_rates), "runs": kdg_rates, "peak_rss_mb": max(rss), **nan},
            "reference": {"what": "one asyncpg COPY", "median": median(copy_rates), "runs": copy_rates, **nan},
            "ratio": round(median(kdg_rates) / median(copy_rates), 2)}


if __name__ == "__main__":
    main()
