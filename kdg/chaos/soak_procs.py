"""The soak's kdg processes: each one restartable with the same arguments, its incarnations and RSS kept,
its own metrics endpoint scraped."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kdg.lifecycle import DIE_WITH_PARENT
from kdg.stack.layout import StackLayout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int) -> int | None:
    """The resident set of ``pid`` (VmRSS, kB), or None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def scrape(port: int, timeout: float = 1.5) -> dict[str, list[tuple[dict, float]]]:
    """``{sample name: [(labels, value)]}`` from ``http://127.0.0.1:port/metrics``; {} when it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
    except (OSError, ValueError):
        return {}
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(metrics: dict, name: str) -> float:
    return sum(v for _, v in metrics.get(name, []))


class Member:
    """One kdg command of the soak (the producer or a consumer), started again with the same arguments."""

    def __init__(self, layout: StackLayout, name: str, role: str, args: list, logs: Path, group: str | None = None):
        self.layout, self.name, self.role, self.group = layout, name, role, group
        self.port = free_port()
        self.args = [*map(str, args), "--metrics-port", str(self.port), "--metrics-host", "127.0.0.1", "--json"]
        self.logs = logs
        self.proc: subprocess.Popen | None = None
        self.incarnations: list[dict] = []

    def _env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "KDG_FAULT"}
        env.update({"KDG_BOOTSTRAP_SERVERS": self.layout.bootstrap_servers, "KDG_PG_DSN": self.layout.pg_dsn,
                    # a soak killed with SIGKILL takes its members along (the soak starts and restarts them all
                    # from the thread that runs it, which stops them before it returns: die_with_parent's rule)
                    DIE_WITH_PARENT: str(os.getpid())})
        if self.layout.secure:
            env["KDG_KAFKA_CONFIG"] = str(self.layout.client_profile)
        return env

    def start(self, t: float) -> None:
        n = len(self.incarnations) + 1
        with open(self.logs / f"{self.name}.{n}.out", "w") as out, open(self.logs / f"{self.name}.{n}.err", "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "kdg", *self.args], env=self._env(), stdout=out,
                                         stderr=err, stdin=subprocess.DEVNULL)
        self.incarnations.append({"pid": self.proc.pid, "started": t, "ended": None, "exit": None, "rss": []})

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ended(self, t: float) -> int | None:
        """Note the current incarnation's end, once it has exited; its exit code."""
        code = self.proc.poll() if self.proc is not None else None
        inc = self.incarnations[-1] if self.incarnations else None
        if code is not None and inc is not None and inc["ended"] is None:
            inc["ended"], inc["exit"] = t, code
        return code

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout) if self.proc is not None else None
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: int) -> None:
        if self.alive:
            os.kill(self.proc.pid, sig)

    def stop(self, t_now, timeout: float = 30.0) -> int | None:
        """SIGTERM (SIGCONT first: a paused process cannot act on it); the exit code, None if it had to be killed."""
        if not self.alive:
            return self.ended(t_now())
        self.signal(signal.SIGCONT)
        # an orchestrator's stop comes to a running member: one still starting (restarted a moment ago)
        # is given the time to get there, as a rolling restart waits for readiness
        self.wait_ready(60, time.sleep)
        self.signal(signal.SIGTERM)
        code = self.wait(timeout)
        if code is None:
            self.proc.kill()
            self.proc.wait()
        self.ended(t_now())
        return code

    def stderr_tail(self, lines: int = 3) -> str:
        path = self.logs / f"{self.name}.{len(self.incarnations)}.err"
        try:
            return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def report(self) -> dict:
        """The last incarnation's --json report ({} if it printed none)."""
        import json

        try:
            return json.loads((self.logs / f"{self.name}.{len(self.incarnations)}.out").read_text())
        except (OSError, ValueError):
            return {}

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as resp:
                return resp.status == 200
        except (OSError, ValueError):
            return False

    def wait_ready(self, timeout: float, sleep) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive:
            if self.ready():
                return True
            if sleep(0.5):
                return False
        return False
