//! The `palisade` command line as CI and people use it: exit codes, reports, replay,
//! determinism, shards.
//!
//! Failing seeds come from the world itself: until the real oracle lands, the placeholder
//! world fails every seed ending in 999; later, real failures come from mutants.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("palisade-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn palisade(cwd: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run palisade")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("valid JSON")
}

/// Asserts the exit code, showing the output when it is wrong.
#[track_caller]
fn expect_code(out: &Output, want: i32) {
    assert_eq!(
        code(out),
        want,
        "stdout:\n{}\nstderr:\n{}",
        stdout(out),
        stderr(out)
    );
}

/// A summary with the machine-dependent figures removed.
fn comparable(mut summary: Value) -> Value {
    let obj = summary.as_object_mut().expect("summary is an object");
    obj.remove("timing");
    obj.remove("shard");
    for s in obj["scenarios"].as_array_mut().expect("scenarios") {
        let s = s.as_object_mut().expect("scenario");
        s.remove("seed_seconds");
        s.remove("oracle_seconds");
    }
    summary
}

#[test]
fn bad_input_exits_2_and_writes_nothing() {
    let dir = Scratch::new("bad-input");
    let cases: &[(&[&str], &str)] = &[
        (
            &["sweep", "--scenario", "no-such-scenario"],
            "unknown scenario",
        ),
        (&["sweep", "--seed-range", "9..3"], "bad seed range"),
        (&["sweep", "--seed-range", "ten..twenty"], "bad seed range"),
        (&["sweep", "--shard", "3/3"], "bad shard"),
        (&["sweep", "--shard", "1/0"], "bad shard"),
        (&["sweep", "--seeds", "0"], "bad seed count"),
        (&["sweep", "--jobs", "0"], "bad job count"),
        (&["sweep", "--mutant", "not-a-mutant"], "unknown mutant"),
        (&["sweep", "--check-determinism", "1.5"], "bad fraction"),
        (&["run", "--scenario", "all", "--seed", "1"], "takes one"),
        (&["run", "--scenario", "swarm"], "--seed"),
        (&["replay", "missing.json"], "cannot read"),
        (&["minimize", "missing.json"], "cannot read"),
        (&["diagram", "missing.json"], "cannot read"),
        (&["merge", "missing.json"], "cannot read"),
        (&["no-such-command"], "unrecognized subcommand"),
    ];
    for (args, needle) in cases {
        let out = palisade(&dir.0, args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
    assert!(
        !dir.path("reports").exists(),
        "bad input must not write reports"
    );
}

#[test]
fn bad_scenario_file_names_file_line_and_column() {
    let dir = Scratch::new("bad-scenario");
    let cases = [
        ("unknown-field.toml", "name = \"x\"\n\n[faults]\ndelay = [0.0, 0.1]\ndelya = 3\n", ":5:1:", "unknown field"),
        ("syntax.toml", "name = \"x\"\n[workload\n", ":2:10:", "unclosed table"),
        ("range.toml", "name = \"x\"\n[workload]\nthink_ms = [50, 10]\n", ":3:12:", "impossible range"),
        ("probability.toml", "name = \"x\"\n[faults]\ncancel = [0.5, 2.0]\n", ":3:10:", "outside [0, 1]"),
        (
            "actor.toml",
            "name = \"x\"\n[workload]\nsessions = 2\n[[steps]]\nat_ms = 5\naction = \"cancel\"\nsession = 3\n",
            ":7:11:",
            "missing actor",
        ),
    ];
    for (file, text, at, what) in cases {
        std::fs::write(dir.path(file), text).expect("write scenario");
        for args in [
            vec!["sweep", "--scenario", file, "--seeds", "1"],
            vec!["run", "--scenario", file, "--seed", "1"],
        ] {
            let out = palisade(&dir.0, &args);
            let err = stderr(&out);
            assert_eq!(code(&out), 2, "{file}: {err}");
            assert!(
                err.contains(&format!("{file}{at}")),
                "{file}: wanted {at}: {err}"
            );
            assert!(
                err.to_lowercase().contains(what),
                "{file}: wanted {what:?}: {err}"
            );
        }
    }
    assert!(!dir.path("reports").exists());
}

#[test]
fn foreign_or_stale_failure_files_are_refused() {
    let dir = Scratch::new("foreign");
    std::fs::write(dir.path("not-json.json"), "hello").expect("write");
    std::fs::write(dir.path("other.json"), r#"{"scenario":"swarm","seed":1}"#).expect("write");
    std::fs::write(
        dir.path("bad-fields.json"),
        r#"{"format":"palisade-failure/1","scenario":"swarm"}"#,
    )
    .expect("write");
    for (file, needle) in [
        ("not-json.json", "not a palisade failure file"),
        ("other.json", "not a palisade failure file"),
        ("bad-fields.json", "malformed failure file"),
    ] {
        for cmd in ["replay", "minimize"] {
            let out = palisade(&dir.0, &[cmd, file]);
            assert_eq!(code(&out), 2, "{cmd} {file}: {}", stderr(&out));
            assert!(
                stderr(&out).contains(needle),
                "{cmd} {file}: {}",
                stderr(&out)
            );
        }
    }

    // A failure recorded against a scenario whose version has since changed.
    let scenario = dir.path("versioned.toml");
    std::fs::write(&scenario, "name = \"versioned\"\nversion = 1\n").expect("write");
    let out = palisade(
        &dir.0,
        &[
            "sweep",
            "--scenario",
            "versioned.toml",
            "--seed-range",
            "999..1000",
        ],
    );
    expect_code(&out, 1);
    let failure = dir.path("reports/failures/versioned-999.json");
    assert!(failure.is_file());
    std::fs::write(&scenario, "name = \"versioned\"\nversion = 2\n").expect("write");
    let out = palisade(&dir.0, &["replay", "reports/failures/versioned-999.json"]);
    expect_code(&out, 2);
    assert!(stderr(&out).contains("version 1"), "{}", stderr(&out));
    assert!(stderr(&out).contains("refusing"), "{}", stderr(&out));
}

#[test]
fn sweep_writes_reports_and_ends_with_one_sweep_line() {
    let dir = Scratch::new("reports");
    let out = palisade(
        &dir.0,
        &[
            "sweep",
            "--scenario",
            "swarm",
            "--seed-range",
            "990..1000",
            "--jobs",
            "2",
        ],
    );
    expect_code(&out, 1);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    let last = lines.last().expect("output");
    assert!(last.starts_with("sweep: 10 seeds, 1 failed, "), "{text}");
    assert!(last.ends_with(" seeds/s"), "{text}");
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("sweep:")).count(),
        1,
        "{text}"
    );
    assert!(lines[lines.len() - 2].contains("events/s"), "{text}");
    assert!(
        lines[lines.len() - 2].contains("simulated s per wall s"),
        "{text}"
    );
    assert!(
        stderr(&out).is_empty(),
        "no progress when stderr is not a terminal: {}",
        stderr(&out)
    );

    let summary = read_json(&dir.path("reports/summary.json"));
    assert_eq!(summary["seeds"], 10);
    assert_eq!(summary["failed"], 1);
    assert_eq!(summary["failures"][0]["file"], "failures/swarm-999.json");

    let failure = read_json(&dir.path("reports/failures/swarm-999.json"));
    for field in [
        "scenario",
        "scenario_version",
        "seed",
        "plan",
        "mutant",
        "invariant",
        "message",
        "trace_hash",
        "repro",
        "commit",
        "trace",
    ] {
        assert!(failure.get(field).is_some(), "failure file lacks {field}");
    }
    assert_eq!(failure["repro"], "palisade run --scenario swarm --seed 999");

    let md = std::fs::read_to_string(dir.path("reports/summary.md")).expect("summary.md");
    assert!(md.contains("| swarm | 1 | 10 |"), "{md}");
    assert!(
        md.contains("palisade replay reports/failures/swarm-999.json"),
        "{md}"
    );
    assert!(md.contains("```mermaid\nsequenceDiagram"), "{md}");
    assert!(md.contains("### Coverage marks"), "{md}");

    let junit = std::fs::read_to_string(dir.path("reports/junit.xml")).expect("junit.xml");
    assert!(
        junit.contains("<testcase classname=\"palisade.scenarios\" name=\"swarm\""),
        "{junit}"
    );
    assert_eq!(junit.matches("<failure ").count(), 1, "{junit}");

    // No temporary files are left behind.
    for entry in std::fs::read_dir(dir.path("reports")).expect("reports dir") {
        let name = entry.expect("entry").file_name();
        assert!(!name.to_string_lossy().contains(".tmp-"), "{name:?}");
    }
}

#[test]
fn replay_reproduces_a_failure_and_minimize_and_diagram_work_on_it() {
    let dir = Scratch::new("replay");
    let out = palisade(
        &dir.0,
        &[
            "sweep",
            "--scenario",
            "swarm",
            "--seed-range",
            "995..1000",
            "--report-dir",
            "out",
        ],
    );
    expect_code(&out, 1);
    let file = "out/failures/swarm-999.json";
    let recorded = read_json(&dir.path(file));
    let hash = recorded["trace_hash"].as_str().expect("hash").to_string();

    let out = palisade(&dir.0, &["replay", file]);
    expect_code(&out, 1);
    assert!(
        stdout(&out)
            .lines()
            .any(|l| l == format!("reproduced {hash}")),
        "{}",
        stdout(&out)
    );

    // `run` alone gives the same verdict and hash.
    let out = palisade(
        &dir.0,
        &[
            "run",
            "--scenario",
            "swarm",
            "--seed",
            "999",
            "--trace",
            "t.jsonl",
        ],
    );
    expect_code(&out, 1);
    assert!(stderr(&out).contains(&hash), "{}", stderr(&out));
    let trace = std::fs::read_to_string(dir.path("t.jsonl")).expect("trace file");
    let lines: Vec<&str> = trace.lines().collect();
    assert_eq!(
        lines,
        recorded["trace"]
            .as_array()
            .expect("trace")
            .iter()
            .map(|l| l.as_str().expect("line"))
            .collect::<Vec<_>>()
    );

    let out = palisade(&dir.0, &["minimize", file, "-o", "min.json"]);
    expect_code(&out, 0);
    assert!(
        stdout(&out).contains("minimized: faults "),
        "{}",
        stdout(&out)
    );
    let out = palisade(&dir.0, &["replay", "min.json"]);
    expect_code(&out, 1);
    assert!(stdout(&out).contains("reproduced "), "{}", stdout(&out));

    let out = palisade(&dir.0, &["diagram", file]);
    expect_code(&out, 0);
    assert!(
        stdout(&out).starts_with("sequenceDiagram\n"),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("VIOLATION"), "{}", stdout(&out));
    let out = palisade(&dir.0, &["diagram", "t.jsonl", "--markdown"]);
    expect_code(&out, 0);
    assert!(
        stdout(&out).starts_with("```mermaid\nsequenceDiagram\n"),
        "{}",
        stdout(&out)
    );

    // A recorded hash that no longer matches: diverged, exit 1.
    let mut tampered = recorded.clone();
    tampered["trace_hash"] = Value::String("0000000000000000".into());
    std::fs::write(dir.path("tampered.json"), tampered.to_string()).expect("write");
    let out = palisade(&dir.0, &["replay", "tampered.json"]);
    expect_code(&out, 1);
    assert!(stdout(&out).starts_with("diverged"), "{}", stdout(&out));

    // A seed that holds: passed, exit 0.
    let mut fixed = recorded;
    fixed["seed"] = Value::from(5u64);
    std::fs::write(dir.path("fixed.json"), fixed.to_string()).expect("write");
    let out = palisade(&dir.0, &["replay", "fixed.json"]);
    expect_code(&out, 0);
    assert!(stdout(&out).starts_with("passed"), "{}", stdout(&out));
}

#[test]
fn hashes_do_not_depend_on_jobs_and_match_single_runs() {
    let dir = Scratch::new("determinism");
    let mut summaries = Vec::new();
    for jobs in ["1", "2"] {
        let report = format!("r{jobs}");
        let out = palisade(
            &dir.0,
            &[
                "sweep",
                "--scenario",
                "swarm",
                "--seeds",
                "12",
                "--jobs",
                jobs,
                "--report-dir",
                &report,
                "--check-determinism",
                "0.5",
            ],
        );
        expect_code(&out, 0);
        assert!(stdout(&out).contains("determinism: "), "{}", stdout(&out));
        assert!(stdout(&out).contains(" 0 differed"), "{}", stdout(&out));
        summaries.push(comparable(read_json(
            &dir.path(&format!("{report}/summary.json")),
        )));
    }
    assert_eq!(summaries[0], summaries[1]);

    // The sweep's digest is the sum over its seeds: recompute it from `run` alone.
    let mut digest = 0u64;
    for seed in 0..12u64 {
        let out = palisade(
            &dir.0,
            &["run", "--scenario", "swarm", "--seed", &seed.to_string()],
        );
        expect_code(&out, 0);
        let err = stderr(&out);
        let hash = err
            .split("trace ")
            .nth(1)
            .and_then(|rest| rest.get(..16))
            .unwrap_or_else(|| panic!("no hash in {err}"));
        let hash = u64::from_str_radix(hash, 16).expect("hex hash");
        digest = digest.wrapping_add(palisade_sim::report::digest_term(seed, Some(hash)));
    }
    assert_eq!(
        summaries[0]["scenarios"][0]["digest"],
        format!("{digest:016x}")
    );
}

#[test]
fn shards_merge_into_the_unsharded_sweep() {
    let dir = Scratch::new("shards");
    let range = ["--seed-range", "990..1000"];
    let scenarios = ["--scenario", "all"];
    let out = palisade(
        &dir.0,
        &[&["sweep", "--report-dir", "whole"][..], &scenarios, &range].concat(),
    );
    expect_code(&out, 1);
    let mut parts = Vec::new();
    for i in 0..3 {
        let report = format!("shard{i}");
        let shard = format!("{i}/3");
        let out = palisade(
            &dir.0,
            &[
                &["sweep", "--report-dir", &report, "--shard", &shard][..],
                &scenarios,
                &range,
            ]
            .concat(),
        );
        assert!(code(&out) <= 1, "{}", stderr(&out));
        parts.push(format!("{report}/summary.json"));
    }
    let mut args = vec!["merge", "--report-dir", "merged"];
    args.extend(parts.iter().map(String::as_str));
    let out = palisade(&dir.0, &args);
    expect_code(&out, 1);
    assert!(
        stdout(&out)
            .lines()
            .last()
            .expect("line")
            .starts_with("sweep: "),
        "{}",
        stdout(&out)
    );

    let whole = comparable(read_json(&dir.path("whole/summary.json")));
    let merged = comparable(read_json(&dir.path("merged/summary.json")));
    assert_eq!(whole, merged);
    assert!(dir.path("merged/failures/swarm-999.json").is_file());
    assert!(dir.path("merged/junit.xml").is_file());
    assert!(dir.path("merged/summary.md").is_file());

    // An incomplete or mixed set of shards is refused.
    let out = palisade(
        &dir.0,
        &["merge", "--report-dir", "x", &parts[0], &parts[1]],
    );
    expect_code(&out, 2);
    assert!(
        stderr(&out).contains("shard 2/3 is missing"),
        "{}",
        stderr(&out)
    );
    let out = palisade(
        &dir.0,
        &[
            "merge",
            "--report-dir",
            "x",
            &parts[0],
            &parts[0],
            &parts[2],
        ],
    );
    expect_code(&out, 2);
    assert!(stderr(&out).contains("given twice"), "{}", stderr(&out));
    assert!(!dir.path("x").exists());
}

#[test]
fn coverage_marks_are_required_at_the_default_size() {
    let dir = Scratch::new("coverage");
    std::fs::write(
        dir.path("marked.toml"),
        "name = \"marked\"\n[expect]\nmin_marks = [\"a-mark-no-world-records\"]\n",
    )
    .expect("write");
    // Smaller than the default size: not judged.
    let out = palisade(
        &dir.0,
        &["sweep", "--scenario", "marked.toml", "--seeds", "10"],
    );
    expect_code(&out, 0);
    // The default size: a mark never hit fails the sweep.
    let out = palisade(&dir.0, &["sweep", "--scenario", "marked.toml"]);
    expect_code(&out, 1);
    assert!(
        stdout(&out).contains("coverage: mark `a-mark-no-world-records` never hit"),
        "{}",
        stdout(&out)
    );
    let junit = std::fs::read_to_string(dir.path("reports/junit.xml")).expect("junit");
    assert!(junit.contains("type=\"coverage\""), "{junit}");
}

#[test]
fn scenarios_lists_every_shipped_scenario() {
    let dir = Scratch::new("list");
    let out = palisade(&dir.0, &["scenarios"]);
    expect_code(&out, 0);
    let text = stdout(&out);
    for name in [
        "swarm",
        "cancel-during-delayed-resume",
        "delayed-callback-after-replacement",
        "tombstone-churn",
        "load-timeout-preserves-identity",
        "unknown-session-falls-back",
        "provider-exit-mid-prompt",
        "notification-burst",
        "crash-restart-in-flight",
        "cancel-storm",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{text}"
        );
    }
}

