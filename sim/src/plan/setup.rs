//! What a seed draws besides its faults: swarm over configuration and environment.
//!
//! A scenario that opts in (`[config] swarm = true`, `[environment] swarm = true`) has
//! every seed draw, from a ChaCha stream of its own (so its faults are drawn exactly as
//! before):
//!
//! - its core and engine configuration ([`RunConfig`]): recovery schedules from empty
//!   (recovery disabled) through single-step to four steps, deadlines from tight to loose,
//!   delivery queues from one slot, coalescer caps, join waits and every agent profile,
//!   within what `Config::validate` and the scenario's liveness window accept;
//! - its environment ([`Environment`]): which real agent its runtimes are (their
//!   unknown-session answer and load capability), how they stream (small chunks, events
//!   sized at the coalescer's byte cap, counts at its event cap, large tool-call and
//!   resource payloads), bursts sized at the delivery queue's and the coalescer's caps,
//!   tombstone pressure (a cancel-and-retry storm past the 16-tombstone ring), and loads
//!   that fail with any answer of the catalogue (`palisade_testkit::agent_model::LoadAnswer`).
//!
//! Both are part of the plan: a failure file records them, replay runs them exactly, and
//! minimisation moves them back toward the scenario's own ([`RunConfig::fixed`],
//! [`Environment::fixed`]) one field at a time. A plan without them (every plan of a
//! scenario that does not opt in, and every older failure file) runs the scenario's own.
//! The bursts, load failures and tombstone storms are the plan's faults, fitted to what was
//! drawn here when the plan is drawn ([`super::draw`]).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use palisade_core::classify::AgentProfile;
use palisade_core::delivery::{
    CoalescerConfig, MAX_COALESCE_BYTES, MAX_COALESCE_DELAY_MS, MAX_COALESCE_EVENTS,
    MAX_QUEUE_CAPACITY,
};
use palisade_core::Config;
use palisade_engine::EngineConfig;

use super::error::PlanError;
use crate::scenario::{Agent, Bounds, Scenario};

/// Salt of the setup stream, apart from the fault plan's.
const SETUP_SALT: u64 = 0x5e70_c0f1_6000_0001;
/// Salt of the per-burst and per-load keys.
pub(crate) const FIT_SALT: u64 = 0x5e70_c0f1_6000_0002;
/// Salt of the runtime-reuse draw (its own stream: every other draw stays as it was).
const REUSE_SALT: u64 = 0x5e70_c0f1_6000_0003;
/// Keys a seed's draw of the sidecar topology.
const SIDECAR_SALT: u64 = 0x5e70_c0f1_6000_0004;

/// Spawn delays a seed that reuses runtimes draws: its starts take long enough that a
/// cancel and a retry often come while a process is still starting (what reuse is for).
const DRAWN_SPAWN_DELAY_MS: Bounds<u64> = Bounds::new(1, 400);

/// The engine's request deadlines in the sim: short enough that a hung agent is given up
/// on well inside the liveness window.
pub(crate) const ENGINE_REQUEST_TIMEOUT_MS: u64 = 5_000;
/// The idle deadline of a turn under the engine (the stack and proxy worlds).
pub(crate) const STACK_TURN_IDLE_MS: u64 = 10_000;
/// The grace a stopping agent gets to exit after its stdin closes.
pub(crate) const STOP_GRACE_MS: u64 = 500;

/// The configuration one run uses: the core's `Config` and the engine's delivery knobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The recovery delay schedule; empty disables recovery.
    pub recovery_delays_ms: Vec<u64>,
    /// How long a joiner waits for a live attempt.
    pub join_wait_ms: u64,
    /// A generation lease's lifetime.
    pub lease_ms: u64,
    /// The deadline of a teardown.
    pub stop_deadline_ms: u64,
    /// The deadline of a startup.
    pub start_deadline_ms: u64,
    /// Which agent's load answers the core trusts (rule 6).
    pub agent_profile: AgentProfile,
    /// Each session's delivery queue capacity.
    pub queue_capacity: u32,
    /// The coalescer's delay.
    pub coalesce_delay_ms: u64,
    /// The coalescer's event cap.
    pub coalesce_events: u32,
    /// The coalescer's byte cap.
    pub coalesce_bytes: u64,
    /// The engine's runtime reuse (`EngineConfig::reuse_runtimes`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reuse_runtimes: bool,
}

