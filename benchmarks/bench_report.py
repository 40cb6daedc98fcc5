"""What `make bench` shows: one table of every throughput row, the latency table, and a chart of both."""

import os
import textwrap

BEHIND_S = 2.0  # the last record seen later than this after the producer finished: the consumer fell behind


def _num(value, fmt: str = ",.0f") -> str:
    return "—" if value is None else format(value, fmt)


def print_table(rows: list[dict], startup: dict) -> None:
    """Every row: kdg and its reference (rate, CPU-s per million records, Postgres's too), the ratio of the
    rates, and the baseline's figures when it was measured."""
    baseline = any("baseline" in r for r in rows)
    head = ("| what | kdg | reference | ratio | kdg CPU-s/M | ref CPU-s/M | kdg Postgres CPU-s/M | "
            "ref Postgres CPU-s/M |" + (" kdg, baseline | ratio, baseline | CPU-s/M, baseline |" if baseline else ""))
    print("\n" + head)
    print("|" + "---|" * head.count(" |"))
    for r in rows:
        k, ref = r["kdg"], r["reference"]
        cpu = " (CPU)" if r.get("ratio_of") == "cpu_s_per_m" else ""
        line = (f"| {r['what']} | {_num(k['median'])} | {ref['what']} {_num(ref['median'])} | {r['ratio']:.2f}{cpu} "
                f"| {_num(k.get('cpu_s_per_m'), '.1f')} | {_num(ref.get('cpu_s_per_m'), '.1f')} "
                f"| {_num(k.get('pg_cpu_s_per_m'), '.1f')} | {_num(ref.get('pg_cpu_s_per_m'), '.1f')} |")
        if baseline:
            b = r.get("baseline")
            line += (f" {_num(b['kdg']['median'])} | {b['ratio']:.2f} | {_num(b['kdg'].get('cpu_s_per_m'), '.1f')} |"
                     if b else " — | — | — |")
        print(line)
    print("\nCPU-s/M: CPU seconds per million records of the process (user + system, all threads, its startup "
          f"included: a kdg process spends {startup['cpu_s']} s CPU / {startup['wall_s']} s wall before its first "
          "record, kdg produce --count 1); Postgres: the server's processes over the same run.")
    print(f"what bounds each figure (medians: process CPU s / wall s; machine busy cores of {os.cpu_count()}):")
    for r in rows:
        for label, m in (("kdg", r["kdg"]), (r["reference"]["what"], r["reference"])):
            rss = f", peak RSS {m['peak_rss_mb']:.0f} MB" if m.get("peak_rss_mb") else ""
            print(f"  {r['what']} — {label}: cpu {m['median_cpu_s']} s / wall {m['median_wall_s']} s, "
                  f"machine {m['median_busy_cores']} cores{rss}; runs {m['runs']}")


