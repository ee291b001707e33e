//! The `palisade` command line (`docs/design.md`, "CLI contract").
//!
//! Exit codes: 0 everything held; 1 an invariant failed (or a mutant survived, or a replay
//! reproduced its failure); 2 bad usage or bad input, reported before anything is written.

use clap::{Args, Parser, Subcommand};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use palisade_core::mutants::Mutant;

use crate::diagram;
use crate::failure::{self, FailureFile};
use crate::minimize;
use crate::oracle::Checks;
use crate::record::{self, PANIC_INVARIANT};
use crate::report::{self, Summary};
use crate::runner;
use crate::scenario::{self, Resolved};
use crate::scoreboard;
use crate::search::{self, Strategy};
use crate::seeds::{self, SeedRange, Shard};
use crate::sweep::{self, hex, SweepConfig};

/// Prints a line to stdout; a closed pipe (`palisade scenarios | head`) is not an error.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Everything held.
const EXIT_HELD: u8 = 0;
/// An invariant failed, a mutant survived, or a failure reproduced.
const EXIT_FAILED: u8 = 1;
/// Bad usage or bad input; nothing was written.
const EXIT_BAD_INPUT: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "palisade",
    version,
    about = "Deterministic simulation testbed for palisade-core",
    long_about = "Drives the real palisade-core through a madsim world with delayed, duplicated and \
                  reordered callbacks, cancellations, provider exits and crash-restarts, and checks \
                  its invariants.\n\nExit codes: 0 all held; 1 an invariant failed (or a mutant \
                  survived); 2 bad usage or input."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run many seeds of one or all scenarios and write reports.
    Sweep(SweepArgs),
    /// Run one seed and print its trace and verdict.
    Run(RunArgs),
    /// Re-run a failure file; prints `reproduced <hash>` (exit 1) when it fails identically.
    Replay {
        /// A failure file (`failures/<scenario>-<seed>.json`).
        file: PathBuf,
    },
    /// Shrink a failure file's plan (faults and workload) while the same invariant still fails.
    Minimize {
        /// A failure file.
        file: PathBuf,
        /// Where to write the minimised failure file [default: FILE with `.min.json`].
        #[arg(short = 'o', long = "out")]
        out: Option<PathBuf>,
        /// Worker threads [default: the number of cores].
        #[arg(long, value_parser = parse_jobs)]
        jobs: Option<usize>,
        /// The most seed runs to spend.
        #[arg(long, default_value_t = minimize::MAX_RUNS)]
        max_runs: usize,
    },
    /// Sweep every mutant of the core; write mutants.md; exit 1 if any survives.
    Mutants(MutantsArgs),
    /// Print a mermaid sequence diagram of a failure file's (or JSONL trace file's) trace.
    Diagram {
        /// A failure file, or a JSONL trace written by `run --trace`.
        file: PathBuf,
        /// Draw every event rather than the window around the violation.
        #[arg(long)]
        all: bool,
        /// Wrap the diagram in a markdown ```mermaid fence.
        #[arg(long)]
        markdown: bool,
    },
    /// List the shipped scenarios (and check that they load).
    Scenarios,
    /// Build the seed corpus `--strategy corpus` starts from: a cold guided sweep of every
    /// shipped scenario (no mutant), distilled to the fewest plans that show every coverage
    /// feature it saw, the biggest first.
    Corpus(CorpusArgs),
    /// Combine the summary.json files of a sharded sweep into one summary.
    Merge {
        /// The shards' summary.json files.
        #[arg(required = true)]
        summaries: Vec<PathBuf>,
        /// Where to write the merged summary.json, summary.md and junit.xml.
        #[arg(long, default_value = "reports")]
        report_dir: PathBuf,
    },
}

