"""Connection settings every command shares: where Kafka and Postgres are, and user ``-X`` properties."""

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from kdg.errors import UsageError
from kdg.paths import default_state_dir
from kdg.profile import is_secret, merged_properties, profile_path
from kdg.stack.layout import StackLayout

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Connection:
    """Where to find Kafka and Postgres, and the user's extra librdkafka properties."""

    bootstrap_servers: str
    pg_dsn: str
    extra: dict[str, str] = field(default_factory=dict)


def local_layout(state_dir: Path | None = None) -> StackLayout:
    state_dir = state_dir or default_state_dir()
    return StackLayout.load(state_dir) or StackLayout(state_dir=state_dir)


def connection(bootstrap_servers: str | None = None, pg_dsn: str | None = None,
               properties: list[str] | None = None, state_dir: Path | None = None,
               profile: Path | None = None) -> Connection:
    """Explicit values win, then ``KDG_*`` variables (Typer fills those), then the local stack.

    Kafka properties: the profile file (``-F``, else ``KDG_KAFKA_CONFIG``), then ``-X`` on top,
    secret references resolved (:mod:`kdg.profile`). With neither a profile nor bootstrap servers
    given, a command talks to the local stack; on a ``--secure`` stack that means its
    ``client.properties`` (the client user), exactly as if ``-F`` had named it.

    A DSN asyncpg could not parse (not a ``postgresql://`` URL, a port that is no number) is a
    usage error naming it without its password.
    """
    layout = local_layout(state_dir)
    dsn = pg_dsn or os.environ.get("KDG_PG_DSN") or layout.pg_dsn
    try:
        parts = urlsplit(dsn)
    except ValueError as exc:
        raise UsageError(f"--pg-dsn {redact_dsn(dsn)}: {exc}") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise UsageError(f"--pg-dsn {redact_dsn(dsn)!r}: expected a URL, postgresql://USER:PASSWORD@HOST:PORT/DB")
    for host in parts.netloc.rpartition("@")[2].split(","):  # host[:port], [v6]:port, comma-separated
        _, colon, port = host.rpartition("]")[2].partition(":")
        if colon and not (port.isdigit() and 0 < int(port) < 65536):
            raise UsageError(f"--pg-dsn {redact_dsn(dsn)!r}: port {port!r} is not a number from 1 to 65535")
    if profile_path(profile) is None and not bootstrap_servers and layout.secure:
        profile = layout.client_profile
    return Connection(
        bootstrap_servers=bootstrap_servers or layout.bootstrap_servers,
        pg_dsn=dsn,
        extra=merged_properties(profile, parse_properties(properties or [])),
    )


def parse_properties(items: list[str], option: str = "-X", what: str = "a librdkafka property") -> dict[str, str]:
    """``-X key=value`` items to a dict; a malformed item is a usage error naming it."""
    props: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{option} {item!r}: expected key=value ({what})")
        props[key.strip()] = value
    return props


def redact_dsn(dsn: str) -> str:
    """A DSN fit to print: its password replaced by ``***``."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparseable dsn>"
    masked = dsn
    if parts.password is not None:
        masked = urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))
    return re.sub(r"(password=)[^&\s]+", r"\1***", masked)  # libpq style, or ?password= in a URL


def redact_properties(props: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if is_secret(k) else v) for k, v in props.items()}


def sql_identifier(name: str, what: str = "table") -> str:
    """``name`` if it is a plain lower-case SQL identifier, else a usage error."""
    if not _IDENTIFIER.match(name):
        raise UsageError(f"{what} name {name!r} must match [a-z_][a-z0-9_]* (at most 63 characters)")
    return name


@dataclass(frozen=True)
class TableName:
    """A sink table, in the default schema (``schema`` None) or in a named one."""

    schema: str | None
    name: str

    @property
    def sql(self) -> str:
        """For SQL text, each part double-quoted: ``"app"."events"``."""
        return ".".join(f'"{part}"' for part in self._parts())

    @property
    def text(self) -> str:
        """The canonical spelling, ``app.events``: the key in ``kdg_dedup.sink_table`` and in reports."""
        return ".".join(self._parts())

    def _parts(self) -> tuple[str, ...]:
        return (self.name,) if self.schema is None else (self.schema, self.name)

    def __str__(self) -> str:
        return self.text


def table_name(text: "str | TableName") -> TableName:
    """Parse ``name`` or ``schema.name``, each part a plain lower-case SQL identifier, else a usage error.

    >>> table_name("app.events").sql
    '"app"."events"'
    """
    if isinstance(text, TableName):
        return text
    parts = text.split(".")
    if len(parts) > 2:
        raise UsageError(f"table {text!r}: expected NAME or SCHEMA.NAME, not {len(parts)} dotted parts")
    try:
        schema = sql_identifier(parts[0], "schema") if len(parts) == 2 else None
        name = sql_identifier(parts[-1], "table")
    except UsageError as exc:
        raise UsageError(f"table {text!r}: {exc}") from None
    return TableName(schema, name)
