// Turnstone's web console: one ES module, no framework, no build step. It uses only the public
// HTTP API, so it works against any deployment. Every piece of data goes into the DOM as text
// (textContent / text nodes), never as HTML.

const KEY_STORAGE = "turnstone.apiKey";
const LIST_REFRESH_MS = 3000;
/** How often an open session checks its summary for events its stream did not bring. */
const SESSION_POLL_MS = 5000;
const PAGE_SIZE = 25;

// ---------- DOM helpers ----------

/** Makes an element: `attrs` are properties (`on*` become listeners), children text or nodes. */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    // Through the CSSOM: the page's Content-Security-Policy refuses style attributes.
    else if (name === "style") el.style.cssText = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name in el && typeof value !== "string") el[name] = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const main = () => document.getElementById("main");

function show(...nodes) {
  main().replaceChildren(...nodes);
}

const enc = encodeURIComponent;

function when(ms) {
  if (typeof ms !== "number") return "";
  return new Date(ms).toLocaleString();
}

function ago(ms) {
  if (typeof ms !== "number") return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return new Date(ms).toLocaleDateString();
}

function textOf(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  return content.map((part) => (part.type === "text" ? part.text : `[${part.type}]`)).join("\n");
}

/** A tool result: its text, then each image it carries as a data URL (an MCP tool's chart). */
function resultNodes(content) {
  const images = Array.isArray(content) ? content.filter((p) => p.type === "image_url" && String(p.image_url.url).startsWith("data:image/")) : [];
  return [h("pre", {}, textOf(content)), ...images.map((p) => h("img", { class: "result-image", src: p.image_url.url, alt: "image from the tool" }))];
}

function errorBox(err) {
  return h("p", { class: "error", role: "alert" }, String(err && err.message ? err.message : err));
}

// ---------- API access, with the key asked once per tab ----------

let keyPrompt = null;

/** Asks for the API key (one dialog however many requests answered 401). */
function askKey() {
  if (keyPrompt) return keyPrompt;
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  input.value = sessionStorage.getItem(KEY_STORAGE) || "";
  keyPrompt = new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        keyPrompt = null;
        if (dialog.returnValue === "save" && input.value.trim()) {
          sessionStorage.setItem(KEY_STORAGE, input.value.trim());
          resolve(true);
        } else {
          if (dialog.returnValue === "forget") sessionStorage.removeItem(KEY_STORAGE);
          resolve(false);
        }
      },
      { once: true },
    );
    dialog.showModal();
  });
  return keyPrompt;
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

class ApiError extends Error {
  constructor(status, body) {
    const detail = body && body.error ? body.error : {};
    super(`${status} ${detail.code || ""}: ${detail.message || "request failed"}`);
    this.status = status;
    this.code = detail.code;
  }
}

/** Calls the API; on 401 asks for the key and tries again. */
async function api(path, { method = "GET", body, signal } = {}) {
  for (;;) {
    const headers = { Accept: "application/json", ...authHeaders() };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
    if (res.status === 401 && (await askKey())) continue;
    const text = await res.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      json = null;
    }
    if (!res.ok) throw new ApiError(res.status, json);
    return json;
  }
}

/**
 * Follows `GET .../events/stream`, calling `onFrame({id, event, data})` per frame. fetch with a
 * stream reader, not EventSource, which cannot send the Authorization header. Reconnects from
 * the last event seen, after the stream's `retry:` (else a second), until `signal` aborts.
 */
async function followStream(path, after, onFrame, signal) {
  let last = after;
  while (!signal.aborted) {
    let retry = 1000;
    // "open" once the host follows the session for this reader (it subscribes before it
    // answers): token deltas are not kept, so only from then on do they reach the view.
    document.body.dataset.stream = "connecting";
    try {
      const res = await fetch(`${path}?after=${last}`, {
        headers: { Accept: "text/event-stream", ...authHeaders() },
        signal,
      });
      if (res.status === 401) {
        if (!(await askKey())) return;
        continue;
      }
      if (!res.ok || !res.body) throw new Error(`stream answered ${res.status}`);
      document.body.dataset.stream = "open";
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n?/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const frame = { id: null, event: "message", data: "" };
          const data = [];
          for (const line of block.split("\n")) {
            if (!line || line.startsWith(":")) continue;
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            let val = colon < 0 ? "" : line.slice(colon + 1);
            if (val.startsWith(" ")) val = val.slice(1);
            if (field === "id") frame.id = val;
            else if (field === "event") frame.event = val;
            else if (field === "data") data.push(val);
            else if (field === "retry" && /^\d+$/.test(val)) retry = Number(val);
          }
          if (!data.length) continue;
          frame.data = data.join("\n");
          if (frame.id !== null && /^\d+$/.test(frame.id)) last = Number(frame.id);
          onFrame(frame);
        }
      }
    } catch (err) {
      if (signal.aborted) return;
      console.warn("event stream:", err);
    }
    // A stream ends when its host cuts it: behind API Gateway, which buffers a Lambda's answer,
    // each response ends once it carries news (asking back within 50 ms); a streaming host's
    // before its deadline. Reconnect, from the last event seen.
    await new Promise((r) => setTimeout(r, retry));
  }
}

// ---------- Routing ----------

let viewAbort = new AbortController();

