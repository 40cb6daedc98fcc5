"""`kdg doctor`: is everything kdg needs there, reachable and configured for exactly-once?"""

from dataclasses import dataclass, field
from pathlib import Path

from kdg.errors import KdgError
from kdg.settings import connection, local_layout, redact_dsn


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "checks": [c.__dict__ for c in self.checks]}


def _check(report: DoctorReport, name: str, fn) -> object:
    """Run ``fn`` → (ok, detail[, value]); an exception is a failed check with its message."""
    try:
        ok, detail, *value = fn()
    except (KdgError, Exception) as exc:  # noqa: BLE001 — doctor reports every failure, it never crashes
        report.checks.append(Check(name, False, str(exc).splitlines()[0]))
        return None
    report.checks.append(Check(name, ok, detail))
    return value[0] if value else ok


def _java():
    import subprocess

    from kdg.stack.jars import require_java

    java = require_java()
    line = subprocess.run([java, "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    return True, line


def _jars():
    from kdg.stack.jars import has_kafka_jars, kafka_lib_dir, kafka_version

    return has_kafka_jars(), f"Kafka {kafka_version()} in {kafka_lib_dir()}" if has_kafka_jars() else \
        "not fetched yet: `kdg stack fetch`"


def _spark():
    from kdg.spark.jars import pyspark_version, spark_lib_dir

    lib = spark_lib_dir()
    fetched = (lib / ".complete").exists()
    return fetched, f"PySpark {pyspark_version()}, Kafka connector in {lib}" if fetched else \
        f"PySpark {pyspark_version()}; its Kafka connector is not fetched yet: `kdg stack fetch`"


def _brokers(bootstrap: str, expected: int | None, props: dict[str, str]):
    from kdg.kafka.admin import broker_ids

    ids = broker_ids(bootstrap, props)
    ok = expected is None or len(ids) >= expected
    return ok, f"{len(ids)} broker(s) registered: {ids}" + ("" if ok else f", expected {expected}"), ids


def _quorum(layout):
    from kdg.stack.cluster import quorum_leader

    leader = quorum_leader(layout)
    return leader is not None, f"leader is node {leader}" if leader is not None else "no quorum leader answered"


def _eos_settings(bootstrap: str, broker_id: int, brokers: int, props: dict[str, str]):
    from kdg.kafka.admin import describe_broker_config

    names = ["transaction.state.log.replication.factor", "transaction.state.log.min.isr", "min.insync.replicas",
             "default.replication.factor", "unclean.leader.election.enable", "offsets.topic.replication.factor"]
    cfg = describe_broker_config(bootstrap, broker_id, names, props)
    want_rf, want_isr = min(3, brokers), (1 if brokers == 1 else 2)
    problems = []
    for name, minimum in (("transaction.state.log.replication.factor", want_rf),
                          ("transaction.state.log.min.isr", want_isr), ("min.insync.replicas", want_isr),
                          ("default.replication.factor", want_rf), ("offsets.topic.replication.factor", want_rf)):
        if int(cfg.get(name, 0)) < minimum:
            problems.append(f"{name}={cfg.get(name)} (want ≥{minimum})")
    if cfg.get("unclean.leader.election.enable", "false") != "false":
        problems.append("unclean.leader.election.enable=true (acknowledged writes can be lost)")
    shown = ", ".join(f"{k}={v}" for k, v in cfg.items())
    return not problems, "; ".join(problems) if problems else shown


def is_secured(props: dict[str, str]) -> bool:
    return props.get("security.protocol", "plaintext").lower() != "plaintext"


def _handshake(bootstrap: str, props: dict[str, str]):
    """TLS and SASL, as the profile asks: a metadata request only answers after both succeeded."""
    from kdg.kafka.admin import broker_ids

    broker_ids(bootstrap, props)
    protocol = props.get("security.protocol", "plaintext").upper()
    said = []
    if "SSL" in protocol:
        said.append(f"TLS verified the brokers' certificate ({'ssl.ca.location=' + props['ssl.ca.location'] if 'ssl.ca.location' in props else 'system CAs'})")
    if protocol.startswith("SASL"):
        said.append(f"SASL {props.get('sasl.mechanism', 'GSSAPI')} login as {props.get('sasl.username', '?')!r} accepted")
    return True, f"{protocol}: " + "; ".join(said)


def _permissions(bootstrap: str, props: dict[str, str], topic: str, group: str):
    from kdg.kafka.permissions import probe_permissions

    found = probe_permissions(bootstrap, props, topic, group)
    return True, "; ".join(found.values())


def _postgres(dsn: str, on_stack: bool):
    from kdg.errors import ConnectionFailed
    from kdg.store.migrations import schema_status

    try:
        status = schema_status(dsn)
    except ConnectionFailed as exc:
        if on_stack:
            raise ConnectionFailed(f"{exc}; the local stack's Postgres is not running: `kdg stack up`") from exc
        raise
    return True, f"reachable at {status.dsn}", status.pending


def run_doctor(bootstrap: str | None, pg_dsn: str | None, state_dir: Path | None,
               properties: list[str] | None = None, profile: Path | None = None,
               topic: str | None = None, group: str | None = None) -> DoctorReport:
    """Every check; with ``topic`` and ``group`` also whether the configured user may write, read and commit there."""
    report = DoctorReport()
    conn = connection(bootstrap, pg_dsn, properties, state_dir, profile=profile)
    local = bootstrap is None
    layout = local_layout(state_dir)
    _check(report, "java", _java)
    _check(report, "kafka jars", _jars)
    _check(report, "spark", _spark)
    reached = True
    if is_secured(conn.extra):
        reached = _check(report, "tls/sasl handshake", lambda: _handshake(conn.bootstrap_servers, conn.extra))
    ids = None
    if reached:  # a refused login would only fail the broker checks again, 10 s each
        ids = _check(report, "brokers", lambda: _brokers(conn.bootstrap_servers, layout.brokers if local else None,
                                                         conn.extra))
    if local:
        _check(report, "controller quorum", lambda: _quorum(layout))
    if ids:
        _check(report, "exactly-once settings", lambda: _eos_settings(conn.bootstrap_servers, ids[0], len(ids), conn.extra))
    if topic is not None and reached:
        _check(report, f"write, read, commit ({topic}, {group})",
               lambda: _permissions(conn.bootstrap_servers, conn.extra, topic, group))
    on_stack = conn.pg_dsn == layout.pg_dsn and layout.uses_embedded_pg
    pending = _check(report, "postgres", lambda: _postgres(conn.pg_dsn, on_stack))
    if pending is not None:  # the local stack's `up` migrates its own Postgres; any other needs `kdg db migrate`
        fix = "kdg stack up" if on_stack else f"kdg db migrate --pg-dsn '{redact_dsn(conn.pg_dsn)}'"
        report.checks.append(Check("schema migrated", not pending,
                                   "up to date" if not pending else f"pending: {', '.join(pending)}; run: {fix}"))
    return report
