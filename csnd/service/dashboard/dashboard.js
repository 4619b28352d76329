// The csnd dashboard: polls /api/status (the gRPC Status content) once a second,
// /api/history once at load for the last minutes.  Nothing from the network but
// this service: it must work on a machine with no internet.  The plots draw with
// uPlot (uplot/, vendored and served by the service: 51 kB, canvas, a time axis,
// a value axis and a legend), one chart per figure, one series per node or consumer.
//
// With a token configured the API answers 401 until the browser holds the
// session cookie: the page then shows its login form, which POSTs the token to
// /login (never in a URL); the cookie is HttpOnly, so no script here sees it.
"use strict";

let thresholds = null;
let samples = [];          // as /api/history's: {t, transactions, lag_seconds: {node: s}, ...}
const MAX_SAMPLES = 600;   // ten minutes of one a second, as the service keeps

const num = (v) => Number(v || 0);
const fmt = (v) => num(v).toLocaleString("en-US");
function bytes(v) {
  let n = num(v);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1).replace(/\.0$/, "") : n.toFixed(0)) + " " + units[i];
}
function lsn(v) {
  const n = BigInt(v || 0);
  return (n >> 32n).toString(16).toUpperCase() + "/" + (n & 0xffffffffn).toString(16).toUpperCase();
}
// A node that is not flowing: its lag and its slot's figures are the last ones read, not today's.
const DOWN = ["failed", "reconnecting", "restarting"];
const isDown = (n) => DOWN.includes(n.state);

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
    tr.dataset.role = n.server_role || "";  // (a node decoded on a hot standby says so beside its mode)
    const stateCls = ["failed", "reconnecting", "restarting"].includes(n.state) ? "bad" : "";
    const safe = num(n.slot_safe_wal_size);
    tr.append(
      cell(n.name), cell((n.mode || "") + (n.server_role === "standby" ? " · standby" : "")), cell((n.state || "") + (n.stuck ? " (stuck)" : ""), stateCls),
      cell(lsn(n.received_lsn)), cell(lsn(n.confirmed_lsn)), cell(fmt(n.watermark_csn)), cell(bytes(n.lag_bytes)),
      isDown(n) ? cell("unknown", "bad")
        : cell(num(n.lag_seconds).toFixed(1), level(num(n.lag_seconds), thresholds.lag_seconds_amber, thresholds.lag_seconds_red)),
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

function renderSnapshot(snapshot, id) {
  // A snapshot's tables: the initial one (--snapshot) while a service run takes one, and the
  // latest incremental one (csnd snapshot).
  const section = document.getElementById(id + "-section");
  section.hidden = !(snapshot && snapshot.state);
  if (section.hidden) return;
  document.getElementById(id + "-state").textContent = snapshot.job
    ? snapshot.state + " (job " + snapshot.job + ")" + (snapshot.error ? ": " + snapshot.error : "")
    : snapshot.state + " (CSN " + fmt(snapshot.first_csn) + " to " + fmt(snapshot.last_csn) + ")";
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const t of snapshot.tables || []) {
    const tr = document.createElement("tr");
    tr.dataset.table = t.schema + "." + t.table;
    const eta = num(t.eta_seconds);
    tr.append(
      // (0: not known -- no statistics, or the copy passed them -- shown as such, never as done)
      cell(t.node), cell(t.schema + "." + t.table), cell(t.state || ""), cell(fmt(t.rows)),
      cell(num(t.rows_estimated) || t.state === "done" ? fmt(t.rows_estimated) : "unknown"),
      cell(fmt(t.chunks_done) + " / " + (num(t.chunks) ? fmt(t.chunks) : "?")),
      cell(num(t.rows_per_second) ? fmt(Math.round(num(t.rows_per_second))) : "–"),
      cell(t.state === "done" ? "–" : eta >= 0 ? eta.toFixed(0) + " s" : "?"),
    );
    body.append(tr);
  }
}

function rate(key) {
  if (samples.length < 2) return 0;
  const a = samples[Math.max(0, samples.length - 6)], b = samples[samples.length - 1];
  return b.t > a.t ? (num(b[key]) - num(a[key])) / (b.t - a.t) : 0;
}

// --- the plots --------------------------------------------------------------------
//
// Each chart is a spec: its value axis (label and unit) and a function from the
// samples to its series.  A chart is built again when its series change (a node
// or consumer comes or goes), else only given new data.  Where the pointer is not
// on a chart, its legend shows the newest values.

