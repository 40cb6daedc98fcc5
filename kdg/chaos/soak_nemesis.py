"""The soak's nemesis: a seeded random schedule of real faults, each put on the timeline with whether it fired.

Every fault restores what it broke before it returns (a killed consumer or broker is started again, a
paused consumer continued, Postgres restarted), so the next one starts from a whole stack.
"""

import random
import signal
import time

from kdg.errors import KdgError
from kdg.stack import cluster, postgres, procs

KINDS = ("consumer-kill", "consumer-pause", "broker-kill", "postgres-restart", "ack-loss", "rolling-restart")
PAUSE_S = 15.0        # past the consumers' session.timeout.ms: the group moves a paused member's partitions
CLEAN_STOP_S = 30.0   # a rolling restart's SIGTERM must end the consumer (exit 0) within this


def fault_count(minutes: float) -> int:
    """Every kind at least once (a 2-minute soak: 6), about 40 in an hour."""
    return max(len(KINDS), round(minutes * 2 / 3))


def schedule(seed: int, minutes: float, warmup_s: float) -> list[tuple[float, str]]:
    """``[(start time in s, kind)]``: each kind once in a random order, then at random; evenly spread, jittered."""
    rng = random.Random(seed)
    n = fault_count(minutes)
    kinds = rng.sample(KINDS, len(KINDS)) + [rng.choice(KINDS) for _ in range(n - len(KINDS))]
    every = max(1.0, (minutes * 60 - warmup_s) / n)
    return [(round(warmup_s + i * every + rng.uniform(0, every / 4), 1), kind) for i, kind in enumerate(kinds)]


class Nemesis:
    """Injects one fault at a time into a running soak (``soak``: its members, proxy, clock, stop flag)."""

    def __init__(self, soak, seed: int):
        self.soak = soak
        self.rng = random.Random(seed + 1)  # targets and delays: a stream of their own, the kinds stay put

    def inject(self, kind: str) -> dict:
        entry = {"t": self.soak.now(), "kind": kind, "target": "", "fired": False, "end_t": None, "note": "",
                 "failure": None}
        try:
            getattr(self, kind.replace("-", "_"))(entry)
        except KdgError as exc:  # the fault could not be made or undone: a failure of the run, which goes on
            entry["failure"] = f"{kind} at {entry['t']:.0f} s failed: {exc}"
        finally:
            entry["end_t"] = self.soak.now()
        return entry

    def _consumer(self):
        return self.rng.choice(self.soak.consumers)

    def consumer_kill(self, e: dict) -> None:
        m = self._consumer()
        e["target"] = m.name
        m.signal(signal.SIGKILL)
        code = m.wait(10)
        m.ended(self.soak.now())
        e["fired"] = code == -signal.SIGKILL
        self.soak.shutdown.sleep(self.rng.uniform(2, 5))
        m.start(self.soak.now())
        e["note"] = f"exit {code}; restarted"

    def consumer_pause(self, e: dict) -> None:
        m = self._consumer()
        e["target"] = m.name
        m.signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while procs.process_state(m.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        e["fired"] = procs.process_state(m.pid) == "T"
        self.soak.shutdown.sleep(PAUSE_S)
        m.signal(signal.SIGCONT)
        e["note"] = f"SIGSTOP {PAUSE_S:g} s, SIGCONT: a zombie the fence must refuse"

    def broker_kill(self, e: dict) -> None:
        layout = self.soak.layout
        node = self.rng.choice(layout.node_ids)
        e["target"] = f"broker {node}"
        e["fired"] = cluster.kill_node(layout, node, hard=True)
        self.soak.shutdown.sleep(self.rng.uniform(5, 10))
        cluster.start_node(layout, node)
        e["note"] = "SIGKILL, restarted"

    def postgres_restart(self, e: dict) -> None:
        layout = self.soak.layout
        e["target"] = "postgres"
        if not layout.uses_embedded_pg:
            e["note"] = "an external Postgres: not restarted"
            return
        before = postgres.pid(layout)
        after = postgres.restart(layout, hard=True)
        e["fired"] = before is not None and after != before and procs.process_state(before) in (None, "Z")
        e["note"] = (f"SIGKILL pid {before}, restarted as {after}" if before is not None else
                     f"no running Postgres found by its pidfile (state {postgres.pid_state(layout)}); "
                     f"started as {after}")

    def ack_loss(self, e: dict) -> None:
        proxy = self.soak.proxy
        e["target"] = "producer (proxy)"
        before = proxy.dropped
        proxy.drop_produce_responses(3)
        deadline = time.monotonic() + 20
        while proxy.dropped < before + 3 and time.monotonic() < deadline and not self.soak.shutdown.sleep(0.2):
            pass
        proxy.pass_through()
        e["fired"] = proxy.dropped > before
        e["note"] = f"{proxy.dropped - before} produce responses dropped"

    def rolling_restart(self, e: dict) -> None:
        m = self._consumer()
        e["target"] = m.name
        started = time.monotonic()
        code = m.stop(self.soak.now, timeout=CLEAN_STOP_S)
        took = time.monotonic() - started
        e["fired"] = code is not None
        e["note"] = f"SIGTERM: exit {code} after {took:.1f} s"
        if code != 0:
            e["failure"] = (f"{m.name} did not exit 0 within {CLEAN_STOP_S:g} s of SIGTERM (exit {code}): "
                            f"{m.stderr_tail()}")
        m.start(self.soak.now())