#[test]
fn mutants_scoreboard_is_written_and_exit_code_matches_it() {
    let dir = Scratch::new("mutants");
    let out = palisade(
        &dir.0,
        &[
            "mutants",
            "--scenario",
            "swarm",
            "--seeds",
            "2",
            "--jobs",
            "2",
            "--minimize-runs",
            "20",
        ],
    );
    let md = std::fs::read_to_string(dir.path("reports/mutants.md")).expect("mutants.md");
    let survived = md.contains("survived |");
    assert_eq!(
        code(&out),
        if survived { 1 } else { 0 },
        "{}\n{md}",
        stdout(&out)
    );
    assert_eq!(md.matches("\n| `").count(), 14, "{md}");
    assert!(stdout(&out)
        .lines()
        .last()
        .expect("line")
        .starts_with("mutants: 14 mutants"));
}

#[test]
fn every_shipped_scenario_holds_for_100_seeds() {
    let dir = Scratch::new("shipped");
    let out = palisade(&dir.0, &["sweep", "--scenario", "all", "--seeds", "100"]);
    expect_code(&out, 0);
    let summary = read_json(&dir.path("reports/summary.json"));
    assert_eq!(
        summary["scenarios"].as_array().expect("scenarios").len(),
        10
    );
    assert_eq!(summary["seeds"], 1000);
}
