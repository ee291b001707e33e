//! `palisade-engine`: the orchestrator's logic without I/O — a [`palisade_core::Core`]
//! plus everything the core leaves to its embedder: ACP session ids, prompt texts, the
//! requests in flight and their answers, lossless delivery of each turn's output to the
//! caller, and the state image that survives a restart.
//!
//! The [`Engine`] never spawns, awaits or reads a clock. A shell feeds it what happened
//! (a caller's command, an agent's line, a request's answer, a process reaped, a timer)
//! and carries out what it asks for ([`Action`]). The tokio shell is `palisade-embed`;
//! the simulator (`palisade-sim`) drives this same engine in simulated time.
//!
//! Modules, from the top: [`engine`] (the state machine), [`events`] (what the caller is
//! told), [`state`] (the state image), [`config`] (its knobs), [`replay`] (the
//! resume-replay block of a recovery re-prompt).

pub mod config;
pub mod engine;
pub mod events;
pub mod proxy;
pub mod replay;
mod sorted_map;
pub mod state;

pub use config::{ClientSide, EngineConfig, EngineConfigError, DEFAULT_TURN_IDLE_MS};
pub use engine::{
    Action, Engine, EngineStats, ForwardError, Op, Output, PromptError, SessionSetup, StateImage,
    MAX_OPEN_CLIENT_REQUESTS,
};
pub use events::{ConversationOrigin, FailureCause, OutputEvent, PromptContent, SessionEvent};
pub use state::StateError;
