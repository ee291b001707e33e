//! JSON-RPC 2.0 framing for ACP's stdio transport: one JSON object per line.
//!
//! This layer knows envelopes, not payloads: it tells a response from a request from a
//! notification, keeps `params` and `result` as raw JSON ([`RawJson`]: the receiver reads
//! the few members it needs, and a newer agent's unknown fields and update kinds pass
//! through untouched), and turns everything else into
//! a [`FrameError`] a caller can count and report. It never panics on input.

use serde_json::value::RawValue;
use serde_json::Value;

use crate::jsonscan::{self, Envelope};

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
///
/// The text is shared: a member cut out of a `RawJson` ([`RawJson::part`], e.g. a
/// notification's `update` out of its params), a clone, and the params or result of a line
/// framed by [`parse_shared`] point into the same bytes instead of copying them.
#[derive(Clone)]
pub struct RawJson {
    /// The text this value is a part of (all of it, the text it was cut out of, or the
    /// line it came in).
    whole: std::sync::Arc<String>,
    /// Where this value's text lies in `whole` (on character boundaries).
    span: std::ops::Range<usize>,
    raw: std::sync::OnceLock<Box<RawValue>>,
    /// Where a `session/update`'s members lie in this text, when the frame's validating
    /// walk noted them (params framed by [`parse_frame`] only; see
    /// `palisade_engine::events::read_update`).
    update_spans: Option<Box<jsonscan::UpdateSpans>>,
}

impl RawJson {
    /// The JSON text.
    #[must_use]
    pub fn get(&self) -> &str {
        &self.whole[self.span.clone()]
    }

    /// `part`, one valid JSON value cut out of this value's text (as [`crate::jsonscan`]
    /// cuts a member's value out of it), sharing the text instead of copying it. Text that
    /// does not lie inside this value's is copied.
    #[doc(hidden)]
    pub fn part(&self, part: &str) -> RawJson {
        let text = self.get();
        let start = (part.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
        let inside = start <= text.len() && part.len() <= text.len() - start;
        if !inside {
            return RawJson::valid(part);
        }
        RawJson::within(&self.whole, self.span.start + start, part.len())
    }

    /// `part`, one valid JSON value cut out of `whole` (a line framed by [`parse_shared`]),
    /// sharing `whole`'s text; copied if it does not lie inside it.
    fn shared(whole: &std::sync::Arc<String>, part: &str) -> RawJson {
        let start = (part.as_ptr() as usize).wrapping_sub(whole.as_ptr() as usize);
        let inside = start <= whole.len() && part.len() <= whole.len() - start;
        if !inside {
            return RawJson::valid(part);
        }
        RawJson::within(whole, start, part.len())
    }

    /// The `len` bytes of `whole` from `start` (on character boundaries).
    fn within(whole: &std::sync::Arc<String>, start: usize, len: usize) -> RawJson {
        RawJson {
            whole: std::sync::Arc::clone(whole),
            span: start..start + len,
            raw: std::sync::OnceLock::new(),
            update_spans: None,
        }
    }

    /// Where a `session/update`'s members lie in [`RawJson::get`]'s text, if the frame's
    /// validating walk noted them.
    #[doc(hidden)]
    pub fn update_spans(&self) -> Option<&jsonscan::UpdateSpans> {
        self.update_spans.as_deref()
    }

    /// The raw value, to embed in a larger serialization.
    #[must_use]
    pub fn raw(&self) -> &RawValue {
        self.raw.get_or_init(|| {
            // The text is valid JSON (see the type), so this does not fall back.
            RawValue::from_string(self.get().to_owned()).unwrap_or_else(|_| null_params())
        })
    }

    /// Parsed into a tree.
    #[must_use]
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.get()).unwrap_or(Value::Null)
    }

    /// Parsed into `T`.
    pub fn parse<'a, T: serde::Deserialize<'a>>(&'a self) -> serde_json::Result<T> {
        serde_json::from_str(self.get())
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
    #[doc(hidden)]
    pub fn valid(text: &str) -> RawJson {
        RawJson {
            whole: std::sync::Arc::new(text.to_owned()),
            span: 0..text.len(),
            raw: std::sync::OnceLock::new(),
            update_spans: None,
        }
    }

    /// `raw` with the spans the validating walk noted in its text.
    fn noted(raw: RawJson, spans: Option<jsonscan::UpdateSpans>) -> RawJson {
        RawJson {
            // Unsure spans are of no use to a reader (it reads the text afresh).
            update_spans: spans.filter(|s| !s.unsure).map(Box::new),
            ..raw
        }
    }

    fn from_box(raw: Box<RawValue>) -> RawJson {
        RawJson {
            whole: std::sync::Arc::new(raw.get().to_owned()),
            span: 0..raw.get().len(),
            raw: std::sync::OnceLock::from(raw),
            update_spans: None,
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
        f.debug_tuple("RawJson").field(&Shown(self.get())).finish()
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
        /// `Ok(result)` (its raw JSON: the receiver reads the members it needs) or
        /// `Err(error)`.
        outcome: Result<RawJson, RpcError>,
    },
    /// A request the peer expects an answer to.
    Request {
        /// The peer's id; echo it back in the response.
        id: RequestId,
        /// The method name.
        method: String,
        /// The parameters as raw JSON (`null` when absent): the receiver reads what it
        /// needs of them, so they are not parsed into a tree here.
        params: RawJson,
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

/// The top level of a message as serde reads it, borrowed from the line: each member is
/// kept as raw JSON and parsed only if the message needs it. The reference for
/// [`jsonscan::envelope`], and what decides every line that scan leaves to serde.
#[derive(serde::Deserialize)]
struct SerdeEnvelope<'a> {
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

/// The envelope of `line` as serde reads it, or why the line is not a message.
fn serde_envelope(line: &[u8]) -> Result<Envelope<'_>, FrameError> {
    match serde_json::from_slice::<SerdeEnvelope<'_>>(line) {
        Ok(envelope) => Ok(Envelope {
            jsonrpc: envelope.jsonrpc.map(RawValue::get),
            id: envelope.id.map(RawValue::get),
            method: envelope.method.map(RawValue::get),
            params: envelope.params.map(RawValue::get),
            result: envelope.result.map(RawValue::get),
            error: envelope.error.map(RawValue::get),
            update_spans: None,
        }),
        Err(_) => {
            // Valid JSON of the wrong shape (an array, a number, a repeated member), or
            // not JSON at all?
            Err(
                match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
                    Ok(_) => FrameError::NotObject,
                    Err(_) => FrameError::NotJson,
                },
            )
        }
    }
}

