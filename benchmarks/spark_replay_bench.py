"""`kdg spark-replay` exactly-once against a naive Spark JDBC append of the same range, in the same run.

    .venv/bin/python benchmarks/spark_replay_bench.py [--records N] [--repeat K] [--big M]
    make bench-spark     # --records 1000000 --repeat 3 --big 4000000

1. `kdg spark-replay --guarantee exactly-once` rows/s over N records of 100 B into a fresh sink table per
   repetition, vs a naive Spark job that reads the same range with the same Kafka source
   (kdg.spark.job.kafka_frame + sink_rows, kdg.spark.session.spark_session) and appends it with
   DataFrame.write.jdbc into a fresh table shaped like kdg_events, without dedup. Both timed the same way:
   the job alone (kdg: the report's duration_s), not the SparkSession start. Medians of K runs, the ratio
   kdg/naive, and idempotence: a second exactly-once run over the same range into the same table writes 0 rows.
2. Where the time goes: the same range read and dropped (a noop write: Kafka read and the sink_rows
   projection, all in the JVM), and read into Python workers through mapInArrow and to_pylist as kdg's
   writer receives it, without Postgres.
3. CPU seconds each part used in every run (Spark's JVM and Python workers, the driver's Python, the stack's
   Postgres and brokers): on a shared machine they say more than the wall clock about what bounds the figure.
4. Peak memory of the kdg process over N and over M (--big) records: its own Python RSS, the Spark driver
   JVM's (sampled VmHWM; in local mode it also hosts the executors) and the largest Python worker's.
Every Spark job runs in a fresh process, so no JVM is warmer than another. The last line is one JSON object.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

sys.path.insert(0, os.path.dirname(__file__))
from common import drop_sink_tables, fresh_topic, kdg_json, machine, median, sql, stack  # noqa: E402

GUARANTEE = "exactly-once"
KINDS = ("kdg", "naive", "noop", "arrow")
_TICK = os.sysconf("SC_CLK_TCK")
# `kdg …` as usual, reporting its own peak RSS and CPU time on the way out
_KDG_REPORTING_ITSELF = (
    "import atexit, resource, sys\n"
    "def report():\n"
    "    me = resource.getrusage(resource.RUSAGE_SELF)\n"
    "    print(f'\\nKDG_SELF {me.ru_maxrss} {me.ru_utime + me.ru_stime}', file=sys.stderr)\n"
    "atexit.register(report)\n"
    "sys.argv[0] = 'kdg'\n"
    "from kdg.cli import main\n"
    "main()\n")


# -- processes: memory and CPU -----------------------------------------------------------------
def _processes() -> dict[int, list[str]]:
    """``/proc/<pid>/stat`` of every process, the fields after the command name (state, ppid, …)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            found[int(stat.parent.name)] = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
    return found


def _cpu_s(fields: list[str], reaped_children: bool = False) -> float:
    """utime + stime (and, if asked, the CPU of children it waited for) in seconds."""
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped_children else 0)
    return ticks / _TICK


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def machine_cpu() -> float:
    """CPU seconds the whole machine has been busy since boot (anything but idle and iowait), from /proc/stat."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


def stack_cpu(layout) -> dict[str, float]:
    """CPU seconds used so far by the stack's Postgres (postmaster, live and exited backends) and its brokers."""
    procs = _processes()
    used = {"postgres": 0.0, "brokers": 0.0}
    pid_file = layout.state_dir / "postgres" / "data" / "postmaster.pid"
    if pid_file.exists():
        postmaster = int(pid_file.read_text().split()[0])
        used["postgres"] = _cpu_s(procs[postmaster], reaped_children=True) + sum(
            _cpu_s(f) for pid, f in procs.items() if int(f[1]) == postmaster)
    marks = [str(layout.node_dir(n)).encode() for n in layout.node_ids]
    used["brokers"] = sum(_cpu_s(f) for pid, f in procs.items()
                          if any(m in arg for arg in _cmdline(pid) for m in marks))
    return used


