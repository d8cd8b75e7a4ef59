/* The tuner dashboard: plain JS, no build step, no dependencies.
 *
 * Hash routes: #/jobs (default), #/jobs/ID[/tasks/TASK], #/workers,
 * #/records?target=..&template=..
 * Every API call sends the token saved in localStorage["tuner_token"] (the header's
 * input, or a link /#token=XYZ: a fragment never reaches the server, so the token stays
 * out of its access log; an old /?token=XYZ link still works) as a bearer header. A
 * server without tokens (tuner dashboard) says so at /api/v1/dashboard: the token form
 * hides, and a read-only one offers no cancel. A page sets body[data-loaded="1"] once its
 * first data has rendered (or its error is shown), so a browser test can wait for it. */
"use strict";

const TOKEN_KEY = "tuner_token";
const JOBS_REFRESH_MS = 2000;
const WORKERS_REFRESH_MS = 2000;
const JOB_REFRESH_MS = 1000;
const MODEL_REFRESH_MS = 2000;  // the model view reads all the job's results: half as often
const FINAL = ["done", "cancelled", "failed"];
const ERROR_NAMES = ["NO_ERROR", "INSTANTIATION_ERROR", "COMPILE_HOST", "COMPILE_DEVICE",
  "RUNTIME_DEVICE", "WRONG_ANSWER", "BUILD_TIMEOUT", "RUN_TIMEOUT", "UNKNOWN_ERROR"];
const SVG_NS = "http://www.w3.org/2000/svg";

// ---------------------------------------------------------------- token and API

