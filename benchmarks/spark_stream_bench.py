"""`kdg spark-stream` exactly-once against `kdg consume` exactly-once and a plain Structured Streaming
`foreachBatch` JDBC append (Spark's own at-least-once path), on the same topic, in the same run.

    .venv/bin/python benchmarks/spark_stream_bench.py [--records N] [--repeat K]

Each repetition drains the same N records of 100 B three ways, in an order that alternates:
- `kdg spark-stream -g exactly-once --trigger available-now` into a fresh table: rows/s over its streaming time
  (the report's duration_s: micro-batches, claims and positions, not the SparkSession start);
- `kdg consume -g exactly-once -e` into a fresh table: its msgs_per_s;
- a plain query: the same Kafka source options and sink-row projection, `trigger(availableNow=True)`,
  `foreachBatch` appending each micro-batch with `DataFrame.write.jdbc` into a table shaped like kdg_events,
  no dedup, no positions: rows over the query's time from start to end.
The figure is the median of each, and the ratio spark-stream / plain (the issue's target: >= 1.0). CPU seconds
per part (Spark's JVM and Python workers, the driver's Python, Postgres, brokers) come from the same
measuring as benchmarks/spark_replay_bench.py. The last line is one JSON object.

    .venv/bin/python benchmarks/spark_stream_bench.py --latency [--latency-rate R] [--latency-seconds S]
        [--triggers 1s,100ms]

End-to-end latency instead: for each trigger, benchmarks/latency_bench.py's run with `kdg spark-stream -g
exactly-once --trigger T` as the pipeline. A steady `kdg produce --rate R` for S seconds into a fresh topic; a
record counts as arrived when the group's position in kdg_offsets, stored after the micro-batch that wrote it,
has passed it (polled every 5 ms): the moment `kdg audit` would call it processed, not the earlier moment its
task committed the row. Latency is that moment minus the record's CreateTime. `last_seen_after_producer_s`
says whether the stream kept up: a few seconds at most, or the figure measures a backlog.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import machine, median, stack  # noqa: E402
from spark_replay_bench import (_KDG_REPORTING_ITSELF, count_rows, create_naive_table, delete_topics,  # noqa: E402
                                drop_tables, jdbc_target, produce, run_measured)

KINDS = ("stream", "consume", "plain")


def run_kind(layout, kind: str, topic: str, table: str, scratch: str) -> tuple[dict, dict]:
    group = f"bench-{table}"
    if kind == "stream":
        return run_measured(layout, [sys.executable, "-c", _KDG_REPORTING_ITSELF, "spark-stream", topic, "-G", group,
                                     "-g", "exactly-once", "--table", table, "--trigger", "available-now",
                                     "--checkpoint", os.path.join(scratch, table), "--json"])
    if kind == "consume":
        return run_measured(layout, [sys.executable, "-c", _KDG_REPORTING_ITSELF, "consume", topic, "-G", group,
                                     "-g", "exactly-once", "--table", table, "-e", "-o", "beginning", "--json"])
    return run_measured(layout, [sys.executable, __file__, "--job", topic, "--table", table,
                                 "--checkpoint", os.path.join(scratch, table)])


def plain_job(topic: str, table: str, checkpoint: str) -> None:
    """The reference: Spark's Kafka source into Postgres by foreachBatch + write.jdbc, drained once."""
    import resource

    from pyspark.sql import functions as F

    from kdg.guarantees import policy_for
    from kdg.kafka.clients import spark_source_options
    from kdg.settings import connection
    from kdg.spark.job import key_expression, sink_rows
    from kdg.spark.session import spark_session

    conn, policy = connection(), policy_for("at-least-once")
    url, props = jdbc_target(conn.pg_dsn)
    with spark_session("local[*]", task_retries=True, echo=lambda t: print(t, file=sys.stderr),
                       app="plain foreachBatch") as run:
        frame = (run.spark.readStream.format("kafka")
                 .options(**spark_source_options(conn.bootstrap_servers, conn.extra, policy))
                 .option("subscribe", topic).option("startingOffsets", "earliest").option("includeHeaders", "true")
                 .load())
        rows = sink_rows(frame, key_expression(None, None, required=False)).withColumn("consumer_group",
                                                                                        F.lit(f"bench-{table}"))
        started = time.monotonic()
        query = (rows.writeStream.option("checkpointLocation", checkpoint).trigger(availableNow=True)
                 .foreachBatch(lambda df, _: df.write.jdbc(url, table, mode="append", properties=props)).start())
        query.awaitTermination()
        duration = time.monotonic() - started
    count = sum(p["numInputRows"] for p in query.recentProgress)
    me = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"rows": count, "duration_s": round(duration, 3), "rows_per_s": round(count / duration, 1),
                      "self_peak_kb": me.ru_maxrss, "self_cpu_s": me.ru_utime + me.ru_stime}))


