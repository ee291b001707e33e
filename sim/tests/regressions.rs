//! Regression seeds: `reports/regressions/<mutant>.json` holds one minimised failure per
//! mutant of the core, recorded with that mutant on. Each must still fail, with the same
//! invariant and trace hash, when replayed with its mutant, and must hold when replayed
//! without it (so the failure is the mutant's, not the world's).
//!
//! The files pin exact trace hashes, so a change to the core or the world that changes a
//! trace makes them diverge. Check that the new traces are right, then regenerate them:
//!
//! ```text
//! cargo test --release -p palisade-sim --test regressions -- --ignored regenerate
//! ```
//!
//! That runs `palisade mutants` and copies each mutant's minimised first failure here as
//! `<mutant>.json`, or its unminimised one when the minimised plan no longer holds without
//! the mutant (minimisation keeps the invariant failing with the mutant on, but may drop
//! workload steps a scenario's expectations rely on).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use palisade_core::mutants::Mutant;
use palisade_sim::failure::FailureFile;
use palisade_sim::report;
use palisade_sim::scoreboard::unreachable_reason;
use serde_json::Value;

use common::{describe, read_json, Scratch, BIN};

fn regressions_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../reports/regressions")
}

/// Every `*.json` in the regressions directory, sorted.
fn regression_files() -> Vec<PathBuf> {
    let dir = regressions_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

fn replay(path: &Path) -> Output {
    Command::new(BIN)
        .arg("replay")
        .arg(path)
        .output()
        .expect("run palisade replay")
}

/// Replays a copy of `path` (in `scratch`) with its mutant switched off.
fn replay_without_mutant(path: &Path, scratch: &Path) -> Output {
    let mut file = read_json(path);
    file["mutant"] = Value::Null;
    let copy = scratch.join(format!(
        "no-mutant-{}",
        path.file_name().expect("file name").to_string_lossy()
    ));
    std::fs::write(&copy, file.to_string()).expect("write copy");
    replay(&copy)
}

/// Whether a replay said `passed` (exit 0).
fn passed(out: &Output) -> bool {
    out.status.code() == Some(0) && String::from_utf8_lossy(&out.stdout).starts_with("passed: ")
}

#[test]
fn every_mutant_has_a_regression_file() {
    let files = regression_files();
    assert!(
        !files.is_empty(),
        "{} holds no regression files",
        regressions_dir().display()
    );
    let mut covered = BTreeSet::new();
    for path in &files {
        let file = read_json(path);
        let mutant = file["mutant"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: recorded without a mutant", path.display()));
        assert!(
            Mutant::from_name(mutant).is_some(),
            "{}: unknown mutant {mutant:?}",
            path.display()
        );
        assert_eq!(
            path.file_stem().and_then(|s| s.to_str()),
            Some(mutant),
            "{}: the file is named after its mutant",
            path.display()
        );
        covered.insert(mutant.to_string());
    }
    let missing: Vec<&str> = Mutant::ALL
        .iter()
        .filter(|m| unreachable_reason(**m).is_none())
        .map(|m| m.name())
        .filter(|m| !covered.contains(*m))
        .collect();
    assert!(
        missing.is_empty(),
        "no regression file for mutants {missing:?} in {}",
        regressions_dir().display()
    );
}

#[test]
fn regressions_still_fail_with_their_mutant() {
    let files = regression_files();
    assert!(!files.is_empty(), "no regression files");
    let mut broken = Vec::new();
    for path in &files {
        let file = read_json(path);
        let hash = file["trace_hash"].as_str().expect("trace_hash");
        let invariant = file["invariant"].as_str().expect("invariant");
        let out = replay(path);
        let text = String::from_utf8_lossy(&out.stdout);
        let ok = out.status.code() == Some(1)
            && text.lines().any(|l| l == format!("reproduced {hash}"))
            && text.contains(invariant);
        if !ok {
            broken.push(format!(
                "{}: wanted `reproduced {hash}` ({invariant}), got {}",
                path.display(),
                describe(&out)
            ));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n\n"));
}

#[test]
fn regressions_hold_without_their_mutant() {
    let files = regression_files();
    assert!(!files.is_empty(), "no regression files");
    let scratch = Scratch::new("no-mutant");
    let mut broken = Vec::new();
    for path in &files {
        let out = replay_without_mutant(path, &scratch.0);
        if !passed(&out) {
            broken.push(format!(
                "{} without its mutant: wanted `passed`, got {}",
                path.display(),
                describe(&out)
            ));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n\n"));
}

/// Rewrites `reports/regressions/` from a fresh `palisade mutants` run.
#[test]
#[ignore = "rewrites reports/regressions; run by hand after checking a change to the traces"]
fn regenerate() {
    let scratch = Scratch::new("regenerate");
    let report_dir = scratch.0.join("reports");
    let out = Command::new(BIN)
        // Every checker: a mutant that the ground-truth checks alone miss (`docs/mutants.md`) is still
        // recorded, caught by the core-belief checks, so its regression file exists.
        .args([
            "mutants",
            "--checks",
            "all",
            "--seeds",
            "300",
            "--minimize-runs",
            "2000",
        ])
        .arg("--report-dir")
        .arg(&report_dir)
        .output()
        .expect("run palisade mutants");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));

    // Each mutant's first failure and, when minimisation worked, its minimised copy.
    let mut recorded: Vec<(PathBuf, FailureFile)> = Vec::new();
    for entry in std::fs::read_dir(report_dir.join("failures")).expect("failures dir") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read failure file");
        let file: FailureFile =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        recorded.push((path, file));
    }
    let dir = regressions_dir();
    std::fs::create_dir_all(&dir).expect("create regressions dir");
    for mutant in Mutant::ALL {
        if unreachable_reason(mutant).is_some() {
            continue;
        }
        let name = mutant.name();
        let pick = |minimized: bool| {
            recorded.iter().find(|(_, f)| {
                f.mutant.as_deref() == Some(name) && f.minimized.is_some() == minimized
            })
        };
        let original = pick(false).unwrap_or_else(|| panic!("{name}: no failure file"));
        let chosen = match pick(true) {
            Some(min) if passed(&replay_without_mutant(&min.0, &scratch.0)) => min,
            _ => {
                let out = replay_without_mutant(&original.0, &scratch.0);
                assert!(
                    passed(&out),
                    "{name}: its first failure does not hold without the mutant: {}",
                    describe(&out)
                );
                original
            }
        };
        let mut file = chosen.1.clone();
        file.replay = format!("palisade replay reports/regressions/{name}.json");
        report::write_json(&dir.join(format!("{name}.json")), &file).expect("write regression");
    }
    // Files of mutants that no longer exist.
    for path in regression_files() {
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if Mutant::from_name(stem).is_none() {
            std::fs::remove_file(&path).expect("remove stale regression file");
        }
    }
}
