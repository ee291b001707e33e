//! `palisade-supervise`'s loop, over seams: the supervisor's [`Embedding`] (platform and
//! state file), a [`Console`] (what the program prints), its prompts (stdin, or the
//! `--prompt` list) and a stop signal. The binary is a thin shell that fills them with
//! tokio, the real filesystem, stdout/stderr, a stdin reader and SIGINT/SIGTERM
//! ([`real`]); the simulator (`sim/src/stack/`) fills them with simulated ones and drives
//! this very loop.
//!
//! Each prompt waits for the previous turn to end. Exit code: 0 when every turn completed,
//! 1 when one did not (or the supervisor could not run, or an event could not be written
//! to stdout: the caller is gone, so every agent is stopped at once), 2 on bad usage or an
//! unusable or busy state file, 130 / 143 after SIGINT / SIGTERM (the agents were stopped
//! first). `--help` ([`parse_args`]) states every bound on what the program is given.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::{value_parser, Parser};
use palisade_core::classify::AgentProfile;
use palisade_core::RejectReason;
use palisade_core::{
    SessionId, TurnId, TurnOutcome, MAX_RECOVERY_DELAY_MS, MAX_RECOVERY_SCHEDULE_MS,
    MAX_RECOVERY_STEPS,
};
use palisade_engine::config::MAX_PROMPT_BYTES;
use tokio::sync::mpsc;

use crate::logging::LogFormat;
use crate::platform::BoxFuture;
use crate::{
    AgentCommand, Embedding, FailureCause, PromptError, SessionEvent, SessionEvents, StartError,
    StderrMode, Supervisor, SupervisorConfig, SupervisorError,
};

/// The program's name, before every message it prints for the operator.
pub const PROGRAM: &str = "palisade-supervise";

/// The longest `--initialize-timeout-ms`: the core's default start deadline
/// (`palisade_core::Config::start_deadline_ms`), which covers `initialize` and the
/// conversation's `session/new` or `session/load`. A longer one would never be seen to
/// pass: the start deadline fails the attempt first.
pub const MAX_INITIALIZE_TIMEOUT_MS: u64 = 60_000;

/// A turn the session was busy with is waited for at most this many times before a
/// prompt is given up (a restored supervisor may be finishing the previous turn).
const BUSY_RETRIES: u32 = 3;

/// Prompts read from stdin and not yet sent.
const STDIN_PROMPTS_QUEUED: usize = 16;

/// A prompt whose turn was rolled back is sent again at most this many times. The core
/// rolls this program's turn back only when the prompt was never written to an agent (its
/// runtime never started, or its conversation could not be loaded). A prompt written to
/// an agent, whose runtime then died or which showed no sign of it by the start deadline,
/// is the core's recovery schedule's to send again, with its replay block (rule 8), never
/// this loop's. So an agent that never answers `initialize` fails the prompt after `1 +`
/// this many initialize timeouts (`--help` says so).
const ROLLED_BACK_RESENDS: u32 = 2;

/// What `--help` prints after the flags: where prompts come from, the bounds on what the
/// program is given, and the exit codes. Every number is a named constant's (a test
/// checks them against the constants).
const AFTER_HELP: &str = "\
Prompts: each --prompt waits for the previous turn to end. Without any, prompts are read from
stdin, one per line; a blank line is skipped, and a line that is not UTF-8 or is longer than
1 MiB is refused with a message (the others still run, and the exit is then 1).

Bounds (every refusal is bad usage, exit 2, before anything runs):
  a prompt                    1 MiB (1048576 bytes) of UTF-8 text, not blank
  --recovery-delays-ms        at most 8 delays, each at most 86400000 ms (a day), and
                              adding up to at most 86400000 ms
  --initialize-timeout-ms     1 to 60000 ms (the start deadline, which covers initialize)
  --state                     a regular file of at most 256 MiB, used by one
                              palisade-supervise at a time (it holds FILE.lock, beside it,
                              for its whole life)
  --cwd                       an existing directory
An agent that never answers initialize fails the prompt after 3 initialize timeouts: a
prompt whose turn was rolled back before it was written to any agent is sent again, twice.
A prompt written to an agent that then died, or that showed no sign of it by the start
deadline, is sent again only on --recovery-delays-ms's schedule. An agent whose initialize answer names another ACP protocol version than 1 is
refused.

Exit: 0 every turn completed; 1 a turn did not (or the agent could not run, or events could
not be written to stdout: every agent is stopped then); 2 bad usage or an unusable or busy
state file; 130/143 stopped by SIGINT/SIGTERM (every agent process is stopped first).

Logs go to stderr, filtered by RUST_LOG (default info; e.g.
RUST_LOG=warn,palisade_embed::agent=off); each agent's stderr lines are logged in its
execution's span.";

