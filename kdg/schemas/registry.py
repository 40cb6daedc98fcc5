"""One client for a Confluent-compatible Schema Registry, from the connection's ``schema.registry.*`` settings.

The settings come from the ``-F`` profile or ``-X`` (``schema.registry.url``, ``basic.auth.user.info``,
``schema.registry.ssl.ca.location`` …), or ``--schema-registry URL``; the local stack's registry when
it runs one. Schemas are fetched once per id and kept. A registry that cannot be reached, or answers
5xx, 408 or 429, or a page that is not a registry's, is waited for with backoff, as start-up waits for
Kafka and Postgres: for ``--wait-timeout`` by `kdg consume` and `kdg produce` (:func:`waiting_for_registry`),
ending early on a stop request; elsewhere (a one-shot command, a Spark task) for :data:`BLIP_S`. Past it,
it is a :class:`kdg.errors.ConnectionFailed` (the consumer stops, nothing is committed past it), never a
reason to dead-letter a record.
"""

import contextlib
import os
import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit

from kdg.errors import ConnectionFailed, MissingComponent, UsageError
from kdg.lifecycle import Shutdown, wait_until_up
from kdg.profile import redact

NEGATIVE_TTL_S = 30.0  # an id the registry did not know is asked again after this long
BLIP_S = 10.0          # how long a registry that is away is waited for where no command said otherwise
HTTP_TIMEOUT_S = 10.0  # a registry that takes a connection and never answers is away (schema.registry.timeout)
_CLIENT_KEYS = ("url", "basic.auth.user.info", "basic.auth.credentials.source", "ssl.ca.location",
                "ssl.certificate.location", "ssl.key.location", "ssl.key.password", "timeout")
_FILES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location")
# the Java clients' way of naming where the login comes from; the Python client takes it from whichever is given
_CREDENTIAL_SOURCES = ("USER_INFO", "URL")
_LOGIN = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*://)?)[^/@]*@")  # the user:password@ of a URL, scheme or not


@dataclass
class Patience:
    """How long a registry that is away is waited for, what ends the wait early, and who hears of it."""

    timeout: float = BLIP_S
    shutdown: Shutdown | None = None
    notice: Callable[[str], None] = field(default=lambda text: None)


# a blip's worth by default (a one-shot command, a Spark task); `kdg consume` and `kdg produce` set theirs
# (--wait-timeout, their stop request, their notices) with waiting_for_registry
PATIENCE = Patience()


@contextlib.contextmanager
def waiting_for_registry(timeout: float, shutdown: Shutdown | None, notice: Callable[[str], None]):
    """For the life of a command: registry outages waited for up to ``timeout`` s, told to ``notice``, ended
    by ``shutdown`` (:class:`kdg.lifecycle.StopRequested`, which the command takes as its stop)."""
    global PATIENCE
    before, PATIENCE = PATIENCE, Patience(timeout, shutdown, notice)
    try:
        yield
    finally:
        PATIENCE = before


def _passing(exc: Exception) -> bool:
    """Whether ``exc`` may pass by waiting: a refused or lost connection, a timeout; not a certificate the
    client refuses, a URL it cannot use, or anything that is not the transport's."""
    import ssl

    import httpx

    if not isinstance(exc, httpx.TransportError) or isinstance(exc, httpx.UnsupportedProtocol):
        return False
    cause = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return False
        cause = cause.__cause__ or cause.__context__
    return True


def shown_url(url: str) -> str:
    """A registry URL (or a comma-separated list of them) fit to print: any login taken out, scheme or not."""
    return ",".join(_LOGIN.sub(r"\1", part.strip()) for part in url.split(","))


def _client_conf(settings: dict[str, str]) -> dict:
    """The client's configuration from kdg's settings, every mistake in them a usage error that names the
    setting and never shows a login."""
    conf = {}
    for key, value in settings.items():
        name = key.removeprefix("schema.registry.")
        if name not in _CLIENT_KEYS:
            raise UsageError(f"{key}: not a Schema Registry setting kdg knows; use schema.registry.url, "
                             "basic.auth.user.info or schema.registry.ssl.{ca,certificate,key}.location")
        if name == "timeout":
            try:
                value = float(value)
            except ValueError:
                raise UsageError(f"{key}={value!r}: not a number of seconds") from None
            if not value > 0:
                raise UsageError(f"{key}={value!r}: must be more than 0 seconds")
        elif name == "basic.auth.credentials.source":
            if str(value).upper() not in _CREDENTIAL_SOURCES:
                raise UsageError(f"{key}={value}: kdg's registry client takes the login from basic.auth.user.info "
                                 "or from the URL (USER_INFO or URL), nothing else")
            continue  # the client takes the login from where it is given
        elif name == "basic.auth.user.info" and ":" not in value:
            raise UsageError(f"{key}: must be USER:PASSWORD")
        elif name in _FILES and not os.path.exists(value):
            raise UsageError(f"{key}={value}: no such file")
        conf[name] = value
    conf.setdefault("timeout", HTTP_TIMEOUT_S)
    if not conf.get("url"):
        raise UsageError("a schema'd format needs a Schema Registry: --schema-registry URL, schema.registry.url in "
                         "the -F profile, or a local stack started with `kdg stack up --schema-registry`")
    for part in conf["url"].split(","):
        parts = urlsplit(part.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"Schema Registry URL {shown_url(part)!r}: use http://HOST:PORT or "
                             "https://HOST:PORT (with any path the registry's API is under)")
    if "basic.auth.user.info" in conf and any(urlsplit(p.strip()).password is not None
                                              for p in conf["url"].split(",")):
        raise UsageError("the Schema Registry login is given twice, in the URL and in basic.auth.user.info: "
                         "give it once")
    return conf


