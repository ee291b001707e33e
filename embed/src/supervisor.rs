//! The tokio shell around the [`Engine`]: it owns the agent processes and their
//! connections, the clock, the state file and the caller's channels, and carries out what
//! the engine decides.
//!
//! One shell task owns the engine and drains its one output ([`Output`]): it carries out
//! actions, hands events to the caller while its channel has room, and writes the state
//! when asked. Each agent process has a *pump* task that owns its event stream and its
//! in-flight requests, and forwards both into the shell's bounded inbox in wire order: an
//! answer is forwarded only after every notification the agent wrote before it (so a
//! turn's last output is never taken for the next turn's, nor dropped after its end).
//!
//! **Group commit.** A write of the state runs on a blocking thread while the shell goes on
//! taking commands and agent messages (up to [`STEP_MESSAGES`] at a time); nothing they
//! cause leaves the process before a write covering it is durable (write-ahead), and the
//! next write covers all of them. A burst of notifications costs one write per fsync's
//! worth of time, not one per notification. The state file is written with temp + fsync +
//! rename + fsync-dir.
//!
//! Backpressure, end to end: a caller that does not drain [`SessionEvents`] fills the
//! per-session delivery queues; then the driver stops reading its inbox, the pumps stop
//! reading their agents, the agents' stdout pipes fill and the agents block. Nothing is
//! dropped and no connection is closed. (While the driver does not read its inbox, answers
//! wait too; the core's deadlines keep running, so a caller must drain its events.)

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade_core::driver::Observer;
use palisade_core::{Config, Epoch, Input, SessionId, Timestamp, TurnId, Verdict};
use palisade_engine::state::{self, StateError, BODY_OFFSET};
use palisade_engine::{
    Action, Engine, EngineStats, ForwardError, Op, Output, PromptContent, PromptError,
    SessionEvent, SessionSetup,
};
use palisade_wire::RawJson;
use palisade_wire::RpcError;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::config::{SupervisorConfig, SupervisorConfigError};
use crate::platform::{timeout_at, AgentCommand, Platform, Task};
use crate::rpc::{
    AgentConnection, AgentEvent, AgentEvents, PendingRequest, ProcessExit, RpcFailure,
};
use crate::state_file::{StateFile, StateLock};
use crate::tokio_platform::TokioPlatform;

/// Inbox messages taken in one go before the shell looks at its engine's output again.
pub const STEP_MESSAGES: usize = 64;
/// Capacity of the driver's inbox (all pumps share it). A full inbox blocks the pumps,
/// which then stop reading their agents: backpressure.
pub const INBOX_CAPACITY: usize = 256;
/// Requests queued to one pump. ACP keeps at most a few requests in flight per agent
/// (initialize, load/new, a prompt); more means the pump is stuck, and the request fails.
pub const PUMP_REQUESTS: usize = 16;
/// Caller commands queued to the driver.
pub const COMMAND_CAPACITY: usize = 64;
/// How long a SIGKILLed process may take to be reaped. Milliseconds normally; ten
/// seconds covers a loaded machine.
pub const REAP_WITHIN: Duration = Duration::from_secs(10);
/// How long a shutdown waits for the caller to take the output still queued for it.
pub const SHUTDOWN_FLUSH_WITHIN: Duration = Duration::from_secs(1);
/// The furthest a deadline is mapped into the future (keeps `Instant` arithmetic total).
const FURTHEST: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Why a supervisor could not start.
#[derive(Debug)]
pub enum StartError {
    /// The configuration was refused.
    Config(SupervisorConfigError),
    /// The state file exists but cannot be restored. The supervisor refuses to start
    /// fresh over it (a fresh epoch could reuse attempt IDs).
    State(StateError),
    /// The restored state (with its new epoch) could not be persisted.
    Persist(io::Error),
    /// The state file's lock could not be taken: another supervisor holds it (kind
    /// `WouldBlock`), or the state path is unusable. Nothing was read or written.
    Lock(io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(error) => write!(f, "bad configuration: {error}"),
            StartError::State(error) => write!(f, "cannot restore: {error}"),
            StartError::Persist(error) => write!(f, "cannot write the state file: {error}"),
            StartError::Lock(error) if error.kind() == io::ErrorKind::WouldBlock => {
                write!(f, "the state file is busy: {error}")
            }
            StartError::Lock(error) => write!(f, "unusable state file: {error}"),
        }
    }
}

impl std::error::Error for StartError {}

/// Why a supervisor call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SupervisorError {
    /// The supervisor was shut down.
    Stopped,
    /// The prompt was not claimed.
    Prompt(PromptError),
}

impl std::fmt::Display for SupervisorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SupervisorError::Stopped => f.write_str("the supervisor was shut down"),
            SupervisorError::Prompt(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for SupervisorError {}

/// Counters of a running supervisor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SupervisorStats {
    /// The engine's counters.
    pub engine: EngineStats,
    /// State files written.
    pub persists: u64,
    /// State file writes that failed (the next change retries).
    pub persist_failures: u64,
    /// Agent processes not yet reaped.
    pub runtimes: usize,
    /// Events dropped because the caller dropped its [`SessionEvents`].
    pub events_dropped: u64,
    /// Output admitted but still in the delivery queues and coalescers.
    pub outputs_queued: usize,
    /// Events waiting for room in the caller's channel.
    pub events_waiting: usize,
    /// Whether the supervisor reads from its agents now (false: backpressure).
    pub reading: bool,
}

/// The caller's end of the event channel: every [`SessionEvent`], in order per session.
/// Drain it: a full channel pushes back on the agents.
#[derive(Debug)]
pub struct SessionEvents {
    receiver: mpsc::Receiver<SessionEvent>,
    /// Events the caller is done with, counted for the driver (see [`SessionEvents::done`]).
    done: Arc<AtomicU64>,
    /// The last event received is not yet counted done.
    holding: bool,
    /// The last event received by [`SessionEvents::recv_held`], kept until it is done.
    held: Option<SessionEvent>,
}

impl SessionEvents {
    /// The next event; `None` once the supervisor is gone. Asking for it says the caller
    /// is done with the one before ([`SessionEvents::done`]).
    pub async fn recv(&mut self) -> Option<SessionEvent> {
        self.done();
        let event = self.receiver.recv().await;
        self.holding = event.is_some();
        event
    }

