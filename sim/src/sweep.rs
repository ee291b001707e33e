//! A sweep: many seeds of one or more scenarios, in parallel, in a deterministic order.
//!
//! Which seeds run is a pure function of the scenarios, the seed range and the shard, so
//! shards of a sweep add up to the whole. Passing seeds keep only their hash, figures and
//! coverage marks; failing seeds keep their plan and trace for the failure file.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use palisade_core::mutants::Mutant;

use crate::mix::mix64;
use crate::plan::FaultPlan;
use crate::record::SeedRecord;
use crate::runner;
use crate::scenario::Resolved;
use crate::seeds::{SeedRange, Shard};

/// Default seeds per sweep for every other scenario. Together with the swarm's, the
/// default sweep of all shipped scenarios must finish in about a minute on 2 cores.
pub const DEFAULT_SEEDS: u64 = 2_000;

/// Failing seeds per scenario whose plan and trace are kept and written as failure files:
/// the lowest seeds, so the choice does not depend on the number of jobs. A mutant sweep
/// can fail every seed, and keeping every failing trace could take gigabytes; the others
/// are still counted and listed with the command that reproduces them.
pub const MAX_FAILURE_FILES_PER_SCENARIO: usize = 20;

/// Seeds one `palisade` process runs at most (a sweep, over all its scenarios, after
/// `--shard`; `mutants`, per mutant). Every seed keeps a record in memory until the
/// reports are written (a few hundred bytes, twice at the peak): four million is a couple
/// of gigabytes and, at about 1,500 seeds/s per core, most of an hour on two cores.
/// Larger sweeps are split with `--shard I/N` and joined with `palisade merge`.
pub const MAX_SEEDS_PER_RUN: u64 = 4_000_000;

/// The invariant recorded for a seed whose re-run gave another trace.
pub const DETERMINISM_INVARIANT: &str = "determinism";

/// How many seeds a sweep of `scenario` runs when `--seeds` is not given: its own
/// `[limits] default_seeds`, else [`DEFAULT_SEEDS`].
pub fn default_seeds(scenario: &crate::scenario::Scenario) -> u64 {
    scenario.limits.default_seeds.unwrap_or(DEFAULT_SEEDS)
}

/// Parses `--check-determinism F`: a fraction in (0, 1].
pub fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!(
            "bad fraction {s:?}: expected a number in (0, 1], e.g. 0.1"
        )),
    }
}

/// What a sweep is asked to do.
#[derive(Debug)]
pub struct SweepConfig {
    /// The scenarios, in order.
    pub scenarios: Vec<Resolved>,
    /// The seed range of each scenario (same order).
    pub ranges: Vec<SeedRange>,
    /// Only this shard's seeds.
    pub shard: Option<Shard>,
    /// Worker threads.
    pub jobs: usize,
    /// The mutant switched on in the core, if any.
    pub mutant: Option<Mutant>,
    /// Re-run this fraction of seeds and compare traces.
    pub check_determinism: Option<f64>,
    /// Show a progress line on stderr (only if it is a terminal).
    pub progress: bool,
    /// How plans are chosen (a guided strategy is never sharded).
    pub strategy: crate::search::Strategy,
    /// The plans a warm guided search runs first (`--strategy corpus`; empty otherwise).
    pub seed_plans: Vec<crate::search::SeedPlan>,
}

/// A seed whose re-run did not give the same trace.
#[derive(Clone, Debug)]
pub struct Divergence {
    /// Index into [`SweepConfig::scenarios`].
    pub scenario: usize,
    /// The seed.
    pub seed: u64,
    /// The first differing trace line, both versions.
    pub message: String,
}

/// Everything a sweep produced.
#[derive(Debug)]
pub struct SweepResult {
    /// One record per seed run, ordered by scenario then seed.
    pub records: Vec<SeedRecord>,
    /// Seeds re-run for `--check-determinism`.
    pub determinism_checked: u64,
    /// The re-runs that differed.
    pub divergences: Vec<Divergence>,
    /// Wall-clock time of the whole sweep.
    pub wall: Duration,
}

