//! An independent reference model of the rules, built only from what crosses the core's
//! boundary: inputs, verdicts and effects. It re-derives which attempt is live, which
//! finished attempt owns a runtime, which generation is current, which turn is active,
//! and flags any verdict or effect the rules forbid.
//!
//! The proptest model test, the fuzzer and the sim's oracle all run it after every step,
//! so a bug in the core's own bookkeeping (which `check_invariants` reads) cannot hide a
//! rule violation. It keeps a record of every attempt it saw: meant for tests, sims and
//! debugging, not for a long-running production process.

use std::collections::{BTreeMap, BTreeSet};

use crate::classify::{classify, LoadVerdict};
use crate::config::Config;
use crate::ids::{AttemptId, ExecutionId, Generation, LeaseId, SessionId, TurnId};
use crate::io::{
    AttemptOutcome, Effect, Input, NewConversationReason, RuntimeEvent, TurnOutcome, Verdict,
};
use crate::time::Timestamp;

/// A rule the core broke, as seen from outside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditViolation {
    /// Stable rule id, e.g. `R2-fail-closed`.
    pub rule: &'static str,
    /// What happened.
    pub detail: String,
}

impl std::fmt::Display for AuditViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.rule, self.detail)
    }
}

impl std::error::Error for AuditViolation {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AttemptFate {
    Live,
    Ready,
    Cancelled,
    Failed,
}

#[derive(Clone, Copy, Debug)]
struct AttemptRec {
    session: SessionId,
    fate: AttemptFate,
    binding: Option<(ExecutionId, Generation)>,
}

#[derive(Clone, Debug, Default)]
struct TurnRec {
    ended: bool,
    dispatches: u32,
    recoveries: u32,
    exhausted: u32,
    delivered: u64,
    cancel_requested: bool,
    /// The provider accepted it (a callback the core took): every later dispatch is a
    /// re-prompt, after a recovery or after a restart that resumed it without one.
    accepted: bool,
    /// The runtime it was last heard from (acceptance or a stream event the core took),
    /// and when: the idle rule may give that runtime up only a whole idle period later.
    heard: Option<(ExecutionId, Timestamp)>,
    /// The replay generation of its last re-prompt: each re-prompt restates a later one.
    last_generation: u32,
}

#[derive(Clone, Debug, Default)]
struct SessionRec {
    /// Attempts started for this session, in order.
    attempts: Vec<AttemptId>,
    active_turn: Option<TurnId>,
    /// The last load failure seen, to judge a following fallback.
    last_load_failure: Option<LoadVerdict>,
    /// A conversation was created for the session (its identity must never be dropped).
    has_conversation: bool,
}

/// The reference model. Feed it every step; it answers `Err` on the first violation.
#[derive(Clone, Debug)]
pub struct Auditor {
    join_wait_ms: u64,
    stop_deadline_ms: u64,
    /// The idle rule's deadline (0: off).
    turn_idle_ms: u64,
    schedule_len: u32,
    /// The profile the core was configured with: a fallback is judged under it.
    profile: crate::classify::AgentProfile,
    attempts: BTreeMap<AttemptId, AttemptRec>,
    sessions: BTreeMap<SessionId, SessionRec>,
    turns: BTreeMap<(SessionId, TurnId), TurnRec>,
    /// Latest (attempt, generation) bound to each execution.
    bindings: BTreeMap<ExecutionId, (AttemptId, Generation)>,
    stopping: BTreeSet<ExecutionId>,
    leases: BTreeMap<LeaseId, (SessionId, ExecutionId, Generation, AttemptId)>,
    /// The core never lets time go backwards; neither does the model.
    last_now: Timestamp,
    /// Joiners waiting for an answer: attempt → (session, the earliest deadline promised).
    joins: BTreeMap<AttemptId, (SessionId, Timestamp)>,
}

macro_rules! fail {
    ($rule:expr, $($fmt:tt)+) => {
        return Err(AuditViolation { rule: $rule, detail: format!($($fmt)+) })
    };
}

impl Auditor {
    /// A model for a core with `config`.
    pub fn new(config: &Config) -> Self {
        Auditor {
            join_wait_ms: config.join_wait_ms,
            stop_deadline_ms: config.stop_deadline_ms,
            turn_idle_ms: config.turn_idle_ms,
            schedule_len: config.recovery_delays_ms.len() as u32,
            profile: config.agent_profile,
            attempts: BTreeMap::new(),
            sessions: BTreeMap::new(),
            turns: BTreeMap::new(),
            bindings: BTreeMap::new(),
            stopping: BTreeSet::new(),
            leases: BTreeMap::new(),
            last_now: Timestamp::ZERO,
            joins: BTreeMap::new(),
        }
    }

