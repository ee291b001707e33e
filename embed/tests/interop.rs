//! Interop against real ACP agents installed from the registries (issue 13, item 6).
//!
//! Pinned agents, installed with npm into `target/interop/` on first use and reused after:
//!
//! - **codex-acp** `@zed-industries/codex-acp` 0.16.0: the native binary
//!   (`@zed-industries/codex-acp-linux-x64`), run directly and through its npm launcher
//!   (node running the binary as its child: the tree of issue 13's *Why* 1). It is
//!   authenticated with a dummy API key, and its model provider is a loopback fake of the
//!   OpenAI Responses API served by this test ([`FakeModel`]), which streams a reply
//!   slowly so that a turn can be killed in the middle. Proxies point at a closed loopback
//!   port, so nothing it might try leaves the machine.
//! - **The TypeScript SDK's example agent**, `@agentclientprotocol/sdk` 0.12.0,
//!   `dist/examples/agent.js` under node. It needs no model: a turn streams a few updates
//!   one second apart and asks for a permission (which the supervisor declines).
//!
//! - **The Python SDK**, `agent-client-protocol` 0.12.1 from PyPI (in a venv in the
//!   cache), under two minimal agents written here: one whose `load_session` returns
//!   `None` (as issue 13 found the SDK's examples do) and one without `load_session`.
//!   Only their answers to `session/load` are checked: what `docs/real-agents.md` says
//!   of them.
//!
//! Against codex-acp and the TS agent, over their real stdio: the handshake and `session/new`; `session/load` of
//! an unknown session, whose answer must be the one the table of `docs/real-agents.md`
//! names (code, message, `data`) and classify to its verdict; then under the supervisor: a
//! turn; SIGKILL of the agent between turns, and the next prompt completes; SIGKILL in
//! the middle of a turn, and the turn is recovered; and after the supervisor's shutdown no
//! process of any agent tree it started is alive 3 s later (ground truth: every process
//! whose environment carries this test's tree marker).
//!
//! When npm or node is missing, or the registry cannot be reached and the agent is not
//! cached yet, the agent's checks are skipped and the test says so on stderr (not
//! captured by the test harness); it never fails for that alone. `PALISADE_INTEROP=skip`
//! skips every agent.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_core::classify::{
    classify, AgentProfile, ClassifyReason, ErrorAnswer, LoadFailure, LoadOutcome, LoadVerdict,
    SessionListing, TransportState,
};
use palisade_core::{ExecutionId, SessionId, TurnId, TurnOutcome};
use palisade_embed::{
    AgentCommand, AgentConnection, ConnectionConfig, ConversationOrigin, RpcFailure, SessionEvent,
    SessionEvents, StderrMode, Supervisor, SupervisorConfig,
};
use palisade_wire::acp;
use serde_json::{json, Value};

mod common;
use common::registry::{
    self, assert_no_tree_left, descendants, node_available, npm_install, pip_install, scratch,
    sigkill, Skip,
};

const CODEX_PACKAGE: &str = "@zed-industries/codex-acp";
const CODEX_VERSION: &str = "0.16.0";
const TS_SDK_PACKAGE: &str = "@agentclientprotocol/sdk";
const TS_SDK_VERSION: &str = "0.12.0";
const PY_SDK_PACKAGE: &str = "agent-client-protocol";
const PY_SDK_VERSION: &str = "0.12.1";

/// An ACP session id no agent has: `session/load` of it must say "unknown".
const UNKNOWN_SESSION: &str = "0199a213-81c0-7800-8aa1-bbab2a035a53";

/// Generous waits for one event: the machine is shared and small.
const WITHIN: Duration = Duration::from_secs(60);

/// Deltas the fake model streams per reply, and the pause before each.
const FAKE_DELTAS: usize = 6;
const FAKE_DELTA_DELAY: Duration = Duration::from_millis(250);

/// The agents run one after another: they share the machine's two cores, and the
/// process-tree ground truth is every process carrying this test process's marker.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Says something on stderr, past the harness's capture, so a CI log shows it.
fn note(message: &str) {
    registry::note(&format!("interop: {message}"));
}

