"""Text signals, in English and Chinese: salience, "remember this", entities, lexical tokens.

Everything here is a cheap heuristic on purpose: it runs on every turn, next to an encoder
that costs far more, and its job is only to gate (salience), to pin, and to produce exact
keys (entities) that embeddings are bad at (an order number must match exactly).
"""

from __future__ import annotations

import hashlib
import re
import threading
import unicodedata
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import date
from functools import lru_cache, wraps
from typing import Concatenate, ParamSpec, TypeVar, cast

T = TypeVar("T")
P = ParamSpec("P")

# Per-text memos (the functions are pure): a turn's text is read by memorize (salience,
# pin, entities, fingerprints: several times per event), by the archive, and again by every
# consolidation of its key (the extractive consolidator re-reads up to 40 turns per trigger).
# Results are immutable (tuples, bools, frozen dataclasses); the public functions hand out
# fresh lists. Only texts of a turn's size are kept (a long paste or a memory's text is
# computed each time), so each memo holds at most 8,192 texts of up to 500 characters.
TEXT_MEMO = 8_192
MEMO_MAX_CHARS = 500


class _ReadingOnce(threading.local):
    on = False  # a class default: reading it never raises (a plain local would, per call)


_reading_once = _ReadingOnce()


@contextmanager
def read_once() -> Iterator[None]:
    """On this thread, texts read inside are not memoised: a bulk read (a user's whole
    history indexed for the RPC) reads each text once, and kept, thousands of them would
    only evict the texts memorize and consolidation read again."""
    before = _reading_once.on
    _reading_once.on = True
    try:
        yield
    finally:
        _reading_once.on = before


def text_memo(fn: Callable[Concatenate[str, P], T]) -> Callable[Concatenate[str, P], T]:
    """``fn`` memoised on its (hashable) arguments for texts up to ``MEMO_MAX_CHARS``
    (outside ``read_once``); its signature, defaults included, is kept."""
    # lru_cache types its arguments as Hashable; these are texts and the callers' constants.
    cached = cast("Callable[Concatenate[str, P], T]", lru_cache(maxsize=TEXT_MEMO)(fn))

    @wraps(fn)
    def call(text: str, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if len(text) > MEMO_MAX_CHARS or _reading_once.on:
            return fn(text, *args, **kwargs)
        return cached(text, *args, **kwargs)

    return call


# CJK ideographs (incl. extension A and compatibility) and Japanese kana: scripts written
# without spaces, so they are tokenised by characters, not by words.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN_RE = re.compile(
    rf"(?P<cjk>[{_CJK}]+)"
    rf"|(?P<word>[^\W_{_CJK}]+(?:['\-][^\W_{_CJK}]+)*)"
)

_CJK_RE = re.compile(f"[{_CJK}]+")


def word_set(words: str) -> frozenset[str]:
    """The words of a whitespace-separated list, as a set: how word lists are written."""
    return frozenset(words.split())


_STOPWORDS = word_set(
    """
    a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its
    itself just me more most my myself no nor not of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    s t d ll m re ve
    i'm i've i'll i'd you're you've you'll you'd he's she's it's we're we've we'll we'd they're
    they've they'll they'd that's there's what's let's don't doesn't didn't isn't aren't wasn't
    weren't haven't hasn't hadn't won't wouldn't can't cannot couldn't shouldn't
    """
)

# Words that carry no information in a customer-service chat on their own: greetings, thanks,
# acknowledgements. They never count as content words for salience.
_FILLER_WORDS = word_set(
    """
    hi hello hey hiya yo greetings morning afternoon evening night good goodnight thanks thank
    thx ty cheers appreciate appreciated much lot ok okay okey k kk fine great cool nice awesome
    perfect sure yes yeah yep yup no nope nah alright right got it bye goodbye later see soon
    welcome please pls plz lol haha hmm um uh ah oh wow sorry np noted understood
    """
)

