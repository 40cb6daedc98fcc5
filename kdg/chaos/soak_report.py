"""The soak's checks (each reported, any failed one fails the soak) and its report: a rich table, an HTML page
with a timeline chart, results.json."""

import html
from pathlib import Path

from rich.table import Table

from kdg.chaos.soak_nemesis import KINDS
from kdg.retention import parse_retention
from kdg.store.windows import width_for

LAG_RECOVERY_S = 120.0
RSS_GROWTH = 0.10
RSS_WARMUP_S = 60.0    # an incarnation's RSS is taken as its baseline this long after it started
RSS_JUDGED_S = 300.0   # ... and judged against its last sample when that is at least this much later
SINKS = ("typed", "kafka")


def _sum(slices: list[dict], sink: str, field: str) -> int:
    return sum(s["audits"].get(sink, {}).get(field, 0) for s in slices)


def _eos(results: dict, sink: str) -> dict:
    """0 lost, 0 duplicates, 0 unexpected over every slice, and the slices cover every record acknowledged."""
    s, acked = results["slices"], results["producer"].get("acked")
    opening = results.get("opening")
    if opening is not None and acked is not None:  # the opening backlog's records are audited too
        acked = acked + opening["acked"] if "acked" in opening else None
    row = {f: _sum(s, sink, f) for f in ("acked", "processed_unique", "lost", "duplicates", "unexpected", "pending",
                                          "outside_window", "duplicates_beyond_dedup_window", "dead_lettered")}
    row["producer_acked"] = acked
    row["slices"] = len(s)
    row["ok"] = (bool(s) and row["lost"] == row["duplicates"] == row["unexpected"] == row["pending"] == 0
                 and acked is not None and row["acked"] == acked
                 and row["processed_unique"] + row["dead_lettered"] == acked)
    return row


def _lag(results: dict) -> list[dict]:
    """For each fault: seconds from its end until every group's lag was under the bound."""
    bound = max(2 * results["config"]["rate"], 500)
    rows = []
    for f in (e for e in results["timeline"] if e.get("kind") in KINDS):
        after = [s for s in results["samples"] if s["t"] >= f["end_t"] and set(s["lag"]) == set(results["groups"])
                 and all(v < bound for v in s["lag"].values())]
        took = round(after[0]["t"] - f["end_t"], 1) if after else None
        rows.append({"t": f["t"], "kind": f["kind"], "target": f["target"], "recovered_s": took, "bound": bound,
                     "ok": took is not None and took <= LAG_RECOVERY_S})
    return rows


def _rss(results: dict) -> list[dict]:
    """Per process incarnation: its RSS after warm-up against its last sample. Judged (``ok`` True/False)
    only when it lived ``RSS_JUDGED_S`` past its warm-up: over a minute or two, a catch-up burst after a
    fault (buffers librdkafka and asyncpg keep) is larger than any leak, and says nothing of one;
    shorter ones are shown (``ok`` None)."""
    rows = []
    for name, m in results["members"].items():
        for i, inc in enumerate(m["incarnations"], 1):
            warm = [(t, kb) for t, kb in inc["rss"] if t >= inc["started"] + RSS_WARMUP_S]
            if len(warm) < 2:
                continue
            growth = (warm[-1][1] - warm[0][1]) / warm[0][1]
            judged = warm[-1][0] - warm[0][0] >= RSS_JUDGED_S
            rows.append({"member": name, "incarnation": i, "from_t": warm[0][0], "to_t": warm[-1][0],
                         "rss_kb_warm": warm[0][1], "rss_kb_last": warm[-1][1], "growth": round(growth, 4),
                         "ok": growth < RSS_GROWTH if judged else None})
    return rows


def judges_rss(minutes: float) -> bool:
    """Whether a soak of ``minutes`` is long enough to judge RSS (every member must then be judged)."""
    return minutes * 60 >= RSS_WARMUP_S + RSS_JUDGED_S + 60


def _unjudged(results: dict, rss: list[dict]) -> list[str]:
    """In a run long enough to judge RSS, the members none of whose incarnations was judged."""
    if not judges_rss(results["config"]["minutes"]):
        return []
    judged = {r["member"] for r in rss if r["ok"] is not None}
    return [name for name in results["members"] if name not in judged]


