//! Reading a few members out of JSON text that serde_json has already validated (a
//! [`RawJson`](crate::jsonrpc::RawJson) or a slice of one), without building anything.
//!
//! A `session/update` is read three times on its way to the caller: framed (validated) by
//! [`parse_frame`](crate::jsonrpc::parse_frame), split into its session id and `update`,
//! and its `update` read for its kind. Most of its bytes are one long string (a text
//! chunk, a tool call's input); serde skips a string eight bytes at a time checking every
//! byte for control characters, which text already validated cannot contain. This module
//! walks the text's structure and skips strings with `memchr`, so the last read costs a
//! small fraction of a parse.
//!
//! It only ever answers for the plain shape: an object whose member names have no escapes,
//! the members looked for present at most once, with the expected kind of value. Anything
//! else is `None`, and the caller asks serde, so the answer is always serde's (a test
//! compares the two on generated and adversarial text).

/// The members of the object `text` (valid JSON), in order: each name as written between
/// its quotes (escapes not decoded) and its value's text. `None` if `text` is not an object.
pub fn members(text: &str) -> Option<Members<'_>> {
    let at = skip_ws(text.as_bytes(), 0);
    (text.as_bytes().get(at) == Some(&b'{')).then_some(Members {
        text,
        at: at + 1,
        done: false,
    })
}

/// See [`members`].
#[derive(Debug)]
pub struct Members<'a> {
    text: &'a str,
    at: usize,
    done: bool,
}

impl<'a> Members<'a> {
    /// The next member's name and where its value starts, without reading the value: the
    /// caller then either skips it ([`Members::value_at`]) or walks it
    /// ([`Members::object_at`], then [`Members::resume_after`]), so an object is walked once.
    pub fn next_name(&mut self) -> Option<(&'a str, usize)> {
        if self.done {
            return None;
        }
        let b = self.text.as_bytes();
        let mut at = skip_ws(b, self.at);
        if b.get(at) == Some(&b',') {
            at = skip_ws(b, at + 1);
        }
        if b.get(at) != Some(&b'"') {
            // `}`: the end of the object (valid JSON allows nothing else here).
            self.done = true;
            self.at = at;
            return None;
        }
        let name_end = skip_string(b, at)?;
        let name = self.text.get(at + 1..name_end - 1)?;
        let colon = skip_ws(b, name_end);
        let start = skip_ws(b, colon + 1);
        self.at = start;
        Some((name, start))
    }

    /// The text of the value that starts at `start` (from [`Members::next_name`]); the walk
    /// goes on after it.
    pub fn value_at(&mut self, start: usize) -> Option<&'a str> {
        let end = skip_value(self.text.as_bytes(), start)?;
        self.at = end;
        self.text.get(start..end)
    }

    /// The members of the value that starts at `start` when it is an object; `None` for
    /// any other value. Once they are read to the end, [`Members::resume_after`] goes on
    /// after the object.
    pub fn object_at(&self, start: usize) -> Option<Members<'a>> {
        (self.text.as_bytes().get(start) == Some(&b'{')).then_some(Members {
            text: self.text,
            at: start + 1,
            done: false,
        })
    }

    /// Goes on after the object whose members `inner` read to the end; `None` if `inner`
    /// was not read to its end.
    pub fn resume_after(&mut self, inner: &Members<'a>) -> Option<()> {
        if !inner.done || self.text.as_bytes().get(inner.at) != Some(&b'}') {
            return None;
        }
        self.at = inner.at + 1;
        Some(())
    }
}

impl<'a> Iterator for Members<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<(&'a str, &'a str)> {
        let (name, start) = self.next_name()?;
        Some((name, self.value_at(start)?))
    }
}

/// What a member's value is, when it is one of the plain kinds a reader takes as is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plain<'a> {
    /// `null`.
    Null,
    /// A string without escapes: its text between the quotes.
    Str(&'a str),
    /// An object: its whole text.
    Object(&'a str),
}

/// `value` (the text of one valid JSON value) as a [`Plain`], or `None` for any other
/// kind (a string with escapes, a number, an array, ...).
pub fn plain(value: &str) -> Option<Plain<'_>> {
    match value.as_bytes().first()? {
        b'n' => Some(Plain::Null),
        b'{' => Some(Plain::Object(value)),
        b'"' => {
            let inner = value.get(1..value.len() - 1)?;
            // A byte loop: these strings are short, too short for `memchr`'s setup.
            (!inner.bytes().any(|c| c == b'\\')).then_some(Plain::Str(inner))
        }
        _ => None,
    }
}

