"""Outgoing webhooks: CRUD, `test`, delivery history and retry, and real HTTP deliveries to the URL.

Routes (the real server's shapes):
  GET/POST /api/v1/outgoing-webhooks              list / create {name, url, events, secret?, enabled?, format?}
  GET/PUT/DELETE /api/v1/outgoing-webhooks/{id}   read / partial update (`"secret": null` clears it) / delete
  POST /api/v1/outgoing-webhooks/{id}/test        one signed `webhook.test` POST now; its outcome
  GET  /api/v1/outgoing-webhooks/{id}/deliveries  the newest 100 deliveries
  POST /api/v1/outgoing-webhooks/{id}/retry/{delivery_id}  send a delivery again (not a successful one,
                                                  not past MAX_TOTAL_ATTEMPTS)

Contract:
- `Webhooks.on_fact` is a Store listener: each committed change listed here (job.created,
  job.started, job.completed, job.failed when dead-lettered, job.cancelled, queue.paused, queue.resumed,
  worker.registered, worker.deregistered, and schedule.triggered through `Store.publish`) becomes one
  delivery row per enabled webhook of the organization subscribed to it; a job's own
  `completion_webhook` gets job.completed / job.failed the same way. An organization without webhooks
  costs one dict lookup per change.
- The body is `{"id", "event", "created_at", "data"}`; headers `Content-Type: application/json`,
  `X-Spooled-Event`, `X-Spooled-Timestamp` (Unix seconds), `X-Spooled-Delivery-Attempt` and, with a
  secret, `X-Spooled-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`.
- One sender thread (started at the first delivery) hands due deliveries to SENDERS threads; the API
  never waits on a delivery. Each attempt has `timeout` seconds in all (connect at most CONNECT_TIMEOUT);
  a non-2xx answer, a refusal or a timeout is recorded on the row and retried after backoff * 2^(n-1)
  seconds, MAX_ATTEMPTS attempts in all; then the webhook's `failure_count` grows by one, and at
  AUTO_DISABLE failed deliveries in a row it is disabled (`last_status` "auto_disabled"). Idle, the
  sender wakes once a minute at most.
- The dev server delivers to loopback and private addresses on purpose (a receiver on the developer's
  machine or network); the real server refuses them as SSRF.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import ssl
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from supervisor import exactjson

from .errors import HttpError, invalid_type, missing_field, not_found, validation
from .handlers import I64, body, query_int
from .keys_store import require_unrestricted
from .store import _frag, dumps, ts
from .validate import check_url

SCHEMA = """
CREATE TABLE IF NOT EXISTS outgoing_webhooks(
  id TEXT PRIMARY KEY, organization_id TEXT NOT NULL, name TEXT NOT NULL, url TEXT NOT NULL, secret TEXT,
  events TEXT NOT NULL, enabled INTEGER NOT NULL, format TEXT NOT NULL DEFAULT 'json',
  failure_count INTEGER NOT NULL DEFAULT 0, last_triggered_at REAL, last_status TEXT, created_at REAL NOT NULL,
  updated_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS outgoing_webhooks_org ON outgoing_webhooks(organization_id, created_at);
CREATE TABLE IF NOT EXISTS outgoing_webhook_deliveries(
  id TEXT PRIMARY KEY, organization_id TEXT NOT NULL, webhook_id TEXT, url TEXT, secret TEXT, event TEXT NOT NULL,
  payload TEXT NOT NULL, status TEXT NOT NULL, status_code INTEGER, response_body TEXT, error TEXT,
  attempts INTEGER NOT NULL DEFAULT 0, retries_left INTEGER NOT NULL DEFAULT 0, next_attempt_at REAL,
  created_at REAL NOT NULL, delivered_at REAL);
CREATE INDEX IF NOT EXISTS webhook_deliveries_of ON outgoing_webhook_deliveries(webhook_id, created_at);
CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON outgoing_webhook_deliveries(next_attempt_at)
  WHERE next_attempt_at IS NOT NULL;
"""

EVENTS = ("job.created", "job.started", "job.completed", "job.failed", "job.cancelled", "queue.paused",
          "queue.resumed", "worker.registered", "worker.deregistered", "schedule.triggered")
FORMATS = ("json", "slack", "discord", "teams")
MAX_ATTEMPTS = 5  # automatic attempts per delivery (OUTGOING_WEBHOOK_MAX_ATTEMPTS)
MAX_TOTAL_ATTEMPTS = 10  # a manual retry is refused past this many attempts
AUTO_DISABLE = 20  # failed deliveries in a row that disable a webhook
SENDERS = 4  # deliveries in flight at once
CONNECT_TIMEOUT = 5.0
MAX_RESPONSE = 64 * 1024  # bytes of an answer read; 500 characters of it are kept
IDLE_WAKE = 60.0  # seconds the sender sleeps at most with nothing due
USER_AGENT = "Spooled-OutgoingWebhook/1.0"
_COLS = ("id", "organization_id", "name", "url", "events", "enabled", "format", "failure_count",
         "last_triggered_at", "last_status", "created_at", "updated_at")
_DELIVERY_COLS = ("id", "webhook_id", "event", "payload", "status", "status_code", "response_body", "error",
                  "attempts", "created_at", "delivered_at")


# ---------- signing and sending (no I/O decisions) ----------
def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-Spooled-Signature` value: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def backoff_delay(attempts: int, base: float) -> float:
    """Seconds before the next automatic attempt after `attempts` failed ones."""
    return base * 2 ** max(0, attempts - 1)


def post(url: str, payload: bytes, headers: dict, timeout: float) -> tuple[int, bytes]:
    """POST `payload` to `url` within `timeout` seconds in all; (status, first MAX_RESPONSE bytes of the
    body). Raises OSError (refused, reset, timed out) or ValueError (not HTTP)."""
    u = urlsplit(url)
    https = u.scheme == "https"
    host, port = u.hostname or "", u.port or (443 if https else 80)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    if u.scheme not in ("http", "https") or any(c <= " " or c == "\x7f" for c in url + path + u.netloc):
        raise ValueError("not an http(s) URL without spaces or control characters")  # never a forged request
    deadline = time.monotonic() + timeout

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise TimeoutError("timed out")
        return rest

    sock = socket.create_connection((host, port), timeout=min(CONNECT_TIMEOUT, timeout))
    try:
        if https:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        lines = [f"POST {path} HTTP/1.1", f"Host: {u.netloc.rpartition('@')[2]}", f"Content-Length: {len(payload)}",
                 "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
        sock.settimeout(left())
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
        data = b""
        while len(data) < MAX_RESPONSE:
            sock.settimeout(left())
            more = sock.recv(65536)
            if not more:
                break
            data += more
            head, sep, rest = data.partition(b"\r\n\r\n")
            if sep and _complete(head, rest):
                break
    finally:
        sock.close()
    status_line = data.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/") or not status_line[1].isdigit():
        raise ValueError("not an HTTP answer")
    return int(status_line[1]), data.partition(b"\r\n\r\n")[2][:MAX_RESPONSE]


def _complete(head: bytes, rest: bytes) -> bool:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(rest) >= int(value.strip())
    return False


def _kept(text: bytes) -> str:
    s = text.decode("utf-8", "replace")[:500]
    return "".join(c for c in s if c.isprintable() or c in "\n\r\t")


# ---------- validation ----------
def _check_events(events) -> str:
    if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
        raise invalid_type("events", "an array of strings")
    if not events:
        raise validation("events", "must contain at least 1 item", "length")
    for e in events:
        if e not in EVENTS:
            raise validation("events", f"Invalid event type: '{e}'. Valid types: {list(EVENTS)}", "invalid_event")
    return dumps(events)


def parse(req, update: bool) -> dict:
    """The fields of a create (all required but secret, enabled, format) or an update (all optional; an
    explicit `"secret": null` clears the secret)."""
    b = body(req)
    out: dict = {}
    for name, lo, hi in (("name", 1, 255), ("url", 1, 2048)):
        if not update and b.d.get(name) is None:
            raise missing_field(name)
        v = b.str(name, False, lo, 10**6)
        if v is not None:
            if len(v) > hi:
                raise validation(name, f"length must be between {lo} and {hi}", "length")
            out[name] = check_url(v) if name == "url" else v
    if "events" in b.d and b.d["events"] is not None:
        out["events"] = _check_events(b.d["events"])
    elif not update:
        raise missing_field("events")
    if "secret" in b.d:
        out["secret"] = b.str("secret", False, 0, 255)
    enabled = b.bool("enabled")
    if enabled is not None:
        out["enabled"] = int(enabled)
    elif not update:
        out["enabled"] = 1
    fmt = b.str("format", False, 0, 20)
    if fmt is not None:
        if fmt not in FORMATS:
            raise invalid_type("format", "one of json, slack, discord, teams")
        out["format"] = fmt
    return out


def webhook_dict(row) -> dict:
    w = dict(zip(_COLS, row, strict=True))
    return {"id": w["id"], "organization_id": w["organization_id"], "name": w["name"], "url": w["url"],
            "events": _frag(w["events"]), "format": w["format"], "enabled": bool(w["enabled"]),
            "failure_count": w["failure_count"], "last_triggered_at": ts(w["last_triggered_at"]),
            "last_status": w["last_status"], "created_at": ts(w["created_at"]), "updated_at": ts(w["updated_at"])}


def delivery_dict(row) -> dict:
    d = dict(zip(_DELIVERY_COLS, row, strict=True))
    d["payload"] = _frag(d["payload"])
    d["created_at"], d["delivered_at"] = ts(d["created_at"]), ts(d["delivered_at"])
    return d


def _webhook_data(fact: str, d: dict) -> tuple[str, dict] | None:
    """The (event, data) an organization's webhooks get for one Store fact, as the real server sends them."""
    if fact == "job.created":
        data = {"job_id": d["job_id"], "queue_name": d["queue_name"], "priority": d["priority"], "status": d["status"]}
        if d.get("workflow_id"):
            data["workflow_id"] = d["workflow_id"]
        return fact, data
    if fact == "job.started":
        return fact, {"job_id": d["job_id"], "queue_name": d["queue_name"], "worker_id": d["worker_id"]}
    if fact == "job.completed":
        return fact, {"job_id": d["job_id"], "queue_name": d["queue_name"], "status": "completed",
                      "result": _frag(d["result"])}
    if fact == "job.failed":
        if d["new_status"] not in ("failed", "deadletter"):
            return None  # a retry stays pending: no webhook, as on the real server
        return fact, {"job_id": d["job_id"], "queue_name": d["queue_name"], "status": d["new_status"],
                      "error": d["error"]}
    if fact == "job.cancelled":
        return fact, {"job_id": d["job_id"], "queue_name": d["queue_name"], "status": "cancelled",
                      "old_status": d["old_status"]}
    if fact in ("queue.paused", "queue.resumed", "worker.registered", "worker.deregistered", "schedule.triggered"):
        return fact, dict(d)
    return None


class Webhooks:
    """The organization's webhooks (cached per organization for the hot path) and the delivery sender."""

    def __init__(self, store, timeout: float = 10.0, backoff: float = 1.0):
        self.store, self.timeout, self.backoff = store, timeout, backoff
        with store._tx() as db:
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    db.execute(stmt)
        self._lock = threading.Lock()
        self._subscribed: dict[str, list[tuple[str, frozenset]]] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._active: set[str] = set()  # deliveries being attempted now (under _lock)
        self.refresh()
        if store._read("SELECT 1 FROM outgoing_webhook_deliveries WHERE next_attempt_at IS NOT NULL LIMIT 1"):
            self._start()

    def refresh(self) -> None:
        """Reload which webhooks each organization has enabled (after any change to them)."""
        subscribed: dict[str, list[tuple[str, frozenset]]] = {}
        for wid, org, events in self.store._read("SELECT id, organization_id, events FROM outgoing_webhooks "
                                                 "WHERE enabled=1"):
            subscribed.setdefault(org, []).append((wid, frozenset(exactjson.loads(events))))
        with self._lock:
            self._subscribed = subscribed

    # ---- facts in ----
    def on_fact(self, org: str, fact: str, d: dict) -> None:
        hooks = self._subscribed.get(org)
        hook_url = d.get("completion_webhook") if fact in ("job.completed", "job.failed") else None
        if not hooks and not hook_url:
            return
        made = _webhook_data(fact, d)
        if made is None:
            return
        event, data = made
        targets = [wid for wid, events in hooks or () if event in events]
        if not targets and not hook_url:
            return
        now = time.time()
        rows: list[tuple[str | None, str | None, str | None]] = [(wid, None, None) for wid in targets]
        if hook_url:
            rows.append((None, hook_url, d.get("completion_webhook_secret") or None))
        with self.store._tx() as db:
            for wid, url, secret in rows:
                did = str(uuid.uuid4())
                envelope = dumps({"id": did, "event": event, "created_at": ts(now), "data": data})
                db.execute("INSERT INTO outgoing_webhook_deliveries (id, organization_id, webhook_id, url, secret, "
                           "event, payload, status, attempts, retries_left, next_attempt_at, created_at) "
                           "VALUES (?,?,?,?,?,?,?,'pending',0,?,?,?)",
                           (did, org, wid, url, secret, event, envelope, MAX_ATTEMPTS - 1, now, now))
        self._start()
        self._wake.set()

    # ---- the sender ----
    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._pool = ThreadPoolExecutor(SENDERS, thread_name_prefix="devserver-webhook")
                self._thread = threading.Thread(target=self._run, name="devserver-webhooks", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self.store.closed:
            try:
                wait = self._dispatch_due()
            except Exception as e:  # a busy or closing database must not end the sender
                if self.store.closed:
                    return
                print(f"warning: webhook sender: {e!r}", file=sys.stderr, flush=True)
                wait = 1.0
            self._wake.wait(wait)
            self._wake.clear()

    def _dispatch_due(self) -> float:
        """Hand due deliveries to the pool (each leased for its attempt); seconds until the next is due. A
        delivery still being attempted is never handed out again, even when a slow attempt (a DNS lookup
        is not bounded by the timeout) outlives its lease."""
        now = time.time()
        with self._lock:
            active = set(self._active)
        free = SENDERS - len(active)
        if free > 0:
            with self.store._tx() as db:
                rows = db.execute("SELECT id FROM outgoing_webhook_deliveries WHERE next_attempt_at <= ? "
                                  "ORDER BY next_attempt_at LIMIT ?", (now, free + len(active))).fetchall()
                due = [r[0] for r in rows if r[0] not in active][:free]
                for did in due:  # leased: a restart mid-attempt sends it again once the lease passes
                    db.execute("UPDATE outgoing_webhook_deliveries SET next_attempt_at=? WHERE id=?",
                               (now + self.timeout + 5, did))
            for did in due:
                with self._lock:
                    self._active.add(did)
                assert self._pool is not None
                self._pool.submit(self._attempt_safely, did)
        with self._lock:
            active = set(self._active)
        if len(active) >= SENDERS:
            return IDLE_WAKE  # a finishing attempt wakes the sender
        marks = ",".join("?" * len(active))  # one being attempted is waited for by its end, not its lease
        (nxt,) = self.store._read("SELECT min(next_attempt_at) FROM outgoing_webhook_deliveries"
                                  + (f" WHERE id NOT IN ({marks})" if active else ""), tuple(sorted(active)))[0]
        return IDLE_WAKE if nxt is None else min(IDLE_WAKE, max(0.0, nxt - time.time()))

    def _attempt_safely(self, did: str) -> None:
        try:
            self.attempt(did)
        except Exception as e:
            if not self.store.closed:
                print(f"warning: webhook delivery {did} failed: {e!r}", file=sys.stderr, flush=True)
        finally:
            with self._lock:
                self._active.discard(did)
            self._wake.set()

    def attempt(self, did: str) -> None:
        """Send one delivery once and record the outcome (the retry schedule, the webhook's counters)."""
        rows = self.store._read(
            "SELECT d.webhook_id, d.url, d.secret, d.event, d.payload, d.attempts, d.retries_left, w.url, w.secret "
            "FROM outgoing_webhook_deliveries d LEFT JOIN outgoing_webhooks w ON w.id = d.webhook_id WHERE d.id=?",
            (did,))
        if not rows:
            return
        wid, url, secret, event, payload, attempts, retries_left, w_url, w_secret = rows[0]
        if wid is not None:
            if w_url is None:  # the webhook was deleted meanwhile
                self._record(did, None, attempts, "failed", None, None, "Webhook deleted", None)
                return
            url, secret = w_url, w_secret
        attempt = attempts + 1
        stamp = int(time.time())
        body_bytes = payload.encode()
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "X-Spooled-Event": event,
                   "X-Spooled-Timestamp": str(stamp), "X-Spooled-Delivery-Attempt": str(attempt)}
        if secret:
            headers["X-Spooled-Signature"] = sign(secret, stamp, body_bytes)
        try:
            status, answer = post(url, body_bytes, headers, self.timeout)
            ok, code, kept, error = 200 <= status < 300, status, _kept(answer), None
            if not ok:
                error = f"HTTP {status}"
        except (OSError, ValueError) as e:
            ok, code, kept, error = False, None, None, f"Request failed: {e}"[:300]
        now = time.time()
        nxt = None if ok or retries_left <= 0 else now + backoff_delay(attempt, self.backoff)
        self._record(did, wid, attempt, "success" if ok else "failed", code, kept, error, nxt,
                     retries_left=max(0, retries_left - 1) if not ok else retries_left, ended=ok or nxt is None)

    def _record(self, did, wid, attempts, status, code, kept, error, nxt, retries_left=0, ended=True) -> None:
        now = time.time()
        with self.store._tx() as db:
            db.execute("UPDATE outgoing_webhook_deliveries SET status=?, status_code=?, response_body=?, error=?, "
                       "attempts=?, retries_left=?, next_attempt_at=?, delivered_at=CASE WHEN ?='success' THEN ? "
                       "ELSE delivered_at END WHERE id=?",
                       (status, code, kept, error, attempts, retries_left, nxt, status, now, did))
            if wid is None:
                return
            if status == "success":
                db.execute("UPDATE outgoing_webhooks SET last_triggered_at=?, last_status='success', failure_count=0, "
                           "updated_at=? WHERE id=?", (now, now, wid))
            elif ended:
                db.execute("UPDATE outgoing_webhooks SET last_triggered_at=?, last_status=CASE WHEN failure_count+1>=? "
                           "THEN 'auto_disabled' ELSE 'failed' END, enabled=CASE WHEN failure_count+1>=? THEN 0 "
                           "ELSE enabled END, failure_count=failure_count+1, updated_at=? WHERE id=?",
                           (now, AUTO_DISABLE, AUTO_DISABLE, now, wid))
            else:
                db.execute("UPDATE outgoing_webhooks SET last_triggered_at=?, last_status='failed' WHERE id=?",
                           (now, wid))
        if status != "success" and ended and wid is not None:
            self.refresh()

    # ---- the routes' transactions ----
    def _get(self, db, org: str, wid: str):
        row = db.execute("SELECT " + ", ".join(_COLS) + ", secret FROM outgoing_webhooks WHERE id=? AND "
                         "organization_id=?", (wid, org)).fetchone()
        if row is None:
            raise not_found(f"Webhook {wid} not found")
        return row

    def create(self, org: str, f: dict) -> dict:
        now = time.time()
        wid = str(uuid.uuid4())
        with self.store._tx() as db:
            db.execute("INSERT INTO outgoing_webhooks (id, organization_id, name, url, secret, events, enabled, "
                       "format, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                       (wid, org, f["name"], f["url"], f.get("secret"), f["events"], f["enabled"],
                        f.get("format", "json"), now, now))
            out = webhook_dict(self._get(db, org, wid)[:-1])
        self.refresh()
        return out

    def all(self, org: str) -> list[dict]:
        rows = self.store._read("SELECT " + ", ".join(_COLS) + " FROM outgoing_webhooks WHERE organization_id=? "
                                "ORDER BY created_at DESC", (org,))
        return [webhook_dict(r) for r in rows]

    def get(self, org: str, wid: str) -> dict:
        with self.store._lock:
            return webhook_dict(self._get(self.store._db, org, wid)[:-1])

    def update(self, org: str, wid: str, f: dict) -> dict:
        now = time.time()
        with self.store._tx() as db:
            self._get(db, org, wid)
            for col, val in f.items():
                db.execute(f"UPDATE outgoing_webhooks SET {col}=?, updated_at=? WHERE id=?", (val, now, wid))
            out = webhook_dict(self._get(db, org, wid)[:-1])
        self.refresh()
        return out

    def delete(self, org: str, wid: str) -> None:
        with self.store._tx() as db:
            if db.execute("DELETE FROM outgoing_webhooks WHERE id=? AND organization_id=?", (wid, org)).rowcount == 0:
                raise not_found(f"Webhook {wid} not found")
            db.execute("DELETE FROM outgoing_webhook_deliveries WHERE webhook_id=? AND next_attempt_at IS NULL",
                       (wid,))
        self.refresh()

    def test(self, org: str, wid: str) -> dict:
        """One signed `webhook.test` POST now (this request waits for it, as on the real server; no other does)."""
        with self.store._lock:
            row = self._get(self.store._db, org, wid)
        url, secret = row[3], row[-1]
        stamp = int(time.time())
        payload = dumps({"event": "webhook.test", "webhook_id": wid, "organization_id": org, "timestamp": ts(stamp),
                         "test": True, "message": "This is a test webhook from Spooled Cloud"}).encode()
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "X-Spooled-Event": "webhook.test",
                   "X-Spooled-Timestamp": str(stamp), "X-Spooled-Delivery-Attempt": "1"}
        if secret:
            headers["X-Spooled-Signature"] = sign(secret, stamp, payload)
        started = time.monotonic()
        try:
            status, _ = post(url, payload, headers, self.timeout)
        except (OSError, ValueError):
            return {"success": False, "status_code": None, "response_time_ms": int((time.monotonic() - started) * 1000),
                    "error": "Request failed"}
        ok = 200 <= status < 300
        return {"success": ok, "status_code": status, "response_time_ms": int((time.monotonic() - started) * 1000),
                "error": None if ok else f"HTTP {status}"}

    def deliveries(self, org: str, wid: str, status: str | None, limit: int, offset: int) -> list[dict]:
        with self.store._lock:
            self._get(self.store._db, org, wid)
        sql = "SELECT " + ", ".join(_DELIVERY_COLS) + " FROM outgoing_webhook_deliveries WHERE webhook_id=?"
        args: list = [wid]
        if status:
            sql += " AND status=?"
            args.append(status)
        rows = self.store._read(sql + " ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?", [*args, limit, offset])
        return [delivery_dict(r) for r in rows]

    def retry(self, org: str, wid: str, did: str) -> dict:
        with self.store._tx() as db:
            self._get(db, org, wid)
            row = db.execute("SELECT status, attempts FROM outgoing_webhook_deliveries WHERE id=? AND webhook_id=?",
                             (did, wid)).fetchone()
            if row is None:
                raise not_found(f"Delivery {did} not found")
            if row[0] == "success":
                raise HttpError(400, "BAD_REQUEST", "Cannot retry a successful delivery")
            if row[1] >= MAX_TOTAL_ATTEMPTS:
                raise HttpError(400, "BAD_REQUEST", f"Maximum retry attempts ({MAX_TOTAL_ATTEMPTS}) exceeded")
            db.execute("UPDATE outgoing_webhook_deliveries SET status='pending', error=NULL, retries_left=0, "
                       "next_attempt_at=? WHERE id=?", (time.time(), did))
        self._start()
        self._wake.set()
        return {"success": True, "message": "Retry initiated"}


