"""Typed sink speed: exactly-once upsert of JSON orders into a user's table, against the generic sink and raw COPY.

    python benchmarks/typed_sink_bench.py --records 1000000 --repeat 3 [--json out.json]

One topic of ``--records`` JSON orders (no kdg-id header: both sinks key by ``--id-from json:id``) is
read, in each repetition and in rotated order, by:

- ``generic``: ``kdg consume -g exactly-once`` into a kdg_events-shaped table (key/value as bytea);
- ``typed``: ``kdg consume -g exactly-once --mode upsert`` into ``orders(order_id bigint primary key,
  customer text, amount numeric(12,2), placed_at timestamptz, paid boolean, qty integer)`` through a
  mapping (nested field, number-as-string, ISO time, boolean);
- ``copy``: the reference — the same rows, already typed in Python, COPYed (binary) by asyncpg into a
  fresh table of the same shape in one call: what Postgres alone costs, with no Kafka and no claims.

Each figure is rows/s of the consumer's own loop (its report's ``msgs_per_s``: start-up excluded), with
the consumer's and Postgres's CPU seconds, to say what bounds it. Medians of ``--repeat``; ratios are
taken within one repetition, then their median, so a busy moment on a shared machine hits both sides.
"""

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import drop_sink_tables, drop_topic, fresh_topic, machine, sql, stack  # noqa: E402

COLUMNS = [("order_id", "bigint", "json:id"), ("customer", "text", "json:/customer/name"),
           ("amount", "numeric(12,2)", "json:amount"), ("placed_at", "timestamptz", "json:placed_at"),
           ("paid", "boolean", "json:paid"), ("qty", "integer", "json:qty")]
DDL = ("CREATE TABLE {t} (order_id bigint PRIMARY KEY, customer text, amount numeric(12,2), "
       "placed_at timestamptz, paid boolean, qty integer)")
BASE = datetime(2026, 11, 23, tzinfo=timezone.utc)


def order(i: int) -> tuple[bytes, tuple]:
    """The record's JSON value, and the same order as typed values (for the COPY reference)."""
    at = BASE + timedelta(seconds=i)
    amount = f"{i % 10_000}.{i % 100:02d}"
    value = (f'{{"id": {i}, "customer": {{"name": "c{i % 5000}", "tier": "gold"}}, "amount": "{amount}", '
             f'"placed_at": "{at.isoformat()}", "paid": {"true" if i % 2 else "false"}, "qty": {i % 7}}}')
    return value.encode(), (i, f"c{i % 5000}", Decimal(amount), at, bool(i % 2), i % 7)


def produce(layout, records: int) -> str:
    from confluent_kafka import Producer

    from kdg.kafka.admin import ensure_topic

    topic = fresh_topic("typed")
    ensure_topic(layout.bootstrap_servers, topic, partitions=3)
    producer = Producer({"bootstrap.servers": layout.bootstrap_servers, "linger.ms": 20, "acks": "all",
                         "enable.idempotence": True, "compression.type": "lz4", "log_level": 2})
    for i in range(records):
        while True:
            try:
                producer.produce(topic, order(i)[0], str(i).encode())
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise SystemExit("the benchmark's records were not all acknowledged")
    return topic


def postgres_cpu(layout) -> float:
    """CPU seconds of the stack's Postgres: the postmaster (with its reaped backends) and its live backends."""
    tick = os.sysconf("SC_CLK_TCK")

    def stat(pid) -> list[str]:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

    root = (layout.pg_dir / "data" / "postmaster.pid").read_text().split()[0]
    fields = stat(root)
    total = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            child = stat(pid)
        except OSError:
            continue
        if child[1] == root:
            total += int(child[11]) + int(child[12])
    return total / tick


