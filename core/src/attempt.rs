//! Rules 1, 2 and 3: attempts. A resume begins an attempt or joins the live one (rule 1); a
//! callback is admitted only from the attempt that speaks for its session, and fails closed
//! otherwise (rule 2); an attempt is retired at most once, into one tombstone (rule 3). Here
//! too: the live attempt's way from a bound runtime to a ready conversation, and its failure.
//!
//! Attempt IDs are minted from one monotonic counter per core (with the epoch on top), so
//! a session only has to remember its live attempt, a ring of the last
//! [`TOMBSTONES_PER_SESSION`] retired ones (`ring.rs`), and a watermark: the newest ID the
//! ring ever evicted. An ID at or below the watermark that is not in the ring is an evicted
//! one and fails closed. Memory stays O(1) per session however many attempts it has had.

use crate::classify::{capability_proof, classify_with, LoadVerdict};
#[cfg(doc)]
use crate::config::TOMBSTONES_PER_SESSION;
use crate::core::Core;
use crate::execution::LeaseAction;
use crate::failure;
use crate::ids::{AttemptId, ErrorStamp, ExecutionId, Generation, SessionId};
use crate::io::{
    AttemptOutcome, Callback, Effect, NewConversationReason, RejectReason, RuntimeEvent, Verdict,
};
use crate::mutants::mutant_on;
use crate::ring::{remember, Remembered, Retired, Tombstone};
use crate::session::{ConvPhase, LiveAttempt, TurnPhase};
use crate::time::Timestamp;
use crate::timers::Timer;
use crate::turn::stream;

/// Who a callback speaks for, once admitted.
#[derive(Clone, Copy, Debug)]
enum Who {
    Live(LiveAttempt),
    Owner(AttemptId),
    /// Admitted without a valid attempt (legacy traffic; or a mutant's stale callback).
    Unfenced,
    /// The owner's stream event, admitted and already applied by `admit`: why it was
    /// refused after admission, if it was.
    Streamed(Option<RejectReason>),
}

impl Core {
    // ----- rule 1: begin or join -------------------------------------------------------

    /// A client asks to resume the session (rule 1): join the live attempt, or say the
    /// runtime is ready, or begin a new attempt.
    pub(crate) fn resume(&mut self, now: Timestamp, session: SessionId) -> Verdict {
        if let Some(s) = self.sessions.get(&session) {
            if let Some(live) = s.live {
                return self.join(now, session, live);
            }
            if s.runtime.is_some() {
                return Verdict::AlreadyReady;
            }
        }
        if !self.can_mint_attempt() {
            return Verdict::Reject(RejectReason::CounterExhausted);
        }
        if let Err(r) = self.ensure_session(session) {
            return Verdict::Reject(r);
        }
        match self.begin_attempt(now, session) {
            Some(attempt) => Verdict::Started { attempt },
            None => Verdict::Reject(RejectReason::CounterExhausted),
        }
    }

    /// The caller joins the live attempt, with a bounded wait.
    fn join(&mut self, now: Timestamp, session: SessionId, live: LiveAttempt) -> Verdict {
        // Every joiner of an attempt is answered at the attempt's one join deadline, set by
        // its first joiner: a later join never extends an earlier joiner's wait (it gets the
        // deadline already running, never more than the configured wait).
        if let Some(until) = live.join_deadline {
            return Verdict::Joined {
                attempt: live.id,
                until,
            };
        }
        let until = now.plus_millis(self.config.join_wait_ms);
        let l = self
            .sess(session)
            .live
            .as_mut()
            .expect("the caller read the live attempt");
        assert!(l.id == live.id && l.join_deadline.is_none());
        l.join_deadline = Some(until);
        // The bug: the deadline is promised but nothing enforces it.
        if !mutant_on!(self.mutant, UnboundedJoinWait) {
            let armed = self.timers.insert((until, Timer::Join(session, live.id)));
            assert!(armed, "rule 1: one join deadline per attempt");
        }
        Verdict::Joined {
            attempt: live.id,
            until,
        }
    }