function getToken() {
  try { return localStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
}

function setToken(token) {
  try { localStorage.setItem(TOKEN_KEY, token); } catch (e) { /* private mode */ }
}

class ApiError extends Error {
  constructor(status, detail) {
    super(status === 401 ? `the server refused the token (${detail}): save a client token above`
      : `${status}: ${detail}`);
    this.status = status;
  }
}

/** fetch() with the bearer token; throws ApiError with the server's detail. */
async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  let response;
  try {
    response = await fetch(path, Object.assign({}, options, { headers }));
  } catch (err) {
    throw new Error(`cannot reach the server (${err.message})`);
  }
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (e) { /* not JSON */ }
    throw new ApiError(response.status, typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return response;
}

async function apiJson(path, options) {
  const response = await api(path, options);
  const body = await response.json();
  // the server's clock, for ages ("3 s ago") that do not depend on the browser's
  const date = Date.parse(response.headers.get("Date") || "");
  state.serverSkewS = Number.isNaN(date) ? 0 : (date - Date.now()) / 1000;
  return body;
}

// ---------------------------------------------------------------- small helpers

/** h("td", {class: "x"}, "text", child...): an element; text is never parsed as HTML. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function svg(tag, attrs, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = String(text);
  return el;
}

/** A chart point's tooltip (its data-tip) becomes a <title> when the pointer first rests
 * on it: made up front, the titles of a 1,000-trial curve and two latency charts would be
 * ~2,800 more nodes (a title and its text each), 40% of a model job's page to lay out. */
function tipOnHover(event) {
  const el = event.target;
  if (el instanceof SVGElement && el.dataset.tip !== undefined && !el.querySelector("title")) {
    el.append(svg("title", {}, el.dataset.tip));
  }
}

function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds) || seconds < 0) return "—";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor(s % 3600 / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d${String(Math.floor(s % 86400 / 3600)).padStart(2, "0")}h`;
}

function gflops(value) {
  return value === null || value === undefined ? "—" : value.toFixed(value >= 100 ? 1 : 2);
}

function percent(value) {
  return value === null || value === undefined ? "—" : `${(value * 100).toFixed(value < 0.1 ? 1 : 0)}%`;
}

function cost(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 1e-3) return `${(seconds * 1e6).toFixed(1)} µs`;
  if (seconds < 1) return `${(seconds * 1e3).toFixed(2)} ms`;
  return `${seconds.toFixed(2)} s`;
}

/** AutoTVM args made short: tensors as shapes (1x64x56x56), lists as 1,1. */
function workloadText(args) {
  return (args || []).map((a) => {
    if (Array.isArray(a) && a.length === 3 && a[0] === "TENSOR") return a[1].join("x");
    if (Array.isArray(a)) return a.join(",");
    return a === null ? "-" : String(a);
  }).join(" ");
}

function knobText(value) {
  return Array.isArray(value) ? `[${value.join(",")}]` : String(value);
}

function nowS() {
  return Date.now() / 1000 + (state.serverSkewS || 0);
}

function setCell(td, text) {
  if (td.textContent !== text) td.textContent = text;
}

// ---------------------------------------------------------------- router

const state = { generation: 0, timer: null, serverSkewS: 0, readOnly: false };
const view = () => document.getElementById("view");

function showError(err) {
  const box = document.getElementById("error");
  if (err) {
    box.textContent = `error: ${err.message || err}`;
    box.hidden = false;
  } else {
    box.hidden = true;
    box.textContent = "";
  }
}

function loaded() {
  document.body.dataset.loaded = "1";
}

/** A page's live handle: stale once another route has rendered. */
function page() {
  const generation = state.generation;
  return {
    get stale() { return generation !== state.generation; },
    /** Run fn now, then every ms after each run ends, until the page is left, fn
     * returns false (nothing will change any more) or the thing is not found (404). */
    poll(fn, ms) {
      const tick = async () => {
        if (this.stale) return;
        let more = true;
        try {
          more = (await fn()) !== false;
          showError(null);
        } catch (err) {
          if (this.stale) return;
          showError(err);
          if (err instanceof ApiError && err.status === 404) more = false;
        }
        if (this.stale) return;
        loaded();
        if (more && ms) state.timer = setTimeout(tick, ms);
      };
      return tick();
    },
  };
}

function clone(templateId) {
  return document.getElementById(templateId).content.firstElementChild.cloneNode(true);
}

const ROUTES = [
  [/^#\/jobs\/(\d+)(?:\/tasks\/(\d+))?$/, "job", (m) => jobPage(Number(m[1]), m[2] ? Number(m[2]) : null)],
  [/^#\/workers$/, "workers", () => workersPage()],
  [/^#\/records(?:\?(.*))?$/, "records", (m) => recordsPage(new URLSearchParams(m[1] || ""))],
  [/^#\/jobs$/, "jobs", () => jobsPage()],
];

function route() {
  state.generation += 1;
  clearTimeout(state.timer);
  document.body.dataset.loaded = "0";
  showError(null);
  const hash = location.hash || "#/jobs";
  for (const [pattern, name, render] of ROUTES) {
    const m = hash.match(pattern);
    if (m) {
      document.body.dataset.page = name;
      for (const a of document.querySelectorAll("nav a")) {
        a.classList.toggle("active", a.dataset.nav === name || (name === "job" && a.dataset.nav === "jobs"));
      }
      view().replaceChildren();
      render(m);
      return;
    }
  }
  location.replace("#/jobs");
}

// ---------------------------------------------------------------- #/jobs

function progressCell(td, job) {
  const text = `${job.trials_done}/${job.trials_total} (${percent(job.progress)})`;
  if (td.dataset.text === text) return;
  td.dataset.text = text;
  td.dataset.progress = String(job.progress);
  td.replaceChildren(
    h("div", { class: "bar" }, h("div", { style: `width:${(job.progress * 100).toFixed(1)}%` })),
    h("span", {}, text));
}

function bestCell(td, job) {
  const tasks = job.tasks || [];
  const text = JSON.stringify([job.best_gflops, tasks.map((t) => t.best_gflops)]);
  if (td.dataset.text === text) return;
  td.dataset.text = text;
  const tuned = tasks.filter((t) => t.best_gflops !== null).length;
  td.replaceChildren(h("strong", { class: "max" }, gflops(job.best_gflops)),
    tasks.length > 1 ? h("div", { class: "task-best" }, `${tuned} of ${tasks.length} tasks measured`) : "");
}

async function cancelJob(button, refresh) {
  button.disabled = true;
  try {
    await api(`/api/v1/jobs/${button.dataset.jobId}/cancel`, { method: "POST" });
    await refresh();
  } catch (err) {
    showError(err);
    button.disabled = false;
  }
}

function actionsCell(td, job, refresh) {
  const running = !FINAL.includes(job.status) && !state.readOnly;
  const button = td.querySelector("button.cancel");
  if (running && !button) {
    td.append(h("button", { class: "cancel", type: "button", "data-job-id": job.id,
      onclick: (e) => cancelJob(e.currentTarget, refresh) }, "Cancel"));
  } else if (!running && button) {
    button.remove();
  }
}

function jobsPage() {
  const p = page();
  const root = clone("page-jobs");
  view().append(root);
  const tbody = root.querySelector("table#jobs tbody");
  const refresh = async () => {
    const jobs = await apiJson("/api/v1/jobs?limit=100");
    if (p.stale) return;
    const rows = new Map([...tbody.children].map((tr) => [tr.dataset.jobId, tr]));
    let before = null;
    for (const job of [...jobs].reverse()) { // newest first: insert each above the last
      let tr = rows.get(String(job.id));
      rows.delete(String(job.id));
      if (!tr) {
        tr = h("tr", { "data-job-id": job.id },
          h("td", { class: "id" }, h("a", { class: "job-link", href: `#/jobs/${job.id}` }, `#${job.id}`),
            job.model ? h("span", { class: "model" }, ` ${job.model}`) : ""),
          h("td", { class: "status" }), h("td", { class: "target" }), h("td", { class: "tuner" }),
          h("td", { class: "progress" }), h("td", { class: "eta" }), h("td", { class: "best" }),
          h("td", { class: "actions" }));
      }
      if (tr.nextSibling !== before || tr.parentNode !== tbody) tbody.insertBefore(tr, before);
      before = tr;
      tr.dataset.status = job.status;
      const cell = (c) => tr.querySelector(`td.${c}`);
      setCell(cell("status"), job.waiting_for_worker ? `${job.status} · waiting for a worker` : job.status);
      cell("status").title = job.error || job.note || "";
      setCell(cell("target"), job.target);
      setCell(cell("tuner"), job.tuner);
      progressCell(cell("progress"), job);
      setCell(cell("eta"), FINAL.includes(job.status) ? "—" : duration(job.eta_s));
      bestCell(cell("best"), job);
      actionsCell(cell("actions"), job, refresh);
    }
    for (const tr of rows.values()) tr.remove();
    root.querySelector(".empty").hidden = jobs.length > 0;
  };
  p.poll(refresh, JOBS_REFRESH_MS);
}

