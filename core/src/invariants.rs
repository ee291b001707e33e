//! `check_invariants()`: the core's own view of the rules, cheap enough to run after
//! every simulated step and every fuzzer operation.

use crate::config::{GENERATIONS_PER_EXECUTION, MAX_RECOVERY_STEPS, TOMBSTONES_PER_SESSION};
use crate::core::Core;
use crate::execution::{Execution, Lease, StopState};
use crate::ids::{AttemptId, ExecutionId, Generation, LeaseId, SessionId};
use crate::session::{ConvPhase, Session, TurnPhase};
use crate::timers::Timer;

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

/// What [`Core::check_invariants`] reads from an execution's history, in one walk instead
/// of one per rule: exactly `Execution::history_is_well_formed`, `Execution::bound_attempt`
/// of the current generation, and whether the generations strictly increase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HistoryFacts {
    well_formed: bool,
    bound_current: Option<AttemptId>,
    increasing: bool,
}

impl HistoryFacts {
    fn of(e: &Execution) -> HistoryFacts {
        let mut count = 0;
        let mut bound_current = None;
        let mut increasing = true;
        let mut last: Option<Generation> = None;
        for (g, a) in e.history() {
            count += 1;
            if bound_current.is_none() && g == e.generation {
                bound_current = Some(a);
            }
            increasing &= last.is_none_or(|l| l < g);
            last = Some(g);
        }
        let n = e.history_len();
        HistoryFacts {
            well_formed: (1..=GENERATIONS_PER_EXECUTION).contains(&n) && count == n,
            bound_current,
            increasing,
        }
    }
}

/// A record a session's check reads that is not that session's own: an execution or a
/// lease it points at that belongs to another session, or to none. The core never makes
/// one (it keys every record by its session), but a bug can, and then a step about the
/// other session can break this session's invariants: the incremental checker
/// (`audit::Checker`) re-checks the session whenever a step may have changed the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Foreign {
    /// An execution the session's live attempt, runtime or turn points at.
    Execution(ExecutionId),
    /// The lease the session's dispatched turn waits on.
    Lease(LeaseId),
}