    /// The next event if one is queued right now (done with the one before, as
    /// [`SessionEvents::recv`]).
    pub fn try_recv(&mut self) -> Option<SessionEvent> {
        self.done();
        let event = self.receiver.try_recv().ok();
        self.holding = event.is_some();
        event
    }

    /// The next event, kept here until the caller says it is done with it
    /// ([`SessionEvents::done`]); `None` once the supervisor is gone. Asking for it says
    /// the caller is done with the one before. A caller whose write of it may be abandoned
    /// midway (a signal stops it) finds it again in [`SessionEvents::held`] and writes it
    /// first: the events after it must not be counted done in its place (the count is
    /// positional), nor it dropped unwritten.
    pub async fn recv_held(&mut self) -> Option<&SessionEvent> {
        self.done();
        let event = self.receiver.recv().await;
        self.holding = event.is_some();
        self.held = event;
        self.held.as_ref()
    }

    /// The event [`SessionEvents::recv_held`] gave and the caller is not yet done with.
    #[must_use]
    pub fn held(&self) -> Option<&SessionEvent> {
        self.held.as_ref().filter(|_| self.holding)
    }

    /// The caller is done with the event it received last (it wrote it where it goes).
    /// Until then the state file lists it undelivered, so a supervisor that crashes
    /// before hands it out again after its restart: at least once, never lost.
    pub fn done(&mut self) {
        self.held = None;
        if std::mem::take(&mut self.holding) {
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

/// Where a prompt's answer goes.
type PromptReply = oneshot::Sender<Result<TurnId, PromptError>>;

enum Command {
    Prompt {
        session: SessionId,
        text: String,
        reply: oneshot::Sender<Result<TurnId, PromptError>>,
    },
    Cancel {
        session: SessionId,
        reply: oneshot::Sender<Verdict>,
    },
    Resume {
        session: SessionId,
        reply: oneshot::Sender<Verdict>,
    },
    Feed {
        input: Input,
        reply: oneshot::Sender<Verdict>,
    },
    Conversation {
        session: SessionId,
        reply: oneshot::Sender<Option<String>>,
    },
    Stats {
        reply: oneshot::Sender<SupervisorStats>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
    /// What a client behind the caller asks (`palisade-proxy`).
    Client(ClientCommand),
}

/// The commands of a caller with an ACP client behind it (see
/// [`ClientSide`](palisade_engine::ClientSide)).
enum ClientCommand {
    Hello(RawJson),
    Auth(RawJson),
    Open {
        session: SessionId,
        setup: SessionSetup,
        reply: oneshot::Sender<Verdict>,
    },
    Prompt {
        session: SessionId,
        content: PromptContent,
        reply: PromptReply,
    },
    Forward {
        session: SessionId,
        method: String,
        params: RawJson,
        reply: oneshot::Sender<Result<u64, ForwardError>>,
    },
    Answer {
        ticket: u64,
        outcome: Result<RawJson, RpcError>,
        reply: oneshot::Sender<bool>,
    },
    Sessions {
        reply: oneshot::Sender<Vec<(SessionId, SessionSetup)>>,
    },
}

/// A hook run on a supervisor's engine before it starts (see [`Embedding::setup`]).
pub type EngineSetup = Box<dyn FnOnce(&mut Engine) + Send>;

/// What a supervisor runs on besides its configuration and its agent: the
/// [`Platform`] (clock, tasks, processes), the state file, and hooks for tests and the
/// simulator. [`Supervisor::start`] uses [`Embedding::tokio`].
pub struct Embedding {
    /// Clock, tasks, blocking I/O and agent processes.
    pub platform: Arc<dyn Platform>,
    /// Where the state is persisted (and restored from); `None`: nothing survives a
    /// restart.
    pub state: Option<StateFile>,
    /// Watches every core step of the engine, from the first (a restore's own included).
    pub observer: Option<Box<dyn Observer + Send>>,
    /// Runs on the engine once it exists, before anything else: on a restored engine,
    /// before the restore's own work (the simulator switches a mutant on here).
    pub setup: Option<EngineSetup>,
}

impl Embedding {
    /// Production: tokio, real processes, the state file at `state` on the real filesystem.
    #[must_use]
    pub fn tokio(state: Option<PathBuf>) -> Embedding {
        Embedding {
            platform: Arc::new(TokioPlatform),
            state: state.map(StateFile::real),
            observer: None,
            setup: None,
        }
    }
}

impl std::fmt::Debug for Embedding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedding")
            .field("platform", &self.platform)
            .field("state", &self.state)
            .field("observer", &self.observer.is_some())
            .field("setup", &self.setup.is_some())
            .finish()
    }
}

/// A handle to a running supervisor: the core's recovery around ACP agent processes.
/// Cheap to clone; when the last handle is dropped the supervisor shuts down as
/// [`Supervisor::shutdown`] does.
///
/// ```no_run
/// use palisade_core::SessionId;
/// use palisade_embed::{AgentCommand, SessionEvent, Supervisor, SupervisorConfig};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let agent = AgentCommand::new("my-acp-agent");
/// let state = Some("/var/lib/my-service/palisade.state".into());
/// let (supervisor, mut events) = Supervisor::start(SupervisorConfig::default(), agent, state)?;
/// let session = SessionId::new(1).unwrap();
/// let turn = supervisor.prompt(session, "hello").await?;
/// while let Some(event) = events.recv().await {
///     println!("{}", event.to_json());
///     if matches!(event, SessionEvent::TurnEnded { turn: t, .. } if t == turn) {
///         break;
///     }
/// }
/// supervisor.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Supervisor {
    commands: mpsc::Sender<Command>,
    epoch: Epoch,
    core_config: Config,
    in_flight: Vec<(SessionId, TurnId)>,
    fatal: Arc<std::sync::Mutex<Option<String>>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Command::Prompt { .. } => "Prompt",
            Command::Cancel { .. } => "Cancel",
            Command::Resume { .. } => "Resume",
            Command::Feed { .. } => "Feed",
            Command::Conversation { .. } => "Conversation",
            Command::Stats { .. } => "Stats",
            Command::Shutdown { .. } => "Shutdown",
            Command::Close { .. } => "Close",
            Command::Client(_) => "Client",
        };
        f.write_str(name)
    }
}

