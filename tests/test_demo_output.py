"""`scripts/demo.sh` (what `make demo` runs) on the test stack: it passes, says what each guarantee did, and
prints no noise — no traceback, no Java stack trace, no librdkafka log line, no bash job report."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOISE = ("Traceback", "at org.apache", "%3|", "%4|", "Killed", "Setting default log level", "WARNING: Using")
AUDIT = re.compile(r"^audit (\S+): (\d+) acked, (\d+) rows in the sink: "
                   r"lost (\d+), duplicates (\d+), unexpected (\d+)$", re.M)
REPLAY = re.compile(r"^spark-replay \((.+?)\): (\d+) read, (\d+) written, (\d+) duplicates dropped", re.M)


def test_the_demo_shows_each_guarantee_quietly(stack):
    env = {k: v for k, v in os.environ.items() if k != "KDG_FAULT"}
    env.update(KDG=str(Path(sys.executable).parent / "kdg"), KDG_STATE_DIR=str(stack.state_dir),
               KDG_BOOTSTRAP_SERVERS=stack.bootstrap_servers, KDG_PG_DSN=stack.pg_dsn)
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1200)
    out = proc.stdout
    assert proc.returncode == 0, out
    assert [n for n in NOISE if n in out] == [], out

    assert out.count("as planned") == 3, out
    audits = {m[0]: dict(zip(("acked", "rows", "lost", "duplicates", "unexpected"), map(int, m[1:])))
              for m in AUDIT.findall(out)}
    assert set(audits) == {"at-most-once", "at-least-once", "exactly-once", "spark-replay"}, out
    assert audits["at-most-once"]["lost"] > 0 and audits["at-most-once"]["duplicates"] == 0, audits
    assert audits["at-least-once"]["duplicates"] > 0 and audits["at-least-once"]["lost"] == 0, audits
    for clean in ("exactly-once", "spark-replay"):
        assert (audits[clean]["lost"], audits[clean]["duplicates"], audits[clean]["unexpected"]) == (0, 0, 0), audits

    (first, *_, killed_dropped), (second, read, written, _) = REPLAY.findall(out)
    assert "killed" in first and int(killed_dropped) > 0, out  # the retried task met the chunk its dead attempt wrote
    assert "same range" in second and (int(read), int(written)) == (20000, 0), out
    # the killed task is one line naming Spark's log file in the stack's state dir (rich may wrap it)
    flat = " ".join(out.split())
    failed = re.search(r"spark: task \d+ failed \(attempt 1 of 4; Spark retries it\) — details in (\S+\.log)", flat)
    assert failed, out
    log = Path(failed.group(1))
    assert log.parent == stack.state_dir / "logs" and "Lost task" in log.read_text(), log
