"""The chaos report: a rich table for the terminal; an HTML page, PNG charts and raw JSON for people.

Charts are drawn with matplotlib's Agg backend (imported only when a report is written).
"""

import base64
import html
import json
from collections import defaultdict
from pathlib import Path
from statistics import median

from rich.table import Table


def _label(cell: dict) -> str:
    return f"{cell['guarantee']}\n{cell['fault']}"


def _by_cell(results: dict) -> dict[tuple[str, str], list[dict]]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for cell in results["cells"]:
        groups[(cell["guarantee"], cell["fault"])].append(cell)
    return groups


def _spread(values: list[int]) -> dict:
    return {"min": min(values), "median": median(values), "max": max(values)}


def _summary_note(guarantee: str, cells: list[dict]) -> str:
    failed = [c for c in cells if c["verdict"] != "PASS"]
    if len(cells) == 1:
        return cells[0]["note"]
    if failed:
        return f"{len(failed)} of {len(cells)} reps broke it: " + "; ".join(sorted({c["note"] for c in failed}))
    parts = [f"{name} in {hit} of {len(cells)} reps" for name, hit in
             (("lost", sum(1 for c in cells if c["lost"])), ("duplicates", sum(1 for c in cells if c["duplicates"])))
             if hit]
    if parts:
        return ", ".join(parts) + f", allowed by {guarantee}"
    silent = sum(1 for c in cells if not c["fault_fired"])
    return "nothing lost, nothing duplicated" + (f" (the fault did not fire in {silent} reps)" if silent else "")


def summarize(results: dict) -> list[dict]:
    """One row per guarantee × fault over its repetitions: totals, per-repetition spread, verdict."""
    rows = []
    for (guarantee, fault), cells in _by_cell(results).items():
        lost, dups = [c["lost"] for c in cells], [c["duplicates"] for c in cells]
        rows.append({"guarantee": guarantee, "fault": fault, "reps": len(cells),
                     "fired": sum(1 for c in cells if c["fault_fired"]),
                     "lost": sum(lost), "duplicates": sum(dups),
                     "lost_per_rep": _spread(lost), "duplicates_per_rep": _spread(dups),
                     "verdict": "PASS" if all(c["verdict"] == "PASS" for c in cells) else "FAIL",
                     "note": _summary_note(guarantee, cells)})
    return rows


def _amount(row: dict, name: str) -> str:
    spread = row[f"{name}_per_rep"]
    text = f"{row[name]:,}"
    if row["reps"] > 1 and row[name]:
        mid = spread["median"]
        mid_text = f"{mid:,.0f}" if mid == int(mid) else f"{mid:,.1f}"
        text += f" ({spread['min']:,}–{spread['max']:,} per rep, median {mid_text})"
    return text


def _title(results: dict) -> str:
    done = "" if results.get("complete", True) else f" — stopped after {len(results['cells'])} cells"
    topics = f" × {results['topics']} topics" if results.get("topics", 1) > 1 else ""
    return (f"kdg chaos — {results['messages']:,} messages{topics} × {results['repeat']} rep(s), "
            f"sink {results['sink']}{done}")


def summary_table(results: dict) -> Table:
    """One row per guarantee × fault, repetitions summed; verdict styled with the theme's ok/bad."""
    table = Table(title=_title(results), title_justify="left")
    for col in ("guarantee", "fault", "reps", "fired", "lost", "duplicates", "verdict", "note"):
        table.add_column(col)
    for row in summarize(results):
        style = "ok" if row["verdict"] == "PASS" else "bad"
        table.add_row(row["guarantee"], row["fault"], str(row["reps"]), f"{row['fired']}/{row['reps']}",
                      _amount(row, "lost"), _amount(row, "duplicates"),
                      f"[{style}]{row['verdict']}[/{style}]", row["note"])
    return table


def _finish_bars(fig, ax, path: Path, plt, title: str, ylabel: str) -> None:
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _anomalies_chart(results: dict, path: Path, plt) -> None:
    groups = _by_cell(results)
    labels = [f"{g}\n{f}" for g, f in groups]
    lost = [sum(c["lost"] for c in cells) for cells in groups.values()]
    dups = [sum(c["duplicates"] for c in cells) for cells in groups.values()]
    fig, ax = plt.subplots(figsize=(max(8, len(labels) * 0.9), 5))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], lost, width=0.4, label="lost", color="#c0392b")
    ax.bar([x + 0.2 for x in xs], dups, width=0.4, label="duplicated", color="#e67e22")
    ax.set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=7)
    _finish_bars(fig, ax, path, plt, "Lost and duplicated records per guarantee × fault",
                 "records (summed over repetitions)")


def _throughput_chart(results: dict, path: Path, plt) -> None:
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"produce": [], "consume": []})
    for c in results["cells"]:
        if c["produce_msgs_per_s"]:
            per[c["guarantee"]]["produce"].append(c["produce_msgs_per_s"])
        if c["consume_msgs_per_s"]:
            per[c["guarantee"]]["consume"].append(c["consume_msgs_per_s"])
    names = list(per)
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(names))
    for offset, kind, color in ((-0.2, "produce", "#2980b9"), (0.2, "consume", "#27ae60")):
        ax.bar([x + offset for x in xs], [median(per[n][kind]) if per[n][kind] else 0 for n in names],
               width=0.4, label=kind, color=color)
    ax.set_xticks(list(xs), names)
    _finish_bars(fig, ax, path, plt, "Throughput per guarantee", "msgs/s (median over cells, under faults)")


