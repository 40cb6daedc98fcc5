"""The local stack as a whole: ``up``, ``status``, ``down``, and single-node faults for experiments."""

import subprocess
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from kdg.errors import StackError, UsageError
from kdg.stack import kafka_node, postgres, procs, registry, spark_cluster
from kdg.stack.jars import ensure_kafka_jars, java_classpath, kafka_version, require_java
from kdg.stack.layout import DEFAULT_REGISTRY_PORT, HOST, StackLayout


@dataclass
class NodeStatus:
    node_id: int
    port: int
    pid: int | None
    up: bool
    controller: bool = False


@dataclass
class PostgresStatus:
    dsn: str
    embedded: bool
    pid: int | None
    up: bool


@dataclass
class StackStatus:
    state_dir: str
    kafka_version: str
    bootstrap_servers: str
    brokers: list[NodeStatus] = field(default_factory=list)
    postgres: PostgresStatus | None = None
    quorum_leader: int | None = None
    secure: bool = False
    client_properties: str | None = None  # a secure stack's client profile (librdkafka names), mode 0600
    spark: spark_cluster.SparkStatus | None = None  # only for a stack started with --spark-workers
    schema_registry: registry.RegistryStatus | None = None  # only for a stack started with --schema-registry

    @property
    def healthy(self) -> bool:
        return (all(b.up for b in self.brokers) and bool(self.postgres and self.postgres.up)
                and (self.spark is None or self.spark.healthy)
                and (self.schema_registry is None or self.schema_registry.up))

    def to_dict(self) -> dict:
        data = asdict(self) | {"healthy": self.healthy}
        for part in ("spark", "schema_registry"):
            if data[part] is None:
                del data[part]
        return data


def _cluster_id(layout: StackLayout) -> str:
    path = layout.state_dir / "cluster.id"
    if not path.exists():
        layout.state_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(kafka_node.new_cluster_id())
    return path.read_text().strip()


def resolve_layout(state_dir: Path, *, brokers: int | None = None, broker_port: int | None = None,
                   pg_port: int | None = None, pg_dsn: str | None = None, secure: bool | None = None,
                   schema_registry: bool | None = None, registry_port: int | None = None) -> StackLayout:
    """The stack in ``state_dir``: as saved there, with any given setting applied (a new stack otherwise).

    ``secure`` None keeps what the stack was made with; a formatted stack cannot change it.
    ``schema_registry`` True gives the stack a Schema Registry (on ``registry_port``, else the port it had, else
    18081), False takes it away, None keeps what the stack had; a ``registry_port`` alone also gives it one.
    """
    saved = StackLayout.load(state_dir)
    base = saved or StackLayout(state_dir=state_dir)
    formatted = saved is not None and (state_dir / "cluster.id").exists()
    if formatted and brokers is not None and brokers != saved.brokers:
        raise StackError(f"the stack in {state_dir} was made with {saved.brokers} broker(s); "
                         f"`kdg stack down --purge` first to change it to {brokers}")
    if formatted and secure and not saved.secure:
        raise StackError(f"the stack in {state_dir} was made plaintext; `kdg stack down --purge` first to "
                         "make it --secure (or use another --state-dir)")
    layout = StackLayout(
        state_dir=state_dir,
        brokers=brokers if brokers is not None else base.brokers,
        broker_port=broker_port if broker_port is not None else base.broker_port,
        pg_port=pg_port if pg_port is not None else base.pg_port,
        external_pg_dsn=pg_dsn if pg_dsn is not None else base.external_pg_dsn,
        secure=base.secure if secure is None or formatted else secure,
        registry_port=_registry_port(base, schema_registry, registry_port),
    )
    if layout.external_pg_dsn == replace(layout, external_pg_dsn=None).pg_dsn:
        # the embedded server's own DSN, as `stack up` saved it when it still read KDG_PG_DSN: embedded
        return replace(layout, external_pg_dsn=None)
    return layout


def _registry_port(base: StackLayout, wanted: bool | None, port: int | None) -> int | None:
    if wanted is False:
        return None
    if wanted is None and port is None and base.registry_port is None:
        return None
    return port or base.registry_port or DEFAULT_REGISTRY_PORT


