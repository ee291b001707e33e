//! `palisade-proxy`'s loop: an ACP agent on its own stdio that runs the real agent through
//! the core and the engine.
//!
//! A platform that launches `X` as its ACP agent launches `palisade-proxy --agent-cmd "X"`
//! instead. Upstream the proxy speaks ACP as an agent; downstream the [`Supervisor`] runs
//! one agent process per session attempt, fenced by the core: late callbacks of dead
//! attempts go nowhere, a conversation is replaced only on proof, a turn whose agent dies is
//! recovered with its context replayed once, its output reaches the client once and in
//! order, and the agents' requests (`session/request_permission`, `fs/*`, `terminal/*`)
//! reach the client, whose answers reach only the execution that asked. The mapping is the
//! sans-IO [`Router`](palisade_engine::proxy::Router); this loop moves lines between it, the
//! client and the supervisor, and starts a *probe* of the agent to answer `initialize`
//! with the agent's own capabilities.
//!
//! The loop runs over seams ([`Io`]): the binary fills them with stdin, stdout, SIGINT and
//! SIGTERM and tokio ([`real`]); the simulator can fill them with simulated ones. Exit
//! code: 0 when the client closed its end (stdin EOF), 1 when the supervisor could not run
//! on (its state file could not be written), 2 on bad usage or an unusable or busy state
//! file, 130 / 143 after SIGINT / SIGTERM (every agent is stopped first).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::{value_parser, Parser};
use palisade_core::classify::AgentProfile;
use palisade_engine::proxy::{Command, Router};
use palisade_engine::ClientSide;
use palisade_wire::acp::{self, Params};
use palisade_wire::{RawJson, RpcFailure};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use crate::logging::LogFormat;
use crate::platform::{BoxFuture, Platform};
use crate::rpc::{AgentConnection, AgentEvents};
use crate::supervise::{
    agent_words, parse_delays, parse_initialize_timeout, parse_log_format, parse_profile,
    AgentWords, Delays,
};
use crate::{
    AgentCommand, Embedding, StartError, StderrMode, Supervisor, SupervisorConfig, SupervisorError,
};

/// The program's name, before every message it prints for the operator.
pub const PROGRAM: &str = "palisade-proxy";

/// The longest line accepted from the client. A prompt's content is at most 1 MiB
/// (`MAX_PROMPT_BYTES`) as the engine keeps it; a line may be larger only by its envelope,
/// so past this the client is broken and the proxy stops reading it.
pub const MAX_CLIENT_LINE_BYTES: usize = 4 << 20;

/// Events taken from the supervisor before the client's lines are written out: one write
/// (and flush) carries a burst of updates, not one each.
const EVENTS_AT_ONCE: usize = 256;

/// How long the probe may take to answer `initialize` or `authenticate`.
pub const PROBE_WITHIN: Duration = Duration::from_secs(60);

const AFTER_HELP: &str = "\
Put it where the agent's command was: palisade-proxy speaks ACP on its stdin and stdout as the
agent would, and runs the agent (--agent-cmd) under Palisade's fence: one agent process per
session attempt, recovered when it dies mid-turn, conversations replaced only on proof (the
client hears of it: _palisade/conversation_replaced), every update once and in order, the
agent's permission, fs and terminal requests passed to the client.

With --state, a proxy killed and started again loads its sessions (session/load of a
palisade-proxy session id); one palisade-proxy at a time may use a state file.

Exit: 0 the client closed stdin; 1 the state file could not be written; 2 bad usage or an
unusable or busy state file; 130/143 stopped by SIGINT/SIGTERM (every agent process is
stopped first). Logs go to stderr, filtered by RUST_LOG (default info).";

