//! The state machine's front: [`Core`] holds the state every rule reads and writes, answers
//! queries, and dispatches each input and each due timer to the rule that decides it.
//!
//! The decisions are in the files named after their rules: `attempt.rs` (rules 1–3: begin
//! or join, fail-closed admission, retire once), `lease.rs` (4: generations and leases),
//! `cleanup.rs` (5: cleanup ownership), `classify.rs` (6: load fallback), `turn.rs` (7
//! and 8: prompt claim and recovery), `failure.rs` (10: failure identity). Each adds the
//! methods of its rule to `Core`; this file only routes to them.

use std::collections::VecDeque;

use crate::config::{Config, ConfigError, MAX_PENDING_EFFECTS};
use crate::execution::{Execution, Lease};
use crate::failure;
use crate::idmap::IdMap;
use crate::ids::{
    AttemptId, ConversationToken, Epoch, ErrorStamp, ExecutionId, Generation, LeaseId, SessionId,
    TurnId, MAX_ATTEMPT_SEQ,
};
use crate::io::{Effect, Input, RejectReason, Verdict};
use crate::mutants::{mutant_on, ActiveMutant};
use crate::session::{Session, MAX_ORPHANS_PER_SESSION};
use crate::time::Timestamp;
use crate::timers::{Timer, Timers};

/// Effects one input may queue at most (orphan stops dominate); the queue refuses input
/// when it could overflow.
const MAX_EFFECTS_PER_INPUT: usize = 32;
/// Error stamps the core mints itself (deadlines, inconclusive loads) have this bit set, so
/// they never collide with the runtime's stamps.
pub(crate) const CORE_STAMP_BIT: u64 = 1 << 63;

const _: () = assert!(MAX_EFFECTS_PER_INPUT * 4 <= MAX_PENDING_EFFECTS);
const _: () = assert!(MAX_ORPHANS_PER_SESSION < MAX_EFFECTS_PER_INPUT);

