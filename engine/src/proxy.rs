//! The proxy's router, without I/O: an ACP *agent* to the client upstream, the engine's
//! sessions downstream.
//!
//! `palisade-proxy` puts Palisade between an ACP client (an editor, a Go or TypeScript
//! platform) and its agent: the client talks to the proxy as to its agent, and every
//! conversation runs through the [`Engine`](crate::Engine) and the core's fence. The
//! [`Router`] reads what the client writes ([`Router::upstream_line`]) and turns it into
//! [`Command`]s for the engine; it turns the engine's [`SessionEvent`]s into what the client
//! reads ([`Router::event`]); the shell reports the results of the commands back
//! ([`Router::opened`], [`Router::claimed`], ...). Lines for the client come out of
//! [`Router::upstream`] (all of them in one buffer), commands out of [`Router::poll_command`].
//!
//! | the client sends | the router |
//! |---|---|
//! | `initialize` | [`Command::Initialize`]: the shell asks the agent (a probe) and answers with [`Router::initialized`]; the answer says `loadSession: true` (the proxy loads its own sessions) |
//! | `authenticate` | [`Command::Authenticate`], answered with [`Router::authenticated`] |
//! | `session/new` | a new session, its params kept for every conversation ([`Command::Open`]); answered when its conversation is ready, with the agent's answer and the proxy's session id |
//! | `session/load` of a proxy session id | [`Command::Open`] with history: the history the agent replays reaches the client, then the answer; an unknown id is −32002 |
//! | `session/list` | the proxy's own sessions |
//! | `session/prompt` | [`Command::Prompt`]: the turn's updates as `session/update`s, once, in order; the answer is its `stopReason`, or a JSON-RPC error that carries the cause |
//! | `session/cancel` | [`Command::Cancel`] |
//! | any other method naming a `sessionId`, or `_`-prefixed | [`Command::Forward`] to the session's agent, answered with its answer |
//! | an answer to a request of the agent | [`Command::AnswerClient`]: reaches only the execution that asked |
//!
//! Upstream session ids (`pls_<nonce>_<n>`) stay the same for the conversation's life,
//! whatever the agent's own ids become: a conversation the agent cannot load is replaced
//! only on proof (rule 6), and the client is told with the extension notification
//! [`CONVERSATION_REPLACED`].

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use palisade_core::{AttemptId, AttemptOutcome, SessionId, TurnId, TurnOutcome, Verdict};
use palisade_wire::jsonrpc::{codes, parse_frame, write_message, write_response, Frame};
use palisade_wire::upstream::{
    classify_notification, classify_request, with_session, ClientNotification, ClientRequest,
};
use palisade_wire::{RawJson, RequestId, RpcError, RpcFailure};
use serde_json::{json, Value};

use crate::engine::{ForwardError, PromptError, SessionSetup};
use crate::events::{ConversationOrigin, OutputEvent, PromptContent, SessionEvent};
use crate::FailureCause;

/// The extension notification that tells the client its session's conversation was
/// replaced by a new one (the agent proved it could not load the old one, rule 6):
/// `{"sessionId": <proxy id>, "reason": <the proof>}`.
pub const CONVERSATION_REPLACED: &str = "_palisade/conversation_replaced";

/// What the shell must do with the engine (or, for `initialize`, with a probe of the
/// agent), each followed by the report the command names.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// The client's `initialize`: ask the agent its capabilities with these params (they
    /// also become every runtime's own: [`Engine::set_client_hello`](crate::Engine::set_client_hello)),
    /// then [`Router::initialized`].
    Initialize {
        /// The client's request.
        request: RequestId,
        /// Its params.
        params: RawJson,
    },
    /// The client's `authenticate`: pass it to the agent (and remember it for every
    /// runtime: [`Engine::set_client_auth`](crate::Engine::set_client_auth)), then
    /// [`Router::authenticated`].
    Authenticate {
        /// The client's request.
        request: RequestId,
        /// Its params.
        params: RawJson,
    },
    /// [`Engine::open`](crate::Engine::open), then [`Router::opened`].
    Open {
        /// The client's request.
        request: RequestId,
        /// The session.
        session: SessionId,
        /// What its conversations are made with.
        setup: SessionSetup,
    },
    /// [`Engine::prompt_content`](crate::Engine::prompt_content), then [`Router::claimed`].
    Prompt {
        /// The client's request.
        request: RequestId,
        /// The session.
        session: SessionId,
        /// The client's content blocks.
        content: PromptContent,
    },
    /// [`Engine::cancel`](crate::Engine::cancel).
    Cancel {
        /// The session.
        session: SessionId,
    },
    /// [`Engine::forward`](crate::Engine::forward), then [`Router::forwarding`].
    Forward {
        /// The client's request.
        request: RequestId,
        /// The session.
        session: SessionId,
        /// The method.
        method: String,
        /// The params (their `sessionId` is replaced by the agent's).
        params: RawJson,
    },
    /// [`Engine::answer_client_request`](crate::Engine::answer_client_request).
    AnswerClient {
        /// The ticket of the agent's request.
        ticket: u64,
        /// The client's answer.
        outcome: Result<RawJson, RpcError>,
    },
}

/// Requests of the agents waiting for the client at once (each holds one entry until the
/// client answers; past this the oldest is forgotten and its late answer dropped).
pub const CLIENT_REQUESTS_REMEMBERED: usize = 1024;

/// What the router keeps of a session.
#[derive(Debug, Clone, Default)]
struct Upstream {
    label: String,
    cwd: Option<String>,
}

