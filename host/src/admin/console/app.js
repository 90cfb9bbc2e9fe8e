// hopper's web console. Every value from the server is put on the page with
// textContent (or an attribute), never parsed as HTML.
"use strict";

const PAGE = 50;
const REASONS = ["FATAL", "RETRIES_EXHAUSTED", "HANDLER_TRAP", "HANDLER_TIMEOUT",
  "HANDLER_MEMORY", "INVALID_ENVELOPE", "NO_HANDLER", "DELAY_TOO_LONG", "REPLAY_LOOP", "KEY_BLOCKED", "KEY_PARK_FULL"];
const COLORS = ["#c62828", "#ef6c00", "#6a1b9a", "#1565c0", "#00838f", "#558b2f",
  "#4e342e", "#ad1457", "#37474f", "#827717", "#9e9e9e"];

const state = { skip: 0, total: 0, records: [], selected: new Set(), detail: null, view: "text" };

const $ = (id) => document.getElementById(id);

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function row(cells) {
  const tr = el("tr");
  for (const cell of cells) {
    const td = el("td");
    if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell ?? "";
    tr.appendChild(td);
  }
  return tr;
}

function time(ms) {
  if (!ms) return "";
  const date = new Date(ms);
  // Past ±8.64e15 ms a Date is invalid and toISOString throws.
  return isNaN(date.getTime()) ? `${ms} ms` : date.toISOString().replace("T", " ").replace("Z", "");
}

function showError(message) {
  $("error").textContent = message || "";
}

/**
 * One API call. With a token in the token field, it goes along as a bearer
 * token: the server answers no API call without one. A token typed in is
 * kept only in the field, never stored.
 */
async function call(path, options) {
  const request = Object.assign({}, options || {});
  const headers = Object.assign({}, request.headers || {});
  const token = $("token").value;
  if (token && !headers.Authorization) headers.Authorization = "Bearer " + token;
  request.headers = headers;
  const response = await fetch(path, request);
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON */ }
  if (!response.ok) {
    const message = (body && body.error) || `${response.status} ${response.statusText}`;
    if (response.status === 401 && !token) {
      throw new Error(message + " (enter the admin token below, or open the console URL hopper logged at start)");
    }
    throw new Error(message);
  }
  return body;
}

/** A route's circuit breaker as text: closed, open until a time, or half-open. */
function breaker(b) {
  if (b.state === "open") return `open until ${time(b.until_ms)}`;
  if (b.state === "half_open") return `half-open (${b.admitted} of ${b.probes} probes out)`;
  return b.state;
}

async function loadStatus() {
  const status = await call("/api/status");
  const ready = $("ready");
  ready.textContent = status.ready ? "ready" : "not ready";
  ready.className = "badge " + (status.ready ? "ok" : "bad");

  const pipelines = $("pipelines");
  pipelines.replaceChildren();
  const routeSelect = $("filter-route");
  const known = new Set([...routeSelect.options].map((o) => o.value));
  for (const p of status.pipelines) {
    const pending = p.pending.map((t) => `${t.topic} (${t.kind}): ${t.messages}`).join("\n");
    const held = p.held.map((h) => `${h.topic}[${h.partition}] due in ${(h.due_in_ms / 1000).toFixed(1)}s`).join("\n");
    const s = p.status.state + (p.status.partitions ? ` (${p.status.partitions} partitions)` : "")
      + (p.status.reason ? `: ${p.status.reason}` : "")
      + (p.breaker ? `\nbreaker ${breaker(p.breaker)}` : "");
    pipelines.appendChild(row([`${p.name} (${p.kind})`, s, pending || "—", held || "—"]));
    if (!known.has(p.name)) routeSelect.appendChild(el("option", p.name, { value: p.name }));
  }
  const late = status.delay_lateness;
  $("lateness").textContent = late && late.count
    ? `Delay lateness over ${late.count} deliveries: p50 ${late.p50_ms.toFixed(1)} ms, p99 ${late.p99_ms.toFixed(1)} ms, p99.9 ${late.p999_ms.toFixed(1)} ms.`
    : "";

  const handlers = $("handlers");
  handlers.replaceChildren();
  for (const h of status.handlers) {
    handlers.appendChild(row([h.route, h.file, h.version.slice(0, 12), h.last_reload_error || "—"]));
  }
  drawParked(status.parked || []);
  // Uploading code to run is a permission of its own: say so, rather than
  // offer a button that can only be refused.
  const uploadOff = status.code_upload === false;
  $("try-off").hidden = !uploadOff;
  $("try").disabled = uploadOff;
}

