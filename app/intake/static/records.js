// The record views: the search (its filters are its address), one record (payload,
// attempts with the downstream's answers, audit rows, retry and cancel), and the Retries
// and Dead lists (newest first, per line, with an error filter, rows selected or all
// matching, retried or cancelled after a dry run).
"use strict";

import {$, TROUBLE, api, el, href, keepingFocus, labelCells, recordsPage, say, timeEl, typedTime, utc} from "./api.js";

const RETRYABLE = new Set(["failed", "dead", "rejected"]);
const FINISHED = new Set(["done", "cancelled"]);
const SEARCHED = ["line", "status", "business_no", "error", "since", "until", "order"];
const PAYLOAD_SHOWN = 64 * 1024;  // characters of pretty JSON shown at most
const LIST_PAGE = 50;
const LISTS = {
  dead: {status: "dead", title: "Dead records", empty: "No dead record"},
  retries: {status: "failed", title: "Retries (failed records, to be tried again)", empty: "No record waits for a retry"},
};
let go = (address) => { location.hash = address; };
let query = null;      // the API query of the search shown
let nextCursor = null;
let openId = null;     // the record whose view is open
const list = {kind: "dead", line: "", error: "", next: null, selected: new Set(), tried: null};

// A failed record that spent no attempt waits (for its downstream, or for room): it is
// shown waiting, not as a failure.
function shownStatus(record) {
  return record.waiting_for ? "waiting" : record.status;
}

function statusText(record) {
  if (record.waiting_for) return `waiting for ${record.waiting_for}`;
  return TROUBLE.has(record.status) ? record.status.toUpperCase() : record.status;
}

function recordLink(id) {
  return el("a", {href: href("records/" + encodeURIComponent(id)), class: "record-link", "data-record": id}, id);
}

function recordRow(record) {
  return el("tr", {"data-record": record.id},
    el("td", {}, recordLink(record.id)), el("td", {}, record.line), el("td", {}, record.business_no),
    el("td", {class: "status status-" + shownStatus(record), "data-status": record.status}, statusText(record)),
    el("td", {class: "num"}, String(record.attempts)),
    el("td", {}, timeEl(record.updated_at)), el("td", {}, record.status === "failed" ? timeEl(record.next_attempt_at) : "–"));
}

// ---- the search: its address holds its filters ----

function formParams(form) {
  const data = new FormData(form);
  const params = {};
  for (const name of SEARCHED) {
    const value = String(data.get(name) || "").trim();
    if (value) params[name] = ["since", "until"].includes(name) ? typedTime(value) : value;
  }
  if (params.order === "oldest") delete params.order;
  return params;
}

async function loadPage(after) {
  const params = new URLSearchParams(query);
  if (after) params.set("after", after);
  const answer = await recordsPage(params);
  const body = $("#record-list tbody");
  if (!after) body.replaceChildren();
  body.append(...answer.items.map(recordRow));
  labelCells($("#record-list"));
  $("#record-list").hidden = body.children.length === 0;
  nextCursor = answer.next;
  $("#next-page").hidden = !nextCursor;
  say($("#search-result"), body.children.length ? `${body.children.length} record(s) shown` + (nextCursor ? ", more on the next page" : "") : "No record matches.");
}

// The search view, from its address: the form shows the filters, the table their records.
export async function showSearch(params) {
  const form = $("#search");
  form.elements.id.value = "";
  for (const name of SEARCHED) form.elements[name].value = params.get(name) || (name === "order" ? "oldest" : "");
  const result = $("#search-result");
  try {
    query = new URLSearchParams({limit: "25", include_payload: "false"});
    for (const name of SEARCHED) {
      const value = params.get(name);
      if (value) query.set(name, ["since", "until"].includes(name) ? typedTime(value) : value);
    }
    say(result, "searching…");
    await loadPage(null);
  } catch (error) {
    say(result, "Search refused: " + error.message, "error");
  }
}

function submitSearch(event) {
  event.preventDefault();
  const form = $("#search");
  const id = String(form.elements.id.value || "").trim();
  try {
    go(id ? href("records/" + encodeURIComponent(id)) : href("records", formParams(form)));
  } catch (error) {
    say($("#search-result"), "Search refused: " + error.message, "error");
  }
}

