"""A long turn shows only its sentences that bear on the question (memory.excerpts)."""

from __future__ import annotations

from memstream.memory.excerpts import ELLIPSIS, excerpt, question_terms


def words(text: str) -> int:
    return len(text.split())


LONG = (
    "Melanie: Oh, it was such a busy week with the kids and the school run. "
    "I finally painted that sunrise over the lake last weekend. "
    "We also went camping, the weather was lovely and the tent held up. "
    "Anyway, how are you doing these days?"
)


def test_a_long_turn_keeps_the_sentences_sharing_a_word_with_the_question() -> None:
    terms = question_terms("What did Melanie paint at the lake?")
    cut = excerpt(LONG, terms, words, over_tokens=20)
    assert cut == (
        f"Melanie: {ELLIPSIS} I finally painted that sunrise over the lake last weekend. {ELLIPSIS}"
    )


def test_left_out_runs_get_one_mark_each_and_the_order_is_kept() -> None:
    terms = question_terms("camping at the lake")
    cut = excerpt(LONG, terms, words, over_tokens=20)
    assert cut == (
        f"Melanie: {ELLIPSIS} I finally painted that sunrise over the lake last weekend. "
        "We also went camping, the weather was lovely and the tent held up. "
        f"{ELLIPSIS}"
    )


def test_a_short_turn_stays_whole() -> None:
    assert excerpt(LONG, question_terms("lake"), words, over_tokens=words(LONG)) is None


def test_a_turn_with_no_or_only_bearing_sentences_stays_whole() -> None:
    assert excerpt(LONG, question_terms("favourite pizza topping"), words, over_tokens=5) is None
    every = "Ann: The lake was cold. The lake was deep. The lake was far."
    assert excerpt(every, question_terms("the lake"), words, over_tokens=5) is None
    assert (
        excerpt(
            "Ann: one long sentence about the lake", question_terms("lake"), words, over_tokens=2
        )
        is None
    )


def test_a_word_matches_another_form_of_itself() -> None:
    terms = question_terms("When did she start painting?")
    assert "paint" in terms
    cut = excerpt(LONG, terms, words, over_tokens=20)
    assert cut is not None
    assert "painted that sunrise" in cut
    assert "camping" not in cut


def test_a_line_without_a_speaker_is_cut_the_same_way() -> None:
    text = LONG.removeprefix("Melanie: ")
    cut = excerpt(text, question_terms("lake sunrise"), words, over_tokens=20)
    assert (
        cut == f"{ELLIPSIS} I finally painted that sunrise over the lake last weekend. {ELLIPSIS}"
    )
