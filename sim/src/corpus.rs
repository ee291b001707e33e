//! The seed corpus: the plans a warm guided search ([`Strategy::Corpus`]) runs first.
//!
//! `palisade corpus` builds it. It runs the cold guided search (`coverage`) over every
//! shipped scenario at its default seed count with no mutant — what the main job runs
//! under `--strategy coverage` — keeping, as the search does, every plan that showed a
//! coverage feature its scenario had not shown yet (edge buckets of consecutive trace
//! event kinds, coverage marks by power-of-two hit count: [`search::features`]). It then
//! keeps the fewest of those plans that still show every feature any run showed, chosen
//! greedily — each next entry the plan that adds the most features not yet covered — and
//! writes them in that order to `corpus.json` beside the scenarios. Nothing in it knows
//! about mutants: the order is the coverage's, and a build that meets a failure writes
//! nothing.
//!
//! An entry names its scenario, the scenario's version and the seed it ran under; a warm
//! search runs it again under that seed with that plan, so it covers what it covered when
//! it was kept. An entry whose scenario changed version, or whose plan the scenario no
//! longer accepts, is stale: it is skipped, and the command says so (rebuild with
//! `palisade corpus`); a test keeps the shipped corpus free of stale entries. With no
//! entry for the scenarios of a run (a scenario file of one's own), the search starts
//! cold, as `coverage` does.
//!
//! [`Strategy::Corpus`]: crate::search::Strategy::Corpus

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::plan::FaultPlan;
use crate::scenario::{self, Resolved};
use crate::search::{self, Budget, Guided, Kept, SeedPlan};
use crate::seeds::SeedRange;
use crate::sweep;

/// The corpus file's name, in the scenarios directory.
pub const CORPUS_FILE: &str = "corpus.json";

/// The file format this build reads and writes.
pub const FORMAT: u32 = 1;

/// A corpus file larger than this is refused.
const MAX_CORPUS_BYTES: u64 = 32 << 20;

/// `corpus.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorpusFile {
    /// [`FORMAT`].
    pub format: u32,
    /// The command that built it, and from which commit.
    pub built_by: String,
    /// Runs the cold search made.
    pub runs: u64,
    /// Plans it kept.
    pub kept: u64,
    /// Features those runs showed, every one covered by the entries.
    pub features: u64,
    /// The entries, the one that adds the most features first.
    pub entries: Vec<Entry>,
}

/// One plan of the corpus.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// The scenario's name.
    pub scenario: String,
    /// The scenario's version when the plan was kept.
    pub version: u32,
    /// The seed it ran under.
    pub seed: u64,
    /// Features it adds to the entries before it.
    pub new_features: u64,
    /// The plan.
    pub plan: FaultPlan,
}

/// Where the corpus of the scenarios lives: beside the first scenarios directory that has
/// scenario files (the one `--scenario all` reads).
pub fn default_path() -> PathBuf {
    let dirs = scenario::scenario_dirs();
    dirs.iter()
        .find(|d| {
            std::fs::read_dir(d).is_ok_and(|mut it| {
                it.any(|e| e.is_ok_and(|e| e.path().extension().is_some_and(|x| x == "toml")))
            })
        })
        .or(dirs.last())
        .map(|d| d.join(CORPUS_FILE))
        .unwrap_or_else(|| PathBuf::from(CORPUS_FILE))
}

/// The file's bytes: JSON, one entry per line (a rebuilt corpus diffs entry by entry).
pub fn to_bytes(file: &CorpusFile) -> Vec<u8> {
    let mut out = String::from("{\n");
    out += &format!("  \"format\": {},\n", file.format);
    out += &format!("  \"built_by\": {},\n", json(file.built_by.as_str()));
    out += &format!("  \"runs\": {},\n", file.runs);
    out += &format!("  \"kept\": {},\n", file.kept);
    out += &format!("  \"features\": {},\n", file.features);
    out += "  \"entries\": [";
    for (i, e) in file.entries.iter().enumerate() {
        out += if i == 0 { "\n    " } else { ",\n    " };
        out += &json(e);
    }
    out += if file.entries.is_empty() {
        "]\n}\n"
    } else {
        "\n  ]\n}\n"
    };
    out.into_bytes()
}

