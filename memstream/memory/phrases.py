"""What a sentence says about the state of things, shared by the extractive consolidator and
the merge: states ("shipped", "it finally came", "已发货"), promises ("I will", "我会跟进") and
what resolves a promise ("sent", "got the tracking email", "已完成"), in English and Chinese.

A state is read as a canonical label ("delivered") with a family ("delivery") and whether
it ends the story (terminal). A phrase is a state only where it is asserted: negated ("still
hasn't shipped", "no longer delayed", "没收到"), hypothetical or future ("will be delivered",
"if it is delayed") mentions are not. Every rule is a pattern on one sentence, so each
decision can be explained by the phrase that made it. ``norm`` is the comparison form of a
sentence (two sentences that differ only in case and punctuation are the same fact). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from memstream.memory.text import text_memo, tokenize

# What people call the thing that travels, in "it came", "got the parcel", "left it at".
_THING_NOUN = (
    r"(?:the\s+(?:\w+\s+)?(?:parcel|package|order|box|delivery|items?|shipment|goods"
    r"|replacement|lamp|kettle|set)|my\s+(?:\w+\s+)?(?:parcel|package|order|box|delivery|items?"
    r"|shipment|replacement))"
)
_THING = rf"(?:it|them|{_THING_NOUN})"
_SUBJECT = (
    r"(?:it|they|parcel|package|order\s+[\w-]+|order|box|delivery|items?|shipment|everything)"
)
_WHEN = (
    r"(?:yesterday|today|this\s+(?:morning|afternoon|evening)|last\s+(?:night|week)|at\s+last"
    r"|in\s+the\s+end|finally|safely|in\s+one\s+piece|on\s+\w+day)"
)

# (label, family, terminal, pattern): the order is only the order labels are listed in.
_STATE_TABLE: tuple[tuple[str, str, bool, str], ...] = (
    (
        "delivered",
        "delivery",
        True,
        rf"\bdelivered\b|\barrived\b(?!\s+at\s+(?:the|our)\s+(?:warehouse|depot|hub))"
        rf"|\b(?:arrival|delivery)\s+(?:of\s+[\w\s-]{{1,40}}?\s+)?(?:was\s+|is\s+|has\s+been\s+)?confirmed\b"
        rf"|\b{_SUBJECT}\s+(?:[\w-]+\s+)?(?:came(?!\s+through)|turned\s+up|showed\s+up|got\s+here|is\s+here)\b"
        # "got it" alone is an acknowledgement ("Got it, thanks"), "received it" is not
        rf"|\b(?:got|received|collected|picked\s+up)\s+{_THING_NOUN}(?!\s+(?:email|number|link))"
        rf"|\b(?:received|collected|picked\s+up)\s+(?:it|them)\b"
        rf"|(?:^|\b(?:i|we)\s+)got\s+(?:it|them)\s+{_WHEN}\b|\b(?:finally|already)\s+got\s+(?:it|them)\b"
        rf"|\b(?:left|dropped(?:\s+off)?|put)\s+{_THING}\s+(?:at|with|on|by|in|outside)\b"
        rf"|\btook\s+{_THING}\s+in\b|\bsigned\s+(?:for|by)\b"
        r"|已送达|已签收|已经?收到|收到了|到货了|已经到了",
    ),
    ("out for delivery", "delivery", False, r"\bout\s+for\s+delivery\b|派送中|正在派送"),
    (
        "shipped",
        "delivery",
        False,
        r"\bshipped\b|\bdispatched\b|\bleft\s+(?:our|the)\s+(?:warehouse|depot)\b"
        r"|\bon\s+(?:its|their)\s+way\b|\bin\s+transit\b|\bhanded\s+(?:\w+\s+)?to\s+the\s+courier\b"
        r"|已发货|已寄出|发货了",
    ),
    (
        "processing",
        "delivery",
        False,
        r"\bpacking\s+queue\b|\bbeing\s+packed\b|\bready\s+to\s+ship\b",
    ),
    (
        "delayed",
        "delivery",
        False,
        r"\bdelayed\b|\bback-?ordered\b|\bon\s+backorder\b|延迟|延误",
    ),
    ("on hold", "status", False, r"\bon\s+hold\b"),
    (
        "double charged",
        "billing",
        False,
        r"\bcharged\s+twice\b|\bdouble[- ]charged?\b|\bduplicate\s+(?:charge|payment)\b"
        r"|\btwo\s+(?:payments|charges)\b|重复扣款",
    ),
    ("pending", "status", False, r"\bpending\b|处理中|待处理"),
    (
        "refunded",
        "refund",
        True,
        # "refunded 10% of the order" is a goodwill gesture, not the order's state
        r"\brefunded\b(?!\s+(?:\d+\s*%|part|some|a\s+(?:part|portion)))"
        r"|\brefund\s+(?:(?:for|of|on)\s+(?:[\w.-]+\s+){1,3}?)?(?:has\s+been\s+|was\s+|is\s+)?"
        r"(?:issued|processed|sent|completed|done|went\s+through|came\s+through|arrived)\b|\b(?:got|received)\s+(?:my\s+|the\s+|a\s+)?"
        r"(?:money\s+back|refund)\b|\bmoney\s+(?:is\s+|was\s+)?back\b|已退款|退款成功|退款已到账",
    ),
    ("refund approved", "refund", False, r"\brefund\s+(?:is\s+|was\s+|has\s+been\s+)?approved\b"),
    (
        "refund requested",
        "refund",
        False,
        r"\b(?:want|need|like|request(?:ed)?|asked\s+for|asking\s+for)\s+(?:a\s+|my\s+)?(?:full\s+)?"
        r"refund\b|\brefund\s+request(?:ed)?\b|申请退款|要求退款",
    ),
    (
        "faulty",
        "fault",
        False,
        r"\bstopped\s+working\b|\b(?:is|are|was|arrived|came)\s+(?:broken|faulty|defective|damaged"
        r"|cracked|torn)\b|\b(?:won't|doesn't|does\s+not|will\s+not)\s+(?:heat|work|turn\s+on|charge)\b"
        r"|\bhas\s+a\s+(?:small\s+)?(?:tear|crack|hole|dent)\b|坏了|碎了|破了",
    ),
    (
        "replaced",
        "replacement",
        False,
        r"\breplaced\b|\breplacement\s+(?:is\s+|was\s+|has\s+been\s+)?(?:sent|shipped|dispatched)\b",
    ),
    ("returned", "return", True, r"\breturned\b|已退货"),
    ("cancelled", "cancellation", True, r"\bcancell?ed\b|已取消"),
    ("escalated", "issue", False, r"\bescalated\b|已升级"),
    (
        "resolved",
        "issue",
        True,
        r"\bresolved\b|\bfixed\b|\bsorted\s+out\b|\bclosed\b|\bcompleted\b|已解决|已关闭|已完成",
    ),
)
_STATES = tuple(
    (label, family, terminal, re.compile(pattern, re.IGNORECASE))
    for label, family, terminal, pattern in _STATE_TABLE
)
# Words just before a state that deny it or make it not (yet) true.
_NEGATED = re.compile(
    r"(?:\bnot|n't|\bno\s+longer|\bnever|\bnor|\byet\s+to|\bwithout|\bnobody|\bnothing)"
    r"\s+(?:[\w-]+\s+){0,2}$"
)
_HYPOTHETICAL = re.compile(
    r"\b(?:will|would|should|could|may|might|expected\s+to|going\s+to|if|once|until|unless"
    r"|hope|hoping)\s+(?:[\w-]+\s+){0,2}$"
)
_ZH_NEGATED = re.compile(r"[没未不](?:有)?$")


@dataclass(frozen=True)
class State:
    """A state a sentence asserts: ``label`` ("delivered"), ``family`` ("delivery"),
    ``terminal`` (it ends the story: delivered, refunded, resolved...), and the phrase."""

    label: str
    family: str
    terminal: bool
    phrase: str
    start: int


# A denied step of a delivery or a refund is a state of its own ("still hasn't shipped");
# a denied problem ("no longer delayed") says nothing by itself.
_DENIED = {"delivered": "not delivered", "shipped": "not shipped", "refunded": "not refunded"}


@text_memo  # every consolidation of a key re-reads its turns' sentences
def find_state(sentence: str) -> State | None:
    """The last state the sentence asserts, or None.

    "Your order is not delayed again: it left our warehouse" -> shipped (the denied
    "delayed" does not count); "It still hasn't shipped" -> not shipped.
    """
    lower = " ".join(sentence.lower().split())
    found: list[State] = []
    for label, family, terminal, pattern in _STATES:
        for m in pattern.finditer(lower):
            before = lower[max(0, m.start() - 40) : m.start()]
            if _HYPOTHETICAL.search(before):
                continue
            if _NEGATED.search(before) or _ZH_NEGATED.search(before):
                if label in _DENIED:
                    found.append(State(_DENIED[label], family, False, m.group(0), m.start()))
                continue
            found.append(State(label, family, terminal, m.group(0), m.start()))
    # the last one said; at one place the longer phrase ("arrived cracked" over "arrived")
    return max(found, key=lambda s: (s.start, len(s.phrase))) if found else None


# A promise: someone says they will do something. A due phrase alone ("within 48 hours",
# "by Friday") is not one, nor is a report of an old promise ("I was promised a follow-up").
COMMITMENT = re.compile(
    r"\b(?:i|we)(?:\s+will|'ll|’ll|\s+shall|\s+am\s+going\s+to|\s+are\s+going\s+to)\s+(?!not\b|never\b)"
    r"|\bwill\s+(?:call|get\s+back|contact|email|send|follow)\b|\bget\s+back\s+to\s+you\b"
    r"|\bcall\s+you\s+back\b|我会|我们会|我们将|将会|给您回",
    re.IGNORECASE,
)
_REPORTED_PROMISE = re.compile(r"\b(?:was|were)\s+promised\b|\bpromised\s+(?:me|us)\b")
# What a customer's own promise must be about to be worth tracking ("I'll send the photos"),
# so that "I will watch the door" is not an open action.
_USER_DELIVERABLE = re.compile(
    r"\b(?:send|email|call|upload|provide|share|return|confirm|pay|post|forward|bring|check)\b"
)
_PROMISE_VERB = re.compile(
    r"\b(?:i|we)(?:\s+will|'ll|\s+shall|\s+am\s+going\s+to|\s+are\s+going\s+to)\s+"
    r"(?:(?:also|then|now|personally|just|definitely)\s+)?(\w+)"
    r"|\bwill\s+(\w+)",
)


@text_memo
def is_commitment(sentence: str, role: str) -> bool:
    """Whether the sentence promises something: any promise of the agent; a user's only when
    it is about something to send, call or provide."""
    lower = sentence.lower()
    if COMMITMENT.search(lower) is None or _REPORTED_PROMISE.search(lower):
        return False
    return role != "user" or _USER_DELIVERABLE.search(lower) is not None


# Completion words and the past tense of what was promised: "done", "sent", "emailed".
DONE = re.compile(
    r"\b(?:done|resolved|completed|fixed|closed|called\s+(?:you\s+)?back|sent|emailed|followed\s+up"
    r"|got\s+back|processed|issued|arranged|confirmed)\b|已完成|已解决|已处理|已回电|已发送"
)
# Receiving the promised thing, said by the one it was promised to.
_RECEIVED = re.compile(r"\b(?:got|received|came|arrived|have\s+it|has\s+arrived)\b|收到")
# States of the promised thing that mean it was done: it exists, moved or was paid.
_FULFILS = frozenset(
    ("delivered", "out for delivery", "shipped", "faulty", "returned", "refunded", "replaced")
)
_IRREGULAR_PAST = {"send": "sent", "get": "got", "give": "gave", "make": "made", "call": "called"}
# Words of a promise that say nothing about *what* was promised (for matching it to "done").
PROMISE_WORDS = frozenset(
    tokenize(
        "call back follow up within hours days today tomorrow evening morning latest soon "
        "let know get confirm confirmed check 我会 跟进"
    )
)
# Which state family a promise is about: when that story ends, the promise is moot.
_ACTION_FAMILY = (  # money first: "refund the delivery fee" is about the refund
    ("refund", re.compile(r"\b(?:refund\w*|money|charge\w*|credit\w*|reimburs\w*)\b|退款")),
    (
        "delivery",
        re.compile(r"\b(?:ship\w*|track\w*|deliver\w*|courier|parcel|dispatch\w*)\b|物流|发货"),
    ),
    ("replacement", re.compile(r"\breplac\w*\b|换货")),
)
_GENERIC_ACTION = re.compile(
    r"\b(?:follow\s+up|follow-up|get\s+back|call\s+you\s+back|update\s+you|let\s+you\s+know"
    r"|keep\s+you\s+posted)\b|跟进|回电|回复您|联系您"
)


def action_family(action: str) -> str | None:
    """The state family an open action is about ("delivery" for "I'll email the tracking
    number"), "any" for a bare follow-up or callback, None when it is about something else."""
    lower = action.lower()
    for family, pattern in _ACTION_FAMILY:
        if pattern.search(lower):
            return family
    return "any" if _GENERIC_ACTION.search(lower) else None


def moot(family: str | None, state: State) -> bool:
    """Whether a terminal ``state`` ends the story a promise of ``family`` belongs to: a
    delivery promise once delivered, a bare follow-up once anything ends, all once resolved."""
    return state.terminal and (
        (family is not None and family in (state.family, "any")) or state.family == "issue"
    )


def resolves(action: str, later: str, ignore: Collection[str] = ()) -> bool:
    """Whether a later sentence says the promised thing happened.

    It must name what was promised (a content word of the action other than the promise's
    own words and ``ignore``, the words of the memory's own entity) and say it is done: a
    completion word, the past tense of the promised verb ("I'll email you" -> "emailed"),
    or receipt ("I got the tracking email").
    """
    lower = later.lower()
    words = set(tokenize(action)) - PROMISE_WORDS - set(ignore)
    if not words & set(tokenize(later)):
        return False
    if DONE.search(lower) or _RECEIVED.search(lower):
        return True
    state = find_state(later)
    if state is not None and state.label in _FULFILS:
        return True  # "the replacement has stopped working too": it was sent
    m = _PROMISE_VERB.search(action.lower())
    verb = next((g for g in m.groups() if g), None) if m else None
    if verb is None:
        return False
    past = _IRREGULAR_PAST.get(verb) or (verb + "d" if verb.endswith("e") else verb + "ed")
    return re.search(rf"\b{re.escape(past)}\b", lower) is not None


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
