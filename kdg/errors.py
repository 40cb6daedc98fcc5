"""The one error family of kdg.

Library code raises a :class:`KdgError` subclass with a readable message; the CLI catches it at
the edge, prints the message and exits with ``exit_code``. Anything else keeps its traceback.
"""


class KdgError(Exception):
    """Base of every error kdg expects and explains."""

    exit_code = 1


class UsageError(KdgError):
    """The user's input (an option, a property, a file) is not acceptable."""

    exit_code = 2


class UnknownTopic(UsageError):
    """A topic the command reads does not exist."""


class PolicyViolation(UsageError):
    """An override would weaken the chosen delivery guarantee."""


class StaleClaims(UsageError):
    """A table's exactly-once claims were made for an older table of its name (`kdg db forget` deletes them)."""


class SchemaIncompatible(UsageError):
    """A record's schema gives a field a type its column cannot take and kdg will not alter it to (not a
    widening); the user alters the table, and the route resumes at that batch."""


class MissingComponent(KdgError):
    """A program kdg needs (Java, Maven, a jar, Postgres binaries) is not installed."""

    exit_code = 3


class SchemaMissing(MissingComponent):
    """The database has not got every kdg migration applied (`kdg db migrate` applies them)."""


class StackError(KdgError):
    """The local stack could not be started, stopped or inspected."""

    exit_code = 4


class ConnectionFailed(KdgError):
    """Kafka or Postgres could not be reached."""

    exit_code = 5
    retriable = True  # a server not up yet may come up: start-up waits for it (kdg.lifecycle.wait_until_up)


class AuthenticationFailed(ConnectionFailed):
    """Kafka refused our SASL login (user, password, mechanism), TLS refused its certificate or ours, or
    Postgres refused our role or password."""

    retriable = False


class AccessDenied(ConnectionFailed):
    """An ACL denies the configured user an operation on a topic, group, transactional id or the cluster."""

    retriable = False


class DeliveryError(KdgError):
    """Kafka refused or failed a produce, consume or transaction in a way kdg cannot recover from."""

    exit_code = 6


class PostgresRefused(DeliveryError):
    """Postgres refused a statement kdg sent (a constraint, a permission, a type), not a connection problem."""


class Interrupted(KdgError):
    """A signal stopped a command with an end before it got there (cleanly: the report says how far it got)."""

    def __init__(self, message: str, signum: int | None = None):
        super().__init__(message)
        self.exit_code = 128 + (signum or 2)  # 130 for SIGINT, 143 for SIGTERM, as shells report them


class CheckFailed(KdgError):
    """A health check or audit found a problem (the report was already shown)."""

    exit_code = 7


# -- control flow: expected outcomes the loop handles, never shown to the user as failures -----
class Fenced(DeliveryError):
    """A newer consumer owns these partitions now; this writer is a zombie and its batch was rolled back."""


class ProducerFatal(DeliveryError):
    """The producer client hit a fatal error: it can send nothing more. ``renewable``: a new client with the
    same transactional.id recovers (librdkafka gave up on its own sequence bookkeeping, e.g. after timed-out
    requests); not when another producer took the id over (fenced) or access was refused."""

    def __init__(self, message: str, renewable: bool = False, fenced: bool = False, hung: bool = False):
        super().__init__(message)
        self.renewable = renewable
        self.hung = hung  # a call that never returned: the client is left as it is, a new one takes over
        self.fenced = fenced  # the epoch moved on: another producer took the id, or librdkafka bumped it itself


class TransactionAborted(DeliveryError):
    """Kafka made us abort the open transaction (``txn_requires_abort``); its records must be sent again."""


class RetryBatch(DeliveryError):
    """The batch's transaction was aborted; it must be read again from its first offsets."""


class KeylessRecord(UsageError):
    """A record with no idempotency key reached an exactly-once write."""
