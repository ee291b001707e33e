//! The behaviour table of real ACP agents, as a sans-IO model of one agent process: lines
//! in (what the client writes to its stdin), lines out with the time to write them (its
//! stdout), and its exit. No clock, no I/O: the simulator drives it in simulated time, and
//! `palisade-test-agent` runs it on the real clock and real stdio (its options set a
//! [`Behaviour`] and, for exact test exchanges, a [`Script`]; `tests/test_agent_model.rs`
//! checks the binary writes what the model writes).
//!
//! Each behaviour is what a real agent was seen (or read in its source) to do; see the
//! table of real agents' answers in `docs/real-agents.md` and [`UnknownSession`]:
//!
//! - none of codex-acp 0.16, claude-agent-acp 0.23, claude-code-acp 0.16 exits when its
//!   stdin closes ([`Behaviour::exits_on_eof`]); the codex npm launcher runs the real agent
//!   as a child process ([`Behaviour::launcher`], acted on by the simulator's process
//!   tree);
//! - `session/new` and `session/prompt` can fail with a JSON-RPC error (−32000
//!   `Authentication required`, −32603 `Internal error` with `data.details`);
//! - claude-agent-acp 0.23 answers `−32002 Resource not found: <id>` (with `data.uri`) for
//!   an unknown session **and** for an existing one whose subprocess closed early
//!   ([`Behaviour::resume_flake_per_mille`]);
//! - unprompted `session/update`s (`available_commands_update` right after `session/new`),
//!   agent→client requests (`session/request_permission`), stderr noise, `session/list`,
//!   `loadSession` absent, `false` or `true`;
//! - TypeScript-SDK error shapes (`"Method not found": session/load` with
//!   `data: {method}`), Python-SDK agents that answer `{}` to any `session/load`.
//!
//! Every stream event a prompt produces carries a marker (`<tag>#<k>`, see
//! [`StreamedEvent`]) at the start of its text, so a checker can follow each event from the
//! agent that wrote it to the client that received it.

use std::collections::{BTreeSet, VecDeque};

use serde_json::{json, Value};

use palisade_core::classify::AgentProfile;

use palisade_wire::jsonrpc::{parse_frame, Frame, RawJson, RequestId, RpcError};

use crate::wire_text::{self, TextRng};

/// What `initialize` says about `session/load`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadCapability {
    /// `agentCapabilities.loadSession: true`.
    True,
    /// `agentCapabilities.loadSession: false`.
    False,
    /// No `loadSession` key at all.
    Absent,
}

/// How an agent answers `session/load` of a session it does not have: the real agents'
/// answers (`docs/real-agents.md`, "Real agents' answers to an unknown session").
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnknownSession {
    /// claude-agent-acp ≥ 0.20: −32002 `Resource not found: <id>`, `data: {uri: <id>}`.
    ClaudeAgentAcp,
    /// claude-code-acp 0.16 / claude-agent-acp 0.17–0.18: −32603 `Internal error`,
    /// `data.details` = `Session not found`.
    ClaudeCodeAcp,
    /// claude-agent-acp 0.19: −32603 `Internal error`, `data.details` = `Query closed
    /// before response received`.
    ClaudeAgentAcp019,
    /// codex-acp (Rust): −32002 `Resource not found`, no data.
    CodexAcp,
    /// codex-acp (TypeScript): −32603 `no rollout found for thread id <id>`.
    CodexAcpTs,
    /// gemini-cli: −32603 `Internal error`, `data.details` = `Invalid session identifier
    /// "<id>". …` (a long, machine-local text).
    Gemini,
    /// goose (older): −32602 `Invalid params`, `data` = `Failed to load session <id>: …`.
    GooseOld,
    /// goose (current): −32002 `Resource not found`, `data` = `"Session not found: <id>"`.
    Goose,
    /// opencode: −32603 `Internal error`, opaque data.
    Opencode,
    /// An agent built on the TypeScript SDK without `session/load`: −32601 `"Method not
    /// found": session/load`, `data: {method: "session/load"}`.
    TsMethodNotFound,
    /// An agent on the Rust SDK without `session/load`: −32601 `Method not found`.
    RustMethodNotFound,
    /// A Python-SDK example agent: answers `{}` to `session/load` of any id.
    PythonAnyId,
}

impl UnknownSession {
    /// Every answer, in a fixed order.
    pub const ALL: [UnknownSession; 12] = [
        UnknownSession::ClaudeAgentAcp,
        UnknownSession::ClaudeCodeAcp,
        UnknownSession::ClaudeAgentAcp019,
        UnknownSession::CodexAcp,
        UnknownSession::CodexAcpTs,
        UnknownSession::Gemini,
        UnknownSession::GooseOld,
        UnknownSession::Goose,
        UnknownSession::Opencode,
        UnknownSession::TsMethodNotFound,
        UnknownSession::RustMethodNotFound,
        UnknownSession::PythonAnyId,
    ];

    /// The catalogue entry this agent answers `session/load` of an unknown session with.
    #[must_use]
    pub const fn answer(self) -> LoadAnswer {
        match self {
            UnknownSession::ClaudeAgentAcp => LoadAnswer::ClaudeAgentAcp,
            UnknownSession::ClaudeCodeAcp => LoadAnswer::ClaudeCodeAcp,
            UnknownSession::ClaudeAgentAcp019 => LoadAnswer::ClaudeAgentAcp019,
            UnknownSession::CodexAcp => LoadAnswer::CodexAcp,
            UnknownSession::CodexAcpTs => LoadAnswer::CodexAcpTs,
            UnknownSession::Gemini => LoadAnswer::Gemini,
            UnknownSession::GooseOld => LoadAnswer::GooseOld,
            UnknownSession::Goose => LoadAnswer::Goose,
            UnknownSession::Opencode => LoadAnswer::Opencode,
            UnknownSession::TsMethodNotFound => LoadAnswer::TsMethodNotFound,
            UnknownSession::RustMethodNotFound => LoadAnswer::RustMethodNotFound,
            UnknownSession::PythonAnyId => LoadAnswer::PythonAnyId,
        }
    }

    /// The error this agent answers `session/load` of the unknown `id` with; `None` for an
    /// agent that answers success whatever the id.
    #[must_use]
    pub fn error(self, id: &str) -> Option<RpcError> {
        self.answer().error(id)
    }

    /// Whether this agent answers `session/load` at all (an SDK agent without it answers
    /// −32601 whatever the id).
    #[must_use]
    pub fn loads(self) -> bool {
        !matches!(
            self,
            UnknownSession::TsMethodNotFound | UnknownSession::RustMethodNotFound
        )
    }
}

/// Whether an answer to `session/load` is *positive proof* (rule 6, `docs/design.md`) that
/// the conversation cannot be loaded, as the tables of `docs/real-agents.md` say ("Real
/// agents' answers to an unknown session", "Rule 6, row by row"). Data, not a classifier: a checker reads the
/// label of the answer the environment gave, and shares no code with `palisade_core`'s
/// `classify`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    /// Proof under every profile (a protocol code, or a projection every profile knows).
    Always,
    /// Proof under these profiles only (a projection only their agents' source documents).
    Under(&'static [AgentProfile]),
    /// Never proof: the failure is propagated and the conversation kept.
    Never,
}

impl Proof {
    /// Whether the answer proves the conversation gone to a core configured with `profile`.
    #[must_use]
    pub fn holds(self, profile: AgentProfile) -> bool {
        match self {
            Proof::Always => true,
            Proof::Under(profiles) => profiles.contains(&profile),
            Proof::Never => false,
        }
    }
}

/// The table of `docs/real-agents.md` a catalogue entry's verdict comes from (the type
/// keeps the name it had when the tables were in the README).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadmeTable {
    /// "Real agents' answers to an unknown session" (first cell: the agent).
    Agents,
    /// "Rule 6, row by row" (first cell: the input).
    Rows,
}

/// Every answer a simulated agent may give to `session/load`: the real agents' answers to
/// an unknown session (one per row of the agents' table), the real transient failures of
/// a load of a session the agent has, and adversarial near-misses of the proofs (another
/// resource's id, a re-spelled id, the right words under the wrong code, long `data`).
/// Each entry carries its rule-6 label ([`LoadAnswer::proof`]) and the table row that
/// gives it ([`LoadAnswer::readme`]); a test pins the two against `docs/real-agents.md`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum LoadAnswer {
    // ----- real agents, unknown session ------------------------------------------------
    /// claude-agent-acp ≥ 0.20: −32002 `Resource not found: <id>`, `data: {uri: <id>}`.
    /// Also its answer for a session it has whose Claude subprocess closed early (0.23).
    ClaudeAgentAcp,
    /// claude-agent-acp 0.19: −32603 `Internal error`, `data.details` = `Query closed
    /// before response received`.
    ClaudeAgentAcp019,
    /// claude-code-acp 0.16 / claude-agent-acp 0.17–0.18: −32603 `Internal error`,
    /// `data.details` = `Session not found`.
    ClaudeCodeAcp,
    /// codex-acp (Rust): −32002 `Resource not found`, no data.
    CodexAcp,
    /// codex-acp (TypeScript): −32603 `no rollout found for thread id <id>`.
    CodexAcpTs,
    /// codex-acp (TypeScript) through an SDK that puts the rethrown text in
    /// `data.details`: −32603 `Internal error`, `data.details` = `no rollout found for
    /// thread id <id>`.
    CodexAcpTsDetails,
    /// codex-acp (TypeScript) whose Codex child died: code 1001 `Codex process has exited
    /// with code 1`.
    CodexAcpTsExited,
    /// gemini-cli: −32603 `Internal error`, `data.details` = `Invalid session identifier
    /// "<id>". …` (a long, machine-local text).
    Gemini,
    /// goose (older): −32602 `Invalid params`, `data` = `Failed to load session <id>: …`.
    GooseOld,
    /// goose (current): −32002 `Resource not found`, `data` = `"Session not found: <id>"`.
    Goose,
    /// opencode: −32603 `Internal error`, opaque data.
    Opencode,
    /// An agent on the TypeScript SDK without `session/load`: −32601 `"Method not
    /// found": session/load`, `data: {method: "session/load"}`.
    TsMethodNotFound,
    /// An agent on the Rust SDK without `session/load`: −32601 `Method not found`.
    RustMethodNotFound,
    /// An agent on the Python SDK without `load_session`: −32601 `Method not found`,
    /// `data: {method: "session/load"}`.
    PythonMethodNotFound,
    /// A Python-SDK example agent: answers `{}` to `session/load` of any id.
    PythonAnyId,
    // ----- real transient failures of a load of a session the agent has ---------------
    /// −32603 `Internal error`, no data (an I/O error during the lookup).
    InternalError,
    /// −32000 `Authentication required` (an auth check before the lookup).
    AuthRequired,
    /// −32800 `Request cancelled`.
    RequestCancelled,
    /// −32603 `resource not found while resolving configuration`: "not found" about
    /// something else.
    NotFoundSubstring,
    // ----- near-misses ------------------------------------------------------------------
    /// Another resource's id under a non-proof code: −32603 `Resource not found:
    /// file:///work/.env` (a file the agent failed to read through the client).
    OtherResourceInternal,
    /// Another resource's id under −32002, `data: {uri}`: the code is proof, whatever it
    /// names.
    OtherResourceCode,
    /// The requested id re-spelled (upper case) in the projection's words: −32603
    /// `Resource not found: <ID>`.
    RespelledId,
    /// codex-acp (TypeScript)'s text with the id re-spelled: −32603 `no rollout found for
    /// thread id <ID>`.
    RespelledCodexId,
    /// The right words under the auth code, which outweighs them: −32000 `Resource not
    /// found: <id>`.
    WordsUnderAuth,
    /// The right words under the cancellation code, which outweighs them: −32800
    /// `"Method not found": session/load`.
    WordsUnderCancelled,
    /// The exact projection under a code of its own: −32603 `Resource not found: <id>`
    /// (proof by its words).
    ExactWordsUnderInternal,
    /// The exact method projection under −32602: `"Method not found": session/load` (proof
    /// by its words).
    MethodWordsUnderInvalidParams,
    /// Bare `Method not found` under −32603 (it may be another method).
    BareMethodNotFound,
    /// Bare `Resource not found` under −32603 (it may be another resource).
    BareResourceNotFound,
    /// Claude's `Session not found` details under −32602 (the projection needs −32603).
    ClaudeWordsWrongCode,
    /// −32603 `Internal error` whose `data.details` starts with `Session not found` and
    /// goes on with a 64 KiB stack trace (not the exact text).
    LongDetails,
    /// −32002 `Resource not found` with 64 KiB of `data.details` (the code is proof).
    LongDataProof,
}

