"""A new user's story through ``MemoryClient`` and a real ``memstream up``: a desk order, a
cracked leg, an address change, a refund promised and then issued, everything done.

What a support bot reads back must be the customer's picture *now*: the order resolved
(before any older status), nothing left open, the new address before the old one.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from memstream.client import MemoryClient
from memstream.schemas import RetrieveResponse
from memstream.schemas.rpc import EventIn
from memstream.settings import DEMO_API_KEY
from tests.integration.process import MemstreamProcess, wait_for

pytestmark = pytest.mark.integration

START = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
OLD_ADDRESS = "27 Birch Lane"
NEW_ADDRESS = "8 Quarry Road"

# (days after START, role, text): six sessions over five weeks.
STORY: list[tuple[int, str, str]] = [
    (0, "user", "Hello!"),
    (0, "assistant", "Hi, thanks for contacting Oakfield Furniture. How can I help today?"),
    (0, "user", "I ordered the walnut standing desk yesterday, order C-73120."),
    (0, "assistant", "Thanks, I can see order C-73120 for the walnut desk, paid in full."),
    (0, "user", f"Great. It should go to {OLD_ADDRESS}, Harlow."),
    (0, "assistant", f"Yes, the delivery address on file is {OLD_ADDRESS}, Harlow."),
    (0, "user", "Thanks, bye!"),
    (6, "user", "Hi there"),
    (6, "user", "The desk arrived but one of the legs is cracked right through."),
    (6, "assistant", "I'm so sorry. I've marked order C-73120 as faulty."),
    (6, "assistant", "I'll ship a replacement desk leg to you this week."),
    (6, "user", "Okay, thank you."),
    (9, "user", f"By the way, we have moved house. The new address is {NEW_ADDRESS}, Harlow."),
    (9, "assistant", f"Done: your delivery address is now {NEW_ADDRESS}, Harlow."),
    (9, "user", "Perfect, thanks a lot!"),
    (14, "user", "The replacement leg hasn't come yet and I had to assemble the desk without it."),
    (14, "assistant", "Apologies for the wait. We'll refund 40.00 for the trouble as well."),
    (14, "assistant", "The refund should reach your card within five working days."),
    (14, "user", "Alright, cheers."),
    (20, "user", "Just checking whether the refund is still pending?"),
    (20, "assistant", "Yes, the 40.00 refund is pending with the bank at the moment."),
    (20, "user", "Ok."),
    (27, "user", "Good news: the replacement leg was delivered this morning, the desk is sturdy."),
    (27, "assistant", "Wonderful. The refund of 40.00 was issued on Monday, so it is complete."),
    (27, "assistant", "Order C-73120 is now fully resolved on our side."),
    (27, "user", "Brilliant, that is everything sorted then."),
    (27, "assistant", "Have a lovely day!"),
    (27, "user", "You too, goodbye."),
]


def story(user: str, until_day: int = 27) -> list[EventIn]:
    return [
        EventIn(
            user_id=user,
            session_id=f"{user}-s{days}",
            role=role,  # type: ignore[arg-type]
            text=text,
            event_id=f"{user}-{i:02d}",
            ts=START + timedelta(days=days, minutes=2 * i),
        )
        for i, (days, role, text) in enumerate(STORY)
        if days <= until_day
    ]


def position(context: str, text: str) -> int:
    found = context.lower().find(text.lower())
    return found if found >= 0 else len(context) + 1


def test_the_desk_story_reads_back_resolved_nothing_open_new_address_first(
    running: MemstreamProcess,
) -> None:
    user = f"desk-{uuid.uuid4().hex[:6]}"
    with MemoryClient(running.url, DEMO_API_KEY, timeout_s=10) as client:
        client.add_many(story(user))

        def ask(query: str) -> RetrieveResponse:
            return client.retrieve(user, query, budget_tokens=512, top_k=20)

        def caught_up() -> bool:
            # Every session, the middle ones too: older turns leave the hot tier by event
            # time and are read from the archive once the archive worker has them, which
            # under load can be after the first and the last session are retrievable.
            first = ask("which desk did the customer order?").context
            moved = ask("did the customer move house?").context
            waiting = ask("did the replacement leg come?").context
            last = ask("is order C-73120 resolved?").context
            return (
                "walnut standing desk" in first
                and NEW_ADDRESS in moved
                and "hasn't come" in waiting
                and "fully resolved" in last
            )

        wait_for(caught_up, 120, "every session retrievable")
        status = ask("what is the status of order C-73120?").context
        owed = ask("is anything still open or owed to this customer?").context
        address = ask("which address should we deliver to?").context

    assert position(status, "fully resolved") < position(status, "as faulty"), status
    assert position(status, "delivered this morning") < position(status, "hasn't come"), status
    assert not [line for line in owed.splitlines() if line.strip().startswith("- Open:")], owed
    assert position(owed, "refund of 40.00 was issued") < position(owed, "pending"), owed
    assert NEW_ADDRESS in address, address
    assert position(address, NEW_ADDRESS) < position(address, OLD_ADDRESS), address
    for small_talk in ("Hello!", "Thanks, bye!", "Have a lovely day!", "You too, goodbye."):
        assert small_talk not in status + owed + address


def test_the_refund_promise_shows_open_until_the_refund_is_issued(
    running: MemstreamProcess,
) -> None:
    user = f"owed-{uuid.uuid4().hex[:6]}"
    with MemoryClient(running.url, DEMO_API_KEY, timeout_s=10) as client:
        client.add_many(story(user, until_day=20))

        def owed() -> str | None:
            found = client.retrieve(user, "is the refund still owed?", budget_tokens=512, top_k=20)
            return found.context if "pending with the bank" in found.context else None

        context = wait_for(owed, 120, "the day-20 session retrievable")
    opened = [line for line in context.splitlines() if line.strip().startswith("- Open:")]
    assert any("refund 40.00" in line for line in opened), context
