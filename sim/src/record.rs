//! A seed's record: what a sweep, a guided search and the scoreboard keep of one run (its
//! hash, figures and coverage; the plan and trace of a failure, for its failure file).

use std::collections::BTreeMap;

use crate::oracle::CaughtBy;
use crate::plan::FaultPlan;
use crate::runner::{SeedRun, SeedStats, Timed};

/// The invariant recorded for a seed that panicked.
pub const PANIC_INVARIANT: &str = "panic";

/// Why a seed failed, with what it takes to write its failure file.
#[derive(Clone, Debug)]
pub struct SeedFailure {
    /// The rule that broke (`panic` and `determinism` are the sweep's own).
    pub invariant: String,
    /// What happened.
    pub message: String,
    /// Indices of the trace events involved.
    pub events: Vec<u64>,
    /// The plan the seed ran (absent when it panicked before reporting one).
    pub plan: Option<FaultPlan>,
    /// The whole trace (empty when it panicked).
    pub trace: Vec<String>,
    /// The plan and trace were dropped (past [`crate::sweep::MAX_FAILURE_FILES_PER_SCENARIO`]): no
    /// failure file is written for this seed.
    pub detail_dropped: bool,
    /// The checker that found it.
    pub caught_by: CaughtBy,
}

impl SeedFailure {
    /// Drops the plan and trace: no failure file is written for this seed.
    pub(crate) fn drop_detail(&mut self) {
        self.plan = None;
        self.trace = Vec::new();
        self.detail_dropped = true;
    }
}

/// One seed's result.
#[derive(Clone, Debug)]
pub struct SeedRecord {
    /// Index into the scenarios run ([`crate::sweep::SweepConfig::scenarios`]).
    pub scenario: usize,
    /// The seed.
    pub seed: u64,
    /// The trace's rolling hash (absent when it panicked).
    pub trace_hash: Option<u64>,
    /// Figures.
    pub stats: SeedStats,
    /// Coverage marks hit.
    pub marks: BTreeMap<String, u64>,
    /// Edge coverage (see [`crate::runner::SeedOutcome::edges`]); kept only by a guided
    /// search, which steers by it.
    pub edges: Vec<u16>,
    /// The plan was made by the guided search (mutated or spliced), not drawn from the
    /// seed: only its failure file reproduces it, not `palisade run --seed`.
    pub guided_plan: bool,
    /// Wall-clock time of the seed's thread.
    pub wall_nanos: u64,
    /// Why it failed, if it did.
    pub failure: Option<SeedFailure>,
}

/// Converts a run into a record; returns the trace separately when it is to be kept.
pub fn record(
    scenario: usize,
    seed: u64,
    timed: Timed,
    keep_trace: bool,
) -> (SeedRecord, Option<Vec<String>>) {
    match timed.run {
        SeedRun::Done(outcome) => {
            let failure = outcome.violation.map(|v| SeedFailure {
                invariant: v.invariant,
                message: v.message,
                events: v.events,
                plan: Some(outcome.plan),
                trace: outcome.trace.lines.clone(),
                detail_dropped: false,
                caught_by: v.by,
            });
            let kept = keep_trace.then_some(outcome.trace.lines);
            (
                SeedRecord {
                    scenario,
                    seed,
                    trace_hash: Some(outcome.trace.hash),
                    stats: outcome.stats,
                    marks: outcome.marks,
                    edges: outcome.edges,
                    guided_plan: false,
                    wall_nanos: timed.wall_nanos,
                    failure,
                },
                kept,
            )
        }
        SeedRun::Panicked { message } => (
            SeedRecord {
                scenario,
                seed,
                trace_hash: None,
                stats: SeedStats::default(),
                marks: BTreeMap::new(),
                edges: Vec::new(),
                guided_plan: false,
                wall_nanos: timed.wall_nanos,
                failure: Some(SeedFailure {
                    invariant: PANIC_INVARIANT.into(),
                    message,
                    events: Vec::new(),
                    plan: None,
                    trace: Vec::new(),
                    detail_dropped: false,
                    caught_by: CaughtBy::World,
                }),
            },
            None,
        ),
    }
}
