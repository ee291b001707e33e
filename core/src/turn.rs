//! Rules 7 and 8: prompt turns and their automatic recovery.
//!
//! A turn is claimed, dispatched to a ready runtime under a lease, accepted by the
//! provider, and ends exactly once. Every exit before the provider accepts rolls the claim
//! back (the user is told and may resend); a runtime that dies after acceptance is
//! replaced on the configured schedule, and the re-prompt carries the resume-replay block
//! exactly once, built from the current recovery generation.

use std::collections::VecDeque;

use crate::core::Core;
use crate::execution::LeaseAction;
use crate::ids::{AttemptId, ExecutionId, Generation, SessionId, TurnId};
use crate::io::{
    Callback, Effect, PromptRequest, RejectReason, RuntimeEvent, TurnOutcome, Verdict,
};
use crate::mutants::{mutant_on, ActiveMutant};
use crate::session::{Session, Turn, TurnPhase};
use crate::time::Timestamp;
use crate::timers::Timer;

/// Whether `t` is turn `turn` running on `execution` (and accepted, if `accepted`).
fn runs_on(t: &Turn, turn: TurnId, execution: ExecutionId, accepted: bool) -> bool {
    t.id == turn
        && match t.phase {
            TurnPhase::Accepted { execution: e } => e == execution,
            TurnPhase::Dispatched { execution: e, .. }
            | TurnPhase::Performed { execution: e, .. } => !accepted && e == execution,
            _ => false,
        }
}

/// Applies a stream event of the runtime owner's accepted turn: checks the turn and the
/// runtime's sequence number, and delivers it under the caller's next sequence number.
pub(crate) fn stream(
    s: &mut Session,
    effects: &mut VecDeque<Effect>,
    cb: &Callback,
    turn: TurnId,
    seq: u64,
    bytes: u32,
) -> Result<(), RejectReason> {
    let Some(t) = s
        .turn
        .as_mut()
        .filter(|t| runs_on(t, turn, cb.execution, true))
    else {
        return Err(RejectReason::WrongTurn);
    };
    if seq < t.runtime_next {
        return Err(RejectReason::DuplicateEvent);
    }
    if seq > t.runtime_next {
        return Err(RejectReason::SequenceGap);
    }
    // Every runtime event of this dispatch was delivered under the caller's numbering,
    // which counts on across dispatches (rule 9: no gap, no repeat).
    assert!(
        t.runtime_next <= t.delivered + 1,
        "rule 9: {turn} streams ahead"
    );
    t.runtime_next += 1;
    t.delivered += 1;
    debug_assert!(t.runtime_next <= t.delivered + 1);
    effects.push_back(Effect::Deliver {
        session: cb.session,
        turn,
        seq: t.delivered,
        bytes,
    });
    Ok(())
}

impl Turn {
    /// The request for the next dispatch. A first dispatch carries no replay block; a
    /// re-prompt after recovery wraps the *original* request once, from the current
    /// recovery generation (never an already-wrapped earlier request).
    pub(crate) fn next_request(&mut self, mutant: ActiveMutant) -> PromptRequest {
        if !self.accepted_once {
            // Rule 8: nothing to replay before the provider ever had the turn.
            assert!(self.delivered == 0 && self.recovery_generation == 0);
            return PromptRequest {
                replay_blocks: 0,
                replay_generation: 0,
                delivered_through: 0,
            };
        }
        self.recovery_generation = self.recovery_generation.saturating_add(1);
        let wraps = if mutant_on!(mutant, DoubleReplayBlock) {
            // The bug: the re-prompt wraps the previous request, which every earlier
            // recovery already wrapped, so generation N carries N blocks.
            u8::try_from(self.recovery_generation).unwrap_or(u8::MAX)
        } else {
            1
        };
        let delivered_through = if mutant_on!(mutant, ReplayRepeatsDelivered) {
            // The bug: the replay resumes at the last delivered event instead of after it.
            self.delivered.saturating_sub(1)
        } else {
            self.delivered
        };
        let replay_generation = if mutant_on!(mutant, ReplayGenerationStale) {
            // The bug: the block restates the turn's first recovery, whatever this one is.
            1
        } else {
            self.recovery_generation
        };
        let request = PromptRequest {
            replay_blocks: wraps,
            replay_generation,
            delivered_through,
        };
        // The replay resumes within what the caller has, and a re-prompt carries a block.
        assert!(request.replay_blocks > 0 && request.delivered_through <= self.delivered);
        request
    }
}

