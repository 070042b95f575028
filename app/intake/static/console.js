// The console: wires the views, asks for the admin token (once per tab, kept in memory
// only) and polls the intake.
"use strict";

import {$, onRefused, onToken, setToken, utc} from "./api.js";
import {refreshAudit, refreshSchedules, setUpAdmin} from "./admin.js";
import {refreshAlerts, refreshHealth, refreshLines, refreshThroughput, setNavigation} from "./overview.js";
import {openRecord, refreshDetail, renderTrouble, setUpRecords, showRecords} from "./records.js";

const POLL_MS = 2000;
const SLOW_POLL_MS = 10000;

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
    setToken(value);
    form.dataset.sets = String(Number(form.dataset.sets || 0) + 1);
    $("#token-forget").hidden = false;
    tokenState("Token set for this tab (never stored).", "ok");
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
  onToken(() => { refreshAdmin(); refreshDetail().catch(() => {}); });
}

function refreshAdmin({quiet = false} = {}) {
  refreshSchedules();
  refreshAudit(false, {quiet});
}

async function refresh() {
  const updated = $("#updated");
  try {
    await Promise.all([
      refreshThroughput().catch(() => null).then(refreshLines).then((lines) => renderTrouble(lines)),
      refreshHealth(),
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

setNavigation({showRecords, openRecord});
setUpToken();
setUpRecords();
setUpAdmin();
refresh();
refreshAdmin();
setInterval(refresh, POLL_MS);
setInterval(() => refreshAdmin({quiet: true}), SLOW_POLL_MS);
