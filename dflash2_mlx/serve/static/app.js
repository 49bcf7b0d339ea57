// The dflash2 page: chat, race and server state over the server's own endpoints.
// Plain JavaScript with no dependencies, so the page needs no build step and works offline.
"use strict";

const $ = (id) => document.getElementById(id);
const fmt = (x, d = 1) => (x === null || x === undefined || Number.isNaN(x) ? "-" : Number(x).toFixed(d));
const MODE_NAMES = { ar: "plain decoding", dflash: "DFlash", dflash2: "DFlash 2" };

// -- connection: the API key, the status badge, recovery after a restart -------------------
let apiKey = sessionStorage.getItem("dflash2-key");
let online = false;
let keyWaiters = [];

function headers(json = true) {
  const h = json ? { "Content-Type": "application/json" } : {};
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

function askKey(message) {
  $("key-error").textContent = message || "";
  if (!$("key-dialog").open) $("key-dialog").showModal();
  return new Promise((resolve) => keyWaiters.push(resolve));
}

$("key-form").addEventListener("submit", () => {
  apiKey = $("key-input").value.trim();
  sessionStorage.setItem("dflash2-key", apiKey);
  const waiters = keyWaiters;
  keyWaiters = [];
  waiters.forEach((w) => w());
});

// fetch with the key; a 401 asks for the key and tries again.
async function api(path, options = {}) {
  for (;;) {
    const response = await fetch(path, { ...options, headers: headers(options.body !== undefined) });
    if (response.status !== 401) return response;
    await askKey(apiKey ? "that key was refused: try again" : "");
  }
}

async function errorLine(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || `HTTP ${response.status}`;
  } catch (e) {
    return `HTTP ${response.status}`;
  }
}

function setOnline(up, why) {
  const badge = $("status");
  if (up !== online || badge.textContent === "connecting…") {
    badge.className = "status " + (up ? "online" : "offline");
    badge.textContent = up ? "online" : "offline: " + (why || "retrying");
    if (up && !online) refreshState();
  }
  online = up;
}

async function heartbeat() {
  try {
    const r = await fetch("/health", { cache: "no-store" });
    const body = await r.json();
    setOnline(r.ok, body.status);
  } catch (e) {
    setOnline(false, "the server does not answer; retrying");
  }
  setTimeout(heartbeat, online ? 2000 : 1000);
}

// -- views ---------------------------------------------------------------------------------
document.querySelectorAll(".tab").forEach((tab) =>
  tab.addEventListener("click", () => {
    document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t === tab));
    document.querySelectorAll(".view").forEach((v) => v.classList.toggle("active", v.id === "view-" + tab.dataset.view));
    if (tab.dataset.view === "server") refreshState();
  })
);

function span(text, drafted) {
  const s = document.createElement("span");
  s.textContent = text;
  if (drafted) s.className = "drafted";
  return s;
}

// -- chat ----------------------------------------------------------------------------------
let history = [];
let chatBusy = false;

function addMessage(role) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  if (role === "assistant") {
    div.innerHTML = '<div class="reasoning"></div><div class="content"></div><div class="meta"></div>';
  }
  $("chat-log").appendChild(div);
  return div;
}

async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ") && line !== "data: [DONE]") onData(JSON.parse(line.slice(6)));
      }
    }
  }
}

async function sendChat(text) {
  chatBusy = true;
  $("chat-send").disabled = true;
  addMessage("user").textContent = text;
  history.push({ role: "user", content: text });
  const msg = addMessage("assistant");
  const reasoning = msg.querySelector(".reasoning");
  const content = msg.querySelector(".content");
  let answer = "";
  let usage = null;
  const started = performance.now();
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST",
      body: JSON.stringify({
        messages: history, stream: true, stream_options: { include_usage: true },
        max_tokens: Number($("chat-max-tokens").value), temperature: Number($("chat-temp").value),
      }),
    });
    if (!response.ok) throw new Error(await errorLine(response));
    await readEvents(response, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (!delta) return;
      const drafted = Boolean(chunk.dflash && chunk.dflash.from_draft);
      if (delta.reasoning_content) reasoning.appendChild(span(delta.reasoning_content, drafted));
      if (delta.content) {
        answer += delta.content;
        content.appendChild(span(delta.content, drafted));
      }
    });
    history.push({ role: "assistant", content: answer });
    msg.querySelector(".meta").textContent = usageLine(usage, (performance.now() - started) / 1000);
    if (usage && usage.dflash2) msg.dataset.accepted = usage.dflash2.accepted;
  } catch (e) {
    history.pop();
    msg.classList.add("error");
    msg.querySelector(".meta").textContent = "failed: " + (e.message || e) + (online ? "" : " (the server is offline)");
  } finally {
    chatBusy = false;
    $("chat-send").disabled = false;
  }
}

