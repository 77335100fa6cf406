//! `credbroker quickstart` as a newcomer meets it: the connect link to the
//! built-in demo service in Chromium (`demo_flow`), the README's
//! walkthrough run as written (`readme`), and the command's own checks
//! (`cli`: addresses, reuse, `serve` refusing the demo service).
mod cli;
mod demo_flow;
mod readme;
