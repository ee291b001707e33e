//! What a seed runs with, in either world (the engine world, `world/`, and the stack
//! world, `stack/`): its plan.
//!
//! Seed → fault plan. A seed first draws its own fault probabilities from the scenario's
//! ranges (swarm testing), then an explicit, serializable list of faults, from a ChaCha
//! stream separate from madsim's scheduler. Replay runs `(seed, plan)`; minimisation
//! removes faults from the list. Each fault names its session and time, so removing one
//! does not move another.
//!
//! - [`setup`]: what a seed draws besides its faults (its configuration and environment),
//!   carried in its plan.
//! - `agents`: which real agent each of its agent processes imitates.

pub(crate) mod agents;
mod error;
pub mod setup;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use palisade_testkit::agent_model::LoadAnswer;

use crate::mix::mix;
use crate::scenario::{Action, Bounds, Scenario};
pub use error::PlanError;
use setup::{draw_agent, draw_config, draw_environment, RunConfig, FIT_SALT};

/// Salt that separates the plan stream from every other use of the seed.
const PLAN_SALT: u64 = 0x9a1a_5ade_f417_0001;
/// Each session's fault window is cut into slots of this length; each slot draws each
/// fault class once with the seed's probability.
const SLOT_MS: u64 = 500;
/// Message-jitter windows per session, so the minimiser can drop jitter piecewise.
const JITTER_WINDOWS: u64 = 2;

/// Faults in a plan a failure file may carry: a drawn plan holds at most 9 faults per
/// session per slot (a cancel and its retry, an exit, a burst, a load error, a load
/// timeout, a hung teardown, a crash, a clock jump), two jitter windows per session, and
/// the scenario's steps with their repetitions — under a million for the largest
/// scenario the bounds allow.
pub const MAX_PLAN_FAULTS: usize = 1_000_000;
/// The largest clock jump a failure file may plan, either way: an hour, longer than any
/// deadline a scenario may set. A jump of `i64::MAX` used to overflow the world's clock
/// arithmetic and hang `replay`.
pub const MAX_CLOCK_JUMP_MS: i64 = 3_600_000;

const _: () = assert!(
    (crate::scenario::MAX_SESSIONS as u64)
        * (crate::scenario::MAX_FAULT_WINDOW_MS / SLOT_MS + 1)
        * 9
        + (crate::scenario::MAX_SESSIONS as u64) * JITTER_WINDOWS
        + (crate::scenario::MAX_STEPS as u64) * (crate::scenario::MAX_STEP_REPEATS as u64)
        <= MAX_PLAN_FAULTS as u64,
    "every plan draw() can make must pass FaultPlan::validate"
);
const _: () = assert!(crate::scenario::MIN_QUIESCE_MS > SLOT_MS);
/// Consecutive state-file writes one disk fault may fail: a full disk stays full for a
/// while, but a run must be able to end.
pub const MAX_DISK_FAULT_WRITES: u32 = 64;

/// Attempts a tombstone storm starts on one session: past the 16-tombstone ring
/// (`palisade_core::TOMBSTONES_PER_SESSION`), so the first ones are evicted.
const TOMBSTONE_STORM: Bounds<u32> = Bounds::new(17, 24);
const _: () = assert!(TOMBSTONE_STORM.lo as usize > palisade_core::TOMBSTONES_PER_SESSION);

/// How a `session/load` is made to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadErrorClass {
    /// The agent answers this entry of the catalogue of load answers
    /// (`palisade_testkit::agent_model::LoadAnswer`) for a conversation it still has: a real
    /// transient failure or an adversarial near-miss of a proof (swarm over the
    /// environment).
    Answer(palisade_testkit::agent_model::LoadAnswer),
    /// The provider lost the conversation: the agent's real unknown-session answer.
    UnknownSession,
    /// −32603 with a generic message; the conversation still exists.
    Internal,
    /// −32603 whose message contains "not found" without proving anything.
    NotFoundSubstring,
    /// −32000 authentication required.
    AuthRequired,
}

/// How the simulated disk fails a state-file write (stack world only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskFaultClass {
    /// Writing the temporary file fails with ENOSPC (the disk is full).
    NoSpace,
    /// Writing the temporary file fails with EIO.
    Io,
    /// The temporary file is written and synced; the supervisor crashes before the rename.
    CrashBeforeRename,
    /// The supervisor crashes halfway through writing the temporary file (a torn write).
    TornWrite,
}

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum FaultKind {
    /// The client sends a prompt (a fixed step).
    Prompt,
    /// The client resumes the session.
    Resume,
    /// The client retries (resumes) after a failure or cancellation.
    Retry,
    /// The user cancels.
    Cancel,
    /// The session's agent process exits.
    ProviderExit,
    /// The session's agent process exits right after it answers its prompt (the agent
    /// goes away between turns; the next prompt may find it dying).
    ExitAfterTurn,
    /// The next agent process to receive a prompt exits right after reading it, before it
    /// writes any update or answer (stack worlds only).
    ExitOnPrompt,
    /// The orchestrator crashes and restarts from its durable snapshot.
    CrashRestart,
    /// The session's next prompt streams `count` notifications at once.
    Burst {
        /// Notifications.
        count: u32,
    },
    /// The session's next agent process writes everything `delay_ms` late (its stdout
    /// stalls from its start), and ignores the stdin EOF of its teardown.
    LateCallback {
        /// Extra delay.
        delay_ms: u64,
    },
    /// The session's next teardown hangs.
    HangTeardown,
    /// The session's next `session/load` fails.
    LoadError {
        /// How.
        class: LoadErrorClass,
    },
    /// The session's next `session/load` never answers (the controller times it out).
    LoadTimeout,
    /// The caller takes no events for `ms` (a caller that stops reading).
    CallerStall {
        /// Milliseconds.
        ms: u64,
    },
    /// Stack world: the supervisor's state-file writes fail `count` times, from the next
    /// one on, the way `class` says.
    DiskFault {
        /// How.
        class: DiskFaultClass,
        /// Consecutive writes that fail.
        count: u32,
    },
    /// Stack world: the caller of `palisade-supervise` goes away for good. It closes both
    /// ends of its pipes: every later event write fails (a broken pipe), its stdin reaches
    /// EOF, and nobody restarts the supervisor for it.
    CallerGone,
    /// The orchestrator's clock jumps by `ms` (negative: backwards).
    ClockJump {
        /// Milliseconds.
        ms: i64,
    },
    /// Callbacks of the session are delayed, duplicated and reordered until `until_ms`.
    Jitter {
        /// End of the window.
        until_ms: u64,
        /// Probability a message is delayed.
        delay_p: f64,
        /// Probability a message is duplicated.
        duplicate_p: f64,
        /// Probability a lifecycle message may overtake earlier ones.
        reorder_p: f64,
        /// Largest extra delay.
        max_delay_ms: u64,
    },
}