function usageLine(usage, seconds) {
  if (!usage) return `${fmt(seconds, 2)} s`;
  const s = usage.dflash2 || {};
  const parts = [`${usage.completion_tokens} tokens`, `${fmt(s.generation_tps)} tok/s`];
  if (s.mode && s.mode !== "ar") parts.push(`τ ${fmt(s.mean_acceptance_length, 2)}`);
  parts.push(`${usage.prompt_tokens_details.cached_tokens} of ${usage.prompt_tokens} prompt tokens cached`);
  if (s.mode) parts.push(MODE_NAMES[s.mode] || s.mode);
  return parts.join(" · ");
}

$("chat-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("chat-input").value;
  if (!text.trim() || chatBusy) return;
  $("chat-input").value = "";
  sendChat(text);
});
$("chat-input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("chat-form").requestSubmit();
  }
});
$("chat-clear").addEventListener("click", () => {
  history = [];
  $("chat-log").textContent = "";
});

// -- race ----------------------------------------------------------------------------------
let record = null;
let replayId = 0;

function arms(rec) {
  const spec = Object.keys(rec.runs).find((k) => k !== "ar");
  return { ar: rec.runs.ar[0], spec: rec.runs[spec][0], specMode: spec };
}

async function runRace(body) {
  $("race-run").disabled = $("race-rerun").disabled = true;
  $("race-status").textContent = "racing on the server: warming both arms up, then plain decoding, then DFlash 2…";
  try {
    const response = await api("/v1/dflash/race", { method: "POST", body: JSON.stringify(body) });
    if (!response.ok) throw new Error(await errorLine(response));
    showRecord(await response.json());
  } catch (e) {
    $("race-status").textContent = "the race failed: " + (e.message || e);
  } finally {
    $("race-run").disabled = false;
    $("race-rerun").disabled = record === null;
  }
}

function raceSettings() {
  return { max_tokens: Number($("race-max-tokens").value), temperature: Number($("race-temp").value),
           seed: Number($("race-seed").value) };
}

function showRecord(rec) {
  if (!rec || rec.kind !== "dflash2-compare") throw new Error("not a dflash2 race record (kind dflash2-compare)");
  record = rec;
  const blob = new Blob([JSON.stringify(rec, null, 2) + "\n"], { type: "application/json" });
  const save = $("race-save");
  if (save.href) URL.revokeObjectURL(save.href);
  save.href = URL.createObjectURL(blob);
  save.classList.remove("disabled");
  $("race-rerun").disabled = $("race-replay").disabled = false;
  const { specMode } = arms(rec);
  $("race-spec-title").firstChild.textContent = (MODE_NAMES[specMode] || specMode) + " ";
  $("race-spec-head").textContent = MODE_NAMES[specMode] || specMode;
  $("race-status").textContent = `replaying at the speed it ran: "${(rec.prompt || "").slice(0, 80)}"`;
  $("race-figures").hidden = true;
  replay(rec);
}

function replay(rec) {
  const id = ++replayId;
  const { ar, spec } = arms(rec);
  const panes = [[ar, $("race-ar-text"), $("race-ar-live")], [spec, $("race-spec-text"), $("race-spec-live")]];
  panes.forEach(([, pre]) => (pre.textContent = ""));
  const shown = [0, 0];
  const end = Math.max(ar.total_s, spec.total_s);
  const start = performance.now();
  function frame() {
    if (id !== replayId) return; // a newer race or replay took over
    const t = Math.min((performance.now() - start) / 1000, end);
    panes.forEach(([run, pre, live], i) => {
      while (shown[i] < run.times_s.length && run.times_s[shown[i]] <= t) {
        pre.appendChild(span(run.pieces[shown[i]], run.from_draft[shown[i]]));
        shown[i] += 1;
      }
      live.textContent = `${shown[i]} tokens` + (shown[i] === run.times_s.length ? " · done" : "");
    });
    $("race-progress").style.width = `${(100 * t) / (end || 1)}%`;
    $("race-clock").textContent = `${fmt(t, 2)} s of ${fmt(end, 2)} s`;
    if (t < end) requestAnimationFrame(frame);
    else showFigures(rec);
  }
  requestAnimationFrame(frame);
}

