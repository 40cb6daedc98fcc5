"""The stack's optional Spark standalone cluster: one master and N small workers, run from PySpark's own jars.

``kdg stack up --spark-workers N`` starts it next to the brokers; its settings live in
``<state>/spark/spark.json`` (a stack without that file has no Spark part, and nothing here touches it).
Everything binds to 127.0.0.1 on ports derived from the stack's broker port (``broker_port + 600`` on),
so two stacks with different broker ports never collide:

- master ``+600`` (``spark://127.0.0.1:PORT``), its web UI and JSON status ``+601``;
- worker ``i`` ``+610+i``, its web UI ``+630+i``.

Each worker offers 1 core and 1 GiB (one small executor). Daemon logs go to ``<state>/logs``, pids
and the workers' directories (executor logs, fetched jars and the kdg zip) to ``<state>/spark``.
"""

import json
import os
import shutil
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kdg.errors import MissingComponent, StackError, UsageError
from kdg.stack import procs
from kdg.stack.layout import HOST, StackLayout

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
MAX_WORKERS = 9
WORKER_CORES = 1
WORKER_MEMORY = "1g"
DAEMON_MEMORY = "256m"  # the master's and workers' own JVMs; executors get spark.executor.memory (1g)
# a user's Spark settings or Python path must not leak into the daemons, and through them into executors
_NOT_INHERITED = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR", "SPARK_HOME",
                  "SPARK_LOCAL_DIRS", "SPARK_WORKER_DIR", "SPARK_DAEMON_JAVA_OPTS", "SPARK_MASTER_OPTS",
                  "SPARK_WORKER_OPTS", "KDG_FAULT")


@dataclass
class SparkWorkerStatus:
    worker: int
    port: int
    pid: int | None
    up: bool


@dataclass
class SparkStatus:
    master_url: str
    web_ui: str
    master_pid: int | None
    master_up: bool
    workers: list[SparkWorkerStatus] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.master_up and all(w.up for w in self.workers)


def master_port(layout: StackLayout) -> int:
    return layout.broker_port + 600


def master_ui_port(layout: StackLayout) -> int:
    return layout.broker_port + 601


def worker_port(layout: StackLayout, worker: int) -> int:
    return layout.broker_port + 610 + worker


def worker_ui_port(layout: StackLayout, worker: int) -> int:
    return layout.broker_port + 630 + worker


def master_url(layout: StackLayout) -> str:
    return f"spark://{HOST}:{master_port(layout)}"


def spark_dir(layout: StackLayout) -> Path:
    return layout.state_dir / "spark"


def worker_dir(layout: StackLayout, worker: int) -> Path:
    """Worker ``worker``'s own directory: ``work/app-…/<executor>/`` holds each executor's stdout and stderr."""
    return spark_dir(layout) / f"worker-{worker}"


def _settings_file(layout: StackLayout) -> Path:
    return spark_dir(layout) / "spark.json"


def saved_workers(layout: StackLayout) -> int | None:
    """The number of workers this stack was given, or None when it has no Spark part."""
    try:
        return int(json.loads(_settings_file(layout).read_text())["workers"])
    except FileNotFoundError:
        return None


def _pidfile(layout: StackLayout, role: str) -> Path:
    return spark_dir(layout) / f"{role}.pid"


def _marker(layout: StackLayout, role: str) -> str:
    """A path only this daemon's command line holds (its properties file), to tell it from a recycled pid."""
    return str(spark_dir(layout) / f"{role}.properties")


def _pid(layout: StackLayout, role: str) -> int | None:
    p = procs.read_pid(_pidfile(layout, role))
    return p if procs.pid_matches(p, _marker(layout, role)) else None


def _spark_home() -> Path:
    try:
        import pyspark
    except ImportError:
        raise MissingComponent("PySpark is not installed: `pip install -e .` installs the pinned version") from None
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise MissingComponent(f"this PySpark install has no bin/spark-class in {home}")
    return home


