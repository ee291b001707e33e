//! Scenario files: one named race or fault profile each, in TOML.
//!
//! A scenario says which real race it reproduces and where it comes from, what the actors
//! do (`[workload]`), which faults a seed may draw and how often (`[faults]`, swarm
//! testing: every range `[lo, hi]` is where a seed draws its *own* probability from), fixed
//! steps that re-enact a known interleaving (`[[steps]]`), the bounds of a run (`[limits]`),
//! core configuration overrides (`[core]`) and what must hold (`[expect]`).
//!
//! Every table denies unknown fields, so a typo is an error and not a silently ignored
//! setting. Every error, syntactic or semantic, names the file, line and column.
//!
//! ```toml
//! name = "cancel-storm"
//! description = "Cancels at every step of a resume."
//! source = "kandev #3636"
//!
//! [workload]
//! sessions = 4
//! turns_per_session = 2
//! agent = "codex-acp"
//!
//! [faults]
//! cancel = [0.2, 0.6]
//!
//! [[steps]]
//! at_ms = 50
//! action = "cancel"
//! session = 2
//! ```

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::path::{Path, PathBuf};

/// Larger scenario files are refused: a scenario is a page of settings, not data.
pub const MAX_SCENARIO_BYTES: u64 = 1 << 20;

// Input bounds. Every number in a scenario file is checked against these before a seed
// runs (see `docs/bounds.md`): a value past them would make the sweep hang,
// run out of memory, overflow simulated time, or fail seeds for reasons that are the
// scenario's and not the core's.

/// Longest scenario name: it becomes part of failure file names.
pub const MAX_NAME_CHARS: usize = 64;
/// Sessions: each runs its own client and agents, and a seed's cost and plan grow with
/// them (the shipped scenarios use at most 8).
pub const MAX_SESSIONS: u32 = 64;
/// Prompt turns a client sends on its own (the shipped scenarios send at most 8).
pub const MAX_TURNS_PER_SESSION: u32 = 64;
/// Notifications an agent streams in one turn; each takes at least a simulated
/// millisecond, so a turn of more would outlast any liveness window.
pub const MAX_NOTIFICATIONS_PER_TURN: u32 = 10_000;
/// Payload bytes of one notification: the coalescer's largest batch. Each event's line is
/// allocated at its size, so with the counts it is bounded jointly too
/// ([`crate::memory::MAX_SEED_MEMORY_BYTES`]).
pub const MAX_NOTIFICATION_BYTES: u32 = 1 << 20;
/// Longest workload delay (load, think, boot): the longest fault window.
pub const MAX_WORKLOAD_DELAY_MS: u64 = MAX_FAULT_WINDOW_MS;
/// Notifications in one burst: sixteen times the default 1,024-notification queue, far
/// past what compozy #454 needed, and drained within a simulated quarter second.
pub const MAX_BURST: u32 = 16_384;
/// Longest fault window: ten simulated minutes. A plan draws every fault class per
/// session per 500 ms slot, so this bounds a drawn plan (with [`MAX_SESSIONS`]).
pub const MAX_FAULT_WINDOW_MS: u64 = 600_000;
/// Longest liveness window: ten simulated minutes, longer than every default deadline.
pub const MAX_QUIESCE_MS: u64 = 600_000;
/// Shortest liveness window: a drawn fault may fire up to 500 ms (a slot) after the fault
/// window, and must still fire before the run ends.
pub const MIN_QUIESCE_MS: u64 = 1_000;
/// Anything that may still happen after the fault window (a delayed message, a repeated
/// step, a late callback, a turn's stream) must fit in this share of the liveness window,
/// so the rest is left to settle: 1/4.
pub const LATE_SHARE_OF_QUIESCE: u64 = 4;
/// Trace events per run (the livelock guard, and so the bound on a seed's work): a
/// failing seed keeps its whole trace in memory, about 220 bytes an event plus the text of
/// the events it delivers (bounded with their size: [`crate::memory`]), and a sweep keeps
/// up to 20 failing traces per scenario (the shipped scenarios allow at most 60,000; the
/// default is 200,000).
pub const MAX_EVENTS: u64 = 250_000;
/// Fixed steps: hand-written interleavings (tombstone-churn has 40).
pub const MAX_STEPS: usize = 1_000;
/// Notifications of a `burst` step without a `count`: just past the 1,024-notification
/// queue that closed compozy's connection.
pub const DEFAULT_BURST_STEP: u32 = 1_100;
/// Repetitions of a repeated `cancel` or `provider_exit` step, 1.5 s apart.
pub const MAX_STEP_REPEATS: u32 = 16;
/// Time between two repetitions of a repeated step (as the plan spaces them).
pub const STEP_REPEAT_SPACING_MS: u64 = 1_500;
/// Longest `join_wait_ms` a scenario may set: a joiner's wait ends by its own effect, so
/// it need not fit in the liveness window, only in simulated time.
pub const MAX_JOIN_WAIT_MS: u64 = MAX_QUIESCE_MS;

// A draw can always be brought within the memory budget by its sizes alone: the most
// sessions streaming the most events of a turn, every event empty, with the longest trace,
// fit (`crate::memory`).
const _: () = assert!(
    MAX_SESSIONS as u64 * MAX_NOTIFICATIONS_PER_TURN as u64 * crate::memory::EVENT_OVERHEAD_BYTES
        + crate::memory::TRACE_COPIES
            * (MAX_EVENTS * crate::memory::TRACE_LINE_BYTES
                + MAX_EVENTS / 2 * crate::memory::TRACE_LINE_BYTES)
        <= crate::memory::MAX_SEED_MEMORY_BYTES
);

/// Environment variable naming a scenarios directory searched before the built-in ones.
pub const SCENARIO_DIR_ENV: &str = "PALISADE_SCENARIOS";

/// The shipped scenarios, found from the crate's source directory at compile time. Used
/// when the current directory has no `scenarios/` (e.g. running the binary from elsewhere).
const SHIPPED_SCENARIO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios");

/// A closed range `[lo, hi]`, written in TOML as a two-element array.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bounds<T> {
    /// The smallest value (inclusive).
    pub lo: T,
    /// The largest value (inclusive).
    pub hi: T,
}

impl<T: Copy> Bounds<T> {
    /// The range holding exactly `value`.
    pub const fn exactly(value: T) -> Self {
        Bounds {
            lo: value,
            hi: value,
        }
    }

    /// `[lo, hi]`.
    pub const fn new(lo: T, hi: T) -> Self {
        Bounds { lo, hi }
    }
}

impl<T: Serialize + Copy> Serialize for Bounds<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        [self.lo, self.hi].serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Bounds<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut items = Vec::<T>::deserialize(deserializer)?;
        if items.len() != 2 {
            return Err(serde::de::Error::invalid_length(
                items.len(),
                &"a range [lo, hi] of two elements",
            ));
        }
        let hi = items.pop().expect("length checked above");
        let lo = items.pop().expect("length checked above");
        Ok(Bounds { lo, hi })
    }
}

/// A whole scenario file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// The name the CLI knows it by; a shipped scenario's name is its file name.
    pub name: String,
    /// Bumped whenever a change makes old failure files meaningless; replay refuses a
    /// failure file recorded against another version.
    #[serde(default = "default_version")]
    pub version: u32,
    /// What the scenario exercises, in a sentence or two.
    #[serde(default)]
    pub description: String,
    /// The real race it reproduces and where it comes from (PR, review comment, test).
    #[serde(default)]
    pub source: String,
    /// The actors and what they do.
    #[serde(default)]
    pub workload: Workload,
    /// The fault profile each seed draws its own probabilities from.
    #[serde(default)]
    pub faults: Faults,
    /// Fixed steps, in addition to the drawn faults.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// The bounds of one run.
    #[serde(default)]
    pub limits: Limits,
    /// Core configuration overrides; an absent field keeps the core's default.
    #[serde(default)]
    pub core: CoreOverrides,
    /// Swarm over configuration: each seed draws the core's configuration from these
    /// ranges (a value `[core]` sets is kept).
    #[serde(default)]
    pub config: ConfigSwarm,
    /// Swarm over the environment: each seed draws its agents and their streams.
    #[serde(default)]
    pub environment: EnvironmentSwarm,
    /// What must hold beyond the always-checked invariants.
    #[serde(default)]
    pub expect: Expect,
    /// Which world runs the scenario: the `Engine` world (default) or the whole
    /// supervisor stack (`sim/src/stack/`).
    #[serde(default)]
    pub world: WorldSpec,
}

