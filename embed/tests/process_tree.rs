//! Issue 13, item 1: the supervisor owns each agent's whole process tree.
//!
//! The agent is `palisade-test-agent` as a *launcher* (like codex-acp's npm launcher, or a
//! daemonizing wrapper): the process the supervisor starts is not the one that speaks ACP.
//! The speaking agent ignores stdin EOF (as every real agent measured does), and in some
//! cases SIGTERM too; it is a child of the launcher, or a reparented grandchild (double
//! fork), or one that also called `setsid` (a new session and process group). Every process
//! of the tree logs its pid (ground truth). After `palisade-supervise` exits — normally, on
//! SIGTERM, or SIGKILLed — none of them may be alive 3 s later.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use palisade_core::{SessionId, TurnOutcome};
use palisade_embed::platform::WatchdogProgram;
use palisade_embed::{AgentCommand, SessionEvent, Supervisor, SupervisorConfig};
use serde_json::Value;

/// What issue 13 asks: nothing of any agent tree alive this long after the supervisor is
/// gone.
const GONE_WITHIN: Duration = Duration::from_secs(3);
/// Generous, for a loaded machine: how long a run may take to reach a given point.
const WITHIN: Duration = Duration::from_secs(30);

fn agent() -> std::path::PathBuf {
    palisade_testkit::shipped::binary("palisade-test-agent")
}

fn supervise_bin() -> std::path::PathBuf {
    palisade_testkit::shipped::binary("palisade-supervise")
}

