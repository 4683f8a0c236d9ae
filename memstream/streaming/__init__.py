"""The streaming runtime between the adapters and the stages: the broker plumbing (``broker``:
the faust app, topics, the RPC's producer, group lag) and the stage loops (``stage``: decode,
retries, dead letters, metrics; per-message, batched and periodic). A stage in ``streams/``
or ``workers/`` is a handler run on one of these loops, declared as a ``services.StageSpec``
and started from ``services.Services``; ``params`` builds the engine's parameters from the
settings and ``locks`` holds the consolidate role's per-user locks."""