// ----- a loopback fake of the OpenAI Responses API -----------------------------------------

/// Serves `POST /v1/responses` on 127.0.0.1 with a server-sent-events reply that streams
/// [`FAKE_DELTAS`] text deltas, [`FAKE_DELTA_DELAY`] apart. Anything else gets a 404.
struct FakeModel {
    port: u16,
    replies: Arc<AtomicUsize>,
    others: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl FakeModel {
    fn start() -> FakeModel {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().unwrap().port();
        let replies = Arc::new(AtomicUsize::new(0));
        let others = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, o, s) = (replies.clone(), others.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (r, o) = (r.clone(), o.clone());
                std::thread::spawn(move || serve(stream, &r, &o));
            }
        });
        FakeModel {
            port,
            replies,
            others,
            stop,
        }
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(stream: TcpStream, replies: &AtomicUsize, others: &AtomicUsize) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(clone) => clone,
        Err(_) => return,
    });
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length.min(64 << 20)];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let mut stream = stream;
    if !request_line.starts_with("POST ") || !request_line.contains("/responses") {
        others.fetch_add(1, Ordering::SeqCst);
        let _ = stream
            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        return;
    }
    let n = replies.fetch_add(1, Ordering::SeqCst) + 1;
    let id = format!("resp_{n}");
    let item = format!("msg_{n}");
    let event = |kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        format!("event: {kind}\ndata: {data}\n\n")
    };
    let mut send = |text: String| {
        stream
            .write_all(text.as_bytes())
            .and_then(|()| stream.flush())
            .is_ok()
    };
    if !send("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n".into()) {
        return;
    }
    let _ = send(event("response.created", json!({"response": {"id": id}})));
    let _ = send(event(
        "response.output_item.added",
        json!({"output_index": 0, "item": {"type": "message", "role": "assistant", "id": item, "content": []}}),
    ));
    let mut text = String::new();
    for i in 0..FAKE_DELTAS {
        std::thread::sleep(FAKE_DELTA_DELAY);
        let delta = format!("part {i}. ");
        text.push_str(&delta);
        if !send(event(
            "response.output_text.delta",
            json!({"item_id": item, "output_index": 0, "content_index": 0, "delta": delta}),
        )) {
            return;
        }
    }
    let _ = send(event(
        "response.output_item.done",
        json!({"output_index": 0, "item": {"type": "message", "role": "assistant", "id": item,
               "content": [{"type": "output_text", "text": text}]}}),
    ));
    let _ = send(event(
        "response.completed",
        json!({"response": {"id": id, "usage": {"input_tokens": 1, "output_tokens": 1,
               "total_tokens": 2, "input_tokens_details": {"cached_tokens": 0},
               "output_tokens_details": {"reasoning_tokens": 0}}}}),
    ));
}

// ----- the checks -------------------------------------------------------------------------

/// A real agent and what `docs/real-agents.md` says it answers.
struct RealAgent {
    name: &'static str,
    command: AgentCommand,
    profile: AgentProfile,
    /// The answer to `session/load` of an unknown session, as the agents' table has it.
    unknown_load: ErrorAnswer,
    /// The raw `data` of that answer.
    unknown_load_data: Option<Value>,
    /// The table's verdict for it (with `loadSession: true` assumed, as when called).
    unknown_load_reason: ClassifyReason,
    /// What the agent's `initialize` says about `loadSession`.
    load_session: Option<bool>,
    /// At least this many processes in its tree while it runs (a launcher and its child).
    min_tree: usize,
    /// Text of a streamed chunk that shows the turn is under way (for codex: from the
    /// model's reply, so the kill lands while the reply streams).
    streaming: &'static str,
    cwd: PathBuf,
}