def _env(layout: StackLayout, role: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    local = spark_dir(layout) / role / "local"
    local.mkdir(parents=True, exist_ok=True)
    return env | {"SPARK_HOME": str(_spark_home()), "SPARK_LOCAL_IP": HOST, "SPARK_LOCAL_HOSTNAME": HOST,
                  "SPARK_LOCAL_DIRS": str(local), "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
                  "SPARK_CONF_DIR": str(spark_dir(layout) / "conf")}


def _start(layout: StackLayout, role: str, main: str, args: list[str], properties: dict[str, str]) -> int:
    if (p := _pid(layout, role)) is not None:
        return p
    Path(_marker(layout, role)).write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    (spark_dir(layout) / "conf").mkdir(exist_ok=True)  # empty: no spark-env.sh or defaults of the user's
    cmd = ["bash", str(_spark_home() / "bin" / "spark-class"), main, *args,
           "--properties-file", _marker(layout, role)]
    return procs.start_detached(cmd, log=layout.state_dir / "logs" / f"spark-{role}.log",
                                pidfile=_pidfile(layout, role), env=_env(layout, role), cwd=spark_dir(layout))


def _start_master(layout: StackLayout) -> None:
    _check_free(layout, "master", master_port(layout), master_ui_port(layout))
    _start(layout, "master", MASTER_CLASS,
           ["--host", HOST, "--port", str(master_port(layout)), "--webui-port", str(master_ui_port(layout))],
           {"spark.master.rest.enabled": "false"})


def _start_worker(layout: StackLayout, worker: int) -> None:
    role = f"worker-{worker}"
    _check_free(layout, role, worker_port(layout, worker), worker_ui_port(layout, worker))
    work = worker_dir(layout, worker) / "work"
    work.mkdir(parents=True, exist_ok=True)
    _start(layout, role, WORKER_CLASS,
           ["--host", HOST, "--port", str(worker_port(layout, worker)),
            "--webui-port", str(worker_ui_port(layout, worker)), "--cores", str(WORKER_CORES),
            "--memory", WORKER_MEMORY, "--work-dir", str(work), master_url(layout)],
           {"spark.worker.cleanup.enabled": "true", "spark.worker.cleanup.appDataTtl": str(24 * 3600)})


def _check_free(layout: StackLayout, role: str, *ports: int) -> None:
    if _pid(layout, role) is not None:
        return
    for port in ports:
        if not procs.port_free(HOST, port):
            raise StackError(f"port {port} for the Spark {role} is taken by another process "
                             f"(Spark's ports follow --broker-port: {layout.broker_port} + 600 on)")


def check_workers(workers: int | None) -> None:
    if workers is not None and not 0 <= workers <= MAX_WORKERS:
        raise UsageError(f"--spark-workers {workers}: must be between 0 and {MAX_WORKERS}")


def up(layout: StackLayout, workers: int | None, echo=print) -> None:
    """Start the master and workers 1..``workers`` that are not running, stop any beyond; idempotent.

    ``workers`` None keeps what the stack was given before (nothing, for a stack without Spark);
    0 stops the Spark part and forgets it.
    """
    if workers is None:
        workers = saved_workers(layout)
        if workers is None:
            return
    check_workers(workers)
    if workers == 0:
        down(layout)
        _settings_file(layout).unlink(missing_ok=True)
        return
    spark_dir(layout).mkdir(parents=True, exist_ok=True)
    _settings_file(layout).write_text(json.dumps({"workers": workers}))
    for extra in range(workers + 1, MAX_WORKERS + 1):
        _stop(layout, f"worker-{extra}")
    echo(f"starting the Spark master and {workers} worker(s) ...")
    _start_master(layout)
    _wait(layout, "master", master_port(layout))
    for worker in range(1, workers + 1):
        _start_worker(layout, worker)
    for worker in range(1, workers + 1):
        _wait(layout, f"worker-{worker}", worker_port(layout, worker))
    _wait_registered(layout, workers)


def _wait(layout: StackLayout, role: str, port: int, timeout: float = 90.0) -> None:
    log = layout.state_dir / "logs" / f"spark-{role}.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procs.port_open(HOST, port) and _pid(layout, role) is not None:
            return
        if procs.process_state(procs.read_pid(_pidfile(layout, role))) in (None, "Z"):
            raise StackError(f"the Spark {role} exited while starting; last lines of {log}:\n{procs.tail(log)}")
        time.sleep(0.2)
    raise StackError(f"the Spark {role} did not listen on port {port} within {timeout:.0f}s; "
                     f"last lines of {log}:\n{procs.tail(log)}")


def _wait_registered(layout: StackLayout, workers: int, timeout: float = 120.0) -> None:
    """Wait until the master counts ``workers`` live workers, so a job started now gets its executors."""
    deadline = time.monotonic() + timeout
    alive = 0
    while time.monotonic() < deadline:
        alive = master_json(layout).get("aliveworkers", 0)
        if alive >= workers:
            return
        time.sleep(0.3)
    logs = [layout.state_dir / "logs" / f"spark-{role}.log" for role in ("master", "worker-1")]
    raise StackError(f"only {alive} of {workers} Spark worker(s) registered with the master within {timeout:.0f}s; "
                     + "".join(f"last lines of {log}:\n{procs.tail(log, 8)}\n" for log in logs))


def master_json(layout: StackLayout) -> dict:
    """The master's own status (``/json`` of its web UI): workers, running and completed applications."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{master_ui_port(layout)}/json", timeout=5) as reply:
            return json.load(reply)
    except (OSError, ValueError):
        return {}


def status(layout: StackLayout) -> SparkStatus | None:
    """The master and each worker (running by pid, listening on its port); None for a stack without Spark."""
    workers = saved_workers(layout)
    if workers is None:
        return None
    master_pid = _pid(layout, "master")
    report = SparkStatus(master_url(layout), f"http://{HOST}:{master_ui_port(layout)}", master_pid,
                         master_pid is not None and procs.port_open(HOST, master_port(layout)))
    for worker in range(1, workers + 1):
        p = _pid(layout, f"worker-{worker}")
        report.workers.append(SparkWorkerStatus(worker, worker_port(layout, worker), p,
                                                p is not None and procs.port_open(HOST, worker_port(layout, worker))))
    return report


def _stop(layout: StackLayout, role: str) -> bool:
    p = _pid(layout, role)
    if p is None:
        return False
    procs.stop_pid(p, timeout=30)  # the process group: a worker's executors and their Python workers too
    return True


def down(layout: StackLayout) -> list[str]:
    """Stop the workers, then the master, by their recorded pids; the names of those that were running."""
    roles = [f"worker-{w}" for w in range(1, MAX_WORKERS + 1)] + ["master"]
    return [role for role in roles if _stop(layout, role)]


def purge(layout: StackLayout) -> None:
    """Delete the Spark part's files (settings, worker directories); ``down`` first."""
    shutil.rmtree(spark_dir(layout), ignore_errors=True)


def running_master_url(layout: StackLayout) -> str:
    """``--master stack``: the URL of this stack's running master, or an error saying how to start one."""
    report = status(layout)
    if report is None:
        raise UsageError(f"--master stack: the stack in {layout.state_dir} has no Spark cluster; "
                         "start one with `kdg stack up --spark-workers 2`")
    if not report.master_up or not any(w.up for w in report.workers):
        raise StackError(f"--master stack: the Spark master or its workers in {layout.state_dir} are not running; "
                         "`kdg stack up` starts them again")
    return report.master_url