/// Which production code a scenario's world runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorldKind {
    /// The production `Engine` in a discrete-event world (`sim/src/world/`).
    #[default]
    Engine,
    /// The whole supervisor stack: `palisade-supervise`'s loop, the tokio `Supervisor`,
    /// the `Engine`, the process seam, a simulated disk (`sim/src/stack/`).
    Stack,
    /// The stack world with `palisade-proxy`'s loop in front of the `Supervisor`, driven by
    /// a simulated ACP client (`sim/src/stack/proxy/`).
    Proxy,
}

impl WorldKind {
    /// The name used in scenario files.
    pub const fn name(self) -> &'static str {
        match self {
            WorldKind::Engine => "engine",
            WorldKind::Stack => "stack",
            WorldKind::Proxy => "proxy",
        }
    }

    /// Whether the world runs the supervisor stack on a simulated disk (the stack world
    /// and the proxy world, built on it).
    pub const fn is_stack(self) -> bool {
        matches!(self, WorldKind::Stack | WorldKind::Proxy)
    }
}

/// The `[world]` table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorldSpec {
    /// Which world.
    pub kind: WorldKind,
    /// Stack world only: per 500 ms slot, the probability that the next state-file write
    /// fails (ENOSPC, EIO) or is cut short by a crash (between write and rename, torn).
    pub disk_fault: Bounds<f64>,
    /// Stack world only: the probability that the caller of `palisade-supervise` goes away
    /// for good at some point of the fault window (its pipes close).
    pub caller_gone: Bounds<f64>,
    /// Stack world only: how many times the caller starts `palisade-supervise` again on
    /// the same state file after it exited on its own (end of input, a failure), with no
    /// new prompt: what a platform does at its next start. At most
    /// [`MAX_RESTARTS_AFTER_EXIT`].
    pub restarts_after_exit: u32,
    /// Stack world only: how many of the first incarnations of `palisade-supervise` get
    /// SIGTERM at a drawn moment of the fault window (a graceful stop: every agent
    /// stopped, exit 143), after which the caller starts it again on the same state file,
    /// as a service manager does after a deploy. At most [`MAX_SIGNAL_STOPS`].
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub signal_stops: u32,
    /// Stack world only: in how many of the first incarnations a second
    /// `palisade-supervise` starts on the same state file at a drawn moment of the fault
    /// window, while the first holds it, with a prompt of its own: it must be refused
    /// (exit 2) before it does anything. At most [`MAX_SIGNAL_STOPS`].
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub second_starts: u32,
    /// Stack world only: in how many of the first incarnations the machine loses power at
    /// a drawn moment of the fault window and comes back with one bit of the state file
    /// flipped (bit rot: the disk returns other bytes than were written). The supervisor
    /// started on it must refuse it (exit 2, saying why) before it does anything; a
    /// service manager does not start it again after exit 2. At most [`MAX_SIGNAL_STOPS`].
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub bit_rot: u32,
    /// Stack world only: in how many of the first incarnations the supervisor process
    /// dies (the OOM killer, a SIGKILL) while it starts its second agent (the first
    /// replacement it starts): the agent runs and its watchdog is armed, but no state
    /// write recording it lands, so the next start finds a live attempt with no runtime
    /// (a retry's spawn in flight, issue 29, class 4). At most [`MAX_SIGNAL_STOPS`].
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub spawn_crashes: u32,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// The most restarts after an exit a stack scenario may ask for.
pub const MAX_RESTARTS_AFTER_EXIT: u32 = 8;

/// The most signal stops a stack scenario may ask for.
pub const MAX_SIGNAL_STOPS: u32 = 8;

fn default_version() -> u32 {
    1
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            name: "default".into(),
            version: default_version(),
            description: String::new(),
            source: String::new(),
            workload: Workload::default(),
            faults: Faults::default(),
            steps: Vec::new(),
            limits: Limits::default(),
            core: CoreOverrides::default(),
            config: ConfigSwarm::default(),
            environment: EnvironmentSwarm::default(),
            expect: Expect::default(),
            world: WorldSpec::default(),
        }
    }
}

/// The ACP agent a runtime node imitates: each answers `session/load` the way the real one
/// does (capability, error codes, messages).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Agent {
    /// `claude-agent-acp`.
    #[default]
    ClaudeAgentAcp,
    /// `claude-code-acp`.
    ClaudeCodeAcp,
    /// `codex-acp`.
    CodexAcp,
    /// `codex-acp-ts`.
    CodexAcpTs,
    /// `gemini-cli`.
    GeminiCli,
    /// `goose`.
    Goose,
    /// `opencode`.
    Opencode,
    /// An agent without the `loadSession` capability.
    NoLoad,
}

impl Agent {
    /// Every agent, in a fixed order.
    pub const ALL: [Agent; 8] = [
        Agent::ClaudeAgentAcp,
        Agent::ClaudeCodeAcp,
        Agent::CodexAcp,
        Agent::CodexAcpTs,
        Agent::GeminiCli,
        Agent::Goose,
        Agent::Opencode,
        Agent::NoLoad,
    ];

    /// The name used in scenario files.
    pub const fn name(self) -> &'static str {
        match self {
            Agent::ClaudeAgentAcp => "claude-agent-acp",
            Agent::ClaudeCodeAcp => "claude-code-acp",
            Agent::CodexAcp => "codex-acp",
            Agent::CodexAcpTs => "codex-acp-ts",
            Agent::GeminiCli => "gemini-cli",
            Agent::Goose => "goose",
            Agent::Opencode => "opencode",
            Agent::NoLoad => "no-load",
        }
    }
}