    /// Whether the idle rule may give up `execution` at `now`: it runs the session's active
    /// turn, which was last heard from on it at least a whole idle period ago.
    fn went_silent(&self, session: SessionId, execution: ExecutionId, now: Timestamp) -> bool {
        let Some(turn) = self.sessions.get(&session).and_then(|s| s.active_turn) else {
            return false;
        };
        self.turn_idle_ms > 0
            && self.turns.get(&(session, turn)).is_some_and(|t| {
                t.heard.is_some_and(|(e, at)| {
                    e == execution && at.plus_millis(self.turn_idle_ms) <= now
                })
            })
    }

    /// Whether `attempt` may speak for `session` now: it is live, or it is the newest
    /// attempt and finished ready.
    fn may_speak(&self, session: SessionId, attempt: AttemptId) -> bool {
        self.may_speak_as(session, attempt, self.attempts.get(&attempt))
    }

    /// [`Auditor::may_speak`] with the attempt's record already looked up (`rec` is
    /// `self.attempts.get(&attempt)`), for a caller that reads the record again.
    fn may_speak_as(
        &self,
        session: SessionId,
        attempt: AttemptId,
        rec: Option<&AttemptRec>,
    ) -> bool {
        let Some(rec) = rec else {
            return false;
        };
        if rec.session != session {
            return false;
        }
        let newest = self.sessions.get(&session).and_then(|s| s.attempts.last()) == Some(&attempt);
        match rec.fate {
            AttemptFate::Live => true,
            AttemptFate::Ready => newest,
            AttemptFate::Cancelled | AttemptFate::Failed => false,
        }
    }

