//! The supervisor's logic without I/O: a [`Core`] plus what the core leaves to its
//! embedder (ACP session ids, prompt texts, request bookkeeping, lossless delivery).
//!
//! The `Supervisor` (`palisade-embed`) is a thin tokio shell around an `Engine`; the
//! engine never spawns, awaits, or reads a clock. The loop, str0m's:
//!
//! 1. feed what happened, one call per kind: a caller command ([`Engine::prompt`],
//!    [`Engine::cancel`], ...), an agent's event ([`Engine::agent_event`]), a request's
//!    answer ([`Engine::reply`]), a process reaped ([`Engine::reaped`]), a write made
//!    durable ([`Engine::persisted`]), or the time ([`Engine::handle_timeout`]);
//! 2. drain [`Engine::poll_output`] until it says [`Output::Wait`]: [`Output::Persist`]
//!    (write [`Engine::state_image`], then report it), [`Output::Action`] (spawn, send a
//!    request, stop a process: results come back as inputs), [`Output::Event`] (hand it to
//!    the caller, which has room for it: [`Engine::set_caller_room`]);
//! 3. wait for the next input, or the time `Wait` names; read the agents only while
//!    `Wait` says so (backpressure), and wake for the caller's room when it is blocked.
//!
//! **Group commit.** With [`EngineConfig::persistence`], nothing an input causes (an
//! action, an event) leaves before a write covering it is durable (write-ahead), and one
//! write covers every input since the previous one: while a write is under way the engine
//! goes on taking inputs, and their outputs wait for the next write. A turn's output
//! waits only for the write that covers its admission (the core's `Deliver`): the state
//! lists it from then on, queued or undelivered, so one write releases all the output it
//! covers, however much of it was still in the delivery queue.
//!
//! # How core effects become ACP traffic
//!
//! - `StartRuntime` → [`Action::Spawn`]; the shell spawns and calls [`Engine::spawned`],
//!   which allocates an [`ExecutionId`], reports `Input::Bound`, `BootReady`, and sends
//!   `initialize`, whose answer becomes `AgentReady` with the `loadSession` capability.
//!   With [`EngineConfig::reuse_runtimes`], a `StartRuntime` while a retired attempt
//!   of the same session still waits for its spawn asks for no second process: the new
//!   attempt binds that one when it is up (`Input::Bound` for the new attempt first, then
//!   the retired attempt's own, late, which the core refuses), and only its own
//!   `initialize` is ever sent on it. If the core refuses the new attempt, it spawns.
//! - `LoadConversation` / `NewConversation` / `DispatchPrompt` → `Input::Perform{lease}`
//!   first, in the same step, then the request. Answers map to `ConversationLoaded`,
//!   `LoadFailed` (a [`LoadOutcome`] built from the [`RpcFailure`] and the transport's
//!   state), `ConversationCreated` (the engine mints the [`ConversationToken`] and
//!   remembers the ACP session id it stands for), `PromptCompleted` / `PromptFailed`.
//! - **A "not found" is checked against the agent's own list.** When a load fails with an
//!   answer that is proof only by the agent's word (−32002 or a "not found" projection,
//!   [`classify::ClassifyReason::may_be_overturned_by_listing`]) and the agent advertises
//!   `session/list` (or its profile says it has one), the engine asks `session/list` (up to
//!   [`MAX_LIST_PAGES`] pages) before it reports the failure, and says in the
//!   [`LoadOutcome`] whether the agent lists the session: a listed session is kept.
//! - **When is a prompt accepted?** ACP has no acknowledgement of `session/prompt`, and a
//!   line written to a pipe proves nothing (the agent may die before reading it). The
//!   engine reports `PromptAccepted` on the first proof that the agent works on the
//!   prompt: its first `session/update` for the conversation while the prompt is in
//!   flight, or else the prompt's answer (result or JSON-RPC error). A runtime that dies
//!   before the prompt was written rolls the turn back (the user may resend); once it was
//!   written (accepted or not: the agent may have read it), the core recovers the turn.
//! - Each `session/update` during the prompt is a `Stream` callback with a runtime
//!   sequence number from 1 per dispatch; the core's `Deliver` moves it into the session's
//!   bounded [`NotificationQueue`], then through a [`Coalescer`] to the caller.
//! - `CancelPrompt` → `session/cancel`. `StopExecution` → [`Action::Stop`] (close stdin,
//!   grace, SIGKILL, reap) then `Input::Stopped`. `KillExecution` → [`Action::Kill`].
//! - The connection closing (process exit, stdout closed, garbage) → `Exited`, and the
//!   process is killed and reaped whatever state it is in.
//! - A turn silent past the core's idle deadline (`turn_idle_ms` in
//!   [`EngineConfig::core`]) is the core's decision (`TurnSilent`, then `CancelPrompt`,
//!   `StopExecution` and the turn's recovery); the engine records the cause
//!   ([`FailureCause::PromptIdle`]) and carries the rest out like any other effect. While
//!   the engine does not read the agents (backpressure) it tells the core, whose idle
//!   deadlines then wait.
//!
//! # Known limit
//!
//! A turn cancelled after its prompt was sent but before the agent showed any sign of it
//! ends at once; if the next turn is dispatched to the same runtime before the agent
//! answered the cancelled prompt, late notifications of the cancelled prompt are counted
//! as the new turn's output (ACP notifications carry no request id to tell them apart).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[cfg(feature = "audit")]
use palisade_core::audit::{Checker, Found};
use palisade_core::classify::{self, LoadFailure, LoadOutcome, SessionListing, TransportState};
use palisade_core::delivery::{
    Batch, Coalescer, EventKind, NotificationQueue, Payload, PushError, Seq, StreamEvent,
};
use palisade_core::driver::{self, Driver, Observer, Step};
use palisade_core::{
    AttemptId, Callback, ConversationToken, Core, Effect, Epoch, ErrorStamp, ExecutionId,
    Generation, Input, NewConversationReason, RejectReason, RuntimeEvent, SessionId, Timestamp,
    TurnId, TurnOutcome, Verdict,
};
use serde_json::{json, Value};

