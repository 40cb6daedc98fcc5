"""What a claim row costs Postgres, by the shape of its table (issue 48: exactly-once's Postgres CPU per record).

Each variant is a plain table of kdg's claim columns (sink_table, idempotency_key, key_ms, topic, partition,
offset, claimed_at, filtered) or a part of them, filled with PRE claims, then given BATCHES batches of 10,000
claims by binary COPY, as ``copy_all_claims`` sends them: offset keys (``topic/partition/offset``) of 6
partitions, each batch 6 runs of consecutive offsets. Measured: the backend's utime+stime from /proc per claim
copied (10 ms ticks: ±0.1 µs at these sizes), the median of ``--repeat`` rounds, the variants interleaved.

    python benchmarks/claim_shape_bench.py [--repeat 3] [--json OUT]

Variants:
- ``kdg``: kdg's claim row and primary key (sink_table, idempotency_key, key_ms);
- ``kdg, C collation``: the same, the text columns ``COLLATE "C"`` (the stack's database is C.UTF-8);
- ``no primary key``: the heap alone, the floor of any claim row;
- ``key without sink_table``: the primary key (idempotency_key, key_ms), as a claim table's leaf partitions could
  hold it (each holds one sink table's claims) if kdg_dedup had no primary key of its own;
- ``key and time only``: a row of (idempotency_key, key_ms) and its primary key;
- ``009: key as bytes``: kdg's claim row since migration 009, ``idempotency_key COLLATE "C"``, sink_table in the
  database's collation, primary key (sink_table, idempotency_key, key_ms);
- ``010: bytes, without sink_table``: the same row, each claim table's primary key (idempotency_key, key_ms)
  (migration 010).
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

PRE, BATCHES, BATCH, PARTITIONS = 400_000, 40, 10_000, 6
TOPIC, SINK, NOW = "bench-topic-0123abcd", "public.bench_u48_0123abcd", 1_795_824_000_123

_ROW = """sink_table text {c} NOT NULL, idempotency_key text {k} NOT NULL, key_ms bigint NOT NULL,
          topic text NOT NULL, "partition" integer NOT NULL, "offset" bigint NOT NULL,
          claimed_at timestamptz NOT NULL DEFAULT now(), filtered boolean"""
_C = 'COLLATE "C"'
_FULL = ("sink_table", "idempotency_key", "key_ms", "topic", "partition", "offset")
VARIANTS = {
    "kdg": (_ROW.format(c="", k="") + ", PRIMARY KEY (sink_table, idempotency_key, key_ms)", _FULL),
    "kdg, C collation": (_ROW.format(c=_C, k=_C) + ", PRIMARY KEY (sink_table, idempotency_key, key_ms)", _FULL),
    "no primary key": (_ROW.format(c="", k=""), _FULL),
    "key without sink_table": (_ROW.format(c="", k="") + ", PRIMARY KEY (idempotency_key, key_ms)", _FULL),
    "key and time only": ("idempotency_key text NOT NULL, key_ms bigint NOT NULL, PRIMARY KEY (idempotency_key, key_ms)",
                          ("idempotency_key", "key_ms")),
    "009: key as bytes": (_ROW.format(c="", k=_C) + ", PRIMARY KEY (sink_table, idempotency_key, key_ms)", _FULL),
    "010: bytes, without sink_table": (_ROW.format(c="", k=_C) + ", PRIMARY KEY (idempotency_key, key_ms)", _FULL),
}


def batch(first: int, columns: tuple) -> list[tuple]:
    """One batch's claims from offset ``first`` of each partition on, partition by partition, as kdg sorts them."""
    per = BATCH // PARTITIONS
    rows = [(SINK, f"{TOPIC}/{p}/{o}", NOW, TOPIC, p, o) for p in range(PARTITIONS) for o in range(first, first + per)]
    if columns == _FULL:
        return rows
    return [(key, ms) for _, key, ms, *_ in rows]


async def one(conn, pid: int, ddl: str, columns: tuple) -> float:
    """µs of backend CPU per claim copied into a fresh table of ``ddl`` holding PRE claims already."""
    await conn.execute("DROP TABLE IF EXISTS kdg_bench_claims")
    await conn.execute(f"CREATE TABLE kdg_bench_claims ({ddl})")
    per = BATCH // PARTITIONS
    first = 0
    while first * PARTITIONS < PRE:
        await conn.copy_records_to_table("kdg_bench_claims", records=batch(first, columns), columns=columns)
        first += per
    await conn.execute("CHECKPOINT")
    spent = 0.0
    for _ in range(BATCHES):
        rows = batch(first, columns)
        before = common.cpu_s(pid)
        await conn.copy_records_to_table("kdg_bench_claims", records=rows, columns=columns)
        spent += common.cpu_s(pid) - before
        first += per
    return spent / (BATCHES * per * PARTITIONS) * 1e6


async def measure(dsn: str, repeat: int) -> dict:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        collation = await conn.fetchval("SELECT datcollate FROM pg_database WHERE datname = current_database()")
        rounds: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(repeat):
            for name, (ddl, columns) in VARIANTS.items():
                rounds[name].append(await one(conn, pid, ddl, columns))
        await conn.execute("DROP TABLE IF EXISTS kdg_bench_claims")
        return {"collation": collation, "server": await conn.fetchval("SHOW server_version"), "rounds": rounds}
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    layout = common.stack()
    found = asyncio.run(measure(layout.pg_dsn, args.repeat))
    found["load_1min"] = os.getloadavg()[0]
    found["median_us_per_claim"] = {name: statistics.median(v) for name, v in found["rounds"].items()}
    print(f"PostgreSQL {found['server']}, database collation {found['collation']}, {PRE:,} claims before, "
          f"{BATCHES} batches of {BATCH:,}; load {found['load_1min']:.2f}")
    base = found["median_us_per_claim"]["kdg"]
    for name, rounds in found["rounds"].items():
        med = found["median_us_per_claim"][name]
        print(f"{name:24s} {med:5.2f} µs/claim ({med / base:4.2f}× kdg)   rounds: "
              + " ".join(f"{r:.2f}" for r in rounds))
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
