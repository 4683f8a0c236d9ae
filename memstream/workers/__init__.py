"""Consolidation workers (batched, LLM-bounded) and periodic maintenance."""
