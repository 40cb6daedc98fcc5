"""A consumer's RSS before and after bursts of records, on the local stack (`kdg stack up`).

    python benchmarks/rss_burst.py            # the default allocator
    python benchmarks/rss_burst.py malloc     # PYTHONMALLOC=malloc, for comparison
    python benchmarks/rss_burst.py typed      # the typed sink, with the soak's columns
    python benchmarks/rss_burst.py alo        # at-least-once into a generic table (the soak's control)
    python benchmarks/rss_burst.py kafka      # exactly-once into another topic (the soak's kafka:OUT member)

An exactly-once consumer into a generic table (kdg_events' shape), or the soak's typed table, idles, then takes 4 bursts of 5,000 records of 200 B,
each there at once when it wakes (it is stopped meanwhile, as the soak's pause fault does). The step after the first burst is the memory of one
full batch that the process keeps; later bursts show whether it keeps growing.
"""

import os
import signal
import subprocess
import sys
import time
import uuid

from kdg.chaos.soak import COLUMNS

PY = sys.executable


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))


def breakdown(pid: int) -> str:
    """RSS by kind of mapping, in MB: glibc's main heap, its thread arenas (64 MB reservations), other
    anonymous memory (pymalloc's 1 MB arenas, large allocations, stacks), and files (code)."""
    kb = {"heap": 0, "threads": 0, "anon": 0, "files": 0}
    kind = None
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                name = head[5] if len(head) > 5 else ""
                kind = ("heap" if name == "[heap]" else "files" if name.startswith("/") else
                        "threads" if (hi - lo) in (64 << 20, 128 << 20) or (hi - lo) % (64 << 20) == 0 else "anon")
            elif head[0] == "Rss:":
                kb[kind] += int(head[1])
    return " ".join(f"{k} {v / 1024:.1f}" for k, v in kb.items())


def main(mode: str) -> None:
    env = dict(os.environ, **({"PYTHONMALLOC": "malloc"} if "malloc" in mode.split() else {}))

    topic = f"rss-{uuid.uuid4().hex[:6]}"
    kdg = [PY, "-m", "kdg"]
    subprocess.run([*kdg, "produce", topic, "--count", "10", "-g", "at-least-once", "--json"], capture_output=True,
                   check=True)
    typed = ["--create-table", *[a for col in COLUMNS for a in ("--column", col)]] if "typed" in mode else []
    words = mode.split()
    guarantee = "at-least-once" if "alo" in words else "exactly-once"
    sink = ["--sink", f"kafka:{topic}-out"] if "kafka" in words else ["--table", f"rss_{topic[4:]}"]
    consumer = subprocess.Popen([*kdg, "consume", topic, "-G", f"g-{topic}", "-g", guarantee, *sink,
                                 *typed, "--json"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        time.sleep(25)
        rows = [("idle", rss_mb(consumer.pid))]
        print("idle:", breakdown(consumer.pid))
        for burst in range(1, 5):
            consumer.send_signal(signal.SIGSTOP)  # the burst is all there when it wakes, as after a pause
            subprocess.run([*kdg, "produce", topic, "--count", "5000", "--size", "200", "-g", "at-least-once",
                            "--json"], capture_output=True, check=True)
            consumer.send_signal(signal.SIGCONT)
            time.sleep(15)
            rows.append((f"after burst {burst}", rss_mb(consumer.pid)))
            print(f"after burst {burst}:", breakdown(consumer.pid))
    finally:
        consumer.terminate()
        consumer.wait()
    print(mode, " ".join(f"{what}: {mb} MB," for what, mb in rows).rstrip(","))


if __name__ == "__main__":
    main(" ".join(sys.argv[1:]) or "pymalloc")
