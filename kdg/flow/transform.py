"""Per-record transforms: the user's function between the router and the table.

``--transform module:function`` (or ``transform = "pkg.mod:fn"`` in a route) names a function called once
per record with a :class:`TransformRecord` — the value and key decoded by the route's formats, the
headers as a dict, where the record was read and its idempotency key. It returns:

- a dict: the row's fields, which the mapping's ``json:`` sources read (the generic table stores it as
  the record's JSON value);
- a list of dicts: one row each (an *explode*), the ``i``-th keyed ``KEY#i`` so that exactly-once holds
  per row;
- ``None``: the record is filtered out, and counted as filtered.

A transform that raises sends its record to the dead-letter topic with ``kdg-error-type`` and
``kdg-error-message`` headers, and the batch goes on: the error is the record's, not the pipeline's.
"""

import importlib
import json
import os
import sys
from dataclasses import dataclass
from decimal import Decimal

from kdg.errors import UsageError
from kdg.records import Record

ERROR_TYPE_HEADER = "kdg-error-type"
ERROR_MESSAGE_HEADER = "kdg-error-message"


@dataclass(frozen=True, slots=True)
class TransformRecord:
    """What a transform is given: one record, decoded by its route's formats."""

    value: object              # the value decoded (JSON: dict, list, …; raw: bytes); None for a tombstone
    key: object                # the key decoded likewise (JSON; else its text, or bytes)
    headers: dict              # header name → value as text (of a repeated name the last)
    topic: str
    partition: int
    offset: int
    timestamp: int | None      # Kafka's, in milliseconds
    idempotency_key: str       # the record's kdg-id, or what --id-from / the route's id_from made of it


@dataclass(eq=False)
class Derived(Record):
    """A record as a transform (or a fan-out) made it: ``row`` is what its ``json:`` sources read (its ``value``
    stays the record's own bytes, for a dead letter; the generic table takes :meth:`as_value`)."""

    row: dict | None = None    # None: the record as it is (a fan-out's output without a transform)
    route: str | None = None   # a fan-out's route it goes to

    def as_value(self) -> bytes:
        if self.row is None:
            return self.value
        return json.dumps(self.row, separators=(",", ":"), default=str).encode()


def load_function(spec: str | None, option: str):
    """``module:function`` imported (from the current directory too, as ``python -m`` finds modules), or a
    callable as it is; None for None. A spec that cannot be imported is a usage error naming it."""
    if spec is None or callable(spec):
        return spec
    module, sep, func = spec.partition(":")
    if not sep or not module or not func:
        raise UsageError(f"{option} {spec!r}: use module:function")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"{option} {spec!r}: {exc}") from None
    if not callable(found):
        raise UsageError(f"{option} {spec!r}: {func} is not a function")
    return found


class Transform:
    """One route's transform, applied to a batch's ``(record, key)`` pairs."""

    def __init__(self, fn, decode_value=None, decode_key=None):
        """``decode_value``/``decode_key``: the route's decoders (None: JSON, or the bytes where not JSON)."""
        self.fn, self._value, self._key = fn, decode_value or _json_or_bytes, decode_key or _json_or_bytes

    def rows(self, rec: Record, key: str, route: str | None = None) -> list:
        """The record's rows, ``(Derived, key)`` each (none: filtered); :class:`Failed` with its dead letter."""
        try:
            made = self.fn(TransformRecord(
                self._value(rec.value) if rec.value is not None else None,
                self._key(rec.key) if rec.key is not None else None,
                {k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v for k, v in rec.headers},
                rec.topic, rec.partition, rec.offset, rec.timestamp, key))
        except Exception as exc:  # the record's error, not the pipeline's: dead-lettered, the batch goes on
            raise Failed((rec, f"transform raised {type(exc).__name__}: {exc}", key,
                          [(ERROR_TYPE_HEADER, type(exc).__name__.encode()),
                           (ERROR_MESSAGE_HEADER, str(exc).encode("utf-8", "replace")[:2000])])) from None
        if made is None:
            return []
        if isinstance(made, dict):
            return [(_derived(rec, made, route), key)]
        if isinstance(made, list) and all(isinstance(m, dict) for m in made):
            return [(_derived(rec, m, route), f"{key}#{i}") for i, m in enumerate(made)]
        raise Failed((rec, f"transform returned {type(made).__name__}: a dict, a list of dicts or None is expected",
                      key, [(ERROR_TYPE_HEADER, b"TypeError")]))


class Failed(Exception):
    """A transform's error, as the record's dead letter ``(record, reason, key, headers)``."""

    def __init__(self, dead: tuple):
        super().__init__(dead[1])
        self.dead = dead


def fan_out(pairs: list, outputs: list, out: list, dead: list) -> tuple[int, int]:
    """Each ``(record, key)`` through every output — ``(route name or None, Transform or None)``: a record's rows
    of every output into ``out``, or, if any output's transform fails, the record into ``dead`` and none of its
    rows. Returns (records filtered: no row at all, rows beyond one per record)."""
    filtered = extra = 0
    tagged = len(outputs) > 1
    for rec, key in pairs:
        rows = []
        try:
            for route, transform in outputs:
                if transform is not None:
                    rows += transform.rows(rec, key, route)
                else:
                    rows.append((_derived(rec, None, route) if tagged else rec, key))
        except Failed as failed:
            dead.append(failed.dead)
            continue
        if not rows:
            filtered += 1
        extra += max(len(rows) - 1, 0)
        out += rows
    return filtered, extra


def _derived(rec: Record, row: dict | None, route: str | None) -> Derived:
    return Derived(rec.value, rec.key, rec.headers, rec.partition, rec.topic, rec.offset, rec.timestamp, row, route)


def _json_or_bytes(data: bytes):
    """JSON with its decimals exact (:class:`~decimal.Decimal`), or the bytes as they are where not JSON."""
    try:
        return json.loads(data, parse_float=Decimal)
    except ValueError:
        return data
