// The retry rules of the Python client (memstream/client/_client.py), the same numbers.
//
// Every call is safe to retry: `add` gives each event its id before the first attempt (the
// pipeline drops an id it has seen), the others read or delete. Connection failures,
// timeouts and 429 / 502 / 503 / 504 are retried, at most `retries` times: after the
// server's `Retry-After-Ms` / `Retry-After` when it sends one (capped at
// `maxRetryAfterMs`), else after an exponential backoff, both jittered up by as much as
// half so that refused callers do not come back together.

export const RETRY_STATUSES: ReadonlySet<number> = new Set([429, 502, 503, 504]);
export const MAX_RETRY_AFTER_MS = 5000;

/**
 * Milliseconds to wait before attempt `attempt + 1`: the server's hint when it gave one
 * (`Retry-After-Ms`, else `Retry-After` in seconds; capped at `capMs`), else
 * `backoffMs * 2 ** attempt`; then up to half of it again at random (never less than the
 * hint: honouring it is the point). `headers` is null after a connection failure.
 */
export function retryDelayMs(
  attempt: number,
  headers: Headers | null,
  backoffMs: number,
  capMs: number,
  random: () => number = Math.random,
): number {
  let base = backoffMs * 2 ** attempt;
  const hint = headers === null ? null : retryAfterMs(headers);
  if (hint !== null) {
    base = Math.min(hint, capMs);
  }
  return base * (1 + 0.5 * random());
}

function retryAfterMs(headers: Headers): number | null {
  for (const [name, scale] of [
    ["retry-after-ms", 1],
    ["retry-after", 1000],
  ] as const) {
    const value = headers.get(name)?.trim();
    if (value === undefined || value === "") continue;
    const ms = Number(value) * scale;
    // NaN: an HTTP date, never sent by memstream; fall back to the backoff.
    if (ms >= 0) return ms;
  }
  return null;
}
