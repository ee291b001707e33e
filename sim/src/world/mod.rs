//! The simulated world: actors, fault plan, oracle. The CLI and sweep layer call
//! [`run_seed`].

mod agenda;
mod dense;
pub(crate) mod oracle;
pub(crate) mod run;
pub(crate) mod trace;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use crate::plan::{self, FaultPlan};
use crate::scenario::Scenario;
pub use oracle::MARKS;
pub use palisade_core::mutants::Mutant;
pub use trace::EDGE_BITS;

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

/// Per-seed figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedStats {
    /// Trace events.
    pub events: u64,
    /// Simulated milliseconds.
    pub sim_millis: u64,
    /// Sessions simulated.
    pub sessions: u32,
    /// Prompt turns simulated.
    pub turns: u32,
}

/// The JSONL trace of one seed and its rolling hash.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// One JSON object per line.
    pub lines: Vec<String>,
    /// Rolling hash of the lines.
    pub hash: u64,
}

/// Everything one seed produced.
#[derive(Clone, Debug)]
pub struct SeedOutcome {
    /// The plan that ran.
    pub plan: FaultPlan,
    /// The trace.
    pub trace: Trace,
    /// The first violation, if any.
    pub violation: Option<Violation>,
    /// Figures.
    pub stats: SeedStats,
    /// Coverage marks hit (name → count).
    pub marks: BTreeMap<String, u64>,
    /// Edge coverage (buckets of consecutive event-kind pairs hit, ascending): what the
    /// guided search ([`crate::search`]) steers by. Never hashed or checked.
    pub edges: Vec<u16>,
}

/// When set, every seed keeps its trace lines (for `run`, `replay`, determinism checks);
/// otherwise only failing seeds do, by re-running with capture on.
static CAPTURE_ALL: AtomicBool = AtomicBool::new(false);

/// Keep the trace lines of every seed from now on (process-wide).
pub fn capture_all_traces(on: bool) {
    CAPTURE_ALL.store(on, Ordering::Relaxed);
}

fn run_once(
    scenario: &Scenario,
    seed: u64,
    plan: &FaultPlan,
    mutant: Option<Mutant>,
    capture: bool,
) -> run::Finished {
    let rt = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
    if scenario.world.kind == crate::scenario::WorldKind::Stack {
        return rt.block_on(crate::stack::run(
            Rc::new(scenario.clone()),
            seed,
            plan.clone(),
            mutant,
            capture,
        ));
    }
    rt.block_on(run::run(
        Rc::new(scenario.clone()),
        seed,
        plan.clone(),
        mutant,
        capture,
    ))
}

/// Runs one seed on the current thread (the caller, [`crate::runner`], picks the thread).
/// `plan = None` draws the plan from the seed; `Some` replays or shrinks an explicit plan.
/// A failing seed is run a second time with its trace captured; both runs must hash alike.
pub fn run_seed(
    scenario: &Scenario,
    seed: u64,
    plan: Option<FaultPlan>,
    mutant: Option<Mutant>,
) -> SeedOutcome {
    let plan = plan.unwrap_or_else(|| plan::draw(scenario, seed));
    let capture = CAPTURE_ALL.load(Ordering::Relaxed);
    let mut world = run_once(scenario, seed, &plan, mutant, capture);
    if world.violation.is_some() && !capture {
        let again = run_once(scenario, seed, &plan, mutant, true);
        if again.tracer.hash != world.tracer.hash {
            let mut again = again;
            again.violation = Some(Violation {
                invariant: "determinism".into(),
                message: format!(
                    "the same seed and plan gave trace hash {:016x}, then {:016x}",
                    world.tracer.hash, again.tracer.hash
                ),
                events: vec![],
                by: CaughtBy::World,
            });
            world = again;
        } else {
            world = again;
        }
    }
    let sim_millis = scenario.limits.fault_window_ms + scenario.limits.quiesce_ms;
    let sessions = plan
        .workload
        .active_sessions(scenario.workload.sessions)
        .len() as u32;
    let edges = world.tracer.edge_buckets();
    SeedOutcome {
        edges,
        plan,
        stats: SeedStats {
            events: world.tracer.len() as u64,
            sim_millis,
            sessions,
            turns: world.turns,
        },
        trace: Trace {
            hash: world.tracer.hash,
            lines: world.tracer.lines,
        },
        violation: world.violation,
        marks: world.marks,
    }
}
