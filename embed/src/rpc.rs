//! An ACP agent subprocess and the JSON-RPC connection over its stdio.
//!
//! [`AgentConnection::spawn`] starts the agent and three tasks:
//!
//! - a **reader** that owns the child's stdout, routes each response to the request
//!   waiting for it (by id) and pushes everything else, in wire order, into a bounded
//!   [`AgentEvents`] channel;
//! - a **writer** that owns the child's stdin and writes whole lines only (a request
//!   whose deadline passes mid-write can never leave half a line in the pipe), in the
//!   order they were handed to the connection: every method that writes queues its line
//!   when it is called, not when its future is first polled, so a `session/cancel` sent
//!   right after a prompt, or the end of stdin right after a cancel, can never overtake
//!   it, whichever tasks wait for them;
//! - a **supervisor** that owns the child process and its whole process tree
//!   ([`crate::process`]): it takes the tree down on request and reaps the child.
//!
//! The agent runs as the leader of its own process group, marked in its environment, and
//! guarded by a watchdog process; stopping or killing the connection takes down every
//! process the agent started, not only the agent (see [`crate::process`]).
//!
//! # Backpressure, and the one rule for callers
//!
//! The event channel is bounded and never drops and never closes because it is full:
//! when it is full the reader stops reading stdout, the pipe fills, and the agent blocks
//! on its next write. That is lossless flow control (rule 9), and it has one
//! consequence: responses travel on the same stdout, behind the notifications. **A caller
//! that awaits a response must keep draining [`AgentEvents`] at the same time** (another
//! task, or `select!`), or a prompt that streams more notifications than the channel holds
//! will time out.
//!
//! # Failures
//!
//! Every way a request can fail is one [`RpcFailure`] variant. Nothing here panics on
//! what the agent writes; garbage, unknown response ids and oversized lines are counted
//! ([`ConnectionStats`]) and reported as [`Anomaly`] events.

use std::borrow::Cow;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use palisade_wire::acp::Params;
pub use palisade_wire::connection::{
    AgentEvent, Anomaly, CloseReason, ConnectionStats, ProcessExit, RpcFailure,
    DEFAULT_MAX_LINE_BYTES,
};
use palisade_wire::connection::{Incoming, Wire};
use palisade_wire::jsonrpc::{encode_response, RawJson, RequestId, RpcError};

use crate::platform::{
    timeout_at, AgentCommand, AgentTree, Platform, SpawnError, StderrMode, Task, TreeSignal,
    WatchdogProgram,
};
use crate::tokio_platform::TokioPlatform;
use crate::watch;

/// Default capacity of the event channel; the same size as the queue that closed on
/// overflow in compozy #454, to show that here it only slows the agent down.
pub const DEFAULT_EVENT_CAPACITY: usize = 1024;

/// After stdout ends, how long we wait for the exit status before deciding the process
/// is alive with its stdout closed. A process that exits closes stdout at the same
/// moment, so its status follows within milliseconds.
pub const EXIT_GRACE: Duration = Duration::from_millis(500);

/// After the process exits, how long we keep reading a stdout that a grandchild still
/// holds open, before declaring the transport dead anyway.
pub const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// The receiving end of a connection's bounded event channel.
#[derive(Debug)]
pub struct AgentEvents {
    receiver: mpsc::Receiver<AgentEvent>,
}

impl AgentEvents {
    /// The next event; `None` after [`AgentEvent::Closed`] was received (or if the
    /// connection was dropped).
    pub async fn recv(&mut self) -> Option<AgentEvent> {
        self.receiver.recv().await
    }

    /// The next event if one is queued right now. Every notification the agent wrote
    /// before a response is queued by the time that response's request returns, so after
    /// an answer, draining this until `None` yields everything that preceded it.
    pub fn try_recv(&mut self) -> Option<AgentEvent> {
        self.receiver.try_recv().ok()
    }
}

