//! Failure files: everything needed to replay one failing seed, byte for byte.
//!
//! A failure file names the scenario (and its version), the seed, the explicit fault plan,
//! the mutant, the invariant that broke and the whole trace. `palisade replay` re-runs
//! `(scenario, seed, plan, mutant)` and compares hashes; `palisade minimize` shrinks the plan
//! (its faults and how much of the scenario's workload runs).

use serde::{Deserialize, Serialize};
use std::path::Path;

use palisade_core::mutants::Mutant;

use crate::oracle::{CaughtBy, Checks};
use crate::plan::FaultPlan;
use crate::record::SeedRecord;
use crate::runner::SeedStats;
use crate::scenario::{self, Resolved};
use crate::sweep::hex;

/// The `format` field every failure file carries; anything else is a foreign file.
pub const FAILURE_FORMAT: &str = "palisade-failure/1";

/// Larger files are refused rather than read. The longest trace a run may record fits:
/// [`crate::scenario::MAX_EVENTS`] lines of about 220 bytes each, and the text of the
/// events they deliver, one copy of the trace the memory budget admits
/// ([`crate::memory::MAX_SEED_MEMORY_BYTES`] over [`crate::memory::TRACE_COPIES`]); and so
/// does the largest plan ([`crate::plan::MAX_PLAN_FAULTS`] faults, under 128 bytes
/// each as pretty JSON). Before the joint bound a failing seed of 16 KiB events could
/// write a file past the old 256 MiB, which `replay` then refused.
pub const MAX_FAILURE_FILE_BYTES: u64 =
    crate::memory::MAX_SEED_MEMORY_BYTES / crate::memory::TRACE_COPIES + (256 << 20);

const _: () = assert!(
    crate::scenario::MAX_EVENTS * 240 + crate::plan::MAX_PLAN_FAULTS as u64 * 128 <= 256 << 20
);

/// How a minimised failure compares with the one it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Minimized {
    /// Faults in the original plan.
    pub original_faults: usize,
    /// Faults left.
    pub faults: usize,
    /// Sessions whose clients ran in the original failure (0 in files of an older palisade).
    #[serde(default)]
    pub original_sessions: usize,
    /// Sessions whose clients run now.
    #[serde(default)]
    pub sessions: usize,
    /// Prompt turns the original failure simulated.
    #[serde(default)]
    pub original_turns: usize,
    /// Prompt turns simulated now.
    #[serde(default)]
    pub turns: usize,
    /// Trace events of the original failure.
    pub original_events: usize,
    /// Trace events now.
    pub events: usize,
    /// Seed runs the minimisation took.
    pub runs: usize,
}

/// One failing seed, as written to `failures/<scenario>-<seed>.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailureFile {
    /// Always [`FAILURE_FORMAT`].
    pub format: String,
    /// The scenario's name.
    pub scenario: String,
    /// The scenario's version when the failure was recorded.
    pub scenario_version: u32,
    /// How to find the scenario again: its name if shipped, else its path.
    pub scenario_file: String,
    /// The seed.
    pub seed: u64,
    /// The explicit fault plan (absent when the seed panicked before producing one; replay
    /// then draws it from the seed again).
    pub plan: Option<FaultPlan>,
    /// The mutant switched on, by name.
    pub mutant: Option<String>,
    /// The invariant that broke.
    pub invariant: String,
    /// Which checker saw it (absent in files of an older palisade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caught_by: Option<CaughtBy>,
    /// The checks the seed ran: `ground-truth` when the core-belief checks were off
    /// (absent: all of them). Replay and minimisation run the same checks.
    #[serde(default, skip_serializing_if = "Checks::is_all")]
    pub checks: Checks,
    /// What happened.
    pub message: String,
    /// Indices of the trace events involved.
    #[serde(default)]
    pub events: Vec<u64>,
    /// The trace's hash (16 hex digits), or `none` for a panic.
    pub trace_hash: String,
    /// The command line that reproduces it from the seed.
    pub repro: String,
    /// The command line that replays this file.
    pub replay: String,
    /// `git rev-parse HEAD` when it was recorded, or `unknown`.
    pub commit: String,
    /// The seed's figures.
    #[serde(default)]
    pub stats: SeedStats,
    /// Set when this file is the result of `palisade minimize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimized: Option<Minimized>,
    /// The JSONL trace, one event per element, exactly as hashed.
    pub trace: Vec<String>,
}

/// Quotes a command-line word for a POSIX shell when it needs it.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// `palisade run --scenario S --seed N [--mutant M] [--checks C]`, with the checks this
/// process runs (see [`crate::oracle::set_checks`]).
pub fn repro_command(scenario_spec: &str, seed: u64, mutant: Option<Mutant>) -> String {
    let mut command = format!(
        "palisade run --scenario {} --seed {seed}",
        shell_word(scenario_spec)
    );
    if let Some(m) = mutant {
        command.push_str(" --mutant ");
        command.push_str(m.name());
    }
    let checks = crate::oracle::checks();
    if !checks.is_all() {
        command.push_str(" --checks ");
        command.push_str(checks.name());
    }
    command
}

/// `palisade replay FILE`.
pub fn replay_command(file: &Path) -> String {
    format!(
        "palisade replay {}",
        shell_word(&file.display().to_string())
    )
}

