"""The faults `kdg chaos run` injects — all real: signals to real processes, a real fault proxy.

Each injector drives one cell from the first record produced to the last one consumed; the
caller audits afterwards. An injector sets ``cell.result.fault_fired`` only when it saw the
fault take effect (a process died or stopped, a broker went down, a response was dropped).
"""

import signal
import time

from kdg.chaos.cell import Cell, finish, finish_all
from kdg.stack import cluster, kafka_node, postgres, procs

# pipelined-commit is reached only by exactly-once into Postgres (the one writer that overlaps batches)
CONSUMER_KILL_POINTS = ("after-poll-before-process", "after-process-before-commit", "after-commit-before-process",
                        "inside-pg-transaction", "pipelined-commit", "during-rebalance")


def _record_produce(cell: Cell, outcome: tuple) -> None:
    """Keep the producer's throughput; a producer that gave up goes on the timeline with its reason."""
    code, report, err = outcome
    cell.result.produce_msgs_per_s = report.get("msgs_per_s", 0.0)
    if code != 0:
        reason = err.strip().splitlines()[-1] if err.strip() else ""
        cell.event(f"producer exited {code}: {reason[:200]}")


def consumer_kill(cell: Cell) -> None:
    """SIGKILL the consumer at each named kill point in turn, restarting it each time."""
    _record_produce(cell, cell.produce())
    for point in CONSUMER_KILL_POINTS:
        nth = 1 if point in ("during-rebalance", "pipelined-commit") else 2
        # each run reads at most three batches, so records remain for every later kill point
        code, _, err = finish(cell.consume("-e", "-c", 3 * cell.batch, "-X", f"group.instance.id=chaos-{cell.group}",
                                           env={"KDG_FAULT": f"{point}@{nth}"}))
        if code == -signal.SIGKILL:
            cell.result.fault_fired = True
            cell.event(f"SIGKILL consumer at {point}")
        else:
            cell.event(f"consumer ended ({code}) before reaching {point}")


def consumer_pause(cell: Cell) -> None:
    """SIGSTOP a consumer mid-batch past its session timeout; a second member takes over; SIGCONT the zombie."""
    _record_produce(cell, cell.produce())
    point = "after-poll-before-process"  # a batch in hand, nothing of it written or committed
    zombie = cell.consume("--idle-timeout", 20, env={"KDG_FAULT": f"{point}@2:stop"})
    deadline = time.monotonic() + 60
    while procs.process_state(zombie.pid) != "T" and zombie.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if procs.process_state(zombie.pid) != "T":
        cell.event("consumer never reached its pause point")
        finish(zombie)
        return
    cell.result.fault_fired = True
    cell.event(f"SIGSTOP consumer at {point}")
    successor = cell.consume("--idle-timeout", 15)
    time.sleep(15)  # > session.timeout.ms: the group moves the paused member's partitions
    zombie.send_signal(signal.SIGCONT)
    cell.event("SIGCONT: the paused consumer resumes as a zombie")
    _, zreport, _ = finish(zombie)
    cell.event(f"zombie ended; batches refused after losing its partitions: {zreport.get('fenced_batches', '?')}")
    cell.result.zombie_refused_batches = zreport.get("fenced_batches", 0)
    finish(successor)


def _leader_of_partition_0(cell: Cell) -> int:
    from kdg.kafka.admin import describe_topic

    return describe_topic(cell.layout.bootstrap_servers, cell.topics[0], cell.conn.extra)["leaders"][0]