/// Maps the client's ACP to the engine's sessions and back. See the module docs.
#[derive(Debug)]
pub struct Router {
    labels: BTreeMap<String, SessionId>,
    sessions: BTreeMap<SessionId, Upstream>,
    next_session: u64,
    nonce: String,
    /// `session/new` and `session/load` requests waiting for their conversation.
    opening: BTreeMap<SessionId, RequestId>,
    /// The last failure reported for a session being opened: the answer's cause.
    open_failures: BTreeMap<SessionId, FailureCause>,
    /// The attempt that serves each open (the engine's verdict): an earlier attempt's
    /// settling, still on its way to the router when the open was made, is not its answer.
    open_attempts: BTreeMap<SessionId, AttemptId>,
    /// `session/prompt` requests by turn.
    turns: BTreeMap<(SessionId, TurnId), RequestId>,
    /// Forwarded requests by ticket.
    forwards: BTreeMap<u64, RequestId>,
    /// The sessions the client opened on this connection (`session/new`, `session/load`):
    /// only theirs are its updates and the agents' requests. After a restart, a restored
    /// session's undelivered events (a turn's output, the history of a load asked for on
    /// the last connection) are not this client's until it loads the session, whose
    /// history then tells it the conversation.
    attached: BTreeSet<SessionId>,
    /// Sessions whose open joined an attempt in flight: its conversation may have been
    /// ready before, and the attempt settling ready answers the open.
    joined: BTreeSet<SessionId>,
    /// The agents' requests shown to the client, by the id the client sees.
    asked: BTreeMap<i64, u64>,
    next_asked: i64,
    /// The lines for the client, each with its newline, until the shell wrote them.
    out: Vec<u8>,
    /// The start of the last session's update lines, up to the update: the label it was
    /// made for, and the bytes ([`update_head`]). A burst of updates is one session's.
    update_head: (String, Vec<u8>),
    commands: VecDeque<Command>,
}

/// A JSON-RPC error with `data`.
fn error(code: i64, message: &str, data: Value) -> RpcError {
    RpcError::new(code, message).with_data(data)
}

impl Router {
    /// A router for the sessions the engine already knows (after a restore: their
    /// labels are the client's session ids), minting new ids as `pls_<nonce>_<n>`.
    pub fn new<'a>(
        known: impl IntoIterator<Item = (SessionId, &'a SessionSetup)>,
        nonce: impl Into<String>,
    ) -> Router {
        let mut router = Router {
            labels: BTreeMap::new(),
            sessions: BTreeMap::new(),
            next_session: 1,
            nonce: nonce.into(),
            opening: BTreeMap::new(),
            open_failures: BTreeMap::new(),
            open_attempts: BTreeMap::new(),
            turns: BTreeMap::new(),
            forwards: BTreeMap::new(),
            attached: BTreeSet::new(),
            joined: BTreeSet::new(),
            asked: BTreeMap::new(),
            next_asked: 1,
            out: Vec::new(),
            update_head: (String::new(), Vec::new()),
            commands: VecDeque::new(),
        };
        for (session, setup) in known {
            router.next_session = router.next_session.max(session.get().saturating_add(1));
            if let Some(label) = &setup.label {
                router.labels.insert(label.clone(), session);
                router.sessions.insert(
                    session,
                    Upstream {
                        label: label.clone(),
                        cwd: setup.params.as_ref().and_then(cwd_of),
                    },
                );
            }
        }
        router
    }

    /// Every line for the client not yet written, each with its newline, in order: one
    /// buffer, so that the shell writes a burst of updates at once. Say when they are
    /// written with [`Router::upstream_written`].
    #[must_use]
    pub fn upstream(&self) -> &[u8] {
        &self.out
    }

    /// The lines [`Router::upstream`] showed were written to the client.
    pub fn upstream_written(&mut self) {
        self.out.clear();
    }

    /// The next command for the shell.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// The session a client's id stands for.
    #[must_use]
    pub fn session_of(&self, label: &str) -> Option<SessionId> {
        self.labels.get(label).copied()
    }

    fn answer(&mut self, request: &RequestId, outcome: Result<Value, RpcError>) {
        write_response(&mut self.out, request, &outcome);
    }

    fn answer_raw(&mut self, request: &RequestId, outcome: Result<RawJson, RpcError>) {
        write_response(&mut self.out, request, &outcome);
    }

    fn notify(&mut self, method: &str, params: &Value) {
        write_message(&mut self.out, None, method, Some(params));
    }

    /// One line the client wrote.
    pub fn upstream_line(&mut self, line: &[u8]) {
        match parse_frame(line) {
            Ok(Frame::Request { id, method, params }) => self.request(id, &method, params),
            Ok(Frame::Notification { method, params }) => self.notification(&method, params),
            Ok(Frame::Response { id, outcome }) => self.client_answer(&id, outcome),
            Err(why) => {
                tracing::warn!(%why, "the client wrote a line that is not JSON-RPC");
                self.answer(
                    &RequestId::Null,
                    Err(RpcError::new(codes::PARSE_ERROR, why.to_string())),
                );
            }
        }
    }

