# kdg — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
KDG     = $(BIN)/kdg

.PHONY: setup demo test test-fast test-long stack-up stack-down bench bench-spark bench-stream bench-evolve docs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,schemas,docs]'
	touch $@

## setup: Python deps into .venv, Kafka's jars from Maven Central into the kdg cache
setup: $(VENV)/.installed
	$(KDG) stack fetch

## demo: start the local stack and show each guarantee surviving (or not) a consumer crash
demo: setup
	bash scripts/demo.sh

## test: the suite against real servers the tests start (each once, shared) and stop themselves; on
## TEST_WORKERS pytest-xdist workers, since most of its time is spent waiting on servers, not computing (the
## stack's Schema Registry is built first, once: tests/test_schemas.py uses it)
TEST_WORKERS ?= 3
test: setup
	$(KDG) stack fetch --schema-registry
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

## test-fast: the pure-Python tier, no server started (under a minute)
test-fast: setup
	$(BIN)/pytest -q -m "not stack"

## test-long: the long tier (every kill point on every sink, ...) and the 100k-record chaos matrix on the
## local stack (kdg stack up); run it before resolving an issue that touches a guarantee path
CHAOS_LONG ?= --messages 100000 --repeat 3 --faults consumer-kill,consumer-pause,postgres-restart,broker-kill
test-long: setup
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m long --durations=10
	$(KDG) stack up
	$(KDG) chaos run $(CHAOS_LONG) --report docs/chaos-long

stack-up: setup
	$(KDG) stack up

stack-down:
	$(KDG) stack down

## bench: kdg against references run alongside (produce, exactly-once, consume → Postgres with CPU per million
## rows) and end-to-end latency per guarantee and sink; prints one table, writes benchmarks/results/produce_bench.json
## and docs/bench.png. Flags (see benchmarks/produce_bench.py): make bench BENCH_ARGS="--only latency --latency-seconds 20"
BENCH_ARGS ?=
bench: setup
	$(BIN)/python benchmarks/produce_bench.py $(BENCH_ARGS)

## bench-spark: kdg spark-replay exactly-once vs a naive Spark JDBC append, and its driver memory at 1M vs 4M records
bench-spark: setup
	$(BIN)/python benchmarks/spark_replay_bench.py --records 1000000 --repeat 3 --big 4000000

## bench-stream: kdg spark-stream exactly-once vs kdg consume exactly-once vs a plain foreachBatch JDBC append
bench-stream: setup
	$(BIN)/python benchmarks/spark_stream_bench.py --records 1000000 --repeat 3

## bench-evolve: a from-schema route (evolve = add-columns, no change) vs the same route with a fixed mapping, consumer
## CPU per record (budget +3 %); the first batch after a new field vs a normal one, and the table's size around its
## ALTER; writes benchmarks/results/evolve_bench.json
bench-evolve: setup
	$(BIN)/python benchmarks/evolve_bench.py --records 300000 --repeat 3

## bench-upsert: the typed exactly-once upsert of 1M Kafka Connect JsonConverter records (500k ids, two versions
## each, 6 partitions) against kdg at-least-once, a bare confluent-kafka loop and one COPY + one upsert statement of
## the final rows: rows/s, steady rows/s, consumer and Postgres CPU-s per million; checks the table after each run;
## writes benchmarks/results/connect_upsert_bench.json (also the upsert part of make bench)
.PHONY: bench-upsert
bench-upsert: setup
	$(BIN)/python benchmarks/connect_upsert_bench.py --records 1000000 --repeat 3

## docs: the documentation site into site/, strictly (a broken link, page or reference fails it); tests/test_docs.py runs it
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	-$(KDG) stack down --purge
	rm -rf $(VENV) site