/// Knobs of one connection.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// Capacity of [`AgentEvents`] (at least 1).
    pub event_capacity: usize,
    /// Garbage lines tolerated (reported, skipped) before the connection is declared
    /// broken. 0: the first garbage line closes it with [`CloseReason::Garbage`]. ACP
    /// reserves stdout for JSON-RPC, so an agent that prints there is broken; raise this
    /// only for agents known to log a banner to stdout.
    pub garbage_budget: u32,
    /// Where the agent's stderr goes.
    pub stderr: StderrMode,
    /// Longest line accepted from the agent; see [`DEFAULT_MAX_LINE_BYTES`].
    pub max_line_bytes: usize,
    /// The watchdog that takes the agent's tree down if this process dies without running
    /// any code (SIGKILL); see [`crate::process`].
    pub watchdog: WatchdogProgram,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            event_capacity: DEFAULT_EVENT_CAPACITY,
            garbage_budget: 0,
            stderr: StderrMode::Inherit,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            watchdog: WatchdogProgram::default(),
        }
    }
}

type Reply = Result<RawJson, RpcFailure>;

/// The connection's bookkeeping, shared by the reader and the callers under one lock, so
/// that a request can never be registered after the connection closed (and so wait for
/// nothing).
#[derive(Debug)]
struct Shared {
    wire: Mutex<Wire<oneshot::Sender<Reply>>>,
    kill_requested: AtomicBool,
}

impl Shared {
    fn wire(&self) -> MutexGuard<'_, Wire<oneshot::Sender<Reply>>> {
        // The lock is only held for map operations that cannot panic, so it is never
        // poisoned; recover the data anyway rather than propagate a panic.
        self.wire
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn closed_failure(&self) -> Option<RpcFailure> {
        self.wire().closed().map(CloseReason::failure)
    }
}

/// Abandons a request when its future ends, however it ends, so an abandoned request can
/// neither leak a slot nor make its late answer look unknown.
#[derive(Debug)]
struct PendingGuard {
    shared: Arc<Shared>,
    id: i64,
}

impl PendingGuard {
    /// Takes the id out of the pending requests; true if it was still there (no answer
    /// came). The id is then remembered as late.
    fn abandon(&self) -> bool {
        self.shared.wire().abandon(self.id).is_some()
    }
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        // A no-op when the answer (or the close) already took the id out.
        let _ = self.abandon();
    }
}

enum WriteJob {
    Line {
        line: String,
        written: oneshot::Sender<Result<(), io::ErrorKind>>,
    },
    CloseStdin,
}

/// How the connection was asked to take the agent's tree down; a later, harder request
/// overrides an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Takedown {
    None,
    /// SIGTERM to the tree, SIGKILL after [`crate::process::TERM_GRACE`].
    Terminate,
    /// SIGKILL to the tree.
    Kill,
}

/// A running ACP agent and the JSON-RPC connection to it. Methods take `&self`: share it
/// with an `Arc` to prompt from one task and cancel from another.
///
/// Dropping it kills the agent's whole process tree (SIGKILL) and reaps it in the
/// background.
#[derive(Debug)]
pub struct AgentConnection {
    platform: Arc<dyn Platform>,
    shared: Arc<Shared>,
    writer: mpsc::UnboundedSender<WriteJob>,
    takedown: watch::Sender<Takedown>,
    exit: watch::Receiver<Option<ProcessExit>>,
    /// True once no process of the agent's tree is left (after `exit`).
    down: watch::Receiver<bool>,
    reader: Task,
    pid: Option<u32>,
}

impl std::fmt::Debug for WriteJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteJob::Line { line, .. } => f.debug_struct("Line").field("line", line).finish(),
            WriteJob::CloseStdin => f.write_str("CloseStdin"),
        }
    }
}

impl AgentConnection {
    /// Starts the agent (with its watchdog) and the connection's tasks. Must be called
    /// inside a tokio runtime. The events must be drained (see the module docs).
    pub fn spawn(
        command: &AgentCommand,
        config: ConnectionConfig,
    ) -> Result<(AgentConnection, AgentEvents), SpawnError> {
        AgentConnection::spawn_on(Arc::new(TokioPlatform), command, config)
    }

