//! Rule 6, load fallback: a failed `session/load` may be replaced by `session/new` only on
//! positive proof that the conversation cannot be loaded (rule 6 of `docs/design.md`; the
//! tables "Rule 6, row by row" and "Real agents' answers to an unknown session" of
//! `docs/real-agents.md`).
//!
//! Written from the table, not from `palisade-core/src/classify.rs`, and judged on what an
//! agent actually answered: the JSON-RPC error as it came over the wire, the capability it
//! advertised, what its `session/list` said, and whether its connection was still up.
//!
//! ```
//! use palisade_reference::rule6::*;
//!
//! let load = FailedLoad {
//!     agent: Agent::Generic,
//!     capability: Capability::True,
//!     requested: "sess-1",
//!     answer: Answer::Error {
//!         code: -32603,
//!         message: "resource not found while resolving configuration",
//!         details: None,
//!     },
//!     listing: Listing::Unknown,
//!     transport: Transport::Open,
//! };
//! // Words somewhere in a message prove nothing.
//! assert_eq!(judge(&load), Judgement::Keep);
//! ```

/// JSON-RPC "Method not found": the agent has no `session/load`.
const METHOD_NOT_FOUND: i64 = -32601;
/// ACP "Resource not found": the agent does not know the session.
const RESOURCE_NOT_FOUND: i64 = -32002;
/// JSON-RPC "Internal error".
const INTERNAL_ERROR: i64 = -32603;
/// ACP "Authentication required": missing credentials, not a missing conversation.
const AUTH_REQUIRED: i64 = -32000;
/// ACP "Request cancelled".
const REQUEST_CANCELLED: i64 = -32800;

/// The TypeScript ACP SDK's `RequestError.resourceNotFound(uri)` message, before the uri.
const RESOURCE_NOT_FOUND_FOR: &str = "Resource not found: ";
/// The TypeScript ACP SDK's `RequestError.methodNotFound("session/load")` message.
const LOAD_METHOD_NOT_FOUND: &str = "\"Method not found\": session/load";
/// What claude-code-acp 0.16 / claude-agent-acp 0.17–0.18 throw when no session file
/// exists, as the SDK puts it in `data.details` under −32603.
const CLAUDE_NO_SESSION: &str = "Session not found";
/// The Codex thread store's answer, before the thread id (the TypeScript codex-acp).
const CODEX_NO_ROLLOUT_FOR: &str = "no rollout found for thread id ";

/// The agent the client is configured for. Only three of them add proof to the generic
/// table; the rest are named so a configuration maps onto this one by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agent {
    /// An unknown agent: protocol codes and agent-independent messages only.
    Generic,
    /// claude-agent-acp: `data.details == "Session not found"` under −32603 (0.17–0.18).
    ClaudeAgentAcp,
    /// claude-code-acp: the same (0.16).
    ClaudeCodeAcp,
    /// codex-acp in Rust: answers −32002 itself.
    CodexAcpRust,
    /// codex-acp in TypeScript: `no rollout found for thread id <id>` under −32603.
    CodexAcpTs,
    /// gemini-cli: nothing to add.
    GeminiCli,
    /// goose: nothing to add.
    Goose,
    /// opencode: nothing to add.
    Opencode,
}

/// `agentCapabilities.loadSession` from the agent's `initialize` answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// `true`.
    True,
    /// `false`.
    False,
    /// Not there.
    Absent,
}

/// How `session/load` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer<'a> {
    /// A JSON-RPC error answer.
    Error {
        /// Its `code`.
        code: i64,
        /// Its `message`.
        message: &'a str,
        /// `data.details` when `data` is an object with a string `details`.
        details: Option<&'a str>,
    },
    /// No answer before the client's deadline.
    NoAnswer,
    /// The client itself cancelled the request.
    Cancelled,
}

/// What the agent's `session/list` said about the requested session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    /// Not asked, or no usable answer.
    Unknown,
    /// The agent lists the session: it still has it.
    Listed,
    /// The agent's list does not have it.
    NotListed,
}

/// The state of the connection to the agent when the failure was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Up.
    Open,
    /// The pipe or socket closed.
    Closed,
    /// The agent process exited.
    ProcessExited,
}

/// One failed `session/load`, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailedLoad<'a> {
    /// The agent the client is configured for.
    pub agent: Agent,
    /// What the agent advertised.
    pub capability: Capability,
    /// The session id the client asked to load.
    pub requested: &'a str,
    /// How the request ended.
    pub answer: Answer<'a>,
    /// What `session/list` said about `requested`.
    pub listing: Listing,
    /// The connection's state.
    pub transport: Transport,
}

/// What a correct client does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// Positive proof that the conversation cannot be loaded: `session/new` may replace it.
    Replace,
    /// Nothing is proven: keep the conversation, report the failure.
    Keep,
    /// The agent's connection or process is gone: start another runtime, keep the
    /// conversation.
    Respawn,
}

