// The record browser (search with keyset pages), a record's detail with its attempts and
// audit rows, retry and cancel of one record, and bulk actions on the dead and failed.
"use strict";

import {$, TROUBLE, api, el, keepingFocus, say, timeEl, typedTime, utc} from "./api.js";

const RETRYABLE = new Set(["failed", "dead", "rejected"]);
const FINISHED = new Set(["done", "cancelled"]);
let query = null;      // the filters of the search shown
let nextCursor = null;
let openId = null;     // the record whose detail is open

// A failed record that spent no attempt waits (for its downstream, or for room): it is
// shown waiting, not as a failure.
function shownStatus(record) {
  return record.waiting_for ? "waiting" : record.status;
}

function statusText(record) {
  if (record.waiting_for) return `waiting for ${record.waiting_for}`;
  return TROUBLE.has(record.status) ? record.status.toUpperCase() : record.status;
}

function statusCell(record) {
  return el("td", {class: "status status-" + shownStatus(record), "data-status": record.status}, statusText(record));
}

function recordRow(record) {
  const open = el("button", {type: "button", class: "link", "data-record": record.id}, record.id);
  open.addEventListener("click", () => openRecord(record.id));
  return el("tr", {"data-record": record.id},
    el("td", {}, open), el("td", {}, record.line), el("td", {}, record.business_no),
    statusCell(record), el("td", {class: "num"}, String(record.attempts)),
    el("td", {}, timeEl(record.updated_at)), el("td", {}, record.status === "failed" ? timeEl(record.next_attempt_at) : "–"));
}

function searchParams(form) {
  const data = new FormData(form);
  const params = new URLSearchParams({limit: "25", include_payload: "false"});
  for (const name of ["line", "status", "business_no"]) {
    const value = String(data.get(name) || "").trim();
    if (value) params.set(name, value);
  }
  for (const name of ["since", "until"]) {
    const value = typedTime(data.get(name));
    if (value) params.set(name, value);
  }
  return params;
}

async function loadPage(after) {
  const result = $("#search-result");
  const params = new URLSearchParams(query);
  if (after) params.set("after", after);
  const answer = await api("/v1/records?" + params, {admin: true});
  const body = $("#record-list tbody");
  if (!after) body.replaceChildren();
  body.append(...answer.items.map(recordRow));
  $("#record-list").hidden = body.children.length === 0;
  nextCursor = answer.next;
  $("#next-page").hidden = !nextCursor;
  say(result, body.children.length ? `${body.children.length} record(s) shown` + (nextCursor ? ", more on the next page" : "") : "No record matches.");
}

export async function search(event) {
  if (event) event.preventDefault();
  const form = $("#search");
  const result = $("#search-result");
  const id = String(new FormData(form).get("id") || "").trim();
  try {
    if (id) {
      await openRecord(id);
      return;
    }
    query = searchParams(form);
    say(result, "searching…");
    await loadPage(null);
  } catch (error) {
    say(result, "Search refused: " + error.message, "error");
  }
}

// Show the records of a line in a status (a trouble link): fill the form and search.
export async function showRecords({line, status}) {
  const form = $("#search");
  form.elements.id.value = "";
  form.elements.business_no.value = "";
  form.elements.line.value = line;
  form.elements.status.value = status;
  await search();
  $("#records-title").scrollIntoView();
  const first = $("#record-list tbody button");
  (first || $("#search-result")).focus?.();
}

function field(name, value) { return [el("dt", {}, name), el("dd", {"data-field": name}, value)]; }

function renderDetail(record) {
  $("#detail-title").textContent = "Record " + record.id;
  const statusDd = el("span", {class: "status-" + shownStatus(record)},
    record.waiting_for ? `${record.status}, waiting for ${record.waiting_for} (no attempt spent)` : record.status);
  $("#detail-fields").replaceChildren(
    ...field("status", statusDd), ...field("line", record.line), ...field("business no.", record.business_no),
    ...field("source", record.source), ...field("attempts", String(record.attempts)),
    ...field("payload size", `${record.payload_bytes} bytes`),
    ...field("next attempt", record.status === "failed" ? timeEl(record.next_attempt_at) : `none (${record.status})`), ...field("created", timeEl(record.created_at)),
    ...field("updated", timeEl(record.updated_at)), ...field("finished", timeEl(record.finished_at)),
    ...field("last error", record.last_error || "–"), ...field("trace id", record.trace_id || "–"));
  const attempts = record.attempt_history.map((a) => el("tr", {"data-outcome": a.outcome},
    el("td", {class: "num"}, String(a.attempt)), el("td", {class: "status-" + (a.outcome === "done" ? "done" : "failed")}, a.outcome),
    el("td", {class: "num"}, a.http_status === null ? "–" : String(a.http_status)),
    el("td", {}, a.error_class ? `${a.error_class}: ${a.error_message || ""}` : "–"),
    el("td", {}, timeEl(a.started_at)), el("td", {class: "num"}, `${a.duration_ms} ms`),
    el("td", {}, `${a.worker.host}:${a.worker.pid}`)));
  $("#detail-attempts tbody").replaceChildren(...(attempts.length ? attempts : [el("tr", {}, el("td", {colspan: "7"}, "no attempt yet"))]));
  const audit = record.audit.map((row) => el("li", {},
    timeEl(row.time), ` ${row.actor} ${row.action}`, row.result ? ` → ${JSON.stringify(row.result)}` : "", row.reason ? ` (reason: ${row.reason})` : ""));
  $("#detail-audit").replaceChildren(...(audit.length ? audit : [el("li", {}, "none")]));
  $("#record-retry").disabled = !RETRYABLE.has(record.status);
  $("#record-cancel").disabled = FINISHED.has(record.status);
  $("#detail").dataset.status = record.status;
}

