//! The state machine: [`Core`] wires attempts, leases, cleanup, turns, recovery and
//! failure identity together behind one `handle(now, input)`.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::attempt::{remember, ConvPhase, LiveAttempt, Remembered, Retired, Ring, Tombstone};
use crate::classify::{classify_with, ClassifyReason, LoadVerdict};
use crate::cleanup::{may_stop, Execution, StopState};
use crate::config::{Config, ConfigError, MAX_PENDING_EFFECTS};
use crate::failure::{should_report, StoredFailure};
use crate::idmap::IdMap;
use crate::ids::{
    AttemptId, ConversationToken, Epoch, ErrorStamp, ExecutionId, Generation, LeaseId, SessionId,
    TurnId, MAX_ATTEMPT_SEQ,
};
use crate::io::{
    AttemptOutcome, Callback, Effect, Input, NewConversationReason, RecoveryFailure, RejectReason,
    RuntimeEvent, TurnOutcome, Verdict,
};
use crate::lease::{Lease, LeaseAction};
use crate::mutants::{mutant_on, ActiveMutant};
use crate::time::Timestamp;
use crate::timers::Timers;
use crate::turn::{decide_recovery, RecoveryDecision, Turn, TurnPhase};

/// Effects one input may queue at most (orphan stops dominate); the queue refuses input
/// when it could overflow.
const MAX_EFFECTS_PER_INPUT: usize = 32;
/// Orphaned executions remembered per session; beyond this the orphan is stopped at once,
/// which is safe because a successor cannot bind a stopping execution.
pub(crate) const MAX_ORPHANS_PER_SESSION: usize = 8;
/// Error stamps the core mints itself (deadlines, inconclusive loads) have this bit set, so
/// they never collide with the runtime's stamps.
pub(crate) const CORE_STAMP_BIT: u64 = 1 << 63;

const _: () = assert!(MAX_EFFECTS_PER_INPUT * 4 <= MAX_PENDING_EFFECTS);
const _: () = assert!(MAX_ORPHANS_PER_SESSION < MAX_EFFECTS_PER_INPUT);

/// One session's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Session {
    pub(crate) live: Option<LiveAttempt>,
    pub(crate) ring: Ring,
    /// The newest attempt ID ever evicted from the ring.
    pub(crate) watermark: Option<AttemptId>,
    /// The finished attempt that owns the ready runtime.
    pub(crate) owner: Option<AttemptId>,
    /// The ready runtime.
    pub(crate) runtime: Option<ExecutionId>,
    pub(crate) token: Option<ConversationToken>,
    pub(crate) turn: Option<Turn>,
    pub(crate) last_turn: Option<TurnId>,
    pub(crate) failure: Option<StoredFailure>,
    /// Executions of this session being torn down.
    pub(crate) stopping: u16,
    pub(crate) orphans: Vec<ExecutionId>,
}

impl Session {
    /// Whether the session ever had an attempt (then callbacks must carry attempt IDs).
    pub(crate) fn ever_attempted(&self) -> bool {
        self.live.is_some() || self.ring.len() > 0 || self.watermark.is_some()
    }

    /// Whether anything is in flight for this session.
    pub(crate) fn is_busy(&self) -> bool {
        self.live.is_some() || self.turn.is_some() || self.stopping > 0
    }
}

/// Core timers, ordered by deadline then key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum Timer {
    Join(SessionId, AttemptId),
    Start(SessionId, AttemptId),
    Stop(ExecutionId),
    Lease(LeaseId),
    Recovery(SessionId, TurnId),
    /// A performed prompt the provider has not accepted yet.
    Accept(SessionId, TurnId),
}

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
fn stream(
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
    t.runtime_next += 1;
    t.delivered += 1;
    effects.push_back(Effect::Deliver {
        session: cb.session,
        turn,
        seq: t.delivered,
        bytes,
    });
    Ok(())
}

