//! The stack world (the whole supervisor stack under the simulator): deterministic at any
//! `--jobs`, in a sweep or alone, and listed with its world.

mod common;

use common::{describe, palisade, read_json, Scratch};

/// The shipped stack scenarios.
const STACK: &[&str] = &[
    "stack-basic",
    "stack-exit-between-turns",
    "stack-disk-faults",
    "stack-crash-restart",
    "stack-caller-gone",
    "stack-crash-caller-stalled",
];

/// A seed's trace hash from `palisade run`'s last line (`held: … trace <hash>, …` or
/// `FAILED: …` followed by `  trace <hash>, …`).
fn run_hash(cwd: &std::path::Path, scenario: &str, seed: u64) -> String {
    let out = palisade(
        cwd,
        &["run", "--scenario", scenario, "--seed", &seed.to_string()],
    );
    // The trace goes to stdout, the verdict line to stderr.
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let at = text
        .rfind("trace ")
        .unwrap_or_else(|| panic!("no trace hash: {}", describe(&out)));
    text[at + 6..at + 22].to_owned()
}

#[test]
fn the_stack_world_gives_the_same_hashes_at_any_jobs_and_alone() {
    let dir = Scratch::new("stack-determinism");
    for scenario in STACK {
        let mut digests = Vec::new();
        for jobs in ["1", "2", "3"] {
            let report = format!("r{jobs}-{scenario}");
            let out = palisade(
                &dir.0,
                &[
                    "sweep",
                    "--scenario",
                    scenario,
                    "--seed-range",
                    "0..24",
                    "--jobs",
                    jobs,
                    "--check-determinism",
                    "1",
                    "--report-dir",
                    &report,
                ],
            );
            assert!(
                matches!(out.status.code(), Some(0 | 1)),
                "{}",
                describe(&out)
            );
            let summary = read_json(&dir.path(&report).join("summary.json"));
            assert!(
                summary["events"].as_u64().unwrap_or(0) > 24 * 20,
                "{summary}"
            );
            digests.push(summary["scenarios"][0]["digest"].clone());
        }
        assert!(
            digests.windows(2).all(|w| w[0] == w[1]),
            "{scenario}: digests differ across --jobs: {digests:?}"
        );
        // Alone, twice: the same hash.
        let a = run_hash(&dir.0, scenario, 7);
        let b = run_hash(&dir.0, scenario, 7);
        assert_eq!(a, b, "{scenario} seed 7 ran twice with different hashes");
    }
}

#[test]
fn scenarios_lists_the_stack_world() {
    let dir = Scratch::new("stack-list");
    let out = palisade(&dir.0, &["scenarios"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for scenario in STACK {
        assert!(
            text.lines()
                .any(|l| l.starts_with(scenario) && l.contains(" stack ")),
            "{scenario} not listed as a stack scenario:\n{text}"
        );
    }
}