    fn request(&mut self, request: RequestId, method: &str, params: RawJson) {
        let classified = match classify_request(method, params) {
            Ok(classified) => classified,
            Err(why) => {
                let message = why.to_string();
                return self.answer(&request, Err(RpcError::new(codes::INVALID_PARAMS, message)));
            }
        };
        match classified {
            ClientRequest::Initialize(params) => {
                self.commands
                    .push_back(Command::Initialize { request, params });
            }
            ClientRequest::Authenticate(params) => {
                self.commands
                    .push_back(Command::Authenticate { request, params });
            }
            ClientRequest::NewSession(params) => {
                let session = SessionId::new(self.next_session)
                    .expect("the session counter starts at 1 and only grows");
                self.next_session = self.next_session.saturating_add(1);
                let label = format!("pls_{}_{}", self.nonce, session.get());
                self.labels.insert(label.clone(), session);
                self.sessions.insert(
                    session,
                    Upstream {
                        label: label.clone(),
                        cwd: cwd_of(&params),
                    },
                );
                self.opening.insert(session, request.clone());
                self.attached.insert(session);
                self.commands.push_back(Command::Open {
                    request,
                    session,
                    setup: SessionSetup {
                        label: Some(label),
                        params: Some(params),
                        history: false,
                    },
                });
            }
            ClientRequest::LoadSession { session_id, params } => {
                let Some(session) = self.session_of(&session_id) else {
                    return self.answer(
                        &request,
                        Err(error(
                            codes::RESOURCE_NOT_FOUND,
                            "Resource not found",
                            json!({"uri": session_id}),
                        )),
                    );
                };
                let setup_params = without_session(&params);
                if let Some(upstream) = self.sessions.get_mut(&session) {
                    upstream.cwd = setup_params
                        .as_ref()
                        .and_then(cwd_of)
                        .or(upstream.cwd.take());
                }
                self.opening.insert(session, request.clone());
                self.attached.insert(session);
                self.commands.push_back(Command::Open {
                    request,
                    session,
                    setup: SessionSetup {
                        label: Some(session_id),
                        params: setup_params,
                        history: true,
                    },
                });
            }
            ClientRequest::ListSessions(_) => {
                let sessions: Vec<Value> = self
                    .sessions
                    .values()
                    .map(|u| match &u.cwd {
                        Some(cwd) => json!({"sessionId": u.label, "cwd": cwd}),
                        None => json!({"sessionId": u.label}),
                    })
                    .collect();
                self.answer(&request, Ok(json!({"sessions": sessions})));
            }
            ClientRequest::Prompt { session_id, prompt } => {
                let Some(session) = self.session_of(&session_id) else {
                    return self.unknown_session(&request, &session_id);
                };
                self.commands.push_back(Command::Prompt {
                    request,
                    session,
                    content: PromptContent::Blocks(prompt),
                });
            }
            ClientRequest::ForSession {
                method,
                session_id,
                params,
            } => {
                let Some(session) = self.session_of(&session_id) else {
                    return self.unknown_session(&request, &session_id);
                };
                self.commands.push_back(Command::Forward {
                    request,
                    session,
                    method,
                    params,
                });
            }
            ClientRequest::Extension { method, .. } | ClientRequest::Unknown { method } => {
                self.answer(
                    &request,
                    Err(error(
                        codes::METHOD_NOT_FOUND,
                        "Method not found",
                        json!({"method": method}),
                    )),
                );
            }
        }
    }

    fn unknown_session(&mut self, request: &RequestId, session_id: &str) {
        self.answer(
            request,
            Err(error(
                codes::RESOURCE_NOT_FOUND,
                "Resource not found",
                json!({"uri": session_id}),
            )),
        );
    }

    fn notification(&mut self, method: &str, params: RawJson) {
        match classify_notification(method, params) {
            ClientNotification::Cancel { session_id } => {
                if let Some(session) = self.session_of(&session_id) {
                    self.commands.push_back(Command::Cancel { session });
                }
            }
            ClientNotification::ForSession { method, .. }
            | ClientNotification::Other { method, .. } => {
                tracing::debug!(%method, "a client notification the proxy does not pass on");
            }
        }
    }

    fn client_answer(&mut self, id: &RequestId, outcome: Result<RawJson, RpcError>) {
        let RequestId::Number(n) = id else {
            tracing::warn!(?id, "the client answered a request the proxy never sent");
            return;
        };
        match self.asked.remove(n) {
            Some(ticket) => self
                .commands
                .push_back(Command::AnswerClient { ticket, outcome }),
            None => tracing::warn!(
                id = n,
                "the client answered a request twice, or one never sent"
            ),
        }
    }

    /// The agent answered the client's `initialize` (through a probe): the client gets
    /// the agent's answer, saying the proxy can load its sessions.
    pub fn initialized(&mut self, request: &RequestId, result: Result<RawJson, RpcFailure>) {
        match result {
            Ok(answer) => {
                let mut answer: serde_json::Map<String, Value> = answer.parse().unwrap_or_default();
                let capabilities = answer
                    .entry("agentCapabilities")
                    .or_insert_with(|| json!({}));
                if let Some(capabilities) = capabilities.as_object_mut() {
                    capabilities.insert("loadSession".to_owned(), Value::Bool(true));
                }
                self.answer(request, Ok(Value::Object(answer)));
            }
            Err(failure) => self.answer(request, Err(failure_error("initialize", &failure))),
        }
    }

    /// The agent answered the client's `authenticate`.
    pub fn authenticated(&mut self, request: &RequestId, result: Result<RawJson, RpcFailure>) {
        match result {
            Ok(answer) => self.answer_raw(request, Ok(answer)),
            Err(failure) => self.answer(request, Err(failure_error("authenticate", &failure))),
        }
    }

    /// The engine's verdict on [`Command::Open`].
    pub fn opened(&mut self, request: &RequestId, session: SessionId, verdict: &Verdict) {
        match verdict {
            Verdict::Started { attempt } => {
                self.open_attempts.insert(session, *attempt);
                // Failures reported before are an earlier attempt's.
                self.open_failures.remove(&session);
            }
            Verdict::AlreadyReady => {
                // The session's conversation runs: nothing to load, nothing to replay.
                self.opening.remove(&session);
                let label = self.label(session);
                self.answer(request, Ok(json!({"sessionId": label})));
            }
            Verdict::Joined { attempt, .. } => {
                self.open_attempts.insert(session, *attempt);
                self.joined.insert(session);
            }
            Verdict::Reject(reason) => {
                self.opening.remove(&session);
                self.answer(
                    request,
                    Err(error(
                        codes::INTERNAL_ERROR,
                        "the session cannot be opened",
                        json!({"reason": reason.to_string()}),
                    )),
                );
            }
            _ => {}
        }
    }

