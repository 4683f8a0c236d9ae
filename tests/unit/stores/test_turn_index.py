"""The RPC turn index: its append path builds exactly what a full build of the same rows does,
and a sync never changes a view it handed out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memstream.memory.chatter import Prototypes
from memstream.memory.lexical import LexicalIndex, tokens_of
from memstream.memory.turns import Exemplars
from memstream.memory.vectors import LabelledRows
from memstream.schemas import StoredTurn
from memstream.stores.short_term import TurnWithVector
from memstream.stores.turn_index import TurnIndex, UserTurns, index_turn
from tests.fakes import FakeShortTermState
from tests.unit.over_fakes import ENCODER, put_hot

T0 = datetime(2023, 5, 1, tzinfo=UTC)


def rows(n: int) -> list[TurnWithVector]:
    rng = np.random.default_rng(4)
    out = []
    for i in range(n):
        v = rng.standard_normal(8).astype(np.float32)
        turn = StoredTurn(
            event_id=f"e{i:02d}",
            session_id=f"s{i // 4}",
            role="user",
            text=(f"order A-{i % 3} note {i}", "thanks!", "I'll call you back by Friday.")[i % 3],
            ts=T0 + timedelta(minutes=i // 2),  # ties on time: event id breaks them
            speaker=("Ana", "Ben", None)[i % 3],
            entities=[f"order:a-{i % 3}"],
        )
        out.append(TurnWithVector(turn, v / np.linalg.norm(v)))
    return out


def lexical(of: list[TurnWithVector]) -> LexicalIndex:
    index = LexicalIndex()
    for r in of:
        index_turn(index, r.turn)
    return index


def test_extended_equals_a_full_build() -> None:
    everything = rows(12)
    shared = lexical(everything)
    full = UserTurns.build(b"v2", everything, shared, 8, expected=12, archive_seen=3)
    grown = UserTurns.build(b"v1", everything[:5], shared, 8, expected=5, archive_seen=3)
    grown = grown.extended(b"v2", everything[5:9], shared, expected=9, archive_seen=3)
    grown = grown.extended(b"v2", everything[9:], shared, expected=12, archive_seen=3)
    for name in ("version", "ids", "docs", "positions", "speakers", "texts", "speaker_names"):
        assert getattr(grown, name) == getattr(full, name), name
    assert grown.by_entity == full.by_entity
    assert grown.names == full.names
    np.testing.assert_array_equal(grown.ts, full.ts)
    np.testing.assert_array_equal(grown.vectors, full.vectors)
    np.testing.assert_array_equal(grown.speaker_of, full.speaker_of)
    for marks in ("salient", "promise", "done", "line_keys", "attribute"):
        np.testing.assert_array_equal(getattr(grown, marks), getattr(full, marks))
    assert (grown.expected, grown.archive_seen, grown.nbytes) == (12, 3, full.nbytes)
    assert grown.complete
    assert grown.last_key() == (full.ts[-1], "e11")


def test_extended_with_nothing_new_only_moves_the_version() -> None:
    some = rows(3)
    held = UserTurns.build(b"v1", some, lexical(some), 8, expected=4)
    same = held.extended(b"v2", [], held.lexical, expected=4, archive_seen=7)
    assert (same.version, same.ids, same.archive_seen) == (b"v2", held.ids, 7)
    assert not same.complete  # Redis counted a turn that is not here yet


def test_a_rebuild_reuses_what_the_view_it_replaces_held() -> None:
    everything = rows(12)
    shared = lexical(everything)
    full = UserTurns.build(b"v2", everything, shared, 8)
    # A late turn (e00) arrives after the others were held: the rows are merged, and what
    # was held (lines, marks) is taken over, not read again from the texts.
    held = UserTurns.build(b"v1", everything[1:], shared, 8)
    rebuilt = UserTurns.build(b"v2", everything, shared, 8, known=held)
    assert rebuilt.texts == full.texts
    for marks in ("salient", "promise", "done", "line_keys", "attribute"):
        np.testing.assert_array_equal(getattr(rebuilt, marks), getattr(full, marks))
    assert full.salient.tolist()[:3] == [True, False, True]  # "thanks!" says nothing
    assert full.promise.tolist()[:3] == [False, False, False]  # the user's, not the agent's


def test_turns_close_to_chatter_by_meaning_are_not_salient_built_or_appended() -> None:
    everything = rows(12)
    said = everything[8]  # its words are content, its vector (below) a chatter exemplar's
    everything[8] = TurnWithVector(
        said.turn.model_copy(update={"text": "Oh what a week it has been."}), said.vector
    )
    # Chatter exemplars right on row 3 ("order A-0 note 3": it names an entity) and row 8.
    exemplars = Exemplars(
        Prototypes(
            chatter=np.stack([everything[3].vector, everything[8].vector]),
            content=np.zeros((0, 8), dtype=np.float32),
        ),
        LabelledRows(np.zeros((0, 8), np.float32), ()),
        LabelledRows(np.zeros((0, 8), np.float32), ()),
        LabelledRows(np.zeros((0, 8), np.float32), ()),
    )
    shared = lexical(everything)
    plain = UserTurns.build(b"v", everything, shared, 8)
    full = UserTurns.build(b"v", everything, shared, 8, exemplars=exemplars)
    grown = UserTurns.build(b"v", everything[:6], shared, 8, exemplars=exemplars)
    grown = grown.extended(
        b"v", everything[6:], shared, expected=12, archive_seen=-1, exemplars=exemplars
    )
    np.testing.assert_array_equal(grown.salient, full.salient)
    assert full.salient[3]  # an entity is never chatter, whatever its vector
    assert plain.salient[8]
    assert not full.salient[8]
    assert full.salient[5]  # content words, another vector
    assert not plain.salient[4]  # "thanks!": small talk by its words anyway


@pytest.mark.parametrize("late", [False, True], ids=["appended", "rebuilt"])
async def test_a_sync_leaves_the_snapshot_a_retrieval_holds_as_it_was(late: bool) -> None:
    """A sync builds a new view: one handed out earlier keeps its rows, vectors and BM25
    scores, so ranking it needs no care about what was written since."""
    state = FakeShortTermState()
    for i, text in enumerate(["my order A-1 is late", "the blender jug cracked", "thanks"]):
        turn = StoredTurn(
            event_id=f"e{i}", session_id="s", role="user", text=text, ts=T0 + timedelta(hours=i)
        )
        await put_hot(state, "t", "u", turn)
    index = TurnIndex(state, dim=ENCODER.dim)
    held = await index.get("t", "u")
    query = tokens_of("late order blender user")
    ids, vectors = list(held.ids), held.vectors.copy()
    scores = held.lexical.scores(query, held.positions, len(held.ids))
    # Shares words with the held turns (their postings change), and is earlier than all of
    # them when ``late``: the sync then rebuilds instead of appending.
    new = StoredTurn(
        event_id="e9",
        session_id="s",
        role="user",
        text="my order A-1 is late again, and the blender too",
        ts=T0 - timedelta(hours=1) if late else T0 + timedelta(hours=9),
    )
    await put_hot(state, "t", "u", new)
    synced = await index.get("t", "u")
    assert synced is not held
    assert len(synced.ids) == 4
    assert "e9" in synced.positions
    assert synced.lexical.scores(query, synced.positions, 4)[synced.positions["e9"]] > 0
    assert held.ids == ids
    np.testing.assert_array_equal(held.vectors, vectors)
    assert len(held.lexical) == 3
    assert "e9" not in held.lexical
    np.testing.assert_array_equal(held.lexical.scores(query, held.positions, len(held.ids)), scores)
