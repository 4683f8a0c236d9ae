"""Consolidation rules, in the pure modules below; this one names them for callers.

- ``memory.extractive``: ``consolidate_extractive``, the offline consolidator (no model), and
  ``extract_memory``, the same with how it was read (``Extraction.cut``: bounded work).
- ``memory.merge``: ``merge_memory``, the fold of fresh content into a stored memory, with
  supersede-to-history (nothing is silently deleted); ``reinforced``, a trigger's strength
  without new content.
- ``memory.consolidation_jobs``: triggers -> one job each, one queue per user in log order.
- ``memory.due``: ``parse_due``, due times stated in English and Chinese.
- ``memory.phrases``: what a sentence asserts (a state such as delivered, a promise, the
  resolution of a promise), which both share.
- ``memory.render``: ``memory_text``, a memory as context text (current state first).
"""

from memstream.memory.due import parse_due
from memstream.memory.extractive import (
    MAX_FACTS,
    MAX_ITEM_CHARS,
    MAX_TITLE_CHARS,
    Extraction,
    consolidate_extractive,
    extract_memory,
)
from memstream.memory.merge import merge_memory, reinforced

__all__ = [
    "MAX_FACTS",
    "MAX_ITEM_CHARS",
    "MAX_TITLE_CHARS",
    "Extraction",
    "consolidate_extractive",
    "extract_memory",
    "merge_memory",
    "parse_due",
    "reinforced",
]
