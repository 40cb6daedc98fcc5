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
from decimal import Decimal

from kdg.errors import UsageError
from kdg.mapping.sources import json_reader
from kdg.records import Record, RecordColumns, with_value
from kdg.store.rows import SinkRows, headers_json, sink_row

ERROR_TYPE_HEADER = "kdg-error-type"
ERROR_MESSAGE_HEADER = "kdg-error-message"


class TransformRecord:
    """What a transform is given: one record, decoded by its route's formats.

    ``value``: the value decoded (JSON: dict, list, … with decimals as :class:`~decimal.Decimal`; a format
    that is not JSON: its decoded document; bytes that are not JSON: the bytes); None for a tombstone.
    ``key``: the key decoded likewise. ``headers``: name → value as text (of a repeated name the last).
    ``topic``, ``partition``, ``offset``, ``timestamp`` (Kafka's, in milliseconds) and ``idempotency_key``
    (its ``kdg-id``, or what ``--id-from`` or the route's ``id_from`` made of it).
    """

    __slots__ = ("value", "idempotency_key", "_rec", "_decode_key")

    def __init__(self, rec: Record, value, idempotency_key: str, decode_key=None):
        self.value, self.idempotency_key, self._rec, self._decode_key = value, idempotency_key, rec, decode_key

    @property
    def key(self):
        raw = self._rec.key
        return (self._decode_key or _json_or_bytes)(raw) if raw is not None else None

    @property
    def headers(self) -> dict:
        return {k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v for k, v in self._rec.headers}

    topic = property(lambda self: self._rec.topic)
    partition = property(lambda self: self._rec.partition)
    offset = property(lambda self: self._rec.offset)
    timestamp = property(lambda self: self._rec.timestamp)

    def __repr__(self) -> str:
        return (f"TransformRecord(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
                f"value={self.value!r})")


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
        self.fn, self._value, self._key = fn, decode_value or _json_or_bytes, decode_key

    def rows(self, rec: Record, key: str, route: str | None = None) -> list:
        """The record's rows, ``(record, key)`` each, the row in a copy's ``record.row`` (none: filtered);
        :class:`Failed` with its dead letter."""
        try:
            made = self.fn(TransformRecord(rec, self._value(rec.value) if rec.value is not None else None, key,
                                           self._key))
        except Exception as exc:  # the record's error, not the pipeline's: dead-lettered, the batch goes on
            raise Failed(_raised(rec, key, exc)) from None
        if made is None:
            return []
        if type(made) is dict:
            return [(_derived(rec, made, route), key)]
        return _exploded(rec, key, made, route)

    def run(self, pairs: list, out: list, dead: list) -> tuple[int, int]:
        """One route's transform over a batch's ``(record, key)`` pairs, its single rows set on the records
        themselves (the common case: no copy, no new pair); returns (records filtered, rows beyond one per
        record). Kept to local names: it runs once per record, and its cost is the transform's overhead."""
        fn, decode, decode_key = self.fn, self._value, self._key
        append = out.append
        filtered = extra = 0
        for pair in pairs:
            rec, key = pair
            value = rec.value
            try:
                made = fn(TransformRecord(rec, decode(value) if value is not None else None, key, decode_key))
            except Exception as exc:  # the record's error, not the pipeline's
                dead.append(_raised(rec, key, exc))
                continue
            if type(made) is dict:
                rec.row = made
                append(pair)
            elif made is None:
                filtered += 1
            else:
                try:
                    rows = _exploded(rec, key, made, None)
                except Failed as failed:
                    dead.append(failed.dead)
                    continue
                if not rows:
                    filtered += 1
                extra += max(len(rows) - 1, 0)
                out += rows
        return filtered, extra


def _raised(rec: Record, key: str, exc: Exception) -> tuple:
    """The dead letter of a record whose transform raised ``exc``."""
    return (rec, f"transform raised {type(exc).__name__}: {exc}", key,
            [(ERROR_TYPE_HEADER, type(exc).__name__.encode()),
             (ERROR_MESSAGE_HEADER, str(exc).encode("utf-8", "replace")[:2000])])


