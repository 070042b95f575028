// The console: its addresses (hash routes, one per view: back and forward move between
// them, a pasted address opens its view with its filters), the admin token (once per tab,
// kept in memory only), and the polling of the intake (paused and resumed by the operator).
"use strict";

import {$, onAccepted, onRefused, onToken, setToken, utc} from "./api.js";
import {refreshAudit, refreshSchedules, setUpAdmin} from "./admin.js";
import {refreshAlerts, refreshHealth, refreshLines, refreshThroughput, showLine} from "./overview.js";
import {closeRecord, refreshDetail, setUpRecords, showList, showRecord, showSearch} from "./records.js";

const POLL_MS = 2000;
const SLOW_POLL_MS = 10000;
let route = {view: "overview", arg: null, params: new URLSearchParams()};
let timers = [];

// `#/view/arg?query` → the view, its argument and its query ("#/" or no hash: the overview).
function parse(hash) {
  const text = hash.replace(/^#\/?/, "");
  const [path, search = ""] = text.split("?");
  const [head = "", ...rest] = path.split("/");
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : null;
  const params = new URLSearchParams(search);
  if (head === "records" && arg) return {view: "record", arg, params};
  if (head === "lines" && arg) return {view: "line", arg, params};
  const known = ["alerts", "retries", "dead", "records", "schedules", "replay", "audit"];
  return {view: known.includes(head) ? head : "overview", arg: null, params};
}

const VIEWS = {
  record: () => showRecord(route.arg),
  records: () => showSearch(route.params),
  dead: () => showList("dead", route.params),
  retries: () => showList("retries", route.params),
  schedules: () => refreshSchedules(),
  audit: () => refreshAudit(false),
};

// Show the view the address names: its sections, its nav link marked, its data loaded.
let routed = false;
function showRoute({focus = true} = {}) {
  // An in-page anchor (the skip link) leaves the view shown as it is.
  if (routed && location.hash && !location.hash.startsWith("#/")) return;
  routed = true;
  route = parse(location.hash.startsWith("#/") ? location.hash : "");
  for (const section of document.querySelectorAll("main > section")) {
    section.hidden = !section.dataset.views.split(" ").includes(route.view);
  }
  const navView = route.view === "record" ? "records" : route.view === "line" ? "overview" : route.view;
  for (const link of document.querySelectorAll("nav a[data-view]")) {
    if (link.dataset.view === navView) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  if (route.view !== "record") closeRecord();
  showLine(route.view === "line" ? route.arg : null);
  document.title = "Pipeline console · " + (route.arg ? `${route.view} ${route.arg}` : route.view);
  const load = VIEWS[route.view];
  if (load) load();
  if (route.view === "line" || route.view === "overview") refreshLines().catch(() => {});
  if (focus && route.view !== "record") {
    const heading = document.querySelector("main > section:not([hidden]) h2");
    if (heading) heading.focus({preventScroll: false});
  }
}

// Go to an address: a new history entry (shown again when it is the one open).
function navigate(address) {
  if (location.hash === address) showRoute();
  else location.hash = address;
}

function tokenState(text, kind = "") {
  const state = $("#token-state");
  state.textContent = text;
  state.className = kind;
}

function setUpToken() {
  const form = $("#token-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("#token-input");
    const value = input.value.trim();
    input.value = "";  // held by the page's script, not left in the field
    if (!value) return;
    tokenState("Token set for this tab (never stored).", "ok");
    setToken(value);
    form.dataset.sets = String(Number(form.dataset.sets || 0) + 1);
    $("#token-forget").hidden = false;
  });
  $("#token-forget").addEventListener("click", () => {
    setToken("");
    $("#token-forget").hidden = true;
    tokenState("Token forgotten.");
    $("#token-input").focus();
  });
  onRefused((error) => {
    tokenState(error.status === 403 ? "That admin token is not valid: enter another." : "This needs the admin token: enter it here.", "bad");
  });
  onAccepted(() => {
    if ($("#token-state").className === "bad") tokenState("Token accepted for this tab (never stored).", "ok");
  });
  // A new token: every admin read of the view shown is asked again.
  onToken(() => {
    refresh();
    refreshAdmin();
    if (VIEWS[route.view] && route.view !== "schedules" && route.view !== "audit") VIEWS[route.view]();
  });
}

function refreshAdmin({quiet = false} = {}) {
  refreshSchedules();
  refreshAudit(false, {quiet});
}

async function refresh() {
  const updated = $("#updated");
  try {
    await Promise.all([
      // The state first: the lines' cards show the reasons it gives for each line.
      refreshHealth().then(() => null, (error) => error).then(async (failure) => {
        await refreshThroughput().catch(() => null);
        await refreshLines();
        if (failure) throw failure;
      }),
      refreshAlerts().catch(() => null),
      refreshDetail().catch(() => null),
    ]);
    updated.textContent = "updated " + utc(new Date().toISOString());
    updated.classList.remove("stale");
  } catch (error) {
    updated.textContent = "not updating: " + error.message;
    updated.classList.add("stale");
  }
}

function startTimers() {
  timers = [setInterval(refresh, POLL_MS), setInterval(() => refreshAdmin({quiet: true}), SLOW_POLL_MS)];
}

function setUpRefresh() {
  const toggle = $("#refresh-toggle");
  const state = $("#refresh-state");
  state.textContent = `refreshes every ${POLL_MS / 1000} s`;
  toggle.addEventListener("click", () => {
    const pausing = timers.length > 0;
    if (pausing) { timers.forEach(clearInterval); timers = []; } else { startTimers(); refresh(); }
    toggle.setAttribute("aria-pressed", String(pausing));
    toggle.textContent = pausing ? "Resume auto-refresh" : "Pause auto-refresh";
    state.textContent = pausing ? "auto-refresh paused" : `refreshes every ${POLL_MS / 1000} s`;
    $("#refresh").classList.toggle("paused", pausing);
  });
  // Now: everything, and the view shown read again (a timer leaves a list's rows alone).
  $("#refresh-now").addEventListener("click", () => {
    refresh();
    refreshAdmin();
    if (VIEWS[route.view] && route.view !== "schedules" && route.view !== "audit") VIEWS[route.view]();
  });
}

setUpToken();
setUpRecords(navigate);
setUpAdmin();
setUpRefresh();
window.addEventListener("hashchange", () => showRoute());
showRoute({focus: false});
refresh();
refreshAdmin();
startTimers();