    /// [`AgentConnection::spawn`] on `platform`: its processes, clock and tasks.
    pub fn spawn_on(
        platform: Arc<dyn Platform>,
        command: &AgentCommand,
        config: ConnectionConfig,
    ) -> Result<(AgentConnection, AgentEvents), SpawnError> {
        let spawned = platform.spawn_agent(command, config.stderr, &config.watchdog)?;
        let pid = spawned.pid;
        let shared = Arc::new(Shared {
            wire: Mutex::new(Wire::new(config.garbage_budget)),
            kill_requested: AtomicBool::new(false),
        });
        let (exit_tx, exit_rx) = watch::channel(None);
        let (down_tx, down_rx) = watch::channel(false);
        let (takedown_tx, takedown_rx) = watch::channel(Takedown::None);
        // Unbounded, so a line is queued (its place in the order fixed) without waiting:
        // what it holds is bounded by the callers (requests by `MAX_PENDING_REQUESTS`,
        // answers by the agent's own requests, one notification per caller decision).
        let (write_tx, write_rx) = mpsc::unbounded_channel();
        let (event_tx, event_rx) = mpsc::channel(config.event_capacity.max(1));

        // Detached: each ends by itself (the supervisor once the tree is down, the writer
        // once the connection is dropped).
        let _ = platform.spawn(Box::pin(supervise(
            Arc::clone(&platform),
            spawned.tree,
            takedown_rx,
            exit_tx,
            down_tx,
        )));
        let _ = platform.spawn(Box::pin(write_loop(spawned.stdin, write_rx)));
        let reader = platform.spawn(Box::pin(
            Reader {
                platform: Arc::clone(&platform),
                lines: LineReader::new(spawned.stdout, config.max_line_bytes),
                shared: Arc::clone(&shared),
                events: event_tx,
                exit: exit_rx.clone(),
            }
            .run(),
        ));

        let connection = AgentConnection {
            platform,
            shared,
            writer: write_tx,
            takedown: takedown_tx,
            exit: exit_rx,
            down: down_rx,
            reader,
            pid,
        };
        Ok((connection, AgentEvents { receiver: event_rx }))
    }

    /// The agent's process id (None if it was already reaped at spawn).
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Counters so far.
    #[must_use]
    pub fn stats(&self) -> ConnectionStats {
        self.shared.wire().stats()
    }