/// Bytes of the long `data` of [`LoadAnswer::LongDetails`] and
/// [`LoadAnswer::LongDataProof`]: far past any message a projection compares, well under
/// the connection's line limit.
pub const LONG_DATA_BYTES: usize = 64 * 1024;

const CLAUDE_PROFILES: &[AgentProfile] =
    &[AgentProfile::ClaudeAgentAcp, AgentProfile::ClaudeCodeAcp];
const CODEX_TS_PROFILES: &[AgentProfile] = &[AgentProfile::CodexAcpTs];

impl LoadAnswer {
    /// Every entry, in a fixed order.
    pub const ALL: [LoadAnswer; 32] = [
        LoadAnswer::ClaudeAgentAcp,
        LoadAnswer::ClaudeAgentAcp019,
        LoadAnswer::ClaudeCodeAcp,
        LoadAnswer::CodexAcp,
        LoadAnswer::CodexAcpTs,
        LoadAnswer::CodexAcpTsDetails,
        LoadAnswer::CodexAcpTsExited,
        LoadAnswer::Gemini,
        LoadAnswer::GooseOld,
        LoadAnswer::Goose,
        LoadAnswer::Opencode,
        LoadAnswer::TsMethodNotFound,
        LoadAnswer::RustMethodNotFound,
        LoadAnswer::PythonMethodNotFound,
        LoadAnswer::PythonAnyId,
        LoadAnswer::InternalError,
        LoadAnswer::AuthRequired,
        LoadAnswer::RequestCancelled,
        LoadAnswer::NotFoundSubstring,
        LoadAnswer::OtherResourceInternal,
        LoadAnswer::OtherResourceCode,
        LoadAnswer::RespelledId,
        LoadAnswer::RespelledCodexId,
        LoadAnswer::WordsUnderAuth,
        LoadAnswer::WordsUnderCancelled,
        LoadAnswer::ExactWordsUnderInternal,
        LoadAnswer::MethodWordsUnderInvalidParams,
        LoadAnswer::BareMethodNotFound,
        LoadAnswer::BareResourceNotFound,
        LoadAnswer::ClaudeWordsWrongCode,
        LoadAnswer::LongDetails,
        LoadAnswer::LongDataProof,
    ];

    /// The entries a load of a session the agent *has* may fail with: the real transient
    /// failures and every near-miss (a real agent's unknown-session answer given for a
    /// session it has would be the agent lying, which only claude-agent-acp 0.23 does).
    pub fn for_existing_session() -> impl Iterator<Item = LoadAnswer> {
        LoadAnswer::ALL
            .into_iter()
            .filter(|a| a.near_miss() || a.transient())
    }

    /// Whether it is a real transient failure of a load of a session the agent has.
    #[must_use]
    pub const fn transient(self) -> bool {
        matches!(
            self,
            LoadAnswer::InternalError
                | LoadAnswer::AuthRequired
                | LoadAnswer::RequestCancelled
                | LoadAnswer::NotFoundSubstring
        )
    }

    /// Whether it is an adversarial near-miss of a proof (not a real agent's answer).
    #[must_use]
    pub const fn near_miss(self) -> bool {
        matches!(
            self,
            LoadAnswer::OtherResourceInternal
                | LoadAnswer::OtherResourceCode
                | LoadAnswer::RespelledId
                | LoadAnswer::RespelledCodexId
                | LoadAnswer::WordsUnderAuth
                | LoadAnswer::WordsUnderCancelled
                | LoadAnswer::ExactWordsUnderInternal
                | LoadAnswer::MethodWordsUnderInvalidParams
                | LoadAnswer::BareMethodNotFound
                | LoadAnswer::BareResourceNotFound
                | LoadAnswer::ClaudeWordsWrongCode
                | LoadAnswer::LongDetails
                | LoadAnswer::LongDataProof
        )
    }

    /// The error this answer is for `session/load` of `id`; `None` for an answer of
    /// success.
    #[must_use]
    pub fn error(self, id: &str) -> Option<RpcError> {
        let internal = |details: String| {
            RpcError::new(-32603, "Internal error").with_data(json!({ "details": details }))
        };
        let upper = id.to_ascii_uppercase();
        Some(match self {
            LoadAnswer::ClaudeAgentAcp => {
                RpcError::new(-32002, format!("Resource not found: {id}"))
                    .with_data(json!({ "uri": id }))
            }
            LoadAnswer::ClaudeAgentAcp019 => {
                internal("Query closed before response received".into())
            }
            LoadAnswer::ClaudeCodeAcp => internal("Session not found".into()),
            LoadAnswer::CodexAcp => RpcError::new(-32002, "Resource not found"),
            LoadAnswer::CodexAcpTs => {
                RpcError::new(-32603, format!("no rollout found for thread id {id}"))
            }
            LoadAnswer::CodexAcpTsDetails => {
                internal(format!("no rollout found for thread id {id}"))
            }
            LoadAnswer::CodexAcpTsExited => RpcError::new(
                1001,
                "Codex process has exited with code 1. Check the logs for details.",
            ),
            LoadAnswer::Gemini => internal(format!(
                "Invalid session identifier \"{id}\".\n  Searched for sessions in \
                 /home/user/.gemini/tmp/0f3c/chats.\n  Use --list-sessions to see \
                 available sessions."
            )),
            LoadAnswer::GooseOld => RpcError::new(-32602, "Invalid params").with_data(json!(
                format!("Failed to load session {id}: record not found in sessions.db")
            )),
            LoadAnswer::Goose => RpcError::new(-32002, "Resource not found")
                .with_data(json!(format!("Session not found: {id}"))),
            LoadAnswer::Opencode => {
                RpcError::new(-32603, "Internal error").with_data(json!({"status": 404}))
            }
            LoadAnswer::TsMethodNotFound => {
                RpcError::new(-32601, "\"Method not found\": session/load")
                    .with_data(json!({"method": "session/load"}))
            }
            LoadAnswer::RustMethodNotFound => RpcError::new(-32601, "Method not found"),
            LoadAnswer::PythonMethodNotFound => RpcError::new(-32601, "Method not found")
                .with_data(json!({"method": "session/load"})),
            LoadAnswer::PythonAnyId => return None,
            LoadAnswer::InternalError => RpcError::new(-32603, "Internal error"),
            LoadAnswer::AuthRequired => RpcError::new(-32000, "Authentication required"),
            LoadAnswer::RequestCancelled => RpcError::new(-32800, "Request cancelled"),
            LoadAnswer::NotFoundSubstring => {
                RpcError::new(-32603, "resource not found while resolving configuration")
            }
            LoadAnswer::OtherResourceInternal => {
                RpcError::new(-32603, "Resource not found: file:///work/.env")
            }
            LoadAnswer::OtherResourceCode => {
                RpcError::new(-32002, "Resource not found: file:///work/.env")
                    .with_data(json!({ "uri": "file:///work/.env" }))
            }
            LoadAnswer::RespelledId => {
                RpcError::new(-32603, format!("Resource not found: {upper}"))
            }
            LoadAnswer::RespelledCodexId => {
                RpcError::new(-32603, format!("no rollout found for thread id {upper}"))
            }
            LoadAnswer::WordsUnderAuth => {
                RpcError::new(-32000, format!("Resource not found: {id}"))
            }
            LoadAnswer::WordsUnderCancelled => {
                RpcError::new(-32800, "\"Method not found\": session/load")
            }
            LoadAnswer::ExactWordsUnderInternal => {
                RpcError::new(-32603, format!("Resource not found: {id}"))
            }
            LoadAnswer::MethodWordsUnderInvalidParams => {
                RpcError::new(-32602, "\"Method not found\": session/load")
            }
            LoadAnswer::BareMethodNotFound => RpcError::new(-32603, "Method not found"),
            LoadAnswer::BareResourceNotFound => RpcError::new(-32603, "Resource not found"),
            LoadAnswer::ClaudeWordsWrongCode => RpcError::new(-32602, "Invalid params")
                .with_data(json!({"details": "Session not found"})),
            LoadAnswer::LongDetails => {
                internal(format!("Session not found\n{}", long_text(LONG_DATA_BYTES)))
            }
            LoadAnswer::LongDataProof => RpcError::new(-32002, "Resource not found")
                .with_data(json!({ "details": long_text(LONG_DATA_BYTES) })),
        })
    }

    /// Whether it proves the conversation gone, and under which profiles: the verdict of
    /// its row in `docs/real-agents.md` ([`LoadAnswer::readme`]).
    #[must_use]
    pub const fn proof(self) -> Proof {
        match self {
            LoadAnswer::ClaudeAgentAcp
            | LoadAnswer::CodexAcp
            | LoadAnswer::Goose
            | LoadAnswer::TsMethodNotFound
            | LoadAnswer::RustMethodNotFound
            | LoadAnswer::PythonMethodNotFound
            | LoadAnswer::OtherResourceCode
            | LoadAnswer::ExactWordsUnderInternal
            | LoadAnswer::MethodWordsUnderInvalidParams
            | LoadAnswer::LongDataProof => Proof::Always,
            LoadAnswer::ClaudeCodeAcp => Proof::Under(CLAUDE_PROFILES),
            LoadAnswer::CodexAcpTs | LoadAnswer::CodexAcpTsDetails => {
                Proof::Under(CODEX_TS_PROFILES)
            }
            LoadAnswer::ClaudeAgentAcp019
            | LoadAnswer::CodexAcpTsExited
            | LoadAnswer::Gemini
            | LoadAnswer::GooseOld
            | LoadAnswer::Opencode
            | LoadAnswer::PythonAnyId
            | LoadAnswer::InternalError
            | LoadAnswer::AuthRequired
            | LoadAnswer::RequestCancelled
            | LoadAnswer::NotFoundSubstring
            | LoadAnswer::OtherResourceInternal
            | LoadAnswer::RespelledId
            | LoadAnswer::RespelledCodexId
            | LoadAnswer::WordsUnderAuth
            | LoadAnswer::WordsUnderCancelled
            | LoadAnswer::BareMethodNotFound
            | LoadAnswer::BareResourceNotFound
            | LoadAnswer::ClaudeWordsWrongCode
            | LoadAnswer::LongDetails => Proof::Never,
        }
    }

