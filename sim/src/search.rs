//! Search strategies: which (scenario, seed, plan) runs next.
//!
//! - [`Strategy::Uniform`]: every seed's plan is drawn from the seed (swarm testing); a
//!   sweep runs seeds `A..B` of every scenario, the scoreboard interleaves seed 0 of every
//!   scenario, then seed 1, ….
//! - [`Strategy::Coverage`]: coverage-guided plans, as a fuzzer does. Runs go in
//!   generations. Every run reports its coverage — the edge buckets of consecutive trace
//!   event kinds ([`crate::runner::SeedOutcome::edges`]) and the coverage marks bucketed by
//!   their count — and a plan that hits a feature its scenario had not seen yet is kept in
//!   that scenario's corpus. The next generation runs, per slot, either a fresh seed (its
//!   plan drawn from the seed, as uniform does) or a mutant of a kept plan: a fault moved
//!   in time or to another session, dropped or duplicated, a fault transplanted from
//!   another seed's draw, a time window spliced from another kept plan, or the
//!   configuration and environment re-drawn. Scenarios whose runs keep finding new
//!   features get more of the scoreboard's slots (energy).
//!
//! - [`Strategy::Corpus`]: the coverage-guided search, warm: its first generation replays
//!   the seed corpus shipped beside the scenarios (`scenarios/corpus.json`, built by
//!   `palisade corpus` from a cold guided sweep of the unmutated core, see
//!   [`crate::corpus`]), in the corpus's order — the plan that covers the most coverage
//!   features first — and learns from those runs before it goes on as `coverage` does. A
//!   fuzzer keeps its corpus between runs the same way.
//!
//! Everything is derived from the generation number and the results of earlier
//! generations, in index order: a guided run is the same at any number of jobs. Every
//! candidate runs under its own seed (unique within its scenario); a mutated plan is
//! recorded in full in its failure file, which replays alone. A guided search is not
//! shardable: each generation depends on every earlier one (`--shard` is refused).

use std::collections::BTreeSet;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use palisade_core::mutants::Mutant;

use crate::logbook::MARKS;
use crate::mix::mix64;
use crate::plan::{self, Fault, FaultKind, FaultPlan};
use crate::record::{self, SeedRecord};
use crate::runner;
use crate::scenario::Resolved;
use crate::seeds::SeedRange;

/// A search strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Plans drawn from consecutive seeds.
    Uniform,
    /// Coverage-guided plans (see the module doc).
    Coverage,
    /// Coverage-guided plans, starting from the shipped seed corpus.
    Corpus,
}

impl Strategy {
    /// Every strategy, in the order reports list them.
    pub const ALL: [Strategy; 3] = [Strategy::Uniform, Strategy::Coverage, Strategy::Corpus];

