# kdg — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
KDG     = $(BIN)/kdg

.PHONY: setup demo test stack-up stack-down bench bench-spark clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

## setup: Python deps into .venv, Kafka's jars from Maven Central into the kdg cache
setup: $(VENV)/.installed
	$(KDG) stack fetch

## demo: start the local stack and show each guarantee surviving (or not) a consumer crash
demo: setup
	bash scripts/demo.sh

## test: the whole suite against a real stack the tests start and stop themselves
test: setup
	$(BIN)/pytest -q

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

clean:
	-$(KDG) stack down --purge
	rm -rf $(VENV)