export async function openRecord(id) {
  const box = $("#detail");
  try {
    const record = await api(`/v1/records/${encodeURIComponent(id)}?include_payload=false`, {admin: true});
    const first = openId !== id;
    openId = id;
    if (first) say($("#action-result"), "");
    renderDetail(record);
    box.hidden = false;
    if (first) { box.scrollIntoView(); box.focus(); }
  } catch (error) {
    say($("#search-result"), `Record ${id}: ${error.message}`, "error");
  }
}

export async function refreshDetail() {
  if (openId && !$("#detail").hidden) await openRecord(openId);
}

async function act(kind) {
  const result = $("#action-result");
  const reason = String($("#record-actions").elements.reason.value || "").trim();
  if (kind === "cancel" && !reason) {
    say(result, "A reason is required to cancel.", "error");
    $("#record-actions").elements.reason.focus();
    return;
  }
  try {
    const record = await api(`/v1/records/${encodeURIComponent(openId)}/${kind}`, {method: "POST", admin: true, body: reason ? {reason} : undefined});
    say(result, `${kind === "retry" ? "Retried" : "Cancelled"} at ${utc(new Date().toISOString())}: now ${record.status}`, "done");
    await openRecord(openId);
  } catch (error) {
    say(result, `${kind === "retry" ? "Retry" : "Cancel"} refused: ${error.message}`, "error");
  }
}

// Bulk: a dry run counts first; the real run is the same request without dry_run.
function bulkBody(dryRun) {
  const data = new FormData($("#bulk"));
  return {line: data.get("line"), status: [data.get("status")], reason: String(data.get("reason") || "").trim(), dry_run: dryRun};
}

async function bulk(dryRun) {
  const form = $("#bulk");
  const result = $("#bulk-result");
  const run = $("#bulk-run");
  const action = new FormData(form).get("action");
  const body = bulkBody(dryRun);
  if (!body.line || !body.reason) {
    say(result, !body.line ? "Choose a line." : "A reason is required.", "error");
    (body.line ? form.elements.reason : form.elements.line).focus();
    return;
  }
  const acted = action === "retry" ? "retried" : "cancelled";
  try {
    say(result, dryRun ? "counting…" : "working…");
    const answer = await api(`/v1/records/${action}`, {method: "POST", admin: true, body});
    if (dryRun) {
      say(result, `Dry run: ${answer.matched} ${body.status[0]} record(s) of ${body.line} match; ${answer[acted]} would be ${acted}, ${answer.skipped_in_flight} in flight.`);
      result.dataset.count = String(answer[acted]);
      run.textContent = `${action === "retry" ? "Retry" : "Cancel"} ${answer[acted]} record(s)`;
      run.disabled = answer[acted] === 0;
      if (!run.disabled) run.focus();
    } else {
      let text = `Done: ${answer[acted]} of ${answer.matched} record(s) ${acted}; ${answer.skipped_in_flight} skipped in flight, ${answer.skipped_status} skipped by status.`;
      if (action === "retry") text += ` ${answer.enqueued} enqueued, ${answer.deferred} deferred.`;
      say(result, text, "done");
      run.disabled = true;
      run.textContent = "Run it";
    }
  } catch (error) {
    say(result, `Bulk ${action} refused: ${error.message}`, "error");
    run.disabled = true;
  }
}

export function renderTrouble(lines) {
  const rows = lines.map((line) => {
    const cell = (status) => {
      const n = line.counts[status] || 0;
      if (!n) return el("td", {class: "num"}, "0");
      const link = el("a", {href: "#records-title", class: "trouble", "data-line": line.line, "data-status": status}, String(n));
      link.addEventListener("click", (event) => { event.preventDefault(); showRecords({line: line.line, status}); });
      return el("td", {class: "num"}, link);
    };
    return el("tr", {"data-line": line.line}, el("td", {}, line.line), cell("dead"), cell("failed"));
  });
  keepingFocus($("#trouble-table"), () => $("#trouble-table tbody").replaceChildren(...rows));
}

export function setUpRecords() {
  $("#search").addEventListener("submit", search);
  $("#next-page").addEventListener("click", () => loadPage(nextCursor).catch((e) => say($("#search-result"), e.message, "error")));
  $("#record-retry").addEventListener("click", () => act("retry"));
  $("#record-cancel").addEventListener("click", () => act("cancel"));
  $("#bulk").addEventListener("submit", (event) => { event.preventDefault(); bulk(true); });
  $("#bulk").addEventListener("input", () => { $("#bulk-run").disabled = true; $("#bulk-run").textContent = "Run it"; });
  $("#bulk-run").addEventListener("click", () => bulk(false));
}
