"""Bounded state: claims and ledger rows live in time partitions, dropped whole once out of their window.

What must hold: exactly-once stays 0 lost / 0 duplicates while partitions are dropped under a running
consumer; a duplicate is dropped while its first claim is kept and written (and said to be) once it is
not; a replay reaching back past the window is refused; and a database consumed halfway by kdg before
the partitioned schema is finished after it with nothing lost or repeated.
"""

import json
import os
import subprocess
import sys
import tarfile
import time
import uuid
from io import BytesIO
from pathlib import Path

import pytest
from conftest import as_json, audited
from pg_server import fresh_database, run_sql

from kdg.records import Uuid7Maker
from kdg.store.pg import Store
from kdg.store.windows import key_ms

REPO = Path(__file__).resolve().parent.parent
BEFORE_IDENTITY = "fc4aecf"  # the last commit whose kdg keyed claims by spelling, in one unpartitioned table


def test_key_ms_is_one_function_in_python_and_sql(conn):
    keys = [Uuid7Maker()(), "019a6f0e-4a1b-7c3d-9e4f-5a6b7c8d9e0f", "019A6F0E-4A1B-7C3D-9E4F-5A6B7C8D9E0F",
            "019a6f0e-4a1b-4c3d-9e4f-5a6b7c8d9e0f", "019a6f0e-4a1b-7c3d-1e4f-5a6b7c8d9e0f", "order-17",
            "019a6f0e-4a1b-7c3d-9e4f-5a6b7c8d9e0f0", "019a6f0e4a1b-7c3d-9e4f-5a6b7c8d9e0f-", "", "t/0/12"]
    with Store(conn.pg_dsn) as store:
        in_sql = [r["ms"] for r in store.fetch("SELECT kdg_key_ms(k) AS ms FROM unnest($1::text[]) WITH ORDINALITY "
                                                "AS u(k, i) ORDER BY i", keys)]
    assert in_sql == [key_ms(k) for k in keys]
    assert in_sql[1] == 1762799798811 and in_sql[2:] == [None] * 8  # upper case, v4, wrong variant: no time


