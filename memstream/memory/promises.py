"""Promises owed to a customer and the turns that keep them: the recognisers retrieval uses to
show a promise as open ("- Open: …") until a later turn says it happened.

``is_promise`` reads a turn for a commitment to a future action or outcome for the customer
("I'll arrange a collection for Friday", "The £30 will be refunded to you", "Expect a call
on Monday", "I'm adding a £10 credit"); ``reports_done`` for a statement that something
happened or arrived ("The courier picked it up", "The money is back on my card");
``fulfilment`` pairs a promise with the first later turn that reports it done and is about
the same thing. All three read grammar (future, past and perfect forms, receipt, negation,
"still/yet/waiting", questions, conditions, reported speech), not a list of the actions, so
that wordings and actions not seen before are read the same way. Pure: text and arrays in,
answers out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from itertools import pairwise
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from memstream.memory.acts import MEANT_ACTS, NO_ACT
from memstream.memory.phrases import PROMISE_WORDS
from memstream.memory.text import ends_in_question, text_memo, tokenize


def _word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


# --- words ----------------------------------------------------------------------------------

# Sentences end at ., !, ? or a line break (not the point of "£12.50"); the "?" is kept to
# tell questions apart. Each run is possessive (and ``_WORD``'s pieces are disjoint), so a
# scan is linear in the text.
_SENTENCE = re.compile(r"(?:[^.!?\n]|(?<=\d)\.(?=\d))++[.!?]*+")
MAX_SENTENCES = 64  # read per turn, clauses per sentence, words per clause (``_bounded``)
# Clause breaks inside a sentence: what one clause negates or defers says nothing of the next
# ("I've refunded it; it will show in 3 days", "The refund came through, no problem").
# A comma between digits is a thousands separator ("£1,250"), not a break.
# A time clause is its own: "we'll take the old one when we drop off the new one".
_CLAUSE = re.compile(
    r"[;:()\u2013\u2014]|(?<!\d),|,(?!\d)|\s-\s|\bbut\b|\bwhen\b|\bonce\b"
    r"|\band\s+(?=i\b|we\b|it\b|the\b)"
)
_WORD = re.compile(r"[a-z0-9£$€]++(?:'[a-z]++)?")

_PRONOUN_IS = _word_set(
    """
    it that there here what he she who this
    """
)
_CONTRACTIONS = {
    "'ll": ("will",),
    "'m": ("am",),
    "'re": ("are",),
    "'ve": ("have",),
    "'d": ("would",),
}
_IRREGULAR_NOT = {"won't": "will", "can't": "can", "shan't": "shall"}


# Chat spellings without the apostrophe ("ill refund it", "ive sent it", "wont") and the
# short forms of "you": spelled out before any rule reads them. "ill" and "well" are words
# too: "ill" is "I'll" only first in a clause ("I was ill" is not), "well" never is.
_UNAPOSTROPHISED = {
    "ive": ("i", "have"),
    "im": ("i", "am"),
    "youll": ("you", "will"),
    "youre": ("you", "are"),
    "youve": ("you", "have"),
    "theyll": ("they", "will"),
    "theyre": ("they", "are"),
    "theyve": ("they", "have"),
    "weve": ("we", "have"),
    "itll": ("it", "will"),
    "thatll": ("that", "will"),
    "wont": ("will", "not"),
    "cant": ("can", "not"),
    "u": ("you",),
    "ur": ("your",),
    "thru": ("through",),
}
_NOT_STEMS = _word_set(
    """
    do does did is was are were has have had could would should must need
    """
)
# After a noun's "'s", these say it is "is" or "has", not a possessive: "a driver's going
# to come", "the courier's been", "the money's landed", "the refund's due".
_AUX_NEXT = {
    "going": "is",
    "being": "is",
    "due": "is",
    "coming": "is",
    "been": "has",
    "gone": "has",
    "got": "has",
    "come": "has",
    "back": "is",
    "here": "is",
    "there": "is",
    "through": "is",
    "in": "is",
    "on": "is",
}


def _words(clause: str) -> list[str]:
    """Lowercase words with contractions expanded: "we'll" -> we will, "won't" -> will not,
    "it's" -> it is, "the driver's going" -> the driver is going ("driver's van" stays one
    word: a possessive); chat spellings too ("ill" first, "ive", "dont", "u")."""
    out: list[str] = []
    raw = _WORD.findall(clause.lower().replace("\u2019", "'"))
    for k, word in enumerate(raw):
        if word == "ill" and k == 0 and len(raw) > 1:
            out += ["i", "will"]
        elif word in _UNAPOSTROPHISED:
            out += _UNAPOSTROPHISED[word]
        elif word.endswith("nt") and word[:-2] in _NOT_STEMS:
            out += [word[:-2], "not"]
        elif (
            word.endswith("'s")
            and k + 1 < len(raw)
            and raw[k + 1] in _AUX_NEXT
            and word[:-2] not in _PRONOUN_IS
        ):
            out += [word[:-2], _AUX_NEXT[raw[k + 1]]]
        elif word in _IRREGULAR_NOT:
            out += [_IRREGULAR_NOT[word], "not"]
        elif word.endswith("n't"):
            out += [word[:-3], "not"]
        elif (i := word.find("'")) > 0 and word[i:] in _CONTRACTIONS:
            out += [word[:i], *_CONTRACTIONS[word[i:]]]
        elif word.endswith("'s") and word[:-2] in _PRONOUN_IS:
            out += [word[:-2], "is"]
        else:
            out.append(word)
    return out


def _sentences(text: str) -> list[str]:
    """The turn's sentences as read: of more than ``MAX_SENTENCES`` (a pasted log, a wall of
    fragments), the first and the last halves, where a reply says what it promises or
    reports; what a turn costs stays bounded whatever is pasted into it."""
    return _bounded([s.strip() for s in _SENTENCE.findall(text) if s.strip()])


def _clauses(sentence: str) -> list[list[str]]:
    """The sentence's clauses as words; as ``_sentences``, at most ``MAX_SENTENCES`` clauses
    read, and as many words of each."""
    return _bounded(
        [_bounded(w) for part in _CLAUSE.split(sentence.lower()) if (w := _words(part))]
    )


T = TypeVar("T")


def _bounded(parts: list[T]) -> list[T]:
    if len(parts) <= MAX_SENTENCES:
        return parts
    half = MAX_SENTENCES // 2
    return parts[:half] + parts[-half:]


# Words that may stand between an auxiliary and its verb ("I'll also send", "we are now").
_ADVERBS = _word_set(
    """
    also then now personally just definitely certainly happily gladly first still
    already all both right straight immediately today tonight later actually really
    finally now automatically manually
    """
)
_NEGATORS = _word_set(
    """
    not never no nothing nobody none neither nor without
    """
)


def _next_content(words: Sequence[str], i: int) -> tuple[int, str]:
    """The index and word after ``i``, skipping adverbs ("" past the end)."""
    j = i + 1
    while j < len(words) and words[j] in _ADVERBS:
        j += 1
    return j, words[j] if j < len(words) else ""


# --- promises -------------------------------------------------------------------------------

# Verbs that after "will" or "let me" are the work of the conversation (checking, looking,
# seeing), a state or a need, not something delivered to the customer: "I'll check that for
# you", "let me look into it", "you'll need to", "it will take a few days".
_GENERIC_VERBS = _word_set(
    """
    check look see find try ask investigate need have want like cost depend happen know
    help keep wait stay remain seem feel appear show notice understand let make do think
    be pull search confirm just get hold bear review read go
    """
)
# After "will", only these are not an action: "get" (you'll get the £12 back), "go" (a
# replacement will go out) and "have" (you'll have it by Friday) are.
_WILL_GENERIC = _GENERIC_VERBS - {"get", "go", "have", "make"}
# Subjects whose "will" forecasts rather than commits: "it will take", "this will show".
_FORECAST_SUBJECTS = _word_set(
    """
    it this that there which what
    """
)
# A condition or hypothesis anywhere before the future: "if it doesn't arrive we'll refund".
_CONDITIONS = _word_set(
    """
    if unless otherwise case whether
    """
)
# Reported speech or an old promise: "you were promised", "I was told a driver would come".
_REPORTED = _word_set(
    """
    promised told said supposed meant claimed
    """
)
# Agent progressive forms that are the conversation itself ("I'm checking", "I'm afraid").
_GENERIC_ING = _word_set(
    """
    checking looking having trying waiting seeing hoping going just still sorry afraid
    happy glad writing calling reading pulling searching speaking talking working
    dealing handling thinking wondering asking chasing transferring getting following
    reaching contacting messaging typing aware
    """
)
# Past participles after "be" in "will be refunded" that are not a regular -ed form.
_IRREGULAR_PARTICIPLES = _word_set(
    """
    sent paid given taken done made brought put set left kept sold shown told held built
    written spent dealt fitted
    """
)
# A time an arrangement is for: "the collection is booked for Friday".
_ARRANGED = _word_set(
    """
    booked scheduled arranged planned organised organized lined raised
    """
)


# A standing arrangement, not a promise of one thing: "drivers will now leave it with the
# neighbour", "we'll email you and never phone", "from now on", "in future".
_HABITUAL = _word_set(
    """
    always never usually anymore future forward onwards
    """
)


# Participles of a set future with "to": "is due to be collected", "is set to arrive".
_SET_TO = _ARRANGED | _word_set(
    """
    due set
    """
)


# Asking a third party to act for the customer: "I've asked DPD to collect it".
_ASKED = _word_set(
    """
    asked instructed
    """
)
# When a present progressive is a plan: "they're coming on Monday", "tomorrow".
_FUTURE_TIMES = _word_set(
    """
    monday tuesday wednesday thursday friday saturday sunday tomorrow tonight next later
    today
    """
)
# The agent's steps that set an act in motion (a request made, a refund raised).
_SET_UP = _ARRANGED | _word_set(
    """
    requested request submitted escalated approved authorised authorized applied ordered
    """
)


def _progressive(word: str) -> bool:
    """An action's -ing form: "refunding", "coming"; not the conversation's own ("checking")."""
    return len(word) > 4 and word.endswith("ing") and word not in _GENERIC_ING


def _participle(word: str) -> bool:
    return (len(word) > 3 and word.endswith("ed")) or word in _IRREGULAR_PARTICIPLES


def _will_commits(words: Sequence[str], i: int) -> bool:
    """Whether the "will"/"shall" at ``i`` (or "going to" ending at ``i``) commits: not
    negated, not a question word order, its verb an action ("be" only before a participle:
    "will be refunded")."""
    j, verb = _next_content(words, i)
    if verb in _NEGATORS or not verb:
        return False
    subject = words[i - 1] if i > 0 else ""
    if i + 1 < len(words) and words[i + 1] == "now" and subject not in ("i", "we"):
        return False  # "drivers will now leave it at the back door": how things are done
    if verb == "be":
        _, after = _next_content(words, j)
        if _progressive(after):  # "we'll be refunding the £20"
            return True
        if after.endswith("ing") and words[j + 2 : j + 3] == ["you"]:
            return True  # "she'll be calling you": an act done to the customer
        if after == "in":  # "we'll be in touch": contact, not a place
            return words[j + 2 : j + 3] == ["touch"]
        if after == "with":  # "a driver will be with you on Monday": a visit
            return words[j + 2 : j + 3] == ["you"]
        return _participle(after) or after in ("there", "round", "over")
    if verb == "show" and words[j + 1 : j + 2] == ["up"]:
        return subject not in _FORECAST_SUBJECTS  # "the £20 will show up": it arrives
    if verb in _WILL_GENERIC or subject in _FORECAST_SUBJECTS:
        return False
    if verb == "have":  # "you'll have to" is an obligation, "you'll have it by Friday" is not
        return j + 1 < len(words) and words[j + 1] != "to"
    if verb == "get":
        return _get_commits(words, j)
    return True


def _get_commits(words: Sequence[str], j: int) -> bool:
    """ "you'll get the £12 back", "you'll get a £20 code", "I'll get a supervisor to call
    you"; not "you'll get to choose", "you'll get in touch", "you'll get a text when it
    ships" (a notice, not something owed)."""
    nxt = words[j + 1] if j + 1 < len(words) else ""
    if nxt in ("to", "in"):
        return False
    if nxt == "a":
        # "you'll get a £20 code", "you'll get a phone call", "a replacement": a sum or an
        # act owed ("you'll get a text when it ships" is a notice)
        thing = words[j + 2 : j + 4]
        if (thing and _AMOUNT.match(thing[0])) or _clause_acts(thing) - {_BRING}:
            return True
        return _causative(words, j)
    return True