impl RunConfig {
    /// The scenario's own configuration: `[core]` over the core's defaults, the profile of
    /// its agent, the default queue and coalescer.
    pub fn fixed(scenario: &Scenario) -> RunConfig {
        let core = scenario.effective_core_config();
        let coalescer = CoalescerConfig::default();
        RunConfig {
            recovery_delays_ms: core.recovery_delays_ms,
            join_wait_ms: core.join_wait_ms,
            lease_ms: core.lease_ms,
            stop_deadline_ms: core.stop_deadline_ms,
            start_deadline_ms: core.start_deadline_ms,
            agent_profile: profile(scenario.workload.agent),
            queue_capacity: scenario
                .core
                .queue_capacity
                .unwrap_or(palisade_core::delivery::DEFAULT_QUEUE_CAPACITY as u32),
            coalesce_delay_ms: coalescer.max_delay_ms,
            coalesce_events: coalescer.max_events as u32,
            coalesce_bytes: coalescer.max_bytes,
            reuse_runtimes: scenario.workload.reuse_runtimes,
        }
    }

    /// The core's part.
    pub fn core(&self) -> Config {
        Config {
            join_wait_ms: self.join_wait_ms,
            start_deadline_ms: self.start_deadline_ms,
            lease_ms: self.lease_ms,
            stop_deadline_ms: self.stop_deadline_ms,
            recovery_delays_ms: self.recovery_delays_ms.clone(),
            agent_profile: self.agent_profile,
            ..Config::default()
        }
    }