/// The sans-IO fence for resumable agent sessions.
///
/// Call order, after quinn-proto: feed every input with [`Core::handle`] and every due
/// wake-up with [`Core::handle_timeout`]; after each, drain [`Core::poll_effect`] until it
/// returns `None`, then sleep until [`Core::poll_timeout`]. Before performing a leased
/// effect, ask with [`Input::Perform`]. Persist [`Core::snapshot`] where you need to
/// survive a restart, and come back with [`Core::restore`].
#[derive(Debug)]
pub struct Core {
    pub(crate) config: Config,
    pub(crate) epoch: Epoch,
    pub(crate) next_attempt_seq: u64,
    pub(crate) next_generation: u64,
    pub(crate) next_lease: u64,
    pub(crate) next_stamp: u64,
    pub(crate) last_now: Timestamp,
    pub(crate) sessions: IdMap<SessionId, Box<Session>>,
    pub(crate) executions: IdMap<ExecutionId, Execution>,
    pub(crate) leases: IdMap<LeaseId, Lease>,
    pub(crate) timers: Timers,
    pub(crate) effects: VecDeque<Effect>,
    pub(crate) mutant: ActiveMutant,
}

impl Core {
    /// A fresh core in `epoch`.
    pub fn new(config: Config, epoch: Epoch) -> Result<Core, ConfigError> {
        config.validate()?;
        Ok(Core {
            config,
            epoch,
            next_attempt_seq: 1,
            next_generation: 1,
            next_lease: 1,
            next_stamp: 1,
            last_now: Timestamp::ZERO,
            sessions: IdMap::default(),
            executions: IdMap::default(),
            leases: IdMap::default(),
            timers: Timers::default(),
            effects: VecDeque::new(),
            mutant: ActiveMutant::NONE,
        })
    }

    /// Re-creates a known bug (feature `mutants`; tests, sim and fuzzer only).
    #[cfg(feature = "mutants")]
    pub fn set_mutant(&mut self, mutant: Option<crate::mutants::Mutant>) {
        self.mutant = match mutant {
            Some(m) => ActiveMutant::on(m),
            None => ActiveMutant::NONE,
        };
    }

    /// The active mutant (feature `mutants`).
    #[cfg(feature = "mutants")]
    pub fn mutant(&self) -> Option<crate::mutants::Mutant> {
        self.mutant.get()
    }

    /// The re-created bug in force (always none without the feature `mutants`), for the
    /// embedder's own queues built on [`crate::delivery`].
    pub fn active_mutant(&self) -> ActiveMutant {
        self.mutant
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The core's epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Sessions tracked.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Whether the session has anything in flight (live attempt, active turn, teardown).
    pub fn session_busy(&self, session: SessionId) -> bool {
        self.sessions.get(&session).is_some_and(|s| s.is_busy())
    }

    /// The session's live attempt, if any.
    pub fn live_attempt(&self, session: SessionId) -> Option<AttemptId> {
        self.sessions
            .get(&session)
            .and_then(|s| s.live.map(|l| l.id))
    }

    /// The session's ready runtime (owned by its finished attempt), if any.
    pub fn runtime(&self, session: SessionId) -> Option<ExecutionId> {
        self.sessions.get(&session).and_then(|s| s.runtime)
    }

    /// The session's conversation token.
    pub fn conversation(&self, session: SessionId) -> Option<ConversationToken> {
        self.sessions.get(&session).and_then(|s| s.token)
    }

    /// The next effect to carry out. Drain after every input and timeout.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// Whether effects wait to be drained with [`Core::poll_effect`].
    #[must_use]
    pub fn has_effects(&self) -> bool {
        !self.effects.is_empty()
    }

    /// When [`Core::handle_timeout`] must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.timers.first().map(|(t, _)| *t)
    }