def _causative(words: Sequence[str], j: int) -> bool:
    """ "get/have someone to call you": the verb at ``j``, its object, "to" and an action."""
    for k in range(j + 2, min(j + 5, len(words) - 1)):
        if words[k] == "to":
            return words[k + 1] not in _GENERIC_VERBS
    return False


def _going_to_commits(words: Sequence[str], i: int) -> bool:
    """ "I'm going to book", "we are going to refund"; not "it is going to rain"."""
    return (
        2 <= i < len(words) - 1
        and words[i + 1] == "to"
        and words[i - 1] in ("am", "are", "is")
        and words[i - 2] not in _FORECAST_SUBJECTS
        and _will_commits(words, i + 1)
    )


def _future_commits(words: Sequence[str]) -> bool:
    for i, word in enumerate(words):
        if word in ("will", "shall") and i > 0 and _will_commits(words, i):
            return True
        # "I'm going to book", "we are going to refund" (not "it is going to rain")
        if word == "going" and _going_to_commits(words, i):
            return True
    return False


def _other_commits(words: Sequence[str], agent: bool) -> bool:
    """The forms of a commitment without "will": "Expect a call", "let me reverse the
    charge", the agent's "I'm adding a credit", "the pickup is booked for Friday"."""
    first = words[0] if words else ""
    if first == "expect" or "can expect" in " ".join(words):
        return True
    for i, word in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if word == "let" and nxt == "me":
            _, verb = _next_content(words, i + 1)
            if verb and verb not in _GENERIC_VERBS:
                return True
        if agent and word in ("am", "are") and i > 0 and words[i - 1] in ("i", "we"):
            _, verb = _next_content(words, i)
            if verb.endswith("ing") and verb not in _GENERIC_ING:
                return True
        # "you're getting the £20 back", "you are receiving a voucher": what the customer is
        # given, in the progressive of a set future
        if agent and word == "are" and i > 0 and words[i - 1] == "you":
            j, verb = _next_content(words, i)
            if verb == "receiving" or (verb == "getting" and _get_commits(words, j)):
                return True
        # "it is due to be collected on Friday", "the pickup is scheduled to take place"
        set_to = word in _SET_TO and nxt == "to" and i > 1 and words[i - 1] in _BE
        if set_to and words[i - 2] not in _FORECAST_SUBJECTS and _will_commits(words, i + 1):
            return True
        # "the pickup is booked for Friday", "I've booked a callback for Monday", "I've
        # scheduled DPD to fetch it", "I've asked Yodel to pick it up"
        arranged = word in _ARRANGED and i > 0 and words[i - 1] != "not"
        if arranged and ({"for", "in"} & set(words[i + 1 : i + 4]) or _causative(words, i - 1)):
            return True
        if word in _ASKED and nxt not in ("you", "me") and _causative(words, i - 1):
            return True
        # "DPD are coming to get it on Monday": the present progressive of a set future
        if word in ("is", "are") and i > 0 and words[i - 1] not in _FORECAST_SUBJECTS:
            j, verb = _next_content(words, i)
            # "the £20 is going back on your card today": going somewhere, not "going to"
            moving = verb == "going" and words[j + 1 : j + 2] in (["back"], ["out"], ["over"])
            if (moving or _progressive(verb)) and _FUTURE_TIMES & set(words[i:]):
                return True
    # "I've raised a refund", "I've applied for a voucher", "we've authorised the £20 to be
    # paid back": the agent's step that sets an act in motion promises the act
    return agent and _sets_up_act(words)


