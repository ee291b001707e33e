//! The connection against real child processes: the `palisade-test-agent` binary (a real
//! ACP agent over stdio) and, for the few shapes it never writes, `/bin/sh`.
//!
//! Ground truth comes from the agent's own log (`--log`): what really reached it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use palisade_embed::{
    AgentCommand, AgentConnection, AgentEvent, AgentEvents, Anomaly, CloseReason, ConnectionConfig,
    ProcessExit, RpcFailure, SpawnError, StderrMode,
};
use palisade_wire::acp::schema::{ContentBlock, SessionNotification, SessionUpdate};
use palisade_wire::acp::{self, LoadSessionSupport};
use palisade_wire::{RequestId, RpcError};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Generous: a loaded CI machine must not turn a correct answer into a timeout.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);
/// "Promptly": a dead agent is reported well before any request deadline would fire.
const PROMPTLY: Duration = Duration::from_secs(3);
const SIGKILL: i32 = 9;

fn test_agent(args: &[&str]) -> AgentCommand {
    AgentCommand::new(palisade_testkit::shipped::binary("palisade-test-agent")).args(args)
}

fn deadline() -> Instant {
    Instant::now() + ANSWER_WITHIN
}

fn spawn(command: &AgentCommand) -> (Arc<AgentConnection>, AgentEvents) {
    spawn_with(command, ConnectionConfig::default())
}

fn spawn_with(
    command: &AgentCommand,
    config: ConnectionConfig,
) -> (Arc<AgentConnection>, AgentEvents) {
    let (conn, events) = AgentConnection::spawn(command, config).expect("test agent starts");
    (Arc::new(conn), events)
}

/// Collects every event until `Closed` (inclusive).
fn drain(mut events: AgentEvents) -> JoinHandle<Vec<AgentEvent>> {
    tokio::spawn(async move {
        let mut all = Vec::new();
        while let Some(event) = events.recv().await {
            let closed = matches!(event, AgentEvent::Closed(_));
            all.push(event);
            if closed {
                break;
            }
        }
        all
    })
}

async fn finish(drained: JoinHandle<Vec<AgentEvent>>) -> Vec<AgentEvent> {
    tokio::time::timeout(ANSWER_WITHIN, drained)
        .await
        .expect("the event stream ends once the agent is gone")
        .expect("drain task does not panic")
}

async fn initialize(conn: &AgentConnection) -> Value {
    conn.request(
        acp::INITIALIZE,
        acp::initialize_params("palisade-test", "0"),
        deadline(),
    )
    .await
    .expect("initialize answered")
}

async fn new_session(conn: &AgentConnection) -> String {
    let result = conn
        .request(
            acp::SESSION_NEW,
            acp::new_session_params("/tmp"),
            deadline(),
        )
        .await
        .expect("session/new answered");
    result["sessionId"]
        .as_str()
        .expect("session/new returns a sessionId")
        .to_owned()
}

/// The text of an `agent_message_chunk` / `user_message_chunk`, read with the schema types.
fn chunk_text(params: &Value) -> String {
    let notification: SessionNotification =
        serde_json::from_value(params.clone()).expect("a valid session/update");
    let chunk = match notification.update {
        SessionUpdate::AgentMessageChunk(chunk) | SessionUpdate::UserMessageChunk(chunk) => chunk,
        other => panic!("unexpected update {other:?}"),
    };
    match chunk.content {
        ContentBlock::Text(text) => text.text,
        other => panic!("unexpected content {other:?}"),
    }
}

/// A `session/update`'s params again, from what the connection read of them.
fn update_params(session_id: Option<&str>, update: Option<&palisade_wire::RawJson>) -> Value {
    let update = update.expect("an update").parse::<Value>().unwrap();
    serde_json::json!({ "sessionId": session_id, "update": update })
}

fn updates(events: &[AgentEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match event {
            AgentEvent::Update {
                session_id, update, ..
            } => Some(chunk_text(&update_params(
                session_id.as_deref(),
                update.as_ref(),
            ))),
            _ => None,
        })
        .collect()
}

fn closed_reason(events: &[AgentEvent]) -> Option<&CloseReason> {
    match events.last() {
        Some(AgentEvent::Closed(reason)) => Some(reason),
        _ => None,
    }
}