#[derive(Debug, Args)]
struct SweepArgs {
    /// A scenario name, a path to a scenario file, or `all`.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Seeds 0..N of every scenario [default: its `[limits] default_seeds`, else 2,000].
    #[arg(long, conflicts_with = "seed_range", value_parser = parse_seed_count)]
    seeds: Option<u64>,
    /// Seeds A..B (B excluded) or A..=B of every scenario.
    #[arg(long, value_parser = parse_seed_range)]
    seed_range: Option<SeedRange>,
    /// Worker threads [default: the number of cores].
    #[arg(long, value_parser = parse_jobs)]
    jobs: Option<usize>,
    /// Only shard I of N (the seeds at positions p with p % N == I).
    #[arg(long, value_parser = parse_shard)]
    shard: Option<Shard>,
    /// Switch this mutant on in the core.
    #[arg(long, value_parser = parse_mutant)]
    mutant: Option<Mutant>,
    /// Where to write summary.json, summary.md, junit.xml and failures/.
    #[arg(long, default_value = "reports")]
    report_dir: PathBuf,
    /// Re-run this fraction of the seeds (0 < F <= 1) and compare their traces.
    #[arg(long, value_parser = parse_fraction)]
    check_determinism: Option<f64>,
    /// `all`, or `ground-truth` to switch the core-belief checks (the core's reference
    /// model and its invariants) off and judge from the environment's records alone.
    #[arg(long, default_value = "all", value_parser = parse_checks)]
    checks: Checks,
    /// How seeds' plans are chosen: `uniform` (drawn from consecutive seeds), `coverage`
    /// (coverage-guided: fresh seeds and mutants of the plans that found new coverage) or
    /// `corpus` (coverage-guided, starting from the shipped seed corpus). The guided ones
    /// are not shardable [default: corpus; uniform with --shard].
    #[arg(long, value_parser = parse_strategy)]
    strategy: Option<Strategy>,
    /// The seed corpus of `--strategy corpus` [default: corpus.json beside the scenarios].
    #[arg(long)]
    corpus: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct CorpusArgs {
    /// Seeds 0..N of every scenario [default: each scenario's default seed count, as the
    /// main job runs].
    #[arg(long, value_parser = parse_seed_count)]
    seeds: Option<u64>,
    /// Worker threads [default: the number of cores].
    #[arg(long, value_parser = parse_jobs)]
    jobs: Option<usize>,
    /// Where to write the corpus [default: corpus.json beside the scenarios].
    #[arg(short = 'o', long = "out")]
    out: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// A scenario name or a path to a scenario file.
    #[arg(long)]
    scenario: String,
    /// The seed.
    #[arg(long)]
    seed: u64,
    /// Switch this mutant on in the core.
    #[arg(long, value_parser = parse_mutant)]
    mutant: Option<Mutant>,
    /// Write the JSONL trace to this file instead of stdout.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// `all`, or `ground-truth` (see `sweep --checks`).
    #[arg(long, default_value = "all", value_parser = parse_checks)]
    checks: Checks,
}

#[derive(Debug, Args)]
struct MutantsArgs {
    /// Seeds per scenario before a mutant counts as surviving.
    #[arg(long, default_value_t = scoreboard::DEFAULT_SEEDS_PER_SCENARIO, value_parser = parse_seed_count)]
    seeds: u64,
    /// Worker threads [default: the number of cores].
    #[arg(long, value_parser = parse_jobs)]
    jobs: Option<usize>,
    /// Where to write mutants.md and the failure files.
    #[arg(long, default_value = "reports")]
    report_dir: PathBuf,
    /// Only these scenarios (a name, a path, or `all`).
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Seed runs spent minimising each mutant's first failure (0: do not minimise).
    #[arg(long, default_value_t = scoreboard::MINIMIZE_RUNS)]
    minimize_runs: usize,
    /// `ground-truth` (the default: a mutant counts as caught only by what the environment
    /// recorded), or `all` to let the core-belief checks catch it too.
    #[arg(long, default_value = "ground-truth", value_parser = parse_checks)]
    checks: Checks,
    /// The search strategy: `uniform`, `coverage`, or `all` to run every strategy and
    /// write their seed runs to first failure side by side.
    #[arg(long, default_value = search::DEFAULT_STRATEGY.name(), value_parser = parse_strategies)]
    strategy: Strategies,
    /// Only this mutant (a check of one mutant; its `mutants.md` is no scoreboard).
    #[arg(long, value_parser = parse_mutant)]
    mutant: Option<Mutant>,
    /// The seed corpus of `--strategy corpus` [default: corpus.json beside the scenarios].
    #[arg(long)]
    corpus: Option<PathBuf>,
}

/// The strategies `palisade mutants` runs, the first one's table in full.
#[derive(Clone, Debug)]
struct Strategies(Vec<Strategy>);

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::from_name(s)
        .ok_or_else(|| format!("unknown strategy {s:?} (known: {})", Strategy::names()))
}

fn parse_strategies(s: &str) -> Result<Strategies, String> {
    if s == "all" {
        // The default strategy first: its table is the scoreboard's.
        let mut all = vec![search::DEFAULT_STRATEGY];
        all.extend(
            Strategy::ALL
                .into_iter()
                .filter(|&x| x != search::DEFAULT_STRATEGY),
        );
        return Ok(Strategies(all));
    }
    Strategy::from_name(s)
        .map(|x| Strategies(vec![x]))
        .ok_or_else(|| {
            format!(
                "unknown strategy {s:?} (known: {}, or all)",
                Strategy::names()
            )
        })
}

fn parse_seed_range(s: &str) -> Result<SeedRange, String> {
    s.parse()
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    s.parse()
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    sweep::parse_fraction(s)
}

fn parse_seed_count(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "bad seed count {s:?}: expected a whole number >= 1"
        )),
    }
}

fn parse_jobs(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("bad job count {s:?}: expected a whole number >= 1")),
    }
}

fn parse_checks(s: &str) -> Result<Checks, String> {
    Checks::from_name(s).ok_or_else(|| {
        format!(
            "unknown checks {s:?} (known: {}, {})",
            Checks::All.name(),
            Checks::GroundTruth.name()
        )
    })
}

fn parse_mutant(s: &str) -> Result<Mutant, String> {
    Mutant::from_name(s)
        .ok_or_else(|| format!("unknown mutant {s:?} (known: {})", failure::mutant_names()))
}

fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A command's failure: the message and the exit code.
struct Fail {
    code: u8,
    message: String,
}

fn bad_input(message: impl Into<String>) -> Fail {
    Fail {
        code: EXIT_BAD_INPUT,
        message: message.into(),
    }
}

fn io_error(what: &Path, e: std::io::Error) -> Fail {
    // Not the input's fault, but no verdict either: the run is unusable.
    bad_input(format!("{}: cannot write: {e}", what.display()))
}

