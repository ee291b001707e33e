//! What enters the core ([`Input`]), what it answers ([`Verdict`]) and what it asks the
//! embedder to do ([`Effect`]).

use serde::{Deserialize, Serialize};

use crate::classify::{ClassifyReason, LoadOutcome};
use crate::ids::{
    AttemptId, ConversationToken, ErrorStamp, ExecutionId, Generation, LeaseId, SessionId, TurnId,
};
use crate::time::Timestamp;

/// One input. Feed it with [`crate::Core::handle`], then drain [`crate::Core::poll_effect`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Input {
    /// A client asks to resume the session's runtime (rule 1: begin or join).
    Resume {
        /// The session.
        session: SessionId,
    },
    /// A client submits a prompt: the turn is claimed, and dispatched once a runtime is
    /// ready (rule 7).
    Prompt {
        /// The session.
        session: SessionId,
        /// The new turn, unique within the session.
        turn: TurnId,
    },
    /// The user cancels: the live attempt (if not yet accepted) and the active turn.
    Cancel {
        /// The session.
        session: SessionId,
    },
    /// The embedder started (or reused) a runtime for `attempt` after
    /// [`Effect::StartRuntime`]; the core binds a new generation of `execution` to it.
    Bound {
        /// The session.
        session: SessionId,
        /// The attempt that asked for the runtime.
        attempt: AttemptId,
        /// The execution it got; may be one a predecessor used.
        execution: ExecutionId,
    },
    /// Something the runtime reported.
    Callback(Callback),
    /// The embedder is about to perform a leased effect: the core says whether it still may.
    Perform {
        /// The effect's lease.
        lease: LeaseId,
    },
    /// A teardown finished, or the process is known to be gone.
    Stopped {
        /// The execution.
        execution: ExecutionId,
    },
    /// The user dismissed the session's stored recovery failure.
    DismissFailure {
        /// The session.
        session: SessionId,
    },
}

impl Input {
    /// The session the input names; `None` for [`Input::Perform`] and [`Input::Stopped`],
    /// which name a lease or an execution.
    pub fn session(&self) -> Option<SessionId> {
        match self {
            Input::Resume { session }
            | Input::Prompt { session, .. }
            | Input::Cancel { session }
            | Input::Bound { session, .. }
            | Input::DismissFailure { session } => Some(*session),
            Input::Callback(cb) => Some(cb.session),
            Input::Perform { .. } | Input::Stopped { .. } => None,
        }
    }
}

/// A runtime callback: who says it, and what.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Callback {
    /// The session the runtime serves.
    pub session: SessionId,
    /// The execution that sent it.
    pub execution: ExecutionId,
    /// The attempt the runtime was started for; `None` from legacy components.
    pub attempt: Option<AttemptId>,
    /// The startup generation of the execution that sent it.
    pub generation: Generation,
    /// What happened.
    pub event: RuntimeEvent,
}

/// What a runtime can report.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RuntimeEvent {
    /// The controller process is up.
    BootReady,
    /// The ACP agent answered `initialize`.
    AgentReady {
        /// The agent's `loadSession` capability (`None` when absent).
        load_capability: Option<bool>,
    },
    /// `session/new` succeeded.
    ConversationCreated {
        /// The new conversation.
        token: ConversationToken,
    },
    /// `session/load` succeeded.
    ConversationLoaded,
    /// `session/load` failed; the core classifies it (rule 6).
    LoadFailed(LoadOutcome),
    /// Startup failed before the conversation was ready.
    StartFailed {
        /// The error's identity.
        stamp: ErrorStamp,
    },
    /// The provider accepted the turn's prompt.
    PromptAccepted {
        /// The turn.
        turn: TurnId,
    },
    /// One streamed notification of the turn, numbered by the runtime from 1 per dispatch.
    Stream {
        /// The turn.
        turn: TurnId,
        /// Runtime sequence number within this dispatch.
        seq: u64,
        /// Payload bytes.
        bytes: u32,
    },
    /// The turn ended normally (including a provider-side cancel).
    PromptCompleted {
        /// The turn.
        turn: TurnId,
    },
    /// The provider failed the turn.
    PromptFailed {
        /// The turn.
        turn: TurnId,
        /// The error's identity.
        stamp: ErrorStamp,
    },
    /// The runtime is gone: process exit, transport loss, or notification overflow.
    Exited {
        /// The error's identity.
        stamp: ErrorStamp,
    },
}