class Watch:
    """While a command runs, samples its descendants: the Spark driver JVM (in local mode it also runs the
    executors) and Spark's Python workers — their peak RSS (VmHWM) and CPU seconds."""

    def __init__(self, root: int, every_s: float = 0.2):
        self.root, self.every_s, self.xmx = root, every_s, None
        self.seen: dict[int, dict] = {}   # pid -> {"kind", "peak_mb", "cpu_s"}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._done.wait(self.every_s):
            procs = _processes()
            for pid in _descendants(procs, self.root):
                kind = self._kind(pid)  # asked every time: a fork samples as its parent until it execs
                try:
                    found = re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
                except OSError:
                    continue
                if kind and found:  # no VmHWM once a process is a zombie
                    last = self.seen.setdefault(pid, {"kind": kind, "peak_mb": 0, "cpu_s": 0.0})
                    last["kind"] = kind
                    last["peak_mb"] = max(last["peak_mb"], int(found.group(1)) // 1024)
                    last["cpu_s"] = _cpu_s(procs[pid])

    def _kind(self, pid: int) -> str | None:
        cmdline = _cmdline(pid)
        if b"org.apache.spark.launcher.Main" in cmdline:  # spark-class's launcher JVM: it only builds the command
            return None
        if b"org.apache.spark.deploy.SparkSubmit" in cmdline:
            self.xmx = next((a.decode() for a in cmdline if a.startswith(b"-Xmx")), self.xmx or "no -Xmx")
            return "jvm"
        return "worker" if cmdline and b"python" in cmdline[0] else None

    def stop(self) -> dict:
        self._done.set()
        self._thread.join()
        of = lambda kind, what: [p[what] for p in self.seen.values() if p["kind"] == kind]  # noqa: E731
        return {"jvm_peak_mb": max(of("jvm", "peak_mb"), default=0), "jvm_xmx": self.xmx,
                "worker_peak_mb": max(of("worker", "peak_mb"), default=0), "workers": len(of("worker", "peak_mb")),
                "cpu_s": {"spark_jvm": round(sum(of("jvm", "cpu_s")), 1),
                          "python_workers": round(sum(of("worker", "cpu_s")), 1)}}


def _descendants(procs: dict[int, list[str]], root: int) -> list[int]:
    found, frontier = [], {root}
    while frontier:
        frontier = {pid for pid, fields in procs.items() if int(fields[1]) in frontier}
        found += frontier
    return found


def run_measured(layout, cmd: list[str]) -> tuple[dict, dict]:
    """Run ``cmd`` (it prints one JSON object) under a :class:`Watch`; (its JSON, memory and CPU used)."""
    env = {**os.environ, "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers, "KDG_PG_DSN": layout.pg_dsn}
    before, busy, started = stack_cpu(layout), machine_cpu(), time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    watch = Watch(proc.pid)
    out, err = proc.communicate()
    used = watch.stop()
    after, wall = stack_cpu(layout), time.monotonic() - started
    used["wall_s"], used["machine_busy_cores"] = round(wall, 1), round((machine_cpu() - busy) / wall, 2)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}… exited {proc.returncode}:\n{err[-3000:]}")
    try:
        report = json.loads(out)
    except json.JSONDecodeError:  # a stream of JSON lines (spark-stream): the report is the last
        report = json.loads(out.strip().splitlines()[-1])
    if found := re.search(r"KDG_SELF (\d+) ([\d.]+)", err):
        report["self_peak_kb"], report["self_cpu_s"] = int(found.group(1)), float(found.group(2))
    used["self_peak_mb"] = report.pop("self_peak_kb") // 1024
    used["cpu_s"]["driver_python"] = round(report.pop("self_cpu_s"), 1)
    used["cpu_s"].update({k: round(after[k] - before[k], 1) for k in after})
    used["cpu_s"]["total"] = round(sum(used["cpu_s"].values()), 1)
    return report, used


def kdg_replay(layout, topic: str, table: str) -> tuple[dict, dict]:
    return run_measured(layout, [sys.executable, "-c", _KDG_REPORTING_ITSELF, "spark-replay", topic,
                                 "--guarantee", GUARANTEE, "--group", f"bench-{table}", "--table", table, "--json"])


def spark_job(layout, kind: str, topic: str, table: str = "") -> tuple[dict, dict]:
    return run_measured(layout, [sys.executable, __file__, "--job", kind, "--topic", topic, "--table", table])


# -- the reference jobs (run in a child process: `--job naive|noop|arrow`) ----------------------------
def jdbc_target(dsn: str) -> tuple[str, dict[str, str]]:
    """``postgresql://user:pass@host:port/db`` → a JDBC URL and the driver's properties.

    ``stringtype=unspecified`` lets Postgres cast the headers string into the sink's jsonb column.
    """
    parts = urlsplit(dsn)
    query = "&".join(q for q in [parts.query, "stringtype=unspecified"] if q)
    props = {"driver": "org.postgresql.Driver", "user": unquote(parts.username or "")}
    if parts.password is not None:
        props["password"] = unquote(parts.password)
    return f"jdbc:postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}?{query}", props


def _to_python(batches):
    """kdg's writer without Postgres: Arrow columns to Python rows, each key checked and remembered."""
    import pyarrow as pa

    from kdg.spark.writer import COLUMNS

    read, seen = 0, set()
    for batch in batches:
        for row in zip(*[batch.column(name).to_pylist() for name in COLUMNS]):
            read += 1
            if row[0] is None:
                raise ValueError("keyless record")
            seen.add(row[0])
    yield pa.RecordBatch.from_pylist([{"rows": read}])


def run_job(kind: str, topic: str, table: str) -> None:
    import resource

    from pyspark.sql import functions as F

    from kdg.guarantees import policy_for
    from kdg.kafka.admin import watermarks
    from kdg.kafka.clients import spark_source_options
    from kdg.settings import connection
    from kdg.spark.job import kafka_frame, key_expression, sink_rows
    from kdg.spark.session import spark_session

    conn, policy = connection(), policy_for(GUARANTEE)
    ranges = watermarks(conn.bootstrap_servers, topic, isolation=policy.isolation_level)
    started = time.monotonic()
    with spark_session("local[*]", task_retries=policy.spark_task_retries,
                       echo=lambda t: print(t, file=sys.stderr)) as run:
        spark = run.spark
        job_started = time.monotonic()
        frame = kafka_frame(spark, topic, ranges,
                            source_options=spark_source_options(conn.bootstrap_servers, conn.extra, policy))
        rows = sink_rows(frame, key_expression(None, None, required=True))
        if kind == "naive":
            url, props = jdbc_target(conn.pg_dsn)
            rows.withColumn("consumer_group", F.lit(f"bench-{table}")).write.jdbc(url, table, mode="append",
                                                                                   properties=props)
            count = sum(e - s for s, e in ranges.values())
        elif kind == "noop":
            rows.write.format("noop").mode("overwrite").save()
            count = sum(e - s for s, e in ranges.values())
        else:
            count = sum(r["rows"] for r in rows.mapInArrow(_to_python, "rows long").collect())
        duration = time.monotonic() - job_started
    me = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"rows": count, "duration_s": round(duration, 3), "rows_per_s": round(count / duration, 1),
                      "spark_start_s": round(job_started - started, 3), "self_peak_kb": me.ru_maxrss,
                      "self_cpu_s": me.ru_utime + me.ru_stime}))


