"""Pipeline files (issue 45): the routes they hold, `kdg pipeline check` and `kdg audit --pipeline`.

A bad file is one `error:` line and exit 2 through the real `kdg`, offline: nothing reaches a server.
The router's templates are checked alone; then, on the stack, the check against the cluster's topics
and one audit of two routes, one of which lost a row.
"""

import json
import re
import subprocess
import sys
import uuid
from types import SimpleNamespace

import pytest

from conftest import as_json
from kdg.errors import UsageError
from kdg.flow.check import source_of
from kdg.flow.pipeline_file import load_pipeline
from kdg.flow.routes import Route, Router
from kdg.kafka.admin import ensure_topic
from kdg.mapping.spec import build_mapping
from kdg.records import Record
from kdg.store.pg import Store

CDC_COLUMNS = '[route.columns]\nid = { type = "bigint", from = "json:id" }\n'


def route(name: str, table: str, topics=(), pattern=None) -> str:
    """One ``[[route]]`` entry."""
    lines = [f'[[route]]\nname = "{name}"\ntable = "{table}"']
    if topics:
        lines.append("topics = [" + ", ".join(f'"{t}"' for t in topics) + "]")
    if pattern:
        lines.append(f"topic_pattern = '{pattern}'")
    return "\n".join(lines) + "\n"


def offline_kdg(*args: str) -> subprocess.CompletedProcess:
    """The real `kdg`, with no server to reach: a bad file must be refused before any is needed."""
    env = {"KDG_BOOTSTRAP_SERVERS": "127.0.0.1:1", "KDG_PG_DSN": "postgresql://u:SECRETPW@127.0.0.1:1/db",
           "KDG_WAIT_TIMEOUT": "0", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "kdg", *args], capture_output=True, text=True, env=env, timeout=60)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a refused command (exit 2, no traceback, no password)."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{output}"
    assert "Traceback" not in output and "SECRETPW" not in output, output
    assert proc.stderr.count("error:") == 1, proc.stderr
    return proc.stderr[proc.stderr.index("error:"):].split("\n", 1)[0]


# -- bad files: one error line, exit 2, offline -------------------------------------------------------
BAD_FILES = {
    "overlap": (route("orders", "orders_t", ["orders", "refunds"]) + route("everything", "all_t", ["refunds"]),
                ["'refunds'", "orders", "everything", "taken by two routes"]),
    "invalid-template": (route("dashed", "mt_{topic}", ["my-orders"]),
                         ["dashed:", "'my-orders'", "'mt_my-orders'", "not a table name"]),
    "typo": ('[[route]]\nname = "r"\ntopics = ["orders"]\ntabel = "orders_t"\n',
             ["unknown key 'tabel' (did you mean 'table'?)"]),
    "unknown-field": (route("r", "mt_{topik}", ["orders"]), ["unknown field {topik}", "{topic}"]),
}


@pytest.mark.parametrize("name", BAD_FILES)
@pytest.mark.parametrize("command", ["check", "audit"])
def test_a_bad_pipeline_file_is_one_error_line_and_exit_2(tmp_path, name, command):
    text, says = BAD_FILES[name]
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    argv = ("pipeline", "check", str(path), "--offline") if command == "check" else \
        ("audit", "--pipeline", str(path), "-G", "g")
    line = error_line(offline_kdg(*argv))
    for part in says:
        assert part in line, line


def test_a_pattern_librdkafka_cannot_subscribe_to_is_refused_by_the_check(tmp_path):
    path = tmp_path / "pipeline.toml"
    path.write_text(route("no-dead-letters", "t", pattern=r"shop\..*(?<!\.dlq)"))
    line = error_line(offline_kdg("pipeline", "check", str(path), "--offline"))
    assert "no-dead-letters: topic pattern" in line and "cannot read '(?<!'" in line


def test_audit_takes_a_topic_or_a_pipeline_never_both_nor_neither(tmp_path):
    path = tmp_path / "pipeline.toml"
    path.write_text(route("r", "t", ["orders"]))
    assert "--pipeline FILE" in error_line(offline_kdg("audit", "-G", "g"))
    assert "give no TOPIC" in error_line(offline_kdg("audit", "orders", "--pipeline", str(path)))
    assert "--table" in error_line(offline_kdg("audit", "--pipeline", str(path), "--table", "other"))