_ZH_FILLER_PHRASES = (
    "你好",
    "您好",
    "谢谢",
    "多谢",
    "感谢",
    "好的",
    "好吧",
    "再见",
    "拜拜",
    "没问题",
    "不客气",
    "没关系",
    "收到",
    "明白",
    "知道了",
    "是的",
    "对的",
    "早上好",
    "下午好",
    "晚上好",
    "晚安",
    "哈哈",
    "嗯嗯",
    "请问",
    "想问一下",
    "问一下",
    "在吗",
    "辛苦了",
    "麻烦了",
    "好",
)
# Particles and pronouns: a turn made only of these and filler phrases says nothing.
_ZH_FILLER_CHARS = frozenset("嗯哦噢啊呀呢吧吗么哈嘿喂了的我你您")

# A support agent's conversational frame: self-introductions, offers of help, sign-offs.
# Every session opens and closes with them, so without this they would recur across
# sessions and fire consolidation on nothing. Removed before content words are counted.
# Linear time: a run of one class is read by one quantifier, or starts after a literal. In
# the first branch the spaces around the name are possessive (``\s++``: the name and
# "support" start with a non-space), so the spaces after "welcome to" are read once, not
# split every way between three quantifiers (48 s on 8,000 spaces).
_AGENT_FRAME = re.compile(
    r"""
      \b(?:welcome\s+to|this\s+is\s+\w+\s+from)\s++[\w'][\w' ]{0,39}?\s++(?:support|team|service)\b
    | \b(?:this\s+is|my\s+name\s+is)\s+\w+\b
    | \b\w+\s+here\b(?=\s*[.!,])
    | \b(?:how|what)\s+can\s+i\s+(?:help|do\s+for)(?:\s+you)?(?:\s+with)?(?:\s+today)?\b
    | \b(?:is\s+there\s+)?anything\s+else(?:\s+i\s+can\s+help(?:\s+you)?\s+with)?(?:\s+today)?\b
    | \b(?:you'?re|you\s+are)\s+(?:very\s+|most\s+)?welcome\b
    | \bmy\s+pleasure\b
    | \bthanks?(?:\s+you)?(?:\s+(?:so|very)\s+much)?\s+for
          \s+(?:your\s+patience|letting\s+(?:us|me)\s+know|asking|reaching\s+out|waiting)\b
    | \b(?:have\s+a\s+)?(?:nice|great|good|lovely)\s+(?:day|evening|weekend|afternoon)\b
    | \b(?:take\s+care|speak\s+(?:soon|tomorrow|later))\b
    | \b(?:glad|great|good|wonderful|nice)\s+to\s+hear(?:\s+(?:it|that))?\b
    | \bstay\s+safe\b | \b(?:chat|talk|see\s+you)\s+(?:soon|later|tomorrow)\b
    | \b(?:happy|glad)\s+(?:to|i\s+could)\s+help\b | \bhope\s+(?:this|that)\s+helps\b
    | \b(?:no,?\s+)?that'?s\s+(?:all|everything)(?:\s+for\s+(?:now|today))?\b
    | \bsorry\s+(?:again\s+)?(?:for|about)\s+the\s+(?:wait|inconvenience|trouble|delay)\b
    | \b(?:enjoy|have)\s+(?:the|your)\s+(?:day|evening|weekend)\b
    | 请问有什么可以帮(?:您|你)的?|还有其他(?:问题|需要)吗|祝您愉快|祝你愉快
    """,
    re.IGNORECASE | re.VERBOSE,
)

_MIN_CONTENT_WORDS = 3
_MIN_CJK_CONTENT_CHARS = 4


def _normalise(text: str) -> str:
    """NFKC folds full-width forms ("７７８", "＃", "：") to ASCII; one kind of dash and quote."""
    text = unicodedata.normalize("NFKC", text)
    text = re.sub("[\u2010-\u2015\u2212\ufe63]", "-", text)
    return re.sub("[\u2018\u2019\u02bc]", "'", text)


