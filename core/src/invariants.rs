//! `check_invariants()`: the core's own view of the rules, cheap enough to run after
//! every simulated step and every fuzzer operation.

use crate::attempt::{AttemptState, ConvPhase};
use crate::cleanup::StopState;
use crate::config::{GENERATIONS_PER_EXECUTION, MAX_RECOVERY_STEPS, TOMBSTONES_PER_SESSION};
use crate::core::{Core, Timer};
use crate::ids::AttemptId;
use crate::turn::TurnPhase;

/// A broken internal invariant: a bug in the core (or a corrupted snapshot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvariantViolation {
    /// The rule, e.g. `"R3-one-tombstone"`.
    pub rule: &'static str,
    /// What was seen.
    pub detail: String,
}

impl std::fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.rule, self.detail)
    }
}

impl std::error::Error for InvariantViolation {}

macro_rules! ensure {
    ($cond:expr, $rule:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(InvariantViolation { rule: $rule, detail: format!($($fmt)+) });
        }
    };
}

impl Core {
    /// Checks every internal invariant; `Err` names the first broken one.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let minted = |a: AttemptId| {
            a.epoch() < self.epoch || (a.epoch() == self.epoch && a.seq() < self.next_attempt_seq)
        };
        ensure!(
            self.config.recovery_delays_ms.len() <= MAX_RECOVERY_STEPS,
            "bounds",
            "recovery schedule too long"
        );
        // One pass over executions for the per-session teardown counts, so the whole check
        // stays linear in the state (it runs after every simulated step).
        let mut stopping: std::collections::BTreeMap<crate::ids::SessionId, usize> =
            std::collections::BTreeMap::new();
        for e in self.executions.values().filter(|e| e.is_stopping()) {
            *stopping.entry(e.session).or_insert(0) += 1;
        }
        for (&id, s) in &self.sessions {
            ensure!(
                s.ring.len() <= TOMBSTONES_PER_SESSION,
                "R2-bounded-ring",
                "session {id}: ring {}",
                s.ring.len()
            );
            // Strictly increasing tombstones: then only the newest needs the "minted" check
            // and only the oldest the watermark check, and a live attempt newer than the
            // newest tombstone cannot also be retired (rule 3).
            let mut prev: Option<AttemptId> = None;
            let mut oldest: Option<AttemptId> = None;
            for t in s.ring.iter() {
                ensure!(
                    prev.is_none_or(|p| p < t.attempt),
                    "R3-one-tombstone",
                    "session {id}: tombstones out of order at {}",
                    t.attempt
                );
                oldest = oldest.or(Some(t.attempt));
                prev = Some(t.attempt);
            }
            if let Some(newest) = prev {
                ensure!(
                    minted(newest),
                    "R2-monotonic-ids",
                    "session {id}: tombstone {newest} never minted"
                );
            }
            if let (Some(w), Some(o)) = (s.watermark, oldest) {
                ensure!(
                    w < o,
                    "R2-watermark",
                    "session {id}: tombstone {o} at or below the watermark {w}"
                );
            }
            if let Some(live) = s.live {
                ensure!(
                    minted(live.id),
                    "R2-monotonic-ids",
                    "session {id}: live {} never minted",
                    live.id
                );
                ensure!(
                    prev.is_none_or(|p| p < live.id),
                    "R1-one-live",
                    "session {id}: live {} older than a retired one",
                    live.id
                );
                let dispatched = s.turn.is_some_and(|t| {
                    matches!(
                        t.phase,
                        TurnPhase::Dispatched { .. } | TurnPhase::Performed { .. }
                    )
                });
                ensure!(
                    live.conversation != ConvPhase::Ready || dispatched,
                    "R7-never-busy-idle",
                    "session {id}: attempt {} has a ready conversation but nothing to dispatch",
                    live.id
                );
                ensure!(
                    live.state == AttemptState::Live,
                    "R1-states",
                    "session {id}: live attempt left in state {:?}",
                    live.state
                );
                ensure!(
                    s.owner.is_none() && s.runtime.is_none(),
                    "R2-owner",
                    "session {id}: a live attempt and a ready runtime at once"
                );
                if let (Some(e), Some(g)) = (live.execution, live.generation) {
                    if let Some(exec) = self.executions.get(&e) {
                        ensure!(
                            exec.generation >= g,
                            "R4-generations",
                            "session {id}: execution {e} went back in generation"
                        );
                        if exec.generation == g {
                            ensure!(
                                exec.owner == live.id,
                                "R5-ownership",
                                "session {id}: live {} bound {e} but does not own it",
                                live.id
                            );
                        }
                    }
                }
            }
            if let Some(owner) = s.owner {
                let t = s.ring.newest();
                ensure!(
                    t.is_some_and(|t| t.attempt == owner),
                    "R2-owner",
                    "session {id}: owner {owner} is not the newest finished attempt"
                );
                let e = s.runtime;
                ensure!(
                    e.is_some(),
                    "R2-owner",
                    "session {id}: owner without runtime"
                );
                if let Some(e) = e {
                    let exec = self.executions.get(&e);
                    ensure!(
                        exec.is_some_and(|x| x.owner == owner && !x.is_stopping()),
                        "R5-ownership",
                        "session {id}: runtime {e} not owned by {owner} or stopping"
                    );
                }
            }
            if let Some(turn) = s.turn {
                ensure!(
                    s.last_turn.is_some_and(|l| l >= turn.id),
                    "R7-claim",
                    "session {id}: turn newer than last_turn"
                );
                ensure!(
                    usize::from(turn.recoveries_started) <= self.config.recovery_delays_ms.len(),
                    "R8-started-bound",
                    "session {id}: {} recoveries started",
                    turn.recoveries_started
                );
                ensure!(
                    !turn.exhausted || turn.recoveries_started >= 1,
                    "R8-exhausted-after-attempt",
                    "session {id}: exhausted without an attempt"
                );
                // A session is never busy with nothing running.
                let running = match turn.phase {
                    TurnPhase::WaitingRuntime => s.live.is_some(),
                    TurnPhase::Dispatched { lease, execution } => {
                        self.leases.contains_key(&lease) && self.executions.contains_key(&execution)
                    }
                    TurnPhase::Performed {
                        execution,
                        deadline,
                    } => {
                        self.executions.contains_key(&execution)
                            && self
                                .timers
                                .contains(&(deadline, Timer::Accept(id, turn.id)))
                    }
                    TurnPhase::Accepted { execution } => self.executions.contains_key(&execution),
                    TurnPhase::Recovering { at } => {
                        self.timers.contains(&(at, Timer::Recovery(id, turn.id)))
                    }
                };
                ensure!(
                    running,
                    "R7-never-busy-idle",
                    "session {id}: turn {} in {:?} with nothing running",
                    turn.id,
                    turn.phase
                );
            }
            let counted = stopping.remove(&id).unwrap_or(0);
            ensure!(
                usize::from(s.stopping) == counted,
                "R5-stop-count",
                "session {id}: counts {} stopping, {} are",
                s.stopping,
                counted
            );
        }
        if let Some((id, n)) = stopping.first_key_value() {
            return Err(InvariantViolation {
                rule: "R5-stop-count",
                detail: format!("{n} executions stopping for unknown session {id}"),
            });
        }
        for (eid, e) in &self.executions {
            ensure!(
                e.history_is_well_formed(),
                "R4-bounded-history",
                "execution {eid}: generation history malformed or longer than {GENERATIONS_PER_EXECUTION}"
            );
            ensure!(
                self.sessions.contains_key(&e.session),
                "R5-ownership",
                "execution {eid} of an unknown session"
            );
            ensure!(
                e.generation.get() < self.next_generation,
                "R4-generations",
                "execution {eid}: generation never minted"
            );
            ensure!(
                e.bound_attempt(e.generation) == Some(e.owner),
                "R4-binding-frozen",
                "execution {eid}: current generation not bound to its owner"
            );
            let mut last = None;
            for (g, _) in e.history() {
                ensure!(
                    last.is_none_or(|l| l < g),
                    "R4-generations",
                    "execution {eid}: history not increasing"
                );
                last = Some(g);
            }
            if let StopState::Stopping { deadline } = e.stop {
                ensure!(
                    deadline == crate::time::Timestamp::MAX
                        || self.timers.contains(&(deadline, Timer::Stop(*eid))),
                    "R5-stop-deadline",
                    "execution {eid}: stopping without a deadline timer"
                );
            }
        }
        for (lid, l) in &self.leases {
            ensure!(
                self.timers.contains(&(l.deadline, Timer::Lease(*lid))),
                "R4-lease-deadline",
                "lease {lid} without its deadline"
            );
        }
        Ok(())
    }
}
