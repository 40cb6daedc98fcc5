"""How long exactly-once claims are kept, decided once per sink table and stored with it.

A duplicate is recognised only while its first claim is kept, so a table's window must cover every
record kdg could be asked to read again: the topic's own lifetime. Kafka drops a record once its whole
segment is older than ``retention.ms``, so a record can be read for up to ``retention.ms + segment.ms``;
that is the default window, read from the broker. A topic that keeps records for ever (``retention.ms``
-1, or compacted) has no such bound, and exactly-once asks for an explicit ``--dedup-retention``.

The window is stored per sink table (:mod:`kdg.store.windows`), so every writer of the table agrees:
a writer that asks for another one is refused, and ``kdg db maintain --table T --dedup-retention D``
changes it for all.
"""

import re
from dataclasses import dataclass

from kdg.errors import UsageError
from kdg.settings import Connection, TableName

FOREVER = "forever"
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_retention(text: str, option: str = "--dedup-retention") -> int | None:
    """``30d``, ``36h``, ``90m``, ``10s``, ``500ms``, ``1w`` → milliseconds; ``forever`` → None."""
    text = text.strip().lower()
    if text == FOREVER:
        return None
    found = _DURATION.fullmatch(text)
    ms = round(float(found.group(1)) * _UNITS[found.group(2)]) if found else 0
    if ms <= 0:
        raise UsageError(f"{option} {text!r}: use a duration such as 7d, 36h, 90m, 10s or 500ms, or '{FOREVER}'")
    return ms


def show(ms: int | None) -> str:
    """``691200000`` → ``8d``; None → ``forever``."""
    if ms is None:
        return FOREVER
    for unit in ("w", "d", "h", "m", "s"):
        if ms % _UNITS[unit] == 0:
            return f"{ms // _UNITS[unit]}{unit}"
    return f"{ms}ms"


def check_dedup_retention(asked: str | None, policy, sink_kind: str) -> None:
    """``--dedup-retention`` is for exactly-once into Postgres, the only writer that claims keys; refused
    (malformed, or where nothing claims) before anything is read."""
    if asked is None:
        return
    parse_retention(asked)
    if not policy.dedup or sink_kind != "postgres":
        raise UsageError(f"--dedup-retention keeps exactly-once claims in Postgres; -g {policy.guarantee.value} "
                         f"into {sink_kind} makes none")


@dataclass(frozen=True)
class TopicLifetime:
    """How long ``topic`` keeps a record readable: ``ms`` (None: for ever) and why."""

    topic: str
    ms: int | None
    why: str


def topic_lifetime(conn: Connection, topic: str) -> TopicLifetime:
    """Read ``retention.ms``, ``segment.ms`` and ``cleanup.policy`` of ``topic`` from the broker."""
    from kdg.kafka.admin import topic_config

    config = topic_config(conn.bootstrap_servers, topic, ("retention.ms", "segment.ms", "cleanup.policy"),
                          conn.extra)
    retention, segment = int(config["retention.ms"]), int(config["segment.ms"])
    if "compact" in config["cleanup.policy"]:
        return TopicLifetime(topic, None, f"cleanup.policy={config['cleanup.policy']} keeps each key's last record")
    if retention < 0:
        return TopicLifetime(topic, None, "retention.ms=-1 keeps records for ever")
    return TopicLifetime(topic, retention + segment,
                         f"retention.ms={show(retention)} + segment.ms={show(segment)} (a whole segment is "
                         "dropped at once)")


def decide_dedup_window(store, conn: Connection, topic: str, table: TableName, asked: str | None,
                        notice=lambda text: None):
    """The claim window of ``table`` for an exactly-once writer reading ``topic``: stored, asked for
    (``--dedup-retention``) or derived from the topic; its claim table made if missing.

    ``notice`` is told what was decided and when the topic outlives the window.
    """
    window = store.claim_window(table)
    for note in window.healed:
        notice(f"warning: {note}")
    lifetime = topic_lifetime(conn, topic)
    wanted = parse_retention(asked) if asked is not None else None
    if window.retention_from is not None:
        if asked is not None and wanted != window.retention_ms:
            raise UsageError(
                f"{table.text} keeps exactly-once claims for {show(window.retention_ms)} (chosen by "
                f"{window.retention_from}); every writer of a table uses its one window. To change it for all: "
                f"kdg db maintain --table {table.text} --dedup-retention {asked}")
    else:
        if asked is not None:
            store.set_retention(window, wanted, "--dedup-retention")
        elif lifetime.ms is None:
            raise UsageError(
                f"topic {topic!r} keeps records for ever ({lifetime.why}), so a record can be read again at any "
                f"time; exactly-once needs to know how long to keep {table.text}'s claims: --dedup-retention 30d "
                "(a record read again after that is written again) or --dedup-retention forever (claims are "
                "never dropped)")
        else:
            store.set_retention(window, lifetime.ms, f"topic {topic}: {lifetime.why}")
        notice(f"{table.text} keeps exactly-once claims for {show(window.retention_ms)} "
               f"(chosen by {window.retention_from})")
    _warn_if_outlived(lifetime, window, notice)
    return window


def _warn_if_outlived(lifetime: TopicLifetime, window, notice) -> None:
    if window.retention_ms is None:
        return
    topic = lifetime.topic
    if lifetime.ms is None or lifetime.ms > window.retention_ms:
        notice(f"warning: topic {topic!r} keeps records longer ({show(lifetime.ms)}: {lifetime.why}) than "
               f"{window.sink_table} keeps exactly-once claims ({show(window.retention_ms)}): a record read "
               "again after that (a replay, a group reset to the beginning) is written again")