/// madsim's warning that a reused thread's `HashMap` keys are not the seed's: the runner
/// runs many seeds on one thread, on purpose and harmlessly (see [`runner`]), so it would
/// otherwise fill an operator's log once a seed.
const MADSIM_RANDOM_STATE: &str = "madsim::sim::rand";

/// `RUST_LOG`'s directives, with [`MADSIM_RANDOM_STATE`] quietened to errors unless they
/// name it themselves.
fn log_directives(rust_log: &str) -> String {
    if rust_log.contains(MADSIM_RANDOM_STATE) {
        return rust_log.to_owned();
    }
    let rust_log = rust_log.trim().trim_end_matches(',');
    let base = if rust_log.is_empty() {
        palisade_embed::logging::DEFAULT_FILTER
    } else {
        rust_log
    };
    format!("{base},{MADSIM_RANDOM_STATE}=error")
}

/// The binary's entry point.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // Structured logs only when asked for: the CLI's own output is its contract.
    if let Some(directives) = std::env::var_os("RUST_LOG") {
        let directives = log_directives(&directives.to_string_lossy());
        if let Err(message) = palisade_embed::logging::init_with(
            palisade_embed::logging::LogFormat::Text,
            Some(&directives),
        ) {
            eprintln!("palisade: {message}");
            return ExitCode::from(2);
        }
    }
    let result = match cli.command {
        Command::Sweep(args) => cmd_sweep(args),
        Command::Run(args) => cmd_run(args),
        Command::Replay { file } => cmd_replay(&file),
        Command::Minimize {
            file,
            out,
            jobs,
            max_runs,
        } => cmd_minimize(&file, out, jobs.unwrap_or_else(default_jobs), max_runs),
        Command::Mutants(args) => cmd_mutants(args),
        Command::Diagram {
            file,
            all,
            markdown,
        } => cmd_diagram(&file, all, markdown),
        Command::Scenarios => cmd_scenarios(),
        Command::Corpus(args) => cmd_corpus(args),
        Command::Merge {
            summaries,
            report_dir,
        } => cmd_merge(&summaries, &report_dir),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(fail) => {
            eprintln!("error: {}", fail.message);
            ExitCode::from(fail.code)
        }
    }
}

fn resolve(spec: &str) -> Result<Vec<Resolved>, Fail> {
    scenario::resolve(spec).map_err(|e| bad_input(e.to_string()))
}

/// The seed plans of `--strategy corpus` (none for the other strategies), loaded before
/// anything runs. A corpus named with `--corpus` that cannot be read is bad input; the
/// default one missing, or no entry applying to these scenarios, starts the search cold.
/// Says on stdout what it loaded.
fn seed_plans(
    strategies: &[Strategy],
    corpus: Option<&Path>,
    scenarios: &[Resolved],
) -> Result<Vec<search::SeedPlan>, Fail> {
    if !strategies.contains(&Strategy::Corpus) {
        return match corpus {
            Some(_) => Err(bad_input(
                "--corpus is read only by --strategy corpus (or all)".to_string(),
            )),
            None => Ok(Vec::new()),
        };
    }
    let path = corpus.map_or_else(crate::corpus::default_path, Path::to_path_buf);
    if corpus.is_none() && !path.exists() {
        say!(
            "corpus: {} not found; the guided search starts cold",
            path.display()
        );
        return Ok(Vec::new());
    }
    let file = crate::corpus::read(&path).map_err(|e| bad_input(format!("--corpus: {e}")))?;
    let (plans, stale) = crate::corpus::resolve(&file, scenarios);
    let stale_note = match stale.first() {
        None => String::new(),
        Some(first) => format!(
            "; {} stale entries skipped (rebuild it with `palisade corpus`), first: {first}",
            stale.len()
        ),
    };
    if plans.is_empty() {
        say!(
            "corpus: no entry of {} applies to these scenarios{stale_note}; the guided search starts cold",
            path.display()
        );
    } else {
        say!(
            "corpus: {} plans from {}{stale_note}",
            plans.len(),
            path.display()
        );
    }
    Ok(plans)
}

fn report_error(e: report::ReportError) -> Fail {
    // Not always the input's fault, but no verdict either: the run is unusable.
    bad_input(e.to_string())
}

/// Creates the report directory up front and checks that the report's files can be
/// written there (`rels`, relative to it: a file is created in it and removed), so a path
/// that cannot be one is bad input reported before any seed runs.
fn prepare_report_dir(dir: &Path, rels: &[&str]) -> Result<(), Fail> {
    report::ReportWriter::check(dir, rels)
        .map_err(|e| bad_input(format!("--report-dir {}: {e}", dir.display())))
}

/// Checks that the file `flag` names can be written (a file is created beside it and
/// removed), before anything runs: a run's result is never lost to a destination that
/// was unwritable from the start.
fn check_output(flag: &str, path: &Path) -> Result<(), Fail> {
    report::check_writable_file(path)
        .map_err(|e| bad_input(format!("{flag} {}: {e}", path.display())))
}