    /// Begins a new live attempt and asks for its runtime; `None` if the attempt counter
    /// is exhausted.
    pub(crate) fn begin_attempt(
        &mut self,
        now: Timestamp,
        session: SessionId,
    ) -> Option<AttemptId> {
        let id = self.mint_attempt()?;
        let start_deadline = now.plus_millis(self.config.start_deadline_ms);
        let s = self.sess(session);
        // Rule 3: a session's live attempt is retired before another begins. Rule 2 relies
        // on IDs that only grow: every retired or evicted attempt is older than the new one.
        assert!(
            s.live.is_none(),
            "rule 3: {session} begins over a live attempt"
        );
        assert!(
            s.ring.newest().is_none_or(|t| t.attempt < id) && s.watermark.is_none_or(|w| w < id),
            "rule 2: attempt {id} of {session} is not newer than every retired one"
        );
        s.live = Some(LiveAttempt {
            id,
            execution: None,
            generation: None,
            start_deadline,
            join_deadline: None,
            conversation: ConvPhase::Pending,
        });
        self.timers
            .insert((start_deadline, Timer::Start(session, id)));
        self.push(Effect::StartRuntime {
            session,
            attempt: id,
            deadline: start_deadline,
        });
        debug_assert!(self.live_attempt(session) == Some(id));
        Some(id)
    }

    /// Rule 1's bounded wait: the joiners of an attempt still live at its join deadline
    /// are answered that it hung.
    pub(crate) fn join_deadline_passed(&mut self, session: SessionId, attempt: AttemptId) {
        let live = self
            .sessions
            .get(&session)
            .and_then(|s| s.live)
            .filter(|l| l.id == attempt);
        if let Some(l) = live {
            if let Some(s) = self
                .sessions
                .get_mut(&session)
                .and_then(|s| s.live.as_mut())
            {
                s.join_deadline = None;
            }
            self.push(Effect::JoinTimedOut {
                session,
                attempt: l.id,
            });
        }
    }

    /// An attempt still live at its start deadline fails.
    pub(crate) fn start_deadline_passed(
        &mut self,
        now: Timestamp,
        session: SessionId,
        attempt: AttemptId,
    ) {
        let live = self
            .sessions
            .get(&session)
            .and_then(|s| s.live)
            .filter(|l| l.id == attempt);
        if live.is_some() {
            let stamp = self.mint_stamp();
            self.fail_attempt(now, session, stamp);
        }
    }

    /// The user cancels the live attempt: it is retired, and lets go of its execution.
    pub(crate) fn cancel_live(&mut self, now: Timestamp, session: SessionId, live: LiveAttempt) {
        self.retire_live(session, Retired::Cancelled);
        if let Some(e) = live.execution {
            self.release_execution(now, session, live.id, e);
        }
    }

    // ----- rule 3: retire once -----------------------------------------------------------

    /// Retires the live attempt (rule 3: only a live attempt can be retired, so at most one
    /// tombstone per attempt) and settles what waited on it.
    pub(crate) fn retire_live(
        &mut self,
        session: SessionId,
        outcome: Retired,
    ) -> Option<LiveAttempt> {
        let s = self.sess(session);
        let live = s.live.take()?;
        // Tombstones go in in the order attempts were minted, so an attempt is in the ring
        // at most once (rule 3) and `Ring::find` finds the one.
        assert!(
            s.ring.newest().is_none_or(|t| t.attempt < live.id),
            "rule 3: {} retired after a newer attempt of {session}",
            live.id
        );
        let tombstone = Tombstone {
            attempt: live.id,
            execution: live.execution,
            outcome,
        };
        if let Some(evicted) = s.ring.push(tombstone) {
            s.watermark = Some(
                s.watermark
                    .map_or(evicted.attempt, |w| w.max(evicted.attempt)),
            );
        }
        if outcome == Retired::Finished {
            s.owner = Some(live.id);
            s.runtime = live.execution;
        }
        debug_assert!(s.live.is_none() && s.ring.newest() == Some(tombstone));
        debug_assert!(
            s.watermark
                .is_none_or(|w| s.ring.iter().next().is_some_and(|t| w < t.attempt)),
            "rule 2: {session}'s watermark is below every tombstone it keeps"
        );
        self.timers
            .remove(&(live.start_deadline, Timer::Start(session, live.id)));
        if let Some(j) = live.join_deadline {
            self.timers.remove(&(j, Timer::Join(session, live.id)));
        }
        let settled = match outcome {
            Retired::Cancelled => AttemptOutcome::Cancelled,
            Retired::Failed => AttemptOutcome::Failed,
            Retired::Finished => AttemptOutcome::Ready,
        };
        self.push(Effect::AttemptSettled {
            session,
            attempt: live.id,
            outcome: settled,
        });
        self.settle_orphans(session, live.id);
        Some(live)
    }

