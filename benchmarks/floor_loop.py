"""The consume floor: what a bare confluent-kafka loop costs per message, the reference for kdg's CPU per record.

    python benchmarks/floor_loop.py BOOTSTRAP TOPIC GROUP COUNT

It reads COUNT messages with the librdkafka settings of an exactly-once `kdg consume` (kdg's consumer tuning and
read_committed, from kdg's own client factory) in batches of 10,000, and touches what any consumer must: each
message's value, key, headers (finding ``kdg-id``), offset, partition and timestamp. Nothing is written anywhere.
It prints one JSON line, as `kdg consume --json` does: ``msgs_per_s`` (from the first message to the last),
``consumed`` and ``with_id`` (messages whose ``kdg-id`` header was found, so the loop cannot have skipped the work).
"""

import json
import sys
import time

from confluent_kafka import Consumer

from kdg.guarantees import policy_for
from kdg.kafka.clients import Role, client_config
from kdg.records import ID_HEADER

BATCH = 10_000


def main(bootstrap: str, topic: str, group: str, count: int) -> None:
    config = client_config(Role.CONSUMER, bootstrap, None, policy_for("exactly-once"),
                           **{"group.id": group, "auto.offset.reset": "earliest"})
    consumer = Consumer({k: v for k, v in config.items() if k not in ("logger", "error_cb")})
    consumer.subscribe([topic])
    consumed = with_id = 0
    first = last = 0.0
    try:
        while consumed < count:
            msgs = consumer.consume(BATCH, 1.0)
            if msgs and not first:
                first = time.monotonic()
            for msg in msgs:
                if msg.error() is not None:
                    continue
                # read as any consumer must, and dropped
                _value, _key, headers = msg.value(), msg.key(), msg.headers()
                _offset, _partition, _timestamp = msg.offset(), msg.partition(), msg.timestamp()
                for name, raw in headers or ():
                    if name == ID_HEADER:
                        with_id += 1
                        break
                consumed += 1
            last = time.monotonic()
    finally:
        consumer.close()
    rate = consumed / (last - first) if last > first else 0.0
    print(json.dumps({"msgs_per_s": round(rate, 1), "consumed": consumed, "with_id": with_id}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