fn cmd_sweep(args: SweepArgs) -> Result<u8, Fail> {
    crate::oracle::set_checks(args.checks);
    if args.check_determinism.is_some() {
        // The determinism check names the first differing line, so it needs the lines.
        crate::runner::capture_all_traces(true);
    }
    // A sharded sweep is uniform unless told otherwise: a guided one cannot be split.
    let strategy = match (args.strategy, args.shard) {
        (Some(s), _) => s,
        (None, Some(_)) => Strategy::Uniform,
        (None, None) => search::DEFAULT_STRATEGY,
    };
    if strategy.is_guided() && args.shard.is_some() {
        return Err(bad_input(format!(
            "--shard cannot be used with --strategy {}: each generation of the guided \
             search depends on every earlier one, so its seeds cannot be split between \
             machines; shard a uniform sweep, or run the guided one whole",
            strategy.name()
        )));
    }
    let scenarios = resolve(&args.scenario)?;
    let seed_plans = seed_plans(&[strategy], args.corpus.as_deref(), &scenarios)?;
    let ranges: Vec<SeedRange> = scenarios
        .iter()
        .map(|r| match (args.seeds, args.seed_range) {
            (Some(n), _) => SeedRange::first(n),
            (None, Some(range)) => range,
            (None, None) => SeedRange::first(sweep::default_seeds(&r.scenario)),
        })
        .collect();
    let total = ranges.iter().fold(0u64, |acc, r| {
        acc.saturating_add(seeds::seeds_in(*r, args.shard))
    });
    if total > sweep::MAX_SEEDS_PER_RUN {
        let asked = match (args.seeds, args.seed_range) {
            (Some(n), _) => format!("--seeds {n}"),
            (None, Some(r)) => format!("--seed-range {r}"),
            (None, None) => "the default seed counts".into(),
        };
        return Err(bad_input(format!(
            "{asked}: this sweep would run {total} seeds{}, more than one run may ({} seeds, MAX_SEEDS_PER_RUN: every seed keeps a record in memory); split it with --shard I/N and join the shards with `palisade merge`",
            args.shard.map(|s| format!(" in shard {s}")).unwrap_or_default(),
            sweep::MAX_SEEDS_PER_RUN
        )));
    }
    prepare_report_dir(&args.report_dir, &report::SUMMARY_FILES)?;
    let config = SweepConfig {
        scenarios,
        ranges,
        shard: args.shard,
        jobs: args.jobs.unwrap_or_else(default_jobs),
        mutant: args.mutant,
        check_determinism: args.check_determinism,
        progress: true,
        strategy,
        seed_plans,
    };
    let result = sweep::sweep(&config);

    // Every file of the report is staged, then all are renamed into place together: the
    // summary points only at failure files of this run, and a write that fails leaves the
    // previous report as it was.
    let mut staged = report::ReportWriter::new(&args.report_dir).map_err(report_error)?;
    let mut files = BTreeMap::new();
    let mut diagrams = BTreeMap::new();
    let mut out = std::io::stdout().lock();
    let mut unfiled = 0usize;
    for rec in &result.records {
        let Some(f) = &rec.failure else { continue };
        let resolved = &config.scenarios[rec.scenario];
        let name = &resolved.scenario.name;
        if f.detail_dropped {
            unfiled += 1;
            continue;
        }
        let rel = report::failure_file_name(name, rec.seed, None);
        let path = args.report_dir.join(&rel);
        let file = FailureFile::new(resolved, rec, config.mutant, &path, report::commit());
        staged
            .stage(&rel, &report::json_bytes(&file))
            .map_err(report_error)?;
        let _ = writeln!(
            out,
            "FAIL {name} seed {}: {}: {}\n  replay: {}\n  repro:  {}",
            rec.seed,
            f.invariant,
            sweep::clip(&f.message, 300),
            file.replay,
            file.repro
        );
        if diagrams.len() < report::MAX_DIAGRAMS_IN_MARKDOWN && !f.trace.is_empty() {
            diagrams.insert(
                (name.clone(), rec.seed),
                diagram::mermaid(
                    &f.trace,
                    &f.events,
                    Some(&f.invariant),
                    Some(diagram::DEFAULT_WINDOW),
                ),
            );
        }
        files.insert((rec.scenario, rec.seed), rel);
    }
    if unfiled > 0 {
        let _ = writeln!(
            out,
            "({unfiled} more failing seeds are listed in summary.json without failure files: \
             at most {} per scenario are written)",
            sweep::MAX_FAILURE_FILES_PER_SCENARIO
        );
    }
    for d in &result.divergences {
        let _ = writeln!(
            out,
            "FAIL {} seed {}: {}: {}",
            config.scenarios[d.scenario].scenario.name,
            d.seed,
            sweep::DETERMINISM_INVARIANT,
            d.message
        );
    }
    let summary = report::summarize(&config, &result, &files);
    report::stage_summary_files(&mut staged, &summary, &diagrams).map_err(report_error)?;
    staged.commit().map_err(report_error)?;
    print_tail(&mut out, &summary, config.check_determinism.is_some());
    Ok(if summary.held() {
        EXIT_HELD
    } else {
        EXIT_FAILED
    })
}

