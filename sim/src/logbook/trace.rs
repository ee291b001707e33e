//! The JSONL trace of a seed and its rolling hash. Lines hold simulated time, actor,
//! input / verdict / effect — never wall time or madsim task IDs — so the same seed gives
//! the same trace on any thread count.
//!
//! The hash is taken over the structured events (their derived `Hash`), not over the JSON
//! text, so a passing seed never formats a line: lines are built only when `capture` is on
//! (failing seeds are re-run with it; `run`, `replay` and determinism checks turn it on).

use std::hash::{Hash, Hasher};
use std::io::Write as _;

use palisade_core::{Effect, Input, Verdict};

/// The rolling hash's start value.
const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// A fast, fixed (unseeded) mixing hasher: the same events give the same hash in every
/// process and on every thread.
struct Mix(u64);

impl Hasher for Mix {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Eight bytes at a time, the last chunk zero-padded (little-endian). The tail is
        // gathered byte by byte: a variable-length copy into a padded buffer was a
        // `memcpy` call for every string hashed (every trace event hashes a few).
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.write_u64(u64::from_le_bytes(
                chunk.try_into().expect("chunks_exact gives 8 bytes"),
            ));
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            let word = tail
                .iter()
                .rev()
                .fold(0u64, |word, &b| (word << 8) | u64::from(b));
            self.write_u64(word);
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_isize(&mut self, n: isize) {
        self.write_u64(n as u64);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(23) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Bits of the edge-coverage map (a power of two): edges are pairs of consecutive event
/// kinds, hashed into this many buckets. A seed of the swarm has a few hundred distinct
/// edges, so collisions are rare and the map stays a few hundred bytes.
pub const EDGE_BITS: usize = 4_096;
const EDGE_WORDS: usize = EDGE_BITS / 64;
const _: () = assert!(EDGE_BITS.is_power_of_two() && EDGE_BITS.is_multiple_of(64));

/// The hash of an event kind, for the edge map.
fn kind_key(parts: impl Hash) -> u64 {
    let mut h = Mix(HASH_SEED);
    parts.hash(&mut h);
    h.finish()
}

/// The `tracing` target trace lines are emitted under, at debug level, when a subscriber
/// wants them (`RUST_LOG=palisade_sim::trace=debug`). Never part of the hash.
pub const TRACE_TARGET: &str = "palisade_sim::trace";

/// Trace lines (when captured) and the rolling hash of every event.
#[derive(Debug)]
pub(crate) struct Tracer {
    pub(crate) lines: Vec<String>,
    pub(crate) hash: u64,
    capture: bool,
    /// Every line is also a `tracing` event ([`TRACE_TARGET`]).
    emit: bool,
    count: u64,
    buf: Vec<u8>,
    /// Edge coverage: which (previous kind, kind) pairs of consecutive events occurred.
    /// Search guidance only (`crate::search`): never hashed, never checked.
    edges: [u64; EDGE_WORDS],
    prev_kind: u64,
}

impl Default for Tracer {
    fn default() -> Self {
        Tracer::new(false)
    }
}

fn input_name(input: &Input) -> &'static str {
    match input {
        Input::Resume { .. } => "resume",
        Input::Prompt { .. } => "prompt",
        Input::Cancel { .. } => "cancel",
        Input::Bound { .. } => "bound",
        Input::Callback(cb) => cb.event.name(),
        Input::Perform { .. } => "perform",
        Input::Stopped { .. } => "stopped",
        Input::DismissFailure { .. } => "dismiss_failure",
    }
}

fn effect_to(effect: &Effect) -> &'static str {
    match effect {
        Effect::TurnEnded { .. }
        | Effect::Deliver { .. }
        | Effect::AttemptSettled { .. }
        | Effect::JoinTimedOut { .. }
        | Effect::RecoveryStarted { .. }
        | Effect::RecoveryExhausted { .. }
        | Effect::FailureReported { .. }
        | Effect::TurnSilent { .. } => "client",
        _ => "provider",
    }
}