use palisade_wire::acp;
use palisade_wire::connection::{AgentEvent, CloseReason, ProcessExit, RpcFailure};
use palisade_wire::jsonrpc::{codes, RawJson, RequestId, RpcError};

use crate::config::{ClientSide, EngineConfig, EngineConfigError, MAX_PROMPT_BYTES, READY_EVENTS};
use crate::events::{
    self, kind_of, origin_of, ConversationOrigin, FailureCause, OutputEvent, PromptContent,
    SessionEvent, UpdateHead,
};
use crate::replay::render_prompt;
use crate::sorted_map::SortedMap;
use crate::state::{
    self, ExecutionRecord, HeaderOut, QueuedOutput, QueuedOutputOut, SessionRecordOut, StateError,
};

mod answers;
mod effects;
mod lifecycle;
mod outlet;
mod output;
mod persist;
mod runtime;
#[cfg(test)]
mod tests;

use outlet::{Outlet, OutputItem, PendingOutput, Ready};
use output::Round;
pub use output::{Output, StateImage};
use runtime::{PendingListing, PromptState, Runtime};

/// Failure causes remembered for [`SessionEvent::FailureReported`]. A cause is looked up
/// in the same step as (or a few steps after) it was recorded, so a short ring suffices.
pub const CAUSES_REMEMBERED: usize = 64;

/// Removed runtimes remembered with their callback stamps, so an effect the core still
/// issues for one (it cannot, in practice) is answered rather than dropped.
pub const GRAVEYARD_RUNTIMES: usize = 64;

/// Hard deadline of a `session/prompt` request. Liveness is judged by the idle timeout;
/// this only bounds a prompt that streams for a day.
pub const PROMPT_REQUEST_DEADLINE_MS: u64 = 24 * 60 * 60 * 1000;

/// Audit violations kept for inspection; more are only counted.
pub const AUDIT_VIOLATIONS_KEPT: usize = 16;

/// Pages of `session/list` read before a "not found" is acted on. An agent with more
/// sessions than that is not asked further: its "not found" then stands as the proof it is.
pub const MAX_LIST_PAGES: u32 = 8;

/// Error stamps the engine mints stay below the core's own stamp bit.
const STAMP_MASK: u64 = (1 << 63) - 1;

/// A request the engine wants sent, so its answer can be routed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `initialize`.
    Initialize,
    /// `session/load` of this conversation token.
    Load {
        /// The token.
        token: ConversationToken,
    },
    /// `session/new`.
    New {
        /// Why (a fallback names its proof).
        reason: NewConversationReason,
    },
    /// `session/list`, asked because a load failed with a "not found": does the agent
    /// list the session it could not load?
    List,
    /// `session/prompt` for this turn.
    Prompt {
        /// The turn.
        turn: TurnId,
        /// Which dispatch of it: a recovery may dispatch the same turn to the same
        /// runtime again while the earlier prompt's answer is still due.
        dispatch: u64,
    },
    /// `authenticate`, replayed on a new runtime as the client authenticated.
    Authenticate,
    /// A request the caller forwarded ([`Engine::forward`]).
    Forward {
        /// Its ticket.
        ticket: u64,
    },
}

/// What a client's session is made with: kept for the session's life (and in the state),
/// used for every conversation the engine starts or loads for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionSetup {
    /// The caller's name for the session (a proxy's upstream session id).
    pub label: Option<String>,
    /// The params of the client's `session/new` (`cwd`, `mcpServers`, ...): every
    /// `session/new` sends them as they are, every `session/load` its `cwd` and
    /// `mcpServers`. `None`: the engine's own `cwd`.
    pub params: Option<RawJson>,
    /// The history the agent replays when it loads the session's conversation next
    /// reaches the caller ([`SessionEvent::History`]).
    pub history: bool,
}

/// Why a request could not be forwarded to a session's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardError {
    /// The session has no runtime with a conversation right now.
    NoRuntime,
    /// The params are not a JSON object.
    NotAnObject,
}

impl std::fmt::Display for ForwardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForwardError::NoRuntime => f.write_str("the session's agent is not running"),
            ForwardError::NotAnObject => f.write_str("the params are not a JSON object"),
        }
    }
}

impl std::error::Error for ForwardError {}

/// A client request of an agent, waiting for the client's answer.
#[derive(Debug, Clone)]
struct ClientTicket {
    execution: ExecutionId,
    generation: Generation,
    id: RequestId,
    method: String,
}

/// Agent requests waiting for the client at once; past it, a request is refused (an agent
/// asks one thing at a time per tool call: more means the client stopped answering).
pub const MAX_OPEN_CLIENT_REQUESTS: usize = 256;

