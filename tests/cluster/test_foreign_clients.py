"""Bots that are not memstream's Python client, on the real Kafka: Debian's kcat and
confluent-kafka (both librdkafka, neither aiokafka) produce ``InteractionEvent`` JSON keyed
``tenant:user``, memstream remembers it (the RPC finds the turn), and each reads back the
dead letter of its bad event from ``memstream.dlq`` and its pinned event's memory from
``memstream.consolidated``. One test body, one small adapter per client.

librdkafka reads ``read_committed`` by default, so with ``exactly_once`` processing these
readers see committed records only, as any downstream consumer would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Callable
from typing import Protocol

import pytest

from memstream.schemas import ConsolidatedMemory, DeadLetter
from memstream.settings import DEMO_TENANT
from memstream.streaming.broker import bootstrap_servers
from tests.integration.process import MemstreamProcess, wait_for
from tests.integration.test_foreign_client import event, produce, read_until
from tests.real_clusters import on_clusters

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not on_clusters(), reason="needs the real clusters: make cluster-test"),
]


class Client(Protocol):
    def produce(self, topic: str, records: list[tuple[str, bytes]]) -> None: ...

    def read(self, topic: str, done: Callable[[list[bytes]], bool], timeout_s: float) -> None:
        """Read ``topic`` from its start until ``done(values)`` holds, or fail."""


class Kcat:
    def __init__(self, servers: str) -> None:
        self.servers = servers

    def run(self, *args: str, stdin: bytes = b"") -> bytes:
        done = subprocess.run(
            ["kcat", "-b", self.servers, *args], input=stdin, capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        return done.stdout

    def produce(self, topic: str, records: list[tuple[str, bytes]]) -> None:
        lines = b"".join(k.encode() + b"\t" + v + b"\n" for k, v in records)
        # -K: the key delimiter; acks=all like memstream's own producers
        self.run("-P", "-t", topic, "-K", "\t", "-X", "acks=all", stdin=lines)

    def read(self, topic: str, done: Callable[[list[bytes]], bool], timeout_s: float) -> None:
        def read_all() -> bool:  # -e: exit at the end of every partition
            return done(self.run("-C", "-t", topic, "-e", "-q", "-o", "beginning").splitlines())

        wait_for(read_all, timeout_s, f"kcat reading {topic}")


class ConfluentKafka:
    def __init__(self, servers: str) -> None:
        self.servers = servers

    def produce(self, topic: str, records: list[tuple[str, bytes]]) -> None:
        produce(self.servers, topic, [(k, v) for k, v in records])

    def read(self, topic: str, done: Callable[[list[bytes]], bool], timeout_s: float) -> None:
        assert done(read_until(self.servers, topic, done, timeout_s)), f"nothing in {topic}"


def kcat_client(servers: str) -> Client:
    if shutil.which("kcat") is None:
        pytest.skip("needs kcat (apt-get install kcat)")
    return Kcat(servers)


CLIENTS: dict[str, Callable[[str], Client]] = {
    "kcat": kcat_client,
    "confluent-kafka": ConfluentKafka,
}


@pytest.mark.parametrize("name", list(CLIENTS))
def test_foreign_client_events_are_remembered_and_dlq_and_consolidated_read_back(
    running: MemstreamProcess, name: str
) -> None:
    settings = running.settings
    client = CLIENTS[name](bootstrap_servers(settings.kafka.broker))
    user = f"{name[:5]}-{uuid.uuid4().hex[:6]}"
    key = f"{DEMO_TENANT}:{user}"
    turn, pinned = f"{user}-turn", f"{user}-pin"
    client.produce(
        settings.kafka.topic("events"),
        [
            (key, event(user, turn, "Please send the invoice for order K-5521 to billing.")),
            (key, b"not json at all"),  # dead-lettered, the stream goes on
            (key, event(user, pinned, "My loyalty card number is LC-88213.", pin=True)),
        ],
    )

    def remembered() -> bool:
        with running.client() as http:
            answer = http.post("/v1/retrieve", json={"user_id": user, "query": "invoice K-5521"})
        assert answer.status_code == 200, answer.text
        return any(turn in item["source_event_ids"] for item in answer.json()["items"])

    wait_for(remembered, 90, f"the {name} event in retrieval")

    letters: list[DeadLetter] = []

    def dead_letter(values: list[bytes]) -> bool:
        parsed = (DeadLetter.model_validate_json(v) for v in values if v)
        letters[:] = [d for d in parsed if d.key == key]
        return bool(letters)

    client.read(settings.kafka.topic("dlq"), dead_letter, 90)
    assert [(d.stage, "not json at all" in d.original) for d in letters] == [("encode", True)]

    memories: list[ConsolidatedMemory] = []

    def consolidated(values: list[bytes]) -> bool:
        parsed = (ConsolidatedMemory.model_validate_json(v) for v in values if v)
        memories[:] = [m for m in parsed if m.user_id == user and pinned in m.source_event_ids]
        return bool(memories)

    client.read(settings.kafka.topic("consolidated"), consolidated, 150)
    assert memories[0].tenant_id == DEMO_TENANT
    assert "LC-88213" in json.dumps(memories[0].model_dump(mode="json"))