const PALETTE = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#1b7c83", "#e16f24", "#57606a"];
const CHART_HEIGHT = 170;
const AXIS_FONT = "11px system-ui, sans-serif";
const pad2 = (n) => String(n).padStart(2, "0");
function clock(t, seconds) {
  const d = new Date(t * 1000);
  return pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + (seconds ? ":" + pad2(d.getSeconds()) : "");
}
const trimmed = (v, digits) => Number(v.toFixed(digits)).toLocaleString("en-US");

// How each unit labels its ticks and its legend values, and the steps its ticks take
// (bytes in powers of two, so a tick is 256 MiB and never 244.1 MiB; counts in whole steps).
const binarySteps = [];
for (let k = 0; k <= 50; k += 10) for (let m = 1; m < 1024; m *= 2) binarySteps.push(m * 2 ** k);
const wholeSteps = [];
for (let e = 0; e <= 15; e++) for (const m of [1, 2, 5]) wholeSteps.push(m * 10 ** e);
// (seconds; uPlot's own go from 1 to 5 minutes, too coarse for a ten-minute plot)
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400];
const UNITS = {
  rate: { tick: (v) => trimmed(v, 2), value: (v) => trimmed(v, 1) + "/s" },
  seconds: { tick: (v) => trimmed(v, 2), value: (v) => v.toFixed(1) + " s" },
  bytes: { tick: bytes, value: bytes, incrs: binarySteps },
  transactions: { tick: (v) => trimmed(v, 0), value: (v) => fmt(v), incrs: wholeSteps },
};

// A value axis as wide as its longest tick label (uPlot's default is a fixed width).
function axisSize(u, values, axisIdx, cycle) {
  const axis = u.axes[axisIdx];
  if (cycle > 1) return axis._size;
  let size = axis.ticks.size + axis.gap + (axis.label ? axis.labelSize : 0);
  const longest = (values || []).reduce((a, v) => (v.length > a.length ? v : a), "");
  if (longest) {
    u.ctx.font = axis.font[0];
    size += u.ctx.measureText(longest).width / devicePixelRatio;
  }
  return Math.ceil(size);
}

// Per-node (or per-consumer) series of one sample field, in order of first appearance.
function perName(field) {
  const names = [];
  for (const s of samples) for (const k of Object.keys(s[field] || {})) if (!names.includes(k)) names.push(k);
  return names.map((name) => ({
    label: name,
    values: samples.map((s) => (s[field] && name in s[field] ? num(s[field][name]) : null)),
  }));
}

// A counter's rate between successive samples (none across a gap or a reset).
function rates(field) {
  return samples.map((s, i) => {
    if (i === 0) return null;
    const dt = s.t - samples[i - 1].t, d = num(s[field]) - num(samples[i - 1][field]);
    return dt > 0 && d >= 0 ? d / dt : null;
  });
}

const CHARTS = [
  // (an axis each: on one, a bulk insert's changes/s flattened the steady transactions/s line
  // for the ten minutes it stayed in view; dashed, the changes keep to the right-hand axis)
  { id: "chart-rate", label: "transactions/s", unit: "rate", right: "changes/s",
    series: () => [{ label: "transactions", values: rates("transactions") },
                   { label: "changes", values: rates("changes"), dash: [5, 3], right: true }] },
  { id: "chart-lag", label: "lag, seconds", unit: "seconds", series: () => perName("lag_seconds") },
  { id: "chart-lag-bytes", label: "LSN lag, bytes", unit: "bytes", series: () => perName("lag_bytes") },
  { id: "chart-slot-wal", label: "WAL held, bytes", unit: "bytes", series: () => perName("retained_wal_bytes") },
  { id: "chart-consumers", label: "lag, transactions", unit: "transactions", series: () => perName("consumer_lag"),
    empty: "no consumer in these minutes" },
  { id: "chart-changelog", label: "size, bytes", unit: "bytes",
    series: () => [{ label: "changelog", values: samples.map((s) => ("changelog_bytes" in s ? num(s.changelog_bytes) : null)) }] },
];
const charts = new Map();   // id -> {plot, key: its series' names}

function showNewest(u) {
  if (u.cursor.idx == null && u.data[0].length) u.setLegend({ idx: u.data[0].length - 1 }, false);
}

