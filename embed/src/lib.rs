//! `palisade-embed`: the Palisade core in production, against a real ACP agent
//! subprocess over stdio.
//!
//! Two layers:
//!
//! - **The supervisor** ([`Supervisor`], a thin tokio shell around the sans-IO
//!   [`Engine`]): owns a [`palisade_core::Core`] and carries out its effects. It spawns
//!   agent processes, speaks ACP to them, feeds every callback and timer back to the core,
//!   delivers output to the caller losslessly and in order ([`SessionEvent`]), and persists
//!   the core's snapshot atomically after every step that changed it, restoring it (in the
//!   next epoch) on start. `palisade-supervise` is the same thing as a command line tool;
//!   `docs/embedding.md` walks through it.
//! - **The wire**, independent of the core: ACP payloads ([`acp`], on the official
//!   `agent-client-protocol-schema` types), a small JSON-RPC 2.0 framing layer
//!   ([`jsonrpc`]) and an async connection to an agent process ([`rpc`]) whose every
//!   failure is a typed [`RpcFailure`]. The connection owns the agent's whole process
//!   tree ([`process`]): a stop, a kill, a drop, and a watchdog process when the
//!   supervisor itself is SIGKILLed, take down every process the agent started.
//!
//! The crate also ships `palisade-test-agent`, a real ACP agent scripted by arguments,
//! which the integration tests drive.
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
//! use palisade_embed::{acp, AgentCommand, AgentConnection, AgentEvent, ConnectionConfig};
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
//!             AgentEvent::Notification { method, .. } if method == acp::SESSION_UPDATE => {
//!                 chunks += 1
//!             }
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

pub mod acp;
pub mod agent_model;
pub mod config;
pub mod engine;
pub mod events;
pub mod jsonrpc;
mod jsonscan;
pub mod logging;
pub mod platform;
pub mod process;
pub mod replay;
pub mod rpc;
mod sorted_map;
pub mod state;
pub mod supervise;
pub mod supervisor;
pub mod watch;
pub mod wire;

pub use config::{SupervisorConfig, SupervisorConfigError};
pub use engine::{Action, Engine, EngineStats, Op, PromptError};
pub use events::{ConversationOrigin, FailureCause, OutputEvent, SessionEvent};
pub use jsonrpc::{RequestId, RpcError};
pub use platform::{Platform, TokioPlatform};
pub use rpc::{
    AgentCommand, AgentConnection, AgentEvent, AgentEvents, Anomaly, CloseReason, ConnectionConfig,
    ConnectionStats, ProcessExit, RpcFailure, SpawnError, StderrMode,
};
pub use state::{StateError, StateFile, StateFs};
pub use supervisor::{
    Embedding, SessionEvents, StartError, Supervisor, SupervisorError, SupervisorStats,
};
