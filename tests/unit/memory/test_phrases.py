"""State, promise and resolution rules: what people say, not only keywords."""

from __future__ import annotations

import pytest

from memstream.memory.phrases import action_family, find_state, is_commitment, moot, resolves


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("Just to let you know, my order A-10293 finally arrived.", "delivered"),
        ("it finally came", "delivered"),
        ("the courier left it at my door", "delivered"),
        ("got it yesterday, thanks", "delivered"),
        ("My neighbour at number 14 took it in on Saturday.", "delivered"),
        ("I can see the delivery of order A-10293 confirmed on October 10.", "delivered"),
        ("The parcel is here, all good.", "delivered"),
        ("快递已经收到了", "delivered"),
        ("Your order is not delayed again: it left our warehouse on October 7.", "shipped"),
        ("It's out for delivery tomorrow, October 10.", "out for delivery"),
        ("Order A-10293 is delayed until the warehouse receives the sheets.", "delayed"),
        ("my order A-10293 still hasn't shipped", "not shipped"),
        ("My order hasn't arrived yet.", "not delivered"),
        ("The refund for order K-1 has been issued to your card.", "refunded"),
        ("just wanted to say the refund for order F-88120 came through", "refunded"),
        ("I want a full refund for the kettle, not another replacement.", "refund requested"),
        ("The teapot lid arrived cracked.", "faulty"),
        ("the replacement KX-200 kettle has stopped working too", "faulty"),
        ("I was charged twice for my order F-88120.", "double charged"),
        ("订单 778899 已发货", "shipped"),
    ],
)
def test_states_people_actually_say(text: str, label: str) -> None:
    state = find_state(text)
    assert state is not None
    assert state.label == label


@pytest.mark.parametrize(
    "text",
    [
        "Got it, thanks",  # an acknowledgement, not a receipt
        "I got the tracking email for order A-10293.",
        "It will be delivered tomorrow.",
        "If it is delayed, write to us.",
        "so order A-10293 is no longer delayed",
        "I've also refunded 10% of order A-10293 for the delay.",  # a gesture, not the state
        "If nobody answers the door, please leave the parcel with my neighbour.",
        "我的快递还没收到",
    ],
)
def test_denied_future_or_incidental_phrases_are_no_state(text: str) -> None:
    assert find_state(text) is None


def test_terminal_states_end_their_story() -> None:
    delivered, shipped = find_state("it finally came"), find_state("it has shipped")
    assert delivered is not None
    assert delivered.terminal
    assert shipped is not None
    assert not shipped.terminal
    assert moot(action_family("I'll email you the tracking number."), delivered)
    assert moot(action_family("I will follow up within 24 hours."), delivered)  # a bare follow-up
    assert not moot(action_family("I'll refund the delivery fee."), delivered)
    assert not moot(action_family("I'll email you the tracking number."), shipped)


@pytest.mark.parametrize(
    ("action", "later", "expected"),
    [
        (
            "I'll email you the tracking number by tomorrow.",
            "I got the tracking email, thanks.",
            True,
        ),
        ("We will process the refund within 3 days.", "The refund is completed.", True),
        (
            "I'll send you a new KX-200 as a replacement.",
            "The replacement has stopped working.",
            True,
        ),
        ("I'll email you the invoice today.", "I emailed the invoice this morning.", True),
        ("I'll call you back about the refund.", "Sorry, still checking the refund.", False),
        (
            "I'll email you the tracking number.",
            "Order A-1 is done.",
            False,
        ),  # names nothing promised
    ],
)
def test_a_later_turn_resolves_what_was_promised(action: str, later: str, expected: bool) -> None:
    assert resolves(action, later, ignore={"order", "a-1"}) is expected


@pytest.mark.parametrize(
    ("text", "role", "expected"),
    [
        ("I'll follow up with you within 48 hours.", "assistant", True),
        ("我会跟进物流情况。", "assistant", True),
        (
            "It still hasn't shipped, and on Friday I was promised a follow-up within 48 hours.",
            "user",
            False,
        ),
        ("A refund by Friday.", "assistant", False),  # a due time alone is no promise
        ("Great, I will watch the door for order A-55123.", "user", False),
        ("I'll send you the photos tonight.", "user", True),
    ],
)
def test_commitments(text: str, role: str, expected: bool) -> None:
    assert is_commitment(text, role) is expected