def _sets_up_act(words: Sequence[str]) -> bool:
    steps = {w for i, w in enumerate(words) if w in _SET_UP and (not i or words[i - 1] != "as")}
    if not words or words[0] not in ("i", "we") or not steps:
        return False
    # "I rang you as arranged" reports the act itself
    return bool(_clause_acts(words)) and not _clause_done(words)


def _clause_promises(words: Sequence[str], agent: bool) -> bool:
    return _future_commits(words) or _other_commits(words, agent)


def _sentence_promises(sentence: str, agent: bool) -> bool:
    if ends_in_question(sentence):
        return False
    words = _words(sentence)
    if _CONDITIONS & set(words) or _REPORTED & set(words) or _HABITUAL & set(words):
        return False
    if " from now on " in f" {' '.join(words)} ":
        return False
    return any(_clause_promises(clause, agent) for clause in _clauses(sentence))


@text_memo  # retrieval reads every candidate turn of a user on every query
def promise_sentence(text: str, role: str) -> str | None:
    """The first sentence of the turn that commits the agent to something for the customer
    (the line a bot reads as "- Open: <sentence>"), or None.

    A customer's turn promises nothing owed to them: their own plans ("I'll be at work") and
    chases ("the refund you promised") are not open promises.
    """
    if role == "user":
        return None
    return next((s for s in _sentences(text) if _sentence_promises(s, agent=True)), None)


def is_promise(text: str, role: str) -> bool:
    """Whether the turn commits someone (the agent, the team, a courier) to a future action or
    outcome for the customer: "We'll refund the £20 within 5 days", "A driver will come for
    the desk on Tuesday", "Expect DPD to collect it", "Let me reverse the charge", "I'm
    adding a £10 credit". Not: questions, negated or conditional futures, reports of old
    promises, the conversation's own work ("I'll check that for you"), the customer's turns.
    """
    return promise_sentence(text, role) is not None


# --- done -----------------------------------------------------------------------------------

