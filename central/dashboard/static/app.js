// modelfleet dashboard: renders central's snapshots (SSE /api/v1/stream) and applies
// membership changes the moment they arrive. Plain DOM and canvas, no libraries.
"use strict";

const STATES = ["alive", "suspect", "dead"];
const HISTORY = 60; // seconds of node load kept for the chart

const store = {
  snap: null,        // last snapshot
  receivedAt: 0,     // performance.now() when it arrived (ages tick from there)
  overrides: {},     // node_id -> {state, at}: membership events newer than the snapshot
  nodeHistory: [],   // [{t, rps, p99}] from heartbeats, one per snapshot
  lmHistory: {},     // "node/model:version" -> [tokens/s], one per snapshot (the trend cell)
};

// ----------------------------------------------------------------- helpers

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function fmtAge(s) {
  if (s === null || s === undefined || !isFinite(s)) return "—";
  if (s < 10) return s.toFixed(1) + "s";
  if (s < 90) return Math.round(s) + "s";
  if (s < 5400) return Math.round(s / 60) + "m";
  if (s < 172800) return (s / 3600).toFixed(1) + "h";
  return Math.round(s / 86400) + "d";
}

function fmtBytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (n >= 100 || i === 0 ? Math.round(n) : n.toFixed(1)) + " " + units[i];
}

function fmtNum(x, digits = 1) {
  if (x === null || x === undefined) return "—";
  return Number(x).toFixed(digits);
}

function sinceSnapshot() {
  return (performance.now() - store.receivedAt) / 1000;
}

function nodeState(node) {
  const o = store.overrides[node.node_id];
  return o ? o.state : node.state;
}

// ----------------------------------------------------------------- header and KPIs

// A replicated central: which replica this page talks to, who leads, how many are up.
function renderReplicas(r) {
  const el = $("replicas");
  if (!r || !r.replicated) {
    el.hidden = true;
    return;
  }
  const names = r.replicas.map((x) => (x.replica_id === r.leader_id ? `${x.replica_id} (leader)` : x.replica_id));
  el.textContent = `replica ${r.this} · ${r.replicas.length} up: ${names.join(", ")}`;
  el.title = r.replicas.map((x) => `${x.replica_id}: ${x.partitions.length} partitions, ${x.http_url}`).join("\n");
  el.hidden = false;
}

function renderHeader(s) {
  const counts = { alive: 0, suspect: 0, dead: 0 };
  for (const n of s.nodes) if (counts[nodeState(n)] !== undefined) counts[nodeState(n)]++;
  for (const st of STATES) $("count-" + st).textContent = counts[st];
  $("generation").textContent = s.central.generation;
  const link = s.central.broker_link_up;
  $("broker").textContent = s.central.mqtt_enabled ? (link ? "broker linked" : "broker link DOWN") : "MQTT off";
  $("broker").className = link === false ? "state-dead" : "muted";
  renderReplicas(s.central.replicas);
  const gw = s.gateway.now;
  const nodeRps = s.nodes.filter((n) => nodeState(n) === "alive" && n.load).reduce((a, n) => a + n.load.rps, 0);
  $("kpi-nodes").textContent = `${counts.alive} / ${s.nodes.length}`;
  $("kpi-rps").textContent = fmtNum(gw.rps, 1);
  $("kpi-lat").textContent = gw.rps ? `${fmtNum(gw.p50_ms, 1)} / ${fmtNum(gw.p99_ms, 1)}` : "— / —";
  $("kpi-node-rps").textContent = fmtNum(nodeRps, 1);
  $("kpi-errors").textContent = gw.errors;
  $("kpi-errors").className = "kpi-value" + (gw.errors ? " state-dead" : "");
  $("kpi-models").textContent = s.models.length;
}

// ----------------------------------------------------------------- nodes

function versionTags(models) {
  if (!models.length) return el("span", { class: "muted" }, "—");
  return models.map((m) =>
    el("span", { class: `tag tag-${m.state}`, title: m.error || m.state }, `${m.name}:${m.version}`));
}

function speedup(x) {
  return x === null || x === undefined ? "—" : `${fmtNum(x, 2)}×`;
}

