//! `palisade-embed`: the tokio shell that runs Palisade in production, against real ACP
//! agent subprocesses over stdio.
//!
//! The logic lives below this crate, without I/O: the fence (`palisade-core`), the
//! orchestrator around it ([`palisade_engine::Engine`]) and the ACP wire
//! (`palisade-wire`). This crate only carries out what the engine decides:
//!
//! - **The supervisor** ([`Supervisor`]): owns the engine, the clock, the state file
//!   ([`state_file`]) and the caller's channels. It spawns agent processes, feeds every
//!   agent event, answer, exit and timer back to the engine, hands output to the caller
//!   losslessly and in order ([`SessionEvent`]), and persists the engine's state image
//!   atomically after every step that changed it, restoring it (in the next epoch) on
//!   start. `palisade-supervise` is the same thing as a command line tool
//!   ([`supervise`]); `docs/embedding.md` walks through it.
//! - **The connection** ([`rpc`]): an async connection to one agent process whose every
//!   failure is a typed [`RpcFailure`]. It owns the agent's whole process tree
//!   ([`process`]): a stop, a kill, a drop, and a watchdog process when the supervisor
//!   itself is SIGKILLed, take down every process the agent started.
//! - **The seams** ([`platform`]): time, tasks, blocking jobs and agent processes. Production
//!   fills them with [`TokioPlatform`]; the simulator fills them with simulated ones and
//!   runs this very code.
//!
//! A prompt turn under supervision:
//!
//! ```no_run
//! use palisade_core::SessionId;
//! use palisade_embed::{AgentCommand, SessionEvent, Supervisor, SupervisorConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let agent = AgentCommand::new("my-acp-agent");
//! let (supervisor, mut events) =
//!     Supervisor::start(SupervisorConfig::default(), agent, Some("state.bin".into()))?;
//! let session = SessionId::new(1).unwrap();
//! let turn = supervisor.prompt(session, "hello").await?;
//! while let Some(event) = events.recv().await {
//!     if let SessionEvent::TurnEnded { turn: ended, outcome, .. } = &event {
//!         if *ended == turn {
//!             println!("turn ended: {outcome:?}");
//!             break;
//!         }
//!     }
//! }
//! supervisor.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! The connection alone, without the core: a prompt turn, end to end. Note the second
//! task: it drains the events while the first awaits the answer, as [`rpc`]'s
//! backpressure requires.
//!
//! ```no_run
//! use std::time::Duration;
//! use palisade_embed::{AgentCommand, AgentConnection, AgentEvent, ConnectionConfig};
//! use palisade_wire::acp;
//! use tokio::time::Instant;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let command = AgentCommand::new("my-acp-agent").arg("--stdio");
//! let (conn, mut events) = AgentConnection::spawn(&command, ConnectionConfig::default())?;
//! let deadline = || Instant::now() + Duration::from_secs(30);
//!
//! let drain = tokio::spawn(async move {
//!     let mut chunks = 0u64;
//!     while let Some(event) = events.recv().await {
//!         match event {
//!             AgentEvent::Update { .. } => chunks += 1,
//!             AgentEvent::Closed(_) => break,
//!             _ => {}
//!         }
//!     }
//!     chunks
//! });
//!
//! let init = conn
//!     .request(acp::INITIALIZE, acp::initialize_params("my-service", "1.0"), deadline())
//!     .await?;
//! let _can_load = acp::load_session_support(&init);
//! let session = conn
//!     .request(acp::SESSION_NEW, acp::new_session_params("/tmp"), deadline())
//!     .await?;
//! let session_id = session["sessionId"].as_str().unwrap_or_default().to_owned();
//! let answer = conn
//!     .request(acp::SESSION_PROMPT, acp::prompt_params(&session_id, "hello"), deadline())
//!     .await?;
//! assert_eq!(answer["stopReason"], "end_turn");
//!
//! conn.kill_and_reap(deadline()).await;
//! let _updates = drain.await?;
//! # Ok(())
//! # }
//! ```

pub mod cli;
pub mod config;
pub mod logging;
pub mod platform;
pub mod process;
pub mod proxy;
pub mod rpc;
pub mod state_file;
pub mod supervise;
pub mod supervisor;
pub mod tokio_platform;
pub mod watch;

pub use config::{SupervisorConfig, SupervisorConfigError};
pub use palisade_engine::{
    ConversationOrigin, Engine, EngineConfig, FailureCause, OutputEvent, PromptError, SessionEvent,
};
pub use platform::{AgentCommand, Platform, SpawnError, StderrMode};
pub use rpc::{
    AgentConnection, AgentEvent, AgentEvents, Anomaly, CloseReason, ConnectionConfig,
    ConnectionStats, PendingRequest, ProcessExit, RpcFailure,
};
pub use state_file::{StateError, StateFile, StateFs, StateLock};
pub use supervisor::{
    Embedding, SessionEvents, StartError, Supervisor, SupervisorError, SupervisorStats,
};
pub use tokio_platform::TokioPlatform;
