"""`kdg chaos soak` for two minutes on the session stack: every kind of fault fires, exactly-once holds over
the whole run in both sinks, state stays bounded, lag recovers, RSS is measured."""

import json
import subprocess
import sys

import pytest

from kdg.chaos.soak_nemesis import KINDS


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
