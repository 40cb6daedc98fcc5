"""Executor side of `kdg spark-replay`: one Spark task writes its rows through the Postgres store.

Everything here runs in Spark's Python workers. It holds no driver state: a task gets a picklable
:class:`WriteSpec` and Arrow batches, opens its own :class:`~kdg.store.pg.Store`, and yields one
summary row. Spark keeps only successful tasks' results, so the summed counts are exact even when
a task was retried.
"""

from dataclasses import dataclass
from typing import Iterator

from kdg import faults
from kdg.errors import KeylessRecord
from kdg.store.rows import SINK_COLUMNS

SUMMARY_SCHEMA = "rows_read long, rows_written long, duplicates_dropped long, chunks long"
COLUMNS = SINK_COLUMNS


@dataclass(frozen=True)
class WriteSpec:
    dsn: str
    table: str             # canonical NAME or SCHEMA.NAME (TableName.text); the store quotes it
    group: str
    dedup: bool            # exactly-once: claim each key in kdg_dedup with its row
    chunk_rows: int        # rows per Postgres transaction


def write_task(batches: Iterator, spec: WriteSpec) -> Iterator:
    """``mapInArrow`` function: write this task's rows in chunks of ``spec.chunk_rows``; yield one summary row."""
    import pyarrow as pa
    from pyspark import TaskContext

    from kdg.store.pg import Store

    ctx = TaskContext.get()
    # fires once: in the first Spark partition, on its first attempt, after one chunk committed
    fault_armed = ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0
    read = written = dropped = chunks = 0
    seen: set[str] = set()
    pending: list[tuple] = []
    with Store(spec.dsn) as store:
        def flush() -> None:
            nonlocal written, dropped, chunks
            if spec.dedup:
                inserted = store.write_claimed(spec.table, spec.group, pending)
                dropped += len(pending) - inserted
            else:
                inserted = store.write_plain(spec.table, spec.group, pending)
            written += inserted
            chunks += 1
            pending.clear()
            if fault_armed:
                faults.reach("spark-task-mid-write")

        for batch in batches:
            columns = [batch.column(name).to_pylist() for name in COLUMNS]
            for row in zip(*columns):
                read += 1
                if spec.dedup:
                    key = row[0]
                    if key is None:
                        raise KeylessRecord(f"record {row[1]}/{row[2]}/{row[3]} has no kdg-id header and no "
                                            "--id-from key; exactly-once needs an idempotency key for every record")
                    if key in seen:  # a repeat within this task's range never reaches Postgres
                        dropped += 1
                        continue
                    seen.add(key)
                pending.append(row)
                if len(pending) >= spec.chunk_rows:
                    flush()
        if pending:
            flush()
    yield pa.RecordBatch.from_pylist(
        [{"rows_read": read, "rows_written": written, "duplicates_dropped": dropped, "chunks": chunks}])
