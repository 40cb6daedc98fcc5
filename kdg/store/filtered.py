"""Records a transform filtered out, claimed as such: read on purpose, written nowhere, never lost.

A record a route's transform returned None for leaves no row in that route's table. Under exactly-once it
is claimed all the same in the table's claim table (``kdg_dedup_<n>``), marked ``filtered`` (migration 008),
inside the transaction that writes the batch's rows and moves its offsets (:mod:`kdg.store.unit`): a kill
can never leave an offset moved past a filtered record without its claim. The claim lives and expires with
the table's other claims (its window, :mod:`kdg.store.windows`), and ``kdg db forget`` drops it with them.
``kdg audit`` counts a missing key with such a claim as ``filtered``, not lost (:mod:`kdg.audit`).

A batch without a filtered record costs nothing here: no statement is sent.
"""

from kdg.settings import TableName
from kdg.store.claims import claimable, prepare_claims, run_end

# As claims.CLAIM, from arrays rather than a staged table, each claim marked filtered. $1 the sink table's
# identity, $2 the time a key without one is claimed at, $3 the window's horizon (a key below it: no claim),
# $4..$8 the keys, their times (as kdg.store.windows.keys_ms reads them: NULL for a key without one), topics,
# partitions and offsets. A key claimed already (a row was written for it, or it was filtered before) keeps
# its claim. An offset key is claimed as a run of one offset, never merged: a filtered record's run says so.
MARK = f"""INSERT INTO {{claims}} (sink_table, idempotency_key, key_ms, topic, "partition", "offset", filtered,
                               last_offset)
          SELECT $1, f.k, coalesce(f.ms, $2), f.topic, f."partition", f."offset", true, {run_end("f", "f.k")}
          FROM unnest($4::text[], $5::bigint[], $6::text[], $7::int[], $8::bigint[]) AS f(k, ms, topic, "partition",
                                                                                          "offset")
          WHERE {claimable("f", "f.k", "f.ms")}
          ON CONFLICT DO NOTHING"""


async def mark_filtered(store, filtered: list[tuple[TableName, list[tuple]]], held: set = frozenset()) -> None:
    """Inside the batch's transaction: claim, marked filtered, each ``(key, topic, partition, offset)`` of each
    table's list (``filtered``: ``(table identity, records)`` per table). One statement a table, after the
    window's horizon is held (:func:`~kdg.store.claims.prepare_claims`; ``held``: the claim tables whose
    horizon this transaction holds already, as its rows' claims took it)."""
    for table, keyed in filtered:
        window = await store._claim_window(table)
        keys, topics, partitions, offsets = zip(*keyed)
        claims = await prepare_claims(store.conn, window, list(keys), held=window.relation in held)
        await store.conn.execute(MARK.format(claims=window.sql), *claims.args, keys, claims.times, topics,
                                 partitions, offsets)