// The time axis' labels: a tick at least a label's width and a gap apart, so that in the
// narrow plots of the three-column layout they do not run together.
const TIME_LABEL_GAP = 16;
let timeLabelWidth = 0;
function timeSpace(u) {
  if (!timeLabelWidth) {
    u.ctx.font = AXIS_FONT;
    timeLabelWidth = u.ctx.measureText("00:00:00").width;
  }
  return Math.ceil(timeLabelWidth + TIME_LABEL_GAP);
}
// The room between the drawn time labels (the narrowest; for the page's tests, as data-time-room).
function timeLabels(u, splits, incr) {
  const labels = splits.map((t) => clock(t, incr < 60));
  u.ctx.font = AXIS_FONT;
  let room = Infinity;
  for (let i = 1; i < splits.length; i++) {
    const gap = u.valToPos(splits[i], "x") - u.valToPos(splits[i - 1], "x");
    const half = (u.ctx.measureText(labels[i]).width + u.ctx.measureText(labels[i - 1]).width) / 2;
    room = Math.min(room, gap - half);
  }
  if (Number.isFinite(room)) u.root.parentElement.dataset.timeRoom = String(Math.floor(room));
  return labels;
}

function buildChart(spec, el, series) {
  const unit = UNITS[spec.unit];
  const grid = { stroke: "#eaeef2", width: 1 }, ticks = { stroke: "#d0d7de", width: 1, size: 4 };
  const range = (u, lo, hi) => [0, hi > 0 ? hi * 1.08 : 1];
  const opts = {
    width: el.clientWidth || 400,
    height: CHART_HEIGHT,
    cursor: { points: { size: 6 } },
    legend: { live: true, markers: { fill: (u, i) => u.series[i].stroke(u, i) } },
    scales: {
      x: { time: true },
      // from zero up, with room above the highest value (a flat zero still shows 0 to 1)
      y: { range },
      ...(spec.right ? { right: { range } } : {}),
    },
    series: [
      { label: "time", value: (u, t) => (t == null ? "–" : clock(t, true)) },
      ...series.map((s, i) => ({
        label: s.label,
        stroke: PALETTE[i % PALETTE.length],
        width: 1.5,
        dash: s.dash,
        scale: s.right ? "right" : "y",
        spanGaps: false,
        points: { show: false },
        value: (u, v) => (v == null ? "–" : unit.value(v)),
      })),
    ],
    axes: [
      { stroke: "#636c76", font: AXIS_FONT, grid, ticks, size: 28, space: timeSpace, incrs: TIME_STEPS,
        values: (u, splits, ax, space, incr) => timeLabels(u, splits, incr) },
      { stroke: "#636c76", font: AXIS_FONT, grid, ticks, size: axisSize, incrs: unit.incrs,
        label: spec.label, labelSize: 18, labelFont: "12px system-ui, sans-serif",
        values: (u, splits) => splits.map(unit.tick) },
      ...(spec.right ? [{ scale: "right", side: 1, stroke: "#636c76", font: AXIS_FONT, grid: { show: false }, ticks,
        size: axisSize, incrs: unit.incrs, label: spec.right, labelSize: 18, labelFont: "12px system-ui, sans-serif",
        values: (u, splits) => splits.map(unit.tick) }] : []),
    ],
    hooks: { setLegend: [showNewest] },
  };
  return new uPlot(opts, [samples.map((s) => s.t), ...series.map((s) => s.values)], el);
}

function renderPlots() {
  if (typeof uPlot === "undefined") return;  // (the library did not load: the tables still work)
  for (const spec of CHARTS) {
    const el = document.getElementById(spec.id);
    const series = spec.series();
    const key = series.map((s) => s.label).join("\n");
    let c = charts.get(spec.id);
    if (c && c.key !== key) { c.plot.destroy(); c = null; }
    if (!c) {
      if (!charts.has(spec.id)) {  // (once per chart: it resizes whichever plot is there now)
        new ResizeObserver(() => charts.get(spec.id).plot.setSize({ width: el.clientWidth, height: CHART_HEIGHT }))
          .observe(el);
      }
      c = { plot: buildChart(spec, el, series), key };
      charts.set(spec.id, c);
      if (series.length || !spec.empty) delete el.dataset.empty;
      else el.dataset.empty = spec.empty;
    } else {
      c.plot.setData([samples.map((s) => s.t), ...series.map((s) => s.values)]);
    }
  }
}

// One sample of the plots' figures, as the service's history keeps them (csnd/service/http.py History).
function sampleOf(status) {
  const nodes = status.nodes || [], byName = (f) => Object.fromEntries(nodes.map((n) => [n.name, num(n[f])]));
  return {
    t: num(status.time_us) / 1e6 || Date.now() / 1000,
    transactions: num((status.totals || {}).transactions),
    changes: num((status.totals || {}).changes),
    changelog_bytes: num((status.changelog || {}).bytes),
    lag_seconds: byName("lag_seconds"),
    lag_bytes: byName("lag_bytes"),
    retained_wal_bytes: byName("retained_wal_bytes"),
    consumer_lag: Object.fromEntries((status.consumers || []).map(
      (c) => [String(c.name || c.peer || "anonymous"), num(c.lag_transactions)])),
  };
}