    /// The engine's answer to [`Command::Prompt`]: a refused claim answers the client now;
    /// a claimed turn is answered when it ends.
    pub fn claimed(
        &mut self,
        request: RequestId,
        session: SessionId,
        result: Result<TurnId, PromptError>,
    ) {
        match result {
            Ok(turn) => {
                self.turns.insert((session, turn), request);
            }
            Err(why) => self.answer(
                &request,
                Err(error(
                    codes::INVALID_REQUEST,
                    "the prompt was not taken",
                    json!({"reason": why.to_string()}),
                )),
            ),
        }
    }

    /// The engine's answer to [`Command::Forward`].
    pub fn forwarding(&mut self, request: RequestId, result: Result<u64, ForwardError>) {
        match result {
            Ok(ticket) => {
                self.forwards.insert(ticket, request);
            }
            Err(why) => self.answer(
                &request,
                Err(error(
                    codes::INTERNAL_ERROR,
                    "the session's agent cannot be asked now",
                    json!({"reason": why.to_string()}),
                )),
            ),
        }
    }

    /// Whether `attempt` is the one serving the session's open, if one waits (any attempt
    /// does when none waits, or when the open's verdict named none).
    fn serves_open(&self, session: SessionId, attempt: AttemptId) -> bool {
        !self.opening.contains_key(&session)
            || self
                .open_attempts
                .get(&session)
                .is_none_or(|serving| *serving == attempt)
    }

    fn label(&self, session: SessionId) -> String {
        label_of(&self.sessions, &self.nonce, session).into_owned()
    }

    /// An event of the engine: what the client must hear of it.
    pub fn event(&mut self, event: &SessionEvent) {
        let session = event.session();
        if self.attached.contains(&session) {
            // A turn's output and a load's history, the bulk of what the client hears:
            // written under the session's label, borrowed.
            let label = label_of(&self.sessions, &self.nonce, session);
            match event {
                SessionEvent::Output { events, .. } => {
                    let head = cached_head(&mut self.update_head, &label);
                    for OutputEvent { update, .. } in events {
                        write_update(&mut self.out, head, update);
                    }
                    return;
                }
                SessionEvent::Update { update, .. } | SessionEvent::History { update, .. } => {
                    let head = cached_head(&mut self.update_head, &label);
                    write_update(&mut self.out, head, update);
                    return;
                }
                _ => {}
            }
        }
        let label = self.label(session);
        if !self.attached.contains(&session) {
            match event {
                SessionEvent::Output { .. }
                | SessionEvent::Update { .. }
                | SessionEvent::History { .. } => {
                    tracing::debug!(%label, "an update of a session the client has not opened here is not its");
                    return;
                }
                SessionEvent::ClientRequest { ticket, .. } => {
                    // Nobody here can answer it: the agent hears so now.
                    self.commands.push_back(Command::AnswerClient {
                        ticket: *ticket,
                        outcome: Err(RpcError::new(
                            codes::INTERNAL_ERROR,
                            "the client cannot be asked now",
                        )),
                    });
                    return;
                }
                _ => {}
            }
        }
        match event {
            // Written above.
            SessionEvent::Output { .. }
            | SessionEvent::Update { .. }
            | SessionEvent::History { .. } => {}
            SessionEvent::ConversationReady { origin, answer, .. } => {
                self.open_failures.remove(&session);
                self.joined.remove(&session);
                if let ConversationOrigin::Replaced(reason) = origin {
                    self.notify(
                        CONVERSATION_REPLACED,
                        &json!({"sessionId": label, "reason": format!("{reason:?}")}),
                    );
                }
                if let Some(request) = self.opening.remove(&session) {
                    let mut members: serde_json::Map<String, Value> = answer
                        .as_ref()
                        .and_then(|a| a.parse().ok())
                        .unwrap_or_default();
                    members.insert("sessionId".to_owned(), Value::String(label));
                    self.answer(&request, Ok(Value::Object(members)));
                }
            }
            SessionEvent::FailureReported { failure, cause, .. } => {
                if self.serves_open(session, failure.attempt) {
                    self.open_failures.insert(session, cause.clone());
                }
            }
            SessionEvent::AttemptSettled { attempt, .. }
                if !self.serves_open(session, *attempt) =>
            {
                // An earlier attempt's end, reported before the open was made.
            }
            SessionEvent::AttemptSettled {
                outcome: AttemptOutcome::Ready,
                ..
            } => {
                // A load that joined an attempt whose conversation was ready before it
                // came (a restored turn's recovery) hears no ConversationReady of its own.
                if self.joined.remove(&session) {
                    if let Some(request) = self.opening.remove(&session) {
                        self.open_failures.remove(&session);
                        self.answer(&request, Ok(json!({"sessionId": label})));
                    }
                }
            }
            SessionEvent::AttemptSettled {
                outcome: AttemptOutcome::Failed | AttemptOutcome::Cancelled,
                ..
            } => {
                self.joined.remove(&session);
                if let Some(request) = self.opening.remove(&session) {
                    let cause = self
                        .open_failures
                        .remove(&session)
                        .map_or_else(|| "the agent did not start".to_owned(), |c| c.to_string());
                    self.answer(
                        &request,
                        Err(error(
                            codes::INTERNAL_ERROR,
                            "the session's agent could not start",
                            json!({"cause": cause}),
                        )),
                    );
                }
            }
            SessionEvent::TurnEnded {
                turn,
                outcome,
                stop_reason,
                cause,
                ..
            } => {
                let Some(request) = self.turns.remove(&(session, *turn)) else {
                    return;
                };
                let answer = match outcome {
                    TurnOutcome::Completed => Ok(json!({
                        "stopReason": stop_reason.as_deref().unwrap_or("end_turn")
                    })),
                    TurnOutcome::Cancelled => Ok(json!({"stopReason": "cancelled"})),
                    TurnOutcome::Failed | TurnOutcome::RolledBack => Err(error(
                        codes::INTERNAL_ERROR,
                        "the turn failed",
                        json!({
                            "outcome": format!("{outcome:?}"),
                            "cause": cause.as_ref().map(ToString::to_string),
                        }),
                    )),
                };
                self.answer(&request, answer);
            }
            SessionEvent::ClientRequest {
                ticket,
                method,
                params,
                ..
            } => {
                if self.asked.len() == CLIENT_REQUESTS_REMEMBERED {
                    self.asked.pop_first();
                }
                let id = self.next_asked;
                self.next_asked += 1;
                self.asked.insert(id, *ticket);
                let params = with_session(params, &label).unwrap_or_else(|| params.clone());
                write_message(
                    &mut self.out,
                    Some(&RequestId::Number(id)),
                    method,
                    Some(&params),
                );
            }
            SessionEvent::Forwarded { ticket, result, .. } => {
                let Some(request) = self.forwards.remove(ticket) else {
                    return;
                };
                match result {
                    Ok(answer) => self.answer_raw(&request, Ok(answer.clone())),
                    Err(RpcFailure::Rpc(error)) => self.answer(&request, Err(error.clone())),
                    Err(failure) => {
                        self.answer(&request, Err(failure_error("the request", failure)));
                    }
                }
            }
            SessionEvent::RuntimeStarted { .. }
            | SessionEvent::ConversationLoading { .. }
            | SessionEvent::RecoveryStarted { .. }
            | SessionEvent::RecoveryExhausted { .. }
            | SessionEvent::JoinTimedOut { .. }
            | SessionEvent::RuntimeExited { .. } => {}
        }
    }
}

