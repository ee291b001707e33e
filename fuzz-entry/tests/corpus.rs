//! The fuzz corpus on stable: every file of `fuzz/corpus/<target>/` (the checked-in seeds,
//! and whatever a local fuzzing run added) goes through the same entry point the
//! cargo-fuzz target calls, and must pass. The seeds must be current and must each catch
//! the mutants they name, so the corpus alone proves the harness sees every mutant.

use std::path::{Path, PathBuf};

use palisade_fuzz_entry::{seeds, Mutant, Target};

fn corpus_dir(target: Target) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target.name())
}

fn files(target: Target) -> Vec<PathBuf> {
    let dir = corpus_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|entry| entry.expect("readable corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_file_passes_its_target() {
    let mut failures = Vec::new();
    for target in Target::ALL {
        let files = files(target);
        assert!(
            !files.is_empty(),
            "fuzz/corpus/{} is empty: run `cargo run -p palisade-fuzz-entry --example make-seeds`",
            target.name()
        );
        for file in files {
            let data = std::fs::read(&file).expect("readable corpus file");
            if let Err(finding) = target.run(&data, None) {
                failures.push(format!("{}: {finding}", file.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn seed_files_on_disk_are_current() {
    for seed in seeds::all() {
        let path = corpus_dir(seed.target).join(seed.file_name());
        let on_disk = std::fs::read(&path).unwrap_or_default();
        assert!(
            on_disk == seed.bytes,
            "{} is missing or stale: run `cargo run -p palisade-fuzz-entry --example make-seeds`",
            path.display()
        );
    }
}

#[test]
fn each_seed_catches_the_mutants_it_names() {
    let mut survived = Vec::new();
    for seed in seeds::all() {
        for &m in seed.catches {
            // A panic is a finding too: libFuzzer records it as a crash (the core's own
            // assertions fence some bugs, e.g. rule 2's on a reused attempt ID).
            let run = std::panic::catch_unwind(|| seed.target.run(&seed.bytes, Some(m)));
            if matches!(run, Ok(Ok(()))) {
                survived.push(format!("{} survived seed {}", m.name(), seed.name));
            }
        }
    }
    assert!(survived.is_empty(), "{}", survived.join("\n"));
}

#[test]
fn every_mutant_is_caught_by_some_seed_of_its_target() {
    let seeds = seeds::all();
    // A mutant of the engine's reading of the wire never reaches the core's targets (they
    // read no JSON): the simulator's sweep catches it.
    for m in Mutant::ALL.into_iter().filter(|m| m.in_core()) {
        let target = Target::for_mutant(m);
        assert!(
            seeds
                .iter()
                .any(|s| s.target == target && s.catches.contains(&m)),
            "no {} seed names {}",
            target.name(),
            m.name()
        );
    }
}

/// Inputs with which the fuzzer found real bugs in the core, kept in
/// `fuzz/regressions/<target>/`: each must now pass. (The first: `Core::restore` accepted a
/// generation history longer than its bound; `check_invariants` now rejects it.)
#[test]
fn known_findings_are_fixed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
    let mut failures = Vec::new();
    for target in Target::ALL {
        let Ok(dir) = std::fs::read_dir(root.join(target.name())) else {
            continue;
        };
        for entry in dir {
            let path = entry.expect("readable entry").path();
            let data = std::fs::read(&path).expect("readable regression input");
            let outcome = std::panic::catch_unwind(|| target.run(&data, None));
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(finding)) => failures.push(format!("{}: {finding}", path.display())),
                Err(_) => failures.push(format!("{}: panicked", path.display())),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