impl SweepResult {
    /// How many seeds failed (a divergence counts once per seed).
    pub fn failed(&self) -> u64 {
        let mut failed = self.records.iter().filter(|r| r.failure.is_some()).count() as u64;
        for d in &self.divergences {
            let already = self
                .records
                .iter()
                .any(|r| r.scenario == d.scenario && r.seed == d.seed && r.failure.is_some());
            if !already {
                failed += 1;
            }
        }
        failed
    }
}

/// One unit of work.
#[derive(Clone, Debug)]
struct Job {
    scenario: usize,
    seed: u64,
    keep_trace: bool,
    /// The plan a guided search made; `None`: drawn from the seed.
    plan: Option<FaultPlan>,
}

fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether `--check-determinism F` re-runs this seed: a fixed pseudo-random sample, the
/// same in every shard and at every number of jobs.
fn sampled(scenario: &str, seed: u64, fraction: f64) -> bool {
    let draw = mix64(seed ^ name_hash(scenario)) >> 11; // 53 bits, exact in f64
    (draw as f64) < fraction * (1u64 << 53) as f64
}

/// The index and both versions of the first line where two traces differ.
pub fn first_difference(a: &[String], b: &[String]) -> Option<(usize, String, String)> {
    let missing = || "<end of trace>".to_string();
    (0..a.len().max(b.len())).find_map(|i| match (a.get(i), b.get(i)) {
        (Some(x), Some(y)) if x == y => None,
        (x, y) => Some((
            i,
            x.cloned().unwrap_or_else(missing),
            y.cloned().unwrap_or_else(missing),
        )),
    })
}

/// Shortens a trace line for a one-line message.
pub fn clip(line: &str, max_chars: usize) -> String {
    if line.chars().count() <= max_chars {
        line.to_string()
    } else {
        let head: String = line.chars().take(max_chars).collect();
        format!("{head}…")
    }
}