/// Compact JSON of a value that always serializes (strings, plain structs).
fn json<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("corpus values always serialize")
}

/// Reads a corpus file.
pub fn read(path: &Path) -> Result<CorpusFile, String> {
    let bytes = crate::input::read_capped(path, MAX_CORPUS_BYTES, "corpus")?;
    let file: CorpusFile = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a corpus file: {e}", path.display()))?;
    if file.format != FORMAT {
        return Err(format!(
            "{}: corpus format {} (this build reads {FORMAT}); rebuild it with `palisade corpus`",
            path.display(),
            file.format
        ));
    }
    Ok(file)
}

/// The corpus entries that apply to `scenarios`, as seed plans, and the stale ones (a
/// scenario of the run whose version moved, or which refuses the plan), by description.
pub fn resolve(file: &CorpusFile, scenarios: &[Resolved]) -> (Vec<SeedPlan>, Vec<String>) {
    let mut plans = Vec::new();
    let mut stale = Vec::new();
    for (i, e) in file.entries.iter().enumerate() {
        let Some(s) = scenarios.iter().position(|r| r.scenario.name == e.scenario) else {
            continue;
        };
        let sc = &scenarios[s].scenario;
        if sc.version != e.version {
            stale.push(format!(
                "entry {i} ({} seed {}): kept under version {}, the scenario is at {}",
                e.scenario, e.seed, e.version, sc.version
            ));
        } else if let Err(why) = e.plan.validate(sc) {
            stale.push(format!(
                "entry {i} ({} seed {}): the scenario refuses its plan: {why}",
                e.scenario, e.seed
            ));
        } else {
            plans.push(SeedPlan {
                scenario: s,
                seed: e.seed,
                plan: e.plan.clone(),
            });
        }
    }
    (plans, stale)
}

/// What a build found instead of a corpus.
#[derive(Debug)]
pub struct BuildFailed {
    /// Runs made.
    pub runs: u64,
    /// The failing runs: scenario, seed, invariant.
    pub failures: Vec<(String, u64, String)>,
}

/// Runs the cold guided search over `ranges` of `scenarios` (no mutant) and distils what it
/// kept into a corpus. `built_by` is recorded in the file.
pub fn build(
    scenarios: &[Resolved],
    ranges: Vec<SeedRange>,
    jobs: usize,
    progress: bool,
    built_by: String,
) -> Result<CorpusFile, BuildFailed> {
    let total: u64 = ranges.iter().map(|r| r.len()).sum();
    let mut bar = sweep::Progress::new(progress, total, "corpus (coverage)");
    let mut guided = Guided::new(scenarios, Budget::PerScenario(ranges)).keep_features();
    let runs = search::run_guided(
        &mut guided,
        jobs,
        None,
        |c| (search::run_candidate(scenarios, c, None, false).0, ()),
        |r| bar.tick(r.failure.is_some()),
    );
    bar.finish();
    let failures: Vec<(String, u64, String)> = runs
        .iter()
        .filter_map(|(c, r, ())| {
            r.failure.as_ref().map(|f| {
                (
                    scenarios[c.scenario].scenario.name.clone(),
                    c.seed,
                    f.invariant.clone(),
                )
            })
        })
        .collect();
    if !failures.is_empty() {
        return Err(BuildFailed {
            runs: runs.len() as u64,
            failures,
        });
    }
    let kept = guided.into_kept();
    let picks = cover(&kept);
    let features = picks.iter().map(|&(_, n)| n).sum();
    Ok(CorpusFile {
        format: FORMAT,
        built_by,
        runs: runs.len() as u64,
        kept: kept.len() as u64,
        features,
        entries: picks
            .into_iter()
            .map(|(i, new)| {
                let k = &kept[i];
                let sc = &scenarios[k.scenario].scenario;
                Entry {
                    scenario: sc.name.clone(),
                    version: sc.version,
                    seed: k.seed,
                    new_features: new,
                    plan: k.plan.clone(),
                }
            })
            .collect(),
    })
}

