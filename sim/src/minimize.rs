//! Shrinking a failing seed by delta debugging over its plan — the faults and the
//! scenario's own workload — while the same invariant still fails.
//!
//! A plan shrinks along these dimensions, each kept only while the invariant still fails:
//!
//! 1. **Horizon.** A run stops at its first violation, at simulated time `T`: nothing
//!    planned after `T` can matter, so faults after it are dropped and clients told to
//!    send nothing after it, in one step.
//! 2. **Sessions.** Zeller's ddmin (complement-only) over the sessions whose clients run;
//!    a session cut from the workload takes its faults with it.
//! 3. **Faults.** The empty plan first, then ddmin over the faults left.
//! 4. **Configuration and environment** a seed drew (swarm over configuration and
//!    environment): back to the scenario's own, all at once, else one field at a time.
//! 5. **Turns per session**, then **notifications per turn**: the smallest cap that still
//!    fails, searched from below.
//!
//! The passes repeat until none removes anything (or [`MAX_RUNS`] is spent): removing a
//! fault can let a session go, and the other way round.
//!
//! A candidate counts only if it fails the same invariant with no more trace events than
//! the original failure, so a minimised failure is never longer than the one it came from
//! (removing a cancellation can let the workload run on). Candidates of a round run in
//! parallel. When they are equally small (ddmin's complements), a round of at most
//! [`FULL_ROUND`] candidates runs in full and the failing one with the fewest trace events
//! wins (the lowest on a tie); otherwise the round stops at its lowest failing candidate
//! (for a cap, the smallest value). Either way the result is the same at any number of jobs.

use std::path::Path;

use palisade_core::mutants::Mutant;

use crate::failure::{FailureFile, Loaded, Minimized};
use crate::plan::setup::{Environment, RunConfig};
use crate::plan::{Fault, FaultPlan};
use crate::record::PANIC_INVARIANT;
use crate::runner::{self, SeedOutcome, SeedRun, Timed};
use crate::scenario::Scenario;

/// The most seed runs one minimisation may take: a bound on its time, not on its quality
/// (each round keeps the smallest failing plan found so far).
pub const MAX_RUNS: usize = 2_000;

/// Rounds of at most this many candidates run in full, so the failing candidate with the
/// fewest trace events can win; larger rounds (early ddmin over a hundred faults) stop at
/// the first failing candidate, or a round would cost a run per fault.
pub const FULL_ROUND: usize = 8;

/// Passes over every dimension, at most: a pass that removes something may let the next
/// remove more, but each pass costs a full sweep of candidates, so the tail is cut off.
const MAX_PASSES: usize = 3;

/// A cap of at most this much is searched value by value; above it, by quarters.
const DENSE_CAP: u32 = 8;

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

/// Trace events of a run (a panic records none).
fn events(run: &SeedRun) -> usize {
    match run {
        SeedRun::Done(o) => o.stats.events as usize,
        SeedRun::Panicked { .. } => 0,
    }
}

/// The simulated time of a run's violation: the time of its last trace event, since a run
/// stops at its first violation.
fn violation_ms(run: &SeedRun) -> Option<u64> {
    let SeedRun::Done(o) = run else { return None };
    o.violation.as_ref()?;
    let last = o.trace.lines.last()?;
    let event: serde_json::Value = serde_json::from_str(last).ok()?;
    event.get("t")?.as_u64()
}

/// Runs a candidate plan. With a mutant, a candidate counts only if the same plan passes
/// on the real core: a plan shrunk so far that the scenario itself breaks (say, its
/// `[expect]` loses a step it counts on, or a session it counts responses of) would prove
/// nothing about the mutant.
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

fn with_faults(plan: &FaultPlan, faults: Vec<Fault>) -> FaultPlan {
    let mut p = plan.clone();
    p.faults = faults;
    p
}

/// `plan` with only the clients (and faults) of `sessions`; world-wide faults stay.
fn with_sessions(plan: &FaultPlan, sessions: Vec<u32>) -> FaultPlan {
    let mut p = plan.clone();
    p.faults
        .retain(|f| f.is_global() || sessions.binary_search(&f.session).is_ok());
    p.workload.sessions = Some(sessions);
    p
}

