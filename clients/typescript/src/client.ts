// The TypeScript client bots import: `new MemoryClient({ baseUrl, apiKey }).retrieve(...)`.
//
// The same verbs, endpoints and retry rules as the Python MemoryClient (memstream/client/_client.py);
// the bodies are the types generated from docs/openapi.json (src/openapi.ts, checked for
// drift by `npm run check-types`). Node's built-in fetch, no runtime dependency.

import { randomUUID } from "node:crypto";

import type { components, paths } from "./openapi.js";
import { MAX_RETRY_AFTER_MS, RETRY_STATUSES, retryDelayMs } from "./retry.js";

type Schemas = components["schemas"];
export type EventIn = Schemas["EventIn"];
export type EventMetadata = Schemas["EventMetadata"];
export type AddEventsResponse = Schemas["AddEventsResponse"];
export type RetrieveRequest = Schemas["RetrieveRequest"];
export type RetrieveResponse = Schemas["RetrieveResponse"];
export type RetrievedItem = Schemas["RetrievedItem"];
export type MemoryPage = Schemas["MemoryPage"];
export type ConsolidatedMemory = Schemas["ConsolidatedMemory"];
export type ForgetResponse = Schemas["ForgetResponse"];
/** `limit` (1-200, 20 by default) and `offset` (a page's `next_offset`). */
export type MemoriesQuery = NonNullable<paths["/v1/users/{user_id}/memories"]["get"]["parameters"]["query"]>;

export interface MemoryClientOptions {
  /** Where memstream answers; `http://127.0.0.1:8080` by default. */
  baseUrl?: string;
  /** Sent as `Authorization: Bearer <apiKey>`; the key decides the tenant. */
  apiKey?: string;
  /** Per attempt, the whole answer included; 5000 by default. */
  timeoutMs?: number;
  /** Attempts after the first one; 2 by default. */
  retries?: number;
  /** Backoff before retry n (from 0) when the server gave no hint: backoffMs * 2 ** n. */
  backoffMs?: number;
  /** The most a server's Retry-After(-Ms) hint is waited; 5000 by default. */
  maxRetryAfterMs?: number;
}

/** The service answered with an error: its status and its `detail`. */
export class MemstreamError extends Error {
  override readonly name = "MemstreamError";
  /** The detail as one short line (a 422's field errors flattened). */
  readonly reason: string;

  constructor(
    readonly status: number,
    readonly detail: unknown,
  ) {
    const reason = detailText(detail);
    super(`memstream answered ${status}: ${reason}`);
    this.reason = reason;
  }
}

/** No answer, after every retry: the connection failed or the timeout passed. */
export class MemstreamConnectionError extends Error {
  override readonly name = "MemstreamConnectionError";

  constructor(
    readonly url: string,
    readonly timedOut: boolean,
    cause: unknown,
  ) {
    super(`memstream at ${url}: ${timedOut ? "no answer in time" : messages(cause)}`, { cause });
  }
}

export class MemoryClient {
  readonly baseUrl: string;
  readonly retries: number;
  readonly timeoutMs: number;
  readonly backoffMs: number;
  readonly maxRetryAfterMs: number;
  readonly #apiKey: string;