/// Hashed field by field for the trace hash (a probability by its bits), so a passing
/// seed needs no JSON of its faults.
impl std::hash::Hash for FaultKind {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        match *self {
            FaultKind::Prompt => 0u8.hash(h),
            FaultKind::Resume => 1u8.hash(h),
            FaultKind::Retry => 2u8.hash(h),
            FaultKind::Cancel => 3u8.hash(h),
            FaultKind::ProviderExit => 4u8.hash(h),
            FaultKind::ExitAfterTurn => 14u8.hash(h),
            FaultKind::CrashRestart => 5u8.hash(h),
            FaultKind::Burst { count } => (6u8, count).hash(h),
            FaultKind::LateCallback { delay_ms } => (7u8, delay_ms).hash(h),
            FaultKind::HangTeardown => 8u8.hash(h),
            FaultKind::LoadError { class } => (9u8, class).hash(h),
            FaultKind::LoadTimeout => 10u8.hash(h),
            FaultKind::ClockJump { ms } => (11u8, ms).hash(h),
            FaultKind::CallerStall { ms } => (13u8, ms).hash(h),
            FaultKind::DiskFault { class, count } => (15u8, class, count).hash(h),
            FaultKind::CallerGone => 16u8.hash(h),
            FaultKind::ExitOnPrompt => 17u8.hash(h),
            FaultKind::Jitter {
                until_ms,
                delay_p,
                duplicate_p,
                reorder_p,
                max_delay_ms,
            } => (
                12u8,
                until_ms,
                delay_p.to_bits(),
                duplicate_p.to_bits(),
                reorder_p.to_bits(),
                max_delay_ms,
            )
                .hash(h),
        }
    }
}

/// One planned fault.
#[derive(Clone, Copy, Debug, PartialEq, Hash, Serialize, Deserialize)]
pub struct Fault {
    /// Simulated time it fires.
    pub at_ms: u64,
    /// The session it concerns (1-based).
    pub session: u32,
    /// What it does.
    #[serde(flatten)]
    pub kind: FaultKind,
}

impl Fault {
    /// Whether the fault concerns the whole world rather than its session (a crash-restart
    /// or a clock jump is drawn on session 1 but hits every session alike).
    pub fn is_global(&self) -> bool {
        matches!(
            self.kind,
            FaultKind::CrashRestart
                | FaultKind::ClockJump { .. }
                | FaultKind::CallerStall { .. }
                | FaultKind::CallerGone
                | FaultKind::DiskFault { .. }
        )
    }
}

/// A cut of the scenario's own client workload, so that a minimised plan can run less of
/// it. Every field left out keeps the scenario's workload as it is: the default cut is the
/// whole workload, and a plan drawn from a seed never cuts anything.
///
/// The cut restricts only what clients do on their own (and how much an agent streams);
/// the plan's faults, scenario steps included, still fire as listed. Minimisation drops a
/// session's faults together with its client.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadCut {
    /// The sessions whose clients run, ascending; absent: every session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<Vec<u32>>,
    /// At most this many turns per client (of the scenario's `turns_per_session`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns_per_session: Option<u32>,
    /// At most this many notifications per prompt turn (a planned burst is not cut).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications_per_turn: Option<u32>,
    /// Clients send nothing at or after this simulated time (the scenario's fault window
    /// is the bound otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
}

impl WorkloadCut {
    /// Whether nothing is cut.
    pub fn is_whole(&self) -> bool {
        *self == WorkloadCut::default()
    }

    /// Whether the client of `session` runs.
    pub fn client_runs(&self, session: u32) -> bool {
        self.sessions
            .as_ref()
            .is_none_or(|s| s.binary_search(&session).is_ok())
    }

    /// The sessions whose clients run, of the scenario's `sessions`.
    pub fn active_sessions(&self, sessions: u32) -> Vec<u32> {
        (1..=sessions).filter(|&s| self.client_runs(s)).collect()
    }

    /// A client's turns, of the scenario's `turns`.
    pub fn turns(&self, turns: u32) -> u32 {
        self.turns_per_session.map_or(turns, |cap| cap.min(turns))
    }

    /// A turn's notifications, of the `drawn` ones.
    pub fn notifications(&self, drawn: u32) -> u32 {
        self.notifications_per_turn
            .map_or(drawn, |cap| cap.min(drawn))
    }

    /// When clients stop sending, of the scenario's fault window.
    pub fn until_ms(&self, window_ms: u64) -> u64 {
        self.until_ms.map_or(window_ms, |t| t.min(window_ms))
    }
}

/// The explicit, serializable list of faults a seed runs with.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultPlan {
    /// The probabilities this seed drew (swarm testing); informational.
    #[serde(default)]
    pub swarm: BTreeMap<String, f64>,
    /// The faults, in time order. The scenario's fixed steps are part of the plan.
    pub faults: Vec<Fault>,
    /// How much of the scenario's own workload runs (all of it unless minimised). Files
    /// written before the cut existed have none, and replay exactly as before.
    #[serde(default, skip_serializing_if = "WorkloadCut::is_whole")]
    pub workload: WorkloadCut,
    /// The configuration this seed drew (`[config] swarm`); absent: the scenario's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<RunConfig>,
    /// The environment this seed drew (`[environment] swarm`); absent: the scenario's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<setup::Environment>,
}

impl FaultPlan {
    /// The configuration the run uses: the plan's, else the scenario's own.
    pub fn run_config(&self, scenario: &Scenario) -> RunConfig {
        self.config
            .clone()
            .unwrap_or_else(|| RunConfig::fixed(scenario))
    }

