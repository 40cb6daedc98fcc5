"""The topics a pipeline reads: its listed names (which must exist) and its patterns' matches (which may not yet).

A listed topic that does not exist is waited for like Kafka itself, then refused. A pattern that
matches nothing is not an error: change-data-capture topics appear with their first change. It is
waited for up to the wait timeout, said, and then read as topics appear (within the consumer's
metadata refresh).
"""

import time

from kdg.flow.routes import Router
from kdg.kafka.admin import all_partitions, topic_partitions
from kdg.lifecycle import attempt_s, wait_until_up

NEW_TOPIC_CHECK_S = 5.0  # how often -e looks for topics a pattern took since


class PipelineTopics:
    """The topics read, with their partitions; refreshed from the cluster as a pattern's topics appear."""

    def __init__(self, router: Router, bootstrap: str, extra: dict, wait_timeout: float, shutdown, notice):
        self.router, self.bootstrap, self.extra = router, bootstrap, extra
        self.wait_timeout, self.shutdown, self.notice = wait_timeout, shutdown, notice
        self.partitions: dict[str, list[int]] = {}
        self._checked = 0.0

    def wait(self) -> dict[str, list[int]]:
        """Wait for Kafka and every listed topic (refused if missing), and up to the wait timeout for a
        pattern's first match; the topics found, with their partitions."""
        names = self.router.names
        found = wait_until_up("Kafka", lambda: self._listed(names), self.wait_timeout, self.shutdown, self.notice)
        patterns = [r for r in self.router.routes if r.pattern is not None]
        if patterns and not any(r.pattern is not None and r.takes(t) for r in patterns for t in found):
            shown = ", ".join(f"/{r.pattern}/" for r in patterns)
            self.notice(f"no topic matches {shown} yet; waiting up to {self.wait_timeout:g} s (topics that appear "
                        "later are read as they do)")
            deadline = time.monotonic() + self.wait_timeout
            while time.monotonic() < deadline and not self.shutdown.requested:
                self.shutdown.sleep(1.0)
                found = self._listed(names)
                if any(r.takes(t) for r in patterns for t in found):
                    break
            else:
                self.notice(f"still no topic matches {shown}; reading on, subscribed")
        self.partitions = found
        return found

    def _listed(self, names: list[str]) -> dict[str, list[int]]:
        timeout = attempt_s(self.wait_timeout, self.shutdown)
        patterns = any(r.pattern is not None for r in self.router.routes)
        every = all_partitions(self.bootstrap, self.extra, timeout) if patterns else {}
        for name in names:  # each asked for by name: a topic this user may not see is named so, not "missing"
            every[name] = topic_partitions(self.bootstrap, name, self.extra, timeout)
        taken = {t: parts for t, parts in every.items() if self.router.takes(t)}
        self.router.resolve(taken)  # a topic two routes take, or whose table cannot be named: refused now
        return taken

    def current(self) -> dict[str, list[int]]:
        """The topics read now: a pattern's new ones looked for every few seconds."""
        if any(r.pattern is not None for r in self.router.routes) and \
                time.monotonic() - self._checked >= NEW_TOPIC_CHECK_S:
            self._checked = time.monotonic()
            self.partitions = self._listed(self.router.names)
        return self.partitions
