//! What the supervisor tells its caller: [`SessionEvent`]s, in order per session.
//!
//! Output of a turn ([`SessionEvent::Output`]) always precedes that turn's
//! [`SessionEvent::TurnEnded`]; output seq numbers are contiguous per turn from 1, also
//! across recoveries (the core numbers them), so a caller can check with
//! [`palisade_core::delivery::InOrderReceiver`] that nothing was lost or repeated.

use palisade_core::classify::ClassifyReason;
use palisade_core::delivery::EventKind;
use palisade_core::{
    AttemptId, AttemptOutcome, ExecutionId, Generation, NewConversationReason, RecoveryFailure,
    SessionId, Timestamp, TurnId, TurnOutcome,
};
use serde_json::{json, Value};

use palisade_wire::connection::{CloseReason, ProcessExit, RpcFailure};
use palisade_wire::jsonrpc::{JsonStr, RawJson};
use serde_json::value::RawValue;

/// What a prompt asks: a text (`palisade-supervise`), or the content blocks a client sent
/// (`palisade-proxy`), passed to the agent as they came. Written as a JSON string or as the
/// blocks' array.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum PromptContent {
    /// One text block.
    Text(String),
    /// A JSON array of ACP content blocks.
    Blocks(RawJson),
}

impl<'de> serde::Deserialize<'de> for PromptContent {
    /// Read as raw JSON first: an untagged enum buffers its input, and raw JSON (the blocks)
    /// cannot be read back from that buffer, so a state file holding a client's prompt
    /// could not be restored.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawJson::deserialize(deserializer)?;
        if raw.get().starts_with('"') {
            let text: String = raw.parse().map_err(serde::de::Error::custom)?;
            return Ok(PromptContent::Text(text));
        }
        Ok(PromptContent::Blocks(raw))
    }
}

impl PromptContent {
    /// Its size as it is kept (and persisted) until its turn ends.
    #[must_use]
    pub fn bytes(&self) -> usize {
        match self {
            PromptContent::Text(text) => text.len(),
            PromptContent::Blocks(blocks) => blocks.get().len(),
        }
    }
}

/// One streamed `session/update` of a turn, as the caller receives it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OutputEvent {
    /// Caller sequence number: contiguous per turn from 1, across recoveries.
    pub seq: u64,
    /// What it carries (from `update.sessionUpdate`).
    pub kind: EventKind,
    /// The `update` object as the agent wrote it (raw JSON); unknown kinds pass through
    /// untouched.
    pub update: RawJson,
}

/// How the conversation of a runtime came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ConversationOrigin {
    /// `session/load` of the session's existing conversation succeeded.
    Loaded,
    /// `session/new`, for a session that never had a conversation.
    Created,
    /// `session/new` replacing a conversation that provably cannot be loaded.
    Replaced(ClassifyReason),
}

/// Why a runtime failed; attached to [`SessionEvent::FailureReported`] and
/// [`SessionEvent::RuntimeExited`]. Closed: each variant names who is at fault.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FailureCause {
    /// The agent program could not be started.
    Spawn(String),
    /// `initialize` failed.
    Initialize(RpcFailure),
    /// `session/new` failed.
    NewSession(RpcFailure),
    /// `session/new` answered without a string `sessionId`.
    NewSessionAnswer(String),
    /// `session/load` failed and the failure proves nothing (or the transport died).
    Load(RpcFailure),
    /// The supervisor had no conversation id for the token the core asked to load (a
    /// state file written by something else).
    UnknownConversation,
    /// The connection to the agent ended.
    Connection(CloseReason),
    /// A prompt got neither an answer nor a notification for this long.
    PromptIdle {
        /// The configured idle timeout.
        idle_ms: u64,
    },
    /// The prompt request itself failed (a JSON-RPC error from the agent).
    Prompt(RpcFailure),
    /// The supervisor restarted; the runtime died with the previous incarnation.
    SupervisorRestarted,
    /// A deadline the core enforces itself (start deadline, an expired lease).
    CoreDeadline,
}

