export {
  MemoryClient,
  MemstreamConnectionError,
  MemstreamError,
  detailText,
  type AddEventsResponse,
  type ConsolidatedMemory,
  type EventIn,
  type EventMetadata,
  type ForgetResponse,
  type MemoriesQuery,
  type MemoryClientOptions,
  type MemoryPage,
  type RetrieveRequest,
  type RetrieveResponse,
  type RetrievedItem,
} from "./client.js";
export { MAX_RETRY_AFTER_MS, RETRY_STATUSES, retryDelayMs } from "./retry.js";
export type { components, paths } from "./openapi.js";
