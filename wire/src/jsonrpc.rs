//! JSON-RPC 2.0 framing for ACP's stdio transport: one JSON object per line.
//!
//! This layer knows envelopes, not payloads: it tells a response from a request from a
//! notification, keeps `params` and `result` as raw JSON ([`RawJson`]: the receiver reads
//! the few members it needs, and a newer agent's unknown fields and update kinds pass
//! through untouched), and turns everything else into
//! a [`FrameError`] a caller can count and report. It never panics on input.
//!
//! Every line is read by `serde_json` alone: the envelope's members are borrowed from the
//! line as [`RawValue`]s (validated, not built into a tree), and the payload a frame keeps
//! is copied out once. Text that is not JSON is an error, never a value.

use serde::{Deserialize, Serialize};
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

/// One JSON value's text, kept as it came: a payload passed on untouched is neither built
/// into a tree nor serialized again. Compared by its text.
///
/// It always holds valid JSON: every way to make one validates the text (serde does, as
/// it reads a line or a state file), so reading it never falls back to anything.
#[derive(Debug, Clone)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// `text` if it is one valid JSON value, else serde's error.
    pub fn from_text(text: impl Into<String>) -> serde_json::Result<RawJson> {
        RawValue::from_string(text.into()).map(RawJson)
    }

    /// The JSON text.
    #[must_use]
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The raw value, to embed in a larger serialization.
    #[must_use]
    pub fn raw(&self) -> &RawValue {
        &self.0
    }

    /// Parsed into `T` (a tree: `parse::<serde_json::Value>()`). It fails when the value is
    /// not a `T`; for a tree, only when it holds a number outside `f64`'s range or nests
    /// deeper than serde's limit.
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> serde_json::Result<T> {
        serde_json::from_str(self.get())
    }

    /// The text of `value`.
    #[must_use]
    pub fn from_value(value: &Value) -> RawJson {
        RawJson(
            serde_json::value::to_raw_value(value)
                .expect("a Value always serializes (its keys are strings)"),
        )
    }

    /// `null`.
    #[must_use]
    pub fn null() -> RawJson {
        RawJson::from(RawValue::NULL)
    }
}

impl Serialize for RawJson {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<RawJson, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(RawJson)
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &RawJson) -> bool {
        self.get() == other.get()
    }
}

impl From<Box<RawValue>> for RawJson {
    fn from(raw: Box<RawValue>) -> RawJson {
        RawJson(raw)
    }
}

impl From<&RawValue> for RawJson {
    fn from(raw: &RawValue) -> RawJson {
        RawJson(raw.to_owned())
    }
}

/// A JSON string as serde reads it, borrowed from the text when it is written without
/// escapes (the usual case: no copy), else unescaped into a string of its own. serde's own
/// `Cow<str>` is always a copy unless it is a struct's bare field (not in an `Option`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JsonStr<'a>(pub std::borrow::Cow<'a, str>);

impl JsonStr<'_> {
    /// The string.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for JsonStr<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<JsonStr<'a>, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = JsonStr<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<JsonStr<'de>, E> {
                Ok(JsonStr(std::borrow::Cow::Borrowed(v)))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<JsonStr<'de>, E> {
                Ok(JsonStr(std::borrow::Cow::Owned(v.to_owned())))
            }

            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<JsonStr<'de>, E> {
                Ok(JsonStr(std::borrow::Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(Visitor)
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
    /// them), or an object that names one of the envelope's members twice.
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

/// The top level of a message, borrowed from the line: each member is kept as its raw
/// text (validated, not built) and read only if the message needs it. A member is present
/// when it is written, whatever its value: `"id": null` and `"result": null` are a
/// response's id and result, as JSON-RPC 2.0 has them. A member written twice makes the
/// line no message ([`FrameError::NotObject`]); members JSON-RPC does not name are skipped.
struct Envelope<'a, P> {
    jsonrpc: Option<&'a RawValue>,
    id: Option<&'a RawValue>,
    method: Option<&'a RawValue>,
    params: Option<&'a RawValue>,
    /// The `params` of the one method a caller asked to have read (see
    /// [`parse_frame_typed`]) when its `method` came first, written plainly: read in the
    /// same pass as the envelope; `params` is then `None`.
    typed: Option<P>,
    result: Option<&'a RawValue>,
    error: Option<&'a RawValue>,
}

impl<P> Default for Envelope<'_, P> {
    fn default() -> Self {
        Envelope {
            jsonrpc: None,
            id: None,
            method: None,
            params: None,
            typed: None,
            result: None,
            error: None,
        }
    }
}

