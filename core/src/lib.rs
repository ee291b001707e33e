//! # palisade-core
//!
//! A sans-IO state machine that decides, for AI-agent sessions whose runtime (an ACP agent
//! process behind a small controller) is resumed, cancelled, crashes and is recovered:
//! which callback may act, which execution may be torn down, when a failed `session/load`
//! may fall back to a new conversation, and how a prompt turn survives a provider exit.
//!
//! It never reads a clock, never does I/O, never spawns, never awaits. Time enters as a
//! [`Timestamp`] argument; effects leave through [`Core::poll_effect`].
//!
//! ## The embed loop
//!
//! ```
//! use palisade_core::*;
//!
//! let mut core = Core::new(Config::default(), Epoch::FIRST).unwrap();
//! let session = SessionId::new(1).unwrap();
//! let turn = TurnId::new(1).unwrap();
//! let mut now = Timestamp::from_millis(0);
//!
//! // A user sends a prompt: the turn is claimed and a runtime is started for it.
//! assert_eq!(core.handle(now, Input::Prompt { session, turn }), Verdict::Claimed);
//! let mut provider_got_prompt = false;
//! let mut ended = None;
//! // Drive until the turn ends: carry out each effect, feed back what the runtime says.
//! for _ in 0..32 {
//!     while let Some(effect) = core.poll_effect() {
//!         let execution = ExecutionId::new(7).unwrap();
//!         match effect {
//!             Effect::StartRuntime { session, attempt, .. } => {
//!                 // Spawn the agent; tell the core which execution it got.
//!                 let Verdict::Bound { generation } =
//!                     core.handle(now, Input::Bound { session, attempt, execution }) else { panic!() };
//!                 let cb = |event| Input::Callback(Callback {
//!                     session, execution, attempt: Some(attempt), generation, event,
//!                 });
//!                 let _ = core.handle(now, cb(RuntimeEvent::BootReady));
//!                 let _ = core.handle(now, cb(RuntimeEvent::AgentReady { load_capability: Some(true) }));
//!             }
//!             Effect::NewConversation { lease, session, execution, generation, .. } => {
//!                 // Ask right before acting: a replacement may have started meanwhile.
//!                 assert_eq!(core.handle(now, Input::Perform { lease }), Verdict::Accepted);
//!                 let attempt = core.live_attempt(session);
//!                 let token = ConversationToken::new(42).unwrap();
//!                 let _ = core.handle(now, Input::Callback(Callback {
//!                     session, execution, attempt, generation,
//!                     event: RuntimeEvent::ConversationCreated { token },
//!                 }));
//!             }
//!             Effect::DispatchPrompt { lease, session, execution, generation, turn, request } => {
//!                 assert_eq!(core.handle(now, Input::Perform { lease }), Verdict::Accepted);
//!                 assert_eq!(request.replay_blocks, 0);
//!                 provider_got_prompt = true;
//!                 let attempt = core.live_attempt(session);
//!                 let cb = |attempt, event| Input::Callback(Callback {
//!                     session, execution, attempt, generation, event,
//!                 });
//!                 let _ = core.handle(now, cb(attempt, RuntimeEvent::PromptAccepted { turn }));
//!                 // The attempt finished on acceptance; it now owns the runtime.
//!                 let _ = core.handle(now, cb(attempt, RuntimeEvent::Stream { turn, seq: 1, bytes: 5 }));
//!                 let _ = core.handle(now, cb(attempt, RuntimeEvent::PromptCompleted { turn }));
//!             }
//!             Effect::TurnEnded { outcome, .. } => ended = Some(outcome),
//!             _ => {}
//!         }
//!     }
//!     if ended.is_some() { break; }
//!     // Sleep until the next deadline, then let the core act on it.
//!     if let Some(t) = core.poll_timeout() { now = t; core.handle_timeout(now); }
//! }
//! assert!(provider_got_prompt);
//! assert_eq!(ended, Some(TurnOutcome::Completed));
//! core.check_invariants().unwrap();
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod attempt;
#[cfg(feature = "audit")]
pub mod audit;
pub mod classify;
mod cleanup;
mod config;
mod core;
pub mod delivery;
pub mod driver;
mod failure;
mod idmap;
mod ids;
mod invariants;
mod io;
mod lease;
pub mod mutants;
mod snapshot;
pub mod time;
mod timers;
mod turn;

pub use crate::config::{
    Config, ConfigError, GENERATIONS_PER_EXECUTION, MAX_PENDING_EFFECTS, MAX_RECOVERY_DELAY_MS,
    MAX_RECOVERY_SCHEDULE_MS, MAX_RECOVERY_STEPS, TOMBSTONES_PER_SESSION,
};
pub use crate::core::Core;
pub use crate::ids::{
    AttemptId, ConversationToken, Epoch, ErrorStamp, ExecutionId, Generation, LeaseId, SessionId,
    TurnId, MAX_ATTEMPT_SEQ, MAX_EPOCH,
};
pub use crate::invariants::InvariantViolation;
pub use crate::io::{
    AttemptOutcome, Callback, Effect, Input, NewConversationReason, PromptRequest, RecoveryFailure,
    RejectReason, RuntimeEvent, TurnOutcome, Verdict,
};
pub use crate::snapshot::{KnownExecution, RestoreError, MAX_RESTORED_TURN_EVENTS};
pub use crate::time::Timestamp;
