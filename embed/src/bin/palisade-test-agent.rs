//! `palisade-test-agent`: a real ACP v1 agent over stdio, scripted by arguments.
//!
//! It speaks newline-delimited JSON-RPC 2.0 on stdin/stdout and answers `initialize`,
//! `session/new`, `session/load`, `session/prompt` and the `session/cancel` notification
//! the way real agents do, and it misbehaves on demand. Its replies are built with the
//! official schema crate's envelopes (`JsonRpcMessage`, `Response`, `Notification`), not
//! with palisade-embed's framing, so the client's framing is tested against an
//! independent encoder.
//!
//! Every option is `--name value` (or `--name=value`), or the environment variable
//! `PALISADE_TEST_AGENT_<NAME>` (upper case, `-` as `_`); the argument wins.
//!
//! | option | values (default) | effect |
//! |---|---|---|
//! | `load-session` | `true` `false` `absent` `malformed` (`true`) | `agentCapabilities.loadSession` in the `initialize` answer |
//! | `session-id` | text (`test-session-<n>`) | the id `session/new` returns |
//! | `load-delay-ms` | ms (0) | delay before answering `session/load` |
//! | `load-error` | see below (none) | answer every `session/load` with a real agent's error |
//! | `load-replay` | count (0) | history notifications streamed before a successful load answer |
//! | `chunks` | count (3) | `agent_message_chunk` notifications per prompt, text `chunk <i>` |
//! | `chunk-bytes` | bytes (0) | pad each chunk's text with `.` to at least this length |
//! | `chunk-delay-ms` | ms (0) | pause before each chunk |
//! | `exit-after-chunks` | count (never) | exit mid-prompt after this many chunks |
//! | `exit-code` | code (3) | exit code for `exit-after-chunks` and `misbehave exit` |
//! | `exit-after-prompts` | count (never) | exit with code 0 right after answering this many prompts (an agent that goes away between turns) |
//! | `prompt-error` | `none` `auth-required` `internal` (`none`) | answer every `session/prompt` with a real agent's error, from the behaviour table the simulator's agents share (`palisade_embed::agent_model::RequestFailure`): −32000 `Authentication required` (claude-agent-acp without credentials), −32603 `Internal error` with `data.details` (codex-acp) |
//! | `prompt-mode` | `answer` `hang` `hold` (`answer`) | after the chunks: answer `end_turn`; never answer (cancel ignored); or wait for `session/cancel` |
//! | `misbehave` | `none` `garbage` `close-stdout` `unknown-ids` `never-answer` `exit` (`none`) | instead of answering a request: write a garbage line; close stdout and stay alive; answer with an id we never got; stay silent; exit |
//! | `misbehave-on` | method or `*` (`*`) | which requests `misbehave` applies to |
//! | `log` | path (none) | append one JSON line per received message and per exit, for ground truth |
//! | `launcher` | `none` `spawn` `double-fork` `setsid` (`none`) | run as a launcher that starts the real agent (itself, with the same options) and passes its stdio on: as its child, waiting for it (like codex-acp's npm launcher); or through an intermediate that exits at once, so the agent is reparented (`double-fork`), and also calls `setsid` (`setsid`), while the launcher stays alive |
//! | `on-eof` | `exit` `stay` (`exit`) | at stdin EOF: exit 0, or keep running (as every real agent measured does) |
//! | `ignore-sigterm` | `false` `true` (`false`) | catch SIGTERM and keep running (only SIGKILL ends it) |
//!
//! `load-error` values and the answer each real agent gives for an unknown session:
//!
//! | value | code | message / data |
//! |---|---|---|
//! | `claude-agent-acp` | −32002 | `Resource not found: <id>` |
//! | `claude-code-acp` | −32603 | `Internal error`, data `{"details":"Session not found"}` |
//! | `codex-acp` | −32002 | `Resource not found`, no data |
//! | `codex-ts` | −32603 | `no rollout found for thread id <id>` |
//! | `gemini` | −32603 | `Invalid session identifier <id>` |
//! | `goose` | −32602 | `Session not found: <id>` (representative message) |
//! | `opencode` | −32603 | `Internal error`, data `{"details":"session <id> not found"}` (representative) |
//! | `method-not-found` | −32601 | `Method not found` (an agent without `session/load`) |
//!
//! A `session/cancel` ends the in-flight prompt of that session with `stopReason:
//! "cancelled"` (in `answer` mode between chunks, in `hold` mode at once). Stdin EOF
//! ends the agent with exit code 0 unless `on-eof stay`.
//!
//! Every process (launcher, intermediate, agent) logs a `start` line with its pid and
//! role, so a test knows every process of the tree.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use agent_client_protocol_schema::v1::{
    AgentCapabilities, ContentChunk, Error as AcpError, InitializeResponse, JsonRpcMessage,
    LoadSessionResponse, NewSessionResponse, Notification, PromptResponse, RequestId, Response,
    SessionNotification, SessionUpdate, StopReason,
};
use agent_client_protocol_schema::ProtocolVersion;
use serde_json::{json, Value};