def _strip_possessive(word: str) -> str:
    return word[:-2] if word.endswith("'s") else word


# The question marks of the scripts memstream reads: ASCII, full width (CJK), Arabic, Greek.
QUESTION_MARKS = ("?", "\uff1f", "\u061f", "\u037e")


def ends_in_question(text: str) -> bool:
    """Whether ``text`` ends by asking something (its last mark is a question mark)."""
    return text.rstrip().endswith(QUESTION_MARKS)


def tokenize(text: str) -> list[str]:
    """Lowercase tokens for lexical scoring and keywords, in text order.

    Words (letters/digits, inner hyphens kept so "a-10293" stays one token) minus a small
    English stopword list; CJK runs become character bigrams (a lone character stays a unigram),
    the usual way to index Chinese without a segmenter.
    """
    return list(_tokens(text))


@text_memo
def _tokens(text: str) -> tuple[str, ...]:
    tokens: list[str] = []
    for match in _TOKEN_RE.finditer(_normalise(text).lower()):
        cjk = match.group("cjk")
        if cjk is not None:
            if len(cjk) == 1:
                tokens.append(cjk)
            else:
                tokens.extend(cjk[i : i + 2] for i in range(len(cjk) - 1))
            continue
        word = match.group("word")
        if word in _STOPWORDS:
            continue
        word = _strip_possessive(word)
        if word and word not in _STOPWORDS:
            tokens.append(word)
    return tuple(tokens)


def _cjk_content_chars(text: str) -> int:
    cjk = "".join(_CJK_RE.findall(text))
    for phrase in _ZH_FILLER_PHRASES:
        cjk = cjk.replace(phrase, "")
    return sum(1 for ch in cjk if ch not in _ZH_FILLER_CHARS)


def is_salient(text: str, common_phrases: Collection[str] = ()) -> bool:
    """Whether a turn carries information worth remembering (RecMem's salience filter).

    False for greetings, thanks, acknowledgements, an agent's conversational frame ("Hi,
    this is Maria from Brightside Home support. How can I help?"), emoji or punctuation
    only, and very short turns: fewer than 3 content words and fewer than 4 meaningful CJK
    characters once the frame is removed. Sentences whose ``phrase_keys`` fingerprint is in
    ``common_phrases`` (a bot's canned lines: ``memory.memorize.canned_phrases``) are
    removed first, so they count for nothing either. A turn that
    names an entity (an order number, an email...) is always salient, however short: "order
    55123" is exactly what memory is for.
    """
    common = common_phrases if isinstance(common_phrases, frozenset) else frozenset(common_phrases)
    return _salient(text, common)


@text_memo
def _salient(text: str, common_phrases: frozenset[str]) -> bool:
    words, cjk = _content(text, common_phrases)
    return words >= _MIN_CONTENT_WORDS or cjk >= _MIN_CJK_CONTENT_CHARS


def is_small_talk(text: str) -> bool:
    """Whether a turn says nothing at all to a reader: no entity and not one content word
    (nor two meaningful CJK characters) once greetings, thanks, acknowledgements and the
    agent's conversational frame are taken out. Looser than ``is_salient``'s "not worth
    consolidating": "hiking in the mountains" is too short to recur on, yet it is a fact."""
    words, cjk = _content(text, frozenset())
    return words == 0 and cjk < 2


@text_memo
def _content(text: str, common_phrases: frozenset[str]) -> tuple[int, int]:
    """(content words, meaningful CJK characters) of a turn; an entity counts as plenty."""
    normalised = _normalise(text)
    if extract_entities(normalised):
        return _MIN_CONTENT_WORDS, _MIN_CJK_CONTENT_CHARS
    if common_phrases:
        normalised = " ".join(
            sentence
            for sentence in _PHRASE_SPLIT.split(normalised)
            if _phrase_key(sentence) not in common_phrases
        )
    normalised = _AGENT_FRAME.sub(" ", normalised)
    words = [t for t in tokenize(normalised) if t not in _FILLER_WORDS and not _CJK_RE.match(t)]
    return len(words), _cjk_content_chars(normalised)


