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

use crate::jsonrpc::{encode_with_capacity, RawJson, RequestId};
use crate::jsonscan::{self, Plain};

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

/// [`SessionSupport`] read from a tree of the answer: the reference.
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

/// [`SessionSupport`] of a raw `initialize` answer: read from its text when it has the
/// plain shape, else from a tree; always the tree's reading (a test compares the two).
#[must_use]
pub fn session_support(initialize_result: &RawJson) -> SessionSupport {
    scan_session_support(initialize_result.get())
        .unwrap_or_else(|| session_support_of_tree(&initialize_result.to_value()))
}

fn scan_session_support(text: &str) -> Option<SessionSupport> {
    let none = SessionSupport {
        load: LoadSessionSupport::NotAdvertised,
        load_false: false,
        list: false,
    };
    let [capabilities] = scan_members(text, ["agentCapabilities"])?;
    let capabilities = match capabilities.map(jsonscan::plain) {
        None | Some(Some(Plain::Null)) => return Some(none),
        Some(Some(Plain::Object(capabilities))) => capabilities,
        Some(_) => {
            return Some(SessionSupport {
                load: LoadSessionSupport::Malformed,
                ..none
            })
        }
    };
    let [load, sessions] = scan_members(capabilities, ["loadSession", "sessionCapabilities"])?;
    let (load, load_false) = match load {
        None | Some("null") => (LoadSessionSupport::NotAdvertised, false),
        Some("false") => (LoadSessionSupport::NotAdvertised, true),
        Some("true") => (LoadSessionSupport::Advertised, false),
        Some(_) => (LoadSessionSupport::Malformed, false),
    };
    let list = match sessions.map(jsonscan::plain) {
        Some(Some(Plain::Object(sessions))) => {
            let [list] = scan_members(sessions, ["list"])?;
            list.is_some_and(|list| list == "true" || list.starts_with('{'))
        }
        _ => false,
    };
    Some(SessionSupport {
        load,
        load_false,
        list,
    })
}

/// The string member `name` of a raw answer (`sessionId` of `session/new`, `stopReason` of
/// `session/prompt`), as a tree reads it: `None` when absent or not a string, or when the
/// answer is not an object. Read from the text when the member is a plain string.
#[must_use]
pub fn string_member(answer: &RawJson, name: &str) -> Option<String> {
    let scanned = scan_members(answer.get(), [name]).and_then(|[value]| match value {
        None => Some(None),
        Some(value) if value.starts_with('"') => match jsonscan::plain(value) {
            Some(Plain::Str(text)) => Some(Some(text.to_owned())),
            // Escapes: serde decodes them.
            _ => None,
        },
        Some(_) => Some(None),
    });
    scanned.unwrap_or_else(|| {
        answer
            .to_value()
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
    })
}

/// The values of the members `names` of the object `text` (valid JSON) as a tree reads
/// them: each one's text, `None` when absent. `None` altogether when the scan cannot be
/// sure: `text` is not an object, a member name has an escape (it may spell a name looked
/// for), or a name looked for is given twice (the tree keeps the last).
fn scan_members<'a, const N: usize>(
    text: &'a str,
    names: [&str; N],
) -> Option<[Option<&'a str>; N]> {
    let mut found = [None; N];
    for (name, value) in jsonscan::members(text)? {
        if name.contains('\\') {
            return None;
        }
        if let Some(at) = names.iter().position(|n| *n == name) {
            if found[at].replace(value).is_some() {
                return None;
            }
        }
    }
    Some(found)
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
/// written straight into the line ([`Params::request_line`]): no tree is built per request.
/// The bytes are exactly those of the tree the `*_params` builders below make (a test
/// compares the two on arbitrary texts), so an agent reads the same line either way.
#[derive(Debug, Clone, PartialEq)]
pub enum Params {
    /// `initialize` of [`CLIENT_NAME`] at this crate's version; its text is
    /// built once.
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
}

impl From<Value> for Params {
    fn from(value: Value) -> Params {
        Params::Tree(value)
    }
}

/// The text of [`Params::Initialize`], built once: the params are the same for every agent.
static INITIALIZE_TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    initialize_params(CLIENT_NAME, env!("CARGO_PKG_VERSION")).to_string()
});

/// `session/new`'s params as the schema writes them (the members in its order).
#[derive(Serialize)]
struct NewSessionText<'a> {
    cwd: &'a std::path::Path,
    #[serde(rename = "mcpServers")]
    mcp_servers: [(); 0],
}

