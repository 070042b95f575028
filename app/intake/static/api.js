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

// Listeners told when an admin call was refused for want of a (valid) token.
const refusalListeners = [];
export function onRefused(listener) { refusalListeners.push(listener); }

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
  return answer;
}

// Every time on the page: UTC, ISO 8601, to the second.
export function utc(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  return date.toISOString().replace(/\.\d{3}Z$/, "Z");
}

export function timeEl(iso) {
  return iso ? el("time", {datetime: utc(iso)}, utc(iso)) : "–";
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

// Re-render `container` with `render()` without taking the keyboard's place away: the
// element that had focus in it is found again by its data attributes and focused.
const KEYS = ["data-line", "data-record", "data-status", "data-control", "data-schedule"];
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