// ---------------------------------------------------------------- charts

const CURVE = { w: 640, h: 250, left: 56, right: 16, top: 14, bottom: 52 };
const LATENCY = { w: 560, h: 220, left: 66, right: 18, top: 16, bottom: 36 };
const SPARK = { w: 120, h: 26 };
const ERROR_DIGIT_GAP = 8;  // px between the error numbers drawn under failed trials

/** A round number >= value, for an axis maximum. */
function niceCeil(value) {
  if (!(value > 0)) return 1;
  const step = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * step >= value) return m * step;
  return 10 * step;
}

/** A whole tick step >= raw: 1, 2, 5, 10, 20, 50, ... (trials are counted, never 1.5). */
function intStep(raw) {
  if (!(raw > 1)) return 1;
  const base = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * base >= raw) return m * base;
  return 10 * base;
}

/** A time tick step in seconds >= raw, one a clock reads easily. */
function timeStep(raw) {
  for (const s of [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400]) {
    if (s >= raw) return s;
  }
  return 86400 * intStep(raw / 86400);
}

function valueTick(g) {
  return g >= 100 ? g.toFixed(0) : g.toPrecision(3).replace(/\.?0+$/, "");
}

/** The tuning curve: best GFLOP/s so far against trial number (a step line), every
 * measured trial a dot. The axes span the trials measured (whole-number ticks) and the
 * GFLOP/s reached; failed trials sit in a lane under the axis, red, with their AutoTVM
 * error number where there is room, and are counted at its start. A task with no
 * working trial draws no GFLOP/s scale, only its failures. */
function drawCurve(el, points) {
  const { w, h: height, left, right, top, bottom } = CURVE;
  const last = points.length ? points[points.length - 1].trial : 0;
  const xMax = Math.max(last, 2);
  const top_ = points.reduce((m, p) => (p.gflops !== null && p.gflops > m ? p.gflops : m), 0);
  const yMax = niceCeil(top_ * 1.05);
  const base = height - bottom;  // the x axis
  const x = (n) => left + (n - 1) / (xMax - 1) * (w - left - right);
  const y = (g) => top + (1 - g / yMax) * (base - top);
  const parts = [];
  parts.push(svg("line", { class: "axis", x1: left, y1: base, x2: w - right, y2: base }));
  parts.push(svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: base }));
  if (top_ > 0) {
    for (let i = 0; i <= 4; i++) {
      const g = yMax * i / 4;
      parts.push(svg("line", { class: "grid", x1: left, y1: y(g), x2: w - right, y2: y(g) }));
      parts.push(svg("text", { class: "tick", x: left - 6, y: y(g) + 4, "text-anchor": "end" }, valueTick(g)));
    }
  } else if (points.length) {
    parts.push(svg("text", { class: "empty-note", x: (left + w - right) / 2, y: (top + base) / 2, "text-anchor": "middle" },
      points.some((p) => p.error_no === 0) ? "GFLOP/s unknown for this template" : "no working trial yet"));
  }
  const step = intStep(xMax / 6);
  const ticks = [1];
  for (let n = step; n <= xMax; n += step) if (n > 1 && n - 1 >= step / 2) ticks.push(n);
  for (const n of ticks) {
    parts.push(svg("line", { class: "axis", x1: x(n), y1: base, x2: x(n), y2: base + 3 }));
    parts.push(svg("text", { class: "tick", x: x(n), y: base + 34, "text-anchor": n === xMax ? "end" : "middle" }, n));
  }
  parts.push(svg("text", { class: "label", x: (left + w - right) / 2, y: height - 3, "text-anchor": "middle" }, "trial"));
  parts.push(svg("text", { class: "label", x: 12, y: (top + base) / 2, "text-anchor": "middle",
    transform: `rotate(-90 12 ${(top + base) / 2})` }, "GFLOP/s"));
  const failedCount = points.filter((p) => p.error_no !== 0).length;
  parts.push(svg("text", { class: "tick failed-label", x: left - 6, y: base + 12, "text-anchor": "end",
    "data-failed": failedCount }, failedCount ? `${failedCount} failed` : ""));
  // best so far, as a step line from the first working trial to the last trial drawn
  let d = "";
  let best = null;
  for (const p of points) {
    if (p.gflops === null || (best !== null && p.gflops <= best)) continue;
    d += best === null ? `M${x(p.trial).toFixed(1)},${y(p.gflops).toFixed(1)}`
      : `H${x(p.trial).toFixed(1)}V${y(p.gflops).toFixed(1)}`;
    best = p.gflops;
  }
  if (best !== null && points.length) d += `H${x(last).toFixed(1)}`;
  parts.push(svg("path", { class: "best", d: d || "M0,0", "data-best": best === null ? "" : best }));
  let lastDigit = -Infinity;
  for (const p of points) {
    const cx = x(p.trial).toFixed(1);
    if (p.error_no === 0 && p.gflops === null) { // worked, but no FLOPs figure to plot
      const dot = svg("circle", { class: "trial unknown", cx, cy: base.toFixed(1),
        r: 2.5, "data-trial": p.trial, "data-trial-id": p.id });
      dot.dataset.tip = `trial ${p.trial}: ${cost(p.cost)} (GFLOP/s unknown)`;
      parts.push(dot);
    } else if (p.error_no === 0) {
      const dot = svg("circle", { class: "trial", cx, cy: y(p.gflops).toFixed(1),
        r: 2.5, "data-trial": p.trial, "data-trial-id": p.id });
      dot.dataset.tip = `trial ${p.trial}: ${gflops(p.gflops)} GFLOP/s (${cost(p.cost)})`;
      parts.push(dot);
    } else {
      const name = ERROR_NAMES[p.error_no] || "ERROR";
      const dot = svg("circle", { class: "trial failed", cx, cy: base + 9,
        r: 3, "data-trial": p.trial, "data-trial-id": p.id, "data-error-no": p.error_no });
      dot.dataset.tip = `trial ${p.trial} failed: error ${p.error_no} (${name})`;
      parts.push(dot);
      if (Number(cx) - lastDigit >= ERROR_DIGIT_GAP) {
        parts.push(svg("text", { class: "error-no", x: cx, y: base + 21, "text-anchor": "middle",
          "data-error-no": p.error_no }, p.error_no));
        lastDigit = Number(cx);
      }
    }
  }
  el.replaceChildren(...parts);
  el.setAttribute("data-points", String(points.length));
  el.setAttribute("data-x-max", String(xMax));
  return best;
}

