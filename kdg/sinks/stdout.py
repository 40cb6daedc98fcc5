"""The stdout sink: one line per record, the value as text or the kdg JSON envelope.

With a schema'd value format (Avro, Protobuf, JSON Schema) a text line is the decoded value as JSON, as
``kcat -s avro`` shows it; a value that cannot be decoded goes to the dead-letter topic with the reason.
"""

import sys

from kdg.mapping.sources import json_text
from kdg.records import to_envelope
from kdg.sinks import Batch, Sink, WriteResult
from kdg.sinks.dead_letters import DeadLetterQueue, tally


class StdoutSink(Sink):
    atomic_offsets = False  # a terminal cannot take back a line: no exactly-once here
    keeps_offsets = False

    def __init__(self, fmt: str, dlq: DeadLetterQueue, out=sys.stdout, decode=None):
        self.fmt, self.dlq, self.out, self.decode = fmt, dlq, out, decode

    def write(self, batch: Batch, *, atomic: bool) -> WriteResult:
        self.dlq.send(batch.dead)
        lines, undecodable = [], []
        for rec, key in batch.records:
            if self.fmt == "json":
                lines.append(to_envelope(rec))
            elif self.decode is not None and rec.value is not None:
                try:
                    lines.append(json_text(self.decode(rec.value)))
                except ValueError as exc:
                    undecodable.append((rec, str(exc), key))
            else:
                lines.append((rec.value or b"").decode("utf-8", "replace"))
        self.dlq.send(undecodable)
        if lines:
            self.out.write("\n".join(lines) + "\n")
            self.out.flush()
        return WriteResult(len(lines), 0, len(undecodable), dead_reasons=tally(undecodable))

    def close(self) -> None:
        pass