/// A greedy set cover of every feature of `kept`: indices into it with the features each
/// adds, in pick order — each pick the plan adding the most features not yet covered, the
/// earlier-kept plan on a tie. Lazy: a plan's gain only shrinks, so a stale gain is
/// re-counted only when it reaches the top of the heap.
pub fn cover(kept: &[Kept]) -> Vec<(usize, u64)> {
    let top = kept
        .iter()
        .flat_map(|k| k.features.last())
        .max()
        .map_or(0, |&m| m as usize + 1);
    let mut covered = vec![false; top];
    let gain = |k: &Kept, covered: &[bool]| {
        k.features.iter().filter(|&&f| !covered[f as usize]).count() as u64
    };
    let mut heap: BinaryHeap<(u64, Reverse<usize>)> = kept
        .iter()
        .enumerate()
        .map(|(i, k)| (k.features.len() as u64, Reverse(i)))
        .collect();
    let mut picks = Vec::new();
    while let Some((bound, Reverse(i))) = heap.pop() {
        if bound == 0 {
            break;
        }
        let now = gain(&kept[i], &covered);
        let next = heap.peek().map(|&(g, Reverse(j))| (g, j));
        // Take it if its real gain still beats every other bound (ties: the lower index).
        let wins = match next {
            None => true,
            Some((g, j)) => now > g || (now == g && i < j),
        };
        if wins {
            if now == 0 {
                break;
            }
            for &f in &kept[i].features {
                covered[f as usize] = true;
            }
            picks.push((i, now));
        } else {
            heap.push((now, Reverse(i)));
        }
    }
    picks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(scenario: usize, seed: u64, features: &[u32]) -> Kept {
        Kept {
            scenario,
            seed,
            plan: FaultPlan::default(),
            features: features.to_vec(),
        }
    }

    #[test]
    fn the_cover_takes_the_biggest_gain_first_and_covers_everything() {
        let k = vec![
            kept(0, 0, &[1, 2, 3]),
            kept(0, 1, &[3, 4]),
            kept(1, 0, &[1, 2, 3, 4, 5]),
            kept(1, 1, &[6]),
            kept(1, 2, &[5, 6]),
        ];
        // 2 covers five; then 3 and 4 each add {6}: the earlier one wins the tie.
        assert_eq!(cover(&k), vec![(2, 5), (3, 1)]);
    }

    #[test]
    fn a_stale_bound_is_recounted_before_it_is_taken() {
        // 0 looks biggest (4) but adds only 1 once 1 is taken; 2 then adds 2.
        let k = vec![
            kept(0, 0, &[1, 2, 3, 9]),
            kept(0, 1, &[1, 2, 3, 4, 5]),
            kept(0, 2, &[6, 7]),
        ];
        assert_eq!(cover(&k), vec![(1, 5), (2, 2), (0, 1)]);
    }

    #[test]
    fn the_file_round_trips_one_entry_per_line() {
        let mut plan = FaultPlan::default();
        plan.swarm.insert("cancel".into(), 0.5);
        let entry = |seed| Entry {
            scenario: "swarm".into(),
            version: 3,
            seed,
            new_features: 7,
            plan: plan.clone(),
        };
        for entries in [vec![], vec![entry(1), entry(2)]] {
            let file = CorpusFile {
                format: FORMAT,
                built_by: "palisade corpus \"quoted\"".into(),
                runs: 10,
                kept: 4,
                features: 9,
                entries,
            };
            let bytes = to_bytes(&file);
            let back: CorpusFile = serde_json::from_slice(&bytes).expect("valid JSON");
            assert_eq!(back.entries, file.entries);
            assert_eq!(back.built_by, file.built_by);
            let text = String::from_utf8(bytes).expect("UTF-8");
            let entry_lines = text.lines().filter(|l| l.contains("\"seed\"")).count();
            assert_eq!(entry_lines, file.entries.len(), "{text}");
        }
    }

    #[test]
    fn an_empty_search_gives_an_empty_cover() {
        assert!(cover(&[]).is_empty());
        assert!(cover(&[kept(0, 0, &[])]).is_empty());
    }
}
