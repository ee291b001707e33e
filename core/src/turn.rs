//! Rules 7 and 8: prompt turns and their automatic recovery.
//!
//! A turn is claimed, dispatched to a ready runtime under a lease, accepted by the
//! provider, and ends exactly once. Every exit before the provider accepts rolls the claim
//! back (the user is told and may resend); a runtime that dies after acceptance is
//! replaced on the configured schedule, and the re-prompt carries the resume-replay block
//! exactly once, built from the current recovery generation.

use serde::{Deserialize, Serialize};

use crate::ids::{ExecutionId, LeaseId, TurnId};
use crate::io::PromptRequest;
use crate::mutants::{mutant_on, ActiveMutant};
use crate::time::Timestamp;

/// Where a turn is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum TurnPhase {
    /// Claimed; waiting for a ready runtime (a live attempt is starting one).
    WaitingRuntime,
    /// Dispatch issued under `lease`; not yet performed.
    Dispatched {
        lease: LeaseId,
        execution: ExecutionId,
    },
    /// The embedder performed the dispatch; waiting for the provider to accept.
    Performed {
        execution: ExecutionId,
        /// The provider must accept it by then, or the claim is rolled back.
        deadline: Timestamp,
    },
    /// The provider accepted; streaming.
    Accepted { execution: ExecutionId },
    /// The runtime died after acceptance; a replacement starts at `at`.
    Recovering { at: Timestamp },
}

/// The session's active turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Turn {
    pub(crate) id: TurnId,
    pub(crate) phase: TurnPhase,
    /// The provider accepted this turn at least once (so an exit means recovery, not
    /// roll-back).
    pub(crate) accepted_once: bool,
    pub(crate) user_cancelled: bool,
    /// `recovery_started` events so far (≤ schedule length).
    pub(crate) recoveries_started: u8,
    /// `recovery_exhausted` was recorded.
    pub(crate) exhausted: bool,
    /// Successful replacements so far.
    pub(crate) recovery_generation: u32,
    /// Events delivered to the caller (caller sequence numbers 1..=delivered).
    pub(crate) delivered: u64,
    /// Set by a restore for an accepted turn whose runtime died with the previous
    /// incarnation: that loss is the orchestrator's, not the provider's, so it resumes
    /// the turn without using up a recovery step. Cleared by the turn's next loss. Not
    /// persisted: every restore decides it afresh.
    #[serde(skip)]
    pub(crate) restart_grace: bool,
    /// The next runtime sequence number expected in the current dispatch.
    pub(crate) runtime_next: u64,
}

impl Turn {
    pub(crate) fn new(id: TurnId) -> Self {
        Turn {
            id,
            phase: TurnPhase::WaitingRuntime,
            accepted_once: false,
            user_cancelled: false,
            recoveries_started: 0,
            exhausted: false,
            recovery_generation: 0,
            delivered: 0,
            runtime_next: 1,
            restart_grace: false,
        }
    }

    /// The execution the turn currently runs on, if any.
    pub(crate) fn execution(&self) -> Option<ExecutionId> {
        match self.phase {
            TurnPhase::Dispatched { execution, .. }
            | TurnPhase::Performed { execution, .. }
            | TurnPhase::Accepted { execution } => Some(execution),
            TurnPhase::WaitingRuntime | TurnPhase::Recovering { .. } => None,
        }
    }

    /// The request for the next dispatch. A first dispatch carries no replay block; a
    /// re-prompt after recovery wraps the *original* request once, from the current
    /// recovery generation (never an already-wrapped earlier request).
    pub(crate) fn next_request(&mut self, mutant: ActiveMutant) -> PromptRequest {
        if !self.accepted_once {
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
        PromptRequest {
            replay_blocks: wraps,
            replay_generation: self.recovery_generation,
            delivered_through,
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