impl Core {
    // ----- rule 7: claiming a prompt and dispatching it ---------------------------------

    /// A client submits a prompt: the turn is claimed, and dispatched to the ready runtime
    /// or to the runtime a new attempt starts.
    pub(crate) fn prompt(&mut self, now: Timestamp, session: SessionId, turn: TurnId) -> Verdict {
        let (needs_attempt, ready) = match self.sessions.get(&session) {
            Some(s) => {
                // The bug (mutant): only a turn already on a runtime counts as busy.
                let claimed_over = mutant_on!(self.mutant, PromptClaimedTwice)
                    && s.turn.is_some_and(|t| t.phase == TurnPhase::WaitingRuntime);
                if s.turn.is_some() && !claimed_over {
                    return Verdict::Reject(RejectReason::SessionBusy);
                }
                if s.last_turn.is_some_and(|t| t >= turn) {
                    return Verdict::Reject(RejectReason::DuplicateTurn);
                }
                let ready = match (s.owner, s.runtime) {
                    (Some(owner), Some(e)) if s.live.is_none() => self
                        .executions
                        .get(&e)
                        .filter(|x| !x.is_stopping())
                        .map(|x| (owner, e, x.generation)),
                    _ => None,
                };
                (s.live.is_none() && ready.is_none(), ready)
            }
            None => (true, None),
        };
        if needs_attempt && !self.can_mint_attempt() {
            return Verdict::Reject(RejectReason::CounterExhausted);
        }
        if let Err(r) = self.ensure_session(session) {
            return Verdict::Reject(r);
        }
        let s = self.sess(session);
        s.turn = Some(Turn::new(turn));
        s.last_turn = Some(turn);
        if let Some((owner, e, g)) = ready {
            self.dispatch(now, session, owner, e, g);
        } else if needs_attempt {
            let _ = self.begin_attempt(now, session);
        }
        // Rule 7: a claimed turn is dispatched, or waits for a runtime an attempt is
        // starting; it never waits on nothing.
        debug_assert!({
            let s = &self.sessions[&session];
            s.last_turn == Some(turn)
                && s.turn.is_none_or(|t| {
                    t.id == turn && (t.phase != TurnPhase::WaitingRuntime || s.live.is_some())
                })
        });
        Verdict::Claimed
    }

    /// Sends the claimed turn to `execution` under a lease; the claim is rolled back if no
    /// lease can be minted.
    pub(crate) fn dispatch(
        &mut self,
        now: Timestamp,
        session: SessionId,
        attempt: AttemptId,
        execution: ExecutionId,
        generation: Generation,
    ) {
        let Some(turn) = self
            .sessions
            .get(&session)
            .and_then(|s| s.turn)
            .map(|t| t.id)
        else {
            return;
        };
        let Some(lease) = self.lease(
            now,
            session,
            execution,
            generation,
            attempt,
            LeaseAction::Prompt(turn),
        ) else {
            self.end_turn(session, TurnOutcome::RolledBack);
            return;
        };
        let mutant = self.mutant;
        let t = self.sess(session).turn.as_mut().expect("checked above");
        // Rule 7: a turn goes to one runtime at a time, from waiting for it.
        assert!(
            t.phase == TurnPhase::WaitingRuntime,
            "rule 7: {turn} dispatched from {:?}",
            t.phase
        );
        t.phase = TurnPhase::Dispatched { lease, execution };
        t.runtime_next = 1;
        t.next_loss_rolls_back = false;
        let request = t.next_request(mutant);
        self.push(Effect::DispatchPrompt {
            lease,
            session,
            execution,
            generation,
            turn,
            request,
        });
    }

    /// Whether `turn` is the session's active turn, running on `execution` (and accepted,
    /// if `accepted`).
    pub(crate) fn turn_on(
        &self,
        session: SessionId,
        turn: TurnId,
        execution: ExecutionId,
        accepted: bool,
    ) -> bool {
        self.sessions
            .get(&session)
            .and_then(|s| s.turn)
            .is_some_and(|t| runs_on(&t, turn, execution, accepted))
    }

