//! The shipped binaries carry none of the simulator's test switches.
//!
//! `palisade-core` and `palisade-engine` have two test-only features: `mutants`
//! (re-created bugs, for the simulator and the fuzzer to catch) and `audit` (the reference
//! model checking every step); the core also has `harness`. Cargo unifies features across
//! the packages of one invocation, so `cargo test --workspace` builds `palisade-embed`'s
//! binaries with all of them. What a user installs is built from `palisade-embed` alone:
//! these tests check that such a build turns none of them on, and that the binaries the
//! tests run (`palisade_testkit::shipped`) are built that way. Each check has a positive
//! control that shows it can fail: the simulator's own build and binary carry both.

use std::process::Command;

/// The test-only features of the production crates.
const TEST_FEATURES: [&str; 3] = ["mutants", "audit", "harness"];

/// What `cargo tree` says `package`'s own build turns on in `crate_name` (normal
/// dependencies only: a `cargo build` of it links no dev-dependency).
fn features_of(package: &str, crate_name: &str) -> Vec<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(palisade_testkit::shipped::workspace_root())
        .args([
            "tree",
            "--locked",
            "--prefix",
            "none",
            "-e",
            "features,normal",
        ])
        .args(["-p", package, "-i", crate_name])
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree -p {package} -i {crate_name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let prefix = format!("{crate_name} feature \"");
    let mut features: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect();
    features.sort();
    features.dedup();
    features
}

#[test]
fn a_build_of_the_shipped_package_turns_on_no_test_feature() {
    for crate_name in ["palisade-core", "palisade-engine"] {
        let shipped = features_of("palisade-embed", crate_name);
        assert!(
            shipped.iter().all(|f| !TEST_FEATURES.contains(&f.as_str())),
            "palisade-embed's own build turns on {shipped:?} in {crate_name}"
        );
        // The control: the same question about the simulator finds them.
        let sim = features_of("palisade-sim", crate_name);
        for feature in ["mutants", "audit"] {
            assert!(
                sim.iter().any(|f| f == feature),
                "the simulator's build should turn on {feature} in {crate_name}: {sim:?}"
            );
        }
    }
}

/// Strings only the test switches put into a binary: rule names of the auditor's reports
/// and mutant names of the core's `Mutant::name`.
const TEST_ONLY_STRINGS: [&str; 3] = [
    "R1-join-bounded",
    "R7-one-turn",
    "tombstone-eviction-reopens",
];

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[test]
fn the_binaries_the_tests_run_carry_no_auditor_and_no_mutant() {
    for name in ["palisade-proxy", "palisade-supervise", "palisade-watchdog"] {
        let path = palisade_testkit::shipped::binary(name);
        let bytes = std::fs::read(&path).expect("the shipped binary is readable");
        for needle in TEST_ONLY_STRINGS {
            assert!(
                !holds(&bytes, needle),
                "{} holds {needle:?}: it was built with a test switch",
                path.display()
            );
        }
    }
    // The control: the simulator's binary, built with both switches, holds every one.
    let sim = std::fs::read(env!("CARGO_BIN_EXE_palisade")).expect("the palisade binary");
    for needle in TEST_ONLY_STRINGS {
        assert!(holds(&sim, needle), "the scan cannot see {needle:?}");
    }
}
