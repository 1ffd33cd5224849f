// End-to-end test of the web console: drives it in headless Chromium against a running
// `turnstone serve` with the demo configuration (the scripted model). Starts no server itself.
// Usage: node console.test.mjs http://127.0.0.1:PORT
// Env: CHROMIUM (default /usr/bin/chromium), SCREENSHOTS (default target/console-screenshots
// under the repository root). Exits non-zero, naming the failed step, on any failure.

import { mkdirSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const base = process.argv[2];
if (!base) {
  console.error("usage: node console.test.mjs http://127.0.0.1:PORT");
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
const shots = process.env.SCREENSHOTS || resolve(here, "../../../../target/console-screenshots");
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

async function run() {
  const context = await browser.newContext({ viewport: { width: 1200, height: 850 } });
  const page = await context.newPage();
  const pageErrors = [];
  page.on("pageerror", (err) => pageErrors.push(String(err)));
  // The console must work offline: any request off the host under test fails the run.
  const offHost = [];
  page.on("request", (req) => {
    if (!req.url().startsWith(base)) offHost.push(req.url());
  });

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
  await page.locator("#conversation .msg.assistant", { hasText: "You said: hello console" }).waitFor({ timeout: TIMEOUT });

  step = "send /long and watch the streamed reply";
  await page.fill("#composer-input", "/long");
  await page.keyboard.press("Control+Enter");
  await page
    .locator("#conversation .msg.assistant:not(.live)", { hasText: "Sentence 12 of a long answer" })
    .waitFor({ timeout: TIMEOUT });
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
  const call = page.locator("#conversation .msg.assistant details.call", { hasText: "confirm" });
  await call.locator("summary", { hasText: "pending" }).waitFor({ timeout: TIMEOUT });
  await page.locator(".notice", { hasText: "Client tool call confirm" }).waitFor({ timeout: TIMEOUT });
  await call.locator("summary").click();
  check((await call.locator("pre").first().textContent()).includes("Ship it?"), "the folded call does not show its arguments");
  await page.getByRole("button", { name: "Cancel turn" }).click();
  // Cancelling gives the unanswered call an error result, folded under the same message.
  await call.locator("summary", { hasText: "answered" }).waitFor({ timeout: TIMEOUT });
  await page.locator(".notice").first().waitFor({ state: "detached", timeout: TIMEOUT });
  check(await page.locator("#cancel-turn").isDisabled(), "Cancel turn is enabled with no active turn");
  await page.screenshot({ path: `${shots}/session-tool-call.png`, fullPage: true });

  step = "back to the list: the new session is there";
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

  step = "open the session's event log and search it";
  await row.getByRole("link", { name: id }).click();
  await page.getByRole("link", { name: "Event log" }).click();
  await page.waitForURL(`**/#/sessions/${id}/events`, { timeout: TIMEOUT });
  await page.locator("#events-body tr").first().waitFor({ timeout: TIMEOUT });
  const all = await page.locator("#events-body tr").count();
  await page.fill("#event-search", "message.recorded");
  const visible = page.locator("#events-body tr:not([hidden])");
  const recorded = await visible.count();
  // Two user messages and two replies at least, and fewer than the whole log.
  check(recorded >= 4 && recorded < all, `searching message.recorded shows ${recorded} of ${all} events`);
  for (const type of await visible.locator("td:nth-child(2)").allTextContents()) {
    check(/message.recorded/.test(type), `the search shows an event of type ${type}`);
  }
  await page.screenshot({ path: `${shots}/events.png`, fullPage: true });
  await page.fill("#event-search", "zzz-nothing-matches");
  check((await visible.count()) === 0, "a search matching nothing still shows events");

  check(pageErrors.length === 0, `errors on the page: ${pageErrors.join("; ")}`);
  check(offHost.length === 0, `requests off the host: ${offHost.join(", ")}`);
  await context.close();

  step = "the API key prompt on 401, kept in sessionStorage";
  // The host under test has no [auth]; a route answers 401 to requests without the key, as a
  // host with [auth] would, and lets the rest through.
  const authed = await browser.newContext();
  const authPage = await authed.newPage();
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
} finally {
  await browser.close();
}
