"""Shared helpers for benchmarks: the stack to run on, kdg as a subprocess, medians, CPU accounting."""

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from kdg.machine import machine  # noqa: F401  (re-exported for the scripts)
from kdg.paths import default_state_dir
from kdg.stack import cluster


def stack():
    """The local stack (started if needed) — benchmarks measure the same cluster users run."""
    layout = cluster.resolve_layout(default_state_dir())
    cluster.up(layout, echo=lambda *a: None)
    return layout


# Every kdg child runs as `python -P -m kdg`: without -P, `-m` puts the working directory first on sys.path,
# so from the repository root a --baseline's PYTHONPATH lost to ./kdg and the "before" runs measured the
# current code.
def kdg_json(layout, *args, env=None) -> dict:
    full = {**os.environ, "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers, "KDG_PG_DSN": layout.pg_dsn,
            **(env or {})}
    out = subprocess.run([sys.executable, "-P", "-m", "kdg", *map(str, args), "--json"], capture_output=True, text=True,
                         env=full, check=True)
    return json.loads(out.stdout)


def fresh_topic(prefix: str) -> str:
    return f"bench-{prefix}-{uuid.uuid4().hex[:8]}"


def drop_topic(layout, topic: str) -> None:
    """Delete a topic a measurement is done with: repeated runs of replicated records fill a disk otherwise
    (one full `make bench` with --baseline writes tens of GB across three brokers)."""
    from kdg.kafka.admin import delete_topics

    delete_topics(layout.bootstrap_servers, [topic])


def sql(dsn: str, *statements: tuple) -> list:
    """Run each ``(query, *args)`` in order on one connection to ``dsn``; the last one's rows."""
    import asyncio

    import asyncpg

    async def go():
        conn = await asyncpg.connect(dsn)
        try:
            result = []
            for query, *args in statements:
                result = await conn.fetch(query, *args)
            return result
        finally:
            await conn.close()

    return asyncio.run(go())


def drop_sink_tables(dsn: str, tables: list, *statements: tuple) -> None:
    """Drop benchmark sink tables with what kdg keeps for them: their exactly-once claims and replay rows, which
    kdg files under each table's identity (``public.name``, as :func:`kdg.store.identity.resolve_table` gives
    it), not under the name the benchmark spelled. Then ``statements`` (a group's stored offsets).

    Deleted under the spelled name, nothing matched: every run left its claims in kdg_dedup (84 million
    rows on one stack), and each repetition met a larger claim table than the one before it. Deleted row by
    row, a million claims left a million dead tuples, and autovacuum cleaned them up inside the next run's
    measurement (its Postgres CPU): each claim table is emptied whole, as `kdg db forget` empties it."""
    import asyncio

    import asyncpg

    from kdg.store.identity import resolve_table
    from kdg.store.owners import drop_claims
    from kdg.store.windows import quote_ident

    if not tables:
        return

    async def forget() -> list[str]:  # a plain connection: a baseline's database may be a migration behind
        conn = await asyncpg.connect(dsn)
        try:
            names = [(await resolve_table(conn, t)).text for t in tables]
            for relation in await conn.fetch("SELECT relation FROM kdg_windows WHERE sink_table = ANY($1::text[])",
                                             names):
                try:
                    async with conn.transaction():
                        await drop_claims(conn, relation["relation"], None)
                except asyncpg.UndefinedColumnError:  # an older kdg's claims (a baseline's database): emptied alone
                    await conn.execute(f"TRUNCATE {quote_ident(relation['relation'])}")
            return names
        finally:
            await conn.close()

    names = asyncio.run(forget())
    sql(dsn, *[(f"DROP TABLE IF EXISTS {t}",) for t in names],
        ("DELETE FROM kdg_replays WHERE sink_table = ANY($1::text[])", names), *statements)


def median(values):
    return round(statistics.median(values), 1)


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of the whole machine since boot; busy is anything but idle and iowait."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


@dataclass
class Usage:
    """What one child process cost, and how busy the whole machine was while it ran."""

    wall_s: float
    cpu_s: float        # the child's user + system time (all its threads: librdkafka's, the JVM's)
    busy_cores: float   # the machine's busy cores on average over the child's life (of os.cpu_count())
    rss_mb: float = 0.0  # the child's peak resident set

    def to_dict(self) -> dict:
        return {k: round(v, 2) for k, v in asdict(self).items()}


