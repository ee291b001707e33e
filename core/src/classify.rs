//! Load-fallback classification (rule 6, `docs/design.md`): may a failed `session/load` be
//! replaced by `session/new`?
//!
//! Replacing a conversation is not undoable: the session's conversation token is overwritten
//! and the user's history is gone from the agent's point of view. So the classifier falls
//! back only on *positive proof* that the old conversation cannot be loaded:
//!
//! - the agent did not advertise the `loadSession` capability, or advertised it as `false`;
//! - the agent answered JSON-RPC −32601 (method not found) or −32002 (resource not found);
//! - the agent's message is an **exact**, documented projection of one of those answers that
//!   names the requested session or the `session/load` method (see [`Projection`]).
//!
//! A "not found" answer (−32002 or a projection of it) is proof only by the agent's word,
//! and agents are wrong about it: claude-agent-acp 0.23 answers `−32002 Resource not found`
//! whenever its Claude subprocess closes before the first answer, for a session it has.
//! So when the embedder asked the agent's `session/list` and the agent lists the requested
//! session ([`SessionListing::Listed`]), the conversation is kept:
//! [`ClassifyReason::ListedByAgent`], inconclusive.
//!
//! Everything else — timeouts, cancellations, −32603 internal errors, −32000 auth required,
//! −32800 request cancelled, any other code — is [`LoadVerdict::Inconclusive`]: the failure is
//! propagated and the conversation token is kept. A message is never searched for words:
//! "resource not found while resolving configuration" proves nothing.
//!
//! Transport death is decided from [`LoadOutcome::transport`] alone, before anything else,
//! never from an error code: agents use codes such as codex-acp's `1001` ("Codex process has
//! exited") while the connection to the agent is still open.
//!
//! The classifier is a pure function: no clock, no I/O, no allocation. Each check either
//! compares an integer or compares a string for equality with a length test first, so a
//! mebibyte of stderr in an error message costs no more than an empty one.
//!
//! ```
//! use palisade_core::classify::{
//!     classify, AgentProfile, LoadFailure, LoadOutcome, LoadVerdict, ErrorAnswer, SessionListing,
//!     TransportState,
//! };
//!
//! let outcome = LoadOutcome {
//!     load_capability: Some(true),
//!     requested_session: "sess-1".to_owned(),
//!     result: LoadFailure::Rpc(ErrorAnswer::new(
//!         -32603,
//!         "resource not found while resolving configuration",
//!     )),
//!     transport: TransportState::Open,
//!     listing: SessionListing::Unknown,
//! };
//! // A substring proves nothing: keep the conversation and report the failure.
//! let classification = classify(&outcome, AgentProfile::Generic);
//! assert_eq!(classification.verdict, LoadVerdict::Inconclusive);
//! assert!(!classification.verdict.allows_session_new());
//! ```

use serde::{Deserialize, Serialize};

use crate::mutants::{mutant_on, ActiveMutant};

/// What came back from one failed `session/load`, as the embedder observed it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LoadOutcome {
    /// The agent's `agentCapabilities.loadSession` from `initialize`: `None` when the field
    /// was absent.
    pub load_capability: Option<bool>,
    /// The session ID sent in the `session/load` request. Projections that name a session
    /// must name exactly this one.
    pub requested_session: String,
    /// How the request failed.
    pub result: LoadFailure,
    /// The state of the agent connection when the failure was observed.
    pub transport: TransportState,
    /// What the agent's `session/list` said about the requested session, when the embedder
    /// asked it (see [`ClassifyReason::may_be_overturned_by_listing`]).
    #[serde(default)]
    pub listing: SessionListing,
}

/// What the agent's `session/list` said about the requested session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SessionListing {
    /// Not asked (the agent does not list sessions, or the answer did not need it), or
    /// no usable answer.
    #[default]
    Unknown,
    /// The agent lists the session: it still has the conversation.
    Listed,
    /// The agent's list does not have it.
    NotListed,
}

/// How a `session/load` request failed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LoadFailure {
    /// The agent answered with a JSON-RPC error.
    Rpc(ErrorAnswer),
    /// No answer arrived before the embedder's deadline.
    TimedOut,
    /// The embedder cancelled the request (the user cancelled, or the attempt was retired).
    Cancelled,
}

/// A JSON-RPC error response, reduced to what classification may look at.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ErrorAnswer {
    /// The `code` member.
    pub code: i64,
    /// The `message` member.
    pub message: String,
    /// `data.details`, when `data` was an object with a string member `details`. The
    /// TypeScript ACP SDK puts the message of any plain `Error` a handler throws there, under
    /// code −32603.
    pub data_details: Option<String>,
    /// Whether the error carried a `data` member at all.
    pub data_present: bool,
}

impl ErrorAnswer {
    /// JSON-RPC "Invalid Request".
    pub const INVALID_REQUEST: i64 = -32600;
    /// JSON-RPC "Method not found": the agent does not implement `session/load`.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// JSON-RPC "Invalid params".
    pub const INVALID_PARAMS: i64 = -32602;
    /// JSON-RPC "Internal error": anything went wrong inside the agent.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// ACP "Authentication required".
    pub const AUTH_REQUIRED: i64 = -32000;
    /// ACP "Resource not found": the agent does not know the requested session.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
    /// ACP "Request cancelled".
    pub const REQUEST_CANCELLED: i64 = -32800;

    /// An error with `code` and `message` and no `data`.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        ErrorAnswer {
            code,
            message: message.into(),
            data_details: None,
            data_present: false,
        }
    }
}

/// The state of the connection to the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransportState {
    /// The connection is up and the agent process runs.
    Open,
    /// The connection (stdio pipe, socket) closed.
    Closed,
    /// The agent process exited.
    ProcessExited,
}

