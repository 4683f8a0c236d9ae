"""faust's Kafka transport with a configurable fetch wait.

faust hard-codes ``fetch_max_wait_ms=1500``. Kafka answers a fetch as soon as data arrives,
but Tansu (the embedded broker) holds every empty fetch for the full wait, which adds up to
1.5 s per hop — three hops from a bot's event to a retrievable turn. A short wait costs an
idle consumer a few small requests a second and makes every hop fast on either broker.
"""

from __future__ import annotations

from typing import Any, ClassVar

import aiokafka
from faust.transport.drivers import aiokafka as faust_aiokafka


class ShortFetchConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    fetch_max_wait_ms: ClassVar[int] = 100

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka reads this when the consumer starts (pinned aiokafka==0.14.0).
        assert hasattr(consumer, "_fetch_max_wait_ms"), "aiokafka changed: revisit fetch wait"
        consumer._fetch_max_wait_ms = self.fetch_max_wait_ms
        return consumer


class ShortFetchConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ShortFetchConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ShortFetchTransport(faust_aiokafka.Transport):
    Consumer = ShortFetchConsumer
