"""One client for a Confluent-compatible Schema Registry, from the connection's ``schema.registry.*`` settings.

The settings come from the ``-F`` profile or ``-X`` (``schema.registry.url``, ``basic.auth.user.info``,
``schema.registry.ssl.ca.location`` …), or ``--schema-registry URL``; the local stack's registry when
it runs one. Schemas are fetched once per id and kept; a registry that cannot be reached is a
:class:`kdg.errors.ConnectionFailed` (the consumer stops, nothing is committed past it), never a
reason to dead-letter a record.
"""

import time
import warnings
from urllib.parse import urlsplit

from kdg.errors import ConnectionFailed, MissingComponent, UsageError

NEGATIVE_TTL_S = 30.0  # an id the registry did not know is asked again after this long
_CLIENT_KEYS = ("url", "basic.auth.user.info", "basic.auth.credentials.source", "ssl.ca.location",
                "ssl.certificate.location", "ssl.key.location", "ssl.key.password", "timeout")


def _client_conf(settings: dict[str, str]) -> dict:
    conf = {}
    for key, value in settings.items():
        name = key.removeprefix("schema.registry.")
        if name not in _CLIENT_KEYS:
            raise UsageError(f"{key}: not a Schema Registry setting kdg knows; use schema.registry.url, "
                             "basic.auth.user.info or schema.registry.ssl.{ca,certificate,key}.location")
        conf[name] = float(value) if name == "timeout" else value
    if not conf.get("url"):
        raise UsageError("a schema'd format needs a Schema Registry: --schema-registry URL, schema.registry.url in "
                         "the -F profile, or a local stack started with `kdg stack up --schema-registry`")
    return conf


class Registry:
    """Schemas by id (kept), subjects' latest versions, and registration."""

    def __init__(self, settings: dict[str, str]):
        conf = _client_conf(settings)
        parts = urlsplit(conf["url"])
        self.url = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()  # shown: never a login in it
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
        self._client = SchemaRegistryClient(conf)
        self._by_id: dict[int, tuple[str, str | None]] = {}
        self._unknown: dict[int, float] = {}

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except self._error:
            raise
        except Exception as exc:  # httpx's connect/timeout errors and the like: the registry is not there
            raise ConnectionFailed(f"cannot reach the Schema Registry at {self.url} ({what}): "
                                   f"{type(exc).__name__}: {exc}") from None

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
