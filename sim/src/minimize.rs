//! Shrinking a failing fault plan by delta debugging, while the same invariant still fails.
//!
//! Each round splits the faults into `n` chunks and tries the plan without each chunk;
//! the first (lowest) chunk whose removal still fails is dropped and the round repeats
//! with coarser chunks, otherwise with finer ones, until single faults cannot be removed
//! (Zeller's ddmin, complement-only). Candidates of a round run in parallel, and the
//! lowest failing one wins, so the result is the same at any number of jobs.

use std::path::Path;

use crate::failure::{FailureFile, Loaded, Minimized};
use crate::runner::{self, SeedRun, Timed};
use crate::scenario::Scenario;
use crate::sweep::PANIC_INVARIANT;
use crate::world::{FaultPlan, Mutant, SeedOutcome};

/// The most seed runs one minimisation may take: a bound on its time, not on its quality
/// (each round keeps the smallest failing plan found so far).
pub const MAX_RUNS: usize = 2_000;

/// The result of a minimisation.
#[derive(Debug)]
pub struct Shrunk {
    /// The smallest failing plan found.
    pub plan: FaultPlan,
    /// The run of that plan (it fails the same invariant); `None` when nothing could be
    /// removed and the original plan stands.
    pub run: Option<SeedRun>,
    /// Seed runs taken.
    pub runs: usize,
}

fn fails_same(run: &SeedRun, invariant: &str) -> bool {
    match run {
        SeedRun::Done(SeedOutcome {
            violation: Some(v), ..
        }) => v.invariant == invariant,
        SeedRun::Done(_) => false,
        SeedRun::Panicked { .. } => invariant == PANIC_INVARIANT,
    }
}

/// Runs a candidate plan. With a mutant, a candidate counts only if the same plan passes
/// on the real core: a plan shrunk so far that the scenario itself breaks (say, its
/// `[expect]` loses a step it counts on) would prove nothing about the mutant.
fn candidate_run(
    scenario: &Scenario,
    seed: u64,
    plan: &FaultPlan,
    mutant: Option<Mutant>,
    invariant: &str,
) -> SeedRun {
    let run = runner::run_isolated(scenario, seed, Some(plan.clone()), mutant).run;
    if mutant.is_some() && fails_same(&run, invariant) {
        let clean = runner::run_isolated(scenario, seed, Some(plan.clone()), None).run;
        let passes = matches!(
            &clean,
            SeedRun::Done(SeedOutcome {
                violation: None,
                ..
            })
        );
        if !passes {
            return SeedRun::Done(SeedOutcome {
                violation: None,
                ..match clean {
                    SeedRun::Done(o) => o,
                    SeedRun::Panicked { .. } => {
                        return SeedRun::Panicked {
                            message: "the shrunk plan panics on the real core".into(),
                        }
                    }
                }
            });
        }
    }
    run
}

fn with_faults(plan: &FaultPlan, faults: Vec<crate::world::Fault>) -> FaultPlan {
    let mut p = plan.clone();
    p.faults = faults;
    p
}

/// What fails: a scenario, seed and mutant, and the invariant that must keep failing.
#[derive(Clone, Copy, Debug)]
pub struct Failing<'a> {
    /// The scenario.
    pub scenario: &'a Scenario,
    /// The seed.
    pub seed: u64,
    /// The mutant switched on.
    pub mutant: Option<Mutant>,
    /// The invariant that must keep failing.
    pub invariant: &'a str,
}

