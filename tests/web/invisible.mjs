// One console page in Debian's Chromium, driven by playwright-core: a screenshot of it, and
// what a person reads there. Run by tests/all/web.rs
// (`web::the_console_shows_bidi_controls_and_blank_letters_escaped_in_a_browser`) with one JSON
// argument: url, shot (the PNG to write), chars (code points that must never be shown raw).
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const cfg = JSON.parse(process.argv[2]);
const profile = mkdtempSync(join(tmpdir(), "sup-invisible-"));
const ctx = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
  viewport: { width: 1280, height: 860 },
});
let failed = null;
try {
  const page = ctx.pages()[0] ?? (await ctx.newPage());
  page.setDefaultTimeout(60000);
  await page.goto(cfg.url);
  // Open every folded detail, so the screenshot shows arguments and the answer too.
  await page.evaluate(() => document.querySelectorAll("details").forEach((d) => { d.open = true; }));
  await page.screenshot({ path: cfg.shot, fullPage: true });
  const text = await page.evaluate(() => document.body.innerText);
  const raw = cfg.chars.filter((c) => text.includes(String.fromCodePoint(c)));
  const missing = cfg.chars.filter((c) => !text.includes(`\\u{${c.toString(16)}}`));
  console.log(JSON.stringify({ raw, missing, flagged: text.includes("invisible Unicode") }));
} catch (e) {
  failed = e;
} finally {
  await ctx.close();
  rmSync(profile, { recursive: true, force: true });
}
if (failed) {
  console.error(failed);
  process.exit(1);
}