/// The client's id of `session`: its label, or (a session the router has not named) the
/// one it would mint.
fn label_of<'a>(
    sessions: &'a BTreeMap<SessionId, Upstream>,
    nonce: &str,
    session: SessionId,
) -> Cow<'a, str> {
    sessions.get(&session).map_or_else(
        || Cow::Owned(format!("pls_{nonce}_{}", session.get())),
        |u| Cow::Borrowed(u.label.as_str()),
    )
}

/// The start of a `session/update` line of the session labelled `label`, up to its
/// update, appended to `out`.
///
/// The bytes are those `write_message` writes for the same params (a test holds them
/// equal), but the envelope around the two members is a constant: serializing its names
/// and the method for every update was a tenth of the proxy's work at 100,000 updates a
/// second. Only the label goes through serde (escaped).
fn update_head(out: &mut Vec<u8>, label: &str) {
    out.extend_from_slice(UPDATE_HEAD.as_bytes());
    serde_json::to_writer(&mut *out, label).expect("a string always serializes");
    out.extend_from_slice(b",\"update\":");
}

/// The start of `label`'s update lines ([`update_head`]) from `cache`, made again only
/// when the label differs from the one it was made for.
fn cached_head<'a>(cache: &'a mut (String, Vec<u8>), label: &str) -> &'a [u8] {
    let (made_for, head) = cache;
    if made_for != label || head.is_empty() {
        label.clone_into(made_for);
        head.clear();
        update_head(head, label);
    }
    head
}

/// A `session/update` line, appended to `out`: its start ([`update_head`]), then the
/// agent's update as it wrote it.
fn write_update(out: &mut Vec<u8>, head: &[u8], update: &RawJson) {
    out.extend_from_slice(head);
    out.extend_from_slice(update.get().as_bytes());
    out.extend_from_slice(b"}}\n");
}

/// What every `session/update` line to the client starts with, up to its session id.
const UPDATE_HEAD: &str = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"#;

/// The `cwd` member of a client's session params.
fn cwd_of(params: &RawJson) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Cwd {
        cwd: Option<String>,
    }
    params.parse::<Cwd>().ok().and_then(|c| c.cwd)
}

/// The client's `session/load` params without its `sessionId`: what a conversation of the
/// session is made with.
fn without_session(params: &RawJson) -> Option<RawJson> {
    let mut members: serde_json::Map<String, Value> = params.parse().ok()?;
    members.remove("sessionId");
    Some(RawJson::from_value(&Value::Object(members)))
}

/// A JSON-RPC error for a failure of `what` that is not the agent's own error answer.
fn failure_error(what: &str, failure: &RpcFailure) -> RpcError {
    match failure {
        RpcFailure::Rpc(error) => error.clone(),
        other => error(
            codes::INTERNAL_ERROR,
            &format!("{what} failed"),
            json!({"cause": other.to_string()}),
        ),
    }
}

/// The lines the router has for the client, each with its newline; then they are written.
#[cfg(test)]
fn written(router: &mut Router) -> Vec<String> {
    let text = std::str::from_utf8(router.upstream()).expect("the router writes UTF-8");
    let lines = text.split_inclusive('\n').map(str::to_owned).collect();
    router.upstream_written();
    lines
}

#[cfg(test)]
mod tests {
    use palisade_core::Timestamp;
    use palisade_wire::{acp, AgentEvent};

    use super::*;
    use crate::{Action, Engine, EngineConfig, Op, Output};

    /// The router in front of an engine, and a scripted agent behind it: what the proxy's
    /// loop does with the commands, without the I/O.
    struct Bench {
        router: Router,
        engine: Engine,
        now: Timestamp,
        /// Requests the agent got and has not answered: (execution, op, method, params).
        asked: Vec<(palisade_core::ExecutionId, Op, String, Value)>,
        /// Answers the agent got for its requests to the client.
        answered: Vec<Value>,
        /// What the client read.
        client: Vec<Value>,
    }

    impl Bench {
        fn new() -> Bench {
            let config = EngineConfig {
                cwd: "/tmp".into(),
                client: crate::ClientSide::Forward,
                ..EngineConfig::default()
            };
            Bench {
                router: Router::new(std::iter::empty(), "n"),
                engine: Engine::new(config).unwrap(),
                now: Timestamp::from_millis(1),
                asked: Vec::new(),
                answered: Vec::new(),
                client: Vec::new(),
            }
        }