// The artifact each version is served as on the node, its speed-up over FP32 (batch 1 / 8)
// and why: timed here, a verdict of another node of its hardware class, pinned, ...
function artifactCell(n) {
  const chosen = n.models.filter((m) => m.choice);
  if (!chosen.length) return el("span", { class: "muted" }, "—");
  return chosen.map((m) => {
    const c = m.choice;
    const title = `${m.name}:${m.version} on ${c.hardware_class || n.hardware_class || "?"}: ${c.reason || c.source}`;
    return el("div", { class: "artifact", title, "data-source": c.source },
      el("span", { class: "mono" }, c.artifact),
      el("span", { class: "muted" }, ` ${speedup(c.speedup_b1)} / ${speedup(c.speedup_b8)} · ${c.reason || c.source}`));
  });
}

function cacheCell(cache) {
  if (!cache) return el("span", { class: "muted" }, "—");
  const pct = cache.capacity ? Math.min(100, (100 * cache.bytes) / cache.capacity) : 0;
  const lookups = cache.hits + cache.misses;
  const hit = lookups ? ` · ${Math.round((100 * cache.hits) / lookups)}% hit` : "";
  const cap = cache.capacity ? ` / ${fmtBytes(cache.capacity)}` : "";
  return el("span", { title: `${cache.hits} hits, ${cache.misses} misses` },
    el("span", { class: "bar" }, el("i", { style: `width:${pct}%` })),
    el("span", { class: "bar-text" }, `${fmtBytes(cache.bytes)}${cap}${hit}`));
}

function nodeRow(n, flash) {
  const state = nodeState(n);
  const load = n.load || {};
  const missed = n.interval_s ? n.last_heartbeat_age_s / n.interval_s : 0;
  const hbClass = "num hb-age" + (missed > 3 ? " very-stale" : missed > 1.5 ? " stale" : "");
  const dash = state === "dead" || !n.load;
  return el("tr", { class: `row-${state}${flash ? " flash" : ""}`, "data-node-id": n.node_id, "data-state": state },
    el("td", {}, el("span", { class: `state state-${state}`, "data-role": "state" }, state)),
    el("td", { class: "mono node-id", title: Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(", ") },
      n.node_id, n.reported_state && n.reported_state !== "online" ? el("span", { class: "muted" }, ` (${n.reported_state})`) : null,
      n.mode === "autonomous" ? el("span", { class: "tag autonomous", "data-role": "mode",
        title: "serving its last desired state without central" },
        `autonomous since ${n.autonomous_since_ms ? new Date(n.autonomous_since_ms).toLocaleTimeString() : "?"}`) : null),
    el("td", { class: "mono site" }, n.site || "—"),
    el("td", { class: hbClass, "data-age": n.last_heartbeat_age_s ?? "" }, fmtAge(n.last_heartbeat_age_s)),
    el("td", { class: "num state-age", "data-age": n.state_age_s ?? "" }, fmtAge(n.state_age_s)),
    el("td", { class: "num" }, dash ? "—" : load.inflight),
    el("td", { class: "num" }, dash ? "—" : load.queue_depth),
    el("td", { class: "num" }, dash ? "—" : fmtNum(load.rps, 1)),
    el("td", { class: "num" }, dash ? "—" : fmtNum(load.p50_ms, 1)),
    el("td", { class: "num" }, dash ? "—" : fmtNum(load.p99_ms, 1)),
    el("td", { class: "num" }, dash ? "—" : fmtNum(load.cpu_percent, 0) + "%"),
    el("td", {}, versionTags(n.models)),
    el("td", { class: "artifacts", title: n.hardware_class || "" }, artifactCell(n)),
    el("td", {}, cacheCell(n.cache)),
    el("td", { class: "num" }, n.owned_chunks),
    el("td", { class: "mono muted" }, n.http_address || "—"));
}

function renderNodes(s, flashIds) {
  const body = $("nodes-body");
  const rows = s.nodes.map((n) => nodeRow(n, flashIds && flashIds.has(n.node_id)));
  if (!rows.length) rows.push(el("tr", { class: "empty" }, el("td", { colspan: 16 }, "No node has announced itself yet.")));
  body.replaceChildren(...rows);
  const c = s.central;
  $("nodes-note").textContent = c.mqtt_enabled
    ? `suspect after ${c.suspect_after}× and dead after ${c.dead_after}× the heartbeat interval`
    : "MQTT liveness is off: states unknown";
}

// ----------------------------------------------------------------- language models

const lmKey = (r) => `${r.node_id}/${r.model}:${r.version}`;

function sparkline(values) {
  const w = 80, h = 18;
  if (values.length < 2) return el("span", { class: "muted" }, "—");
  const max = Math.max(1, ...values);
  const step = w / (HISTORY - 1);
  const x0 = w - (values.length - 1) * step;
  const pts = values.map((v, i) => `${(x0 + i * step).toFixed(1)},${(h - 1 - (v / max) * (h - 2)).toFixed(1)}`);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", pts.join(" "));
  svg.append(line);
  return svg;
}