# A sentence that chases or waits is not done, whatever else it says: "still no sign of the
# refund", "whatever happened to the call back", "I was told it was sorted".
# The last three are the steps of a journey, not its end: "dispatched", "handed over to DPD".
_PENDING = _word_set(
    """
    still yet waiting wait pending awaiting chasing whatever overdue due expected hoping hope
    transit way hold queue processing being scheduled booked confirmation ready
    dispatched shipped handed despatch dispatch
    """
)
_REPORTED_SPEECH = re.compile(r"\b(?:promised|told|said|supposed|meant|claimed)\b", re.I)
_MODALS = _word_set(
    """
    will would shall should might may must going
    """
)
# Past tense or participles that say something went wrong or is only a step, not kept:
# "it was delayed", "I was charged twice", "I've booked it", "I've flagged it to the team".
_NOT_KEPT = _word_set(
    """
    delayed damaged cracked missed lost stuck charged overcharged declined rejected
    refused failed snapped torn dented scratched postponed cancelled canceled broken
    booked arranged scheduled planned organised organized requested submitted flagged
    escalated noted logged raised asked approved promised told said supposed placed
    authorised authorized instructed request
    ordered bought needed wanted tried hoped expected worried annoyed confused
    interested excited disappointed frustrated surprised concerned tired pleased
    wrong mistake error astray stolen
    """
)
_IRREGULAR_PAST = _word_set(
    """
    came went got rang spoke sent took gave made paid brought left found saw heard kept
    did wrote drove dropped put showed arrived received had
    """
)
# "is back", "is there", "is through", "is sorted": the thing is where it should be.
_ARRIVED_PLACES = _word_set(
    """
    back there here through sorted done complete fixed
    """
)
# "is in"/"is on" is arrived only where the place is the customer's ("is now on your
# account", "is in my bank"); "is in Rugby", "is on its way", "is on hold" are still moving.
_ARRIVED_PREPOSITIONS = _word_set(
    """
    in on into
    """
)
_CUSTOMER_OWNED = _word_set(
    """
    my your our
    """
)
# Participles that are a done report only after "have" ("the engineer has been", "it's
# gone", "you've given me the code"): alone they are as often a present or infinitive.
_HAVE_PARTICIPLES = _word_set(
    """
    gone come taken given done seen spoken rung written driven shown gotten
    """
)
_HAVE = _word_set(
    """
    have has had
    """
)
# Present forms that report a state, not an activity under way: "the refund is showing".
_STATIVE_ING = _word_set(
    """
    showing appearing sitting reflecting
    """
)


# Words ending in -ed that are no past tense: "I need a hand", "a hundred pounds".
_NOT_PAST = _word_set(
    """
    need indeed speed feed seed hundred bed shed red
    """
)


def _regular_past(word: str) -> bool:
    return len(word) > 3 and word.endswith("ed") and word not in _NOT_PAST


def _past(word: str) -> bool:
    return word in _IRREGULAR_PAST or _regular_past(word)


_PASSIVE_PAST_AUX = _word_set(
    """
    been was were
    """
)


def _passive_past(words: Sequence[str], i: int) -> bool:
    """An irregular participle in a past or perfect passive: "has been taken away", "was
    given", "were sent" (alone, "taken" and "given" are as often a present perfect's)."""
    if words[i] not in _HAVE_PARTICIPLES | _IRREGULAR_PARTICIPLES:
        return False
    k = i - 1
    while k > 0 and words[k] in _ADVERBS:
        k -= 1
    return k >= 0 and words[k] in _PASSIVE_PAST_AUX


def _under_way(words: Sequence[str]) -> bool:
    """A clause that says something is in progress, not done: the progressive ("is being
    packed", "is moving", "are sorting it"), custody ("it's with the warehouse"), "on its
    way"."""
    for i, word in enumerate(words):
        if word in ("is", "are", "am") and i > 0:
            _, nxt = _next_content(words, i)
            if nxt in ("being", "with") or (
                len(nxt) > 4 and nxt.endswith("ing") and nxt not in _STATIVE_ING
            ):
                return True
        if word == "way" and i > 0 and words[i - 1] in ("its", "their", "the"):
            return True
    return False


def _arrived(words: Sequence[str], i: int) -> bool:
    """ "is back", "is there", "is now on your account", "is showing in my bank", "the
    refund is in": the "is" or "are" at ``i`` puts the thing where it should be."""
    j, place = _next_content(words, i)
    if place in _STATIVE_ING:
        j, place = _next_content(words, j)
    if place in _ARRIVED_PREPOSITIONS:
        return j + 1 >= len(words) or words[j + 1] in _CUSTOMER_OWNED
    return place in _ARRIVED_PLACES


# Where a thing is on its way through: "onto the van", "from our depot" ("to the", "in
# the" and "at the" are as often the customer's or a time: "back to the card", "in the
# post", "at the door", "at the weekend").
_STEP_PREPOSITIONS = _word_set(
    """
    onto from
    """
)
_OTHERS_PLACE = _word_set(
    """
    the our their us them
    """
)


def _problem(word: str) -> bool:
    """A participle or adjective of something gone wrong: "misplaced", "missent",
    "unclaimed", "undeliverable", "missing"."""
    return word.startswith(("mis", "un")) and word.endswith(("ed", "able", "ing"))


# Past forms that are a step of an order's handling, never its outcome: "the order was
# confirmed", "it has been packed and labelled", "it was rerouted". A clause's verb of this
# kind says nothing done; another past verb in it still may ("DPD confirmed it arrived").
_STEPS = _word_set(
    """
    confirmed accepted acknowledged authorised authorized verified packed packaged
    labelled labeled scanned printed queued picked despatched dispatched rerouted
    redirected diverted disappeared vanished stalled stranded
    """
)
# Places of the carrier's network: "arrived at the sorting centre", "sent to the depot",
# "back at the hub" move the thing between others' places (a label of the place).
_NETWORK = _word_set(
    """
    depot depots hub hubs warehouse warehouses centre center facility sender
    """
)
_TO_PLACE = _word_set(
    """
    to at in into onto by from
    """
)
# An order, a payment: a past verb of it ("the order went through", "I put the order in",
# "the payment was taken") is the start of the story unless it arrived or came back.
_ORDERING = _word_set(
    """
    order purchase payment checkout
    """
)
_OUTCOMES = _word_set(
    """
    arrived came delivered turned reached landed dropped signed received showed refunded
    credited reimbursed repaid returned cancelled canceled
    """
)


_RETURNED = _word_set(
    """
    back return returned returning
    """
)


def _to_network(rest: Sequence[str]) -> bool:
    """ "to the depot", "at the Leeds sorting centre", "by your warehouse"."""
    return any(w in _TO_PLACE and _NETWORK & set(rest[i + 1 : i + 4]) for i, w in enumerate(rest))


def _journey_step(words: Sequence[str], i: int, collecting: bool) -> bool:
    """The past verb at ``i`` moves the thing between others' places, not to the customer:
    "left the warehouse", "reached the depot", "loaded onto the van", "collected from
    us" (but "arrived in my inbox", "reached my account", "came at last")."""
    rest = words[i + 1 :]
    if words[i] in ("left", "reached") and rest[:1] and rest[0] in _OTHERS_PLACE:
        return True
    if _to_network(rest) and not _RETURNED & set(words) and not collecting:
        # not "took the bookcase away to the depot", "it's back at the warehouse": a thing
        # collected ends its journey there
        return True
    if _ORDERING & set(words) and words[i] not in _OUTCOMES:
        return True
    return any(a in _STEP_PREPOSITIONS and b in _OTHERS_PLACE for a, b in pairwise(rest))