impl std::fmt::Display for FailureCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FailureCause::Spawn(error) => write!(f, "agent could not start: {error}"),
            FailureCause::Initialize(failure) => write!(f, "initialize failed: {failure}"),
            FailureCause::NewSession(failure) => write!(f, "session/new failed: {failure}"),
            FailureCause::NewSessionAnswer(answer) => {
                write!(f, "session/new answered without a sessionId: {answer}")
            }
            FailureCause::Load(failure) => write!(f, "session/load failed: {failure}"),
            FailureCause::UnknownConversation => f.write_str("no conversation id for the token"),
            FailureCause::Connection(reason) => write!(f, "agent connection ended: {reason:?}"),
            FailureCause::PromptIdle { idle_ms } => {
                write!(f, "prompt silent for {idle_ms} ms; agent presumed wedged")
            }
            FailureCause::Prompt(failure) => write!(f, "session/prompt failed: {failure}"),
            FailureCause::SupervisorRestarted => f.write_str("supervisor restarted"),
            FailureCause::CoreDeadline => f.write_str("a core deadline passed"),
        }
    }
}

/// Something that happened to a session. Delivered in order per session.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum SessionEvent {
    /// An agent process was started for an attempt and bound to an execution.
    RuntimeStarted {
        /// The session.
        session: SessionId,
        /// The execution the supervisor allocated.
        execution: ExecutionId,
        /// The attempt it serves.
        attempt: AttemptId,
        /// The generation the core bound.
        generation: Generation,
        /// The agent's process id (`None` if it could not be started).
        pid: Option<u32>,
    },
    /// `session/load` was sent.
    ConversationLoading {
        /// The session.
        session: SessionId,
        /// The runtime loading it.
        execution: ExecutionId,
        /// The ACP session id being loaded.
        conversation: String,
    },
    /// The runtime's conversation is ready (the prompt follows, if one waits).
    ConversationReady {
        /// The session.
        session: SessionId,
        /// The runtime.
        execution: ExecutionId,
        /// The ACP session id.
        conversation: String,
        /// Loaded, created, or created to replace an unloadable one.
        origin: ConversationOrigin,
        /// The agent's answer to the `session/load` or `session/new` that made it (its
        /// modes, models, config options), as the agent wrote it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answer: Option<RawJson>,
    },
    /// A batch of a turn's streamed output, in order.
    Output {
        /// The session.
        session: SessionId,
        /// The turn.
        turn: TurnId,
        /// The events; never empty.
        events: Vec<OutputEvent>,
    },
    /// The turn ended: exactly one per turn.
    TurnEnded {
        /// The session.
        session: SessionId,
        /// The turn.
        turn: TurnId,
        /// How.
        outcome: TurnOutcome,
        /// The agent's `stopReason`, when it answered the prompt.
        stop_reason: Option<String>,
        /// Why a turn that did not complete ended: what the supervisor saw go wrong last
        /// (a prompt's JSON-RPC error, the runtime's death, a deadline). `None` for a
        /// completed or cancelled turn.
        cause: Option<FailureCause>,
    },
    /// The runtime died under an accepted turn; a replacement starts at `at`.
    RecoveryStarted {
        /// The session.
        session: SessionId,
        /// The turn.
        turn: TurnId,
        /// 1-based step of the schedule.
        step: u32,
        /// When the replacement starts (supervisor clock).
        at: Timestamp,
    },
    /// Recovery of the turn gave up (the turn's `TurnEnded` follows).
    RecoveryExhausted {
        /// The session.
        session: SessionId,
        /// The turn.
        turn: TurnId,
    },
    /// A recovery failure to show the user (rule 10).
    FailureReported {
        /// The session.
        session: SessionId,
        /// Its identity: attempt, execution, error stamp.
        failure: RecoveryFailure,
        /// What the supervisor saw.
        cause: FailureCause,
    },
    /// An attempt settled (answers `resume` joiners).
    AttemptSettled {
        /// The session.
        session: SessionId,
        /// The attempt.
        attempt: AttemptId,
        /// How it ended.
        outcome: AttemptOutcome,
    },
    /// Joiners of an attempt waited past the join deadline.
    JoinTimedOut {
        /// The session.
        session: SessionId,
        /// The attempt.
        attempt: AttemptId,
    },
    /// A `session/update` of the session's current conversation that is no turn's output
    /// (its available commands, mode, title, plan before a prompt), in order with the
    /// session's other events. Only when a client stands behind the caller
    /// ([`ClientSide::Forward`](crate::ClientSide::Forward)).
    Update {
        /// The session.
        session: SessionId,
        /// The `update` object as the agent wrote it.
        update: RawJson,
    },
    /// History the agent replays while loading the session's conversation, for a caller
    /// that asked for it ([`Engine::open`](crate::Engine::open)); before the
    /// `ConversationReady` of that load.
    History {
        /// The session.
        session: SessionId,
        /// The `update` object as the agent wrote it.
        update: RawJson,
    },
    /// The session's agent asks its client something (`session/request_permission`,
    /// `fs/*`, `terminal/*`): answer with
    /// [`Engine::answer_client_request`](crate::Engine::answer_client_request) and the
    /// ticket. The answer reaches only the execution that asked, and only while it runs
    /// (a retired one's request is never shown). Not kept across a restart: the asking
    /// process dies with the shell.
    ClientRequest {
        /// The session.
        session: SessionId,
        /// What the answer must name.
        ticket: u64,
        /// The method.
        method: String,
        /// The params as the agent wrote them (its `sessionId` is the agent's own).
        params: RawJson,
    },
    /// The answer to a request forwarded to the session's agent
    /// ([`Engine::forward`](crate::Engine::forward)). Not kept across a restart.
    Forwarded {
        /// The session.
        session: SessionId,
        /// The ticket `forward` returned.
        ticket: u64,
        /// The agent's answer, or why there is none.
        result: Result<RawJson, RpcFailure>,
    },
    /// An agent process is gone and reaped.
    RuntimeExited {
        /// The session.
        session: SessionId,
        /// The execution.
        execution: ExecutionId,
        /// Its exit status, if it was reaped in time (`None` for one never started).
        status: Option<ProcessExit>,
        /// Why its connection ended, when it had one.
        reason: Option<CloseReason>,
    },
}

