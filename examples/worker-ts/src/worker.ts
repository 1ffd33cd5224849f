// A Turnstone worker in TypeScript on Node's standard library (no runtime dependencies),
// typed by src/protocol.ts, which is generated from the protocol's JSON Schema (schema/).
//
// Turnstone POSTs a DecisionRequest to this endpoint for every decision of the agents that name
// it as their `worker`; the worker answers with a DecisionResponse. Like examples/worker.py it
// accepts the engine's proposal for everything except `tool.execute`, where it runs one of two
// tools. It also answers `llm.execute` (agents with `handler = "worker"`) with a toy model that
// echoes the last user message: as JSON, or, when the call streams, as an event stream of
// `llm.token.delta` events ended by one `decision.result`.
//
//   npm ci && npx tsc && TURNSTONE_WORKER_SECRET=dev-secret node dist/worker.js   # :9000
//   TURNSTONE_WORKER_SECRET=dev-secret turnstone serve --config examples/worker-agent.toml
//   turnstone chat --agent assistant '/tool add {"a": 2, "b": 40}'
//
// Run the worker's own checks with `node dist/worker.js --self-test`.

import { createHmac, timingSafeEqual } from "node:crypto";
import { createServer, request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

import type {
  Action,
  DecisionRequest,
  DecisionResponse,
  DraftMessage,
  LlmRequest,
  LlmResponse,
  StreamDelta,
  Trigger,
} from "./protocol.js";

const SECRET = process.env.TURNSTONE_WORKER_SECRET ?? "";
const PORT = Number(process.env.PORT ?? "9000");
/** How far a signature's timestamp may be from our clock (the engine's default, 5 minutes). */
const TOLERANCE_SECS = 300;
/** The largest request body read; a decision carries the whole conversation. */
const MAX_BODY_BYTES = 16 * 1024 * 1024;

// ---- tools ----

type Tool = (args: unknown) => unknown;

function numberArg(args: unknown, name: string): number {
  const value = typeof args === "object" && args !== null ? (args as Record<string, unknown>)[name] : undefined;
  if (typeof value !== "number") throw new TypeError(`argument ${name} must be a number`);
  return value;
}

const TOOLS: Record<string, Tool> = {
  add: (args) => numberArg(args, "a") + numberArg(args, "b"),
  get_time: () => new Date().toISOString().replace(/\.\d{3}Z$/, "+00:00"),
};

// ---- the signature ----

/**
 * Checks `X-Turnstone-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">` over the raw
 * body, as the engine signs it (shared/runtime/src/worker/signature.rs): any one `v1` may
 * match (secrets rotate), other schemes are ignored, the timestamp must be within tolerance.
 */
export function verify(header: string, body: Buffer, secret: string, nowSecs = Date.now() / 1000): boolean {
  if (!secret) return true;
  let t: number | undefined;
  const signatures: Buffer[] = [];
  for (const part of header.split(",")) {
    const eq = part.indexOf("=");
    if (eq < 0) return false;
    const key = part.slice(0, eq).trim();
    const value = part.slice(eq + 1).trim();
    if (key === "t") {
      if (t !== undefined || !/^-?\d+$/.test(value)) return false;
      t = Number(value);
    } else if (key === "v1" && /^([0-9a-fA-F]{2})+$/.test(value)) {
      signatures.push(Buffer.from(value, "hex"));
    }
  }
  if (t === undefined || signatures.length === 0) return false;
  if (Math.abs(nowSecs - t) > TOLERANCE_SECS) return false;
  const expected = createHmac("sha256", secret).update(`${t}.`).update(body).digest();
  return signatures.some((s) => s.length === expected.length && timingSafeEqual(s, expected));
}

/** The header the engine would send for `body` at unix time `t` (for the self-test). */
export function sign(secret: string, t: number, body: Buffer): string {
  return `t=${t},v1=${createHmac("sha256", secret).update(`${t}.`).update(body).digest("hex")}`;
}

// ---- decisions ----

/** What the worker answers: a DecisionResponse, and for a streaming model call its deltas. */
export interface Answer {
  response: DecisionResponse;
  /** When set, the answer is an event stream: these `llm.token.delta` events, then the result. */
  deltas?: StreamDelta[];
}

export function decide(request: DecisionRequest): Answer {
  const trigger: Trigger = request.trigger;
  switch (trigger.type) {
    case "tool.execute": {
      const tool = TOOLS[trigger.name];
      if (tool === undefined || trigger.input.status !== "valid") {
        return { response: request.proposed }; // the engine proposes a terminal tool.error
      }
      let action: Action;
      try {
        action = { type: "tool.result", result: tool(trigger.input.value) };
      } catch (e) {
        // A tool failure is the model's news, not the worker's crash.
        const error = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
        action = { type: "tool.error", error };
      }
      return { response: { actions: [action] } };
    }
    case "llm.execute":
      return echoModel(trigger.request, trigger.format, trigger.stream);
    default:
      return { response: request.proposed }; // record, call the model, finish
  }
}

/** A toy model: answers "You said: <the last user message>", in words when it streams. */
function echoModel(request: unknown, format: string | null | undefined, stream: boolean): Answer {
  if (format) {
    // Provider-native requests (`format = "openai"`) are for a real model client.
    return { response: { actions: [{ type: "llm.error", error: `this worker's model speaks no ${format}` }] } };
  }
  const llm = request as LlmRequest;
  const lastUser = [...llm.messages].reverse().find((m: DraftMessage) => m.role === "user");
  const content = `You said: ${contentText(lastUser?.content)}`;
  const response: LlmResponse = { model: llm.model, content, finish_reason: "stop" };
  const answer: DecisionResponse = { actions: [{ type: "llm.result", response }] };
  if (!stream) return { response: answer };
  const deltas: StreamDelta[] = content.split(/(?<= )/).map((text) => ({ text }));
  return { response: answer, deltas };
}

function contentText(content: DraftMessage["content"]): string {
  if (typeof content === "string") return content;
  return (content ?? []).flatMap((part) => (part.type === "text" ? [part.text] : [])).join("\n");
}

/** An event stream: every delta, then the result (the engine reads until `decision.result`). */
export function eventStream(answer: Answer): string {
  const event = (name: string, data: unknown) => `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`;
  return (answer.deltas ?? []).map((d) => event("llm.token.delta", d)).join("") + event("decision.result", answer.response);
}

// ---- HTTP ----

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        reject(new Error("body too large"));
        req.destroy();
      } else chunks.push(chunk);
    });
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

