"""Named kill points for crash experiments: inert unless ``KDG_FAULT`` names one.

``KDG_FAULT=after-commit-before-process`` SIGKILLs the process the first time it reaches that
point; ``KDG_FAULT=after-commit-before-process@3`` the third time; ``…@3:stop`` SIGSTOPs it there
instead (a paused process: a zombie once its partitions move, when SIGCONT wakes it), ``…:term`` sends it
SIGTERM (an orchestrator's stop, at that exact moment). Tests and `kdg chaos` use it
to crash a consumer at an exact place in its loop, as a power cut would.
"""

import os
import signal
import threading

from kdg.errors import UsageError

KILL_POINTS = (
    "after-poll-before-process",
    "after-process-before-commit",
    "after-commit-before-process",
    "inside-pg-transaction",
    "pipelined-commit",        # a batch is about to commit while the next one is being written beside it
    "during-rebalance",
    "spark-task-mid-write",
    "spark-stream-before-positions",  # the driver: a micro-batch's rows written, its positions not stored yet
    "spark-stream-after-batch",       # the driver: a micro-batch written and accounted for, not yet in Spark's log
)
_ACTIONS = {"": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}

_hits: dict[str, int] = {}


def _armed() -> tuple[str, int, signal.Signals] | None:
    """The armed fault, or None; a ``KDG_FAULT`` that names no kill point is an error, not a silent no-op."""
    spec = os.environ.get("KDG_FAULT")
    if not spec:
        return None
    point, _, action = spec.partition(":")
    name, _, nth = point.partition("@")
    if name not in KILL_POINTS or not (nth or "1").isdigit() or int(nth or 1) < 1 or action not in _ACTIONS:
        raise UsageError(f"KDG_FAULT={spec!r}: use POINT[@N][:stop|:term] with POINT one of {', '.join(KILL_POINTS)}")
    return name, int(nth or 1), _ACTIONS[action]


def check() -> None:
    """Refuse a misspelled ``KDG_FAULT`` before any work starts."""
    _armed()


def reach(point: str) -> None:
    """Mark that the code reached ``point``; die (or pause) here if the fault is armed for it."""
    armed = _armed()
    if armed is None or armed[0] != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] == armed[1]:
        if armed[2] == signal.SIGTERM:  # an orchestrator's stop: to the process, handled on the main thread
            os.kill(os.getpid(), armed[2])
        else:  # to this thread, which then stops (or dies) before its next step. Sent to the process, the
            # signal wakes the main thread to act on it, and this thread (a connection's, say) can run on
            # meanwhile: it was seen to send the COMMIT it was stopped before
            signal.pthread_kill(threading.get_ident(), armed[2])
