//! The ACP agent side: what a client sends to an agent, read as a proxy needs it.
//!
//! A proxy in front of an ACP agent is an agent to its client. Each line the client writes
//! is one JSON-RPC message ([`parse_frame`] reads both directions alike); this module sorts
//! a client's requests by what the proxy must do with them and reads the few members it
//! needs (the session a request is about, a prompt's content blocks), leaving every other
//! member raw so that it passes on untouched.

use serde::Deserialize;

use crate::jsonrpc::{RawJson, RequestId};

/// A client's request to its agent, by what a proxy does with it.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientRequest {
    /// `initialize`: the client's capabilities and identity.
    Initialize(RawJson),
    /// `authenticate`.
    Authenticate(RawJson),
    /// `session/new`: its params (`cwd`, `mcpServers`, ...), kept for every conversation
    /// the proxy starts for the session.
    NewSession(RawJson),
    /// `session/load` of `session_id`, with its params.
    LoadSession {
        /// The session the client asks for.
        session_id: String,
        /// The whole params (`cwd`, `mcpServers`, ...).
        params: RawJson,
    },
    /// `session/list`.
    ListSessions(RawJson),
    /// `session/prompt`.
    Prompt {
        /// The session.
        session_id: String,
        /// The content blocks, as the client wrote them.
        prompt: RawJson,
    },
    /// Any other request naming a session (`session/set_mode`, `session/set_config_option`,
    /// an extension method with a `sessionId`): forwarded to that session's agent.
    ForSession {
        /// The method.
        method: String,
        /// The session it names.
        session_id: String,
        /// The whole params.
        params: RawJson,
    },
    /// An extension request (`_…`) naming no session.
    Extension {
        /// The method.
        method: String,
        /// The params.
        params: RawJson,
    },
    /// A method this proxy does not serve.
    Unknown {
        /// The method.
        method: String,
    },
}

/// A client's notification to its agent.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientNotification {
    /// `session/cancel` of a session.
    Cancel {
        /// The session.
        session_id: String,
    },
    /// Any other notification naming a session (forwarded to its agent).
    ForSession {
        /// The method.
        method: String,
        /// The session it names.
        session_id: String,
        /// The params.
        params: RawJson,
    },
    /// Any other notification (extension notifications are forwarded; others dropped).
    Other {
        /// The method.
        method: String,
        /// The params.
        params: RawJson,
    },
}

/// Why a client's request cannot be served as it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// A member the method needs is missing or of the wrong kind (JSON-RPC −32602).
    InvalidParams(&'static str),
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::InvalidParams(what) => write!(f, "invalid params: {what}"),
        }
    }
}

impl std::error::Error for RequestError {}

#[derive(Deserialize)]
struct Session<'a> {
    #[serde(rename = "sessionId", borrow)]
    session_id: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Deserialize)]
struct PromptParams<'a> {
    #[serde(rename = "sessionId", borrow)]
    session_id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    prompt: &'a serde_json::value::RawValue,
}

/// The `sessionId` a message's params name, if they are an object with a string one.
#[must_use]
pub fn session_of(params: &RawJson) -> Option<String> {
    params
        .parse::<Session<'_>>()
        .ok()
        .and_then(|s| s.session_id)
        .map(std::borrow::Cow::into_owned)
}

/// Sorts a client's request.
///
/// # Errors
///
/// [`RequestError::InvalidParams`] when a method the proxy serves lacks what it needs.
pub fn classify_request(method: &str, params: RawJson) -> Result<ClientRequest, RequestError> {
    Ok(match method {
        crate::acp::INITIALIZE => ClientRequest::Initialize(params),
        crate::acp::AUTHENTICATE => ClientRequest::Authenticate(params),
        crate::acp::SESSION_NEW => ClientRequest::NewSession(params),
        crate::acp::SESSION_LIST => ClientRequest::ListSessions(params),
        crate::acp::SESSION_LOAD => {
            let session_id = session_of(&params).ok_or(RequestError::InvalidParams("sessionId"))?;
            ClientRequest::LoadSession { session_id, params }
        }
        crate::acp::SESSION_PROMPT => {
            let parsed: PromptParams<'_> = params
                .parse()
                .map_err(|_| RequestError::InvalidParams("sessionId and prompt"))?;
            let prompt = RawJson::from(parsed.prompt);
            ClientRequest::Prompt {
                session_id: parsed.session_id.into_owned(),
                prompt,
            }
        }
        _ => match session_of(&params) {
            Some(session_id) if method.starts_with("session/") || method.starts_with('_') => {
                ClientRequest::ForSession {
                    method: method.to_owned(),
                    session_id,
                    params,
                }
            }
            _ if method.starts_with('_') => ClientRequest::Extension {
                method: method.to_owned(),
                params,
            },
            _ => ClientRequest::Unknown {
                method: method.to_owned(),
            },
        },
    })
}

/// Sorts a client's notification.
#[must_use]
pub fn classify_notification(method: &str, params: RawJson) -> ClientNotification {
    match (method, session_of(&params)) {
        (crate::acp::SESSION_CANCEL, Some(session_id)) => ClientNotification::Cancel { session_id },
        (_, Some(session_id)) => ClientNotification::ForSession {
            method: method.to_owned(),
            session_id,
            params,
        },
        _ => ClientNotification::Other {
            method: method.to_owned(),
            params,
        },
    }
}

/// `params` with its top-level `sessionId` replaced by `session_id` (the other members as
/// they were). `None` when `params` is not an object.
#[must_use]
pub fn with_session(params: &RawJson, session_id: &str) -> Option<RawJson> {
    let mut members: serde_json::Map<String, serde_json::Value> = params.parse().ok()?;
    members.insert(
        "sessionId".to_owned(),
        serde_json::Value::String(session_id.to_owned()),
    );
    Some(RawJson::from_value(&serde_json::Value::Object(members)))
}

/// An id of ours for a request we send the client, standing for the agent's own id.
#[must_use]
pub fn proxy_request_id(n: u64) -> RequestId {
    RequestId::Number(i64::try_from(n).unwrap_or(i64::MAX))
}