/** A row's sparkline: the task's best (GFLOP/s, else 1/cost) so far over its trials. */
function drawSpark(el, curve, trials) {
  const { w, h: height } = SPARK;
  const value = (p) => (p.best_gflops !== null ? p.best_gflops : 1 / p.best_cost);
  const n = Math.max(trials, curve.length ? curve[curve.length - 1].trial : 0, 2);
  const top = curve.reduce((m, p) => Math.max(m, value(p)), 0);
  el.setAttribute("data-points", String(curve.length));
  if (!curve.length || !(top > 0)) {
    el.replaceChildren();
    return;
  }
  const x = (t) => 1 + (t - 1) / (n - 1) * (w - 2);
  const y = (v) => height - 2 - v / top * (height - 4);
  let d = "";
  curve.forEach((p, i) => {
    d += i === 0 ? `M${x(p.trial).toFixed(1)},${y(value(p)).toFixed(1)}`
      : `H${x(p.trial).toFixed(1)}V${y(value(p)).toFixed(1)}`;
  });
  d += `H${x(n).toFixed(1)}`;
  el.replaceChildren(svg("path", { class: "spark", d }));
}

/** The model's estimated latency (sum over tasks of best cost x layers) against time
 * since submission or against results stored, as a falling step line from the moment
 * every task had a working trial to now; the default build's estimate a dashed line. */