impl Supervisor {
    /// Starts a supervisor that runs `agent` for every runtime the core asks for. Must be
    /// called inside a tokio runtime.
    ///
    /// With a `state_path`, the state is persisted after every step that changed it; if the
    /// file exists, the supervisor restores it (the core comes back in the next epoch; the
    /// runtimes of the previous incarnation are reported exited, and turns they carried
    /// are recovered by the core's rules) and persists the new epoch before doing anything
    /// else. Without one, nothing survives a restart.
    pub fn start(
        config: SupervisorConfig,
        agent: AgentCommand,
        state_path: Option<PathBuf>,
    ) -> Result<(Supervisor, SessionEvents), StartError> {
        Supervisor::start_on(Embedding::tokio(state_path), config, agent)
    }

    /// [`Supervisor::start`] on `embedding`'s platform and state file. Must be called
    /// inside the platform's runtime.
    pub fn start_on(
        embedding: Embedding,
        config: SupervisorConfig,
        agent: AgentCommand,
    ) -> Result<(Supervisor, SessionEvents), StartError> {
        let Embedding {
            platform,
            state: state_file,
            observer,
            setup,
        } = embedding;
        config.validate().map_err(StartError::Config)?;
        // Held for the supervisor's life: another supervisor on the same file would take
        // over this one's turns and rename its writes away.
        let lock = match &state_file {
            Some(file) => Some(file.lock().map_err(StartError::Lock)?),
            None => None,
        };
        let existing = match &state_file {
            Some(file) => file.read().map_err(StartError::State)?,
            None => None,
        };
        let connection = config.connection.clone();
        let event_capacity = config.event_capacity;
        // With a state file, nothing leaves before the state that caused it is durable.
        let mut config = config;
        config.engine.persistence = state_file.is_some();
        // The setup hook runs on the engine before anything else, a restore's own work
        // included.
        let (clock, mut engine) = match existing {
            Some(bytes) => {
                let saved_at_ms = state::saved_at_ms(&bytes).map_err(StartError::State)?;
                let clock = Clock::resume(Arc::clone(&platform), saved_at_ms);
                let engine = Engine::restore_prepared(
                    config.engine,
                    &bytes,
                    clock.now(),
                    observer,
                    |engine| {
                        if let Some(setup) = setup {
                            setup(engine);
                        }
                    },
                )
                .map_err(StartError::State)?;
                (clock, engine)
            }
            None => {
                let mut engine = Engine::new(config.engine)
                    .map_err(|error| StartError::Config(SupervisorConfigError::Engine(error)))?;
                if let Some(observer) = observer {
                    engine.set_observer(observer);
                }
                if let Some(setup) = setup {
                    setup(&mut engine);
                }
                (Clock::resume(Arc::clone(&platform), 0), engine)
            }
        };
        let mut store = state_file.zip(lock).map(|(file, lock)| Store {
            file,
            last: Arc::new(Vec::new()),
            _lock: lock,
        });
        if let Some(store) = store.as_mut() {
            // The new epoch is durable before any attempt of it exists.
            let image = engine.state_image(clock.now());
            store
                .file
                .write(&image.bytes)
                .map_err(StartError::Persist)?;
            store.last = Arc::new(image.bytes);
            engine.persisted(image.version);
        }

        let epoch = engine.epoch();
        let core_config = engine.config().core.clone();
        let in_flight = engine.turns_in_flight();
        let fatal = Arc::new(std::sync::Mutex::new(None));
        let (command_tx, command_rx) = mpsc::channel(COMMAND_CAPACITY);
        let (inbox_tx, inbox_rx) = mpsc::channel(INBOX_CAPACITY);
        let (event_tx, event_rx) = mpsc::channel(event_capacity);
        let done = Arc::new(AtomicU64::new(0));
        let shell = Shell {
            platform: Arc::clone(&platform),
            engine,
            clock,
            agent,
            connection,
            store,
            commands: command_rx,
            inbox_tx,
            inbox: inbox_rx,
            events: event_tx,
            done: Arc::clone(&done),
            acknowledged: 0,
            caller_gone: false,
            handles: BTreeMap::new(),
            stats: SupervisorStats::default(),
            replies: Vec::new(),
            writing: None,
            fatal: Arc::clone(&fatal),
        };
        // Detached: the shell ends when every handle is gone or on shutdown.
        let _ = platform.spawn(Box::pin(shell.run()));
        Ok((
            Supervisor {
                commands: command_tx,
                epoch,
                core_config,
                in_flight,
                fatal,
            },
            SessionEvents {
                receiver: event_rx,
                done,
                holding: false,
                held: None,
            },
        ))
    }