def _bounded(results: dict) -> list[dict]:
    """Rows at the end ≤ (retention + 2 × partition width + slack) × rate × 1.5; the ledger's slack adds the
    producer's ledger flush interval (rows are written, and expired partitions dropped, at least that often)."""
    from kdg.produce import LEDGER_FLUSH_S

    cfg, end = results["config"], (results["tables"] or [{}])[-1]
    rows = []
    for name, retention, extra in (("claims", cfg["dedup_retention"], 5.0),
                                   ("ledger", cfg["ledger_retention"], 5.0 + LEDGER_FLUSH_S)):
        ms = parse_retention(retention, "--ledger-retention")
        window_s = ms / 1000 + 2 * width_for(ms) / 1000 + extra
        bound = int(window_s * cfg["rate"] * 1.5)
        at_end = end.get(f"{name}_rows")
        peak = max((t.get(f"{name}_rows") or 0 for t in results["tables"]), default=None)
        formula = f"({window_s:.1f} s) × {cfg['rate']:g}/s × 1.5"
        rows.append({"table": name, "retention": retention, "formula": formula,
                     "bound": bound, "rows_at_end": at_end, "peak_rows": peak,
                     "bytes_at_end": end.get(f"{name}_bytes"), "ok": at_end is not None and at_end <= bound})
    return rows


def judge(results: dict) -> dict:
    faults = [e for e in results["timeline"] if e.get("kind") in KINDS]
    fired = {k: sum(1 for f in faults if f["kind"] == k and f["fired"]) for k in KINDS}
    checks = {
        "faults": {"fired": fired, "not_fired": [f"{f['kind']} at {f['t']:.0f} s" for f in faults if not f["fired"]],
                   "ok": all(fired.values()) and all(f["fired"] for f in faults)},
        "processes": {"failures": results["failures"] + [f["failure"] for f in faults if f.get("failure")]},
        "exactly_once": {sink: _eos(results, sink) for sink in SINKS},
        "control": {f: _sum(results["slices"], "alo", f) for f in ("acked", "lost", "duplicates", "unexpected")},
        "rss": _rss(results), "bounded": _bounded(results), "lag_recovery": _lag(results)}
    checks["processes"]["ok"] = not checks["processes"]["failures"]
    checks["control"]["present"] = bool(results["slices"]) and all("alo" in s["audits"] for s in results["slices"])
    failed = [name for name, ok in (
        ("faults", checks["faults"]["ok"]), ("processes", checks["processes"]["ok"]),
        ("exactly-once", all(checks["exactly_once"][s]["ok"] for s in SINKS)),
        ("rss", all(r["ok"] is not False for r in checks["rss"]) and not _unjudged(results, checks["rss"])),
        ("bounded", all(r["ok"] for r in checks["bounded"])),
        ("lag-recovery", all(r["ok"] for r in checks["lag_recovery"]))) if not ok]
    checks["failed"] = failed
    checks["passed"] = not failed
    return checks


def check_rows(results: dict) -> list[tuple[str, bool | None, str]]:
    """(check, passed — None: shown only, detail) for the table and the page."""
    c, rows = results["checks"], []
    add = lambda name, ok, detail: rows.append((name, ok, detail))  # noqa: E731
    add("faults fired", c["faults"]["ok"], ", ".join(f"{k} ×{n}" for k, n in c["faults"]["fired"].items())
        + (f"; not fired: {', '.join(c['faults']['not_fired'])}" if c["faults"]["not_fired"] else ""))
    add("processes", c["processes"]["ok"], "; ".join(c["processes"]["failures"])[:800] or "every exit was clean")
    for sink, e in c["exactly_once"].items():
        add(f"exactly-once {sink}", e["ok"], f"acked {e['acked']:,} of the producer's {e['producer_acked']}, "
            f"unique {e['processed_unique']:,}, lost {e['lost']}, duplicates {e['duplicates']}, unexpected "
            f"{e['unexpected']}, pending {e['pending']}, beyond dedup window {e['duplicates_beyond_dedup_window']}"
            f" ({e['slices']} slices)")
    ctl = c["control"]
    add("at-least-once control", None, f"lost {ctl['lost']}, duplicates {ctl['duplicates']}, "
        f"unexpected {ctl['unexpected']}")
    for r in c["rss"]:
        add(f"RSS {r['member']} #{r['incarnation']}", r["ok"], f"{r['rss_kb_warm'] / 1024:.0f} → "
            f"{r['rss_kb_last'] / 1024:.0f} MB ({r['growth']:+.1%}, {r['from_t']:.0f}–{r['to_t']:.0f} s)"
            + ("" if r["ok"] is not None else f"; shown, not judged: under {RSS_JUDGED_S:.0f} s after warm-up"))
    if not c["rss"]:
        add("RSS", None, "no incarnation lived past its warm-up")
    if missing := _unjudged(results, c["rss"]):
        add("RSS judged", False, f"no incarnation of {', '.join(missing)} lived {RSS_JUDGED_S:.0f} s past warm-up")
    for r in c["bounded"]:
        add(f"bounded {r['table']}", r["ok"], f"{r['rows_at_end']} rows at the end (peak {r['peak_rows']}) ≤ "
            f"{r['bound']:,} = {r['formula']}")
    for r in c["lag_recovery"]:
        took = "never" if r["recovered_s"] is None else f"{r['recovered_s']:.0f} s"
        add(f"lag after {r['kind']}", r["ok"], f"at {r['t']:.0f} s on {r['target']}: under {r['bound']:g} in {took} "
            f"(≤ {LAG_RECOVERY_S:g} s)")
    return rows