/// The command line, as clap reads it.
#[derive(Debug, Parser)]
#[command(
    name = PROGRAM,
    about = "An ACP agent that runs another ACP agent under Palisade's fence.",
    after_help = AFTER_HELP,
)]
struct Cli {
    /// The agent's command line, split into words as a POSIX shell
    /// splits them (quotes, backslashes); no shell runs
    #[arg(long, value_name = "CMD", allow_hyphen_values = true, verbatim_doc_comment,
          value_parser = OsStringValueParser::new().try_map(agent_words))]
    agent_cmd: AgentWords,
    /// Persist the proxy's state here; restore it on start
    #[arg(long, value_name = "FILE", value_parser = value_parser!(PathBuf))]
    state: Option<PathBuf>,
    /// Comma-separated delays before each recovery of a turn whose
    /// agent died [default: 1000,2000,4000]; empty disables recovery
    #[arg(long, value_name = "LIST", allow_hyphen_values = true, verbatim_doc_comment,
          value_parser = parse_delays)]
    recovery_delays_ms: Option<Delays>,
    /// generic (default), claude-agent-acp, claude-code-acp,
    /// codex-acp, codex-acp-ts, gemini, goose, opencode
    #[arg(long, value_name = "NAME", verbatim_doc_comment, value_parser = parse_profile)]
    agent_profile: Option<AgentProfile>,
    /// Log lines on stderr: text or json
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = parse_log_format)]
    log_format: LogFormat,
    /// How long an agent may take to answer initialize
    /// [default: 30000]
    #[arg(long, value_name = "MS", verbatim_doc_comment, value_parser = parse_initialize_timeout)]
    initialize_timeout_ms: Option<u64>,
    /// How long a turn's agent may stay silent (no update, no
    /// answer) before the prompt is cancelled, the agent stopped
    /// and the turn recovered [default: 600000]; 0 never gives up
    #[arg(long, value_name = "MS", verbatim_doc_comment, value_parser = value_parser!(u64))]
    turn_idle_ms: Option<u64>,
}

/// What the command line asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// The agent's command line, split into words.
    pub agent: Vec<OsString>,
    /// The state file.
    pub state: Option<PathBuf>,
    /// `--recovery-delays-ms`.
    pub recovery_delays_ms: Option<Vec<u64>>,
    /// `--agent-profile`.
    pub profile: Option<AgentProfile>,
    /// `--log-format`.
    pub log_format: LogFormat,
    /// `--turn-idle-ms`; `None`: the engine's default
    /// ([`palisade_engine::DEFAULT_TURN_IDLE_MS`]).
    pub turn_idle_ms: Option<u64>,
    /// `--initialize-timeout-ms`.
    pub initialize_timeout_ms: Option<u64>,
}

/// Parses the arguments (without the program name); `Err` for bad usage and `--help`.
pub fn parse_args<I, T>(args: I) -> Result<Options, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(
        std::iter::once(OsString::from(PROGRAM)).chain(args.into_iter().map(Into::into)),
    )?;
    Ok(Options {
        agent: cli.agent_cmd.0,
        state: cli.state,
        recovery_delays_ms: cli.recovery_delays_ms.map(|d| d.0),
        profile: cli.agent_profile,
        log_format: cli.log_format,
        initialize_timeout_ms: cli.initialize_timeout_ms,
        turn_idle_ms: cli.turn_idle_ms,
    })
}

/// Prints what [`parse_args`] refused (or the help) and returns the exit code.
#[must_use]
pub fn usage_exit(error: &clap::Error) -> u8 {
    crate::cli::usage_exit(PROGRAM, error)
}

/// The supervisor's configuration for `options`: a client stands behind the caller.
pub fn config_for(options: &Options) -> Result<SupervisorConfig, (u8, String)> {
    let mut config = SupervisorConfig::default();
    config.engine.client = ClientSide::Forward;
    if !config.engine.cwd.is_absolute() {
        config.engine.cwd = std::env::current_dir()
            .map_err(|e| (1, format!("no current directory: {e}")))?
            .join(&config.engine.cwd);
    }
    if let Some(delays) = &options.recovery_delays_ms {
        config.engine.core.recovery_delays_ms.clone_from(delays);
    }
    if let Some(profile) = options.profile {
        config.engine.core.agent_profile = profile;
    }
    if let Some(ms) = options.initialize_timeout_ms {
        config.engine.initialize_timeout_ms = ms;
    }
    if let Some(ms) = options.turn_idle_ms {
        config.engine.core.turn_idle_ms = ms;
    }
    // Each update reaches the client as a line of its own: batching them would only delay
    // them.
    config.engine.coalescer.max_delay_ms = 0;
    // Agents' stderr lines go to the log: the proxy's stdout is the client's protocol.
    config.connection.stderr = StderrMode::Log;
    Ok(config)
}

