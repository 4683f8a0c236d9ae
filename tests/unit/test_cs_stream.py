"""The customer-service benchmark's generator (``bench.cs_stream``), its paraphrase bank and
its scoring rule (``bench.cs_score``), without any service."""

from __future__ import annotations

import pytest

from bench import cs_phrases
from bench.cs_score import NewestFirstBM25, SmallTalk, content_lines, score
from bench.cs_stream import CsStream, Probe, generate, norm, order_names_tied, render

FORTY = 40


@pytest.fixture(scope="module")
def streams() -> dict[str, CsStream]:
    return {half: generate(FORTY, 1, half) for half in ("A", "B")}


def test_same_arguments_give_the_same_events() -> None:
    assert generate(5, 3, "B") == generate(5, 3, "B")
    assert generate(5, 3, "B").events != generate(5, 4, "B").events


def test_forty_customers_give_two_to_three_thousand_events(streams: dict[str, CsStream]) -> None:
    for stream in streams.values():
        assert 2000 <= len(stream.events) <= 3000
        assert len({e["user_id"] for e in stream.events}) == FORTY
        assert {p.kind for p in stream.probes} == {
            "status", "address", "phone", "email", "preference", "promise_owed",
            "promise_kept", "one_off",
        }  # fmt: skip


def test_events_have_the_shape_post_v1_events_takes(streams: dict[str, CsStream]) -> None:
    from memstream.schemas.events import InteractionEvent
    from memstream.schemas.rpc import EventIn

    for e in streams["A"].events[:50]:
        InteractionEvent.model_validate(e)
        EventIn.model_validate({k: v for k, v in e.items() if k != "tenant_id"})
    stamps = [e["ts"] for e in streams["A"].events]
    assert stamps == sorted(stamps)
    assert stamps[0] >= "2025-"
    assert stamps[-1] < "2026-"


def test_the_halves_use_disjoint_templates(streams: dict[str, CsStream]) -> None:
    for name, items in cs_phrases.all_template_lists().items():
        assert len(items) >= 6, name
        a, b = cs_phrases.half(items, "A"), cs_phrases.half(items, "B")
        assert not set(a) & set(b), name
    used = {h: s.templates_used for h, s in streams.items()}
    assert used["A"]
    assert used["B"]
    assert not used["A"] & used["B"]
    bank = cs_phrases.all_template_lists()
    for half in ("A", "B"):
        for entry in used[half]:
            group, template = entry.split("|", 1)
            mine = [t if isinstance(t, str) else t[1] for t in cs_phrases.half(bank[group], half)]  # type: ignore[index]
            assert template in mine, (half, entry)


def test_probe_values_occur_in_the_users_events(streams: dict[str, CsStream]) -> None:
    for stream in streams.values():
        texts: dict[str, list[tuple[int, str, str]]] = {}
        for i, e in enumerate(stream.events):
            texts.setdefault(e["user_id"], []).append((i, e["event_id"], norm(e["text"])))
        for p in stream.probes:
            mine = texts[p.user_id]
            where = {eid: i for i, eid, _ in mine}
            current_at = where[p.event_id_current]
            for value in p.current:
                assert any(norm(value) in t for _, _, t in mine), (p, value)
            assert norm(p.current[0]) in next(t for _, eid, t in mine if eid == p.event_id_current)
            for value in p.stale:
                found = [i for i, _, t in mine if norm(value) in t]
                assert found, (p, value)
                assert max(found) < current_at, (p, value)
        assert stream.dropped <= len(stream.probes) // 20


def test_render_marks_the_span_and_keeps_typos_out_of_it() -> None:
    import random

    rng = random.Random(1)
    for _ in range(200):
        text, span = render(
            "Apparently {what} [got stuck in {city}] over the weekend.",
            {"what": "order C-73120", "city": "Leeds"},
            rng,
            typo_rate=1.0,
        )
        assert span == "got stuck in Leeds"
        assert span in text
        assert "order C-73120" in text


# --- scoring ---------------------------------------------------------------------------------


def _probe(kind: str, current: tuple[str, ...], stale: tuple[str, ...] = ()) -> Probe:
    return Probe("u", kind, "q?", current, stale, "e1", "fact")  # type: ignore[arg-type]


TALK = SmallTalk(["Hi there.", "Thanks for chatting, have a good one.", "Okay, great."])


