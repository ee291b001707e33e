//! Text real agents write, for the strings the simulated agents send (issue 29, class 5).
//!
//! Real agents put whatever their model or their tools produced into every string of the
//! wire: escaped quotes, backslash runs (a string may end in one: `"C:\\Users\\"`), `\u`
//! escapes, non-ASCII and astral characters (a surrogate pair when escaped), Windows
//! paths, code blocks full of quotes and braces, JSON inside strings, and large nested
//! JSON objects as a tool call's `rawInput`. A reader of the wire that mis-reads any of
//! it (a string scanner that takes the `\"` of `\\"` for an escaped quote, one that stops
//! at the first `"` of a nested value) passes every seed whose agents write only ASCII
//! letters; this module draws the rest.
//!
//! Everything is drawn from a [`TextRng`] of its own, so drawing text never changes the
//! draws of an agent's behaviour: the same seed makes the same choices as before, with
//! other bytes in its strings. [`escape_into`] writes a string as JSON, in either of the
//! two styles real encoders use (raw UTF-8, as serde and JavaScript write it, or ASCII
//! only with `\u` escapes and surrogate pairs, as Python's `json.dumps` does).

use serde_json::{Map, Value};

/// What a drawn text is made of. Each class holds at least what its name says (a unit
/// test checks every one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TextClass {
    /// Quotes, escaped quotes' text, tabs, newlines and control characters.
    Escapes,
    /// Non-ASCII of the basic plane: accents, CJK, RTL, combining marks.
    Unicode,
    /// Astral characters (above U+FFFF: a surrogate pair when `\u`-escaped).
    Astral,
    /// A run of backslashes inside the text.
    BackslashRun,
    /// Text that ends in a backslash (`\\"` on the wire).
    TrailingBackslash,
    /// A Windows path (`C:\Users\...`), some ending in a backslash.
    WindowsPath,
    /// A fenced code block with quotes, braces, backslashes and a regex.
    CodeBlock,
    /// JSON text inside the string (escaped quotes, braces, an escaped backslash).
    JsonText,
}

impl TextClass {
    /// Every class, in a fixed order.
    pub const ALL: [TextClass; 8] = [
        TextClass::Escapes,
        TextClass::Unicode,
        TextClass::Astral,
        TextClass::BackslashRun,
        TextClass::TrailingBackslash,
        TextClass::WindowsPath,
        TextClass::CodeBlock,
        TextClass::JsonText,
    ];
}

/// A small, stable stream (splitmix64) of its own: text draws never move an agent's
/// behaviour draws.
#[derive(Debug, Clone)]
pub struct TextRng(u64);

impl TextRng {
    /// A stream from `seed`.
    #[must_use]
    pub fn new(seed: u64) -> TextRng {
        TextRng(seed ^ 0x7E47_C0DE_5EED_0029)
    }