# -- Postgres ----------------------------------------------------------------------------------
def count_rows(layout, table: str) -> int:
    return sql(layout.pg_dsn, (f"SELECT count(*) AS n FROM {table}",))[0]["n"]


def drop_tables(layout, tables: list[str]) -> None:
    """Benchmark tables, their dedup claims, replay rows and stored offsets go; kdg_dedup is vacuumed so every
    repetition meets the same dedup table."""
    if not tables:
        return
    drop_sink_tables(layout.pg_dsn, tables,
        ("DELETE FROM kdg_offsets WHERE consumer_group = ANY($1::text[])", [f"bench-{t}" for t in tables]),
        ("VACUUM kdg_dedup",))


def create_naive_table(layout, table: str) -> None:
    """The same shape as kdg's sink table (kdg's ensure_sink_table), so the comparison is the write path alone."""
    sql(layout.pg_dsn, (f"CREATE TABLE {table} (LIKE kdg_events INCLUDING DEFAULTS INCLUDING INDEXES)",))


# -- the run -----------------------------------------------------------------------------------
def produce(layout, records: int) -> str:
    topic = fresh_topic(f"replay{records}")
    kdg_json(layout, "produce", topic, "-g", "at-least-once", "--count", records, "--size", 100, "--no-ledger")
    return topic


def delete_topics(layout, topics: list[str]) -> None:
    from kdg.kafka.admin import delete_topics

    delete_topics(layout.bootstrap_servers, topics)


def versions(layout) -> dict:
    import pyspark

    from kdg.spark.jars import spark_jars
    from kdg.stack.jars import kafka_version

    jars = {p.name for p in spark_jars(echo=lambda t: None)}
    pick = lambda prefix: next((j[len(prefix):-4] for j in sorted(jars) if j.startswith(prefix)), "?")  # noqa: E731
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    return {"spark": pyspark.__version__, "kafka_brokers": kafka_version(),
            "spark_kafka_clients": pick("kafka-clients-"), "postgres": sql(layout.pg_dsn, ("SHOW server_version",))[0][0],
            "pgjdbc": pick("postgresql-"), "java": java}