/** The parked keys of the routes with ordered retries, each with a release button. */
function drawParked(routes) {
  $("parked-keys").hidden = routes.length === 0;
  const body = $("parked");
  body.replaceChildren();
  const totals = [];
  for (const r of routes) {
    totals.push(`${r.route}: ${r.parked_keys} parked, ${r.blocked_keys} blocked, ${r.messages} waiting`);
    for (const k of r.keys) {
      const release = el("button", "release", { type: "button" });
      release.addEventListener("click", () => releaseKey(r.route, k));
      body.appendChild(row([r.route, `${k.topic}[${k.partition}]`, k.key, k.state, k.head || "—",
        time(k.since_ms), k.parked, release]));
    }
  }
  $("parked-summary").textContent = totals.join("; ");
}

async function releaseKey(route, k) {
  const query = new URLSearchParams({ route, topic: k.topic, partition: k.partition, key_base64: k.key_base64 });
  try {
    const released = await call("/api/parked/release?" + query, { method: "POST" });
    showError("");
    $("parked-summary").textContent = `Released key ${k.key} of ${route} (held behind ${released.head}).`;
  } catch (e) {
    showError("release refused: " + e.message);
  }
}

function filterQuery() {
  const q = new URLSearchParams();
  for (const name of ["route", "reason", "since", "until", "key", "text", "group"]) {
    const value = $("filter-" + name).value.trim();
    if (value) q.set(name, value);
  }
  q.set("skip", state.skip);
  q.set("limit", PAGE);
  return q;
}

/** The groups by cause, from the server's live tally (never a scan). */
async function loadGroups() {
  const route = $("filter-route").value;
  const page = await call("/api/dlq/groups?" + new URLSearchParams(route ? { route } : {}));
  const rows = $("groups");
  rows.replaceChildren();
  for (const g of page.groups) {
    const actions = el("span", null, { class: "actions" });
    const records = el("button", "records", { type: "button", class: "group-records" });
    records.addEventListener("click", () => selectGroup(g));
    const tryFix = el("button", "try a fix", { type: "button", class: "group-try" });
    tryFix.addEventListener("click", () => { selectGroup(g); $("try-file").focus(); });
    const replay = el("button", "replay…", { type: "button", class: "group-replay" });
    replay.addEventListener("click", () => replayGroup(g, true));
    actions.append(records, " ", tryFix, " ", replay);
    const tr = row([g.count, sparkline(g.arrivals), time(g.last_failed_at), g.route, g.reason,
      g.versions.join(", "), g.sample, actions]);
    tr.className = "group";
    tr.dataset.group = g.group;
    rows.appendChild(tr);
  }
  const reading = Object.entries(page.topics)
    .filter(([, p]) => !p.caught_up || p.error)
    .map(([topic, p]) => p.error ? `${topic}: ${p.error}` : `${topic}: reading (${p.read} so far)`);
  $("groups-summary").textContent = `${page.group_count} group(s) of ${page.total} dead letters`
    + (page.groups.length < page.group_count ? `; the ${page.groups.length} most recent shown` : "")
    + (page.other ? `; ${page.other} more in no group past the cap` : "")
    + (reading.length ? `; ${reading.join("; ")}` : "") + ".";
}

/** A group's arrivals over time as bars, widest stretch first to last. */
function sparkline(arrivals) {
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "sparkline");
  svg.setAttribute("viewBox", `0 0 ${arrivals.counts.length} 10`);
  svg.setAttribute("preserveAspectRatio", "none");
  const max = Math.max(1, ...arrivals.counts);
  arrivals.counts.forEach((count, i) => {
    if (!count) return;
    const rect = document.createElementNS(NS, "rect");
    const h = Math.max(0.5, (count / max) * 10);
    rect.setAttribute("x", i + 0.1);
    rect.setAttribute("y", 10 - h);
    rect.setAttribute("width", 0.8);
    rect.setAttribute("height", h);
    const title = document.createElementNS(NS, "title");
    title.textContent = `${time(arrivals.start_ms + i * arrivals.bucket_ms)} +${arrivals.bucket_ms / 1000}s: ${count}`;
    rect.appendChild(title);
    svg.appendChild(rect);
  });
  return svg;
}

