/* The tuner dashboard: plain JS, no build step, no dependencies.
 *
 * Hash routes: #/jobs (default), #/jobs/ID, #/workers, #/records?target=..&template=..
 * Every API call sends the token saved in localStorage["tuner_token"] (the header's
 * input, or /?token=XYZ). A page sets body[data-loaded="1"] once its first data has
 * rendered (or its error is shown), so a browser test can wait for it and time it. */
"use strict";

const TOKEN_KEY = "tuner_token";
const JOBS_REFRESH_MS = 2000;
const WORKERS_REFRESH_MS = 2000;
const JOB_REFRESH_MS = 1000;
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

const state = { generation: 0, timer: null, serverSkewS: 0 };
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
  [/^#\/jobs\/(\d+)$/, "job", (m) => jobPage(Number(m[1]))],
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
  const shown = tasks.slice(0, 8).map((t) =>
    h("li", { "data-task-id": t.id, title: `${t.template} ${workloadText(t.args)}` },
      `#${t.id} ${gflops(t.best_gflops)}`));
  if (tasks.length > 8) shown.push(h("li", {}, `… ${tasks.length - 8} more`));
  td.replaceChildren(h("strong", { class: "max" }, gflops(job.best_gflops)),
    tasks.length > 1 ? h("ul", { class: "task-best" }, shown) : "");
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
  const running = !FINAL.includes(job.status);
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
          h("td", { class: "id" }, h("a", { class: "job-link", href: `#/jobs/${job.id}` }, `#${job.id}`)),
          h("td", { class: "status" }), h("td", { class: "target" }), h("td", { class: "tuner" }),
          h("td", { class: "progress" }), h("td", { class: "eta" }), h("td", { class: "best" }),
          h("td", { class: "actions" }));
      }
      if (tr.nextSibling !== before || tr.parentNode !== tbody) tbody.insertBefore(tr, before);
      before = tr;
      tr.dataset.status = job.status;
      const cell = (c) => tr.querySelector(`td.${c}`);
      setCell(cell("status"), job.status);
      cell("status").title = job.error || "";
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

// ---------------------------------------------------------------- #/jobs/ID

const CURVE = { w: 640, h: 240, left: 56, right: 14, top: 14, bottom: 34 };

/** A round number >= value, for an axis maximum. */
function niceCeil(value) {
  if (!(value > 0)) return 1;
  const step = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * step >= value) return m * step;
  return 10 * step;
}

/** The tuning curve: best GFLOP/s so far against trial number (a step line), every
 * measured trial a dot, failed ones red on the axis with their AutoTVM error number. */
function drawCurve(el, points, nTrial) {
  const { w, h: height, left, right, top, bottom } = CURVE;
  // the budget's span, but no wider than twice the trials so far (a 100,000-trial budget
  // would squeeze the first thousand trials against the axis); it widens as they arrive
  const xMax = Math.max(points.length, 1, Math.min(nTrial || 0, Math.max(2 * points.length, 64)));
  const top_ = points.reduce((m, p) => (p.gflops !== null && p.gflops > m ? p.gflops : m), 0);
  const yMax = niceCeil(top_ * 1.05);
  const x = (n) => left + (xMax <= 1 ? 0 : (n - 1) / (xMax - 1)) * (w - left - right);
  const y = (g) => top + (1 - g / yMax) * (height - top - bottom);
  const parts = [];
  // axes, ticks, labels
  parts.push(svg("line", { class: "axis", x1: left, y1: y(0), x2: w - right, y2: y(0) }));
  parts.push(svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: y(0) }));
  for (let i = 0; i <= 4; i++) {
    const g = yMax * i / 4;
    parts.push(svg("line", { class: "grid", x1: left, y1: y(g), x2: w - right, y2: y(g) }));
    parts.push(svg("text", { class: "tick", x: left - 6, y: y(g) + 4, "text-anchor": "end" },
      g >= 100 ? g.toFixed(0) : g.toPrecision(3).replace(/\.?0+$/, "")));
  }
  const xStep = niceCeil(xMax / 6);
  for (let n = 0; n <= xMax; n += xStep) {
    const at = Math.max(n, 1);
    const anchor = n + xStep > xMax ? "end" : "middle";  // the last label stays inside
    parts.push(svg("text", { class: "tick", x: x(at), y: height - bottom + 16, "text-anchor": anchor }, at));
  }
  parts.push(svg("text", { class: "label", x: (left + w - right) / 2, y: height - 4, "text-anchor": "middle" }, "trial"));
  parts.push(svg("text", { class: "label", x: 12, y: (top + height - bottom) / 2, "text-anchor": "middle",
    transform: `rotate(-90 12 ${(top + height - bottom) / 2})` }, "GFLOP/s"));
  // best so far, as a step line from the first working trial to the last trial drawn
  let d = "";
  let best = null;
  for (const p of points) {
    if (p.gflops === null || (best !== null && p.gflops <= best)) continue;
    d += best === null ? `M${x(p.trial).toFixed(1)},${y(p.gflops).toFixed(1)}`
      : `H${x(p.trial).toFixed(1)}V${y(p.gflops).toFixed(1)}`;
    best = p.gflops;
  }
  if (best !== null && points.length) d += `H${x(points[points.length - 1].trial).toFixed(1)}`;
  parts.push(svg("path", { class: "best", d: d || "M0,0", "data-best": best === null ? "" : best }));
  // every trial
  for (const p of points) {
    if (p.error_no === 0 && p.gflops === null) { // worked, but no FLOPs figure to plot
      const dot = svg("circle", { class: "trial unknown", cx: x(p.trial).toFixed(1), cy: y(0).toFixed(1),
        r: 2.5, "data-trial": p.trial, "data-trial-id": p.id });
      dot.append(svg("title", {}, `trial ${p.trial}: ${cost(p.cost)} (GFLOP/s unknown)`));
      parts.push(dot);
    } else if (p.error_no === 0) {
      const dot = svg("circle", { class: "trial", cx: x(p.trial).toFixed(1), cy: y(p.gflops).toFixed(1),
        r: 2.5, "data-trial": p.trial, "data-trial-id": p.id });
      dot.append(svg("title", {}, `trial ${p.trial}: ${gflops(p.gflops)} GFLOP/s (${cost(p.cost)})`));
      parts.push(dot);
    } else {
      const name = ERROR_NAMES[p.error_no] || "ERROR";
      const dot = svg("circle", { class: "trial failed", cx: x(p.trial).toFixed(1), cy: y(0).toFixed(1),
        r: 3, "data-trial": p.trial, "data-trial-id": p.id, "data-error-no": p.error_no });
      dot.append(svg("title", {}, `trial ${p.trial} failed: error ${p.error_no} (${name})`));
      parts.push(dot);
      parts.push(svg("text", { class: "error-no", x: x(p.trial).toFixed(1), y: (y(0) - 5).toFixed(1),
        "text-anchor": "middle", "data-error-no": p.error_no }, p.error_no));
    }
  }
  el.replaceChildren(...parts);
  el.setAttribute("data-points", String(points.length));
  return best;
}

