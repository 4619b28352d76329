// The csnd dashboard: polls /api/status (the gRPC Status content) once a second,
// /api/history once at load for the last minutes.  No library, nothing from the
// network but this service: it must work on a machine with no internet.
//
// With a token configured the API answers 401 until the browser holds the
// session cookie: the page then shows its login form, which POSTs the token to
// /login (never in a URL); the cookie is HttpOnly, so no script here sees it.
"use strict";

let thresholds = null;
let samples = [];          // {t, transactions, lag_seconds: {node: s}, ...}
const MAX_SAMPLES = 600;

const num = (v) => Number(v || 0);
const fmt = (v) => num(v).toLocaleString("en-US");
function bytes(v) {
  let n = num(v);
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
}
function lsn(v) {
  const n = BigInt(v || 0);
  return (n >> 32n).toString(16).toUpperCase() + "/" + (n & 0xffffffffn).toString(16).toUpperCase();
}
function level(value, amber, red) { return value >= red ? "bad" : value >= amber ? "warn" : "ok"; }
const worse = (a, b) => (a === "bad" || b === "bad") ? "bad" : (a === "warn" || b === "warn") ? "warn" : "ok";

// A node's colour: its state, its lag and the WAL its slot holds back.  A node
// that is not flowing (reconnecting, restarting, failed) is red: that is the
// first question on call; a stuck watermark or a restart count is amber.
function nodeLevel(n) {
  const t = thresholds;
  let lv = "ok";
  if (["failed", "reconnecting", "restarting"].includes(n.state)) lv = "bad";
  if (n.stuck) lv = worse(lv, "warn");
  lv = worse(lv, level(num(n.lag_seconds), t.lag_seconds_amber, t.lag_seconds_red));
  lv = worse(lv, level(num(n.retained_wal_bytes), t.retained_wal_bytes_amber, t.retained_wal_bytes_red));
  return lv;
}
function consumerLevel(c) {
  return level(num(c.lag_transactions), thresholds.consumer_lag_amber, thresholds.consumer_lag_red);
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function renderNodes(nodes) {
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren();
  let overall = "ok";
  for (const n of nodes) {
    const lv = nodeLevel(n);
    overall = worse(overall, lv);
    const tr = document.createElement("tr");
    tr.className = lv;
    tr.dataset.node = n.name;
    tr.dataset.state = n.state || "";
    const stateCls = ["failed", "reconnecting", "restarting"].includes(n.state) ? "bad" : "";
    const safe = num(n.slot_safe_wal_size);
    tr.append(
      cell(n.name), cell(n.mode || ""), cell((n.state || "") + (n.stuck ? " (stuck)" : ""), stateCls),
      cell(lsn(n.received_lsn)), cell(lsn(n.confirmed_lsn)), cell(fmt(n.watermark_csn)), cell(bytes(n.lag_bytes)),
      cell(num(n.lag_seconds).toFixed(1), level(num(n.lag_seconds), thresholds.lag_seconds_amber, thresholds.lag_seconds_red)),
      cell(fmt(n.transactions)), cell(fmt(n.decoded_changes)),
      cell((n.queue_depths || []).join(" / ") || "–"), cell(fmt(n.restarts), num(n.restarts) ? "warn" : ""),
      cell(fmt(n.waiting_committing) + " / " + fmt(n.waiting_commit) + " / " + fmt(n.waiting_merge)),
      cell(bytes(n.spill_bytes)),
      cell(n.retained_wal_bytes && num(n.retained_wal_bytes) ? bytes(n.retained_wal_bytes) : "–",
           level(num(n.retained_wal_bytes), thresholds.retained_wal_bytes_amber, thresholds.retained_wal_bytes_red)),
      cell(n.slot_wal_status || "–", n.slot_wal_status === "lost" ? "bad" : n.slot_wal_status === "unreserved" ? "warn" : ""),
      cell(n.slot_wal_status ? (safe >= 0 ? bytes(safe) : "unlimited") : "–"),
    );
    if (n.error) tr.title = n.error;
    body.append(tr);
  }
  return overall;
}

function renderConsumers(consumers) {
  const body = document.querySelector("#consumers tbody");
  body.replaceChildren();
  let overall = "ok";
  for (const c of consumers) {
    const lv = consumerLevel(c);
    overall = worse(overall, lv);
    const tr = document.createElement("tr");
    tr.className = lv;
    tr.dataset.consumer = c.name || c.peer || "anonymous";
    tr.append(
      cell(c.name || "(anonymous)"), cell(c.kind || "subscriber"), cell(c.peer || "–"), cell(c.connected ? "yes" : "no"),
      cell(fmt(c.acknowledged_csn)), cell((c.lag_at_least ? "≥ " : "") + fmt(c.lag_transactions), lv === "ok" ? "" : lv),
      cell((c.tables || []).join(", ") || "all"),
    );
    body.append(tr);
  }
  return overall;
}

function renderSnapshot(snapshot) {
  // The initial snapshot's tables (--snapshot), shown only while a service run takes one.
  const section = document.getElementById("snapshot-section");
  section.hidden = !(snapshot && snapshot.state);
  if (section.hidden) return;
  document.getElementById("snapshot-state").textContent =
    snapshot.state + " (CSN " + fmt(snapshot.first_csn) + " to " + fmt(snapshot.last_csn) + ")";
  const body = document.querySelector("#snapshot tbody");
  body.replaceChildren();
  for (const t of snapshot.tables || []) {
    const tr = document.createElement("tr");
    tr.dataset.table = t.schema + "." + t.table;
    const eta = num(t.eta_seconds);
    tr.append(
      cell(t.node), cell(t.schema + "." + t.table), cell(t.state || ""), cell(fmt(t.rows)), cell(fmt(t.rows_estimated)),
      cell(fmt(t.chunks_done) + " / " + fmt(t.chunks)), cell(t.state === "done" ? "–" : eta >= 0 ? eta.toFixed(0) + " s" : "?"),
    );
    body.append(tr);
  }
}

function rate(key) {
  if (samples.length < 2) return 0;
  const a = samples[Math.max(0, samples.length - 6)], b = samples[samples.length - 1];
  return b.t > a.t ? (num(b[key]) - num(a[key])) / (b.t - a.t) : 0;
}

function plot(svg, values, label) {
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const max = Math.max(1, ...values);
  if (values.length > 1) {
    const pts = values.map((v, i) => `${(i / (values.length - 1)) * 600},${155 - (v / max) * 140}`).join(" ");
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts);
    svg.append(line);
  }
  const text = document.createElementNS(ns, "text");
  text.setAttribute("x", "4"); text.setAttribute("y", "12");
  text.textContent = `max ${max.toFixed(1)} ${label} · last ${Math.round(values.length)} s`;
  svg.append(text);
}