def test_current_value_first_and_stale_first() -> None:
    p = _probe("address", ("12 Mill Street",), ("3 Oak Avenue",))
    current = score(p, "## Memories\n- Address: 12  MILL street\n- Earlier: 3 Oak Avenue", TALK)
    assert current.current_first
    assert not current.stale_first
    stale = score(p, "customer: I live at 3 Oak Avenue\nagent: moved to 12 Mill Street", TALK)
    assert not stale.current_first
    assert stale.stale_first
    only_stale = score(p, "customer: 3 Oak Avenue", TALK)
    assert only_stale.stale_first
    assert not only_stale.current_first
    neither = score(p, "nothing here", TALK)
    assert not neither.current_first
    assert not neither.stale_first


def test_open_line_detection() -> None:
    p = _probe("promise_owed", ("call you back on Tuesday",))
    shown = score(p, "## Memories\nCall back\n  - Open: I'll call you back on Tuesday.", TALK)
    assert shown.open_shown
    as_turn = score(p, "[3 Nov 2025]\nagent: I'll call you back on Tuesday.", TALK)
    assert not as_turn.open_shown
    other = score(p, "- Open: We'll refund the £4.00.\n- I'll call you back on Tuesday.", TALK)
    assert not other.open_shown


def test_one_off_recall() -> None:
    p = _probe("one_off", ("sesame",))
    assert score(p, "customer: I'm allergic to Sesame.", TALK).recalled
    assert not score(p, "customer: hello", TALK).recalled


def test_small_talk_share_counts_lines_without_headers_or_days() -> None:
    context = "\n".join(
        [
            "## Memories",
            "- Address: 12 Mill Street (2025-03-01)",
            "",
            "## Recent turns",
            "[3 Nov 2025]",
            "customer: Hi there.",
            "agent: Thanks for chatting, have a good one.",
            "customer: okay, great.",
            "customer: okay, great, and my order is late",  # short ones match whole lines only
            "[4 Nov 2025] agent: Thanks for chatting, have a good one.",
        ]
    )
    assert len(content_lines(context)) == 6
    got = score(_probe("one_off", ("x",)), context, TALK)
    assert (got.lines, got.small_talk_lines) == (6, 4)


def test_the_baseline_takes_its_hits_first_then_the_newest_turns_shown_newest_first() -> None:
    events = [
        {"event_id": f"e{i}", "ts": f"2025-03-0{i + 1}T10:00:00Z", "role": "user", "text": text}
        for i, text in enumerate(
            ["my address is 1 Elm Road", "the kettle is broken", "lovely weather", "ok thanks"]
        )
    ]
    bm25 = NewestFirstBM25(events, lambda line: len(line.split()))
    every, _ = bm25.context("what is the address?", 100)
    assert [line.split("] ")[1] for line in every.splitlines()] == [
        "user: ok thanks",
        "user: lovely weather",
        "user: the kettle is broken",
        "user: my address is 1 Elm Road",
    ]
    # 16 words: the hit (10 with its day and speaker), then the newest that fits (6).
    some, used = bm25.context("what is the address?", 16)
    assert used <= 16
    assert [line.split("] ")[1] for line in some.splitlines()] == [
        "user: ok thanks",
        "user: my address is 1 Elm Road",
    ]


def test_a_status_probe_says_whether_the_text_ties_its_names(streams: dict[str, CsStream]) -> None:
    stream = streams["A"]
    status = [p for p in stream.probes if p.kind == "status"]
    assert {p.names_tied for p in status} == {True, False}  # both kinds occur
    assert all(p.names_tied is None for p in stream.probes if p.kind != "status")
    order = {"ref": "#40593", "product": "oak bookcase"}
    apposition = {
        "e1": "The oak bookcase (order #40593) is late.",
        "e2": "It came, the oak bookcase.",
    }
    apart = {"e1": "Order #40593 is late.", "e2": "It came, the oak bookcase."}
    assert order_names_tied(apposition, "e2", order, by_ref=True)
    assert not order_names_tied(apart, "e2", order, by_ref=True)
    assert order_names_tied(apart, "e2", order, by_ref=False)  # asked as the statement names it
    assert not order_names_tied(
        {"e1": "Order #405931 came."}, "e1", order, by_ref=True
    )  # whole words
