"""The real stack, started once per test session through the same code `kdg stack up` runs.

Tests get their own state directory and ports (29092.., 25432) so a user's stack is untouched.
Nothing here mocks Kafka or Postgres; a missing Java or Maven fails the run with kdg's message.

One session may run on several pytest-xdist workers (`make test` does). Each shared server is still
started once, lazily, by the first test that needs it, whichever worker that is
(:class:`SharedServers`), and stopped by pid at the end by the process that owns the run. Tests that
stop a broker or Postgres (marker ``disrupts_stack``) get a stack of their own, the fault stack (27092..,
27432), and run there one at a time (:func:`fault_stack_access`); every other test shares the session
stack with no lock. Before, one stack served both behind a readers-writer lock, and a fault test waiting
for the readers to drain held the other workers idle behind it for minutes.
`make test` hands out whole modules (``--dist loadfile``): a module's own server (the secure stack, the
Spark cluster) is started and stopped by that module, on one worker, in order.
"""

import contextlib
import fcntl
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from kdg.errors import KdgError
from kdg.settings import Connection
from kdg.stack import cluster, registry
from kdg.stack.layout import StackLayout

TEST_BROKER_PORT = int(os.environ.get("KDG_TEST_BROKER_PORT", "29092"))
TEST_PG_PORT = int(os.environ.get("KDG_TEST_PG_PORT", "25432"))
FAULT_BROKER_PORT = int(os.environ.get("KDG_TEST_FAULT_BROKER_PORT", "27092"))
FAULT_PG_PORT = int(os.environ.get("KDG_TEST_FAULT_PG_PORT", "27432"))
TEST_REGISTRY_PORT = int(os.environ.get("KDG_TEST_REGISTRY_PORT", "28081"))
# Spark's JVMs here run jobs of seconds, which spend most of their CPU compiling: stopping at the first JIT
# tier halves it (a 3,000-record replay: 24-28 CPU-s instead of 39-45), and the suite is bound by its 2 cores.
# The same documented option a user sets (kdg/spark/session.py); a value already set wins.
os.environ.setdefault("KDG_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
# The same for the test stacks' brokers, which live minutes under small bursts of load, restarted often: a stack
# up and a small produce-consume-audit workload took 43-44 CPU-s of the brokers instead of 72-80
os.environ.setdefault("KDG_KAFKA_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
RUN_DIR_ENV = "KDG_TEST_RUN_DIR"  # set by the process that owns the run; its xdist workers inherit it
# fixtures that reach a server: a test using any of them is in the `stack` tier
SERVER_FIXTURES = {"stack", "session_stack", "fault_stack", "external_pg", "secure_stack", "schema_registry"}


# -- tiers and groups --------------------------------------------------------------------------------
def pytest_configure(config):
    config.addinivalue_line("markers", "stack: reaches a real server (added from the fixtures a test uses)")
    config.addinivalue_line("markers", "disrupts_stack: stops a broker or Postgres: runs on the fault stack, alone")
    config.addinivalue_line("markers", "long: a long run or a wide matrix, for `make test-long` (pytest -m long)")
    if os.environ.get(RUN_DIR_ENV) is None:  # the owner: a plain pytest, or xdist's controller
        run_dir = Path(tempfile.mkdtemp(prefix="kdg-test-run-"))
        os.environ[RUN_DIR_ENV] = str(run_dir)
        config.kdg_run_dir = run_dir


def pytest_unconfigure(config):
    run_dir = getattr(config, "kdg_run_dir", None)
    if run_dir is not None:
        SharedServers(run_dir).stop_all()
        shutil.rmtree(run_dir, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Mark the `stack` tier; leave the `long` tier out unless ``-m`` asks for it (deselected, never skipped)."""
    long_wanted = "long" in (config.option.markexpr or "")
    kept, dropped = [], []
    for item in items:
        if set(getattr(item, "fixturenames", ())) & SERVER_FIXTURES or item.get_closest_marker("disrupts_stack"):
            item.add_marker(pytest.mark.stack)
        (kept if long_wanted or not item.get_closest_marker("long") else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    # workers take modules in this order: those that take minutes first, so none starts one at the very end
    items[:] = sorted(kept, key=lambda item: _LONG_MODULES.index(item.module.__name__)
                      if item.module.__name__ in _LONG_MODULES else len(_LONG_MODULES))


# (each whole module runs on one worker: --dist loadfile; --no-loadscope-reorder, or xdist would order them by their
# number of tests instead). Longest first, as measured in a whole `make test` on 2 cores with every worker busy
# (seconds, 2026-11-26): a module that takes minutes, started last, is the suite's tail.
_LONG_MODULES = ["test_typed_sink",      # 520
                 "test_spark_cluster",   # 500 (190 with only the stack-up test)
                 "test_secure",          # 440
                 "test_chaos",           # 440
                 "test_spark_stream",    # 430
                 "test_bad_input",       # 340
                 "test_demo_output",     # 175
                 "test_spark_replay",    # 170
                 "test_spark_many",      # 125
                 "test_spark_transform", # 75-120 (run alone on a shared machine)
                 "test_spark_evolve",    # 45
                 "test_many_topics",     # 60
                 "test_soak",            # 160
                 "test_produce_consume", "test_schemas", "test_crash", "test_profile", "test_lifecycle",
                 "test_end_of_topic", "test_pipeline", "test_stack", "test_wheel"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test that disrupts the fault stack holds it alone from its setup to its teardown."""
    if not item.get_closest_marker("disrupts_stack"):
        yield
        return
    with fault_stack_access():
        yield


@contextlib.contextmanager
def fault_stack_access():
    """The fault stack for one test at a time, across the session's workers."""
    with open(Path(os.environ[RUN_DIR_ENV]) / "fault_stack.use", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# -- servers shared by every worker of a session ----------------------------------------------------
class SharedServers:
    """Servers started at most once per run, by whichever process asks first, under a file lock.

    ``run_dir/NAME.json`` says what was started (or why it could not be); the owner of the run stops
    each one in :meth:`stop_all`.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def get(self, name: str, start) -> dict:
        """The saved description of server ``name``, calling ``start()`` (which returns one) the first time."""
        record = self.run_dir / f"{name}.json"
        with open(self.run_dir / f"{name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not record.exists():
                try:
                    found = {"ok": True, **start()}
                except (KdgError, RuntimeError) as exc:  # every later asker fails with the same reason at once
                    found = {"ok": False, "error": str(exc)}
                record.write_text(json.dumps(found))
            found = json.loads(record.read_text())
        if not found["ok"]:
            pytest.fail(f"could not start the test's {name}: {found['error']}", pytrace=False)
        return found

    def stop_all(self) -> None:
        record = self.run_dir / "schema_registry.json"
        if record.exists() and "state_dir" in (saved := json.loads(record.read_text())):
            registry.stop(_session_layout(Path(saved["state_dir"])))  # by pid, before its stack goes down
        for name in ("stack", "fault_stack"):
            record = self.run_dir / f"{name}.json"
            if record.exists() and "state_dir" in (saved := json.loads(record.read_text())):
                layout = _LAYOUTS[name](Path(saved["state_dir"]))
                cluster.down(layout, purge=True)  # brokers, Postgres and any Spark part, by pid
                shutil.rmtree(layout.state_dir, ignore_errors=True)
        record = self.run_dir / "external_pg.json"
        if record.exists() and "base" in (saved := json.loads(record.read_text())):
            from pg_server import stop_external_postgres

            stop_external_postgres(Path(saved["base"]))


def _session_layout(state: Path) -> StackLayout:
    return StackLayout(state_dir=state, brokers=3, broker_port=TEST_BROKER_PORT, pg_port=TEST_PG_PORT,
                       external_pg_dsn=os.environ.get("KDG_TEST_PG_DSN"))


def _fault_layout(state: Path) -> StackLayout:
    return StackLayout(state_dir=state, brokers=3, broker_port=FAULT_BROKER_PORT, pg_port=FAULT_PG_PORT)


_LAYOUTS = {"stack": _session_layout, "fault_stack": _fault_layout}


def _shared() -> SharedServers:
    return SharedServers(Path(os.environ[RUN_DIR_ENV]))


def _shared_stack(name: str) -> StackLayout:
    """Stack ``name`` of this session (``stack`` or ``fault_stack``), started by whichever test asks first."""
    def start() -> dict:
        layout = _LAYOUTS[name](Path(tempfile.mkdtemp(prefix=f"kdg-test-{name.replace('_', '-')}-")))
        try:
            cluster.up(layout, echo=lambda *a: None)
        except KdgError:
            cluster.down(layout, purge=True)
            raise
        return {"state_dir": str(layout.state_dir)}

    return _LAYOUTS[name](Path(_shared().get(name, start)["state_dir"]))


@pytest.fixture(scope="session")
def session_stack() -> StackLayout:
    """The stack every test shares (module-scoped fixtures use it by this name)."""
    return _shared_stack("stack")


@pytest.fixture(scope="session")
def fault_stack() -> StackLayout:
    """The stack only ``disrupts_stack`` tests use, one at a time: their broker kills and Postgres restarts
    reach no other test."""
    return _shared_stack("fault_stack")


@pytest.fixture(scope="session")
def schema_registry(session_stack) -> str:
    """The session stack's Schema Registry (started the first time a test asks): the base URL of its
    Confluent-compatible API, ``http://127.0.0.1:28081/apis/ccompat/v6``. Schemas are kept in memory: give
    each test subjects of its own. The stack's layout records it, so ``kdg stack status`` shows it."""
    def start() -> dict:
        layout = replace(session_stack, registry_port=TEST_REGISTRY_PORT)
        layout.save()
        try:
            registry.up(layout, echo=lambda *a: None)
            registry.wait_ready(layout)
        except KdgError:
            registry.stop(layout)
            session_stack.save()  # without it: `kdg stack status` of the other tests stays healthy
            raise
        return {"url": registry.url(layout), "state_dir": str(layout.state_dir)}

    return _shared().get("schema_registry", start)["url"]


@pytest.fixture
def stack(request) -> StackLayout:
    """The session stack, or the fault stack for a test marked ``disrupts_stack``."""
    disrupts = request.node.get_closest_marker("disrupts_stack") is not None
    return request.getfixturevalue("fault_stack" if disrupts else "session_stack")


@pytest.fixture(scope="session")
def external_pg() -> str:
    """A PostgreSQL server apart from the stack's, reached by password: ``postgresql://appuser:…@…/appdb``.

    Debian's ``postgresql`` binaries; missing, they fail the tests that need them (never a skip).
    """
    from pg_server import PostgresServerError, start_external_postgres

    def start() -> dict:
        try:
            dsn, base = start_external_postgres()
        except PostgresServerError as exc:
            raise RuntimeError(f"the external PostgreSQL server for tests: {exc}") from None
        return {"dsn": dsn, "base": str(base)}

    return _shared().get("external_pg", start)["dsn"]


@pytest.fixture
def conn(stack) -> Connection:
    return Connection(bootstrap_servers=stack.bootstrap_servers, pg_dsn=stack.pg_dsn)


@pytest.fixture
def topic(conn) -> str:
    """A fresh 3-partition topic."""
    from kdg.kafka.admin import ensure_topic

    name = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topic(conn.bootstrap_servers, name, partitions=3)
    return name


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def _kdg_env(stack: StackLayout, env: dict | None) -> dict:
    inherited = {k: v for k, v in os.environ.items() if k != "KDG_FAULT"}
    return {**inherited, "KDG_BOOTSTRAP_SERVERS": stack.bootstrap_servers, "KDG_PG_DSN": stack.pg_dsn,
            "KDG_STATE_DIR": str(stack.state_dir), **(env or {})}


@pytest.fixture
def kdg_spawn(stack):
    """Start the real `kdg` command line against the test's stack and return at once: a ``Popen`` with
    text stdout and stderr pipes (the caller waits, signals or kills it)."""

    def spawn(*args, env: dict | None = None, stdin=None) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "kdg", *map(str, args)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=stdin, text=True, env=_kdg_env(stack, env))

    return spawn


def _kdg_runner(stack: StackLayout):
    def run(*args, env: dict | None = None, check: bool = True, stdin: str | None = None, timeout: float = 300):
        proc = subprocess.run([sys.executable, "-m", "kdg", *map(str, args)], capture_output=True, text=True,
                              env=_kdg_env(stack, env), input=stdin, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kdg {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    return run


@pytest.fixture
def kdg(stack):
    """Run the real `kdg` command line against the test's stack: ``kdg("audit", topic, env=…)``."""
    return _kdg_runner(stack)


@pytest.fixture(scope="session")
def session_kdg(session_stack):
    """``kdg`` on the session stack, for module-scoped fixtures."""
    return _kdg_runner(session_stack)


def wait_stopped(proc: subprocess.Popen, where: str, timeout: float = 120) -> None:
    """Wait until ``proc`` stopped itself at its ``KDG_FAULT=…:stop`` point (``where``, for the message); fail
    with its stderr if it ended first."""
    import time

    from kdg.stack import procs

    deadline = time.monotonic() + timeout
    while procs.process_state(proc.pid) != "T" and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if procs.process_state(proc.pid) != "T":
        ended = proc.poll() is not None
        raise AssertionError(f"never reached {where}: " + (proc.communicate()[1][-2000:] if ended else "still running"))


def finished(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``proc`` once it ends; killed if it has not within ``timeout``."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def as_json(proc) -> dict:
    return json.loads(proc.stdout)


def audited(kdg, *args, env: dict | None = None) -> dict:
    """``kdg audit … --json``, checking its verdict is its exit code: 0 when balanced, 7 when not."""
    proc = kdg("audit", *args, "--json", env=env, check=False)
    assert proc.returncode in (0, 7), f"kdg audit exited {proc.returncode}:\n{proc.stderr}"
    report = json.loads(proc.stdout)
    assert (proc.returncode == 0) == report["balanced"], (proc.returncode, report)
    return report


def change_stream(seed: int, snapshot: int, steps: int, ids: int) -> tuple[list[tuple], dict]:
    """A source table's changes as Debezium sees them: ``(op, id, before, after)`` for a snapshot of
    ``snapshot`` rows (op r), then ``steps`` random creates, updates and deletes over ``ids`` ids; and the
    table's state at the end, by id."""
    rng, source, events = random.Random(seed), {}, []
    for i in range(snapshot):
        source[i] = {"id": i, "name": f"n{i}", "qty": i}
        events.append(("r", i, None, source[i]))
    for step in range(steps):
        i = rng.randrange(ids)
        if i not in source:
            source[i] = {"id": i, "name": f"new{step}", "qty": step}
            events.append(("c", i, None, source[i]))
        elif rng.random() < 0.2:
            events.append(("d", i, source.pop(i), None))
        else:
            before, source[i] = source[i], {**source[i], "qty": step, "name": f"u{step}"}
            events.append(("u", i, before, source[i]))
    return events, source
