"""The kdg schema: numbered SQL files shipped in ``kdg/resources/sql``, applied once each, in order.

``apply_migrations`` holds one advisory lock from before it reads what is applied until its
connection closes, so two processes migrating the same database never race.
"""

import asyncio
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from importlib.resources.abc import Traversable

import asyncpg

from kdg.errors import (AuthenticationFailed, ConnectionFailed, MissingComponent, PostgresRefused, SchemaMissing,
                        UsageError)
from kdg.paths import resource
from kdg.settings import redact_dsn

_LOCK_ID = 0x6B6467  # "kdg"
_NUMBERED = re.compile(r"^\d{3}_.+\.sql$")
_TABLE = """CREATE TABLE IF NOT EXISTS kdg_schema_migrations (
    version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"""


@dataclass(frozen=True)
class MigrationState:
    """One shipped migration file and when it was applied here (``None``: pending)."""

    version: str
    applied_at: datetime | None

    @property
    def is_applied(self) -> bool:
        return self.applied_at is not None


@dataclass
class SchemaStatus:
    """Every shipped migration, applied or pending, in one database (``dsn`` without its password)."""

    dsn: str
    migrations: list[MigrationState] = field(default_factory=list)

    @property
    def pending(self) -> list[str]:
        return [m.version for m in self.migrations if not m.is_applied]

    def to_dict(self) -> dict:
        return {"dsn": self.dsn, "pending": self.pending,
                "migrations": [{**asdict(m), "applied": m.is_applied} for m in self.migrations]}


@dataclass
class MigrateReport:
    """What ``kdg db migrate`` did: the files applied now, and those applied before."""

    dsn: str
    applied: list[str] = field(default_factory=list)
    already_applied: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def migration_files() -> list[Traversable]:
    """The shipped migrations in order; none at all is a broken install, never an empty schema."""
    folder = resource("sql")
    found = [f for f in folder.iterdir() if _NUMBERED.match(f.name)] if folder.is_dir() else []
    if not found:
        raise MissingComponent("this kdg install has no SQL migrations (broken package?): reinstall kdg with pip")
    return sorted(found, key=lambda f: f.name)


async def connect(dsn: str, timeout: float = 10) -> asyncpg.Connection:
    """An asyncpg connection; a DSN asyncpg refuses is a usage error, an unreachable server ConnectionFailed.
    Unless the DSN names one, its ``application_name`` is ``kdg[PID]``: ``pg_stat_activity`` says which process
    holds it."""
    named = "application_name" in dsn
    try:
        return await asyncpg.connect(dsn, timeout=timeout,
                                     server_settings=None if named else {"application_name": f"kdg[{os.getpid()}]"})
    except asyncpg.exceptions.ClientConfigurationError as exc:
        raise UsageError(f"--pg-dsn {redact_dsn(dsn)}: {exc}") from None
    except asyncpg.exceptions.InvalidAuthorizationSpecificationError as exc:  # class 28: role, password, pg_hba
        raise AuthenticationFailed(f"Postgres at {redact_dsn(dsn)} refused the login: {exc}") from None
    except (OSError, asyncio.TimeoutError, asyncpg.PostgresError) as exc:
        raise ConnectionFailed(f"cannot reach Postgres at {redact_dsn(dsn)}: {exc}") from exc


async def _close(conn: asyncpg.Connection) -> None:
    """Close, or drop a connection that cannot close cleanly (its advisory lock goes with it either way)."""
    try:
        await conn.close(timeout=5)
    except (OSError, asyncio.TimeoutError, asyncpg.InterfaceError, asyncpg.PostgresError):
        conn.terminate()


async def _applied_at(conn: asyncpg.Connection) -> dict[str, datetime]:
    if not await conn.fetchval("SELECT to_regclass('kdg_schema_migrations') IS NOT NULL"):
        return {}
    return {r["version"]: r["applied_at"] for r in await conn.fetch(
        "SELECT version, applied_at FROM kdg_schema_migrations")}


