"""A service that embeds kdg: it consumes with ``kdg.consume`` and handles its own shutdown.

kdg installs no signal handler of its own here. The service owns SIGTERM and SIGINT and turns them into
``token.stop()``: the batch in flight is written and committed, the group is left, and ``kdg.consume``
returns its report, which the service prints as JSON before it exits 0.

    python service.py events service-group app.events
"""

import json
import logging
import signal
import sys

import kdg


def main(topic: str, group: str, table: str) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # kdg's status lines: logger "kdg"
    token = kdg.StopToken()

    def stop(signum, frame) -> None:
        token.stop(signal.Signals(signum).name)  # only sets a flag; kdg reads it between client calls

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        report = kdg.consume(topic, group=group, guarantee="exactly-once", table=table, stop=token)
    except kdg.KdgError as exc:  # a refused option, Kafka or Postgres out of reach, …
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(report.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main(*(sys.argv[1:] + ["events", "service", "app.events"][len(sys.argv) - 1:])))