function setValue(id, value, digits) {
  const el = $(id);
  el.dataset.value = value === null || value === undefined ? "" : String(value);
  el.textContent = digits === undefined ? String(value) : fmt(value, digits);
}

function showFigures(rec) {
  const s = rec.summary;
  for (const [arm, sum] of [["ar", s.ar], ["spec", s.spec]]) {
    setValue(`race-${arm}-tps`, sum.decode_tps, 1);
    setValue(`race-${arm}-e2e`, sum.e2e_tps, 1);
    setValue(`race-${arm}-tokens`, sum.tokens);
    setValue(`race-${arm}-ttft`, sum.prompt_s, 3);
    setValue(`race-${arm}-total`, sum.total_s, 3);
    setValue(`race-${arm}-passes`, sum.target_passes);
  }
  setValue("race-speedup", s.speedup_decode, 2);
  $("race-speedup").textContent += "x";
  $("race-speedup").className = s.speedup_decode >= 1 ? "win" : "lose";
  setValue("race-speedup-e2e", s.speedup_e2e, 2);
  $("race-speedup-e2e").textContent += "x";
  setValue("race-tau", s.mean_acceptance_length, 2);
  const blocks = Object.entries(s.block_sizes || {}).map(([B, n]) => `${B === "1" ? "plain" : B}×${n}`).join(", ");
  $("race-blocks").textContent = s.block_policy === "auto" ? blocks || "-" : `fixed ${s.block_size}`;
  const bars = $("race-accept");
  bars.textContent = "";
  (s.acceptance_by_position || []).forEach((p, i) => {
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.height = `${Math.max(1, 80 * p)}px`;
    bar.title = `position ${i + 1}: ${fmt(100 * p, 0)} % accepted (given every earlier one was)`;
    bar.innerHTML = `<b>${fmt(100 * p, 0)}</b><span>${i + 1}</span>`;
    bars.appendChild(bar);
  });
  const parity = $("race-parity");
  parity.textContent = "parity: " + rec.parity.message;
  parity.dataset.verdict = rec.parity.verdict;
  parity.className = "parity-" + rec.parity.verdict;
  const notes = $("race-notes");
  notes.textContent = "";
  (rec.notes || []).forEach((line) => {
    const li = document.createElement("li");
    li.textContent = line;
    notes.appendChild(li);
  });
  const m = rec.machine || {};
  $("race-machine").textContent = `backend ${m.backend} · device ${m.device_name || m.device} · mlx ${m.mlx_version}` +
    ` · ${rec.model || ""} · ${rec.command || ""} · one run of each arm, both warmed up`;
  $("race-figures").hidden = false;
  $("race-status").textContent = "done: the figures below are the saved record's.";
}

$("race-form").addEventListener("submit", (e) => {
  e.preventDefault();
  runRace({ prompt: $("race-prompt").value, ...raceSettings() });
});
$("race-rerun").addEventListener("click", () => {
  const st = record.settings;
  runRace({ prompt_token_ids: record.prompt_token_ids, prompt: record.prompt, max_tokens: st.max_tokens,
            temperature: st.temperature, top_p: st.top_p, top_k: st.top_k, min_p: st.min_p, seed: st.seed });
});
$("race-replay").addEventListener("click", () => record && showRecord(record));
$("race-open").addEventListener("change", async (e) => {
  const file = e.target.files[0];
  if (!file) return;
  try {
    showRecord(JSON.parse(await file.text()));
  } catch (err) {
    $("race-status").textContent = `cannot replay ${file.name}: ${err.message}`;
  }
  e.target.value = "";
});

