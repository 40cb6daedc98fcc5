"""The consume part of `make bench`: `kdg consume` → Postgres against one asyncpg COPY of the same rows.

Rows (rows/s; medians of --repeat, measurements interleaved in rotated order):

  consume exactly-once → Postgres      vs one asyncpg COPY of the same rows into a table shaped like kdg's sink
  consume at-least-once → Postgres     vs the same COPY
  consume exactly-once, --pipeline 0   vs kdg's default pipelining — only if `kdg consume --help` lists
                                          --pipeline (0: each batch written before the next is polled)
  consume exactly-once, CPU per record vs the floor: a bare confluent-kafka loop with the same client settings
                                          that reads every message's fields and finds its kdg-id
                                          (benchmarks/floor_loop.py); this row's ratio is of CPU-s per
                                          million records, kdg's over the floor's (lower is better)
  consume exactly-once, 3 topics      vs the same consume of one topic: the same records split over 3 topics into
                                          3 tables by a --table template, one transaction per batch across
                                          them (issue 45's goal: at least 0.9x) — only if `kdg consume --help`
                                          lists --topic-pattern
  consume exactly-once, a trivial     a typed route (JSON orders through a mapping, upsert) with `--transform` of a function that
  transform                               returns its input, against the same route without one; the ratio is of
                                          consumer CPU-s per million records, and their difference is the
                                          transform's cost per record (issue 46's budget: 1 µs) — only if `kdg
                                          consume --help` lists --transform
  the same, start-up excluded         each process's CPU for a 3-record topic (start-up: imports, connections,
                                          the group join) taken off before dividing by the records: the
                                          CPU per record of a pipeline that runs for long

Every run also gives CPU seconds per million rows: the consumer's own process (all threads, startup
included; the COPY's is this process's asyncpg work) and the Postgres server's (the postmaster, the backends
it reaped and its live children, from /proc). With --baseline the kdg rows run again with that kdg package.
The input is N records of 100 B produced exactly-once by `kdg produce`; every kdg run reads all of it
(`-e`) in a fresh group into a fresh table, with --batch-size 10000.
"""

import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from common import _machine_ticks, drop_sink_tables, drop_topic, fresh_topic, kdg_json, postgres_cpu, run_measured, sql
from measures import BASELINE, Measures, row

from kdg.settings import table_name

BATCH = 10_000
HERE = str(Path(__file__).resolve().parent)  # benchmarks/: bench_logic's transforms
COPY_ROWS_MAX = 500_000  # the reference's rate does not depend on more; its rows are built in memory first


def fresh_table(prefix: str):
    """A new sink table's name, checked as kdg checks --table (a plain lower-case identifier)."""
    return table_name(fresh_topic(prefix).replace("-", "_"))


def lists_option(kdg_path: str, command: str, option: str) -> bool:
    """Whether the kdg package in ``kdg_path`` has ``option`` for ``command`` (read from its --help)."""
    env = {**os.environ, "PYTHONPATH": kdg_path, "COLUMNS": "250", "NO_COLOR": "1"}
    out = subprocess.run([sys.executable, "-P", "-m", "kdg", command, "--help"], capture_output=True, text=True, env=env)
    return f"{option} " in out.stdout or f"{option}\n" in out.stdout


def kdg_consume_typed(layout, topic: str, kdg_path: str, *extra) -> dict:
    """`kdg consume -e` of ``topic``'s JSON orders (typed_sink_bench's) through a mapping into a fresh table; its rate
    and CPU. ``extra``: more options (a --transform: its module is found in benchmarks/)."""
    from typed_sink_bench import COLUMNS

    table, group = fresh_table("typed"), fresh_topic("g")
    mapping = Path(f"/tmp/kdg-bench-{group}.toml")
    mapping.write_text(f'table = "{table.text}"\nmode = "upsert"\nkey = ["order_id"]\ncreate_table = true\n'
                       "[columns]\n" + "".join(f'{c} = {{ type = "{t}", from = "{s}" }}\n' for c, t, s in COLUMNS))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([kdg_path, HERE]),
           "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers, "KDG_PG_DSN": layout.pg_dsn}
    pg_before = postgres_cpu(layout)
    try:
        out, usage = run_measured([sys.executable, "-P", "-m", "kdg", "consume", topic, "-G", group, "-g",
                                   "exactly-once", "--mapping", str(mapping), "--id-from", "json:id", "-e",
                                   "--batch-size", str(BATCH), *map(str, extra), "--json"], env)
        time.sleep(0.5)
        pg_after = postgres_cpu(layout)
    finally:
        mapping.unlink(missing_ok=True)
        drop_sink(layout, table, group)
    report = json.loads(out)
    return {"rate": report["msgs_per_s"], "records": report["consumed"],
            "pg_cpu_s": None if pg_before is None else round(pg_after - pg_before, 2), **usage.to_dict()}