def _title(results: dict) -> str:
    cfg = results["config"]
    return (f"kdg chaos soak — {cfg['minutes']:g} min at {cfg['rate']:g}/s, seed {cfg['seed']} — "
            f"{'PASS' if results['checks']['passed'] else 'FAIL'}")


def summary_table(results: dict) -> Table:
    table = Table(title=_title(results), title_justify="left")
    for col in ("check", "result", "detail"):
        table.add_column(col)
    for name, ok, detail in check_rows(results):
        table.add_row(name, "shown" if ok is None else "[ok]PASS[/ok]" if ok else "[bad]FAIL[/bad]", detail)
    return table


def _chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples, tables = results["samples"], results["tables"]
    fig, axes = plt.subplots(4, 1, figsize=(12, 11), sharex=True)
    ts = [s["t"] for s in samples]
    for name in [n for n, m in results["members"].items() if m["role"] != "producer"]:
        pts = [(s["t"], s["written"][name]) for s in samples if name in s["written"]]
        rate = [(b[0], max(b[1] - a[1], 0) / (b[0] - a[0])) for a, b in zip(pts, pts[1:]) if b[0] > a[0]]
        axes[0].plot([t for t, _ in rate], [r for _, r in rate], lw=1, label=name)
    for group in results["groups"]:
        axes[1].plot(ts, [s["lag"].get(group) for s in samples], lw=1, label=group)
    for name in results["members"]:
        axes[2].plot(ts, [(s["rss_kb"].get(name) or float("nan")) / 1024 for s in samples], lw=1, label=name)
    for key, label in (("claims_rows", "kdg_dedup (typed table's claims)"), ("ledger_rows", "kdg_ledger (topic)")):
        axes[3].plot([t["t"] for t in tables], [t.get(key) for t in tables], marker=".", lw=1, label=label)
    for ax, ylabel in zip(axes, ("records written/s", "lag (records)", "RSS (MB)", "rows")):
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7, loc="upper left")
        for f in (e for e in results["timeline"] if e.get("kind") in KINDS):
            ax.axvline(f["t"], color="#c0392b" if f["fired"] else "#7f8c8d", lw=0.8, ls="--")
    for f in (e for e in results["timeline"] if e.get("kind") in KINDS):
        axes[0].annotate(f"{f['kind']}\n{f['target']}", (f["t"], 1), xycoords=("data", "axes fraction"),
                         fontsize=6, rotation=90, va="top", ha="right", color="#c0392b")
    axes[-1].set_xlabel("s since start")
    fig.suptitle("Soak timeline; dashed lines are faults")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(results: dict, out_dir: Path) -> Path:
    """results.json, timeline.png and a self-contained index.html in ``out_dir``; the page's path."""
    from kdg.chaos.report import _img, write_results

    out_dir.mkdir(parents=True, exist_ok=True)
    write_results(results, out_dir)
    chart = out_dir / "timeline.png"
    _chart(results, chart)
    e = html.escape
    events = "".join(f"<tr><td>{ev['t']:.1f}</td><td>{e(ev.get('kind', ''))}</td><td>{e(ev.get('target', ''))}</td>"
                     f"<td>{ev.get('fired', '')}</td><td>{e(str(ev.get('note', '')))}</td></tr>"
                     for ev in results["timeline"])
    checks = "".join(f"<tr class={'' if ok is None else 'pass' if ok else 'fail'}><td>{e(name)}</td>"
                     f"<td>{'shown' if ok is None else 'PASS' if ok else 'FAIL'}</td><td>{e(detail)}</td></tr>"
                     for name, ok, detail in check_rows(results))
    page = out_dir / "index.html"
    page.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>kdg chaos soak</title><style>
body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:4px 6px}} img{{max-width:100%}}
tr.pass td{{background:#eafaf1}} tr.fail td{{background:#fdedec}}</style></head><body>
<h1>{e(_title(results))}</h1>
<p>{e(results['started_at'])} · {e(results['machine'])} · {results['duration_s']:.0f} s · topic {e(results['topic'])}</p>
<table><tr><th>check</th><th>result</th><th>detail</th></tr>{checks}</table>
<h2>Timeline</h2>{_img(chart, 'soak timeline')}
<table><tr><th>t (s)</th><th>kind</th><th>target</th><th>fired</th><th>note</th></tr>{events}</table>
</body></html>""")
    return page
