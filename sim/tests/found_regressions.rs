//! Failures the sweeps found in the real core, kept forever: every
//! `reports/regressions/found/*.json` is a (minimised) failure file of a seed that failed
//! with no mutant on, written by
//!
//! ```text
//! palisade minimize reports/failures/SCENARIO-SEED.json -o reports/regressions/found/SCENARIO-SEED.json
//! ```
//!
//! (`docs/ci.md`). The file goes in with the fix of its bug, and from then on
//! its exact (seed, plan) must hold. A file whose scenario has since changed version names
//! a pinned copy of the scenario as it was (`found/scenarios/NAME-vN.toml`, a path from the
//! repository root, where the replays run).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{describe, read_json, BIN};

fn found_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../reports/regressions/found")
}

#[test]
fn every_failure_found_by_a_sweep_holds_now() {
    let dir = found_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut broken = Vec::new();
    for path in &files {
        let file = read_json(path);
        if let Some(mutant) = file["mutant"].as_str() {
            broken.push(format!(
                "{}: recorded with mutant {mutant}; a mutant's failure belongs in reports/regressions/{mutant}.json",
                path.display()
            ));
            continue;
        }
        let out = Command::new(BIN)
            .current_dir(found_dir().join("../../.."))
            .arg("replay")
            .arg(path)
            .output()
            .expect("run palisade replay");
        let held = out.status.code() == Some(0)
            && String::from_utf8_lossy(&out.stdout).starts_with("passed: ");
        if !held {
            broken.push(format!("{}: {}", path.display(), describe(&out)));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n\n"));
}
