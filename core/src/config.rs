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
/// The longest recovery delay: a day. A runtime restarted later than that recovers a
/// turn nobody waits for any more; and every time the core computes stays far below 2^53
/// ms, where a JSON reader in JavaScript would start to misread it.
pub const MAX_RECOVERY_DELAY_MS: u64 = 24 * 60 * 60 * 1000;
/// The longest a whole recovery schedule may add up to: a day, for the same reasons.
pub const MAX_RECOVERY_SCHEDULE_MS: u64 = 24 * 60 * 60 * 1000;
/// Effects queued between two drains. One input causes at most a handful; a full queue
/// means the embedder stopped draining, which is its bug, reported as a rejection.
pub const MAX_PENDING_EFFECTS: usize = 4096;

const _: () = assert!(GENERATIONS_PER_EXECUTION <= TOMBSTONES_PER_SESSION);
const _: () = assert!(MAX_RECOVERY_DELAY_MS <= MAX_RECOVERY_SCHEDULE_MS);
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
    /// How long an accepted turn's runtime may stay silent (no stream event, no answer)
    /// before the turn counts as lost with its runtime: the prompt is cancelled, the
    /// runtime stopped (killed after [`Config::stop_deadline_ms`]) and the turn recovered
    /// on the schedule (rule 8), as for a runtime that died. Silence while the embedder
    /// does not read its runtimes ([`crate::Core::set_listening`]) does not count. `0`
    /// (the default) disables the rule: a silent turn then waits for its runtime's exit.
    pub turn_idle_ms: u64,
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
            turn_idle_ms: 0,
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
    /// A recovery delay (the `step`th, from 1) above [`MAX_RECOVERY_DELAY_MS`].
    RecoveryDelayTooLong {
        /// Which delay, from 1.
        step: usize,
        /// Its length.
        ms: u64,
    },
    /// Recovery delays adding up past [`MAX_RECOVERY_SCHEDULE_MS`].
    RecoveryScheduleTooLong {
        /// Their sum (saturating).
        total_ms: u64,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::TooManyRecoverySteps(n) => {
                write!(f, "{n} recovery delays; at most {MAX_RECOVERY_STEPS}")
            }
            ConfigError::ZeroDeadline(name) => write!(f, "{name} must be at least 1 ms"),
            ConfigError::RecoveryDelayTooLong { step, ms } => write!(
                f,
                "recovery delay {step} is {ms} ms; at most {MAX_RECOVERY_DELAY_MS} ms"
            ),
            ConfigError::RecoveryScheduleTooLong { total_ms } => write!(
                f,
                "the recovery delays add up to {total_ms} ms; at most {MAX_RECOVERY_SCHEDULE_MS} ms"
            ),
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
        if let Some((i, &ms)) = self
            .recovery_delays_ms
            .iter()
            .enumerate()
            .find(|(_, &ms)| ms > MAX_RECOVERY_DELAY_MS)
        {
            return Err(ConfigError::RecoveryDelayTooLong { step: i + 1, ms });
        }
        let total_ms = self
            .recovery_delays_ms
            .iter()
            .fold(0u64, |sum, &ms| sum.saturating_add(ms));
        if total_ms > MAX_RECOVERY_SCHEDULE_MS {
            return Err(ConfigError::RecoveryScheduleTooLong { total_ms });
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 28, item 8: a delay of `u64::MAX` ms was accepted; the turn never ended and
    /// an `at_ms` past 2^53 was printed.
    #[test]
    fn recovery_delays_are_bounded_each_and_in_sum() {
        let with = |delays: Vec<u64>| {
            Config {
                recovery_delays_ms: delays,
                ..Config::default()
            }
            .validate()
        };
        assert_eq!(with(vec![MAX_RECOVERY_DELAY_MS]), Ok(()));
        assert_eq!(
            with(vec![1, u64::MAX]),
            Err(ConfigError::RecoveryDelayTooLong {
                step: 2,
                ms: u64::MAX
            })
        );
        let half = MAX_RECOVERY_SCHEDULE_MS / 2;
        assert_eq!(with(vec![half, MAX_RECOVERY_SCHEDULE_MS - half]), Ok(()));
        assert_eq!(
            with(vec![half, half + 2]),
            Err(ConfigError::RecoveryScheduleTooLong {
                total_ms: half + half + 2
            })
        );
        assert_eq!(
            with(vec![MAX_RECOVERY_DELAY_MS; MAX_RECOVERY_STEPS]),
            Err(ConfigError::RecoveryScheduleTooLong {
                total_ms: MAX_RECOVERY_DELAY_MS * MAX_RECOVERY_STEPS as u64
            })
        );
    }
}