impl RuntimeEvent {
    /// A short name for traces.
    pub fn name(&self) -> &'static str {
        match self {
            RuntimeEvent::BootReady => "boot_ready",
            RuntimeEvent::AgentReady { .. } => "agent_ready",
            RuntimeEvent::ConversationCreated { .. } => "conversation_created",
            RuntimeEvent::ConversationLoaded => "conversation_loaded",
            RuntimeEvent::LoadFailed(_) => "load_failed",
            RuntimeEvent::StartFailed { .. } => "start_failed",
            RuntimeEvent::PromptAccepted { .. } => "prompt_accepted",
            RuntimeEvent::Stream { .. } => "stream",
            RuntimeEvent::PromptCompleted { .. } => "prompt_completed",
            RuntimeEvent::PromptFailed { .. } => "prompt_failed",
            RuntimeEvent::Exited { .. } => "exited",
        }
    }

    /// Whether this event reports the runtime (or its startup) failing.
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            RuntimeEvent::StartFailed { .. }
                | RuntimeEvent::Exited { .. }
                | RuntimeEvent::LoadFailed(_)
        )
    }
}

/// The core's answer to one input. Rejections are values a test can match.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Verdict {
    /// Accepted and applied.
    Accepted,
    /// A new attempt started (rule 1).
    Started {
        /// The new attempt.
        attempt: AttemptId,
    },
    /// The caller joins the live attempt and waits at most until `until`.
    Joined {
        /// The live attempt.
        attempt: AttemptId,
        /// When the core gives up waiting for it on the joiner's behalf.
        until: Timestamp,
    },
    /// The session's runtime is already up; nothing to resume.
    AlreadyReady,
    /// The execution's new generation, to stamp on the runtime's callbacks.
    Bound {
        /// The generation.
        generation: Generation,
    },
    /// The turn was claimed; it is dispatched as soon as a runtime is ready.
    Claimed,
    /// Nothing to do (e.g. cancel with nothing running).
    Ignored,
    /// Refused; state untouched (except the cleanup a stale failure calls for).
    Reject(RejectReason),
}

impl Verdict {
    /// Whether this is a rejection.
    pub fn is_reject(&self) -> bool {
        matches!(self, Verdict::Reject(_))
    }
}

