"""One chaos cell: fresh topics and a group, kdg processes to start and kill, a timeline, an audit.

A cell of one topic (the default) writes the ``kdg_events`` table, or ``kafka:TOPIC-out``. A cell of
N topics (``kdg chaos run --topics N``) produces ``TOPIC-1`` … ``TOPIC-N`` and reads them all with one
``kdg consume`` per member: into one table per topic, named as the topic (``--table '"{topic}"'``), so
a batch's transaction spans tables; or into ``kafka:{topic}-out``, one output per input.
"""

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from kdg.lifecycle import DIE_WITH_PARENT, StopRequested
from kdg.settings import Connection, TableName, table_name
from kdg.stack.layout import StackLayout

# A cell of several topics has them produced and read in small slices (4 KiB record batches, 4 KiB a partition per
# fetch), as under a live load: each fetch brings a few records of every partition, so most batches, and the
# transactions the kill points land in, span topics and tables. Produced and fetched whole, a partition's records
# arrive in one run and most batches hold one topic.
SLICES = {"produce": ("-X", "batch.size=4096"), "consume": ("-X", "max.partition.fetch.bytes=4096")}


@dataclass
class CellResult:
    guarantee: str
    fault: str
    repetition: int
    acked: int = 0
    failed: int = 0
    processed_unique: int = 0
    rows: int = 0
    lost: int = 0
    duplicates: int = 0
    unexpected: int = 0
    produce_msgs_per_s: float = 0.0
    consume_msgs_per_s: float = 0.0
    duration_s: float = 0.0
    verdict: str = ""
    note: str = ""
    fault_fired: bool = False
    zombie_refused_batches: int = 0
    timeline: list = field(default_factory=list)
    progress: list = field(default_factory=list)
    topic: str = ""        # the cell's input topic (the stem of TOPIC-1 … TOPIC-N); deleted after the audit unless kept
    kept: bool = False     # the cell's topics and rows were left in place (--keep, or a failed cell)


