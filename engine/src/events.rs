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
use palisade_wire::jsonrpc::RawJson;
use palisade_wire::jsonscan::{self, Plain};

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
            | SessionEvent::RuntimeExited { session, .. } => *session,
        }
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
            SessionEvent::RuntimeExited { .. } => "runtime_exited",
        }
    }

    /// The event as one JSON object (`{"event": name, "session": "n", ...}`), as
    /// `palisade-supervise` prints it.
    ///
    /// Every ID is a string (`"7"`; attempts as `"epoch.seq"`): IDs are 64-bit, and a
    /// JSON number above 2^53 is read wrong by JavaScript and by any parser that goes
    /// through an `f64` (error stamps minted by the core have bit 63 set). The numbers that
    /// remain are at most 2^53 by construction: `step` and `pid` are 32-bit;
    /// `seq` counts one turn's output events; `at_ms` is milliseconds on the supervisor's
    /// wall-clock-based clock (2^53 ms is 285,000 years).
    #[must_use]
    pub fn to_json(&self) -> Value {
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
            SessionEvent::Output { turn, events, .. } => json!({
                "turn": id(turn.get()),
                "events": events.iter().map(|e| json!({
                    "seq": e.seq,
                    "kind": format!("{:?}", e.kind),
                    "update": e.update.raw(),
                })).collect::<Vec<_>>(),
            }),
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
        };
        if let (Some(object), Value::Object(fields)) = (object.as_object_mut(), fields) {
            object.extend(fields);
        }
        object
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
        head.kind.as_deref(),
        Some(
            "available_commands_update"
                | "current_mode_update"
                | "config_option_update"
                | "session_info_update"
        )
    )
}

/// What the engine reads of a `session/update`'s params and of its `update`, both borrowed
/// from the params' text: from the spans the frame's validating walk noted
/// ([`jsonscan::UpdateSpans`]) when it noted the plain shape, so the chunk is not walked
/// again; otherwise read afresh ([`UpdateParams::of`], then [`UpdateHead`] of the `update`,
/// or of `null` when there is none). The two readings agree on every input (a proptest
/// checks it).
pub(crate) fn read_update(params: &RawJson) -> (UpdateParams<'_>, UpdateHead<'_>) {
    if let Some(read) = params
        .update_spans()
        .and_then(|spans| read_noted(params.get(), spans))
    {
        return read;
    }
    let parsed = UpdateParams::of(params);
    let head = UpdateHead::of_text(parsed.update.unwrap_or("null"));
    (parsed, head)
}

/// [`read_update`] from noted spans; `None` for anything but the plain shape (an
/// `update` that is not an object, a value of an unexpected kind, a string with escapes).
fn read_noted<'a>(
    text: &'a str,
    spans: &jsonscan::UpdateSpans,
) -> Option<(UpdateParams<'a>, UpdateHead<'a>)> {
    use jsonscan::UpdateSpans as S;
    if spans.unsure {
        return None;
    }
    // A member that serde reads as an optional string: absent or `null` is `None`.
    let string = |which: usize| -> Option<Option<std::borrow::Cow<'a, str>>> {
        match spans.text(text, which)? {
            None => Some(None),
            Some(value) => match jsonscan::plain(value)? {
                Plain::Null => Some(None),
                Plain::Str(s) => Some(Some(std::borrow::Cow::Borrowed(s))),
                Plain::Object(_) => None,
            },
        }
    };
    let update = spans.text(text, S::UPDATE)??;
    if !update.starts_with('{') {
        return None;
    }
    let content = match spans.text(text, S::CONTENT)? {
        None => None,
        Some(value) => match jsonscan::plain(value)? {
            Plain::Null => None,
            Plain::Object(_) => Some(ContentHead {
                kind: string(S::CONTENT_KIND)?,
            }),
            Plain::Str(_) => return None,
        },
    };
    Some((
        UpdateParams {
            session_id: string(S::SESSION_ID)?,
            update: Some(update),
        },
        UpdateHead {
            kind: string(S::KIND)?,
            content,
        },
    ))
}

/// What the engine reads of a `session/update`'s params: the session id, and the text of
/// the `update` (`None` when absent or `null`), borrowed from the params.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct UpdateParams<'a> {
    pub(crate) session_id: Option<std::borrow::Cow<'a, str>>,
    pub(crate) update: Option<&'a str>,
}