  constructor(options: MemoryClientOptions = {}) {
    this.baseUrl = (options.baseUrl ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
    this.#apiKey = options.apiKey ?? "";
    this.timeoutMs = options.timeoutMs ?? 5000;
    this.retries = options.retries ?? 2;
    this.backoffMs = options.backoffMs ?? 100;
    this.maxRetryAfterMs = options.maxRetryAfterMs ?? MAX_RETRY_AFTER_MS;
  }

  /** Publish turns (202: accepted, retrievable a moment later). Each event without an
   * `event_id` gets one before the first attempt, so a retry never stores a turn twice;
   * the answer's `event_ids` are the ids to pass as `after_event_id`. */
  add(events: EventIn | readonly EventIn[]): Promise<AddEventsResponse> {
    const list = Array.isArray(events) ? events : [events as EventIn];
    const withIds = list.map((event) => ({ ...event, event_id: event.event_id || newId() }));
    return this.#send("POST", route("/v1/events"), { body: { events: withIds } });
  }

  /** The context for a reply. `after_event_id` reads your own writes: the server waits
   * (at most ~2 s) until that event is memorized and says so in `after_event_memorized`. */
  retrieve(request: RetrieveRequest): Promise<RetrieveResponse> {
    return this.#send("POST", route("/v1/retrieve"), { body: request });
  }

  /** `retrieve` by the name mem0 users know. */
  search(request: RetrieveRequest): Promise<RetrieveResponse> {
    return this.retrieve(request);
  }

  /** The user's consolidated memories, a page at a time (pass `next_offset` as `offset`). */
  memories(userId: string, query: MemoriesQuery = {}): Promise<MemoryPage> {
    const path = route("/v1/users/{user_id}/memories", { user_id: userId });
    return this.#send("GET", path, { query });
  }

  /** One memory with its history; a 404 MemstreamError unless it is this user's. */
  get(userId: string, memoryId: string): Promise<ConsolidatedMemory> {
    const path = route("/v1/memories/{memory_id}", { memory_id: memoryId });
    return this.#send("GET", path, { query: { user_id: userId } });
  }

  /** Forget the user everywhere (Redis, Qdrant, in-flight events); twice is harmless. */
  forget(userId: string): Promise<ForgetResponse> {
    return this.#send("DELETE", route("/v1/users/{user_id}", { user_id: userId }));
  }

  async #send<T>(
    method: string,
    path: string,
    { body, query }: { body?: unknown; query?: Record<string, unknown> } = {},
  ): Promise<T> {
    const url = this.baseUrl + path + queryString(query);
    const headers: Record<string, string> = { Accept: "application/json" };
    if (this.#apiKey) headers["Authorization"] = `Bearer ${this.#apiKey}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const payload = body === undefined ? undefined : JSON.stringify(body);
    for (let attempt = 0; ; attempt++) {
      const last = attempt >= this.retries;
      let answer: { status: number; headers: Headers; text: string } | null = null;
      try {
        const response = await fetch(url, {
          method,
          headers,
          body: payload,
          signal: AbortSignal.timeout(this.timeoutMs),
        });
        answer = { status: response.status, headers: response.headers, text: await response.text() };
      } catch (error) {
        if (last) {
          const timedOut = error instanceof Error && error.name === "TimeoutError";
          throw new MemstreamConnectionError(url, timedOut, error);
        }
      }
      if (answer !== null && (!RETRY_STATUSES.has(answer.status) || last)) {
        return parse<T>(answer.status, answer.text);
      }
      const delay = retryDelayMs(attempt, answer?.headers ?? null, this.backoffMs, this.maxRetryAfterMs);
      await new Promise((resolve) => setTimeout(resolve, delay));
    }
  }
}

function parse<T>(status: number, text: string): T {
  if (status < 400) return JSON.parse(text) as T;
  let detail: unknown = text;
  try {
    const body: unknown = JSON.parse(text);
    if (typeof body === "object" && body !== null && "detail" in body) detail = body.detail;
  } catch {
    // not JSON (a proxy's error page): the text itself
  }
  throw new MemstreamError(status, detail);
}

/** A server's `detail` as one line: FastAPI's 422 list becomes `field: message; ...`. */
export function detailText(detail: unknown, limit = 200): string {
  let text: string;
  if (Array.isArray(detail)) {
    const parts = detail
      .slice(0, 3)
      .filter((error): error is Record<string, unknown> => typeof error === "object" && error !== null)
      .map((error) => {
        const loc = Array.isArray(error["loc"]) ? error["loc"] : [];
        const where = loc.filter((part) => part !== "body").join(".");
        return where ? `${where}: ${String(error["msg"])}` : String(error["msg"]);
      });
    text = parts.join("; ") + (detail.length > 3 ? ` (+${detail.length - 3} more)` : "");
  } else {
    text = typeof detail === "object" && detail !== null ? JSON.stringify(detail) : String(detail);
  }
  const chars = Array.from(text.split(/\s+/).filter(Boolean).join(" "));
  return chars.length <= limit ? chars.join("") : chars.slice(0, limit - 1).join("") + "…";
}

/** A path of the OpenAPI document (a typo or a route gone from it fails `tsc`), with its
 * `{parameters}` filled in as single segments: a slash in an id never makes another route. */
function route(template: keyof paths, params: Record<string, string> = {}): string {
  return template.replace(/\{(\w+)\}/g, (_, name: string) => encodeURIComponent(params[name] ?? ""));
}

function queryString(query: Record<string, unknown> | undefined): string {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(query ?? {})) {
    if (value !== undefined && value !== null) search.set(name, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/** "fetch failed: connect ECONNREFUSED 127.0.0.1:8080": an error and its causes. */
function messages(error: unknown): string {
  const parts: string[] = [];
  for (let e = error; e !== undefined && e !== null && parts.length < 3;) {
    parts.push(e instanceof Error ? e.message : String(e));
    e = e instanceof Error ? e.cause : undefined;
  }
  return parts.join(": ");
}

function newId(): string {
  return randomUUID().replaceAll("-", "");
}
