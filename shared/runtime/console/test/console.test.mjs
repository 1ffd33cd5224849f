// End-to-end test of the web console: drives it in headless Chromium against a running
// `turnstone serve` with the demo configuration (the scripted model). Starts no server itself.
// Usage: node console.test.mjs http://127.0.0.1:PORT
// Env: CHROMIUM (default /usr/bin/chromium), SCREENSHOTS (default target/console-screenshots
// under the repository root), TURNSTONE_BIN (default target/debug/turnstone, or under
// CARGO_TARGET_DIR). Exits non-zero, naming the failed step, on any failure.
//
// The demo agent never raises an interrupt (only a worker's `interrupt` action does), so for
// the interrupt form the test starts a second host of its own: TURNSTONE_BIN with an agent
// `gate` on the scripted model whose worker is a small webhook in this file (it answers a
// message starting with `/interrupt` with an interrupt, and the resume with a reply naming the
// payload, and accepts the engine's proposal otherwise). Both are stopped at the end.

import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const base = process.argv[2];
if (!base) {
  console.error("usage: node console.test.mjs http://127.0.0.1:PORT");
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../../../..");
const shots = process.env.SCREENSHOTS || resolve(repo, "target/console-screenshots");
mkdirSync(shots, { recursive: true });

const TIMEOUT = 15_000;
let step = "launch";
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-background-networking"],
});

/** Fails the run with `message` unless `cond`. */
function check(cond, message) {
  if (!cond) throw new Error(message);
}

/** The webhook of the `gate` agent: interrupts on `/interrupt …`, replies to the resume. */
function startWorker() {
  const text = (m) => (typeof m.content === "string" ? m.content : (m.content || []).map((p) => p.text || "").join("\n"));
  const decide = (req) => {
    const t = req.trigger;
    if (t.type === "client.messages") {
      const last = t.messages[t.messages.length - 1];
      if (last && last.role === "user" && text(last).startsWith("/interrupt")) {
        const reason = text(last).slice("/interrupt".length).trim() || "A person must decide";
        return { ...req.proposed, actions: [{ type: "interrupt", reason, payload: { question: "Which colour?", options: ["green", "blue"] } }] };
      }
    }
    if (t.type === "interrupt.resumed") {
      return {
        messages: [...req.messages, { role: "assistant", content: `Resumed with ${JSON.stringify(t.payload ?? null)}` }],
        actions: [{ type: "done", data: t.payload ?? null }],
      };
    }
    return req.proposed;
  };
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      let answer;
      try {
        answer = JSON.stringify(decide(JSON.parse(body)));
      } catch (err) {
        res.writeHead(500).end(String(err));
        return;
      }
      res.writeHead(200, { "Content-Type": "application/json" }).end(answer);
    });
  });
  return new Promise((ok) => server.listen(0, "127.0.0.1", () => ok(server)));
}

function freePort() {
  return new Promise((ok) => {
    const probe = createServer();
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => ok(port));
    });
  });
}