function drawLatency(el, model, axis) {
  const { w, h: height, left, right, top, bottom } = LATENCY;
  const key = axis === "time" ? "at_s" : "trial";
  const pts = model.curve;
  const end = axis === "time" ? model.elapsed_s : model.trials_done;
  const xMax = Math.max(end, pts.length ? pts[pts.length - 1][key] : 0, axis === "time" ? 1 : 2);
  const highest = pts.reduce((m, p) => Math.max(m, p.latency_s), model.default_latency_s || 0);
  const yMax = niceCeil(highest * 1.08);
  const base = height - bottom;
  const x = (v) => left + v / xMax * (w - left - right);
  const y = (s) => top + (1 - s / yMax) * (base - top);
  const parts = [];
  parts.push(svg("line", { class: "axis", x1: left, y1: base, x2: w - right, y2: base }));
  parts.push(svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: base }));
  if (highest > 0) {
    for (let i = 0; i <= 4; i++) {
      const s = yMax * i / 4;
      parts.push(svg("line", { class: "grid", x1: left, y1: y(s), x2: w - right, y2: y(s) }));
      parts.push(svg("text", { class: "tick", x: left - 6, y: y(s) + 4, "text-anchor": "end" }, i ? cost(s) : "0"));
    }
  }
  const step = axis === "time" ? timeStep(xMax / 5) : intStep(xMax / 6);
  for (let v = 0; v <= xMax + 1e-9; v += step) {
    parts.push(svg("line", { class: "axis", x1: x(v), y1: base, x2: x(v), y2: base + 3 }));
    parts.push(svg("text", { class: "tick", x: x(v), y: base + 16, "text-anchor": v + step > xMax ? "end" : "middle" },
      axis === "time" ? duration(v) : v));
  }
  parts.push(svg("text", { class: "label", x: (left + w - right) / 2, y: height - 3, "text-anchor": "middle" },
    axis === "time" ? "time since submitted" : "trials measured (all tasks)"));
  if (model.default_latency_s) {
    const dy = y(model.default_latency_s);
    parts.push(svg("line", { class: "default", x1: left, y1: dy, x2: w - right, y2: dy,
      "data-latency": model.default_latency_s }));
    parts.push(svg("text", { class: "default-label", x: w - right - 4, y: dy - 4, "text-anchor": "end" },
      `default build ${cost(model.default_latency_s)}`));
  }
  if (pts.length) {
    let d = "";
    pts.forEach((p, i) => {
      d += i === 0 ? `M${x(p[key]).toFixed(1)},${y(p.latency_s).toFixed(1)}`
        : `H${x(p[key]).toFixed(1)}V${y(p.latency_s).toFixed(1)}`;
    });
    d += `H${x(Math.max(end, pts[pts.length - 1][key])).toFixed(1)}`;
    parts.push(svg("path", { class: "estimate", d }));
    for (const p of pts) {
      const dot = svg("circle", { class: "estimate-point", cx: x(p[key]).toFixed(1), cy: y(p.latency_s).toFixed(1), r: 2 });
      dot.dataset.tip = `${cost(p.latency_s)} after ${p.trial} trials, ${duration(p.at_s)}`;
      parts.push(dot);
    }
  } else {
    parts.push(svg("text", { class: "empty-note", x: (left + w - right) / 2, y: (top + base) / 2, "text-anchor": "middle" },
      `starts once every task has a working trial (${model.tasks_measured} of ${model.tasks.length} so far)`));
  }
  el.replaceChildren(...parts);
  el.setAttribute("data-points", String(pts.length));
  el.setAttribute("data-latency", model.latency_s === null ? "" : String(model.latency_s));
}

// ---------------------------------------------------------------- #/jobs/ID

function layerText(task) {
  const names = task.layers || [];
  if (!names.length) return workloadText(task.args);
  return names.length <= 3 ? names.join(", ") : `${names.slice(0, 3).join(", ")} +${names.length - 3}`;
}

function errorText(counts) {
  return Object.entries(counts || {}).sort((a, b) => b[1] - a[1])
    .map(([e, n]) => `${n} × error ${e} (${ERROR_NAMES[e] || "ERROR"})`).join(", ");
}

function taskRow(task, onSelect) {
  const tr = h("tr", { class: "task-row", "data-task-id": task.id, tabindex: 0,
    onclick: () => onSelect(task.id), onkeydown: (e) => { if (e.key === "Enter") onSelect(task.id); } },
  h("td", { class: "layers" }), h("td", { class: "count" }), h("td", { class: "template" }),
  h("td", { class: "trials" }), h("td", { class: "default" }), h("td", { class: "best" }),
  h("td", { class: "speedup" }), h("td", { class: "errors" }), h("td", { class: "share" }),
  h("td", { class: "spark" }));
  tr.querySelector("td.spark").append(svg("svg", { class: "spark", viewBox: `0 0 ${SPARK.w} ${SPARK.h}`,
    width: SPARK.w, height: SPARK.h, "data-points": 0 }));
  return tr;
}

function fillTaskRow(tr, t) {
  const cell = (c) => tr.querySelector(`td.${c}`);
  tr.dataset.status = t.status;
  tr.dataset.share = t.share === null ? "" : String(t.share);
  setCell(cell("layers"), layerText(t));
  cell("layers").title = `${(t.layers || []).join(", ")}\n${t.template} ${workloadText(t.args)}`.trim();
  setCell(cell("count"), `×${t.layer_count}`);
  setCell(cell("template"), t.template);
  setCell(cell("trials"), `${t.trials_done}/${t.n_trial}`);
  setCell(cell("default"), gflops(t.default_gflops));
  setCell(cell("best"), gflops(t.best_gflops));
  setCell(cell("speedup"), t.speedup === null ? "—" : `${t.speedup.toFixed(2)}×`);
  setCell(cell("errors"), String(t.errors));
  cell("errors").title = errorText(t.error_counts);
  tr.classList.toggle("has-errors", t.errors > 0);
  const share = cell("share");
  const text = percent(t.share);
  if (share.dataset.text !== text) {
    share.dataset.text = text;
    share.replaceChildren(h("div", { class: "bar" }, h("div", { style: `width:${((t.share || 0) * 100).toFixed(1)}%` })),
      h("span", {}, text));
  }
  const spark = tr.querySelector("svg.spark");
  const key = `${t.curve.length}/${t.trials_done}`;
  if (spark.dataset.key !== key) {
    spark.dataset.key = key;
    drawSpark(spark, t.curve, t.trials_done);
  }
}

