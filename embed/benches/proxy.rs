#![allow(missing_docs)] // A bench binary.
//! What `palisade-proxy` costs a client, measured where the client feels it: the same
//! client drives the same agent (`palisade-test-agent`) directly and through the proxy, in
//! turns, in one run.
//!
//! - **Throughput**: one prompt whose agent streams `UPDATES` updates of ~100 bytes as fast
//!   as it can; updates per second from the prompt's request to its answer.
//! - **Added latency**: a prompt whose agent writes a stamped update every millisecond
//!   (`--stamp-chunks`: the wall clock at the write); each update's latency is the client's
//!   clock at the read minus the stamp. Median and p99, directly and through the proxy.
//!
//! Both without and with `--state` (a state file written before anything leaves the
//! proxy: group commit). Every run checks that each update arrives once and in order.
//!
//! Beside both, the floor any proxy process pays on this machine: the agent's output
//! through `cat` (`sh -c 'AGENT | cat'`), one more process that does nothing but copy the
//! bytes. What the proxy adds over that is its own work; what `cat` adds over direct is the
//! extra hop's (a wake-up of a third process, which on a shared 2-core host is where the
//! tail comes from).
//!
//! Run: `cargo bench -p palisade-embed --bench proxy` (the shipped binaries are built by
//! their own package invocation first; see `palisade_testkit::shipped`). `PROXY_BENCH_RUNS`
//! sets the pairs per figure (default 5).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

const UPDATES: usize = 100_000;
const UPDATE_BYTES: usize = 100;
const PACED_UPDATES: usize = 2_000;

fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// What one prompt showed the client.
struct Run {
    updates_per_s: f64,
    latencies_us: Vec<u64>,
}

/// Drives `command` as an ACP client: initialize, session/new, one prompt; reads every
/// update until the prompt's answer.
fn drive(command: &[OsString]) -> Run {
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the command starts");
    let mut stdin = child.stdin.take().expect("piped");
    let mut stdout = BufReader::with_capacity(1 << 16, child.stdout.take().expect("piped"));
    let mut send = |message: Value| {
        writeln!(stdin, "{message}").expect("the client writes");
        stdin.flush().expect("the client flushes");
    };
    let mut line = String::new();
    let mut read = |line: &mut String| -> Value {
        line.clear();
        assert!(stdout.read_line(line).expect("the client reads") > 0, "EOF");
        serde_json::from_str(line).expect("JSON")
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
    );
    while read(&mut line).get("id") != Some(&json!(1)) {}
    send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": []}}),
    );
    let session = loop {
        let message = read(&mut line);
        if message["id"] == 2 {
            break message["result"]["sessionId"]
                .as_str()
                .expect("a session")
                .to_owned();
        }
    };
    let start = Instant::now();
    send(
        json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}}),
    );
    let mut latencies_us = Vec::new();
    let mut next = 0usize;
    loop {
        let message = read(&mut line);
        if message["id"] == 3 {
            assert_eq!(message["result"]["stopReason"], "end_turn", "{message}");
            break;
        }
        if message["method"] != "session/update" {
            continue;
        }
        let now = micros_now();
        let text = message["params"]["update"]["content"]["text"]
            .as_str()
            .expect("a chunk's text");
        let mut words = text.split(' ');
        let stamp = words.next().and_then(|w| w.strip_prefix('@'));
        let index = words
            .nth(1)
            .and_then(|w| w.trim_end_matches('.').parse::<usize>().ok());
        assert_eq!(index, Some(next), "each update once, in order: {text:.40}");
        next += 1;
        if let Some(stamp) = stamp.and_then(|s| s.parse::<u64>().ok()) {
            latencies_us.push(now.saturating_sub(stamp));
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    Run {
        updates_per_s: next as f64 / elapsed,
        latencies_us,
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn percentile(values: &mut [u64], p: f64) -> u64 {
    values.sort_unstable();
    let at = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[at]
}

fn main() {
    let runs: usize = std::env::var("PROXY_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let agent = palisade_testkit::shipped::binary("palisade-test-agent");
    let proxy = palisade_testkit::shipped::binary("palisade-proxy");
    let state =
        std::env::temp_dir().join(format!("palisade-proxy-bench-{}.state", std::process::id()));
    let agent_args = |chunks: usize, extra: &str| {
        format!(
            "{} --chunks {chunks} --chunk-bytes {UPDATE_BYTES} --stamp-chunks true {extra}",
            agent.display()
        )
    };
    let direct = |args: &str| -> Vec<OsString> {
        shlex::split(args)
            .expect("plain words")
            .into_iter()
            .map(OsString::from)
            .collect()
    };
    let through = |args: &str, with_state: bool| -> Vec<OsString> {
        let mut command = vec![
            proxy.clone().into_os_string(),
            "--agent-cmd".into(),
            args.into(),
        ];
        if with_state {
            let _ = std::fs::remove_file(&state);
            command.push("--state".into());
            command.push(state.clone().into_os_string());
        }
        command
    };
    let through_cat = |args: &str| -> Vec<OsString> {
        vec!["sh".into(), "-c".into(), format!("{args} | cat").into()]
    };
    println!(
        "| figure | direct | through `cat` | through palisade-proxy | proxy vs direct | proxy vs `cat` |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for with_state in [false, true] {
        let label = if with_state { " (--state)" } else { "" };
        let (mut a, mut c, mut b) = (Vec::new(), Vec::new(), Vec::new());
        let fast = agent_args(UPDATES, "");
        for _ in 0..runs {
            a.push(drive(&direct(&fast)).updates_per_s);
            c.push(drive(&through_cat(&fast)).updates_per_s);
            b.push(drive(&through(&fast, with_state)).updates_per_s);
        }
        let (a, c, b) = (median(&mut a), median(&mut c), median(&mut b));
        println!(
            "| updates/s, {UPDATES} updates of {UPDATE_BYTES} B{label} | {a:.0} | {c:.0} | {b:.0} | {:.2}× | {:.2}× |",
            b / a,
            b / c
        );
        let (mut a, mut c, mut b) = (Vec::new(), Vec::new(), Vec::new());
        let paced = agent_args(PACED_UPDATES, "--chunk-delay-ms 1");
        for _ in 0..runs {
            a.extend(drive(&direct(&paced)).latencies_us);
            c.extend(drive(&through_cat(&paced)).latencies_us);
            b.extend(drive(&through(&paced, with_state)).latencies_us);
        }
        for (name, p) in [("median", 0.5), ("p99", 0.99)] {
            let (a, c, b) = (
                percentile(&mut a, p),
                percentile(&mut c, p),
                percentile(&mut b, p),
            );
            println!(
                "| latency {name} µs, an update a ms{label} | {a} | {c} | {b} | {:+} | {:+} |",
                b as i64 - a as i64,
                b as i64 - c as i64
            );
        }
    }
    let _ = std::fs::remove_file(&state);
}