    // ----- rule 2: admission, failing closed -----------------------------------------------

    /// A runtime's callback: admitted (rule 2, with rule 4's generation check), then applied
    /// for whom it speaks.
    pub(crate) fn callback(&mut self, now: Timestamp, cb: &Callback) -> Verdict {
        let who = match self.admit(now, cb) {
            Ok(who) => who,
            Err(reason) => return Verdict::Reject(reason),
        };
        match who {
            Who::Live(live) => self.apply_live(now, cb, live),
            Who::Owner(owner) => self.apply_owner(now, cb, owner),
            Who::Unfenced => self.apply_unfenced(now, cb),
            Who::Streamed(None) => {
                if self.config.turn_idle_ms > 0 {
                    self.turn_heard(now, cb.session);
                }
                Verdict::Accepted
            }
            Who::Streamed(Some(reason)) => Verdict::Reject(reason),
        }
    }

    /// Decides who the callback speaks for, or why it is refused. Touches state only for the
    /// teardown a stale failure calls for (rule 5) and, once an owner's stream event is
    /// admitted, to apply it (see `Who::Streamed`).
    fn admit(&mut self, now: Timestamp, cb: &Callback) -> Result<Who, RejectReason> {
        let s = self
            .sessions
            .get_mut(&cb.session)
            .ok_or(RejectReason::UnknownSession)?;
        let who = match cb.attempt {
            None if s.ever_attempted() => return Err(RejectReason::MissingAttempt),
            None => Who::Unfenced,
            Some(a) => {
                if a.epoch() > self.epoch {
                    return Err(RejectReason::FutureEpoch);
                }
                if a.epoch() == self.epoch && a.seq() >= self.next_attempt_seq {
                    return Err(RejectReason::UnknownAttempt);
                }
                match (&s.live, s.owner) {
                    (Some(live), _) if live.id == a => Who::Live(*live),
                    (None, Some(owner)) if owner == a => Who::Owner(owner),
                    _ => match remember(&s.ring, s.watermark, a) {
                        Remembered::Tomb(t) => {
                            let stale_ready = matches!(
                                cb.event,
                                RuntimeEvent::ConversationLoaded
                                    | RuntimeEvent::ConversationCreated { .. }
                            );
                            if t.outcome == Retired::Cancelled
                                && stale_ready
                                && mutant_on!(self.mutant, StaleCallbackDispatches)
                            {
                                Who::Unfenced
                            } else {
                                self.stale_failure_teardown(now, cb, t);
                                return Err(match t.outcome {
                                    Retired::Cancelled => RejectReason::AttemptCancelled,
                                    Retired::Failed => RejectReason::AttemptFailed,
                                    Retired::Finished => RejectReason::AttemptSuperseded,
                                });
                            }
                        }
                        Remembered::Evicted
                            if mutant_on!(self.mutant, TombstoneEvictionReopens) =>
                        {
                            Who::Unfenced
                        }
                        Remembered::Evicted => return Err(RejectReason::AttemptEvicted),
                        Remembered::Unknown => return Err(RejectReason::UnknownAttempt),
                    },
                }
            }
        };
        if matches!(who, Who::Unfenced) {
            // Unfenced traffic is what the fence exists to refuse; only a mutant or a session
            // that never had an attempt gets here, and both act as the legacy path did:
            // without an execution or generation check.
            return Ok(who);
        }
        let exec = self
            .executions
            .get(&cb.execution)
            .ok_or(RejectReason::UnknownExecution)?;
        if exec.session != cb.session {
            return Err(RejectReason::ForeignExecution);
        }
        match who {
            Who::Live(live) if live.execution != Some(cb.execution) => {
                return Err(RejectReason::WrongExecution)
            }
            Who::Owner(_) if s.runtime != Some(cb.execution) => {
                return Err(RejectReason::WrongExecution)
            }
            _ => {}
        }
        if cb.generation < exec.generation {
            return Err(RejectReason::StaleGeneration);
        }
        if cb.generation > exec.generation {
            return Err(RejectReason::FutureGeneration);
        }
        // The attempt admitted to speak for the execution owns it (rules 4 and 5): nobody
        // rebinds a live attempt's execution, and a ready runtime is its owner's until
        // someone stops it.
        if let Who::Live(LiveAttempt { id: a, .. }) | Who::Owner(a) = who {
            assert!(
                exec.owner == a,
                "rule 5: {a} speaks for {} without owning it",
                cb.execution
            );
        }
        if let (Who::Owner(_), RuntimeEvent::Stream { turn, seq, bytes }) = (who, &cb.event) {
            // The hot path of a streaming turn, applied while the session is at hand rather
            // than looked up again: what `apply_owner` does for a stream event.
            let refused = stream(s, &mut self.effects, cb, *turn, *seq, *bytes).err();
            return Ok(Who::Streamed(refused));
        }
        Ok(who)
    }