function reply(res: ServerResponse, status: number, contentType: string, body: string): void {
  res.writeHead(status, { "Content-Type": contentType, "Content-Length": Buffer.byteLength(body) });
  res.end(body);
}

async function handle(req: IncomingMessage, res: ServerResponse, secret: string): Promise<void> {
  if (req.method !== "POST") return reply(res, 405, "text/plain", "POST a DecisionRequest\n");
  const body = await readBody(req);
  if (!verify(String(req.headers["x-turnstone-signature"] ?? ""), body, secret)) {
    return reply(res, 401, "text/plain", "bad signature\n");
  }
  let request: DecisionRequest;
  try {
    request = JSON.parse(body.toString("utf8")) as DecisionRequest;
  } catch {
    return reply(res, 400, "text/plain", "not JSON\n");
  }
  const answer = decide(request);
  const acceptsStream = String(req.headers.accept ?? "").includes("text/event-stream");
  if (answer.deltas && acceptsStream) {
    return reply(res, 200, "text/event-stream", eventStream(answer));
  }
  reply(res, 200, "application/json", JSON.stringify(answer.response));
}

export function serve(port: number, secret: string): Server {
  return createServer((req, res) => {
    handle(req, res, secret).catch((e: unknown) => {
      // A 5xx is retried by the engine; say what went wrong in the worker's log.
      console.error("worker:", e);
      if (!res.headersSent) reply(res, 500, "text/plain", "worker error\n");
      else res.destroy();
    });
  }).listen(port, "127.0.0.1");
}

// ---- self-test ----

