//! Hostile input to the shipped binaries (issues 26 and 28): every refusal is a clear
//! message and exit 2, before anything runs and without touching the state; nothing
//! panics, nothing hangs, nothing reads without a bound.
//!
//! Each test runs the binaries as a user does (`palisade_testkit::shipped`) and waits for
//! them with a deadline, so a regression that hangs fails the test instead of hanging it.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: a loaded CI machine must not turn a correct run into a timeout.
const WITHIN: Duration = Duration::from_secs(30);

/// How a run ended.
#[derive(Debug)]
struct Ran {
    /// The exit code; `None` if it was killed (by us on timeout, or by a signal).
    code: Option<i32>,
    stdout: String,
    stderr: String,
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
    let stdout = String::from_utf8_lossy(&out.join().expect("stdout reader")).into_owned();
    let stderr = String::from_utf8_lossy(&err.join().expect("stderr reader")).into_owned();
    let Some(status) = status else {
        panic!("still running after {within:?} (killed)\nstdout:\n{stdout}\nstderr:\n{stderr}");
    };
    Ran {
        code: status.code(),
        stdout,
        stderr,
    }
}

fn supervise() -> Command {
    let mut command = Command::new(palisade_testkit::shipped::binary("palisade-supervise"));
    command.env_remove("RUST_LOG");
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
