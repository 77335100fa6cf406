// Drives Debian's chromium with playwright-core through lists of steps
// given by a Rust test, so the test keeps control of the broker, its users
// and its links. No browser is downloaded: executablePath is the system
// chromium.
//
// Two modes:
//   node pages_browser.mjs STEPS.json
//     STEPS.json: {"userDataDir": "...", "screenshotDir": "...", "steps": [...]}
//     One browser, one list of steps (tests/it/pages/browser.rs). Prints one
//     JSON line per step; exits 1 at the first failed step.
//   node pages_browser.mjs --serve ROOT SCREENSHOT_DIR
//     Several people, each with a browser of their own (a fresh user data
//     dir ROOT/<name>, made on first use), driven turn by turn so the test
//     can act in between (derive, check the provider). Prints {"ready":true},
//     then reads one JSON command per line and answers one JSON line:
//       {"browser": "alice", "steps": [...]}
//         -> {"ok": true, "results": [...]} or
//            {"ok": false, "error": ..., "step": ..., "url": ..., "text": ..., "results": [...]}
//       {"close": "alice"} -> {"ok": true}
//     Exits when stdin closes.
// Steps (each an object with one verb):
//   {"goto": url}                      navigate; records the status and the
//                                      SHA-256 of the body as received
//   {"expect_status": 404}             status of the last navigation
//   {"expect_url": "prefix"}           page URL starts with this
//   {"expect_text": "..."}             visible text contains this
//   {"expect_no_text": "..."}          visible text does not contain this
//   {"fill": css, "value": "..."}      type into a field
//   {"check": css}                     tick a checkbox or radio button
//   {"focus": css}                     focus an element
//   {"press": "Enter"}                 keyboard (waits for a navigation when asked: "nav": true)
//   {"click": css}                     click and wait for the navigation
//   {"click_if": css}                  the same, when such an element is there
//   {"expect_focus": css}              the focused element matches css
//   {"viewport": [w, h]}               resize
//   {"screenshot": "name"}             full-page PNG into screenshotDir
//   {"dom": css}                       the textContent and innerHTML of every
//                                      element matching css (for assertions
//                                      on the DOM itself, not the rendering)
//   {"set_value": css, "value": "..."} sets an input's value (hidden ones too)
//   {"post_from": url, "action": url, "fields": {...}}
//                                      opens url (another origin), submits a
//                                      form with fields to action from there
//                                      and records the answer's status
//   {"touch": path} / {"wait_file": path}  hand-over with the test (e.g. the
//                                      test moves its clock in between)
// A script error or a CSP violation on any page fails the run.

import { chromium } from 'playwright-core';
import { readFileSync, mkdirSync, writeFileSync, existsSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { createInterface } from 'node:readline';
import { join } from 'node:path';

function out(o) { process.stdout.write(JSON.stringify(o) + '\n'); }

async function openBrowser(userDataDir, screenshotDir) {
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--no-first-run'],
    viewport: { width: 1100, height: 800 },
    ignoreHTTPSErrors: false,
  });
  const page = context.pages()[0] ?? await context.newPage();
  const b = { context, page, screenshotDir, lastStatus: null, lastDocument: null, consoleErrors: [] };
  // The document the page shows: the last answer to a main-frame
  // navigation. (After a chain of cross-origin redirects, the response a
  // navigation promise gives can be an earlier hop.)
  page.on('response', (r) => {
    if (r.request().isNavigationRequest() && r.frame() === page.mainFrame()) b.lastDocument = r;
  });
  // Error pages (403, 404) are logged as failed loads; anything else (a CSP
  // violation, a script error) is a failure.
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) b.consoleErrors.push(m.text());
  });
  if (screenshotDir) mkdirSync(screenshotDir, { recursive: true });
  return b;
}

async function navigated(b, first) {
  const r = b.lastDocument ?? first;
  b.lastStatus = r ? r.status() : null;
  let sha256 = null;
  if (r) {
    try {
      sha256 = createHash('sha256').update(await r.body()).digest('hex');
    } catch {
      // Redirect answers have no body to give.
    }
  }
  return { url: b.page.url(), status: b.lastStatus, sha256 };
}