function taskSection(task) {
  const curve = svg("svg", { class: "curve", "data-task-id": task.id, "data-points": 0,
    viewBox: `0 0 ${CURVE.w} ${CURVE.h}`, preserveAspectRatio: "xMinYMin meet", role: "img" });
  return h("section", { class: "task", "data-task-id": task.id },
    h("h3", {}, h("span", { class: "template" }, task.template), " ",
      h("span", { class: "workload" }, workloadText(task.args))),
    h("p", { class: "task-summary" }, h("span", { class: "task-status" }), " · ",
      h("span", { class: "task-trials" }), " · best ", h("span", { class: "task-best" }),
      " GFLOP/s · ", h("span", { class: "task-failed" })),
    curve);
}

function jobPage(jobId) {
  const p = page();
  const root = clone("page-job");
  view().append(root);
  root.querySelector(".job-title").textContent = `Job #${jobId}`;
  const tasks = new Map(); // task id -> {section, points, fetched: trials_done when last fetched}
  let finalSynced = false;

  const fetchTrials = async (task, entry, full) => {
    const last = entry.points.length ? entry.points[entry.points.length - 1].id : null;
    const after = !full && last !== null ? `?after=${last}` : "";
    const page_ = await apiJson(`/api/v1/jobs/${jobId}/tasks/${task.id}/trials${after}`);
    if (p.stale) return;
    entry.points = after ? entry.points.concat(page_.items) : page_.items;
  };

  const refresh = async () => {
    const job = await apiJson(`/api/v1/jobs/${jobId}?curves=false`);
    if (p.stale) return;
    const final = FINAL.includes(job.status);
    root.querySelector(".job-title").textContent = `Job #${job.id} · ${job.target} · ${job.tuner}`;
    const summary = root.querySelector(".job-summary");
    setCell(summary.querySelector(".status"), job.status);
    setCell(summary.querySelector(".progress"),
      `${job.trials_done}/${job.trials_total} trials (${percent(job.progress)})`);
    setCell(summary.querySelector(".eta"), final ? "—" : duration(job.eta_s));
    setCell(summary.querySelector(".best"), gflops(job.best_gflops));
    actionsCell(summary.querySelector(".actions"), job, refresh);
    const error = root.querySelector(".job-error");
    error.hidden = !job.error;
    error.textContent = job.error ? `error: ${job.error}` : "";
    const container = root.querySelector(".tasks");
    const fetches = [];
    // a last full fetch once the job ends: catches a result stored out of id order
    const full = final && !finalSynced;
    for (const task of job.tasks) {
      let entry = tasks.get(task.id);
      if (!entry) {
        entry = { section: taskSection(task), points: [], drawn: -1 };
        tasks.set(task.id, entry);
        container.append(entry.section);
      }
      const s = entry.section;
      setCell(s.querySelector(".task-status"), task.status);
      setCell(s.querySelector(".task-trials"), `${task.trials_done}/${task.n_trial} trials`);
      setCell(s.querySelector(".task-best"), gflops(task.best_gflops));
      if (full || task.trials_done > entry.points.length || entry.drawn < 0) {
        fetches.push(fetchTrials(task, entry, full).then(() => {
          if (p.stale) return;
          if (full || entry.drawn !== entry.points.length) {
            drawCurve(s.querySelector("svg.curve"), entry.points, task.n_trial);
            entry.drawn = entry.points.length;
          }
          const failed = entry.points.filter((pt) => pt.error_no !== 0).length;
          setCell(s.querySelector(".task-failed"), `${failed} failed`);
        }));
      }
    }
    await Promise.all(fetches);
    if (full) finalSynced = true;
    return !(final && finalSynced); // an ended job's curves are complete: stop polling
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

function start() {
  const params = new URLSearchParams(location.search);
  const fromUrl = params.get("token");
  if (fromUrl) {
    setToken(fromUrl);
    // keep it out of the address bar (and of anything copied from it)
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", `${location.pathname}${rest ? `?${rest}` : ""}${location.hash}`);
  }
  const input = document.getElementById("token");
  input.value = getToken();
  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    setToken(input.value.trim());
    route();
  });
  window.addEventListener("hashchange", route);
  route();
}

start();
