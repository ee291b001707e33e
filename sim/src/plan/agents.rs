//! Which real agent a scenario's runtimes imitate: the behaviour each simulated agent
//! process gets (from `palisade_testkit::agent_model`, the model `palisade-test-agent`
//! runs on real stdio). The core profile a service would configure for it is part of the
//! configuration (`setup::profile`).

use palisade_testkit::agent_model::{Behaviour, LoadCapability, UnknownSession};

use super::setup::Environment;
use crate::mix::{chance, mix, pick};
use crate::scenario::{Agent, Expect, Workload};

/// How the real `agent` answers `session/load` of a session it does not have.
pub(crate) fn unknown_session(agent: Agent) -> UnknownSession {
    match agent {
        Agent::ClaudeAgentAcp => UnknownSession::ClaudeAgentAcp,
        Agent::ClaudeCodeAcp => UnknownSession::ClaudeCodeAcp,
        Agent::CodexAcp => UnknownSession::CodexAcp,
        Agent::CodexAcpTs => UnknownSession::CodexAcpTs,
        Agent::GeminiCli => UnknownSession::Gemini,
        Agent::Goose => UnknownSession::Goose,
        Agent::Opencode => UnknownSession::Opencode,
        Agent::NoLoad => UnknownSession::TsMethodNotFound,
    }
}

/// The behaviour of one agent process of a scenario (its `workload` and `expect`), keyed by
/// the seed and the process (so removing a fault does not change another process's
/// behaviour); `env` is the seed's drawn environment (swarm over the environment), if it
/// drew one.
pub(crate) fn behaviour(
    workload: &Workload,
    expect: &Expect,
    env: Option<&Environment>,
    seed: u64,
    process: u64,
) -> Behaviour {
    let w = workload;
    let key = |salt: u64| mix(seed, process, salt, 0x0a6e);
    let agent = env.map_or(w.agent, |e| e.agent);
    // What every real agent of the table does: none exits on stdin EOF; the rest is drawn
    // per process so a seed meets each behaviour now and then.
    Behaviour {
        load_capability: if agent == Agent::NoLoad {
            if chance(key(1), 0.5) {
                LoadCapability::Absent
            } else {
                LoadCapability::False
            }
        } else {
            LoadCapability::True
        },
        unknown_session: unknown_session(agent),
        // claude-agent-acp 0.23 answers −32002 for a session it has when its Claude
        // subprocess closes before the first answer (issue 13). Only where a fallback is
        // allowed: elsewhere every load of an existing session must succeed.
        resume_flake_per_mille: if agent == Agent::ClaudeAgentAcp
            && expect.fallback_allowed
            && chance(key(10), 0.5)
        {
            250
        } else {
            0
        },
        lists_sessions: chance(key(2), 0.5),
        exits_on_eof: chance(key(3), 0.25),
        launcher: chance(key(4), 0.25),
        unprompted_updates: chance(key(5), 0.5),
        asks_permission: chance(key(6), 0.2),
        stderr_noise: chance(key(7), 0.3),
        new_fails: None,
        prompt_fail_per_mille: 0,
        prompt_failure: if chance(key(8), 0.5) {
            palisade_testkit::agent_model::RequestFailure::AuthRequired
        } else {
            palisade_testkit::agent_model::RequestFailure::Internal
        },
        answer_delay_ms: (w.load_delay_ms.lo.max(1), w.load_delay_ms.hi.max(1)),
        events_per_prompt: match env {
            Some(e) => (e.events_per_prompt.lo, e.events_per_prompt.hi),
            None => (w.notifications_per_turn.lo, w.notifications_per_turn.hi),
        },
        event_bytes: match env {
            Some(e) => (e.event_bytes.lo, e.event_bytes.hi),
            None => (w.notification_bytes.lo, w.notification_bytes.hi),
        },
        event_wire_bytes: env.and_then(|e| e.wire_bytes).map(|b| (b.lo, b.hi)),
        tool_call_per_mille: match env {
            Some(e) => e.tool_call_per_mille,
            None => pick(key(9), 0, 300) as u16,
        },
        resource_per_mille: env.map_or(0, |e| e.resource_per_mille),
        think_ms: (w.think_ms.lo, w.think_ms.hi),
        silent_per_mille: w.silent_per_mille,
        mute_per_mille: w.mute_per_mille,
        auth_required: w.auth_required,
    }
}