fn value(text: &str) -> Value {
    // A member of a message that parsed is valid JSON: this cannot fail.
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// Parses one line (without its newline) into a [`Frame`].
///
/// The line is validated once: by [`jsonscan::envelope`], which walks it with `memchr`
/// and answers only when it is certain serde would read the same envelope, and otherwise
/// by serde (so every error, and every unusual line, is serde's verdict).
pub fn parse_frame(line: &[u8]) -> Result<Frame, FrameError> {
    let envelope = match jsonscan::envelope(line) {
        Some(envelope) => envelope,
        None => serde_envelope(line)?,
    };
    frame(envelope, None)
}

/// [`parse_frame`] of a line already checked to be UTF-8 (a `String`), whose frame's
/// params or result share the line's text instead of copying it: the same frame (or
/// error), validated once (a test compares the two).
pub fn parse_shared(line: &std::sync::Arc<String>) -> Result<Frame, FrameError> {
    let envelope = match jsonscan::envelope_of_text(line) {
        Some(envelope) => envelope,
        None => serde_envelope(line.as_bytes())?,
    };
    frame(envelope, Some(line))
}

/// [`parse_frame`] with serde's reading of the envelope only: the reference the scan is
/// tested against.
#[cfg(test)]
fn parse_frame_with_serde(line: &[u8]) -> Result<Frame, FrameError> {
    frame(serde_envelope(line)?, None)
}

/// The frame of `envelope`, whose members are cut out of `line` when it is given (their
/// text is then shared) and copied otherwise.
fn frame(
    envelope: Envelope<'_>,
    line: Option<&std::sync::Arc<String>>,
) -> Result<Frame, FrameError> {
    let raw = |text: &str| match line {
        Some(line) => RawJson::shared(line, text),
        None => RawJson::valid(text),
    };
    if envelope.jsonrpc != Some("\"2.0\"") {
        return Err(FrameError::BadVersion);
    }
    let id = match envelope.id {
        None => None,
        Some(id) => Some(request_id(id)?),
    };
    match envelope.method {
        Some(method) => {
            let method = method_name(method)?;
            Ok(match id {
                Some(id) => Frame::Request {
                    id,
                    method,
                    params: envelope.params.map_or_else(RawJson::null, raw),
                },
                None => Frame::Notification {
                    method,
                    params: envelope.params.map_or_else(RawJson::null, |params| {
                        RawJson::noted(raw(params), envelope.update_spans)
                    }),
                },
            })
        }
        None => {
            // A response. An id is required (it may be null when the peer could not read
            // our id, which then matches no request).
            let id = id.ok_or(FrameError::BadResponseShape)?;
            let outcome = match (envelope.result, envelope.error) {
                (Some(result), None) => Ok(raw(result)),
                (None, Some(error)) => Err(parse_error_object(value(error))?),
                _ => return Err(FrameError::BadResponseShape),
            };
            Ok(Frame::Response { id, outcome })
        }
    }
}

/// The method named by `text` (a member's value, valid JSON): the string it is, or
/// [`FrameError::BadMethod`]. A string without escapes is its text between the quotes;
/// serde reads any other (a test compares the two).
fn method_name(text: &str) -> Result<String, FrameError> {
    match jsonscan::plain(text) {
        Some(jsonscan::Plain::Str(name)) => Ok(name.to_owned()),
        _ => serde_json::from_str::<String>(text).map_err(|_| FrameError::BadMethod),
    }
}

/// A notification's params when it has none.
fn null_params() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).expect("null is JSON")
}