def _broker_down(cell: Cell, hard: bool) -> None:
    cell.ensure_topics(partitions=3)
    rate = max(200, cell.messages // 8)
    producer = cell.produce("--rate", rate, wait=False)
    consumer = cell.consume("--idle-timeout", 20)
    time.sleep(2)
    _bounce_leader(cell, hard)
    _record_produce(cell, finish_all(producer))
    finish(consumer)


def _bounce_leader(cell: Cell, hard: bool) -> None:
    """Stop partition 0's leader (of the first topic; SIGKILL or SIGTERM), start it again 5 s later; the timeline
    says both."""
    leader = _leader_of_partition_0(cell)
    if cluster.kill_node(cell.layout, leader, hard=hard):
        cell.result.fault_fired = True
        cell.event(f"{'SIGKILL' if hard else 'SIGTERM'} broker {leader} (leader of partition 0)")
    time.sleep(5)
    cluster.start_node(cell.layout, leader)
    cell.event(f"broker {leader} restarted")


def broker_kill(cell: Cell) -> None:
    """Hard bounce: SIGKILL the partition leader during produce and consume, restart it after 5 s."""
    _broker_down(cell, hard=True)


def broker_bounce(cell: Cell) -> None:
    """Clean bounce: SIGTERM the partition leader, restart it after 5 s."""
    _broker_down(cell, hard=False)


def postgres_restart(cell: Cell) -> None:
    """Kill and restart the embedded Postgres while a consumer holds a batch; it reconnects and reads on."""
    _record_produce(cell, cell.produce())
    if not cell.sink.startswith("postgres") or not cell.layout.uses_embedded_pg:
        cell.event("postgres-restart needs the postgres sink on the embedded server; skipped")
        return
    # the consumer stops itself with its 3rd batch polled, so the restart lands mid-consume
    consumer = cell.consume("--idle-timeout", 10, env={"KDG_FAULT": "after-poll-before-process@3:stop"})
    deadline = time.monotonic() + 60
    while procs.process_state(consumer.pid) != "T" and consumer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    postgres.restart(cell.layout, hard=True)
    cell.result.fault_fired = procs.process_state(consumer.pid) == "T"
    cell.event("Postgres SIGKILLed and restarted while the consumer held a batch")
    consumer.send_signal(signal.SIGCONT)
    code, _, err = finish(consumer)
    reason = err.strip().splitlines()[-1] if err.strip() else ""
    cell.event(f"consumer exited {code} {reason[:160]}")


def min_isr(cell: Cell) -> None:
    """Stop brokers until fewer than min.insync.replicas remain; show NotEnoughReplicas; restore."""
    from kdg.kafka.clients import probe_producer

    cell.ensure_topics(partitions=3)
    survivors = cell.layout.node_ids[:1]
    stopped = [n for n in cell.layout.node_ids if n not in survivors]
    for node in stopped:
        kafka_node.stop(cell.layout, node)
    cell.event(f"brokers {stopped} stopped cleanly; 1 of 3 replicas left, min.insync.replicas=2")
    # log_level 2: the stopped brokers refuse connections, which is the point, not news for the terminal
    probe = probe_producer(cell.layout.bootstrap_servers, acks="all", retries=0, **{"message.timeout.ms": 10_000},
                           **cell.conn.extra,
                           log_level=2)
    errors = []
    probe.produce(cell.topics[0], b"probe", on_delivery=lambda err, msg: errors.append(err))
    probe.flush(15)
    if errors and errors[0] is not None:
        cell.result.fault_fired = True
        cell.event(f"acks=all probe refused: {errors[0].name()}")
    producer = cell.produce("-X", "delivery.timeout.ms=60000", wait=False)
    time.sleep(8)
    for node in stopped:
        cluster.start_node(cell.layout, node)
    cell.event(f"brokers {stopped} restarted")
    _record_produce(cell, finish_all(producer))


def ack_loss(cell: Cell) -> None:
    """Drop the broker's responses to produce requests on the way back, through the fault proxy."""
    from kdg.chaos.proxy import FaultProxy

    cell.ensure_topics(partitions=3)
    with FaultProxy(cell.layout) as proxy:
        proxy.drop_produce_responses(3)
        cell.event("proxy drops the next 3 produce responses")
        _record_produce(cell, cell.produce("-b", cell.layout.proxy_bootstrap,
                                           "-X", "request.timeout.ms=2000", "-X", "socket.timeout.ms=3000"))
        if proxy.dropped:
            cell.result.fault_fired = True
            cell.event(f"{proxy.dropped} produce responses dropped; the producer timed out and retried")
        else:
            cell.event("no produce response was dropped (acks=0 has none to lose)")


INJECTORS = {
    "consumer-kill": consumer_kill,
    "consumer-pause": consumer_pause,
    "broker-kill": broker_kill,
    "broker-bounce": broker_bounce,
    "ack-loss": ack_loss,
    "postgres-restart": postgres_restart,
    "min-isr": min_isr,
}


# -- the spark engine: the same cells with `kdg spark-stream` as the pipeline ---------------------------
def _wait_for_rows(cell: Cell, stream, rows: int, timeout: float = 120) -> None:
    """Until a running stream has written ``rows`` rows of the cell's topic (or ended, or ``timeout``)."""
    from kdg.store.pg import Store

    deadline = time.monotonic() + timeout
    with Store(cell.layout.pg_dsn) as store:
        while time.monotonic() < deadline and stream.poll() is None and store.across_restart(lambda: store.fetchval(
                "SELECT count(*) FROM kdg_events WHERE topic = $1", cell.topic)) < rows:
            time.sleep(0.3)


def _stream_until(cell: Cell, stream, rows: int, timeout: float = 120) -> None:
    """Let a running stream write ``rows`` rows of the cell's topic (or time out), then stop it with SIGTERM."""
    try:
        _wait_for_rows(cell, stream, rows, timeout)
    finally:
        stream.send_signal(signal.SIGTERM)
        code, _, err = finish(stream)
        cell.event(f"stream stopped ({code}){': ' + err.strip().splitlines()[-1][:160] if code else ''}")


def spark_driver_kill(cell: Cell) -> None:
    """SIGKILL the stream's driver after its second micro-batch is written, before its positions are stored and
    Spark commits the batch; the drain restarts it from its checkpoint, which runs that batch again."""
    _record_produce(cell, cell.produce())
    code, _, _ = finish(cell.stream("--trigger", "available-now",
                                    env={"KDG_FAULT": "spark-stream-before-positions@2"}))
    if code == -signal.SIGKILL:
        cell.result.fault_fired = True
        cell.event("SIGKILL stream driver after writing micro-batch 2")
    else:
        cell.event(f"stream ended ({code}) before its second micro-batch")


def spark_executor_kill(cell: Cell) -> None:
    """SIGKILL the Python worker writing the first Spark partition after its first chunk committed; Spark retries
    the task (the guarantee allows it for both stream guarantees)."""
    _record_produce(cell, cell.produce())
    code, _, err = finish(cell.stream("--trigger", "available-now", "--chunk-rows", max(10, cell.batch // 4),
                                      env={"KDG_FAULT": "spark-task-mid-write"}))
    if "spark: task" in err and "failed" in err:
        cell.result.fault_fired = True
        cell.event("SIGKILL a Python worker mid-write; Spark retried its task")
    cell.event(f"stream ended ({code})")


def spark_broker_kill(cell: Cell) -> None:
    """SIGKILL the partition leader while records are produced and streamed; restart it after 5 s."""
    cell.ensure_topics(partitions=3)
    producer = cell.produce("--rate", max(200, cell.messages // 8), wait=False)
    stream = cell.stream("--trigger", "500ms")
    _wait_for_rows(cell, stream, cell.messages // 5)  # the stream is up (Spark takes ~20 s here) and writing
    _bounce_leader(cell, hard=True)
    _record_produce(cell, finish_all(producer))
    _stream_until(cell, stream, cell.messages)


def spark_postgres_restart(cell: Cell) -> None:
    """Kill and restart the embedded Postgres while the stream writes micro-batches; a batch that met it down
    waits for it and is written again."""
    _record_produce(cell, cell.produce())
    if not cell.layout.uses_embedded_pg:
        cell.event("spark-postgres-restart needs the embedded server; skipped")
        return
    stream = cell.stream("--trigger", "500ms", "--max-per-batch", max(20, cell.batch // 4))
    _wait_for_rows(cell, stream, cell.messages // 5)
    if stream.poll() is None:
        postgres.restart(cell.layout, hard=True)
        cell.result.fault_fired = True
        cell.event("Postgres SIGKILLed and restarted while the stream wrote")
    _stream_until(cell, stream, cell.messages)


SPARK_INJECTORS = {
    "spark-driver-kill": spark_driver_kill,
    "spark-executor-kill": spark_executor_kill,
    "spark-broker-kill": spark_broker_kill,
    "spark-postgres-restart": spark_postgres_restart,
}
