// Drives Debian's chromium with playwright-core through a list of steps
// given by a Rust test (tests/pages_browser.rs), so the test keeps control
// of the broker, its users and its links. No browser is downloaded:
// executablePath is the system chromium.
//
// usage: node pages_browser.mjs STEPS.json
//   STEPS.json: {"userDataDir": "...", "screenshotDir": "...", "steps": [...]}
// Steps (each an object with one verb):
//   {"goto": url}                      navigate; records the status
//   {"expect_status": 404}             status of the last navigation
//   {"expect_url": "prefix"}           page URL starts with this
//   {"expect_text": "..."}             visible text contains this
//   {"expect_no_text": "..."}          visible text does not contain this
//   {"fill": css, "value": "..."}      type into a field
//   {"focus": css}                     focus an element
//   {"press": "Enter"}                 keyboard (waits for a navigation when asked: "nav": true)
//   {"click": css}                     click and wait for the navigation
//   {"click_if": css}                  the same, when such an element is there
//   {"expect_focus": css}              the focused element matches css
//   {"viewport": [w, h]}               resize
//   {"screenshot": "name"}             full-page PNG into screenshotDir
//   {"touch": path} / {"wait_file": path}  hand-over with the test (e.g. the
//                                      test moves its clock in between)
// Prints one JSON line per step; exits 1 at the first failed step.

import { chromium } from 'playwright-core';
import { readFileSync, mkdirSync, writeFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';

const spec = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const context = await chromium.launchPersistentContext(spec.userDataDir, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run'],
  viewport: { width: 1100, height: 800 },
  ignoreHTTPSErrors: false,
});
const page = context.pages()[0] ?? await context.newPage();
const consoleErrors = [];
// Error pages (403, 404) are logged as failed loads; anything else (a CSP
// violation, a script error) is a failure.
page.on('console', (m) => {
  if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) consoleErrors.push(m.text());
});
let lastStatus = null;
if (spec.screenshotDir) mkdirSync(spec.screenshotDir, { recursive: true });

function out(o) { process.stdout.write(JSON.stringify(o) + '\n'); }

async function run(step) {
  if ('goto' in step) {
    const r = await page.goto(step.goto, { waitUntil: 'load' });
    lastStatus = r ? r.status() : null;
    return { url: page.url(), status: lastStatus };
  }
  if ('expect_status' in step) {
    if (lastStatus !== step.expect_status) throw new Error(`status ${lastStatus}, expected ${step.expect_status}`);
    return {};
  }
  if ('expect_url' in step) {
    if (!page.url().startsWith(step.expect_url)) throw new Error(`url ${page.url()}, expected ${step.expect_url}`);
    return {};
  }
  if ('expect_text' in step) {
    const t = await page.innerText('body');
    if (!t.includes(step.expect_text)) throw new Error(`text missing: ${step.expect_text}\n--- page ---\n${t}`);
    return {};
  }
  if ('expect_no_text' in step) {
    const t = await page.innerText('body');
    if (t.includes(step.expect_no_text)) throw new Error(`text present: ${step.expect_no_text}`);
    return {};
  }
  if ('fill' in step) { await page.fill(step.fill, step.value); return {}; }
  if ('focus' in step) { await page.focus(step.focus); return {}; }
  if ('press' in step) {
    if (step.nav) {
      const [r] = await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), page.keyboard.press(step.press)]);
      lastStatus = r ? r.status() : null;
      return { url: page.url(), status: lastStatus };
    }
    await page.keyboard.press(step.press);
    return {};
  }
  if ('click' in step) {
    const [r] = await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), page.click(step.click)]);
    lastStatus = r ? r.status() : null;
    return { url: page.url(), status: lastStatus };
  }
  if ('click_if' in step) {
    if (await page.$(step.click_if) === null) return { skipped: true };
    const [r] = await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), page.click(step.click_if)]);
    lastStatus = r ? r.status() : null;
    return { url: page.url(), status: lastStatus };
  }
  if ('expect_focus' in step) {
    const ok = await page.evaluate((css) => document.activeElement?.matches(css) ?? false, step.expect_focus);
    if (!ok) {
      const what = await page.evaluate(() => document.activeElement?.outerHTML?.slice(0, 200));
      throw new Error(`focus is on ${what}, expected ${step.expect_focus}`);
    }
    return {};
  }
  if ('viewport' in step) { await page.setViewportSize({ width: step.viewport[0], height: step.viewport[1] }); return {}; }
  if ('screenshot' in step) {
    const path = join(spec.screenshotDir, `${step.screenshot}.png`);
    await page.screenshot({ path, fullPage: true });
    return { path };
  }
  if ('touch' in step) { writeFileSync(step.touch, ''); return {}; }
  if ('wait_file' in step) {
    const until = Date.now() + 30000;
    while (!existsSync(step.wait_file)) {
      if (Date.now() > until) throw new Error(`no ${step.wait_file}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    return {};
  }
  throw new Error(`unknown step ${JSON.stringify(step)}`);
}

let failed = false;
for (const [i, step] of spec.steps.entries()) {
  try {
    const r = await run(step);
    out({ i, ok: true, step, ...r });
  } catch (e) {
    out({ i, ok: false, step, error: String(e.message ?? e), url: page.url() });
    failed = true;
    break;
  }
}
// The pages carry no script; a CSP violation or script error would show here.
out({ console_errors: consoleErrors });
await context.close();
process.exit(failed || consoleErrors.length ? 1 : 0);