        /// The client writes `line`; everything that follows is carried out.
        fn send(&mut self, line: Value) {
            self.router.upstream_line(line.to_string().as_bytes());
            self.settle();
        }

        fn settle(&mut self) {
            loop {
                let mut busy = false;
                while let Some(command) = self.router.poll_command() {
                    busy = true;
                    self.command(command);
                }
                self.engine.set_caller_room(usize::MAX);
                loop {
                    match self.engine.poll_output(self.now) {
                        Output::Action(action) => {
                            busy = true;
                            self.action(action);
                        }
                        Output::Event(event) => {
                            busy = true;
                            self.router.event(&event);
                        }
                        Output::Persist => {}
                        Output::Wait { .. } => break,
                    }
                }
                for line in written(&mut self.router) {
                    self.client.push(serde_json::from_str(&line).unwrap());
                }
                if !busy {
                    return;
                }
            }
        }

        fn command(&mut self, command: Command) {
            let now = self.now;
            match command {
                Command::Initialize { request, params } => {
                    self.engine.set_client_hello(params);
                    let answer =
                        json!({"protocolVersion": 1, "agentCapabilities": {"loadSession": false}});
                    self.router
                        .initialized(&request, Ok(RawJson::from_value(&answer)));
                }
                Command::Authenticate { request, params } => {
                    self.engine.set_client_auth(params);
                    self.router
                        .authenticated(&request, Ok(RawJson::from_value(&json!({}))));
                }
                Command::Open {
                    request,
                    session,
                    setup,
                } => {
                    let verdict = self.engine.open(now, session, setup);
                    self.router.opened(&request, session, &verdict);
                }
                Command::Prompt {
                    request,
                    session,
                    content,
                } => {
                    let result = self.engine.prompt_content(now, session, content);
                    self.router.claimed(request, session, result);
                }
                Command::Cancel { session } => {
                    self.engine.cancel(now, session);
                }
                Command::Forward {
                    request,
                    session,
                    method,
                    params,
                } => {
                    let result = self.engine.forward(now, session, method, params);
                    self.router.forwarding(request, result);
                }
                Command::AnswerClient { ticket, outcome } => {
                    self.engine.answer_client_request(ticket, outcome);
                }
            }
        }

        fn action(&mut self, action: Action) {
            match action {
                Action::Spawn { session, attempt } => {
                    self.engine.spawned(self.now, session, attempt, Ok(Some(1)));
                }
                Action::Request {
                    execution,
                    op,
                    method,
                    params,
                    ..
                } => self
                    .asked
                    .push((execution, op, method.into_owned(), params.to_value())),
                Action::Respond { outcome, .. } => {
                    self.answered.push(outcome.unwrap_or(Value::Null));
                }
                Action::Notify { .. } | Action::Stop { .. } | Action::Kill { .. } => {}
            }
        }

        /// The agent answers its oldest request of `method` with `result`.
        fn agent_answers(&mut self, method: &str, result: Value) -> Value {
            let at = self
                .asked
                .iter()
                .position(|(_, _, m, _)| m == method)
                .unwrap_or_else(|| panic!("no {method} was asked: {:?}", self.asked));
            let (execution, op, _, params) = self.asked.remove(at);
            self.engine
                .reply(self.now, execution, op, Ok(RawJson::from_value(&result)));
            self.settle();
            params
        }

        fn agent_says(&mut self, event: AgentEvent) {
            let execution = self.asked.first().map(|(e, ..)| *e).expect("a runtime");
            self.engine.agent_event(self.now, execution, event);
            self.settle();
        }

        /// The client's answer to its request `id`.
        fn answer_of(&self, id: i64) -> &Value {
            self.client
                .iter()
                .find(|m| m["id"] == id && m.get("method").is_none())
                .unwrap_or_else(|| panic!("no answer to {id}: {:#?}", self.client))
        }
    }

    fn update(session: &str, text: &str) -> AgentEvent {
        let params = json!({"sessionId": session, "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}});
        AgentEvent::Notification {
            method: acp::SESSION_UPDATE.to_owned(),
            wire_bytes: params.to_string().len(),
            params: RawJson::from_value(&params),
        }
    }

    /// The session a client opened, ready; its proxy id.
    fn opened(bench: &mut Bench) -> String {
        bench.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": true}}}}));
        assert_eq!(
            bench.answer_of(1)["result"]["agentCapabilities"]["loadSession"],
            true,
            "the proxy loads its own sessions"
        );
        bench.send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/w", "mcpServers": []}}));
        let hello = bench.agent_answers(
            acp::INITIALIZE,
            json!({"protocolVersion": 1, "agentCapabilities": {}}),
        );
        assert_eq!(hello["clientCapabilities"]["fs"]["readTextFile"], true);
        let new = bench.agent_answers(
            acp::SESSION_NEW,
            json!({"sessionId": "agent-1", "modes": {"currentModeId": "ask", "availableModes": []}}),
        );
        assert_eq!(new, json!({"cwd": "/w", "mcpServers": []}));
        let answer = &bench.answer_of(2)["result"];
        assert_eq!(answer["modes"]["currentModeId"], "ask");
        let label = answer["sessionId"].as_str().unwrap().to_owned();
        assert_eq!(label, "pls_n_1");
        label
    }

    #[test]
    fn a_turn_reaches_the_client_under_its_own_session_id() {
        let mut bench = Bench::new();
        let label = opened(&mut bench);
        bench.send(json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {"sessionId": label, "prompt": [{"type": "text", "text": "hi"}]}}));
        let prompt = bench
            .asked
            .iter()
            .find(|(_, _, m, _)| m == acp::SESSION_PROMPT)
            .unwrap();
        assert_eq!(
            prompt.3,
            json!({"sessionId": "agent-1", "prompt": [{"type": "text", "text": "hi"}]})
        );
        bench.agent_says(update("agent-1", "one"));
        bench.agent_says(update("agent-1", "two"));
        bench.agent_answers(acp::SESSION_PROMPT, json!({"stopReason": "end_turn"}));
        let texts: Vec<&str> = bench
            .client
            .iter()
            .filter(|m| m["method"] == "session/update")
            .map(|m| {
                assert_eq!(m["params"]["sessionId"], label.as_str());
                m["params"]["update"]["content"]["text"].as_str().unwrap()
            })
            .collect();
        assert_eq!(texts, ["one", "two"]);
        assert_eq!(
            bench.answer_of(3)["result"],
            json!({"stopReason": "end_turn"})
        );
        // The answer comes after every update of its turn.
        let answer_at = bench.client.iter().position(|m| m["id"] == 3).unwrap();
        assert!(bench.client[answer_at + 1..]
            .iter()
            .all(|m| m["method"] != "session/update"));
    }