def drop_sink(layout, table, group: str) -> None:
    drop_sink_tables(layout.pg_dsn, [table], ("DELETE FROM kdg_offsets WHERE consumer_group = $1", group))


def kdg_consume(layout, topic: str, guarantee: str, kdg_path: str, *extra) -> dict:
    """`kdg consume -e` of the whole topic into a fresh table; its rate, CPU, peak RSS and Postgres's CPU."""
    table, group = fresh_table("sink"), fresh_topic("g")
    env = {**os.environ, "PYTHONPATH": kdg_path, "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers,
           "KDG_PG_DSN": layout.pg_dsn}
    pg_before = postgres_cpu(layout)
    try:
        out, usage = run_measured([sys.executable, "-P", "-m", "kdg", "consume", topic, "-G", group, "-g", guarantee,
                                   "--table", table.text, "-e", "--batch-size", str(BATCH), *map(str, extra),
                                   "--json"], env)
        time.sleep(0.5)  # the consumer's backend exits with it: let the postmaster reap it (its CPU into cutime)
        pg_after = postgres_cpu(layout)
    finally:
        drop_sink(layout, table, group)
    report = json.loads(out)
    return {"rate": report["msgs_per_s"], "records": report["consumed"],
            "pg_cpu_s": None if pg_before is None else round(pg_after - pg_before, 2), **usage.to_dict()}


def kdg_consume_many(layout, topics: list[str], guarantee: str, kdg_path: str) -> dict:
    """`kdg consume -e` of several topics into a table each (``--table`` a template); its rate and CPU."""
    tag, group = fresh_table("mt").name, fresh_topic("g")
    env = {**os.environ, "PYTHONPATH": kdg_path, "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers,
           "KDG_PG_DSN": layout.pg_dsn}
    tables = [table_name(f'"{tag}_{t}"') for t in topics]
    pg_before = postgres_cpu(layout)
    try:
        out, usage = run_measured([sys.executable, "-P", "-m", "kdg", "consume", *topics, "-G", group, "-g", guarantee,
                                   "--table", f'"{tag}_{{topic}}"', "-e", "--batch-size", str(BATCH), "--json"], env)
        time.sleep(0.5)
        pg_after = postgres_cpu(layout)
    finally:
        drop_sink_tables(layout.pg_dsn, tables, ("DELETE FROM kdg_offsets WHERE consumer_group = $1", group))
    report = json.loads(out)
    return {"rate": report["msgs_per_s"], "records": report["consumed"],
            "pg_cpu_s": None if pg_before is None else round(pg_after - pg_before, 2), **usage.to_dict()}


def floor_loop(layout, topic: str, records: int, kdg_path: str) -> dict:
    """The reference for CPU per record: benchmarks/floor_loop.py over the whole topic in a fresh group."""
    env = {**os.environ, "PYTHONPATH": kdg_path}
    out, usage = run_measured([sys.executable, "-P", os.path.join(os.path.dirname(__file__), "floor_loop.py"),
                               layout.bootstrap_servers, topic, fresh_topic("floor"), str(records)], env)
    report = json.loads(out)
    if report["with_id"] != report["consumed"]:
        raise RuntimeError(f"the floor loop found kdg-id in {report['with_id']} of {report['consumed']} messages")
    return {"rate": report["msgs_per_s"], "records": report["consumed"], **usage.to_dict()}