    /// The engine's whole configuration.
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            core: Config {
                // The engine's idle rule, short enough for the liveness window.
                turn_idle_ms: STACK_TURN_IDLE_MS,
                ..self.core()
            },
            cwd: "/work".into(),
            initialize_timeout_ms: ENGINE_REQUEST_TIMEOUT_MS,
            load_timeout_ms: ENGINE_REQUEST_TIMEOUT_MS,
            new_session_timeout_ms: ENGINE_REQUEST_TIMEOUT_MS,
            stop_grace_ms: STOP_GRACE_MS,
            delivery_queue_capacity: self.queue_capacity as usize,
            coalescer: CoalescerConfig {
                max_delay_ms: self.coalesce_delay_ms,
                max_events: self.coalesce_events as usize,
                max_bytes: self.coalesce_bytes,
            },
            reuse_runtimes: self.reuse_runtimes,
            ..EngineConfig::default()
        }
    }

    /// Checks that a run of `scenario` can use it (what a failure file's plan may carry):
    /// what `Config::validate` accepts, deadlines and the recovery schedule inside the
    /// liveness window, queue and coalescer within their documented ranges.
    pub fn validate(&self, scenario: &Scenario) -> Result<(), PlanError> {
        let bad = |field: &str, message: String| {
            Err(PlanError {
                path: format!("plan.config.{field}"),
                message,
            })
        };
        if let Err(e) = self.core().validate() {
            let field = match e {
                palisade_core::ConfigError::TooManyRecoverySteps(_)
                | palisade_core::ConfigError::RecoveryDelayTooLong { .. }
                | palisade_core::ConfigError::RecoveryScheduleTooLong { .. } => {
                    "recovery_delays_ms"
                }
                palisade_core::ConfigError::ZeroDeadline(name) => name,
            };
            return bad(field, format!("the core refuses it: {e}"));
        }
        let quiesce = scenario.limits.quiesce_ms;
        for (field, value) in [
            ("lease_ms", self.lease_ms),
            ("stop_deadline_ms", self.stop_deadline_ms),
            ("start_deadline_ms", self.start_deadline_ms),
        ] {
            if value > quiesce {
                return bad(
                    field,
                    format!("{value} ms is longer than the liveness window ({quiesce} ms)"),
                );
            }
        }
        let total = self
            .recovery_delays_ms
            .iter()
            .fold(0u64, |a, &d| a.saturating_add(d));
        if total > quiesce {
            return bad(
                "recovery_delays_ms",
                format!(
                    "the schedule adds up to {total} ms, past the liveness window ({quiesce} ms)"
                ),
            );
        }
        if self.join_wait_ms > crate::scenario::MAX_JOIN_WAIT_MS {
            return bad(
                "join_wait_ms",
                format!(
                    "{} ms is above {} (MAX_JOIN_WAIT_MS)",
                    self.join_wait_ms,
                    crate::scenario::MAX_JOIN_WAIT_MS
                ),
            );
        }
        if self.queue_capacity == 0 || self.queue_capacity as usize > MAX_QUEUE_CAPACITY {
            return bad(
                "queue_capacity",
                format!(
                    "{} is outside 1..={MAX_QUEUE_CAPACITY}",
                    self.queue_capacity
                ),
            );
        }
        if self.coalesce_delay_ms > MAX_COALESCE_DELAY_MS {
            return bad(
                "coalesce_delay_ms",
                format!(
                    "{} is above {MAX_COALESCE_DELAY_MS}",
                    self.coalesce_delay_ms
                ),
            );
        }
        if self.coalesce_events == 0 || self.coalesce_events as usize > MAX_COALESCE_EVENTS {
            return bad(
                "coalesce_events",
                format!(
                    "{} is outside 1..={MAX_COALESCE_EVENTS}",
                    self.coalesce_events
                ),
            );
        }
        if self.coalesce_bytes == 0 || self.coalesce_bytes > MAX_COALESCE_BYTES {
            return bad(
                "coalesce_bytes",
                format!(
                    "{} is outside 1..={MAX_COALESCE_BYTES}",
                    self.coalesce_bytes
                ),
            );
        }
        Ok(())
    }

    /// Candidates one step closer to `to`: this config with one field set back to `to`'s,
    /// for every field that differs (the recovery schedule also one step shorter).
    pub fn toward(&self, to: &RunConfig) -> Vec<RunConfig> {
        let mut out = Vec::new();
        macro_rules! field {
            ($name:ident) => {
                if self.$name != to.$name {
                    out.push(RunConfig {
                        $name: to.$name.clone(),
                        ..self.clone()
                    });
                }
            };
        }
        field!(recovery_delays_ms);
        field!(join_wait_ms);
        field!(lease_ms);
        field!(stop_deadline_ms);
        field!(start_deadline_ms);
        field!(agent_profile);
        field!(queue_capacity);
        field!(coalesce_delay_ms);
        field!(coalesce_events);
        field!(coalesce_bytes);
        field!(reuse_runtimes);
        out
    }
}

/// How a seed's agents stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Environment {
    /// The real agent the runtimes are: their answer to `session/load` of a session they do
    /// not have, and their `loadSession` capability.
    pub agent: Agent,
    /// Stream events per prompt.
    pub events_per_prompt: Bounds<u32>,
    /// Text bytes per event.
    pub event_bytes: Bounds<u32>,
    /// When set, every event's line is exactly this many bytes on the wire (newline
    /// included), so that a batch reaches the coalescer's byte cap exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire_bytes: Option<Bounds<u32>>,
    /// Per mille of events that are tool calls (the payload in `rawInput`).
    pub tool_call_per_mille: u16,
    /// Per mille of events that are resource blocks (the payload in the resource's text).
    pub resource_per_mille: u16,
    /// How long starting a process takes (see `Workload::spawn_delay_ms`).
    #[serde(default, skip_serializing_if = "no_delay")]
    pub spawn_delay_ms: Bounds<u64>,
    /// The runtimes outlive the orchestrator (see `Workload::sidecar`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sidecar: bool,
}

fn no_delay(b: &Bounds<u64>) -> bool {
    b.hi == 0
}

impl Environment {
    /// The scenario's own environment (its agent, its workload's stream).
    pub fn fixed(scenario: &Scenario) -> Environment {
        let w = &scenario.workload;
        Environment {
            agent: w.agent,
            events_per_prompt: w.notifications_per_turn,
            event_bytes: w.notification_bytes,
            wire_bytes: None,
            tool_call_per_mille: 100,
            resource_per_mille: 0,
            spawn_delay_ms: w.spawn_delay_ms,
            sidecar: w.sidecar,
        }
    }

