//! An agent's whole process tree: started in its own process group, marked, and taken
//! down as one — also when the supervisor itself dies without running any code.
//!
//! Real ACP agents are rarely one process. `npx …` starts node, which starts the agent;
//! codex-acp's npm launcher runs the native binary as its child; an agent may start tool
//! processes, language servers or a daemon that double-forks and calls `setsid`. None of
//! the real agents exits when its stdin closes (issue 13 measured every one still running
//! 15 s later), and a SIGKILL of the direct child leaves its children running, reparented
//! to PID 1. So the tree, not the child, is the unit:
//!
//! - **Group.** The agent is started as the leader of a new process group (its pgid is
//!   its pid). Its descendants stay in the group unless they leave it.
//! - **Mark.** The agent's environment carries [`TREE_ENV`]`=<marker>`, a value unique to
//!   this agent; every descendant inherits it, also one that double-forks and calls
//!   `setsid` (which leaves the group). On Linux the tree's members are the live processes
//!   in the group plus every process whose initial environment carries the marker
//!   (`/proc/<pid>/environ`). A descendant that execs with an emptied environment *and*
//!   leaves the group is not found; nothing short of a cgroup would find it.
//! - **Take down.** A signal goes to every member of the tree; the connection's stop is
//!   stdin close → grace → SIGTERM → [`TERM_GRACE`] → SIGKILL, then it waits until no
//!   member is left (zombies count as gone: their parent reaps them).
//! - **Guard.** Dropping a [`ProcessTree`] that was not seen down SIGKILLs every member
//!   at once, synchronously: a panic that unwinds through the supervisor, or a runtime
//!   dropped with the agent's task in it, still takes the tree down.
//! - **Watchdog.** A supervisor killed by SIGKILL (or aborted) runs no code at all. So each
//!   agent gets a watchdog process ([`watchdog_main`], the `palisade-watchdog` binary)
//!   started *before* the agent, in its own process group. Its stdin is a pipe whose only
//!   writer is the supervisor: when the supervisor dies, however it dies, the kernel closes
//!   it and the watchdog reads end-of-file. It also polls its parent id (reparenting means
//!   the parent died). Then it takes the tree down (SIGTERM, [`TERM_GRACE`], SIGKILL) and
//!   exits. An orderly teardown tells it `done` first, and it exits without signalling
//!   anything (a pgid must not be signalled after the group is gone: the number may be
//!   reused).
//!
//! A parent-death signal (`PR_SET_PDEATHSIG`) would need code between fork and exec
//! (`unsafe` `pre_exec`, which the workspace forbids), reaches only the direct child, and
//! fires when the *thread* that spawned the child exits, which on a multi-threaded tokio
//! runtime is any worker thread. The watchdog has none of these problems.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{self, BufRead};
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::builder::NonEmptyStringValueParser;
use clap::Parser;
use rustix::process::{kill_process, kill_process_group, test_kill_process_group, Pid, Signal};

use palisade_wire::ProcessExit;

use crate::platform::{
    AgentCommand, AgentTree, BoxFuture, SpawnError, SpawnedAgent, StderrMode, TreeSignal,
    WatchdogProgram, WATCHDOG_PROGRAM,
};

/// The environment variable that marks every process of one agent's tree.
pub const TREE_ENV: &str = "PALISADE_AGENT_TREE";

/// After SIGTERM, how long the tree gets to exit before SIGKILL. Node and tokio
/// programs die on SIGTERM at once; this only matters for one that catches it.
pub const TERM_GRACE: Duration = Duration::from_millis(500);

/// After SIGKILL, how long we wait for every member to be gone. Milliseconds normally; a
/// process in uninterruptible sleep can take longer, and is then reported, not waited for.
pub const DOWN_WITHIN: Duration = Duration::from_secs(5);

/// How often a tree is re-scanned while we wait for it to go, and how often the watchdog
/// checks its parent.
pub const POLL: Duration = Duration::from_millis(20);