/// Which agent answered, when the embedder knows. A profile only *adds* exact projections
/// that the agent's source documents; every profile falls back whenever
/// [`AgentProfile::Generic`] does, and `Generic` is safe for every agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AgentProfile {
    /// Unknown agent: protocol codes and agent-independent projections only.
    #[default]
    Generic,
    /// `@agentclientprotocol/claude-agent-acp`. Adds [`Projection::ClaudeSessionNotFound`]
    /// (versions 0.17–0.18); 0.20 and later answer −32002.
    ClaudeAgentAcp,
    /// `@zed-industries/claude-code-acp`. Adds [`Projection::ClaudeSessionNotFound`]
    /// (0.16.x; earlier versions have no `session/load`).
    ClaudeCodeAcp,
    /// `codex-acp` in Rust (zed-industries): answers −32002 itself; nothing to add.
    CodexAcpRust,
    /// `codex-acp` in TypeScript over the Codex app-server (agentclientprotocol). Adds
    /// [`Projection::CodexNoRolloutForSession`].
    CodexAcpTs,
    /// gemini-cli `--acp`: its unknown-session answer has no exact projection; nothing to add.
    GeminiCli,
    /// goose: answers −32002 (current) or −32602 (older); nothing to add.
    Goose,
    /// opencode: its unknown-session answer is an opaque −32603; nothing to add.
    Opencode,
}

impl AgentProfile {
    /// Whether this agent answers `session/list`, whatever its `initialize` advertises:
    /// claude-agent-acp 0.23 does (issue 13 saw it list a session it had just answered
    /// −32002 for). An embedder asks an agent that advertises the method, or whose profile
    /// says it has one, before acting on a "not found".
    pub const fn lists_sessions(self) -> bool {
        matches!(self, AgentProfile::ClaudeAgentAcp)
    }

    /// Every profile, in a fixed order.
    pub const ALL: [AgentProfile; 8] = [
        AgentProfile::Generic,
        AgentProfile::ClaudeAgentAcp,
        AgentProfile::ClaudeCodeAcp,
        AgentProfile::CodexAcpRust,
        AgentProfile::CodexAcpTs,
        AgentProfile::GeminiCli,
        AgentProfile::Goose,
        AgentProfile::Opencode,
    ];
}

/// What the embedder does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LoadVerdict {
    /// The old conversation provably cannot be loaded: create a new one with `session/new`
    /// and replace the session's conversation token.
    Incompatible,
    /// Nothing is proven: propagate the failure and keep the session's conversation token.
    Inconclusive,
    /// The agent connection or process is gone: respawn the runtime and keep the token.
    TransportDead,
}

impl LoadVerdict {
    /// Whether the embedder may replace the conversation with `session/new`.
    pub const fn allows_session_new(self) -> bool {
        matches!(self, LoadVerdict::Incompatible)
    }
}

/// An exact, documented rendering of "this conversation cannot be loaded" that does not
/// carry code −32601 or −32002 (a boundary flattened the code, or the agent's SDK wrapped
/// its answer). Each is compared for equality, never searched for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Projection {
    /// `message == "Resource not found: " + requested_session` — the TypeScript ACP SDK's
    /// `RequestError.resourceNotFound(sessionId)`, as claude-agent-acp ≥ 0.20 sends it. Any
    /// profile. A bare "Resource not found" is not accepted: it may be a file the agent
    /// failed to read through the client.
    ResourceNotFoundForSession,
    /// `message == "\"Method not found\": session/load"` — the TypeScript ACP SDK's
    /// `RequestError.methodNotFound("session/load")`. Any profile. A bare "Method not found"
    /// is not accepted: it does not say which method.
    SessionLoadMethodNotFound,
    /// Code −32603 with `data.details == "Session not found"` — claude-code-acp 0.16.x and
    /// claude-agent-acp 0.17–0.18 throw exactly this when no session file exists. Claude
    /// profiles only: for an unknown agent the same words may describe anything.
    ClaudeSessionNotFound,
    /// Code −32603 with the message or `data.details` equal to
    /// `"no rollout found for thread id " + requested_session` — the Codex thread store's
    /// answer, passed through by the TypeScript codex-acp. [`AgentProfile::CodexAcpTs`] only.
    CodexNoRolloutForSession,
}

/// Why a verdict was reached: one variant per decided row of rule 6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClassifyReason {
    /// The connection to the agent closed.
    TransportClosed,
    /// The agent process exited.
    ProcessExited,
    /// `loadSession` was absent from the agent's capabilities.
    CapabilityAbsent,
    /// `loadSession` was `false`.
    CapabilityFalse,
    /// Code −32601.
    MethodNotFound,
    /// Code −32002.
    ResourceNotFound,
    /// An exact, documented projection of −32601 or −32002.
    ExactProjection(Projection),
    /// The load timed out: the agent may still be loading.
    TimedOut,
    /// The embedder cancelled the load; a cancelled caller starts nothing new.
    Cancelled,
    /// Code −32000: credentials are missing, not the conversation.
    AuthRequired,
    /// Code −32800: the agent cancelled the request.
    RequestCancelled,
    /// Code −32603: something failed inside the agent.
    InternalError,
    /// Code −32602: older goose answers an unknown session, and any storage error, with it.
    InvalidParams,
    /// Code −32600.
    InvalidRequest,
    /// Any other code.
    UnknownCode(i64),
    /// The agent said "not found" (−32002 or a projection of it), but its own
    /// `session/list` has the session: the agent's word is contradicted, nothing is proven.
    ListedByAgent,
}

