//! `palisade-wire`: the ACP wire as Palisade speaks it, without I/O.
//!
//! Three floors, each importing only the ones below it:
//!
//! - [`jsonrpc`]: JSON-RPC 2.0 framing for ACP's stdio transport, one message per line.
//!   It knows envelopes, not payloads: `params` and `result` stay raw JSON
//!   ([`jsonrpc::RawJson`]), so a newer agent's unknown fields pass through untouched.
//! - [`acp`]: the ACP v1 mapping on top of the official `agent-client-protocol-schema`
//!   types: the requests an orchestrator sends, and the members of the answers it reads.
//! - [`connection`]: one connection's bookkeeping ([`connection::Wire`]): request ids,
//!   answers routed back by id, late answers recognised, every line classified, the
//!   garbage budget; and the vocabulary a connection reports in ([`AgentEvent`],
//!   [`RpcFailure`], [`CloseReason`], ...).
//! - [`upstream`]: the other side of ACP — what a client sends its agent, sorted by what a
//!   proxy in front of an agent does with it.
//!
//! No tokio, no threads, no clock: the tokio shell (`palisade-embed`) and the simulator
//! move the bytes; both run this same code on them.

pub mod acp;
pub mod connection;
pub mod jsonrpc;
pub mod upstream;

pub use connection::{
    AgentEvent, Anomaly, CloseReason, ConnectionStats, Incoming, ProcessExit, RpcFailure, Wire,
};
pub use jsonrpc::{RawJson, RequestId, RpcError};
