"""The reliability and security suite: faults injected into a real, multi-process memstream.

One module per fault family (crashes, outages, poison, bad input, fuzzing, isolation, load),
each with ``NAME`` and ``async def run(ctx) -> list[Row]``; ``python -m reliability`` runs
them, prints one table (fault, events sent, lost, duplicated, errors, p99) and writes it to
``RELIABILITY.md``. A row whose promised zero is not zero makes the exit code non-zero.
"""