    /// One input, its verdict, and the effects drained after it.
    pub fn observe(
        &mut self,
        now: Timestamp,
        input: &Input,
        verdict: &Verdict,
        effects: &[Effect],
    ) -> Result<(), AuditViolation> {
        self.last_now = self.last_now.max(now);
        let now = self.last_now;
        match (input, verdict) {
            (Input::Resume { session }, Verdict::Joined { attempt, until }) => {
                if !self
                    .attempts
                    .get(attempt)
                    .is_some_and(|a| a.fate == AttemptFate::Live && a.session == *session)
                {
                    fail!(
                        "R1-join-live",
                        "session {session} joined {attempt}, which is not its live attempt"
                    );
                }
                if *until < now {
                    fail!(
                        "R1-join-bounded",
                        "session {session}: joiner promised an answer by {until}, which is \
                         already past (now {now})"
                    );
                }
                if *until > now.plus_millis(self.join_wait_ms) {
                    fail!(
                        "R1-join-bounded",
                        "session {session}: joiner waits until {until}, past now + {} ms",
                        self.join_wait_ms
                    );
                }
                let pending = self.joins.entry(*attempt).or_insert((*session, *until));
                pending.1 = pending.1.min(*until);
            }
            (Input::Prompt { session, turn }, Verdict::Claimed) => {
                let s = self.sessions.entry(*session).or_default();
                if let Some(t) = s.active_turn {
                    fail!(
                        "R7-one-turn",
                        "session {session}: turn {turn} claimed while {t} is active"
                    );
                }
                s.active_turn = Some(*turn);
                self.turns.insert((*session, *turn), TurnRec::default());
            }
            (Input::Cancel { session }, Verdict::Accepted) => {
                if let Some(t) = self.sessions.get(session).and_then(|s| s.active_turn) {
                    if let Some(rec) = self.turns.get_mut(&(*session, t)) {
                        rec.cancel_requested = true;
                    }
                }
            }
            (
                Input::Bound {
                    session,
                    attempt,
                    execution,
                },
                Verdict::Bound { generation },
            ) => {
                match self.attempts.get_mut(attempt) {
                    Some(a) if a.fate == AttemptFate::Live && a.session == *session && a.binding.is_none() => {
                        a.binding = Some((*execution, *generation));
                    }
                    _ => fail!("R1-bind-live", "bound {execution} to {attempt}, which is not a live unbound attempt of {session}"),
                }
                if self.stopping.contains(execution) {
                    fail!(
                        "R5-no-reuse-while-stopping",
                        "{execution} bound while its teardown is pending"
                    );
                }
                if let Some((_, g)) = self.bindings.get(execution) {
                    if generation <= g {
                        fail!(
                            "R4-generations",
                            "{execution}: generation {generation} not after {g}"
                        );
                    }
                }
                self.bindings.insert(*execution, (*attempt, *generation));
            }
            (Input::Callback(cb), Verdict::Accepted) => {
                if let RuntimeEvent::PromptAccepted { turn } | RuntimeEvent::Stream { turn, .. } =
                    cb.event
                {
                    if let Some(t) = self.turns.get_mut(&(cb.session, turn)) {
                        t.accepted = true;
                        t.heard = Some((cb.execution, now));
                    }
                }
                let Some(attempt) = cb.attempt else {
                    if self
                        .sessions
                        .get(&cb.session)
                        .is_some_and(|s| !s.attempts.is_empty())
                    {
                        fail!("R2-legacy", "session {}: callback without attempt accepted after the session had attempts", cb.session);
                    }
                    return self.effects(now, effects);
                };
                let rec = self.attempts.get(&attempt);
                if !self.may_speak_as(cb.session, attempt, rec) {
                    fail!(
                        "R2-fail-closed",
                        "session {}: {} from attempt {attempt} accepted, but it is {:?}",
                        cb.session,
                        cb.event.name(),
                        rec.map(|a| a.fate)
                    );
                }
                let binding = rec.and_then(|a| a.binding);
                if binding != Some((cb.execution, cb.generation)) {
                    fail!(
                        "R4-generation",
                        "session {}: {} accepted on {}/{} but {attempt} is bound to {binding:?}",
                        cb.session,
                        cb.event.name(),
                        cb.execution,
                        cb.generation
                    );
                }
                let current = self.bindings.get(&cb.execution);
                if current != Some(&(attempt, cb.generation)) {
                    fail!(
                        "R4-generation",
                        "{}: callback of generation {} accepted, current is {:?}",
                        cb.execution,
                        cb.generation,
                        current
                    );
                }
                if let RuntimeEvent::LoadFailed(outcome) = &cb.event {
                    let verdict = classify(outcome, self.profile).verdict;
                    self.sessions
                        .entry(cb.session)
                        .or_default()
                        .last_load_failure = Some(verdict);
                }
                if let RuntimeEvent::ConversationCreated { .. } = cb.event {
                    self.sessions
                        .entry(cb.session)
                        .or_default()
                        .has_conversation = true;
                }
                if let RuntimeEvent::Exited { .. } = cb.event {
                    // The process is gone: nothing runs under that ID until it is bound again.
                    self.stopping.remove(&cb.execution);
                    self.bindings.remove(&cb.execution);
                }
            }
            (Input::Perform { lease }, Verdict::Accepted) => {
                let Some((session, execution, generation, attempt)) = self.leases.remove(lease)
                else {
                    fail!(
                        "R4-lease",
                        "lease {lease} performed but never issued or already used"
                    );
                };
                if self.bindings.get(&execution) != Some(&(attempt, generation)) {
                    fail!("R4-lease", "lease {lease} on {execution}/{generation} performed after a replacement: now {:?}", self.bindings.get(&execution));
                }
                if !self.may_speak(session, attempt) {
                    fail!(
                        "R4-lease",
                        "lease {lease} of attempt {attempt} performed, but it is {:?}",
                        self.attempts.get(&attempt).map(|a| a.fate)
                    );
                }
            }
            (Input::Perform { lease }, Verdict::Reject(_)) => {
                self.leases.remove(lease);
            }
            (Input::Stopped { execution }, _) => {
                // Accepted, or refused because the core already forgot it: gone either way.
                self.stopping.remove(execution);
            }
            (Input::Callback(cb), Verdict::Reject(_))
                if matches!(cb.event, RuntimeEvent::Exited { .. }) =>
            {
                self.stopping.remove(&cb.execution);
            }
            _ => {}
        }
        self.effects(now, effects)
    }

    /// The embedder handed the core a time without anything else happening (a timeout that
    /// fired nothing): the model keeps the same monotonic clock as the core, and every
    /// joiner promised an answer by then has one.
    pub fn observe_time(&mut self, now: Timestamp) -> Result<(), AuditViolation> {
        self.last_now = self.last_now.max(now);
        self.joiners_answered()
    }

    /// Effects drained after a timeout: every timer due by `now` fired, so every joiner
    /// promised an answer by then has one.
    pub fn observe_timeout(
        &mut self,
        now: Timestamp,
        effects: &[Effect],
    ) -> Result<(), AuditViolation> {
        self.effects(now, effects)?;
        self.joiners_answered()
    }