/// Everything the loop runs on besides its options.
pub struct Io {
    /// The supervisor's platform and state file.
    pub embedding: Embedding,
    /// What the client writes (the proxy's stdin).
    pub upstream: Box<dyn AsyncRead + Send + Unpin>,
    /// What the client reads (the proxy's stdout).
    pub downstream: Box<dyn AsyncWrite + Send + Unpin>,
    /// Resolves with an exit code when the program is told to stop (a signal).
    pub stop: BoxFuture<'static, Option<u8>>,
    /// A value unique to this proxy's state, in the session ids it mints.
    pub nonce: String,
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Io")
            .field("embedding", &self.embedding)
            .field("nonce", &self.nonce)
            .finish_non_exhaustive()
    }
}

/// The agent started to answer the client's `initialize` (and `authenticate`) with the
/// agent's own words; stopped once the first session opens.
struct Probe {
    conn: AgentConnection,
    drain: crate::platform::Task,
}

/// Runs the proxy until the client closes its end or a signal stops it; the exit code.
pub async fn run(options: Options, config: SupervisorConfig, io: Io) -> u8 {
    let Io {
        embedding,
        upstream,
        downstream,
        stop,
        nonce,
    } = io;
    let mut words = options.agent.iter();
    let Some(program) = words.next() else {
        tracing::error!("--agent-cmd is empty");
        return 2;
    };
    let agent = AgentCommand::new(program).args(words);
    let platform = Arc::clone(&embedding.platform);
    let connection = config.connection.clone();
    let (supervisor, mut events) = match Supervisor::start_on(embedding, config, agent.clone()) {
        Ok(started) => started,
        Err(error) => {
            tracing::error!(%error, "the proxy cannot start");
            return match error {
                StartError::Persist(_) => 1,
                _ => 2,
            };
        }
    };
    let known = match supervisor.sessions().await {
        Ok(known) => known,
        Err(error) => {
            tracing::error!(%error, "the supervisor stopped at once");
            return 1;
        }
    };
    let mut router = Router::new(known.iter().map(|(s, setup)| (*s, setup)), nonce);
    let mut reader = BufReader::new(upstream);
    // The router's buffer is the only one: its lines go out in one write (no copy into a
    // writer's buffer first).
    let mut writer = downstream;
    let mut line = Vec::new();
    let mut probe: Option<Probe> = None;
    let mut hello: Option<RawJson> = None;
    let mut stop = stop;
    let mut code = 0;
    loop {
        if write_out(&mut router, &mut writer).await.is_err() {
            tracing::warn!("the client's end is closed; stopping");
            break;
        }
        tokio::select! {
            biased;
            signal = &mut stop => {
                code = signal.unwrap_or(0);
                break;
            }
            event = events.recv() => {
                let Some(event) = event else {
                    code = 1;
                    break;
                };
                router.event(&event);
                events.done();
                // Everything already waiting, then one write to the client.
                for _ in 1..EVENTS_AT_ONCE {
                    let Some(event) = events.try_recv() else {
                        break;
                    };
                    router.event(&event);
                    events.done();
                }
            }
            read = reader.read_until(b'\n', &mut line) => {
                match read {
                    Ok(0) => break,
                    Ok(_) if line.ends_with(b"\n") => {
                        let text = std::mem::take(&mut line);
                        let text = text.trim_ascii();
                        if !text.is_empty() {
                            router.upstream_line(text);
                        }
                    }
                    // A last line without its newline, then EOF on the next read.
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "reading the client failed; stopping");
                        break;
                    }
                }
                if line.len() > MAX_CLIENT_LINE_BYTES {
                    tracing::error!(bytes = line.len(), "the client wrote a line past the bound; stopping");
                    code = 2;
                    break;
                }
            }
        }
        while let Some(command) = router.poll_command() {
            let next = Carry {
                supervisor: &supervisor,
                router: &mut router,
                probe: &mut probe,
                hello: &mut hello,
                platform: &platform,
                agent: &agent,
                connection: &connection,
            };
            if let Err(error) = next.command(command).await {
                tracing::error!(%error, "the supervisor stopped");
                code = 1;
                break;
            }
        }
    }
    if let Some(probe) = probe.take() {
        probe.stop().await;
    }
    supervisor.shutdown().await;
    while let Some(event) = events.try_recv() {
        router.event(&event);
        events.done();
    }
    // What the client got is written down as done with; what it could not be given is
    // handed out again by the next start.
    if write_out(&mut router, &mut writer).await.is_ok() {
        supervisor.close().await;
    }
    if let Some(error) = supervisor.fatal_error() {
        tracing::error!(%error, "stopped: the state file could not be written");
        return 1;
    }
    code
}