def _clause_done(words: Sequence[str]) -> bool:
    # "without any issues": it negates the noun phrase after it, not the clause's verb
    if "without" in words:
        words = words[: words.index("without")]
    if _NEGATORS & set(words) or any(map(_problem, words)):
        return False
    if any(a == "as" and b in _OUTCOMES for a, b in pairwise(words)):
        return True  # a status: "logged as received", "it shows as delivered"
    # "as arranged", "as agreed": the manner of what was done, not a step
    words = [w for i, w in enumerate(words) if not (i and words[i - 1] == "as" and _past(w))]
    if (_MODALS | _NOT_KEPT) & set(words):
        return False
    if any(a == "applied" and b == "for" for a, b in pairwise(words)):
        return False  # "I've applied for a voucher" asks for it ("it's been applied" is done)
    if _holds_now(words):
        return True
    if any(a in _RECORDS and b in _SHOW for a, b in pairwise(words)):
        return True  # "our records show a call on Monday": a record is of what happened
    collecting = _COLLECT in _clause_acts(words)  # "picked the desk up", not "picked"
    for i, word in enumerate(words):
        if _past(word) or _passive_past(words, i):
            verdict = _past_verdict(words, i, collecting)
            if verdict is None:
                continue
            return verdict
        if _done_now(words, i):
            return True
    return False


def _past_verdict(words: Sequence[str], i: int, collecting: bool) -> bool | None:
    """What the past verb at ``i`` says of the clause: done, not done, or nothing (None:
    read on, the verb is only a step or an auxiliary of what happened)."""
    word = words[i]
    nxt = words[i + 1] if i + 1 < len(words) else ""
    if word == "used" and nxt == "to":
        return False
    if word == "got" and _participle(nxt):
        return None  # "got held up", "got refunded": the participle says what happened
    if word in _STEPS and not (word == "picked" and collecting):
        return None  # "it was confirmed", but "DPD confirmed it arrived"
    return not _journey_step(words, i, collecting)


def _done_now(words: Sequence[str], i: int) -> bool:
    """The word at ``i`` (not a past verb) says the thing has happened: a present perfect
    ("has gone"), a visit ("has been"), an arrival ("it's here") or a sighting ("I can see
    the money in my account")."""
    word = words[i]
    # "has been" is a visit only at the end ("the plumber has been (and gone)"); before a
    # participle or a place it is an auxiliary ("has been scanned", "has been in Rugby")
    visit = word == "been" and words[i + 1 : i + 2] in ([], ["and"])
    if (word in _HAVE_PARTICIPLES or visit) and i > 0:
        # "has gone", "'s come", "'ve given": the auxiliary may be a noun's "'s"
        before = words[i - 1] if words[i - 1] not in _ADVERBS or i < 2 else words[i - 2]
        if before in _HAVE or before.endswith("'s") or before == "is":
            return True
    if (word in ("is", "are") or word.endswith("'s")) and i > 0 and _arrived(words, i):
        return True
    return word in ("see", "seen") and _owned_place(words[i + 1 :])


# What keeps a record of what happened, and its verb: "our records show", "the log confirms".
_RECORDS = _word_set(
    """
    records record log logs history notes tracking
    """
)
_SHOW = _word_set(
    """
    show shows showed confirm confirms
    """
)


def _holds_now(words: Sequence[str]) -> bool:
    """ "they have the kettle now", "I've now got the code": possession that is new."""
    if "now" not in words:
        return False
    return any(
        word in ("have", "has") and _next_content(words, i)[1] in _THING_STARTS | {"got"}
        for i, word in enumerate(words)
    )


def _owned_place(words: Sequence[str]) -> bool:
    return any(a in _ARRIVED_PREPOSITIONS and b in _CUSTOMER_OWNED for a, b in pairwise(words))


def _sentence_done(sentence: str) -> bool:
    if ends_in_question(sentence):
        return False
    # What follows "I was told" or "you promised" is what was said, not what happened; what
    # comes before "like you said" is.
    for said in _REPORTED_SPEECH.finditer(sentence):
        after = _words(sentence[said.end() :])[:1]
        if after and _past(after[0]):
            # "the voucher you promised arrived": a relative clause, the main verb follows
            sentence = sentence[: said.start()] + " " + sentence[said.end() :]
        else:
            sentence = sentence[: said.start()]
        break
    if _PENDING & set(_words(sentence)):
        return False
    clauses = _clauses(sentence)
    # A step and the state it left ("it went through on Monday, it's with the warehouse
    # now"): the state says the outcome is still to come.
    if any(_under_way(clause) for clause in clauses):
        return False
    return any(_clause_done(clause) for clause in clauses)


@text_memo
def reports_done(text: str) -> bool:
    """Whether the turn says something happened, was completed or was received: "The courier
    picked the kettle up", "Got my £12 back at last", "The refund has cleared", "the £49 is
    there". Not: chases and waiting ("still no sign of the refund", "whatever happened to
    the call back?"), pending states ("the refund is pending"), questions, negations,
    futures and promises, steps that are not the outcome ("I've booked it", "I've flagged
    it"), problems ("it was delayed")."""
    return any(_sentence_done(s) for s in _sentences(text))


# --- pairing --------------------------------------------------------------------------------

# Measured with all-MiniLM-L6-v2 on the bank's half A (``python -m bench.promise_lab``): a
# promise and its own fulfilment meet at 0.17-0.72 (10th percentile 0.34, median 0.53),
# another topic's done turn at -0.04-0.64 (90th percentile 0.29). A turn this close keeps
# the promise on its own; below it, down to ``MIN_COSINE_WITH_EVIDENCE``, only with a sign
# that it is about the same thing (a shared content word, the same amount or weekday). A
# wrong match hides a promise still owed, which is worse than showing a kept one as open.
MIN_COSINE = 0.45
MIN_COSINE_WITH_EVIDENCE = 0.3
# A report that names the promised kind of act and is tied to the promise (its weekday or
# amount, or "like you said") keeps it down to here: its own fulfilment in few words
# meets a promise at 0.17 (half A's lowest).
MIN_COSINE_REFERRED = 0.1
# A report that names the promised kind of act (a call for a call, money for money) keeps
# it down to here without any other tie: short reports ("got the call", "the money's
# landed") meet their promise at 0.15-0.3, and the kind of act is what pairs them, while a
# report of another act is never paired whatever its cosine.
MIN_COSINE_SAME_ACT = 0.15
# Words that say when, not what: a weekday or "thanks" shared by two turns is no topic.
_WEEKDAYS = frozenset(tokenize("monday tuesday wednesday thursday friday saturday sunday"))
_NOT_TOPIC = _WEEKDAYS | frozenset(tokenize("week weekend thanks thank please sorry again last"))
# A promise's words that say when or how sure, not what ("call" and "back" do say what:
# "a phone call" is kept by "someone called me", "the charge back" by "the money is back").
_EMPTY_PROMISE_WORDS = PROMISE_WORDS - frozenset(tokenize("call back"))
_AMOUNT = re.compile(r"[£$€]\s?+(\d++(?:,\d{3})*+(?:\.\d{2})?+)")
# How much each sign adds to the cosine when ranking the candidates.
_WORD_WEIGHT = 0.1
_AMOUNT_WEIGHT = 0.2
_WEEKDAY_WEIGHT = 0.05


