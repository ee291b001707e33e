//! The shipped `palisade-proxy` driven by ACP clients no one here wrote (issue 27, item 6).
//!
//! - **The TypeScript SDK's `ClientSideConnection`**, `@agentclientprotocol/sdk` 0.12.0
//!   from npm, under node: `clients/driver.mjs`.
//! - **The Python SDK's `acp.ClientSideConnection`**, `agent-client-protocol` 0.12.1 from
//!   PyPI, in a venv: `clients/driver.py`.
//!
//! Both are installed into `target/interop/` on first use and reused after (the helpers of
//! `common/registry.rs`, shared with `interop.rs`). Each driver is a thin script the test
//! writes into a scratch directory: it starts the proxy as its child, hands every command
//! of the test (a JSON line on its stdin: spawn, initialize, new, load, prompt, close) to
//! the SDK, and reports on its stdout what the SDK handed the client: every
//! `session/update`, every `session/request_permission` (answered by selecting the
//! `allow_once` option), every extension notification, every answer, the proxy's exit.
//!
//! In front of `palisade-test-agent` (6 chunks 150 ms apart, each stamped with the wall
//! clock when the agent wrote it, and a permission request in the middle of each turn),
//! with `--state` in the scratch directory, each client, in this order:
//!
//! a. runs a turn: the permission request is answered by the client, the turn ends
//!    `end_turn`, and the chunks reached the client once each, in order (indices 0..6,
//!    stamps strictly increasing), the permission request between chunks 2 and 3;
//! b. runs a turn whose agent process (found under the proxy's pid) is SIGKILLed after
//!    its second chunk: the turn still ends `end_turn`, and what the client got is the
//!    killed process's chunks then the replacement's, each once (no text twice, stamps
//!    strictly increasing), no conversation replaced, and the history the replacement
//!    replayed when it loaded the conversation is not forwarded into the turn;
//! d. holds a permission request (a user who has not decided) while its agent process is
//!    SIGKILLed, then answers it: the answer reaches no one (the replacement, by its own
//!    `--log`, got one answer: to its own request), the replacement asks again, the turn
//!    ends `end_turn` with the chunks as in b;
//! e. sends `session/cancel` while a permission request is open and answers it
//!    `cancelled`: the prompt gets one answer, `cancelled`, its chunks once in order;
//! c. SIGKILLs the proxy between turns: no agent process of the dead proxy survives
//!    (its watchdog), a new proxy on the same state file answers `initialize` and
//!    `session/load` of the same proxy session id, the history the agent replays on that
//!    load (2 updates) reaches the client once, before the answer, and the next turn
//!    completes as in a;
//! f. SIGKILLs that proxy in the middle of a turn: no agent process survives; a new proxy
//!    on the same state starts (it once exited 2, unable to read back the turn's content
//!    blocks) and recovers the interrupted turn on its own; the client initializes and
//!    loads at once (a load racing with that recovery was once never answered: found by
//!    the proxy world, `found/proxy-crash-restart-332.json`), the next prompt completes
//!    once the recovered turn ended (until then it is refused, busy, and sent again), and
//!    no chunk reaches the client twice from the new proxy. Closing the proxy's stdin
//!    then ends it with 0 and leaves no agent process behind.
//!
//! And in front of the TS SDK's example agent (`dist/examples/agent.js`, which asks for a
//! permission on every turn and cannot load a session): a turn, its permission answered,
//! `end_turn`; then a turn whose agent is SIGKILLed after its first update: the
//! conversation is replaced (`_palisade/conversation_replaced`, once), the turn re-run and
//! ended `end_turn`, and the client got the killed process's updates then the whole turn
//! of the replacement, each once.
//!
//! Judged only from what the client received and which processes ran. When node, npm or
//! python3 is missing, or a registry cannot be reached and the package is not cached,
//! that client's checks are skipped with a note on stderr; never a failure for that alone.
//! `PALISADE_INTEROP=skip` skips them all.
//!
//! And through the Rust SDK's conductor, `agent-client-protocol-conductor` 5.0.0 from
//! crates.io, with the proxy as its chain's agent (client → conductor → proxy → test
//! agent): a and b, and no process of the chain left after the conductor's exit. Its
//! binary is built once by `cargo install --locked` into `~/.cache/palisade/interop/cargo/` (its own
//! dependency tree, nothing added to the workspace's build; about 9 minutes on a shared
//! two-core machine the first time, cached for the machine after, clean clones included:
//! `common::registry::tool_cache_dir`).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::registry::{
    self, assert_no_tree_left, cargo_install, descendants, node_available, npm_install,
    pip_install, process_name, scratch, sigkill, tree_processes, Skip,
};

