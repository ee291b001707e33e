//! JSON-RPC 2.0 framing for ACP's stdio transport: one JSON object per line.
//!
//! This layer knows envelopes, not payloads: it tells a response from a request from a
//! notification, keeps `params`/`result` as [`serde_json::Value`] (so a newer agent's
//! unknown fields and update kinds pass through untouched), and turns everything else into
//! a [`FrameError`] a caller can count and report. It never panics on input.

use serde_json::{Map, Value};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    /// The error code. JSON-RPC says integer; `i64` holds every integer JSON number we
    /// accept.
    pub code: i64,
    /// The human-readable message.
    pub message: String,
    /// Optional structured data (`{"details": ...}`, `{"uri": ...}`, a string, ...).
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

    fn to_value(&self) -> Value {
        let mut error = Map::new();
        error.insert("code".into(), Value::from(self.code));
        error.insert("message".into(), Value::from(self.message.clone()));
        if let Some(data) = &self.data {
            error.insert("data".into(), data.clone());
        }
        Value::Object(error)
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
        /// The parameters; `Null` when absent.
        params: Value,
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

/// Parses one line (without its newline) into a [`Frame`].
pub fn parse_frame(line: &[u8]) -> Result<Frame, FrameError> {
    let value: Value = serde_json::from_slice(line).map_err(|_| FrameError::NotJson)?;
    let Value::Object(mut object) = value else {
        return Err(FrameError::NotObject);
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(FrameError::BadVersion);
    }
    let id = match object.remove("id") {
        None => None,
        Some(id) => Some(parse_id(id)?),
    };
    let params = object.remove("params").unwrap_or(Value::Null);
    match object.remove("method") {
        Some(Value::String(method)) => Ok(match id {
            Some(id) => Frame::Request { id, method, params },
            None => Frame::Notification { method, params },
        }),
        Some(_) => Err(FrameError::BadMethod),
        None => {
            // A response. An id is required (it may be null when the peer could not read
            // our id, which then matches no request).
            let id = id.ok_or(FrameError::BadResponseShape)?;
            let outcome = match (object.remove("result"), object.remove("error")) {
                (Some(result), None) => Ok(result),
                (None, Some(error)) => Err(parse_error_object(error)?),
                _ => return Err(FrameError::BadResponseShape),
            };
            Ok(Frame::Response { id, outcome })
        }
    }
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

fn id_to_value(id: &RequestId) -> Value {
    match id {
        RequestId::Null => Value::Null,
        RequestId::Number(n) => Value::from(*n),
        RequestId::Str(s) => Value::from(s.clone()),
    }
}

fn envelope() -> Map<String, Value> {
    let mut message = Map::new();
    message.insert("jsonrpc".into(), Value::from("2.0"));
    message
}

fn finish(message: Map<String, Value>) -> String {
    let mut line = Value::Object(message).to_string();
    line.push('\n');
    line
}

/// Encodes a request as one line, newline included.
#[must_use]
pub fn encode_request(id: &RequestId, method: &str, params: &Value) -> String {
    let mut message = envelope();
    message.insert("id".into(), id_to_value(id));
    message.insert("method".into(), Value::from(method));
    if !params.is_null() {
        message.insert("params".into(), params.clone());
    }
    finish(message)
}

/// Encodes a notification as one line, newline included.
#[must_use]
pub fn encode_notification(method: &str, params: &Value) -> String {
    let mut message = envelope();
    message.insert("method".into(), Value::from(method));
    if !params.is_null() {
        message.insert("params".into(), params.clone());
    }
    finish(message)
}

/// Encodes a response (result or error) as one line, newline included.
#[must_use]
pub fn encode_response(id: &RequestId, outcome: &Result<Value, RpcError>) -> String {
    let mut message = envelope();
    message.insert("id".into(), id_to_value(id));
    match outcome {
        Ok(result) => message.insert("result".into(), result.clone()),
        Err(error) => message.insert("error".into(), error.to_value()),
    };
    finish(message)
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
