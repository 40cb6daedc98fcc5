"""A consumer's RSS before and after bursts of records, on the local stack (`kdg stack up`).

    python benchmarks/rss_burst.py            # the default allocator
    python benchmarks/rss_burst.py malloc     # PYTHONMALLOC=malloc, for comparison

An exactly-once consumer into a generic table (kdg_events' shape) idles, then takes 4 bursts of 5,000 records of 200 B,
each arriving at once (as after a broker outage). The step after the first burst is the memory of one
full batch that the process keeps; later bursts show whether it keeps growing.
"""

import os
import subprocess
import sys
import time
import uuid

PY = sys.executable


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))


def main(mode: str) -> None:
    env = dict(os.environ, **({"PYTHONMALLOC": "malloc"} if mode == "malloc" else {}))
    topic = f"rss-{uuid.uuid4().hex[:6]}"
    kdg = [PY, "-m", "kdg"]
    subprocess.run([*kdg, "produce", topic, "--count", "10", "-g", "at-least-once", "--json"], capture_output=True,
                   check=True)
    consumer = subprocess.Popen([*kdg, "consume", topic, "-G", f"g-{topic}", "-g", "exactly-once", "--table",
                                 f"rss_{topic[4:]}", "--json"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        time.sleep(25)
        rows = [("idle", rss_mb(consumer.pid))]
        for burst in range(1, 5):
            subprocess.run([*kdg, "produce", topic, "--count", "5000", "--size", "200", "-g", "at-least-once",
                            "--json"], capture_output=True, check=True)
            time.sleep(15)
            rows.append((f"after burst {burst}", rss_mb(consumer.pid)))
    finally:
        consumer.terminate()
        consumer.wait()
    print(mode, " ".join(f"{what}: {mb} MB," for what, mb in rows).rstrip(","))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "pymalloc")
