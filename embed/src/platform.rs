//! The seams between the supervisor and the world it runs in: time, tasks, blocking I/O
//! and agent processes ([`Platform`]), the state file's file operations
//! ([`StateFs`](crate::state_file::StateFs)), and, for `palisade-supervise`'s loop, its
//! console and its prompts ([`crate::supervise`]).
//!
//! Production fills them with [`TokioPlatform`](crate::tokio_platform::TokioPlatform) (tokio's clock, timers and tasks, real
//! processes in their own process groups with a watchdog, [`crate::process`]) and
//! [`RealFs`](crate::state_file::RealFs). The simulator (`palisade-sim`, `sim/src/stack/`)
//! fills them with madsim's clock and tasks, in-memory pipes to simulated agent processes,
//! and a simulated disk that loses, tears and delays writes. Everything above the seams —
//! [`Supervisor`](crate::Supervisor), [`AgentConnection`](crate::AgentConnection), the
//! [`Engine`](crate::Engine), the state file's write sequence and the supervise loop — is
//! the same code in both.
//!
//! The runtime is chosen by value, never by a `cfg`: this crate has no `cfg(madsim)`, so
//! the workspace-wide `--cfg madsim` cannot put the shipped binaries on a simulated
//! runtime.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use palisade_wire::ProcessExit;

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
    /// Starts an agent process (its own process tree, guarded by `watchdog`) with piped
    /// stdin and stdout, and its stderr where `stderr` says.
    fn spawn_agent(
        &self,
        command: &AgentCommand,
        stderr: StderrMode,
        watchdog: &WatchdogProgram,
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

/// Where the agent's stderr goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StderrMode {
    /// Our own stderr (agents log there).
    #[default]
    Inherit,
    /// Discarded.
    Null,
    /// Read line by line and logged as `tracing` events (target `palisade_embed::agent`,
    /// info) in the span that started the agent: the supervisor's execution span, which
    /// names its session, attempt and execution.
    Log,
}

/// How to start an agent: program, arguments, extra environment, working directory.
#[derive(Debug, Clone)]
pub struct AgentCommand {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    current_dir: Option<PathBuf>,
}

impl AgentCommand {
    /// A command running `program` (looked up in `PATH` if it has no slash).
    pub fn new(program: impl Into<OsString>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            current_dir: None,
        }
    }

    /// Appends one argument.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets one environment variable on top of ours.
    #[must_use]
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Runs the agent in this directory.
    #[must_use]
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.current_dir = Some(dir.into());
        self
    }

    /// The program.
    #[must_use]
    pub fn program(&self) -> &OsStr {
        &self.program
    }

    /// The arguments.
    #[must_use]
    pub fn arguments(&self) -> &[OsString] {
        &self.args
    }

    /// The extra environment.
    #[must_use]
    pub fn environment(&self) -> &[(OsString, OsString)] {
        &self.env
    }

    /// The working directory, if one was set.
    #[must_use]
    pub fn working_dir(&self) -> Option<&Path> {
        self.current_dir.as_deref()
    }
}

/// Why an agent could not be started.
#[derive(Debug)]
pub enum SpawnError {
    /// The OS refused to start the program (not found, not executable, ...).
    Spawn(io::Error),
    /// The child came up without the piped stdin or stdout we asked for.
    MissingPipe,
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpawnError::Spawn(error) => write!(f, "could not start the agent: {error}"),
            SpawnError::MissingPipe => f.write_str("the agent has no stdin/stdout pipe"),
        }
    }
}

impl std::error::Error for SpawnError {}

/// The watchdog program's name, looked for beside the running executable.
pub const WATCHDOG_PROGRAM: &str = "palisade-watchdog";

/// Which watchdog process guards each agent's tree against a supervisor that dies
/// without running code (SIGKILL, abort).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WatchdogProgram {
    /// `palisade-watchdog` beside the running executable, or one directory up (where
    /// cargo puts binaries, seen from a test binary in `deps/`); none if neither exists.
    #[default]
    Beside,
    /// This program, run with the watchdog's arguments.
    Path(PathBuf),
    /// No watchdog: the tree is still taken down by every stop, kill and drop, but not
    /// when the supervisor is SIGKILLed.
    Off,
}

impl WatchdogProgram {
    /// The program to run, if any.
    #[must_use]
    pub fn resolve(&self) -> Option<PathBuf> {
        match self {
            WatchdogProgram::Off => None,
            WatchdogProgram::Path(path) => Some(path.clone()),
            WatchdogProgram::Beside => {
                let exe = std::env::current_exe().ok()?;
                let dir = exe.parent()?;
                let found = [Some(dir), dir.parent()]
                    .into_iter()
                    .flatten()
                    .map(|dir| dir.join(WATCHDOG_PROGRAM))
                    .find(|path| path.is_file());
                found
            }
        }
    }
}