    /// What the unfenced (legacy) path did: act on the session's current state with no
    /// attempt or generation check. Reached by a never-attempted session (which has no
    /// runtime to act on) or by a mutant.
    fn apply_unfenced(&mut self, now: Timestamp, cb: &Callback) -> Verdict {
        let session = cb.session;
        // kandev's legacy path (the callback with no attempt identity that an evicted
        // tombstone falls back to) looked the session's runtime up by the session, never by
        // the callback's own execution: any ready callback readied the session's current
        // runtime and sent it the waiting prompt ("a delayed provider callback mutates a
        // replacement execution"). The stale ready callback of a cancelled attempt acted on
        // its own execution.
        let by_session = mutant_on!(self.mutant, TombstoneEvictionReopens);
        let waiting = self
            .sessions
            .get(&session)
            .and_then(|s| s.turn)
            .is_some_and(|t| t.phase == TurnPhase::WaitingRuntime);
        let attempt = self
            .sessions
            .get(&session)
            .and_then(|s| s.live.map(|l| l.id).or(s.owner));
        let ready = match cb.event {
            RuntimeEvent::ConversationLoaded | RuntimeEvent::ConversationCreated { .. } => true,
            RuntimeEvent::AgentReady { .. } => by_session,
            _ => false,
        };
        if let (true, Some(attempt), true) = (waiting, attempt, ready) {
            let target = if by_session {
                self.sessions
                    .get(&session)
                    .and_then(|s| s.live.and_then(|l| l.execution).or(s.runtime))
                    .unwrap_or(cb.execution)
            } else {
                cb.execution
            };
            if let Some(generation) = self.executions.get(&target).map(|e| e.generation) {
                self.dispatch(now, session, attempt, target, generation);
            }
        }
        Verdict::Accepted
    }

    // ----- the live attempt: from a bound runtime to a ready conversation -----------------