    /// The core's epoch: 1 for a fresh state, bumped by every restore.
    #[must_use]
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The core configuration in force (after a restore, the snapshot's).
    #[must_use]
    pub fn core_config(&self) -> &Config {
        &self.core_config
    }

    /// The turns the restored state had in flight when this supervisor started (empty for
    /// a fresh state): the core recovers them, and each ends with a `TurnEnded` on
    /// [`SessionEvents`]. A caller waits for them as for its own.
    #[must_use]
    pub fn restored_turns(&self) -> &[(SessionId, TurnId)] {
        &self.in_flight
    }

    /// Why the supervisor stopped on its own, if it did: the state file could not be
    /// written. It then stops every agent and ends [`SessionEvents`]; nothing of the step
    /// whose state was not written left the process (write-ahead), so a supervisor
    /// started again from the file resumes from the last state written.
    #[must_use]
    pub fn fatal_error(&self) -> Option<String> {
        self.fatal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, SupervisorError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(make(reply))
            .await
            .map_err(|_| SupervisorError::Stopped)?;
        answer.await.map_err(|_| SupervisorError::Stopped)
    }

    /// Submits a prompt for `session`: the core claims a turn and dispatches it once a
    /// runtime is ready (starting one if needed). Its output and its one `TurnEnded`
    /// arrive on [`SessionEvents`].
    pub async fn prompt(
        &self,
        session: SessionId,
        text: impl Into<String>,
    ) -> Result<TurnId, SupervisorError> {
        let text = text.into();
        self.call(|reply| Command::Prompt {
            session,
            text,
            reply,
        })
        .await?
        .map_err(SupervisorError::Prompt)
    }

    /// Cancels the session's starting attempt and its turn (rule 5: a runtime whose
    /// prompt the agent accepted is asked to cancel, not torn down).
    pub async fn cancel(&self, session: SessionId) -> Result<Verdict, SupervisorError> {
        self.call(|reply| Command::Cancel { session, reply }).await
    }

    /// Starts (or joins) the session's runtime without a prompt.
    pub async fn resume(&self, session: SessionId) -> Result<Verdict, SupervisorError> {
        self.call(|reply| Command::Resume { session, reply }).await
    }

    /// Feeds a core input as is, e.g. a callback from a runtime this supervisor does not
    /// run itself (a remote controller). The core fences it like any other callback.
    pub async fn feed(&self, input: Input) -> Result<Verdict, SupervisorError> {
        self.call(|reply| Command::Feed { input, reply }).await
    }

    /// The ACP session id of the session's current conversation.
    pub async fn conversation(
        &self,
        session: SessionId,
    ) -> Result<Option<String>, SupervisorError> {
        self.call(|reply| Command::Conversation { session, reply })
            .await
    }

    /// Counters so far.
    pub async fn stats(&self) -> Result<SupervisorStats, SupervisorError> {
        self.call(|reply| Command::Stats { reply }).await
    }

    /// The client's `initialize` params, for every runtime started from now on (with a
    /// client behind the caller: [`ClientSide::Forward`](palisade_engine::ClientSide::Forward)).
    pub async fn set_client_hello(&self, params: RawJson) -> Result<(), SupervisorError> {
        self.send(Command::Client(ClientCommand::Hello(params)))
            .await
    }

    /// The client's `authenticate` params, replayed on every runtime started from now on.
    pub async fn set_client_auth(&self, params: RawJson) -> Result<(), SupervisorError> {
        self.send(Command::Client(ClientCommand::Auth(params)))
            .await
    }

    /// Opens a client's session ([`Engine::open`]).
    pub async fn open(
        &self,
        session: SessionId,
        setup: SessionSetup,
    ) -> Result<Verdict, SupervisorError> {
        self.call(|reply| {
            Command::Client(ClientCommand::Open {
                session,
                setup,
                reply,
            })
        })
        .await
    }

    /// Submits a client's prompt ([`Engine::prompt_content`]); answered once the claim is
    /// durable, as [`Supervisor::prompt`] is.
    pub async fn prompt_content(
        &self,
        session: SessionId,
        content: PromptContent,
    ) -> Result<TurnId, SupervisorError> {
        self.call(|reply| {
            Command::Client(ClientCommand::Prompt {
                session,
                content,
                reply,
            })
        })
        .await?
        .map_err(SupervisorError::Prompt)
    }

    /// Forwards a client's request to the session's agent ([`Engine::forward`]); its
    /// answer comes as [`SessionEvent::Forwarded`].
    pub async fn forward(
        &self,
        session: SessionId,
        method: String,
        params: RawJson,
    ) -> Result<Result<u64, ForwardError>, SupervisorError> {
        self.call(|reply| {
            Command::Client(ClientCommand::Forward {
                session,
                method,
                params,
                reply,
            })
        })
        .await
    }

    /// The client answered an agent's request ([`Engine::answer_client_request`]).
    pub async fn answer_client_request(
        &self,
        ticket: u64,
        outcome: Result<RawJson, RpcError>,
    ) -> Result<bool, SupervisorError> {
        self.call(|reply| {
            Command::Client(ClientCommand::Answer {
                ticket,
                outcome,
                reply,
            })
        })
        .await
    }

    /// The sessions the engine knows, with what they were opened with.
    pub async fn sessions(&self) -> Result<Vec<(SessionId, SessionSetup)>, SupervisorError> {
        self.call(|reply| Command::Client(ClientCommand::Sessions { reply }))
            .await
    }

    async fn send(&self, command: Command) -> Result<(), SupervisorError> {
        self.commands
            .send(command)
            .await
            .map_err(|_| SupervisorError::Stopped)
    }

    /// Hands the caller the output already admitted, stops every agent (stdin EOF, the
    /// stop grace, SIGTERM, SIGKILL: the whole process tree) and stops the driver. The state
    /// file keeps the last step's state, exactly as after a crash: a supervisor started from
    /// it recovers what was in flight. Then take the last events
    /// ([`SessionEvents::try_recv`]) and [`close`](Supervisor::close).
    pub async fn shutdown(&self) {
        let _ = self.call(|reply| Command::Shutdown { reply }).await;
    }

    /// After [`shutdown`](Supervisor::shutdown), once the caller has written the last
    /// events where they go: writes down which events the caller is done with
    /// ([`SessionEvents::done`]), so that the next start on the same state file does not
    /// hand them out again, and releases the state file's lock. A supervisor dropped
    /// without it leaves them listed undelivered, as a crash does: the next start hands
    /// them out again (at least once, never lost).
    pub async fn close(&self) {
        let _ = self.call(|reply| Command::Close { reply }).await;
    }
}

/// Milliseconds on a clock that survives restarts: wall-clock based at start (so time
/// spent down counts against deadlines), monotonic while running, and never before the
/// state file's own time.
#[derive(Debug)]
struct Clock {
    platform: Arc<dyn Platform>,
    start: Instant,
    base_ms: u64,
}

impl Clock {
    fn resume(platform: Arc<dyn Platform>, not_before_ms: u64) -> Clock {
        let wall_ms = platform.unix_ms();
        Clock {
            start: platform.now(),
            base_ms: wall_ms.max(not_before_ms),
            platform,
        }
    }

    fn now(&self) -> Timestamp {
        let elapsed = self.platform.now().saturating_duration_since(self.start);
        let elapsed = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        Timestamp::from_millis(self.base_ms.saturating_add(elapsed))
    }