    /// Checks it against the scenario's bounds (a failure file's plan may carry it).
    pub fn validate(&self, scenario: &Scenario) -> Result<(), PlanError> {
        let bad = |field: &str, message: String| {
            Err(PlanError {
                path: format!("plan.environment.{field}"),
                message,
            })
        };
        let late = scenario.limits.quiesce_ms / crate::scenario::LATE_SHARE_OF_QUIESCE;
        let most = u64::from(crate::scenario::MAX_NOTIFICATIONS_PER_TURN).min(late);
        let e = self.events_per_prompt;
        if e.lo > e.hi || u64::from(e.hi) > most {
            return bad(
                "events_per_prompt",
                format!("[{}, {}] is not a range within 0..={most} (MAX_NOTIFICATIONS_PER_TURN, a quarter of quiesce_ms)", e.lo, e.hi),
            );
        }
        for (field, b) in [
            ("event_bytes", Some(self.event_bytes)),
            ("wire_bytes", self.wire_bytes),
        ] {
            let Some(b) = b else { continue };
            if b.lo > b.hi || b.hi > crate::scenario::MAX_NOTIFICATION_BYTES {
                return bad(
                    field,
                    format!(
                        "[{}, {}] is not a range within 0..={} (MAX_NOTIFICATION_BYTES)",
                        b.lo,
                        b.hi,
                        crate::scenario::MAX_NOTIFICATION_BYTES
                    ),
                );
            }
        }
        let d = self.spawn_delay_ms;
        if d.lo > d.hi || d.hi > late {
            return bad(
                "spawn_delay_ms",
                format!(
                    "[{}, {}] is not a range within 0..={late} (a quarter of quiesce_ms)",
                    d.lo, d.hi
                ),
            );
        }
        if u32::from(self.tool_call_per_mille) + u32::from(self.resource_per_mille) > 1000 {
            return bad(
                "resource_per_mille",
                "tool calls and resources add up to more than 1000 per mille".into(),
            );
        }
        Ok(())
    }

    /// Candidates one step closer to `to`, one field at a time.
    pub fn toward(&self, to: &Environment) -> Vec<Environment> {
        let mut out = Vec::new();
        macro_rules! field {
            ($name:ident) => {
                if self.$name != to.$name {
                    out.push(Environment {
                        $name: to.$name.clone(),
                        ..self.clone()
                    });
                }
            };
        }
        field!(agent);
        field!(events_per_prompt);
        field!(event_bytes);
        field!(wire_bytes);
        field!(tool_call_per_mille);
        field!(resource_per_mille);
        field!(spawn_delay_ms);
        field!(sidecar);
        out
    }
}

/// The core profile a service would configure for `agent`.
pub(crate) fn profile(agent: Agent) -> AgentProfile {
    match agent {
        Agent::ClaudeAgentAcp => AgentProfile::ClaudeAgentAcp,
        Agent::ClaudeCodeAcp => AgentProfile::ClaudeCodeAcp,
        Agent::CodexAcp => AgentProfile::CodexAcpRust,
        Agent::CodexAcpTs => AgentProfile::CodexAcpTs,
        Agent::GeminiCli => AgentProfile::GeminiCli,
        Agent::Goose => AgentProfile::Goose,
        Agent::Opencode => AgentProfile::Opencode,
        Agent::NoLoad => AgentProfile::Generic,
    }
}

/// A value of `b`, log-uniform (a power-of-two band first, then a value in it), so tight
/// values are drawn as often as loose ones; integers only, so the draw is the same on
/// every platform.
pub(crate) fn log_uniform(rng: &mut ChaCha8Rng, b: Bounds<u64>) -> u64 {
    if b.hi <= b.lo {
        return b.lo;
    }
    let lo = b.lo.max(1);
    let (band_lo, band_hi) = (63 - lo.leading_zeros(), 63 - b.hi.leading_zeros());
    let band = rng.gen_range(band_lo..=band_hi);
    let start = (1u64 << band).max(lo);
    let end = ((1u64 << band) - 1 + (1u64 << band)).min(b.hi);
    let v = rng.gen_range(start..=end.max(start));
    if b.lo == 0 && rng.gen_ratio(1, 8) {
        0
    } else {
        v
    }
}