fn temp_log(test: &str) -> PathBuf {
    let path =
        std::env::temp_dir().join(format!("palisade-tree-{}-{test}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn log_entries(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// Every process of every tree that logged its start, with its role.
fn started(path: &Path) -> Vec<(u32, String)> {
    log_entries(path)
        .iter()
        .filter(|e| e["event"] == "start")
        .map(|e| {
            let pid = u32::try_from(e["pid"].as_u64().unwrap()).unwrap();
            (pid, e["role"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

/// Alive: in the process table and not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    })
}

/// Waits up to [`GONE_WITHIN`] for every process in `pids` to be gone; panics naming the
/// ones still alive.
fn assert_all_gone(pids: &[(u32, String)], what: &str) {
    let until = Instant::now() + GONE_WITHIN;
    loop {
        let left: Vec<_> = pids.iter().filter(|(pid, _)| alive(*pid)).collect();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < until,
            "{what}: still alive {GONE_WITHIN:?} later: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn roles(pids: &[(u32, String)]) -> Vec<&str> {
    let mut roles: Vec<&str> = pids.iter().map(|(_, role)| role.as_str()).collect();
    roles.sort_unstable();
    roles.dedup();
    roles
}

fn agent_cmd(launcher: &str, log: &Path, extra: &str) -> String {
    format!(
        "{} --launcher {launcher} --on-eof stay --log {} {extra}",
        agent().display(),
        log.display()
    )
}

fn supervise(agent: &str, prompt: &str) -> Command {
    let mut command = Command::new(supervise_bin());
    command
        .args(["--agent-cmd", agent, "--prompt", prompt])
        .args(["--recovery-delays-ms", "50,100"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Waits until the log shows the agent has streamed at least one chunk of a prompt.
fn wait_mid_turn(log: &Path, child: &mut Child) {
    let until = Instant::now() + WITHIN;
    while !log_entries(log)
        .iter()
        .any(|e| e["method"] == "session/prompt")
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "palisade-supervise ended early"
        );
        assert!(Instant::now() < until, "no prompt reached the agent");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn after_palisade_supervise_exits_no_process_of_any_agent_tree_is_left() {
    for (launcher, extra) in [
        ("spawn", ""),
        ("double-fork", ""),
        ("setsid", "--ignore-sigterm true"),
    ] {
        let log = temp_log(&format!("exit-{launcher}"));
        let output = supervise(&agent_cmd(launcher, &log, extra), "hello")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{launcher}: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("\"outcome\":\"Completed\""), "{stdout}");
        let pids = started(&log);
        assert!(roles(&pids).contains(&"agent"), "{launcher}: {pids:?}");
        assert!(roles(&pids).contains(&"launcher"), "{launcher}: {pids:?}");
        assert_all_gone(&pids, &format!("exit, launcher {launcher}"));
        let _ = std::fs::remove_file(log);
    }
}

#[test]
fn on_sigterm_palisade_supervise_stops_every_agent_tree_and_exits_143() {
    let log = temp_log("sigterm");
    let agent = agent_cmd("setsid", &log, "--chunks 1000 --chunk-delay-ms 100");
    let mut child = supervise(&agent, "a long turn").spawn().unwrap();
    wait_mid_turn(&log, &mut child);
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(143), "{output:?}");
    let pids = started(&log);
    assert_eq!(roles(&pids), ["agent", "intermediate", "launcher"]);
    assert_all_gone(&pids, "SIGTERM");
    let _ = std::fs::remove_file(log);
}

#[test]
fn a_sigkilled_palisade_supervise_leaves_no_process_of_any_agent_tree() {
    for launcher in ["spawn", "setsid"] {
        let log = temp_log(&format!("sigkill-{launcher}"));
        let agent = agent_cmd(
            launcher,
            &log,
            "--chunks 1000 --chunk-delay-ms 100 --ignore-sigterm true",
        );
        let mut child = supervise(&agent, "a long turn").spawn().unwrap();
        wait_mid_turn(&log, &mut child);
        child.kill().unwrap();
        child.wait().unwrap();
        let pids = started(&log);
        assert!(roles(&pids).contains(&"agent"), "{pids:?}");
        // The watchdog sends SIGTERM, which this agent ignores, then SIGKILL.
        assert_all_gone(&pids, &format!("SIGKILL, launcher {launcher}"));
        let _ = std::fs::remove_file(log);
    }
}

fn config() -> SupervisorConfig {
    let mut config = SupervisorConfig::default();
    config.engine.core.recovery_delays_ms = vec![50, 100, 200];
    config.engine.cwd = std::env::temp_dir();
    config.engine.stop_grace_ms = 200;
    config.engine.audit = true;
    config
}

fn session() -> SessionId {
    SessionId::new(1).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launcher_killed_mid_turn_is_recovered_and_its_orphaned_agent_is_killed() {
    let log = temp_log("launcher-killed");
    let agent = AgentCommand::new(agent()).args([
        "--launcher",
        "spawn",
        "--on-eof",
        "stay",
        "--chunks",
        "6",
        "--chunk-delay-ms",
        "150",
        "--log",
        log.to_str().unwrap(),
    ]);
    let (supervisor, mut events) = Supervisor::start(config(), agent, None).unwrap();
    let turn = supervisor.prompt(session(), "hello").await.unwrap();
    let mut killed = false;
    let mut recovered = false;
    let outcome = tokio::time::timeout(WITHIN, async {
        while let Some(event) = events.recv().await {
            match event {
                SessionEvent::Output { .. } if !killed => {
                    // SIGKILL the process we started: the launcher. Its child, the agent
                    // that speaks ACP, is orphaned with the stdout pipe still open.
                    let launcher = started(&log)
                        .into_iter()
                        .find(|(_, role)| role == "launcher")
                        .unwrap()
                        .0;
                    let status = std::process::Command::new("kill")
                        .args(["-9", &launcher.to_string()])
                        .status()
                        .unwrap();
                    assert!(status.success());
                    killed = true;
                }
                SessionEvent::RecoveryStarted { .. } => recovered = true,
                SessionEvent::TurnEnded {
                    turn: t, outcome, ..
                } if t == turn => {
                    return outcome;
                }
                _ => {}
            }
        }
        TurnOutcome::Failed
    })
    .await
    .expect("the turn ends");
    assert_eq!(outcome, TurnOutcome::Completed);
    assert!(recovered);
    let first_tree: Vec<_> = started(&log).into_iter().take(2).collect();
    assert_eq!(roles(&first_tree), ["agent", "launcher"]);
    // The orphaned agent of the first tree was taken down with its launcher's group.
    assert_all_gone(&first_tree, "the killed launcher's tree");
    let stats = supervisor.stats().await.unwrap();
    assert_eq!(stats.engine.audit_violations, 0);
    supervisor.shutdown().await;
    assert_all_gone(&started(&log), "after shutdown");
    let _ = std::fs::remove_file(log);
}

#[test]
fn a_runtime_dropped_mid_turn_takes_every_tree_down_without_a_watchdog() {
    // What a panic that unwinds out of the service's runtime does: every task is dropped
    // mid-step. The in-process guard alone (no watchdog) must take the trees down.
    let log = temp_log("dropped-runtime");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut config = config();
        config.connection.watchdog = WatchdogProgram::Off;
        let agent = AgentCommand::new(agent()).args([
            "--launcher",
            "setsid",
            "--on-eof",
            "stay",
            "--chunks",
            "1000",
            "--chunk-delay-ms",
            "100",
            "--log",
            log.to_str().unwrap(),
        ]);
        let (supervisor, mut events) = Supervisor::start(config, agent, None).unwrap();
        supervisor.prompt(session(), "hello").await.unwrap();
        while let Some(event) = events.recv().await {
            if matches!(event, SessionEvent::Output { .. }) {
                break;
            }
        }
        // Leaked on purpose: nothing shuts the supervisor down in order.
        std::mem::forget(supervisor);
        std::mem::forget(events);
    });
    drop(runtime);
    let pids = started(&log);
    assert_eq!(roles(&pids), ["agent", "intermediate", "launcher"]);
    assert_all_gone(&pids, "runtime dropped");
    let _ = std::fs::remove_file(log);
}
