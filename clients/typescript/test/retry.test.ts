// The retry rules against a tiny local HTTP server: the server's Retry-After honoured
// (capped, jittered up), bounded, the same event ids on every attempt.
import assert from "node:assert/strict";
import { createServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, test } from "node:test";

import { MemoryClient, MemstreamConnectionError, MemstreamError, retryDelayMs } from "../src/index.js";

const OK = { items: [], context: "", context_tokens: 0, took_ms: 1.0 };

interface Seen {
  path: string;
  body: string;
  authorization: string | undefined;
}

type Answer = (response: ServerResponse) => void;

function reply(status: number, body: unknown, headers: Record<string, string> = {}): Answer {
  return (response) => {
    response.writeHead(status, { "Content-Type": "application/json", ...headers });
    response.end(JSON.stringify(body));
  };
}

function html(status: number, text: string): Answer {
  return (response) => {
    response.writeHead(status, { "Content-Type": "text/html" });
    response.end(text);
  };
}

const servers: ReturnType<typeof createServer>[] = [];
after(() => {
  for (const server of servers) {
    server.closeAllConnections();
    server.close();
  }
});

/** A server that gives `answers` in turn, then `fallback`; what it was sent in `seen`. */
async function serve(answers: Answer[], fallback: Answer = reply(200, OK)) {
  const seen: Seen[] = [];
  const server = createServer((request, response) => {
    let body = "";
    request.on("data", (chunk: Buffer) => (body += chunk.toString()));
    request.on("end", () => {
      seen.push({ path: request.url ?? "", body, authorization: request.headers.authorization });
      (answers.shift() ?? fallback)(response);
    });
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, seen };
}

/** A seeded generator in [0, 1) (mulberry32), so a failure repeats. */
function seeded(seed: number): () => number {
  let state = seed;
  return () => {
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

test("the delay honours the hint within the cap, jittered up by at most half", () => {
  const cases: [Record<string, string>, number, number][] = [
    [{ "Retry-After-Ms": "250" }, 250, 375], // the precise hint first
    [{ "Retry-After-Ms": "250", "Retry-After": "1" }, 250, 375],
    [{ "Retry-After": "2" }, 2000, 3000],
    [{ "Retry-After": "60" }, 5000, 7500], // capped
    [{ "Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT" }, 400, 600], // a date: backoff
    [{}, 400, 600], // no hint: 100 * 2 ** 2
  ];
  const random = seeded(7);
  for (const [headers, low, high] of cases) {
    for (let i = 0; i < 50; i++) {
      const delay = retryDelayMs(2, new Headers(headers), 100, 5000, random);
      assert.ok(low <= delay && delay <= high, `${JSON.stringify(headers)}: ${delay}`);
    }
  }
  assert.equal(
    retryDelayMs(0, null, 100, 5000, () => 0),
    100,
  );
  assert.equal(
    retryDelayMs(3, null, 100, 5000, () => 1),
    1200,
  );
});

test("a 429 with Retry-After-Ms is retried after the hint with the same event ids", async () => {
  const busy = reply(429, { detail: "memstream is behind" }, { "Retry-After": "1", "Retry-After-Ms": "150" });
  const { url, seen } = await serve([busy], reply(202, { accepted: 2, event_ids: ["a", "b"] }));
  const client = new MemoryClient({ baseUrl: url, apiKey: "k1" });
  const started = performance.now();
  const answer = await client.add([
    { user_id: "u1", session_id: "s1", role: "user", text: "My parcel is late." },
    { user_id: "u1", session_id: "s1", role: "user", text: "Order A-1.", event_id: "mine-1" },
  ]);
  const waited = performance.now() - started;
  assert.deepEqual(answer, { accepted: 2, event_ids: ["a", "b"] });
  assert.deepEqual(
    seen.map((s) => [s.path, s.authorization]),
    [
      ["/v1/events", "Bearer k1"],
      ["/v1/events", "Bearer k1"],
    ],
  );
  assert.ok(waited >= 150 && waited < 1000, `waited ${waited} ms: the ms hint, not Retry-After's 1 s`);
  const [first, second] = seen.map((s) =>
    JSON.parse(s.body).events.map((e: { event_id: string }) => e.event_id),
  );
  assert.deepEqual(first, second); // a retry never stores a turn twice
  assert.match(first[0], /^[0-9a-f]{32}$/);
  assert.equal(first[1], "mine-1");
});

test("502, 503 and 504 are retried too, and the server's hint is capped", async () => {
  const { url, seen } = await serve([
    reply(503, { detail: "shed" }, { "Retry-After": "60" }),
    html(502, "bad gateway"),
    reply(504, { detail: "deadline" }),
  ]);
  const client = new MemoryClient({ baseUrl: url, retries: 3, backoffMs: 1, maxRetryAfterMs: 20 });
  const started = performance.now();
  const answer = await client.retrieve({ user_id: "u1", query: "where is my parcel" });
  assert.equal(answer.took_ms, 1.0);
  assert.ok(performance.now() - started < 1000, "Retry-After: 60 capped at 20 ms");
  assert.deepEqual(
    seen.map((s) => s.path),
    Array(4).fill("/v1/retrieve"),
  );
  assert.deepEqual(JSON.parse(seen[0]!.body), { user_id: "u1", query: "where is my parcel" });
});

test("retries are bounded: the last refusal surfaces as a MemstreamError", async () => {
  const { url, seen } = await serve(
    [],
    reply(429, { detail: "memstream is 6000 events behind" }, { "Retry-After-Ms": "5" }),
  );
  const client = new MemoryClient({ baseUrl: url, retries: 2 });
  await assert.rejects(client.retrieve({ user_id: "u1", query: "x" }), (error: unknown) => {
    assert.ok(error instanceof MemstreamError);
    assert.equal(error.status, 429);
    assert.equal(error.reason, "memstream is 6000 events behind");
    assert.equal(error.message, "memstream answered 429: memstream is 6000 events behind");
    return true;
  });
  assert.equal(seen.length, 3); // the first attempt and two retries
});

test("other errors are not retried and keep the server's detail", async () => {
  const invalid = [
    { loc: ["body", "budget_tokens"], msg: "Input should be greater than or equal to 32", type: "x" },
    { loc: ["body", "query"], msg: "Field required", type: "missing" },
  ];
  const { url, seen } = await serve([
    reply(422, { detail: invalid }),
    html(404, "<html> not\n found </html>"),
  ]);
  const client = new MemoryClient({ baseUrl: url });
  await assert.rejects(client.retrieve({ user_id: "u1", query: "x", budget_tokens: 1 }), (error: unknown) => {
    assert.ok(error instanceof MemstreamError);
    assert.equal(error.status, 422);
    assert.deepEqual(error.detail, invalid);
    assert.equal(
      error.reason,
      "budget_tokens: Input should be greater than or equal to 32; query: Field required",
    );
    return true;
  });
  await assert.rejects(client.get("u/1", "m 1"), {
    name: "MemstreamError",
    status: 404,
    reason: "<html> not found </html>",
  });
  assert.deepEqual(
    seen.map((s) => s.path),
    ["/v1/retrieve", "/v1/memories/m%201?user_id=u%2F1"],
  );
});

test("connection failures and timeouts are retried, then surface as MemstreamConnectionError", async () => {
  const hangUp: Answer = (response) => response.socket?.destroy();
  const slow: Answer = (response) => setTimeout(() => reply(200, OK)(response), 500);
  const { url, seen } = await serve([hangUp, slow]);
  const client = new MemoryClient({ baseUrl: url, timeoutMs: 100, backoffMs: 1 });
  assert.equal((await client.retrieve({ user_id: "u1", query: "x" })).took_ms, 1.0);
  assert.equal(seen.length, 3);

  const slowly = await serve([], slow);
  const impatient = new MemoryClient({ baseUrl: slowly.url, timeoutMs: 50, retries: 1, backoffMs: 1 });
  await assert.rejects(impatient.forget("u1"), { name: "MemstreamConnectionError", timedOut: true });
  assert.equal(slowly.seen.length, 2);

  const gone = await serve([]);
  servers.pop()?.close(); // nothing listens on its port any more
  const nobody = new MemoryClient({ baseUrl: gone.url, retries: 1, backoffMs: 1 });
  await assert.rejects(nobody.memories("u1"), (error: unknown) => {
    assert.ok(error instanceof MemstreamConnectionError);
    assert.equal(error.timedOut, false);
    assert.match(error.message, /ECONNREFUSED/);
    return true;
  });
});

test("memories sends its page query, only what was given", async () => {
  const page = { memories: [], next_offset: null };
  const { url, seen } = await serve([reply(200, page), reply(200, page)]);
  const client = new MemoryClient({ baseUrl: `${url}/` });
  assert.deepEqual(await client.memories("ana ü"), page);
  await client.memories("ana", { limit: 5, offset: "abc" });
  assert.deepEqual(
    seen.map((s) => [s.path, s.authorization]),
    [
      ["/v1/users/ana%20%C3%BC/memories", undefined],
      ["/v1/users/ana/memories?limit=5&offset=abc", undefined],
    ],
  );
});
