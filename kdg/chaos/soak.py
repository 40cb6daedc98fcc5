"""`kdg chaos soak`: real kdg processes under a steady load and a random nemesis for M minutes, sampled from
their own metrics endpoints, audited in slices; the checks are in :mod:`kdg.chaos.soak_report`.

The load: an exactly-once producer (through the fault proxy, so acknowledgements can be dropped); two
exactly-once consumers of one group into a typed table; one exactly-once consumer into ``kafka:TOPIC-out``;
one at-least-once control consumer into a generic table. Nothing lost or duplicated is proven over the
whole run by auditing consecutive slices of the ledger's ``recorded_at`` (the ledger expires during a
long soak), each once its rows are all written and while they are kept.
"""

import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from kdg.chaos.soak_nemesis import Nemesis, schedule
from kdg.chaos.soak_procs import Member, rss_kb, scrape, total
from kdg.errors import ConnectionFailed, KdgError, UsageError
from kdg.lifecycle import Shutdown
from kdg.retention import parse_retention, show
from kdg.settings import Connection
from kdg.stack.layout import StackLayout

SAMPLE_EVERY_S = 2.0
AUDIT_DELAY_S = 30.0   # a slice is audited once it ended this long ago (and the ledger has caught up with it)
LEDGER_FLOOR_S = 120   # the default ledger window is at least this: a slice is audited AUDIT_DELAY_S after its
                       # end at the earliest, later when Postgres restarts or the machine is loaded, and its rows
                       # must still be in the ledger then
DRAIN_TIMEOUT_S = 180.0
OPENING_BATCHES = 3    # a soak long enough to judge RSS opens with this many consumer batches of records at once
COLUMNS = ("idempotency_key text = idempotency_key", "p int = partition", "o bigint = offset",
           "ts timestamptz = timestamp")


@dataclass
class SoakConfig:
    minutes: float
    rate: float
    seed: int
    dedup_retention: str | None = None   # None: 30s for a soak of 5 minutes or less, else 2m
    ledger_retention: str | None = None  # None: 3 audit slices, at least LEDGER_FLOOR_S

    @property
    def slice_s(self) -> float:
        return min(120.0, max(30.0, self.minutes * 60 / 4))

    def resolved(self) -> "SoakConfig":
        if self.minutes <= 0 or self.rate <= 0:
            raise UsageError(f"--minutes {self.minutes:g} and --rate {self.rate:g}: both must be above 0")
        dedup = self.dedup_retention or ("30s" if self.minutes <= 5 else "2m")
        ledger = self.ledger_retention or show(int(max(self.slice_s * 3, LEDGER_FLOOR_S) * 1000))
        parse_retention(dedup), parse_retention(ledger, "--ledger-retention")
        return SoakConfig(self.minutes, self.rate, self.seed, dedup, ledger)