async function selfTest(): Promise<void> {
  let passed = 0;
  const failed: string[] = [];
  const check = (name: string, ok: boolean) => (ok ? passed++ : failed.push(name));
  const equal = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

  // The engine's own test vector (signature.rs `known_vector`).
  check(
    "known vector",
    sign("secret", 1_700_000_000, Buffer.from("{}")) ===
      "t=1700000000,v1=b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163",
  );
  const body = Buffer.from('{"x":1}');
  const t = Math.floor(Date.now() / 1000);
  const header = sign("s", t, body);
  check("signature verifies", verify(header, body, "s"));
  check("wrong secret refused", !verify(header, body, "other"));
  check("tampered body refused", !verify(header, Buffer.from('{"x":2}'), "s"));
  check("old timestamp refused", !verify(sign("s", t - 3600, body), body, "s", t));
  check("rotated secret accepted", verify(`${header},v1=${"00".repeat(32)},v2=zz`, body, "s"));

  const request = (trigger: Trigger, proposed: DecisionResponse = {}): DecisionRequest => ({
    session_id: "s1", decision_id: "dec_1", agent_id: "assistant", identity: {}, trigger, proposed,
    state: null, agent: null, calls: [], pending_calls: 0, messages: [], message_tree: { nodes: [] },
    ancestry: [], attempts: 1, deadline: null, turn_id: null,
  });
  const execute = (value: unknown): Trigger => ({
    type: "tool.execute", id: "c1", name: "add", arguments: "{}", attempt: 1, input: { status: "valid", value },
  });
  check("add", equal(decide(request(execute({ a: 2, b: 40 }))).response, { actions: [{ type: "tool.result", result: 42 }] }));
  check("tool failure", decide(request(execute({ a: 2 }))).response.actions?.[0]?.type === "tool.error");
  check(
    "proposal accepted",
    equal(decide(request({ type: "session.start" }, { agent: { model: "m" } })).response, { agent: { model: "m" } }),
  );

  // Over HTTP: a signed JSON answer, an unsigned request refused, a streaming model call.
  const server = serve(0, "s");
  await new Promise((resolve) => server.once("listening", resolve));
  const port = (server.address() as AddressInfo).port;
  try {
    const post = (doc: DecisionRequest, sign_: boolean) => {
      const bytes = Buffer.from(JSON.stringify(doc));
      const headers: Record<string, string> = {
        "Content-Type": "application/json",
        Accept: "text/event-stream, application/json",
      };
      if (sign_) headers["X-Turnstone-Signature"] = sign("s", Math.floor(Date.now() / 1000), bytes);
      return postTo(port, bytes, headers);
    };
    const json = await post(request(execute({ a: 1, b: 2 })), true);
    check(
      "JSON over HTTP",
      json.status === 200 && json.type === "application/json" && equal(JSON.parse(json.body), { actions: [{ type: "tool.result", result: 3 }] }),
    );
    check("unsigned refused", (await post(request(execute({ a: 1, b: 2 })), false)).status === 401);
    const llm: LlmRequest = { model: "echo", messages: [{ role: "user", content: "hello there" }] };
    const sse = await post(request({ type: "llm.execute", id: "llm_1", request: llm, stream: true, attempt: 1 }), true);
    const events = parseEventStream(sse.body);
    const text = events.filter((e) => e.event === "llm.token.delta").map((e) => (JSON.parse(e.data) as StreamDelta).text).join("");
    const last = events.at(-1);
    const result = last?.event === "decision.result" ? (JSON.parse(last.data) as DecisionResponse) : undefined;
    const action = result?.actions?.[0];
    check(
      "event stream over HTTP",
      sse.type === "text/event-stream" &&
        events.length === 5 && // four words, then the result
        events.slice(0, -1).every((e) => e.event === "llm.token.delta") &&
        text === "You said: hello there" &&
        action?.type === "llm.result" &&
        (action.response as LlmResponse).content === text,
    );
  } finally {
    server.close();
  }

  console.log(`worker self-test: ${passed} passed, ${failed.length} failed${failed.length ? ": " + failed.join(", ") : ""}`);
  if (failed.length) process.exitCode = 1;
}

function postTo(port: number, body: Buffer, headers: Record<string, string>): Promise<{ status: number; type: string; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: "127.0.0.1", port, method: "POST", path: "/decide", headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () =>
        resolve({ status: res.statusCode ?? 0, type: String(res.headers["content-type"] ?? ""), body: Buffer.concat(chunks).toString("utf8") }),
      );
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body);
  });
}

function parseEventStream(text: string): { event: string; data: string }[] {
  return text
    .split("\n\n")
    .filter((block) => block.trim() !== "")
    .map((block) => {
      const field = (name: string) =>
        block.split("\n").filter((l) => l.startsWith(`${name}: `)).map((l) => l.slice(name.length + 2)).join("\n");
      return { event: field("event"), data: field("data") };
    });
}

if (process.argv.includes("--self-test")) {
  await selfTest();
} else {
  serve(PORT, SECRET);
  console.error(`worker listening on http://127.0.0.1:${PORT}/decide`);
}
