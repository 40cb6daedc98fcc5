"""What kdg knows about a record: its idempotency key, its envelope form, and how keys are made."""

import base64
import json
import random
import time
from dataclasses import dataclass, field

from kdg.errors import UsageError

ID_HEADER = "kdg-id"
SEQ_HEADER = "kdg-seq"


class Uuid7Maker:
    """Time-ordered UUIDs (version 7): 48 bits of Unix milliseconds, the version, 74 random bits.

    Made in blocks: the random part of ``keys_per_block`` keys is drawn as one block of random bytes and
    formatted by one list comprehension, so a key costs a clock read, a list pop and a concatenation with
    the time part, which is formatted once per millisecond. The time is always the moment the key is
    taken, never the block's: a claim's partition in ``kdg_dedup`` is chosen by it. One maker serves one
    thread; the random bits come from ``random`` (re-seeded after fork): keys need uniqueness, not secrecy.
    ``str(uuid.UUID(int=…))`` per key cost more than the rest of sending a record.

    Example: ``Uuid7Maker()()`` → ``'019a6f0e-4a1b-7c3d-9e4f-5a6b7c8d9e0f'``.
    """

    _HEX_PER_KEY = 19  # 3 (rand_a) + 1 (variant and 2 random bits) + 15: 76 bits, 74 of them used
    _VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}  # RFC 9562 variant 10xx

    def __init__(self, keys_per_block: int = 4096):
        self._keys = keys_per_block
        self._ms, self._time = -1, ""
        self._tails: list[str] = []  # the random part of the keys still to hand out, the next one last

    def __call__(self, _seq: int = 0) -> str:
        ms = time.time_ns() // 1_000_000
        if ms != self._ms:
            t = f"{ms & 0xFFFF_FFFF_FFFF:012x}"
            self._ms, self._time = ms, f"{t[:8]}-{t[8:]}-7"
        tails = self._tails
        if not tails:
            tails = self._tails = self._draw()
        return self._time + tails.pop()

    def _draw(self) -> list[str]:
        step, variant = self._HEX_PER_KEY, self._VARIANT
        h = random.randbytes((self._keys * step + 1) // 2).hex()
        return [f"{h[at:at + 3]}-{variant[h[at + 3]]}{h[at + 4:at + 7]}-{h[at + 7:at + 19]}"
                for at in range(0, self._keys * step, step)]


def uuid7() -> str:
    """One time-ordered UUID (version 7); a :class:`Uuid7Maker` makes many for less."""
    return Uuid7Maker(keys_per_block=1)()


def id_maker(template: str | None):
    """A function ``seq -> idempotency key``: UUIDv7 by default, or ``template.format(seq=…)``.

    Example: ``id_maker("order-{seq}")(7) == "order-7"``.
    """
    if template is None:
        return Uuid7Maker()
    try:
        template.format(seq=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"--id {template!r}: a template may only use {{seq}} ({exc})") from None
    if "{seq" not in template:
        raise UsageError(f"--id {template!r} must contain {{seq}}, or every record would share one key")
    return lambda seq: template.format(seq=seq)


@dataclass(slots=True)
class Record:
    """A record as kdg moves it; ``headers`` keeps order and allows repeats, as Kafka does."""

    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    partition: int | None = None
    topic: str | None = None
    offset: int | None = None
    timestamp: int | None = None

    def header(self, name: str) -> bytes | None:
        """The value of header ``name``; of a repeated name the last, as the jsonb headers column and Spark keep it."""
        for k, v in reversed(self.headers):
            if k == name:
                return v
        return None

    @property
    def idempotency_key(self) -> str | None:
        raw = self.header(ID_HEADER)
        return raw.decode("utf-8", "replace") if raw is not None else None


def _text_or_b64(data: bytes | None) -> tuple[str | None, bool]:
    if data is None:
        return None, False
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode(), True


def to_envelope(rec: Record) -> str:
    """One JSON line that ``kdg produce --format json`` reads back into the same record."""
    value, value_b64 = _text_or_b64(rec.value)
    key, key_b64 = _text_or_b64(rec.key)
    headers = []
    for name, raw in rec.headers:
        text, b64 = _text_or_b64(raw)
        headers.append({"name": name, "value": text, **({"b64": True} if b64 else {})})
    env = {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset, "timestamp": rec.timestamp,
           "key": key, "value": value, "headers": headers}
    if key_b64:
        env["key_b64"] = True
    if value_b64:
        env["value_b64"] = True
    return json.dumps(env, separators=(",", ":"))


def _decode(text: str | None, b64: bool) -> bytes | None:
    if text is None:
        return None
    return base64.b64decode(text) if b64 else text.encode("utf-8")


def from_envelope(line: str, where: str) -> Record:
    """Parse an envelope line; a malformed one is a usage error naming ``where`` (file:line)."""
    try:
        env = json.loads(line)
        headers = [(h["name"], _decode(h.get("value"), h.get("b64", False))) for h in env.get("headers", [])]
        return Record(value=_decode(env.get("value"), env.get("value_b64", False)),
                      key=_decode(env.get("key"), env.get("key_b64", False)), headers=headers)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{where}: not a kdg JSON envelope ({exc})") from None
