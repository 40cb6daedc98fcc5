"""Connection settings every command shares: where Kafka and Postgres are, and user ``-X`` properties."""

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from kdg.errors import UsageError
from kdg.paths import default_state_dir
from kdg.profile import is_secret, merged_properties, profile_path
from kdg.stack.layout import StackLayout

REGISTRY_PREFIXES = ("schema.registry.", "basic.auth.")  # a Schema Registry's settings, not librdkafka's
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Connection:
    """Where to find Kafka, Postgres and a Schema Registry, and the user's extra librdkafka properties."""

    bootstrap_servers: str
    pg_dsn: str
    extra: dict[str, str] = field(default_factory=dict)
    registry: dict[str, str] = field(default_factory=dict)  # schema.registry.*, basic.auth.* (kdg.schemas.registry)


def local_layout(state_dir: Path | None = None) -> StackLayout:
    state_dir = state_dir or default_state_dir()
    return StackLayout.load(state_dir) or StackLayout(state_dir=state_dir)


def connection(bootstrap_servers: str | None = None, pg_dsn: str | None = None,
               properties: list[str] | None = None, state_dir: Path | None = None,
               profile: Path | None = None, schema_registry: str | None = None) -> Connection:
    """Explicit values win, then ``KDG_*`` variables (Typer fills those), then the local stack.

    Kafka properties: the profile file (``-F``, else ``KDG_KAFKA_CONFIG``), then ``-X`` on top,
    secret references resolved (:mod:`kdg.profile`). With neither a profile nor bootstrap servers
    given, a command talks to the local stack; on a ``--secure`` stack that means its
    ``client.properties`` (the client user), exactly as if ``-F`` had named it.

    Schema Registry settings (``schema.registry.*``, ``basic.auth.*``) are taken out of the Kafka
    properties; ``schema_registry`` (``--schema-registry``) wins over ``schema.registry.url``, and
    without either the local stack's registry is used if it was started with one.

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
            if "@" in dsn and "@" not in parts.netloc:  # the "port" is the start of a password cut short
                raise UsageError(f"--pg-dsn {redact_dsn(dsn)!r}: the password holds a character a URL reserves; "
                                 "percent-encode it (# as %23, ? as %3F, / as %2F, @ as %40)")
            raise UsageError(f"--pg-dsn {redact_dsn(dsn)!r}: port {port!r} is not a number from 1 to 65535")
    if profile_path(profile) is None and not bootstrap_servers and layout.secure:
        profile = layout.client_profile
    extra = merged_properties(profile, parse_properties(properties or []))
    registry = {k: extra.pop(k) for k in list(extra) if k.startswith(REGISTRY_PREFIXES)}
    if schema_registry:
        registry["schema.registry.url"] = schema_registry
    elif "schema.registry.url" not in registry and layout.registry_url:
        registry["schema.registry.url"] = layout.registry_url
    return Connection(bootstrap_servers=bootstrap_servers or layout.bootstrap_servers, pg_dsn=dsn, extra=extra,
                      registry=registry)


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
    """A DSN fit to print: its password replaced by ``***``.

    Not parsed as a URL first: a password with ``#``, ``?`` or ``/`` in it, unencoded (libpq takes the first
    two), reads to a URL parser as a fragment, a query or a path, with no password at all."""
    return _PASSWORD_SETTING.sub(r"\1***", _URL_PASSWORD.sub(r"\1***\3", dsn))


# scheme://user: … @host: the password runs from the user's colon to the LAST @ (a password may hold one too)
_URL_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:@/]*:)(.*)(@[^@]*)$", re.S)


# libpq's keyword style (``password = 'a b'``, quoted or not), or ?password= in a URL; any case, as printed
_PASSWORD_SETTING = re.compile(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^&\s]+)")


def redact_properties(props: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if is_secret(k) else v) for k, v in props.items()}


def sql_identifier(name: str, what: str = "table") -> str:
    """``name`` if it is a plain lower-case SQL identifier, else a usage error."""
    if not _IDENTIFIER.match(name):
        raise UsageError(f"{what} name {name!r} must match [a-z_][a-z0-9_]* (at most 63 characters)")
    return name


_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")  # migration 003 quotes by the same rule
_PART = re.compile(r'"((?:[^"]|"")*)"|([A-Za-z_][A-Za-z0-9_$]*)')


def _quoted(part: str) -> str:
    return '"' + part.replace('"', '""') + '"'


def _quote_if_needed(part: str) -> str:
    return part if _PLAIN.fullmatch(part) else _quoted(part)


@dataclass(frozen=True)
class TableName:
    """A table: ``name`` as Postgres stores it (case kept), in ``schema`` or, when None, not yet resolved.

    A name from the command line is a *spelling*; the store resolves it (:mod:`kdg.store.identity`) to the
    table's identity, always schema-qualified, so that two spellings of one table are one table to kdg.
    """

    schema: str | None
    name: str

    @property
    def sql(self) -> str:
        """For SQL text, each part double-quoted: ``"app"."events"``."""
        return ".".join(_quoted(part) for part in self._parts())

    @property
    def text(self) -> str:
        """The canonical spelling, ``app.events`` (a part quoted only where it must be, ``app."Events"``):
        parsed back by :func:`table_name` to the same table; the key in ``kdg_dedup.sink_table`` and in reports."""
        return ".".join(_quote_if_needed(part) for part in self._parts())

    def _parts(self) -> tuple[str, ...]:
        return (self.name,) if self.schema is None else (self.schema, self.name)

    def __str__(self) -> str:
        return self.text


def table_name(text: "str | TableName") -> TableName:
    """Parse ``name`` or ``schema.name`` as Postgres does: an unquoted part is folded to lower case, a
    double-quoted one is kept as written (``""`` for a quote). Anything else is a usage error.

    >>> table_name('App."Order Lines"').sql
    '"app"."Order Lines"'
    """
    if isinstance(text, TableName):
        return text
    parts, pos = [], 0
    while True:
        found = _PART.match(text, pos)
        if found is None:
            shown = text[pos:] or "''"
            raise UsageError(f"table {text!r}: table name {shown} must match [a-z_][a-z0-9_]* or be "
                             'double-quoted ("My Table"), as in SQL')
        quoted, plain = found.groups()
        part = quoted.replace('""', '"') if quoted is not None else plain.lower()
        if not part or "\x00" in part or len(part.encode()) > 63:
            raise UsageError(f"table {text!r}: a name part must be 1 to 63 bytes (Postgres would cut a longer one)")
        parts.append(part)
        pos = found.end()
        if pos == len(text):
            break
        if text[pos] != ".":
            raise UsageError(f"table {text!r}: {text[pos:]!r} after {text[:pos]!r}: a name must match "
                             '[a-z_][a-z0-9_]* or be double-quoted ("My Table"), as in SQL')
        pos += 1
    if len(parts) > 2:
        raise UsageError(f"table {text!r}: expected NAME or SCHEMA.NAME, not {len(parts)} dotted parts")
    return TableName(parts[0] if len(parts) == 2 else None, parts[-1])