    /// Why the connection closed, once it has.
    #[must_use]
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.shared.wire().closed().cloned()
    }

    /// The agent's exit status, once it was reaped.
    #[must_use]
    pub fn exit_status(&self) -> Option<ProcessExit> {
        *self.exit.borrow()
    }

    /// Sends a request and waits for its answer until `deadline`.
    ///
    /// The line is written whole even if the deadline passes first; an answer that comes
    /// after the deadline is reported as [`Anomaly::LateResponse`]. A result that no tree
    /// can hold (a number beyond `f64`; [`AgentConnection::request_raw`] keeps it as
    /// written) fails as a JSON-RPC parse error of ours, [`codes::PARSE_ERROR`].
    ///
    /// [`codes::PARSE_ERROR`]: palisade_wire::jsonrpc::codes::PARSE_ERROR
    pub async fn request(
        &self,
        method: &str,
        params: impl Into<Params>,
        deadline: Instant,
    ) -> Result<Value, RpcFailure> {
        let result = self.request_raw(method, params, deadline).await?;
        result.parse::<Value>().map_err(|error| {
            RpcFailure::Rpc(RpcError::new(
                palisade_wire::jsonrpc::codes::PARSE_ERROR,
                format!("the result is not readable as a tree: {error}"),
            ))
        })
    }

    /// [`AgentConnection::request`] with the answer's result kept raw: the caller reads
    /// the members it needs instead of a tree.
    pub async fn request_raw(
        &self,
        method: &str,
        params: impl Into<Params>,
        deadline: Instant,
    ) -> Result<RawJson, RpcFailure> {
        self.send_request(method, params)?.answer(deadline).await
    }

    /// Queues a request now (its line goes out after every line queued before it, and
    /// before every line queued after it) and hands back its answer to wait for:
    /// [`PendingRequest::answer`]. Dropping the [`PendingRequest`] abandons the request
    /// (its answer, if one comes, is reported as [`Anomaly::LateResponse`]).
    pub fn send_request(
        &self,
        method: &str,
        params: impl Into<Params>,
    ) -> Result<PendingRequest, RpcFailure> {
        let (reply_tx, reply) = oneshot::channel();
        let registered = self.shared.wire().request(method, &params.into(), reply_tx);
        let (id, line) = registered.map_err(|(_, failure)| failure)?;
        // From here on, however the request ends (answer, failure, deadline, or the caller
        // dropping it), the guard takes the id out of `pending`.
        let guard = PendingGuard {
            shared: Arc::clone(&self.shared),
            id,
        };
        let written = self.queue_line(line)?;
        Ok(PendingRequest {
            platform: Arc::clone(&self.platform),
            guard,
            written,
            reply,
        })
    }

    /// Sends a notification (e.g. `session/cancel`): queued when called (see the module
    /// docs on order); the future resolves once it is written, or at `deadline`.
    pub fn notify(
        &self,
        method: &str,
        params: impl Into<Params>,
        deadline: Instant,
    ) -> impl Future<Output = Result<(), RpcFailure>> + Send + 'static {
        let line = params.into().notification_line(method);
        self.write_by(line, deadline)
    }

    /// Answers a request the agent sent ([`AgentEvent::Request`]): queued when called;
    /// the future resolves once it is written, or at `deadline`.
    pub fn respond(
        &self,
        id: &RequestId,
        outcome: Result<Value, RpcError>,
        deadline: Instant,
    ) -> impl Future<Output = Result<(), RpcFailure>> + Send + 'static {
        let line = encode_response(id, &outcome);
        self.write_by(line, deadline)
    }

    /// Closes the agent's stdin after the lines already queued (ACP agents may exit on
    /// EOF; none of the real ones measured does). Lines queued after it are not written.
    pub fn close_stdin(&self) {
        // Fails only if the writer is gone, and then stdin is closed already.
        let _ = self.writer.send(WriteJob::CloseStdin);
    }

    /// Queues a notification, and does not wait for its write: a connection that fails
    /// reports itself through [`AgentEvents`]. Err if the connection is closed already.
    pub fn queue_notification(
        &self,
        method: &str,
        params: impl Into<Params>,
    ) -> Result<(), RpcFailure> {
        let line = params.into().notification_line(method);
        self.queue_line(line).map(drop)
    }

    /// Queues the answer to a request the agent sent, and does not wait for its write
    /// (see [`AgentConnection::queue_notification`]).
    pub fn queue_response(
        &self,
        id: &RequestId,
        outcome: &Result<Value, RpcError>,
    ) -> Result<(), RpcFailure> {
        self.queue_line(encode_response(id, outcome)).map(drop)
    }

    /// Queues `line` now; the future resolves once it is written, or at `deadline` (the
    /// line is written whole anyway).
    fn write_by(
        &self,
        line: String,
        deadline: Instant,
    ) -> impl Future<Output = Result<(), RpcFailure>> + Send + 'static {
        let queued = self.queue_line(line);
        let platform = Arc::clone(&self.platform);
        let shared = Arc::clone(&self.shared);
        async move {
            let written = queued?;
            timeout_at(&*platform, deadline, wait_written(&shared, written))
                .await
                .unwrap_or(Err(RpcFailure::TimedOut))
        }
    }

    /// Hands `line` to the writer, behind every line queued before it; the receiver
    /// hears whether it was written.
    fn queue_line(&self, line: String) -> Result<Written, RpcFailure> {
        self.fail_if_closed()?;
        let (written_tx, written_rx) = oneshot::channel();
        let job = WriteJob::Line {
            line,
            written: written_tx,
        };
        if self.writer.send(job).is_err() {
            return Err(transport_failure(&self.shared));
        }
        Ok(written_rx)
    }

    fn take_down(&self, how: Takedown) {
        self.shared.kill_requested.store(true, Ordering::SeqCst);
        // A harder request overrides a softer one; the supervisor task may be gone (the
        // tree is down then), which is fine.
        self.takedown.send_if_modified(|asked| {
            let harder = how > *asked;
            if harder {
                *asked = how;
            }
            harder
        });
    }

    /// Sends SIGKILL to the agent's whole process tree. The supervisor reaps the agent and
    /// waits for the rest of the tree to go; in-flight requests fail with
    /// [`RpcFailure::Killed`].
    pub fn kill(&self) {
        self.take_down(Takedown::Kill);
    }

    /// Sends SIGTERM to the agent's whole process tree, and SIGKILL
    /// [`TERM_GRACE`](crate::process::TERM_GRACE) later to whatever is left.
    pub fn terminate(&self) {
        self.take_down(Takedown::Terminate);
    }

    /// Stops the agent in order: close its stdin (it may save and exit), wait until
    /// `grace_until`, then SIGTERM the tree, SIGKILL what is left after
    /// [`TERM_GRACE`](crate::process::TERM_GRACE), and wait until no process of the tree
    /// is left. The agent's exit status, if it was reaped.
    pub async fn stop(&self, grace_until: Instant) -> Option<ProcessExit> {
        self.close_stdin();
        let mut exit = self.exit.clone();
        if timeout_at(&*self.platform, grace_until, exited(&mut exit))
            .await
            .is_err()
        {
            self.terminate();
        }
        // The agent exited by itself, or was told to: either way the supervisor task takes
        // the rest of the tree down now.
        self.wait_exit(self.platform.now() + TREE_DOWN_BOUND).await
    }

    /// Waits until the agent was reaped and no process of its tree is left, or
    /// `deadline`; the agent's exit status, if it was reaped.
    pub async fn wait_exit(&self, deadline: Instant) -> Option<ProcessExit> {
        let mut down = self.down.clone();
        // The supervisor task publishes `down` only after the exit status; if it is
        // dropped (runtime shutdown), its guard took the tree down.
        let _ = timeout_at(&*self.platform, deadline, down.wait_for(|down| *down)).await;
        *self.exit.borrow()
    }

    /// [`kill`](Self::kill), then [`wait_exit`](Self::wait_exit).
    pub async fn kill_and_reap(&self, deadline: Instant) -> Option<ProcessExit> {
        self.kill();
        self.wait_exit(deadline).await
    }

    /// A closed connection takes no more lines: its agent can no longer answer, and a
    /// caller must learn that now rather than from a silent success.
    fn fail_if_closed(&self) -> Result<(), RpcFailure> {
        self.shared.closed_failure().map_or(Ok(()), Err)
    }
}