    #[test]
    fn the_agents_request_reaches_the_client_and_the_answer_the_agent() {
        let mut bench = Bench::new();
        let label = opened(&mut bench);
        bench.send(json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {"sessionId": label, "prompt": [{"type": "text", "text": "hi"}]}}));
        bench.agent_says(update("agent-1", "working"));
        bench.agent_says(AgentEvent::Request {
            id: RequestId::Number(77),
            method: acp::SESSION_REQUEST_PERMISSION.to_owned(),
            params: RawJson::from_value(
                &json!({"sessionId": "agent-1", "toolCall": {"toolCallId": "t"}, "options": []}),
            ),
        });
        let request = bench
            .client
            .iter()
            .find(|m| m["method"] == acp::SESSION_REQUEST_PERMISSION)
            .expect("the client is asked")
            .clone();
        assert_eq!(
            request["params"]["sessionId"],
            label.as_str(),
            "under the proxy's id"
        );
        let id = request["id"].clone();
        bench.send(json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}));
        assert_eq!(
            bench.answered,
            vec![json!({"outcome": {"outcome": "selected", "optionId": "allow"}})]
        );
        // The same answer again goes nowhere.
        bench.send(
            json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": {"outcome": "cancelled"}}}),
        );
        assert_eq!(bench.answered.len(), 1);
    }

    #[test]
    fn an_unknown_session_is_resource_not_found_and_a_busy_one_refuses_a_prompt() {
        let mut bench = Bench::new();
        let label = opened(&mut bench);
        bench.send(json!({"jsonrpc": "2.0", "id": 4, "method": "session/load", "params": {"sessionId": "pls_other_9", "cwd": "/w", "mcpServers": []}}));
        assert_eq!(
            bench.answer_of(4)["error"]["code"],
            codes::RESOURCE_NOT_FOUND
        );
        bench.send(json!({"jsonrpc": "2.0", "id": 5, "method": "session/prompt", "params": {"sessionId": label, "prompt": []}}));
        bench.send(json!({"jsonrpc": "2.0", "id": 6, "method": "session/prompt", "params": {"sessionId": label, "prompt": []}}));
        let busy = &bench.answer_of(6)["error"];
        assert_eq!(busy["code"], codes::INVALID_REQUEST, "{busy}");
        bench.send(json!({"jsonrpc": "2.0", "id": 7, "method": "session/list", "params": {}}));
        assert_eq!(
            bench.answer_of(7)["result"],
            json!({"sessions": [{"sessionId": label, "cwd": "/w"}]})
        );
        bench.send(json!({"jsonrpc": "2.0", "id": 8, "method": "no/such", "params": {}}));
        assert_eq!(bench.answer_of(8)["error"]["code"], codes::METHOD_NOT_FOUND);
    }

    /// A `session/load` is answered by the attempt that serves it: the end of an earlier
    /// attempt, reported before the load was made but read by the router after it, is not
    /// its answer (found by the sweep: a restored turn's recovery attempt failed as the
    /// client's load came; the load was answered with that failure, and the history of the
    /// load's own attempt then reached the client outside any load:
    /// `found/load-answered-by-its-own-attempt.json`).
    #[test]
    fn a_load_is_answered_by_its_own_attempt_not_an_earlier_one() {
        use palisade_core::Epoch;
        let session = SessionId::new(1).unwrap();
        let setup = SessionSetup {
            label: Some("pls_n_1".into()),
            params: None,
            history: false,
        };
        let mut router = Router::new([(session, &setup)], "n");
        router.upstream_line(br#"{"jsonrpc":"2.0","id":7,"method":"session/load","params":{"sessionId":"pls_n_1","cwd":"/w","mcpServers":[]}}"#);
        let Some(Command::Open {
            request,
            session: s,
            ..
        }) = router.poll_command()
        else {
            panic!("an open");
        };
        assert_eq!(s, session);
        let epoch = Epoch::new(2).unwrap();
        let earlier = AttemptId::new(epoch, 1).unwrap();
        let serving = AttemptId::new(epoch, 2).unwrap();
        router.opened(&request, session, &Verdict::Started { attempt: serving });
        router.event(&SessionEvent::AttemptSettled {
            session,
            attempt: earlier,
            outcome: AttemptOutcome::Failed,
        });
        assert!(
            router.upstream().is_empty(),
            "no answer from the earlier attempt: {}",
            String::from_utf8_lossy(router.upstream())
        );
        router.event(&SessionEvent::AttemptSettled {
            session,
            attempt: serving,
            outcome: AttemptOutcome::Failed,
        });
        let answer: Value = serde_json::from_slice(router.upstream().trim_ascii()).unwrap();
        assert_eq!(answer["id"], 7);
        assert_eq!(answer["error"]["code"], codes::INTERNAL_ERROR, "{answer}");
    }

    #[test]
    fn a_session_method_is_forwarded_under_the_agents_id() {
        let mut bench = Bench::new();
        let label = opened(&mut bench);
        bench.send(json!({"jsonrpc": "2.0", "id": 9, "method": "session/set_mode", "params": {"sessionId": label, "modeId": "code"}}));
        let params = bench.agent_answers("session/set_mode", json!({}));
        assert_eq!(params, json!({"sessionId": "agent-1", "modeId": "code"}));
        assert_eq!(bench.answer_of(9)["result"], json!({}));
    }

    /// An update line is what serde writes for the same message, whatever the label holds
    /// and however the agent wrote its update.
    #[test]
    fn an_update_line_is_what_serde_writes() {
        #[derive(serde::Serialize)]
        struct Params<'a> {
            #[serde(rename = "sessionId")]
            session_id: &'a str,
            update: &'a serde_json::value::RawValue,
        }
        for (label, update) in [
            (
                "pls_1a_1",
                r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a"}}"#,
            ),
            (
                "quote\"back\\slash\u{1}é",
                r#" { "sessionUpdate" : "plan" , "entries":[] } "#,
            ),
            ("", "null"),
        ] {
            let update = RawJson::from_text(update).expect("json");
            let mut head = Vec::new();
            update_head(&mut head, label);
            let mut ours = Vec::new();
            write_update(&mut ours, &head, &update);
            let mut serdes = Vec::new();
            write_message(
                &mut serdes,
                None,
                acp::SESSION_UPDATE,
                Some(&Params {
                    session_id: label,
                    update: update.raw(),
                }),
            );
            assert_eq!(
                String::from_utf8(ours).expect("utf-8"),
                String::from_utf8(serdes).expect("utf-8")
            );
        }
    }
}