/// Something the shell must do. Results come back as engine inputs.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Start an agent process; then call [`Engine::spawned`].
    Spawn {
        /// The session.
        session: SessionId,
        /// The attempt it is for.
        attempt: AttemptId,
    },
    /// Send a request; deliver the answer (or failure) with [`Engine::reply`], after every
    /// notification the agent wrote before it.
    Request {
        /// The runtime.
        execution: ExecutionId,
        /// What it is, to route the answer.
        op: Op,
        /// The ACP method.
        method: std::borrow::Cow<'static, str>,
        /// Its params.
        params: acp::Params,
        /// When to give up waiting.
        deadline: Timestamp,
    },
    /// Send a notification (e.g. `session/cancel`); no answer.
    Notify {
        /// The runtime.
        execution: ExecutionId,
        /// The ACP method.
        method: &'static str,
        /// Its params.
        params: acp::Params,
    },
    /// Answer a request the agent sent.
    Respond {
        /// The runtime.
        execution: ExecutionId,
        /// The agent's request id.
        id: RequestId,
        /// The answer.
        outcome: Result<Value, RpcError>,
    },
    /// Stop the process: close its stdin, wait up to `grace_ms` (and never past
    /// `deadline`), SIGKILL, reap; then call [`Engine::reaped`].
    Stop {
        /// The runtime.
        execution: ExecutionId,
        /// The core's teardown deadline.
        deadline: Timestamp,
        /// How long the agent may take to exit on its own.
        grace_ms: u64,
    },
    /// SIGKILL the process and reap it; then call [`Engine::reaped`]. After a restore it
    /// may name a runtime of a previous incarnation, which a shell whose runtimes died with
    /// it does not know: it calls [`Engine::reaped`] at once (a platform whose runtimes
    /// outlive the orchestrator kills the one it still runs under that id).
    Kill {
        /// The runtime.
        execution: ExecutionId,
    },
}

/// Why a prompt was not claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptError {
    /// The text is longer than [`MAX_PROMPT_BYTES`].
    TooLarge {
        /// Its length.
        bytes: usize,
    },
    /// The core refused it (e.g. [`RejectReason::SessionBusy`]: a turn is in flight).
    Rejected(RejectReason),
}

impl std::fmt::Display for PromptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PromptError::TooLarge { bytes } => {
                write!(f, "prompt of {bytes} bytes; at most {MAX_PROMPT_BYTES}")
            }
            PromptError::Rejected(reason) => write!(f, "prompt rejected: {reason}"),
        }
    }
}

impl std::error::Error for PromptError {}

/// Counters of an engine. Monotonic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Output events the core admitted and the engine queued for the caller.
    pub outputs_delivered: u64,
    /// Notifications that were not turn output (load history, after the turn, other
    /// methods, unknown runtimes).
    pub notifications_ignored: u64,
    /// Output the core refused (e.g. a turn already cancelled).
    pub outputs_rejected: u64,
    /// Core inputs answered with a rejection.
    pub inputs_rejected: u64,
    /// Requests from agents answered with a refusal.
    pub agent_requests_refused: u64,
    /// Requests from agents shown to the client ([`ClientSide::Forward`]).
    pub agent_requests_forwarded: u64,
    /// Client answers dropped: their execution was retired, or their ticket unknown.
    pub client_answers_dropped: u64,
    /// Agent anomalies (garbage lines, unknown response ids, ...) seen.
    pub anomalies: u64,
    /// Runtime deaths reported to the core.
    pub exits_reported: u64,
    /// Turns whose agent went silent past the idle deadline: the core gave the runtime up.
    pub turns_silent: u64,
    /// Violations the auditor found (0 unless feature `audit` and
    /// `EngineConfig::audit`).
    pub audit_violations: u64,
}

/// What the engine remembers of a session.
#[derive(Debug, Default)]
struct Book {
    conversation: Option<(ConversationToken, String)>,
    turn: Option<(TurnId, PromptContent)>,
    stop_reason: Option<String>,
    setup: SessionSetup,
}

#[derive(Debug)]
struct CauseEntry {
    stamp: Option<ErrorStamp>,
    attempt: AttemptId,
    cause: FailureCause,
}

#[derive(Debug, Clone, Copy)]
struct Counters {
    next_execution: u64,
    next_turn: u64,
    next_stamp: u64,
    next_token: u64,
}

/// The supervisor's logic, sans I/O. See the module docs for the call order.
#[derive(Debug)]
pub struct Engine {
    /// The core behind the one non-re-entrant driver (leases confirmed on pull).
    driver: Driver<StepWatch>,
    config: EngineConfig,
    books: BTreeMap<SessionId, Book>,
    runtimes: SortedMap<ExecutionId, Runtime>,
    graveyard: VecDeque<ExecutionRecord>,
    outlets: SortedMap<SessionId, Outlet>,
    ready: Ready,
    /// Events handed to the caller ([`Output::Event`], with persistence) and not yet acknowledged:
    /// still undelivered for the state, so a restart hands them out again.
    handed: VecDeque<SessionEvent>,
    /// Actions for the shell, each with the state version that asked for it.
    actions: VecDeque<(u64, Action)>,
    pending_output: Option<PendingOutput>,
    causes: VecDeque<CauseEntry>,
    counters: Counters,
    /// Dispatches so far; numbers `Op::Prompt` so an answer finds its own dispatch.
    dispatches: u64,
    stats: EngineStats,
    /// Carrying out effects: inputs raised now wait in the driver's inbox.
    running: bool,
    /// The state's version: bumped by every change (see [`Engine::touch`]).
    version: u64,
    /// The client's `initialize` params, sent to every new runtime as its own.
    hello: Option<RawJson>,
    /// The client's `authenticate`, replayed on every new runtime after `initialize`.
    auth: Option<(String, RawJson)>,
    /// Agent requests shown to the client and not yet answered, by ticket.
    tickets: BTreeMap<u64, ClientTicket>,
    /// Tickets minted so far (client requests and forwarded requests).
    next_ticket: u64,
    /// The version the last durable write covered (with persistence).
    durable: u64,
    /// A write was asked for ([`Output::Persist`]) and not yet reported.
    writing: bool,
    /// Events the caller can take now ([`Engine::set_caller_room`]).
    caller_room: usize,
    /// Where [`Engine::poll_output`] is in its round.
    round: Round,
    /// The engine does not read the agents now (backpressure); the core was told
    /// ([`Driver::set_listening`]).
    gated: bool,
    /// Executions that died with the previous incarnation (reported exited on restore).
    previous_incarnation: BTreeSet<ExecutionId>,
    /// Runtimes of earlier incarnations this engine asked the platform to kill, until it
    /// reports them gone ([`Engine::reaped`]): on a platform whose runtimes outlive their
    /// orchestrator (a sidecar) they still run after a restart. Kept in the state image,
    /// so a restart before the platform confirmed kills them again.
    survivors: BTreeSet<ExecutionId>,
    /// Per session, the last failure seen since its turn was claimed: the cause a turn
    /// that does not complete is ended with.
    turn_causes: BTreeMap<SessionId, FailureCause>,
    /// Spawns asked for and not yet reported ([`Action::Spawn`] → [`Engine::spawned`]).
    spawning: BTreeSet<(SessionId, AttemptId)>,
    /// With [`EngineConfig::reuse_runtimes`]: per session, the live attempt that waits
    /// for the process a retired attempt's spawn is starting, instead of a spawn of its own.
    waiting: BTreeMap<SessionId, AttemptId>,
}

