"""The replay ledger: one ``kdg_replays`` row per replay run, and the stored offsets a finished one advances.

Mixed into :class:`kdg.store.pg.Store`.
"""

import json


class ReplaysMixin:
    """The replay ledger: owns recording and closing replay runs in ``kdg_replays``.

    A run that is done also advances the group's stored offsets in ``kdg_offsets``, in the same
    transaction, through :class:`~kdg.store.offsets.OffsetsMixin`'s ``_advance_offsets``.
    """

    def record_replay(self, replay_id, group: str, topic: str, table: str, guarantee: str,
                      ranges: dict[int, tuple[int, int]], *, done: bool) -> None:
        """Record a replay run; ``done`` also advances the group's stored offsets, in one transaction."""
        async def record():
            async with self.conn.transaction():
                await self.conn.execute(
                    """INSERT INTO kdg_replays (replay_id, consumer_group, topic, sink_table, guarantee, ranges,
                                                status, finished_at)
                       VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $7 = 'done' THEN now() END)""",
                    replay_id, group, topic, table, guarantee,
                    json.dumps({str(p): list(r) for p, r in sorted(ranges.items())}), "done" if done else "running")
                if done:
                    await self._advance_offsets(group, topic, ranges)

        self._run(record())

    def finish_replay(self, replay_id, group: str, topic: str, ranges: dict[int, tuple[int, int]], *,
                      status: str, summary: dict | None = None, error: str | None = None,
                      advance: bool = False) -> None:
        """Close a run's row (``done`` or ``failed``); ``advance`` moves stored offsets in the same transaction."""
        async def finish():
            async with self.conn.transaction():
                await self.conn.execute(
                    """UPDATE kdg_replays SET status = $2, finished_at = now(), summary = $3, error = $4
                       WHERE replay_id = $1""",
                    replay_id, status, json.dumps(summary) if summary is not None else None, error)
                if advance:
                    await self._advance_offsets(group, topic, ranges)

        self._run(finish())