/// Every option the agent knows, as written on the command line.
const OPTIONS: &[&str] = &[
    "load-session",
    "session-id",
    "load-delay-ms",
    "load-error",
    "load-replay",
    "chunks",
    "chunk-bytes",
    "chunk-delay-ms",
    "exit-after-chunks",
    "exit-code",
    "exit-after-prompts",
    "prompt-error",
    "prompt-mode",
    "misbehave",
    "misbehave-on",
    "log",
    "launcher",
    "on-eof",
    "ignore-sigterm",
    "setsid",
];

/// Internal: the intermediate of a double-forking launcher; starts the agent, exits.
const FORK_MODE: &str = "--internal-fork";

/// Internal: the image `close-stdout` execs into, with stdout on /dev/null.
const SLEEP_MODE: &str = "--internal-stdout-closed";

/// Offset added to a request id by `misbehave unknown-ids`.
const UNKNOWN_ID_OFFSET: i64 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoadSessionCapability {
    True,
    False,
    Absent,
    Malformed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PromptMode {
    Answer,
    Hang,
    Hold,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Misbehave {
    None,
    Garbage,
    CloseStdout,
    UnknownIds,
    NeverAnswer,
    Exit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Launcher {
    None,
    Spawn,
    DoubleFork,
    Setsid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoadError {
    ClaudeAgentAcp,
    ClaudeCodeAcp,
    CodexAcp,
    CodexTs,
    Gemini,
    Goose,
    Opencode,
    MethodNotFound,
}

impl LoadError {
    fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "claude-agent-acp" => LoadError::ClaudeAgentAcp,
            "claude-code-acp" => LoadError::ClaudeCodeAcp,
            "codex-acp" => LoadError::CodexAcp,
            "codex-ts" => LoadError::CodexTs,
            "gemini" => LoadError::Gemini,
            "goose" => LoadError::Goose,
            "opencode" => LoadError::Opencode,
            "method-not-found" => LoadError::MethodNotFound,
            _ => return None,
        })
    }

    /// The error this agent answers an unknown session with.
    fn error(self, session_id: &str) -> AcpError {
        match self {
            LoadError::ClaudeAgentAcp => {
                AcpError::new(-32002, format!("Resource not found: {session_id}"))
            }
            LoadError::ClaudeCodeAcp => AcpError::new(-32603, "Internal error")
                .data(json!({"details": "Session not found"})),
            LoadError::CodexAcp => AcpError::new(-32002, "Resource not found"),
            LoadError::CodexTs => AcpError::new(
                -32603,
                format!("no rollout found for thread id {session_id}"),
            ),
            LoadError::Gemini => {
                AcpError::new(-32603, format!("Invalid session identifier {session_id}"))
            }
            LoadError::Goose => AcpError::new(-32602, format!("Session not found: {session_id}")),
            LoadError::Opencode => AcpError::new(-32603, "Internal error")
                .data(json!({"details": format!("session {session_id} not found")})),
            LoadError::MethodNotFound => AcpError::new(-32601, "Method not found"),
        }
    }
}

#[derive(Debug, Clone)]
struct Script {
    load_session: LoadSessionCapability,
    session_id: Option<String>,
    load_delay: Duration,
    load_error: Option<LoadError>,
    load_replay: u64,
    chunks: u64,
    chunk_bytes: usize,
    chunk_delay: Duration,
    exit_after_chunks: Option<u64>,
    exit_code: u8,
    exit_after_prompts: Option<u64>,
    prompt_error: Option<palisade_embed::agent_model::RequestFailure>,
    prompt_mode: PromptMode,
    misbehave: Misbehave,
    misbehave_on: String,
    log: Option<String>,
    launcher: Launcher,
    stay_after_eof: bool,
    ignore_sigterm: bool,
    /// Internal (set by a `setsid` launcher): call `setsid` first.
    setsid: bool,
}

fn parse_script(args: &[String]) -> Result<Script, String> {
    let mut values: HashMap<&str, String> = HashMap::new();
    for name in OPTIONS {
        let key = format!(
            "PALISADE_TEST_AGENT_{}",
            name.to_uppercase().replace('-', "_")
        );
        if let Ok(value) = std::env::var(&key) {
            values.insert(name, value);
        }
    }
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        let (name, inline_value) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (flag, None),
        };
        let name = OPTIONS
            .iter()
            .find(|known| **known == name)
            .ok_or_else(|| format!("unknown option --{name}"))?;
        let value = match inline_value {
            Some(value) => value,
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| format!("--{name} needs a value"))?,
        };
        values.insert(name, value);
    }

    let number = |name: &str, default: u64| -> Result<u64, String> {
        values.get(name).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("--{name}: not a number: {v:?}"))
        })
    };
    let text = |name: &str| values.get(name).cloned();
    Ok(Script {
        load_session: match text("load-session").as_deref() {
            None | Some("true") => LoadSessionCapability::True,
            Some("false") => LoadSessionCapability::False,
            Some("absent") => LoadSessionCapability::Absent,
            Some("malformed") => LoadSessionCapability::Malformed,
            Some(other) => return Err(format!("--load-session: unknown value {other:?}")),
        },
        session_id: text("session-id"),
        load_delay: Duration::from_millis(number("load-delay-ms", 0)?),
        load_error: match text("load-error").as_deref() {
            None | Some("none") => None,
            Some(other) => Some(
                LoadError::parse(other)
                    .ok_or_else(|| format!("--load-error: unknown agent {other:?}"))?,
            ),
        },
        load_replay: number("load-replay", 0)?,
        chunks: number("chunks", 3)?,
        chunk_bytes: usize::try_from(number("chunk-bytes", 0)?)
            .map_err(|_| "--chunk-bytes: too large".to_owned())?,
        chunk_delay: Duration::from_millis(number("chunk-delay-ms", 0)?),
        exit_after_chunks: match text("exit-after-chunks") {
            None => None,
            Some(_) => Some(number("exit-after-chunks", 0)?),
        },
        exit_code: u8::try_from(number("exit-code", 3)?)
            .map_err(|_| "--exit-code: must be 0..=255".to_owned())?,
        prompt_error: match text("prompt-error").as_deref() {
            None | Some("none") => None,
            Some("auth-required") => {
                Some(palisade_embed::agent_model::RequestFailure::AuthRequired)
            }
            Some("internal") => Some(palisade_embed::agent_model::RequestFailure::Internal),
            Some(other) => return Err(format!("--prompt-error: unknown value {other:?}")),
        },
        exit_after_prompts: match text("exit-after-prompts") {
            None => None,
            Some(_) => Some(number("exit-after-prompts", 0)?),
        },
        prompt_mode: match text("prompt-mode").as_deref() {
            None | Some("answer") => PromptMode::Answer,
            Some("hang") => PromptMode::Hang,
            Some("hold") => PromptMode::Hold,
            Some(other) => return Err(format!("--prompt-mode: unknown value {other:?}")),
        },
        misbehave: match text("misbehave").as_deref() {
            None | Some("none") => Misbehave::None,
            Some("garbage") => Misbehave::Garbage,
            Some("close-stdout") => Misbehave::CloseStdout,
            Some("unknown-ids") => Misbehave::UnknownIds,
            Some("never-answer") => Misbehave::NeverAnswer,
            Some("exit") => Misbehave::Exit,
            Some(other) => return Err(format!("--misbehave: unknown value {other:?}")),
        },
        misbehave_on: text("misbehave-on").unwrap_or_else(|| "*".to_owned()),
        log: text("log"),
        launcher: match text("launcher").as_deref() {
            None | Some("none") => Launcher::None,
            Some("spawn") => Launcher::Spawn,
            Some("double-fork") => Launcher::DoubleFork,
            Some("setsid") => Launcher::Setsid,
            Some(other) => return Err(format!("--launcher: unknown value {other:?}")),
        },
        stay_after_eof: match text("on-eof").as_deref() {
            None | Some("exit") => false,
            Some("stay") => true,
            Some(other) => return Err(format!("--on-eof: unknown value {other:?}")),
        },
        ignore_sigterm: flag(text("ignore-sigterm"), "ignore-sigterm")?,
        setsid: flag(text("setsid"), "setsid")?,
    })
}