/// Why an input was refused, sorted by who is at fault ([`RejectReason::fault`]).
///
/// A rejection is a value, and the state is untouched (except the cleanup a stale failure
/// calls for). Match the reasons you act on; treat the rest by their [`Fault`]:
///
/// - [`Fault::Peer`]: a runtime or a client said something the state does not allow —
///   late, stale, duplicated, out of turn, about something unknown — or the world moved on
///   between an effect and its act (a lease revoked or expired). Normal traffic under the
///   faults the fence exists for: drop it, or tell the client (a busy session).
/// - [`Fault::Embedder`]: the embedder broke the call contract (fed an input while effects
///   were pending, did not drain, bound a stopping execution, performed a lease twice,
///   raised inputs without end). A bug in the embedding: log it loudly and fix the code.
/// - [`Fault::Limit`]: a bound was reached (sessions, an ID counter). Nobody's bug: shed
///   load, or restart (a restore bumps the epoch, which renews the attempt IDs).
///
/// [`Display`](std::fmt::Display) prints the reason's stable kebab-case name
/// ([`RejectReason::name`], e.g. `stale-generation`), the form traces and logs carry.
/// Reasons may be added: match with a wildcard arm. Each keeps its number (the explicit
/// discriminant, which its derived `Hash` feeds in): a new reason takes the next free one,
/// so hashes of recorded traces stay comparable across versions.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RejectReason {
    // ----- the peer's: a runtime's or a client's message the state does not allow -----
    /// The session is not known.
    UnknownSession = 0,
    /// The attempt ID was never minted for this session (another session's, a future one,
    /// or one from before a restart that the snapshot does not vouch for).
    UnknownAttempt = 2,
    /// The attempt ID comes from a later epoch than the core's.
    FutureEpoch = 3,
    /// The attempt was cancelled.
    AttemptCancelled = 4,
    /// The attempt failed.
    AttemptFailed = 5,
    /// The attempt finished but no longer owns the runtime (a later attempt exists).
    AttemptSuperseded = 6,
    /// The attempt's tombstone was evicted; it fails closed.
    AttemptEvicted = 7,
    /// A callback without an attempt ID after the session had an attempt.
    MissingAttempt = 8,
    /// The attempt is not bound to this execution.
    WrongExecution = 9,
    /// The callback's generation is older than the execution's current one.
    StaleGeneration = 10,
    /// The callback's generation was never issued for this execution.
    FutureGeneration = 11,
    /// The execution is not known.
    UnknownExecution = 12,
    /// The execution belongs to another session.
    ForeignExecution = 13,
    /// The event does not fit the attempt's or turn's state.
    UnexpectedEvent = 16,
    /// The turn is not the session's active turn.
    WrongTurn = 17,
    /// The session already has an active turn: report it to the user, retry later.
    SessionBusy = 18,
    /// A turn ID that the session already used.
    DuplicateTurn = 19,
    /// A stream event already delivered.
    DuplicateEvent = 20,
    /// A stream event after a gap.
    SequenceGap = 21,
    /// The lease was revoked: a replacement started, the attempt was cancelled, or the
    /// execution stopped.
    LeaseRevoked = 23,
    /// The lease's deadline passed.
    LeaseExpired = 24,
    /// No stored failure to dismiss.
    NothingToDismiss = 27,

    // ----- the embedder's: the call contract was broken -------------------------------
    /// The execution is being torn down; start another.
    ExecutionStopping = 14,
    /// The attempt is already bound to an execution.
    AlreadyBound = 15,
    /// The lease is not known: performed already, or never issued. (A harness that
    /// confirms leases itself also gets this for a lease whose deadline fired first.)
    UnknownLease = 22,
    /// The embedder did not drain effects.
    EffectQueueFull = 26,
    /// Fed to a [`crate::driver::Driver`] while the effects of an earlier input were still
    /// being carried out; queue it with [`crate::driver::Driver::enqueue`]. Nothing changed.
    Reentrant = 28,
    /// [`crate::driver::Driver::enqueue`] found [`crate::driver::MAX_INBOX`] inputs waiting:
    /// the embedder raises inputs in a loop. Nothing changed.
    InboxFull = 29,

    // ----- a limit: a bound was reached --------------------------------------------------
    /// The session limit is reached.
    TooManySessions = 1,
    /// An ID counter is exhausted.
    CounterExhausted = 25,
}

/// Who is at fault for a rejection (see [`RejectReason`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Fault {
    /// A runtime or a client: normal traffic under faults.
    Peer,
    /// The embedder: a bug in the embedding.
    Embedder,
    /// Nobody: a bound was reached.
    Limit,
}

