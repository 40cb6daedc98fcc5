"""A one-line description of this machine, for reports and benchmark output."""

import os


def machine() -> str:
    try:
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
        mem = int(next(l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal"))) // 1024 // 1024
    except OSError:
        return f"{os.cpu_count()} cores"
    return f"{os.cpu_count()} cores ({cpu}), {mem} GiB"