/** Lists the records of one group below, with the filters set to it. */
function selectGroup(g) {
  const routeSelect = $("filter-route");
  if ([...routeSelect.options].some((o) => o.value === g.route)) routeSelect.value = g.route || "";
  $("filter-group").value = g.group;
  state.skip = 0;
  loadDeadLetters().catch((e) => showError(e.message));
}

/** How often a replay run's status is read while it runs. */
const RUN_POLL_MS = 500;

/**
 * Follows a replay run until it is done or failed: its counts so far,
 * then `done` or `failed`, shown in `result`. Its final status.
 */
async function followRun(started, result, what) {
  for (;;) {
    const s = await call(started.status);
    const counts = `${s.dry_run ? "would replay" : "replayed"} ${s.replayed}, loop guard ${s.looped}, `
      + `skipped ${s.skipped}, failed ${s.failed}` + (s.already ? `, ${s.already} replayed before` : "");
    result.replaceChildren(`${what} (run ${s.run}): ${s.state}: ${counts}` + (s.error ? ` — ${s.error}` : ""));
    if (s.state !== "running") return s;
    await new Promise((resolve) => setTimeout(resolve, RUN_POLL_MS));
  }
}

/** Replays every record of a group as a run: a dry run first, then on a second click. */
async function replayGroup(g, dryRun) {
  const result = $("group-replay");
  result.replaceChildren(dryRun ? "Planning…" : "Replaying…");
  try {
    const started = await call("/api/replay", {
      method: "POST",
      headers: { "Content-Type": "application/json", "Authorization": "Bearer " + $("token").value },
      body: JSON.stringify({ filter: { group: g.group, route: g.route || null }, dry_run: dryRun }),
    });
    const what = `group ${g.group}: ${dryRun ? "dry run" : "replay"}`;
    const s = await followRun(started, result, what);
    if (dryRun && s.state === "done" && s.replayed + s.looped > 0) {
      const confirm = el("button", `Replay ${s.replayed + s.looped} now`, { type: "button", id: "group-replay-confirm" });
      confirm.addEventListener("click", () => replayGroup(g, false));
      result.append(" ", confirm);
    }
    if (!dryRun) await loadDeadLetters();
  } catch (e) {
    result.replaceChildren("refused: " + e.message);
  }
}

async function loadDeadLetters() {
  const page = await call("/api/dlq?" + filterQuery());
  state.records = page.records;
  state.total = page.total;
  const rows = $("dlq-rows");
  rows.replaceChildren();
  for (const r of page.records) {
    const ref = `${r.topic}:${r.partition}:${r.offset}`;
    const box = el("input", null, { type: "checkbox", class: "select", "data-ref": ref });
    box.checked = state.selected.has(ref);
    box.addEventListener("click", (e) => {
      e.stopPropagation();
      if (box.checked) state.selected.add(ref); else state.selected.delete(ref);
    });
    const tr = row([box, time(r.failed_at), r.route, r.reason, r.id, r.key, r.attempt,
      r.replayed + (r.replays_before ? ` (+${r.replays_before} before)` : ""), r.error]);
    tr.className = "record";
    tr.dataset.ref = ref;
    tr.addEventListener("click", () => showRecord(r));
    rows.appendChild(tr);
  }
  const shown = page.records.length;
  $("dlq-summary").textContent = `${page.total} matching of ${page.scanned} read from ${page.topics.join(", ")}`
    + (shown ? `; showing ${page.skip + 1}–${page.skip + shown}` : "")
    + (page.truncated ? "; stopped reading at the scan limit" : "") + ".";
  const reasonSelect = $("filter-reason");
  if (reasonSelect.options.length === 1) {
    for (const reason of REASONS) reasonSelect.appendChild(el("option", reason, { value: reason }));
  }
  drawHistogram(page.histogram, page.bucket_ms);
}