function render(status) {
  const nodes = status.nodes || [], consumers = status.consumers || [], log = status.changelog || {};
  const totals = status.totals || {};
  samples.push(sampleOf(status));
  if (samples.length > MAX_SAMPLES) samples.shift();
  const overall = worse(renderNodes(nodes), renderConsumers(consumers));
  renderSnapshot(status.snapshot, "snapshot");
  renderSnapshot(status.incremental, "incremental");
  const badge = document.getElementById("overall");
  badge.className = "badge " + overall;
  badge.textContent = { ok: "all flowing", warn: "attention", bad: "action needed" }[overall];
  if (overall === "ok" && !nodes.length) {  // (nothing flows yet: say what happens instead)
    const copying = status.snapshot && status.snapshot.state === "running";
    badge.className = "badge busy";
    badge.textContent = copying ? "initial snapshot" : "starting";
  }
  document.getElementById("tx-rate").textContent = rate("transactions").toFixed(1);
  document.getElementById("log-newest").textContent = "CSN " + fmt(log.newest_csn);
  document.getElementById("log-detail").textContent =
    `oldest ${fmt(log.oldest_csn)} · ${bytes(log.bytes)} in ${fmt(log.segments)} segments · ${fmt(totals.transactions)} transactions`;
  // A node that is not flowing has no lag or slot figure of today: the cards say so instead of 0.
  const down = nodes.filter(isDown);
  let worst = null;
  for (const n of nodes) if (!worst || num(n.lag_seconds) > num(worst.lag_seconds)) worst = n;
  const downText = down.map((n) => "node " + n.name + " " + n.state).join(", ");
  document.getElementById("worst-lag").textContent =
    down.length ? "unknown" : worst ? num(worst.lag_seconds).toFixed(1) + " s" : "–";
  document.getElementById("worst-lag-node").textContent = down.length ? downText : worst ? "node " + worst.name : "";
  document.getElementById("wal-held").textContent =
    down.length ? "unknown" : nodes.length ? bytes(nodes.reduce((s, n) => s + num(n.retained_wal_bytes), 0)) : "–";
  document.getElementById("wal-held-detail").textContent =
    down.length ? downText + ": its slot is not read" : "sum over the slots";
  document.getElementById("updated").textContent = "updated " + clock(Date.now() / 1000, true);
  renderPlots();
}

// The latency histograms of /metrics (cumulative buckets): what they observed between
// two updates, as the upper bound of the bucket holding a quantile.
const LATENCY = ["csnd_commit_to_sent_seconds", "csnd_commit_to_durable_seconds"];
let lastLatency = null;

function histograms(text) {
  const out = Object.fromEntries(LATENCY.map((n) => [n, []]));
  for (const line of text.split("\n")) {
    for (const name of LATENCY) {
      if (!line.startsWith(name + "_bucket{")) continue;
      const le = line.slice(line.indexOf('le="') + 4).split('"')[0];
      out[name].push([le === "+Inf" ? Infinity : Number(le), Number(line.slice(line.lastIndexOf(" ") + 1))]);
    }
  }
  return out;
}

function bucketQuantile(before, now, q) {
  const counts = now.map(([le, c], i) => [le, c - (before && before[i] ? before[i][1] : 0)]);
  const total = counts.length ? counts[counts.length - 1][1] : 0;
  if (total <= 0) return null;
  for (const [le, c] of counts) if (c >= q * total) return le;
  return Infinity;
}

function ms(le) {
  return le === null ? "–" : le === Infinity ? "> 30 s" : "≤ " + +(le * 1000).toFixed(1) + " ms";
}

async function renderLatency() {
  const r = await fetch("metrics", { cache: "no-store", credentials: "same-origin" });
  if (!r.ok) return;
  const now = histograms(await r.text());
  const before = lastLatency;
  lastLatency = now;
  if (before === null) return;
  const [sent, durable] = LATENCY.map((n) => [bucketQuantile(before[n], now[n], 0.5), bucketQuantile(before[n], now[n], 0.99)]);
  document.getElementById("latency").textContent = ms(sent[1]);
  document.getElementById("latency-detail").textContent =
    `sent to a stream, since the last update: p50 ${ms(sent[0])} · to durable p50 ${ms(durable[0])}, p99 ${ms(durable[1])}`;
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
    renderLatency().catch(() => {});  // (a figure of its own: the cards above stand without it)
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
    samples = hist.samples.slice(-MAX_SAMPLES);
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
