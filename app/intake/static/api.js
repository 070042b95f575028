// The console's calls to the intake, the admin token (held in this module only: never in
// storage or cookies, so it lasts as long as the tab), and small helpers for the DOM.
"use strict";

let adminToken = "";
const tokenListeners = [];

export const $ = (selector, root = document) => root.querySelector(selector);

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === false || value === null || value === undefined) continue;
    node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);  // text nodes: never HTML
  }
  return node;
}

export function hasToken() { return adminToken !== ""; }

export function setToken(value) {
  adminToken = value;
  for (const listener of tokenListeners) listener();
}

export function onToken(listener) { tokenListeners.push(listener); }

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// Listeners told when an admin call was refused for want of a (valid) token, and when one
// was answered with the token (it is good: stale refusals on the page can go).
const refusalListeners = [];
const acceptListeners = [];
export function onRefused(listener) { refusalListeners.push(listener); }
export function onAccepted(listener) { acceptListeners.push(listener); }

export async function api(path, {method = "GET", body, admin = false} = {}) {
  const headers = {accept: "application/json"};
  if (body !== undefined) headers["content-type"] = "application/json";
  if (admin && adminToken) headers.authorization = "Bearer " + adminToken;
  let response;
  try {
    response = await fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  } catch (error) {
    throw new ApiError(0, "unreachable", "the intake does not answer");
  }
  let answer = null;
  try { answer = await response.json(); } catch (error) { answer = null; }
  if (!response.ok) {
    const detail = answer && answer.error ? answer.error : {code: "http_" + response.status, message: "HTTP " + response.status};
    const failure = new ApiError(response.status, detail.code, detail.message);
    if (admin && (response.status === 401 || response.status === 403)) {
      for (const listener of refusalListeners) listener(failure);
    }
    throw failure;
  }
  if (admin && adminToken) for (const listener of acceptListeners) listener();
  return answer;
}

// Every time on the page: UTC, ISO 8601, to the second.
export function utc(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  return date.toISOString().replace(/\.\d{3}Z$/, "Z");
}

// A time shown: UTC as text, the reader's local time in its hover title.
export function timeEl(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  const local = Number.isNaN(date.getTime()) ? null : "local time: " + date.toLocaleString();
  return el("time", {datetime: utc(iso), title: local}, utc(iso));
}

export function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 90) return Math.round(seconds) + " s";
  if (seconds < 5400) return Math.round(seconds / 60) + " min";
  if (seconds < 172800) return (seconds / 3600).toFixed(1) + " h";
  return (seconds / 86400).toFixed(1) + " d";
}

// A time typed by the operator: ISO 8601; without a zone it is taken as UTC.
export function typedTime(text) {
  const value = String(text || "").trim();
  if (!value) return undefined;
  const withZone = /([zZ]|[+-]\d\d:?\d\d)$/.test(value) ? value : value + "Z";
  if (Number.isNaN(new Date(withZone).getTime())) throw new Error(`"${value}" is not an ISO 8601 time, e.g. 2026-01-31T08:00:00Z`);
  return withZone;
}

export function say(node, text, kind = "") {
  node.className = "result" + (kind ? " " + kind : "");
  node.textContent = text;
}

export const TROUBLE = new Set(["failed", "dead"]);

// The list each trouble status has its own view for: failed records are the retries.
export const TROUBLE_VIEW = {failed: "retries", dead: "dead"};

// A console address: `#/view/part?query`, with empty query values left out.
export function href(path, params = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    for (const one of [].concat(value)) if (one !== undefined && one !== null && one !== "") query.append(key, one);
  }
  const text = query.toString();
  return "#/" + path + (text ? "?" + text : "");
}

// Each cell of `table`'s body gets its column's heading as `data-label`: a narrow screen
// stacks a row's cells, each under its label, instead of scrolling sideways.
export function labelCells(table) {
  const labels = [...table.querySelectorAll("thead th")].map((th) => th.dataset.label || th.textContent.trim());
  for (const row of table.tBodies[0].rows) {
    [...row.cells].forEach((cell, i) => { if (labels[i] && !cell.hasAttribute("colspan")) cell.dataset.label = labels[i]; });
  }
}

// Re-render `container` with `render()` without taking the keyboard's place away: the
// element that had focus in it is found again by its data attributes and focused.
const KEYS = ["data-line", "data-record", "data-status", "data-control", "data-schedule", "data-alert"];
export function keepingFocus(container, render) {
  const active = document.activeElement;
  let selector = null;
  if (active && active !== document.body && container.contains(active)) {
    const own = KEYS.filter((k) => active.hasAttribute(k)).map((k) => `[${k}="${CSS.escape(active.getAttribute(k))}"]`).join("");
    const card = active.closest("[data-line]");
    const scope = card && card !== active && container.contains(card) ? `[data-line="${CSS.escape(card.getAttribute("data-line"))}"] ` : "";
    selector = own ? scope + active.tagName.toLowerCase() + own : null;
  }
  render();
  if (selector) {
    const again = container.querySelector(selector);
    if (again) again.focus();
  }
}

// A page of `GET /v1/records`: a search by error words reads a bounded stretch of the
// journal per request, so a page may come back empty with `next` set; this follows
// `next` until it finds records or the end (at most `MAX_STRETCHES` requests).
const MAX_STRETCHES = 20;
export async function recordsPage(params) {
  const query = new URLSearchParams(params);
  let answer = null;
  for (let i = 0; i < MAX_STRETCHES; i++) {
    answer = await api("/v1/records?" + query, {admin: true});
    if (answer.items.length || !answer.next) break;
    query.set("after", answer.next);
  }
  return answer;
}