fn flag(value: Option<String>, name: &str) -> Result<bool, String> {
    match value.as_deref() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(format!("--{name}: not true or false: {other:?}")),
    }
}

/// Appends one line to the log, if there is one (best effort: a test fails on what is
/// missing).
fn log_line(path: Option<&str>, entry: &Value) {
    if let Some(path) = path {
        if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(path) {
            let _ = file.write_all(format!("{entry}\n").as_bytes());
        }
    }
}

/// Runs as a launcher: starts the agent (this program, `--launcher none`) with this
/// process's stdio, as a child it waits for, or through an intermediate that exits at once.
fn launch(script: &Script, args: &[String]) -> ExitCode {
    log_line(
        script.log.as_deref(),
        &json!({"event": "start", "role": "launcher", "pid": std::process::id()}),
    );
    let Ok(exe) = std::env::current_exe() else {
        return ExitCode::from(4);
    };
    let mut agent_args: Vec<String> = args.to_vec();
    agent_args.extend(["--launcher".into(), "none".into()]);
    if script.launcher == Launcher::Setsid {
        agent_args.extend(["--setsid".into(), "true".into()]);
    }
    if script.launcher == Launcher::Spawn {
        // Like codex-acp's npm launcher (spawnSync with stdio inherited).
        return match std::process::Command::new(exe).args(&agent_args).status() {
            Ok(status) => ExitCode::from(
                status
                    .code()
                    .and_then(|c| u8::try_from(c).ok())
                    .unwrap_or(1),
            ),
            Err(_) => ExitCode::from(4),
        };
    }
    let started = std::process::Command::new(exe)
        .arg(FORK_MODE)
        .args(&agent_args)
        .status();
    if !started.is_ok_and(|status| status.success()) {
        return ExitCode::from(4);
    }
    // The agent is a grandchild now, reparented; the launcher stays, reading nothing.
    loop {
        thread::park();
    }
}

