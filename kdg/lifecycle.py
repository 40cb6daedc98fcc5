"""How a long-running command lives under an orchestrator: a stop request as a flag, a deadline to
finish stopping, and a start-up that waits for Kafka and Postgres.

A signal never raises inside librdkafka or asyncpg: :class:`Shutdown`'s handler only sets a flag
(and notes which signal it was) that the command's loop reads between client calls. A second
signal, or a stop that outlives its deadline, ends the process at once, as a crash would; every
guarantee is built to survive a crash, so that is safe, only slower to recover from.

The signals are counted, and the deadline armed, by a thread that reads them from the interpreter's
wakeup fd, not by the Python-level handler: that handler runs only when the main thread is back in
Python, and a client call can hang far longer than any deadline (librdkafka#5456: send_offsets_to_transaction
ignores its timeout while the group coordinator is down; seen in a soak, stuck for minutes).
"""

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, TypeVar

from kdg.errors import ConnectionFailed

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0  # what Kubernetes (terminationGracePeriodSeconds) and systemd give by default
DEFAULT_WAIT_TIMEOUT_S = 60.0


DIE_WITH_PARENT = "KDG_DIE_WITH_PARENT"  # set to a parent's pid: the kdg it starts dies with that parent


def die_with_parent() -> None:
    """Started with ``KDG_DIE_WITH_PARENT`` set to its parent's pid (a chaos cell's processes are): have Linux
    SIGKILL this process when that parent dies, however it dies (``PR_SET_PDEATHSIG``). A ``kdg chaos run``
    killed with SIGKILL otherwise leaves its consumers running, and one its pause fault stopped stays stopped
    for ever. The variable is taken out of the environment: this process's own children do not inherit it.

    Linux sends the signal when the *thread* that started the process ends, not only the process: a parent
    must start such children from a thread that outlives them (a chaos cell starts its processes from the
    thread that runs the cell, and waits for all of them before it returns; a soak starts and restarts its
    members from the thread that runs it, which stops them all before it returns)."""
    parent = os.environ.pop(DIE_WITH_PARENT, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    if ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
        return
    if os.getppid() != int(parent):  # it died before the request was made: nothing would kill this process
        os._exit(128 + signal.SIGKILL)


class StopRequested(Exception):
    """A stop was requested while a command was still starting (waiting for Kafka or Postgres)."""


_reading_input = False  # inside interruptible_read(): a stop signal raises StopRequested there and then


@contextlib.contextmanager
def interruptible_read():
    """Around a blocking read of the user's own input (stdin, a line typed at a terminal): no client call is
    inside it, so a stop signal may end it with :class:`StopRequested` instead of waiting for the next line."""
    global _reading_input
    _reading_input = True
    try:
        yield
    finally:
        _reading_input = False


class Shutdown:
    """A request to stop: set by SIGTERM/SIGINT once :meth:`on_signals` is entered, or by :meth:`request`.

    Example::

        with Shutdown(timeout=30).on_signals() as shutdown:
            while not shutdown.requested:
                ...  # one client call at a time
    """

    def __init__(self, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S):
        self.timeout = timeout
        self.signal: str | None = None  # "SIGTERM" or "SIGINT", once one arrived
        self._event = threading.Event()
        self.check = self._event.is_set  # ``requested`` as a bound method, for a per-record loop
        self._done = threading.Event()
        self._previous: dict[int, object] = {}
        self._seen = 0                            # stop signals counted (by the watcher thread)
        self._wakeup: tuple[int, int] | None = None  # (read end, previous wakeup fd) while watching

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    @property
    def signum(self) -> int | None:
        return signal.Signals[self.signal].value if self.signal else None

    def request(self, reason: str = "stop requested") -> None:
        """Ask the loop to stop, as a signal would (a library caller's way, from any thread)."""
        self.signal = self.signal or reason
        self._event.set()

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` unless a stop is requested first; True if it was."""
        return self._event.wait(max(seconds, 0))

    def on_signals(self) -> "Shutdown":
        """Install the handlers (main thread only; elsewhere signals are not this thread's to take)."""
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            self._watch()
        return self

    def _watch(self) -> None:
        """Count stop signals on a thread of their own, as the C-level handler writes them to the wakeup fd."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._wakeup = (read, signal.set_wakeup_fd(write, warn_on_full_buffer=False))
        self._wakeup_write = write
        threading.Thread(target=self._watcher, args=(read,), name="kdg-signal-watcher", daemon=True).start()

    def _watcher(self, read: int) -> None:
        while data := _read(read):
            for signum in data:
                if signum in STOP_SIGNALS:
                    self._arrived(signum)
        os.close(read)

    def reclaim(self) -> None:
        """Take the signals back from a library that installed its own handlers since (PySpark takes SIGINT)."""
        for sig in self._previous:
            signal.signal(sig, self._handle)

    def __enter__(self) -> "Shutdown":
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._wakeup is not None:
            read, previous = self._wakeup
            signal.set_wakeup_fd(previous)
            os.close(self._wakeup_write)  # the watcher reads end-of-file and ends
            self._wakeup = None

    def _handle(self, signum: int, frame) -> None:
        """The Python-level handler (main thread, once it is back in Python): the flag, and the end of a
        wait for the user's input. Counting and the deadline are the watcher's, which saw it first."""
        self._mark(signum)
        if _reading_input:
            raise StopRequested(signal.Signals(signum).name)

    def _mark(self, signum: int) -> None:
        self.signal = self.signal or signal.Signals(signum).name
        self._event.set()

    def _arrived(self, signum: int) -> None:
        name = signal.Signals(signum).name
        self._seen += 1
        if self._seen > 1:
            _exit_now(f"{name} again: stopping at once, without finishing the batch in flight "
                      "(the guarantee holds, as after a crash)", signum)
        self._mark(signum)
        _say(f"{name}: stopping cleanly within {self.timeout:g} s (send it again to stop at once)")
        threading.Thread(target=self._deadline, args=(signum,), name="kdg-shutdown-deadline", daemon=True).start()

    def _deadline(self, signum: int) -> None:
        if not self._done.wait(self.timeout):
            _exit_now(f"the stop did not finish within --shutdown-timeout {self.timeout:g} s: stopping at once "
                      "(the guarantee holds, as after a crash)", signum)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 64)
    except OSError:
        return b""


def _say(text: str) -> None:
    os.write(sys.stderr.fileno(), f"{text}\n".encode())  # no buffered stream: this may run inside a print


def _exit_now(text: str, signum: int) -> None:
    _say(text)
    os._exit(128 + signum)


LAST_TRY_S = 0.05  # less time than this left of a wait: no attempt is worth another round


def attempt_s(wait_timeout: float, shutdown: Shutdown | None = None) -> float:
    """How long one start-up attempt to reach a server may block in a client call (which a signal does not cut
    short): no longer than the whole wait (``--wait-timeout 0`` answers within a second), nor than half the
    stop's deadline, so a SIGTERM meanwhile still ends in a clean stop; 1 to 10 s."""
    limit = min(10.0, wait_timeout, shutdown.timeout / 2 if shutdown is not None else 10.0)
    return max(1.0, limit)


def wait_until_up(what: str, connect: Callable[[], T], timeout: float, shutdown: Shutdown | None = None,
                  notice: Callable[[str], None] = lambda text: None) -> T:
    """``connect()``, again with backoff while it raises a retriable :class:`ConnectionFailed`, for ``timeout`` s.

    A refused login or an ACL (``retriable`` False) is raised at once: waiting would not change it.
    A stop requested meanwhile ends the wait with :class:`StopRequested`.
    """
    started, delay, attempt = time.monotonic(), 0.5, 0
    shutdown = shutdown or Shutdown()
    while True:
        attempt += 1
        try:
            return connect()
        except ConnectionFailed as exc:
            waited = time.monotonic() - started
            left = timeout - waited  # the last attempt is made at the deadline, not a back-off before it
            if not exc.retriable or left < LAST_TRY_S:
                if attempt > 1:
                    raise type(exc)(f"{exc} (waited {waited:.0f} s for {what}, --wait-timeout {timeout:g})") from exc
                raise
            notice(f"waiting for {what} (attempt {attempt}, {waited:.0f} s of {timeout:g}): {exc}")
            if shutdown.requested or shutdown.sleep(min(delay, left)):
                raise StopRequested(what) from exc
            delay = min(delay * 2, 5.0)
