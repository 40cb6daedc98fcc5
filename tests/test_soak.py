"""`kdg chaos soak` for two minutes on the session stack: every kind of fault fires, exactly-once holds over
the whole run in both sinks, state stays bounded, lag recovers, RSS is measured."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kdg.chaos.soak_nemesis import KINDS
from kdg.stack import procs


@pytest.mark.disrupts_stack
def test_a_two_minute_soak_fires_every_fault_and_keeps_exactly_once(stack, tmp_path):
    report = tmp_path / "soak"
    proc = subprocess.run([sys.executable, "-m", "kdg", "chaos", "soak", "--minutes", "2", "--rate", "200", "--seed",
                           "7", "--json", "--report", str(report), "--state-dir", str(stack.state_dir)],
                          capture_output=True, text=True, timeout=600)
    assert proc.stdout.strip(), f"kdg chaos soak exited {proc.returncode} without a report:\n{proc.stderr[-3000:]}"
    results = json.loads(proc.stdout)
    checks = results["checks"]
    unfired = [e for e in results["timeline"] if e.get("kind") in KINDS and not e.get("fired")]
    assert proc.returncode == 0, (f"report in {report}", checks["failed"], checks["processes"]["failures"], unfired,
                                  checks["exactly_once"], [(s["since_t"], s["until_t"], s.get("audited_t"), s["tries"])
                                                           for s in results["slices"]], proc.stderr[-2000:])
    assert all(checks["faults"]["fired"][kind] >= 1 for kind in KINDS), checks["faults"]
    for sink in ("typed", "kafka"):
        eos = checks["exactly_once"][sink]
        assert (eos["lost"], eos["duplicates"], eos["unexpected"]) == (0, 0, 0) and eos["ok"], (sink, eos)
        assert eos["acked"] == results["producer"]["acked"] > 0, (sink, eos)
    assert checks["control"]["present"], checks["control"]
    assert all(r["ok"] for r in checks["bounded"]), checks["bounded"]
    assert len(checks["lag_recovery"]) >= len(KINDS) and all(r["ok"] for r in checks["lag_recovery"])
    assert checks["rss"] and all(r["ok"] is not False for r in checks["rss"]), checks["rss"]  # 2 min: shown only


def test_a_killed_soaks_members_die_with_it(stack, topic, tmp_path):
    """A soak killed with SIGKILL (the OOM killer, a CI job's timeout), which no handler sees, took none of its
    members along: a consumer ran on for ever. A member now asks Linux to kill it with the soak
    (kdg.lifecycle.die_with_parent), as a chaos cell's processes do."""
    soak = subprocess.Popen([sys.executable, "-c", f"""
import time
from pathlib import Path
from kdg.chaos.soak_procs import Member
from kdg.stack.layout import StackLayout
member = Member(StackLayout.load(Path({str(stack.state_dir)!r})), "consumer-1", "consumer",
                ["consume", {topic!r}, "-G", "g-{topic}", "-g", "at-least-once", "--table", "soak_killed"],
                Path({str(tmp_path)!r}))
member.start(0.0)
print(member.pid if member.wait_ready(90, time.sleep) else -1, flush=True)  # consuming, as in a soak
time.sleep(300)
"""], stdout=subprocess.PIPE, text=True)
    member = None
    try:
        member = int(soak.stdout.readline())
        assert member > 0 and procs.process_state(member) not in (None, "Z"), "the member did not become ready"
        soak.kill()
        soak.wait(timeout=10)
        deadline = time.monotonic() + 10
        while procs.process_state(member) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert procs.process_state(member) in (None, "Z"), "the killed soak's member outlived it"
    finally:
        soak.kill()
        if member is not None and procs.process_state(member) not in (None, "Z"):
            os.kill(member, signal.SIGKILL)