    fn instant(&self, at: Timestamp) -> Instant {
        let after = Duration::from_millis(at.as_millis().saturating_sub(self.base_ms));
        self.start + after.min(FURTHEST)
    }
}

#[derive(Debug)]
struct Store {
    file: StateFile,
    /// The image last written; compared from [`BODY_OFFSET`] on (the write time
    /// excluded).
    last: Arc<Vec<u8>>,
    /// The state file's lock, released with the store.
    _lock: StateLock,
}

#[derive(Debug)]
struct Handle {
    conn: Arc<AgentConnection>,
    requests: mpsc::Sender<PumpRequest>,
    /// The execution's span (session, attempt, execution): its pump, its stderr lines and
    /// its stop are logged in it.
    span: tracing::Span,
}

#[derive(Debug)]
struct PumpRequest {
    op: Op,
    /// Already queued on the connection, in the order the engine asked.
    pending: PendingRequest,
    deadline: Instant,
}

#[derive(Debug)]
enum Inbox {
    Agent {
        execution: palisade_core::ExecutionId,
        event: AgentEvent,
    },
    Reply {
        execution: palisade_core::ExecutionId,
        op: Op,
        result: Result<RawJson, RpcFailure>,
    },
    Reaped {
        execution: palisade_core::ExecutionId,
        status: Option<ProcessExit>,
    },
}

/// The task that owns the engine: it carries out the engine's outputs and feeds it
/// everything that happens (caller commands, agent events and answers, reaps, writes made
/// durable, the time).
struct Shell {
    platform: Arc<dyn Platform>,
    engine: Engine,
    clock: Clock,
    agent: AgentCommand,
    connection: crate::rpc::ConnectionConfig,
    store: Option<Store>,
    commands: mpsc::Receiver<Command>,
    inbox_tx: mpsc::Sender<Inbox>,
    inbox: mpsc::Receiver<Inbox>,
    events: mpsc::Sender<SessionEvent>,
    /// How many handed events the caller is done with ([`SessionEvents::done`]).
    done: Arc<AtomicU64>,
    /// How many of those the engine was told of.
    acknowledged: u64,
    caller_gone: bool,
    handles: BTreeMap<palisade_core::ExecutionId, Handle>,
    stats: SupervisorStats,
    /// Answers to prompts, each held until a durable write covers the state version that
    /// claimed it: a caller never holds a turn id the state file does not know.
    replies: Vec<(u64, PromptReply, Result<TurnId, PromptError>)>,
    /// The state write under way, if any: its version, and where its result arrives.
    writing: Option<(u64, oneshot::Receiver<io::Result<()>>)>,
    /// Set when the state file could not be written (see [`Supervisor::fatal_error`]).
    fatal: Arc<std::sync::Mutex<Option<String>>>,
}

enum Flow {
    Continue,
    Stop,
}

/// What woke the shell while the engine waited.
enum Wake {
    Command(Option<Command>),
    Message(Inbox),
    Written(io::Result<()>),
    CallerRoom(bool),
    Timeout,
}

impl Shell {
    async fn run(mut self) {
        loop {
            let now = self.clock.now();
            // What the caller is done with leaves the state at the next write.
            let done = self.done.load(Ordering::Acquire);
            self.engine.acknowledge(done - self.acknowledged);
            self.acknowledged = done;
            let room = if self.caller_gone {
                usize::MAX
            } else {
                self.events.capacity()
            };
            self.engine.set_caller_room(room);
            self.release_replies();
            let (until, read_agents, caller_blocked) = match self.engine.poll_output(now) {
                Output::Persist => {
                    self.start_write(now);
                    continue;
                }
                Output::Action(action) => {
                    self.perform(action);
                    continue;
                }
                Output::Event(event) => {
                    self.hand(event);
                    continue;
                }
                Output::Wait {
                    until,
                    read_agents,
                    caller_blocked,
                } => (until, read_agents, caller_blocked && !self.caller_gone),
            };
            // The branches only take what woke the shell; it is handled below, once the
            // branch futures (which borrow the shell's channels) are gone. A timer only
            // when there is a deadline.
            let timer = until.map(|until| self.platform.sleep_until(self.clock.instant(until)));
            let writing = self.writing.is_some();
            let wake = tokio::select! {
                biased;
                command = self.commands.recv() => Wake::Command(command),
                written = async {
                    match self.writing.as_mut() {
                        Some((_, result)) => result.await,
                        None => std::future::pending().await,
                    }
                }, if writing => Wake::Written(written.unwrap_or_else(|_| {
                    Err(io::Error::other("the state write was abandoned"))
                })),
                Some(message) = self.inbox.recv(), if read_agents => Wake::Message(message),
                permit = self.events.reserve(), if caller_blocked => Wake::CallerRoom(permit.is_ok()),
                () = async {
                    match timer {
                        Some(timer) => timer.await,
                        None => std::future::pending().await,
                    }
                }, if until.is_some() => Wake::Timeout,
            };
            match wake {
                Wake::Command(Some(command)) => {
                    if matches!(self.command(command).await, Flow::Stop) {
                        return;
                    }
                }
                Wake::Command(None) => {
                    // Every handle was dropped.
                    self.shutdown().await;
                    return;
                }
                Wake::Written(result) => {
                    if let Err(error) = self.written(result) {
                        self.fail(&error).await;
                        return;
                    }
                }
                Wake::Message(message) => {
                    self.message(message);
                    // Everything already waiting, in one step: one write covers them all.
                    for _ in 1..STEP_MESSAGES {
                        if !self.engine.can_accept() {
                            break;
                        }
                        match self.inbox.try_recv() {
                            Ok(message) => self.message(message),
                            Err(_) => break,
                        }
                    }
                }
                // The permit itself is given back: the next round sees the room.
                Wake::CallerRoom(open) => self.caller_gone |= !open,
                Wake::Timeout => self.engine.handle_timeout(self.clock.now()),
            }
        }
    }

