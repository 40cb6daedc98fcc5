"""`kdg audit` without -G on a topic several groups consumed: each group audited apart, or asked for one."""

import uuid

from conftest import audited

from kdg.store.pg import Store

N = 3000
COUNTS = ("acked", "processed_unique", "rows", "lost", "pending", "duplicates", "unexpected")


def test_each_group_is_audited_apart_and_unread_records_are_pending(kdg, topic):
    # a group's name may hold what rich reads as markup: the human output must show it, not fail on it
    full, partial, to_kafka = (f"{role}-{topic}" for role in ("full", "partial[/]", "to-kafka"))
    out = f"kafka:{topic}-out"
    kdg("produce", topic, "-g", "exactly-once", "--count", N, "--json")
    kdg("consume", topic, "-G", full, "-g", "exactly-once", "-e", "--json")
    kdg("consume", topic, "-G", partial, "-g", "at-least-once", "-c", 900, "--batch-size", 300, "--json")
    kdg("consume", topic, "-G", to_kafka, "-g", "at-least-once", "-c", 600, "--batch-size", 300, "--sink", out,
        "--json")

    alone = audited(kdg, topic, "-G", partial)  # what the partial group's audit must say: not read yet, not lost
    assert alone["pending"] > 0 and alone["lost"] == 0 and alone["pending"] + alone["processed_unique"] == N, alone

    audits = audited(kdg, topic)  # kdg_events names each row's group: one audit per group that wrote into it
    by_group = {r["group"]: r for r in audits["groups"]}
    assert set(by_group) == {full, partial} and audits["balanced"], audits
    assert ({k: by_group[full][k] for k in ("acked", "processed_unique", "lost", "pending", "duplicates")}
            == {"acked": N, "processed_unique": N, "lost": 0, "pending": 0, "duplicates": 0}), by_group[full]
    assert {k: by_group[partial][k] for k in COUNTS} == {k: alone[k] for k in COUNTS}, (by_group[partial], alone)
    assert by_group[partial]["positions_of"] == partial
    table = kdg("audit", topic).stdout
    assert f"group {full}" in table and f"group {partial}" in table, table

    # an output topic's records name the group that wrote them (kdg-group): its one writer, by its positions
    mine = audited(kdg, topic, "--sink", out)
    assert mine["positions_of"] == to_kafka and mine["pending"] == N - mine["processed_unique"] > 0, mine
    assert mine["lost"] == 0 and mine["duplicates"] == 0, mine
    # an output topic nobody wrote into cannot be split, and the groups stand apart: asked for one
    empty = f"kafka:{topic}-none"
    refused = kdg("audit", topic, "--sink", empty, "--json", check=False)
    assert refused.returncode == 2 and "-G GROUP" in refused.stderr, refused.stderr
    assert all(g in refused.stderr for g in (full, partial, to_kafka)), refused.stderr

    # once every group has read the whole topic their positions agree, so no group needs naming; a second
    # group writing into the same output topic: each group's records are its own, not the other's duplicates
    second = f"second-{topic}"
    for group, sink, guarantee in ((partial, "postgres", "at-least-once"), (to_kafka, out, "at-least-once"),
                                   (second, out, "exactly-once")):
        kdg("consume", topic, "-G", group, "-g", guarantee, "--sink", sink, "-e", "--json")
    agreed = audited(kdg, topic, "--sink", empty)
    assert agreed["positions_of"] == ", ".join(sorted((full, partial, second, to_kafka))), agreed
    assert agreed["lost"] == N, agreed  # every group passed every record, and none is in that topic
    both = audited(kdg, topic, "--sink", out)
    by_group = {r["group"]: r for r in both["groups"]}
    assert set(by_group) == {to_kafka, second} and both["balanced"], both
    assert all((r["processed_unique"], r["rows"], r["lost"], r["pending"], r["duplicates"]) == (N, N, 0, 0, 0)
               for r in by_group.values()), by_group


def test_another_groups_dead_letters_do_not_account_for_a_groups_loss(kdg, conn, topic):
    """A row gone from one group's table is its loss, even once another group dead-lettered that record."""
    mine, other, table = f"mine-{topic}", f"other-{topic}", f"dl_{uuid.uuid4().hex[:8]}"
    kdg("produce", topic, "-g", "exactly-once", "--count", 3, "--json")
    kdg("consume", topic, "-G", mine, "-g", "at-least-once", "--table", table, "-e", "--json")
    with Store(conn.pg_dsn) as store:
        gone = store.fetchval(f"DELETE FROM {table} WHERE idempotency_key = (SELECT min(idempotency_key) FROM {table}) "
                              "RETURNING idempotency_key")
    kdg("consume", topic, "-G", other, "-g", "at-least-once", "--table", f"{table}_b", "--max-bytes", 1, "-e",
        "--json")  # every record is one byte too large for it: three dead letters, of the other group
    lost = audited(kdg, topic, "--table", table, "-G", mine)
    assert (lost["lost"], lost["dead_lettered"], lost["examples"]["lost"]) == (1, 0, [gone]), lost
    theirs = audited(kdg, topic, "--table", f"{table}_b", "-G", other)
    assert (theirs["lost"], theirs["dead_lettered"], theirs["balanced"]) == (0, 3, True), theirs