def cpu_row(measures: Measures, what: str, kdg: str, ref: str, ref_label: str) -> dict:
    """A row whose ratio is CPU seconds per million records, ``kdg``'s over ``ref``'s (lower is better)."""
    entry = row(measures, what, kdg, ref, ref_label)
    entry["ratio"] = round(entry["kdg"]["cpu_s_per_m"] / entry["reference"]["cpu_s_per_m"], 2)
    if "baseline" in entry:
        entry["baseline"]["ratio"] = round(entry["baseline"]["kdg"]["cpu_s_per_m"]
                                           / entry["reference"]["cpu_s_per_m"], 2)
    entry["ratio_of"] = "cpu_s_per_m"
    return entry


def raw_copy(layout, rows: list[tuple]) -> dict:
    """The reference: one asyncpg COPY of ``rows`` into a fresh table shaped like kdg's sink, in this process."""
    import asyncpg

    table = fresh_table("copy")

    async def copy() -> float:
        conn = await asyncpg.connect(layout.pg_dsn)
        try:
            started = time.perf_counter()
            async with conn.transaction():
                await conn.copy_records_to_table(
                    table.name, records=rows, columns=["idempotency_key", "consumer_group", "topic", "partition",
                                                       "offset", "key", "value", "headers"])
            return time.perf_counter() - started
        finally:
            await conn.close()

    sql(layout.pg_dsn, (f"CREATE TABLE {table.sql} (LIKE kdg_events INCLUDING DEFAULTS INCLUDING INDEXES)",))
    try:
        me, ticks, pg_before = resource.getrusage(resource.RUSAGE_SELF), _machine_ticks(), postgres_cpu(layout)
        seconds = asyncio.run(copy())
        after, ticks_after = resource.getrusage(resource.RUSAGE_SELF), _machine_ticks()
        time.sleep(0.5)  # as in kdg_consume: the closed connection's backend is reaped first
        pg_after = postgres_cpu(layout)
    finally:
        sql(layout.pg_dsn, (f"DROP TABLE IF EXISTS {table.sql}",))
    busy = (ticks_after[0] - ticks[0]) / max(ticks_after[1] - ticks[1], 1) * (os.cpu_count() or 1)
    return {"rate": round(len(rows) / seconds, 1), "records": len(rows),
            "pg_cpu_s": None if pg_before is None else round(pg_after - pg_before, 2),
            "cpu_s": round(after.ru_utime + after.ru_stime - me.ru_utime - me.ru_stime, 2),
            "wall_s": round(seconds, 2), "busy_cores": round(busy, 2)}


