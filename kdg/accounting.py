"""Where every record read ended, and when too many dead letters stop a run.

Each record a consumer reads ends in exactly one bucket, so that ``read`` is their sum:

    written        a row written (inserted or updated), or a record sent on
    superseded     an upsert's earlier version of a key in the same batch (the later one is written)
    deleted        a tombstone or a change-data-capture delete applied
    filtered       left out on purpose (a tombstone under ``on_tombstone = ignore``)
    duplicates     exactly-once: its idempotency key was written before
    dead_lettered  sent to ``TOPIC.dlq``, counted by reason class
    stepped_over   a ``kdg doctor`` probe record

A dead letter is one record's problem; many of them are the pipeline's (a wrong mapping, a wrong format).
``--max-dead-letters`` says where one becomes the other:

    >>> limit = parse_dead_letter_limit("10%")
    >>> limit.exceeded(dead=9, read=10), limit.exceeded(dead=11, read=200), limit.exceeded(dead=11, read=50)
    (False, False, True)
"""

import functools
from collections import Counter
from dataclasses import dataclass

from kdg.errors import UsageError

DEFAULT_DEAD_LETTER_LIMIT = "10%"
# a share is judged only past this many dead letters: 1 bad record of the first 3 read is not 33 % of a topic
SHARE_FLOOR = 10
NOTICE_EVERY = 100  # a status line at the first dead letter, then every this many


@dataclass(frozen=True)
class DeadLetterLimit:
    """``--max-dead-letters``: a count (``N``), a share of the records read (``P%``), or none (``all``)."""

    text: str
    count: int | None = None
    percent: float | None = None

    def exceeded(self, dead: int, read: int) -> bool:
        if self.count is not None:
            return dead > self.count
        if self.percent is not None:
            return dead > SHARE_FLOOR and dead * 100 > self.percent * read
        return False

    def describe(self) -> str:
        if self.count is not None:
            return f"more than {self.count:,}"
        if self.percent is not None:
            return f"more than {self.percent:g} % of the records read (and more than {SHARE_FLOOR})"
        return "never"


@functools.cache
def parse_dead_letter_limit(text: str | None) -> DeadLetterLimit:
    """``N`` (0: stop at the first dead letter), ``P%`` (0 < P ≤ 100) or ``all``; anything else is a usage error."""
    text = (text if text is not None else DEFAULT_DEAD_LETTER_LIMIT).strip()
    if text == "all":
        return DeadLetterLimit(text)
    try:
        if text.endswith("%"):
            percent = float(text[:-1])
            if 0 < percent <= 100:
                return DeadLetterLimit(text, percent=percent)
        elif int(text) >= 0:
            return DeadLetterLimit(text, count=int(text))
    except ValueError:
        pass
    raise UsageError(f"--max-dead-letters {text!r}: use a count (0 stops at the first), a share of the records "
                     "read such as 10%, or all")


def dead_letter_status(dead: int, read: int, reasons: Counter, topic: str) -> str:
    """One line: how many dead letters so far, of how many read, by reason, and where they are."""
    share = f" ({dead * 100 / read:.0f} %)" if read else ""
    parts = ", ".join(f"{n:,} {reason}" for reason, n in reasons.most_common(4))
    more = len(reasons) - 4
    return (f"dead letters: {dead:,} of {read:,} records read{share} in {topic}.dlq: {parts}"
            + (f", and {more} other reasons" if more > 0 else ""))


def crossed(before: int, after: int) -> bool:
    """Whether a dead-letter count going from ``before`` to ``after`` is due a status line."""
    return after > before and (before == 0 or before // NOTICE_EVERY != after // NOTICE_EVERY)
