"""The ack-loss fault proxy against the real test stack: forwarding, the lost ack, and its fix.

A dropped produce response means the broker wrote the batch and the producer never heard so.
Without idempotence the producer's retry writes the batch again (a duplicate, nothing lost);
the idempotent producer's retry carries the same producer id and sequence, and the broker drops it.

librdkafka times out a produce request in flight after ``socket.timeout.ms`` (capped by what
is left of ``message.timeout.ms``); ``request.timeout.ms`` is only the broker-side wait for
replicas. So ``socket.timeout.ms`` is what makes a lost ack surface within a test's patience.
"""

import socket
import threading
import time

import pytest
from conftest import as_json, audited

from kdg.chaos.proxy import FaultProxy

# every test here binds the stack's fault-proxy ports, which one test at a time can hold: on the fault stack, alone
pytestmark = pytest.mark.disrupts_stack
from kdg.stack.layout import HOST

N = 2000
# Short client-side timeouts: a swallowed response times out in ~3 s, well inside the
# exactly-once producer's transaction timeout (30 s), so its retry stays in the same transaction.
LOST_ACK_TIMEOUTS = ["-X", "request.timeout.ms=2000", "-X", "socket.timeout.ms=3000"]


def _produce_through(kdg, stack, topic, guarantee, *extra):
    return as_json(kdg("produce", topic, "-g", guarantee, "-b", stack.proxy_bootstrap, "--count", N, "--size", 50,
                       "--json", *extra))


def _consume_and_audit(kdg, topic, group):
    # at-least-once: no consumer-side dedup, so every copy in the topic reaches the sink
    kdg("consume", topic, "-G", group, "-g", "at-least-once", "-e", "--json")
    return audited(kdg, topic)


def test_round_trip_through_the_proxy_without_a_fault(kdg, stack, topic, group):
    with FaultProxy(stack) as proxy:
        produced = _produce_through(kdg, stack, topic, "at-least-once")
        kdg("consume", topic, "-G", group, "-g", "at-least-once", "-e", "-b", stack.proxy_bootstrap, "--json")
        assert proxy.accepted > 0 and proxy.dropped == 0  # the clients really went through it
    assert produced["acked"] == N
    audit = audited(kdg, topic)
    assert (audit["processed_unique"], audit["lost"], audit["duplicates"]) == (N, 0, 0), audit


@pytest.mark.parametrize("disconnect", [False, True], ids=["silent", "disconnect"])
def test_lost_ack_duplicates_without_idempotence(kdg, stack, topic, group, disconnect):
    """Silence (the producer times the request out) and a reset (the connection drops) both make it retry."""
    with FaultProxy(stack) as proxy:
        proxy.drop_produce_responses(2, disconnect=disconnect)
        produced = _produce_through(kdg, stack, topic, "at-least-once", *LOST_ACK_TIMEOUTS)
    assert proxy.dropped > 0
    assert produced["acked"] == N  # every record acknowledged in the end, so each lost ack was retried
    audit = _consume_and_audit(kdg, topic, group)
    assert audit["duplicates"] > 0, audit
    assert (audit["lost"], audit["processed_unique"]) == (0, N), audit


def test_idempotent_producer_survives_lost_acks(kdg, stack, topic, group):
    with FaultProxy(stack) as proxy:
        proxy.drop_produce_responses(2)
        produced = _produce_through(kdg, stack, topic, "exactly-once", *LOST_ACK_TIMEOUTS)
    assert proxy.dropped > 0
    # acked although responses were swallowed: the retries went out, inside the same transaction
    # (an abort and re-send would prove nothing about idempotence)
    assert (produced["acked"], produced["aborted_transactions"]) == (N, 0), produced
    audit = _consume_and_audit(kdg, topic, group)
    assert (audit["duplicates"], audit["lost"], audit["processed_unique"]) == (0, 0, N), audit


def test_pass_through_stops_dropping(kdg, stack, topic):
    with FaultProxy(stack) as proxy:
        proxy.drop_produce_responses(1000)
        proxy.pass_through()
        produced = _produce_through(kdg, stack, topic, "at-least-once", "--no-ledger", *LOST_ACK_TIMEOUTS)
    assert proxy.dropped == 0 and produced["acked"] == N


def test_stop_closes_every_socket_and_thread(stack):
    before = {t for t in threading.enumerate() if t.name == "kdg-fault-proxy"}
    proxy = FaultProxy(stack).start()
    client = socket.create_connection((HOST, stack.proxy_port(1)), timeout=5)
    deadline = time.monotonic() + 5
    while proxy.accepted == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proxy.accepted == 1
    proxy.stop()
    proxy.stop()  # a second stop is harmless
    assert client.recv(1) == b""  # the proxy closed its end of the open connection
    client.close()
    assert {t for t in threading.enumerate() if t.name == "kdg-fault-proxy"} == before
    for node in stack.node_ids:  # every port is free again
        socket.create_server((HOST, stack.proxy_port(node))).close()
    with FaultProxy(stack):  # and a new proxy can take them
        pass