/// What the engine's driver shows every core step to: the engine's own counters, the
/// reference model (feature `audit`, tests only), and an embedder's observer.
#[derive(Default)]
struct StepWatch {
    /// Inputs the core rejected.
    rejected: u64,
    #[cfg(feature = "audit")]
    checker: Option<Checker>,
    #[cfg(feature = "audit")]
    found: Vec<Found>,
    #[cfg(feature = "audit")]
    violations: u64,
    outer: Option<Box<dyn Observer + Send>>,
}

impl std::fmt::Debug for StepWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepWatch")
            .field("rejected", &self.rejected)
            .field("outer", &self.outer.is_some())
            .finish_non_exhaustive()
    }
}

impl Observer for StepWatch {
    fn observe(&mut self, now: Timestamp, core: &Core, step: Step<'_>, effects: &[Effect]) {
        if let Step::Input { verdict, .. } = step {
            if verdict.is_reject() {
                self.rejected += 1;
            }
        }
        #[cfg(feature = "audit")]
        if let Some(checker) = self.checker.as_mut() {
            checker.observe(now, core, step, effects);
            if let Some(found) = checker.take_found() {
                self.violations += 1;
                if self.found.len() < AUDIT_VIOLATIONS_KEPT {
                    self.found.push(found);
                }
            }
        }
        if let Some(outer) = self.outer.as_mut() {
            outer.observe(now, core, step, effects);
        }
    }
}

fn min_time(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Failures that mean the connection is gone; the connection's `Closed` event reports
/// them, once.
fn is_transport(failure: &RpcFailure) -> bool {
    matches!(
        failure,
        RpcFailure::TransportClosed
            | RpcFailure::ProcessExited { .. }
            | RpcFailure::Garbage { .. }
            | RpcFailure::Killed
    )
}

/// The `protocolVersion` of an `initialize` answer, as JSON text, when it is not the one
/// this client speaks ([`acp::PROTOCOL_VERSION`]). An answer without one (the schema
/// requires it; test doubles omit it) is taken as ours: its absence names no other
/// version.
fn unsupported_protocol(answer: &RawJson) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Version {
        #[serde(rename = "protocolVersion")]
        version: Option<Value>,
    }
    let version = answer.parse::<Version>().ok()?.version?;
    (version != acp::PROTOCOL_VERSION).then(|| version.to_string())
}

/// The agent's `loadSession` as the core wants it: `None` when absent. A malformed value
/// proves nothing, so it is read as "try": the load's own answer then decides (rule 6).
fn load_capability(support: acp::SessionSupport) -> Option<bool> {
    match support.load {
        acp::LoadSessionSupport::Advertised | acp::LoadSessionSupport::Malformed => Some(true),
        acp::LoadSessionSupport::NotAdvertised => support.load_false.then_some(false),
    }
}