/// Whether a queued line was written: what the writer reports for it.
type Written = oneshot::Receiver<Result<(), io::ErrorKind>>;

/// Why a write failed: the connection's close, if it closed, else the transport.
fn transport_failure(shared: &Shared) -> RpcFailure {
    shared
        .closed_failure()
        .unwrap_or(RpcFailure::TransportClosed)
}

/// Waits until the writer wrote (or failed to write) a queued line.
async fn wait_written(shared: &Shared, written: Written) -> Result<(), RpcFailure> {
    match written.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) | Err(_) => Err(transport_failure(shared)),
    }
}

/// A request queued on the connection ([`AgentConnection::send_request`]), whose answer is
/// still to come. Dropping it abandons the request.
#[derive(Debug)]
pub struct PendingRequest {
    platform: Arc<dyn Platform>,
    guard: PendingGuard,
    written: Written,
    reply: oneshot::Receiver<Reply>,
}

impl PendingRequest {
    /// Waits for the answer until `deadline`.
    ///
    /// The line is written whole even if the deadline passes first; an answer that comes
    /// after the deadline is reported as [`Anomaly::LateResponse`].
    pub async fn answer(self, deadline: Instant) -> Result<RawJson, RpcFailure> {
        let PendingRequest {
            platform,
            guard,
            written,
            mut reply,
        } = self;
        let outcome = timeout_at(&*platform, deadline, async {
            wait_written(&guard.shared, written).await?;
            // The reader fails every pending request when it closes, so the sender is
            // never dropped unanswered; if it were, the transport is gone.
            (&mut reply)
                .await
                .unwrap_or(Err(RpcFailure::TransportClosed))
        })
        .await;
        match outcome {
            Ok(reply) => reply,
            Err(_elapsed) => {
                if guard.abandon() {
                    return Err(RpcFailure::TimedOut);
                }
                // The reader answered between the deadline and our lock: take the answer.
                reply.try_recv().unwrap_or(Err(RpcFailure::TimedOut))
            }
        }
    }
}

impl Drop for AgentConnection {
    fn drop(&mut self) {
        // The reader may be parked on a full event channel nobody drains any more.
        self.reader.abort();
        self.kill();
    }
}

/// Resolves once the supervisor published the exit status. `None` only if the
/// supervisor ended without one (its task was dropped at runtime shutdown).
async fn exited(exit: &mut watch::Receiver<Option<ProcessExit>>) -> Option<ProcessExit> {
    match exit.wait_for(Option::is_some).await {
        Ok(status) => *status,
        Err(_) => None,
    }
}

/// How long a stop or kill may take from the first signal until no process of the tree
/// is left: the SIGTERM grace, then the SIGKILL wait, with room to spare.
const TREE_DOWN_BOUND: Duration = Duration::from_secs(12);
const _: () = assert!(
    TREE_DOWN_BOUND.as_millis()
        > crate::process::TERM_GRACE.as_millis() + 2 * crate::process::DOWN_WITHIN.as_millis()
);

