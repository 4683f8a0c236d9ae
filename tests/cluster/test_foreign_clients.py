"""A bot that is not Python: Debian's kcat (librdkafka) produces ``InteractionEvent`` JSON keyed
``tenant:user`` into the real Kafka, memstream remembers it, and kcat reads the dead letter of
a bad event back from ``memstream.dlq``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid

import pytest

from memstream.settings import Settings
from rpc.publisher import bootstrap_servers
from stores.real_clusters import on_clusters
from tests.integration.process import MemstreamProcess, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not on_clusters(), reason="needs the real clusters: make cluster-test"),
    pytest.mark.skipif(shutil.which("kcat") is None, reason="needs kcat (apt-get install kcat)"),
]


def kcat(settings: Settings, *args: str, stdin: str = "") -> str:
    brokers = bootstrap_servers(settings.kafka.broker)
    done = subprocess.run(
        ["kcat", "-b", brokers, *args], input=stdin, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kcat_events_are_remembered_and_dead_letters_read_back(running: MemstreamProcess) -> None:
    settings = running.settings
    user = f"kcat-{uuid.uuid4().hex[:6]}"
    event = {
        "event_id": f"{user}-1",
        "tenant_id": "demo",
        "user_id": user,
        "session_id": "s1",
        "role": "user",
        "text": "Please send the invoice for order K-5521 to billing@example.org.",
        "ts": "2026-11-20T10:00:00Z",
    }
    lines = f"demo:{user}\t{json.dumps(event)}\ndemo:{user}\tnot json at all\n"
    # -K: key delimiter; acks=all (-X) like memstream's own producers
    kcat(settings, "-P", "-t", settings.topic("events"), "-K", "\t", "-X", "acks=all", stdin=lines)

    def remembered() -> bool:
        with running.client() as http:
            answer = http.post("/v1/retrieve", json={"user_id": user, "query": "invoice K-5521"})
        assert answer.status_code == 200, answer.text
        return any(event["event_id"] in i["source_event_ids"] for i in answer.json()["items"])

    wait_for(remembered, 60, "the kcat event in retrieval")

    def dead_letter() -> dict | None:
        out = kcat(settings, "-C", "-t", settings.topic("dlq"), "-e", "-q", "-o", "beginning")
        for line in out.splitlines():
            letter = json.loads(line)
            if "not json at all" in json.dumps(letter):
                return letter
        return None

    letter = wait_for(dead_letter, 60, "the bad event's dead letter")
    assert letter["stage"] == "encode"