def test_a_good_file_offline_shows_each_route_and_its_listed_topics_tables(tmp_path):
    path = tmp_path / "pipeline.toml"
    path.write_text(route("plain", "mt_{topic}", ["orders", "items"])
                    + route("cdc", "replica.{source.table}", pattern=r"shop\.public\..*")
                    + 'envelope = "debezium"\n' + CDC_COLUMNS)
    proc = offline_kdg("pipeline", "check", str(path), "--offline", "--json")
    assert proc.returncode == 0, proc.stderr
    routes = {r["name"]: r for r in as_json(proc)["routes"]}
    assert [(t["topic"], t["table"]) for t in routes["plain"]["topics"]] == [("orders", "mt_orders"),
                                                                              ("items", "mt_items")]
    assert routes["cdc"]["typed"] and routes["cdc"]["topics"] == [] and "offline" in routes["cdc"]["notes"][0]


# -- the router's templates ----------------------------------------------------------------------------
def debezium_route(table: str, pattern: str = r"shop\.public\..*") -> Route:
    mapping = build_mapping(columns=["id bigint = json:id"], table="placeholder", envelope="debezium")
    return Route("cdc", (), pattern, table, mapping)


def test_templates_fill_from_the_topic_and_the_patterns_groups():
    router = Router([Route("plain", ("orders",), None, "mt_{topic}"),
                     Route("numbered", (), r"app\.(\w+)\.(\w+)", "{1}.{2}_copy"),
                     Route("named", (), r"log-(?P<day>\d{8})", '"Logs"."day_{day}"')])
    assert router.target("orders").table.text == "mt_orders"
    assert router.target("app.sales.orders").table.text == "sales.orders_copy"
    assert router.target("log-20261128").table.sql == '"Logs"."day_20261128"'
    assert router.target("log-20261128").route.name == "named"
    with pytest.raises(UsageError, match="taken by no route"):
        router.target("elsewhere")
    with pytest.raises(UsageError, match=r"unknown field \{3\}.*\{1\}, \{2\}"):
        Route("r", (), r"(a)(b)", "{3}")
    with pytest.raises(UsageError, match='give the route envelope = "debezium"'):
        Route("r", ("t",), None, "{source.table}")


def test_a_pattern_overlap_is_refused_for_the_topic_both_take_only():
    router = Router([Route("a", (), r"x-.*", "a"), Route("b", (), r".*-y", "b")])
    assert router.target("x-1").table.text == "a"
    with pytest.raises(UsageError, match=r"topic 'x-y' is taken by two routes, a and b"):
        router.target("x-y")


EVENT = {"before": None, "after": {"id": 7}, "op": "c",
         "source": {"db": "shop", "schema": "public", "table": "customers"}}


@pytest.mark.parametrize("shape", ["plain", "json-converter"])
def test_a_source_template_takes_the_table_from_the_topics_first_event(shape):
    value = EVENT if shape == "plain" else {"schema": {"type": "struct", "fields": []}, "payload": EVENT}
    cdc = debezium_route("replica.{source.table}_{source.db}")
    router = Router([cdc])
    records = [Record(None, topic="shop.public.customers"),  # a tombstone names no table: the next event does
               Record(json.dumps(value).encode(), topic="shop.public.customers")]
    conn = SimpleNamespace(registry=None)
    assert router.target("shop.public.customers").table is None  # no event read yet: not decided
    target = router.target("shop.public.customers", lambda: source_of(conn, cdc, records))
    assert target.table.text == "replica.customers_shop" and target.mapping.table == target.table
    assert router.target("shop.public.customers").table == target.table  # decided once per topic


def test_a_source_template_refuses_an_event_whose_table_is_no_name():
    cdc = debezium_route("{source.table}")
    bad = dict(EVENT, source={"table": "order lines"})
    records = [Record(json.dumps(bad).encode(), topic="shop.public.order_lines")]
    with pytest.raises(UsageError, match=r"cdc: .*'shop\.public\.order_lines' is 'order lines', not a table name"):
        Router([cdc]).target("shop.public.order_lines", lambda: source_of(SimpleNamespace(registry=None), cdc, records))