impl Tracer {
    pub(crate) fn new(capture: bool) -> Self {
        // Emitting needs the lines formatted, so it captures them too; the hash is the same.
        let emit = tracing::enabled!(target: TRACE_TARGET, tracing::Level::DEBUG);
        Tracer {
            lines: Vec::new(),
            hash: HASH_SEED,
            capture: capture || emit,
            emit,
            count: 0,
            buf: Vec::new(),
            edges: [0; EDGE_WORDS],
            prev_kind: 0,
        }
    }

    /// Records the edge from the previous event's kind to `kind`.
    fn edge(&mut self, kind: u64) {
        let bucket = (self.prev_kind.rotate_left(17) ^ kind) as usize & (EDGE_BITS - 1);
        self.edges[bucket / 64] |= 1 << (bucket % 64);
        self.prev_kind = kind;
    }

    /// The edge buckets hit, ascending.
    pub(crate) fn edge_buckets(&self) -> Vec<u16> {
        let mut out = Vec::new();
        for (w, word) in self.edges.iter().enumerate() {
            let mut bits = *word;
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                out.push((w * 64 + b) as u16);
                bits &= bits - 1;
            }
        }
        out
    }

    pub(crate) fn len(&self) -> usize {
        self.count as usize
    }

    fn event(&mut self, hash_it: impl FnOnce(&mut Mix)) -> u64 {
        let mut h = Mix(self.hash);
        hash_it(&mut h);
        self.hash = h.finish();
        self.count += 1;
        self.count - 1
    }

    fn keep(&mut self) {
        let line = String::from_utf8_lossy(&self.buf).into_owned();
        if self.emit {
            tracing::debug!(target: TRACE_TARGET, "{line}");
        }
        self.lines.push(line);
    }

    fn head(&mut self, t: u64, actor: &str, to: Option<&str>, kind: &str) {
        self.buf.clear();
        let _ = write!(self.buf, "{{\"t\":{t},\"actor\":\"{actor}\"");
        if let Some(to) = to {
            let _ = write!(self.buf, ",\"to\":\"{to}\"");
        }
        let _ = write!(self.buf, ",\"kind\":\"{kind}\"");
    }

    /// A planned fault fires (the world's own line; hashed by value, written as JSON only
    /// when capturing).
    pub(crate) fn fault(&mut self, t: u64, fault: &crate::plan::Fault) -> u64 {
        if self.capture {
            self.head(t, "world", None, "fault");
            self.buf.extend_from_slice(b",\"fault\":");
            let text = serde_json::to_string(fault).unwrap_or_default();
            let _ = serde_json::to_writer(&mut self.buf, &text);
            self.buf.push(b'}');
            self.keep();
        }
        self.edge(kind_key(("fault", std::mem::discriminant(&fault.kind))));
        self.event(|h| (t, "world", "fault", fault).hash(h))
    }

    /// A free-form line: `fields` are (key, string value).
    pub(crate) fn line(&mut self, t: u64, actor: &str, kind: &str, fields: &[(&str, &str)]) -> u64 {
        if self.capture {
            self.head(t, actor, None, kind);
            for (k, v) in fields {
                let _ = write!(self.buf, ",\"{k}\":");
                let _ = serde_json::to_writer(&mut self.buf, v);
            }
            self.buf.push(b'}');
            self.keep();
        }
        self.edge(kind_key((actor, kind)));
        self.event(|h| (t, actor, kind, fields).hash(h))
    }

    /// An input and the core's verdict.
    pub(crate) fn input(&mut self, t: u64, actor: &str, input: &Input, verdict: &Verdict) -> u64 {
        if self.capture {
            self.head(t, actor, Some("core"), input_name(input));
            self.buf.extend_from_slice(b",\"input\":");
            let _ = serde_json::to_writer(&mut self.buf, input);
            self.buf.extend_from_slice(b",\"verdict\":");
            match verdict {
                Verdict::Reject(r) => {
                    let _ = write!(self.buf, "\"reject:{r}\"");
                }
                v => {
                    let _ = serde_json::to_writer(&mut self.buf, v);
                }
            }
            self.buf.push(b'}');
            self.keep();
        }
        let reason = match verdict {
            Verdict::Reject(r) => Some(std::mem::discriminant(r)),
            _ => None,
        };
        self.edge(kind_key((
            input_name(input),
            std::mem::discriminant(verdict),
            reason,
        )));
        self.event(|h| (t, actor, input, verdict).hash(h))
    }

    /// An effect of the core.
    pub(crate) fn effect(&mut self, t: u64, effect: &Effect) -> u64 {
        if self.capture {
            self.head(t, "core", Some(effect_to(effect)), effect.name());
            self.buf.extend_from_slice(b",\"effect\":");
            let _ = serde_json::to_writer(&mut self.buf, effect);
            self.buf.push(b'}');
            self.keep();
        }
        self.edge(kind_key(effect.name()));
        self.event(|h| (t, effect).hash(h))
    }
}