# ---------- handlers ----------
def _manage(req) -> None:
    """Every webhook route needs an unrestricted key, as on the real server: a webhook sees every queue."""
    require_unrestricted(req, "manage outgoing webhooks")


def list_route(app, req):
    _manage(req)
    return 200, app.webhooks.all(req.org), None


def create_route(app, req):
    _manage(req)
    return 201, app.webhooks.create(req.org, parse(req, update=False)), None


def get_route(app, req):
    _manage(req)
    return 200, app.webhooks.get(req.org, req.params["id"]), None


def update_route(app, req):
    _manage(req)
    return 200, app.webhooks.update(req.org, req.params["id"], parse(req, update=True)), None


def delete_route(app, req):
    _manage(req)
    app.webhooks.delete(req.org, req.params["id"])
    return 204, None, None


def test_route(app, req):
    _manage(req)
    return 200, app.webhooks.test(req.org, req.params["id"]), None


def deliveries_route(app, req):
    _manage(req)
    status = (req.query.get("status") or [""])[-1]
    return 200, app.webhooks.deliveries(req.org, req.params["id"], status if status in ("pending", "success", "failed")
                                        else None, query_int(req, "limit", 100, 1, 100, I64),
                                        query_int(req, "offset", 0, 0, 10**9, I64)), None


def retry_route(app, req):
    _manage(req)
    return 200, app.webhooks.retry(req.org, req.params["id"], req.params["delivery_id"]), None


ROUTES = [
    ("GET", "/api/v1/outgoing-webhooks", list_route),
    ("POST", "/api/v1/outgoing-webhooks", create_route),
    ("GET", "/api/v1/outgoing-webhooks/{id}", get_route),
    ("PUT", "/api/v1/outgoing-webhooks/{id}", update_route),
    ("DELETE", "/api/v1/outgoing-webhooks/{id}", delete_route),
    ("POST", "/api/v1/outgoing-webhooks/{id}/test", test_route),
    ("GET", "/api/v1/outgoing-webhooks/{id}/deliveries", deliveries_route),
    ("POST", "/api/v1/outgoing-webhooks/{id}/retry/{delivery_id}", retry_route),
]
