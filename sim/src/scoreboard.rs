//! The mutant scoreboard: does the testbed catch every re-created real bug?
//!
//! For each mutant, runs follow a search strategy ([`crate::search`]) until the first
//! failure or the bound: under `uniform`, seeds of every scenario in a fixed interleaved
//! order (seed 0 of every scenario, then seed 1, …); under `coverage`, the guided search's
//! generations (its corpus runs count). The count of seed runs up to and including that
//! failure is "seeds to first failure"; it does not depend on the number of jobs. The
//! first failure is written as a failure file and minimised.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use palisade_core::mutants::Mutant;

use crate::failure::{self, FailureFile, Minimized};
use crate::minimize;
use crate::oracle::{CaughtBy, Checks};
use crate::record::{self, SeedRecord};
use crate::report;
use crate::runner;
use crate::scenario::Resolved;
use crate::search::{self, Strategy};
use crate::sweep::Progress;

/// Seeds per scenario tried before a mutant counts as surviving.
pub const DEFAULT_SEEDS_PER_SCENARIO: u64 = 200;

/// Seed runs spent minimising each mutant's first failure.
pub const MINIMIZE_RUNS: usize = 200;

/// Why the production embedding cannot show a mutant's bug at all, so no sweep of it can
/// catch it: the core still fences the bug for embedders without the embedding's
/// guarantees, and the core's unit case and the fuzzer (which drive the core directly, with
/// any timing and any execution ID) catch it. `None` for every mutant a sweep must catch.
pub fn unreachable_reason(mutant: Mutant) -> Option<&'static str> {
    match mutant {
        Mutant::ToctouGeneration => Some(
            "no replacement can slip between a lease's check and its act in the production \
             embedding: the driver confirms a lease in the call that hands its effect out, \
             inputs raised meanwhile wait in its FIFO inbox, and only `Bound`, which hands out \
             no effect, rebinds an execution (under runtime reuse too: the engine binds a reused \
             process before any lease on it exists), so no later generation of an execution \
             appears while a lease on it is outstanding; and a production build of the core has \
             no mode in which the caller confirms leases itself (`LeaseCheck::ByCaller`, which \
             the core's tests and the fuzzer use to reach the gap, is feature `harness`)",
        ),
        _ => None,
    }
}

/// How a mutant was caught.
#[derive(Debug)]
pub struct Caught {
    /// The scenario's name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// Seed runs up to and including the first failure.
    pub runs_to_failure: u64,
    /// The invariant that broke.
    pub invariant: String,
    /// The checker that saw it.
    pub caught_by: CaughtBy,
    /// The failure file, relative to the report directory.
    pub file: String,
    /// The minimised failure file and its sizes, when minimisation worked.
    pub minimized: Option<(String, Minimized)>,
}

/// One mutant's line of the scoreboard.
#[derive(Debug)]
pub struct MutantResult {
    /// The mutant.
    pub mutant: Mutant,
    /// Seed runs made.
    pub runs: u64,
    /// How it was caught, if it was.
    pub caught: Option<Caught>,
    /// For a mutant no run caught: its runs compared with the same search's without it.
    pub equivalence: Option<Equivalence>,
}

/// One strategy's scoreboard.
#[derive(Debug)]
pub struct StrategyResults {
    /// The strategy.
    pub strategy: Strategy,
    /// One line per mutant run, in [`Mutant::ALL`] order.
    pub results: Vec<MutantResult>,
}

/// Runs the scoreboard of `mutants` (in [`Mutant::ALL`] order; every one for the
/// scoreboard proper) under each of `strategies` and stages the failure files in `report`;
/// `mutants.md` is staged by the caller from [`render`], and the caller commits the whole
/// report.
#[allow(clippy::too_many_arguments)]
pub fn run(
    scenarios: &[Resolved],
    mutants: &[Mutant],
    seeds: u64,
    jobs: usize,
    minimize_runs: usize,
    strategies: &[Strategy],
    seed_plans: &[search::SeedPlan],
    report: &mut report::ReportWriter,
    progress: bool,
) -> Result<Vec<StrategyResults>, report::ReportError> {
    let mut out = Vec::new();
    for &strategy in strategies {
        let results = run_one(
            scenarios,
            mutants,
            seeds,
            jobs,
            minimize_runs,
            strategy,
            seed_plans,
            // Two strategies in one report: the second's files are named apart.
            (strategy != strategies[0]).then_some(strategy),
            report,
            progress,
        )?;
        out.push(StrategyResults { strategy, results });
    }
    Ok(out)
}

