//! `palisade-test-agent` is the simulator's agent: judged from the wire, the spawned binary
//! and an in-process [`AgentModel`] with the behaviour its options name write the same
//! lines (modulo timing) for the same lines in, and exit the same way.
//!
//! Each exchange is a script of lines to send and counts of lines to read before going on
//! (so the order of what is written does not depend on the real clock). The model side
//! runs in virtual time; the binary side on real time and real pipes. The expected
//! [`Behaviour`] and [`Script`] are written out here by hand from the options' doc table,
//! so a binary whose table drifts from the model's (a hand-written answer, an option that
//! maps to another behaviour) fails here.
//!
//! Every line the binary writes is also parsed with the official schema crate's types
//! (`JsonRpcMessage` of `Response<…>`, `Notification<SessionNotification>`,
//! `Request<RequestPermissionRequest>`): an encoder check independent of palisade-embed's
//! framing.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use agent_client_protocol_schema::v1::{
    InitializeResponse, JsonRpcMessage, ListSessionsResponse, LoadSessionResponse,
    NewSessionResponse, Notification, PromptResponse, Request, RequestPermissionRequest, Response,
    SessionNotification,
};
use palisade_testkit::agent_model::{
    AgentModel, Behaviour, LoadCapability, Out, PlainChunks, PromptEnd, RequestFailure, Script,
    ScriptStore, UnknownSession,
};
use serde_json::{json, Value};

const AGENT: &str = env!("CARGO_BIN_EXE_palisade-test-agent");

/// How long the binary may take to write an expected line (a stuck agent fails, not hangs).
const LINE_WITHIN: Duration = Duration::from_secs(20);

/// One step of an exchange.
#[derive(Clone, Debug)]
enum Step {
    /// Write this line to the agent's stdin.
    Send(String),
    /// Read this many lines from its stdout before going on.
    Read(usize),
}

/// What an agent wrote, judged from the outside.
#[derive(Debug, PartialEq)]
struct Wire {
    /// Every stdout line, in order (newline included).
    lines: Vec<String>,
    /// Everything on stderr.
    stderr: String,
    /// The exit code once stdin closed.
    exit: Option<i32>,
}

/// The binary's defaults as the doc table gives them: the model's default behaviour with
/// immediate answers and no tool calls; three plain chunks; exit code 3.
fn base() -> (Behaviour, Script) {
    let behaviour = Behaviour {
        answer_delay_ms: (0, 0),
        tool_call_per_mille: 0,
        ..Behaviour::default()
    };
    let script = Script {
        load_delay_ms: Some(0),
        chunks: Some(PlainChunks {
            count: 3,
            bytes: 0,
            delay_ms: 0,
        }),
        exit_code: 3,
        ..Script::default()
    };
    (behaviour, script)
}

fn request(id: i64, method: &str, params: Value) -> Step {
    Step::Send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string())
}

fn initialize() -> Step {
    request(
        1,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
}

fn new_session(id: i64) -> Step {
    request(id, "session/new", json!({"cwd": "/tmp", "mcpServers": []}))
}

fn load(id: i64, session: &str) -> Step {
    request(
        id,
        "session/load",
        json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []}),
    )
}

fn prompt(id: i64, session: &str) -> Step {
    request(
        id,
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": "hello"}]}),
    )
}

fn cancel(session: &str) -> Step {
    Step::Send(
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}})
            .to_string(),
    )
}

