"""The Spark a replay runs in: the connector jars, task retries as the policy says, its log in a file.

``local[*]`` by default; any ``--master`` works, and ``stack`` means the local stack's Spark cluster
(``kdg stack up --spark-workers N``). Off the local master, executors run this package's code, so kdg
ships itself to them as a zip (``addPyFile``); the compiled libraries it needs there (asyncpg, pyarrow)
must be installed on the executors — see the README. A master on 127.0.0.1 gets a driver on 127.0.0.1.

What a session changes in this process is undone when it stops: the zip and its folder, the
``sys.path`` entries PySpark adds, and the environment variables it (or kdg, ``PYSPARK_PYTHON``) set.

Spark's JVM — in local mode its executors and their Python workers too — writes to
``<state dir>/logs/spark-<time>.log``, never to the terminal; a failed task is one line through
``echo`` that names the file.
"""

import os
import re
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import kdg
from kdg.errors import UsageError
from kdg.paths import default_state_dir, resource_path
from kdg.spark import classes
from kdg.spark.jars import spark_jars
from kdg.stack.jars import require_java

TASK_ATTEMPTS = 4  # Spark's own default for spark.task.maxFailures on a cluster
_OWNED = {"spark.task.maxFailures"}
_LOCAL = re.compile(r"^local(\[(\*|\d+)(,\s*\d+)?\])?$")
_LOOPBACK = re.compile(r"^spark://(127\.0\.0\.1|localhost)(:\d+)?$")
# more options for Spark's JVMs (driver and executors), after kdg's own: -XX:TieredStopAtLevel=1 cuts the CPU of
# a short job's JVM, which spends most of its life compiling (a 3,000-record replay: 24-28 CPU-s against 39-45)
JAVA_OPTIONS_ENV = "KDG_SPARK_JAVA_OPTIONS"
_PACKAGE = Path(kdg.__file__).resolve().parent  # shipped whole to executors off the local master
_jvm_log: Path | None = None  # Spark's JVM outlives a stopped session in this process, and keeps its log file


def master_url(master: str, task_retries: bool) -> str:
    """``local[N]`` gets its task-attempt count from the policy (local mode never retries otherwise).

    >>> master_url("local[*]", True)
    'local[*,4]'
    """
    match = _LOCAL.match(master.strip())
    if not match:
        return master
    threads = match.group(2) or "1"
    return f"local[{threads},{TASK_ATTEMPTS}]" if task_retries else f"local[{threads}]"


def resolve_master(master: str) -> str:
    """``stack`` → the URL of the local stack's running Spark master; any other master as given."""
    if master.strip() != "stack":
        return master
    from kdg.stack.layout import StackLayout
    from kdg.stack.spark_cluster import running_master_url

    layout = StackLayout.load(default_state_dir())
    if layout is None:
        raise UsageError(f"--master stack: there is no local stack in {default_state_dir()} "
                         "(`kdg stack up --spark-workers 2` starts one)")
    return running_master_url(layout)


def check_conf(conf: dict[str, str]) -> None:
    """Refuse Spark properties the guarantee owns (asked before anything runs or is recorded)."""
    owned = sorted(_OWNED & set(conf))
    if owned:
        raise UsageError(f"--conf {owned[0]} is refused: the guarantee decides whether a failed task is retried")


class SparkRun:
    """A started SparkSession and what it leaves behind; ``stop()``, or leaving ``with``, cleans up all of it.

    ``spark`` is the session, ``log`` Spark's log file. An exception raised inside ``with`` leaves
    carrying ``spark_log`` (that file), so whoever explains it can say where the details are.
    """

    def __init__(self, spark, log: Path, failures: "_FailedTasks", before: "_ProcessState"):
        self.spark, self.log = spark, log
        self._failures, self._before, self._scratch, self._shipped = failures, before, None, None

    def ship_package(self, modules=()) -> None:
        """Send this kdg package, and ``modules`` (the user's: a module's file or a package's folder, for its
        transforms and handler), to the executors (``addPyFile``); the zip is removed on ``stop()``."""
        from pyspark import SparkFiles

        self._scratch = Path(tempfile.mkdtemp(prefix="kdg-pyfiles-"))
        zipped = _package_zip(self._scratch, modules)
        self._shipped = Path(SparkFiles.getRootDirectory()) / zipped.name  # the driver's own copy
        self.spark.sparkContext.addPyFile(str(zipped))

    def stop(self) -> None:
        try:
            self.spark.stop()
        finally:
            self._failures.stop()
            if self._scratch:
                shutil.rmtree(self._scratch, ignore_errors=True)
            if self._shipped:  # Spark deletes its files folder on stop; should it not, the copy goes anyway
                self._shipped.unlink(missing_ok=True)
            self._before.restore()

    def __enter__(self) -> "SparkRun":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            exc.spark_log = self.log
        self.stop()


