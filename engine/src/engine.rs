//! The supervisor's logic without I/O: a [`Core`] plus what the core leaves to its
//! embedder (ACP session ids, prompt texts, request bookkeeping, lossless delivery).
//!
//! The `Supervisor` (`palisade-embed`) is a thin tokio shell around an `Engine`; the
//! engine never spawns, awaits, or reads a clock. Call order, as in the core:
//!
//! 1. feed one input: a caller command ([`Engine::prompt`], [`Engine::cancel`], ...), an
//!    agent's event ([`Engine::agent_event`]), a request's answer ([`Engine::reply`]), a
//!    process reaped ([`Engine::reaped`]), or a timeout ([`Engine::handle_timeout`] when
//!    [`Engine::poll_timeout`] is due);
//! 2. [`Engine::pump_outlets`], then persist [`Engine::encode_state`] if
//!    [`Engine::take_dirty`] says the state changed;
//! 3. carry out [`Engine::poll_action`] until `None` (spawn, send a request, stop a
//!    process, ...); results come back as inputs;
//! 4. hand [`Engine::pop_event`] to the caller while it has room, calling
//!    [`Engine::pump_outlets`] again whenever the events run out (output may still wait
//!    in a delivery queue); read more agent notifications only while
//!    [`Engine::can_accept`].
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
//!   flight, or else the prompt's answer (result or JSON-RPC error). Before that, a dead
//!   runtime rolls the turn back (the user may resend); after it, the core recovers the
//!   turn.
//! - Each `session/update` during the prompt is a `Stream` callback with a runtime
//!   sequence number from 1 per dispatch; the core's `Deliver` moves it into the session's
//!   bounded [`NotificationQueue`], then through a [`Coalescer`] to the caller.
//! - `CancelPrompt` → `session/cancel`. `StopExecution` → [`Action::Stop`] (close stdin,
//!   grace, SIGKILL, reap) then `Input::Stopped`. `KillExecution` → [`Action::Kill`].
//! - The connection closing (process exit, stdout closed, garbage) → `Exited`, and the
//!   process is killed and reaped whatever state it is in. A prompt silent for
//!   [`EngineConfig::prompt_idle_timeout_ms`] → `Exited` and kill.
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
use palisade_core::driver::{Driver, Observer, Output, Step};
use palisade_core::{
    AttemptId, Callback, ConversationToken, Core, Effect, Epoch, ErrorStamp, ExecutionId,
    Generation, Input, NewConversationReason, RejectReason, RuntimeEvent, SessionId, Timestamp,
    TurnId, TurnOutcome, Verdict,
};
use serde_json::{json, Value};

use palisade_wire::acp;
use palisade_wire::connection::{AgentEvent, CloseReason, ProcessExit, RpcFailure};
use palisade_wire::jsonrpc::{codes, RawJson, RequestId, RpcError};

use crate::config::{EngineConfig, EngineConfigError, MAX_PROMPT_BYTES, READY_EVENTS};
use crate::events::{
    self, kind_of, origin_of, ConversationOrigin, FailureCause, OutputEvent, SessionEvent,
    UpdateHead, UpdateParams,
};
use crate::replay::render_prompt;
use crate::sorted_map::SortedMap;
use crate::state::{self, ExecutionRecord, Header, QueuedOutput, SessionRecord, StateError};

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
}

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
        method: &'static str,
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
    /// SIGKILL the process and reap it; then call [`Engine::reaped`].
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
    /// Agent anomalies (garbage lines, unknown response ids, ...) seen.
    pub anomalies: u64,
    /// Runtime deaths reported to the core.
    pub exits_reported: u64,
    /// Violations the auditor found (0 unless feature `audit` and
    /// `EngineConfig::audit`).
    pub audit_violations: u64,
}

/// One `session/update` in flight to the caller; every wire byte counts toward the
/// coalescer's byte cap, whatever its kind.
#[derive(Debug, Clone, PartialEq)]
struct OutputItem {
    update: RawJson,
    wire_bytes: usize,
}

impl Payload for OutputItem {
    fn byte_len(&self) -> usize {
        self.wire_bytes
    }
}

/// A turn's delivery path: admitted output waits in the bounded queue (whose fullness
/// stops the engine from reading agents), then goes through the coalescer.
#[derive(Debug)]
struct Outlet {
    turn: TurnId,
    queue: NotificationQueue<(EventKind, OutputItem)>,
    coalescer: Coalescer<OutputItem>,
}

#[derive(Debug)]
struct PendingOutput {
    session: SessionId,
    turn: TurnId,
    kind: EventKind,
    item: OutputItem,
}

#[derive(Debug, Clone, Copy)]
struct PromptState {
    turn: TurnId,
    dispatch: u64,
    next_seq: u64,
    accepted: bool,
    idle_deadline: Timestamp,
    /// A later dispatch waits behind it: the core no longer awaits this one, so its
    /// updates and its answer only say when the agent is free again.
    superseded: bool,
}

/// One agent process the engine knows.
#[derive(Debug)]
struct Runtime {
    session: SessionId,
    attempt: AttemptId,
    generation: Option<Generation>,
    has_process: bool,
    load_capability: Option<bool>,
    /// The ACP session id being loaded.
    loading: Option<String>,
    /// Why `session/new` was sent.
    new_reason: Option<NewConversationReason>,
    /// The ACP session id this runtime's conversation has.
    conversation: Option<String>,
    prompt: Option<PromptState>,
    /// A dispatch waiting for the agent to answer the prompt before it (ACP runs one
    /// prompt at a time per session): its state and its request's params.
    held: Option<(PromptState, acp::Params)>,
    close_reason: Option<CloseReason>,
    reaped: Option<Option<ProcessExit>>,
    /// The agent advertised `session/list` in `initialize`.
    lists_sessions: bool,
    /// A failed load waiting for the agent's `session/list` before it is reported.
    listing: Option<PendingListing>,
    exit_reported: bool,
    stop_requested: bool,
    kill_requested: bool,
}

impl Runtime {
    fn alive(&self) -> bool {
        self.has_process
            && self.close_reason.is_none()
            && !self.exit_reported
            && !self.stop_requested
            && !self.kill_requested
    }

    fn transport(&self) -> TransportState {
        match &self.close_reason {
            None => TransportState::Open,
            Some(CloseReason::ProcessExited(_)) => TransportState::ProcessExited,
            Some(_) => TransportState::Closed,
        }
    }
}

/// A load failure held back while the agent's `session/list` is read.
#[derive(Debug)]
struct PendingListing {
    outcome: LoadOutcome,
    /// Pages read so far.
    pages: u32,
}

/// Events waiting for the caller, and how many output events their batches hold: the
/// engine stops moving output out of the delivery queues when either reaches
/// [`READY_EVENTS`], so backpressure starts when the caller stops reading, not 64 full
/// batches later.
#[derive(Debug, Default)]
struct Ready {
    events: VecDeque<SessionEvent>,
    outputs: usize,
}

impl Ready {
    fn push(&mut self, event: SessionEvent) {
        if let SessionEvent::Output { events, .. } = &event {
            self.outputs += events.len();
        }
        self.events.push_back(event);
    }

    fn pop(&mut self) -> Option<SessionEvent> {
        let event = self.events.pop_front()?;
        if let SessionEvent::Output { events, .. } = &event {
            self.outputs = self.outputs.saturating_sub(events.len());
        }
        Some(event)
    }
}

/// What the engine remembers of a session.
#[derive(Debug, Default)]
struct Book {
    conversation: Option<(ConversationToken, String)>,
    turn: Option<(TurnId, String)>,
    stop_reason: Option<String>,
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
    driver: Driver<Watch>,
    config: EngineConfig,
    books: BTreeMap<SessionId, Book>,
    runtimes: SortedMap<ExecutionId, Runtime>,
    graveyard: VecDeque<ExecutionRecord>,
    outlets: SortedMap<SessionId, Outlet>,
    ready: Ready,
    /// Events handed to the caller with [`Engine::hand_event`] and not yet acknowledged:
    /// still undelivered for the state, so a restart hands them out again.
    handed: VecDeque<SessionEvent>,
    actions: VecDeque<Action>,
    pending_output: Option<PendingOutput>,
    causes: VecDeque<CauseEntry>,
    counters: Counters,
    /// Dispatches so far; numbers `Op::Prompt` so an answer finds its own dispatch.
    dispatches: u64,
    stats: EngineStats,
    /// Carrying out effects: inputs raised now wait in the driver's inbox.
    running: bool,
    dirty: bool,
    gated_since: Option<Timestamp>,
    /// Executions that died with the previous incarnation (reported exited on restore).
    previous_incarnation: BTreeSet<ExecutionId>,
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
struct Watch {
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

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("rejected", &self.rejected)
            .field("outer", &self.outer.is_some())
            .finish_non_exhaustive()
    }
}

impl Observer for Watch {
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

/// The agent's `loadSession` as the core wants it: `None` when absent. A malformed value
/// proves nothing, so it is read as "try": the load's own answer then decides (rule 6).
fn load_capability(support: acp::SessionSupport) -> Option<bool> {
    match support.load {
        acp::LoadSessionSupport::Advertised | acp::LoadSessionSupport::Malformed => Some(true),
        acp::LoadSessionSupport::NotAdvertised => support.load_false.then_some(false),
    }
}

/// The classifier's view of a JSON-RPC error.
fn classify_error(error: &RpcError) -> classify::RpcError {
    classify::RpcError {
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
        let watch = Watch {
            #[cfg(feature = "audit")]
            checker,
            ..Watch::default()
        };
        Ok(Engine::with_driver(
            config,
            Driver::with_observer(core, watch),
        ))
    }

    fn with_driver(mut config: EngineConfig, driver: Driver<Watch>) -> Engine {
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
            dirty: true,
            gated_since: None,
            previous_incarnation: BTreeSet::new(),
            turn_causes: BTreeMap::new(),
            spawning: BTreeSet::new(),
            waiting: BTreeMap::new(),
        }
    }

    /// Restores a state image written by [`Engine::encode_state`]: the core comes back in
    /// the next epoch, every execution that was bound is reported exited (its process died
    /// with the previous incarnation) and stopped, and every live attempt that had no
    /// runtime yet gets one ([`Action::Spawn`]). The core's clock starts at `now` (a time
    /// the state image's core may never have seen). Persist the new state before anything
    /// else: it carries the new epoch.
    pub fn restore(
        config: EngineConfig,
        bytes: &[u8],
        now: Timestamp,
    ) -> Result<Engine, StateError> {
        Engine::restore_observed(config, bytes, now, None)
    }

