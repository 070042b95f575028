// What the console polls for everyone: the page's state (the banner) and the health strip,
// the lines (depth, workers, pause, the last hour's chart, counts linked to their lists,
// trouble in red or amber), and the alerts (open incidents first).
"use strict";

import {$, TROUBLE, TROUBLE_VIEW, age, api, el, href, keepingFocus, say, timeEl, utc} from "./api.js";

const NAMES = {redis: "Redis", journal: "Journal", beat: "Beat", sweep: "Sweeper", schedules: "Schedules"};
const TROUBLE_EVENTS = new Set(["TASK_DEAD", "NO_CONSUMER", "BROKER_DOWN", "JOURNAL_DOWN", "WORKER_STALLED", "QUEUE_FULL", "BACKLOG", "DOWNSTREAM_DOWN"]);
const STATES = {ok: "OK", degraded: "DEGRADED", down: "DOWN"};
let throughputByLine = {};
let onlyLine = null;  // the line view shows this line's card alone

function checkItem(check) {
  const detail = [];
  if (check.name === "beat" && check.host) {
    detail.push(`host ${check.host}`, `lock held ${age(check.lock_age_s)}`, `renewed ${age(check.renewed_s_ago)} ago`);
  }
  if (check.name === "sweep" && check.last_sweep_at) detail.push(`at ${utc(check.last_sweep_at)}`);
  if (check.name === "schedules" && check.last_fire_at) detail.push(`last fire ${utc(check.last_fire_at)}`);
  return el("li", {class: "check " + (check.ok ? "ok" : "fail"), "data-check": check.name},
    el("strong", {}, NAMES[check.name] || check.name, el("span", {class: "state"}, check.ok ? "ok" : "FAIL")),
    el("span", {class: "reason"}, check.reason),
    detail.length ? el("small", {}, detail.join(" · ")) : null);
}

// The reasons the intake gave for the page's state, by line: the cards show their own.
let reasonsByLine = {};
const WARN_ONLY = new Set(["paused", "backlog", "stalled_worker"]);

function lineTrouble(line) {
  return (reasonsByLine[line.line] || []).map((r) => [r.code, r.message || r.code, WARN_ONLY.has(r.code) ? "warn" : "bad"]);
}

// Where a reason is looked into: its line's failed records when its downstream fails, its
// line's card otherwise; the health strip for a part of the pipeline.
function reasonHref(reason) {
  if (!reason.line) return "#/";
  if (reason.code === "circuit_open") return href("retries", {line: reason.line});
  return href("lines/" + encodeURIComponent(reason.line));
}

function renderState(health) {
  // An intake that does not say its state yet: its checks' `ok` alone.
  const state = health.state || (health.ok ? "ok" : "degraded");
  const reasons = health.reasons || [];
  reasonsByLine = {};
  for (const r of reasons) if (r.line) (reasonsByLine[r.line] = reasonsByLine[r.line] || []).push(r);
  const banner = $("#state");
  banner.dataset.state = state;
  banner.className = "state-banner " + state;
  $("#state-title").textContent = "Pipeline: " + (STATES[state] || state) +
    (state === "ok" ? " — every part answers, no line in trouble" : ` — ${reasons.length} reason(s)`);
  keepingFocus($("#state-reasons"), () => $("#state-reasons").replaceChildren(...reasons.map((r) =>
    el("li", {"data-code": r.code, "data-line": r.line || null},
      el("a", {href: reasonHref(r), "data-status": r.code}, r.message || r.code)))));
}

// The health strip and the page's state.
export async function refreshHealth() {
  let health;
  try {
    health = await api("/v1/health");
  } catch (error) {
    renderState({state: "down", reasons: [{code: "intake_down", line: null, message: "the intake does not answer: " + error.message}]});
    throw error;
  }
  renderState(health);
  $("#checks").replaceChildren(...health.checks.map(checkItem));
}