def spark_session(master: str, *, task_retries: bool, conf: dict[str, str] | None = None,
                  echo: Callable[[str], None] = print, app: str = "kdg spark-replay",
                  java_options: str | None = None, modules=()) -> SparkRun:
    """Start Spark for one job: ``with spark_session("local[*]", task_retries=True) as run: run.spark…``

    The driver JVM maps Spark's class archive when there is one (:mod:`kdg.spark.classes`); ``java_options``
    replaces that option. ``modules``: the user's code its executors import (shipped off the local master).

    The driver's UI listens on 127.0.0.1 only (Spark binds it to ``SPARK_LOCAL_IP``, else every interface),
    unless ``SPARK_LOCAL_IP`` is set or the master is YARN or Kubernetes (see :func:`_driver_addresses`)."""
    require_java()
    jars = spark_jars(echo=echo)
    log = _jvm_log or _new_log()
    log4j = resource_path("spark-log4j2.properties")  # sends everything to the file named in kdg.spark.log
    extra_java = os.environ.get(JAVA_OPTIONS_ENV, "").strip()
    settings = {
        "spark.master": master_url(master, task_retries),
        "spark.app.name": app,
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.task.maxFailures": str(TASK_ATTEMPTS if task_retries else 1),
        "spark.sql.mapKeyDedupPolicy": "LAST_WIN",   # repeated header names: last wins, as in consume
        "spark.ui.showConsoleProgress": "false",     # kdg draws its own progress
        "spark.driver.extraJavaOptions": " ".join(filter(None, (
            f'-Dlog4j2.configurationFile="{log4j}" -Dkdg.spark.log="{log}"',
            classes.java_options() if java_options is None else java_options, extra_java))),
    }
    if extra_java:
        settings["spark.executor.extraJavaOptions"] = extra_java
    if _LOOPBACK.match(master.strip()):  # executors on this machine reach the driver where the master is
        settings |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    ui_local, addresses = _driver_addresses(master.strip())
    settings |= {k: v for k, v in addresses.items() if k not in (conf or {})}
    if fault := os.environ.get("KDG_FAULT"):
        settings["spark.executorEnv.KDG_FAULT"] = fault
    settings.update(conf or {})
    before = _ProcessState()
    if ui_local:
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # read by the JVM at start; restored with the rest on stop()
    try:
        spark = _start(settings, log)
    except BaseException as exc:
        before.restore()
        exc.spark_log = log
        raise
    run = SparkRun(spark, log, _FailedTasks(log, TASK_ATTEMPTS if task_retries else 1, echo), before)
    if not _LOCAL.match(master.strip()):
        try:
            run.ship_package(modules)
        except BaseException:
            run.stop()
            raise
    return run


def _driver_addresses(master: str) -> tuple[bool, dict[str, str]]:
    """Whether the driver's UI can be held to 127.0.0.1, and the driver addresses that keeps right.

    Spark binds its UI to ``SPARK_LOCAL_IP`` (else 0.0.0.0), but that variable also sets where the driver
    listens for its executors. On the local master and a loopback cluster that is 127.0.0.1 anyway. For a
    remote ``spark://`` master the driver keeps listening on the address this machine reaches the master
    from (what executors there connect back to). YARN, Kubernetes and a list of standalone masters choose
    the driver's address their own way: there the UI is left to Spark, and ``SPARK_LOCAL_IP`` is the
    user's to set.
    """
    import socket

    if "SPARK_LOCAL_IP" in os.environ:
        return False, {}
    if _LOCAL.match(master) or _LOOPBACK.match(master):
        return True, {}
    found = re.match(r"^spark://([^:/,]+)(?::(\d+))?$", master)
    if not found:  # YARN, Kubernetes, several standalone masters
        return False, {}
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent
            probe.connect((found.group(1), int(found.group(2) or 7077)))
            address = probe.getsockname()[0]
    except OSError:
        return False, {}
    return True, {"spark.driver.host": address, "spark.driver.bindAddress": address}


def _new_log() -> Path:
    logs = default_state_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"spark-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


