"""`kdg audit` without -G on a topic several groups consumed: each group audited apart, or asked for one."""

from conftest import audited

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

    # the output topic does not say who wrote it, and the groups stand apart: asked for one
    refused = kdg("audit", topic, "--sink", out, "--json", check=False)
    assert refused.returncode == 2 and "-G GROUP" in refused.stderr, refused.stderr
    assert all(g in refused.stderr for g in (full, partial, to_kafka)), refused.stderr
    mine = audited(kdg, topic, "--sink", out, "-G", to_kafka)
    assert mine["pending"] == N - mine["processed_unique"] > 0 and mine["lost"] == 0, mine
    # the anomaly the refusal avoids: another group's positions call the unread records lost
    assert audited(kdg, topic, "--sink", out, "-G", full)["lost"] == mine["pending"]

    # once every group has read the whole topic their positions agree, so no group needs naming
    for group, sink in ((partial, "postgres"), (to_kafka, out)):
        kdg("consume", topic, "-G", group, "-g", "at-least-once", "--sink", sink, "-e", "--json")
    agreed = audited(kdg, topic, "--sink", out)
    assert agreed["positions_of"] == ", ".join(sorted((full, partial, to_kafka))), agreed
    assert (agreed["processed_unique"], agreed["lost"], agreed["pending"], agreed["duplicates"]) == (N, 0, 0, 0)