impl ClassifyReason {
    /// The verdict the classifier pairs with this reason.
    pub const fn verdict(self) -> LoadVerdict {
        match self {
            ClassifyReason::TransportClosed | ClassifyReason::ProcessExited => {
                LoadVerdict::TransportDead
            }
            ClassifyReason::CapabilityAbsent
            | ClassifyReason::CapabilityFalse
            | ClassifyReason::MethodNotFound
            | ClassifyReason::ResourceNotFound
            | ClassifyReason::ExactProjection(_) => LoadVerdict::Incompatible,
            ClassifyReason::TimedOut
            | ClassifyReason::Cancelled
            | ClassifyReason::AuthRequired
            | ClassifyReason::RequestCancelled
            | ClassifyReason::InternalError
            | ClassifyReason::InvalidParams
            | ClassifyReason::InvalidRequest
            | ClassifyReason::UnknownCode(_)
            | ClassifyReason::ListedByAgent => LoadVerdict::Inconclusive,
        }
    }

    /// Whether this proof is the agent's word that the *session* is not there, which its
    /// own `session/list` can contradict: −32002 and the "not found" projections. An
    /// embedder that gets such a verdict asks `session/list` before acting on it (a missing
    /// capability or method is not about the session, so a listing changes nothing).
    pub const fn may_be_overturned_by_listing(self) -> bool {
        matches!(
            self,
            ClassifyReason::ResourceNotFound
                | ClassifyReason::ExactProjection(
                    Projection::ResourceNotFoundForSession
                        | Projection::ClaudeSessionNotFound
                        | Projection::CodexNoRolloutForSession
                )
        )
    }
}

/// A verdict and the reason for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Classification {
    /// What to do next.
    pub verdict: LoadVerdict,
    /// Why.
    pub reason: ClassifyReason,
}

impl Classification {
    const fn because(reason: ClassifyReason) -> Self {
        Classification {
            verdict: reason.verdict(),
            reason,
        }
    }
}

/// `"Resource not found: "` + session ID: `RequestError.resourceNotFound(uri)` of the
/// TypeScript ACP SDK (claude-agent-acp passes the session ID as `uri`).
const RESOURCE_NOT_FOUND_PREFIX: &str = "Resource not found: ";
/// `RequestError.methodNotFound("session/load")` of the TypeScript ACP SDK.
const SESSION_LOAD_METHOD_NOT_FOUND: &str = "\"Method not found\": session/load";
/// The `Error` claude-code-acp 0.16.x / claude-agent-acp 0.17–0.18 throw from `loadSession`.
const CLAUDE_SESSION_NOT_FOUND: &str = "Session not found";
/// `ThreadStoreError::InvalidRequest` of the Codex thread store, followed by the thread ID.
const CODEX_NO_ROLLOUT_PREFIX: &str = "no rollout found for thread id ";

/// Classifies a failed `session/load` under rule 6 (`docs/real-agents.md` has its table).
#[must_use]
pub fn classify(outcome: &LoadOutcome, profile: AgentProfile) -> Classification {
    classify_with(outcome, profile, ActiveMutant::NONE)
}

/// [`classify`] with a mutant that may re-create a known bug (feature `mutants`).
#[must_use]
pub(crate) fn classify_with(
    outcome: &LoadOutcome,
    profile: AgentProfile,
    mutant: ActiveMutant,
) -> Classification {
    use ClassifyReason as R;

    // The transport's own state, first: an error code never says whether the process lives.
    match outcome.transport {
        TransportState::Closed => return Classification::because(R::TransportClosed),
        TransportState::ProcessExited => return Classification::because(R::ProcessExited),
        TransportState::Open => {}
    }
    // A cancelled caller must not go on to create a conversation, whatever the agent supports.
    if outcome.result == LoadFailure::Cancelled {
        return Classification::because(R::Cancelled);
    }
    if let Some(proof) = capability_proof(outcome.load_capability) {
        return Classification::because(proof);
    }
    match &outcome.result {
        LoadFailure::TimedOut => {
            if mutant_on!(mutant, TimeoutFallback) {
                // The bug: a slow agent is taken for one that cannot load.
                return Classification {
                    verdict: LoadVerdict::Incompatible,
                    reason: R::TimedOut,
                };
            }
            Classification::because(R::TimedOut)
        }
        LoadFailure::Cancelled => Classification::because(R::Cancelled),
        LoadFailure::Rpc(error) => {
            let c = classify_rpc(error, &outcome.requested_session, profile, mutant);
            // The agent's "not found" against its own list: the list wins, the
            // conversation is kept.
            if c.reason.may_be_overturned_by_listing()
                && outcome.listing == SessionListing::Listed
                && !mutant_on!(mutant, ListedConversationReplaced)
            {
                return Classification::because(R::ListedByAgent);
            }
            c
        }
    }
}

/// The agent's `loadSession` capability as proof that a conversation cannot be loaded:
/// absent or `false` proves it (the reason says which), `true` proves nothing. The core asks
/// this when an agent becomes ready, before any `session/load`.
pub(crate) const fn capability_proof(load_capability: Option<bool>) -> Option<ClassifyReason> {
    match load_capability {
        None => Some(ClassifyReason::CapabilityAbsent),
        Some(false) => Some(ClassifyReason::CapabilityFalse),
        Some(true) => None,
    }
}

fn classify_rpc(
    error: &ErrorAnswer,
    requested_session: &str,
    profile: AgentProfile,
    mutant: ActiveMutant,
) -> Classification {
    use ClassifyReason as R;

    match error.code {
        ErrorAnswer::METHOD_NOT_FOUND => return Classification::because(R::MethodNotFound),
        ErrorAnswer::RESOURCE_NOT_FOUND => return Classification::because(R::ResourceNotFound),
        _ => {}
    }
    if mutant_on!(mutant, SubstringFallback)
        && contains_ignore_ascii_case(&error.message, "not found")
    {
        // The bug: any "…not found…" is taken for an unknown session.
        return Classification {
            verdict: LoadVerdict::Incompatible,
            reason: R::ResourceNotFound,
        };
    }
    // These codes say why the load failed, and it is not the conversation: their words
    // cannot override them.
    match error.code {
        ErrorAnswer::AUTH_REQUIRED => return Classification::because(R::AuthRequired),
        ErrorAnswer::REQUEST_CANCELLED => return Classification::because(R::RequestCancelled),
        _ => {}
    }
    if let Some(projection) = exact_projection(error, requested_session, profile) {
        return Classification::because(R::ExactProjection(projection));
    }
    Classification::because(match error.code {
        ErrorAnswer::INTERNAL_ERROR => R::InternalError,
        ErrorAnswer::INVALID_PARAMS => R::InvalidParams,
        ErrorAnswer::INVALID_REQUEST => R::InvalidRequest,
        code => R::UnknownCode(code),
    })
}

