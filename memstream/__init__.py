"""memstream: long-term memory for LLM chat agents, built as an event-streaming pipeline."""
