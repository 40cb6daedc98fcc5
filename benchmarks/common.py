"""Shared helpers for benchmarks: the stack to run on, kdg as a subprocess, medians, CPU accounting."""

import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass

from kdg.machine import machine  # noqa: F401  (re-exported for the scripts)
from kdg.paths import default_state_dir
from kdg.stack import cluster


def stack():
    """The local stack (started if needed) — benchmarks measure the same cluster users run."""
    layout = cluster.resolve_layout(default_state_dir())
    cluster.up(layout, echo=lambda *a: None)
    return layout


def kdg_json(layout, *args, env=None) -> dict:
    full = {**os.environ, "KDG_BOOTSTRAP_SERVERS": layout.bootstrap_servers, "KDG_PG_DSN": layout.pg_dsn,
            **(env or {})}
    out = subprocess.run([sys.executable, "-m", "kdg", *map(str, args), "--json"], capture_output=True, text=True,
                         env=full, check=True)
    return json.loads(out.stdout)


def fresh_topic(prefix: str) -> str:
    return f"bench-{prefix}-{uuid.uuid4().hex[:8]}"


def drop_topic(layout, topic: str) -> None:
    """Delete a topic a measurement is done with: repeated runs of replicated records fill a disk otherwise
    (one full `make bench` with --baseline writes tens of GB across three brokers)."""
    from kdg.kafka.clients import admin_client

    admin = admin_client(layout.bootstrap_servers)  # held until the answer: a destroyed client fails its futures
    admin.delete_topics([topic], operation_timeout=30)[topic].result(60)


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

    def to_dict(self) -> dict:
        return {k: round(v, 2) for k, v in asdict(self).items()}


def run_measured(cmd: list[str], env: dict | None = None) -> tuple[str, Usage]:
    """Run ``cmd`` to completion (it must succeed); its stdout and :class:`Usage`. One child at a time."""
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, total0 = _machine_ticks()
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    busy1, total1 = _machine_ticks()
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} … exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    cpu = (after_children.ru_utime - before_children.ru_utime) + (after_children.ru_stime - before_children.ru_stime)
    busy = (busy1 - busy0) / max(total1 - total0, 1) * (os.cpu_count() or 1)
    return proc.stdout, Usage(wall, cpu, busy)