function chart(line) {
  const minutes = throughputByLine[line] || [];
  const wrap = el("div", {class: "chart"});
  if (!minutes.length) return wrap;
  const peak = Math.max(1, ...minutes.map((m) => Math.max(m.done, m.failed)));
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${minutes.length * 2} 40`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  const done = minutes.reduce((n, m) => n + m.done, 0);
  const failed = minutes.reduce((n, m) => n + m.failed, 0);
  const label = `${line}, last ${minutes.length} minutes: ${done} done, ${failed} failed`;
  svg.setAttribute("aria-label", label);
  const title = document.createElementNS(ns, "title");
  title.textContent = label + ` (peak ${peak} a minute; each bar one minute, ${utc(minutes[0].minute)} to ${utc(minutes[minutes.length - 1].minute)})`;
  svg.append(title);
  minutes.forEach((m, i) => {
    // Done grows up from the middle, failed down from it.
    for (const [value, cls, y] of [[m.done, "done", 20 - 19 * m.done / peak], [m.failed, "failed", 20]]) {
      if (!value) continue;
      const bar = document.createElementNS(ns, "rect");
      bar.setAttribute("x", String(i * 2));
      bar.setAttribute("y", String(y));
      bar.setAttribute("width", "1.6");
      bar.setAttribute("height", String(19 * value / peak));
      bar.setAttribute("class", cls);
      svg.append(bar);
    }
  });
  wrap.append(svg, el("div", {class: "legend"},
    el("span", {}, el("span", {class: "swatch done"}), `done ${done}`),
    el("span", {}, el("span", {class: "swatch failed"}), `failed ${failed}`),
    el("span", {}, `per minute, last ${minutes.length} min`)));
  return wrap;
}

export async function refreshThroughput() {
  const answer = await api("/v1/throughput?minutes=60");
  throughputByLine = Object.fromEntries(answer.lines.map((l) => [l.line, l.per_minute]));
}

function countsList(line) {
  const counts = el("ul", {class: "counts", "aria-label": line.line + " records by status"});
  for (const [status, n] of Object.entries(line.counts).sort()) {
    // Found again by its card and status; the trouble links to its list.
    const to = TROUBLE.has(status) ? href(TROUBLE_VIEW[status], {line: line.line}) : href("records", {line: line.line, status});
    const link = el("a", {href: to, class: TROUBLE.has(status) ? "trouble-link" : "count-link", "data-status": status}, `${status} ${n}`);
    counts.append(el("li", {class: TROUBLE.has(status) && n > 0 ? "trouble" : null, "data-status": status}, n > 0 ? link : `${status} ${n}`));
  }
  if (!counts.children.length) counts.append(el("li", {}, "no records"));
  return counts;
}

async function pauseOrResume(line, pause) {
  const result = $("#line-result");
  say(result, (pause ? "pausing " : "resuming ") + line + "…");
  try {
    await api(`/v1/lines/${encodeURIComponent(line)}/${pause ? "pause" : "resume"}`, {method: "POST", admin: true, body: {reason: "from the console"}});
    say(result, `${line} ${pause ? "paused" : "resumed"} at ${utc(new Date().toISOString())}`, "done");
    await refreshLines();
  } catch (error) {
    say(result, `${pause ? "Pause" : "Resume"} of ${line} refused: ${error.message}`, "error");
  }
}

function circuitNote(line) {
  // Only an HTTP-sink line has a circuit; open is trouble (its downstream is failing).
  if (!line.circuit) return [];
  const open = line.circuit.state === "open";
  const text = open
    ? `open since ${utc(line.circuit.opened_at)}, next probe ${utc(line.circuit.next_probe_at)}`
    : "closed";
  return [el("dt", {}, "circuit"), el("dd", {class: open ? "nobody circuit-open" : "circuit"}, text)];
}

function sendersNote(line) {
  // The senders with records queued, busiest first; those past the line's fair share wait
  // behind every other sender's.
  if (!line.senders || !line.senders.length) return [];
  const items = line.senders.map((s) => el("li", {class: s.past_fair_share ? "past-share" : "", "data-sender": s.sender},
    `${s.sender}: ${s.records}` + (s.past_fair_share ? ` (${s.past_fair_share} past the fair share of ${line.fair_share})` : "")));
  return [el("dt", {}, "senders"), el("dd", {}, el("ul", {class: "senders", "aria-label": line.line + " senders with records queued"}, ...items))];
}

function lineCard(line) {
  const known = line.queue_depth !== null;
  const pct = known ? Math.min(100, 100 * line.queue_depth / line.max_queue_length) : 0;
  const fill = el("div", {class: "fill" + (pct >= 100 ? " full" : pct >= 70 ? " warn" : ""), "data-fill": pct.toFixed(2)});
  fill.style.width = pct + "%";
  const live = line.live_workers === null ? "unknown" : String(line.live_workers);
  // No worker is trouble only when work waits for one (the intake's own reason says so).
  const starved = (reasonsByLine[line.line] || []).some((r) => r.code === "no_live_workers");
  const stalled = line.stalled_workers === null || line.stalled_workers === undefined ? "unknown" : String(line.stalled_workers);
  const button = el("button", {type: "button", class: line.paused ? "primary" : "", "data-control": "pause", "data-action": line.paused ? "resume" : "pause"},
    line.paused ? `Resume ${line.line}` : `Pause ${line.line}`);
  button.addEventListener("click", () => pauseOrResume(line.line, !line.paused));
  const pausedNote = line.paused && line.pause
    ? el("dd", {class: "paused-note"}, `since ${utc(line.pause.since)} by ${line.pause.by}` + (line.pause.reason ? ` (${line.pause.reason})` : ""))
    : el("dd", {}, "no");
  const trouble = lineTrouble(line);
  const worst = trouble.some((t) => t[2] === "bad") ? " trouble-bad" : trouble.length ? " trouble-warn" : "";
  const notes = trouble.length
    ? el("ul", {class: "trouble-notes", "aria-label": line.line + " is in trouble"}, ...trouble.map(([code, message, how]) => el("li", {class: how, "data-code": code}, message)))
    : null;
  return el("article", {class: "card" + (line.paused ? " paused" : "") + worst, "data-line": line.line, "aria-labelledby": "line-" + line.line},
    el("h3", {id: "line-" + line.line}, el("span", {}, el("a", {href: href("lines/" + encodeURIComponent(line.line)), class: "line-link", "data-control": "line"}, line.line), " ", line.paused ? el("span", {class: "badge"}, "PAUSED") : null),
      el("span", {class: "policy"}, "overflow: " + line.overflow)),
    el("div", {class: "bar", role: "meter", "aria-valuemin": "0", "aria-valuemax": String(line.max_queue_length), "aria-valuenow": known ? String(line.queue_depth) : "0", "aria-label": line.line + " queue depth"}, fill),
    notes,
    el("div", {class: "depth"}, known ? line.queue_depth + " / " + line.max_queue_length + " records queued (" + line.queue_messages + " messages)" : "Redis down / " + line.max_queue_length + " records"),
    el("dl", {},
      el("dt", {}, "live workers"), el("dd", {class: starved ? "nobody live" : "live"}, live),
      el("dt", {}, "stalled workers"), el("dd", {class: line.stalled_workers > 0 ? "nobody stalled" : "stalled"}, stalled),
      el("dt", {}, "oldest unfinished"), el("dd", {class: "oldest"}, age(line.oldest_unfinished_age_s)),
      el("dt", {}, "paused"), pausedNote,
      ...circuitNote(line),
      ...sendersNote(line)),
    countsList(line),
    chart(line.line),
    el("div", {class: "actions"}, button));
}

// The line view: one line's card alone (null: every line, the overview).
export function showLine(line) {
  onlyLine = line;
  $("#lines-title").textContent = line ? "Line " + line : "Lines";
}

export async function refreshLines() {
  const answer = await api("/v1/lines");
  const shown = onlyLine ? answer.lines.filter((l) => l.line === onlyLine) : answer.lines;
  keepingFocus($("#lines"), () => $("#lines").replaceChildren(...(shown.length ? shown.map(lineCard) : [el("p", {}, `No line ${onlyLine}.`)])));
  for (const select of document.querySelectorAll(".line-select")) {
    for (const line of answer.lines) {
      if (![...select.options].some((o) => o.value === line.line)) select.append(el("option", {value: line.line}, line.line));
    }
  }
  return answer.lines;
}

// An incident's state and how long it lasted (or has lasted); a point event has neither.
function incidentNote(alert) {
  if (alert.state === "open") {
    // The intake's count (read every 2 s), else from its opening on this machine's clock.
    const since = alert.duration_s ?? (Date.now() - new Date(alert.opened_at).getTime()) / 1000;
    return el("span", {class: "incident open"}, `open for ${age(since)}`);
  }
  if (alert.state === "resolved") {
    return el("span", {class: "incident resolved"}, `resolved after ${age(alert.duration_s)}`, ...(alert.resolved_at ? [" at ", timeEl(alert.resolved_at)] : []));
  }
  return null;
}

const ORDER = {open: 0, resolved: 1};
function byIncident(a, b) {
  const rank = (x) => ORDER[x.state] ?? 2;
  return rank(a) - rank(b);  // a stable sort: each group keeps the API's newest-first order
}

function alertItem(alert) {
  const figures = Object.entries(alert.figures || {}).map(([k, v]) => `${k}=${v}`).join(" · ");
  const item = el("li", {"data-event": alert.event, "data-state": alert.state || "event", "data-alert": alert.id ?? null, class: "alert-" + (alert.state || "event")},
    el("span", {class: "event" + (TROUBLE_EVENTS.has(alert.event) ? " bad" : "")}, alert.event + (alert.line ? " · " + alert.line : "")),
    incidentNote(alert), " ",
    timeEl(alert.state ? alert.opened_at || alert.time : alert.time), " ",
    (alert.count > 1 ? `(×${alert.count}) ` : ""),
    el("span", {class: "reason"}, alert.reason || alert.message || ""),
    figures ? el("span", {class: "figures"}, figures) : null);
  const recordId = alert.figures && alert.figures.record_id;
  if (recordId) {
    item.append(" ", el("a", {href: href("records/" + encodeURIComponent(recordId)), class: "open-record", "data-record": recordId}, "open record " + recordId));
  }
  return item;
}

// The alerts name records and actors: an admin read, with the token when one is needed.
export async function refreshAlerts() {
  let answer;
  try {
    answer = await api("/v1/alerts?limit=50", {admin: true});
  } catch (error) {
    if (error.status !== 401 && error.status !== 403) throw error;
    $("#alerts").replaceChildren(el("li", {}, "Enter the admin token to see the alerts."));
    return;
  }
  const real = answer.alerts.filter((a) => !a.dry_run).sort(byIncident);
  const dry = answer.alerts.filter((a) => a.dry_run);
  keepingFocus($("#alerts"), () => $("#alerts").replaceChildren(...(real.length ? real.map(alertItem) : [el("li", {}, "none yet")])));
  const box = $("#dry-alerts");
  box.hidden = dry.length === 0;
  $("#dry-count").textContent = String(dry.length);
  $("ul", box).replaceChildren(...dry.map(alertItem));
}