async def _elsewhere(conn: asyncpg.Connection) -> tuple[list[str], str]:
    """The schemas of this database that hold kdg's tables but are not where this connection finds them
    (its search_path leaves them out), and that search_path."""
    found = [r["nspname"] for r in await conn.fetch(
        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = 'kdg_schema_migrations' AND c.relkind IN ('r', 'p') "
        "AND c.oid IS DISTINCT FROM to_regclass('kdg_schema_migrations') ORDER BY 1")]
    return found, await conn.fetchval("SELECT current_setting('search_path')")


def _second_copy(schemas: list[str], path: str, shown: str) -> str:
    return (f"kdg's tables are in schema {', '.join(schemas)} of this database, which the search_path of "
            f"{shown} ({path}) leaves out: put {schemas[0]} on it (…?options=-csearch_path%3D"
            f"{path.replace(' ', '')},{schemas[0]}) "
            "rather than making a second copy. Two copies keep two sets of claims and offsets, and an "
            "exactly-once writer of one copy does not see the other's: a table both write gets records twice")


async def _migrate(dsn: str, second_copy: bool = False) -> MigrateReport:
    files = migration_files()
    report = MigrateReport(redact_dsn(dsn))
    conn = await connect(dsn)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_ID)  # held until the connection closes
        if not second_copy and not await conn.fetchval("SELECT to_regclass('kdg_schema_migrations') IS NOT NULL"):
            schemas, path = await _elsewhere(conn)
            if schemas:
                raise UsageError(_second_copy(schemas, path, report.dsn) + " (kdg db migrate --second-copy makes "
                                 "one all the same)")
        await conn.execute(_TABLE)
        done = await _applied_at(conn)
        for sql in files:
            if sql.name in done:
                report.already_applied.append(sql.name)
                continue
            async with conn.transaction():
                await conn.execute(sql.read_text())
                await conn.execute("INSERT INTO kdg_schema_migrations (version) VALUES ($1)", sql.name)
            report.applied.append(sql.name)
    except (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError) as exc:
        raise ConnectionFailed(f"lost Postgres at {report.dsn} while migrating: {exc}") from exc
    except asyncpg.PostgresError as exc:
        raise PostgresRefused(f"Postgres at {report.dsn} refused the kdg schema ({exc.sqlstate} "
                              f"{type(exc).__name__}): {str(exc).splitlines()[0]}") from exc
    finally:
        await _close(conn)
    return report


def apply_migrations(dsn: str, second_copy: bool = False) -> MigrateReport:
    """Bring the schema up to date (idempotent); the report names the files applied now. Where the database
    holds kdg's tables in a schema this DSN's search_path leaves out, a usage error unless ``second_copy``."""
    return asyncio.run(_migrate(dsn, second_copy))


async def _status(dsn: str) -> SchemaStatus:
    files = migration_files()
    conn = await connect(dsn)
    try:
        done = await _applied_at(conn)
    finally:
        await _close(conn)
    return SchemaStatus(redact_dsn(dsn), [MigrationState(f.name, done.get(f.name)) for f in files])


def schema_status(dsn: str) -> SchemaStatus:
    """Each shipped migration, applied (and when) or pending, in the database at ``dsn``."""
    return asyncio.run(_status(dsn))


async def require_schema(conn: asyncpg.Connection, dsn: str) -> None:
    """Raise :class:`SchemaMissing` unless every shipped migration is applied; one query, outside a transaction."""
    names = [f.name for f in migration_files()]
    try:
        pending = [r["name"] for r in await conn.fetch(
            "SELECT name FROM unnest($1::text[]) WITH ORDINALITY AS f(name, i) WHERE NOT EXISTS "
            "(SELECT 1 FROM kdg_schema_migrations m WHERE m.version = f.name) ORDER BY i", names)]
    except asyncpg.UndefinedTableError:
        pending = names
    if pending:
        shown = redact_dsn(dsn)
        if pending == names:
            schemas, path = await _elsewhere(conn)
            if schemas:
                raise SchemaMissing(_second_copy(schemas, path, shown))
        raise SchemaMissing(f"the kdg schema is not in {shown} (pending: {', '.join(pending)}); "
                            f"run: kdg db migrate --pg-dsn '{shown}'")


def can_connect(dsn: str) -> bool:
    async def probe() -> bool:
        conn = await connect(dsn, timeout=3)
        await conn.close()
        return True

    try:
        return asyncio.run(probe())
    except ConnectionFailed:
        return False
