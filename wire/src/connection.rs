//! One JSON-RPC connection's bookkeeping, without I/O: ids for the requests we send, each
//! answer routed back to its request by id, abandoned ids remembered as late, every line
//! the agent writes classified ([`Incoming`]), the garbage budget, the counters.
//!
//! It also holds the vocabulary a connection reports in: [`AgentEvent`], [`RpcFailure`],
//! [`CloseReason`], [`Anomaly`], [`ProcessExit`] and [`ConnectionStats`].
//!
//! The tokio connection (`palisade_embed::rpc`) keeps one behind a mutex and moves bytes;
//! the simulator keeps one per simulated agent process and moves the same bytes through
//! its pipes. So the framing and the routing that production runs are what the sweep
//! drives.

use std::collections::{BTreeMap, VecDeque};
use std::io;

use crate::acp::{parse_agent_frame, AgentFrame, Params};
use crate::jsonrpc::{Frame, FrameError, RawJson, RequestId, RpcError};

/// Default longest line we accept from an agent. A `session/load` history replay or a
/// file read can be megabytes in one line; past this the agent is broken (or hostile) and
/// the line is skipped and reported, so one line cannot take the service's memory.
pub const DEFAULT_MAX_LINE_BYTES: usize = 32 * 1024 * 1024;

/// Requests in flight on one connection. ACP traffic is a handful of concurrent calls;
/// more than this means a caller is leaking requests.
pub const MAX_PENDING_REQUESTS: usize = 1024;

/// Timed-out request ids remembered, so a late answer is reported as late, not unknown.
pub const LATE_IDS_REMEMBERED: usize = 64;

/// Bytes of a garbage line kept in a report. Enough to recognise it, small enough to log.
pub const GARBAGE_SAMPLE_BYTES: usize = 256;

/// How an agent process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ProcessExit {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal (9 is SIGKILL).
    Signal(i32),
    /// The status could not be read.
    Unknown,
}

impl From<std::process::ExitStatus> for ProcessExit {
    fn from(status: std::process::ExitStatus) -> Self {
        if let Some(code) = status.code() {
            return ProcessExit::Code(code);
        }
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            if let Some(signal) = status.signal() {
                return ProcessExit::Signal(signal);
            }
        }
        ProcessExit::Unknown
    }
}

/// Why a request (or notification, or response) did not get its answer. Closed: each
/// variant maps to one action of the caller.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RpcFailure {
    /// The agent answered with a JSON-RPC error. Action: classify it (e.g. load fallback).
    Rpc(RpcError),
    /// No answer before the deadline; the agent may still be working. Action: inconclusive;
    /// retry or tear down, never treat as "not found".
    TimedOut,
    /// The agent's stdout ended (or its stdin broke) while the process was still running.
    /// Action: the runtime is dead; tear it down and recover.
    TransportClosed,
    /// The agent process exited. Action: the runtime is dead; recover.
    ProcessExited {
        /// How it ended.
        status: ProcessExit,
    },
    /// The agent wrote more non-JSON-RPC lines than the connection's garbage budget.
    /// Action: the runtime is broken; tear it down and recover.
    Garbage {
        /// The start of the line that used up the budget.
        line: String,
    },
    /// We killed the agent (or dropped the connection). Action: none; we asked for it.
    Killed,
    /// [`MAX_PENDING_REQUESTS`] requests are already in flight. Action: caller bug; back off.
    TooManyPending,
}

impl std::fmt::Display for RpcFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcFailure::Rpc(error) => write!(f, "{error}"),
            RpcFailure::TimedOut => f.write_str("no answer before the deadline"),
            RpcFailure::TransportClosed => f.write_str("agent transport closed"),
            RpcFailure::ProcessExited { status } => write!(f, "agent process exited: {status:?}"),
            RpcFailure::Garbage { line } => write!(f, "agent wrote garbage: {line:?}"),
            RpcFailure::Killed => f.write_str("agent was killed by us"),
            RpcFailure::TooManyPending => f.write_str("too many requests in flight"),
        }
    }
}