    /// The row of `docs/real-agents.md` that decides it: the table, the start of the
    /// row's first cell, and a phrase of the row's verdict cell.
    #[must_use]
    pub const fn readme(self) -> (ReadmeTable, &'static str, &'static str) {
        use ReadmeTable::{Agents, Rows};
        const INCONCLUSIVE_ROW: &str =
            "\u{2212}32603 / \u{2212}32602 / \u{2212}32600 / any other code";
        match self {
            LoadAnswer::ClaudeAgentAcp => (Agents, "claude-agent-acp \u{2265} 0.20", "**Incompatible** (`ResourceNotFound`), every profile"),
            LoadAnswer::ClaudeAgentAcp019 => (Agents, "claude-agent-acp 0.19.x", "**Inconclusive** (`InternalError`)"),
            LoadAnswer::ClaudeCodeAcp => (Agents, "claude-code-acp 0.16.x", "**Incompatible** (`ExactProjection(ClaudeSessionNotFound)`) with `ClaudeCodeAcp` / `ClaudeAgentAcp` profiles; **Inconclusive** with every other profile"),
            LoadAnswer::CodexAcp => (Agents, "codex-acp (Rust;", "**Incompatible** (`ResourceNotFound`), every profile"),
            LoadAnswer::CodexAcpTs | LoadAnswer::CodexAcpTsDetails => (Agents, "codex-acp (TypeScript, over", "**Incompatible** (`ExactProjection(CodexNoRolloutForSession)`) with the `CodexAcpTs` profile, only when the text equals `no rollout found for thread id ` + the requested session byte for byte, in `message` or `data.details`; otherwise **Inconclusive**"),
            LoadAnswer::CodexAcpTsExited => (Agents, "codex-acp (TypeScript), Codex child died", "**Inconclusive** (`UnknownCode(1001)`)"),
            LoadAnswer::Gemini => (Agents, "gemini-cli", "**Inconclusive** (`InternalError`), every profile"),
            LoadAnswer::GooseOld => (Agents, "goose (older", "**Inconclusive** (`InvalidParams`)"),
            LoadAnswer::Goose => (Agents, "goose (current)", "**Incompatible** (`ResourceNotFound`), every profile"),
            LoadAnswer::Opencode => (Agents, "opencode", "**Inconclusive** (`InternalError`)"),
            LoadAnswer::TsMethodNotFound => (Agents, "TS SDK example agent", "**Incompatible** (`CapabilityFalse`; `MethodNotFound` if called)"),
            LoadAnswer::RustMethodNotFound | LoadAnswer::PythonMethodNotFound => (Agents, "an agent on the TS or Rust SDK", "**Incompatible** (`MethodNotFound` or `CapabilityAbsent`)"),
            LoadAnswer::PythonAnyId => (Agents, "an agent on the Python SDK whose", "none: the load \"succeeded\""),
            LoadAnswer::InternalError | LoadAnswer::ClaudeWordsWrongCode | LoadAnswer::RespelledId | LoadAnswer::LongDetails => (Rows, INCONCLUSIVE_ROW, "Inconclusive"),
            LoadAnswer::AuthRequired | LoadAnswer::RequestCancelled | LoadAnswer::WordsUnderAuth | LoadAnswer::WordsUnderCancelled => (Rows, "\u{2212}32000 auth required / \u{2212}32800 request cancelled", "Inconclusive"),
            LoadAnswer::NotFoundSubstring => (Rows, "\"\u{2026}not found\u{2026}\" anywhere else", "Inconclusive"),
            LoadAnswer::OtherResourceInternal | LoadAnswer::BareMethodNotFound | LoadAnswer::BareResourceNotFound => (Rows, "bare `Resource not found` / `Method not found` under another code", "Inconclusive"),
            LoadAnswer::OtherResourceCode | LoadAnswer::LongDataProof => (Rows, "\u{2212}32601 / \u{2212}32002", "Incompatible"),
            LoadAnswer::ExactWordsUnderInternal => (Rows, "message == `Resource not found: ` + requested session", "Incompatible"),
            LoadAnswer::MethodWordsUnderInvalidParams => (Rows, "message == `\"Method not found\": session/load`", "Incompatible"),
            LoadAnswer::RespelledCodexId => (Agents, "codex-acp (TypeScript, over", "otherwise **Inconclusive**"),
        }
    }
}

/// ASCII text of `bytes` bytes (a stack trace's worth of filler).
fn long_text(bytes: usize) -> String {
    const LINE: &str =
        "    at Object.loadSession (/usr/lib/node_modules/agent/dist/acp-agent.js:412:19)\n";
    let mut text = LINE.repeat(bytes / LINE.len() + 1);
    text.truncate(bytes);
    text
}

/// A JSON-RPC error a request can be failed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RequestFailure {
    /// −32000 `Authentication required` (claude-agent-acp without credentials).
    AuthRequired,
    /// −32603 `Internal error` with `data.details` (codex-acp).
    Internal,
}

impl RequestFailure {
    /// The error as the agent writes it.
    #[must_use]
    pub fn error(self) -> RpcError {
        match self {
            RequestFailure::AuthRequired => RpcError::new(-32000, "Authentication required"),
            RequestFailure::Internal => RpcError::new(-32603, "Internal error")
                .with_data(json!({"details": "stream disconnected before completion"})),
        }
    }
}

/// How one agent process behaves. The simulator draws one per process; everything is
/// plain data so a failure file can carry it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Behaviour {
    /// `agentCapabilities.loadSession`.
    pub load_capability: LoadCapability,
    /// How `session/load` of an unknown session is answered.
    pub unknown_session: UnknownSession,
    /// Per mille of loads of an *existing* session answered as unknown
    /// (claude-agent-acp 0.23 when its Claude subprocess closes before the first answer).
    pub resume_flake_per_mille: u16,
    /// Whether it advertises and answers `session/list`.
    pub lists_sessions: bool,
    /// Whether it exits when its stdin closes (none of the real agents tested does).
    pub exits_on_eof: bool,
    /// Whether it runs the real agent as a child process (the codex npm launcher).
    pub launcher: bool,
    /// An `available_commands_update` right after `session/new`, unprompted.
    pub unprompted_updates: bool,
    /// A `session/request_permission` in the middle of each prompt.
    pub asks_permission: bool,
    /// Lines of noise on stderr at start.
    pub stderr_noise: bool,
    /// `session/new` fails with this error.
    pub new_fails: Option<RequestFailure>,
    /// Per mille of prompts failed with [`Behaviour::prompt_failure`].
    pub prompt_fail_per_mille: u16,
    /// The error a failed prompt gets.
    pub prompt_failure: RequestFailure,
    /// Milliseconds before answering `initialize`, `session/new`, `session/load`.
    pub answer_delay_ms: (u64, u64),
    /// Stream events per prompt (inclusive range).
    pub events_per_prompt: (u32, u32),
    /// Text bytes per event (inclusive range); tool calls carry this much raw input.
    pub event_bytes: (u32, u32),
    /// When set, every event's line is exactly this many bytes on the wire (inclusive
    /// range; newline included, at least the line's envelope), in place of
    /// [`Behaviour::event_bytes`]: a simulator sizes events at a coalescer's byte cap.
    pub event_wire_bytes: Option<(u32, u32)>,
    /// Per mille of events that are tool calls (large `rawInput`) rather than text.
    pub tool_call_per_mille: u16,
    /// Per mille of events that are resource blocks (the payload in the resource's
    /// `text`) rather than text.
    pub resource_per_mille: u16,
    /// Milliseconds a prompt takes from its first event to its answer (inclusive range).
    pub think_ms: (u64, u64),
    /// Per mille of prompts that go silent after their first event: nothing more is
    /// written, no answer comes, and `session/cancel` is ignored (a wedged agent, for the
    /// idle rule). Drawn only when non-zero, so other behaviours draw as before.
    pub silent_per_mille: u16,
    /// Per mille of prompts that stay mute before their first event: the agent read the
    /// prompt and writes nothing for it until a `session/cancel`, which it answers
    /// `cancelled` as ACP asks (a model that has produced no token yet, a tool waiting on
    /// something). Drawn only when non-zero, so other behaviours draw as before.
    pub mute_per_mille: u16,
    /// It answers `initialize` with one auth method ([`AUTH_METHOD`]) and refuses every
    /// session request (`session/new`, `/load`, `/list`, `/prompt`, `/set_mode`) with
    /// −32000 `Authentication required` until that process got `authenticate` of it:
    /// authentication per process, as gemini-cli's `authenticate` sets the process's auth
    /// type. A client's authentication must reach every process that serves it.
    pub auth_required: bool,
}

/// The one auth method an agent with [`Behaviour::auth_required`] offers.
pub const AUTH_METHOD: &str = "agent-token";

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            load_capability: LoadCapability::True,
            unknown_session: UnknownSession::ClaudeAgentAcp,
            resume_flake_per_mille: 0,
            lists_sessions: false,
            exits_on_eof: true,
            launcher: false,
            unprompted_updates: false,
            asks_permission: false,
            stderr_noise: false,
            new_fails: None,
            prompt_fail_per_mille: 0,
            prompt_failure: RequestFailure::Internal,
            answer_delay_ms: (1, 5),
            events_per_prompt: (1, 8),
            event_bytes: (16, 256),
            event_wire_bytes: None,
            tool_call_per_mille: 100,
            resource_per_mille: 0,
            think_ms: (5, 100),
            silent_per_mille: 0,
            mute_per_mille: 0,
            auth_required: false,
        }
    }
}

/// Where the agent keeps its conversations: its disk, shared by every process of it (a
/// conversation one process created can be loaded by the next).
pub trait ConversationStore {
    /// Whether the conversation exists.
    fn exists(&self, id: &str) -> bool;
    /// Creates a conversation; its id.
    fn create(&mut self) -> String;
    /// Every conversation, in a stable order.
    fn list(&self) -> Vec<String>;
}

/// An in-memory [`ConversationStore`] with ids `sess-1`, `sess-2`, ….
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    ids: BTreeSet<u64>,
    next: u64,
    /// Conversations that were lost (deleted behind the agent's back).
    pub lost: BTreeSet<u64>,
}

impl MemoryStore {
    /// Loses the conversation `id` (the provider's disk lost it).
    pub fn lose(&mut self, id: &str) {
        if let Some(n) = id.strip_prefix("sess-").and_then(|n| n.parse().ok()) {
            if self.ids.remove(&n) {
                self.lost.insert(n);
            }
        }
    }
}

impl ConversationStore for MemoryStore {
    fn exists(&self, id: &str) -> bool {
        id.strip_prefix("sess-")
            .and_then(|n| n.parse().ok())
            .is_some_and(|n: u64| self.ids.contains(&n))
    }

    fn create(&mut self) -> String {
        self.next += 1;
        self.ids.insert(self.next);
        format!("sess-{}", self.next)
    }

    fn list(&self) -> Vec<String> {
        self.ids.iter().map(|n| format!("sess-{n}")).collect()
    }
}