function route() {
  viewAbort.abort();
  viewAbort = new AbortController();
  const signal = viewAbort.signal;
  const hash = location.hash.replace(/^#/, "") || "/sessions";
  const parts = hash.split("/").filter(Boolean).map(decodeURIComponent);
  let view;
  if (parts[0] === "sessions" && parts.length === 1) view = sessionsView(signal);
  else if (parts[0] === "sessions" && parts.length === 2) view = sessionView(parts[1], null, signal);
  else if (parts[0] === "sessions" && parts[2] === "branch" && parts.length === 4) view = sessionView(parts[1], parts[3], signal);
  else if (parts[0] === "sessions" && parts[2] === "tree" && parts.length === 3) view = treeView(parts[1], signal);
  else if (parts[0] === "sessions" && parts[2] === "turns" && parts.length === 4) view = timelineView(parts[1], parts[3], signal);
  else if (parts[0] === "sessions" && parts[2] === "events" && parts.length === 3) view = eventsView(parts[1], signal);
  else view = Promise.resolve(show(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/sessions" }, "Sessions"))));
  view.catch((err) => {
    if (!signal.aborted) show(errorBox(err));
  });
}

// ---------- Sessions list ----------

async function sessionsView(signal) {
  document.title = "Sessions · Turnstone";
  const filters = { agent: sessionStorage.getItem("turnstone.filter.agent") || "", status: "" };
  const cursors = [null]; // cursors of the pages seen, for "Previous"
  let page = 0;
  let nextCursor = null;
  let lastRendered = "";

  const idInput = h("input", { id: "new-session-id", name: "session", value: `s-${Date.now().toString(36)}`, required: true, pattern: "[A-Za-z0-9._:\\-]{1,128}" });
  const agentInput = h("input", { id: "new-session-agent", name: "agent", value: filters.agent || "demo", required: true });
  const messageInput = h("textarea", { id: "new-session-message", name: "message", required: true, placeholder: "Say something (/long streams a long answer)" });
  const newError = h("div");
  const newForm = h(
    "form",
    {
      id: "new-session",
      onsubmit: async (e) => {
        e.preventDefault();
        newError.replaceChildren();
        const id = idInput.value.trim();
        try {
          await api(`/v1/sessions/${enc(id)}/inputs`, {
            method: "POST",
            body: { type: "client.message", agent_id: agentInput.value.trim(), message: { role: "user", content: messageInput.value } },
          });
          location.hash = `#/sessions/${enc(id)}`;
        } catch (err) {
          newError.replaceChildren(errorBox(err));
        }
      },
    },
    h(
      "fieldset",
      {},
      h("legend", {}, "New session"),
      h("div", { class: "row" }, h("label", {}, "Session id", idInput), h("label", {}, "Agent", agentInput)),
      h("label", { style: "display:flex;margin-top:.5rem" }, "Message", messageInput),
      h("div", { class: "row", style: "margin-top:.5rem" }, h("button", { type: "submit" }, "Start session")),
      newError,
    ),
  );

  const agentFilter = h("input", { id: "filter-agent", type: "search", value: filters.agent, placeholder: "any agent" });
  const statusFilter = h(
    "select",
    { id: "filter-status" },
    h("option", { value: "" }, "any status"),
    ...["idle", "running", "waiting"].map((s) => h("option", { value: s }, s)),
  );
  const filterForm = h(
    "form",
    {
      class: "row",
      role: "search",
      onsubmit: (e) => {
        e.preventDefault();
        filters.agent = agentFilter.value.trim();
        filters.status = statusFilter.value;
        sessionStorage.setItem("turnstone.filter.agent", filters.agent);
        cursors.length = 1;
        page = 0;
        load();
      },
    },
    h("label", {}, "Agent", agentFilter),
    h("label", {}, "Status", statusFilter),
    h("button", { type: "submit" }, "Filter"),
  );

  const tbody = h("tbody", { id: "sessions-body" });
  const table = h(
    "table",
    { class: "sessions" },
    h("caption", { class: "muted", style: "text-align:left" }, "Newest first; refreshes every few seconds."),
    h("thead", {}, h("tr", {}, ["Session", "Agent", "Owner", "Status", "Last activity", "Messages", "Model calls", "Cost"].map((t) => h("th", { scope: "col" }, t)))),
    tbody,
  );
  const prev = h("button", { type: "button", class: "quiet", onclick: () => { page -= 1; load(); } }, "← Previous");
  const next = h("button", { type: "button", class: "quiet", onclick: () => { cursors[page + 1] = nextCursor; page += 1; load(); } }, "Next →");
  const pageLabel = h("span", { class: "muted" });
  const status = h("div", { "aria-live": "polite" });
  show(h("h1", {}, "Sessions"), newForm, filterForm, status, table, h("div", { class: "pager" }, prev, pageLabel, next));

  async function load() {
    const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if (filters.agent) params.set("agent", filters.agent);
    if (cursors[page]) params.set("cursor", cursors[page]);
    let listing;
    try {
      listing = await api(`/v1/sessions?${params}`, { signal });
    } catch (err) {
      if (!signal.aborted) status.replaceChildren(errorBox(err));
      return;
    }
    // The listing names sessions; each one's summary adds status, usage and cost.
    const summaries = await Promise.all(
      listing.sessions.map((s) => api(`/v1/sessions/${enc(s.session_id)}`, { signal }).catch(() => null)),
    );
    if (signal.aborted) return;
    status.replaceChildren();
    nextCursor = listing.next_cursor;
    const rows = listing.sessions
      .map((s, i) => ({ s, sum: summaries[i] }))
      .filter(({ sum }) => !filters.status || (sum && sum.status === filters.status));
    // Re-render only on change, so keyboard focus in the table survives the refresh.
    const key = JSON.stringify([rows, page, filters]);
    if (key !== lastRendered) {
      lastRendered = key;
      tbody.replaceChildren(
        ...rows.map(({ s, sum }) =>
          h(
            "tr",
            { dataset: { session: s.session_id } },
            h("td", {}, h("a", { href: `#/sessions/${enc(s.session_id)}` }, s.session_id)),
            h("td", {}, s.agent_id),
            h("td", {}, s.owner || "—"),
            h("td", {}, sum ? h("span", { class: `status status-${sum.status}` }, sum.status) : "?"),
            h("td", { title: when(s.updated_at) }, ago(s.updated_at)),
            h("td", { class: "num" }, sum ? sum.messages : ""),
            h("td", { class: "num" }, sum ? sum.usage.llm_calls : ""),
            h("td", { class: "num" }, sum ? `$${sum.usage.cost}` : ""),
          ),
        ),
      );
      if (!rows.length) tbody.append(h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No sessions.")));
    }
    prev.disabled = page === 0;
    next.disabled = !nextCursor;
    pageLabel.textContent = `Page ${page + 1}`;
  }

  await load();
  const timer = setInterval(load, LIST_REFRESH_MS);
  signal.addEventListener("abort", () => clearInterval(timer));
}

// ---------- Formatting ----------

/** Pico-dollars (a decimal string) as dollars, exactly. */
function dollars(pico) {
  let p;
  try {
    p = BigInt(pico ?? 0);
  } catch {
    return `${pico}`;
  }
  const neg = p < 0n;
  if (neg) p = -p;
  const unit = 10n ** 12n;
  const frac = (p % unit).toString().padStart(12, "0").replace(/0+$/, "");
  return `${neg ? "-" : ""}$${p / unit}${frac ? `.${frac}` : ""}`;
}

/** A duration for people; `approx` marks one derived from the log's order, not its clocks. */
function duration(ms, approx = false) {
  const a = approx ? "≈" : "";
  if (!(ms >= 0)) return "";
  if (ms < 1000) return `${a}${Math.round(ms)} ms`;
  if (ms < 60_000) return `${a}${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
  return `${a}${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`;
}

function tokensText(tokens) {
  const entries = Object.entries(tokens || {});
  return entries.length ? entries.map(([k, v]) => `${v} ${k.replace(/_/g, " ")}`).join(" · ") : "no tokens";
}

/** A text the user typed, as JSON when it reads as JSON, else as the text itself. */
function jsonOrText(text) {
  const t = text.trim();
  if (!t) return null;
  try {
    return JSON.parse(t);
  } catch {
    return text;
  }
}

/** Whether message `m` goes back in a `client.messages` view: all but system messages, except
 * a compaction marker, which the engine reads (by its id) as the branch going on through it. */
function echoed(m) {
  return m.role !== "system" || Boolean(m.compaction);
}

/** A message as the draft that names its recorded node (for `client.messages`). */
function draftOf(m) {
  const d = { id: m.id, role: m.role };
  for (const k of ["content", "tool_calls", "tool_call_id", "name"]) if (m[k] !== undefined && m[k] !== null) d[k] = m[k];
  return d;
}

// ---------- The log, the tree ----------

/** Every event of a session after `after`, page by page. */
async function loadEvents(id, signal, after = 0) {
  const out = [];
  for (;;) {
    // A page may hold fewer than the limit and not be the last (pages are bounded in bytes
    // too): only an empty one ends the log.
    const page = await api(`/v1/sessions/${enc(id)}/events?after=${after}&limit=1000`, { signal });
    if (!page.events.length) return out;
    out.push(...page.events);
    after = page.next_after;
  }
}

/** The whole message tree (`GET /messages?tree=1`), page by page. */
async function loadTree(id, signal) {
  const tree = { nodes: [], head_id: undefined };
  let after = null;
  for (;;) {
    const query = after === null ? "" : `&after=${enc(after)}`;
    const page = await api(`/v1/sessions/${enc(id)}/messages?tree=1&limit=1000${query}`, { signal });
    tree.nodes.push(...page.nodes);
    tree.head_id = page.head_id;
    if (!page.next_after) return tree;
    after = page.next_after;
  }
}

/** What a session's log says about its turns, its messages' turns, forks and sub-agents (where
 * it came from is the summary's `forked_from` and `parent`). */
class SessionLog {
  constructor() {
    this.last = 0;
    this.turns = new Map(); // turn id -> {id, status, startSeq, endSeq, startedAt, endedAt, error}
    this.messageTurn = new Map(); // message id -> turn id that recorded it
    this.current = null;
    this.children = new Map(); // tool call id -> child session id
    this.forks = new Map(); // turn id -> fork session ids
    this.compactions = new Map(); // marker message id -> its context.compacted event
  }

  turn(id) {
    if (!this.turns.has(id)) this.turns.set(id, { id, status: "active", startSeq: null, endSeq: null });
    return this.turns.get(id);
  }

  add(seq, e) {
    if (seq <= this.last) return false;
    this.last = seq;
    switch (e.type) {
      case "turn_started":
      case "turn_activated": {
        const id = e.turn ? e.turn.id : e.turn_id;
        const t = this.turn(id);
        t.status = "active";
        t.startSeq = seq;
        t.startedAt = e.turn ? e.turn.started_at : e.at;
        this.current = id;
        break;
      }
      case "turn_ended": {
        const t = this.turn(e.turn_id);
        Object.assign(t, { status: e.status, endSeq: seq, endedAt: e.at, error: e.error || null });
        if (this.current === e.turn_id) this.current = null;
        break;
      }
      case "message_recorded":
        if (this.current) this.messageTurn.set(e.message.id, this.current);
        break;
      case "call_created":
        if (e.call.spec.kind === "sub_agent") this.children.set(e.call.id, e.call.spec.session_id);
        break;
      case "context_compacted":
        this.compactions.set(e.marker_id, e);
        break;
      case "forked":
        if (!this.forks.has(e.turn_id)) this.forks.set(e.turn_id, []);
        if (!this.forks.get(e.turn_id).includes(e.session_id)) this.forks.get(e.turn_id).push(e.session_id);
        break;
      default:
    }
    return true;
  }
}

/** The message tree (`GET /messages?tree=1`) indexed: nodes by id, children by parent. */
function indexTree(tree) {
  const byId = new Map();
  const children = new Map();
  for (const n of tree.nodes) {
    byId.set(n.message.id, n);
    const p = n.parent_id ?? null;
    if (!children.has(p)) children.set(p, []);
    children.get(p).push(n.message.id);
  }
  const t = { byId, children, head: tree.head_id ?? null };
  t.active = pathTo(t, t.head);
  t.activeIds = new Set(t.active.map((m) => m.id));
  return t;
}

/** The messages from the root to `id`. */
function pathTo(t, id) {
  const out = [];
  for (let cur = id; cur; ) {
    const n = t.byId.get(cur);
    if (!n) break;
    out.unshift(n.message);
    cur = n.parent_id;
  }
  return out;
}

/** The branch through `id`: the path to it, then on down (its newest child each time). */
function branchThrough(t, id) {
  if (t.activeIds.has(id)) return t.active;
  const path = pathTo(t, id);
  for (let cur = id; ; ) {
    const kids = t.children.get(cur) || [];
    if (!kids.length) return path;
    cur = kids[kids.length - 1];
    path.push(t.byId.get(cur).message);
  }
}

/** Where the branch through message `mid` is shown: the session itself for the active one. */
function branchHref(sessionId, t, mid) {
  return t.activeIds.has(mid) ? `#/sessions/${enc(sessionId)}` : `#/sessions/${enc(sessionId)}/branch/${enc(mid)}`;
}

function snippet(m, n = 80) {
  let text = textOf(m.content).replace(/\s+/g, " ").trim();
  if (!text && m.tool_calls) text = m.tool_calls.map((c) => `${c.function.name}(${c.function.arguments})`).join(", ");
  return text.length > n ? `${text.slice(0, n)}…` : text || "(empty)";
}

// ---------- One session ----------

/**
 * The messages of a path as nodes: tool calls and their results folded under their assistant
 * message, sub-agent calls linked to their session, branch switchers where a message has
 * siblings, "Edit" on user messages and a bar closing each turn (timeline, fork).
 */
function conversation(messages, ctx) {
  const results = new Map();
  for (const m of messages) if (m.role === "tool" && m.tool_call_id) results.set(m.tool_call_id, m);
  const shown = new Set();
  const items = []; // {node, turn}
  for (const m of messages) {
    if (m.role === "tool" && shown.has(m.tool_call_id)) continue;
    if (m.compaction) {
      // Recorded in the turn whose model call it was made for: the log says which, else the
      // message before it does.
      const before = items.length ? items[items.length - 1].turn : undefined;
      items.push({ turn: (ctx.log && ctx.log.messageTurn.get(m.id)) || before, node: compactionNode(m, ctx) });
      continue;
    }
    const calls = (m.tool_calls || []).map((call) => {
      shown.add(call.id);
      const result = results.get(call.id);
      const child = ctx.log && ctx.log.children.get(call.id);
      return [
        h(
          "details",
          { class: "call", dataset: { call: call.id } },
          h("summary", {}, `${call.function.name}(…) `, result ? "· answered" : "· pending"),
          h("div", { class: "muted" }, "arguments"),
          h("pre", {}, call.function.arguments),
          result ? [h("div", { class: "muted" }, "result"), ...resultNodes(result.content)] : null,
        ),
        child
          ? h("p", { class: "subagent" }, `Sub-agent ${call.function.name} runs in session `, h("a", { href: `#/sessions/${enc(child)}`, dataset: { child } }, child))
          : null,
      ];
    });
    const tools = [];
    if (ctx.tree) {
      const node = ctx.tree.byId.get(m.id);
      const siblings = node ? ctx.tree.children.get(node.parent_id ?? null) || [] : [];
      if (siblings.length > 1) {
        const i = siblings.indexOf(m.id);
        const to = (j) => branchHref(ctx.id, ctx.tree, siblings[j]);
        tools.push(
          h(
            "span",
            { class: "branches", role: "group", "aria-label": "Branches here" },
            i > 0 ? h("a", { href: to(i - 1), "aria-label": "Previous branch", class: "branch-nav" }, "‹") : h("span", { class: "branch-nav muted", "aria-hidden": "true" }, "‹"),
            h("span", { class: "branch-pos" }, `branch ${i + 1} of ${siblings.length}`),
            i < siblings.length - 1 ? h("a", { href: to(i + 1), "aria-label": "Next branch", class: "branch-nav" }, "›") : h("span", { class: "branch-nav muted", "aria-hidden": "true" }, "›"),
          ),
        );
      }
      if (m.role === "user" && ctx.onEdit) {
        tools.push(h("button", { type: "button", class: "quiet small edit", onclick: (e) => ctx.onEdit(m, e.target.closest("article")) }, "Edit"));
      }
    }
    const turn = ctx.log ? ctx.log.messageTurn.get(m.id) : undefined;
    items.push({
      turn,
      node: h(
        "article",
        { class: `msg ${m.role}`, dataset: { message: m.id } },
        h("div", { class: "role" }, h("span", {}, m.role === "tool" ? `tool ${m.name || ""}` : m.role), tools),
        textOf(m.content) ? h("div", { class: "text" }, textOf(m.content)) : null,
        calls,
      ),
    });
  }
  const nodes = [];
  items.forEach((item, i) => {
    nodes.push(item.node);
    const next = items[i + 1];
    if (item.turn && ctx.turnBar && (!next || next.turn !== item.turn)) nodes.push(ctx.turnBar(item.turn));
  });
  return nodes;
}

/**
 * A compaction marker: what the model reads from here on in place of the conversation before it
 * (a summary), or that old tool results reach it as stubs (a clearing). The conversation itself
 * keeps every message, so the marker is folded away, not shown as a system message; the
 * figures come from its `context.compacted` event when the log is read.
 */
function compactionNode(m, ctx) {
  const summary = m.compaction.kind === "summary";
  const event = ctx.log && ctx.log.compactions.get(m.id);
  const n = (x) => Number(x).toLocaleString("en-US");
  const figures = event ? ` · about ${n(event.tokens_before)} → ${n(event.tokens_after)} tokens` : "";
  const refused = event && event.reason === "refused" ? " (the provider refused the request as too long)" : "";
  const through = ctx.tree && ctx.tree.byId.get(m.compaction.through);
  const covers = through ? ["through ", h("q", {}, snippet(through.message, 60))] : "before it";
  return h(
    "article",
    { class: "msg compaction", dataset: { message: m.id, compaction: m.compaction.kind } },
    h(
      "details",
      { class: "compaction", dataset: { marker: m.id } },
      h("summary", {}, summary ? "Context compacted — summary" : "Tool results cleared from the model's view", h("span", { class: "muted" }, figures)),
      summary
        ? [h("p", { class: "muted small" }, "The model reads this summary in place of the conversation ", covers, refused, "; the conversation keeps every message."), h("div", { class: "text" }, textOf(m.content))]
        : h("p", { class: "muted small" }, "The model is sent the tool results ", covers, " as short stubs", refused, "; the conversation keeps them whole."),
    ),
  );
}

/** ` of MCP server <name>` for a call the engine runs on one of the agent's MCP servers. */
function mcpServerOf(sum, callId) {
  const mcp = (sum.mcp_calls || []).find((m) => m.id === callId);
  return mcp ? [" of MCP server ", h("code", {}, mcp.server)] : [];
}

/** The forms that answer what a session waits for: client tool calls, approvals, interrupts. */
function pendingForms(id, sum, after) {
  const submit = (errorSlot, body) =>
    api(`/v1/sessions/${enc(id)}/inputs`, { method: "POST", body })
      .then(after)
      .catch((err) => errorSlot.replaceChildren(errorBox(err)));
  const forms = [];
  for (const c of sum.pending_client_calls) {
    const errorSlot = h("div");
    const result = h("textarea", { name: "result", class: "answer-text", rows: 2 });
    const asJson = h("input", { type: "checkbox", name: "json" });
    const retryable = h("input", { type: "checkbox", name: "retryable" });
    const title = `call-${c.id}-title`;
    forms.push(
      h(
        "form",
        {
          class: "pending client-call",
          dataset: { call: c.id },
          "aria-labelledby": title,
          onsubmit: (e) => {
            e.preventDefault();
            errorSlot.replaceChildren();
            const asError = e.submitter && e.submitter.value === "error";
            let value = result.value;
            if (!asError && asJson.checked) {
              try {
                value = JSON.parse(value);
              } catch (err) {
                errorSlot.replaceChildren(errorBox(`The result is not valid JSON: ${err.message}`));
                return;
              }
            }
            submit(
              errorSlot,
              asError
                ? { type: "tool.error", id: c.id, attempt: c.attempt, error: result.value || "refused", retryable: retryable.checked }
                : { type: "tool.result", id: c.id, attempt: c.attempt, result: value },
            );
          },
        },
        h("h3", { id: title }, "Client tool call ", h("code", {}, c.name), " waits for an answer"),
        h("pre", { "aria-label": "Arguments" }, c.arguments),
        h("label", { class: "wide" }, "Result (or the error's text)", result),
        h(
          "div",
          { class: "row", style: "align-items:center" },
          h("label", { class: "inline" }, asJson, " the result is JSON"),
          h("button", { type: "submit", value: "result" }, "Send result"),
          h("button", { type: "submit", value: "error", class: "danger" }, "Send error"),
          h("label", { class: "inline" }, retryable, " error is retryable"),
        ),
        errorSlot,
      ),
    );
  }
  for (const c of sum.awaiting_approval) {
    const errorSlot = h("div");
    const reason = h("input", { name: "reason", class: "reason" });
    // Enter in the reason field must not approve (the form's first button): pick a button.
    reason.addEventListener("keydown", (e) => e.key === "Enter" && e.preventDefault());
    const title = `approve-${c.id}-title`;
    forms.push(
      h(
        "form",
        {
          class: "pending approval",
          dataset: { call: c.id },
          "aria-labelledby": title,
          onsubmit: (e) => {
            e.preventDefault();
            errorSlot.replaceChildren();
            const approved = !(e.submitter && e.submitter.value === "deny");
            const body = { type: "tool.approval", id: c.id, approved };
            if (reason.value.trim()) body.reason = reason.value.trim();
            submit(errorSlot, body);
          },
        },
        h("h3", { id: title }, "Tool call ", h("code", {}, c.name), ...mcpServerOf(sum, c.id), " awaits approval"),
        h("pre", { "aria-label": "Arguments" }, c.arguments),
        h("label", { class: "wide" }, "Reason (optional; a denial tells it to the model)", reason),
        h(
          "div",
          { class: "row" },
          h("button", { type: "submit", value: "approve" }, "Approve"),
          h("button", { type: "submit", value: "deny", class: "danger" }, "Deny"),
        ),
        errorSlot,
      ),
    );
  }
  for (const i of sum.open_interrupts) {
    const errorSlot = h("div");
    const payload = h("textarea", { name: "payload", class: "answer-text", rows: 2 });
    const title = `interrupt-${i.id}-title`;
    forms.push(
      h(
        "form",
        {
          class: "pending interrupt",
          dataset: { interrupt: i.id },
          "aria-labelledby": title,
          onsubmit: (e) => {
            e.preventDefault();
            errorSlot.replaceChildren();
            const body = { type: "interrupt.resume", interrupt_id: i.id };
            const value = jsonOrText(payload.value);
            if (value !== null) body.payload = value;
            submit(errorSlot, body);
          },
        },
        h("h3", { id: title }, "Interrupt: ", i.reason),
        i.payload !== null && i.payload !== undefined ? h("pre", { "aria-label": "What it asks" }, JSON.stringify(i.payload, null, 2)) : null,
        h("label", { class: "wide" }, "Answer (JSON, or plain text)", payload),
        h("div", { class: "row" }, h("button", { type: "submit" }, "Resume")),
        errorSlot,
      ),
    );
  }
  return forms;
}

async function sessionView(id, branchId, signal) {
  document.title = `${id} · Turnstone`;
  const header = h("div");
  const origin = h("div");
  const notices = h("section", { "aria-label": "Waiting for you", id: "pending" });
  const banner = h("div");
  const convo = h("section", { class: "conversation", id: "conversation", "aria-label": "Conversation", "aria-live": "polite" });
  const live = new Map(); // call id -> live assistant bubble of streamed text
  const log = new SessionLog();
  let summary = null;
  let tree = null;
  let shownPath = [];
  let onBranch = false; // showing a branch that is not the active one
  let editing = false;
  let formsKey = "";
  let deltas = 0;

  const input = h("textarea", { id: "composer-input", placeholder: "Message (Ctrl+Enter sends)", "aria-label": "Message" });
  const queue = h("input", { type: "checkbox", id: "composer-queue" });
  const sendError = h("div");
  const cancelButton = h("button", { type: "button", class: "danger", id: "cancel-turn", onclick: cancel }, "Cancel turn");
  // Enabled once the session is read (a message needs its agent).
  const sendButton = h("button", { type: "submit", id: "send", disabled: true }, "Send");
  const form = h(
    "form",
    { class: "composer", id: "composer", onsubmit: (e) => { e.preventDefault(); send(); } },
    input,
    h(
      "div",
      { class: "row", style: "margin-top:.4rem;align-items:center" },
      sendButton,
      h("label", { class: "inline" }, queue, " queue behind the active turn"),
      cancelButton,
    ),
    sendError,
  );
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      send();
    }
  });

  show(
    h("p", {}, h("a", { href: "#/sessions" }, "← Sessions")),
    h("h1", {}, "Session ", h("code", {}, id)),
    header,
    origin,
    notices,
    banner,
    convo,
    form,
  );

  /** Submits `input` (a `client.message` or `client.messages`), then shows the active branch. */
  async function submit(body, errorSlot) {
    errorSlot.replaceChildren();
    try {
      await api(`/v1/sessions/${enc(id)}/inputs${queue.checked ? "?queue=true" : ""}`, { method: "POST", body });
      return true;
    } catch (err) {
      errorSlot.replaceChildren(errorBox(err));
      return false;
    }
  }

  async function send() {
    const text = input.value;
    if (!text.trim() || !summary) return;
    const message = { role: "user", content: text };
    // On another branch, the whole view goes: the engine continues the branch at its last
    // known message and makes it the active one.
    const body = onBranch
      ? { type: "client.messages", agent_id: summary.agent_id, messages: [...shownPath.filter(echoed).map(draftOf), message] }
      : { type: "client.message", agent_id: summary.agent_id, message };
    if (await submit(body, sendError)) {
      input.value = "";
      if (onBranch) location.hash = `#/sessions/${enc(id)}`;
      else refresh();
    }
  }

  /** An edit of user message `m`: a new sibling, the view up to its parent plus the new text. */
  function edit(m, article) {
    if (!summary || editing) return;
    editing = true;
    const text = h("textarea", { class: "edit-text", "aria-label": "Edited message" });
    text.value = textOf(m.content);
    const errorSlot = h("div");
    const done = () => {
      editing = false;
      refresh();
    };
    const editForm = h(
      "form",
      {
        class: "edit-form",
        onsubmit: async (e) => {
          e.preventDefault();
          if (!text.value.trim()) return;
          const node = tree.byId.get(m.id);
          const before = node && node.parent_id ? pathTo(tree, node.parent_id) : [];
          const body = {
            type: "client.messages",
            agent_id: summary.agent_id,
            messages: [...before.filter(echoed).map(draftOf), { role: "user", content: text.value }],
          };
          if (await submit(body, errorSlot)) {
            editing = false;
            if (onBranch) location.hash = `#/sessions/${enc(id)}`;
            else refresh();
          }
        },
      },
      text,
      h(
        "div",
        { class: "row" },
        h("button", { type: "submit" }, "Save as a new branch"),
        h("button", { type: "button", class: "quiet", onclick: done }, "Cancel edit"),
      ),
      errorSlot,
    );
    text.addEventListener("keydown", (e) => {
      if (e.key === "Escape") done();
      else if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        editForm.requestSubmit();
      }
    });
    const old = article.querySelector(".text");
    if (old) old.replaceWith(editForm);
    else article.append(editForm);
    text.focus();
  }

  async function cancel() {
    sendError.replaceChildren();
    try {
      await api(`/v1/sessions/${enc(id)}/cancel`, { method: "POST", body: { reason: "cancelled from the console" } });
      refresh();
    } catch (err) {
      sendError.replaceChildren(errorBox(err));
    }
  }

  async function fork(turnId, slot) {
    try {
      const made = await api(`/v1/sessions/${enc(id)}/forks`, { method: "POST", body: { turn_id: turnId } });
      location.hash = `#/sessions/${enc(made.session_id)}`;
    } catch (err) {
      slot.replaceChildren(errorBox(err));
    }
  }

  function turnBar(turnId) {
    const t = log.turns.get(turnId) || { status: "active" };
    const slot = h("span");
    const forks = log.forks.get(turnId) || [];
    return h(
      "div",
      { class: "turn-bar", dataset: { turn: turnId } },
      h("span", {}, "Turn ", h("code", {}, turnId)),
      h("span", { class: `status status-${t.status}` }, t.status),
      t.endedAt && t.startedAt ? h("span", { class: "muted" }, duration(t.endedAt - t.startedAt)) : null,
      h("a", { href: `#/sessions/${enc(id)}/turns/${enc(turnId)}` }, "Timeline"),
      t.status === "completed" ? h("button", { type: "button", class: "quiet small", onclick: () => fork(turnId, slot) }, "Fork") : null,
      forks.length ? h("span", { class: "muted" }, "forked as ", forks.map((f, i) => [i ? ", " : "", h("a", { href: `#/sessions/${enc(f)}` }, f)])) : null,
      slot,
    );
  }

  async function refresh() {
    // The summary, then the tree (as new or newer), then the log up to the summary's last
    // event, whatever the stream's lag; events after it come on the stream, and refresh again.
    const sum = await api(`/v1/sessions/${enc(id)}`, { signal });
    const wire = await loadTree(id, signal);
    if (log.last < sum.last_seq) for (const e of await loadEvents(id, signal, log.last)) log.add(e.seq, e.event);
    if (signal.aborted) return;
    summary = sum;
    tree = indexTree(wire);
    header.replaceChildren(
      h(
        "p",
        { class: "row", style: "align-items:center" },
        h("span", {}, "Agent ", h("strong", {}, sum.agent_id)),
        h("span", { class: `status status-${sum.status}`, id: "session-status" }, sum.status),
        h("span", { class: "muted" }, `${sum.usage.llm_calls} model calls · $${sum.usage.cost} · created ${when(sum.created_at)}`),
        h("a", { href: `#/sessions/${enc(id)}/events` }, "Event log"),
        h("a", { href: `#/sessions/${enc(id)}/tree` }, "Message tree"),
      ),
    );
    const from = [];
    const fork = sum.forked_from;
    if (fork) {
      from.push(
        h(
          "p",
          { class: "origin", id: "forked-from" },
          "Forked from ",
          h("a", { href: `#/sessions/${enc(fork.session_id)}` }, fork.session_id),
          " after turn ",
          h("a", { href: `#/sessions/${enc(fork.session_id)}/turns/${enc(fork.turn_id)}` }, fork.turn_id),
        ),
      );
    }
    const parent = sum.parent;
    if (parent) {
      from.push(
        h("p", { class: "origin", id: "parent-session" }, "Sub-agent session of ", h("a", { href: `#/sessions/${enc(parent.session_id)}` }, parent.session_id), ` (its call ${parent.tool_call_id})`),
      );
    }
    origin.replaceChildren(...from);
    // The forms are rebuilt only when what waits changes, so typing in them survives refreshes.
    const key = JSON.stringify([sum.pending_client_calls.map((c) => [c.id, c.attempt]), sum.awaiting_approval.map((c) => c.id), sum.open_interrupts.map((i) => i.id)]);
    if (key !== formsKey) {
      formsKey = key;
      const forms = pendingForms(id, sum, refreshSoon);
      notices.replaceChildren(...(forms.length ? [h("h2", {}, "Waiting for you"), ...forms] : []));
    }
    cancelButton.disabled = !sum.active_turn;

    if (branchId && !tree.byId.has(branchId)) throw new Error(`no message ${branchId} in this session`);
    shownPath = branchId ? branchThrough(tree, branchId) : tree.active;
    const last = shownPath[shownPath.length - 1];
    onBranch = Boolean(branchId) && Boolean(last) && last.id !== tree.head;
    banner.replaceChildren(
      onBranch
        ? h(
            "div",
            { class: "notice branch-banner", id: "branch-banner" },
            h("strong", {}, "Another branch. "),
            "It is shown as it was recorded; sending a message continues it (and makes it the active branch). ",
            h("a", { href: `#/sessions/${enc(id)}` }, "Back to the active branch"),
          )
        : [],
    );
    sendButton.textContent = onBranch ? "Continue this branch" : "Send";
    sendButton.disabled = false;
    if (editing) return sum;
    // The durable messages replace the streamed previews.
    live.clear();
    // A fold is a call's or a compaction marker's.
    const fold = (d) => (d.dataset.call ? `call ${d.dataset.call}` : `marker ${d.dataset.marker}`);
    const keepOpen = new Set([...convo.querySelectorAll("details[open]")].map(fold));
    convo.replaceChildren(...conversation(shownPath, { id, tree, log, onEdit: edit, turnBar }));
    for (const d of convo.querySelectorAll("details")) if (keepOpen.has(fold(d))) d.open = true;
    return sum;
  }

  let pending = null;
  function refreshSoon() {
    // Events come in bursts: one read after the burst.
    if (pending) return;
    pending = setTimeout(() => {
      pending = null;
      refresh().catch((err) => !signal.aborted && sendError.replaceChildren(errorBox(err)));
    }, 100);
  }
  signal.addEventListener("abort", () => pending && clearTimeout(pending));

  const first = await refresh();
  if (!first) return;
  // A stream that cannot flow (a proxy that buffers it, a connection that stalls) must not
  // freeze the view: every few seconds the summary says whether the log moved on without a
  // frame.
  const poll = setInterval(async () => {
    try {
      const sum = await api(`/v1/sessions/${enc(id)}`, { signal });
      if (sum.last_seq > log.last) refreshSoon();
    } catch (err) {
      if (!signal.aborted) console.warn("summary poll:", err);
    }
  }, SESSION_POLL_MS);
  signal.addEventListener("abort", () => clearInterval(poll));
  // From the summary's last event: whatever happened after it was read comes as frames, each
  // one a refresh (the log may already hold them; the messages and summary may not).
  followStream(
    `/v1/sessions/${enc(id)}/events/stream`,
    first.last_seq,
    (frame) => {
      if (frame.event === "llm.token.delta") {
        if (onBranch) return;
        const { call_id: callId, delta } = JSON.parse(frame.data);
        if (!delta.text) return;
        deltas += 1;
        document.body.dataset.deltas = String(deltas);
        let bubble = live.get(callId);
        if (!bubble) {
          bubble = { text: h("div", { class: "text" }) };
          live.set(callId, bubble);
          convo.append(h("article", { class: "msg assistant live", dataset: { streaming: callId } }, h("div", { class: "role" }, "assistant (streaming)"), bubble.text));
        }
        bubble.text.append(delta.text);
      } else if (frame.id !== null) {
        log.add(Number(frame.id), JSON.parse(frame.data));
        refreshSoon();
      }
    },
    signal,
  );
}

// ---------- The message tree ----------

async function treeView(id, signal) {
  document.title = `${id} tree · Turnstone`;
  const wire = await loadTree(id, signal);
  if (signal.aborted) return;
  const t = indexTree(wire);

  // A chain of only children stays at one level; each branch point nests its children.
  function chain(startId) {
    const list = h("ol", { class: "tree-chain" });
    for (let cur = startId; cur; ) {
      const node = t.byId.get(cur);
      const m = node.message;
      const kids = t.children.get(cur) || [];
      const active = t.activeIds.has(cur);
      const item = h(
        "li",
        { class: `tree-node ${active ? "on-active" : ""}`, dataset: { message: cur } },
        h(
          "a",
          { href: branchHref(id, t, cur), class: "tree-link" },
          h("span", { class: `role-tag role-${m.role}` }, m.compaction ? "compaction" : m.role),
          " ",
          snippet(m),
        ),
        active ? h("span", { class: "tag" }, cur === t.head ? "head · active branch" : "active branch") : null,
      );
      list.append(item);
      if (kids.length === 1) {
        cur = kids[0];
        continue;
      }
      if (kids.length > 1) {
        item.append(
          h(
            "ul",
            { class: "tree-branches", "aria-label": `${kids.length} branches` },
            kids.map((k, i) => h("li", { class: "tree-branch" }, h("div", { class: "muted small" }, `branch ${i + 1} of ${kids.length}`), chain(k))),
          ),
        );
      }
      cur = null;
    }
    return list;
  }

  const roots = t.children.get(null) || [];
  show(
    h("p", {}, h("a", { href: `#/sessions/${enc(id)}` }, "← Session"), " · ", h("a", { href: "#/sessions" }, "Sessions")),
    h("h1", {}, "Message tree of ", h("code", {}, id)),
    h(
      "p",
      { class: "muted" },
      `${t.byId.size} messages. Edits and continued branches are siblings; pick a message to read the branch through it (then continue it from the session view). The active branch is marked.`,
    ),
    roots.length
      ? h("section", { id: "tree", "aria-label": "Message tree" }, roots.length === 1 ? chain(roots[0]) : h("ul", { class: "tree-branches" }, roots.map((r) => h("li", { class: "tree-branch" }, chain(r)))))
      : h("p", {}, "No messages yet."),
  );
}

// ---------- A turn's timeline ----------

/** The time of an event the log records, or derives: `at`, a start, a deadline less its timeout. */
function recordedTime(e, calls) {
  if (typeof e.at === "number") return e.at;
  if (e.type === "turn_started") return e.turn.started_at ?? null;
  if (e.type === "call_dispatched") {
    const c = calls.get(e.call_id);
    const timeout = c && c.policy ? c.policy.timeout_secs : null;
    if (typeof e.deadline === "number" && typeof timeout === "number") return e.deadline - timeout * 1000;
  }
  return null;
}

/** Builds the waterfall's rows from the events of one turn (`evs`, in log order). */
function timelineRows(evs, turn) {
  // Times: recorded where the log has them; otherwise placed by order between recorded ones.
  const calls = new Map();
  const times = [];
  for (const { event: e } of evs) {
    if (e.type === "call_created") calls.set(e.call.id, e.call);
    times.push(recordedTime(e, calls));
  }
  const approx = times.map((t) => t === null);
  for (let i = 0; i < times.length; i++) {
    if (times[i] !== null) continue;
    let p = i - 1;
    while (p >= 0 && approx[p]) p--;
    let n = i + 1;
    while (n < times.length && times[n] === null) n++;
    const tp = p >= 0 ? times[p] : turn.startedAt;
    const tn = n < times.length ? times[n] : turn.endedAt ?? tp;
    const ip = p >= 0 ? p : -1;
    const inN = n < times.length ? n : times.length;
    times[i] = tp === null || tp === undefined ? tn : tn === null || tn === undefined ? tp : tp + ((tn - tp) * (i - ip)) / (inN - ip);
  }
  for (let i = 1; i < times.length; i++) if (times[i] < times[i - 1]) times[i] = times[i - 1];

  const rows = [];
  const decisions = new Map();
  const callRows = new Map();
  const attemptOf = (row, n) => row.attempts.find((a) => a.n === n) || row.attempts[row.attempts.length - 1];
  evs.forEach(({ event: e }, i) => {
    const t = times[i];
    const ax = approx[i];
    switch (e.type) {
      case "decision_opened": {
        const trig = e.decision.trigger && e.decision.trigger.type;
        const row = { kind: "decision", label: `decision · ${trig || "?"}`, start: t, approx: ax, attempts: [], status: "open" };
        decisions.set(e.decision.id, row);
        rows.push(row);
        break;
      }
      case "decision_accepted": {
        rows.push({ kind: "decision", label: `decision · ${e.trigger} (engine-hosted)`, start: t, end: t, approx: ax, attempts: [], status: "accepted", point: true });
        break;
      }
      case "decision_dispatched":
      case "call_dispatched": {
        const row = e.type === "call_dispatched" ? callRows.get(e.call_id) : decisions.get(e.decision_id);
        if (row) row.attempts.push({ n: e.attempt, start: t, approx: ax, status: "running" });
        break;
      }
      case "decision_retry_scheduled":
      case "call_retry_scheduled": {
        const row = e.type === "call_retry_scheduled" ? callRows.get(e.call_id) : decisions.get(e.decision_id);
        const a = row && attemptOf(row, e.attempt);
        if (a) Object.assign(a, { end: t, endApprox: ax, status: "retry", error: typeof e.error === "string" ? e.error : e.error && e.error.error, retryAt: e.retry_at });
        break;
      }
      case "decision_resolved":
      case "decision_failed":
      case "decision_voided": {
        const row = decisions.get(e.decision_id);
        if (!row) break;
        const status = e.type === "decision_resolved" ? "ok" : e.type === "decision_failed" ? "fail" : "voided";
        const a = row.attempts[row.attempts.length - 1];
        if (a && a.status === "running") Object.assign(a, { end: t, endApprox: ax, status, error: e.error || e.reason });
        Object.assign(row, { end: t, status, error: e.error || e.reason || null });
        break;
      }
      case "call_created": {
        const spec = e.call.spec;
        const kind = spec.kind === "llm_call" ? "llm" : spec.kind === "tool_call" ? "tool" : "subagent";
        // A tool the engine runs is an MCP server's (`<server>__<tool>`).
        const tool = spec.handler === "server" ? `MCP tool ${spec.name}` : `tool ${spec.name}`;
        const label = kind === "llm" ? "model call" : kind === "tool" ? tool : `sub-agent ${spec.agent_id}`;
        const row = { kind, label, callId: e.call.id, child: spec.session_id, start: t, approx: ax, attempts: [], status: "queued", approval: Boolean(e.call.awaiting_approval) };
        callRows.set(e.call.id, row);
        rows.push(row);
        break;
      }
      case "call_approved": {
        const row = callRows.get(e.call_id);
        if (row) row.approvedAt = t;
        break;
      }
      case "call_settled": {
        const row = callRows.get(e.call_id);
        if (!row) break;
        const err = e.outcome && (e.outcome.Err || e.outcome.err);
        const ok = e.outcome && (e.outcome.Ok || e.outcome.ok);
        const status = err ? "fail" : "ok";
        let a = attemptOf(row, e.attempt);
        if (!a) {
          // Settled without an attempt of its own (a denial, say): the wait is the bar.
          a = { n: e.attempt, start: row.start, approx: row.approx, status, synthetic: true };
          row.attempts.push(a);
        }
        Object.assign(a, { end: t, endApprox: ax, status, error: err ? err.error : null });
        Object.assign(row, { end: t, status, error: err ? err.error : null });
        if (ok && ok.type === "llm" && ok.value && ok.value.usage) row.usage = ok.value.usage;
        break;
      }
      case "call_voided": {
        const row = callRows.get(e.call_id);
        if (!row) break;
        for (const a of row.attempts) if (a.status === "running") Object.assign(a, { end: t, endApprox: ax, status: "voided", error: e.reason });
        Object.assign(row, { end: t, status: "voided", error: e.reason });
        break;
      }
      default:
    }
  });
  const anyApprox = rows.some((r) => (r.point ? r.approx : r.attempts.some((a) => a.approx || a.endApprox) || (!r.attempts.length && r.approx)));
  return { rows, anyApprox };
}

const MARK = { ok: "✓", fail: "✕", retry: "↻", voided: "⊘", running: "…", accepted: "✓", open: "…", queued: "…" };

async function timelineView(id, turnId, signal) {
  document.title = `Turn ${turnId} · ${id} · Turnstone`;
  const [record, events] = await Promise.all([
    api(`/v1/sessions/${enc(id)}/turns/${enc(turnId)}`, { signal }),
    loadEvents(id, signal),
  ]);
  if (signal.aborted) return;
  const rec = record.turn || record;
  const startAt = events.findIndex(({ event: e }) => (e.type === "turn_started" && e.turn.id === turnId) || (e.type === "turn_activated" && e.turn_id === turnId));
  const back = h("p", {}, h("a", { href: `#/sessions/${enc(id)}` }, "← Session"), " · ", h("a", { href: `#/sessions/${enc(id)}/events` }, "Event log"));
  if (startAt < 0) {
    show(back, h("h1", {}, "Turn ", h("code", {}, turnId)), h("p", {}, `This turn has not started (${rec.status || "unknown"}).`));
    return;
  }
  let endAt = events.findIndex(({ event: e }) => e.type === "turn_ended" && e.turn_id === turnId);
  if (endAt < 0) endAt = events.length - 1;
  const evs = events.slice(startAt, endAt + 1);
  const turn = { startedAt: rec.started_at ?? null, endedAt: rec.ended_at ?? null };
  const { rows, anyApprox } = timelineRows(evs, turn);

  const t0 = turn.startedAt ?? Math.min(...rows.map((r) => r.start));
  const ends = rows.flatMap((r) => [r.end, ...r.attempts.map((a) => a.end), ...r.attempts.map((a) => a.retryAt)]).filter((x) => typeof x === "number");
  const t1 = Math.max(turn.endedAt ?? Date.now(), ...ends, t0 + 1);
  const span = t1 - t0;
  const pct = (t) => `${Math.max(0, Math.min(100, ((t - t0) / span) * 100)).toFixed(3)}%`;
  const wid = (a, b) => `${Math.max(0, ((b - a) / span) * 100).toFixed(3)}%`;
  const now = rec.ended_at ? t1 : Date.now();

  function segments(r) {
    const segs = [];
    // Before its first attempt (or still without one): queued, or waiting for approval.
    const firstStart = r.attempts.length ? r.attempts[0].start : r.end ?? now;
    if (!r.point && firstStart > r.start) {
      const why = r.approval ? "waited for approval" : "queued";
      segs.push(h("div", { class: "seg seg-wait", style: `left:${pct(r.start)};width:${wid(r.start, firstStart)}`, title: `${why}: ${duration(firstStart - r.start, r.approx)}` }));
    }
    if (r.point) segs.push(h("div", { class: "seg seg-point", style: `left:${pct(r.start)}`, title: `${r.label} at ${duration(r.start - t0, r.approx)}` }, "◆"));
    for (const a of r.attempts) {
      const end = a.end ?? now;
      const text = `attempt ${a.n}: ${a.status}${a.error ? ` (${a.error})` : ""}, ${duration(end - a.start, a.approx || a.endApprox)}`;
      segs.push(h("div", { class: `seg seg-${a.status}`, style: `left:${pct(a.start)};width:${wid(a.start, end)}`, title: text, dataset: { attempt: String(a.n) } }, MARK[a.status] || ""));
      if (a.retryAt) {
        // The backoff: from the failure to the time the retry was scheduled for.
        if (a.retryAt > end) segs.push(h("div", { class: "seg seg-backoff", style: `left:${pct(end)};width:${wid(end, a.retryAt)}`, title: `backoff: ${duration(a.retryAt - end)}` }));
        segs.push(h("div", { class: "marker retry-at", style: `left:${pct(a.retryAt)}`, title: `retry scheduled at +${duration(a.retryAt - t0)}` }, "↻"));
      }
    }
    return segs;
  }

  function statusText(r) {
    if (r.point) return `${MARK.accepted} accepted`;
    const retries = r.attempts.filter((a) => a.status === "retry");
    const parts = [];
    if (retries.length) parts.push(`↻ ${retries.length} ${retries.length === 1 ? "retry" : "retries"} (${retries.map((a) => `attempt ${a.n}: ${a.error || "failed"}`).join("; ")})`);
    if (r.status === "ok") parts.push(`✓ ${r.kind === "decision" ? "resolved" : "completed"}`);
    else if (r.status === "fail") parts.push(`✕ failed: ${r.error || "error"}`);
    else if (r.status === "voided") parts.push(`⊘ voided: ${r.error || ""}`);
    else if (r.approval && !r.approvedAt && !r.attempts.length) parts.push("… awaiting approval");
    else parts.push(`… ${r.attempts.length ? "running" : r.status}`);
    if (r.approvedAt) parts.unshift("approved");
    if (r.usage) parts.push(tokensText(r.usage));
    return parts.join(" · ");
  }

  // A step's duration: from its first attempt to its end (the wait before is its own segment).
  function rowDuration(r) {
    if (r.point) return "";
    const ran = r.attempts.filter((a) => !a.synthetic);
    const end = r.end ?? (r.attempts.length ? r.attempts[r.attempts.length - 1].end : null) ?? now;
    if (!ran.length) return duration(end - r.start, r.approx);
    return duration(end - ran[0].start, r.attempts.some((a) => a.approx || a.endApprox));
  }

  const ticks = [0, 0.25, 0.5, 0.75, 1].map((f) => h("span", { class: "tick", style: `left:${(f * 100).toFixed(1)}%` }, `+${duration(span * f)}`));
  const turnRow = h(
    "tr",
    { class: `tl-row kind-turn status-${rec.status}` },
    h("th", { scope: "row" }, "turn"),
    h("td", { class: "tl-status" }, `${rec.status === "completed" ? "✓" : rec.status === "failed" ? "✕" : rec.status === "cancelled" ? "⊘" : "…"} ${rec.status}${rec.error ? `: ${rec.error}` : ""}`),
    h("td", { class: "tl-duration num" }, duration((turn.endedAt ?? now) - t0)),
    h("td", { class: "tl-track" }, h("div", { class: "track" }, h("div", { class: `seg seg-turn seg-${rec.status === "completed" ? "ok" : rec.status === "active" ? "running" : "fail"}`, style: `left:0;width:${wid(t0, turn.endedAt ?? now)}` }))),
  );
  const table = h(
    "table",
    { class: "timeline", id: "timeline" },
    h("caption", { class: "muted" }, "Decisions, model calls and tool calls of the turn on one time axis: each attempt a segment (✓ completed, ✕ failed, ↻ failed and retried, ⊘ voided, … running); hatched: waiting (queued or for approval); dotted: backoff before a retry, ↻ where it was scheduled; ◆ an engine-hosted decision."),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Step"), h("th", { scope: "col" }, "Status"), h("th", { scope: "col" }, "Duration"), h("th", { scope: "col", class: "tl-axis" }, h("div", { class: "axis" }, ticks)))),
    h(
      "tbody",
      {},
      turnRow,
      rows.map((r) =>
        h(
          "tr",
          { class: `tl-row kind-${r.kind} status-${r.status}`, dataset: { call: r.callId || "" } },
          h("th", { scope: "row" }, r.label, r.kind === "subagent" && r.child ? [" → ", h("a", { href: `#/sessions/${enc(r.child)}` }, r.child)] : null),
          h("td", { class: "tl-status" }, statusText(r)),
          h("td", { class: "tl-duration num" }, rowDuration(r)),
          h("td", { class: "tl-track" }, h("div", { class: "track" }, segments(r))),
        ),
      ),
    ),
  );
  const usage = rec.usage || {};
  show(
    back,
    h("h1", {}, "Turn ", h("code", {}, turnId)),
    h(
      "dl",
      { class: "facts", id: "turn-facts" },
      h("dt", {}, "Status"),
      h("dd", {}, h("span", { class: `status status-${rec.status}` }, rec.status), rec.error ? ` ${rec.error}` : ""),
      h("dt", {}, "Started"),
      h("dd", {}, when(rec.started_at) || "—"),
      h("dt", {}, "Duration"),
      h("dd", {}, rec.ended_at && rec.started_at ? duration(rec.ended_at - rec.started_at) : "running"),
      h("dt", {}, "Model calls"),
      h("dd", {}, String(usage.llm_calls ?? 0)),
      h("dt", {}, "Tokens"),
      h("dd", { id: "turn-tokens" }, tokensText(usage.tokens)),
      h("dt", {}, "Cost"),
      h("dd", { id: "turn-cost" }, dollars(usage.cost_picodollars)),
    ),
    anyApprox
      ? h("p", { class: "muted small" }, "≈: the log does not record when this happened (no `at` on the event, e.g. an engine-hosted decision, or a log written before events carried it): placed by the order of the events between the times it does record.")
      : null,
    h("div", { class: "timeline-wrap" }, table),
  );
  if (!rec.ended_at) {
    // Still running: read it again in a moment.
    const timer = setTimeout(() => !signal.aborted && route(), 2000);
    signal.addEventListener("abort", () => clearTimeout(timer));
  }
}

// ---------- Event log ----------

const EVENT_PAGE_KEY = "turnstone.eventPage";

async function eventsView(id, signal) {
  document.title = `${id} events · Turnstone`;
  const search = h("input", { id: "event-search", type: "search", placeholder: "type or text, e.g. message.recorded", "aria-label": "Search events" });
  const follow = h("input", { type: "checkbox", id: "event-follow", checked: true });
  const pageSize = h(
    "select",
    { id: "event-page-size" },
    ...[20, 100, 500].map((n) => h("option", { value: String(n) }, String(n))),
  );
  pageSize.value = sessionStorage.getItem(EVENT_PAGE_KEY) || "100";
  const count = h("span", { class: "muted", id: "event-count", "aria-live": "polite" });
  const older = h("button", { type: "button", class: "quiet", id: "event-older" }, "Load older events");
  const held = h("span", { class: "muted", id: "event-held" });
  const tbody = h("tbody", { id: "events-body" });
  show(
    h("p", {}, h("a", { href: `#/sessions/${enc(id)}` }, "← Session"), " · ", h("a", { href: "#/sessions" }, "Sessions")),
    h("h1", {}, "Event log of ", h("code", {}, id)),
    h(
      "div",
      { class: "row", style: "align-items:center" },
      h("label", {}, "Search the loaded events", search),
      h("label", {}, "Page size", pageSize),
      h("label", { class: "inline" }, follow, " follow live"),
      held,
      count,
    ),
    h("div", { class: "pager" }, older),
    h("table", { class: "events" }, h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Seq"), h("th", { scope: "col" }, "Type"), h("th", { scope: "col" }, "Event"))), tbody),
  );
  let oldest = null; // the lowest seq shown
  let newest = 0;
  let total = 0; // events in the log, as far as known
  const waiting = []; // live events held while "follow live" is off

  function matches(row) {
    const q = search.value.trim().toLowerCase();
    return !q || row.dataset.search.includes(q);
  }
  function applyFilter() {
    let shown = 0;
    for (const row of tbody.rows) {
      row.hidden = !matches(row);
      if (!row.hidden) shown += 1;
    }
    count.textContent = `${shown} of ${tbody.rows.length} loaded events (${total} in the log)`;
    older.disabled = oldest === null || oldest <= 1;
    older.textContent = oldest !== null && oldest > 1 ? `Load older events (before #${oldest})` : "No older events";
    held.textContent = waiting.length ? `${waiting.length} new events held` : "";
  }
  search.addEventListener("input", applyFilter);

  function row(seq, event) {
    const json = JSON.stringify(event, null, 2);
    const type = event.type || "";
    const flat = json.replace(/\s+/g, " ");
    // Types appear as `message_recorded` in the JSON and `message.recorded` on the stream: both match.
    const tr = h(
      "tr",
      { dataset: { seq: String(seq), search: `${type} ${type.replace(/_/g, ".")} ${json}`.toLowerCase() } },
      h("td", { class: "num" }, seq),
      h("td", {}, h("code", {}, type)),
      h("td", {}, h("details", {}, h("summary", {}, flat.length > 90 ? `${flat.slice(0, 90)}…` : flat), h("pre", {}, json))),
    );
    tr.hidden = !matches(tr);
    return tr;
  }

  function append(seq, event) {
    if (seq <= newest) return;
    newest = seq;
    total = Math.max(total, seq);
    if (oldest === null) oldest = seq;
    tbody.append(row(seq, event));
  }

  /** One page of the events before the oldest shown (the newest page at first). */
  async function loadOlder() {
    const size = Number(pageSize.value);
    const before = oldest === null ? total + 1 : oldest;
    const after = Math.max(0, before - 1 - size);
    const limit = before - 1 - after;
    if (limit <= 0) return;
    const page = await api(`/v1/sessions/${enc(id)}/events?after=${after}&limit=${limit}`, { signal });
    if (signal.aborted) return;
    const rows = page.events.filter((e) => oldest === null || e.seq < oldest).map((e) => row(e.seq, e.event));
    tbody.prepend(...rows);
    if (page.events.length) {
      if (oldest === null) newest = Math.max(newest, page.events[page.events.length - 1].seq);
      oldest = Math.min(oldest ?? Infinity, page.events[0].seq);
    } else {
      oldest = after + 1;
    }
    applyFilter();
  }
  older.addEventListener("click", () => {
    const first = tbody.rows[0];
    loadOlder()
      .then(() => first && first.previousElementSibling && first.previousElementSibling.querySelector("summary").focus())
      .catch((err) => !signal.aborted && count.replaceChildren(errorBox(err)));
  });
  pageSize.addEventListener("change", () => {
    // Start again from the newest page of the new size.
    sessionStorage.setItem(EVENT_PAGE_KEY, pageSize.value);
    route();
  });
  follow.addEventListener("change", () => {
    if (!follow.checked) return;
    for (const [seq, event] of waiting.splice(0)) append(seq, event);
    applyFilter();
  });

  const sum = await api(`/v1/sessions/${enc(id)}`, { signal });
  total = sum.last_seq;
  newest = sum.last_seq;
  await loadOlder();
  followStream(
    `/v1/sessions/${enc(id)}/events/stream`,
    newest,
    (frame) => {
      if (frame.id === null) return;
      const seq = Number(frame.id);
      total = Math.max(total, seq);
      if (follow.checked) append(seq, JSON.parse(frame.data));
      else waiting.push([seq, JSON.parse(frame.data)]);
      applyFilter();
    },
    signal,
  );
}

// ---------- Start ----------

document.getElementById("key-button").addEventListener("click", () => askKey().then((ok) => ok && route()));
window.addEventListener("hashchange", () => {
  route();
  main().focus();
});
route();
