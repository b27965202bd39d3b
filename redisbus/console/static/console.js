// redisbus console: renders the JSON the server sends. Every value from the bus (names,
// subjects, bodies, reasons) goes into the page through textContent, never as markup:
// message bodies are data written by agents.
"use strict";

const STEPS = ["queued", "delivered", "read", "done"];
const TOKEN_KEY = "redisbus-console-token";

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function clock(ms) {
  if (ms === null || ms === undefined) return "";
  const d = new Date(ms);
  const pad = (n, w) => String(n).padStart(w || 2, "0");
  return `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}.${pad(d.getUTCMilliseconds(), 3)}`;
}

function span(ms) {
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  if (ms < 3600000) return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
  return `${(ms / 3600000).toFixed(1)} h`;
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function showProblem(text) {
  const p = document.getElementById("problem");
  p.textContent = text || "";
  p.hidden = !text;
}

function setMode(writable) {
  const mode = document.getElementById("mode");
  if (!writable) {
    mode.textContent = "read-only";
    mode.title = "start the console with --token to allow replay, pause and resume";
  } else {
    mode.textContent = token() ? "unlocked" : "locked";
    mode.title = token() ? "changes are sent with your token" : "enter the token to make changes";
  }
}

// -- the channel list ---------------------------------------------------------------------

async function channelsPage() {
  try {
    const res = await fetch("/api/channels");
    const data = await res.json();
    if (!res.ok) throw new Error(data.message || res.statusText);
    setMode(data.writable);
    const body = document.getElementById("channels");
    body.replaceChildren();
    for (const c of data.channels) {
      const tr = el("tr");
      tr.dataset.channel = c.name;
      const link = el("a", "", c.name);
      link.href = "/c/" + encodeURIComponent(c.name);
      const name = el("td");
      name.append(link);
      tr.append(name, el("td", "num", c.members), el("td", "num", c.messages));
      tr.append(el("td", c.dead_letters ? "num warn" : "num", c.dead_letters));
      tr.append(el("td", "", c.paused ? "paused" : "open"));
      body.append(tr);
    }
    document.getElementById("empty").hidden = data.channels.length > 0;
    showProblem("");
  } catch (e) {
    showProblem(`cannot list channels: ${e.message}`);
  }
}

// -- one channel ----------------------------------------------------------------------------

function channelName() {
  return decodeURIComponent(location.pathname.replace(/^\/c\//, ""));
}

function renderTree(tree) {
  const ul = document.getElementById("tree");
  ul.replaceChildren();
  for (const m of tree) {
    const li = el("li", "member");
    li.dataset.agent = m.name;
    li.dataset.status = m.status;
    li.style.paddingLeft = `${m.depth * 1.1}rem`;
    if (m.depth) li.append(el("span", "branch", "└ "));
    li.append(el("span", "agent", m.name));
    li.append(el("span", `badge st-${m.status}`, m.status));
    if (m.host) li.append(el("span", "host muted", m.host));
    ul.append(li);
  }
}

function timeline(r, createdMs) {
  const row = el("div", `receipt st-${r.status}`);
  row.dataset.recipient = r.to;
  row.dataset.status = r.status;
  row.append(el("span", "who", r.to));
  row.append(el("span", `badge st-${r.status}`, r.status));
  const times = {
    queued: r.queued_ms ?? createdMs,
    delivered: r.delivered_ms,
    read: r.read_ms,
    done: r.done_ms,
  };
  const steps = el("ol", "steps");
  const reached = STEPS.indexOf(r.status);
  // a failed (dead-lettered) or expired message ends there instead of at "done"
  const end = r.status === "failed" || r.status === "expired" ? r.status : null;
  STEPS.forEach((step, i) => {
    const t = times[step];
    const last = end && step === "done";
    const on = reached >= i || Boolean(t) || last;
    const li = el("li", last ? "step on bad" : on ? "step on" : "step");
    li.dataset.step = step;
    li.append(el("span", "label", last ? end : step));
    if (t) {
      li.append(el("span", "at", clock(t)));
      if (i > 0) li.append(el("span", "lat", `+${span(t - times.queued)}`));
    }
    steps.append(li);
  });
  row.append(steps);
  if (r.result) row.append(el("span", "result muted", `result: ${r.result}`));
  return row;
}

function renderMessage(m, snap) {
  const card = el("article", "message");
  card.dataset.id = m.id;
  card.dataset.type = m.type;
  if (m.unread) card.classList.add("unread");
  if (m.stuck) card.classList.add("stuck");
  const head = el("div", "head");
  head.append(el("span", "from", m.from));
  head.append(el("span", "arrow", "→"));
  head.append(el("span", "to", m.to.join(", ")));
  if (m.subject) head.append(el("span", "subject", m.subject));
  if (m.type !== "message") head.append(el("span", "badge type", m.type));
  if (m.priority) head.append(el("span", "badge prio", ["", "high", "urgent"][m.priority] || m.priority));
  if (m.stuck) head.append(el("span", "badge stuck", `stuck > ${snap.stuck_after_s} s`));
  else if (m.unread) head.append(el("span", "badge unread", "unread"));
  head.append(el("span", "spacer"));
  head.append(el("time", "muted", clock(m.created_ms)));
  head.append(el("span", "mid muted", m.id));
  card.append(head);
  card.append(el("pre", "body", m.body));
  const receipts = el("div", "receipts");
  for (const r of m.receipts) receipts.append(timeline(r, m.created_ms));
  card.append(receipts);
  return card;
}

function renderThreads(snap) {
  const box = document.getElementById("threads");
  box.replaceChildren();
  for (const t of snap.threads) {
    const sec = el("section", "thread");
    sec.dataset.root = t.root;
    const h = el("h3", "", t.subject || "(no subject)");
    const n = t.messages.length;
    h.append(el("span", "muted", ` · ${n} message${n === 1 ? "" : "s"}`));
    if (t.partial) h.append(el("span", "muted", " · earlier messages not shown"));
    sec.append(h);
    const rootDepth = t.messages[0].depth;
    for (const m of t.messages) {
      const card = renderMessage(m, snap);
      card.style.marginLeft = `${Math.min(m.depth - rootDepth, 6) * 1.5}rem`;
      sec.append(card);
    }
    box.append(sec);
  }
  document.getElementById("threads-empty").hidden = snap.threads.length > 0;
}

function renderDead(snap, canAct) {
  const ul = document.getElementById("dead");
  ul.replaceChildren();
  for (const d of snap.dead_letters) {
    const li = el("li", "dead-letter");
    li.dataset.id = d.id;
    const head = el("div", "head");
    head.append(el("span", "from", d.from), el("span", "arrow", "→"), el("span", "to", d.recipient));
    if (d.subject) head.append(el("span", "subject", d.subject));
    li.append(head);
    li.append(el("pre", "body", d.body));
    li.append(el("div", "muted", `${d.deliveries} ${d.deliveries === 1 ? "delivery" : "deliveries"} · ${d.reason || "dead"} · ${clock(d.dead_ms)}`));
    const btn = el("button", "action replay", "Replay");
    btn.dataset.id = d.id;
    btn.hidden = !snap.writable;
    btn.disabled = !canAct;
    btn.title = canAct ? "give it back to its recipient as a new message" : "needs the token";
    btn.addEventListener("click", () => act("replay", { id: d.id }));
    li.append(btn);
    ul.append(li);
  }
  document.getElementById("dead-count").textContent = snap.dead_letters.length ? `(${snap.dead_letters.length})` : "";
  document.getElementById("dead-empty").hidden = snap.dead_letters.length > 0;
}

let lastSnap = null;

function render(snap) {
  lastSnap = snap;
  const canAct = snap.writable && Boolean(token());
  setMode(snap.writable);
  document.getElementById("paused").hidden = !snap.paused;
  document.getElementById("unlock").hidden = !snap.writable || Boolean(token());
  for (const [id, show] of [["pause", !snap.paused], ["resume", snap.paused]]) {
    const b = document.getElementById(id);
    b.hidden = !snap.writable || !show;
    b.disabled = !canAct;
  }
  const counts = document.getElementById("counts");
  counts.textContent = `${snap.tree.length} agents · ${snap.unread} unread · ${snap.stuck} stuck`;
  counts.classList.toggle("warn", snap.stuck > 0);
  renderTree(snap.tree);
  renderThreads(snap);
  renderDead(snap, canAct);
}

async function act(what, params) {
  const q = new URLSearchParams({ channel: channelName(), ...(params || {}) });
  try {
    const res = await fetch(`/api/${what}?${q}`, {
      method: "POST",
      headers: { Authorization: `Bearer ${token()}` },
    });
    const data = await res.json();
    if (!res.ok) throw new Error(`${data.error}: ${data.message}`);
    showProblem("");
  } catch (e) {
    showProblem(`${what} refused: ${e.message}`);
  }
}

function channelPage() {
  const name = channelName();
  document.title = `${name} · redisbus console`;
  document.getElementById("channel-name").textContent = name;
  document.getElementById("unlock").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = document.getElementById("token").value;
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    if (lastSnap) render(lastSnap);
  });
  document.getElementById("pause").addEventListener("click", () => act("pause"));
  document.getElementById("resume").addEventListener("click", () => act("resume"));
  const live = document.getElementById("live");
  const source = new EventSource(`/api/events?${new URLSearchParams({ channel: name })}`);
  let streamProblem = false;
  source.addEventListener("snapshot", (ev) => {
    render(JSON.parse(ev.data));
    if (streamProblem) showProblem("");
    streamProblem = false;
    live.textContent = `live · ${clock(Date.now())}`;
    live.className = "live on";
  });
  source.addEventListener("problem", (ev) => {
    const p = JSON.parse(ev.data);
    showProblem(`${p.error}: ${p.message}`);
    streamProblem = true;
  });
  source.onerror = async () => {
    live.textContent = "reconnecting…";
    live.className = "live off";
    if (source.readyState === EventSource.CLOSED) {
      const res = await fetch(`/api/snapshot?${new URLSearchParams({ channel: name })}`);
      if (!res.ok) showProblem((await res.json()).message || res.statusText);
    }
  };
}

document.addEventListener("DOMContentLoaded", () => {
  if (document.body.dataset.page === "channel") channelPage();
  else channelsPage();
});
