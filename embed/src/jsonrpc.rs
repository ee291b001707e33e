//! JSON-RPC 2.0 framing for ACP's stdio transport: one JSON object per line.
//!
//! This layer knows envelopes, not payloads: it tells a response from a request from a
//! notification, keeps `params`/`result` as [`serde_json::Value`] (so a newer agent's
//! unknown fields and update kinds pass through untouched), and turns everything else into
//! a [`FrameError`] a caller can count and report. It never panics on input.

use serde_json::value::RawValue;
use serde_json::Value;

pub use agent_client_protocol_schema::v1::RequestId;

/// JSON-RPC's reserved error codes and ACP's own, as the agents send them.
pub mod codes {
    /// The line was not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON was not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// The method does not exist (for `session/load`: positive proof it cannot load).
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid method parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal error (for `session/load`: inconclusive).
    pub const INTERNAL_ERROR: i64 = -32603;
    /// ACP: authentication required.
    pub const AUTH_REQUIRED: i64 = -32000;
    /// ACP: resource (e.g. the session) not found.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
    /// LSP/ACP: the request was cancelled.
    pub const REQUEST_CANCELLED: i64 = -32800;
}

/// A JSON-RPC error object exactly as the peer sent it: nothing is mapped or dropped, so
/// a classifier can match on the code and on an exact message projection.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RpcError {
    /// The error code. JSON-RPC says integer; `i64` holds every integer JSON number we
    /// accept.
    pub code: i64,
    /// The human-readable message.
    pub message: String,
    /// Optional structured data (`{"details": ...}`, `{"uri": ...}`, a string, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// An error without data.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The same error with `data` attached.
    #[must_use]
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JSON-RPC error {}: {}", self.code, self.message)?;
        if let Some(data) = &self.data {
            write!(f, " (data: {data})")?;
        }
        Ok(())
    }
}

impl std::error::Error for RpcError {}

/// JSON text kept as it came: a payload passed on untouched is neither built into a tree
/// nor serialized again. Compared by its text.
///
/// Every constructor takes text that is one valid JSON value (serde validated it, or it
/// is a member's value cut out of text serde validated), so reading it is free; the
/// [`RawValue`] of [`RawJson::raw`] (and of serialization) is made on first use.
#[derive(Clone)]
pub struct RawJson {
    text: Box<str>,
    raw: std::sync::OnceLock<Box<RawValue>>,
}

impl RawJson {
    /// The JSON text.
    #[must_use]
    pub fn get(&self) -> &str {
        &self.text
    }

    /// The raw value, to embed in a larger serialization.
    #[must_use]
    pub fn raw(&self) -> &RawValue {
        self.raw.get_or_init(|| {
            // The text is valid JSON (see the type), so this does not fall back.
            RawValue::from_string(self.text.to_string()).unwrap_or_else(|_| null_params())
        })
    }

    /// Parsed into a tree.
    #[must_use]
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    /// Parsed into `T`.
    pub fn parse<'a, T: serde::Deserialize<'a>>(&'a self) -> serde_json::Result<T> {
        serde_json::from_str(&self.text)
    }

    /// The text of `value`.
    #[must_use]
    pub fn from_value(value: &Value) -> RawJson {
        RawJson::from_box(
            serde_json::value::to_raw_value(value)
                .expect("a Value always serializes (its keys are strings)"),
        )
    }

    /// `null`.
    #[must_use]
    pub fn null() -> RawJson {
        RawJson::valid("null")
    }

    /// `text`, which must be one valid JSON value without surrounding whitespace: a
    /// member's value as [`crate::jsonscan`] cuts it out of validated text.
    pub(crate) fn valid(text: &str) -> RawJson {
        RawJson {
            text: text.into(),
            raw: std::sync::OnceLock::new(),
        }
    }

    fn from_box(raw: Box<RawValue>) -> RawJson {
        RawJson {
            text: raw.get().into(),
            raw: std::sync::OnceLock::from(raw),
        }
    }
}

impl std::fmt::Debug for RawJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        /// As `RawValue` shows itself.
        struct Shown<'a>(&'a str);
        impl std::fmt::Debug for Shown<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_tuple("RawValue")
                    .field(&format_args!("{}", self.0))
                    .finish()
            }
        }
        f.debug_tuple("RawJson").field(&Shown(&self.text)).finish()
    }
}

impl serde::Serialize for RawJson {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.raw().serialize(serializer)
    }
}

impl<'de> serde::Deserialize<'de> for RawJson {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<RawJson, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(RawJson::from_box)
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &RawJson) -> bool {
        self.get() == other.get()
    }
}

impl From<&RawValue> for RawJson {
    fn from(raw: &RawValue) -> RawJson {
        RawJson::valid(raw.get())
    }
}