/// The actors and what they do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Workload {
    /// Sessions (one client each), numbered from 1.
    pub sessions: u32,
    /// Prompt turns each session's client sends on its own, in addition to any `prompt`
    /// steps (so a scenario driven by steps sets it to 0).
    pub turns_per_session: u32,
    /// The agent every runtime node imitates.
    pub agent: Agent,
    /// Stream notifications per prompt turn.
    pub notifications_per_turn: Bounds<u32>,
    /// Payload bytes per notification.
    pub notification_bytes: Bounds<u32>,
    /// How long `session/load` takes.
    pub load_delay_ms: Bounds<u64>,
    /// A client's pause between its actions.
    pub think_ms: Bounds<u64>,
    /// How long an agent process takes from spawn to `agent_ready`.
    pub boot_delay_ms: Bounds<u64>,
    /// How long starting a process takes before the shell can report it (a launcher, a
    /// container): other inputs reach the engine meanwhile. `[0, 0]`: the shell reports
    /// it in the same call, as `palisade-supervise` does.
    pub spawn_delay_ms: Bounds<u64>,
    /// The engine's runtime reuse (`EngineConfig::reuse_runtimes`).
    pub reuse_runtimes: bool,
    /// Per mille of prompts whose agent goes silent after its first event (no more
    /// output, no answer, `session/cancel` ignored: a wedged agent), for the idle rule.
    #[serde(skip_serializing_if = "is_zero")]
    pub silent_per_mille: u16,
    /// Per mille of prompts whose agent stays mute before its first event (writes nothing
    /// until `session/cancel`, then answers `cancelled`), for the start deadline of a
    /// written prompt.
    #[serde(skip_serializing_if = "is_zero")]
    pub mute_per_mille: u16,
    /// Per mille of prompts before which the proxy world's client sends a
    /// `session/set_mode` (a session method the proxy forwards to the session's agent).
    #[serde(skip_serializing_if = "is_zero")]
    pub set_mode_per_mille: u16,
    /// The agents ask to be authenticated, per process (they offer one auth method and
    /// refuse every session request before `authenticate`); the proxy world's client
    /// authenticates on every connection.
    #[serde(skip_serializing_if = "is_false")]
    pub auth_required: bool,
    /// Per mille of prompts before which the proxy world's client sends a request naming a
    /// session the proxy never minted (a `session/prompt` or a `session/set_mode`): a
    /// client with a stale or mistyped id.
    #[serde(skip_serializing_if = "is_zero")]
    pub stray_per_mille: u16,
    /// The agents' runtimes outlive the orchestrator, as a sidecar runs them (kandev's
    /// agentctl): after a crash-restart they go on running, and what they write (updates,
    /// answers, their exit) reaches the restarted engine under their execution ids until
    /// it stops them. Engine world only: `palisade-supervise` and `palisade-proxy` run
    /// their agents themselves, and the agents die with them.
    #[serde(skip_serializing_if = "is_false")]
    pub sidecar: bool,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` passes a reference.
fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u16) -> bool {
    *n == 0
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            sessions: 1,
            turns_per_session: 1,
            agent: Agent::default(),
            notifications_per_turn: Bounds::new(1, 8),
            notification_bytes: Bounds::new(16, 256),
            load_delay_ms: Bounds::new(1, 50),
            think_ms: Bounds::new(1, 100),
            boot_delay_ms: Bounds::new(1, 3),
            spawn_delay_ms: Bounds::new(0, 0),
            reuse_runtimes: false,
            silent_per_mille: 0,
            mute_per_mille: 0,
            set_mode_per_mille: 0,
            auth_required: false,
            stray_per_mille: 0,
            sidecar: false,
        }
    }
}

/// The fault profile. Each probability field is a range `[lo, hi]` in `[0, 1]`: a seed
/// first draws its own probability from it (swarm testing), so some seeds see a fault
/// constantly and others never.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// A callback is delayed (up to `max_delay_ms`).
    pub delay: Bounds<f64>,
    /// A callback is delivered twice.
    pub duplicate: Bounds<f64>,
    /// Two callbacks swap places.
    pub reorder: Bounds<f64>,
    /// The client cancels at this step.
    pub cancel: Bounds<f64>,
    /// The provider process exits at this step (startup, load, mid-prompt, mid-teardown).
    pub provider_exit: Bounds<f64>,
    /// The provider emits a burst of `burst_size` notifications.
    pub burst: Bounds<f64>,
    /// `session/load` fails with one of the agent's real error answers.
    pub load_error: Bounds<f64>,
    /// `session/load` times out.
    pub load_timeout: Bounds<f64>,
    /// The orchestrator crashes and restarts from its durable snapshot.
    pub crash_restart: Bounds<f64>,
    /// A teardown hangs (never answers).
    pub hang_teardown: Bounds<f64>,
    /// The orchestrator's clock jumps forward.
    pub clock_jump: Bounds<f64>,
    /// The caller stops taking events for up to `max_stall_ms` (backpressure reaches the
    /// agents).
    pub caller_stall: Bounds<f64>,
    /// The longest a stalled caller takes no events.
    pub max_stall_ms: u64,
    /// The longest delay a delayed callback suffers.
    pub max_delay_ms: u64,
    /// Notifications in one burst.
    pub burst_size: Bounds<u32>,
}

impl Faults {
    /// Names of the probability fields, in declaration order.
    pub const PROBABILITY_NAMES: [&'static str; 12] = [
        "delay",
        "duplicate",
        "reorder",
        "cancel",
        "provider_exit",
        "burst",
        "load_error",
        "load_timeout",
        "crash_restart",
        "hang_teardown",
        "clock_jump",
        "caller_stall",
    ];

    /// Every probability range with its field name, in declaration order.
    pub fn probabilities(&self) -> [(&'static str, Bounds<f64>); 12] {
        let values = [
            self.delay,
            self.duplicate,
            self.reorder,
            self.cancel,
            self.provider_exit,
            self.burst,
            self.load_error,
            self.load_timeout,
            self.crash_restart,
            self.hang_teardown,
            self.clock_jump,
            self.caller_stall,
        ];
        std::array::from_fn(|i| (Self::PROBABILITY_NAMES[i], values[i]))
    }
}

impl Default for Faults {
    fn default() -> Self {
        let never = Bounds::exactly(0.0);
        Faults {
            delay: never,
            duplicate: never,
            reorder: never,
            cancel: never,
            provider_exit: never,
            burst: never,
            load_error: never,
            load_timeout: never,
            crash_restart: never,
            hang_teardown: never,
            clock_jump: never,
            caller_stall: never,
            max_stall_ms: 2_000,
            max_delay_ms: 500,
            // Just past the 1,024-notification queue that closed compozy's connection.
            burst_size: Bounds::new(1_025, 1_100),
        }
    }
}

/// What a fixed step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The client resumes the session (begins an attempt).
    Resume,
    /// The client sends a prompt.
    Prompt,
    /// The client cancels.
    Cancel,
    /// The client retries after a failure or cancellation.
    Retry,
    /// The session's provider process exits.
    ProviderExit,
    /// The orchestrator crashes and restarts from its snapshot.
    CrashRestart,
    /// The provider emits `count` notifications at once.
    Burst,
    /// A callback of the session's first attempt is delivered late (after `delay_ms`).
    LateCallback,
    /// The session's next teardown hangs.
    HangTeardown,
    /// The next agent to receive a prompt exits right after reading it, before any update
    /// or answer (stack worlds only; each step arms one such exit).
    ExitOnPrompt,
}

/// One fixed step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// When, in simulated milliseconds from the start.
    pub at_ms: u64,
    /// What happens.
    pub action: Action,
    /// Which session (1-based) it concerns.
    #[serde(default = "default_step_session")]
    pub session: u32,
    /// How many times (repeated actions) or how many notifications (`burst`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// An extra delay, e.g. how late a `late_callback` arrives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
}

fn default_step_session() -> u32 {
    1
}

/// The bounds of one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Faults are injected only before this simulated time.
    pub fault_window_ms: u64,
    /// Liveness bound: after the faults stop, everything must settle within this time.
    pub quiesce_ms: u64,
    /// A run recording more trace events than this is a failure (a livelock guard).
    pub max_events: u64,
    /// Seeds a sweep runs when `--seeds` is not given (the main job's size for this
    /// scenario); absent: 2,000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_seeds: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fault_window_ms: 10_000,
            // The default recovery schedule (1 s + 2 s + 4 s) plus stop deadlines fits.
            quiesce_ms: 30_000,
            max_events: 200_000,
            default_seeds: None,
        }
    }
}

/// Core configuration overrides; `None` keeps the core's default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoreOverrides {
    /// The recovery delay schedule; empty disables automatic recovery.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_delays_ms: Option<Vec<u64>>,
    /// The runtime's notification queue capacity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_capacity: Option<u32>,
    /// How long a joiner waits for a live attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join_wait_ms: Option<u64>,
    /// A generation lease's lifetime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// The deadline of a teardown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_deadline_ms: Option<u64>,
    /// The deadline of a startup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_deadline_ms: Option<u64>,
}

/// Swarm over configuration (`[config]`): with `swarm = true` each seed draws its own core
/// and engine configuration from these ranges, log-uniformly (tight values as often as
/// loose ones); a value pinned in `[core]` is kept. The drawn configuration is part of the
/// seed's plan (`plan::setup`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConfigSwarm {
    /// Whether seeds draw their configuration.
    pub swarm: bool,
    /// Steps of the recovery schedule (0: recovery disabled).
    pub recovery_steps: Bounds<u32>,
    /// Each step's delay.
    pub recovery_delay_ms: Bounds<u64>,
    /// The whole schedule at most (a drawn one is halved until it fits).
    pub recovery_total_ms: u64,
    /// How long a joiner waits.
    pub join_wait_ms: Bounds<u64>,
    /// A generation lease's lifetime.
    pub lease_ms: Bounds<u64>,
    /// The deadline of a teardown.
    pub stop_deadline_ms: Bounds<u64>,
    /// The deadline of a startup.
    pub start_deadline_ms: Bounds<u64>,
    /// Each session's delivery queue (a quarter of the seeds take the smallest).
    pub queue_capacity: Bounds<u32>,
    /// The coalescer's delay.
    pub coalesce_delay_ms: Bounds<u64>,
    /// The coalescer's event cap.
    pub coalesce_events: Bounds<u32>,
    /// The coalescer's byte cap.
    pub coalesce_bytes: Bounds<u64>,
}

impl Default for ConfigSwarm {
    fn default() -> Self {
        ConfigSwarm {
            swarm: false,
            recovery_steps: Bounds::new(0, 4),
            recovery_delay_ms: Bounds::new(1, 4_000),
            recovery_total_ms: 8_000,
            join_wait_ms: Bounds::new(1, 30_000),
            lease_ms: Bounds::new(1, 5_000),
            stop_deadline_ms: Bounds::new(1, 10_000),
            start_deadline_ms: Bounds::new(100, 10_000),
            queue_capacity: Bounds::new(1, 1_024),
            coalesce_delay_ms: Bounds::new(0, 100),
            coalesce_events: Bounds::new(1, 64),
            coalesce_bytes: Bounds::new(1, 8_192),
        }
    }
}

/// Swarm over the environment (`[environment]`): with `swarm = true` each seed draws which
/// real agent its runtimes are, how they stream, and loads of sessions they have fail with
/// any answer of the catalogue (`plan::setup`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvironmentSwarm {
    /// Whether seeds draw their environment.
    pub swarm: bool,
}

/// What must hold beyond the invariants the oracle always checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Expect {
    /// Exactly this many responses per session once everything settles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responses_per_session: Option<u32>,
    /// Whether any `session/load` may legitimately fall back to `session/new` here.
    pub fallback_allowed: bool,
    /// Coverage marks a sweep of the default size must hit at least once.
    pub min_marks: Vec<String>,
}

impl Default for Expect {
    fn default() -> Self {
        Expect {
            responses_per_session: None,
            fallback_allowed: true,
            min_marks: Vec::new(),
        }
    }
}

/// Where in a file something is, 1-based; the column counts characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Line, from 1.
    pub line: usize,
    /// Column in characters, from 1.
    pub column: usize,
}

/// Why a scenario could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScenarioErrorKind {
    /// The file could not be read.
    Read,
    /// Not valid TOML, a wrong type, or an unknown field.
    Syntax,
    /// Valid TOML describing an impossible scenario.
    Invalid,
    /// No scenario by that name.
    NotFound,
}

/// A scenario error, with the file and, where it applies, the line and column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioError {
    /// What kind of problem.
    pub kind: ScenarioErrorKind,
    /// The file concerned (or the name looked up).
    pub file: PathBuf,
    /// Where in the file.
    pub location: Option<Location>,
    /// What is wrong.
    pub message: String,
    /// The offending source line with a caret under the spot.
    pub excerpt: Option<String>,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(at) = self.location {
            write!(f, ":{}:{}", at.line, at.column)?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(excerpt) = &self.excerpt {
            write!(f, "\n{excerpt}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ScenarioError {}

/// One step of a path into the TOML document, for pointing at a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Field(&'static str),
    Index(usize),
}

/// A semantic error before it is located in the source.
#[derive(Debug)]
struct Invalid {
    path: Vec<Key>,
    message: String,
}

fn invalid(path: &[Key], message: String) -> Invalid {
    Invalid {
        path: path.to_vec(),
        message,
    }
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let read_error = |message: String| ScenarioError {
            kind: ScenarioErrorKind::Read,
            file: path.to_path_buf(),
            location: None,
            message,
            excerpt: None,
        };
        let text = crate::input::read_text_capped(path, MAX_SCENARIO_BYTES, "scenario").map_err(
            |message| {
                // The message starts with the path, which Display adds again.
                let prefix = format!("{}: ", path.display());
                read_error(
                    message
                        .strip_prefix(&prefix)
                        .unwrap_or(&message)
                        .to_string(),
                )
            },
        )?;
        Scenario::parse(&text, path)
    }

    /// Parses and validates scenario text; `file` is only used in errors.
    pub fn parse(text: &str, file: &Path) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario = toml::from_str(text).map_err(|e| {
            let at = e.span().map(|span| span.start);
            located(
                ScenarioErrorKind::Syntax,
                file,
                text,
                at,
                e.message().trim_end().to_string(),
            )
        })?;
        if let Err(bad) = scenario.validate() {
            let at = locate(text, &bad.path);
            return Err(located(
                ScenarioErrorKind::Invalid,
                file,
                text,
                at,
                bad.message,
            ));
        }
        Ok(scenario)
    }

    /// The semantic checks serde cannot express, and every bound of "Input bounds".
    /// Returns the first problem found.
    fn validate(&self) -> Result<(), Invalid> {
        use Key::{Field, Index};
        if self.name.is_empty()
            || self.name.chars().count() > MAX_NAME_CHARS
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(
                &[Field("name")],
                format!(
                    "scenario name {:?} must be 1 to {MAX_NAME_CHARS} letters, digits, '-' and '_'",
                    self.name
                ),
            ));
        }
        if self.version == 0 {
            return Err(invalid(&[Field("version")], "version starts at 1".into()));
        }

        let limits = &self.limits;
        let at = |field: &'static str| [Field("limits"), Field(field)];
        at_most(
            &at("fault_window_ms"),
            limits.fault_window_ms,
            MAX_FAULT_WINDOW_MS,
            "MAX_FAULT_WINDOW_MS, ten simulated minutes",
        )?;
        if limits.quiesce_ms < MIN_QUIESCE_MS {
            return Err(invalid(
                &at("quiesce_ms"),
                format!(
                    "quiesce_ms = {} is below {MIN_QUIESCE_MS} (MIN_QUIESCE_MS): liveness needs time to settle after faults stop, and a drawn fault may fire up to 500 ms after the fault window",
                    limits.quiesce_ms
                ),
            ));
        }
        at_most(
            &at("quiesce_ms"),
            limits.quiesce_ms,
            MAX_QUIESCE_MS,
            "MAX_QUIESCE_MS, ten simulated minutes",
        )?;
        if limits.max_events == 0 {
            return Err(invalid(
                &at("max_events"),
                "max_events must be positive".into(),
            ));
        }
        at_most(
            &at("max_events"),
            limits.max_events,
            MAX_EVENTS,
            "MAX_EVENTS: a failing seed keeps its whole trace in memory",
        )?;
        // What may still happen after the fault window must fit in this.
        let late = limits.quiesce_ms / LATE_SHARE_OF_QUIESCE;
        let late_why = "a quarter of limits.quiesce_ms: what happens after the fault window must leave the rest of the liveness window to settle, or the core is blamed for the scenario's timing";
        // The end of the window in which something may still start after the faults.
        let late_end = limits.fault_window_ms + late;

        let w = &self.workload;
        let at = |field: &'static str| [Field("workload"), Field(field)];
        if w.sessions == 0 {
            return Err(invalid(
                &at("sessions"),
                "sessions must be at least 1: a scenario without sessions has no actors".into(),
            ));
        }
        at_most(
            &at("sessions"),
            u64::from(w.sessions),
            u64::from(MAX_SESSIONS),
            "MAX_SESSIONS",
        )?;
        at_most(
            &at("turns_per_session"),
            u64::from(w.turns_per_session),
            u64::from(MAX_TURNS_PER_SESSION),
            "MAX_TURNS_PER_SESSION",
        )?;
        check_range(&at("notifications_per_turn"), w.notifications_per_turn)?;
        at_most(
            &at("notifications_per_turn"),
            u64::from(w.notifications_per_turn.hi),
            u64::from(MAX_NOTIFICATIONS_PER_TURN),
            "MAX_NOTIFICATIONS_PER_TURN",
        )?;
        // Each notification of a turn takes at least a simulated millisecond.
        at_most(
            &at("notifications_per_turn"),
            u64::from(w.notifications_per_turn.hi),
            late,
            late_why,
        )?;
        check_range(&at("notification_bytes"), w.notification_bytes)?;
        at_most(
            &at("silent_per_mille"),
            u64::from(w.silent_per_mille),
            1000,
            "a thousand per mille",
        )?;
        at_most(
            &at("mute_per_mille"),
            u64::from(w.mute_per_mille),
            1000,
            "a thousand per mille",
        )?;
        at_most(
            &at("set_mode_per_mille"),
            u64::from(w.set_mode_per_mille),
            1000,
            "a thousand per mille",
        )?;
        at_most(
            &at("stray_per_mille"),
            u64::from(w.stray_per_mille),
            1000,
            "a thousand per mille",
        )?;
        at_most(
            &at("notification_bytes"),
            u64::from(w.notification_bytes.hi),
            u64::from(MAX_NOTIFICATION_BYTES),
            "MAX_NOTIFICATION_BYTES",
        )?;
        for name in [
            "load_delay_ms",
            "think_ms",
            "boot_delay_ms",
            "spawn_delay_ms",
        ] {
            let range = match name {
                "load_delay_ms" => w.load_delay_ms,
                "think_ms" => w.think_ms,
                "boot_delay_ms" => w.boot_delay_ms,
                _ => w.spawn_delay_ms,
            };
            check_range(&at(name), range)?;
            at_most(
                &at(name),
                range.hi,
                MAX_WORKLOAD_DELAY_MS,
                "MAX_WORKLOAD_DELAY_MS",
            )?;
        }

        for (name, range, why) in [
            (
                "disk_fault",
                self.world.disk_fault,
                "disk faults need the stack world (`kind = \"stack\"`): the engine world has no state file",
            ),
            (
                "caller_gone",
                self.world.caller_gone,
                "a caller that goes away needs the stack world (`kind = \"stack\"`): the engine world has no palisade-supervise caller",
            ),
        ] {
            let path = [Field("world"), Field(name)];
            for value in [range.lo, range.hi] {
                if !(0.0..=1.0).contains(&value) {
                    return Err(invalid(
                        &path,
                        format!("probability {value} of `{name}` is outside [0, 1]"),
                    ));
                }
            }
            check_range(&path, range)?;
            if self.world.kind == WorldKind::Engine && range.hi > 0.0 {
                return Err(invalid(&path, why.into()));
            }
        }
        {
            let path = [Field("world"), Field("restarts_after_exit")];
            if self.world.restarts_after_exit > MAX_RESTARTS_AFTER_EXIT {
                return Err(invalid(
                    &path,
                    format!(
                        "{} restarts after an exit is above MAX_RESTARTS_AFTER_EXIT ({MAX_RESTARTS_AFTER_EXIT})",
                        self.world.restarts_after_exit
                    ),
                ));
            }
            if self.world.kind != WorldKind::Stack && self.world.restarts_after_exit > 0 {
                return Err(invalid(
                    &path,
                    "restarts after an exit need the stack world (`kind = \"stack\"`): only there does a caller start palisade-supervise again".into(),
                ));
            }
            // Counts of incarnations a stack-world event happens in: bounded, stack only.
            for (name, count, what, why) in [
                (
                    "signal_stops",
                    self.world.signal_stops,
                    "signal stops",
                    "signal stops need the stack world (`kind = \"stack\"`): only there is palisade-supervise signalled",
                ),
                (
                    "second_starts",
                    self.world.second_starts,
                    "second starts",
                    "second starts need the stack world (`kind = \"stack\"`): only there does palisade-supervise run on a state file",
                ),
                (
                    "bit_rot",
                    self.world.bit_rot,
                    "bit rots",
                    "bit rot needs the stack world (`kind = \"stack\"`): only there does palisade-supervise run on a state file",
                ),
                (
                    "spawn_crashes",
                    self.world.spawn_crashes,
                    "spawn crashes",
                    "spawn crashes need the stack world (`kind = \"stack\"`): only there does palisade-supervise start agents",
                ),
            ] {
                let path = [Field("world"), Field(name)];
                if count > MAX_SIGNAL_STOPS {
                    return Err(invalid(
                        &path,
                        format!("{count} {what} is above MAX_SIGNAL_STOPS ({MAX_SIGNAL_STOPS})"),
                    ));
                }
                if self.world.kind != WorldKind::Stack && count > 0 {
                    return Err(invalid(&path, why.into()));
                }
            }
            if self.world.kind.is_stack() && self.workload.sidecar {
                return Err(invalid(
                    &[Field("workload"), Field("sidecar")],
                    "the stack and proxy worlds run palisade-supervise and palisade-proxy, whose agents die with them: no sidecar runs them".into(),
                ));
            }
            if self.world.kind.is_stack() && self.workload.sessions != 1 {
                return Err(invalid(
                    &[Field("workload"), Field("sessions")],
                    "the stack world runs palisade-supervise, which drives one session: sessions must be 1".into(),
                ));
            }
        }

        for (name, range) in self.faults.probabilities() {
            let path = [Field("faults"), Field(name)];
            for value in [range.lo, range.hi] {
                if !(0.0..=1.0).contains(&value) {
                    return Err(invalid(
                        &path,
                        format!("probability {value} of `{name}` is outside [0, 1]"),
                    ));
                }
            }
            check_range(&path, range)?;
        }
        at_most(
            &[Field("faults"), Field("max_delay_ms")],
            self.faults.max_delay_ms,
            late,
            late_why,
        )?;
        at_most(
            &[Field("faults"), Field("max_stall_ms")],
            self.faults.max_stall_ms,
            MAX_WORKLOAD_DELAY_MS,
            "MAX_WORKLOAD_DELAY_MS",
        )?;
        check_range(
            &[Field("faults"), Field("burst_size")],
            self.faults.burst_size,
        )?;
        at_most(
            &[Field("faults"), Field("burst_size")],
            u64::from(self.faults.burst_size.hi),
            u64::from(MAX_BURST),
            "MAX_BURST",
        )?;

        at_most(
            &[Field("steps")],
            self.steps.len() as u64,
            MAX_STEPS as u64,
            "MAX_STEPS steps",
        )?;
        for (i, step) in self.steps.iter().enumerate() {
            let at = |field: &'static str| [Field("steps"), Index(i), Field(field)];
            if step.session == 0 || step.session > w.sessions {
                return Err(invalid(
                    &at("session"),
                    format!(
                        "missing actor: step {} names session {}, but the workload has sessions 1..={}",
                        i + 1,
                        step.session,
                        w.sessions
                    ),
                ));
            }
            if step.at_ms > limits.fault_window_ms {
                return Err(invalid(
                    &at("at_ms"),
                    format!(
                        "step {} at {} ms is after the fault window ({} ms): liveness is judged once faults stop",
                        i + 1,
                        step.at_ms,
                        limits.fault_window_ms
                    ),
                ));
            }
            if step.action == Action::ExitOnPrompt && !self.world.kind.is_stack() {
                return Err(invalid(
                    &at("action"),
                    format!(
                        "step {}: exit_on_prompt needs a stack-world scenario (the engine world's agents are not palisade-supervise's)",
                        i + 1
                    ),
                ));
            }
            let counted = matches!(
                step.action,
                Action::Cancel | Action::ProviderExit | Action::Burst
            );
            if let Some(count) = step.count {
                if !counted {
                    return Err(invalid(
                        &at("count"),
                        format!(
                            "step {}: `count` means nothing for {:?} (only cancel and provider_exit repeat, and burst counts notifications)",
                            i + 1,
                            step.action
                        ),
                    ));
                }
                if count == 0 {
                    return Err(invalid(&at("count"), "count must be at least 1".into()));
                }
                if step.action == Action::Burst {
                    at_most(
                        &at("count"),
                        u64::from(count),
                        u64::from(MAX_BURST),
                        "MAX_BURST notifications",
                    )?;
                } else {
                    at_most(
                        &at("count"),
                        u64::from(count),
                        u64::from(MAX_STEP_REPEATS),
                        "MAX_STEP_REPEATS repetitions",
                    )?;
                    let last = step.at_ms + u64::from(count - 1) * STEP_REPEAT_SPACING_MS;
                    if last > late_end {
                        return Err(invalid(
                            &at("count"),
                            format!(
                                "step {}: its last repetition fires at {last} ms, past {late_end} ms (the fault window plus {late_why})",
                                i + 1
                            ),
                        ));
                    }
                }
            }
            if let Some(delay) = step.delay_ms {
                if step.action != Action::LateCallback {
                    return Err(invalid(
                        &at("delay_ms"),
                        format!(
                            "step {}: `delay_ms` means nothing for {:?} (only late_callback is delayed)",
                            i + 1,
                            step.action
                        ),
                    ));
                }
                let arrives = step.at_ms.saturating_add(delay);
                if arrives > late_end {
                    return Err(invalid(
                        &at("delay_ms"),
                        format!(
                            "step {}: the late callback arrives at {arrives} ms, past {late_end} ms (the fault window plus {late_why})",
                            i + 1
                        ),
                    ));
                }
            }
        }

        self.validate_memory()?;
        self.validate_core()?;
        self.validate_config_swarm()?;

        for (i, mark) in self.expect.min_marks.iter().enumerate() {
            let path = [Field("expect"), Field("min_marks"), Index(i)];
            // A mark the world never records is allowed (tests/cli.rs uses one to show
            // that a required mark is enforced): it shows up as a coverage gap.
            if mark.is_empty() {
                return Err(invalid(
                    &path,
                    "a coverage mark name cannot be empty".into(),
                ));
            }
        }
        Ok(())
    }

    /// The most a seed of this scenario holds in memory, by its own stream (a drawn
    /// environment is fitted to the budget when it is drawn, `plan::setup`).
    pub fn memory(&self) -> crate::memory::SeedMemory {
        self.memory_and_source().0
    }

    /// [`Scenario::memory`], with where the most events a prompt writes come from: the
    /// notifications per turn, a drawn burst, or a `burst` step (its TOML path, and its
    /// name for messages).
    fn memory_and_source(&self) -> (crate::memory::SeedMemory, Vec<Key>, String) {
        use Key::{Field, Index};
        let w = &self.workload;
        let mut most = (
            u64::from(w.notifications_per_turn.hi),
            vec![Field("workload"), Field("notifications_per_turn")],
            "workload.notifications_per_turn".to_string(),
        );
        if self.faults.burst.hi > 0.0 && u64::from(self.faults.burst_size.hi) > most.0 {
            most = (
                u64::from(self.faults.burst_size.hi),
                vec![Field("faults"), Field("burst_size")],
                "faults.burst_size".into(),
            );
        }
        for (i, step) in self.steps.iter().enumerate() {
            if step.action != Action::Burst {
                continue;
            }
            let count = u64::from(step.count.unwrap_or(DEFAULT_BURST_STEP));
            if count > most.0 {
                most = (
                    count,
                    vec![Field("steps"), Index(i), Field("count")],
                    format!("steps[{i}].count"),
                );
            }
        }
        let memory = crate::memory::SeedMemory {
            sessions: u64::from(w.sessions),
            events_per_prompt: most.0,
            event_bytes: u64::from(w.notification_bytes.hi),
            max_events: self.limits.max_events,
        };
        (memory, most.1, most.2)
    }

    /// The counts and sizes within [`crate::memory::MAX_SEED_MEMORY_BYTES`] together. The
    /// location is where the most events a prompt writes come from when they alone are too
    /// much, else the notifications' size (which, with `max_events`, makes the trace).
    fn validate_memory(&self) -> Result<(), Invalid> {
        use Key::Field;
        let (memory, count_path, count_name) = self.memory_and_source();
        if memory.fits() {
            return Ok(());
        }
        let path = if memory.in_flight_alone_too_much() {
            count_path
        } else {
            vec![Field("workload"), Field("notification_bytes")]
        };
        Err(invalid(
            &path,
            memory.explain(
                &count_name,
                "workload.notification_bytes",
                "limits.max_events",
            ),
        ))
    }

    /// The core configuration the run builds from `[core]` and the scenario's limits (as
    /// the world does), checked by the core's own [`palisade_core::Config::validate`],
    /// and its deadlines against the liveness window: a deadline longer than the whole
    /// window can never be seen to pass.
    fn validate_core(&self) -> Result<(), Invalid> {
        use palisade_core::ConfigError;
        use Key::{Field, Index};
        let c = &self.core;
        let quiesce = self.limits.quiesce_ms;
        let path = |field: &'static str| [Field("core"), Field(field)];
        let config = self.effective_core_config();
        if let Err(e) = config.validate() {
            let field = match &e {
                ConfigError::TooManyRecoverySteps(_)
                | ConfigError::RecoveryDelayTooLong { .. }
                | ConfigError::RecoveryScheduleTooLong { .. } => "recovery_delays_ms",
                ConfigError::ZeroDeadline(name) => name,
            };
            return Err(invalid(
                &path(field),
                format!(
                    "the core refuses this configuration: {e} (palisade_core::Config::validate)"
                ),
            ));
        }
        if let Some(capacity) = c.queue_capacity {
            if capacity == 0 {
                return Err(invalid(
                    &path("queue_capacity"),
                    "queue_capacity must be at least 1".into(),
                ));
            }
            at_most(
                &path("queue_capacity"),
                u64::from(capacity),
                palisade_core::delivery::MAX_QUEUE_CAPACITY as u64,
                "palisade_core::delivery::MAX_QUEUE_CAPACITY (a larger queue is silently clamped)",
            )?;
        }
        let why =
            "limits.quiesce_ms: a deadline longer than the liveness window is never seen to pass";
        for (field, value) in [
            ("lease_ms", config.lease_ms),
            ("stop_deadline_ms", config.stop_deadline_ms),
            ("start_deadline_ms", config.start_deadline_ms),
        ] {
            at_most(&path(field), value, quiesce, why)?;
        }
        at_most(
            &path("join_wait_ms"),
            config.join_wait_ms,
            MAX_JOIN_WAIT_MS,
            "MAX_JOIN_WAIT_MS",
        )?;
        let mut total = 0u64;
        for (i, &delay) in config.recovery_delays_ms.iter().enumerate() {
            total = total.saturating_add(delay);
            if total > quiesce {
                return Err(invalid(
                    &[Field("core"), Field("recovery_delays_ms"), Index(i)],
                    format!(
                        "the recovery schedule adds up to {total} ms by step {}, past {quiesce} ms ({why})",
                        i + 1
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `[config]`'s ranges: each within what `Config::validate` accepts and the liveness
    /// window allows, so that every configuration a seed draws can run.
    fn validate_config_swarm(&self) -> Result<(), Invalid> {
        use Key::Field;
        let c = &self.config;
        if !c.swarm {
            // Nothing is drawn from the ranges: the scenario's own `[core]` runs.
            return Ok(());
        }
        let quiesce = self.limits.quiesce_ms;
        let path = |field: &'static str| [Field("config"), Field(field)];
        let why =
            "limits.quiesce_ms: a deadline longer than the liveness window is never seen to pass";
        for (field, range, lo, hi, bound) in [
            ("recovery_delay_ms", c.recovery_delay_ms, 0, quiesce, why),
            (
                "join_wait_ms",
                c.join_wait_ms,
                1,
                MAX_JOIN_WAIT_MS,
                "MAX_JOIN_WAIT_MS",
            ),
            ("lease_ms", c.lease_ms, 1, quiesce, why),
            ("stop_deadline_ms", c.stop_deadline_ms, 1, quiesce, why),
            ("start_deadline_ms", c.start_deadline_ms, 1, quiesce, why),
            (
                "coalesce_delay_ms",
                c.coalesce_delay_ms,
                0,
                palisade_core::delivery::MAX_COALESCE_DELAY_MS,
                "palisade_core::delivery::MAX_COALESCE_DELAY_MS",
            ),
            (
                "coalesce_bytes",
                c.coalesce_bytes,
                1,
                palisade_core::delivery::MAX_COALESCE_BYTES,
                "palisade_core::delivery::MAX_COALESCE_BYTES",
            ),
        ] {
            check_range(&path(field), range)?;
            if range.lo < lo {
                return Err(invalid(
                    &path(field),
                    format!("`{field}` starts at {lo}, not {}", range.lo),
                ));
            }
            at_most(&path(field), range.hi, hi, bound)?;
        }
        for (field, range, hi, bound) in [
            (
                "recovery_steps",
                c.recovery_steps,
                palisade_core::MAX_RECOVERY_STEPS as u64,
                "palisade_core::MAX_RECOVERY_STEPS",
            ),
            (
                "queue_capacity",
                c.queue_capacity,
                palisade_core::delivery::MAX_QUEUE_CAPACITY as u64,
                "palisade_core::delivery::MAX_QUEUE_CAPACITY",
            ),
            (
                "coalesce_events",
                c.coalesce_events,
                palisade_core::delivery::MAX_COALESCE_EVENTS as u64,
                "palisade_core::delivery::MAX_COALESCE_EVENTS",
            ),
        ] {
            check_range(&path(field), range)?;
            if field != "recovery_steps" && range.lo == 0 {
                return Err(invalid(
                    &path(field),
                    format!("`{field}` starts at 1, not 0"),
                ));
            }
            at_most(&path(field), u64::from(range.hi), hi, bound)?;
        }
        if c.recovery_total_ms < u64::from(c.recovery_steps.hi).max(1) {
            return Err(invalid(
                &path("recovery_total_ms"),
                format!(
                    "recovery_total_ms = {} cannot hold {} steps of at least 1 ms",
                    c.recovery_total_ms, c.recovery_steps.hi
                ),
            ));
        }
        at_most(
            &path("recovery_total_ms"),
            c.recovery_total_ms,
            quiesce,
            why,
        )?;
        Ok(())
    }

    /// The core configuration a run of this scenario uses: `[core]` over the core's
    /// defaults, the start deadline fitted into the liveness window. The worlds run the
    /// same (`plan::setup::RunConfig::fixed`), plus the agent profile, which `validate` does
    /// not look at.
    pub fn effective_core_config(&self) -> palisade_core::Config {
        let c = &self.core;
        let d = palisade_core::Config::default();
        palisade_core::Config {
            join_wait_ms: c.join_wait_ms.unwrap_or(d.join_wait_ms),
            start_deadline_ms: c
                .start_deadline_ms
                .unwrap_or(d.start_deadline_ms.min((self.limits.quiesce_ms / 3).max(1))),
            lease_ms: c.lease_ms.unwrap_or(d.lease_ms),
            stop_deadline_ms: c.stop_deadline_ms.unwrap_or(d.stop_deadline_ms),
            recovery_delays_ms: c.recovery_delays_ms.clone().unwrap_or(d.recovery_delays_ms),
            ..d
        }
    }
}

/// `Err` naming the bound unless `value <= max`.
fn at_most(path: &[Key], value: u64, max: u64, bound: &str) -> Result<(), Invalid> {
    if value <= max {
        return Ok(());
    }
    let name = path
        .iter()
        .rev()
        .find_map(|k| match k {
            Key::Field(name) => Some(*name),
            Key::Index(_) => None,
        })
        .unwrap_or("value");
    Err(invalid(
        path,
        format!("`{name}` = {value} is above its bound {max} ({bound})"),
    ))
}

fn check_range<T: PartialOrd + fmt::Display + Copy>(
    path: &[Key],
    range: Bounds<T>,
) -> Result<(), Invalid> {
    if range.lo > range.hi {
        let Some(Key::Field(name)) = path.last() else {
            unreachable!("ranges are named fields");
        };
        return Err(invalid(
            path,
            format!(
                "impossible range `{name}` = [{}, {}]: lo is greater than hi",
                range.lo, range.hi
            ),
        ));
    }
    // NaN compares false both ways; say so rather than accept it.
    if range.lo.partial_cmp(&range.hi).is_none() {
        return Err(invalid(path, "range bounds must be numbers".into()));
    }
    Ok(())
}

/// The byte offset of the value at `path`, or of its closest existing ancestor.
fn locate(text: &str, path: &[Key]) -> Option<usize> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let mut best = None;
    let root = toml::de::DeValue::Table(doc.into_inner());
    let mut here = &root;
    for key in path {
        let next = match key {
            Key::Field(name) => here.get(*name),
            Key::Index(i) => here.get(*i),
        };
        match next {
            Some(value) => {
                best = Some(value.span().start);
                here = value.get_ref();
            }
            None => break,
        }
    }
    best
}

fn located(
    kind: ScenarioErrorKind,
    file: &Path,
    text: &str,
    at: Option<usize>,
    message: String,
) -> ScenarioError {
    let (location, excerpt) = match at {
        Some(offset) => {
            let (location, excerpt) = line_and_column(text, offset);
            (Some(location), Some(excerpt))
        }
        None => (None, None),
    };
    ScenarioError {
        kind,
        file: file.to_path_buf(),
        location,
        message,
        excerpt,
    }
}

/// Converts a byte offset into a 1-based line and character column, with the source line
/// and a caret under the column.
fn line_and_column(text: &str, offset: usize) -> (Location, String) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    let line = text[..line_start].matches('\n').count() + 1;
    let column = text[line_start..offset].chars().count() + 1;
    let source_line = text[line_start..line_end].trim_end_matches('\r');
    let gutter = line.to_string();
    let excerpt = format!(
        "{pad} |\n{gutter} | {source_line}\n{pad} | {caret:>column$}",
        pad = " ".repeat(gutter.len()),
        caret = "^",
    );
    (Location { line, column }, excerpt)
}

/// A scenario ready to run, with where it came from.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The scenario.
    pub scenario: Scenario,
    /// The file it was read from.
    pub file: PathBuf,
    /// How to name it again on a command line: its name when it is a shipped scenario,
    /// else the path as given.
    pub spec: String,
}

/// The directories searched for scenarios by name, in order, without duplicates:
/// `$PALISADE_SCENARIOS`, `./scenarios`, then the shipped ones next to this crate.
pub fn scenario_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os(SCENARIO_DIR_ENV) {
        dirs.push(PathBuf::from(dir));
    }
    dirs.push(PathBuf::from("scenarios"));
    dirs.push(PathBuf::from(SHIPPED_SCENARIO_DIR));
    let mut seen = Vec::new();
    dirs.retain(|dir| {
        let key = dir.canonicalize().unwrap_or_else(|_| dir.clone());
        if seen.contains(&key) {
            false
        } else {
            seen.push(key);
            true
        }
    });
    dirs
}

fn not_found(name: &str, message: String) -> ScenarioError {
    ScenarioError {
        kind: ScenarioErrorKind::NotFound,
        file: PathBuf::from(name),
        location: None,
        message,
        excerpt: None,
    }
}

fn looks_like_path(spec: &str) -> bool {
    spec.ends_with(".toml") || spec.contains('/') || spec.contains(std::path::MAIN_SEPARATOR)
}

/// The `*.toml` files of a directory, sorted by file name.
fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
        .collect();
    files.sort();
    files
}