/// Shrinks `plan` (which fails as `target` says) within `max_runs` seed runs on `jobs`
/// threads.
pub fn minimize(target: &Failing<'_>, plan: FaultPlan, jobs: usize, max_runs: usize) -> Shrunk {
    let Failing {
        scenario,
        seed,
        mutant,
        invariant,
    } = *target;
    let mut best = Shrunk {
        plan,
        run: None,
        runs: 0,
    };
    // Runs candidates in order and returns the first that still fails, if any.
    let try_all = |best: &mut Shrunk, candidates: Vec<FaultPlan>| -> bool {
        let budget = max_runs.saturating_sub(best.runs);
        let candidates: Vec<FaultPlan> = candidates.into_iter().take(budget).collect();
        if candidates.is_empty() {
            return false;
        }
        let results = runner::parallel_map(
            &candidates,
            jobs,
            |p| candidate_run(scenario, seed, p, mutant, invariant),
            Some(|run: &SeedRun| fails_same(run, invariant)),
            |_, _| {},
        );
        best.runs += results.iter().filter(|r| r.is_some()).count();
        for (candidate, result) in candidates.into_iter().zip(results) {
            if let Some(run) = result {
                if fails_same(&run, invariant) {
                    best.plan = candidate;
                    best.run = Some(run);
                    return true;
                }
            }
        }
        false
    };

    // The empty plan first: some failures need no fault at all.
    if !best.plan.faults.is_empty() {
        let empty = with_faults(&best.plan, Vec::new());
        try_all(&mut best, vec![empty]);
    }
    let mut n = 2usize;
    while best.plan.faults.len() >= 2 && best.runs < max_runs {
        let faults = &best.plan.faults;
        let len = faults.len();
        let n_now = n.min(len);
        let candidates: Vec<FaultPlan> = (0..n_now)
            .map(|i| {
                let (lo, hi) = (i * len / n_now, (i + 1) * len / n_now);
                let kept: Vec<crate::world::Fault> =
                    faults[..lo].iter().chain(&faults[hi..]).cloned().collect();
                with_faults(&best.plan, kept)
            })
            .collect();
        if try_all(&mut best, candidates) {
            n = (n_now - 1).max(2);
        } else if n_now >= len {
            break;
        } else {
            n = (n_now * 2).min(len);
        }
    }
    best
}

/// Minimises the failure of a loaded failure file; the result is a failure file to be
/// written at `out`. Errors are the input's fault (it does not fail as recorded).
pub fn minimize_file(
    loaded: &Loaded,
    out: &Path,
    jobs: usize,
    max_runs: usize,
) -> Result<FailureFile, String> {
    let file = &loaded.file;
    let scenario = &loaded.scenario.scenario;
    let target = Failing {
        scenario,
        seed: file.seed,
        mutant: loaded.mutant,
        invariant: &file.invariant,
    };
    // The plan to shrink, and a check that it fails as recorded.
    let baseline = runner::run_isolated(scenario, file.seed, file.plan.clone(), loaded.mutant);
    let plan = match (&baseline.run, &file.plan) {
        (_, Some(plan)) => plan.clone(),
        (SeedRun::Done(outcome), None) => outcome.plan.clone(),
        (SeedRun::Panicked { .. }, None) => {
            return Err(format!(
                "nothing to minimize: seed {} panics before it reports a fault plan",
                file.seed
            ))
        }
    };
    if !fails_same(&baseline.run, &file.invariant) {
        return Err(format!(
            "nothing to minimize: the failure no longer fails `{}` (try `palisade replay`)",
            file.invariant
        ));
    }
    let original_faults = plan.faults.len();
    let shrunk = minimize(&target, plan, jobs, max_runs.saturating_sub(1));
    let run = shrunk.run.unwrap_or(baseline.run);
    let (record, _) = crate::sweep::record(0, file.seed, Timed { run, wall_nanos: 0 }, false);
    let mut min = FailureFile::new(&loaded.scenario, &record, loaded.mutant, out, &file.commit);
    min.plan = Some(shrunk.plan);
    min.commit = crate::report::commit().to_string();
    min.minimized = Some(Minimized {
        original_faults: file
            .minimized
            .as_ref()
            .map_or(original_faults, |m| m.original_faults),
        faults: min_faults(&min),
        original_events: file
            .minimized
            .as_ref()
            .map_or(file.trace.len(), |m| m.original_events),
        events: min.trace.len(),
        runs: shrunk.runs + 1,
    });
    Ok(min)
}

fn min_faults(file: &FailureFile) -> usize {
    file.plan.as_ref().map_or(0, |p| p.faults.len())
}