    /// The most notifications a prompt of this plan's environment streams.
    pub fn max_notifications(&self, scenario: &Scenario) -> u32 {
        self.environment
            .as_ref()
            .map_or(scenario.workload.notifications_per_turn.hi, |e| {
                e.events_per_prompt.hi
            })
    }
}

impl FaultPlan {
    /// Checks that every fault of the plan can happen in a run of `scenario`, so that a
    /// replay runs exactly the plan it names: each fault concerns one of the scenario's
    /// sessions and fires before the run ends (at `fault_window_ms + quiesce_ms`); a late
    /// callback arrives before it ends; probabilities are in [0, 1]; jitter windows,
    /// delays, bursts and clock jumps are within the scenario's bounds; a workload cut
    /// only shrinks the scenario's workload. A plan [`draw`] makes always passes.
    ///
    /// Without this, a fault naming session 0 or 999, or firing at `u64::MAX`, was
    /// silently ignored and the replay said "passed"; jitter probabilities of 5 or −3 gave
    /// a false R5-leaked-execution; a clock jump of `i64::MIN` hung `replay`.
    pub fn validate(&self, scenario: &Scenario) -> Result<(), PlanError> {
        let sessions = scenario.workload.sessions;
        let limits = &scenario.limits;
        let end = limits.fault_window_ms + limits.quiesce_ms;
        let late = limits.quiesce_ms / crate::scenario::LATE_SHARE_OF_QUIESCE;
        let bad = |path: String, message: String| Err(PlanError { path, message });
        if self.faults.len() > MAX_PLAN_FAULTS {
            return bad(
                "plan.faults".into(),
                format!(
                    "{} faults, more than a plan may hold ({MAX_PLAN_FAULTS}, MAX_PLAN_FAULTS)",
                    self.faults.len()
                ),
            );
        }
        for (i, f) in self.faults.iter().enumerate() {
            let at = |field: &str| format!("plan.faults[{i}].{field}");
            if f.session == 0 || f.session > sessions {
                return bad(
                    at("session"),
                    format!(
                        "session {} is not one of scenario {:?}'s sessions (1..={sessions})",
                        f.session, scenario.name
                    ),
                );
            }
            if f.at_ms >= end {
                return bad(
                    at("at_ms"),
                    format!(
                        "{} ms is not before the end of the run ({end} ms = fault_window_ms + quiesce_ms): the fault would never fire",
                        f.at_ms
                    ),
                );
            }
            match f.kind {
                FaultKind::Burst { count } => {
                    if count == 0 || count > crate::scenario::MAX_BURST {
                        return bad(
                            at("count"),
                            format!(
                                "a burst of {count} notifications is outside 1..={} (MAX_BURST)",
                                crate::scenario::MAX_BURST
                            ),
                        );
                    }
                }
                FaultKind::LateCallback { delay_ms } => {
                    if f.at_ms.checked_add(delay_ms).is_none_or(|t| t >= end) {
                        return bad(
                            at("delay_ms"),
                            format!(
                                "the late callback would arrive {delay_ms} ms after {} ms, not before the end of the run ({end} ms): it would never be delivered",
                                f.at_ms
                            ),
                        );
                    }
                }
                FaultKind::ClockJump { ms } => {
                    if ms.unsigned_abs() > MAX_CLOCK_JUMP_MS.unsigned_abs() {
                        return bad(
                            at("ms"),
                            format!(
                                "a clock jump of {ms} ms is beyond ±{MAX_CLOCK_JUMP_MS} ms (MAX_CLOCK_JUMP_MS, an hour)"
                            ),
                        );
                    }
                }
                FaultKind::Jitter {
                    until_ms,
                    delay_p,
                    duplicate_p,
                    reorder_p,
                    max_delay_ms,
                } => {
                    for (field, p) in [
                        ("delay_p", delay_p),
                        ("duplicate_p", duplicate_p),
                        ("reorder_p", reorder_p),
                    ] {
                        if !(0.0..=1.0).contains(&p) {
                            return bad(at(field), format!("probability {p} is outside [0, 1]"));
                        }
                    }
                    if until_ms < f.at_ms || until_ms > end {
                        return bad(
                            at("until_ms"),
                            format!(
                                "a jitter window from {} ms until {until_ms} ms is not within the run (0..={end} ms)",
                                f.at_ms
                            ),
                        );
                    }
                    if max_delay_ms > late {
                        return bad(
                            at("max_delay_ms"),
                            format!(
                                "{max_delay_ms} ms is above {late} ms, a quarter of the scenario's quiesce_ms (as for faults.max_delay_ms)"
                            ),
                        );
                    }
                }
                FaultKind::CallerStall { ms } => {
                    if ms == 0 || f.at_ms.checked_add(ms).is_none_or(|t| t >= end) {
                        return bad(
                            at("ms"),
                            format!(
                                "a caller stall of {ms} ms from {} ms must last at least 1 ms and end before the end of the run ({end} ms)",
                                f.at_ms
                            ),
                        );
                    }
                }
                FaultKind::Prompt
                | FaultKind::ExitAfterTurn
                | FaultKind::Resume
                | FaultKind::Retry
                | FaultKind::Cancel
                | FaultKind::ProviderExit
                | FaultKind::CrashRestart
                | FaultKind::HangTeardown
                | FaultKind::LoadError { .. }
                | FaultKind::LoadTimeout => {}
                FaultKind::CallerGone => {
                    if !scenario.world.kind.is_stack() {
                        return bad(
                            at("fault"),
                            "a caller that goes away needs a stack-world scenario (the engine world's clients are not palisade-supervise's callers)".into(),
                        );
                    }
                }
                FaultKind::ExitOnPrompt => {
                    if !scenario.world.kind.is_stack() {
                        return bad(
                            at("fault"),
                            "an exit on a prompt's receipt needs a stack-world scenario".into(),
                        );
                    }
                }
                FaultKind::DiskFault { count, .. } => {
                    if !scenario.world.kind.is_stack() {
                        return bad(
                            at("fault"),
                            "a disk fault needs a stack-world scenario (the engine world has no state file)".into(),
                        );
                    }
                    if count == 0 || count > MAX_DISK_FAULT_WRITES {
                        return bad(
                            at("count"),
                            format!("{count} failing writes; 1 to {MAX_DISK_FAULT_WRITES} (MAX_DISK_FAULT_WRITES)"),
                        );
                    }
                }
            }
        }
        let cut = &self.workload;
        if let Some(list) = &cut.sessions {
            for (i, &s) in list.iter().enumerate() {
                if s == 0 || s > sessions || (i > 0 && list[i - 1] >= s) {
                    return bad(
                        format!("plan.workload.sessions[{i}]"),
                        format!(
                            "session {s}: the cut must list sessions of 1..={sessions} in strictly increasing order"
                        ),
                    );
                }
            }
        }
        let turns = scenario.workload.turns_per_session;
        if cut.turns_per_session.is_some_and(|t| t > turns) {
            return bad(
                "plan.workload.turns_per_session".into(),
                format!(
                    "a cut only shrinks the workload: the scenario sends {turns} turns per session"
                ),
            );
        }
        let most = self.max_notifications(scenario);
        if cut.notifications_per_turn.is_some_and(|n| n > most) {
            return bad(
                "plan.workload.notifications_per_turn".into(),
                format!("a cut only shrinks the workload: the scenario streams at most {most} notifications per turn"),
            );
        }
        if cut.until_ms.is_some_and(|t| t > limits.fault_window_ms) {
            return bad(
                "plan.workload.until_ms".into(),
                format!(
                    "a cut only shrinks the workload: clients stop at the fault window's end ({} ms)",
                    limits.fault_window_ms
                ),
            );
        }
        if let Some(config) = &self.config {
            config.validate(scenario)?;
        }
        if let Some(env) = &self.environment {
            env.validate(scenario)?;
        }
        let (memory, count, bytes) = self.memory(scenario);
        if !memory.fits() {
            // The plan's own value that tips it: its largest burst or drawn stream when
            // they alone are too much, else its drawn events' size.
            let path = match (memory.in_flight_alone_too_much(), &count, &bytes) {
                (true, Some(count), _) | (false, Some(count), None) => count.clone(),
                (_, _, Some(bytes)) => bytes.clone(),
                (_, None, None) => "plan".into(),
            };
            let scenario_own = |field: &str| format!("the scenario's workload.{field}");
            return bad(
                path,
                memory.explain(
                    &count.unwrap_or_else(|| scenario_own("notifications_per_turn")),
                    &bytes.unwrap_or_else(|| scenario_own("notification_bytes")),
                    "the scenario's limits.max_events",
                ),
            );
        }
        Ok(())
    }

