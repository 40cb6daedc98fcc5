"""Schemas that change (issue 47): what columns from the records' schema cost, and what a change costs.

    python benchmarks/evolve_bench.py --records 300000 --repeat 3 [--json benchmarks/results/evolve_bench.json]

One topic of ``--records`` Kafka Connect JsonConverter orders (``{"schema", "payload"}``, a struct key of ``id``)
is read by ``kdg consume -g exactly-once --mode upsert`` into a table made beforehand
(``id bigint PRIMARY KEY, customer text, amount double precision, paid boolean, qty integer``), in each
repetition and in rotated order:

- ``fixed``: through a mapping that names those columns and their ``json:/payload/…`` sources;
- ``from-schema``: ``--columns from-schema --evolve add-columns``: the same columns, from each record's schema
  (met once, planned against the table: no change).

Each gives the consumer's CPU seconds per million records and its rows/s (its own loop: start-up excluded).
Each way also reads a 3-record topic: its start-up CPU (imports, connections, the table's checks), taken off
for the records' own CPU. The issue's budget: from-schema costs at most 3 % more than fixed. Then a topic (one partition) whose second
half adds an optional field ``tier``, read by the from-schema route with a ``--handler`` (this module's
:func:`timed`) that notes, inside each batch's transaction, the time and the table's ``pg_relation_size``,
``pg_total_relation_size`` and file node: the first batch after the change (its ALTER TABLE included) against
a normal batch, and the table before and after that ALTER. An added nullable column without a default is a
catalog change: the file node stays, and the table grows by that batch's rows only, no rewrite.
"""

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOG_ENV, TABLE_ENV = "KDG_EVOLVE_BENCH_LOG", "KDG_EVOLVE_BENCH_TABLE"  # the handler's file, and the table it looks at
RESULTS = HERE / "results" / "evolve_bench.json"
BATCH = 5000
FIELDS = [("id", "int64", False, "bigint"), ("customer", "string", True, "text"),
          ("amount", "float64", True, "double precision"), ("paid", "boolean", True, "boolean"),
          ("qty", "int32", True, "integer")]
TIER = ("tier", "string", True, "text")
DDL = "CREATE TABLE {t} (" + ", ".join(f"{f} {pg}" for f, _, _, pg in FIELDS) + ", PRIMARY KEY (id))"


async def timed(rows, conn) -> None:
    """The change run's ``--handler``: one line per batch, inside its transaction (after its rows are written):
    the time, the rows, whether the table has ``tier`` yet, and its sizes and file node."""
    found = await conn.fetchrow(
        "SELECT pg_relation_size($1::regclass) AS rel, pg_total_relation_size($1::regclass) AS total, "
        "pg_relation_filenode($1::regclass) AS filenode, EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = "
        "$1::regclass AND attname = 'tier' AND NOT attisdropped) AS has_tier", os.environ[TABLE_ENV])
    with open(os.environ[LOG_ENV], "a", encoding="utf-8") as log:
        log.write(json.dumps({"t": time.perf_counter(), "rows": len(rows), **dict(found)}) + "\n")


def schema_of(fields) -> str:
    return json.dumps({"type": "struct", "fields": [{"field": f, "type": t, "optional": o} for f, t, o, _ in fields]})


def produce(layout, topic: str, records: int, partitions: int, tier_from: int | None = None) -> None:
    """``records`` orders; from ``tier_from`` on, their schema has ``tier`` too."""
    from common import produce_pairs

    old, new = schema_of(FIELDS), schema_of(FIELDS + [TIER])
    key_schema = schema_of(FIELDS[:1])

    def pairs():
        for i in range(records):
            changed = tier_from is not None and i >= tier_from
            payload = (f'{{"id": {i}, "customer": "c{i % 5000}", "amount": {i % 10_000}.{i % 100:02d}, '
                       f'"paid": {"true" if i % 2 else "false"}, "qty": {i % 7}'
                       + (f', "tier": "t{i % 3}"}}' if changed else "}"))
            yield (f'{{"schema": {key_schema}, "payload": {{"id": {i}}}}}'.encode(),
                   f'{{"schema": {new if changed else old}, "payload": {payload}}}'.encode())
    produce_pairs(layout.bootstrap_servers, topic, partitions, pairs())


