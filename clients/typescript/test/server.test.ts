// Against a real memstream: MEMSTREAM_URL and MEMSTREAM_API_KEY (make test starts one:
// tests/integration/test_typescript_client.py). Without MEMSTREAM_URL these are skipped.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { before, describe, test } from "node:test";

import { MemoryClient, MemstreamError, type EventIn } from "../src/index.js";

const url = process.env["MEMSTREAM_URL"];
const apiKey = process.env["MEMSTREAM_API_KEY"] ?? "ms-demo-key";
const skip = url ? false : "MEMSTREAM_URL is not set: no memstream server to test against";

/** `probe()` until it gives something, at most `timeoutMs`. */
async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const found = await probe();
    if (found !== undefined) return found;
    if (Date.now() > deadline) assert.fail(`${what}: not within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

describe("a real memstream", { skip }, () => {
  const client = new MemoryClient({ baseUrl: url, apiKey, timeoutMs: 10_000 });
  const user = `ts-${randomUUID().slice(0, 8)}`;
  const pinned = `${user}-pin`;
  const events: EventIn[] = [
    {
      user_id: user,
      session_id: "s1",
      role: "user",
      text: "The espresso machine I bought leaks water from the base.",
    },
    {
      user_id: user,
      session_id: "s1",
      role: "assistant",
      text: "Sorry to hear that, I have opened a repair ticket.",
    },
    {
      user_id: user,
      session_id: "s1",
      role: "user",
      text: "My loyalty card number is LC-88213.",
      event_id: pinned,
      metadata: { pin: true },
    },
  ];
  let ids: string[] = [];

  before(async () => {
    const added = await client.add(events);
    assert.equal(added.accepted, 3);
    ids = added.event_ids;
  });

  test("add gives every event an id, its own where it had one", () => {
    assert.equal(ids.length, 3);
    assert.equal(ids[2], pinned);
    assert.equal(new Set(ids).size, 3);
  });

  test("what was added is retrieved back, reading its own writes", async () => {
    // after_event_id: the server waits (at most ~2 s) until the last event is memorized;
    // a cold pipeline may need a few of those.
    const answer = await until(
      "the leaking espresso machine in retrieval",
      async () => {
        const found = await client.retrieve({
          user_id: user,
          query: "Which machine is leaking?",
          after_event_id: pinned,
        });
        const ours = found.items.some((item) => item.source_event_ids.includes(ids[0]!));
        return found.after_event_memorized === true && ours ? found : undefined;
      },
      30_000,
    );
    assert.match(answer.context, /espresso machine I bought leaks water/);
    assert.ok(answer.context_tokens > 0 && answer.context_tokens <= 512);
    const item = answer.items.find((i) => i.source_event_ids.includes(ids[0]!))!;
    assert.equal(item.kind, "turn");
    assert.match(item.text, /espresso machine/);
    assert.deepEqual(
      await client
        .search({ user_id: `${user}-nobody`, query: "Which machine is leaking?" })
        .then((r) => r.items),
      [],
    );
  });

  test("memories lists the pinned turn's memory, get reads it, forget removes everything", async () => {
    const memory = await until(
      "a memory of the pinned turn",
      async () => (await client.memories(user)).memories.find((m) => m.source_event_ids?.includes(pinned)),
      60_000,
    );
    assert.equal(memory.user_id, user);
    assert.match(JSON.stringify(memory), /LC-88213/);
    const page = await client.memories(user, { limit: 1 });
    assert.equal(page.memories.length, 1);
    assert.equal((await client.get(user, memory.memory_id)).memory_id, memory.memory_id);

    const gone = await client.forget(user);
    assert.equal(gone.user_id, user);
    assert.ok(gone.memories_deleted >= 1, JSON.stringify(gone));
    assert.ok(gone.redis_keys_deleted > 0, JSON.stringify(gone));
    assert.ok(!Number.isNaN(Date.parse(gone.forgotten_at)));
    assert.deepEqual((await client.memories(user)).memories, []);
    assert.deepEqual(
      (await client.retrieve({ user_id: user, query: "Which machine is leaking?" })).items,
      [],
    );
    await assert.rejects(client.get(user, memory.memory_id), { name: "MemstreamError", status: 404 });
  });

  test("4xx answers surface as MemstreamError with the server's message", async () => {
    await assert.rejects(
      client.retrieve({ user_id: user, query: "x", budget_tokens: 1 }),
      (error: unknown) => {
        assert.ok(error instanceof MemstreamError);
        assert.equal(error.status, 422);
        assert.match(error.reason, /^budget_tokens: Input should be greater than or equal to 32/);
        return true;
      },
    );
    await assert.rejects(client.forget("bad\tuser"), { name: "MemstreamError", status: 422 });
    await assert.rejects(client.get(user, "no-such-memory"), {
      status: 404,
      reason: `no memory 'no-such-memory' for user '${user}'`,
    });
    const stranger = new MemoryClient({ baseUrl: url, apiKey: "not-a-key" });
    await assert.rejects(stranger.memories(user), {
      status: 401,
      message: "memstream answered 401: unknown API key",
    });
  });
});