    /// The provider accepted the turn's prompt on `execution`.
    pub(crate) fn mark_accepted(
        &mut self,
        now: Timestamp,
        session: SessionId,
        execution: ExecutionId,
    ) {
        let mut accept_timer = None;
        if let Some(t) = self.sess(session).turn.as_mut() {
            // The callers checked that the turn runs on this execution.
            assert!(t.execution() == Some(execution));
            if let TurnPhase::Performed { deadline, .. } = t.phase {
                accept_timer = Some((deadline, Timer::Accept(session, t.id)));
            }
            t.phase = TurnPhase::Accepted { execution };
            t.accepted_once = true;
            t.runtime_next = 1;
        }
        if let Some(timer) = accept_timer {
            self.timers.remove(&timer);
        }
        self.turn_heard(now, session);
    }

    /// A callback of the finished attempt that owns the ready runtime: the turn's progress
    /// on it, or the runtime's exit.
    pub(crate) fn apply_owner(
        &mut self,
        now: Timestamp,
        cb: &Callback,
        _owner: AttemptId,
    ) -> Verdict {
        let session = cb.session;
        match cb.event {
            RuntimeEvent::PromptAccepted { turn } => {
                if !self.turn_on(session, turn, cb.execution, false) {
                    return Verdict::Reject(RejectReason::WrongTurn);
                }
                self.mark_accepted(now, session, cb.execution);
                Verdict::Accepted
            }
            RuntimeEvent::PromptCompleted { turn } | RuntimeEvent::PromptFailed { turn, .. } => {
                let on = self.turn_on(session, turn, cb.execution, true)
                    || self.turn_on(session, turn, cb.execution, false);
                if !on {
                    return Verdict::Reject(RejectReason::WrongTurn);
                }
                let cancelled = self.sess(session).turn.is_some_and(|t| t.user_cancelled);
                let outcome = match (cancelled, &cb.event) {
                    (true, _) => TurnOutcome::Cancelled,
                    (false, RuntimeEvent::PromptCompleted { .. }) => TurnOutcome::Completed,
                    (false, _) => TurnOutcome::Failed,
                };
                self.end_turn(session, outcome);
                Verdict::Accepted
            }
            RuntimeEvent::Exited { .. } => {
                self.forget_execution(cb.execution);
                let on_it = self
                    .sessions
                    .get(&session)
                    .and_then(|s| s.turn)
                    .is_some_and(|t| t.execution() == Some(cb.execution));
                if on_it {
                    self.turn_lost_runtime(now, session);
                }
                Verdict::Accepted
            }
            // Also an owner's stream event, were one to get here: `admit` applies those.
            _ => Verdict::Reject(RejectReason::UnexpectedEvent),
        }
    }

    /// Ends the turn with `outcome`: its one terminal.
    pub(crate) fn end_turn(&mut self, session: SessionId, outcome: TurnOutcome) {
        let s = self.sess(session);
        let Some(turn) = s.turn.take() else { return };
        if let Some(at) = turn.idle_at {
            self.timers.remove(&(at, Timer::Idle(session, turn.id)));
        }
        match turn.phase {
            TurnPhase::Recovering { at } => {
                self.timers.remove(&(at, Timer::Recovery(session, turn.id)));
            }
            TurnPhase::Performed { deadline, .. } => {
                self.timers
                    .remove(&(deadline, Timer::Accept(session, turn.id)));
            }
            _ => {}
        }
        self.push(Effect::TurnEnded {
            session,
            turn: turn.id,
            outcome,
        });
    }

    /// The user cancels the turn (rule 7): before acceptance the claim ends cancelled; after
    /// it the provider is asked to stop and the runtime stays up (rule 5: a cancel never
    /// tears down a runtime the provider accepted a prompt on).
    pub(crate) fn cancel_turn(
        &mut self,
        now: Timestamp,
        session: SessionId,
        turn: Turn,
        runtime: Option<ExecutionId>,
    ) {
        match turn.phase {
            TurnPhase::Accepted { execution } => {
                if !turn.user_cancelled {
                    if let Some(t) = self.sess(session).turn.as_mut() {
                        t.user_cancelled = true;
                    }
                    self.push(Effect::CancelPrompt {
                        session,
                        execution,
                        turn: turn.id,
                    });
                    if mutant_on!(self.mutant, CancelAfterAcceptTearsDown)
                        && runtime == Some(execution)
                    {
                        self.claim_stop(now, execution);
                    }
                }
            }
            TurnPhase::Performed { execution, .. } => {
                self.push(Effect::CancelPrompt {
                    session,
                    execution,
                    turn: turn.id,
                });
                self.end_turn(session, TurnOutcome::Cancelled);
            }
            TurnPhase::Dispatched { .. }
            | TurnPhase::WaitingRuntime
            | TurnPhase::Recovering { .. } => {
                self.end_turn(session, TurnOutcome::Cancelled);
            }
        }
        // Cancelled means ended, or (once the provider has it) marked so that its runtime's
        // loss ends it instead of recovering it.
        debug_assert!(self.sessions[&session]
            .turn
            .is_none_or(|t| t.user_cancelled));
    }

