"""The Kafka range a replay reads: ``--from`` / ``--to`` specs resolved to ``{partition: (start, end)}``.

A bound is ``earliest``, ``latest``, ``stored`` (the group's offsets in Postgres), per-partition
offsets (``0:120,1:80``) or a timestamp (``@2026-11-22T10:00:00`` in UTC, or ``@1763805600000`` ms).
Ends are exclusive. Offsets below a partition's log start (deleted or compacted away) or past its
end are refused with the valid range, never silently clamped.

Example:
    >>> parse_bound("0:120,1:80")
    Bound(kind='offsets', offsets={0: 120, 1: 80}, timestamp_ms=None)
"""

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from kdg.errors import UsageError

Ranges = dict[int, tuple[int, int]]


@dataclass(frozen=True)
class Bound:
    kind: str                                  # earliest | latest | stored | offsets | timestamp
    offsets: dict[int, int] = field(default_factory=dict)
    timestamp_ms: int | None = None


def parse_bound(spec: str, option: str = "--from") -> Bound:
    spec = spec.strip()
    if spec in ("earliest", "latest", "stored"):
        return Bound(spec)
    if spec.startswith("@"):
        return Bound("timestamp", timestamp_ms=parse_timestamp(spec[1:], option))
    offsets: dict[int, int] = {}
    for item in spec.split(","):
        p, sep, o = item.partition(":")
        try:
            partition, offset = int(p), int(o)
        except ValueError:
            partition = offset = -1
        if not sep or partition < 0 or offset < 0:
            raise UsageError(f"{option} {spec!r}: use earliest, latest, stored, PARTITION:OFFSET[,…] "
                             "or @TIMESTAMP (ISO 8601 in UTC, or milliseconds)")
        if partition in offsets:
            raise UsageError(f"{option} {spec!r}: partition {partition} is named twice")
        offsets[partition] = offset
    return Bound("offsets", offsets=offsets)


def parse_timestamp(text: str, option: str) -> int:
    """ISO 8601 (UTC unless it says) or Unix milliseconds → Unix milliseconds."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{option} {text!r}: not an ISO 8601 time (e.g. 2026-11-22T10:00:00) "
                         "nor milliseconds since the epoch") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def resolve_range(topic: str, start: Bound, end: Bound, *, partitions: list[int],
                  watermarks: dict[int, tuple[int, int]], stored: Callable[[], dict[int, int]],
                  offsets_for_time: Callable[[int], dict[int, int]], allow_empty: bool = False) -> Ranges:
    """Per-partition ``(start, end)`` of the replay; only non-empty partitions are kept (none at all is refused,
    unless ``allow_empty``: one topic of several may have nothing in its range).

    ``watermarks`` are ``{p: (log start, end)}`` as the replay will read them (under read_committed
    the end is the last stable offset); ``stored`` and ``offsets_for_time`` are asked only if a bound
    needs them.
    """
    chosen = sorted(set(partitions) & set(start.offsets or partitions) & set(end.offsets or partitions))
    for bound in (start, end):
        unknown = sorted(set(bound.offsets) - set(partitions))
        if unknown:
            raise UsageError(f"topic {topic!r} has no partition {', '.join(map(str, unknown))} "
                             f"(it has {', '.join(map(str, partitions))})")
    lo = _offsets(start, chosen, watermarks, stored, offsets_for_time, topic, is_start=True)
    hi = _offsets(end, chosen, watermarks, stored, offsets_for_time, topic, is_start=False)
    ranges: Ranges = {}
    for p in chosen:
        low, high = watermarks[p]
        if lo[p] < low:
            raise UsageError(f"{topic}/{p}: offset {lo[p]} is no longer in the log (deleted or compacted "
                             f"away; the partition starts at {low}); replay from {low} or later")
        for name, offset in (("start", lo[p]), ("end", hi[p])):
            if offset > high:
                raise UsageError(f"{topic}/{p}: {name} offset {offset} is past the end of the partition ({high})")
        if lo[p] > hi[p]:
            raise UsageError(f"{topic}/{p}: the range starts at {lo[p]}, after its end {hi[p]}")
        if hi[p] > lo[p]:
            ranges[p] = (lo[p], hi[p])
    if not ranges and not allow_empty:
        raise UsageError(f"the range of {topic!r} is empty on every partition: nothing to replay")
    return ranges


def _offsets(bound: Bound, partitions, watermarks, stored, offsets_for_time, topic, *, is_start) -> dict[int, int]:
    if bound.kind == "earliest":
        return {p: watermarks[p][0] for p in partitions}
    if bound.kind == "latest":
        return {p: watermarks[p][1] for p in partitions}
    if bound.kind == "offsets":
        return {p: bound.offsets[p] for p in partitions}
    if bound.kind == "timestamp":
        found = offsets_for_time(bound.timestamp_ms)
        # no record at or after the time: the range starts (or ends) at the partition's end
        return {p: found[p] if found.get(p, -1) >= 0 else watermarks[p][1] for p in partitions}
    found = stored()
    if not found:
        raise UsageError(f"no offsets are stored in Postgres for this group on {topic!r} (only replays and "
                         "exactly-once consumers store them there): use --from earliest, or a partition:offset "
                         "list, for a first replay")
    # a partition the group never stored starts at its log start (nothing of it was processed yet)
    return {p: found.get(p, watermarks[p][0] if is_start else watermarks[p][1]) for p in partitions}