function kvCell(usage) {
  const pct = Math.max(0, Math.min(100, 100 * usage));
  const level = pct >= 90 ? " bar-bad" : pct >= 70 ? " bar-warn" : " bar-ok";
  return [el("span", { class: "bar" + level }, el("i", { style: `width:${pct}%` })),
    el("span", { class: "bar-text" }, `${pct.toFixed(pct < 10 ? 1 : 0)}%`)];
}

// One figure cell: data-role names it and data-value holds the number (empty when unknown).
function figure(role, value, text) {
  return el("td", { class: "num", "data-role": role, "data-value": value ?? "" }, value === null || value === undefined ? "—" : text);
}

function lmRow(r) {
  const state = nodeState({ node_id: r.node_id, state: r.node_state });
  const dead = state === "dead";
  const history = store.lmHistory[lmKey(r)] || [];
  return el("tr", { class: `row-${state}`, "data-node-id": r.node_id, "data-model": r.model, "data-version": r.version,
    "data-state": state },
    el("td", { class: "mono node-id" }, el("span", { class: `state state-${state}`, title: state }, ""), " ", r.node_id),
    el("td", {}, el("span", { class: "model-name-sm" }, `${r.model}:${r.version}`), " ",
      el("span", { class: "tag model-kind", "data-kind": r.kind,
        title: "served by /v1/completions, /v1/chat/completions and OIP generate" },
        r.kind === "decoder" ? "language model" : r.kind)),
    el("td", { class: "mono muted" }, r.artifact || "—"),
    dead ? el("td", { class: "num", "data-role": "tokens-per-s", "data-value": "" }, "—")
      : figure("tokens-per-s", r.tokens_per_s, fmtNum(r.tokens_per_s, 1)),
    el("td", { class: "trend" }, dead ? null : sparkline(history)),
    figure("running", dead ? null : r.running, r.running),
    figure("waiting", dead ? null : r.waiting, r.waiting),
    el("td", { "data-role": "kv", "data-value": dead ? "" : r.kv_usage }, dead ? "—" : kvCell(r.kv_usage)),
    figure("ttft-p50", r.ttft_p50_ms, fmtNum(r.ttft_p50_ms, 1)),
    figure("ttft-p99", r.ttft_p99_ms, fmtNum(r.ttft_p99_ms, 1)));
}

function renderLanguageModels(s) {
  const lm = s.language_models || { rows: [], tokens_per_s: 0, declared: [] };
  const body = $("lm-body");
  const rows = lm.rows.map(lmRow);
  if (!rows.length) {
    const text = lm.declared.length
      ? `${lm.declared.join(", ")}: pushed, not served by any node yet.`
      : "No language model served.";
    rows.push(el("tr", { class: "empty" }, el("td", { colspan: 10, "data-role": "lm-empty" }, text)));
  }
  body.replaceChildren(...rows);
  // Summed here, not taken from the snapshot: a membership message may have turned a node dead since.
  const live = lm.rows.filter((r) => nodeState({ node_id: r.node_id, state: r.node_state }) !== "dead");
  const total = live.reduce((a, r) => a + r.tokens_per_s, 0);
  $("lm-total").textContent = lm.rows.length ? `${fmtNum(total, 1)} tokens/s in all` : "";
}

function recordLanguageModels(s) {
  const seen = new Set();
  for (const r of (s.language_models || { rows: [] }).rows) {
    const key = lmKey(r);
    seen.add(key);
    const h = store.lmHistory[key] || (store.lmHistory[key] = []);
    h.push(r.tokens_per_s);
    if (h.length > HISTORY) h.shift();
  }
  for (const key of Object.keys(store.lmHistory)) if (!seen.has(key)) delete store.lmHistory[key];
}

// ----------------------------------------------------------------- models and rollouts