/// Owns the agent's process tree: waits for the agent, takes the tree down when asked (or
/// when the connection is gone), always reaps the agent, and then takes down whatever is
/// left of its tree (an agent that exits leaves no orphans behind). Publishes the exit
/// status as soon as the agent is reaped, and `down` once the tree is gone.
async fn supervise(
    platform: Arc<dyn Platform>,
    mut tree: Box<dyn AgentTree>,
    mut takedown: watch::Receiver<Takedown>,
    exit: watch::Sender<Option<ProcessExit>>,
    down: watch::Sender<bool>,
) {
    tree.arm().await;
    let mut asked = Takedown::None;
    let mut listening = true;
    let mut escalate_at: Option<Instant> = None;
    let status = loop {
        let escalate = platform.sleep_until(escalate_at.unwrap_or_else(|| platform.now()));
        tokio::select! {
            biased;
            status = tree.wait() => break status,
            changed = takedown.changed(), if listening => {
                // A dropped connection means kill.
                let wanted = match changed {
                    Ok(()) => *takedown.borrow_and_update(),
                    Err(_) => {
                        listening = false;
                        Takedown::Kill
                    }
                };
                if wanted <= asked {
                    continue;
                }
                asked = wanted;
                match wanted {
                    Takedown::None => {}
                    Takedown::Terminate => {
                        tree.signal(TreeSignal::Terminate);
                        escalate_at = Some(platform.now() + crate::process::TERM_GRACE);
                    }
                    Takedown::Kill => {
                        tree.signal(TreeSignal::Kill);
                        tree.kill_child();
                    }
                }
            }
            () = escalate, if escalate_at.is_some() => {
                escalate_at = None;
                asked = Takedown::Kill;
                tree.signal(TreeSignal::Kill);
                tree.kill_child();
            }
        }
    };
    exit.send_replace(Some(status));
    if tree.take_down(asked == Takedown::Kill).await {
        tree.disarm().await;
    } else {
        // The tree's guard SIGKILLs again as it drops, and the watchdog, its lifeline
        // dropped, keeps trying.
        drop(tree);
    }
    down.send_replace(true);
}

/// Owns the child's stdin and writes whole lines, in order.
async fn write_loop(
    stdin: Box<dyn AsyncWrite + Send + Unpin>,
    mut jobs: mpsc::UnboundedReceiver<WriteJob>,
) {
    let mut stdin = Some(stdin);
    let mut broken: Option<io::ErrorKind> = None;
    while let Some(job) = jobs.recv().await {
        match job {
            WriteJob::CloseStdin => stdin = None,
            WriteJob::Line { line, written } => {
                let result = match (&mut stdin, broken) {
                    (_, Some(kind)) => Err(kind),
                    (None, None) => Err(io::ErrorKind::BrokenPipe),
                    (Some(pipe), None) => {
                        let result = async {
                            pipe.write_all(line.as_bytes()).await?;
                            pipe.flush().await
                        }
                        .await;
                        result.map_err(|error| error.kind())
                    }
                };
                if let Err(kind) = result {
                    // A failed write may have left part of a line in the pipe; nothing
                    // after it could be framed correctly, so the stdin stays broken.
                    broken = Some(kind);
                    stdin = None;
                }
                // The caller may have given up (deadline); the line was written anyway.
                let _ = written.send(result);
            }
        }
    }
}

/// One read from stdout.
enum ReadOutcome<'a> {
    /// A whole line, without its newline: borrowed from the read buffer when it came in
    /// one read (the usual case), else gathered.
    Line(Cow<'a, [u8]>),
    Oversized(usize),
    /// End of stdout, with an unterminated last line if there was one.
    Eof(Option<Vec<u8>>),
    Failed(io::ErrorKind),
}