def test_a_consume_across_partition_drops_stays_exactly_once(kdg, conn, topic):
    """1 s window, 125 ms partitions; records arrive for ~4 s while the consumer maintains its claims."""
    table = f"bs_{uuid.uuid4().hex[:8]}"
    producer = subprocess.Popen([sys.executable, "-m", "kdg", "produce", topic, "-g", "exactly-once", "--count",
                                 "4000", "--rate", "1000", "--json"], env=_env(conn), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        report = as_json(kdg("consume", topic, "-G", f"g-{topic}", "-g", "exactly-once", "--table", table,
                             "--dedup-retention", "1s", "-c", "4000", "--idle-timeout", "60", "--json"))
    finally:
        out, err = producer.communicate(timeout=60)
    assert producer.returncode == 0, err
    assert (report["consumed"], report["processed"], report["dedup_window"]) == (4000, 4000, "1s"), report
    assert report["claim_partitions_dropped"] >= 3, report  # maintenance ran, under the consumer, several times
    audit = audited(kdg, topic, "--table", table, "-G", f"g-{topic}")
    assert (audit["acked"], audit["rows"], audit["lost"], audit["duplicates"]) == (4000, 4000, 0, 0), audit
    with Store(conn.pg_dsn) as store:
        kept = store.fetchval("SELECT count(*) FROM kdg_dedup WHERE sink_table = $1", f"public.{table}")
    assert kept < 4000, kept  # the claims older than the window are gone: the state is bounded

    # a replay of that range would read records whose claims are gone: refused before Spark starts
    refused = kdg("spark-replay", topic, "--table", table, "-G", f"r-{topic}", check=False)
    assert refused.returncode == 2 and "reaches back past" in refused.stderr, refused.stderr
    assert "--beyond-dedup-window" in refused.stderr
    with Store(conn.pg_dsn) as store:
        assert store.fetchval("SELECT count(*) FROM kdg_replays WHERE topic = $1", topic) == 0


def test_a_duplicate_is_dropped_inside_the_window_and_written_outside_it(kdg, conn, topic, tmp_path):
    """The same kdg-ids produced twice: 5 minted now (their first claim kept), 5 minted an hour ago (dropped)."""
    table = f"bw_{uuid.uuid4().hex[:8]}"
    make = Uuid7Maker()
    hour_ago = _uuid7_at(make(), time.time_ns() // 1_000_000 - 3_600_000)
    ids = [make() for _ in range(5)] + [hour_ago(i) for i in range(5)]
    envelopes = tmp_path / "twice.jsonl"
    envelopes.write_text("".join(json.dumps({"value": f"v{i}", "headers": [{"name": "kdg-id", "value": k}]}) + "\n"
                                 for i, k in enumerate(ids)))
    consume = ("consume", topic, "-G", f"g-{topic}", "-g", "exactly-once", "--table", table, "-e", "--json")
    kdg("produce", topic, "-g", "exactly-once", "--format", "json", "-f", envelopes)
    first = as_json(kdg(*consume, "--dedup-retention", "10m"))
    assert (first["consumed"], first["processed"], first["outside_dedup_window"]) == (10, 10, 0), first
    typo = kdg("db", "maintain", "--table", f"{table}_typo", "--dedup-retention", "1d", check=False)
    assert typo.returncode == 2 and "no claims kept" in typo.stderr, typo.stderr  # and no claim table made for it
    for _ in range(20):  # another worker's `db maintain` (test_identity maintains every window) may hold it
        maintained = as_json(kdg("db", "maintain", "--json"))  # drops the hour-old partition of the table's claims
        mine = next(w for w in maintained["windows"] if w["sink_table"] == f"public.{table}")
        if not mine["skipped"]:
            break
        time.sleep(0.5)
    assert f"public.{table}_typo" not in {w["sink_table"] for w in maintained["windows"]}
    # dropped now, or a moment before by that other worker: either way the horizon moved, and the second
    # consume below shows the hour-old claims are gone
    assert mine["horizon_ms"] is not None, mine  # a fresh table: its window has a horizon once a partition went
    kdg("produce", topic, "-g", "exactly-once", "--format", "json", "-f", envelopes)
    second = as_json(kdg(*consume))
    # inside the window: recognised and dropped; outside it: written again, and the report says so
    assert (second["consumed"], second["duplicates_suppressed"], second["outside_dedup_window"]) == (10, 5, 5), second
    audit = audited(kdg, topic, "--table", table, "-G", f"g-{topic}")
    assert (audit["rows"], audit["duplicates"], audit["duplicates_beyond_dedup_window"], audit["lost"]) == \
        (15, 0, 5, 0), audit
    assert sorted(audit["examples"]["duplicated_beyond_dedup_window"]) == sorted(ids[5:]), audit["examples"]


def test_claims_dropped_outside_kdg_are_forgotten_said_and_made_again(kdg, conn, topic):
    """Someone drops, by hand, the partition holding today's claims of one table and the whole claim table of
    another. Before, every exactly-once write of the first failed ("no partition of relation … found for row")
    until someone repaired kdg_window_parts, and `kdg db maintain` failed on every window (42P01). Now what is
    gone is forgotten, said, and made again: by maintenance, by a writer as it starts, and by a running one.
    In a database of its own, so that no other test's `kdg db maintain` forgets what this one dropped."""
    part_of, whole = "part_of", "whole"
    with fresh_database(conn.pg_dsn, f"kdg_{uuid.uuid4().hex[:10]}") as dsn:
        env = {"KDG_PG_DSN": dsn}
        args = ("-g", "exactly-once", "--dedup-retention", "30d", "--json")  # partitions a day wide

        def run(*argv):
            return kdg(*argv, env=env)

        def consume(table):
            done = run("consume", topic, "-G", f"g-{table}", "--table", table, "-e", *args)
            return as_json(done), done.stderr

        def claims(store, table):
            return store.fetchval("SELECT count(*) FROM kdg_dedup WHERE sink_table = $1", f"public.{table}")

        def drop_todays_part(store):
            part = store.fetchval("SELECT p.part FROM kdg_window_parts p JOIN kdg_windows w USING (relation) "
                                  "WHERE w.sink_table = $1 AND lo_ms <= $2 AND $2 < hi_ms", f"public.{part_of}",
                                  time.time_ns() // 1_000_000)
            store.execute(f'DROP TABLE "{part}"')
            return part

        run("db", "migrate")
        run("produce", topic, "-g", "exactly-once", "--count", "20")
        assert [consume(t)[0]["processed"] for t in (part_of, whole)] == [20, 20]
        with Store(dsn) as store:
            gone = store.fetchval("SELECT relation FROM kdg_windows WHERE sink_table = $1", f"public.{whole}")
            store.execute(f'DROP TABLE "{gone}"')
            part = drop_todays_part(store)
        maintained = as_json(run("db", "maintain", "--json"))
        healed = {w["sink_table"]: w["healed"] for w in maintained["windows"] if w["healed"]}
        assert set(healed) == {f"public.{whole}", f"public.{part_of}"}, maintained
        assert f"claim table {gone} was dropped" in healed[f"public.{whole}"][0], healed
        assert [f"partition {part} was dropped" in note for note in healed[f"public.{part_of}"]] == [True], healed

        with Store(dsn) as store:  # made again, empty, by that pass: dropped again, for a writer to find
            part = drop_todays_part(store)
        run("produce", topic, "-g", "exactly-once", "--count", "20")
        for table in (part_of, whole):
            report, said = consume(table)
            assert (report["processed"], report["duplicates_suppressed"]) == (20, 0), report
            assert (f"warning: partition {part} was dropped outside kdg" in said) == (table == part_of), said
        with Store(dsn) as store:
            assert {t: claims(store, t) for t in (part_of, whole)} == {part_of: 20, whole: 20}  # the new ones
            assert store.fetchval("SELECT relation FROM kdg_windows WHERE sink_table = $1", f"public.{whole}") != gone

        def meet_while_writing(table, drop):
            """A writer of ``table`` that meets ``drop(store)`` while it runs: 10 records written, then the drop,
            then 10 more (on one connection: a pipeline's other one could meet the gap as it first reads the
            window, as above); its exit code, report and stderr."""
            with Store(dsn) as store:
                before = claims(store, table)
            writer = subprocess.Popen([sys.executable, "-m", "kdg", "consume", topic, "-G", f"g-{table}", "--table",
                                       table, *args, "-c", "20", "--idle-timeout", "60", "--pipeline-depth", "0"],
                                      env=_env(conn) | env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                run("produce", topic, "-g", "exactly-once", "--count", "10")
                with Store(dsn) as store:
                    deadline = time.monotonic() + 60
                    while claims(store, table) < before + 10 and time.monotonic() < deadline:
                        time.sleep(0.1)
                    dropped = drop(store)
                run("produce", topic, "-g", "exactly-once", "--count", "10")
                out, said = writer.communicate(timeout=90)
            finally:
                writer.kill()
            return writer.returncode, out, said, dropped

        code, out, said, part = meet_while_writing(part_of, drop_todays_part)
        assert code == 0, said
        report = json.loads(out)
        assert report["processed"] == 20 and report["fenced_batches"] >= 1, report  # a batch met it, and went again
        assert f"warning: partition {part} was dropped outside kdg" in said, said
        audit = audited(kdg, topic, "--table", part_of, "-G", f"g-{part_of}", env=env)
        assert (audit["acked"], audit["rows"], audit["lost"], audit["duplicates"]) == (60, 60, 0, 0), audit

        def drop_claim_table(store):
            relation = store.fetchval("SELECT relation FROM kdg_windows WHERE sink_table = $1", f"public.{whole}")
            store.execute(f'DROP TABLE "{relation}"')
            return relation

        assert consume(whole)[0]["processed"] == 20  # up to date, as part_of's writer was
        code, _, said, relation = meet_while_writing(whole, drop_claim_table)  # stops, and says why
        assert code == 6 and f"the claim table of public.{whole} ({relation}) was dropped outside kdg" in said, said


def test_a_table_consumed_halfway_before_partitioned_claims_is_finished_after(kdg, conn, stack, topic, tmp_path):
    """kdg as it was before migrations 003 and 004 consumes half of a topic into ``idt``; today's kdg
    migrates the database and finishes it. The old claims (spelling-keyed, one plain table; 10 of them
    claimed under ``public.idt`` too, as two spellings did) and ledger rows are converted, none lost."""
    n, table = 600, f"idt_{uuid.uuid4().hex[:8]}"
    old = _old_kdg(BEFORE_IDENTITY, stack, tmp_path)
    with fresh_database(stack.pg_dsn, f"kdg_{uuid.uuid4().hex[:10]}") as dsn:
        env = {"KDG_PG_DSN": dsn}
        old("db", "migrate", env=env)
        old("produce", topic, "-g", "exactly-once", "--count", n, "--json", env=env)
        first = as_json(old("consume", topic, "-G", f"a-{topic}", "-g", "exactly-once", "--table", table,
                            "-c", n // 2, "--batch-size", 100, "--json", env=env))
        assert first["consumed"] == n // 2
        # (the old schema: today's Store refuses it, so plain SQL)
        run_sql(dsn, f"""INSERT INTO kdg_dedup (sink_table, idempotency_key, topic, "partition", "offset")
                      SELECT 'public.{table}', idempotency_key, topic, "partition", "offset"
                      FROM kdg_dedup ORDER BY idempotency_key LIMIT 10""")
        assert kdg("consume", topic, "-G", "g", "-e", env=env, check=False).returncode == 3  # 'run kdg db migrate'
        assert as_json(kdg("db", "migrate", "--json", env=env))["applied"] == [
            "003_table_identity.sql", "004_bounded_state.sql", "005_state_home.sql", "006_ledger_ranges.sql",
            "007_claim_owner.sql", "008_filtered_claims.sql", "009_claim_key_bytes.sql", "010_claim_runs.sql"]
        rest = as_json(kdg("consume", topic, "-G", f"a-{topic}", "-g", "exactly-once", "--table", table, "-e",
                           "--json", env=env))
        assert (rest["consumed"], rest["duplicates_suppressed"]) == (n // 2, 0), rest
        audit = audited(kdg, topic, "--table", table, "-G", f"a-{topic}", env=env)
        assert (audit["acked"], audit["rows"], audit["lost"], audit["duplicates"]) == (n, n, 0, 0), audit
        # every claim survived the move: a second group reading it all into another spelling adds nothing
        again = as_json(kdg("consume", topic, "-G", f"b-{topic}", "-g", "exactly-once", "--table",
                            f"public.{table}", "-e", "--json", env=env))
        assert (again["consumed"], again["duplicates_suppressed"]) == (n, n), again
        with Store(dsn) as store:
            claims = store.fetch("SELECT sink_table, count(*) AS n FROM kdg_dedup GROUP BY 1")
        assert [(r["sink_table"], r["n"]) for r in claims] == [(f"public.{table}", n)], claims


def test_shortening_a_retention_cuts_the_wide_partitions_made_before(kdg, conn):
    """Claims and ledger rows kept a day, in day-wide partitions, are then kept 10 minutes: maintenance cuts
    the open day at the end of today's 75-second slot (else it would outlive the window by up to a day) and
    moves the rows past the cut (a producer's clock two hours ahead) into partitions of today's width,
    losing none. A writer that read the window before the cut writes past it."""
    with fresh_database(conn.pg_dsn, f"kdg_{uuid.uuid4().hex[:10]}") as dsn:
        env = {"KDG_PG_DSN": dsn}
        kdg("db", "migrate", env=env)
        make, now = Uuid7Maker(), time.time_ns() // 1_000_000
        ahead, further = (_uuid7_at(make(), now + h * 3_600_000) for h in (2, 1))
        with Store(dsn) as writer:
            table = writer.ensure_sink_table("app.t")
            writer.write_claimed(table, "g", [(k, "tp", 0, i, None, b"v", "{}")
                                              for i, k in enumerate([make(), ahead(0)])])
            writer.execute("SELECT kdg_window_part('kdg_ledger', $1)", now)
            writer.execute("INSERT INTO kdg_ledger (run_id, idempotency_key, topic, seq, status) "
                           "VALUES (gen_random_uuid(), 'k', 'tp', 0, 'acked')")
            maintained = as_json(kdg("db", "maintain", "--table", "app.t", "--dedup-retention", "10m",
                                     "--ledger-retention", "10m", "--json", env=env))
            assert all(w["narrowed"] >= 1 and not w["skipped"] for w in maintained["windows"]), maintained
            # today's day-wide partition of each relation, cut (its width alone would not tell it from a
            # 75-second one in the first 75 seconds of a day)
            day = now - now % 86_400_000
            cut = writer.fetch("SELECT relation, hi_ms AS hi FROM kdg_window_parts WHERE lo_ms = $1", day)
            assert len(cut) == 2 and all(now < r["hi"] <= now + 2 * 75_000 for r in cut), (now, cut)
            # every partition's bounds, as Postgres routes rows, are those kdg_window_parts says
            bounds = writer.fetch("""
                SELECT p.part, pg_get_expr(c.relpartbound, c.oid) AS routed,
                       format('FOR VALUES FROM (%L) TO (%L)', VARIADIC CASE w.time_column WHEN 'key_ms'
                           THEN ARRAY[p.lo_ms::text, p.hi_ms::text]
                           ELSE ARRAY[to_timestamp(p.lo_ms / 1000.0)::text, to_timestamp(p.hi_ms / 1000.0)::text] END)
                           AS kept
                FROM kdg_window_parts p JOIN kdg_windows w USING (relation) JOIN pg_class c ON c.oid = p.part::regclass""")
            assert len(bounds) >= 4 and all(r["routed"] == r["kept"] for r in bounds), bounds
            # the writer's window is the day-wide one it read: a key an hour ahead needs a partition made now
            assert writer.write_claimed(table, "g", [(further(0), "tp", 0, 2, None, b"v", "{}")]) == 1
            claims = writer.fetchval("SELECT array_agg(key_ms ORDER BY key_ms) FROM kdg_dedup")
            assert claims[0] <= now + 1000 and claims[1:] == [now + 3_600_000, now + 7_200_000], (now, claims)
            assert writer.fetchval("SELECT count(*) FROM kdg_ledger") == 1


def _uuid7_at(template: str, ms: int):
    """UUIDv7s like ``template`` but carrying the time ``ms``, the i-th differing in its last digits."""
    t = f"{ms:012x}"
    return lambda i: f"{t[:8]}-{t[8:]}-{template[14:32]}{i:04x}"


def _env(conn) -> dict:
    return {**{k: v for k, v in os.environ.items() if k != "KDG_FAULT"}, "KDG_BOOTSTRAP_SERVERS":
            conn.bootstrap_servers, "KDG_PG_DSN": conn.pg_dsn}


def _old_kdg(commit: str, stack, state: Path):
    """Run kdg as it was at ``commit`` (its ``kdg/`` from git, beside today's dependencies)."""
    where = Path(f"/tmp/kdg-old-{commit}")
    if not (where / "kdg").is_dir():
        try:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "kdg"], capture_output=True,
                                     check=True).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            pytest.fail(f"the migration test needs kdg's git history (commit {commit}) to run the old code: {exc}")
        partial = where.with_name(f"{where.name}.{os.getpid()}")
        tarfile.open(fileobj=BytesIO(archive)).extractall(partial, filter="data")
        partial.rename(where)  # whole or not at all: a run stopped half-way leaves no half tree behind

    # its state dir is not the stack's: today's stack.json may hold settings the old StackLayout does not know
    def run(*args, env: dict | None = None):
        full = {**os.environ, "PYTHONPATH": str(where), "KDG_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
                "KDG_PG_DSN": stack.pg_dsn, "KDG_STATE_DIR": str(state), **(env or {})}
        full.pop("KDG_FAULT", None)
        proc = subprocess.run([sys.executable, "-m", "kdg", *map(str, args)], capture_output=True, text=True,
                              env=full, cwd=where, timeout=300)
        assert proc.returncode == 0, f"old kdg {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}"
        return proc

    return run