def consume(layout, topic: str, route: str, *, log: Path | None = None) -> dict:
    """`kdg consume -e` of ``topic`` into a fresh table made beforehand, the ``route`` way (fixed or from-schema);
    its rate, CPU, Postgres's CPU and report. With ``log``, :func:`timed` notes each batch there."""
    from common import drop_sink_tables, fresh_topic, postgres_cpu, run_measured, sql

    table, group = fresh_topic("evolve").replace("-", "_"), fresh_topic("g")
    sql(layout.pg_dsn, (DDL.format(t=table),))
    mapping = Path(f"/tmp/kdg-bench-{group}.toml")
    if route == "fixed":
        mapping.write_text(f'table = "{table}"\nmode = "upsert"\nkey = ["id"]\n[columns]\n' + "".join(
            f'{f} = {{ type = "{pg}", from = "json:/payload/{f}" }}\n' for f, _, _, pg in FIELDS))
        how = ["--mapping", str(mapping)]
    else:
        how = ["--table", table, "--columns", "from-schema", "--evolve", "add-columns", "--mode", "upsert"]
    if log is not None:
        how += ["--handler", "evolve_bench:timed"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(HERE)]).strip(os.pathsep),
           "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers, "KDG_PG_DSN": layout.pg_dsn,
           LOG_ENV: str(log or ""), TABLE_ENV: table}
    pg_before = postgres_cpu(layout)
    try:
        out, usage = run_measured([sys.executable, "-P", "-m", "kdg", "consume", topic, "-G", group, "-g",
                                   "exactly-once", "--id-from", "offset", "-e", "--batch-size", str(BATCH), *how,
                                   "--json"], env)
        time.sleep(0.5)  # the consumer's backend exits with it: let the postmaster reap it (its CPU into cutime)
        pg_after = postgres_cpu(layout)
    finally:
        mapping.unlink(missing_ok=True)
        drop_sink_tables(layout.pg_dsn, [table], ("DELETE FROM kdg_offsets WHERE consumer_group = $1", group))
    report = json.loads(out)
    return {"rate": report["msgs_per_s"], "records": report["consumed"], "schema_changes": report["schema_changes"],
            "pg_cpu_s": None if pg_before is None else round(pg_after - pg_before, 2), **usage.to_dict()}


def change_run(layout, topic: str) -> dict:
    """The from-schema route over the topic whose second half adds ``tier``: the first batch after the change
    against a normal one, and the table's sizes and file node before and after the ALTER."""
    log = Path(f"/tmp/kdg-evolve-bench-{uuid.uuid4().hex[:8]}.jsonl")
    try:
        run = consume(layout, topic, "from-schema", log=log)
        batches = [json.loads(line) for line in log.read_text().splitlines()]
    finally:
        log.unlink(missing_ok=True)
    k = next(i for i, b in enumerate(batches) if b["has_tier"])
    if k < 2 or k + 1 >= len(batches):
        raise SystemExit(f"the change came in batch {k} of {len(batches)}: use more --records")
    took = [b["t"] - a["t"] for a, b in zip(batches, batches[1:])]  # took[i - 1]: batch i, commit to commit
    normal = [s for i, s in enumerate(took, 1) if i != k and batches[i]["rows"] == BATCH]
    grew = [b["rel"] - a["rel"] for i, (a, b) in enumerate(zip(batches, batches[1:]), 1) if i != k]
    before, after = batches[k - 1], batches[k]
    added = [c for c in run["schema_changes"] if c["change"] == "added"]
    return {"rate": run["rate"], "records": run["records"], "cpu_s": run["cpu_s"], "wall_s": run["wall_s"],
            "busy_cores": run["busy_cores"], "batches": len(batches), "change_batch": k, "alters": len(added),
            "change_batch_s": round(took[k - 1], 4), "normal_batch_s": round(statistics.median(normal), 4),
            "before": {key: before[key] for key in ("rel", "total", "filenode")},
            "after": {key: after[key] for key in ("rel", "total", "filenode")},
            "normal_batch_growth": int(statistics.median(grew)), "rewritten": before["filenode"] != after["filenode"]}