    /// [`Engine::restore`], with `observer` watching from the first step (the restore's
    /// own): see [`Engine::set_observer`].
    pub fn restore_observed(
        config: EngineConfig,
        bytes: &[u8],
        now: Timestamp,
        observer: Option<Box<dyn Observer + Send>>,
    ) -> Result<Engine, StateError> {
        let decoded = state::decode(bytes)?;
        let core = Core::restore(decoded.core_snapshot).map_err(StateError::Core)?;
        // The auditor cannot know the attempts before the restart: it would flag their
        // legitimate callbacks, so it stays off. The restore's own effects (turns rolled
        // back, conversation requests re-issued) wait in the driver for the first pull.
        let watch = Watch {
            outer: observer,
            ..Watch::default()
        };
        // Restored at `now`: the core's clock starts there, not at its snapshot's last
        // step, so a clock reading earlier later cannot shorten a deadline.
        let mut engine = Engine::with_driver(config, Driver::restored(now, core, watch));
        // Live attempts that had no runtime bound: their StartRuntime was being carried out
        // when the previous incarnation died, so they get a runtime below (attempts bound
        // to a recorded execution fail when it is reported exited).
        let unbound: Vec<(SessionId, AttemptId)> = decoded
            .header
            .sessions
            .iter()
            .filter_map(|r| {
                let attempt = engine.driver.core().live_attempt(r.session)?;
                let bound = decoded
                    .header
                    .executions
                    .iter()
                    .any(|e| e.session == r.session && e.attempt == attempt);
                (!bound).then_some((r.session, attempt))
            })
            .collect();
        let header = decoded.header;
        engine.counters = Counters {
            next_execution: header.next_execution.max(1),
            next_turn: header.next_turn.max(1),
            next_stamp: header.next_stamp.max(1),
            next_token: header.next_token.max(1),
        };
        for record in header.sessions {
            if let Some((turn, items)) = record.queued_output {
                engine.restore_outlet(now, record.session, turn, items);
            }
            engine.books.insert(
                record.session,
                Book {
                    conversation: record.conversation,
                    turn: record.turn,
                    stop_reason: None,
                },
            );
        }
        // What the caller had not taken goes first.
        for event in header.undelivered {
            engine.ready.push(event);
        }
        // The runtimes died with the previous incarnation. They are reported exited after
        // the effects the restore queued (the driver's order); one of those that acts on a
        // dead runtime (a re-issued conversation request) finds it gone and reports its
        // exit first, with the same cause.
        for record in &header.executions {
            engine.bury(*record);
            engine.previous_incarnation.insert(record.execution);
        }
        for record in header.executions {
            let stamp = engine.stamp(record.attempt, FailureCause::SupervisorRestarted);
            engine.stats.exits_reported += 1;
            engine.submit(
                now,
                Input::Callback(Callback {
                    session: record.session,
                    execution: record.execution,
                    attempt: Some(record.attempt),
                    generation: record.generation,
                    event: RuntimeEvent::Exited { stamp },
                }),
            );
            // Also a teardown the core may be waiting for: the process is gone.
            engine.submit(
                now,
                Input::Stopped {
                    execution: record.execution,
                },
            );
        }
        // The restore's own effects, then the exits above, in that order.
        engine.run(now);
        for (session, attempt) in unbound {
            if engine.driver.core().live_attempt(session) == Some(attempt) {
                engine.spawn(session, attempt);
            }
        }
        engine.dirty = true;
        Ok(engine)
    }

    // ----- queries -------------------------------------------------------------------

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

    // ----- caller commands -------------------------------------------------------------

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
        if text.len() > MAX_PROMPT_BYTES {
            return Err(PromptError::TooLarge { bytes: text.len() });
        }
        let turn = TurnId::new(self.counters.next_turn)
            .expect("the turn counter starts at 1 and only grows");
        // A refused ID is never offered again, so a rejection cannot wedge the counter.
        self.counters.next_turn = self.counters.next_turn.saturating_add(1);
        self.dirty = true;
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

    // ----- what the shell reports ------------------------------------------------------

    /// The shell started (or failed to start) the agent for `attempt` after
    /// [`Action::Spawn`]: `Ok(pid)` or `Err(why)`. Returns the execution allocated to it.
    ///
    /// With [`EngineConfig::reuse_runtimes`], a process started for an attempt that was
    /// retired meanwhile goes to the session's live attempt if that one waits for it: the
    /// live attempt binds it first, then the retired attempt's own bind is reported, late,
    /// and the core decides what that may do (rule 5: nothing, once a later attempt claimed
    /// the execution).
    pub fn spawned(
        &mut self,
        now: Timestamp,
        session: SessionId,
        attempt: AttemptId,
        result: Result<Option<u32>, String>,
    ) -> ExecutionId {
        self.spawning.remove(&(session, attempt));
        let execution = ExecutionId::new(self.counters.next_execution)
            .expect("the execution counter starts at 1 and only grows");
        self.counters.next_execution = self.counters.next_execution.saturating_add(1);
        let (pid, has_process) = match &result {
            Ok(pid) => (*pid, true),
            Err(_) => (None, false),
        };
        self.runtimes.insert(
            execution,
            Runtime {
                session,
                attempt,
                generation: None,
                has_process,
                load_capability: None,
                loading: None,
                new_reason: None,
                conversation: None,
                prompt: None,
                held: None,
                close_reason: None,
                reaped: None,
                lists_sessions: false,
                listing: None,
                exit_reported: false,
                stop_requested: false,
                kill_requested: false,
            },
        );
        if let Some(successor) = self.take_waiter(session, attempt) {
            if has_process && self.take_over(now, session, attempt, successor, execution, pid) {
                return execution;
            }
            // Not taken over: the waiting attempt starts a process of its own.
            if self.driver.core().live_attempt(session) == Some(successor) {
                self.spawn(session, successor);
            }
        }
        let verdict = self.input(
            now,
            Input::Bound {
                session,
                attempt,
                execution,
            },
        );
        let Verdict::Bound { generation } = verdict else {
            // The attempt is no longer live: nobody will ever stop this process but us.
            self.kill(execution);
            if !has_process {
                self.finish_runtime(now, execution);
            }
            return execution;
        };
        self.started(now, execution, attempt, generation, pid, result.err());
        execution
    }

    /// Asks the shell to start a process for `attempt`.
    fn spawn(&mut self, session: SessionId, attempt: AttemptId) {
        self.spawning.insert((session, attempt));
        self.actions.push_back(Action::Spawn { session, attempt });
    }

    /// The live attempt of `session` that waits for the process `attempt`'s spawn started,
    /// if any (an attempt retired meanwhile waits for nothing).
    fn take_waiter(&mut self, session: SessionId, attempt: AttemptId) -> Option<AttemptId> {
        let waiter = *self.waiting.get(&session)?;
        if waiter == attempt {
            return None;
        }
        self.waiting.remove(&session);
        (self.driver.core().live_attempt(session) == Some(waiter)).then_some(waiter)
    }

    /// Runtime reuse: `successor` binds the process started for the retired `attempt`;
    /// then the retired attempt's bind is reported, late. False if the core refused the
    /// successor (then the runtime is still the retired attempt's).
    fn take_over(
        &mut self,
        now: Timestamp,
        session: SessionId,
        attempt: AttemptId,
        successor: AttemptId,
        execution: ExecutionId,
        pid: Option<u32>,
    ) -> bool {
        let verdict = self.input(
            now,
            Input::Bound {
                session,
                attempt: successor,
                execution,
            },
        );
        let Verdict::Bound { generation } = verdict else {
            return false;
        };
        if let Some(runtime) = self.runtimes.get_mut(&execution) {
            runtime.attempt = successor;
        }
        self.started(now, execution, successor, generation, pid, None);
        // The retired attempt's start completed too: a late callback of its own, which
        // the core fences (the process is the successor's now, whatever it says).
        let late = self.input(
            now,
            Input::Bound {
                session,
                attempt,
                execution,
            },
        );
        debug_assert!(
            late.is_reject(),
            "a retired attempt's bind is refused: {late:?}"
        );
        true
    }