    /// The name used on the command line and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::Uniform => "uniform",
            Strategy::Coverage => "coverage",
            Strategy::Corpus => "corpus",
        }
    }

    /// Guided: each run depends on earlier ones (not shardable).
    pub const fn is_guided(self) -> bool {
        !matches!(self, Strategy::Uniform)
    }

    /// Parses a name.
    pub fn from_name(name: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The names, for error messages.
    pub fn names() -> String {
        Strategy::ALL
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The strategy `sweep` and `mutants` use when none is named: the one that finds the
/// mutants in fewer seed runs on the scoreboard (`reports/mutants.md`).
pub const DEFAULT_STRATEGY: Strategy = Strategy::Corpus;

/// Plans kept per scenario: enough to hold every distinct behaviour a scenario shows in a
/// sweep; past it a new plan replaces a random kept one.
pub const MAX_CORPUS_PER_SCENARIO: usize = 256;

/// Mutation operators applied to one child, at most.
const MAX_MUTATIONS: u32 = 4;

/// Attempts at a valid mutant before a slot falls back to a fresh seed.
const MUTATION_TRIES: u32 = 4;

/// Salt that separates the search's stream from every other use of a seed.
const SEARCH_SALT: u64 = 0x5ea2_c4ed_0000_0001;

/// One run a search asks for.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Index into the scenarios.
    pub scenario: usize,
    /// The seed (madsim's scheduler and the world's per-message decisions).
    pub seed: u64,
    /// The plan, when the search made it; `None`: drawn from the seed.
    pub plan: Option<FaultPlan>,
}

/// A plan a warm guided search runs first: an entry of the seed corpus, resolved against
/// the scenarios of the run.
#[derive(Clone, Debug, PartialEq)]
pub struct SeedPlan {
    /// Index into the scenarios.
    pub scenario: usize,
    /// The seed the plan was found with (it runs under it again, so it covers what it
    /// covered when it was kept).
    pub seed: u64,
    /// The plan.
    pub plan: FaultPlan,
}

/// A plan a search kept, with every feature its run showed (for `palisade corpus`).
#[derive(Clone, Debug)]
pub struct Kept {
    /// Index into the scenarios.
    pub scenario: usize,
    /// The seed it ran under.
    pub seed: u64,
    /// The plan.
    pub plan: FaultPlan,
    /// Its run's features, sorted, without repeats.
    pub features: Vec<u32>,
}

/// How a search spends its runs.
#[derive(Clone, Debug)]
pub enum Budget {
    /// Each scenario runs exactly its own number of candidates, with seeds from its range
    /// (a sweep: the summary's seed counts stay what they are under uniform).
    PerScenario(Vec<SeedRange>),
    /// Up to `total` runs shared among all scenarios, with seeds from 0; scenarios that
    /// keep finding new coverage get more (the scoreboard).
    Shared {
        /// Runs at most.
        total: u64,
    },
}

#[derive(Clone, Debug, Default)]
struct Corpus {
    /// Features seen (edge buckets; marks above `MARK_FEATURES`).
    seen: BTreeSet<u32>,
    /// Plans that found a new feature, in the order they did.
    plans: Vec<FaultPlan>,
    /// Candidates issued.
    issued: u64,
    /// Fresh seeds handed out (a seed is fresh unless a seed plan took it).
    fresh: u64,
    /// Seeds the seed plans took, which fresh seeds skip.
    taken: BTreeSet<u64>,
    /// New features found by the last generation's runs (energy).
    recent: u64,
    /// Generations of fresh seeds this scenario took part in (its own random stream's
    /// position: see [`scenario_rng`]).
    generations: u64,
}

/// Feature ids of marks start here, above every edge bucket.
const MARK_FEATURES: u32 = 1 << 16;
const _: () = assert!(crate::logbook::trace::EDGE_BITS as u32 <= MARK_FEATURES);

/// A coverage-guided search over `scenarios`.
#[derive(Clone, Debug)]
pub struct Guided<'a> {
    scenarios: &'a [Resolved],
    budget: Budget,
    corpora: Vec<Corpus>,
    generation: u64,
    issued: u64,
    /// Seed plans not yet issued (the first generation runs them).
    seeds: Vec<SeedPlan>,
    /// Whether the first generation of fresh seeds (one slot per scenario) is still due.
    first_fresh: bool,
    /// Every kept plan with its features, when asked for ([`Guided::keep_features`]).
    kept: Option<Vec<Kept>>,
}

impl<'a> Guided<'a> {
    /// A search with nothing learnt yet.
    pub fn new(scenarios: &'a [Resolved], budget: Budget) -> Self {
        Guided {
            scenarios,
            budget,
            corpora: scenarios.iter().map(|_| Corpus::default()).collect(),
            generation: 0,
            issued: 0,
            seeds: Vec::new(),
            first_fresh: true,
            kept: None,
        }
    }

    /// A warm search: its first generation runs `seeds`, in order (within the budget: a
    /// scenario's seed plans count against its runs), before any fresh seed.
    pub fn with_seed_plans(mut self, seeds: Vec<SeedPlan>) -> Self {
        self.seeds = seeds;
        self
    }

    /// The first candidate the search will run, as (scenario, seed), without running
    /// anything: a corpus entry when it starts warm, else the first scenario's first seed.
    pub fn first_candidate(&self) -> Option<(usize, u64)> {
        self.clone()
            .next_batch()
            .first()
            .map(|c| (c.scenario, c.seed))
    }

