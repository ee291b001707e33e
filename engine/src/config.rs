//! Knobs of the sans-IO [`Engine`](crate::Engine).

use std::path::PathBuf;

use palisade_core::delivery::{CoalescerConfig, DEFAULT_QUEUE_CAPACITY, MAX_QUEUE_CAPACITY};
use palisade_core::{Config, ConfigError};

/// Longest prompt text accepted from a caller. The text is kept (and persisted) until the
/// turn ends, because a recovery re-prompt needs it; a mebibyte is far more than any
/// human-written prompt.
pub const MAX_PROMPT_BYTES: usize = 1 << 20;

/// Events (and output events in them) waiting for the caller before the engine stops
/// moving output out of the per-session delivery queues (which then fill and push back on
/// the agents).
pub const READY_EVENTS: usize = 64;

/// The idle deadline of a turn under the engine unless configured otherwise
/// (`EngineConfig::core.turn_idle_ms`): ten minutes without a word from an agent working on
/// a prompt.
pub const DEFAULT_TURN_IDLE_MS: u64 = 600_000;

/// Everything the engine needs: the core's configuration and the deadlines and capacities
/// of what the engine adds to it.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The core's configuration. When the supervisor restores a state file, the
    /// snapshot's configuration is used instead (the core restores its own). Its
    /// `turn_idle_ms` is the idle rule: an accepted prompt with neither an answer nor a
    /// notification for that long means the agent is wedged, and the core cancels the
    /// prompt, stops the runtime and recovers the turn. The engine's default is
    /// [`DEFAULT_TURN_IDLE_MS`] (the core's own default, 0, turns the rule off).
    pub core: Config,
    /// Working directory sent with `session/new` and `session/load` (absolute, per ACP).
    pub cwd: PathBuf,
    /// How long `initialize` may take before the start counts as failed.
    pub initialize_timeout_ms: u64,
    /// How long `session/load` may take. A timeout is inconclusive (rule 6): the failure
    /// is reported and the conversation token is kept.
    pub load_timeout_ms: u64,
    /// How long `session/new` may take.
    pub new_session_timeout_ms: u64,
    /// On a stop, how long the agent gets to exit after its stdin is closed (ACP agents
    /// exit on EOF and may save their conversation first) before it is killed.
    pub stop_grace_ms: u64,
    /// Capacity of each session's delivery queue ([`palisade_core::delivery`]): output
    /// admitted by the core that the caller has not taken yet. When one is full the
    /// engine's shell stops reading from agents, which then block: backpressure, never loss.
    pub delivery_queue_capacity: usize,
    /// How output events are batched for the caller.
    pub coalescer: CoalescerConfig,
    /// Check every core step against the core's reference model of the rules
    /// (`palisade_core::audit`). Acts only with the crate feature `audit`, which tests
    /// turn on: the model remembers every attempt it saw, and it is switched off after a
    /// restore (it cannot know the attempts before it).
    pub audit: bool,
    /// Runtime reuse: a new attempt of a session whose previous attempt was retired while
    /// its agent process was still being started (a cancelled resume, a start that missed
    /// its deadline) takes that process over instead of starting another one. The core
    /// fences it: the new attempt binds the execution under a new generation, and the
    /// retired attempt's late bind neither claims nor stops it (rule 5). A shell that
    /// reports [`Engine::spawned`](crate::Engine::spawned) within the same call that
    /// carried out the spawn (as `palisade_embed::Supervisor` does) never has a
    /// start in flight to reuse; a shell whose starts take time (a remote controller, a
    /// container) does. Off by default.
    pub reuse_runtimes: bool,
    /// The shell keeps a state file: every action and event waits for a durable write of
    /// the state that caused it ([`Output::Persist`](crate::Output::Persist), group
    /// commit), and events handed to the caller stay in the state until acknowledged. Off:
    /// no write is ever asked for and everything leaves at once.
    pub persistence: bool,
    /// Who stands behind the caller on the agents' client side.
    pub client: ClientSide,
}

/// Who answers what an agent asks of its client, and who sees what it says outside turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientSide {
    /// Nobody interactive (`palisade-supervise`): a permission request is declined (the
    /// agent's tool call is cancelled) and other client methods do not exist; updates
    /// outside a turn are nobody's output.
    #[default]
    Closed,
    /// An ACP client stands behind the caller (`palisade-proxy`): the agents' requests
    /// reach it ([`SessionEvent::ClientRequest`](crate::SessionEvent::ClientRequest)), its
    /// answers go back to the execution that asked and to no other, and the session's
    /// updates outside turns reach it too
    /// ([`SessionEvent::Update`](crate::SessionEvent::Update)).
    Forward,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            core: Config {
                turn_idle_ms: DEFAULT_TURN_IDLE_MS,
                ..Config::default()
            },
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            initialize_timeout_ms: 30_000,
            load_timeout_ms: 60_000,
            new_session_timeout_ms: 60_000,
            stop_grace_ms: 2_000,
            delivery_queue_capacity: DEFAULT_QUEUE_CAPACITY,
            coalescer: CoalescerConfig::default(),
            audit: false,
            reuse_runtimes: false,
            persistence: false,
            client: ClientSide::Closed,
        }
    }
}

/// Why a [`EngineConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineConfigError {
    /// The core refused its part.
    Core(ConfigError),
    /// A timeout of zero would fire before anything could happen.
    ZeroTimeout(&'static str),
    /// A capacity out of its range.
    Capacity(&'static str),
    /// `cwd` is relative; ACP wants an absolute working directory.
    RelativeCwd,
}

impl std::fmt::Display for EngineConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineConfigError::Core(error) => write!(f, "core config: {error}"),
            EngineConfigError::ZeroTimeout(name) => write!(f, "{name} must be at least 1 ms"),
            EngineConfigError::Capacity(name) => write!(f, "{name} is out of range"),
            EngineConfigError::RelativeCwd => f.write_str("cwd must be an absolute path"),
        }
    }
}

impl std::error::Error for EngineConfigError {}

impl EngineConfig {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), EngineConfigError> {
        self.core.validate().map_err(EngineConfigError::Core)?;
        for (name, value) in [
            ("initialize_timeout_ms", self.initialize_timeout_ms),
            ("load_timeout_ms", self.load_timeout_ms),
            ("new_session_timeout_ms", self.new_session_timeout_ms),
        ] {
            if value == 0 {
                return Err(EngineConfigError::ZeroTimeout(name));
            }
        }
        if !(1..=MAX_QUEUE_CAPACITY).contains(&self.delivery_queue_capacity) {
            return Err(EngineConfigError::Capacity("delivery_queue_capacity"));
        }
        if !self.cwd.is_absolute() {
            return Err(EngineConfigError::RelativeCwd);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configs_are_refused() {
        assert_eq!(EngineConfig::default().validate(), Ok(()));
        let with = |change: fn(&mut EngineConfig)| {
            let mut config = EngineConfig::default();
            change(&mut config);
            config.validate()
        };
        assert_eq!(
            with(|c| c.load_timeout_ms = 0),
            Err(EngineConfigError::ZeroTimeout("load_timeout_ms"))
        );
        assert_eq!(
            with(|c| c.delivery_queue_capacity = 0),
            Err(EngineConfigError::Capacity("delivery_queue_capacity"))
        );
        assert_eq!(
            with(|c| c.cwd = "relative".into()),
            Err(EngineConfigError::RelativeCwd)
        );
        assert!(matches!(
            with(|c| c.core.recovery_delays_ms = vec![1; 9]),
            Err(EngineConfigError::Core(_))
        ));
    }
}
