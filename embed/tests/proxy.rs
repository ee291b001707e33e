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