    /// The next draw.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A draw in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    /// True `per_mille` times in a thousand.
    pub fn chance(&mut self, per_mille: u16) -> bool {
        self.next_u64() % 1000 < u64::from(per_mille)
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

const WORDS: &[&str] = &[
    "build", "src", "main", "fix", "the", "test", "path", "value",
];
const UNICODE: &[&str] = &[
    "café",
    "naïve",
    "Größe",
    "日本語のテキスト",
    "中文",
    "한국어",
    "עברית",
    "العربية",
    "e\u{301}",
    "ß→∑≠√",
    "\u{a0}nbsp",
    "Ω≈ç",
    "\u{2028}sep",
];
const ASTRAL: &[&str] = &[
    "😀",
    "🚀 done",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "👩‍💻",
    "🇫🇷",
    "𐍈",
    "🎉🎉",
    "\u{1F600}\u{FE0F}",
];
const USERS: &[&str] = &["alice", "Bob Smith", "dev", "José", "用户"];
const CODE: &[&str] = &[
    "```rust\nfn main() {\n    println!(\"{}\", \"a\\\\b\");\n}\n```",
    "```python\nprint(\"C:\\\\temp\\\\\")\nre.compile(r'\\d+\"')\n```",
    "```js\nconst s = '\"}';\nconsole.log(`${s}\\\\`);\n```",
    "```\n{\"key\": \"va\\\"lue\"}\n```",
    "```sh\necho \"\\$HOME\" | sed 's/\\\\/\\//g'\n```",
];
const JSON_TEXT: &[&str] = &[
    "{\"path\":\"C:\\\\Users\\\\\",\"n\":1}",
    "[\"a\\\"b\", {\"k\": \"}\"}]",
    "{\"text\":\"\\\\\"}",
    "{\"nested\":{\"deep\":[1,2,{\"q\":\"\\\"\"}]}}",
];

/// Draws a text of `class`.
#[must_use]
pub fn draw(rng: &mut TextRng, class: TextClass) -> String {
    let mut s = String::new();
    match class {
        TextClass::Escapes => {
            s.push_str(rng.pick(&[
                "say \"hi\"",
                "tab\there",
                "line\nbreak",
                "cr\r\nlf",
                "bell\u{7}nul\u{1}",
                "\"quoted\" and 'single'",
                "slash / and \u{1f}",
            ]));
            if rng.chance(500) {
                s.push('"');
            }
        }
        TextClass::Unicode => {
            s.push_str(rng.pick(UNICODE));
            s.push(' ');
            s.push_str(rng.pick(UNICODE));
        }
        TextClass::Astral => {
            s.push_str(rng.pick(ASTRAL));
            s.push(' ');
            s.push_str(rng.pick(ASTRAL));
        }
        TextClass::BackslashRun => {
            s.push_str(rng.pick(WORDS));
            for _ in 0..=rng.below(5) {
                s.push('\\');
            }
            s.push_str(rng.pick(&["\"", "n", "u0041", " ", "x"]));
            s.push_str(rng.pick(WORDS));
        }
        TextClass::TrailingBackslash => {
            s.push_str(rng.pick(WORDS));
            for _ in 0..=rng.below(3) {
                s.push('\\');
            }
        }
        TextClass::WindowsPath => {
            s.push_str(rng.pick(&["C:", "D:", "\\\\server\\share"]));
            s.push_str("\\Users\\");
            s.push_str(rng.pick(USERS));
            for _ in 0..rng.below(3) {
                s.push('\\');
                s.push_str(rng.pick(WORDS));
            }
            s.push('\\');
            if rng.chance(500) {
                s.push_str(rng.pick(&["file.rs", "Program Files (x86)", "a\"b.txt"]));
            }
        }
        TextClass::CodeBlock => s.push_str(rng.pick(CODE)),
        TextClass::JsonText => s.push_str(rng.pick(JSON_TEXT)),
    }
    s
}

/// A text of a class drawn at random.
#[must_use]
pub fn draw_any(rng: &mut TextRng) -> (TextClass, String) {
    let class = TextClass::ALL[rng.below(TextClass::ALL.len())];
    (class, draw(rng, class))
}

/// A nested JSON object as an agent's tool call takes it (`rawInput`): paths, commands,
/// edits with code, arrays, numbers, booleans, `null`, several levels deep, every string
/// drawn by [`draw_any`]. No member is named `text` or `toolCallId` (the checkers look for
/// those keys in an update), and no number is a float (its text must read back exactly).
#[must_use]
pub fn nested_json(rng: &mut TextRng, depth: u32) -> Value {
    const KEYS: &[&str] = &[
        "path",
        "command",
        "old_string",
        "new_string",
        "args",
        "env",
        "pattern",
        "cwd",
        "description",
        "édition",
        "🔑",
    ];
    let mut object = Map::new();
    let members = 2 + rng.below(4);
    for i in 0..members {
        let key = format!("{}{i}", rng.pick(KEYS));
        let value = match rng.below(if depth == 0 { 4 } else { 6 }) {
            0 | 1 => Value::String(draw_any(rng).1),
            2 => Value::from(rng.next_u64() as i64 >> rng.below(60)),
            3 => [Value::Bool(true), Value::Bool(false), Value::Null][rng.below(3)].clone(),
            4 => Value::Array(
                (0..1 + rng.below(3))
                    .map(|_| match rng.below(2) {
                        0 => Value::String(draw_any(rng).1),
                        _ => nested_json(rng, depth - 1),
                    })
                    .collect(),
            ),
            _ => nested_json(rng, depth - 1),
        };
        object.insert(key, value);
    }
    Value::Object(object)
}

/// Appends `text` as a JSON string (quotes included) to `out`. With `ascii`, every
/// non-ASCII character is a `\u` escape (a surrogate pair above U+FFFF), as Python's
/// `json.dumps` writes; without, it is written as UTF-8, as serde and JavaScript do.
/// Either way the string reads back as `text`.
pub fn escape_into(out: &mut String, text: &str, ascii: bool) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || (ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    out.push_str("\\u");
                    for shift in [12, 8, 4, 0] {
                        out.push(char::from(HEX[usize::from((*unit >> shift) & 0xf)]));
                    }
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Texts and nested JSON drawn once per process (from a fixed seed), each text with its
/// JSON spellings in both styles: a stream event picks from them, so the agents' hottest
/// path copies drawn text instead of drawing, escaping and serializing it each time.
#[derive(Debug)]
pub struct Pool {
    /// `(class, text, [written as UTF-8, written ASCII-only])`, the spellings without
    /// their quotes (they go inside a string).
    pub texts: Vec<(TextClass, String, [String; 2])>,
    /// Nested JSON objects ([`nested_json`]) written compactly, some deep.
    pub args: Vec<String>,
    /// The shortest of `texts` that ends in a backslash (`\\"` on the wire): what a line
    /// sized too tight for the others still carries.
    pub small: u16,
}

/// Texts in the [`Pool`]: every class many times over.
pub const POOL_TEXTS: usize = 512;
/// Nested JSON objects in the [`Pool`].
pub const POOL_ARGS: usize = 128;

/// The pool, drawn on first use.
pub fn pool() -> &'static Pool {
    static POOL: std::sync::OnceLock<Pool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let mut rng = TextRng::new(29);
        let texts: Vec<(TextClass, String, [String; 2])> = (0..POOL_TEXTS)
            .map(|i| {
                let class = TextClass::ALL[i % TextClass::ALL.len()];
                let text = draw(&mut rng, class);
                let spell = |ascii| {
                    let mut out = String::new();
                    escape_into(&mut out, &text, ascii);
                    out[1..out.len() - 1].to_owned()
                };
                let spellings = [spell(false), spell(true)];
                (class, text, spellings)
            })
            .collect();
        let args = (0..POOL_ARGS)
            .map(|i| nested_json(&mut rng, if i % 16 == 0 { 4 } else { 2 }).to_string())
            .collect();
        let small = (0..texts.len())
            .filter(|&i| texts[i].1.ends_with('\\'))
            .min_by_key(|&i| texts[i].2[0].len())
            .expect("the pool ends texts in a backslash") as u16;
        Pool { texts, args, small }
    })
}