# Phrase fingerprints: a sentence's fingerprint is its tokens (stopwords dropped, every
# number one symbol), hashed. memorize keeps, per user, the fingerprints the bot said to
# them; said again, they are canned lines (``memory.memorize.canned_phrases``).
_PHRASE_SPLIT = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])|\n+")
_MIN_PHRASE_TOKENS = 2
_MAX_PHRASES = 16  # per turn: a long paste is not a phrase list


def _phrase_key(sentence: str) -> str | None:
    tokens = ["0" if _HAS_DIGIT.search(t) else t for t in tokenize(sentence)]
    if len(tokens) < _MIN_PHRASE_TOKENS:
        return None
    return hashlib.blake2b(" ".join(tokens).encode(), digest_size=8).hexdigest()


def phrase_keys(text: str) -> list[str]:
    """Fingerprints of the turn's sentences (2+ tokens each), unique, in text order."""
    return list(_phrase_keys(text))


@text_memo
def _phrase_keys(text: str) -> tuple[str, ...]:
    keys = (_phrase_key(s) for s in _PHRASE_SPLIT.split(_normalise(text)))
    return tuple(dict.fromkeys(k for k in keys if k is not None))[:_MAX_PHRASES]


# "remember"/"note" only in an imperative position, so "I remember buying it" or "do you
# remember when..." (a recall question) are not requests to store something.
_IMPERATIVE = r"(?:^|[.!?;,:]\s*|\b(?:please|pls|plz|kindly|and|also|but|so)\s+)"
_REMEMBER_EN = re.compile(
    rf"""
      {_IMPERATIVE}(?:remember|memori[sz]e|note|keep\s+in\s+mind)\b
          (?!\s+(?:when|what|how|who|where|why|if|whether)\b)
    | {_IMPERATIVE}(?:do\s+not|don'?t|never)\s+forget\b
    | \b(?:can|could|would|will)\s+you\s+(?:please\s+)?
          (?:remember|memori[sz]e|note)\s+(?:that|this)\b
    | \bkeep\s+(?:this|that|it)\s+in\s+mind\b
    | \b(?:make|take)\s+a\s+note\b
    | \b(?:want|need|would\s+like)\s+you\s+to\s+(?:remember|note|keep\s+in\s+mind)\b
    | \bfor\s+future\s+reference\b
    """,
    re.IGNORECASE | re.VERBOSE,
)
_REMEMBER_ZH = re.compile(
    "请记住|记住|请记得|要记得|一定记得|别忘了|别忘记|不要忘了|不要忘记|帮我记|记一下|记下来|请记录|备忘"
)


@text_memo
def is_remember_request(text: str) -> bool:
    """An explicit request to store something: "remember this", "note that…", "记住", "别忘了"."""
    normalised = _normalise(text).strip()
    return bool(_REMEMBER_EN.search(normalised) or _REMEMBER_ZH.search(normalised))


# --- entities ------------------------------------------------------------------------------
#
# Extractors run in a fixed order over a working copy of the text; each match is masked
# (replaced by NUL, which no pattern matches) so a later, looser extractor cannot re-read the
# same characters: an order number is not also a phone number, a date's "3rd" not a product.

_MASK = "\x00"
_ID = r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*"  # hyphens only between characters
_NOT_BEFORE = r"(?<![A-Za-z0-9-])"
_NOT_AFTER = r"(?![A-Za-z0-9-])"
_HAS_DIGIT = re.compile(r"\d")
_HAS_LETTER = re.compile(r"[A-Za-z]")