impl<'a> UpdateParams<'a> {
    /// The session id and `update` of raw params (neither if the params are not an object
    /// of that shape).
    pub(crate) fn of(params: &'a RawJson) -> UpdateParams<'a> {
        UpdateParams::scan(params.get()).unwrap_or_else(|| UpdateParams::parse(params.get()))
    }

    /// What serde reads: the reference for [`UpdateParams::scan`].
    fn parse(text: &'a str) -> UpdateParams<'a> {
        #[derive(serde::Deserialize)]
        struct Serde<'a> {
            #[serde(rename = "sessionId", borrow, default)]
            session_id: Option<std::borrow::Cow<'a, str>>,
            #[serde(borrow, default)]
            update: Option<&'a serde_json::value::RawValue>,
        }
        serde_json::from_str(text)
            .map(|p: Serde<'a>| UpdateParams {
                session_id: p.session_id,
                update: p.update.map(serde_json::value::RawValue::get),
            })
            .unwrap_or_default()
    }

    /// The params of the plain shape, read without parsing them again (see [`jsonscan`]);
    /// `None` when serde must decide.
    fn scan(text: &'a str) -> Option<UpdateParams<'a>> {
        let mut params = UpdateParams::default();
        let (mut id_seen, mut update_seen) = (false, false);
        for (name, value) in jsonscan::members(text)? {
            match name {
                _ if name.contains('\\') => return None,
                "sessionId" => {
                    if std::mem::replace(&mut id_seen, true) {
                        return None;
                    }
                    params.session_id = match jsonscan::plain(value)? {
                        Plain::Null => None,
                        Plain::Str(id) => Some(std::borrow::Cow::Borrowed(id)),
                        Plain::Object(_) => return None,
                    };
                }
                "update" => {
                    if std::mem::replace(&mut update_seen, true) {
                        return None;
                    }
                    // Serde reads `null` into `None`, and any other value as its text.
                    params.update = (value != "null").then_some(value);
                }
                _ => {}
            }
        }
        Some(params)
    }
}

/// What the engine reads of a `session/update`'s `update`: its kind and its content's
/// type, borrowed from the raw text (everything else is skipped, not parsed).
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct UpdateHead<'a> {
    #[serde(rename = "sessionUpdate", borrow, default)]
    pub(crate) kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<ContentHead<'a>>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ContentHead<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> UpdateHead<'a> {
    /// The head of a raw `update` (an `update` that is not an object has none).
    pub(crate) fn of(update: &'a RawJson) -> UpdateHead<'a> {
        UpdateHead::of_text(update.get())
    }

    /// [`UpdateHead::of`] the text of an `update`.
    fn of_text(text: &'a str) -> UpdateHead<'a> {
        UpdateHead::scan(text).unwrap_or_else(|| UpdateHead::parse(text))
    }

    /// What serde reads: the reference for [`UpdateHead::scan`].
    fn parse(text: &'a str) -> UpdateHead<'a> {
        serde_json::from_str(text).unwrap_or_default()
    }

    /// The head of an `update` of the plain shape, read without parsing it (see
    /// [`jsonscan`]); `None` when serde must decide.
    fn scan(text: &'a str) -> Option<UpdateHead<'a>> {
        let mut head = UpdateHead::default();
        let (mut kind_seen, mut content_seen) = (false, false);
        let mut members = jsonscan::members(text)?;
        while let Some((name, start)) = members.next_name() {
            match name {
                // An escaped name may spell a member's name: serde decides.
                _ if name.contains('\\') => return None,
                "sessionUpdate" => {
                    // A member given twice: serde refuses the whole head, and so do we.
                    if std::mem::replace(&mut kind_seen, true) {
                        return None;
                    }
                    head.kind = match jsonscan::plain(members.value_at(start)?)? {
                        Plain::Null => None,
                        Plain::Str(kind) => Some(std::borrow::Cow::Borrowed(kind)),
                        Plain::Object(_) => return None,
                    };
                }
                "content" => {
                    if std::mem::replace(&mut content_seen, true) {
                        return None;
                    }
                    // An object is walked once, for its head and to find its end.
                    if let Some(mut content) = members.object_at(start) {
                        head.content = Some(ContentHead::scan(&mut content)?);
                        members.resume_after(&content)?;
                        continue;
                    }
                    head.content = match jsonscan::plain(members.value_at(start)?)? {
                        Plain::Null => None,
                        Plain::Object(_) | Plain::Str(_) => return None,
                    };
                }
                _ => {
                    members.value_at(start)?;
                }
            }
        }
        Some(head)
    }
}

impl<'a> ContentHead<'a> {
    /// The head of a content object, read from its members to the end.
    fn scan(members: &mut jsonscan::Members<'a>) -> Option<ContentHead<'a>> {
        let mut content = ContentHead::default();
        let mut kind_seen = false;
        for (name, value) in members.by_ref() {
            if name.contains('\\') {
                return None;
            }
            if name == "type" {
                if std::mem::replace(&mut kind_seen, true) {
                    return None;
                }
                content.kind = match jsonscan::plain(value)? {
                    Plain::Null => None,
                    Plain::Str(kind) => Some(std::borrow::Cow::Borrowed(kind)),
                    Plain::Object(_) => return None,
                };
            }
        }
        Some(content)
    }
}

/// `update.sessionUpdate` → [`EventKind`]. Resource content in a message chunk counts as
/// a resource; anything unknown is `Other` (and still delivered).
pub(crate) fn kind_of(head: &UpdateHead<'_>) -> EventKind {
    match head.kind.as_deref() {
        Some("agent_message_chunk") => {
            match head.content.as_ref().and_then(|c| c.kind.as_deref()) {
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
        for event in every_event_with_huge_ids() {
            let json = event.to_json();
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
        let failure = every_event_with_huge_ids()
            .into_iter()
            .find(|e| e.name() == "failure_reported")
            .unwrap()
            .to_json();
        // What issue 13 saw printed as 9223372036854775809, and JavaScript read as
        // 9223372036854776000.
        assert_eq!(failure["stamp"], json!("9223372036854775809"));
        assert_eq!(failure["execution"], json!(u64::MAX.to_string()));
    }

    /// A JSON value's text from a small alphabet that hits every branch of the head's
    /// reading: the members it looks for, escaped spellings of their names, duplicates,
    /// every kind of value, strings with escapes, nesting, and whitespace.
    fn json_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let ws = prop::sample::select(vec!["", " ", "\n\t ", "\r\n"]);
        let names = prop::sample::select(vec![
            r#""sessionUpdate""#,
            r#""content""#,
            r#""type""#,
            r#""text""#,
            r#""sessionId""#,
            r#""session\u0055pdate""#,
            r#""typ\u0065""#,
            r#""conte\nt""#,
            r#""other""#,
        ]);
        let leaf = prop::sample::select(vec![
            "null",
            "true",
            "-1.5e3",
            "0",
            r#""""#,
            r#""agent_message_chunk""#,
            r#""resource""#,
            r#""resource_link""#,
            r#""tool_call""#,
            r#""available_commands_update""#,
            r#""x \"quoted\" \\ y""#,
            r#""agent_message_chunk\u0000""#,
            r#""\u0072esource""#,
            r#""}]{[,:""#,
        ])
        .prop_map(str::to_owned);
        leaf.prop_recursive(4, 48, 6, move |inner| {
            let member = (names.clone(), ws.clone(), ws.clone(), inner.clone())
                .prop_map(|(n, a, b, v)| format!("{n}{a}:{b}{v}"));
            prop_oneof![
                (prop::collection::vec(member, 0..6), ws.clone())
                    .prop_map(|(ms, w)| format!("{{{w}{}{w}}}", ms.join(&format!("{w},{w}")))),
                prop::collection::vec(inner, 0..3).prop_map(|vs| format!("[{}]", vs.join(","))),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// The head read without serde is serde's head, whenever it answers at all; and
        /// it answers for the plain shape agents write.
        #[test]
        fn the_scanned_head_is_serdes_head(text in json_text()) {
            let raw: Box<serde_json::value::RawValue> =
                serde_json::from_str(&text).expect("the generator writes JSON");
            let update = RawJson::from(&*raw);
            let got = |h: &UpdateHead<'_>| {
                (
                    h.kind.as_deref().map(str::to_owned),
                    h.content.as_ref().map(|c| c.kind.as_deref().map(str::to_owned)),
                )
            };
            let parsed = got(&UpdateHead::parse(&text));
            if let Some(scanned) = UpdateHead::scan(&text) {
                proptest::prop_assert_eq!(&got(&scanned), &parsed, "{}", text);
            }
            proptest::prop_assert_eq!(&got(&UpdateHead::of(&update)), &parsed, "{}", text);
        }

        /// The params read without serde are serde's, whenever the scan answers at all.
        #[test]
        fn the_scanned_params_are_serdes_params(text in params_text()) {
            let raw: Box<serde_json::value::RawValue> =
                serde_json::from_str(&text).expect("the generator writes JSON");
            let params = RawJson::from(&*raw);
            let parsed = UpdateParams::parse(&text);
            if let Some(scanned) = UpdateParams::scan(&text) {
                proptest::prop_assert_eq!(&scanned, &parsed, "{}", text);
            }
            proptest::prop_assert_eq!(&UpdateParams::of(&params), &parsed, "{}", text);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// A framed `session/update` read from the spans its frame's walk noted is what
        /// serde reads of its params and then of its `update` (or of `null`), on lines the
        /// walk validates (no tabs or newlines: those lines are framed by serde).
        #[test]
        fn the_noted_reading_of_a_framed_update_is_serdes(text in params_text()) {
            let text = text.replace(['\n', '\t', '\r'], " ");
            let line = format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{text}}}"#);
            let Ok(palisade_wire::jsonrpc::Frame::Notification { params, .. }) =
                palisade_wire::jsonrpc::parse_frame(line.as_bytes())
            else {
                return Err(proptest::test_runner::TestCaseError::fail(line));
            };
            let parsed = UpdateParams::parse(&text);
            let head = UpdateHead::parse(parsed.update.unwrap_or("null"));
            let got = |(p, h): &(UpdateParams<'_>, UpdateHead<'_>)| {
                (
                    p.session_id.as_deref().map(str::to_owned),
                    p.update.map(str::to_owned),
                    h.kind.as_deref().map(str::to_owned),
                    h.content.as_ref().map(|c| c.kind.as_deref().map(str::to_owned)),
                )
            };
            if let Some(spans) = params.update_spans() {
                if let Some(noted) = read_noted(params.get(), spans) {
                    proptest::prop_assert_eq!(got(&noted), got(&(parsed, head)), "{}", text);
                }
            }
            let parsed = UpdateParams::parse(&text);
            let head = UpdateHead::parse(parsed.update.unwrap_or("null"));
            proptest::prop_assert_eq!(
                got(&read_update(&params)),
                got(&(parsed, head)),
                "{}",
                text
            );
        }
    }

    #[test]
    fn a_framed_chunk_is_read_from_the_spans_its_frame_noted() {
        let line = br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"resource_link","text":"e1.1#1 {\"x\"}"}}}}"#;
        let Ok(palisade_wire::jsonrpc::Frame::Notification { params, .. }) =
            palisade_wire::jsonrpc::parse_frame(line)
        else {
            panic!("a notification");
        };
        let spans = params
            .update_spans()
            .expect("the walk noted the plain shape");
        let (parsed, head) = read_noted(params.get(), spans).expect("read from the spans");
        assert_eq!(parsed.session_id.as_deref(), Some("s1"));
        assert_eq!(
            parsed.update,
            Some(
                r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"resource_link","text":"e1.1#1 {\"x\"}"}}"#
            )
        );
        assert_eq!(kind_of(&head), EventKind::Resource);
        // A duplicate or an escaped name at a level read is left to the full reading.
        for line in [
            br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"plan","sessionUpdate":"tool_call"}}}"#.as_slice(),
            br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"session\u0055pdate":"plan"}}}"#.as_slice(),
        ] {
            let Ok(palisade_wire::jsonrpc::Frame::Notification { params, .. }) =
                palisade_wire::jsonrpc::parse_frame(line)
            else {
                panic!("a notification");
            };
            assert!(params.update_spans().is_none());
        }
    }

    /// Params around a generated `update`, in the shapes agents write and near misses.
    fn params_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let id = prop::sample::select(vec![
            r#""sess-1""#,
            r#""se\u0073s-1""#,
            "null",
            "7",
            r#"{"a":"b"}"#,
        ]);
        let name = prop::sample::select(vec![
            r#""sessionId""#,
            r#""update""#,
            r#""upd\u0061te""#,
            r#""other""#,
        ]);
        let ws = prop::sample::select(vec!["", " ", "\n\t "]);
        (
            prop::collection::vec((name, ws.clone(), id, json_text()), 0..4),
            ws,
        )
            .prop_map(|(members, w)| {
                let members: Vec<String> = members
                    .into_iter()
                    .map(|(n, a, id, update)| {
                        let value = if n.contains("essionId") {
                            id.to_owned()
                        } else {
                            update
                        };
                        format!("{n}{a}:{a}{value}")
                    })
                    .collect();
                format!("{{{w}{}{w}}}", members.join(&format!("{w},{w}")))
            })
    }

    #[test]
    fn the_plain_shape_agents_write_is_scanned_not_parsed() {
        let chunk = r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"resource_link","text":"e1.1#1 xxxx"}}"#;
        let head = UpdateHead::scan(chunk).expect("plain");
        assert_eq!(kind_of(&head), EventKind::Resource);
        let tool = r#"{"sessionUpdate":"tool_call","toolCallId":"e1.1#2","title":"t","kind":"read","status":"pending","rawInput":{"text":"e1.1#2 y"}}"#;
        assert_eq!(
            kind_of(&UpdateHead::scan(tool).expect("plain")),
            EventKind::ToolCall
        );
        // Duplicates and escaped names are left to serde, which refuses or decodes them.
        assert!(UpdateHead::scan(r#"{"sessionUpdate":"plan","sessionUpdate":"plan"}"#).is_none());
        assert!(UpdateHead::scan(r#"{"session\u0055pdate":"plan"}"#).is_none());
        assert_eq!(
            kind_of(&UpdateHead::parse(r#"{"session\u0055pdate":"plan"}"#)),
            EventKind::Plan
        );
    }

    #[test]
    fn update_kinds_map_to_event_kinds() {
        let kind = |v: Value| {
            let raw = RawJson::from_value(&v);
            kind_of(&UpdateHead::of(&raw))
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
