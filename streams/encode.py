"""The ``encode`` processor: memstream.events -> batched ONNX encoding -> memstream.encoded."""

from __future__ import annotations

import asyncio
import time
from functools import partial

import faust
import numpy as np

from memstream.metrics import Metrics
from schemas import EncodedEvent, InteractionEvent
from stores.encoder import OnnxEncoder
from streams.app import Topics
from streams.handling import DeadLetters, with_retries

STAGE = "encode"


def text_for_embedding(event: InteractionEvent) -> str:
    """What the encoder sees: the turn's own words (speaker and date are matched separately)."""
    return event.text


def register_encode(
    app: faust.App,
    topics: Topics,
    encoder: OnnxEncoder,
    metrics: Metrics,
    *,
    batch_size: int,
    within_s: float,
) -> None:
    dead_letters = DeadLetters(topics.dlq, metrics, stage=STAGE, source=topics.events)

    @app.agent(topics.events, name="memstream.encode")
    async def encode(stream: faust.StreamT[bytes]) -> None:
        async for batch in stream.take_events(batch_size, within=within_s):
            started = time.perf_counter()
            decoded = [await dead_letters.decode(InteractionEvent, m.key, m.value) for m in batch]
            valid = [event for event in decoded if event is not None]
            if not valid:
                continue
            texts = [text_for_embedding(e) for e in valid]
            try:
                vectors = await with_retries(
                    partial(asyncio.to_thread, encoder.encode, texts), stage=STAGE, metrics=metrics
                )
            except Exception:
                # One bad text must not sink its batch: encode one by one, dead-letter the culprit.
                valid, vectors = await _encode_one_by_one(valid, encoder, dead_letters, topics)
            for event, vector in zip(valid, vectors, strict=True):
                out = EncodedEvent(
                    event=event, embedding=vector.tolist(), model_id=encoder.model_id
                )
                await topics.encoded.send(
                    key=event.user_key.encode(), value=out.model_dump_json().encode()
                )
            metrics.batch_size.labels(STAGE).observe(len(valid))
            metrics.events.labels(STAGE, "ok").inc(len(valid))
            metrics.stage_latency.labels(STAGE).observe(time.perf_counter() - started)


async def _encode_one_by_one(
    events: list[InteractionEvent], encoder: OnnxEncoder, dead_letters: DeadLetters, topics: Topics
) -> tuple[list[InteractionEvent], list[np.ndarray]]:
    kept: list[InteractionEvent] = []
    vectors: list[np.ndarray] = []
    for event in events:
        try:
            vectors.append(
                (await asyncio.to_thread(encoder.encode, [text_for_embedding(event)]))[0]
            )
            kept.append(event)
        except Exception as exc:
            await dead_letters.poison(
                exc, event.user_key.encode(), event.model_dump_json().encode()
            )
    return kept, vectors
