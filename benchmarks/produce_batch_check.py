"""Whether confluent-kafka's ``Producer.produce_batch`` could replace kdg's per-record ``produce`` (issue 24).

It measures only the Python side of queueing: the CPU each call takes to put N messages of 100 B into
librdkafka's queue, on a producer whose broker is never reached (nothing is sent, so no broker, network or
delivery report is in the figure). Each way is timed ``--repeat`` times, interleaved; medians are printed.

- ``produce`` with kdg's two headers (``kdg-id``, ``kdg-seq``): what ``kdg produce`` does per record;
- ``produce`` without headers;
- ``produce_batch`` of dicts without headers (it takes no headers: see its docstring), the dicts built in
  the timed part, as a caller must.

Run: ``python benchmarks/produce_batch_check.py [--records 200000] [--repeat 5] [--json]``.
"""

import argparse
import json
import statistics
import time

from confluent_kafka import Producer

VALUE = b"x" * 100


def _producer() -> Producer:
    return Producer({"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": 10_000_000,
                     "queue.buffering.max.kbytes": 2_000_000, "linger.ms": 60_000, "log_level": 0,
                     "message.timeout.ms": 300_000})


def _timed(fn, n: int) -> float:
    p = _producer()
    start = time.process_time()
    fn(p, n)
    took = time.process_time() - start
    p.purge()  # the queue is dropped, never sent
    p.flush(0)
    return took / n * 1e6  # µs per message


def produce_with_headers(p: Producer, n: int) -> None:
    produce, head = p.produce, "019a6f0e-4a1b-7c3d-9e4f-5a6b"
    for seq in range(n):
        produce("t", VALUE, None, headers=[("kdg-id", head + "%08x" % seq), ("kdg-seq", b"%d" % seq)])


def produce_plain(p: Producer, n: int) -> None:
    produce = p.produce
    for _ in range(n):
        produce("t", VALUE)


def produce_batch(p: Producer, n: int, chunk: int = 10_000) -> None:
    for start in range(0, n, chunk):
        p.produce_batch("t", [{"value": VALUE} for _ in range(min(chunk, n - start))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ways = {"produce, 2 headers (kdg)": produce_with_headers, "produce, no headers": produce_plain,
            "produce_batch, no headers": produce_batch}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeat):
        for name, fn in ways.items():
            times[name].append(_timed(fn, args.records))
    result = {name: round(statistics.median(t), 3) for name, t in times.items()}
    if args.json:
        print(json.dumps({"records": args.records, "repeat": args.repeat, "us_per_message_median": result}))
        return
    for name, us in result.items():
        print(f"{name:28s} {us:6.3f} µs/message (median of {args.repeat})")


if __name__ == "__main__":
    main()
