"""Many topics alone: 3 topics into 3 tables against one topic into one table, exactly-once (issue 45).

    .venv/bin/python benchmarks/many_topics_bench.py                  # 1M records in total, medians of 3
    .venv/bin/python benchmarks/many_topics_bench.py --records 100000 --repeat 1

The same comparison as `make bench`'s "3 topics into 3 tables" row (benchmarks/consume_bench.py, whose two
measurements it runs), without the rest of the consume part: a quick check of the goal while working on it.

  one topic    `kdg consume t -G G --table one -g exactly-once -e` over --records records of 100 B
  3 topics     `kdg consume t1 t2 t3 -G G --table 'mt_{topic}' -g exactly-once -e` over the same number of
               records split evenly over three topics: one transaction per batch holds every table's rows and
               every partition's offsets

Prints each one's rows/s (medians, runs interleaved in rotated order), CPU per million rows, and the ratio
(goal: at least 0.9), and writes them to benchmarks/results/many_topics_bench.json. Runs on the local stack
(``KDG_STATE_DIR`` picks another, e.g. a test stack already running).
"""

import argparse
import json
from pathlib import Path

from common import drop_topic, fresh_topic, kdg_json, machine, stack
from consume_bench import kdg_consume, kdg_consume_many, lists_option
from measures import Measures, row

HERE = str(Path(__file__).resolve().parent.parent)  # the kdg package this tree holds
GOAL = 0.9


def produce(layout, topic: str, records: int) -> None:
    kdg_json(layout, "produce", topic, "-g", "exactly-once", "--count", records, "--size", 100,
             "--txn-size", 100_000, "--no-ledger")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="records of 100 B in total, on each side")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "many_topics_bench.json"))
    args = ap.parse_args()
    if not lists_option(HERE, "consume", "--topic-pattern"):
        ap.error("this kdg's `kdg consume` takes one topic (no --topic-pattern): nothing to compare")
    layout = stack()
    print(f"machine: {machine()}; stack: {layout.brokers} brokers on loopback")
    one, split = fresh_topic("one"), [fresh_topic(f"mt-{i}") for i in range(3)]
    measures = Measures()
    try:
        produce(layout, one, args.records)
        for part in split:
            produce(layout, part, args.records // 3)
        print(f"{args.records} records of 100 B: one topic, and {args.records // 3} on each of 3 topics")
        measures.repeat(args.repeat, {
            "one topic": lambda: kdg_consume(layout, one, "exactly-once", HERE),
            "3 topics": lambda: kdg_consume_many(layout, split, "exactly-once", HERE)})
    finally:
        for topic in (one, *split):
            drop_topic(layout, topic)
    result = row(measures, "consume exactly-once → Postgres, 3 topics into 3 tables (rows/s)", "3 topics",
                 "one topic", "one topic into one table")
    result.update(records=args.records, repeat=args.repeat, goal=GOAL, machine=machine())
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    many, single = result["kdg"], result["reference"]
    print(f"one topic: {single['median']:,.0f} rows/s, {single['cpu_s_per_m']} CPU-s/M\n"
          f"3 topics:  {many['median']:,.0f} rows/s, {many['cpu_s_per_m']} CPU-s/M\n"
          f"ratio {result['ratio']} ({'meets' if result['ratio'] >= GOAL else 'short of'} the goal of {GOAL}); "
          f"written to {args.json}")


if __name__ == "__main__":
    main()
