//! A seed's trace does not depend on the thread it runs on, nor on what that thread ran
//! before: the runner runs a sweep's seeds one after another on each worker (see
//! `palisade_sim::runner`), `palisade run` and `replay` give a seed a thread of its own.
//!
//! Every shipped scenario's seeds, and every regression file's failing seed with its mutant,
//! are run each on a fresh thread, then all on one worker in one order, then all on one
//! worker in the reverse order (so every seed follows different seeds, of other scenarios,
//! failing and passing, than before); each gives the same trace hash, edges and verdict
//! every time.

mod common;

use std::path::Path;

use palisade_core::mutants::Mutant;
use palisade_sim::failure;
use palisade_sim::plan::FaultPlan;
use palisade_sim::runner::{self, SeedRun};
use palisade_sim::scenario::{self, Resolved};

/// Seeds run per shipped scenario.
const SEEDS: u64 = 12;

/// One seed to run: its scenario, seed, plan (`None`: drawn from the seed) and mutant.
struct Job {
    scenario: Resolved,
    seed: u64,
    plan: Option<FaultPlan>,
    mutant: Option<Mutant>,
}

/// What a run gives that must not depend on the thread.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    hash: u64,
    edges: Vec<u16>,
    violation: Option<String>,
}

fn run(job: &Job) -> Seen {
    let timed = runner::run_isolated(
        &job.scenario.scenario,
        job.seed,
        job.plan.clone(),
        job.mutant,
    );
    match timed.run {
        SeedRun::Done(outcome) => Seen {
            hash: outcome.trace.hash,
            edges: outcome.edges,
            violation: outcome.violation.map(|v| v.invariant),
        },
        SeedRun::Panicked { message } => panic!(
            "{} seed {} panicked: {message}",
            job.scenario.scenario.name, job.seed
        ),
    }
}

fn jobs() -> Vec<Job> {
    let mut jobs = Vec::new();
    for resolved in scenario::resolve("all").expect("the shipped scenarios load") {
        for seed in 0..SEEDS {
            jobs.push(Job {
                scenario: resolved.clone(),
                seed: 1_000 + seed * 7,
                plan: None,
                mutant: None,
            });
        }
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../reports/regressions");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the regressions directory")
        .map(|entry| entry.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    for path in files {
        let loaded = failure::load(&path).unwrap_or_else(|e| panic!("{e}"));
        jobs.push(Job {
            scenario: loaded.scenario,
            seed: loaded.file.seed,
            plan: loaded.file.plan,
            mutant: loaded.mutant,
        });
    }
    jobs
}

#[test]
fn a_seed_runs_the_same_on_a_fresh_thread_and_after_any_other_seeds() {
    let jobs = jobs();
    let scenarios: std::collections::BTreeSet<_> = jobs
        .iter()
        .map(|j| j.scenario.scenario.name.as_str())
        .collect();
    assert!(scenarios.len() >= 17, "only {scenarios:?}");
    // Each on a fresh thread: this thread is no worker.
    let fresh: Vec<Seen> = jobs.iter().map(run).collect();
    let failing = fresh.iter().filter(|s| s.violation.is_some()).count();
    assert!(
        failing >= 15,
        "only {failing} runs failed: the regression files no longer fail"
    );
    // All on one worker, forwards, then backwards.
    let forwards = runner::parallel_map(&jobs, 1, run, None::<fn(&Seen) -> bool>, |_, _| {});
    let order: Vec<usize> = (0..jobs.len()).rev().collect();
    let backwards = runner::parallel_map(
        &order,
        1,
        |&i| run(&jobs[i]),
        None::<fn(&Seen) -> bool>,
        |_, _| {},
    );
    for (i, job) in jobs.iter().enumerate() {
        let name = format!(
            "{} seed {} mutant {:?}",
            job.scenario.scenario.name,
            job.seed,
            job.mutant.map(Mutant::name)
        );
        let forwards = forwards[i].as_ref().expect("ran forwards");
        let backwards = backwards[jobs.len() - 1 - i]
            .as_ref()
            .expect("ran backwards");
        assert_eq!(
            &fresh[i], forwards,
            "{name}: fresh thread vs after the seeds before it"
        );
        assert_eq!(
            &fresh[i], backwards,
            "{name}: fresh thread vs after the seeds after it"
        );
    }
}

/// What a seed runs (the core, the embedding's library, the sim) makes no map or set with
/// std's per-thread keys, whose order is the one thing a reused thread could carry from
/// the seeds before: the core's `IdMap` has a fixed hasher, everything else is ordered.
/// (The embedding's binaries run as processes of their own, never in a seed.)
#[test]
fn nothing_a_seed_runs_hashes_with_std_per_thread_keys() {
    let files = common::rust_sources(&["core/src", "embed/src", "sim/src"], &["embed/src/bin"]);
    assert!(files.len() > 40, "found only {} source files", files.len());
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        let fixed_hasher = file.ends_with("core/src/idmap.rs");
        for line in text.lines().map(str::trim) {
            // Code only: comments may name what they avoid.
            if line.starts_with("//") {
                continue;
            }
            let std_keys = ["RandomState", "hash_map::DefaultHasher", "HashSet", "AHash"]
                .iter()
                .any(|name| line.contains(name));
            let map = line.contains("HashMap");
            let allowed = fixed_hasher
                && (line.contains("BuildHasherDefault<IdHasher>")
                    || line == "use std::collections::HashMap;");
            if (std_keys || map) && !allowed {
                found.push(format!("{}: {line}", file.display()));
            }
        }
    }
    assert!(found.is_empty(), "maps keyed per thread: {found:#?}");
}