_URL_RE = re.compile(r"(?:https?://|www\.)[^\s\x00]+", re.IGNORECASE)
# Two-part postal codes (UK "MB11 3RH", "SW1A 1AA"; Canada "K1A 0B1"): part of an address,
# whose halves would otherwise read as two product codes.
_POSTCODE_RE = re.compile(
    r"(?<![A-Za-z0-9])(?:[A-Z]{1,2}\d[A-Z\d]?\s+\d[A-Z]{2}|[A-Z]\d[A-Z]\s?\d[A-Z]\d)(?![A-Za-z0-9])"
)
_EMAIL_RE = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
)
# "<noun> [number|no.|#|id] [is|:] <ID>"; whether an explicit marker was used decides how
# strict the ID check is ("order 5" is a quantity, "order #512" is an order).
_MARKER_WORDS = r"(?:number|num|id|ref|reference|code)\b|no\b\.?"
# A bounded run of single separator items: each item starts differently, so a failed match
# backtracks at most 12 steps (nested or repeated "[\s:#]*" would be cubic on long space runs).
_SEP = rf"(?P<sep>(?:[\s:#]|{_MARKER_WORDS}|(?:is|was)\b){{0,12}})"
# The Chinese separator "\s*(?:是|为)?[\s:#]*" with each run read by one quantifier: with no
# "是" its two runs met ("\s*[\s:#]*", quadratic on spaces), so the second starts at ":"/"#".
_ZH_SEP = r"\s*(?:(?:是|为)[\s:#]*|[:#][\s:#]*)?"
_ORDER_EN_RE = re.compile(
    rf"(?<![A-Za-z])orders?(?![A-Za-z]){_SEP}(?P<id>{_ID}){_NOT_AFTER}", re.IGNORECASE
)
# "ORD-2291", "ORDER12345": the prefix itself says it is an order.
_ORDER_PREFIXED_RE = re.compile(
    rf"{_NOT_BEFORE}(?P<id>ORD(?:ER)?-?\d[A-Za-z0-9]*(?:-[A-Za-z0-9]+)*){_NOT_AFTER}", re.IGNORECASE
)
_ORDER_ZH_RE = re.compile(
    rf"(?:订单|訂單)(?:号码|号|編號|编号|单号)?{_ZH_SEP}(?P<id>{_ID}){_NOT_AFTER}"
)
_TRACKING_EN_RE = re.compile(
    rf"(?<![A-Za-z])tracking(?![A-Za-z]){_SEP}(?P<id>{_ID}){_NOT_AFTER}", re.IGNORECASE
)
_TRACKING_ZH_RE = re.compile(
    rf"(?:运单|快递单|物流单|快递|跟踪|追踪)(?:号码|号|编号){_ZH_SEP}(?P<id>{_ID}){_NOT_AFTER}"
)
_PRODUCT_MARKED_RE = re.compile(
    rf"(?<![A-Za-z])(?:sku|model|part|item|product)(?![A-Za-z]){_SEP}(?P<id>{_ID}){_NOT_AFTER}",
    re.IGNORECASE,
)
_PRODUCT_ZH_RE = re.compile(
    rf"(?:型号|货号|商品编号|商品编码|产品编号|产品型号|款号){_ZH_SEP}(?P<id>{_ID}){_NOT_AFTER}"
)
_CODE_TOKEN_RE = re.compile(rf"{_NOT_BEFORE}(?P<id>{_ID}){_NOT_AFTER}")