/// Runs the exchange on an in-process model, in virtual time.
fn run_model(
    behaviour: &Behaviour,
    script: &Script,
    mut store: ScriptStore,
    steps: &[Step],
    seed: u64,
) -> Wire {
    let mut model =
        AgentModel::new("agent", behaviour.clone(), seed, 0).with_script(script.clone());
    let mut now = 0;
    let mut wire = Wire {
        lines: Vec::new(),
        stderr: String::new(),
        exit: None,
    };
    // Collects output due by `now` until `want` more lines came (or for ever when `None`),
    // advancing virtual time to each wake-up; false once the model exited or went idle.
    let pump = |model: &mut AgentModel, now: &mut u64, wire: &mut Wire, want: Option<usize>| {
        let mut got = 0;
        loop {
            model.on_wake(*now);
            while want.is_none_or(|w| got < w) {
                let Some((out, _)) = model.poll_out(*now) else {
                    break;
                };
                match out {
                    Out::Line(line) => {
                        wire.lines.push(line);
                        got += 1;
                    }
                    Out::Stderr(text) => wire.stderr.push_str(&text),
                    Out::Exit(code) => {
                        wire.exit = Some(code);
                        return;
                    }
                }
            }
            if want.is_some_and(|w| got >= w) {
                return;
            }
            match model.next_wake() {
                Some(at) => *now = at.max(*now),
                None => {
                    assert!(want.is_none(), "the model went idle before {want:?} lines");
                    return;
                }
            }
        }
    };
    for step in steps {
        match step {
            Step::Send(line) => model.on_line(now, line.as_bytes(), &mut store),
            Step::Read(n) => pump(&mut model, &mut now, &mut wire, Some(*n)),
        }
        if wire.exit.is_some() {
            return wire;
        }
    }
    model.on_stdin_closed(now);
    pump(&mut model, &mut now, &mut wire, None);
    wire
}

