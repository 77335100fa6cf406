//! `credbroker quickstart` as a newcomer meets it: the connect link to the
//! built-in demo service in Chromium (`demo_flow`), the README's
//! walkthrough run as written (`readme`), `examples/python-agent` with an
//! approval given in Chromium (`python_agent`), and the command's own checks
//! (`cli`: addresses, reuse, `serve` refusing the demo service).
mod cli;
mod demo_flow;
mod python_agent;
mod readme;