function renderModels(s) {
  const box = $("models");
  if (!s.models.length) { box.replaceChildren(el("div", { class: "empty" }, "No models pushed yet.")); return; }
  box.replaceChildren(...s.models.map((m) => {
    const serving = Object.entries(m.serving).map(([version, byState]) =>
      `v${version}: ` + Object.entries(byState).map(([st, ids]) => `${ids.length} ${st}`).join(", ")).join(" · ");
    const rollout = (s.rollouts || []).find((r) => r.model === m.name && (r.state === "canary" || r.state === "rolling"));
    return el("div", { class: "model", "data-model": m.name },
      el("div", { class: "model-head" },
        el("span", { class: "model-name" }, m.name),
        m.kind === "decoder" ? el("span", { class: "tag model-kind", "data-kind": "decoder",
          title: "served by /v1/completions, /v1/chat/completions and OIP generate" }, "language model") : null,
        el("span", { class: "muted" }, `latest ${m.latest ?? "—"} · ${m.version_count} version(s)`)),
      el("div", { class: "versions" }, m.versions.map((v) =>
        el("span", { class: "tag" + (v.placed ? " version-active" : ""), "data-version": v.version,
          title: `${v.placed ? "placed on the fleet; " : ""}${fmtBytes(v.size)}, ${v.chunks} chunks, ${v.artifact}, ${v.created_at}` },
        `${v.placed ? "● " : ""}${v.version} · ${fmtBytes(v.size)} · ${v.chunks}ch`))),
      el("div", { class: "model-serving" }, serving || "not served by any live node"),
      rollout ? el("div", { class: "model-serving" }, `rolling out ${rollout.version}: `,
        el("span", { class: `rollout-state rs-${rollout.state}` }, rollout.state),
        ` ${rollout.ready}/${(rollout.targets || []).length} ready`) : null);
  }));
}

function rolloutBlock(r) {
  const total = (r.targets || []).length || 1;
  const pct = Math.round((100 * (r.ready || 0)) / total);
  const nodes = Object.entries(r.nodes || {}).map(([id, st]) => {
    const canary = (r.canary_nodes || []).includes(id);
    const why = st === "failed" ? (r.failures || {})[id] : null;
    const title = [canary ? "canary" : "", why ? why.error || "" : ""].filter(Boolean).join(" · ");
    return el("span", { class: `tag tag-${st}`, title },
      `${canary ? "◆ " : ""}${id}: ${st}${why ? ` (${why.reason})` : ""}`);
  });
  return el("div", { class: "rollout", "data-rollout": r.id },
    el("div", { class: "rollout-head" },
      el("b", {}, `${r.model} → ${r.version}`),
      el("span", { class: `rollout-state rs-${r.state}` }, r.state),
      el("span", { class: "muted" }, `from ${r.previous_version ?? "—"} · canary ${Math.round((r.canary || 0) * 100)}%`)),
    el("div", {},
      el("span", { class: `bar ${r.failed ? "bar-bad" : "bar-ok"}`, style: "width:220px" }, el("i", { style: `width:${pct}%` })),
      el("span", { class: "bar-text" }, `${r.ready}/${total} ready · ${r.failed} failed (${fmtNum(100 * (r.failure_rate || 0), 0)}%)`)),
    el("div", { class: "rollout-nodes" }, nodes),
    r.reason ? el("div", { class: "rollout-reason" }, r.reason) : null);
}

function renderRollouts(s) {
  const box = $("rollouts");
  if (s.rollouts === null || s.rollouts === undefined) {
    box.replaceChildren(el("div", { class: "empty" }, "No rollouts: this central has no rollout API."));
  } else if (!s.rollouts.length) {
    box.replaceChildren(el("div", { class: "empty" }, "No rollouts yet."));
  } else {
    box.replaceChildren(...s.rollouts.slice(0, 8).map(rolloutBlock));
  }
}

// ----------------------------------------------------------------- placement

function renderPlacement(s) {
  const box = $("placement");
  if (!s.placement.length) { box.replaceChildren(el("div", { class: "empty" }, "No active version placed.")); return; }
  const states = Object.fromEntries(s.nodes.map((n) => [n.node_id, nodeState(n)]));
  box.replaceChildren(...s.placement.map((p) => {
    const owners = Object.keys(p.per_node).sort();
    const rows = owners.flatMap((id) => {
      const cells = p.owners.map((o) => {
        const rank = o.indexOf(id);
        return el("i", { class: rank === 0 ? "c-primary" : rank > 0 ? "c-replica" : "" });
      });
      const c = p.per_node[id];
      return [
        el("span", { class: "who" + (states[id] === "dead" ? " dead" : "") }, id),
        el("span", { class: "cells" }, cells),
        el("span", { class: "count" }, `${c.primary} + ${c.replica}`),
      ];
    });
    const truncated = p.owners.length < p.chunks ? ` (first ${p.owners.length} drawn)` : "";
    return el("div", { class: "placement-block", "data-placement": `${p.model}:${p.version}` },
      el("div", { class: "placement-title" }, el("b", {}, `${p.model}:${p.version}`),
        el("span", { class: "muted" }, ` · ${p.chunks} chunks over ${owners.length} node(s)${truncated}`)),
      owners.length ? el("div", { class: "matrix" }, rows) : el("div", { class: "empty" }, "no owners: no node registered"));
  }));
}