    /// `attempt` is bound to `execution` under `generation`: tell the caller, then start
    /// the agent's connection (or report why it could not start).
    fn started(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        attempt: AttemptId,
        generation: Generation,
        pid: Option<u32>,
        spawn_error: Option<String>,
    ) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        runtime.generation = Some(generation);
        let session = runtime.session;
        self.emit(SessionEvent::RuntimeStarted {
            session,
            execution,
            attempt,
            generation,
            pid,
        });
        match spawn_error {
            Some(why) => {
                let stamp = self.stamp(attempt, FailureCause::Spawn(why));
                self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
            }
            None => {
                self.callback(now, execution, RuntimeEvent::BootReady);
                let deadline = now.plus_millis(self.config.initialize_timeout_ms);
                self.actions.push_back(Action::Request {
                    execution,
                    op: Op::Initialize,
                    method: acp::INITIALIZE,
                    params: acp::Params::Initialize,
                    deadline,
                });
            }
        }
    }

    /// Something the agent of `execution` sent (in wire order).
    pub fn agent_event(&mut self, now: Timestamp, execution: ExecutionId, event: AgentEvent) {
        match event {
            AgentEvent::Notification {
                method,
                params,
                wire_bytes,
            } => {
                if method == acp::SESSION_UPDATE {
                    self.notification(now, execution, params, wire_bytes);
                } else {
                    self.stats.notifications_ignored += 1;
                }
            }
            AgentEvent::Request { id, method, .. } => {
                // Not an interactive client: permission requests are declined (the
                // agent's tool call is cancelled), other client methods do not exist.
                self.stats.agent_requests_refused += 1;
                let outcome = if method == "session/request_permission" {
                    Ok(json!({"outcome": {"outcome": "cancelled"}}))
                } else {
                    Err(RpcError::new(codes::METHOD_NOT_FOUND, "Method not found"))
                };
                self.actions.push_back(Action::Respond {
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
                    let support = acp::session_support(&answer);
                    let capability = load_capability(support);
                    if let Some(runtime) = self.runtimes.get_mut(&execution) {
                        runtime.load_capability = capability;
                        runtime.lists_sessions = support.list;
                    }
                    self.callback(
                        now,
                        execution,
                        RuntimeEvent::AgentReady {
                            load_capability: capability,
                        },
                    );
                }
                Err(failure) if is_transport(&failure) => {}
                Err(failure) => {
                    let stamp = self.stamp(attempt, FailureCause::Initialize(failure));
                    self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
                }
            },
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

    // ----- timers ----------------------------------------------------------------------

    /// When [`Engine::handle_timeout`] must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        let mut next = self.driver.poll_timeout();
        for outlet in self.outlets.values() {
            next = min_time(next, outlet.coalescer.poll_timeout());
        }
        if self.gated_since.is_none() {
            for runtime in self.runtimes.values() {
                if let (Some(prompt), false) = (&runtime.prompt, runtime.exit_reported) {
                    next = min_time(next, Some(prompt.idle_deadline));
                }
            }
        }
        next
    }

    /// Acts on every deadline due at `now`: the core's, the coalescers' (on the next
    /// [`Engine::pump_outlets`]), and the prompt idle timeouts.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        if self.driver.poll_timeout().is_some_and(|due| due <= now) {
            self.dirty = true;
            self.driver.handle_timeout(now);
            self.run(now);
        }
        // While output waits for the caller the engine does not read agents, so their
        // silence proves nothing.
        if self.gated_since.is_none() {
            let idle: Vec<ExecutionId> = self
                .runtimes
                .iter()
                .filter(|(_, r)| {
                    !r.exit_reported && r.prompt.is_some_and(|p| p.idle_deadline <= now)
                })
                .map(|(e, _)| *e)
                .collect();
            let idle_ms = self.config.prompt_idle_timeout_ms;
            for execution in idle {
                self.report_exit(now, execution, FailureCause::PromptIdle { idle_ms });
            }
        }
    }

    // ----- delivery ----------------------------------------------------------------------

    /// Moves admitted output towards the caller: queue → coalescer → events, while fewer
    /// than [`READY_EVENTS`] wait; emits batches that are due. Call before
    /// [`Engine::poll_timeout`], and again whenever the caller took every waiting event:
    /// a full delivery queue stops [`Engine::can_accept`], and only this drains it.
    pub fn pump_outlets(&mut self, now: Timestamp) {
        let Engine { outlets, ready, .. } = self;
        let room =
            |ready: &Ready| ready.events.len() < READY_EVENTS && ready.outputs < READY_EVENTS;
        // `can_accept` as it stands after the pass, gathered on the way (a later outlet's
        // turn leaves an earlier one's queue alone).
        let mut accept = true;
        for (session, outlet) in outlets.iter_mut() {
            if let Some(batch) = outlet.coalescer.handle_timeout(now) {
                ready.push(output_event(*session, outlet.turn, batch));
            }
            while room(ready) {
                let Some((seq, (kind, item))) = outlet.queue.pop() else {
                    break;
                };
                for batch in outlet
                    .coalescer
                    .push(now, StreamEvent::new(seq, kind, item))
                {
                    ready.push(output_event(*session, outlet.turn, batch));
                }
            }
            accept &= !outlet.queue.is_full();
        }
        debug_assert_eq!(accept, self.can_accept());
        let gated = !accept;
        match (gated, self.gated_since) {
            (true, None) => self.gated_since = Some(now),
            (false, Some(since)) => {
                // Give the agents back the time we did not listen to them.
                let shift = now.millis_since(since);
                for runtime in self.runtimes.values_mut() {
                    if let Some(prompt) = runtime.prompt.as_mut() {
                        prompt.idle_deadline = prompt.idle_deadline.plus_millis(shift);
                    }
                }
                self.gated_since = None;
            }
            _ => {}
        }
    }

    /// Moves every admitted output to the caller's events now, due or not (shutdown).
    pub fn flush_output(&mut self, now: Timestamp) {
        let sessions: Vec<SessionId> = self.outlets.keys().copied().collect();
        for session in sessions {
            self.flush_outlet(now, session);
        }
    }

    /// Whether the shell may read more from the agents: every delivery queue has room for
    /// what one more agent event can add.
    #[must_use]
    pub fn can_accept(&self) -> bool {
        self.outlets.values().all(|o| !o.queue.is_full())
    }

    /// Whether events wait for the caller.
    #[must_use]
    pub fn has_events(&self) -> bool {
        !self.ready.events.is_empty()
    }

    /// The next event for the caller, delivered as it is taken: the state no longer lists
    /// it (for a caller that cannot lose what it took, e.g. one in the same process).
    pub fn pop_event(&mut self) -> Option<SessionEvent> {
        self.ready.pop()
    }

    /// The next event for the caller, kept until [`Engine::acknowledge`] says the caller
    /// is done with it: until then the state lists it undelivered, so a crash between
    /// handing it out and the caller writing it somewhere loses nothing (a restart hands
    /// it out again; at least once).
    pub fn hand_event(&mut self) -> Option<SessionEvent> {
        let event = self.ready.pop()?;
        self.handed.push_back(event.clone());
        Some(event)
    }

    /// The caller is done with the oldest `count` events [`Engine::hand_event`] handed out.
    pub fn acknowledge(&mut self, count: u64) {
        for _ in 0..count {
            if self.handed.pop_front().is_none() {
                break;
            }
        }
    }

    /// The next thing the shell must do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether the state may have changed since the last call (then persist
    /// [`Engine::encode_state`] if its bytes differ from the last written).
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// The state image to persist: the core's snapshot and the engine's own records.
    /// Bytes from [`state::BODY_OFFSET`](crate::state) on change only when the state does.
    #[must_use]
    pub fn encode_state(&self, now: Timestamp) -> Vec<u8> {
        let header = Header {
            next_execution: self.counters.next_execution,
            next_turn: self.counters.next_turn,
            next_stamp: self.counters.next_stamp,
            next_token: self.counters.next_token,
            sessions: self
                .books
                .iter()
                .map(|(session, book)| SessionRecord {
                    session: *session,
                    conversation: book.conversation.clone(),
                    turn: book.turn.clone(),
                    queued_output: self.outlets.get(session).map(|o| {
                        let batching = o.coalescer.pending().iter().map(|e| (e.seq, &e.payload));
                        let queued = o.queue.iter().map(|(seq, (_, item))| (seq, item));
                        let items = batching
                            .chain(queued)
                            .map(|(seq, item)| QueuedOutput {
                                seq: seq.get(),
                                update: item.update.clone(),
                                wire_bytes: item.wire_bytes,
                            })
                            .collect();
                        (o.turn, items)
                    }),
                })
                .collect(),
            undelivered: self
                .handed
                .iter()
                .chain(&self.ready.events)
                .cloned()
                .collect(),
            executions: self
                .runtimes
                .iter()
                .filter_map(|(execution, r)| {
                    r.generation.map(|generation| ExecutionRecord {
                        execution: *execution,
                        session: r.session,
                        attempt: r.attempt,
                        generation,
                    })
                })
                .collect(),
        };
        state::encode(now.as_millis(), &header, &self.driver.core().snapshot())
    }

    /// Rebuilds a session's delivery path from the output it held when the state was
    /// written: the caller gets it, under the seqs the core already counted.
    fn restore_outlet(
        &mut self,
        now: Timestamp,
        session: SessionId,
        turn: TurnId,
        items: Vec<QueuedOutput>,
    ) {
        // The image lists the coalescer's batch, then the queue, in seq order. The batch
        // had left the queue, so the two together may hold more than the queue's capacity:
        // the earliest go back to the coalescer, the last `capacity` to the queue, and none
        // is dropped (found by the sweep: swarm, a queue of 1, a crash with two events in
        // the coalescer lost the second).
        let capacity = self.config.delivery_queue_capacity;
        let to_coalescer = items.len().saturating_sub(capacity);
        let mut items = items.into_iter().filter_map(|item| {
            let seq = Seq::new(item.seq)?;
            let kind = kind_of(&UpdateHead::of(item.update.raw()));
            Some((
                seq,
                kind,
                OutputItem {
                    update: item.update,
                    wire_bytes: item.wire_bytes,
                },
            ))
        });
        let mut coalescer = Coalescer::new(self.config.coalescer);
        for (seq, kind, item) in items.by_ref().take(to_coalescer) {
            for batch in coalescer.push(now, StreamEvent::new(seq, kind, item)) {
                self.ready.push(output_event(session, turn, batch));
            }
        }
        let mut rest = items.peekable();
        let Some(first) = rest
            .peek()
            .map(|(seq, _, _)| *seq)
            .or_else(|| coalescer.pending().last().and_then(|e| e.seq.next()))
        else {
            return;
        };
        let mut queue = NotificationQueue::starting_at(capacity, first);
        for (_, kind, item) in rest {
            if queue.try_push((kind, item)).is_err() {
                // Cannot happen: at most `capacity` items are left for the queue.
                self.stats.anomalies += 1;
            }
        }
        self.outlets.insert(
            session,
            Outlet {
                turn,
                queue,
                coalescer,
            },
        );
    }

    // ----- internals: core plumbing --------------------------------------------------------

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
        self.dirty = true;
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
                Output::Effect(effect) => {
                    self.dirty = true;
                    self.effect(now, effect);
                }
                // An input `submit` queued while effects were carried out (it returned
                // `None` for it): the observers saw its verdict, and nothing here waits for it.
                Output::Verdict { .. } => {}
                Output::Timeout(_) | Output::Idle => break,
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

    fn emit(&mut self, event: SessionEvent) {
        self.ready.push(event);
    }

    /// An event that must follow the session's output so far.
    fn emit_after_output(&mut self, now: Timestamp, event: SessionEvent) {
        self.flush_outlet(now, event.session());
        self.ready.push(event);
    }

    fn flush_outlet(&mut self, now: Timestamp, session: SessionId) {
        let Some(outlet) = self.outlets.get_mut(&session) else {
            return;
        };
        while let Some((seq, (kind, item))) = outlet.queue.pop() {
            for batch in outlet
                .coalescer
                .push(now, StreamEvent::new(seq, kind, item))
            {
                self.ready.push(output_event(session, outlet.turn, batch));
            }
        }
        if let Some(batch) = outlet.coalescer.flush() {
            self.ready.push(output_event(session, outlet.turn, batch));
        }
    }

    // ----- internals: effects ------------------------------------------------------------

    fn effect(&mut self, now: Timestamp, effect: Effect) {
        match effect {
            Effect::StartRuntime {
                session, attempt, ..
            } => {
                // Reuse: a retired attempt's process is still being started; the new
                // attempt takes it over when it is up (see `spawned`) rather than starting
                // a second one.
                let reusable = self.config.reuse_runtimes
                    && self
                        .spawning
                        .iter()
                        .any(|(s, a)| *s == session && *a != attempt);
                if reusable {
                    self.waiting.insert(session, attempt);
                } else {
                    self.spawn(session, attempt);
                }
            }
            Effect::LoadConversation {
                session,
                execution,
                token,
                ..
            } => {
                let conversation = self
                    .books
                    .get(&session)
                    .and_then(|b| b.conversation.as_ref())
                    .filter(|(t, _)| *t == token)
                    .map(|(_, id)| id.clone());
                let Some(conversation) = conversation else {
                    if let Some(attempt) = self.runtimes.get(&execution).map(|r| r.attempt) {
                        let stamp = self.stamp(attempt, FailureCause::UnknownConversation);
                        self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
                    }
                    return;
                };
                if !self.runtimes.get(&execution).is_some_and(Runtime::alive) {
                    self.report_exit(
                        now,
                        execution,
                        FailureCause::Load(RpcFailure::TransportClosed),
                    );
                    return;
                }
                if let Some(runtime) = self.runtimes.get_mut(&execution) {
                    runtime.loading = Some(conversation.clone());
                }
                let params = acp::Params::LoadSession {
                    session_id: conversation.clone(),
                    cwd: self.config.cwd.clone(),
                };
                self.emit(SessionEvent::ConversationLoading {
                    session,
                    execution,
                    conversation,
                });
                self.actions.push_back(Action::Request {
                    execution,
                    op: Op::Load { token },
                    method: acp::SESSION_LOAD,
                    params,
                    deadline: now.plus_millis(self.config.load_timeout_ms),
                });
            }
            Effect::NewConversation {
                execution, reason, ..
            } => {
                if !self.runtimes.get(&execution).is_some_and(Runtime::alive) {
                    self.report_exit(
                        now,
                        execution,
                        FailureCause::NewSession(RpcFailure::TransportClosed),
                    );
                    return;
                }
                if let Some(runtime) = self.runtimes.get_mut(&execution) {
                    runtime.new_reason = Some(reason);
                }
                self.actions.push_back(Action::Request {
                    execution,
                    op: Op::New { reason },
                    method: acp::SESSION_NEW,
                    params: acp::Params::NewSession {
                        cwd: self.config.cwd.clone(),
                    },
                    deadline: now.plus_millis(self.config.new_session_timeout_ms),
                });
            }
            Effect::DispatchPrompt {
                session,
                execution,
                turn,
                request,
                ..
            } => {
                let text = self
                    .books
                    .get(&session)
                    .and_then(|b| b.turn.as_ref())
                    .filter(|(t, _)| *t == turn)
                    .map(|(_, text)| render_prompt(text, &request));
                let conversation = self
                    .runtimes
                    .get(&execution)
                    .filter(|r| r.alive())
                    .and_then(|r| r.conversation.clone());
                let (Some(text), Some(conversation)) = (text, conversation) else {
                    // The runtime is gone (its death is reported now, if not yet) or the
                    // text is lost: either way this runtime cannot run the turn.
                    self.report_exit(
                        now,
                        execution,
                        FailureCause::Prompt(RpcFailure::TransportClosed),
                    );
                    return;
                };
                let idle_deadline = now.plus_millis(self.config.prompt_idle_timeout_ms);
                self.dispatches += 1;
                let dispatch = self.dispatches;
                let state = PromptState {
                    turn,
                    dispatch,
                    next_seq: 1,
                    accepted: false,
                    idle_deadline,
                    superseded: false,
                };
                let params = acp::Params::Prompt {
                    session_id: conversation,
                    text,
                };
                let Some(runtime) = self.runtimes.get_mut(&execution) else {
                    return;
                };
                if let Some(earlier) = runtime.prompt.as_mut() {
                    // The agent has not answered the prompt before this one (a cancelled
                    // turn's, or an abandoned dispatch's): ACP runs one prompt at a time, and
                    // until that answer every update it writes belongs to that prompt. Send
                    // this one after it; a later dispatch replaces a held one.
                    earlier.superseded = true;
                    runtime.held = Some((state, params));
                    return;
                }
                runtime.prompt = Some(state);
                self.send_prompt(now, execution, state, params);
            }
            Effect::CancelPrompt {
                execution, turn, ..
            } => {
                // A dispatch still held behind an earlier prompt never reached the agent:
                // drop it, nothing to cancel.
                if let Some(runtime) = self.runtimes.get_mut(&execution) {
                    if runtime
                        .held
                        .as_ref()
                        .is_some_and(|(held, _)| held.turn == turn)
                    {
                        runtime.held = None;
                        return;
                    }
                }
                let conversation = self
                    .runtimes
                    .get(&execution)
                    .filter(|r| r.alive())
                    .and_then(|r| r.conversation.clone());
                if let Some(conversation) = conversation {
                    self.actions.push_back(Action::Notify {
                        execution,
                        method: acp::SESSION_CANCEL,
                        params: acp::Params::Cancel {
                            session_id: conversation,
                        },
                    });
                }
            }
            Effect::StopExecution {
                execution,
                deadline,
                ..
            } => {
                let Some(runtime) = self.runtimes.get_mut(&execution) else {
                    // Its process is already gone (or died with a previous incarnation).
                    self.submit(now, Input::Stopped { execution });
                    return;
                };
                runtime.stop_requested = true;
                runtime.prompt = None;
                runtime.held = None;
                if !runtime.has_process {
                    self.finish_runtime(now, execution);
                } else if runtime.reaped.is_none() {
                    let grace_ms = self.config.stop_grace_ms;
                    self.actions.push_back(Action::Stop {
                        execution,
                        deadline,
                        grace_ms,
                    });
                }
            }
            Effect::KillExecution { execution, .. } => self.kill(execution),
            Effect::AttemptSettled {
                session,
                attempt,
                outcome,
            } => self.emit(SessionEvent::AttemptSettled {
                session,
                attempt,
                outcome,
            }),
            Effect::JoinTimedOut { session, attempt } => {
                self.emit(SessionEvent::JoinTimedOut { session, attempt });
            }
            Effect::Deliver {
                session, turn, seq, ..
            } => self.deliver(now, session, turn, seq),
            Effect::TurnEnded {
                session,
                turn,
                outcome,
            } => {
                let book = self.books.entry(session).or_default();
                if book.turn.as_ref().is_some_and(|(t, _)| *t == turn) {
                    book.turn = None;
                }
                let stop_reason = book.stop_reason.take();
                let cause = match outcome {
                    TurnOutcome::Completed | TurnOutcome::Cancelled => None,
                    // What went wrong last for this session since the turn was claimed;
                    // nothing at all means the core gave up on a deadline of its own.
                    TurnOutcome::Failed | TurnOutcome::RolledBack => Some(
                        self.turn_causes
                            .remove(&session)
                            .unwrap_or(FailureCause::CoreDeadline),
                    ),
                };
                self.emit_after_output(
                    now,
                    SessionEvent::TurnEnded {
                        session,
                        turn,
                        outcome,
                        stop_reason,
                        cause,
                    },
                );
                // The turn's delivery path is done; the next turn gets a fresh one.
                if self.outlets.get(&session).is_some_and(|o| o.turn == turn) {
                    self.outlets.remove(&session);
                }
            }
            Effect::RecoveryStarted {
                session,
                turn,
                step,
                at,
            } => self.emit_after_output(
                now,
                SessionEvent::RecoveryStarted {
                    session,
                    turn,
                    step,
                    at,
                },
            ),
            Effect::RecoveryExhausted { session, turn } => {
                self.emit_after_output(now, SessionEvent::RecoveryExhausted { session, turn });
            }
            Effect::FailureReported { session, failure } => {
                let cause = self.cause_of(failure.stamp, failure.attempt);
                self.turn_causes.insert(session, cause.clone());
                self.emit_after_output(
                    now,
                    SessionEvent::FailureReported {
                        session,
                        failure,
                        cause,
                    },
                );
            }
        }
    }

    fn deliver(&mut self, now: Timestamp, session: SessionId, turn: TurnId, seq: u64) {
        let Some(pending) = self
            .pending_output
            .take()
            .filter(|p| p.session == session && p.turn == turn)
        else {
            // A Deliver without the output that caused it: a core bug, reported as an
            // anomaly rather than a panic.
            self.stats.anomalies += 1;
            return;
        };
        let Some(first) = Seq::new(seq) else {
            self.stats.anomalies += 1;
            return;
        };
        if self.outlets.get(&session).is_some_and(|o| o.turn != turn) {
            self.flush_outlet(now, session);
            self.outlets.remove(&session);
        }
        let capacity = self.config.delivery_queue_capacity;
        let coalescer = self.config.coalescer;
        let mutant = self.driver.core().active_mutant();
        let outlet = self.outlets.get_or_insert_with(session, || Outlet {
            turn,
            queue: NotificationQueue::starting_at(capacity, first).mutated(mutant),
            coalescer: Coalescer::new(coalescer),
        });
        let mut item = (pending.kind, pending.item);
        loop {
            match outlet.queue.try_push(item) {
                Ok(queued) => {
                    debug_assert_eq!(queued.get(), seq, "queue and core number alike");
                    self.stats.outputs_delivered += 1;
                    return;
                }
                Err(PushError::Backpressure(back) | PushError::Closed(back)) => {
                    // The shell reads no agent event while a queue is full, so this does
                    // not happen; if it ever did, the output goes to the caller now rather
                    // than being lost.
                    item = back;
                    self.stats.anomalies += 1;
                    let outlet_turn = outlet.turn;
                    while let Some((s, (k, i))) = outlet.queue.pop() {
                        for batch in outlet.coalescer.push(now, StreamEvent::new(s, k, i)) {
                            self.ready.push(output_event(session, outlet_turn, batch));
                        }
                    }
                    if outlet.queue.is_closed() {
                        return;
                    }
                }
            }
        }
    }

    // ----- internals: agent traffic ------------------------------------------------------

    fn notification(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        params: RawJson,
        wire_bytes: usize,
    ) {
        let idle_ms = self.config.prompt_idle_timeout_ms;
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            self.stats.notifications_ignored += 1;
            return;
        };
        // The params' session id and update, and the update's head, borrowed from the text.
        let parsed = UpdateParams::of(&params);
        let head = parsed.update.map(UpdateHead::of).unwrap_or_default();
        let ours = runtime.conversation.is_some()
            && parsed.session_id.as_deref() == runtime.conversation.as_deref();
        let update = parsed.update.map_or_else(RawJson::null, RawJson::from);
        // The session's own state (its commands, mode, title) is not a turn's output, nor a
        // sign the agent took a prompt: agents send it unprompted, e.g. right after
        // `session/new`, so it may arrive after a prompt was sent but before it was read.
        let session_state = events::is_session_state(&head);
        let Some(prompt) = runtime
            .prompt
            .as_mut()
            .filter(|p| ours && !session_state && !p.superseded)
        else {
            // History replayed by session/load, or chatter outside a prompt.
            self.stats.notifications_ignored += 1;
            return;
        };
        prompt.idle_deadline = now.plus_millis(idle_ms);
        let turn = prompt.turn;
        let seq = prompt.next_seq;
        prompt.next_seq += 1;
        let first = !prompt.accepted;
        prompt.accepted = true;
        let session = runtime.session;
        let kind = kind_of(&head);
        drop(head);
        if first {
            self.callback(now, execution, RuntimeEvent::PromptAccepted { turn });
        }
        self.pending_output = Some(PendingOutput {
            session,
            turn,
            kind,
            item: OutputItem { update, wire_bytes },
        });
        let bytes = u32::try_from(wire_bytes).unwrap_or(u32::MAX);
        self.callback(now, execution, RuntimeEvent::Stream { turn, seq, bytes });
        if self.pending_output.take().is_some() {
            self.stats.outputs_rejected += 1;
        }
    }

    fn load_answer(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        result: Result<RawJson, RpcFailure>,
    ) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        let conversation = runtime.loading.take().unwrap_or_default();
        let session = runtime.session;
        let attempt = runtime.attempt;
        match result {
            Ok(_) => {
                runtime.conversation = Some(conversation.clone());
                let verdict = self.callback(now, execution, RuntimeEvent::ConversationLoaded);
                if verdict == Some(Verdict::Accepted) {
                    self.emit(SessionEvent::ConversationReady {
                        session,
                        execution,
                        conversation,
                        origin: ConversationOrigin::Loaded,
                    });
                }
            }
            Err(failure) => {
                let (result, transport) = match &failure {
                    RpcFailure::Rpc(error) => {
                        (LoadFailure::Rpc(classify_error(error)), runtime.transport())
                    }
                    RpcFailure::TimedOut | RpcFailure::TooManyPending => {
                        (LoadFailure::TimedOut, runtime.transport())
                    }
                    // No answer came because the transport died; the classifier decides
                    // from the transport's state, never from the missing answer.
                    RpcFailure::TransportClosed | RpcFailure::Garbage { .. } => {
                        (LoadFailure::TimedOut, TransportState::Closed)
                    }
                    RpcFailure::ProcessExited { .. } => {
                        (LoadFailure::TimedOut, TransportState::ProcessExited)
                    }
                    RpcFailure::Killed => (LoadFailure::Cancelled, TransportState::Closed),
                };
                let outcome = LoadOutcome {
                    load_capability: runtime.load_capability,
                    requested_session: conversation,
                    result,
                    transport,
                    listing: SessionListing::Unknown,
                };
                // A "not found" is the agent's word: an agent that can list its sessions is
                // asked first whether it still has this one.
                let profile = self.config.core.agent_profile;
                let ask = runtime.alive()
                    && (runtime.lists_sessions || profile.lists_sessions())
                    && classify::classify(&outcome, profile)
                        .reason
                        .may_be_overturned_by_listing();
                // The core mints the stamp of an inconclusive load; the cause is found by
                // attempt.
                self.remember_cause(None, attempt, FailureCause::Load(failure));
                if ask {
                    if let Some(runtime) = self.runtimes.get_mut(&execution) {
                        runtime.listing = Some(PendingListing { outcome, pages: 0 });
                    }
                    self.ask_list(now, execution, None);
                    return;
                }
                self.callback(now, execution, RuntimeEvent::LoadFailed(outcome));
            }
        }
    }

    /// Sends `session/list` (from `cursor`) for the load failure held back on `execution`.
    fn ask_list(&mut self, now: Timestamp, execution: ExecutionId, cursor: Option<&str>) {
        self.actions.push_back(Action::Request {
            execution,
            op: Op::List,
            method: acp::SESSION_LIST,
            params: acp::Params::ListSessions {
                cursor: cursor.map(str::to_owned),
            },
            deadline: now.plus_millis(self.config.load_timeout_ms),
        });
    }

    /// The agent's `session/list` answered: the held-back load failure goes to the core
    /// saying whether the agent lists the session (or the next page is asked for).
    fn list_answer(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        result: Result<RawJson, RpcFailure>,
    ) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        let Some(mut pending) = runtime.listing.take() else {
            return;
        };
        match result {
            Ok(answer) => {
                // An answer no tree can hold is not a list.
                let (listed, next) = answer.parse::<Value>().map_or((None, None), |tree| {
                    acp::listed_in(&tree, &pending.outcome.requested_session)
                });
                pending.pages += 1;
                pending.outcome.listing = match (listed, next) {
                    (Some(true), _) => SessionListing::Listed,
                    (Some(false), Some(cursor)) if pending.pages < MAX_LIST_PAGES => {
                        runtime.listing = Some(pending);
                        self.ask_list(now, execution, Some(&cursor));
                        return;
                    }
                    (Some(false), None) => SessionListing::NotListed,
                    // Past the page bound, or not a list: the agent's "not found" stands.
                    _ => SessionListing::Unknown,
                };
            }
            // The connection died meanwhile: that decides, as for the load itself.
            Err(RpcFailure::TransportClosed | RpcFailure::Garbage { .. } | RpcFailure::Killed) => {
                pending.outcome.transport = TransportState::Closed;
            }
            Err(RpcFailure::ProcessExited { .. }) => {
                pending.outcome.transport = TransportState::ProcessExited;
            }
            // No list (−32601, an error, no answer in time): the "not found" stands.
            Err(_) => {}
        }
        self.callback(now, execution, RuntimeEvent::LoadFailed(pending.outcome));
    }

    fn new_answer(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        reason: NewConversationReason,
        result: Result<RawJson, RpcFailure>,
    ) {
        let Some(runtime) = self.runtimes.get(&execution) else {
            return;
        };
        let session = runtime.session;
        let attempt = runtime.attempt;
        match result {
            Ok(answer) => {
                let Some(id) = acp::string_member(&answer, "sessionId") else {
                    // As the tree prints it, whatever the agent's spacing (as written when
                    // no tree can hold it).
                    let shown = answer
                        .parse::<Value>()
                        .map_or_else(|_| answer.get().to_owned(), |tree| tree.to_string());
                    let stamp = self.stamp(attempt, FailureCause::NewSessionAnswer(shown));
                    self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
                    return;
                };
                let token = ConversationToken::new(self.counters.next_token)
                    .expect("the token counter starts at 1 and only grows");
                self.counters.next_token = self.counters.next_token.saturating_add(1);
                if let Some(runtime) = self.runtimes.get_mut(&execution) {
                    runtime.conversation = Some(id.clone());
                    runtime.new_reason = None;
                }
                // Recorded before the callback: a dispatch in the same step, and any
                // persisted state, must know which ACP session the token stands for.
                let book = self.books.entry(session).or_default();
                let previous = book.conversation.replace((token, id.clone()));
                let verdict =
                    self.callback(now, execution, RuntimeEvent::ConversationCreated { token });
                if verdict == Some(Verdict::Accepted) {
                    self.emit(SessionEvent::ConversationReady {
                        session,
                        execution,
                        conversation: id,
                        origin: origin_of(reason),
                    });
                } else if let Some(book) = self.books.get_mut(&session) {
                    // The core kept its old token: so do we.
                    book.conversation = previous;
                }
            }
            Err(failure) if is_transport(&failure) => {}
            Err(failure) => {
                let stamp = self.stamp(attempt, FailureCause::NewSession(failure));
                self.callback(now, execution, RuntimeEvent::StartFailed { stamp });
            }
        }
    }

    fn prompt_answer(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        turn: TurnId,
        dispatch: u64,
        result: Result<RawJson, RpcFailure>,
    ) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        // An answer to an earlier dispatch (one a cancel or a missed acceptance deadline
        // ended, possibly of this same turn) changes nothing.
        let Some(prompt) = runtime
            .prompt
            .filter(|p| p.turn == turn && p.dispatch == dispatch)
        else {
            return;
        };
        let session = runtime.session;
        let attempt = runtime.attempt;
        // The agent answered: a prompt held behind this one may go now, after this answer
        // is acted on.
        let held = runtime.held.take();
        if prompt.superseded {
            runtime.prompt = None;
        } else {
            self.prompt_result(now, execution, session, attempt, turn, prompt, result);
        }
        if let Some((state, params)) = held {
            if let Some(runtime) = self.runtimes.get_mut(&execution).filter(|r| r.alive()) {
                if runtime.prompt.is_none() {
                    runtime.prompt = Some(state);
                    self.send_prompt(now, execution, state, params);
                }
            }
        }
    }

    /// Sends a dispatch's `session/prompt`.
    fn send_prompt(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        state: PromptState,
        params: acp::Params,
    ) {
        self.actions.push_back(Action::Request {
            execution,
            op: Op::Prompt {
                turn: state.turn,
                dispatch: state.dispatch,
            },
            method: acp::SESSION_PROMPT,
            params,
            deadline: now.plus_millis(PROMPT_REQUEST_DEADLINE_MS),
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn prompt_result(
        &mut self,
        now: Timestamp,
        execution: ExecutionId,
        session: SessionId,
        attempt: AttemptId,
        turn: TurnId,
        prompt: PromptState,
        result: Result<RawJson, RpcFailure>,
    ) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        match result {
            Ok(answer) => {
                runtime.prompt = None;
                if !prompt.accepted {
                    self.callback(now, execution, RuntimeEvent::PromptAccepted { turn });
                }
                let stop_reason = acp::string_member(&answer, "stopReason");
                self.books.entry(session).or_default().stop_reason = stop_reason;
                self.callback(now, execution, RuntimeEvent::PromptCompleted { turn });
                if let Some(book) = self.books.get_mut(&session) {
                    book.stop_reason = None;
                }
            }
            Err(RpcFailure::Rpc(error)) => {
                runtime.prompt = None;
                // An error answer proves the agent saw the prompt: accepted, then failed.
                if !prompt.accepted {
                    self.callback(now, execution, RuntimeEvent::PromptAccepted { turn });
                }
                let cause = FailureCause::Prompt(RpcFailure::Rpc(error));
                self.turn_causes.insert(session, cause.clone());
                let stamp = self.stamp(attempt, cause);
                self.callback(now, execution, RuntimeEvent::PromptFailed { turn, stamp });
            }
            Err(failure) if is_transport(&failure) => runtime.prompt = None,
            Err(failure) => self.report_exit(now, execution, FailureCause::Prompt(failure)),
        }
    }

    fn closed(&mut self, now: Timestamp, execution: ExecutionId, reason: CloseReason) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        runtime.close_reason = Some(reason.clone());
        runtime.prompt = None;
        runtime.held = None;
        runtime.loading = None;
        // A load failure still waiting for its listing: the exit reported below ends the
        // attempt anyway.
        runtime.listing = None;
        let ours = runtime.stop_requested
            || runtime.kill_requested
            || matches!(reason, CloseReason::Killed(_));
        if !ours {
            // Process exit, stdout closed, garbage: the runtime is dead.
            self.report_exit(now, execution, FailureCause::Connection(reason));
        }
        // Whatever ended the connection, the process must not outlive it.
        self.kill(execution);
        if self
            .runtimes
            .get(&execution)
            .is_some_and(|r| r.reaped.is_some())
        {
            self.finish_runtime(now, execution);
        }
    }

    /// Tells the core the runtime is dead (once) and makes sure its process is.
    fn report_exit(&mut self, now: Timestamp, execution: ExecutionId, cause: FailureCause) {
        if let Some(runtime) = self.runtimes.get_mut(&execution) {
            if runtime.exit_reported {
                return;
            }
            runtime.exit_reported = true;
            runtime.prompt = None;
            runtime.held = None;
            let attempt = runtime.attempt;
            self.turn_causes.insert(runtime.session, cause.clone());
            let stamp = self.stamp(attempt, cause);
            self.stats.exits_reported += 1;
            self.callback(now, execution, RuntimeEvent::Exited { stamp });
            self.kill(execution);
        } else if let Some(record) = self
            .graveyard
            .iter()
            .rev()
            .find(|r| r.execution == execution)
            .copied()
        {
            // A runtime of the previous incarnation died with it, whatever found it gone.
            let cause = if self.previous_incarnation.contains(&execution) {
                FailureCause::SupervisorRestarted
            } else {
                cause
            };
            self.turn_causes.insert(record.session, cause.clone());
            let stamp = self.stamp(record.attempt, cause);
            self.stats.exits_reported += 1;
            self.submit(
                now,
                Input::Callback(Callback {
                    session: record.session,
                    execution,
                    attempt: Some(record.attempt),
                    generation: record.generation,
                    event: RuntimeEvent::Exited { stamp },
                }),
            );
        }
    }

    fn kill(&mut self, execution: ExecutionId) {
        let Some(runtime) = self.runtimes.get_mut(&execution) else {
            return;
        };
        if runtime.has_process && !runtime.kill_requested && runtime.reaped.is_none() {
            runtime.kill_requested = true;
            self.actions.push_back(Action::Kill { execution });
        }
    }

    /// The runtime is over: its process reaped and its connection closed.
    fn finish_runtime(&mut self, now: Timestamp, execution: ExecutionId) {
        let Some(runtime) = self.runtimes.remove(&execution) else {
            return;
        };
        self.dirty = true;
        if let Some(generation) = runtime.generation {
            self.bury(ExecutionRecord {
                execution,
                session: runtime.session,
                attempt: runtime.attempt,
                generation,
            });
        }
        self.emit(SessionEvent::RuntimeExited {
            session: runtime.session,
            execution,
            status: runtime.reaped.flatten(),
            reason: runtime.close_reason,
        });
        if runtime.stop_requested {
            self.submit(now, Input::Stopped { execution });
        }
    }

    fn bury(&mut self, record: ExecutionRecord) {
        if self.graveyard.len() == GRAVEYARD_RUNTIMES {
            self.graveyard.pop_front();
        }
        self.graveyard.push_back(record);
    }
}

