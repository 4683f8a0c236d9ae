"""Benchmarks: every figure next to its reference measured in the same run (see BENCHMARKS.md)."""