/// The candidate values below `current` for a cap, ascending, none below `lo`: every one
/// when few, else a spread a quarter apart.
fn cap_candidates(lo: u32, current: u32) -> Vec<u32> {
    if current <= lo {
        return Vec::new();
    }
    if current - lo <= DENSE_CAP {
        return (lo..current).collect();
    }
    let span = current - lo;
    let mut values: Vec<u32> = [0, span / 4, span / 2, span * 3 / 4, span - 1]
        .iter()
        .map(|d| lo + d)
        .collect();
    values.dedup();
    values
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

/// One minimisation in progress: the best plan so far and the budget.
struct Search<'a> {
    target: Failing<'a>,
    jobs: usize,
    max_runs: usize,
    /// A candidate must fail with at most this many trace events (the original's).
    max_events: usize,
    best: Shrunk,
}

impl Search<'_> {
    fn spent(&self) -> bool {
        self.best.runs >= self.max_runs
    }

    /// Runs a round of candidates and keeps the winner, if one fails; returns its index.
    /// `alike`: the candidates are equally small, so a round of at most [`FULL_ROUND`]
    /// runs in full and the fewest trace events win; otherwise (or when larger) the
    /// lowest failing candidate wins.
    fn round(&mut self, candidates: Vec<FaultPlan>, alike: bool) -> Option<usize> {
        let budget = self.max_runs.saturating_sub(self.best.runs);
        let candidates: Vec<FaultPlan> = candidates.into_iter().take(budget).collect();
        if candidates.is_empty() {
            return None;
        }
        let Failing {
            scenario,
            seed,
            mutant,
            invariant,
        } = self.target;
        let full = alike && candidates.len() <= FULL_ROUND;
        let max_events = self.max_events;
        let accepts = |run: &SeedRun| fails_same(run, invariant) && events(run) <= max_events;
        let results = runner::parallel_map(
            &candidates,
            self.jobs,
            |p| candidate_run(scenario, seed, p, mutant, invariant),
            (!full).then_some(&accepts),
            |_, _| {},
        );
        self.best.runs += results.iter().filter(|r| r.is_some()).count();
        // Fewest events first, then the lowest index; a large round holds one at most.
        let winner = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().filter(|r| accepts(r)).map(|r| (i, r)))
            .min_by_key(|&(i, r)| (events(r), i))
            .map(|(i, _)| i)?;
        let run = results
            .into_iter()
            .nth(winner)
            .flatten()
            .expect("the winner ran");
        self.best.plan = candidates.into_iter().nth(winner).expect("in range");
        self.best.run = Some(run);
        Some(winner)
    }

    /// The run of the best plan, if one was found.
    fn best_run<'r>(&'r self, baseline: &'r SeedRun) -> &'r SeedRun {
        self.best.run.as_ref().unwrap_or(baseline)
    }

    /// Drops what is planned after the violation: faults after it, clients' work after it.
    fn horizon(&mut self, baseline: &SeedRun) {
        let Some(t) = violation_ms(self.best_run(baseline)) else {
            return;
        };
        let mut p = self.best.plan.clone();
        p.faults.retain(|f| f.at_ms <= t);
        let window = self.target.scenario.limits.fault_window_ms;
        // A client acting at `t` itself may be part of the failure: it may still act.
        let until = p.workload.until_ms(window).min(t + 1);
        if until < window {
            p.workload.until_ms = Some(until);
        }
        if p != self.best.plan {
            self.round(vec![p], false);
        }
    }

    /// ddmin over the sessions whose clients run.
    fn sessions(&mut self) {
        let all = self.target.scenario.workload.sessions;
        let mut n = 2usize;
        loop {
            let active = self.best.plan.workload.active_sessions(all);
            let len = active.len();
            if len < 2 || self.spent() {
                return;
            }
            let n_now = n.min(len);
            let candidates = (0..n_now)
                .map(|i| {
                    let (lo, hi) = (i * len / n_now, (i + 1) * len / n_now);
                    let kept = active[..lo].iter().chain(&active[hi..]).copied().collect();
                    with_sessions(&self.best.plan, kept)
                })
                .collect();
            if self.round(candidates, true).is_some() {
                n = (n_now - 1).max(2);
            } else if n_now >= len {
                return;
            } else {
                n = (n_now * 2).min(len);
            }
        }
    }

    /// The empty fault list, then ddmin over the faults.
    fn faults(&mut self) {
        if !self.best.plan.faults.is_empty() && !self.spent() {
            let empty = with_faults(&self.best.plan, Vec::new());
            self.round(vec![empty], false);
        }
        let mut n = 2usize;
        while self.best.plan.faults.len() >= 2 && !self.spent() {
            let faults = &self.best.plan.faults;
            let len = faults.len();
            let n_now = n.min(len);
            let candidates = (0..n_now)
                .map(|i| {
                    let (lo, hi) = (i * len / n_now, (i + 1) * len / n_now);
                    let kept = faults[..lo].iter().chain(&faults[hi..]).cloned().collect();
                    with_faults(&self.best.plan, kept)
                })
                .collect();
            if self.round(candidates, true).is_some() {
                n = (n_now - 1).max(2);
            } else if n_now >= len {
                break;
            } else {
                n = (n_now * 2).min(len);
            }
        }
    }

    /// The smallest cap that still fails, from below: `current` is the cap in force,
    /// `set` writes a cap into a plan.
    fn cap(&mut self, mut current: u32, set: impl Fn(&mut FaultPlan, u32)) {
        let mut lo = 0;
        while !self.spent() {
            let values = cap_candidates(lo, current);
            if values.is_empty() {
                return;
            }
            let candidates = values
                .iter()
                .map(|&v| {
                    let mut p = self.best.plan.clone();
                    set(&mut p, v);
                    p
                })
                .collect();
            let Some(i) = self.round(candidates, false) else {
                return;
            };
            // Values tried below the winner did not fail (or failed longer): start above.
            lo = if i == 0 { lo } else { values[i - 1] + 1 };
            current = values[i];
        }
    }

    /// The drawn configuration and environment, back toward the scenario's own: all of it
    /// at once, then one field at a time, while the invariant still fails.
    fn setup(&mut self) {
        let scenario = self.target.scenario;
        let (config, env) = (RunConfig::fixed(scenario), Environment::fixed(scenario));
        let whole = |p: &FaultPlan| {
            p.config.as_ref().is_none_or(|c| *c == config)
                && p.environment.as_ref().is_none_or(|e| *e == env)
        };
        if whole(&self.best.plan) || self.spent() {
            return;
        }
        let mut all = self.best.plan.clone();
        all.config = all.config.map(|_| config.clone());
        all.environment = all.environment.map(|_| env.clone());
        if self.round(vec![all], false).is_some() {
            return;
        }
        while !self.spent() {
            let plan = &self.best.plan;
            let mut candidates = Vec::new();
            if let Some(c) = &plan.config {
                for c in c.toward(&config) {
                    candidates.push(FaultPlan {
                        config: Some(c),
                        ..plan.clone()
                    });
                }
            }
            if let Some(e) = &plan.environment {
                for e in e.toward(&env) {
                    candidates.push(FaultPlan {
                        environment: Some(e),
                        ..plan.clone()
                    });
                }
            }
            // A cut of the notifications beyond the environment's own no longer holds.
            let most = |p: &FaultPlan| p.max_notifications(scenario);
            candidates.retain(|p| {
                p.workload
                    .notifications_per_turn
                    .is_none_or(|n| n <= most(p))
                    && p.validate(scenario).is_ok()
            });
            if self.round(candidates, false).is_none() {
                return;
            }
        }
    }

    fn turns(&mut self) {
        let turns = self.target.scenario.workload.turns_per_session;
        let current = self.best.plan.workload.turns(turns);
        self.cap(current, |p, v| p.workload.turns_per_session = Some(v));
    }

    fn notifications(&mut self) {
        let most = self.best.plan.max_notifications(self.target.scenario);
        let current = self.best.plan.workload.notifications(most);
        self.cap(current, |p, v| p.workload.notifications_per_turn = Some(v));
    }
}