_MONTHS = {
    "jan": 1,
    "january": 1,
    "feb": 2,
    "february": 2,
    "mar": 3,
    "march": 3,
    "apr": 4,
    "april": 4,
    "may": 5,
    "jun": 6,
    "june": 6,
    "jul": 7,
    "july": 7,
    "aug": 8,
    "august": 8,
    "sep": 9,
    "sept": 9,
    "september": 9,
    "oct": 10,
    "october": 10,
    "nov": 11,
    "november": 11,
    "dec": 12,
    "december": 12,
}
_MONTH = "(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>\d{4})"
_DATE_ISO_RE = re.compile(  # 2026-03-03, 2026/3/3, 2026.03.03 (one separator throughout)
    r"(?<![0-9])(?P<year>\d{4})(?P<sep>[-/.])(?P<month>\d{1,2})(?P=sep)(?P<day>\d{1,2})(?![0-9])"
)
_DATE_MDY_RE = re.compile(rf"(?<![A-Za-z]){_MONTH}\s+{_DAY},?\s+{_YEAR}(?![0-9])", re.IGNORECASE)
_DATE_DMY_RE = re.compile(
    rf"(?<![A-Za-z0-9]){_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}(?![0-9])", re.IGNORECASE
)
_DATE_ZH_RE = re.compile(
    r"(?<![0-9])(?P<year>\d{4})\s*年\s*(?P<month>\d{1,2})\s*月\s*(?P<day>\d{1,2})\s*[日号]"
)
# Digits with the usual separators; must start and end on a digit (after an optional "+").
# "$" before it means a price; letters or digits around it mean it is part of something else.
_PHONE_RE = re.compile(r"(?<![A-Za-z0-9+$€£¥.,])\+?\d(?:[\d ().-]*\d)?(?![A-Za-z0-9])")
# "#4926978": a number written after "#" is a reference (an order, unless the word before
# says ticket, case, room...), never a phone number.
_HASH_ID_RE = re.compile(rf"(?<![A-Za-z0-9#&])#\s?(?P<id>{_ID}){_NOT_AFTER}")
_HASH_NOT_ORDER = re.compile(
    r"\b(?:ticket|case|invoice|issue|room|apt|apartment|unit|suite|flat|house|step|item|line"
    r"|page|rank|size|number|no)\.?\s*$",
    re.IGNORECASE,
)
# A run of bare digits (no "+", no separators) is a phone number only when it is long enough
# to be one on its own (10+ digits) or the words just before it say phone, call, mobile...
# Read on the ``_PHONE_CUE_CHARS`` before the number only; the lookahead says so, so that on
# a long text each start costs that many steps at most (a run of "号" was quadratic).
_PHONE_CUE_CHARS = 30
_PHONE_CUE = re.compile(
    rf"(?=[\s\S]{{0,{_PHONE_CUE_CHARS}}}\Z)"
    r"(?:phone|call|tel|mobile|cell|number|whatsapp|sms|text|reach|电话|手机|号码|号)\W{0,3}"
    r"(?:\w+\W+){0,3}$",
    re.IGNORECASE,
)
_MIN_BARE_PHONE_DIGITS = 10
# Both are used with fullmatch; the left anchor and the possessive run keep a search over a
# long run of digits linear (a match is tried from the run's first digit only).
_DECIMAL_RE = re.compile(r"(?<!\d)\d++\.\d+")
_IPV4_RE = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
_MIN_PHONE_DIGITS, _MAX_PHONE_DIGITS, _MAX_PHONE_GROUPS = 7, 15, 6

# Numbers with a unit or ordinal suffix ("10am", "5kg", "3rd", "1080p") are measurements.
_UNIT_RE = re.compile(
    r"(?<!\d)\d++(?:st|nd|rd|th|am|pm|h|hr|hrs|min|mins|s|sec|secs|ms|d|day|days|wk|wks|w|mo|y|yr|yrs"
    r"|kg|g|mg|lb|lbs|oz|km|m|cm|mm|in|ft|mi|ml|l|gb|mb|tb|kb|k|x|mph|hz|khz|mhz|ghz|kw|v"
    r"|mah|px|dpi|p|fps|pcs|pc)",
    re.IGNORECASE,
)


def _canonical_id(raw: str) -> str:
    return raw.upper().lstrip("#")