/// The intermediate of a double fork: starts the agent and exits at once.
fn fork_mode(args: &[String]) -> ExitCode {
    let log = parse_script(args).ok().and_then(|script| script.log);
    log_line(
        log.as_deref(),
        &json!({"event": "start", "role": "intermediate", "pid": std::process::id()}),
    );
    let Ok(exe) = std::env::current_exe() else {
        return ExitCode::from(4);
    };
    match std::process::Command::new(exe).args(args).spawn() {
        Ok(_) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(4),
    }
}

/// Catches SIGTERM for the rest of the process's life: only SIGKILL ends it.
fn ignore_sigterm(log: Option<String>) {
    let (ready_tx, ready) = mpsc::channel();
    thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut terms) = signal(SignalKind::terminate()) else {
                return;
            };
            let _ = ready_tx.send(());
            while terms.recv().await.is_some() {
                log_line(log.as_deref(), &json!({"event": "sigterm_ignored"}));
            }
        });
    });
    // The handler is installed before the agent says anything.
    let _ = ready.recv();
}

/// The agent's shared state: output, ground-truth log, in-flight prompts.
struct Agent {
    script: Script,
    log: Option<Mutex<File>>,
    /// Per session, the channel that cancels its in-flight prompt.
    in_flight: Mutex<HashMap<String, mpsc::Sender<()>>>,
    sessions_created: AtomicU64,
    prompts_answered: AtomicU64,
}

