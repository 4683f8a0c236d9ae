"""The sentence encoder's interface: what memorize, the consolidator and the RPC call.

``stores.encoder.OnnxEncoder`` is the adapter (the pinned ONNX MiniLM);
``tests.fakes.HashEncoder`` is a deterministic stand-in for unit tests.
``tests/contract/test_encoder_contract.py`` runs one suite on both.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]


@runtime_checkable
class TextEncoder(Protocol):
    """Texts -> unit vectors, and the encoder's token counts.

    The contract every implementation keeps:

    - ``encode(texts)`` is (len(texts), ``dim``) float32, every row of unit L2 norm (the
      empty text too), rows in input order; a single ``str`` is a TypeError, not a
      sequence of characters.
    - Deterministic: the same text gives the same vector in any process, and a text's
      vector does not depend on its batch-mates (encoding a batch equals encoding its texts
      one by one, within float tolerance), so batching and caching are free to change.
    - ``query`` and ``cache`` change scheduling only, never a vector.
    - Blocking and thread-safe: async callers use ``asyncio.to_thread``.
    - ``count_tokens`` counts the encoder's tokens (no special tokens, untruncated);
      ``counts_by_line`` says whether a text's count is the sum of its lines' counts.
    - ``model_id`` names the model; vectors of different ids are not comparable.
    - ``runners`` is how many ``encode`` calls it runs at once: a caller that keeps more
      in flight only queues them.
    """

    dim: int
    model_id: str
    runners: int

    def encode(
        self, texts: Sequence[str], *, query: bool = False, cache: bool = False
    ) -> FloatArray: ...

    def count_tokens(self, text: str) -> int: ...

    @property
    def counts_by_line(self) -> bool: ...

    def close(self) -> None: ...


class TokenCounter:
    """The encoder's token count, memoised line by line where that is exact.

    The RPC's ``assemble_context`` re-counts the whole rendered context after every item it
    admits (~9 counts of up to ~500 tokens per query, ~8 ms, more than the rest of a cached
    retrieval); the consolidator counts its prompt, whose turn lines recur in every
    consolidation of their key. BERT's normaliser works char by char and its pre-tokenizer
    never makes a token across whitespace, so a text's count is the sum of its lines'
    counts, and a line's the sum of its space-separated chunks' counts. A line not seen
    before is counted chunk by chunk, memoised too: the consolidator's prompt carries its
    memory as one long JSON line, new with every version but made of the last version's
    chunks (measured on a 1.6 kB memory: 434 us whole, 32 us from known chunks; counting
    it whole was 4% of the event loop's CPU during a replay, issue 14). Other tokenizers
    (a SentencePiece model marks word starts, for one) are counted whole.
    """

    def __init__(self, encoder: TextEncoder, size: int = 65_536) -> None:
        self._whole = encoder.count_tokens
        self._chunk = functools.lru_cache(maxsize=size)(encoder.count_tokens)
        self._line = functools.lru_cache(maxsize=size)(self._line_tokens)
        self.by_line = encoder.counts_by_line

    def _line_tokens(self, line: str) -> int:
        return sum(self._chunk(chunk) for chunk in line.split(" "))

    def __call__(self, text: str) -> int:
        if not self.by_line:
            return self._whole(text)
        return sum(self._line(line) for line in text.split("\n"))
