// The console's progressive enhancement: live rows on the runs page, a live run page (its
// event stream, and its body redrawn from the server as events arrive), forms sent once, and
// times shown in the browser's zone. Every page works without it.
"use strict";

function localTimes(root) {
  for (const el of root.querySelectorAll(".ms[data-ms]")) {
    const ms = Number(el.dataset.ms);
    if (ms > 0) el.textContent = new Date(ms).toLocaleString();
  }
}

function sendOnce(root) {
  for (const form of root.querySelectorAll("form[data-once]")) {
    form.addEventListener("submit", () => {
      for (const b of form.querySelectorAll("button")) b.disabled = true;
    });
  }
}

async function fetchInto(el, url) {
  const reply = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  if (!reply.ok || reply.redirected) return false;
  el.innerHTML = await reply.text();
  localTimes(el);
  sendOnce(el);
  return true;
}

function pollRows() {
  const rows = document.getElementById("rows");
  if (!rows) return;
  setInterval(() => {
    if (!document.hidden) fetchInto(rows, rows.dataset.poll).catch(() => {});
  }, 2000);
}

function followRun() {
  const live = document.getElementById("live");
  const body = document.getElementById("run-body");
  if (!live || !body || live.dataset.status === "stopped") return;
  let pending = null;
  const redraw = () => {
    if (pending) return;
    pending = setTimeout(() => {
      pending = null;
      fetchInto(body, body.dataset.refresh).catch(() => {});
    }, 150);
  };
  const source = new EventSource(live.dataset.events);
  const onEvent = (message) => {
    const item = document.createElement("li");
    let summary = message.type;
    try {
      const data = JSON.parse(message.data);
      const parts = [];
      for (const k of ["step", "kind", "by", "tool", "why", "outcome", "detail", "reason", "code"]) {
        if (data[k] !== undefined && data[k] !== null && data[k] !== "") parts.push(`${k} ${typeof data[k] === "string" ? data[k] : JSON.stringify(data[k])}`);
      }
      summary = `${message.type}${parts.length ? ": " + parts.join(", ") : ""}`;
    } catch (e) { /* not JSON: the type alone */ }
    item.textContent = summary;
    item.className = `ev-${message.type}`;
    live.appendChild(item);
    redraw();
    if (message.type === "finished" || message.type === "error") {
      source.close();
      document.getElementById("live-state").textContent =
        message.type === "finished" ? "The run has ended." : "The stream ended; reload to follow again.";
    }
  };
  for (const type of live.dataset.types.split(" ")) source.addEventListener(type, onEvent);
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  sendOnce(document);
  pollRows();
  followRun();
});
