//! ACP v1 wire helpers on top of the official schema crate.
//!
//! Payloads are built with `agent-client-protocol-schema`'s types, so what we send is the
//! real wire format. Answers are read from raw [`Value`]s only where the typed reading
//! would hide something the core must see (see [`load_session_support`]).

use std::path::PathBuf;

use agent_client_protocol_schema::v1::{
    CancelNotification, Implementation, InitializeRequest, LoadSessionRequest, NewSessionRequest,
    PromptRequest, AGENT_METHOD_NAMES, CLIENT_METHOD_NAMES,
};
use agent_client_protocol_schema::ProtocolVersion;
use serde::Serialize;
use serde_json::Value;

pub use agent_client_protocol_schema::v1 as schema;

/// `initialize`: client → agent request.
pub const INITIALIZE: &str = AGENT_METHOD_NAMES.initialize;
/// `session/new`: client → agent request.
pub const SESSION_NEW: &str = AGENT_METHOD_NAMES.session_new;
/// `session/load`: client → agent request.
pub const SESSION_LOAD: &str = AGENT_METHOD_NAMES.session_load;
/// `session/prompt`: client → agent request.
pub const SESSION_PROMPT: &str = AGENT_METHOD_NAMES.session_prompt;
/// `session/cancel`: client → agent notification.
pub const SESSION_CANCEL: &str = AGENT_METHOD_NAMES.session_cancel;
/// `session/update`: agent → client notification.
pub const SESSION_UPDATE: &str = CLIENT_METHOD_NAMES.session_update;
/// `session/list`: client → agent request (an unstable ACP method; the schema crate keeps
/// it behind a feature, so it is spelled out here).
pub const SESSION_LIST: &str = "session/list";

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// What an agent's `initialize` answer says about `session/load`.
///
/// Three values, not a bool: the schema crate reads a malformed `loadSession` (say
/// `"yes"`) as `false`, and `false` is positive proof that allows replacing a
/// conversation with `session/new`. A malformed answer proves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadSessionSupport {
    /// `agentCapabilities.loadSession` is `true`.
    Advertised,
    /// `loadSession` is `false`, or absent (the spec's default is `false`).
    NotAdvertised,
    /// `agentCapabilities` or `loadSession` is present but not of the right type.
    Malformed,
}

/// Reads `agentCapabilities.loadSession` from a raw `initialize` result.
#[must_use]
pub fn load_session_support(initialize_result: &Value) -> LoadSessionSupport {
    let Some(object) = initialize_result.as_object() else {
        return LoadSessionSupport::Malformed;
    };
    let capabilities = match object.get("agentCapabilities") {
        None | Some(Value::Null) => return LoadSessionSupport::NotAdvertised,
        Some(Value::Object(capabilities)) => capabilities,
        Some(_) => return LoadSessionSupport::Malformed,
    };
    match capabilities.get("loadSession") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => LoadSessionSupport::NotAdvertised,
        Some(Value::Bool(true)) => LoadSessionSupport::Advertised,
        Some(_) => LoadSessionSupport::Malformed,
    }
}

/// Whether an agent's `initialize` answer advertises `session/list`
/// (`agentCapabilities.sessionCapabilities.list`, an object; `true` is read the same).
#[must_use]
pub fn list_sessions_support(initialize_result: &Value) -> bool {
    let list = initialize_result
        .get("agentCapabilities")
        .and_then(|c| c.get("sessionCapabilities"))
        .and_then(|c| c.get("list"));
    matches!(list, Some(Value::Object(_) | Value::Bool(true)))
}

/// `session/list` params: every session, from `cursor` on.
#[must_use]
pub fn list_sessions_params(cursor: Option<&str>) -> Value {
    match cursor {
        Some(cursor) => serde_json::json!({ "cursor": cursor }),
        None => serde_json::json!({}),
    }
}

/// What a `session/list` answer says about `session_id`: `Some(true)` listed,
/// `Some(false)` not on this page, `None` not a list at all. The cursor of the next page
/// comes with it when there is one.
#[must_use]
pub fn listed_in(answer: &Value, session_id: &str) -> (Option<bool>, Option<String>) {
    let Some(sessions) = answer.get("sessions").and_then(Value::as_array) else {
        return (None, None);
    };
    let listed = sessions
        .iter()
        .any(|s| s.get("sessionId").and_then(Value::as_str) == Some(session_id));
    let next = answer
        .get("nextCursor")
        .and_then(Value::as_str)
        .map(str::to_owned);
    (Some(listed), next)
}

