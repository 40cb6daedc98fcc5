"""The Grafana dashboard draws only series kdg serves (pure Python, no server)."""

import json
import re
from pathlib import Path

from kdg.metrics import Metrics

DASHBOARD = Path(__file__).parent.parent / "docs" / "grafana-dashboard.json"


def test_every_series_the_dashboard_queries_is_one_kdg_defines():
    names = {family.name for family in Metrics("consume", "exactly-once").registry.collect()}
    queried = {re.sub(r"_(bucket|sum|count)$", "", n)
               for panel in json.loads(DASHBOARD.read_text())["panels"] for target in panel["targets"]
               for n in re.findall(r"\bkdg_\w+", target["expr"])}
    queried = {n[:-len("_total")] if n.endswith("_total") else n for n in queried}  # counters' family names
    assert queried and queried <= names, sorted(queried - names)
    assert names - queried == set(), f"served but drawn nowhere: {sorted(names - queried)}"