    /// Hands an event to the caller, who had room for it (or is gone: then it is dropped).
    fn hand(&mut self, event: SessionEvent) {
        if self.caller_gone {
            self.stats.events_dropped += 1;
            return;
        }
        match self.events.try_send(event) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                // Cannot happen: the engine hands out no more than the channel's room.
                self.stats.engine.anomalies += 1;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.caller_gone = true;
                self.stats.events_dropped += 1;
            }
        }
    }

    /// Prompt answers whose claim a durable write now covers go to their callers.
    fn release_replies(&mut self) {
        if self.replies.is_empty() {
            return;
        }
        let engine = &self.engine;
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.replies)
            .into_iter()
            .partition(|(version, _, _)| engine.is_durable(*version));
        self.replies = waiting;
        for (_, reply, answer) in ready {
            // A caller that gave up waiting for the answer is no reason to stop.
            let _ = reply.send(answer);
        }
    }

    /// Starts writing the state (on the platform's blocking pool); the engine goes on
    /// taking inputs meanwhile, and their outputs wait for the next write. Without a state
    /// file, or when the bytes are those already on disk, the state is durable at once.
    fn start_write(&mut self, now: Timestamp) {
        let image = self.engine.state_image(now);
        let Some(store) = self.store.as_mut() else {
            self.engine.persisted(image.version);
            return;
        };
        if store.last.get(BODY_OFFSET..) == Some(&image.bytes[BODY_OFFSET..]) {
            self.engine.persisted(image.version);
            return;
        }
        // Shared with the write, not copied: an image can be hundreds of kilobytes.
        let bytes = Arc::new(image.bytes);
        store.last = Arc::clone(&bytes);
        let file = store.file.clone();
        let (done_tx, done) = oneshot::channel();
        let write = self.platform.blocking(Box::new(move || file.write(&bytes)));
        let _ = self.platform.spawn(Box::pin(async move {
            let _ = done_tx.send(write.await);
        }));
        self.writing = Some((image.version, done));
    }

    /// A state write ended: what waited for it may leave. An error is fatal.
    fn written(&mut self, result: io::Result<()>) -> io::Result<()> {
        let Some((version, _)) = self.writing.take() else {
            return Ok(());
        };
        match result {
            Ok(()) => {
                self.stats.persists += 1;
                self.engine.persisted(version);
                Ok(())
            }
            Err(error) => {
                self.stats.persist_failures += 1;
                Err(error)
            }
        }
    }

    /// The state file could not be written. Write-ahead: nothing that waited for the
    /// write may leave the process, and a supervisor that went on without its state file
    /// would, after a restart, run completed turns again and hand out their output seqs
    /// anew. So it stops here, and the caller is told why.
    async fn fail(&mut self, error: &io::Error) {
        tracing::error!(%error, "the state file could not be written; stopping");
        *self
            .fatal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error.to_string());
        self.replies.clear();
        self.stop_agents().await;
    }

    async fn command(&mut self, command: Command) -> Flow {
        let now = self.clock.now();
        // A caller that gave up waiting for the answer is no reason to stop.
        match command {
            Command::Client(command) => self.client_command(now, command),
            Command::Prompt {
                session,
                text,
                reply,
            } => {
                let answer = self.engine.prompt(now, session, text);
                self.replies.push((self.engine.version(), reply, answer));
            }
            Command::Cancel { session, reply } => {
                let _ = reply.send(self.engine.cancel(now, session));
            }
            Command::Resume { session, reply } => {
                let _ = reply.send(self.engine.resume(now, session));
            }
            Command::Feed { input, reply } => {
                let _ = reply.send(self.engine.feed(now, input));
            }
            Command::Conversation { session, reply } => {
                let _ = reply.send(self.engine.conversation(session));
            }
            Command::Stats { reply } => {
                let mut stats = self.stats;
                stats.engine = self.engine.stats();
                stats.runtimes = self.engine.runtime_count();
                (stats.outputs_queued, stats.events_waiting) = self.engine.backlog();
                stats.reading = self.engine.can_accept();
                let _ = reply.send(stats);
            }
            Command::Shutdown { reply } => {
                self.shutdown().await;
                let _ = reply.send(());
                self.closing().await;
                return Flow::Stop;
            }
            // Only after a shutdown (below).
            Command::Close { reply } => {
                let _ = reply.send(());
            }
        }
        Flow::Continue
    }

    /// A command of a caller with a client behind it (the engine's
    /// [`ClientSide`](palisade_engine::ClientSide)).
    fn client_command(&mut self, now: Timestamp, command: ClientCommand) {
        match command {
            ClientCommand::Hello(params) => self.engine.set_client_hello(params),
            ClientCommand::Auth(params) => self.engine.set_client_auth(params),
            ClientCommand::Open {
                session,
                setup,
                reply,
            } => {
                let _ = reply.send(self.engine.open(now, session, setup));
            }
            ClientCommand::Prompt {
                session,
                content,
                reply,
            } => {
                let answer = self.engine.prompt_content(now, session, content);
                self.replies.push((self.engine.version(), reply, answer));
            }
            ClientCommand::Forward {
                session,
                method,
                params,
                reply,
            } => {
                let _ = reply.send(self.engine.forward(now, session, method, params));
            }
            ClientCommand::Answer {
                ticket,
                outcome,
                reply,
            } => {
                let _ = reply.send(self.engine.answer_client_request(ticket, outcome));
            }
            ClientCommand::Sessions { reply } => {
                let sessions = self
                    .engine
                    .sessions()
                    .map(|(session, setup)| (session, setup.clone()))
                    .collect();
                let _ = reply.send(sessions);
            }
        }
    }

    /// Hands the caller the output already admitted (written first, as every event is),
    /// then stops every agent's tree; starts nothing new (the state file keeps the last
    /// step, as after a crash).
    async fn shutdown(&mut self) {
        let now = self.clock.now();
        self.engine.flush_output(now);
        self.engine.set_caller_room(usize::MAX);
        loop {
            if let Some((_, result)) = self.writing.as_mut() {
                let result = result
                    .await
                    .unwrap_or_else(|_| Err(io::Error::other("the state write was abandoned")));
                if let Err(error) = self.written(result) {
                    self.fail(&error).await;
                    return;
                }
            }
            match self.engine.poll_output(now) {
                Output::Persist => self.start_write(now),
                // Nothing new starts during a shutdown.
                Output::Action(_) => {}
                Output::Event(event) => {
                    if self.caller_gone {
                        self.stats.events_dropped += 1;
                        continue;
                    }
                    // A caller that stops reading does not hold the shutdown up for long.
                    let until = self.platform.now() + SHUTDOWN_FLUSH_WITHIN;
                    match timeout_at(&*self.platform, until, self.events.send(event)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) | Err(_) => {
                            self.stats.events_dropped += 1;
                            self.caller_gone = true;
                        }
                    }
                }
                Output::Wait { .. } => break,
            }
        }
        self.stop_agents().await;
    }

    /// After a shutdown, until the caller closes: every other command is refused (its
    /// caller hears `Stopped`). The close writes down what the caller was done with, then
    /// the state file's lock is released before the caller hears of it, so a supervisor it
    /// starts next on the same file finds it free.
    async fn closing(&mut self) {
        // No event comes after a shutdown: the caller's channel ends once drained.
        self.events = mpsc::channel(1).0;
        while let Some(command) = self.commands.recv().await {
            if let Command::Close { reply } = command {
                self.write_acknowledged().await;
                self.store = None;
                let _ = reply.send(());
                return;
            }
        }
        // Every handle was dropped without a close: nothing more is written.
        self.store = None;
    }

    /// Writes the state once more with what the caller is done with; nothing else runs any
    /// more (the agents are stopped). Not after a failed write: what it would write is not
    /// known to follow the last state written.
    async fn write_acknowledged(&mut self) {
        if self.fatal_error().is_some() {
            return;
        }
        let done = self.done.load(Ordering::Acquire);
        self.engine.acknowledge(done - self.acknowledged);
        self.acknowledged = done;
        // A write still in flight ends first; then the state as it is now, unless those
        // are the bytes already written.
        if !self.finish_write().await {
            return;
        }
        self.start_write(self.clock.now());
        self.finish_write().await;
    }

    /// Waits for the state write in flight, if any; false (and the error recorded) if it
    /// failed.
    async fn finish_write(&mut self) -> bool {
        let Some((_, result)) = self.writing.as_mut() else {
            return true;
        };
        let result = result
            .await
            .unwrap_or_else(|_| Err(io::Error::other("the state write was abandoned")));
        match self.written(result) {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(%error, "the state file could not be written at the close");
                *self
                    .fatal
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error.to_string());
                false
            }
        }
    }

    fn fatal_error(&self) -> Option<String> {
        self.fatal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Stops every agent's tree as a StopExecution would: stdin EOF, the grace, SIGTERM,
    /// SIGKILL; all at once.
    async fn stop_agents(&mut self) {
        let handles = std::mem::take(&mut self.handles);
        let grace_until =
            self.platform.now() + Duration::from_millis(self.engine.config().stop_grace_ms);
        let (stopped_tx, mut stopped) = mpsc::channel(handles.len().max(1));
        let mut stopping = Vec::with_capacity(handles.len());
        for handle in handles.into_values() {
            let stopped_tx = stopped_tx.clone();
            stopping.push(self.platform.spawn(Box::pin(async move {
                handle.conn.stop(grace_until).await;
                let _ = stopped_tx.send(()).await;
            })));
        }
        drop(stopped_tx);
        // Every stop ends (each is bounded by the tree's own deadlines).
        while stopped.recv().await.is_some() {}
        drop(stopping);
    }

    fn message(&mut self, message: Inbox) {
        let now = self.clock.now();
        match message {
            Inbox::Agent { execution, event } => self.engine.agent_event(now, execution, event),
            Inbox::Reply {
                execution,
                op,
                result,
            } => self.engine.reply(now, execution, op, result),
            Inbox::Reaped { execution, status } => {
                self.handles.remove(&execution);
                self.engine.reaped(now, execution, status);
            }
        }
    }

    fn perform(&mut self, action: Action) {
        let now = self.clock.now();
        match action {
            Action::Spawn { session, attempt } => {
                // The execution's ID is the engine's answer to the spawn: recorded below.
                let span = tracing::info_span!(
                    "execution",
                    session = session.get(),
                    attempt = %attempt,
                    execution = tracing::field::Empty,
                );
                let spawned = span.in_scope(|| {
                    AgentConnection::spawn_on(
                        Arc::clone(&self.platform),
                        &self.agent,
                        self.connection.clone(),
                    )
                });
                match spawned {
                    Ok((conn, events)) => {
                        let conn = Arc::new(conn);
                        let execution = self.engine.spawned(now, session, attempt, Ok(conn.pid()));
                        span.record("execution", execution.get());
                        tracing::info!(parent: &span, pid = conn.pid(), "agent started");
                        let (requests_tx, requests_rx) = mpsc::channel(PUMP_REQUESTS);
                        let _ = self
                            .platform
                            .spawn(Box::pin(tracing::Instrument::instrument(
                                pump(
                                    Arc::clone(&self.platform),
                                    execution,
                                    Arc::clone(&conn),
                                    events,
                                    requests_rx,
                                    self.inbox_tx.clone(),
                                ),
                                span.clone(),
                            )));
                        self.handles.insert(
                            execution,
                            Handle {
                                conn,
                                requests: requests_tx,
                                span,
                            },
                        );
                    }
                    Err(error) => {
                        tracing::warn!(parent: &span, %error, "the agent could not start");
                        self.engine
                            .spawned(now, session, attempt, Err(error.to_string()));
                    }
                }
            }
            Action::Request {
                execution,
                op,
                method,
                params,
                deadline,
            } => {
                let Some(handle) = self.handles.get(&execution) else {
                    self.engine
                        .reply(now, execution, op, Err(RpcFailure::TransportClosed));
                    return;
                };
                // A place in the pump first (nothing goes to the agent that no one would
                // wait for), then the line, queued now: the agent gets the engine's
                // requests, notifications, answers and stdin's end in the order asked.
                let permit = match handle.requests.try_reserve() {
                    Ok(permit) => permit,
                    Err(mpsc::error::TrySendError::Full(())) => {
                        self.engine
                            .reply(now, execution, op, Err(RpcFailure::TooManyPending));
                        return;
                    }
                    Err(mpsc::error::TrySendError::Closed(())) => {
                        let failure = handle
                            .conn
                            .close_reason()
                            .map_or(RpcFailure::TransportClosed, |r| r.failure());
                        self.engine.reply(now, execution, op, Err(failure));
                        return;
                    }
                };
                match handle.conn.send_request(&method, params) {
                    Ok(pending) => permit.send(PumpRequest {
                        op,
                        pending,
                        deadline: self.clock.instant(deadline),
                    }),
                    Err(failure) => self.engine.reply(now, execution, op, Err(failure)),
                }
            }
            Action::Notify {
                execution,
                method,
                params,
            } => {
                if let Some(handle) = self.handles.get(&execution) {
                    // Queued now, in order; a connection that closes reports itself
                    // through its events, so nobody waits for the write.
                    let _ = handle.conn.queue_notification(method, params);
                }
            }
            Action::Respond {
                execution,
                id,
                outcome,
            } => {
                if let Some(handle) = self.handles.get(&execution) {
                    // Queued now, in order (see `Action::Notify`).
                    let _ = handle.conn.queue_response(&id, &outcome);
                }
            }
            Action::Stop {
                execution,
                deadline,
                grace_ms,
            } => {
                let Some(handle) = self.handles.get(&execution) else {
                    self.engine.reaped(now, execution, None);
                    return;
                };
                // Stdin's end is queued now, behind what the engine sent before (a
                // `session/cancel` first): the task below may run after later actions.
                handle.conn.close_stdin();
                let conn = Arc::clone(&handle.conn);
                let inbox = self.inbox_tx.clone();
                let grace_until = (self.platform.now() + Duration::from_millis(grace_ms))
                    .min(self.clock.instant(deadline));
                let span = handle.span.clone();
                tracing::info!(parent: &span, grace_ms, "stopping the agent");
                let _ = self.platform.spawn(Box::pin(async move {
                    // Stdin EOF (an agent may save and exit), the grace, then SIGTERM and
                    // SIGKILL to the agent's whole process tree.
                    let status = conn.stop(grace_until).await;
                    tracing::info!(parent: &span, ?status, "agent stopped");
                    let _ = inbox.send(Inbox::Reaped { execution, status }).await;
                }));
            }
            Action::Kill { execution } => {
                let Some(handle) = self.handles.get(&execution) else {
                    self.engine.reaped(now, execution, None);
                    return;
                };
                let conn = Arc::clone(&handle.conn);
                let inbox = self.inbox_tx.clone();
                let until = self.platform.now() + REAP_WITHIN;
                let span = handle.span.clone();
                tracing::warn!(parent: &span, "killing the agent's process tree");
                let _ = self.platform.spawn(Box::pin(async move {
                    let status = conn.kill_and_reap(until).await;
                    tracing::info!(parent: &span, ?status, "agent killed");
                    let _ = inbox.send(Inbox::Reaped { execution, status }).await;
                }));
            }
        }
    }
}

