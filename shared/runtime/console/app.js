// Turnstone's web console: one ES module, no framework, no build step. It uses only the public
// HTTP API, so it works against any deployment. Every piece of data goes into the DOM as text
// (textContent / text nodes), never as HTML.

const KEY_STORAGE = "turnstone.apiKey";
const LIST_REFRESH_MS = 3000;
const PAGE_SIZE = 25;

// ---------- DOM helpers ----------

/** Makes an element: `attrs` are properties (`on*` become listeners), children text or nodes. */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name in el && typeof value !== "string") el[name] = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
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
 * stream reader, not EventSource, which cannot send the Authorization header. Reconnects with
 * Last-Event-ID until `signal` aborts.
 */
async function followStream(path, after, onFrame, signal) {
  let last = after;
  while (!signal.aborted) {
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
    // The stream does not end on its own: reconnect after a pause, from the last event seen.
    await new Promise((r) => setTimeout(r, 1000));
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
  else if (parts[0] === "sessions" && parts.length === 2) view = sessionView(parts[1], signal);
  else if (parts[0] === "sessions" && parts[2] === "events") view = eventsView(parts[1], signal);
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

// ---------- One session ----------

/** The active path as nodes: tool calls and their results folded under their assistant message. */
function conversation(messages) {
  const results = new Map();
  for (const m of messages) if (m.role === "tool" && m.tool_call_id) results.set(m.tool_call_id, m);
  const shown = new Set();
  const nodes = [];
  for (const m of messages) {
    if (m.role === "tool" && shown.has(m.tool_call_id)) continue;
    const calls = (m.tool_calls || []).map((call) => {
      shown.add(call.id);
      const result = results.get(call.id);
      return h(
        "details",
        { class: "call", dataset: { call: call.id } },
        h("summary", {}, `${call.function.name}(…) `, result ? "· answered" : "· pending"),
        h("div", { class: "muted" }, "arguments"),
        h("pre", {}, call.function.arguments),
        result ? [h("div", { class: "muted" }, "result"), h("pre", {}, textOf(result.content))] : null,
      );
    });
    nodes.push(
      h(
        "article",
        { class: `msg ${m.role}`, dataset: { message: m.id } },
        h("div", { class: "role" }, m.role === "tool" ? `tool ${m.name || ""}` : m.role),
        textOf(m.content) ? h("div", { class: "text" }, textOf(m.content)) : null,
        calls,
      ),
    );
  }
  return nodes;
}

async function sessionView(id, signal) {
  document.title = `${id} · Turnstone`;
  const header = h("div");
  const notices = h("div", { "aria-live": "polite" });
  const convo = h("section", { class: "conversation", id: "conversation", "aria-label": "Conversation", "aria-live": "polite" });
  const live = new Map(); // call id -> live assistant bubble of streamed text
  let summary = null;
  let deltas = 0;

  const input = h("textarea", { id: "composer-input", placeholder: "Message (Ctrl+Enter sends)", "aria-label": "Message" });
  const queue = h("input", { type: "checkbox", id: "composer-queue" });
  const sendError = h("div");
  const cancelButton = h("button", { type: "button", class: "danger", id: "cancel-turn", onclick: cancel }, "Cancel turn");
  const form = h(
    "form",
    { class: "composer", id: "composer", onsubmit: (e) => { e.preventDefault(); send(); } },
    input,
    h(
      "div",
      { class: "row", style: "margin-top:.4rem;align-items:center" },
      h("button", { type: "submit", id: "send" }, "Send"),
      h("label", { style: "flex-direction:row;align-items:center" }, queue, " queue behind the active turn"),
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
    notices,
    convo,
    form,
  );

  async function send() {
    const text = input.value;
    if (!text.trim() || !summary) return;
    sendError.replaceChildren();
    try {
      await api(`/v1/sessions/${enc(id)}/inputs${queue.checked ? "?queue=true" : ""}`, {
        method: "POST",
        body: { type: "client.message", agent_id: summary.agent_id, message: { role: "user", content: text } },
      });
      input.value = "";
      refresh();
    } catch (err) {
      sendError.replaceChildren(errorBox(err));
    }
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

  async function refresh() {
    const [sum, path] = await Promise.all([
      api(`/v1/sessions/${enc(id)}`, { signal }),
      api(`/v1/sessions/${enc(id)}/messages`, { signal }),
    ]);
    if (signal.aborted) return;
    summary = sum;
    header.replaceChildren(
      h(
        "p",
        { class: "row", style: "align-items:center" },
        h("span", {}, "Agent ", h("strong", {}, sum.agent_id)),
        h("span", { class: `status status-${sum.status}`, id: "session-status" }, sum.status),
        h("span", { class: "muted" }, `${sum.usage.llm_calls} model calls · $${sum.usage.cost} · created ${when(sum.created_at)}`),
        h("a", { href: `#/sessions/${enc(id)}/events` }, "Event log"),
      ),
    );
    const open = [];
    for (const i of sum.open_interrupts) open.push(h("div", { class: "notice" }, `Open interrupt ${i.id}: ${i.reason}`));
    for (const c of sum.pending_client_calls) open.push(h("div", { class: "notice" }, `Client tool call ${c.name} (${c.id}) waits for an answer: ${c.arguments}`));
    for (const c of sum.awaiting_approval) open.push(h("div", { class: "notice" }, `Tool call ${c.name} (${c.id}) awaits approval`));
    notices.replaceChildren(...open);
    cancelButton.disabled = !sum.active_turn;
    // The durable messages replace the streamed previews.
    live.clear();
    const keepOpen = new Set([...convo.querySelectorAll("details[open]")].map((d) => d.dataset.call));
    convo.replaceChildren(...conversation(path.messages));
    for (const d of convo.querySelectorAll("details")) if (keepOpen.has(d.dataset.call)) d.open = true;
    return sum;
  }

  let pending = null;
  function refreshSoon() {
    // Events come in bursts: one read after the burst.
    if (pending) return;
    pending = setTimeout(() => {
      pending = null;
      refresh().catch((err) => !signal.aborted && notices.replaceChildren(errorBox(err)));
    }, 100);
  }
  signal.addEventListener("abort", () => pending && clearTimeout(pending));

  const first = await refresh();
  followStream(
    `/v1/sessions/${enc(id)}/events/stream`,
    first.last_seq,
    (frame) => {
      if (frame.event === "llm.token.delta") {
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
        refreshSoon();
      }
    },
    signal,
  );
}

// ---------- Event log ----------

async function eventsView(id, signal) {
  document.title = `${id} events · Turnstone`;
  const search = h("input", { id: "event-search", type: "search", placeholder: "type or text, e.g. message.recorded", "aria-label": "Search events" });
  const follow = h("input", { type: "checkbox", id: "event-follow", checked: true });
  const count = h("span", { class: "muted", id: "event-count", "aria-live": "polite" });
  const tbody = h("tbody", { id: "events-body" });
  show(
    h("p", {}, h("a", { href: `#/sessions/${enc(id)}` }, "← Session"), " · ", h("a", { href: "#/sessions" }, "Sessions")),
    h("h1", {}, "Event log of ", h("code", {}, id)),
    h("div", { class: "row", style: "align-items:center" }, h("label", {}, "Search", search), h("label", { style: "flex-direction:row;align-items:center" }, follow, " follow live"), count),
    h("table", { class: "events" }, h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Seq"), h("th", { scope: "col" }, "Type"), h("th", { scope: "col" }, "Event"))), tbody),
  );
  let total = 0;

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
    count.textContent = `${shown} of ${total} events`;
  }
  search.addEventListener("input", applyFilter);

  let last = 0;
  function add(seq, event) {
    if (seq <= last) return;
    last = seq;
    total += 1;
    const json = JSON.stringify(event, null, 2);
    const type = event.type || "";
    // Types appear as `message_recorded` in the JSON and `message.recorded` on the stream: both match.
    const row = h(
      "tr",
      { dataset: { seq: String(seq), search: `${type} ${type.replace(/_/g, ".")} ${json}`.toLowerCase() } },
      h("td", { class: "num" }, seq),
      h("td", {}, h("code", {}, type)),
      h("td", {}, h("details", {}, h("summary", {}, json.length > 90 ? `${json.replace(/\s+/g, " ").slice(0, 90)}…` : json.replace(/\s+/g, " ")), h("pre", {}, json))),
    );
    row.hidden = !matches(row);
    tbody.append(row);
  }

  for (;;) {
    const pageOf = await api(`/v1/sessions/${enc(id)}/events?after=${last}&limit=1000`, { signal });
    for (const e of pageOf.events) add(e.seq, e.event);
    if (pageOf.events.length < 1000) break;
  }
  applyFilter();
  followStream(
    `/v1/sessions/${enc(id)}/events/stream`,
    last,
    (frame) => {
      if (frame.id === null || !follow.checked) return;
      add(Number(frame.id), JSON.parse(frame.data));
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