/// How the next `session/load` goes, whatever the conversation (a fault the simulator
/// injects on one agent process).
#[derive(Debug, Clone, PartialEq)]
pub enum NextLoad {
    /// Answered with this catalogue entry (for the conversation asked for).
    Answer(LoadAnswer),
    /// Never answered (the client's deadline decides).
    Hang,
}

/// One stream event a prompt produced, as the agent wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamedEvent {
    /// The marker at the start of its text: `<tag>#<k>`.
    pub marker: String,
    /// 1-based index within its prompt.
    pub index: u32,
    /// Bytes of the whole line as written (newline included).
    pub wire_bytes: usize,
    /// Whether it is a tool call (else a text chunk).
    pub tool_call: bool,
    /// The CRC-32 of the update's JSON text exactly as written: a reader that hands it on
    /// untouched hands on these bytes.
    pub raw_crc: u32,
    /// The text the agent meant, as [`StreamedEvent::digest`] needs it.
    pub text: EventText,
    /// A tool call's `rawInput.args`: which of [`wire_text::pool`]'s, written compactly.
    pub args: Option<u16>,
}

/// The text of a stream event, as the agent meant it (kept in parts: a checker needs it
/// only when the bytes a client got differ from the ones written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventText {
    /// The marker, a space, `fill` bytes of ASCII filler, then `extra` (drawn text).
    Drawn {
        /// Filler bytes.
        fill: usize,
        /// What real agents write, at the end of the text: which of
        /// [`wire_text::pool`]'s texts, if any.
        extra: Option<u16>,
    },
    /// This text, whole.
    Plain(String),
}

impl StreamedEvent {
    /// Its content as the agent meant it ([`wire_text::content_digest`] of its text and
    /// of a tool call's `rawInput.args`): what a reader must decode from the line.
    #[must_use]
    pub fn digest(&self) -> u64 {
        let pool = wire_text::pool();
        let args = self.args.map(|i| pool.args[usize::from(i)].as_str());
        match &self.text {
            EventText::Drawn { fill, extra } => {
                let extra = extra.map_or("", |i| pool.texts[usize::from(i)].1.as_str());
                wire_text::content_digest_of(&[&self.marker, " ", filler(*fill), extra], args)
            }
            EventText::Plain(text) => wire_text::content_digest(text, args),
        }
    }

    /// Whether `update` (the update's JSON text as a reader handed it on) is what the
    /// agent wrote: the same bytes, or (written again by a reader that decoded it) the
    /// same content once decoded.
    #[must_use]
    pub fn delivered_as_written(&self, update: &str) -> bool {
        wire_text::raw_crc(update) == self.raw_crc
            || wire_text::update_digest_raw(update) == Some(self.digest())
    }
}

/// What the agent did, for the checker: every request it received and what it answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    /// `initialize`, answered naming the agent with this `agentInfo`.
    Initialize {
        /// The `agentInfo` it answered with.
        agent_info: Value,
    },
    /// `session/new`; the conversation it created, or the error.
    New(Result<String, RpcError>),
    /// `session/load` of `id`; `Ok` if loaded.
    Load {
        /// The conversation asked for.
        id: String,
        /// Whether it existed.
        existed: bool,
        /// The answer.
        answer: Result<(), RpcError>,
        /// The catalogue entry the answer came from; `None` for a plain success (or no
        /// answer at all).
        kind: Option<LoadAnswer>,
    },
    /// `session/list`.
    List,
    /// `session/prompt`: its tag (the markers' prefix), the conversation and the text.
    Prompt {
        /// The prompt's tag.
        tag: String,
        /// The conversation.
        session: String,
        /// The prompt's text, as received.
        text: String,
    },
    /// `session/set_mode` of the conversation (answered with an empty result).
    SetMode {
        /// The conversation.
        session: String,
        /// The `modeId` asked for.
        mode: String,
    },
    /// `session/cancel` for the conversation.
    Cancel {
        /// The conversation.
        session: String,
    },
    /// A stream event written during the prompt `tag`.
    Event {
        /// The prompt's tag.
        tag: String,
        /// The event.
        event: StreamedEvent,
    },
    /// The prompt `tag` was answered.
    PromptAnswered {
        /// The prompt's tag.
        tag: String,
        /// `Ok(stopReason)` or the error.
        answer: Result<String, RpcError>,
    },
    /// `authenticate`; whether it named the agent's method (and so was answered with
    /// success).
    Authenticate {
        /// It named [`AUTH_METHOD`].
        ok: bool,
    },
    /// A session request refused with `Authentication required`: the process was never
    /// authenticated ([`Behaviour::auth_required`]).
    Unauthenticated {
        /// The request's method.
        method: String,
    },
    /// A line it could not use (garbage, an unknown method).
    Unusable,
}

/// Something the agent does at a time.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// Writes this line (newline included) to stdout.
    Line(String),
    /// Writes this line to stderr.
    Stderr(String),
    /// Exits with this code.
    Exit(i32),
}

#[derive(Debug, Clone)]
struct Prompting {
    id: RequestId,
    session: String,
    tag: String,
    total: u32,
    sent: u32,
    think_ms: u64,
    cancelled: bool,
    asked: bool,
    /// Goes silent after its first event ([`Behaviour::silent_per_mille`],
    /// [`Script::silent_on_new`]).
    silent: bool,
    /// Writes nothing until a `session/cancel` ([`Behaviour::mute_per_mille`]).
    mute: bool,
}

/// How a scripted prompt ends once its chunks are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptEnd {
    /// Answered `end_turn` (or `cancelled` if a `session/cancel` came first).
    #[default]
    Answer,
    /// Never answered, and `session/cancel` is ignored (a hung agent).
    Hang,
    /// Answered `cancelled` when the `session/cancel` comes, never before.
    Hold,
}

/// Plain, counted prompt output in place of drawn, marked events: exactly `count` text
/// chunks `chunk <i>` (0-based), each padded with `.` to `bytes`, `delay_ms` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlainChunks {
    /// Chunks per prompt.
    pub count: u32,
    /// Minimum text bytes of a chunk.
    pub bytes: usize,
    /// Milliseconds before each chunk.
    pub delay_ms: u64,
}

/// Exact, scripted knobs for an agent a test drives (`palisade-test-agent`'s options that
/// are no [`Behaviour`] of a real agent). The default changes nothing: the simulator's
/// agents run with it, and draw exactly what they drew before it existed.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Script {
    /// `agentCapabilities.loadSession` is the string `"yes"`, whatever
    /// [`Behaviour::load_capability`] says (a malformed capability).
    pub malformed_load_capability: bool,
    /// Milliseconds before answering `session/load`, in place of
    /// [`Behaviour::answer_delay_ms`].
    pub load_delay_ms: Option<u64>,
    /// History chunks (`history <i>`, user and agent in turn) streamed before a successful
    /// `session/load` answer.
    pub load_replay: u32,
    /// Plain, counted prompt output in place of drawn, marked events.
    pub chunks: Option<PlainChunks>,
    /// Exits with [`Script::exit_code`] mid-prompt, after this many chunks.
    pub exit_after_chunks: Option<u32>,
    /// The code of an [`Script::exit_after_chunks`] exit.
    pub exit_code: i32,
    /// Exits with code 0 right after answering this many prompts (an agent that goes away
    /// between turns).
    pub exit_after_prompts: Option<u64>,
    /// How a prompt ends once its chunks are written.
    pub prompt_end: PromptEnd,
    /// The `protocolVersion` `initialize` answers with, in place of
    /// [`palisade_wire::acp::PROTOCOL_VERSION`] (an agent that speaks another version).
    pub protocol_version: Option<u16>,
    /// Prompts on a conversation this process created with `session/new` go silent after
    /// their first chunk (as [`Behaviour::silent_per_mille`]); on a conversation it loaded
    /// they run as scripted. A wedged first runtime whose recovery (which loads) works.
    pub silent_on_new: bool,
    /// From this process's prompt number (1-based) on, prompts stay mute (as
    /// [`Behaviour::mute_per_mille`]): nothing is written for them until `session/cancel`.
    pub mute_from_prompt: Option<u64>,
}

/// A [`ConversationStore`] for an agent a test drives: `session/new` creates
/// `test-session-<n>` (or always the same fixed id), and `session/load` finds every id
/// (`holds_every_id`, a test agent resumes anything) or only the ones it created (so every
/// other load gets [`Behaviour::unknown_session`]'s answer).
#[derive(Debug, Clone, Default)]
pub struct ScriptStore {
    /// Whether every id exists.
    pub holds_every_id: bool,
    /// The id every `session/new` returns, if fixed.
    pub fixed_id: Option<String>,
    created: Vec<String>,
}

impl ScriptStore {
    /// A store that finds every id (`holds_every_id`) or only its own, and creates
    /// `fixed_id` (if given) or `test-session-<n>`.
    #[must_use]
    pub fn new(holds_every_id: bool, fixed_id: Option<String>) -> ScriptStore {
        ScriptStore {
            holds_every_id,
            fixed_id,
            created: Vec::new(),
        }
    }
}

impl ConversationStore for ScriptStore {
    fn exists(&self, id: &str) -> bool {
        self.holds_every_id || self.created.iter().any(|c| c == id)
    }

    fn create(&mut self) -> String {
        let id = self
            .fixed_id
            .clone()
            .unwrap_or_else(|| format!("test-session-{}", self.created.len() + 1));
        self.created.push(id.clone());
        id
    }

    fn list(&self) -> Vec<String> {
        let mut ids = self.created.clone();
        ids.dedup();
        ids
    }
}

/// One agent process's behaviour. Feed it with [`AgentModel::on_line`],
/// [`AgentModel::on_stdin_closed`] and [`AgentModel::on_wake`]; drain
/// [`AgentModel::poll_out`] (lines to write, in order, with their times) and
/// [`AgentModel::poll_seen`]; call [`AgentModel::on_wake`] at [`AgentModel::next_wake`].
#[derive(Debug)]
pub struct AgentModel {
    behaviour: Behaviour,
    rng: u64,
    name: String,
    /// Conversations this process holds (created or loaded).
    held: BTreeSet<String>,
    prompt: Option<Prompting>,
    prompts: u64,
    /// Conversations this process created (kept only for [`Script::silent_on_new`]).
    created: Vec<String>,
    next_load: Option<NextLoad>,
    burst: Option<u32>,
    events_cap: Option<u32>,
    /// Everything to do, by time; times never decrease (one stdout, written in order).
    out: VecDeque<(u64, Out, Option<Seen>)>,
    seen: Vec<Seen>,
    last_at: u64,
    wake: Option<u64>,
    exited: bool,
    script: Script,
    /// Prompts answered with a stop reason (for [`Script::exit_after_prompts`]).
    answered: u64,
    /// The text it writes into its strings ([`wire_text`]), from a stream of its own so
    /// that its behaviour draws are what they were without it.
    text: TextRng,
    /// It writes non-ASCII as `\u` escapes (Python's `json.dumps`), else as UTF-8.
    ascii: bool,
    /// It got `authenticate` of its method ([`Behaviour::auth_required`]).
    authenticated: bool,
}

/// An event's text is padded to its drawn size with ASCII (no escaping: the line's size is
/// exact), at most this many bytes.
const FILLER_BYTES: usize = 1 << 16;

fn filler(bytes: usize) -> &'static str {
    static FILLER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let all = FILLER.get_or_init(|| "x".repeat(FILLER_BYTES));
    &all[..bytes.min(FILLER_BYTES)]
}

