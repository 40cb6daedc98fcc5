"""Does exactly-once cost stay flat as claims pile up? `kdg consume -g exactly-once` with its table's claims
pre-filled with 0, 10 million and 50 million claims, into the generic sink and into a typed table.

    python benchmarks/dedup_bench.py --records 500000 --repeat 3 --fills 0,10000000,50000000

For each fill level and sink: --repeat runs, each of a fresh topic of --records records of 100 B (produced
exactly-once, outside the measurement) into the same table, whose claim table (``kdg_dedup_<n>``) holds
the pre-filled claims: UUIDv7 keys whose times are spread over the table's 7-day window, so they sit in
its ~8 partitions as a week of traffic would (inserted in time order, as traffic arrives). The table's rows are truncated between runs (its claims are
not). Reported: rows/s (median), the ratio to the empty case, the consumer's CPU-s per million rows, and
bytes per claim (the claim table's partitions, heap and indexes, over its claims).

``--key-types N`` also compares the claim key's type on a bare partitioned table like the claim table:
``text`` (today) against ``uuid`` (16 bytes): bytes per claim and the rate of one INSERT of 500k new claims
into N existing ones.

Writes benchmarks/results/dedup_bench.json and docs/dedup_bench.png.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from common import drop_topic, fresh_topic, kdg_json, machine, run_measured, sql, stack

HERE = Path(__file__).resolve().parent
WEEK_MS = 7 * 86_400_000
CHUNK = 2_000_000
# a UUIDv7 in SQL: the time (ms, 48 bits) then random-looking hex from md5 of the row number
V7 = """lpad(to_hex({ms}), 12, '0') AS t, md5({i}::text || '{salt}') AS r"""
V7_TEXT = """substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(r, 1, 3) || '-8' || substr(r, 4, 3) || '-'
             || substr(r, 7, 12)"""


def produce(layout, records: int) -> str:
    topic = fresh_topic("dedup")
    kdg_json(layout, "produce", topic, "-g", "exactly-once", "--count", records, "--size", 100, "--no-ledger")
    return topic


def consume(layout, topic: str, table: str, typed: bool) -> dict:
    env = {**os.environ, "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers, "KDG_PG_DSN": layout.pg_dsn}
    args = ["consume", topic, "-G", fresh_topic("g"), "-g", "exactly-once", "--table", table, "-e",
            "--batch-size", "10000", "--dedup-retention", "7d", "--json"]
    if typed:
        args += ["--column", "id text = idempotency_key", "--column", "part integer = partition",
                 "--column", "off bigint = offset", "--column", "ts timestamptz = timestamp"]
    out, usage = run_measured([sys.executable, "-P", "-m", "kdg", *args], env)
    report = json.loads(out)
    assert report["duplicates_suppressed"] == 0 and report["outside_dedup_window"] == 0, report
    return {"rate": report["msgs_per_s"], "records": report["consumed"], "cpu_s": usage.cpu_s,
            "busy_cores": usage.busy_cores}


TABLES = {"generic": "CREATE TABLE {table} (LIKE kdg_events INCLUDING DEFAULTS INCLUDING INDEXES)",
          "typed": "CREATE TABLE {table} (id text, part integer, off bigint, ts timestamptz)"}


def claim_table(dsn: str, table: str) -> tuple[str, str]:
    identity = sql(dsn, ("SELECT n.nspname || '.' || c.relname AS t FROM pg_class c JOIN pg_namespace n "
                        "ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)", table))[0]["t"]
    return sql(dsn, ("SELECT kdg_claim_table($1) AS r", identity))[0]["r"], identity


def fill(dsn: str, relation: str, identity: str, upto: int, have: int) -> int:
    """Add claims until ``relation`` holds ``upto``, their times spread over the week before now."""
    if have >= upto:
        return have
    now = int(time.time() * 1000)
    for t in range(now - WEEK_MS, now + 1, 3_600_000):  # every partition the week needs, made once
        sql(dsn, ("SELECT kdg_window_part($1, $2)", relation, t))
    start = have
    while have < upto:
        n = min(CHUNK, upto - have)
        started = time.monotonic()
        # in time order, as traffic arrives: each fill spreads its claims evenly over the week
        key = V7.format(ms=f"{now - WEEK_MS} + ((i - {start}) * {WEEK_MS} / {upto - start})::bigint", i="i",
                        salt=relation)
        sql(dsn, (f"""INSERT INTO {relation} (sink_table, idempotency_key, key_ms, topic, "partition", "offset")
                     SELECT $1, {V7_TEXT}, ('x' || t)::bit(48)::bigint, 'prefill', 0, i
                     FROM (SELECT i, {key} FROM generate_series($2::bigint, $3::bigint) AS i) g""",
            identity, have, have + n - 1))
        have += n
        print(f"  {relation}: {have:,} claims ({n / (time.monotonic() - started):,.0f} claims/s)", file=sys.stderr)
    sql(dsn, (f"VACUUM ANALYZE {relation}",))
    return have


def bytes_per_claim(dsn: str, relation: str) -> float | None:
    row = sql(dsn, (f"""SELECT (SELECT count(*) FROM {relation}) AS n,
                             (SELECT sum(pg_total_relation_size(part::regclass)) FROM kdg_window_parts
                              WHERE relation = $1)::bigint AS bytes""", relation))[0]
    return round(row["bytes"] / row["n"], 1) if row["n"] else None


def key_types(dsn: str, existing: int) -> list[dict]:
    """text vs uuid keys: bytes per claim and the rate of adding 500k new claims to ``existing`` ones."""
    results = []
    for kind in ("text", "uuid"):
        name = f"kdg_bench_keys_{kind}"
        sql(dsn, (f"DROP TABLE IF EXISTS {name}",))
        sql(dsn, (f"""CREATE TABLE {name} (sink_table text NOT NULL, idempotency_key {kind} NOT NULL,
                     key_ms bigint NOT NULL, topic text NOT NULL, "partition" int NOT NULL, "offset" bigint NOT NULL,
                     claimed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink_table, idempotency_key, key_ms))
                     PARTITION BY RANGE (key_ms)""",))
        now = int(time.time() * 1000)
        sql(dsn, (f"CREATE TABLE {name}_p PARTITION OF {name} FOR VALUES FROM ({now - WEEK_MS}) TO ({now + WEEK_MS})",))
        insert = f"""INSERT INTO {name} SELECT 'public.bench', ({V7_TEXT})::{kind}, ('x' || t)::bit(48)::bigint,
                     'prefill', 0, i FROM (SELECT i, {{key}} FROM generate_series($1::bigint, $2::bigint) AS i) g"""
        for lo in range(0, existing, CHUNK):
            key = V7.format(ms=f"{now - WEEK_MS} + (i * {WEEK_MS} / {existing})::bigint", i="i", salt=kind)
            sql(dsn, (insert.format(key=key), lo, min(existing, lo + CHUNK) - 1))
        sql(dsn, (f"VACUUM ANALYZE {name}",))
        size = sql(dsn, (f"SELECT pg_total_relation_size('{name}_p') AS b",))[0]["b"]
        key = V7.format(ms=f"{now} + i % 1000", i="i", salt=kind + "new")
        rates = []
        for r in range(3):
            started = time.monotonic()
            sql(dsn, (insert.format(key=key), 10**10 + r * 500_000, 10**10 + (r + 1) * 500_000 - 1))
            rates.append(500_000 / (time.monotonic() - started))
        results.append({"key": kind, "existing": existing, "bytes_per_claim": round(size / existing, 1),
                        "insert_500k_claims_per_s": round(statistics.median(rates))})
        sql(dsn, (f"DROP TABLE {name}",))
    return results


def chart(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for sink, marker in (("generic", "o"), ("typed", "s")):
        mine = [r for r in rows if r["sink"] == sink]
        fills = [r["fill"] / 1e6 for r in mine]
        left.plot(fills, [r["rate"] for r in mine], marker=marker, label=f"{sink} sink")
        right.plot(fills, [r["bytes_per_claim"] or 0 for r in mine], marker=marker, label=f"{sink} sink")
    left.set(xlabel="claims of the table already kept (millions)", ylabel="rows/s (median)",
             title="exactly-once consume as claims pile up")
    left.set_ylim(bottom=0)
    right.set(xlabel="claims kept (millions)", ylabel="bytes per claim (heap + indexes)", title="claim size")
    right.set_ylim(bottom=0)
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fills", default="0,10000000,50000000")
    parser.add_argument("--sinks", default="generic,typed")
    parser.add_argument("--key-types", type=int, default=0, help="existing claims for the key type comparison")
    args = parser.parse_args()
    fills = sorted(int(f) for f in args.fills.split(","))
    layout = stack()
    dsn = layout.pg_dsn
    load = os.getloadavg()
    print(f"machine: {machine()}; load before: {load[0]:.2f}", file=sys.stderr)
    rows = []
    for sink in args.sinks.split(","):
        table = f"bench_dedup_{sink}_{fresh_topic('t').split('-')[-1]}"
        sql(dsn, (TABLES[sink].format(table=table),))
        kdg_json(layout, "db", "maintain", "--table", table, "--dedup-retention", "7d")  # makes its claim table
        relation, identity = claim_table(dsn, table)
        try:
            have = 0
            for level in fills:
                have = fill(dsn, relation, identity, level, have)
                results = []
                for _ in range(args.repeat):
                    topic = produce(layout, args.records)
                    try:
                        results.append(consume(layout, topic, table, sink == "typed"))
                    finally:
                        drop_topic(layout, topic)
                        sql(dsn, (f"TRUNCATE {table}",))
                have += sum(r["records"] for r in results)
                row = {"sink": sink, "fill": level, "claims_after": have,
                       "rate": round(statistics.median(r["rate"] for r in results)), "rates": [r["rate"] for r in results],
                       "cpu_s_per_m": round(statistics.median(r["cpu_s"] / r["records"] * 1e6 for r in results), 1),
                       "busy_cores": round(statistics.median(r["busy_cores"] for r in results), 2),
                       "bytes_per_claim": bytes_per_claim(dsn, relation)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
        finally:  # a failed run leaves no bench table behind
            sql(dsn, (f"DROP TABLE {table}",))
            sql(dsn, ("DELETE FROM kdg_windows WHERE relation = $1", relation))
            sql(dsn, (f"DROP TABLE {relation}",))
    keys = key_types(dsn, args.key_types) if args.key_types else []
    for sink in args.sinks.split(","):
        empty = next(r["rate"] for r in rows if r["sink"] == sink and r["fill"] == fills[0])
        for r in rows:
            if r["sink"] == sink:
                r["ratio_to_empty"] = round(r["rate"] / empty, 3)
    print(f"\n{'sink':8} {'claims kept':>12} {'rows/s':>9} {'× empty':>8} {'CPU-s/M':>8} {'B/claim':>8}")
    for r in rows:
        print(f"{r['sink']:8} {r['fill']:>12,} {r['rate']:>9,} {r['ratio_to_empty']:>8.3f} {r['cpu_s_per_m']:>8} "
              f"{r['bytes_per_claim'] or '-':>8}")
    for k in keys:
        print(f"key {k['key']:5}: {k['bytes_per_claim']} B/claim at {k['existing']:,}; 500k new claims at "
              f"{k['insert_500k_claims_per_s']:,}/s")
    out = {"machine": machine(), "load_before": load, "records": args.records, "repeat": args.repeat,
           "rows": rows, "key_types": keys}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "dedup_bench.json").write_text(json.dumps(out, indent=2))
    chart(HERE.parent / "docs" / "dedup_bench.png", rows)


if __name__ == "__main__":
    main()