    /// Raises the core's clock to `now` (never lowers it) and returns the clock.
    pub(crate) fn observe(&mut self, now: Timestamp) -> Timestamp {
        // A clock that jumps backwards must not move deadlines or revive leases.
        if now > self.last_now {
            self.last_now = now;
        }
        self.last_now
    }

    fn push(&mut self, effect: Effect) {
        self.effects.push_back(effect);
    }

    /// Feeds one input; returns the verdict. Drain [`Core::poll_effect`] afterwards.
    #[must_use]
    pub fn handle(&mut self, now: Timestamp, input: Input) -> Verdict {
        self.handle_ref(now, &input)
    }

    /// [`Core::handle`] on a borrowed input, for the driver, which shows the input to its
    /// observer after the step (so it need not clone it).
    pub(crate) fn handle_ref(&mut self, now: Timestamp, input: &Input) -> Verdict {
        let now = self.observe(now);
        if self.effects.len() + MAX_EFFECTS_PER_INPUT > MAX_PENDING_EFFECTS {
            return Verdict::Reject(RejectReason::EffectQueueFull);
        }
        let verdict = match *input {
            Input::Resume { session } => self.resume(now, session),
            Input::Prompt { session, turn } => self.prompt(now, session, turn),
            Input::Cancel { session } => self.cancel(now, session),
            Input::Bound {
                session,
                attempt,
                execution,
            } => self.bound(now, session, attempt, execution),
            Input::Callback(ref cb) => self.callback(now, cb),
            Input::Perform { lease } => self.perform(now, lease),
            Input::Stopped { execution } => self.stopped(execution),
            Input::DismissFailure { session } => self.dismiss(session),
        };
        debug_assert!(self.effects.len() <= MAX_PENDING_EFFECTS);
        verdict
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        let now = self.observe(now);
        while let Some(&(at, timer)) = self.timers.first() {
            if at > now || self.effects.len() + MAX_EFFECTS_PER_INPUT > MAX_PENDING_EFFECTS {
                break;
            }
            self.timers.remove(&(at, timer));
            self.fire(now, timer);
        }
    }

    // ----- minting -------------------------------------------------------------------

    fn can_mint_attempt(&self) -> bool {
        self.next_attempt_seq <= MAX_ATTEMPT_SEQ
    }

    fn mint_attempt(&mut self) -> Option<AttemptId> {
        let id = AttemptId::new(self.epoch, self.next_attempt_seq)?;
        self.next_attempt_seq += 1;
        Some(id)
    }

    fn mint_generation(&mut self) -> Option<Generation> {
        let g = Generation::new(self.next_generation)?;
        self.next_generation = self.next_generation.checked_add(1)?;
        Some(g)
    }

    fn mint_lease(&mut self) -> Option<LeaseId> {
        let l = LeaseId::new(self.next_lease)?;
        self.next_lease = self.next_lease.checked_add(1)?;
        Some(l)
    }

    fn mint_stamp(&mut self) -> ErrorStamp {
        let n = self.next_stamp & !CORE_STAMP_BIT;
        self.next_stamp = (self.next_stamp + 1) & !CORE_STAMP_BIT;
        ErrorStamp::new(n | CORE_STAMP_BIT).expect("the core bit makes the stamp non-zero")
    }

    fn ensure_session(&mut self, session: SessionId) -> Result<(), RejectReason> {
        if !self.sessions.contains_key(&session) {
            if self.sessions.len() >= self.config.max_sessions {
                return Err(RejectReason::TooManySessions);
            }
            self.sessions.insert(session, Box::default());
        }
        Ok(())
    }

    fn sess(&mut self, session: SessionId) -> &mut Session {
        self.sessions
            .get_mut(&session)
            .expect("callers check the session exists first")
    }

    // ----- rule 1: begin / join ------------------------------------------------------