/// The projection `error` is exactly equal to, if any. Every comparison checks the length
/// first, so a message of any size that is not a projection is rejected in constant time.
fn exact_projection(
    error: &ErrorAnswer,
    requested_session: &str,
    profile: AgentProfile,
) -> Option<Projection> {
    let message = error.message.as_str();
    let details = error.data_details.as_deref();
    if is_prefix_then(message, RESOURCE_NOT_FOUND_PREFIX, requested_session) {
        return Some(Projection::ResourceNotFoundForSession);
    }
    if message == SESSION_LOAD_METHOD_NOT_FOUND {
        return Some(Projection::SessionLoadMethodNotFound);
    }
    let internal = error.code == ErrorAnswer::INTERNAL_ERROR;
    match profile {
        AgentProfile::ClaudeAgentAcp | AgentProfile::ClaudeCodeAcp
            if internal && details == Some(CLAUDE_SESSION_NOT_FOUND) =>
        {
            Some(Projection::ClaudeSessionNotFound)
        }
        AgentProfile::CodexAcpTs
            if internal
                && (is_prefix_then(message, CODEX_NO_ROLLOUT_PREFIX, requested_session)
                    || details.is_some_and(|details| {
                        is_prefix_then(details, CODEX_NO_ROLLOUT_PREFIX, requested_session)
                    })) =>
        {
            Some(Projection::CodexNoRolloutForSession)
        }
        _ => None,
    }
}

/// `text == prefix + tail`, for a non-empty `tail`, without allocating.
fn is_prefix_then(text: &str, prefix: &str, tail: &str) -> bool {
    !tail.is_empty()
        && prefix.len().checked_add(tail.len()) == Some(text.len())
        && text.strip_prefix(prefix) == Some(tail)
}

