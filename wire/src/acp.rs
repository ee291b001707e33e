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
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::jsonrpc::{
    encode_message, parse_frame_typed, Frame, FrameError, JsonStr, RawJson, RequestId, TypedFrame,
};

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
/// `authenticate`.
pub const AUTHENTICATE: &str = AGENT_METHOD_NAMES.authenticate;
/// `session/request_permission` (agent → client).
pub const SESSION_REQUEST_PERMISSION: &str = CLIENT_METHOD_NAMES.session_request_permission;

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// What a `session/update` notification's params say: whose session, and the update.
///
/// Read by serde, borrowed from the line, in the same pass as the envelope when the agent
/// writes `method` before `params` ([`parse_agent_frame`]); the update
/// itself is kept raw (unknown update kinds pass through untouched).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionUpdate {
    /// `sessionId`.
    pub session_id: Option<String>,
    /// `update`, as written (`None` when absent or `null`).
    pub update: Option<RawJson>,
}

impl SessionUpdate {
    /// What the params `params` say; neither member if they are not an object of that
    /// shape (a member of the wrong type, or given twice).
    #[must_use]
    pub fn of(params: &RawValue) -> SessionUpdate {
        serde_json::from_str::<UpdateParams<'_>>(params.get())
            .map(|params| params.to_update())
            .unwrap_or_default()
    }
}

/// The params of a `session/update` as serde reads them, borrowed from the text.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct UpdateParams<'a> {
    #[serde(rename = "sessionId", borrow, default)]
    session_id: Option<JsonStr<'a>>,
    #[serde(borrow, default)]
    update: Option<&'a RawValue>,
}

impl UpdateParams<'_> {
    /// What they say, owned.
    pub(crate) fn to_update(&self) -> SessionUpdate {
        SessionUpdate {
            session_id: self.session_id.as_ref().map(|id| id.as_str().to_owned()),
            update: self.update.map(RawJson::from),
        }
    }
}

/// What an agent wrote on one line: a `session/update` notification (the bulk of what
/// agents write) with its params read, or any other message.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentFrame {
    /// A `session/update` notification.
    Update(SessionUpdate),
    /// Any other message.
    Other(Frame),
}

/// [`crate::jsonrpc::parse_frame`] for a line an agent wrote: a `session/update`
/// notification comes back as a [`SessionUpdate`], its params read by serde in the same
/// pass as the envelope when the agent writes `method` before `params`
/// ([`parse_frame_typed`]). What it holds is what [`SessionUpdate::of`] reads from the
/// notification's params, however the line is written.
pub fn parse_agent_frame(line: &[u8]) -> Result<AgentFrame, FrameError> {
    Ok(
        match parse_frame_typed::<UpdateParams<'_>>(line, SESSION_UPDATE)? {
            TypedFrame::Typed(params) => AgentFrame::Update(params.to_update()),
            // Written otherwise (escaped, params first, params of another shape): rare.
            TypedFrame::Other(Frame::Notification { method, params })
                if method == SESSION_UPDATE =>
            {
                AgentFrame::Update(SessionUpdate::of(params.raw()))
            }
            TypedFrame::Other(frame) => AgentFrame::Other(frame),
        },
    )
}

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

/// What an agent's `initialize` answer says about sessions, as the engine reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSupport {
    /// `agentCapabilities.loadSession` ([`load_session_support`]).
    pub load: LoadSessionSupport,
    /// `loadSession` is the literal `false` (not absent, not `null`).
    pub load_false: bool,
    /// [`list_sessions_support`].
    pub list: bool,
}

/// [`SessionSupport`] read from a tree of the answer.
#[must_use]
pub fn session_support_of_tree(initialize_result: &Value) -> SessionSupport {
    SessionSupport {
        load: load_session_support(initialize_result),
        load_false: initialize_result
            .get("agentCapabilities")
            .and_then(|c| c.get("loadSession"))
            == Some(&Value::Bool(false)),
        list: list_sessions_support(initialize_result),
    }
}

/// [`SessionSupport`] of a raw `initialize` answer. An answer that no tree can hold (a
/// number beyond `f64`, nesting past serde's limit) proves nothing: `loadSession` reads
/// as malformed.
#[must_use]
pub fn session_support(initialize_result: &RawJson) -> SessionSupport {
    match initialize_result.parse::<Value>() {
        Ok(tree) => session_support_of_tree(&tree),
        Err(_) => SessionSupport {
            load: LoadSessionSupport::Malformed,
            load_false: false,
            list: false,
        },
    }
}