    /// Records every kept plan with its features ([`Guided::into_kept`]).
    pub fn keep_features(mut self) -> Self {
        self.kept = Some(Vec::new());
        self
    }

    /// The kept plans with their features, in the order they were kept.
    pub fn into_kept(self) -> Vec<Kept> {
        self.kept.unwrap_or_default()
    }

    /// Whether scenario `s` may run one more candidate within the budget.
    fn has_room(&self, s: usize) -> bool {
        match &self.budget {
            Budget::PerScenario(ranges) => self.corpora[s].issued < ranges[s].len(),
            Budget::Shared { total } => self.issued < *total,
        }
    }

    /// The next fresh seed of scenario `s` (not counted: see [`Guided::issue`]).
    fn seed_of(&self, s: usize) -> Option<u64> {
        if !self.has_room(s) {
            return None;
        }
        let c = &self.corpora[s];
        let base = match &self.budget {
            Budget::PerScenario(ranges) => ranges[s].start,
            Budget::Shared { .. } => 0,
        };
        let mut seed = base + c.fresh;
        while c.taken.contains(&seed) {
            seed += 1;
        }
        Some(seed)
    }

    /// Counts a candidate of scenario `s` with `seed` against the budget.
    fn issue(&mut self, s: usize, seed: u64, fresh: bool) {
        let c = &mut self.corpora[s];
        c.issued += 1;
        if fresh {
            let base = match &self.budget {
                Budget::PerScenario(ranges) => ranges[s].start,
                Budget::Shared { .. } => 0,
            };
            c.fresh = seed + 1 - base;
        } else {
            c.taken.insert(seed);
        }
        self.issued += 1;
    }

    /// The next generation's candidates (empty when the budget is spent).
    pub fn next_batch(&mut self) -> Vec<Candidate> {
        // Only the shared budget's energy draws from the generation's stream; everything
        // drawn for one scenario comes from its own (`scenario_rng`).
        let mut rng = ChaCha8Rng::seed_from_u64(SEARCH_SALT ^ self.generation);
        self.generation += 1;
        if !self.seeds.is_empty() {
            let mut batch = Vec::new();
            for sp in std::mem::take(&mut self.seeds) {
                // A seed plan's seed is taken once; a repeat (a corpus naming the same seed
                // twice) would collide with it, so it is left out.
                if !self.has_room(sp.scenario) || self.corpora[sp.scenario].taken.contains(&sp.seed)
                {
                    continue;
                }
                self.issue(sp.scenario, sp.seed, false);
                batch.push(Candidate {
                    scenario: sp.scenario,
                    seed: sp.seed,
                    plan: Some(sp.plan),
                });
            }
            if !batch.is_empty() {
                return batch;
            }
        }
        let first = std::mem::replace(&mut self.first_fresh, false);
        let n = self.scenarios.len();
        // Which scenario each slot goes to.
        let slots: Vec<usize> = match &self.budget {
            Budget::PerScenario(ranges) => {
                // Every scenario advances at the same pace: a sixteenth of its seeds per
                // generation, so the corpus steers most of its runs.
                let mut slots = Vec::new();
                for (s, r) in ranges.iter().enumerate() {
                    let left = r.len() - self.corpora[s].issued;
                    let per = r.len().div_ceil(16).max(1);
                    slots.extend(std::iter::repeat_n(s, left.min(per) as usize));
                }
                slots
            }
            Budget::Shared { .. } if first => (0..n).collect(),
            Budget::Shared { .. } => {
                // Energy: each scenario weighs 1 + the new features its last runs found
                // (capped, so one noisy scenario cannot starve the others).
                let weights: Vec<u64> = self.corpora.iter().map(|c| 1 + c.recent.min(16)).collect();
                let sum: u64 = weights.iter().sum();
                (0..n)
                    .map(|_| {
                        let mut pick = rng.gen_range(0..sum);
                        weights
                            .iter()
                            .position(|&w| {
                                if pick < w {
                                    true
                                } else {
                                    pick -= w;
                                    false
                                }
                            })
                            .expect("pick < sum")
                    })
                    .collect()
            }
        };
        for c in &mut self.corpora {
            c.recent = 0;
        }
        let mut batch = Vec::with_capacity(slots.len());
        let mut streams: Vec<Option<ChaCha8Rng>> = vec![None; n];
        for s in slots {
            let Some(seed) = self.seed_of(s) else {
                continue;
            };
            self.issue(s, seed, true);
            // A scenario's first generation of fresh seeds runs them as drawn; later ones
            // mutate a kept plan half of the time.
            let own_first = self.corpora[s].generations == 0;
            let rng = streams[s].get_or_insert_with(|| {
                scenario_rng(
                    &self.scenarios[s].scenario.name,
                    self.corpora[s].generations,
                )
            });
            let plan = if own_first || rng.gen_bool(0.5) {
                None
            } else {
                self.child(s, seed, rng)
            };
            batch.push(Candidate {
                scenario: s,
                seed,
                plan,
            });
        }
        for (s, stream) in streams.iter().enumerate() {
            if stream.is_some() {
                self.corpora[s].generations += 1;
            }
        }
        batch
    }