impl SessionEvent {
    /// The session the event belongs to.
    #[must_use]
    pub fn session(&self) -> SessionId {
        match self {
            SessionEvent::RuntimeStarted { session, .. }
            | SessionEvent::ConversationLoading { session, .. }
            | SessionEvent::ConversationReady { session, .. }
            | SessionEvent::Output { session, .. }
            | SessionEvent::TurnEnded { session, .. }
            | SessionEvent::RecoveryStarted { session, .. }
            | SessionEvent::RecoveryExhausted { session, .. }
            | SessionEvent::FailureReported { session, .. }
            | SessionEvent::AttemptSettled { session, .. }
            | SessionEvent::JoinTimedOut { session, .. }
            | SessionEvent::Update { session, .. }
            | SessionEvent::History { session, .. }
            | SessionEvent::ClientRequest { session, .. }
            | SessionEvent::Forwarded { session, .. }
            | SessionEvent::RuntimeExited { session, .. } => *session,
        }
    }

    /// Whether the event is kept in the state until the caller took it (false for what
    /// only the running process can act on: a client request of one of its agents, the
    /// answer to a forwarded request).
    #[must_use]
    pub fn survives_restart(&self) -> bool {
        !matches!(
            self,
            SessionEvent::ClientRequest { .. } | SessionEvent::Forwarded { .. }
        )
    }

