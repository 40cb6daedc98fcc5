"""Many topics into many tables in one `kdg consume`: patterns, templates, positions per topic."""

import time
import uuid

from conftest import as_json, audited


def test_a_pattern_reads_a_topic_created_later_and_keeps_positions_it_has(kdg, kdg_spawn, group):
    """Topic A was read by the group before; the pattern's run continues A from there (a -o beginning on A
    would write A's first records again: at-least-once keeps every duplicate), starts B, created only once
    the run is going, at -o, and routes each to its table by the template. The dead-letter topic the run
    makes (A.dlq) matches the pattern too, and is never read back as rows."""
    prefix = f"mt{uuid.uuid4().hex[:8]}"
    a, b = f"{prefix}.a", f"{prefix}.b"
    kdg("produce", a, "-g", "exactly-once", "--count", 300)
    kdg("consume", a, "-G", group, "--table", f"{prefix}_a", "-e")
    kdg("produce", a, "-g", "exactly-once", "--count", 99)
    kdg("produce", a, "-g", "exactly-once", "--count", 1, "--size", 3000)  # oversize: to A.dlq

    run = kdg_spawn("consume", "--topic-pattern", rf"{prefix}\.(.*)", "-G", group, "--table", prefix + "_{1}",
                    "-o", "beginning", "--idle-timeout", 12, "--max-bytes", 2000, "--json")
    try:
        time.sleep(4)  # subscribed, A's partitions assigned and read
        kdg("produce", b, "-g", "exactly-once", "--count", 200)
        out, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 0, err
    report = as_json(type("P", (), {"stdout": out}))
    assert report["consumed"] == 300 and report["dead_lettered"] == 1, report  # A's 100 new and B's, once
    assert {t: e["written"] for t, e in report["tables"].items()} == {f"public.{prefix}_a": 99,
                                                                     f"public.{prefix}_b": 200}
    for topic, table in ((a, f"{prefix}_a"), (b, f"{prefix}_b")):
        found = audited(kdg, topic, "--table", table, "-G", group)
        assert (found["lost"], found["duplicates"], found["pending"]) == (0, 0, 0), found
