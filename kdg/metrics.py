"""``--metrics-port``: Prometheus metrics (through ``prometheus-client``) and health on one HTTP port.

``/metrics`` is Prometheus's text format; ``/healthz`` answers 200 while the command's loop keeps
turning; ``/readyz`` answers 200 only when it is connected to both ends (a consumer: holding
partitions, Postgres reachable; a producer: its producer initialised) and not stopping, else 503
with the reason. Names follow Prometheus's conventions (base units, ``_total`` counters) and every
series carries the ``guarantee`` label. ``docs/grafana-dashboard.json`` draws them.

Per-record work stays off the hot path: counts arrive once per batch, lag once a second.
"""

import threading
import time
from collections import Counter as Tally
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from socketserver import ThreadingMixIn

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics,
                               make_wsgi_app)

from kdg.errors import UsageError

BATCH_BUCKETS = (1, 10, 100, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000)
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
STALE_LOOP_S = 120.0  # /healthz fails when the loop has not turned for this long (waits for Postgres beat too)
LAG_EVERY_S = 1.0

disable_created_metrics()  # no *_created series: a dashboard has no use for them


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # a scrape every few seconds is not news
        pass


class Metrics:
    """One command's metrics, served on ``port`` while :meth:`serve` runs; without a port, a cheap no-op."""

    def __init__(self, command: str, guarantee: str, port: int | None = None, host: str = "0.0.0.0",
                 stop_requested: Callable[[], bool] = lambda: False):
        """``stop_requested``: whether a signal asked the command to stop (``/readyz`` says 503 from that moment,
        not only once the loop next looks)."""
        self.enabled = port is not None
        self.stop_requested = stop_requested
        self.command, self.guarantee, self.port, self.host = command, guarantee, port, host
        self.registry = CollectorRegistry()
        self.beat = time.monotonic()
        self.stopping = False
        self.not_ready = "starting"  # why /readyz says 503; None when ready
        self._lag_due = 0.0
        self._server: _Server | None = None
        self._define()

    # -- definitions --------------------------------------------------------------------------
    def _define(self) -> None:
        reg, g = self.registry, ["guarantee"]
        tp, t = g + ["topic", "partition"], g + ["topic"]
        self.read = Counter("kdg_records_read", "Records read from Kafka.", tp, registry=reg)
        self.written = Counter("kdg_records_written", "Records the sink wrote (rows, or records sent on).", t,
                               registry=reg)
        self.table_rows = Counter("kdg_table_rows_written", "Rows written, per Postgres table (a pipeline's routes "
                                  "write several).", g + ["table"], registry=reg)
        self.deduplicated = Counter("kdg_records_deduplicated", "Records exactly-once recognised as already "
                                    "written, and left out.", t, registry=reg)
        self.dead_lettered = Counter("kdg_records_dead_lettered", "Records sent to the dead-letter topic.", t,
                                     registry=reg)
        self.dead_reasons = Counter("kdg_dead_letters_by_reason", "Records sent to the dead-letter topic, by reason "
                                    "class (oversize, bad JSON, postgres refused the row: SQLSTATE ...).",
                                    t + ["reason"], registry=reg)
        self.superseded = Counter("kdg_records_superseded", "Records an upsert left out for a later version of "
                                  "their key in the same batch.", t, registry=reg)
        self.deleted = Counter("kdg_records_deleted", "Tombstones and change-data-capture deletes applied.", t,
                               registry=reg)
        self.filtered = Counter("kdg_records_filtered", "Records left out on purpose (a tombstone under "
                                "on_tombstone = ignore).", t, registry=reg)
        self.schema_changes = Counter("kdg_schema_changes", "Changes the records' schema made, or asked of, a table "
                                      "(change: added, widened, NOT NULL dropped, not followed, ...).",
                                      g + ["table", "change"], registry=reg)
        self.mapping_field_gauge = Gauge("kdg_mapping_fields", "A typed sink's mapping against its records: mapped "
                                         "fields no record of a batch had (kind=absent), fields no column maps "
                                         "(kind=unmapped).", t + ["kind"], registry=reg)
        self.stepped_over = Counter("kdg_records_stepped_over", "`kdg doctor` probe records read and stepped over.",
                                    t, registry=reg)
        self.skipped = Counter("kdg_records_skipped", "Records read and dropped: a batch of partitions this member "
                               "no longer held (read again by their owner), or lost in a Postgres outage "
                               "(at-most-once).", tp + ["reason"], registry=reg)
        self.lag = Gauge("kdg_consumer_lag_records", "Records between the group's position and the end of the "
                         "partition (its high watermark, or last stable offset under read_committed).", tp,
                         registry=reg)
        self.assigned = Gauge("kdg_assigned_partitions", "Partitions this member holds.", t, registry=reg)
        self.batch_records = Histogram("kdg_batch_records", "Records per batch.", t, buckets=BATCH_BUCKETS,
                                       registry=reg)
        self.commit_seconds = Histogram("kdg_commit_duration_seconds", "From handing a batch to the sink to its "
                                        "write and offsets being committed.", t, buckets=SECONDS_BUCKETS,
                                        registry=reg)
        self.e2e_seconds = Histogram("kdg_end_to_end_latency_seconds", "From a record's Kafka timestamp to its "
                                     "batch being committed (the oldest record of each partition's part of a "
                                     "batch).", t, buckets=SECONDS_BUCKETS, registry=reg)
        self.pg_outages = Counter("kdg_postgres_outages", "Times Postgres went away mid-run.", g, registry=reg)
        self.pg_outage_seconds = Counter("kdg_postgres_outage_seconds", "Seconds spent waiting for Postgres to "
                                         "come back.", g, registry=reg)
        self.rebalances = Counter("kdg_rebalances", "Partitions assigned to or revoked from this member.",
                                  t + ["kind"], registry=reg)
        self.sent = Counter("kdg_records_sent", "Records the producer sent.", t, registry=reg)
        self.acked = Counter("kdg_records_acked", "Records a broker acknowledged (acks=0: none ever are).", t,
                             registry=reg)
        self.failed = Counter("kdg_records_failed", "Records the producer was told failed.", t, registry=reg)
        self.transactions = Counter("kdg_transactions", "Producer transactions, by outcome.", t + ["outcome"],
                                    registry=reg)
        self.ready = Gauge("kdg_ready", "1 when /readyz would answer 200.", g, registry=reg)
        self.ready.labels(self.guarantee).set_function(lambda: 1 if self.reason_not_ready() is None else 0)

    # -- serving ------------------------------------------------------------------------------
    def serve(self) -> "Metrics":
        if not self.enabled:
            return self
        try:
            self._server = make_server(self.host, self.port, self._app, server_class=_Server, handler_class=_Quiet)
        except OSError as exc:
            raise UsageError(f"--metrics-port {self.port}: cannot listen on {self.host}:{self.port}: "
                             f"{exc.strerror or exc}") from None
        self.port = self._server.server_port  # port 0: the one the system chose
        threading.Thread(target=self._server.serve_forever, name="kdg-metrics", daemon=True).start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "Metrics":
        return self.serve()

    def __exit__(self, *exc) -> None:
        self.close()

    def _app(self, environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            stale = time.monotonic() - self.beat
            ok = stale < STALE_LOOP_S
            return _text(start_response, ok, "ok" if ok else f"the loop has not turned for {stale:.0f} s")
        if path == "/readyz":
            reason = self.reason_not_ready()
            return _text(start_response, reason is None, reason or "ready")
        return self._metrics_app(environ, start_response)

    @property
    def _metrics_app(self):
        app = getattr(self, "_wsgi", None)
        if app is None:
            app = self._wsgi = make_wsgi_app(self.registry)
        return app

    def reason_not_ready(self) -> str | None:
        return "stopping" if self.stopping or self.stop_requested() else self.not_ready

    # -- what the loops report ----------------------------------------------------------------
    def turned(self) -> None:
        self.beat = time.monotonic()

    def started(self, topic: str) -> None:
        """Every counter of ``topic`` at 0 from the start, so a dashboard's panels show 0, not "No data"."""
        if not self.enabled:
            return
        g = self.guarantee
        if self.command == "produce":
            for counter in (self.sent, self.acked, self.failed):
                counter.labels(g, topic)
            return
        for counter in (self.written, self.deduplicated, self.dead_lettered, self.superseded, self.deleted,
                        self.filtered, self.stepped_over):
            counter.labels(g, topic)
        self.pg_outages.labels(g)
        self.pg_outage_seconds.labels(g)
        for kind in ("absent", "unmapped"):
            self.mapping_field_gauge.labels(g, topic, kind)

    def settled(self, batch, result, topic: str, seconds: float) -> None:
        """A batch the sink committed: its counts, size, commit time and records' age."""
        if not self.enabled:
            return
        g = self.guarantee
        read: Tally = Tally((rec.topic, rec.partition) for rec, _, *_ in batch.dead)
        read.update(batch.topic_partitions())
        read.update(batch.probes)
        oldest = batch.first_timestamps
        for (t, p), n in read.items():
            self.read.labels(g, t, str(p)).inc(n)
        self.written.labels(g, topic).inc(result.written)
        for table, part in result.tables.items():
            self.table_rows.labels(g, table).inc(part.written)
        self.deduplicated.labels(g, topic).inc(result.duplicates_suppressed)
        self.dead_lettered.labels(g, topic).inc(len(batch.dead) + result.dead_lettered)
        self.superseded.labels(g, topic).inc(result.superseded)
        self.deleted.labels(g, topic).inc(result.deleted)
        self.filtered.labels(g, topic).inc(result.filtered + batch.filtered)
        self.stepped_over.labels(g, topic).inc(len(batch.probes))
        if batch.dead or result.dead_reasons:
            from kdg.sinks.dead_letters import tally

            for reason, n in (tally(batch.dead) + result.dead_reasons).items():
                self.dead_reasons.labels(g, topic, reason).inc(n)
        self.batch_records.labels(g, topic).observe(len(batch))
        self.commit_seconds.labels(g, topic).observe(seconds)
        now_ms = time.time() * 1000
        for ts in oldest.values():
            if ts > 0:
                self.e2e_seconds.labels(g, topic).observe(max(now_ms - ts, 0) / 1000)

    def dropped(self, batch, topic: str, reason: str) -> None:
        if not self.enabled:
            return
        for (t, p), n in Tally(batch.topic_partitions()).items():
            self.skipped.labels(self.guarantee, t, str(p), reason).inc(n)

    def mapping_fields(self, topic: str, counts: dict[str, int]) -> None:
        if self.enabled:
            for kind, n in counts.items():
                self.mapping_field_gauge.labels(self.guarantee, topic, kind).set(n)

    def schema_changed(self, table: str, change: str) -> None:
        if self.enabled:
            self.schema_changes.labels(self.guarantee, table, change).inc()

    def outage(self, seconds: float) -> None:
        if self.enabled:
            self.pg_outages.labels(self.guarantee).inc()
            self.pg_outage_seconds.labels(self.guarantee).inc(seconds)

    def rebalanced(self, topic: str, kind: str, partitions: list[int], held: int) -> None:
        if self.enabled:
            self.rebalances.labels(self.guarantee, topic, kind).inc(len(partitions))
            self.assigned.labels(self.guarantee, topic).set(held)
            if kind == "assigned":  # a series from 0 for each partition held, so rate() sees its first batch
                for p in partitions:
                    self.read.labels(self.guarantee, topic, str(p))

    def forget(self, topic: str, partitions: list[int]) -> None:
        """Partitions this member gave up: their lag is another member's to report now."""
        if self.enabled:
            for p in partitions:
                try:
                    self.lag.remove(self.guarantee, topic, str(p))
                except KeyError:  # never measured
                    pass

    def lag_due(self) -> bool:
        """Whether it is time to measure lag again (once a second at most)."""
        now = time.monotonic()
        if not self.enabled or now < self._lag_due:
            return False
        self._lag_due = now + LAG_EVERY_S
        return True

    def set_lag(self, lags: dict[tuple[str, int], int]) -> None:
        for (topic, p), n in lags.items():
            self.lag.labels(self.guarantee, topic, str(p)).set(n)

    def produced(self, topic: str, sent: int = 0, acked: int = 0, failed: int = 0) -> None:
        if self.enabled:
            g = self.guarantee
            self.sent.labels(g, topic).inc(sent)
            self.acked.labels(g, topic).inc(acked)
            self.failed.labels(g, topic).inc(failed)

    def transaction(self, topic: str, outcome: str) -> None:
        if self.enabled:
            self.transactions.labels(self.guarantee, topic, outcome).inc()


def _text(start_response, ok: bool, body: str):
    start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
    return [(body + "\n").encode()]