/// The string member `name` of a raw answer (`sessionId` of `session/new`, `stopReason` of
/// `session/prompt`): `None` when absent or not a string, or when the answer is not an
/// object (or not one a tree can hold).
#[must_use]
pub fn string_member(answer: &RawJson, name: &str) -> Option<String> {
    match answer.parse::<Value>().ok()?.get_mut(name)?.take() {
        Value::String(value) => Some(value),
        _ => None,
    }
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

/// The name Palisade gives itself in `initialize`.
pub const CLIENT_NAME: &str = "palisade-supervise";

/// The params of a request or notification the engine sends, kept as their parts and
/// serialized into the line ([`Params::request_line`]) as the schema crate's types: the
/// same bytes as the tree the `*_params` builders below make (a test compares the two on
/// arbitrary texts).
#[derive(Debug, Clone, PartialEq)]
pub enum Params {
    /// `initialize` of [`CLIENT_NAME`] at this crate's version.
    Initialize,
    /// `session/new` in `cwd`.
    NewSession {
        /// The working directory.
        cwd: PathBuf,
    },
    /// `session/load` of `session_id` in `cwd`.
    LoadSession {
        /// The conversation to load.
        session_id: String,
        /// The working directory.
        cwd: PathBuf,
    },
    /// `session/list` from `cursor`.
    ListSessions {
        /// The page to start from.
        cursor: Option<String>,
    },
    /// `session/prompt` of one text block.
    Prompt {
        /// The conversation.
        session_id: String,
        /// The prompt's text.
        text: String,
    },
    /// `session/cancel`.
    Cancel {
        /// The conversation.
        session_id: String,
    },
    /// Any other params, as a tree (`null`: none).
    Tree(Value),
    /// Params as someone else wrote them (a client's, passed on by a proxy).
    Raw(RawJson),
}

impl From<Value> for Params {
    fn from(value: Value) -> Params {
        Params::Tree(value)
    }
}

/// `session/list`'s params (the schema crate keeps its type behind a feature).
#[derive(Serialize)]
struct ListSessionsText<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    cursor: Option<&'a str>,
}