/// A text of the [`pool`]: of `class`, or of any class.
pub fn pick(rng: &mut TextRng, class: Option<TextClass>) -> &'static str {
    let pool = pool();
    let n = TextClass::ALL.len();
    let i = match class {
        Some(class) => {
            let at = TextClass::ALL.iter().position(|c| *c == class).unwrap_or(0);
            rng.below(pool.texts.len() / n) * n + at
        }
        None => rng.below(pool.texts.len()),
    };
    &pool.texts[i].1
}

/// The CRC-32 of an update's JSON text ([`crate::agent_model::StreamedEvent::raw_crc`]).
#[must_use]
pub fn raw_crc(text: &str) -> u32 {
    crc32fast::hash(text.as_bytes())
}

/// A 64-bit digest of bytes fed in pieces, the same however they are cut: eight bytes
/// at a time (a multiply and a rotate per word), so a checker can digest every update a
/// client gets at a small fraction of reading it. Stable across runs and platforms.
#[derive(Debug, Clone)]
pub struct Digest {
    hash: u64,
    buf: [u8; 8],
    len: usize,
    total: u64,
}

impl Default for Digest {
    fn default() -> Self {
        Digest {
            hash: 0xcbf2_9ce4_8422_2325,
            buf: [0; 8],
            len: 0,
            total: 0,
        }
    }
}

impl Digest {
    fn word(&mut self, word: u64) {
        self.hash = (self.hash ^ word)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }

