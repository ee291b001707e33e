//! The sharded sweep of `.github/workflows/sweep.yml`, run on this machine by
//! `ci/sharded-sweep.sh N`: N shards of `palisade sweep --shard I/N`, each its own process,
//! then `palisade merge`. The merged report must say what one unsharded sweep of the same
//! seeds says — the same seeds, the same failures, the same trace hashes (per failure, and
//! the per-scenario digest over every seed's hash), the same coverage marks — for N = 1, 2,
//! 3 and 7.
//!
//! With no mutant every shipped scenario holds, so the failures come from a mutant:
//! `stale-callback-dispatches` fails 79 of seeds 100..124 of every scenario (measured), in
//! nine scenarios, 21 in tombstone-churn (past the 20 failure files a sweep keeps per
//! scenario), and those seeds hit coverage marks. 24 seeds do not divide by 7, and a range
//! that starts past 0 checks that shards count positions, not seeds.
//!
//! The last three tests each pin a way the merged report once differed from the unsharded
//! one (failure files kept past the cap, `replay` lines naming the shard's directory, and a
//! determinism check that re-ran each shard's first seed).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use palisade_sim::sweep::MAX_FAILURE_FILES_PER_SCENARIO;
use serde_json::Value;

use common::{describe, palisade, read_json, Scratch, BIN};

/// The sweep every test shards: 768 seeds (32 scenarios × 24), 79 failing.
const SWEEP: &[&str] = &[
    "--scenario",
    "all",
    "--seed-range",
    "100..124",
    "--mutant",
    "stale-callback-dispatches",
];

/// The shard counts the sharded and unsharded sweeps are compared at.
const SHARD_COUNTS: [u32; 4] = [1, 2, 3, 7];

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/sharded-sweep.sh")
}

/// `ci/sharded-sweep.sh N -o OUT -- ARGS`, with this test's binary, two shards at a time,
/// one worker thread each.
fn sharded(cwd: &Path, n: u32, out: &str, args: &[&str]) -> Output {
    Command::new("bash")
        .arg(script())
        .arg(n.to_string())
        .args(["-o", out, "--"])
        .args(args)
        .args(["--jobs", "1"])
        .env("PALISADE", BIN)
        .env("SHARD_PROCS", "2")
        .current_dir(cwd)
        .output()
        .expect("run ci/sharded-sweep.sh")
}

/// The unsharded sweep, into `cwd/whole`: uniform, as the shards are.
fn unsharded(cwd: &Path, args: &[&str]) -> Output {
    palisade(
        cwd,
        &[
            &[
                "sweep",
                "--strategy",
                "uniform",
                "--report-dir",
                "whole",
                "--jobs",
                "2",
            ][..],
            args,
        ]
        .concat(),
    )
}

/// A summary without what depends on the machine, the moment, or how it was split:
/// wall and thread time, and the shard a part covered.
fn comparable(mut summary: Value) -> Value {
    let obj = summary.as_object_mut().expect("summary is an object");
    obj.remove("timing");
    obj.remove("shard");
    for s in obj["scenarios"].as_array_mut().expect("scenarios") {
        let s = s.as_object_mut().expect("scenario");
        s.remove("seed_seconds");
    }
    summary
}

/// Every place where `a` and `b` differ, as `path: a-value != b-value`.
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (va, vb) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                differences(&format!("{path}.{k}"), va, vb, out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        _ if a != b => out.push(format!("{path}: {a} != {b}")),
        _ => {}
    }
}

