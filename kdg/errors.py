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


class PolicyViolation(UsageError):
    """An override would weaken the chosen delivery guarantee."""


class MissingComponent(KdgError):
    """A program kdg needs (Java, Maven, a jar, Postgres binaries) is not installed."""

    exit_code = 3


class StackError(KdgError):
    """The local stack could not be started, stopped or inspected."""

    exit_code = 4


class ConnectionFailed(KdgError):
    """Kafka or Postgres could not be reached."""

    exit_code = 5


class DeliveryError(KdgError):
    """Kafka refused or failed a produce, consume or transaction in a way kdg cannot recover from."""

    exit_code = 6


class CheckFailed(KdgError):
    """A health check or audit found a problem (the report was already shown)."""

    exit_code = 7