/// The command line, as clap reads it.
#[derive(Debug, clap::Parser)]
#[command(
    name = PROGRAM,
    about = "Runs an ACP agent under Palisade's recovery; prints every session event as one JSON line.",
    after_help = AFTER_HELP,
)]
// Values may start with `-` (`--prompt "-v is broken"`): after a flag that takes one, the
// next argument is its value, as it always was.
struct Cli {
    /// The agent's command line, split into words as a POSIX shell
    /// splits them (quotes, backslashes, `#` comments); no variables,
    /// globs, pipes or redirections: no shell runs
    #[arg(long, value_name = "CMD", allow_hyphen_values = true, verbatim_doc_comment,
          value_parser = OsStringValueParser::new().try_map(agent_words))]
    agent_cmd: AgentWords,
    /// Persist the supervisor's state here; restore it on start
    #[arg(long, value_name = "FILE", value_parser = value_parser!(PathBuf))]
    state: Option<PathBuf>,
    /// A prompt (repeatable; each waits for the previous turn to
    /// end); without any, prompts are read from stdin, one per line
    #[arg(long = "prompt", value_name = "TEXT", allow_hyphen_values = true,
          verbatim_doc_comment, value_parser = OsStringValueParser::new().try_map(prompt_text))]
    prompts: Vec<String>,
    /// The session id
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_session)]
    session: SessionId,
    /// Working directory of the agent's conversations
    /// [default: this one]
    #[arg(long, value_name = "DIR", verbatim_doc_comment, value_parser = value_parser!(PathBuf))]
    cwd: Option<PathBuf>,
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

/// `--agent-cmd`'s words.
#[derive(Debug, Clone)]
pub(crate) struct AgentWords(pub(crate) Vec<OsString>);

/// `--recovery-delays-ms`'s delays.
#[derive(Debug, Clone)]
pub(crate) struct Delays(pub(crate) Vec<u64>);

/// What the command line asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// The agent's command line, split into words.
    pub agent: Vec<OsString>,
    /// The state file.
    pub state: Option<PathBuf>,
    /// `--prompt` texts; empty: prompts come from stdin.
    pub prompts: Vec<String>,
    /// The session.
    pub session: SessionId,
    /// The agent's conversations' working directory.
    pub cwd: Option<PathBuf>,
    /// `--recovery-delays-ms`.
    pub recovery_delays_ms: Option<Vec<u64>>,
    /// `--agent-profile`.
    pub profile: Option<AgentProfile>,
    /// `--log-format`.
    pub log_format: LogFormat,
    /// `--turn-idle-ms`; `None`: the engine's default
    /// ([`palisade_engine::DEFAULT_TURN_IDLE_MS`]).
    pub turn_idle_ms: Option<u64>,
    /// `--initialize-timeout-ms`; `None`: the engine's default.
    pub initialize_timeout_ms: Option<u64>,
}

/// Splits a command line into words as a POSIX shell does (`shlex`, on bytes): whitespace
/// separates, single quotes keep everything, double quotes keep everything but `\"`, `\\`,
/// `\$` and `` \` ``, a backslash outside quotes escapes the next byte, `#` at the start of
/// a word comments out the rest. No expansion of any kind. A word need not be UTF-8.
pub fn split_command(line: &OsStr) -> Result<Vec<OsString>, String> {
    shlex::bytes::split(line.as_bytes())
        .map(|words| words.into_iter().map(OsString::from_vec).collect())
        .ok_or_else(|| "an unterminated quote or a trailing backslash".to_owned())
}

pub(crate) fn agent_words(line: OsString) -> Result<AgentWords, String> {
    let words = split_command(&line)?;
    if words.is_empty() {
        return Err("no command".into());
    }
    Ok(AgentWords(words))
}

/// A `--prompt`: sent as a JSON string, so UTF-8; not blank (say an unset shell variable:
/// a mistake, refused rather than sent to the agent); at most [`MAX_PROMPT_BYTES`] (the
/// engine keeps and persists the text until its turn ends).
fn prompt_text(raw: OsString) -> Result<String, String> {
    let text = raw
        .into_string()
        .map_err(|_| "not UTF-8 text (a prompt is sent as a JSON string)".to_owned())?;
    if text.trim().is_empty() {
        return Err("the prompt is empty".into());
    }
    if text.len() > MAX_PROMPT_BYTES {
        return Err(format!(
            "{} bytes; a prompt is at most {MAX_PROMPT_BYTES} (1 MiB)",
            text.len()
        ));
    }
    Ok(text)
}

fn parse_session(raw: &str) -> Result<SessionId, String> {
    raw.parse::<u64>()
        .ok()
        .and_then(SessionId::new)
        .ok_or_else(|| "not a positive number".to_owned())
}