/// The closing lines of a sweep (or merge): coverage gaps, determinism (always when
/// `--check-determinism` was given, so a sample that picked nothing says so), throughput,
/// and exactly one `sweep:` line, last.
fn print_tail(out: &mut impl std::io::Write, summary: &Summary, determinism_asked: bool) {
    for g in &summary.coverage_gaps {
        let _ = writeln!(
            out,
            "coverage: mark `{}` never hit in scenario {} (required by its [expect] min_marks)",
            g.mark, g.scenario
        );
    }
    if determinism_asked || summary.determinism_checked > 0 {
        let differed = summary
            .failures
            .iter()
            .filter(|f| f.invariant == sweep::DETERMINISM_INVARIANT)
            .count();
        let _ = writeln!(
            out,
            "determinism: {} seeds re-run, {differed} differed",
            summary.determinism_checked
        );
    }
    let wall = summary.timing.wall_seconds.max(1e-9);
    let _ = writeln!(
        out,
        "throughput: {} events, {:.0} events/s, {:.1} simulated s per wall s",
        summary.events,
        summary.events as f64 / wall,
        summary.sim_millis as f64 / 1e3 / wall,
    );
    let _ = writeln!(
        out,
        "sweep: {} seeds, {} failed, {:.1} seeds/s",
        summary.seeds,
        summary.failed,
        summary.seeds as f64 / wall
    );
}

fn cmd_run(args: RunArgs) -> Result<u8, Fail> {
    crate::runner::capture_all_traces(true);
    crate::oracle::set_checks(args.checks);
    let resolved = scenario::resolve_one(&args.scenario).map_err(|e| bad_input(e.to_string()))?;
    if let Some(path) = &args.trace {
        if path.is_dir() {
            return Err(bad_input(format!(
                "--trace {}: is a directory",
                path.display()
            )));
        }
        check_output("--trace", path)?;
    }
    let timed = runner::run_isolated(&resolved.scenario, args.seed, None, args.mutant);
    let (rec, trace) = record::record(0, args.seed, timed, true);
    let trace = trace.unwrap_or_default();
    // What the seed drew besides its faults (swarm over configuration and environment).
    let plan = crate::plan::draw(&resolved.scenario, args.seed);
    if let Some(config) = &plan.config {
        eprintln!(
            "config: {}",
            serde_json::to_string(config).unwrap_or_default()
        );
    }
    if let Some(env) = &plan.environment {
        eprintln!(
            "environment: {}",
            serde_json::to_string(env).unwrap_or_default()
        );
    }
    match &args.trace {
        Some(path) => {
            let mut text = trace.join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            report::write_atomic(path, text.as_bytes()).map_err(|e| io_error(path, e))?;
        }
        None => {
            let mut out = std::io::stdout().lock();
            for line in &trace {
                let _ = writeln!(out, "{line}");
            }
            let _ = out.flush();
        }
    }
    let name = &resolved.scenario.name;
    match &rec.failure {
        None => {
            eprintln!(
                "held: {name} seed {}, trace {}, {} events, {:.1} simulated s",
                args.seed,
                hex(rec.trace_hash),
                rec.stats.events,
                rec.stats.sim_millis as f64 / 1e3
            );
            Ok(EXIT_HELD)
        }
        Some(f) => {
            eprintln!(
                "FAILED: {name} seed {}: {}: {} (caught by {})\n  trace {}, events {:?}\n  repro: {}",
                args.seed,
                f.invariant,
                f.message,
                f.caught_by.name(),
                hex(rec.trace_hash),
                f.events,
                failure::repro_command(&resolved.spec, args.seed, args.mutant)
            );
            Ok(EXIT_FAILED)
        }
    }
}

/// Loads a failure file; the seeds run from now on run the checks it was recorded with.
fn load_failure(path: &Path) -> Result<failure::Loaded, Fail> {
    let loaded = failure::load(path).map_err(bad_input)?;
    crate::oracle::set_checks(loaded.file.checks);
    Ok(loaded)
}

fn cmd_replay(path: &Path) -> Result<u8, Fail> {
    crate::runner::capture_all_traces(true);
    let loaded = load_failure(path)?;
    let file = &loaded.file;
    let timed = runner::run_isolated(
        &loaded.scenario.scenario,
        file.seed,
        file.plan.clone(),
        loaded.mutant,
    );
    let (rec, trace) = record::record(0, file.seed, timed, true);
    let trace = trace.unwrap_or_default();
    let now_hash = hex(rec.trace_hash);
    let what = format!(
        "{} seed {}{}",
        file.scenario,
        file.seed,
        file.mutant
            .as_deref()
            .map(|m| format!(" with mutant {m}"))
            .unwrap_or_default()
    );
    match &rec.failure {
        // A panic has no trace hash: the same panic message is the same failure.
        Some(f)
            if f.invariant == file.invariant
                && now_hash == file.trace_hash
                && (f.invariant != PANIC_INVARIANT || f.message == file.message) =>
        {
            say!("{what}: {}: {}", f.invariant, f.message);
            say!("reproduced {now_hash}");
            Ok(EXIT_FAILED)
        }
        Some(f) => {
            let mut why = format!(
                "diverged: {what} was recorded failing `{}` with trace {}, and now fails `{}` with trace {now_hash}",
                file.invariant, file.trace_hash, f.invariant
            );
            if let Some((i, a, b)) = sweep::first_difference(&file.trace, &trace) {
                why.push_str(&format!(
                    "\n  first difference at trace line {i}:\n    recorded: {}\n    now:      {}",
                    sweep::clip(&a, 200),
                    sweep::clip(&b, 200)
                ));
            }
            say!("{why}\n  now: {}", f.message);
            Ok(EXIT_FAILED)
        }
        None => {
            say!(
                "passed: {what} held (trace {now_hash}); it was recorded failing `{}` with trace {}",
                file.invariant, file.trace_hash
            );
            Ok(EXIT_HELD)
        }
    }
}