def _stem(word: str) -> str:
    """Crude: "called"/"calls"/"calling" -> "call", so a verb and its noun meet."""
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _topic_words(text: str) -> set[str]:
    # "00" and "50" of "£49.00" and "£12.50", or "10" of "10:00", name nothing
    words = set(tokenize(text)) - _EMPTY_PROMISE_WORDS - _NOT_TOPIC
    return {_stem(w) for w in words if not (w.isdigit() and len(w) <= 2)}


def _amounts(text: str) -> set[str]:
    return {m.replace(",", "").removesuffix(".00") for m in _AMOUNT.findall(text)}


def _weekdays(text: str) -> set[str]:
    return set(tokenize(text)) & _WEEKDAYS


def _chases(sentence: str) -> bool:
    """A sentence that asks after, waits for or denies something: "still no refund", "did
    the voucher come?", "it never arrived"."""
    words = set(_words(sentence))
    return ends_in_question(sentence) or bool(words & (_PENDING | _NEGATORS))


# --- acts -----------------------------------------------------------------------------------

# What kind of act a sentence names, read from its verb with its particle ("picked the desk
# up", "dropped it off", "came for the desk") or its nominalised act ("a collection", "a
# refund", "a ring"); the words only label. A promise about the oak bookcase is not kept by
# a turn about the oak bookcase that names another act: "a driver will come for the oak
# bookcase" (taken away) by "the driver dropped it off" (brought). ``_BRING`` is the
# generic arrival at the customer's ("it arrived", "it came", "they sent it"): what
# arrives may be the refund, the voucher, the replacement or the order itself. ``_GOODS``
# is the arrival that only goods make ("it was delivered", "the driver dropped it off"):
# the order or its replacement, never a refund or a voucher.
_COLLECT, _BRING, _CALL, _MONEY, _VOUCHER, _REPLACE, _GOODS = (
    "collect", "bring", "call", "money", "voucher", "replace", "goods",
)  # fmt: skip
# A verb and the particle that makes it a movement: "pick ... up", "take ... away", "drop
# ... off", "turn up" (within the clause, a few words on: "picked the oak desk up").
_PHRASAL = {
    ("pick", "up"): _COLLECT,
    ("take", "away"): _COLLECT,
    ("took", "away"): _COLLECT,
    ("take", "back"): _COLLECT,
    ("took", "back"): _COLLECT,
    ("fetch", "away"): _COLLECT,
    ("drop", "off"): _GOODS,
    ("turn", "up"): _BRING,
    ("show", "up"): _BRING,
}
_PARTICLE_REACH = 4
_VERB_FORMS = ("", "s", "ed", "ped", "ing", "ping", "en", "n")


# Every form of a phrasal verb -> its (particle, act) pairs: one lookup a word.
_PHRASAL_FORMS: dict[str, list[tuple[str, str]]] = {}
for (_verb, _particle), _kind in _PHRASAL.items():
    for _ending in _VERB_FORMS:
        _PHRASAL_FORMS.setdefault(_verb + _ending, []).append((_particle, _kind))


_ACT_WORDS = {
    _COLLECT: _word_set(
        """
        collect collects collected collecting collection collections pickup pickups
        fetch fetched retrieve retrieved removal remove removed grab grabbed
        """
    ),
    _BRING: _word_set(
        """
        arrive arrives arrived arriving land landed receive received send sent post posted
        came come
        """
    ),
    _GOODS: _word_set(
        """
        deliver delivers delivered delivering
        """
    ),
    _CALL: _word_set(
        """
        call calls called calling ring rang rung phone phoned phoning speak spoke spoken
        talk talked chat chatted contact contacted touch buzz bell
        """
    ),
    _MONEY: _word_set(
        """
        refund refunds refunded refunding reimburse reimbursed reimbursement repay repaid
        money cashback credited reverse reversed reversal
        """
    ),
    _VOUCHER: _word_set(
        """
        voucher vouchers credit coupon coupons code codes giftcard token discount promo
        redeem redeemed
        """
    ),
    _REPLACE: _word_set(
        """
        replace replaced replacing replacement exchange exchanged swap swapped another
        """
    ),
}
# Movement verbs that with "for" go to take the thing: "come for", "call for", "stop by for".
_GO_FOR = _word_set(
    """
    come comes came coming call calls called calling stop stops stopped pop pops popped
    swing swung drop drops dropped knock knocks knocked be
    """
)
_ON_THE_WAY = _word_set(
    """
    round by over along
    """
)
# The generic arrival fits any act that brings something; a collection or a call is no
# arrival.
# Which act a report of another kind may keep (either way round): the generic arrival any
# arrival, the delivery of goods a replacement.
_FITS = {
    _BRING: frozenset((_MONEY, _VOUCHER, _REPLACE, _GOODS)),
    _GOODS: frozenset((_REPLACE,)),
}


# "back" is money with an amount or one of these: "the delivery charge back", "paid back".
_PAID_BACK = _word_set(
    """
    charge charges fee fees money credited pay paid paying cost costs
    """
)


# Taking verbs after "come and" or "come to": "came and got the desk", "coming to take it".
_FETCH = _word_set(
    """
    get got take took grab grabbed fetch fetched collect collected
    """
)
# Where a thing goes back to ("back with us", "back at our depot") and how it goes.
_US = _word_set(
    """
    us our
    """
)
_GO = _word_set(
    """
    go goes went gone going
    """
)
# Where a payment lands, after "your" or "my" ("your gift card" is a voucher: "gift" comes
# between).
_PAYMENT_PLACES = _word_set(
    """
    card bank
    """
)
_COMPOUND_PARTICLES = ("backs", "back", "ups", "up")