/// The failure files of a report directory, by name, with `replay` (which names the
/// directory the file was written to) taken out.
fn failure_files(report: &Path) -> Vec<(String, Value)> {
    let dir = report.join("failures");
    let mut files: Vec<(String, Value)> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .map(|e| e.expect("directory entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .map(|p| {
                let mut file = read_json(&p);
                file.as_object_mut().expect("object").remove("replay");
                let name = p.file_name().expect("name").to_string_lossy().into_owned();
                (name, file)
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
}

/// Everything in which the merged report at `merged` differs from the unsharded one at
/// `whole`: the summaries, and the failure files (names and contents but `replay`).
fn report_differences(whole: &Path, merged: &Path) -> Vec<String> {
    let mut out = Vec::new();
    differences(
        "summary",
        &comparable(read_json(&whole.join("summary.json"))),
        &comparable(read_json(&merged.join("summary.json"))),
        &mut out,
    );
    let (a, b) = (failure_files(whole), failure_files(merged));
    let names = |files: &[(String, Value)]| -> BTreeSet<String> {
        files.iter().map(|(n, _)| n.clone()).collect()
    };
    let (na, nb) = (names(&a), names(&b));
    if na != nb {
        out.push(format!(
            "failures/: only unsharded {:?}, only merged {:?}",
            na.difference(&nb).collect::<Vec<_>>(),
            nb.difference(&na).collect::<Vec<_>>()
        ));
    } else {
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            differences(&format!("failures/{name}"), x, y, &mut out);
        }
    }
    out
}

/// What the unsharded sweep found, so a comparison is known not to be vacuous.
fn assert_sweep_has_substance(whole: &Value) {
    assert_eq!(whole["seeds"], 768, "{whole}");
    let failing: Vec<&Value> = whole["scenarios"]
        .as_array()
        .expect("scenarios")
        .iter()
        .filter(|s| s["failed"].as_u64() > Some(0))
        .collect();
    assert!(failing.len() >= 3, "failures in too few scenarios: {whole}");
    // One scenario fails past the failure files a sweep keeps, so merge must pick the same.
    assert!(
        failing
            .iter()
            .any(|s| s["failed"].as_u64() > Some(MAX_FAILURE_FILES_PER_SCENARIO as u64)),
        "no scenario fails more than {MAX_FAILURE_FILES_PER_SCENARIO} times: {whole}"
    );
    let marks = whole["marks"].as_object().expect("marks");
    assert!(
        marks.len() >= 3 && marks.values().all(|n| n.as_u64() > Some(0)),
        "too few coverage marks: {marks:?}"
    );
}

#[test]
fn sharded_sweeps_merge_into_the_unsharded_sweep() {
    let dir = Scratch::new("sharded");
    let out = unsharded(&dir.0, SWEEP);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let whole = read_json(&dir.path("whole/summary.json"));
    assert_sweep_has_substance(&whole);

    for n in SHARD_COUNTS {
        let name = format!("sharded-{n}");
        let out = sharded(&dir.0, n, &name, SWEEP);
        assert_eq!(out.status.code(), Some(1), "N = {n}: {}", describe(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        for i in 0..n {
            assert!(
                stdout.contains(&format!("shard {i}/{n}: sweep: ")),
                "N = {n}: shard {i} did not report:\n{stdout}"
            );
        }
        let merged = dir.path(&format!("{name}/merged"));
        let diff = report_differences(&dir.path("whole"), &merged);
        assert!(
            diff.is_empty(),
            "N = {n}: the merged report differs from the unsharded sweep:\n  {}",
            diff.join("\n  ")
        );
        // The script lists every failure file with the command that replays it.
        let replays = stdout
            .lines()
            .filter(|l| l.trim_start().starts_with("palisade replay "))
            .count();
        assert_eq!(replays, failure_files(&merged).len(), "N = {n}:\n{stdout}");
    }
}

#[test]
fn the_comparison_sees_a_shard_that_differs() {
    let dir = Scratch::new("sharded-tampered");
    let out = unsharded(&dir.0, SWEEP);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let out = sharded(&dir.0, 2, "sharded", SWEEP);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(report_differences(&dir.path("whole"), &dir.path("sharded/merged")).is_empty());

    // A shard whose seeds hashed, failed and marked otherwise than the same seeds did
    // in the unsharded sweep.
    let part = dir.path("sharded/shard-1/summary.json");
    let mut summary = read_json(&part);
    let scenario = summary["scenarios"]
        .as_array_mut()
        .expect("scenarios")
        .iter_mut()
        .find(|s| s["marks"].as_object().is_some_and(|m| !m.is_empty()))
        .expect("a scenario with marks");
    let name = scenario["name"].as_str().expect("name").to_string();
    scenario["digest"] = Value::from("0123456789abcdef");
    let mark = {
        let marks = scenario["marks"].as_object_mut().expect("marks");
        let (mark, hits) = marks.iter_mut().next().expect("a mark");
        *hits = Value::from(hits.as_u64().expect("count") + 1);
        mark.clone()
    };
    let failure = &mut summary["failures"][0];
    failure["trace_hash"] = Value::from("fedcba9876543210");
    let failed_seed = failure["seed"].clone();
    std::fs::write(&part, summary.to_string()).expect("write the shard's summary");

    let out = palisade(
        &dir.0,
        &[
            "merge",
            "--report-dir",
            "remerged",
            "sharded/shard-0/summary.json",
            "sharded/shard-1/summary.json",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let diff = report_differences(&dir.path("whole"), &dir.path("remerged"));
    let said = |needle: &str| diff.iter().any(|d| d.contains(needle));
    assert!(said(".digest: "), "digest of {name} not seen: {diff:#?}");
    assert!(
        said(&format!(".marks.{mark}: ")),
        "{mark} not seen: {diff:#?}"
    );
    assert!(
        said("fedcba9876543210"),
        "trace hash of seed {failed_seed} not seen: {diff:#?}"
    );
}

#[test]
fn the_script_refuses_bad_usage_and_a_directory_it_did_not_write() {
    let dir = Scratch::new("sharded-usage");
    std::fs::write(dir.path("keep.txt"), "not the script's").expect("write");
    for (args, want) in [
        (&["0"][..], "from 1 to 256"),
        (&["257"][..], "from 1 to 256"),
        (&["x"][..], "from 1 to 256"),
        (&["2", "--", "--shard", "0/2"][..], "set by the script"),
        (&["2", "--", "--report-dir", "r"][..], "set by the script"),
        (&["2", "-o", "."][..], "not written by this script"),
    ] {
        let out = Command::new("bash")
            .arg(script())
            .args(args)
            .env("PALISADE", BIN)
            .current_dir(&dir.0)
            .output()
            .expect("run ci/sharded-sweep.sh");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(want),
            "{args:?}: {}",
            describe(&out)
        );
    }
    assert!(dir.path("keep.txt").is_file());
}

// ---------------------------------------------------------------------------------------
// Ways the merged report once differed from the unsharded one.

/// A sweep keeps failure files for the 20 lowest failing seeds of each scenario; each
/// shard keeps its own 20 lowest, and merge once kept them all (up to 20 × N files). Each
/// shard's 20 lowest include every one of the scenario's 20 lowest that fell in that
/// shard, so merge keeps exactly the sweep's choice.
#[test]
fn merge_keeps_the_failure_files_one_sweep_would_keep() {
    let dir = Scratch::new("sharded-cap");
    // 54 of these 60 seeds fail (measured).
    let args = [
        "--scenario",
        "provider-exit-mid-prompt",
        "--seed-range",
        "0..60",
        "--mutant",
        "double-replay-block",
    ];
    let out = unsharded(&dir.0, &args);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let whole = read_json(&dir.path("whole/summary.json"));
    assert!(
        whole["failed"].as_u64() > Some(MAX_FAILURE_FILES_PER_SCENARIO as u64),
        "{whole}"
    );
    let out = sharded(&dir.0, 3, "sharded", &args);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let diff = report_differences(&dir.path("whole"), &dir.path("sharded/merged"));
    assert!(
        diff.is_empty(),
        "the merged report differs from the unsharded sweep:\n  {}",
        diff.join("\n  ")
    );
}

/// Merge once copied each failure file byte for byte, so its `replay` line named the
/// shard's report directory, not the merged one the file is now in; the unsharded sweep's
/// files name their own directory.
#[test]
fn merged_failure_files_replay_from_the_merged_directory() {
    let dir = Scratch::new("sharded-replay");
    let out = sharded(&dir.0, 2, "sharded", SWEEP);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let failures = dir.path("sharded/merged/failures");
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(&failures).expect("merged failures") {
        let path = entry.expect("entry").path();
        let file = read_json(&path);
        let want = format!(
            "palisade replay sharded/merged/failures/{}",
            path.file_name().expect("name").to_string_lossy()
        );
        if file["replay"].as_str() != Some(want.as_str()) {
            wrong.push(format!(
                "{}: {} (want {want})",
                path.display(),
                file["replay"]
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `--check-determinism F` re-runs a fixed sample of seeds, the same in every shard; when
/// the sample is empty a sweep re-runs its first seed instead, and every shard once did so
/// too: merged, N shards reported N seeds re-run where the unsharded sweep reported 1.
#[test]
fn determinism_checks_the_same_seeds_sharded_or_not() {
    let dir = Scratch::new("sharded-determinism");
    let args = [
        "--scenario",
        "all",
        "--seed-range",
        "0..20",
        "--check-determinism",
        "0.01",
    ];
    let out = unsharded(&dir.0, &args);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = sharded(&dir.0, 3, "sharded", &args);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let diff = report_differences(&dir.path("whole"), &dir.path("sharded/merged"));
    assert!(
        diff.is_empty(),
        "the merged report differs from the unsharded sweep:\n  {}",
        diff.join("\n  ")
    );
}
