"""Claims of offset keys kept as runs (migration 010): one claim row per run of consecutive offsets.

A record whose key is its own coordinates (``--id-from offset``) is claimed by them, in a run with its
partition's neighbours; any other key is claimed as itself. An offset inside a run, not only its first, must be
found claimed, by the COPY path's look-up and by the SQL claim alike, and a run never overlaps another. The
end-to-end proof (a crash at each step, then a second group finding every record claimed) is
``test_typed_sink.py``'s crash test, which reads with ``--id-from offset``.
"""

import asyncio
import uuid

from pg_server import fresh_database, run_sql

from kdg.store.claims import copy_all_claims, prepare_claims
from kdg.store.migrations import apply_migrations
from kdg.store.pg import Store

TABLE = "app.runs"


def own(partition: int, offset: int, topic: str = "tp") -> tuple:
    """An offset key's claim: ``(key, topic, partition, offset)`` with the key its own coordinates."""
    return f"{topic}/{partition}/{offset}", topic, partition, offset


def attempt(store, keyed: list[tuple]) -> bool:
    """One transaction claiming ``keyed`` by COPY; whether it could (else nothing is claimed)."""
    identity = store.ensure_sink_table(TABLE)

    async def go():
        async with store.conn.transaction():
            window = await store._claim_window(identity)
            claims = await prepare_claims(store.conn, window, [k for k, *_ in keyed])
            return await copy_all_claims(store.conn, [(claims, keyed)])
    return store._run(go())


def claims(store) -> list[tuple]:
    return [tuple(r) for r in store.fetch('SELECT idempotency_key, "partition", "offset", last_offset FROM kdg_dedup '
                                          "WHERE sink_table = $1 ORDER BY 2, 3, 1", TABLE)]


def test_offset_keys_are_claimed_as_runs_and_an_offset_inside_one_is_claimed(stack):
    with fresh_database(stack.pg_dsn, f"kdg_{uuid.uuid4().hex[:10]}") as dsn:
        apply_migrations(dsn)
        with Store(dsn) as store:
            store.ensure_sink_table(TABLE)
            # two partitions interleaved, and one key of another kind, read from partition 1's offset 5
            batch = [own(p, o) for o in range(10) for p in (0, 1) if p == 0 or o < 5] + [("order-3", "tp", 1, 5)]
            assert attempt(store, batch)
            assert claims(store) == [("tp/0/0", 0, 0, 9), ("tp/1/0", 1, 0, 4), ("order-3", 1, 5, None)]
            keys = store.fetch("SELECT idempotency_key, \"offset\" FROM kdg_claim_keys WHERE sink_table = $1", TABLE)
            assert sorted((r["idempotency_key"], r["offset"]) for r in keys) == sorted(
                (k, o) for k, _, _, o in batch)

            # offset 9 is inside a run, not its first: found, so the batch is claimed in SQL, which claims only
            # what is new, each offset a run of one
            assert not attempt(store, [own(0, 9), own(0, 10)])
            assert store.write_claimed(TABLE, "g", [(*own(0, o), None, b"v", "{}") for o in (5, 10, 11)]) == 2
            assert claims(store)[:3] == [("tp/0/0", 0, 0, 9), ("tp/0/10", 0, 10, 10), ("tp/0/11", 0, 11, 11)]
            # the same key spelled by a record elsewhere is another key: claimed as itself
            assert attempt(store, [("tp/0/3", "other", 0, 3)])
            # an offset twice in a batch makes no run: claimed in SQL, once
            assert not attempt(store, [own(2, 0), own(2, 0)])
            store.write_claimed(TABLE, "g", [(*own(2, 0), None, b"v", "{}")] * 2)
            assert ("tp/2/0", 2, 0, 0) in claims(store) and len(claims(store)) == 7
            # a run after all that starts where the claims end, and is one row
            assert attempt(store, [own(0, o) for o in range(12, 40)])
            assert ("tp/0/12", 0, 12, 39) in claims(store)
            assert store.fetchval("SELECT count(*) FROM kdg_claim_keys WHERE sink_table = $1", TABLE) == (
                16 + 2 + 1 + 1 + 28)


def test_claims_made_before_runs_are_runs_of_one_offset_after_the_migration(stack):
    """A database at migration 009 holds offset keys claimed one by one; 010 makes each a run of one offset,
    so an offset claimed then is found claimed now, and other keys stay as they were."""
    with fresh_database(stack.pg_dsn, f"kdg_{uuid.uuid4().hex[:10]}") as dsn:
        apply_migrations(dsn)
        with Store(dsn) as store:
            store.ensure_sink_table(TABLE)  # (claims of a table kdg did not see yet would be dropped as stale)
        run_sql(dsn, "DROP VIEW kdg_claim_keys", "DROP INDEX kdg_dedup_runs",
                "ALTER TABLE kdg_dedup DROP COLUMN last_offset",
                "DELETE FROM kdg_schema_migrations WHERE version = '010_claim_runs.sql'")
        run_sql(dsn, f"SELECT kdg_window_part(kdg_claim_table('{TABLE}'), 5)",
                f"""INSERT INTO kdg_dedup (sink_table, idempotency_key, key_ms, topic, "partition", "offset")
                    VALUES ('{TABLE}', 'tp/0/7', 5, 'tp', 0, 7), ('{TABLE}', 'k-1', 5, 'tp', 0, 8)""")
        assert apply_migrations(dsn).applied == ["010_claim_runs.sql"]
        with Store(dsn) as store:
            assert claims(store) == [("tp/0/7", 0, 7, 7), ("k-1", 0, 8, None)]
            assert not attempt(store, [own(0, 6), own(0, 7)])
            assert attempt(store, [own(0, 8), own(0, 9)])  # k-1 was another kind of key


def test_two_writers_of_one_run_claim_it_once(stack):
    """Two transactions claim overlapping offsets at once (two groups reading one partition into one table). The
    second asks for the table's lock for keys without a time while the first holds it, then finds the first's
    run, committed meanwhile, inside its own (not at its first offset): it claims in SQL only the offsets the
    first did not. Nothing is claimed twice."""
    import threading

    batches = {"first": [own(0, o) for o in range(100)], "second": [own(0, o) for o in range(50, 150)]}
    first_holds, results = threading.Event(), {}

    def claim(store, name: str, hold=None):
        batch = batches[name]
        identity = store.ensure_sink_table(TABLE)

        async def go():
            async with store.conn.transaction():
                window = await store._claim_window(identity)
                claims = await prepare_claims(store.conn, window, [k for k, *_ in batch])
                results[name] = await copy_all_claims(store.conn, [(claims, batch)])
                if hold is not None:
                    await hold()
        store._run(go())

    with fresh_database(stack.pg_dsn, f"kdg_{uuid.uuid4().hex[:10]}") as dsn:
        apply_migrations(dsn)
        with Store(dsn) as first, Store(dsn) as second:
            async def until_the_second_waits():
                first_holds.set()
                for _ in range(200):
                    if await first.conn.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT "
                                                 "granted AND pid = $1", second.conn.get_server_pid()):
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError("the second writer never waited for the lock")

            thread = threading.Thread(target=lambda: (first_holds.wait(30), claim(second, "second")))
            thread.start()
            claim(first, "first", until_the_second_waits)
            thread.join(60)
            assert results == {"first": True, "second": False}, results
            assert second.write_claimed(TABLE, "g", [(*row, None, b"v", "{}") for row in batches["second"]]) == 50
            assert claims(first) == [("tp/0/0", 0, 0, 99)] + [(f"tp/0/{o}", 0, o, o) for o in range(100, 150)]