// -- server state --------------------------------------------------------------------------
function rows(table, pairs) {
  table.textContent = "";
  for (const [k, v] of pairs) {
    const tr = table.insertRow();
    tr.insertCell().textContent = k;
    tr.insertCell().textContent = v;
  }
}

const bytes = (n) => (n >= 1e9 ? `${fmt(n / 1e9, 2)} GB` : `${fmt(n / 1e6, 1)} MB`);

async function refreshState() {
  let st;
  try {
    const response = await api("/v1/dflash/state");
    if (!response.ok) return;
    st = await response.json();
  } catch (e) {
    return; // offline: the heartbeat shows it and refreshes on recovery
  }
  const p = st.pair;
  $("pair-line").textContent = `${st.model} · ${MODE_NAMES[p.kind] || p.kind} · ${st.machine.backend} backend`;
  rows($("state-pair"), [
    ["model", st.model], ["mode", MODE_NAMES[p.kind] || p.kind],
    ["target", `${p.target.model_type}, ${p.target.layers} layers, hidden ${p.target.hidden_size}`],
    ["drafter", p.drafter ? `${p.drafter.kind}, ${p.drafter.layers} layers, block ${p.drafter.block_size}` : "none"],
    ["block size", String(p.block_size)], ["tree rows", p.tree_rows || "chain"],
  ]);
  rows($("state-queue"), [["running", `${st.queue.running} of ${st.queue.max_batch} at once`],
                          ["waiting", st.queue.waiting], ["limit", st.queue.max_queue],
                          ...(st.queue.batch_note ? [["batching", st.queue.batch_note]] : [])]);
  const c = st.prompt_cache;
  rows($("state-cache"), [["entries", c.entries], ["held in memory", bytes(c.bytes)], ["bound", bytes(c.max_bytes)],
                          ["blocks reused from memory", c.memory_hits],
                          ["disk", c.disk ? `${bytes(c.disk_bytes)}, ${c.disk_hits} blocks reused` : "off"]]);
  const t = st.totals;
  rows($("state-totals"), [["generations", t.generations], ["generated tokens", t.generation_tokens],
                           ["prompt tokens cached", `${t.cached_prompt_tokens} of ${t.prompt_tokens}`],
                           ["τ", fmt(t.mean_acceptance_length, 2)], ["accepted / drafted", `${t.accepted} / ${t.drafted}`]]);
  const table = $("state-costs");
  table.textContent = "";
  if (!st.costs) {
    $("state-costs-note").textContent = "no cost table: this server runs a fixed block size or plain decoding.";
  } else {
    const k = st.costs;
    const contexts = Object.entries(k.by_context);
    $("state-costs-note").textContent = contexts.map(([c, t]) => `plain step ${fmt(1000 * t.plain_s, 2)} ms` +
        (contexts.length > 1 ? ` at ${c} tokens of context` : "")).join(" · ") +
      (k.cached ? " · read from this machine's calibration file" : " · measured at start") +
      (k.rescaled ? ` · rescaled ${fmt(k.rescaled, 2)}x after a check` : "");
    const head = table.createTHead().insertRow();
    const columns = ["context", "block size", "verify ms", "draft ms", "cycle ms", "cycle / plain step"];
    columns.forEach((h) => {
      const th = document.createElement("th");
      th.textContent = h;
      head.appendChild(th);
    });
    const body = table.createTBody();
    for (const [context, t] of contexts) {
      for (const B of Object.keys(t.verify_s)) {
        const cycle = t.cycle_s ? t.cycle_s[B] : t.verify_s[B] + t.draft_s[B];
        const tr = body.insertRow();
        [context, B, fmt(1000 * t.verify_s[B], 2), fmt(1000 * t.draft_s[B], 2), fmt(1000 * cycle, 2),
         fmt(cycle / t.plain_s, 2) + "x"].forEach((v) => (tr.insertCell().textContent = v));
      }
    }
  }
  const m = st.machine;
  $("state-machine").textContent = `backend ${m.backend} · ${m.device} · ${m.platform}`;
  if (!st.race) $("race-run").disabled = true;
}

setInterval(() => {
  if (online && $("view-server").classList.contains("active")) refreshState();
}, 2000);
heartbeat();
