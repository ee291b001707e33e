//! # palisade-fuzz-entry
//!
//! The fuzz harnesses of `palisade-core`, as plain functions over bytes. The cargo-fuzz
//! targets in `fuzz/` (nightly, libFuzzer) are one line each around [`fuzz`]; a stable
//! `cargo test` of this crate replays every file of `fuzz/corpus/<target>/` through the
//! same functions, so CI without nightly still guards every input the fuzzer kept.
//!
//! Each entry function takes the bytes and a [`Mutant`]: with one switched on, the same
//! harness measures whether (and how fast) it sees that re-created bug.
//!
//! | target | what it attacks |
//! |---|---|
//! | [`callback_orderings`] | sequences of resume / prompt / cancel / bind / runtime reactions and forged callbacks with any attempt, execution, generation, stream events, load outcomes, leases, timeouts, clock jumps and snapshot-restarts; `check_invariants()` and the independent [`Auditor`](palisade_core::audit::Auditor) after every step, then a liveness phase and `check_quiescent` |
//! | [`classify`] | any load outcome under any agent profile: never a panic, the rule-6 table as an independent reference, and the core acting on it |
//! | [`snapshot_restore`] | arbitrary and bit-flipped snapshot bytes to `Core::restore` (a typed error, or a core that keeps its invariants and stays live under any further input); round trips of fuzzed states |
//! | [`delivery`] | the notification queue, the coalescer and the in-order receiver against a model: order, bounds, no loss |
//!
//! ```
//! use palisade_fuzz_entry::{Target, Mutant};
//!
//! // The real core survives the two-recovery seed; the core whose second re-prompt wraps
//! // the already-wrapped first one does not.
//! let seed = palisade_fuzz_entry::seeds::all()
//!     .into_iter()
//!     .find(|s| s.name == "recovery-re-prompts-twice")
//!     .unwrap();
//! assert!(Target::CallbackOrderings.run(&seed.bytes, None).is_ok());
//! let found = Target::CallbackOrderings.run(&seed.bytes, Some(Mutant::DoubleReplayBlock));
//! assert!(found.unwrap_err().rule.contains("R8-replay-once"));
//! ```
#![forbid(unsafe_code)]

mod bytes;
pub mod classify;
pub mod delivery;
pub mod orderings;
pub mod seeds;
pub mod snapshot;

use std::sync::OnceLock;

pub use bytes::Writer;
pub use palisade_core::mutants::Mutant;

/// A rule the harness saw broken: always a bug in the code under test (or a panic there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The target that found it.
    pub target: &'static str,
    /// The broken rule, e.g. `R2-fail-closed` or `delivery-no-loss`.
    pub rule: String,
    /// What was seen.
    pub detail: String,
    /// The operation (0-based) during which it was seen, when the target has operations;
    /// `None` for the liveness phase or a single-shot target.
    pub step: Option<usize>,
}

impl Finding {
    pub(crate) fn new(target: &'static str, rule: impl Into<String>, detail: String) -> Self {
        Finding {
            target,
            rule: rule.into(),
            detail,
            step: None,
        }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}] {}: {}", self.target, self.rule, self.detail)?;
        match self.step {
            Some(s) => write!(f, " (at operation {s})"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for Finding {}

/// The fuzz targets, named as in `fuzz/fuzz_targets/` and `fuzz/corpus/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// [`callback_orderings`].
    CallbackOrderings,
    /// [`classify`].
    Classify,
    /// [`snapshot_restore`].
    SnapshotRestore,
    /// [`delivery`].
    Delivery,
}

impl Target {
    /// Every target, in a fixed order.
    pub const ALL: [Target; 4] = [
        Target::CallbackOrderings,
        Target::Classify,
        Target::SnapshotRestore,
        Target::Delivery,
    ];

    /// The cargo-fuzz target name (also the corpus folder).
    pub const fn name(self) -> &'static str {
        match self {
            Target::CallbackOrderings => "callback_orderings",
            Target::Classify => "classify",
            Target::SnapshotRestore => "snapshot_restore",
            Target::Delivery => "delivery",
        }
    }

    /// Parses a target name.
    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Runs the target's entry function.
    pub fn run(self, data: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
        match self {
            Target::CallbackOrderings => callback_orderings(data, mutant),
            Target::Classify => classify(data, mutant),
            Target::SnapshotRestore => snapshot_restore(data, mutant),
            Target::Delivery => delivery(data, mutant),
        }
    }

    /// The target that exercises `mutant`: the two classifier mutants and the queue
    /// mutant live outside the core's state machine.
    pub fn for_mutant(mutant: Mutant) -> Target {
        match mutant {
            Mutant::SubstringFallback
            | Mutant::TimeoutFallback
            | Mutant::ListedConversationReplaced => Target::Classify,
            Mutant::QueueOverflowCloses | Mutant::BackpressureSkipsSeq => Target::Delivery,
            _ => Target::CallbackOrderings,
        }
    }
}

/// Sequences of operations against the core, audited after every step (see
/// [`orderings`]).
pub fn callback_orderings(data: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
    orderings::run(data, mutant)
}

/// Any load outcome through the classifier and the core (see [`mod@classify`]).
pub fn classify(data: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
    classify::run(data, mutant)
}

/// Arbitrary and fuzzed snapshots through `Core::restore` (see [`snapshot`]).
pub fn snapshot_restore(data: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
    snapshot::run(data, mutant)
}

/// Queue, coalescer and receiver operations against a model (see [`mod@delivery`]).
pub fn delivery(data: &[u8], mutant: Option<Mutant>) -> Result<(), Finding> {
    delivery::run(data, mutant)
}

/// The mutant named by `PALISADE_MUTANT` (kebab-case, as in `Mutant::name`), read once.
///
/// # Panics
/// On a name that is not a mutant: a typo must not silently measure the real core.
pub fn mutant_from_env() -> Option<Mutant> {
    static MUTANT: OnceLock<Option<Mutant>> = OnceLock::new();
    *MUTANT.get_or_init(|| match std::env::var("PALISADE_MUTANT") {
        Ok(name) if !name.is_empty() => {
            Some(Mutant::from_name(&name).unwrap_or_else(|| {
                panic!("PALISADE_MUTANT={name} is not a mutant; see Mutant::ALL")
            }))
        }
        _ => None,
    })
}

/// Whether `PALISADE_FUZZ_TRACE` is set: the harnesses then print every step to stderr
/// (for reading a crash artifact, not for fuzzing).
pub(crate) fn trace_enabled() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("PALISADE_FUZZ_TRACE").is_some_and(|v| !v.is_empty()))
}

/// The body of a cargo-fuzz target: runs `target` with the mutant of `PALISADE_MUTANT`
/// and panics on a finding, which libFuzzer records as a crash.
pub fn fuzz(target: Target, data: &[u8]) {
    if let Err(finding) = target.run(data, mutant_from_env()) {
        panic!("{finding}");
    }
}