/// Processes scanned in `/proc` per look at a tree. A machine runs a few hundred; past
/// this the scan stops (and the group signal still reaches the group).
pub const MAX_PROCESSES_SCANNED: usize = 1 << 20;

/// A marker value unique to one agent tree: our pid, a counter and the time.
#[must_use]
pub fn new_marker() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}-{n}-{nanos}", std::process::id())
}

/// One agent's process tree: its group and its marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeId {
    /// The process group (the leader's pid).
    pub pgid: u32,
    /// The value of [`TREE_ENV`] in every member's environment.
    pub marker: String,
}

impl TreeId {
    fn pgid(&self) -> Option<Pid> {
        i32::try_from(self.pgid).ok().and_then(Pid::from_raw)
    }

    /// The live members, as far as this platform can tell: on Linux, every process in
    /// the group or carrying the marker (zombies excluded). Elsewhere only whether the
    /// group still has a member, reported as the pgid.
    #[must_use]
    pub fn members(&self) -> BTreeSet<u32> {
        let mut members = BTreeSet::new();
        if cfg!(target_os = "linux") {
            scan_proc(self, &mut members);
        } else if self
            .pgid()
            .is_some_and(|pgid| test_kill_process_group(pgid).is_ok())
        {
            members.insert(self.pgid);
        }
        members
    }

    /// Sends `signal` to the group and to every marked member outside it. Errors (the
    /// process is already gone) are ignored: the aim is that nothing is left.
    pub fn signal(&self, signal: Signal) {
        if let Some(pgid) = self.pgid() {
            let _ = kill_process_group(pgid, signal);
        }
        for pid in self.members() {
            if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
                let _ = kill_process(pid, signal);
            }
        }
    }

    /// Blocks until no member is left or `within` passed; true if none is left.
    pub fn wait_gone_blocking(&self, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            if self.members().is_empty() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits (asynchronously) until no member is left or `within` passed; true if none is
    /// left.
    pub async fn wait_gone(&self, within: Duration) -> bool {
        let until = tokio::time::Instant::now() + within;
        loop {
            if self.members().is_empty() {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGTERM, [`TERM_GRACE`], SIGKILL, then wait up to [`DOWN_WITHIN`]. True if the
    /// tree is gone.
    pub async fn terminate(&self) -> bool {
        if self.members().is_empty() {
            return true;
        }
        self.signal(Signal::TERM);
        if self.wait_gone(TERM_GRACE).await {
            return true;
        }
        self.kill().await
    }

    /// SIGKILL, then wait up to [`DOWN_WITHIN`]; the signal is repeated while waiting, so
    /// a member forked meanwhile is caught too. True if the tree is gone.
    pub async fn kill(&self) -> bool {
        let until = tokio::time::Instant::now() + DOWN_WITHIN;
        loop {
            self.signal(Signal::KILL);
            if self.wait_gone(POLL).await {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                tracing::warn!(
                    pgid = self.pgid,
                    left = ?self.members(),
                    "agent processes still alive {DOWN_WITHIN:?} after SIGKILL"
                );
                return false;
            }
        }
    }
}

/// Adds the live members of `tree` found in `/proc`.
fn scan_proc(tree: &TreeId, members: &mut BTreeSet<u32>) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let needle = format!("{TREE_ENV}={}", tree.marker);
    for entry in entries.take(MAX_PROCESSES_SCANNED).flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Some((state, pgrp)) = stat_of(&entry.path()) else {
            continue;
        };
        if matches!(state, 'Z' | 'X' | 'x') {
            continue;
        }
        // pgid 0 is "not known yet" (kernel threads have process group 0).
        if (tree.pgid != 0 && pgrp == tree.pgid) || environ_has(&entry.path(), &needle) {
            members.insert(pid);
        }
    }
}

/// State and process group from `/proc/<pid>/stat`. The command name may hold spaces
/// and parentheses, so the fields are read after its last `)`.
fn stat_of(dir: &Path) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// Whether the process's initial environment holds exactly `needle` (`NAME=value`).
fn environ_has(dir: &Path, needle: &str) -> bool {
    std::fs::read(dir.join("environ"))
        .map(|bytes| {
            bytes
                .split(|&b| b == 0)
                .any(|entry| entry == needle.as_bytes())
        })
        .unwrap_or(false)
}

/// An agent's tree while the connection owns it. Dropping it before `set_down`
/// (`ProcessTree::set_down`) SIGKILLs every member, synchronously.
#[derive(Debug)]
pub struct ProcessTree {
    id: TreeId,
    down: AtomicBool,
}

impl ProcessTree {
    /// Owns the tree `id`.
    #[must_use]
    pub fn new(id: TreeId) -> ProcessTree {
        ProcessTree {
            id,
            down: AtomicBool::new(false),
        }
    }

    /// Which tree.
    #[must_use]
    pub fn id(&self) -> &TreeId {
        &self.id
    }

    /// Records that no member is left: the guard has nothing more to do.
    pub fn set_down(&self) {
        self.down.store(true, Ordering::SeqCst);
    }

    /// Whether [`ProcessTree::set_down`] was called.
    #[must_use]
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }
}

