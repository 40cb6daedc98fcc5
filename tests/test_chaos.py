"""`kdg chaos` against the real test stack: a short matrix and every seed scenario.

The matrix asserts the outcome rules AND that the faults were real: each fired, and the weaker
guarantees showed their anomaly somewhere.
"""

import pytest

from kdg.chaos.injectors import INJECTORS
from kdg.chaos.run import run_chaos
from kdg.chaos.scenarios import SCENARIOS, run_scenario
from kdg.stack import cluster


@pytest.fixture(scope="module")
def matrix(stack):
    results = run_chaos(stack, guarantees=["at-most-once", "at-least-once", "exactly-once"],
                        faults=list(INJECTORS), messages=400, repeat=1, sink="postgres")
    yield {(c["guarantee"], c["fault"]): c for c in results["cells"]}
    assert cluster.status(stack, with_quorum=False).healthy  # every fault restored what it broke


def test_every_cell_keeps_its_guarantee(matrix):
    failed = {k: c["note"] for k, c in matrix.items() if c["verdict"] != "PASS"}
    assert not failed
    assert len(matrix) == 3 * len(INJECTORS)


def test_every_fault_fired(matrix):
    # acks=0 asks for no acknowledgement, so there is none for the proxy to drop
    silent = [k for k, c in matrix.items() if not c["fault_fired"] and k != ("at-most-once", "ack-loss")]
    assert not silent, {k: matrix[k]["timeline"] for k in silent}
    refused = [(k, e["event"]) for k, c in matrix.items() for e in c["timeline"] if "exited 2" in e["event"]]
    assert not refused  # no cell may "pass" because kdg rejected its own settings


def test_the_weaker_guarantees_show_their_anomalies(matrix):
    assert matrix[("at-most-once", "consumer-kill")]["lost"] > 0
    assert matrix[("at-least-once", "consumer-kill")]["duplicates"] > 0
    assert matrix[("at-least-once", "ack-loss")]["duplicates"] > 0
    assert sum(c["lost"] + c["duplicates"] for (g, _), c in matrix.items() if g == "exactly-once") == 0


def test_exactly_once_fences_the_zombie(matrix):
    cell = matrix[("exactly-once", "consumer-pause")]
    assert cell["fault_fired"] and (cell["lost"], cell["duplicates"]) == (0, 0)
    assert cell["zombie_refused_batches"] >= 1, cell["timeline"]  # the fence, not luck, kept it exactly-once


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_ends_as_the_story_predicts(stack, name):
    result = run_scenario(stack, name, echo=None)
    assert result["as_expected"], result
    assert cluster.status(stack, with_quorum=False).healthy