// ----------------------------------------------------------------- events

function eventDetail(e) {
  const d = e.detail || {};
  const parts = [];
  if (d.model) parts.push(`${d.model}${d.version ? ":" + d.version : ""}`);
  if (d.reason) parts.push(d.reason);
  if (d.previous) parts.push(`was ${d.previous}`);
  if (d.silent_s !== undefined) parts.push(`silent ${d.silent_s}s`);
  if (e.actor) parts.push(`by ${e.actor}`); // the operator token's name (audit)
  return parts.join(" · ");
}

function renderEvents(s) {
  const list = $("events");
  if (!s.events.length) { list.replaceChildren(el("li", { class: "empty" }, "No events yet.")); return; }
  const scrolled = list.scrollTop; // an operator reading older events keeps their place
  list.replaceChildren(...s.events.map((e) =>
    el("li", { "data-event": e.type },
      el("span", { class: "ev-time", "data-ts": e.ts }, fmtAge(Math.max(0, Date.now() - e.ts) / 1000) + " ago"),
      el("span", { class: `ev-type ev-${e.type}` }, e.type),
      el("span", { class: "ev-node" }, e.node_id || "—"),
      el("span", { class: "ev-detail", title: JSON.stringify(e.detail) }, eventDetail(e)))));
  list.scrollTop = scrolled;
}

// ----------------------------------------------------------------- chart

function drawChart(s) {
  const canvas = $("chart");
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const pad = { l: 44, r: 50, t: 10, b: 20 };
  const iw = w - pad.l - pad.r, ih = h - pad.t - pad.b;
  const series = s.gateway.series;
  const now = series.length ? series[series.length - 1].t : Math.floor(s.ts);
  const start = now - HISTORY + 1;
  const hist = store.nodeHistory.filter((p) => p.t >= start);
  const maxRps = niceMax(Math.max(1, ...series.map((p) => p.requests), ...hist.map((p) => p.rps)));
  const maxMs = niceMax(Math.max(1, ...series.map((p) => p.p99_ms), ...hist.map((p) => p.p99)));
  const x = (t) => pad.l + ((t - start) / (HISTORY - 1)) * iw;
  const yL = (v) => pad.t + ih - (v / maxRps) * ih;
  const yR = (v) => pad.t + ih - (v / maxMs) * ih;
  axes(ctx, pad, w, h, iw, ih, maxRps, maxMs, start);
  const bw = Math.max(1, iw / HISTORY - 2);
  ctx.fillStyle = "rgba(76,154,255,0.55)";
  for (const p of series) if (p.requests) ctx.fillRect(x(p.t) - bw / 2, yL(p.requests), bw, pad.t + ih - yL(p.requests));
  line(ctx, hist.map((p) => [x(p.t), yL(p.rps)]), "#2ec4b6", 2);
  line(ctx, series.filter((p) => p.requests).map((p) => [x(p.t), yR(p.p50_ms)]), "#b388ff", 1.5);
  line(ctx, series.filter((p) => p.requests).map((p) => [x(p.t), yR(p.p99_ms)]), "#ff8c42", 2);
  line(ctx, hist.map((p) => [x(p.t), yR(p.p99)]), "#f0b429", 1.5, [4, 3]);
}

function niceMax(v) {
  const exp = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * exp) return m * exp;
  return 10 * exp;
}

function axes(ctx, pad, w, h, iw, ih, maxRps, maxMs, start) {
  ctx.strokeStyle = "#263240"; ctx.fillStyle = "#7d8a99"; ctx.lineWidth = 1;
  ctx.font = "11px ui-monospace, DejaVu Sans Mono, monospace";
  for (let i = 0; i <= 4; i++) {
    const y = pad.t + (ih * i) / 4;
    ctx.beginPath(); ctx.moveTo(pad.l, y + 0.5); ctx.lineTo(pad.l + iw, y + 0.5); ctx.stroke();
    ctx.textAlign = "right"; ctx.fillText(fmtTick(maxRps * (1 - i / 4)), pad.l - 6, y + 4);
    ctx.textAlign = "left"; ctx.fillText(fmtTick(maxMs * (1 - i / 4)) + "ms", pad.l + iw + 6, y + 4);
  }
  ctx.textAlign = "center";
  for (let s = 0; s < HISTORY; s += 15) ctx.fillText(`-${HISTORY - s}s`, pad.l + (s / (HISTORY - 1)) * iw, h - 5);
  ctx.fillText("now", pad.l + iw, h - 5);
}