// ---- one record ----

function field(name, value) { return [el("dt", {}, name), el("dd", {"data-field": name}, value)]; }

function showPayload(record) {
  const note = $("#payload-note");
  if (record.payload === undefined) {
    $("#payload").textContent = "–";
    say(note, `not shown (${record.payload_bytes} bytes)`);
    return;
  }
  const text = JSON.stringify(record.payload, null, 2);
  const cut = text.length > PAYLOAD_SHOWN;
  $("#payload").textContent = cut ? text.slice(0, PAYLOAD_SHOWN) + "\n…" : text;
  $("#payload").dataset.cut = String(cut);
  say(note, cut ? `Cut: the first ${PAYLOAD_SHOWN / 1024} KiB of ${Math.ceil(text.length / 1024)} KiB shown.` : `${record.payload_bytes} bytes`);
}

function renderDetail(record) {
  $("#detail-title").textContent = "Record " + record.id;
  const statusDd = el("span", {class: "status-" + shownStatus(record)},
    record.waiting_for ? `${record.status}, waiting for ${record.waiting_for} (no attempt spent)` : record.status);
  $("#detail-fields").replaceChildren(
    ...field("status", statusDd), ...field("line", el("a", {href: href("lines/" + encodeURIComponent(record.line))}, record.line)),
    ...field("business no.", record.business_no),
    ...field("source", record.source), ...field("attempts", String(record.attempts)),
    ...field("payload size", `${record.payload_bytes} bytes`),
    ...field("next attempt", record.status === "failed" ? timeEl(record.next_attempt_at) : `none (${record.status})`), ...field("created", timeEl(record.created_at)),
    ...field("updated", timeEl(record.updated_at)), ...field("finished", timeEl(record.finished_at)),
    ...field("last error", record.last_error || "–"), ...field("trace id", record.trace_id || "–"));
  showPayload(record);
  const attempts = (record.attempt_history || []).map((a) => el("tr", {"data-outcome": a.outcome},
    el("td", {class: "num"}, String(a.attempt)), el("td", {class: "status-" + (a.outcome === "done" ? "done" : "failed")}, a.outcome),
    el("td", {class: "num http"}, a.http_status === null || a.http_status === undefined ? "–" : String(a.http_status)),
    el("td", {class: "answer"}, a.http_answer ? el("code", {}, a.http_answer) : "–"),
    el("td", {}, a.error_class ? `${a.error_class}: ${a.error_message || ""}` : "–"),
    el("td", {}, timeEl(a.started_at)), el("td", {class: "num"}, `${a.duration_ms} ms`),
    el("td", {}, a.worker ? `${a.worker.host}:${a.worker.pid}` : "–")));
  $("#detail-attempts tbody").replaceChildren(...(attempts.length ? attempts : [el("tr", {}, el("td", {colspan: "8"}, "no attempt yet"))]));
  labelCells($("#detail-attempts"));
  const audit = (record.audit || []).map((row) => el("li", {},
    timeEl(row.time), ` ${row.actor} ${row.action}`, row.result ? ` → ${JSON.stringify(row.result)}` : "", row.reason ? ` (reason: ${row.reason})` : ""));
  $("#detail-audit").replaceChildren(...(audit.length ? audit : [el("li", {}, "none")]));
  $("#record-retry").disabled = !RETRYABLE.has(record.status);
  $("#record-cancel").disabled = FINISHED.has(record.status);
  $("#detail").dataset.status = record.status;
}

async function loadRecord(id) {
  const record = await api(`/v1/records/${encodeURIComponent(id)}`, {admin: true});
  if (openId !== id) return;  // another record was opened meanwhile
  say($("#detail-result"), "");
  renderDetail(record);
}

// The record view, from its address.
export async function showRecord(id) {
  const first = openId !== id;
  openId = id;
  if (first) {
    say($("#action-result"), "");
    $("#detail").dataset.status = "";
    $("#detail-title").textContent = "Record " + id;
    for (const node of [$("#detail-fields"), $("#detail-attempts tbody"), $("#detail-audit")]) node.replaceChildren();
    $("#payload").textContent = "";
    say($("#payload-note"), "");
  }
  try {
    await loadRecord(id);
  } catch (error) {
    say($("#detail-result"), `Record ${id}: ${error.message}`, "error");
  }
  if (first) $("#detail").focus();
}

