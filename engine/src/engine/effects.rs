//! The core's effects, carried out: each becomes ACP traffic, an action for the shell, or
//! an event for the caller. One method per effect; [`Engine::effect`] routes them.

use palisade_core::{PromptRequest, RecoveryFailure};

use super::*;

impl Engine {
    /// Carries out one effect the driver handed out (a leased one already confirmed).
    pub(super) fn effect(&mut self, now: Timestamp, effect: Effect) {
        match effect {
            Effect::StartRuntime {
                session, attempt, ..
            } => self.start_runtime(session, attempt),
            Effect::LoadConversation {
                session,
                execution,
                token,
                ..
            } => self.load_conversation(now, session, execution, token),
            Effect::NewConversation {
                execution, reason, ..
            } => self.new_conversation(now, execution, reason),
            Effect::DispatchPrompt {
                session,
                execution,
                turn,
                request,
                ..
            } => self.dispatch_prompt(now, session, execution, turn, request),
            Effect::CancelPrompt {
                execution, turn, ..
            } => self.cancel_prompt(execution, turn),
            Effect::StopExecution {
                execution,
                deadline,
                ..
            } => self.stop_execution(now, execution, deadline),
            Effect::KillExecution { execution, .. } => self.kill(execution),
            Effect::AttemptSettled {
                session,
                attempt,
                outcome,
            } => {
                // The open that asked for history ends with the attempt that serves it,
                // whatever its outcome: the client's `session/load` is answered now, so a
                // later load's history (a recovery's, or a fresh runtime's before the next
                // prompt) is not the client's. An attempt that failed or was cancelled
                // loaded nothing (found by proxy-crash-restart seed 26: a load whose first
                // runtime died before loading, answered with an error, then the recovery's
                // history reached the client); one that settled Ready on a conversation
                // created in place of the one asked for (rule 6's fallback) loaded nothing
                // either (found by proxy-session-methods: the next prompt's runtime, started
                // after the agent exited between turns, loaded the new conversation and its
                // history reached the client with no load of its own open).
                if let Some(book) = self.books.get_mut(&session) {
                    book.setup.history = false;
                }
                self.emit(SessionEvent::AttemptSettled {
                    session,
                    attempt,
                    outcome,
                });
            }
            Effect::JoinTimedOut { session, attempt } => {
                self.emit(SessionEvent::JoinTimedOut { session, attempt });
            }
            Effect::Deliver {
                session, turn, seq, ..
            } => self.deliver(now, session, turn, seq),
            Effect::TurnEnded {
                session,
                turn,
                outcome,
            } => self.turn_ended(now, session, turn, outcome),
            Effect::RecoveryStarted {
                session,
                turn,
                step,
                at,
            } => self.emit_after_output(
                now,
                SessionEvent::RecoveryStarted {
                    session,
                    turn,
                    step,
                    at,
                },
            ),
            Effect::RecoveryExhausted { session, turn } => {
                self.emit_after_output(now, SessionEvent::RecoveryExhausted { session, turn });
            }
            Effect::FailureReported { session, failure } => {
                self.failure_reported(now, session, failure);
            }
            Effect::TurnSilent {
                session, idle_ms, ..
            } => {
                // The core gives the runtime up for the turn (its cancel and stop follow):
                // if the turn ends without completing, this is why.
                self.stats.turns_silent += 1;
                self.turn_causes
                    .insert(session, FailureCause::PromptIdle { idle_ms });
            }
        }
    }

    /// `StartRuntime`: ask the shell for a process (or, with runtime reuse, wait for the
    /// one a retired attempt's spawn is starting).
    fn start_runtime(&mut self, session: SessionId, attempt: AttemptId) {
        // Reuse: a retired attempt's process is still being started; the new
        // attempt takes it over when it is up (see `spawned`) rather than starting
        // a second one.
        let reusable = self.config.reuse_runtimes
            && self
                .spawning
                .iter()
                .any(|(s, a)| *s == session && *a != attempt);
        if reusable {
            self.waiting.insert(session, attempt);
        } else {
            self.spawn(session, attempt);
        }
    }

