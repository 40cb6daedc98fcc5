"""A class-data-sharing archive of Spark's driver classes, so a Spark command's JVM starts a third sooner.

Every `kdg spark-replay` and `kdg spark-stream` starts a driver JVM that loads, verifies and links thousands
of Spark's classes before the first record is read. Java's class-data sharing (CDS) maps them, already
parsed and verified, from one file. A 3,000-record replay on the local stack (quiet 2-core machine, three
runs each, interleaved): Spark started in 6.6-7.5 s instead of 10.8-11.6 s, and the whole command took
19.5-21.6 s instead of 25.1-30.7 s.

An archive fits exactly one Java and one PySpark install: the JVM checks that its class path (PySpark's
``jars`` folder) is the one it was made from, and ignores it otherwise. So its name is a digest of the
Java binary and of every jar's name, size and time (:func:`archive_path`).

`kdg stack fetch` (which `make setup` runs) makes it once, in about a minute: a small local Spark
job whose JVM writes the classes it loaded when it exits (:func:`build`). A Spark command uses the
archive when it is there and never makes one on the way (:func:`java_options`).
``KDG_SPARK_CLASS_ARCHIVE=off`` leaves it unused.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from kdg.errors import DeliveryError
from kdg.paths import cache_dir

OFF_ENV = "KDG_SPARK_CLASS_ARCHIVE"
_MIN_BYTES = 1 << 20  # a JVM that died while writing leaves less than this


def _folder() -> Path:
    return cache_dir() / "spark-classes"


def _jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def archive_path() -> Path:
    """Where this Java's and this PySpark's archive is, or would be."""
    from kdg.stack.jars import require_java

    java = Path(require_java()).resolve()
    digest = hashlib.sha256(f"{java}|{java.stat().st_mtime_ns}|{_jars_dir()}".encode())
    for jar in sorted(_jars_dir().glob("*.jar")):
        st = jar.stat()
        digest.update(f"|{jar.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return _folder() / f"spark-{digest.hexdigest()[:16]}.jsa"


def java_options() -> str:
    """The driver JVM's option that maps the archive, or ``""`` when there is none (or it is turned off)."""
    if os.environ.get(OFF_ENV, "").lower() in ("off", "0", "false", "no"):
        return ""
    try:
        path = archive_path()
    except Exception:  # noqa: BLE001 - no Java, no PySpark: the session's own checks say so
        return ""
    return f'-XX:SharedArchiveFile="{path}"' if path.is_file() else ""


def build(echo=print, timeout: float = 600) -> Path:
    """Make the archive if it is missing (a local Spark job in a child process); its path."""
    path = archive_path()
    if path.is_file():
        return path
    partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
    echo("making Spark's class archive (once per Java and PySpark install; about a minute)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _forget_stale(path.parent)
        proc = subprocess.run([sys.executable, "-m", "kdg.spark.classes", str(partial)], capture_output=True,
                              text=True, timeout=timeout)
        if proc.returncode != 0 or not partial.is_file() or partial.stat().st_size < _MIN_BYTES:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise DeliveryError(f"could not make Spark's class archive: {lines[-1] if lines else 'no output'}")
        os.replace(partial, path)
        path.with_suffix(".json").write_text(json.dumps({"jars": str(_jars_dir()), "archive": path.name}))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeliveryError(f"could not make Spark's class archive in {path.parent}: {exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    return path


def _forget_stale(folder: Path) -> None:
    """Archives of PySpark installs that are gone, and what a killed build left behind."""
    for meta in folder.glob("*.json"):
        try:
            gone = not Path(json.loads(meta.read_text())["jars"]).is_dir()
        except (OSError, ValueError, KeyError):
            gone = True
        if gone:
            meta.with_suffix(".jsa").unlink(missing_ok=True)
            meta.unlink(missing_ok=True)
    for partial in folder.glob("*.partial"):
        pid = partial.suffixes[-2].lstrip(".") if len(partial.suffixes) >= 2 else ""
        if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            partial.unlink(missing_ok=True)


def _dump(target: Path) -> None:
    """In a child process: a local job through the paths kdg's jobs take (Arrow batches to a Python worker),
    then the JVM told to exit and waited for, so that it writes ``target``."""
    from pyspark import SparkContext

    from kdg.spark.session import spark_session

    with spark_session("local[2]", task_retries=False, echo=lambda *a: None, app="kdg class archive",
                       java_options=f'-XX:ArchiveClassesAtExit="{target}"') as run:
        frame = run.spark.range(0, 2000, numPartitions=2).selectExpr(
            "cast(cast(id as string) as binary) as key", "cast(id as string) as value",
            "map('h', cast(cast(id as string) as binary)) as headers",
            "timestamp_millis(id) as timestamp")
        frame.mapInArrow(_passthrough, frame.schema).agg({"value": "count"}).collect()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is None:
        raise SystemExit("Spark's JVM was not started by this process")
    gateway.shutdown()
    proc.stdin.close()  # PySpark's gateway server exits when its stdin closes, and writes the archive then
    proc.wait(timeout=300)


def _passthrough(batches):
    yield from batches


if __name__ == "__main__":
    _dump(Path(sys.argv[1]))
