"""Producer and consumer throughput of kdg against references measured in the same run.

    .venv/bin/python benchmarks/produce_bench.py [--records N] [--repeat K]

1. `kdg produce --guarantee at-least-once --no-ledger` vs Kafka's own kafka-producer-perf-test
   (org.apache.kafka.tools.ProducerPerformance) with the same producer properties, at 100 B and 1 KB.
2. exactly-once vs at-least-once at 1 KB, 100 ms transactions.
3. `kdg consume` exactly-once into Postgres (rows/s) vs a raw asyncpg COPY of the same rows
   into the same table, and the consumer's peak RSS.
Medians of K runs; ratios are what to compare across machines.
"""

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import fresh_topic, kdg_json, machine, median, stack  # noqa: E402

from kdg.guarantees import policy_for  # noqa: E402
from kdg.kafka.admin import ensure_topic  # noqa: E402
from kdg.kafka.producer import TUNING, producer_config  # noqa: E402
from kdg.stack.jars import java_classpath, require_java  # noqa: E402


def java_perf(layout, topic: str, records: int, size: int) -> float:
    props = producer_config(policy_for("at-least-once"), layout.bootstrap_servers, {}, None)
    # librdkafka-only keys have no Java equivalent; the rest are the same names in both clients
    java_props = {k: v for k, v in props.items() if k not in ("queue.buffering.max.messages",
                                                              "queue.buffering.max.kbytes")}
    java_props["batch.size"] = 1_000_000
    java_props["enable.idempotence"] = "false"
    cmd = [require_java(), "-Xmx512m", "-cp", java_classpath(), "org.apache.kafka.tools.ProducerPerformance",
           "--topic", topic, "--num-records", str(records), "--record-size", str(size), "--throughput", "-1",
           "--producer-props", *[f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in java_props.items()]]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    last = [l for l in out.splitlines() if "records sent" in l][-1]
    return float(re.search(r"([\d.]+) records/sec", last).group(1))


def kdg_produce(layout, topic: str, guarantee: str, records: int, size: int, extra=()) -> float:
    return kdg_json(layout, "produce", topic, "-g", guarantee, "--count", records, "--size", size, "--no-ledger",
                    *extra)["msgs_per_s"]


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
    env = {**os.environ, "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers, "KDG_PG_DSN": layout.pg_dsn}
    proc = subprocess.Popen([sys.executable, "-m", "kdg", "consume", topic, "-G", group, "-g", "exactly-once",
                             "--table", table, "-e", "--batch-size", "10000", "--json"],
                            stdout=subprocess.PIPE, env=env, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    import json

    return json.loads(out), usage.ru_maxrss // 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--consume-records", type=int, default=1_000_000)
    ap.add_argument("--only", default="produce,eos,consume",
                    help="comma-separated parts to run: produce (100 B / 1 KB vs the Java tool), eos, consume")
    args = ap.parse_args()
    parts = {p.strip() for p in args.only.split(",")}
    unknown = parts - {"produce", "eos", "consume"}
    if unknown:
        ap.error(f"--only: unknown part(s) {', '.join(sorted(unknown))}")
    layout = stack()
    print(f"machine: {machine()}; stack: {layout.brokers} brokers on loopback")
    if "produce" in parts:
        for size in (100, 1000):
            n = args.records if size == 100 else args.records // 2
            kdg_runs, java_runs = [], []
            for _ in range(args.repeat):
                t = fresh_topic(f"p{size}")
                ensure_topic(layout.bootstrap_servers, t, partitions=3)
                java_runs.append(java_perf(layout, t, n, size))
                kdg_runs.append(kdg_produce(layout, fresh_topic(f"k{size}"), "at-least-once", n, size))
            print(f"produce {size:>4} B x {n}: kdg at-least-once {median(kdg_runs)} msg/s, "
                  f"kafka-producer-perf-test {median(java_runs)} msg/s, "
                  f"ratio {median(kdg_runs) / median(java_runs):.2f} (runs kdg={kdg_runs} java={java_runs})")
    if "eos" in parts:
        n = args.records // 2
        eos, alo = [], []
        for _ in range(args.repeat):
            alo.append(kdg_produce(layout, fresh_topic("alo"), "at-least-once", n, 1000))
            eos.append(kdg_produce(layout, fresh_topic("eos"), "exactly-once", n, 1000,
                                   ("--txn-interval-ms", 100, "--txn-size", 1_000_000)))
        print(f"produce 1 KB x {n}: exactly-once {median(eos)} msg/s vs at-least-once {median(alo)} msg/s, "
              f"ratio {median(eos) / median(alo):.2f} (runs eos={eos} alo={alo})")
    if "consume" in parts:
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
        print(f"consume exactly-once -> postgres x {report['consumed']}: {median(kdg_rates)} rows/s; "
              f"raw asyncpg COPY {median(copy_rates)} rows/s; ratio {median(kdg_rates) / median(copy_rates):.2f}; "
              f"consumer peak RSS {max(rss)} MB (runs kdg={kdg_rates} copy={copy_rates})")


if __name__ == "__main__":
    main()