export function closeRecord() { openId = null; }

export async function refreshDetail() {
  if (openId) await loadRecord(openId);
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
    await loadRecord(openId);
  } catch (error) {
    say(result, `${kind === "retry" ? "Retry" : "Cancel"} refused: ${error.message}`, "error");
  }
}

// ---- the Retries and Dead lists ----

function lastErrorCell(record) {
  const last = record.last_attempt || null;
  const http = last && last.http_status !== null && last.http_status !== undefined ? last.http_status : null;
  return el("td", {class: "last-error"},
    el("span", {class: "http" + (http === null ? "" : " bad")}, http === null ? "HTTP –" : `HTTP ${http}`), " ",
    last && last.http_answer ? el("code", {class: "answer"}, last.http_answer.slice(0, 300)) : null,
    el("small", {class: "error-text"}, record.last_error ? record.last_error.slice(0, 300) : "–"));
}

function listRow(record) {
  const box = el("input", {type: "checkbox", class: "pick", "data-record": record.id, "aria-label": "Select " + record.id});
  box.checked = list.selected.has(record.id);
  return el("tr", {"data-record": record.id, class: box.checked ? "picked" : ""},
    el("td", {class: "pick-cell"}, box), el("td", {}, recordLink(record.id)), el("td", {}, record.line),
    el("td", {}, record.business_no), el("td", {class: "num"}, String(record.attempts)),
    lastErrorCell(record), el("td", {}, timeEl(record.updated_at)));
}

function listQuery(after) {
  const params = new URLSearchParams({status: LISTS[list.kind].status, order: "newest", limit: String(LIST_PAGE), include_payload: "false"});
  if (list.line) params.set("line", list.line);
  if (list.error) params.set("error", list.error);
  if (after) params.set("after", after);
  return params;
}

function resetRun() {
  const run = $("#list-run");
  run.disabled = true;
  run.textContent = "Run it";
  list.tried = null;
}

function selectionChanged() {
  $("#list-selected").textContent = String(list.selected.size);
  const boxes = [...document.querySelectorAll("#list-table .pick")];
  $("#list-all").checked = boxes.length > 0 && boxes.every((b) => b.checked);
  resetRun();
}

async function loadList(after) {
  const result = $("#list-result");
  const answer = await recordsPage(listQuery(after));
  const body = $("#list-table tbody");
  const rows = answer.items.map(listRow);
  keepingFocus(body, () => { if (after) body.append(...rows); else body.replaceChildren(...rows); });
  labelCells($("#list-table"));
  $("#list-table").hidden = body.children.length === 0;
  list.next = answer.next;
  $("#list-older").hidden = !list.next;
  const where = (list.line ? ` on ${list.line}` : " on every line") + (list.error ? `, last error containing "${list.error}"` : "");
  say(result, body.children.length
    ? `${body.children.length} record(s) shown, newest first${where}` + (list.next ? "; older ones on the next page" : "")
    : `${LISTS[list.kind].empty}${where}.`);
  selectionChanged();
}

// A list view, from its address (`kind`: dead or retries).
export async function showList(kind, params) {
  const changed = kind !== list.kind || (params.get("line") || "") !== list.line || (params.get("error") || "") !== list.error;
  list.kind = kind;
  list.line = params.get("line") || "";
  list.error = params.get("error") || "";
  $("#list-title").textContent = LISTS[kind].title;
  const form = $("#list-filter");
  form.elements.line.value = list.line;
  if (form.elements.line.value !== list.line) {  // a line the chooser does not list yet
    form.elements.line.append(el("option", {value: list.line}, list.line));
    form.elements.line.value = list.line;
  }
  form.elements.error.value = list.error;
  if (changed) {
    list.selected.clear();
    say($("#list-action-result"), "");
  }
  try {
    say($("#list-result"), "loading…");
    await loadList(null);
  } catch (error) {
    say($("#list-result"), "The list is refused: " + error.message, "error");
  }
}