/// Writes every line the router has for the client, then flushes.
async fn write_out(
    router: &mut Router,
    writer: &mut Box<dyn AsyncWrite + Send + Unpin>,
) -> std::io::Result<()> {
    let lines = router.upstream();
    if lines.is_empty() {
        return Ok(());
    }
    writer.write_all(lines).await?;
    writer.flush().await?;
    router.upstream_written();
    Ok(())
}

/// Carries out one of the router's commands.
struct Carry<'a> {
    supervisor: &'a Supervisor,
    router: &'a mut Router,
    probe: &'a mut Option<Probe>,
    /// The client's last `initialize` params: a probe started again is initialized with
    /// them before it is asked anything else.
    hello: &'a mut Option<RawJson>,
    platform: &'a Arc<dyn Platform>,
    agent: &'a AgentCommand,
    connection: &'a crate::rpc::ConnectionConfig,
}

impl Carry<'_> {
    async fn command(mut self, command: Command) -> Result<(), SupervisorError> {
        match command {
            Command::Initialize { request, params } => {
                self.supervisor.set_client_hello(params.clone()).await?;
                *self.hello = Some(params.clone());
                if self.probe.is_none() {
                    match Probe::start(self.platform, self.agent, self.connection) {
                        Ok(probe) => *self.probe = Some(probe),
                        Err(error) => {
                            self.router.initialized(&request, Err(error));
                            return Ok(());
                        }
                    }
                }
                let result = self.ask(acp::INITIALIZE, params).await;
                self.router.initialized(&request, result);
            }
            Command::Authenticate { request, params } => {
                let result = self.ask(acp::AUTHENTICATE, params.clone()).await;
                if result.is_ok() {
                    self.supervisor.set_client_auth(params).await?;
                }
                self.router.authenticated(&request, result);
            }
            Command::Open {
                request,
                session,
                setup,
            } => {
                if let Some(probe) = self.probe.take() {
                    probe.stop().await;
                }
                let verdict = self.supervisor.open(session, setup).await?;
                self.router.opened(&request, session, &verdict);
            }
            Command::Prompt {
                request,
                session,
                content,
            } => {
                let result = match self.supervisor.prompt_content(session, content).await {
                    Ok(turn) => Ok(turn),
                    Err(SupervisorError::Prompt(why)) => Err(why),
                    Err(stopped) => return Err(stopped),
                };
                self.router.claimed(request, session, result);
            }
            Command::Cancel { session } => {
                self.supervisor.cancel(session).await?;
            }
            Command::Forward {
                request,
                session,
                method,
                params,
            } => {
                let result = self.supervisor.forward(session, method, params).await?;
                self.router.forwarding(request, result);
            }
            Command::AnswerClient { ticket, outcome } => {
                if !self
                    .supervisor
                    .answer_client_request(ticket, outcome)
                    .await?
                {
                    tracing::info!(
                        ticket,
                        "a client answer for a retired execution was dropped"
                    );
                }
            }
        }
        Ok(())
    }

    /// Asks the probe; a probe that is gone (its agent exited, or a session opened) is
    /// started again, and initialized with the client's `initialize` params first unless
    /// that is what it is asked.
    async fn ask(&mut self, method: &str, params: RawJson) -> Result<RawJson, RpcFailure> {
        let until = self.platform.now() + PROBE_WITHIN;
        if self
            .probe
            .as_ref()
            .is_some_and(|p| p.conn.close_reason().is_some())
        {
            tracing::info!("the agent answering the client's initialize exited; starting another");
            if let Some(dead) = self.probe.take() {
                dead.stop().await;
            }
        }
        if self.probe.is_none() {
            let probe = Probe::start(self.platform, self.agent, self.connection)?;
            let hello = self.hello.clone().filter(|_| method != acp::INITIALIZE);
            *self.probe = Some(probe);
            if let Some(hello) = hello {
                let probe = self.probe.as_ref().expect("just started");
                probe
                    .conn
                    .request_raw(acp::INITIALIZE, Params::Raw(hello), until)
                    .await?;
            }
        }
        let probe = self.probe.as_ref().expect("started above");
        probe
            .conn
            .request_raw(method, Params::Raw(params), until)
            .await
    }
}