def consume_rows(layout, measures: Measures, records: int, repeat: int, here: str, baseline: str | None) -> list:
    """Measure the consume part into ``measures``; its table rows."""
    topic = fresh_topic("consume")
    kdg_json(layout, "produce", topic, "-g", "exactly-once", "--count", records, "--size", 100,
             "--txn-size", 100_000, "--no-ledger")
    tiny = fresh_topic("consume-startup")  # what a run costs before its first record, measured as a run of 3
    kdg_json(layout, "produce", tiny, "-g", "exactly-once", "--count", 3, "--size", 100, "--no-ledger")
    rows = [(f"raw-{i}", "bench", topic, i % 3, i, None, b"x" * 100, "{}") for i in range(min(records, COPY_ROWS_MAX))]
    depth = "--pipeline-depth" if lists_option(here, "consume", "--pipeline-depth") else "--pipeline"
    pipeline = lists_option(here, "consume", depth)
    many = lists_option(here, "consume", "--topic-pattern")
    split = [fresh_topic(f"consume-{i}") for i in range(3)] if many else []
    for part in split:  # the same records over three topics
        kdg_json(layout, "produce", part, "-g", "exactly-once", "--count", records // 3, "--size", 100,
                 "--txn-size", 100_000, "--no-ledger")
    logic = lists_option(here, "consume", "--transform")
    typed = ""
    if logic:  # JSON orders for the typed route, with and without a transform
        from typed_sink_bench import produce as produce_orders

        typed = produce_orders(layout, records)
    print(f"consume: {records} records of 100 B, --batch-size {BATCH}; `kdg consume --pipeline` "
          + ("found: --pipeline 0 measured too" if pipeline else "not found: no --pipeline row"))
    runs = {
        "consume EOS": lambda: kdg_consume(layout, topic, "exactly-once", here),
        "consume ALO": lambda: kdg_consume(layout, topic, "at-least-once", here),
        "asyncpg COPY": lambda: raw_copy(layout, rows),
        "floor": lambda: floor_loop(layout, topic, records, here),
        "consume EOS start-up": lambda: kdg_consume(layout, tiny, "exactly-once", here),
        "floor start-up": lambda: floor_loop(layout, tiny, 3, here)}
    if pipeline:
        runs["consume EOS pipeline 0"] = lambda: kdg_consume(layout, topic, "exactly-once", here, depth, 0)
    if many:
        runs["consume EOS 3 topics"] = lambda: kdg_consume_many(layout, split, "exactly-once", here)
    if logic:
        runs["consume EOS typed"] = lambda: kdg_consume_typed(layout, typed, here)
        runs["consume EOS typed, transform"] = lambda: kdg_consume_typed(layout, typed, here, "--transform",
                                                                         "bench_logic:identity")
    if baseline:
        runs["consume EOS" + BASELINE] = lambda: kdg_consume(layout, topic, "exactly-once", baseline)
        runs["consume ALO" + BASELINE] = lambda: kdg_consume(layout, topic, "at-least-once", baseline)
        if pipeline and lists_option(baseline, "consume", "--pipeline"):
            runs["consume EOS pipeline 0" + BASELINE] = (
                lambda: kdg_consume(layout, topic, "exactly-once", baseline, "--pipeline", 0))
    try:
        measures.repeat(repeat, runs)
    finally:
        drop_topic(layout, topic)
        drop_topic(layout, tiny)
        for part in split:
            drop_topic(layout, part)
        if typed:
            drop_topic(layout, typed)
    out = [row(measures, "consume exactly-once → Postgres (rows/s)", "consume EOS", "asyncpg COPY",
               "one asyncpg COPY"),
           row(measures, "consume at-least-once → Postgres (rows/s)", "consume ALO", "asyncpg COPY",
               "one asyncpg COPY")]
    if pipeline:
        out.append(row(measures, "consume exactly-once → Postgres, --pipeline 0 (rows/s)", "consume EOS pipeline 0",
                       "consume EOS", "kdg default pipelining"))
    if many:
        out.append(row(measures, "consume exactly-once → Postgres, 3 topics into 3 tables (rows/s)",
                       "consume EOS 3 topics", "consume EOS", "one topic into one table"))
    if logic:
        cost = cpu_row(measures, "consume exactly-once, typed route: a trivial transform's CPU per record over none "
                       "(CPU-s/M ratio, lower is better)", "consume EOS typed, transform", "consume EOS typed",
                       "the same route without one")
        cost["transform_us_per_record"] = round(cost["kdg"]["cpu_s_per_m"] - cost["reference"]["cpu_s_per_m"], 2)
        print(f"a trivial transform costs {cost['transform_us_per_record']} µs of consumer CPU per record "
              "(budget 1 µs; medians of CPU-s per million records, start-up included on both sides)")
        out.append(cost)
    out.append(cpu_row(measures, "consume exactly-once → Postgres: CPU per record over the floor's (CPU-s/M ratio, "
                       "lower is better)", "consume EOS", "floor", "bare confluent-kafka loop"))
    out.append(startup_excluded_row(measures, "consume exactly-once → Postgres: CPU per record over the floor's, "
                                    "start-up excluded (CPU-s/M ratio, lower is better)", "consume EOS", "floor",
                                    "bare confluent-kafka loop"))
    return out


def startup_excluded_row(measures: Measures, what: str, kdg: str, ref: str, ref_label: str) -> dict:
    """:func:`cpu_row`'s ratio with each side's start-up CPU (its ``<name> start-up`` run, medians) taken off
    first: CPU-s per million records of the records alone."""
    entry = {"what": what, "ratio_of": "cpu_s_per_m"}
    for side, name in (("kdg", kdg), ("reference", ref)):
        summary, startup = measures.summary(name), measures.summary(name + " start-up")["median_cpu_s"]
        records = summary["details"][0]["records"]
        summary.update(startup_cpu_s=startup,
                       cpu_s_per_m=round((summary["median_cpu_s"] - startup) / records * 1e6, 2))
        entry[side] = summary
    entry["reference"] = {"what": ref_label, **entry["reference"]}
    entry["ratio"] = round(entry["kdg"]["cpu_s_per_m"] / entry["reference"]["cpu_s_per_m"], 2)
    return entry
