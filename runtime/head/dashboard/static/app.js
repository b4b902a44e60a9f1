// The DDLF dashboard page: polls the head's read-only JSON API once a second and redraws.
// Every string from the cluster goes into the page as text (textContent), never as HTML:
// class names, actor names and event details are whatever the user's code said.
"use strict";

const POLL_MS = 1000;
const runs = new Map();   // run id -> {rows: [], events: [], seq: 0}
let chosenRun = null;     // the run shown; null: the newest
let xAxis = "time";       // "time" or "epoch"
let shownRun = null;      // the run drawn last

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function fill(tbody, rows, cells, rowClass) {
  tbody.replaceChildren(...rows.map((r) => {
    const tr = el("tr", null, rowClass);
    for (const [value, cls] of cells(r)) tr.append(el("td", value, cls));
    return tr;
  }));
}

function num(v, digits) {
  if (v === null || v === undefined) return "–";
  return Number(v).toLocaleString(undefined, {maximumFractionDigits: digits});
}

function resources(total, used, skip) {
  // memory is in bytes: show GiB
  const show = (k, v) => k === "memory" ? `${num(v / 2 ** 30, 1)}` : num(v, 2);
  return Object.keys(total).filter((k) => !skip.includes(k)).sort()
    .map((k) => `${k === "memory" ? "memory GiB" : k} ${show(k, used[k] || 0)} / ${show(k, total[k])}`)
    .join(", ") || "–";
}

