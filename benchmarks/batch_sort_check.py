"""The consume loop's sort, per record and per batch, on real messages: CPU per record of each.

    python benchmarks/batch_sort_check.py BOOTSTRAP TOPIC [--records N] [--repeat R]

Reads N messages of TOPIC (kdg's own, e.g. from `kdg produce --count`) into memory with a bare confluent-kafka
consumer, in polls of 10,000 as `kdg consume --batch-size 10000` makes them, then times, with nothing else
in the process:

- ``general``: :func:`kdg.flow.source.sort_batch` and the sink rows made from its records (``sink_row`` per record),
  what every batch cost before :mod:`kdg.batching`, and what a batch the per-batch sort declines still costs;
- ``per-batch``: :func:`kdg.batching.sort_rows`, the generic Postgres sink's path;
- ``headers()``: confluent-kafka building each message's header list, which any consumer that reads
  headers pays (the floor loop does).

CPU (``time.process_time``) per record, the median of R passes, each over all N messages read afresh, with the
collector set as `kdg consume` sets it (start-up frozen, young collections every 50,000 allocations). Prints one
JSON line.
"""

import argparse
import gc
import json
import time

from confluent_kafka import Consumer

from kdg.batching import sort_rows
from kdg.consume import ConsumeRequest
from kdg.flow.source import Keys
from kdg.flow.source import sort_batch as _sort
from kdg.settings import Connection
from kdg.store.rows import SinkRows, sink_row


def read(bootstrap: str, topic: str, records: int) -> list[list]:
    """``records`` messages of ``topic`` in polls of up to 10,000, fresh: confluent-kafka builds a message's
    header list on first use and keeps it, so each timed pass gets messages no pass has touched."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"sort-check-{time.time_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    polls, got, idle = [], 0, 0
    try:
        while got < records and idle < 10:
            msgs = [m for m in consumer.consume(min(10_000, records - got), 1.0) if m.error() is None]
            idle = 0 if msgs else idle + 1
            if msgs:
                polls.append(msgs)
                got += len(msgs)
    finally:
        consumer.close()
    if not got:
        raise SystemExit(f"no messages read from {topic}")
    return polls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    gc.freeze()
    gc.set_threshold(50_000)
    req = ConsumeRequest(args.topic, "g", "exactly-once", Connection(args.bootstrap, ""))
    resolver = Keys(req, req.router())

    def general(msgs):
        batch = _sort(list(msgs), resolver, req, must_have_key=True)
        return SinkRows.of([sink_row(rec, key) for rec, key in batch.records])

    def per_batch(msgs):
        batch = sort_rows(msgs, req.max_bytes, req.require_utf8, must_have_key=True)
        if batch is None:
            raise SystemExit("the per-batch sort declined a poll of this topic: not kdg's own records?")
        return batch.rows

    sorts = {"general": general, "per-batch": per_batch, "headers()": lambda msgs: [m.headers() for m in msgs]}
    passes: dict[str, list[float]] = {name: [] for name in sorts}
    records = 0
    for _ in range(args.repeat):
        for name, sort in sorts.items():
            polls = read(args.bootstrap, args.topic, args.records)
            records = sum(map(len, polls))
            started = time.process_time()
            for msgs in polls:
                sort(msgs)
            passes[name].append((time.process_time() - started) / records * 1e9)
            del polls
    out = {"records": records, "repeat": args.repeat}
    out.update({f"{name} ns/record": round(sorted(p)[len(p) // 2]) for name, p in passes.items()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