/// Comma-separated delays (blanks around them ignored; empty: no recovery), within the
/// core's bounds: at most [`MAX_RECOVERY_STEPS`], each at most [`MAX_RECOVERY_DELAY_MS`],
/// all of them at most [`MAX_RECOVERY_SCHEDULE_MS`].
pub(crate) fn parse_delays(raw: &str) -> Result<Delays, String> {
    let delays = raw
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<u64>().map_err(|_| format!("not a number: {d:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    if delays.len() > MAX_RECOVERY_STEPS {
        return Err(format!(
            "{} delays; at most {MAX_RECOVERY_STEPS}",
            delays.len()
        ));
    }
    if let Some((step, ms)) = delays
        .iter()
        .enumerate()
        .find(|(_, ms)| **ms > MAX_RECOVERY_DELAY_MS)
    {
        return Err(format!(
            "delay {} is {ms} ms; each is at most {MAX_RECOVERY_DELAY_MS} ms (a day)",
            step + 1
        ));
    }
    let total = delays.iter().fold(0u64, |sum, ms| sum.saturating_add(*ms));
    if total > MAX_RECOVERY_SCHEDULE_MS {
        return Err(format!(
            "the delays add up to {total} ms; at most {MAX_RECOVERY_SCHEDULE_MS} ms (a day)"
        ));
    }
    Ok(Delays(delays))
}

pub(crate) fn parse_log_format(raw: &str) -> Result<LogFormat, String> {
    raw.parse()
}

pub(crate) fn parse_initialize_timeout(raw: &str) -> Result<u64, String> {
    raw.parse::<u64>()
        .ok()
        .filter(|ms| (1..=MAX_INITIALIZE_TIMEOUT_MS).contains(ms))
        .ok_or_else(|| {
            format!("not a number of milliseconds from 1 to {MAX_INITIALIZE_TIMEOUT_MS}")
        })
}

/// An `--agent-profile` name.
pub fn parse_profile(name: &str) -> Result<AgentProfile, String> {
    Ok(match name {
        "generic" => AgentProfile::Generic,
        "claude-agent-acp" => AgentProfile::ClaudeAgentAcp,
        "claude-code-acp" => AgentProfile::ClaudeCodeAcp,
        "codex-acp" => AgentProfile::CodexAcpRust,
        "codex-acp-ts" => AgentProfile::CodexAcpTs,
        "gemini" => AgentProfile::GeminiCli,
        "goose" => AgentProfile::Goose,
        "opencode" => AgentProfile::Opencode,
        other => return Err(format!("unknown agent {other:?}")),
    })
}

/// Parses the arguments (without the program name). `Err` for bad usage, and for `--help`
/// (whose "error" is the help text): hand it to [`usage_exit`].
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
        prompts: cli.prompts,
        session: cli.session,
        cwd: cli.cwd,
        recovery_delays_ms: cli.recovery_delays_ms.map(|d| d.0),
        profile: cli.agent_profile,
        log_format: cli.log_format,
        initialize_timeout_ms: cli.initialize_timeout_ms,
        turn_idle_ms: cli.turn_idle_ms,
    })
}

/// Prints what [`parse_args`] refused (or the help it was asked for) and returns the exit
/// code: the help on stdout and 0, or the message on stderr after the program's name and 2.
#[must_use]
pub fn usage_exit(error: &clap::Error) -> u8 {
    crate::cli::usage_exit(PROGRAM, error)
}

/// What the program prints: session events on stdout (one JSON line each) and messages
/// for the operator on stderr.
pub trait Console: Send {
    /// One session event. It may wait: a reader that stops reading stdout holds the loop
    /// up, and with it, through the supervisor's bounded channels, the agents. `Err` when
    /// it could not be written (the reader went away: a broken pipe; a full disk).
    fn event<'a>(&'a mut self, event: &'a SessionEvent) -> BoxFuture<'a, std::io::Result<()>>;
    /// One line for the operator, without the program's name.
    fn message(&mut self, text: &str);
    /// The supervisor claimed `text` as `turn` (its answer to the prompt); not printed.
    fn prompt_claimed(&mut self, session: SessionId, turn: TurnId, text: &str) {
        let _ = (session, turn, text);
    }
}

/// One line of stdin as read: its bytes (without the newline), or the read error that
/// ended the input.
pub type StdinLine = Result<Vec<u8>, String>;

/// Everything the loop runs on besides its options.
pub struct Io {
    /// The supervisor's platform and state file.
    pub embedding: Embedding,
    /// Where events and messages go.
    pub console: Box<dyn Console>,
    /// Stdin's lines, as read (used when `--prompt` gave none): each one's bytes without
    /// its newline, or why reading failed; the channel closes at end of input. The loop
    /// decides what a line is (blank: skipped; not UTF-8: refused with a message).
    pub stdin: Option<mpsc::Receiver<StdinLine>>,
    /// Resolves with the exit code (128 + signal) when the program is told to stop.
    pub stop: BoxFuture<'static, Option<u8>>,
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Io")
            .field("embedding", &self.embedding)
            .field("stdin", &self.stdin.is_some())
            .finish_non_exhaustive()
    }
}

