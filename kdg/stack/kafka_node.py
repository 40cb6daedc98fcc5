"""One KRaft node of the local cluster (broker and controller in one JVM): configure, format, start, stop."""

import base64
import os
import shlex
import subprocess
import time
import uuid
from pathlib import Path

from kdg.errors import StackError, UsageError
from kdg.stack import procs
from kdg.stack.jars import java_classpath, require_java
from kdg.stack.layout import HOST, StackLayout

MAIN_CLASS = "kafka.Kafka"
HEAP = "-Xmx512m"
JAVA_OPTIONS_ENV = "KDG_KAFKA_JAVA_OPTIONS"  # more options for the stack's brokers' JVMs

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.controller.name = org.apache.kafka.controller
logger.controller.level = info
"""


def config_path(layout: StackLayout, node: int) -> Path:
    return layout.node_dir(node) / "server.properties"


def pidfile(layout: StackLayout, node: int) -> Path:
    return layout.node_dir(node) / "kafka.pid"


def server_log(layout: StackLayout, node: int) -> Path:
    return layout.node_dir(node) / "server.log"


def render_config(layout: StackLayout, node: int) -> str:
    """``server.properties`` for ``node``: combined broker+controller, topic defaults for durability."""
    rf, isr = layout.replication_factor, layout.min_insync_replicas
    voters = ",".join(f"{n}@{HOST}:{layout.controller_port(n)}" for n in layout.node_ids)
    settings = {
        "node.id": node,
        "process.roles": "broker,controller",
        "listeners": f"PLAINTEXT://{HOST}:{layout.client_port(node)},CONTROLLER://{HOST}:{layout.controller_port(node)},"
                     f"FAULTY://{HOST}:{layout.faulty_port(node)}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{layout.client_port(node)},"
                                f"FAULTY://{HOST}:{layout.proxy_port(node)}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,FAULTY:PLAINTEXT",
        "controller.quorum.voters": voters,
        "log.dirs": layout.node_dir(node) / "data",
        "num.partitions": 3,
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "unclean.leader.election.enable": "false",
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": 10,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": 10,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "group.initial.rebalance.delay.ms": 0,
        "auto.create.topics.enable": "false",
        "log.retention.hours": 168,
        "log.segment.bytes": 64 * 1024 * 1024,
    }
    if layout.secure:
        from kdg.stack.secure import broker_settings

        settings.update(broker_settings(layout, node, HOST))
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def new_cluster_id() -> str:
    """A random KRaft cluster id. Like Kafka's own Uuid.randomUuid, never one starting with '-':
    the storage tool would read it as an option (1 draw in 64 did, failing `kdg stack up`)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _java_cmd(layout: StackLayout, node: int, main: str, *args: str) -> list[str]:
    log4j = layout.node_dir(node) / "log4j2.properties"
    return [require_java(), HEAP, "-XX:+UseG1GC", "-Djava.awt.headless=true", *_java_options(),
            f"-Dlog4j2.configurationFile={log4j}", f"-Dkdg.node={config_path(layout, node)}",
            "-cp", java_classpath(), main, *args]


def _java_options() -> list[str]:
    try:
        return shlex.split(os.environ.get(JAVA_OPTIONS_ENV, ""))
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"{JAVA_OPTIONS_ENV}: {exc}") from None


def prepare(layout: StackLayout, node: int, cluster_id: str) -> None:
    """Write the node's configuration and format its storage once."""
    ndir = layout.node_dir(node)
    (ndir / "data").mkdir(parents=True, exist_ok=True)
    config_path(layout, node).write_text(render_config(layout, node))
    (ndir / "log4j2.properties").write_text(LOG4J2.format(log=server_log(layout, node)))
    if (ndir / "data" / "meta.properties").exists():
        return
    cmd = _java_cmd(layout, node, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                    "-c", str(config_path(layout, node)), "--ignore-formatted")
    if layout.secure:  # the SCRAM users go into the first metadata: they exist when the brokers start
        from kdg.stack.secure import scram_format_args

        cmd += scram_format_args(layout)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        from kdg.stack.secure import hide_passwords

        raise StackError(hide_passwords(layout, f"formatting broker {node}'s storage failed:\n{proc.stdout}{proc.stderr}"))


def is_running(layout: StackLayout, node: int) -> bool:
    return procs.pid_matches(procs.read_pid(pidfile(layout, node)), str(config_path(layout, node)))


def pid(layout: StackLayout, node: int) -> int | None:
    return procs.read_pid(pidfile(layout, node)) if is_running(layout, node) else None


def start(layout: StackLayout, node: int) -> int:
    """Start ``node`` unless it runs already; return its pid."""
    if (p := pid(layout, node)) is not None:
        return p
    ports = [layout.client_port(node), layout.controller_port(node), layout.faulty_port(node)]
    for port in ports + ([layout.internal_port(node)] if layout.secure else []):
        if not procs.port_free(HOST, port):
            raise StackError(f"port {port} for broker {node} is taken by another process "
                             f"(choose other ports with --broker-port)")
    cmd = _java_cmd(layout, node, MAIN_CLASS, str(config_path(layout, node)))
    p = procs.start_detached(cmd, log=layout.node_dir(node) / "stdout.log", pidfile=pidfile(layout, node))
    # Just after exec the kernel may still show an empty /proc/<pid>/cmdline, which is_running reads.
    deadline = time.monotonic() + 10
    while not is_running(layout, node) and procs.process_state(p) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.01)
    return p


def wait_listening(layout: StackLayout, node: int, timeout: float = 240.0) -> None:
    """Wait for the client port. After a SIGKILL a broker first recovers its logs, which takes a while."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procs.port_open(HOST, layout.client_port(node)):
            return
        if not is_running(layout, node):
            raise StackError(f"broker {node} exited while starting; last lines of {server_log(layout, node)}:\n"
                             f"{procs.tail(server_log(layout, node))}\n"
                             f"{procs.tail(layout.node_dir(node) / 'stdout.log', 10)}")
        time.sleep(0.2)
    raise StackError(f"broker {node} did not listen on port {layout.client_port(node)} within {timeout:.0f}s "
                     f"(still running: pid {pid(layout, node)}); last lines of {server_log(layout, node)}:\n"
                     f"{procs.tail(server_log(layout, node))}")


def stop(layout: StackLayout, node: int, *, hard: bool = False) -> bool:
    """Stop ``node`` (SIGTERM, or SIGKILL when ``hard``); False if it was not running."""
    p = pid(layout, node)
    if p is None:
        return False
    procs.stop_pid(p, hard=hard, timeout=60)
    return True


def stop_all(layout: StackLayout, nodes: list[int]) -> list[int]:
    """Stop ``nodes`` together (SIGTERM to each, then wait): the quorum stays up while they shut down,
    so none waits out the timeout alone. Returns the nodes that were running."""
    running = {node: p for node in nodes if (p := pid(layout, node)) is not None}
    procs.stop_pids(list(running.values()), timeout=60)
    return list(running)


def signal(layout: StackLayout, node: int, sig: int) -> bool:
    """Send ``sig`` (e.g. SIGSTOP / SIGCONT for a pause) to ``node``; False if it is not running."""
    p = pid(layout, node)
    if p is None:
        return False
    os.kill(p, sig)
    return True
