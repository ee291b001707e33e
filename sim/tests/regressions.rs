//! Regression seeds: `reports/regressions/<mutant>.json` holds one minimised failure per
//! mutant of the core, recorded with that mutant on. Each must still fail, with the same
//! invariant and trace hash, when replayed with its mutant, and must hold when replayed
//! without it (so the failure is the mutant's, not the world's).
//!
//! Regenerate them with `palisade mutants --seeds 60` (from the repository root, with
//! `--report-dir reports`) and copy each mutant's `failures/*-<mutant>.min.json` here as
//! `<mutant>.json`, keeping the unminimised file instead when the minimised plan would no
//! longer hold without the mutant.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use palisade_sim::world::Mutant;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

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

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn replay(path: &Path) -> Output {
    Command::new(BIN)
        .arg("replay")
        .arg(path)
        .output()
        .expect("run palisade replay")
}

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "palisade-regressions-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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
        let mut file = read_json(path);
        file["mutant"] = Value::Null;
        let copy = scratch.0.join(path.file_name().expect("file name"));
        std::fs::write(&copy, file.to_string()).expect("write copy");
        let out = replay(&copy);
        let text = String::from_utf8_lossy(&out.stdout);
        if out.status.code() != Some(0) || !text.starts_with("passed: ") {
            broken.push(format!(
                "{} without its mutant: wanted `passed`, got {}",
                path.display(),
                describe(&out)
            ));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n\n"));
}