    /// Rule 1: a joiner's wait ends at the deadline it was promised: every deadline at or
    /// before the model's time is answered.
    fn joiners_answered(&self) -> Result<(), AuditViolation> {
        let now = self.last_now;
        if let Some((attempt, (session, until))) = self.joins.iter().find(|(_, (_, u))| *u <= now) {
            fail!(
                "R1-join-bounded",
                "session {session}: a joiner of {attempt} was promised an answer by {until} and \
                 had none at {now}"
            );
        }
        Ok(())
    }

    /// Rule 1, the other half: the wake-up the core asks its embedder for (its
    /// `poll_timeout`, an output like any effect) comes no later than the earliest
    /// unanswered joiner's deadline; otherwise an embedder that fires timers when asked
    /// answers that joiner late (or never). Checked after every step.
    pub fn observe_next_timer(&self, next: Option<Timestamp>) -> Result<(), AuditViolation> {
        let Some((attempt, (session, until))) = self.joins.iter().min_by_key(|(_, (_, u))| *u)
        else {
            return Ok(());
        };
        if next.is_none_or(|t| t > *until) {
            let asked = match next {
                Some(t) => format!("a wake-up at {t}"),
                None => "no wake-up at all".to_string(),
            };
            fail!(
                "R1-join-bounded",
                "session {session}: a joiner of {attempt} was promised an answer by {until}, \
                 but the core asks for {asked}"
            );
        }
        Ok(())
    }

    /// The core restarted from a snapshot: outstanding leases died with it.
    pub fn observe_restart(
        &mut self,
        now: Timestamp,
        effects: &[Effect],
    ) -> Result<(), AuditViolation> {
        self.leases.clear();
        self.effects(now, effects)
    }

    fn effects(&mut self, now: Timestamp, effects: &[Effect]) -> Result<(), AuditViolation> {
        self.last_now = self.last_now.max(now);
        let now = self.last_now;
        for e in effects {
            self.effect(now, e)?;
        }
        Self::check_failures_reported(effects)
    }