    /// `LoadConversation`: `session/load` of the ACP session id the token stands for.
    fn load_conversation(
        &mut self,
        now: Timestamp,
        session: SessionId,
        execution: ExecutionId,
        token: ConversationToken,
    ) {
        let conversation = self
            .books
            .get(&session)
            .and_then(|b| b.conversation.as_ref())
            .filter(|(t, _)| *t == token)
            .map(|(_, id)| id.clone());
        let Some(conversation) = conversation else {
            if let Some(attempt) = self.runtimes.get(&execution).map(|r| r.attempt) {
                let stamp = self.stamp(attempt, FailureCause::UnknownConversation);
                self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
            }
            return;
        };
        if !self.runtimes.get(&execution).is_some_and(Runtime::alive) {
            self.report_exit(
                now,
                execution,
                FailureCause::Load(RpcFailure::TransportClosed),
            );
            return;
        }
        if let Some(runtime) = self.runtimes.get_mut(&execution) {
            runtime.loading = Some(conversation.clone());
        }
        let setup = self
            .books
            .get(&session)
            .and_then(|b| b.setup.params.as_ref());
        let params = match setup.and_then(|p| load_params(p, &conversation)) {
            Some(params) => acp::Params::Raw(params),
            None => acp::Params::LoadSession {
                session_id: conversation.clone(),
                cwd: self.config.cwd.clone(),
            },
        };
        self.emit(SessionEvent::ConversationLoading {
            session,
            execution,
            conversation,
        });
        self.act(Action::Request {
            execution,
            op: Op::Load { token },
            method: acp::SESSION_LOAD.into(),
            params,
            deadline: now.plus_millis(self.config.load_timeout_ms),
        });
    }

    /// `NewConversation`: `session/new` (a fallback names its proof).
    fn new_conversation(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        reason: NewConversationReason,
    ) {
        if !self.runtimes.get(&execution).is_some_and(Runtime::alive) {
            self.report_exit(
                now,
                execution,
                FailureCause::NewSession(RpcFailure::TransportClosed),
            );
            return;
        }
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        runtime.new_reason = Some(reason);
        let session = runtime.session;
        let params = match self
            .books
            .get(&session)
            .and_then(|b| b.setup.params.clone())
        {
            Some(params) => acp::Params::Raw(params),
            None => acp::Params::NewSession {
                cwd: self.config.cwd.clone(),
            },
        };
        self.act(Action::Request {
            execution,
            op: Op::New { reason },
            method: acp::SESSION_NEW.into(),
            params,
            deadline: now.plus_millis(self.config.new_session_timeout_ms),
        });
    }

    /// `DispatchPrompt`: `session/prompt` with the caller's original text and the replay
    /// blocks the core asks for; held behind a prompt the agent has not answered yet.
    fn dispatch_prompt(
        &mut self,
        now: Timestamp,
        session: SessionId,
        execution: ExecutionId,
        turn: TurnId,
        request: PromptRequest,
    ) {
        let content = self
            .books
            .get(&session)
            .and_then(|b| b.turn.as_ref())
            .filter(|(t, _)| *t == turn)
            .map(|(_, content)| content.clone());
        let conversation = self
            .runtimes
            .get(&execution)
            .filter(|r| r.alive())
            .and_then(|r| r.conversation.clone());
        let params = match (content, conversation) {
            (Some(PromptContent::Text(text)), Some(conversation)) => Some(acp::Params::Prompt {
                session_id: conversation,
                text: render_prompt(&text, &request),
            }),
            (Some(PromptContent::Blocks(blocks)), Some(conversation)) => {
                prompt_blocks(&conversation, &blocks, &request).map(acp::Params::Raw)
            }
            _ => None,
        };
        let Some(params) = params else {
            // The runtime is gone (its death is reported now, if not yet) or the
            // text is lost: either way this runtime cannot run the turn.
            self.report_exit(
                now,
                execution,
                FailureCause::Prompt(RpcFailure::TransportClosed),
            );
            return;
        };
        self.dispatches += 1;
        let dispatch = self.dispatches;
        let state = PromptState {
            turn,
            dispatch,
            next_seq: 1,
            accepted: false,
            superseded: false,
        };
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        if let Some(earlier) = runtime.prompt.as_mut() {
            // The agent has not answered the prompt before this one (a cancelled
            // turn's, or an abandoned dispatch's): ACP runs one prompt at a time, and
            // until that answer every update it writes belongs to that prompt. Send
            // this one after it; a later dispatch replaces a held one.
            earlier.superseded = true;
            runtime.held = Some((state, params));
            return;
        }
        runtime.prompt = Some(state);
        self.send_prompt(now, execution, state, params);
    }