/// The runs of one search, in the order made, up to and including the first that
/// `catches` accepts (the search stops there). `mutant` is switched on in every run.
#[allow(clippy::too_many_arguments)]
fn search_runs(
    scenarios: &[Resolved],
    seeds: u64,
    jobs: usize,
    strategy: Strategy,
    seed_plans: &[search::SeedPlan],
    mutant: Option<Mutant>,
    catches: &(dyn Fn(&SeedRecord) -> bool + Sync),
    bar: &mut Progress,
) -> Vec<SeedRecord> {
    let total = seeds.saturating_mul(scenarios.len() as u64);
    match strategy {
        Strategy::Uniform => {
            let items: Vec<(usize, u64)> = (0..seeds)
                .flat_map(|seed| (0..scenarios.len()).map(move |s| (s, seed)))
                .collect();
            let outcomes = runner::parallel_map(
                &items,
                jobs,
                |&(s, seed)| {
                    let timed = runner::run_isolated(&scenarios[s].scenario, seed, None, mutant);
                    record::record(s, seed, timed, false).0
                },
                Some(catches),
                |_, r| bar.tick(r.failure.is_some()),
            );
            // Runs past a catch were skipped (`None`); the ones before it all ran.
            let mut runs = Vec::new();
            for record in outcomes.into_iter().flatten() {
                let caught = catches(&record);
                runs.push(record);
                if caught {
                    break;
                }
            }
            runs
        }
        Strategy::Coverage | Strategy::Corpus => {
            let seeds = if strategy == Strategy::Corpus {
                seed_plans.to_vec()
            } else {
                Vec::new()
            };
            let mut guided = search::Guided::new(scenarios, search::Budget::Shared { total })
                .with_seed_plans(seeds);
            search::run_guided(
                &mut guided,
                jobs,
                Some(catches),
                |c| (search::run_candidate(scenarios, c, mutant, false).0, ()),
                |r| bar.tick(r.failure.is_some()),
            )
            .into_iter()
            .map(|(_, r, ())| r)
            .collect()
        }
    }
}

/// For each mutant: the runs made and the first failing run, if any; and, for a mutant
/// [`unreachable_reason`] names, whether its runs are the unmutated runs exactly.
fn first_failures(
    scenarios: &[Resolved],
    seeds: u64,
    jobs: usize,
    strategy: Strategy,
    seed_plans: &[search::SeedPlan],
    mutant: Mutant,
    progress: bool,
) -> (u64, Option<(u64, SeedRecord)>, Option<Equivalence>) {
    let total = seeds.saturating_mul(scenarios.len() as u64);
    let mut bar = Progress::new(progress, total, mutant.name());
    // Judged by behaviour alone (`--checks ground-truth`), a run catches the mutant only
    // when ground truth or liveness failed it: a world check failing first (the engine
    // refusing to restore its own state after a crash, a livelock, a panic) is passed over,
    // and the search goes on until behaviour shows the bug. With every checker on, any
    // failure catches it.
    let by_behaviour = crate::oracle::checks() == Checks::GroundTruth;
    let catches = move |r: &SeedRecord| {
        r.failure
            .as_ref()
            .is_some_and(|f| !by_behaviour || f.caught_by.is_behaviour())
    };
    let mut runs = search_runs(
        scenarios,
        seeds,
        jobs,
        strategy,
        seed_plans,
        Some(mutant),
        &catches,
        &mut bar,
    );
    bar.finish();
    let n = runs.len() as u64;
    let first = match runs.last() {
        Some(r) if catches(r) => runs.pop().map(|r| (n, r)),
        _ => None,
    };
    // A mutant not caught: were its runs the unmutated runs? For a mutant called
    // unreachable that is the claim, checked and not trusted; for any other it tells a
    // path these scenarios never reach (the mutant still survives) from behaviour they
    // reach and no check caught. The same search without the mutant must make the very
    // same runs, trace for trace (a guided search steers by what its runs showed, so equal
    // traces mean equal plans).
    let equivalence = first.is_none().then(|| {
        let mut bar = Progress::new(progress, total, "(unmutated)");
        let none = |_: &SeedRecord| false;
        let plain = search_runs(
            scenarios, seeds, jobs, strategy, seed_plans, None, &none, &mut bar,
        );
        bar.finish();
        Equivalence::of(scenarios, &runs, &plain)
    });
    (n, first, equivalence)
}

