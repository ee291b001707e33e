//! Rule 4, generations and leases. Binding a runtime to the live attempt
//! ([`Input::Bound`]) starts a new generation of its execution: the fence token every
//! callback of that startup carries. Every effect that acts on an execution is issued under
//! a lease on `(execution, generation)` for the attempt whose callback caused it. The
//! embedder asks ([`Input::Perform`]) right before performing it; the core answers no if a
//! replacement startup advanced the generation, the attempt was cancelled or superseded, or
//! the lease's deadline passed. So validation and effect are one step, and a late effect
//! never lands on a replacement.

use crate::core::Core;
use crate::execution::{Execution, Lease, LeaseAction};
use crate::ids::{AttemptId, ExecutionId, Generation, LeaseId, SessionId};
#[cfg(doc)]
use crate::io::Input;
use crate::io::{RejectReason, Verdict};
use crate::mutants::mutant_on;
use crate::ring::{remember, Remembered, Retired};
use crate::session::{ConvPhase, TurnPhase};
use crate::time::Timestamp;
use crate::timers::Timer;

impl Core {
    // ----- binding a runtime: a new generation ------------------------------------------

    /// The embedder started (or reused) `execution` for `attempt`: a new generation, bound
    /// to the attempt if it is still the live one. A late bind of a retired attempt is
    /// refused, and claims the execution's teardown if no later attempt did (rule 5).
    pub(crate) fn bound(
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
        // The live attempt holds the execution's newest generation and owns it; it is no
        // longer anyone's ready runtime (rules 4 and 5).
        assert!(s.runtime != Some(execution));
        debug_assert!(self
            .executions
            .get(&execution)
            .is_some_and(|e| e.session == session
                && e.generation == generation
                && e.owner == attempt
                && !e.is_stopping()));
        Verdict::Bound { generation }
    }

    // ----- leasing an effect, and performing it --------------------------------------------

    /// Issues a lease on `(execution, generation)` for `attempt`'s effect, due
    /// `lease_ms` from now; `None` if the lease counter is exhausted.
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
        let lease = Lease {
            session,
            execution,
            generation,
            attempt,
            deadline,
            action,
        };
        // A lease and its deadline come and go together (`perform`, `lease_deadline_passed`).
        let previous = self.leases.insert(id, lease);
        let armed = self.timers.insert((deadline, Timer::Lease(id)));
        assert!(
            previous.is_none() && armed,
            "rule 4: lease {id} issued twice"
        );
        Some(id)
    }

    /// The embedder is about to perform the leased effect: it may, if the lease is still
    /// current. The lease is used up either way; a refused one settles what waited on it.
    pub(crate) fn perform(&mut self, now: Timestamp, id: LeaseId) -> Verdict {
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
        let armed = self.timers.remove(&(lease.deadline, Timer::Lease(id)));
        assert!(armed, "rule 4: lease {id} outlived its deadline");
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

    /// A lease not performed by its deadline is revoked.
    pub(crate) fn lease_deadline_passed(&mut self, now: Timestamp, id: LeaseId) {
        if let Some(lease) = self.leases.remove(&id) {
            self.lease_lost(now, id, lease);
        }
    }
}