impl Drop for ProcessTree {
    fn drop(&mut self) {
        if !self.down.load(Ordering::SeqCst) {
            // No await here: this runs during a panic or a runtime shutdown.
            self.id.signal(Signal::KILL);
        }
    }
}

/// The supervisor's end of a watchdog: its lifeline (stdin) and its process.
#[derive(Debug)]
pub struct Watchdog {
    child: tokio::process::Child,
    lifeline: Option<tokio::process::ChildStdin>,
}

impl Watchdog {
    /// Starts `program` as the watchdog of the tree marked `marker`, in its own process
    /// group (a terminal's Ctrl-C must not kill it before it can act). `None`, logged, if
    /// it cannot start: the tree is then guarded in-process only.
    pub fn spawn(program: &Path, marker: &str) -> Option<Watchdog> {
        let mut command = tokio::process::Command::new(program);
        command
            .arg("--marker")
            .arg(marker)
            .env_remove(TREE_ENV)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(false);
        match command.spawn() {
            Ok(mut child) => {
                let lifeline = child.stdin.take();
                Some(Watchdog { child, lifeline })
            }
            Err(error) => {
                tracing::warn!(program = %program.display(), %error,
                    "cannot start the agent's watchdog; a SIGKILLed supervisor would leave the agent running");
                None
            }
        }
    }

    /// Tells the watchdog the tree's process group.
    pub async fn watch_group(&mut self, pgid: u32) {
        use tokio::io::AsyncWriteExt;
        if let Some(lifeline) = self.lifeline.as_mut() {
            // A watchdog that died cannot be told; the tree is guarded in-process still.
            let _ = lifeline
                .write_all(format!("pgid {pgid}\n").as_bytes())
                .await;
        }
    }

    /// The tree is down: the watchdog exits without signalling anything; reaps it.
    pub async fn dismiss(mut self) {
        use tokio::io::AsyncWriteExt;
        if let Some(mut lifeline) = self.lifeline.take() {
            let _ = lifeline.write_all(b"done\n").await;
        }
        let until = tokio::time::Instant::now() + DOWN_WITHIN;
        if tokio::time::timeout_at(until, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
    }

    /// The agent could not be started: nothing to watch.
    pub fn abandon(mut self) {
        let _ = self.child.start_kill();
    }
}

/// Starts `command` as the leader of its own process group, marked with a fresh
/// [`TREE_ENV`] value and guarded by a watchdog (started first, so that should we die
/// right after the agent started, it finds the agent by its marker), with piped stdin and
/// The most bytes of one stderr line logged; the rest of a longer line is logged as the
/// next line.
const MAX_STDERR_LINE: u64 = 8 * 1024;

/// Logs each line the agent writes on its stderr ([`StderrMode::Log`]), lossily decoded,
/// in the current span.
async fn log_stderr(stderr: tokio::process::ChildStderr) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_STDERR_LINE)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        if !text.is_empty() {
            tracing::info!(target: "palisade_embed::agent", line = %text, "agent stderr");
        }
    }
}