fn cmd_minimize(
    path: &Path,
    out: Option<PathBuf>,
    jobs: usize,
    max_runs: usize,
) -> Result<u8, Fail> {
    let loaded = load_failure(path)?;
    let out = out.unwrap_or_else(|| {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "failure".into());
        path.with_file_name(format!("{stem}.min.json"))
    });
    check_output("--out", &out)?;
    let min = minimize::minimize_file(&loaded, &out, jobs, max_runs).map_err(bad_input)?;
    report::write_json(&out, &min).map_err(|e| io_error(&out, e))?;
    let m = min.minimized.as_ref().expect("minimize_file sets it");
    let pct = |a: usize, b: usize| {
        if b == 0 {
            100.0
        } else {
            a as f64 * 100.0 / b as f64
        }
    };
    say!(
        "minimized: faults {} -> {} ({:.0}%), sessions {} -> {}, turns {} -> {}, trace events {} -> {} ({:.0}%), {} runs",
        m.original_faults,
        m.faults,
        pct(m.faults, m.original_faults),
        m.original_sessions,
        m.sessions,
        m.original_turns,
        m.turns,
        m.original_events,
        m.events,
        pct(m.events, m.original_events),
        m.runs
    );
    say!("wrote {} (`{}`)", out.display(), min.replay);
    Ok(EXIT_HELD)
}

fn cmd_corpus(args: CorpusArgs) -> Result<u8, Fail> {
    let scenarios = resolve("all")?;
    let out = args.out.unwrap_or_else(crate::corpus::default_path);
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(bad_input(format!(
                "--out {}: {} is not a directory",
                out.display(),
                dir.display()
            )));
        }
    }
    if out.exists() && !out.is_file() {
        return Err(bad_input(format!(
            "--out {}: exists and is not a regular file",
            out.display()
        )));
    }
    check_output("--out", &out)?;
    let ranges: Vec<SeedRange> = scenarios
        .iter()
        .map(|r| {
            SeedRange::first(
                args.seeds
                    .unwrap_or_else(|| sweep::default_seeds(&r.scenario)),
            )
        })
        .collect();
    let total = ranges.iter().map(|r| r.len()).sum::<u64>();
    if total > sweep::MAX_SEEDS_PER_RUN {
        return Err(bad_input(format!(
            "this build would run {total} seeds, more than one run may ({} seeds, MAX_SEEDS_PER_RUN)",
            sweep::MAX_SEEDS_PER_RUN
        )));
    }
    let built_by = format!(
        "palisade corpus{} (commit {})",
        args.seeds
            .map(|n| format!(" --seeds {n}"))
            .unwrap_or_default(),
        report::commit()
    );
    let jobs = args.jobs.unwrap_or_else(default_jobs);
    match crate::corpus::build(&scenarios, ranges, jobs, true, built_by) {
        Err(failed) => {
            for (scenario, seed, invariant) in &failed.failures {
                say!("FAIL {scenario} seed {seed}: {invariant}");
            }
            say!(
                "corpus: {} of {} runs failed; nothing written (find them with `palisade sweep --strategy coverage`)",
                failed.failures.len(),
                failed.runs
            );
            Ok(EXIT_FAILED)
        }
        Ok(file) => {
            report::write_atomic(&out, &crate::corpus::to_bytes(&file))
                .map_err(|e| bad_input(format!("--out {}: {e}", out.display())))?;
            say!(
                "corpus: {} runs, {} plans kept, {} features; {} entries cover them all -> {}",
                file.runs,
                file.kept,
                file.features,
                file.entries.len(),
                out.display()
            );
            Ok(EXIT_HELD)
        }
    }
}

