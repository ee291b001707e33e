//! What a sweep writes under `--report-dir`: `summary.json` (what `merge` reads),
//! `summary.md` (ready for `$GITHUB_STEP_SUMMARY`), `junit.xml`, and `failures/*.json`.
//!
//! A report is all or nothing ([`ReportWriter`]): every file of it is written to a
//! temporary name beside its destination and synced, and only when all of them were
//! written are they renamed into place; if a rename fails, the ones already renamed are
//! put back. A reader (or a CI artifact upload) never sees half a file, nor a summary
//! that points at failure files from another run.
//!
//! `merge` trusts nothing in the summaries it reads ([`validate_summary`]): shard indices,
//! seed counts, totals and failure file names are all checked, and a failure file is read
//! only from inside its shard's directory.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::mix::mix64;
use crate::seeds::{self, SeedRange, Shard};
use crate::sweep::{self, hex, SweepResult, DETERMINISM_INVARIANT};

/// The `format` field of `summary.json`.
pub const SUMMARY_FORMAT: &str = "palisade-summary/1";

/// Failures listed one by one in `summary.md`; the rest are counted. A CI step summary is
/// limited to 1 MiB.
pub const MAX_FAILURES_IN_MARKDOWN: usize = 20;

/// Failures that get a sequence diagram in `summary.md`.
pub const MAX_DIAGRAMS_IN_MARKDOWN: usize = 5;

/// Larger `summary.json` files are refused by `merge`: a summary lists every failing
/// seed (a few hundred bytes each), and a sweep writing more than this has a mutant on.
pub const MAX_SUMMARY_BYTES: u64 = 64 << 20;

/// The directory of failure files inside a report directory.
pub const FAILURES_DIR: &str = "failures";

/// The files of a summary, relative to the report directory.
pub const SUMMARY_FILES: [&str; 3] = ["summary.json", "summary.md", "junit.xml"];

/// The commit this run is measuring: `git rev-parse HEAD`, tried from this crate's source
/// directory and then the current one, else `unknown`. Never fails.
pub fn commit() -> &'static str {
    static COMMIT: OnceLock<String> = OnceLock::new();
    COMMIT.get_or_init(|| {
        let from_dir = |dir: &Path| -> Option<String> {
            let out = std::process::Command::new("git")
                .arg("-C")
                .arg(dir)
                .args(["rev-parse", "HEAD"])
                .stderr(std::process::Stdio::null())
                .output()
                .ok()?;
            let id = String::from_utf8(out.stdout).ok()?.trim().to_string();
            (out.status.success() && !id.is_empty()).then_some(id)
        };
        from_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
            .or_else(|| from_dir(Path::new(".")))
            .unwrap_or_else(|| "unknown".into())
    })
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, synced,
/// then renamed over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // A device, FIFO or socket (`-o /dev/null`, `-o /dev/stdout`, a named pipe) is written
    // in place: renaming a temporary file over it would replace the device node itself,
    // which, run as root, turns /dev/null into a regular file for every process on the
    // machine. A directory is refused rather than renamed onto.
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "is a directory",
            ));
        }
        if !meta.is_file() {
            let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
            return file.write_all(bytes);
        }
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let tmp = dir.join(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Serialises `value` as pretty JSON and writes it atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    write_atomic(path, &json_bytes(value))
}

/// `value` as pretty JSON with a final newline, as report files hold it.
pub fn json_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    let mut text = serde_json::to_string_pretty(value)
        .expect("report types have string keys and plain values, so they always serialize");
    text.push('\n');
    text.into_bytes()
}

/// Figures that depend on the machine and the moment, not on the seeds: left out when
/// two summaries are compared.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Wall-clock seconds of the sweep (for a merge: the slowest shard's).
    pub wall_seconds: f64,
    /// Worker threads (for a merge: the largest shard's).
    pub jobs: u64,
    /// Seconds spent in seed threads, summed over seeds. (The oracle's share is not
    /// measurable inside madsim, whose clock is simulated: compare a sweep with
    /// `PALISADE_ORACLE=off`.)
    pub seed_seconds: f64,
}

/// One scenario's part of a sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioSummary {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: u32,
    /// How to name it on a command line.
    pub spec: String,
    /// The seed range swept (the whole range, also in a shard).
    pub seed_range: SeedRange,
    /// The default seed count; coverage marks are enforced from this size on.
    pub default_seeds: u64,
    /// Seeds run.
    pub seeds: u64,
    /// Seeds failed.
    pub failed: u64,
    /// Trace events, summed.
    pub events: u64,
    /// Simulated milliseconds, summed.
    pub sim_millis: u64,
    /// Prompt turns, summed.
    pub turns: u64,
    /// An order-independent digest of every (seed, trace hash): equal digests mean equal
    /// traces, whether the seeds ran in one sweep or in shards.
    pub digest: String,
    /// Coverage marks hit, summed.
    pub marks: BTreeMap<String, u64>,
    /// Marks this scenario must hit in a sweep of the default size.
    pub min_marks: Vec<String>,
    /// Seconds spent in this scenario's seed threads.
    pub seed_seconds: f64,
}

/// One failing seed in the summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailureSummary {
    /// The scenario's name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// The invariant that broke.
    pub invariant: String,
    /// What happened.
    pub message: String,
    /// The trace's hash, or `none`.
    pub trace_hash: String,
    /// The failure file, relative to the report directory (absent for a divergence, whose
    /// replay would not be meaningful).
    pub file: Option<String>,
    /// The command that reproduces it from the seed.
    pub repro: String,
}

/// A required coverage mark that no seed hit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoverageGap {
    /// The scenario that requires it.
    pub scenario: String,
    /// The mark.
    pub mark: String,
}

