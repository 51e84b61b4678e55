// The sup web console in Debian's Chromium, driven by playwright-core. Run by tests/all/web.rs
// (`cargo test --test all web::browser_end_to_end`), which starts `sup daemon --serve`, the runs,
// and passes one JSON argument: base, shots, grow, yes, no (run ids), goal, reason, name.
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const cfg = JSON.parse(process.argv[2]);
const profile = mkdtempSync(join(tmpdir(), "sup-e2e-"));
const ctx = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
  viewport: { width: 1280, height: 860 },
});
const page = ctx.pages()[0] ?? (await ctx.newPage());
// Generous: CI runs this beside the whole suite on two cores; a real fault still fails.
page.setDefaultTimeout(60000);
const shot = (name) => page.screenshot({ path: join(cfg.shots, `${name}.png`), fullPage: true });
const t0 = Date.now();
const step = (what) => console.log(`· ${((Date.now() - t0) / 1000).toFixed(1)}s ${what}`);
// Nothing is loaded from another site.
const foreign = [];
page.on("request", (r) => { if (!r.url().startsWith(cfg.base)) foreign.push(r.url()); });

async function main() {
  step("sign in");
  await page.goto(`${cfg.base}/signin?next=/runs`);
  await page.fill("input[name=name]", cfg.name);
  await shot("signin");
  await page.click("button[type=submit]");
  await page.waitForURL(/\/runs$/);
  await page.getByText(`signed in as ${cfg.name}`).waitFor();

  step("the runs page");
  await page.locator(`a[href="/runs/${cfg.grow}"]`).waitFor();
  const rows = await page.locator("table.runs tbody tr").count();
  if (rows < 3) throw new Error(`the runs page shows ${rows} runs, expected 3 at least`);
  await shot("runs");

  step("a running run's transcript grows");
  await page.goto(`${cfg.base}/runs/${cfg.grow}`);
  await page.locator(".live").waitFor();
  const before = await page.locator("#transcript .ev").count();
  await page.evaluate(() => { window.__samePage = true; });
  await page.waitForFunction(
    (n) => window.__samePage && document.querySelectorAll("#transcript .ev").length >= n + 3,
    before,
  );
  await shot("run-live");

  step("approve a queued request, see the run finish");
  await page.goto(`${cfg.base}/approvals`);
  const yes = page.locator("section.request", { has: page.locator(`a[href="/runs/${cfg.yes}"]`) });
  await yes.getByText("write_file wants to create approved.txt").waitFor();
  await shot("approvals");
  await yes.getByRole("button", { name: "Approve", exact: true }).click();
  await page.waitForURL(/\/approvals$/);
  await page.goto(`${cfg.base}/runs/${cfg.yes}`);
  await page.locator(".summary .badge.achieved").waitFor();
  await page.getByText("approved by web:alice").waitFor();
  await shot("run-approved");

  step("deny one with a reason, see the reason reach the model");
  await page.goto(`${cfg.base}/approvals`);
  const no = page.locator("section.request", { has: page.locator(`a[href="/runs/${cfg.no}"]`) });
  await no.locator("input[name=reason]").fill(cfg.reason);
  await no.getByRole("button", { name: "Deny" }).click();
  await page.waitForURL(/\/approvals$/);
  await page.locator("table.answered").getByText(cfg.reason).waitFor();
  await page.goto(`${cfg.base}/runs/${cfg.no}`);
  // The tool result the model got carries the reason.
  await page.locator(".ev.result.err", { hasText: cfg.reason }).waitFor();
  await page.locator(".summary .badge.achieved").waitFor();
  await shot("run-denied");

  step("pause a goal, see the daemon skip it");
  await page.goto(`${cfg.base}/goals`);
  const goal = page.locator(`#goal-${cfg.goal}`);
  await goal.getByRole("button", { name: "Pause" }).click();
  await page.waitForURL(/\/goals$/);
  await goal.locator(".badge.paused").waitFor();
  // The list refreshes itself: the skip shows up without a reload.
  await page.evaluate(() => { window.__samePage = true; });
  await page.waitForFunction(
    (name) => window.__samePage &&
      Number(document.querySelector(`#goal-${name} .paused-count`)?.innerText) > 0 &&
      Number(document.querySelector("main").dataset.refreshed || 0) > 0,
    cfg.goal,
  );

  step("the goal's health: its daemon alive, a chart of its runs");
  await goal.locator(".daemon.alive").waitFor();
  const bars = await goal.locator("svg.history rect.bar.achieved").count();
  if (bars < 1) throw new Error(`the history chart shows ${bars} achieved runs`);
  await goal.locator(".history-summary").waitFor();
  await shot("goals");
  if (foreign.length) throw new Error(`requests to other sites: ${foreign.join(", ")}`);
}

try {
  await main();
  console.log("ok");
} catch (e) {
  await shot("failure").catch(() => {});
  console.error(`FAILED at ${page.url()}: ${e.stack ?? e}`);
  process.exitCode = 1;
} finally {
  await ctx.close();
  rmSync(profile, { recursive: true, force: true });
}