_THING_STARTS = _word_set(
    """
    the it your my them this that
    """
)
_BE = _word_set(
    """
    is was are were be been
    """
)
_TAKE = _word_set(
    """
    take takes took taken taking
    """
)


def _compound_act(word: str) -> str | None:
    """An act named by a verb and its particle written as one word: "callback", "ringback",
    "pickup", "payback" (the act of the verb, or of the phrasal verb)."""
    for particle in _COMPOUND_PARTICLES:
        stem = word.removesuffix(particle)
        if stem == word or len(stem) < 3:
            continue
        if (kind := _PHRASAL.get((stem, particle.removesuffix("s")))) is not None:
            return kind
        for kind, names in _ACT_WORDS.items():
            if stem in names:
                return kind
        if stem in _PAID_BACK:
            return _MONEY
    return None


def _clause_acts(words: Sequence[str]) -> set[str]:
    # "the money's landed": the noun names the act, whatever its "'s" is
    words = [w.removesuffix("'s") for w in words]
    # "our cat is called Peanuts": a name, not a phone call ("I was called by your team" is)
    words = [
        w
        for i, w in enumerate(words)
        if not (w == "called" and i and words[i - 1] in _BE and words[i + 1 : i + 2] != ["by"])
    ]
    acts = {kind for kind, names in _ACT_WORDS.items() if names & set(words)}
    acts |= {kind for w in words if (kind := _compound_act(w)) is not None}
    # "£12 back", "the delivery charge back", "credited back": the money
    money = bool(_AMOUNT.search(" ".join(words)) or _PAID_BACK & set(words))
    last_bring = max((i for i, w in enumerate(words) if w in _ACT_WORDS[_BRING]), default=-1)
    for i, word in enumerate(words):
        rest = words[i + 1 : i + 1 + _PARTICLE_REACH]
        for particle, kind in _PHRASAL_FORMS.get(word, ()):
            if particle in rest:
                acts.add(kind)
        nxt = words[i + 1] if i + 1 < len(words) else ""
        j = i + 1 + (nxt in _ON_THE_WAY)
        # "a driver will come for the desk", "they'll call round for it": to take it
        thing = words[j + 1] if j + 1 < len(words) else ""
        # "coming to get it", "came and got the desk": to fetch it
        fetch = word in _GO_FOR and words[j : j + 1] in (["to"], ["and"])
        fetch = fetch and words[j + 1 : j + 2] != [] and words[j + 1] in _FETCH
        if fetch or (word in _GO_FOR and words[j : j + 1] == ["for"] and thing in _THING_STARTS):
            acts.add(_COLLECT)
            acts.discard(_CALL)
            if last_bring < j:  # "came for the desk", not "came for it and brought a new one"
                acts.discard(_BRING)
        if word == "back" and i and words[i - 1] not in _ACT_WORDS[_CALL] and money:
            acts.add(_MONEY)
        # "return the £92 to your card", "the £30 will be returned": money given back
        if money and _stem(word) == "return":
            acts.add(_MONEY)
        # "back to your card", "it'll be on your card", "my bank shows it": where money lands
        if word in _PAYMENT_PLACES and i and words[i - 1] in _CUSTOMER_OWNED:
            acts.add(_MONEY)
        # "got the desk yesterday", "I've got the voucher": received, by the customer
        if word == "got" and (i == 0 or "i" in words[:i]) and nxt in _THING_STARTS:
            acts.add(_BRING)
        if word == "gift" and nxt == "card":
            acts.add(_VOUCHER)
        # "the desk is gone", "a driver will take it": the thing leaves the customer
        # (terse: "kettle gone")
        if word == "gone" and i and not nxt:
            acts.add(_COLLECT)
        # ("took the call" takes an act, not a thing)
        obj = words[i + 2] if i + 2 < len(words) else ""
        if (
            word in _TAKE
            and nxt in _THING_STARTS
            and not any(obj in n for n in _ACT_WORDS.values())
        ):
            acts.add(_COLLECT)
    if _MONEY in acts and _ACT_WORDS[_VOUCHER] & set(words) == {"credit"}:
        acts.discard(_VOUCHER)  # "credit £30 back to your card": money, not store credit
    money = money or _MONEY in acts
    # ("a call back" is a call)
    returned = any(
        _stem(w) in _RETURNED and not (w == "back" and i and words[i - 1] in _ACT_WORDS[_CALL])
        for i, w in enumerate(words)
    )
    if returned and not money and (acts & {_BRING, _GOODS} or _back_to_us(words)):
        # "the returned desk was received", "the returns depot logged it as received", "our
        # warehouse has got the desk back", "it went back with the driver": it came back to
        # us ("send the £20 back" is money)
        acts.add(_COLLECT)
    return acts


def _back_to_us(words: Sequence[str]) -> bool:
    """The thing goes back from the customer: "it went back", "we've got the desk back",
    "it's back with us"."""
    if words and words[0] in ("we", "our"):
        return "back" in words and not _ACT_WORDS[_CALL] & set(words)
    if any(w == "back" and _US & set(words[i + 1 : i + 3]) for i, w in enumerate(words)):
        return True
    return any(w in _GO and b == "back" for w, b in pairwise(words))


def _acts_of(sentences: Sequence[str]) -> frozenset[str]:
    """The act kinds the sentences name: the specific ones (a collection, a refund) where
    any is named, else the generic arrival ("the desk turned up")."""
    acts: set[str] = set()
    for sentence in sentences:
        for clause in _clauses(sentence):
            acts |= _clause_acts(clause)
    specific = acts - {_BRING}
    return frozenset(specific or acts)


def _compatible(promised: frozenset[str], reported: frozenset[str]) -> bool:
    """Whether a report of ``reported`` acts may keep a promise of ``promised`` ones: both
    unknown, or one act the same, or one is the generic arrival of the other's thing (or the
    delivery of a replacement)."""
    if not promised or not reported:
        return True
    return bool(promised & reported) or any(
        b in _FITS.get(a, ()) or a in _FITS.get(b, ()) for a in promised for b in reported
    )


@text_memo
def _promise_acts(text: str) -> frozenset[str]:
    """The acts the promise commits to: the specific ones of its committing clauses ("we'll
    take the old desk away when we drop off the new one" promises the collection), else
    those of its sentence ("you're due a voucher, I'll send it"), else of the whole turn."""
    line = promise_sentence(text, "assistant")
    if line is None:
        return _acts_of(_sentences(text))
    acts: set[str] = set()
    for clause in _clauses(line):
        if _clause_promises(clause, agent=True):
            acts |= _clause_acts(clause)
    return frozenset(acts - {_BRING}) or _acts_of([line])


