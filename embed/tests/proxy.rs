//! The shipped `palisade-proxy` end to end, with its stdout a pipe (written non-blocking on
//! the proxy's reactor) and a file (through tokio's stdout): a client opens a session and
//! prompts; every update of the turn arrives once, in order, then the answer.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

const CHUNKS: usize = 3_000;

fn proxy_command() -> Command {
    let agent = palisade_testkit::shipped::binary("palisade-test-agent");
    let proxy = palisade_testkit::shipped::binary("palisade-proxy");
    let mut command = Command::new(proxy);
    command
        .arg("--agent-cmd")
        .arg(format!(
            "{} --chunks {CHUNKS} --chunk-bytes 100",
            agent.display()
        ))
        .stdin(Stdio::piped())
        .stderr(Stdio::null());
    command
}

const PROMPT_ID: u64 = 3;

fn requests(session: Option<&str>) -> Vec<Value> {
    match session {
        None => vec![
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": []}}),
        ],
        Some(session) => vec![
            json!({"jsonrpc": "2.0", "id": PROMPT_ID, "method": "session/prompt", "params": {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}}),
        ],
    }
}

/// The chunks' texts of the updates among `lines`, up to the prompt's answer (which must
/// be there, an `end_turn`).
fn chunks_until_answer(lines: impl Iterator<Item = Value>) -> Vec<String> {
    let mut texts = Vec::new();
    for message in lines {
        if message["id"] == PROMPT_ID {
            assert_eq!(message["result"]["stopReason"], "end_turn", "{message}");
            return texts;
        }
        if message["method"] == "session/update" {
            if let Some(text) = message["params"]["update"]["content"]["text"].as_str() {
                texts.push(text.to_owned());
            }
        }
    }
    panic!("no answer to the prompt");
}

fn assert_once_in_order(texts: &[String]) {
    assert_eq!(texts.len(), CHUNKS, "every update arrives");
    for (n, text) in texts.iter().enumerate() {
        let index = text
            .strip_prefix("chunk ")
            .map(|rest| rest.trim_end_matches('.'));
        assert_eq!(
            index,
            Some(n.to_string().as_str()),
            "update {n} in its place"
        );
    }
}

#[test]
fn a_turn_streams_through_a_pipe_once_and_in_order() {
    let mut child = proxy_command()
        .stdout(Stdio::piped())
        .spawn()
        .expect("the proxy starts");
    let mut stdin = child.stdin.take().expect("piped");
    let mut lines = BufReader::new(child.stdout.take().expect("piped"))
        .lines()
        .map(|line| serde_json::from_str::<Value>(&line.expect("a line")).expect("JSON"));
    for request in requests(None) {
        writeln!(stdin, "{request}").unwrap();
    }
    let session = lines
        .by_ref()
        .find(|m| m["id"] == 2)
        .and_then(|m| m["result"]["sessionId"].as_str().map(str::to_owned))
        .expect("a session");
    for request in requests(Some(&session)) {
        writeln!(stdin, "{request}").unwrap();
    }
    let texts = chunks_until_answer(lines);
    assert_once_in_order(&texts);
    drop(stdin);
    assert!(child.wait().unwrap().success(), "exit 0 on stdin EOF");
}