/// Prompts one agent process answers at most: a bound on its tag space and on a runaway
/// client.
pub const MAX_PROMPTS_PER_PROCESS: u64 = 1 << 20;

impl AgentModel {
    /// A process named `name` (it prefixes the markers of its events: the simulator uses
    /// the execution) that draws its choices from `seed`.
    pub fn new(name: impl Into<String>, behaviour: Behaviour, seed: u64, now: u64) -> AgentModel {
        let mut model = AgentModel {
            behaviour,
            rng: seed ^ 0x5DEE_CE66_D1CE_4E5B,
            name: name.into(),
            held: BTreeSet::new(),
            prompt: None,
            prompts: 0,
            created: Vec::new(),
            next_load: None,
            burst: None,
            events_cap: None,
            out: VecDeque::new(),
            seen: Vec::new(),
            last_at: now,
            wake: None,
            exited: false,
            script: Script::default(),
            answered: 0,
            text: TextRng::new(seed),
            ascii: false,
            authenticated: false,
        };
        model.ascii = model.text.chance(300);
        if model.behaviour.stderr_noise {
            model.emit(now, Out::Stderr("[agent] starting up\n".into()));
            model.emit(
                now,
                Out::Stderr("warning: no credentials found; continuing\n".into()),
            );
        }
        model
    }

    /// Its behaviour.
    #[must_use]
    pub fn behaviour(&self) -> &Behaviour {
        &self.behaviour
    }

    /// The same process, run with `script`'s exact knobs (a test's agent).
    #[must_use]
    pub fn with_script(mut self, script: Script) -> AgentModel {
        self.script = script;
        self
    }

    /// Its script.
    #[must_use]
    pub fn script(&self) -> &Script {
        &self.script
    }

    /// Whether it exited (it then does nothing more).
    #[must_use]
    pub fn exited(&self) -> bool {
        self.exited
    }

    /// The next output due at or before `now`, in write order, with what it means for a
    /// checker (an answer, a stream event) when it means something.
    pub fn poll_out(&mut self, now: u64) -> Option<(Out, Option<Seen>)> {
        match self.out.front() {
            Some((at, _, _)) if *at <= now => self.out.pop_front().map(|(_, o, s)| (o, s)),
            _ => None,
        }
    }

    /// When the next output is due, or the next wake-up, whichever is first.
    #[must_use]
    pub fn next_wake(&self) -> Option<u64> {
        let out = self.out.front().map(|(at, _, _)| *at);
        match (out, self.wake) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// What it received since the last call (what it wrote comes with
    /// [`AgentModel::poll_out`]).
    pub fn poll_seen(&mut self) -> std::vec::Drain<'_, Seen> {
        self.seen.drain(..)
    }

    fn next(&mut self) -> u64 {
        // splitmix64: a small, stable stream (the choices must not change with a crate).
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick(&mut self, (lo, hi): (u64, u64)) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, per_mille: u16) -> bool {
        self.next() % 1000 < u64::from(per_mille)
    }

    fn emit(&mut self, at: u64, out: Out) {
        self.emit_noted(at, out, None);
    }

    fn emit_noted(&mut self, at: u64, out: Out, note: Option<Seen>) {
        let at = at.max(self.last_at);
        self.last_at = at;
        self.out.push_back((at, out, note));
    }

    fn answer(&mut self, at: u64, id: &RequestId, outcome: Result<Value, RpcError>) {
        self.answer_noted(at, id, outcome, None);
    }

    fn answer_noted(
        &mut self,
        at: u64,
        id: &RequestId,
        outcome: Result<Value, RpcError>,
        note: Option<Seen>,
    ) {
        let line = palisade_wire::jsonrpc::encode_response(id, &outcome);
        self.emit_noted(at, Out::Line(line), note);
    }

    fn delay(&mut self, now: u64) -> u64 {
        let d = self.behaviour.answer_delay_ms;
        now + self.pick(d)
    }

    /// A line the client wrote to its stdin (without the newline).
    pub fn on_line(&mut self, now: u64, line: &[u8], store: &mut dyn ConversationStore) {
        self.on_frame(now, parse_frame(line), store);
    }

    /// A line the client wrote to its stdin, as [`parse_frame`] read it (for a caller that
    /// read the line already): what [`AgentModel::on_line`] does with that line.
    pub fn on_frame(
        &mut self,
        now: u64,
        frame: Result<Frame, palisade_wire::jsonrpc::FrameError>,
        store: &mut dyn ConversationStore,
    ) {
        if self.exited {
            return;
        }
        match frame {
            Ok(Frame::Request { id, method, params }) => {
                self.request(now, id, &method, &params, store)
            }
            Ok(Frame::Notification { method, params }) => {
                if method == palisade_wire::acp::SESSION_CANCEL {
                    let session = session_of(&params);
                    self.seen.push(Seen::Cancel {
                        session: session.clone(),
                    });
                    let hangs = self.script.prompt_end == PromptEnd::Hang;
                    if let Some(p) = self
                        .prompt
                        .as_mut()
                        .filter(|p| p.session == session && !hangs && !p.silent)
                    {
                        p.cancelled = true;
                        self.wake = Some(now + 1);
                    }
                } else {
                    self.seen.push(Seen::Unusable);
                }
            }
            // An answer to our own request (a permission): the prompt goes on.
            Ok(Frame::Response { .. }) => {}
            Err(_) => self.seen.push(Seen::Unusable),
        }
    }

    fn request(
        &mut self,
        now: u64,
        id: RequestId,
        method: &str,
        params: &RawJson,
        store: &mut dyn ConversationStore,
    ) {
        let session_param = || session_of(params);
        let at = self.delay(now);
        if self.behaviour.auth_required
            && !self.authenticated
            && matches!(
                method,
                "session/new"
                    | "session/load"
                    | "session/list"
                    | "session/prompt"
                    | "session/set_mode"
            )
        {
            let error = RpcError::new(-32000, "Authentication required");
            let note = Seen::Unauthenticated {
                method: method.to_owned(),
            };
            self.answer_noted(at, &id, Err(error), Some(note));
            return;
        }
        match method {
            "initialize" => {
                let result = initialize_result(
                    self.script
                        .protocol_version
                        .unwrap_or(palisade_wire::acp::PROTOCOL_VERSION),
                    self.behaviour.load_capability,
                    self.behaviour.lists_sessions,
                    self.script.malformed_load_capability,
                );
                let mut result = self.with_agent_info(result);
                if self.behaviour.auth_required {
                    result["authMethods"] = json!([{
                        "id": AUTH_METHOD,
                        "name": "Agent token",
                        "description": "The token the agent was installed with",
                    }]);
                }
                self.seen.push(Seen::Initialize {
                    agent_info: result["agentInfo"].clone(),
                });
                self.answer(at, &id, Ok(result));
            }
            "session/new" => {
                if let Some(failure) = self.behaviour.new_fails {
                    let error = failure.error();
                    let note = Seen::New(Err(error.clone()));
                    self.answer_noted(at, &id, Err(error), Some(note));
                    return;
                }
                let session = store.create();
                self.held.insert(session.clone());
                if self.script.silent_on_new && !self.created.contains(&session) {
                    self.created.push(session.clone());
                }
                let mut answer = json!({ "sessionId": session });
                if self.text.chance(500) {
                    let cwd =
                        wire_text::pick(&mut self.text, Some(wire_text::TextClass::WindowsPath));
                    answer["_meta"] = json!({ "cwd": cwd });
                }
                let line = palisade_wire::jsonrpc::encode_response(&id, &Ok(answer));
                if self.behaviour.unprompted_updates {
                    let update = commands_update_line(&session);
                    self.emit_noted(at, Out::Line(line), Some(Seen::New(Ok(session))));
                    self.emit(at, Out::Line(update));
                } else {
                    self.emit_noted(at, Out::Line(line), Some(Seen::New(Ok(session))));
                }
            }
            "session/load" if self.behaviour.unknown_session.loads() => {
                let at = self.script.load_delay_ms.map_or(at, |ms| now + ms);
                let session = session_param();
                let existed = store.exists(&session);
                match self.next_load.take() {
                    Some(NextLoad::Hang) => {
                        self.seen.push(Seen::Load {
                            id: session,
                            existed,
                            answer: Err(RpcError::new(0, "no answer")),
                            kind: None,
                        });
                        return;
                    }
                    Some(NextLoad::Answer(kind)) => {
                        let answer = match kind.error(&session) {
                            Some(error) => Err(error),
                            None => {
                                self.held.insert(session.clone());
                                Ok(())
                            }
                        };
                        let line = load_answer_line(&id, &answer);
                        let note = Seen::Load {
                            id: session,
                            existed,
                            answer,
                            kind: Some(kind),
                        };
                        self.emit_noted(at, Out::Line(line), Some(note));
                        return;
                    }
                    None => {}
                }
                let flake = existed && self.chance(self.behaviour.resume_flake_per_mille);
                let kind = if flake {
                    // claude-agent-acp 0.23: its Claude subprocess closed before the first
                    // answer, and the agent says "not found" for a session it has.
                    Some(LoadAnswer::ClaudeAgentAcp)
                } else if existed {
                    None
                } else {
                    Some(self.behaviour.unknown_session.answer())
                };
                let answer = match kind.and_then(|k| k.error(&session)) {
                    Some(error) => Err(error),
                    None => Ok(()),
                };
                if answer.is_ok() {
                    self.held.insert(session.clone());
                    self.replay_history(at, &session);
                }
                let line = load_answer_line(&id, &answer);
                let note = Seen::Load {
                    id: session,
                    existed,
                    answer,
                    kind,
                };
                self.emit_noted(at, Out::Line(line), Some(note));
            }
            "session/list" if self.behaviour.lists_sessions => {
                self.seen.push(Seen::List);
                let sessions: Vec<Value> = store
                    .list()
                    .into_iter()
                    .map(|s| json!({"sessionId": s, "cwd": "/"}))
                    .collect();
                self.answer(at, &id, Ok(json!({ "sessions": sessions })));
            }
            "session/prompt" => self.prompt(now, id, params),
            "authenticate" => {
                let ok = palisade_wire::acp::string_member(params, "methodId").as_deref()
                    == Some(AUTH_METHOD);
                self.authenticated |= ok;
                let answer = if ok {
                    Ok(json!({}))
                } else {
                    Err(RpcError::new(-32602, "Invalid params: unknown auth method"))
                };
                self.answer_noted(at, &id, answer, Some(Seen::Authenticate { ok }));
            }
            "session/set_mode" => {
                let mode = params
                    .parse::<Value>()
                    .ok()
                    .and_then(|p| p.get("modeId")?.as_str().map(str::to_owned))
                    .unwrap_or_default();
                self.seen.push(Seen::SetMode {
                    session: session_param(),
                    mode,
                });
                self.answer(at, &id, Ok(json!({})));
            }
            _ => {
                self.seen.push(Seen::Unusable);
                let error = if method == "session/load" {
                    self.behaviour
                        .unknown_session
                        .error(&session_param())
                        .unwrap_or_else(|| RpcError::new(-32601, "Method not found"))
                } else {
                    RpcError::new(-32601, "Method not found")
                };
                self.answer(at, &id, Err(error));
            }
        }
    }

