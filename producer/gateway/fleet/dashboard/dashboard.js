// The fleet page: polls GET /v1/fleet (the same snapshot as `embedfleet status --json`) and draws it.
// No framework, no build step, nothing from another origin (the page's CSP allows 'self' only).
"use strict";

const KEY = "embedfleet-api-key";
const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
let config = { api_key_required: false };
let timer = null;

function $(id) { return document.getElementById(id); }

function cell(row, text, numeric) {
  const td = row.insertCell();
  td.textContent = text;
  if (numeric) td.className = "num";
  return td;
}

function seconds(value) {
  if (value === null || value === undefined) return "-";
  if (value < 120) return value.toFixed(1) + " s";
  return value < 7200 ? (value / 60).toFixed(0) + " min" : (value / 3600).toFixed(1) + " h";
}

function rate(value) { return value === undefined ? "?" : value.toFixed(1); }

function line(svg, values, width, height) {
  svg.replaceChildren();
  if (!values.length) return;
  const top = Math.max(...values, 1e-9);
  const step = values.length > 1 ? width / (values.length - 1) : width;
  const points = values.map((v, i) => (i * step).toFixed(1) + "," + (height - (v / top) * (height - 4) - 2).toFixed(1));
  const polyline = document.createElementNS(SVG, "polyline");
  polyline.setAttribute("points", points.join(" "));
  svg.appendChild(polyline);
}

// Texts/s per history bucket, oldest first, summed over the workers (their buckets end at the same now).
function fleetHistory(workers) {
  const length = Math.max(0, ...workers.map((w) => (w.texts_history || []).length));
  const sums = new Array(length).fill(0);
  for (const worker of workers) {
    const history = worker.texts_history || [];
    const bucket = worker.history_bucket_s || 10;
    history.forEach((texts, i) => { sums[length - history.length + i] += texts / bucket; });
  }
  return sums;
}

function drawModels(models) {
  const body = $("models").tBodies[0];
  body.replaceChildren();
  for (const model of models) {
    const failures = Object.entries(model.failures_last_hour).map(([code, n]) => code + " " + n).join(", ") || "-";
    model.queues.forEach((queue, i) => {
      const row = body.insertRow();
      cell(row, i ? "" : model.name);
      cell(row, i ? "" : String(model.live_workers), true);
      cell(row, queue.priority);
      cell(row, String(queue.depth), true);
      cell(row, String(queue.in_progress), true);
      cell(row, seconds(queue.oldest_age_s), true);
      cell(row, i ? "" : rate(model.texts_per_s), true);
      cell(row, i || model.cache_hit_rate === null ? "" : (100 * model.cache_hit_rate).toFixed(0) + " %", true);
      cell(row, i ? "" : failures);
    });
  }
}

function drawWorkers(workers) {
  const body = $("workers").tBodies[0];
  body.replaceChildren();
  for (const worker of workers) {
    const row = body.insertRow();
    row.dataset.worker = worker.name;
    cell(row, worker.name);
    cell(row, worker.model || "?");
    cell(row, worker.host || "?");
    cell(row, worker.device || "?");
    cell(row, worker.dtype || "?");
    cell(row, (worker.max_batch_tokens ?? "?") + " tok / " + (worker.max_batch_size ?? "?") + " rows");
    cell(row, worker.state || "?").className = "state-" + (worker.state || "unknown");
    cell(row, worker.current_texts ? worker.current_texts + " texts" : "-", true);
    cell(row, rate(worker.texts_per_s), true);
    const spark = document.createElementNS(SVG, "svg");
    spark.setAttribute("class", "spark");
    spark.setAttribute("viewBox", "0 0 120 20");
    spark.setAttribute("preserveAspectRatio", "none");
    line(spark, worker.texts_history || [], 120, 20);
    row.insertCell().appendChild(spark);
    cell(row, seconds(worker.last_beat_s) + " ago", true);
  }
}

function draw(fleet) {
  $("problem").hidden = true;
  $("fleet").hidden = false;
  drawModels(fleet.models);
  drawWorkers(fleet.workers);
  const total = fleet.models.reduce((sum, m) => sum + m.texts_per_s, 0);
  $("rate").textContent = "(now " + total.toFixed(1) + ")";
  line($("chart"), fleetHistory(fleet.workers), 600, 120);
  $("updated").textContent = fleet.models.length ? "updated " + new Date(fleet.time * 1000).toLocaleTimeString()
    : "no model is served (no live worker)";
}

function problem(text) {
  $("problem").textContent = text;
  $("problem").hidden = false;
}

function askForKey(message) {
  sessionStorage.removeItem(KEY);
  $("fleet").hidden = true;
  $("forget").hidden = true;
  $("login").hidden = false;
  if (message) problem(message);
  $("key").focus();
}

async function refresh() {
  clearTimeout(timer);
  const key = sessionStorage.getItem(KEY);
  if (config.api_key_required && !key) { askForKey(); return; }
  try {
    const answer = await fetch("/v1/fleet", { headers: key ? { Authorization: "Bearer " + key } : {},
                                              cache: "no-store" });
    if (answer.status === 401) { askForKey("That key was refused; enter the gateway's API key."); return; }
    const body = await answer.json();
    if (!answer.ok) problem((body.error && body.error.message) || "the gateway answered " + answer.status);
    else draw(body);
  } catch (err) {
    problem("The gateway is unreachable (" + err.message + "); retrying.");
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

async function start() {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("key").value.trim());
    $("login").hidden = true;
    $("forget").hidden = false;
    refresh();
  });
  $("forget").addEventListener("click", () => askForKey());
  try {
    config = await (await fetch("/dashboard/config.json", { cache: "no-store" })).json();
  } catch (err) {
    problem("The gateway is unreachable (" + err.message + ").");
    return;
  }
  $("forget").hidden = !config.api_key_required;
  refresh();
}

document.addEventListener("DOMContentLoaded", start);
