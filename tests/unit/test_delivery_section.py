"""bench/delivery.py owns one section of BENCHMARKS.md: replaced in place, kept by a rewrite."""

from __future__ import annotations

from pathlib import Path

from bench.delivery import BEGIN, END, section_of, write_section


def test_the_section_is_appended_then_replaced_and_the_rest_is_untouched(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# benchmarks\n\nheadline\n")
    assert section_of(path) is None
    write_section(path, f"{BEGIN}\nfirst\n{END}")
    write_section(path, f"{BEGIN}\nsecond\n{END}")
    assert path.read_text() == f"# benchmarks\n\nheadline\n\n{BEGIN}\nsecond\n{END}\n"
    assert section_of(path) == f"{BEGIN}\nsecond\n{END}"
    # What bench/runner.py does: rewrite the file, then put the section back.
    kept = section_of(path)
    path.write_text("# benchmarks\n\nnew headline\n")
    assert kept is not None
    write_section(path, kept)
    assert path.read_text().endswith(f"new headline\n\n{BEGIN}\nsecond\n{END}\n")