async function getJson(path) {
  const r = await fetch(path, {credentials: "same-origin", cache: "no-store"});
  if (r.status === 401) { window.location.assign("/login"); throw new Error("not logged in"); }
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

function showCluster(s) {
  document.getElementById("head-address").textContent = `head ${s.head}`;
  const alive = s.nodes.filter((n) => n.alive);
  document.getElementById("node-count").textContent =
    `${alive.length}` + (alive.length < s.nodes.length ? ` (+${s.nodes.length - alive.length} dead)` : "");
  let cpuUsed = 0, cpuTotal = 0;
  for (const n of alive) { cpuUsed += n.used.CPU || 0; cpuTotal += n.total.CPU || 0; }
  document.getElementById("cpu-usage").textContent = `${num(cpuUsed, 2)} / ${num(cpuTotal, 2)}`;
  fill(document.querySelector("#nodes tbody"), s.nodes, (n) => [
    [n.node_id], [n.address], [n.alive ? "alive" : "dead", n.alive ? "alive" : "dead"],
    [`${num(n.used.CPU || 0, 2)} / ${num(n.total.CPU || 0, 2)}`],
    [resources(n.total, n.used, ["CPU"])], [`${num(n.heartbeat_age_s, 1)} s`],
    [n.num_actors], [n.pid]], "node-row");

  const a = s.actors;
  document.getElementById("actor-count").textContent = num(a.by_state.ALIVE || 0, 0);
  document.getElementById("actor-states").textContent = Object.entries(a.by_state)
    .map(([k, v]) => `${k} ${v}`).join(" · ");
  fill(document.querySelector("#actors tbody"), a.actors, (x) => [
    [x.class_name, "actor-class"], [x.name || ""], [x.state, x.state], [x.node_id || "–"],
    [x.pid || "–"], [x.restarts], [x.actor_id, "muted"]], "actor-row");
  document.getElementById("actors-more").textContent =
    a.total > a.actors.length ? `showing ${a.actors.length} of ${a.total} (all: /api/actors)` : "";

  const t = document.getElementById("task-counts");
  t.replaceChildren(...Object.entries(s.tasks).map(([k, v]) => {
    const span = el("span"); span.append(el("b", v), document.createTextNode(` ${k.toLowerCase().replaceAll("_", " ")}`));
    return span;
  }));
  fill(document.querySelector("#groups tbody"), s.placement_groups, (g) => [
    [g.placement_group_id], [g.name || ""], [g.strategy], [g.state, g.state],
    [g.bundles.map((b) => JSON.stringify(b)).join(" ")], [g.nodes.map((n) => n || "–").join(" ")]],
    "group-row");
  showRunList(s.runs);
}

function showRunList(list) {
  document.getElementById("run-count").textContent = list.length;
  const box = document.getElementById("runs");
  const current = chosenRun || (list[0] && list[0].run_id);
  box.replaceChildren(...list.map((r) => {
    const b = el("button", `${r.info.scheme || "run"} ${r.run_id} · ${r.status}`, r.run_id === current ? "chosen" : "");
    b.type = "button";
    b.addEventListener("click", () => { chosenRun = r.run_id; poll(); });
    return b;
  }));
  document.getElementById("run").hidden = !current;
  return current;
}

async function pollRun(runId) {
  const have = runs.get(runId) || {rows: [], events: [], seq: 0};
  const d = await getJson(`/api/runs/${encodeURIComponent(runId)}?since=${have.seq}`);
  have.rows.push(...d.rows);
  have.events.push(...d.events);
  have.seq = d.seq;
  have.detail = d;
  runs.set(runId, have);
  shownRun = runId;
  showRun(have);
}

function showRun(r) {
  const d = r.detail, info = d.info, last = r.rows[r.rows.length - 1] || {};
  const bytes = (last.bytes_sent || 0) + (last.bytes_received || 0);
  const facts = [
    ["run", d.run_id], ["status", d.status], ["scheme", info.scheme], ["K", info.workers],
    ["trainers now", last.workers], ["round", last.round], ["epoch", num(last.epoch, 2)],
    ["test accuracy", num(last.test_accuracy, 4)], ["test loss", num(last.test_loss, 4)],
    // A language model's rows (apps/lm/metrics.py): its loss in bits per byte, its speed.
    ...(last.tokens === undefined ? [] : [["bits per byte", num(last.bits_per_byte, 3)],
                                         ["tokens/s", num(last.tokens_per_s, 0)]]),
    ["bytes last row", num(bytes, 0)], ["rows", d.rows_received], ["model", info.model],
    ["dataset", info.dataset]];
  document.getElementById("run-info").replaceChildren(...facts.filter(([, v]) => v !== undefined && v !== null)
    .map(([k, v]) => { const s = el("span"); s.append(document.createTextNode(`${k} `), el("b", v, k === "status" ? String(v) : "")); return s; }));
  const xKey = xAxis === "time" ? "time_s" : "epoch";
  const pts = (key, scale) => r.rows.filter((row) => row[key] !== null && row[key] !== undefined && row[xKey] !== null && row[xKey] !== undefined)
    .map((row) => [row[xKey], row[key] * (scale || 1)]);
  chart("chart-accuracy", pts("test_accuracy"), xAxis === "time" ? "s" : "epoch");
  chart("chart-loss", pts("test_loss"), xAxis === "time" ? "s" : "epoch");
  chart("chart-bytes", r.rows.filter((row) => row[xKey] !== undefined && row[xKey] !== null)
    .map((row) => [row[xKey], ((row.bytes_sent || 0) + (row.bytes_received || 0)) / 1e6]), xAxis === "time" ? "s" : "epoch");
  fill(document.querySelector("#events tbody"), r.events.slice().reverse(), (e) => [
    [`${num(e.time_s, 1)} s`], [e.round], [e.kind, `event-kind ${e.kind}`],
    [e.trainer === null || e.trainer === undefined ? "" : e.trainer], [e.node || ""], [e.detail, "detail"]], "event-row");
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function chart(id, points, unit) {
  const box = document.getElementById(id), W = 420, H = 220, L = 48, R = 10, T = 10, B = 28;
  const parts = [svg("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis"}),
                 svg("line", {x1: L, y1: T, x2: L, y2: H - B, class: "axis"})];
  if (points.length) {
    let [x0, x1] = [Math.min(...points.map((p) => p[0])), Math.max(...points.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...points.map((p) => p[1])), Math.max(...points.map((p) => p[1]))];
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
    const py = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    const line = svg("polyline", {class: "curve", "data-points": points.length,
      points: points.map((p) => `${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(" ")});
    parts.push(line);
    if (points.length < 40) for (const p of points) parts.push(svg("circle", {cx: px(p[0]), cy: py(p[1]), r: 2.5, class: "dot"}));
    for (const [y, label] of [[y0, y0], [y1, y1]]) parts.push(svg("text", {x: L - 4, y: py(y) + 4, "text-anchor": "end", class: "tick"}, num(label, 3)));
    const xd = x1 - x0 < 10 ? 2 : 1;   // short runs: more digits, or both ends read the same
    parts.push(svg("text", {x: L, y: H - 8, class: "tick"}, `${num(x0, xd)} ${unit}`));
    parts.push(svg("text", {x: W - R, y: H - 8, "text-anchor": "end", class: "tick"}, `${num(x1, xd)} ${unit}`));
  } else {
    parts.push(svg("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "tick"}, "no points yet"));
  }
  box.replaceChildren(...parts);
}

let busy = false;
async function poll() {
  if (busy) return;
  busy = true;
  const status = document.getElementById("status");
  try {
    const s = await getJson("/api/snapshot");
    showCluster(s);
    const current = chosenRun || (s.runs[0] && s.runs[0].run_id);
    if (current) await pollRun(current);
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    status.className = "status";
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  } catch (err) {
    status.textContent = `no answer from the head: ${err.message}`;
    status.className = "status bad";
  } finally {
    busy = false;
  }
}

function chooseAxis(which) {
  xAxis = which;
  document.getElementById("x-time").classList.toggle("chosen", which === "time");
  document.getElementById("x-epoch").classList.toggle("chosen", which === "epoch");
  const current = runs.get(shownRun);
  if (current) showRun(current);
}

document.getElementById("x-time").addEventListener("click", () => chooseAxis("time"));
document.getElementById("x-epoch").addEventListener("click", () => chooseAxis("epoch"));
poll();
setInterval(poll, POLL_MS);