class Cell:
    """Runs kdg as real processes for one guarantee × fault × repetition, and records what happened."""

    def __init__(self, layout: StackLayout, guarantee: str, fault: str, repetition: int, messages: int, sink: str,
                 stop=None, topics: int = 1):
        self._stop = stop  # a kdg.lifecycle.Shutdown: once it is requested, no process starts
        self.layout, self.guarantee, self.fault, self.messages = layout, guarantee, fault, messages
        self.topic_count = topics  # records: ``messages`` per topic
        tag = uuid.uuid4().hex[:8]
        self.topic, self.group = f"chaos-{fault}-{tag}", f"chaos-{guarantee}-{tag}"
        self.sink = "postgres" if sink == "postgres" else f"kafka:{self.topic if topics == 1 else '{topic}'}-out"
        self.result = CellResult(guarantee, fault, repetition, topic=self.topic)
        # the cell's own checks use the stack's admin profile; its kdg processes the client user's
        self.conn = Connection(layout.bootstrap_servers, layout.pg_dsn, layout.admin_properties())
        self.started = time.monotonic()
        self.batch = max(50, messages // 20)
        self.checkpoint = checkpoint_dir(layout, tag)  # the spark engine's stream; gone after the cell
        self._sampling = False
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()  # a process starts, or they are all killed: one at a time

    # -- topics and where they go ------------------------------------------------------------
    @property
    def topics(self) -> list[str]:
        """The input topics: the cell's topic, or ``TOPIC-1`` … ``TOPIC-N``."""
        if self.topic_count == 1:
            return [self.topic]
        return [f"{self.topic}-{i}" for i in range(1, self.topic_count + 1)]

    def targets(self) -> list[tuple[str, str, str]]:
        """(input topic, sink, table) to audit: each topic against what its records were written to."""
        if self.topic_count == 1:
            return [(self.topic, self.sink, "kdg_events")]
        if self.sink == "postgres":
            return [(t, "postgres", TableName(None, t).text) for t in self.topics]
        return [(t, self.sink.replace("{topic}", t), "kdg_events") for t in self.topics]

    @property
    def outputs(self) -> list[str]:
        """A Kafka sink's output topics."""
        return [sink[6:] for _, sink, _ in self.targets() if sink.startswith("kafka:")]

    @property
    def tables(self) -> list[str]:
        """The tables of their own the cell's topics were written to (none: they share kdg_events)."""
        return [table for _, sink, table in self.targets() if sink == "postgres" and table != "kdg_events"]

    def transactions_across_tables(self) -> tuple[int, int]:
        """(sink transactions that wrote several of the cell's tables, all of them), told by the rows' consumed_at:
        the time their transaction began (``now()``), the same in every table it wrote."""
        from kdg.store.pg import Store

        with Store(self.layout.pg_dsn) as store:
            found = [table_name(t).sql for t in self.tables]
            found = [t for t in found if store.fetchval("SELECT to_regclass($1) IS NOT NULL", t)]
            if not found:
                return 0, 0
            each = " UNION ALL ".join(f"SELECT DISTINCT consumed_at FROM {t}" for t in found)
            row, = store.fetch(f"SELECT count(*) FILTER (WHERE n > 1) AS spanning, count(*) AS batches FROM "
                               f"(SELECT consumed_at, count(*) AS n FROM ({each}) AS t GROUP BY consumed_at) AS b")
            return row["spanning"], row["batches"]

    def ensure_topics(self, partitions: int) -> None:
        from kdg.kafka.admin import ensure_topic

        for topic in self.topics:
            ensure_topic(self.layout.bootstrap_servers, topic, partitions=partitions, extra=self.conn.extra)

    # -- timeline ----------------------------------------------------------------------------
    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def event(self, text: str) -> None:
        self.result.timeline.append({"t": self.now(), "event": text})

    # -- processes ---------------------------------------------------------------------------
    def _env(self, extra: dict | None) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "KDG_FAULT"}
        env.update({"KDG_BOOTSTRAP_SERVERS": self.layout.bootstrap_servers, "KDG_PG_DSN": self.layout.pg_dsn,
                    DIE_WITH_PARENT: str(os.getpid())})  # a run killed with SIGKILL takes its cell's processes along
        if self.layout.secure:
            env["KDG_KAFKA_CONFIG"] = str(self.layout.client_profile)
        return env | (extra or {})

    def spawn(self, *args, env: dict | None = None) -> subprocess.Popen:
        """Start ``kdg ARGS --json``; once a stop is requested, nothing starts: StopRequested instead."""
        with self._lock:
            if self.stopped():
                raise StopRequested(self.stopped())
            proc = subprocess.Popen([sys.executable, "-m", "kdg", *map(str, args), "--json"], env=self._env(env),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self._procs.append(proc)
        return proc

    def stopped(self) -> str:
        """Why the cell was stopped from outside: the stop signal's name ("" while no stop is requested)."""
        if self._stop is not None and self._stop.requested:
            return self._stop.signal or "stop requested"
        return ""

    def kill_processes(self) -> None:
        """Kill the cell's processes by pid, from any thread (a stop signal's). Once a stop is requested no process
        starts again, so the cell's own thread goes on to its next step and meets StopRequested there."""
        with self._lock:
            self._kill(wait=False)

    def _kill(self, wait: bool) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                if wait:
                    proc.wait()

    def produce(self, *extra, guarantee: str | None = None, wait: bool = True):
        """``messages`` records to each input topic, a producer per topic side by side: finished (see
        :func:`finish_all`), or the running producers (``wait=False``)."""
        slices = SLICES["produce"] if self.topic_count > 1 else ()
        procs = [self.spawn("produce", topic, "-g", guarantee or self.guarantee, "--count", self.messages,
                            "--size", 100, *slices, *extra) for topic in self.topics]
        return finish_all(procs) if wait else procs

    def consume_args(self, *extra) -> list:
        tables = ["--table", '"{topic}"'] if self.tables else []  # a table per topic, named as it
        slices = SLICES["consume"] if self.topic_count > 1 else ()
        return ["consume", *self.topics, "-G", self.group, "-g", self.guarantee, "--sink", self.sink, *tables,
                "--batch-size", self.batch, "--transactional-id", f"kdg-chaos-{self.group}", *slices, *extra]

    def consume(self, *extra, env: dict | None = None) -> subprocess.Popen:
        return self.spawn(*self.consume_args(*extra), env=env)

    def stream(self, *extra, env: dict | None = None) -> subprocess.Popen:
        """`kdg spark-stream` on the cell's topic and group (the spark engine's faults), from the cell's checkpoint."""
        return self.spawn("spark-stream", self.topic, "-G", self.group, "-g", self.guarantee, "--checkpoint",
                          self.checkpoint, "--max-per-batch", self.batch, *extra, env=env)

    def drain(self) -> dict:
        """Consume whatever is left, restarting after a dead sink (e.g. Postgres coming back); a spark fault's
        cell drains with the stream, from its checkpoint."""
        for _ in range(5):
            proc = self.stream("--trigger", "available-now") if self.fault.startswith("spark-") else self.consume("-e")
            code, report, err = finish(proc)
            if code == 0:
                return report
            self.event(f"consumer exited {code}; restarting ({err.strip().splitlines()[-1] if err.strip() else ''})")
            time.sleep(2)
        return {}

    def stop_all(self) -> None:
        self._kill(wait=True)
        shutil.rmtree(self.checkpoint, ignore_errors=True)

    # -- progress ----------------------------------------------------------------------------
    def start_sampling(self, interval: float = 0.5) -> None:
        self._sampling = True
        threading.Thread(target=self._sample, args=(interval,), daemon=True).start()

    def _sample(self, interval: float) -> None:
        from kdg.store.pg import Store

        store = None
        try:
            while self._sampling:
                try:  # Postgres may be restarting (a fault): the progress line just has a gap
                    if self.sink == "postgres":
                        store = store or Store(self.layout.pg_dsn)
                        n = self._pg_delivered(store)
                    else:
                        n = self._kafka_delivered()
                    self.result.progress.append({"t": self.now(), "delivered": int(n)})
                except Exception:
                    if store is not None:
                        store.close()
                    store = None
                time.sleep(interval)
        finally:
            if store is not None:
                store.close()

    def _pg_delivered(self, store) -> int:
        if not self.tables:
            return store.fetchval("SELECT count(*) FROM kdg_events WHERE topic = $1", self.topic)
        sql = [table_name(t).sql for t in self.tables]  # a table not made yet has delivered nothing
        return sum(store.fetchval(f"SELECT count(*) FROM {t}") for t in sql
                   if store.fetchval("SELECT to_regclass($1) IS NOT NULL", t))

    def _kafka_delivered(self) -> int:
        from kdg.kafka.admin import watermarks

        return sum(high - low for out in self.outputs
                   for low, high in watermarks(self.layout.bootstrap_servers, out, self.conn.extra).values())

    def stop_sampling(self) -> None:
        self._sampling = False

    # -- clean-up ----------------------------------------------------------------------------
    def forget(self) -> None:
        """Delete what the cell left behind once it is audited: its topics (input, dead letters, a Kafka sink's
        output) and, in Postgres, its sink rows, exactly-once claims, stored offsets and producer ledger.

        A long matrix otherwise keeps every cell's records three times over on the brokers and once more in
        Postgres (tens of GB over a 100k × 3 run), and a disk that fills makes the next run fail for nothing.
        """
        forget(self.layout.bootstrap_servers, self.layout.pg_dsn, self.conn.extra, self.topics, [self.group],
               self.outputs, self.tables)


def checkpoint_dir(layout: StackLayout, tag: str):
    """Where the cell tagged ``tag`` keeps its spark-stream checkpoint (the spark engine's faults)."""
    return layout.state_dir / "chaos-checkpoints" / tag


def forget(bootstrap: str, dsn: str, extra: dict, topics: list[str], groups: list[str], outputs: list[str] = (),
           tables: list[str] = ()) -> None:
    """Delete a cell's topics (its input ``topics``, a Kafka sink's ``outputs``, the dead-letter topic of each) and
    its rows: kdg_events and the claims filed under its identity, the ``groups``' offsets and replays, the ledger;
    and the cell's own ``tables`` (one per topic), with the claims filed under theirs."""
    from kdg.kafka.admin import delete_topics
    from kdg.sinks.dead_letters import dlq_topic
    from kdg.store.pg import Store

    delete_topics(bootstrap, [t for name in (*topics, *outputs) for t in (name, dlq_topic(name))], extra)
    store = Store(dsn)
    try:
        sink = store.resolve_table("kdg_events").text  # the identity claims are kept under
        for topic in topics:
            for sql, *args in (("DELETE FROM kdg_events WHERE topic = $1", topic),
                               ("DELETE FROM kdg_dedup WHERE sink_table = $1 AND topic = $2", sink, topic),
                               ("DELETE FROM kdg_ledger WHERE topic = $1", topic),
                               ("DELETE FROM kdg_producer_runs WHERE topic = $1", topic)):
                store.execute(sql, *args)
        store.execute("DELETE FROM kdg_offsets WHERE consumer_group = ANY($1::text[])", groups)
        store.execute("DELETE FROM kdg_replays WHERE consumer_group = ANY($1::text[])", groups)
        for table in tables:
            identity = store.resolve_table(table)
            store.execute("DELETE FROM kdg_dedup WHERE sink_table = $1", identity.text)
            store.execute(f"DROP TABLE IF EXISTS {identity.sql}")
    finally:
        store.close()


def finish_all(procs: list[subprocess.Popen], timeout: float = 600) -> tuple[int, dict, str]:
    """Wait for producers run side by side, as one: the first failure's exit code (else 0), their rates
    summed in ``msgs_per_s``, their stderr joined. One process is :func:`finish`'s answer unchanged."""
    if len(procs) == 1:
        return finish(procs[0], timeout)
    done = [finish(proc, timeout) for proc in procs]
    code = next((c for c, _, _ in done if c != 0), 0)
    report = {"msgs_per_s": round(sum(r.get("msgs_per_s", 0.0) for _, r, _ in done), 1)}
    return code, report, "".join(err for _, _, err in done)


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, dict, str]:
    """Wait for a kdg process: (exit code, its --json report or {}, stderr)."""
    import json

    out, err = proc.communicate(timeout=timeout)
    try:
        report = json.loads(out) if out.strip() else {}
    except ValueError:
        try:  # a stream of JSON lines (spark-stream): the report is the last
            report = json.loads(out.strip().splitlines()[-1])
        except ValueError:
            report = {}
    return proc.returncode, report, err
