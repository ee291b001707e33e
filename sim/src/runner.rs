//! Running seeds: one in its world ([`run_seed`]), each with its panic caught, many in
//! parallel, on threads that carry nothing from one seed to the next.
//!
//! [`run_seed`] draws a seed's plan (or takes the one it is given), runs it in the world its
//! scenario names (the engine world or the stack world, which stand side by side) inside a
//! madsim runtime of its own, runs a failing seed again with its trace captured, and turns
//! what the world's logbook holds into a [`SeedOutcome`].
//!
//! A seed runs on a [`parallel_map`] worker itself, one after another, as long as no seed
//! has panicked on that worker; anywhere else (the main thread of `palisade run`, a worker
//! after a panic) it gets a fresh thread. Both give the same trace: what a thread keeps
//! from a seed it ran cannot reach the next one.
//! - madsim: each seed builds its own `Runtime` (its RNG, clock, executor and tasks, all
//!   dropped with it); its context thread-local is set for `block_on` only and restored on
//!   unwind too. Its one per-thread effect that outlives a runtime is std's `HashMap` keys:
//!   madsim seeds them from the seed only on a thread that has never made a `RandomState`,
//!   so on a reused thread they depend on the seeds before. No `HashMap` with std's hasher
//!   decides anything in a seed: the core's maps use a fixed hasher (`IdMap`), the world's
//!   are ordered maps and vectors, and madsim's own (its simulators and nodes) are looked up,
//!   never iterated in a way a trace sees.
//! - tokio: its thread-local RNG is seeded per thread from a process-wide counter, so it was
//!   never per seed; the stack world draws nothing from it (`tests/stack.rs` keeps it so).
//! - mimalloc's per-thread heap: addresses, which no trace holds.
//! - this module's own: [`LAST_PANIC`] is taken by the run that panicked.
//!
//! A failing seed was already run twice on one thread (the second time with its trace
//! captured) and the two hashes compared. `tests/threads.rs` runs every shipped scenario's
//! seeds, with and without mutants, each on a fresh thread and all on one reused worker in
//! both orders, and requires the same hashes.
//!
//! A worker on which a seed panicked hands every later seed to a fresh thread: a panic can
//! stop madsim or the world half-way, and nothing is gained by proving what that leaves.
//! Results come back in item order whatever the number of jobs.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Once};
use std::time::Instant;

use palisade_core::mutants::Mutant;
use serde::{Deserialize, Serialize};

use crate::logbook::Finished;
use crate::oracle::{CaughtBy, Violation};
use crate::plan::{self, FaultPlan};
use crate::scenario::{Scenario, WorldKind};
use crate::{stack, world};

/// The stack of every thread that runs seeds (workers and fresh seed threads). A madsim
/// runtime with deep async state machines needs more than std's 2 MiB default, and a stack
/// overflow aborts the whole sweep, not just the seed.
pub const SEED_THREAD_STACK_BYTES: usize = 16 << 20;

/// Fresh seed threads are named with this prefix, workers with [`WORKER_THREAD_PREFIX`].
const SEED_THREAD_PREFIX: &str = "palisade-seed";
/// The name prefix of [`parallel_map`]'s workers.
const WORKER_THREAD_PREFIX: &str = "palisade-worker";

/// What running one seed produced.
// One per seed run, moved a handful of times: boxing the outcome would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum SeedRun {
    /// The world ran to the end (the outcome may hold a violation).
    Done(SeedOutcome),
    /// The seed panicked: a bug in the sim or the core, recorded as invariant `panic`.
    Panicked {
        /// The panic message and where it was raised.
        message: String,
    },
}

/// A seed run and how long it took on the wall clock.
#[derive(Debug)]
pub struct Timed {
    /// What happened.
    pub run: SeedRun,
    /// Wall-clock nanoseconds, including a fresh thread's start where the seed had one.
    pub wall_nanos: u64,
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
    /// Edge coverage (buckets of consecutive event-kind pairs hit, ascending): what the
    /// guided search ([`crate::search`]) steers by. Never hashed or checked.
    pub edges: Vec<u16>,
}

/// When set, every seed keeps its trace lines (for `run`, `replay`, determinism checks);
/// otherwise only failing seeds do, by re-running with capture on.
static CAPTURE_ALL: AtomicBool = AtomicBool::new(false);

/// Keep the trace lines of every seed from now on (process-wide).
pub fn capture_all_traces(on: bool) {
    CAPTURE_ALL.store(on, Ordering::Relaxed);
}

