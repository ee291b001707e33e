//! `palisade-test-agent`: a real ACP v1 agent over stdio, scripted by arguments.
//!
//! Everything ACP it does is the simulator's agent: it runs
//! [`palisade_testkit::agent_model::AgentModel`] — the behaviour table of real agents the
//! sweep's simulated agents run — in a thin real-time, real-stdio shell. Each stdin line
//! goes to [`AgentModel::on_line`], each line the model writes goes to stdout at its due
//! time on the real clock (milliseconds since start), a timer calls
//! [`AgentModel::on_wake`] at [`AgentModel::next_wake`], stdin EOF calls
//! [`AgentModel::on_stdin_closed`], and the model's exit is the process's exit code. So the
//! binary cannot answer anything the model would not: `tests/test_agent_model.rs` feeds
//! the same lines to both and compares what they write, and parses every line the binary
//! writes with the official schema crate's types (an encoder independent of ours).
//!
//! What the shell adds is only process-level: launcher trees (`launcher`), `setsid`,
//! `ignore-sigterm`, the `log` of what it received and how it exited, and the `misbehave`
//! modes (a broken process, not an agent's answer: garbage, a closed stdout, unknown ids,
//! silence, an exit instead of an answer).
//!
//! Every option is `--name value` (or `--name=value`), or the environment variable
//! `PALISADE_TEST_AGENT_<NAME>` (upper case, `-` as `_`); the argument wins. The column
//! "model" names the [`Behaviour`] field or the [`Script`] knob it sets; "shell" marks
//! process-level behaviour.
//!
//! | option | values (default) | model | effect |
//! |---|---|---|---|
//! | `load-session` | `true` `false` `absent` `malformed` (`true`) | `Behaviour::load_capability`; `Script::malformed_load_capability` | `agentCapabilities.loadSession` in the `initialize` answer (`malformed`: the string `"yes"`) |
//! | `load-error` | an [`UnknownSession`] name (none) | `Behaviour::unknown_session` | the agent holds no conversation but the ones it created, and answers `session/load` of any other id as that real agent does (table below) |
//! | `resume-flake-per-mille` | 0..=1000 (0) | `Behaviour::resume_flake_per_mille` | loads of a session it has answered as claude-agent-acp 0.23 does when its subprocess closed early |
//! | `session-id` | text (`test-session-<n>`) | the store | the id `session/new` returns |
//! | `new-error` | `none` `auth-required` `internal` (`none`) | `Behaviour::new_fails` | answer every `session/new` with a real agent's error |
//! | `prompt-error` | `none` `auth-required` `internal` (`none`) | `Behaviour::prompt_failure`, `prompt_fail_per_mille` = 1000 | answer every `session/prompt` with a real agent's error: −32000 `Authentication required` (claude-agent-acp without credentials), −32603 `Internal error` with `data.details` (codex-acp) |
//! | `list-sessions` | `false` `true` (`false`) | `Behaviour::lists_sessions` | advertise and answer `session/list` |
//! | `unprompted-updates` | `false` `true` (`false`) | `Behaviour::unprompted_updates` | an `available_commands_update` right after `session/new` |
//! | `ask-permission` | `false` `true` (`false`) | `Behaviour::asks_permission` | a `session/request_permission` in the middle of each prompt |
//! | `auth-required` | `false` `true` (`false`) | `Behaviour::auth_required` | offer one auth method (`agent-token`) and refuse every session request with −32000 `Authentication required` until this process got `authenticate` of it (per process, as gemini-cli) |
//! | `stderr-noise` | `false` `true` (`false`) | `Behaviour::stderr_noise` | two lines of noise on stderr at start |
//! | `on-eof` | `exit` `stay` (`exit`) | `Behaviour::exits_on_eof` | at stdin EOF: exit 0, or keep running (as every real agent measured does) |
//! | `seed` | number (0) | `AgentModel::new` | the model's own choices (only `resume-flake-per-mille` draws) |
//! | `load-delay-ms` | ms (0) | `Script::load_delay_ms` | delay before answering `session/load` (other answers are immediate) |
//! | `load-replay` | count (0) | `Script::load_replay` | history notifications (`history <i>`) streamed before a successful load answer |
//! | `chunks` | count (3) | `Script::chunks` | `agent_message_chunk` notifications per prompt, text `chunk <i>` |
//! | `chunk-bytes` | bytes (0) | `Script::chunks` | pad each chunk's text with `.` to at least this length |
//! | `chunk-delay-ms` | ms (0) | `Script::chunks` | pause before each chunk |
//! | `exit-after-chunks` | count (never) | `Script::exit_after_chunks` | exit mid-prompt after this many chunks |
//! | `exit-code` | code (3) | `Script::exit_code`; shell | exit code for `exit-after-chunks` and `misbehave exit` |
//! | `exit-after-prompts` | count (never) | `Script::exit_after_prompts` | exit with code 0 right after answering this many prompts (an agent that goes away between turns) |
//! | `prompt-mode` | `answer` `hang` `hold` (`answer`) | `Script::prompt_end` | after the chunks: answer `end_turn`; never answer (cancel ignored); or wait for `session/cancel` |
//! | `mute-from-prompt` | number (never) | `Script::mute_from_prompt` | from this prompt of the process on (1-based), write nothing for a prompt until `session/cancel`, then answer `cancelled` (a model with no token yet) |
//! | `silent` | `none` `on-new` `always` (`none`) | `Script::silent_on_new`; `Behaviour::silent_per_mille` = 1000 | a prompt goes silent after its first chunk: nothing more, no answer, `session/cancel` ignored (a wedged agent); `on-new`: only on a conversation this process created with `session/new` (a process that loads it, as a recovery does, answers) |
//! | `protocol-version` | 0..=65535 (1) | `Script::protocol_version` | the `protocolVersion` of the `initialize` answer (an agent that speaks another ACP version) |
//! | `misbehave` | `none` `garbage` `close-stdout` `unknown-ids` `never-answer` `exit` (`none`) | shell | instead of answering a request: write a garbage line; close stdout and stay alive; answer with an id we never got; stay silent; exit (the model never sees the request) |
//! | `misbehave-on` | method or `*` (`*`) | shell | which requests `misbehave` applies to |
//! | `log` | path (none) | shell | append one JSON line per received message (with the receiving process's `pid`), per answered prompt and per exit, for ground truth |
//! | `launcher` | `none` `spawn` `double-fork` `setsid` (`none`) | shell (the simulator's `Behaviour::launcher` is `spawn`) | run as a launcher that starts the real agent (itself, with the same options) and passes its stdio on: as its child, waiting for it (like codex-acp's npm launcher); or through an intermediate that exits at once, so the agent is reparented (`double-fork`), and also calls `setsid` (`setsid`), while the launcher stays alive |
//! | `ignore-sigterm` | `false` `true` (`false`) | shell | catch SIGTERM and keep running (only SIGKILL ends it) |
//! | `stamp-chunks` | `false` `true` (`false`) | shell | begin each chunk's text with `@<µs> `, the wall clock (Unix microseconds) when the line is written, for latency measurements (`embed/benches/proxy.rs`) |
//!
//! `load-error` values are [`UnknownSession`]'s names, and the answer is
//! [`UnknownSession::error`] for the requested id (`docs/real-agents.md`, "Real agents'
//! answers to an unknown session"): `claude-agent-acp` (−32002 `Resource not found: <id>`, `data.uri`),
//! `claude-code-acp`, `claude-agent-acp019`, `codex-acp`, `codex-acp-ts`, `gemini`,
//! `goose-old` (−32602), `goose` (−32002, data `"Session not found: <id>"`), `opencode`,
//! `ts-method-not-found`, `rust-method-not-found` (−32601) and `python-any-id` (answers
//! `{}` whatever the id).
//!
//! A `session/cancel` ends the in-flight prompt of that session with `stopReason:
//! "cancelled"` (in `answer` mode between chunks, in `hold` mode at once). One prompt runs
//! at a time, on a session the process created or loaded; any other prompt gets the
//! model's −32603 `Internal error` (`data.details` `Session not found: <id>`).
//!
//! Every process (launcher, intermediate, agent) logs a `start` line with its pid and
//! role, so a test knows every process of the tree.
//!
//! [`AgentModel::on_line`]: palisade_testkit::agent_model::AgentModel::on_line
//! [`AgentModel::on_wake`]: palisade_testkit::agent_model::AgentModel::on_wake
//! [`AgentModel::next_wake`]: palisade_testkit::agent_model::AgentModel::next_wake
//! [`AgentModel::on_stdin_closed`]: palisade_testkit::agent_model::AgentModel::on_stdin_closed
//! [`Behaviour`]: palisade_testkit::agent_model::Behaviour
//! [`Script`]: palisade_testkit::agent_model::Script
//! [`UnknownSession`]: palisade_testkit::agent_model::UnknownSession
//! [`UnknownSession::error`]: palisade_testkit::agent_model::UnknownSession::error

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use palisade_testkit::agent_model::{
    AgentModel, Behaviour, LoadCapability, Out, PlainChunks, PromptEnd, RequestFailure, Script,
    ScriptStore, Seen, UnknownSession,
};
use palisade_wire::jsonrpc::{encode_response, RequestId};
use serde_json::{json, Value};