class Registry:
    """Schemas by id (kept), subjects' latest versions, and registration."""

    def __init__(self, settings: dict[str, str]):
        conf = _client_conf(settings)
        self.url = shown_url(conf["url"])  # shown: never a login in it
        try:
            with warnings.catch_warnings():
                # authlib (the client's OAuth support, unused here) warns about httpx on import, under a filter
                # of its own that says "always": ours goes in front of it
                from authlib.deprecate import AuthlibDeprecationWarning
                warnings.simplefilter("ignore", AuthlibDeprecationWarning)
                from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
                from confluent_kafka.schema_registry.error import SchemaRegistryError
        except ImportError as exc:
            raise MissingComponent(f"schema'd formats need kdg's `schemas` extra: pip install 'kdg[schemas]' "
                                   f"({exc.name} is missing)") from None
        self._schema_cls, self._error = Schema, SchemaRegistryError
        # no retries of the client's own (sleeps a stop request cannot end): kdg's wait is the one (Patience)
        try:
            self._client = SchemaRegistryClient({**conf, "max.retries": 0})
        except (ValueError, TypeError, OSError) as exc:  # a certificate or key it cannot load, and the like
            logins = {f"url.{i}.password": urlsplit(p.strip()).password for i, p in enumerate(conf["url"].split(","))}
            message = redact(str(exc), {**conf, **logins})  # every secret setting's value, and the URLs' passwords
            files = ", ".join(f"{k}={conf[k]}" for k in _FILES if k in conf)
            raise UsageError(f"the Schema Registry settings{f' ({files})' if files else ''}: "
                             f"{type(exc).__name__}: {message}") from None
        self._by_id: dict[int, tuple[str, str | None]] = {}
        self._unknown: dict[int, float] = {}

    def _call(self, what: str, fn, *args):
        """``fn(*args)``, waited for while the registry is away (see :class:`Patience`); its other errors raised."""
        def once():
            try:
                return fn(*args)
            except self._error as exc:
                code = exc.http_status_code
                if code in (408, 429) or code >= 500 or exc.error_code == -1:  # not serving yet, or busy, or
                    # a page that is not the registry's (a proxy's in front of it, or a URL that misses its API)
                    answer = (f"HTTP {code}: {exc.error_message}" if exc.error_code != -1 else
                              f"HTTP {code} with a page that is not a registry's answer")
                    raise ConnectionFailed(f"the Schema Registry at {self.url} answered {answer} ({what})") from None
                raise
            except Exception as exc:  # httpx's connect/timeout errors and the like: the registry is not there
                failed = ConnectionFailed(f"cannot reach the Schema Registry at {self.url} ({what}): "
                                          f"{type(exc).__name__}: {exc}")
                failed.retriable = _passing(exc)
                raise failed from None

        p = PATIENCE
        return wait_until_up("the Schema Registry", once, p.timeout, p.shutdown, p.notice)

    def schema(self, schema_id: int) -> tuple[str, str | None]:
        """``(schema_text, schema_type or None)`` of ``schema_id``; ValueError if the registry has no such id."""
        found = self._by_id.get(schema_id)
        if found is not None:
            return found
        if time.monotonic() < self._unknown.get(schema_id, 0.0):
            raise ValueError(f"unknown schema id {schema_id}: the Schema Registry at {self.url} has none")
        try:
            schema = self._call(f"schema id {schema_id}", self._client.get_schema, schema_id)
        except self._error as exc:
            if exc.http_status_code == 404:
                self._unknown[schema_id] = time.monotonic() + NEGATIVE_TTL_S
                raise ValueError(f"unknown schema id {schema_id}: the Schema Registry at {self.url} has none") from None
            raise ConnectionFailed(f"the Schema Registry at {self.url} failed on schema id {schema_id}: "
                                   f"HTTP {exc.http_status_code}: {exc.error_message}") from None
        found = self._by_id[schema_id] = (schema.schema_str, schema.schema_type)
        return found

    def latest(self, subject: str) -> tuple[int, str, str | None, int]:
        """``(schema_id, text, type, version)`` of ``subject``'s latest version; UsageError if it has none."""
        try:
            reg = self._call(f"subject {subject}", self._client.get_latest_version, subject)
        except self._error as exc:
            if exc.http_status_code == 404:
                raise UsageError(f"the Schema Registry at {self.url} has no subject {subject!r}") from None
            raise ConnectionFailed(f"the Schema Registry at {self.url} failed on subject {subject!r}: "
                                   f"HTTP {exc.http_status_code}: {exc.error_message}") from None
        return reg.schema_id, reg.schema.schema_str, reg.schema.schema_type, reg.version

    def register(self, subject: str, text: str, schema_type: str) -> int:
        """The id of ``text`` under ``subject``, registering it if new; an incompatible one is a UsageError."""
        try:
            return self._call(f"registering under {subject}", self._client.register_schema, subject,
                              self._schema_cls(text, schema_type))
        except self._error as exc:
            raise UsageError(f"the Schema Registry at {self.url} refused the schema under {subject!r}: "
                             f"HTTP {exc.http_status_code}: {exc.error_message}") from None
