"""Shared helpers for benchmarks: the stack to run on, kdg as a subprocess, medians."""

import json
import os
import statistics
import subprocess
import sys
import uuid

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


def median(values):
    return round(statistics.median(values), 1)
