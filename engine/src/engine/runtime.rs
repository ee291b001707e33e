//! One agent process the engine knows: its binding, its conversation, the prompt in flight.

use super::*;

/// One agent process the engine knows.
#[derive(Debug)]
pub(super) struct Runtime {
    pub(super) session: SessionId,
    pub(super) attempt: AttemptId,
    pub(super) generation: Option<Generation>,
    pub(super) has_process: bool,
    pub(super) load_capability: Option<bool>,
    /// The ACP session id being loaded.
    pub(super) loading: Option<String>,
    /// Why `session/new` was sent.
    pub(super) new_reason: Option<NewConversationReason>,
    /// The ACP session id this runtime's conversation has.
    pub(super) conversation: Option<String>,
    pub(super) prompt: Option<PromptState>,
    /// A dispatch waiting for the agent to answer the prompt before it (ACP runs one
    /// prompt at a time per session): its state and its request's params.
    pub(super) held: Option<(PromptState, acp::Params)>,
    pub(super) close_reason: Option<CloseReason>,
    pub(super) reaped: Option<Option<ProcessExit>>,
    /// The agent advertised `session/list` in `initialize`.
    pub(super) lists_sessions: bool,
    /// A failed load waiting for the agent's `session/list` before it is reported.
    pub(super) listing: Option<PendingListing>,
    pub(super) exit_reported: bool,
    pub(super) stop_requested: bool,
    pub(super) kill_requested: bool,
}

impl Runtime {
    pub(super) fn alive(&self) -> bool {
        self.has_process
            && self.close_reason.is_none()
            && !self.exit_reported
            && !self.stop_requested
            && !self.kill_requested
    }

    pub(super) fn transport(&self) -> TransportState {
        match &self.close_reason {
            None => TransportState::Open,
            Some(CloseReason::ProcessExited(_)) => TransportState::ProcessExited,
            Some(_) => TransportState::Closed,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct PromptState {
    pub(super) turn: TurnId,
    pub(super) dispatch: u64,
    pub(super) next_seq: u64,
    pub(super) accepted: bool,
    /// A later dispatch waits behind it: the core no longer awaits this one, so its
    /// updates and its answer only say when the agent is free again.
    pub(super) superseded: bool,
}

/// A load failure held back while the agent's `session/list` is read.
#[derive(Debug)]
pub(super) struct PendingListing {
    pub(super) outcome: LoadOutcome,
    /// Pages read so far.
    pub(super) pages: u32,
}
