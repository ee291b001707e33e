//! One session's records: its live attempt and the conversation step it waits for, its
//! tombstones, its ready runtime and conversation, its turn, its stored failure and its
//! orphaned executions.
//!
//! Plain data. Each rule's decisions about them live in the file named after the rule:
//! `attempt.rs` (rules 1–3), `lease.rs` (4), `cleanup.rs` (5), `turn.rs` (7 and 8),
//! `failure.rs` (10).

use serde::{Deserialize, Serialize};

use crate::failure::StoredFailure;
use crate::ids::{AttemptId, ConversationToken, ExecutionId, Generation, LeaseId, TurnId};
use crate::io::NewConversationReason;
use crate::ring::Ring;
use crate::time::Timestamp;

/// Orphaned executions remembered per session; beyond this the orphan is stopped at once,
/// which is safe because a successor cannot bind a stopping execution.
pub(crate) const MAX_ORPHANS_PER_SESSION: usize = 8;

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

/// The session's live attempt: starting its runtime. Once the provider accepts its prompt
/// it is retired as finished in the same step, so a live attempt is always starting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LiveAttempt {
    pub(crate) id: AttemptId,
    pub(crate) execution: Option<ExecutionId>,
    pub(crate) generation: Option<Generation>,
    /// The attempt fails if its conversation is not ready by then.
    pub(crate) start_deadline: Timestamp,
    /// Joiners are answered by then (the latest joiner's deadline).
    pub(crate) join_deadline: Option<Timestamp>,
    /// Where its conversation is: each answer is accepted only while it is awaited, so a
    /// duplicated or late `load_failed` cannot replace a conversation created since.
    pub(crate) conversation: ConvPhase,
}

/// The conversation step of a live attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ConvPhase {
    /// Waiting for the agent to be ready.
    Pending,
    /// `session/load` requested.
    Loading,
    /// `session/new` requested, for this reason.
    Creating(NewConversationReason),
    /// The conversation is ready (a prompt may be in flight).
    Ready,
}

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

/// The session's active turn (rules 7 and 8: its decisions, [`Turn::next_request`] among
/// them, are in `turn.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Turn {
    pub(crate) id: TurnId,
    pub(crate) phase: TurnPhase,
    /// The provider accepted this turn at least once, or its runtime was lost after the
    /// prompt was written to it (the agent may have read it: ACP has no acknowledgement).
    /// Either way an exit means recovery, not roll-back.
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
    /// The next loss of a performed, never accepted turn rolls it back instead of
    /// recovering it. Set by a restore (its runtime died with the previous incarnation:
    /// the loss is the orchestrator's and must not use up a recovery step). Not
    /// persisted.
    #[serde(skip)]
    pub(crate) next_loss_rolls_back: bool,
    /// The next runtime sequence number expected in the current dispatch.
    pub(crate) runtime_next: u64,
    /// When the accepted turn's runtime counts as silent ([`crate::Config::turn_idle_ms`]):
    /// set only in [`TurnPhase::Accepted`] with the rule on, and then armed as a timer
    /// (or parked while the embedder does not listen).
    pub(crate) idle_at: Option<Timestamp>,
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
            next_loss_rolls_back: false,
            idle_at: None,
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
}