#[test]
fn a_turn_streams_into_a_file_once_and_in_order() {
    let dir = std::env::temp_dir().join(format!("palisade-proxy-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("stdout");
    let mut child = proxy_command()
        .stdout(std::fs::File::create(&out).unwrap())
        .spawn()
        .expect("the proxy starts");
    let mut stdin = child.stdin.take().expect("piped");
    let read = || -> Vec<Value> {
        std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).expect("JSON"))
            .collect()
    };
    let wait_for = |id: u64| -> Vec<Value> {
        for _ in 0..600 {
            let lines = read();
            if lines.iter().any(|m| m["id"] == id) {
                return lines;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("no answer {id} within 30 s");
    };
    for request in requests(None) {
        writeln!(stdin, "{request}").unwrap();
    }
    let session = wait_for(2)
        .iter()
        .find(|m| m["id"] == 2)
        .and_then(|m| m["result"]["sessionId"].as_str().map(str::to_owned))
        .expect("a session");
    for request in requests(Some(&session)) {
        writeln!(stdin, "{request}").unwrap();
    }
    let texts = chunks_until_answer(wait_for(PROMPT_ID).into_iter());
    assert_once_in_order(&texts);
    drop(stdin);
    assert!(child.wait().unwrap().success(), "exit 0 on stdin EOF");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Issue 27, item 4, with an agent that authenticates per process (gemini-cli's kind):
/// `palisade-proxy --state` killed (SIGKILL) mid-turn and started again recovers the turn
/// on its own before the client is back, and the runtime it starts for that is initialized
/// and authenticated as the client's were (the state holds the client's `initialize` and
/// `authenticate` params; before, its `session/load` was refused `Authentication required`:
/// `reports/regressions/found/restarted-proxy-authenticates-its-runtimes.json`). Judged
/// from the agents' own log: no agent process gets a session request before
/// `authenticate`. Then the client reconnects, loads its session and its next turn
/// completes.
#[test]
fn a_proxy_killed_mid_turn_authenticates_the_runtime_that_recovers_it() {
    let dir = std::env::temp_dir().join(format!("palisade-proxy-auth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state");
    let log = dir.join("agents.log");
    let agent = palisade_testkit::shipped::binary("palisade-test-agent");
    let start = || {
        let mut child = Command::new(palisade_testkit::shipped::binary("palisade-proxy"))
            .arg("--agent-cmd")
            .arg(format!(
                "{} --auth-required true --chunks 40 --chunk-delay-ms 20 --log {}",
                agent.display(),
                log.display()
            ))
            .arg("--state")
            .arg(&state)
            .arg("--recovery-delays-ms")
            .arg("100,200")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the proxy starts");
        let stdin = child.stdin.take().expect("piped");
        let lines = BufReader::new(child.stdout.take().expect("piped"))
            .lines()
            .map(|line| serde_json::from_str::<Value>(&line.expect("a line")).expect("JSON"));
        (child, stdin, lines)
    };
    let hello = |stdin: &mut std::process::ChildStdin| {
        for request in [
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "authenticate", "params": {"methodId": "agent-token"}}),
        ] {
            writeln!(stdin, "{request}").unwrap();
        }
    };

    // The first proxy: a session, and a turn killed with it after three updates.
    let (mut first, mut stdin, mut lines) = start();
    hello(&mut stdin);
    writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": 3, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": []}})).unwrap();
    let session = lines
        .by_ref()
        .find(|m| m["id"] == 3)
        .and_then(|m| m["result"]["sessionId"].as_str().map(str::to_owned))
        .expect("a session");
    writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": 4, "method": "session/prompt", "params": {"sessionId": session, "prompt": [{"type": "text", "text": "first"}]}})).unwrap();
    let mut updates = 0;
    for message in lines.by_ref() {
        assert_ne!(
            message["id"], 4,
            "the turn ended before the kill: {message}"
        );
        if message["method"] == "session/update" {
            updates += 1;
            if updates == 3 {
                break;
            }
        }
    }
    first.kill().expect("SIGKILL");
    first.wait().unwrap();
    drop((stdin, lines));

    // The second: it recovers the turn on its own; the client is back 1.5 s later.
    let (mut second, mut stdin, mut lines) = start();
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    hello(&mut stdin);
    writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": 3, "method": "session/load", "params": {"sessionId": session, "cwd": "/tmp", "mcpServers": []}})).unwrap();
    let loaded = lines
        .by_ref()
        .find(|m| m["id"] == 3)
        .expect("an answer to the load");
    assert!(loaded.get("result").is_some(), "{loaded}");
    // A prompt while the recovered turn still runs is refused as busy: sent again.
    let mut id = 10;
    loop {
        writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {"sessionId": session, "prompt": [{"type": "text", "text": "second"}]}})).unwrap();
        let answer = lines.by_ref().find(|m| m["id"] == id).expect("an answer");
        if answer["error"]["code"] == -32600 {
            std::thread::sleep(std::time::Duration::from_millis(200));
            id += 1;
            continue;
        }
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        break;
    }
    drop(stdin);
    assert!(second.wait().unwrap().success(), "exit 0 on stdin EOF");

    // Ground truth: every agent process was authenticated before any session request.
    let entries: Vec<Value> = std::fs::read_to_string(&log)
        .expect("the agents' log")
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let mut authenticated = std::collections::BTreeSet::new();
    let mut loads = 0;
    for entry in &entries {
        let (Some(method), Some(pid)) = (entry["method"].as_str(), entry["pid"].as_u64()) else {
            continue;
        };
        if method == "authenticate" {
            authenticated.insert(pid);
        } else if method.starts_with("session/") && method != "session/cancel" {
            assert!(
                authenticated.contains(&pid),
                "process {pid} got {method} before authenticate: {entries:?}"
            );
            loads += usize::from(method == "session/load");
        }
    }
    assert!(loads >= 1, "the turn was recovered by a load: {entries:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