impl std::error::Error for RpcFailure {}

/// An I/O error's kind in a state file: by name (`std::io::ErrorKind` has no serde form);
/// a name this build does not know reads back as `Other`.
mod error_kind {
    use std::io::ErrorKind;

    const KNOWN: [ErrorKind; 10] = [
        ErrorKind::BrokenPipe,
        ErrorKind::ConnectionReset,
        ErrorKind::ConnectionAborted,
        ErrorKind::UnexpectedEof,
        ErrorKind::InvalidData,
        ErrorKind::Interrupted,
        ErrorKind::PermissionDenied,
        ErrorKind::TimedOut,
        ErrorKind::WouldBlock,
        ErrorKind::Other,
    ];

    pub(super) fn serialize<S: serde::Serializer>(
        kind: &ErrorKind,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{kind:?}"))
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<ErrorKind, D::Error> {
        let name: String = serde::Deserialize::deserialize(d)?;
        Ok(KNOWN
            .into_iter()
            .find(|k| format!("{k:?}") == name)
            .unwrap_or(ErrorKind::Other))
    }
}

/// Why the connection ended; the last event a connection reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CloseReason {
    /// stdout ended and the process exited.
    ProcessExited(ProcessExit),
    /// stdout ended but the process kept running past the connection's exit grace.
    StdoutClosed,
    /// Reading stdout failed.
    ReadFailed(#[serde(with = "error_kind")] io::ErrorKind),
    /// The garbage budget was used up by this line (sample).
    Garbage(String),
    /// We killed the agent; its exit status, if it was reaped within the connection's exit grace.
    Killed(Option<ProcessExit>),
}

impl CloseReason {
    /// The failure a request gets when the connection closed for this reason.
    #[must_use]
    pub fn failure(&self) -> RpcFailure {
        match self {
            CloseReason::ProcessExited(status) => RpcFailure::ProcessExited { status: *status },
            CloseReason::StdoutClosed | CloseReason::ReadFailed(_) => RpcFailure::TransportClosed,
            CloseReason::Garbage(line) => RpcFailure::Garbage { line: line.clone() },
            CloseReason::Killed(_) => RpcFailure::Killed,
        }
    }
}

/// Something the agent wrote that the connection could not use. Reported, counted, never
/// a panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Anomaly {
    /// A line that is not a JSON-RPC message.
    Garbage {
        /// Why it is not.
        kind: FrameError,
        /// Its first [`GARBAGE_SAMPLE_BYTES`] bytes, lossily decoded.
        sample: String,
    },
    /// A line longer than the connection's longest line; skipped, and it counts
    /// against the garbage budget.
    OversizedLine {
        /// How long it was.
        bytes: usize,
    },
    /// A response whose id matches no request we sent.
    UnknownResponseId {
        /// The id it carried.
        id: RequestId,
        /// Whether it was an error response.
        was_error: bool,
    },
    /// A response to a request that had already timed out or been dropped by its caller.
    LateResponse {
        /// Our id of that request.
        id: i64,
    },
}

/// What the agent sends us, in wire order. Responses are not here: they go to the
/// request that waits for them.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    /// A `session/update` notification (the bulk of what an agent writes), its params read.
    Update {
        /// `params.sessionId`.
        session_id: Option<String>,
        /// `params.update`, as written: unknown update kinds pass through untouched.
        /// `None` when absent or `null`, or when the params are not of that shape.
        update: Option<RawJson>,
        /// Bytes of the line on the wire, newline included (for coalescing budgets).
        wire_bytes: usize,
    },
    /// Any other notification. ([`Wire::receive`] reads a `session/update` as
    /// [`AgentEvent::Update`]; one built by hand is read as that one would be.)
    Notification {
        /// The method.
        method: String,
        /// The params as raw JSON: unknown update kinds pass through untouched.
        params: RawJson,
        /// Bytes of the line on the wire, newline included (for coalescing budgets).
        wire_bytes: usize,
    },
    /// A request from the agent (e.g. `session/request_permission`); answer it with
    /// a response (`palisade_embed::AgentConnection::respond`) or the agent waits.
    Request {
        /// The agent's id, to echo back.
        id: RequestId,
        /// The method.
        method: String,
        /// The raw params.
        params: RawJson,
    },
    /// Something unusable; see [`Anomaly`].
    Anomaly(Anomaly),
    /// The connection ended; nothing follows.
    Closed(CloseReason),
}