impl Probe {
    fn start(
        platform: &Arc<dyn Platform>,
        agent: &AgentCommand,
        connection: &crate::rpc::ConnectionConfig,
    ) -> Result<Probe, RpcFailure> {
        let (conn, events) =
            AgentConnection::spawn_on(Arc::clone(platform), agent, connection.clone()).map_err(
                |error| {
                    tracing::error!(%error, "the agent could not start");
                    RpcFailure::TransportClosed
                },
            )?;
        let drain = platform.spawn(Box::pin(drain(events)));
        Ok(Probe { conn, drain })
    }

    async fn stop(self) {
        self.drain.abort();
        let until = self.conn_deadline();
        self.conn.kill_and_reap(until).await;
    }

    fn conn_deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(10)
    }
}

/// Reads a probe's events until its connection closes (what it says is nobody's output).
async fn drain(mut events: AgentEvents) {
    while events.recv().await.is_some() {}
}

/// The real world: stdin, stdout, SIGINT and SIGTERM, tokio.
pub mod real {
    use tokio::io::AsyncWrite;

    use super::{Io, Options};
    use crate::Embedding;

    /// The program's seams on the real world. Must be called inside the tokio runtime
    /// (the stdout pipe is registered with its reactor).
    #[must_use]
    pub fn io(options: &Options) -> Io {
        Io {
            embedding: Embedding::tokio(options.state.clone()),
            upstream: Box::new(tokio::io::stdin()),
            downstream: stdout(),
            stop: Box::pin(crate::supervise::real::stop_signal()),
            nonce: nonce(),
        }
    }

    /// The client's end. A pipe (a client that launched the proxy) is written directly,
    /// non-blocking, on the runtime's reactor; anything else (a socket, a file, a
    /// terminal) through tokio's stdout, whose every write is a round trip to a blocking
    /// thread: at 100,000 updates a second those round trips were most of the proxy's
    /// system calls. The pipe's write end becomes non-blocking for whoever shares it: only
    /// the proxy writes to it (its agents' stdout and stderr are pipes of their own).
    fn stdout() -> Box<dyn AsyncWrite + Send + Unpin> {
        use std::os::fd::AsFd;
        let pipe = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .and_then(tokio::net::unix::pipe::Sender::from_owned_fd);
        match pipe {
            Ok(pipe) => Box::new(pipe),
            Err(_) => Box::new(tokio::io::stdout()),
        }
    }

    /// A value that differs between proxies: the time of start, in hex.
    fn nonce() -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{:x}", (nanos as u64) ^ u64::from(std::process::id()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_parse_and_the_client_side_is_forward() {
        let options = parse_args(["--agent-cmd", "my-agent --stdio", "--state", "/tmp/s"]).unwrap();
        assert_eq!(
            options.agent,
            vec![OsString::from("my-agent"), OsString::from("--stdio")]
        );
        let config = config_for(&options).unwrap();
        assert_eq!(config.engine.client, ClientSide::Forward);
        assert!(
            parse_args(["--state", "/tmp/s"]).is_err(),
            "--agent-cmd is required"
        );
    }
}
