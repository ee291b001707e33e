//! Rule 5, cleanup ownership.
//!
//! Every execution the core knows has exactly one owner: the newest attempt that claimed
//! it. Only the owner may stop it, only once, and only with a deadline. An attempt may
//! stop an execution only if no later attempt claimed that execution and no later attempt
//! is live; otherwise the stop is deferred (an orphan) until the later attempt settles. A
//! rejected stale failure of a predecessor that still owns its execution tears it down, so
//! no process leaks; a teardown that misses its deadline becomes a kill.

use crate::core::Core;
use crate::execution::{Execution, StopState};
use crate::ids::{AttemptId, ExecutionId, SessionId};
use crate::io::{Callback, Effect, RejectReason, RuntimeEvent, Verdict};
use crate::mutants::mutant_on;
use crate::ring::Tombstone;
use crate::session::MAX_ORPHANS_PER_SESSION;
use crate::time::Timestamp;
use crate::timers::Timer;

/// Whether `attempt` may stop `exec` now: it is still the owner (no later attempt claimed
/// the execution) and no later attempt is live.
pub(crate) fn may_stop(exec: &Execution, attempt: AttemptId, live: Option<AttemptId>) -> bool {
    exec.owner == attempt && live.is_none_or(|l| l <= attempt)
}

impl Core {
    /// A cancelled or failed attempt lets go of its execution: stop it if it may, defer if a
    /// later attempt is live, do nothing if a later attempt claimed it.
    pub(crate) fn release_execution(
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
        // Let go means: stopping now, deferred as an orphan its successor settles, or
        // already claimed by a later attempt.
        debug_assert!(self
            .executions
            .get(&execution)
            .is_some_and(|x| x.is_stopping()
                || x.owner != attempt
                || (x.orphan && self.sessions[&session].orphans.contains(&execution))));
    }

    /// When an attempt settles, orphans it did not claim are stopped by their owners.
    pub(crate) fn settle_orphans(&mut self, session: SessionId, settled: AttemptId) {
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
        debug_assert!(self.sessions[&session].orphans.is_empty());
    }

    /// Claims the execution's teardown: exactly once, with a deadline.
    pub(crate) fn claim_stop(&mut self, now: Timestamp, execution: ExecutionId) {
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
            let armed = self.timers.insert((deadline, Timer::Stop(execution)));
            assert!(armed, "rule 5: {execution} stopped twice");
        }
        if let Some(s) = self.sessions.get_mut(&session) {
            s.stopping = s.stopping.saturating_add(1);
            if s.runtime == Some(execution) {
                s.runtime = None;
                s.owner = None;
            }
            // A stopping execution is nobody's ready runtime; `forget_execution` counts it
            // back down.
            assert!(s.stopping > 0 && s.runtime != Some(execution));
        }
        self.push(Effect::StopExecution {
            session,
            execution,
            deadline,
        });
    }

    /// Forgets an execution that is gone (stopped, killed, exited).
    pub(crate) fn forget_execution(&mut self, execution: ExecutionId) -> Option<Execution> {
        let exec = self.executions.remove(&execution)?;
        if let StopState::Stopping { deadline } = exec.stop {
            self.timers.remove(&(deadline, Timer::Stop(execution)));
        }
        if let Some(s) = self.sessions.get_mut(&exec.session) {
            if exec.is_stopping() {
                // Counted up when its stop was claimed (`claim_stop`).
                assert!(s.stopping > 0, "rule 5: {execution} stopped uncounted");
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

    /// The embedder reports a teardown done ([`crate::Input::Stopped`]).
    pub(crate) fn stopped(&mut self, execution: ExecutionId) -> Verdict {
        match self.executions.get(&execution) {
            None => Verdict::Reject(RejectReason::UnknownExecution),
            Some(e) if !e.is_stopping() => Verdict::Reject(RejectReason::UnexpectedEvent),
            Some(_) => {
                self.forget_execution(execution);
                Verdict::Accepted
            }
        }
    }

    /// Rule 5: a rejected `failed` from a predecessor that still owns its execution tears
    /// that execution down, so no process or port leaks.
    pub(crate) fn stale_failure_teardown(&mut self, now: Timestamp, cb: &Callback, t: Tombstone) {
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

    /// A teardown past its deadline is given up: the process is to be killed, and the core
    /// forgets the execution.
    pub(crate) fn stop_deadline_passed(&mut self, execution: ExecutionId) {
        if let Some(exec) = self.forget_execution(execution) {
            self.push(Effect::KillExecution {
                session: exec.session,
                execution,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Epoch, Generation};

    fn a(n: u64) -> AttemptId {
        AttemptId::new(Epoch::FIRST, n).unwrap()
    }
    fn g(n: u64) -> Generation {
        Generation::new(n).unwrap()
    }

    #[test]
    fn an_attempt_never_stops_an_execution_a_later_attempt_claimed() {
        let s = SessionId::new(1).unwrap();
        let mut e = Execution::new(s, g(1), a(1));
        assert!(may_stop(&e, a(1), None));
        assert!(!may_stop(&e, a(1), Some(a(2))), "a later attempt is live");
        e.rebind(g(2), a(2));
        assert!(!may_stop(&e, a(1), None), "a later attempt claimed it");
        assert!(may_stop(&e, a(2), Some(a(2))));
    }
}