/// Every option the agent knows, as written on the command line.
const OPTIONS: &[&str] = &[
    "load-session",
    "load-error",
    "resume-flake-per-mille",
    "session-id",
    "new-error",
    "prompt-error",
    "list-sessions",
    "unprompted-updates",
    "ask-permission",
    "auth-required",
    "stderr-noise",
    "on-eof",
    "seed",
    "load-delay-ms",
    "load-replay",
    "chunks",
    "chunk-bytes",
    "chunk-delay-ms",
    "exit-after-chunks",
    "exit-code",
    "exit-after-prompts",
    "prompt-mode",
    "mute-from-prompt",
    "silent",
    "protocol-version",
    "misbehave",
    "misbehave-on",
    "log",
    "launcher",
    "ignore-sigterm",
    "stamp-chunks",
    "setsid",
];

/// Internal: the intermediate of a double-forking launcher; starts the agent, exits.
const FORK_MODE: &str = "--internal-fork";

/// Internal: the image `close-stdout` execs into, with stdout on /dev/null.
const SLEEP_MODE: &str = "--internal-stdout-closed";

/// How a scripted chunk's text begins on the wire (`stamp-chunks` puts the time before it).
const CHUNK_TEXT: &str = "\"text\":\"chunk ";

/// Offset added to a request id by `misbehave unknown-ids`.
const UNKNOWN_ID_OFFSET: i64 = 1_000_000;

