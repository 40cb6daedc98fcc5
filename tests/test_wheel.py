"""The wheel is the product: built, installed into a fresh venv outside the checkout, and used there.

Every ``kdg`` below is the installed wheel's, run from a temporary directory, against the test
stack's brokers and a fresh, empty database on the stack's Postgres.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from kdg.store.migrations import migration_files

REPO = Path(__file__).resolve().parent.parent
MIGRATIONS = [f.name for f in migration_files()]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv (outside the repo) holding kdg from a wheel built from this checkout; its ``bin`` folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    # setuptools builds inside the source tree and leaves build/ there, whose stale files would ship: build a copy
    src = shutil.copytree(REPO, tmp / "src", symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "docs", "tests"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", src], tmp)
    _run([sys.executable, "-m", "venv", tmp / "venv"], tmp)
    bin_dir = tmp / "venv" / "bin"
    _run([bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", *(tmp / "dist").glob("kdg-*.whl")], tmp)
    site = Path(_run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     tmp).stdout.strip())
    # Third-party dependencies (pyspark & co) come from this interpreter's site-packages rather than a second
    # download: a .pth line appends that folder to the new venv's sys.path, after the venv's own site-packages.
    (site / "kdg_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    imported = _run([bin_dir / "python", "-c", "import kdg; print(kdg.__file__)"], tmp).stdout.strip()
    assert Path(imported).is_relative_to(site), f"kdg imported from {imported}, not from the wheel in {site}"
    return bin_dir


@pytest.fixture(scope="module")
def fresh_db(session_stack) -> str:
    """A new, empty database on the test stack's Postgres; its DSN. Dropped afterwards."""
    name = f"kdg_wheel_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(session_stack.pg_dsn, f"CREATE DATABASE {name}"))
    yield urlunsplit(urlsplit(session_stack.pg_dsn)._replace(path=f"/{name}"))
    asyncio.run(_admin(session_stack.pg_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


async def _admin(dsn: str, statement: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def _run(cmd: list, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_the_installed_wheel_fetches_migrates_and_keeps_exactly_once(installed, stack, fresh_db, topic, group):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDG_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"KDG_BOOTSTRAP_SERVERS": stack.bootstrap_servers, "KDG_PG_DSN": fresh_db,
            "KDG_STATE_DIR": str(stack.state_dir)}

    def kdg(*args, code: int = 0) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(installed / "kdg"), *map(str, args)], cwd=installed.parent.parent, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == code, f"kdg {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    kdg("stack", "fetch")
    status = json.loads(kdg("db", "status", "--pg-dsn", fresh_db, "--json", code=7).stdout)
    assert status["pending"] == MIGRATIONS, status
    doctor = json.loads(kdg("doctor", "--pg-dsn", fresh_db, "--json", code=7).stdout)
    schema = next(c for c in doctor["checks"] if c["name"] == "schema migrated")
    assert not schema["ok"] and f"run: kdg db migrate --pg-dsn '{fresh_db}'" in schema["detail"], schema

    refused = kdg("audit", topic, "--pg-dsn", fresh_db, code=3)
    assert (f"error: the kdg schema is not in {fresh_db} (pending: {', '.join(MIGRATIONS)}); "
            f"run: kdg db migrate --pg-dsn '{fresh_db}'") in refused.stderr, refused.stderr

    assert json.loads(kdg("db", "migrate", "--pg-dsn", fresh_db, "--json").stdout)["applied"] == MIGRATIONS
    again = json.loads(kdg("db", "migrate", "--pg-dsn", fresh_db, "--json").stdout)
    assert (again["applied"], again["already_applied"]) == ([], MIGRATIONS)
    assert json.loads(kdg("db", "status", "--pg-dsn", fresh_db, "--json").stdout)["pending"] == []

    produced = json.loads(kdg("produce", topic, "-g", "exactly-once", "--count", 200, "--json").stdout)
    assert (produced["sent"], produced["failed"]) == (200, 0)
    consumed = json.loads(kdg("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--json").stdout)
    assert consumed["consumed"] == 200
    report = json.loads(kdg("audit", topic, "--pg-dsn", fresh_db, "--json").stdout)
    assert (report["acked"], report["lost"], report["duplicates"], report["balanced"]) == (200, 0, 0, True), report
