"""What kdg knows about a record: its idempotency key, its envelope form, and how keys are made."""

import base64
import json
import random
import time
from dataclasses import dataclass, field

from kdg.errors import UsageError

ID_HEADER = "kdg-id"
SEQ_HEADER = "kdg-seq"


def uuid7() -> str:
    """A time-ordered UUID (version 7): 48 bits of Unix milliseconds, then random bits.

    Formatted by hand: ``str(uuid.UUID(int=…))`` costs more than the rest of sending a record.
    """
    ms = time.time_ns() // 1_000_000
    rand = random.getrandbits(74)  # re-seeded after fork; keys need uniqueness, not secrecy
    high = (ms & 0xFFFF_FFFF_FFFF) << 16 | 0x7000 | rand >> 62      # time, version 7, 12 random bits
    low = 0x8000_0000_0000_0000 | rand & 0x3FFF_FFFF_FFFF_FFFF      # RFC 4122 variant, 62 random bits
    h = f"{high:016x}{low:016x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def id_maker(template: str | None):
    """A function ``seq -> idempotency key``: UUIDv7 by default, or ``template.format(seq=…)``.

    Example: ``id_maker("order-{seq}")(7) == "order-7"``.
    """
    if template is None:
        return lambda seq: uuid7()
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