/// The sans-IO fence for resumable agent sessions.
///
/// Embed it through [`crate::driver::Driver`], the front door: it keeps the call order
/// below for you, confirms a lease in the call that hands its effect out, and queues the
/// inputs raised meanwhile. The raw calls are for harnesses that must reach between an
/// effect and its act. Call order, after quinn-proto: feed every input with [`Core::handle`] and every due
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
    /// The embedder does not read its runtimes now ([`Core::set_listening`]): silence
    /// proves nothing, so no idle deadline runs.
    pub(crate) deaf: bool,
    /// While deaf: the accepted turns whose idle deadline waits for the embedder to
    /// listen again, in the order they were parked.
    pub(crate) parked: Vec<(SessionId, TurnId)>,
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
            deaf: false,
            parked: Vec::new(),
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

    /// The session's active turn (claimed and not ended), if any.
    pub fn active_turn(&self, session: SessionId) -> Option<TurnId> {
        self.sessions
            .get(&session)
            .and_then(|s| s.turn.map(|t| t.id))
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

    /// The core's clock: the latest `now` it was handed (a snapshot's, after a restore).
    pub(crate) fn clock(&self) -> Timestamp {
        self.last_now
    }

    /// Queues an effect for [`Core::poll_effect`].
    pub(crate) fn push(&mut self, effect: Effect) {
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
        let before = self.effects.len();
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
        // The room checked above is enough: no input queues more than its share.
        assert!(self.effects.len() - before <= MAX_EFFECTS_PER_INPUT);
        verdict
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        let now = self.observe(now);
        while let Some(&(at, timer)) = self.timers.first() {
            if at > now || self.effects.len() + MAX_EFFECTS_PER_INPUT > MAX_PENDING_EFFECTS {
                break;
            }
            let before = self.effects.len();
            let due = self.timers.remove(&(at, timer));
            self.fire(now, timer);
            assert!(due && self.effects.len() - before <= MAX_EFFECTS_PER_INPUT);
        }
    }

    /// Routes a due timer to the rule that armed it.
    fn fire(&mut self, now: Timestamp, timer: Timer) {
        match timer {
            Timer::Join(session, attempt) => self.join_deadline_passed(session, attempt),
            Timer::Start(session, attempt) => self.start_deadline_passed(now, session, attempt),
            Timer::Stop(execution) => self.stop_deadline_passed(execution),
            Timer::Lease(id) => self.lease_deadline_passed(now, id),
            Timer::Accept(session, turn) => self.accept_deadline_passed(now, session, turn),
            Timer::Recovery(session, turn) => self.recovery_due(now, session, turn),
            Timer::Idle(session, turn) => self.idle_deadline_passed(now, session, turn),
        }
    }

    /// The sessions of the timers due at `now` (raised to the core's clock, which never goes
    /// back), into `out`, cleared first, in timer order and each once: what the driver's
    /// `Step::Timeout` names before [`Core::handle_timeout`] fires them. A teardown timer
    /// names its execution's session, a lease timer its lease's; a timer whose record is
    /// gone names none.
    pub(crate) fn due_sessions(&self, now: Timestamp, out: &mut Vec<SessionId>) {
        out.clear();
        let now = now.max(self.last_now);
        for &(at, timer) in self.timers.iter() {
            if at > now {
                break;
            }
            let session = match timer {
                Timer::Join(s, _)
                | Timer::Start(s, _)
                | Timer::Recovery(s, _)
                | Timer::Accept(s, _)
                | Timer::Idle(s, _) => Some(s),
                Timer::Stop(e) => self.executions.get(&e).map(|x| x.session),
                Timer::Lease(l) => self.leases.get(&l).map(|l| l.session),
            };
            if let Some(s) = session {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
    }

    // ----- inputs that span rules ----------------------------------------------------------

    /// The user cancels: the live attempt (rule 1; its execution is let go under rule 5),
    /// then the active turn (rule 7).
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
            self.cancel_live(now, session, live);
        }
        if let Some(turn) = turn {
            self.cancel_turn(now, session, turn, runtime);
        }
        Verdict::Accepted
    }

    /// The user dismissed the session's stored failure (rule 10).
    fn dismiss(&mut self, session: SessionId) -> Verdict {
        let Some(s) = self.sessions.get_mut(&session) else {
            return Verdict::Reject(RejectReason::UnknownSession);
        };
        if failure::dismiss(&mut s.failure) {
            Verdict::Accepted
        } else {
            Verdict::Reject(RejectReason::NothingToDismiss)
        }
    }

    // ----- minting -----------------------------------------------------------------------

    /// Whether another attempt ID can be minted in this epoch.
    pub(crate) fn can_mint_attempt(&self) -> bool {
        self.next_attempt_seq <= MAX_ATTEMPT_SEQ
    }

    /// The next attempt ID, `None` once the epoch's IDs are used up.
    pub(crate) fn mint_attempt(&mut self) -> Option<AttemptId> {
        let epoch = if mutant_on!(self.mutant, RestoreReusesAttemptIds) {
            // The bug: a restored core mints in the epoch it was restored from.
            Epoch::new(self.epoch.get() - 1).unwrap_or(self.epoch)
        } else {
            self.epoch
        };
        let id = AttemptId::new(epoch, self.next_attempt_seq)?;
        self.next_attempt_seq += 1;
        Some(id)
    }

    /// The next generation, from one core-wide counter.
    pub(crate) fn mint_generation(&mut self) -> Option<Generation> {
        let g = Generation::new(self.next_generation)?;
        self.next_generation = self.next_generation.checked_add(1)?;
        Some(g)
    }

    /// The next lease ID.
    pub(crate) fn mint_lease(&mut self) -> Option<LeaseId> {
        let l = LeaseId::new(self.next_lease)?;
        self.next_lease = self.next_lease.checked_add(1)?;
        Some(l)
    }

    /// The next error stamp of the core's own (deadlines, inconclusive loads).
    pub(crate) fn mint_stamp(&mut self) -> ErrorStamp {
        let n = self.next_stamp & !CORE_STAMP_BIT;
        self.next_stamp = (self.next_stamp + 1) & !CORE_STAMP_BIT;
        ErrorStamp::new(n | CORE_STAMP_BIT).expect("the core bit makes the stamp non-zero")
    }

    /// Tracks `session` if it is not yet, within the session limit.
    pub(crate) fn ensure_session(&mut self, session: SessionId) -> Result<(), RejectReason> {
        if !self.sessions.contains_key(&session) {
            if self.sessions.len() >= self.config.max_sessions {
                return Err(RejectReason::TooManySessions);
            }
            self.sessions.insert(session, Box::default());
        }
        Ok(())
    }

    /// The session, which the caller knows exists.
    pub(crate) fn sess(&mut self, session: SessionId) -> &mut Session {
        self.sessions
            .get_mut(&session)
            .expect("callers check the session exists first")
    }
}