/// stdout: [`TokioPlatform`](crate::tokio_platform::TokioPlatform)'s agent processes.
pub fn spawn_agent(
    command: &AgentCommand,
    stderr: StderrMode,
    watchdog: &WatchdogProgram,
) -> Result<SpawnedAgent, SpawnError> {
    let marker = new_marker();
    let watchdog = watchdog
        .resolve()
        .and_then(|program| Watchdog::spawn(&program, &marker));
    let mut cmd = tokio::process::Command::new(command.program());
    cmd.args(command.arguments())
        .envs(command.environment().iter().map(|(k, v)| (k, v)))
        .env(TREE_ENV, &marker)
        // Its own group: the tree is signalled as one, and a terminal's Ctrl-C (sent
        // to the foreground group) reaches the supervisor, which stops it in order.
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(match stderr {
            StderrMode::Inherit => Stdio::inherit(),
            StderrMode::Null => Stdio::null(),
            StderrMode::Log => Stdio::piped(),
        })
        // Belt and braces: if the supervisor task itself is dropped (runtime shutdown),
        // the child is still killed.
        .kill_on_drop(true);
    if let Some(dir) = command.working_dir() {
        cmd.current_dir(dir);
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(error) => {
            if let Some(watchdog) = watchdog {
                watchdog.abandon();
            }
            return Err(SpawnError::Spawn(error));
        }
    };
    if let Some(stderr) = child.stderr.take() {
        // Ends at the pipe's EOF: when the last process of the tree holding it is gone.
        tokio::spawn(tracing::Instrument::instrument(
            log_stderr(stderr),
            tracing::Span::current(),
        ));
    }
    let pid = child.id();
    let tree = ProcessTree::new(TreeId {
        pgid: pid.unwrap_or(0),
        marker,
    });
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        // Dropping `tree` kills the group, dropping `child` kills it (kill_on_drop).
        if let Some(watchdog) = watchdog {
            watchdog.abandon();
        }
        return Err(SpawnError::MissingPipe);
    };
    Ok(SpawnedAgent {
        pid,
        stdin: Box::new(stdin),
        stdout: Box::new(stdout),
        tree: Box::new(OsTree {
            child,
            tree,
            watchdog,
        }),
    })
}

/// A real agent's tree: the child, its process group and marker, its watchdog.
struct OsTree {
    child: tokio::process::Child,
    tree: ProcessTree,
    watchdog: Option<Watchdog>,
}

impl AgentTree for OsTree {
    fn arm(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let pgid = self.tree.id().pgid;
            if let Some(watchdog) = self.watchdog.as_mut() {
                watchdog.watch_group(pgid).await;
            }
        })
    }

    fn wait(&mut self) -> BoxFuture<'_, ProcessExit> {
        Box::pin(async move {
            self.child
                .wait()
                .await
                .map_or(ProcessExit::Unknown, ProcessExit::from)
        })
    }

    fn signal(&mut self, signal: TreeSignal) {
        self.tree.id().signal(match signal {
            TreeSignal::Terminate => Signal::TERM,
            TreeSignal::Kill => Signal::KILL,
        });
    }

    fn kill_child(&mut self) {
        // Fails only if the child already exited; wait() returns then.
        let _ = self.child.start_kill();
    }

    fn take_down(&mut self, kill: bool) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            let gone = if kill {
                self.tree.id().kill().await
            } else {
                self.tree.id().terminate().await
            };
            if gone {
                self.tree.set_down();
            }
            gone
        })
    }

    fn disarm(self: Box<Self>) -> BoxFuture<'static, ()> {
        let OsTree {
            child,
            tree,
            watchdog,
        } = *self;
        Box::pin(async move {
            // A tree not seen down is SIGKILLed again by `tree`'s guard as it drops, and
            // the watchdog, its lifeline dropped, keeps trying.
            if tree.is_down() {
                if let Some(watchdog) = watchdog {
                    watchdog.dismiss().await;
                }
            }
            drop(tree);
            drop(child);
        })
    }
}

