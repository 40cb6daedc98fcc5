"""Apply the numbered SQL files in ``sql/`` once each, in order, under an advisory lock."""

import asyncio
from pathlib import Path

import asyncpg

from kdg.errors import ConnectionFailed
from kdg.paths import SQL_DIR
from kdg.settings import redact_dsn

_LOCK_ID = 0x6B6467  # "kdg"


def migration_files(sql_dir: Path = SQL_DIR) -> list[Path]:
    return sorted(p for p in sql_dir.glob("[0-9][0-9][0-9]_*.sql"))


async def connect(dsn: str, timeout: float = 10) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(dsn, timeout=timeout)
    except (OSError, asyncio.TimeoutError, asyncpg.PostgresError) as exc:
        raise ConnectionFailed(f"cannot reach Postgres at {redact_dsn(dsn)}: {exc}") from exc


async def _apply(dsn: str) -> list[str]:
    conn = await connect(dsn)
    applied = []
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_ID)
        await conn.execute("""CREATE TABLE IF NOT EXISTS kdg_schema_migrations (
            version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())""")
        done = {r["version"] for r in await conn.fetch("SELECT version FROM kdg_schema_migrations")}
        for path in migration_files():
            if path.name in done:
                continue
            async with conn.transaction():
                await conn.execute(path.read_text())
                await conn.execute("INSERT INTO kdg_schema_migrations (version) VALUES ($1)", path.name)
            applied.append(path.name)
    finally:
        await conn.close()
    return applied


def apply_migrations(dsn: str) -> list[str]:
    """Bring the schema up to date; returns the files applied now."""
    return asyncio.run(_apply(dsn))


async def _pending(dsn: str) -> list[str]:
    conn = await connect(dsn)
    try:
        exists = await conn.fetchval("SELECT to_regclass('kdg_schema_migrations') IS NOT NULL")
        done = set() if not exists else {r["version"] for r in await conn.fetch(
            "SELECT version FROM kdg_schema_migrations")}
    finally:
        await conn.close()
    return [p.name for p in migration_files() if p.name not in done]


def pending_migrations(dsn: str) -> list[str]:
    return asyncio.run(_pending(dsn))


def can_connect(dsn: str) -> bool:
    async def probe() -> bool:
        conn = await connect(dsn, timeout=3)
        await conn.close()
        return True

    try:
        return asyncio.run(probe())
    except ConnectionFailed:
        return False