function listBody(dryRun) {
  const form = $("#list-actions");
  const body = {status: [LISTS[list.kind].status], dry_run: dryRun};
  if (form.elements.scope.value === "selected") {
    body.ids = [...list.selected];
  } else {
    if (list.line) body.line = list.line;
    if (list.error) body.error = list.error;
  }
  const reason = String(form.elements.reason.value || "").trim();
  if (reason) body.reason = reason;
  return body;
}

async function listAction(dryRun) {
  const form = $("#list-actions");
  const result = $("#list-action-result");
  const run = $("#list-run");
  const action = form.elements.action.value;
  const acted = action === "retry" ? "retried" : "cancelled";
  const body = dryRun ? listBody(true) : {...list.tried, dry_run: false};
  if (body.ids && body.ids.length === 0) {
    say(result, "Select rows first, or choose all matching this filter.", "error");
    return;
  }
  if (action === "cancel" && !body.reason) {
    say(result, "A reason is required to cancel.", "error");
    form.elements.reason.focus();
    return;
  }
  try {
    say(result, dryRun ? "counting…" : "working…");
    const answer = await api(`/v1/records/${action}`, {method: "POST", admin: true, body});
    const n = answer[acted] ?? 0;
    if (dryRun) {
      list.tried = body;
      say(result, `Dry run: ${answer.matched} record(s) match; ${n} would be ${acted}, ${answer.skipped_in_flight ?? 0} in flight, ${answer.skipped_status ?? 0} in another status.`);
      result.dataset.count = String(n);
      run.textContent = `${action === "retry" ? "Retry" : "Cancel"} ${n} record(s)`;
      run.disabled = n === 0;
      if (!run.disabled) run.focus();
    } else {
      let text = `Done: ${n} of ${answer.matched} record(s) ${acted}; ${answer.skipped_in_flight ?? 0} skipped in flight, ${answer.skipped_status ?? 0} skipped by status.`;
      if (action === "retry") text += ` ${answer.enqueued ?? "–"} enqueued, ${answer.deferred ?? "–"} deferred.`;
      resetRun();
      list.selected.clear();
      say(result, text, "done");
      await loadList(null);
    }
  } catch (error) {
    say(result, `${action === "retry" ? "Retry" : "Cancel"} refused: ${error.message}`, "error");
    resetRun();
  }
}

function setUpList() {
  $("#list-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(event.target);
    go(href(list.kind, {line: String(data.get("line") || ""), error: String(data.get("error") || "").trim()}));
  });
  $("#list-view").addEventListener("change", (event) => {
    const box = event.target;
    if (box.id === "list-all") {
      for (const pick of document.querySelectorAll("#list-table .pick")) {
        pick.checked = box.checked;
        pick.closest("tr").classList.toggle("picked", box.checked);
        if (box.checked) list.selected.add(pick.dataset.record); else list.selected.delete(pick.dataset.record);
      }
    } else if (box.classList && box.classList.contains("pick")) {
      if (box.checked) list.selected.add(box.dataset.record); else list.selected.delete(box.dataset.record);
      box.closest("tr").classList.toggle("picked", box.checked);
      if (box.checked) $("#list-actions").elements.scope.value = "selected";
    } else {
      return;
    }
    selectionChanged();
  });
  $("#list-older").addEventListener("click", () => loadList(list.next).catch((e) => say($("#list-result"), e.message, "error")));
  $("#list-actions").addEventListener("submit", (event) => { event.preventDefault(); listAction(true); });
  $("#list-actions").addEventListener("input", resetRun);
  $("#list-run").addEventListener("click", () => listAction(false));
}

export function setUpRecords(navigate) {
  go = navigate;
  $("#search").addEventListener("submit", submitSearch);
  $("#next-page").addEventListener("click", () => loadPage(nextCursor).catch((e) => say($("#search-result"), e.message, "error")));
  $("#record-retry").addEventListener("click", () => act("retry"));
  $("#record-cancel").addEventListener("click", () => act("cancel"));
  setUpList();
}
