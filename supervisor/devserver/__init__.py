"""Spooled-compatible development server: the Spooled REST API served from SQLite.

Modules, one concern each:
  cli      -- flags / environment, start-up and signal handling
  app      -- routing, auth, error envelopes, fault hook
  transport -- HTTP/1.1: httptools framing on one I/O thread, handler pool, limits and timeouts
  handlers -- one function per route: validate the request, call the store
  validate -- request-body validation producing the real server's error shapes
  errors   -- HttpError and the JSON error envelopes ({code, message})
  store    -- every SQL statement and transaction (SQLite, WAL)
  sweeps   -- background lease recovery and stale-worker reaper
  faults   -- fault injection and per-org rate limiting
  grpc_server -- Spooled's gRPC API (--grpc-port) over the same store; stubs in supervisor.proto
  devtools -- dev-only routes: lose a lease on demand, the request log
"""