impl Params {
    /// The text of a `session/prompt`'s one text block.
    #[must_use]
    pub fn prompt_text(&self) -> Option<&str> {
        match self {
            Params::Prompt { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The params as a tree, built by the `*_params` builders.
    #[must_use]
    pub fn to_value(&self) -> Value {
        match self {
            Params::Initialize => initialize_params(CLIENT_NAME, env!("CARGO_PKG_VERSION")),
            Params::NewSession { cwd } => new_session_params(cwd.clone()),
            Params::LoadSession { session_id, cwd } => load_session_params(session_id, cwd.clone()),
            Params::ListSessions { cursor } => list_sessions_params(cursor.as_deref()),
            Params::Prompt { session_id, text } => prompt_params(session_id, text),
            Params::Cancel { session_id } => cancel_params(session_id),
            Params::Tree(value) => value.clone(),
            Params::Raw(raw) => raw.parse().unwrap_or(Value::Null),
        }
    }

    /// The request `id` of `method` with these params, as one line (newline included).
    #[must_use]
    pub fn request_line(&self, id: &RequestId, method: &str) -> String {
        encode_message(Some(id), method, self.given())
    }

    /// The notification `method` with these params, as one line (newline included).
    #[must_use]
    pub fn notification_line(&self, method: &str) -> String {
        encode_message(None, method, self.given())
    }

    /// The params to write: none for a tree of `null`.
    fn given(&self) -> Option<&Params> {
        (!matches!(self, Params::Tree(Value::Null))).then_some(self)
    }
}

impl Serialize for Params {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // A path that is not UTF-8 fails here, as it fails the schema's serialization.
        match self {
            Params::Initialize => {
                initialize_request(CLIENT_NAME, env!("CARGO_PKG_VERSION")).serialize(serializer)
            }
            Params::NewSession { cwd } => NewSessionRequest::new(cwd.clone()).serialize(serializer),
            Params::LoadSession { session_id, cwd } => {
                LoadSessionRequest::new(session_id.clone(), cwd.clone()).serialize(serializer)
            }
            Params::ListSessions { cursor } => ListSessionsText {
                cursor: cursor.as_deref(),
            }
            .serialize(serializer),
            Params::Prompt { session_id, text } => {
                PromptRequest::new(session_id.clone(), vec![text.as_str().into()])
                    .serialize(serializer)
            }
            Params::Cancel { session_id } => {
                CancelNotification::new(session_id.clone()).serialize(serializer)
            }
            Params::Tree(value) => value.serialize(serializer),
            Params::Raw(raw) => raw.serialize(serializer),
        }
    }
}

fn to_params(payload: &impl Serialize) -> Value {
    serde_json::to_value(payload)
        .expect("ACP payload structs have string keys only, so they always serialize")
}

/// `initialize` params: protocol version 1, default client capabilities, our name.
#[must_use]
pub fn initialize_params(client_name: &str, client_version: &str) -> Value {
    to_params(&initialize_request(client_name, client_version))
}

fn initialize_request(client_name: &str, client_version: &str) -> InitializeRequest {
    InitializeRequest::new(ProtocolVersion::V1)
        .client_info(Implementation::new(client_name, client_version))
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
    use proptest::strategy::Strategy as _;
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

    /// Text with what JSON must escape, and what it must not: quotes, backslashes, every
    /// control character, DEL, non-ASCII, a lone `/`, and the characters serde writes as
    /// `\uXXXX`.
    fn hostile_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let ch = prop_oneof![
            4 => any::<char>(),
            4 => prop::sample::select(vec![
                '"', '\\', '/', '\u{0}', '\u{1}', '\u{8}', '\u{9}', '\u{a}', '\u{c}',
                '\u{d}', '\u{1b}', '\u{1f}', '\u{7f}', '\u{e9}', '\u{2028}', '\u{1F600}',
                'a', ' ',
            ]),
        ];
        prop::collection::vec(ch, 0..40).prop_map(|cs| cs.into_iter().collect())
    }

    /// Every kind of params, with hostile texts in every string.
    fn any_params() -> impl proptest::strategy::Strategy<Value = Params> {
        use proptest::prelude::*;
        prop_oneof![
            Just(Params::Initialize),
            hostile_text().prop_map(|cwd| Params::NewSession { cwd: cwd.into() }),
            (hostile_text(), hostile_text()).prop_map(|(session_id, cwd)| {
                Params::LoadSession {
                    session_id,
                    cwd: cwd.into(),
                }
            }),
            proptest::option::of(hostile_text()).prop_map(|cursor| Params::ListSessions { cursor }),
            (hostile_text(), hostile_text())
                .prop_map(|(session_id, text)| Params::Prompt { session_id, text }),
            hostile_text().prop_map(|session_id| Params::Cancel { session_id }),
            prop_oneof![
                Just(json!(null)),
                Just(json!({})),
                hostile_text().prop_map(|t| json!({"t": t, "n": [1, -2.5, true]})),
            ]
            .prop_map(Params::Tree),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4_000))]