/// Rule 6, row by row.
#[must_use]
pub fn judge(load: &FailedLoad<'_>) -> Judgement {
    // The connection's own state decides first; no answer says whether the process lives.
    if load.transport != Transport::Open {
        return Judgement::Respawn;
    }
    // A client that cancelled starts nothing new.
    if load.answer == Answer::Cancelled {
        return Judgement::Keep;
    }
    // An agent that cannot load at all proves it by saying so.
    if load.capability != Capability::True {
        return Judgement::Replace;
    }
    let Answer::Error {
        code,
        message,
        details,
    } = load.answer
    else {
        // No answer: the agent may still be loading.
        return Judgement::Keep;
    };
    // "Not found" is proof unless the agent's own list says it has the session (an agent
    // whose helper process died early answers "not found" for a session it has).
    let not_found = |listing: Listing| {
        if listing == Listing::Listed {
            Judgement::Keep
        } else {
            Judgement::Replace
        }
    };
    if code == METHOD_NOT_FOUND {
        return Judgement::Replace;
    }
    if code == RESOURCE_NOT_FOUND {
        return not_found(load.listing);
    }
    // These codes say why the load failed, and it was not the conversation.
    if code == AUTH_REQUIRED || code == REQUEST_CANCELLED {
        return Judgement::Keep;
    }
    let names_requested = |prefix: &str, text: &str| {
        !load.requested.is_empty()
            && text
                .strip_prefix(prefix)
                .is_some_and(|rest| rest == load.requested)
    };
    if names_requested(RESOURCE_NOT_FOUND_FOR, message) {
        return not_found(load.listing);
    }
    if message == LOAD_METHOD_NOT_FOUND {
        return Judgement::Replace;
    }
    let internal = code == INTERNAL_ERROR;
    let agent_says_gone = match load.agent {
        Agent::ClaudeAgentAcp | Agent::ClaudeCodeAcp => {
            internal && details == Some(CLAUDE_NO_SESSION)
        }
        Agent::CodexAcpTs => {
            internal
                && (names_requested(CODEX_NO_ROLLOUT_FOR, message)
                    || details.is_some_and(|d| names_requested(CODEX_NO_ROLLOUT_FOR, d)))
        }
        Agent::Generic
        | Agent::CodexAcpRust
        | Agent::GeminiCli
        | Agent::Goose
        | Agent::Opencode => false,
    };
    if agent_says_gone {
        not_found(load.listing)
    } else {
        Judgement::Keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error<'a>(code: i64, message: &'a str, details: Option<&'a str>) -> FailedLoad<'a> {
        FailedLoad {
            agent: Agent::Generic,
            capability: Capability::True,
            requested: "sess-1",
            answer: Answer::Error {
                code,
                message,
                details,
            },
            listing: Listing::Unknown,
            transport: Transport::Open,
        }
    }

    #[test]
    fn the_rule6_table_rows_hold() {
        use Judgement::*;
        let rows: [(FailedLoad<'_>, Judgement); 14] = [
            (
                FailedLoad {
                    transport: Transport::Closed,
                    ..error(-32002, "x", None)
                },
                Respawn,
            ),
            (
                FailedLoad {
                    answer: Answer::Cancelled,
                    capability: Capability::Absent,
                    ..error(0, "", None)
                },
                Keep,
            ),
            (
                FailedLoad {
                    capability: Capability::False,
                    ..error(-32603, "x", None)
                },
                Replace,
            ),
            (
                FailedLoad {
                    answer: Answer::NoAnswer,
                    ..error(0, "", None)
                },
                Keep,
            ),
            (error(-32601, "Method not found", None), Replace),
            (error(-32002, "Resource not found", None), Replace),
            (error(-32000, "Resource not found: sess-1", None), Keep),
            (
                error(-32800, "\"Method not found\": session/load", None),
                Keep,
            ),
            (error(-32603, "Resource not found: sess-1", None), Replace),
            (error(-32603, "Resource not found: sess-10", None), Keep),
            (error(-32603, "Resource not found", None), Keep),
            (
                error(
                    -32603,
                    "resource not found while resolving configuration",
                    None,
                ),
                Keep,
            ),
            (
                error(1001, "Codex process has exited with code 1", None),
                Keep,
            ),
            (
                FailedLoad {
                    listing: Listing::Listed,
                    ..error(-32002, "Resource not found: sess-1", None)
                },
                Keep,
            ),
        ];
        for (load, want) in rows {
            assert_eq!(judge(&load), want, "{load:?}");
        }
    }

    #[test]
    fn profiles_only_add_their_own_projections() {
        let claude = error(-32603, "Internal error", Some("Session not found"));
        assert_eq!(judge(&claude), Judgement::Keep);
        for agent in [Agent::ClaudeAgentAcp, Agent::ClaudeCodeAcp] {
            assert_eq!(judge(&FailedLoad { agent, ..claude }), Judgement::Replace);
        }
        let codex = error(-32603, "no rollout found for thread id sess-1", None);
        assert_eq!(judge(&codex), Judgement::Keep);
        let ts = FailedLoad {
            agent: Agent::CodexAcpTs,
            ..codex
        };
        assert_eq!(judge(&ts), Judgement::Replace);
        assert_eq!(
            judge(&FailedLoad {
                requested: "SESS-1",
                ..ts
            }),
            Judgement::Keep,
            "a re-spelled id is another session"
        );
    }

    #[test]
    fn a_listed_session_is_kept_whatever_says_not_found() {
        for load in [
            error(-32002, "Resource not found", None),
            error(-32603, "Resource not found: sess-1", None),
            FailedLoad {
                agent: Agent::ClaudeAgentAcp,
                ..error(-32603, "Internal error", Some("Session not found"))
            },
        ] {
            assert_eq!(judge(&load), Judgement::Replace, "{load:?}");
            let listed = FailedLoad {
                listing: Listing::Listed,
                ..load
            };
            assert_eq!(judge(&listed), Judgement::Keep, "{load:?}");
        }
        // A missing method is not about the session: listing it changes nothing.
        let missing = FailedLoad {
            listing: Listing::Listed,
            ..error(-32601, "Method not found", None)
        };
        assert_eq!(judge(&missing), Judgement::Replace);
    }
}