const TS_SDK_PACKAGE: &str = "@agentclientprotocol/sdk";
const TS_SDK_VERSION: &str = "0.12.0";
const PY_SDK_PACKAGE: &str = "agent-client-protocol";
const PY_SDK_VERSION: &str = "0.12.1";

const CONDUCTOR_CRATE: &str = "agent-client-protocol-conductor";
const CONDUCTOR_VERSION: &str = "5.0.0";

const TS_DRIVER: &str = include_str!("clients/driver.mjs");
const PY_DRIVER: &str = include_str!("clients/driver.py");

/// Generous waits for one report: the machine is shared and small.
const WITHIN: Duration = Duration::from_secs(60);
/// Chunks per turn of the test agent, and the pause before each.
const CHUNKS: u64 = 6;
/// History updates the test agent replays on every successful `session/load`.
const HISTORY: usize = 2;
const CHUNK_DELAY_MS: u64 = 150;

/// The clients run one after another: they share the machine's two cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn note(message: &str) {
    registry::note(&format!("real_clients: {message}"));
}

/// A client program (node or python running a driver) and the proxy it runs.
struct Driver {
    name: String,
    child: Child,
    stdin: ChildStdin,
    reports: mpsc::Receiver<Value>,
    /// Every report so far, in the order the driver wrote them.
    seen: Vec<Value>,
    tag: u64,
}