/// Prints events until `turn` ends (or, with `None`, until any turn of `session` ends),
/// and the cause of a turn that ended unfinished.
async fn wait_turn(
    console: &mut dyn Console,
    events: &mut SessionEvents,
    session: SessionId,
    turn: Option<TurnId>,
) -> std::io::Result<TurnOutcome> {
    while let Some(event) = events.recv_held().await {
        console.event(event).await?;
        let ended = match event {
            SessionEvent::TurnEnded {
                session,
                turn,
                outcome,
                cause,
                ..
            } => Some((*session, *turn, *outcome, cause.clone())),
            _ => None,
        };
        events.done();
        if let Some((s, t, outcome, cause)) = ended {
            if s == session && turn.is_none_or(|turn| turn == t) {
                match &cause {
                    None => {
                        tracing::info!(session = s.get(), turn = t.get(), ?outcome, "turn ended")
                    }
                    Some(cause) => tracing::warn!(
                        session = s.get(),
                        turn = t.get(),
                        ?outcome,
                        %cause,
                        "turn ended unfinished"
                    ),
                }
                if outcome != TurnOutcome::Completed {
                    console.message(&turn_message(t, outcome, cause.as_ref()));
                }
                return Ok(outcome);
            }
        }
    }
    Ok(TurnOutcome::Failed)
}

/// The most characters of a turn's cause printed (an agent's error data can be long).
const CAUSE_CHARS: usize = 400;

/// What the operator reads about a turn that did not complete: its outcome and cause (a
/// JSON-RPC error's code, message and an excerpt of its data).
#[must_use]
pub fn turn_message(turn: TurnId, outcome: TurnOutcome, cause: Option<&FailureCause>) -> String {
    match cause {
        Some(cause) => {
            let text = cause.to_string();
            let excerpt: String = text.chars().take(CAUSE_CHARS).collect();
            let more = if excerpt.len() < text.len() {
                "…"
            } else {
                ""
            };
            format!("turn {} ended {outcome:?}: {excerpt}{more}", turn.get())
        }
        None => format!("turn {} ended {outcome:?}", turn.get()),
    }
}

/// Stdin as the loop reads it: its lines, and how many it has read.
#[derive(Debug)]
struct Prompts<'a> {
    listed: &'a mut std::vec::IntoIter<String>,
    stdin: &'a mut Option<mpsc::Receiver<StdinLine>>,
    read: u64,
}

/// What one line of stdin is: a prompt, nothing (blank), or refused with the reason (not
/// UTF-8, or longer than [`MAX_PROMPT_BYTES`], blanks around it included).
fn stdin_prompt(number: u64, line: &[u8]) -> Result<Option<String>, String> {
    if line.len() > MAX_PROMPT_BYTES {
        return Err(format!(
            "stdin line {number} is longer than {MAX_PROMPT_BYTES} bytes (1 MiB); it is not sent"
        ));
    }
    match std::str::from_utf8(line) {
        Ok(text) => {
            let text = text.trim();
            Ok((!text.is_empty()).then(|| text.to_owned()))
        }
        Err(error) => Err(format!(
            "stdin line {number} is not UTF-8 text ({error}); it is not sent"
        )),
    }
}