class Child:
    """A subprocess measured alone: reaped with ``os.wait4``, so its own CPU seconds and peak RSS are known
    even while other children run; stdout and stderr go to temporary files (no pipe to fill up)."""

    def __init__(self, cmd: list[str], env: dict | None = None):
        self.cmd = cmd
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self._ticks, self._started = _machine_ticks(), time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, env=env, text=True)
        self.returncode: int | None = None
        self.usage: Usage | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float | None = None) -> bool:
        """Reap the child if it exits within ``timeout`` seconds (None: however long it takes); whether it did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            pid, status, ru = os.wait4(self.proc.pid, 0 if deadline is None else os.WNOHANG)
            if pid:
                wall = time.perf_counter() - self._started
                busy1, total1 = _machine_ticks()
                busy = (busy1 - self._ticks[0]) / max(total1 - self._ticks[1], 1) * (os.cpu_count() or 1)
                self.returncode = self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.usage = Usage(wall, ru.ru_utime + ru.ru_stime, busy, ru.ru_maxrss / 1024)
            elif time.monotonic() >= deadline:
                return False
            else:
                time.sleep(0.05)
        return True

    def stop(self, grace: float = 30.0) -> None:
        """SIGINT (kdg reports and exits), then SIGKILL after ``grace`` seconds; reaped either way. By pid only."""
        if self.returncode is None:
            os.kill(self.proc.pid, signal.SIGINT)
            if not self.wait(grace):
                os.kill(self.proc.pid, signal.SIGKILL)
                self.wait()

    def output(self) -> tuple[str, str]:
        self._out.seek(0)
        self._err.seek(0)
        return self._out.read(), self._err.read()

    def result(self) -> tuple[str, Usage]:
        """Its stdout and :class:`Usage`, once it exited 0 (else RuntimeError with its stderr's end)."""
        self.wait()
        out, err = self.output()
        if self.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, self.cmd[:6]))} … exited {self.returncode}:\n{err[-3000:]}")
        return out, self.usage


def run_measured(cmd: list[str], env: dict | None = None) -> tuple[str, Usage]:
    """Run ``cmd`` to completion (it must succeed); its stdout and :class:`Usage`."""
    return Child(cmd, env).result()


def proc_stat(pid) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name: state, ppid, …, utime is [11], stime [12]."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_s(pid) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _postmaster(layout) -> int | None:
    """The pid of the stack's Postgres server: the embedded one's, or an external server's if it runs on this
    machine (the parent of a backend of ours); None for a server elsewhere."""
    from kdg.stack import postgres

    if layout.uses_embedded_pg:
        return postgres.pid(layout)
    import asyncio

    import asyncpg

    async def parent() -> int | None:
        conn = await asyncpg.connect(layout.pg_dsn)
        try:  # read while the backend lives: it exits once we close
            proc = Path(f"/proc/{await conn.fetchval('SELECT pg_backend_pid()')}")
            if proc.joinpath("comm").read_text().strip() != "postgres":
                return None  # a pid of this machine, but not our backend: the server is elsewhere
            return int(proc_stat(proc.name)[1])
        except OSError:
            return None  # not a process of this machine
        finally:
            await conn.close()

    return asyncio.run(parent())


def postgres_cpu(layout) -> float | None:
    """CPU seconds the stack's Postgres has used so far: the postmaster with the backends it has reaped
    (cutime, cstime) plus its live children. None for a server not on this machine.

    Take it before and after a measurement; wait a moment after a client disconnects, so its backend is
    reaped (a zombie's stat still counts, but a backend still exiting may add a little).
    """
    root = _postmaster(layout)
    if root is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")

    total = sum(int(f) for f in proc_stat(root)[11:15])  # utime, stime, cutime, cstime
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            child = proc_stat(pid)
        except OSError:
            continue
        if child[1] == str(root):
            total += int(child[11]) + int(child[12])
    return total / tick


def produce_pairs(bootstrap_servers: str, topic: str, partitions: int, pairs) -> None:
    """``(key, value)`` pairs into ``topic`` (made with ``partitions`` if missing), idempotent and acknowledged by
    all replicas: a benchmark's input, produced before anything is measured."""
    from confluent_kafka import Producer

    from kdg.kafka.admin import ensure_topic

    ensure_topic(bootstrap_servers, topic, partitions=partitions)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 20, "acks": "all",
                         "enable.idempotence": True, "compression.type": "lz4", "log_level": 2})
    for key, value in pairs:
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise SystemExit("the benchmark's records were not all acknowledged")