fn skip_ws(b: &[u8], mut at: usize) -> usize {
    while matches!(b.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// The index just past the string that starts at `at` (a `"`).
fn skip_string(b: &[u8], at: usize) -> Option<usize> {
    let mut from = at + 1;
    loop {
        let hit = from + memchr::memchr2(b'"', b'\\', b.get(from..)?)?;
        if b[hit] == b'"' {
            return Some(hit + 1);
        }
        // An escape: the byte after the backslash is never the closing quote (`\uXXXX`'s
        // digits are neither quotes nor backslashes).
        from = hit + 2;
    }
}

/// The index just past the value that starts at `at`.
fn skip_value(b: &[u8], at: usize) -> Option<usize> {
    match b.get(at)? {
        b'"' => skip_string(b, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match b.get(i)? {
                    b'"' => {
                        i = skip_string(b, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        // A number or a literal: up to the next delimiter.
        _ => Some(
            at + b[at..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(b.len() - at),
        ),
    }
}

/// The top-level members of a JSON-RPC message, each as its value's text (`None` when
/// absent or `null`, as serde reads an `Option`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Envelope<'a> {
    pub jsonrpc: Option<&'a str>,
    pub id: Option<&'a str>,
    pub method: Option<&'a str>,
    pub params: Option<&'a str>,
    pub result: Option<&'a str>,
    pub error: Option<&'a str>,
    /// Where the members a `session/update` is read for lie in `params`, when `params`
    /// is an object and the validating walk noted them (see [`UpdateSpans`]).
    pub update_spans: Option<UpdateSpans>,
}

/// Where the members the engine reads of a `session/update` lie in its params' text (byte
/// ranges from the start of the params, each a value's text): noted by [`envelope`]'s
/// validating walk as it passes them, so the params are not walked again to find them.
///
/// It notes the plain shape only: `unsure` is set when a member name at one of the
/// levels it reads has an escape (it may spell a name looked for) or a member looked for
/// is given twice; the reader then reads the params as if nothing had been noted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UpdateSpans {
    /// `sessionId`, `update`, `update.sessionUpdate`, `update.content`,
    /// `update.content.type`, in that order (see [`UpdateSpans::SESSION_ID`] and the rest).
    pub spans: [Option<(usize, usize)>; 5],
    /// The noted spans may not be what serde reads: read the params without them.
    pub unsure: bool,
}

impl UpdateSpans {
    /// `params.sessionId`.
    pub const SESSION_ID: usize = 0;
    /// `params.update`.
    pub const UPDATE: usize = 1;
    /// `params.update.sessionUpdate`.
    pub const KIND: usize = 2;
    /// `params.update.content`.
    pub const CONTENT: usize = 3;
    /// `params.update.content.type`.
    pub const CONTENT_KIND: usize = 4;

    /// Notes that the member `which` lies at `span`; a member given twice makes the
    /// spans unsure (serde reads the last one, the walk would hold the first).
    fn note(&mut self, which: usize, span: (usize, usize)) {
        if self.spans[which].replace(span).is_some() {
            self.unsure = true;
        }
    }

    /// The text of the member `which` in `params` (the text the spans were noted in):
    /// `Some(None)` when it was not there.
    pub fn text<'a>(&self, params: &'a str, which: usize) -> Option<Option<&'a str>> {
        match self.spans[which] {
            None => Some(None),
            Some((start, end)) => params.get(start..end).map(Some),
        }
    }
}

/// Which object [`valid_noting`] walks: the members it notes depend on it.
#[derive(Debug, Clone, Copy)]
enum Level {
    Params,
    Update,
    Content,
}

/// How deep the validating walk follows nested arrays and objects before it leaves the
/// line to serde: below serde_json's own limit (128), so nothing it refuses for depth is
/// ever accepted here.
const MAX_DEPTH: usize = 64;

/// The envelope of `line` when it is, for certain, one JSON object that serde_json accepts
/// and reads into the same envelope; `None` when serde must decide (anything unusual:
/// control characters or tabs anywhere, escaped member names at the top level, a
/// top-level member given twice, a `\u` escape of a surrogate, deep nesting, invalid
/// JSON of any kind).
///
/// Unlike the rest of this module it validates: every byte of the line is checked
/// against the JSON grammar (each string's bytes by [`string_stop`], after one UTF-8
/// check), so it can stand in for serde's validating pass over a message.
pub fn envelope(line: &[u8]) -> Option<Envelope<'_>> {
    envelope_of_text(std::str::from_utf8(line).ok()?)
}

/// [`envelope`] of a line already known to be UTF-8 (a `String`): its one UTF-8 check is
/// the one the `String` passed.
///
/// Lines as serde_json writes them (no whitespace, the members in the order the peers
/// write them) are read by [`compact_envelope`], straight-line code; any other line, and
/// any line that walk does not answer for, by [`general_envelope`]. Both answer the same
/// (a test mutates compact lines at every position and compares them).
pub fn envelope_of_text(text: &str) -> Option<Envelope<'_>> {
    compact_envelope(text).or_else(|| general_envelope(text))
}

/// The text of a member's value as an [`Envelope`] holds it: `None` for `null`, as serde
/// reads an `Option`.
fn non_null(value: &str) -> Option<&str> {
    (value != "null").then_some(value)
}

/// The index just past `literal` when `b` has it at `at`.
fn literal_at(b: &[u8], at: usize, literal: &[u8]) -> Option<usize> {
    let end = at.checked_add(literal.len())?;
    (b.get(at..end)? == literal).then_some(end)
}

/// [`envelope_of_text`] of a line of the compact shapes the peers write,
/// `{"jsonrpc":"2.0"` then `,"id":<value>` or not, then `,"method":<value>` and
/// `,"params":<value>` or not, or `,"result":<value>`, then `}` and the line's end;
/// `None` for any other line (leaving it to [`general_envelope`]), and for a line whose
/// values are not valid (which that walk refuses too).
///
/// The member names are matched as literals, so none is escaped or given twice, and each
/// value is checked by the same functions as in [`general_envelope`]: the envelope is the
/// one that walk reads.
pub fn compact_envelope(text: &str) -> Option<Envelope<'_>> {
    const JSONRPC: &[u8] = br#"{"jsonrpc":"2.0","#;
    let b = text.as_bytes();
    let mut at = literal_at(b, 0, JSONRPC)?;
    let mut envelope = Envelope {
        // `"2.0"`, between `{"jsonrpc":` and the comma.
        jsonrpc: Some(text.get(JSONRPC.len() - 6..JSONRPC.len() - 1)?),
        ..Envelope::default()
    };
    if let Some(start) = literal_at(b, at, br#""id":"#) {
        let end = valid_value(b, start, MAX_DEPTH)?;
        envelope.id = non_null(text.get(start..end)?);
        at = literal_at(b, end, b",")?;
    }
    if let Some(start) = literal_at(b, at, br#""method":"#) {
        let end = valid_value(b, start, MAX_DEPTH)?;
        envelope.method = non_null(text.get(start..end)?);
        at = end;
        if let Some(start) = literal_at(b, at, br#","params":"#) {
            let (end, spans) = params_value(b, start, noting_params)?;
            envelope.params = non_null(text.get(start..end)?);
            envelope.update_spans = spans;
            at = end;
        }
    } else {
        let start = literal_at(b, at, br#""result":"#)?;
        let end = valid_value(b, start, MAX_DEPTH)?;
        envelope.result = non_null(text.get(start..end)?);
        at = end;
    }
    (literal_at(b, at, b"}")? == b.len()).then_some(envelope)
}

/// The index just past the valid `params` value at `start` and, when it is an object, the
/// spans of the members a `session/update` is read for (from the start of the params),
/// which `noting` walks and notes ([`noting_params`]; the tests' reference walk passes
/// [`valid_noting`] itself).
fn params_value(
    b: &[u8],
    start: usize,
    noting: impl Fn(&[u8], usize, &mut UpdateSpans) -> Option<usize>,
) -> Option<(usize, Option<UpdateSpans>)> {
    if b.get(start) != Some(&b'{') {
        return Some((valid_value(b, start, MAX_DEPTH)?, None));
    }
    let mut spans = UpdateSpans::default();
    let end = noting(b, start, &mut spans)?;
    for span in spans.spans.iter_mut().flatten() {
        *span = (span.0 - start, span.1 - start);
    }
    Some((end, Some(spans)))
}

/// [`valid_noting`] of the params object at `start` (at [`MAX_DEPTH`]), with straight-line
/// code for the members of a compact `session/update` in the order agents write them:
/// `{"sessionId":<value>,"update":{"sessionUpdate":<value>,"content":{"type":<value>`.
/// Where the text differs from that prefix, the walk goes on with the general code for
/// the rest of the object it is in ([`rest_of_object`] and [`note_member`]), so each
/// member is read, checked and noted as [`valid_noting`] reads it.
fn noting_params(b: &[u8], start: usize, spans: &mut UpdateSpans) -> Option<usize> {
    // The depth [`valid_noting`] gives the members' values of each level.
    const PARAMS: usize = MAX_DEPTH - 1;
    const UPDATE: usize = MAX_DEPTH - 2;
    const CONTENT: usize = MAX_DEPTH - 3;
    let Some(at) = literal_at(b, start, br#"{"sessionId":"#) else {
        return valid_noting(b, start, MAX_DEPTH, Level::Params, spans);
    };
    // The first member of each object: no span is noted yet, so none is given twice. A
    // value may follow its colon after spaces, as in `valid_object`.
    let at = skip_spaces(b, at);
    let session_end = valid_value(b, at, PARAMS)?;
    spans.spans[UpdateSpans::SESSION_ID] = Some((at, session_end));
    let Some(at) = literal_at(b, session_end, br#","update":{"sessionUpdate":"#) else {
        return rest_of_object(b, session_end, |name, at| {
            note_member(b, Level::Params, PARAMS, name, at, spans)
        });
    };
    let update_start = session_end + br#","update":"#.len();
    let at = skip_spaces(b, at);
    let kind_end = valid_value(b, at, UPDATE)?;
    spans.spans[UpdateSpans::KIND] = Some((at, kind_end));
    let update_end = match literal_at(b, kind_end, br#","content":{"type":"#) {
        Some(at) => {
            let content_start = kind_end + br#","content":"#.len();
            let at = skip_spaces(b, at);
            let type_end = valid_value(b, at, CONTENT)?;
            spans.spans[UpdateSpans::CONTENT_KIND] = Some((at, type_end));
            let content_end = rest_of_object(b, type_end, |name, at| {
                note_member(b, Level::Content, CONTENT, name, at, spans)
            })?;
            // Noted after the content's own members, as `note_member` notes it.
            spans.note(UpdateSpans::CONTENT, (content_start, content_end));
            rest_of_object(b, content_end, |name, at| {
                note_member(b, Level::Update, UPDATE, name, at, spans)
            })?
        }
        None => rest_of_object(b, kind_end, |name, at| {
            note_member(b, Level::Update, UPDATE, name, at, spans)
        })?,
    };
    spans.note(UpdateSpans::UPDATE, (update_start, update_end));
    rest_of_object(b, update_end, |name, at| {
        note_member(b, Level::Params, PARAMS, name, at, spans)
    })
}

/// The validating walk of any line: [`envelope_of_text`]'s answer for every line
/// [`compact_envelope`] does not read.
fn general_envelope(text: &str) -> Option<Envelope<'_>> {
    walk_envelope(text, noting_params)
}