impl Agent {
    /// Writes one message as one line. A closed stdout means the client is gone: exit.
    fn send(&self, message: &impl serde::Serialize) {
        let mut line = serde_json::to_string(message)
            .expect("envelopes of Values and schema structs always serialize");
        line.push('\n');
        self.write_raw(&line);
    }

    fn write_raw(&self, line: &str) {
        let mut out = std::io::stdout().lock();
        if out
            .write_all(line.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            self.record(json!({"event": "stdout_broken"}));
            std::process::exit(0);
        }
    }

    fn respond(&self, id: RequestId, outcome: Result<Value, AcpError>) {
        self.send(&JsonRpcMessage::wrap(Response::new(id, outcome)));
    }

    fn notify(&self, method: &str, params: Value) {
        self.send(&JsonRpcMessage::wrap(Notification {
            method: method.into(),
            params: Some(params),
        }));
    }

    fn record(&self, entry: Value) {
        if let Some(log) = &self.log {
            let mut file = log.lock().unwrap_or_else(PoisonError::into_inner);
            // One write per line: several agents (a stopping one and its replacement) may
            // append to the same log, and O_APPEND keeps a single write whole, where
            // `writeln!` may split a line into several writes that interleave.
            let line = format!("{entry}\n");
            // The log is best effort; a test that needs it fails on what is missing.
            let _ = file.write_all(line.as_bytes()).and_then(|()| file.flush());
        }
    }

    fn exit(&self, code: u8, why: &str) -> ! {
        self.record(json!({"event": "exit", "code": code, "why": why}));
        std::process::exit(i32::from(code));
    }

    fn chunk(&self, session_id: &str, update: fn(ContentChunk) -> SessionUpdate, text: String) {
        let notification = SessionNotification::new(
            session_id.to_owned(),
            update(ContentChunk::new(text.into())),
        );
        self.notify(
            "session/update",
            serde_json::to_value(notification).expect("schema structs always serialize"),
        );
    }

    fn chunk_text(&self, index: u64) -> String {
        let mut text = format!("chunk {index}");
        while text.len() < self.script.chunk_bytes {
            text.push('.');
        }
        text
    }
}

fn to_value(payload: impl serde::Serialize) -> Value {
    serde_json::to_value(payload).expect("schema structs always serialize")
}

fn parse_id(id: &Value) -> Option<RequestId> {
    serde_json::from_value(id.clone()).ok()
}

fn handle_line(agent: &Arc<Agent>, line: &str) {
    let Ok(message) = serde_json::from_str::<Value>(line) else {
        agent.record(json!({"garbage": line}));
        agent.respond(RequestId::Null, Err(AcpError::parse_error()));
        return;
    };
    let method = message.get("method").and_then(Value::as_str);
    let id = message.get("id").and_then(parse_id);
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    agent.record(json!({"method": method, "id": message.get("id"), "params": params}));
    let Some(method) = method else {
        // A response to a request of ours; we send none, so there is nothing to do.
        return;
    };
    let Some(id) = id else {
        if method == "session/cancel" {
            cancel(agent, &params);
        }
        return;
    };

    let script = &agent.script;
    if script.misbehave != Misbehave::None
        && (script.misbehave_on == "*" || script.misbehave_on == method)
    {
        misbehave(agent, id, method);
        return;
    }
    match method {
        "initialize" => agent.respond(id, Ok(initialize_result(script.load_session))),
        "session/new" => {
            let n = agent.sessions_created.fetch_add(1, Ordering::Relaxed) + 1;
            let session_id = script
                .session_id
                .clone()
                .unwrap_or_else(|| format!("test-session-{n}"));
            agent.respond(id, Ok(to_value(NewSessionResponse::new(session_id))));
        }
        "session/load" => {
            let agent = Arc::clone(agent);
            thread::spawn(move || load(&agent, id, &params));
        }
        "session/prompt" => {
            if let Some(failure) = agent.script.prompt_error {
                let error = failure.error();
                let mut answer =
                    AcpError::new(i32::try_from(error.code).unwrap_or(-32603), error.message);
                if let Some(data) = error.data {
                    answer = answer.data(data);
                }
                agent.respond(id, Err(answer));
                return;
            }
            let session_id = params["sessionId"].as_str().unwrap_or_default().to_owned();
            let (cancel_tx, cancel_rx) = mpsc::channel();
            agent
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(session_id.clone(), cancel_tx);
            let agent = Arc::clone(agent);
            thread::spawn(move || prompt(&agent, id, &session_id, &cancel_rx));
        }
        _ => agent.respond(id, Err(AcpError::method_not_found())),
    }
}

