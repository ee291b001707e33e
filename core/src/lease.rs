//! Rule 4, generation leases. Every effect that acts on an execution is issued under a
//! lease on `(execution, generation)` for the attempt whose callback caused it. The
//! embedder asks ([`crate::Input::Perform`]) right before performing it; the core answers
//! no if a replacement startup advanced the generation, the attempt was cancelled or
//! superseded, or the lease's deadline passed. So validation and effect are one step, and
//! a late effect never lands on a replacement.

use serde::{Deserialize, Serialize};

use crate::ids::{AttemptId, ExecutionId, Generation, SessionId, TurnId};
use crate::time::Timestamp;

/// What a lease allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum LeaseAction {
    Load,
    New,
    Prompt(TurnId),
}

/// An outstanding lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lease {
    pub(crate) session: SessionId,
    pub(crate) execution: ExecutionId,
    pub(crate) generation: Generation,
    pub(crate) attempt: AttemptId,
    pub(crate) deadline: Timestamp,
    pub(crate) action: LeaseAction,
}
