"""Chatter: turns that say nothing a support bot needs later (greetings, thanks,
acknowledgements, "one moment", weather talk, "anything else?", goodbyes).

``memory.text.is_small_talk`` decides by word lists, so it misses wordings nobody listed
("Lovely, thank you." has a content word, "lovely"). Here the decision is by meaning and
by structure:

* meaning: the turn's sentence vector is compared with vectors of exemplar sentences of
  each kind of chatter (written here, in our own words) and of exemplar *content*
  sentences (orders, deliveries, contact preferences, apologies that report an action,
  personal news). A turn is chatter only when its nearest chatter exemplar is close
  (``min_cosine``) and clearly closer than its nearest content exemplar (``min_margin``,
  plus ``word_margin`` per content word past ``FREE_WORDS``): the margin is what keeps
  "What are my options?" (near "what can I help you with?") on the content side.
* structure, which can only veto: a turn that names an entity or any digit, asks a
  wh-question about a time, place, amount or reason, is long, or has more than a few
  content words is never chatter, whatever its vector says. Losing a fact costs far more
  than keeping a greeting, so every guard errs towards content.

The module loads no model. The caller embeds ``exemplar_texts()`` once with the same
encoder it embeds turns with (all-MiniLM-L6-v2, unit rows) and builds ``Prototypes``;
e.g. ``Prototypes.build(lambda texts: encoder.encode(texts, cache=True))``, held for the
process's life (159 exemplars: ~0.5 s of encoder time, once). Cost per turn after that:
a (159 x 384) matrix-vector product (~61k multiply-adds, microseconds) plus the memoised
``memory.text`` tokenise/entity pass and three short regexes; no encoder call beyond the
turn's own vector, which memorize computes anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from memstream.memory.text import extract_entities, tokenize
from memstream.memory.vectors import FloatArray

# --- exemplars ------------------------------------------------------------------------------
# Each kind is several wordings on purpose: the nearest exemplar decides, so a kind with one
# wording only catches near copies of it. Sentences are short and generic (no product, no
# shop name) so that what is close to them is close by the social act, not by a topic.

CHATTER: dict[str, tuple[str, ...]] = {
    "greeting": (
        "Hello.",
        "Hey!",
        "Hiya, how are you?",
        "Good evening.",
        "Hello there, hope you are well.",
        "Hey, is anybody there?",
        "Hi, I was hoping someone could help me out.",
        "Hello, have you got a moment?",
        "Morning all.",
        "Hey, how's it going?",
    ),
    "agent_greeting": (
        "Welcome to customer support, what can I do for you?",
        "Hello, you are chatting with the help desk. How may I help?",
        "Thanks for getting in touch, how can we help you today?",
        "Hi, my name is Sam and I'll be looking after you today.",
        "Good afternoon, you've reached our service team. What do you need?",
        "Hello and welcome, what brings you here today?",
        "Hi, what can I help you with?",
    ),
    "hold_on": (
        "Please hold on a moment.",
        "Give me a minute to look into this.",
        "Let me just pull up your details.",
        "Bear with me while I take a look.",
        "Checking that for you now, won't be long.",
        "Just a second, I'm looking at it.",
        "Still here, just reading through your account.",
        "Sorry for the wait, nearly done.",
        "Let me have a quick look.",
        "Looking that up now.",
        "One sec, I'm pulling up the records.",
        "I'm just checking the details on my end.",
    ),
    "thanks_ack": (
        "Thanks.",
        "Thank you very much.",
        "Okay.",
        "Sounds good.",
        "Got it, cheers.",
        "Ah, I see.",
        "Fair enough.",
        "Perfect, that's great.",
        "Much appreciated.",
        "Makes sense, thanks.",
        "Oh nice, good to know.",
        "Wonderful, thank you so much.",
        "Great, thanks for that.",
        "Ok cool.",
        "That's really kind of you, thanks.",
        "Fantastic.",
    ),
    "agent_ack": (
        "You're welcome.",
        "No problem at all.",
        "Happy to help.",
        "Good to hear.",
        "That's great news.",
        "Noted, thank you.",
        "Thanks for confirming.",
        "Thanks for letting me know.",
        "Not a problem.",
        "I'm glad that helped.",
        "Of course, anytime.",
    ),
    "chitchat": (
        "What a grey day it is.",
        "It's been so hot this week.",
        "The rain hasn't stopped all day.",
        "Freezing cold out there this morning.",
        "How's your week going?",
        "Busy day today?",
        "I'm running on empty today, ha.",
        "Ugh, what a week it's been.",
        "Doing anything fun this weekend?",
        "Hope you're having a good day.",
        "How are you doing today?",
        "It's been one of those days, honestly.",
    ),
    "agent_chitchat": (
        "Ha, tell me about it.",
        "Same here, it's been a long day.",
        "That sounds nice, enjoy it.",
        "I'm doing well, thanks for asking.",
        "Oh, fingers crossed the sun comes out.",
        "Haha, I know the feeling.",
        "Nothing exciting planned for me.",
        "I hope it gets better for you.",
    ),
    "offer_more": (
        "Is there anything more I can do for you?",
        "Do you need help with anything else?",
        "Anything further I can help with today?",
        "Was there something else you wanted to ask?",
        "Can I do anything else for you?",
        "Is that all for today?",
    ),
    "nothing_else": (
        "No, that's everything.",
        "That's all I needed, thanks.",
        "Nothing else, thank you.",
        "I'm all good now.",
        "No, I'm fine, thanks.",
        "That's all from me.",
        "Nope, that's it.",
    ),
    "signoff": (
        "Goodbye!",
        "Take care now.",
        "Have a great evening.",
        "Thanks for your time, bye.",
        "Talk to you later.",
        "Enjoy the rest of your day.",
        "Bye for now.",
        "Thanks again, goodbye.",
        "Have a nice weekend.",
        "Cheers, see you.",
    ),
}

# What chatter must be told apart from: turns that carry a fact or a request, but have no
# entity and few words, so only their meaning says so. Customer-service matters first, then
# the personal news a companion bot hears (LoCoMo).
CONTENT: tuple[str, ...] = (
    "My parcel still hasn't arrived.",
    "The item arrived broken.",
    "I'd like a refund please.",
    "Can you change my delivery address?",
    "When will my order turn up?",
    "What are my options?",
    "What can you do about this?",
    "We'll send you a replacement.",
    "I've escalated this to our warehouse team.",
    "I'm sorry, I've raised it with my manager.",
    "The courier left it with a neighbour.",
    "Please email me rather than calling.",
    "I'll arrange a callback for you tomorrow.",
    "Your refund has been processed.",
    "It should reach you by the end of the week.",
    "No action is needed on your part, we'll keep watching it.",
    "You'll get a text when it is out for delivery.",
    "I want to cancel my subscription.",
    "The tracking page hasn't updated in days.",
    "Do I need to send anything back?",
    "Can you look into this for me?",
    "I was promised a voucher and never got it.",
    "I'm allergic to nuts.",
    "I moved house last month.",
    "I went hiking with my family last weekend.",
    "I'm thinking about changing careers.",
    "My sister is getting married soon.",
    "I started painting again recently.",
    "We adopted a puppy.",
    "I've been volunteering at the shelter.",
    "That book really changed how I see things.",
    "My kids love going to the beach.",
    "I'm training for a marathon.",
    "I just finished a pottery class.",
    "I'm going to a concert next week.",
    "Any update on my delivery?",
    "What's the latest with my order?",
    "Where has my package got to?",
    "We'll pick up the faulty item from your house.",
    "A courier will collect the return.",
    "Someone from your team phoned me as promised.",
    "You rang me back like you said you would.",
    "Please text me instead of phoning.",
    "Only contact me in the evenings.",
    "Could you reply in Spanish?",
    "English isn't my first language.",
    "It's a birthday present for my mum.",
    "Please leave the price tag out, it's a gift.",
    "There's a hold-up at the depot.",
    "The parcel is stuck in transit.",
    "It finally arrived yesterday.",
    "The driver delivered it this morning.",
    "Apologies, I've added a note to your file.",
    "Sorry, that was our mistake.",
    "I'm still waiting on the money you promised.",
    "Nobody ever called me back.",
    "I want this fixed properly.",
    "This needs resolving today.",
    "Sorry, my cat is walking on the keyboard.",
    "I've updated your details.",
)

# --- structure ------------------------------------------------------------------------------

_DIGIT = re.compile(r"\d")
# A question about when, where, which, why or how much/long/many asks for a fact, and so
# does one about what the speaker must do ("do I need to...?"); "how are you?" and "can I
# help with anything else?" (an offer) are left to the vectors.
_INFO_QUESTION = re.compile(
    r"\b(?:when|where|which|why|whose|how\s+(?:much|many|long|soon|often|far))\b[^?]*\?"
    r"|\b(?:(?:do|should|must|shall|am)\s+i|i\s+(?:need|have|ought)\s+to)\b[^?]*\?",
    re.IGNORECASE,
)
# Named days and months are dates that ``extract_entities`` leaves alone ("on Friday"): a
# closed class, so a structural test, not a phrase list.
_DATE_WORD = re.compile(
    r"\b(?:mon|tues|wednes|thurs|fri|satur|sun)days?\b"
    r"|\b(?:january|february|march|april|june|july|august|september|october|november"
    r"|december)\b",
    re.IGNORECASE,
)
MAX_CHARS = 120  # a longer turn has room for a fact; chatter is short
MAX_CONTENT_WORDS = 6  # tokens left by ``memory.text.tokenize`` (stopwords dropped)


def structural_veto(text: str) -> str | None:
    """Why ``text`` cannot be chatter, whatever it means ("entity", "digit", ...), or None."""
    if len(text) > MAX_CHARS:
        return "long"
    if _DIGIT.search(text):
        return "digit"
    if extract_entities(text):
        return "entity"
    if _DATE_WORD.search(text):
        return "date"
    if _INFO_QUESTION.search(text):
        return "question"
    if len(tokenize(text)) > MAX_CONTENT_WORDS:
        return "words"
    return None


# --- vectors --------------------------------------------------------------------------------

MIN_COSINE = 0.30  # the nearest chatter exemplar at least this close (MiniLM cosines run low)
MIN_MARGIN = 0.06  # ... and this much closer than the nearest content exemplar
# Each content word past ``FREE_WORDS`` asks for this much more margin: a long turn has to
# be very plainly chatter (a greeting with a shop name) to lose its words.
FREE_WORDS = 2
WORD_MARGIN = 0.02
# Chatter score: mean cosine to the k nearest chatter exemplars. 1 did best on half A: the
# kinds are narrow, so a turn sits near one exemplar of its kind, not near two.
TOP_K = 1


def exemplar_texts() -> tuple[list[str], list[str]]:
    """(chatter exemplars, content exemplars): what the caller embeds once for ``Prototypes``."""
    return [s for kind in CHATTER.values() for s in kind], list(CONTENT)


@dataclass(frozen=True)
class Prototypes:
    """Unit rows of the exemplars, embedded by the caller's encoder (same model as turns)."""

    chatter: FloatArray = field(repr=False)  # (n_chatter, d)
    content: FloatArray = field(repr=False)  # (n_content, d)

    @classmethod
    def build(cls, encode: Callable[[Sequence[str]], FloatArray]) -> Prototypes:
        chatter, content = exemplar_texts()
        return cls(np.asarray(encode(chatter), np.float32), np.asarray(encode(content), np.float32))


