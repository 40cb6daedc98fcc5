"""Range specs of `kdg spark-replay`: parsing and resolving against given watermarks (pure functions)."""

import pytest

from kdg.errors import UsageError
from kdg.spark.ranges import Bound, parse_bound, resolve_range
from kdg.spark.session import master_url

MARKS = {0: (0, 100), 1: (10, 50), 2: (0, 0)}


def _resolve(start, end, stored=None, times=None):
    return resolve_range("t", parse_bound(start), parse_bound(end, "--to"), partitions=[0, 1, 2], watermarks=MARKS,
                         stored=lambda: stored or {}, offsets_for_time=lambda ms: (times or {}).get(ms, {}))


def test_bounds_parse():
    assert parse_bound("earliest") == Bound("earliest")
    assert parse_bound(" 0:120,1:80 ") == Bound("offsets", offsets={0: 120, 1: 80})
    assert parse_bound("@1763805600000") == Bound("timestamp", timestamp_ms=1763805600000)
    assert parse_bound("@2025-11-22T10:00:00").timestamp_ms == 1763805600000  # naive times are UTC
    assert parse_bound("@2025-11-22T11:00:00+01:00").timestamp_ms == 1763805600000


@pytest.mark.parametrize("spec", ["", "0", "0:x", "-1:5", "0:-5", "0:1,0:2", "@yesterday", "first"])
def test_bad_bounds_are_usage_errors(spec):
    with pytest.raises(UsageError):
        parse_bound(spec)


def test_earliest_to_latest_skips_empty_partitions():
    assert _resolve("earliest", "latest") == {0: (0, 100), 1: (10, 50)}


def test_offset_lists_choose_partitions():
    assert _resolve("0:5", "latest") == {0: (5, 100)}
    assert _resolve("earliest", "1:20") == {1: (10, 20)}


def test_stored_offsets_and_partitions_never_stored():
    assert _resolve("stored", "latest", stored={0: 90}) == {0: (90, 100), 1: (10, 50)}
    with pytest.raises(UsageError, match="no offsets are stored"):
        _resolve("stored", "latest")


def test_timestamps_resolve_to_offsets_or_the_end():
    assert _resolve("@1000", "latest", times={1000: {0: 60, 1: -1}}) == {0: (60, 100)}


@pytest.mark.parametrize("start,end,message", [
    ("0:5", "0:101", "past the end"),
    ("1:3", "latest", "no longer in the log"),
    ("0:50", "0:40", "after its end"),
    ("latest", "latest", "nothing to replay"),
    ("5:0", "latest", "no partition 5"),
])
def test_ranges_that_cannot_be_replayed(start, end, message):
    with pytest.raises(UsageError, match=message):
        _resolve(start, end)


def test_local_masters_get_their_task_attempts_from_the_policy():
    assert master_url("local[*]", True) == "local[*,4]"
    assert master_url("local[2,7]", False) == "local[2]"
    assert master_url("local", True) == "local[1,4]"
    assert master_url("spark://host:7077", False) == "spark://host:7077"
