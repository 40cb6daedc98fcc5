"""Fenced consumer offsets in ``kdg_offsets``: taking partitions over, reading and moving what is stored.

Mixed into :class:`kdg.store.pg.Store`; the ``_``-prefixed coroutines run inside a transaction a
sink or a replay opened, so the offsets move with the rows they account for.
"""

from kdg.errors import Fenced, RetryBatch

_STREAM_LOCK = 0x6B6467  # pg_advisory_lock(this, hashtext(group/topic)): held by a Spark stream while it runs
# whether that lock is held now, read without taking it (a lock on two int4 keys shows as classid, objid, objsubid 2)
_STREAM_HELD = """SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
                    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND classid = $1::integer::oid AND objid = hashtext($2)::oid)"""


class OffsetsMixin:
    """The consumer offsets: owns each partition's fence and stored next offset in ``kdg_offsets``.

    Taking partitions over bumps their fences; a batch's offsets move only while this consumer
    still holds the fence (and, pipelined, only on top of what the batch before it stored); a
    replay's offsets only ever move forward. Touches ``kdg_offsets`` alone.
    """

    def acquire_partitions(self, group: str, topic: str, partitions: list[int]) -> dict[int, tuple[int, int | None]]:
        """Take ownership of ``partitions``: bump each fence; return ``{p: (fence, next_offset)}``."""
        rows = self._run(self.conn.fetch(
            """INSERT INTO kdg_offsets (consumer_group, topic, "partition", fence)
               SELECT $1, $2, p, 1 FROM unnest($3::int[]) AS p
               ON CONFLICT (consumer_group, topic, "partition")
               DO UPDATE SET fence = kdg_offsets.fence + 1, updated_at = now()
               RETURNING "partition", fence, next_offset""", group, topic, partitions))
        return {r["partition"]: (r["fence"], r["next_offset"]) for r in rows}

    def acquire(self, group: str, tps) -> dict[tuple[str, int], tuple[int, int | None]]:
        """:meth:`acquire_partitions` for ``(topic, partition)`` pairs of any topics."""
        taken = {}
        for topic, parts in _by_topic(tps).items():
            taken.update({(topic, p): found for p, found in self.acquire_partitions(group, topic, parts).items()})
        return taken

    def stored(self, group: str, topics) -> dict[tuple[str, int], int]:
        """:meth:`stored_offsets` of several topics, keyed ``(topic, partition)``."""
        rows = self._run(self.conn.fetch(
            """SELECT topic, "partition", next_offset FROM kdg_offsets
               WHERE consumer_group = $1 AND topic = ANY($2::text[]) AND next_offset IS NOT NULL""",
            group, sorted(set(topics))))
        return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}

    async def _move_all_offsets(self, group, next_offsets, fences, expected=None) -> None:
        """:meth:`_move_offsets` for ``{(topic, partition): next}`` of any topics, in one statement (two when
        chained: ``expected``), whatever the number of topics. Rows are taken in (topic, partition) order, so
        two connections moving the same partitions lock them in one order."""
        if not next_offsets:
            return
        tps = sorted(next_offsets)
        topics, parts = [t for t, _ in tps], [p for _, p in tps]
        if expected is not None:
            held = {(r["topic"], r["partition"]): r for r in await self.conn.fetch(
                """SELECT o.topic, o."partition", o.fence, o.next_offset
                   FROM kdg_offsets o JOIN unnest($2::text[], $3::int[]) AS v(t, p)
                        ON o.topic = v.t AND o."partition" = v.p
                   WHERE o.consumer_group = $1 ORDER BY o.topic, o."partition" FOR UPDATE OF o""",
                group, topics, parts)}
            _chained(held, tps, fences, expected)
        status = await self.conn.execute(
            """UPDATE kdg_offsets o SET next_offset = v.next, updated_at = now()
               FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bigint[]) AS v(t, p, next, fence)
               WHERE o.consumer_group = $1 AND o.topic = v.t AND o."partition" = v.p AND o.fence = v.fence""",
            group, topics, parts, [next_offsets[tp] for tp in tps], [fences.get(tp, -1) for tp in tps])
        if int(status.split()[-1]) != len(tps):
            raise Fenced(f"partitions {_named(tps)} were reassigned; this consumer's batch was rolled back")

    def stored_offsets(self, group: str, topic: str) -> dict[int, int]:
        rows = self._run(self.conn.fetch(
            """SELECT "partition", next_offset FROM kdg_offsets
               WHERE consumer_group = $1 AND topic = $2 AND next_offset IS NOT NULL""", group, topic))
        return {r["partition"]: r["next_offset"] for r in rows}

    async def _move_offsets(self, group, topic, next_offsets, fences, expected=None) -> None:
        if not next_offsets:
            return
        parts = sorted(next_offsets)
        if expected is not None:
            await self._check_chain(group, topic, parts, fences, expected)
        status = await self.conn.execute(
            """UPDATE kdg_offsets o SET next_offset = v.next, updated_at = now()
               FROM unnest($3::int[], $4::bigint[], $5::bigint[]) AS v(p, next, fence)
               WHERE o.consumer_group = $1 AND o.topic = $2 AND o."partition" = v.p AND o.fence = v.fence""",
            group, topic, parts, [next_offsets[p] for p in parts], [fences[p] for p in parts])
        if int(status.split()[-1]) != len(parts):
            raise Fenced(f"partitions {parts} of {topic} were reassigned; this consumer's batch was rolled back")

    async def _check_chain(self, group, topic, parts, fences, expected) -> None:
        """Each partition must still hold what the batch before this one stored there (pipelined writes).

        ``FOR UPDATE`` waits for that batch's transaction on another connection and then reads what
        it left; a plain UPDATE's WHERE would have compared against the row as it was before.
        """
        held = {(topic, r["partition"]): r for r in await self.conn.fetch(
            """SELECT "partition", fence, next_offset FROM kdg_offsets
               WHERE consumer_group = $1 AND topic = $2 AND "partition" = ANY($3::int[])
               ORDER BY "partition" FOR UPDATE""", group, topic, parts)}
        _chained(held, [(topic, p) for p in parts], {(topic, p): f for p, f in fences.items()},
                 {(topic, p): e for p, e in expected.items()})

    def move_forward(self, group: str, topic: str, next_offsets: dict[int, int], fences: dict[int, int]) -> None:
        """Store positions on their own, while ``fences`` still hold (a Spark stream's, after a micro-batch);
        a position never moves back (a batch read again from an older checkpoint stores nothing lower)."""
        parts = sorted(next_offsets)

        async def move():
            status = await self.conn.execute(
                """UPDATE kdg_offsets o SET next_offset = GREATEST(o.next_offset, v.next), updated_at = now()
                   FROM unnest($3::int[], $4::bigint[], $5::bigint[]) AS v(p, next, fence)
                   WHERE o.consumer_group = $1 AND o.topic = $2 AND o."partition" = v.p AND o.fence = v.fence""",
                group, topic, parts, [next_offsets[p] for p in parts], [fences.get(p, -1) for p in parts])
            if int(status.split()[-1]) != len(parts):
                raise Fenced(f"group {group!r}'s partitions {parts} of {topic} were taken over by another "
                             "consumer (kdg consume?) while this stream ran")

        if parts:
            self._run(move())

    def hold_stream(self, group: str, topic: str) -> bool:
        """Take the lock that says a Spark stream reads ``topic`` for ``group`` (held by this connection until it
        closes, or dies with its process); False if another holds it."""
        return self._run(self.conn.fetchval("SELECT pg_try_advisory_lock($1, hashtext($2))", _STREAM_LOCK,
                                            f"{group}/{topic}"))

    def stream_running(self, group: str, topic: str) -> bool:
        """Whether a Spark stream holds ``group``'s lock on ``topic`` now, read from ``pg_locks``. Never by taking
        the lock, even for an instant: members of a group starting together then saw each other's look as a
        stream's, and a stream taking its lock at that instant took the member for another stream."""
        return self._run(self.conn.fetchval(_STREAM_HELD, _STREAM_LOCK, f"{group}/{topic}"))

    async def _advance_offsets(self, group: str, topic: str, ranges: dict[int, tuple[int, int]]) -> None:
        """Stored offsets only move forward; a consumer's fence is left alone."""
        parts = sorted(ranges)
        await self.conn.execute(
            """INSERT INTO kdg_offsets (consumer_group, topic, "partition", next_offset)
               SELECT $1, $2, p, o FROM unnest($3::int[], $4::bigint[]) AS v(p, o)
               ON CONFLICT (consumer_group, topic, "partition") DO UPDATE
               SET next_offset = GREATEST(kdg_offsets.next_offset, EXCLUDED.next_offset), updated_at = now()""",
            group, topic, parts, [ranges[p][1] for p in parts])


def _by_topic(tps) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for topic, partition in tps:
        found.setdefault(topic, []).append(partition)
    return found


def _chained(held: dict, tps: list, fences: dict, expected: dict) -> None:
    """Fenced if another consumer holds any of ``tps`` (``(topic, partition)``) now; RetryBatch if any does not hold
    what the batch before this one stored there (``expected``: it rolled back)."""
    if any(tp not in held or held[tp]["fence"] != fences.get(tp, -1) for tp in tps):
        raise Fenced(f"partitions {_named(tps)} were reassigned; this consumer's batch was rolled back")
    if any(held[tp]["next_offset"] != expected.get(tp, held[tp]["next_offset"]) for tp in tps):
        raise RetryBatch(f"the batch written before this one on partitions {_named(tps)} did not commit; this "
                         "one was rolled back to be read again")


def _named(tps) -> str:
    """``(topic, partition)`` pairs as a user reads them: ``t [0, 1], u [2]``."""
    return ", ".join(f"{t} {parts}" for t, parts in _by_topic(tps).items())
