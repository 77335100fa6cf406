// relay.ts: which relayed proofs a derive carries.

import assert from "node:assert/strict";
import { test } from "node:test";

import { UpstreamInfo, proofRequired } from "../../src/relay.js";

const INFO = {
  upstreams: {
    org: { issuer: "https://as.example", token_endpoint: "https://as.example/token", dpop_nonce: "n1" },
    later: { issuer: "https://later.example" },
  },
  upstream_resources: { "https://api.example/notes": "org", "https://b.example/": "later" },
};

test("legs come from the info, with the latest nonce", () => {
  const u = UpstreamInfo.parse(INFO);
  assert.deepEqual([...u.legs("https://api.example/notes", new Map())], [["org", { htu: "https://as.example/token", nonce: "n1" }]]);
  // A nonce learnt since wins; a trailing slash more still matches.
  assert.deepEqual(
    [...u.legs("https://api.example/notes/", new Map([["org", "n2"]]))],
    [["org", { htu: "https://as.example/token", nonce: "n2" }]],
  );
  // An upstream whose endpoint is not known yet, a `self` resource, an older broker: no leg.
  assert.equal(u.legs("https://b.example/", new Map()).size, 0);
  assert.equal(u.legs("https://self.example/", new Map()).size, 0);
  assert.equal(UpstreamInfo.parse({ issuer: "i" }).legs("https://api.example/notes", new Map()).size, 0);
});

test("a refusal is matched by its htu", () => {
  const u = UpstreamInfo.parse(INFO);
  assert.equal(u.nameFor("https://as.example/token", "x"), "org");
  assert.equal(u.nameFor("https://new.example/token", "https://b.example/"), "later");
  assert.equal(u.nameFor("https://new.example/token", "x"), undefined);
  const body = {
    error: "invalid_dpop_proof",
    reason: "upstream_proof_required",
    upstream_htu: "https://as.example/token",
    upstream_nonce: "n3",
  };
  assert.deepEqual(proofRequired(400, body), { htu: "https://as.example/token", nonce: "n3" });
  // Only that refusal, with its htu, is retried.
  assert.equal(proofRequired(400, { ...body, reason: "upstream_proof_invalid" }), undefined);
  assert.equal(proofRequired(400, { ...body, upstream_htu: undefined }), undefined);
  assert.equal(proofRequired(403, body), undefined);
});

test("an id_jag upstream gets a second leg at its resource_upstream", () => {
  const u = UpstreamInfo.parse({
    upstreams: {
      org: { token_endpoint: "https://idp.example/token", grant: "id_jag", resource_upstream: "crm" },
      crm: { token_endpoint: "https://crm-as.example/token", dpop_nonce: "c1" },
      tx: { token_endpoint: "https://tx.example/token", grant: "token_exchange", resource_upstream: "crm" },
    },
    upstream_resources: { "https://crm.example/api": "org", "https://tx.example/api": "tx" },
  });
  assert.deepEqual(
    [...u.legs("https://crm.example/api", new Map([["crm", "c2"]]))],
    [
      ["org", { htu: "https://idp.example/token", nonce: undefined }],
      ["crm", { htu: "https://crm-as.example/token", nonce: "c2" }],
    ],
  );
  // A refusal naming leg 2's htu is matched to leg 2's upstream.
  assert.equal(u.nameFor("https://crm-as.example/token", "https://crm.example/api"), "crm");
  // resource_upstream means nothing on a token-exchange upstream.
  assert.deepEqual([...u.legs("https://tx.example/api", new Map()).keys()], ["tx"]);
});