function taskSection(task) {
  const curve = svg("svg", { class: "curve", "data-task-id": task.id, "data-points": 0,
    viewBox: `0 0 ${CURVE.w} ${CURVE.h}`, preserveAspectRatio: "xMinYMin meet", role: "img" });
  return h("section", { class: "task", "data-task-id": task.id },
    h("h3", {}, h("span", { class: "task-layers" }, (task.layers || []).join(", ")), " ",
      h("span", { class: "template" }, task.template), " ",
      h("span", { class: "workload" }, workloadText(task.args))),
    h("p", { class: "task-summary" }, h("span", { class: "task-status" }), " · ",
      h("span", { class: "task-trials" }), " · best ", h("span", { class: "task-best" }),
      " GFLOP/s · ", h("span", { class: "task-failed" })),
    curve);
}

function jobPage(jobId, wantedTask) {
  const p = page();
  const root = clone("page-job");
  view().append(root);
  root.querySelector(".job-title").textContent = `Job #${jobId}`;
  const tbody = root.querySelector("table#tasks tbody");
  const detail = root.querySelector(".task-detail");
  let selected = wantedTask;  // the task whose full curve shows; null: the largest share
  let shown = null;  // {id, section, points, drawn}
  let lastJob = null;
  let model = null;
  let modelAt = 0;
  let finalSynced = false;

  const fetchTrials = async (task, entry, full) => {
    const last = entry.points.length ? entry.points[entry.points.length - 1].id : null;
    const after = !full && last !== null ? `&after=${last}` : "";
    // the chart needs no record lines: most of the page's bytes and of the server's time
    const page_ = await apiJson(`/api/v1/jobs/${jobId}/tasks/${task.id}/trials?records=false${after}`);
    if (p.stale || shown !== entry) return;
    const lastNow = entry.points.length ? entry.points[entry.points.length - 1].id : null;
    if (after && lastNow !== last) return;  // another fetch extended it meanwhile
    entry.points = after ? entry.points.concat(page_.items) : page_.items;
    if (full || entry.drawn !== entry.points.length) {
      drawCurve(entry.section.querySelector("svg.curve"), entry.points);
      entry.drawn = entry.points.length;
    }
    const failed = entry.points.filter((pt) => pt.error_no !== 0).length;
    setCell(entry.section.querySelector(".task-failed"), `${failed} failed`);
  };

  // the selected task's section: made when the selection changes, its curve extended
  const showTask = (task, full) => {
    if (!shown || shown.id !== task.id) {
      shown = { id: task.id, section: taskSection(task), points: [], drawn: -1 };
      detail.replaceChildren(shown.section);
    }
    const s = shown.section;
    setCell(s.querySelector(".task-status"), task.status);
    setCell(s.querySelector(".task-trials"), `${task.trials_done}/${task.n_trial} trials`);
    setCell(s.querySelector(".task-best"), gflops(task.best_gflops));
    if (full || task.trials_done > shown.points.length || shown.drawn < 0) {
      return fetchTrials(task, shown, full);
    }
    return null;
  };

  const select = (taskId) => {
    selected = taskId;
    history.replaceState(null, "", `#/jobs/${jobId}/tasks/${taskId}`);
    for (const tr of tbody.children) tr.classList.toggle("selected", Number(tr.dataset.taskId) === taskId);
    const task = lastJob && lastJob.tasks.find((t) => t.id === taskId);
    if (task) {
      const fetching = showTask(task, false);
      if (fetching) fetching.catch(showError);
    }
  };

  const renderModel = (job) => {
    const latency = root.querySelector("section.latency");
    latency.hidden = !job.model;
    if (job.model) {
      setCell(latency.querySelector(".latency-now"), model.latency_s === null ? "—" : cost(model.latency_s));
      const parts = [];
      if (model.default_latency_s) parts.push(`default build ${cost(model.default_latency_s)}`);
      if (model.speedup) parts.push(`${model.speedup.toFixed(2)}× faster than the default build`);
      parts.push(`${model.tasks_measured} of ${model.tasks.length} tasks measured`);
      parts.push(`${model.trials_done} trials`);
      setCell(latency.querySelector(".latency-summary"), parts.join(" · "));
      for (const el of latency.querySelectorAll("svg.latency")) drawLatency(el, model, el.dataset.axis);
    }
    const failures = root.querySelector(".job-failures");
    const text = errorText(model.error_counts);
    failures.hidden = !text;
    setCell(failures, text ? `failed trials: ${text}` : "");
    // rows in the model view's order: largest share of the latency first
    const rows = new Map([...tbody.children].map((tr) => [Number(tr.dataset.taskId), tr]));
    let before = null;
    for (const t of [...model.tasks].reverse()) {
      let tr = rows.get(t.id);
      rows.delete(t.id);
      if (!tr) tr = taskRow(t, select);
      if (tr.nextSibling !== before || tr.parentNode !== tbody) tbody.insertBefore(tr, before);
      before = tr;
      fillTaskRow(tr, t);
    }
    for (const tr of rows.values()) tr.remove();
    root.querySelector("table#tasks").dataset.tasks = String(model.tasks.length);
  };

  const refresh = async () => {
    const now = Date.now();
    const modelFinal = model && FINAL.includes(model.status);
    const wantModel = !model || (!modelFinal && now - modelAt >= MODEL_REFRESH_MS - 100);
    const [job, fresh] = await Promise.all([
      apiJson(`/api/v1/jobs/${jobId}?curves=false`),
      wantModel ? apiJson(`/api/v1/jobs/${jobId}/model`) : Promise.resolve(null)]);
    if (p.stale) return;
    lastJob = job;
    if (fresh) {
      model = fresh;
      modelAt = now;
    }
    const final = FINAL.includes(job.status);
    root.querySelector(".job-title").textContent =
      `Job #${job.id}${job.model ? ` · ${job.model}` : ""} · ${job.target} · ${job.tuner}`;
    const summary = root.querySelector(".job-summary");
    setCell(summary.querySelector(".status"), job.status);
    setCell(summary.querySelector(".progress"),
      `${job.trials_done}/${job.trials_total} trials (${percent(job.progress)})`);
    setCell(summary.querySelector(".eta"), final ? "—" : duration(job.eta_s));
    setCell(summary.querySelector(".best"), gflops(job.best_gflops));
    actionsCell(summary.querySelector(".actions"), job, refresh);
    const waiting = root.querySelector(".job-waiting");
    waiting.hidden = !job.waiting_for_worker;
    if (job.waiting_for_worker && waiting.dataset.target !== job.target) {
      waiting.dataset.target = job.target;
      waiting.replaceChildren("waiting for a worker for ", h("code", {}, job.target),
        job.note ? h("span", { class: "note" }, ` (${job.note})`) : "");
    }
    const error = root.querySelector(".job-error");
    error.hidden = !job.error;
    setCell(error, job.error ? `error: ${job.error}` : "");
    if (selected === null || !job.tasks.some((t) => t.id === selected)) {
      selected = model.tasks.length ? model.tasks[0].id : job.tasks[0].id;
    }
    // a last full fetch once the job ends: catches a result stored out of id order
    const full = final && !finalSynced;
    const task = job.tasks.find((t) => t.id === selected);
    // the task's trials are asked for first: the server reads them while the table draws
    const fetching = task ? showTask(task, full) : null;
    try {
      if (fresh) renderModel(job);
      for (const tr of tbody.children) tr.classList.toggle("selected", Number(tr.dataset.taskId) === selected);
    } finally {
      if (fetching) await fetching;  // its failure, not an unhandled rejection, reaches poll
    }
    if (full) finalSynced = true;
    // an ended job's figures are complete: stop polling once they are all read
    return !(final && finalSynced && FINAL.includes(model.status));
  };
  p.poll(refresh, JOB_REFRESH_MS);
}

