"""Under an orchestrator: SIGTERM and Ctrl-C stop cleanly, start-up waits for Postgres, metrics are served.

Every process is the real `kdg` command on the shared stack; signals are real signals.
"""

import json
import os
import random
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import as_json, audited
from pg_server import free_port, pause_external_postgres, resume_external_postgres, start_external_postgres, \
    stop_external_postgres
from kdg.chaos.proxy import FaultProxy
from kdg.kafka.admin import ensure_topic
from kdg.stack.cluster import java_classpath, require_java

HANDLERS = {"PYTHONPATH": str(Path(__file__).parent)}
SHUTDOWN_TIMEOUT_S = 30  # the default --shutdown-timeout, what orchestrators give


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _scrape(port: int) -> dict[str, float]:
    """``/metrics`` through Prometheus's own parser: {'name{label=value,…}': value}, summed over no label."""
    status, text = _get(port, "/metrics")
    assert status == 200, text
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "guarantee")
            found[f"{s.name}{{{labels}}}"] = s.value
    return found


def _total(found: dict[str, float], name: str) -> float:
    return sum(v for k, v in found.items() if k.startswith(name + "{"))


def _wait_for(check, what: str, proc: subprocess.Popen, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"kdg exited {proc.returncode} while waiting for {what}: {proc.stderr.read()}"
        try:
            got = check()
        except (urllib.error.URLError, ConnectionError):
            got = None  # the port is not served yet
        if got:
            return got
        time.sleep(0.3)
    proc.kill()
    raise AssertionError(f"no {what} within {timeout} s: {proc.communicate()[1][-2000:]}")


def _catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` (the kernel's SigCgt mask)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (sig - 1) & 1)


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> tuple[int, float, dict, str]:
    """Signal ``proc`` (None: it was signalled already) and wait: (exit code, seconds it took, its --json
    report, stderr)."""
    if sig is not None:
        proc.send_signal(sig)
    started = time.monotonic()
    try:
        out, err = proc.communicate(timeout=SHUTDOWN_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    took = time.monotonic() - started
    return proc.returncode, took, json.loads(out) if out.strip() else {}, err


@pytest.mark.parametrize("guarantee", ["at-most-once", "at-least-once", "exactly-once"])
def test_sigterm_under_a_backlog_commits_exactly_what_was_processed(kdg, kdg_spawn, topic, group, guarantee):
    """SIGTERM mid-backlog: exit 0 in time, and the next run reads on from exactly where it stopped.

    The slow handler (0.4 s a batch of 200) keeps a backlog. Stopped uncleanly, at-least-once would
    read some records twice (their batch done, its offsets not committed) and at-most-once would skip
    some (committed, not done): the two runs' counts add up to the topic's only after a clean stop.
    """
    total = 10_000
    kdg("produce", topic, "-g", "exactly-once", "--count", total)
    port = free_port()
    proc = kdg_spawn("consume", topic, "-G", group, "-g", guarantee, "--batch-size", 200, "--handler",
                     "slow_handler:slow", "--metrics-port", port, "--metrics-host", "127.0.0.1", "--json",
                     env=HANDLERS)
    _wait_for(lambda: _total(_scrape(port), "kdg_records_written_total") >= 1000, "1000 records written", proc)
    proc.send_signal(signal.SIGTERM)
    # not ready from the signal on, while the handler's batch still runs: not only once the loop next looks
    answers = [_get(port, "/readyz")]
    # the few ms the child's signal watcher takes; well inside the handler's 0.4 s, where the loop would look
    while answers[-1] == (200, "ready\n") and len(answers) < 10:
        time.sleep(0.01)
        answers.append(_get(port, "/readyz"))
    assert answers[-1] == (503, "stopping\n"), answers
    code, took, first, err = _stop(proc, None)
    assert code == 0, err
    assert took < SHUTDOWN_TIMEOUT_S, f"took {took:.1f} s to stop"
    assert first["stopped_by"] == "SIGTERM" and 1000 <= first["consumed"] < total, first
    rest = as_json(kdg("consume", topic, "-G", group, "-g", guarantee, "-e", "--json"))
    assert first["consumed"] + rest["consumed"] == total, (first, rest)  # nothing read twice, nothing skipped
    report = audited(kdg, topic, "-G", group)
    assert (report["acked"], report["lost"], report["duplicates"]) == (total, 0, 0), report


def test_metrics_move_and_lag_falls_to_zero(kdg, kdg_spawn, topic, group):
    """A real HTTP client scrapes a running consumer: health, readiness, counters per partition, histograms."""
    kdg("produce", topic, "-g", "exactly-once", "--count", 3000)
    port = free_port()
    proc = kdg_spawn("consume", topic, "-G", group, "-g", "exactly-once", "--metrics-port", port,
                     "--metrics-host", "127.0.0.1", "--json")
    settled = lambda n: (lambda: (m := _scrape(port)) and _total(m, "kdg_records_written_total") == n  # noqa: E731
                         and _total(m, "kdg_consumer_lag_records") == 0 and len(
                             [k for k in m if k.startswith("kdg_consumer_lag_records{")]) == 3 and m)
    first = _wait_for(settled(3000), "3000 written and no lag", proc)
    assert _get(port, "/healthz")[0] == 200 and _get(port, "/readyz") == (200, "ready\n")
    assert _total(first, "kdg_records_read_total") == 3000
    assert len([k for k in first if k.startswith("kdg_records_read_total{")]) == 3  # one series per partition
    assert first["kdg_ready{}"] == 1 and _total(first, "kdg_assigned_partitions") == 3
    for histogram in ("kdg_batch_records", "kdg_commit_duration_seconds", "kdg_end_to_end_latency_seconds"):
        assert _total(first, f"{histogram}_count") > 0, histogram
    kdg("produce", topic, "-g", "exactly-once", "--count", 2000)
    second = _wait_for(settled(5000), "5000 written and no lag", proc)
    assert _total(second, "kdg_batch_records_count") > _total(first, "kdg_batch_records_count")
    code, _, report, err = _stop(proc)
    assert code == 0 and report["consumed"] == 5000, err
    with pytest.raises(urllib.error.URLError):
        _get(port, "/healthz")  # the server went with the process


def test_a_member_left_without_partitions_is_not_ready(kdg, kdg_spawn, conn, group):
    """Two members of one group on a one-partition topic: the one holding nothing answers /readyz 503."""
    topic = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    ports = free_port(), free_port()
    members = [kdg_spawn("consume", topic, "-G", group, "-g", "at-least-once", "--metrics-port", port,
                         "--metrics-host", "127.0.0.1", "--json") for port in ports]
    gauge = f"kdg_assigned_partitions{{topic={topic}}}"  # set by each member's assignment, an empty one included

    def settled():
        found = [_scrape(p) for p in ports]
        return found if all(gauge in f for f in found) and sum(f[gauge] for f in found) == 1 else None

    found = _wait_for(settled, "both members assigned, the partition held by one", members[0])
    idle = next(i for i, f in enumerate(found) if f[gauge] == 0)
    assert _get(ports[idle], "/readyz") == (503, "no partitions assigned\n")
    assert _get(ports[1 - idle], "/readyz") == (200, "ready\n")
    for proc in members:
        assert _stop(proc)[0] == 0


def test_a_static_member_fenced_by_another_with_its_instance_id_stops_with_an_error(kdg_spawn, conn, group):
    """A second member started with the first's group.instance.id takes its place; librdkafka makes that fatal
    for the first and would leave it polling a dead client for ever. kdg's stops: exit 6, the reason said."""
    topic = f"t-{uuid.uuid4().hex[:10]}"
    ensure_topic(conn.bootstrap_servers, topic, partitions=1)
    port = free_port()
    args = ("consume", topic, "-G", group, "-g", "at-least-once", "-X", f"group.instance.id=m-{group}", "--json")
    first = kdg_spawn(*args, "--metrics-port", port, "--metrics-host", "127.0.0.1")
    gauge = f"kdg_assigned_partitions{{topic={topic}}}"
    _wait_for(lambda: _scrape(port).get(gauge) == 1, "the first member holding the partition", first)
    second = kdg_spawn(*args)
    try:
        code, _, _, err = _stop(first, sig=None)  # (it ends on its own, or the wait gives up and kills it)
        assert code == 6, err[-2000:]
        assert "fatal Kafka error" in err and "give each its own" in err and "Traceback" not in err, err[-2000:]
        assert second.poll() is None  # the member that took the id reads on
    finally:
        assert _stop(second)[0] == 0


def _transaction_states(bootstrap: str, prefix: str) -> dict[str, str]:
    """The coordinators' state of every transactional id starting with ``prefix``, from Kafka's own tool."""
    out = subprocess.run([require_java(), "-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp", java_classpath(),
                          "org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server", bootstrap, "list"],
                         capture_output=True, text=True, timeout=60)
    header, *rows = out.stdout.splitlines()
    found = [dict(zip(header.split(), row.split())) for row in rows]
    return {r["TransactionalId"]: r["TransactionState"] for r in found if r["TransactionalId"].startswith(prefix)}


def test_ctrl_c_during_an_exactly_once_produce_aborts_cleanly_every_time(stack, kdg_spawn, topic):
    """20 Ctrl-Cs at random moments, kdg's start-up included: exit 130, no client error, no transaction left open.

    The moments count from kdg's first handler (the top of ``kdg.cli``): before it, the signal meets the
    interpreter's start-up, where no program has a say (on a loaded machine that took over 0.5 s).
    Each run has its own transactional id, so no later run's fencing can close a transaction an
    earlier one left open: Kafka's own tool shows each one's state at the end. Every other run keeps one
    transaction open for a minute, so stops surely land inside one too: with kdg's 100 ms transactions
    alone, few stops found one to abort (0 to 3 of 20), and 3 runs of 7 had none.
    """
    prefix = f"kdg-lifecycle-{uuid.uuid4().hex[:8]}-"
    rng = random.Random(os.environ.get("KDG_TEST_SEED", "21"))
    aborted = 0
    for attempt in range(20):
        long_txn = ["--txn-size", 5_000_000, "--txn-interval-ms", 60_000] if attempt % 2 else []
        proc = kdg_spawn("produce", topic, "-g", "exactly-once", "--count", 5_000_000, "--transactional-id",
                         f"{prefix}{attempt}", "--json", *long_txn)
        _wait_for(lambda: _catches(proc.pid, signal.SIGTERM), "kdg's first signal handler", proc, timeout=60)
        time.sleep(rng.uniform(0.1, 3.6))
        code, _, report, err = _stop(proc, signal.SIGINT)
        assert code == 130, f"attempt {attempt}: exit {code}: {err}"
        for sign in ("SystemError", "INVALID_TXN_STATE", "Traceback", "fatal"):
            assert sign not in err, f"attempt {attempt}: {err}"
        aborted += bool(report.get("open_transaction_aborted"))
    states = _transaction_states(stack.bootstrap_servers, prefix)
    assert states and "Ongoing" not in states.values(), states
    assert aborted >= 3, aborted  # stops did land inside a transaction (the long ones: all but the early stops)


@pytest.mark.disrupts_stack  # binds the stack's fault-proxy ports: one such test at a time
def test_a_stop_while_a_client_call_hangs_still_ends_at_the_deadline(stack, kdg_spawn, topic):
    """Every produce response swallowed: the exactly-once producer's main thread waits inside librdkafka's
    commit_transaction (up to a minute), where no Python handler runs. SIGTERM is counted off the main
    thread, so the stop still ends at --shutdown-timeout: exit 143, and it says why (a crash, which the
    guarantee survives). Before, the stop waited for the call to return, and a call that hangs (librdkafka#5456)
    kept the process alive for good."""
    with FaultProxy(stack) as proxy:
        proc = kdg_spawn("produce", topic, "-g", "exactly-once", "--rate", 500, "-b", stack.proxy_bootstrap,
                         "--shutdown-timeout", 3, "--json")
        _wait_for(lambda: proxy.accepted > 0, "the producer's connections through the proxy", proc)
        time.sleep(2)
        proxy.drop_produce_responses(1_000_000)
        _wait_for(lambda: proxy.dropped > 0, "a swallowed produce response", proc)
        time.sleep(2)  # the open transaction's commit now waits for acknowledgements that never come
        code, took, _, err = _stop(proc)
    assert code == 143 and took < 15, (code, took, err[-2000:])
    assert "did not finish within --shutdown-timeout 3 s" in err, err[-2000:]


def test_a_consumer_started_before_its_postgres_waits_for_it(kdg, kdg_spawn, topic, group):
    """A consumer started 20 s before its Postgres waits (saying so), then reads the topic, 0/0."""
    dsn, base = start_external_postgres()
    try:
        pg = {"KDG_PG_DSN": dsn}
        kdg("db", "migrate", env=pg)
        kdg("produce", topic, "-g", "exactly-once", "--count", 2000, env=pg)
        pause_external_postgres(base)
        proc = kdg_spawn("consume", topic, "-G", group, "-g", "exactly-once", "-e", "--wait-timeout", 120, "--json",
                         env=pg)
        time.sleep(20)
        assert proc.poll() is None, proc.communicate()
        resume_external_postgres(base)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "waiting for Postgres" in err and "password" not in err.lower(), err
        assert json.loads(out)["consumed"] == 2000
        report = audited(kdg, topic, "-G", group, env=pg)
        assert (report["acked"], report["lost"], report["duplicates"]) == (2000, 0, 0), report
    finally:
        stop_external_postgres(base)


def test_a_producer_stopped_while_its_ledgers_postgres_is_away_says_what_is_unrecorded(kdg, kdg_spawn, topic):
    """Postgres goes away under a steady produce: sending pauses with the ledger, /readyz says why, and a
    SIGTERM ends the wait at once (before: a hang to the shutdown timeout, exit 143), with exit 5 and how
    many acknowledged records have no ledger rows."""
    dsn, base = start_external_postgres()
    try:
        pg = {"KDG_PG_DSN": dsn}
        kdg("db", "migrate", env=pg)
        port = free_port()
        proc = kdg_spawn("produce", topic, "--rate", 500, "--metrics-port", port, "--metrics-host", "127.0.0.1",
                         "--json", env=pg)
        _wait_for(lambda: _total(_scrape(port), "kdg_records_acked_total") >= 500, "500 records acked", proc)
        pause_external_postgres(base)
        _wait_for(lambda: (answer := _get(port, "/readyz"))[0] == 503 and "producer ledger" in answer[1],
                  "readiness to say the ledger waits", proc)
        code, took, _, err = _stop(proc)
        assert (code, took < 10) == (5, True), (code, took, err)
        assert "records Kafka acknowledged have no ledger rows" in err and "password" not in err.lower(), err
    finally:
        stop_external_postgres(base)


def test_kdg_frees_its_kafka_clients_before_python_ends(conn, topic, monkeypatch):
    """A client an error left behind (the producer in its traceback: it holds its owner through its callbacks, so
    only the cycle collector frees it) goes before ``main`` exits, not in the interpreter's finalisation, where
    librdkafka's threads calling into a half-gone Python ended 1 exit in 80 with SIGSEGV after the right error."""
    import gc

    from confluent_kafka import Producer

    from kdg.cli import main

    gc.collect()
    before = {id(o) for o in gc.get_objects() if isinstance(o, Producer)}
    monkeypatch.setattr("sys.argv", ["kdg", "produce", topic, "--count", "1", "--wait-timeout", "1"])
    monkeypatch.setenv("KDG_BOOTSTRAP_SERVERS", conn.bootstrap_servers)
    monkeypatch.setenv("KDG_PG_DSN", f"postgresql://kdg@127.0.0.1:{free_port()}/kdg")  # the ledger's: nobody there
    gc.disable()  # so that only main's own collection can free the producer
    try:
        with pytest.raises(SystemExit) as ended:
            main()
        left = [o for o in gc.get_objects() if isinstance(o, Producer) and id(o) not in before]
    finally:
        gc.enable()
    assert ended.value.code == 5  # cannot reach Postgres, after the producer was made
    assert left == []


def test_a_producer_let_go_is_destroyed_there_with_its_client(conn, topic):
    """As a library (a Spark task, a user's script): a KdgProducer that has sent and is dropped is destroyed at
    once, its confluent-kafka client with it, by reference counting alone; its client's callbacks do not hold it."""
    import gc
    import weakref

    from confluent_kafka import Producer

    from kdg.guarantees import policy_for
    from kdg.kafka.producer import KdgProducer

    gc.collect()
    before = {id(o) for o in gc.get_objects() if isinstance(o, Producer)}
    gc.disable()  # no cycle collection: only what reference counting frees goes
    try:
        producer = KdgProducer(policy_for("at-least-once"), conn.bootstrap_servers, every_report=False)
        producer.send(topic, b"one")
        producer.deliver(f"a record to {topic}", timeout=30)
        held = weakref.ref(producer)
        del producer
        left = [o for o in gc.get_objects() if isinstance(o, Producer) and id(o) not in before]
    finally:
        gc.enable()
    assert held() is None and left == []