def measure(layout, args, topic: str, rep: int, runs: dict) -> dict | None:
    """One repetition: kdg and naive (order alternating), then the two read-only passes; each run into ``runs``.
    The first also re-runs kdg into the same table and returns what that second run wrote."""
    kdg_table, naive_table = rep_tables(rep)
    create_naive_table(layout, naive_table)
    for kind in (("kdg", "naive") if rep % 2 == 0 else ("naive", "kdg")):
        if kind == "kdg":
            report, used = kdg_replay(layout, topic, kdg_table)
            assert report["rows_written"] == args.records == count_rows(layout, kdg_table), report
        else:
            report, used = spark_job(layout, "naive", topic, naive_table)
            assert count_rows(layout, naive_table) == args.records
        runs[kind].append({k: report[k] for k in ("rows_per_s", "duration_s", "spark_start_s", "tasks")
                           if k in report} | used)
    again = None
    if rep == 0:
        again, _ = kdg_replay(layout, topic, kdg_table)
        assert again["rows_written"] == 0 and again["duplicates_dropped"] == args.records, again
        again = {k: again[k] for k in ("rows_read", "rows_written", "duplicates_dropped", "duration_s", "rows_per_s")}
        print(f"  idempotence: second exactly-once run into {kdg_table}: rows_read {again['rows_read']}, "
              f"rows_written {again['rows_written']}, duplicates_dropped {again['duplicates_dropped']} "
              f"({again['rows_per_s']} rows/s, all keys already claimed)")
    for kind in ("noop", "arrow"):
        report, used = spark_job(layout, kind, topic)
        runs[kind].append({k: report[k] for k in ("rows_per_s", "duration_s", "spark_start_s")} | used)
    last = {kind: runs[kind][-1] for kind in KINDS}
    print(f"  rep {rep + 1}: kdg {last['kdg']['rows_per_s']} rows/s ({last['kdg']['duration_s']} s), naive jdbc "
          f"{last['naive']['rows_per_s']} rows/s ({last['naive']['duration_s']} s), ratio "
          f"{last['kdg']['rows_per_s'] / last['naive']['rows_per_s']:.2f}; read+noop {last['noop']['rows_per_s']}, "
          f"read into python {last['arrow']['rows_per_s']} rows/s", flush=True)
    return again


def rep_tables(rep: int) -> tuple[str, str]:
    return f"bench_replay_{rep}", f"bench_naive_{rep}"


def worst(runs: list[dict]) -> dict:
    """The highest of each memory peak over several runs."""
    return {k: max(r[k] for r in runs) if k != "jvm_xmx" else runs[0][k]
            for k in ("self_peak_mb", "jvm_peak_mb", "jvm_xmx", "worker_peak_mb", "workers")}


def cpu_table(runs: dict) -> dict:
    """Median CPU seconds per part of the machine, for each kind of run; printed as a table."""
    parts = ("spark_jvm", "python_workers", "driver_python", "postgres", "brokers", "total")
    table = {kind: {"job_s": median([r["duration_s"] for r in runs[kind]]),
                    "wall_s": median([r["wall_s"] for r in runs[kind]]),
                    "machine_busy_cores": round(statistics.median([r["machine_busy_cores"] for r in runs[kind]]), 2)}
             | {p: median([r["cpu_s"][p] for r in runs[kind]]) for p in parts} for kind in KINDS}
    print("CPU seconds per run, medians (the whole process incl. Spark start-up; Postgres and brokers: the stack's; "
          "machine: cores busy with anything, other work included):")
    print(f"  {'run':<6}{'job s':>7}{'wall s':>8}" + "".join(f"{p:>15}" for p in parts) + f"{'machine':>9}")
    for kind, row in table.items():
        print(f"  {kind:<6}{row['job_s']:>7}{row['wall_s']:>8}" + "".join(f"{row[p]:>15}" for p in parts)
              + f"{row['machine_busy_cores']:>9}")
    return table