    /// A mutant of a kept plan of scenario `s`, valid for the scenario; `None` when the
    /// corpus is empty or no valid mutant came out (the slot then runs a fresh seed).
    fn child(&self, s: usize, seed: u64, rng: &mut ChaCha8Rng) -> Option<FaultPlan> {
        let corpus = &self.corpora[s];
        if corpus.plans.is_empty() {
            return None;
        }
        let scenario = &self.scenarios[s].scenario;
        let steps = plan::step_faults(scenario);
        for _ in 0..MUTATION_TRIES {
            let parent = &corpus.plans[rng.gen_range(0..corpus.plans.len())];
            let other = &corpus.plans[rng.gen_range(0..corpus.plans.len())];
            let mut plan = parent.clone();
            for _ in 0..rng.gen_range(1..=MAX_MUTATIONS) {
                mutate(scenario, &steps, &mut plan, other, seed, rng);
            }
            plan.faults.sort_by_key(|f| f.at_ms);
            if plan.validate(scenario).is_ok() && plan != *parent {
                return Some(plan);
            }
        }
        None
    }

    /// Learns from one run (call in candidate order).
    pub fn observe(&mut self, candidate: &Candidate, record: &SeedRecord) {
        let features = features(record);
        let corpus = &mut self.corpora[candidate.scenario];
        let mut new = 0;
        for &f in &features {
            new += u64::from(corpus.seen.insert(f));
        }
        if new == 0 || record.failure.is_some() {
            return;
        }
        corpus.recent += new;
        let scenario = &self.scenarios[candidate.scenario].scenario;
        let plan = candidate
            .plan
            .clone()
            .unwrap_or_else(|| plan::draw(scenario, candidate.seed));
        if let Some(kept) = self.kept.as_mut() {
            kept.push(Kept {
                scenario: candidate.scenario,
                seed: candidate.seed,
                plan: plan.clone(),
                features,
            });
        }
        let corpus = &mut self.corpora[candidate.scenario];
        if corpus.plans.len() < MAX_CORPUS_PER_SCENARIO {
            corpus.plans.push(plan);
        } else {
            let slot = (mix64(candidate.seed ^ SEARCH_SALT) as usize) % corpus.plans.len();
            corpus.plans[slot] = plan;
        }
    }
}

/// Scenario `name`'s own random stream for its `generation`-th generation of fresh seeds.
/// What the search draws for a scenario depends on nothing but its name and its own runs,
/// so a scenario swept alone (`--scenario swarm`) is searched exactly as it is among the
/// others (the main job), and a failure seen in one is seen in the other.
fn scenario_rng(name: &str, generation: u64) -> ChaCha8Rng {
    // FNV-1a: stable across builds and platforms, unlike `DefaultHasher`.
    let name = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    ChaCha8Rng::seed_from_u64(mix64(SEARCH_SALT ^ name) ^ mix64(generation))
}