def _order_id_ok(ident: str, explicit_marker: bool) -> bool:
    """An explicit marker ("#", "number", "订单号") lets short IDs through; bare "order N" needs
    an ID that cannot be a quantity: five-plus digits, or letters and digits."""
    if not _HAS_DIGIT.search(ident) or len(ident) < 3:
        return False
    if explicit_marker:
        return True
    if _HAS_LETTER.search(ident):
        return len(ident) >= 4
    return len(ident.replace("-", "")) >= 5


def _is_product_code(token: str) -> bool:
    """SKU-like: letters and digits mixed, not a measurement ("5kg"), not "24-hour"/"covid-19"
    (a number hyphenated to an ordinary lowercase word)."""
    if len(token) < 3 or not (_HAS_DIGIT.search(token) and _HAS_LETTER.search(token)):
        return False
    parts = token.split("-")

    def is_ordinary(part: str) -> bool:
        return (
            part.isdigit()
            or bool(_UNIT_RE.fullmatch(part))
            or (part.isalpha() and part.islower() and len(part) >= 3)
        )

    return not all(is_ordinary(p) for p in parts)


def _safe_date(year: int, month: int, day: int) -> str | None:
    if year < 1000:
        return None
    try:
        return date(year, month, day).isoformat()
    except ValueError:
        return None


def _month_number(raw: str) -> int:
    return int(raw) if raw.isdigit() else _MONTHS[raw.lower().rstrip(".")]