/// One well-formed JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// An answer to a request: `result` or `error`, never both.
    Response {
        /// The id of the request it answers.
        id: RequestId,
        /// `Ok(result)` or `Err(error)`.
        outcome: Result<Value, RpcError>,
    },
    /// A request the peer expects an answer to.
    Request {
        /// The peer's id; echo it back in the response.
        id: RequestId,
        /// The method name.
        method: String,
        /// The parameters; `Null` when absent.
        params: Value,
    },
    /// A message without an id; never answered.
    Notification {
        /// The method name.
        method: String,
        /// The parameters as raw JSON (`null` when absent): a notification's payload is
        /// usually passed on untouched, so it is not parsed into a tree here.
        params: RawJson,
    },
}

/// Why a line is not a JSON-RPC message. A closed set, so a caller can count by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Not valid UTF-8 JSON.
    NotJson,
    /// Valid JSON, but not an object (arrays, i.e. batches, land here: ACP does not use
    /// them).
    NotObject,
    /// `"jsonrpc"` is missing or is not `"2.0"`.
    BadVersion,
    /// `"method"` is present but not a string.
    BadMethod,
    /// `"id"` is not a number, a string or null.
    BadId,
    /// A response with both or neither of `result` and `error`.
    BadResponseShape,
    /// An `error` that is not `{code: integer, message: string, data?}`.
    BadErrorObject,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            FrameError::NotJson => "not JSON",
            FrameError::NotObject => "not a JSON object",
            FrameError::BadVersion => "missing or wrong \"jsonrpc\" version",
            FrameError::BadMethod => "\"method\" is not a string",
            FrameError::BadId => "\"id\" is not a number, string or null",
            FrameError::BadResponseShape => "response needs exactly one of result and error",
            FrameError::BadErrorObject => "malformed error object",
        };
        f.write_str(what)
    }
}

impl std::error::Error for FrameError {}

/// The top level of a message, borrowed from the line: each member is kept as raw JSON
/// and parsed only if the message needs it, so a notification's (possibly large) params
/// are scanned once and never built into a tree.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a RawValue>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

fn value(raw: &RawValue) -> Value {
    // A member of a message that parsed is valid JSON: this cannot fail.
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

/// Parses one line (without its newline) into a [`Frame`].
pub fn parse_frame(line: &[u8]) -> Result<Frame, FrameError> {
    let envelope: Envelope<'_> = match serde_json::from_slice(line) {
        Ok(envelope) => envelope,
        Err(_) => {
            // Valid JSON of the wrong shape (an array, a number, a repeated member), or
            // not JSON at all?
            return Err(
                match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
                    Ok(_) => FrameError::NotObject,
                    Err(_) => FrameError::NotJson,
                },
            );
        }
    };
    if envelope.jsonrpc.map(RawValue::get) != Some("\"2.0\"") {
        return Err(FrameError::BadVersion);
    }
    let id = match envelope.id {
        None => None,
        Some(id) => Some(parse_id(value(id))?),
    };
    match envelope.method {
        Some(method) => {
            let Ok(method) = serde_json::from_str::<String>(method.get()) else {
                return Err(FrameError::BadMethod);
            };
            Ok(match id {
                Some(id) => Frame::Request {
                    id,
                    method,
                    params: envelope.params.map_or(Value::Null, value),
                },
                None => Frame::Notification {
                    method,
                    params: envelope.params.map_or_else(RawJson::null, RawJson::from),
                },
            })
        }
        None => {
            // A response. An id is required (it may be null when the peer could not read
            // our id, which then matches no request).
            let id = id.ok_or(FrameError::BadResponseShape)?;
            let outcome = match (envelope.result, envelope.error) {
                (Some(result), None) => Ok(value(result)),
                (None, Some(error)) => Err(parse_error_object(value(error))?),
                _ => return Err(FrameError::BadResponseShape),
            };
            Ok(Frame::Response { id, outcome })
        }
    }
}

/// A notification's params when it has none.
fn null_params() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).expect("null is JSON")
}

fn parse_id(id: Value) -> Result<RequestId, FrameError> {
    match id {
        Value::Null => Ok(RequestId::Null),
        Value::String(s) => Ok(RequestId::Str(s)),
        Value::Number(n) => n.as_i64().map(RequestId::Number).ok_or(FrameError::BadId),
        _ => Err(FrameError::BadId),
    }
}

fn parse_error_object(error: Value) -> Result<RpcError, FrameError> {
    let Value::Object(mut error) = error else {
        return Err(FrameError::BadErrorObject);
    };
    let code = error
        .get("code")
        .and_then(Value::as_i64)
        .ok_or(FrameError::BadErrorObject)?;
    let message = match error.remove("message") {
        Some(Value::String(message)) => message,
        _ => return Err(FrameError::BadErrorObject),
    };
    // An explicit `"data": null` is the same as no data.
    let data = error.remove("data").filter(|data| !data.is_null());
    Ok(RpcError {
        code,
        message,
        data,
    })
}

/// A message as written: borrowed parts, serialized in one pass (nothing is cloned into an
/// intermediate tree).
#[derive(serde::Serialize)]
struct Outgoing<'a> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a RequestId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a RpcError>,
}

