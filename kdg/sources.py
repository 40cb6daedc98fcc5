"""Where `kdg produce` gets records: text lines, kdg JSON envelopes, or synthetic load."""

import os
import select
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from kdg.errors import UsageError
from kdg.lifecycle import StopRequested, interruptible_read
from kdg.records import Record, from_envelope


@dataclass
class LineOptions:
    key: str | None = None            # -k: one key for every record
    key_delimiter: str | None = None  # -K: "key<delim>value" lines
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    partition: int | None = None


def parse_headers(items: list[str]) -> list[tuple[str, bytes]]:
    headers = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"-H {item!r}: expected name=value")
        headers.append((name, value.encode()))
    return headers


IDLE_S = 0.1  # stdin quiet this long: the reader hands over an IDLE, so the producer can commit and settle
IDLE = None   # what a reader yields for it, in place of a record


def _open_lines(path: Path | None) -> Iterator[tuple[str, str] | tuple[None, None]]:
    """``(where, line)`` pairs; a file is checked to be readable up front. From stdin, ``(None, None)`` each
    :data:`IDLE_S` no line comes: a producer waiting for its input still commits its open transaction (which
    Kafka would otherwise time out, and fence) and writes its ledger."""
    if path is None:
        try:
            fd = sys.stdin.fileno()
        except (AttributeError, OSError, ValueError):  # not a file (a library caller's own stream)
            fd = None
        if fd is not None:
            yield from _stdin_lines(fd)
            return
        lines, n = iter(sys.stdin), 0
        while True:
            try:
                with interruptible_read():  # Ctrl-C at a terminal waiting for a line ends the input
                    line = next(lines)
            except (StopIteration, StopRequested):
                return
            except UnicodeDecodeError:
                raise UsageError(f"<stdin>:{n + 1}: not UTF-8 text") from None
            n += 1
            if not line.isascii():  # bytes the locale let through as surrogates cannot be sent as UTF-8
                try:
                    line.encode("utf-8")
                except UnicodeEncodeError:
                    raise UsageError(f"<stdin>:{n}: not UTF-8 text") from None
            yield f"<stdin>:{n}", _line(line)
    try:
        handle = open(path, encoding="utf-8", newline="\n")  # a lone CR is part of its line, as on stdin
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        try:
            for n, line in enumerate(handle, 1):
                yield f"{path}:{n}", _line(line)
        except UnicodeDecodeError as exc:
            raise UsageError(f"{path}: not UTF-8 text ({exc})") from None


def _stdin_lines(fd: int) -> Iterator[tuple[str, str] | tuple[None, None]]:
    """Lines of ``fd`` as they arrive, read in blocks of bytes (nothing else reads stdin); an IDLE pair for each
    :data:`IDLE_S` of quiet. A stop signal while waiting ends the input (:func:`interruptible_read`)."""
    pending, n = b"", 0
    while True:
        try:
            with interruptible_read():  # Ctrl-C at a terminal waiting for a line ends the input
                data = os.read(fd, 1 << 16) if select.select([fd], [], [], IDLE_S)[0] else None
        except StopRequested:
            return
        if data is None:
            yield None, None  # (never inside interruptible_read: the producer's client calls run meanwhile)
            continue
        if data:
            *lines, pending = (pending + data).split(b"\n")
        else:  # the end: a last line without its LF is a line too
            lines, pending = [pending] if pending else [], b""
        for raw in lines:
            n += 1
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UsageError(f"<stdin>:{n}: not UTF-8 text") from None
            yield f"<stdin>:{n}", _line(text)
        if not data:
            return


def _line(line: str) -> str:
    """A line without its end: LF, or CR LF (a file written on Windows), from a file and stdin alike."""
    line = line[:-1] if line.endswith("\n") else line
    return line[:-1] if line.endswith("\r") else line


def text_lines(path: Path | None, opts: LineOptions) -> Iterator[Record | None]:
    for where, line in _open_lines(path):
        if where is None:
            yield IDLE
            continue
        key = opts.key.encode() if opts.key is not None else None
        value = line
        if opts.key_delimiter:
            k, sep, v = line.partition(opts.key_delimiter)
            if not sep:
                raise UsageError(f"{where}: no key delimiter {opts.key_delimiter!r} in the line")
            key, value = k.encode(), v
        yield Record(value=value.encode(), key=key, headers=list(opts.headers), partition=opts.partition)