    /// A short name, e.g. `turn_ended`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            SessionEvent::RuntimeStarted { .. } => "runtime_started",
            SessionEvent::ConversationLoading { .. } => "conversation_loading",
            SessionEvent::ConversationReady { .. } => "conversation_ready",
            SessionEvent::Output { .. } => "output",
            SessionEvent::TurnEnded { .. } => "turn_ended",
            SessionEvent::RecoveryStarted { .. } => "recovery_started",
            SessionEvent::RecoveryExhausted { .. } => "recovery_exhausted",
            SessionEvent::FailureReported { .. } => "failure_reported",
            SessionEvent::AttemptSettled { .. } => "attempt_settled",
            SessionEvent::JoinTimedOut { .. } => "join_timed_out",
            SessionEvent::Update { .. } => "update",
            SessionEvent::History { .. } => "history",
            SessionEvent::ClientRequest { .. } => "client_request",
            SessionEvent::Forwarded { .. } => "forwarded",
            SessionEvent::RuntimeExited { .. } => "runtime_exited",
        }
    }

    /// The event as the text of one JSON object (`{"event": name, "session": "n", ...}`),
    /// as `palisade-supervise` prints it. An output event's updates are written as the
    /// agent wrote them, not read into a tree and written again (a tree cannot hold every
    /// number JSON can).
    ///
    /// Every ID is a string (`"7"`; attempts as `"epoch.seq"`): IDs are 64-bit, and a
    /// JSON number above 2^53 is read wrong by JavaScript and by any parser that goes
    /// through an `f64` (error stamps minted by the core have bit 63 set). The numbers that
    /// remain are at most 2^53 by construction: `step` and `pid` are 32-bit;
    /// `seq` counts one turn's output events; `at_ms` is milliseconds on the supervisor's
    /// wall-clock-based clock (2^53 ms is 285,000 years).
    #[must_use]
    pub fn to_json(&self) -> String {
        /// The members of the event, then an output's updates.
        #[derive(serde::Serialize)]
        struct Line<'a> {
            #[serde(flatten)]
            members: Value,
            #[serde(skip_serializing_if = "Option::is_none")]
            events: Option<Vec<Shown<'a>>>,
            /// An update, a request's params or an answer, as the agent wrote it.
            #[serde(skip_serializing_if = "Option::is_none")]
            update: Option<&'a RawValue>,
            #[serde(skip_serializing_if = "Option::is_none")]
            params: Option<&'a RawValue>,
            #[serde(skip_serializing_if = "Option::is_none")]
            result: Option<&'a RawValue>,
        }
        /// One output event.
        #[derive(serde::Serialize)]
        struct Shown<'a> {
            seq: u64,
            kind: String,
            update: &'a RawValue,
        }
        let mut object = json!({"event": self.name(), "session": id(self.session().get())});
        let fields = match self {
            SessionEvent::RuntimeStarted {
                execution,
                attempt,
                generation,
                pid,
                ..
            } => json!({
                "execution": id(execution.get()),
                "attempt": attempt.to_string(),
                "generation": id(generation.get()),
                "pid": pid,
            }),
            SessionEvent::ConversationLoading {
                execution,
                conversation,
                ..
            } => json!({"execution": id(execution.get()), "conversation": conversation}),
            SessionEvent::ConversationReady {
                execution,
                conversation,
                origin,
                ..
            } => json!({
                "execution": id(execution.get()),
                "conversation": conversation,
                "origin": match origin {
                    ConversationOrigin::Loaded => "loaded".to_owned(),
                    ConversationOrigin::Created => "created".to_owned(),
                    ConversationOrigin::Replaced(reason) => format!("replaced ({reason:?})"),
                },
            }),
            SessionEvent::Output { turn, .. } => json!({"turn": id(turn.get())}),
            SessionEvent::TurnEnded {
                turn,
                outcome,
                stop_reason,
                cause,
                ..
            } => json!({
                "turn": id(turn.get()),
                "outcome": format!("{outcome:?}"),
                "stop_reason": stop_reason,
                "cause": cause.as_ref().map(ToString::to_string),
            }),
            SessionEvent::RecoveryStarted { turn, step, at, .. } => {
                json!({"turn": id(turn.get()), "step": step, "at_ms": at.as_millis()})
            }
            SessionEvent::RecoveryExhausted { turn, .. } => json!({"turn": id(turn.get())}),
            SessionEvent::FailureReported { failure, cause, .. } => json!({
                "attempt": failure.attempt.to_string(),
                "execution": failure.execution.map(|x| id(x.get())),
                "stamp": id(failure.stamp.get()),
                "cause": cause.to_string(),
            }),
            SessionEvent::AttemptSettled {
                attempt, outcome, ..
            } => json!({"attempt": attempt.to_string(), "outcome": format!("{outcome:?}")}),
            SessionEvent::JoinTimedOut { attempt, .. } => json!({"attempt": attempt.to_string()}),
            SessionEvent::RuntimeExited {
                execution,
                status,
                reason,
                ..
            } => json!({
                "execution": id(execution.get()),
                "status": status.map(|s| format!("{s:?}")),
                "reason": reason.as_ref().map(|r| format!("{r:?}")),
            }),
            SessionEvent::Update { .. } | SessionEvent::History { .. } => json!({}),
            SessionEvent::ClientRequest { ticket, method, .. } => {
                json!({"ticket": id(*ticket), "method": method})
            }
            SessionEvent::Forwarded { ticket, result, .. } => json!({
                "ticket": id(*ticket),
                "error": result.as_ref().err().map(ToString::to_string),
            }),
        };
        if let (Some(object), Value::Object(fields)) = (object.as_object_mut(), fields) {
            object.extend(fields);
        }
        let events = match self {
            SessionEvent::Output { events, .. } => Some(
                events
                    .iter()
                    .map(|e| Shown {
                        seq: e.seq,
                        kind: format!("{:?}", e.kind),
                        update: e.update.raw(),
                    })
                    .collect(),
            ),
            _ => None,
        };
        let (update, params, result) = match self {
            SessionEvent::Update { update, .. } | SessionEvent::History { update, .. } => {
                (Some(update.raw()), None, None)
            }
            SessionEvent::ClientRequest { params, .. } => (None, Some(params.raw()), None),
            SessionEvent::Forwarded {
                result: Ok(answer), ..
            } => (None, None, Some(answer.raw())),
            _ => (None, None, None),
        };
        serde_json::to_string(&Line {
            members: object,
            events,
            update,
            params,
            result,
        })
        .expect("an event's members are strings, numbers and raw JSON")
    }
}

