// The person in tests/it/mcp/e2e.rs: opens a connect link that an MCP client
// was given, in Debian's chromium (playwright-core, no downloaded browser),
// in that person's own browser profile, and does what a person would:
// signs in as PERSON when asked (at the organisation's IdP, or with a local
// account's password on the broker's own sign-in form when PASSWORD_FILE is
// given: the quick start, clients/python/tests/test_mcp_e2e.py), and presses
// the page's main button (connect, allow or reconnect). Never decides
// anything from the URL: it only reacts to the pages it is shown.
//
//   node mcp_open_link.mjs PROFILE_DIR PERSON [PASSWORD_FILE] URL
//
// (The MCP client appends the URL, so it comes last; the password is read
// from a file, never taken from the command line.)
//
// Prints one JSON line per step, then {"done": "completed" | "other_person"
// | "not_found" | "stuck", "url", "status", "text"}. Exit code 0 unless the
// browser itself failed.
import { readFileSync } from 'node:fs';
import { chromium } from 'playwright-core';

const args = process.argv.slice(2);
const [profile, person] = args;
const url = args[args.length - 1];
const passwordFile = args.length === 4 ? args[2] : null;
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
    // The 404 page also says to go back to the agent: the status first.
    if (status === 404) { done = 'not_found'; break; }
    // A link that did what it was for ends on /done/connected, reconnected,
    // allowed or approved; the first three name the service after it when
    // the person is signed in, and their text names the agent, so the
    // address is what is matched.
    if (/^\/done\/(connected|reconnected|allowed|approved)(\/|$)/.test(new URL(here).pathname)) { done = 'completed'; break; }
    if (text.includes('made for another account')) { done = 'other_person'; break; }
    if (await page.$('a.button[href^="/signin/oidc"]')) {
      out({ at: here, action: 'sign in at the IdP' });
      await clickAndWait('a.button[href^="/signin/oidc"]');
    } else if (passwordFile && await page.$('form[action="/signin"] input[name=password]')) {
      out({ at: here, action: `local sign-in as ${person}` });
      if (await page.$('form[action="/signin"] input[name=username]:not([readonly])')) {
        await page.fill('form[action="/signin"] input[name=username]', person);
      }
      await page.fill('form[action="/signin"] input[name=password]', readFileSync(passwordFile, 'utf8').trim());
      await clickAndWait('form[action="/signin"] button[type=submit]');
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