#[cfg(test)]
mod hostile {
    use proptest::prelude::*;

    use super::*;

    /// Lines a client might write: well-formed requests of every method the router knows,
    /// with members missing or of the wrong kind, answers to ids never sent, garbage.
    fn client_line() -> impl Strategy<Value = Vec<u8>> {
        let method = prop_oneof![
            Just("initialize"),
            Just("authenticate"),
            Just("session/new"),
            Just("session/load"),
            Just("session/list"),
            Just("session/prompt"),
            Just("session/cancel"),
            Just("session/set_mode"),
            Just("_x/y"),
            Just("nope"),
        ];
        let params = prop_oneof![
            Just(json!({})),
            Just(json!(null)),
            Just(json!([1, 2])),
            Just(json!({"sessionId": "pls_n_1", "prompt": [{"type": "text", "text": "x"}]})),
            Just(json!({"sessionId": 7, "prompt": "x"})),
            Just(json!({"sessionId": "pls_n_1"})),
            Just(json!({"cwd": "/w", "mcpServers": []})),
        ];
        let id = prop_oneof![
            Just(json!(1)),
            Just(json!("a")),
            Just(json!(null)),
            Just(json!(2.5))
        ];
        prop_oneof![
            (method.clone(), params.clone(), id.clone()).prop_map(|(m, p, id)| {
                json!({"jsonrpc": "2.0", "id": id, "method": m, "params": p})
                    .to_string()
                    .into_bytes()
            }),
            (method, params).prop_map(|(m, p)| {
                json!({"jsonrpc": "2.0", "method": m, "params": p})
                    .to_string()
                    .into_bytes()
            }),
            id.prop_map(|id| json!({"jsonrpc": "2.0", "id": id, "result": {}})
                .to_string()
                .into_bytes()),
            proptest::collection::vec(any::<u8>(), 0..64),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Whatever a client writes, the router does not panic, and every line it writes
        /// back is a JSON-RPC message.
        #[test]
        fn hostile_client_lines_get_json_rpc_or_nothing(lines in proptest::collection::vec(client_line(), 1..16)) {
            let mut router = Router::new(std::iter::empty(), "n");
            for line in &lines {
                router.upstream_line(line);
                while router.poll_command().is_some() {}
            }
            for out in written(&mut router) {
                prop_assert!(out.ends_with('\n'));
                let message: Value = serde_json::from_str(&out).expect("the router writes JSON");
                prop_assert_eq!(&message["jsonrpc"], "2.0");
            }
        }
    }
}

#[cfg(test)]
mod restored_tests {
    use serde_json::json;

    use super::*;

    /// After a restart, a restored session's events are not the new client's until it
    /// loads the session: its updates and history are not written, its agents' requests
    /// are answered that the client cannot be asked; once it loads, they are its.
    #[test]
    fn a_restored_session_is_the_clients_once_it_loads_it() {
        let session = SessionId::new(1).expect("not zero");
        let setup = SessionSetup {
            label: Some("pls_a_1".into()),
            params: None,
            history: false,
        };
        let mut router = Router::new([(session, &setup)], "b");
        let update = RawJson::from_value(&json!({"sessionUpdate": "agent_message_chunk"}));
        router.event(&SessionEvent::Update {
            session,
            update: update.clone(),
        });
        router.event(&SessionEvent::History {
            session,
            update: update.clone(),
        });
        router.event(&SessionEvent::ClientRequest {
            session,
            ticket: 7,
            method: "session/request_permission".into(),
            params: RawJson::from_value(&json!({"sessionId": "agent-1"})),
        });
        assert_eq!(
            written(&mut router),
            Vec::<String>::new(),
            "nothing for a client that never loaded it"
        );
        assert!(matches!(
            router.poll_command(),
            Some(Command::AnswerClient {
                ticket: 7,
                outcome: Err(_)
            })
        ));
        let load = json!({"jsonrpc": "2.0", "id": 1, "method": "session/load",
            "params": {"sessionId": "pls_a_1", "cwd": "/w", "mcpServers": []}});
        router.upstream_line(load.to_string().as_bytes());
        assert!(matches!(router.poll_command(), Some(Command::Open { .. })));
        router.event(&SessionEvent::History { session, update });
        let line = written(&mut router)
            .pop()
            .expect("its load's history is the client's");
        assert!(line.contains("pls_a_1"), "{line}");
    }
}
