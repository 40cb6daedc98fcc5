"""Where a process's CPU goes, thread by thread: run a command and read each of its threads' CPU from /proc.

    python benchmarks/thread_cpu.py [--interval S] [--json OUT] -- COMMAND [ARG ...]

Starts COMMAND, reads ``/proc/PID/task/*/stat`` (user + system time) and ``comm`` every ``--interval`` seconds
until it exits, keeping each thread's last reading (a thread that ends keeps what it had used), and prints
one JSON object: CPU-s by thread name (librdkafka names its threads ``rdk:…``; Python's are ``python`` unless
named), the main thread apart, and the process's total. Linux only. What a thread used after the last reading
before it ended (at most one interval's worth) is not counted, so read the split, not the last digit.
The command's own output goes to stderr.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def sample(pid: int, seen: dict[int, tuple[str, int]]) -> None:
    """Each thread of ``pid``: its name and CPU ticks so far, into ``seen``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        seen[int(task.name)] = (name, int(fields[11]) + int(fields[12]))  # utime, stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to run after --")
    try:
        proc = subprocess.Popen(command, stdout=sys.stderr)
    except OSError as exc:
        ap.error(f"cannot run {command[0]}: {exc.strerror}")
    seen: dict[int, tuple[str, int]] = {}
    started = time.monotonic()
    while proc.poll() is None:
        try:
            sample(proc.pid, seen)
        except FileNotFoundError:  # exited between poll and read
            break
        time.sleep(args.interval)
    elapsed = time.monotonic() - started
    by_name: dict[str, float] = {}
    main_thread = seen.get(proc.pid, ("", 0))[1] / TICK
    for tid, (name, ticks) in seen.items():
        if tid != proc.pid:
            by_name[name] = round(by_name.get(name, 0.0) + ticks / TICK, 2)
    out = {"command": command, "exit": proc.returncode, "wall_s": round(elapsed, 2),
           "main_thread_cpu_s": round(main_thread, 2),
           "other_threads_cpu_s": dict(sorted(by_name.items(), key=lambda kv: -kv[1])),
           "total_cpu_s": round(main_thread + sum(by_name.values()), 2)}
    text = json.dumps(out)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