    /// The most a seed of this plan holds in memory (see [`crate::memory`]), with the JSON
    /// paths of the plan's values it comes from: the most events a prompt writes (its
    /// drawn stream's, or its largest burst) and the largest event's size (its drawn
    /// stream's); `None` where the scenario's own workload decides.
    pub fn memory(
        &self,
        scenario: &Scenario,
    ) -> (crate::memory::SeedMemory, Option<String>, Option<String>) {
        let w = &scenario.workload;
        let (mut events, mut count) = match &self.environment {
            Some(e) => (
                e.events_per_prompt.hi,
                Some("plan.environment.events_per_prompt".to_string()),
            ),
            None => (w.notifications_per_turn.hi, None),
        };
        for (i, f) in self.faults.iter().enumerate() {
            if let FaultKind::Burst { count: n } = f.kind {
                if n > events {
                    events = n;
                    count = Some(format!("plan.faults[{i}].count"));
                }
            }
        }
        let (event_bytes, bytes) = match &self.environment {
            Some(e) => match e.wire_bytes {
                Some(wire) if wire.hi > e.event_bytes.hi => {
                    (wire.hi, Some("plan.environment.wire_bytes".to_string()))
                }
                _ => (
                    e.event_bytes.hi,
                    Some("plan.environment.event_bytes".to_string()),
                ),
            },
            None => (w.notification_bytes.hi, None),
        };
        let memory = crate::memory::SeedMemory {
            sessions: u64::from(w.sessions),
            events_per_prompt: u64::from(events),
            event_bytes: u64::from(event_bytes),
            max_events: scenario.limits.max_events,
        };
        (memory, count, bytes)
    }
}

fn draw_p(rng: &mut ChaCha8Rng, b: Bounds<f64>) -> f64 {
    if b.hi <= b.lo {
        b.lo
    } else {
        rng.gen_range(b.lo..=b.hi)
    }
}

fn draw_u(rng: &mut ChaCha8Rng, b: Bounds<u32>) -> u32 {
    if b.hi <= b.lo {
        b.lo
    } else {
        rng.gen_range(b.lo..=b.hi)
    }
}

/// The faults of the scenario's fixed steps, in step order: part of every plan
/// [`draw`] makes. A guided search never moves or drops them (the scenario's expectations,
/// such as a response count, are about them).
pub fn step_faults(scenario: &Scenario) -> Vec<Fault> {
    let mut faults = Vec::new();
    for step in &scenario.steps {
        let kind = match step.action {
            Action::Resume => FaultKind::Resume,
            Action::Prompt => FaultKind::Prompt,
            Action::Cancel => FaultKind::Cancel,
            Action::Retry => FaultKind::Retry,
            Action::ProviderExit => FaultKind::ProviderExit,
            Action::CrashRestart => FaultKind::CrashRestart,
            Action::Burst => FaultKind::Burst {
                count: step.count.unwrap_or(crate::scenario::DEFAULT_BURST_STEP),
            },
            Action::LateCallback => FaultKind::LateCallback {
                delay_ms: step.delay_ms.unwrap_or(0),
            },
            Action::HangTeardown => FaultKind::HangTeardown,
            Action::ExitOnPrompt => FaultKind::ExitOnPrompt,
        };
        let repeat = match step.action {
            Action::ProviderExit | Action::Cancel => step.count.unwrap_or(1).max(1),
            _ => 1,
        };
        for k in 0..repeat {
            // A repeated exit or cancel hits each successive runtime: spread them out.
            faults.push(Fault {
                at_ms: step.at_ms + u64::from(k) * 1_500,
                session: step.session,
                kind,
            });
        }
    }

    faults
}