/// Counters of one connection. Monotonic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// Notifications delivered to the connection's events.
    pub notifications: u64,
    /// Requests from the agent delivered to the connection's events.
    pub agent_requests: u64,
    /// Responses routed to a waiting request.
    pub responses: u64,
    /// Lines that were not JSON-RPC.
    pub garbage_lines: u64,
    /// Lines over the connection's longest line.
    pub oversized_lines: u64,
    /// Responses with an id we never sent.
    pub unknown_response_ids: u64,
    /// Responses to requests that had timed out.
    pub late_responses: u64,
    /// Events that could not be delivered because their receiver was dropped.
    pub events_without_receiver: u64,
}

/// What one line from the agent turned out to be.
#[derive(Debug, PartialEq)]
pub enum Incoming<T> {
    /// The answer to the request sent with `tag`.
    Reply {
        /// What the sender attached to the request.
        tag: T,
        /// Its result (raw: the receiver reads the members it needs), or the agent's
        /// JSON-RPC error as [`RpcFailure::Rpc`].
        result: Result<RawJson, RpcFailure>,
    },
    /// Something to pass on in wire order: a notification, a request from the agent, or
    /// an anomaly (garbage, an unknown or late response id, an oversized line). Pass an
    /// anomaly to [`Wire::spend`]: garbage past the budget closes the connection.
    Event(AgentEvent),
    /// A blank line.
    Nothing,
}

/// The bookkeeping of one connection. `T` is what the sender attaches to each request to
/// recognise its answer (a waiter, an operation).
#[derive(Debug)]
pub struct Wire<T> {
    next_id: i64,
    pending: BTreeMap<i64, T>,
    late: VecDeque<i64>,
    closed: Option<CloseReason>,
    garbage_budget: u32,
    garbage_seen: u32,
    stats: ConnectionStats,
}

impl<T> Wire<T> {
    /// A fresh connection that tolerates `garbage_budget` unusable lines.
    pub fn new(garbage_budget: u32) -> Wire<T> {
        Wire {
            next_id: 1,
            pending: BTreeMap::new(),
            late: VecDeque::new(),
            closed: None,
            garbage_budget,
            garbage_seen: 0,
            stats: ConnectionStats::default(),
        }
    }

    /// Counters so far.
    #[must_use]
    pub fn stats(&self) -> ConnectionStats {
        self.stats
    }

    /// Why the connection closed, once it has.
    #[must_use]
    pub fn closed(&self) -> Option<&CloseReason> {
        self.closed.as_ref()
    }

    /// Requests waiting for an answer.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// A request: its id and the line to write (newline included). Refused with the
    /// failure the request gets when the connection is closed or too many are in flight;
    /// the tag comes back then.
    pub fn request(
        &mut self,
        method: &str,
        params: &Params,
        tag: T,
    ) -> Result<(i64, String), (T, RpcFailure)> {
        if let Some(reason) = &self.closed {
            return Err((tag, reason.failure()));
        }
        if self.pending.len() >= MAX_PENDING_REQUESTS {
            return Err((tag, RpcFailure::TooManyPending));
        }
        let id = self.next_id;
        self.next_id = self.next_id.saturating_add(1);
        self.pending.insert(id, tag);
        Ok((id, params.request_line(&RequestId::Number(id), method)))
    }

