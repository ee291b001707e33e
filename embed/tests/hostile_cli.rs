//! Hostile input to the shipped binaries (issues 26 and 28): every refusal is a clear
//! message and exit 2, before anything runs and without touching the state; nothing
//! panics, nothing hangs, nothing reads without a bound.
//!
//! Each test runs the binaries as a user does (`palisade_testkit::shipped`) and waits for
//! them with a deadline, so a regression that hangs fails the test instead of hanging it.
//! The tests that hand the supervisor a file it must not read whole run it under a
//! memory cap (`ulimit -v`), so a regression fails the test instead of exhausting the
//! machine.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use palisade_wire::acp;
use serde_json::Value;

/// Generous: a loaded CI machine must not turn a correct run into a timeout.
const WITHIN: Duration = Duration::from_secs(30);

/// The memory cap (KiB of address space) for runs that must not read a file whole.
const MEMORY_CAP_KIB: u64 = 1 << 20;

/// How a run ended.
#[derive(Debug)]
struct Ran {
    /// The exit code; `None` if it was killed (by us on timeout, or by a signal).
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `command` to its end, or kills it after `within` and fails the test.
fn run_within(mut command: Command, within: Duration) -> Ran {
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    // Drain the pipes on threads: a chatty child must not block on a full pipe.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut text);
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.join().expect("stdout reader")).into_owned();
    let stderr = String::from_utf8_lossy(&err.join().expect("stderr reader")).into_owned();
    let Some(status) = status else {
        panic!("still running after {within:?} (killed)\nstdout:\n{stdout}\nstderr:\n{stderr}");
    };
    Ran {
        code: status.code(),
        stdout,
        stderr,
        took,
    }
}

fn supervise() -> Command {
    let mut command = Command::new(palisade_testkit::shipped::binary("palisade-supervise"));
    command.env_remove("RUST_LOG");
    command
}

/// `palisade-supervise` under [`MEMORY_CAP_KIB`] of address space.
fn supervise_capped() -> Command {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("ulimit -v {MEMORY_CAP_KIB} && exec \"$@\""))
        .arg("sh")
        .arg(palisade_testkit::shipped::binary("palisade-supervise"))
        .env_remove("RUST_LOG");
    command
}

/// The test agent's command line with `args`, as `--agent-cmd` takes it.
fn agent_cmd(args: &str) -> String {
    format!(
        "{} {args}",
        palisade_testkit::shipped::binary("palisade-test-agent").display()
    )
}

/// A fresh, empty directory for this test.
fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("palisade-hostile-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir
}

fn read_log(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| serde_json::from_str(line).expect("the agent logs JSON lines"))
        .collect()
}

/// The prompt texts that really reached an agent, in order.
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

/// Exit 2 with a message that says what is wrong (every word of `wanted`), on stderr after
/// the program's name.
fn assert_refused(ran: &Ran, wanted: &[&str]) {
    assert_eq!(ran.code, Some(2), "{ran:#?}");
    assert!(
        ran.stderr.contains("palisade-supervise: "),
        "no message: {ran:#?}"
    );
    for word in wanted {
        assert!(
            ran.stderr.contains(word),
            "{word:?} missing from the message: {ran:#?}"
        );
    }
    assert!(
        !ran.stderr.contains("panicked"),
        "a refusal is not a panic: {ran:#?}"
    );
}

/// Issue 28, item 6: `--prompt $'\xff'` panicked (exit 101) in `std::env::args`. A prompt
/// is sent as a JSON string, so one that is not UTF-8 cannot be sent: bad usage.
#[test]
fn a_prompt_that_is_not_utf8_is_bad_usage_not_a_panic() {
    let mut command = supervise();
    command
        .args(["--agent-cmd", &agent_cmd("--chunks 1"), "--prompt"])
        .arg(OsStr::from_bytes(b"fix \xff it"));
    let ran = run_within(command, WITHIN);
    assert_refused(&ran, &["--prompt", "UTF-8"]);
    assert!(ran.stdout.is_empty(), "nothing ran: {ran:#?}");
}