def up(layout: StackLayout, echo=print, *, spark_workers: int | None = None) -> StackStatus:
    """Start every part of the stack that is not running; idempotent.

    ``spark_workers``: a Spark master and that many workers too (0 stops them; None keeps what the stack had).
    A layout with a ``registry_port`` gets its Schema Registry started too (built once); one without, stopped.
    """
    if not 1 <= layout.brokers <= 9:
        raise UsageError(f"--brokers {layout.brokers}: must be between 1 and 9")
    spark_cluster.check_workers(spark_workers)
    require_java()
    ensure_kafka_jars(echo)
    if layout.registry_port is not None:
        registry.ensure_built(echo)
    layout.save()
    if layout.secure:
        from kdg.stack import secure

        secure.prepare(layout)
    cluster_id = _cluster_id(layout)
    for node in layout.node_ids:
        kafka_node.prepare(layout, node, cluster_id)
    started = []
    for node in layout.node_ids:
        if not kafka_node.is_running(layout, node):
            kafka_node.start(layout, node)
            started.append(node)
    if layout.uses_embedded_pg:
        postgres.start(layout)
    registry.up(layout, echo)  # starts while the brokers do; waited for below
    for node in started:
        kafka_node.wait_listening(layout, node)
    from kdg.store.migrations import apply_migrations  # asyncpg is only needed once the stack runs
    apply_migrations(layout.pg_dsn)
    wait_cluster_ready(layout)
    if layout.secure:
        secure.grant_client_acls(layout)
    spark_cluster.up(layout, spark_workers, echo)
    registry.wait_ready(layout)
    return status(layout)


def wait_cluster_ready(layout: StackLayout, timeout: float = 90.0) -> None:
    """Wait until every running broker is registered and the cluster can host a replicated topic."""
    from kdg.kafka.admin import wait_brokers_registered

    running = [n for n in layout.node_ids if kafka_node.is_running(layout, n)]
    wait_brokers_registered(layout.bootstrap_servers, set(running), timeout=timeout,
                            props=layout.admin_properties())


def start_node(layout: StackLayout, node: int) -> None:
    """(Re)start one broker and wait until it listens (used by ``up`` and fault experiments)."""
    kafka_node.start(layout, node)
    kafka_node.wait_listening(layout, node)


def kill_node(layout: StackLayout, node: int, *, hard: bool = True) -> bool:
    """Stop broker ``node``; True if it was running. A node this stack does not have is a usage error."""
    if node not in layout.node_ids:
        raise UsageError(f"broker {node}: this stack's brokers are {', '.join(map(str, layout.node_ids))}")
    return kafka_node.stop(layout, node, hard=hard)


def quorum_leader(layout: StackLayout) -> int | None:
    """The KRaft controller quorum's leader, asked of the controllers with Kafka's own tool."""
    cmd = [require_java(), "-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp", java_classpath(),
           "org.apache.kafka.tools.MetadataQuorumCommand", "--bootstrap-controller",
           layout.controller_bootstrap, "describe", "--status"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
    except subprocess.TimeoutExpired:
        return None
    for line in out.splitlines():
        if line.startswith("LeaderId:"):
            return int(line.split(":")[1])
    return None


def status(layout: StackLayout, *, with_quorum: bool = True) -> StackStatus:
    report = StackStatus(state_dir=str(layout.state_dir), kafka_version=kafka_version(),
                         bootstrap_servers=layout.bootstrap_servers, secure=layout.secure,
                         client_properties=str(layout.client_profile) if layout.secure else None)
    for node in layout.node_ids:
        pid = kafka_node.pid(layout, node)
        up_ = pid is not None and procs.port_open(HOST, layout.client_port(node))
        report.brokers.append(NodeStatus(node, layout.client_port(node), pid, up_))
    if with_quorum and any(b.up for b in report.brokers):
        report.quorum_leader = quorum_leader(layout)
        for b in report.brokers:
            b.controller = b.node_id == report.quorum_leader
    from kdg.settings import redact_dsn

    if layout.uses_embedded_pg:
        pid = postgres.pid(layout)
        report.postgres = PostgresStatus(redact_dsn(layout.pg_dsn), True, pid,
                                         pid is not None and procs.port_open(HOST, layout.pg_port))
    else:
        from kdg.store.migrations import can_connect

        report.postgres = PostgresStatus(redact_dsn(layout.pg_dsn), False, None, can_connect(layout.pg_dsn))
    report.spark = spark_cluster.status(layout)
    report.schema_registry = registry.status(layout)
    return report


def down(layout: StackLayout, *, purge: bool = False) -> dict:
    """Stop what ``up`` started (by the pids it recorded); ``purge`` also deletes the data."""
    stopped = {"brokers": [], "postgres": False}
    if spark := spark_cluster.down(layout):
        stopped["spark"] = spark
    if registry.stop(layout):  # by its pid file: also one a stack no longer configured was left running
        stopped["schema_registry"] = True
    stopped["brokers"] = kafka_node.stop_all(layout, layout.node_ids)
    if layout.uses_embedded_pg:
        stopped["postgres"] = postgres.stop(layout)
    if purge:
        import shutil

        for node in layout.node_ids:
            shutil.rmtree(layout.node_dir(node), ignore_errors=True)
        shutil.rmtree(layout.pg_dir, ignore_errors=True)
        shutil.rmtree(layout.secure_dir, ignore_errors=True)
        spark_cluster.purge(layout)
        registry.purge(layout)
        for name in ("cluster.id", "stack.json", "client.properties"):
            (layout.state_dir / name).unlink(missing_ok=True)
    return stopped