def main() -> None:
    sys.path.insert(0, str(HERE))
    from common import drop_topic, fresh_topic, machine, stack
    from measures import Measures

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"write the results here [default: {RESULTS}]")
    args = parser.parse_args()
    layout = stack()
    steady, changing, tiny = fresh_topic("evolve"), fresh_topic("evolve-change"), fresh_topic("evolve-startup")
    print(f"producing {args.records:,} JsonConverter orders twice (the second topic adds a field halfway) ...",
          file=sys.stderr)
    produce(layout, steady, args.records, partitions=3)
    produce(layout, changing, args.records, partitions=1, tier_from=args.records // 2)
    produce(layout, tiny, 3, partitions=1)
    measures, changes = Measures(), []
    try:
        measures.repeat(args.repeat, {"fixed": lambda: consume(layout, steady, "fixed"),
                                      "from-schema": lambda: consume(layout, steady, "from-schema"),
                                      "fixed start-up": lambda: consume(layout, tiny, "fixed"),
                                      "from-schema start-up": lambda: consume(layout, tiny, "from-schema")})
        for rep in range(args.repeat):
            changes.append(change_run(layout, changing))
            c = changes[-1]
            print(f"  [{rep + 1}/{args.repeat}] change: batch {c['change_batch']} took {c['change_batch_s']} s, a "
                  f"normal one {c['normal_batch_s']} s; {c['alters']} ALTER; file node "
                  f"{'changed' if c['rewritten'] else 'kept'}", flush=True)
    finally:
        for topic in (steady, changing, tiny):
            drop_topic(layout, topic)
    fixed, derived = measures.summary("fixed"), measures.summary("from-schema")
    for name, s in (("fixed", fixed), ("from-schema", derived)):  # the records' own CPU: start-up taken off
        s["startup_cpu_s"] = measures.summary(f"{name} start-up")["median_cpu_s"]
        s["records_cpu_s_per_m"] = round((s["median_cpu_s"] - s["startup_cpu_s"]) / args.records * 1e6, 2)
    overhead = round(derived["records_cpu_s_per_m"] / fixed["records_cpu_s_per_m"] - 1, 4)
    with_startup = round(statistics.median(b["cpu_s"] / a["cpu_s"] for a, b in zip(
        measures.runs["fixed"], measures.runs["from-schema"])) - 1, 4)
    med = lambda key: round(statistics.median(c[key] for c in changes), 4)  # noqa: E731
    last = changes[-1]
    print(f"\n{args.records:,} JsonConverter orders, exactly-once upsert, medians of {args.repeat} on {machine()}")
    print(f"{'route':12} {'rows/s':>10} {'consumer CPU-s/M':>17} {'start-up off':>13} {'Postgres CPU-s/M':>17}")
    for name, s in (("fixed", fixed), ("from-schema", derived)):
        print(f"{name:12} {s['median']:>10,.0f} {s['cpu_s_per_m']:>17} {s['records_cpu_s_per_m']:>13} "
              f"{s['pg_cpu_s_per_m'] or '-':>17}")
    print(f"from-schema over fixed, consumer CPU per record: {overhead:+.1%} start-up off (budget +3 %), "
          f"{with_startup:+.1%} with it (median of per-repetition ratios)")
    print(f"a field added halfway: first batch after it {med('change_batch_s')} s (one ALTER: "
          f"{last['alters']}), a normal batch {med('normal_batch_s')} s")
    print(f"table before the ALTER: {last['before']['rel']:,} B ({last['before']['total']:,} B with its index), "
          f"after it and its batch: {last['after']['rel']:,} B ({last['after']['total']:,} B); a normal batch adds "
          f"{last['normal_batch_growth']:,} B; file node {'CHANGED: rewritten' if last['rewritten'] else 'kept'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "records": args.records, "repeat": args.repeat, "batch_size": BATCH, "machine": machine(),
        "fixed": fixed, "from_schema": derived, "from_schema_cpu_overhead": overhead,
        "from_schema_cpu_overhead_with_startup": with_startup,
        "change": {"change_batch_s": med("change_batch_s"), "normal_batch_s": med("normal_batch_s"),
                   "runs": changes}}, indent=2, default=str))
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