fn initialize_result(load_session: LoadSessionCapability) -> Value {
    let capabilities =
        AgentCapabilities::new().load_session(load_session == LoadSessionCapability::True);
    let mut result =
        to_value(InitializeResponse::new(ProtocolVersion::V1).agent_capabilities(capabilities));
    match load_session {
        LoadSessionCapability::True | LoadSessionCapability::False => {}
        LoadSessionCapability::Absent => {
            if let Some(capabilities) = result["agentCapabilities"].as_object_mut() {
                capabilities.remove("loadSession");
            }
        }
        LoadSessionCapability::Malformed => {
            result["agentCapabilities"]["loadSession"] = json!("yes");
        }
    }
    result
}

fn misbehave(agent: &Agent, id: RequestId, method: &str) {
    agent.record(json!({"event": "misbehave", "method": method}));
    match agent.script.misbehave {
        Misbehave::None => {}
        Misbehave::Garbage => agent.write_raw("this is not json-rpc {\n"),
        Misbehave::UnknownIds => {
            let bogus = match id {
                RequestId::Number(n) => RequestId::Number(n.saturating_add(UNKNOWN_ID_OFFSET)),
                RequestId::Str(s) => RequestId::Str(format!("{s}-bogus")),
                RequestId::Null => RequestId::Str("bogus".into()),
            };
            agent.respond(bogus, Ok(json!({})));
        }
        Misbehave::NeverAnswer => {}
        Misbehave::Exit => agent.exit(agent.script.exit_code, "misbehave exit"),
        Misbehave::CloseStdout => close_stdout(agent),
    }
}

/// Replaces this process image with one whose stdout is /dev/null: the pid stays, the
/// process stays alive reading stdin, and the client sees its stdout end. (std offers no
/// safe way to close fd 1 in place; exec does it without `unsafe`.)
fn close_stdout(agent: &Agent) {
    agent.record(json!({"event": "close_stdout"}));
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let Ok(exe) = std::env::current_exe() else {
            agent.exit(4, "no current_exe for close-stdout");
        };
        let error = std::process::Command::new(exe)
            .arg(SLEEP_MODE)
            .stdin(std::process::Stdio::inherit())
            .stdout(std::process::Stdio::null())
            .exec();
        agent.record(json!({"event": "exec_failed", "error": error.to_string()}));
        agent.exit(4, "exec failed");
    }
    #[cfg(not(unix))]
    agent.exit(4, "close-stdout needs unix");
}

fn cancel(agent: &Agent, params: &Value) {
    let session_id = params["sessionId"].as_str().unwrap_or_default();
    let sender = agent
        .in_flight
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(session_id)
        .cloned();
    if let Some(sender) = sender {
        // The prompt may have just finished; then there is nothing to cancel.
        let _ = sender.send(());
    }
}

fn load(agent: &Agent, id: RequestId, params: &Value) {
    let session_id = params["sessionId"].as_str().unwrap_or_default().to_owned();
    thread::sleep(agent.script.load_delay);
    if let Some(error) = agent.script.load_error {
        agent.respond(id, Err(error.error(&session_id)));
        return;
    }
    for i in 0..agent.script.load_replay {
        let update = if i % 2 == 0 {
            SessionUpdate::UserMessageChunk
        } else {
            SessionUpdate::AgentMessageChunk
        };
        agent.chunk(&session_id, update, format!("history {i}"));
    }
    agent.respond(id, Ok(to_value(LoadSessionResponse::new())));
}

