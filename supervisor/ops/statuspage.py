"""The health port's `GET /`: one HTML page of what `status` shows, refreshed by polling /status.

The page holds no data: its script fetches /status every two seconds (no held connection) and sets every
value with textContent, so nothing the daemon reports (a queue name, a job id, an error) is read as HTML.
It references nothing outside the page. /status itself stays JSON.
"""

from __future__ import annotations

CONTENT_TYPE = "text/html; charset=utf-8"
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>spooled-supervisor status</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1em; color: #1d2330; }
table { border-collapse: collapse; } th, td { text-align: left; padding: .25em .7em; border-bottom: 1px solid #ddd; }
th { background: #eef0f4; } dt { font-weight: 600; } dl { display: grid; grid-template-columns: max-content auto;
gap: .1em 1em; } .err { color: #b3261e; } .busy { color: #1f6fd1; } .idle { color: #1e8e3e; }
</style></head>
<body>
<h1>spooled-supervisor</h1>
<p id="err" class="err"></p>
<dl id="facts"></dl>
<h2>Children</h2>
<table><thead><tr><th>Slot</th><th>PID</th><th>State</th><th>Job</th><th>Run time</th><th>Memory MiB</th>
<th>Done</th><th>Restarts</th></tr></thead><tbody id="children"></tbody></table>
<script>
"use strict";
function cell(tr, v, cls) { const td = document.createElement("td"); td.textContent = v == null ? "-" : String(v);
  if (cls) td.className = cls; tr.appendChild(td); }
function mib(b) { return b == null ? "-" : (b / 1048576).toFixed(1); }
function secs(s) { return s == null ? "-" : s < 60 ? s.toFixed(1) + " s" : (s / 60).toFixed(1) + " min"; }
function fact(dl, k, v) { const dt = document.createElement("dt"); dt.textContent = k;
  const dd = document.createElement("dd"); dd.textContent = v == null ? "-" : String(v); dl.append(dt, dd); }
let last = null;
async function tick() {
  try {
    const resp = await fetch("/status", { cache: "no-store" });
    const s = await resp.json();
    document.getElementById("err").textContent = "";
    const dl = document.getElementById("facts"); dl.replaceChildren();
    fact(dl, "Worker", `${s.worker_id} (pid ${s.pid}, version ${s.version})`);
    fact(dl, "Queue", s.queue);
    fact(dl, "State", s.draining ? "draining" : s.registered ? "registered" : "not registered");
    fact(dl, "Busy", `${s.busy} of ${s.procs} children`);
    const m = s.memory || {};
    if (m.limit_bytes) {
      fact(dl, "Memory", `${mib(m.used_bytes)} of ${mib(m.limit_bytes)} MiB (${m.source}), ${m.state}`);
    }
    const now = Date.now();
    const rate = last && now > last.t ? (s.jobs_settled - last.n) * 1000 / (now - last.t) : null;
    last = { t: now, n: s.jobs_settled };
    fact(dl, "Jobs settled", s.jobs_settled);
    fact(dl, "Throughput", rate == null ? "-" : rate.toFixed(2) + " jobs/s");
    fact(dl, "In flight", `${s.inflight} (reserved ${s.reserved}, held ${s.held})`);
    if (s.queues) fact(dl, "Queues", JSON.stringify(s.queues));
    const body = document.getElementById("children"); body.replaceChildren();
    for (const c of (s.children || []).slice().sort((a, b) => a.slot - b.slot)) {
      const tr = document.createElement("tr");
      cell(tr, c.slot); cell(tr, c.pid); cell(tr, c.state, c.state); cell(tr, c.job_id);
      cell(tr, secs(c.job_runtime_secs)); cell(tr, mib(c.memory_bytes != null ? c.memory_bytes : c.rss_bytes));
      cell(tr, c.jobs_done); cell(tr, c.restarts);
      body.appendChild(tr);
    }
  } catch (e) {
    document.getElementById("err").textContent = "cannot read /status: " + e;
  }
}
tick(); setInterval(tick, 2000);
</script>
</body></html>
"""