/// Runs a sweep.
pub fn sweep(config: &SweepConfig) -> SweepResult {
    let started = Instant::now();
    let mut jobs = Vec::new();
    for (i, (resolved, range)) in config.scenarios.iter().zip(&config.ranges).enumerate() {
        // Only this shard's seeds are visited (the caller capped how many there are).
        let (first, step) = match config.shard {
            Some(s) => (range.start.saturating_add(s.index), s.count),
            None => (range.start, 1),
        };
        let step = usize::try_from(step).expect("MAX_SHARDS fits in usize");
        for seed in (first..range.end).step_by(step) {
            let keep_trace = config
                .check_determinism
                .is_some_and(|f| sampled(&resolved.scenario.name, seed, f));
            jobs.push(Job {
                scenario: i,
                seed,
                keep_trace,
                plan: None,
            });
        }
    }
    // At least one seed is re-checked when a check was asked for: when the sample of the
    // whole sweep (every shard's seeds) is empty, its first seed, which is shard 0's first.
    if let Some(f) = config.check_determinism {
        let whole_sample_empty = !config
            .scenarios
            .iter()
            .zip(&config.ranges)
            .any(|(r, range)| (range.start..range.end).any(|s| sampled(&r.scenario.name, s, f)));
        let first_of_sweep = config.ranges.first().map(|r| (0, r.start));
        if whole_sample_empty {
            if let Some(first) = jobs
                .first_mut()
                .filter(|j| Some((j.scenario, j.seed)) == first_of_sweep)
            {
                first.keep_trace = true;
            }
        }
    }

    // The lowest failing seeds of each scenario seen so far; a failure that falls out of
    // this set drops its plan and trace at once, so memory stays bounded.
    let retained = Mutex::new(vec![BTreeSet::<u64>::new(); config.scenarios.len()]);
    let run_job = |job: &Job| {
        let candidate = crate::search::Candidate {
            scenario: job.scenario,
            seed: job.seed,
            plan: job.plan.clone(),
        };
        let (mut rec, kept) = crate::search::run_candidate(
            &config.scenarios,
            &candidate,
            config.mutant,
            job.keep_trace,
        );
        if let Some(failure) = rec.failure.as_mut() {
            let mut sets = retained.lock().expect("no thread panics holding it");
            let set = &mut sets[job.scenario];
            set.insert(job.seed);
            if set.len() > MAX_FAILURE_FILES_PER_SCENARIO && set.pop_last() == Some(job.seed) {
                failure.drop_detail();
            }
        }
        (rec, kept)
    };
    let runs: Vec<(Job, SeedRecord, Option<Vec<String>>)> = match config.strategy {
        crate::search::Strategy::Uniform => {
            let mut progress = Progress::new(config.progress, jobs.len() as u64, "sweep");
            let results = runner::parallel_map(
                &jobs,
                config.jobs,
                run_job,
                None::<fn(&(SeedRecord, Option<Vec<String>>)) -> bool>,
                |_, (rec, _)| progress.tick(rec.failure.is_some()),
            );
            progress.finish();
            jobs.into_iter()
                .zip(results)
                .map(|(job, r)| {
                    let (rec, trace) = r.expect("nothing stops a sweep early");
                    (job, rec, trace)
                })
                .collect()
        }
        crate::search::Strategy::Coverage | crate::search::Strategy::Corpus => {
            // The guided search picks each seed's plan; the seeds are the same as uniform's
            // (every seed of every range, once), so the summary's counts are too — except
            // that a corpus entry runs under its own seed, in place of one of the range's
            // (within the range when the corpus was built with these ranges).
            let total = jobs.len() as u64;
            let mut progress = Progress::new(config.progress, total, "sweep (coverage)");
            let mut search = crate::search::Guided::new(
                &config.scenarios,
                crate::search::Budget::PerScenario(config.ranges.clone()),
            )
            .with_seed_plans(config.seed_plans.clone());
            let kept_jobs: BTreeSet<(usize, u64)> = jobs
                .iter()
                .filter(|j| j.keep_trace)
                .map(|j| (j.scenario, j.seed))
                .collect();
            // At least one run is re-checked when a check was asked for: the search's first.
            // (The range's first seed, which the sample falls back to, need not run at all:
            // a warm search runs its corpus entries under their own seeds first.)
            let first = config
                .check_determinism
                .and_then(|_| search.first_candidate());
            // A corpus entry's seed may lie outside the ranges: it is sampled as any seed.
            let keep = |scenario: usize, seed: u64| {
                kept_jobs.contains(&(scenario, seed))
                    || first == Some((scenario, seed))
                    || config.check_determinism.is_some_and(|f| {
                        sampled(&config.scenarios[scenario].scenario.name, seed, f)
                    })
            };
            let mut runs: Vec<(Job, SeedRecord, Option<Vec<String>>)> = crate::search::run_guided(
                &mut search,
                config.jobs,
                None,
                |c| {
                    run_job(&Job {
                        scenario: c.scenario,
                        seed: c.seed,
                        keep_trace: keep(c.scenario, c.seed),
                        plan: c.plan.clone(),
                    })
                },
                |rec| progress.tick(rec.failure.is_some()),
            )
            .into_iter()
            .map(|(c, rec, trace)| {
                let job = Job {
                    scenario: c.scenario,
                    seed: c.seed,
                    keep_trace: keep(c.scenario, c.seed),
                    plan: c.plan,
                };
                (job, rec, trace)
            })
            .collect();
            progress.finish();
            // Records are ordered by scenario then seed, as a uniform sweep's are.
            runs.sort_by_key(|(job, _, _)| (job.scenario, job.seed));
            runs
        }
    };

    let retained = retained.into_inner().expect("no thread panics holding it");
    let mut records = Vec::with_capacity(runs.len());
    let mut kept = Vec::new();
    for (job, mut rec, trace) in runs {
        if let Some(failure) = rec.failure.as_mut() {
            if !retained[rec.scenario].contains(&rec.seed) {
                failure.drop_detail();
            }
        }
        if let Some(trace) = trace {
            kept.push((job, rec.trace_hash, trace));
        }
        records.push(rec);
    }

    let mut divergences = Vec::new();
    let determinism_checked = kept.len() as u64;
    if !kept.is_empty() {
        let mut progress = Progress::new(config.progress, kept.len() as u64, "determinism");
        let reruns = runner::parallel_map(
            &kept,
            config.jobs,
            |(job, _, _)| {
                let candidate = crate::search::Candidate {
                    scenario: job.scenario,
                    seed: job.seed,
                    plan: job.plan.clone(),
                };
                crate::search::run_candidate(&config.scenarios, &candidate, config.mutant, true)
            },
            None::<fn(&(SeedRecord, Option<Vec<String>>)) -> bool>,
            |_, _| progress.tick(false),
        );
        progress.finish();
        for ((job, first_hash, first_trace), rerun) in kept.iter().zip(reruns) {
            let (rec, trace) = rerun.expect("nothing stops the check early");
            let trace = trace.unwrap_or_default();
            if rec.trace_hash == *first_hash && trace == *first_trace {
                continue;
            }
            let message = match first_difference(first_trace, &trace) {
                Some((i, a, b)) => format!(
                    "re-running the seed gave another trace: line {i} was `{}`, then `{}`",
                    clip(&a, 200),
                    clip(&b, 200)
                ),
                None => format!(
                    "re-running the seed gave the same lines but another hash ({} vs {})",
                    hex(*first_hash),
                    hex(rec.trace_hash)
                ),
            };
            divergences.push(Divergence {
                scenario: job.scenario,
                seed: job.seed,
                message,
            });
        }
    }

    SweepResult {
        records,
        determinism_checked,
        divergences,
        wall: started.elapsed(),
    }
}