def test_the_file_names_itself_in_an_overlap(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(route("a", "a", ["t"]) + route("b", "b", ["t"]))
    with pytest.raises(UsageError, match=rf"--pipeline {re.escape(str(path))}: topic 't' is taken by two routes"):
        load_pipeline(path)


# -- on the stack ----------------------------------------------------------------------------------------
def test_check_against_the_cluster_names_each_topics_table_and_refuses_what_it_must(kdg, conn, tmp_path):
    tag = uuid.uuid4().hex[:8]
    for suffix in ("a", "b", "dl.dlq"):
        ensure_topic(conn.bootstrap_servers, f"pl-{tag}-{suffix}", partitions=1)
    cdc_topic = f"pl-{tag}-cdc"
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"schema": {"type": "struct"}, "payload": EVENT}) + "\n")
    kdg("produce", cdc_topic, "--file", events)
    good = tmp_path / "good.toml"
    good.write_text(route("ab", f"pl_{tag}_{{1}}", pattern=f"pl-{tag}-(a|b)")
                    + route("cdc", f"{{source.table}}_{tag}", [cdc_topic])
                    + 'envelope = "debezium"\ncreate_table = true\nkey = "id"\n' + CDC_COLUMNS
                    + route("later", "later", pattern=f"pl-{tag}-later-.*")
                    + route("dl", f"dl_{tag}", pattern=f"pl-{tag}-dl.*"))
    report = as_json(kdg("pipeline", "check", good, "--json"))
    tables = {t["topic"]: (t["table"], t["table_state"]) for r in report["routes"] for t in r["topics"]}
    assert tables == {f"pl-{tag}-a": (f"pl_{tag}_a", "created on first write"),
                      f"pl-{tag}-b": (f"pl_{tag}_b", "created on first write"),
                      cdc_topic: (f"customers_{tag}", "would be created")}  # a pattern never takes a TOPIC.dlq
    notes = {r["name"]: r["notes"] for r in report["routes"]}
    assert "not an error" in notes["later"][0] and report["ok"]

    overlap = tmp_path / "overlap.toml"
    overlap.write_text(route("ab", "x", pattern=f"pl-{tag}-(a|b)") + route("bee", "y", pattern=f"pl-{tag}-b"))
    line = error_line(kdg("pipeline", "check", overlap, check=False))
    assert f"topic 'pl-{tag}-b' is taken by two routes, ab and bee" in line

    invalid = tmp_path / "invalid.toml"
    invalid.write_text(route("dashed", "{topic}", pattern=f"pl-{tag}-a"))
    line = error_line(kdg("pipeline", "check", invalid, check=False))
    assert f"dashed: table '{{topic}}' for topic 'pl-{tag}-a' is 'pl-{tag}-a', not a table name" in line


def test_audit_of_a_pipeline_gives_each_route_its_verdict(kdg, conn, group, tmp_path):
    """Two topics consumed the old way (one `kdg consume --table` each), audited as a pipeline of two routes;
    a row deleted from one table makes that route, and only it, unbalanced."""
    tag = uuid.uuid4().hex[:8]
    topics = {r: f"pl-{tag}-{r}" for r in ("a", "b")}
    for r, topic in topics.items():
        kdg("produce", topic, "--count", "50")
        kdg("consume", topic, "-G", group, "--table", f"pl_{tag}_{r}", "-e")
    path = tmp_path / "pipeline.toml"
    path.write_text(route("listed", f"pl_{tag}_a", [topics["a"]]) + route("matched", f"pl_{tag}_{{1}}",
                                                                          pattern=f"pl-{tag}-(b)"))
    balanced = kdg("audit", "--pipeline", path, "-G", group)
    assert f"route listed: {topics['a']} → pl_{tag}_a: lost 0, duplicates 0" in balanced.stdout
    assert f"route matched: {topics['b']} → pl_{tag}_b: lost 0" in balanced.stdout

    with Store(conn.pg_dsn) as store:
        store.execute(f"DELETE FROM pl_{tag}_b WHERE ctid IN (SELECT ctid FROM pl_{tag}_b LIMIT 1)")
    proc = kdg("audit", "--pipeline", path, "-G", group, "--json", check=False)
    assert proc.returncode == 7, proc.stderr
    routes = {r["route"]: r for r in as_json(proc)["routes"]}
    assert routes["listed"]["balanced"] and routes["listed"]["audits"][0]["acked"] == 50
    assert (routes["matched"]["lost"], routes["matched"]["balanced"]) == (1, False)
    assert routes["matched"]["tables"] == [f"pl_{tag}_b"]
    assert "route matched: lost 1" in proc.stderr and "route listed" not in proc.stderr
