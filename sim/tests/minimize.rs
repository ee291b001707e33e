//! `palisade minimize` on real mutant failures: the result replays, fails the same
//! invariant, holds without the mutant, is never longer than the original and, where the
//! workload was the bulk of the trace, is a fraction of it.
//!
//! The bounds below are what this world gives (measured with `palisade minimize` on the
//! sweeps' failure files): cancel-storm seed 0 with `stale-callback-dispatches` shrinks
//! from 144 trace events to 22, swarm seed 2 with `timeout-fallback` from 3,662 to 99,
//! provider-exit-mid-prompt seed 0 with `double-replay-block` from 402 to 47, and
//! notification-burst seed 1 with `queue-overflow-closes` from 11,800 to 5,937 — near its
//! floor, since the caller must stall while one burst overflows the 1,000-slot queue, and
//! each slot is several trace events.

mod common;

use serde_json::Value;

use common::{describe, palisade, read_json, Scratch};

/// Sweeps one seed of `scenario` with `mutant` on; returns the failure file's path.
fn record_failure(dir: &Scratch, scenario: &str, seed: u64, mutant: &str) -> String {
    let range = format!("{seed}..{}", seed + 1);
    let report = format!("rec-{mutant}");
    let out = palisade(
        &dir.0,
        &[
            "sweep",
            "--strategy",
            "uniform",
            "--scenario",
            scenario,
            "--seed-range",
            &range,
            "--mutant",
            mutant,
            "--report-dir",
            &report,
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let file = format!("{report}/failures/{scenario}-{seed}.json");
    assert!(dir.path(&file).is_file(), "no {file}: {}", describe(&out));
    file
}

fn trace_len(file: &Value) -> usize {
    file["trace"].as_array().expect("trace").len()
}

/// Minimises `file` into `out` and checks everything a minimised file promises; returns
/// (original events, minimised events).
fn minimize_and_check(dir: &Scratch, file: &str, out: &str) -> (usize, usize) {
    let original = read_json(&dir.path(file));
    let run = palisade(&dir.0, &["minimize", file, "-o", out, "--jobs", "2"]);
    assert_eq!(run.status.code(), Some(0), "{}", describe(&run));
    let said = String::from_utf8_lossy(&run.stdout).into_owned();
    for size in ["faults ", "sessions ", "turns ", "trace events "] {
        assert!(said.contains(size), "no {size:?} in {said}");
    }
    let min = read_json(&dir.path(out));
    assert_eq!(min["invariant"], original["invariant"], "{out}");
    assert_eq!(min["mutant"], original["mutant"], "{out}");
    assert_eq!(min["seed"], original["seed"], "{out}");

    // It replays, and fails the same invariant identically.
    let hash = min["trace_hash"].as_str().expect("hash");
    let invariant = min["invariant"].as_str().expect("invariant");
    let replay = palisade(&dir.0, &["replay", out]);
    let text = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(replay.status.code(), Some(1), "{}", describe(&replay));
    assert!(
        text.lines().any(|l| l == format!("reproduced {hash}")),
        "{}",
        describe(&replay)
    );
    assert!(text.contains(invariant), "{}", describe(&replay));

    // Without the mutant the shrunk plan holds: the failure is still the mutant's.
    let mut fixed = min.clone();
    fixed["mutant"] = Value::Null;
    let fixed_path = format!("{out}.fixed.json");
    std::fs::write(dir.path(&fixed_path), fixed.to_string()).expect("write");
    let replay = palisade(&dir.0, &["replay", &fixed_path]);
    assert_eq!(replay.status.code(), Some(0), "{}", describe(&replay));

    // The sizes it records are the file's own.
    let m = &min["minimized"];
    let plan = &min["plan"];
    assert_eq!(m["events"], trace_len(&min), "{out}");
    assert_eq!(
        m["faults"],
        plan["faults"].as_array().expect("faults").len(),
        "{out}"
    );
    if let Some(sessions) = plan["workload"]["sessions"].as_array() {
        assert_eq!(m["sessions"], sessions.len(), "{out}");
    }
    let before = m["original_events"].as_u64().expect("original_events") as usize;
    let after = trace_len(&min);
    assert!(after <= before, "{out}: {after} events, was {before}");
    (before, after)
}

#[test]
fn minimised_mutant_failures_replay_and_shrink_their_traces() {
    let dir = Scratch::new("cases");
    // (scenario, seed, mutant, the most trace events kept, in percent of the original)
    let cases = [
        ("cancel-storm", 0, "stale-callback-dispatches", 25),
        ("swarm", 2, "timeout-fallback", 25),
        ("provider-exit-mid-prompt", 0, "double-replay-block", 25),
        ("notification-burst", 1, "queue-overflow-closes", 55),
    ];
    for (scenario, seed, mutant, percent) in cases {
        let file = record_failure(&dir, scenario, seed, mutant);
        let recorded = trace_len(&read_json(&dir.path(&file)));
        let (before, after) = minimize_and_check(&dir, &file, &format!("{mutant}.min.json"));
        assert_eq!(before, recorded, "{mutant}");
        assert!(
            after * 100 <= before * percent,
            "{scenario} seed {seed} with {mutant}: {after} of {before} trace events kept, more than {percent}%"
        );
    }
}

#[test]
fn a_regression_file_of_an_older_palisade_minimises_further() {
    // Regression files written before workload cuts were shrunk over faults only: their plan
    // has no `workload` and their `minimized` block no sessions or turns. Such a file (a
    // current failure written in that older shape) still loads, and the workload shrinks.
    let dir = Scratch::new("regression");
    let file = record_failure(&dir, "cancel-storm", 0, "stale-callback-dispatches");
    let mut old = read_json(&dir.path(&file));
    let events = trace_len(&old);
    let faults = old["plan"]["faults"].as_array().expect("faults").len();
    old["plan"]
        .as_object_mut()
        .expect("plan")
        .remove("workload");
    old["minimized"] = serde_json::json!({
        "faults": faults,
        "original_faults": faults,
        "events": events,
        "original_events": events,
        "runs": 0,
    });
    std::fs::write(dir.path("old.json"), old.to_string()).expect("write");
    let (_, after) = minimize_and_check(&dir, "old.json", "new.json");
    let new = read_json(&dir.path("new.json"));
    // The first sizes are kept as the originals; the workload's are the input's.
    assert_eq!(new["minimized"]["original_events"], events);
    assert_eq!(new["minimized"]["original_faults"], faults);
    assert_eq!(new["minimized"]["original_sessions"], 6);
    assert!(
        new["plan"]["workload"]["sessions"]
            .as_array()
            .is_some_and(|s| s.len() < 6),
        "{}",
        new["plan"]
    );
    assert!(after * 2 <= events, "{after} events, was {events}");
}

#[test]
fn minimised_files_are_byte_identical_at_any_jobs() {
    let dir = Scratch::new("jobs");
    let file = record_failure(&dir, "cancel-storm", 0, "stale-callback-dispatches");
    let mut outputs = Vec::new();
    for jobs in ["1", "2", "3"] {
        // The same output path in each directory, since the file names its own path.
        let sub = dir.path(&format!("j{jobs}"));
        std::fs::create_dir_all(&sub).expect("mkdir");
        let input = format!("../{file}");
        let out = palisade(
            &sub,
            &["minimize", &input, "-o", "min.json", "--jobs", jobs],
        );
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        outputs.push(std::fs::read(sub.join("min.json")).expect("read"));
    }
    assert_eq!(outputs[0], outputs[1], "--jobs 1 and --jobs 2 differ");
    assert_eq!(outputs[0], outputs[2], "--jobs 1 and --jobs 3 differ");
}