/// A trace hash as 16 hex digits, or `none` for a seed that panicked.
pub fn hex(hash: Option<u64>) -> String {
    match hash {
        Some(h) => format!("{h:016x}"),
        None => "none".into(),
    }
}

/// A one-line progress display on stderr (an `indicatif` bar): seeds done of the total,
/// failures so far, rate and ETA. Drawn only when stderr is a terminal, so never in a CI
/// log; it reads nothing a seed computes but whether it failed, so never touches a trace
/// or its hash.
#[derive(Debug)]
pub struct Progress {
    bar: indicatif::ProgressBar,
    failed: u64,
}

impl Progress {
    /// A progress line for `total` items; hidden unless `wanted` and stderr is a terminal.
    pub fn new(wanted: bool, total: u64, label: &'static str) -> Self {
        let bar = if wanted && std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::with_draw_target(
                Some(total),
                indicatif::ProgressDrawTarget::stderr_with_hz(10),
            );
            let style = indicatif::ProgressStyle::with_template(
                "{prefix}: {wide_bar} {human_pos}/{human_len} seeds, {msg}, {per_sec}, ETA {eta}",
            )
            .expect("the template is valid");
            bar.set_style(style);
            bar.set_prefix(label);
            bar.set_message("0 failed");
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        Progress { bar, failed: 0 }
    }

    /// One more item done.
    pub fn tick(&mut self, failed: bool) {
        if failed {
            self.failed += 1;
            self.bar.set_message(format!("{} failed", self.failed));
        }
        self.bar.inc(1);
    }

    /// Clears the line.
    pub fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn determinism_sample_has_about_the_asked_size() {
        let n = (0..10_000).filter(|&s| sampled("swarm", s, 0.1)).count();
        assert!((800..1200).contains(&n), "{n}");
        assert!((0..100).all(|s| sampled("swarm", s, 1.0)));
    }

    #[test]
    fn first_difference_names_the_line() {
        let a = vec!["x".to_string(), "y".to_string()];
        let b = vec!["x".to_string(), "z".to_string()];
        assert_eq!(first_difference(&a, &b), Some((1, "y".into(), "z".into())));
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(first_difference(&a, &a[..1]).map(|d| d.0), Some(1));
    }
}