fn prompt(agent: &Agent, id: RequestId, session_id: &str, cancel: &mpsc::Receiver<()>) {
    let script = &agent.script;
    let mut stop = StopReason::EndTurn;
    for i in 0..script.chunks {
        if script.exit_after_chunks == Some(i) {
            agent.exit(script.exit_code, "exit-after-chunks");
        }
        if !script.chunk_delay.is_zero() {
            thread::sleep(script.chunk_delay);
        }
        if script.prompt_mode != PromptMode::Hang && cancelled(cancel) {
            stop = StopReason::Cancelled;
            break;
        }
        agent.chunk(
            session_id,
            SessionUpdate::AgentMessageChunk,
            agent.chunk_text(i),
        );
    }
    if stop == StopReason::EndTurn && script.exit_after_chunks == Some(script.chunks) {
        agent.exit(script.exit_code, "exit-after-chunks");
    }
    match script.prompt_mode {
        PromptMode::Answer => {}
        PromptMode::Hang => loop {
            agent.record(json!({"event": "prompt_hangs"}));
            thread::park();
        },
        PromptMode::Hold if stop == StopReason::Cancelled => {}
        PromptMode::Hold => {
            // Only a cancel (or the channel closing, which never happens while the agent
            // runs) ends the hold.
            let _ = cancel.recv();
            stop = StopReason::Cancelled;
        }
    }
    agent
        .in_flight
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(session_id);
    agent.record(json!({"event": "prompt_done", "stopReason": to_value(stop)}));
    agent.respond(id, Ok(to_value(PromptResponse::new(stop))));
    let answered = agent.prompts_answered.fetch_add(1, Ordering::SeqCst) + 1;
    if script.exit_after_prompts == Some(answered) {
        agent.exit(0, "exit-after-prompts");
    }
}

fn cancelled(cancel: &mpsc::Receiver<()>) -> bool {
    match cancel.try_recv() {
        Ok(()) => true,
        Err(TryRecvError::Empty | TryRecvError::Disconnected) => false,
    }
}

/// The image after `close-stdout`: keep reading stdin until EOF, write nothing.
fn stdout_closed_mode() -> ExitCode {
    let mut sink = Vec::new();
    loop {
        sink.clear();
        match std::io::stdin().lock().read_until(b'\n', &mut sink) {
            Ok(0) | Err(_) => return ExitCode::SUCCESS,
            Ok(_) => {}
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(SLEEP_MODE) {
        return stdout_closed_mode();
    }
    if args.first().map(String::as_str) == Some(FORK_MODE) {
        return fork_mode(&args[1..]);
    }
    let script = match parse_script(&args) {
        Ok(script) => script,
        Err(message) => {
            eprintln!("palisade-test-agent: {message}");
            return ExitCode::from(2);
        }
    };
    if script.setsid {
        // Leaves the launcher's process group and session, as a daemon does.
        let _ = rustix::process::setsid();
    }
    if script.ignore_sigterm {
        ignore_sigterm(script.log.clone());
    }
    if script.launcher != Launcher::None {
        return launch(&script, &args);
    }
    let log = match &script.log {
        None => None,
        Some(path) => match OpenOptions::new().create(true).append(true).open(path) {
            Ok(file) => Some(Mutex::new(file)),
            Err(error) => {
                eprintln!("palisade-test-agent: cannot open log {path}: {error}");
                return ExitCode::from(2);
            }
        },
    };
    let agent = Arc::new(Agent {
        script,
        log,
        in_flight: Mutex::new(HashMap::new()),
        sessions_created: AtomicU64::new(0),
        prompts_answered: AtomicU64::new(0),
    });
    agent.record(json!({"event": "start", "role": "agent", "pid": std::process::id()}));

    let stdin = std::io::stdin();
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        match stdin.lock().read_until(b'\n', &mut bytes) {
            Ok(0) => break,
            Ok(_) => {
                let line = String::from_utf8_lossy(&bytes);
                let trimmed = line.trim_end_matches(['\n', '\r']);
                if !trimmed.trim().is_empty() {
                    handle_line(&agent, trimmed);
                }
            }
            Err(error) => {
                agent.record(json!({"event": "stdin_error", "error": error.to_string()}));
                break;
            }
        }
    }
    if agent.script.stay_after_eof {
        agent.record(json!({"event": "stdin_closed_staying"}));
        loop {
            thread::park();
        }
    }
    agent.exit(0, "stdin closed");
}
