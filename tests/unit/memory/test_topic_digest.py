"""A topic's memory is a digest: what its speakers told of themselves, across sessions,
quoted with who said it; no advice, praise or attachment notes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memstream.memory.extractive import MAX_FACTS, extract_memory
from memstream.memory.render import memory_text
from memstream.schemas import ConsolidatedMemory, StoredTurn

T0 = datetime(2023, 5, 8, 13, 0, tzinfo=UTC)
KEY = "topic:c7"


def turn(n: int, session: int, speaker: str, text: str) -> StoredTurn:
    return StoredTurn(
        event_id=f"conv:{n}",
        session_id=f"s{session}",
        role="user",
        speaker=speaker,
        text=text,
        ts=T0 + timedelta(days=14 * session, minutes=n),
    )


ADOPTION = [
    turn(1, 1, "Ana", "I went to an adoption information evening at the town hall yesterday."),
    turn(2, 1, "Ben", "Do your research and find an adoption agency or a lawyer you trust."),
    turn(3, 1, "Ben", "You're so brave, your kids will be lucky to have you!"),
    turn(4, 2, "Ana", "I picked an adoption agency that works with single parents."),
    turn(5, 2, "Ben", "Don't forget to gather references and your financial documents."),
    turn(
        6,
        3,
        "Ana",
        "We passed the adoption home study last week. [shares a photo: a form with a stamp]",
    ),
    turn(7, 3, "Ben", "That's wonderful news, you must be thrilled about the adoption!"),
]


def test_digest_quotes_what_speakers_told_of_themselves() -> None:
    content = extract_memory(KEY, ADOPTION, T0).content
    lines = [f.text for f in content.facts]
    assert lines == [
        "Ana: I went to an adoption information evening at the town hall yesterday.",
        "Ana: I picked an adoption agency that works with single parents.",
        "Ana: We passed the adoption home study last week.",
    ]
    assert [f.source_event_ids for f in content.facts] == [["conv:1"], ["conv:4"], ["conv:6"]]


def test_digest_is_titled_by_who_it_quotes() -> None:
    content = extract_memory(KEY, ADOPTION, T0).content
    assert content.title.startswith("Ana — ")
    assert "adoption" in content.title.lower()


def test_digest_lines_are_dated_by_their_turns() -> None:
    text = memory_text_of(ADOPTION)
    assert "Ana: We passed the adoption home study last week. (2023-06-19)" in text
    assert "Do your research" not in text
    assert "shares a photo" not in text


def test_digest_covers_sessions_before_a_second_line_of_one() -> None:
    said = (
        "I painted a red lake at sunrise with my evening class.",
        "My teacher showed us how to mix oil colours on glass.",
        "We hung our canvases in the community centre hallway.",
        "I bought a wooden easel and three new brushes.",
        "My daughter drew a horse beside my easel all afternoon.",
        "I finished a portrait of our dog in charcoal.",
        "We framed the sunrise painting for my mother's birthday.",
    )
    chatty = [turn(i, 1, "Ana", text) for i, text in enumerate(said)]
    later = [turn(20 + s, s, "Ana", f"I sold painting number {s} at the market.") for s in (2, 3)]
    facts = extract_memory(KEY, [*chatty, *later], T0).content.facts
    assert len(facts) == MAX_FACTS
    assert {f.source_event_ids[0] for f in facts} >= {"conv:22", "conv:23"}


def test_digest_keeps_what_names_something_exact_whoever_it_addresses() -> None:
    """A line addressed to the listener ("Your order A-10293 holds ...") is still a fact."""
    turns = [
        turn(1, 1, "agent", "Your order A-10293 holds two grey cushions and a brass lamp."),
        turn(2, 1, "agent", "You should keep an eye on the tracking page for news."),
    ]
    lines = [f.text for f in extract_memory(KEY, turns, T0).content.facts]
    assert lines == ["agent: Your order A-10293 holds two grey cushions and a brass lamp."]


def test_an_entity_memory_keeps_its_own_facts() -> None:
    """Only topics are digests: an order's memory still states what was said of it."""
    turns = [turn(1, 1, "Ana", "Your order A-10293 has shipped and arrives on Friday.")]
    facts = extract_memory("entity:order:A-10293", turns, T0).content.facts
    assert facts
    assert not any(f.text.startswith("Ana: ") for f in facts)


def memory_text_of(turns: list[StoredTurn]) -> str:
    content = extract_memory(KEY, turns, T0).content
    memory = ConsolidatedMemory(
        memory_id="m1",
        tenant_id="acme",
        user_id="u1",
        key=KEY,
        title=content.title,
        facts=content.facts,
        created_at=T0,
        updated_at=T0,
    )
    return memory_text(memory)