fn output_event(session: SessionId, turn: TurnId, batch: Batch<OutputItem>) -> SessionEvent {
    SessionEvent::Output {
        session,
        turn,
        events: batch
            .into_events()
            .into_iter()
            .map(|e| OutputEvent {
                seq: e.seq.get(),
                kind: e.kind,
                update: e.payload.update,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EngineConfig {
        let mut config = EngineConfig {
            cwd: "/tmp".into(),
            audit: true,
            ..EngineConfig::default()
        };
        config.core.recovery_delays_ms = vec![50];
        config
    }

    fn session(n: u64) -> SessionId {
        SessionId::new(n).unwrap()
    }

    /// The next spawn (kills and other chores before it are skipped).
    fn spawn_action(engine: &mut Engine) -> (SessionId, AttemptId) {
        loop {
            match engine.poll_action() {
                Some(Action::Spawn { session, attempt }) => return (session, attempt),
                Some(Action::Kill { .. } | Action::Notify { .. }) => {}
                other => panic!("expected a spawn, got {other:?}"),
            }
        }
    }

    /// Answers the next request, which must be `method`.
    fn answer(
        engine: &mut Engine,
        now: Timestamp,
        execution: ExecutionId,
        method: &str,
        result: Value,
    ) {
        match engine.poll_action() {
            Some(Action::Request { op, method: m, .. }) if m == method => {
                engine.reply(now, execution, op, Ok(RawJson::from_value(&result)));
            }
            other => panic!("expected {method}, got {other:?}"),
        }
    }

    fn chunk(text: &str) -> AgentEvent {
        let params = json!({
            "sessionId": "c1",
            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
        });
        AgentEvent::Notification {
            method: acp::SESSION_UPDATE.to_owned(),
            wire_bytes: params.to_string().len(),
            params: RawJson::from_value(&params),
        }
    }

    fn events(engine: &mut Engine) -> Vec<SessionEvent> {
        std::iter::from_fn(|| engine.pop_event()).collect()
    }

    /// An event handed out is undelivered for the state until the caller is done with
    /// it: a restart before that hands it out again (stack-crash-caller-stalled found the
    /// loss when the state counted it delivered at once).
    #[test]
    fn handed_events_stay_in_the_state_until_acknowledged() {
        let now = Timestamp::from_millis(1_000);
        let mut engine = Engine::new(config()).unwrap();
        for n in 1..=3 {
            engine.prompt(now, session(n), "hello".into()).unwrap();
        }
        for n in 1..=3 {
            let (s, attempt) = spawn_action(&mut engine);
            engine.spawned(now, s, attempt, Ok(Some(40 + n)));
        }
        let names =
            |events: &[SessionEvent]| events.iter().map(SessionEvent::name).collect::<Vec<_>>();
        // What the state lists undelivered: the events a restart hands out first.
        let restored_events = |engine: &Engine| {
            let bytes = engine.encode_state(now);
            state::decode(&bytes).unwrap().header.undelivered
        };
        let before = restored_events(&engine);
        assert!(
            before.len() >= 3,
            "each runtime's start is an event: {before:?}"
        );
        // Handed out and not acknowledged: still there after a restart.
        let first = engine.hand_event().expect("an event");
        assert_eq!(names(&restored_events(&engine)), names(&before));
        // Acknowledged: gone from the state; the rest still there.
        engine.acknowledge(1);
        let after = restored_events(&engine);
        assert_eq!(names(&after[..]), names(&before[1..]), "{first:?}");
        // Taken with pop_event: delivered at once.
        let _ = engine.pop_event();
        assert_eq!(names(&restored_events(&engine)), names(&before[2..]));
    }

    #[test]
    fn restore_reports_bound_runtimes_exited_and_restarts_unbound_attempts() {
        let now = Timestamp::from_millis(1_000);
        let mut engine = Engine::new(config()).unwrap();
        // Session 1 streams on a ready runtime.
        let turn = engine.prompt(now, session(1), "hello".into()).unwrap();
        let (s, attempt) = spawn_action(&mut engine);
        let execution = engine.spawned(now, s, attempt, Ok(Some(42)));
        answer(
            &mut engine,
            now,
            execution,
            acp::INITIALIZE,
            json!({"agentCapabilities": {"loadSession": true}}),
        );
        answer(
            &mut engine,
            now,
            execution,
            acp::SESSION_NEW,
            json!({"sessionId": "c1"}),
        );
        assert!(matches!(
            engine.poll_action(),
            Some(Action::Request {
                op: Op::Prompt { .. },
                ..
            })
        ));
        engine.agent_event(now, execution, chunk("one"));
        engine.pump_outlets(now);
        // Session 2's runtime is being started when the process dies.
        engine.prompt(now, session(2), "other".into()).unwrap();
        let (_, unbound) = spawn_action(&mut engine);
        assert!(
            engine.audit_violations().is_empty(),
            "{:?}",
            engine.audit_violations()
        );
        let bytes = engine.encode_state(now);

        let later = now.plus_millis(10);
        let mut restored = Engine::restore(config(), &bytes, later).unwrap();
        assert_eq!(restored.epoch().get(), 2);
        assert_eq!(restored.conversation(session(1)).as_deref(), Some("c1"));
        // The unbound attempt gets its runtime now; the bound one's runtime is gone, and
        // the turn it carried is resumed: the restart, not the agent, took the runtime
        // down, so no recovery step is used up (issue 11).
        assert_eq!(
            restored.poll_action(),
            Some(Action::Spawn {
                session: session(2),
                attempt: unbound
            })
        );
        let after = events(&mut restored);
        assert!(
            !after
                .iter()
                .any(|e| matches!(e, SessionEvent::RecoveryStarted { .. })),
            "{after:?}"
        );
        let due = restored.poll_timeout().unwrap();
        restored.handle_timeout(due);
        let (s, attempt) = spawn_action(&mut restored);
        assert_eq!((s, attempt.epoch().get()), (session(1), 2));
        // The replacement loads the conversation and re-prompts with one replay block.
        let execution = restored.spawned(due, s, attempt, Ok(Some(43)));
        answer(
            &mut restored,
            due,
            execution,
            acp::INITIALIZE,
            json!({"agentCapabilities": {"loadSession": true}}),
        );
        answer(&mut restored, due, execution, acp::SESSION_LOAD, json!({}));
        match restored.poll_action() {
            Some(Action::Request {
                op: Op::Prompt { turn: t, .. },
                params,
                ..
            }) => {
                assert_eq!(t, turn);
                let text = params.prompt_text().unwrap();
                assert_eq!(text.matches(crate::replay::REPLAY_BLOCK_TAG).count(), 1);
                assert!(text.contains("delivered-through=\"1\""));
                assert!(text.ends_with("hello"));
            }
            other => panic!("expected the re-prompt, got {other:?}"),
        }
        restored.core().check_invariants().unwrap();
    }

    #[test]
    fn restore_during_a_load_fails_the_attempt_instead_of_loading_on_a_dead_runtime() {
        let now = Timestamp::from_millis(1_000);
        let mut engine = Engine::new(config()).unwrap();
        let first = engine.prompt(now, session(1), "first".into()).unwrap();
        let (s, attempt) = spawn_action(&mut engine);
        let execution = engine.spawned(now, s, attempt, Ok(Some(1)));
        answer(
            &mut engine,
            now,
            execution,
            acp::INITIALIZE,
            json!({"agentCapabilities": {"loadSession": true}}),
        );
        answer(
            &mut engine,
            now,
            execution,
            acp::SESSION_NEW,
            json!({"sessionId": "c1"}),
        );
        let op = prompt_request(&mut engine);
        engine.reply(
            now,
            execution,
            op,
            Ok(RawJson::from_value(&json!({"stopReason": "end_turn"}))),
        );
        engine.agent_event(
            now,
            execution,
            AgentEvent::Closed(CloseReason::ProcessExited(ProcessExit::Code(0))),
        );
        engine.reaped(now, execution, Some(ProcessExit::Code(0)));
        // The next turn needs a runtime that loads the conversation; the supervisor dies
        // while the load is in flight.
        let second = engine.prompt(now, session(1), "second".into()).unwrap();
        let (s, attempt) = spawn_action(&mut engine);
        let loading = engine.spawned(now, s, attempt, Ok(Some(2)));
        answer(
            &mut engine,
            now,
            loading,
            acp::INITIALIZE,
            json!({"agentCapabilities": {"loadSession": true}}),
        );
        assert!(matches!(
            engine.poll_action(),
            Some(Action::Request {
                op: Op::Load { .. },
                ..
            })
        ));
        let ended: Vec<_> = events(&mut engine)
            .into_iter()
            .filter_map(|e| match e {
                SessionEvent::TurnEnded { turn, .. } => Some(turn),
                _ => None,
            })
            .collect();
        assert_eq!(ended, [first]);
        let bytes = engine.encode_state(now);

        let mut restored = Engine::restore(config(), &bytes, now.plus_millis(5)).unwrap();
        let actions: Vec<Action> = std::iter::from_fn(|| restored.poll_action()).collect();
        assert!(
            actions.is_empty(),
            "nothing is sent to the dead runtime: {actions:?}"
        );
        let after = events(&mut restored);
        assert!(
            after.iter().any(|e| matches!(
                e,
                SessionEvent::FailureReported {
                    cause: FailureCause::SupervisorRestarted,
                    ..
                }
            )),
            "{after:?}"
        );
        assert!(after.iter().any(|e| matches!(
            e,
            SessionEvent::TurnEnded { turn, outcome: palisade_core::TurnOutcome::RolledBack, .. }
                if *turn == second
        )), "{after:?}");
        assert_eq!(restored.conversation(session(1)).as_deref(), Some("c1"));
        assert!(!restored.core().session_busy(session(1)));
        restored.core().check_invariants().unwrap();
    }

    #[test]
    fn an_answer_from_a_runtime_that_died_changes_nothing() {
        let now = Timestamp::from_millis(1);
        let mut engine = Engine::new(config()).unwrap();
        engine.prompt(now, session(1), "hello".into()).unwrap();
        let (s, attempt) = spawn_action(&mut engine);
        let execution = engine.spawned(now, s, attempt, Ok(Some(7)));
        engine.agent_event(
            now,
            execution,
            AgentEvent::Closed(CloseReason::StdoutClosed),
        );
        // The close is reported (the turn rolls back) and the process is killed.
        let events = events(&mut engine);
        assert!(events.iter().any(|e| matches!(
            e,
            SessionEvent::TurnEnded {
                outcome: palisade_core::TurnOutcome::RolledBack,
                ..
            }
        )));
        let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
        assert!(actions.contains(&Action::Kill { execution }), "{actions:?}");
        // A late initialize answer is ignored; reaping ends the runtime.
        engine.reply(
            now,
            execution,
            Op::Initialize,
            Ok(RawJson::from_value(&json!({}))),
        );
        assert!(engine.poll_action().is_none());
        engine.reaped(now, execution, Some(ProcessExit::Signal(9)));
        assert_eq!(engine.runtime_count(), 0);
        assert!(
            engine.audit_violations().is_empty(),
            "{:?}",
            engine.audit_violations()
        );
        engine.core().check_invariants().unwrap();
    }

    /// The next prompt request; its op.
    fn prompt_request(engine: &mut Engine) -> Op {
        loop {
            match engine.poll_action() {
                Some(Action::Request {
                    op: op @ Op::Prompt { .. },
                    ..
                }) => return op,
                Some(_) => {}
                None => panic!("no prompt dispatched"),
            }
        }
    }

    #[test]
    fn a_late_answer_to_an_abandoned_dispatch_does_not_end_the_redispatched_turn() {
        let mut config = config();
        config.core.recovery_delays_ms = vec![50, 100];
        config.core.start_deadline_ms = 1_000;
        let mut now = Timestamp::from_millis(1_000);
        let mut engine = Engine::new(config).unwrap();
        let turn = engine.prompt(now, session(1), "hello".into()).unwrap();
        let (s, attempt) = spawn_action(&mut engine);
        let first = engine.spawned(now, s, attempt, Ok(Some(1)));
        answer(
            &mut engine,
            now,
            first,
            acp::INITIALIZE,
            json!({"agentCapabilities": {"loadSession": true}}),
        );
        answer(
            &mut engine,
            now,
            first,
            acp::SESSION_NEW,
            json!({"sessionId": "c1"}),
        );
        prompt_request(&mut engine);
        engine.agent_event(now, first, chunk("one"));
        // The runtime dies under the accepted turn: recovery is scheduled.
        engine.agent_event(
            now,
            first,
            AgentEvent::Closed(CloseReason::ProcessExited(ProcessExit::Code(1))),
        );
        // Meanwhile a resume brings up a runtime that becomes the session's owner.
        assert!(matches!(
            engine.resume(now, session(1)),
            Verdict::Started { .. }
        ));
        let (s, attempt) = spawn_action(&mut engine);
        let second = engine.spawned(now, s, attempt, Ok(Some(2)));
        answer(
            &mut engine,
            now,
            second,
            acp::INITIALIZE,
            json!({"agentCapabilities": {"loadSession": true}}),
        );
        answer(&mut engine, now, second, acp::SESSION_LOAD, json!({}));
        // Recovery re-dispatches the turn to that runtime; the agent never takes it, so
        // the core's acceptance deadline abandons that dispatch and dispatches again, to
        // the same runtime.
        now = engine.poll_timeout().unwrap();
        engine.handle_timeout(now);
        let abandoned = prompt_request(&mut engine);
        // The re-dispatch waits: the agent has not answered the abandoned prompt yet, and
        // ACP runs one prompt at a time (its updates until then are that prompt's).
        while let Some(due) = engine.poll_timeout() {
            now = due;
            engine.handle_timeout(now);
            if engine
                .runtimes
                .get(&second)
                .is_some_and(|r| r.held.is_some())
            {
                break;
            }
        }
        assert!(
            !engine.actions.iter().any(|a| matches!(
                a,
                Action::Request {
                    op: Op::Prompt { .. },
                    ..
                }
            )),
            "{:?}",
            engine.actions
        );
        // The abandoned prompt answers late: nothing ends, and the held dispatch goes.
        engine.reply(
            now,
            second,
            abandoned,
            Ok(RawJson::from_value(&json!({"stopReason": "cancelled"}))),
        );
        let before = events(&mut engine);
        assert!(
            !before
                .iter()
                .any(|e| matches!(e, SessionEvent::TurnEnded { .. })),
            "{before:?}"
        );
        let current = prompt_request(&mut engine);
        assert_ne!(abandoned, current);
        // The current one ends the turn, once.
        engine.reply(
            now,
            second,
            current,
            Ok(RawJson::from_value(&json!({"stopReason": "end_turn"}))),
        );
        let ended: Vec<_> = events(&mut engine)
            .into_iter()
            .filter_map(|e| match e {
                SessionEvent::TurnEnded {
                    turn: t, outcome, ..
                } => Some((t, outcome)),
                _ => None,
            })
            .collect();
        assert_eq!(ended, [(turn, palisade_core::TurnOutcome::Completed)]);
        assert!(
            engine.audit_violations().is_empty(),
            "{:?}",
            engine.audit_violations()
        );
        engine.core().check_invariants().unwrap();
    }

    #[test]
    fn load_capability_is_absent_false_or_worth_a_try() {
        let read = |v: Value| load_capability(acp::session_support(&RawJson::from_value(&v)));
        assert_eq!(
            read(json!({"agentCapabilities": {"loadSession": true}})),
            Some(true)
        );
        assert_eq!(
            read(json!({"agentCapabilities": {"loadSession": false}})),
            Some(false)
        );
        assert_eq!(read(json!({"agentCapabilities": {}})), None);
        assert_eq!(read(json!({})), None);
        // Malformed proves nothing: try the load, and let its answer decide.
        assert_eq!(
            read(json!({"agentCapabilities": {"loadSession": "yes"}})),
            Some(true)
        );
    }

    #[test]
    fn rpc_errors_reach_the_classifier_exactly() {
        let error = RpcError::new(-32603, "Internal error")
            .with_data(json!({"details": "Session not found"}));
        let projected = classify_error(&error);
        assert_eq!(projected.code, -32603);
        assert_eq!(projected.message, "Internal error");
        assert_eq!(projected.data_details.as_deref(), Some("Session not found"));
        assert!(projected.data_present);
        let bare = classify_error(&RpcError::new(-32002, "Resource not found"));
        assert_eq!((bare.data_details, bare.data_present), (None, false));
    }

    /// A session with a ready runtime (`c1`) and one completed turn; the runtime's
    /// execution.
    fn ready_session(engine: &mut Engine, now: Timestamp) -> ExecutionId {
        engine.prompt(now, session(1), "first".into()).unwrap();
        let (s, attempt) = spawn_action(engine);
        let execution = engine.spawned(now, s, attempt, Ok(Some(1)));
        answer(
            engine,
            now,
            execution,
            acp::INITIALIZE,
            json!({"agentCapabilities": {"loadSession": true}}),
        );
        answer(
            engine,
            now,
            execution,
            acp::SESSION_NEW,
            json!({"sessionId": "c1"}),
        );
        let op = prompt_request(engine);
        engine.reply(
            now,
            execution,
            op,
            Ok(RawJson::from_value(&json!({"stopReason": "end_turn"}))),
        );
        events(engine);
        execution
    }

    fn update(kind: &str) -> AgentEvent {
        let params =
            json!({"sessionId": "c1", "update": {"sessionUpdate": kind, "availableCommands": []}});
        AgentEvent::Notification {
            method: acp::SESSION_UPDATE.to_owned(),
            wire_bytes: params.to_string().len(),
            params: RawJson::from_value(&params),
        }
    }

    #[test]
    fn an_unprompted_session_state_update_is_neither_output_nor_acceptance() {
        let now = Timestamp::from_millis(1);
        let mut engine = Engine::new(config()).unwrap();
        let execution = ready_session(&mut engine, now);
        let turn = engine.prompt(now, session(1), "second".into()).unwrap();
        prompt_request(&mut engine);
        // Written right after session/new, read after the prompt went out.
        engine.agent_event(now, execution, update("available_commands_update"));
        engine.agent_event(now, execution, update("current_mode_update"));
        engine.pump_outlets(now);
        engine.flush_output(now);
        let got = events(&mut engine);
        assert!(
            !got.iter().any(|e| matches!(e, SessionEvent::Output { .. })),
            "{got:?}"
        );
        // Not accepted: the runtime dying now rolls the turn back, with its cause.
        engine.agent_event(
            now,
            execution,
            AgentEvent::Closed(CloseReason::ProcessExited(ProcessExit::Code(1))),
        );
        let ended: Vec<_> = events(&mut engine)
            .into_iter()
            .filter_map(|e| match e {
                SessionEvent::TurnEnded {
                    turn: t,
                    outcome,
                    cause,
                    ..
                } if t == turn => Some((outcome, cause)),
                _ => None,
            })
            .collect();
        assert_eq!(
            ended,
            [(
                TurnOutcome::RolledBack,
                Some(FailureCause::Connection(CloseReason::ProcessExited(
                    ProcessExit::Code(1)
                )))
            )]
        );
    }

    #[test]
    fn a_prompt_waits_for_the_agent_to_answer_the_cancelled_one_before_it() {
        let now = Timestamp::from_millis(1);
        let mut engine = Engine::new(config()).unwrap();
        let execution = ready_session(&mut engine, now);
        let cancelled = engine.prompt(now, session(1), "second".into()).unwrap();
        let old = prompt_request(&mut engine);
        // Cancelled before the agent showed any sign of it: the turn ends at once.
        engine.cancel(now, session(1));
        let third = engine.prompt(now, session(1), "third".into()).unwrap();
        let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
        assert!(
            !actions.iter().any(|a| matches!(
                a,
                Action::Request {
                    op: Op::Prompt { .. },
                    ..
                }
            )),
            "the third prompt must wait for the agent's answer to the second: {actions:?}"
        );
        // The agent streams the cancelled prompt's output, then answers it.
        engine.agent_event(now, execution, chunk("late output of the cancelled prompt"));
        engine.reply(
            now,
            execution,
            old,
            Ok(RawJson::from_value(&json!({"stopReason": "cancelled"}))),
        );
        let new = prompt_request(&mut engine);
        engine.agent_event(now, execution, chunk("third's output"));
        engine.reply(
            now,
            execution,
            new,
            Ok(RawJson::from_value(&json!({"stopReason": "end_turn"}))),
        );
        let got = events(&mut engine);
        let outputs: Vec<(TurnId, String)> = got
            .iter()
            .filter_map(|e| match e {
                SessionEvent::Output { turn, events, .. } => Some(events.iter().map(|o| {
                    (
                        *turn,
                        o.update.parse::<Value>().unwrap()["content"]["text"].to_string(),
                    )
                })),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(
            outputs,
            [(third, "\"third's output\"".to_owned())],
            "{got:?}"
        );
        assert!(got.iter().any(|e| matches!(
            e,
            SessionEvent::TurnEnded { turn, outcome: TurnOutcome::Completed, .. } if *turn == third
        )));
        let cancelled_ends: Vec<_> = got
            .iter()
            .filter_map(|e| match e {
                SessionEvent::TurnEnded { turn, outcome, .. } if *turn == cancelled => {
                    Some(*outcome)
                }
                _ => None,
            })
            .collect();
        assert_eq!(cancelled_ends, [TurnOutcome::Cancelled]);
    }

    #[test]
    fn a_failed_prompt_ends_its_turn_with_the_agents_error() {
        let now = Timestamp::from_millis(1);
        let mut engine = Engine::new(config()).unwrap();
        let execution = ready_session(&mut engine, now);
        let turn = engine.prompt(now, session(1), "second".into()).unwrap();
        let op = prompt_request(&mut engine);
        let error = RpcError::new(-32000, "Authentication required");
        engine.reply(now, execution, op, Err(RpcFailure::Rpc(error.clone())));
        let ended: Vec<_> = events(&mut engine)
            .into_iter()
            .filter_map(|e| match e {
                SessionEvent::TurnEnded {
                    turn: t,
                    outcome,
                    cause,
                    ..
                } if t == turn => Some((outcome, cause)),
                _ => None,
            })
            .collect();
        assert_eq!(
            ended,
            [(
                TurnOutcome::Failed,
                Some(FailureCause::Prompt(RpcFailure::Rpc(error)))
            )]
        );
    }

    /// The (turn, seq) of every output event the engine hands out now, in order.
    fn output_seqs(engine: &mut Engine) -> Vec<(TurnId, u64)> {
        events(engine)
            .into_iter()
            .filter_map(|e| match e {
                SessionEvent::Output { turn, events, .. } => {
                    Some(events.into_iter().map(move |o| (turn, o.seq)))
                }
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn output_admitted_but_not_yet_handed_out_survives_a_restart() {
        let now = Timestamp::from_millis(1);
        let mut engine = Engine::new(config()).unwrap();
        let execution = ready_session(&mut engine, now);
        let turn = engine.prompt(now, session(1), "second".into()).unwrap();
        prompt_request(&mut engine);
        engine.agent_event(now, execution, chunk("one"));
        engine.agent_event(now, execution, chunk("two"));
        // Both admitted (the core counted them delivered), still batching for the caller.
        engine.pump_outlets(now);
        assert_eq!(engine.backlog().0, 2);
        let bytes = engine.encode_state(now);
        let mut restored = Engine::restore(config(), &bytes, now.plus_millis(5)).unwrap();
        restored.flush_output(now.plus_millis(5));
        let outputs = output_seqs(&mut restored);
        assert_eq!(outputs, [(turn, 1), (turn, 2)]);
    }

    /// Found by the sweep (`reports/regressions/found/restored-output-beyond-queue-capacity.json`):
    /// with a queue of one, the coalescer's batch and the queue together hold more than the
    /// queue does; a restart used to push them all back into the queue and drop what did
    /// not fit, so the caller never got event 2.
    #[test]
    fn output_beyond_the_queue_capacity_survives_a_restart() {
        let now = Timestamp::from_millis(1);
        let mut config = config();
        config.delivery_queue_capacity = 1;
        let mut engine = Engine::new(config.clone()).unwrap();
        let execution = ready_session(&mut engine, now);
        let turn = engine.prompt(now, session(1), "second".into()).unwrap();
        prompt_request(&mut engine);
        for text in ["one", "two", "three"] {
            engine.agent_event(now, execution, chunk(text));
            engine.pump_outlets(now);
        }
        // Three admitted: at most one in the queue, the rest batching for the caller.
        assert_eq!(engine.backlog().0, 3);
        let bytes = engine.encode_state(now);
        let later = now.plus_millis(5);
        let mut restored = Engine::restore(config, &bytes, later).unwrap();
        restored.pump_outlets(later);
        restored.flush_output(later);
        let outputs = output_seqs(&mut restored);
        assert_eq!(outputs, [(turn, 1), (turn, 2), (turn, 3)]);
    }

    /// The engine's side of the core driver's finding
    /// (`fuzz/regressions/callback_orderings/restore-at-a-later-time-then-a-clock-reading-earlier`):
    /// restored at a time its core never saw, then handed a clock that reads earlier, an
    /// engine must not count a new deadline from the earlier reading.
    #[test]
    fn a_restore_raises_the_clock_so_an_earlier_reading_cannot_shorten_a_deadline() {
        let config = config();
        let bytes = Engine::new(config.clone())
            .unwrap()
            .encode_state(Timestamp::from_millis(1));
        let restart = Timestamp::from_millis(120_000);
        let mut restored = Engine::restore(config.clone(), &bytes, restart).unwrap();
        let earlier = Timestamp::from_millis(119_530);
        assert!(matches!(
            restored.resume(earlier, session(1)),
            Verdict::Started { .. }
        ));
        assert_eq!(
            restored.poll_timeout(),
            Some(restart.plus_millis(config.core.start_deadline_ms))
        );
    }

    #[test]
    fn oversized_prompts_are_refused_before_the_core_sees_them() {
        let mut engine = Engine::new(config()).unwrap();
        let text = "x".repeat(MAX_PROMPT_BYTES + 1);
        assert_eq!(
            engine.prompt(Timestamp::ZERO, session(1), text),
            Err(PromptError::TooLarge {
                bytes: MAX_PROMPT_BYTES + 1
            })
        );
        assert!(engine.poll_action().is_none());
    }

    /// Runtime reuse over one cancelled resume: the user cancels while the first attempt's
    /// process is still starting and prompts again; the second attempt takes that process
    /// over when it is up (no second spawn), the first attempt's late bind is reported and
    /// refused, and the turn completes on the reused runtime. `Err` names what went wrong.
    fn reuse_serves_the_successor(mutant: Option<&str>) -> Result<(), String> {
        let now = Timestamp::from_millis(1_000);
        let mut config = config();
        config.reuse_runtimes = true;
        let mut engine = Engine::new(config).unwrap();
        #[cfg(feature = "mutants")]
        engine.set_mutant(mutant.map(|m| palisade_core::mutants::Mutant::from_name(m).unwrap()));
        #[cfg(not(feature = "mutants"))]
        assert!(mutant.is_none(), "mutants need the feature");
        engine.prompt(now, session(1), "first".into()).unwrap();
        let (s, first) = spawn_action(&mut engine);
        // Cancelled while its process starts; the retry waits for that process.
        engine.cancel(now, session(1));
        let turn = engine.prompt(now, session(1), "second".into()).unwrap();
        let second = engine
            .core()
            .live_attempt(session(1))
            .expect("a live attempt");
        assert_ne!(second, first);
        let pending: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
        assert!(
            !pending.iter().any(|a| matches!(a, Action::Spawn { .. })),
            "no second spawn while the first process starts: {pending:?}"
        );
        let _ = events(&mut engine);
        let execution = engine.spawned(now, s, first, Ok(Some(7)));
        let started: Vec<_> = events(&mut engine)
            .into_iter()
            .filter_map(|e| match e {
                SessionEvent::RuntimeStarted { attempt, .. } => Some(attempt),
                _ => None,
            })
            .collect();
        assert_eq!(started, [second], "the process serves the live attempt");
        let mut answered = 0;
        while let Some(action) = engine.poll_action() {
            match action {
                Action::Request { op, method, .. } => {
                    let result = match method {
                        acp::INITIALIZE => json!({"agentCapabilities": {"loadSession": true}}),
                        acp::SESSION_NEW => json!({"sessionId": "c1"}),
                        acp::SESSION_PROMPT => {
                            engine.agent_event(now, execution, chunk("hello"));
                            json!({"stopReason": "end_turn"})
                        }
                        other => return Err(format!("unexpected request {other}")),
                    };
                    answered += 1;
                    engine.reply(now, execution, op, Ok(RawJson::from_value(&result)));
                }
                Action::Stop { .. } | Action::Kill { .. } => {
                    return Err(format!(
                        "the reused runtime was torn down under its new attempt: {action:?}"
                    ))
                }
                other => return Err(format!("unexpected action {other:?}")),
            }
        }
        engine.flush_output(now);
        let ended: Vec<_> = events(&mut engine)
            .into_iter()
            .filter_map(|e| match e {
                SessionEvent::TurnEnded { turn, outcome, .. } => Some((turn, outcome)),
                _ => None,
            })
            .collect();
        if ended != [(turn, palisade_core::TurnOutcome::Completed)] {
            return Err(format!(
                "after {answered} answers the turns ended {ended:?}"
            ));
        }
        if engine.runtime_count() != 1 {
            return Err(format!("{} runtimes", engine.runtime_count()));
        }
        if mutant.is_none() && !engine.audit_violations().is_empty() {
            return Err(format!("{:?}", engine.audit_violations()));
        }
        Ok(())
    }

    #[test]
    fn a_retry_takes_over_the_process_its_cancelled_predecessor_started() {
        assert_eq!(reuse_serves_the_successor(None), Ok(()));
    }

    /// The same flow with the core's `old-attempt-stops-successor` bug: the retired
    /// attempt's late bind stops the process its successor took over.
    #[cfg(feature = "mutants")]
    #[test]
    fn the_old_attempt_stops_successor_mutant_breaks_reuse() {
        let err = reuse_serves_the_successor(Some("old-attempt-stops-successor")).unwrap_err();
        assert!(err.contains("torn down"), "{err}");
    }

    /// Without reuse the retry spawns a process of its own and the first one is killed.
    #[test]
    fn without_reuse_a_retry_spawns_its_own_process() {
        let now = Timestamp::from_millis(1_000);
        let mut engine = Engine::new(config()).unwrap();
        engine.prompt(now, session(1), "first".into()).unwrap();
        let (s, first) = spawn_action(&mut engine);
        engine.cancel(now, session(1));
        engine.prompt(now, session(1), "second".into()).unwrap();
        let (_, second) = spawn_action(&mut engine);
        assert_ne!(second, first);
        let late = engine.spawned(now, s, first, Ok(Some(7)));
        assert!(std::iter::from_fn(|| engine.poll_action())
            .any(|a| a == Action::Kill { execution: late }));
    }

    /// An engine with reuse on, whose session 1 has a cancelled attempt's process still
    /// starting and a retry waiting for it: (engine, session, first attempt, retry).
    fn waiting_for_a_cancelled_start(now: Timestamp) -> (Engine, SessionId, AttemptId, AttemptId) {
        let mut config = config();
        config.reuse_runtimes = true;
        let mut engine = Engine::new(config).unwrap();
        engine.prompt(now, session(1), "first".into()).unwrap();
        let (s, first) = spawn_action(&mut engine);
        engine.cancel(now, session(1));
        engine.prompt(now, session(1), "second".into()).unwrap();
        let retry = engine
            .core()
            .live_attempt(session(1))
            .expect("a live attempt");
        let _: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
        let _ = events(&mut engine);
        (engine, s, first, retry)
    }

    /// The predecessor's start failed: the waiting retry gets a spawn of its own.
    #[test]
    fn a_retry_spawns_when_the_start_it_waited_for_fails() {
        let now = Timestamp::from_millis(1_000);
        let (mut engine, s, first, retry) = waiting_for_a_cancelled_start(now);
        engine.spawned(now, s, first, Err("no such file".into()));
        let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
        assert!(
            actions.contains(&Action::Spawn {
                session: s,
                attempt: retry
            }),
            "{actions:?}"
        );
        let own = engine.spawned(now, s, retry, Ok(Some(8)));
        let started: Vec<_> = events(&mut engine)
            .into_iter()
            .filter_map(|e| match e {
                SessionEvent::RuntimeStarted {
                    attempt, execution, ..
                } => Some((attempt, execution)),
                _ => None,
            })
            .collect();
        assert_eq!(started, [(retry, own)]);
        assert!(
            engine.audit_violations().is_empty(),
            "{:?}",
            engine.audit_violations()
        );
    }

    /// A retry cancelled while it waited takes nothing over: the late process is the
    /// cancelled attempt's and goes away.
    #[test]
    fn a_cancelled_retry_does_not_take_the_process_over() {
        let now = Timestamp::from_millis(1_000);
        let (mut engine, s, first, _retry) = waiting_for_a_cancelled_start(now);
        engine.cancel(now, session(1));
        let late = engine.spawned(now, s, first, Ok(Some(7)));
        let actions: Vec<Action> = std::iter::from_fn(|| engine.poll_action()).collect();
        assert!(
            actions.iter().any(|a| matches!(a,
                Action::Kill { execution } | Action::Stop { execution, .. } if *execution == late)),
            "{actions:?}"
        );
        assert!(
            !actions
                .iter()
                .any(|a| matches!(a, Action::Spawn { .. } | Action::Request { .. })),
            "{actions:?}"
        );
        assert!(!events(&mut engine)
            .iter()
            .any(|e| matches!(e, SessionEvent::RuntimeStarted { .. })));
        assert!(
            engine.audit_violations().is_empty(),
            "{:?}",
            engine.audit_violations()
        );
    }
}