/// Reads one line of `input` into `line` (without its `\n`), keeping at most `keep` bytes
/// of it: the rest is read and dropped, so a line without an end takes no memory past the
/// bound. The bytes read, the `\n` included; 0 at the end of the input.
fn read_line_bounded(
    input: &mut impl std::io::BufRead,
    line: &mut Vec<u8>,
    keep: usize,
) -> std::io::Result<usize> {
    let mut read = 0;
    loop {
        let buf = match input.fill_buf() {
            Ok(buf) => buf,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if buf.is_empty() {
            return Ok(read);
        }
        let end = memchr::memchr(b'\n', buf);
        let chunk = &buf[..end.unwrap_or(buf.len())];
        let room = keep.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = chunk.len() + usize::from(end.is_some());
        input.consume(used);
        read += used;
        if end.is_some() {
            return Ok(read);
        }
    }
}

/// The next prompt: from the list, or from stdin (printing events while waiting). A line
/// that is not a prompt is refused with a message, and the run does not exit 0.
async fn next_prompt(
    console: &mut dyn Console,
    prompts: &mut Prompts<'_>,
    events: &mut SessionEvents,
    all_completed: &mut bool,
) -> std::io::Result<Option<String>> {
    let Some(lines) = prompts.stdin.as_mut() else {
        return Ok(prompts.listed.next());
    };
    loop {
        let wake = tokio::select! {
            biased;
            line = lines.recv() => Ok(line),
            event = events.recv_held() => Err(event.is_some()),
        };
        match wake {
            Ok(None) => return Ok(None),
            Ok(Some(Err(error))) => {
                console.message(&format!(
                    "stdin could not be read after line {} ({error}); no more prompts",
                    prompts.read
                ));
                *all_completed = false;
                return Ok(None);
            }
            Ok(Some(Ok(line))) => {
                prompts.read += 1;
                match stdin_prompt(prompts.read, &line) {
                    Ok(Some(text)) => return Ok(Some(text)),
                    Ok(None) => {}
                    Err(refused) => {
                        console.message(&refused);
                        *all_completed = false;
                    }
                }
            }
            Err(true) => {
                if let Some(event) = events.held() {
                    console.event(event).await?;
                }
                events.done();
            }
            Err(false) => return Ok(None),
        }
    }
}

/// The supervisor's configuration for `options`: the defaults, with the working
/// directory (which must be an existing directory; a relative one is taken from the
/// current directory), recovery delays, agent profile and initialize timeout asked for.
pub fn config_for(options: &Options) -> Result<SupervisorConfig, (u8, String)> {
    let mut config = SupervisorConfig::default();
    if let Some(cwd) = &options.cwd {
        // Every agent's conversations run there: a mistake is bad usage now, not a
        // failure of every turn later.
        match std::fs::metadata(cwd) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err((2, format!("--cwd: {} is not a directory", cwd.display()))),
            Err(error) => return Err((2, format!("--cwd: {}: {error}", cwd.display()))),
        }
        config.engine.cwd.clone_from(cwd);
    }
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
    // Agents' stderr lines go to the log, in their execution's span, not raw to ours.
    config.connection.stderr = StderrMode::Log;
    Ok(config)
}

/// Runs the program: starts the supervisor on `io.embedding`, sends every prompt (each
/// after the previous turn ended), prints every event, stops every agent, and returns the
/// exit code. Messages for the operator go to `io.console`.
pub async fn run(options: Options, config: SupervisorConfig, io: Io) -> u8 {
    let Io {
        embedding,
        mut console,
        mut stdin,
        stop,
    } = io;
    match supervise(options, config, embedding, &mut *console, &mut stdin, stop).await {
        Ok(true) => 0,
        Ok(false) => 1,
        Err((code, message)) => {
            console.message(&message);
            code
        }
    }
}

async fn supervise(
    options: Options,
    config: SupervisorConfig,
    embedding: Embedding,
    console: &mut dyn Console,
    stdin: &mut Option<mpsc::Receiver<StdinLine>>,
    stop: BoxFuture<'static, Option<u8>>,
) -> Result<bool, (u8, String)> {
    let mut words = options.agent.iter();
    let program = words
        .next()
        .ok_or((2, "--agent-cmd: no command".to_owned()))?;
    let agent = AgentCommand::new(program).args(words);
    let (supervisor, mut events) =
        Supervisor::start_on(embedding, config, agent).map_err(|error| match error {
            StartError::Config(_) | StartError::State(_) | StartError::Lock(_) => {
                (2, error.to_string())
            }
            StartError::Persist(_) => (1, error.to_string()),
        })?;

    // A restored core keeps the configuration it was saved with.
    let in_force = supervisor.core_config();
    if options
        .recovery_delays_ms
        .as_ref()
        .is_some_and(|asked| *asked != in_force.recovery_delays_ms)
        || options
            .profile
            .is_some_and(|asked| asked != in_force.agent_profile)
    {
        console.message(&format!(
            "the state file's configuration is in force (recovery delays {:?} ms, agent \
             profile {:?}); --recovery-delays-ms and --agent-profile apply to new state files \
             only",
            in_force.recovery_delays_ms, in_force.agent_profile
        ));
    }

    let mut listed = options.prompts.into_iter();
    let session = options.session;
    let mut all_completed = true;
    let mut stopped_by = None;
    let mut caller_gone = None;
    {
        let work = prompt_all(
            supervisor.restored_turns().to_vec(),
            &supervisor,
            &mut events,
            console,
            session,
            &mut listed,
            stdin,
            &mut all_completed,
        );
        tokio::select! {
            biased;
            signal = stop => stopped_by = signal,
            done = work => caller_gone = done.err(),
        }
    }

    if let Some(error) = &caller_gone {
        // Running turns for a caller that cannot hear of them would spend the agents'
        // work on nobody and claim success at the end: stop now, and say why.
        console.message(&format!(
            "events cannot be written to stdout ({error}): the caller is gone; stopping \
             every agent"
        ));
    }
    // Stdin EOF, the grace, SIGTERM, SIGKILL for every agent tree, then the last events.
    supervisor.shutdown().await;
    // (Nothing more is taken from a caller that is gone: what it did not get stays
    // undelivered in the state file.)
    // First the event whose write a signal abandoned midway: counting the next one done
    // in its place would drop it unwritten (found by the stack world,
    // stack-signal-restart: SIGTERM while the caller stalled on a turn's end).
    if caller_gone.is_none() {
        if let Some(event) = events.held() {
            match console.event(event).await {
                Ok(()) => events.done(),
                Err(error) => {
                    console.message(&format!(
                        "the last events cannot be written to stdout ({error}): the caller is gone"
                    ));
                    caller_gone = Some(error);
                }
            }
        }
    }
    while caller_gone.is_none() {
        let Some(event) = events.try_recv() else {
            break;
        };
        match console.event(&event).await {
            Ok(()) => events.done(),
            Err(error) => {
                console.message(&format!(
                    "the last events cannot be written to stdout ({error}): the caller is gone"
                ));
                caller_gone = Some(error);
            }
        }
    }
    // What the caller got is written down as done with (not for a caller that is gone:
    // what it did not get stays undelivered).
    if caller_gone.is_none() {
        supervisor.close().await;
    }
    if let Some(error) = supervisor.fatal_error() {
        return Err((
            1,
            format!(
                "stopped: the state file could not be written ({error}); every agent was \
                 stopped, and a new start resumes from the last state written"
            ),
        ));
    }
    if caller_gone.is_some() {
        return Err((
            1,
            "stopped: the caller stopped reading its events; every agent was stopped (with \
             --state, the next start hands out again the events it did not get)"
                .into(),
        ));
    }
    match stopped_by {
        Some(code) => Err((code, "stopped by a signal; every agent was stopped".into())),
        None => Ok(all_completed),
    }
}