impl Outgoing<'_> {
    fn line(&self) -> String {
        let mut line =
            serde_json::to_string(self).expect("a message of Values and strings always serializes");
        line.push('\n');
        line
    }
}

const NONE: Outgoing<'static> = Outgoing {
    jsonrpc: "2.0",
    id: None,
    method: None,
    params: None,
    result: None,
    error: None,
};

/// Encodes a request as one line, newline included.
#[must_use]
pub fn encode_request(id: &RequestId, method: &str, params: &Value) -> String {
    Outgoing {
        id: Some(id),
        method: Some(method),
        params: (!params.is_null()).then_some(params),
        ..NONE
    }
    .line()
}

/// Encodes a notification as one line, newline included.
#[must_use]
pub fn encode_notification(method: &str, params: &Value) -> String {
    Outgoing {
        method: Some(method),
        params: (!params.is_null()).then_some(params),
        ..NONE
    }
    .line()
}

/// Encodes a response (result or error) as one line, newline included.
#[must_use]
pub fn encode_response(id: &RequestId, outcome: &Result<Value, RpcError>) -> String {
    match outcome {
        Ok(result) => Outgoing {
            id: Some(id),
            result: Some(result),
            ..NONE
        },
        Err(error) => Outgoing {
            id: Some(id),
            error: Some(error),
            ..NONE
        },
    }
    .line()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<Frame, FrameError> {
        parse_frame(value.to_string().as_bytes())
    }

    #[test]
    fn response_with_result_round_trips() {
        let line = encode_response(&RequestId::Number(7), &Ok(json!({"a": 1})));
        assert!(line.ends_with('\n'));
        let frame = parse_frame(line.trim_end().as_bytes()).unwrap();
        assert_eq!(
            frame,
            Frame::Response {
                id: RequestId::Number(7),
                outcome: Ok(json!({"a": 1}))
            }
        );
    }

    #[test]
    fn error_response_keeps_code_message_and_data_exactly() {
        let error = RpcError::new(-32603, "Internal error")
            .with_data(json!({"details": "Session not found"}));
        let line = encode_response(&RequestId::Str("x".into()), &Err(error.clone()));
        let frame = parse_frame(line.trim_end().as_bytes()).unwrap();
        assert_eq!(
            frame,
            Frame::Response {
                id: RequestId::Str("x".into()),
                outcome: Err(error)
            }
        );
    }

    #[test]
    fn explicit_null_data_reads_as_no_data() {
        let frame = parse(
            json!({"jsonrpc":"2.0","id":1,"error":{"code":-32002,"message":"m","data":null}}),
        );
        assert_eq!(
            frame,
            Ok(Frame::Response {
                id: RequestId::Number(1),
                outcome: Err(RpcError::new(-32002, "m"))
            })
        );
    }

    #[test]
    fn request_and_notification_are_told_apart_by_id() {
        let request = encode_request(&RequestId::Number(1), "session/new", &json!({"cwd": "/"}));
        assert!(matches!(
            parse_frame(request.trim_end().as_bytes()),
            Ok(Frame::Request { method, .. }) if method == "session/new"
        ));
        let notification = encode_notification("session/cancel", &json!({"sessionId": "s"}));
        assert!(matches!(
            parse_frame(notification.trim_end().as_bytes()),
            Ok(Frame::Notification { method, .. }) if method == "session/cancel"
        ));
    }

    #[test]
    fn garbage_is_classified_never_panics() {
        assert_eq!(parse_frame(b"hello"), Err(FrameError::NotJson));
        assert_eq!(parse_frame(b"\xff\xfe"), Err(FrameError::NotJson));
        assert_eq!(parse_frame(b""), Err(FrameError::NotJson));
        assert_eq!(parse(json!([1, 2])), Err(FrameError::NotObject));
        assert_eq!(
            parse(json!({"id": 1, "result": 1})),
            Err(FrameError::BadVersion)
        );
        assert_eq!(
            parse(json!({"jsonrpc": "1.0", "id": 1, "result": 1})),
            Err(FrameError::BadVersion)
        );
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "method": 5})),
            Err(FrameError::BadMethod)
        );
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "id": [1], "result": 1})),
            Err(FrameError::BadId)
        );
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "id": 1.5, "result": 1})),
            Err(FrameError::BadId)
        );
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "id": 1})),
            Err(FrameError::BadResponseShape)
        );
        assert_eq!(
            parse(
                json!({"jsonrpc": "2.0", "id": 1, "result": 1, "error": {"code": 1, "message": ""}})
            ),
            Err(FrameError::BadResponseShape)
        );
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "result": 1})),
            Err(FrameError::BadResponseShape)
        );
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "id": 1, "error": {"code": "x", "message": ""}})),
            Err(FrameError::BadErrorObject)
        );
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "id": 1, "error": {"code": 1}})),
            Err(FrameError::BadErrorObject)
        );
    }
}
