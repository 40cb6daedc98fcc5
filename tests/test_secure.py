"""The secure stack (`kdg stack up --secure`): everything over SASL_SSL with SCRAM users and ACLs.

This module starts its OWN stack through kdg's code (ports 23092.. and 23032 unless
``KDG_TEST_SECURE_BROKER_PORT`` / ``KDG_TEST_SECURE_PG_PORT`` say otherwise) and purges it at the
end. Commands run the real `kdg` CLI with only ``KDG_STATE_DIR`` pointing at the stack: no
``-b``, no ``-F``, so they also prove that the stack's client.properties is the default profile.
Every command's stdout and stderr is checked for the client password, and so are the logs.
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from kdg.errors import KdgError
from kdg.profile import read_profile
from kdg.stack import cluster, secure
from kdg.stack.layout import StackLayout

# below Linux's ephemeral range (32768-60999): a client socket of another worker's test cannot hold them
BROKER_PORT = int(os.environ.get("KDG_TEST_SECURE_BROKER_PORT", "23092"))
PG_PORT = int(os.environ.get("KDG_TEST_SECURE_PG_PORT", "23032"))
FAST_FAIL_S = 8  # about 1.2 s on a quiet machine; a refused login waited for list_topics' 10 s would fail


@pytest.fixture(scope="module")
def secure_stack():
    state = Path(tempfile.mkdtemp(prefix="kdg-test-secure-"))
    layout = StackLayout(state_dir=state, brokers=3, broker_port=BROKER_PORT, pg_port=PG_PORT, secure=True)
    try:
        cluster.up(layout, echo=lambda *a: None)
    except KdgError as exc:
        cluster.down(layout, purge=True)
        shutil.rmtree(state, ignore_errors=True)
        pytest.fail(f"could not start the secure test stack: {exc}", pytrace=False)
    yield layout
    cluster.down(layout, purge=True)
    shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def passwords(secure_stack) -> list[str]:
    return [read_profile(secure.profile_of(secure_stack, user))["sasl.password"] for user in secure.USERS]


@pytest.fixture(scope="module")
def skdg(secure_stack, passwords):
    """The real `kdg` against the secure stack; no output of any run may hold a password."""

    def run(*args, check: bool = True, env: dict | None = None, timeout: float = 600):
        inherited = {k: v for k, v in os.environ.items()
                     if k not in ("KDG_FAULT", "KDG_BOOTSTRAP_SERVERS", "KDG_KAFKA_CONFIG", "KDG_PG_DSN")}
        full_env = {**inherited, "KDG_STATE_DIR": str(secure_stack.state_dir), **(env or {})}
        proc = subprocess.run([sys.executable, "-m", "kdg", *map(str, args)], capture_output=True, text=True,
                              env=full_env, timeout=timeout)
        for pw in passwords:
            assert pw not in proc.stdout + proc.stderr, f"kdg {args[0]} printed a password"
        if check and proc.returncode != 0:
            raise AssertionError(f"kdg {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    return run


def _audit(skdg, *args) -> dict:
    proc = skdg("audit", *args, "--json", check=False)
    assert proc.returncode in (0, 7), proc.stderr
    return json.loads(proc.stdout)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _one_error_line(proc, exit_code: int = 5) -> str:
    """The run ended in exactly one ``error:`` line (its last), the expected exit code and no traceback."""
    assert proc.returncode == exit_code, (proc.returncode, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    return errors[0]


def test_security_failures_become_one_kdg_error_each():
    from confluent_kafka import KafkaError

    from kdg.errors import AccessDenied, AuthenticationFailed
    from kdg.kafka.access import check

    login = KafkaError(KafkaError._AUTHENTICATION, "sasl_ssl://127.0.0.1:1/bootstrap: SASL authentication error: "
                       "Authentication failed (after 316ms in state AUTH_REQ)")
    with pytest.raises(AuthenticationFailed, match=r"^Kafka refused the SASL login: SASL authentication error: "
                                                   r"Authentication failed \(check sasl.username"):
        check(login)
    with pytest.raises(AuthenticationFailed, match="TLS handshake"):
        check(KafkaError(KafkaError._SSL, "sasl_ssl://h:1/1: SSL handshake failed: certificate verify failed"))
    with pytest.raises(AccessDenied, match="denied creating topic 't'.*GROUP_AUTHORIZATION_FAILED"):
        check(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED), "creating topic 't'")
    assert check(KafkaError(KafkaError._TRANSPORT, "connection refused")) is None  # not a security failure


def test_client_properties_is_private_and_status_names_it(secure_stack, skdg):
    status = json.loads(skdg("stack", "status", "--json").stdout)
    assert status["secure"] is True and status["healthy"] is True
    path = Path(status["client_properties"])
    assert path == secure_stack.state_dir / "client.properties"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    props = read_profile(path)
    assert {k: props[k] for k in ("security.protocol", "sasl.mechanism", "sasl.username")} == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "kdg"}
    assert Path(props["ssl.ca.location"]).is_file()


@pytest.mark.parametrize("guarantee", ["at-most-once", "at-least-once", "exactly-once"])
def test_each_guarantee_round_trips_over_sasl_ssl_into_postgres_and_kafka(skdg, guarantee):
    topic, into_pg, into_kafka = _name("sec"), _name("g-pg"), _name("g-k")
    produced = json.loads(skdg("produce", topic, "-g", guarantee, "--count", 500, "--json").stdout)
    assert (produced["sent"], produced["failed"]) == (500, 0)
    skdg("consume", topic, "-G", into_pg, "-g", guarantee, "-e", "--json")
    skdg("consume", topic, "-G", into_kafka, "-g", guarantee, "-e", "--sink", f"kafka:{topic}-out", "--json")
    for audit in (_audit(skdg, topic, "-G", into_pg), _audit(skdg, topic, "--sink", f"kafka:{topic}-out")):
        assert audit["balanced"] and (audit["acked"], audit["lost"], audit["duplicates"]) == (500, 0, 0), audit


@pytest.mark.parametrize("guarantee, point, lost, duplicates", [
    ("at-most-once", "after-commit-before-process", 300, 0),    # committed, never written: the batch is lost
    ("at-least-once", "after-process-before-commit", 0, 300),   # written, never committed: written again
    ("exactly-once", "after-process-before-commit", 0, 0),      # rows and offsets in one transaction
])
def test_a_killed_consumer_over_sasl_ssl_does_what_its_guarantee_says(skdg, guarantee, point, lost, duplicates):
    """One kill point per guarantee, each where that guarantee's anomaly shows (one batch of 300)."""
    topic, group = _name("sec-crash"), _name("g-crash")
    skdg("produce", topic, "-g", guarantee, "--count", 1500, "--json")
    args = ["consume", topic, "-G", group, "-g", guarantee, "--batch-size", 300, "-e", "--json",
            "--transactional-id", f"tx-{group}"]
    crashed = skdg(*args, env={"KDG_FAULT": f"{point}@2"}, check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    skdg(*args)
    audit = _audit(skdg, topic, "-G", group)
    assert (audit["acked"], audit["lost"], audit["duplicates"]) == (1500, lost, duplicates), audit


def test_spark_replay_exactly_once_over_sasl_ssl(skdg):
    topic, table = _name("sec-spark"), f"replay_{uuid.uuid4().hex[:8]}"
    skdg("produce", topic, "-g", "exactly-once", "--count", 600, "--json")
    report = json.loads(skdg("spark-replay", topic, "-G", _name("g-spark"), "-g", "exactly-once", "--table", table,
                             "--json").stdout)
    assert (report["rows_read"], report["rows_written"]) == (600, 600), report
    audit = _audit(skdg, topic, "--table", table)
    assert audit["balanced"] and audit["duplicates"] == 0, audit


def test_doctor_checks_the_handshake_and_the_users_rights(skdg):
    topic, group = _name("sec-doctor"), _name("g-doctor")
    skdg("produce", topic, "-g", "exactly-once", "--count", 1, "--json")
    report = json.loads(skdg("doctor", "--topic", topic, "--group", group, "--json").stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"], checks
    handshake = checks["tls/sasl handshake"]["detail"]
    assert "TLS verified" in handshake and "SCRAM-SHA-512 login as 'kdg'" in handshake
    assert "wrote 1 record" in checks[f"write, read, commit ({topic}, {group})"]["detail"]
    # its probe record (no kdg-id) is stepped over: exactly-once neither stops on it nor writes it
    table = f"doctor_{uuid.uuid4().hex[:8]}"
    out = json.loads(skdg("consume", topic, "-G", group, "-g", "exactly-once", "--table", table, "-e",
                          "--json").stdout)
    assert (out["consumed"], out["processed"], out["probes_skipped"]) == (2, 1, 1), out
    audit = _audit(skdg, topic, "--table", table, "-G", group)
    assert (audit["rows"], audit["lost"], audit["duplicates"], audit["unexpected"]) == (1, 0, 0, 0), audit


def test_the_user_without_acls_is_denied_in_one_line(secure_stack, skdg):
    denied = secure.profile_of(secure_stack, secure.DENIED)
    topic = _name("sec-denied")
    skdg("produce", topic, "--count", 5, "--json")
    for argv in (["produce", topic, "--count", 5], ["consume", topic, "-G", "g-denied", "-e"], ["audit", topic]):
        line = _one_error_line(skdg(*argv, "-F", denied, check=False))
        assert "access denied" in line and "AUTHORIZATION_FAILED" in line, line
    doctor = skdg("doctor", "--topic", topic, "--group", "g-denied", "-F", denied, "--json", check=False)
    assert doctor.returncode == 7
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["tls/sasl handshake"]["ok"]  # the login works: it is authorization that says no
    assert "access denied" in checks[f"write, read, commit ({topic}, g-denied)"]["detail"]


def _variant(secure_stack, tmp_path, **changes) -> Path:
    props = read_profile(secure_stack.client_profile) | changes
    path = tmp_path / "variant.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


@pytest.mark.parametrize("change, argv", [
    ({"sasl.password": "not-the-password"}, ["produce", "sec-login", "--count", 5]),
    ({"sasl.username": "nobody"}, ["consume", "sec-login", "-G", "g", "-e"]),
])
def test_a_refused_login_fails_fast_in_one_line(secure_stack, skdg, tmp_path, change, argv):
    path = _variant(secure_stack, tmp_path, **change)
    started = time.monotonic()
    proc = skdg(*argv, "-F", path, check=False)
    assert time.monotonic() - started < FAST_FAIL_S
    assert "SASL login" in _one_error_line(proc)
    assert "not-the-password" not in proc.stdout + proc.stderr


def test_a_certificate_from_another_ca_fails_fast_in_one_line(secure_stack, skdg, tmp_path):
    other_ca = tmp_path / "other-ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", tmp_path / "k.pem",
                    "-out", other_ca, "-days", "1", "-subj", "/CN=not the stack's CA"], check=True, capture_output=True)
    path = _variant(secure_stack, tmp_path, **{"ssl.ca.location": other_ca})
    started = time.monotonic()
    proc = skdg("produce", _name("sec-ca"), "--count", 5, "-F", path, check=False)
    assert time.monotonic() - started < FAST_FAIL_S
    line = _one_error_line(proc)
    assert "TLS handshake" in line and "certificate verify failed" in line, line