/// Draws the plan of `seed` for `scenario`.
///
/// Its work is sessions × slots (`fault_window_ms` / 500) × fault classes, so it is
/// bounded by the scenario's bounds (`MAX_SESSIONS`, `MAX_FAULT_WINDOW_MS`, steps and
/// their repeats): at most [`MAX_PLAN_FAULTS`] faults. The hang of `sessions =
/// 4294967295` or `fault_window_ms = u64::MAX` (853 MB after 60 s here) is fixed by
/// refusing those values when the scenario is loaded; no such scenario reaches this.
pub fn draw(scenario: &Scenario, seed: u64) -> FaultPlan {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ PLAN_SALT);
    let f = &scenario.faults;
    let mut swarm = BTreeMap::new();
    let mut p = |name: &str, b: Bounds<f64>, rng: &mut ChaCha8Rng| {
        let v = draw_p(rng, b);
        swarm.insert(name.to_owned(), (v * 1e6).round() / 1e6);
        v
    };
    let delay = p("delay", f.delay, &mut rng);
    let duplicate = p("duplicate", f.duplicate, &mut rng);
    let reorder = p("reorder", f.reorder, &mut rng);
    let cancel = p("cancel", f.cancel, &mut rng);
    let provider_exit = p("provider_exit", f.provider_exit, &mut rng);
    let burst = p("burst", f.burst, &mut rng);
    let load_error = p("load_error", f.load_error, &mut rng);
    let load_timeout = p("load_timeout", f.load_timeout, &mut rng);
    let crash_restart = p("crash_restart", f.crash_restart, &mut rng);
    let hang_teardown = p("hang_teardown", f.hang_teardown, &mut rng);
    let clock_jump = p("clock_jump", f.clock_jump, &mut rng);
    // Drawn last, so the draws of every older fault class are what they always were.
    let caller_stall = p("caller_stall", f.caller_stall, &mut rng);

    let mut faults = step_faults(scenario);

    let window = scenario.limits.fault_window_ms;
    let slots = window.div_ceil(SLOT_MS).max(1);
    for session in 1..=scenario.workload.sessions {
        for w in 0..JITTER_WINDOWS {
            if delay + duplicate + reorder > 0.0 {
                faults.push(Fault {
                    at_ms: window * w / JITTER_WINDOWS,
                    session,
                    kind: FaultKind::Jitter {
                        until_ms: window * (w + 1) / JITTER_WINDOWS,
                        delay_p: delay,
                        duplicate_p: duplicate,
                        reorder_p: reorder,
                        max_delay_ms: f.max_delay_ms,
                    },
                });
            }
        }
        for slot in 0..slots {
            let base = slot * SLOT_MS;
            let at = |rng: &mut ChaCha8Rng| base + rng.gen_range(0..SLOT_MS);
            if rng.gen_bool(cancel.clamp(0.0, 1.0)) {
                faults.push(Fault {
                    at_ms: at(&mut rng),
                    session,
                    kind: FaultKind::Cancel,
                });
                if rng.gen_bool(0.5) {
                    let t = at(&mut rng);
                    faults.push(Fault {
                        at_ms: t,
                        session,
                        kind: FaultKind::Retry,
                    });
                }
            }
            if rng.gen_bool(provider_exit.clamp(0.0, 1.0)) {
                let kind = if rng.gen_bool(0.5) {
                    FaultKind::ProviderExit
                } else {
                    FaultKind::ExitAfterTurn
                };
                faults.push(Fault {
                    at_ms: at(&mut rng),
                    session,
                    kind,
                });
            }
            if rng.gen_bool(burst.clamp(0.0, 1.0)) {
                let count = draw_u(&mut rng, f.burst_size);
                faults.push(Fault {
                    at_ms: at(&mut rng),
                    session,
                    kind: FaultKind::Burst { count },
                });
            }
            if rng.gen_bool(load_error.clamp(0.0, 1.0)) {
                let class = match rng.gen_range(0..4) {
                    0 => LoadErrorClass::UnknownSession,
                    1 => LoadErrorClass::Internal,
                    2 => LoadErrorClass::NotFoundSubstring,
                    _ => LoadErrorClass::AuthRequired,
                };
                faults.push(Fault {
                    at_ms: at(&mut rng),
                    session,
                    kind: FaultKind::LoadError { class },
                });
            }
            if rng.gen_bool(load_timeout.clamp(0.0, 1.0)) {
                faults.push(Fault {
                    at_ms: at(&mut rng),
                    session,
                    kind: FaultKind::LoadTimeout,
                });
            }
            if rng.gen_bool(hang_teardown.clamp(0.0, 1.0)) {
                faults.push(Fault {
                    at_ms: at(&mut rng),
                    session,
                    kind: FaultKind::HangTeardown,
                });
            }
            if session == 1 {
                if rng.gen_bool(crash_restart.clamp(0.0, 1.0)) {
                    faults.push(Fault {
                        at_ms: at(&mut rng),
                        session,
                        kind: FaultKind::CrashRestart,
                    });
                }
                if rng.gen_bool(clock_jump.clamp(0.0, 1.0)) {
                    let ms = rng.gen_range(-5_000i64..=20_000);
                    faults.push(Fault {
                        at_ms: at(&mut rng),
                        session,
                        kind: FaultKind::ClockJump { ms },
                    });
                }
                if caller_stall > 0.0 && rng.gen_bool(caller_stall.clamp(0.0, 1.0)) {
                    let ms = rng.gen_range(1..=f.max_stall_ms.max(1));
                    faults.push(Fault {
                        at_ms: at(&mut rng),
                        session,
                        kind: FaultKind::CallerStall { ms },
                    });
                }
            }
        }
    }
    // Drawn after everything else and only for stack scenarios, so no other scenario's
    // plans change.
    if scenario.world.kind.is_stack() {
        let disk = p("disk_fault", scenario.world.disk_fault, &mut rng);
        for slot in 0..slots {
            if disk > 0.0 && rng.gen_bool(disk.clamp(0.0, 1.0)) {
                let class = match rng.gen_range(0..4) {
                    0 => DiskFaultClass::NoSpace,
                    1 => DiskFaultClass::Io,
                    2 => DiskFaultClass::CrashBeforeRename,
                    _ => DiskFaultClass::TornWrite,
                };
                let count = rng.gen_range(1..=4);
                faults.push(Fault {
                    at_ms: slot * SLOT_MS + rng.gen_range(0..SLOT_MS),
                    session: 1,
                    kind: FaultKind::DiskFault { class, count },
                });
            }
        }
        // Drawn only where a scenario asks for it, so no older stack plan changes.
        if scenario.world.caller_gone.hi > 0.0 {
            let gone = p("caller_gone", scenario.world.caller_gone, &mut rng);
            if rng.gen_bool(gone.clamp(0.0, 1.0)) {
                faults.push(Fault {
                    at_ms: rng.gen_range(0..window.max(1)),
                    session: 1,
                    kind: FaultKind::CallerGone,
                });
            }
        }
    }
    faults.sort_by_key(|f| f.at_ms);
    let mut plan = FaultPlan {
        swarm,
        faults,
        workload: WorkloadCut::default(),
        config: None,
        environment: None,
    };
    draw_into(scenario, seed, &mut plan);
    plan
}