/// What the supervisor's JSON-RPC layer hands the classifier (as the engine builds it).
fn classifier_view(error: &palisade_wire::RpcError) -> ErrorAnswer {
    ErrorAnswer {
        code: error.code,
        message: error.message.clone(),
        data_details: error
            .data
            .as_ref()
            .and_then(|d| d.get("details"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        data_present: error.data.is_some(),
    }
}

/// Over the connection alone: handshake, `session/new`, `session/load` of an unknown
/// session; then a stop, after which no process of the tree is left.
async fn connection_checks(agent: &RealAgent, report: &mut Vec<String>) {
    let config = ConnectionConfig {
        stderr: StderrMode::Null,
        ..ConnectionConfig::default()
    };
    let (conn, mut events) = AgentConnection::spawn(&agent.command, config).expect("spawns");
    let drain = tokio::spawn(async move { while events.recv().await.is_some() {} });
    let deadline = || tokio::time::Instant::now() + WITHIN;
    let init = conn
        .request(
            acp::INITIALIZE,
            acp::initialize_params("palisade-interop", "1"),
            deadline(),
        )
        .await
        .unwrap_or_else(|e| panic!("{}: initialize: {e}", agent.name));
    let load_session = init["agentCapabilities"]["loadSession"].as_bool();
    assert_eq!(load_session, agent.load_session, "{}: {init}", agent.name);
    let created = conn
        .request(
            acp::SESSION_NEW,
            acp::new_session_params(&agent.cwd),
            deadline(),
        )
        .await
        .unwrap_or_else(|e| panic!("{}: session/new: {e}", agent.name));
    let session_id = created["sessionId"].as_str().unwrap_or_default();
    assert!(!session_id.is_empty(), "{}: {created}", agent.name);
    let answer = conn
        .request(
            acp::SESSION_LOAD,
            acp::load_session_params(UNKNOWN_SESSION, &agent.cwd),
            deadline(),
        )
        .await;
    let Err(RpcFailure::Rpc(error)) = answer else {
        panic!(
            "{}: session/load of an unknown session answered {answer:?}",
            agent.name
        );
    };
    let seen = classifier_view(&error);
    assert_eq!(seen, agent.unknown_load, "{}: {error:?}", agent.name);
    assert_eq!(error.data, agent.unknown_load_data, "{}", agent.name);
    let outcome = LoadOutcome {
        load_capability: Some(true),
        requested_session: UNKNOWN_SESSION.to_owned(),
        result: LoadFailure::Rpc(seen),
        transport: TransportState::Open,
        listing: SessionListing::Unknown,
    };
    let classification = classify(&outcome, agent.profile);
    assert_eq!(
        (classification.verdict, classification.reason),
        (LoadVerdict::Incompatible, agent.unknown_load_reason),
        "{}",
        agent.name
    );
    report.push(format!(
        "{}: initialize loadSession={load_session:?}; session/new ok; session/load unknown → \
         {} {:?} data={} → {:?} ({:?})",
        agent.name,
        error.code,
        error.message,
        error.data.as_ref().map_or("none".into(), Value::to_string),
        classification.verdict,
        classification.reason
    ));
    let known = descendants(conn.pid().expect("spawned"));
    assert!(
        known.len() >= agent.min_tree,
        "{}: tree {known:?}",
        agent.name
    );
    conn.stop(tokio::time::Instant::now() + Duration::from_millis(500))
        .await;
    drain.abort();
    assert_no_tree_left(
        &format!("{} after a connection stop", agent.name),
        std::process::id(),
        &known,
    );
}

struct Run {
    supervisor: Supervisor,
    events: SessionEvents,
    seen: Vec<SessionEvent>,
}

impl Run {
    async fn until<T>(
        &mut self,
        what: &str,
        mut pick: impl FnMut(&SessionEvent) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + WITHIN;
        loop {
            let event = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("no {what} within {WITHIN:?}; seen {:#?}", self.seen))
                .unwrap_or_else(|| panic!("events ended before {what}; seen {:#?}", self.seen));
            let picked = pick(&event);
            self.seen.push(event);
            if let Some(picked) = picked {
                return picked;
            }
        }
    }

    async fn turn(&mut self, text: &str) -> (TurnId, TurnOutcome) {
        let turn = self.supervisor.prompt(session(), text).await.unwrap();
        let outcome = self.turn_end(turn).await;
        (turn, outcome)
    }

    async fn turn_end(&mut self, turn: TurnId) -> TurnOutcome {
        self.until("turn end", |e| match e {
            SessionEvent::TurnEnded {
                turn: t, outcome, ..
            } if *t == turn => Some(*outcome),
            _ => None,
        })
        .await
    }

    /// The live runtime: the last one started and not yet exited.
    fn runtime(&self) -> (ExecutionId, u32) {
        let mut live = None;
        for event in &self.seen {
            match event {
                SessionEvent::RuntimeStarted {
                    execution,
                    pid: Some(pid),
                    ..
                } => live = Some((*execution, *pid)),
                SessionEvent::RuntimeExited { execution, .. }
                    if live.is_some_and(|(x, _)| x == *execution) =>
                {
                    live = None;
                }
                _ => {}
            }
        }
        live.expect("a runtime is live")
    }

    fn origins(&self) -> Vec<ConversationOrigin> {
        self.seen
            .iter()
            .filter_map(|e| match e {
                SessionEvent::ConversationReady { origin, .. } => Some(*origin),
                _ => None,
            })
            .collect()
    }

    fn outputs(&self, turn: TurnId) -> usize {
        self.seen
            .iter()
            .map(|e| match e {
                SessionEvent::Output {
                    turn: t, events, ..
                } if *t == turn => events.len(),
                _ => 0,
            })
            .sum()
    }
}

fn session() -> SessionId {
    SessionId::new(1).unwrap()
}

/// Under the supervisor: a turn; SIGKILL between turns and the next prompt completes;
/// SIGKILL mid-turn and the turn is recovered; shutdown leaves no process behind.
async fn supervisor_checks(agent: &RealAgent, report: &mut Vec<String>) {
    let mut config = SupervisorConfig::default();
    config.engine.core.agent_profile = agent.profile;
    config.engine.core.recovery_delays_ms = vec![100, 200, 400];
    config.engine.cwd = agent.cwd.clone();
    config.engine.stop_grace_ms = 500;
    config.engine.core.turn_idle_ms = 30_000;
    config.connection.stderr = StderrMode::Null;
    config.engine.audit = true;
    let (supervisor, events) =
        Supervisor::start(config, agent.command.clone(), None).expect("starts");
    let mut run = Run {
        supervisor,
        events,
        seen: Vec::new(),
    };

    // Handshake, session/new and a whole turn.
    let (t1, outcome) = run.turn("Say hello.").await;
    assert_eq!(
        outcome,
        TurnOutcome::Completed,
        "{}: {:#?}",
        agent.name,
        run.seen
    );
    assert!(run.outputs(t1) > 0, "{}: no output", agent.name);
    assert_eq!(run.origins(), [ConversationOrigin::Created]);
    let (execution, pid) = run.runtime();
    let mut known = descendants(pid);
    assert!(
        known.len() >= agent.min_tree,
        "{}: tree {known:?}",
        agent.name
    );

    // SIGKILL between turns: the next prompt completes on a replacement.
    sigkill(pid);
    run.until("runtime exit", |e| match e {
        SessionEvent::RuntimeExited { execution: x, .. } if *x == execution => Some(()),
        _ => None,
    })
    .await;
    let (_, outcome) = run.turn("Say it again.").await;
    assert_eq!(
        outcome,
        TurnOutcome::Completed,
        "{}: {:#?}",
        agent.name,
        run.seen
    );
    let between = *run.origins().last().unwrap();

    // SIGKILL in the middle of a turn: recovered.
    let turn = run
        .supervisor
        .prompt(session(), "A longer answer.")
        .await
        .unwrap();
    run.until("streamed output", |e| match e {
        SessionEvent::Output {
            turn: t, events, ..
        } if *t == turn => events
            .iter()
            .any(|o| {
                o.update.parse::<Value>().unwrap()["content"]["text"]
                    .as_str()
                    .is_some_and(|text| text.contains(agent.streaming))
            })
            .then_some(()),
        _ => None,
    })
    .await;
    let (_, pid) = run.runtime();
    known.extend(descendants(pid));
    sigkill(pid);
    let outcome = run.turn_end(turn).await;
    let recoveries = run
        .seen
        .iter()
        .filter(|e| matches!(e, SessionEvent::RecoveryStarted { turn: t, .. } if *t == turn))
        .count();
    assert_eq!(
        (outcome, recoveries),
        (TurnOutcome::Completed, 1),
        "{}: {:#?}",
        agent.name,
        run.seen
    );
    let mid_turn = *run.origins().last().unwrap();
    let stats = run.supervisor.stats().await.unwrap();
    assert_eq!(stats.engine.audit_violations, 0, "{}", agent.name);

    // Exit: nothing of any tree is left.
    known.extend(descendants(run.runtime().1));
    run.supervisor.shutdown().await;
    assert_no_tree_left(
        &format!("{} after shutdown", agent.name),
        std::process::id(),
        &known,
    );
    report.push(format!(
        "{}: turn completed; killed between turns → next turn completed ({between:?}); \
         killed mid-turn → recovered once ({mid_turn:?}); shutdown → no process left",
        agent.name
    ));
}

/// Runs every check against `agent`, then removes its scratch directory (kept on a
/// failure, for a look at the agent's own files and logs).
async fn check(agent: RealAgent, scratch: &Path) {
    let started = Instant::now();
    let mut report = Vec::new();
    connection_checks(&agent, &mut report).await;
    supervisor_checks(&agent, &mut report).await;
    let _ = std::fs::remove_dir_all(scratch);
    for line in report {
        note(&line);
    }
    note(&format!(
        "{}: checked in {:.1} s",
        agent.name,
        started.elapsed().as_secs_f64()
    ));
}

/// codex-acp's answer to an unknown session: −32002, no data.
fn codex_unknown_load() -> ErrorAnswer {
    ErrorAnswer {
        code: -32002,
        message: "Resource not found".into(),
        data_details: None,
        data_present: false,
    }
}

/// A scratch HOME for codex: a dummy API key, the loopback model, nothing else enabled.
fn codex_home(dir: &Path, model: &FakeModel) -> PathBuf {
    let codex_home = dir.join("home").join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    std::fs::write(
        codex_home.join("auth.json"),
        r#"{"OPENAI_API_KEY":"sk-palisade-interop-dummy"}"#,
    )
    .unwrap();
    let url = model.base_url();
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            r#"model = "gpt-5.1-codex"
model_provider = "loopback"
openai_base_url = "{url}"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.loopback]
name = "loopback"
base_url = "{url}"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
supports_websockets = false
request_max_retries = 0
stream_max_retries = 0
"#
        ),
    )
    .unwrap();
    codex_home
}