    /// The live attempt's own callback: its runtime's way to a ready conversation (rule 6
    /// decides a failed load), its failure, or the provider accepting its prompt.
    fn apply_live(&mut self, now: Timestamp, cb: &Callback, live: LiveAttempt) -> Verdict {
        let session = cb.session;
        let Some(generation) = live.generation else {
            return Verdict::Reject(RejectReason::WrongExecution);
        };
        match cb.event {
            RuntimeEvent::BootReady => Verdict::Accepted,
            RuntimeEvent::AgentReady { load_capability } => {
                if live.conversation != ConvPhase::Pending {
                    return Verdict::Reject(RejectReason::UnexpectedEvent);
                }
                let token = self.sessions.get(&session).and_then(|s| s.token);
                // Rule 6: an agent that cannot load gets `session/new` at once, and the
                // reason says which proof it was (`false` and absent are told apart).
                let step = match (token, capability_proof(load_capability)) {
                    (Some(_), None) => ConvPhase::Loading,
                    (Some(_), Some(proof)) => {
                        ConvPhase::Creating(NewConversationReason::Fallback(proof))
                    }
                    (None, _) => ConvPhase::Creating(NewConversationReason::First),
                };
                if !self.request_conversation(now, session, live.id, cb.execution, generation, step)
                {
                    return Verdict::Reject(RejectReason::CounterExhausted);
                }
                Verdict::Accepted
            }
            RuntimeEvent::ConversationCreated { token } => {
                if !matches!(live.conversation, ConvPhase::Creating(_)) {
                    return Verdict::Reject(RejectReason::UnexpectedEvent);
                }
                self.sess(session).token = Some(token);
                self.attempt_ready(now, session, live, cb.execution, generation);
                Verdict::Accepted
            }
            RuntimeEvent::ConversationLoaded => {
                let has_token = self
                    .sessions
                    .get(&session)
                    .is_some_and(|s| s.token.is_some());
                if live.conversation != ConvPhase::Loading || !has_token {
                    return Verdict::Reject(RejectReason::UnexpectedEvent);
                }
                self.attempt_ready(now, session, live, cb.execution, generation);
                Verdict::Accepted
            }
            RuntimeEvent::LoadFailed(ref outcome) => {
                if live.conversation != ConvPhase::Loading {
                    return Verdict::Reject(RejectReason::UnexpectedEvent);
                }
                let c = classify_with(outcome, self.config.agent_profile, self.mutant);
                match c.verdict {
                    LoadVerdict::Incompatible => {
                        let step = ConvPhase::Creating(NewConversationReason::Fallback(c.reason));
                        if !self.request_conversation(
                            now,
                            session,
                            live.id,
                            cb.execution,
                            generation,
                            step,
                        ) {
                            return Verdict::Reject(RejectReason::CounterExhausted);
                        }
                    }
                    LoadVerdict::Inconclusive | LoadVerdict::TransportDead => {
                        if mutant_on!(self.mutant, InconclusiveLoadDropsToken) {
                            // The bug: the failed load forgets which conversation it was.
                            self.sess(session).token = None;
                        }
                        let stamp = self.mint_stamp();
                        self.fail_attempt(now, session, stamp);
                    }
                }
                Verdict::Accepted
            }
            RuntimeEvent::StartFailed { stamp } => {
                self.fail_attempt(now, session, stamp);
                Verdict::Accepted
            }
            RuntimeEvent::Exited { stamp } => {
                self.forget_execution(cb.execution);
                self.fail_attempt(now, session, stamp);
                Verdict::Accepted
            }
            RuntimeEvent::PromptAccepted { turn } => {
                if !self.turn_on(session, turn, cb.execution, false) {
                    return Verdict::Reject(RejectReason::WrongTurn);
                }
                self.mark_accepted(now, session, cb.execution);
                self.retire_live(session, Retired::Finished);
                Verdict::Accepted
            }
            RuntimeEvent::Stream { .. }
            | RuntimeEvent::PromptCompleted { .. }
            | RuntimeEvent::PromptFailed { .. } => Verdict::Reject(RejectReason::UnexpectedEvent),
        }
    }