    /// A performed prompt the provider did not accept by its deadline: the provider is told
    /// to drop it, and the runtime counts as lost for this turn. The prompt was written, so
    /// the agent may have read it (ACP has no acknowledgement): the loss is recovered on the
    /// schedule (rule 8), its re-prompt restating the conversation, never rolled back for
    /// the caller to send the same text again bare (issue 28, item 4).
    pub(crate) fn accept_deadline_passed(
        &mut self,
        now: Timestamp,
        session: SessionId,
        turn: TurnId,
    ) {
        let performed = self
            .sessions
            .get(&session)
            .and_then(|s| s.turn)
            .filter(|t| t.id == turn)
            .and_then(|t| match t.phase {
                TurnPhase::Performed { execution, .. } => Some(execution),
                _ => None,
            });
        let Some(execution) = performed else { return };
        if let Some(t) = self.sess(session).turn.as_mut() {
            // Written, so possibly read: whatever ends this runtime's hold on the turn,
            // the turn is recovered, not rolled back.
            t.accepted_once = true;
            t.next_loss_rolls_back = false;
        }
        self.push(Effect::CancelPrompt {
            session,
            execution,
            turn,
        });
        let live = self.sessions.get(&session).and_then(|s| s.live);
        if live.is_some_and(|l| l.execution == Some(execution)) {
            let stamp = self.mint_stamp();
            self.fail_attempt(now, session, stamp);
        } else {
            if let Some(t) = self.sess(session).turn.as_mut() {
                t.phase = TurnPhase::WaitingRuntime;
            }
            self.turn_lost_runtime(now, session);
        }
    }

    // ----- rule 8: a silent runtime counts as lost -----------------------------------------

    /// The accepted turn's runtime was heard from (the provider accepted the prompt, or a
    /// stream event of the turn was admitted): its idle deadline starts again from `now`
    /// ([`crate::Config::turn_idle_ms`]; nothing when the rule is off).
    pub(crate) fn turn_heard(&mut self, now: Timestamp, session: SessionId) {
        let idle_ms = self.config.turn_idle_ms;
        // The bug (mutant): no idle deadline is ever armed, so a silent turn hangs.
        if idle_ms == 0 || mutant_on!(self.mutant, IdleDeadlineIgnored) {
            return;
        }
        let deaf = self.deaf;
        let Some(t) = self
            .sessions
            .get_mut(&session)
            .and_then(|s| s.turn.as_mut())
            .filter(|t| matches!(t.phase, TurnPhase::Accepted { .. }))
        else {
            return;
        };
        let turn = t.id;
        let old = t.idle_at.take();
        if !deaf {
            t.idle_at = Some(now.plus_millis(idle_ms));
        }
        // The old deadline goes first: the new one may be the same.
        if let Some(old) = old {
            self.timers.remove(&(old, Timer::Idle(session, turn)));
        }
        if !deaf {
            self.timers
                .insert((now.plus_millis(idle_ms), Timer::Idle(session, turn)));
        }
        if deaf && !self.parked.contains(&(session, turn)) {
            self.parked.push((session, turn));
        }
    }

    /// The turn leaves its runtime: it has no idle deadline any more.
    fn disarm_idle(&mut self, session: SessionId) {
        let Some(t) = self
            .sessions
            .get_mut(&session)
            .and_then(|s| s.turn.as_mut())
        else {
            return;
        };
        let turn = t.id;
        if let Some(at) = t.idle_at.take() {
            self.timers.remove(&(at, Timer::Idle(session, turn)));
        }
    }