/// A pump's requests in flight: each runs as a task of its own (a request waits for its
/// answer while the pump goes on forwarding notifications) and sends its answer back. The
/// tasks still running when the pump ends are aborted, as a `JoinSet`'s would be.
struct InFlight {
    platform: Arc<dyn Platform>,
    tasks: BTreeMap<u64, Task>,
    next: u64,
    done_tx: mpsc::Sender<(u64, Op, Result<RawJson, RpcFailure>)>,
    done: mpsc::Receiver<(u64, Op, Result<RawJson, RpcFailure>)>,
}

impl InFlight {
    fn new(platform: Arc<dyn Platform>) -> InFlight {
        let (done_tx, done) = mpsc::channel(PUMP_REQUESTS);
        InFlight {
            platform,
            tasks: BTreeMap::new(),
            next: 0,
            done_tx,
            done,
        }
    }

    fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    fn start(&mut self, request: PumpRequest) {
        self.next += 1;
        let n = self.next;
        let done = self.done_tx.clone();
        let task = self.platform.spawn(Box::pin(async move {
            let result = request.pending.answer(request.deadline).await;
            // The pump may be gone; nobody waits for the answer then.
            let _ = done.send((n, request.op, result)).await;
        }));
        self.tasks.insert(n, task);
    }

    /// The next answer; `None` if nothing is in flight.
    async fn next(&mut self) -> Option<(Op, Result<RawJson, RpcFailure>)> {
        if self.tasks.is_empty() {
            return None;
        }
        let (n, op, result) = self.done.recv().await?;
        self.tasks.remove(&n);
        Some((op, result))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        for task in self.tasks.values() {
            task.abort();
        }
    }
}