@dataclass(frozen=True)
class Verdict:
    chatter: bool
    score: float  # cosine to the nearest chatter exemplar(s), see TOP_K
    margin: float  # score minus the cosine to the nearest content exemplar
    veto: str | None  # the structural reason it cannot be chatter, if any


def judge(
    texts: Sequence[str],
    vectors: FloatArray,
    prototypes: Prototypes,
    *,
    min_cosine: float = MIN_COSINE,
    min_margin: float = MIN_MARGIN,
    word_margin: float = WORD_MARGIN,
) -> list[Verdict]:
    """One ``Verdict`` per turn; ``vectors`` are the turns' unit rows, in ``texts`` order."""
    if len(texts) != len(vectors):
        raise ValueError(f"{len(texts)} texts but {len(vectors)} vectors")
    if not texts:
        return []
    v = np.asarray(vectors, np.float32)
    chat = v @ prototypes.chatter.T  # (n, n_chatter)
    k = min(TOP_K, chat.shape[1])
    score = np.sort(chat, axis=1)[:, -k:].mean(axis=1)
    nearest_content = (v @ prototypes.content.T).max(axis=1) if prototypes.content.size else 0.0
    margin = score - nearest_content
    out = []
    for text, s, m in zip(texts, score.tolist(), margin.tolist(), strict=True):
        veto = structural_veto(text)
        need = min_margin + word_margin * max(0, len(tokenize(text)) - FREE_WORDS)
        out.append(Verdict(veto is None and s >= min_cosine and m >= need, s, m, veto))
    return out


def chatter_mask(texts: Sequence[str], vectors: FloatArray, prototypes: Prototypes) -> list[bool]:
    """Which turns are chatter: the decision ``judge`` makes, without its diagnostics."""
    return [v.chatter for v in judge(texts, vectors, prototypes)]