/// A run's coverage features, sorted and without repeats: its edge buckets, and each
/// coverage mark with its hit count bucketed by powers of two (as AFL does).
pub fn features(record: &SeedRecord) -> Vec<u32> {
    let mut out: Vec<u32> = record.edges.iter().map(|&e| u32::from(e)).collect();
    for (name, &count) in &record.marks {
        let id = MARKS.iter().position(|m| m == name).unwrap_or(MARKS.len()) as u32;
        let bucket = (64 - count.leading_zeros()).min(15);
        out.push(MARK_FEATURES + id * 16 + bucket);
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Applies one mutation operator to `plan` (which the caller sorts and validates). The
/// scenario's fixed steps (`steps`) and the jitter windows are never touched: the
/// operators move, drop, add and splice only the faults the scenario draws, so a mutated
/// plan asks nothing of the world that a drawn one could not.
fn mutate(
    scenario: &crate::scenario::Scenario,
    steps: &[Fault],
    plan: &mut FaultPlan,
    other: &FaultPlan,
    seed: u64,
    rng: &mut ChaCha8Rng,
) {
    let window = scenario.limits.fault_window_ms.max(1);
    let sessions = scenario.workload.sessions.max(1);
    let movable = |f: &Fault| !matches!(f.kind, FaultKind::Jitter { .. }) && !steps.contains(f);
    let discrete: Vec<usize> = plan
        .faults
        .iter()
        .enumerate()
        .filter(|(_, f)| movable(f))
        .map(|(i, _)| i)
        .collect();
    let pick = |rng: &mut ChaCha8Rng| -> Option<usize> {
        (!discrete.is_empty()).then(|| discrete[rng.gen_range(0..discrete.len())])
    };
    match rng.gen_range(0..7) {
        // Move a fault in time: a nudge or anywhere in the fault window.
        0 => {
            if let Some(i) = pick(rng) {
                let f = &mut plan.faults[i];
                f.at_ms = if rng.gen_bool(0.5) {
                    let d = rng.gen_range(1..=1_000);
                    if rng.gen_bool(0.5) {
                        f.at_ms.saturating_sub(d)
                    } else {
                        (f.at_ms + d).min(window - 1)
                    }
                } else {
                    rng.gen_range(0..window)
                };
            }
        }
        // Drop a fault.
        1 => {
            if let Some(i) = pick(rng) {
                plan.faults.remove(i);
            }
        }
        // Duplicate a fault at another time.
        2 => {
            if let Some(i) = pick(rng) {
                let mut f = plan.faults[i];
                f.at_ms = rng.gen_range(0..window);
                plan.faults.push(f);
            }
        }
        // Retarget a fault to another session.
        3 => {
            if let Some(i) = pick(rng) {
                if !plan.faults[i].is_global() {
                    plan.faults[i].session = rng.gen_range(1..=sessions);
                }
            }
        }
        // Transplant a fault from another seed's draw (fault kinds the corpus lacks).
        4 => {
            let donor = plan::draw(scenario, rng.gen::<u64>() ^ seed);
            let pool: Vec<_> = donor.faults.iter().filter(|f| movable(f)).collect();
            if !pool.is_empty() {
                plan.faults.push(*pool[rng.gen_range(0..pool.len())]);
            }
        }
        // Splice: a time window of another kept plan replaces this plan's.
        5 => {
            let a = rng.gen_range(0..window);
            let b = rng.gen_range(a..=window);
            let inside = |t: u64| (a..b).contains(&t);
            plan.faults.retain(|f| !movable(f) || !inside(f.at_ms));
            plan.faults.extend(
                other
                    .faults
                    .iter()
                    .filter(|f| movable(f) && inside(f.at_ms))
                    .copied(),
            );
        }
        // Re-draw the configuration and environment (swarm scenarios), keeping the faults.
        _ => {
            let donor = plan::draw(scenario, rng.gen::<u64>() ^ seed);
            if donor.config.is_some() || donor.environment.is_some() {
                plan.config = donor.config;
                plan.environment = donor.environment;
            } else if let Some(i) = pick(rng) {
                plan.faults.remove(i);
            }
        }
    }
}

/// Runs a guided search to the end of its budget (or, with `stop_when`, up to and including
/// the first run it holds for, in candidate order). Returns every run in order.
///
/// `work` runs one candidate and turns it into a record and anything else the caller
/// keeps (a trace); `tick` sees each record as it arrives, for progress.
pub fn run_guided<X, W, P>(
    search: &mut Guided<'_>,
    jobs: usize,
    stop_when: Option<&(dyn Fn(&SeedRecord) -> bool + Sync)>,
    work: W,
    mut tick: P,
) -> Vec<(Candidate, SeedRecord, X)>
where
    X: Send,
    W: Fn(&Candidate) -> (SeedRecord, X) + Sync,
    P: FnMut(&SeedRecord),
{
    let mut out = Vec::new();
    loop {
        let batch = search.next_batch();
        if batch.is_empty() {
            return out;
        }
        let results = runner::parallel_map(
            &batch,
            jobs,
            &work,
            stop_when.map(|stop| move |r: &(SeedRecord, X)| stop(&r.0)),
            |_, r| tick(&r.0),
        );
        for (candidate, result) in batch.into_iter().zip(results) {
            let Some((mut record, extra)) = result else {
                // Skipped past a failure: the search is over.
                return out;
            };
            record.guided_plan = candidate.plan.is_some();
            search.observe(&candidate, &record);
            // The edges served the search; the reports do not need them.
            record.edges = Vec::new();
            let stop = stop_when.is_some_and(|stop| stop(&record));
            out.push((candidate, record, extra));
            if stop {
                return out;
            }
        }
    }
}

/// Runs one candidate in isolation (see [`runner::run_isolated`]) and records it.
pub fn run_candidate(
    scenarios: &[Resolved],
    candidate: &Candidate,
    mutant: Option<Mutant>,
    keep_trace: bool,
) -> (SeedRecord, Option<Vec<String>>) {
    let timed = runner::run_isolated(
        &scenarios[candidate.scenario].scenario,
        candidate.seed,
        candidate.plan.clone(),
        mutant,
    );
    let (mut rec, kept) = record::record(candidate.scenario, candidate.seed, timed, keep_trace);
    rec.guided_plan = candidate.plan.is_some();
    (rec, kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(Strategy::from_name(s.name()), Some(s));
        }
        assert_eq!(Strategy::from_name("bogus"), None);
    }

    #[test]
    fn mutated_plans_stay_valid_and_differ() {
        let resolved = vec![crate::scenario::resolve_one("swarm").expect("shipped")];
        let mut search = Guided::new(&resolved, Budget::Shared { total: 1_000 });
        let scenario = &resolved[0].scenario;
        for seed in 0..8 {
            search.corpora[0].plans.push(plan::draw(scenario, seed));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut made = 0;
        for seed in 100..200 {
            if let Some(plan) = search.child(0, seed, &mut rng) {
                assert!(plan.validate(scenario).is_ok());
                assert!(!search.corpora[0].plans.contains(&plan));
                made += 1;
            }
        }
        assert!(made > 90, "only {made} of 100 children were valid");
    }

    /// A scenario's expectations (a response count) are about its fixed steps: no child
    /// moves, drops or adds one.
    #[test]
    fn children_keep_the_fixed_steps_as_they_are() {
        for name in ["cancel-during-delayed-resume", "provider-exit-mid-prompt"] {
            let resolved = vec![crate::scenario::resolve_one(name).expect("shipped")];
            let scenario = &resolved[0].scenario;
            let steps = plan::step_faults(scenario);
            assert!(!steps.is_empty(), "{name} has fixed steps");
            let mut search = Guided::new(&resolved, Budget::Shared { total: 1_000 });
            for seed in 0..8 {
                search.corpora[0].plans.push(plan::draw(scenario, seed));
            }
            let mut rng = ChaCha8Rng::seed_from_u64(11);
            for seed in 100..300 {
                let Some(plan) = search.child(0, seed, &mut rng) else {
                    continue;
                };
                for step in &steps {
                    let n = |p: &FaultPlan| p.faults.iter().filter(|f| *f == step).count();
                    assert_eq!(n(&plan), 1, "{name}: step {step:?} in child {plan:?}");
                }
            }
        }
    }
}