/// The members of an envelope, by name.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Member {
    Jsonrpc,
    Id,
    Method,
    Params,
    Result,
    Error,
    #[serde(other)]
    Other,
}

/// Reads an [`Envelope`]; with `typed`, the params of that method are read as `P` in the
/// same pass (if they are not of that shape, the read fails and the caller reads the line
/// again without it: see [`parse_frame_typed`]).
struct EnvelopeSeed<'m, P> {
    typed: Option<&'m str>,
    params: std::marker::PhantomData<P>,
}

/// Whether a `method` member's raw text is `method` written plainly: quoted, without
/// escapes (any other spelling takes the general path).
fn written_plainly(raw: &RawValue, method: &str) -> bool {
    raw.get()
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .is_some_and(|inner| inner == method && !inner.contains(['\\', '"']))
}

impl<'de, P: Deserialize<'de>> serde::de::DeserializeSeed<'de> for EnvelopeSeed<'_, P> {
    type Value = Envelope<'de, P>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Envelope<'de, P>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, P: Deserialize<'de>> serde::de::Visitor<'de> for EnvelopeSeed<'_, P> {
    type Value = Envelope<'de, P>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON-RPC message object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<Envelope<'de, P>, A::Error> {
        fn once<E: serde::de::Error, T>(
            slot: &mut Option<T>,
            value: T,
            name: &'static str,
        ) -> Result<(), E> {
            if slot.is_some() {
                return Err(E::duplicate_field(name));
            }
            *slot = Some(value);
            Ok(())
        }
        let mut envelope = Envelope::default();
        while let Some(member) = map.next_key::<Member>()? {
            match member {
                Member::Jsonrpc => once(&mut envelope.jsonrpc, map.next_value()?, "jsonrpc")?,
                Member::Id => once(&mut envelope.id, map.next_value()?, "id")?,
                Member::Method => once(&mut envelope.method, map.next_value()?, "method")?,
                Member::Result => once(&mut envelope.result, map.next_value()?, "result")?,
                Member::Error => once(&mut envelope.error, map.next_value()?, "error")?,
                Member::Params => {
                    if envelope.params.is_some() || envelope.typed.is_some() {
                        return Err(serde::de::Error::duplicate_field("params"));
                    }
                    let typed = self.typed.is_some_and(|typed| {
                        envelope
                            .method
                            .is_some_and(|method| written_plainly(method, typed))
                    });
                    if typed {
                        envelope.typed = Some(map.next_value()?);
                    } else {
                        envelope.params = Some(map.next_value()?);
                    }
                }
                Member::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(envelope)
    }
}

/// Parses one line (without its newline) into a [`Frame`].
///
/// `serde_json` reads the whole line once, validating every byte (invalid UTF-8 anywhere
/// is [`FrameError::NotJson`]); the payload the frame keeps is copied out of the line.
pub fn parse_frame(line: &[u8]) -> Result<Frame, FrameError> {
    let text = std::str::from_utf8(line).map_err(|_| FrameError::NotJson)?;
    let envelope = envelope::<serde::de::IgnoredAny>(text, None)?;
    frame(&envelope)
}

/// A line read by [`parse_frame_typed`]: a notification of the method asked for, with its
/// params read, or any other message.
#[derive(Debug, Clone, PartialEq)]
pub enum TypedFrame<P> {
    /// A notification of the method asked for, written plainly before its `params`,
    /// whose `params` are a `P`.
    Typed(P),
    /// Any other message, as [`parse_frame`] reads it (the method asked for, too, when it
    /// was written otherwise).
    Other(Frame),
}

/// [`parse_frame`], with the `params` of a notification of `method` read into `P` by serde
/// in the same pass as the envelope (one pass over them, not one for the envelope and
/// another for the params), when `method` is written plainly before `params` (as agents
/// write the bulk of their lines). Any other spelling or order, params that are not a `P`,
/// or a request of that name (an id after the params) come back as [`parse_frame`] reads
/// them. The framing knows no method's params: `P` is the caller's.
pub fn parse_frame_typed<'a, P: Deserialize<'a>>(
    line: &'a [u8],
    method: &str,
) -> Result<TypedFrame<P>, FrameError> {
    let text = std::str::from_utf8(line).map_err(|_| FrameError::NotJson)?;
    // Params of another shape fail the first read: the line is read again without it.
    let mut envelope = envelope::<P>(text, Some(method)).or_else(|_| envelope(text, None))?;
    if envelope.typed.is_some() && envelope.id.is_some() {
        envelope = self::envelope(text, None)?;
    }
    match envelope.typed.take() {
        Some(params) => {
            // The envelope is still checked as a notification's.
            check_version(&envelope)?;
            Ok(TypedFrame::Typed(params))
        }
        None => frame(&envelope).map(TypedFrame::Other),
    }
}

/// The envelope of `text`, or why the line is no message.
fn envelope<'a, P: Deserialize<'a>>(
    text: &'a str,
    typed: Option<&str>,
) -> Result<Envelope<'a, P>, FrameError> {
    use serde::de::DeserializeSeed;
    // Serde reads a struct from an array of its members too: only an object is a message.
    let object = text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{');
    let read = object.then(|| {
        let mut de = serde_json::Deserializer::from_str(text);
        let envelope = EnvelopeSeed {
            typed,
            params: std::marker::PhantomData,
        }
        .deserialize(&mut de)?;
        de.end().map(|()| envelope)
    });
    match read {
        Some(Ok(envelope)) => Ok(envelope),
        // Valid JSON of the wrong shape (an array, a number, a repeated member), or not
        // JSON at all?
        _ => Err(match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Ok(_) => FrameError::NotObject,
            Err(_) => FrameError::NotJson,
        }),
    }
}

/// `"jsonrpc": "2.0"`, or [`FrameError::BadVersion`].
fn check_version<P>(envelope: &Envelope<'_, P>) -> Result<(), FrameError> {
    // Written plainly (every agent), the text serde validated is "2.0" itself; else the
    // version is read, borrowed from the line, or, written with escapes, unescaped into a
    // string of its own.
    let version_ok = envelope.jsonrpc.is_some_and(|v| {
        v.get() == "\"2.0\""
            || match serde_json::from_str::<&str>(v.get()) {
                Ok(version) => version == "2.0",
                Err(_) => {
                    serde_json::from_str::<String>(v.get()).is_ok_and(|version| version == "2.0")
                }
            }
    });
    if version_ok {
        Ok(())
    } else {
        Err(FrameError::BadVersion)
    }
}

/// The frame an envelope stands for.
fn frame<P>(envelope: &Envelope<'_, P>) -> Result<Frame, FrameError> {
    check_version(envelope)?;
    let id = envelope
        .id
        .map(|id| serde_json::from_str::<RequestId>(id.get()).map_err(|_| FrameError::BadId))
        .transpose()?;
    let params = || envelope.params.map_or_else(RawJson::null, RawJson::from);
    match envelope.method {
        Some(method) => {
            let method =
                serde_json::from_str::<String>(method.get()).map_err(|_| FrameError::BadMethod)?;
            Ok(match id {
                Some(id) => Frame::Request {
                    id,
                    method,
                    params: params(),
                },
                None => Frame::Notification {
                    method,
                    params: params(),
                },
            })
        }
        None => {
            // A response. An id is required (it may be null when the peer could not read
            // our id, which then matches no request).
            let id = id.ok_or(FrameError::BadResponseShape)?;
            let outcome = match (envelope.result, envelope.error) {
                (Some(result), None) => Ok(RawJson::from(result)),
                (None, Some(error)) => Err(error_object(error)?),
                _ => return Err(FrameError::BadResponseShape),
            };
            Ok(Frame::Response { id, outcome })
        }
    }
}

/// The error object `raw`: an integer `code`, a string `message`, and any `data` (an
/// explicit `"data": null` is the same as none).
fn error_object(raw: &RawValue) -> Result<RpcError, FrameError> {
    let Ok(Value::Object(mut error)) = serde_json::from_str::<Value>(raw.get()) else {
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
    let data = error.remove("data").filter(|data| !data.is_null());
    Ok(RpcError {
        code,
        message,
        data,
    })
}

/// A message as written: borrowed parts, serialized in one pass (nothing is cloned into an
/// intermediate tree).
#[derive(Serialize)]
struct Outgoing<'a, P: Serialize + ?Sized, R: Serialize + ?Sized> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a RequestId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a P>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a R>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a RpcError>,
}

impl<P: Serialize + ?Sized, R: Serialize + ?Sized> Outgoing<'_, P, R> {
    fn line(&self) -> String {
        let mut line = Vec::with_capacity(128);
        self.write_line(&mut line);
        String::from_utf8(line).expect("serde_json writes UTF-8")
    }

