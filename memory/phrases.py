"""Phrase patterns and small text utilities shared by the extractive consolidator and the merge.

States ("shipped", "已发货"), promises ("I will", "我会跟进") and completions ("done", "已解决"),
in English and Chinese; ``norm`` is the comparison form of a sentence (two sentences that
differ only in case and punctuation are the same fact). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from memory.text import tokenize

STATE = re.compile(
    r"\b(?:shipped|dispatched|delivered|refunded|refund (?:has been |was )?issued|cancell?ed|"
    r"delayed|resolved|pending|escalated|returned|on hold|out for delivery|closed|completed|"
    r"replaced)\b|已发货|已送达|已签收|已退款|退款成功|已取消|延迟|延误|已解决|处理中|待处理|"
    r"已升级|已退货|已关闭|已完成"
)
COMMITMENT = re.compile(
    r"\b(?:i|we)(?:\s+will|'ll|’ll|\s+shall|\s+am going to|\s+are going to)\b|"
    r"\bwill (?:call|get back|contact|email|send|follow)\b|\bfollow[- ]?up\b|"
    r"\bget back to you\b|\bcall you back\b|"
    r"\bwithin \w+ (?:minutes?|hours?|days?|business days?)\b|"
    r"\bby (?:monday|tuesday|wednesday|thursday|friday|saturday|sunday|tomorrow|"
    r"end of (?:the )?day|eod)\b|"
    r"我会|我们会|我们将|将会|跟进|回电|回复您|联系您|给您回"
)
DONE = re.compile(
    r"\b(?:done|resolved|completed|fixed|closed|called (?:you )?back|sent)\b|"
    r"已完成|已解决|已处理|已回电|已发送"
)
# Words of a promise that say nothing about *what* was promised (for matching it to "done").
PROMISE_WORDS = frozenset(
    tokenize("call back follow up within hours days today tomorrow 我会 跟进")
)


def norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "…"


def unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
