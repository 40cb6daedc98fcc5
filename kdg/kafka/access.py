"""Who may connect and what they may do: SASL/TLS failures and ACL denials as kdg errors.

librdkafka retries a refused login or an unverifiable certificate forever, reporting each attempt
through the error callback; left alone, a command with a wrong password would wait out its own
timeouts. Every client kdg creates gets :func:`on_error` as its ``error_cb``, which turns the first
such report into :class:`~kdg.errors.AuthenticationFailed` (an ACL denial into
:class:`~kdg.errors.AccessDenied`), raised from the next ``poll``/``flush``/``consume``. Code that
sees a request fail without serving callbacks (``list_topics``) calls :func:`raise_queued` first,
so the error names the cause instead of "transport failure".
"""

import re

from confluent_kafka import KafkaError

from kdg.errors import AccessDenied, AuthenticationFailed

AUTHENTICATION = {KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError.SASL_AUTHENTICATION_FAILED}
DENIED = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
          KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED}
_DENIED_WHAT = {KafkaError.TOPIC_AUTHORIZATION_FAILED: "the topic",
                KafkaError.GROUP_AUTHORIZATION_FAILED: "the consumer group",
                KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "the transactional id",
                KafkaError.CLUSTER_AUTHORIZATION_FAILED: "the cluster"}
_BROKER_PREFIX = re.compile(r"^\S+://\S+?(/\S+)?: ")
_AFTER = re.compile(r"\s*\(after \d+ms in state \w+\)\s*$")


def on_error(err: KafkaError) -> None:
    """``error_cb`` of every kdg client: raise on a refused login, certificate or ACL; other errors are logged."""
    check(err)


class FatalWatch:
    """A client's ``error_cb`` that keeps what killed it: :func:`on_error`, and the fatal error heard, if any
    (``heard``). Once a client has died, librdkafka answers each call with a bare _FATAL, which names no cause;
    :meth:`cause` puts the heard one in its place. Holds nothing of the client's owner, so the owner, dropped, goes
    with its client at once (as :func:`~kdg.kafka.clients.weakly` arranges for bound methods)."""

    __slots__ = ("heard",)

    def __init__(self):
        self.heard: KafkaError | None = None

    def __call__(self, err: KafkaError) -> None:
        if err.fatal():
            self.heard = err
        on_error(err)

    def cause(self, err: KafkaError) -> KafkaError:
        """``err``, or for a bare _FATAL the fatal error heard before it (if any)."""
        return self.heard if err.code() == KafkaError._FATAL and self.heard is not None else err


def check(err: KafkaError, doing: str = "") -> None:
    """Raise the kdg error ``err`` stands for, if it is a security failure; return otherwise."""
    code = err.code()
    if code in AUTHENTICATION:
        raise AuthenticationFailed(_explain_login(err))
    if code in DENIED:
        target = f" {doing}" if doing else ""
        raise AccessDenied(f"access denied{target}: an ACL does not allow the configured user on "
                           f"{_DENIED_WHAT[code]} ({err.name()})")


def raise_queued(client) -> None:
    """Serve ``client``'s queued callbacks, so a refused login waiting there is raised now."""
    client.poll(0)


def _explain_login(err: KafkaError) -> str:
    text = _AFTER.sub("", _BROKER_PREFIX.sub("", err.str()))
    if err.code() == KafkaError._SSL or "SSL" in text:
        hint = "" if "ssl.ca.location" in text else " (is ssl.ca.location the cluster's CA?)"
        return f"TLS handshake with Kafka failed: {text}{hint}"
    return f"Kafka refused the SASL login: {text} (check sasl.username, sasl.password and sasl.mechanism)"
