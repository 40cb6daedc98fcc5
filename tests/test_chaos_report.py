"""The chaos report renders real files a person can open: a page, valid PNG charts, the raw JSON."""

import json
import os
import struct
import subprocess
import sys

import pytest

from rich.console import Console

from kdg.chaos.report import load_results, summarize, summary_table, write_report
from kdg.errors import UsageError


def _cell(guarantee, fault, verdict, note, lost=0, dups=0, rep=1, fired=True):
    return {"guarantee": guarantee, "fault": fault, "repetition": rep, "acked": 1000, "failed": 0,
            "processed_unique": 1000 - lost, "rows": 1000 - lost + dups, "lost": lost, "duplicates": dups,
            "unexpected": 0, "produce_msgs_per_s": 9000.0, "consume_msgs_per_s": 4000.0, "duration_s": 12.0,
            "verdict": verdict, "note": note, "fault_fired": fired, "zombie_refused_batches": 0,
            "timeline": [{"t": 2.0, "event": "SIGKILL consumer at after-process-before-commit"}],
            "progress": [{"t": t / 2, "delivered": min(1000, t * 50)} for t in range(40)]}


RESULTS = {"started_at": "2026-11-22T17:00:00+00:00", "machine": "2 cores", "messages": 1000, "repeat": 1,
           "sink": "postgres", "cells": [
               _cell("at-most-once", "consumer-kill", "PASS", "lost: 100, allowed by at-most-once", lost=100),
               _cell("at-least-once", "consumer-kill", "PASS", "duplicates: 50, allowed by at-least-once", dups=50),
               _cell("exactly-once", "consumer-kill", "FAIL", "duplicates: 3 <script>alert(1)</script>", dups=3),
           ]}


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_report_files(tmp_path):
    page = write_report(RESULTS, tmp_path)
    html = page.read_text()
    for name in ("anomalies.png", "throughput.png", "timeline.png"):
        w, h = _png_size(tmp_path / name)
        assert w > 300 and h > 200
    assert json.loads((tmp_path / "results.json").read_text())["cells"][2]["verdict"] == "FAIL"
    assert html.count("data:image/png;base64,") == 3  # self-contained
    assert "lost: 100, allowed by at-most-once" in html
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert html.count("class=fail") == 2 and html.count("class=pass") == 4  # summary rows + every repetition


def test_summary_table():
    console = Console(record=True, width=200)
    console.print(summary_table(RESULTS))
    text = console.export_text()
    assert "consumer-kill" in text and "FAIL" in text and "allowed by at-least-once" in text


def _three_reps():
    cells = []
    for rep, (lost, dups) in enumerate([(300, 0), (0, 0), (100, 0)], start=1):
        note = f"lost: {lost}, allowed by at-most-once" if lost else "nothing lost, nothing duplicated"
        cells.append(_cell("at-most-once", "broker-kill", "PASS", note, lost=lost, rep=rep))
        cells.append(_cell("exactly-once", "broker-kill", "PASS" if rep != 2 else "FAIL",
                           "nothing lost, nothing duplicated" if rep != 2 else "duplicates: 7 — not allowed by exactly-once",
                           dups=7 if rep == 2 else 0, rep=rep, fired=rep != 3))
    return {**RESULTS, "repeat": 3, "cells": cells}


def test_summary_over_repetitions():
    rows = {r["guarantee"]: r for r in summarize(_three_reps())}
    amo, eo = rows["at-most-once"], rows["exactly-once"]
    assert (amo["reps"], amo["fired"], amo["lost"], amo["verdict"]) == (3, 3, 400, "PASS")
    assert amo["lost_per_rep"] == {"min": 0, "median": 100, "max": 300}
    assert amo["note"] == "lost in 2 of 3 reps, allowed by at-most-once"
    assert (eo["fired"], eo["duplicates"], eo["verdict"]) == (2, 7, "FAIL")  # one bad repetition fails the row
    assert eo["note"].startswith("1 of 3 reps broke it: duplicates: 7")
    console = Console(record=True, width=250)
    console.print(summary_table(_three_reps()))
    assert "400 (0–300 per rep, median 100)" in console.export_text()


def test_a_partial_run_is_labelled_as_such(tmp_path):
    partial = {**_three_reps(), "complete": False}
    page = write_report(partial, tmp_path).read_text()
    assert "stopped after 6 cells" in page
    assert load_results(tmp_path / "results.json")["complete"] is False


@pytest.mark.parametrize("content, says", [
    (None, "no such file"),
    ("{not json", "not a chaos results file"),
    ("[1, 2]", "not a JSON object"),
    ('{"cells": []}', r"started_at \(missing\)"),
    (json.dumps({**RESULTS, "cells": None}), r"cells \(not list\)"),
    (json.dumps({**RESULTS, "messages": "2000"}), r"messages \(not int\)"),
    (json.dumps({**RESULTS, "cells": [{"guarantee": "exactly-once"}]}), r"cell 1: fault \(missing\)"),
    (json.dumps({**RESULTS, "cells": [{**RESULTS["cells"][0], "lost": "3"}]}), r"cell 1: lost \(not int\)"),
    (json.dumps({**RESULTS, "cells": [{k: v for k, v in RESULTS["cells"][0].items() if k != "produce_msgs_per_s"}]}),
     r"produce_msgs_per_s \(missing\)"),
    (json.dumps({**RESULTS, "cells": []}), "holds no cells yet"),
])
def test_load_results_refuses_what_is_not_a_results_file(tmp_path, content, says):
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=says):
        load_results(path)


def test_chaos_report_command(tmp_path):
    """`kdg chaos report` renders an interrupted run's file again: page, table, exit 7 for the broken row."""
    (tmp_path / "results.json").write_text(json.dumps({**_three_reps(), "complete": False}))
    proc = subprocess.run([sys.executable, "-m", "kdg", "chaos", "report", str(tmp_path / "results.json"),
                           "--out", str(tmp_path / "page")], capture_output=True, text=True, env={**os.environ, "COLUMNS": "250"})
    assert proc.returncode == 7, proc.stderr
    assert "broke their guarantee" in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / "page" / "index.html").exists() and (tmp_path / "page" / "timeline.png").exists()
    assert not (tmp_path / "page" / "results.json").exists()  # it renders; it never writes a results file
    assert "stopped after 6 cells" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "kdg", "chaos", "report", str(tmp_path / "nope.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no such file" in bad.stderr and "Traceback" not in bad.stderr


def test_chaos_report_in_place_leaves_the_results_file_as_it_was(tmp_path):
    kept = tmp_path / "nightly.json"
    kept.write_text(json.dumps(RESULTS))
    other = tmp_path / "results.json"
    other.write_text('{"another": "run"}')
    before = kept.read_text()
    proc = subprocess.run([sys.executable, "-m", "kdg", "chaos", "report", str(kept), "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 7, proc.stderr  # RESULTS holds a FAIL cell
    assert json.loads(proc.stdout)["summary"][2]["verdict"] == "FAIL"
    assert kept.read_text() == before and other.read_text() == '{"another": "run"}'
    assert (tmp_path / "index.html").exists()