    /// Appends the message and its newline to `out`.
    fn write_line(&self, out: &mut Vec<u8>) {
        serde_json::to_writer(&mut *out, self)
            .expect("a message of serializable parts with string keys always serializes");
        out.push(b'\n');
    }
}

/// Encodes a request (with `id`) or a notification (without) as one line, newline
/// included; `params` serialized as they are, left out when `None`.
pub fn encode_message<P: Serialize + ?Sized>(
    id: Option<&RequestId>,
    method: &str,
    params: Option<&P>,
) -> String {
    Outgoing::<P, Value> {
        jsonrpc: "2.0",
        id,
        method: Some(method),
        params,
        result: None,
        error: None,
    }
    .line()
}

/// [`encode_message`] appended to `out` (one buffer for many lines: no line of its own).
pub fn write_message<P: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    id: Option<&RequestId>,
    method: &str,
    params: Option<&P>,
) {
    Outgoing::<P, Value> {
        jsonrpc: "2.0",
        id,
        method: Some(method),
        params,
        result: None,
        error: None,
    }
    .write_line(out);
}

/// Encodes a request as one line, newline included (`null` params are left out).
#[must_use]
pub fn encode_request(id: &RequestId, method: &str, params: &Value) -> String {
    encode_message(Some(id), method, (!params.is_null()).then_some(params))
}