        /// The line written from the parts is byte for byte the line of the tree the
        /// schema's structs make (the digests of the sweep depend on these bytes).
        #[test]
        fn params_are_written_as_their_tree_is(
            params in any_params(),
            id in proptest::prop_oneof![
                proptest::prelude::any::<i64>().prop_map(RequestId::Number),
                hostile_text().prop_map(RequestId::Str),
            ],
            method in hostile_text(),
        ) {
            use crate::jsonrpc::{encode_notification, encode_request};
            let tree = params.to_value();
            proptest::prop_assert_eq!(
                params.request_line(&id, &method),
                encode_request(&id, &method, &tree)
            );
            proptest::prop_assert_eq!(
                params.notification_line(&method),
                encode_notification(&method, &tree)
            );
        }
    }

    /// An answer's text from an alphabet of the members the readers look for and escaped
    /// spellings of them, duplicates, every kind of value, whitespace; not always valid
    /// JSON (the invalid ones are skipped).
    fn answer_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let names = prop::sample::select(vec![
            r#""agentCapabilities""#,
            r#""loadSession""#,
            r#""sessionCapabilities""#,
            r#""list""#,
            r#""sessionId""#,
            r#""stopReason""#,
            r#""l\u006fadSession""#,
            r#""sessionI\u0064""#,
            r#""other""#,
        ]);
        let leaf = prop::sample::select(vec![
            "true",
            "false",
            "null",
            "0",
            "-1.5e3",
            r#""end_turn""#,
            r#""s\"1\u00e9""#,
            "\"\u{e9}\u{1F600}\"",
            r#""""#,
            "[]",
            "[true,{}]",
            "{}",
        ])
        .prop_map(str::to_owned);
        let ws = prop::sample::select(vec!["", " ", "\n\t"]);
        leaf.prop_recursive(3, 24, 4, move |inner| {
            (
                prop::collection::vec((names.clone(), ws.clone(), inner), 0..4),
                ws.clone(),
            )
                .prop_map(|(members, w)| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(n, a, v)| format!("{a}{n}{a}:{w}{v}"))
                        .collect();
                    format!("{{{w}{}{w}}}", members.join(","))
                })
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4_000))]

        /// The readers of a raw answer read what a tree of it holds, whatever its shape.
        #[test]
        fn raw_answers_are_read_as_their_tree(text in answer_text()) {
            let Ok(raw) = RawJson::from_text(text.as_str()) else {
                return Ok(());
            };
            let tree = raw.parse::<Value>().expect("the generator writes no number a tree refuses");
            proptest::prop_assert_eq!(session_support(&raw), session_support_of_tree(&tree));
            for name in ["sessionId", "stopReason"] {
                proptest::prop_assert_eq!(
                    string_member(&raw, name),
                    tree.get(name).and_then(Value::as_str).map(str::to_owned)
                );
            }
        }
    }

    #[test]
    fn the_initialize_line_names_us() {
        let line = Params::Initialize.request_line(&RequestId::Number(1), INITIALIZE);
        let tree = initialize_params(CLIENT_NAME, env!("CARGO_PKG_VERSION"));
        assert_eq!(
            line,
            crate::jsonrpc::encode_request(&RequestId::Number(1), INITIALIZE, &tree)
        );
        assert!(line.contains(r#""name":"palisade-supervise""#), "{line}");
        // A tree of null is no params at all.
        assert_eq!(
            Params::Tree(Value::Null).notification_line("m"),
            "{\"jsonrpc\":\"2.0\",\"method\":\"m\"}\n"
        );
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

    /// An agent's line reads as `parse_frame` reads it, a `session/update` notification's
    /// params as `SessionUpdate::of` reads them, whatever the order of its members and
    /// whatever shape its params have.
    #[test]
    fn an_agents_line_reads_as_a_frame_and_its_updates_params_would() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{}1{}}}}}"#,
            "[".repeat(126),
            "]".repeat(126)
        );
        let lines = [
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[]}}}"#,
            r#"{"params":{"sessionId":"s","update":{"sessionUpdate":"plan"}},"method":"session/update","jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","method":"session\/update","params":{"sessionId":"s\u0031","update":{"a":"C:\\"}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{}},"id":4}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":7,"update":{}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","sessionId":"t","update":{}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":[]}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":null}"#,
            r#"{"jsonrpc":"2.0","method":"session/update"}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":null}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{}},"params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{}},"method":"x"}"#,
            r#"{"jsonrpc":"1.0","method":"session/update","params":{"update":{}}}"#,
            r#"{"method":"session/update","params":{"update":{}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"a":nul}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{}}} x"#,
            r#"{"jsonrpc":"2.0","method":"fs/read_text_file","params":{"path":"/a"},"id":"r"}"#,
            r#"{"jsonrpc":"2.0","method":"_x/y","params":{"update":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32002,"message":"m"}}"#,
            deep.as_str(),
        ];
        for line in lines {
            let general = crate::jsonrpc::parse_frame(line.as_bytes());
            let expected = match general.clone() {
                Ok(Frame::Notification { method, params }) if method == SESSION_UPDATE => {
                    Ok(AgentFrame::Update(SessionUpdate::of(params.raw())))
                }
                other => other.map(AgentFrame::Other),
            };
            assert_eq!(parse_agent_frame(line.as_bytes()), expected, "{line}");
        }
        // The first line's update is read in the envelope's pass, as written.
        let Ok(AgentFrame::Update(update)) = parse_agent_frame(lines[0].as_bytes()) else {
            panic!("an update")
        };
        assert_eq!(update.session_id.as_deref(), Some("s"));
        assert_eq!(
            update.update.map(|u| u.get().to_owned()).as_deref(),
            Some(r#"{"sessionUpdate":"plan","entries":[]}"#)
        );
    }
}
