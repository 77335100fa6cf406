// The person in tests/it/mcp/e2e.rs: opens a connect link that an MCP client
// was given, in Debian's chromium (playwright-core, no downloaded browser),
// in that person's own browser profile, and does what a person would:
// signs in at the organisation's IdP as PERSON when asked, and presses the
// page's main button (connect, allow or reconnect). Never decides anything
// from the URL: it only reacts to the pages it is shown.
//
//   node mcp_open_link.mjs PROFILE_DIR PERSON URL
//
// Prints one JSON line per step, then {"done": "completed" | "other_person"
// | "not_found" | "stuck", "url", "status", "text"}. Exit code 0 unless the
// browser itself failed.
import { chromium } from 'playwright-core';

const [profile, person, url] = process.argv.slice(2);
const context = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run'],
});
const page = context.pages()[0] ?? await context.newPage();
const out = (o) => process.stdout.write(`${JSON.stringify(o)}\n`);
let status = null;
page.on('response', (r) => { if (r.request().isNavigationRequest() && r.frame() === page.mainFrame()) status = r.status(); });

async function clickAndWait(selector) {
  await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), page.click(selector)]);
}

let done = 'stuck';
try {
  await page.goto(url, { waitUntil: 'load' });
  for (let i = 0; i < 16; i++) {
    const text = await page.innerText('body').catch(() => '');
    const here = page.url();
    if (text.includes('Go back to your agent')) { done = 'completed'; break; }
    if (text.includes('made for another account')) { done = 'other_person'; break; }
    if (status === 404) { done = 'not_found'; break; }
    if (await page.$('a.button[href^="/signin/oidc"]')) {
      out({ at: here, action: 'sign in at the IdP' });
      await clickAndWait('a.button[href^="/signin/oidc"]');
    } else if (await page.$('input[name=login]')) {
      out({ at: here, action: `IdP login as ${person}` });
      await page.fill('input[name=login]', person);
      await page.fill('input[name=password]', 'any');
      await clickAndWait('button[type=submit]');
    } else if (await page.$('input[name=prompt][value=consent] ~ button[type=submit]')) {
      out({ at: here, action: 'IdP consent' });
      await clickAndWait('input[name=prompt][value=consent] ~ button[type=submit]');
    } else if (await page.$('button[name=action].primary')) {
      const value = await page.getAttribute('button[name=action].primary', 'value');
      out({ at: here, action: `press ${value}`, page: text.slice(0, 300) });
      await clickAndWait('button[name=action].primary');
    } else {
      break;
    }
  }
  const text = await page.innerText('body').catch(() => '');
  out({ done, url: page.url(), status, text: text.slice(0, 500) });
} finally {
  await context.close();
}