/// The model's name: the prefix of its prompts' tags (not on the wire with plain chunks).
const MODEL_NAME: &str = "agent";

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

/// What the options say: the model's behaviour, script and store, and the shell's part.
#[derive(Debug, Clone)]
struct Options {
    behaviour: Behaviour,
    script: Script,
    store: ScriptStore,
    seed: u64,
    exit_code: u8,
    misbehave: Misbehave,
    misbehave_on: String,
    log: Option<PathBuf>,
    launcher: Launcher,
    ignore_sigterm: bool,
    /// Stamp each chunk with the wall clock it is written at.
    stamp_chunks: bool,
    /// Internal (set by a `setsid` launcher): call `setsid` first.
    setsid: bool,
}

/// The behaviour `palisade-test-agent` runs with no options: the model's default with
/// immediate answers (a test decides its delays) and no drawn tool calls.
fn base_behaviour() -> Behaviour {
    Behaviour {
        answer_delay_ms: (0, 0),
        tool_call_per_mille: 0,
        ..Behaviour::default()
    }
}

/// The program's name, before every message it prints.
const PROGRAM: &str = "palisade-test-agent";

/// The command line: every option of [`OPTIONS`] takes a value, from the argument or
/// from its variable (`PALISADE_TEST_AGENT_<NAME>`); a repeated option's last value wins
/// (a launcher appends `--launcher none` to its own arguments).
fn command() -> clap::Command {
    let mut command = clap::Command::new(PROGRAM)
        .about("A real ACP v1 agent over stdio, scripted by its options (see its crate docs).")
        .args_override_self(true);
    for name in OPTIONS {
        let arg = clap::Arg::new(*name)
            .long(*name)
            .value_name("VALUE")
            .allow_hyphen_values(true)
            .env(format!(
                "PALISADE_TEST_AGENT_{}",
                name.to_uppercase().replace('-', "_")
            ));
        // A path need not be UTF-8; every other value is text.
        command = command.arg(if *name == "log" {
            arg.value_parser(clap::value_parser!(PathBuf))
        } else {
            arg.value_parser(clap::value_parser!(String))
        });
    }
    command
}