function drawHistogram(buckets, width) {
  const box = $("histogram");
  box.replaceChildren();
  if (!buckets.length) return;
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  const max = Math.max(...buckets.map((b) => Object.values(b.counts).reduce((a, c) => a + c, 0)));
  const barWidth = 100 / buckets.length;
  svg.setAttribute("viewBox", "0 0 100 100");
  svg.setAttribute("preserveAspectRatio", "none");
  buckets.forEach((bucket, i) => {
    let y = 100;
    for (const [reason, count] of Object.entries(bucket.counts)) {
      const h = (count / max) * 95;
      y -= h;
      const rect = document.createElementNS(NS, "rect");
      rect.setAttribute("x", i * barWidth + barWidth * 0.1);
      rect.setAttribute("y", y);
      rect.setAttribute("width", barWidth * 0.8);
      rect.setAttribute("height", h);
      const index = REASONS.indexOf(reason);
      rect.setAttribute("fill", COLORS[index < 0 ? COLORS.length - 1 : index]);
      const title = document.createElementNS(NS, "title");
      title.textContent = `${time(bucket.start_ms)} +${width / 1000}s: ${count} ${reason}`;
      rect.appendChild(title);
      svg.appendChild(rect);
    }
  });
  box.appendChild(svg);
  // Legend: the reasons present, in their colours.
  const present = new Set(buckets.flatMap((b) => Object.keys(b.counts)));
  const legend = el("p", null, { class: "legend" });
  for (const reason of present) {
    const index = REASONS.indexOf(reason);
    const swatch = document.createElementNS(NS, "svg");
    swatch.setAttribute("width", "10");
    swatch.setAttribute("height", "10");
    const square = document.createElementNS(NS, "rect");
    square.setAttribute("width", "10");
    square.setAttribute("height", "10");
    square.setAttribute("fill", COLORS[index < 0 ? COLORS.length - 1 : index]);
    swatch.appendChild(square);
    legend.appendChild(swatch);
    legend.appendChild(el("span", ` ${reason} `));
  }
  const first = buckets[0].start_ms;
  const last = buckets[buckets.length - 1].start_ms + width;
  legend.appendChild(el("span", `— ${time(first)} to ${time(last)}, ${width / 1000}s per bar`, { class: "muted" }));
  box.appendChild(legend);
}

async function showRecord(summary) {
  const path = `/api/dlq/${encodeURIComponent(summary.topic)}/${summary.partition}/${summary.offset}`;
  const record = await call(path);
  state.detail = record;
  $("detail").hidden = false;
  $("detail-ref").textContent = `${record.topic}:${record.partition}:${record.offset}`;
  const fields = $("detail-fields");
  fields.replaceChildren();
  for (const [name, value] of [["id", record.id], ["route", record.route], ["reason", record.reason],
    ["error", record.error], ["attempt", record.attempt], ["failed at", time(record.failed_at)],
    ["origin", record.origin], ["trail", record.trail], ["handler version", record.handler_version],
    ["replayed", record.replayed], ["replays before", record.replays_before],
    ["key", record.key ? (record.key.text ?? record.key.hex) : null]]) {
    fields.appendChild(el("dt", name));
    fields.appendChild(el("dd", value ?? "—"));
  }
  // The message's trace, linked to the viewer of `[tracing] ui` when set.
  fields.appendChild(el("dt", "trace"));
  const trace = el("dd", record.trace_url ? null : (record.trace_id ?? "—"));
  if (record.trace_url) {
    trace.appendChild(el("a", record.trace_id, { href: record.trace_url, target: "_blank", rel: "noopener noreferrer", id: "detail-trace" }));
  }
  fields.appendChild(trace);
  const headers = $("detail-headers");
  headers.replaceChildren();
  for (const h of record.headers) {
    headers.appendChild(row([h.name, h.value ? (h.value.text ?? `hex ${h.value.hex}`) : "null"]));
  }
  renderPayload();
}

function renderPayload() {
  const payload = state.detail && state.detail.payload;
  let text = "";
  if (!payload) {
    text = "(no payload)";
  } else if (state.view === "hex") {
    text = payload.hex.replace(/(..)/g, "$1 ").trim();
  } else if (state.view === "json") {
    try {
      text = JSON.stringify(JSON.parse(payload.text), null, 2);
    } catch (_) {
      text = "(not JSON)";
    }
  } else {
    text = payload.text ?? "(not UTF-8 text; see hex)";
  }
  $("payload").textContent = text;
  for (const button of document.querySelectorAll(".views button")) {
    button.setAttribute("aria-pressed", String(button.dataset.view === state.view));
  }
}