/// The configuration and environment `seed` runs with, put into its plan, and the plan's
/// faults fitted to them: bursts sized at the drawn queue's and coalescer's caps, loads of
/// a session the agent has failed with any answer of the catalogue, and (one seed in four)
/// a tombstone storm on one session.
fn draw_into(scenario: &Scenario, seed: u64, plan: &mut FaultPlan) {
    if !scenario.config.swarm && !scenario.environment.swarm {
        return;
    }
    let agent = if scenario.environment.swarm {
        draw_agent(seed)
    } else {
        scenario.workload.agent
    };
    let config = if scenario.config.swarm {
        draw_config(scenario, seed, agent)
    } else {
        RunConfig::fixed(scenario)
    };
    if scenario.environment.swarm {
        let env = draw_environment(scenario, seed, &config);
        fit_faults(scenario, seed, &config, plan);
        plan.environment = Some(env);
        fit_memory(scenario, plan);
    }
    if scenario.config.swarm {
        plan.config = Some(config);
    }
}

/// Brings a drawn plan within the memory budget ([`crate::memory`]), should its drawn
/// stream and bursts hold more together than a seed may: bursts first come down to the
/// most events a prompt of the scenario or of the drawn stream writes (the scenario's own
/// were checked with its own sizes), then the drawn events' size to the largest that fits.
/// Deterministic, and nothing changes for a plan that fits (every `swarm` plan does:
/// `swarm_draws_fit_the_memory_budget_as_drawn`).
fn fit_memory(scenario: &Scenario, plan: &mut FaultPlan) {
    if plan.memory(scenario).0.fits() {
        return;
    }
    let stream = plan
        .environment
        .as_ref()
        .map_or(0, |e| u64::from(e.events_per_prompt.hi));
    let most = scenario.memory().events_per_prompt.max(stream);
    for f in &mut plan.faults {
        if let FaultKind::Burst { count } = &mut f.kind {
            *count = (*count).min(u32::try_from(most).unwrap_or(u32::MAX));
        }
    }
    let (memory, _, _) = plan.memory(scenario);
    let fitting = memory
        .largest_fitting_event_bytes()
        .expect("the scenario's own counts fit with empty events, and so do the drawn ones");
    let fitting = u32::try_from(fitting).unwrap_or(u32::MAX);
    let capped = |b: Bounds<u32>| Bounds::new(b.lo.min(fitting), b.hi.min(fitting));
    if let Some(env) = plan.environment.as_mut() {
        env.event_bytes = capped(env.event_bytes);
        env.wire_bytes = env.wire_bytes.map(capped);
    }
    debug_assert!(plan.memory(scenario).0.fits(), "{plan:?}");
}

fn fit_faults(scenario: &Scenario, seed: u64, config: &RunConfig, plan: &mut FaultPlan) {
    let queue = config.queue_capacity;
    let events = config.coalesce_events;
    let existing: Vec<LoadAnswer> = LoadAnswer::for_existing_session().collect();
    for (k, f) in plan.faults.iter_mut().enumerate() {
        let key = mix(seed, k as u64, FIT_SALT, 1);
        match &mut f.kind {
            FaultKind::Burst { count } => {
                let choices = [
                    queue.saturating_sub(1),
                    queue,
                    queue + 1,
                    events.saturating_sub(1),
                    events,
                    events + 1,
                    *count,
                ];
                *count = choices[(key % choices.len() as u64) as usize]
                    .clamp(1, crate::scenario::MAX_BURST);
            }
            FaultKind::LoadError { class } if *class != LoadErrorClass::UnknownSession => {
                *class = LoadErrorClass::Answer(existing[(key % existing.len() as u64) as usize]);
            }
            _ => {}
        }
    }
    // Tombstone pressure: one session cancels and retries past the tombstone ring.
    let key = mix(seed, 0, FIT_SALT, 2);
    if scenario.faults.cancel.hi > 0.0 && key.is_multiple_of(4) {
        let session =
            1 + (mix(seed, 1, FIT_SALT, 2) % u64::from(scenario.workload.sessions)) as u32;
        let n = u64::from(TOMBSTONE_STORM.lo)
            + mix(seed, 2, FIT_SALT, 2) % u64::from(TOMBSTONE_STORM.hi - TOMBSTONE_STORM.lo + 1);
        let window = scenario.limits.fault_window_ms.max(1);
        let start = mix(seed, 3, FIT_SALT, 2) % (window / 2).max(1);
        let step = ((window - start) / (2 * n + 1)).max(1);
        for i in 0..n {
            let at = start + 2 * i * step;
            plan.faults.push(Fault {
                at_ms: at.min(window - 1),
                session,
                kind: FaultKind::Cancel,
            });
            plan.faults.push(Fault {
                at_ms: (at + step).min(window - 1),
                session,
                kind: FaultKind::Retry,
            });
        }
        plan.faults.sort_by_key(|f| f.at_ms);
    }
}

#[cfg(test)]
mod tests {
    use palisade_core::classify::AgentProfile;
    use palisade_core::delivery::MAX_COALESCE_BYTES;
    use palisade_core::Config;

    use super::setup::profile;
    use super::*;
    use crate::scenario::Agent;

