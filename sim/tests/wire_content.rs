//! Wire content the simulated agents write (issue 29, class 5): the mutant
//! `update-scan-misreads-escapes` (a hand-written scanner of a `session/update`'s params
//! that takes the closing quote after an escaped backslash for an escaped one) is caught
//! by ground truth in each world that drives the engine, at the first seed; without the
//! mutant the same seeds hold.

mod common;

use std::path::Path;

use common::{describe, palisade};

const MUTANT: &str = "update-scan-misreads-escapes";

/// The repository root, where the scenarios are.
fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn the_update_scanner_mutant_is_caught_in_every_world_by_what_the_client_got() {
    for (scenario, seed, invariant) in [
        // The engine world: the client got a `null` where the agent wrote an update.
        ("swarm", "0", "R9-foreign-output"),
        // The stack world: the caller got an output event no agent wrote.
        ("stack-basic", "0", "S-output-altered"),
        // The proxy world: the agent's update never reached the client.
        ("proxy-basic", "0", "P-update-lost"),
    ] {
        let args = ["run", "--scenario", scenario, "--seed", seed];
        let held = palisade(root(), &args);
        assert!(
            held.status.success(),
            "{scenario} seed {seed} without the mutant: {}",
            describe(&held)
        );
        let mut mutated = args.to_vec();
        mutated.extend(["--mutant", MUTANT]);
        let out = palisade(root(), &mutated);
        // The verdict goes to stderr, the trace to stdout.
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.code() == Some(1)
                && text.contains(&format!("FAILED: {scenario} seed {seed}: {invariant}:"))
                && text.contains("(caught by ground-truth)"),
            "{scenario} seed {seed} with {MUTANT}: {}",
            describe(&out)
        );
    }
}