    /// The embedder stops (`false`) or starts again (`true`) reading its runtimes' output
    /// (backpressure: the caller does not take output, so the agents block on their
    /// writes). While it does not listen, silence proves nothing: no idle deadline runs,
    /// and every accepted turn gets a whole [`crate::Config::turn_idle_ms`] from the moment
    /// it listens again.
    pub fn set_listening(&mut self, now: Timestamp, listening: bool) {
        let now = self.observe(now);
        if listening != self.deaf {
            return;
        }
        if !listening {
            // Park every armed idle deadline, in timer order.
            let armed: Vec<(Timestamp, SessionId, TurnId)> = self
                .timers
                .iter()
                .filter_map(|&(at, timer)| match timer {
                    Timer::Idle(s, t) => Some((at, s, t)),
                    _ => None,
                })
                .collect();
            for (at, s, t) in armed {
                self.timers.remove(&(at, Timer::Idle(s, t)));
                if let Some(turn) = self.sessions.get_mut(&s).and_then(|x| x.turn.as_mut()) {
                    turn.idle_at = None;
                }
                self.parked.push((s, t));
            }
            self.deaf = true;
        } else {
            self.deaf = false;
            for (s, t) in std::mem::take(&mut self.parked) {
                let current = self
                    .sessions
                    .get(&s)
                    .and_then(|x| x.turn)
                    .is_some_and(|x| x.id == t);
                if current {
                    self.turn_heard(now, s);
                }
            }
        }
    }

    /// An accepted turn's runtime stayed silent past its idle deadline: the turn counts as
    /// having lost its runtime. The provider is told to drop the prompt, the runtime is
    /// stopped (rule 5: by the core, with a deadline, then killed), and the turn goes to
    /// recovery on the schedule (rule 8), or ends if recovery is off, exhausted or the
    /// user cancelled.
    pub(crate) fn idle_deadline_passed(
        &mut self,
        now: Timestamp,
        session: SessionId,
        turn: TurnId,
    ) {
        let silent = self
            .sessions
            .get_mut(&session)
            .and_then(|s| s.turn.as_mut())
            .filter(|t| t.id == turn && t.idle_at.is_some_and(|at| at <= now))
            .and_then(|t| match t.phase {
                TurnPhase::Accepted { execution } => {
                    t.idle_at = None;
                    Some(execution)
                }
                _ => None,
            });
        let Some(execution) = silent else { return };
        self.push(Effect::TurnSilent {
            session,
            execution,
            turn,
            idle_ms: self.config.turn_idle_ms,
        });
        self.push(Effect::CancelPrompt {
            session,
            execution,
            turn,
        });
        self.claim_stop(now, execution);
        self.turn_lost_runtime(now, session);
    }

    // ----- rule 8: automatic recovery ----------------------------------------------------

    /// Every exit before the prompt was written to the provider rolls the claim back (it
    /// never reached the agent). After acceptance, or once the prompt was written (the
    /// agent may have read it and died before it showed any sign: ACP has no
    /// acknowledgement), the runtime's loss goes to recovery (rule 8), so a prompt reaches
    /// agents at most once plus once per step of the schedule.
    pub(crate) fn turn_lost_runtime(&mut self, now: Timestamp, session: SessionId) {
        self.disarm_idle(session);
        let mutant = self.mutant;
        let delays = std::mem::take(&mut self.config.recovery_delays_ms);
        let decision = {
            let s = self.sessions.get_mut(&session).expect("caller checked");
            if let Some(t) = s.turn.as_mut() {
                let performed = matches!(t.phase, TurnPhase::Performed { .. });
                if performed && !t.accepted_once && !std::mem::take(&mut t.next_loss_rolls_back) {
                    t.accepted_once = true;
                }
            }
            match s.turn.as_mut() {
                None => None,
                Some(t) if !t.accepted_once => {
                    if mutant_on!(mutant, ClaimNotRolledBack) {
                        // The bug: the claim stays, waiting for a runtime no one will start.
                        t.phase = TurnPhase::WaitingRuntime;
                        None
                    } else {
                        Some(RecoveryDecision::EndFailed)
                    }
                }
                Some(t) => Some(decide_recovery(t, &delays, now)),
            }
        };
        self.config.recovery_delays_ms = delays;
        let accepted = self
            .sessions
            .get(&session)
            .and_then(|s| s.turn)
            .is_some_and(|t| t.accepted_once);
        match decision {
            None => {}
            Some(RecoveryDecision::EndFailed) if !accepted => {
                self.end_turn(session, TurnOutcome::RolledBack)
            }
            Some(RecoveryDecision::EndFailed) => self.end_turn(session, TurnOutcome::Failed),
            Some(RecoveryDecision::EndCancelled) => self.end_turn(session, TurnOutcome::Cancelled),
            Some(RecoveryDecision::Recover { step, at }) => {
                let turn = self
                    .sess(session)
                    .turn
                    .map(|t| t.id)
                    .expect("decided on a turn");
                self.timers.insert((at, Timer::Recovery(session, turn)));
                self.push(Effect::RecoveryStarted {
                    session,
                    turn,
                    step,
                    at,
                });
            }
            Some(RecoveryDecision::Resume { at }) => {
                let turn = self
                    .sess(session)
                    .turn
                    .map(|t| t.id)
                    .expect("decided on a turn");
                self.timers.insert((at, Timer::Recovery(session, turn)));
            }
            Some(RecoveryDecision::Exhausted) => {
                let turn = self
                    .sess(session)
                    .turn
                    .map(|t| t.id)
                    .expect("decided on a turn");
                self.push(Effect::RecoveryExhausted { session, turn });
                self.end_turn(session, TurnOutcome::Failed);
            }
        }
    }