    /// A failure file carries the plan as JSON; replay must read back the very same plan,
    /// down to the last bit of every probability (swarm seed 28 once replayed a jitter
    /// probability one ulp off, and diverged).
    #[test]
    fn plans_survive_a_json_round_trip_bit_for_bit() {
        let swarm = crate::scenario::resolve_one("swarm")
            .expect("shipped")
            .scenario;
        for seed in 0..300 {
            let plan = draw(&swarm, seed);
            let text = serde_json::to_string(&plan).expect("serialize");
            let back: FaultPlan = serde_json::from_str(&text).expect("parse");
            assert_eq!(back, plan, "seed {seed}");
            assert_eq!(serde_json::to_string(&back).expect("serialize"), text);
        }
    }

    #[test]
    fn a_plan_without_a_cut_runs_the_whole_workload_and_is_written_without_one() {
        let old = r#"{"swarm":{},"faults":[{"at_ms":5,"session":2,"fault":"cancel"}]}"#;
        let plan: FaultPlan = serde_json::from_str(old).expect("an older plan loads");
        assert!(plan.workload.is_whole());
        assert!(plan.workload.client_runs(7));
        assert_eq!(plan.workload.turns(3), 3);
        assert_eq!(plan.workload.notifications(12), 12);
        assert_eq!(plan.workload.until_ms(10_000), 10_000);
        assert_eq!(serde_json::to_string(&plan).expect("serialize"), old);
    }

    #[test]
    fn a_cut_limits_clients_turns_notifications_and_time() {
        let cut = WorkloadCut {
            sessions: Some(vec![2, 5]),
            turns_per_session: Some(1),
            notifications_per_turn: Some(0),
            until_ms: Some(600),
        };
        assert_eq!(cut.active_sessions(6), vec![2, 5]);
        assert!(!cut.client_runs(1));
        assert_eq!(cut.turns(3), 1);
        assert_eq!(cut.turns(0), 0);
        assert_eq!(cut.notifications(12), 0);
        assert_eq!(cut.until_ms(10_000), 600);
        assert_eq!(cut.until_ms(500), 500);
        let plan = FaultPlan {
            workload: cut,
            ..FaultPlan::default()
        };
        let text = serde_json::to_string(&plan).expect("serialize");
        assert_eq!(
            serde_json::from_str::<FaultPlan>(&text).expect("load"),
            plan
        );
    }

    #[test]
    fn every_drawn_plan_of_a_shipped_scenario_validates() {
        for resolved in crate::scenario::resolve("all").expect("shipped scenarios load") {
            for seed in 0..50 {
                let plan = draw(&resolved.scenario, seed);
                assert_eq!(
                    plan.validate(&resolved.scenario),
                    Ok(()),
                    "{} seed {seed}",
                    resolved.scenario.name
                );
            }
        }
    }

    #[test]
    fn impossible_faults_are_refused_with_their_json_path() {
        let swarm = crate::scenario::resolve_one("swarm")
            .expect("shipped")
            .scenario;
        let one = |kind, session, at_ms| FaultPlan {
            faults: vec![
                Fault {
                    at_ms: 0,
                    session: 1,
                    kind: FaultKind::Cancel,
                },
                Fault {
                    at_ms,
                    session,
                    kind,
                },
            ],
            ..FaultPlan::default()
        };
        let jitter = |p: f64| FaultKind::Jitter {
            until_ms: 100,
            delay_p: p,
            duplicate_p: 0.0,
            reorder_p: 0.0,
            max_delay_ms: 10,
        };
        for (plan, path) in [
            (one(FaultKind::Cancel, 0, 5), "plan.faults[1].session"),
            (one(FaultKind::Cancel, 999, 5), "plan.faults[1].session"),
            (one(FaultKind::Cancel, 1, u64::MAX), "plan.faults[1].at_ms"),
            (
                one(FaultKind::LateCallback { delay_ms: u64::MAX }, 1, 5),
                "plan.faults[1].delay_ms",
            ),
            (one(jitter(5.0), 1, 5), "plan.faults[1].delay_p"),
            (one(jitter(-3.0), 1, 5), "plan.faults[1].delay_p"),
            (
                one(FaultKind::ClockJump { ms: i64::MIN }, 1, 5),
                "plan.faults[1].ms",
            ),
            (
                one(FaultKind::ClockJump { ms: i64::MAX }, 1, 5),
                "plan.faults[1].ms",
            ),
        ] {
            let e = plan.validate(&swarm).expect_err(path);
            assert_eq!(e.path, path, "{e}");
        }
    }

    #[test]
    fn crash_restarts_and_clock_jumps_are_global() {
        let at = |kind| Fault {
            at_ms: 0,
            session: 1,
            kind,
        };
        assert!(at(FaultKind::CrashRestart).is_global());
        assert!(at(FaultKind::ClockJump { ms: 5 }).is_global());
        assert!(!at(FaultKind::Cancel).is_global());
    }

    /// Swarm's seeds reach the corners of the configuration and environment space, every
    /// drawn configuration is one the core accepts, and a seed draws the same every time.
    #[test]
    fn swarm_seeds_draw_valid_configurations_that_reach_every_corner() {
        let swarm = crate::scenario::resolve_one("swarm")
            .expect("shipped")
            .scenario;
        assert!(swarm.config.swarm && swarm.environment.swarm);
        let mut profiles = std::collections::BTreeSet::new();
        let mut agents = std::collections::BTreeSet::new();
        let mut answers = std::collections::BTreeSet::new();
        let (mut empty, mut single, mut queue_one, mut wire, mut storms) = (0, 0, 0, 0, 0);
        for seed in 0..400 {
            let plan = draw(&swarm, seed);
            assert_eq!(plan, draw(&swarm, seed), "seed {seed}");
            assert_eq!(plan.validate(&swarm), Ok(()), "seed {seed}");
            let config = plan.config.clone().expect("swarm draws its configuration");
            assert!(config.core().validate().is_ok(), "seed {seed}");
            let env = plan
                .environment
                .clone()
                .expect("swarm draws its environment");
            profiles.insert(format!("{:?}", config.agent_profile));
            agents.insert(env.agent);
            empty += usize::from(config.recovery_delays_ms.is_empty());
            single += usize::from(config.recovery_delays_ms.len() == 1);
            queue_one += usize::from(config.queue_capacity == 1);
            wire += usize::from(env.wire_bytes.is_some());
            let cancels = plan
                .faults
                .iter()
                .filter(|f| matches!(f.kind, FaultKind::Cancel))
                .count();
            storms += usize::from(cancels > TOMBSTONE_STORM.lo as usize);
            for f in &plan.faults {
                if let FaultKind::LoadError {
                    class: LoadErrorClass::Answer(a),
                } = f.kind
                {
                    assert!(a.near_miss() || a.transient(), "{a:?}");
                    answers.insert(a);
                }
            }
        }
        assert_eq!(profiles.len(), AgentProfile::ALL.len(), "{profiles:?}");
        assert_eq!(agents.len(), Agent::ALL.len(), "{agents:?}");
        assert!(
            empty > 20 && single > 20 && queue_one > 50,
            "{empty} {single} {queue_one}"
        );
        assert!(wire > 20 && storms > 20, "{wire} {storms}");
        let existing = LoadAnswer::for_existing_session().count();
        assert_eq!(answers.len(), existing, "{answers:?}");
    }