    fn resume(&mut self, now: Timestamp, session: SessionId) -> Verdict {
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
        if let Some(l) = self.sess(session).live.as_mut() {
            l.join_deadline = Some(until);
        }
        // The bug: the deadline is promised but nothing enforces it.
        if !mutant_on!(self.mutant, UnboundedJoinWait) {
            self.timers.insert((until, Timer::Join(session, live.id)));
        }
        Verdict::Joined {
            attempt: live.id,
            until,
        }
    }

    fn begin_attempt(&mut self, now: Timestamp, session: SessionId) -> Option<AttemptId> {
        let id = self.mint_attempt()?;
        let start_deadline = now.plus_millis(self.config.start_deadline_ms);
        self.sess(session).live = Some(LiveAttempt {
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
        Some(id)
    }

    /// Retires the live attempt (rule 3: only a live attempt can be retired, so at most one
    /// tombstone per attempt) and settles what waited on it.
    pub(crate) fn retire_live(
        &mut self,
        session: SessionId,
        outcome: Retired,
    ) -> Option<LiveAttempt> {
        let s = self.sess(session);
        let live = s.live.take()?;
        if let Some(evicted) = s.ring.push(Tombstone {
            attempt: live.id,
            execution: live.execution,
            outcome,
        }) {
            s.watermark = Some(
                s.watermark
                    .map_or(evicted.attempt, |w| w.max(evicted.attempt)),
            );
        }
        if outcome == Retired::Finished {
            s.owner = Some(live.id);
            s.runtime = live.execution;
        }
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

    // ----- rule 7: prompt claim ------------------------------------------------------

    fn prompt(&mut self, now: Timestamp, session: SessionId, turn: TurnId) -> Verdict {
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
        Verdict::Claimed
    }

    fn dispatch(
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
        t.phase = TurnPhase::Dispatched { lease, execution };
        t.runtime_next = 1;
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

    pub(crate) fn lease(
        &mut self,
        now: Timestamp,
        session: SessionId,
        execution: ExecutionId,
        generation: Generation,
        attempt: AttemptId,
        action: LeaseAction,
    ) -> Option<LeaseId> {
        let id = self.mint_lease()?;
        let deadline = now.plus_millis(self.config.lease_ms);
        self.leases.insert(
            id,
            Lease {
                session,
                execution,
                generation,
                attempt,
                deadline,
                action,
            },
        );
        self.timers.insert((deadline, Timer::Lease(id)));
        Some(id)
    }

    fn end_turn(&mut self, session: SessionId, outcome: TurnOutcome) {
        let s = self.sess(session);
        let Some(turn) = s.turn.take() else { return };
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

    /// Every exit before the provider accepted rolls the claim back; after acceptance the
    /// runtime's loss goes to recovery (rule 8).
    fn turn_lost_runtime(&mut self, now: Timestamp, session: SessionId) {
        let mutant = self.mutant;
        let delays = std::mem::take(&mut self.config.recovery_delays_ms);
        let decision = {
            let s = self.sessions.get_mut(&session).expect("caller checked");
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

    // ----- cancel ----------------------------------------------------------------------

    fn cancel(&mut self, now: Timestamp, session: SessionId) -> Verdict {
        let Some(s) = self.sessions.get(&session) else {
            return Verdict::Reject(RejectReason::UnknownSession);
        };
        let live = s.live;
        let turn = s.turn;
        let runtime = s.runtime;
        if live.is_none() && turn.is_none() {
            return Verdict::Ignored;
        }
        if let Some(live) = live {
            self.retire_live(session, Retired::Cancelled);
            if let Some(e) = live.execution {
                self.release_execution(now, session, live.id, e);
            }
        }
        if let Some(turn) = turn {
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
        }
        Verdict::Accepted
    }

    // ----- rule 5: cleanup ownership ----------------------------------------------------

    /// A cancelled or failed attempt lets go of its execution: stop it if it may, defer if a
    /// later attempt is live, do nothing if a later attempt claimed it.
    fn release_execution(
        &mut self,
        now: Timestamp,
        session: SessionId,
        attempt: AttemptId,
        execution: ExecutionId,
    ) {
        let live = self
            .sessions
            .get(&session)
            .and_then(|s| s.live.map(|l| l.id));
        let Some(exec) = self.executions.get_mut(&execution) else {
            return;
        };
        if mutant_on!(self.mutant, OldAttemptStopsSuccessor) || may_stop(exec, attempt, live) {
            self.claim_stop(now, execution);
        } else if exec.owner == attempt {
            exec.orphan = true;
            let s = self.sess(session);
            if s.orphans.len() < MAX_ORPHANS_PER_SESSION {
                if !s.orphans.contains(&execution) {
                    s.orphans.push(execution);
                }
            } else {
                self.claim_stop(now, execution);
            }
        }
    }

    /// When an attempt settles, orphans it did not claim are stopped by their owners.
    fn settle_orphans(&mut self, session: SessionId, settled: AttemptId) {
        let orphans = std::mem::take(&mut self.sess(session).orphans);
        for e in orphans {
            let stop = self
                .executions
                .get(&e)
                .is_some_and(|x| x.orphan && x.owner < settled);
            if stop {
                let now = self.last_now;
                self.claim_stop(now, e);
            }
        }
    }

    /// Claims the execution's teardown: exactly once, with a deadline.
    fn claim_stop(&mut self, now: Timestamp, execution: ExecutionId) {
        let no_deadline = mutant_on!(self.mutant, CleanupWithoutDeadline);
        let Some(exec) = self.executions.get_mut(&execution) else {
            return;
        };
        if exec.is_stopping() {
            return;
        }
        let deadline = if no_deadline {
            Timestamp::MAX
        } else {
            now.plus_millis(self.config.stop_deadline_ms)
        };
        exec.stop = StopState::Stopping { deadline };
        exec.orphan = false;
        let session = exec.session;
        if !no_deadline {
            self.timers.insert((deadline, Timer::Stop(execution)));
        }
        if let Some(s) = self.sessions.get_mut(&session) {
            s.stopping = s.stopping.saturating_add(1);
            if s.runtime == Some(execution) {
                s.runtime = None;
                s.owner = None;
            }
        }
        self.push(Effect::StopExecution {
            session,
            execution,
            deadline,
        });
    }

    /// Forgets an execution that is gone (stopped, killed, exited).
    fn forget_execution(&mut self, execution: ExecutionId) -> Option<Execution> {
        let exec = self.executions.remove(&execution)?;
        if let StopState::Stopping { deadline } = exec.stop {
            self.timers.remove(&(deadline, Timer::Stop(execution)));
        }
        if let Some(s) = self.sessions.get_mut(&exec.session) {
            if exec.is_stopping() {
                s.stopping = s.stopping.saturating_sub(1);
            }
            if s.runtime == Some(execution) {
                s.runtime = None;
                s.owner = None;
            }
            s.orphans.retain(|e| *e != execution);
        }
        Some(exec)
    }

    fn stopped(&mut self, execution: ExecutionId) -> Verdict {
        match self.executions.get(&execution) {
            None => Verdict::Reject(RejectReason::UnknownExecution),
            Some(e) if !e.is_stopping() => Verdict::Reject(RejectReason::UnexpectedEvent),
            Some(_) => {
                self.forget_execution(execution);
                Verdict::Accepted
            }
        }
    }

    // ----- binding a runtime: generations ----------------------------------------------

    fn bound(
        &mut self,
        now: Timestamp,
        session: SessionId,
        attempt: AttemptId,
        execution: ExecutionId,
    ) -> Verdict {
        let Some(s) = self.sessions.get(&session) else {
            return Verdict::Reject(RejectReason::UnknownSession);
        };
        if let Some(exec) = self.executions.get(&execution) {
            if exec.session != session {
                return Verdict::Reject(RejectReason::ForeignExecution);
            }
        }
        let live = s.live.filter(|l| l.id == attempt);
        let Some(live) = live else {
            // A late bind of a retired attempt: its runtime exists and someone must own its
            // teardown. It claims the execution only if no later attempt did.
            let reason = match remember(&s.ring, s.watermark, attempt) {
                Remembered::Tomb(t) => match t.outcome {
                    Retired::Cancelled => RejectReason::AttemptCancelled,
                    Retired::Failed => RejectReason::AttemptFailed,
                    Retired::Finished => RejectReason::AttemptSuperseded,
                },
                Remembered::Evicted => RejectReason::AttemptEvicted,
                Remembered::Unknown => return Verdict::Reject(RejectReason::UnknownAttempt),
            };
            if mutant_on!(self.mutant, OldAttemptStopsSuccessor)
                && self.executions.contains_key(&execution)
            {
                // The bug: the old attempt's cleanup stops whatever runs under that ID now.
                self.claim_stop(now, execution);
                return Verdict::Reject(reason);
            }
            let claimable = self
                .executions
                .get(&execution)
                .is_none_or(|e| e.owner < attempt && !e.is_stopping());
            if claimable && reason != RejectReason::AttemptSuperseded {
                if let Some(g) = self.mint_generation() {
                    match self.executions.get_mut(&execution) {
                        Some(e) => e.rebind(g, attempt),
                        None => {
                            self.executions
                                .insert(execution, Execution::new(session, g, attempt));
                        }
                    }
                    self.release_execution(now, session, attempt, execution);
                }
            }
            return Verdict::Reject(reason);
        };
        if let Some(bound) = live.execution {
            return Verdict::Reject(if bound == execution {
                RejectReason::AlreadyBound
            } else {
                RejectReason::WrongExecution
            });
        }
        if self
            .executions
            .get(&execution)
            .is_some_and(|e| e.is_stopping())
        {
            return Verdict::Reject(RejectReason::ExecutionStopping);
        }
        let Some(generation) = self.mint_generation() else {
            return Verdict::Reject(RejectReason::CounterExhausted);
        };
        match self.executions.get_mut(&execution) {
            Some(e) => e.rebind(generation, attempt),
            None => {
                self.executions
                    .insert(execution, Execution::new(session, generation, attempt));
            }
        }
        let s = self.sess(session);
        s.orphans.retain(|e| *e != execution);
        if s.runtime == Some(execution) {
            s.runtime = None;
            s.owner = None;
        }
        if let Some(l) = s.live.as_mut() {
            l.execution = Some(execution);
            l.generation = Some(generation);
        }
        Verdict::Bound { generation }
    }

    // ----- rule 2 + 4: callback admission ----------------------------------------------

    fn callback(&mut self, now: Timestamp, cb: &Callback) -> Verdict {
        let who = match self.admit(now, cb) {
            Ok(who) => who,
            Err(reason) => return Verdict::Reject(reason),
        };
        match who {
            Who::Live(live) => self.apply_live(now, cb, live),
            Who::Owner(owner) => self.apply_owner(now, cb, owner),
            Who::Unfenced => self.apply_unfenced(now, cb),
            Who::Streamed(None) => Verdict::Accepted,
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
        if let (Who::Owner(_), RuntimeEvent::Stream { turn, seq, bytes }) = (who, &cb.event) {
            // The hot path of a streaming turn, applied while the session is at hand rather
            // than looked up again: what `apply_owner` does for a stream event.
            let refused = stream(s, &mut self.effects, cb, *turn, *seq, *bytes).err();
            return Ok(Who::Streamed(refused));
        }
        Ok(who)
    }

    /// Rule 5: a rejected `failed` from a predecessor that still owns its execution tears
    /// that execution down, so no process or port leaks.
    fn stale_failure_teardown(&mut self, now: Timestamp, cb: &Callback, t: Tombstone) {
        if !cb.event.is_failure() {
            return;
        }
        let owns = self
            .executions
            .get(&cb.execution)
            .is_some_and(|e| e.owner == t.attempt && e.session == cb.session);
        if !owns {
            return;
        }
        if matches!(cb.event, RuntimeEvent::Exited { .. }) {
            self.forget_execution(cb.execution);
        } else {
            self.claim_stop(now, cb.execution);
        }
    }

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
                let step = match (token, load_capability) {
                    (Some(_), Some(true)) => ConvPhase::Loading,
                    (Some(_), Some(false)) => ConvPhase::Creating(NewConversationReason::Fallback(
                        ClassifyReason::CapabilityFalse,
                    )),
                    (Some(_), None) => ConvPhase::Creating(NewConversationReason::Fallback(
                        ClassifyReason::CapabilityAbsent,
                    )),
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
                self.mark_accepted(session, cb.execution);
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
    }

    /// Whether `turn` is the session's active turn, running on `execution` (and accepted,
    /// if `accepted`).
    fn turn_on(
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

    fn mark_accepted(&mut self, session: SessionId, execution: ExecutionId) {
        let mut accept_timer = None;
        if let Some(t) = self.sess(session).turn.as_mut() {
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
    }

    fn apply_owner(&mut self, now: Timestamp, cb: &Callback, _owner: AttemptId) -> Verdict {
        let session = cb.session;
        match cb.event {
            RuntimeEvent::PromptAccepted { turn } => {
                if !self.turn_on(session, turn, cb.execution, false) {
                    return Verdict::Reject(RejectReason::WrongTurn);
                }
                self.mark_accepted(session, cb.execution);
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

    /// The live attempt failed: retire it, let go of its execution, report the failure
    /// (rule 10), and roll back or recover the turn that waited on it.
    fn fail_attempt(&mut self, now: Timestamp, session: SessionId, stamp: ErrorStamp) {
        let Some(live) = self.retire_live(session, Retired::Failed) else {
            return;
        };
        if let Some(e) = live.execution {
            self.release_execution(now, session, live.id, e);
        }
        let mutant = self.mutant;
        let attempt = match self.sessions.get(&session).and_then(|s| s.failure) {
            // The bug: the new failure is raised under the stored failure's attempt.
            Some(old) if mutant_on!(mutant, FailureKeepsOldAttempt) => old.failure.attempt,
            _ => live.id,
        };
        let failure = RecoveryFailure {
            attempt,
            execution: live.execution,
            stamp,
        };
        if should_report(&mut self.sess(session).failure, failure, mutant) {
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

    // ----- rule 4: performing a leased effect ------------------------------------------

    fn perform(&mut self, now: Timestamp, id: LeaseId) -> Verdict {
        let Some(lease) = self.leases.get(&id).copied() else {
            return Verdict::Reject(RejectReason::UnknownLease);
        };
        let reason = if now > lease.deadline {
            Some(RejectReason::LeaseExpired)
        } else if mutant_on!(self.mutant, ToctouGeneration) {
            // The bug: the effect runs on whatever the execution is now.
            None
        } else {
            let current = self
                .executions
                .get(&lease.execution)
                .is_some_and(|e| e.generation == lease.generation);
            // The attempt must still speak for the session, and the effect must still be
            // awaited: a `session/new` whose conversation was created meanwhile (say by a
            // request re-issued after a restart) would replace it.
            let attempt_ok =
                self.sessions
                    .get(&lease.session)
                    .is_some_and(|s| match (s.live, lease.action) {
                        (Some(l), LeaseAction::Load) => {
                            l.id == lease.attempt && l.conversation == ConvPhase::Loading
                        }
                        (Some(l), LeaseAction::New) => {
                            l.id == lease.attempt
                                && matches!(l.conversation, ConvPhase::Creating(_))
                        }
                        (Some(l), LeaseAction::Prompt(_)) => l.id == lease.attempt,
                        (None, LeaseAction::Prompt(_)) => s.owner == Some(lease.attempt),
                        (None, _) => false,
                    });
            (!current || !attempt_ok).then_some(RejectReason::LeaseRevoked)
        };
        self.leases.remove(&id);
        self.timers.remove(&(lease.deadline, Timer::Lease(id)));
        if let Some(reason) = reason {
            self.lease_lost(now, id, lease);
            return Verdict::Reject(reason);
        }
        if let LeaseAction::Prompt(turn) = lease.action {
            if let Some(t) = self
                .sessions
                .get_mut(&lease.session)
                .and_then(|s| s.turn.as_mut())
            {
                if t.id == turn
                    && matches!(t.phase, TurnPhase::Dispatched { lease: l, .. } if l == id)
                {
                    let deadline = now.plus_millis(self.config.start_deadline_ms);
                    t.phase = TurnPhase::Performed {
                        execution: lease.execution,
                        deadline,
                    };
                    self.timers
                        .insert((deadline, Timer::Accept(lease.session, turn)));
                }
            }
        }
        Verdict::Accepted
    }

    /// A lease that will never be performed: whatever waited on it must not wait forever.
    fn lease_lost(&mut self, now: Timestamp, id: LeaseId, lease: Lease) {
        let Some(s) = self.sessions.get(&lease.session) else {
            return;
        };
        match lease.action {
            LeaseAction::Prompt(turn) => {
                let waiting = s.turn.is_some_and(|t| {
                    t.id == turn
                        && matches!(t.phase, TurnPhase::Dispatched { lease: l, .. } if l == id)
                });
                if waiting {
                    if s.live.is_some_and(|l| l.id == lease.attempt) {
                        let stamp = self.mint_stamp();
                        self.fail_attempt(now, lease.session, stamp);
                    } else {
                        self.turn_lost_runtime(now, lease.session);
                    }
                }
            }
            LeaseAction::Load | LeaseAction::New => {
                let awaited = s.live.is_some_and(|l| {
                    l.id == lease.attempt
                        && match lease.action {
                            LeaseAction::Load => l.conversation == ConvPhase::Loading,
                            _ => matches!(l.conversation, ConvPhase::Creating(_)),
                        }
                });
                if awaited {
                    let stamp = self.mint_stamp();
                    self.fail_attempt(now, lease.session, stamp);
                }
            }
        }
    }

    fn dismiss(&mut self, session: SessionId) -> Verdict {
        let Some(s) = self.sessions.get_mut(&session) else {
            return Verdict::Reject(RejectReason::UnknownSession);
        };
        match s.failure.as_mut() {
            Some(f) if !f.dismissed => {
                f.dismissed = true;
                Verdict::Accepted
            }
            _ => Verdict::Reject(RejectReason::NothingToDismiss),
        }
    }

    // ----- timers ----------------------------------------------------------------------

    fn fire(&mut self, now: Timestamp, timer: Timer) {
        match timer {
            Timer::Join(session, attempt) => {
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
            Timer::Start(session, attempt) => {
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
            Timer::Stop(execution) => {
                if let Some(exec) = self.forget_execution(execution) {
                    self.push(Effect::KillExecution {
                        session: exec.session,
                        execution,
                    });
                }
            }
            Timer::Lease(id) => {
                if let Some(lease) = self.leases.remove(&id) {
                    self.lease_lost(now, id, lease);
                }
            }
            Timer::Accept(session, turn) => {
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
                // The provider never took the prompt: tell it to drop it, and treat the
                // runtime as lost for this turn (roll the claim back, or recover).
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
            Timer::Recovery(session, turn) => {
                let due = self
                    .sessions
                    .get(&session)
                    .and_then(|s| s.turn)
                    .is_some_and(|t| {
                        t.id == turn && matches!(t.phase, TurnPhase::Recovering { .. })
                    });
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
    }
}
