//! # palisade-core
//!
//! A sans-IO state machine that decides, for AI-agent sessions whose runtime (an ACP agent
//! process behind a small controller) is resumed, cancelled, crashes and is recovered:
//! which callback may act, which execution may be torn down, when a failed `session/load`
//! may fall back to a new conversation, and how a prompt turn survives a provider exit.
//!
//! It never reads a clock, never does I/O, never spawns, never awaits. Time enters as a
//! [`Timestamp`] argument; what the embedder must do leaves as [`Effect`]s.
//!
//! ## The front door
//!
//! Embed the core through a [`driver::Driver`]: feed an input with
//! [`Driver::handle`](driver::Driver::handle) when the driver is idle, then drain
//! [`Driver::poll_output`](driver::Driver::poll_output) until it returns a timeout (sleep
//! until then, or until the next input) or idle. Carry out each effect as it comes; an
//! input raised while doing so (the runtime's report, a callback) goes in with
//! [`Driver::enqueue`](driver::Driver::enqueue), and its verdict comes back as an output.
//! The driver confirms a leased effect's lease in the call that hands the effect out (rule
//! 4), so what it hands out is still current. A rejection is a value: [`RejectReason`]
//! says why, and [`RejectReason::fault`] whose fault it is (a peer's stale or late message
//! is normal traffic; an embedder's is a bug).
//!
//! ```
//! use palisade_core::driver::{Driver, Output};
//! use palisade_core::*;
//!
//! let mut driver = Driver::new(Core::new(Config::default(), Epoch::FIRST).unwrap());
//! let (session, turn) = (SessionId::new(1).unwrap(), TurnId::new(1).unwrap());
//! let mut now = Timestamp::from_millis(0);
//! // The runtime the embedder started: its execution, the attempt it serves, and the
//! // generation its callbacks carry (the bind's verdict).
//! let mut starting = None;
//! let mut runtime = None;
//! let callback = |(execution, attempt, generation), event| {
//!     Input::Callback(Callback { session, execution, attempt: Some(attempt), generation, event })
//! };
//! let (mut delivered, mut ended) = (0, None);
//!
//! // A user sends a prompt: the turn is claimed, and a runtime is started for it.
//! assert_eq!(driver.handle(now, Input::Prompt { session, turn }), Verdict::Claimed);
//! while ended.is_none() {
//!     match driver.poll_output(now) {
//!         Output::Effect(Effect::StartRuntime { session, attempt, .. }) => {
//!             // Spawn the agent, then report which execution it got: an input raised while
//!             // carrying out an effect waits in the driver's inbox.
//!             let execution = ExecutionId::new(7).unwrap();
//!             starting = Some((execution, attempt));
//!             driver.enqueue(Input::Bound { session, attempt, execution }).unwrap();
//!         }
//!         Output::Verdict { verdict: Verdict::Bound { generation }, .. } => {
//!             // The bind's verdict comes back as an output: the runtime is up.
//!             let (execution, attempt) = starting.take().unwrap();
//!             let up = (execution, attempt, generation);
//!             runtime = Some(up);
//!             driver.enqueue(callback(up, RuntimeEvent::BootReady)).unwrap();
//!             let ready = RuntimeEvent::AgentReady { load_capability: Some(true) };
//!             driver.enqueue(callback(up, ready)).unwrap();
//!         }
//!         Output::Verdict { verdict, .. } => assert!(!verdict.is_reject(), "{verdict:?}"),
//!         Output::Effect(Effect::NewConversation { .. }) => {
//!             // Its lease was confirmed as it was handed out: send `session/new` now.
//!             let token = ConversationToken::new(42).unwrap();
//!             let created = RuntimeEvent::ConversationCreated { token };
//!             driver.enqueue(callback(runtime.unwrap(), created)).unwrap();
//!         }
//!         Output::Effect(Effect::DispatchPrompt { turn, request, .. }) => {
//!             // Send `session/prompt`; the provider accepts it, streams, completes.
//!             assert_eq!(request.replay_blocks, 0);
//!             for event in [
//!                 RuntimeEvent::PromptAccepted { turn },
//!                 RuntimeEvent::Stream { turn, seq: 1, bytes: 5 },
//!                 RuntimeEvent::PromptCompleted { turn },
//!             ] {
//!                 driver.enqueue(callback(runtime.unwrap(), event)).unwrap();
//!             }
//!         }
//!         Output::Effect(Effect::Deliver { seq, .. }) => delivered = seq,
//!         Output::Effect(Effect::TurnEnded { outcome, .. }) => ended = Some(outcome),
//!         Output::Effect(_) => {}
//!         // Sleep until the deadline (or the next input), then let the core act on it.
//!         Output::Timeout(at) => {
//!             now = at;
//!             driver.handle_timeout(now);
//!         }
//!         Output::Idle => break,
//!     }
//! }
//! assert_eq!((delivered, ended), (1, Some(TurnOutcome::Completed)));
//! driver.core().check_invariants().unwrap();
//! ```
//!
//! [`Core`] itself (`handle`, `poll_effect`, `poll_timeout`, `handle_timeout`) is the
//! state machine the driver wraps, for harnesses that need to reach between an effect and
//! its act; production code goes through the driver. Persist
//! [`Core::snapshot`] while the driver is idle, and come back with [`Core::restore`] and
//! [`Driver::restored`](driver::Driver::restored).
//!
//! ## The fence and its toolkit
//!
//! The fence is [`Core`]: each of its rules (the README's table) decides in the file named
//! after it (`attempt.rs` rules 1–3, `lease.rs` 4, `cleanup.rs` 5, [`classify`] 6,
//! `turn.rs` 7 and 8, `failure.rs` 10), over records that hold no decisions (`session.rs`,
//! `ring.rs`, `execution.rs`), and `core.rs` routes each input and timer to its rule. Rule 9
//! is the embedder's to keep: [`delivery`] is its toolkit (a queue that pushes back instead
//! of dropping, a coalescer, an in-order receiver), which `Core` does not use.
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
mod execution;
mod failure;
mod idmap;
mod ids;
mod invariants;
mod io;
mod lease;
pub mod mutants;
mod ring;
mod session;
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
    AttemptOutcome, Callback, Effect, Fault, Input, NewConversationReason, PromptRequest,
    RecoveryFailure, RejectReason, RuntimeEvent, TurnOutcome, Verdict,
};
pub use crate::snapshot::{KnownExecution, RestoreError, MAX_RESTORED_TURN_EVENTS};
pub use crate::time::Timestamp;