function fmtTick(v) { return v >= 100 ? Math.round(v) : v >= 10 ? v.toFixed(0) : v.toFixed(1); }

function line(ctx, pts, color, width, dash) {
  if (pts.length < 2) return;
  ctx.save(); ctx.strokeStyle = color; ctx.lineWidth = width; ctx.setLineDash(dash || []);
  ctx.beginPath(); pts.forEach(([px, py], i) => (i ? ctx.lineTo(px, py) : ctx.moveTo(px, py))); ctx.stroke();
  ctx.restore();
}

// ----------------------------------------------------------------- live updates

function applySnapshot(s) {
  const prev = store.snap;
  const flash = new Set();
  if (prev) {
    const before = Object.fromEntries(prev.nodes.map((n) => [n.node_id, nodeState(n)]));
    for (const n of s.nodes) if (before[n.node_id] && before[n.node_id] !== n.state) flash.add(n.node_id);
  }
  store.snap = s;
  store.receivedAt = performance.now();
  store.overrides = {};
  const alive = s.nodes.filter((n) => n.state === "alive" && n.load);
  store.nodeHistory.push({
    t: Math.floor(s.ts),
    rps: alive.reduce((a, n) => a + n.load.rps, 0),
    p99: alive.reduce((a, n) => Math.max(a, n.load.p99_ms), 0),
  });
  if (store.nodeHistory.length > HISTORY + 5) store.nodeHistory.shift();
  recordLanguageModels(s);
  render(flash);
}

function applyMembership(m) {
  const s = store.snap;
  if (!s) return;
  store.overrides[m.node_id] = { state: m.state };
  if (m.event) s.events = [m.event, ...s.events].slice(0, 60);
  if (!s.nodes.some((n) => n.node_id === m.node_id)) {
    s.nodes.push({ node_id: m.node_id, state: m.state, state_age_s: 0, last_heartbeat_age_s: m.last_heartbeat_age_s,
      interval_s: null, reported_state: null, http_address: "", registered: false, capacity: null, labels: {},
      load: null, cache: null, models: [], owned_chunks: 0 });
    s.nodes.sort((a, b) => (a.node_id < b.node_id ? -1 : 1));
  }
  for (const n of s.nodes) if (n.node_id === m.node_id) n.state_age_s = -sinceSnapshot(); // ticks from 0 now
  render(new Set([m.node_id]));
}

function render(flash) {
  const s = store.snap;
  renderHeader(s);
  renderNodes(s, flash);
  renderLanguageModels(s);
  renderModels(s);
  renderRollouts(s);
  renderPlacement(s);
  renderEvents(s);
  drawChart(s);
  tick();
}

function tick() {
  if (!store.snap) return;
  const dt = sinceSnapshot();
  for (const td of document.querySelectorAll("#nodes-body td[data-age]")) {
    const base = td.getAttribute("data-age");
    if (base !== "") td.textContent = fmtAge(Number(base) + dt);
  }
  for (const span of document.querySelectorAll("#events .ev-time")) {
    span.textContent = fmtAge(Math.max(0, Date.now() - Number(span.getAttribute("data-ts"))) / 1000) + " ago";
  }
  $("updated").textContent = fmtAge(dt) + " ago";
}

function setConn(state, text) {
  const c = $("conn");
  c.className = "conn conn-" + state;
  c.setAttribute("data-conn", state);
  c.textContent = text;
}

function connect() {
  const source = new EventSource("/api/v1/stream");
  source.addEventListener("open", () => setConn("live", "● live"));
  source.addEventListener("error", () => setConn("reconnecting", "reconnecting…"));
  source.addEventListener("snapshot", (e) => { setConn("live", "● live"); applySnapshot(JSON.parse(e.data)); });
  source.addEventListener("membership", (e) => applyMembership(JSON.parse(e.data)));
  // The token this page signed in with was revoked: reconnecting would only get a 401.
  source.addEventListener("revoked", (e) => { source.close(); setConn("revoked", "signed out: " + JSON.parse(e.data).reason); });
}

setInterval(tick, 250);
window.addEventListener("resize", () => store.snap && drawChart(store.snap));
connect();