    /// Asks for the live attempt's conversation (`session/load` or `session/new`) under
    /// a lease, and records the step it now waits for. False if no lease could be minted.
    pub(crate) fn request_conversation(
        &mut self,
        now: Timestamp,
        session: SessionId,
        attempt: AttemptId,
        execution: ExecutionId,
        generation: Generation,
        step: ConvPhase,
    ) -> bool {
        let token = self.sessions.get(&session).and_then(|s| s.token);
        // `Ok`: load this conversation; `Err`: create one, for this reason.
        let ask = match (step, token) {
            (ConvPhase::Loading, Some(token)) => Ok(token),
            (ConvPhase::Creating(reason), _) => Err(reason),
            _ => return false,
        };
        let action = match ask {
            Ok(_) => LeaseAction::Load,
            Err(_) => LeaseAction::New,
        };
        let Some(lease) = self.lease(now, session, execution, generation, attempt, action) else {
            return false;
        };
        if let Some(l) = self.sess(session).live.as_mut() {
            l.conversation = step;
        }
        self.push(match ask {
            Err(reason) => Effect::NewConversation {
                lease,
                session,
                execution,
                generation,
                reason,
            },
            Ok(token) => Effect::LoadConversation {
                lease,
                session,
                execution,
                generation,
                token,
            },
        });
        true
    }

    /// The live attempt's conversation is ready: dispatch the waiting turn under its lease,
    /// or finish the attempt.
    fn attempt_ready(
        &mut self,
        now: Timestamp,
        session: SessionId,
        live: LiveAttempt,
        execution: ExecutionId,
        generation: Generation,
    ) {
        if let Some(l) = self.sess(session).live.as_mut() {
            l.conversation = ConvPhase::Ready;
        }
        let waiting = self
            .sessions
            .get(&session)
            .and_then(|s| s.turn)
            .is_some_and(|t| t.phase == TurnPhase::WaitingRuntime);
        if waiting {
            self.dispatch(now, session, live.id, execution, generation);
        } else {
            self.retire_live(session, Retired::Finished);
        }
        debug_assert!(self.sessions[&session]
            .live
            .is_none_or(|l| l.conversation == ConvPhase::Ready));
    }

    /// The live attempt failed: retire it, let go of its execution, report the failure
    /// (rule 10), and roll back or recover the turn that waited on it.
    pub(crate) fn fail_attempt(&mut self, now: Timestamp, session: SessionId, stamp: ErrorStamp) {
        let Some(live) = self.retire_live(session, Retired::Failed) else {
            return;
        };
        if let Some(e) = live.execution {
            self.release_execution(now, session, live.id, e);
        }
        let mutant = self.mutant;
        let stored = &mut self.sess(session).failure;
        if let Some(failure) = failure::report(stored, live.id, live.execution, stamp, mutant) {
            self.push(Effect::FailureReported { session, failure });
        }
        let waiting = self
            .sessions
            .get(&session)
            .and_then(|s| s.turn)
            .is_some_and(|t| {
                matches!(
                    t.phase,
                    TurnPhase::WaitingRuntime
                        | TurnPhase::Dispatched { .. }
                        | TurnPhase::Performed { .. }
                )
            });
        if waiting && mutant_on!(mutant, ExhaustedTwice) {
            // The bug: the failed replacement's path records exhaustion itself when the
            // schedule is used up, and the turn's recovery path records it again below.
            let used_up = self
                .sessions
                .get(&session)
                .and_then(|s| s.turn)
                .filter(|t| {
                    t.accepted_once
                        && !t.user_cancelled
                        && !self.config.recovery_delays_ms.is_empty()
                        && usize::from(t.recoveries_started) >= self.config.recovery_delays_ms.len()
                });
            if let Some(t) = used_up {
                self.push(Effect::RecoveryExhausted {
                    session,
                    turn: t.id,
                });
            }
        }
        if waiting {
            self.turn_lost_runtime(now, session);
        }
    }
}
