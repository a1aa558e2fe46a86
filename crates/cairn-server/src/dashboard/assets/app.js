// Cairn's dashboard: local times, live refresh over the API's Server-Sent Events, the
// timeline's attempt details, selection helpers and form checks. No dependencies.
"use strict";

// Times arrive in UTC (`<time datetime>`); show them in the viewer's zone, UTC on hover.
function localTimes(root) {
  for (const t of root.querySelectorAll("time[datetime]")) {
    const d = new Date(t.getAttribute("datetime"));
    if (!isNaN(d)) t.textContent = d.toLocaleString();
  }
  // Filter inputs hold UTC; show the viewer's local time in them.
  for (const input of root.querySelectorAll("input[type=datetime-local][data-utc]")) {
    const utc = input.dataset.utc;
    if (!utc) continue;
    const d = new Date(utc);
    if (isNaN(d)) continue;
    const local = new Date(d.getTime() - d.getTimezoneOffset() * 60000);
    input.value = local.toISOString().slice(0, 16);
  }
}

// Replace each `[data-live]` region with the same region of a fresh copy of the page,
// keeping what the viewer selected.
let refreshing = false, again = false;
async function refresh() {
  if (refreshing) { again = true; return; }
  refreshing = true;
  try {
    const response = await fetch(location.href, { headers: { "Accept": "text/html" }, credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    const checked = new Set([...document.querySelectorAll("input[name=sel]:checked")].map(i => i.value));
    const focused = document.activeElement && document.activeElement.closest("[data-live]") ? null : document.activeElement;
    for (const region of document.querySelectorAll("[data-live]")) {
      const next = fresh.querySelector(`[data-live="${region.dataset.live}"]`);
      if (!next) continue;
      // Keep the open streams: a region's stream attribute is read once.
      if (region.dataset.streams !== undefined) next.dataset.streams = region.dataset.streams;
      region.replaceWith(next);
      localTimes(next);
    }
    for (const box of document.querySelectorAll("input[name=sel]")) box.checked = checked.has(box.value);
    if (focused && document.contains(focused)) focused.focus();
    wireSegments(document);
    document.dispatchEvent(new CustomEvent("cairn:refreshed"));
  } finally {
    refreshing = false;
    if (again) { again = false; setTimeout(refresh, 150); }
  }
}

let pending = null;
function soon() {
  if (pending) return;
  pending = setTimeout(() => { pending = null; refresh(); }, 500);
}

// The API's stream names each event after its record (`STEP_START`, …).
const KINDS = ["WORKFLOW_QUEUED", "WORKFLOW_START", "WORKFLOW_SUCCESS", "WORKFLOW_FAILURE",
  "WORKFLOW_TERMINATED", "STEP_START", "STEP_SUCCESS", "STEP_FAILURE", "SLEEP_START",
  "SLEEP_COMPLETE", "ATTEMPT_START", "ATTEMPT_SUCCESS", "ATTEMPT_FAILURE", "WAIT_START",
  "WAIT_COMPLETE", "WAIT_TIMED_OUT", "ROLLBACK_START", "ROLLBACK_STEP_START",
  "ROLLBACK_ATTEMPT_START", "ROLLBACK_ATTEMPT_SUCCESS", "ROLLBACK_ATTEMPT_FAILURE",
  "ROLLBACK_STEP_SUCCESS", "ROLLBACK_STEP_FAILURE", "ROLLBACK_COMPLETE", "ROLLBACK_FAILED",
  "WORKFLOW_PAUSED", "WORKFLOW_RESUMED", "WORKFLOW_WAITING",
  "CHILD_START", "CHILD_COMPLETE", "CHILD_FAILURE",
  // The dashboard's own stream of every workflow says only this.
  "change"];
const TERMINAL = new Set(["WORKFLOW_SUCCESS", "WORKFLOW_FAILURE", "WORKFLOW_TERMINATED"]);

// Follow the streams a page names; each record means "something changed". An instance's
// stream ends with its terminal record: then refresh once more and stop (a reconnect
// would only be told the same).
const sources = [];
function follow(urls, endsWithInstance) {
  for (const url of urls) {
    if (!url) continue;
    const source = new EventSource(url, { withCredentials: true });
    sources.push(source);
    source.onmessage = soon;
    for (const kind of KINDS) {
      source.addEventListener(kind, () => {
        if (endsWithInstance && TERMINAL.has(kind)) source.close();
        soon();
      });
    }
  }
}

function wireSegments(root) {
  const detail = root.querySelector("#seg-detail");
  if (!detail) return;
  for (const seg of root.querySelectorAll(".seg.attempt")) {
    const show = () => { detail.textContent = seg.dataset.detail; };
    seg.addEventListener("click", show);
    seg.addEventListener("focus", show);
    seg.addEventListener("mouseenter", show);
  }
}

// A browser opens at most six connections to a server, and a page kept for the back
// button keeps its streams open: close them when the page is left, and show fresh data
// if it comes back.
window.addEventListener("pagehide", () => { for (const s of sources) s.close(); });
window.addEventListener("pageshow", (e) => { if (e.persisted) location.reload(); });

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  wireSegments(document);

  const list = document.querySelector("[data-live=list][data-streams]");
  if (list) follow(list.dataset.streams.split(" "), false);
  const instance = document.querySelector("[data-live=instance][data-stream]");
  if (instance && instance.dataset.stream) follow([instance.dataset.stream], true);
  if (document.querySelector("[data-live=overview]")) setInterval(soon, 10000);

  // Select every row on this page.
  document.addEventListener("change", (e) => {
    if (e.target.id === "select-all") {
      for (const box of document.querySelectorAll("input[name=sel]")) box.checked = e.target.checked;
    }
  });

  // Filter times: the viewer enters local time; send UTC.
  const filter = document.querySelector("form#filter");
  if (filter) filter.addEventListener("submit", () => {
    for (const input of filter.querySelectorAll("input[type=datetime-local]")) {
      if (!input.value) { input.disabled = true; continue; }
      const d = new Date(input.value);
      if (isNaN(d)) continue;
      const hidden = document.createElement("input");
      hidden.type = "hidden"; hidden.name = input.name; hidden.value = d.toISOString();
      input.disabled = true;
      filter.appendChild(hidden);
    }
    // Leave empty fields out of the URL.
    for (const field of filter.querySelectorAll("select, input[type=search]")) if (!field.value) field.disabled = true;
  });

  // An event's payload must be JSON (or empty) before it is sent.
  for (const area of document.querySelectorAll("textarea[data-json]")) {
    const check = () => {
      const text = area.value.trim();
      let message = "";
      if (text) { try { JSON.parse(text); } catch (e) { message = "Not JSON: " + e.message; } }
      area.setCustomValidity(message);
      area.classList.toggle("invalid", message !== "");
    };
    area.addEventListener("input", check);
    area.form.addEventListener("submit", (e) => { check(); if (!area.form.checkValidity()) { e.preventDefault(); area.reportValidity(); } });
  }
});
