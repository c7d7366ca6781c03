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
  const writing = beingWritten(Number(live.dataset.steps || 0));
  for (const type of live.dataset.output.split(" ")) source.addEventListener(type, writing.said);
  source.addEventListener("turn", writing.committed);
}

// The turn being written: its answer's words as the model writes them and its tools with
// their progress, from the run's live output (docs/live.md). A turn's committed event ends
// it; an abandoned attempt's words are dropped; a turn already committed is not shown.
function beingWritten(steps) {
  const box = document.getElementById("writing");
  const text = document.getElementById("writing-text");
  const tools = document.getElementById("writing-tools");
  const note = document.getElementById("writing-note");
  const turnName = document.getElementById("writing-turn");
  let committed = steps, turn = 0;
  const clear = () => { text.textContent = ""; tools.textContent = ""; note.textContent = ""; };
  const toolItem = (data) => {
    let item = tools.querySelector(`li[data-call="${CSS.escape(data.call || "")}"]`);
    if (!item) {
      item = document.createElement("li");
      item.dataset.call = data.call || "";
      item.append(document.createElement("span"), document.createElement("em"));
      tools.appendChild(item);
    }
    return item;
  };
  const said = (message) => {
    let data;
    try { data = JSON.parse(message.data); } catch (e) { return; }
    if (!(data.turn > committed)) return;  // a turn already committed: its event tells it
    if (data.turn !== turn) { turn = data.turn; clear(); }
    box.hidden = false;
    turnName.textContent = `turn ${turn}, attempt ${data.attempt}`;
    if (message.type === "text") text.textContent += data.text || "";
    else if (message.type === "abandoned") {
      text.textContent = "";
      note.textContent = `attempt ${data.attempt} abandoned: ${data.reason || ""}`;
    } else {
      const item = toolItem(data);
      const [what, how] = item.children;
      if (message.type === "tool_started") what.textContent = `${data.call} ${data.tool}: running`;
      else if (message.type === "tool_ended") what.textContent = `${data.call} ${data.tool}: ${data.status}`;
      else how.textContent = ` ${data.note || ""}`;
      item.className = message.type;
    }
  };
  const done = (message) => {
    try { committed = Math.max(committed, JSON.parse(message.data).step || 0); } catch (e) { return; }
    if (turn <= committed) { box.hidden = true; clear(); }
  };
  return { said, committed: done };
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  sendOnce(document);
  pollRows();
  followRun();
});