/// Issue 28, item 6: a state file name that is not UTF-8 is legal on Linux; it is used
/// as it is (and the lock and temporary files beside it are named after it).
#[test]
fn a_state_path_that_is_not_utf8_is_used_as_it_is() {
    let dir = temp_dir("state-not-utf8");
    let state = dir.join(OsStr::from_bytes(b"state-\xff.bin"));
    for round in 1..=2 {
        let mut command = supervise();
        command
            .args(["--agent-cmd", &agent_cmd("--chunks 1"), "--prompt", "one"])
            .arg("--state")
            .arg(&state);
        let ran = run_within(command, WITHIN);
        assert_eq!(ran.code, Some(0), "round {round}: {ran:#?}");
        let bytes = std::fs::read(&state).expect("the state file has the name given");
        assert_eq!(&bytes[..4], b"PLSV");
        // The second start restored the first one's state: a new epoch.
        assert!(
            ran.stdout.contains(&format!("\"attempt\":\"{round}.1\"")),
            "round {round}: {}",
            ran.stdout
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 26: `--agent-cmd` is split by `shlex` on bytes, so an agent whose path is not
/// UTF-8 runs.
#[test]
fn an_agent_command_that_is_not_utf8_runs() {
    let dir = temp_dir("agent-not-utf8");
    let link = dir.join(OsStr::from_bytes(b"agent-\xff"));
    std::os::unix::fs::symlink(
        palisade_testkit::shipped::binary("palisade-test-agent"),
        &link,
    )
    .expect("a symlink to the test agent");
    let mut line = link.into_os_string().into_vec();
    line.extend_from_slice(b" --chunks 2");
    let mut command = supervise();
    command
        .arg("--agent-cmd")
        .arg(OsString::from_vec(line))
        .args(["--prompt", "one"]);
    let ran = run_within(command, WITHIN);
    assert_eq!(ran.code, Some(0), "{ran:#?}");
    assert!(ran.stdout.contains("\"outcome\":\"Completed\""), "{ran:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 26: the watchdog and the test agent parsed `std::env::args()` too, and panicked
/// on an argument that is not UTF-8.
#[test]
fn the_other_binaries_refuse_an_argument_that_is_not_utf8_with_exit_2() {
    for (name, args) in [
        ("palisade-watchdog", &["--marker"][..]),
        ("palisade-test-agent", &["--session-id"][..]),
    ] {
        let mut command = Command::new(palisade_testkit::shipped::binary(name));
        command.args(args).arg(OsStr::from_bytes(b"x\xffy"));
        let ran = run_within(command, WITHIN);
        assert_eq!(ran.code, Some(2), "{name}: {ran:#?}");
        assert!(
            ran.stderr.contains(&format!("{name}: ")),
            "{name}: {ran:#?}"
        );
        assert!(!ran.stderr.contains("panicked"), "{name}: {ran:#?}");
    }
}

/// Issue 28, item 7: `--state` naming a FIFO hung for ever in `open`.
#[test]
fn a_state_path_naming_a_fifo_is_refused_at_once() {
    let dir = temp_dir("state-fifo");
    let fifo = dir.join("state");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let mut command = supervise();
    command
        .args(["--agent-cmd", &agent_cmd("--chunks 1"), "--prompt", "one"])
        .arg("--state")
        .arg(&fifo);
    let ran = run_within(command, WITHIN);
    assert_refused(&ran, &["not a regular file"]);
    assert!(ran.stdout.is_empty(), "nothing ran: {ran:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 28, item 7: `--state /dev/zero` was read until allocation failed. A device is
/// refused before anything is read, and nothing is created beside it.
#[test]
fn a_state_path_naming_a_device_is_refused_without_reading_it() {
    let mut command = supervise_capped();
    command.args([
        "--agent-cmd",
        &agent_cmd("--chunks 1"),
        "--prompt",
        "one",
        "--state",
        "/dev/zero",
    ]);
    let ran = run_within(command, WITHIN);
    assert_refused(&ran, &["/dev/zero", "not a regular file"]);
    assert!(!Path::new("/dev/zero.lock").exists());
    assert!(!Path::new("/dev/zero.tmp").exists());
}

/// Issue 28, item 7: a 3 GiB (sparse) state file was read whole until allocation failed.
/// Its size is checked first, against the bound a state file can legally reach.
#[test]
fn a_state_file_past_the_bound_is_refused_without_reading_it() {
    let dir = temp_dir("state-huge");
    let state = dir.join("state");
    std::fs::File::create(&state)
        .and_then(|file| file.set_len(3 << 30))
        .expect("a sparse 3 GiB file");
    let mut command = supervise_capped();
    command
        .args(["--agent-cmd", &agent_cmd("--chunks 1"), "--prompt", "one"])
        .arg("--state")
        .arg(&state);
    let ran = run_within(command, WITHIN);
    assert_refused(&ran, &["3221225472 bytes", "at most"]);
    // Nothing lost: the file is as it was.
    assert_eq!(std::fs::metadata(&state).unwrap().len(), 3 << 30);
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 28: nothing locked the state file, so a second `palisade-supervise --state s`
/// started while the first ran took over the first one's running turn (its prompt reached
/// a second agent while the first still worked on it), and the first sometimes died on
/// the other's rename. Now the second is refused, and the first runs on undisturbed.
#[test]
fn a_second_supervisor_on_the_same_state_file_is_refused_while_the_first_runs() {
    let dir = temp_dir("state-locked");
    let state = dir.join("state");
    let log = dir.join("agent.log");
    let agent = agent_cmd(&format!(
        "--chunks 20 --chunk-delay-ms 100 --log {}",
        log.display()
    ));
    let mut first = supervise();
    first
        .args(["--agent-cmd", &agent, "--prompt", "first"])
        .arg("--state")
        .arg(&state)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let first = first.spawn().expect("the first supervisor starts");
    // Until its agent has the prompt: the turn is running.
    let until = Instant::now() + WITHIN;
    while prompts_received(&read_log(&log)).is_empty() {
        assert!(Instant::now() < until, "the first turn never started");
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut second = supervise();
    second
        .args([
            "--agent-cmd",
            &agent,
            "--prompt",
            "second",
            "--session",
            "2",
        ])
        .arg("--state")
        .arg(&state);
    let ran = run_within(second, WITHIN);
    assert_refused(&ran, &["in use", "state.lock"]);

    let first = first.wait_with_output().expect("the first supervisor ends");
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(0), "{stderr}");
    // Only the first prompt ever reached an agent, once.
    assert_eq!(prompts_received(&read_log(&log)), ["first"]);
    // Once the first is gone, the state file is free again.
    let mut third = supervise();
    third
        .args(["--agent-cmd", &agent_cmd("--chunks 1"), "--prompt", "third"])
        .arg("--state")
        .arg(&state);
    let ran = run_within(third, WITHIN);
    assert_eq!(ran.code, Some(0), "{ran:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 28, item 8: `--recovery-delays-ms 18446744073709551615` was accepted: the turn
/// never ended and an `at_ms` above 2^53 was printed. Each delay and their sum are bounded.
#[test]
fn recovery_delays_past_a_day_are_bad_usage() {
    for (delays, wanted) in [
        ("18446744073709551615", "86400000"),
        ("100,86400001", "86400000"),
        // Each under a day, together more.
        ("50000000,50000000", "add up"),
    ] {
        let mut command = supervise();
        command.args([
            "--agent-cmd",
            &agent_cmd("--chunks 1"),
            "--prompt",
            "one",
            "--recovery-delays-ms",
            delays,
        ]);
        let ran = run_within(command, WITHIN);
        assert_refused(&ran, &["--recovery-delays-ms", wanted]);
    }
}

/// Issue 28, item 12: `--cwd` naming a missing directory or a file was accepted silently.
#[test]
fn a_cwd_that_is_not_a_directory_is_bad_usage() {
    let dir = temp_dir("cwd");
    let file = dir.join("file");
    std::fs::write(&file, b"not a directory").unwrap();
    for cwd in [dir.join("missing"), file] {
        let mut command = supervise();
        command
            .args(["--agent-cmd", &agent_cmd("--chunks 1"), "--prompt", "one"])
            .arg("--cwd")
            .arg(&cwd);
        let ran = run_within(command, WITHIN);
        assert_refused(&ran, &["--cwd"]);
        assert!(ran.stdout.is_empty(), "nothing ran: {ran:#?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 28, item 12: an agent answering `initialize` with `protocolVersion: 999` was
/// accepted. ACP: a client that does not support the version the agent answers with
/// closes the connection and tells the user.
#[test]
fn an_agent_answering_another_protocol_version_is_refused() {
    let mut command = supervise();
    command.args([
        "--agent-cmd",
        &agent_cmd("--protocol-version 999"),
        "--prompt",
        "one",
    ]);
    let ran = run_within(command, WITHIN);
    assert_eq!(ran.code, Some(1), "{ran:#?}");
    let said = ran
        .stderr
        .lines()
        .find(|line| line.contains("turn 1 ended"))
        .unwrap_or_else(|| panic!("no cause printed: {ran:#?}"));
    assert!(said.contains("protocol version 999"), "{said}");
    assert!(!ran.stdout.contains("conversation_ready"), "{ran:#?}");
}

/// Issue 28, item 12: an agent that never answers `initialize` took 90 s to fail: three
/// starts (the prompt never reached an agent, so it is sent again twice) of a 30 s
/// deadline each. The deadline is `--initialize-timeout-ms`, and the total is three of it.
#[test]
fn an_agent_that_never_answers_initialize_fails_within_three_initialize_deadlines() {
    let mut command = supervise();
    command.args([
        "--agent-cmd",
        &agent_cmd("--misbehave never-answer --misbehave-on initialize"),
        "--prompt",
        "one",
        "--initialize-timeout-ms",
        "300",
    ]);
    let ran = run_within(command, WITHIN);
    assert_eq!(ran.code, Some(1), "{ran:#?}");
    let failed = ran
        .stderr
        .lines()
        .filter(|line| line.starts_with("palisade-supervise: turn "))
        .filter(|line| line.contains("initialize failed: no answer before the deadline"))
        .count();
    assert_eq!(failed, 3, "{ran:#?}");
    assert!(ran.took >= Duration::from_millis(900), "{:?}", ran.took);
    assert!(ran.took < Duration::from_secs(20), "{:?}", ran.took);
    // Out of range: bad usage.
    for bad in ["0", "60001", "x"] {
        let mut command = supervise();
        command.args([
            "--agent-cmd",
            &agent_cmd(""),
            "--prompt",
            "one",
            "--initialize-timeout-ms",
            bad,
        ]);
        assert_refused(&run_within(command, WITHIN), &["--initialize-timeout-ms"]);
    }
}

/// Issue 28, item 12: prompts over 1 MiB were refused, but `--help` did not say so. It
/// names every bound on what the program is given, and the exit codes.
#[test]
fn help_names_every_bound_and_the_exit_codes() {
    let mut command = supervise();
    command.arg("--help");
    let ran = run_within(command, WITHIN);
    assert_eq!(ran.code, Some(0), "{ran:#?}");
    for wanted in [
        "--agent-cmd",
        "--state",
        "--prompt",
        "--session",
        "--cwd",
        "--recovery-delays-ms",
        "--agent-profile",
        "--log-format",
        "--initialize-timeout-ms",
        "1 MiB",
        "86400000",
        "256 MiB",
        "30000",
        "130/143",
    ] {
        assert!(
            ran.stdout.contains(wanted),
            "{wanted:?} missing:\n{}",
            ran.stdout
        );
    }
}

/// A stdin line was read whole before anything looked at it: one without a newline took
/// memory without a bound. A line longer than a prompt may be is refused by number (read
/// to its end, kept only up to the bound), and the lines after it run.
#[test]
fn a_stdin_line_longer_than_a_prompt_is_refused_and_the_rest_run() {
    use std::io::Write as _;
    let dir = temp_dir("stdin-long");
    let log = dir.join("agent.log");
    let mut child = supervise_capped()
        .args([
            "--agent-cmd",
            &agent_cmd(&format!("--chunks 1 --log {}", log.display())),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("palisade-supervise starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        stdin.write_all(b"one\n")?;
        // 2 GiB without a newline: past the memory cap if it were kept.
        let block = vec![b'x'; 1 << 20];
        for _ in 0..2048 {
            stdin.write_all(&block)?;
        }
        stdin.write_all(b"\ntwo\n")
    });
    let output = child.wait_with_output().expect("palisade-supervise exits");
    writer
        .join()
        .expect("the writer does not panic")
        .expect("stdin takes every byte");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("stdin line 2 is longer than"), "{stderr}");
    assert_eq!(prompts_received(&read_log(&log)), ["one", "two"]);
    let _ = std::fs::remove_dir_all(dir);
}
