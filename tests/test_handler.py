"""``--handler``: found from the current directory, never silently a no-op, and never given a duplicate.

Run through the installed ``kdg`` script (not ``python -m kdg``, which puts the current directory on the
path by itself), from a directory holding the user's module.
"""

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import _kdg_env

from kdg.store.pg import Store

HANDLERS = '''
def lazy(rows, conn):  # a sync handler: asyncpg's calls return coroutines it never awaits
    for row in rows:
        conn.execute("INSERT INTO {side} VALUES ($1)", 1)


async def count(rows, conn):
    await conn.execute("INSERT INTO {side} VALUES ($1)", len(rows))
'''


@pytest.fixture
def user_dir(tmp_path, conn):
    side = f"app.side_{uuid.uuid4().hex[:8]}"
    with Store(conn.pg_dsn) as store:
        store.execute("CREATE SCHEMA IF NOT EXISTS app")
        store.execute(f"CREATE TABLE {side} (n integer)")
    (tmp_path / "shop_handlers.py").write_text(HANDLERS.format(side=side))
    return tmp_path, side


def kdg_script(stack, cwd: Path, *args):
    script = Path(sys.executable).with_name("kdg")
    return subprocess.run([str(script), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=_kdg_env(stack, None))


def produce(kdg, topic, n: int) -> None:
    lines = "".join(json.dumps({"id": i}) + "\n" for i in range(n))
    kdg("produce", topic, "-g", "exactly-once", "--format", "text", stdin=lines)


def side_total(conn, side: str) -> int | None:
    with Store(conn.pg_dsn) as store:
        return store.fetchval(f"SELECT sum(n) FROM {side}")


def test_a_handler_that_never_awaits_fails_the_batch_and_moves_no_offset(kdg, stack, conn, topic, group, user_dir):
    cwd, side = user_dir
    produce(kdg, topic, 30)
    table = f"app.ev_{uuid.uuid4().hex[:8]}"
    lazy = kdg_script(stack, cwd, "consume", topic, "-G", group, "-g", "at-least-once", "-e", "--table", table,
                      "--handler", "shop_handlers:lazy")
    assert lazy.returncode == 2, lazy.stderr
    assert "without awaiting" in lazy.stderr and "was never awaited" not in lazy.stderr, lazy.stderr
    assert side_total(conn, side) is None
    with Store(conn.pg_dsn) as store:
        assert store.fetchval(f"SELECT count(*) FROM {table}") == 0  # rolled back with the handler's batch
    fixed = kdg_script(stack, cwd, "consume", topic, "-G", group, "-g", "at-least-once", "-e", "--json",
                       "--table", table, "--handler", "shop_handlers:count")
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(fixed.stdout)["consumed"] == 30  # nothing of the failed run was committed
    assert side_total(conn, side) == 30


@pytest.mark.parametrize("typed", [False, True], ids=["generic", "typed"])
def test_exactly_once_gives_the_handler_no_duplicate(kdg, stack, conn, topic, group, user_dir, typed):
    cwd, side = user_dir
    produce(kdg, topic, 40)
    table = f"app.ev_{uuid.uuid4().hex[:8]}"
    mapping = ["--column", "id bigint = json:id", "--create-table"] if typed else []
    args = ("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--json", "--table", table, *mapping,
            "--handler", "shop_handlers:count")
    first = kdg_script(stack, cwd, *args)
    assert first.returncode == 0, first.stderr
    again = kdg_script(stack, cwd, *args, "-o", "beginning")  # every record again: each a duplicate
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["duplicates_suppressed"] == 40
    assert side_total(conn, side) == 40  # the handler's effects applied once per record
