//! The oracle: every rule as an invariant on the trace. It runs the core's independent
//! reference model (`palisade_core::audit::Auditor`) and the core's own invariants after
//! every step (of the sessions the step named; of the whole core every few steps and after
//! timers and restarts), judges what the provider really saw (ground truth), and checks liveness once the
//! faults stop. A violation names the rule and the trace events that broke it.

use std::collections::BTreeMap;

use palisade_core::audit::Auditor;
use palisade_core::{
    Config, Core, Effect, ExecutionId, Generation, Input, NewConversationReason, PromptRequest,
    RejectReason, RuntimeEvent, SessionId, Timestamp, TurnId, Verdict,
};

use super::provider::Provider;
use super::Violation;
use crate::scenario::{Agent, Scenario};

/// Every coverage mark the world can record (rare interleavings worth seeing).
pub const MARKS: &[&str] = &[
    "cancel-after-provider-exit",
    "queue-full-during-recovery",
    "stale-callback-after-tombstone-eviction",
    "lease-expired",
    "restart-with-attempt-in-flight",
    "duplicate-terminal-suppressed",
];

/// Oracle state for one seed.
#[derive(Debug)]
pub(crate) struct Oracle {
    audit: Auditor,
    /// `PALISADE_ORACLE=off` skips the rule checks (to measure their cost); marks and
    /// ground truth bookkeeping stay.
    enabled: bool,
    pub(crate) marks: BTreeMap<String, u64>,
    responses: BTreeMap<u64, u32>,
    recoveries: BTreeMap<(u32, TurnId), u32>,
    arrivals: BTreeMap<(u32, TurnId), u32>,
    active_turn: BTreeMap<u64, TurnId>,
    fallback_allowed: bool,
    pub(crate) turns: u32,
    /// Invariant checks so far (every [`FULL_CHECK_EVERY`]-th is a full one).
    checks: u64,
    /// Scratch: the sessions the current step named.
    touched: Vec<SessionId>,
}

/// Every this many steps the oracle checks the whole core instead of the sessions the step
/// named, so a step that wrongly writes to another session is still caught, a few steps
/// late. Timers and restarts always get the full check.
const FULL_CHECK_EVERY: u64 = 16;

fn v(invariant: &str, message: String, idx: u64) -> Violation {
    Violation {
        invariant: invariant.to_owned(),
        message,
        events: vec![idx],
    }
}

impl Oracle {
    pub(crate) fn new(config: &Config, scenario: &Scenario) -> Self {
        Oracle {
            audit: Auditor::new(config),
            enabled: std::env::var_os("PALISADE_ORACLE").is_none_or(|v| v != "off"),
            marks: BTreeMap::new(),
            responses: BTreeMap::new(),
            recoveries: BTreeMap::new(),
            arrivals: BTreeMap::new(),
            active_turn: BTreeMap::new(),
            fallback_allowed: scenario.expect.fallback_allowed,
            turns: 0,
            checks: 0,
            touched: Vec::new(),
        }
    }

    pub(crate) fn mark(&mut self, name: &str) {
        *self.marks.entry(name.to_owned()).or_insert(0) += 1;
    }

    fn bookkeeping(&mut self, effects: &[Effect]) {
        for e in effects {
            match e {
                Effect::TurnEnded { session, turn, .. } => {
                    *self.responses.entry(session.get()).or_insert(0) += 1;
                    if self.active_turn.get(&session.get()) == Some(turn) {
                        self.active_turn.remove(&session.get());
                    }
                }
                Effect::RecoveryStarted { session, turn, .. } => {
                    *self
                        .recoveries
                        .entry((session.get() as u32, *turn))
                        .or_insert(0) += 1;
                }
                _ => {}
            }
        }
    }