/// Parses the arguments (without the program name); `Err` is clap's, for [`usage_exit`].
fn parse_options(args: &[OsString]) -> Result<Options, clap::Error> {
    let matches = command().try_get_matches_from(
        std::iter::once(OsString::from(PROGRAM)).chain(args.iter().cloned()),
    )?;
    let values: BTreeMap<&str, String> = OPTIONS
        .iter()
        .filter(|name| **name != "log")
        .filter_map(|name| Some((*name, matches.get_one::<String>(name)?.clone())))
        .collect();
    let log = matches.get_one::<PathBuf>("log").cloned();
    script_options(&values, log)
        .map_err(|message| command().error(clap::error::ErrorKind::ValueValidation, message))
}

/// Prints what clap refused (or the help it was asked for); the exit code: 0 for the help
/// (on stdout), 2 for bad usage (on stderr, after the program's name).
fn usage_exit(error: &clap::Error) -> ExitCode {
    let text = error.render().to_string();
    if error.kind() == clap::error::ErrorKind::DisplayHelp {
        print!("{text}");
        return ExitCode::SUCCESS;
    }
    eprint!(
        "{PROGRAM}: {}",
        text.strip_prefix("error: ").unwrap_or(&text)
    );
    ExitCode::from(2)
}

/// The options `values` (by name) and `log` stand for.
fn script_options(
    values: &BTreeMap<&str, String>,
    log: Option<PathBuf>,
) -> Result<Options, String> {
    let number = |name: &str, default: u64| -> Result<u64, String> {
        values.get(name).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("--{name}: not a number: {v:?}"))
        })
    };
    let optional = |name: &str| -> Result<Option<u64>, String> {
        match values.contains_key(name) {
            true => number(name, 0).map(Some),
            false => Ok(None),
        }
    };
    let text = |name: &str| values.get(name).cloned();
    let failure = |name: &str| -> Result<Option<RequestFailure>, String> {
        match text(name).as_deref() {
            None | Some("none") => Ok(None),
            Some("auth-required") => Ok(Some(RequestFailure::AuthRequired)),
            Some("internal") => Ok(Some(RequestFailure::Internal)),
            Some(other) => Err(format!("--{name}: unknown value {other:?}")),
        }
    };
    let mut behaviour = base_behaviour();
    let mut script = Script::default();
    let mut holds_every_id = true;

    match text("load-session").as_deref() {
        None | Some("true") => behaviour.load_capability = LoadCapability::True,
        Some("false") => behaviour.load_capability = LoadCapability::False,
        Some("absent") => behaviour.load_capability = LoadCapability::Absent,
        Some("malformed") => script.malformed_load_capability = true,
        Some(other) => return Err(format!("--load-session: unknown value {other:?}")),
    }
    match text("load-error").as_deref() {
        None | Some("none") => {}
        Some(name) => {
            behaviour.unknown_session = serde_json::from_value::<UnknownSession>(json!(name))
                .map_err(|_| {
                    format!(
                        "--load-error: unknown agent {name:?} (one of: {})",
                        UnknownSession::ALL
                            .iter()
                            .map(|u| json!(u).as_str().unwrap_or_default().to_owned())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?;
            holds_every_id = false;
        }
    }
    behaviour.resume_flake_per_mille = u16::try_from(number("resume-flake-per-mille", 0)?)
        .ok()
        .filter(|n| *n <= 1000)
        .ok_or_else(|| "--resume-flake-per-mille: must be 0..=1000".to_owned())?;
    behaviour.new_fails = failure("new-error")?;
    if let Some(prompt_failure) = failure("prompt-error")? {
        behaviour.prompt_failure = prompt_failure;
        behaviour.prompt_fail_per_mille = 1000;
    }
    behaviour.lists_sessions = flag(text("list-sessions"), "list-sessions")?;
    behaviour.unprompted_updates = flag(text("unprompted-updates"), "unprompted-updates")?;
    behaviour.asks_permission = flag(text("ask-permission"), "ask-permission")?;
    behaviour.auth_required = flag(text("auth-required"), "auth-required")?;
    behaviour.stderr_noise = flag(text("stderr-noise"), "stderr-noise")?;
    behaviour.exits_on_eof = match text("on-eof").as_deref() {
        None | Some("exit") => true,
        Some("stay") => false,
        Some(other) => return Err(format!("--on-eof: unknown value {other:?}")),
    };

    let exit_code = u8::try_from(number("exit-code", 3)?)
        .map_err(|_| "--exit-code: must be 0..=255".to_owned())?;
    let count =
        |name: &str, value: u64| u32::try_from(value).map_err(|_| format!("--{name}: too large"));
    script.load_delay_ms = Some(number("load-delay-ms", 0)?);
    script.load_replay = count("load-replay", number("load-replay", 0)?)?;
    script.chunks = Some(PlainChunks {
        count: count("chunks", number("chunks", 3)?)?,
        bytes: usize::try_from(number("chunk-bytes", 0)?)
            .map_err(|_| "--chunk-bytes: too large".to_owned())?,
        delay_ms: number("chunk-delay-ms", 0)?,
    });
    script.exit_after_chunks = optional("exit-after-chunks")?
        .map(|n| count("exit-after-chunks", n))
        .transpose()?;
    script.exit_code = i32::from(exit_code);
    script.exit_after_prompts = optional("exit-after-prompts")?;
    script.mute_from_prompt = optional("mute-from-prompt")?;
    script.protocol_version = optional("protocol-version")?
        .map(|v| u16::try_from(v).map_err(|_| "--protocol-version: must be 0..=65535".to_owned()))
        .transpose()?;
    script.prompt_end = match text("prompt-mode").as_deref() {
        None | Some("answer") => PromptEnd::Answer,
        Some("hang") => PromptEnd::Hang,
        Some("hold") => PromptEnd::Hold,
        Some(other) => return Err(format!("--prompt-mode: unknown value {other:?}")),
    };
    match text("silent").as_deref() {
        None | Some("none") => {}
        Some("on-new") => script.silent_on_new = true,
        Some("always") => behaviour.silent_per_mille = 1000,
        Some(other) => return Err(format!("--silent: unknown value {other:?}")),
    }

    Ok(Options {
        behaviour,
        script,
        store: ScriptStore::new(holds_every_id, text("session-id")),
        seed: number("seed", 0)?,
        exit_code,
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
        log,
        launcher: match text("launcher").as_deref() {
            None | Some("none") => Launcher::None,
            Some("spawn") => Launcher::Spawn,
            Some("double-fork") => Launcher::DoubleFork,
            Some("setsid") => Launcher::Setsid,
            Some(other) => return Err(format!("--launcher: unknown value {other:?}")),
        },
        ignore_sigterm: flag(text("ignore-sigterm"), "ignore-sigterm")?,
        stamp_chunks: flag(text("stamp-chunks"), "stamp-chunks")?,
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
fn log_line(path: Option<&Path>, entry: &Value) {
    if let Some(path) = path {
        if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(path) {
            let _ = file.write_all(format!("{entry}\n").as_bytes());
        }
    }
}

/// Runs as a launcher: starts the agent (this program, `--launcher none`) with this
/// process's stdio, as a child it waits for, or through an intermediate that exits at once.
fn launch(script: &Options, args: &[OsString]) -> ExitCode {
    log_line(
        script.log.as_deref(),
        &json!({"event": "start", "role": "launcher", "pid": std::process::id()}),
    );
    let Ok(exe) = std::env::current_exe() else {
        return ExitCode::from(4);
    };
    let mut agent_args: Vec<OsString> = args.to_vec();
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
fn fork_mode(args: &[OsString]) -> ExitCode {
    let log = parse_options(args).ok().and_then(|options| options.log);
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
fn ignore_sigterm(log: Option<PathBuf>) {
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

/// What the stdin reader hands the shell.
enum Input {
    /// One line, without its newline.
    Line(Vec<u8>),
    /// Stdin ended (EOF or a read error, logged).
    Closed,
}

/// The agent process: the model, its store, and the shell's process-level part.
struct Shell {
    model: AgentModel,
    store: ScriptStore,
    options: Options,
    log: Option<File>,
    started: Instant,
}

impl Shell {
    /// Milliseconds since start: the model's clock.
    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn record(&mut self, entry: &Value) {
        if let Some(file) = &mut self.log {
            // One write per line: several agents (a stopping one and its replacement) may
            // append to the same log, and O_APPEND keeps a single write whole, where
            // `writeln!` may split a line into several writes that interleave.
            let line = format!("{entry}\n");
            // The log is best effort; a test that needs it fails on what is missing.
            let _ = file.write_all(line.as_bytes()).and_then(|()| file.flush());
        }
    }

    fn exit(&mut self, code: i32, why: &str) -> ! {
        self.record(&json!({"event": "exit", "code": code, "why": why}));
        std::process::exit(code);
    }

    /// Writes one line. A closed stdout means the client is gone: exit.
    fn write_stdout(&mut self, line: &str) {
        let stamped;
        let line = if self.options.stamp_chunks && line.contains(CHUNK_TEXT) {
            let micros = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros());
            stamped = line.replacen(CHUNK_TEXT, &format!("\"text\":\"@{micros} chunk "), 1);
            stamped.as_str()
        } else {
            line
        };
        let mut out = std::io::stdout().lock();
        if out
            .write_all(line.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            drop(out);
            self.record(&json!({"event": "stdout_broken"}));
            self.exit(0, "stdout broken");
        }
    }

    /// Carries out everything the model has due by now, in order.
    fn drain(&mut self) {
        let now = self.now();
        self.model.on_wake(now);
        while let Some((out, _)) = self.model.poll_out(now) {
            match out {
                Out::Line(line) => self.write_stdout(&line),
                Out::Stderr(text) => {
                    // Noise is noise: a closed stderr changes nothing.
                    let _ = std::io::stderr().write_all(text.as_bytes());
                }
                Out::Exit(code) => self.exit(code, "agent exit"),
            }
        }
        let seen: Vec<Seen> = self.model.poll_seen().collect();
        for s in seen {
            if let Seen::PromptAnswered { answer, .. } = s {
                let entry = match answer {
                    Ok(stop) => json!({"event": "prompt_done", "stopReason": stop}),
                    Err(error) => json!({"event": "prompt_done", "error": error.code}),
                };
                self.record(&entry);
            }
        }
    }

    /// How long to wait for input before the model has something due.
    fn timeout(&self) -> Option<Duration> {
        self.model
            .next_wake()
            .map(|at| Duration::from_millis(at.saturating_sub(self.now())))
    }

    /// One line from stdin: logged, then to the model (or misbehaved on).
    fn on_line(&mut self, line: &[u8]) {
        let Ok(message) = serde_json::from_slice::<Value>(line) else {
            self.record(&json!({"garbage": String::from_utf8_lossy(line)}));
            let now = self.now();
            self.model.on_line(now, line, &mut self.store);
            return;
        };
        let method = message.get("method").and_then(Value::as_str);
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        self.record(&json!({"method": method, "id": message.get("id"), "params": params, "pid": std::process::id()}));
        let id = message
            .get("id")
            .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok());
        if let (Some(method), Some(id)) = (method, id) {
            if self.options.misbehave != Misbehave::None
                && (self.options.misbehave_on == "*" || self.options.misbehave_on == method)
            {
                let method = method.to_owned();
                self.misbehave(id, &method);
                return;
            }
        }
        let now = self.now();
        self.model.on_line(now, line, &mut self.store);
    }

    fn misbehave(&mut self, id: RequestId, method: &str) {
        self.record(&json!({"event": "misbehave", "method": method}));
        match self.options.misbehave {
            Misbehave::None | Misbehave::NeverAnswer => {}
            Misbehave::Garbage => self.write_stdout("this is not json-rpc {\n"),
            Misbehave::UnknownIds => {
                let bogus = match id {
                    RequestId::Number(n) => RequestId::Number(n.saturating_add(UNKNOWN_ID_OFFSET)),
                    RequestId::Str(s) => RequestId::Str(format!("{s}-bogus")),
                    RequestId::Null => RequestId::Str("bogus".into()),
                };
                self.write_stdout(&encode_response(&bogus, &Ok(json!({}))));
            }
            Misbehave::Exit => self.exit(i32::from(self.options.exit_code), "misbehave exit"),
            Misbehave::CloseStdout => self.close_stdout(),
        }
    }

    /// Replaces this process image with one whose stdout is /dev/null: the pid stays, the
    /// process stays alive reading stdin, and the client sees its stdout end. (std offers
    /// no safe way to close fd 1 in place; exec does it without `unsafe`.)
    fn close_stdout(&mut self) {
        self.record(&json!({"event": "close_stdout"}));
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            let Ok(exe) = std::env::current_exe() else {
                self.exit(4, "no current_exe for close-stdout");
            };
            let error = std::process::Command::new(exe)
                .arg(SLEEP_MODE)
                .stdin(std::process::Stdio::inherit())
                .stdout(std::process::Stdio::null())
                .exec();
            self.record(&json!({"event": "exec_failed", "error": error.to_string()}));
            self.exit(4, "exec failed");
        }
        #[cfg(not(unix))]
        self.exit(4, "close-stdout needs unix");
    }

    /// Runs the agent until the model exits (or a misbehaviour ends it).
    fn run(mut self) -> ! {
        let pid = std::process::id();
        self.record(&json!({"event": "start", "role": "agent", "pid": pid}));
        let (lines, input) = mpsc::sync_channel(LINES_IN_FLIGHT);
        thread::spawn(move || read_stdin(&lines));
        let mut open = true;
        loop {
            self.drain();
            if !open {
                // Nothing more comes in: sleep until the model has something due, or for
                // ever (an agent that stays after EOF with nothing to do).
                match self.timeout() {
                    Some(wait) => thread::sleep(wait),
                    None => loop {
                        thread::park();
                    },
                }
                continue;
            }
            let next = match self.timeout() {
                Some(wait) => input.recv_timeout(wait),
                None => input.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match next {
                Ok(Input::Line(line)) => self.on_line(&line),
                Ok(Input::Closed) | Err(RecvTimeoutError::Disconnected) => {
                    open = false;
                    let now = self.now();
                    self.model.on_stdin_closed(now);
                    if !self.model.behaviour().exits_on_eof {
                        self.record(&json!({"event": "stdin_closed_staying"}));
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

/// Lines read ahead of the model: the reader blocks past this, as a pipe does.
const LINES_IN_FLIGHT: usize = 64;

/// Reads stdin line by line into `lines` until EOF.
fn read_stdin(lines: &mpsc::SyncSender<Input>) {
    let stdin = std::io::stdin();
    let mut bytes = Vec::new();
    loop {
        bytes.clear();
        match stdin.lock().read_until(b'\n', &mut bytes) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let mut end = bytes.len();
                while end > 0 && matches!(bytes[end - 1], b'\n' | b'\r') {
                    end -= 1;
                }
                if bytes[..end].iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                if lines.send(Input::Line(bytes[..end].to_vec())).is_err() {
                    return;
                }
            }
        }
    }
    let _ = lines.send(Input::Closed);
}

fn main() -> ExitCode {
    // `args_os`: an argument that is not UTF-8 is refused by the parser, by name.
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == SLEEP_MODE) {
        return stdout_closed_mode();
    }
    if args.first().is_some_and(|a| a == FORK_MODE) {
        return fork_mode(&args[1..]);
    }
    let options = match parse_options(&args) {
        Ok(options) => options,
        Err(error) => return usage_exit(&error),
    };
    if options.setsid {
        // Leaves the launcher's process group and session, as a daemon does.
        let _ = rustix::process::setsid();
    }
    if options.ignore_sigterm {
        ignore_sigterm(options.log.clone());
    }
    if options.launcher != Launcher::None {
        return launch(&options, &args);
    }
    let log = match &options.log {
        None => None,
        Some(path) => match OpenOptions::new().create(true).append(true).open(path) {
            Ok(file) => Some(file),
            Err(error) => {
                eprintln!("{PROGRAM}: cannot open log {}: {error}", path.display());
                return ExitCode::from(2);
            }
        },
    };
    let model = AgentModel::new(MODEL_NAME, options.behaviour.clone(), options.seed, 0)
        .with_script(options.script.clone());
    Shell {
        model,
        store: options.store.clone(),
        options,
        log,
        started: Instant::now(),
    }
    .run()
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