def test_spark_replay_refuses_a_login_it_cannot_translate(secure_stack, skdg, tmp_path):
    path = _variant(secure_stack, tmp_path, **{"sasl.mechanism": "OAUTHBEARER"})
    line = _one_error_line(skdg("spark-replay", "any", "-G", "g", "-F", path, check=False), exit_code=2)
    assert "sasl.mechanism" in line


def test_zz_no_log_of_the_stack_holds_a_password(secure_stack, passwords):
    """Broker logs, Postgres's, Spark's (its configuration dump included): none holds a password."""
    logs = [p for p in secure_stack.state_dir.rglob("*") if p.is_file() and p.suffix in (".log", ".out", ".txt")]
    assert any(p.name.startswith("spark-") for p in logs), "the Spark replay left no log to check"
    assert any(p.name == "server.log" for p in logs)
    for path in logs:
        text = path.read_text(errors="replace")
        for pw in passwords:
            assert pw not in text, f"{path} holds a password"


def test_chaos_cells_run_on_the_secure_stack(secure_stack):
    """The fault proxy terminates TLS on both sides, so ack-loss really drops acknowledgements over SASL_SSL:
    at-least-once shows the duplicates, exactly-once none. (A consumer killed over SASL_SSL is above.)"""
    from kdg.chaos.run import run_cell

    cells = {g: run_cell(secure_stack, g, "ack-loss", 1, 300, "postgres") for g in ("at-least-once", "exactly-once")}
    for guarantee, ack in cells.items():
        assert ack.verdict == "PASS" and ack.fault_fired, ack  # fault_fired: proxy.dropped > 0
        assert any("produce responses dropped" in e["event"] for e in ack.timeline), ack.timeline
        assert not any("not injected" in e["event"] for e in ack.timeline)
    assert (cells["at-least-once"].lost, cells["exactly-once"].lost, cells["exactly-once"].duplicates) == (0, 0, 0)
    assert cells["at-least-once"].duplicates > 0
