"""Connect upsert (issue 48): kdg's typed upsert of Kafka Connect JsonConverter records, against its floors.

    python benchmarks/connect_upsert_bench.py [--records 1000000] [--repeat 3] [--baseline DIR] [--json PATH]

The input: ``--records`` JsonConverter envelopes (``schemas.enable=true``: ``{"schema": …, "payload": …}``, a
schema of about 300 bytes and a payload of about 70: ``id`` int64, ``status`` string, ``amount`` double,
``updated_at`` int64 named ``org.apache.kafka.connect.data.Timestamp``, epoch ms), half as many ids in two
versions each: every id's first version, then every id's second, in the same order. Each is keyed by a Connect
struct key of its id, over 6 partitions, with no kdg headers (as Connect writes them). Produced once by a
confluent-kafka producer here; not timed.

Measured in each repetition, in an order rotated between repetitions (``measures.Measures.repeat``):

- ``upsert EOS``: ``kdg consume -g exactly-once --id-from offset -e --mapping M`` into a fresh table
  ``(id bigint PRIMARY KEY, status text, amount double precision, updated_at timestamptz)``, made beforehand;
  M maps each column from ``json:/payload/FIELD``, mode upsert, key id. The table is then checked: one row
  per id, each at its second version (status, amount and updated_at all of it), or the run fails.
- ``upsert ALO``: the same under at-least-once (the issue's goals compare the two).
- ``client loop``: benchmarks/floor_loop.py, the bare confluent-kafka loop with an exactly-once consumer's
  settings that touches every field of each message (value, key, headers, offset, partition, timestamp) and
  writes nothing: the floor for the consumer's CPU.
- ``Postgres floor``: the same final rows (N/2, pre-parsed tuples, built before the clock starts) into a
  fresh table of the same shape, in one transaction: a temporary staging table, one binary COPY
  (asyncpg ``copy_records_to_table``) into it, and one ``INSERT … SELECT … ON CONFLICT (id) DO UPDATE``. Run
  as a child of this script (``--pg-floor``), which reports the seconds and CPU of that part alone. Its rate
  and its per-million figures count the N input records whose final rows it writes, so its ratio to kdg's
  rate is that of the times the two take to the same final table.
- ``upsert EOS start-up`` and ``client loop start-up``: the same over a topic of 4 records (2 ids), whose CPU
  is taken off the full runs' for their CPU per record "start-up off" (as consume_bench's start-up rows).
- with ``--baseline DIR``: ``upsert EOS`` (and its start-up) and ``upsert ALO`` again with the kdg package in
  DIR (``git archive <rev> | tar -x -C DIR``); with ``--baseline-pg-dsn DSN`` too, into that database of the
  stack's server, migrated by DIR's kdg (a schema change measured with the code it came with; Postgres's CPU
  is still the whole server's).

Figures (medians of ``--repeat``): rows/s is the consumer's own loop (its report's ``msgs_per_s``: start-up
excluded; records read per second). Steady rows/s is the middle 80 % of the records by the consumer's own
progress: it runs with ``--metrics-port``, scraped every 0.2 s, and the times at which the records it has
settled (``kdg_records_read_total``) pass 10 % and 90 % of N, interpolated between scrapes, give
0.8 N / (t90 − t10): no start-up, no first batch's table checks, no drain at the end. Consumer CPU-s per
million records is the process's (all threads; with its start-up and without it; the scrapes cost it a few ms
each), Postgres CPU-s per million the server's processes over the same run (``common.postgres_cpu``: every
client's, so run it on a quiet stack). The issue's goals, checked in the printed table: exactly-once ≥ 0.9 ×
at-least-once's rate, Postgres CPU per record under exactly-once ≤ 1.3 × at-least-once's, consumer CPU ≤ 7
CPU-s per million.

Prints the table and writes ``benchmarks/results/connect_upsert_bench.json``. The same measurements are the
``upsert`` part of `make bench` (``produce_bench.py --only upsert``): :func:`upsert_rows`.
"""

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import Child, drop_topic, fresh_topic, postgres_cpu, produce_pairs, run_measured, sql  # noqa: E402
from consume_bench import BATCH, cpu_row, drop_sink, fresh_table, lists_option, startup_excluded_row  # noqa: E402
from measures import BASELINE, Measures, row  # noqa: E402

