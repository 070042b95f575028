// The admin views: schedules (enable, disable), the audit log (a page at a time), replay.
"use strict";

import {$, api, el, keepingFocus, labelCells, say, timeEl, typedTime, utc} from "./api.js";

let auditNext = null;

// A read refused: why, marked as a refusal so that the next good answer takes it away.
function refused(result, what, error) {
  if (error.status === 401) say(result, "Needs the admin token: enter it above.");
  else if (error.status === 403) say(result, "The admin token is not valid: enter another above.", "error");
  else say(result, `${what}: ${error.message}`, "error");
  result.dataset.refusal = "true";
}

// A read answered: a refusal shown before goes (an action's own result stays).
function answered(result, text = "") {
  if (result.dataset.refusal === "true" || !/\b(done|error)\b/.test(result.className)) say(result, text);
  delete result.dataset.refusal;
}
let auditPages = 0;

async function switchSchedule(name, enable) {
  const result = $("#schedules-result");
  try {
    await api(`/v1/schedules/${encodeURIComponent(name)}/${enable ? "enable" : "disable"}`, {method: "POST", admin: true, body: {reason: "from the console"}});
    delete result.dataset.refusal;
    say(result, `${name} ${enable ? "enabled" : "disabled"} at ${utc(new Date().toISOString())}`, "done");
    await refreshSchedules();
  } catch (error) {
    say(result, `${enable ? "Enable" : "Disable"} of ${name} refused: ${error.message}`, "error");
    delete result.dataset.refusal;
  }
}

function scheduleRow(s) {
  const button = el("button", {type: "button", "data-schedule": s.name}, s.enabled ? `Disable ${s.name}` : `Enable ${s.name}`);
  button.addEventListener("click", () => switchSchedule(s.name, !s.enabled));
  const next = s.late_s !== null && s.late_s > 60
    ? el("td", {class: "status-dead"}, timeEl(s.next_fire_at), ` late by ${Math.round(s.late_s)} s`)
    : el("td", {}, timeEl(s.next_fire_at));
  return el("tr", {"data-schedule": s.name},
    el("td", {}, s.name), el("td", {}, el("code", {}, s.cron)), el("td", {}, s.timezone), el("td", {}, s.misfire),
    el("td", {}, s.line), el("td", {}, timeEl(s.last_fire_at)), next,
    el("td", {}, s.enabled ? "yes " : "no ", button));
}

export async function refreshSchedules() {
  const result = $("#schedules-result");
  try {
    const answer = await api("/v1/schedules", {admin: true});
    keepingFocus($("#schedules-table"), () => $("#schedules-table tbody").replaceChildren(...answer.items.map(scheduleRow)));
    labelCells($("#schedules-table"));
    $("#schedules-table").hidden = answer.items.length === 0;
    answered(result, answer.items.length ? "" : "No schedule. Add one with `pipeline schedules add`.");
  } catch (error) {
    $("#schedules-table").hidden = true;
    refused(result, "Schedules", error);
  }
}

function auditRow(row) {
  return el("tr", {"data-action": row.action},
    el("td", {}, timeEl(row.time)), el("td", {}, row.actor), el("td", {}, row.action), el("td", {class: "wrap"}, row.target),
    el("td", {class: "wrap"}, row.result ? JSON.stringify(row.result) : "–"), el("td", {class: "wrap"}, row.reason || "–"));
}

// `quiet`: a timer's refresh, which leaves older pages the operator opened alone.
export async function refreshAudit(more = false, {quiet = false} = {}) {
  if (quiet && auditPages > 1) return;
  const result = $("#audit-result");
  try {
    const after = more && auditNext ? "&after=" + encodeURIComponent(auditNext) : "";
    const answer = await api("/v1/audit?limit=20" + after, {admin: true});
    const body = $("#audit-table tbody");
    if (!more) body.replaceChildren();
    body.append(...answer.items.map(auditRow));
    labelCells($("#audit-table"));
    auditNext = answer.next;
    auditPages = more ? auditPages + 1 : 1;
    $("#audit-table").hidden = body.children.length === 0;
    $("#audit-older").hidden = !auditNext;
    answered(result, body.children.length ? "" : "No operator action yet.");
  } catch (error) {
    $("#audit-table").hidden = true;
    refused(result, "Audit log", error);
  }
}

function replayBody(dryRun) {
  const form = new FormData($("#replay"));
  const list = (name) => String(form.get(name) || "").split(",").map((s) => s.trim()).filter(Boolean);
  const body = {dry_run: dryRun, business_nos: list("business_nos"), statuses: list("statuses")};
  if (form.get("line")) body.line = form.get("line");
  const since = typedTime(form.get("since"));
  const until = typedTime(form.get("until"));
  if (since) body.since = since;
  if (until) body.until = until;
  const reason = String(form.get("reason") || "").trim();
  if (reason) body.reason = reason;
  return body;
}

async function replay(dryRun) {
  const result = $("#replay-result");
  say(result, dryRun ? "counting…" : "replaying…");
  try {
    const answer = await api("/v1/replay", {method: "POST", admin: true, body: replayBody(dryRun)});
    say(result, (answer.dry_run ? "Dry run: " : "Replayed: ") +
      `matched ${answer.matched}, ${answer.dry_run ? "would enqueue" : "enqueued"} ${answer.enqueued}, ` +
      `skipped already done ${answer.skipped_already_done}, skipped already synced ${answer.skipped_already_synced}` +
      (answer.dry_run ? "" : `, deferred ${answer.deferred}`), answer.dry_run ? "" : "done");
    result.dataset.matched = answer.matched;
    $("#replay-run").disabled = !answer.dry_run || answer.matched === 0;
  } catch (error) {
    say(result, "Replay refused: " + error.message, "error");
    $("#replay-run").disabled = true;
  }
}

export function setUpAdmin() {
  $("#audit-older").addEventListener("click", () => refreshAudit(true));
  $("#replay").addEventListener("submit", (event) => { event.preventDefault(); replay(true); });
  $("#replay").addEventListener("input", () => { $("#replay-run").disabled = true; });
  $("#replay-run").addEventListener("click", () => replay(false));
}