    fn effect(&mut self, now: Timestamp, e: &Effect) -> Result<(), AuditViolation> {
        match *e {
            Effect::StartRuntime {
                session, attempt, ..
            } => {
                let s = self.sessions.entry(session).or_default();
                if let Some(prev) = s.attempts.last() {
                    if *prev >= attempt {
                        fail!(
                            "R2-monotonic-ids",
                            "session {session}: attempt {attempt} not after {prev}"
                        );
                    }
                    if self
                        .attempts
                        .get(prev)
                        .is_some_and(|a| a.fate == AttemptFate::Live)
                    {
                        fail!(
                            "R1-one-live",
                            "session {session}: {attempt} started while {prev} is live"
                        );
                    }
                }
                if self.attempts.contains_key(&attempt) {
                    fail!("R2-monotonic-ids", "attempt {attempt} started twice");
                }
                s.attempts.push(attempt);
                // A fallback is judged against the load failure of its own attempt: a new
                // attempt whose agent lacks `loadSession` proves the conversation cannot
                // be loaded, whatever an earlier attempt's load answered.
                s.last_load_failure = None;
                self.attempts.insert(
                    attempt,
                    AttemptRec {
                        session,
                        fate: AttemptFate::Live,
                        binding: None,
                    },
                );
            }
            Effect::AttemptSettled {
                session,
                attempt,
                outcome,
            } => {
                self.joins.remove(&attempt);
                let Some(a) = self.attempts.get_mut(&attempt) else {
                    fail!("R3-settle-once", "unknown attempt {attempt} settled");
                };
                if a.fate != AttemptFate::Live || a.session != session {
                    fail!(
                        "R3-settle-once",
                        "attempt {attempt} settled twice ({:?} then {outcome:?})",
                        a.fate
                    );
                }
                a.fate = match outcome {
                    AttemptOutcome::Ready => AttemptFate::Ready,
                    AttemptOutcome::Cancelled => AttemptFate::Cancelled,
                    AttemptOutcome::Failed => AttemptFate::Failed,
                };
            }
            Effect::FailureReported { .. } => {}
            Effect::LoadConversation {
                lease,
                session,
                execution,
                generation,
                ..
            }
            | Effect::NewConversation {
                lease,
                session,
                execution,
                generation,
                ..
            }
            | Effect::DispatchPrompt {
                lease,
                session,
                execution,
                generation,
                ..
            } => {
                let Some((attempt, g)) = self.bindings.get(&execution).copied() else {
                    fail!("R4-lease", "lease {lease} issued on unbound {execution}");
                };
                if g != generation {
                    fail!(
                        "R4-lease",
                        "lease {lease} issued on {execution}/{generation}, current {g}"
                    );
                }
                if !self.may_speak(session, attempt) {
                    fail!(
                        "R2-fail-closed",
                        "{} issued for {execution} of attempt {attempt}, which is {:?}",
                        e.name(),
                        self.attempts.get(&attempt).map(|a| a.fate)
                    );
                }
                self.leases
                    .insert(lease, (session, execution, generation, attempt));
                if let Effect::NewConversation {
                    reason: NewConversationReason::First,
                    ..
                } = *e
                {
                    if self
                        .sessions
                        .get(&session)
                        .is_some_and(|s| s.has_conversation)
                    {
                        fail!(
                            "R6-conversation-kept",
                            "session {session}: session/new as a first conversation, but the \
                             session has one"
                        );
                    }
                }
                if let Effect::NewConversation {
                    reason: NewConversationReason::Fallback(r),
                    ..
                } = *e
                {
                    if r.verdict() != LoadVerdict::Incompatible {
                        fail!("R6-fallback-proof", "session {session}: session/new with reason {r:?}, which proves nothing");
                    }
                    let last = self
                        .sessions
                        .get(&session)
                        .and_then(|s| s.last_load_failure);
                    if last.is_some_and(|v| v != LoadVerdict::Incompatible) {
                        fail!(
                            "R6-fallback-proof",
                            "session {session}: session/new after an inconclusive load failure"
                        );
                    }
                }
                if let Effect::DispatchPrompt { turn, request, .. } = *e {
                    let Some(t) = self.turns.get_mut(&(session, turn)) else {
                        fail!(
                            "R7-claim",
                            "session {session}: dispatch of unclaimed turn {turn}"
                        );
                    };
                    if t.ended {
                        fail!(
                            "R7-claim",
                            "session {session}: dispatch of ended turn {turn}"
                        );
                    }
                    // A restart resumes an accepted turn without a recovery step; its
                    // re-prompt carries the block all the same. (A turn the restored core
                    // never saw accepted is rolled back, never dispatched again.)
                    let rewrapped = t.recoveries > 0 || t.accepted;
                    let expected_blocks = u8::from(rewrapped);
                    if request.replay_blocks != expected_blocks {
                        fail!(
                            "R8-replay-once",
                            "session {session} turn {turn}: {} replay blocks after {} recoveries",
                            request.replay_blocks,
                            t.recoveries
                        );
                    }
                    if rewrapped && request.delivered_through != t.delivered {
                        fail!("R9-partial-output", "session {session} turn {turn}: replay resumes after {} but {} were delivered", request.delivered_through, t.delivered);
                    }
                    if rewrapped {
                        if request.replay_generation <= t.last_generation {
                            fail!("R8-replay-generation", "session {session} turn {turn}: a re-prompt restates generation {} after generation {}", request.replay_generation, t.last_generation);
                        }
                        t.last_generation = request.replay_generation;
                    }
                    t.dispatches += 1;
                }
            }
            Effect::StopExecution {
                execution,
                deadline,
                ..
            } => {
                if deadline > now.plus_millis(self.stop_deadline_ms) {
                    fail!(
                        "R5-stop-deadline",
                        "{execution}: stop with deadline {deadline}, past now + {} ms",
                        self.stop_deadline_ms
                    );
                }
                if !self.stopping.insert(execution) {
                    fail!("R5-stop-once", "{execution} stopped twice");
                }
                if let Some((binder, _)) = self.bindings.get(&execution) {
                    let rec = self.attempts.get(binder);
                    let session = rec.map(|r| r.session);
                    let owns_runtime = session.is_some_and(|s| self.may_speak(s, *binder));
                    if owns_runtime && !session.is_some_and(|s| self.went_silent(s, execution, now))
                    {
                        fail!(
                            "R5-stop-owner",
                            "{execution} stopped while its binder {binder} is {:?} and current",
                            rec.map(|r| r.fate)
                        );
                    }
                }
            }
            Effect::KillExecution { execution, .. } => {
                self.stopping.remove(&execution);
            }
            Effect::Deliver {
                session, turn, seq, ..
            } => {
                let Some(t) = self.turns.get_mut(&(session, turn)) else {
                    fail!(
                        "R9-in-order",
                        "session {session}: delivery for unknown turn {turn}"
                    );
                };
                if t.ended || seq != t.delivered + 1 {
                    fail!(
                        "R9-in-order",
                        "session {session} turn {turn}: delivered seq {seq} after {}",
                        t.delivered
                    );
                }
                t.delivered = seq;
            }
            Effect::RecoveryStarted { session, turn, .. } => {
                let Some(t) = self.turns.get_mut(&(session, turn)) else {
                    fail!("R8-recovery", "recovery of unknown turn {turn}");
                };
                if t.cancel_requested {
                    fail!(
                        "R8-no-recovery-after-cancel",
                        "session {session} turn {turn}: recovery after the user cancelled"
                    );
                }
                t.recoveries += 1;
                if t.recoveries > self.schedule_len {
                    fail!(
                        "R8-started-bound",
                        "session {session} turn {turn}: {} recoveries, schedule has {}",
                        t.recoveries,
                        self.schedule_len
                    );
                }
            }
            Effect::RecoveryExhausted { session, turn } => {
                let Some(t) = self.turns.get_mut(&(session, turn)) else {
                    fail!("R8-recovery", "exhaustion of unknown turn {turn}");
                };
                t.exhausted += 1;
                if t.exhausted > 1 {
                    fail!(
                        "R8-exhausted-once",
                        "session {session} turn {turn}: recovery_exhausted twice"
                    );
                }
                if t.recoveries == 0 {
                    fail!(
                        "R8-exhausted-after-attempt",
                        "session {session} turn {turn}: exhausted before any recovery"
                    );
                }
            }
            Effect::TurnEnded {
                session,
                turn,
                outcome,
            } => {
                let Some(t) = self.turns.get_mut(&(session, turn)) else {
                    fail!(
                        "R7-one-terminal",
                        "session {session}: end of unknown turn {turn}"
                    );
                };
                if t.ended {
                    fail!(
                        "R7-one-terminal",
                        "session {session} turn {turn}: second terminal {outcome:?}"
                    );
                }
                if outcome == TurnOutcome::Completed && t.cancel_requested {
                    // A provider may finish before it sees the cancel; allowed.
                }
                t.ended = true;
                let s = self.sessions.entry(session).or_default();
                if s.active_turn == Some(turn) {
                    s.active_turn = None;
                }
            }
            Effect::CancelPrompt { .. } => {}
            Effect::TurnSilent {
                session,
                execution,
                turn,
                ..
            } => {
                let current = self.sessions.get(&session).and_then(|s| s.active_turn);
                if current != Some(turn) || !self.went_silent(session, execution, now) {
                    fail!(
                        "R8-idle",
                        "session {session} turn {turn}: given up as silent on {execution} \
                         before a whole idle period without a word"
                    );
                }
            }
            Effect::JoinTimedOut { attempt, .. } => {
                self.joins.remove(&attempt);
            }
        }
        Ok(())
    }