def _exploded(rec: Record, key: str, made, route: str | None) -> list:
    """A transform's list of dicts as rows, the ``i``-th keyed ``KEY#i``; :class:`Failed` for anything else."""
    if isinstance(made, dict):  # a dict's subclass: one row, as a plain dict
        return [(_derived(rec, dict(made), route), key)]
    if isinstance(made, list) and all(isinstance(m, dict) for m in made):
        return [(_derived(rec, m, route), f"{key}#{i}") for i, m in enumerate(made)]
    raise Failed((rec, f"transform returned {type(made).__name__}: a dict, a list of dicts or None is expected",
                  key, [(ERROR_TYPE_HEADER, b"TypeError")]))


class Failed(Exception):
    """A transform's error, as the record's dead letter ``(record, reason, key, headers)``."""

    def __init__(self, dead: tuple):
        super().__init__(dead[1])
        self.dead = dead


def fan_out(pairs: list, outputs: list, out: list, dead: list, gone: list | None = None) -> tuple[int, int]:
    """Each ``(record, key)`` through every output — ``(route name or None, Transform or None)``: a record's rows
    of every output into ``out``, or, if any output's transform fails, the record into ``dead`` and none of its
    rows. Returns (records filtered: no row at all, rows beyond one per record). Several outputs: ``gone`` gets
    ``(topic, route, key, partition, offset)`` of each record a route's transform made no row of (one output:
    the caller tells them from its count)."""
    filtered = extra = 0
    if len(outputs) == 1 and outputs[0][1] is not None:  # one route's transform: its one row is the record itself
        return outputs[0][1].run(pairs, out, dead)
    for rec, key in pairs:
        rows, skipped = [], ()
        try:
            for route, transform in outputs:
                if transform is not None:
                    made = transform.rows(rec, key, route)
                    if not made:
                        skipped += (route,)
                    rows += made
                else:
                    rows.append((_derived(rec, None, route), key))
        except Failed as failed:
            dead.append(failed.dead)
            continue
        if skipped and gone is not None:
            gone += [(rec.topic, route, key, rec.partition, rec.offset) for route in skipped]
        if not rows:
            filtered += 1
        extra += max(len(rows) - 1, 0)
        out += rows
    return filtered, extra


def _derived(rec: Record, row: dict | None, route: str | None) -> Record:
    """A copy of ``rec`` holding one of its rows (an explode's, a fan-out's)."""
    return Record(rec.value, rec.key, rec.headers, rec.partition, rec.topic, rec.offset, rec.timestamp, row, route)


def as_value(rec: Record) -> bytes | None:
    """What the generic table stores of a record: a transform's row as JSON, else the record's own value."""
    if rec.row is None:
        return rec.value
    return json.dumps(rec.row, separators=(",", ":"), default=str).encode()


def generic_rows(records) -> SinkRows:
    """The generic table's rows of ``(record, key)`` pairs: a transform's row stored as its JSON (:func:`as_value`).
    Records that are columns (:class:`~kdg.records.RecordColumns`: no headers, no transform's row) are taken as
    they are."""
    columns = RecordColumns.of(records)
    if columns is not None:
        return SinkRows([columns.ids, columns.topics, columns.partitions, columns.offsets, columns.keys,
                         columns.values, [headers_json(())] * len(columns)])
    return SinkRows.of([sink_row(rec, key) if rec.row is None else sink_row(with_value(rec, as_value(rec)), key)
                        for rec, key in records])


_READ = json_reader(Decimal, constants=True)  # made once


def _json_or_bytes(data: bytes):
    """JSON with its decimals exact (:class:`~decimal.Decimal`), or the bytes as they are where not JSON
    (:func:`kdg.mapping.sources.json_reader`: the standard library's verdict stands)."""
    try:
        return _READ(data)
    except ValueError:  # (UnicodeDecodeError too)
        return data
