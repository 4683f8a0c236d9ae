"""The ``encode`` processor: memstream.events -> batched ONNX encoding -> memstream.encoded."""

from __future__ import annotations

import asyncio
from functools import partial

import faust
import numpy as np

from memstream.metrics import Metrics
from schemas import EncodedEvent, InteractionEvent
from stores.broker import Topics
from stores.encoder import OnnxEncoder
from stores.stage import Received, Stage

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
    stage = Stage(STAGE, topics.events, topics.dlq, metrics)

    async def encode_one(item: Received[InteractionEvent]) -> np.ndarray:
        row: np.ndarray = (
            await asyncio.to_thread(encoder.encode, [text_for_embedding(item.value)])
        )[0]
        return row

    async def handle(batch: list[Received[InteractionEvent]]) -> int:
        texts = [text_for_embedding(item.value) for item in batch]
        try:
            vectors = await stage.retry(partial(asyncio.to_thread, encoder.encode, texts))
            encoded = list(zip(batch, vectors, strict=True))
        except Exception:
            # One bad text must not sink its batch: encode one by one, dead-letter the culprit.
            encoded = await stage.one_by_one(batch, encode_one, retry=False)
        for item, vector in encoded:
            event = item.value
            out = EncodedEvent(event=event, embedding=vector.tolist(), model_id=encoder.model_id)
            await topics.encoded.send(
                key=event.user_key.encode(), value=out.model_dump_json().encode()
            )
        return len(encoded)

    stage.batched(
        app,
        InteractionEvent,
        handle,
        agent="memstream.encode",
        batch_size=batch_size,
        within_s=within_s,
    )