/// Waits for the turns a restored state had in flight, then sends every prompt, each
/// after the previous turn ended.
#[allow(clippy::too_many_arguments)]
async fn prompt_all(
    restored: Vec<(SessionId, TurnId)>,
    supervisor: &Supervisor,
    events: &mut SessionEvents,
    console: &mut dyn Console,
    session: SessionId,
    listed: &mut std::vec::IntoIter<String>,
    stdin: &mut Option<mpsc::Receiver<StdinLine>>,
    all_completed: &mut bool,
) -> std::io::Result<()> {
    let mut prompts = Prompts {
        listed,
        stdin,
        read: 0,
    };
    // A restored turn is the caller's too: the run is not over before it ended.
    for (s, turn) in restored {
        *all_completed &=
            wait_turn(console, events, s, Some(turn)).await? == TurnOutcome::Completed;
    }
    while let Some(text) = next_prompt(console, &mut prompts, events, all_completed).await? {
        let mut resends = 0;
        loop {
            match send_prompt(supervisor, events, console, session, &text).await? {
                Some(TurnOutcome::RolledBack) if resends < ROLLED_BACK_RESENDS => {
                    // It was never written to an agent.
                    resends += 1;
                    console.message(
                        "the prompt's turn was rolled back: it never reached an agent; \
                         sending it again",
                    );
                }
                Some(outcome) => {
                    *all_completed &= outcome == TurnOutcome::Completed;
                    break;
                }
                None => {
                    *all_completed = false;
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Sends one prompt and waits for its turn; `None` if it was not claimed, `Err` if the
/// caller cannot be written to.
async fn send_prompt(
    supervisor: &Supervisor,
    events: &mut SessionEvents,
    console: &mut dyn Console,
    session: SessionId,
    text: &str,
) -> std::io::Result<Option<TurnOutcome>> {
    let mut busy = 0;
    let turn = loop {
        match supervisor.prompt(session, text).await {
            Ok(turn) => break turn,
            Err(SupervisorError::Prompt(PromptError::Rejected(RejectReason::SessionBusy)))
                if busy < BUSY_RETRIES =>
            {
                // A restored turn is still running: let it end first.
                busy += 1;
                wait_turn(console, events, session, None).await?;
            }
            Err(error) => {
                console.message(&format!("prompt not sent: {error}"));
                return Ok(None);
            }
        }
    };
    console.prompt_claimed(session, turn, text);
    wait_turn(console, events, session, Some(turn))
        .await
        .map(Some)
}

/// The real world: stdout and stderr, a stdin reader thread, SIGINT and SIGTERM.
pub mod real {
    use std::io::Write;

    use tokio::sync::mpsc;

    use super::{
        read_line_bounded, Console, Io, Options, StdinLine, MAX_PROMPT_BYTES, STDIN_PROMPTS_QUEUED,
    };
    use crate::platform::BoxFuture;
    use crate::{Embedding, SessionEvent};

    /// Events as JSON lines on stdout, messages on stderr after the program's name.
    #[derive(Debug, Default)]
    pub struct StdConsole;

    impl Console for StdConsole {
        fn event<'a>(&'a mut self, event: &'a SessionEvent) -> BoxFuture<'a, std::io::Result<()>> {
            let mut out = std::io::stdout().lock();
            let written = writeln!(out, "{}", event.to_json()).and_then(|()| out.flush());
            Box::pin(std::future::ready(written))
        }

        fn message(&mut self, text: &str) {
            eprintln!("palisade-supervise: {text}");
        }
    }

    /// Stdin's lines as bytes (the loop decides what each is), read on a thread of their
    /// own; a read error is passed on and ends the input. Of a line longer than a prompt
    /// may be, one byte more than that is kept (enough for the loop to refuse it): a line
    /// without an end takes no memory past the bound.
    #[must_use]
    pub fn stdin_prompts() -> mpsc::Receiver<StdinLine> {
        let (tx, rx) = mpsc::channel(STDIN_PROMPTS_QUEUED);
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            loop {
                let mut line = Vec::new();
                let line = match read_line_bounded(&mut stdin, &mut line, MAX_PROMPT_BYTES + 1) {
                    Ok(0) => break,
                    Ok(_) => Ok(line),
                    Err(error) => Err(error.to_string()),
                };
                let last = line.is_err();
                if tx.blocking_send(line).is_err() || last {
                    break;
                }
            }
        });
        rx
    }

    /// Resolves with the exit code (128 + signal) on the first SIGINT or SIGTERM; never if
    /// the handlers cannot be installed.
    pub async fn stop_signal() -> Option<u8> {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return std::future::pending().await;
        };
        tokio::select! {
            biased;
            _ = interrupt.recv() => Some(130),
            _ = terminate.recv() => Some(143),
        }
    }

    /// The real world for `options`; call inside a tokio runtime.
    #[must_use]
    pub fn io(options: &Options) -> Io {
        Io {
            embedding: Embedding::tokio(options.state.clone()),
            console: Box::new(StdConsole),
            stdin: options.prompts.is_empty().then(stdin_prompts),
            stop: Box::pin(stop_signal()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Result<Options, clap::Error> {
        parse_args(list.iter().copied())
    }

    #[test]
    fn a_stdin_line_is_a_prompt_nothing_or_refused() {
        assert_eq!(stdin_prompt(1, b"  fix it \r"), Ok(Some("fix it".into())));
        assert_eq!(
            stdin_prompt(2, b"\xc3\xa9t\xc3\xa9"),
            Ok(Some("été".into()))
        );
        assert_eq!(stdin_prompt(3, b" \t\r"), Ok(None));
        assert_eq!(stdin_prompt(4, "\u{a0}".as_bytes()), Ok(None));
        let refused = stdin_prompt(5, b"one \xff\xfe two").unwrap_err();
        assert!(refused.contains("stdin line 5 is not UTF-8"), "{refused}");
        let longest = "x".repeat(MAX_PROMPT_BYTES);
        assert_eq!(
            stdin_prompt(6, longest.as_bytes()),
            Ok(Some(longest.clone()))
        );
        let refused = stdin_prompt(7, format!("{longest}\r").as_bytes()).unwrap_err();
        assert!(refused.contains("stdin line 7 is longer than"), "{refused}");
    }

    /// A line past the bound is read to its end but not kept: a stdin without a newline
    /// takes no memory past the bound; the lines around it are whole.
    #[test]
    fn stdin_lines_are_read_within_a_bound() {
        let input = [&b"one\n"[..], &[b'x'; 100], b"\n\ntwo\r\nlast"].concat();
        // A reader that hands out a few bytes at a time, as a pipe does.
        let mut input = std::io::BufReader::with_capacity(7, &input[..]);
        let mut lines = Vec::new();
        loop {
            let mut line = Vec::new();
            match read_line_bounded(&mut input, &mut line, 10).unwrap() {
                0 => break,
                _ => lines.push(line),
            }
        }
        assert_eq!(
            lines,
            [
                &b"one"[..],
                &[b'x'; 10][..],
                &b""[..],
                &b"two\r"[..],
                &b"last"[..]
            ]
        );
    }

    #[test]
    fn commands_split_like_a_shell() {
        let split = |line: &str| split_command(OsStr::new(line));
        assert_eq!(
            split(r#"npx  "@scope/agent acp" --x='a b' c\ d"#).unwrap(),
            ["npx", "@scope/agent acp", "--x=a b", "c d"]
        );
        assert_eq!(split(r#"a "q\"x" ''"#).unwrap(), ["a", "q\"x", ""]);
        // As a shell: `#` starts a comment only at the start of a word.
        assert_eq!(split("a b#c # d e").unwrap(), ["a", "b#c"]);
        assert!(split("a 'b").is_err());
        assert!(split("a \"b").is_err());
        assert!(split("a\\").is_err());
        assert!(split("   ").unwrap().is_empty());
        // Words are bytes: a path need not be UTF-8.
        assert_eq!(
            split_command(OsStr::from_bytes(b"/opt/\xff/agent 'x\xfe'")).unwrap(),
            [
                OsStr::from_bytes(b"/opt/\xff/agent"),
                OsStr::from_bytes(b"x\xfe")
            ]
        );
    }

    #[test]
    fn arguments_parse_and_bad_usage_is_an_error() {
        let options = parse(&[
            "--agent-cmd",
            "agent --stdio",
            "--prompt",
            "one",
            "--prompt=two",
            "--prompt",
            "-v is broken",
            "--session",
            "7",
            "--recovery-delays-ms",
            "50, 100",
            "--agent-profile",
            "codex-acp-ts",
            "--initialize-timeout-ms",
            "500",
        ])
        .unwrap();
        assert_eq!(options.agent, ["agent", "--stdio"]);
        assert_eq!(options.prompts, ["one", "two", "-v is broken"]);
        assert_eq!(options.session.get(), 7);
        assert_eq!(options.recovery_delays_ms, Some(vec![50, 100]));
        assert_eq!(options.profile, Some(AgentProfile::CodexAcpTs));
        assert_eq!(options.initialize_timeout_ms, Some(500));
        let defaults = parse(&["--agent-cmd", "a", "--recovery-delays-ms", ""]).unwrap();
        assert_eq!(defaults.session.get(), 1);
        assert_eq!(defaults.recovery_delays_ms, Some(vec![]));
        assert_eq!(defaults.initialize_timeout_ms, None);
        assert_eq!(defaults.log_format, LogFormat::Text);
        let help = parse(&["--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        let too_long = "x".repeat(MAX_PROMPT_BYTES + 1);
        for bad in [
            &[][..],
            &["--prompt", "x"][..],
            &["--agent-cmd"][..],
            &["--agent-cmd", "  "][..],
            &["--agent-cmd", "'a"][..],
            &["--agent-cmd", "a", "--session", "0"][..],
            &["--agent-cmd", "a", "--bogus", "1"][..],
            &["--agent-cmd", "a", "stray"][..],
            &["--agent-cmd", "a", "--prompt", ""][..],
            &["--agent-cmd", "a", "--prompt=  "][..],
            &["--agent-cmd", "a", "--prompt", &too_long][..],
            &["--agent-cmd", "a", "--state", ""][..],
            &["--agent-cmd", "a", "--recovery-delays-ms", "1,x"][..],
            &[
                "--agent-cmd",
                "a",
                "--recovery-delays-ms",
                "18446744073709551615",
            ][..],
            &["--agent-cmd", "a", "--recovery-delays-ms", "86400000,1"][..],
            &["--agent-cmd", "a", "--agent-profile", "nope"][..],
            &["--agent-cmd", "a", "--log-format", "xml"][..],
            &["--agent-cmd", "a", "--initialize-timeout-ms", "0"][..],
            &["--agent-cmd", "a", "--initialize-timeout-ms", "60001"][..],
            &[
                "--agent-cmd",
                "a",
                "--recovery-delays-ms",
                "1,1,1,1,1,1,1,1,1",
            ][..],
        ] {
            let error = parse(bad).expect_err(&format!("{bad:?}"));
            assert_eq!(error.exit_code(), 2, "{bad:?}");
        }
        // Not UTF-8: refused by name, not a panic.
        let error = parse_args([
            OsStr::new("--agent-cmd"),
            OsStr::new("a"),
            OsStr::new("--prompt"),
            OsStr::from_bytes(b"\xff"),
        ])
        .unwrap_err();
        assert!(error.to_string().contains("--prompt"), "{error}");
        assert!(error.to_string().contains("UTF-8"), "{error}");
    }

    /// The help text's numbers are the constants'.
    #[test]
    fn the_help_states_the_bounds_in_force() {
        let defaults = crate::SupervisorConfig::default();
        assert_eq!(defaults.engine.initialize_timeout_ms, 30_000);
        assert_eq!(
            defaults.engine.core.start_deadline_ms,
            MAX_INITIALIZE_TIMEOUT_MS
        );
        assert_eq!(defaults.engine.core.recovery_delays_ms, [1000, 2000, 4000]);
        assert_eq!(MAX_PROMPT_BYTES, 1 << 20);
        assert_eq!(MAX_RECOVERY_STEPS, 8);
        assert_eq!(MAX_RECOVERY_DELAY_MS, 86_400_000);
        assert_eq!(MAX_RECOVERY_SCHEDULE_MS, 86_400_000);
        assert_eq!(ROLLED_BACK_RESENDS, 2);
        assert_eq!(crate::state_file::MAX_STATE_FILE_BYTES, 256 << 20);
        let help = parse(&["--help"]).unwrap_err().render().to_string();
        for wanted in [
            "1 MiB",
            "8 delays",
            "86400000",
            "1 to 60000",
            "30000",
            "3 initialize",
        ] {
            assert!(help.contains(wanted), "{wanted:?} missing:\n{help}");
        }
    }
}