impl FailureFile {
    /// The failure file for a failing seed, to be written at `path`.
    ///
    /// `record` must hold a failure.
    pub fn new(
        resolved: &Resolved,
        record: &SeedRecord,
        mutant: Option<Mutant>,
        path: &Path,
        commit: &str,
    ) -> Self {
        let failure = record
            .failure
            .as_ref()
            .expect("failure files are written for failing seeds only");
        let seed = record.seed;
        FailureFile {
            format: FAILURE_FORMAT.into(),
            scenario: resolved.scenario.name.clone(),
            scenario_version: resolved.scenario.version,
            scenario_file: resolved.spec.clone(),
            seed,
            plan: failure.plan.clone(),
            mutant: mutant.map(|m| m.name().to_string()),
            invariant: failure.invariant.clone(),
            caught_by: Some(failure.caught_by),
            checks: crate::oracle::checks(),
            message: failure.message.clone(),
            events: failure.events.clone(),
            trace_hash: hex(record.trace_hash),
            // A plan the guided search made is not drawn from the seed: only the file
            // (which carries it) reproduces it.
            repro: if record.guided_plan {
                replay_command(path)
            } else {
                repro_command(&resolved.spec, seed, mutant)
            },
            replay: replay_command(path),
            commit: commit.into(),
            stats: record.stats.clone(),
            minimized: None,
            trace: failure.trace.clone(),
        }
    }
}

/// A failure file, read, checked against the scenario it names, ready to re-run.
#[derive(Debug)]
pub struct Loaded {
    /// The file's content.
    pub file: FailureFile,
    /// The scenario, at the same version.
    pub scenario: Resolved,
    /// The mutant, parsed.
    pub mutant: Option<Mutant>,
}

/// Reads a failure file and finds its scenario. Every error is the input's fault and is
/// worded for the person who gave it: the file, the JSON path of the bad value, and the
/// bound it breaks.
pub fn load(path: &Path) -> Result<Loaded, String> {
    let shown = path.display();
    let file = parse(path)?;
    let mutant = match &file.mutant {
        None => None,
        Some(name) => Some(Mutant::from_name(name).ok_or_else(|| {
            format!(
                "{shown}: mutant: unknown mutant {name:?} (this build knows: {})",
                mutant_names()
            )
        })?),
    };
    // A failure file names its scenario by a shipped name or by the path of a `.toml`
    // file; it never makes palisade read anything else.
    if !file.scenario_file.ends_with(".toml") && !crate::input::is_plain_name(&file.scenario_file) {
        return Err(format!(
            "{shown}: scenario_file: {:?} is neither a scenario name nor a path to a .toml file",
            file.scenario_file
        ));
    }
    let scenario = scenario::resolve_one(&file.scenario_file)
        .map_err(|e| format!("{shown}: its scenario cannot be loaded: {e}"))?;
    if scenario.scenario.name != file.scenario {
        return Err(format!(
            "{shown}: recorded against scenario {:?}, but {} is now scenario {:?}: refusing to replay",
            file.scenario,
            scenario.file.display(),
            scenario.scenario.name
        ));
    }
    if scenario.scenario.version != file.scenario_version {
        return Err(format!(
            "{shown}: recorded against scenario {:?} version {}, but {} is version {}: refusing to replay a failure from another scenario version (record it again with `{}`)",
            file.scenario,
            file.scenario_version,
            scenario.file.display(),
            scenario.scenario.version,
            repro_command(&scenario.spec, file.seed, mutant),
        ));
    }
    if let Some(plan) = &file.plan {
        plan.validate(&scenario.scenario)
            .map_err(|e| format!("{shown}: {e}"))?;
    }
    Ok(Loaded {
        file,
        scenario,
        mutant,
    })
}

/// Reads and decodes a failure file, without looking at its scenario (what `diagram`
/// needs): capped at [`MAX_FAILURE_FILE_BYTES`], the format checked first, then decoded
/// once, straight from the bytes.
pub fn parse(path: &Path) -> Result<FailureFile, String> {
    let shown = path.display();
    let bytes = crate::input::read_capped(path, MAX_FAILURE_FILE_BYTES, "failure file")?;
    match format_of(&bytes) {
        Format::Failure => {}
        Format::Other(other) => {
            return Err(format!(
                "{shown}: not a failure file this palisade reads (its format is {other:?}, not {FAILURE_FORMAT:?})"
            ))
        }
        Format::Missing => {
            return Err(format!(
                "{shown}: not a palisade failure file (no \"format\": {FAILURE_FORMAT:?})"
            ))
        }
        Format::NotJson(e) => {
            return Err(format!("{shown}: not a palisade failure file (not JSON: {e})"))
        }
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("{shown}: malformed failure file: {e}"))
}

/// What a JSON document says its format is.
#[derive(Debug)]
pub enum Format {
    /// [`FAILURE_FORMAT`].
    Failure,
    /// Another format string.
    Other(String),
    /// A JSON object without a `format` string.
    Missing,
    /// Not a JSON object.
    NotJson(String),
}

/// The `format` field of a JSON object, read without building the rest of it.
pub fn format_of(bytes: &[u8]) -> Format {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(default)]
        format: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Probe>(bytes) {
        Ok(Probe {
            format: Some(serde_json::Value::String(f)),
        }) if f == FAILURE_FORMAT => Format::Failure,
        Ok(Probe {
            format: Some(serde_json::Value::String(f)),
        }) => Format::Other(f),
        Ok(_) => Format::Missing,
        // Valid JSON of another shape (an array, a number) has no format either.
        Err(e) if e.is_data() => Format::Missing,
        Err(e) => Format::NotJson(e.to_string()),
    }
}

/// Every mutant's name, comma-separated.
pub fn mutant_names() -> String {
    Mutant::ALL
        .iter()
        .map(|m| m.name())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_word("scenarios/swarm.toml"), "scenarios/swarm.toml");
        assert_eq!(shell_word("my dir/x.toml"), "'my dir/x.toml'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