def _timeline_chart(results: dict, path: Path, plt) -> None:
    cells = [c for c in results["cells"] if c["repetition"] == 1]
    cols = 3
    rows = max(1, -(-len(cells) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.6 * rows), squeeze=False)
    for ax, cell in zip([a for row in axes for a in row], cells):
        pts = cell.get("progress") or []
        ax.plot([p["t"] for p in pts], [p["delivered"] for p in pts], color="#2c3e50", lw=1.2)
        for ev in cell.get("timeline", []):
            ax.axvline(ev["t"], color="#c0392b", lw=0.8, ls="--")
        ax.set_title(f"{cell['guarantee']} × {cell['fault']} — {cell['verdict']}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("s", fontsize=7)
    for ax in [a for row in axes for a in row][len(cells):]:
        ax.axis("off")
    fig.suptitle("Rows delivered to the sink over time; dashed lines are fault events")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _html(results: dict, charts: dict[str, Path]) -> str:
    e = html.escape
    rows = []
    for c in results["cells"]:
        cls = "pass" if c["verdict"] == "PASS" else "fail"
        events = "<br>".join(f"{ev['t']:.1f}s {e(ev['event'])}" for ev in c.get("timeline", []))
        rows.append(f"<tr class={cls}><td>{e(c['guarantee'])}</td><td>{e(c['fault'])}</td><td>{c['repetition']}</td>"
                    f"<td>{c['acked']}</td><td>{c['lost']}</td><td>{c['duplicates']}</td>"
                    f"<td>{e(c['verdict'])}</td><td>{e(c['note'])}</td><td class=ev>{events}</td></tr>")
    summary = []
    for row in summarize(results):
        cls = "pass" if row["verdict"] == "PASS" else "fail"
        summary.append(f"<tr class={cls}><td>{e(row['guarantee'])}</td><td>{e(row['fault'])}</td><td>{row['reps']}</td>"
                       f"<td>{row['fired']}/{row['reps']}</td><td>{e(_amount(row, 'lost'))}</td>"
                       f"<td>{e(_amount(row, 'duplicates'))}</td><td>{row['verdict']}</td><td>{e(row['note'])}</td></tr>")
    imgs = "".join(f"<h2>{e(title)}</h2>{_img(path, title)}" for title, path in charts.items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>kdg chaos report</title><style>
body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:4px 6px;vertical-align:top}} tr.pass td{{background:#eafaf1}}
tr.fail td{{background:#fdedec}} td.ev{{font-size:11px;color:#555}} img{{max-width:100%}}</style></head><body>
<h1>{e(_title(results))}</h1>
<p>{e(str(results['started_at']))} · {e(str(results['machine']))} · {results.get('duration_s', 0):,.0f} s</p>
<p>Rules: exactly-once → 0 lost and 0 duplicates; at-least-once → 0 lost; at-most-once → 0 duplicates.</p>
<h2>Guarantee × fault</h2>
<table><tr><th>guarantee</th><th>fault</th><th>reps</th><th>fault fired</th><th>lost</th><th>duplicates</th>
<th>verdict</th><th>note</th></tr>{''.join(summary)}</table>
<h2>Every repetition</h2>
<table><tr><th>guarantee</th><th>fault</th><th>rep</th><th>acked</th><th>lost</th><th>duplicates</th>
<th>verdict</th><th>note</th><th>timeline</th></tr>{''.join(rows)}</table>{imgs}</body></html>"""


REQUIRED = {"started_at": str, "machine": str, "messages": int, "repeat": int, "sink": str, "cells": list}
CELL_REQUIRED = {"guarantee": str, "fault": str, "repetition": int, "acked": int, "lost": int, "duplicates": int,
                 "verdict": str, "note": str, "fault_fired": bool, "produce_msgs_per_s": (int, float),
                 "consume_msgs_per_s": (int, float)}


def _wrong_fields(doc, required: dict) -> list[str]:
    if not isinstance(doc, dict):
        return ["everything (not a JSON object)"]
    return [f"{k} (missing)" if k not in doc else f"{k} (not {getattr(t, '__name__', 'a number')})"
            for k, t in required.items() if k not in doc or not isinstance(doc[k], t)]


def load_results(path: Path) -> dict:
    """Read a results.json written by `kdg chaos run --report` (whole, or kept after an interrupted run)."""
    from kdg.errors import UsageError

    try:
        results = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file (a chaos run with --report DIR writes DIR/results.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a chaos results file ({exc})") from None
    wrong = _wrong_fields(results, REQUIRED)
    if wrong:
        raise UsageError(f"{path}: not a chaos results file: {', '.join(wrong)}")
    for i, cell in enumerate(results["cells"]):
        wrong = _wrong_fields(cell, CELL_REQUIRED)
        if wrong:
            raise UsageError(f"{path}: cell {i + 1}: {', '.join(wrong)}")
    if not results["cells"]:
        raise UsageError(f"{path}: holds no cells yet (the run stopped before its first cell ended)")
    return results


def write_results(results: dict, out_dir: Path) -> Path:
    """Write results.json atomically (a reader never sees half a document); return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str))
    tmp.replace(path)
    return path


def write_report(results: dict, out_dir: Path, *, raw: bool = True) -> Path:
    """Write three PNG charts, a self-contained index.html and (``raw``) results.json; return the page's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    if raw:
        write_results(results, out_dir)
    charts = {"Lost and duplicated per cell": out_dir / "anomalies.png",
              "Throughput per guarantee": out_dir / "throughput.png",
              "Fault timeline against delivered rows": out_dir / "timeline.png"}
    _anomalies_chart(results, charts["Lost and duplicated per cell"], plt)
    _throughput_chart(results, charts["Throughput per guarantee"], plt)
    _timeline_chart(results, charts["Fault timeline against delivered rows"], plt)
    page = out_dir / "index.html"
    page.write_text(_html(results, charts))
    return page
