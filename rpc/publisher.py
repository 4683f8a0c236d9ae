"""Publishing from the RPC to Kafka: one pooled aiokafka producer per process."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer


def bootstrap_servers(broker_url: str) -> str:
    """faust-style ``kafka://h1:9092;kafka://h2:9092`` -> aiokafka's ``h1:9092,h2:9092``."""
    hosts = [
        part.removeprefix("kafka://").strip("/") for part in broker_url.replace(";", ",").split(",")
    ]
    return ",".join(h for h in hosts if h)


class EventPublisher:
    def __init__(self, broker_url: str) -> None:
        # Idempotent producers are not supported by every Kafka-protocol broker (Tansu):
        # at-least-once delivery plus idempotent consumers instead.
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers(broker_url),
            acks="all",
            enable_idempotence=False,
            linger_ms=2,
        )

    async def start(self) -> None:
        await self._producer.start()

    async def publish(self, topic: str, key: str, value: bytes) -> None:
        await self._producer.send_and_wait(topic, value=value, key=key.encode())

    async def publish_many(self, topic: str, items: list[tuple[str, bytes]]) -> None:
        futures = [await self._producer.send(topic, value=v, key=k.encode()) for k, v in items]
        for future in futures:
            await future

    async def ping(self) -> bool:
        try:
            await self._producer.client.fetch_all_metadata()
        except Exception:
            return False
        return True

    async def close(self) -> None:
        await self._producer.stop()