// ---------------------------------------------------------------- #/workers

function workersPage() {
  const p = page();
  const root = clone("page-workers");
  view().append(root);
  const tbody = root.querySelector("table#workers tbody");
  const refresh = async () => {
    const workers = await apiJson("/api/v1/workers");
    if (p.stale) return;
    const now = nowS();
    const rows = new Map([...tbody.children].map((tr) => [tr.dataset.workerId, tr]));
    let before = null;
    for (const w of [...workers].reverse()) {
      let tr = rows.get(String(w.id));
      rows.delete(String(w.id));
      if (!tr) {
        tr = h("tr", { "data-worker-id": w.id },
          h("td", { class: "id" }, w.id), h("td", { class: "name" }), h("td", { class: "target" }),
          h("td", { class: "device" }), h("td", { class: "heartbeat" }), h("td", { class: "state" }),
          h("td", { class: "rate" }), h("td", { class: "errors" }), h("td", { class: "done" }));
      }
      if (tr.nextSibling !== before || tr.parentNode !== tbody) tbody.insertBefore(tr, before);
      before = tr;
      tr.classList.toggle("alive", w.alive);
      tr.classList.toggle("lost", !w.alive);
      const cell = (c) => tr.querySelector(`td.${c}`);
      setCell(cell("name"), w.name);
      setCell(cell("target"), w.target);
      setCell(cell("device"), w.device);
      setCell(cell("heartbeat"), `${duration(Math.max(now - w.last_heartbeat, 0))} ago`);
      cell("heartbeat").dataset.ts = String(w.last_heartbeat);
      setCell(cell("state"), w.alive ? "alive" : "lost");
      setCell(cell("rate"), w.trials_per_minute.toFixed(1));
      setCell(cell("errors"), percent(w.error_rate));
      setCell(cell("done"), String(w.trials_done));
    }
    for (const tr of rows.values()) tr.remove();
    root.querySelector(".empty").hidden = workers.length > 0;
  };
  p.poll(refresh, WORKERS_REFRESH_MS);
}

// ---------------------------------------------------------------- #/records

const RECORDS_PAGE = 100;