impl Tracer {
    /// An environment event with numeric fields: hashed by value, written as JSON only when
    /// capturing (so a passing seed formats nothing).
    pub(crate) fn note(
        &mut self,
        t: u64,
        actor: &str,
        kind: &str,
        fields: &[(&'static str, u64)],
    ) -> u64 {
        if self.capture {
            self.head(t, actor, None, kind);
            for (k, v) in fields {
                let _ = write!(self.buf, ",\"{k}\":{v}");
            }
            self.buf.push(b'}');
            self.keep();
        }
        self.edge(kind_key((actor, kind)));
        self.event(|h| (t, actor, kind, fields).hash(h))
    }

    /// An event the client received.
    pub(crate) fn client(&mut self, t: u64, event: &palisade_embed::SessionEvent) -> u64 {
        use palisade_embed::SessionEvent as E;
        if self.capture {
            self.head(t, "engine", Some("client"), event.name());
            self.buf.extend_from_slice(b",\"event\":");
            self.buf.extend_from_slice(event.to_json().as_bytes());
            self.buf.push(b'}');
            self.keep();
        }
        // Hashed by what identifies it; the outputs' payloads are hashed by their seqs (the
        // agent's lines, which fix their content, are hashed where they are written).
        let session = event.session().get();
        let key: (u64, u64, u64) = match event {
            E::Output { turn, events, .. } => (
                turn.get(),
                events.first().map_or(0, |e| e.seq),
                events.len() as u64,
            ),
            E::TurnEnded { turn, outcome, .. } => (turn.get(), *outcome as u64, 0),
            E::RecoveryStarted { turn, step, .. } => (turn.get(), u64::from(*step), 0),
            E::RecoveryExhausted { turn, .. } => (turn.get(), 0, 0),
            E::FailureReported { failure, .. } => (failure.attempt.raw(), failure.stamp.get(), 0),
            E::AttemptSettled {
                attempt, outcome, ..
            } => (attempt.raw(), *outcome as u64, 0),
            E::JoinTimedOut { attempt, .. } => (attempt.raw(), 0, 0),
            E::RuntimeStarted {
                execution,
                generation,
                ..
            } => (execution.get(), generation.get(), 0),
            E::ConversationLoading { execution, .. } => (execution.get(), 0, 0),
            E::ConversationReady { execution, .. } => (execution.get(), 0, 0),
            E::RuntimeExited { execution, .. } => (execution.get(), 0, 0),
            E::Update { .. } | E::History { .. } => (0, 0, 0),
            E::ClientRequest { ticket, .. } | E::Forwarded { ticket, .. } => (*ticket, 0, 0),
        };
        self.edge(kind_key(("client", event.name())));
        self.event(|h| (t, "client", event.name(), session, key).hash(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash of bytes as the first `Mix::write` took it: each 8-byte chunk copied into
    /// a zeroed buffer and read little-endian. Trace hashes (and so the corpus and the
    /// regression files) depend on it.
    fn padded_chunks(bytes: &[u8]) -> u64 {
        let mut h = Mix(HASH_SEED);
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            h.write_u64(u64::from_le_bytes(b));
        }
        h.finish()
    }

    #[test]
    fn written_bytes_hash_as_zero_padded_little_endian_chunks() {
        let text: Vec<u8> = (0..=255u8).chain(0..40).collect();
        for len in 0..text.len() {
            let mut h = Mix(HASH_SEED);
            h.write(&text[..len]);
            assert_eq!(h.finish(), padded_chunks(&text[..len]), "{len} bytes");
        }
    }
}