/// Case-insensitive ASCII substring search. Used only by the `SubstringFallback` mutant: the
/// real classifier never searches a message.
fn contains_ignore_ascii_case(haystack: &str, needle: &str) -> bool {
    let (haystack, needle) = (haystack.as_bytes(), needle.as_bytes());
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SESSION: &str = "0199a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a6b";
    const MIB: usize = 1 << 20;

    fn outcome(result: LoadFailure) -> LoadOutcome {
        LoadOutcome {
            load_capability: Some(true),
            requested_session: SESSION.to_owned(),
            result,
            transport: TransportState::Open,
            listing: SessionListing::Unknown,
        }
    }

    fn rpc(code: i64, message: &str) -> LoadOutcome {
        outcome(LoadFailure::Rpc(ErrorAnswer::new(code, message)))
    }

    /// An error the TypeScript ACP SDK made from a plain `Error`: −32603, "Internal error",
    /// `data: { details }`.
    fn ts_internal(details: &str) -> LoadOutcome {
        outcome(LoadFailure::Rpc(ErrorAnswer {
            code: ErrorAnswer::INTERNAL_ERROR,
            message: "Internal error".to_owned(),
            data_details: Some(details.to_owned()),
            data_present: true,
        }))
    }

    fn with_data(mut outcome: LoadOutcome) -> LoadOutcome {
        if let LoadFailure::Rpc(error) = &mut outcome.result {
            error.data_present = true;
        }
        outcome
    }

    fn verdict(outcome: &LoadOutcome, profile: AgentProfile) -> LoadVerdict {
        classify(outcome, profile).verdict
    }

    fn assert_every_profile(outcome: &LoadOutcome, expected: Classification) {
        for profile in AgentProfile::ALL {
            assert_eq!(classify(outcome, profile), expected, "{profile:?}");
        }
    }

    fn incompatible(reason: ClassifyReason) -> Classification {
        Classification {
            verdict: LoadVerdict::Incompatible,
            reason,
        }
    }

    fn inconclusive(reason: ClassifyReason) -> Classification {
        Classification {
            verdict: LoadVerdict::Inconclusive,
            reason,
        }
    }

    // ---- The table: real agents' answers to an unknown session. ----

    #[test]
    fn claude_agent_acp_resource_not_found_for_session_falls_back() {
        // RequestError.resourceNotFound(sessionId): data is { uri }.
        let answer = with_data(rpc(-32002, &format!("Resource not found: {SESSION}")));
        assert_every_profile(&answer, incompatible(ClassifyReason::ResourceNotFound));
    }

    #[test]
    fn a_not_found_for_a_session_the_agent_lists_is_inconclusive() {
        // claude-agent-acp 0.23 when its Claude subprocess closed before the first answer:
        // "not found" for a session its own session/list has.
        let listed = |mut o: LoadOutcome| {
            o.listing = SessionListing::Listed;
            o
        };
        for answer in [
            with_data(rpc(-32002, &format!("Resource not found: {SESSION}"))),
            rpc(-32603, &format!("Resource not found: {SESSION}")),
        ] {
            assert_every_profile(&listed(answer), inconclusive(ClassifyReason::ListedByAgent));
        }
        assert_eq!(
            classify(
                &listed(ts_internal("Session not found")),
                AgentProfile::ClaudeCodeAcp
            ),
            inconclusive(ClassifyReason::ListedByAgent)
        );
        // A listing that does not have it, or none, leaves the proof standing.
        let mut not_listed = rpc(-32002, "Resource not found");
        not_listed.listing = SessionListing::NotListed;
        assert_every_profile(&not_listed, incompatible(ClassifyReason::ResourceNotFound));
        // A missing method is about the agent, not the session: listing it changes nothing.
        assert_every_profile(
            &listed(rpc(-32601, "Method not found")),
            incompatible(ClassifyReason::MethodNotFound),
        );
    }

    #[test]
    fn claude_agent_acp_query_closed_before_response_is_inconclusive() {
        // 0.19.x: the SDK's resume failure surfaced as a plain Error.
        let answer = ts_internal("Query closed before response received");
        assert_every_profile(&answer, inconclusive(ClassifyReason::InternalError));
    }

    #[test]
    fn claude_code_acp_session_not_found_details_falls_back_with_claude_profiles() {
        let answer = ts_internal("Session not found");
        for profile in [AgentProfile::ClaudeCodeAcp, AgentProfile::ClaudeAgentAcp] {
            assert_eq!(
                classify(&answer, profile),
                incompatible(ClassifyReason::ExactProjection(
                    Projection::ClaudeSessionNotFound
                ))
            );
        }
    }

    #[test]
    fn session_not_found_details_is_inconclusive_without_a_claude_profile() {
        let answer = ts_internal("Session not found");
        for profile in AgentProfile::ALL {
            if !matches!(
                profile,
                AgentProfile::ClaudeCodeAcp | AgentProfile::ClaudeAgentAcp
            ) {
                assert_eq!(
                    classify(&answer, profile),
                    inconclusive(ClassifyReason::InternalError),
                    "{profile:?}"
                );
            }
        }
    }

    #[test]
    fn claude_session_not_found_projection_needs_the_exact_details() {
        for details in [
            "session not found",
            "Session not found ",
            "Session not found: abc",
            "Session not found.",
        ] {
            assert_eq!(
                verdict(&ts_internal(details), AgentProfile::ClaudeCodeAcp),
                LoadVerdict::Inconclusive,
                "{details:?}"
            );
        }
    }

    #[test]
    fn claude_session_not_found_projection_needs_code_internal_error() {
        let mut answer = ts_internal("Session not found");
        if let LoadFailure::Rpc(error) = &mut answer.result {
            error.code = -32602;
        }
        assert_eq!(
            verdict(&answer, AgentProfile::ClaudeCodeAcp),
            LoadVerdict::Inconclusive
        );
    }

    #[test]
    fn claude_session_not_found_in_message_not_details_is_inconclusive() {
        let answer = rpc(ErrorAnswer::INTERNAL_ERROR, "Session not found");
        assert_eq!(
            verdict(&answer, AgentProfile::ClaudeCodeAcp),
            LoadVerdict::Inconclusive
        );
    }

    #[test]
    fn claude_code_acp_before_load_support_falls_back_on_absent_capability() {
        let mut answer = rpc(-32601, "\"Method not found\": session/load");
        answer.load_capability = None;
        assert_every_profile(&answer, incompatible(ClassifyReason::CapabilityAbsent));
    }

    #[test]
    fn codex_acp_rust_resource_not_found_without_data_falls_back() {
        let answer = rpc(-32002, "Resource not found");
        assert_every_profile(&answer, incompatible(ClassifyReason::ResourceNotFound));
    }

    #[test]
    fn codex_acp_rust_auth_check_before_load_is_inconclusive() {
        assert_every_profile(
            &rpc(-32000, "Authentication required"),
            inconclusive(ClassifyReason::AuthRequired),
        );
    }

    #[test]
    fn codex_acp_ts_no_rollout_for_requested_session_falls_back_with_its_profile() {
        let expected = incompatible(ClassifyReason::ExactProjection(
            Projection::CodexNoRolloutForSession,
        ));
        let text = format!("no rollout found for thread id {SESSION}");
        // In the message, or where the TypeScript SDK puts a plain Error's message.
        assert_eq!(
            classify(&rpc(-32603, &text), AgentProfile::CodexAcpTs),
            expected
        );
        assert_eq!(
            classify(&ts_internal(&text), AgentProfile::CodexAcpTs),
            expected
        );
    }

    #[test]
    fn codex_acp_ts_no_rollout_for_another_session_is_inconclusive() {
        let text = "no rollout found for thread id 0199a3c4-0000-0000-0000-000000000000";
        assert_eq!(
            verdict(&rpc(-32603, text), AgentProfile::CodexAcpTs),
            LoadVerdict::Inconclusive
        );
        assert_eq!(
            verdict(&ts_internal(text), AgentProfile::CodexAcpTs),
            LoadVerdict::Inconclusive
        );
    }

    #[test]
    fn codex_acp_ts_no_rollout_with_anything_around_it_is_inconclusive() {
        for text in [
            format!("no rollout found for thread id {SESSION} "),
            format!("thread/resume failed: no rollout found for thread id {SESSION}"),
            format!("No rollout found for thread id {SESSION}"),
            format!("no rollout found for thread id {}", SESSION.to_uppercase()),
            "no rollout found for thread id ".to_owned(),
        ] {
            assert_eq!(
                verdict(&rpc(-32603, &text), AgentProfile::CodexAcpTs),
                LoadVerdict::Inconclusive,
                "{text:?}"
            );
        }
    }

    #[test]
    fn codex_acp_ts_no_rollout_is_inconclusive_for_other_profiles() {
        let text = format!("no rollout found for thread id {SESSION}");
        for profile in AgentProfile::ALL {
            if profile != AgentProfile::CodexAcpTs {
                assert_eq!(
                    verdict(&rpc(-32603, &text), profile),
                    LoadVerdict::Inconclusive
                );
            }
        }
    }

    #[test]
    fn codex_acp_ts_no_rollout_under_another_code_is_inconclusive() {
        // The app-server's own code (−32600) reaching us unwrapped is not the documented
        // projection.
        let text = format!("no rollout found for thread id {SESSION}");
        assert_eq!(
            classify(&rpc(-32600, &text), AgentProfile::CodexAcpTs),
            inconclusive(ClassifyReason::InvalidRequest)
        );
    }

    #[test]
    fn codex_acp_ts_process_exited_code_with_open_transport_is_inconclusive() {
        // CODEX_PROCESS_EXITED_ERROR_CODE: the codex child died, the ACP connection did not.
        let answer = rpc(1001, "Codex process has exited with code 1");
        assert_every_profile(&answer, inconclusive(ClassifyReason::UnknownCode(1001)));
    }

    #[test]
    fn gemini_cli_invalid_session_identifier_is_inconclusive() {
        let answer = ts_internal(&format!(
            "Invalid session identifier \"{SESSION}\".\n  Searched for sessions in \
             /home/u/.gemini/tmp/abc/chats.\n  Use --list-sessions to see available \
             sessions, then use --resume {{number}}, --resume {{uuid}}, or --resume latest."
        ));
        assert_every_profile(&answer, inconclusive(ClassifyReason::InternalError));
    }

    #[test]
    fn gemini_cli_no_previous_sessions_is_inconclusive() {
        let answer = ts_internal("No previous sessions found for this project.");
        assert_every_profile(&answer, inconclusive(ClassifyReason::InternalError));
    }

    #[test]
    fn goose_invalid_params_failed_to_load_is_inconclusive() {
        let answer = with_data(rpc(-32602, "Invalid params"));
        assert_every_profile(&answer, inconclusive(ClassifyReason::InvalidParams));
    }

    #[test]
    fn goose_resource_not_found_with_session_data_falls_back() {
        let answer = with_data(rpc(-32002, "Resource not found"));
        assert_every_profile(&answer, incompatible(ClassifyReason::ResourceNotFound));
    }

    #[test]
    fn opencode_internal_error_is_inconclusive() {
        let answer = with_data(rpc(-32603, "Internal error"));
        assert_every_profile(&answer, inconclusive(ClassifyReason::InternalError));
    }

    #[test]
    fn agent_without_session_load_method_falls_back() {
        assert_every_profile(
            &rpc(-32601, "Method not found"),
            incompatible(ClassifyReason::MethodNotFound),
        );
    }

    // ---- Rule 6, one test per clause. ----

    #[test]
    fn capability_absent_falls_back() {
        let mut answer = rpc(-32603, "Internal error");
        answer.load_capability = None;
        assert_every_profile(&answer, incompatible(ClassifyReason::CapabilityAbsent));
    }

    #[test]
    fn capability_false_falls_back() {
        let mut answer = outcome(LoadFailure::TimedOut);
        answer.load_capability = Some(false);
        assert_every_profile(&answer, incompatible(ClassifyReason::CapabilityFalse));
    }

    #[test]
    fn cancelled_load_is_inconclusive_even_without_capability() {
        for capability in [None, Some(false), Some(true)] {
            let mut answer = outcome(LoadFailure::Cancelled);
            answer.load_capability = capability;
            assert_every_profile(&answer, inconclusive(ClassifyReason::Cancelled));
        }
    }

    #[test]
    fn timeout_is_inconclusive() {
        assert_every_profile(
            &outcome(LoadFailure::TimedOut),
            inconclusive(ClassifyReason::TimedOut),
        );
    }

    #[test]
    fn internal_error_is_inconclusive() {
        assert_every_profile(
            &rpc(-32603, "Internal error"),
            inconclusive(ClassifyReason::InternalError),
        );
    }

    #[test]
    fn auth_required_is_inconclusive() {
        assert_every_profile(
            &rpc(-32000, "Authentication required"),
            inconclusive(ClassifyReason::AuthRequired),
        );
    }

    #[test]
    fn request_cancelled_code_is_inconclusive() {
        assert_every_profile(
            &rpc(-32800, "Request cancelled"),
            inconclusive(ClassifyReason::RequestCancelled),
        );
    }

    #[test]
    fn unknown_codes_are_inconclusive() {
        for code in [0, 1, -1, -32001, -32099, -32700, i64::MIN, i64::MAX] {
            assert_every_profile(
                &rpc(code, "Resource not found"),
                inconclusive(ClassifyReason::UnknownCode(code)),
            );
        }
    }

    #[test]
    fn transport_closed_is_transport_dead_whatever_the_answer() {
        for result in [
            LoadFailure::Rpc(ErrorAnswer::new(-32002, "Resource not found")),
            LoadFailure::TimedOut,
            LoadFailure::Cancelled,
        ] {
            let mut answer = outcome(result);
            answer.transport = TransportState::Closed;
            answer.load_capability = None;
            assert_every_profile(
                &answer,
                Classification {
                    verdict: LoadVerdict::TransportDead,
                    reason: ClassifyReason::TransportClosed,
                },
            );
        }
    }

    #[test]
    fn process_exited_is_transport_dead() {
        let mut answer = rpc(-32601, "Method not found");
        answer.transport = TransportState::ProcessExited;
        assert_every_profile(
            &answer,
            Classification {
                verdict: LoadVerdict::TransportDead,
                reason: ClassifyReason::ProcessExited,
            },
        );
    }

    #[test]
    fn no_code_or_message_declares_the_transport_dead() {
        for (code, message) in [
            (1001, "Codex process has exited with code 1"),
            (-32000, "transport closed"),
            (-32603, "broken pipe"),
            (-32099, "connection reset"),
        ] {
            for profile in AgentProfile::ALL {
                assert_ne!(
                    verdict(&rpc(code, message), profile),
                    LoadVerdict::TransportDead
                );
            }
        }
    }

    #[test]
    fn substring_not_found_in_message_is_inconclusive() {
        assert_every_profile(
            &rpc(-32603, "resource not found while resolving configuration"),
            inconclusive(ClassifyReason::InternalError),
        );
    }

    #[test]
    fn substring_not_found_in_details_is_inconclusive() {
        assert_every_profile(
            &ts_internal("ENOENT: config file not found: /etc/agent.toml"),
            inconclusive(ClassifyReason::InternalError),
        );
    }

    #[test]
    fn resource_not_found_projection_for_requested_session_falls_back() {
        // A boundary that flattened −32002 to an internal error kept the SDK's message.
        assert_every_profile(
            &rpc(-32603, &format!("Resource not found: {SESSION}")),
            incompatible(ClassifyReason::ExactProjection(
                Projection::ResourceNotFoundForSession,
            )),
        );
    }

    #[test]
    fn resource_not_found_projection_for_another_resource_is_inconclusive() {
        for message in [
            "Resource not found: /home/u/project/README.md".to_owned(),
            format!("Resource not found: {SESSION}x"),
            format!("Resource not found:  {SESSION}"),
            format!("resource not found: {SESSION}"),
            "Resource not found".to_owned(),
            "Resource not found: ".to_owned(),
        ] {
            assert_every_profile(
                &rpc(-32603, &message),
                inconclusive(ClassifyReason::InternalError),
            );
        }
    }

    #[test]
    fn resource_not_found_projection_never_matches_an_empty_session() {
        let mut answer = rpc(-32603, "Resource not found: ");
        answer.requested_session = String::new();
        assert_every_profile(&answer, inconclusive(ClassifyReason::InternalError));
    }

    #[test]
    fn session_load_method_not_found_projection_falls_back() {
        assert_every_profile(
            &rpc(-32603, "\"Method not found\": session/load"),
            incompatible(ClassifyReason::ExactProjection(
                Projection::SessionLoadMethodNotFound,
            )),
        );
    }

    #[test]
    fn method_not_found_projection_for_another_method_is_inconclusive() {
        for message in [
            "Method not found",
            "\"Method not found\": fs/read_text_file",
            "\"Method not found\": session/load ",
        ] {
            assert_every_profile(
                &rpc(-32603, message),
                inconclusive(ClassifyReason::InternalError),
            );
        }
    }

    #[test]
    fn auth_required_code_outweighs_projection_text() {
        let answer = rpc(-32000, &format!("Resource not found: {SESSION}"));
        assert_every_profile(&answer, inconclusive(ClassifyReason::AuthRequired));
        let answer = rpc(-32800, "\"Method not found\": session/load");
        assert_every_profile(&answer, inconclusive(ClassifyReason::RequestCancelled));
    }

    #[test]
    fn mebibyte_message_around_a_projection_is_inconclusive() {
        let mut message = format!("Resource not found: {SESSION}");
        message.push_str(&" ".repeat(MIB));
        assert_every_profile(
            &rpc(-32603, &message),
            inconclusive(ClassifyReason::InternalError),
        );
        let mut message = "x".repeat(MIB);
        message.push_str(&format!("no rollout found for thread id {SESSION}"));
        assert_eq!(
            verdict(&rpc(-32603, &message), AgentProfile::CodexAcpTs),
            LoadVerdict::Inconclusive
        );
    }

    #[test]
    fn mebibyte_session_id_projection_still_matches_exactly() {
        let session = "s".repeat(MIB);
        let mut answer = rpc(-32603, &format!("Resource not found: {session}"));
        answer.requested_session = session;
        assert_eq!(
            verdict(&answer, AgentProfile::Generic),
            LoadVerdict::Incompatible
        );
    }

    #[test]
    fn classify_is_classify_with_no_mutant() {
        for answer in [
            rpc(-32603, "resource not found while resolving configuration"),
            outcome(LoadFailure::TimedOut),
        ] {
            for profile in AgentProfile::ALL {
                assert_eq!(
                    classify(&answer, profile),
                    classify_with(&answer, profile, ActiveMutant::NONE)
                );
            }
        }
    }

    #[test]
    fn outcome_and_classification_survive_a_json_round_trip() {
        let answer = ts_internal("Session not found");
        let json = serde_json::to_string(&answer).expect("a LoadOutcome always serializes");
        let back: LoadOutcome = serde_json::from_str(&json).expect("our own JSON parses");
        assert_eq!(back, answer);
        let classification = classify(&answer, AgentProfile::ClaudeCodeAcp);
        let json = serde_json::to_string(&classification).expect("always serializes");
        let back: Classification = serde_json::from_str(&json).expect("our own JSON parses");
        assert_eq!(back, classification);
    }

    // ---- The two mutants that live here: the tests above must see them. ----

    #[cfg(feature = "mutants")]
    mod mutants {
        use super::*;
        use crate::mutants::Mutant;

        fn flips(answer: &LoadOutcome, mutant: Mutant) -> bool {
            AgentProfile::ALL.into_iter().all(|profile| {
                classify_with(answer, profile, ActiveMutant::NONE).verdict
                    == LoadVerdict::Inconclusive
                    && classify_with(answer, profile, ActiveMutant::on(mutant)).verdict
                        == LoadVerdict::Incompatible
            })
        }

        #[test]
        fn substring_fallback_mutant_replaces_configuration_not_found() {
            assert!(flips(
                &rpc(-32603, "resource not found while resolving configuration"),
                Mutant::SubstringFallback
            ));
        }

        #[test]
        fn substring_fallback_mutant_replaces_other_resources_not_found() {
            assert!(flips(
                &rpc(-32603, "Resource not found: /home/u/project/README.md"),
                Mutant::SubstringFallback
            ));
            assert!(flips(
                &rpc(-32000, "credentials not found"),
                Mutant::SubstringFallback
            ));
        }

        #[test]
        fn timeout_fallback_mutant_replaces_a_slow_load() {
            assert!(flips(
                &outcome(LoadFailure::TimedOut),
                Mutant::TimeoutFallback
            ));
        }

        #[test]
        fn listed_conversation_replaced_mutant_ignores_the_agents_list() {
            let mut answer = with_data(rpc(-32002, &format!("Resource not found: {SESSION}")));
            answer.listing = SessionListing::Listed;
            assert!(flips(&answer, Mutant::ListedConversationReplaced));
        }

        #[test]
        fn mutants_never_hide_a_dead_transport() {
            let mut answer = outcome(LoadFailure::TimedOut);
            answer.transport = TransportState::ProcessExited;
            for mutant in Mutant::ALL {
                assert_eq!(
                    classify_with(&answer, AgentProfile::Generic, ActiveMutant::on(mutant)).verdict,
                    LoadVerdict::TransportDead
                );
            }
        }

        #[test]
        fn mutants_of_other_modules_leave_classification_alone() {
            let answers = [
                rpc(-32603, "resource not found while resolving configuration"),
                outcome(LoadFailure::TimedOut),
                rpc(-32002, "Resource not found"),
                ts_internal("Session not found"),
            ];
            for mutant in Mutant::ALL {
                if matches!(
                    mutant,
                    Mutant::SubstringFallback
                        | Mutant::TimeoutFallback
                        | Mutant::ListedConversationReplaced
                ) {
                    continue;
                }
                for answer in &answers {
                    for profile in AgentProfile::ALL {
                        assert_eq!(
                            classify_with(answer, profile, ActiveMutant::on(mutant)),
                            classify(answer, profile),
                            "{mutant:?}"
                        );
                    }
                }
            }
        }
    }

    // ---- Totality. ----

    /// Texts near the projections, so the property meets the exact matches and their
    /// neighbours, not only random noise.
    const NEAR_MISSES: [&str; 8] = [
        "Resource not found: ",
        "Resource not found",
        "\"Method not found\": session/load",
        "Session not found",
        "no rollout found for thread id ",
        "Internal error",
        "resource not found while resolving configuration",
        "",
    ];

    fn text(session: String) -> impl Strategy<Value = String> {
        let near = proptest::sample::select(NEAR_MISSES.to_vec());
        prop_oneof![
            4 => any::<String>(),
            3 => (near.clone(), any::<bool>()).prop_map(move |(head, with_session)| {
                if with_session {
                    format!("{head}{session}")
                } else {
                    head.to_owned()
                }
            }),
            // Up to a mebibyte: a near miss followed or preceded by filler.
            1 => (near, 0..=MIB, any::<char>(), any::<bool>()).prop_map(
                |(head, len, filler, filler_first)| {
                    let filler: String =
                        std::iter::repeat_n(filler, len / filler.len_utf8()).collect();
                    if filler_first {
                        filler + head
                    } else {
                        format!("{head}{filler}")
                    }
                }
            ),
        ]
    }

    fn load_outcome() -> impl Strategy<Value = LoadOutcome> {
        let session = prop_oneof![
            Just(String::new()),
            Just(SESSION.to_owned()),
            "[a-z0-9-]{1,12}",
            any::<String>(),
        ];
        session.prop_flat_map(|session| {
            let code = prop_oneof![
                proptest::sample::select(vec![
                    -32700i64, -32600, -32601, -32602, -32603, -32000, -32002, -32800, 1001, 0,
                ]),
                any::<i64>(),
            ];
            let error = (
                code,
                text(session.clone()),
                proptest::option::of(text(session.clone())),
                any::<bool>(),
            )
                .prop_map(|(code, message, data_details, data_present)| ErrorAnswer {
                    code,
                    message,
                    data_present: data_present || data_details.is_some(),
                    data_details,
                });
            let result = prop_oneof![
                6 => error.prop_map(LoadFailure::Rpc),
                1 => Just(LoadFailure::TimedOut),
                1 => Just(LoadFailure::Cancelled),
            ];
            let transport = prop_oneof![
                4 => Just(TransportState::Open),
                1 => Just(TransportState::Closed),
                1 => Just(TransportState::ProcessExited),
            ];
            let listing = prop_oneof![
                Just(SessionListing::Unknown),
                Just(SessionListing::Listed),
                Just(SessionListing::NotListed),
            ];
            (
                proptest::option::of(any::<bool>()),
                Just(session),
                result,
                transport,
                listing,
            )
                .prop_map(
                    |(load_capability, requested_session, result, transport, listing)| {
                        LoadOutcome {
                            load_capability,
                            requested_session,
                            result,
                            transport,
                            listing,
                        }
                    },
                )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn classify_is_total_and_decides_transport_death_from_transport_only(
            answer in load_outcome(),
        ) {
            let generic = classify(&answer, AgentProfile::Generic);
            for profile in AgentProfile::ALL {
                let classification = classify(&answer, profile);
                prop_assert_eq!(
                    classification.verdict == LoadVerdict::TransportDead,
                    answer.transport != TransportState::Open
                );
                prop_assert_eq!(classification.verdict, classification.reason.verdict());
                // A profile only adds proof: it falls back whenever Generic does.
                if generic.verdict == LoadVerdict::Incompatible {
                    prop_assert_eq!(classification, generic);
                }
                // Timeouts, cancellations and the "why not" codes never fall back.
                let never = match &answer.result {
                    LoadFailure::Cancelled => true,
                    LoadFailure::TimedOut => answer.load_capability == Some(true),
                    LoadFailure::Rpc(error) => {
                        answer.load_capability == Some(true)
                            && matches!(
                                error.code,
                                ErrorAnswer::AUTH_REQUIRED | ErrorAnswer::REQUEST_CANCELLED
                            )
                    }
                };
                if never {
                    prop_assert_ne!(classification.verdict, LoadVerdict::Incompatible);
                }
            }
        }
    }
}