    /// The request `id` is no longer awaited (its deadline passed): its tag comes back, and
    /// an answer that still comes is reported as late. `None` if it was answered already.
    pub fn abandon(&mut self, id: i64) -> Option<T> {
        let tag = self.pending.remove(&id)?;
        if self.late.len() == LATE_IDS_REMEMBERED {
            self.late.pop_front();
        }
        self.late.push_back(id);
        Some(tag)
    }

    /// Classifies one line the agent wrote (without its newline).
    pub fn receive(&mut self, line: &[u8]) -> Incoming<T> {
        let Some(len) = content(line) else {
            return Incoming::Nothing;
        };
        let line = &line[..len];
        match parse_agent_frame(line) {
            Ok(AgentFrame::Update(update)) => {
                self.stats.notifications += 1;
                Incoming::Event(AgentEvent::Update {
                    session_id: update.session_id,
                    update: update.update,
                    wire_bytes: line.len() + 1,
                })
            }
            Ok(AgentFrame::Other(Frame::Response { id, outcome })) => {
                let number = match id {
                    RequestId::Number(number) => Some(number),
                    RequestId::Null | RequestId::Str(_) => None,
                };
                if let Some(tag) = number.and_then(|n| self.pending.remove(&n)) {
                    self.stats.responses += 1;
                    return Incoming::Reply {
                        tag,
                        result: outcome.map_err(RpcFailure::Rpc),
                    };
                }
                let anomaly = match number.filter(|n| self.late.contains(n)) {
                    Some(late) => {
                        self.stats.late_responses += 1;
                        Anomaly::LateResponse { id: late }
                    }
                    None => {
                        self.stats.unknown_response_ids += 1;
                        Anomaly::UnknownResponseId {
                            id,
                            was_error: outcome.is_err(),
                        }
                    }
                };
                Incoming::Event(AgentEvent::Anomaly(anomaly))
            }
            Ok(AgentFrame::Other(Frame::Notification { method, params })) => {
                self.stats.notifications += 1;
                Incoming::Event(AgentEvent::Notification {
                    method,
                    params,
                    wire_bytes: line.len() + 1,
                })
            }
            Ok(AgentFrame::Other(Frame::Request { id, method, params })) => {
                self.stats.agent_requests += 1;
                Incoming::Event(AgentEvent::Request { id, method, params })
            }
            Err(kind) => {
                self.stats.garbage_lines += 1;
                Incoming::Event(AgentEvent::Anomaly(Anomaly::Garbage {
                    kind,
                    sample: sample(line),
                }))
            }
        }
    }

    /// A line longer than the connection accepts was skipped: the anomaly to report.
    pub fn oversized(&mut self, bytes: usize) -> AgentEvent {
        self.stats.oversized_lines += 1;
        AgentEvent::Anomaly(Anomaly::OversizedLine { bytes })
    }

    /// Spends one unit of the garbage budget on the line whose report was `event` (an
    /// [`Anomaly::Garbage`] or [`Anomaly::OversizedLine`]); past the budget, the reason the
    /// connection closes. Other events cost nothing.
    pub fn spend(&mut self, event: &AgentEvent) -> Option<CloseReason> {
        let sample = match event {
            AgentEvent::Anomaly(Anomaly::Garbage { sample, .. }) => sample.clone(),
            AgentEvent::Anomaly(Anomaly::OversizedLine { bytes }) => format!("<{bytes} bytes>"),
            _ => return None,
        };
        self.garbage_seen = self.garbage_seen.saturating_add(1);
        (self.garbage_seen > self.garbage_budget).then_some(CloseReason::Garbage(sample))
    }