    /// A recovery step is due: the turn is dispatched to the ready runtime, or a replacement
    /// attempt starts (the turn fails if none can be minted).
    pub(crate) fn recovery_due(&mut self, now: Timestamp, session: SessionId, turn: TurnId) {
        let due = self
            .sessions
            .get(&session)
            .and_then(|s| s.turn)
            .is_some_and(|t| t.id == turn && matches!(t.phase, TurnPhase::Recovering { .. }));
        if !due {
            return;
        }
        if let Some(t) = self.sess(session).turn.as_mut() {
            t.phase = TurnPhase::WaitingRuntime;
        }
        let s = self.sessions.get(&session).expect("checked");
        let ready = match (s.live, s.owner, s.runtime) {
            (None, Some(owner), Some(e)) => {
                self.executions.get(&e).map(|x| (owner, e, x.generation))
            }
            _ => None,
        };
        if let Some((owner, e, g)) = ready {
            self.dispatch(now, session, owner, e, g);
        } else if s.live.is_none() && self.begin_attempt(now, session).is_none() {
            self.end_turn(session, TurnOutcome::Failed);
        }
    }
}

/// What to do when the runtime under an accepted turn is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecoveryDecision {
    /// The user cancelled: the turn ends cancelled, no recovery.
    EndCancelled,
    /// Recovery is disabled (empty schedule): the turn fails with zero recovery events.
    EndFailed,
    /// Start recovery step `step` (1-based) at `at`.
    Recover { step: u32, at: Timestamp },
    /// The runtime died with the previous orchestrator incarnation: resume the turn now,
    /// without a recovery step (no `recovery_started`; the re-prompt carries the replay
    /// block as a recovery's does).
    Resume { at: Timestamp },
    /// The schedule is used up: record exhaustion once and fail the turn.
    Exhausted,
}

/// Rule 8's decision for a turn whose runtime died (or whose replacement failed).
pub(crate) fn decide_recovery(
    turn: &mut Turn,
    delays_ms: &[u64],
    now: Timestamp,
) -> RecoveryDecision {
    // Before acceptance a lost runtime rolls the claim back instead (rule 7).
    assert!(
        turn.accepted_once,
        "rule 8: {} recovers before acceptance",
        turn.id
    );
    let decision = decide(turn, delays_ms, now);
    // Rule 8: at most one `recovery_started` per step of the schedule, and exhaustion only
    // after at least one.
    assert!(usize::from(turn.recoveries_started) <= delays_ms.len());
    assert!(decision != RecoveryDecision::Exhausted || turn.recoveries_started >= 1);
    decision
}

