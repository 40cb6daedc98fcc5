"""Checks of a command's options, shared by the Python API (:mod:`kdg.api`) and the command line.

Each raises :class:`~kdg.errors.UsageError` naming the command-line option, so a refusal reads the same from
``kdg consume`` and from ``kdg.consume(...)``. Nothing here reaches a server or imports a client library.
"""

from kdg.errors import UsageError

MAX_BATCH = 1_000_000  # confluent-kafka's consume() takes at most this many messages a call


def check_min(*checks: tuple[str, "int | float | None", int]) -> None:
    """Each ``(option, value, minimum)``: a value below its minimum is a usage error naming the option."""
    for option, value, minimum in checks:
        if value is not None and value != value:  # NaN: below nothing, above nothing
            raise UsageError(f"{option} nan: not a number")
        if value is not None and value < minimum:
            raise UsageError(f"{option} {value:g}: must be at least {minimum}")


def check_lifecycle(shutdown_timeout: float, wait_timeout: float, metrics_port: int | None) -> None:
    """The options every long-running command shares: its stop deadline, its start-up wait, its metrics port."""
    check_min(("--shutdown-timeout", shutdown_timeout, 0), ("--wait-timeout", wait_timeout, 0),
              ("--metrics-port", metrics_port, 0))
    if metrics_port is not None and metrics_port > 65535:
        raise UsageError(f"--metrics-port {metrics_port}: a TCP port is at most 65535")
    if shutdown_timeout == float("inf"):
        raise UsageError("--shutdown-timeout inf: give a number of seconds, past which a stop is forced")


def checked_formats(value_format: str | None, key_format: str | None, typed, where: str) -> str:
    """The value format, checked: a schema'd one needs something that reads values (a mapping, ``where``)."""
    from kdg.schemas import check_format

    value_format = check_format(value_format or (typed.value_format if typed is not None else "json"))
    check_format(key_format or "json", "--key-format")
    if key_format not in (None, "json") and typed is None:
        raise UsageError(f"--key-format {key_format}: only a typed sink reads keys (key:FIELD columns)")
    if value_format not in ("json", "raw") and typed is None and where:
        raise UsageError(f"--value-format {value_format}: {where}")
    return value_format


def sink_table(table: str | None) -> str:
    """``--table`` as given, checked (an empty one is refused: an unset variable must not mean kdg's own
    table), or kdg's own ``kdg_events`` when none was given."""
    from kdg.settings import table_name

    return table_name("kdg_events" if table is None else table).text