/// Encodes a notification as one line, newline included (`null` params are left out).
#[must_use]
pub fn encode_notification(method: &str, params: &Value) -> String {
    encode_message(None, method, (!params.is_null()).then_some(params))
}

/// Encodes a response (result or error) as one line, newline included.
#[must_use]
pub fn encode_response<R: Serialize>(id: &RequestId, outcome: &Result<R, RpcError>) -> String {
    response(id, outcome).line()
}

/// [`encode_response`] appended to `out`.
pub fn write_response<R: Serialize>(
    out: &mut Vec<u8>,
    id: &RequestId,
    outcome: &Result<R, RpcError>,
) {
    response(id, outcome).write_line(out);
}

fn response<'a, R: Serialize>(
    id: &'a RequestId,
    outcome: &'a Result<R, RpcError>,
) -> Outgoing<'a, Value, R> {
    let (result, error) = match outcome {
        Ok(result) => (Some(result), None),
        Err(error) => (None, Some(error)),
    };
    Outgoing {
        jsonrpc: "2.0",
        id: Some(id),
        method: None,
        params: None,
        result,
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<Frame, FrameError> {
        parse_frame(value.to_string().as_bytes())
    }

    #[test]
    fn raw_json_holds_only_valid_json_and_keeps_its_text() {
        let raw = RawJson::from_text(r#"{"text":"\u00e9 long", "n": 1e400}"#).unwrap();
        assert_eq!(raw.get(), r#"{"text":"\u00e9 long", "n": 1e400}"#);
        assert_eq!(raw.raw().get(), raw.get());
        assert_eq!(
            format!("{raw:?}"),
            r#"RawJson(RawValue({"text":"\u00e9 long", "n": 1e400}))"#
        );
        // A number a tree cannot hold is valid JSON; reading it into a tree is an error,
        // not a null.
        assert!(raw.parse::<Value>().is_err());
        for invalid in [
            "",
            "nul",
            "{",
            r#"{"a":}"#,
            "[1,]",
            "1 2",
            r#""\x""#,
            "\"a\u{1}b\"",
        ] {
            assert!(RawJson::from_text(invalid).is_err(), "{invalid:?}");
        }
        assert_eq!(RawJson::null().get(), "null");
        assert_eq!(
            RawJson::from_value(&json!({"a": [1]})).get(),
            r#"{"a":[1]}"#
        );
        // Its serde form is the value itself, in and out (a state file keeps it so).
        #[derive(Serialize, Deserialize)]
        struct Kept {
            update: RawJson,
        }
        let kept = serde_json::to_string(&Kept {
            update: raw.clone(),
        })
        .unwrap();
        assert_eq!(kept, r#"{"update":{"text":"\u00e9 long", "n": 1e400}}"#);
        assert_eq!(serde_json::from_str::<Kept>(&kept).unwrap().update, raw);
        assert!(serde_json::from_str::<Kept>(r#"{"update":nul}"#).is_err());
    }

    #[test]
    fn a_json_str_is_borrowed_unless_written_with_escapes() {
        use std::borrow::Cow;
        let plain: Option<JsonStr<'_>> = serde_json::from_str(r#""plan""#).unwrap();
        assert!(matches!(plain, Some(JsonStr(Cow::Borrowed("plan")))));
        let escaped: JsonStr<'_> = serde_json::from_str(r#""pl\u0061n""#).unwrap();
        assert!(matches!(&escaped.0, Cow::Owned(s) if s == "plan"));
        assert!(serde_json::from_str::<JsonStr<'_>>("7").is_err());
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
        let line = encode_response::<Value>(&RequestId::Str("x".into()), &Err(error.clone()));
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
    fn a_null_id_and_a_null_result_are_present() {
        // JSON-RPC 2.0: a peer that could not read our id answers with `"id": null`, and
        // `null` is a result like any other.
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "p"}})),
            Ok(Frame::Response {
                id: RequestId::Null,
                outcome: Err(RpcError::new(-32700, "p"))
            })
        );
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "id": 3, "result": null})),
            Ok(Frame::Response {
                id: RequestId::Number(3),
                outcome: Ok(RawJson::null())
            })
        );
        // So a `null` error beside a result is both, and a `null` method is not a name.
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "id": 3, "result": 1, "error": null})),
            Err(FrameError::BadResponseShape)
        );
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "method": null})),
            Err(FrameError::BadMethod)
        );
        // Params of `null` are no params.
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "method": "m", "params": null})),
            Ok(Frame::Notification {
                method: "m".into(),
                params: RawJson::null()
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
        assert_eq!(
            encode_notification("m", &Value::Null),
            "{\"jsonrpc\":\"2.0\",\"method\":\"m\"}\n"
        );
    }

    #[test]
    fn garbage_is_classified_never_panics() {
        assert_eq!(parse_frame(b"hello"), Err(FrameError::NotJson));
        assert_eq!(parse_frame(b"\xff\xfe"), Err(FrameError::NotJson));
        assert_eq!(parse_frame(b""), Err(FrameError::NotJson));
        // Invalid UTF-8 anywhere, even in a member nobody reads, is not JSON.
        assert_eq!(
            parse_frame(b"{\"jsonrpc\":\"2.0\",\"x\":\"\xff\",\"method\":\"m\"}"),
            Err(FrameError::NotJson)
        );
        // So is a broken escape or a control character in a member nobody reads.
        assert_eq!(
            parse_frame(br#"{"jsonrpc":"2.0","x":"\q","method":"m"}"#),
            Err(FrameError::NotJson)
        );
        assert_eq!(
            parse_frame(b"{\"jsonrpc\":\"2.0\",\"x\":\"a\x01\",\"method\":\"m\"}"),
            Err(FrameError::NotJson)
        );
        assert_eq!(parse(json!([1, 2])), Err(FrameError::NotObject));
        assert_eq!(parse(json!([])), Err(FrameError::NotObject));
        assert_eq!(parse_frame(b" [1"), Err(FrameError::NotJson));
        assert_eq!(
            parse_frame(br#"{"jsonrpc":"2.0","method":"m","method":"n"}"#),
            Err(FrameError::NotObject)
        );
        assert_eq!(
            parse(json!({"id": 1, "result": 1})),
            Err(FrameError::BadVersion)
        );
        assert_eq!(
            parse(json!({"jsonrpc": "1.0", "id": 1, "result": 1})),
            Err(FrameError::BadVersion)
        );
        assert_eq!(
            parse(json!({"jsonrpc": 2, "id": 1, "result": 1})),
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

    /// The id a tree of `text` stands for: the reference for the frame's reading.
    fn id_of_tree(text: &str) -> Result<RequestId, FrameError> {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Null) => Ok(RequestId::Null),
            Ok(Value::String(s)) => Ok(RequestId::Str(s)),
            Ok(Value::Number(n)) => n.as_i64().map(RequestId::Number).ok_or(FrameError::BadId),
            _ => Err(FrameError::BadId),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4_000))]

        /// Every id that is valid JSON is read as a tree reads it: numbers of every length
        /// around 18 and 19 digits, signed, fractional, with exponents; strings; literals.
        #[test]
        fn a_request_id_is_read_as_a_tree_reads_it(
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
            let line = format!(r#"{{"jsonrpc":"2.0","id":{text},"result":1}}"#);
            let id = parse_frame(line.as_bytes()).map(|frame| match frame {
                Frame::Response { id, .. } => id,
                other => unreachable!("{other:?}"),
            });
            proptest::prop_assert_eq!(id, id_of_tree(&text), "{}", text);
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
            let line = format!(r#"{{"jsonrpc":"2.0","method":{text}}}"#);
            let method = parse_frame(line.as_bytes()).map(|frame| match frame {
                Frame::Notification { method, .. } => method,
                other => unreachable!("{other:?}"),
            });
            let serde = serde_json::from_str::<String>(&text).map_err(|_| FrameError::BadMethod);
            proptest::prop_assert_eq!(method, serde, "{}", text);
        }
    }

    /// A line from a small alphabet of what a hostile agent may write: the six envelope
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
        // Strings of every length up to a few 8-byte words, half of them with one byte
        // that ends or breaks a string (a control byte, a quote, a backslash) or that is
        // not one (DEL, non-ASCII) at any position.
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

    /// What serde_json says of `line` as a whole: not JSON text at all (`None`), or valid
    /// JSON and its tree when a tree can hold it.
    fn serde_reading(line: &[u8]) -> Option<Result<Value, serde_json::Error>> {
        let text = std::str::from_utf8(line).ok()?;
        serde_json::from_str::<serde::de::IgnoredAny>(text).ok()?;
        Some(serde_json::from_str::<Value>(text))
    }

    /// Invalid text is an error and never a value: a line that is not JSON text (invalid
    /// UTF-8 anywhere, a broken escape or number, a cut) is [`FrameError::NotJson`], and
    /// only such a line is. Valid JSON that is not an object is
    /// [`FrameError::NotObject`]. A frame keeps valid JSON only, each payload exactly the
    /// member the tree of the line holds.
    fn invalid_text_is_an_error(line: &[u8]) -> Result<(), proptest::test_runner::TestCaseError> {
        let shown = String::from_utf8_lossy(line).into_owned();
        let frame = parse_frame(line);
        let Some(tree) = serde_reading(line) else {
            proptest::prop_assert_eq!(frame, Err(FrameError::NotJson), "{}", shown);
            return Ok(());
        };
        proptest::prop_assert_ne!(&frame, &Err(FrameError::NotJson), "{}", shown);
        let Ok(tree) = tree else {
            return Ok(());
        };
        let Some(object) = tree.as_object() else {
            proptest::prop_assert_eq!(frame, Err(FrameError::NotObject), "{}", shown);
            return Ok(());
        };
        let (member, payload) = match &frame {
            Ok(Frame::Request { params, .. } | Frame::Notification { params, .. }) => {
                ("params", params)
            }
            Ok(Frame::Response {
                outcome: Ok(result),
                ..
            }) => ("result", result),
            _ => return Ok(()),
        };
        proptest::prop_assert!(RawJson::from_text(payload.get()).is_ok(), "{}", shown);
        let expected = object.get(member).cloned().unwrap_or(Value::Null);
        proptest::prop_assert_eq!(payload.parse::<Value>().ok(), Some(expected), "{}", shown);
        Ok(())
    }

    /// The properties below are not vacuous: of the hostile lines, many are not JSON and
    /// many frame.
    #[test]
    fn hostile_lines_are_both_garbage_and_messages() {
        use proptest::strategy::{Strategy, ValueTree};
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut not_json, mut framed, total) = (0, 0, 5_000);
        for _ in 0..total {
            let line = hostile_line().new_tree(&mut runner).unwrap().current();
            match parse_frame(&line) {
                Err(FrameError::NotJson) => not_json += 1,
                Ok(_) => framed += 1,
                Err(_) => {}
            }
        }
        assert!(not_json * 20 > total, "{not_json} of {total} not JSON");
        assert!(framed * 100 > total, "{framed} of {total} framed");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// See [`invalid_text_is_an_error`].
        #[test]
        fn a_hostile_line_that_is_not_json_is_an_error(line in hostile_line()) {
            invalid_text_is_an_error(&line)?;
        }
    }

    /// A JSON value as the compact lines carry it: mostly a plain string, sometimes one
    /// with escapes (a surrogate's among them), non-ASCII, a longer string, or not a
    /// string at all.
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

    /// Lines of the compact shapes agents write (the `session/update` chunks, tool calls
    /// and resources, requests,
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

    /// The compact lines frame when unedited, and their edits are often not JSON: the
    /// property below sees both.
    #[test]
    fn compact_lines_frame_and_their_edits_often_do_not() {
        use proptest::strategy::{Strategy, ValueTree};
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut framed, mut not_json, total) = (0, 0, 5_000);
        for _ in 0..total {
            let line = compact_line().new_tree(&mut runner).unwrap().current();
            match parse_frame(&line) {
                Ok(_) => framed += 1,
                Err(FrameError::NotJson) => not_json += 1,
                Err(_) => {}
            }
        }
        assert!(framed * 4 > total, "{framed} of {total} framed");
        assert!(not_json * 4 > total, "{not_json} of {total} not JSON");
    }

    #[test]
    fn an_agents_chunk_frames_with_its_params_as_written() {
        let params = r#"{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"t#1 ..."}}}"#;
        let line = format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{params}}}"#);
        assert_eq!(
            parse_frame(line.as_bytes()),
            Ok(Frame::Notification {
                method: "session/update".into(),
                params: RawJson::from_text(params).unwrap()
            })
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// On the compact lines agents write and every edit of them: see
        /// [`invalid_text_is_an_error`].
        #[test]
        fn an_edited_agent_line_that_is_not_json_is_an_error(line in compact_line()) {
            invalid_text_is_an_error(&line)?;
        }
    }
}
