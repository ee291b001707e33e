//! Knobs of the [`Supervisor`](crate::Supervisor): the engine's, and the shell's own.

use palisade_engine::{EngineConfig, EngineConfigError};

use crate::rpc::ConnectionConfig;

/// Everything the supervisor needs besides the agent command and the state file.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// The engine's (and through it the core's) configuration.
    pub engine: EngineConfig,
    /// Capacity of the caller's event channel.
    pub event_capacity: usize,
    /// The connection to each agent process.
    pub connection: ConnectionConfig,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            engine: EngineConfig::default(),
            event_capacity: 256,
            connection: ConnectionConfig::default(),
        }
    }
}

/// Why a [`SupervisorConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SupervisorConfigError {
    /// The engine refused its part.
    Engine(EngineConfigError),
    /// A capacity of the shell out of its range.
    Capacity(&'static str),
}

impl std::fmt::Display for SupervisorConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SupervisorConfigError::Engine(error) => write!(f, "{error}"),
            SupervisorConfigError::Capacity(name) => write!(f, "{name} is out of range"),
        }
    }
}

impl std::error::Error for SupervisorConfigError {}

impl SupervisorConfig {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), SupervisorConfigError> {
        self.engine
            .validate()
            .map_err(SupervisorConfigError::Engine)?;
        if self.event_capacity == 0 {
            return Err(SupervisorConfigError::Capacity("event_capacity"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shells_capacities_are_checked_beside_the_engines_config() {
        assert_eq!(SupervisorConfig::default().validate(), Ok(()));
        let config = SupervisorConfig {
            event_capacity: 0,
            ..SupervisorConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(SupervisorConfigError::Capacity("event_capacity"))
        );
        let mut config = SupervisorConfig::default();
        config.engine.load_timeout_ms = 0;
        assert!(matches!(
            config.validate(),
            Err(SupervisorConfigError::Engine(_))
        ));
    }
}