def what_bounds(table: dict, tasks: int) -> str:
    """The line saying what bounds kdg's figure: its job time split by the read-only passes, how busy the
    cores were, and the CPU it spends beyond the naive job's."""
    t = {kind: table[kind]["job_s"] for kind in KINDS}
    extra = {p: round(table["kdg"][p] - table["naive"][p], 1)
             for p in ("spark_jvm", "python_workers", "driver_python", "postgres", "brokers")}
    busy = {kind: table[kind]["total"] / table[kind]["wall_s"] for kind in ("kdg", "naive")}
    cores, machine_busy = os.cpu_count(), table["kdg"]["machine_busy_cores"]
    return (f"what bounds it: of kdg's {t['kdg']} s job, {t['noop']} s is reading Kafka into Spark (noop pass), "
            f"{t['arrow'] - t['noop']:+.1f} s handing the rows to Python workers, {t['kdg'] - t['arrow']:+.1f} s "
            f"writing to Postgres. Its run kept {busy['kdg']:.1f} of {cores} cores busy (naive {busy['naive']:.1f}), "
            f"the machine {machine_busy} with other work: "
            + ("CPU-bound" if machine_busy >= 0.85 * cores else
               f"not CPU-saturated, so partly waits: a task stops reading while its chunk is written, and {tasks} "
               f"tasks share {cores} slots") + ". CPU-s kdg spends beyond the naive job: "
            + ", ".join(f"{k} {v:+}" for k, v in extra.items()) + f" (most: {max(extra, key=extra.get)})")


def memory_line(label: str, peaks: dict) -> str:
    return (f"{label}: kdg python {peaks['self_peak_mb']} MB, Spark driver JVM {peaks['jvm_peak_mb']} MB "
            f"({peaks['jvm_xmx']}), largest python worker {peaks['worker_peak_mb']} MB ({peaks['workers']} workers)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big", type=int, default=0, help="also replay this many records for the memory comparison")
    ap.add_argument("--job", choices=("naive", "noop", "arrow"), help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--table", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        return run_job(args.job, args.topic, args.table)

    layout = stack()
    about = versions(layout)
    print(f"machine: {machine()}; stack: {layout.brokers} brokers on loopback; Spark local[*]")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in about.items()), flush=True)
    runs, idempotence = {kind: [] for kind in KINDS}, None
    topics, tables = [], [t for rep in range(args.repeat) for t in rep_tables(rep)] + ["bench_replay_big"]
    try:
        started = time.monotonic()
        topics.append(topic := produce(layout, args.records))
        print(f"produced {args.records} x 100 B to {topic} in {time.monotonic() - started:.0f} s", flush=True)
        for rep in range(args.repeat):
            idempotence = measure(layout, args, topic, rep, runs) or idempotence
            drop_tables(layout, list(rep_tables(rep)))
        rate = {kind: median([r["rows_per_s"] for r in runs[kind]]) for kind in KINDS}
        paired = [round(k["rows_per_s"] / n["rows_per_s"], 2) for k, n in zip(runs["kdg"], runs["naive"])]
        print(f"spark-replay {GUARANTEE} x {args.records}: kdg {rate['kdg']} rows/s vs naive write.jdbc "
              f"{rate['naive']} rows/s: ratio {rate['kdg'] / rate['naive']:.2f} (target >= 1.0); ratio within each "
              f"repetition {paired}, median {statistics.median(paired):.2f}")
        print(f"same range, no write: read+noop {rate['noop']} rows/s, read into python (mapInArrow, to_pylist) "
              f"{rate['arrow']} rows/s")
        table = cpu_table(runs)
        print(what_bounds(table, runs["kdg"][0]["tasks"]))
        result = {"machine": machine(), "versions": about, "records": args.records, "repeat": args.repeat,
                  "rows_per_s": rate, "ratio": round(rate["kdg"] / rate["naive"], 3), "paired_ratios": paired,
                  "idempotence": idempotence, "cpu_s": table,
                  "memory": {str(args.records): worst(runs["kdg"])}, "runs": runs}
        if args.big:
            started = time.monotonic()
            topics.append(big_topic := produce(layout, args.big))
            print(f"produced {args.big} x 100 B to {big_topic} in {time.monotonic() - started:.0f} s", flush=True)
            report, used = kdg_replay(layout, big_topic, "bench_replay_big")
            assert report["rows_written"] == args.big, report
            result["memory"][str(args.big)] = worst([used])
            result["big"] = {k: report[k] for k in ("rows_per_s", "duration_s")} | {"cpu_s": used["cpu_s"]}
            print(f"kdg over {args.big}: {report['rows_per_s']} rows/s ({report['duration_s']} s)")
        print("peak memory of `kdg spark-replay` (local mode: the driver JVM also runs the executors; the Python "
              "workers are Spark's):")
        for label, peaks in result["memory"].items():
            print("  " + memory_line(f"{int(label):>9} records", peaks))
        print(json.dumps(result))
    finally:
        drop_tables(layout, tables)
        delete_topics(layout, topics)


if __name__ == "__main__":
    main()
