//! Production's [`Platform`]: tokio's clock, timers and tasks, tokio's blocking pool, and
//! real agent processes in their own process groups with a watchdog ([`crate::process`]).

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::platform::{
    AgentCommand, BlockingJob, BoxFuture, Platform, SpawnError, SpawnedAgent, StderrMode, Task,
    WatchdogProgram,
};

/// Production: tokio's clock, timers and tasks (call it inside a tokio runtime), blocking
/// jobs on tokio's blocking pool, and real agent processes ([`crate::process`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioPlatform;

impl Platform for TokioPlatform {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep_until(deadline))
    }

    fn spawn(&self, task: BoxFuture<'static, ()>) -> Task {
        let handle = tokio::spawn(task);
        Task::new(move || handle.abort())
    }

    fn blocking(&self, job: BlockingJob) -> BoxFuture<'static, io::Result<()>> {
        let handle = tokio::task::spawn_blocking(job);
        Box::pin(async move {
            handle
                .await
                .unwrap_or_else(|error| Err(io::Error::other(error.to_string())))
        })
    }

    fn spawn_agent(
        &self,
        command: &AgentCommand,
        stderr: StderrMode,
        watchdog: &WatchdogProgram,
    ) -> Result<SpawnedAgent, SpawnError> {
        crate::process::spawn_agent(command, stderr, watchdog)
    }
}
