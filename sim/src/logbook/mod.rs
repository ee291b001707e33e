//! The logbook both worlds keep of a seed: every core step the engine's observer
//! ([`Observe`]) sees goes into the trace ([`trace`]) and through the core's reference
//! checker (the core-belief checks), the world writes its own events into the same trace,
//! and coverage marks ([`MARKS`]) count the rare interleavings it met. A finished seed
//! leaves what its logbook holds ([`Finished`]).

pub(crate) mod trace;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use palisade_core::audit::Checker;
use palisade_core::driver::{Observer, Step};
use palisade_core::{Core, Effect, RejectReason, Timestamp, Verdict};
use palisade_engine::EngineConfig;

use crate::oracle::{CaughtBy, Checks, Violation};
use trace::Tracer;

/// Every coverage mark a run can record, in either world (rare interleavings worth seeing).
pub const MARKS: &[&str] = &[
    "cancel-after-provider-exit",
    "queue-full-during-recovery",
    "stale-callback-after-tombstone-eviction",
    "lease-expired",
    "restart-with-attempt-in-flight",
    "duplicate-terminal-suppressed",
    "kill-between-turns",
    "late-answer-after-teardown",
    "backpressure",
    "survivor-wrote-after-restart",
];

/// A seed's logbook, what the engine's observer shares with the world: the trace, the
/// shared checker (the core's reference model and its invariants: the core-belief checks,
/// off under [`Checks::GroundTruth`]) and the coverage marks.
#[derive(Debug)]
pub(crate) struct Logbook {
    pub(crate) tracer: Tracer,
    checker: Option<Checker>,
    pub(crate) marks: BTreeMap<String, u64>,
    pub(crate) now_ms: u64,
    pub(crate) found: Option<Violation>,
    /// The checker as it was when the state file was last written (the stack world).
    durable: Option<Checker>,
}

impl Logbook {
    /// A logbook for an engine configured with `config`, shared by the world and the
    /// engine's observer.
    pub(crate) fn shared(config: &EngineConfig, capture: bool) -> Arc<Mutex<Logbook>> {
        Arc::new(Mutex::new(Logbook {
            tracer: Tracer::new(capture),
            checker: new_checker(config),
            marks: BTreeMap::new(),
            now_ms: 0,
            found: None,
            durable: None,
        }))
    }

    /// The state file now holds the core as the checker last saw it.
    pub(crate) fn checkpoint(&mut self) {
        self.durable = self.checker.clone();
    }

    /// The engine restarts from the state file: the checker goes back to what it had seen
    /// when that was written (the stack world's disk can lag behind the core: steps never
    /// written never left the process, and are legitimately forgotten).
    pub(crate) fn rewind_to_durable(&mut self, config: &EngineConfig) {
        self.checker = self.durable.clone().or_else(|| new_checker(config));
    }

    pub(crate) fn mark(&mut self, name: &str) {
        *self.marks.entry(name.to_owned()).or_insert(0) += 1;
    }
}

/// The core's reference checker, unless the checks are ground truth only.
fn new_checker(config: &EngineConfig) -> Option<Checker> {
    (crate::oracle::checks() == Checks::All).then(|| {
        Checker::new(&config.core)
            .enabled(std::env::var_os("PALISADE_ORACLE").is_none_or(|v| v != "off"))
    })
}

/// The engine's observer: every core step goes into the trace and through the checker.
pub(crate) struct Observe(pub(crate) Arc<Mutex<Logbook>>);

/// The logbook, locked (also after a panic poisoned it).
pub(crate) fn lock(logbook: &Arc<Mutex<Logbook>>) -> MutexGuard<'_, Logbook> {
    logbook
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Observer for Observe {
    fn observe(&mut self, now: Timestamp, core: &Core, step: Step<'_>, effects: &[Effect]) {
        let mut w = lock(&self.0);
        let t = w.now_ms;
        let idx = match step {
            Step::Input { input, verdict, .. } => {
                match verdict {
                    Verdict::Reject(RejectReason::AttemptEvicted) => {
                        w.mark("stale-callback-after-tombstone-eviction")
                    }
                    Verdict::Reject(RejectReason::LeaseExpired) => w.mark("lease-expired"),
                    Verdict::Reject(RejectReason::WrongTurn)
                        if matches!(
                            input,
                            palisade_core::Input::Callback(cb) if matches!(
                                cb.event,
                                palisade_core::RuntimeEvent::PromptCompleted { .. }
                                    | palisade_core::RuntimeEvent::PromptFailed { .. }
                            )
                        ) =>
                    {
                        w.mark("duplicate-terminal-suppressed")
                    }
                    _ => {}
                }
                w.tracer.input(t, "engine", input, verdict)
            }
            Step::Timeout { .. } if effects.is_empty() => {
                if let Some(checker) = w.checker.as_mut() {
                    checker.observe(now, core, step, effects);
                }
                return;
            }
            Step::Timeout { .. } => w.tracer.line(t, "core", "timeout", &[]),
            Step::Restored => w.tracer.line(t, "core", "restored", &[]),
        };
        for e in effects {
            w.tracer.effect(t, e);
        }
        let Some(checker) = w.checker.as_mut() else {
            return;
        };
        checker.observe(now, core, step, effects);
        if let Some(found) = checker.take_found() {
            if w.found.is_none() {
                let by = if found.violation.detail.starts_with("core invariant:") {
                    CaughtBy::CoreInvariant
                } else {
                    CaughtBy::CoreModel
                };
                w.found = Some(Violation {
                    invariant: found.violation.rule.to_owned(),
                    message: format!("{} (after {})", found.violation.detail, found.after),
                    events: vec![idx],
                    by,
                });
            }
        }
    }
}

/// What a finished seed leaves behind.
pub(crate) struct Finished {
    pub(crate) tracer: Tracer,
    pub(crate) marks: BTreeMap<String, u64>,
    pub(crate) turns: u32,
    pub(crate) violation: Option<Violation>,
}