/// Most digits a decimal number can have and still fit an `i64` whatever they are.
const I64_DIGITS: usize = 18;

/// The request id `text` (a member's value, valid JSON) stands for. A number of at most
/// [`I64_DIGITS`] digits and nothing else (the ids a peer counts up) is read here; serde
/// reads any other id (a test compares the two).
fn request_id(text: &str) -> Result<RequestId, FrameError> {
    let digits = text.as_bytes();
    if (1..=I64_DIGITS).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit) {
        // Valid JSON, so no leading zero; 18 digits are below `i64::MAX`.
        let n = digits
            .iter()
            .fold(0i64, |n, &digit| n * 10 + i64::from(digit - b'0'));
        return Ok(RequestId::Number(n));
    }
    parse_id(value(text))
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

/// Encodes a request (with `id`) or a notification (without) whose params `params` appends
/// to the line as compact JSON text (returning `false`, having written nothing, when there
/// are none): the line [`encode_request`] or [`encode_notification`] writes for the same
/// params, newline included, without building them into a tree.
pub fn encode_with(
    id: Option<&RequestId>,
    method: &str,
    params: impl FnOnce(&mut Vec<u8>) -> bool,
) -> String {
    encode_with_capacity(128, id, method, params)
}

/// [`encode_with`] into a line of `capacity` bytes reserved up front: a caller that knows
/// about how long its params are gets the line in one allocation, not a few growths.
pub fn encode_with_capacity(
    capacity: usize,
    id: Option<&RequestId>,
    method: &str,
    params: impl FnOnce(&mut Vec<u8>) -> bool,
) -> String {
    let mut line = Vec::with_capacity(capacity);
    line.extend_from_slice(br#"{"jsonrpc":"2.0""#);
    if let Some(id) = id {
        line.extend_from_slice(br#","id":"#);
        serde_json::to_writer(&mut line, id).expect("a request id always serializes");
    }
    line.extend_from_slice(br#","method":"#);
    serde_json::to_writer(&mut line, method).expect("a string always serializes");
    let before = line.len();
    line.extend_from_slice(br#","params":"#);
    if !params(&mut line) {
        line.truncate(before);
    }
    line.extend_from_slice(b"}\n");
    String::from_utf8(line).expect("serde_json writes UTF-8 and the params are JSON text")
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

/// Encodes a response whose result is `result`, the compact JSON text of one value written
/// as is, newline included: the line [`encode_response`] writes for that value, without
/// building it.
#[must_use]
pub fn encode_response_raw(id: &RequestId, result: &str) -> String {
    response_raw(id, br#","result":"#, result)
}

/// Encodes an error response whose error object is `error`, compact JSON text written as
/// is, newline included: the line [`encode_response`] writes for that error.
#[must_use]
pub fn encode_error_raw(id: &RequestId, error: &str) -> String {
    response_raw(id, br#","error":"#, error)
}

/// `{"jsonrpc":"2.0","id":<id><member><text>}` and a newline.
fn response_raw(id: &RequestId, member: &[u8], text: &str) -> String {
    let mut line = Vec::with_capacity(text.len() + 48);
    line.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    serde_json::to_writer(&mut line, id).expect("a request id always serializes");
    line.extend_from_slice(member);
    line.extend_from_slice(text.as_bytes());
    line.extend_from_slice(b"}\n");
    String::from_utf8(line).expect("serde_json writes UTF-8 and the text is a str")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<Frame, FrameError> {
        parse_frame(value.to_string().as_bytes())
    }

    #[test]
    fn a_part_shares_the_text_it_is_cut_from_and_reads_the_same() {
        let params = RawJson::valid(r#"{"sessionId":"s","update":{"text":"\u00e9 long"}}"#);
        let update = &params.get()[26..params.get().len() - 1];
        let part = params.part(update);
        assert_eq!(part.get(), r#"{"text":"\u00e9 long"}"#);
        assert_eq!(part.get().as_ptr(), update.as_ptr(), "shared, not copied");
        assert_eq!(part.to_value(), json!({"text": "\u{e9} long"}));
        assert_eq!(part, RawJson::valid(update));
        // A part of a part is still the same bytes.
        let inner = part.part(&part.get()[8..part.get().len() - 1]);
        assert_eq!(inner.get(), r#""\u00e9 long""#);
        assert_eq!(inner.raw().get(), inner.get());
        // Text from elsewhere is copied.
        let elsewhere = String::from("[1,2]");
        let copied = params.part(&elsewhere);
        assert_eq!(copied.get(), "[1,2]");
        assert_ne!(copied.get().as_ptr(), elsewhere.as_ptr());
        assert_eq!(format!("{part:?}"), format!("{:?}", RawJson::valid(update)));
    }

    #[test]
    fn a_raw_result_is_the_line_of_its_value() {
        let ids = [
            RequestId::Number(7),
            RequestId::Number(-1),
            RequestId::Str("a \"b\"\n".into()),
            RequestId::Null,
        ];
        let results = [
            json!({"stopReason": "end_turn"}),
            json!({"stopReason": "c\u{e9} \"x\""}),
            json!({}),
            json!(null),
            json!([1, "two", {"three": 3.5}]),
        ];
        for id in &ids {
            for result in &results {
                assert_eq!(
                    encode_response_raw(id, &result.to_string()),
                    encode_response(id, &Ok(result.clone())),
                );
            }
        }
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
                outcome: Ok(RawJson::from_value(&json!({"a": 1})))
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

    #[test]
    fn the_lines_agents_write_are_read_by_the_scan_not_serde() {
        let lines = [
            encode_request(
                &RequestId::Number(3),
                "session/prompt",
                &json!({"sessionId": "s", "prompt": [{"type": "text", "text": "a \"b\"\n\u{e9}\u{1F600}"}]}),
            ),
            encode_notification(
                "session/update",
                &json!({"sessionId": "s", "update": {"sessionUpdate": "tool_call", "rawInput": {"n": [1, -2.5e-3, true, false, null, {}, []]}}}),
            ),
            encode_response(&RequestId::Str("x".into()), &Ok(json!({"sessionId": "s"}))),
            encode_response(
                &RequestId::Number(9),
                &Err(RpcError::new(-32002, "Resource not found: s").with_data(json!({"uri": "s"}))),
            ),
        ];
        for line in lines {
            let line = line.trim_end().as_bytes();
            let scanned = jsonscan::envelope(line).expect("a plain line is scanned");
            // The spans the walk notes are its own (serde's reading notes none).
            let scanned = Envelope {
                update_spans: None,
                ..scanned
            };
            assert_eq!(Ok(scanned), serde_envelope(line));
            assert_eq!(parse_frame(line), parse_frame_with_serde(line));
        }
        // And what the scan leaves to serde, serde still decides.
        for line in [
            &b"{\"jsonrpc\":\"2.0\",\t\"method\":\"m\"}"[..],
            b"{\"jsonr\\u0070c\":\"2.0\",\"method\":\"m\"}",
            b"{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"method\":\"n\"}",
            b"{\"jsonrpc\":\"2.0\",\"method\":\"\\ud83d\\ude00\"}",
        ] {
            assert_eq!(jsonscan::envelope(line), None);
            assert_eq!(parse_frame(line), parse_frame_with_serde(line));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4_000))]

        /// Every id that is valid JSON is read as serde reads it: numbers of every length
        /// around 18 and 19 digits, signed, fractional, with exponents; strings; literals.
        #[test]
        fn a_request_id_is_read_as_serde_reads_it(
            text in proptest::prop_oneof![
                proptest::strategy::Strategy::prop_map("-?[0-9]{1,22}", |s: String| s),
                proptest::strategy::Strategy::prop_map(
                    "-?[0-9]{1,20}(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?",
                    |s: String| s,
                ),
                proptest::strategy::Strategy::prop_map(proptest::sample::select(vec![
                    "0", "9223372036854775807", "9223372036854775808", "999999999999999999",
                    "1000000000000000000", "-9223372036854775808", "null", "true", "\"7\"",
                    "\"a\\\"b\"", "[]", "{}",
                ]), str::to_owned),
            ],
        ) {
            proptest::prop_assume!(serde_json::from_str::<Value>(&text).is_ok());
            proptest::prop_assert_eq!(request_id(&text), parse_id(value(&text)), "{}", text);
        }

        /// A method's name is serde's reading of the value, whatever the value: strings
        /// of any characters (escaped as serde writes them, or every character as a
        /// `\u` escape), and values that are not strings.
        #[test]
        fn a_method_is_named_as_serde_reads_it(
            name in ".{0,24}",
            how in 0..4u8,
        ) {
            let text = match how {
                0 => serde_json::to_string(&name).expect("a string serializes"),
                1 => format!(
                    "\"{}\"",
                    name.encode_utf16().map(|u| format!("\\u{u:04x}")).collect::<String>()
                ),
                2 => serde_json::to_string(&json!([name])).expect("an array serializes"),
                _ => serde_json::to_string(&json!({"name": name})).expect("an object serializes"),
            };
            let serde = serde_json::from_str::<String>(&text).map_err(|_| FrameError::BadMethod);
            proptest::prop_assert_eq!(method_name(&text), serde, "{}", text);
        }
    }

    #[test]
    fn a_method_that_is_not_a_string_is_refused() {
        for text in [
            "null",
            "7",
            "-1.5e3",
            "true",
            "[]",
            "{}",
            r#"["m"]"#,
            r#"{"m":"m"}"#,
        ] {
            assert_eq!(method_name(text), Err(FrameError::BadMethod), "{text}");
        }
        assert_eq!(
            method_name(r#""session/update""#),
            Ok("session/update".into())
        );
        assert_eq!(method_name(r#""a\"b""#), Ok("a\"b".into()));
        assert_eq!(method_name(r#""""#), Ok(String::new()));
    }

    /// A line from a small alphabet that hits every branch of the envelope scan: the six
    /// members and escaped spellings of them, duplicates, `null`s, ids of every kind,
    /// strings with every escape, surrogates and non-ASCII, numbers valid and not, nesting
    /// past serde's depth limit, every whitespace byte; then cut, or with a byte replaced
    /// (a control character, a quote, invalid UTF-8).
    fn hostile_line() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let ws = prop_oneof![
            8 => prop::sample::select(vec!["", " ", "  "]),
            1 => prop::sample::select(vec!["\t", "\r\n", "\n"]),
        ];
        let names = prop::sample::select(vec![
            r#""jsonrpc""#,
            r#""id""#,
            r#""method""#,
            r#""params""#,
            r#""result""#,
            r#""error""#,
            r#""jsonr\u0070c""#,
            r#""i\u0064""#,
            r#""code""#,
            r#""message""#,
            r#""data""#,
            r#""other""#,
            r#""o\"t""#,
        ]);
        let plain = prop::sample::select(vec![
            "null",
            "true",
            "false",
            r#""2.0""#,
            r#""1.0""#,
            r#""2\u002e0""#,
            "0",
            "-0",
            "7",
            "-32002",
            "1.5",
            "1e400",
            "-1.5E+3",
            "9223372036854775807",
            "9223372036854775808",
            r#""""#,
            r#""session/update""#,
            r#""x \"q\" \\ \/ \b\f\n\r\t y""#,
            r#""\u00e9\u20AC""#,
            "\"\u{e9}\u{1F600}\"",
            r#""}]{[,:""#,
        ]);
        let broken = prop::sample::select(vec![
            "nul",
            r#""2.0 ""#,
            "2.0",
            "1e",
            "01",
            "-",
            ".5",
            r#""\ud83d\ude00""#,
            r#""\ud800""#,
            r#""\uDC00x""#,
            r#""\x""#,
            r#""\u12G4""#,
            "\"a\u{1}b\"",
            "\"a\tb\"",
        ]);
        // Strings of every length past the word scan's two 8-byte words, half of them with
        // one byte that ends or breaks a string (a control byte, a quote, a backslash) or
        // that is not one (DEL, non-ASCII) at any position.
        let long = (
            0usize..48,
            proptest::option::of((
                any::<prop::sample::Index>(),
                prop::sample::select(vec![
                    "\u{0}", "\u{1}", "\u{1f}", "\"", "\\", "\u{7f}", "\u{e9}",
                ]),
            )),
        )
            .prop_map(|(n, stop)| {
                let mut text: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
                if let (Some((at, stop)), false) = (stop, text.is_empty()) {
                    let at = at.index(text.len());
                    text.replace_range(at..=at, stop);
                }
                format!("\"{text}\"")
            });
        let leaf = prop_oneof![
            6 => plain.prop_map(str::to_owned),
            1 => broken.prop_map(str::to_owned),
            2 => long,
        ];
        let member = |names: prop::sample::Select<&'static str>,
                      ws: BoxedStrategy<&'static str>,
                      value: BoxedStrategy<String>| {
            (names, ws.clone(), ws, value).prop_map(|(n, a, b, v)| format!("{n}{a}:{b}{v}"))
        };
        let object = |members: BoxedStrategy<String>, ws: BoxedStrategy<&'static str>| {
            (prop::collection::vec(members, 0..7), ws)
                .prop_map(|(ms, w)| format!("{{{w}{}{w}}}", ms.join(&format!("{w},{w}"))))
        };
        let ws = ws.boxed();
        let (inner_names, inner_ws) = (names.clone(), ws.clone());
        let value = leaf
            .prop_recursive(4, 48, 6, move |inner| {
                prop_oneof![
                    4 => object(member(inner_names.clone(), inner_ws.clone(), inner.clone()).boxed(), inner_ws.clone()),
                    2 => prop::collection::vec(inner.clone(), 0..3)
                        .prop_map(|vs| format!("[{}]", vs.join(","))),
                    1 => (60usize..140, inner).prop_map(|(n, v)| format!(
                        "{}{v}{}",
                        "[".repeat(n),
                        "]".repeat(n)
                    )),
                ]
            })
            .boxed();
        // Mostly an object at the top, as a message is; sometimes any value.
        let message = object(
            member(names.clone(), ws.clone(), value.clone()).boxed(),
            ws.clone(),
        );
        // The shape of a real message, with its parts drawn from the same alphabet.
        let id = prop::sample::select(vec![
            "",
            r#","id":7"#,
            r#","id":"x""#,
            r#","id":null"#,
            r#","id":1.5"#,
        ]);
        let method = prop::sample::select(vec![
            "",
            r#","method":"session/update""#,
            r#","method":"m\u00e9""#,
            r#","method":7"#,
        ]);
        let payload = prop::sample::select(vec![r#","params":"#, r#","result":"#, r#","error":"#]);
        let error = prop::sample::select(vec![
            r#"{"code":-32002,"message":"Resource not found: s","data":{"uri":"s"}}"#,
            r#"{"code":-32603,"message":"m","data":null}"#,
            r#"{"code":"x","message":"m"}"#,
        ]);
        let shaped = (
            id,
            method,
            payload,
            prop_oneof![3 => value.clone(), 1 => error.prop_map(str::to_owned)],
            prop::collection::vec(member(names, ws.clone(), value.clone()).boxed(), 0..2),
            ws,
        )
            .prop_map(|(id, method, payload, value, extra, w)| {
                let extra: String = extra.iter().map(|m| format!(",{w}{m}")).collect();
                format!("{{{w}\"jsonrpc\":\"2.0\"{id}{method}{payload}{w}{value}{extra}}}")
            });
        let line = prop_oneof![
            2 => message,
            3 => shaped,
            1 => value,
        ];
        let mangle = prop_oneof![
            8 => Just(None),
            1 => (any::<prop::sample::Index>(), prop::sample::select(vec![
                0u8, 0x1f, b'"', b'\\', b',', b'}', 0xff, 0xc3, 0x80,
            ])).prop_map(Some),
        ];
        let cut = prop_oneof![8 => Just(None), 1 => any::<prop::sample::Index>().prop_map(Some)];
        (line, mangle, cut).prop_map(|(text, mangle, cut)| {
            let mut line = text.into_bytes();
            if let (Some((at, byte)), false) = (mangle, line.is_empty()) {
                let at = at.index(line.len());
                line[at] = byte;
            }
            if let Some(at) = cut {
                line.truncate(at.index(line.len() + 1));
            }
            line
        })
    }

    /// The property below is not vacuous: the scan answers for a good share of the
    /// generated lines (and leaves the rest to serde).
    #[test]
    fn the_scan_answers_for_many_hostile_lines_and_not_for_all() {
        use proptest::strategy::{Strategy, ValueTree};
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut scanned, mut framed, total) = (0, 0, 5_000);
        for _ in 0..total {
            let line = hostile_line().new_tree(&mut runner).unwrap().current();
            if jsonscan::envelope(&line).is_some() {
                scanned += 1;
                framed += usize::from(parse_frame(&line).is_ok());
            }
        }
        assert!(
            scanned * 20 > total && scanned * 10 < total * 9,
            "{scanned} of {total} scanned"
        );
        assert!(
            framed * 100 > total,
            "{framed} of {total} scanned and framed"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// Whenever the scan reads an envelope, serde reads the same one; and the frame
        /// (or the error) of every line is serde's.
        #[test]
        fn the_scanned_envelope_is_serdes_envelope(line in hostile_line()) {
            read_as_serde_reads(&line)?;
            if let Ok(text) = String::from_utf8(line.clone()) {
                let shared = parse_shared(&std::sync::Arc::new(text));
                if let Ok(Frame::Notification { params, .. }) = &shared {
                    // The spans the walk noted read the same text as the copy's.
                    let Ok(Frame::Notification { params: copied, .. }) = parse_frame(&line) else {
                        unreachable!("compared equal in read_as_serde_reads");
                    };
                    proptest::prop_assert_eq!(params.update_spans(), copied.update_spans());
                }
            }
        }
    }

    /// Whenever the scan reads an envelope of `line`, serde reads the same one; the frame
    /// (or the error) is serde's; and a line that is UTF-8 frames the same shared.
    fn read_as_serde_reads(line: &[u8]) -> Result<(), proptest::test_runner::TestCaseError> {
        let shown = String::from_utf8_lossy(line).into_owned();
        if let Some(scanned) = jsonscan::envelope(line) {
            // The spans the walk notes are its own (serde's reading notes none).
            let scanned = Envelope {
                update_spans: None,
                ..scanned
            };
            proptest::prop_assert_eq!(Ok(scanned), serde_envelope(line), "{}", shown);
        }
        proptest::prop_assert_eq!(parse_frame(line), parse_frame_with_serde(line), "{}", shown);
        if let Ok(text) = String::from_utf8(line.to_vec()) {
            let shared = parse_shared(&std::sync::Arc::new(text));
            proptest::prop_assert_eq!(&shared, &parse_frame(line), "{}", shown);
        }
        Ok(())
    }

    /// A JSON value as the compact lines carry it: mostly a plain string, sometimes one
    /// with escapes (a surrogate's among them, which the walks leave to serde),
    /// non-ASCII, a string past the word scan's two words, or not a string at all.
    fn compact_value() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            6 => "[a-z/_]{0,12}".prop_map(|s| format!("\"{s}\"")),
            2 => (0usize..40).prop_map(|n| format!("\"{}\"", "x".repeat(n))),
            2 => prop::sample::select(vec![
                r#""a\"b""#,
                r#""\\""#,
                r#""\u0041\u00e9""#,
                r#""\ud83d\ude00""#,
                r#""\n\t\/""#,
                "\"\u{e9}t\u{e9}\"",
                "\"\u{1F600}\"",
                "null",
                "7",
                "-1.5e3",
                "true",
                "{}",
                "[]",
                r#"{"a":[1,{"b":"c"}]}"#,
            ])
            .prop_map(str::to_owned),
        ]
    }

    /// An object's text from its members, in order.
    fn object_of(members: &[(&str, String)]) -> String {
        let inner: Vec<String> = members.iter().map(|(n, v)| format!("{n}:{v}")).collect();
        format!("{{{}}}", inner.join(","))
    }

    /// Lines of exactly the compact shapes [`jsonscan::compact_envelope`] reads (the
    /// `session/update` chunks, tool calls and resources agents write, requests,
    /// responses, notifications without params), with their values drawn by
    /// [`compact_value`]; then, sometimes, two members of one object swapped or one given
    /// twice or its name escaped, and up to three edits at any position: a byte replaced
    /// (by any byte, or one of the grammar's), removed or inserted, a space inserted, or
    /// the line cut.
    fn compact_line() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let values = prop::collection::vec(compact_value(), 6);
        let shape = 0usize..7;
        let names = prop::sample::select(vec![
            r#""sessionId""#,
            r#""update""#,
            r#""sessionUpdate""#,
            r#""content""#,
            r#""type""#,
            r#""session\u0049d""#,
            r#""other""#,
        ]);
        // Which object (params, update, content) is changed, and how: 0 none, 1 its first
        // two members swapped, 2 its first member given again at its end, 3 its first
        // member renamed.
        let change = (
            0usize..3,
            prop_oneof![5 => Just(0usize), 3 => 1usize..4],
            names,
        );
        let edit = (
            0usize..6,
            any::<prop::sample::Index>(),
            prop_oneof![
                2 => any::<u8>(),
                3 => prop::sample::select(vec![
                    b' ', b'"', b'\\', b'{', b'}', b'[', b',', b':', b'0', b'u', 0, 0x1f, 0xc3,
                    0x80, 0xff,
                ]),
            ],
        );
        let edits = prop::collection::vec(edit, 0..4);
        let id = prop::sample::select(vec!["0", "7", "123456", r#""x""#, "null", "-3", "1.5"]);
        (values, shape, change, edits, id).prop_map(|(v, shape, change, edits, id)| {
            let (level, how, renamed) = change;
            let mut content = match shape {
                1 => vec![
                    (r#""type""#, r#""resource""#.to_owned()),
                    (
                        r#""resource""#,
                        object_of(&[
                            (r#""uri""#, v[3].clone()),
                            (r#""mimeType""#, r#""text/plain""#.to_owned()),
                            (r#""text""#, v[4].clone()),
                        ]),
                    ),
                ],
                _ => vec![(r#""type""#, v[2].clone()), (r#""text""#, v[3].clone())],
            };
            let mut update = match shape {
                2 => vec![
                    (r#""sessionUpdate""#, r#""tool_call""#.to_owned()),
                    (r#""toolCallId""#, v[2].clone()),
                    (r#""title""#, v[3].clone()),
                    (r#""kind""#, r#""read""#.to_owned()),
                    (r#""status""#, r#""pending""#.to_owned()),
                    (r#""rawInput""#, object_of(&[(r#""text""#, v[4].clone())])),
                ],
                3 => vec![
                    (
                        r#""sessionUpdate""#,
                        r#""available_commands_update""#.to_owned(),
                    ),
                    (
                        r#""availableCommands""#,
                        r#"[{"name":"init","description":"create AGENTS.md"}]"#.to_owned(),
                    ),
                ],
                _ => vec![(r#""sessionUpdate""#, v[1].clone())],
            };
            let mut params = vec![(r#""sessionId""#, v[0].clone())];
            let change = |members: &mut Vec<(&'static str, String)>| match how {
                1 if members.len() > 1 => members.swap(0, 1),
                2 => members.push(members[0].clone()),
                3 => members[0].0 = renamed,
                _ => {}
            };
            if level == 2 {
                change(&mut content);
            }
            if matches!(shape, 0 | 1) {
                update.push((r#""content""#, object_of(&content)));
            }
            if level == 1 {
                change(&mut update);
            }
            params.push((r#""update""#, object_of(&update)));
            if level == 0 {
                change(&mut params);
            }
            let params = object_of(&params);
            let line = match shape {
                0..=3 => {
                    format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{params}}}"#)
                }
                4 => format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":{},"params":{}}}"#,
                    v[5],
                    object_of(&[
                        (r#""sessionId""#, v[0].clone()),
                        (
                            r#""prompt""#,
                            format!(r#"[{{"type":"text","text":{}}}]"#, v[1])
                        ),
                    ])
                ),
                5 => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{}}}"#, v[5]),
                _ => format!(r#"{{"jsonrpc":"2.0","method":{}}}"#, v[5]),
            };
            let mut line = line.into_bytes();
            for (kind, at, byte) in edits {
                let at = at.index(line.len() + 1);
                match kind {
                    0 if at < line.len() => line[at] = byte,
                    1 if at < line.len() => {
                        line.remove(at);
                    }
                    2 => line.insert(at, byte),
                    3 => line.insert(at, b' '),
                    4 => line.truncate(at),
                    _ => {}
                }
            }
            line
        })
    }

    /// The straight-line walk answers for most of the compact lines (the property below
    /// compares it with the reference walk only where it answers).
    #[test]
    fn the_compact_walk_answers_for_most_compact_lines() {
        use proptest::strategy::{Strategy, ValueTree};
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut fast, total) = (0, 5_000);
        for _ in 0..total {
            let line = compact_line().new_tree(&mut runner).unwrap().current();
            if let Ok(text) = std::str::from_utf8(&line) {
                fast += usize::from(jsonscan::compact_envelope(text).is_some());
            }
        }
        assert!(
            fast * 3 > total,
            "{fast} of {total} read by the compact walk"
        );
    }

    #[test]
    fn an_agents_chunk_is_read_by_the_compact_walk_with_its_spans() {
        let line = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"t#1 ..."}}}}"#;
        let fast = jsonscan::compact_envelope(line).expect("the compact shape");
        assert_eq!(Some(fast), jsonscan::reference_envelope(line));
        let params = fast.params.unwrap();
        let spans = fast.update_spans.unwrap();
        let text = |which| spans.text(params, which).unwrap().unwrap();
        assert_eq!(text(jsonscan::UpdateSpans::SESSION_ID), r#""s1""#);
        assert_eq!(
            text(jsonscan::UpdateSpans::KIND),
            r#""agent_message_chunk""#
        );
        assert_eq!(text(jsonscan::UpdateSpans::CONTENT_KIND), r#""text""#);
        assert_eq!(
            text(jsonscan::UpdateSpans::CONTENT),
            r#"{"type":"text","text":"t#1 ..."}"#
        );
        assert!(text(jsonscan::UpdateSpans::UPDATE).starts_with(r#"{"sessionUpdate":"#));
        assert!(!spans.unsure);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// On compact lines and every edit of them: the straight-line walk, when it
        /// answers, reads the envelope (and the spans) the reference walk reads, which
        /// walks every object member by member; the line's reading is the reference's;
        /// and the frame (or the error) is serde's.
        #[test]
        fn the_compact_walk_reads_what_the_general_walk_and_serde_read(line in compact_line()) {
            let shown = String::from_utf8_lossy(&line).into_owned();
            let reference = std::str::from_utf8(&line).ok().and_then(jsonscan::reference_envelope);
            if let Ok(text) = std::str::from_utf8(&line) {
                if let Some(fast) = jsonscan::compact_envelope(text) {
                    proptest::prop_assert_eq!(Some(fast), reference, "{}", shown);
                }
            }
            proptest::prop_assert_eq!(jsonscan::envelope(&line), reference, "{}", shown);
            read_as_serde_reads(&line)?;
        }
    }
}