/// Newline-delimited lines with a length bound. Cancel-safe: all progress is kept in
/// `self`, and the only await is `fill_buf`, which consumes nothing.
struct LineReader<R> {
    inner: BufReader<R>,
    line: Vec<u8>,
    /// Bytes of the current line so far, counted past `max_line_bytes` too.
    line_bytes: usize,
    max_line_bytes: usize,
    /// Bytes of the line last handed out borrowed (its newline included), consumed from
    /// the buffer when the next one is asked for.
    lent: usize,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    fn new(inner: R, max_line_bytes: usize) -> Self {
        Self {
            inner: BufReader::with_capacity(64 * 1024, inner),
            line: Vec::new(),
            line_bytes: 0,
            max_line_bytes,
            lent: 0,
        }
    }

    async fn next(&mut self) -> ReadOutcome<'_> {
        self.inner.consume(std::mem::take(&mut self.lent));
        loop {
            let buf = match self.inner.fill_buf().await {
                Ok(buf) => buf,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return ReadOutcome::Failed(error.kind()),
            };
            if buf.is_empty() {
                let partial = (self.line_bytes > 0 && self.line_bytes <= self.max_line_bytes)
                    .then(|| std::mem::take(&mut self.line));
                self.line_bytes = 0;
                return ReadOutcome::Eof(partial);
            }
            let newline = memchr::memchr(b'\n', buf);
            if let Some(at) =
                newline.filter(|&at| self.line_bytes == 0 && at <= self.max_line_bytes)
            {
                // A whole line in the buffer: lent as it is, consumed by the next call.
                self.lent = at + 1;
                let buf = self.inner.buffer();
                return ReadOutcome::Line(Cow::Borrowed(&buf[..at]));
            }
            let (chunk, found_newline) = match newline {
                Some(at) => (&buf[..at], true),
                None => (buf, false),
            };
            let chunk_len = chunk.len();
            self.line_bytes += chunk_len;
            if self.line_bytes <= self.max_line_bytes {
                self.line.extend_from_slice(chunk);
            } else {
                // Past the bound: stop keeping bytes, keep counting until the newline.
                self.line = Vec::new();
            }
            self.inner.consume(chunk_len + usize::from(found_newline));
            if found_newline {
                let bytes = std::mem::take(&mut self.line_bytes);
                let line = std::mem::take(&mut self.line);
                return if bytes > self.max_line_bytes {
                    ReadOutcome::Oversized(bytes)
                } else {
                    ReadOutcome::Line(Cow::Owned(line))
                };
            }
        }
    }
}

struct Reader {
    platform: Arc<dyn Platform>,
    lines: LineReader<Box<dyn AsyncRead + Send + Unpin>>,
    shared: Arc<Shared>,
    events: mpsc::Sender<AgentEvent>,
    exit: watch::Receiver<Option<ProcessExit>>,
}

impl Reader {
    async fn run(mut self) {
        let reason = self.read_until_closed().await;
        let pending = self.shared.wire().close(reason.clone());
        for (waiter, failure) in pending {
            // The waiter may have given up already; nothing to tell it then.
            let _ = waiter.send(Err(failure));
        }
        emit(&self.shared, &self.events, AgentEvent::Closed(reason)).await;
    }

    async fn read_until_closed(&mut self) -> CloseReason {
        // Set once the process exited while stdout was still open (a grandchild holds it).
        let mut drain_deadline: Option<Instant> = None;
        let mut exit = self.exit.clone();
        loop {
            // A timer only once there is a deadline: not a clock reading and a timer made
            // and dropped for every line.
            let drained = drain_deadline.map(|at| self.platform.sleep_until(at));
            let outcome = tokio::select! {
                biased;
                outcome = self.lines.next() => outcome,
                _ = exited(&mut exit), if drain_deadline.is_none() => {
                    drain_deadline = Some(self.platform.now() + DRAIN_GRACE);
                    continue;
                }
                () = async {
                    match drained {
                        Some(drained) => drained.await,
                        None => std::future::pending().await,
                    }
                }, if drain_deadline.is_some() => {
                    return self.end_reason().await;
                }
            };
            match outcome {
                ReadOutcome::Line(line) => {
                    if let Some(reason) = handle_line(&self.shared, &self.events, &line).await {
                        return reason;
                    }
                }
                ReadOutcome::Oversized(bytes) => {
                    let (event, closes) = {
                        let mut wire = self.shared.wire();
                        let event = wire.oversized(bytes);
                        let closes = wire.spend(&event);
                        (event, closes)
                    };
                    emit(&self.shared, &self.events, event).await;
                    if let Some(reason) = closes {
                        return reason;
                    }
                }
                ReadOutcome::Eof(partial) => {
                    if let Some(line) = partial {
                        // An agent that dies mid-line leaves a fragment; one that simply
                        // omits the last newline leaves a whole message. Either way EOF
                        // is the reason we close, not the fragment.
                        let _ = handle_line(&self.shared, &self.events, &line).await;
                    }
                    return self.end_reason().await;
                }
                ReadOutcome::Failed(kind) => return CloseReason::ReadFailed(kind),
            }
        }
    }