/// Whether a mutant's runs were the unmutated runs exactly: the evidence behind
/// [`unreachable_reason`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Equivalence {
    /// Every run's trace hash equals the same run's without the mutant.
    Same {
        /// Runs compared.
        runs: u64,
    },
    /// The first run whose trace differs (or that one side did not make): the mutant
    /// changed behaviour that no check caught, so it survived.
    Differs {
        /// The run's position, from 1.
        run: u64,
        /// The scenario's name.
        scenario: String,
        /// The seed.
        seed: u64,
    },
}

impl Equivalence {
    /// Compares a mutant's runs with the unmutated ones, position by position: the same
    /// scenario and seed, and the same trace hash (a panicked run, with none, differs).
    fn of(scenarios: &[Resolved], mutated: &[SeedRecord], plain: &[SeedRecord]) -> Equivalence {
        match first_difference(mutated, plain) {
            None => Equivalence::Same {
                runs: mutated.len() as u64,
            },
            Some((i, scenario, seed)) => Equivalence::Differs {
                run: i as u64 + 1,
                scenario: scenarios[scenario].scenario.name.clone(),
                seed,
            },
        }
    }
}

/// The first position where two run lists differ: (position, scenario index, seed).
fn first_difference(a: &[SeedRecord], b: &[SeedRecord]) -> Option<(usize, usize, u64)> {
    (0..a.len().max(b.len())).find_map(|i| match (a.get(i), b.get(i)) {
        (Some(x), Some(y))
            if (x.scenario, x.seed, x.trace_hash) == (y.scenario, y.seed, y.trace_hash)
                && x.trace_hash.is_some() =>
        {
            None
        }
        (Some(r), _) | (None, Some(r)) => Some((i, r.scenario, r.seed)),
        (None, None) => None,
    })
}

impl Equivalence {
    /// One line for people.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            Equivalence::Same { runs } => {
                format!("{runs} runs, every trace hash equal to the same run's without the mutant")
            }
            Equivalence::Differs {
                run,
                scenario,
                seed,
            } => format!(
                "run {run} ({scenario} seed {seed}) differs from the same run without the mutant"
            ),
        }
    }
}

impl MutantResult {
    /// Whether the mutant survived: not caught, and either reachable or its runs differ
    /// from the unmutated ones.
    #[must_use]
    pub fn survived(&self) -> bool {
        self.caught.is_none()
            && (unreachable_reason(self.mutant).is_none()
                || !matches!(self.equivalence, Some(Equivalence::Same { .. })))
    }

    /// Whether the mutant is listed unreachable and its runs were the unmutated runs.
    #[must_use]
    pub fn shown_unreachable(&self) -> bool {
        self.caught.is_none() && !self.survived()
    }
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    scenarios: &[Resolved],
    mutants: &[Mutant],
    seeds: u64,
    jobs: usize,
    minimize_runs: usize,
    strategy: Strategy,
    seed_plans: &[search::SeedPlan],
    file_suffix: Option<Strategy>,
    report: &mut report::ReportWriter,
    progress: bool,
) -> Result<Vec<MutantResult>, report::ReportError> {
    let mut results = Vec::new();
    for &mutant in mutants {
        let (runs, first, equivalence) = first_failures(
            scenarios, seeds, jobs, strategy, seed_plans, mutant, progress,
        );
        let caught = match first {
            None => None,
            Some((n, rec)) => Some(write_caught(
                scenarios,
                mutant,
                n,
                &rec,
                file_suffix,
                report,
                jobs,
                minimize_runs,
            )?),
        };
        results.push(MutantResult {
            mutant,
            runs,
            caught,
            equivalence,
        });
    }
    Ok(results)
}

