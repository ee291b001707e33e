//! What both worlds' oracles share: the [`Violation`] every check reports and the
//! checker that caught it ([`CaughtBy`]), which checks decide a seed ([`Checks`]), and the
//! two readings of the engine's words both judge by: whether a failure blames the agent's
//! exit, and a prompt's text without its replay blocks.
//!
//! Each world has its own oracle on what its environment recorded: the engine world's
//! (`world/oracle.rs`) and the stack world's (`stack/oracle.rs`).

use std::sync::atomic::{AtomicU8, Ordering};

use palisade_engine::replay::REPLAY_BLOCK_TAG;
use palisade_engine::FailureCause;
use palisade_wire::{CloseReason, RpcFailure};
use serde::{Deserialize, Serialize};

/// Which checker found a violation. Only [`CaughtBy::GroundTruth`] and
/// [`CaughtBy::Liveness`] judge from what the environment recorded; the core-belief
/// checkers read what the core says about itself (its reference model follows the core's
/// own inputs and effects, its invariants read its fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaughtBy {
    /// The oracle, on what agents received and sent, what clients got, which processes
    /// ran: a safety check after a step.
    GroundTruth,
    /// The oracle's liveness check once the faults stopped (on the same records).
    Liveness,
    /// The core's reference model (`palisade_core::audit::Auditor`), fed the core's inputs,
    /// verdicts and effects.
    CoreModel,
    /// `Core::check_invariants`, which reads the core's fields.
    CoreInvariant,
    /// The world itself: a livelock, a bad configuration, a state that did not restore, a
    /// non-deterministic run, a panic.
    #[default]
    World,
}

impl CaughtBy {
    /// The kebab-case name used in reports.
    pub const fn name(self) -> &'static str {
        match self {
            CaughtBy::GroundTruth => "ground-truth",
            CaughtBy::Liveness => "liveness",
            CaughtBy::CoreModel => "core-model",
            CaughtBy::CoreInvariant => "core-invariant",
            CaughtBy::World => "world",
        }
    }

    /// Whether this is a judgement from the environment's records (ground truth or
    /// liveness), not from the core's view of itself.
    pub const fn is_behaviour(self) -> bool {
        matches!(self, CaughtBy::GroundTruth | CaughtBy::Liveness)
    }
}

/// Which checks decide a seed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Checks {
    /// Ground truth and liveness, plus the core-belief checks (the core's reference model
    /// and `check_invariants`) as an extra net: what every sweep runs.
    #[default]
    All,
    /// Ground truth and liveness only: proves that a failure is seen in behaviour, not in
    /// a value the core writes about itself (what `palisade mutants` runs).
    GroundTruth,
}

impl Checks {
    /// The kebab-case name used on the command line and in failure files.
    pub const fn name(self) -> &'static str {
        match self {
            Checks::All => "all",
            Checks::GroundTruth => "ground-truth",
        }
    }

    /// Parses a kebab-case name.
    pub fn from_name(name: &str) -> Option<Checks> {
        [Checks::All, Checks::GroundTruth]
            .into_iter()
            .find(|c| c.name() == name)
    }

    /// Whether this is the default (written to failure files only when it is not).
    pub fn is_all(&self) -> bool {
        *self == Checks::All
    }
}

/// The checks every seed runs from now on (process-wide; [`Checks::All`] unless set).
static CHECKS: AtomicU8 = AtomicU8::new(0);

/// Sets the checks every seed runs from now on (process-wide).
pub fn set_checks(checks: Checks) {
    CHECKS.store(
        match checks {
            Checks::All => 0,
            Checks::GroundTruth => 1,
        },
        Ordering::Relaxed,
    );
}

/// The checks seeds run.
pub fn checks() -> Checks {
    match CHECKS.load(Ordering::Relaxed) {
        0 => Checks::All,
        _ => Checks::GroundTruth,
    }
}

/// What broke: the rule, a message, the trace events involved and who saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Stable invariant id, e.g. `R2-fail-closed`.
    pub invariant: String,
    /// Human explanation.
    pub message: String,
    /// Indices into the trace of the events that broke it.
    pub events: Vec<u64>,
    /// The checker that found it.
    #[serde(default)]
    pub by: CaughtBy,
}

/// Whether a failure's cause says the agent's side of the connection ended: its process
/// exited or its stdout closed while a request (or nothing) was in flight.
pub(crate) fn blames_agent_exit(cause: &FailureCause) -> bool {
    let ended = |f: &RpcFailure| {
        matches!(
            f,
            RpcFailure::TransportClosed | RpcFailure::ProcessExited { .. }
        )
    };
    match cause {
        FailureCause::Initialize(f)
        | FailureCause::NewSession(f)
        | FailureCause::Load(f)
        | FailureCause::Prompt(f) => ended(f),
        FailureCause::Connection(r) => matches!(
            r,
            CloseReason::ProcessExited(_) | CloseReason::StdoutClosed | CloseReason::ReadFailed(_)
        ),
        _ => false,
    }
}

/// The text after every leading replay block.
pub(crate) fn strip_blocks(text: &str) -> &str {
    let mut rest = text;
    while rest.starts_with(REPLAY_BLOCK_TAG) {
        match rest.find("</palisade-resume>\n\n") {
            Some(end) => rest = &rest[end + "</palisade-resume>\n\n".len()..],
            None => break,
        }
    }
    rest
}

/// The `generation` of a prompt's first replay block, if it carries one.
pub(crate) fn replay_generation(text: &str) -> Option<u32> {
    replay_attribute(text, "generation")?.parse().ok()
}

/// The `delivered-through` count of a prompt's first replay block, if it carries one.
pub(crate) fn replay_delivered_through(text: &str) -> Option<u64> {
    replay_attribute(text, "delivered-through")?.parse().ok()
}

/// The value of attribute `name` of a prompt's first replay block, if it carries one.
fn replay_attribute<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let block = text.strip_prefix(REPLAY_BLOCK_TAG)?;
    let key = format!("{name}=\"");
    let rest = &block[block.find(&key)? + key.len()..];
    rest.get(..rest.find('"')?)
}