def print_latency(results: list[dict], defaults: dict) -> None:
    if not results:
        return
    print("\nend-to-end latency, produce (CreateTime) → visible at the sink:")
    print("| guarantee → sink | kdg | p50 ms | p95 ms | p99 ms | max ms | produced /s (target) | sustainable /s "
          "| in the input, p50/p99 ms | input → sink, p50/p99 ms "
          "| seen / sent | consumer CPU-s (per M) | last seen, s after the producer | counts |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    behind = []
    for r in results:
        print(f"| {r['guarantee']} → {r['sink']} | {r['which']} | {_num(r['p50_ms'], '.1f')} "
              f"| {_num(r['p95_ms'], '.1f')} | {_num(r['p99_ms'], '.1f')} | {_num(r['max_ms'], '.1f')} "
              f"| {r['achieved_rate']:,.0f} ({r['target_rate']:,.0f}) | {_num(r.get('sustainable_rate'), ',.0f')} "
              f"| {_stage(r, 'upstream')} | {_stage(r, 'pipeline')} | {r['observed']:,} / {r['sent']:,} "
              f"| {r['consumer_cpu_s']} ({r['consumer_cpu_s_per_m']}) | {r['last_seen_after_producer_s']} "
              f"| {r['verdict']}{_exit_note(r)} |")
        if r["last_seen_after_producer_s"] > BEHIND_S:
            behind.append(f"{r['guarantee']} → {r['sink']} ({r['which']})")
    if behind:
        print(f"NOT KEEPING UP: {', '.join(behind)} saw their last record more than {BEHIND_S:g} s after the "
              "producer finished: the consumer fell behind the rate, so these latencies measure a backlog and grow "
              "with --latency-seconds.")
    print(f"kdg consume as run here (its defaults unless --latency-batch-ms): one sink transaction (exactly-once: "
          f"rows or output records with the offsets) "
          f"per batch of up to {defaults['consume_batch_size']} records or {defaults['consume_poll_timeout_s']} s "
          f"of polling; kdg produce exactly-once commits every {defaults['produce_txn_interval_ms']} ms "
          f"(or {defaults['produce_txn_size']} records). Consumer CPU includes its startup and warm-up. "
          "The two stages are stamped per record by two watchers on one clock: a read_committed reader of the "
          "input topic, and the sink's.")


def _stage(r: dict, stage: str) -> str:
    """A stage's p50/p99: 'upstream' (produce → visible in the input topic, the producer's and brokers' share)
    or 'pipeline' (visible in the input → at the sink, kdg consume's share); '—' in results from before them."""
    got = r.get(stage) or {}
    return f"{_num(got.get('p50_ms'), '.0f')} / {_num(got.get('p99_ms'), '.0f')}"


def _exit_note(r: dict) -> str:
    """kdg consume is stopped with SIGINT once everything is seen: it should say so and exit 0."""
    if r.get("consumer_exit") == 0 and r.get("consumer_stopped_by") == "SIGINT":
        return ""
    return f"; consumer exited {r.get('consumer_exit')} ({r.get('consumer_stopped_by') or 'no report'})"


def _label(r: dict) -> str:
    return "\n".join(textwrap.wrap(f"{r['what']} — vs {r['reference']['what']}", 48))


def draw_chart(path: str, rows: list[dict], latency: list[dict], title: str) -> None:
    """Bars of each row's ratio (before and after with a baseline) and, if measured, latency percentiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # a CPU ratio (lower is better) stays out of the throughput bars; the table shows it
    panels = [p for p, present in (("ratio", rows), ("latency", latency)) if present]
    if not panels:
        return
    height = max(5.0, 0.75 * len(rows) + 1.5, 0.5 * len(latency) + 3)
    fig, axes = plt.subplots(1, len(panels), figsize=(8.5 * len(panels), height), squeeze=False)
    axes = dict(zip(panels, axes[0]))
    if rows:
        _ratios(axes["ratio"], [r for r in rows if r.get("ratio_of") is None] or rows)
    if latency:
        _latency(axes["latency"], latency)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ratios(ax, rows: list[dict]) -> None:
    baseline = any("baseline" in r for r in rows)
    ys = list(range(len(rows)))[::-1]
    width = 0.38 if baseline else 0.6
    after = [r["ratio"] for r in rows]
    bars = ax.barh([y - (width / 2 if baseline else 0) for y in ys], after, height=width, color="#2b6cb0",
                   label="kdg (this tree)")
    ax.bar_label(bars, fmt="%.2f", padding=3, fontsize=8)
    if baseline:
        before = [r["baseline"]["ratio"] if "baseline" in r else 0 for r in rows]
        bars = ax.barh([y + width / 2 for y in ys], before, height=width, color="#a0aec0", label="kdg --baseline")
        ax.bar_label(bars, labels=[f"{v:.2f}" if v else "" for v in before], padding=3, fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_yticks(ys, [_label(r) for r in rows], fontsize=8)
    ax.set_xlabel("rate of kdg ÷ rate of the reference (higher is better; 1 = as fast)")
    ax.set_title("throughput against references run alongside", fontsize=10)
    ax.set_xlim(0, max(after + [r["baseline"]["ratio"] for r in rows if "baseline" in r] + [1.0]) * 1.2)
    ax.legend(fontsize=8, loc="lower right")


def _latency(ax, results: list[dict]) -> None:
    """One line per run from p50 to max, a marker at each percentile; log scale, the baseline's runs paler."""
    from matplotlib.ticker import FuncFormatter

    ys = list(range(len(results)))[::-1]
    marks = (("p50_ms", "o", "#38a169"), ("p95_ms", "D", "#dd6b20"), ("p99_ms", "s", "#e53e3e"),
             ("max_ms", "|", "black"))
    for y, r in zip(ys, results):
        alpha = 0.45 if r["which"] == "baseline" else 1.0
        if r["p50_ms"] is None:
            continue
        ax.plot([max(r["p50_ms"], 0.1), max(r["max_ms"], 0.1)], [y, y], color="#718096", alpha=alpha, linewidth=1)
        for key, marker, color in marks:
            ax.plot(max(r[key], 0.1), y, marker=marker, color=color, alpha=alpha, linestyle="none",
                    markersize=12 if key == "max_ms" else 8, label=key[:-3] if y == ys[0] else None)
        ax.annotate(f"{r['p50_ms']:.0f}", (max(r["p50_ms"], 0.1), y), textcoords="offset points", xytext=(0, 7),
                    ha="center", fontsize=7, alpha=alpha)
        ax.annotate(f"{r['p99_ms']:.0f}", (max(r["p99_ms"], 0.1), y), textcoords="offset points", xytext=(0, 7),
                    ha="center", fontsize=7, alpha=alpha)
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", which="both", labelsize=7)
    ax.set_yticks(ys, [f"{r['guarantee']} → {r['sink']}" + (" (baseline)" if r["which"] == "baseline" else "")
                       + ("\nFELL BEHIND the rate" if r["last_seen_after_producer_s"] > BEHIND_S else "")
                       for r in results], fontsize=8)
    ax.set_ylim(-0.7, len(results) - 0.3)
    ax.set_xlabel("ms from produce (CreateTime) to visible at the sink, log scale; p50 and p99 written")
    rates = sorted({r["target_rate"] for r in results})
    ax.set_title(f"end-to-end latency, kdg produce → kdg consume, at {', '.join(f'{x:,.0f}' for x in rates)} "
                 "msg/s", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", which="both", alpha=0.3)