fn anomalies(events: &[AgentEvent]) -> Vec<&Anomaly> {
    events
        .iter()
        .filter_map(|event| match event {
            AgentEvent::Anomaly(anomaly) => Some(anomaly),
            _ => None,
        })
        .collect()
}

/// A fresh log path for the agent's ground truth.
fn log_path(test: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "palisade-test-agent-{}-{test}.jsonl",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    path
}

fn read_log(path: &PathBuf) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| serde_json::from_str(line).expect("the agent logs JSON lines"))
        .collect()
}

/// The prompt texts that really reached the agent.
fn prompts_received(log: &[Value]) -> Vec<String> {
    log.iter()
        .filter(|entry| entry["method"] == acp::SESSION_PROMPT)
        .map(|entry| {
            entry["params"]["prompt"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// Whether `pid` is gone from the process table (reaped, not a zombie).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // Field 3 is the state; "Z" is a zombie nobody reaped.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

async fn assert_reaped_soon(pid: u32) {
    let until = Instant::now() + PROMPTLY;
    while !process_gone(pid) {
        assert!(
            Instant::now() < until,
            "agent {pid} still running or a zombie"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_new_session_and_prompt_round_trip() {
    let log = log_path("round-trip");
    let (conn, events) = spawn(&test_agent(&[
        "--chunks",
        "3",
        "--log",
        log.to_str().unwrap(),
    ]));
    let drained = drain(events);

    let init = initialize(&conn).await;
    assert_eq!(init["protocolVersion"], json!(1));
    assert_eq!(
        acp::load_session_support(&init),
        LoadSessionSupport::Advertised
    );
    let session_id = new_session(&conn).await;
    assert_eq!(session_id, "test-session-1");
    let answer = conn
        .request(
            acp::SESSION_PROMPT,
            acp::prompt_params(&session_id, "hello agent"),
            deadline(),
        )
        .await
        .expect("prompt answered");
    assert_eq!(answer, json!({"stopReason": "end_turn"}));

    // A graceful end: stdin EOF makes the agent exit 0.
    conn.close_stdin();
    assert_eq!(conn.wait_exit(deadline()).await, Some(ProcessExit::Code(0)));
    let events = finish(drained).await;
    assert_eq!(updates(&events), ["chunk 0", "chunk 1", "chunk 2"]);
    assert_eq!(
        closed_reason(&events),
        Some(&CloseReason::ProcessExited(ProcessExit::Code(0)))
    );
    assert!(anomalies(&events).is_empty());
    let stats = conn.stats();
    assert_eq!((stats.notifications, stats.responses), (3, 3));
    assert_eq!(prompts_received(&read_log(&log)), ["hello agent"]);
    let _ = std::fs::remove_file(log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_with_each_real_agents_unknown_session_error_is_a_typed_rpc_error() {
    let id = "old-session-42";
    // The table of `docs/real-agents.md` ("Real agents' answers to an unknown session"),
    // written out here by hand: the binary takes its answers from the model's table, and
    // this pins both to that page.
    let internal = |details: String| {
        RpcError::new(-32603, "Internal error").with_data(json!({ "details": details }))
    };
    let cases: [(&str, Option<RpcError>); 12] = [
        (
            "claude-agent-acp",
            Some(
                RpcError::new(-32002, format!("Resource not found: {id}"))
                    .with_data(json!({ "uri": id })),
            ),
        ),
        (
            "claude-code-acp",
            Some(internal("Session not found".into())),
        ),
        (
            "claude-agent-acp019",
            Some(internal("Query closed before response received".into())),
        ),
        (
            "codex-acp",
            Some(RpcError::new(-32002, "Resource not found")),
        ),
        (
            "codex-acp-ts",
            Some(RpcError::new(
                -32603,
                format!("no rollout found for thread id {id}"),
            )),
        ),
        (
            "gemini",
            Some(internal(format!(
                "Invalid session identifier \"{id}\".\n  Searched for sessions in \
                 /home/user/.gemini/tmp/0f3c/chats.\n  Use --list-sessions to see \
                 available sessions."
            ))),
        ),
        (
            "goose-old",
            Some(
                RpcError::new(-32602, "Invalid params").with_data(json!(format!(
                    "Failed to load session {id}: record not found in sessions.db"
                ))),
            ),
        ),
        (
            "goose",
            Some(
                RpcError::new(-32002, "Resource not found")
                    .with_data(json!(format!("Session not found: {id}"))),
            ),
        ),
        (
            "opencode",
            Some(RpcError::new(-32603, "Internal error").with_data(json!({"status": 404}))),
        ),
        (
            "ts-method-not-found",
            Some(
                RpcError::new(-32601, "\"Method not found\": session/load")
                    .with_data(json!({"method": "session/load"})),
            ),
        ),
        (
            "rust-method-not-found",
            Some(RpcError::new(-32601, "Method not found")),
        ),
        // The Python SDK's example agents answer `{}` to any id.
        ("python-any-id", None),
    ];
    for (agent, expected) in cases {
        let (conn, events) = spawn(&test_agent(&["--load-error", agent]));
        let drained = drain(events);
        initialize(&conn).await;
        let answer = conn
            .request(
                acp::SESSION_LOAD,
                acp::load_session_params(id, "/tmp"),
                deadline(),
            )
            .await;
        match expected {
            Some(expected) => assert_eq!(answer, Err(RpcFailure::Rpc(expected)), "agent {agent}"),
            None => assert_eq!(answer, Ok(json!({})), "agent {agent}"),
        }
        // The connection stays usable after an error answer.
        assert!(conn.close_reason().is_none(), "agent {agent}");
        assert_eq!(
            conn.kill_and_reap(deadline()).await,
            Some(ProcessExit::Signal(SIGKILL))
        );
        assert_eq!(
            closed_reason(&finish(drained).await),
            Some(&CloseReason::Killed(Some(ProcessExit::Signal(SIGKILL))))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_session_capability_is_read_as_three_states() {
    for (flag, expected) in [
        ("true", LoadSessionSupport::Advertised),
        ("false", LoadSessionSupport::NotAdvertised),
        ("absent", LoadSessionSupport::NotAdvertised),
        ("malformed", LoadSessionSupport::Malformed),
    ] {
        let (conn, _events) = spawn(&test_agent(&["--load-session", flag]));
        let init = initialize(&conn).await;
        assert_eq!(
            acp::load_session_support(&init),
            expected,
            "--load-session {flag}"
        );
        conn.kill_and_reap(deadline()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_load_replays_history_then_answers() {
    let (conn, events) = spawn(&test_agent(&[
        "--load-delay-ms",
        "200",
        "--load-replay",
        "4",
    ]));
    let drained = drain(events);
    initialize(&conn).await;
    let started = Instant::now();
    let answer = conn
        .request(
            acp::SESSION_LOAD,
            acp::load_session_params("s-1", "/tmp"),
            deadline(),
        )
        .await
        .expect("load answered");
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(answer.is_object());
    conn.kill_and_reap(deadline()).await;
    let events = finish(drained).await;
    assert_eq!(
        updates(&events),
        ["history 0", "history 1", "history 2", "history 3"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_past_its_deadline_times_out_and_the_late_answer_is_reported() {
    let (conn, events) = spawn(&test_agent(&["--load-delay-ms", "400"]));
    let drained = drain(events);
    initialize(&conn).await;
    let failure = conn
        .request(
            acp::SESSION_LOAD,
            acp::load_session_params("s-1", "/tmp"),
            Instant::now() + Duration::from_millis(100),
        )
        .await
        .expect_err("the load is slower than its deadline");
    // TimedOut itself proves we did not wait for the 400 ms answer.
    assert_eq!(failure, RpcFailure::TimedOut);

    // The agent's answer still comes; it is reported as late, and nothing breaks.
    let until = Instant::now() + ANSWER_WITHIN;
    while conn.stats().late_responses == 0 {
        assert!(Instant::now() < until, "late answer never reported");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(conn.close_reason().is_none());
    initialize(&conn).await;
    conn.kill_and_reap(deadline()).await;
    let events = finish(drained).await;
    // Ids start at 1: initialize was 1, the load 2.
    assert_eq!(anomalies(&events), [&Anomaly::LateResponse { id: 2 }]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eleven_hundred_notifications_arrive_in_order_through_a_small_queue() {
    // A 16-slot queue and a slow reader: without backpressure this would overflow (and in
    // compozy #454, close the connection).
    let config = ConnectionConfig {
        event_capacity: 16,
        ..ConnectionConfig::default()
    };
    let (conn, mut events) = spawn_with(&test_agent(&["--chunks", "1100"]), config);
    let reader = tokio::spawn(async move {
        let mut texts = Vec::new();
        let mut wire_bytes = 0;
        while let Some(event) = events.recv().await {
            match event {
                AgentEvent::Update {
                    session_id,
                    update,
                    wire_bytes: bytes,
                } => {
                    texts.push(chunk_text(&update_params(
                        session_id.as_deref(),
                        update.as_ref(),
                    )));
                    wire_bytes += bytes;
                    if texts.len() % 100 == 0 {
                        // A slow consumer: the agent must wait, not lose anything.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                AgentEvent::Closed(reason) => return (texts, wire_bytes, Some(reason)),
                other => panic!("unexpected event {other:?}"),
            }
        }
        (texts, wire_bytes, None)
    });
    initialize(&conn).await;
    let session_id = new_session(&conn).await;
    for turn in 0..2 {
        let answer = conn
            .request(
                acp::SESSION_PROMPT,
                acp::prompt_params(&session_id, &format!("turn {turn}")),
                deadline(),
            )
            .await
            .expect("prompt answered after all its notifications");
        assert_eq!(answer["stopReason"], "end_turn");
        assert!(conn.close_reason().is_none(), "no disconnect");
    }
    conn.kill_and_reap(deadline()).await;
    let (texts, wire_bytes, reason) = finish_reader(reader).await;
    let expected: Vec<String> = (0..2)
        .flat_map(|_| (0..1100).map(|i| format!("chunk {i}")))
        .collect();
    assert_eq!(
        texts, expected,
        "every notification, in order, no gap, no duplicate"
    );
    assert!(wire_bytes > 2200 * 100);
    assert_eq!(
        reason,
        Some(CloseReason::Killed(Some(ProcessExit::Signal(SIGKILL))))
    );
    assert_eq!(conn.stats().notifications, 2200);
    assert_eq!(conn.stats().events_without_receiver, 0);
}

async fn finish_reader<T>(reader: JoinHandle<T>) -> T {
    tokio::time::timeout(ANSWER_WITHIN, reader)
        .await
        .expect("reader ends")
        .expect("reader does not panic")
}

/// Starts a long prompt, waits for `after` of its notifications, returns the events left.
async fn prompt_in_flight(
    conn: &Arc<AgentConnection>,
    events: &mut AgentEvents,
    after: usize,
) -> JoinHandle<Result<Value, RpcFailure>> {
    initialize(conn).await;
    let session_id = new_session(conn).await;
    let prompting = {
        let conn = Arc::clone(conn);
        tokio::spawn(async move {
            conn.request(
                acp::SESSION_PROMPT,
                acp::prompt_params(&session_id, "long task"),
                deadline(),
            )
            .await
        })
    };
    let mut seen = 0;
    while seen < after {
        match events.recv().await.expect("events flow") {
            AgentEvent::Update { .. } => seen += 1,
            other => panic!("unexpected event {other:?}"),
        }
    }
    prompting
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sigkilled_mid_prompt_fails_the_prompt_with_process_exited_promptly() {
    let log = log_path("sigkill");
    let (conn, mut events) = spawn(&test_agent(&[
        "--chunks",
        "100000",
        "--chunk-delay-ms",
        "1",
        "--log",
        log.to_str().unwrap(),
    ]));
    let pid = conn.pid().expect("a running agent has a pid");
    let prompting = prompt_in_flight(&conn, &mut events, 5).await;

    // Killed from outside, as an OOM killer or an operator would.
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let killed_at = Instant::now();
    let drained = drain(events);
    let failure = prompting
        .await
        .expect("prompt task does not panic")
        .expect_err("the prompt cannot finish");
    assert!(killed_at.elapsed() < PROMPTLY, "reported promptly");
    assert_eq!(
        failure,
        RpcFailure::ProcessExited {
            status: ProcessExit::Signal(SIGKILL)
        }
    );
    let events = finish(drained).await;
    assert_eq!(
        closed_reason(&events),
        Some(&CloseReason::ProcessExited(ProcessExit::Signal(SIGKILL)))
    );
    assert_eq!(conn.exit_status(), Some(ProcessExit::Signal(SIGKILL)));
    assert_reaped_soon(pid).await;
    // Later requests fail at once with the same cause.
    assert_eq!(
        conn.request(acp::INITIALIZE, json!({}), deadline()).await,
        Err(RpcFailure::ProcessExited {
            status: ProcessExit::Signal(SIGKILL)
        })
    );
    assert_eq!(prompts_received(&read_log(&log)), ["long task"]);
    let _ = std::fs::remove_file(log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_exiting_mid_prompt_fails_the_prompt_with_its_exit_code() {
    let (conn, events) = spawn(&test_agent(&[
        "--chunks",
        "10",
        "--exit-after-chunks",
        "4",
        "--exit-code",
        "7",
    ]));
    let drained = drain(events);
    initialize(&conn).await;
    let session_id = new_session(&conn).await;
    let failure = conn
        .request(
            acp::SESSION_PROMPT,
            acp::prompt_params(&session_id, "x"),
            deadline(),
        )
        .await
        .expect_err("the agent exits mid-prompt");
    assert_eq!(
        failure,
        RpcFailure::ProcessExited {
            status: ProcessExit::Code(7)
        }
    );
    let events = finish(drained).await;
    // Everything it wrote before dying was delivered.
    assert_eq!(
        updates(&events),
        ["chunk 0", "chunk 1", "chunk 2", "chunk 3"]
    );
    assert_eq!(
        closed_reason(&events),
        Some(&CloseReason::ProcessExited(ProcessExit::Code(7)))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_kill_mid_prompt_fails_the_prompt_with_killed() {
    let (conn, mut events) = spawn(&test_agent(&[
        "--chunks",
        "100000",
        "--chunk-delay-ms",
        "1",
    ]));
    let pid = conn.pid().unwrap();
    let prompting = prompt_in_flight(&conn, &mut events, 3).await;
    let drained = drain(events);
    assert_eq!(
        conn.kill_and_reap(deadline()).await,
        Some(ProcessExit::Signal(SIGKILL))
    );
    assert_eq!(prompting.await.unwrap(), Err(RpcFailure::Killed));
    assert_eq!(
        closed_reason(&finish(drained).await),
        Some(&CloseReason::Killed(Some(ProcessExit::Signal(SIGKILL))))
    );
    assert_reaped_soon(pid).await;
    // Killing twice is harmless.
    conn.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_a_held_prompt_with_cancelled() {
    let log = log_path("cancel");
    let (conn, mut events) = spawn(&test_agent(&[
        "--chunks",
        "2",
        "--prompt-mode",
        "hold",
        "--log",
        log.to_str().unwrap(),
    ]));
    let prompting = prompt_in_flight(&conn, &mut events, 2).await;
    let drained = drain(events);
    conn.notify(
        acp::SESSION_CANCEL,
        acp::cancel_params("test-session-1"),
        deadline(),
    )
    .await
    .expect("cancel written");
    let answer = prompting
        .await
        .unwrap()
        .expect("a cancelled prompt answers");
    assert_eq!(answer, json!({"stopReason": "cancelled"}));
    conn.kill_and_reap(deadline()).await;
    finish(drained).await;
    let log_entries = read_log(&log);
    assert!(log_entries
        .iter()
        .any(|entry| entry["method"] == acp::SESSION_CANCEL));
    let _ = std::fs::remove_file(log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_prompt_times_out_and_the_agent_is_killed_and_reaped() {
    let (conn, events) = spawn(&test_agent(&["--chunks", "1", "--prompt-mode", "hang"]));
    let pid = conn.pid().unwrap();
    let drained = drain(events);
    initialize(&conn).await;
    let session_id = new_session(&conn).await;
    let failure = conn
        .request(
            acp::SESSION_PROMPT,
            acp::prompt_params(&session_id, "x"),
            Instant::now() + Duration::from_millis(300),
        )
        .await
        .expect_err("a hung agent never answers");
    assert_eq!(failure, RpcFailure::TimedOut);
    assert_eq!(
        conn.kill_and_reap(deadline()).await,
        Some(ProcessExit::Signal(SIGKILL))
    );
    assert_reaped_soon(pid).await;
    assert_eq!(updates(&finish(drained).await), ["chunk 0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_answer_fails_the_request_at_once_with_garbage() {
    let (conn, events) = spawn(&test_agent(&[
        "--misbehave",
        "garbage",
        "--misbehave-on",
        "session/new",
    ]));
    let pid = conn.pid().unwrap();
    let drained = drain(events);
    initialize(&conn).await;
    let started = Instant::now();
    let failure = conn
        .request(
            acp::SESSION_NEW,
            acp::new_session_params("/tmp"),
            deadline(),
        )
        .await
        .expect_err("garbage is no answer");
    assert!(
        started.elapsed() < PROMPTLY,
        "no need to wait for the deadline"
    );
    let RpcFailure::Garbage { line } = &failure else {
        panic!("expected Garbage, got {failure:?}");
    };
    assert_eq!(line, "this is not json-rpc {");
    // The connection is closed for good; the process is not ours to judge: still alive.
    assert_eq!(
        conn.request(acp::INITIALIZE, json!({}), deadline()).await,
        Err(failure.clone())
    );
    assert_eq!(conn.exit_status(), None);
    assert_eq!(
        conn.kill_and_reap(deadline()).await,
        Some(ProcessExit::Signal(SIGKILL))
    );
    assert_reaped_soon(pid).await;
    let events = finish(drained).await;
    assert!(matches!(
        anomalies(&events)[..],
        [Anomaly::Garbage { sample, .. }] if sample == "this is not json-rpc {"
    ));
    assert_eq!(
        closed_reason(&events),
        Some(&CloseReason::Garbage("this is not json-rpc {".into()))
    );
    assert_eq!(conn.stats().garbage_lines, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_within_budget_is_reported_and_skipped() {
    let config = ConnectionConfig {
        garbage_budget: 5,
        ..ConnectionConfig::default()
    };
    let (conn, events) = spawn_with(
        &test_agent(&["--misbehave", "garbage", "--misbehave-on", "session/new"]),
        config,
    );
    let drained = drain(events);
    initialize(&conn).await;
    let failure = conn
        .request(
            acp::SESSION_NEW,
            acp::new_session_params("/tmp"),
            Instant::now() + Duration::from_millis(300),
        )
        .await
        .expect_err("no answer came");
    assert_eq!(failure, RpcFailure::TimedOut);
    // Still open, still usable.
    assert!(conn.close_reason().is_none());
    initialize(&conn).await;
    conn.kill_and_reap(deadline()).await;
    let events = finish(drained).await;
    assert_eq!(anomalies(&events).len(), 1);
    assert_eq!(conn.stats().garbage_lines, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_stdout_fails_the_request_with_transport_closed_while_the_process_lives() {
    let (conn, events) = spawn(&test_agent(&[
        "--misbehave",
        "close-stdout",
        "--misbehave-on",
        "session/new",
    ]));
    let pid = conn.pid().unwrap();
    let drained = drain(events);
    initialize(&conn).await;
    let started = Instant::now();
    let failure = conn
        .request(
            acp::SESSION_NEW,
            acp::new_session_params("/tmp"),
            deadline(),
        )
        .await
        .expect_err("stdout is closed");
    assert!(started.elapsed() < PROMPTLY);
    assert_eq!(failure, RpcFailure::TransportClosed);
    assert_eq!(
        conn.exit_status(),
        None,
        "the agent process is still running"
    );
    assert!(!process_gone(pid));
    assert_eq!(
        closed_reason(&finish(drained).await),
        Some(&CloseReason::StdoutClosed)
    );
    assert_eq!(
        conn.kill_and_reap(deadline()).await,
        Some(ProcessExit::Signal(SIGKILL))
    );
    assert_reaped_soon(pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_with_unknown_ids_time_out_and_are_reported() {
    let (conn, events) = spawn(&test_agent(&[
        "--misbehave",
        "unknown-ids",
        "--misbehave-on",
        "session/new",
    ]));
    let drained = drain(events);
    initialize(&conn).await;
    let failure = conn
        .request(
            acp::SESSION_NEW,
            acp::new_session_params("/tmp"),
            Instant::now() + Duration::from_millis(300),
        )
        .await
        .expect_err("the answer carries someone else's id");
    assert_eq!(failure, RpcFailure::TimedOut);
    assert!(conn.close_reason().is_none());
    initialize(&conn).await;
    conn.kill_and_reap(deadline()).await;
    let events = finish(drained).await;
    assert_eq!(
        anomalies(&events),
        [&Anomaly::UnknownResponseId {
            id: RequestId::Number(2 + 1_000_000),
            was_error: false
        }]
    );
    assert_eq!(conn.stats().unknown_response_ids, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_that_never_answers_times_out_and_is_reaped() {
    let (conn, events) = spawn(&test_agent(&["--misbehave", "never-answer"]));
    let pid = conn.pid().unwrap();
    let drained = drain(events);
    let started = Instant::now();
    let failure = conn
        .request(
            acp::INITIALIZE,
            acp::initialize_params("t", "0"),
            Instant::now() + Duration::from_millis(300),
        )
        .await
        .expect_err("silence");
    assert_eq!(failure, RpcFailure::TimedOut);
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(started.elapsed() < PROMPTLY);
    assert_eq!(
        conn.kill_and_reap(deadline()).await,
        Some(ProcessExit::Signal(SIGKILL))
    );
    assert_reaped_soon(pid).await;
    finish(drained).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_exiting_instead_of_answering_fails_with_process_exited() {
    let (conn, events) = spawn(&test_agent(&[
        "--misbehave",
        "exit",
        "--misbehave-on",
        "session/load",
        "--exit-code",
        "5",
    ]));
    let drained = drain(events);
    initialize(&conn).await;
    let failure = conn
        .request(
            acp::SESSION_LOAD,
            acp::load_session_params("s", "/tmp"),
            deadline(),
        )
        .await
        .expect_err("the agent exits");
    assert_eq!(
        failure,
        RpcFailure::ProcessExited {
            status: ProcessExit::Code(5)
        }
    );
    finish(drained).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_connection_kills_and_reaps_the_agent() {
    let (conn, events) = spawn(&test_agent(&[]));
    let pid = conn.pid().unwrap();
    initialize(&conn).await;
    assert!(!process_gone(pid));
    drop(conn);
    drop(events);
    assert_reaped_soon(pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_connection_with_a_full_unread_queue_leaks_nothing() {
    let config = ConnectionConfig {
        event_capacity: 1,
        ..ConnectionConfig::default()
    };
    let (conn, events) = spawn_with(&test_agent(&["--chunks", "5000"]), config);
    let pid = conn.pid().unwrap();
    initialize(&conn).await;
    let session_id = new_session(&conn).await;
    // Nobody reads the events: the prompt cannot finish (backpressure), so it times out.
    let failure = conn
        .request(
            acp::SESSION_PROMPT,
            acp::prompt_params(&session_id, "x"),
            Instant::now() + Duration::from_millis(300),
        )
        .await;
    assert_eq!(failure, Err(RpcFailure::TimedOut));
    drop(conn);
    assert_reaped_soon(pid).await;
    drop(events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_program_is_a_spawn_error() {
    let result = AgentConnection::spawn(
        &AgentCommand::new("/nonexistent/palisade-agent"),
        ConnectionConfig::default(),
    );
    assert!(matches!(result, Err(SpawnError::Spawn(_))));
}

/// Shapes the test agent never writes, from a shell script: a request from the agent
/// (answered through `respond`), a response without a trailing newline, and a string id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_requests_are_delivered_and_answered() {
    let reply_file = log_path("sh-reply");
    let script = format!(
        r#"printf '%s\n' '{{"jsonrpc":"2.0","id":"p1","method":"session/request_permission","params":{{"x":1}}}}'
read -r reply
printf '%s\n' "$reply" > '{}'
printf '%s' '{{"jsonrpc":"2.0","id":"nobody","result":{{}}}}'
"#,
        reply_file.display()
    );
    let config = ConnectionConfig {
        stderr: StderrMode::Null,
        ..ConnectionConfig::default()
    };
    let (conn, mut events) = spawn_with(&AgentCommand::new("sh").args(["-c", &script]), config);
    let Some(AgentEvent::Request { id, method, params }) = events.recv().await else {
        panic!("expected the agent's request first");
    };
    assert_eq!(id, RequestId::Str("p1".into()));
    assert_eq!(method, "session/request_permission");
    assert_eq!(params.parse::<Value>().unwrap(), json!({"x": 1}));
    conn.respond(&id, Ok(json!({"outcome": "allow"})), deadline())
        .await
        .expect("response written");
    let events = finish(drain(events)).await;
    assert_eq!(
        anomalies(&events),
        [&Anomaly::UnknownResponseId {
            id: RequestId::Str("nobody".into()),
            was_error: false
        }]
    );
    assert_eq!(
        closed_reason(&events),
        Some(&CloseReason::ProcessExited(ProcessExit::Code(0)))
    );
    let reply: Value =
        serde_json::from_str(std::fs::read_to_string(&reply_file).unwrap().trim()).unwrap();
    assert_eq!(
        reply,
        json!({"jsonrpc": "2.0", "id": "p1", "result": {"outcome": "allow"}})
    );
    let _ = std::fs::remove_file(reply_file);
}

/// npx-style wrappers: the process we spawned exits, but a grandchild still holds its
/// stdout open. The exit must still be reported, within the drain grace, not at the
/// request's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_is_reported_even_when_a_grandchild_holds_stdout_open() {
    let config = ConnectionConfig {
        stderr: StderrMode::Null,
        ..ConnectionConfig::default()
    };
    let (conn, events) = spawn_with(
        &AgentCommand::new("sh").args(["-c", "sleep 3 & read -r line; exit 4"]),
        config,
    );
    let drained = drain(events);
    let started = Instant::now();
    let failure = conn
        .request(acp::INITIALIZE, json!({}), deadline())
        .await
        .expect_err("the agent exits without answering");
    assert!(started.elapsed() < PROMPTLY);
    assert_eq!(
        failure,
        RpcFailure::ProcessExited {
            status: ProcessExit::Code(4)
        }
    );
    assert_eq!(
        closed_reason(&finish(drained).await),
        Some(&CloseReason::ProcessExited(ProcessExit::Code(4)))
    );
    // A notification to a closed connection fails too, with the same cause.
    assert_eq!(
        conn.notify(acp::SESSION_CANCEL, acp::cancel_params("s"), deadline())
            .await,
        Err(failure)
    );
}

/// A line over the bound is skipped and reported; the stream resynchronises at the next
/// newline and the answer behind it still arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_line_is_skipped_and_the_next_answer_arrives() {
    let config = ConnectionConfig {
        stderr: StderrMode::Null,
        max_line_bytes: 100,
        garbage_budget: 1,
        ..ConnectionConfig::default()
    };
    let script = r#"read -r line
printf '%0300d\n' 0
printf '%s\n' '{"jsonrpc":"2.0","id":1,"result":{"ok":true}}'
read -r line"#;
    let (conn, events) = spawn_with(&AgentCommand::new("sh").args(["-c", script]), config);
    let drained = drain(events);
    let answer = conn
        .request(acp::INITIALIZE, json!({}), deadline())
        .await
        .expect("the answer behind the oversized line");
    assert_eq!(answer, json!({"ok": true}));
    assert_eq!(conn.stats().oversized_lines, 1);
    conn.kill_and_reap(deadline()).await;
    let events = finish(drained).await;
    assert_eq!(anomalies(&events), [&Anomaly::OversizedLine { bytes: 300 }]);
}

/// A caller may drop a request future (its own `select!` or timeout). The id must not
/// stay pending, and the answer that still comes is late, not unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_request_frees_its_slot_and_its_answer_is_late() {
    let (conn, events) = spawn(&test_agent(&["--load-delay-ms", "300"]));
    let drained = drain(events);
    initialize(&conn).await;
    let abandoned = tokio::time::timeout(
        Duration::from_millis(50),
        conn.request(
            acp::SESSION_LOAD,
            acp::load_session_params("s", "/tmp"),
            deadline(),
        ),
    )
    .await;
    assert!(abandoned.is_err(), "the caller gave up first");
    let until = Instant::now() + ANSWER_WITHIN;
    while conn.stats().late_responses == 0 {
        assert!(Instant::now() < until, "late answer never reported");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(conn.stats().unknown_response_ids, 0);
    conn.kill_and_reap(deadline()).await;
    assert_eq!(
        anomalies(&finish(drained).await),
        [&Anomaly::LateResponse { id: 2 }]
    );
}