/// What the watchdog's lifeline said.
enum Word {
    Group(u32),
    Done,
    /// End of file, or a read error: the supervisor is gone.
    Gone,
}

/// `palisade-watchdog`'s command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = WATCHDOG_PROGRAM,
    about = "Guards one agent's process tree for palisade-embed, which starts it; not meant to be run by hand."
)]
struct WatchdogCli {
    /// The tree's marker: the value of PALISADE_AGENT_TREE in its members' environment
    #[arg(long, value_name = "MARKER", value_parser = NonEmptyStringValueParser::new())]
    marker: String,
}

/// `palisade-watchdog --marker M` (`args` without the program name): guards one agent
/// tree (see the module docs). Reads `pgid N` and `done` lines on stdin; on end-of-file, or
/// when its parent changes, it takes the tree down (SIGTERM, [`TERM_GRACE`], SIGKILL) and
/// exits 0. Exit 2 on bad usage.
#[must_use]
pub fn watchdog_main<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let parsed = WatchdogCli::try_parse_from(
        std::iter::once(OsString::from(WATCHDOG_PROGRAM)).chain(args.into_iter().map(Into::into)),
    );
    let marker = match parsed {
        Ok(cli) => cli.marker,
        Err(error) => return ExitCode::from(crate::cli::usage_exit(WATCHDOG_PROGRAM, &error)),
    };
    let parent = std::os::unix::process::parent_id();
    let (words_tx, words) = mpsc::channel();
    std::thread::spawn(move || {
        let stdin = io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            let word = match line.trim().split_once(' ') {
                Some(("pgid", n)) => match n.parse() {
                    Ok(pgid) => Word::Group(pgid),
                    Err(_) => continue,
                },
                _ if line.trim() == "done" => Word::Done,
                _ => continue,
            };
            let done = matches!(word, Word::Done);
            if words_tx.send(word).is_err() || done {
                return;
            }
        }
        let _ = words_tx.send(Word::Gone);
    });
    // Until the group is known, a pgid no process has: only the marker finds members.
    let mut tree = TreeId { pgid: 0, marker };
    loop {
        match words.recv_timeout(POLL * 5) {
            Ok(Word::Group(pgid)) => tree.pgid = pgid,
            Ok(Word::Done) => return ExitCode::SUCCESS,
            Ok(Word::Gone) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if std::os::unix::process::parent_id() != parent {
                    break;
                }
            }
        }
    }
    tree.signal(Signal::TERM);
    if !tree.wait_gone_blocking(TERM_GRACE) {
        let until = Instant::now() + DOWN_WITHIN;
        loop {
            tree.signal(Signal::KILL);
            if tree.wait_gone_blocking(POLL) || Instant::now() >= until {
                break;
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_last_parenthesis() {
        let dir = std::env::temp_dir().join(format!("palisade-stat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("stat"), "42 (a) b (c)) S 1 777 777 0").unwrap();
        assert_eq!(stat_of(&dir), Some(('S', 777)));
        std::fs::write(dir.join("environ"), b"A=1\0PALISADE_AGENT_TREE=x-1\0").unwrap();
        assert!(environ_has(&dir, "PALISADE_AGENT_TREE=x-1"));
        assert!(!environ_has(&dir, "PALISADE_AGENT_TREE=x"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn markers_are_unique() {
        assert_ne!(new_marker(), new_marker());
    }
}