impl Driver {
    fn start(name: &str, program: &Path, args: &[OsString]) -> Driver {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot run {}: {e}", program.display()));
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (send, reports) = mpsc::channel();
        let label = name.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let report = serde_json::from_str::<Value>(&line)
                    .unwrap_or_else(|_| json!({"kind": "not_json", "line": line, "driver": label}));
                if send.send(report).is_err() {
                    return;
                }
            }
        });
        Driver {
            name: name.to_owned(),
            child,
            stdin,
            reports,
            seen: Vec::new(),
            tag: 0,
        }
    }

    /// Sends a command; its tag.
    fn send(&mut self, mut command: Value) -> u64 {
        self.tag += 1;
        command["tag"] = json!(self.tag);
        writeln!(self.stdin, "{command}").expect("the driver reads its stdin");
        self.stdin.flush().expect("the driver reads its stdin");
        self.tag
    }

    /// Reads reports until `pick` chooses one (every report is kept in `seen`).
    fn until(&mut self, what: &str, mut pick: impl FnMut(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WITHIN;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let report = self.reports.recv_timeout(left).unwrap_or_else(|e| {
                panic!(
                    "{}: no {what} within {WITHIN:?} ({e}); reports: {:#?}",
                    self.name, self.seen
                )
            });
            assert_ne!(report["kind"], "not_json", "{}: {report}", self.name);
            assert_ne!(report["kind"], "unhandled", "{}: {report}", self.name);
            self.seen.push(report.clone());
            if pick(&report) {
                return report;
            }
        }
    }

    /// Waits for the answer to the command tagged `tag`.
    fn answer(&mut self, tag: u64) -> Result<Value, Value> {
        let answer = self.until(&format!("answer {tag}"), |r| {
            r["kind"] == "answer" && r["tag"] == tag
        });
        match answer.get("error") {
            Some(error) => Err(error.clone()),
            None => Ok(answer["result"].clone()),
        }
    }

    fn call(&mut self, command: Value) -> Value {
        let op = command["op"].clone();
        let tag = self.send(command);
        self.answer(tag).unwrap_or_else(|e| {
            panic!("{}: {op} failed: {e}; reports: {:#?}", self.name, self.seen)
        })
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The driver's death closes the proxy's stdin: the proxy stops its agents and exits.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The reports of one turn: from `from` in `seen` to the prompt's answer.
struct Turn {
    /// `(stamp µs, index)` of every chunk of the session, in the order received.
    chunks: Vec<(u64, u64)>,
    /// Every update's text, to find one received twice.
    texts: Vec<String>,
    /// The history updates among them (`history <i>`, what a `session/load` replays).
    history: Vec<String>,
    /// Positions among the chunks at which a permission request arrived.
    permissions: Vec<usize>,
    stop_reason: Value,
}

fn turn_seen(driver: &Driver, from: usize, session: &str, answer: &Value) -> Turn {
    let mut turn = Turn {
        chunks: Vec::new(),
        texts: Vec::new(),
        history: Vec::new(),
        permissions: Vec::new(),
        stop_reason: answer["stopReason"].clone(),
    };
    for report in &driver.seen[from..] {
        if report["sessionId"] != session {
            continue;
        }
        match report["kind"].as_str() {
            Some("update") => {
                let text = report["update"]["content"]["text"]
                    .as_str()
                    .unwrap_or_default();
                turn.texts.push(text.to_owned());
                if text.starts_with("history ") {
                    turn.history.push(text.to_owned());
                } else if report["update"]["sessionUpdate"] == "agent_message_chunk" {
                    turn.chunks.push(stamped_chunk(text).unwrap_or_else(|| {
                        panic!("{}: not a stamped chunk: {report}", driver.name)
                    }));
                }
            }
            Some("permission") => {
                assert_eq!(report["selected"], "allow", "{}: {report}", driver.name);
                turn.permissions.push(turn.chunks.len());
            }
            _ => {}
        }
    }
    turn
}

/// `@<µs> chunk <i>`: the stamp and the index.
fn stamped_chunk(text: &str) -> Option<(u64, u64)> {
    let (stamp, rest) = text.strip_prefix('@')?.split_once(' ')?;
    let index = rest.strip_prefix("chunk ")?;
    Some((stamp.parse().ok()?, index.parse().ok()?))
}

/// Every chunk once (no text twice, stamps strictly increasing: the agents' own order).
fn assert_once_in_order(name: &str, what: &str, turn: &Turn) {
    let mut texts = turn.texts.clone();
    texts.sort();
    texts.dedup();
    assert_eq!(
        texts.len(),
        turn.texts.len(),
        "{name} {what}: an update twice: {:?}",
        turn.texts
    );
    assert!(
        turn.chunks.windows(2).all(|w| w[0].0 < w[1].0),
        "{name} {what}: chunks out of order: {:?}",
        turn.chunks
    );
    assert_eq!(turn.stop_reason, "end_turn", "{name} {what}");
    assert_eq!(
        turn.history,
        Vec::<String>::new(),
        "{name} {what}: history replayed into a turn"
    );
}

/// Turn a: one attempt, chunks 0..6 once each, the permission between chunks 2 and 3.
fn assert_whole_turn(name: &str, what: &str, turn: &Turn) {
    assert_once_in_order(name, what, turn);
    let indices: Vec<u64> = turn.chunks.iter().map(|c| c.1).collect();
    assert_eq!(
        indices,
        (0..CHUNKS).collect::<Vec<_>>(),
        "{name} {what}: chunks"
    );
    assert_eq!(
        turn.permissions,
        [3],
        "{name} {what}: the permission request among the chunks"
    );
}

/// A turn whose agent was killed after at least `min` chunks: every chunk once in order,
/// the killed process's chunks `0..k` then the replacement's `0..CHUNKS`; `k`.
fn assert_recovered(name: &str, what: &str, turn: &Turn, min: usize) -> usize {
    assert_once_in_order(name, what, turn);
    let indices: Vec<u64> = turn.chunks.iter().map(|c| c.1).collect();
    let restart = indices
        .iter()
        .skip(1)
        .position(|&i| i == 0)
        .map(|p| p + 1)
        .unwrap_or_else(|| panic!("{name} {what}: not re-run: {indices:?}"));
    assert!(restart >= min, "{name} {what}: {indices:?}");
    assert_eq!(
        indices,
        (0..restart as u64).chain(0..CHUNKS).collect::<Vec<_>>(),
        "{name} {what}: the killed process's chunks, then the replacement's"
    );
    restart
}

/// The answers (lines without a method) the agent process started last received, from the
/// test agent's `--log` (each process appends; the runtimes of one session do not overlap).
fn answers_since_last_start(log: &Path) -> Vec<Value> {
    let lines: Vec<Value> = std::fs::read_to_string(log)
        .expect("the agent's log")
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let last = lines
        .iter()
        .rposition(|l| l["event"] == "start" && l["role"] == "agent")
        .expect("an agent started");
    lines[last..]
        .iter()
        .filter(|l| l.get("method").is_some_and(Value::is_null) && !l["id"].is_null())
        .cloned()
        .collect()
}

/// The live agent processes the proxy `proxy` started (by its tree marker).
fn agents_of(proxy: u32) -> Vec<u32> {
    tree_processes(proxy)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

/// A client on an SDK: how to run its driver with a proxy command line.
struct RealClient {
    name: String,
    program: PathBuf,
    /// The driver's arguments before the proxy's stderr file and command line.
    args: Vec<OsString>,
}

impl RealClient {
    fn driver(&self, stderr: &Path, proxy: &[OsString]) -> Driver {
        let mut args = self.args.clone();
        args.push(stderr.into());
        args.extend(proxy.iter().cloned());
        Driver::start(&self.name, &self.program, &args)
    }
}

fn prompt(driver: &mut Driver, session: &str, text: &str) -> (usize, u64) {
    let from = driver.seen.len();
    let tag = driver.send(json!({"op": "prompt", "sessionId": session, "text": text}));
    (from, tag)
}

/// A turn as a: the permission answered, `end_turn`, chunks 0..6 once in order.
fn whole_turn(driver: &mut Driver, session: &str, what: &str) {
    let (from, tag) = prompt(driver, session, &format!("The {what}."));
    let answer = driver
        .answer(tag)
        .unwrap_or_else(|e| panic!("{}: {what}: {e}", driver.name));
    let turn = turn_seen(driver, from, session, &answer);
    assert_whole_turn(&driver.name, what, &turn);
}

/// b: SIGKILL of the agent process (the one the proxy `proxy` started) after its second
/// chunk; the turn completes on a replacement, every chunk once. What happened.
fn kill_mid_turn(driver: &mut Driver, session: &str, proxy: u32, what: &str) -> String {
    let name = driver.name.clone();
    let (from, tag) = prompt(driver, session, &format!("The turn {what}."));
    driver.until("the second chunk", |r| {
        r["kind"] == "update"
            && r["update"]["content"]["text"]
                .as_str()
                .and_then(stamped_chunk)
                .is_some_and(|(_, i)| i >= 1)
    });
    let killed = agents_of(proxy);
    assert_eq!(
        killed.len(),
        1,
        "{name}: the agent processes under the proxy"
    );
    sigkill(killed[0]);
    let answer = driver
        .answer(tag)
        .unwrap_or_else(|e| panic!("{name}: turn {what}: {e}"));
    let turn = turn_seen(driver, from, session, &answer);
    let restart = assert_recovered(&name, &format!("turn {what}"), &turn, 2);
    let replacement = agents_of(proxy);
    assert!(
        replacement.len() == 1 && replacement != killed,
        "{name}: the replacement {replacement:?} (killed {killed:?})"
    );
    format!(
        "{name}: {what}. agent {} SIGKILLed after chunk {}; end_turn, the killed process's \
         chunks 0..{restart} then the replacement's 0..{CHUNKS}, each once, {} permission(s) \
         answered",
        killed[0],
        restart - 1,
        turn.permissions.len()
    )
}

/// The test agent's command line (as `--agent-cmd` takes it), logging into `dir`.
fn test_agent_cmd(dir: &Path) -> String {
    format!(
        "{} --chunks {CHUNKS} --chunk-delay-ms {CHUNK_DELAY_MS} --stamp-chunks true \
         --ask-permission true --load-replay {HISTORY} --log {}",
        palisade_testkit::shipped::binary("palisade-test-agent").display(),
        dir.join("agent.log").display()
    )
}

/// a, b, d, e and c in front of `palisade-test-agent`.
fn test_agent_checks(client: &RealClient, dir: &Path, report: &mut Vec<String>) {
    let name = client.name.as_str();
    let proxy = palisade_testkit::shipped::binary("palisade-proxy");
    let agent_cmd = test_agent_cmd(dir);
    let proxy_cmd: Vec<OsString> = vec![
        proxy.into(),
        "--agent-cmd".into(),
        agent_cmd.into(),
        "--state".into(),
        dir.join("proxy.state").into(),
        "--recovery-delays-ms".into(),
        "100,200,400".into(),
    ];
    let cwd = dir.join("work");
    let mut driver = client.driver(&dir.join("proxy.stderr"), &proxy_cmd);
    let started = Instant::now();

    let first = driver.call(json!({"op": "spawn"}))["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .expect("a pid");
    let init = driver.call(json!({"op": "initialize"}));
    assert_eq!(
        init["agentCapabilities"]["loadSession"], true,
        "{name}: {init}"
    );
    let created = driver.call(json!({"op": "new", "cwd": cwd}));
    let session = created["sessionId"].as_str().unwrap_or_default().to_owned();
    assert!(session.starts_with("pls_"), "{name}: {created}");

    // a. A turn with a permission request answered by the client.
    whole_turn(&mut driver, &session, "turn a");
    report.push(format!(
        "{name}: a. permission answered (allow), end_turn, chunks 0..{CHUNKS} once in order \
         ({:.1} s in)",
        started.elapsed().as_secs_f64()
    ));

    // b. SIGKILL of the agent process in the middle of a turn.
    let mut known: Vec<u32> = descendants(first);
    report.push(kill_mid_turn(&mut driver, &session, first, "b"));

    // d. SIGKILL of the agent while its permission request waits for the user: the
    // user's late answer goes nowhere, the replacement asks again, the turn completes.
    driver.call(json!({"op": "hold", "hold": true}));
    let (from, tag) = prompt(&mut driver, &session, "The turn with a held permission.");
    driver.until("the held permission request", |r| {
        r["kind"] == "permission" && r["held"] == true
    });
    driver.call(json!({"op": "hold", "hold": false}));
    let asking = agents_of(first);
    assert_eq!(
        asking.len(),
        1,
        "{name}: the agent processes under the proxy"
    );
    known.extend(descendants(first));
    sigkill(asking[0]);
    let released = driver.call(json!({"op": "release", "outcome": "selected"}));
    assert_eq!(released["released"], 1, "{name}");
    let answer = driver
        .answer(tag)
        .unwrap_or_else(|e| panic!("{name}: turn d: {e}"));
    let turn = turn_seen(&driver, from, &session, &answer);
    let restart = assert_recovered(name, "turn d", &turn, 3);
    assert_eq!(
        turn.permissions,
        [3, restart + 3],
        "{name}: turn d: one permission request per process, each after its chunk 2"
    );
    // Ground truth: the replacement (the agent last started) got one answer, its own.
    let answers = answers_since_last_start(&dir.join("agent.log"));
    assert_eq!(
        answers.len(),
        1,
        "{name}: turn d: the replacement got {answers:?}"
    );
    report.push(format!(
        "{name}: d. agent SIGKILLed while its permission request was held by the user; the \
         late answer went nowhere; the replacement asked again (answered); end_turn, chunks \
         0..{restart} then 0..{CHUNKS}, each once"
    ));

    // e. session/cancel while a permission request is open: the client answers it
    // `cancelled` (as the protocol asks), the turn ends `cancelled`, once.
    driver.call(json!({"op": "hold", "hold": true}));
    let (from, tag) = prompt(&mut driver, &session, "The turn the user cancels.");
    driver.until("the permission request of the cancelled turn", |r| {
        r["kind"] == "permission" && r["held"] == true
    });
    driver.call(json!({"op": "hold", "hold": false}));
    driver.call(json!({"op": "cancel", "sessionId": session}));
    let released = driver.call(json!({"op": "release", "outcome": "cancelled"}));
    assert_eq!(released["released"], 1, "{name}");
    let answer = driver
        .answer(tag)
        .unwrap_or_else(|e| panic!("{name}: turn e: {e}"));
    assert_eq!(answer["stopReason"], "cancelled", "{name}: turn e");
    let mut turn = turn_seen(&driver, from, &session, &answer);
    turn.stop_reason = json!("end_turn");
    assert_once_in_order(name, "turn e", &turn);
    let indices: Vec<u64> = turn.chunks.iter().map(|c| c.1).collect();
    assert_eq!(
        indices,
        (0..indices.len() as u64).collect::<Vec<_>>(),
        "{name}: turn e: chunks"
    );
    assert!(indices.len() >= 3, "{name}: turn e: {indices:?}");
    let prompts = driver
        .seen
        .iter()
        .filter(|r| r["kind"] == "answer" && r["tag"] == tag)
        .count();
    assert_eq!(prompts, 1, "{name}: turn e: one answer");
    report.push(format!(
        "{name}: e. session/cancel with a permission request open, answered cancelled by the \
         client: the turn ended cancelled after chunks 0..{}",
        indices.len()
    ));

    // c. SIGKILL of the proxy between turns; a new proxy on the same state.
    known.extend(descendants(first));
    sigkill(first);
    driver.until("the proxy's exit", |r| {
        r["kind"] == "exited" && r["pid"] == first
    });
    assert_no_tree_left(&format!("{name}: after the proxy's SIGKILL"), first, &known);
    let second = driver.call(json!({"op": "spawn"}))["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .expect("a pid");
    let init = driver.call(json!({"op": "initialize"}));
    assert_eq!(
        init["agentCapabilities"]["loadSession"], true,
        "{name}: {init}"
    );
    let from = driver.seen.len();
    let loaded = driver.call(json!({"op": "load", "sessionId": session, "cwd": cwd}));
    let history: Vec<&str> = driver.seen[from..]
        .iter()
        .filter(|r| r["kind"] == "update" && r["sessionId"] == session.as_str())
        .filter_map(|r| r["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(
        history,
        (0..HISTORY)
            .map(|i| format!("history {i}"))
            .collect::<Vec<_>>(),
        "{name}: the history the agent replayed, once, before the load's answer"
    );
    whole_turn(&mut driver, &session, "turn c");
    let replaced: Vec<&Value> = driver
        .seen
        .iter()
        .filter(|r| r["kind"] == "ext_notification")
        .collect();
    assert!(replaced.is_empty(), "{name}: {replaced:?}");
    report.push(format!(
        "{name}: c. proxy {first} SIGKILLed, no agent process left; proxy {second} on the \
         same state: initialize, session/load {session} → {loaded} after its {HISTORY} \
         history updates, the next turn end_turn with chunks 0..{CHUNKS} once in order"
    ));

    // f. SIGKILL of the proxy in the middle of a turn: a new proxy on the same state
    // starts (once it could not read back a turn's content blocks, and exited 2) and
    // recovers the turn.
    let (_, _dead) = prompt(&mut driver, &session, "The turn f the proxy dies in.");
    driver.until("the second chunk of turn f", |r| {
        r["kind"] == "update"
            && r["update"]["content"]["text"]
                .as_str()
                .and_then(stamped_chunk)
                .is_some_and(|(_, i)| i >= 1)
    });
    let mut known = descendants(second);
    sigkill(second);
    driver.until("the proxy's exit", |r| {
        r["kind"] == "exited" && r["pid"] == second
    });
    assert_no_tree_left(
        &format!("{name}: after the proxy's SIGKILL mid-turn"),
        second,
        &known,
    );
    let before_kill: Vec<String> = driver
        .seen
        .iter()
        .filter(|r| r["kind"] == "update")
        .map(|r| r["update"]["content"]["text"].to_string())
        .collect();
    let restarted = driver.seen.len();
    let third = driver.call(json!({"op": "spawn"}))["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .expect("a pid");
    // The new proxy recovers the interrupted turn on its own as it starts. A restored
    // session's updates are this client's only once it loads the session on this
    // connection (before, they are not written: the load tells it the conversation).
    let init = driver.call(json!({"op": "initialize"}));
    assert_eq!(
        init["agentCapabilities"]["loadSession"], true,
        "{name}: the proxy started again after a SIGKILL mid-turn: {init}"
    );
    driver.call(json!({"op": "load", "sessionId": session, "cwd": cwd}));
    // The recovered turn runs to its end under the new proxy; until then the session
    // refuses another prompt (busy), and the client tries again.
    let mut refused = 0;
    loop {
        let (from, tag) = prompt(&mut driver, &session, "The turn after f.");
        match driver.answer(tag) {
            Ok(answer) => {
                let turn = turn_seen(&driver, from, &session, &answer);
                assert_whole_turn(name, "turn after f", &turn);
                break;
            }
            Err(error) if error["code"] == -32600 && refused < 120 => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(error) => panic!("{name}: the turn after f: {error}"),
        }
    }
    // Whatever the new proxy wrote, no chunk twice.
    let mut written: Vec<String> = driver.seen[restarted..]
        .iter()
        .filter(|r| r["kind"] == "update")
        .filter(|r| {
            r["update"]["content"]["text"]
                .as_str()
                .and_then(stamped_chunk)
                .is_some()
        })
        .map(|r| r["update"]["content"]["text"].to_string())
        .collect();
    let count = written.len();
    written.sort();
    written.dedup();
    assert_eq!(
        written.len(),
        count,
        "{name}: turn f: a chunk reached the client twice from the new proxy"
    );
    let early: Vec<&String> = written.iter().filter(|t| before_kill.contains(t)).collect();
    known = descendants(third);
    known.retain(|&pid| pid != third);
    let closed = driver.call(json!({"op": "close"}));
    assert_eq!(
        closed["code"], 0,
        "{name}: the proxy's exit after stdin EOF"
    );
    assert_no_tree_left(&format!("{name}: after the proxy's exit"), third, &known);
    report.push(format!(
        "{name}: f. proxy {second} SIGKILLed mid-turn, no agent left; proxy {third} on the \
         same state started and recovered the interrupted turn on its own; initialize, \
         session/load, the next turn end_turn after {refused} busy refusal(s), no chunk \
         twice (the dead proxy's again: {early:?}); stdin closed → exit 0, no agent left \
         ({:.1} s in all)",
        started.elapsed().as_secs_f64()
    ));
}

/// A turn in front of the TS SDK's example agent: its permission answered, `end_turn`.
fn example_agent_check(client: &RealClient, dir: &Path, agent: &Path, report: &mut Vec<String>) {
    let name = client.name.as_str();
    let proxy = palisade_testkit::shipped::binary("palisade-proxy");
    let proxy_cmd: Vec<OsString> = vec![
        proxy.into(),
        "--agent-cmd".into(),
        format!("node {}", agent.display()).into(),
        "--recovery-delays-ms".into(),
        "100,200,400".into(),
    ];
    let mut driver = client.driver(&dir.join("example-proxy.stderr"), &proxy_cmd);
    let started = Instant::now();
    let pid = driver.call(json!({"op": "spawn"}))["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .expect("a pid");
    driver.call(json!({"op": "initialize"}));
    let created = driver.call(json!({"op": "new", "cwd": dir.join("work")}));
    let session = created["sessionId"].as_str().unwrap_or_default().to_owned();
    let (from, tag) = prompt(&mut driver, &session, "Hello, agent!");
    let answer = driver
        .answer(tag)
        .unwrap_or_else(|e| panic!("{name}: example agent turn: {e}"));
    assert_eq!(answer["stopReason"], "end_turn", "{name}");
    let (first, permissions) = example_turn(&driver, from, &session);
    assert_eq!(permissions, 1, "{name}: {first:#?}");
    assert!(first.len() > 1, "{name}: {first:#?}");

    // SIGKILL of the agent after its first update: it cannot load (loadSession false), so
    // the conversation is replaced, announced, and the turn re-run on the new one.
    let (from, tag) = prompt(&mut driver, &session, "Hello again!");
    driver.until("the first update of the second turn", |r| {
        r["kind"] == "update"
    });
    let killed = agents_of(pid);
    assert_eq!(
        killed.len(),
        1,
        "{name}: the agent processes under the proxy"
    );
    let mut known = descendants(pid);
    sigkill(killed[0]);
    let answer = driver
        .answer(tag)
        .unwrap_or_else(|e| panic!("{name}: example agent, killed turn: {e}"));
    assert_eq!(answer["stopReason"], "end_turn", "{name}");
    let (second, _) = example_turn(&driver, from, &session);
    let k = second.len() - first.len();
    assert!(
        k >= 1 && second[..k] == first[..k] && second[k..] == first[..],
        "{name}: the killed process's updates, then the replacement's, each once: \
         {second:#?}, a whole turn being {first:#?}"
    );
    let replaced: Vec<Value> = driver.seen[from..]
        .iter()
        .filter(|r| {
            r["kind"] == "ext_notification"
                && r["method"].as_str().map(|m| m.trim_start_matches('_'))
                    == Some("palisade/conversation_replaced")
        })
        .cloned()
        .collect();
    assert!(
        replaced.len() == 1 && replaced[0]["params"]["sessionId"] == session.as_str(),
        "{name}: the replacement announced once: {replaced:?}"
    );
    known.extend(descendants(pid));
    known.retain(|&p| p != pid);
    known.retain(|&p| p != pid);
    let closed = driver.call(json!({"op": "close"}));
    assert_eq!(closed["code"], 0, "{name}");
    assert_no_tree_left(&format!("{name}: example agent"), pid, &known);
    report.push(format!(
        "{name}: TS SDK example agent behind the proxy: a turn of {} updates, its permission \
         answered, end_turn; killed after {k} update(s) of the next turn: conversation \
         replaced (announced once: {}), the turn re-run, end_turn, updates once each \
         ({:.1} s)",
        first.len(),
        replaced[0]["params"],
        started.elapsed().as_secs_f64()
    ));
}

/// The Rust SDK's conductor in front of the proxy: client → conductor → `palisade-proxy`
/// (the chain's agent) → `palisade-test-agent`. a and b through the chain; the
/// conductor's exit leaves no agent process behind.
fn conductor_checks(client: &RealClient, dir: &Path, conductor: &Path, report: &mut Vec<String>) {
    let name = format!("{} → conductor {CONDUCTOR_VERSION}", client.name);
    let proxy = palisade_testkit::shipped::binary("palisade-proxy");
    // The conductor splits each component's command line as a POSIX shell would.
    let component = format!(
        "{} --agent-cmd '{}' --recovery-delays-ms 100,200,400",
        proxy.display(),
        test_agent_cmd(dir)
    );
    let chain: Vec<OsString> = vec![conductor.into(), "agent".into(), component.into()];
    let mut driver = client.driver(&dir.join("conductor.stderr"), &chain);
    driver.name.clone_from(&name);
    let started = Instant::now();
    let pid = driver.call(json!({"op": "spawn"}))["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .expect("a pid");
    let init = driver.call(json!({"op": "initialize"}));
    let created = driver.call(json!({"op": "new", "cwd": dir.join("work")}));
    let session = created["sessionId"].as_str().unwrap_or_default().to_owned();
    assert!(session.starts_with("pls_"), "{name}: {created}");
    let proxies: Vec<u32> = descendants(pid)
        .into_iter()
        .filter(|&p| process_name(p).as_deref() == Some("palisade-proxy"))
        .collect();
    assert_eq!(proxies.len(), 1, "{name}: the proxy under the conductor");
    whole_turn(&mut driver, &session, "turn a");
    let mut known = descendants(pid);
    report.push(format!(
        "{name}: initialize → {init}; a. permission answered, end_turn, chunks once in order"
    ));
    report.push(kill_mid_turn(&mut driver, &session, proxies[0], "b"));
    known.extend(descendants(pid));
    known.retain(|&p| p != pid);
    let closed = driver.call(json!({"op": "close"}));
    assert_no_tree_left(&format!("{name}: after its exit"), proxies[0], &known);
    report.push(format!(
        "{name}: stdin closed → exit {}, no process of the chain left ({:.1} s)",
        closed["code"],
        started.elapsed().as_secs_f64()
    ));
}

/// The updates of the session (each as its JSON text) and the permission requests, from
/// `from` in the reports.
fn example_turn(driver: &Driver, from: usize, session: &str) -> (Vec<String>, usize) {
    let turn: Vec<&Value> = driver.seen[from..]
        .iter()
        .filter(|r| r["sessionId"] == session)
        .collect();
    let updates = turn
        .iter()
        .filter(|r| r["kind"] == "update")
        .map(|r| r["update"].to_string())
        .collect();
    let permissions = turn.iter().filter(|r| r["kind"] == "permission").count();
    (updates, permissions)
}

fn ts_sdk_dir() -> Result<PathBuf, Skip> {
    if !node_available() {
        return Err(Skip("node is not installed".into()));
    }
    npm_install(TS_SDK_PACKAGE, TS_SDK_VERSION).map(|dir| {
        dir.join("node_modules")
            .join("@agentclientprotocol")
            .join("sdk")
    })
}

#[test]
fn typescript_sdk_client_through_the_proxy() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let sdk = match ts_sdk_dir() {
        Ok(sdk) => sdk,
        Err(Skip(why)) => {
            note(&format!("TS SDK client: SKIPPED: {why}"));
            return;
        }
    };
    let dir = scratch("ts-client");
    let driver = dir.join("driver.mjs");
    std::fs::write(&driver, TS_DRIVER).unwrap();
    let client = RealClient {
        name: format!("TS SDK {TS_SDK_VERSION} ClientSideConnection"),
        program: PathBuf::from("node"),
        args: vec![driver.into(), sdk.join("dist").join("acp.js").into()],
    };
    let started = Instant::now();
    let mut report = Vec::new();
    test_agent_checks(&client, &dir, &mut report);
    let example = sdk.join("dist").join("examples").join("agent.js");
    example_agent_check(&client, &dir, &example, &mut report);
    match cargo_install(CONDUCTOR_CRATE, CONDUCTOR_VERSION) {
        Ok(bin) => conductor_checks(&client, &dir, &bin.join(CONDUCTOR_CRATE), &mut report),
        Err(Skip(why)) => note(&format!(
            "TS SDK client through the conductor: SKIPPED: {why}"
        )),
    }
    let _ = std::fs::remove_dir_all(&dir);
    for line in report {
        note(&line);
    }
    note(&format!(
        "TS SDK client: checked in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
}

#[test]
fn python_sdk_client_through_the_proxy() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let python = match pip_install(PY_SDK_PACKAGE, PY_SDK_VERSION) {
        Ok(python) => python,
        Err(Skip(why)) => {
            note(&format!("Python SDK client: SKIPPED: {why}"));
            return;
        }
    };
    let dir = scratch("py-client");
    let driver = dir.join("driver.py");
    std::fs::write(&driver, PY_DRIVER).unwrap();
    let client = RealClient {
        name: format!("Python SDK {PY_SDK_VERSION} ClientSideConnection"),
        program: python,
        args: vec![driver.into()],
    };
    let started = Instant::now();
    let mut report = Vec::new();
    test_agent_checks(&client, &dir, &mut report);
    match ts_sdk_dir() {
        Ok(sdk) => {
            let example = sdk.join("dist").join("examples").join("agent.js");
            example_agent_check(&client, &dir, &example, &mut report);
        }
        Err(Skip(why)) => note(&format!("Python SDK client, example agent: SKIPPED: {why}")),
    }
    let _ = std::fs::remove_dir_all(&dir);
    for line in report {
        note(&line);
    }
    note(&format!(
        "Python SDK client: checked in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
}