impl Core {
    /// Checks every internal invariant; `Err` names the first broken one.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.check_all_noting(&mut Vec::new())
    }

    /// [`Core::check_invariants`], noting every session's [`Foreign`] records into
    /// `foreign` (complete when it returns `Ok`).
    pub(crate) fn check_all_noting(
        &self,
        foreign: &mut Vec<(SessionId, Foreign)>,
    ) -> Result<(), InvariantViolation> {
        self.check_bounds()?;
        // One pass over executions for the per-session teardown counts, so the whole check
        // stays linear in the state. Sorted by session, as few as the teardowns pending
        // (usually none: then nothing is allocated); a count goes to 0 once its session
        // took it, so the first nonzero one left is the smallest unknown session.
        let mut stopping: Vec<(SessionId, usize)> = Vec::new();
        for e in self.executions.values().filter(|e| e.is_stopping()) {
            match stopping.binary_search_by_key(&e.session, |&(s, _)| s) {
                Ok(at) => stopping[at].1 += 1,
                Err(at) => stopping.insert(at, (e.session, 1)),
            }
        }
        for (&id, s) in &self.sessions {
            let n = if stopping.is_empty() {
                0
            } else {
                match stopping.binary_search_by_key(&id, |&(s, _)| s) {
                    Ok(at) => std::mem::take(&mut stopping[at].1),
                    Err(_) => 0,
                }
            };
            self.check_session(id, s, n, foreign)?;
        }
        if let Some((id, n)) = stopping.iter().find(|&&(_, n)| n > 0) {
            return Err(InvariantViolation {
                rule: "R5-stop-count",
                detail: format!("{n} executions stopping for unknown session {id}"),
            });
        }
        for (&eid, e) in &self.executions {
            self.check_execution(eid, e)?;
        }
        for (&lid, l) in &self.leases {
            self.check_lease(lid, l)?;
        }
        Ok(())
    }

    /// The part of [`Core::check_invariants`] that concerns `sessions`: each of them (an
    /// unknown one is skipped), the executions they own, and their leases.
    ///
    /// This is the check to run after a step that named only these sessions (its input
    /// and its effects), and it costs that step's share of the state instead of all of
    /// it. Every check it makes is one the full check makes, so when it fails the full one
    /// fails too. It cannot see a step that wrongly wrote to a session it was not about:
    /// [`crate::audit::Checker`] uses it only for the sessions a step could have changed
    /// (see `Checker::scope`), and `core/tests/incremental.rs` holds the two equal.
    pub fn check_invariants_of(&self, sessions: &[SessionId]) -> Result<(), InvariantViolation> {
        self.check_sessions_noting(sessions, &mut Vec::new())
    }

    /// [`Core::check_invariants_of`], noting the [`Foreign`] records of `sessions` into
    /// `foreign` (complete for them when it returns `Ok`).
    pub(crate) fn check_sessions_noting(
        &self,
        sessions: &[SessionId],
        foreign: &mut Vec<(SessionId, Foreign)>,
    ) -> Result<(), InvariantViolation> {
        self.check_bounds()?;
        // One pass over executions for all the sessions; a step names one to three.
        let mut stopping = [0usize; 4];
        let counted = sessions.len() <= stopping.len();
        for (&eid, e) in &self.executions {
            if let Some(at) = sessions.iter().position(|&s| s == e.session) {
                self.check_execution(eid, e)?;
                if counted && e.is_stopping() {
                    stopping[at] += 1;
                }
            }
        }
        for (at, &id) in sessions.iter().enumerate() {
            let Some(s) = self.sessions.get(&id) else {
                continue;
            };
            let n = if counted {
                stopping[at]
            } else {
                self.executions
                    .values()
                    .filter(|e| e.session == id && e.is_stopping())
                    .count()
            };
            self.check_session(id, s, n, foreign)?;
        }
        for (&lid, l) in &self.leases {
            if sessions.contains(&l.session) {
                self.check_lease(lid, l)?;
            }
        }
        Ok(())
    }

    fn check_bounds(&self) -> Result<(), InvariantViolation> {
        ensure!(
            self.config.recovery_delays_ms.len() <= MAX_RECOVERY_STEPS,
            "bounds",
            "recovery schedule too long"
        );
        Ok(())
    }

    fn minted(&self, a: AttemptId) -> bool {
        a.epoch() < self.epoch || (a.epoch() == self.epoch && a.seq() < self.next_attempt_seq)
    }

    /// One session; `stopping` is how many of its executions are being torn down. The
    /// records it reads that are not the session's own go to `foreign`.
    fn check_session(
        &self,
        id: SessionId,
        s: &Session,
        stopping: usize,
        foreign: &mut Vec<(SessionId, Foreign)>,
    ) -> Result<(), InvariantViolation> {
        let execution = |e: ExecutionId, foreign: &mut Vec<(SessionId, Foreign)>| {
            let x = self.executions.get(&e);
            if x.is_none_or(|x| x.session != id) {
                foreign.push((id, Foreign::Execution(e)));
            }
            x
        };
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
        s.ring.try_for_each_attempt(|attempt| {
            ensure!(
                prev.is_none_or(|p| p < attempt),
                "R3-one-tombstone",
                "session {id}: tombstones out of order at {}",
                attempt
            );
            oldest = oldest.or(Some(attempt));
            prev = Some(attempt);
            Ok(())
        })?;
        if let Some(newest) = prev {
            ensure!(
                self.minted(newest),
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
                self.minted(live.id),
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
                s.owner.is_none() && s.runtime.is_none(),
                "R2-owner",
                "session {id}: a live attempt and a ready runtime at once"
            );
            let exec = live.execution.map(|e| (e, execution(e, foreign)));
            if let (Some((e, Some(exec))), Some(g)) = (exec, live.generation) {
                {
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
                let exec = execution(e, foreign);
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
            // Rule 8 (silence): an idle deadline belongs to an accepted turn and is armed.
            ensure!(
                turn.idle_at.is_none_or(|at| {
                    matches!(turn.phase, TurnPhase::Accepted { .. })
                        && self.timers.contains(&(at, Timer::Idle(id, turn.id)))
                }),
                "R8-idle-armed",
                "session {id}: turn {} has an idle deadline {:?} in {:?} without its timer",
                turn.id,
                turn.idle_at,
                turn.phase
            );
            // A session is never busy with nothing running.
            let running = match turn.phase {
                TurnPhase::WaitingRuntime => s.live.is_some(),
                TurnPhase::Dispatched {
                    lease,
                    execution: e,
                } => {
                    let l = self.leases.get(&lease);
                    if l.is_none_or(|l| l.session != id) {
                        foreign.push((id, Foreign::Lease(lease)));
                    }
                    let x = execution(e, foreign);
                    l.is_some() && x.is_some()
                }
                TurnPhase::Performed {
                    execution: e,
                    deadline,
                } => {
                    execution(e, foreign).is_some()
                        && self
                            .timers
                            .contains(&(deadline, Timer::Accept(id, turn.id)))
                }
                TurnPhase::Accepted { execution: e } => execution(e, foreign).is_some(),
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
        ensure!(
            usize::from(s.stopping) == stopping,
            "R5-stop-count",
            "session {id}: counts {} stopping, {} are",
            s.stopping,
            stopping
        );
        Ok(())
    }

    fn check_execution(&self, eid: ExecutionId, e: &Execution) -> Result<(), InvariantViolation> {
        let history = HistoryFacts::of(e);
        ensure!(
            history.well_formed,
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
            history.bound_current == Some(e.owner),
            "R4-binding-frozen",
            "execution {eid}: current generation not bound to its owner"
        );
        ensure!(
            history.increasing,
            "R4-generations",
            "execution {eid}: history not increasing"
        );
        if let StopState::Stopping { deadline } = e.stop {
            ensure!(
                deadline == crate::time::Timestamp::MAX
                    || self.timers.contains(&(deadline, Timer::Stop(eid))),
                "R5-stop-deadline",
                "execution {eid}: stopping without a deadline timer"
            );
        }
        Ok(())
    }

    fn check_lease(&self, lid: LeaseId, l: &Lease) -> Result<(), InvariantViolation> {
        ensure!(
            self.timers.contains(&(l.deadline, Timer::Lease(lid))),
            "R4-lease-deadline",
            "lease {lid} without its deadline"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::ids::{Epoch, ExecutionId, SessionId};
    use crate::io::{Input, Verdict};
    use crate::{Config, Core, Timestamp};

    fn sid(n: u64) -> SessionId {
        SessionId::new(n).unwrap()
    }

    /// Two sessions, each with a live attempt bound to its own execution.
    fn two_sessions() -> Core {
        let mut core = Core::new(Config::default(), Epoch::new(1).unwrap()).unwrap();
        for n in [1, 2] {
            let now = Timestamp::from_millis(n);
            assert!(matches!(
                core.handle(now, Input::Resume { session: sid(n) }),
                Verdict::Started { .. }
            ));
            let attempt = core.live_attempt(sid(n)).unwrap();
            let bound = core.handle(
                now,
                Input::Bound {
                    session: sid(n),
                    attempt,
                    execution: ExecutionId::new(n * 10).unwrap(),
                },
            );
            assert!(matches!(bound, Verdict::Bound { .. }));
            while core.poll_effect().is_some() {}
        }
        core
    }

    #[test]
    fn the_session_check_sees_what_the_full_check_sees_in_its_sessions() {
        let mut core = two_sessions();
        assert_eq!(core.check_invariants(), Ok(()));
        assert_eq!(core.check_invariants_of(&[sid(1), sid(2)]), Ok(()));
        // Break session 2's teardown count.
        core.sessions.get_mut(&sid(2)).unwrap().stopping = 3;
        let full = core.check_invariants().unwrap_err();
        assert_eq!(full.rule, "R5-stop-count");
        assert_eq!(core.check_invariants_of(&[sid(2)]), Err(full));
        // Session 1's check does not look at session 2: the documented blind spot that the
        // checker covers by choosing every session a step could have changed.
        assert_eq!(core.check_invariants_of(&[sid(1)]), Ok(()));
        // An unknown session is skipped, not an error.
        assert_eq!(core.check_invariants_of(&[sid(9)]), Ok(()));
    }

    #[test]
    fn the_session_check_covers_the_sessions_executions_and_leases() {
        let mut core = two_sessions();
        // Session 2's execution claims a generation never minted.
        let exec = core
            .executions
            .get_mut(&ExecutionId::new(20).unwrap())
            .unwrap();
        exec.generation = crate::ids::Generation::new(999).unwrap();
        assert!(core.check_invariants().is_err());
        assert!(core.check_invariants_of(&[sid(2)]).is_err());
        assert_eq!(core.check_invariants_of(&[sid(1)]), Ok(()));
    }
    #[test]
    fn teardown_counts_are_matched_per_session_and_the_smallest_unknown_one_is_named() {
        use crate::execution::StopState;
        let stop = |core: &mut Core, e: u64, session: u64| {
            let exec = core
                .executions
                .get_mut(&ExecutionId::new(e).unwrap())
                .unwrap();
            exec.stop = StopState::Stopping {
                deadline: Timestamp::MAX,
            };
            exec.session = sid(session);
        };
        let mut core = two_sessions();
        stop(&mut core, 20, 2);
        core.sessions.get_mut(&sid(2)).unwrap().stopping = 1;
        assert_eq!(core.check_invariants(), Ok(()));
        // Both executions stop for sessions the core does not know: the smaller is named,
        // with its own count.
        core.sessions.get_mut(&sid(2)).unwrap().stopping = 0;
        stop(&mut core, 10, 9);
        stop(&mut core, 20, 8);
        let err = core.check_invariants().unwrap_err();
        assert_eq!(err.rule, "R5-stop-count");
        assert_eq!(
            err.detail,
            format!("1 executions stopping for unknown session {}", sid(8))
        );
        stop(&mut core, 20, 9);
        let err = core.check_invariants().unwrap_err();
        assert_eq!(
            err.detail,
            format!("2 executions stopping for unknown session {}", sid(9))
        );
        // A known session's count is taken by that session, never reported as unknown.
        stop(&mut core, 10, 2);
        stop(&mut core, 20, 2);
        core.sessions.get_mut(&sid(2)).unwrap().stopping = 2;
        assert_eq!(core.check_invariants(), Ok(()));
        core.sessions.get_mut(&sid(2)).unwrap().stopping = 1;
        let err = core.check_invariants().unwrap_err();
        assert_eq!(err.rule, "R5-stop-count");
        assert_eq!(
            err.detail,
            format!("session {}: counts 1 stopping, 2 are", sid(2))
        );
    }

    /// The one walk of the history reads what the three per-rule walks read, on histories
    /// binding produces and on corrupt ones.
    #[test]
    fn the_history_walk_matches_the_per_rule_reads() {
        use super::HistoryFacts;
        use crate::execution::Execution;
        use crate::ids::{AttemptId, Generation};
        let g = |n: u64| Generation::new(n).unwrap();
        let a = |n: u64| AttemptId::new(Epoch::FIRST, n).unwrap();
        let reference = |e: &Execution| {
            let mut last = None;
            let mut increasing = true;
            for (g, _) in e.history() {
                increasing &= last.is_none_or(|l| l < g);
                last = Some(g);
            }
            HistoryFacts {
                well_formed: e.history_is_well_formed(),
                bound_current: e.bound_attempt(e.generation),
                increasing,
            }
        };
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut e = Execution::new(sid(1), g(1), a(1));
        for n in 2..=20 {
            assert_eq!(HistoryFacts::of(&e), reference(&e), "after {n} bindings");
            e.rebind(g(n), a(n));
        }
        for round in 0..2_000 {
            let used = (next() % 12) as usize;
            let prefix = (0..used)
                .map(|_| (next() % 4 != 0).then(|| (g(1 + next() % 6), a(1 + next() % 6))))
                .collect();
            let mut e = Execution::new(sid(1), g(1 + next() % 6), a(1))
                .with_history_for_test(prefix, (next() % 12) as u8);
            e.owner = a(1 + next() % 6);
            assert_eq!(HistoryFacts::of(&e), reference(&e), "round {round}: {e:?}");
        }
    }
}
