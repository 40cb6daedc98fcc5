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


def test_every_counter_a_dashboard_draws_has_a_sample_at_0_from_the_start():
    """Before, the outage counters had no sample until the first outage: their panels said "No data"."""
    from prometheus_client import generate_latest

    metrics = Metrics("consume", "exactly-once", port=0)  # enabled, never served here
    metrics.started("orders")
    text = generate_latest(metrics.registry).decode()
    for name in ("written", "superseded", "deleted", "filtered", "deduplicated", "dead_lettered", "stepped_over"):
        assert f'kdg_records_{name}_total{{guarantee="exactly-once",topic="orders"}} 0.0' in text, name
    assert 'kdg_postgres_outages_total{guarantee="exactly-once"} 0.0' in text
    assert 'kdg_postgres_outage_seconds_total{guarantee="exactly-once"} 0.0' in text
