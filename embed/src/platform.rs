//! The seams between the supervisor and the world it runs in: time, tasks, blocking I/O
//! and agent processes ([`Platform`]), the state file's file operations
//! ([`StateFs`](crate::state::StateFs)), and, for `palisade-supervise`'s loop, its
//! console and its prompts ([`crate::supervise`]).
//!
//! Production fills them with [`TokioPlatform`] (tokio's clock, timers and tasks, real
//! processes in their own process groups with a watchdog, [`crate::process`]) and
//! [`RealFs`](crate::state::RealFs). The simulator (`palisade-sim`, `sim/src/stack/`)
//! fills them with madsim's clock and tasks, in-memory pipes to simulated agent processes,
//! and a simulated disk that loses, tears and delays writes. Everything above the seams —
//! [`Supervisor`](crate::Supervisor), [`AgentConnection`](crate::AgentConnection), the
//! [`Engine`](crate::Engine), the state file's write sequence and the supervise loop — is
//! the same code in both.
//!
//! The runtime is chosen by value, never by a `cfg`: this crate has no `cfg(madsim)`, so
//! the workspace-wide `--cfg madsim` cannot put the shipped binaries on a simulated
//! runtime.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use crate::rpc::{AgentCommand, ConnectionConfig, ProcessExit, SpawnError};

/// A boxed future that can move between threads (what a [`Platform`] runs).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A blocking job: runs on a thread where blocking is fine (a state file write).
pub type BlockingJob = Box<dyn FnOnce() -> io::Result<()> + Send>;

/// A spawned task. Dropping it detaches the task; [`Task::abort`] cancels it.
pub struct Task {
    abort: Box<dyn Fn() + Send + Sync>,
}

impl Task {
    /// A task cancelled by `abort`.
    pub fn new(abort: impl Fn() + Send + Sync + 'static) -> Task {
        Task {
            abort: Box::new(abort),
        }
    }

    /// Cancels the task (its future is dropped at its next poll, or now).
    pub fn abort(&self) {
        (self.abort)();
    }
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Task")
    }
}

/// How a signal reaches an agent's process tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeSignal {
    /// SIGTERM: a chance to exit in order.
    Terminate,
    /// SIGKILL.
    Kill,
}

/// An agent's process tree, as the connection's supervisor task owns it
/// ([`crate::rpc`]): it waits for the direct child, signals the whole tree, and takes
/// down what is left once the child was reaped. The order of these calls (stdin EOF,
/// grace, SIGTERM, [`TERM_GRACE`](crate::process::TERM_GRACE), SIGKILL, reap, tree down,
/// disarm) is the connection's and the same on every platform.
pub trait AgentTree: Send {
    /// Arms whatever takes the tree down should this process die without running any
    /// code (the watchdog); called once, first.
    fn arm(&mut self) -> BoxFuture<'_, ()>;
    /// Resolves when the direct child exited (and was reaped). Cancel-safe: the select
    /// loop drops and re-creates it.
    fn wait(&mut self) -> BoxFuture<'_, ProcessExit>;
    /// Sends `signal` to every process of the tree.
    fn signal(&mut self, signal: TreeSignal);
    /// SIGKILL to the direct child only.
    fn kill_child(&mut self);
    /// After the child was reaped: takes down what is left of the tree (`kill`: SIGKILL;
    /// else SIGTERM, [`TERM_GRACE`](crate::process::TERM_GRACE), SIGKILL) and waits until
    /// no member is left; true if none is.
    fn take_down(&mut self, kill: bool) -> BoxFuture<'_, bool>;
    /// The tree is down: nothing is left to guard (dismisses the watchdog).
    fn disarm(self: Box<Self>) -> BoxFuture<'static, ()>;
}

/// A started agent process: its pid, its stdio and its process tree.
pub struct SpawnedAgent {
    /// Its process id, if the platform has one.
    pub pid: Option<u32>,
    /// Its stdin (we write).
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
    /// Its stdout (we read).
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    /// Its process tree.
    pub tree: Box<dyn AgentTree>,
}

impl fmt::Debug for SpawnedAgent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpawnedAgent")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// Time, tasks, blocking I/O and agent processes: everything the supervisor and its
/// connections ask of the world. See the module docs.
pub trait Platform: Send + Sync + fmt::Debug + 'static {
    /// Now, on the monotonic clock the deadlines are on.
    fn now(&self) -> Instant;
    /// Now, in milliseconds since the Unix epoch (the supervisor's clock resumes from the
    /// wall clock after a restart, so that time spent down counts against deadlines).
    fn unix_ms(&self) -> u64;
    /// Resolves at `deadline`.
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()>;
    /// Runs `task` concurrently.
    fn spawn(&self, task: BoxFuture<'static, ()>) -> Task;
    /// Runs `job` where blocking is fine, and resolves with its result.
    fn blocking(&self, job: BlockingJob) -> BoxFuture<'static, io::Result<()>>;
    /// Starts an agent process (its own process tree) with piped stdin and stdout.
    fn spawn_agent(
        &self,
        command: &AgentCommand,
        config: &ConnectionConfig,
    ) -> Result<SpawnedAgent, SpawnError>;
}

/// The deadline passed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// Runs `future` until `deadline` on `platform`'s clock. Like `tokio::time::timeout_at`,
/// the future is polled first, so one that is ready wins over a deadline that passed.
pub async fn timeout_at<F: Future>(
    platform: &dyn Platform,
    deadline: Instant,
    future: F,
) -> Result<F::Output, Elapsed> {
    let sleep = platform.sleep_until(deadline);
    tokio::select! {
        biased;
        output = future => Ok(output),
        () = sleep => Err(Elapsed),
    }
}

/// Resolves `duration` from now on `platform`'s clock.
pub fn sleep(platform: &dyn Platform, duration: Duration) -> BoxFuture<'static, ()> {
    platform.sleep_until(platform.now() + duration)
}

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
        config: &ConnectionConfig,
    ) -> Result<SpawnedAgent, SpawnError> {
        crate::process::spawn_agent(command, config)
    }
}
