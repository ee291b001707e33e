//! Configuration and the named bounds of the core.

use serde::{Deserialize, Serialize};

use crate::classify::AgentProfile;

/// Tombstones kept per session. Matches the reviewed kandev registry (16): enough to fence
/// every callback a realistic retry burst leaves in flight; older IDs fail closed anyway.
pub const TOMBSTONES_PER_SESSION: usize = 16;
/// Generations remembered per execution (8), as in the reviewed lifecycle layer; older
/// generations fail closed by number, so the history only serves rejection reasons and
/// the "binding never changes" invariant.
pub const GENERATIONS_PER_EXECUTION: usize = 8;
/// Steps of an automatic-recovery schedule. Each step is a full runtime restart; more
/// than eight makes a user wait minutes for a turn that will not come back.
pub const MAX_RECOVERY_STEPS: usize = 8;
/// Effects queued between two drains. One input causes at most a handful; a full queue
/// means the embedder stopped draining, which is its bug, reported as a rejection.
pub const MAX_PENDING_EFFECTS: usize = 4096;

const _: () = assert!(GENERATIONS_PER_EXECUTION <= TOMBSTONES_PER_SESSION);
const _: () = assert!(
    TOMBSTONES_PER_SESSION <= 16,
    "the ring's outcome mask is a u16"
);

/// Tunables. Every field has a default that matches the reviewed systems.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// How long a joiner waits for a live attempt before it is told the attempt hung.
    pub join_wait_ms: u64,
    /// How long an attempt may take from start to a ready conversation.
    pub start_deadline_ms: u64,
    /// How long an effect's lease stays valid after the callback that caused it.
    pub lease_ms: u64,
    /// How long a teardown may take before the core gives up and asks for a kill.
    pub stop_deadline_ms: u64,
    /// Automatic-recovery delays; empty disables recovery entirely.
    pub recovery_delays_ms: Vec<u64>,
    /// Sessions the core tracks at once.
    pub max_sessions: usize,
    /// Which agent's load answers to trust (see `classify`).
    pub agent_profile: AgentProfile,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            join_wait_ms: 30_000,
            start_deadline_ms: 60_000,
            lease_ms: 5_000,
            stop_deadline_ms: 10_000,
            recovery_delays_ms: vec![1_000, 2_000, 4_000],
            max_sessions: 1_000_000,
            agent_profile: AgentProfile::Generic,
        }
    }
}

/// Why a configuration was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// More than [`MAX_RECOVERY_STEPS`] recovery delays.
    TooManyRecoverySteps(usize),
    /// A deadline of zero would fire before anything could happen.
    ZeroDeadline(&'static str),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::TooManyRecoverySteps(n) => {
                write!(f, "{n} recovery delays; at most {MAX_RECOVERY_STEPS}")
            }
            ConfigError::ZeroDeadline(name) => write!(f, "{name} must be at least 1 ms"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.recovery_delays_ms.len() > MAX_RECOVERY_STEPS {
            return Err(ConfigError::TooManyRecoverySteps(
                self.recovery_delays_ms.len(),
            ));
        }
        for (name, v) in [
            ("join_wait_ms", self.join_wait_ms),
            ("start_deadline_ms", self.start_deadline_ms),
            ("lease_ms", self.lease_ms),
            ("stop_deadline_ms", self.stop_deadline_ms),
        ] {
            if v == 0 {
                return Err(ConfigError::ZeroDeadline(name));
            }
        }
        Ok(())
    }
}