#[allow(clippy::too_many_arguments)]
fn write_caught(
    scenarios: &[Resolved],
    mutant: Mutant,
    runs_to_failure: u64,
    rec: &SeedRecord,
    file_suffix: Option<Strategy>,
    report: &mut report::ReportWriter,
    jobs: usize,
    minimize_runs: usize,
) -> Result<Caught, report::ReportError> {
    let resolved = &scenarios[rec.scenario];
    let name = &resolved.scenario.name;
    let suffix = match file_suffix {
        Some(s) => format!("{}-{}", mutant.name(), s.name()),
        None => mutant.name().to_string(),
    };
    let rel = report::failure_file_name(name, rec.seed, Some(&suffix));
    let path = report.dir().join(&rel);
    let file = FailureFile::new(resolved, rec, Some(mutant), &path, report::commit());
    report.stage(&rel, &report::json_bytes(&file))?;

    let min_rel = rel.replace(".json", ".min.json");
    let min_path = report.dir().join(&min_rel);
    let loaded = failure::Loaded {
        file: file.clone(),
        scenario: resolved.clone(),
        mutant: Some(mutant),
    };
    let shrunk = (minimize_runs > 0)
        .then(|| minimize::minimize_file(&loaded, &min_path, jobs, minimize_runs));
    let minimized = match shrunk {
        None => None,
        Some(Ok(min)) => {
            report.stage(&min_rel, &report::json_bytes(&min))?;
            min.minimized.map(|m| (min_rel, m))
        }
        // The failure did not repeat on a re-run: the scoreboard says so (no minimised
        // file) rather than hiding it; `palisade replay` on the file shows the divergence.
        Some(Err(_)) => None,
    };
    let invariant = file.invariant.clone();
    let caught_by = rec
        .failure
        .as_ref()
        .map_or(CaughtBy::World, |f| f.caught_by);
    Ok(Caught {
        scenario: name.clone(),
        seed: rec.seed,
        runs_to_failure,
        invariant,
        caught_by,
        file: rel,
        minimized,
    })
}

/// `mutants.md`.
/// Seed runs to first failure of the caught mutants: (median, max).
pub fn median_max(results: &[MutantResult]) -> (Option<u64>, Option<u64>) {
    let mut sorted: Vec<u64> = results
        .iter()
        .filter_map(|r| r.caught.as_ref().map(|c| c.runs_to_failure))
        .collect();
    sorted.sort_unstable();
    (
        sorted.get(sorted.len().saturating_sub(1) / 2).copied(),
        sorted.last().copied(),
    )
}