/** A second `turnstone serve` whose agent `gate` has the worker above. */
async function startGateHost(workerPort) {
  const candidates = [
    process.env.TURNSTONE_BIN,
    process.env.CARGO_TARGET_DIR && join(process.env.CARGO_TARGET_DIR, "debug/turnstone"),
    resolve(repo, "target/debug/turnstone"),
  ].filter(Boolean);
  const bin = candidates.find((c) => existsSync(c));
  check(bin, `no turnstone binary for the interrupt host (tried ${candidates.join(", ")}; set TURNSTONE_BIN)`);
  const dir = mkdtempSync(join(tmpdir(), "console-gate-"));
  writeFileSync(
    join(dir, "gate.toml"),
    ["[llm.scripted]", 'type = "scripted"', "", "[agent.gate]", 'model = "scripted"', 'llm = "scripted"', "stream = true", `worker = "http://127.0.0.1:${workerPort}/decide"`, ""].join("\n"),
  );
  const port = await freePort();
  const child = spawn(bin, ["serve", "--config", join(dir, "gate.toml"), "--addr", `127.0.0.1:${port}`, "--data-dir", join(dir, "data")], { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  child.stderr.on("data", (c) => (log += c));
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 300; i++) {
    if (child.exitCode !== null) throw new Error(`the interrupt host exited: ${log}`);
    try {
      if ((await fetch(`${url}/healthz`)).ok) return { url, child };
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill();
  throw new Error(`the interrupt host did not answer: ${log}`);
}

const stops = [];
let current = null; // the page in use, for a screenshot of a failure

async function run() {
  const context = await browser.newContext({ viewport: { width: 1200, height: 850 } });
  const page = await context.newPage();
  current = page;
  const pageErrors = [];
  page.on("pageerror", (err) => pageErrors.push(String(err)));
  // The console must work offline: any request off the host under test fails the run.
  const offHost = [];
  page.on("request", (req) => {
    if (!req.url().startsWith(base)) offHost.push(req.url());
  });
  const conversation = page.locator("#conversation");
  const assistant = (text) => page.locator("#conversation .msg.assistant:not(.live)", { hasText: text }).last();

  step = "open the list";
  await page.goto(`${base}/`);
  await page.getByRole("heading", { name: "Sessions" }).waitFor({ timeout: TIMEOUT });

  step = "start a session from the new-session form";
  const id = `console-e2e-${Date.now().toString(36)}`;
  await page.fill("#new-session-id", id);
  await page.fill("#new-session-agent", "demo");
  await page.fill("#new-session-message", "hello console");
  await page.getByRole("button", { name: "Start session" }).click();
  await page.waitForURL(`**/#/sessions/${id}`, { timeout: TIMEOUT });
  await assistant("You said: hello console").waitFor({ timeout: TIMEOUT });

  step = "send /long and watch the streamed reply";
  // Deltas are not kept: send only once the view's stream is followed (the scripted model
  // streams its whole answer at once, so it could finish before a late stream connects).
  await page.locator('body[data-stream="open"]').waitFor({ state: "attached", timeout: TIMEOUT });
  await page.fill("#composer-input", "/long");
  await page.keyboard.press("Control+Enter");
  await assistant("Sentence 12 of a long answer").waitFor({ timeout: TIMEOUT });
  // The reply came through the SSE stream's token deltas, not only the final reread.
  const deltas = Number(await page.evaluate(() => document.body.dataset.deltas || "0"));
  check(deltas > 0, "no llm.token.delta frame reached the session view while /long streamed");
  check((await page.locator("#composer-input").inputValue()) === "", "the composer was not cleared after sending");
  await page.screenshot({ path: `${shots}/session.png`, fullPage: true });
  await page.emulateMedia({ colorScheme: "dark" });
  await page.screenshot({ path: `${shots}/session-dark.png`, fullPage: true });
  await page.emulateMedia({ colorScheme: "light" });

  step = "a client tool call: folded under its message, shown as pending, ended by Cancel";
  await page.fill("#composer-input", '/tool confirm {"question": "Ship it?"}');
  await page.getByRole("button", { name: "Send" }).click();
  let call = page.locator("#conversation .msg.assistant details.call", { hasText: "confirm" }).last();
  await call.locator("summary", { hasText: "pending" }).waitFor({ timeout: TIMEOUT });
  await page.locator("#pending form.client-call", { hasText: "confirm" }).waitFor({ timeout: TIMEOUT });
  await call.locator("summary").click();
  check((await call.locator("pre").first().textContent()).includes("Ship it?"), "the folded call does not show its arguments");
  await page.getByRole("button", { name: "Cancel turn" }).click();
  // Cancelling gives the unanswered call an error result, folded under the same message.
  await call.locator("summary", { hasText: "answered" }).waitFor({ timeout: TIMEOUT });
  await page.locator("#pending form").first().waitFor({ state: "detached", timeout: TIMEOUT });
  check(await page.locator("#cancel-turn").isDisabled(), "Cancel turn is enabled with no active turn");
  await page.screenshot({ path: `${shots}/session-tool-call.png`, fullPage: true });

  step = "answer a client tool call with the form: its result folded, the turn completes";
  await page.fill("#composer-input", '/tool confirm {"question": "Deploy on Friday?"}');
  await page.getByRole("button", { name: "Send" }).click();
  const confirmForm = page.locator("#pending form.client-call", { hasText: "confirm" });
  await confirmForm.waitFor({ timeout: TIMEOUT });
  check((await confirmForm.locator("pre").textContent()).includes("Deploy on Friday?"), "the form does not show the call's arguments");
  await confirmForm.getByLabel("Result (or the error's text)").fill("yes, go ahead");
  await page.screenshot({ path: `${shots}/form-client-call.png`, fullPage: true });
  await confirmForm.getByRole("button", { name: "Send result" }).click();
  await assistant("confirm returned: yes, go ahead").waitFor({ timeout: TIMEOUT });
  call = page.locator("#conversation details.call", { hasText: "confirm" }).last();
  await call.locator("summary", { hasText: "answered" }).waitFor({ timeout: TIMEOUT });
  await call.locator("summary").click();
  check((await call.locator("pre").last().textContent()).includes("yes, go ahead"), "the answered call does not show the result under it");
  await confirmForm.waitFor({ state: "detached", timeout: TIMEOUT });
  await page.locator("#session-status", { hasText: "idle" }).waitFor({ timeout: TIMEOUT });
  const answeredTurn = await page.locator(".turn-bar").last().getAttribute("data-turn");
  await page.locator(`.turn-bar[data-turn="${answeredTurn}"] .status`, { hasText: "completed" }).waitFor({ timeout: TIMEOUT });

  step = "deny a deploy with the approval form";
  await page.fill("#composer-input", '/tool deploy {"env": "prod"}');
  await page.getByRole("button", { name: "Send" }).click();
  let approval = page.locator("#pending form.approval", { hasText: "deploy" });
  await approval.waitFor({ timeout: TIMEOUT });
  await approval.getByLabel(/Reason/).fill("not on a Friday");
  await page.screenshot({ path: `${shots}/form-approval.png`, fullPage: true });
  await approval.getByRole("button", { name: "Deny" }).click();
  await assistant("deploy returned: the user denied this call of deploy").filter({ hasText: "not on a Friday" }).waitFor({ timeout: TIMEOUT });
  await approval.waitFor({ state: "detached", timeout: TIMEOUT });

  step = "approve a deploy: it becomes a client call, answered with the form";
  await page.fill("#composer-input", '/tool deploy {"env": "staging"}');
  await page.getByRole("button", { name: "Send" }).click();
  approval = page.locator("#pending form.approval", { hasText: "deploy" });
  await approval.waitFor({ timeout: TIMEOUT });
  // By keyboard: Enter in the reason field does not approve; the Approve button with Enter does.
  await approval.getByLabel(/Reason/).focus();
  await page.keyboard.press("Enter");
  await page.waitForTimeout(300);
  check((await approval.count()) === 1, "Enter in the reason field submitted the approval form");
  await page.keyboard.press("Tab");
  await page.keyboard.press("Enter");
  const deployCall = page.locator("#pending form.client-call", { hasText: "deploy" });
  await deployCall.waitFor({ timeout: TIMEOUT });
  await deployCall.getByLabel("Result (or the error's text)").fill("deployed to staging");
  await deployCall.getByRole("button", { name: "Send result" }).click();
  await assistant("deploy returned: deployed to staging").waitFor({ timeout: TIMEOUT });

  step = "approve a call of the demo's MCP server: the form names the server, the engine runs it";
  await page.fill("#composer-input", '/tool notes__add_note {"text": "from the console"}');
  await page.getByRole("button", { name: "Send" }).click();
  approval = page.locator("#pending form.approval", { hasText: "notes__add_note" });
  await approval.waitFor({ timeout: TIMEOUT });
  check((await approval.locator("h3").textContent()).includes("of MCP server notes"), "the approval form does not name the MCP server");
  await approval.getByRole("button", { name: "Approve" }).click();
  await assistant("notes__add_note returned: noted").waitFor({ timeout: TIMEOUT });
  await approval.waitFor({ state: "detached", timeout: TIMEOUT });

  step = "a sub-agent call links to the child session, which links back";
  await page.fill("#composer-input", "/agent researcher find the answer");
  await page.getByRole("button", { name: "Send" }).click();
  const childLink = page.locator("#conversation .subagent a");
  await childLink.last().waitFor({ timeout: TIMEOUT });
  await assistant("researcher returned").waitFor({ timeout: TIMEOUT });
  const child = await childLink.last().getAttribute("data-child");
  await childLink.last().click();
  await page.waitForURL(`**/#/sessions/${child}`, { timeout: TIMEOUT });
  await assistant("You said: find the answer").waitFor({ timeout: TIMEOUT });
  await page.locator("#parent-session a", { hasText: id }).click();
  await page.waitForURL(`**/#/sessions/${id}`, { timeout: TIMEOUT });
  await assistant("researcher returned").waitFor({ timeout: TIMEOUT });

  step = "a turn's timeline: bars with durations for its model and tool calls, usage and cost";
  await page.locator(`.turn-bar[data-turn="${answeredTurn}"]`).getByRole("link", { name: "Timeline" }).click();
  await page.waitForURL(`**/#/sessions/${id}/turns/${answeredTurn}`, { timeout: TIMEOUT });
  await page.locator("#timeline").waitFor({ timeout: TIMEOUT });
  const llmRows = page.locator("#timeline tr.kind-llm");
  const toolRows = page.locator("#timeline tr.kind-tool", { hasText: "tool confirm" });
  check((await llmRows.count()) >= 2, `the timeline shows ${await llmRows.count()} model calls, not 2`);
  check((await toolRows.count()) === 1, `the timeline shows ${await toolRows.count()} confirm calls, not 1`);
  for (const r of [...(await llmRows.all()), ...(await toolRows.all())]) {
    check((await r.locator(".track .seg").count()) >= 1, "a call's row has no bar");
    const d = await r.locator(".tl-duration").textContent();
    check(/\d+(\.\d+)? (ms|s)/.test(d), `a call's row shows no duration: "${d}"`);
    check((await r.locator(".tl-status").textContent()).includes("✓ completed"), "a completed call is not marked completed");
  }
  const tokens = await page.locator("#turn-tokens").textContent();
  check(/\d+ prompt tokens/.test(tokens) && /\d+ completion tokens/.test(tokens), `the turn's tokens read "${tokens}"`);
  check((await page.locator("#turn-cost").textContent()).startsWith("$"), "the turn's cost is missing");
  await page.screenshot({ path: `${shots}/timeline.png`, fullPage: true });
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: `${shots}/timeline-viewport.png` });

  step = "a failing model call's retries on the timeline";
  await page.getByRole("link", { name: "← Session" }).click();
  await page.fill("#composer-input", "/fail");
  await page.getByRole("button", { name: "Send" }).click();
  const failedBar = page.locator(".turn-bar", { has: page.locator(".status", { hasText: "failed" }) }).last();
  await failedBar.waitFor({ timeout: 30_000 });
  await failedBar.getByRole("link", { name: "Timeline" }).click();
  await page.locator("#timeline").waitFor({ timeout: TIMEOUT });
  const failedLlm = page.locator("#timeline tr.kind-llm").first();
  check((await failedLlm.locator(".seg-retry").count()) >= 1, "a retried attempt is not marked on the timeline");
  check((await failedLlm.locator(".marker.retry-at").count()) >= 1, "the retry's scheduled time is not marked");
  check((await failedLlm.locator(".seg-backoff").count()) >= 1, "the backoff before a retry is not shown");
  const failedText = await failedLlm.locator(".tl-status").textContent();
  check(/↻ \d+ retr/.test(failedText) && failedText.includes("✕ failed"), `the failed call's status reads "${failedText}"`);
  check((await page.locator("#timeline tr.kind-turn .tl-status").textContent()).includes("failed"), "the turn is not marked failed");
  await page.screenshot({ path: `${shots}/timeline-retries.png`, fullPage: true });

  step = "back to the list: the new session is there";
  await page.getByRole("link", { name: "← Session" }).click();
  await page.getByRole("link", { name: "← Sessions" }).click();
  const row = page.locator(`#sessions-body tr[data-session="${id}"]`);
  await row.waitFor({ timeout: TIMEOUT });
  check((await row.textContent()).includes("demo"), "the session's row does not name its agent");
  await page.screenshot({ path: `${shots}/sessions.png`, fullPage: true });

  step = "filter the list by agent";
  await page.fill("#filter-agent", "no-such-agent");
  await page.getByRole("button", { name: "Filter" }).click();
  await row.waitFor({ state: "detached", timeout: TIMEOUT });
  await page.fill("#filter-agent", "demo");
  await page.getByRole("button", { name: "Filter" }).click();
  await row.waitFor({ timeout: TIMEOUT });

  step = "open the session's event log: the newest page, older pages on demand";
  await row.getByRole("link", { name: id }).click();
  await page.getByRole("link", { name: "Event log" }).click();
  await page.waitForURL(`**/#/sessions/${id}/events`, { timeout: TIMEOUT });
  await page.locator("#events-body tr").first().waitFor({ timeout: TIMEOUT });
  await page.selectOption("#event-page-size", "20");
  await page.locator("#events-body tr").first().waitFor({ timeout: TIMEOUT });
  await page.waitForFunction(() => document.querySelectorAll("#events-body tr").length === 20, null, { timeout: TIMEOUT });
  const seqs = async () => (await page.locator("#events-body tr").evaluateAll((rows) => rows.map((r) => Number(r.dataset.seq))));
  const firstPage = await seqs();
  const lastSeq = firstPage[firstPage.length - 1];
  check(firstPage[0] === lastSeq - 19, `the first page runs ${firstPage[0]}..${lastSeq}, not the newest 20`);
  await page.locator("#event-older").click();
  await page.waitForFunction(() => document.querySelectorAll("#events-body tr").length === 40, null, { timeout: TIMEOUT });
  const twoPages = await seqs();
  check(twoPages[0] === lastSeq - 39 && twoPages.every((s, i) => i === 0 || s === twoPages[i - 1] + 1), "the older page is not the 20 events before the first");

  step = "the event log follows live while paged";
  const sent = await fetch(`${base}/v1/sessions/${id}/inputs`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ type: "client.message", agent_id: "demo", message: { role: "user", content: "live while paging" } }),
  });
  check(sent.ok, `sending a message answered ${sent.status}`);
  await page.locator("#events-body tr", { hasText: "live while paging" }).first().waitFor({ timeout: TIMEOUT });
  const grown = await seqs();
  check(grown[0] === lastSeq - 39 && grown[grown.length - 1] > lastSeq, "live events did not append after the paged ones");

  step = "search the event log";
  await page.selectOption("#event-page-size", "500");
  await page.waitForFunction(() => document.querySelectorAll("#events-body tr").length > 40, null, { timeout: TIMEOUT });
  const all = await page.locator("#events-body tr").count();
  await page.fill("#event-search", "message.recorded");
  const visible = page.locator("#events-body tr:not([hidden])");
  const recorded = await visible.count();
  // Two user messages and two replies at least, and fewer than the whole log.
  check(recorded >= 4 && recorded < all, `searching message.recorded shows ${recorded} of ${all} events`);
  for (const type of await visible.locator("td:nth-child(2)").allTextContents()) {
    check(/message.recorded/.test(type), `the search shows an event of type ${type}`);
  }
  await page.screenshot({ path: `${shots}/events.png` });
  await page.fill("#event-search", "zzz-nothing-matches");
  check((await visible.count()) === 0, "a search matching nothing still shows events");

  step = "edit a message: a new branch, with a switcher between the two";
  const b = `console-branches-${Date.now().toString(36)}`;
  await page.goto(`${base}/#/sessions`);
  await page.fill("#new-session-id", b);
  await page.fill("#new-session-agent", "demo");
  await page.fill("#new-session-message", "first question");
  await page.getByRole("button", { name: "Start session" }).click();
  await page.waitForURL(`**/#/sessions/${b}`, { timeout: TIMEOUT });
  await assistant("You said: first question").waitFor({ timeout: TIMEOUT });
  await page.fill("#composer-input", "second question");
  await page.getByRole("button", { name: "Send" }).click();
  await assistant("You said: second question").waitFor({ timeout: TIMEOUT });
  await page.locator("#session-status", { hasText: "idle" }).waitFor({ timeout: TIMEOUT });
  const second = page.locator("#conversation .msg.user", { hasText: "second question" });
  await second.getByRole("button", { name: "Edit" }).click();
  await page.getByLabel("Edited message").fill("second question, edited");
  await page.getByRole("button", { name: "Save as a new branch" }).click();
  await assistant("You said: second question, edited").waitFor({ timeout: TIMEOUT });
  const editedMsg = page.locator("#conversation .msg.user", { hasText: "second question, edited" });
  await editedMsg.locator(".branch-pos", { hasText: "branch 2 of 2" }).waitFor({ timeout: TIMEOUT });
  check((await conversation.textContent()).includes("first question"), "the edited branch lost the message before the edit");

  step = "switch to the other branch (read-only) and continue it";
  await editedMsg.getByRole("link", { name: "Previous branch" }).click();
  await page.waitForURL(`**/#/sessions/${b}/branch/**`, { timeout: TIMEOUT });
  await page.locator("#branch-banner").waitFor({ timeout: TIMEOUT });
  await assistant("You said: second question").first().waitFor({ timeout: TIMEOUT });
  check(!(await conversation.textContent()).includes("edited"), "the other branch still shows the edited message");
  await page.screenshot({ path: `${shots}/branch.png`, fullPage: true });
  await page.fill("#composer-input", "third, on the first branch");
  await page.getByRole("button", { name: "Continue this branch" }).click();
  await page.waitForURL(`**/#/sessions/${b}`, { timeout: TIMEOUT });
  await assistant("You said: third, on the first branch").waitFor({ timeout: TIMEOUT });
  const continued = await conversation.textContent();
  check(continued.includes("You said: second question") && !continued.includes("edited"), "the continued branch is not the first one");
  check((await page.locator("#branch-banner").count()) === 0, "the continued branch is not the active one");
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: `${shots}/session-branches.png` });

  step = "the message tree: both branches, switching between them";
  await page.getByRole("link", { name: "Message tree" }).click();
  await page.waitForURL(`**/#/sessions/${b}/tree`, { timeout: TIMEOUT });
  const treeNodes = page.locator("#tree .tree-node");
  await treeNodes.first().waitFor({ timeout: TIMEOUT });
  check((await page.locator("#tree .tree-branch").count()) === 2, "the tree does not show two branches");
  check((await page.locator("#tree .tree-node.on-active").count()) === 6, "the active branch is not the six messages of the continued one");
  await page.screenshot({ path: `${shots}/tree.png`, fullPage: true });
  await page.locator("#tree a.tree-link", { hasText: "You said: second question, edited" }).click();
  await page.locator("#branch-banner").waitFor({ timeout: TIMEOUT });
  await assistant("You said: second question, edited").waitFor({ timeout: TIMEOUT });
  check(!(await conversation.textContent()).includes("third, on the first branch"), "the edited branch shows the other's message");
  await page.getByRole("link", { name: "Message tree" }).click();
  await page.locator("#tree a.tree-link", { hasText: "You said: third, on the first branch" }).click();
  await assistant("You said: third, on the first branch").waitFor({ timeout: TIMEOUT });
  check((await page.locator("#branch-banner").count()) === 0, "the active branch is shown as another branch");

  step = "fork a completed turn, follow the link back";
  const firstTurn = page.locator(".turn-bar").first();
  await firstTurn.getByRole("button", { name: "Fork" }).click();
  await page.waitForURL((u) => /#\/sessions\/fork-/.test(u.hash), { timeout: TIMEOUT });
  const forkId = decodeURIComponent(page.url().split("#/sessions/")[1]);
  await page.locator("#forked-from a", { hasText: b }).waitFor({ timeout: TIMEOUT });
  await assistant("You said: first question").waitFor({ timeout: TIMEOUT });
  check(!(await conversation.textContent()).includes("second question"), "the fork holds messages after its turn");
  await page.fill("#composer-input", "only in the fork");
  await page.getByRole("button", { name: "Send" }).click();
  await assistant("You said: only in the fork").waitFor({ timeout: TIMEOUT });
  await page.screenshot({ path: `${shots}/fork.png`, fullPage: true });
  await page.locator("#forked-from a", { hasText: b }).click();
  await page.waitForURL(`**/#/sessions/${b}`, { timeout: TIMEOUT });
  await assistant("You said: third, on the first branch").waitFor({ timeout: TIMEOUT });
  check(!(await conversation.textContent()).includes("only in the fork"), "the source shows the fork's message");
  await page.locator(".turn-bar").first().getByRole("link", { name: forkId }).waitFor({ timeout: TIMEOUT });

  check(pageErrors.length === 0, `errors on the page: ${pageErrors.join("; ")}`);
  check(offHost.length === 0, `requests off the host: ${offHost.join(", ")}`);
  await context.close();

  step = "resume an interrupt with the form (a second host, its agent on a worker)";
  const worker = await startWorker();
  stops.push(() => worker.close());
  const gate = await startGateHost(worker.address().port);
  stops.push(() => gate.child.kill());
  const gateContext = await browser.newContext({ viewport: { width: 1200, height: 850 } });
  const gatePage = await gateContext.newPage();
  current = gatePage;
  const gateOff = [];
  gatePage.on("request", (req) => !req.url().startsWith(gate.url) && gateOff.push(req.url()));
  gatePage.on("pageerror", (err) => pageErrors.push(String(err)));
  const g = `console-interrupt-${Date.now().toString(36)}`;
  await gatePage.goto(`${gate.url}/`);
  await gatePage.fill("#new-session-id", g);
  await gatePage.fill("#new-session-agent", "gate");
  await gatePage.fill("#new-session-message", "/interrupt Pick a colour before I go on");
  await gatePage.getByRole("button", { name: "Start session" }).click();
  const interrupt = gatePage.locator("#pending form.interrupt", { hasText: "Pick a colour before I go on" });
  await interrupt.waitFor({ timeout: TIMEOUT });
  check((await interrupt.locator("pre").textContent()).includes("Which colour?"), "the interrupt's payload is not shown");
  await gatePage.locator("#session-status", { hasText: "waiting" }).waitFor({ timeout: TIMEOUT });
  await interrupt.getByLabel(/Answer/).fill('{"colour": "green"}');
  await gatePage.screenshot({ path: `${shots}/form-interrupt.png`, fullPage: true });
  await interrupt.getByRole("button", { name: "Resume" }).click();
  await gatePage.locator("#conversation .msg.assistant", { hasText: 'Resumed with {"colour":"green"}' }).waitFor({ timeout: TIMEOUT });
  await interrupt.waitFor({ state: "detached", timeout: TIMEOUT });
  await gatePage.locator("#session-status", { hasText: "idle" }).waitFor({ timeout: TIMEOUT });

  step = "a worker's decisions on the timeline";
  await gatePage.locator(".turn-bar").last().getByRole("link", { name: "Timeline" }).click();
  await gatePage.locator("#timeline").waitFor({ timeout: TIMEOUT });
  const decisions = gatePage.locator("#timeline tr.kind-decision");
  check((await decisions.count()) >= 2, "the worker's decisions are not on the timeline");
  check((await decisions.filter({ hasText: "interrupt.resumed" }).locator(".seg").count()) >= 1, "the resume's decision has no bar");
  check(gateOff.length === 0, `requests off the host: ${gateOff.join(", ")}`);
  check(pageErrors.length === 0, `errors on the page: ${pageErrors.join("; ")}`);
  await gateContext.close();

  step = "a session view stays live when its event stream cannot flow (as behind API Gateway)";
  // API Gateway buffers a Lambda's answer, so on AWS the stream route never streams: the view
  // must still show what happens, from its summary poll.
  const buffered = await browser.newContext();
  const bufferedPage = await buffered.newPage();
  current = bufferedPage;
  await bufferedPage.route("**/events/stream*", (r) => r.fulfill({ status: 504, contentType: "application/json", body: '{"message":"Service Unavailable"}' }));
  await bufferedPage.goto(`${base}/#/sessions/${id}`);
  await bufferedPage.locator("#conversation .msg.assistant").first().waitFor({ timeout: TIMEOUT });
  const polled = await fetch(`${base}/v1/sessions/${id}/inputs`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ type: "client.message", agent_id: "demo", message: { role: "user", content: "sent while the stream is down" } }),
  });
  check(polled.status === 202, `the input answered ${polled.status}`);
  await bufferedPage.locator("#conversation .msg.assistant", { hasText: "You said: sent while the stream is down" }).waitFor({ timeout: TIMEOUT });
  await buffered.close();

  step = "a compaction marker: folded apart from the messages, its summary on expand, echoed back in a view";
  // The demo's scripted model names no context window, so the demo host never compacts: this
  // page is served a real session's messages with two markers put where the engine records them
  // (at the head before a turn's model call: between the turn's message and its reply, with the
  // `compaction` that `GET .../messages` carries), and their `context_compacted` events in place
  // of two events the session view does not read. The rest is the host's.
  const cs = `console-compaction-${Date.now().toString(36)}`;
  for (const said of ["compact one", "compact two", "compact three"]) {
    const res = await fetch(`${base}/v1/sessions/${cs}/inputs`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ type: "client.message", agent_id: "demo", message: { role: "user", content: said } }),
    });
    check(res.status === 202, `sending "${said}" answered ${res.status}`);
    const { turn_id: turnId } = await res.json();
    let status = "";
    for (let i = 0; i < 30 && status !== "completed"; i++) {
      const t = await (await fetch(`${base}/v1/sessions/${cs}/turns/${turnId}?wait=1`)).json();
      status = (t.turn || t).status;
    }
    check(status === "completed", `the turn of "${said}" is ${status}`);
  }
  const SUMMARY = "The user said three things; each was said back.";
  const MARKERS = { summary: "msg_console_summary", cleared_tool_results: "msg_console_cleared" };
  const contentText = (m) => (typeof m.content === "string" ? m.content : (m.content || []).map((p) => p.text || "").join("\n"));
  const marked = await browser.newContext();
  const markedPage = await marked.newPage();
  current = markedPage;
  markedPage.on("pageerror", (err) => pageErrors.push(String(err)));
  await markedPage.route(
    (u) => u.pathname === `/v1/sessions/${cs}/messages` && u.searchParams.get("tree") === "1",
    async (r) => {
      const response = await r.fetch();
      const tree = await response.json();
      const byText = (t) => tree.nodes.find((n) => contentText(n.message) === t);
      // A marker under user message `under` (recorded before its turn's model call): the
      // reply now hangs under the marker.
      const mark = (under, kind, through, content) => {
        const parent = byText(under);
        if (!parent || !through) return;
        for (const n of tree.nodes) if (n.parent_id === parent.message.id) n.parent_id = MARKERS[kind];
        const marker = { id: MARKERS[kind], role: "system", content, compaction: { kind, through: through.message.id } };
        tree.nodes.splice(tree.nodes.indexOf(parent) + 1, 0, { message: marker, parent_id: parent.message.id });
      };
      mark("compact two", "summary", byText("You said: compact one"), SUMMARY);
      mark("compact three", "cleared_tool_results", byText("You said: compact two"), "[tool results are sent to the model as stubs]");
      await r.fulfill({ response, json: tree });
    },
  );
  await markedPage.route(
    (u) => u.pathname === `/v1/sessions/${cs}/events`,
    async (r) => {
      const response = await r.fetch();
      const page = await response.json();
      const viewed = ["session_created", "turn_started", "turn_activated", "turn_ended", "message_recorded", "call_created", "forked"];
      const spare = page.events.filter(({ event }) => !viewed.includes(event.type));
      Object.entries(MARKERS).forEach(([kind, markerId], i) => {
        if (!spare[i]) return;
        spare[i].event = {
          type: "context_compacted", call_id: "llm_console", attempt: 1, marker_id: markerId, kind, through: "msg_console",
          tokens_before: 12345, tokens_after: 2345, reason: i ? "refused" : "threshold", at: Date.now(),
        };
      });
      await r.fulfill({ response, json: page });
    },
  );
  const sentViews = [];
  await markedPage.route(`**/v1/sessions/${cs}/inputs*`, (r) => {
    sentViews.push(r.request().postDataJSON());
    return r.continue();
  });
  await markedPage.goto(`${base}/#/sessions/${cs}`);
  const summaryMarker = markedPage.locator(`#conversation .msg.compaction[data-compaction="summary"]`);
  const clearedMarker = markedPage.locator(`#conversation .msg.compaction[data-compaction="cleared_tool_results"]`);
  await summaryMarker.waitFor({ timeout: TIMEOUT });
  check((await markedPage.locator("#conversation .msg.system").count()) === 0, "a marker is shown as a system message");
  const read = await markedPage.locator("#conversation article").evaluateAll((els) =>
    els.map((e) => (e.classList.contains("compaction") ? `marker ${e.dataset.compaction}` : e.querySelector(".text").textContent)),
  );
  const expected = ["compact one", "You said: compact one", "compact two", "marker summary", "You said: compact two", "compact three", "marker cleared_tool_results", "You said: compact three"];
  check(JSON.stringify(read) === JSON.stringify(expected), `the conversation reads ${JSON.stringify(read)}`);
  check((await markedPage.locator(".turn-bar").count()) === 3, "a marker split its turn: not one bar per turn");
  const heading = await summaryMarker.locator("summary").textContent();
  check(heading.includes("Context compacted — summary") && heading.includes("about 12,345 → 2,345 tokens"), `the summary's marker reads "${heading}"`);
  const summaryText = summaryMarker.locator(".text");
  check(!(await summaryText.isVisible()), "the summary shows before the marker is expanded");
  await markedPage.screenshot({ path: `${shots}/session-compaction.png`, fullPage: true });
  await summaryMarker.locator("summary").click();
  await summaryText.waitFor({ state: "visible", timeout: TIMEOUT });
  check((await summaryText.textContent()) === SUMMARY, `the expanded marker shows "${await summaryText.textContent()}"`);
  check((await summaryMarker.textContent()).includes("You said: compact one"), "the marker does not say what it covers");
  const clearedHeading = await clearedMarker.locator("summary").textContent();
  check(clearedHeading.includes("Tool results cleared from the model's view"), `the clearing's marker reads "${clearedHeading}"`);
  check(!(await clearedMarker.locator("details").evaluate((d) => d.open)), "the clearing's marker is not folded");
  check(!(await clearedMarker.textContent()).includes("[tool results"), "the clearing shows the marker's own sentence");
  await markedPage.screenshot({ path: `${shots}/session-compaction-open.png`, fullPage: true });

  step = "an edit after a compaction sends the marker back with the view, so the branch goes through it";
  await markedPage.locator("#conversation .msg.user", { hasText: "compact three" }).getByRole("button", { name: "Edit" }).click();
  await markedPage.getByLabel("Edited message").fill("compact three, edited");
  await markedPage.getByRole("button", { name: "Save as a new branch" }).click();
  await markedPage.locator("#conversation .msg.assistant", { hasText: "You said: compact three, edited" }).waitFor({ timeout: TIMEOUT });
  check(sentViews.length === 1 && sentViews[0].type === "client.messages", `the edit sent ${JSON.stringify(sentViews)}`);
  const view = sentViews[0].messages.map((m) => (m.role === "system" ? `${m.role} ${m.id}` : m.role));
  const throughMarker = ["user", "assistant", "user", `system ${MARKERS.summary}`, "assistant", "user"];
  check(JSON.stringify(view) === JSON.stringify(throughMarker), `the edit's view is ${JSON.stringify(view)}`);
  // The summary stays expanded across the refreshes the edit made.
  check(await summaryMarker.locator("details").evaluate((d) => d.open), "a refresh folded the expanded marker again");
  check(pageErrors.length === 0, `errors on the page: ${pageErrors.join("; ")}`);
  await marked.close();

  step = "the API key prompt on 401, kept in sessionStorage";
  // The host under test has no [auth]; a route answers 401 to requests without the key, as a
  // host with [auth] would, and lets the rest through.
  const authed = await browser.newContext();
  const authPage = await authed.newPage();
  current = authPage;
  const seen = [];
  await authPage.route("**/v1/**", (r) => {
    const auth = r.request().headers().authorization;
    seen.push(auth || "");
    if (auth === "Bearer test-key") return r.continue();
    return r.fulfill({ status: 401, contentType: "application/json", body: '{"error":{"code":"unauthorized","message":"a key is needed"}}' });
  });
  await authPage.goto(`${base}/`);
  await authPage.locator("#key-dialog[open]").waitFor({ timeout: TIMEOUT });
  await authPage.fill("#key-input", "test-key");
  await authPage.getByRole("button", { name: "Use key" }).click();
  await authPage.locator(`#sessions-body tr[data-session="${id}"]`).waitFor({ timeout: TIMEOUT });
  const kept = await authPage.evaluate(() => sessionStorage.getItem("turnstone.apiKey"));
  check(kept === "test-key", `sessionStorage holds ${kept}, not the key`);
  check(seen.includes("Bearer test-key"), "no request carried the key");
  await authed.close();
}

try {
  await run();
  console.log(`console e2e: ok (screenshots in ${shots})`);
} catch (err) {
  console.error(`console e2e FAILED at "${step}": ${err.message}`);
  process.exitCode = 1;
  if (current && !current.isClosed()) await current.screenshot({ path: `${shots}/failure.png`, fullPage: true }).catch(() => {});
} finally {
  await browser.close();
  for (const stop of stops) stop();
}