fn codex_command(
    program: AgentCommand,
    dir: &Path,
    home: &Path,
    model: &FakeModel,
) -> AgentCommand {
    program
        .env("HOME", dir.join("home"))
        .env("CODEX_HOME", home)
        .env("OPENAI_API_KEY", "sk-palisade-interop-dummy")
        .env("OPENAI_BASE_URL", model.base_url())
        // Anything that would go elsewhere goes to a closed loopback port instead.
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("ALL_PROXY", "http://127.0.0.1:9")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("RUST_LOG", "error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_acp_native_and_through_its_npm_launcher() {
    let _serial = SERIAL.lock().await;
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        note("codex-acp: skipped, the pinned native package is linux-x64");
        return;
    }
    let dir = match npm_install(CODEX_PACKAGE, CODEX_VERSION) {
        Ok(dir) => dir,
        Err(Skip(why)) => {
            note(&format!("codex-acp: SKIPPED: {why}"));
            return;
        }
    };
    let modules = dir.join("node_modules").join("@zed-industries");
    let native = modules
        .join("codex-acp-linux-x64")
        .join("bin")
        .join("codex-acp");
    assert!(native.is_file(), "{} missing", native.display());
    let model = FakeModel::start();

    let scratch_native = scratch("codex-native");
    let home = codex_home(&scratch_native, &model);
    check(
        RealAgent {
            name: "codex-acp 0.16.0 (native)",
            command: codex_command(AgentCommand::new(&native), &scratch_native, &home, &model),
            profile: AgentProfile::CodexAcpRust,
            unknown_load: codex_unknown_load(),
            unknown_load_data: None,
            unknown_load_reason: ClassifyReason::ResourceNotFound,
            load_session: Some(true),
            min_tree: 1,
            streaming: "part ",
            cwd: scratch_native.join("work"),
        },
        &scratch_native,
    )
    .await;

    if node_available() {
        let scratch_launcher = scratch("codex-launcher");
        let home = codex_home(&scratch_launcher, &model);
        let launcher = AgentCommand::new("node")
            .arg(modules.join("codex-acp").join("bin").join("codex-acp.js"));
        check(
            RealAgent {
                name: "codex-acp 0.16.0 (npm launcher)",
                command: codex_command(launcher, &scratch_launcher, &home, &model),
                profile: AgentProfile::CodexAcpRust,
                unknown_load: codex_unknown_load(),
                unknown_load_data: None,
                unknown_load_reason: ClassifyReason::ResourceNotFound,
                load_session: Some(true),
                // node, and the native binary as its child.
                min_tree: 2,
                streaming: "part ",
                cwd: scratch_launcher.join("work"),
            },
            &scratch_launcher,
        )
        .await;
    } else {
        note("codex-acp (npm launcher): SKIPPED: node is not installed");
    }
    note(&format!(
        "fake model: {} replies streamed, {} other requests",
        model.replies.load(Ordering::SeqCst),
        model.others.load(Ordering::SeqCst)
    ));
    assert_eq!(model.others.load(Ordering::SeqCst), 0);
    // Per run: the first turn, the turn after the kill, the killed turn, its recovery.
    assert!(model.replies.load(Ordering::SeqCst) >= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_example_agent() {
    let _serial = SERIAL.lock().await;
    if !node_available() {
        note("TS SDK example agent: SKIPPED: node is not installed");
        return;
    }
    let dir = match npm_install(TS_SDK_PACKAGE, TS_SDK_VERSION) {
        Ok(dir) => dir,
        Err(Skip(why)) => {
            note(&format!("TS SDK example agent: SKIPPED: {why}"));
            return;
        }
    };
    let script = dir
        .join("node_modules")
        .join("@agentclientprotocol")
        .join("sdk")
        .join("dist")
        .join("examples")
        .join("agent.js");
    assert!(script.is_file(), "{} missing", script.display());
    let scratch = scratch("ts-sdk");
    check(
        RealAgent {
            name: "TS SDK 0.12.0 example agent",
            command: AgentCommand::new("node")
                .arg(&script)
                .env("HOME", scratch.join("home")),
            profile: AgentProfile::Generic,
            // The TS SDK's `RequestError.methodNotFound(method)`, data and all.
            unknown_load: ErrorAnswer {
                code: -32601,
                message: "\"Method not found\": session/load".into(),
                data_details: None,
                data_present: true,
            },
            unknown_load_data: Some(json!({"method": "session/load"})),
            unknown_load_reason: ClassifyReason::MethodNotFound,
            load_session: Some(false),
            min_tree: 1,
            streaming: "I'll help you",
            cwd: scratch.join("work"),
        },
        &scratch,
    )
    .await;
}

/// A minimal agent on the Python SDK. `LOAD` is what its `load_session` does: `none`
/// returns `None`; `missing` has no `load_session` at all.
const PYTHON_AGENT: &str = r#"
import asyncio, sys
from acp import run_agent
from acp.schema import AgentCapabilities, InitializeResponse, NewSessionResponse, PromptResponse

class Agent:
    async def initialize(self, protocol_version, client_capabilities=None, **kwargs):
        return InitializeResponse(protocol_version=protocol_version,
                                  agent_capabilities=AgentCapabilities(load_session=True))

    async def new_session(self, cwd, mcp_servers=None, **kwargs):
        return NewSessionResponse(session_id="py-session-1")

    async def prompt(self, prompt, session_id, **kwargs):
        return PromptResponse(stop_reason="end_turn")

class LoadsAnything(Agent):
    async def load_session(self, cwd, session_id, mcp_servers=None, **kwargs):
        return None

asyncio.run(run_agent(LoadsAnything() if sys.argv[1] == "none" else Agent()))
"#;

/// The answer of a Python-SDK agent to `session/load` of an unknown session.
async fn python_unknown_load(
    python: &Path,
    script: &Path,
    load: &str,
) -> Result<Value, RpcFailure> {
    let command = AgentCommand::new(python).arg(script).arg(load);
    let config = ConnectionConfig {
        stderr: StderrMode::Null,
        ..ConnectionConfig::default()
    };
    let (conn, mut events) = AgentConnection::spawn(&command, config).expect("spawns");
    let drain = tokio::spawn(async move { while events.recv().await.is_some() {} });
    let deadline = || tokio::time::Instant::now() + WITHIN;
    let cwd = std::env::temp_dir();
    conn.request(
        acp::INITIALIZE,
        acp::initialize_params("palisade-interop", "1"),
        deadline(),
    )
    .await
    .expect("initialize");
    conn.request(acp::SESSION_NEW, acp::new_session_params(&cwd), deadline())
        .await
        .expect("session/new");
    let answer = conn
        .request(
            acp::SESSION_LOAD,
            acp::load_session_params(UNKNOWN_SESSION, &cwd),
            deadline(),
        )
        .await;
    conn.stop(tokio::time::Instant::now() + Duration::from_millis(200))
        .await;
    drain.abort();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_agents_answer_session_load_as_the_table_says() {
    let _serial = SERIAL.lock().await;
    let python = match pip_install(PY_SDK_PACKAGE, PY_SDK_VERSION) {
        Ok(python) => python,
        Err(Skip(why)) => {
            note(&format!("Python SDK agents: SKIPPED: {why}"));
            return;
        }
    };
    let scratch = scratch("python-sdk");
    let script = scratch.join("agent.py");
    std::fs::write(&script, PYTHON_AGENT).unwrap();

    // A `load_session` that returns None: the SDK answers `{}`, a success, for any id.
    let answer = python_unknown_load(&python, &script, "none").await;
    assert_eq!(answer, Ok(json!({})));
    // No `load_session`: −32601, with the method in `data`.
    let answer = python_unknown_load(&python, &script, "missing").await;
    let Err(RpcFailure::Rpc(error)) = &answer else {
        panic!("session/load without a handler answered {answer:?}");
    };
    assert_eq!(
        (error.code, error.message.as_str(), &error.data),
        (
            -32601,
            "Method not found",
            &Some(json!({"method": "session/load"}))
        )
    );
    note(&format!(
        "Python SDK {PY_SDK_VERSION}: load_session returning None → session/load of an \
         unknown id answers {{}} (success); no load_session → -32601 \"Method not found\" \
         data={{\"method\":\"session/load\"}}"
    ));
    assert_no_tree_left("Python SDK agents", std::process::id(), &[]);
    let _ = std::fs::remove_dir_all(scratch);
}

/// Issue 13, *Why* 6: the table of real agents' answers (`docs/real-agents.md`, once in
/// the README) says what the real agents answered (the answers this suite checks above,
/// and the package name issue 13 ran).
#[test]
fn the_agents_table_says_what_the_real_agents_answer() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/real-agents.md"
    ))
    .expect("docs/real-agents.md");
    let table = page
        .split_once("### Real agents' answers to an unknown session")
        .and_then(|(_, rest)| rest.split_once("### Rule 6, row by row"))
        .map(|(table, _)| table.replace('\n', " "))
        .expect("docs/real-agents.md has the table of real agents' answers");
    for fact in [
        // The TS SDK's methodNotFound carries the method in `data`.
        r#"`methodNotFound(m)` becomes `{code: -32601, message: "\"Method not found\": <m>", data: {method: <m>}}`"#,
        // The claude-agent-acp package that was run.
        "`@zed-industries/claude-agent-acp`",
        // Python-SDK agents whose load_session returns None answer {} to any id.
        "whose `load_session` returns `None`",
        "`{}`, a **success**, for any id",
        // What the interop suite checks, named as such.
        "`@zed-industries/codex-acp`, 0.16.0 *(interop)*",
        r#"−32601 `"Method not found": session/load`, `data: {method: "session/load"}`"#,
    ] {
        assert!(table.contains(fact), "the agents' table lacks: {fact}");
    }
}
