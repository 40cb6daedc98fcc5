"""The Schema Registry wire format: a zero magic byte, a 4-byte big-endian schema id, then the payload.

Protobuf payloads start with the message indexes: which message of the schema's file the payload is,
as zigzag varints (a count, then that many indexes), a single ``0`` byte meaning the first message.

Example:
    >>> split_frame(frame(7, b"x"))
    (7, b'x')
"""

MAGIC = 0


def frame(schema_id: int, payload: bytes) -> bytes:
    return bytes((MAGIC,)) + schema_id.to_bytes(4, "big") + payload


def split_frame(data: bytes) -> tuple[int, bytes]:
    """``(schema_id, payload)``; ValueError (the reason) if ``data`` is not in the wire format."""
    if len(data) < 5:
        raise ValueError(f"not the Schema Registry wire format: {len(data)} byte(s), fewer than its 5-byte header")
    if data[0] != MAGIC:
        raise ValueError(f"not the Schema Registry wire format: the first byte is 0x{data[0]:02x}, not 0x00")
    return int.from_bytes(data[1:5], "big"), data[5:]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("corrupt Protobuf message indexes")
        byte = data[at]
        result |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at  # zigzag
        shift += 7


def split_indexes(payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """A Protobuf payload's message indexes (``(0,)`` for the first message) and the message bytes."""
    count, at = _varint(payload, 0)
    if count == 0:
        return (0,), payload[at:]
    if count < 0 or count > 64:
        raise ValueError(f"corrupt Protobuf message indexes (a count of {count})")
    indexes = []
    for _ in range(count):
        index, at = _varint(payload, at)
        indexes.append(index)
    return tuple(indexes), payload[at:]


def first_message_indexes() -> bytes:
    """The indexes of the file's first message, as Confluent's serializers write them: one zero byte."""
    return b"\x00"