    /// The largest stream a seed of `scenario` may draw before [`fit_memory`]: the most
    /// events a prompt writes (its drawn stream's, or a burst sized at the drawn queue's or
    /// coalescer's caps, or the scenario's own) and the largest event (the scenario's own,
    /// a large payload, or a line sized at the coalescer's byte cap, give or take a byte).
    fn largest_draw(scenario: &Scenario) -> crate::memory::SeedMemory {
        let c = &scenario.config;
        let late = scenario.limits.quiesce_ms / crate::scenario::LATE_SHARE_OF_QUIESCE;
        let most = u64::from(crate::scenario::MAX_NOTIFICATIONS_PER_TURN).min(late);
        let own = scenario.memory();
        let stream = [
            own.events_per_prompt,
            (2 * 8 + 1u64).min(most),
            (2 * u64::from(c.coalesce_events.hi)).min(most),
            6,
        ];
        let bursts = [
            u64::from(c.queue_capacity.hi) + 1,
            u64::from(c.coalesce_events.hi) + 1,
        ];
        let event_bytes = [
            own.event_bytes,
            16 * 1024,
            c.coalesce_bytes
                .hi
                .min(u64::from(crate::scenario::MAX_NOTIFICATION_BYTES))
                + 1,
        ];
        crate::memory::SeedMemory {
            events_per_prompt: stream
                .into_iter()
                .chain(bursts)
                .max()
                .expect("not empty")
                .min(u64::from(crate::scenario::MAX_BURST)),
            event_bytes: event_bytes.into_iter().max().expect("not empty"),
            ..own
        }
    }

    /// Every draw of the shipped scenarios fits the memory budget as drawn, so bounding the
    /// draw ([`fit_memory`]) changes no plan of theirs (and no digest of the main job).
    #[test]
    fn swarm_draws_fit_the_memory_budget_as_drawn() {
        let all = crate::scenario::resolve("all").expect("shipped");
        let drawing: Vec<_> = all
            .iter()
            .filter(|r| r.scenario.environment.swarm)
            .collect();
        assert!(!drawing.is_empty());
        for r in drawing {
            let largest = largest_draw(&r.scenario);
            assert!(
                largest.fits(),
                "{}: {largest:?}: {}",
                r.scenario.name,
                largest.explain("count", "bytes", "events")
            );
            for seed in 0..400 {
                let plan = draw(&r.scenario, seed);
                let (drawn, _, _) = plan.memory(&r.scenario);
                assert!(
                    drawn.events_per_prompt <= largest.events_per_prompt
                        && drawn.event_bytes <= largest.event_bytes,
                    "{} seed {seed}: {drawn:?} past {largest:?}",
                    r.scenario.name
                );
            }
        }
    }

    /// A scenario whose draws could hold more than a seed may gets them brought within the
    /// budget: bursts down to the scenario's own most, then the events' size.
    #[test]
    fn a_draw_past_the_memory_budget_is_brought_within_it() {
        let mut big = crate::scenario::resolve_one("swarm")
            .expect("shipped")
            .scenario;
        big.workload.sessions = 64;
        big.config.queue_capacity = Bounds::new(1, 65_536);
        big.config.coalesce_bytes = Bounds::new(1, MAX_COALESCE_BYTES);
        big.faults.burst = Bounds::new(0.2, 0.4);
        let own = big.memory();
        assert!(own.fits(), "the scenario's own stream fits");
        assert!(!largest_draw(&big).fits(), "its draws need not");
        for seed in 0..200 {
            let plan = draw(&big, seed);
            assert_eq!(plan.validate(&big), Ok(()), "seed {seed}");
        }
        // The largest of them: events of a mebibyte, and a burst at the largest queue.
        let mut plan = draw(&big, 0);
        plan.environment.as_mut().expect("drawn").wire_bytes =
            Some(Bounds::exactly(crate::scenario::MAX_NOTIFICATION_BYTES));
        plan.faults.push(Fault {
            at_ms: 10,
            session: 1,
            kind: FaultKind::Burst {
                count: crate::scenario::MAX_BURST,
            },
        });
        assert!(!plan.memory(&big).0.fits());
        fit_memory(&big, &mut plan);
        assert_eq!(plan.validate(&big), Ok(()));
        let (fitted, _, _) = plan.memory(&big);
        assert_eq!(fitted.events_per_prompt, own.events_per_prompt);
        assert!(fitted.event_bytes < u64::from(crate::scenario::MAX_NOTIFICATION_BYTES));
        assert!(
            !crate::memory::SeedMemory {
                event_bytes: fitted.event_bytes + 1,
                ..fitted
            }
            .fits(),
            "the largest size that fits: {fitted:?}"
        );
    }

    /// A scenario that does not opt in draws nothing besides its faults.
    #[test]
    fn a_scenario_without_swarm_sections_runs_its_own_configuration() {
        let storm = crate::scenario::resolve_one("cancel-storm")
            .expect("shipped")
            .scenario;
        let plan = draw(&storm, 3);
        assert_eq!(plan.config, None);
        assert_eq!(plan.environment, None);
        assert_eq!(
            plan.run_config(&storm).core(),
            Config {
                agent_profile: profile(storm.workload.agent),
                ..storm.effective_core_config()
            }
        );
    }
}