fn log_uniform_u32(rng: &mut ChaCha8Rng, b: Bounds<u32>) -> u32 {
    log_uniform(rng, Bounds::new(u64::from(b.lo), u64::from(b.hi))) as u32
}

/// Draws the configuration of `seed` (the scenario opted in with `[config] swarm`); a
/// value `[core]` sets is kept. The profile is the one of `agent` for half the seeds, any
/// profile for the others (a service that names its agent wrong must still be safe:
/// profiles only add projections).
pub fn draw_config(scenario: &Scenario, seed: u64, agent: Agent) -> RunConfig {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ SETUP_SALT);
    let s = &scenario.config;
    let pinned = &scenario.core;
    let start_deadline_ms = log_uniform(&mut rng, s.start_deadline_ms);
    let steps = rng.gen_range(s.recovery_steps.lo..=s.recovery_steps.hi.max(s.recovery_steps.lo));
    let mut delays: Vec<u64> = (0..steps)
        .map(|_| log_uniform(&mut rng, s.recovery_delay_ms))
        .collect();
    // The schedule fits its share of the liveness window (checked when the scenario was
    // loaded to be possible): a recovery that outlasts the window is the scenario's fault.
    let budget = s.recovery_total_ms;
    while delays.iter().sum::<u64>() > budget {
        for d in &mut delays {
            *d = (*d / 2).max(1);
        }
    }
    let join_wait_ms = log_uniform(&mut rng, s.join_wait_ms);
    let lease_ms = log_uniform(&mut rng, s.lease_ms);
    let stop_deadline_ms = log_uniform(&mut rng, s.stop_deadline_ms);
    let queue_capacity = if rng.gen_ratio(1, 4) {
        s.queue_capacity.lo
    } else {
        log_uniform_u32(&mut rng, s.queue_capacity)
    };
    let coalesce_delay_ms = log_uniform(&mut rng, s.coalesce_delay_ms);
    let coalesce_events = log_uniform_u32(&mut rng, s.coalesce_events);
    let coalesce_bytes = log_uniform(&mut rng, s.coalesce_bytes);
    let any_profile = AgentProfile::ALL[rng.gen_range(0..AgentProfile::ALL.len())];
    let agent_profile = if rng.gen_bool(0.5) {
        profile(agent)
    } else {
        any_profile
    };
    // From a stream of its own, so that every draw above is what it was before reuse.
    let reuse_runtimes = scenario.workload.reuse_runtimes
        || ChaCha8Rng::seed_from_u64(seed ^ SETUP_SALT ^ REUSE_SALT).gen_bool(0.5);
    RunConfig {
        recovery_delays_ms: pinned.recovery_delays_ms.clone().unwrap_or(delays),
        join_wait_ms: pinned.join_wait_ms.unwrap_or(join_wait_ms),
        lease_ms: pinned.lease_ms.unwrap_or(lease_ms),
        stop_deadline_ms: pinned.stop_deadline_ms.unwrap_or(stop_deadline_ms),
        start_deadline_ms: pinned.start_deadline_ms.unwrap_or(start_deadline_ms),
        agent_profile,
        queue_capacity: pinned.queue_capacity.unwrap_or(queue_capacity),
        coalesce_delay_ms,
        coalesce_events,
        coalesce_bytes,
        reuse_runtimes,
    }
}

/// The agent `seed`'s runtimes are (the scenario opted in with `[environment] swarm`).
pub(crate) fn draw_agent(seed: u64) -> Agent {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ SETUP_SALT ^ FIT_SALT);
    Agent::ALL[rng.gen_range(0..Agent::ALL.len())]
}