/// Loads a file from a scenarios directory and checks that its name matches the file's,
/// so every shipped scenario can be named on the command line.
fn load_shipped(file: &Path) -> Result<Resolved, ScenarioError> {
    let scenario = Scenario::load(file)?;
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if scenario.name != stem {
        let text = crate::input::read_text_capped(file, MAX_SCENARIO_BYTES, "scenario")
            .unwrap_or_default();
        let at = locate(&text, &[Key::Field("name")]);
        return Err(located(
            ScenarioErrorKind::Invalid,
            file,
            &text,
            at,
            format!(
                "this file declares name {:?}; a scenario in a scenarios directory must be named after its file ({stem:?})",
                scenario.name
            ),
        ));
    }
    Ok(Resolved {
        spec: scenario.name.clone(),
        scenario,
        file: file.to_path_buf(),
    })
}

/// Resolves `--scenario NAME|PATH|all` to the scenarios it means, all loaded and valid.
pub fn resolve(spec: &str) -> Result<Vec<Resolved>, ScenarioError> {
    if spec == "all" {
        let dirs = scenario_dirs();
        for dir in &dirs {
            let files = toml_files(dir);
            if !files.is_empty() {
                return files.iter().map(|f| load_shipped(f)).collect();
            }
        }
        return Err(not_found(
            "all",
            format!(
                "no scenario files (*.toml) found in {}",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    resolve_one(spec).map(|r| vec![r])
}

/// Resolves one scenario name or path (not `all`).
pub fn resolve_one(spec: &str) -> Result<Resolved, ScenarioError> {
    if spec == "all" {
        return Err(not_found(
            spec,
            "`all` names several scenarios; this command takes one".into(),
        ));
    }
    if looks_like_path(spec) {
        let file = PathBuf::from(spec);
        let scenario = Scenario::load(&file)?;
        // A path into a scenarios directory is the shipped scenario: name it by name.
        let shipped = scenario_dirs()
            .iter()
            .map(|d| d.join(format!("{}.toml", scenario.name)))
            .any(|f| same_file(&f, &file));
        let spec = if shipped {
            scenario.name.clone()
        } else {
            spec.to_string()
        };
        return Ok(Resolved {
            scenario,
            file,
            spec,
        });
    }
    let dirs = scenario_dirs();
    for dir in &dirs {
        let file = dir.join(format!("{spec}.toml"));
        if file.is_file() {
            return load_shipped(&file);
        }
    }
    let known: Vec<String> = dirs
        .iter()
        .flat_map(|d| toml_files(d))
        .filter_map(|f| f.file_stem().and_then(|s| s.to_str()).map(String::from))
        .collect();
    let mut known_unique = known.clone();
    known_unique.sort();
    known_unique.dedup();
    Err(not_found(
        spec,
        format!(
            "unknown scenario (known: {}; or give a path to a .toml file)",
            if known_unique.is_empty() {
                "none found".to_string()
            } else {
                known_unique.join(", ")
            }
        ),
    ))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        Scenario::parse(text, Path::new("t.toml"))
    }

    #[test]
    fn minimal_scenario_takes_defaults() {
        let s = parse("name = \"x\"\n").expect("valid");
        assert_eq!(s.version, 1);
        assert_eq!(s.workload, Workload::default());
        assert!(s.expect.fallback_allowed);
    }

    #[test]
    fn unknown_field_points_at_the_key() {
        let e = parse("name = \"x\"\n[workload]\nsesions = 2\n").unwrap_err();
        assert_eq!(e.kind, ScenarioErrorKind::Syntax);
        assert_eq!(e.location, Some(Location { line: 3, column: 1 }));
        assert!(e.message.contains("sesions"), "{e}");
    }

    #[test]
    fn impossible_range_points_at_the_value() {
        let e = parse("name = \"x\"\n[workload]\nthink_ms = [9, 3]\n").unwrap_err();
        assert_eq!(e.kind, ScenarioErrorKind::Invalid);
        assert_eq!(
            e.location,
            Some(Location {
                line: 3,
                column: 12
            })
        );
        assert!(e.message.contains("impossible range"), "{e}");
    }

    #[test]
    fn probability_outside_unit_interval_is_rejected() {
        let e = parse("name = \"x\"\n[faults]\ndelay = [0.1, 1.5]\n").unwrap_err();
        assert_eq!(e.location, Some(Location { line: 3, column: 9 }));
        assert!(e.message.contains("outside [0, 1]"), "{e}");
    }

    #[test]
    fn step_naming_a_missing_session_is_a_missing_actor() {
        let text = "name = \"x\"\n[workload]\nsessions = 2\n\n[[steps]]\nat_ms = 1\naction = \"cancel\"\nsession = 3\n";
        let e = parse(text).unwrap_err();
        assert_eq!(
            e.location,
            Some(Location {
                line: 8,
                column: 11
            })
        );
        assert!(e.message.starts_with("missing actor"), "{e}");
    }

    #[test]
    fn bit_rot_needs_the_stack_world_and_a_bound() {
        let e = parse("name = \"x\"\n[world]\nbit_rot = 1\n").unwrap_err();
        assert_eq!(e.kind, ScenarioErrorKind::Invalid);
        assert!(e.message.contains("bit rot needs the stack world"), "{e}");
        let e = parse("name = \"x\"\n[world]\nkind = \"stack\"\nbit_rot = 9\n").unwrap_err();
        assert!(e.message.contains("above MAX_SIGNAL_STOPS"), "{e}");
        let s = parse("name = \"x\"\n[world]\nkind = \"stack\"\nbit_rot = 1\n").expect("valid");
        assert_eq!(s.world.bit_rot, 1);
    }

    #[test]
    fn zero_sessions_is_rejected() {
        let e = parse("name = \"x\"\n[workload]\nsessions = 0\n").unwrap_err();
        assert_eq!(
            e.location,
            Some(Location {
                line: 3,
                column: 12
            })
        );
    }

    #[test]
    fn syntax_error_has_line_and_column() {
        let e = parse("name = \"x\"\n[workload\n").unwrap_err();
        assert_eq!(e.kind, ScenarioErrorKind::Syntax);
        assert_eq!(e.location.map(|l| l.line), Some(2));
    }

    #[test]
    fn unknown_agent_is_rejected() {
        let e = parse("name = \"x\"\n[workload]\nagent = \"gpt\"\n").unwrap_err();
        assert_eq!(e.location, Some(Location { line: 3, column: 9 }));
    }

    #[test]
    fn scenario_round_trips_through_toml() {
        let mut s = Scenario::default();
        s.steps.push(Step {
            at_ms: 5,
            action: Action::LateCallback,
            session: 1,
            count: None,
            delay_ms: Some(9),
        });
        s.core.recovery_delays_ms = Some(vec![]);
        let text = toml::to_string(&s).expect("serializes");
        assert_eq!(parse(&text).expect("parses"), s);
    }

    #[test]
    fn agent_names_match_serde() {
        for agent in Agent::ALL {
            let text = format!("name = \"x\"\n[workload]\nagent = \"{}\"\n", agent.name());
            assert_eq!(parse(&text).expect("valid").workload.agent, agent);
        }
    }
}