    /// Checks rule 10 on one step's effects: every failed attempt is reported.
    pub fn check_failures_reported(effects: &[Effect]) -> Result<(), AuditViolation> {
        for e in effects {
            if let Effect::AttemptSettled {
                session,
                attempt,
                outcome: AttemptOutcome::Failed,
            } = e
            {
                let reported = effects.iter().any(|f| matches!(f, Effect::FailureReported { failure, .. } if failure.attempt == *attempt));
                if !reported {
                    fail!(
                        "R10-failure-reported",
                        "session {session}: attempt {attempt} failed but no failure was shown"
                    );
                }
            }
        }
        Ok(())
    }

    /// Liveness, once inputs stop and timers ran: every claimed turn ended, no attempt is
    /// live, no teardown pending.
    pub fn check_quiescent(&self) -> Result<(), AuditViolation> {
        for ((s, t), rec) in &self.turns {
            if !rec.ended {
                fail!("R7-liveness", "session {s}: turn {t} never ended");
            }
        }
        for (a, rec) in &self.attempts {
            if rec.fate == AttemptFate::Live {
                fail!(
                    "R1-liveness",
                    "session {}: attempt {a} never settled",
                    rec.session
                );
            }
        }
        if let Some(e) = self.stopping.first() {
            fail!("R5-liveness", "{e}: teardown never finished nor timed out");
        }
        Ok(())
    }
}

/// Forgotten executions the checker's map of execution owners keeps before it is rebuilt
/// (beyond twice the core's executions): a rebuild costs a walk of the executions, so
/// this many entries pay for one.
const OWNERS_SLACK: usize = 64;

/// What a [`Checker`] found, and after which step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The rule broken (the reference model's, or a core invariant's prefixed `core invariant`).
    pub violation: AuditViolation,
    /// What the step was: the input and verdict (`Debug`), `timeout` or `restore`.
    pub after: String,
    /// The step's number, from 1 (the driver's steps this checker saw).
    pub step: u64,
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (step {}, after {})",
            self.violation, self.step, self.after
        )
    }
}