fn to_params(payload: &impl Serialize) -> Value {
    serde_json::to_value(payload)
        .expect("ACP payload structs have string keys only, so they always serialize")
}

/// `initialize` params: protocol version 1, default client capabilities, our name.
#[must_use]
pub fn initialize_params(client_name: &str, client_version: &str) -> Value {
    to_params(
        &InitializeRequest::new(ProtocolVersion::V1)
            .client_info(Implementation::new(client_name, client_version)),
    )
}

/// `session/new` params for a working directory (absolute, per the spec).
#[must_use]
pub fn new_session_params(cwd: impl Into<PathBuf>) -> Value {
    to_params(&NewSessionRequest::new(cwd))
}

/// `session/load` params for an existing conversation.
#[must_use]
pub fn load_session_params(session_id: &str, cwd: impl Into<PathBuf>) -> Value {
    to_params(&LoadSessionRequest::new(session_id.to_owned(), cwd))
}

/// `session/prompt` params with one text block.
#[must_use]
pub fn prompt_params(session_id: &str, text: &str) -> Value {
    to_params(&PromptRequest::new(
        session_id.to_owned(),
        vec![text.into()],
    ))
}

/// `session/cancel` params.
#[must_use]
pub fn cancel_params(session_id: &str) -> Value {
    to_params(&CancelNotification::new(session_id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn method_names_are_the_acp_v1_names() {
        assert_eq!(INITIALIZE, "initialize");
        assert_eq!(SESSION_NEW, "session/new");
        assert_eq!(SESSION_LOAD, "session/load");
        assert_eq!(SESSION_PROMPT, "session/prompt");
        assert_eq!(SESSION_CANCEL, "session/cancel");
        assert_eq!(SESSION_UPDATE, "session/update");
    }

    #[test]
    fn load_session_support_is_read_strictly() {
        let support = |v: Value| load_session_support(&v);
        assert_eq!(
            support(json!({"agentCapabilities": {"loadSession": true}})),
            LoadSessionSupport::Advertised
        );
        assert_eq!(
            support(json!({"agentCapabilities": {"loadSession": false}})),
            LoadSessionSupport::NotAdvertised
        );
        assert_eq!(
            support(json!({"agentCapabilities": {}})),
            LoadSessionSupport::NotAdvertised
        );
        assert_eq!(
            support(json!({"protocolVersion": 1})),
            LoadSessionSupport::NotAdvertised
        );
        assert_eq!(
            support(json!({"agentCapabilities": {"loadSession": "yes"}})),
            LoadSessionSupport::Malformed
        );
        assert_eq!(
            support(json!({"agentCapabilities": []})),
            LoadSessionSupport::Malformed
        );
        assert_eq!(support(json!("x")), LoadSessionSupport::Malformed);
    }

    #[test]
    fn session_list_is_read_from_capabilities_and_answers() {
        assert!(list_sessions_support(
            &json!({"agentCapabilities": {"sessionCapabilities": {"list": {}}}})
        ));
        assert!(!list_sessions_support(
            &json!({"agentCapabilities": {"loadSession": true}})
        ));
        assert!(!list_sessions_support(
            &json!({"agentCapabilities": {"sessionCapabilities": {"list": "yes"}}})
        ));
        let page = json!({"sessions": [{"sessionId": "s1", "cwd": "/"}], "nextCursor": "c2"});
        assert_eq!(listed_in(&page, "s1"), (Some(true), Some("c2".into())));
        assert_eq!(listed_in(&page, "s2"), (Some(false), Some("c2".into())));
        assert_eq!(listed_in(&json!({"x": 1}), "s1"), (None, None));
        assert_eq!(list_sessions_params(None), json!({}));
        assert_eq!(list_sessions_params(Some("c2")), json!({"cursor": "c2"}));
    }

    #[test]
    fn params_have_the_wire_shape() {
        assert_eq!(
            load_session_params("s1", "/w"),
            json!({"sessionId": "s1", "cwd": "/w", "mcpServers": []})
        );
        assert_eq!(
            new_session_params("/w"),
            json!({"cwd": "/w", "mcpServers": []})
        );
        assert_eq!(
            prompt_params("s1", "hi"),
            json!({"sessionId": "s1", "prompt": [{"type": "text", "text": "hi"}]})
        );
        assert_eq!(cancel_params("s1"), json!({"sessionId": "s1"}));
        let init = initialize_params("palisade", "0.1.0");
        assert_eq!(init["protocolVersion"], json!(1));
        assert_eq!(init["clientInfo"]["name"], json!("palisade"));
    }
}