impl Fault {
    /// `peer`, `embedder` or `limit`.
    pub const fn name(self) -> &'static str {
        match self {
            Fault::Peer => "peer",
            Fault::Embedder => "embedder",
            Fault::Limit => "limit",
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl RejectReason {
    /// Who is at fault.
    pub const fn fault(self) -> Fault {
        use RejectReason as R;
        match self {
            R::UnknownSession
            | R::UnknownAttempt
            | R::FutureEpoch
            | R::AttemptCancelled
            | R::AttemptFailed
            | R::AttemptSuperseded
            | R::AttemptEvicted
            | R::MissingAttempt
            | R::WrongExecution
            | R::StaleGeneration
            | R::FutureGeneration
            | R::UnknownExecution
            | R::ForeignExecution
            | R::UnexpectedEvent
            | R::WrongTurn
            | R::SessionBusy
            | R::DuplicateTurn
            | R::DuplicateEvent
            | R::SequenceGap
            | R::LeaseRevoked
            | R::LeaseExpired
            | R::NothingToDismiss => Fault::Peer,
            R::ExecutionStopping
            | R::AlreadyBound
            | R::UnknownLease
            | R::EffectQueueFull
            | R::Reentrant
            | R::InboxFull => Fault::Embedder,
            R::TooManySessions | R::CounterExhausted => Fault::Limit,
        }
    }

    /// The stable kebab-case name, e.g. `stale-generation`: what
    /// [`Display`](std::fmt::Display) prints.
    pub const fn name(self) -> &'static str {
        use RejectReason as R;
        match self {
            R::UnknownSession => "unknown-session",
            R::UnknownAttempt => "unknown-attempt",
            R::FutureEpoch => "future-epoch",
            R::AttemptCancelled => "attempt-cancelled",
            R::AttemptFailed => "attempt-failed",
            R::AttemptSuperseded => "attempt-superseded",
            R::AttemptEvicted => "attempt-evicted",
            R::MissingAttempt => "missing-attempt",
            R::WrongExecution => "wrong-execution",
            R::StaleGeneration => "stale-generation",
            R::FutureGeneration => "future-generation",
            R::UnknownExecution => "unknown-execution",
            R::ForeignExecution => "foreign-execution",
            R::UnexpectedEvent => "unexpected-event",
            R::WrongTurn => "wrong-turn",
            R::SessionBusy => "session-busy",
            R::DuplicateTurn => "duplicate-turn",
            R::DuplicateEvent => "duplicate-event",
            R::SequenceGap => "sequence-gap",
            R::LeaseRevoked => "lease-revoked",
            R::LeaseExpired => "lease-expired",
            R::NothingToDismiss => "nothing-to-dismiss",
            R::ExecutionStopping => "execution-stopping",
            R::AlreadyBound => "already-bound",
            R::UnknownLease => "unknown-lease",
            R::EffectQueueFull => "effect-queue-full",
            R::Reentrant => "reentrant",
            R::InboxFull => "inbox-full",
            R::TooManySessions => "too-many-sessions",
            R::CounterExhausted => "counter-exhausted",
        }
    }

    /// Every reason, in the order of their numbers.
    pub const ALL: [RejectReason; 30] = {
        use RejectReason as R;
        [
            R::UnknownSession,
            R::TooManySessions,
            R::UnknownAttempt,
            R::FutureEpoch,
            R::AttemptCancelled,
            R::AttemptFailed,
            R::AttemptSuperseded,
            R::AttemptEvicted,
            R::MissingAttempt,
            R::WrongExecution,
            R::StaleGeneration,
            R::FutureGeneration,
            R::UnknownExecution,
            R::ForeignExecution,
            R::ExecutionStopping,
            R::AlreadyBound,
            R::UnexpectedEvent,
            R::WrongTurn,
            R::SessionBusy,
            R::DuplicateTurn,
            R::DuplicateEvent,
            R::SequenceGap,
            R::UnknownLease,
            R::LeaseRevoked,
            R::LeaseExpired,
            R::CounterExhausted,
            R::EffectQueueFull,
            R::NothingToDismiss,
            R::Reentrant,
            R::InboxFull,
        ]
    };
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Something the embedder must do. Drain after every input and timeout.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Effect {
    /// Start (or reuse) a runtime for the attempt, then report [`Input::Bound`].
    StartRuntime {
        /// The session.
        session: SessionId,
        /// The attempt.
        attempt: AttemptId,
        /// The attempt fails if not ready by then.
        deadline: Timestamp,
    },
    /// Send `session/load` for `token` (leased: [`Input::Perform`] first).
    LoadConversation {
        /// The lease.
        lease: LeaseId,
        /// The session.
        session: SessionId,
        /// Target execution.
        execution: ExecutionId,
        /// Target generation.
        generation: Generation,
        /// The conversation to load.
        token: ConversationToken,
    },
    /// Send `session/new` (leased).
    NewConversation {
        /// The lease.
        lease: LeaseId,
        /// The session.
        session: SessionId,
        /// Target execution.
        execution: ExecutionId,
        /// Target generation.
        generation: Generation,
        /// Why a new conversation (a fallback names its proof).
        reason: NewConversationReason,
    },
    /// Send `session/prompt` for the turn (leased).
    DispatchPrompt {
        /// The lease.
        lease: LeaseId,
        /// The session.
        session: SessionId,
        /// Target execution.
        execution: ExecutionId,
        /// Target generation.
        generation: Generation,
        /// The turn.
        turn: TurnId,
        /// The request as the provider must receive it.
        request: PromptRequest,
    },
    /// Send `session/cancel` for the turn; the runtime stays up.
    CancelPrompt {
        /// The session.
        session: SessionId,
        /// The execution running it.
        execution: ExecutionId,
        /// The turn.
        turn: TurnId,
    },
    /// Tear the execution down; report [`Input::Stopped`] when done.
    StopExecution {
        /// The session.
        session: SessionId,
        /// The execution.
        execution: ExecutionId,
        /// When the core stops waiting and asks for a kill.
        deadline: Timestamp,
    },
    /// The teardown missed its deadline: kill the process; the core no longer waits.
    KillExecution {
        /// The session.
        session: SessionId,
        /// The execution.
        execution: ExecutionId,
    },
    /// The attempt settled; answer its joiners.
    AttemptSettled {
        /// The session.
        session: SessionId,
        /// The attempt.
        attempt: AttemptId,
        /// How it ended.
        outcome: AttemptOutcome,
    },
    /// Joiners of this attempt waited past the join deadline: answer them with an error.
    JoinTimedOut {
        /// The session.
        session: SessionId,
        /// The attempt they waited on.
        attempt: AttemptId,
    },
    /// Deliver a stream event to the caller, numbered contiguously per turn from 1.
    Deliver {
        /// The session.
        session: SessionId,
        /// The turn.
        turn: TurnId,
        /// Caller sequence number: contiguous across recoveries.
        seq: u64,
        /// Payload bytes.
        bytes: u32,
    },
    /// The turn ended: exactly one per turn.
    TurnEnded {
        /// The session.
        session: SessionId,
        /// The turn.
        turn: TurnId,
        /// How.
        outcome: TurnOutcome,
    },
    /// Automatic recovery of the turn is scheduled (rule 8).
    RecoveryStarted {
        /// The session.
        session: SessionId,
        /// The turn.
        turn: TurnId,
        /// 1-based index into the schedule.
        step: u32,
        /// When the replacement runtime starts.
        at: Timestamp,
    },
    /// Automatic recovery gave up.
    RecoveryExhausted {
        /// The session.
        session: SessionId,
        /// The turn.
        turn: TurnId,
    },
    /// Show the user this recovery failure (rule 10).
    FailureReported {
        /// The session.
        session: SessionId,
        /// Its identity.
        failure: RecoveryFailure,
    },
    /// The accepted turn's runtime stayed silent (no stream event, no answer) for
    /// [`crate::Config::turn_idle_ms`]: the core gives that runtime up for the turn, as if
    /// it had died. [`Effect::CancelPrompt`] and [`Effect::StopExecution`] for it follow,
    /// then the turn's recovery (or its end). Tell the user why.
    /// (Last, so every earlier variant keeps its discriminant: trace hashes depend on it.)
    TurnSilent {
        /// The session.
        session: SessionId,
        /// The silent runtime.
        execution: ExecutionId,
        /// The turn.
        turn: TurnId,
        /// How long it was silent (the configured idle deadline).
        idle_ms: u64,
    },
}

impl Effect {
    /// A short name for traces.
    pub fn name(&self) -> &'static str {
        match self {
            Effect::StartRuntime { .. } => "start_runtime",
            Effect::LoadConversation { .. } => "load_conversation",
            Effect::NewConversation { .. } => "new_conversation",
            Effect::DispatchPrompt { .. } => "dispatch_prompt",
            Effect::CancelPrompt { .. } => "cancel_prompt",
            Effect::StopExecution { .. } => "stop_execution",
            Effect::KillExecution { .. } => "kill_execution",
            Effect::AttemptSettled { .. } => "attempt_settled",
            Effect::JoinTimedOut { .. } => "join_timed_out",
            Effect::Deliver { .. } => "deliver",
            Effect::TurnEnded { .. } => "turn_ended",
            Effect::RecoveryStarted { .. } => "recovery_started",
            Effect::RecoveryExhausted { .. } => "recovery_exhausted",
            Effect::FailureReported { .. } => "failure_reported",
            Effect::TurnSilent { .. } => "turn_silent",
        }
    }

    /// The lease of a leased effect (`LoadConversation`, `NewConversation`,
    /// `DispatchPrompt`): confirm it with [`Input::Perform`] right before acting.
    pub fn lease(&self) -> Option<LeaseId> {
        match self {
            Effect::LoadConversation { lease, .. }
            | Effect::NewConversation { lease, .. }
            | Effect::DispatchPrompt { lease, .. } => Some(*lease),
            _ => None,
        }
    }

    /// The session the effect is about (every effect concerns exactly one).
    pub fn session(&self) -> SessionId {
        match self {
            Effect::StartRuntime { session, .. }
            | Effect::LoadConversation { session, .. }
            | Effect::NewConversation { session, .. }
            | Effect::DispatchPrompt { session, .. }
            | Effect::CancelPrompt { session, .. }
            | Effect::StopExecution { session, .. }
            | Effect::KillExecution { session, .. }
            | Effect::AttemptSettled { session, .. }
            | Effect::JoinTimedOut { session, .. }
            | Effect::Deliver { session, .. }
            | Effect::TurnEnded { session, .. }
            | Effect::RecoveryStarted { session, .. }
            | Effect::RecoveryExhausted { session, .. }
            | Effect::FailureReported { session, .. }
            | Effect::TurnSilent { session, .. } => *session,
        }
    }
}

/// Why `session/new` is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NewConversationReason {
    /// The session never had a conversation.
    First,
    /// Positive proof that the old conversation cannot be loaded.
    Fallback(ClassifyReason),
}