    fn prompt(&mut self, now: u64, id: RequestId, params: &RawJson) {
        let (session, text) = prompt_params(params);
        self.prompts = (self.prompts + 1).min(MAX_PROMPTS_PER_PROCESS);
        let tag = format!("{}.{}", self.name, self.prompts);
        self.seen.push(Seen::Prompt {
            tag: tag.clone(),
            session: session.clone(),
            text,
        });
        if !self.held.contains(&session) || self.prompt.is_some() {
            // Not ours, or one prompt at a time: real agents refuse with an internal error.
            let error = RpcError::new(-32603, "Internal error")
                .with_data(json!({"details": format!("Session not found: {session}")}));
            let note = Seen::PromptAnswered {
                tag,
                answer: Err(error.clone()),
            };
            let at = self.delay(now);
            self.answer_noted(at, &id, Err(error), Some(note));
            return;
        }
        if self.chance(self.behaviour.prompt_fail_per_mille) {
            let mut error = self.behaviour.prompt_failure.error();
            // What the agent's own stack said, beside the details.
            if let Some(Value::Object(data)) = error.data.as_mut() {
                let trace = wire_text::pick(&mut self.text, None);
                data.insert("trace".into(), Value::from(trace));
            }
            let note = Seen::PromptAnswered {
                tag,
                answer: Err(error.clone()),
            };
            let at = self.delay(now);
            self.answer_noted(at, &id, Err(error), Some(note));
            return;
        }
        let (total, think_ms) = if let Some(plain) = self.script.chunks {
            // Exact: no draw, the chunks `delay_ms` apart.
            (
                plain.count,
                plain.delay_ms.saturating_mul(u64::from(plain.count)),
            )
        } else {
            let (lo, hi) = self.behaviour.events_per_prompt;
            let drawn = self.pick((u64::from(lo), u64::from(hi))) as u32;
            let think_ms = self.pick(self.behaviour.think_ms);
            match self.burst.take() {
                Some(count) => (count, 0),
                None => (
                    self.events_cap.map_or(drawn, |cap| cap.min(drawn)),
                    think_ms,
                ),
            }
        };
        let first = match self.script.chunks {
            Some(plain) => plain.delay_ms.max(1),
            None => 1,
        };
        let silent = (self.script.silent_on_new && self.created.contains(&session))
            || (self.behaviour.silent_per_mille > 0
                && self.chance(self.behaviour.silent_per_mille));
        // A silent prompt writes its first event (the agent took it), then nothing.
        let total = if silent { total.max(1) } else { total };
        let mute = !silent
            && (self
                .script
                .mute_from_prompt
                .is_some_and(|n| self.prompts >= n)
                || (self.behaviour.mute_per_mille > 0
                    && self.chance(self.behaviour.mute_per_mille)));
        self.prompt = Some(Prompting {
            id,
            session,
            tag,
            total,
            sent: 0,
            think_ms,
            cancelled: false,
            asked: false,
            silent,
            mute,
        });
        self.wake = Some(now + first);
    }

    /// `initialize`'s `result` with the agent's `agentInfo` (its name, title and version,
    /// drawn as real agents write them: a title may be a Windows path ending in a
    /// backslash), first or last among the members (agents differ).
    fn with_agent_info(&mut self, result: Value) -> Value {
        let title = if self.text.chance(500) {
            wire_text::pick(&mut self.text, Some(wire_text::TextClass::WindowsPath))
        } else {
            wire_text::pick(&mut self.text, None)
        };
        let mut version = String::from("0.23.1");
        if self.text.chance(300) {
            version.push_str("+build.");
            version.push_str(wire_text::pick(&mut self.text, None));
        }
        let info = json!({
            "name": format!("{} {}", self.name, wire_text::pick(&mut self.text, Some(wire_text::TextClass::Unicode))),
            "title": title,
            "version": version,
        });
        let Value::Object(members) = result else {
            return result;
        };
        let mut out = serde_json::Map::new();
        let first = self.text.chance(500);
        if first {
            out.insert("agentInfo".into(), info.clone());
        }
        out.extend(members);
        if !first {
            out.insert("agentInfo".into(), info);
        }
        Value::Object(out)
    }

    /// Streams [`Script::load_replay`] history chunks of `session` at `at`.
    fn replay_history(&mut self, at: u64, session: &str) {
        for i in 0..self.script.load_replay {
            let kind = if i % 2 == 0 {
                "user_message_chunk"
            } else {
                "agent_message_chunk"
            };
            let line = palisade_wire::jsonrpc::encode_notification(
                palisade_wire::acp::SESSION_UPDATE,
                &json!({
                    "sessionId": session,
                    "update": {
                        "sessionUpdate": kind,
                        "content": {"type": "text", "text": format!("history {i}")},
                    },
                }),
            );
            self.emit(at, Out::Line(line));
        }
    }

    /// Writes the exit with `code` at `now`; the model does nothing more.
    fn exit_at(&mut self, now: u64, code: i32) {
        self.emit(now, Out::Exit(code));
        self.prompt = None;
        self.wake = None;
        self.exited = true;
    }

    /// The next `session/load` goes this way.
    pub fn set_next_load(&mut self, next: NextLoad) {
        self.next_load = Some(next);
    }

    /// The next prompt writes `count` events at once (a burst).
    pub fn burst_next(&mut self, count: u32) {
        self.burst = Some(count);
    }

    /// Prompts write at most `cap` events (a burst is not capped).
    pub fn cap_events(&mut self, cap: u32) {
        self.events_cap = Some(cap);
    }

    /// Time passed: stream the prompt in flight.
    pub fn on_wake(&mut self, now: u64) {
        if self.exited || self.wake.is_none_or(|w| w > now) {
            return;
        }
        self.wake = None;
        let Some(mut p) = self.prompt.take() else {
            return;
        };
        if p.cancelled {
            self.finish(now, p, Ok("cancelled".into()));
            return;
        }
        if p.mute {
            // Only the cancel ends it (above); nothing wakes it before.
            self.prompt = Some(p);
            return;
        }
        // Everything due by now, at the pace the think time allows.
        let pace = p.think_ms / u64::from(p.total.max(1));
        loop {
            if self.script.exit_after_chunks == Some(p.sent) {
                self.exit_at(now, self.script.exit_code);
                return;
            }
            if p.silent && p.sent >= 1 {
                // Wedged: the prompt stays, nothing wakes it.
                self.prompt = Some(p);
                return;
            }
            if p.sent >= p.total {
                if self.script.prompt_end == PromptEnd::Answer {
                    self.finish(now, p, Ok("end_turn".into()));
                } else {
                    // Hang or hold: only a cancel (under hold) ends it.
                    self.prompt = Some(p);
                }
                return;
            }
            if self.behaviour.asks_permission && !p.asked && p.sent * 2 >= p.total {
                p.asked = true;
                let title = wire_text::pick(&mut self.text, None);
                let request = permission_request_line(
                    &RequestId::Number(1_000_000 + i64::try_from(self.prompts).unwrap_or(0)),
                    &p.session,
                    &p.tag,
                    title,
                );
                self.emit(now, Out::Line(request));
            }
            p.sent += 1;
            match self.script.chunks {
                Some(plain) => self.plain_chunk(now, &p, plain.bytes),
                None => self.stream_event(now, &p),
            }
            if pace > 0 {
                self.wake = Some(now + pace);
                self.prompt = Some(p);
                return;
            }
        }
    }