class Soak:
    def __init__(self, layout: StackLayout, config: SoakConfig, logs: Path):
        from kdg.chaos.proxy import FaultProxy

        self.layout, self.config, self.logs = layout, config, logs
        tag = uuid.uuid4().hex[:8]
        self.topic, self.out = f"soak-{tag}", f"soak-{tag}-out"
        self.typed, self.alo = f"soak_typed_{tag}", f"soak_alo_{tag}"
        self.groups = {"typed": f"soak-typed-{tag}", "kafka": f"soak-kafka-{tag}", "alo": f"soak-alo-{tag}"}
        self.conn = Connection(layout.bootstrap_servers, layout.pg_dsn, layout.admin_properties())
        self.proxy = FaultProxy(layout)
        self.shutdown = Shutdown(timeout=180)
        self.started = time.monotonic()
        self.start_utc = datetime.now(timezone.utc)
        self.samples: list[dict] = []
        self.tables: list[dict] = []
        self.slices: list[dict] = []
        self.timeline: list[dict] = []
        self.failures: list[str] = []
        self._sampling = threading.Event()
        self.opening: Member | None = None
        c = config
        consume = ["consume", self.topic, "-g", "exactly-once"]
        typed = [*consume, "-G", self.groups["typed"], "--table", self.typed, "--create-table",
                 "--dedup-retention", c.dedup_retention, *[a for col in COLUMNS for a in ("--column", col)]]
        self.producer = Member(layout, "producer", "producer", [
            "produce", self.topic, "-g", "exactly-once", "--rate", c.rate, "--ledger-retention", c.ledger_retention,
            "-b", layout.proxy_bootstrap, "-X", "request.timeout.ms=2000", "-X", "socket.timeout.ms=3000"], logs)
        self.consumers = [
            Member(layout, "typed-a", "exactly-once typed", typed, logs, "typed"),
            Member(layout, "typed-b", "exactly-once typed", typed, logs, "typed"),
            Member(layout, "kafka", "exactly-once kafka", [*consume, "-G", self.groups["kafka"], "--sink",
                   f"kafka:{self.out}", "--transactional-id", f"kdg-soak-{tag}"], logs, "kafka"),
            Member(layout, "alo", "at-least-once control", ["consume", self.topic, "-g", "at-least-once", "-G",
                   self.groups["alo"], "--table", self.alo], logs, "alo")]

    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def utc(self, t: float) -> datetime:
        return self.start_utc + timedelta(seconds=t)

    # -- sampling ----------------------------------------------------------------------------
    def _sample_loop(self) -> None:
        store, last_tables = None, -99.0
        while not self._sampling.wait(SAMPLE_EVERY_S):
            t, row = self.now(), {"t": self.now(), "written": {}, "lag": {}, "rss_kb": {}}
            lags: dict[str, dict] = {g: {} for g in self.groups}
            for m in [self.producer, *self.consumers]:
                if not m.alive:
                    continue
                if (kb := rss_kb(m.pid)) is not None:
                    row["rss_kb"][m.name] = kb
                    m.incarnations[-1]["rss"].append((t, kb))
                metrics = scrape(m.port)
                if not metrics:
                    continue  # paused, starting, or stopping
                if m is self.producer:
                    row["acked"] = total(metrics, "kdg_records_acked_total")
                    continue
                row["written"][m.name] = total(metrics, "kdg_records_written_total")
                for labels, value in metrics.get("kdg_consumer_lag_records", []):
                    p = labels.get("partition")
                    # two members may both report a partition for a moment around a rebalance: the lowest counts
                    lags[m.group][p] = min(value, lags[m.group].get(p, value))
            row["lag"] = {g: sum(v.values()) for g, v in lags.items() if v}
            self.samples.append(row)
            if t - last_tables >= 10:
                try:
                    store = store or self._store()
                    self.tables.append({"t": t, **self._table_sizes(store)})
                    last_tables = t
                except (KdgError, OSError):
                    store = _closed(store)
        _closed(store)

    def _store(self):
        from kdg.settings import table_name
        from kdg.store.pg import Store

        store = Store(self.layout.pg_dsn)
        if not hasattr(self, "claims_relation"):
            ident = store.resolve_table(table_name(self.typed))
            self.claims_table = ident.text
            self.claims_relation = store.fetchval("SELECT relation FROM kdg_windows WHERE sink_table = $1", ident.text)
        return store

    def _table_sizes(self, store) -> dict:
        from kdg.store.windows import SIZE as size

        return {"claims_rows": store.fetchval("SELECT count(*) FROM kdg_dedup WHERE sink_table = $1", self.claims_table),
                "claims_bytes": store.fetchval(size, self.claims_relation),
                "ledger_rows": store.fetchval("SELECT count(*) FROM kdg_ledger WHERE topic = $1", self.topic),
                "ledger_bytes": store.fetchval(size, "kdg_ledger")}

    # -- audits ------------------------------------------------------------------------------
    def _ledger_state(self) -> tuple[datetime | None, datetime | None]:
        """The time of the newest key the ledger holds (every key produced before it has its row), and its
        horizon (rows recorded before it were dropped)."""
        from kdg.store.pg import Store

        def utc(ms):
            return None if ms is None else datetime.fromtimestamp(ms / 1000, timezone.utc)

        with Store(self.layout.pg_dsn) as store:
            ms = store.fetchval("SELECT max(kdg_key_ms(CASE key_form WHEN 'x8' THEN idempotency_key || '00000000' "
                                "ELSE idempotency_key END)) FROM kdg_ledger WHERE topic = $1", self.topic)  # a run: its head
            return utc(ms), utc(store.ledger_window().horizon_ms)

    def audit_due(self, final: bool = False) -> None:
        """Audit every slice that ended AUDIT_DELAY_S ago and that the ledger has caught up with; again while
        records of it are pending. ``final``: everything up to now, the load stopped."""
        from kdg.audit import run_audit

        end_t = self.now() + 1 if final else self.now() - AUDIT_DELAY_S
        lo = self.slices[-1]["until_t"] if self.slices else -5.0
        while lo < end_t:
            hi = lo + self.config.slice_s
            if hi > end_t:
                if not final:
                    break
                hi = end_t
            self.slices.append({"since_t": lo, "until_t": hi, "since": self.utc(lo).isoformat(),
                                "until": self.utc(hi).isoformat(), "done": False, "audits": {}, "tries": 0})
            lo = hi
        try:
            reached, horizon = self._ledger_state()
            for s in [s for s in self.slices if not s["done"]]:
                if not final and (reached is None or reached < self.utc(s["until_t"])):
                    break
                if horizon is not None and horizon > self.utc(s["since_t"]):
                    s["done"], s["expired"] = True, horizon.isoformat()
                    self.failures.append(
                        f"the slice {s['since_t']:.0f}-{s['until_t']:.0f} s was audited too late, at "
                        f"{self.now():.0f} s: the ledger had dropped its first rows (kept from {horizon:%H:%M:%S}); "
                        f"nothing can be said of it; a longer --ledger-retention leaves the audits more time")
                    continue
                since, until = self.utc(s["since_t"]), self.utc(s["until_t"])
                s["audits"] = {name: asdict(run_audit(self.topic, self.conn, sink=sink, table=table,
                                                      group=self.groups[name], since=since, until=until))
                               for name, sink, table in (("typed", "postgres", self.typed),
                                                         ("kafka", f"kafka:{self.out}", "kdg_events"),
                                                         ("alo", "postgres", self.alo))}
                s["tries"] += 1
                s["audited_t"] = self.now()
                s["done"] = all(a["pending"] == 0 for a in s["audits"].values()) or s["tries"] >= 10
        except (ConnectionFailed, OSError) as exc:  # Postgres restarting: next time
            self.timeline.append({"t": self.now(), "kind": "audit", "note": f"audit postponed: {exc}"})
        except KdgError as exc:
            self.failures.append(f"an audit failed at {self.now():.0f} s: {exc}")

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> None:
        from kdg.kafka.admin import ensure_topic

        ensure_topic(self.layout.bootstrap_servers, self.topic, partitions=3, extra=self.conn.extra)
        self.proxy.start()
        for m in self.consumers:  # the first typed member creates the table before the others start
            m.start(self.now())
            if not m.wait_ready(90, self.shutdown.sleep):
                raise KdgError(f"consumer {m.name} did not become ready: {m.stderr_tail()}")
        self.start_utc = datetime.now(timezone.utc) - timedelta(seconds=self.now())
        self._open_with_a_backlog()
        self.producer.start(self.now())
        threading.Thread(target=self._sample_loop, name="kdg-soak-sampler", daemon=True).start()
        auditor = None
        nemesis = Nemesis(self, self.config.seed)
        for at, kind in schedule(self.config.seed, self.config.minutes, warmup_s=min(20.0, self.config.minutes * 6)):
            while self.now() < at and not self.shutdown.sleep(min(1.0, at - self.now())):
                auditor = self._audit_in_background(auditor)
            if self.shutdown.requested:
                return
            self._check_alive()
            self.timeline.append(nemesis.inject(kind))
        while self.now() < self.config.minutes * 60 and not self.shutdown.sleep(1.0):
            auditor = self._audit_in_background(auditor)
        self._check_alive()
        if auditor is not None:
            auditor.join()
        self._finish()

    def _open_with_a_backlog(self) -> None:
        """In a soak that judges RSS: records for full batches at once before the steady load, so that each
        consumer's Python heap reaches its working set (one full batch, whose arenas pymalloc keeps once a few
        survivors pin them: benchmarks/rss_burst.py) inside its warm-up, as every restarted incarnation's
        catch-up does. RSS growth after that is what the check judges."""
        from kdg.chaos.soak_report import judges_rss
        from kdg.consume import ConsumeRequest

        if not judges_rss(self.config.minutes):
            return
        n = OPENING_BATCHES * ConsumeRequest.batch_size
        self.opening = Member(self.layout, "opening", "opening backlog", [
            "produce", self.topic, "-g", "exactly-once", "--count", n, "--ledger-retention",
            self.config.ledger_retention], self.logs)
        self.opening.start(self.now())
        code = self.opening.wait(120)
        self.opening.ended(self.now())
        if code != 0:
            self.opening.stop(self.now)
            raise KdgError(f"the opening backlog of {n} records did not go in (exit {code}): "
                           f"{self.opening.stderr_tail()}")
        self.timeline.append({"t": self.now(), "kind": "backlog", "target": "topic",
                              "note": f"{n:,} records at once (warm-up)"})

    def _audit_in_background(self, auditor: threading.Thread | None) -> threading.Thread | None:
        if auditor is not None and auditor.is_alive():
            return auditor
        auditor = threading.Thread(target=self.audit_due, name="kdg-soak-auditor", daemon=True)
        auditor.start()
        return auditor

    def _check_alive(self) -> None:
        """A member that exited on its own is a failure: noted, and started again."""
        for m in [self.producer, *self.consumers]:
            code = m.ended(self.now())
            if code is not None:
                self.failures.append(f"{m.name} exited {code} at {self.now():.0f} s on its own: {m.stderr_tail()}")
                m.start(self.now())

    def _finish(self) -> None:
        code = self.producer.stop(self.now)
        self.timeline.append({"t": self.now(), "kind": "stop", "target": "producer", "note": f"exit {code}"})
        if code != 0:
            self.failures.append(f"the producer did not exit 0 on SIGTERM (exit {code}): {self.producer.stderr_tail()}")
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline and not self.shutdown.sleep(SAMPLE_EVERY_S):
            last = self.samples[-1]["lag"] if self.samples else {}
            if set(last) == set(self.groups) and not any(last.values()):
                break
        else:
            self.failures.append(f"lag did not reach 0 within {DRAIN_TIMEOUT_S:g} s of the producer's stop")
        self.drained_t = self.now()
        for m in self.consumers:
            code = m.stop(self.now)
            if code != 0:
                self.failures.append(f"{m.name} did not exit 0 on SIGTERM (exit {code}): {m.stderr_tail()}")
        self._sampling.set()
        store = self._store()
        try:
            self.tables.append({"t": self.now(), **self._table_sizes(store)})
        finally:
            store.close()
        self.audit_due(final=True)

    def stop_everything(self) -> None:
        """Every process the soak started, by pid; the proxy. Safe after a failure half-way."""
        self._sampling.set()
        for m in [self.producer, *self.consumers]:
            if m.alive:
                m.stop(self.now, timeout=20)
        self.proxy.stop()