def consume(layout, topic: str, table: str, args: list[str]) -> dict:
    """Run ``kdg consume`` to the end of the topic; its report plus its own and Postgres's CPU seconds."""
    env = {**os.environ, "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers, "KDG_PG_DSN": layout.pg_dsn}
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    pg_before = postgres_cpu(layout)
    out = subprocess.run([sys.executable, "-P", "-m", "kdg", "consume", topic, "-G", f"bench-{uuid.uuid4().hex[:8]}",
                          "-g", "exactly-once", "-e", "--id-from", "json:id", "--table", table, *args, "--json"],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"kdg consume exited {out.returncode}: {out.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    time.sleep(1)  # the consumer's backend exits with it: let the postmaster reap it (its CPU moves to cutime)
    report = json.loads(out.stdout)
    return {"rows_per_s": report["msgs_per_s"], "seconds": report["duration_s"], "rows": report["consumed"],
            "consumer_cpu_s": round(after.ru_utime + after.ru_stime - before_children.ru_utime
                                    - before_children.ru_stime, 2),
            "postgres_cpu_s": round(postgres_cpu(layout) - pg_before, 2)}


def raw_copy(layout, table: str, records: int) -> dict:
    rows = [order(i)[1] for i in range(records)]

    async def go():
        import asyncpg

        conn = await asyncpg.connect(layout.pg_dsn)
        try:
            started = time.perf_counter()
            await conn.copy_records_to_table(table, records=rows, columns=[c for c, _, _ in COLUMNS])
            return time.perf_counter() - started
        finally:
            await conn.close()

    pg_before = postgres_cpu(layout)
    seconds = asyncio.run(go())
    time.sleep(1)  # as in consume(): the closed connection's backend is reaped first
    return {"rows_per_s": round(records / seconds, 1), "seconds": round(seconds, 3), "rows": records,
            "postgres_cpu_s": round(postgres_cpu(layout) - pg_before, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    layout = stack()
    dsn = layout.pg_dsn
    print(f"producing {args.records:,} JSON orders ...", file=sys.stderr)
    topic = produce(layout, args.records)
    mapping = Path(f"/tmp/kdg-bench-mapping-{uuid.uuid4().hex[:6]}.toml")
    runs: dict[str, list[dict]] = {"generic": [], "typed": [], "copy": []}
    tables: list[str] = []
    kinds = list(runs)
    try:
        for rep in range(args.repeat):
            for kind in kinds[rep % 3:] + kinds[:rep % 3]:  # rotated: no kind always runs first
                table = f"bench_{kind}_{uuid.uuid4().hex[:8]}"
                tables.append(table)
                if kind == "generic":
                    result = consume(layout, topic, table, [])
                elif kind == "typed":
                    sql(dsn, (DDL.format(t=table),))
                    mapping.write_text(f'table = "{table}"\nmode = "upsert"\n[columns]\n' + "".join(
                        f'{c} = {{ type = "{t}", from = "{s}" }}\n' for c, t, s in COLUMNS))
                    result = consume(layout, topic, table, ["--mapping", str(mapping)])
                else:
                    sql(dsn, (DDL.format(t=table),))
                    result = raw_copy(layout, table, args.records)
                if result["rows"] != args.records:
                    raise SystemExit(f"{kind}: {result['rows']} rows, expected {args.records}")
                runs[kind].append(result)
                print(f"rep {rep + 1} {kind:8} {result['rows_per_s']:>10,.0f} rows/s  {result}", file=sys.stderr)
                drop_sink_tables(dsn, [table])
                tables.remove(table)
    finally:
        mapping.unlink(missing_ok=True)
        drop_sink_tables(dsn, tables)
        drop_topic(layout, topic)
    med = {k: statistics.median(r["rows_per_s"] for r in v) for k, v in runs.items()}
    ratio = {name: round(statistics.median(a["rows_per_s"] / b["rows_per_s"] for a, b in zip(runs[x], runs[y])), 3)
             for name, x, y in (("typed/generic", "typed", "generic"), ("typed/copy", "typed", "copy"),
                                ("generic/copy", "generic", "copy"))}
    cpu = {k: {"consumer_cpu_s_per_M": round(statistics.median(r.get("consumer_cpu_s", 0) for r in v)
                                             * 1e6 / args.records, 1),
               "postgres_cpu_s_per_M": round(statistics.median(r["postgres_cpu_s"] for r in v)
                                             * 1e6 / args.records, 1),
               "wall_s": statistics.median(r["seconds"] for r in v)} for k, v in runs.items()}
    print(f"\n{args.records:,} JSON orders, exactly-once, medians of {args.repeat} "
          f"on {machine()})")
    print(f"{'what':10} {'rows/s':>10} {'wall s':>8} {'consumer CPU s/M':>17} {'Postgres CPU s/M':>17}")
    for k in runs:
        print(f"{k:10} {med[k]:>10,.0f} {cpu[k]['wall_s']:>8.1f} {cpu[k]['consumer_cpu_s_per_M']:>17} "
              f"{cpu[k]['postgres_cpu_s_per_M']:>17}")
    print("ratios (median of per-repetition ratios): " + ", ".join(f"{k} {v}" for k, v in ratio.items()))
    if args.json:
        args.json.write_text(json.dumps({"records": args.records, "repeat": args.repeat, "machine": machine(),
                                         "runs": runs, "median_rows_per_s": med, "ratios": ratio, "cpu": cpu},
                                        indent=2, default=str))


if __name__ == "__main__":
    main()
