"""librdkafka's own log lines, through Python ``logging`` under the ``kdg.kafka`` logger.

By default a warning becomes one concise line on stderr, and a line that only differs from an
earlier one by a broker address or a number (a broker refusing connections every second) is
shown once a minute with how often it repeated. ``kdg -v`` shows every line librdkafka logs.
"""

import logging
import re
import sys
import time

LOGGER = logging.getLogger("kdg.kafka")
REPEAT_WINDOW_S = 60.0
_THREAD = re.compile(r"^\[thrd:[^\]]*\]:\s*")
_VARYING = re.compile(r"\d+(\.\d+)*|#\S+|\[thrd:[^\]]*\]")


def client_log_config() -> dict:
    """The properties that route a new client's logs to ``kdg.kafka`` at the level it is set to."""
    verbose = LOGGER.isEnabledFor(logging.DEBUG)
    return {"logger": LOGGER, "log_level": 7 if verbose else 4}


class CollapseRepeats(logging.Filter):
    """Lets the first of a family of similar lines through, then one a minute with a repeat count."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        family = _VARYING.sub("#", _text(record))
        now = time.monotonic()
        shown_at, hidden = self._seen.get(family, (-REPEAT_WINDOW_S, 0))
        if now - shown_at < REPEAT_WINDOW_S:
            self._seen[family] = (shown_at, hidden + 1)
            return False
        self._seen[family] = (now, 0)
        record.kdg_repeats = hidden
        return True


class ConciseFormatter(logging.Formatter):
    """``kafka: FAIL: 127.0.0.1:19092/1: Connect … failed: Connection refused``."""

    def format(self, record: logging.LogRecord) -> str:
        repeats = getattr(record, "kdg_repeats", 0)
        return f"kafka: {_text(record)}" + (f" (and {repeats} similar lines since)" if repeats else "")


def _text(record: logging.LogRecord) -> str:
    args = record.args
    if isinstance(args, tuple) and len(args) == 3:  # confluent-kafka logs ("%s [%s] %s", fac, client, text)
        facility, _client, text = args
        return f"{facility}: {_THREAD.sub('', str(text))}"
    return record.getMessage()


def configure(verbose: bool = False, stream=None) -> None:
    """Install the one handler of ``kdg.kafka`` (the CLI calls this once, before any client exists)."""
    LOGGER.handlers.clear()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("kafka: %(message)s") if verbose else ConciseFormatter())
    if not verbose:
        handler.addFilter(CollapseRepeats())
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.DEBUG if verbose else logging.WARNING)
    LOGGER.propagate = False
