"""``--reprocess``: records claimed before, applied again to an upsert table (a backfill after a schema change).

Under exactly-once a record read again is suppressed: its key is claimed in the table's claims, which belong to
the table, not to a group. That is right until the table gains a column: the rows written before have NULL
there, and reading their records again fills nothing. Under upsert, applying a record twice is harmless if an
older version never overwrites a newer one, so a typed upsert route may say ``--reprocess``: a staged row whose
key was claimed before this batch is applied again instead of dropped (:func:`reprocess_claim_sql`), counted
``reprocessed``. Keys new to the table are claimed and written as always.

A row applied again only UPDATEs its key's row (:func:`again_sql`), and only where that row came from the same
partition (and topic, where the mapping maps it) at an offset no later than the record's own: the columns the
mapping maps from ``partition`` and ``offset`` say where a row came from, and a route without them is refused
(:func:`check_reprocess`). So an older record read again never rolls a row back to an older version, and never
brings back a row a later delete or truncate removed. A tombstone or truncate claimed before stays a duplicate:
it was applied once. Rows it leaves alone are ``superseded``.
"""

from kdg.errors import UsageError
from kdg.mapping.spec import Mapping
from kdg.store.claims import CLAIM, OUTSIDE

_INTEGERS = ("smallint", "integer", "bigint", "numeric")


def check_reprocess(mapping: Mapping, topics: int = 1) -> None:
    """Refuse ``--reprocess`` (a usage error saying why) where applying a record again would duplicate it (an
    insert table) or could roll its row back (the mapping does not say which partition and offset it came from,
    or, ``topics`` more than one (a pattern: 2), which topic)."""
    table = mapping.table.text
    if mapping.mode != "upsert":
        raise UsageError(f"--reprocess applies records already written to {table} again, and {table} is written in "
                         "insert mode, where each would be a second row: it needs mode = upsert")
    found = _positions(mapping)
    missing = [name for name in ("partition", "offset") if name not in found]
    if missing:
        raise UsageError(f"--reprocess must know where each row of {table} came from, so that an older record read "
                         f"again never rolls it back: map the records' partition and offset to columns (e.g. --column "
                         f"'src_partition integer = partition' --column 'src_offset bigint = offset'); "
                         f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not mapped")
    if topics > 1 and "topic" not in found:
        raise UsageError(f"--reprocess must know where each row of {table} came from, and more than one topic "
                         "(or a pattern) is read into it: map the records' topic to a column too (e.g. --column "
                         "'src_topic text = topic')")
    for name in ("partition", "offset"):
        column = found[name]
        if column.type is not None and column.type.base not in _INTEGERS:
            raise UsageError(f"--reprocess compares column {column.name!r} of {table} with each record's {name}, "
                             f"and it is {column.type.name}, not an integer type")


def reprocess_claim_sql(target, claims: str) -> str:
    """:meth:`TypedTarget.claim_sql` under ``--reprocess``: a staged row whose key was claimed before this batch
    stays staged, its seq listed in ``again``; a tombstone claimed before, and a row whose key an earlier row of
    this batch has just claimed (the same record twice in the topic), are deleted as duplicates. One row: the
    duplicates, how many of them were tombstones or deletes, and ``again``."""
    stage = target.stage
    exact = ('SELECT 1 FROM claimed c WHERE c.idempotency_key = s.idempotency_key '
             'AND c."partition" = s."partition" AND c."offset" = s."offset"')
    return f"""WITH claimed AS ({CLAIM.format(claims=claims, stage=stage)}),
               seen AS (SELECT s.seq, s.tomb OR EXISTS (SELECT 1 FROM claimed c
                                                        WHERE c.idempotency_key = s.idempotency_key) AS dup
                        FROM {stage} s WHERE NOT EXISTS ({exact}) AND NOT {OUTSIDE}),
               gone AS (DELETE FROM {stage} s USING seen d WHERE s.seq = d.seq AND d.dup RETURNING s.tomb)
               SELECT (SELECT count(*) FROM gone) AS duplicates, (SELECT count(*) FROM gone WHERE tomb) AS tombs,
                      coalesce((SELECT array_agg(seq ORDER BY seq) FROM seen WHERE NOT dup), '{{}}') AS again"""


def again_sql(target, keeping: bool = False) -> str:
    """The statement applying the staged rows claimed before (seqs ``$3``) that are the latest of their key with
    ``$1 <= seq <= $2``: an UPDATE of the key's row, where that row came from the same partition (and topic,
    where mapped) at an offset no later than the record's. Its count is the rows written; the upsert of the other
    rows (:meth:`TypedTarget.write_sql` with ``again``) leaves these out."""
    m = target.mapping
    found = _positions(m)
    values = target.kept_values() if keeping else [c.type.cast(f"l.c{i}") for i, c in enumerate(m.columns)]
    sets = [f"{c.sql} = {v}" for c, v in zip(m.columns, values) if c.name not in m.key] or [
        f"{m.columns[0].sql} = {values[0]}"]
    where = [f"t.{m.column(k).sql} = {target._key_cast(k, 'l')}" for k in m.key]
    where += [f't.{found["partition"].sql} = l."partition"', f't.{found["offset"].sql} <= l."offset"']
    if "topic" in found:
        where.append(f"t.{found['topic'].sql}::text = l.topic")
    return (f"WITH latest AS ({target.latest_sql(m.on_tombstone == 'delete')}) "
            f"UPDATE {m.table.sql} t SET {', '.join(sets)} FROM latest l "
            f"WHERE l.seq = ANY($3::integer[]) AND NOT l.tomb AND {' AND '.join(where)}")


def _positions(mapping: Mapping) -> dict:
    """The columns mapped from the records' ``topic``, ``partition`` and ``offset``, by that name (a from-schema
    route's among those it lists besides the schema's)."""
    return {c.source.name: c for c in mapping.extra_columns + mapping.columns
            if c.source.kind == "meta" and c.source.name in ("topic", "partition", "offset")}
