"""memory.promises: promises owed to a customer, turns that report them done, and pairing."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from bench import adversarial_inputs as adversarial
from memstream.memory import promises
from memstream.memory.acts import MEANT_ACTS, NO_ACT
from memstream.memory.promises import fulfilment, is_promise, promise_sentence, reports_done

AGENT_PROMISES = [
    "I'll arrange a collection for Friday.",
    "We'll refund the £20 within 5 days.",
    "A driver will come for the desk on Tuesday.",
    "Expect DPD to collect it on Monday.",
    "You'll get the £12 delivery charge back.",
    "The £30 will be refunded to you within 3 to 5 working days.",
    "Let me reverse the charge, it will take a few days.",
    "I'm adding a £10 goodwill credit to your account.",
    "Someone from the team will ring you Thursday.",
    # wordings and actions of my own
    "An engineer will visit on Wednesday morning to fit the new hinge.",
    "We're going to replace the whole unit free of charge.",
    "I shall post the spare filter out to you today.",
    "You can expect a text from the courier an hour before they arrive.",
    "Sorry about that. I'm sending you a prepaid return label now.",
    "Let me credit the £4.99 postage back to your card.",
    "Our warehouse will repack the order and ship it by Monday.",
    "The missing screws will be posted first class tomorrow.",
    "Thanks for waiting. Your repair is booked for Thursday between 8 and 12.",
    "You'll have the replacement by the weekend.",
    "I'll get back to you by Friday with the decision.",
    # causatives, arrangements made, contact idioms, a sum to get
    "I'll get the depot manager to ring you tomorrow.",
    "I've booked Evri to come for the lamp on Friday.",
    "The returns team will be in touch on Monday.",
    "You'll get a £15 voucher for the wait.",
]
NOT_PROMISES = [
    ("assistant", "Will you be at home on Friday?"),
    ("assistant", "Shall I arrange a collection?"),
    ("assistant", "We won't be able to refund the delivery charge."),
    ("assistant", "We will not refund opened items."),
    ("assistant", "If it doesn't arrive by Friday we'd refund you."),
    ("assistant", "If it hasn't arrived by Monday, we'll send another."),
    ("assistant", "You were promised a call back on Tuesday."),
    ("assistant", "I'll check that for you."),
    ("assistant", "Let me look into it."),
    ("assistant", "One moment please."),
    ("assistant", "I'm checking with the warehouse."),
    ("assistant", "I'm afraid the item is out of stock."),
    ("assistant", "You'll need to keep the original packaging."),
    ("assistant", "It will take a few minutes to load."),
    ("assistant", "The refund was issued on Monday."),
    ("user", "I'm still waiting for the refund you promised."),
    ("user", "I'll be at work all day."),
    ("user", "I'll watch the door for the courier."),
    ("user", "You said you'd call me back on Monday."),
    ("assistant", "Have a lovely day!"),
]
DONE = [
    "The courier picked the kettle up this morning.",
    "The money is back on my card.",
    "I checked my statement and the £49 is there.",
    "The refund has cleared.",
    "Your card was credited on Monday.",
    "Got my £12 back at last.",
    "Your colleague rang me on Friday.",
    "I got the gift code you sent.",
    "The voucher code arrived in my inbox.",
    "The call-back was made on Tuesday.",
    # my own
    "The engineer fitted the new hinge yesterday.",
    "Just to say the spare filter turned up today, thanks!",
    "The replacement lamp came on Saturday.",
    "Your £4.99 has been returned to the card ending 1234.",
    "The technician called round and everything is sorted.",
    "I've posted the screws first class.",
    # arrival at the customer's, a relative "you promised", manner "as agreed", "'s"
    "The gift card you promised landed this morning.",
    "I can see the £18 in my account now.",
    "The £18 is showing on my statement.",
    "The cashback is in.",
    "The fitter took the old boiler away as agreed.",
    "The plumber has been and gone.",
    "My gift card's come through.",
    # a step verb beside the outcome, a thing collected back at the warehouse
    "The courier confirmed it was delivered.",
    "The driver took the desk back to the depot.",
    "My order arrived on Monday.",
    # a status, new possession, a negated noun phrase, "had" as a verb
    "The system has the parcel marked as delivered.",
    "The warehouse has the old sofa now.",
    "The swap happened on Tuesday without a hitch.",
    "I had the phone call from your supervisor this morning.",
]
NOT_DONE = [
    "Still no sign of the refund.",
    "Nothing has happened about the collection yet.",
    "Whatever happened to the call back?",
    "The refund is pending with the bank.",
    "I was promised a voucher weeks ago and I'm still waiting.",
    "Did the refund go through?",
    "We'll refund the £20 within 5 days.",
    "I'll arrange a collection for Friday.",
    "The refund hasn't arrived.",
    "I never got the voucher.",
    "I was told the engineer would come on Monday.",
    "The parcel is on its way.",
    "I've booked a collection for Friday.",
    "The delivery was delayed again.",
    "Hi, I need a hand with something.",
    # in progress: progressive, custody, on the way, a place that is not the customer's
    "The sofa is being loaded this afternoon.",
    "Your blender cleared payment, it's with our packers now.",
    "The rug is travelling up from Leeds.",
    "It's on the lorry to Cardiff, on its way.",
    "The mirror is in the Swindon warehouse.",
    # steps between others' places
    "The printer left the warehouse on Sunday.",
    "The rug was collected from our site at noon.",
    "The chair reached the regional centre overnight.",
    # things gone wrong
    "The tablet got held up by the strike.",
    "The carrier misrouted the bike to Wales.",
    "It was sent to the wrong address.",
    "The prize draw ticket was undeliverable.",
    # steps of an order's handling, moves between the carrier's places, the order itself
    "Your order was confirmed on 2 March.",
    "It has been packed and labelled.",
    "The parcel was rerouted to Bristol.",
    "It arrived at the sorting centre in Rugby.",
    "The order went through on Monday.",
    "The parcel has disappeared.",
    # "now" without possession, "without" the thing itself, a status not reached
    "I'm at home now.",
    "It was sent without the charger and I'm still waiting for it.",
    "It doesn't show as delivered.",
    "The courier says it went astray near Leeds.",
    "I got the despatch email this morning.",
]


@pytest.mark.parametrize("text", AGENT_PROMISES)
def test_agent_promises(text: str) -> None:
    assert is_promise(text, "assistant")


@pytest.mark.parametrize(("role", "text"), NOT_PROMISES)
def test_not_promises(role: str, text: str) -> None:
    assert not is_promise(text, role)


def test_promise_sentence_picks_the_promising_line() -> None:
    text = "Sorry for the wait. I checked with the warehouse. We'll send a new lid by Friday."
    assert promise_sentence(text, "assistant") == "We'll send a new lid by Friday."
    assert promise_sentence("I'll send a new lid by Friday.", "user") is None


@pytest.mark.parametrize("text", DONE)
def test_reports_done(text: str) -> None:
    assert reports_done(text)


@pytest.mark.parametrize("text", NOT_DONE)
def test_not_done(text: str) -> None:
    assert not reports_done(text)


def _unit(*rows: list[float]) -> np.ndarray:
    v = np.asarray(rows, dtype=np.float32)
    unit: np.ndarray = v / np.linalg.norm(v, axis=1, keepdims=True)
    return unit


def test_fulfilment_skips_chases_and_other_topics() -> None:
    texts = [
        "We'll refund the £49 within 5 days.",  # 0: promise
        "Still no sign of the £49 refund.",  # 1: close, but a chase
        "The lamp shade came on Monday.",  # 2: done, another topic
        "The money is back on my card.",  # 3: done, close by cosine only
    ]
    vectors = _unit([1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0.7, 0.2, 0.1])
    done = np.array([False, False, True, True])
    assert fulfilment(0, [1, 2, 3], vectors, done, texts) == 3


def test_fulfilment_by_shared_word_under_the_cosine() -> None:
    texts = ["I'll arrange a collection of the kettle.", "The courier took the kettle."]
    vectors = _unit([1, 0], [0.4, 1])  # cosine ~0.37: under MIN_COSINE, over the floor
    done = np.array([False, True])
    assert fulfilment(0, [1], vectors, done, texts) == 1
    # far apart by cosine, a shared word is not enough
    assert fulfilment(0, [1], _unit([1, 0], [0.1, 1]), done, texts) is None


def test_fulfilment_needs_a_sign_under_the_cosine() -> None:
    texts = ["I'll send over a gift card for the hassle.", "The taxi came on time."]
    vectors = _unit([1, 0], [0.4, 1])
    done = np.array([False, True])
    assert fulfilment(0, [1], vectors, done, texts) is None


def test_fulfilment_ignores_time_words_and_pence() -> None:
    texts = [
        "I'll sort the £12.50 within 3 days.",
        "Within 2 days I got £8.50 back, thanks.",
    ]
    vectors = _unit([1, 0], [0, 1])
    done = np.array([False, True])
    assert fulfilment(0, [1], vectors, done, texts) is None
    assert fulfilment(0, [], vectors, done, texts) is None


def test_fulfilment_a_verb_meets_its_noun() -> None:
    texts = ["Expect a phone call from Dana this afternoon.", "Dana phoned me at four."]
    vectors = _unit([1, 0], [0.4, 1])
    done = np.array([False, True])
    assert fulfilment(0, [1], vectors, done, texts) == 1


def test_fulfilment_rejects_another_amount() -> None:
    texts = ["We'll return the £1,250.00 deposit.", "The £125.00 deposit came back to me."]
    vectors = _unit([1, 0], [1, 0.1])  # as close as it gets by cosine
    done = np.array([False, True])
    assert fulfilment(0, [1], vectors, done, texts) is None
    texts[1] = "The £1,250 deposit came back to me."
    assert fulfilment(0, [1], vectors, done, texts) == 1


def test_fulfilment_prefers_the_closest_over_the_first() -> None:
    texts = [
        "I'll refund the £15 for the scarf.",
        "The gloves arrived yesterday.",  # done, close enough, but not the scarf
        "The £15 for the scarf reached my account.",
    ]
    vectors = _unit([1, 0, 0], [0.8, 0.6, 0], [0.75, 0, 0.66])
    done = np.array([False, True, True])
    assert fulfilment(0, [1, 2], vectors, done, texts) == 2


def test_fulfilment_skips_a_turn_that_also_chases_the_thing() -> None:
    texts = [
        "We'll post a new strap for the watch.",
        "The box came today. Still no strap for the watch though.",
        "The new strap came this morning.",
    ]
    vectors = _unit([1, 0], [0.95, 0.3], [0.8, 0.6])
    done = np.array([False, True, True])
    assert fulfilment(0, [1, 2], vectors, done, texts) == 2


def test_fulfilment_returns_the_first_in_time_order() -> None:
    texts = ["We'll post the voucher.", "The voucher came.", "The voucher arrived."]
    vectors = _unit([1, 0], [1, 0], [1, 0])
    done = np.array([False, True, True])
    assert fulfilment(0, [2, 1], vectors, done, texts) == 2


def test_fulfilment_rejects_the_same_thing_with_another_act() -> None:
    texts = [
        "Our carrier will come for the garden parasol on Thursday.",
        "The garden parasol was delivered on Thursday.",  # the parasol, but brought
        "I've sent a replacement garden parasol out.",  # the parasol, but another one sent
    ]
    vectors = _unit([1, 0], [0.9, 0.44], [0.85, 0.53])  # closer than MIN_COSINE
    done = np.array([False, True, True])
    assert fulfilment(0, [1, 2], vectors, done, texts) is None
    texts.append("The carrier picked the garden parasol up this morning.")
    vectors = _unit([1, 0], [0.9, 0.44], [0.85, 0.53], [0.8, 0.6])
    done = np.array([False, True, True, True])
    assert fulfilment(0, [1, 2, 3], vectors, done, texts) == 3


def test_fulfilment_a_refund_is_not_kept_by_a_call_or_a_voucher() -> None:
    texts = [
        "We'll pay the £25 for the toaster back to your card.",
        "Your team phoned me about the £25 on Monday.",
        "A £25 discount code reached my inbox.",
        "The £25 reimbursement came through.",
    ]
    vectors = _unit([1, 0], [0.9, 0.44], [0.9, 0.44], [0.6, 0.8])
    done = np.array([False, True, True, True])
    assert fulfilment(0, [1, 2], vectors, done, texts) is None
    assert fulfilment(0, [1, 2, 3], vectors, done, texts) == 3


@pytest.mark.parametrize(
    ("promise", "act"),
    [
        ("The courier will call round for the bench on Monday.", "collect"),
        ("I'll arrange for the drinks cabinet to be picked up.", "collect"),
        ("Our manager will phone you on Friday.", "call"),
        ("You'll get the £3.95 postage charge back.", "money"),
        ("I'm adding a gift card for the trouble.", "voucher"),
        ("We'll swap the faulty speaker for a new one.", "replace"),
        ("The spare battery will be delivered tomorrow.", "goods"),
        ("Pop the mirror in the porch and the courier will take it on Sunday.", "collect"),
        ("Let me credit £6 back to your card.", "money"),
    ],
)
def test_the_act_a_promise_names(promise: str, act: str) -> None:
    assert promises._promise_acts(promise) == {act}


def test_fulfilment_by_the_same_kind_of_act_in_other_words() -> None:
    texts = ["You'll get £15 account credit for the delay.", "The coupon landed in my email."]
    vectors = _unit([1, 0], [0.35, 0.94])  # under MIN_COSINE, no word in common
    done = np.array([False, True])
    assert fulfilment(0, [1], vectors, done, texts) == 1


def test_fulfilment_by_a_report_tied_to_the_promise() -> None:
    texts = ["Our manager will phone you on Friday.", "Your manager rang me, as promised."]
    vectors = _unit([1, 0], [0.15, 0.99])  # far apart by cosine
    done = np.array([False, True])
    assert fulfilment(0, [1], vectors, done, texts) == 1
    texts[1] = "Your manager rang me on Friday."  # the promised day
    assert fulfilment(0, [1], vectors, done, texts) == 1
    texts[1] = "Your manager rang me."  # nothing ties it to this promise: too far apart
    assert fulfilment(0, [1], _unit([1, 0], [0.12, 0.99]), done, texts) is None
    # ... but the same kind of act alone pairs a short report a little closer
    assert fulfilment(0, [1], _unit([1, 0], [0.25, 0.97]), done, texts) == 1
    texts[1] = "The lamp arrived on Friday, as promised."  # tied, but another act
    assert fulfilment(0, [1], vectors, done, texts) is None


def test_a_name_is_no_call() -> None:
    assert promises._acts_of(["Our cat is called Peanuts."]) == frozenset()
    assert promises._acts_of(["I was called by your team."]) == {"call"}


def test_a_chase_that_refers_back_never_keeps() -> None:
    texts = ["Our manager will phone you on Friday.", "Still no phone call you promised me."]
    vectors = _unit([1, 0], [0.9, 0.44])
    assert not reports_done(texts[1])
    # even where a caller takes it for done, it chases the promised act
    assert fulfilment(0, [1], vectors, np.array([False, True]), texts) is None


def test_a_reference_back_goes_to_the_nearer_promise_of_its_kind() -> None:
    texts = [
        "I'll ring you on Monday about the boiler.",
        "Our supervisor will call you on Wednesday as well.",
        "Someone phoned me like you said.",
    ]
    vectors = _unit([1, 0, 0], [0, 1, 0], [0.15, 0.15, 0.98])
    done = np.array([False, False, True])
    assert fulfilment(0, [2], vectors, done, texts) is None
    assert fulfilment(1, [2], vectors, done, texts) == 2
    # the callers' own flags of which rows are promises are used where given
    flags = np.array([True, False, False])
    assert fulfilment(0, [2], vectors, done, texts, promised=flags) == 2


# The shared linear-time test lists its modules; this module's patterns get the same check.
@pytest.mark.parametrize(
    ("name", "pattern"), sorted(adversarial.module_patterns(("memstream.memory.promises",)).items())
)
def test_patterns_are_linear(name: str, pattern: re.Pattern[str]) -> None:
    for text in adversarial.pattern_texts(pattern, 8_000):
        start = time.perf_counter()
        sum(1 for _ in pattern.finditer(text))
        assert time.perf_counter() - start < 0.3, name


@pytest.mark.parametrize("fn", [reports_done, lambda t: is_promise(t, "assistant")])
def test_functions_are_linear(fn: object) -> None:
    assert callable(fn)
    texts = [
        *adversarial.runs(8_000),
        "will also " * 800,
        "let me " * 1_100,
        "I am " * 1_600,
        "came for the " * 700,
        "picked it up " * 700,
    ]
    for text in texts:
        start = time.perf_counter()
        fn(text)
        assert time.perf_counter() - start < 0.3


def test_min_cosine_is_the_default() -> None:
    assert promises.MIN_COSINE == 0.45


# Chat spellings, a noun's "'s" as "is"/"has", "due to", set-up steps, "you're getting".
@pytest.mark.parametrize(
    "text",
    [
        "ill ring u tomorrow about it",
        "Ive booked DPD to fetch the rug on Tuesday.",
        "The engineer's going to fit the hinge on Monday.",
        "Your sofa is due to be picked up by Yodel on Friday.",
        "I've raised a refund for £18.40 with our finance team.",
        "We've requested a replacement blender for you.",
        "You're getting the £9.99 postage back.",
        "The £9.99 is going back on your card today.",
        "You'll get a phone call from the depot on Monday.",
        "The £12 will show up in your account by Friday.",
        "Our engineer will be calling you on Thursday.",
        "A fitter will be with you on Wednesday to swap the hinge.",
    ],
)
def test_promises_in_other_forms(text: str) -> None:
    assert is_promise(text, "assistant")


@pytest.mark.parametrize(
    ("role", "text"),
    [
        ("assistant", "I rang you on Monday as arranged."),
        ("assistant", "I was ill last week, sorry for the delay."),
        ("assistant", "The driver's van broke down."),
        ("assistant", "It is due to the bank holiday."),
    ],
)
def test_not_promises_in_other_forms(role: str, text: str) -> None:
    assert not is_promise(text, role)


@pytest.mark.parametrize(
    "text",
    [
        "courier's been, rug gone",
        "The money's landed, cheers.",
        "Refund's back in my account.",
        "The old sofa has been taken away.",
        "Our records show a call to you on Monday.",
        "The warehouse has now got the rug back.",
        "The £1,250 deposit came back to me.",
    ],
)
def test_done_in_other_forms(text: str) -> None:
    assert reports_done(text)


def test_not_done_in_other_forms() -> None:
    assert not reports_done("I've applied for a £10 voucher for you.")
    assert not reports_done("I've authorised the £20 to be paid back.")
    assert reports_done("Your £10 credit has been applied.")


@pytest.mark.parametrize(
    ("text", "acts"),
    [
        ("The money's landed, cheers.", {"money"}),
        ("They came and got the rug this morning.", {"collect"}),
        ("I've booked a callback for Tuesday.", {"call"}),
        ("My husband took the call yesterday.", {"call"}),
        ("Return the £20 to my card please.", {"money"}),
        ("Finance will send the £20 back to you.", {"money"}),
        ("The rug went back with the driver.", {"collect"}),
        ("The rug is back with us now.", {"collect"}),
        ("Got the rug yesterday.", {"bring"}),
        ("DPD marked the rug as delivered.", {"goods"}),
        ("You'll get the £5 delivery charge back.", {"money"}),
    ],
)
def test_the_act_a_sentence_names(text: str, acts: set[str]) -> None:
    assert promises._acts_of([text]) == acts


def test_the_act_of_the_committing_clause() -> None:
    promise = "We'll take the old rug away when we drop off the new one."
    assert promises._promise_acts(promise) == {"collect"}


def test_fulfilment_by_the_same_act_alone_in_few_words() -> None:
    texts = ["Someone will ring you on Thursday.", "Got the call, thanks."]
    vectors = _unit([1, 0], [0.22, 0.97])  # no word, day or amount in common
    done = np.array([False, True])
    assert fulfilment(0, [1], vectors, done, texts) == 1
    texts[1] = "Got the rug yesterday, thanks."  # as close, but an arrival, not a call
    assert fulfilment(0, [1], vectors, done, texts) is None


def test_a_delivery_of_goods_keeps_no_money_promise() -> None:
    texts = ["You'll have the £30 back by Friday.", "DPD marked my rug as delivered Friday."]
    vectors = _unit([1, 0], [0.8, 0.6])
    done = np.array([False, True])
    assert fulfilment(0, [1], vectors, done, texts) is None
    texts[1] = "The £30 arrived Friday."  # the generic arrival may be the money's
    assert fulfilment(0, [1], vectors, done, texts) == 1


def test_a_report_naming_the_act_by_meaning_only_keeps_a_promise_of_that_act() -> None:
    texts = ["We'll refund the £30 to your card.", "That has all gone through now, cheers."]
    vectors = _unit([1, 0], [0.3, 1])  # cosine ~0.29: under every bar but the same act's
    done = np.array([False, True])
    assert fulfilment(0, [1], vectors, done, texts) is None  # no act in its words
    money, call = MEANT_ACTS.index("money"), MEANT_ACTS.index("call")
    meant = np.array([NO_ACT, money], dtype=np.int8)
    assert fulfilment(0, [1], vectors, done, texts, meant=meant) == 1
    # another act by meaning, or none, keeps nothing
    assert fulfilment(0, [1], vectors, done, texts, meant=np.array([NO_ACT, call], np.int8)) is None
    assert fulfilment(0, [1], vectors, done, texts, meant=np.full(2, NO_ACT, np.int8)) is None