/// `mutants.md`: the first strategy's full table, then, with more than one strategy, seed
/// runs to first failure per mutant per strategy side by side.
pub fn render(
    all: &[StrategyResults],
    seeds: u64,
    scenarios: &[Resolved],
    dir: &Path,
    checks: Checks,
) -> String {
    let Some(first) = all.first() else {
        return String::from("# Mutant scoreboard\n\nNo strategy ran.\n");
    };
    let results = &first.results;
    let caught: Vec<u64> = results
        .iter()
        .filter_map(|r| r.caught.as_ref().map(|c| c.runs_to_failure))
        .collect();
    let (median, max) = median_max(results);
    let mut md = String::from("# Mutant scoreboard\n\n");
    let how = match first.strategy {
        Strategy::Uniform => "interleaved (seed 0 of every scenario, then seed 1, …)".to_string(),
        Strategy::Coverage => {
            "by the coverage-guided search (`--strategy coverage`: fresh seeds and mutants of \
             the plans that found new coverage; every run counts, the corpus's included)"
                .to_string()
        }
        Strategy::Corpus => {
            "by the coverage-guided search started from the shipped seed corpus (`--strategy \
             corpus`: `scenarios/corpus.json`'s plans first, then as `coverage`; every run \
             counts, the corpus's replays included)"
                .to_string()
        }
    };
    let _ = writeln!(
        md,
        "Every mutant of `palisade-core` re-creates a real bug from the reviews of kandev #3636 and compozy #454. \
         Each is swept over {} scenarios × up to {seeds} seeds, {how}, \
         until the first failure. Generated by `palisade mutants --strategy {}`; commit `{}`.\n",
        scenarios.len(),
        if all.len() > 1 { "all".to_string() } else { first.strategy.name().to_string() },
        report::commit()
    );
    let _ = writeln!(
        md,
        "{}\n",
        match checks {
            Checks::GroundTruth => {
                "Checks: **ground truth and liveness only** (`--checks ground-truth`): the core's \
                 reference model and `check_invariants`, which read what the core says about \
                 itself, are off, so a mutant counts as caught only by its behaviour — what the \
                 agents received and sent, what the clients got, which processes ran. A run \
                 that fails a world check instead (the engine refusing to restore its own \
                 state after a crash, a livelock, a panic) does not count: the search goes on \
                 until ground truth or liveness fails a run."
            }
            Checks::All => {
                "Checks: all (`--checks all`): the core-belief checks (its reference model and \
                 `check_invariants`) run beside ground truth and liveness; the column \"caught \
                 by\" says which saw each mutant first."
            }
        }
    );
    let by_behaviour = results
        .iter()
        .filter(|r| {
            r.caught
                .as_ref()
                .is_some_and(|c| c.caught_by.is_behaviour())
        })
        .count();
    let reachable = results
        .iter()
        .filter(|r| unreachable_reason(r.mutant).is_none())
        .count();
    let _ = writeln!(
        md,
        "**{} of {} caught**, {} by behaviour (ground truth or liveness){}; seed runs \
         to first failure: median {}, max {}.\n",
        caught.len(),
        reachable,
        by_behaviour,
        match results.len() - reachable {
            0 => String::new(),
            1 => " (1 mutant the production embedding cannot show, below)".to_string(),
            n => format!(" ({n} mutants the production embedding cannot show, below)"),
        },
        median.map_or("–".into(), |m| m.to_string()),
        max.map_or("–".into(), |m| m.to_string()),
    );
    let mut ratios: Vec<f64> = results
        .iter()
        .filter_map(|r| r.caught.as_ref()?.minimized.as_ref())
        .map(|(_, m)| events_ratio(m))
        .collect();
    ratios.sort_by(f64::total_cmp);
    if let (Some(median), Some(max)) = (
        ratios.get(ratios.len().saturating_sub(1) / 2),
        ratios.last(),
    ) {
        let _ = writeln!(
            md,
            "Minimised failures keep {} of the original trace events at the median, {} at most \
             (faults, sessions whose clients run, prompt turns and trace events, original → minimised).\n",
            percent(*median),
            percent(*max),
        );
    }
    let _ = writeln!(
        md,
        "| mutant | caught | seeds to first failure | scenario | seed | invariant | caught by | replay file | minimised (faults, sessions, turns, events) |\n|---|---|---:|---|---:|---|---|---|---|"
    );
    for r in results {
        match &r.caught {
            Some(c) => {
                let min = match &c.minimized {
                    Some((file, m)) => format!(
                        "{} → {}, {} → {}, {} → {}, {} → {} ({}) ([file]({}))",
                        m.original_faults,
                        m.faults,
                        m.original_sessions,
                        m.sessions,
                        m.original_turns,
                        m.turns,
                        m.original_events,
                        m.events,
                        percent(events_ratio(m)),
                        file
                    ),
                    None => "–".into(),
                };
                let _ = writeln!(
                    md,
                    "| `{}` | ✅ | {} | {} | {} | `{}` | {} | [{}]({}) | {} |",
                    r.mutant.name(),
                    c.runs_to_failure,
                    c.scenario,
                    c.seed,
                    c.invariant,
                    c.caught_by.name(),
                    c.file,
                    c.file,
                    min
                );
            }
            None if r.shown_unreachable() => {
                let _ = writeln!(
                    md,
                    "| `{}` | ⛔ unreachable (below) | – ({} runs, each trace as without it) | – | – | – | – | – | – |",
                    r.mutant.name(),
                    r.runs
                );
            }
            None if unreachable_reason(r.mutant).is_some() => {
                let _ = writeln!(
                    md,
                    "| `{}` | ❌ survived: called unreachable, but {} | – ({} runs) | – | – | – | – | – | – |",
                    r.mutant.name(),
                    r.equivalence.as_ref().map_or(String::new(), Equivalence::describe),
                    r.runs
                );
            }
            None if matches!(r.equivalence, Some(Equivalence::Same { .. })) => {
                let _ = writeln!(
                    md,
                    "| `{}` | ❌ survived, never reached: every trace as without it | – ({} runs) | – | – | – | – | – | – |",
                    r.mutant.name(),
                    r.runs
                );
            }
            None if r.equivalence.is_some() => {
                let _ = writeln!(
                    md,
                    "| `{}` | ❌ survived, reached: {} | – ({} runs) | – | – | – | – | – | – |",
                    r.mutant.name(),
                    r.equivalence
                        .as_ref()
                        .map_or(String::new(), Equivalence::describe),
                    r.runs
                );
            }
            None => {
                let _ = writeln!(
                    md,
                    "| `{}` | ❌ survived | – ({} runs) | – | – | – | – | – | – |",
                    r.mutant.name(),
                    r.runs
                );
            }
        }
    }
    let unreachable: Vec<(Mutant, &str)> = results
        .iter()
        .filter_map(|r| Some((r.mutant, unreachable_reason(r.mutant)?)))
        .collect();
    if !unreachable.is_empty() {
        let _ = writeln!(
            md,
            "\n## Mutants the production embedding cannot show\n\nThe sweep drives the \
             production engine; these bugs need something it never does. The core keeps their \
             fences for embedders without its guarantees; the core's unit cases \
             (`core/tests/rules.rs`) and the fuzzer (`callback_orderings`) catch them.\n"
        );
        for (m, why) in unreachable {
            let _ = writeln!(md, "- `{}`: {why}.", m.name());
        }
        let _ = writeln!(
            md,
            "\nThe claim is checked on every scoreboard: the same search without the mutant \
             must make the very same runs, each with the same trace hash (a difference would \
             be behaviour no check caught, and the mutant would count as survived)."
        );
        for r in results
            .iter()
            .filter(|r| r.caught.is_none() && unreachable_reason(r.mutant).is_some())
        {
            if let Some(e) = &r.equivalence {
                let _ = writeln!(md, "- `{}`: {}.", r.mutant.name(), e.describe());
            }
        }
    }
    if all.len() > 1 {
        render_comparison(&mut md, all);
    }
    let _ = writeln!(
        md,
        "\nReplay any line with `palisade replay {}/<replay file>`.",
        dir.display()
    );
    md
}