/// Runs one seed once in its scenario's world: the stack world (`crate::stack`) for
/// `[world] kind = "stack"`, else the engine world (`crate::world`).
fn run_once(
    scenario: &Scenario,
    seed: u64,
    plan: &FaultPlan,
    mutant: Option<Mutant>,
    capture: bool,
) -> Finished {
    let rt = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
    if scenario.world.kind == WorldKind::Proxy {
        return rt.block_on(stack::proxy::run(
            Rc::new(scenario.clone()),
            seed,
            plan.clone(),
            mutant,
            capture,
        ));
    }
    if scenario.world.kind == WorldKind::Stack {
        return rt.block_on(stack::run(
            Rc::new(scenario.clone()),
            seed,
            plan.clone(),
            mutant,
            capture,
        ));
    }
    rt.block_on(world::run(
        Rc::new(scenario.clone()),
        seed,
        plan.clone(),
        mutant,
        capture,
    ))
}

/// Runs one seed on the current thread (the caller picks the thread: [`run_isolated`] gives
/// it one that carries nothing from another seed).
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
                by: CaughtBy::World,
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
    let edges = world.tracer.edge_buckets();
    SeedOutcome {
        edges,
        plan,
        stats: SeedStats {
            events: world.tracer.len() as u64,
            sim_millis,
            sessions,
            turns: world.turns,
        },
        trace: Trace {
            hash: world.tracer.hash,
            lines: world.tracer.lines,
        },
        violation: world.violation,
        marks: world.marks,
    }
}

/// What the current thread is to the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Host {
    /// Not a worker (a main thread, a fresh seed thread): seeds get a fresh thread.
    Other,
    /// A [`parallel_map`] worker on which no seed has panicked: seeds run here.
    Worker,
    /// A worker on which a seed panicked: later seeds get a fresh thread.
    Spent,
}

thread_local! {
    /// The message of the last panic raised in a seed on this thread.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
    /// A seed is running on this thread: its panics are recorded, not printed.
    static IN_SEED: Cell<bool> = const { Cell::new(false) };
    /// What this thread is to the runner.
    static HOST: Cell<Host> = const { Cell::new(Host::Other) };
}

/// Keeps seeds' panics off stderr (they are recorded instead) and remembers their message
/// and location; any other panic goes to the previous hook.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !IN_SEED.with(Cell::get) {
                previous(info);
                return;
            }
            let payload = info.payload();
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            let message = match info.location() {
                Some(at) => format!("panicked at {}:{}: {text}", at.file(), at.line()),
                None => format!("panicked: {text}"),
            };
            LAST_PANIC.with(|slot| {
                let mut slot = slot.borrow_mut();
                // The first panic is the cause; later ones are madsim re-raising it.
                if slot.is_none() {
                    *slot = Some(message);
                }
            });
        }));
    });
}

/// Runs one seed, on the current thread if it is a worker on which no seed has panicked,
/// else on a fresh thread; catches its panic.
pub fn run_isolated(
    scenario: &Scenario,
    seed: u64,
    plan: Option<FaultPlan>,
    mutant: Option<Mutant>,
) -> Timed {
    let started = Instant::now();
    let run = match on_seed_thread(&format!("{}-{seed}", scenario.name), move || {
        run_seed(scenario, seed, plan, mutant)
    }) {
        Ok(outcome) => SeedRun::Done(outcome),
        Err(message) => SeedRun::Panicked { message },
    };
    Timed {
        run,
        wall_nanos: u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
    }
}

/// Runs `seed` with its panic caught (`Err` holds the message): here on a worker that has
/// not seen a panic, on a fresh thread named after `label` anywhere else. A panic spends
/// the worker.
fn on_seed_thread<T, F>(label: &str, seed: F) -> Result<T, String>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    install_panic_hook();
    if HOST.with(Cell::get) == Host::Worker {
        let run = caught(seed);
        if run.is_err() {
            HOST.with(|host| host.set(Host::Spent));
        }
        return run;
    }
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name(format!("{SEED_THREAD_PREFIX}-{label}"))
            .stack_size(SEED_THREAD_STACK_BYTES)
            .spawn_scoped(scope, move || caught(seed));
        match thread {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|_| Err("the seed thread died outside catch_unwind".into())),
            Err(e) => Err(format!("could not spawn a seed thread: {e}")),
        }
    })
}

/// Runs `seed` on this thread with its panic caught and its message recorded.
fn caught<T>(seed: impl FnOnce() -> T) -> Result<T, String> {
    IN_SEED.with(|flag| flag.set(true));
    let result = panic::catch_unwind(AssertUnwindSafe(seed));
    IN_SEED.with(|flag| flag.set(false));
    result.map_err(|payload| {
        LAST_PANIC
            .with(|slot| slot.borrow_mut().take())
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panicked".into())
    })
}