/// `session/load`'s params as the schema writes them.
#[derive(Serialize)]
struct LoadSessionText<'a> {
    #[serde(rename = "mcpServers")]
    mcp_servers: [(); 0],
    cwd: &'a std::path::Path,
    #[serde(rename = "sessionId")]
    session_id: &'a str,
}

/// `session/list`'s params.
#[derive(Serialize)]
struct ListText<'a> {
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

    /// The params as a tree, built as the `*_params` builders build them.
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
        }
    }

    /// Appends the params' compact JSON text to `line`; `false` (and nothing written) when
    /// there are none.
    fn write(&self, line: &mut Vec<u8>) -> bool {
        let written = match self {
            Params::Initialize => {
                line.extend_from_slice(INITIALIZE_TEXT.as_bytes());
                Ok(())
            }
            Params::NewSession { cwd } => serde_json::to_writer(
                &mut *line,
                &NewSessionText {
                    cwd,
                    mcp_servers: [],
                },
            ),
            Params::LoadSession { session_id, cwd } => serde_json::to_writer(
                &mut *line,
                &LoadSessionText {
                    mcp_servers: [],
                    cwd,
                    session_id,
                },
            ),
            Params::ListSessions { cursor } => serde_json::to_writer(
                &mut *line,
                &ListText {
                    cursor: cursor.as_deref(),
                },
            ),
            // The two params of every turn, written by hand as the schema's
            // `PromptRequest` and `CancelNotification` are written (a proptest compares the
            // bytes): the prompt's text is escaped a word at a time rather than a byte at a
            // time.
            Params::Prompt { session_id, text } => {
                line.extend_from_slice(br#"{"sessionId":"#);
                write_str(line, session_id);
                line.extend_from_slice(br#","prompt":[{"type":"text","text":"#);
                write_str(line, text);
                line.extend_from_slice(b"}]}");
                Ok(())
            }
            Params::Cancel { session_id } => {
                line.extend_from_slice(br#"{"sessionId":"#);
                write_str(line, session_id);
                line.push(b'}');
                Ok(())
            }
            Params::Tree(Value::Null) => return false,
            Params::Tree(value) => serde_json::to_writer(&mut *line, value),
        };
        // A path that is not UTF-8 fails here as it fails the schema's serialization.
        written.expect("params are strings and UTF-8 paths, so they always serialize");
        true
    }

    /// About how many bytes [`Params::write`] writes (exactly, when nothing needs
    /// escaping): what a line reserves for them, so it is written in one allocation.
    fn size_hint(&self) -> usize {
        match self {
            Params::Initialize => INITIALIZE_TEXT.len(),
            Params::NewSession { cwd } => cwd.as_os_str().len() + 32,
            Params::LoadSession { session_id, cwd } => {
                session_id.len() + cwd.as_os_str().len() + 48
            }
            Params::ListSessions { cursor } => cursor.as_ref().map_or(0, String::len) + 16,
            Params::Prompt { session_id, text } => session_id.len() + text.len() + 56,
            Params::Cancel { session_id } => session_id.len() + 16,
            Params::Tree(_) => 64,
        }
    }

    /// The request `id` of `method` with these params, as one line (newline included).
    #[must_use]
    pub fn request_line(&self, id: &RequestId, method: &str) -> String {
        // The envelope around the params: `{"jsonrpc":"2.0","id":…,"method":"…","params":}`
        // and the newline, with room for the longest number id.
        let capacity = 72 + method.len() + self.size_hint();
        encode_with_capacity(capacity, Some(id), method, |line| self.write(line))
    }

    /// The notification `method` with these params, as one line (newline included).
    #[must_use]
    pub fn notification_line(&self, method: &str) -> String {
        let capacity = 48 + method.len() + self.size_hint();
        encode_with_capacity(capacity, None, method, |line| self.write(line))
    }
}

/// Appends `text` as a JSON string, byte for byte as `serde_json`'s compact writer
/// escapes it: `"` and `\` with a backslash, `\b \f \n \r \t` by name, every other
/// control character as `\u00xx` (lower-case hex), everything else (DEL, non-ASCII) as is.
/// Eight bytes at a time are tested for anything to escape, so a plain run costs a word
/// test rather than a table look-up per byte.
fn write_str(line: &mut Vec<u8>, text: &str) {
    /// A byte of the word is below 0x20, or is `"` or `\` (exact as a yes/no: the
    /// borrow of the subtraction only ever spills above a byte that matched).
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = text.as_bytes();
    line.reserve(bytes.len() + 2);
    line.push(b'"');
    // `bytes[run..at]` is plain and not yet written.
    let mut run = 0;
    let mut at = 0;
    while at < bytes.len() {
        let end = if let Some(word) = bytes.get(at..at + 8) {
            let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
            if crate::jsonscan::stop_bytes(word) == 0 {
                at += 8;
                continue;
            }
            at + 8
        } else {
            bytes.len()
        };
        for (i, &byte) in bytes.iter().enumerate().take(end).skip(at) {
            let named = match byte {
                b'"' => b'"',
                b'\\' => b'\\',
                0x08 => b'b',
                0x0c => b'f',
                b'\n' => b'n',
                b'\r' => b'r',
                b'\t' => b't',
                0x00..=0x1f => b'u',
                _ => continue,
            };
            line.extend_from_slice(&bytes[run..i]);
            run = i + 1;
            line.extend_from_slice(&[b'\\', named]);
            if named == b'u' {
                line.extend_from_slice(&[
                    b'0',
                    b'0',
                    HEX[usize::from(byte >> 4)],
                    HEX[usize::from(byte & 0xf)],
                ]);
            }
        }
        at = end;
    }
    line.extend_from_slice(&bytes[run..]);
    line.push(b'"');
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

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4_000))]

        /// The word-at-a-time string writer writes what `serde_json` writes, for texts
        /// of every length with what must be escaped at every position of a word.
        #[test]
        fn strings_are_written_as_serde_writes_them(
            text in proptest::prop_oneof![
                hostile_text(),
                proptest::strategy::Strategy::prop_map(
                    proptest::collection::vec(hostile_text(), 0..6),
                    |parts| parts.concat()
                ),
                "[a-z\"\\\\\u{0}-\u{1f}\u{7f}\u{e9}]{0,70}",
            ],
        ) {
            let mut ours = Vec::new();
            write_str(&mut ours, &text);
            let theirs = serde_json::to_vec(&text).expect("a string serializes");
            proptest::prop_assert_eq!(
                String::from_utf8(ours).expect("UTF-8"),
                String::from_utf8(theirs).expect("UTF-8")
            );
        }
    }

    #[test]
    fn every_byte_that_needs_escaping_is_found_at_every_position_of_a_word() {
        for byte in 0u8..=0x7f {
            for at in 0..17 {
                let mut text = "x".repeat(17);
                text.replace_range(at..=at, &char::from(byte).to_string());
                let mut ours = Vec::new();
                write_str(&mut ours, &text);
                assert_eq!(
                    ours,
                    serde_json::to_vec(&text).expect("a string serializes")
                );
            }
        }
    }

    /// An answer's text from an alphabet that hits every branch of the readers: the
    /// members they look for and escaped spellings of them, duplicates, every kind of
    /// value, whitespace; not always valid JSON (the invalid ones are skipped).
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

        /// The readers of a raw answer answer as the tree readers do, whatever its shape.
        #[test]
        fn raw_answers_are_read_as_their_tree(text in answer_text()) {
            proptest::prop_assume!(serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok());
            let raw = RawJson::valid(&text);
            let tree = raw.to_value();
            proptest::prop_assert_eq!(session_support(&raw), session_support_of_tree(&tree));
            for name in ["sessionId", "stopReason"] {
                proptest::prop_assert_eq!(
                    string_member(&raw, name),
                    tree.get(name).and_then(Value::as_str).map(str::to_owned)
                );
            }
        }
    }

    /// The property above is not vacuous: the scan answers for most generated answers
    /// that are objects, and leaves some to the tree.
    #[test]
    fn the_scan_reads_most_answers_and_not_all() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut objects, mut scanned) = (0, 0);
        for _ in 0..2_000 {
            let text = answer_text().new_tree(&mut runner).unwrap().current();
            if text.starts_with('{') && serde_json::from_str::<Value>(&text).is_ok() {
                objects += 1;
                scanned += usize::from(scan_session_support(&text).is_some());
            }
        }
        assert!(
            scanned * 2 > objects && scanned < objects,
            "{scanned} of {objects} scanned"
        );
    }

    #[test]
    fn the_initialize_line_names_us_once_built() {
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
}