/// The checks every harness runs after each step of the core, as a
/// [`crate::driver::Observer`]: the reference model ([`Auditor`]) and the core's own
/// `check_invariants`. After every step (timeouts that fired nothing included) its verdict
/// on the core's invariants is exactly [`crate::core::Core::check_invariants`]'s, but it
/// walks only the records the step could have changed (see [`Checker::scope`]); the
/// full walk runs after restores and inputs whose records it cannot name, and
/// names the violation whenever the partial check finds one. It keeps the first
/// violation and stops checking after it.
#[derive(Clone, Debug)]
pub struct Checker {
    /// The reference model; `None` for a core of unknown history (restored from bytes),
    /// whose legitimate behaviour no model can know.
    model: Option<Auditor>,
    steps: u64,
    touched: Vec<SessionId>,
    /// The session of every execution the core holds (and of some it forgot), as of the
    /// last step: an input that names an execution may change that execution's session
    /// even when it names another session (a forged or stale callback), and once the step
    /// forgot the execution the core can no longer say whose it was. An execution's
    /// session is fixed when `Input::Bound` creates it, the only place one is created, so
    /// the entries are refreshed for the executions each step names. Entries of executions
    /// forgotten otherwise (a teardown timer) stay until the map is rebuilt from the core:
    /// after a restore, and when they outnumber the core's executions (so at most twice
    /// as many entries as the core has executions, plus [`OWNERS_SLACK`]).
    owners: BTreeMap<ExecutionId, SessionId>,
    /// Whether `owners` was built from this core (not before the first step seen).
    mirrored: bool,
    /// Every session's records that are not its own, as of the last step (see
    /// [`crate::invariants::Foreign`]; none unless the core has a bug): a step that may
    /// change one re-checks the session that reads it. Noted by the checks themselves,
    /// so at most a few per session.
    foreign: Vec<(SessionId, crate::invariants::Foreign)>,
    found: Option<Found>,
    enabled: bool,
}

impl Checker {
    /// A checker for a core with `config`.
    pub fn new(config: &Config) -> Checker {
        Checker {
            model: Some(Auditor::new(config)),
            steps: 0,
            touched: Vec::new(),
            owners: BTreeMap::new(),
            mirrored: false,
            foreign: Vec::new(),
            found: None,
            enabled: true,
        }
    }

    /// A checker of the core's own invariants only, without the reference model: for a
    /// core restored from bytes of unknown history.
    pub fn without_model(config: &Config) -> Checker {
        Checker {
            model: None,
            ..Checker::new(config)
        }
    }

    /// The reference model, if it runs.
    #[must_use]
    pub fn auditor(&self) -> Option<&Auditor> {
        self.model.as_ref()
    }

    /// Turns the checks off (to measure their cost) or on; the model still follows.
    #[must_use]
    pub fn enabled(mut self, on: bool) -> Checker {
        self.enabled = on;
        self
    }

    /// The first violation, if any.
    #[must_use]
    pub fn found(&self) -> Option<&Found> {
        self.found.as_ref()
    }

    /// Takes the first violation, if any.
    pub fn take_found(&mut self) -> Option<Found> {
        self.found.take()
    }