/// Runs the exchange on the spawned binary, on real time.
fn run_binary(args: &[&str], steps: &[Step]) -> Wire {
    let mut child = Command::new(AGENT)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("palisade-test-agent starts");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let (lines_tx, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match stdout.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if lines_tx.send(line).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut wire = Wire {
        lines: Vec::new(),
        stderr: String::new(),
        exit: None,
    };
    for step in steps {
        match step {
            Step::Send(line) => stdin
                .write_all(format!("{line}\n").as_bytes())
                .expect("the agent reads its stdin"),
            Step::Read(n) => {
                for k in 0..*n {
                    let line = lines.recv_timeout(LINE_WITHIN).unwrap_or_else(|_| {
                        let _ = child.kill();
                        panic!(
                            "{args:?}: line {k} of {n} never came; so far {:?}",
                            wire.lines
                        )
                    });
                    wire.lines.push(line);
                }
            }
        }
    }
    drop(stdin);
    let status = child.wait().expect("the agent exits at stdin EOF");
    reader.join().expect("the reader ends at stdout EOF");
    wire.lines.extend(lines.try_iter());
    stderr
        .read_to_string(&mut wire.stderr)
        .expect("stderr is text");
    wire.exit = status.code();
    wire
}

/// Parses every line with the official schema crate's types; `methods` maps the ids of the
/// requests sent to their methods.
fn parse_with_schema(lines: &[String], steps: &[Step]) {
    let mut methods = BTreeMap::new();
    for step in steps {
        if let Step::Send(line) = step {
            let message: Value = serde_json::from_str(line).expect("our lines are JSON");
            if let (Some(id), Some(method)) = (message.get("id"), message["method"].as_str()) {
                methods.insert(id.to_string(), method.to_owned());
            }
        }
    }
    fn check<T: serde::de::DeserializeOwned>(line: &str) -> Result<(), String> {
        serde_json::from_str::<T>(line)
            .map(|_| ())
            .map_err(|e| format!("{e}: {line}"))
    }
    for line in lines {
        let value: Value = serde_json::from_str(line).expect("every line is JSON");
        let parsed = match (value.get("id"), value["method"].as_str()) {
            (Some(id), None) => match methods.get(&id.to_string()).map(String::as_str) {
                Some("initialize") => check::<JsonRpcMessage<Response<InitializeResponse>>>(line),
                Some("session/new") => check::<JsonRpcMessage<Response<NewSessionResponse>>>(line),
                Some("session/load") => {
                    check::<JsonRpcMessage<Response<LoadSessionResponse>>>(line)
                }
                Some("session/prompt") => check::<JsonRpcMessage<Response<PromptResponse>>>(line),
                Some("session/list") => {
                    check::<JsonRpcMessage<Response<ListSessionsResponse>>>(line)
                }
                Some(_) => check::<JsonRpcMessage<Response<Value>>>(line),
                None => Err(format!("an answer to no request of ours: {line}")),
            },
            (Some(_), Some("session/request_permission")) => {
                check::<JsonRpcMessage<Request<RequestPermissionRequest>>>(line)
            }
            (None, Some("session/update")) => {
                check::<JsonRpcMessage<Notification<SessionNotification>>>(line)
            }
            _ => Err(format!("not an ACP message an agent sends: {line}")),
        };
        if let Err(error) = parsed {
            panic!("the schema crate rejects a line of palisade-test-agent: {error}");
        }
    }
}

/// One exchange: the binary with `args` against the model with the behaviour, script and
/// store the doc table says those options mean.
struct Exchange {
    args: Vec<&'static str>,
    behaviour: Behaviour,
    script: Script,
    store: ScriptStore,
    steps: Vec<Step>,
    /// The model's seed (`--seed`).
    seed: u64,
    /// Whether the schema crate must accept every line (not for a malformed capability).
    schema: bool,
}

impl Exchange {
    fn new(args: &[&'static str], steps: Vec<Step>) -> Exchange {
        let (behaviour, script) = base();
        Exchange {
            args: args.to_vec(),
            behaviour,
            script,
            store: ScriptStore::new(true, None),
            steps,
            seed: 0,
            schema: true,
        }
    }

    fn check(&self) -> Wire {
        let model = run_model(
            &self.behaviour,
            &self.script,
            self.store.clone(),
            &self.steps,
            self.seed,
        );
        let binary = run_binary(&self.args, &self.steps);
        assert_eq!(
            binary, model,
            "palisade-test-agent {:?} (left) and the model (right) disagree",
            self.args
        );
        if self.schema {
            parse_with_schema(&binary.lines, &self.steps);
        }
        binary
    }
}

#[test]
fn initialize_answers_agree_for_each_load_session_capability() {
    for (flag, capability) in [
        ("true", LoadCapability::True),
        ("false", LoadCapability::False),
        ("absent", LoadCapability::Absent),
    ] {
        let mut exchange =
            Exchange::new(&["--load-session", flag], vec![initialize(), Step::Read(1)]);
        exchange.behaviour.load_capability = capability;
        let wire = exchange.check();
        let answer: Value = serde_json::from_str(&wire.lines[0]).unwrap();
        let load = answer["result"]["agentCapabilities"].get("loadSession");
        match capability {
            LoadCapability::True => assert_eq!(load, Some(&json!(true))),
            LoadCapability::False => assert_eq!(load, Some(&json!(false))),
            LoadCapability::Absent => assert_eq!(load, None),
        }
        assert_eq!(wire.exit, Some(0), "stdin EOF ends it");
    }
    let mut malformed = Exchange::new(
        &["--load-session", "malformed"],
        vec![initialize(), Step::Read(1)],
    );
    malformed.script.malformed_load_capability = true;
    malformed.schema = false;
    malformed.check();
    let mut listing = Exchange::new(
        &["--list-sessions", "true", "--stderr-noise", "true"],
        vec![
            initialize(),
            Step::Read(1),
            new_session(2),
            Step::Read(1),
            request(3, "session/list", json!({})),
            Step::Read(1),
        ],
    );
    listing.behaviour.lists_sessions = true;
    listing.behaviour.stderr_noise = true;
    let wire = listing.check();
    assert!(!wire.stderr.is_empty());
}

#[test]
fn session_new_answers_agree() {
    let steps = vec![initialize(), Step::Read(1), new_session(2), Step::Read(1)];
    Exchange::new(&[], steps.clone()).check();
    let mut fixed = Exchange::new(&["--session-id", "fixed-7"], steps.clone());
    fixed.store = ScriptStore::new(true, Some("fixed-7".into()));
    assert!(fixed.check().lines[1].contains("fixed-7"));
    let mut updates = Exchange::new(
        &["--unprompted-updates", "true"],
        vec![initialize(), Step::Read(1), new_session(2), Step::Read(2)],
    );
    updates.behaviour.unprompted_updates = true;
    assert!(updates.check().lines[2].contains("available_commands_update"));
    for (name, failure) in [
        ("auth-required", RequestFailure::AuthRequired),
        ("internal", RequestFailure::Internal),
    ] {
        let mut failing = Exchange::new(&["--new-error", name], steps.clone());
        failing.behaviour.new_fails = Some(failure);
        assert!(failing.check().lines[1].contains("\"error\""));
    }
}

#[test]
fn loads_of_an_unknown_session_agree_under_every_real_agents_answer() {
    for unknown in UnknownSession::ALL {
        let name = json!(unknown);
        let name: &'static str = name.as_str().unwrap().to_owned().leak();
        let mut exchange = Exchange::new(
            &["--load-error", name],
            vec![
                initialize(),
                Step::Read(1),
                load(2, "old-session-42"),
                Step::Read(1),
                // A conversation it created loads (it holds it).
                new_session(3),
                Step::Read(1),
                load(4, "test-session-1"),
                Step::Read(1),
            ],
        );
        exchange.behaviour.unknown_session = unknown;
        exchange.store = ScriptStore::new(false, None);
        let wire = exchange.check();
        let answer: Value = serde_json::from_str(&wire.lines[1]).unwrap();
        match unknown.error("old-session-42") {
            Some(error) => assert_eq!(answer["error"]["code"], json!(error.code), "{name}"),
            None => assert_eq!(answer["result"], json!({}), "{name}"),
        }
    }
}

#[test]
fn a_load_with_history_agrees() {
    let mut exchange = Exchange::new(
        &["--load-replay", "3", "--load-delay-ms", "30"],
        vec![initialize(), Step::Read(1), load(2, "s-1"), Step::Read(4)],
    );
    exchange.script.load_replay = 3;
    exchange.script.load_delay_ms = Some(30);
    exchange.check();
}

/// An agent that speaks another protocol version says so in its initialize answer.
#[test]
fn an_initialize_answer_with_another_protocol_version_agrees() {
    let mut other = Exchange::new(
        &["--protocol-version", "999"],
        vec![initialize(), Step::Read(1)],
    );
    other.script.protocol_version = Some(999);
    let wire = other.check();
    assert!(
        wire.lines[0].contains(r#""protocolVersion":999"#),
        "{:?}",
        wire.lines
    );
}

#[test]
fn prompts_with_chunks_cancels_and_errors_agree() {
    let opened = || vec![initialize(), Step::Read(1), new_session(2), Step::Read(1)];
    // Chunks, padded, paced.
    let mut steps = opened();
    steps.extend([
        prompt(3, "test-session-1"),
        Step::Read(5),
        prompt(4, "test-session-1"),
        Step::Read(5),
    ]);
    let mut chunks = Exchange::new(
        &[
            "--chunks",
            "4",
            "--chunk-bytes",
            "12",
            "--chunk-delay-ms",
            "5",
        ],
        steps,
    );
    chunks.script.chunks = Some(PlainChunks {
        count: 4,
        bytes: 12,
        delay_ms: 5,
    });
    let wire = chunks.check();
    assert!(wire.lines[2].contains("chunk 0....."), "{:?}", wire.lines);
    // A held prompt ends with `cancelled` at the cancel.
    let mut steps = opened();
    steps.extend([
        prompt(3, "test-session-1"),
        Step::Read(3),
        cancel("test-session-1"),
        Step::Read(1),
    ]);
    let mut held = Exchange::new(&["--prompt-mode", "hold"], steps);
    held.script.prompt_end = PromptEnd::Hold;
    assert!(held.check().lines[5].contains("cancelled"));
    // A prompt on a session it does not hold is refused; a permission is asked mid-prompt.
    let mut steps = opened();
    steps.extend([
        prompt(3, "not-mine"),
        Step::Read(1),
        prompt(4, "test-session-1"),
        Step::Read(5),
    ]);
    let mut asking = Exchange::new(&["--ask-permission", "true", "--chunks", "3"], steps);
    asking.behaviour.asks_permission = true;
    let wire = asking.check();
    assert!(wire
        .lines
        .iter()
        .any(|l| l.contains("session/request_permission")));
    // A prompt error, each kind.
    for (name, failure) in [
        ("auth-required", RequestFailure::AuthRequired),
        ("internal", RequestFailure::Internal),
    ] {
        let mut steps = opened();
        steps.extend([prompt(3, "test-session-1"), Step::Read(1)]);
        let mut failing = Exchange::new(&["--prompt-error", name], steps);
        failing.behaviour.prompt_failure = failure;
        failing.behaviour.prompt_fail_per_mille = 1000;
        assert!(failing.check().lines[2].contains("\"error\""));
    }
}

#[test]
fn exits_agree() {
    let opened = || vec![initialize(), Step::Read(1), new_session(2), Step::Read(1)];
    // Mid-prompt, with the exit code.
    let mut steps = opened();
    steps.extend([prompt(3, "test-session-1"), Step::Read(2)]);
    let mut mid = Exchange::new(
        &[
            "--chunks",
            "5",
            "--exit-after-chunks",
            "2",
            "--exit-code",
            "7",
        ],
        steps,
    );
    mid.script.chunks = Some(PlainChunks {
        count: 5,
        bytes: 0,
        delay_ms: 0,
    });
    mid.script.exit_after_chunks = Some(2);
    mid.script.exit_code = 7;
    assert_eq!(mid.check().exit, Some(7));
    // Between turns.
    let mut steps = opened();
    steps.extend([prompt(3, "test-session-1"), Step::Read(4)]);
    let mut between = Exchange::new(&["--exit-after-prompts", "1"], steps);
    between.script.exit_after_prompts = Some(1);
    assert_eq!(between.check().exit, Some(0));
}

#[test]
fn a_hung_prompt_and_seeded_resume_flakes_agree() {
    // A hung prompt ignores the cancel; stdin EOF still ends the agent.
    let mut hung = Exchange::new(
        &["--prompt-mode", "hang", "--chunks", "1"],
        vec![
            initialize(),
            Step::Read(1),
            new_session(2),
            Step::Read(1),
            prompt(3, "test-session-1"),
            Step::Read(1),
            cancel("test-session-1"),
            prompt(4, "test-session-1"),
            Step::Read(1),
        ],
    );
    hung.script.prompt_end = PromptEnd::Hang;
    hung.script.chunks = Some(PlainChunks {
        count: 1,
        bytes: 0,
        delay_ms: 0,
    });
    let wire = hung.check();
    assert!(!wire.lines.iter().any(|l| l.contains("stopReason")));
    assert_eq!(wire.exit, Some(0));
    // Loads of sessions it has, answered "not found" per mille, drawn from the seed.
    let mut steps = vec![initialize(), Step::Read(1)];
    for k in 0..12 {
        steps.extend([load(10 + k, &format!("s-{k}")), Step::Read(1)]);
    }
    let mut flaky = Exchange::new(&["--resume-flake-per-mille", "500", "--seed", "11"], steps);
    flaky.behaviour.resume_flake_per_mille = 500;
    flaky.seed = 11;
    let wire = flaky.check();
    let flakes = wire.lines.iter().filter(|l| l.contains("-32002")).count();
    assert!(flakes > 0 && flakes < 12, "{flakes} of 12");
    // The seed is the binary's own: another seed draws other flakes.
    let other = run_model(
        &flaky.behaviour,
        &flaky.script,
        flaky.store.clone(),
        &flaky.steps,
        0,
    );
    assert_ne!(wire, other, "seeds 11 and 0 draw the same flakes");
}