/// Maps `work` over `items` on `jobs` worker threads; `on_result` sees every result on the
/// calling thread as it arrives (for progress). Returns results in item order.
///
/// With `stop_when`, items after the first (lowest-index) result for which it holds are
/// skipped (their slot is `None`), and every item before it is still run: the answer is
/// the same at any number of jobs.
pub fn parallel_map<T, R, W, S, P>(
    items: &[T],
    jobs: usize,
    work: W,
    stop_when: Option<S>,
    mut on_result: P,
) -> Vec<Option<R>>
where
    T: Sync,
    R: Send,
    W: Fn(&T) -> R + Sync,
    S: Fn(&R) -> bool + Sync,
    P: FnMut(usize, &R),
{
    let mut results: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    if items.is_empty() {
        return results;
    }
    let next = AtomicUsize::new(0);
    let stop_at = AtomicUsize::new(usize::MAX);
    let workers = jobs.clamp(1, items.len());
    let (tx, rx) = mpsc::channel::<(usize, R)>();
    let (next_item, stop_item, work, stop_when) = (&next, &stop_at, &work, &stop_when);
    // Takes items until none is left (or one is past a known stop), sending each result.
    let take_items = |tx: mpsc::Sender<(usize, R)>| loop {
        let i = next_item.fetch_add(1, Ordering::Relaxed);
        // Items are taken in increasing order, so once one is past a known stop, every
        // later one is too.
        if i >= items.len() || i > stop_item.load(Ordering::Acquire) {
            break;
        }
        let result = work(&items[i]);
        if stop_when.as_ref().is_some_and(|stop| stop(&result)) {
            stop_item.fetch_min(i, Ordering::AcqRel);
        }
        if tx.send((i, result)).is_err() {
            break;
        }
    };
    std::thread::scope(|scope| {
        let mut spawned = 0;
        for k in 0..workers {
            let tx = tx.clone();
            let worker = std::thread::Builder::new()
                .name(format!("{WORKER_THREAD_PREFIX}-{k}"))
                .stack_size(SEED_THREAD_STACK_BYTES)
                .spawn_scoped(scope, move || {
                    HOST.with(|host| host.set(Host::Worker));
                    take_items(tx);
                });
            spawned += usize::from(worker.is_ok());
        }
        if spawned == 0 {
            // No thread to spare: this one takes every item (each seed on a fresh thread,
            // which records its own failure to start).
            take_items(tx.clone());
        }
        drop(tx);
        for (i, result) in rx {
            on_result(i, &result);
            results[i] = Some(result);
        }
    });
    let stop = stop_at.into_inner();
    if stop != usize::MAX {
        // A worker may have finished an item past the stop before it learnt of the stop.
        for slot in results.iter_mut().skip(stop + 1) {
            *slot = None;
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_in_item_order_at_any_jobs() {
        let items: Vec<u64> = (0..50).collect();
        for jobs in [1, 2, 7] {
            let out = parallel_map(&items, jobs, |x| x * 2, None::<fn(&u64) -> bool>, |_, _| {});
            let out: Vec<u64> = out.into_iter().map(|r| r.expect("ran")).collect();
            assert_eq!(out, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        }
    }

    #[test]
    fn stop_keeps_every_item_before_the_first_hit() {
        let items: Vec<u64> = (0..100).collect();
        for jobs in [1, 3] {
            let out = parallel_map(
                &items,
                jobs,
                |x| *x,
                Some(|x: &u64| *x % 10 == 7),
                |_, _| {},
            );
            assert!(out[..=7].iter().all(Option::is_some));
            assert!(out[8..].iter().all(Option::is_none));
        }
    }

    #[test]
    fn a_panicking_seed_is_recorded() {
        let message = on_seed_thread("test", || -> u32 { panic!("boom {}", 7) })
            .expect_err("the panic is caught");
        assert!(
            message.contains("boom 7") && message.contains("runner.rs"),
            "{message}"
        );
    }

    /// Seeds run on the worker itself until one panics there; after that each gets a
    /// fresh thread. Off a worker, every seed gets a fresh thread.
    #[test]
    fn a_worker_runs_seeds_itself_until_one_panics() {
        let here = || std::thread::current().id();
        let off_worker = on_seed_thread("off", here).expect("ran");
        assert_ne!(
            off_worker,
            here(),
            "a main thread's seed got a fresh thread"
        );
        let steps = [false, false, true, false, false];
        let out = parallel_map(
            &steps,
            1,
            |&panics| {
                let ran_on = on_seed_thread("step", move || {
                    assert!(!panics, "a seed that panics");
                    std::thread::current().id()
                });
                (ran_on, std::thread::current().id())
            },
            None::<fn(&_) -> bool>,
            |_, _| {},
        );
        let out: Vec<_> = out.into_iter().map(|r| r.expect("ran")).collect();
        let on_worker: Vec<Option<bool>> = out
            .iter()
            .map(|(ran_on, worker)| ran_on.as_ref().ok().map(|t| t == worker))
            .collect();
        assert_eq!(
            on_worker,
            [Some(true), Some(true), None, Some(false), Some(false)],
            "{out:?}"
        );
        let message = out[2].0.as_ref().expect_err("the panic is recorded");
        assert!(message.contains("a seed that panics"), "{message}");
    }
}