# "like you said", "as promised", "as agreed", "you promised": a report that says it is the
# thing promised ("Someone called me back like you said").
_BACK_REFERENCE = re.compile(
    r"\b(?:like|as)\s++(?:you\s++|we\s++|they\s++)?(?:said|promised|agreed|arranged|planned"
    r"|discussed|mentioned)\b|\byou\s++(?:promised|said)\b|\bas\s++per\b",
    re.I,
)


def _refers_back(sentence: str) -> bool:
    return _BACK_REFERENCE.search(sentence) is not None


@text_memo
def _about(text: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """Content words, amounts and weekdays of a text."""
    return frozenset(_topic_words(text)), frozenset(_amounts(text)), frozenset(_weekdays(text))


def _evidence(promise: str, candidate: str) -> tuple[float, bool, bool] | None:
    """How much more than its cosine says ``candidate`` is about the promise's act, whether
    a sentence that says so refers back to a promise ("like you said"), and whether a done
    sentence names the promised kind of act; None where
    it is about another one (another amount, another kind of act: a delivery of the desk
    for its collection) or chases this one (a sentence of it asks after, waits for or
    denies something the promise names)."""
    words, amounts, days = _about(promise)
    other_amounts = _about(candidate)[1]
    if amounts and other_amounts and not amounts & other_amounts:
        return None  # "£12.50 refunded" does not keep "we'll refund the £30"
    acts = _promise_acts(promise)
    bonus, referred, named = 0.0, False, False
    done_sentences = []
    for sentence in _sentences(candidate):
        s_words, s_amounts, s_days = _about(sentence)
        s_acts = _acts_of([sentence])
        same_act = bool(acts & s_acts - {_BRING})
        same = bool(words & s_words or amounts & s_amounts or same_act)
        if not _sentence_done(sentence):
            if same and _chases(sentence):
                return None
            continue
        done_sentences.append(sentence)
        sign = _WORD_WEIGHT * bool(words & s_words or same_act)
        sign += _AMOUNT_WEIGHT * bool(amounts & s_amounts) + _WEEKDAY_WEIGHT * bool(days & s_days)
        bonus = max(bonus, sign)
        # tied to this promise: the same act with its weekday or amount, or "like you said"
        tied = bool(days & s_days or amounts & s_amounts) or _refers_back(sentence)
        referred = referred or (same_act and tied)
        named = named or same_act
    if not _compatible(acts, _acts_of(done_sentences)):
        return None  # the same bookcase, but brought, not taken away
    return bonus, referred, named


def _promise_between(
    promise: int, row: int, texts: Sequence[str], promised: npt.NDArray[np.bool_] | None
) -> list[int]:
    between = range(promise + 1, row)
    if promised is not None:
        return [r for r in between if promised[r]]
    return [r for r in between if promise_sentence(texts[r], "assistant") is not None]


def fulfilment(
    promise: int,
    later: Sequence[int],
    vectors: npt.NDArray[np.float32],
    done: npt.NDArray[np.bool_],
    texts: Sequence[str],
    *,
    min_cosine: float = MIN_COSINE,
    min_cosine_with_evidence: float = MIN_COSINE_WITH_EVIDENCE,
    min_cosine_referred: float = MIN_COSINE_REFERRED,
    min_cosine_same_act: float = MIN_COSINE_SAME_ACT,
    promised: npt.NDArray[np.bool_] | None = None,
    meant: npt.NDArray[np.int8] | None = None,
) -> int | None:
    """The one of ``later`` (rows newer than ``promise``, in time order) that keeps the
    promise best: it reports something done (``done[row]``) about the same act, by cosine
    of the unit ``vectors`` at least ``min_cosine``, or at least
    ``min_cosine_with_evidence`` with a shared content word, amount, weekday or kind of act
    (words of when, "within", "days", "soon"..., do not count), or at least
    ``min_cosine_referred`` where it names the promised kind of act and refers back to a
    promise ("someone called me back like you said") and no other promise of that kind
    came between (``promised``: which rows are promises, read from the texts if None). A
    report names the kind of act in words, or by meaning (``meant``: per row, the act
    ``memory.acts`` reads from its embedding, for the acts the grammar may miss). A
    turn that names another amount or another kind of act (a delivery of the desk for its
    collection), or chases the promised thing, never keeps it. Of those that do, the
    closest by cosine plus its evidence, the first on a tie; None if none does."""
    if not later:
        return None
    rows = np.asarray(later, dtype=np.intp)
    cosines = vectors[rows] @ vectors[promise]
    floor = min(min_cosine, min_cosine_with_evidence, min_cosine_referred, min_cosine_same_act)
    acts = _promise_acts(texts[promise])
    best: int | None = None
    best_score = -np.inf
    for row, cosine in zip(later, cosines.tolist(), strict=True):
        if not done[row] or cosine < floor:
            continue
        found = _evidence(texts[promise], texts[row])
        if found is None:
            continue
        bonus, referred, named = found
        if meant is not None and meant[row] != NO_ACT:
            named = named or MEANT_ACTS[int(meant[row])] in acts
        if cosine < min_cosine_with_evidence or (cosine < min_cosine and bonus == 0.0):
            low = min_cosine_referred if referred else min_cosine_same_act if named else np.inf
            if cosine < low:
                continue
            nearer = _promise_between(promise, row, texts, promised)
            if any(acts & _promise_acts(texts[r]) - {_BRING} for r in nearer):
                continue  # "like you said" is the nearer promise of that kind's
        if cosine + bonus > best_score:
            best, best_score = row, cosine + bonus
    return best


# --- lines ----------------------------------------------------------------------------------


def open_line(text: str, role: str, due: datetime | None) -> str:
    """``- Open: I'll arrange a collection for Friday. (assistant, due 2025-03-07)``."""
    when = f", due {due:%Y-%m-%d}" if due is not None else ""
    return f"- Open: {' '.join(text.split())} ({role}{when})"


def closed_line(text: str, role: str, kept: datetime) -> str:
    """``- Closed (2025-03-07): I'll arrange a collection for Friday. (assistant)``: the day
    is when a later turn said it happened."""
    return f"- Closed ({kept:%Y-%m-%d}): {' '.join(text.split())} ({role})"
