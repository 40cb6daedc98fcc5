"""Where kdg keeps things: the files shipped inside the package, the download cache and the stack state."""

import os
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from kdg.errors import MissingComponent


def resource(*parts: str) -> Traversable:
    """A file or folder under ``kdg/resources``, found the same way in a checkout and in an installed wheel."""
    return files("kdg").joinpath("resources", *parts)


def resource_path(*parts: str) -> Path:
    """A shipped file as a real path on disk, for programs that open it themselves (Maven's ``-f``)."""
    path = Path(str(resource(*parts)))
    if not path.is_file():
        raise MissingComponent(f"this kdg install has no file resources/{'/'.join(parts)} on disk "
                               "(broken or zipped package?): reinstall kdg with pip")
    return path


def kafka_pom() -> Path:
    """The pom pinning the Apache Kafka jars of the local stack."""
    return resource_path("maven", "kafka-pom.xml")


def spark_pom() -> Path:
    """The pom of Spark's Kafka connector (its version is PySpark's, given to Maven)."""
    return resource_path("maven", "spark-pom.xml")


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