/// Shrinks `plan` (which fails as `target` says, in `baseline`) within `max_runs` seed
/// runs on `jobs` threads.
pub fn minimize(
    target: &Failing<'_>,
    plan: FaultPlan,
    baseline: &SeedRun,
    jobs: usize,
    max_runs: usize,
) -> Shrunk {
    let mut search = Search {
        target: *target,
        jobs,
        max_runs,
        max_events: events(baseline),
        best: Shrunk {
            plan,
            run: None,
            runs: 0,
        },
    };
    search.horizon(baseline);
    for _ in 0..MAX_PASSES {
        let before = search.best.plan.clone();
        search.sessions();
        search.faults();
        search.setup();
        search.turns();
        search.notifications();
        search.horizon(baseline);
        if search.best.plan == before || search.spent() {
            break;
        }
    }
    search.best
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
    let sessions = scenario.workload.sessions;
    let before = Minimized {
        original_faults: plan.faults.len(),
        faults: plan.faults.len(),
        original_sessions: plan.workload.active_sessions(sessions).len(),
        sessions: plan.workload.active_sessions(sessions).len(),
        original_turns: file.stats.turns as usize,
        turns: file.stats.turns as usize,
        original_events: file.trace.len(),
        events: file.trace.len(),
        runs: 0,
    };
    let shrunk = minimize(
        &target,
        plan,
        &baseline.run,
        jobs,
        max_runs.saturating_sub(1),
    );
    let run = shrunk.run.unwrap_or(baseline.run);
    let (record, _) = crate::record::record(0, file.seed, Timed { run, wall_nanos: 0 }, false);
    let mut min = FailureFile::new(&loaded.scenario, &record, loaded.mutant, out, &file.commit);
    min.plan = Some(shrunk.plan);
    min.commit = crate::report::commit().to_string();
    // An original whose repro is not its seed's run ran a plan the guided search made: no
    // seed draws it (nor the minimised plan), so the minimised file's repro is its replay.
    if file.repro != min.repro {
        min.repro = min.replay.clone();
    }
    // A file minimised before keeps its first sizes as the originals; sizes a file of an
    // older palisade did not record are taken from the input.
    let prior = file.minimized.as_ref();
    let or_input = |recorded: Option<usize>, input: usize| recorded.unwrap_or(input);
    min.minimized = Some(Minimized {
        original_faults: or_input(prior.map(|m| m.original_faults), before.faults),
        faults: min_faults(&min),
        original_sessions: or_input(
            prior.map(|m| m.original_sessions).filter(|&n| n > 0),
            before.sessions,
        ),
        sessions: min.plan.as_ref().map_or(sessions as usize, |p| {
            p.workload.active_sessions(sessions).len()
        }),
        original_turns: or_input(
            prior.and_then(|m| (m.original_sessions > 0).then_some(m.original_turns)),
            before.turns,
        ),
        turns: min.stats.turns as usize,
        original_events: or_input(prior.map(|m| m.original_events), before.events),
        events: min.trace.len(),
        runs: shrunk.runs + 1,
    });
    Ok(min)
}

fn min_faults(file: &FailureFile) -> usize {
    file.plan.as_ref().map_or(0, |p| p.faults.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_candidates_are_dense_when_few_and_quartered_when_many() {
        assert_eq!(cap_candidates(0, 0), Vec::<u32>::new());
        assert_eq!(cap_candidates(0, 3), vec![0, 1, 2]);
        assert_eq!(cap_candidates(2, 5), vec![2, 3, 4]);
        assert_eq!(cap_candidates(0, 64), vec![0, 16, 32, 48, 63]);
        assert_eq!(cap_candidates(17, 32), vec![17, 20, 24, 28, 31]);
    }
}