/// Draws the environment of `seed` (the scenario opted in with `[environment] swarm`),
/// for the configuration it runs with.
pub fn draw_environment(scenario: &Scenario, seed: u64, config: &RunConfig) -> Environment {
    let agent = draw_agent(seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ SETUP_SALT ^ FIT_SALT ^ 1);
    let fixed = Environment::fixed(scenario);
    let late = scenario.limits.quiesce_ms / crate::scenario::LATE_SHARE_OF_QUIESCE;
    let most = u64::from(crate::scenario::MAX_NOTIFICATIONS_PER_TURN).min(late) as u32;
    let cap_events = config.coalesce_events.min(most);
    let cap_bytes = u32::try_from(config.coalesce_bytes)
        .unwrap_or(u32::MAX)
        .min(crate::scenario::MAX_NOTIFICATION_BYTES);
    let shape = rng.gen_range(0..5u32);
    let env = match shape {
        // The scenario's own stream.
        0 | 1 => fixed.clone(),
        // Every event sized so that k of them fill the coalescer's byte cap exactly (give
        // or take a byte): batches flush on bytes, at the cap.
        2 => {
            let k = [1u32, 2, 3, 4, 8][rng.gen_range(0..5)];
            let size = (cap_bytes / k).max(1);
            let d = rng.gen_range(0..=2u32);
            let size = (size + d).saturating_sub(1).max(1);
            Environment {
                events_per_prompt: Bounds::new(1, (2 * k + 1).min(most)),
                wire_bytes: Some(Bounds::exactly(size)),
                tool_call_per_mille: rng.gen_range(0..=500),
                ..fixed.clone()
            }
        }
        // Counts at the event cap (one under, at, one over, and twice), small events:
        // batches flush on count.
        3 => {
            let n = [
                cap_events.saturating_sub(1).max(1),
                cap_events,
                cap_events + 1,
                2 * cap_events,
            ][rng.gen_range(0..4)]
            .min(most);
            Environment {
                events_per_prompt: Bounds::new(n, n),
                event_bytes: Bounds::new(16, 64),
                ..fixed.clone()
            }
        }
        // Large tool-call and resource payloads (each past the default byte cap; 16 KiB at
        // most, so that the main job keeps its time budget).
        _ => Environment {
            events_per_prompt: Bounds::new(1, 6.min(most).max(1)),
            event_bytes: Bounds::new(4 * 1024, 16 * 1024),
            tool_call_per_mille: 400,
            resource_per_mille: 300,
            ..fixed.clone()
        },
    };
    // A seed that reuses runtimes starts them slowly (its own stream, as above); one that
    // does not keeps the scenario's starts, so its run is what it was before reuse.
    let spawn_delay_ms = if config.reuse_runtimes && fixed.spawn_delay_ms.hi == 0 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ SETUP_SALT ^ REUSE_SALT ^ 1);
        let hi = rng
            .gen_range(DRAWN_SPAWN_DELAY_MS.lo..=DRAWN_SPAWN_DELAY_MS.hi)
            .min(late);
        Bounds::new(DRAWN_SPAWN_DELAY_MS.lo.min(hi), hi)
    } else {
        fixed.spawn_delay_ms
    };
    // Half the seeds run their agents behind a sidecar: they outlive a crash-restart.
    let sidecar =
        fixed.sidecar || ChaCha8Rng::seed_from_u64(seed ^ SETUP_SALT ^ SIDECAR_SALT).gen_bool(0.5);
    Environment {
        agent,
        spawn_delay_ms,
        sidecar,
        ..env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_uniform_stays_in_range_and_reaches_both_ends() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let b = Bounds::new(1, 10_000);
        let draws: Vec<u64> = (0..4_000).map(|_| log_uniform(&mut rng, b)).collect();
        assert!(draws.iter().all(|&v| (1..=10_000).contains(&v)));
        assert!(draws.iter().filter(|&&v| v < 10).count() > 200);
        assert!(draws.iter().filter(|&&v| v > 5_000).count() > 100);
        let zero = Bounds::new(0, 100);
        assert!((0..400).any(|_| log_uniform(&mut rng, zero) == 0));
        assert_eq!(log_uniform(&mut rng, Bounds::exactly(5)), 5);
    }
}