def _start(settings: dict[str, str], log: Path):
    """The SparkSession, its JVM's stdout and stderr appended to ``log`` (what log4j does not catch:
    the JVM's own warnings, Python workers' stderr, which Spark copies to the JVM's)."""
    global _jvm_log
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    conf = SparkConf().setAll(list(settings.items()))
    with open(log, "ab") as out, _workers_python():
        # a second session in this process reuses the running JVM, which kdg cannot redirect again
        gateway = None if SparkContext._gateway else launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": out})
        # made off the main thread, PySpark installs no SIGINT handler of its own: its handler raises
        # KeyboardInterrupt wherever the main thread is (mid-py4j-call: tracebacks, exit 130), while kdg's
        # reads a stop between steps
        _off_main_thread(lambda: SparkContext(conf=conf, gateway=gateway))
    _jvm_log = log
    return SparkSession.builder.getOrCreate()


def _off_main_thread(make):
    """``make()`` run on a thread of its own, waited for; what it raises is raised here."""
    done: dict = {}

    def run() -> None:
        try:
            done["value"] = make()
        except BaseException as exc:
            done["error"] = exc

    worker = threading.Thread(target=run, name="kdg-spark-start", daemon=True)
    worker.start()
    worker.join()
    if "error" in done:
        raise done["error"]
    return done["value"]


@contextmanager
def _workers_python():
    """``PYSPARK_PYTHON`` while the SparkContext is made (it reads it then, once): the caller's choice, else this
    interpreter, whose venv has kdg, asyncpg and pyarrow. The caller's environment is left as it was."""
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = before or sys.executable
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYSPARK_PYTHON"]
        else:
            os.environ["PYSPARK_PYTHON"] = before


class _ProcessState:
    """This process's environment and ``sys.path`` as they were; ``restore()`` undoes what PySpark changed
    while a session ran (``SPARK_BUFFER_SIZE``, ``SPARK_AUTH_SOCKET_TIMEOUT``, its files folder and each
    ``addPyFile`` zip on ``sys.path``)."""

    def __init__(self):
        self.env, self.path = dict(os.environ), list(sys.path)

    def restore(self) -> None:
        for name in set(os.environ) - set(self.env):
            del os.environ[name]
        os.environ.update({k: v for k, v in self.env.items() if os.environ.get(k) != v})
        sys.path[:] = [p for p in sys.path if p in self.path]


def _package_zip(folder: Path, modules=()) -> Path:
    """This very kdg package as ``folder/kdg.zip``, so executors run the driver's code, not some other version;
    with ``modules`` (a module's file, or a package's folder) beside it at the zip's top."""
    target = folder / "kdg.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for top in (_PACKAGE, *map(Path, modules)):
            if top.is_file():
                zf.write(top, top.name)
                continue
            for path in top.rglob("*"):
                if path.is_file() and "__pycache__" not in path.parts:
                    zf.write(path, Path(top.name) / path.relative_to(top))
    return target


# Spark's TaskSetManager: "Lost task 0.0 in stage 0.0 (TID 0) (host executor driver): <reason>" — index.attempt
# (a streaming query's lines carry "[queryId = …] [batchId = …] " after the logger's name)
_LOST_TASK = re.compile(r" TaskSetManager: (?:\[[^\]]*\] )*Lost task (\d+)\.(\d+) in stage \S+ \(TID \d+\) \(.*?\): "
                        r"(?!TaskKilled)")


class _FailedTasks:
    """Follows Spark's log and echoes one line per failed task attempt; its stack trace stays in the file."""

    def __init__(self, log: Path, attempts: int, echo: Callable[[str], None], every_s: float = 0.5):
        self._log, self._attempts, self._echo, self._every = log, attempts, echo, every_s
        self._read_to = log.stat().st_size if log.exists() else 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kdg-spark-failures", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._done.wait(self._every):
            self._read()
        self._read()  # what Spark logged just before the session stopped

    def _read(self) -> None:
        with open(self._log, "rb") as f:
            f.seek(self._read_to)
            new = f.read()
        whole = new[:new.rfind(b"\n") + 1]  # a line still being written is read next time
        self._read_to += len(whole)
        for line in whole.decode(errors="replace").splitlines():
            if found := _LOST_TASK.search(line):
                self._echo(self._say(int(found.group(1)), int(found.group(2)) + 1))

    def _say(self, task: int, attempt: int) -> str:
        if self._attempts == 1:
            what = "task retries are off under this guarantee"
        else:
            then = "Spark retries it" if attempt < self._attempts else "Spark gives up"
            what = f"attempt {attempt} of {self._attempts}; {then}"
        return f"spark: task {task} failed ({what}) — details in {self._log}"

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)
