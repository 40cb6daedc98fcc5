"""Named measurements repeated in rotated order, their medians, and the rows of `make bench`'s table.

A measurement is a function returning a dict with at least ``rate`` (per second), ``cpu_s``, ``wall_s`` and
``busy_cores`` (:class:`common.Usage`); with ``records`` (how many it moved) its CPU seconds per million
records are derived, and with ``pg_cpu_s`` Postgres's too.
"""

import statistics

from common import median

BASELINE = " (baseline)"  # a measurement's name with the --baseline kdg


def per_million(run: dict, key: str) -> float | None:
    if run.get(key) is None or not run.get("records"):
        return None
    return run[key] / run["records"] * 1e6


def _median_of(runs: list[dict], get) -> float | None:
    values = [v for v in map(get, runs) if v is not None]
    return round(statistics.median(values), 2) if values else None


class Measures:
    """Runs of named measurements, repeated in rotated order; medians of each."""

    def __init__(self):
        self.runs: dict[str, list[dict]] = {}

    def repeat(self, repeat: int, measures: dict) -> None:
        """Run every measurement once per repetition; the order rotates, so drift on a shared machine hits all."""
        names = list(measures)
        for r in range(repeat):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                run = measures[name]()
                self.runs.setdefault(name, []).append(run)
                extra = f", {run['cpu_s'] / run['records'] * 1e6:.1f} CPU-s/M" if run.get("records") else ""
                if run.get("pg_cpu_s") is not None:
                    extra += f", Postgres {run['pg_cpu_s']} CPU-s"
                print(f"  [{r + 1}/{repeat}] {name}: {run['rate']:,.0f}/s  cpu {run['cpu_s']} s over "
                      f"{run['wall_s']} s{extra}, machine {run['busy_cores']} cores busy", flush=True)

    def has(self, name: str) -> bool:
        return name in self.runs

    def median(self, name: str) -> float:
        return median([run["rate"] for run in self.runs[name]])

    def summary(self, name: str) -> dict:
        runs = self.runs[name]
        return {"median": self.median(name), "runs": [run["rate"] for run in runs],
                "median_cpu_s": _median_of(runs, lambda r: r["cpu_s"]),
                "median_wall_s": _median_of(runs, lambda r: r["wall_s"]),
                "median_busy_cores": _median_of(runs, lambda r: r["busy_cores"]),
                "cpu_s_per_m": _median_of(runs, lambda r: per_million(r, "cpu_s")),
                "pg_cpu_s_per_m": _median_of(runs, lambda r: per_million(r, "pg_cpu_s")),
                "peak_rss_mb": max((r.get("rss_mb") or 0 for r in runs), default=None),
                "details": runs}


def row(measures: Measures, what: str, kdg: str, ref: str, ref_label: str) -> dict:
    """One line of the table: ``kdg``'s median against ``ref``'s, and the baseline's when it was measured."""
    entry = {"what": what, "kdg": measures.summary(kdg), "reference": {"what": ref_label, **measures.summary(ref)}}
    entry["ratio"] = round(measures.median(kdg) / measures.median(ref), 2)
    before_kdg = kdg + BASELINE
    if measures.has(before_kdg):
        # a reference that is itself a kdg run is compared with the baseline's own
        before_ref = ref + BASELINE if measures.has(ref + BASELINE) else ref
        entry["baseline"] = {"kdg": measures.summary(before_kdg),
                             "ratio": round(measures.median(before_kdg) / measures.median(before_ref), 2)}
    return entry
