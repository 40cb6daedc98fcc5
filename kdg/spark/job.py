"""The replay as a Spark job: read Kafka ranges (one or several topics), key each record, write every Spark
partition to Postgres (each through its topic's route: :class:`~kdg.spark.writer.RoutedSpec`)."""

import json
import threading
from typing import Callable

from kdg.records import ID_HEADER, PROBE_HEADER
from kdg.spark.ranges import Ranges
from kdg.spark.writer import SUMMARY_COUNTS, SUMMARY_SCHEMA, RoutedSpec, WriteSpec, write_task
from kdg.store.rows import spark_projection

ROWS_PER_TASK = 250_000  # Kafka partitions larger than this are split across Spark tasks


def kafka_frame(spark, ranges: dict[str, Ranges], *, source_options: dict[str, str],
                fail_on_data_loss: bool = True, split: bool = True):
    """The records of ``ranges`` (topic → its ranges) as Spark's Kafka source reads them (key, value, headers,
    topic, …), in one frame: each Spark partition holds one topic-partition's records (or a slice of them).

    ``source_options`` come from :func:`kdg.kafka.clients.spark_source_options`: the bootstrap servers,
    the policy's isolation level and the user's properties, already vetted against the policy.
    ``split``: a large partition may be read by several tasks; not when one task must see a
    partition's records in order (an upsert's latest version wins).
    """
    total = sum(end - start for r in ranges.values() for start, end in r.values()) if split else 0
    count = sum(len(r) for r in ranges.values())
    reader = (spark.read.format("kafka")
              .options(**source_options)
              .option("assign", json.dumps({t: sorted(r) for t, r in ranges.items()}))
              .option("startingOffsets", json.dumps({t: {str(p): s for p, (s, _) in r.items()}
                                                     for t, r in ranges.items()}))
              .option("endingOffsets", json.dumps({t: {str(p): e for p, (_, e) in r.items()}
                                                   for t, r in ranges.items()}))
              .option("includeHeaders", "true")
              .option("failOnDataLoss", str(fail_on_data_loss).lower())
              .option("minPartitions", str(max(count, -(-total // ROWS_PER_TASK)))))
    return reader.load()


def _header(name: str) -> str:
    return f"cast(try_element_at(filter(headers, h -> h.key = '{name}'), 1).value as string)"


def key_expression(id_kind: str | None, id_arg: str | None, *, required: bool) -> str:
    """Spark SQL for the idempotency key: the kdg-id header, else what ``--id-from`` names.

    Without either, a weaker guarantee falls back to topic/partition/offset (as `kdg consume` does);
    exactly-once leaves it NULL so the writer refuses the record. A ``json:`` key is left NULL here:
    the executors read it (and fall back) in Python, as `kdg consume` does (``WriteSpec.id_from``).
    """
    fallbacks = []
    if id_kind == "header":
        fallbacks.append(_header(id_arg))
    if id_kind == "offset" or (not required and id_kind != "json"):
        fallbacks.append("concat_ws('/', topic, cast(partition as string), cast(offset as string))")
    if not fallbacks:
        return f"coalesce({_header(ID_HEADER)})"
    # `kdg doctor`'s probe record gets no made-up key: the writer knows it by that and steps over it
    return (f"coalesce({_header(ID_HEADER)}, CASE WHEN exists(headers, h -> h.key = '{PROBE_HEADER}') THEN NULL "
            f"ELSE coalesce({', '.join(fallbacks)}) END)")


def sink_rows(frame, key_sql: str, *, with_timestamp: bool = False):
    """The Kafka frame shaped as the store's sink rows (headers as one JSON object, as `kdg consume` writes).

    ``with_timestamp`` adds what a typed sink's mapping rebuilds each record from: its timestamp in epoch
    milliseconds, and its headers' bytes (base64 in a JSON object: the sink row's headers are text, which
    turns bytes that are not UTF-8 into U+FFFD, where a header mapped into bytea must keep them).
    """
    extra = ["unix_millis(timestamp) AS `timestamp`",
             "coalesce(to_json(map_from_entries(transform(headers, h -> struct(h.key, base64(h.value))))), '{}') "
             "AS `header_bytes`"] if with_timestamp else []
    return frame.selectExpr(*spark_projection(key_sql), *extra)


def run_write(spark, rows, spec: "RoutedSpec | WriteSpec",
              progress: Callable[[int, int, int], None] | None = None) -> dict:
    """Write every Spark partition through the store; sums the per-task summaries (only these reach the driver).

    Returns the counts summed, ``tasks``, ``per_topic`` (topic → its counts) and ``next_offsets``
    (topic → partition → the offset after the last one read).
    """
    poller = _StageProgress(spark.sparkContext, progress) if progress else None
    try:
        summaries = rows.mapInArrow(lambda batches: write_task(batches, spec), SUMMARY_SCHEMA).collect()
    finally:
        if poller:
            poller.stop()
    totals = dict.fromkeys(SUMMARY_COUNTS, 0)
    per_topic: dict[str, dict] = {}
    high: dict[str, dict[int, int]] = {}
    for row in summaries:
        mine = per_topic.setdefault(row["topic"], dict.fromkeys(SUMMARY_COUNTS, 0)) if row["topic"] else {}
        for name in SUMMARY_COUNTS:
            totals[name] += row[name]
            if mine:
                mine[name] += row[name]
        at = high.setdefault(row["topic"], {})
        for p, o in json.loads(row["offsets"]).items():
            at[int(p)] = max(o, at.get(int(p), -1))
    totals["tasks"] = len(summaries)
    totals["per_topic"] = per_topic
    totals["next_offsets"] = {t: {p: o + 1 for p, o in sorted(at.items())}  # where each partition read up to
                              for t, at in high.items() if at}
    return totals


class _StageProgress:
    """Polls Spark's status tracker and reports (tasks done, tasks in all, tasks failed)."""

    def __init__(self, sc, report: Callable[[int, int, int], None], every_s: float = 0.5):
        self._tracker, self._report, self._every = sc.statusTracker(), report, every_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kdg-spark-progress", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._done.wait(self._every):
            stages = [self._tracker.getStageInfo(s) for s in self._tracker.getActiveStageIds()]
            stages = [s for s in stages if s is not None]
            if stages:
                self._report(sum(s.numCompletedTasks for s in stages), sum(s.numTasks for s in stages),
                             sum(s.numFailedTasks for s in stages))

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=2)