async function downloadLog(event) {
  event.preventDefault();
  const a = event.currentTarget;
  try {
    const response = await api(a.getAttribute("href"));
    const url = URL.createObjectURL(await response.blob());
    const link = h("a", { href: url, download: a.getAttribute("download") || "pretuned.log" });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (err) {
    showError(err);
  }
}

function recordsPage(params) {
  const p = page();
  const root = clone("page-records");
  view().append(root);
  const form = root.querySelector("form#records-search");
  const target = (params.get("target") || "").trim();
  const offset = Math.max(Number(params.get("offset")) || 0, 0);
  form.elements.target.value = target;
  form.elements.template.value = params.get("template") || "";
  form.elements.workload.value = params.get("workload") || "";
  form.elements.best.checked = params.get("best") !== "0";
  const go = (extra) => {
    const q = new URLSearchParams();
    for (const name of ["target", "template", "workload"]) {
      const v = form.elements[name].value.trim();
      if (v) q.set(name, v);
    }
    if (!form.elements.best.checked) q.set("best", "0");
    for (const [k, v] of Object.entries(extra || {})) if (v) q.set(k, v);
    const hash = `#/records${q.toString() ? `?${q}` : ""}`;
    if (location.hash === hash) route(); else location.hash = hash;
  };
  form.addEventListener("submit", (e) => { e.preventDefault(); go(); });

  const link = root.querySelector("a.download-log");
  if (target) {
    link.href = `/api/v1/logs/${encodeURIComponent(target)}`;
    link.setAttribute("download", `${target.replace(/[^A-Za-z0-9._=-]+/g, "_")}.log`);
    link.textContent = `Download the pretuned log for ${target}`;
    link.hidden = false;
    link.addEventListener("click", downloadLog);
  }
  const search = async () => {
    const q = new URLSearchParams();
    for (const name of ["target", "template", "workload"]) {
      const v = (params.get(name) || "").trim();
      if (v) q.set(name, v);
    }
    q.set("best", params.get("best") === "0" ? "false" : "true");
    q.set("limit", String(RECORDS_PAGE));
    q.set("offset", String(offset));
    const answer = await apiJson(`/api/v1/records/search?${q}`);
    if (p.stale) return;
    const tbody = root.querySelector("table#records tbody");
    tbody.replaceChildren(...answer.items.map((r) => h("tr", { class: "record", "data-record-id": r.id },
      h("td", { class: "workload", title: r.workload_key }, workloadText(r.args)),
      h("td", { class: "template" }, r.template),
      h("td", { class: "target" }, r.target),
      h("td", { class: "gflops" }, r.error_no === 0 ? gflops(r.gflops) : `error ${r.error_no}`),
      h("td", { class: "cost" }, cost(r.cost)),
      h("td", { class: "knobs", title: `config index ${r.config.index}` },
        Object.entries(r.knobs).map(([k, v]) => h("code", { class: "knob", "data-knob": k }, `${k}=${knobText(v)}`))),
      h("td", { class: "worker" }, r.worker || "—"))));
    const shown = answer.items.length;
    root.querySelector(".records-summary").textContent = shown
      ? `${offset + 1}–${offset + shown} of ${answer.total} ${params.get("best") === "0" ? "records" : "best records (one per device model and workload)"}`
      : "no records match";
    const prev = root.querySelector(".pager .prev");
    const next = root.querySelector(".pager .next");
    prev.hidden = offset === 0;
    next.hidden = offset + shown >= answer.total;
    prev.onclick = (e) => { e.preventDefault(); go({ offset: String(Math.max(offset - RECORDS_PAGE, 0)) }); };
    next.onclick = (e) => { e.preventDefault(); go({ offset: String(offset + RECORDS_PAGE) }); };
    prev.href = next.href = "#";
  };
  p.poll(search, 0);
}

// ---------------------------------------------------------------- start

/** The token a link carries, kept out of the address bar: #token=XYZ[&/route] (a
 * fragment, never sent to the server), or an old link's ?token=XYZ. */
function takeTokenFromUrl() {
  const params = new URLSearchParams(location.search);
  const fromQuery = params.get("token");
  const m = location.hash.match(/^#token=([^&]*)(?:&(.*))?$/);
  const token = m ? decodeURIComponent(m[1]) : fromQuery;
  if (!token) return;
  setToken(token);
  params.delete("token");
  const rest = params.toString();
  const hash = m ? (m[2] ? `#${m[2]}` : "#/jobs") : location.hash;
  history.replaceState(null, "", `${location.pathname}${rest ? `?${rest}` : ""}${hash}`);
}

/** What this server asks of the page: a token or none (tuner dashboard), read-only. */
async function serverInfo() {
  try {
    const response = await fetch("/api/v1/dashboard");
    if (response.ok) return await response.json();
  } catch (err) { /* an older server: as a fleet's */ }
  return { token_required: true, read_only: false };
}

async function start() {
  takeTokenFromUrl();
  const input = document.getElementById("token");
  input.value = getToken();
  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    setToken(input.value.trim());
    route();
  });
  window.addEventListener("hashchange", route);
  document.addEventListener("mouseover", tipOnHover);
  // asked alongside the first page's data, not before it: a page load waits for neither
  const info = serverInfo();
  route();
  const answer = await info;
  state.readOnly = answer.read_only;
  document.getElementById("token-form").hidden = !answer.token_required;
  document.body.dataset.readOnly = answer.read_only ? "1" : "0";
  if (answer.read_only) for (const button of document.querySelectorAll("button.cancel")) button.remove();
}

start();