/// [`general_envelope`] with no straight-line code anywhere: each object walked member by
/// member ([`valid_noting`]). The reference the fast paths are tested against.
#[cfg(test)]
pub fn reference_envelope(text: &str) -> Option<Envelope<'_>> {
    walk_envelope(text, |b, start, spans| {
        valid_noting(b, start, MAX_DEPTH, Level::Params, spans)
    })
}

/// [`general_envelope`], its params' objects walked and noted by `noting` (see
/// [`params_value`]).
fn walk_envelope(
    text: &str,
    noting: impl Fn(&[u8], usize, &mut UpdateSpans) -> Option<usize> + Copy,
) -> Option<Envelope<'_>> {
    // A byte below 0x20 is an error inside a string (`valid_string` refuses it) and
    // whitespace (tab, CR, LF) outside one, where only spaces are skipped and any other
    // byte fails the grammar: telling tabs and newlines apart is serde's job.
    let b = text.as_bytes();
    let mut at = skip_spaces(b, 0);
    if b.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_spaces(b, at + 1);
    let mut envelope = Envelope::default();
    // Which members were seen, `null` ones included: serde refuses a second one.
    let mut seen = [false; 6];
    if b.get(at) == Some(&b'}') {
        at += 1;
    } else {
        loop {
            if b.get(at) != Some(&b'"') {
                return None;
            }
            let name_end = valid_string(b, at)?;
            let name = text.get(at + 1..name_end - 1)?;
            at = skip_spaces(b, name_end);
            if b.get(at) != Some(&b':') {
                return None;
            }
            let start = skip_spaces(b, at + 1);
            // The params are validated by the same grammar either way; an object is also
            // walked for the members a `session/update` is read for.
            let end = if name == "params" {
                let (end, spans) = params_value(b, start, noting)?;
                envelope.update_spans = spans;
                end
            } else {
                valid_value(b, start, MAX_DEPTH)?
            };
            let value = text.get(start..end)?;
            let slot = match name {
                "jsonrpc" => Some((0, &mut envelope.jsonrpc)),
                "id" => Some((1, &mut envelope.id)),
                "method" => Some((2, &mut envelope.method)),
                "params" => Some((3, &mut envelope.params)),
                "result" => Some((4, &mut envelope.result)),
                "error" => Some((5, &mut envelope.error)),
                // An escaped name may spell one of the six.
                _ if name.contains('\\') => return None,
                _ => None,
            };
            if let Some((index, slot)) = slot {
                if std::mem::replace(&mut seen[index], true) {
                    return None;
                }
                *slot = non_null(value);
            }
            at = skip_spaces(b, end);
            match b.get(at) {
                Some(b',') => at = skip_spaces(b, at + 1),
                Some(b'}') => {
                    at += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    (skip_spaces(b, at) == b.len()).then_some(envelope)
}

/// Past the spaces from `at` ([`envelope`] has ruled out every other whitespace byte).
fn skip_spaces(b: &[u8], mut at: usize) -> usize {
    while b.get(at) == Some(&b' ') {
        at += 1;
    }
    at
}

/// The index just past the valid string that starts at `at` (a `"`); `None` if it is not
/// one (a control character in it, a bad escape, no end), or has a surrogate's `\u`
/// escape. serde skips those unchecked too, so leaving them to serde costs speed only on
/// such lines; it is caution, not a fence. The caller has checked the bytes for UTF-8.
///
/// Most strings of a message are names and short values that end within
/// [`SHORT_WORDS`] words without an escape: those are read here, in a few instructions
/// the callers inline. Any other string (a long one, one with an escape or a control
/// byte, one near the line's end) is read from its start by [`valid_long_string`], whose
/// loop is the reference this shortcut must agree with (it stops at the same first stop
/// byte, and answers only when that byte is the closing quote).
#[inline]
fn valid_string(b: &[u8], at: usize) -> Option<usize> {
    let mut from = at + 1;
    for _ in 0..SHORT_WORDS {
        let Some(word) = b.get(from..from + 8) else {
            break;
        };
        let stops = stop_bytes(u64::from_le_bytes(
            word.try_into().expect("a range of eight bytes"),
        ));
        if stops != 0 {
            // The lowest flagged byte is the first stop byte (little-endian).
            let hit = from + (stops.trailing_zeros() / 8) as usize;
            if b[hit] == b'"' {
                return Some(hit + 1);
            }
            break;
        }
        from += 8;
    }
    valid_long_string(b, from)
}

/// [`valid_string`] of a string whose bytes before `from` are plain (neither a quote, a
/// backslash nor a control byte): escapes, control bytes and long runs (see
/// [`string_stop`]). Kept out of line so that the short strings' path stays small.
#[inline(never)]
fn valid_long_string(b: &[u8], mut from: usize) -> Option<usize> {
    loop {
        let hit = string_stop(b, from)?;
        from = match b[hit] {
            b'"' => return Some(hit + 1),
            b'\\' => match b.get(hit + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => hit + 2,
                b'u' => {
                    let digits = b.get(hit + 2..hit + 6)?;
                    if !digits.iter().all(u8::is_ascii_hexdigit) {
                        return None;
                    }
                    // Surrogates (D800–DFFF) are left to serde (see above).
                    if matches!(digits[0], b'd' | b'D') && !matches!(digits[1], b'0'..=b'7') {
                        return None;
                    }
                    hit + 6
                }
                _ => return None,
            },
            // A control character, which a JSON string must escape.
            _ => return None,
        };
    }
}

/// `0x01` in every byte of a word.
const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
/// `0x80` in every byte of a word.
const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);

/// Words [`string_stop`] reads one at a time before it hands a long string to `memchr`:
/// two cover the member names and short values of a message (`"sessionUpdate"` and its
/// closing quote are 14 bytes), whose `memchr` call would cost more than the scan.
const SHORT_WORDS: usize = 2;

/// The index of the first byte from `from` that ends a string's run of plain characters:
/// a `"`, a `\`, or a control character (below 0x20); `None` if none is left.
///
/// The first [`SHORT_WORDS`] words are read eight bytes at a time (see [`stop_bytes`]).
/// Past them the string is long (a text chunk): `memchr` finds its next quote or
/// backslash, and one pass without early exit, which the compiler vectorizes, checks the
/// bytes it skipped for control characters. That is two passes over a long string, but
/// each costs a fraction of one that looks for all three kinds of byte at once.
fn string_stop(b: &[u8], mut from: usize) -> Option<usize> {
    for _ in 0..SHORT_WORDS {
        let Some(word) = b.get(from..from + 8) else {
            // The line's last few bytes, one at a time.
            return b
                .get(from..)?
                .iter()
                .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
                .map(|i| from + i);
        };
        let word = u64::from_le_bytes(word.try_into().expect("a range of eight bytes"));
        let stops = stop_bytes(word);
        if stops != 0 {
            // The lowest flagged byte is the first in the line (little-endian).
            return Some(from + (stops.trailing_zeros() / 8) as usize);
        }
        from += 8;
    }
    let rest = b.get(from..)?;
    let hit = memchr::memchr2(b'"', b'\\', rest);
    let run = &rest[..hit.unwrap_or(rest.len())];
    // The smallest byte, a running minimum the compiler vectorizes (two instructions for
    // sixteen bytes): cheaper than comparing each byte with 0x20 on the way.
    if run.iter().fold(u8::MAX, |least, &c| least.min(c)) < 0x20 {
        return run.iter().position(|&c| c < 0x20).map(|i| from + i);
    }
    hit.map(|i| from + i)
}

/// A word with the high bit set in the byte of each `"`, `\` or control character of
/// `word`, and possibly in bytes above the first such one (never below it): the first
/// flagged byte is exact, which is all [`string_stop`] reads.
///
/// `x - 0x01…` sets a byte's high bit without a borrow from below exactly when the byte is
/// zero or at least 0x81, and `& !x` drops those at or above 0x80: so each byte is flagged
/// exactly when it is zero, until the first borrow, which only a flagged byte starts.
/// The same holds for `x - 0x20…` and bytes below 0x20, and for `"` and `\` after an
/// exclusive or turns them into zeros.
///
/// These are also exactly the bytes a JSON string must escape, so the writer of the
/// engine's requests (`acp`'s `write_str`) uses it to skip words that need no escape.
pub fn stop_bytes(word: u64) -> u64 {
    let quote = word ^ (ONES * u64::from(b'"'));
    let backslash = word ^ (ONES * u64::from(b'\\'));
    let zero_quote = quote.wrapping_sub(ONES) & !quote;
    let zero_backslash = backslash.wrapping_sub(ONES) & !backslash;
    let control = word.wrapping_sub(ONES * 0x20) & !word;
    (zero_quote | zero_backslash | control) & HIGHS
}

/// The index just past the valid JSON value that starts at `at`, nested at most `depth`
/// arrays or objects deep; `None` if there is none.
fn valid_value(b: &[u8], at: usize, depth: usize) -> Option<usize> {
    match *b.get(at)? {
        b'"' => valid_string(b, at),
        b'{' => {
            let depth = depth.checked_sub(1)?;
            valid_object(b, at, |_, start| valid_value(b, start, depth))
        }
        b'[' => {
            let depth = depth.checked_sub(1)?;
            let mut at = skip_spaces(b, at + 1);
            if b.get(at) == Some(&b']') {
                return Some(at + 1);
            }
            loop {
                at = skip_spaces(b, valid_value(b, at, depth)?);
                match b.get(at)? {
                    b',' => at = skip_spaces(b, at + 1),
                    b']' => return Some(at + 1),
                    _ => return None,
                }
            }
        }
        b't' => literal(b, at, b"true"),
        b'f' => literal(b, at, b"false"),
        b'n' => literal(b, at, b"null"),
        b'-' | b'0'..=b'9' => valid_number(b, at),
        _ => None,
    }
}

/// [`valid_value`] of the object at `at` (the same grammar and depth), noting in `spans`
/// where the members of `level` that a `session/update` is read for lie, and walking
/// the `update` and its `content` the same way when they are objects.
fn valid_noting(
    b: &[u8],
    at: usize,
    depth: usize,
    level: Level,
    spans: &mut UpdateSpans,
) -> Option<usize> {
    let depth = depth.checked_sub(1)?;
    valid_object(b, at, |name, start| {
        note_member(b, level, depth, name, start, spans)
    })
}

/// The index just past the value at `start` of the member `name` of an object of `level`
/// that [`valid_noting`] walks, its members' values at most `depth` deep; noting its span
/// in `spans` when it is one a `session/update` is read for.
fn note_member(
    b: &[u8],
    level: Level,
    depth: usize,
    name: &[u8],
    start: usize,
    spans: &mut UpdateSpans,
) -> Option<usize> {
    let (slot, inner) = match (level, name) {
        (Level::Params, b"sessionId") => (Some(UpdateSpans::SESSION_ID), None),
        (Level::Params, b"update") => (Some(UpdateSpans::UPDATE), Some(Level::Update)),
        (Level::Update, b"sessionUpdate") => (Some(UpdateSpans::KIND), None),
        (Level::Update, b"content") => (Some(UpdateSpans::CONTENT), Some(Level::Content)),
        (Level::Content, b"type") => (Some(UpdateSpans::CONTENT_KIND), None),
        _ => {
            // An escaped name may spell one looked for.
            if name.contains(&b'\\') {
                spans.unsure = true;
            }
            (None, None)
        }
    };
    let end = match inner {
        Some(inner) if b.get(start) == Some(&b'{') => valid_noting(b, start, depth, inner, spans)?,
        _ => valid_value(b, start, depth)?,
    };
    if let Some(slot) = slot {
        spans.note(slot, (start, end));
    }
    Some(end)
}

/// The index just past the object that starts at `at` (its `{`; the caller has counted its
/// depth): each member's name is checked here, and `value(name, start)` checks the value
/// that starts at `start` and returns the index just past it. `name` is the raw text
/// between the quotes, escapes unresolved.
fn valid_object(
    b: &[u8],
    at: usize,
    value: impl FnMut(&[u8], usize) -> Option<usize>,
) -> Option<usize> {
    let at = skip_spaces(b, at + 1);
    if b.get(at) == Some(&b'}') {
        return Some(at + 1);
    }
    valid_members(b, at, value)
}

/// [`valid_object`] from the member whose name starts at `at` to the object's end.
fn valid_members(
    b: &[u8],
    mut at: usize,
    mut value: impl FnMut(&[u8], usize) -> Option<usize>,
) -> Option<usize> {
    loop {
        if b.get(at) != Some(&b'"') {
            return None;
        }
        let name_end = valid_string(b, at)?;
        let name = &b[at + 1..name_end - 1];
        at = skip_spaces(b, name_end);
        if b.get(at) != Some(&b':') {
            return None;
        }
        at = skip_spaces(b, value(name, skip_spaces(b, at + 1))?);
        match b.get(at)? {
            b',' => at = skip_spaces(b, at + 1),
            b'}' => return Some(at + 1),
            _ => return None,
        }
    }
}

/// [`valid_object`] from just past a member's value (at `end`) to the object's end: the
/// members after it, each checked by `value` as there.
fn rest_of_object(
    b: &[u8],
    end: usize,
    value: impl FnMut(&[u8], usize) -> Option<usize>,
) -> Option<usize> {
    let at = skip_spaces(b, end);
    match b.get(at)? {
        b',' => valid_members(b, skip_spaces(b, at + 1), value),
        b'}' => Some(at + 1),
        _ => None,
    }
}

fn literal(b: &[u8], at: usize, word: &[u8]) -> Option<usize> {
    (b.get(at..at + word.len())? == word).then_some(at + word.len())
}

/// The index just past the number at `at`: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn valid_number(b: &[u8], mut at: usize) -> Option<usize> {
    let digits = |b: &[u8], at: usize| {
        let n = b.get(at..).map_or(0, |rest| {
            rest.iter().take_while(|c| c.is_ascii_digit()).count()
        });
        (n > 0).then_some(at + n)
    };
    if b.get(at) == Some(&b'-') {
        at += 1;
    }
    at = match b.get(at)? {
        b'0' => at + 1,
        b'1'..=b'9' => digits(b, at)?,
        _ => return None,
    };
    if b.get(at) == Some(&b'.') {
        at = digits(b, at + 1)?;
    }
    if matches!(b.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(b.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        at = digits(b, at)?;
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_member_walked_in_place_resumes_after_its_brace() {
        let text = r#"{"a": {"x": "}\"", "y": {}} , "b": [1, {"z": 2}], "c": {}}"#;
        let mut members = members(text).unwrap();
        let (name, start) = members.next_name().unwrap();
        assert_eq!(name, "a");
        let mut inner = members.object_at(start).unwrap();
        // Not read to the end yet: no resuming.
        assert_eq!(inner.next(), Some(("x", r#""}\"""#)));
        assert!(members.resume_after(&inner).is_none());
        assert_eq!(inner.next(), Some(("y", "{}")));
        assert_eq!(inner.next(), None);
        members.resume_after(&inner).unwrap();
        let (name, start) = members.next_name().unwrap();
        assert_eq!(name, "b");
        assert!(members.object_at(start).is_none(), "an array is not walked");
        assert_eq!(members.value_at(start), Some(r#"[1, {"z": 2}]"#));
        let (name, start) = members.next_name().unwrap();
        assert_eq!(name, "c");
        let mut empty = members.object_at(start).unwrap();
        assert_eq!(empty.next(), None);
        members.resume_after(&empty).unwrap();
        assert_eq!(members.next_name(), None);
    }

    #[test]
    fn members_are_read_in_order_with_their_values_text() {
        let text = r#" { "a" : 1 , "b\"c":"x\\y\"z", "d":{"e":[1,{"f":"}"}]},"g":null,"h":[] } "#;
        let got: Vec<_> = members(text).unwrap().collect();
        assert_eq!(
            got,
            vec![
                ("a", "1"),
                (r#"b\"c"#, r#""x\\y\"z""#),
                ("d", r#"{"e":[1,{"f":"}"}]}"#),
                ("g", "null"),
                ("h", "[]"),
            ]
        );
        assert_eq!(members("{}").unwrap().count(), 0);
        assert!(members("[1]").is_none());
        assert!(members("\"{\"").is_none());
    }

    /// What [`string_stop`] must find, one byte at a time.
    fn first_stop(b: &[u8], from: usize) -> Option<usize> {
        (from..b.len()).find(|&i| b[i] == b'"' || b[i] == b'\\' || b[i] < 0x20)
    }

    /// Bytes next to the thresholds the word scan tests, and the ones it looks for.
    const EDGE_BYTES: [u8; 16] = [
        0x00, 0x01, 0x0a, 0x1f, 0x20, 0x21, b'"', 0x23, b'[', b'\\', b']', 0x7f, 0x80, 0x81, 0xa2,
        0xff,
    ];

    /// Calls `check(offset, len, at, edge)` for every offset in a word (0..8), every run
    /// length 0..40, every position in the run (`at == len`: none) and every edge byte.
    fn each_edge_position(mut check: impl FnMut(usize, usize, usize, u8)) {
        for offset in 0..8 {
            for len in 0..40 {
                for at in 0..=len {
                    for &edge in &EDGE_BYTES {
                        check(offset, len, at, edge);
                    }
                }
            }
        }
    }

    #[test]
    fn the_word_scan_stops_where_a_byte_scan_does_at_every_position() {
        // An edge byte at each position (or none), before plain filler or before a
        // second edge byte.
        each_edge_position(|offset, len, at, edge| {
            for &after in &[b'x', 0x00, b'"', 0xc3] {
                let mut b = vec![b'x'; offset + len];
                if at < len {
                    b[offset + at] = edge;
                    if at + 1 < len {
                        b[offset + at + 1] = after;
                    }
                }
                assert_eq!(
                    string_stop(&b, offset),
                    first_stop(&b, offset),
                    "{b:?} from {offset}"
                );
            }
        });
        assert_eq!(string_stop(b"ab", 3), None, "past the end");
    }

    #[test]
    fn a_short_string_is_read_as_the_long_strings_loop_reads_it() {
        // An edge byte at each position of the string (or none), closed or not, before
        // the line's end or more text.
        each_edge_position(|offset, len, at, edge| {
            for tail in [&b""[..], b"\"", b"\"}", b"\",\"abcdefghijklmnop\"}"] {
                let mut b = vec![b' '; offset];
                b.push(b'"');
                b.extend(std::iter::repeat_n(b'x', len));
                if at < len {
                    b[offset + 1 + at] = edge;
                }
                b.extend_from_slice(tail);
                assert_eq!(
                    valid_string(&b, offset),
                    valid_long_string(&b, offset + 1),
                    "{b:?} from {offset}"
                );
            }
        });
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// On any bytes, mostly the ones the scan looks for and their neighbours.
        #[test]
        fn the_word_scan_is_a_byte_scan(
            b in proptest::collection::vec(
                proptest::prop_oneof![
                    6 => proptest::sample::select(vec![b'x', b'a', 0xc3, 0xa9]),
                    1 => proptest::sample::select(EDGE_BYTES.to_vec()),
                    1 => proptest::prelude::any::<u8>(),
                ],
                0..64,
            ),
            from in 0usize..66,
        ) {
            proptest::prop_assert_eq!(string_stop(&b, from), first_stop(&b, from));
        }
    }

    /// `{"jsonrpc":"2.0","method":"m","params":{"sessionId":"<string>"}}`, the string
    /// starting `offset` bytes later than in the shortest such line.
    fn line_with_string(offset: usize, string: &[u8]) -> Vec<u8> {
        let mut line = br#"{"jsonrpc":"2.0","method":"m","#.to_vec();
        line.extend(std::iter::repeat_n(b' ', offset));
        line.extend_from_slice(br#""params":{"sessionId":""#);
        line.extend_from_slice(string);
        line.extend_from_slice(br#""}}"#);
        line
    }

    #[test]
    fn a_string_with_any_byte_at_any_position_is_read_as_serde_reads_it() {
        #[derive(serde::Deserialize)]
        struct Params<'a> {
            #[serde(borrow, rename = "sessionId")]
            session_id: &'a serde_json::value::RawValue,
        }
        #[derive(serde::Deserialize)]
        struct Message<'a> {
            #[serde(borrow)]
            params: Params<'a>,
        }
        // Each byte, and the escapes, at each position of strings of every length up to
        // 40, at each offset from a word's start. Non-ASCII goes in as a two-byte `é` or
        // a lone byte of it (invalid UTF-8).
        let mut inserts: Vec<&[u8]> = vec![b"\\\"", b"\\\\", b"\\n", b"\\u00e9", b"\\x", b"\\"];
        inserts.extend([
            "\u{e9}".as_bytes(),
            "\u{1F600}".as_bytes(),
            &[0xc3],
            &[0xa9],
        ]);
        let singles: Vec<[u8; 1]> = (0..=0x7fu8).chain([0x80, 0xff]).map(|c| [c]).collect();
        inserts.extend(singles.iter().map(|c| &c[..]));
        let (mut scanned, mut total) = (0, 0);
        for offset in 0..8 {
            for len in 0..40 {
                for at in 0..=len {
                    for insert in &inserts {
                        let mut string = vec![b'x'; len];
                        string.splice(at..at, insert.iter().copied());
                        let line = line_with_string(offset, &string);
                        let serde = serde_json::from_slice::<Message<'_>>(&line)
                            .map(|m| m.params.session_id.get().to_owned());
                        let scan = envelope(&line).map(|e| {
                            let params = e.params.expect("params");
                            let spans = e.update_spans.expect("noted");
                            spans
                                .text(params, UpdateSpans::SESSION_ID)
                                .unwrap()
                                .unwrap()
                        });
                        total += 1;
                        match (scan, &serde) {
                            (Some(scan), Ok(serde)) => {
                                scanned += 1;
                                assert_eq!(scan, serde, "{line:?}");
                            }
                            (Some(_), Err(_)) => panic!("accepted what serde refuses: {line:?}"),
                            // No surrogate escapes here: every string serde accepts is
                            // one the scan answers for.
                            (None, Ok(_)) => panic!("left a plain string to serde: {line:?}"),
                            (None, Err(_)) => {}
                        }
                    }
                }
            }
        }
        assert!(scanned * 4 > total, "{scanned} of {total} scanned");
    }

    #[test]
    fn plain_values_are_told_from_the_rest() {
        assert_eq!(plain("null"), Some(Plain::Null));
        assert_eq!(plain(r#""abc""#), Some(Plain::Str("abc")));
        assert_eq!(plain(r#""""#), Some(Plain::Str("")));
        assert_eq!(plain(r#"{"a":1}"#), Some(Plain::Object(r#"{"a":1}"#)));
        assert_eq!(plain(r#""a\nb""#), None);
        assert_eq!(plain("1"), None);
        assert_eq!(plain("true"), None);
        assert_eq!(plain("[]"), None);
    }
}