    /// Steps seen so far.
    #[must_use]
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The sessions whose records `step` could have changed, into `self.touched`; `false`
    /// when it cannot name them (then the whole core is checked).
    ///
    /// An input changes only the records (session, executions, leases, timers) of the
    /// session it is about, of the session that owned the execution it names, and of the
    /// sessions its effects name: the core keys every record by its session, creates an
    /// execution only for the session that binds it, and writes to another session only
    /// to tear down or settle something, which names that session in an effect.
    /// Everything else a session's check reads (the ID counters) only grows, which never
    /// breaks an invariant that held. A timeout is about the sessions of the timers that
    /// were due ([`crate::driver::Step::Timeout`] names them) and, the same way, the
    /// sessions its effects name. A restore replaces everything: it gets the full walk,
    /// and so does the first step this checker sees.
    /// `core/tests/incremental.rs` holds this against the full walk after every step of
    /// random operation sequences, with each mutant on.
    fn scope(
        &mut self,
        core: &crate::core::Core,
        step: crate::driver::Step<'_>,
        effects: &[Effect],
    ) -> bool {
        use crate::driver::Step;
        self.touched.clear();
        if !self.mirrored {
            return false;
        }
        let (execution, session) = match step {
            Step::Input { input, session, .. } => {
                let execution = match input {
                    Input::Bound { execution, .. } | Input::Stopped { execution } => {
                        Some(*execution)
                    }
                    Input::Callback(cb) => Some(cb.execution),
                    _ => None,
                };
                (execution, session)
            }
            Step::Timeout { due } => {
                // A timer writes only to its own session's records (a teardown timer's
                // session is its execution's, a lease timer's its lease's: the driver
                // names them as they were before the step) and, like an input, to
                // another session only through an effect that names it. A timeout with
                // nothing due changes nothing (the core's clock is no invariant's).
                self.touched.extend_from_slice(due);
                (None, None)
            }
            Step::Restored => return false,
        };
        if let Some(s) = session {
            self.touched.push(s);
        }
        if let Some(e) = execution {
            // Its session before the step; none if the core did not hold it.
            let before = self.owners.get(&e).copied();
            match core.executions.get(&e) {
                Some(x) if before != Some(x.session) => {
                    self.owners.insert(e, x.session);
                }
                None if before.is_some() => {
                    self.owners.remove(&e);
                }
                _ => {}
            }
            if let Some(s) = before {
                if !self.touched.contains(&s) {
                    self.touched.push(s);
                }
            }
        }
        if self.touched.is_empty() && matches!(step, Step::Input { .. }) {
            // An input about nothing the checker can name (an unknown lease performed).
            return false;
        }
        for e in effects {
            let s = e.session();
            if !self.touched.contains(&s) {
                self.touched.push(s);
            }
        }
        // The sessions that read a record of a session the step wrote to, or the
        // execution it named (one pass: they read, they were not written).
        let written = self.touched.len();
        for &(reader, record) in &self.foreign {
            if self.touched.contains(&reader) {
                continue;
            }
            let owner = match record {
                crate::invariants::Foreign::Execution(e) if Some(e) == execution => None,
                // Its session before the step (`owners` is, but for the named execution).
                crate::invariants::Foreign::Execution(e) => self.owners.get(&e).copied(),
                crate::invariants::Foreign::Lease(l) => core.leases.get(&l).map(|l| l.session),
            };
            if owner.is_none_or(|o| self.touched[..written].contains(&o)) {
                self.touched.push(reader);
            }
        }
        true
    }

    /// Rebuilds `owners` from the core.
    fn mirror(&mut self, core: &crate::core::Core) {
        self.owners.clear();
        self.owners
            .extend(core.executions.iter().map(|(&e, x)| (e, x.session)));
        self.mirrored = true;
    }

    fn check(
        &mut self,
        now: Timestamp,
        core: &crate::core::Core,
        step: crate::driver::Step<'_>,
        effects: &[Effect],
    ) -> Result<(), AuditViolation> {
        use crate::driver::Step;
        if let Some(model) = self.model.as_mut() {
            match step {
                Step::Input { input, verdict, .. } => {
                    model.observe(now, input, verdict, effects)?
                }
                Step::Timeout { .. } if effects.is_empty() => model.observe_time(now)?,
                Step::Timeout { .. } => model.observe_timeout(now, effects)?,
                Step::Restored => model.observe_restart(now, effects)?,
            }
            model.observe_next_timer(core.poll_timeout())?;
        }
        let partial = self.scope(core, step, effects);
        if matches!(step, Step::Restored)
            || !self.mirrored
            || self.owners.len() > 2 * core.executions.len() + OWNERS_SLACK
        {
            self.mirror(core);
        }
        if !self.enabled {
            return Ok(());
        }
        let result = if partial {
            // The partial check is part of the full one, so the full one fails too; it
            // names the violation the full walk meets first.
            let touched = &self.touched;
            self.foreign.retain(|(s, _)| !touched.contains(s));
            core.check_sessions_noting(&self.touched, &mut self.foreign)
                .map_err(|e| core.check_invariants().err().unwrap_or(e))
        } else {
            self.foreign.clear();
            core.check_all_noting(&mut self.foreign)
        };
        result.map_err(|e| AuditViolation {
            rule: e.rule,
            detail: format!("core invariant: {}", e.detail),
        })
    }
}

impl crate::driver::Observer for Checker {
    fn observe(
        &mut self,
        now: Timestamp,
        core: &crate::core::Core,
        step: crate::driver::Step<'_>,
        effects: &[Effect],
    ) {
        use crate::driver::Step;
        self.steps += 1;
        if self.found.is_some() {
            return;
        }
        if let Err(violation) = self.check(now, core, step, effects) {
            let after = match step {
                Step::Input { input, verdict, .. } => format!("{input:?} -> {verdict:?}"),
                Step::Timeout { .. } => "timeout".to_owned(),
                Step::Restored => "restore".to_owned(),
            };
            self.found = Some(Found {
                violation,
                after,
                step: self.steps,
            });
        }
    }
}