    /// Feeds `bytes`.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.len > 0 {
            let take = (8 - self.len).min(bytes.len());
            self.buf[self.len..self.len + take].copy_from_slice(&bytes[..take]);
            self.len += take;
            bytes = &bytes[take..];
            if self.len < 8 {
                return;
            }
            self.word(u64::from_le_bytes(self.buf));
            self.len = 0;
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.word(u64::from_le_bytes(w.try_into().expect("eight bytes")));
        }
        let rest = words.remainder();
        self.buf[..rest.len()].copy_from_slice(rest);
        self.len = rest.len();
    }

    /// The digest of everything fed.
    #[must_use]
    pub fn finish(mut self) -> u64 {
        let mut last = [0u8; 8];
        last[..self.len].copy_from_slice(&self.buf[..self.len]);
        self.word(u64::from_le_bytes(last));
        self.word(self.total);
        let mut z = self.hash;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The [`Digest`] of `bytes`.
#[must_use]
pub fn digest(bytes: &[u8]) -> u64 {
    let mut d = Digest::default();
    d.feed(bytes);
    d.finish()
}

/// The digest of an event's content as the agent meant it, given in pieces: its text
/// (`text`, the pieces joined), and a tool call's `rawInput.args` written compactly.
#[must_use]
pub fn content_digest_of(text: &[&str], args: Option<&str>) -> u64 {
    let mut d = Digest::default();
    for piece in text {
        d.feed(piece.as_bytes());
    }
    match args {
        Some(args) => {
            // Text never holds 0xff (it is UTF-8): the two parts cannot run together.
            d.feed(&[0xff]);
            d.feed(args.as_bytes());
        }
        None => d.feed(&[0xfe]),
    }
    d.finish()
}

/// [`content_digest_of`] a text in one piece.
#[must_use]
pub fn content_digest(text: &str, args: Option<&str>) -> u64 {
    content_digest_of(&[text], args)
}

/// The digest ([`content_digest`]) of an update as a reader decoded it: the text of a
/// chunk (`content.text`), of a resource (`content.resource.text`) or of a tool call
/// (`rawInput.text`, with `rawInput.args` written compactly). `None` for an update without
/// such a text.
#[must_use]
pub fn update_digest(update: &Value) -> Option<u64> {
    if update["sessionUpdate"] == "tool_call" {
        let input = &update["rawInput"];
        let text = input["text"].as_str()?;
        let args = input.get("args").map(Value::to_string);
        return Some(content_digest(text, args.as_deref()));
    }
    let content = &update["content"];
    let text = content["text"]
        .as_str()
        .or_else(|| content["resource"]["text"].as_str())?;
    Some(content_digest(text, None))
}

/// [`update_digest`] of an update's raw JSON text, read without building a tree of the
/// text (only a tool call's `rawInput.args` is built, to write it compactly): what a
/// checker runs on every update a client gets. `None` when the text is not JSON or the
/// update has no such text.
#[must_use]
pub fn update_digest_raw(update: &str) -> Option<u64> {
    use std::borrow::Cow;

    use serde_json::value::RawValue;

    #[derive(serde::Deserialize)]
    struct Update<'a> {
        #[serde(rename = "sessionUpdate", borrow, default)]
        kind: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        content: Option<Content<'a>>,
        #[serde(rename = "rawInput", borrow, default)]
        raw_input: Option<Input<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Content<'a> {
        #[serde(borrow, default)]
        text: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        resource: Option<Resource<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Resource<'a> {
        #[serde(borrow, default)]
        text: Option<Cow<'a, str>>,
    }
    #[derive(serde::Deserialize)]
    struct Input<'a> {
        #[serde(borrow, default)]
        text: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        args: Option<&'a RawValue>,
    }
    let update: Update<'_> = serde_json::from_str(update).ok()?;
    if update.kind.as_deref() == Some("tool_call") {
        let input = update.raw_input?;
        let args = match input.args {
            Some(raw) => Some(serde_json::from_str::<Value>(raw.get()).ok()?.to_string()),
            None => None,
        };
        return Some(content_digest(&input.text?, args.as_deref()));
    }
    let content = update.content?;
    let text = match content.text {
        Some(text) => text,
        None => content.resource?.text?,
    };
    Some(content_digest(&text, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each class must hold, as a predicate on the text.
    fn holds(class: TextClass, s: &str) -> bool {
        match class {
            TextClass::Escapes => s.chars().any(|c| c == '"' || c.is_control()),
            TextClass::Unicode => !s.is_ascii(),
            TextClass::Astral => s.chars().any(|c| c as u32 > 0xFFFF),
            TextClass::BackslashRun => s.contains('\\'),
            TextClass::TrailingBackslash => s.ends_with('\\'),
            TextClass::WindowsPath => s.contains(":\\Users\\") || s.starts_with("\\\\server"),
            TextClass::CodeBlock => s.starts_with("```") && s.contains('"') && s.contains('\\'),
            TextClass::JsonText => {
                serde_json::from_str::<Value>(s).is_ok() && s.contains('"') && s.contains('\\')
            }
        }
    }

    /// Every class really produces what it names, on every draw, and every text reads back
    /// from its JSON in both styles; together the draws hold a backslash run ending a
    /// string, an escaped quote after an escaped backslash (`\\\"`), `\u` escapes with a
    /// surrogate pair, and a Windows path ending in a backslash.
    #[test]
    fn every_class_is_drawn_as_named_and_reads_back() {
        let mut rng = TextRng::new(7);
        let mut wire = String::new();
        for class in TextClass::ALL {
            for _ in 0..200 {
                let text = draw(&mut rng, class);
                assert!(holds(class, &text), "{class:?}: {text:?}");
                for ascii in [false, true] {
                    let mut json = String::new();
                    escape_into(&mut json, &text, ascii);
                    assert_eq!(serde_json::from_str::<String>(&json).unwrap(), text);
                    assert!(!ascii || json.is_ascii(), "{json}");
                    wire.push_str(&json);
                }
            }
        }
        for needle in [
            r#"\\""#,
            r#"\\\""#,
            r"\ud83d\ude00",
            r#":\\Users\\"#,
            r#"\\\\\\"#,
        ] {
            assert!(wire.contains(needle), "no {needle} drawn");
        }
        let mut rng = TextRng::new(1);
        assert!((0..50).any(|_| draw(&mut rng, TextClass::WindowsPath).ends_with('\\')));
    }

    /// A digest is the same however its bytes are cut into pieces, and differs for a
    /// byte changed anywhere.
    #[test]
    fn a_digest_is_the_same_however_it_is_fed() {
        let text: Vec<u8> = (0..100u8).collect();
        let whole = digest(&text);
        for cut in 0..text.len() {
            for cut2 in cut..text.len() {
                let mut d = Digest::default();
                d.feed(&text[..cut]);
                d.feed(&text[cut..cut2]);
                d.feed(&text[cut2..]);
                assert_eq!(d.finish(), whole);
            }
            let mut changed = text.clone();
            changed[cut] ^= 1;
            assert_ne!(digest(&changed), whole);
        }
        assert_ne!(digest(b""), digest(b"\0"));
        assert_eq!(
            content_digest_of(&["m#1 ", "xx", "C:\\"], None),
            content_digest("m#1 xxC:\\", None)
        );
    }

    /// The pool holds every class, its spellings read back as its texts, and deep JSON.
    #[test]
    fn the_pool_holds_every_class_spelled_both_ways() {
        let pool = pool();
        for class in TextClass::ALL {
            assert!(pool.texts.iter().any(|(c, _, _)| *c == class));
        }
        for (class, text, [utf8, ascii]) in &pool.texts {
            assert!(holds(*class, text), "{class:?}: {text:?}");
            for spelling in [utf8, ascii] {
                let back: String = serde_json::from_str(&format!("\"{spelling}\"")).unwrap();
                assert_eq!(&back, text);
            }
            assert!(ascii.is_ascii());
        }
        assert!(
            pool.args.iter().any(|a| a.len() > 300),
            "no large nested JSON"
        );
        let small = &pool.texts[usize::from(pool.small)];
        assert!(
            small.1.ends_with('\\') && small.2[1].len() <= 8,
            "{small:?}"
        );
    }

    /// Nested JSON is deep, carries drawn strings, and reads back equal; its digest is the
    /// same read back from the wire in both styles.
    #[test]
    fn nested_json_is_deep_and_reads_back() {
        fn depth(v: &Value) -> usize {
            match v {
                Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
                Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
                _ => 0,
            }
        }
        let mut rng = TextRng::new(3);
        let mut deepest = 0;
        for _ in 0..100 {
            let v = nested_json(&mut rng, 3);
            deepest = deepest.max(depth(&v));
            let text = v.to_string();
            assert!(!text.contains("\"text\":") && !text.contains("\"toolCallId\":"));
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);
            let update = serde_json::json!({
                "sessionUpdate": "tool_call",
                "rawInput": {"text": "m#1 C:\\", "args": v},
            });
            let back: Value = serde_json::from_str(&update.to_string()).unwrap();
            assert_eq!(
                update_digest(&back),
                Some(content_digest("m#1 C:\\", Some(&text)))
            );
            assert_eq!(update_digest_raw(&update.to_string()), update_digest(&back));
        }
        assert!(deepest >= 4, "{deepest}");
    }
}
