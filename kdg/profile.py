"""Kafka client profiles, kcat-style: librdkafka properties in a file (``-F FILE``), and secrets by reference.

A profile is ``key=value`` lines; ``#`` starts a comment line, blank lines are skipped::

    # prod.properties
    security.protocol=SASL_SSL
    sasl.mechanism=SCRAM-SHA-512
    sasl.username=orders-app
    sasl.password=${env:ORDERS_KAFKA_PASSWORD}
    ssl.ca.location=/etc/kafka/ca.pem

Any value, in the file or in ``-X``, may be a reference instead of the secret itself:
``${env:NAME}`` takes the environment variable ``NAME``, ``@PATH`` the contents of the file
``PATH`` (one trailing newline dropped). ``-X`` wins over the file; ``KDG_KAFKA_CONFIG`` names the
file used when ``-F`` is not given. A secret's value is never part of an error message.
"""

import os
import re
from pathlib import Path

from kdg.errors import UsageError

PROFILE_ENV = "KDG_KAFKA_CONFIG"
_ENV_REF = re.compile(r"^\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}$")
_SECRET_WORDS = ("password", "secret", "token", "jaas", "user.info")  # user.info: a registry's USER:PASSWORD


def is_secret(key: str) -> bool:
    """A property whose value is never shown: ``sasl.password``, ``ssl.key.password``, ``*.secret`` …"""
    return any(word in key.lower() for word in _SECRET_WORDS)


def profile_path(option: Path | None) -> Path | None:
    """``-F`` if given, else the file ``KDG_KAFKA_CONFIG`` names, else none."""
    if option is not None:
        return option
    named = os.environ.get(PROFILE_ENV, "").strip()
    return Path(named) if named else None


def read_profile(path: Path, source: str = "-F") -> dict[str, str]:
    """The properties in ``path``, references resolved; a malformed line is a usage error naming its number."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{source} {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{source} {path}: is a directory, not a properties file") from None
    except PermissionError:
        raise UsageError(f"{source} {path}: not readable by this user") from None
    except UnicodeDecodeError:
        raise UsageError(f"{source} {path}: not UTF-8 text") from None
    props: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not key.strip():
            shown = "a line without '='" if not sep else "a line without a key"
            raise UsageError(f"{source} {path}:{number}: {shown}; expected key=value")
        props[key.strip()] = value.strip()
    return resolve_references(props, f"{source} {path}")


def resolve_references(props: dict[str, str], where: str = "-X") -> dict[str, str]:
    """Each ``${env:NAME}`` or ``@PATH`` value replaced by what it names."""
    return {key: _resolve(key, value, where) for key, value in props.items()}


def _resolve(key: str, value: str, where: str) -> str:
    if found := _ENV_REF.match(value):
        name = found.group(1)
        if name not in os.environ:
            raise UsageError(f"{where}: {key} names the environment variable {name}, which is not set")
        return os.environ[name]
    if value.startswith("@") and len(value) > 1:
        path = Path(value[1:]).expanduser()
        try:
            content = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise UsageError(f"{where}: {key} reads the file {path}: {reason}") from None
        return content[:-1] if content.endswith("\n") else content
    return value


def merged_properties(profile: Path | None, typed: dict[str, str]) -> dict[str, str]:
    """The file's properties (``-F`` or ``KDG_KAFKA_CONFIG``), then ``-X`` on top: ``-X`` wins."""
    path = profile_path(profile)
    base = read_profile(path, "-F" if profile is not None else PROFILE_ENV) if path else {}
    return {**base, **resolve_references(typed)}


def redact(text: str, props: dict[str, str]) -> str:
    """``text`` with the value of every secret property in ``props`` replaced by ``***``."""
    for key, value in props.items():
        if is_secret(key) and value:
            text = text.replace(str(value), "***")
    return text