def _closed(store):
    if store is not None:
        store.close()
    return None


def _keep_ledger_retention(layout: StackLayout, retention: str):
    """Set the ledger's retention for the soak (as `kdg db maintain` would); returns how to restore it."""
    from kdg.store.pg import Store

    with Store(layout.pg_dsn) as store:
        window = store.ledger_window()
        before = (window.retention_ms, window.retention_from)
        store.set_retention(window, parse_retention(retention, "--ledger-retention"), "kdg chaos soak")

    def restore() -> None:
        with Store(layout.pg_dsn) as s:
            s.set_retention(s.ledger_window(), *before)
    return restore


def run_soak(layout: StackLayout, config: SoakConfig, logs: Path | None = None) -> dict:
    """Run the soak; the results document (checks included) that the report is drawn from."""
    from kdg.chaos.soak_report import judge
    from kdg.machine import machine

    config = config.resolved()
    logs = logs or Path(tempfile.mkdtemp(prefix="kdg-soak-"))
    logs.mkdir(parents=True, exist_ok=True)
    restore = _keep_ledger_retention(layout, config.ledger_retention)
    soak = Soak(layout, config, logs)
    try:
        with soak.shutdown.on_signals():
            try:
                soak.run()
            finally:
                soak.stop_everything()
    finally:
        restore()
    if soak.shutdown.requested:
        soak.failures.append(f"the soak was stopped ({soak.shutdown.signal}) at {soak.now():.0f} s")
    results = {"started_at": soak.start_utc.isoformat(timespec="seconds"), "machine": machine(),
               "config": asdict(config), "slice_s": config.slice_s, "topic": soak.topic, "out_topic": soak.out,
               "typed_table": soak.typed, "alo_table": soak.alo, "groups": soak.groups, "logs": str(logs),
               "duration_s": soak.now(), "drained_t": getattr(soak, "drained_t", None),
               "producer": soak.producer.report(), "proxy_dropped": soak.proxy.dropped,
               "opening": soak.opening.report() if soak.opening is not None else None,
               "members": {m.name: {"role": m.role, "group": m.group, "incarnations": m.incarnations}
                           for m in [soak.producer, *soak.consumers]},
               "timeline": soak.timeline, "samples": soak.samples, "tables": soak.tables, "slices": soak.slices,
               "failures": soak.failures}
    results["checks"] = judge(results)
    return results