/// The prompt as the provider receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PromptRequest {
    /// Resume-replay blocks wrapped around the user's text: 0 for a first dispatch,
    /// exactly 1 for a recovery re-prompt.
    pub replay_blocks: u8,
    /// The recovery generation the replay block was built from (0 = none).
    pub replay_generation: u32,
    /// Events the caller already has; the replay block tells the agent to continue after.
    pub delivered_through: u64,
}

/// How an attempt settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AttemptOutcome {
    /// The runtime is ready.
    Ready,
    /// Cancelled by the user.
    Cancelled,
    /// Failed; a [`RecoveryFailure`] was reported.
    Failed,
}

/// How a turn ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TurnOutcome {
    /// The provider completed it.
    Completed,
    /// The provider failed it, or its runtime died and recovery was off or exhausted.
    Failed,
    /// The user cancelled it.
    Cancelled,
    /// No provider acknowledged it: the claim was rolled back; the user may resend. Mostly
    /// it was never written to one (its runtime never started or died first); one whose
    /// runtime died with the previous orchestrator may have been read. A prompt written to
    /// a live provider that did not accept it by its deadline is recovered instead.
    RolledBack,
}

/// The identity of a recovery failure (rule 10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RecoveryFailure {
    /// The attempt that failed.
    pub attempt: AttemptId,
    /// Its execution, if it got one.
    pub execution: Option<ExecutionId>,
    /// The error occurrence.
    pub stamp: ErrorStamp,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each reason keeps its number (hashes of recorded traces depend on it): `ALL` lists
    /// them in number order, without a gap, and every name is distinct kebab-case.
    #[test]
    fn reject_reasons_keep_their_numbers_and_names() {
        for (n, reason) in RejectReason::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, n, "{reason:?}");
            let name = reason.name();
            assert_eq!(reason.to_string(), name);
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{name}"
            );
            assert!(
                RejectReason::ALL[..n].iter().all(|r| r.name() != name),
                "{name} twice"
            );
        }
        assert_eq!(RejectReason::StaleGeneration as u8, 10);
        assert_eq!(RejectReason::Reentrant as u8, 28);
    }

    #[test]
    fn reject_reasons_are_sorted_by_who_is_at_fault() {
        use RejectReason as R;
        assert_eq!(R::StaleGeneration.fault(), Fault::Peer);
        assert_eq!(R::SessionBusy.fault(), Fault::Peer);
        assert_eq!(R::LeaseExpired.fault(), Fault::Peer);
        assert_eq!(R::Reentrant.fault(), Fault::Embedder);
        assert_eq!(R::EffectQueueFull.fault(), Fault::Embedder);
        assert_eq!(R::TooManySessions.fault(), Fault::Limit);
        assert_eq!(R::CounterExhausted.fault().to_string(), "limit");
    }
}
