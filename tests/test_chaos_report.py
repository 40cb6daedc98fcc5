"""The chaos report renders real files a person can open: a page, valid PNG charts, the raw JSON."""

import json
import struct

from rich.console import Console

from kdg.chaos.report import summary_table, write_report


def _cell(guarantee, fault, verdict, note, lost=0, dups=0):
    return {"guarantee": guarantee, "fault": fault, "repetition": 1, "acked": 1000, "failed": 0,
            "processed_unique": 1000 - lost, "rows": 1000 - lost + dups, "lost": lost, "duplicates": dups,
            "unexpected": 0, "produce_msgs_per_s": 9000.0, "consume_msgs_per_s": 4000.0, "duration_s": 12.0,
            "verdict": verdict, "note": note, "fault_fired": True, "zombie_refused_batches": 0,
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
    assert html.count("class=fail") == 1 and html.count("class=pass") == 2


def test_summary_table():
    console = Console(record=True, width=200)
    console.print(summary_table(RESULTS))
    text = console.export_text()
    assert "consumer-kill" in text and "FAIL" in text and "allowed by at-least-once" in text