async function replay(dryRun) {
  const records = [...state.selected];
  const result = $("replay-result");
  const outcomes = $("replay-outcomes");
  outcomes.replaceChildren();
  if (!records.length) {
    result.textContent = "Select records first.";
    return;
  }
  result.textContent = dryRun ? "Planning…" : "Replaying…";
  try {
    const report = await call("/api/replay", {
      method: "POST",
      headers: { "Content-Type": "application/json", "Authorization": "Bearer " + $("token").value },
      body: JSON.stringify({ records, dry_run: dryRun }),
    });
    const count = (action) => report.outcomes.filter((o) => o.action === action && !o.failed).length;
    result.textContent = `${dryRun ? "dry run: would replay" : "replayed"} ${count("replay")}, `
      + `loop guard ${count("loop")}, skipped ${count("skip")}, failed ${report.failed}`;
    for (const o of report.outcomes) {
      const where = o.to ? ` → ${o.to}` : "";
      const why = o.problem || o.failed || "";
      outcomes.appendChild(el("li", `${o.at}: ${o.action}${where}${why ? ": " + why : ""}`));
    }
    if (!dryRun) {
      state.selected.clear();
      await loadDeadLetters();
    }
  } catch (e) {
    result.textContent = "refused: " + e.message;
  }
}

/** Tries the chosen candidate on the filtered dead letters of one route. */
async function tryCandidate() {
  const result = $("try-result");
  const why = $("try-why");
  why.replaceChildren();
  const file = $("try-file").files[0];
  const route = $("filter-route").value;
  if (!route || !file) {
    result.textContent = "Choose a route in the filters and a candidate .wasm first.";
    return;
  }
  const q = filterQuery();
  q.delete("skip");
  q.delete("limit");
  q.set("http", $("try-http").value);
  result.textContent = "Trying…";
  try {
    const report = await call("/api/dlq/try?" + q, {
      method: "POST",
      headers: { "Content-Type": "application/wasm", "Authorization": "Bearer " + $("token").value },
      body: await file.arrayBuffer(),
    });
    result.textContent = `${report.total} tried (HTTP ${report.http}): ${report.ok} would succeed, `
      + `${report.retry} would retry, ${report.dead} would be dead-lettered again, ${report.skipped} skipped`;
    for (const w of report.why) {
      why.appendChild(row([w.count, w.outcome, w.reason_class || "", w.reason || ""]));
    }
  } catch (e) {
    result.textContent = "refused: " + e.message;
  }
}

async function refresh() {
  try {
    await loadStatus();
    await loadGroups();
    showError("");
  } catch (e) {
    showError(e.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("filters").addEventListener("submit", async (e) => {
    e.preventDefault();
    state.skip = 0;
    try { await loadDeadLetters(); showError(""); } catch (err) { showError(err.message); }
  });
  $("prev").addEventListener("click", () => {
    state.skip = Math.max(0, state.skip - PAGE);
    loadDeadLetters().catch((e) => showError(e.message));
  });
  $("next").addEventListener("click", () => {
    if (state.skip + PAGE < state.total) state.skip += PAGE;
    loadDeadLetters().catch((e) => showError(e.message));
  });
  $("select-all").addEventListener("click", (e) => {
    for (const box of document.querySelectorAll("input.select")) {
      box.checked = e.target.checked;
      if (box.checked) state.selected.add(box.dataset.ref); else state.selected.delete(box.dataset.ref);
    }
  });
  // Without a configured token, hopper logs this page's URL with its
  // session token in the fragment (never sent to any server). It moves into
  // the field and this tab's sessionStorage, and out of the address bar.
  const fragment = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fragment) {
    sessionStorage.setItem("hopper-session-token", fragment);
    history.replaceState(null, "", location.pathname + location.search);
  }
  const session = sessionStorage.getItem("hopper-session-token");
  if (session && !$("token").value) $("token").value = session;
  $("token").addEventListener("change", () => {
    refresh();
    loadDeadLetters().catch((e) => showError(e.message));
  });
  $("dry-run").addEventListener("click", () => replay(true));
  $("replay").addEventListener("click", () => replay(false));
  $("try-form").addEventListener("submit", (e) => { e.preventDefault(); tryCandidate(); });
  for (const button of document.querySelectorAll(".views button")) {
    button.addEventListener("click", () => { state.view = button.dataset.view; renderPayload(); });
  }
  refresh();
  loadDeadLetters().catch((e) => showError(e.message));
  setInterval(refresh, 5000);
});
