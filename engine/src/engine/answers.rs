//! What the agents say: `session/update`s during a prompt, and the answers to the
//! requests the engine sent, each turned into the core's callbacks.

use super::*;

impl Engine {
    pub(super) fn notification(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        parsed: acp::SessionUpdate,
        wire_bytes: usize,
    ) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            self.stats.notifications_ignored += 1;
            return;
        };
        #[cfg(feature = "mutants")]
        let parsed = if self.driver.core().active_mutant().get()
            == Some(palisade_core::mutants::Mutant::UpdateScanMisreadsEscapes)
        {
            misread(&parsed)
        } else {
            parsed
        };
        // The update's head, read from its text.
        let (session_state, kind) = {
            let head = parsed
                .update
                .as_ref()
                .map(|u| UpdateHead::of(u.raw()))
                .unwrap_or_default();
            (events::is_session_state(&head), kind_of(&head))
        };
        let update = parsed.update.unwrap_or_else(RawJson::null);
        let ours = runtime.conversation.is_some()
            && parsed.session_id.as_deref() == runtime.conversation.as_deref();
        let Some(prompt) = runtime
            .prompt
            .as_mut()
            .filter(|p| ours && !session_state && !p.superseded)
        else {
            // History replayed by session/load, or chatter outside a prompt: the client's,
            // when one stands behind the caller and the runtime is the session's own.
            let session = runtime.session;
            let loading = runtime.loading.is_some()
                && parsed.session_id.as_deref() == runtime.loading.as_deref();
            let current = runtime.alive() && runtime.prompt.is_none_or(|p| !p.superseded);
            let client = self.config.client == ClientSide::Forward && current;
            let wants_history = self.books.get(&session).is_some_and(|b| b.setup.history);
            if client && loading && wants_history {
                self.emit(SessionEvent::History { session, update });
            } else if client && ours {
                self.emit_after_output(now, SessionEvent::Update { session, update });
            } else {
                self.stats.notifications_ignored += 1;
            }
            return;
        };
        let turn = prompt.turn;
        let seq = prompt.next_seq;
        prompt.next_seq += 1;
        let first = !prompt.accepted;
        prompt.accepted = true;
        let session = runtime.session;
        if first {
            self.callback(now, execution, RuntimeEvent::PromptAccepted { turn });
        }
        self.pending_output = Some(PendingOutput {
            session,
            turn,
            kind,
            item: OutputItem {
                update,
                wire_bytes,
                // Set when the core admits it (`Deliver`).
                admitted: 0,
            },
        });
        let bytes = u32::try_from(wire_bytes).unwrap_or(u32::MAX);
        self.callback(now, execution, RuntimeEvent::Stream { turn, seq, bytes });
        if self.pending_output.take().is_some() {
            self.stats.outputs_rejected += 1;
        }
    }

    pub(super) fn load_answer(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        result: Result<RawJson, RpcFailure>,
    ) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        let conversation = runtime.loading.take().unwrap_or_default();
        let session = runtime.session;
        let attempt = runtime.attempt;
        match result {
            Ok(answer) => {
                runtime.conversation = Some(conversation.clone());
                let verdict = self.callback(now, execution, RuntimeEvent::ConversationLoaded);
                if verdict == Some(Verdict::Accepted) {
                    if let Some(book) = self.books.get_mut(&session) {
                        book.setup.history = false;
                    }
                    self.emit(SessionEvent::ConversationReady {
                        session,
                        execution,
                        conversation,
                        origin: ConversationOrigin::Loaded,
                        answer: self.client_answer(answer),
                    });
                }
            }
            Err(failure) => {
                let (result, transport) = match &failure {
                    RpcFailure::Rpc(error) => {
                        (LoadFailure::Rpc(classify_error(error)), runtime.transport())
                    }
                    RpcFailure::TimedOut | RpcFailure::TooManyPending => {
                        (LoadFailure::TimedOut, runtime.transport())
                    }
                    // No answer came because the transport died; the classifier decides
                    // from the transport's state, never from the missing answer.
                    RpcFailure::TransportClosed | RpcFailure::Garbage { .. } => {
                        (LoadFailure::TimedOut, TransportState::Closed)
                    }
                    RpcFailure::ProcessExited { .. } => {
                        (LoadFailure::TimedOut, TransportState::ProcessExited)
                    }
                    RpcFailure::Killed => (LoadFailure::Cancelled, TransportState::Closed),
                };
                let outcome = LoadOutcome {
                    load_capability: runtime.load_capability,
                    requested_session: conversation,
                    result,
                    transport,
                    listing: SessionListing::Unknown,
                };
                // A "not found" is the agent's word: an agent that can list its sessions is
                // asked first whether it still has this one.
                let profile = self.config.core.agent_profile;
                let ask = runtime.alive()
                    && (runtime.lists_sessions || profile.lists_sessions())
                    && classify::classify(&outcome, profile)
                        .reason
                        .may_be_overturned_by_listing();
                // The core mints the stamp of an inconclusive load; the cause is found by
                // attempt.
                self.remember_cause(None, attempt, FailureCause::Load(failure));
                if ask {
                    if let Some(runtime) = self.runtimes.get_mut(&execution) {
                        runtime.listing = Some(PendingListing { outcome, pages: 0 });
                    }
                    self.ask_list(now, execution, None);
                    return;
                }
                self.callback(now, execution, RuntimeEvent::LoadFailed(outcome));
            }
        }
    }

    /// Sends `session/list` (from `cursor`) for the load failure held back on `execution`.
    pub(super) fn ask_list(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        cursor: Option<&str>,
    ) {
        self.act(Action::Request {
            execution,
            op: Op::List,
            method: acp::SESSION_LIST.into(),
            params: acp::Params::ListSessions {
                cursor: cursor.map(str::to_owned),
            },
            deadline: now.plus_millis(self.config.load_timeout_ms),
        });
    }

    /// The agent's `session/list` answered: the held-back load failure goes to the core
    /// saying whether the agent lists the session (or the next page is asked for).
    pub(super) fn list_answer(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        result: Result<RawJson, RpcFailure>,
    ) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        let Some(mut pending) = runtime.listing.take() else {
            return;
        };
        match result {
            Ok(answer) => {
                // An answer no tree can hold is not a list.
                let (listed, next) = answer.parse::<Value>().map_or((None, None), |tree| {
                    acp::listed_in(&tree, &pending.outcome.requested_session)
                });
                pending.pages += 1;
                pending.outcome.listing = match (listed, next) {
                    (Some(true), _) => SessionListing::Listed,
                    (Some(false), Some(cursor)) if pending.pages < MAX_LIST_PAGES => {
                        runtime.listing = Some(pending);
                        self.ask_list(now, execution, Some(&cursor));
                        return;
                    }
                    (Some(false), None) => SessionListing::NotListed,
                    // Past the page bound, or not a list: the agent's "not found" stands.
                    _ => SessionListing::Unknown,
                };
            }
            // The connection died meanwhile: that decides, as for the load itself.
            Err(RpcFailure::TransportClosed | RpcFailure::Garbage { .. } | RpcFailure::Killed) => {
                pending.outcome.transport = TransportState::Closed;
            }
            Err(RpcFailure::ProcessExited { .. }) => {
                pending.outcome.transport = TransportState::ProcessExited;
            }
            // No list (−32601, an error, no answer in time): the "not found" stands.
            Err(_) => {}
        }
        self.callback(now, execution, RuntimeEvent::LoadFailed(pending.outcome));
    }

    pub(super) fn new_answer(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        reason: NewConversationReason,
        result: Result<RawJson, RpcFailure>,
    ) {
        let Some(runtime) = self.runtimes.get(&execution) else {
            return;
        };
        let session = runtime.session;
        let attempt = runtime.attempt;
        match result {
            Ok(answer) => {
                let Some(id) = acp::string_member(&answer, "sessionId") else {
                    // As the tree prints it, whatever the agent's spacing (as written when
                    // no tree can hold it).
                    let shown = answer
                        .parse::<Value>()
                        .map_or_else(|_| answer.get().to_owned(), |tree| tree.to_string());
                    let stamp = self.stamp(attempt, FailureCause::NewSessionAnswer(shown));
                    self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
                    return;
                };
                let token = ConversationToken::new(self.counters.next_token)
                    .expect("the token counter starts at 1 and only grows");
                self.counters.next_token = self.counters.next_token.saturating_add(1);
                if let Some(runtime) = self.runtimes.get_mut(&execution) {
                    runtime.conversation = Some(id.clone());
                    runtime.new_reason = None;
                }
                // Recorded before the callback: a dispatch in the same step, and any
                // persisted state, must know which ACP session the token stands for.
                let book = self.books.entry(session).or_default();
                let previous = book.conversation.replace((token, id.clone()));
                let verdict =
                    self.callback(now, execution, RuntimeEvent::ConversationCreated { token });
                if verdict == Some(Verdict::Accepted) {
                    self.emit(SessionEvent::ConversationReady {
                        session,
                        execution,
                        conversation: id,
                        origin: origin_of(reason),
                        answer: self.client_answer(answer),
                    });
                } else if let Some(book) = self.books.get_mut(&session) {
                    // The core kept its old token: so do we.
                    book.conversation = previous;
                }
            }
            Err(failure) if is_transport(&failure) => {}
            Err(failure) => {
                let stamp = self.stamp(attempt, FailureCause::NewSession(failure));
                self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
            }
        }
    }

    pub(super) fn prompt_answer(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        turn: TurnId,
        dispatch: u64,
        result: Result<RawJson, RpcFailure>,
    ) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        // An answer to an earlier dispatch (one a cancel or a missed acceptance deadline
        // ended, possibly of this same turn) changes nothing.
        let Some(prompt) = runtime
            .prompt
            .filter(|p| p.turn == turn && p.dispatch == dispatch)
        else {
            return;
        };
        let session = runtime.session;
        let attempt = runtime.attempt;
        // The agent answered: a prompt held behind this one may go now, after this answer
        // is acted on.
        let held = runtime.held.take();
        if prompt.superseded {
            runtime.prompt = None;
        } else {
            self.prompt_result(now, execution, session, attempt, turn, prompt, result);
        }
        if let Some((state, params)) = held {
            if let Some(runtime) = self.runtimes.get_mut(&execution).filter(|r| r.alive()) {
                if runtime.prompt.is_none() {
                    runtime.prompt = Some(state);
                    self.send_prompt(now, execution, state, params);
                }
            }
        }
    }

    /// Sends a dispatch's `session/prompt`.
    pub(super) fn send_prompt(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        state: PromptState,
        params: acp::Params,
    ) {
        self.act(Action::Request {
            execution,
            op: Op::Prompt {
                turn: state.turn,
                dispatch: state.dispatch,
            },
            method: acp::SESSION_PROMPT.into(),
            params,
            deadline: now.plus_millis(PROMPT_REQUEST_DEADLINE_MS),
        });
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn prompt_result(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        session: SessionId,
        attempt: AttemptId,
        turn: TurnId,
        prompt: PromptState,
        result: Result<RawJson, RpcFailure>,
    ) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        match result {
            Ok(answer) => {
                runtime.prompt = None;
                if !prompt.accepted {
                    self.callback(now, execution, RuntimeEvent::PromptAccepted { turn });
                }
                let stop_reason = acp::string_member(&answer, "stopReason");
                self.books.entry(session).or_default().stop_reason = stop_reason;
                self.callback(now, execution, RuntimeEvent::PromptCompleted { turn });
                if let Some(book) = self.books.get_mut(&session) {
                    book.stop_reason = None;
                }
            }
            Err(RpcFailure::Rpc(error)) => {
                runtime.prompt = None;
                // An error answer proves the agent saw the prompt: accepted, then failed.
                if !prompt.accepted {
                    self.callback(now, execution, RuntimeEvent::PromptAccepted { turn });
                }
                let cause = FailureCause::Prompt(RpcFailure::Rpc(error));
                self.turn_causes.insert(session, cause.clone());
                let stamp = self.stamp(attempt, cause);
                self.callback(now, execution, RuntimeEvent::PromptFailed { turn, stamp });
            }
            Err(failure) if is_transport(&failure) => runtime.prompt = None,
            Err(failure) => self.report_exit(now, execution, FailureCause::Prompt(failure)),
        }
    }

    /// An answer to show the client, when one stands behind the caller.
    fn client_answer(&self, answer: RawJson) -> Option<RawJson> {
        (self.config.client == ClientSide::Forward).then_some(answer)
    }
}

/// Mutant `update-scan-misreads-escapes`: what a hand-written scanner makes of the params
/// the agent wrote (as agents write them: the session id, then the update).
#[cfg(feature = "mutants")]
fn misread(parsed: &acp::SessionUpdate) -> acp::SessionUpdate {
    let mut members = Vec::new();
    if let Some(id) = &parsed.session_id {
        members.push(format!(
            "\"sessionId\":{}",
            serde_json::to_string(id).expect("a string always serializes")
        ));
    }
    if let Some(update) = &parsed.update {
        members.push(format!("\"update\":{}", update.get()));
    }
    let params = RawJson::from_text(format!("{{{}}}", members.join(",")))
        .expect("members of valid JSON make valid JSON");
    let scanned = crate::events::UpdateParams::scanned(&params);
    acp::SessionUpdate {
        session_id: scanned.session_id.map(std::borrow::Cow::into_owned),
        update: scanned.update.map(RawJson::from),
    }
}
