//! The shipped binaries, built as a user builds them, for the tests that run them.
//!
//! Cargo unifies features across the packages of one invocation: `cargo test --workspace`
//! builds `palisade-embed`'s binaries with every feature any member asks of
//! `palisade-core` and `palisade-engine` (the simulator's mutant switches and the
//! auditor). Those are not the binaries `cargo install --path embed` ships. So the tests
//! that run a binary ask for it here: it is built by a cargo invocation of its own
//! package alone (`cargo build --release --locked -p palisade-embed --bins`), into a
//! target directory of its own (`<target>/shipped`), once per test process (cargo makes
//! the later ones no-ops). `palisade-test-agent` is built the same way, by a second
//! invocation of its own package, so that nothing it asks of a shared crate reaches the
//! shipped binaries either.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The packages whose binaries a test may ask for, each built by its own invocation.
const PACKAGES: [&str; 2] = ["palisade-embed", "palisade-testkit"];

/// The workspace's root directory.
#[must_use]
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the test kit lives in a directory of the workspace")
        .to_path_buf()
}

/// Where the shipped binaries are built: `shipped/` in the workspace's target directory.
#[must_use]
pub fn target_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from);
    target.join("shipped")
}

/// The cargo that runs the tests (or the one on `PATH`).
fn cargo() -> PathBuf {
    std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from)
}

/// Builds every package's binaries, each by its own invocation; the directory holding them.
fn build() -> Result<PathBuf, String> {
    let target = target_dir();
    for package in PACKAGES {
        let output = Command::new(cargo())
            .current_dir(workspace_root())
            .args(["build", "--release", "--locked", "--bins", "-p", package])
            .arg("--target-dir")
            .arg(&target)
            .output()
            .map_err(|error| format!("cannot run cargo: {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "cargo build -p {package} failed ({}):\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    Ok(target.join("release"))
}

/// The path of the shipped binary `name` (`palisade-supervise`, `palisade-watchdog`,
/// `palisade-test-agent`), built on first use.
///
/// # Panics
///
/// When the build fails (the test cannot run without its binary; the message holds
/// cargo's output), or when `name` is not one of the binaries built.
#[must_use]
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = match BUILT.get_or_init(build) {
        Ok(dir) => dir,
        Err(error) => panic!("building the shipped binaries: {error}"),
    };
    let path = dir.join(name);
    assert!(path.is_file(), "{} was not built", path.display());
    path
}