RESULTS = HERE / "results" / "connect_upsert_bench.json"
PARTITIONS = 6
SCRAPE_S = 0.2
STARTUP = " start-up"  # a measurement's name + this: the same over a topic of 4 records (its start-up's CPU)
BASE_MS = 1_764_000_000_000  # 2025-11-24T16:00:00Z: first versions' updated_at is BASE_MS + id, second's a day later
DAY_MS = 86_400_000
DDL = "CREATE TABLE {t} (id bigint PRIMARY KEY, status text, amount double precision, updated_at timestamptz)"
SOURCES = {"id": "bigint", "status": "text", "amount": "double precision", "updated_at": "timestamptz"}
VALUE_SCHEMA = json.dumps({"type": "struct", "fields": [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "status"},
    {"type": "double", "optional": True, "field": "amount"},
    {"type": "int64", "optional": False, "name": "org.apache.kafka.connect.data.Timestamp",
     "field": "updated_at"}], "optional": False}, separators=(",", ":"))
KEY_SCHEMA = json.dumps({"type": "struct", "fields": [{"type": "int64", "optional": False, "field": "id"}],
                         "optional": False}, separators=(",", ":"))
VERSIONS = {1: ("new", 0.5, 0), 2: ("paid", 0.75, DAY_MS)}  # status, amount's fraction, updated_at's offset


# -- the input ---------------------------------------------------------------------------------------------------
def payload(i: int, version: int) -> str:
    status, fraction, later = VERSIONS[version]
    return f'{{"id":{i},"status":"{status}","amount":{i % 10_000 + fraction},"updated_at":{BASE_MS + later + i}}}'


def envelope(i: int, version: int) -> tuple[bytes, bytes]:
    """Id ``i``'s record at ``version``: its JsonConverter key and value, as Connect writes them (compact)."""
    return (f'{{"schema":{KEY_SCHEMA},"payload":{{"id":{i}}}}}'.encode(),
            f'{{"schema":{VALUE_SCHEMA},"payload":{payload(i, version)}}}'.encode())


def produce(layout, topic: str, ids: int) -> None:
    """Every id's first version, then every id's second, into a new topic of 6 partitions, keyed by id."""
    produce_pairs(layout.bootstrap_servers, topic, PARTITIONS,
                  (envelope(i, version) for version in (1, 2) for i in range(ids)))


def check_table(layout, table, ids: int) -> None:
    """Fail loudly unless ``table`` holds one row per id 0 … ids-1, every one at its second version."""
    status, fraction, later = VERSIONS[2]
    found = dict(sql(layout.pg_dsn, (
        f"SELECT count(*) AS rows, count(*) FILTER (WHERE status = $1 AND amount = id % 10000 + $2::float8 "
        f"AND updated_at = timestamptz 'epoch' + ($3::bigint + id) * interval '1 millisecond') AS final, "
        f"min(id) AS first, max(id) AS last FROM {table.sql}", status, fraction, BASE_MS + later))[0])
    if found != {"rows": ids, "final": ids, "first": 0, "last": ids - 1}:
        raise RuntimeError(f"{table.text} is wrong after the run: {found}; expected {ids} rows, ids 0 to {ids - 1}, "
                           "each at its second version")