/// [`decide_recovery`]'s decision, before its checks.
fn decide(turn: &mut Turn, delays_ms: &[u64], now: Timestamp) -> RecoveryDecision {
    if turn.user_cancelled {
        return RecoveryDecision::EndCancelled;
    }
    if delays_ms.is_empty() {
        return RecoveryDecision::EndFailed;
    }
    if std::mem::take(&mut turn.restart_grace) {
        turn.phase = TurnPhase::Recovering { at: now };
        return RecoveryDecision::Resume { at: now };
    }
    let started = usize::from(turn.recoveries_started);
    if let Some(&delay) = delays_ms.get(started) {
        turn.recoveries_started += 1;
        let at = now.plus_millis(delay);
        turn.phase = TurnPhase::Recovering { at };
        return RecoveryDecision::Recover {
            step: u32::from(turn.recoveries_started),
            at,
        };
    }
    // started ≥ 1 here because the schedule is non-empty: exhaustion only after an attempt.
    if turn.exhausted {
        return RecoveryDecision::EndFailed;
    }
    turn.exhausted = true;
    RecoveryDecision::Exhausted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted_turn() -> Turn {
        let mut t = Turn::new(TurnId::new(1).unwrap());
        t.accepted_once = true;
        t
    }

    #[test]
    fn empty_schedule_disables_recovery_entirely() {
        let mut t = accepted_turn();
        assert_eq!(
            decide_recovery(&mut t, &[], Timestamp::ZERO),
            RecoveryDecision::EndFailed
        );
        assert_eq!(t.recoveries_started, 0);
        assert!(!t.exhausted);
    }

    #[test]
    fn recovery_follows_the_schedule_then_exhausts_once() {
        let mut t = accepted_turn();
        let delays = [1_000, 2_000, 4_000];
        let now = Timestamp::from_millis(10);
        for (i, d) in delays.iter().enumerate() {
            assert_eq!(
                decide_recovery(&mut t, &delays, now),
                RecoveryDecision::Recover {
                    step: i as u32 + 1,
                    at: now.plus_millis(*d)
                }
            );
        }
        assert_eq!(
            decide_recovery(&mut t, &delays, now),
            RecoveryDecision::Exhausted
        );
        assert_eq!(usize::from(t.recoveries_started), delays.len());
    }

    #[test]
    fn a_restart_resumes_the_turn_without_a_recovery_step() {
        let mut t = accepted_turn();
        let delays = [1000, 2000];
        t.restart_grace = true;
        let now = Timestamp::ZERO.plus_millis(5);
        assert_eq!(
            decide_recovery(&mut t, &delays, now),
            RecoveryDecision::Resume { at: now }
        );
        assert_eq!(t.recoveries_started, 0);
        assert!(!t.restart_grace, "the grace covers one loss only");
        // The next loss is the provider's: it takes the first step of the schedule.
        assert_eq!(
            decide_recovery(&mut t, &delays, now),
            RecoveryDecision::Recover {
                step: 1,
                at: now.plus_millis(1000)
            }
        );
    }

    #[test]
    fn a_restart_does_not_resume_a_turn_when_recovery_is_disabled_or_cancelled() {
        let mut t = accepted_turn();
        t.restart_grace = true;
        assert_eq!(
            decide_recovery(&mut t, &[], Timestamp::ZERO),
            RecoveryDecision::EndFailed
        );
        let mut t = accepted_turn();
        t.restart_grace = true;
        t.user_cancelled = true;
        assert_eq!(
            decide_recovery(&mut t, &[1], Timestamp::ZERO),
            RecoveryDecision::EndCancelled
        );
    }

    #[test]
    fn no_recovery_after_the_user_cancelled() {
        let mut t = accepted_turn();
        t.user_cancelled = true;
        assert_eq!(
            decide_recovery(&mut t, &[1], Timestamp::ZERO),
            RecoveryDecision::EndCancelled
        );
        assert_eq!(t.recoveries_started, 0);
    }

    #[test]
    fn re_prompt_wraps_the_original_request_exactly_once_per_generation() {
        let mut t = accepted_turn();
        t.delivered = 7;
        let r1 = t.next_request(ActiveMutant::NONE);
        let r2 = t.next_request(ActiveMutant::NONE);
        assert_eq!(
            (r1.replay_blocks, r1.replay_generation, r1.delivered_through),
            (1, 1, 7)
        );
        assert_eq!((r2.replay_blocks, r2.replay_generation), (1, 2));
        let first = Turn::new(TurnId::new(2).unwrap()).next_request(ActiveMutant::NONE);
        assert_eq!(first.replay_blocks, 0);
    }

    #[cfg(feature = "mutants")]
    #[test]
    fn mutant_double_replay_block_wraps_the_wrapped_request() {
        use crate::mutants::Mutant;
        let m = ActiveMutant::on(Mutant::DoubleReplayBlock);
        let mut t = accepted_turn();
        assert_eq!(t.next_request(m).replay_blocks, 1);
        assert_eq!(t.next_request(m).replay_blocks, 2);
    }
}