fn render_comparison(md: &mut String, all: &[StrategyResults]) {
    let _ = writeln!(
        md,
        "\n## Seed runs to first failure, by search strategy\n\nThe same mutants and the same \
         bound under every strategy (`palisade mutants --strategy all`); a guided run counts \
         every world run, the ones spent building its corpus included, and `corpus` counts \
         each replay of the shipped seed corpus (`scenarios/corpus.json`) as a run; building \
         that file (`palisade corpus`, once per change of the scenarios, no mutant on) is not \
         counted. The table above is `{}`'s; the others' failure files carry the strategy in \
         their name.\n",
        all[0].strategy.name()
    );
    let mut head = String::from("| mutant |");
    let mut rule = String::from("|---|");
    for s in all {
        let _ = write!(head, " {} |", s.strategy.name());
        rule.push_str("---:|");
    }
    let _ = writeln!(md, "{head}\n{rule}");
    for mutant in &Mutant::ALL {
        let mut line = format!("| `{}` |", mutant.name());
        for s in all {
            let cell = match s.results.iter().find(|r| r.mutant == *mutant) {
                Some(MutantResult {
                    caught: Some(c), ..
                }) => c.runs_to_failure.to_string(),
                Some(r) if r.shown_unreachable() => "⛔".to_string(),
                Some(r) => format!("❌ ({} runs)", r.runs),
                None => "–".to_string(),
            };
            let _ = write!(line, " {cell} |");
        }
        let _ = writeln!(md, "{line}");
    }
    for (label, pick) in [("median", 0usize), ("max", 1)] {
        let mut line = format!("| **{label}** |");
        for s in all {
            let mm = median_max(&s.results);
            let v = if pick == 0 { mm.0 } else { mm.1 };
            let _ = write!(line, " **{}** |", v.map_or("–".into(), |v| v.to_string()));
        }
        let _ = writeln!(md, "{line}");
    }
    let mut line = String::from("| **caught** |");
    for s in all {
        let n = s.results.iter().filter(|r| r.caught.is_some()).count();
        let _ = write!(line, " **{n}** |");
    }
    let _ = writeln!(md, "{line}");
}

