// The page `ebb serve` answers at / (server_web.cpp): one self-contained
// HTML document, no external resources. It draws the residency map (a row
// per layer: its weight unit, then its KV chunks, coloured by state, as
// chat's /memory prints it), memory by state over the last ten minutes
// (a stacked chart on a canvas, from /v1/memory/history), tok/s and the
// queues, refreshed every second, and has buttons for evict, restore, trim
// and the limit. A chat panel streams answers from /v1/chat/completions
// with the base model, a loaded adapter (/v1/models) or an agent
// (/v1/agents, when the server has agents) while the map keeps updating;
// /?demo=TEXT sends TEXT once the page has loaded (tests, screenshots).
// A learning panel shows what GET /v1/learning reports (traces, feedback,
// rewards, judge calls, train steps, versions with their gates, the
// published version per adapter) with a Roll back button per earlier
// version (POST /v1/learning/rollback), or says that learning is off;
// /?click=ID clicks the element ID once the panel has drawn it (tests).
//
// The page is static and holds no data; with --api-key its script sends
// the key as "Authorization: Bearer KEY", taken from the URL's fragment
// (/#key=KEY: a fragment is never sent to the server, so it stays out of
// logs) or asked for once with a prompt, and kept in sessionStorage.
#pragma once

namespace ebb::serve {

inline constexpr const char kWebPage[] = R"EBBPAGE(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>ebb serve</title>
<style>
  :root { --bg:#fafafa; --fg:#222; --muted:#666; --line:#ddd; --card:#fff;
          --resident:#4e9f3d; --compressed:#e9b000; --stored:#d9534f; --stored-compressed:#8e5ea2; --lost:#111; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; background: var(--bg); color: var(--fg); }
  header { display: flex; align-items: baseline; gap: 16px; padding: 12px 20px; border-bottom: 1px solid var(--line); background: var(--card); }
  header h1 { font-size: 18px; margin: 0; }
  #model { color: var(--muted); }
  #status { margin-left: auto; font-size: 12px; color: var(--muted); }
  #status.err { color: var(--stored); font-weight: 600; }
  main { padding: 12px 20px; display: grid; gap: 12px; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); }
  section { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: 10px 14px; }
  section.wide { grid-column: 1 / -1; }
  h2 { font-size: 13px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); margin: 0 0 8px; }
  .stats { display: flex; flex-wrap: wrap; gap: 8px 24px; }
  .stat b { display: block; font-size: 20px; font-variant-numeric: tabular-nums; }
  .stat span { font-size: 12px; color: var(--muted); }
  #residency { font: 12px/1 ui-monospace, SFMono-Regular, Menlo, monospace; max-height: 420px; overflow: auto; }
  .row { display: flex; align-items: center; gap: 6px; margin: 2px 0; }
  .row .name { width: 34px; color: var(--muted); }
  .cells { display: flex; flex-wrap: wrap; gap: 1px; }
  .cell { display: inline-block; width: 10px; height: 12px; border-radius: 2px; }
  .cell.w { width: 16px; margin-right: 6px; outline: 1px solid #0003; }
  .cell[data-state="resident"] { background: var(--resident); }
  .cell[data-state="compressed"] { background: var(--compressed); }
  .cell[data-state="stored"] { background: var(--stored); }
  .cell[data-state="stored-compressed"] { background: var(--stored-compressed); }
  .cell[data-state="lost"] { background: var(--lost); }
  .legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 12px; color: var(--muted); margin: 6px 0; }
  .legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; vertical-align: -1px; }
  canvas { width: 100%; display: block; }
  .controls { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; }
  button, select, input { font: inherit; padding: 4px 10px; border: 1px solid #bbb; border-radius: 4px; background: #fff; }
  button:hover { background: #f0f0f0; }
  input { width: 110px; }
  #report { font: 12px ui-monospace, monospace; color: var(--muted); white-space: pre-wrap; margin-top: 6px; min-height: 1.4em; }
  table.bytes { border-collapse: collapse; font-variant-numeric: tabular-nums; }
  table.bytes td { padding: 1px 12px 1px 0; }
  table.bytes td:nth-child(2) { text-align: right; }
  #chat-log { max-height: 320px; min-height: 60px; overflow: auto; display: flex; flex-direction: column; gap: 6px; margin: 8px 0; }
  .msg { padding: 6px 10px; border-radius: 6px; white-space: pre-wrap; max-width: 90%; }
  .msg.user { align-self: flex-end; background: #e7f0fb; }
  .msg.assistant { align-self: flex-start; background: #f1f1f1; }
  .msg.assistant.streaming::after { content: "▍"; color: var(--muted); }
  .msg.failed { background: #fbe9e9; color: var(--stored); }
  #chat-form textarea { flex: 1; min-width: 200px; font: inherit; padding: 6px 10px; border: 1px solid #bbb; border-radius: 4px; resize: vertical; }
  #chat-stats { font-size: 12px; color: var(--muted); min-height: 1.4em; }
  table.versions { border-collapse: collapse; font-variant-numeric: tabular-nums; font-size: 13px; margin-top: 8px; }
  table.versions th, table.versions td { padding: 2px 10px 2px 0; text-align: left; }
  table.versions th { color: var(--muted); font-weight: 500; }
  table.versions tr[data-current="1"] td { font-weight: 600; }
  .gate-passed, .gate-off, .gate-no_heldout { color: var(--resident); }
  .gate-rejected { color: var(--stored); }
  #l-empty { color: var(--muted); }
</style>
</head>
<body>
<header><h1>ebb serve</h1><span id="model"></span><span id="status">connecting to the server…</span>
<form id="keyform" hidden><input id="key" type="password" placeholder="API key" autocomplete="off"><button>Use key</button></form></header>
<main>
  <section class="wide" id="chat-panel">
    <h2>Chat</h2>
    <div class="controls">
      <label>with <select id="chat-model"><option value="">(the base model)</option></select></label>
      <button id="chat-new" type="button">New chat</button>
    </div>
    <div id="chat-log" aria-live="polite"></div>
    <form id="chat-form" class="controls">
      <textarea id="chat-input" rows="2" placeholder="Message (Enter sends, Shift+Enter starts a new line)"></textarea>
      <button id="chat-send">Send</button>
      <button id="chat-stop" type="button" disabled>Stop</button>
    </form>
    <div id="chat-stats"></div>
  </section>
  <section class="wide" id="learning-panel">
    <h2>Learning</h2>
    <div id="learning" data-enabled="" data-updates="0">
      <div id="l-empty">asking the server…</div>
      <div id="l-body" hidden>
        <div class="stats">
          <div class="stat"><b id="l-traces">–</b><span>traces</span></div>
          <div class="stat"><b id="l-feedback">–</b><span>feedback</span></div>
          <div class="stat"><b id="l-rewards">–</b><span>rewards / samples</span></div>
          <div class="stat"><b id="l-judge">–</b><span>judge calls / failures</span></div>
          <div class="stat"><b id="l-steps">–</b><span>train steps</span></div>
          <div class="stat"><b id="l-versions">–</b><span>versions committed / published / rejected</span></div>
          <div class="stat"><b id="l-rollbacks">–</b><span>rollbacks</span></div>
        </div>
        <table class="versions" id="l-published"></table>
        <table class="versions" id="l-table"></table>
        <div id="l-report"></div>
      </div>
    </div>
  </section>
  <section class="wide">
    <h2>Now</h2>
    <div class="stats">
      <div class="stat"><b id="s-toks">–</b><span>tok/s (last second)</span></div>
      <div class="stat"><b id="s-ema">–</b><span>decode tok/s (EMA)</span></div>
      <div class="stat"><b id="s-running">–</b><span>running</span></div>
      <div class="stat"><b id="s-waiting">–</b><span>waiting (fg / bg)</span></div>
      <div class="stat"><b id="s-ram">–</b><span>in RAM</span></div>
      <div class="stat"><b id="s-stored">–</b><span>on storage</span></div>
      <div class="stat"><b id="s-limit">–</b><span>memory limit</span></div>
      <div class="stat"><b id="s-evictions">–</b><span>evictions / restores</span></div>
    </div>
  </section>
  <section>
    <h2>Residency: a row per layer, its weights (W) then its KV chunks</h2>
    <div class="legend">
      <span><i style="background:var(--resident)"></i>resident</span>
      <span><i style="background:var(--compressed)"></i>compressed</span>
      <span><i style="background:var(--stored)"></i>stored</span>
      <span><i style="background:var(--stored-compressed)"></i>stored compressed</span>
      <span><i style="background:var(--lost)"></i>lost</span>
    </div>
    <div id="residency" data-updates="0"></div>
  </section>
  <section>
    <h2>Memory by category</h2>
    <table class="bytes" id="bytes"></table>
    <h2 style="margin-top:12px">Actions</h2>
    <div class="controls">
      <button id="b-evict25">Evict 25%</button>
      <button id="b-evict50">Evict 50%</button>
      <button id="b-restore">Restore</button>
      <select id="trim-level">
        <option value="running_moderate">running_moderate (5)</option>
        <option value="running_low">running_low (10)</option>
        <option value="running_critical">running_critical (15)</option>
        <option value="ui_hidden">ui_hidden (20)</option>
        <option value="background">background (40)</option>
        <option value="moderate">moderate (60)</option>
        <option value="complete">complete (80)</option>
      </select>
      <button id="b-trim">Trim</button>
      <input id="limit" placeholder="512MiB | off">
      <button id="b-limit">Set limit</button>
    </div>
    <div id="report"></div>
  </section>
  <section class="wide">
    <h2>Memory by state (up to the last ten minutes)</h2>
    <div class="legend" id="chart-legend"></div>
    <canvas id="chart" height="240"></canvas>
  </section>
  <section class="wide">
    <h2>Tokens per second and queue</h2>
    <canvas id="load" height="110"></canvas>
  </section>
</main>
<script>
"use strict";
(function () {
  // The key: from the fragment (#key=...), else this tab's sessionStorage,
  // else typed into the header's form when a route answers 401 (no modal
  // prompt: it would block the page's timers).
  const frag = new URLSearchParams(location.hash.slice(1));
  let key = frag.get("key") || sessionStorage.getItem("ebb-key") || "";
  if (frag.get("key")) sessionStorage.setItem("ebb-key", key);
  const $ = (id) => document.getElementById(id);
  $("keyform").onsubmit = (ev) => {
    ev.preventDefault();
    key = $("key").value.trim();
    sessionStorage.setItem("ebb-key", key);
    $("keyform").hidden = true;
    loadChoices().catch(() => {});
    tick();
    tickLearning();
  };

  function auth(headers) {
    if (key) headers["Authorization"] = "Bearer " + key;
    return headers;
  }

  async function api(path, body) {
    const headers = auth({});
    const init = { headers, cache: "no-store" };
    if (body !== undefined) {
      init.method = "POST";
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    if (r.status === 401) {
      $("keyform").hidden = false;
      throw new Error(key ? "the API key was refused: enter the right one" : "this server needs its API key: enter it");
    }
    const j = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error((j.error && j.error.message) || ("HTTP " + r.status));
    return j;
  }

  function bytes(b) {
    if (b === undefined || b === null) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, v = b;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; ++i; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : 1)) + " " + u[i];
  }
  const STATE = { "#": "resident", "c": "compressed", "s": "stored", "z": "stored-compressed", "!": "lost" };

  function cell(state, wide, title) {
    const s = document.createElement("span");
    s.className = wide ? "cell w" : "cell";
    s.dataset.state = state;
    s.title = title;
    return s;
  }

  function drawResidency(m) {
    const box = $("residency");
    const frag = document.createDocumentFragment();
    if (!m.elastic) {
      box.textContent = "Elastic memory is off (budget mode): weights stream, nothing is evicted.";
      return;
    }
    for (const L of m.layers) {
      const row = document.createElement("div");
      row.className = "row";
      row.dataset.layer = L.layer;
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = "L" + String(L.layer).padStart(2, "0");
      row.appendChild(name);
      const cells = document.createElement("span");
      cells.className = "cells";
      cells.appendChild(cell(L.weights || "resident", true,
          "layer " + L.layer + " weights: " + L.weights + " (" + bytes(L.weights_bytes) + " in RAM)"));
      const kv = L.kv || "";
      for (let i = 0; i < kv.length; ++i) {
        const st = STATE[kv[i]] || "lost";
        cells.appendChild(cell(st, false, "layer " + L.layer + " KV chunk " + i + ": " + st));
      }
      row.appendChild(cells);
      frag.appendChild(row);
    }
    box.replaceChildren(frag);
    box.dataset.updates = String(Number(box.dataset.updates) + 1);
  }

  function drawBytes(m) {
    const f = m.footprint;
    const rows = [["weights (resident)", f.weights], ["globals (embedding, head)", f.globals], ["KV (resident)", f.kv],
                  ["compressed KV", f.compressed], ["scratch", f.scratch], ["I/O buffers", f.io_buffers],
                  ["adapters", f.adapters], ["training", f.training], ["total in RAM", f.total],
                  ["weights on storage", f.weights_stored], ["KV on storage", f.kv_stored]];
    const t = $("bytes");
    t.replaceChildren();
    for (const [n, b] of rows) {
      const tr = t.insertRow();
      tr.insertCell().textContent = n;
      tr.insertCell().textContent = bytes(b);
      if (n === "total in RAM") tr.style.fontWeight = "600";
    }
    $("s-ram").textContent = bytes(f.total);
    $("s-stored").textContent = bytes(f.weights_stored + f.kv_stored);
    $("s-limit").textContent = m.elastic ? (m.memory_limit ? bytes(m.memory_limit) : "none") : "off";
    $("s-evictions").textContent = m.counters.evictions + " / " + m.counters.restores;
  }

  // Memory by state, stacked bottom to top; what is on storage is drawn
  // above the RAM total, hatched, since it is not in RAM.
  const SERIES = [
    ["globals", "#76b7b2", (s) => s.globals],
    ["weights", "#4e79a7", (s) => s.weights],
    ["KV", "#59a14f", (s) => s.kv],
    ["compressed KV", "#e9b000", (s) => s.compressed],
    ["working (scratch, I/O, adapters, training)", "#bab0ac", (s) => s.other],
    ["on storage (not in RAM)", "#d9534f", (s) => s.kv_stored + s.weights_stored],
  ];
  (function legend() {
    const l = $("chart-legend");
    for (const [n, c] of SERIES) {
      const s = document.createElement("span");
      const i = document.createElement("i");
      i.style.background = c;
      s.appendChild(i);
      s.appendChild(document.createTextNode(n));
      l.appendChild(s);
    }
  })();

  let history = [];
  let lastT = -1;
  const WINDOW_S = 600;

  function setupCanvas(c) {
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth || 1000, h = Number(c.getAttribute("height"));
    if (c.width !== Math.round(w * dpr)) { c.width = Math.round(w * dpr); c.height = Math.round(h * dpr); c.style.height = h + "px"; }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    return [g, w, h];
  }

  // The time axis spans the history held, from a minute up to ten.
  function span() {
    if (history.length < 2) return 60;
    return Math.min(WINDOW_S, Math.max(60, history[history.length - 1].t - history[0].t));
  }

  // Four steps of 1, 2, 2.5 or 5 times a power of `base` (1024 for bytes,
  // 10 otherwise) from 0 to at least `max`: labels that are all different
  // and round ("0 B, 256 KiB, 512 KiB, ..." rather than "0 B, 1 B, 1 B, 1 B").
  function niceScale(max, base) {
    let unit = 1;
    while (max / unit >= base) unit *= base;
    const raw = max / unit / 4;
    let mag = 1;
    while (mag * 10 <= raw) mag *= 10;
    while (mag > raw && mag > 1e-6) mag /= 10;
    let step = mag;
    for (const f of [1, 2, 2.5, 5, 10]) { step = f * mag; if (step >= raw) break; }
    return { top: step * unit * 4, step: step * unit };
  }

  function axes(g, w, h, pad, top, label, sp, step) {
    g.strokeStyle = "#ddd"; g.fillStyle = "#666"; g.font = "11px system-ui, sans-serif"; g.lineWidth = 1;
    const labels = [];
    for (let k = 0; k <= 4; ++k) {
      const y = h - pad.b - (h - pad.t - pad.b) * k / 4;
      g.beginPath(); g.moveTo(pad.l, y); g.lineTo(w - pad.r, y); g.stroke();
      labels.push(label(step * k));
      g.fillText(labels[k], 4, y + 4);
    }
    g.canvas.dataset.ylabels = labels.join("|");  // what the axis says, for tests
    const tstep = sp <= 120 ? 15 : sp <= 300 ? 60 : 120;
    for (let s = 0; s <= sp + 0.001; s += tstep) {
      const x = pad.l + (w - pad.l - pad.r) * (1 - s / sp);
      const t = s === 0 ? "now" : "-" + (s < 60 || s % 60 ? s + " s" : s / 60 + " min");
      g.fillText(t, Math.max(pad.l, x - 14), h - 4);
    }
  }

  function drawChart() {
    const [g, w, h] = setupCanvas($("chart"));
    const pad = { l: 70, r: 10, t: 8, b: 20 };
    const now = history.length ? history[history.length - 1].t : Date.now() / 1000;
    let max = 1 << 20;  // an empty chart still has a scale: 0 to 1 MiB
    for (const s of history) { let sum = 0; for (const [, , f] of SERIES) sum += f(s); max = Math.max(max, sum); }
    const { top, step } = niceScale(max * 1.05, 1024);
    const sp = span();
    axes(g, w, h, pad, top, bytes, sp, step);
    const X = (t) => pad.l + (w - pad.l - pad.r) * (1 - (now - t) / sp);
    const Y = (v) => h - pad.b - (h - pad.t - pad.b) * v / top;
    if (history.length < 1) return;
    let base = history.map(() => 0);
    SERIES.forEach(([, color, f], k) => {
      const next = history.map((s, i) => base[i] + f(s));
      g.beginPath();
      history.forEach((s, i) => { const x = X(s.t), y = Y(next[i]); i ? g.lineTo(x, y) : g.moveTo(x, y); });
      for (let i = history.length - 1; i >= 0; --i) g.lineTo(X(history[i].t), Y(base[i]));
      g.closePath();
      g.globalAlpha = k === SERIES.length - 1 ? 0.35 : 0.85;
      g.fillStyle = color;
      g.fill();
      g.globalAlpha = 1;
      base = next;
    });
  }

  function drawLoad() {
    const [g, w, h] = setupCanvas($("load"));
    const pad = { l: 70, r: 10, t: 8, b: 20 };
    const now = history.length ? history[history.length - 1].t : Date.now() / 1000;
    let max = 4;
    for (const s of history) max = Math.max(max, s.tok_s, s.fg_waiting + s.bg_waiting);
    const { top, step } = niceScale(max * 1.05, 10);
    const sp = span();
    axes(g, w, h, pad, top, (v) => String(Math.round(v * 100) / 100), sp, step);
    const X = (t) => pad.l + (w - pad.l - pad.r) * (1 - (now - t) / sp);
    const Y = (v) => h - pad.b - (h - pad.t - pad.b) * v / top;
    const line = (color, f) => {
      g.beginPath(); g.strokeStyle = color; g.lineWidth = 1.5;
      history.forEach((s, i) => { const x = X(s.t), y = Y(f(s)); i ? g.lineTo(x, y) : g.moveTo(x, y); });
      g.stroke();
    };
    line("#4e79a7", (s) => s.tok_s);
    line("#d9534f", (s) => s.fg_waiting + s.bg_waiting);
    g.fillStyle = "#4e79a7"; g.fillText("tok/s", w - 110, 16);
    g.fillStyle = "#d9534f"; g.fillText("waiting", w - 60, 16);
  }

  function drawNow() {
    const s = history[history.length - 1];
    if (!s) return;
    $("s-toks").textContent = s.tok_s.toFixed(1);
    $("s-ema").textContent = s.decode_tok_s.toFixed(1);
    $("s-running").textContent = s.fg_running;
    $("s-waiting").textContent = s.fg_waiting + " / " + s.bg_waiting;
  }

  function status(text, err) {
    const s = $("status");
    s.textContent = text;
    s.className = err ? "err" : "";
  }

  let busy = false;
  async function tick() {
    if (busy) return;
    busy = true;
    try {
      const [m, h] = await Promise.all([api("/v1/memory"), api("/v1/memory/history?since=" + lastT)]);
      for (const s of h.samples) history.push(s);
      if (history.length) lastT = history[history.length - 1].t;
      while (history.length && history[0].t < lastT - WINDOW_S) history.shift();
      drawResidency(m);
      drawBytes(m);
      drawNow();
      drawChart();
      drawLoad();
      status("live · " + new Date().toLocaleTimeString() + (m.restoring ? " · restoring" : ""), false);
    } catch (e) {
      status(String(e.message || e), true);
    } finally {
      busy = false;
    }
  }

  async function act(path, body, what) {
    const r = $("report");
    r.textContent = what + "…";
    try {
      const j = await api(path, body);
      const ev = j.evict || j;
      let t = what + ": ";
      if (path.endsWith("/restore")) t += "brought back " + bytes(j.restored_bytes) + " in " + (j.seconds * 1e3).toFixed(1) + " ms";
      else t += "freed " + bytes(ev.freed) + " of " + bytes(ev.requested) + " asked (stage " + ev.last_stage + ")";
      t += "; in RAM " + bytes(j.footprint_before) + " → " + bytes(j.footprint_after);
      if (j.note || ev.note) t += "\nnote: " + (j.note || ev.note);
      r.textContent = t;
    } catch (e) {
      r.textContent = what + " failed: " + (e.message || e);
    }
    tick();
  }
  $("b-evict25").onclick = () => act("/v1/memory/evict", { fraction: 0.25 }, "evict 25%");
  $("b-evict50").onclick = () => act("/v1/memory/evict", { fraction: 0.5 }, "evict 50%");
  $("b-restore").onclick = () => act("/v1/memory/restore", {}, "restore");
  $("b-trim").onclick = () => act("/v1/memory/trim", { level: $("trim-level").value }, "trim " + $("trim-level").value);
  $("b-limit").onclick = () => {
    const v = $("limit").value.trim();
    act("/v1/memory/limit", { bytes: /^\d+$/.test(v) ? Number(v) : (v || "off") }, "limit " + (v || "off"));
  };

  // ---- learning ----
  // What GET /v1/learning reports; a server without --learn answers
  // enabled: false (or has no route): the panel says so and shows nothing else.
  const query = new URLSearchParams(location.search);
  let clickAfterLearning = query.get("click");
  function fmt(x) { return x === null || x === undefined ? "–" : Number(x).toFixed(3); }
  function drawLearning(l) {
    const box = $("learning");
    box.dataset.enabled = String(!!(l && l.enabled));
    box.dataset.updates = String(Number(box.dataset.updates) + 1);
    if (!l || !l.enabled) {
      $("l-body").hidden = true;
      $("l-empty").hidden = false;
      $("l-empty").textContent = l ? "Learning is off: start ebb serve with --learn --state-dir DIR to record traces, " +
          "take feedback and train agents' adapters." : "This server has no learning routes.";
      return;
    }
    $("l-empty").hidden = true;
    $("l-body").hidden = false;
    let rewards = 0;
    for (const a of Object.values(l.agents || {})) rewards += a.rewards || 0;
    $("l-traces").textContent = l.traces;
    $("l-feedback").textContent = l.feedback;
    $("l-rewards").textContent = rewards + " / " + l.samples;
    $("l-judge").textContent = (l.judge_calls || 0) + " / " + (l.judge_failures || 0);
    $("l-steps").textContent = l.train_steps;
    $("l-versions").textContent = l.committed_versions + " / " + l.published_versions + " / " + l.rejected_versions;
    $("l-rollbacks").textContent = l.rollbacks;
    const pub = $("l-published");
    pub.replaceChildren();
    const names = Object.keys(l.published || {});
    const hp = pub.insertRow();
    for (const h of ["adapter", "published version"]) { const th = document.createElement("th"); th.textContent = h; hp.appendChild(th); }
    if (!names.length) {
      const td = pub.insertRow().insertCell();
      td.colSpan = 2;
      td.textContent = "no version published yet";
    }
    for (const n of names) {
      const tr = pub.insertRow();
      tr.dataset.adapter = n;
      tr.insertCell().textContent = n;
      const td = tr.insertCell();
      td.className = "published-version";
      td.textContent = String(l.published[n]);
    }
    const t = $("l-table");
    t.replaceChildren();
    const head = t.insertRow();
    for (const h of ["agent", "adapter", "version", "gate", "held-back loss", "vs published", "step", ""]) {
      const th = document.createElement("th"); th.textContent = h; head.appendChild(th);
    }
    if (!(l.versions || []).length) {
      const td = t.insertRow().insertCell();
      td.colSpan = 8;
      td.textContent = "no version committed yet";
    }
    for (const v of [...(l.versions || [])].reverse()) {
      const tr = t.insertRow();
      tr.className = "version";
      tr.dataset.adapter = v.adapter;
      tr.dataset.version = v.version;
      tr.dataset.gate = v.gate;
      const current = l.published && l.published[v.adapter] === v.version;
      tr.dataset.current = current ? "1" : "0";
      tr.insertCell().textContent = v.agent;
      tr.insertCell().textContent = v.adapter;
      tr.insertCell().textContent = "v" + v.version + (current ? " (published)" : "");
      const g = tr.insertCell();
      g.textContent = v.gate;
      g.className = "gate-" + v.gate;
      tr.insertCell().textContent = fmt(v.heldout_loss);
      tr.insertCell().textContent = v.heldout_loss_published === null ? "–" :
          fmt(v.heldout_loss_published) + (v.gated_against ? " (v" + v.gated_against + ")" : " (base)");
      tr.insertCell().textContent = v.step;
      const b = tr.insertCell();
      if (v.published && !current) {
        const btn = document.createElement("button");
        btn.id = "rollback-" + v.adapter + "-" + v.version;
        btn.textContent = "Roll back to v" + v.version;
        btn.onclick = () => rollback(v.adapter, v.version);
        b.appendChild(btn);
      }
    }
    if (clickAfterLearning) {
      const el = $(clickAfterLearning);
      clickAfterLearning = null;
      if (el) el.click();
      else $("l-report").textContent = "nothing to click: no element '" + query.get("click") + "'";
    }
  }
  async function rollback(adapter, version) {
    const r = $("l-report");
    r.textContent = "rolling " + adapter + " back to v" + version + "…";
    try {
      const j = await api("/v1/learning/rollback", { adapter, version });
      r.textContent = adapter + ": v" + j.published + " published again";
    } catch (e) {
      r.textContent = "rollback failed: " + (e.message || e);
    }
    tickLearning();
  }
  let learningBusy = false;
  async function tickLearning() {
    if (learningBusy) return;
    learningBusy = true;
    try {
      const r = await fetch("/v1/learning", { headers: auth({}), cache: "no-store" });
      if (r.status === 404) drawLearning(null);
      else if (r.ok) drawLearning(await r.json());
    } catch (e) { /* the status line shows the connection */ }
    finally { learningBusy = false; }
  }

  // ---- chat ----
  // The choices: the base model and each adapter (/v1/models), then each
  // agent (/v1/agents; a server without agents answers 404 and the list
  // has none), named in the request as "BASE:agent/NAME".
  const chat = { messages: [], controller: null };
  async function loadChoices() {
    const sel = $("chat-model");
    const choices = [];
    const j = await api("/v1/models");
    const ids = (j.data || []).map((m) => m.id);
    $("model").textContent = ids[0] || "";
    ids.forEach((id, i) => choices.push([id, i === 0 ? id + " (base model)" : "adapter " + id]));
    try {
      const r = await fetch("/v1/agents", { headers: auth({}), cache: "no-store" });
      if (r.ok) {
        const a = await r.json();
        for (const ag of a.data || a.agents || []) {
          const name = ag.name || ag.id;
          if (name) choices.push([(ids[0] || "") + ":agent/" + name, "agent " + name]);
        }
      }
    } catch (e) { /* no agents here */ }
    if (choices.length) sel.replaceChildren(...choices.map(([v, t]) => new Option(t, v)));
  }

  function addMessage(role, text) {
    const d = document.createElement("div");
    d.className = "msg " + role;
    d.textContent = text;
    $("chat-log").appendChild(d);
    $("chat-log").scrollTop = $("chat-log").scrollHeight;
    return d;
  }

  // Streams one answer: Server-Sent Events, a delta per piece of text.
  async function send(text) {
    if (chat.controller || !text) return;
    chat.messages.push({ role: "user", content: text });
    addMessage("user", text);
    const out = addMessage("assistant", "");
    out.classList.add("streaming");
    out.dataset.chunks = "0";
    const ctrl = new AbortController();
    chat.controller = ctrl;
    $("chat-send").disabled = true;
    $("chat-stop").disabled = false;
    const body = { messages: chat.messages, stream: true, stream_options: { include_usage: true } };
    if ($("chat-model").value) body.model = $("chat-model").value;
    const t0 = performance.now();
    let answer = "", first = 0, usage = null, finish = "";
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST", signal: ctrl.signal, cache: "no-store",
        headers: auth({ "Content-Type": "application/json" }), body: JSON.stringify(body) });
      if (!r.ok) {
        const j = await r.json().catch(() => ({}));
        throw new Error((j.error && j.error.message) || ("HTTP " + r.status));
      }
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true }).replace(/\r\n/g, "\n");
        for (let at; (at = buf.indexOf("\n\n")) >= 0;) {
          const ev = buf.slice(0, at);
          buf = buf.slice(at + 2);
          for (const line of ev.split("\n")) {
            if (!line.startsWith("data:")) continue;
            const d = line.slice(5).trim();
            if (d === "[DONE]") continue;
            const j = JSON.parse(d);
            if (j.error) throw new Error(j.error.message || "the stream failed");
            if (j.usage) usage = j.usage;
            const c = j.choices && j.choices[0];
            if (c && c.delta && c.delta.content) {
              if (!first) first = performance.now();
              answer += c.delta.content;
              out.textContent = answer;
              out.dataset.chunks = String(Number(out.dataset.chunks) + 1);
              $("chat-log").scrollTop = $("chat-log").scrollHeight;
            }
            if (c && c.finish_reason) finish = c.finish_reason;
          }
        }
      }
      chat.messages.push({ role: "assistant", content: answer });
      out.dataset.done = "1";
      const secs = (performance.now() - t0) / 1000;
      const n = usage ? usage.completion_tokens : Number(out.dataset.chunks);
      $("chat-stats").textContent = n + " tokens in " + secs.toFixed(2) + " s" +
          (first ? " · first token after " + ((first - t0) / 1000).toFixed(2) + " s" : "") +
          (usage ? " · prompt " + usage.prompt_tokens + " (cached " +
                   ((usage.prompt_tokens_details || {}).cached_tokens || 0) + ")" : "") +
          (finish ? " · " + finish : "");
    } catch (e) {
      chat.messages.pop();  // the question goes again with the next message
      if (ctrl.signal.aborted) {
        out.dataset.done = "stopped";
        $("chat-stats").textContent = "stopped";
      } else {
        out.classList.add("failed");
        out.textContent = answer + (answer ? "\n" : "") + "error: " + (e.message || e);
        out.dataset.done = "error";
      }
    } finally {
      out.classList.remove("streaming");
      chat.controller = null;
      $("chat-send").disabled = false;
      $("chat-stop").disabled = true;
      tick();
    }
  }
  $("chat-form").onsubmit = (ev) => {
    ev.preventDefault();
    const t = $("chat-input").value.trim();
    $("chat-input").value = "";
    send(t);
  };
  $("chat-input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("chat-form").requestSubmit(); }
  });
  $("chat-stop").onclick = () => { if (chat.controller) chat.controller.abort(); };
  $("chat-new").onclick = () => {
    if (chat.controller) chat.controller.abort();
    chat.messages = [];
    $("chat-log").replaceChildren();
    $("chat-stats").textContent = "";
  };

  drawChart();  // the axes before the first sample
  drawLoad();
  const demo = query.get("demo");
  loadChoices().catch((e) => status(String(e.message || e), true)).finally(() => { if (demo) send(demo); });
  tick();
  tickLearning();
  setInterval(tick, 1000);
  setInterval(tickLearning, 1000);
  window.addEventListener("resize", () => { drawChart(); drawLoad(); });
})();
</script>
</body>
</html>
)EBBPAGE";

}  // namespace ebb::serve