class _Scanner:
    """Runs extractors over a working copy of the text, masking what each one claims."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.keys: set[str] = set()

    def matches(self, pattern: re.Pattern[str]) -> Iterator[re.Match[str]]:
        # Materialise first: masking rewrites self.text while we iterate.
        yield from list(pattern.finditer(self.text))

    def claim(self, match: re.Match[str], key: str | None) -> None:
        if key is not None:
            self.keys.add(key)
        start, end = match.span()
        self.text = self.text[:start] + _MASK * (end - start) + self.text[end:]

    def mask(self, pattern: re.Pattern[str]) -> None:
        for match in self.matches(pattern):
            self.claim(match, None)

    def run(self, pattern: re.Pattern[str], to_key: Callable[[re.Match[str]], str | None]) -> None:
        for match in self.matches(pattern):
            key = to_key(match)
            if key is not None:
                self.claim(match, key)


def _marked_id(
    kind: str, explicit: Callable[[re.Match[str]], bool]
) -> Callable[[re.Match[str]], str | None]:
    def to_key(m: re.Match[str]) -> str | None:
        ident = m.group("id")
        return f"{kind}:{_canonical_id(ident)}" if _order_id_ok(ident, explicit(m)) else None

    return to_key


def _has_marker(m: re.Match[str]) -> bool:
    return bool(re.search(rf"#|:|{_MARKER_WORDS}", m.group("sep"), re.IGNORECASE))


def _tracking_key(m: re.Match[str]) -> str | None:
    ident = m.group("id")
    if len(ident) < 6 or not _HAS_DIGIT.search(ident):
        return None
    return f"tracking:{_canonical_id(ident)}"


def _date_key(m: re.Match[str]) -> str | None:
    iso = _safe_date(int(m.group("year")), _month_number(m.group("month")), int(m.group("day")))
    return None if iso is None else f"date:{iso}"


def _phone_key(m: re.Match[str]) -> str | None:
    raw = m.group(0)
    if _DECIMAL_RE.fullmatch(raw) or _IPV4_RE.fullmatch(raw):
        return None
    digits = re.sub(r"\D", "", raw)
    if not _MIN_PHONE_DIGITS <= len(digits) <= _MAX_PHONE_DIGITS:
        return None
    # Phone numbers come in a few groups, one of them at least 3 long; "8 9 10 11 12" does not.
    groups = re.findall(r"\d+", raw)
    if len(groups) > _MAX_PHONE_GROUPS or max(len(g) for g in groups) < 3:
        return None
    if raw.isdigit() and len(raw) < _MIN_BARE_PHONE_DIGITS:
        before = m.string[max(0, m.start() - _PHONE_CUE_CHARS) : m.start()].replace(_MASK, " ")
        if not _PHONE_CUE.search(before):
            return None
    return "phone:" + ("+" if raw.startswith("+") else "") + digits


def _hash_key(m: re.Match[str]) -> str | None:
    ident = m.group("id")
    before = m.string[max(0, m.start() - 20) : m.start()]
    if _HASH_NOT_ORDER.search(before) or not _order_id_ok(ident, explicit_marker=True):
        return None
    return f"order:{_canonical_id(ident)}"


def _marked_product_key(m: re.Match[str]) -> str | None:
    ident = m.group("id")
    if len(ident) < 3 or not _HAS_DIGIT.search(ident):
        return None
    return f"product:{_canonical_id(ident)}"


def _code_token_key(m: re.Match[str]) -> str | None:
    ident = m.group("id")
    return f"product:{ident.upper()}" if _is_product_code(ident) else None


# Kinds whose value is one reference code: "ref A-99812" reads as a product code and
# "order A-99812" as an order, but a customer asking about either means the same thing.
_REFERENCE_KINDS = ("order", "product", "tracking")


def lookup_keys(keys: list[str]) -> list[str]:
    """The keys to look a query's entities up by: each reference code under every kind a
    turn may have filed it as (sorted, unique); other keys as they are."""
    out = set(keys)
    for key in keys:
        kind, _, value = key.partition(":")
        if kind in _REFERENCE_KINDS:
            out.update(f"{k}:{value}" for k in _REFERENCE_KINDS)
    return sorted(out)


def has_postal_code(text: str) -> bool:
    """Whether ``text`` holds a two-part postal code ("Exeter MB11 3RH"): an address."""
    return _POSTCODE_RE.search(text) is not None


def extract_entities(text: str) -> list[str]:
    """Normalised entity keys a turn names, sorted and unique.

    ``order:<ID>`` (IDs upper-cased, hyphens kept; also a bare ``#<ID>``), ``email:<lower>``,
    ``phone:<digits>`` (a leading ``+`` kept, 7-15 digits; a bare run of under 10 digits only
    after a cue such as "phone" or "call"), ``date:YYYY-MM-DD`` (a year is required),
    ``product:<CODE>`` (SKU-like codes), ``tracking:<ID>``. Plain numbers, times, prices and
    bare years are not entities.
    """
    return list(_entities(text))


@text_memo
def _entities(text: str) -> tuple[str, ...]:
    scanner = _Scanner(_normalise(text))
    scanner.mask(_URL_RE)  # never keyed, but their paths would look like product codes
    scanner.mask(_POSTCODE_RE)
    scanner.run(_EMAIL_RE, lambda m: f"email:{m.group(0).lower()}")
    scanner.run(_TRACKING_EN_RE, _tracking_key)
    scanner.run(_TRACKING_ZH_RE, _tracking_key)
    scanner.run(_ORDER_EN_RE, _marked_id("order", _has_marker))
    scanner.run(_ORDER_ZH_RE, _marked_id("order", lambda m: True))
    scanner.run(_ORDER_PREFIXED_RE, _marked_id("order", lambda m: True))
    for pattern in (_DATE_ISO_RE, _DATE_MDY_RE, _DATE_DMY_RE, _DATE_ZH_RE):
        scanner.run(pattern, _date_key)
    scanner.run(_PRODUCT_MARKED_RE, _marked_product_key)
    scanner.run(_PRODUCT_ZH_RE, _marked_product_key)
    scanner.run(_HASH_ID_RE, _hash_key)
    scanner.run(_PHONE_RE, _phone_key)
    scanner.run(_CODE_TOKEN_RE, _code_token_key)
    return tuple(sorted(scanner.keys))