/// Trace events of a minimised failure, as a fraction of the original's.
pub fn events_ratio(m: &Minimized) -> f64 {
    if m.original_events == 0 {
        1.0
    } else {
        m.events as f64 / m.original_events as f64
    }
}

fn percent(ratio: f64) -> String {
    format!("{:.0}%", ratio * 100.0)
}

/// The relative path of `mutants.md` inside a report directory.
pub fn scoreboard_path(dir: &Path) -> PathBuf {
    dir.join("mutants.md")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(scenario: usize, seed: u64, hash: Option<u64>) -> SeedRecord {
        SeedRecord {
            scenario,
            seed,
            trace_hash: hash,
            stats: crate::runner::SeedStats::default(),
            marks: std::collections::BTreeMap::new(),
            edges: Vec::new(),
            guided_plan: false,
            wall_nanos: 0,
            failure: None,
        }
    }

    #[test]
    fn equal_runs_show_no_difference() {
        let a = [run(0, 0, Some(1)), run(1, 0, Some(2)), run(0, 1, Some(3))];
        assert_eq!(first_difference(&a, &a.clone()), None);
        assert_eq!(first_difference(&[], &[]), None);
    }

    #[test]
    fn a_different_trace_seed_or_length_is_a_difference() {
        let a = [run(0, 0, Some(1)), run(1, 0, Some(2)), run(0, 1, Some(3))];
        let mut b = a.clone();
        b[1].trace_hash = Some(9);
        assert_eq!(first_difference(&a, &b), Some((1, 1, 0)));
        let mut b = a.clone();
        b[2].seed = 7;
        assert_eq!(first_difference(&a, &b), Some((2, 0, 1)));
        // One side made a run the other did not (a guided search that steered elsewhere).
        assert_eq!(first_difference(&a, &a[..2]), Some((2, 0, 1)));
        assert_eq!(first_difference(&a[..1], &a), Some((1, 1, 0)));
        // A panicked run has no trace to compare: never counted as the same.
        let b = [run(0, 0, None)];
        assert_eq!(first_difference(&b, &b.clone()), Some((0, 0, 0)));
    }

    #[test]
    fn a_mutant_called_unreachable_survives_unless_its_runs_were_the_same() {
        let result = |equivalence| MutantResult {
            mutant: Mutant::ToctouGeneration,
            runs: 3,
            caught: None,
            equivalence,
        };
        assert!(unreachable_reason(Mutant::ToctouGeneration).is_some());
        let same = result(Some(Equivalence::Same { runs: 3 }));
        assert!(same.shown_unreachable() && !same.survived());
        let differs = result(Some(Equivalence::Differs {
            run: 2,
            scenario: "swarm".into(),
            seed: 4,
        }));
        assert!(differs.survived() && !differs.shown_unreachable());
        assert!(result(None).survived());
        // A reachable mutant not caught survived, whatever else is known.
        let reachable = MutantResult {
            mutant: Mutant::SubstringFallback,
            runs: 3,
            caught: None,
            equivalence: Some(Equivalence::Same { runs: 3 }),
        };
        assert!(reachable.survived());
    }
}