/// `summary.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Always [`SUMMARY_FORMAT`].
    pub format: String,
    /// The commit measured.
    pub commit: String,
    /// The mutant switched on, by name.
    pub mutant: Option<String>,
    /// How the sweep chose its plans (`--strategy`). Summaries written before the field
    /// existed were all `uniform`.
    #[serde(default = "uniform_strategy")]
    pub strategy: String,
    /// The shard this summary covers; absent for a whole sweep or a merge.
    pub shard: Option<Shard>,
    /// Seeds run.
    pub seeds: u64,
    /// Seeds failed.
    pub failed: u64,
    /// Trace events, summed.
    pub events: u64,
    /// Simulated milliseconds, summed.
    pub sim_millis: u64,
    /// Seeds re-run by `--check-determinism`.
    pub determinism_checked: u64,
    /// Per scenario, in sweep order.
    pub scenarios: Vec<ScenarioSummary>,
    /// Every failing seed, by scenario then seed.
    pub failures: Vec<FailureSummary>,
    /// Required marks never hit (only judged for a whole sweep of the default size).
    pub coverage_gaps: Vec<CoverageGap>,
    /// Coverage marks over all scenarios, summed.
    pub marks: BTreeMap<String, u64>,
    /// Machine-dependent figures.
    pub timing: Timing,
}

fn uniform_strategy() -> String {
    crate::search::Strategy::Uniform.name().into()
}

impl Summary {
    /// Whether everything held.
    pub fn held(&self) -> bool {
        self.failed == 0 && self.coverage_gaps.is_empty()
    }
}

/// The path of a failing seed's file, relative to the report directory.
pub fn failure_file_name(scenario: &str, seed: u64, mutant_suffix: Option<&str>) -> String {
    match mutant_suffix {
        Some(m) => format!("failures/{scenario}-{seed}-{m}.json"),
        None => format!("failures/{scenario}-{seed}.json"),
    }
}

/// How to reproduce a seed whose plan the guided search made: its plan is not drawn from
/// the seed, so the sweep itself is the command (its failure file, when one was written,
/// replays alone).
fn guided_repro(spec: &str, config: &sweep::SweepConfig) -> String {
    let mut command = format!(
        "palisade sweep --scenario {} --strategy {}",
        crate::failure::shell_word(spec),
        config.strategy.name()
    );
    if let Some(m) = config.mutant {
        command.push_str(" --mutant ");
        command.push_str(m.name());
    }
    command.push_str(" (a guided plan: replay its failure file)");
    command
}

/// A scenario's digest term for one seed; a digest is their wrapping sum.
pub fn digest_term(seed: u64, hash: Option<u64>) -> u64 {
    // A panicked seed has no hash; it still counts, as a fixed odd constant.
    mix64(seed ^ mix64(hash.unwrap_or(0x5eed_dead_0000_0001)))
}

/// Builds the summary of a sweep. `failure_files` maps (scenario index, seed) to the
/// failure file written for it.
pub fn summarize(
    config: &sweep::SweepConfig,
    result: &SweepResult,
    failure_files: &BTreeMap<(usize, u64), String>,
) -> Summary {
    let mut scenarios: Vec<ScenarioSummary> = config
        .scenarios
        .iter()
        .zip(&config.ranges)
        .map(|(r, range)| ScenarioSummary {
            name: r.scenario.name.clone(),
            version: r.scenario.version,
            spec: r.spec.clone(),
            seed_range: *range,
            default_seeds: sweep::default_seeds(&r.scenario),
            seeds: 0,
            failed: 0,
            events: 0,
            sim_millis: 0,
            turns: 0,
            digest: String::new(),
            marks: BTreeMap::new(),
            min_marks: r.scenario.expect.min_marks.clone(),
            seed_seconds: 0.0,
        })
        .collect();
    let mut digests = vec![0u64; scenarios.len()];
    let mut failures = Vec::new();
    for rec in &result.records {
        let s = &mut scenarios[rec.scenario];
        s.seeds += 1;
        s.events += rec.stats.events;
        s.sim_millis += rec.stats.sim_millis;
        s.turns += u64::from(rec.stats.turns);
        s.seed_seconds += rec.wall_nanos as f64 / 1e9;
        digests[rec.scenario] =
            digests[rec.scenario].wrapping_add(digest_term(rec.seed, rec.trace_hash));
        for (mark, n) in &rec.marks {
            *s.marks.entry(mark.clone()).or_default() += n;
        }
        let diverged = result
            .divergences
            .iter()
            .find(|d| d.scenario == rec.scenario && d.seed == rec.seed);
        let resolved = &config.scenarios[rec.scenario];
        if let Some(f) = &rec.failure {
            s.failed += 1;
            failures.push(FailureSummary {
                scenario: s.name.clone(),
                seed: rec.seed,
                invariant: f.invariant.clone(),
                message: f.message.clone(),
                trace_hash: hex(rec.trace_hash),
                file: failure_files.get(&(rec.scenario, rec.seed)).cloned(),
                repro: if rec.guided_plan {
                    guided_repro(&resolved.spec, config)
                } else {
                    crate::failure::repro_command(&resolved.spec, rec.seed, config.mutant)
                },
            });
        } else if let Some(d) = diverged {
            s.failed += 1;
            failures.push(FailureSummary {
                scenario: s.name.clone(),
                seed: rec.seed,
                invariant: DETERMINISM_INVARIANT.into(),
                message: d.message.clone(),
                trace_hash: hex(rec.trace_hash),
                file: None,
                repro: if rec.guided_plan {
                    guided_repro(&resolved.spec, config)
                } else {
                    crate::failure::repro_command(&resolved.spec, rec.seed, config.mutant)
                },
            });
        }
    }
    for (s, d) in scenarios.iter_mut().zip(digests) {
        s.digest = format!("{d:016x}");
    }
    let mut summary = Summary {
        format: SUMMARY_FORMAT.into(),
        commit: commit().into(),
        mutant: config.mutant.map(|m| m.name().to_string()),
        strategy: config.strategy.name().into(),
        shard: config.shard,
        seeds: 0,
        failed: 0,
        events: 0,
        sim_millis: 0,
        determinism_checked: result.determinism_checked,
        scenarios,
        failures,
        coverage_gaps: Vec::new(),
        marks: BTreeMap::new(),
        timing: Timing {
            wall_seconds: result.wall.as_secs_f64(),
            jobs: config.jobs as u64,
            seed_seconds: 0.0,
        },
    };
    total_up(&mut summary).expect("a sweep's own figures add up: at most MAX_SEEDS_PER_RUN seeds");
    summary
}

