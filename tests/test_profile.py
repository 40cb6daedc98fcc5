"""Kafka client profiles (-F FILE, KDG_KAFKA_CONFIG) and secret references: read, layered under -X, never shown."""

import json
from pathlib import Path

import pytest

from conftest import as_json
from kdg.errors import UsageError
from kdg.profile import merged_properties, read_profile, redact

SECRET = "s3cr3t-Pa55"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


# -- the file format and references (no Kafka needed) ---------------------------------------------
def test_a_profile_is_key_value_lines_with_comments(tmp_path):
    path = write(tmp_path, "p.properties", "# a comment\n\n  linger.ms = 7 \nclient.id=a=b\n   # indented comment\n")
    assert read_profile(path) == {"linger.ms": "7", "client.id": "a=b"}


@pytest.mark.parametrize("line, says", [("novalue", ":2: a line without '='"), ("=5", ":2: a line without a key")])
def test_a_malformed_line_is_refused_with_its_number(tmp_path, line, says):
    path = write(tmp_path, "p.properties", f"linger.ms=5\n{line}\n")
    with pytest.raises(UsageError, match=says):
        read_profile(path)


def test_references_take_the_environment_or_a_file_and_name_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("KDG_TEST_PW", SECRET)
    secret_file = write(tmp_path, "pw", SECRET + "\n")
    path = write(tmp_path, "p.properties", "sasl.password=${env:KDG_TEST_PW}\nssl.key.password=@" f"{secret_file}\n")
    assert read_profile(path) == {"sasl.password": SECRET, "ssl.key.password": SECRET}
    monkeypatch.delenv("KDG_TEST_PW")
    with pytest.raises(UsageError, match="KDG_TEST_PW, which is not set"):
        read_profile(path)
    with pytest.raises(UsageError, match="reads the file /nonexistent/pw"):
        merged_properties(None, {"sasl.password": "@/nonexistent/pw"})


def test_x_wins_over_the_file_and_kdg_kafka_config_names_the_default(tmp_path, monkeypatch):
    path = write(tmp_path, "p.properties", "linger.ms=50\nclient.id=from-file\n")
    monkeypatch.setenv("KDG_KAFKA_CONFIG", str(path))
    assert merged_properties(None, {"linger.ms": "5"}) == {"linger.ms": "5", "client.id": "from-file"}
    other = write(tmp_path, "q.properties", "client.id=from-F\n")
    assert merged_properties(other, {}) == {"client.id": "from-F"}  # -F wins over the variable


def test_redact_hides_every_secret_value_and_nothing_else():
    props = {"sasl.password": SECRET, "sasl.username": "orders", "ssl.key.password": "k3y"}
    assert redact(f"user orders with {SECRET} and k3y", props) == "user orders with *** and ***"


# -- the real command line against the test stack -------------------------------------------------
def test_a_profile_reaches_the_clients_and_x_overrides_it(kdg, topic, tmp_path):
    """A bad value in the file is refused by name (so the file was read); the same key in -X wins."""
    path = write(tmp_path, "p.properties", "linger.ms=abc\n")
    bad = kdg("produce", topic, "--count", "3", "-F", path, check=False)
    assert bad.returncode == 2 and "linger.ms=abc" in bad.stderr, bad.stderr
    fixed = kdg("produce", topic, "--count", "3", "-F", path, "-X", "linger.ms=5", "--json")
    assert as_json(fixed)["acked"] == 3
    via_env = kdg("produce", topic, "--count", "3", "--json", check=False, env={"KDG_KAFKA_CONFIG": str(path)})
    assert via_env.returncode == 2 and "linger.ms=abc" in via_env.stderr, via_env.stderr


@pytest.mark.parametrize("argv", [
    ("produce", "{topic}", "--count", "3", "--json"),
    ("consume", "{topic}", "-G", "g-profile", "-e", "--json"),
    ("audit", "{topic}", "--json"),
    ("doctor", "--json"),
])
def test_a_password_from_a_profile_is_never_printed(kdg, topic, tmp_path, argv):
    """SASL against the plaintext test listener fails; the error, --json and -v logs never hold the password."""
    secret_file = write(tmp_path, "pw", SECRET)
    path = write(tmp_path, "p.properties", "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                 f"sasl.username=orders\nsasl.password=@{secret_file}\n")
    args = [a.replace("{topic}", topic) for a in argv]
    for extra in ([], ["-v"]):
        proc = kdg(*extra, *args, "-F", path, check=False, timeout=120)
        output = proc.stdout + proc.stderr
        assert SECRET not in output, output
        assert "Traceback" not in output, output
        assert proc.returncode in (5, 7), (proc.returncode, output)  # unreachable, or doctor's failed checks
        if argv[0] == "doctor":
            checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
            assert not checks["tls/sasl handshake"]["ok"], checks  # the broker checks wait for a login


@pytest.mark.parametrize("lines, named", [
    ("security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\nsasl.kerberos.service.name=kafka\n", "sasl.kerberos.service.name"),
    ("security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n", "sasl.mechanism"),
    ("security.protocol=SSL\nssl.key.location=/k.pem\nssl.certificate.location=/c.pem\n", "ssl.certificate.location"),
])
def test_spark_replay_refuses_security_properties_it_cannot_translate(kdg, topic, tmp_path, lines, named):
    path = write(tmp_path, "p.properties", f"{lines}sasl.username=orders\nsasl.password={SECRET}\n")
    proc = kdg("spark-replay", topic, "-G", "g-profile", "-F", path, check=False)
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
