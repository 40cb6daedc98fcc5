"""Start detached server processes and stop them again, by the pid recorded when they started."""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def as_user(user: str | None) -> dict:
    """``subprocess`` arguments that run a child as ``user`` with that user's own groups only."""
    return {} if user is None else {"user": user, "group": user, "extra_groups": []}


def start_detached(cmd: list[str], *, log: Path, pidfile: Path, env: dict | None = None,
                   user: str | None = None, cwd: Path | None = None) -> int:
    """Start ``cmd`` in its own session, output appended to ``log``; record its pid in ``pidfile``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=cwd, **as_user(user))
    pidfile.write_text(str(proc.pid))
    return proc.pid


def read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def pid_matches(pid: int | None, marker: str) -> bool:
    """True if ``pid`` is a live process whose command line contains ``marker``.

    The marker (a config path in the state dir) guards against a recycled pid.
    """
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # zombie: dead, not yet reaped
        return False
    return marker in cmdline


def process_state(pid: int | None) -> str | None:
    """The kernel's one-letter state of ``pid`` (R, S, T for stopped, ...), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (FileNotFoundError, TypeError):
        return None


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc), e.g. a PostgreSQL server's backends, which each
    lead a process group of their own and so outlive a signal to the server's group."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):  # after the name: state, then the parent's pid
            found.append(int(stat.parent.name))
    return found


def running_with(prefix: str) -> dict[int, list[str]]:
    """The live processes one of whose arguments starts with ``prefix`` (from /proc): pid → arguments."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(arg.startswith(prefix) for arg in args):
            found[int(cmdline.parent.name)] = [a for a in args if a]
    return found


def stop_pid(pid: int, *, timeout: float = 30.0, hard: bool = False, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` (SIGKILL when ``hard``) to the process group of ``pid``; wait for it to go.

    After ``timeout`` seconds the group is killed.
    """
    stop_pids([pid], timeout=timeout, hard=hard, sig=sig)


def stop_pids(pids: list[int], *, timeout: float = 30.0, hard: bool = False, sig: int = signal.SIGTERM) -> None:
    """:func:`stop_pid` for several process groups at once: all are signalled, then all are waited for.

    Peers that need each other to stop cleanly (KRaft nodes: a broker's controlled shutdown needs
    a controller quorum) stop together, instead of the last one waiting out ``timeout`` alone.
    """
    sig = signal.SIGKILL if hard else sig
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):  # not a group leader (any more), or not ours to signal
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(pid) or _group_alive(pid) for pid in pids):
            return
        time.sleep(0.1)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while any(_alive(pid) or _group_alive(pid) for pid in pids) and time.monotonic() < deadline + 10:
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it was our child
    except ChildProcessError:
        pass
    state = process_state(pid)
    return state is not None and state != "Z"


def _group_alive(pgid: int) -> bool:
    """Whether any live (not zombie) process is still in process group ``pgid``.

    A server's children outlive its leader for a moment, longer when the kill finds one in the
    middle of a disk write (a SIGKILLed Postgres's checkpointer): a new server started on the same
    data directory meanwhile finds the old shared memory still attached and refuses to start.
    """
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:  # gone while we looked
            continue
        if fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {path})"