/// Recomputes the totals, the marks and the coverage gaps from the per-scenario parts;
/// `Err` names a total that would overflow.
fn total_up(summary: &mut Summary) -> Result<(), String> {
    let sum = |field: &str, f: &dyn Fn(&ScenarioSummary) -> u64| {
        summary
            .scenarios
            .iter()
            .try_fold(0u64, |acc, s| acc.checked_add(f(s)))
            .ok_or_else(|| format!("{field}: the total over scenarios overflows"))
    };
    let seeds = sum("seeds", &|s| s.seeds)?;
    let failed = sum("failed", &|s| s.failed)?;
    let events = sum("events", &|s| s.events)?;
    let sim_millis = sum("sim_millis", &|s| s.sim_millis)?;
    summary.seeds = seeds;
    summary.failed = failed;
    summary.events = events;
    summary.sim_millis = sim_millis;
    summary.timing.seed_seconds = summary.scenarios.iter().map(|s| s.seed_seconds).sum();
    summary.marks.clear();
    for s in &summary.scenarios {
        for (mark, n) in &s.marks {
            let total = summary.marks.entry(mark.clone()).or_default();
            *total = total
                .checked_add(*n)
                .ok_or_else(|| format!("marks.{mark}: the total over scenarios overflows"))?;
        }
    }
    summary.coverage_gaps.clear();
    // A shard sees part of the seeds, and a small sweep may miss a rare mark by chance:
    // coverage is judged on whole sweeps of at least the default size.
    if summary.shard.is_none() {
        for s in &summary.scenarios {
            if s.seed_range.len() < s.default_seeds {
                continue;
            }
            for mark in &s.min_marks {
                if s.marks.get(mark).copied().unwrap_or(0) == 0 {
                    summary.coverage_gaps.push(CoverageGap {
                        scenario: s.name.clone(),
                        mark: mark.clone(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Reads a `summary.json` and checks that it is one a sweep could have written (see
/// [`validate_summary`]). Every error names the file and, where it applies, the JSON path
/// and the bound.
pub fn load_summary(path: &Path) -> Result<Summary, String> {
    let shown = path.display();
    let bytes = crate::input::read_capped(path, MAX_SUMMARY_BYTES, "summary")?;
    #[derive(Deserialize)]
    struct Probe {
        #[serde(default)]
        format: Option<serde_json::Value>,
    }
    let format = serde_json::from_slice::<Probe>(&bytes).map_err(|e| {
        if e.is_data() {
            format!("{shown}: not a palisade summary (no \"format\": {SUMMARY_FORMAT:?})")
        } else {
            format!("{shown}: not a palisade summary (not JSON: {e})")
        }
    })?;
    if format.format.as_ref().and_then(|f| f.as_str()) != Some(SUMMARY_FORMAT) {
        return Err(format!(
            "{shown}: not a palisade summary (no \"format\": {SUMMARY_FORMAT:?})"
        ));
    }
    let summary: Summary =
        serde_json::from_slice(&bytes).map_err(|e| format!("{shown}: malformed summary: {e}"))?;
    validate_summary(&summary).map_err(|e| format!("{shown}: {e}"))?;
    Ok(summary)
}

/// The plain failure file name (under [`FAILURES_DIR`]) of a summary entry, if its path
/// is one: `failures/<name>.json`, the name plain (see [`crate::input::is_plain_name`]).
pub fn failure_file_of(rel: &str) -> Option<&str> {
    let name = rel.strip_prefix(FAILURES_DIR)?.strip_prefix('/')?;
    (crate::input::is_plain_name(name) && name.ends_with(".json")).then_some(name)
}

/// Checks that a summary is one a sweep (or a shard of one) could have written: at least
/// one scenario, names that are scenario names, valid seed ranges, a shard index below
/// its count (at most [`seeds::MAX_SHARDS`]), each scenario's seed count exactly the
/// seeds of its range in that shard, failures counted and listed alike, every failing
/// seed in its scenario's range and shard, failure files plain names under
/// `failures/`, totals that add up without overflow, and finite, non-negative timings.
/// The error names the JSON path.
pub fn validate_summary(summary: &Summary) -> Result<(), String> {
    if let Some(shard) = summary.shard {
        if shard.count == 0 || shard.count > seeds::MAX_SHARDS {
            return Err(format!(
                "shard.count: {} shards is outside 1..={} (MAX_SHARDS)",
                shard.count,
                seeds::MAX_SHARDS
            ));
        }
        if shard.index >= shard.count {
            return Err(format!(
                "shard.index: shard {} of {} does not exist (an index is below its count)",
                shard.index, shard.count
            ));
        }
    }
    if summary.scenarios.is_empty() {
        return Err("scenarios: a summary of no scenarios is not a sweep".into());
    }
    if let Some(m) = &summary.mutant {
        if palisade_core::mutants::Mutant::from_name(m).is_none() {
            return Err(format!("mutant: unknown mutant {m:?}"));
        }
    }
    if crate::search::Strategy::from_name(&summary.strategy).is_none() {
        return Err(format!("strategy: unknown strategy {:?}", summary.strategy));
    }
    let mut totals = [0u64; 4];
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, s) in summary.scenarios.iter().enumerate() {
        let at = |field: &str| format!("scenarios[{i}].{field}");
        if !is_scenario_name(&s.name) {
            return Err(format!(
                "{}: {:?} is not a scenario name",
                at("name"),
                s.name
            ));
        }
        if names.insert(s.name.as_str(), i).is_some() {
            return Err(format!(
                "{}: scenario {:?} listed twice",
                at("name"),
                s.name
            ));
        }
        if s.seed_range.end <= s.seed_range.start {
            return Err(format!(
                "{}: {} holds no seed",
                at("seed_range"),
                s.seed_range
            ));
        }
        let expected = seeds::seeds_in(s.seed_range, summary.shard);
        if s.seeds != expected {
            return Err(format!(
                "{}: {} seeds, but {} of seed range {} holds {expected}",
                at("seeds"),
                s.seeds,
                summary
                    .shard
                    .map_or_else(|| "the whole sweep".to_string(), |sh| format!("shard {sh}")),
                s.seed_range
            ));
        }
        if s.failed > s.seeds {
            return Err(format!(
                "{}: {} failed of {} seeds",
                at("failed"),
                s.failed,
                s.seeds
            ));
        }
        let listed = summary
            .failures
            .iter()
            .filter(|f| f.scenario == s.name)
            .count() as u64;
        if listed != s.failed {
            return Err(format!(
                "{}: {} failed, but failures lists {listed} of scenario {:?}",
                at("failed"),
                s.failed,
                s.name
            ));
        }
        if s.digest.len() != 16 || u64::from_str_radix(&s.digest, 16).is_err() {
            return Err(format!(
                "{}: {:?} is not 16 hex digits",
                at("digest"),
                s.digest
            ));
        }
        for (field, v) in [("seed_seconds", s.seed_seconds)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{}: {v} is not a duration", at(field)));
            }
        }
        let mut marks = 0u64;
        for (mark, n) in &s.marks {
            marks = marks
                .checked_add(*n)
                .ok_or_else(|| format!("{}: mark {mark:?}: the counts overflow", at("marks")))?;
        }
        for (k, (field, v)) in [
            ("seeds", s.seeds),
            ("failed", s.failed),
            ("events", s.events),
            ("sim_millis", s.sim_millis),
        ]
        .into_iter()
        .enumerate()
        {
            totals[k] = totals[k]
                .checked_add(v)
                .ok_or_else(|| format!("{}: the total over scenarios overflows", at(field)))?;
        }
    }
    for (k, (field, v)) in [
        ("seeds", summary.seeds),
        ("failed", summary.failed),
        ("events", summary.events),
        ("sim_millis", summary.sim_millis),
    ]
    .into_iter()
    .enumerate()
    {
        if v != totals[k] {
            return Err(format!(
                "{field}: {v}, but the scenarios add up to {}",
                totals[k]
            ));
        }
    }
    if summary.determinism_checked > summary.seeds {
        return Err(format!(
            "determinism_checked: {} seeds re-run of {}",
            summary.determinism_checked, summary.seeds
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (j, f) in summary.failures.iter().enumerate() {
        let at = |field: &str| format!("failures[{j}].{field}");
        let Some(&i) = names.get(f.scenario.as_str()) else {
            return Err(format!(
                "{}: {:?} is not one of the summary's scenarios",
                at("scenario"),
                f.scenario
            ));
        };
        let s = &summary.scenarios[i];
        let in_shard = summary
            .shard
            .is_none_or(|sh| sh.holds(f.seed.wrapping_sub(s.seed_range.start)));
        if f.seed < s.seed_range.start || f.seed >= s.seed_range.end || !in_shard {
            return Err(format!(
                "{}: seed {} is not one this sweep ran (range {}{})",
                at("seed"),
                f.seed,
                s.seed_range,
                summary
                    .shard
                    .map(|sh| format!(", shard {sh}"))
                    .unwrap_or_default()
            ));
        }
        if !seen.insert((i, f.seed)) {
            return Err(format!("{}: seed {} listed twice", at("seed"), f.seed));
        }
        if let Some(file) = &f.file {
            if failure_file_of(file).is_none() {
                return Err(format!(
                    "{}: {file:?} is not a failure file name (failures/<plain name>.json, inside the report directory)",
                    at("file")
                ));
            }
        }
    }
    for (j, g) in summary.coverage_gaps.iter().enumerate() {
        if !names.contains_key(g.scenario.as_str()) {
            return Err(format!(
                "coverage_gaps[{j}].scenario: {:?} is not one of the summary's scenarios",
                g.scenario
            ));
        }
    }
    let t = &summary.timing;
    for (field, v) in [
        ("wall_seconds", t.wall_seconds),
        ("seed_seconds", t.seed_seconds),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("timing.{field}: {v} is not a duration"));
        }
    }
    Ok(())
}

fn is_scenario_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= crate::scenario::MAX_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Combines the summaries of the shards of one sweep. They must be the shards `0..N` of
/// the same sweep (same scenarios, versions, seed ranges, mutant and commit).
pub fn merge(parts: &[(PathBuf, Summary)]) -> Result<Summary, String> {
    let Some((first_path, first)) = parts.first() else {
        return Err("nothing to merge".into());
    };
    let shown = |p: &PathBuf| p.display().to_string();
    let count = match first.shard {
        Some(s) => s.count,
        None if parts.len() == 1 => 1,
        None => {
            return Err(format!(
                "{} is not a shard (it was not swept with --shard)",
                shown(first_path)
            ))
        }
    };
    // Every part passed `validate_summary`: its index is below its count, which is at most
    // MAX_SHARDS.
    let mut seen = vec![false; usize::try_from(count).unwrap_or(usize::MAX).min(1 << 20)];
    for (path, part) in parts {
        let index = match part.shard {
            Some(s) if s.count == count => s.index,
            None if count == 1 => 0,
            _ => {
                return Err(format!(
                    "{} is not one of {count} shards like {}",
                    shown(path),
                    shown(first_path)
                ))
            }
        };
        let Some(slot) = usize::try_from(index).ok().and_then(|i| seen.get_mut(i)) else {
            return Err(format!(
                "{}: shard index {index} is not below its count {count}",
                shown(path)
            ));
        };
        if *slot {
            return Err(format!(
                "shard {index}/{count} is given twice ({})",
                shown(path)
            ));
        }
        *slot = true;
        if part.mutant != first.mutant {
            return Err(format!(
                "{} swept mutant {:?} but {} swept {:?}",
                shown(path),
                part.mutant,
                shown(first_path),
                first.mutant
            ));
        }
        if part.strategy != first.strategy {
            return Err(format!(
                "{} chose its plans by {:?} but {} by {:?}",
                shown(path),
                part.strategy,
                shown(first_path),
                first.strategy
            ));
        }
        if part.commit != first.commit {
            return Err(format!(
                "{} measured commit {} but {} measured {}",
                shown(path),
                part.commit,
                shown(first_path),
                first.commit
            ));
        }
        let same_sweep = part.scenarios.len() == first.scenarios.len()
            && part.scenarios.iter().zip(&first.scenarios).all(|(a, b)| {
                a.name == b.name && a.version == b.version && a.seed_range == b.seed_range
            });
        if !same_sweep {
            return Err(format!(
                "{} and {} are shards of different sweeps (scenarios, versions or seed ranges differ)",
                shown(path),
                shown(first_path)
            ));
        }
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(format!("shard {missing}/{count} is missing"));
    }

    let mut merged = first.clone();
    merged.shard = None;
    merged.determinism_checked = parts.iter().map(|(_, p)| p.determinism_checked).sum();
    merged.timing = Timing {
        wall_seconds: parts
            .iter()
            .map(|(_, p)| p.timing.wall_seconds)
            .fold(0.0, f64::max),
        jobs: parts.iter().map(|(_, p)| p.timing.jobs).max().unwrap_or(0),
        seed_seconds: 0.0,
    };
    for (i, s) in merged.scenarios.iter_mut().enumerate() {
        let all = parts.iter().map(|(_, p)| &p.scenarios[i]);
        s.seeds = 0;
        s.failed = 0;
        s.events = 0;
        s.sim_millis = 0;
        s.turns = 0;
        s.seed_seconds = 0.0;
        s.marks.clear();
        let mut digest = 0u64;
        let overflow = |field: &str| format!("scenarios[{i}].{field}: the shards' total overflows");
        for part in all {
            s.seeds = s
                .seeds
                .checked_add(part.seeds)
                .ok_or_else(|| overflow("seeds"))?;
            s.failed = s
                .failed
                .checked_add(part.failed)
                .ok_or_else(|| overflow("failed"))?;
            s.events = s
                .events
                .checked_add(part.events)
                .ok_or_else(|| overflow("events"))?;
            s.sim_millis = s
                .sim_millis
                .checked_add(part.sim_millis)
                .ok_or_else(|| overflow("sim_millis"))?;
            s.turns = s
                .turns
                .checked_add(part.turns)
                .ok_or_else(|| overflow("turns"))?;
            s.seed_seconds += part.seed_seconds;
            let d = u64::from_str_radix(&part.digest, 16)
                .map_err(|_| format!("bad digest {:?} in scenario {}", part.digest, part.name))?;
            // The digest is a sum modulo 2^64 by definition (see `digest_term`).
            digest = digest.wrapping_add(d);
            for (mark, n) in &part.marks {
                let total = s.marks.entry(mark.clone()).or_default();
                *total = total.checked_add(*n).ok_or_else(|| overflow("marks"))?;
            }
        }
        s.digest = format!("{digest:016x}");
    }
    let order: BTreeMap<&str, usize> = merged
        .scenarios
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let mut failures: Vec<FailureSummary> = parts
        .iter()
        .flat_map(|(_, p)| p.failures.iter().cloned())
        .collect();
    failures.sort_by_key(|f| (order.get(f.scenario.as_str()).copied(), f.seed));
    // A sweep keeps the files of each scenario's lowest failing seeds only; each shard kept
    // its own lowest, which include every one of the whole sweep's that fell in it. Keep
    // the sweep's choice: a determinism divergence never has a file, and does not count.
    let mut filed: BTreeMap<String, usize> = BTreeMap::new();
    for f in &mut failures {
        if f.invariant == crate::sweep::DETERMINISM_INVARIANT {
            continue;
        }
        let rank = filed.entry(f.scenario.clone()).or_default();
        *rank += 1;
        if *rank > crate::sweep::MAX_FAILURE_FILES_PER_SCENARIO {
            f.file = None;
        }
    }
    merged.failures = failures;
    total_up(&mut merged)?;
    Ok(merged)
}

fn md_cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// `summary.md`: headline, per-scenario table, failures with their repro commands and
/// diagrams, coverage marks. `diagrams` maps (scenario, seed) to a mermaid diagram.
pub fn render_markdown(
    summary: &Summary,
    report_dir: &Path,
    diagrams: &BTreeMap<(String, u64), String>,
) -> String {
    let mut md = String::new();
    let verdict = if summary.held() {
        "✅ all held".to_string()
    } else if summary.failed > 0 {
        format!("❌ {} failed", summary.failed)
    } else {
        format!(
            "❌ {} coverage marks never hit",
            summary.coverage_gaps.len()
        )
    };
    let _ = writeln!(md, "## Palisade sweep: {verdict}\n");
    let rate = summary.seeds as f64 / summary.timing.wall_seconds.max(1e-9);
    let _ = writeln!(
        md,
        "{} seeds over {} scenarios · mutant: {} · strategy: {} · commit `{}`{} · {:.0} seeds/s · {} events · {:.1} simulated s",
        summary.seeds,
        summary.scenarios.len(),
        summary.mutant.as_deref().unwrap_or("none"),
        summary.strategy,
        summary.commit,
        summary
            .shard
            .map(|s| format!(" · shard {s}"))
            .unwrap_or_default(),
        rate,
        summary.events,
        summary.sim_millis as f64 / 1e3,
    );
    if summary.determinism_checked > 0 {
        let differed = summary
            .failures
            .iter()
            .filter(|f| f.invariant == DETERMINISM_INVARIANT)
            .count();
        let _ = writeln!(
            md,
            "\nDeterminism: {} seeds re-run, {differed} differed.",
            summary.determinism_checked
        );
    }
    let _ = writeln!(
        md,
        "\n| scenario | version | seeds | seed range | failed | events | simulated s |\n|---|---:|---:|---|---:|---:|---:|"
    );
    for s in &summary.scenarios {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.1} |",
            md_cell(&s.name),
            s.version,
            s.seeds,
            s.seed_range,
            if s.failed > 0 {
                format!("**{}**", s.failed)
            } else {
                "0".into()
            },
            s.events,
            s.sim_millis as f64 / 1e3
        );
    }

    if !summary.failures.is_empty() {
        let _ = writeln!(md, "\n### Failures\n");
        for (i, f) in summary.failures.iter().enumerate() {
            if i == MAX_FAILURES_IN_MARKDOWN {
                let _ = writeln!(
                    md,
                    "…and {} more: see `summary.json` and `failures/`.\n",
                    summary.failures.len() - i
                );
                break;
            }
            let _ = writeln!(
                md,
                "#### `{}` seed {}: `{}`\n",
                f.scenario, f.seed, f.invariant
            );
            for line in f.message.lines() {
                let _ = writeln!(md, "> {line}");
            }
            let _ = writeln!(md);
            if let Some(file) = &f.file {
                let _ = writeln!(
                    md,
                    "- replay: `{}`",
                    crate::failure::replay_command(&report_dir.join(file))
                );
            }
            let _ = writeln!(md, "- from the seed: `{}`", f.repro);
            let _ = writeln!(md, "- trace hash `{}`\n", f.trace_hash);
            if let Some(diagram) = diagrams.get(&(f.scenario.clone(), f.seed)) {
                let _ = writeln!(
                    md,
                    "<details><summary>sequence diagram</summary>\n\n```mermaid\n{}```\n\n</details>\n",
                    diagram
                );
            }
        }
    }

    let _ = writeln!(md, "\n### Coverage marks\n");
    let mut required: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for s in &summary.scenarios {
        for m in &s.min_marks {
            required
                .entry(m.as_str())
                .or_default()
                .push(s.name.as_str());
        }
    }
    let mut names: Vec<&str> = summary.marks.keys().map(String::as_str).collect();
    names.extend(required.keys().copied());
    names.sort_unstable();
    names.dedup();
    if names.is_empty() {
        let _ = writeln!(md, "No coverage marks were recorded.");
    } else {
        let _ = writeln!(md, "| mark | hits | required by |\n|---|---:|---|");
        for name in names {
            let hits = summary.marks.get(name).copied().unwrap_or(0);
            let gap = summary.coverage_gaps.iter().any(|g| g.mark == name);
            let _ = writeln!(
                md,
                "| {} | {}{} | {} |",
                md_cell(name),
                hits,
                if gap { " ❌" } else { "" },
                required.get(name).map(|v| v.join(", ")).unwrap_or_default()
            );
        }
    }
    if !summary.coverage_gaps.is_empty() {
        let _ = writeln!(
            md,
            "\nNever hit in a sweep of the default size (a failure):\n"
        );
        for g in &summary.coverage_gaps {
            let _ = writeln!(md, "- `{}` in `{}`", g.mark, g.scenario);
        }
    }
    md
}

/// Escapes text for an XML attribute or element.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' => out.push(c),
            // XML 1.0 cannot carry other control characters at all.
            c if (c as u32) < 0x20 => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// `junit.xml`: one test case per scenario, one `<failure>` per failing seed or
/// coverage gap.
pub fn render_junit(summary: &Summary, report_dir: &Path) -> String {
    let failing_cases = summary
        .scenarios
        .iter()
        .filter(|s| s.failed > 0 || summary.coverage_gaps.iter().any(|g| g.scenario == s.name))
        .count();
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        xml,
        "<testsuites name=\"palisade\" tests=\"{}\" failures=\"{failing_cases}\" time=\"{:.3}\">",
        summary.scenarios.len(),
        summary.timing.wall_seconds
    );
    let _ = writeln!(
        xml,
        "  <testsuite name=\"palisade sweep{}\" tests=\"{}\" failures=\"{failing_cases}\" errors=\"0\" time=\"{:.3}\">",
        summary
            .mutant
            .as_deref()
            .map(|m| format!(" (mutant {})", xml_escape(m)))
            .unwrap_or_default(),
        summary.scenarios.len(),
        summary.timing.wall_seconds
    );
    for s in &summary.scenarios {
        let _ = writeln!(
            xml,
            "    <testcase classname=\"palisade.scenarios\" name=\"{}\" time=\"{:.3}\">",
            xml_escape(&s.name),
            s.seed_seconds
        );
        for f in summary.failures.iter().filter(|f| f.scenario == s.name) {
            let mut body = format!("{}\nrepro: {}\n", f.message, f.repro);
            if let Some(file) = &f.file {
                let _ = writeln!(
                    body,
                    "replay: {}",
                    crate::failure::replay_command(&report_dir.join(file))
                );
            }
            let _ = writeln!(body, "trace hash: {}", f.trace_hash);
            let _ = writeln!(
                xml,
                "      <failure type=\"{}\" message=\"seed {}: {}\">{}</failure>",
                xml_escape(&f.invariant),
                f.seed,
                xml_escape(&f.invariant),
                xml_escape(&body)
            );
        }
        for g in summary
            .coverage_gaps
            .iter()
            .filter(|g| g.scenario == s.name)
        {
            let _ = writeln!(
                xml,
                "      <failure type=\"coverage\" message=\"coverage mark {} never hit\">a sweep of the default size ({} seeds) must hit it at least once</failure>",
                xml_escape(&g.mark),
                s.default_seeds
            );
        }
        let _ = writeln!(xml, "    </testcase>");
    }
    let _ = writeln!(xml, "  </testsuite>\n</testsuites>");
    xml
}

/// Stages `summary.json`, `summary.md` and `junit.xml` in `report` (see [`ReportWriter`]).
pub fn stage_summary_files(
    report: &mut ReportWriter,
    summary: &Summary,
    diagrams: &BTreeMap<(String, u64), String>,
) -> Result<(), ReportError> {
    let mut json = serde_json::to_string_pretty(summary).map_err(|e| ReportError {
        path: report.dir().join(SUMMARY_FILES[0]),
        message: format!("cannot serialize: {e}"),
    })?;
    json.push('\n');
    let dir = report.dir().to_path_buf();
    report.stage(SUMMARY_FILES[0], json.as_bytes())?;
    report.stage(
        SUMMARY_FILES[1],
        render_markdown(summary, &dir, diagrams).as_bytes(),
    )?;
    report.stage(SUMMARY_FILES[2], render_junit(summary, &dir).as_bytes())
}

/// A report file that could not be written, and why (the message names the file).
#[derive(Debug)]
pub struct ReportError {
    /// The file.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
}

impl std::fmt::Display for ReportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

/// The files of one report, written all or nothing.
///
/// [`ReportWriter::stage`] writes each file to a temporary name beside its destination
/// and syncs it; [`ReportWriter::commit`] renames them all into place, and if one rename
/// fails it puts back the files it had already replaced (from hard links taken before)
/// and removes the rest. Dropped without a commit, it removes its temporaries: the report
/// directory is as it was. Destinations are relative paths, always inside the report
/// directory (checked).
#[derive(Debug)]
pub struct ReportWriter {
    dir: PathBuf,
    /// (temporary, destination), in staging order.
    staged: Vec<(PathBuf, PathBuf)>,
}

impl ReportWriter {
    /// A writer into `dir`, which must be a directory (it is created if missing).
    pub fn new(dir: &Path) -> Result<ReportWriter, ReportError> {
        prepare_dir(dir)?;
        Ok(ReportWriter {
            dir: dir.to_path_buf(),
            staged: Vec::new(),
        })
    }

    /// The report directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Checks, before anything runs, that the files of a report could be written: every
    /// destination that exists is a regular file (not a directory, say), and the
    /// directories it needs are directories.
    ///
    /// The directory is tried, not trusted: a file is created in it and removed (in
    /// `failures/` too, when it exists). A directory can be one nobody may write in
    /// (`/proc`, a read-only mount): before, `sweep --report-dir /proc` ran every seed and
    /// only then failed to write, its results lost.
    pub fn check(dir: &Path, rels: &[&str]) -> Result<(), ReportError> {
        prepare_dir(dir)?;
        check_writable(dir)?;
        for rel in rels {
            check_destination(&dir.join(rel))?;
        }
        let failures = dir.join(FAILURES_DIR);
        if failures.exists() && !failures.is_dir() {
            return Err(ReportError {
                path: failures,
                message: "exists and is not a directory (failure files go there)".into(),
            });
        }
        if failures.is_dir() {
            check_writable(&failures)?;
        }
        Ok(())
    }

    /// Writes `bytes` to a temporary file beside `dir/rel`, synced; the file appears under
    /// its name only at [`ReportWriter::commit`].
    pub fn stage(&mut self, rel: &str, bytes: &[u8]) -> Result<(), ReportError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let dest = self.dir.join(rel);
        let fail = |message: String| ReportError {
            path: dest.clone(),
            message,
        };
        let inside = Path::new(rel)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !inside {
            return Err(fail("not a path inside the report directory".into()));
        }
        check_destination(&dest)?;
        let parent = dest.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent)
            .map_err(|e| fail(format!("cannot create its directory: {e}")))?;
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "out".into());
        let tmp = parent.join(format!(
            ".{name}.tmp-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(bytes)?;
            file.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail(format!("cannot write: {e}")));
        }
        self.staged.push((tmp, dest));
        Ok(())
    }

    /// Renames every staged file into place; all of them, or (on an error) none.
    pub fn commit(mut self) -> Result<(), ReportError> {
        let staged = std::mem::take(&mut self.staged);
        // Keep what each rename replaces, to put it back if a later rename fails.
        let mut backups: Vec<Option<PathBuf>> = Vec::with_capacity(staged.len());
        for (tmp, dest) in &staged {
            let mut backup = tmp.clone().into_os_string();
            backup.push(".bak");
            let backup = PathBuf::from(backup);
            let kept = dest.is_file()
                && (std::fs::hard_link(dest, &backup).is_ok()
                    || std::fs::copy(dest, &backup).is_ok());
            backups.push(kept.then_some(backup));
        }
        let mut done = 0;
        let mut failure = None;
        for (tmp, dest) in &staged {
            if let Err(e) = std::fs::rename(tmp, dest) {
                failure = Some(ReportError {
                    path: dest.clone(),
                    message: format!("cannot write: {e}"),
                });
                break;
            }
            done += 1;
        }
        if let Some(error) = failure {
            for ((tmp, dest), backup) in staged.iter().zip(&backups).take(done) {
                let _ = match backup {
                    Some(b) => std::fs::rename(b, dest),
                    None => std::fs::remove_file(dest),
                };
                let _ = std::fs::remove_file(tmp);
            }
            for ((tmp, _), backup) in staged.iter().zip(&backups).skip(done) {
                let _ = std::fs::remove_file(tmp);
                if let Some(b) = backup {
                    let _ = std::fs::remove_file(b);
                }
            }
            return Err(error);
        }
        for b in backups.into_iter().flatten() {
            let _ = std::fs::remove_file(b);
        }
        if let Ok(dir) = std::fs::File::open(&self.dir) {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

impl Drop for ReportWriter {
    fn drop(&mut self) {
        for (tmp, _) in &self.staged {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

fn prepare_dir(dir: &Path) -> Result<(), ReportError> {
    if dir.exists() && !dir.is_dir() {
        return Err(ReportError {
            path: dir.to_path_buf(),
            message: "exists and is not a directory".into(),
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| ReportError {
        path: dir.to_path_buf(),
        message: format!("cannot write there: the directory cannot be created: {e}"),
    })
}

/// Tries `dir` as a place to write in: creates a file there (a name of its own, never an
/// existing file's) and removes it.
pub fn check_writable(dir: &Path) -> Result<(), ReportError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let probe = dir.join(format!(
        ".palisade-probe-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe);
    match created {
        Ok(file) => {
            drop(file);
            std::fs::remove_file(&probe).map_err(|e| ReportError {
                path: dir.to_path_buf(),
                message: format!(
                    "cannot write there: a file created in it cannot be removed ({}): {e}",
                    probe.display()
                ),
            })
        }
        Err(e) => Err(ReportError {
            path: dir.to_path_buf(),
            message: format!("cannot write there: creating a file in it failed: {e}"),
        }),
    }
}

/// Checks, before anything runs, that `path` could be written by [`write_atomic`]: a
/// device, FIFO or socket that exists is written in place (and left alone here); anything
/// else needs a directory (created if missing, as `write_atomic` does) in which a file can
/// be created, and must not be a directory itself.
pub fn check_writable_file(path: &Path) -> Result<(), ReportError> {
    let fail = |message: String| ReportError {
        path: path.to_path_buf(),
        message,
    };
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.is_dir() {
            return Err(fail("is a directory, not a file".into()));
        }
        if !meta.is_file() {
            return Ok(());
        }
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if dir.exists() && !dir.is_dir() {
        return Err(fail(format!("{} is not a directory", dir.display())));
    }
    std::fs::create_dir_all(dir).map_err(|e| {
        fail(format!(
            "cannot write there: its directory {} cannot be created: {e}",
            dir.display()
        ))
    })?;
    check_writable(dir)
}

/// A destination that exists must be a regular file (or a link to one): a rename over a
/// directory fails, and only after other files of the report were replaced.
fn check_destination(dest: &Path) -> Result<(), ReportError> {
    match std::fs::metadata(dest) {
        Ok(meta) if !meta.is_file() => Err(ReportError {
            path: dest.to_path_buf(),
            message: if meta.is_dir() {
                "is a directory, not a file: the report cannot be written".into()
            } else {
                "is not a regular file: the report cannot be written".into()
            },
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escape_handles_markup_and_controls() {
        assert_eq!(
            xml_escape("a<b & \"c\"\u{1}"),
            "a&lt;b &amp; &quot;c&quot;?"
        );
    }

    #[test]
    fn a_report_whose_last_rename_fails_puts_back_what_it_replaced() {
        let dir = std::env::temp_dir().join(format!("palisade-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("a.json"), "old a").expect("write");
        let mut report = ReportWriter::new(&dir).expect("writer");
        report.stage("a.json", b"new a").expect("stage a");
        report.stage("failures/x.json", b"new x").expect("stage x");
        report.stage("b.xml", b"new b").expect("stage b");
        // b.xml becomes a directory after it was staged: its rename fails at commit.
        std::fs::create_dir(dir.join("b.xml")).expect("mkdir");
        let e = report.commit().expect_err("the last rename fails");
        assert!(e.path.ends_with("b.xml"), "{e}");
        assert_eq!(
            std::fs::read_to_string(dir.join("a.json")).expect("a"),
            "old a"
        );
        assert!(!dir.join("failures/x.json").exists());
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .chain(std::fs::read_dir(dir.join("failures")).expect("failures"))
            .map(|e| e.expect("entry").file_name())
            .filter(|n| n.to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        // Dropped without a commit: nothing appears.
        let mut report = ReportWriter::new(&dir).expect("writer");
        report.stage("c.json", b"c").expect("stage c");
        drop(report);
        assert_eq!(
            std::fs::read_dir(&dir).expect("dir").count(),
            3,
            "a.json, b.xml, failures/"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn write_atomic_writes_into_a_fifo_instead_of_replacing_it() {
        use std::os::unix::fs::FileTypeExt;
        let dir = std::env::temp_dir().join(format!("palisade-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success(), "mkfifo failed");
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(&fifo).expect("read fifo"))
        };
        write_atomic(&fifo, b"through the pipe").expect("write into the fifo");
        // Checked before joining: had the FIFO been replaced, the reader would block forever.
        let kind = std::fs::symlink_metadata(&fifo)
            .expect("still there")
            .file_type();
        assert!(kind.is_fifo(), "the FIFO was replaced by {kind:?}");
        assert_eq!(reader.join().expect("reader"), b"through the pipe");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "a temporary file was left: {names:?}");
        assert!(
            write_atomic(&dir, b"x").is_err(),
            "a directory is not a file"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn write_atomic_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("palisade-atomic-{}", std::process::id()));
        let path = dir.join("x.json");
        write_atomic(&path, b"one").expect("write");
        write_atomic(&path, b"two").expect("overwrite");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