    /// After one input.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn step(
        &mut self,
        core: &Core,
        now: Timestamp,
        input: &Input,
        about: Option<SessionId>,
        verdict: &Verdict,
        effects: &[Effect],
        _provider: &Provider,
        idx: u64,
    ) -> Result<(), Violation> {
        match (input, verdict) {
            (Input::Prompt { session, turn }, Verdict::Claimed) => {
                self.turns += 1;
                self.active_turn.insert(session.get(), *turn);
            }
            (Input::Cancel { session }, Verdict::Accepted) => {
                if let Some(t) = self.active_turn.get(&session.get()) {
                    if self.recoveries.contains_key(&(session.get() as u32, *t)) {
                        self.mark("cancel-after-provider-exit");
                    }
                }
            }
            (_, Verdict::Reject(RejectReason::AttemptEvicted)) => {
                self.mark("stale-callback-after-tombstone-eviction")
            }
            (_, Verdict::Reject(RejectReason::LeaseExpired)) => self.mark("lease-expired"),
            (Input::Callback(cb), Verdict::Reject(RejectReason::WrongTurn))
                if matches!(
                    cb.event,
                    RuntimeEvent::PromptCompleted { .. } | RuntimeEvent::PromptFailed { .. }
                ) =>
            {
                self.mark("duplicate-terminal-suppressed")
            }
            _ => {}
        }
        self.bookkeeping(effects);
        if !self.enabled {
            return Ok(());
        }
        if let Err(e) = self.audit.observe(now, input, verdict, effects) {
            return Err(v(e.rule, e.detail, idx));
        }
        self.invariants(core, about, effects, idx)
    }

    /// The core's own invariants after a step: the sessions the step was about (its
    /// input's, or a performed lease's, and its effects'), and every
    /// [`FULL_CHECK_EVERY`]-th step, or when the step is about no known session (an
    /// execution stopped), the whole core.
    fn invariants(
        &mut self,
        core: &Core,
        input_session: Option<SessionId>,
        effects: &[Effect],
        idx: u64,
    ) -> Result<(), Violation> {
        self.checks += 1;
        let result = match input_session {
            Some(s) if !self.checks.is_multiple_of(FULL_CHECK_EVERY) => {
                self.touched.clear();
                self.touched.push(s);
                for e in effects {
                    let s = e.session();
                    if !self.touched.contains(&s) {
                        self.touched.push(s);
                    }
                }
                core.check_invariants_of(&self.touched)
            }
            _ => core.check_invariants(),
        };
        result.map_err(|e| v(e.rule, format!("core invariant: {}", e.detail), idx))
    }

    /// The core saw this time, with nothing else happening.
    pub(crate) fn tick(&mut self, now: Timestamp) {
        self.audit.observe_time(now);
    }

    /// After timers fired.
    pub(crate) fn timeout(
        &mut self,
        core: &Core,
        now: Timestamp,
        effects: &[Effect],
        idx: u64,
    ) -> Result<(), Violation> {
        self.bookkeeping(effects);
        if !self.enabled {
            return Ok(());
        }
        if let Err(e) = self.audit.observe_timeout(now, effects) {
            return Err(v(e.rule, e.detail, idx));
        }
        core.check_invariants()
            .map_err(|e| v(e.rule, format!("core invariant: {}", e.detail), idx))
    }

    /// After a crash-restart.
    pub(crate) fn restart(
        &mut self,
        core: &Core,
        now: Timestamp,
        effects: &[Effect],
        idx: u64,
    ) -> Result<(), Violation> {
        self.bookkeeping(effects);
        if !self.enabled {
            return Ok(());
        }
        if let Err(e) = self.audit.observe_restart(now, effects) {
            return Err(v(e.rule, e.detail, idx));
        }
        core.check_invariants()
            .map_err(|e| v(e.rule, format!("core invariant: {}", e.detail), idx))
    }

    /// Ground truth, rule 6: `session/new` is about to replace the session's conversation.
    pub(crate) fn new_conversation(
        &mut self,
        core: &Core,
        session: SessionId,
        reason: NewConversationReason,
        provider: &Provider,
        agent: Agent,
    ) -> Result<(), Violation> {
        let NewConversationReason::Fallback(r) = reason else {
            return Ok(());
        };
        if !self.enabled {
            return Ok(());
        }
        if let Some(token) = core.conversation(session) {
            if agent != Agent::NoLoad && provider.conversations.contains(&token.get()) {
                return Err(v("R6-fallback-proof", format!("session {session}: conversation {token} replaced by session/new ({r:?}) although the provider still has it"), 0));
            }
        }
        if !self.fallback_allowed {
            return Err(v("R6-fallback-proof", format!("session {session}: fallback to session/new ({r:?}) in a scenario where every load can succeed"), 0));
        }
        Ok(())
    }

    /// Ground truth, rules 2, 4, 7 and 8: a prompt reached the provider.
    pub(crate) fn prompt_arrived(
        &mut self,
        session: u32,
        turn: TurnId,
        exec: ExecutionId,
        generation: Generation,
        _request: PromptRequest,
        provider: &mut Provider,
    ) -> Result<(), Violation> {
        let n = self.arrivals.entry((session, turn)).or_insert(0);
        *n += 1;
        let n = *n;
        if !self.enabled {
            return Ok(());
        }
        if let Some(c) = provider.containers.get(&exec) {
            if let Some(a) = c
                .agent
                .filter(|a| c.alive && a.alive && a.generation != generation)
            {
                return Err(v("R4-toctou", format!("session {session} turn {turn}: prompt leased for {exec}/{generation} reached its replacement generation {}", a.generation), 0));
            }
        }
        let allowed = 1 + self.recoveries.get(&(session, turn)).copied().unwrap_or(0);
        if n > allowed {
            return Err(v("R7-prompt-once", format!("session {session} turn {turn}: prompt reached an agent {n} times with {} recoveries", allowed - 1), 0));
        }
        Ok(())
    }

    /// Liveness once the faults stopped and the quiesce time passed.
    pub(crate) fn liveness(
        &mut self,
        core: &Core,
        provider: &Provider,
        scenario: &Scenario,
        idx: u64,
    ) -> Result<(), Violation> {
        if provider.closed_on_full > 0 {
            return Err(v(
                "R9-queue-never-closes",
                format!(
                    "a notification queue closed the connection because it was full ({} times)",
                    provider.closed_on_full
                ),
                idx,
            ));
        }
        if let Err(e) = self.audit.check_quiescent() {
            return Err(v(e.rule, e.detail, idx));
        }
        for s in 1..=scenario.workload.sessions {
            let id = SessionId::new(u64::from(s)).expect("1-based");
            if core.session_busy(id) {
                return Err(v(
                    "R7-never-busy-idle",
                    format!("session {s} still busy after the quiesce time"),
                    idx,
                ));
            }
        }
        for (exec, c) in &provider.containers {
            if !c.alive {
                continue;
            }
            let id = SessionId::new(u64::from(c.session)).expect("1-based");
            if core.runtime(id) != Some(*exec) {
                let what = if c.stopping {
                    "teardown never finished"
                } else {
                    "still running, owned by no one"
                };
                return Err(v(
                    "R5-leaked-execution",
                    format!("session {}: execution {exec} {what}", c.session),
                    idx,
                ));
            }
        }
        if let Some(n) = scenario.expect.responses_per_session {
            for s in 1..=scenario.workload.sessions {
                let got = self.responses.get(&u64::from(s)).copied().unwrap_or(0);
                if got != n {
                    return Err(v(
                        "responses",
                        format!("session {s}: {got} responses, expected exactly {n}"),
                        idx,
                    ));
                }
            }
        }
        Ok(())
    }
}