# -- the measurements ----------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settled(port: int) -> float | None:
    """The records a `kdg consume --metrics-port` has settled so far (its kdg_records_read_total), or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as answer:
            text = answer.read().decode()
    except OSError:  # not serving yet, or gone
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kdg_records_read_total{"))


def steady_rate(progress: list[tuple[float, float]], records: int) -> float | None:
    """0.8 × ``records`` over the time between the settled count passing 10 % and 90 % of them (interpolated
    between the scrapes ``progress`` holds, as (time, count)); None without a scrape on each side of both."""
    def when(share: float) -> float | None:
        goal = share * records
        for (t0, c0), (t1, c1) in zip(progress, progress[1:]):
            if c0 < goal <= c1:
                return t0 + (t1 - t0) * (goal - c0) / (c1 - c0)
        return None

    start, end = when(0.1), when(0.9)
    return None if start is None or end is None or end <= start else round(0.8 * records / (end - start), 1)


def kdg_upsert(layout, topic: str, ids: int, guarantee: str, kdg_path: str, db=None) -> dict:
    """`kdg consume -e` of the whole topic through the typed mapping, upsert on id, into a fresh table made
    beforehand; its rate, steady rate, CPU and Postgres's CPU. The table is checked before it is dropped.
    ``db``: the stack with another database of its server (``--baseline-pg-dsn``) to write into."""
    db = db or layout
    table, group = fresh_table("upsert"), fresh_topic("g")
    sql(db.pg_dsn, (DDL.format(t=table.sql),))
    mapping = Path(f"/tmp/kdg-bench-{group}.toml")
    mapping.write_text(f'table = "{table.text}"\nmode = "upsert"\nkey = ["id"]\n[columns]\n' + "".join(
        f'{c} = {{ type = "{t}", from = "json:/payload/{c}" }}\n' for c, t in SOURCES.items()))
    env = {**os.environ, "PYTHONPATH": kdg_path, "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers,
           "KDG_PG_DSN": db.pg_dsn}
    port = free_port() if lists_option(kdg_path, "consume", "--metrics-port") else None
    progress: list[tuple[float, float]] = []
    pg_before = postgres_cpu(layout)
    try:
        child = Child([sys.executable, "-P", "-m", "kdg", "consume", topic, "-G", group, "-g", guarantee,
                       "--mapping", str(mapping), "--id-from", "offset", "-e", "--batch-size", str(BATCH),
                       *(["--metrics-port", str(port), "--metrics-host", "127.0.0.1"] if port else []), "--json"],
                      env)
        while port and not child.wait(SCRAPE_S):
            if (count := settled(port)) is not None:
                progress.append((time.perf_counter(), count))
        out, usage = child.result()
        time.sleep(0.5)  # the consumer's backend exits with it: let the postmaster reap it (its CPU into cutime)
        pg_after = postgres_cpu(layout)
        check_table(db, table, ids)
    finally:
        mapping.unlink(missing_ok=True)
        drop_sink(db, table, group)
    report = json.loads(out)
    if report["consumed"] != 2 * ids:
        raise RuntimeError(f"kdg consume read {report['consumed']} records of {2 * ids}: {report}")
    return {"rate": report["msgs_per_s"], "steady": steady_rate(progress, 2 * ids), "records": report["consumed"],
            "written": report.get("written"), "superseded": report.get("superseded"),
            "field_notes": report.get("field_notes"),  # what kdg said of the mapping against the records
            "pg_cpu_s": None if pg_before is None else round(pg_after - pg_before, 2), **usage.to_dict()}


def client_loop(layout, topic: str, records: int) -> dict:
    """benchmarks/floor_loop.py over the whole topic in a fresh group (Connect's records carry no kdg-id)."""
    out, usage = run_measured([sys.executable, "-P", str(HERE / "floor_loop.py"), layout.bootstrap_servers, topic,
                               fresh_topic("floor"), str(records)], {**os.environ, "PYTHONPATH": str(HERE.parent)})
    report = json.loads(out)
    if report["consumed"] != records:
        raise RuntimeError(f"the client loop read {report['consumed']} records of {records}")
    return {"rate": report["msgs_per_s"], "records": records, **usage.to_dict()}


def postgres_floor(layout, ids: int) -> dict:
    """The final rows through one COPY and one upsert statement (this script's ``--pg-floor``, a child): the
    rate of the input records they stand for, that part's own CPU, and Postgres's."""
    table = fresh_table("pgfloor")
    sql(layout.pg_dsn, (DDL.format(t=table.sql),))
    pg_before = postgres_cpu(layout)
    try:
        out, usage = run_measured([sys.executable, "-P", __file__, "--pg-floor", table.sql, "--records", str(2 * ids)],
                                  {**os.environ, "PYTHONPATH": str(HERE.parent), "KDG_PG_DSN": layout.pg_dsn})
        time.sleep(0.5)  # as in kdg_upsert: the closed connection's backend is reaped first
        pg_after = postgres_cpu(layout)
        check_table(layout, table, ids)
    finally:
        sql(layout.pg_dsn, (f"DROP TABLE IF EXISTS {table.sql}",))
    timed = json.loads(out)
    return {"rate": round(2 * ids / timed["seconds"], 1), "rows_per_s": round(ids / timed["seconds"], 1),
            "records": 2 * ids, "pg_cpu_s": None if pg_before is None else round(pg_after - pg_before, 2),
            **usage.to_dict(), "cpu_s": timed["cpu_s"], "wall_s": timed["seconds"]}


def pg_floor_child(dsn: str, table: str, ids: int) -> None:
    """``--pg-floor``: the final rows as typed tuples, then, timed, staged by one binary COPY and upserted by one
    statement in one transaction; prints the seconds and this process's CPU seconds of that part."""
    import asyncio
    from datetime import datetime, timedelta, timezone

    import asyncpg

    status, fraction, later = VERSIONS[2]
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    rows = [(i, status, i % 10_000 + fraction, epoch + timedelta(milliseconds=BASE_MS + later + i))
            for i in range(ids)]
    update = ", ".join(f"{c} = EXCLUDED.{c}" for c in SOURCES if c != "id")

    async def go() -> float:
        conn = await asyncpg.connect(dsn)
        try:
            started = time.perf_counter()
            async with conn.transaction():
                await conn.execute(f"CREATE TEMP TABLE kdg_bench_stage (LIKE {table}) ON COMMIT DROP")
                await conn.copy_records_to_table("kdg_bench_stage", records=rows, columns=list(SOURCES))
                await conn.execute(f"INSERT INTO {table} SELECT * FROM kdg_bench_stage "
                                   f"ON CONFLICT (id) DO UPDATE SET {update}")
            return time.perf_counter() - started
        finally:
            await conn.close()

    before = resource.getrusage(resource.RUSAGE_SELF)
    seconds = asyncio.run(go())
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": round(seconds, 3),
                      "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2)}))


# -- the part ------------------------------------------------------------------------------------------------------
def upsert_rows(layout, measures: Measures, records: int, repeat: int, here: str, baseline: str | None,
                baseline_dsn: str | None = None) -> list:
    """Measure the Connect upsert into ``measures`` (``records`` rounded down to even); the rows of `make bench`'s
    table: exactly-once against the Postgres floor and against at-least-once, and its CPU over the client loop's."""
    ids = records // 2
    topic, tiny = fresh_topic("connect-upsert"), fresh_topic("connect-upsert-startup")
    key, value = envelope(ids - 1, 2)
    print(f"upsert: {2 * ids:,} JsonConverter records ({len(value)} B values: a {len(VALUE_SCHEMA)} B schema, "
          f"{len(payload(ids - 1, 2))} B payload; {len(key)} B keys), {ids:,} ids in two versions, "
          f"{PARTITIONS} partitions, --batch-size {BATCH}", flush=True)
    produce(layout, topic, ids)
    produce(layout, tiny, 2)  # what a run costs before its records: a run of 4
    runs = {"upsert EOS": lambda: kdg_upsert(layout, topic, ids, "exactly-once", here),
            "upsert ALO": lambda: kdg_upsert(layout, topic, ids, "at-least-once", here),
            "client loop": lambda: client_loop(layout, topic, 2 * ids),
            "Postgres floor": lambda: postgres_floor(layout, ids),
            "upsert EOS" + STARTUP: lambda: kdg_upsert(layout, tiny, 2, "exactly-once", here),
            "client loop" + STARTUP: lambda: client_loop(layout, tiny, 4)}
    if baseline:
        db = replace(layout, external_pg_dsn=baseline_dsn) if baseline_dsn else layout
        runs["upsert EOS" + BASELINE] = lambda: kdg_upsert(layout, topic, ids, "exactly-once", baseline, db)
        runs["upsert ALO" + BASELINE] = lambda: kdg_upsert(layout, topic, ids, "at-least-once", baseline, db)
        runs["upsert EOS" + BASELINE + STARTUP] = lambda: kdg_upsert(layout, tiny, 2, "exactly-once", baseline, db)
    try:
        measures.repeat(repeat, runs)
    finally:
        for name in (topic, tiny):
            drop_topic(layout, name)
            drop_topic(layout, f"{name}.dlq")
    return [row(measures, "Connect upsert exactly-once → Postgres (records/s)", "upsert EOS", "Postgres floor",
                "one COPY + one upsert of the final rows"),
            row(measures, "Connect upsert exactly-once over at-least-once (records/s; goal ≥ 0.9)", "upsert EOS",
                "upsert ALO", "kdg at-least-once"),
            cpu_row(measures, "Connect upsert exactly-once: CPU per record over the client loop's (CPU-s/M ratio, "
                    "lower is better)", "upsert EOS", "client loop", "bare confluent-kafka loop"),
            startup_excluded_row(measures, "Connect upsert exactly-once: CPU per record over the client loop's, "
                                 "start-up excluded (CPU-s/M ratio, lower is better; goal ≤ 7 CPU-s/M)",
                                 "upsert EOS", "client loop", "bare confluent-kafka loop")]


# -- the standalone table --------------------------------------------------------------------------------------------
def steady_median(measures: Measures, name: str) -> float | None:
    values = [r["steady"] for r in measures.runs[name] if r.get("steady") is not None]
    return round(statistics.median(values), 1) if values else None


def results(measures: Measures) -> dict:
    """Every measurement's medians (with start-up taken off its CPU where its start-up was measured), and the
    issue's ratios: this kdg's, and the baseline's when it was measured."""
    out: dict = {"measures": {}, "ratios": {}}
    for name in measures.runs:
        s = out["measures"][name] = {**measures.summary(name), "steady_median": steady_median(measures, name)}
        if measures.has(name + STARTUP):
            s["startup_cpu_s"] = measures.summary(name + STARTUP)["median_cpu_s"]
            s["cpu_s_per_m_startup_off"] = round((s["median_cpu_s"] - s["startup_cpu_s"])
                                                 / s["details"][0]["records"] * 1e6, 2)
    m = out["measures"]

    def ratio(a, b):
        return round(a / b, 2) if a and b else None

    for suffix in ("", BASELINE):
        eos, alo = m.get("upsert EOS" + suffix), m.get("upsert ALO" + suffix)
        if eos is not None:
            out["ratios"]["kdg" + suffix] = {
                "eos_over_alo_rate": ratio(eos["median"], alo["median"]),
                "eos_over_alo_steady": ratio(eos["steady_median"], alo["steady_median"]),
                "eos_over_alo_postgres_cpu": ratio(eos["pg_cpu_s_per_m"], alo["pg_cpu_s_per_m"]),
                "eos_consumer_cpu_s_per_m": eos["cpu_s_per_m"],
                "eos_consumer_cpu_s_per_m_startup_off": eos.get("cpu_s_per_m_startup_off"),
                "eos_over_postgres_floor_rate": ratio(eos["median"], m["Postgres floor"]["median"]),
                "eos_over_client_loop_cpu": ratio(eos["cpu_s_per_m"], m["client loop"]["cpu_s_per_m"])}
    return out


def print_results(found: dict) -> None:
    def num(v, fmt=",.0f"):
        return "—" if v is None else format(v, fmt)

    print("\n| what | rows/s | steady rows/s | consumer CPU-s/M | the same, start-up off | Postgres CPU-s/M "
          "| wall s | machine busy cores |")
    print("|---|---|---|---|---|---|---|---|")
    for name, s in found["measures"].items():
        if not name.endswith(STARTUP):
            print(f"| {name} | {num(s['median'])} | {num(s['steady_median'])} | {num(s['cpu_s_per_m'], '.1f')} "
                  f"| {num(s.get('cpu_s_per_m_startup_off'), '.1f')} | {num(s['pg_cpu_s_per_m'], '.1f')} "
                  f"| {num(s['median_wall_s'], '.1f')} | {num(s['median_busy_cores'], '.2f')} |")
    print("\n| kdg | EOS / ALO rate (goal ≥ 0.9) | EOS / ALO steady | EOS / ALO Postgres CPU (goal ≤ 1.3) "
          "| EOS consumer CPU-s/M, start-up off (goal ≤ 7) | EOS / Postgres floor rate | EOS / client loop CPU |")
    print("|---|---|---|---|---|---|---|")
    for which, r in found["ratios"].items():
        print(f"| {which} | {num(r['eos_over_alo_rate'], '.2f')} | {num(r['eos_over_alo_steady'], '.2f')} "
              f"| {num(r['eos_over_alo_postgres_cpu'], '.2f')} "
              f"| {num(r['eos_consumer_cpu_s_per_m_startup_off'], '.1f')} ({num(r['eos_consumer_cpu_s_per_m'], '.1f')} "
              f"with it) | {num(r['eos_over_postgres_floor_rate'], '.2f')} "
              f"| {num(r['eos_over_client_loop_cpu'], '.2f')} |")
    print("\nrows/s: records read per second by the consumer's own loop (start-up excluded); the Postgres floor's "
          "counts the input records whose final rows it writes (its rows/s of final rows is half). Steady: the "
          "middle 80 % of the records by the consumer's own progress. CPU-s/M: per million input records, the "
          "process's whole life; start-up off: less its CPU over a 4-record topic. The Postgres floor's is its "
          "client's COPY and statement only.")


def main() -> None:
    from common import machine, stack

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="records: half as many ids, two versions each")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", help="a directory holding another kdg package to measure alongside")
    ap.add_argument("--baseline-pg-dsn", metavar="DSN",
                    help="the baseline writes into this database of the stack's server (migrated by the baseline's "
                         "kdg: a schema change measured with its code)")
    ap.add_argument("--json", type=Path, default=RESULTS, help=f"write the results here [default: {RESULTS}]")
    ap.add_argument("--pg-floor", metavar="TABLE", help=argparse.SUPPRESS)  # the Postgres floor's child
    args = ap.parse_args()
    if args.pg_floor:
        pg_floor_child(os.environ["KDG_PG_DSN"], args.pg_floor, args.records // 2)
        return
    if args.records < 20 or args.repeat < 1:
        ap.error("--records must be at least 20 and --repeat at least 1")
    if args.baseline:
        args.baseline = str(Path(args.baseline).resolve())
        if not (Path(args.baseline) / "kdg" / "__init__.py").exists():
            ap.error(f"--baseline {args.baseline}: no kdg package there")
    layout = stack()
    load = os.getloadavg()
    print(f"machine: {machine()}; stack: {layout.brokers} brokers on loopback; load {load[0]:.2f} before")
    measures = Measures()
    rows = upsert_rows(layout, measures, args.records, args.repeat, str(HERE.parent), args.baseline,
                       args.baseline_pg_dsn)
    found = results(measures)
    print(f"\n{args.records // 2 * 2:,} JsonConverter records, typed upsert, medians of {args.repeat} on {machine()}")
    print_results(found)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "records": args.records // 2 * 2, "repeat": args.repeat, "partitions": PARTITIONS, "batch_size": BATCH,
        "machine": machine(), "load_before": [round(x, 2) for x in load], "baseline": args.baseline,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **found, "rows": rows, "runs": measures.runs},
        indent=1, default=str) + "\n")
    print(f"\nwritten: {args.json}")


if __name__ == "__main__":
    main()