function renderPlots() {
  const rates = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = samples[i].t - samples[i - 1].t;
    rates.push(dt > 0 ? Math.max(0, (samples[i].transactions - samples[i - 1].transactions) / dt) : 0);
  }
  plot(document.getElementById("plot-rate"), rates, "tx/s");
  plot(document.getElementById("plot-lag"), samples.map((s) => Math.max(0, ...Object.values(s.lag_seconds || {}))), "s");
}

function render(status) {
  const nodes = status.nodes || [], consumers = status.consumers || [], log = status.changelog || {};
  const totals = status.totals || {};
  samples.push({
    t: num(status.time_us) / 1e6 || Date.now() / 1000,
    transactions: num(totals.transactions),
    lag_seconds: Object.fromEntries(nodes.map((n) => [n.name, num(n.lag_seconds)])),
  });
  if (samples.length > MAX_SAMPLES) samples.shift();
  const overall = worse(renderNodes(nodes), renderConsumers(consumers));
  renderSnapshot(status.snapshot);
  const badge = document.getElementById("overall");
  badge.className = "badge " + overall;
  badge.textContent = { ok: "all flowing", warn: "attention", bad: "action needed" }[overall];
  document.getElementById("tx-rate").textContent = rate("transactions").toFixed(1);
  document.getElementById("log-newest").textContent = "CSN " + fmt(log.newest_csn);
  document.getElementById("log-detail").textContent =
    `oldest ${fmt(log.oldest_csn)} · ${bytes(log.bytes)} in ${fmt(log.segments)} segments · ${fmt(totals.transactions)} transactions`;
  let worst = null;
  for (const n of nodes) if (!worst || num(n.lag_seconds) > num(worst.lag_seconds)) worst = n;
  document.getElementById("worst-lag").textContent = worst ? num(worst.lag_seconds).toFixed(1) + " s" : "–";
  document.getElementById("worst-lag-node").textContent = worst ? "node " + worst.name : "";
  document.getElementById("wal-held").textContent = bytes(nodes.reduce((s, n) => s + num(n.retained_wal_bytes), 0));
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  renderPlots();
}

class Unauthorized extends Error {}

async function get(path) {
  const r = await fetch(path, { cache: "no-store", credentials: "same-origin" });
  if (r.status === 401) throw new Unauthorized(path);
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

// The API wants the token: show the form (a refused one comes back to "#refused").
function askForToken() {
  const form = document.getElementById("login");
  form.hidden = false;
  document.getElementById("login-refused").hidden = location.hash !== "#refused";
  const badge = document.getElementById("overall");
  badge.className = "badge";
  badge.textContent = "token needed";
  document.querySelector("main").hidden = true;
  form.querySelector("input").focus();
}

async function tick() {
  const err = document.getElementById("error");
  try {
    render(await get("api/status"));
    err.hidden = true;
  } catch (e) {
    if (e instanceof Unauthorized) {
      askForToken();
      return;
    }
    err.hidden = false;
    err.textContent = "cannot reach the service: " + e.message;
    const badge = document.getElementById("overall");
    badge.className = "badge bad";
    badge.textContent = "unreachable";
  }
}

let timer = null;

async function start() {
  try {
    const cfg = await get("api/config");
    thresholds = cfg.thresholds;
    const t = thresholds;
    document.getElementById("thresholds").textContent =
      `amber / red at: node lag ${t.lag_seconds_amber} / ${t.lag_seconds_red} s · slot WAL ${bytes(t.retained_wal_bytes_amber)} / ` +
      `${bytes(t.retained_wal_bytes_red)} · consumer lag ${fmt(t.consumer_lag_amber)} / ${fmt(t.consumer_lag_red)} transactions; ` +
      `a node that is not flowing (reconnecting, restarting, failed) is red, a stuck watermark amber`;
    const hist = await get("api/history");
    samples = hist.samples.map((s) => ({ t: s.t, transactions: s.transactions, lag_seconds: s.lag_seconds }));
  } catch (e) {
    if (e instanceof Unauthorized) {
      askForToken();
      return;
    }
    thresholds = thresholds || { lag_seconds_amber: 10, lag_seconds_red: 60, retained_wal_bytes_amber: 2 ** 30,
      retained_wal_bytes_red: 8 * 2 ** 30, consumer_lag_amber: 10000, consumer_lag_red: 100000 };
  }
  if (location.hash) history.replaceState(null, "", location.pathname);
  await tick();
  timer = timer || setInterval(tick, 1000);
}

start();