/// The classifier's view of a JSON-RPC error.
fn classify_error(error: &RpcError) -> classify::ErrorAnswer {
    classify::ErrorAnswer {
        code: error.code,
        message: error.message.clone(),
        data_details: error
            .data
            .as_ref()
            .and_then(|d| d.get("details"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        data_present: error.data.is_some(),
    }
}

impl Engine {
    /// A fresh engine (epoch 1).
    pub fn new(config: EngineConfig) -> Result<Engine, EngineConfigError> {
        config.validate()?;
        let core = Core::new(config.core.clone(), Epoch::FIRST).map_err(EngineConfigError::Core)?;
        #[cfg(feature = "audit")]
        let checker = config.audit.then(|| Checker::new(&config.core));
        let watch = StepWatch {
            #[cfg(feature = "audit")]
            checker,
            ..StepWatch::default()
        };
        Ok(Engine::with_driver(
            config,
            Driver::with_observer(core, watch),
        ))
    }

    fn with_driver(mut config: EngineConfig, driver: Driver<StepWatch>) -> Engine {
        // A restored core keeps its own configuration; say so truthfully.
        config.core = driver.core().config().clone();
        Engine {
            driver,
            config,
            books: BTreeMap::new(),
            runtimes: SortedMap::default(),
            graveyard: VecDeque::with_capacity(GRAVEYARD_RUNTIMES),
            outlets: SortedMap::default(),
            ready: Ready::default(),
            handed: VecDeque::new(),
            actions: VecDeque::new(),
            pending_output: None,
            causes: VecDeque::with_capacity(CAUSES_REMEMBERED),
            counters: Counters {
                next_execution: 1,
                next_turn: 1,
                next_stamp: 1,
                next_token: 1,
            },
            dispatches: 0,
            stats: EngineStats::default(),
            running: false,
            hello: None,
            auth: None,
            tickets: BTreeMap::new(),
            next_ticket: 0,
            version: 1,
            durable: 0,
            writing: false,
            caller_room: 0,
            round: Round::default(),
            gated: false,
            previous_incarnation: BTreeSet::new(),
            survivors: BTreeSet::new(),
            turn_causes: BTreeMap::new(),
            spawning: BTreeSet::new(),
            waiting: BTreeMap::new(),
        }
    }

    /// The core's epoch (bumped by every restore).
    #[must_use]
    pub fn epoch(&self) -> Epoch {
        self.driver.core().epoch()
    }

    /// The configuration in force (the core part comes from the snapshot after a restore).
    #[must_use]
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The core, for inspection (`check_invariants`, `session_busy`, ...).
    #[must_use]
    pub fn core(&self) -> &Core {
        self.driver.core()
    }

    /// Shows every core step to `observer` too (a trace recorder, a checker), before its
    /// effects are carried out.
    pub fn set_observer(&mut self, observer: Box<dyn Observer + Send>) {
        self.driver.observer_mut().outer = Some(observer);
    }

    /// Re-creates a known bug in the core (feature `mutants`; the simulator only).
    #[cfg(feature = "mutants")]
    pub fn set_mutant(&mut self, mutant: Option<palisade_core::mutants::Mutant>) {
        self.driver.set_mutant(mutant);
    }

    /// The driver's counters.
    #[must_use]
    pub fn driver_stats(&self) -> palisade_core::driver::DriverStats {
        self.driver.stats()
    }

    /// Counters so far.
    #[must_use]
    pub fn stats(&self) -> EngineStats {
        let watch = self.driver.observer();
        EngineStats {
            inputs_rejected: watch.rejected,
            #[cfg(feature = "audit")]
            audit_violations: watch.violations,
            ..self.stats
        }
    }

    /// The first violations the auditor found (empty unless `EngineConfig::audit`).
    #[cfg(feature = "audit")]
    #[must_use]
    pub fn audit_violations(&self) -> &[Found] {
        &self.driver.observer().found
    }

    /// The ACP session id of the session's current conversation.
    #[must_use]
    pub fn conversation(&self, session: SessionId) -> Option<String> {
        let token = self.driver.core().conversation(session)?;
        self.books
            .get(&session)
            .and_then(|b| b.conversation.as_ref())
            .filter(|(t, _)| *t == token)
            .map(|(_, id)| id.clone())
    }

    /// Output admitted and not yet handed out (in delivery queues and coalescers), and
    /// events waiting for the caller.
    #[must_use]
    pub fn backlog(&self) -> (usize, usize) {
        let queued = self
            .outlets
            .values()
            .map(|o| o.queue.len() + o.coalescer.pending_len())
            .sum();
        (queued, self.ready.events.len())
    }

    /// Agent processes the engine still tracks (started and not yet reaped).
    #[must_use]
    pub fn runtime_count(&self) -> usize {
        self.runtimes.len()
    }

    /// The turns claimed and not yet ended, by session (after a restore: the turns the
    /// state file had in flight, which the core now recovers).
    #[must_use]
    pub fn turns_in_flight(&self) -> Vec<(SessionId, TurnId)> {
        self.books
            .iter()
            .filter_map(|(session, book)| book.turn.as_ref().map(|(turn, _)| (*session, *turn)))
            .collect()
    }

    /// Claims a new turn with `text`; it is dispatched once a runtime is ready.
    pub fn prompt(
        &mut self,
        now: Timestamp,
        session: SessionId,
        text: String,
    ) -> Result<TurnId, PromptError> {
        self.prompt_content(now, session, PromptContent::Text(text))
    }

    /// Claims a new turn with `content`; it is dispatched once a runtime is ready.
    pub fn prompt_content(
        &mut self,
        now: Timestamp,
        session: SessionId,
        text: PromptContent,
    ) -> Result<TurnId, PromptError> {
        if text.bytes() > MAX_PROMPT_BYTES {
            return Err(PromptError::TooLarge {
                bytes: text.bytes(),
            });
        }
        let turn = TurnId::new(self.counters.next_turn)
            .expect("the turn counter starts at 1 and only grows");
        // A refused ID is never offered again, so a rejection cannot wedge the counter.
        self.counters.next_turn = self.counters.next_turn.saturating_add(1);
        self.touch();
        let verdict = self.driver.handle(now, Input::Prompt { session, turn });
        if verdict == Verdict::Claimed {
            // The text must be known before the effects run: a ready runtime gets the
            // prompt in this very step.
            self.books.entry(session).or_default().turn = Some((turn, text));
            self.turn_causes.remove(&session);
        }
        self.run(now);
        match verdict {
            Verdict::Claimed => Ok(turn),
            Verdict::Reject(reason) => Err(PromptError::Rejected(reason)),
            other => {
                unreachable!("the core answers a prompt with Claimed or Reject, not {other:?}")
            }
        }
    }

    /// The user cancels the session's attempt and turn.
    pub fn cancel(&mut self, now: Timestamp, session: SessionId) -> Verdict {
        self.input(now, Input::Cancel { session })
    }

    /// Opens a client's session: remembers what its conversations are made with
    /// ([`SessionSetup`]), then resumes its runtime (begin or join, rule 1).
    pub fn open(&mut self, now: Timestamp, session: SessionId, setup: SessionSetup) -> Verdict {
        let book = self.books.entry(session).or_default();
        if setup.label.is_some() {
            book.setup.label = setup.label;
        }
        if setup.params.is_some() {
            book.setup.params = setup.params;
        }
        book.setup.history = setup.history;
        self.touch();
        let verdict = self.resume(now, session);
        // A joined attempt whose conversation is loaded already loads nothing more either.
        let loaded = self.runtimes.values().any(|r| {
            r.session == session && r.alive() && r.conversation.is_some() && r.loading.is_none()
        });
        if matches!(verdict, Verdict::AlreadyReady | Verdict::Reject(_))
            || (matches!(verdict, Verdict::Joined { .. }) && loaded)
        {
            // Nothing loads for this open: the history of a later load (a recovery's) is
            // not the caller's.
            if let Some(book) = self.books.get_mut(&session) {
                book.setup.history = false;
            }
        }
        verdict
    }

    /// The sessions the engine knows, with what they were opened with.
    pub fn sessions(&self) -> impl Iterator<Item = (SessionId, &SessionSetup)> {
        self.books
            .iter()
            .map(|(session, book)| (*session, &book.setup))
    }

    /// The client's `initialize` params: every runtime started from now on is initialized
    /// with them (the client's capabilities, so the agent knows what it may ask).
    pub fn set_client_hello(&mut self, params: RawJson) {
        if self.hello.as_ref() != Some(&params) {
            // Persisted: a restart's runtimes start before the client is back.
            self.hello = Some(params);
            self.touch();
        }
    }

    /// The client authenticated with `method` (`authenticate`) and `params`: every
    /// runtime started from now on does too, after `initialize`.
    pub fn set_client_auth(&mut self, params: RawJson) {
        let auth = Some((acp::AUTHENTICATE.to_owned(), params));
        if self.auth != auth {
            // Persisted: a restart's runtimes start before the client authenticates again.
            self.auth = auth;
            self.touch();
        }
    }

    /// The client answered the agent request shown as `ticket`
    /// ([`SessionEvent::ClientRequest`]). The answer goes to the execution that asked, if
    /// it still runs the same generation; otherwise it is dropped (and counted), never
    /// given to a successor. True if it was passed on.
    pub fn answer_client_request(
        &mut self,
        ticket: u64,
        outcome: Result<RawJson, RpcError>,
    ) -> bool {
        let Some(asked) = self.tickets.remove(&ticket) else {
            self.stats.client_answers_dropped += 1;
            return false;
        };
        let current = self
            .runtimes
            .get(&asked.execution)
            .is_some_and(|r| r.alive() && r.generation == Some(asked.generation));
        if !current {
            self.stats.client_answers_dropped += 1;
            return false;
        }
        let outcome = match outcome {
            Ok(answer) => answer
                .parse::<Value>()
                .map_err(|_| RpcError::new(codes::INTERNAL_ERROR, "unreadable answer")),
            Err(error) => Err(error),
        };
        self.act(Action::Respond {
            execution: asked.execution,
            id: asked.id,
            outcome,
        });
        true
    }

    /// Forwards a request of the caller's client to the session's agent: `method` with
    /// `params` whose `sessionId` becomes the agent's own conversation id. The answer
    /// comes back as [`SessionEvent::Forwarded`] with the ticket returned here.
    ///
    /// # Errors
    ///
    /// [`ForwardError::NoRuntime`] when the session has no live runtime with a
    /// conversation; [`ForwardError::NotAnObject`] for params that are not an object.
    pub fn forward(
        &mut self,
        now: Timestamp,
        session: SessionId,
        method: String,
        params: RawJson,
    ) -> Result<u64, ForwardError> {
        let (execution, conversation) = self
            .runtimes
            .iter()
            .filter(|(_, r)| r.session == session && r.alive())
            .find_map(|(e, r)| r.conversation.clone().map(|c| (*e, c)))
            .ok_or(ForwardError::NoRuntime)?;
        let mut members: serde_json::Map<String, Value> =
            params.parse().map_err(|_| ForwardError::NotAnObject)?;
        members.insert("sessionId".to_owned(), Value::String(conversation));
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        self.act(Action::Request {
            execution,
            op: Op::Forward { ticket },
            method: method.into(),
            params: acp::Params::Tree(Value::Object(members)),
            deadline: now.plus_millis(self.config.new_session_timeout_ms),
        });
        Ok(ticket)
    }

    /// Resumes the session's runtime without a prompt (begin or join, rule 1).
    pub fn resume(&mut self, now: Timestamp, session: SessionId) -> Verdict {
        let verdict = self.input(now, Input::Resume { session });
        if !verdict.is_reject() {
            self.books.entry(session).or_default();
        }
        verdict
    }

    /// Feeds any core input as is: callbacks from runtimes this engine does not run
    /// (remote controllers), dismissals, tests. The core fences it like any other.
    pub fn feed(&mut self, now: Timestamp, input: Input) -> Verdict {
        self.input(now, input)
    }

    /// Something the agent of `execution` sent (in wire order).
    pub fn agent_event(&mut self, now: Timestamp, execution: ExecutionId, event: AgentEvent) {
        match event {
            AgentEvent::Update {
                session_id,
                update,
                wire_bytes,
            } => {
                let update = acp::SessionUpdate { session_id, update };
                self.notification(now, execution, update, wire_bytes);
            }
            AgentEvent::Notification {
                method,
                params,
                wire_bytes,
            } => {
                if method == acp::SESSION_UPDATE {
                    // Built by hand: read as the wire reads one.
                    let update = acp::SessionUpdate::of(params.raw());
                    self.notification(now, execution, update, wire_bytes);
                } else {
                    self.stats.notifications_ignored += 1;
                }
            }
            AgentEvent::Request { id, method, params } => {
                if self.config.client == ClientSide::Forward {
                    self.client_request(now, execution, id, method, params);
                    return;
                }
                // Not an interactive client: permission requests are declined (the
                // agent's tool call is cancelled), other client methods do not exist.
                self.stats.agent_requests_refused += 1;
                let outcome = if method == "session/request_permission" {
                    Ok(json!({"outcome": {"outcome": "cancelled"}}))
                } else {
                    Err(RpcError::new(codes::METHOD_NOT_FOUND, "Method not found"))
                };
                self.act(Action::Respond {
                    execution,
                    id,
                    outcome,
                });
            }
            AgentEvent::Anomaly(_) => self.stats.anomalies += 1,
            AgentEvent::Closed(reason) => self.closed(now, execution, reason),
        }
    }

    /// The answer to an [`Action::Request`], delivered after every notification the agent
    /// wrote before it.
    pub fn reply(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        op: Op,
        result: Result<RawJson, RpcFailure>,
    ) {
        let Some(runtime) = self.runtimes.get(&execution) else {
            return;
        };
        let attempt = runtime.attempt;
        match op {
            Op::Initialize => match result {
                Ok(answer) => {
                    if let Some(version) = unsupported_protocol(&answer) {
                        // ACP: a client that does not support the version the agent
                        // answers with closes the connection and tells the user.
                        // (`FailureCause` has no variant of its own for it yet: the
                        // message says what it is.)
                        let why = format!(
                            "it answered initialize with ACP protocol version {version}; \
                             this client speaks version {} only",
                            acp::PROTOCOL_VERSION
                        );
                        let stamp = self.stamp(attempt, FailureCause::Spawn(why));
                        self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
                        return;
                    }
                    let support = acp::session_support(&answer);
                    let capability = load_capability(support);
                    if let Some(runtime) = self.runtimes.get_mut(&execution) {
                        runtime.load_capability = capability;
                        runtime.lists_sessions = support.list;
                    }
                    if let Some((method, params)) = self.auth.clone() {
                        // The client authenticated: so does every runtime, before it is
                        // ready.
                        self.act(Action::Request {
                            execution,
                            op: Op::Authenticate,
                            method: method.into(),
                            params: acp::Params::Raw(params),
                            deadline: now.plus_millis(self.config.initialize_timeout_ms),
                        });
                        return;
                    }
                    self.agent_ready(now, execution);
                }
                Err(failure) if is_transport(&failure) => {}
                Err(failure) => {
                    let stamp = self.stamp(attempt, FailureCause::Initialize(failure));
                    self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
                }
            },
            Op::Authenticate => match result {
                Ok(_) => self.agent_ready(now, execution),
                Err(failure) if is_transport(&failure) => {}
                Err(failure) => {
                    let stamp = self.stamp(attempt, FailureCause::Initialize(failure));
                    self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
                }
            },
            Op::Forward { ticket } => {
                let session = self.runtimes.get(&execution).map(|r| r.session);
                if let Some(session) = session {
                    self.emit(SessionEvent::Forwarded {
                        session,
                        ticket,
                        result,
                    });
                }
            }
            Op::Load { .. } => self.load_answer(now, execution, result),
            Op::List => self.list_answer(now, execution, result),
            Op::New { reason } => self.new_answer(now, execution, reason, result),
            Op::Prompt { turn, dispatch } => {
                self.prompt_answer(now, execution, turn, dispatch, result);
            }
        }
    }

    /// The process of `execution` is gone (`status` if it was reaped in time).
    pub fn reaped(&mut self, now: Timestamp, execution: ExecutionId, status: Option<ProcessExit>) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            if self.survivors.remove(&execution) {
                // A previous incarnation's runtime is gone: no later restart kills it.
                self.touch();
            }
            return;
        };
        if runtime.reaped.is_none() {
            runtime.reaped = Some(status);
        }
        // The connection's own Closed event follows the process's death; wait for it, so
        // it is not taken for a new runtime's.
        if runtime.close_reason.is_some() || !runtime.has_process {
            self.finish_runtime(now, execution);
        }
    }

    /// When [`Engine::handle_timeout`] must next be called: the core's next deadline (its
    /// idle rule's among them) and the coalescers'.
    fn poll_timeout(&self) -> Option<Timestamp> {
        let mut next = self.driver.poll_timeout();
        for outlet in self.outlets.values() {
            next = min_time(next, outlet.coalescer.poll_timeout());
        }
        next
    }

    /// Acts on every deadline due at `now`: the core's (its idle rule's among them) and
    /// the coalescers' (on the next [`Engine::poll_output`]).
    pub fn handle_timeout(&mut self, now: Timestamp) {
        if self.driver.poll_timeout().is_some_and(|due| due <= now) {
            self.touch();
            self.driver.handle_timeout(now);
            self.run(now);
        }
    }

    /// Feeds one input at the top of a step (the engine is idle between its public calls)
    /// and carries out everything that follows; returns its verdict.
    fn input(&mut self, now: Timestamp, input: Input) -> Verdict {
        self.submit(now, input)
            .unwrap_or(Verdict::Reject(RejectReason::Reentrant))
    }

    /// Feeds one input: at once when the engine is idle (then carries out everything that
    /// follows and returns the verdict), or, raised while carrying out effects, into the
    /// driver's inbox behind them (`None`: its verdict goes to the observers).
    fn submit(&mut self, now: Timestamp, input: Input) -> Option<Verdict> {
        self.touch();
        if self.running || !self.driver.is_idle() {
            if self.driver.enqueue(input).is_err() {
                self.stats.anomalies += 1;
            }
            return None;
        }
        let verdict = self.driver.handle(now, input);
        self.run(now);
        Some(verdict)
    }

    /// Carries out every output of the driver: effects in order (a leased one confirmed as
    /// it is pulled), then the inputs they raised, until nothing is left.
    fn run(&mut self, now: Timestamp) {
        if self.running {
            return;
        }
        self.running = true;
        loop {
            match self.driver.poll_output(now) {
                driver::Output::Effect(effect) => {
                    self.touch();
                    self.effect(now, effect);
                }
                // An input `submit` queued while effects were carried out (it returned
                // `None` for it): the observers saw its verdict, and nothing here waits for it.
                driver::Output::Verdict { .. } => {}
                driver::Output::Timeout(_) | driver::Output::Idle => break,
            }
        }
        self.running = false;
    }

    /// A callback from `execution`, stamped with its session, attempt and generation.
    fn callback(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        event: RuntimeEvent,
    ) -> Option<Verdict> {
        let runtime = self.runtimes.get(&execution)?;
        let generation = runtime.generation?;
        let callback = Callback {
            session: runtime.session,
            execution,
            attempt: Some(runtime.attempt),
            generation,
            event,
        };
        self.submit(now, Input::Callback(callback))
    }

    fn stamp(&mut self, attempt: AttemptId, cause: FailureCause) -> ErrorStamp {
        let raw = (self.counters.next_stamp & STAMP_MASK).max(1);
        self.counters.next_stamp = (raw + 1) & STAMP_MASK;
        let stamp = ErrorStamp::new(raw).expect("raw is at least 1");
        self.remember_cause(Some(stamp), attempt, cause);
        stamp
    }

    fn remember_cause(
        &mut self,
        stamp: Option<ErrorStamp>,
        attempt: AttemptId,
        cause: FailureCause,
    ) {
        if self.causes.len() == CAUSES_REMEMBERED {
            self.causes.pop_front();
        }
        self.causes.push_back(CauseEntry {
            stamp,
            attempt,
            cause,
        });
    }

    fn cause_of(&self, stamp: ErrorStamp, attempt: AttemptId) -> FailureCause {
        self.causes
            .iter()
            .rev()
            .find(|c| c.stamp == Some(stamp))
            .or_else(|| self.causes.iter().rev().find(|c| c.attempt == attempt))
            .map_or(FailureCause::CoreDeadline, |c| c.cause.clone())
    }

    /// The runtime answered `initialize` (and `authenticate`): the core hears it is ready.
    fn agent_ready(&mut self, now: Timestamp, execution: ExecutionId) {
        let Some(runtime) = self.runtimes.get(&execution) else {
            return;
        };
        let load_capability = runtime.load_capability;
        self.callback(now, execution, RuntimeEvent::AgentReady { load_capability });
    }

    /// An agent asks its client something, with a client behind the caller: shown to the
    /// caller only while the asking runtime is current (a retired one's request is
    /// refused, never shown), in order after the output before it.
    fn client_request(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        id: RequestId,
        method: String,
        params: RawJson,
    ) {
        let asker = self
            .runtimes
            .get(&execution)
            .filter(|r| r.alive())
            .and_then(|r| r.generation.map(|g| (r.session, g)));
        let Some((session, generation)) =
            asker.filter(|_| self.tickets.len() < MAX_OPEN_CLIENT_REQUESTS)
        else {
            self.stats.agent_requests_refused += 1;
            self.act(Action::Respond {
                execution,
                id,
                outcome: Err(RpcError::new(
                    codes::INTERNAL_ERROR,
                    "the client cannot be asked now",
                )),
            });
            return;
        };
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        self.tickets.insert(
            ticket,
            ClientTicket {
                execution,
                generation,
                id,
                method: method.clone(),
            },
        );
        self.stats.agent_requests_forwarded += 1;
        self.emit_after_output(
            now,
            SessionEvent::ClientRequest {
                session,
                ticket,
                method,
                params,
            },
        );
    }

    /// Closes the client requests of `execution`: all of them when its runtime is gone
    /// (the client's answers will be dropped), or, when its turn is cancelled, its open
    /// permission requests, answered `cancelled` as ACP asks of a client that cancels.
    fn close_tickets(&mut self, execution: ExecutionId, cancelled_turn: bool) {
        let open: Vec<u64> = self
            .tickets
            .iter()
            .filter(|(_, t)| {
                t.execution == execution
                    && (!cancelled_turn || t.method == acp::SESSION_REQUEST_PERMISSION)
            })
            .map(|(ticket, _)| *ticket)
            .collect();
        for ticket in open {
            let Some(asked) = self.tickets.remove(&ticket) else {
                continue;
            };
            if cancelled_turn {
                self.act(Action::Respond {
                    execution,
                    id: asked.id,
                    outcome: Ok(json!({"outcome": {"outcome": "cancelled"}})),
                });
            }
        }
    }

    /// The state changed: what is asked from now on waits for a write of this version.
    fn touch(&mut self) {
        self.version += 1;
        self.ready.version = self.version;
    }

    /// Queues an action for the shell, tagged with the state version that asked for it.
    fn act(&mut self, action: Action) {
        self.actions.push_back((self.version, action));
    }

    /// Whatever entered at `version` may leave: persistence is off, or a write of it is
    /// durable.
    fn released(&self, version: u64) -> bool {
        !self.config.persistence || version <= self.durable
    }
}
