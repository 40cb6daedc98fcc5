"""The real stack, started once per test session through the same code `kdg stack up` runs.

Tests get their own state directory and ports (29092.., 25432) so a user's stack is untouched.
Nothing here mocks Kafka or Postgres; a missing Java or Maven fails the run with kdg's message.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from kdg.errors import KdgError
from kdg.settings import Connection
from kdg.stack import cluster
from kdg.stack.layout import StackLayout

TEST_BROKER_PORT = int(os.environ.get("KDG_TEST_BROKER_PORT", "29092"))
TEST_PG_PORT = int(os.environ.get("KDG_TEST_PG_PORT", "25432"))


@pytest.fixture(scope="session")
def stack():
    state = Path(tempfile.mkdtemp(prefix="kdg-test-stack-"))
    layout = StackLayout(state_dir=state, brokers=3, broker_port=TEST_BROKER_PORT, pg_port=TEST_PG_PORT,
                         external_pg_dsn=os.environ.get("KDG_TEST_PG_DSN"))
    try:
        cluster.up(layout, echo=lambda *a: None)
    except KdgError as exc:
        cluster.down(layout, purge=True)
        pytest.exit(f"could not start the test stack: {exc}", returncode=3)
    yield layout
    cluster.down(layout, purge=True)
    shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def external_pg():
    """A PostgreSQL server apart from the stack's, reached by password: ``postgresql://appuser:…@…/appdb``.

    Debian's ``postgresql`` binaries; missing, they fail the tests that need them (never a skip).
    """
    from pg_server import PostgresServerError, external_postgres

    try:
        with external_postgres() as dsn:
            yield dsn
    except PostgresServerError as exc:
        pytest.fail(f"the external PostgreSQL server for tests: {exc}", pytrace=False)


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def kdg(stack):
    """Run the real `kdg` command line against the test stack: ``kdg("audit", topic, env=…)``."""

    def run(*args, env: dict | None = None, check: bool = True, stdin: str | None = None, timeout: float = 300):
        inherited = {k: v for k, v in os.environ.items() if k != "KDG_FAULT"}
        full_env = {**inherited, "KDG_BOOTSTRAP_SERVERS": stack.bootstrap_servers, "KDG_PG_DSN": stack.pg_dsn,
                    "KDG_STATE_DIR": str(stack.state_dir), **(env or {})}
        proc = subprocess.run([sys.executable, "-m", "kdg", *map(str, args)], capture_output=True, text=True,
                              env=full_env, input=stdin, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kdg {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    return run


def as_json(proc) -> dict:
    return json.loads(proc.stdout)


def audited(kdg, *args, env: dict | None = None) -> dict:
    """``kdg audit … --json``, checking its verdict is its exit code: 0 when balanced, 7 when not."""
    proc = kdg("audit", *args, "--json", env=env, check=False)
    assert proc.returncode in (0, 7), f"kdg audit exited {proc.returncode}:\n{proc.stderr}"
    report = json.loads(proc.stdout)
    assert (proc.returncode == 0) == report["balanced"], (proc.returncode, report)
    return report
