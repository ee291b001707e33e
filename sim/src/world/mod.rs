//! The simulated world: actors, fault plan, oracle. The CLI and sweep layer call
//! [`run_seed`].

pub(crate) mod agents;
pub(crate) mod oracle;
pub mod plan;
pub(crate) mod run;
pub(crate) mod trace;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::scenario::Scenario;
pub use oracle::MARKS;
pub use palisade_core::mutants::Mutant;
pub use plan::{DiskFaultClass, Fault, FaultKind, FaultPlan, LoadErrorClass, WorkloadCut};

/// What broke: the rule, a message, and the trace events involved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Stable invariant id, e.g. `R2-fail-closed`.
    pub invariant: String,
    /// Human explanation.
    pub message: String,
    /// Indices into the trace of the events that broke it.
    pub events: Vec<u64>,
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
    /// Wall time spent in the oracle (not measurable inside madsim: 0; compare a sweep
    /// with `PALISADE_ORACLE=off` instead).
    pub oracle_nanos: u64,
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

/// Runs one seed on the current thread (the caller gives each seed a fresh thread).
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
    SeedOutcome {
        plan,
        stats: SeedStats {
            events: world.tracer.len() as u64,
            sim_millis,
            sessions,
            turns: world.turns,
            oracle_nanos: 0,
        },
        trace: Trace {
            hash: world.tracer.hash,
            lines: world.tracer.lines,
        },
        violation: world.violation,
        marks: world.marks,
    }
}
