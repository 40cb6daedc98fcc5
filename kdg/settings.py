"""Connection settings every command shares: where Kafka and Postgres are, and user ``-X`` properties."""

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from kdg.errors import UsageError
from kdg.paths import default_state_dir
from kdg.stack.layout import StackLayout

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_SECRET_WORDS = ("password", "secret", "sasl.password", "ssl.key.password", "token")


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
               properties: list[str] | None = None, state_dir: Path | None = None) -> Connection:
    """Explicit values win, then ``KDG_*`` variables (Typer fills those), then the local stack."""
    layout = local_layout(state_dir)
    return Connection(
        bootstrap_servers=bootstrap_servers or layout.bootstrap_servers,
        pg_dsn=pg_dsn or os.environ.get("KDG_PG_DSN") or layout.pg_dsn,
        extra=parse_properties(properties or []),
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
    if parts.password is None:
        return re.sub(r"(password=)\S+", r"\1***", dsn)
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def redact_properties(props: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if any(w in k.lower() for w in _SECRET_WORDS) else v) for k, v in props.items()}


def sql_identifier(name: str, what: str = "table") -> str:
    """``name`` if it is a plain lower-case SQL identifier, else a usage error."""
    if not _IDENTIFIER.match(name):
        raise UsageError(f"{what} name {name!r} must match [a-z_][a-z0-9_]* (at most 63 characters)")
    return name