/// A 64-bit ID as JSON: a string, so no reader rounds it (see [`SessionEvent::to_json`]).
fn id(raw: u64) -> Value {
    Value::String(raw.to_string())
}

/// How the core named a `session/new`, as the caller sees it.
pub(crate) fn origin_of(reason: NewConversationReason) -> ConversationOrigin {
    match reason {
        NewConversationReason::First => ConversationOrigin::Created,
        NewConversationReason::Fallback(reason) => ConversationOrigin::Replaced(reason),
    }
}

/// Whether a `session/update` describes the session's own state rather than a turn's
/// output: the commands it offers, its mode, its configuration, its title. Agents send
/// these whenever they change, unprompted (claude-agent-acp and codex-acp send
/// `available_commands_update` right after `session/new`), so they are never a turn's
/// output nor a sign that the agent took a prompt.
pub(crate) fn is_session_state(head: &UpdateHead<'_>) -> bool {
    matches!(
        head.kind.as_ref().map(JsonStr::as_str),
        Some(
            "available_commands_update"
                | "current_mode_update"
                | "config_option_update"
                | "session_info_update"
        )
    )
}

/// What the mutant `update-scan-misreads-escapes` reads of a `session/update`'s params: the
/// session id, and the `update`, borrowed from the params' text.
#[cfg(feature = "mutants")]
#[derive(Debug, Default)]
pub(crate) struct UpdateParams<'a> {
    pub(crate) session_id: Option<std::borrow::Cow<'a, str>>,
    pub(crate) update: Option<&'a RawValue>,
}

