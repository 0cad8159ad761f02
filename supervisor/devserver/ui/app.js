// The dev server's UI: plain JS, no build step, nothing fetched from elsewhere. Every text from the server is
// set with textContent (never parsed as HTML); the key lives in this tab's sessionStorage and goes with every
// request as `Authorization: Bearer`, and on the events stream (an EventSource sends no header) as ?token=.
"use strict";

const KEY = "spooled-dev-key";
const STATUSES = ["pending", "scheduled", "processing", "completed", "failed", "deadletter", "cancelled"];
// The realtime events that change what the UI shows, as the real server names them (a start, a retry, a
// dead-letter and a lost lease are all `job.status`); any of them refreshes the view.
const LIVE_EVENTS = ["job.created", "job.status", "job.completed", "job.failed", "worker.registered",
                     "worker.deregistered"];
const PAGE = 25;
const POLL_MS = 2000;  // while no events stream is open
const SLOW_POLL_MS = 10000;  // while one is (heartbeat ages, workers)

const state = { tab: "queues", jobId: null, offset: 0, source: null, live: false, timer: null, pending: false };

function $(id) { return document.getElementById(id); }

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function badge(status) { return el("span", status, "state " + String(status).replace(/[^a-z-]/g, "")); }

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell === null || cell === undefined ? "" : String(cell);
    tr.appendChild(td);
  }
  return tr;
}

function link(text, onclick) {
  const a = el("a", text);
  a.href = "#";
  a.addEventListener("click", (e) => { e.preventDefault(); onclick(); });
  return a;
}

function button(text, onclick) {
  const b = el("button", text);
  b.addEventListener("click", onclick);
  return b;
}

function show(text) { return typeof text === "string" ? text : JSON.stringify(text, null, 2); }

function when(iso) { return iso ? new Date(iso).toLocaleString() : ""; }

function epoch(t) { return t ? new Date(t * 1000).toLocaleString() : ""; }

