"""The stdout sink: one line per record, the value as text or the kdg JSON envelope."""

import sys

from kdg.records import to_envelope
from kdg.sinks import Batch, Sink, WriteResult
from kdg.sinks.dead_letters import DeadLetterQueue


class StdoutSink(Sink):
    atomic_offsets = False  # a terminal cannot take back a line: no exactly-once here
    keeps_offsets = False

    def __init__(self, fmt: str, dlq: DeadLetterQueue, out=sys.stdout):
        self.fmt, self.dlq, self.out = fmt, dlq, out

    def write(self, batch: Batch, *, atomic: bool) -> WriteResult:
        self.dlq.send(batch.dead)
        lines = []
        for rec, _key in batch.records:
            if self.fmt == "json":
                lines.append(to_envelope(rec))
            else:
                lines.append((rec.value or b"").decode("utf-8", "replace"))
        if lines:
            self.out.write("\n".join(lines) + "\n")
            self.out.flush()
        return WriteResult(len(lines), 0)

    def close(self) -> None:
        pass