/// Forwards the answers still in flight, then the connection's close: answers the agent
/// wrote before it closed come first (an agent may answer a prompt and exit at once).
/// Every request is resolved by now, since the connection fails the unanswered ones before
/// it reports the close. False if the driver is gone.
async fn close_after_answers(
    execution: palisade_core::ExecutionId,
    in_flight: &mut InFlight,
    inbox: &mpsc::Sender<Inbox>,
    close: AgentEvent,
) -> bool {
    while let Some((op, result)) = in_flight.next().await {
        if inbox
            .send(Inbox::Reply {
                execution,
                op,
                result,
            })
            .await
            .is_err()
        {
            return false;
        }
    }
    inbox
        .send(Inbox::Agent {
            execution,
            event: close,
        })
        .await
        .is_ok()
}

/// Forwards one agent's events and answers to the driver, in wire order: an answer after
/// the notifications written before it, the close after every answer.
async fn pump(
    platform: Arc<dyn Platform>,
    execution: palisade_core::ExecutionId,
    conn: Arc<AgentConnection>,
    mut events: AgentEvents,
    mut requests: mpsc::Receiver<PumpRequest>,
    inbox: mpsc::Sender<Inbox>,
) {
    let mut in_flight = InFlight::new(platform);
    let mut closed = false;
    let mut requests_open = true;
    loop {
        let busy = !in_flight.is_empty();
        tokio::select! {
            biased;
            request = requests.recv(), if requests_open => match request {
                Some(request) => in_flight.start(request),
                // The driver let go of this runtime; keep draining until it closes.
                None => requests_open = false,
            },
            event = events.recv(), if !closed => {
                let Some(event) = event else {
                    closed = true;
                    continue;
                };
                if matches!(event, AgentEvent::Closed(_)) {
                    closed = true;
                    if !close_after_answers(execution, &mut in_flight, &inbox, event).await {
                        return;
                    }
                } else if inbox.send(Inbox::Agent { execution, event }).await.is_err() {
                    return;
                }
            }
            Some((op, result)) = in_flight.next(), if busy => {
                // Everything the agent wrote before this answer is queued by now: send it
                // first, so output is never reordered behind its prompt's end. A close
                // found there came after the answer: it waits.
                let mut close = None;
                while !closed {
                    let Some(event) = events.try_recv() else { break };
                    if matches!(event, AgentEvent::Closed(_)) {
                        closed = true;
                        close = Some(event);
                    } else if inbox.send(Inbox::Agent { execution, event }).await.is_err() {
                        return;
                    }
                }
                if inbox.send(Inbox::Reply { execution, op, result }).await.is_err() {
                    return;
                }
                if let Some(close) = close {
                    if !close_after_answers(execution, &mut in_flight, &inbox, close).await {
                        return;
                    }
                }
            }
            else => return,
        }
        if closed && in_flight.is_empty() {
            // Refuse new requests, then answer the ones already queued: none is left
            // without a reply.
            requests.close();
            let failure = conn
                .close_reason()
                .map_or(RpcFailure::TransportClosed, |r| r.failure());
            while let Ok(request) = requests.try_recv() {
                let result = Err(failure.clone());
                let reply = Inbox::Reply {
                    execution,
                    op: request.op,
                    result,
                };
                if inbox.send(reply).await.is_err() {
                    return;
                }
            }
            return;
        }
    }
}
