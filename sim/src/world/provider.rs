//! The provider side: simulated agent controllers (executions) and their ACP agents. This
//! is the ground truth the oracle judges against: which processes really run, which
//! conversations really exist, which prompts really reached an agent. It holds no protocol
//! logic of the core: it answers requests the way real agents do.

use std::collections::{BTreeMap, BTreeSet};

use palisade_core::classify::{AgentProfile, LoadFailure, LoadOutcome, RpcError, TransportState};
use palisade_core::{AttemptId, ExecutionId, Generation};

use super::plan::LoadErrorClass;
use crate::scenario::Agent;

/// One agent process inside an execution.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AgentProc {
    pub(crate) attempt: AttemptId,
    pub(crate) generation: Generation,
    pub(crate) alive: bool,
    /// A `session/cancel` asked the running prompt to stop.
    pub(crate) cancel_requested: bool,
}

/// One execution (agent controller).
#[derive(Clone, Debug)]
pub(crate) struct Container {
    pub(crate) session: u32,
    pub(crate) alive: bool,
    pub(crate) stopping: bool,
    pub(crate) agent: Option<AgentProc>,
}

/// The ground truth.
#[derive(Debug, Default)]
pub(crate) struct Provider {
    pub(crate) containers: BTreeMap<ExecutionId, Container>,
    /// The last execution ID each session used, reused by replacements.
    pub(crate) last_exec: BTreeMap<u32, ExecutionId>,
    pub(crate) next_exec: u64,
    /// IDs the core asked to stop whose teardown has not finished: never reused until then.
    pub(crate) stop_pending: std::collections::BTreeSet<ExecutionId>,
    pub(crate) conversations: BTreeSet<u64>,
    pub(crate) next_conversation: u64,
    pub(crate) next_stamp: u64,
    /// Times a notification queue closed because it was full (rule 9 forbids it).
    pub(crate) closed_on_full: u64,
    /// Times a notification queue pushed back (backpressure).
    pub(crate) backpressure: u64,
}

impl Provider {
    pub(crate) fn stamp(&mut self) -> palisade_core::ErrorStamp {
        self.next_stamp += 1;
        palisade_core::ErrorStamp::new(self.next_stamp).expect("counter starts at one")
    }

    /// Picks the execution for a new runtime of `session`. Like a managed runtime, the
    /// executor keeps one execution per session: with `reuse` it restarts the agent inside
    /// the session's current execution (a new generation of the same ID), or re-creates a
    /// dead one under its old ID; otherwise, or when that execution is being torn down, it
    /// makes a fresh one.
    pub(crate) fn allocate(&mut self, session: u32, reuse: bool, fresh_only: bool) -> ExecutionId {
        if let Some(&last) = self.last_exec.get(&session) {
            if reuse && !fresh_only && !self.stop_pending.contains(&last) {
                match self.containers.get(&last) {
                    Some(c) if c.alive && !c.stopping => return last,
                    Some(c) if c.alive => {}
                    _ => {
                        self.containers.insert(
                            last,
                            Container {
                                session,
                                alive: true,
                                stopping: false,
                                agent: None,
                            },
                        );
                        return last;
                    }
                }
            }
        }
        self.next_exec += 1;
        let id =
            ExecutionId::new(u64::from(session) * 1_000_000 + self.next_exec).expect("non-zero");
        self.last_exec.insert(session, id);
        self.containers.insert(
            id,
            Container {
                session,
                alive: true,
                stopping: false,
                agent: None,
            },
        );
        id
    }

    /// The live agent of `exec` if it is generation `generation`.
    pub(crate) fn agent(&self, exec: ExecutionId, generation: Generation) -> Option<AgentProc> {
        let c = self.containers.get(&exec)?;
        let a = c.agent?;
        (c.alive && a.alive && a.generation == generation).then_some(a)
    }

    /// The session's running agent (the newest live one).
    pub(crate) fn running(&self, session: u32) -> Option<(ExecutionId, AgentProc)> {
        self.containers
            .iter()
            .rev()
            .filter(|(_, c)| c.session == session && c.alive && !c.stopping)
            .find_map(|(e, c)| c.agent.filter(|a| a.alive).map(|a| (*e, a)))
    }

    pub(crate) fn kill(&mut self, exec: ExecutionId) {
        if let Some(c) = self.containers.get_mut(&exec) {
            c.alive = false;
            c.stopping = false;
            if let Some(a) = c.agent.as_mut() {
                a.alive = false;
            }
        }
    }

    pub(crate) fn new_conversation(&mut self) -> u64 {
        self.next_conversation += 1;
        self.conversations.insert(self.next_conversation);
        self.next_conversation
    }
}

/// The agent's answer to `session/load` of a conversation it does not have, as the real
/// agent sends it (see the README's table), and the core profile to judge it with.
pub(crate) fn unknown_session_answer(agent: Agent, requested: &str) -> RpcError {
    let rpc = |code: i64, message: String, details: Option<&str>| RpcError {
        code,
        message,
        data_details: details.map(str::to_owned),
        data_present: details.is_some(),
    };
    match agent {
        Agent::ClaudeAgentAcp => rpc(-32002, format!("Resource not found: {requested}"), None),
        Agent::ClaudeCodeAcp => rpc(-32603, "Internal error".into(), Some("Session not found")),
        Agent::CodexAcp => rpc(-32002, "Resource not found".into(), None),
        Agent::CodexAcpTs => rpc(
            -32603,
            format!("no rollout found for thread id {requested}"),
            None,
        ),
        Agent::GeminiCli => rpc(
            -32603,
            format!("Invalid session identifier \"{requested}\""),
            None,
        ),
        Agent::Goose => rpc(-32602, "Session not found".into(), None),
        Agent::Opencode => rpc(-32603, "Internal error: service failure".into(), None),
        Agent::NoLoad => rpc(-32601, "\"Method not found\": session/load".into(), None),
    }
}

/// The core profile for an agent.
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

/// A failed load as the controller reports it.
pub(crate) fn load_failure(
    agent: Agent,
    requested: &str,
    class: Option<LoadErrorClass>,
    timed_out: bool,
) -> LoadOutcome {
    let result = if timed_out {
        LoadFailure::TimedOut
    } else {
        LoadFailure::Rpc(match class {
            None | Some(LoadErrorClass::UnknownSession) => unknown_session_answer(agent, requested),
            Some(LoadErrorClass::Internal) => RpcError::new(-32603, "Internal error"),
            Some(LoadErrorClass::NotFoundSubstring) => {
                RpcError::new(-32603, "resource not found while resolving configuration")
            }
            Some(LoadErrorClass::AuthRequired) => RpcError::new(-32000, "Authentication required"),
        })
    };
    LoadOutcome {
        load_capability: Some(agent != Agent::NoLoad),
        requested_session: requested.to_owned(),
        result,
        transport: TransportState::Open,
    }
}