def rate_of(kind: str, report: dict) -> float:
    if kind == "stream":
        return round(report["rows_in"] / report["duration_s"], 1)
    return report["msgs_per_s"] if kind == "consume" else report["rows_per_s"]


def latency(layout, rate: float, seconds: float, triggers: list[str]) -> None:
    from latency_bench import latency_run

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = []
    for trigger in triggers:
        with tempfile.TemporaryDirectory(prefix="kdg-stream-lat-") as scratch:
            def pipeline(topic, group, guarantee, sink_args, trigger=trigger, scratch=scratch):
                return ["spark-stream", topic, "-G", group, "-g", guarantee, *sink_args, "--trigger", trigger,
                        "--checkpoint", os.path.join(scratch, "checkpoint"), "--json"]

            result = latency_run(layout, "exactly-once", "postgres", rate, seconds, 100, here, pipeline)
        result["trigger"] = trigger
        results.append(result)
        print(f"  trigger {trigger}: p50 {result['p50_ms']} ms, p95 {result['p95_ms']} ms, p99 {result['p99_ms']} ms, "
              f"max {result['max_ms']} ms at {result['achieved_rate']:,.0f}/s; last seen "
              f"{result['last_seen_after_producer_s']} s after the producer; {result['verdict']}; "
              f"{result['consumer_batches']} batches, {result['consumer_cpu_s']} CPU-s", flush=True)
    print(json.dumps({"machine": machine(), "latency": results}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--latency", action="store_true", help="measure end-to-end latency per trigger instead")
    ap.add_argument("--latency-rate", type=float, default=2000.0)
    ap.add_argument("--latency-seconds", type=float, default=60.0)
    ap.add_argument("--triggers", default="1s,100ms", help="comma-separated --trigger values (the default first)")
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--table", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        return plain_job(args.job, args.table, args.checkpoint)

    layout = stack()
    print(f"machine: {machine()}; stack: {layout.brokers} brokers on loopback; Spark local[*]", flush=True)
    if args.latency:
        return latency(layout, args.latency_rate, args.latency_seconds, args.triggers.split(","))
    runs: dict[str, list] = {kind: [] for kind in KINDS}
    topics, tables = [], []
    scratch = tempfile.mkdtemp(prefix="kdg-stream-bench-")
    try:
        topics.append(topic := produce(layout, args.records))
        for rep in range(args.repeat):
            order = KINDS if rep % 2 == 0 else KINDS[::-1]
            for kind in order:
                table = f"bench_{kind}_{rep}"
                tables.append(table)
                if kind == "plain":
                    create_naive_table(layout, table)
                report, used = run_kind(layout, kind, topic, table, scratch)
                assert count_rows(layout, table) == args.records, (kind, report)
                runs[kind].append({"rows_per_s": rate_of(kind, report), "cpu_s": used["cpu_s"],
                                   "machine_busy_cores": used["machine_busy_cores"], "wall_s": used["wall_s"]})
            print(f"  rep {rep + 1}: " + ", ".join(f"{k} {runs[k][-1]['rows_per_s']} rows/s" for k in KINDS),
                  flush=True)
            drop_tables(layout, [f"bench_{kind}_{rep}" for kind in KINDS])
        rate = {kind: median([r["rows_per_s"] for r in runs[kind]]) for kind in KINDS}
        paired = [round(s["rows_per_s"] / p["rows_per_s"], 2) for s, p in zip(runs["stream"], runs["plain"])]
        cpu = {kind: {part: median([r["cpu_s"][part] for r in runs[kind]]) for part in runs[kind][0]["cpu_s"]}
               for kind in KINDS}
        print(f"{args.records} records of 100 B, medians of {args.repeat}: spark-stream exactly-once {rate['stream']} "
              f"rows/s, kdg consume exactly-once {rate['consume']}, plain foreachBatch JDBC append (at-least-once) "
              f"{rate['plain']}; spark-stream / plain {rate['stream'] / rate['plain']:.2f} (target >= 1.0), per "
              f"repetition {paired}, median {statistics.median(paired):.2f}")
        for kind in KINDS:
            print(f"  CPU-s {kind}: " + ", ".join(f"{k} {v}" for k, v in cpu[kind].items()))
        print(json.dumps({"machine": machine(), "records": args.records, "repeat": args.repeat, "rows_per_s": rate,
                          "ratio_stream_plain": round(rate["stream"] / rate["plain"], 3), "paired": paired,
                          "cpu_s": cpu, "runs": runs}))
    finally:
        drop_tables(layout, tables)
        delete_topics(layout, topics)


if __name__ == "__main__":
    main()
