"""Where kdg keeps things: the project's own files, the download cache and the stack state."""

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SQL_DIR = PROJECT_ROOT / "sql"
KAFKA_POM = PROJECT_ROOT / "compose" / "pom.xml"
SPARK_POM = PROJECT_ROOT / "compose" / "spark-pom.xml"


def cache_dir() -> Path:
    """Downloaded jars, shared by every stack of this user (``KDG_CACHE`` overrides)."""
    if env := os.environ.get("KDG_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kdg"


def default_state_dir() -> Path:
    """Data, logs and pids of the local stack (``KDG_STATE_DIR`` overrides)."""
    if env := os.environ.get("KDG_STATE_DIR"):
        return Path(env)
    return cache_dir() / "stack"