fn cmd_mutants(args: MutantsArgs) -> Result<u8, Fail> {
    crate::oracle::set_checks(args.checks);
    let scenarios = resolve(&args.scenario)?;
    let per_mutant = args.seeds.saturating_mul(scenarios.len() as u64);
    if per_mutant > sweep::MAX_SEEDS_PER_RUN {
        return Err(bad_input(format!(
            "--seeds {}: {per_mutant} seed runs per mutant over {} scenarios, more than one run may ({} seeds, MAX_SEEDS_PER_RUN)",
            args.seeds,
            scenarios.len(),
            sweep::MAX_SEEDS_PER_RUN
        )));
    }
    let path = scoreboard::scoreboard_path(&args.report_dir);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let seed_plans = seed_plans(&args.strategy.0, args.corpus.as_deref(), &scenarios)?;
    prepare_report_dir(&args.report_dir, &[name.as_str()])?;
    let jobs = args.jobs.unwrap_or_else(default_jobs);
    let mut staged = report::ReportWriter::new(&args.report_dir).map_err(report_error)?;
    let mutants: Vec<Mutant> = match args.mutant {
        Some(m) => vec![m],
        None => Mutant::ALL.to_vec(),
    };
    let all = scoreboard::run(
        &scenarios,
        &mutants,
        args.seeds,
        jobs,
        args.minimize_runs,
        &args.strategy.0,
        &seed_plans,
        &mut staged,
        true,
    )
    .map_err(report_error)?;
    let md = scoreboard::render(&all, args.seeds, &scenarios, &args.report_dir, args.checks);
    staged.stage(&name, md.as_bytes()).map_err(report_error)?;
    staged.commit().map_err(report_error)?;
    let mut any_survived = false;
    for sr in &all {
        let results = &sr.results;
        let label = if all.len() > 1 {
            format!("[{}] ", sr.strategy.name())
        } else {
            String::new()
        };
        let mut survived = 0;
        let mut runs = Vec::new();
        for r in results {
            match &r.caught {
                Some(c) => {
                    runs.push(c.runs_to_failure);
                    say!(
                        "{label}caught   {:<32} after {:>5} seed runs: {} seed {}: {} by {} ({})",
                        r.mutant.name(),
                        c.runs_to_failure,
                        c.scenario,
                        c.seed,
                        c.invariant,
                        c.caught_by.name(),
                        args.report_dir.join(&c.file).display()
                    );
                }
                None if r.shown_unreachable() => say!(
                    "{label}unreachable {:<29} {} seed runs without a failure, each trace as without it: {}",
                    r.mutant.name(),
                    r.runs,
                    scoreboard::unreachable_reason(r.mutant).unwrap_or_default()
                ),
                None => {
                    survived += 1;
                    say!(
                        "{label}SURVIVED {:<32} {} seed runs without a failure{}",
                        r.mutant.name(),
                        r.runs,
                        r.equivalence.as_ref().map_or(String::new(), |e| format!(
                            "; called unreachable, but {}",
                            e.describe()
                        ))
                    );
                }
            }
        }
        runs.sort_unstable();
        let unreachable = results.iter().filter(|r| r.shown_unreachable()).count();
        say!(
            "{label}mutants: {} mutants, {} caught, {survived} survived, {unreachable} unreachable; seed runs to first failure: median {}, max {} ({})",
            results.len(),
            results.len() - survived - unreachable,
            runs.get(runs.len().saturating_sub(1) / 2).map_or("-".into(), |m| m.to_string()),
            runs.last().map_or("-".into(), |m| m.to_string()),
            path.display()
        );
        any_survived |= survived > 0;
    }
    Ok(if any_survived { EXIT_FAILED } else { EXIT_HELD })
}

fn cmd_diagram(path: &Path, all: bool, markdown: bool) -> Result<u8, Fail> {
    let shown = path.display();
    let bytes = crate::input::read_capped(
        path,
        diagram::MAX_DIAGRAM_INPUT_BYTES,
        "failure file or trace",
    )
    .map_err(bad_input)?;
    let window = (!all).then_some(diagram::DEFAULT_WINDOW);
    let too_many = |events: usize| {
        bad_input(format!(
            "{shown}: --all draws at most {} events (MAX_DIAGRAM_EVENTS), and this trace has {events}; leave out --all to draw the {} around the violation",
            diagram::MAX_DIAGRAM_EVENTS,
            diagram::DEFAULT_WINDOW
        ))
    };
    // A failure file, else a JSONL trace. Neither is built whole: the format is read
    // first, and only the drawn events are parsed.
    let d = if matches!(failure::format_of(&bytes), failure::Format::Failure) {
        let file: FailureFile = serde_json::from_slice(&bytes)
            .map_err(|e| bad_input(format!("{shown}: malformed failure file: {e}")))?;
        drop(bytes);
        if file.trace.is_empty() {
            return Err(bad_input(format!("{shown}: the failure file has no trace")));
        }
        if all && file.trace.len() > diagram::MAX_DIAGRAM_EVENTS {
            return Err(too_many(diagram::count_events(&file.trace)));
        }
        diagram::mermaid(&file.trace, &file.events, Some(&file.invariant), window)
    } else {
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| bad_input(format!("{shown}: not UTF-8 text: {e}")))?;
        let lines: Vec<&str> = text.lines().collect();
        let objects = diagram::count_events(&lines);
        if objects == 0 {
            return Err(bad_input(format!(
                "{shown}: neither a failure file nor a JSONL trace (no line is a JSON object)"
            )));
        }
        if all && objects > diagram::MAX_DIAGRAM_EVENTS {
            return Err(too_many(objects));
        }
        diagram::mermaid(&lines, &[], None, window)
    };
    if markdown {
        say!("```mermaid\n{d}```");
    } else {
        let _ = write!(std::io::stdout().lock(), "{d}");
    }
    Ok(EXIT_HELD)
}

fn cmd_scenarios() -> Result<u8, Fail> {
    let scenarios = resolve("all")?;
    let width = scenarios
        .iter()
        .map(|r| r.scenario.name.len())
        .max()
        .unwrap_or(0);
    for r in &scenarios {
        let s = &r.scenario;
        say!(
            "{:<width$}  v{}  {:>6}  {:>4} seeds  {}",
            s.name,
            s.version,
            s.world.kind.name(),
            sweep::default_seeds(s),
            first_sentence(&s.description)
        );
        if !s.source.is_empty() {
            say!("{:<width$}  source: {}", "", first_sentence(&s.source));
        }
    }
    say!(
        "{} scenarios in {}",
        scenarios.len(),
        scenarios
            .first()
            .and_then(|r| r.file.parent())
            .map_or_else(|| "?".into(), |p| p.display().to_string())
    );
    Ok(EXIT_HELD)
}

