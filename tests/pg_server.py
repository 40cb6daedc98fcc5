"""A real PostgreSQL server apart from the stack's embedded one: the user's own server, as kdg meets it.

It runs Debian's ``postgresql`` binaries (``/usr/lib/postgresql/*/bin``) as the ``postgres`` OS user
when the tests run as root (initdb and postgres refuse root), listens on 127.0.0.1 only, and lets
role ``appuser`` in by password (``scram-sha-256``), so every DSN kdg gets carries a password. The
database ``appdb`` belongs to ``appuser`` and holds an empty schema ``app``; kdg's own tables land in
the default schema (``public``), sink tables named ``app.…`` in ``app``.

    with external_postgres() as dsn:   # postgresql://appuser:PASSWORD@127.0.0.1:PORT/appdb
        ...

On exit the server is stopped (``pg_ctl -m fast``, by its data directory) and its directory removed.
``appuser`` may create databases: :func:`fresh_database` gives a test module one that starts empty.
"""

import contextlib
import glob
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

OS_USER = "postgres"
ROLE, DATABASE, SCHEMA = "appuser", "appdb", "app"
HOST = "127.0.0.1"
HBA = f"""# kdg tests: the admin over the server's own socket (in a directory only its account can enter),
# everyone else by password over TCP
local all {OS_USER} trust
host  all all {HOST}/32 scram-sha-256
"""


class PostgresServerError(RuntimeError):
    """The test PostgreSQL server could not be found, set up or started."""


def bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/N/bin`` that has ``initdb``."""
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if not found:
        raise PostgresServerError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin "
                                  "(install Debian's package: apt-get install -y postgresql)")
    return Path(max(found, key=lambda p: int(re.search(r"/(\d+)/bin/", p).group(1)))).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _as_server_user() -> list[str]:
    """The command prefix that runs a program as the server's OS account (nothing unless we are root)."""
    return ["runuser", "-u", OS_USER, "--"] if os.geteuid() == 0 else []


def _run(cmd: list, what: str) -> str:
    proc = subprocess.run([*_as_server_user(), *map(str, cmd)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise PostgresServerError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def start_external_postgres() -> tuple[str, Path]:
    """Start a throw-away server: ``(postgresql://appuser:PASSWORD@127.0.0.1:PORT/appdb, its folder)``.

    :func:`stop_external_postgres` with that folder stops it (from any process) and removes the folder.
    """
    bins = bin_dir()
    base = Path(tempfile.mkdtemp(prefix="kdg-test-extpg-"))
    data = base / "data"
    try:
        if os.geteuid() == 0:
            account = pwd.getpwnam(OS_USER)
            os.chown(base, account.pw_uid, account.pw_gid)
        _run([bins / "initdb", "-D", data, "-U", OS_USER, "--auth=trust", "--encoding=UTF8", "--no-instructions"],
             "initdb")
        (data / "pg_hba.conf").write_text(HBA)  # the file keeps its owner (the server's account)
        port, password = free_port(), secrets.token_hex(16)
        options = f"-p {port} -c listen_addresses={HOST} -k {base} -c password_encryption=scram-sha-256"
        (base / "options").write_text(options)
        resume_external_postgres(base)

        def sql(database: str, statement: str) -> None:
            _run([bins / "psql", "-h", base, "-p", port, "-U", OS_USER, "-d", database, "-v", "ON_ERROR_STOP=1",
                  "-qc", statement], f"psql {statement.split(' PASSWORD ')[0]!r}")

        sql("postgres", f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{password}'")  # CREATEDB: fresh_database
        sql("postgres", f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        sql(DATABASE, f"CREATE SCHEMA {SCHEMA} AUTHORIZATION {ROLE}")
        return f"postgresql://{ROLE}:{password}@{HOST}:{port}/{DATABASE}", base
    except BaseException:
        stop_external_postgres(base)
        raise


def pause_external_postgres(base: Path) -> None:
    """Stop the server in ``base`` and keep its files: :func:`resume_external_postgres` starts it again."""
    _stop(bin_dir(), base / "data")


def resume_external_postgres(base: Path) -> None:
    """Start the server in ``base`` (again), on its own port."""
    data, log = base / "data", base / "postgres.log"
    try:
        _run([bin_dir() / "pg_ctl", "-D", data, "-l", log, "-o", (base / "options").read_text(), "-w", "-t", "60",
              "start"], "pg_ctl start")
    except PostgresServerError as exc:
        raise PostgresServerError(f"{exc}\nlast lines of {log}:\n{_tail(log)}") from None


def stop_external_postgres(base: Path) -> None:
    """Stop the server :func:`start_external_postgres` started in ``base`` (by its data directory); remove ``base``."""
    try:
        _stop(bin_dir(), base / "data")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def external_postgres() -> Iterator[str]:
    """A throw-away server for the block: yields ``postgresql://appuser:PASSWORD@127.0.0.1:PORT/appdb``."""
    dsn, base = start_external_postgres()
    try:
        yield dsn
    finally:
        stop_external_postgres(base)


def run_sql(dsn: str, *statements: str) -> None:
    """Run ``statements`` in order on one connection to ``dsn`` (plain SQL: any schema, or none, of kdg's)."""
    import asyncio

    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


@contextlib.contextmanager
def fresh_database(dsn: str, name: str) -> Iterator[str]:
    """A new, empty database ``name`` on ``dsn``'s server, with schema ``app``; its DSN. Dropped on exit."""
    fresh = urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))
    run_sql(dsn, f"CREATE DATABASE {name}")
    try:
        run_sql(fresh, f"CREATE SCHEMA {SCHEMA}")
        yield fresh
    finally:
        run_sql(dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _stop(bins: Path, data: Path) -> None:
    """Fast shutdown of the server on ``data``; SIGKILL its postmaster if that does not finish."""
    pidfile = data / "postmaster.pid"
    if not pidfile.exists():
        return
    try:
        _run([bins / "pg_ctl", "-D", data, "-m", "fast", "-w", "-t", "30", "stop"], "pg_ctl stop")
        return
    except (PostgresServerError, subprocess.TimeoutExpired):
        pass
    try:
        pid = int(pidfile.read_text().split()[0])
        if str(data) in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "):
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
    except (OSError, ValueError, IndexError):
        pass


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
