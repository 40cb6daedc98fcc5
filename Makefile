# kdg — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
KDG     = $(BIN)/kdg

.PHONY: setup demo test test-fast stack-up stack-down bench clean

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

bench: setup
	$(BIN)/python benchmarks/produce_bench.py

clean:
	-$(KDG) stack down --purge
	rm -rf $(VENV)
