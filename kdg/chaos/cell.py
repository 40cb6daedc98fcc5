"""One chaos cell: a fresh topic and group, kdg processes to start and kill, a timeline, an audit."""

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from kdg.lifecycle import DIE_WITH_PARENT, StopRequested
from kdg.settings import Connection
from kdg.stack.layout import StackLayout


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
    topic: str = ""        # the cell's input topic; its data is deleted after the audit unless kept
    kept: bool = False     # the cell's topics and rows were left in place (--keep, or a failed cell)


class Cell:
    """Runs kdg as real processes for one guarantee × fault × repetition, and records what happened."""

    def __init__(self, layout: StackLayout, guarantee: str, fault: str, repetition: int, messages: int, sink: str,
                 stop=None):
        self._stop = stop  # a kdg.lifecycle.Shutdown: once it is requested, no process starts
        self.layout, self.guarantee, self.fault, self.messages = layout, guarantee, fault, messages
        tag = uuid.uuid4().hex[:8]
        self.topic, self.group = f"chaos-{fault}-{tag}", f"chaos-{guarantee}-{tag}"
        self.sink = "postgres" if sink == "postgres" else f"kafka:{self.topic}-out"
        self.result = CellResult(guarantee, fault, repetition, topic=self.topic)
        # the cell's own checks use the stack's admin profile; its kdg processes the client user's
        self.conn = Connection(layout.bootstrap_servers, layout.pg_dsn, layout.admin_properties())
        self.started = time.monotonic()
        self.batch = max(50, messages // 20)
        self.checkpoint = checkpoint_dir(layout, tag)  # the spark engine's stream; gone after the cell
        self._sampling = False
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()  # a process starts, or they are all killed: one at a time

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
        proc = self.spawn("produce", self.topic, "-g", guarantee or self.guarantee, "--count", self.messages,
                          "--size", 100, *extra)
        return finish(proc) if wait else proc

    def consume_args(self, *extra) -> list:
        return ["consume", self.topic, "-G", self.group, "-g", self.guarantee, "--sink", self.sink,
                "--batch-size", self.batch, "--transactional-id", f"kdg-chaos-{self.group}", *extra]

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
                        n = store.fetchval("SELECT count(*) FROM kdg_events WHERE topic = $1", self.topic)
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

    def _kafka_delivered(self) -> int:
        from kdg.kafka.admin import watermarks

        return sum(high - low for low, high in watermarks(self.layout.bootstrap_servers, self.sink[6:],
                                                                   self.conn.extra).values())

    def stop_sampling(self) -> None:
        self._sampling = False

    # -- clean-up ----------------------------------------------------------------------------
    def forget(self) -> None:
        """Delete what the cell left behind once it is audited: its topics (input, dead letters, a Kafka sink's
        output) and, in Postgres, its sink rows, exactly-once claims, stored offsets and producer ledger.

        A long matrix otherwise keeps every cell's records three times over on the brokers and once more in
        Postgres (tens of GB over a 100k × 3 run), and a disk that fills makes the next run fail for nothing.
        """
        outputs = [self.sink[6:]] if self.sink.startswith("kafka:") else []
        forget(self.layout.bootstrap_servers, self.layout.pg_dsn, self.conn.extra, self.topic, [self.group], outputs)


def checkpoint_dir(layout: StackLayout, tag: str):
    """Where the cell tagged ``tag`` keeps its spark-stream checkpoint (the spark engine's faults)."""
    return layout.state_dir / "chaos-checkpoints" / tag


def forget(bootstrap: str, dsn: str, extra: dict, topic: str, groups: list[str], outputs: list[str] = ()) -> None:
    """Delete a cell's topics (``topic``, a Kafka sink's ``outputs``, the dead-letter topic of each) and its rows:
    kdg_events and the claims filed under its identity, the ``groups``' offsets and replays, the ledger."""
    from kdg.kafka.admin import delete_topics
    from kdg.sinks.dead_letters import dlq_topic
    from kdg.store.pg import Store

    delete_topics(bootstrap, [t for name in (topic, *outputs) for t in (name, dlq_topic(name))], extra)
    store = Store(dsn)
    try:
        sink = store.resolve_table("kdg_events").text  # the identity claims are kept under
        for sql, *args in (("DELETE FROM kdg_events WHERE topic = $1", topic),
                           ("DELETE FROM kdg_dedup WHERE sink_table = $1 AND topic = $2", sink, topic),
                           ("DELETE FROM kdg_offsets WHERE consumer_group = ANY($1::text[])", groups),
                           ("DELETE FROM kdg_replays WHERE consumer_group = ANY($1::text[])", groups),
                           ("DELETE FROM kdg_ledger WHERE topic = $1", topic),
                           ("DELETE FROM kdg_producer_runs WHERE topic = $1", topic)):
            store.execute(sql, *args)
    finally:
        store.close()


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
