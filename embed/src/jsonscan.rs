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
pub(crate) fn members(text: &str) -> Option<Members<'_>> {
    let at = skip_ws(text.as_bytes(), 0);
    (text.as_bytes().get(at) == Some(&b'{')).then_some(Members {
        text,
        at: at + 1,
        done: false,
    })
}

/// See [`members`].
#[derive(Debug)]
pub(crate) struct Members<'a> {
    text: &'a str,
    at: usize,
    done: bool,
}

impl<'a> Iterator for Members<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<(&'a str, &'a str)> {
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
            return None;
        }
        let name_end = skip_string(b, at)?;
        let name = self.text.get(at + 1..name_end - 1)?;
        let colon = skip_ws(b, name_end);
        let start = skip_ws(b, colon + 1);
        let end = skip_value(b, start)?;
        self.at = end;
        Some((name, self.text.get(start..end)?))
    }
}

/// What a member's value is, when it is one of the plain kinds a reader takes as is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plain<'a> {
    /// `null`.
    Null,
    /// A string without escapes: its text between the quotes.
    Str(&'a str),
    /// An object: its whole text.
    Object(&'a str),
}

/// `value` (the text of one valid JSON value) as a [`Plain`], or `None` for any other
/// kind (a string with escapes, a number, an array, ...).
pub(crate) fn plain(value: &str) -> Option<Plain<'_>> {
    match value.as_bytes().first()? {
        b'n' => Some(Plain::Null),
        b'{' => Some(Plain::Object(value)),
        b'"' => {
            let inner = value.get(1..value.len() - 1)?;
            (!inner.contains('\\')).then_some(Plain::Str(inner))
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

#[cfg(test)]
mod tests {
    use super::*;

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
