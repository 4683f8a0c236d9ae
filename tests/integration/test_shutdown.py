"""``make run`` as a newcomer sees it: the replay says it is still arriving, then Ctrl-C.

One real ``memstream up --replay`` on its own embedded broker, Valkey and Qdrant Edge:
while the sample settles, ``/readyz`` and the retrieval header say how many events are
pending; the curl banner comes only once it settled; a terminal's Ctrl-C (SIGINT to the
whole process group) stops it quietly, roles before the services they use, within 10 s,
and leaves no lock file behind.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from memstream.settings import DEMO_API_KEY
from memstream.stores.embedded import free_port
from tests.integration.process import wait_for
from tests.integration.stack import Stack, alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CTRL_C_BOUND_S = 10.0
QUESTION = {"user_id": "cust-ana", "query": "What is the status of order A-10293?"}


def test_replay_reports_catching_up_then_ctrl_c_stops_quietly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    stack = Stack(
        data,
        free_port(),
        tmp_path / "up.log",
        args=["--replay", "examples/sample_stream.jsonl"],
    ).spawn()
    try:
        headers = {"Authorization": f"Bearer {DEMO_API_KEY}"}

        def catching_up() -> dict | None:
            assert stack.proc is not None
            assert stack.proc.poll() is None, stack.output()[-3000:]
            try:
                ready = httpx.get(f"{stack.url}/readyz", timeout=2)
                answer = httpx.post(
                    f"{stack.url}/v1/retrieve", json=QUESTION, headers=headers, timeout=5
                )
            except httpx.HTTPError:
                return None
            body = ready.json()
            if ready.status_code == 200 and body["catching_up"]:
                return {"ready": body, "header": answer.headers.get("X-Memstream-Catching-Up")}
            return None

        seen = wait_for(catching_up, 150, "/readyz to report the replay catching up")
        assert seen["ready"]["pending_events"] > 0
        assert "memstream is serving" not in stack.output()  # no curl before it settled

        wait_for(lambda: "memstream is serving" in stack.output(), 150, "the serving banner")
        ready = httpx.get(f"{stack.url}/readyz", timeout=2).json()
        assert ready["ready"] is True
        assert ready["catching_up"] is False
        assert ready["pending_events"] == 0
        answer = httpx.post(f"{stack.url}/v1/retrieve", json=QUESTION, headers=headers, timeout=5)
        assert answer.status_code == 200
        assert "X-Memstream-Catching-Up" not in answer.headers
        assert answer.json()["items"], "the settled sample answers the README's question"
        banner = stack.output().split("memstream is serving", 1)[1]
        assert f"Bearer {DEMO_API_KEY}" in banner  # no keys configured: the demo key works
        assert "curl -s" in banner

        children = stack.children()
        assert len(children) == 2, children  # the embedded broker and Valkey
        assert (data / "stack.lock").exists()
        before = len(stack.output())
        code, took = stack.ctrl_c(CTRL_C_BOUND_S + 20)
        tail = stack.output()[before:]
        assert code is not None, f"still running {took:.0f}s after Ctrl-C: {tail[-2000:]}"
        assert took < CTRL_C_BOUND_S, f"Ctrl-C took {took:.1f}s: {tail[-2000:]}"
        assert code == 0, tail[-2000:]
        assert "Traceback" not in tail, tail[-3000:]
        assert '"level":"error"' not in tail, tail[-3000:]
        assert not [pid for pid in children if alive(pid)], "a service outlived memstream"
        left = [str(p.relative_to(data)) for p in data.rglob("*.lock")]
        assert not left, f"lock files outlived a clean stop: {left}"
    finally:
        stack.kill()