async function run(b, step) {
  const { page } = b;
  if ('goto' in step) {
    return navigated(b, await page.goto(step.goto, { waitUntil: 'load' }));
  }
  if ('expect_status' in step) {
    if (b.lastStatus !== step.expect_status) throw new Error(`status ${b.lastStatus}, expected ${step.expect_status}`);
    return {};
  }
  if ('expect_url' in step) {
    if (!page.url().startsWith(step.expect_url)) throw new Error(`url ${page.url()}, expected ${step.expect_url}`);
    return {};
  }
  if ('expect_text' in step) {
    const t = await page.innerText('body');
    if (!t.includes(step.expect_text)) throw new Error(`text missing: ${step.expect_text}`);
    return {};
  }
  if ('expect_no_text' in step) {
    const t = await page.innerText('body');
    if (t.includes(step.expect_no_text)) throw new Error(`text present: ${step.expect_no_text}`);
    return {};
  }
  if ('fill' in step) { await page.fill(step.fill, step.value); return {}; }
  if ('check' in step) { await page.check(step.check); return {}; }
  if ('focus' in step) { await page.focus(step.focus); return {}; }
  if ('press' in step) {
    if (step.nav) {
      const [r] = await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), page.keyboard.press(step.press)]);
      return navigated(b, r);
    }
    await page.keyboard.press(step.press);
    return {};
  }
  if ('click' in step) {
    const [r] = await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), page.click(step.click)]);
    return navigated(b, r);
  }
  if ('click_if' in step) {
    if (await page.$(step.click_if) === null) return { skipped: true };
    const [r] = await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), page.click(step.click_if)]);
    return navigated(b, r);
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
    const path = join(b.screenshotDir, `${step.screenshot}.png`);
    await page.screenshot({ path, fullPage: true });
    return { path };
  }
  if ('dom' in step) {
    // `overflow`: how far the element is wider than its box (0 when a long
    // value folds inside it).
    const found = await page.$$eval(step.dom, (els) => els.map((e) => ({
      tag: e.tagName.toLowerCase(), text: e.textContent, html: e.innerHTML,
      overflow: e.scrollWidth - e.clientWidth,
      page_overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,
    })));
    return { dom: found };
  }
  if ('set_value' in step) {
    await page.$eval(step.set_value, (e, v) => { e.value = v; }, step.value);
    return {};
  }
  if ('post_from' in step) {
    await page.goto(step.post_from);
    const [r] = await Promise.all([
      page.waitForNavigation({ waitUntil: 'load' }),
      page.evaluate(({ action, fields }) => {
        const f = document.createElement('form');
        f.method = 'post';
        f.action = action;
        for (const [k, v] of Object.entries(fields)) {
          const i = document.createElement('input');
          i.type = 'hidden'; i.name = k; i.value = v;
          f.appendChild(i);
        }
        document.body.appendChild(f);
        f.submit();
      }, { action: step.action, fields: step.fields }),
    ]);
    return navigated(b, r);
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

// Runs steps until one fails; returns the answer of the serve mode.
async function runAll(b, steps, onStep) {
  const results = [];
  for (const [i, step] of steps.entries()) {
    try {
      const r = await run(b, step);
      results.push(r);
      onStep?.({ i, ok: true, step, ...r });
    } catch (e) {
      const error = String(e.message ?? e);
      onStep?.({ i, ok: false, step, error, url: b.page.url() });
      let text = '';
      try { text = (await b.page.innerText('body')).slice(0, 2000); } catch { /* no page */ }
      return { ok: false, i, step, error, url: b.page.url(), text, results };
    }
  }
  if (b.consoleErrors.length) {
    const errors = b.consoleErrors.splice(0);
    return { ok: false, error: 'console errors', console_errors: errors, url: b.page.url(), results };
  }
  return { ok: true, results };
}

if (process.argv[2] === '--serve') {
  const root = process.argv[3];
  const screenshotDir = process.argv[4];
  const browsers = new Map();
  out({ ready: true });
  const rl = createInterface({ input: process.stdin });
  // One command at a time, in order: each answer is awaited by the test.
  let queue = Promise.resolve();
  rl.on('line', (line) => {
    queue = queue.then(async () => {
      try {
        const cmd = JSON.parse(line);
        if ('close' in cmd) {
          const b = browsers.get(cmd.close);
          browsers.delete(cmd.close);
          if (b) await b.context.close();
          out({ ok: true });
          return;
        }
        let b = browsers.get(cmd.browser);
        if (!b) {
          b = await openBrowser(join(root, cmd.browser), screenshotDir);
          browsers.set(cmd.browser, b);
        }
        out(await runAll(b, cmd.steps));
      } catch (e) {
        out({ ok: false, error: String(e.message ?? e) });
      }
    });
  });
  rl.on('close', () => {
    queue.then(async () => {
      // A browser that cannot be closed is reported in the exit status,
      // which the test checks (support/browser.rs, finish).
      let failed = 0;
      for (const b of browsers.values()) {
        await b.context.close().catch((e) => {
          failed += 1;
          console.error(`closing a browser failed: ${e.message ?? e}`);
        });
      }
      process.exit(failed ? 1 : 0);
    });
  });
} else {
  const spec = JSON.parse(readFileSync(process.argv[2], 'utf8'));
  const b = await openBrowser(spec.userDataDir, spec.screenshotDir);
  const r = await runAll(b, spec.steps, out);
  // The pages carry no script; a CSP violation or script error would show here.
  out({ console_errors: r.console_errors ?? [] });
  if (!r.ok && r.text) out({ page_text: r.text });
  await b.context.close();
  process.exit(r.ok ? 0 : 1);
}