/// The first sentence of a paragraph, cut to one terminal line.
fn first_sentence(text: &str) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let end = text.find(". ").map_or(text.len(), |i| i + 1);
    sweep::clip(&text[..end], 100)
}

fn cmd_merge(paths: &[PathBuf], report_dir: &Path) -> Result<u8, Fail> {
    let mut parts = Vec::new();
    for path in paths {
        parts.push((path.clone(), report::load_summary(path).map_err(bad_input)?));
    }
    let merged = report::merge(&parts).map_err(bad_input)?;
    prepare_report_dir(report_dir, &report::SUMMARY_FILES)?;
    let mut staged = report::ReportWriter::new(report_dir).map_err(report_error)?;
    // Bring the shards' failure files along, and draw their diagrams. A summary names
    // each as `failures/<plain name>.json` (checked when it was loaded); it is read only
    // from inside its shard's own directory, and written only inside the report dir.
    let mut diagrams = BTreeMap::new();
    // Only the failures whose files the merged summary keeps (a sweep's choice).
    let filed: std::collections::BTreeSet<(&str, u64)> = merged
        .failures
        .iter()
        .filter(|f| f.file.is_some())
        .map(|f| (f.scenario.as_str(), f.seed))
        .collect();
    for (path, part) in &parts {
        let from_dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        for f in &part.failures {
            let Some(rel) = &f.file else { continue };
            if !filed.contains(&(f.scenario.as_str(), f.seed)) {
                continue;
            }
            let Some(mut copied) = read_shard_failure(from_dir, rel, f)? else {
                continue;
            };
            let src = from_dir.join(rel);
            let dest = report_dir.join(rel);
            if !same_path(&src, &dest) {
                // The file now lives in the merged directory: it replays from there.
                copied.1.replay = failure::replay_command(&dest);
                staged
                    .stage(rel, &report::json_bytes(&copied.1))
                    .map_err(report_error)?;
            }
            if diagrams.len() < report::MAX_DIAGRAMS_IN_MARKDOWN {
                let file = copied.1;
                diagrams.insert(
                    (f.scenario.clone(), f.seed),
                    diagram::mermaid(
                        &file.trace,
                        &file.events,
                        Some(&file.invariant),
                        Some(diagram::DEFAULT_WINDOW),
                    ),
                );
            }
        }
    }
    report::stage_summary_files(&mut staged, &merged, &diagrams).map_err(report_error)?;
    staged.commit().map_err(report_error)?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "merge: {} shards into {}",
        parts.len(),
        report_dir.join("summary.json").display()
    );
    print_tail(&mut out, &merged, false);
    Ok(if merged.held() {
        EXIT_HELD
    } else {
        EXIT_FAILED
    })
}

/// A shard's failure file `rel` (already checked to be `failures/<plain name>.json`),
/// read from inside `dir` only — a symbolic link that leads out of it is refused — and
/// only if it is the failure file of `entry`. A missing or unreadable one is a warning:
/// its summary entry stays, without a file.
fn read_shard_failure(
    dir: &Path,
    rel: &str,
    entry: &report::FailureSummary,
) -> Result<Option<(Vec<u8>, FailureFile)>, Fail> {
    let src = dir.join(rel);
    let warn = |why: String| {
        eprintln!("warning: {}: {why}; its summary entry stays", src.display());
        Ok(None)
    };
    let (Ok(real_dir), Ok(real_src)) = (dir.canonicalize(), src.canonicalize()) else {
        return warn("is missing".into());
    };
    if !real_src.starts_with(&real_dir) {
        return Err(bad_input(format!(
            "{}: leads out of its shard's directory {} (to {}): refusing to read it",
            src.display(),
            dir.display(),
            real_src.display()
        )));
    }
    let bytes =
        match crate::input::read_capped(&real_src, failure::MAX_FAILURE_FILE_BYTES, "failure file")
        {
            Ok(bytes) => bytes,
            Err(e) => return warn(e),
        };
    let file: FailureFile = match serde_json::from_slice(&bytes) {
        Ok(file) if matches!(failure::format_of(&bytes), failure::Format::Failure) => file,
        _ => return warn("is not a palisade failure file".into()),
    };
    if file.scenario != entry.scenario || file.seed != entry.seed {
        return warn(format!(
            "is the failure of {} seed {}, not of {} seed {}",
            file.scenario, file.seed, entry.scenario, entry.seed
        ));
    }
    Ok(Some((bytes, file)))
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_log_keeps_madsims_reused_thread_warning_out_unless_asked() {
        for (rust_log, want) in [
            ("", "info,madsim::sim::rand=error"),
            ("debug", "debug,madsim::sim::rand=error"),
            (
                "palisade_sim::trace=debug,",
                "palisade_sim::trace=debug,madsim::sim::rand=error",
            ),
            ("madsim::sim::rand=warn", "madsim::sim::rand=warn"),
        ] {
            let got = log_directives(rust_log);
            assert_eq!(got, want, "RUST_LOG={rust_log:?}");
            assert!(palisade_embed::logging::filter(Some(&got)).is_ok(), "{got}");
        }
    }
}