    /// The connection closed: every request still waiting fails with the failure its
    /// reason implies (in id order), and later requests are refused.
    pub fn close(&mut self, reason: CloseReason) -> Vec<(T, RpcFailure)> {
        let failure = reason.failure();
        if self.closed.is_none() {
            self.closed = Some(reason);
        }
        std::mem::take(&mut self.pending)
            .into_values()
            .map(|tag| (tag, failure.clone()))
            .collect()
    }

    /// Counts an event that had no receiver.
    pub fn lost_event(&mut self) {
        self.stats.events_without_receiver += 1;
    }
}

/// The length of `line` without a trailing `\r`; `None` for a blank line.
fn content(line: &[u8]) -> Option<usize> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    (!line.iter().all(u8::is_ascii_whitespace)).then_some(line.len())
}

/// The first [`GARBAGE_SAMPLE_BYTES`] bytes of a line, lossily decoded.
pub fn sample(line: &[u8]) -> String {
    let cut = line.len().min(GARBAGE_SAMPLE_BYTES);
    String::from_utf8_lossy(&line[..cut]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonrpc::{encode_notification, encode_response, RpcError};
    use serde_json::{json, Value};

    #[test]
    fn answers_reach_their_request_by_id_and_late_ones_are_named_late() {
        let mut wire: Wire<&str> = Wire::new(0);
        let (first, line) = wire
            .request("initialize", &Params::Tree(json!({})), "init")
            .unwrap();
        assert!(line.ends_with('\n') && line.contains("\"id\":1"));
        let (second, _) = wire
            .request("session/new", &Params::Tree(json!({})), "new")
            .unwrap();
        let answer = encode_response(&RequestId::Number(second), &Ok(json!({"sessionId": "s"})));
        assert_eq!(
            wire.receive(answer.trim_end().as_bytes()),
            Incoming::Reply {
                tag: "new",
                result: Ok(RawJson::from_value(&json!({"sessionId": "s"})))
            }
        );
        assert_eq!(wire.abandon(first), Some("init"));
        let late = encode_response::<Value>(
            &RequestId::Number(first),
            &Err(RpcError::new(-32603, "Internal error")),
        );
        assert_eq!(
            wire.receive(late.trim_end().as_bytes()),
            Incoming::Event(AgentEvent::Anomaly(Anomaly::LateResponse { id: first }))
        );
        assert_eq!(wire.stats().late_responses, 1);
        assert_eq!(wire.pending(), 0);
    }

    #[test]
    fn closing_fails_every_waiting_request_and_refuses_new_ones() {
        let mut wire: Wire<u8> = Wire::new(0);
        wire.request("a", &Params::Tree(json!(null)), 1).unwrap();
        wire.request("b", &Params::Tree(json!(null)), 2).unwrap();
        let failed = wire.close(CloseReason::StdoutClosed);
        assert_eq!(
            failed,
            vec![
                (1, RpcFailure::TransportClosed),
                (2, RpcFailure::TransportClosed)
            ]
        );
        assert_eq!(
            wire.request("c", &Params::Tree(json!(null)), 3),
            Err((3, RpcFailure::TransportClosed))
        );
    }

    #[test]
    fn garbage_past_the_budget_closes_the_connection() {
        let mut wire: Wire<()> = Wire::new(1);
        let note = encode_notification("session/update", &json!({"sessionId": "s"}));
        assert!(matches!(
            wire.receive(note.trim_end().as_bytes()),
            Incoming::Event(AgentEvent::Update { wire_bytes, .. }) if wire_bytes == note.len()
        ));
        let Incoming::Event(first) = wire.receive(b"not json") else {
            panic!("garbage is an event")
        };
        assert_eq!(wire.spend(&first), None);
        let Incoming::Event(second) = wire.receive(b"[1]") else {
            panic!("garbage is an event")
        };
        assert_eq!(
            wire.spend(&second),
            Some(CloseReason::Garbage("[1]".into()))
        );
        assert_eq!(wire.receive(b"   "), Incoming::Nothing);
    }
}
