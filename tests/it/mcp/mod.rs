//! The MCP side: the protocol files, the example server, end to end.
mod e2e;
mod proto;
mod real_broker;
mod server;
mod wire;