def envelopes(path: Path | None, opts: LineOptions) -> Iterator[Record]:
    for where, line in _open_lines(path):
        if where is None:
            yield IDLE
            continue
        if not line.strip():
            continue
        rec = from_envelope(line, where)
        rec.headers.extend(opts.headers)
        rec.partition = opts.partition
        yield rec


def validate_file(path: Path, reader, opts: LineOptions | None = None) -> int:
    """Read a whole input file once before sending anything, with the command's options (a ``-K`` delimiter a
    line lacks), so a bad line loses nothing."""
    return sum(1 for rec in reader(path, opts or LineOptions()) if rec is not IDLE)


def synthetic(count: int | None, size: int, rate: float | None, opts: LineOptions) -> Iterator[Record]:
    """``count`` records of ``size`` bytes (endless when None: a steady load until stopped), at most
    ``rate`` per second when given.

    The options are checked now, not when the first record is drawn: a bad one sends nothing.
    """
    if count is not None and count < 1:
        raise UsageError(f"--count {count}: must be at least 1")
    if size < 0:
        raise UsageError(f"--size {size}: must not be negative")
    if rate is not None and not 0 < rate < float("inf"):
        raise UsageError(f"--rate {rate:g}: must be a number of records per second, more than 0")
    load = SyntheticLoad(count, _payload(size), opts, rate)
    return _with_headers(load, opts.headers) if opts.headers else load


PACE_S = 0.002  # a paced load's records are let go in groups due within this long


def _payload(size: int) -> bytes:
    return os.urandom(max(size, 1) // 2 + 1).hex()[:size].encode()


class SyntheticLoad:
    """``count`` records of one payload (endless when None), at most ``rate`` per second when given, with no
    headers of their own (``-H`` ones are added by :func:`_with_headers`): iterated as records, or taken as
    columns (``take``), which `kdg produce` sends without a :class:`Record` each.

    Paced, ``take`` hands out only records already due (record k is due ``k / rate`` seconds after the first),
    so none waits in a chunk; when none is due it sleeps until those of the next :data:`PACE_S` are, one
    wake-up for them all rather than one per record (at 7,000 records/s, 500 wake-ups a second, not 7,000).
    """

    def __init__(self, count: int | None, payload: bytes, opts: LineOptions, rate: float | None = None):
        self.left, self.payload, self.partition, self.rate = count, payload, opts.partition, rate
        self.key = opts.key.encode() if opts.key is not None else None
        self.taken = 0
        self.start: float | None = None

    def __iter__(self) -> Iterator[Record]:
        while self._out(1):
            yield Record(self.payload, self.key, [], self.partition)

    def take(self, n: int) -> tuple[list, list, list, list] | None:
        """Up to ``n`` more records (only those due, when paced; at least one) as columns: values, keys, headers
        (none of their own) and partitions. None once ``count`` were taken."""
        n = self._out(n)
        return ([self.payload] * n, [self.key] * n, [[]] * n, [self.partition] * n) if n else None

    def _out(self, n: int) -> int:
        """How many of the next ``n`` records go now (0: all ``count`` went), counted out."""
        if self.left is not None:
            n = min(n, self.left)
        if n <= 0:
            return 0
        if self.rate is not None:
            n = self._due(n)
        if self.left is not None:
            self.left -= n
        self.taken += n
        return n

    def _due(self, n: int) -> int:
        """How many of the next ``n`` records are due (≥ 1), after sleeping until some are."""
        if self.start is None:
            self.start = time.monotonic()
        while True:
            elapsed = time.monotonic() - self.start
            ready = int(elapsed * self.rate) + 1 - self.taken
            if ready > 0:
                return min(n, ready)
            wanted = max(1, min(n, int(self.rate * PACE_S)))
            time.sleep(max((self.taken + wanted - 1) / self.rate - elapsed, 0.0))


def _with_headers(load: "SyntheticLoad", headers: list) -> Iterator[Record]:
    """``load``'s records (paced as it paces them), each with its own copy of the ``-H`` headers: one record at
    a time, since kdg's headers are added to each record's own."""
    for rec in load:
        rec.headers = list(headers)
        yield rec