    /// Stdout is done: did the process exit, or did it only close stdout?
    async fn end_reason(&mut self) -> CloseReason {
        let deadline = self.platform.now() + EXIT_GRACE;
        let status = timeout_at(&*self.platform, deadline, exited(&mut self.exit))
            .await
            .unwrap_or(None);
        if self.shared.kill_requested.load(Ordering::SeqCst) {
            return CloseReason::Killed(status);
        }
        match status {
            Some(status) => CloseReason::ProcessExited(status),
            None => CloseReason::StdoutClosed,
        }
    }
}

/// Handles one line; `Some` if it closes the connection.
async fn handle_line(
    shared: &Shared,
    events: &mpsc::Sender<AgentEvent>,
    line: &[u8],
) -> Option<CloseReason> {
    let (event, closes) = {
        let mut wire = shared.wire();
        match wire.receive(line) {
            Incoming::Reply { tag, result } => {
                // The waiter may have just timed out; it then reads nothing.
                let _ = tag.send(result);
                return None;
            }
            Incoming::Event(event) => {
                let closes = wire.spend(&event);
                (event, closes)
            }
            Incoming::Nothing => return None,
        }
    };
    emit(shared, events, event).await;
    closes
}

/// Delivers an event, waiting while the channel is full (backpressure). If the receiver
/// is gone the event is counted and dropped: nobody can read it.
async fn emit(shared: &Shared, events: &mpsc::Sender<AgentEvent>, event: AgentEvent) {
    if events.send(event).await.is_err() {
        shared.wire().lost_event();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(input: &[u8], max_line_bytes: usize) -> Vec<String> {
        let mut reader = LineReader::new(input, max_line_bytes);
        let mut out = Vec::new();
        loop {
            match reader.next().await {
                ReadOutcome::Line(line) => out.push(String::from_utf8(line.into_owned()).unwrap()),
                ReadOutcome::Oversized(bytes) => out.push(format!("<oversized {bytes}>")),
                ReadOutcome::Eof(partial) => {
                    if let Some(partial) = partial {
                        out.push(format!("<eof {}>", String::from_utf8(partial).unwrap()));
                    }
                    return out;
                }
                ReadOutcome::Failed(kind) => panic!("read failed: {kind:?}"),
            }
        }
    }

    #[tokio::test]
    async fn line_reader_splits_lines_and_keeps_an_unterminated_tail() {
        assert_eq!(
            read_all(b"a\nbc\n\nd", 16).await,
            ["a", "bc", "", "<eof d>"]
        );
        assert_eq!(read_all(b"", 16).await, Vec::<String>::new());
    }

    #[tokio::test]
    async fn line_reader_skips_an_oversized_line_and_resyncs() {
        // The small buffer sizes make the bound fall inside, at and across reads.
        let mut input = vec![b'x'; 200_000];
        input.extend_from_slice(b"\nok\n");
        input.extend_from_slice(&[b'y'; 100]);
        input.extend_from_slice(b"\n");
        assert_eq!(
            read_all(&input, 100).await,
            ["<oversized 200000>", "ok", "y".repeat(100).as_str()]
        );
        // An oversized unterminated tail is dropped, not returned.
        assert_eq!(read_all(&[b'z'; 300], 100).await, Vec::<String>::new());
    }

    #[test]
    fn close_reasons_map_to_failures() {
        assert_eq!(
            CloseReason::ProcessExited(ProcessExit::Signal(9)).failure(),
            RpcFailure::ProcessExited {
                status: ProcessExit::Signal(9)
            }
        );
        assert_eq!(
            CloseReason::StdoutClosed.failure(),
            RpcFailure::TransportClosed
        );
        assert_eq!(CloseReason::Killed(None).failure(), RpcFailure::Killed);
        assert_eq!(
            CloseReason::Garbage("x".into()).failure(),
            RpcFailure::Garbage { line: "x".into() }
        );
    }
}