    fn stream_event(&mut self, now: u64, p: &Prompting) {
        // `<tag>#<sent>`, written without the formatting machinery (one per event).
        let mut marker = String::with_capacity(p.tag.len() + 11);
        marker.push_str(&p.tag);
        marker.push('#');
        push_decimal(&mut marker, u64::from(p.sent));
        let (lo, hi) = self
            .behaviour
            .event_wire_bytes
            .unwrap_or(self.behaviour.event_bytes);
        let bytes = self.pick((u64::from(lo), u64::from(hi))) as usize;
        let tool_call = self.chance(self.behaviour.tool_call_per_mille);
        // Drawn only when the behaviour has resources, so other behaviours draw as before.
        let resource = !tool_call
            && self.behaviour.resource_per_mille > 0
            && self.chance(self.behaviour.resource_per_mille);
        let mut line = String::with_capacity(bytes + 2 * marker.len() + 256);
        line.push_str(r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":""#);
        line.push_str(&p.session);
        // Where the update's text starts: after `","update":`.
        let update_at = line.len() + 11;
        if tool_call {
            line.push_str(r#"","update":{"sessionUpdate":"tool_call","toolCallId":""#);
            line.push_str(&marker);
            line.push_str(r#"","title":""#);
            line.push_str(&marker);
            line.push_str(r#"","kind":"read","status":"pending","rawInput":{"text":""#);
        } else if resource {
            line.push_str(
                r#"","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"resource","resource":{"uri":"file:///work/"#,
            );
            line.push_str(&marker);
            line.push_str(r#"","mimeType":"text/plain","text":""#);
        } else {
            line.push_str(
                r#"","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":""#,
            );
        }
        // The text: the marker, ASCII filler to the drawn size, then (drawn from the text
        // stream, half the time) what real agents write, so a string may end in a
        // backslash; a tool call's raw input carries nested JSON beside it, half the time.
        let pool = wire_text::pool();
        let drawn = self
            .text
            .chance(500)
            .then(|| self.text.below(pool.texts.len()) as u16);
        let drawn_args =
            (tool_call && self.text.chance(500)).then(|| self.text.below(pool.args.len()) as u16);
        let (extra, escaped) = drawn.map_or(("", ""), |i| {
            let (_, text, spellings) = &pool.texts[usize::from(i)];
            (text.as_str(), spellings[usize::from(self.ascii)].as_str())
        });
        let args = drawn_args.map(|i| pool.args[usize::from(i)].as_str());
        let mut tail = String::from("\"");
        if let Some(args) = args {
            tail.push_str(",\"args\":");
            tail.push_str(args);
        }
        tail.push_str(if resource { "}}}}}\n" } else { "}}}}\n" });
        line.push_str(&marker);
        line.push(' ');
        // ASCII filler: no escaping, so the line's size is exact and cheap to write. With
        // wire sizes the whole line is `bytes` long (never shorter than its envelope): the
        // drawn text and arguments go in only when they fit (else a backslash-ended word).
        let (fill_bytes, drawn, escaped, drawn_args) = match self.behaviour.event_wire_bytes {
            Some(_) => {
                let plain_tail = if resource { "\"}}}}}\n" } else { "\"}}}}\n" };
                if line.len() + escaped.len() + tail.len() <= bytes {
                    (
                        bytes - (line.len() + escaped.len() + tail.len()),
                        drawn,
                        escaped,
                        drawn_args,
                    )
                } else {
                    // Too tight for the drawn text: the shortest that ends in a backslash,
                    // when even that fits; else none.
                    tail = String::from(plain_tail);
                    let (_, _, spellings) = &pool.texts[usize::from(pool.small)];
                    let small = spellings[usize::from(self.ascii)].as_str();
                    if drawn.is_some() && line.len() + small.len() + tail.len() <= bytes {
                        (
                            bytes - (line.len() + small.len() + tail.len()),
                            Some(pool.small),
                            small,
                            None,
                        )
                    } else {
                        (
                            bytes.saturating_sub(line.len() + tail.len()),
                            None,
                            "",
                            None,
                        )
                    }
                }
            }
            None => (
                bytes.saturating_sub(marker.len() + 1 + extra.len()),
                drawn,
                escaped,
                drawn_args,
            ),
        };
        let filler = filler(fill_bytes);
        line.push_str(filler);
        line.push_str(escaped);
        line.push_str(&tail);
        // The update's own text: from its opening brace to the closing braces of the
        // params and of the message (and the newline).
        let raw_crc = crc32fast::hash(&line.as_bytes()[update_at..line.len() - 3]);
        let text = EventText::Drawn {
            fill: filler.len(),
            extra: drawn,
        };
        let note = Seen::Event {
            tag: p.tag.clone(),
            event: StreamedEvent {
                marker,
                index: p.sent,
                wire_bytes: line.len(),
                tool_call,
                raw_crc,
                text,
                args: drawn_args,
            },
        };
        self.emit_noted(now, Out::Line(line), Some(note));
    }

    /// The `p.sent`-th chunk of a scripted prompt: `chunk <i>` (0-based), padded with `.`
    /// to `bytes`.
    fn plain_chunk(&mut self, now: u64, p: &Prompting, bytes: usize) {
        let index = p.sent - 1;
        let mut text = format!("chunk {index}");
        if text.len() < bytes {
            text.push_str(&".".repeat(bytes - text.len()));
        }
        let line = palisade_wire::jsonrpc::encode_notification(
            palisade_wire::acp::SESSION_UPDATE,
            &json!({
                "sessionId": p.session,
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": text},
                },
            }),
        );
        let raw_crc = line.find("\"update\":").map_or(0, |at| {
            crc32fast::hash(&line.as_bytes()[at + 9..line.len() - 3])
        });
        let note = Seen::Event {
            tag: p.tag.clone(),
            event: StreamedEvent {
                marker: format!("{}#{}", p.tag, p.sent),
                index: p.sent,
                wire_bytes: line.len(),
                tool_call: false,
                raw_crc,
                text: EventText::Plain(text),
                args: None,
            },
        };
        self.emit_noted(now, Out::Line(line), Some(note));
    }

    fn finish(&mut self, now: u64, p: Prompting, answer: Result<String, RpcError>) {
        match answer {
            Ok(stop) => {
                let mut answer = json!({ "stopReason": stop });
                // A scripted prompt (a test's agent) is answered exactly.
                if self.script.chunks.is_none() && self.text.chance(250) {
                    answer["_meta"] = json!({ "summary": wire_text::pick(&mut self.text, None) });
                }
                let line = palisade_wire::jsonrpc::encode_response(&p.id, &Ok(answer));
                let note = Seen::PromptAnswered {
                    tag: p.tag.clone(),
                    answer: Ok(stop),
                };
                self.emit_noted(now, Out::Line(line), Some(note));
            }
            Err(error) => {
                let note = Seen::PromptAnswered {
                    tag: p.tag.clone(),
                    answer: Err(error.clone()),
                };
                self.answer_noted(now, &p.id, Err(error), Some(note));
            }
        }
        self.answered = self.answered.saturating_add(1);
        if self.script.exit_after_prompts == Some(self.answered) {
            self.exit_at(now, 0);
        }
    }

    /// Its stdin closed: an agent that exits on EOF does so.
    pub fn on_stdin_closed(&mut self, now: u64) {
        if self.behaviour.exits_on_eof && !self.exited {
            self.emit(now + 1, Out::Exit(0));
        }
    }

    /// The process is gone (it exited, or was killed): nothing more happens.
    pub fn kill(&mut self) {
        self.exited = true;
        self.out.clear();
        self.prompt = None;
        self.wake = None;
    }

    /// Marks the model exited after it wrote [`Out::Exit`].
    pub fn exit(&mut self) {
        self.kill();
    }

    /// Whether a prompt is in flight.
    #[must_use]
    pub fn prompting(&self) -> bool {
        self.prompt.is_some()
    }

    /// The conversation of the prompt in flight, if that prompt is mute
    /// ([`Behaviour::mute_per_mille`]) and no `session/cancel` came for it yet: it has
    /// written nothing for it and will not before the cancel.
    #[must_use]
    pub fn mute_prompt(&self) -> Option<&str> {
        self.prompt
            .as_ref()
            .filter(|p| p.mute && !p.cancelled)
            .map(|p| p.session.as_str())
    }

    /// The conversation of the prompt in flight, if that prompt went silent
    /// ([`Behaviour::silent_per_mille`], [`Script::silent_on_new`]): it will write nothing
    /// more and never be answered.
    #[must_use]
    pub fn silent_prompt(&self) -> Option<&str> {
        self.prompt
            .as_ref()
            .filter(|p| p.silent)
            .map(|p| p.session.as_str())
    }
}

/// Appends `n` in decimal (what `format!("{n}")` writes), without the formatting
/// machinery.
pub fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[start..]).expect("ASCII digits"));
}

/// The `available_commands_update` notification an agent writes unprompted after
/// `session/new`.
fn commands_update_line(session: &str) -> String {
    palisade_wire::jsonrpc::encode_notification(
        palisade_wire::acp::SESSION_UPDATE,
        &json!({
            "sessionId": session,
            "update": {
                "sessionUpdate": "available_commands_update",
                "availableCommands": [{"name": "init", "description": "create AGENTS.md"}],
            },
        }),
    )
}

/// The `session/request_permission` request of the prompt tagged `tag` in `session`.
fn permission_request_line(id: &RequestId, session: &str, tag: &str, title: &str) -> String {
    palisade_wire::jsonrpc::encode_request(
        id,
        "session/request_permission",
        &json!({
            "sessionId": session,
            "toolCall": {"toolCallId": format!("{tag}-perm"), "title": title},
            "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}],
        }),
    )
}

/// The line answering a `session/load` with `answer` (`{}` on success).
fn load_answer_line(id: &RequestId, answer: &Result<(), RpcError>) -> String {
    palisade_wire::jsonrpc::encode_response(id, &answer.clone().map(|()| json!({})))
}

/// `initialize`'s result. `agentCapabilities` keeps the order its members are written in:
/// `loadSession` first when the behaviour has one (a malformed capability replaces its
/// value in place), else last.
fn initialize_result(
    version: u16,
    load: LoadCapability,
    lists_sessions: bool,
    malformed: bool,
) -> Value {
    let mut caps = serde_json::Map::new();
    match load {
        LoadCapability::True => {
            caps.insert("loadSession".into(), Value::Bool(true));
        }
        LoadCapability::False => {
            caps.insert("loadSession".into(), Value::Bool(false));
        }
        LoadCapability::Absent => {}
    }
    if lists_sessions {
        caps.insert("sessionCapabilities".into(), json!({"list": {}}));
    }
    if malformed {
        caps.insert("loadSession".into(), json!("yes"));
    }
    json!({
        "protocolVersion": version,
        "agentCapabilities": caps,
        "authMethods": [],
    })
}

/// The `sessionId` of a request's params (`""` when absent or not a string).
fn session_of(params: &RawJson) -> String {
    palisade_wire::acp::string_member(params, "sessionId").unwrap_or_default()
}

/// A `session/prompt`'s session id and the text of its blocks, joined (each `""` when
/// absent or not a string; blocks without a string `text` are skipped; both `""` for
/// params no tree can hold, a number beyond `f64` in them say).
fn prompt_params(params: &RawJson) -> (String, String) {
    let Ok(params) = params.parse::<Value>() else {
        return (String::new(), String::new());
    };
    let session = params
        .get("sessionId")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let text = params
        .get("prompt")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("")
        })
        .unwrap_or_default();
    (session, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_wire::connection::{Incoming, Wire};

    #[test]
    fn prompt_params_are_the_session_and_the_blocks_texts() {
        let read = |text: &str| prompt_params(&RawJson::from_text(text).unwrap());
        let expected = ("s-1".to_owned(), "a\nb".to_owned());
        assert_eq!(
            read(
                r#"{"sessionId":"s-1","prompt":[{"type":"text","text":"a\n"},{"type":"image"},{"text":"b"}]}"#
            ),
            expected
        );
        // A repeated member: the last counts, as in a tree.
        assert_eq!(
            read(r#"{"sessionId":"x","sessionId":"s-1","prompt":[{"text":"a\n"},{"text":"b"}]}"#),
            expected
        );
        // What is not of the shape reads as empty.
        assert_eq!(
            read(r#"{"sessionId":7,"prompt":{"text":"a"}}"#),
            (String::new(), String::new())
        );
        // So do params no tree can hold.
        assert_eq!(
            read(r#"{"sessionId":"s-1","n":1e400,"prompt":[{"text":"a"}]}"#),
            (String::new(), String::new())
        );
    }

    #[test]
    fn initialize_answers_keep_the_capabilities_order() {
        let caps = |load, lists, malformed| {
            initialize_result(palisade_wire::acp::PROTOCOL_VERSION, load, lists, malformed)
                ["agentCapabilities"]
                .to_string()
        };
        assert_eq!(
            caps(LoadCapability::True, true, true),
            r#"{"loadSession":"yes","sessionCapabilities":{"list":{}}}"#
        );
        assert_eq!(
            caps(LoadCapability::Absent, true, true),
            r#"{"sessionCapabilities":{"list":{}},"loadSession":"yes"}"#
        );
        assert_eq!(
            caps(LoadCapability::False, false, false),
            r#"{"loadSession":false}"#
        );
        assert_eq!(caps(LoadCapability::Absent, false, false), "{}");
    }

    #[test]
    fn decimals_are_what_format_writes() {
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX] {
            let mut s = String::from("x");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }

    fn drain(model: &mut AgentModel, until: u64) -> Vec<String> {
        let mut lines = Vec::new();
        for now in 0..=until {
            model.on_wake(now);
            while let Some((out, note)) = model.poll_out(now) {
                if let Out::Line(line) = out {
                    lines.push(line);
                }
                model.seen.extend(note);
            }
        }
        lines
    }

    #[test]
    fn a_prompt_streams_marked_events_then_ends_the_turn() {
        let mut store = MemoryStore::default();
        let mut wire: Wire<&str> = Wire::new(0);
        let mut model = AgentModel::new("e1", Behaviour::default(), 7, 0);
        let (_, line) = wire
            .request(
                "session/new",
                &palisade_wire::acp::Params::Tree(json!({"cwd": "/"})),
                "new",
            )
            .unwrap();
        model.on_line(0, line.trim_end().as_bytes(), &mut store);
        let lines = drain(&mut model, 10);
        let Incoming::Reply {
            result: Ok(answer), ..
        } = wire.receive(lines[0].trim_end().as_bytes())
        else {
            panic!("{lines:?}")
        };
        let session = answer.parse::<Value>().unwrap()["sessionId"]
            .as_str()
            .unwrap()
            .to_owned();
        let (_, line) = wire
            .request(
                "session/prompt",
                &palisade_wire::acp::Params::Prompt {
                    session_id: session,
                    text: "hello".into(),
                },
                "prompt",
            )
            .unwrap();
        model.on_line(10, line.trim_end().as_bytes(), &mut store);
        let lines = drain(&mut model, 1_000);
        let events: Vec<Seen> = model.poll_seen().collect();
        let markers: Vec<String> = events
            .iter()
            .filter_map(|s| match s {
                Seen::Event { event, .. } => Some(event.marker.clone()),
                _ => None,
            })
            .collect();
        assert!(!markers.is_empty());
        assert_eq!(markers.len() + 1, lines.len(), "{lines:?}");
        for (k, (marker, line)) in markers.iter().zip(&lines).enumerate() {
            assert_eq!(*marker, format!("e1.1#{}", k + 1));
            assert!(line.contains(marker.as_str()));
            assert!(matches!(
                wire.receive(line.trim_end().as_bytes()),
                Incoming::Event(palisade_wire::AgentEvent::Update { .. })
            ));
        }
        assert!(matches!(
            wire.receive(lines.last().unwrap().trim_end().as_bytes()),
            Incoming::Reply { tag: "prompt", result: Ok(v) } if v.parse::<Value>().unwrap()["stopReason"] == "end_turn"
        ));
    }

    /// Many prompts of agents that write tool calls and resources too: every event's line
    /// reads back to the content its digest says, wire-sized lines stay exact, and the
    /// lines hold what real agents write (issue 29, class 5): a string ending in an
    /// escaped backslash, `\"` after `\\`, `\u` escapes with a surrogate pair, raw
    /// non-ASCII, Windows paths, code and nested JSON; `initialize` names the agent with
    /// such text, its `agentInfo` first or last.
    #[test]
    fn agents_write_what_real_agents_write_and_digest_it() {
        let mut wire_text_seen = String::new();
        let mut events = 0;
        for (seed, wire_sized) in (0..40u64).map(|s| (s, s % 4 == 3)) {
            let mut store = MemoryStore::default();
            let behaviour = Behaviour {
                tool_call_per_mille: 300,
                resource_per_mille: 200,
                events_per_prompt: (4, 8),
                event_wire_bytes: wire_sized.then_some((400, 900)),
                ..Behaviour::default()
            };
            let mut model = AgentModel::new("e1", behaviour, seed, 0);
            let init = palisade_wire::acp::Params::Initialize
                .request_line(&RequestId::Number(1), "initialize");
            model.on_line(0, init.trim_end().as_bytes(), &mut store);
            let new = palisade_wire::jsonrpc::encode_request(
                &RequestId::Number(2),
                "session/new",
                &json!({"cwd": "/"}),
            );
            model.on_line(0, new.trim_end().as_bytes(), &mut store);
            let mut lines = drain(&mut model, 10);
            let info: Value = serde_json::from_str(&lines[0]).unwrap();
            assert!(
                info["result"]["agentInfo"]["title"].is_string(),
                "{}",
                lines[0]
            );
            let session = store.list()[0].clone();
            for n in 0..6 {
                let prompt = palisade_wire::acp::Params::Prompt {
                    session_id: session.clone(),
                    text: "go".into(),
                };
                let line = prompt.request_line(&RequestId::Number(3 + n), "session/prompt");
                let at = 20 + n as u64 * 1_000;
                model.on_line(at, line.trim_end().as_bytes(), &mut store);
                lines.extend(drain(&mut model, at + 900));
            }
            let written: Vec<StreamedEvent> = model
                .poll_seen()
                .filter_map(|s| match s {
                    Seen::Event { event, .. } => Some(event),
                    _ => None,
                })
                .collect();
            let updates: Vec<&String> = lines
                .iter()
                .filter(|l| l.contains("\"session/update\""))
                .collect();
            assert_eq!(updates.len(), written.len());
            for (line, event) in updates.iter().zip(&written) {
                let value: Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
                let update = &value["params"]["update"];
                assert_eq!(
                    wire_text::update_digest(update),
                    Some(event.digest()),
                    "{line}"
                );
                #[derive(serde::Deserialize)]
                struct Raw<'a> {
                    #[serde(borrow)]
                    params: RawParams<'a>,
                }
                #[derive(serde::Deserialize)]
                struct RawParams<'a> {
                    #[serde(borrow)]
                    update: &'a serde_json::value::RawValue,
                }
                let raw: Raw<'_> = serde_json::from_str(line).unwrap();
                let raw = raw.params.update.get();
                assert_eq!(crc32fast::hash(raw.as_bytes()), event.raw_crc);
                assert_eq!(wire_text::update_digest_raw(raw), Some(event.digest()));
                assert!(event.delivered_as_written(raw));
                // Written again by a correct reader: the same content.
                let again =
                    serde_json::to_string(&serde_json::from_str::<Value>(raw).unwrap()).unwrap();
                assert!(event.delivered_as_written(&again), "{again}");
                // Read wrong: a string cut at its last escaped backslash.
                if let Some(at) = raw.rfind("\\\\\"") {
                    let cut = format!("{}\"}}}}", &raw[..at]);
                    if serde_json::from_str::<Value>(&cut).is_ok() {
                        assert!(!event.delivered_as_written(&cut), "{cut}");
                    }
                }
                assert_eq!(event.wire_bytes, line.len());
                if let Some((lo, hi)) = wire_sized.then_some((400, 900)) {
                    assert!(
                        (lo..=hi).contains(&line.len()),
                        "{} bytes: {line}",
                        line.len()
                    );
                }
                events += 1;
            }
            for line in &lines {
                wire_text_seen.push_str(line);
            }
        }
        assert!(events > 500, "{events}");
        for needle in [
            "\\\\\"",
            "\\\\\\\"",
            "\\ud83d\\ude",
            "\\u00e9",
            "é",
            "\\Users\\\\",
            "```",
            "\"args\":{",
            "\"agentInfo\":{",
        ] {
            assert!(wire_text_seen.contains(needle), "no {needle} on the wire");
        }
    }

    #[test]
    fn every_unknown_session_answer_is_a_real_agents() {
        for answer in UnknownSession::ALL {
            match answer.error("sess-9") {
                None => assert_eq!(answer, UnknownSession::PythonAnyId),
                Some(e) => assert!(
                    [-32002, -32603, -32602, -32601].contains(&e.code),
                    "{answer:?}: {e:?}"
                ),
            }
        }
    }

    /// The cells of a markdown table row (`\|` is a pipe inside a cell).
    fn cells(row: &str) -> Vec<String> {
        let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
        let mut cells = vec![String::new()];
        let mut chars = inner.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => {
                    cells.last_mut().expect("one cell").push('|');
                    chars.next();
                }
                '|' => cells.push(String::new()),
                c => cells.last_mut().expect("one cell").push(c),
            }
        }
        cells.into_iter().map(|c| c.trim().to_owned()).collect()
    }

    /// The rows of the table under `heading` in `docs/real-agents.md`.
    fn page_table(heading: &str) -> Vec<Vec<String>> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/real-agents.md");
        let text = std::fs::read_to_string(path).expect("docs/real-agents.md");
        let start = text
            .find(heading)
            .unwrap_or_else(|| panic!("docs/real-agents.md has no {heading:?}"));
        text[start..]
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .map(cells)
            .collect()
    }

    /// The answer catalogue is the tables of `docs/real-agents.md` as data: every entry's
    /// label is the verdict of the row that decides it, and every row of the agents' table
    /// has an entry.
    #[test]
    fn the_answer_catalogue_is_pinned_to_the_real_agents_tables() {
        let agents = page_table("### Real agents' answers to an unknown session");
        let rows = page_table("### Rule 6, row by row");
        assert!(
            agents.len() >= 14 && rows.len() >= 11,
            "{agents:?} {rows:?}"
        );
        for answer in LoadAnswer::ALL {
            let (table, key, phrase) = answer.readme();
            let (rows, verdict_col) = match table {
                ReadmeTable::Agents => (&agents, 3),
                ReadmeTable::Rows => (&rows, 1),
            };
            let matching: Vec<&Vec<String>> =
                rows.iter().filter(|r| r[0].starts_with(key)).collect();
            assert_eq!(matching.len(), 1, "{answer:?}: rows starting {key:?}");
            let verdict = &matching[0][verdict_col];
            assert!(
                verdict.contains(phrase),
                "{answer:?}: docs/real-agents.md says {verdict:?}, not {phrase:?}"
            );
            // The phrase says what the label says.
            match answer.proof() {
                Proof::Always => assert!(
                    phrase.starts_with("**Incompatible**") || phrase == "Incompatible",
                    "{answer:?}: {phrase}"
                ),
                Proof::Under(profiles) => {
                    assert!(phrase.starts_with("**Incompatible**"), "{answer:?}");
                    assert!(phrase.contains("**Inconclusive**"), "{answer:?}");
                    for p in profiles {
                        assert!(phrase.contains(&format!("`{p:?}`")), "{answer:?}: {p:?}");
                    }
                }
                Proof::Never => assert!(
                    phrase.contains("Inconclusive") && !phrase.contains("Incompatible")
                        || phrase.starts_with("none"),
                    "{answer:?}: {phrase}"
                ),
            }
        }
        for row in &agents {
            let covered = LoadAnswer::ALL.iter().any(|a| {
                let (table, key, _) = a.readme();
                table == ReadmeTable::Agents && row[0].starts_with(key)
            }) || row[0].starts_with("claude-code-acp \u{2264} 0.15");
            assert!(covered, "table row {:?} has no catalogue entry", row[0]);
        }
    }

    /// The production classifier agrees with the catalogue's labels, entry by entry and
    /// profile by profile (the labels are data from `docs/real-agents.md`; the classifier
    /// is code).
    #[test]
    fn the_core_classifier_agrees_with_every_catalogue_label() {
        use palisade_core::classify::{
            classify, ErrorAnswer as Classified, LoadFailure, LoadOutcome, LoadVerdict,
            SessionListing, TransportState,
        };
        let id = "sess-7";
        for answer in LoadAnswer::ALL {
            let Some(error) = answer.error(id) else {
                assert_eq!(answer.proof(), Proof::Never);
                continue;
            };
            let outcome = LoadOutcome {
                load_capability: Some(true),
                requested_session: id.to_owned(),
                result: LoadFailure::Rpc(Classified {
                    code: error.code,
                    message: error.message.clone(),
                    data_details: error
                        .data
                        .as_ref()
                        .and_then(|d| d.get("details"))
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    data_present: error.data.is_some(),
                }),
                transport: TransportState::Open,
                // The labels are the tables' for an agent whose listing is not known.
                listing: SessionListing::Unknown,
            };
            for profile in AgentProfile::ALL {
                let verdict = classify(&outcome, profile).verdict;
                assert_eq!(
                    verdict == LoadVerdict::Incompatible,
                    answer.proof().holds(profile),
                    "{answer:?} under {profile:?}: {verdict:?}"
                );
            }
        }
    }

    #[test]
    fn near_misses_and_transients_are_what_a_session_the_agent_has_may_get() {
        let existing: Vec<LoadAnswer> = LoadAnswer::for_existing_session().collect();
        assert!(existing.contains(&LoadAnswer::RespelledId));
        assert!(existing.contains(&LoadAnswer::AuthRequired));
        assert!(!existing.contains(&LoadAnswer::CodexAcp));
        assert!(LoadAnswer::ALL
            .iter()
            .any(|a| a.near_miss() && a.proof() == Proof::Always));
        assert!(LoadAnswer::ALL
            .iter()
            .any(|a| a.near_miss() && a.proof() == Proof::Never));
        let long = LoadAnswer::LongDetails.error("sess-1").expect("an error");
        assert!(long.data.expect("data").to_string().len() > LONG_DATA_BYTES);
    }
}
