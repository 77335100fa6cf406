//! Issue 12, step-up approvals: a sensitive tool call waits for its person
//! to approve exactly that call, through a link that checks who opens it.
//!
//! - [`browser`]: the real binary, panva's `oidc-provider` as the
//!   organisation's IdP (its access tokens are the agent's subject tokens,
//!   its sign-in the pages'), Debian's chromium driven by npm
//!   `playwright-core`, tokens verified by npm `jose`.
//! - [`clock`]: the same pages in-process, where the clock can be moved:
//!   expired links and windows, the freeze, single use at a resource
//!   server (`credbroker::verify`), a record its call's index entry no
//!   longer names, and an answer after the approval expired.
//! - [`mcp`]: the example MCP server relays an approval link in both MCP
//!   versions, unchanged from a connect link.

mod browser;
mod clock;
mod mcp;

/// The policy under test: `mail.send` needs an approval for each call and
/// declares what the person sees; `deploy.run` is approved per step.
pub(crate) const POLICY: &str = r#"agent = "repo-helper"

[resources."https://mail.example/api"]
source = "self"

[resources."https://deploy.example/api"]
source = "self"

[tools."mail.send"]
resource = "https://mail.example/api"
scopes = ["mail.send"]
steps = ["send_reply"]
approval = "each_call"
require_authorization_details = true

[tools."mail.send".authorization_details.mail]
to = { kind = "strings", required = true, label = "Recipients" }
subject = { kind = "string", required = true, label = "Subject", log_in_clear = true }
body = { kind = "string", label = "Message" }

[tools."deploy.run"]
resource = "https://deploy.example/api"
scopes = ["deploy"]
steps = ["release", "verify"]
approval = "per_step"
approval_ttl = "15m"

[tools."deploy.run".authorization_details.deploy]
env = { kind = "string", required = true, label = "Environment", log_in_clear = true }
commit = { kind = "string", required = true, label = "Commit" }
"#;

pub(crate) const MAIL: &str = "https://mail.example/api";
pub(crate) const DEPLOY: &str = "https://deploy.example/api";