    /// `CancelPrompt`: `session/cancel`, or drop a dispatch that never left.
    fn cancel_prompt(&mut self, execution: ExecutionId, turn: TurnId) {
        self.close_tickets(execution, true);
        // A dispatch still held behind an earlier prompt never reached the agent:
        // drop it, nothing to cancel.
        if let Some(runtime) = self.runtimes.get_mut(&execution) {
            if runtime
                .held
                .as_ref()
                .is_some_and(|(held, _)| held.turn == turn)
            {
                runtime.held = None;
                return;
            }
        }
        let conversation = self
            .runtimes
            .get(&execution)
            .filter(|r| r.alive())
            .and_then(|r| r.conversation.clone());
        if let Some(conversation) = conversation {
            self.act(Action::Notify {
                execution,
                method: acp::SESSION_CANCEL,
                params: acp::Params::Cancel {
                    session_id: conversation,
                },
            });
        }
    }

    /// `StopExecution`: the shell stops the process (stdin EOF, grace, kill, reap).
    fn stop_execution(&mut self, now: Timestamp, execution: ExecutionId, deadline: Timestamp) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            // Its process is already gone (or died with a previous incarnation).
            self.submit(now, Input::Stopped { execution });
            return;
        };
        runtime.stop_requested = true;
        runtime.prompt = None;
        runtime.held = None;
        let (has_process, reaped) = (runtime.has_process, runtime.reaped.is_some());
        if !has_process {
            self.finish_runtime(now, execution);
        } else if !reaped {
            let grace_ms = self.config.stop_grace_ms;
            self.act(Action::Stop {
                execution,
                deadline,
                grace_ms,
            });
        }
    }

    /// `TurnEnded`: the caller hears of it after the turn's output, with its cause.
    fn turn_ended(
        &mut self,
        now: Timestamp,
        session: SessionId,
        turn: TurnId,
        outcome: TurnOutcome,
    ) {
        let book = self.books.entry(session).or_default();
        if book.turn.as_ref().is_some_and(|(t, _)| *t == turn) {
            book.turn = None;
        }
        let stop_reason = book.stop_reason.take();
        let cause = match outcome {
            TurnOutcome::Completed | TurnOutcome::Cancelled => None,
            // What went wrong last for this session since the turn was claimed;
            // nothing at all means the core gave up on a deadline of its own.
            TurnOutcome::Failed | TurnOutcome::RolledBack => Some(
                self.turn_causes
                    .remove(&session)
                    .unwrap_or(FailureCause::CoreDeadline),
            ),
        };
        self.emit_after_output(
            now,
            SessionEvent::TurnEnded {
                session,
                turn,
                outcome,
                stop_reason,
                cause,
            },
        );
        // The turn's delivery path is done; the next turn gets a fresh one.
        if self.outlets.get(&session).is_some_and(|o| o.turn == turn) {
            self.outlets.remove(&session);
        }
    }

    /// `FailureReported`: the caller hears of it, with the cause the engine remembered.
    fn failure_reported(&mut self, now: Timestamp, session: SessionId, failure: RecoveryFailure) {
        let cause = self.cause_of(failure.stamp, failure.attempt);
        self.turn_causes.insert(session, cause.clone());
        self.emit_after_output(
            now,
            SessionEvent::FailureReported {
                session,
                failure,
                cause,
            },
        );
    }
}

/// `session/load`'s params for `conversation`, from a client's `session/new` params (its
/// `cwd` and `mcpServers`); `None` if they are not an object.
pub(super) fn load_params(setup: &RawJson, conversation: &str) -> Option<RawJson> {
    let mut members: serde_json::Map<String, Value> = setup.parse().ok()?;
    members.retain(|name, _| name == "cwd" || name == "mcpServers");
    members.insert(
        "sessionId".to_owned(),
        Value::String(conversation.to_owned()),
    );
    Some(RawJson::from_value(&Value::Object(members)))
}

/// `session/prompt`'s params for `conversation`: the client's content blocks, as they
/// came, after the replay blocks the core asks for (one text block each). `None` if the
/// blocks are not a JSON array.
pub(super) fn prompt_blocks(
    conversation: &str,
    blocks: &RawJson,
    request: &PromptRequest,
) -> Option<RawJson> {
    #[derive(serde::Serialize)]
    struct Params<'a> {
        #[serde(rename = "sessionId")]
        session_id: &'a str,
        prompt: Vec<&'a serde_json::value::RawValue>,
    }
    let given: Vec<&serde_json::value::RawValue> = blocks.parse().ok()?;
    let replay = render_prompt("", request);
    let replay_block = (!replay.is_empty())
        .then(|| RawJson::from_value(&serde_json::json!({"type": "text", "text": replay})));
    let prompt = replay_block.iter().map(RawJson::raw).chain(given).collect();
    let text = serde_json::to_string(&Params {
        session_id: conversation,
        prompt,
    })
    .ok()?;
    RawJson::from_text(text).ok()
}