#[cfg(feature = "mutants")]
impl<'a> UpdateParams<'a> {
    /// Mutant `update-scan-misreads-escapes` (issue 29, class 5): what a hand-written
    /// reader of the params, in place of serde, makes of them. It walks the members one by
    /// one, keeping each it reads, and finds where a string ends with the classic mistake:
    /// a `"` after a `\` is escaped, even when that backslash is itself escaped (`\\"`
    /// is an escaped backslash, then the closing quote). A string that ends in a backslash
    /// (a Windows path) runs on past its end, the `update` holding it has no end, and the
    /// update is lost: the session id read before it stays, so the turn's output event
    /// carries `null`.
    #[cfg(feature = "mutants")]
    pub(crate) fn scanned(params: &'a RawJson) -> UpdateParams<'a> {
        let text = params.get();
        let mut out = UpdateParams::default();
        let mut at = skip_blank(text, 0);
        if !text[at..].starts_with('{') {
            return out;
        }
        at += 1;
        loop {
            at = skip_blank(text, at);
            let Some(key_end) = naive_string_end(text, at) else {
                return out;
            };
            let key = &text[at + 1..key_end - 1];
            at = skip_blank(text, key_end);
            if !text[at..].starts_with(':') {
                return out;
            }
            at = skip_blank(text, at + 1);
            let Some(value_end) = naive_value_end(text, at) else {
                return out;
            };
            let value = &text[at..value_end];
            match key {
                "sessionId" => out.session_id = serde_json::from_str(value).ok(),
                "update" => out.update = serde_json::from_str(value).ok(),
                _ => {}
            }
            at = skip_blank(text, value_end);
            match text.as_bytes().get(at) {
                Some(b',') => at += 1,
                _ => return out,
            }
        }
    }
}

/// The first byte at or after `at` that is not JSON whitespace.
#[cfg(feature = "mutants")]
fn skip_blank(text: &str, mut at: usize) -> usize {
    while matches!(text.as_bytes().get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// Where the string that starts at `at` ends (after its closing quote), as the buggy
/// scanner sees it: a quote right after a backslash never closes it.
#[cfg(feature = "mutants")]
fn naive_string_end(text: &str, at: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    (at + 1..bytes.len())
        .find(|&i| bytes[i] == b'"' && bytes[i - 1] != b'\\')
        .map(|i| i + 1)
}

/// Where the value that starts at `at` ends: a string, an object or array (brackets
/// counted outside strings), or a literal up to the next delimiter.
#[cfg(feature = "mutants")]
fn naive_value_end(text: &str, at: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    match bytes.get(at)? {
        b'"' => naive_string_end(text, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            while i < bytes.len() {
                match bytes[i] {
                    b'"' => {
                        i = naive_string_end(text, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => Some(
            (at..bytes.len())
                .find(|&i| matches!(bytes[i], b',' | b'}' | b']' | b' ' | b'\n'))
                .unwrap_or(bytes.len()),
        ),
    }
}

/// What the engine reads of a `session/update`'s `update`: its kind and its content's
/// type, borrowed from the raw text (everything else is skipped, not built).
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct UpdateHead<'a> {
    #[serde(rename = "sessionUpdate", borrow, default)]
    pub(crate) kind: Option<JsonStr<'a>>,
    #[serde(borrow, default)]
    content: Option<ContentHead<'a>>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ContentHead<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<JsonStr<'a>>,
}

impl<'a> UpdateHead<'a> {
    /// The head of a raw `update`; none if it is not an object of that shape.
    pub(crate) fn of(update: &'a RawValue) -> UpdateHead<'a> {
        serde_json::from_str(update.get()).unwrap_or_default()
    }
}

/// `update.sessionUpdate` → [`EventKind`]. Resource content in a message chunk counts as
/// a resource; anything unknown is `Other` (and still delivered).
pub(crate) fn kind_of(head: &UpdateHead<'_>) -> EventKind {
    match head.kind.as_ref().map(JsonStr::as_str) {
        Some("agent_message_chunk") => {
            match head
                .content
                .as_ref()
                .and_then(|c| c.kind.as_ref().map(JsonStr::as_str))
            {
                Some("resource" | "resource_link") => EventKind::Resource,
                _ => EventKind::Text,
            }
        }
        Some("agent_thought_chunk") => EventKind::Thought,
        Some("tool_call") => EventKind::ToolCall,
        Some("tool_call_update") => EventKind::ToolUpdate,
        Some("plan") => EventKind::Plan,
        _ => EventKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_wire::acp::SessionUpdate;

    /// A prompt's content reads back as it was written, alone and inside a record (as the
    /// state file keeps it): a client's blocks (raw JSON) too.
    #[test]
    fn prompt_content_reads_back_what_it_wrote() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Kept {
            turn: u64,
            content: Option<PromptContent>,
        }
        let blocks =
            RawJson::from_text(r#"[{"type":"text","text":"fix the \"build\""}]"#).expect("json");
        for content in [
            PromptContent::Text("fix the \"build\"\n".into()),
            PromptContent::Blocks(blocks),
        ] {
            let kept = Kept {
                turn: 3,
                content: Some(content.clone()),
            };
            let text = serde_json::to_string(&kept).expect("writes");
            let back: Kept = serde_json::from_str(&text).expect("reads back");
            assert_eq!(back, kept, "{text}");
            let alone: PromptContent =
                serde_json::from_str(&serde_json::to_string(&content).expect("writes"))
                    .expect("reads back");
            assert_eq!(alone, content);
        }
    }

    /// The scanner of mutant `update-scan-misreads-escapes` reads what serde reads from
    /// params whose strings end in no backslash, escaped quotes and all, and loses the
    /// update (keeping the session id) when a string in it ends in one.
    #[cfg(feature = "mutants")]
    #[test]
    fn the_update_scanner_mutant_loses_updates_that_end_a_string_in_a_backslash() {
        for text in [
            r#"{"sessionId":"s-1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"say \"hi\" {\u00e9} [x]"}}}"#,
            r#" { "sessionId" : "s-1" , "update" : {"sessionUpdate":"tool_call","rawInput":{"a":[1,{"b":null}],"c":true}} } "#,
            r#"{"update":{"sessionUpdate":"plan"},"sessionId":"s\u0031"}"#,
        ] {
            let params = RawJson::from_text(text).expect("json");
            let (of, scanned) = (
                SessionUpdate::of(params.raw()),
                UpdateParams::scanned(&params),
            );
            assert_eq!(
                of.session_id.as_deref(),
                scanned.session_id.as_deref(),
                "{text}"
            );
            assert_eq!(
                of.update.as_ref().map(RawJson::get),
                scanned.update.map(RawValue::get),
                "{text}"
            );
        }
        let params = RawJson::from_text(
            r#"{"sessionId":"s-1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"m#1 C:\\Users\\"}}}"#,
        )
        .expect("json");
        let of = SessionUpdate::of(params.raw());
        assert!(of.update.is_some());
        let scanned = UpdateParams::scanned(&params);
        assert_eq!(scanned.session_id.as_deref(), Some("s-1"));
        assert!(scanned.update.is_none());
    }

    /// The largest integer every JSON reader keeps exactly (an `f64` mantissa).
    const EXACT_IN_F64: u64 = 1 << 53;

    /// Every integer in `value`, with where it is.
    fn integers(value: &Value, at: &str, out: &mut Vec<(String, u64)>) {
        match value {
            Value::Number(n) => out.push((at.to_owned(), n.as_u64().unwrap_or(u64::MAX))),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    integers(item, &format!("{at}[{i}]"), out);
                }
            }
            Value::Object(fields) => {
                for (name, field) in fields {
                    integers(field, &format!("{at}.{name}"), out);
                }
            }
            _ => {}
        }
    }

    /// One event of every kind, every ID at its largest.
    fn every_event_with_huge_ids() -> Vec<SessionEvent> {
        use palisade_core::{AttemptOutcome, ErrorStamp};
        let session = SessionId::new(u64::MAX).unwrap();
        let execution = ExecutionId::new(u64::MAX).unwrap();
        let turn = TurnId::new(u64::MAX).unwrap();
        let attempt = AttemptId::from_raw(u64::MAX).unwrap();
        let generation = Generation::new(u64::MAX).unwrap();
        let failure = RecoveryFailure {
            attempt,
            execution: Some(execution),
            stamp: ErrorStamp::new((1 << 63) | 1).unwrap(),
        };
        vec![
            SessionEvent::RuntimeStarted {
                session,
                execution,
                attempt,
                generation,
                pid: Some(u32::MAX),
            },
            SessionEvent::ConversationLoading {
                session,
                execution,
                conversation: "c".into(),
            },
            SessionEvent::ConversationReady {
                session,
                execution,
                conversation: "c".into(),
                origin: ConversationOrigin::Loaded,
                answer: None,
            },
            SessionEvent::Output {
                session,
                turn,
                events: vec![OutputEvent {
                    seq: 1,
                    kind: EventKind::Text,
                    update: RawJson::from_value(&json!({})),
                }],
            },
            SessionEvent::TurnEnded {
                session,
                turn,
                outcome: TurnOutcome::Completed,
                stop_reason: None,
                cause: None,
            },
            SessionEvent::RecoveryStarted {
                session,
                turn,
                step: u32::MAX,
                at: Timestamp::from_millis(1_795_953_231_388),
            },
            SessionEvent::RecoveryExhausted { session, turn },
            SessionEvent::FailureReported {
                session,
                failure,
                cause: FailureCause::CoreDeadline,
            },
            SessionEvent::AttemptSettled {
                session,
                attempt,
                outcome: AttemptOutcome::Ready,
            },
            SessionEvent::JoinTimedOut { session, attempt },
            SessionEvent::RuntimeExited {
                session,
                execution,
                status: None,
                reason: None,
            },
        ]
    }

    #[test]
    fn json_ids_are_strings_and_no_number_exceeds_2_pow_53() {
        let tree = |event: &SessionEvent| -> Value {
            serde_json::from_str(&event.to_json()).expect("an event's line is JSON")
        };
        for event in every_event_with_huge_ids() {
            let json = tree(&event);
            let mut found = Vec::new();
            integers(&json, "", &mut found);
            let too_big: Vec<_> = found.iter().filter(|(_, n)| *n > EXACT_IN_F64).collect();
            assert!(
                too_big.is_empty(),
                "{}: {too_big:?} in {json}",
                event.name()
            );
            assert_eq!(json["session"], json!(u64::MAX.to_string()), "{json}");
        }
        let failure = tree(
            &every_event_with_huge_ids()
                .into_iter()
                .find(|e| e.name() == "failure_reported")
                .unwrap(),
        );
        // What issue 13 saw printed as 9223372036854775809, and JavaScript read as
        // 9223372036854776000.
        assert_eq!(failure["stamp"], json!("9223372036854775809"));
        assert_eq!(failure["execution"], json!(u64::MAX.to_string()));
    }

    #[test]
    fn an_output_line_carries_the_updates_as_the_agent_wrote_them() {
        // A number no tree can hold, and spacing a tree would drop: written as they came.
        let update = r#"{"sessionUpdate":"agent_message_chunk", "n":1e400,"t":"\u00e9"}"#;
        let event = SessionEvent::Output {
            session: SessionId::new(7).unwrap(),
            turn: TurnId::new(3).unwrap(),
            events: vec![OutputEvent {
                seq: 1,
                kind: EventKind::Text,
                update: RawJson::from_text(update).unwrap(),
            }],
        };
        assert_eq!(
            event.to_json(),
            format!(
                r#"{{"event":"output","session":"7","turn":"3","events":[{{"seq":1,"kind":"Text","update":{update}}}]}}"#
            )
        );
    }

    #[test]
    fn an_updates_params_and_head_are_read_as_serde_reads_them() {
        let params = RawJson::from_text(
            r#"{"sessionId":"s\u0031","update":{"session\u0055pdate":"agent_message_chunk","content":{"type":"resource_link","text":"x"}},"other":[1]}"#,
        )
        .unwrap();
        let parsed = SessionUpdate::of(params.raw());
        assert_eq!(parsed.session_id.as_deref(), Some("s1"));
        let update = parsed.update.expect("an update");
        assert!(update.get().starts_with(r#"{"session\u0055pdate""#));
        assert_eq!(kind_of(&UpdateHead::of(update.raw())), EventKind::Resource);
        // Params that are not of the shape give neither member.
        for text in [
            r#"{"sessionId":"s","update":null}"#,
            r#"{"sessionId":7,"update":{}}"#,
            r#"{"sessionId":"s","sessionId":"t","update":{}}"#,
            r#"[]"#,
            r#""s""#,
        ] {
            let params = RawJson::from_text(text).unwrap();
            assert!(SessionUpdate::of(params.raw()).update.is_none(), "{text}");
        }
        // Nor does a head given twice, or of the wrong type.
        for text in [
            r#"{"sessionUpdate":"plan","sessionUpdate":"plan"}"#,
            r#"{"sessionUpdate":"plan","content":"x"}"#,
            r#"[]"#,
        ] {
            let update = RawJson::from_text(text).unwrap();
            assert_eq!(
                kind_of(&UpdateHead::of(update.raw())),
                EventKind::Other,
                "{text}"
            );
        }
    }

    #[test]
    fn update_kinds_map_to_event_kinds() {
        let kind = |v: Value| {
            let raw = RawJson::from_value(&v);
            kind_of(&UpdateHead::of(raw.raw()))
        };
        assert_eq!(
            kind(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text"}})),
            EventKind::Text
        );
        assert_eq!(
            kind(
                json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "resource_link"}})
            ),
            EventKind::Resource
        );
        assert_eq!(
            kind(json!({"sessionUpdate": "tool_call"})),
            EventKind::ToolCall
        );
        assert_eq!(
            kind(json!({"sessionUpdate": "tool_call_update"})),
            EventKind::ToolUpdate
        );
        assert_eq!(
            kind(json!({"sessionUpdate": "agent_thought_chunk"})),
            EventKind::Thought
        );
        assert_eq!(kind(json!({"sessionUpdate": "plan"})), EventKind::Plan);
        assert_eq!(
            kind(json!({"sessionUpdate": "something_new"})),
            EventKind::Other
        );
        assert_eq!(kind(json!(null)), EventKind::Other);
    }
}