function age(iso) {
  if (!iso) return "never";
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  return s < 90 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(0)} min ago`;
}

class Unauthorized extends Error {}

async function api(method, path, body) {
  const key = sessionStorage.getItem(KEY);
  if (!key) throw new Unauthorized("not signed in");
  const init = { method, headers: { "Authorization": "Bearer " + key } };
  if (body !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
  const resp = await fetch(path, init);
  if (resp.status === 401) throw new Unauthorized("wrong key");
  const data = resp.status === 204 ? null : await resp.json();
  if (!resp.ok) throw new Error(`${method} ${path}: ${resp.status} ${data && data.message}`);
  return { data, headers: resp.headers };
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

function spark(perMinute) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 150 24");
  const values = perMinute || [];
  const top = Math.max(1, ...values);
  values.forEach((v, i) => {
    const r = document.createElementNS(ns, "rect");
    const h = Math.round((v / top) * 22);
    r.setAttribute("x", String(i * 5)); r.setAttribute("width", "4");
    r.setAttribute("y", String(24 - h)); r.setAttribute("height", String(h));
    const title = document.createElementNS(ns, "title");
    title.textContent = `${v} jobs, ${values.length - i} min ago`;
    r.appendChild(title);
    svg.appendChild(r);
  });
  const total = values.reduce((a, b) => a + b, 0);
  const wrap = el("span");
  wrap.appendChild(svg);
  wrap.appendChild(el("span", ` ${total}`, "muted"));
  return wrap;
}

async function renderQueues() {
  const { data } = await api("GET", "/_dev/overview");
  const body = $("queues-body");
  clear(body);
  for (const q of data.queues) {
    const name = q.queue_name;
    const c = q.counts;
    const toggle = button(q.paused ? "Resume" : "Pause", async () => {
      await api("POST", `/api/v1/queues/${encodeURIComponent(name)}/${q.paused ? "resume" : "pause"}`, {});
      refresh();
    });
    body.appendChild(row([link(name, () => { $("jobs-queue").value = name; go("jobs"); }), c.pending, c.scheduled,
      c.processing, c.completed, c.failed, c.deadletter, badge(q.paused ? "paused" : "active"), spark(q.per_minute),
      toggle]));
  }
  $("queues-empty").hidden = data.queues.length > 0;
  const select = $("jobs-queue");
  const chosen = select.value;
  while (select.options.length > 1) select.remove(1);
  for (const q of data.queues) select.add(new Option(q.queue_name, q.queue_name));
  select.value = chosen;
}

async function renderJobs() {
  const params = new URLSearchParams({ limit: String(PAGE), offset: String(state.offset) });
  if ($("jobs-queue").value) params.set("queue_name", $("jobs-queue").value);
  if ($("jobs-status").value) params.set("status", $("jobs-status").value);
  const { data, headers } = await api("GET", "/api/v1/jobs?" + params);
  const body = $("jobs-body");
  clear(body);
  for (const j of data) {
    body.appendChild(row([link(j.id, () => openJob(j.id)), j.queue_name, badge(j.status), j.retry_count,
      when(j.created_at), (j.last_error || "").split("\n")[0]]));
  }
  $("jobs-page").textContent = `${state.offset + 1}-${state.offset + data.length}`;
  $("jobs-prev").disabled = state.offset === 0;
  $("jobs-next").disabled = headers.get("X-Has-More") !== "true";
}

async function renderJob() {
  const id = state.jobId;
  const [{ data: job }, { data: hist }] = await Promise.all([
    api("GET", `/api/v1/jobs/${encodeURIComponent(id)}`),
    api("GET", `/_dev/jobs/${encodeURIComponent(id)}/history`),
  ]);
  $("job-id").textContent = job.id;
  const status = $("job-status");
  status.textContent = job.status;
  status.className = "state " + job.status;
  const facts = $("job-facts");
  clear(facts);
  const items = [["Queue", job.queue_name], ["Attempts", `${job.retry_count} retries of ${job.max_retries}`],
    ["Priority", job.priority], ["Created", when(job.created_at)], ["Started", when(job.started_at)],
    ["Ended", when(job.completed_at)], ["Worker", job.assigned_worker_id], ["Lease", job.lease_id],
    ["Timeout", `${job.timeout_seconds} s`]];
  for (const [k, v] of items) { facts.appendChild(el("dt", k)); facts.appendChild(el("dd", v)); }
  $("job-payload").textContent = show(job.payload);
  $("job-result").textContent = job.result === null || job.result === undefined ? "(none)" : show(job.result);
  $("job-error").textContent = job.last_error || "(none)";
  $("job-retry").hidden = !["deadletter", "failed", "cancelled"].includes(job.status);
  const body = $("job-history");
  clear(body);
  for (const e of hist.events) {
    body.appendChild(row([epoch(e.at), e.event, badge(e.to_status), e.worker_id, e.lease_id, e.retry_count,
      (e.error || "").split("\n")[0]]));
  }
}

async function renderDlq() {
  const { data } = await api("GET", "/api/v1/jobs/dlq?limit=100");
  const body = $("dlq-body");
  clear(body);
  for (const j of data) {
    body.appendChild(row([link(j.id, () => openJob(j.id)), j.queue_name, j.retry_count,
      (j.last_error || "").split("\n")[0],
      button("Retry", async () => { await api("POST", "/api/v1/jobs/dlq/retry", { job_ids: [j.id] }); refresh(); })]));
  }
  $("dlq-empty").hidden = data.length > 0;
}

async function renderWorkers() {
  const { data } = await api("GET", "/api/v1/workers");
  const body = $("workers-body");
  clear(body);
  for (const w of data) {
    body.appendChild(row([w.id, w.queue_name, badge(w.status), age(w.last_heartbeat), w.current_jobs,
      w.jobs_processed, w.jobs_failed]));
  }
}

const RENDER = { queues: renderQueues, jobs: renderJobs, job: renderJob, dlq: renderDlq, workers: renderWorkers };

async function refresh() {
  if (state.pending) return;
  state.pending = true;
  try {
    await RENDER[state.tab]();
    $("error").textContent = "";
  } catch (err) {
    if (err instanceof Unauthorized) { signOut("That key is not valid here."); return; }
    $("error").textContent = String(err.message || err);
  } finally {
    state.pending = false;
  }
}

function go(tab) {
  state.tab = tab;
  if (tab === "jobs") state.offset = 0;
  for (const id of Object.keys(RENDER)) $(id).hidden = id !== tab;
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === tab);
  refresh();
}

function openJob(id) { state.jobId = id; go("job"); }

function schedule() {
  clearTimeout(state.timer);
  state.timer = setTimeout(() => { refresh(); schedule(); }, state.live ? SLOW_POLL_MS : POLL_MS);
}

// Events refresh the view at most once per EVENT_REFRESH_MS (the first one of a quiet spell after 250 ms), so a
// busy queue's stream of events costs the API one overview read every two seconds, not four a second.
const EVENT_REFRESH_MS = 2000;
let soon = null;
let lastEventRefresh = 0;
function onEvent() {
  if (soon) return;
  const wait = Math.max(250, lastEventRefresh + EVENT_REFRESH_MS - Date.now());
  soon = setTimeout(() => { soon = null; lastEventRefresh = Date.now(); refresh(); }, wait);
}

function listen() {
  if (state.source || typeof EventSource === "undefined") return;
  const src = new EventSource("/api/v1/events?token=" + encodeURIComponent(sessionStorage.getItem(KEY)));
  state.source = src;
  for (const name of LIVE_EVENTS) src.addEventListener(name, onEvent);
  src.onopen = () => { state.live = true; setLive(); };
  src.onerror = () => {  // the server refused it or it ended: poll, and try again later
    state.live = false; setLive(); src.close(); state.source = null;
    setTimeout(listen, 5000);
  };
}

function setLive() {
  const live = $("live");
  live.hidden = false;
  live.textContent = state.live ? "live" : "polling";
  live.className = "live" + (state.live ? "" : " polling");
}

function signOut(message) {
  sessionStorage.removeItem(KEY);
  if (state.source) { state.source.close(); state.source = null; }
  clearTimeout(state.timer);
  for (const id of Object.keys(RENDER)) $(id).hidden = true;
  $("tabs").hidden = true; $("signout").hidden = true; $("live").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("error").textContent = "";
}

async function signIn(key) {
  sessionStorage.setItem(KEY, key);
  try {
    await api("GET", "/api/v1/queues");
  } catch (err) {
    if (err instanceof Unauthorized) { signOut("That key is not valid here."); return; }
    throw err;
  }
  $("login").hidden = true; $("tabs").hidden = false; $("signout").hidden = false;
  setLive();
  go(state.tab);
  listen();
  schedule();
}

function start() {
  for (const s of STATUSES) $("jobs-status").add(new Option(s, s));
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => go(b.dataset.tab));
  $("jobs-queue").addEventListener("change", () => go("jobs"));
  $("jobs-status").addEventListener("change", () => go("jobs"));
  $("jobs-prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); refresh(); });
  $("jobs-next").addEventListener("click", () => { state.offset += PAGE; refresh(); });
  $("job-back").addEventListener("click", () => go("jobs"));
  $("job-retry").addEventListener("click", async () => {
    await api("POST", "/api/v1/jobs/dlq/retry", { job_ids: [state.jobId] }); refresh();
  });
  $("dlq-retry-all").addEventListener("click", async () => { await api("POST", "/api/v1/jobs/dlq/retry", {}); refresh(); });
  $("dlq-purge").addEventListener("click", async () => {
    if (confirm("Delete every dead-lettered job?")) { await api("POST", "/api/v1/jobs/dlq/purge", { confirm: true }); refresh(); }
  });
  $("signout").addEventListener("click", () => signOut(""));
  $("login-form").addEventListener("submit", (e) => { e.preventDefault(); signIn($("login-key").value.trim()); });
  const fromUrl = new URLSearchParams(location.hash.slice(1)).get("key");
  if (fromUrl) history.replaceState(null, "", location.pathname);  // the key leaves the address bar at once
  const key = fromUrl || sessionStorage.getItem(KEY);
  if (key) signIn(key); else signOut("");
}

document.addEventListener("DOMContentLoaded", start);
