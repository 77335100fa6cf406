// The package's entry points export its public surface and nothing else:
// the helpers inside (the refusal mapping, `ath`, `htuOf`) stay internal.

import assert from "node:assert/strict";
import { test } from "node:test";

import * as main from "../../src/index.js";
import * as mcp from "../../src/mcp.js";

test("the main entry point exports the public surface only", () => {
  assert.deepEqual(Object.keys(main).sort(), [
    "API_VERSION",
    "AccessDenied",
    "Broker",
    "BrokerNotRunning",
    "CredbrokerError",
    "FETCH_TIMEOUT_MS",
    "IncompatibleBroker",
    "InvalidRequest",
    "Issued",
    "KeyFileError",
    "Link",
    "LinkRequired",
    "MAX_BOUND_BODY",
    "MAX_KEYS_DOCUMENT",
    "MAX_TRACESTATE",
    "MemorySingleUseStore",
    "NonceStore",
    "NotSenderConstrained",
    "RateLimited",
    "Refused",
    "ReplayCache",
    "RequestError",
    "SingleUseStoreFull",
    "ToolKey",
    "Unavailable",
    "UnexpectedAnswer",
    "Verifier",
    "VerifyError",
    "bind",
    "dpopFetch",
    "originOf",
    "socketOrigin",
    "traceFromMeta",
    "traceHeaders",
  ]);
  for (const internal of ["refusal", "ath", "htuOf", "checkIJson", "requestJson"]) assert.ok(!(internal in main), internal);
});

test("the /mcp entry point exports the MCP helpers", () => {
  assert.deepEqual(Object.keys(mcp).sort(), [
    "INPUT_REQUIRED_VERSION",
    "REQUEST_STATE_REJECTED",
    "RequestStateRejected",
    "RequestStateSealer",
    "inputRequired",
    "linkAnswer",
    "linkText",
    "urlElicitationError",
  ]);
});
