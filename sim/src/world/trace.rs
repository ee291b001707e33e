//! The JSONL trace of a seed and its rolling hash. Lines hold simulated time, actor,
//! input / verdict / effect — never wall time or madsim task IDs — so the same seed gives
//! the same bytes on any thread count.

use std::fmt::Write as _;

use palisade_core::{Effect, Input, Verdict};

/// FNV-1a offset basis.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a prime.
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// Trace lines and their rolling hash.
#[derive(Debug)]
pub(crate) struct Tracer {
    pub(crate) lines: Vec<String>,
    pub(crate) hash: u64,
}

impl Default for Tracer {
    fn default() -> Self {
        Tracer::new()
    }
}

fn escape(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".into())
}

impl Tracer {
    pub(crate) fn new() -> Self {
        Tracer {
            lines: Vec::with_capacity(1024),
            hash: FNV_OFFSET,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.lines.len()
    }

    fn push(&mut self, line: String) -> u64 {
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            self.hash ^= u64::from(b);
            self.hash = self.hash.wrapping_mul(FNV_PRIME);
        }
        self.lines.push(line);
        self.lines.len() as u64 - 1
    }

    /// A free-form line: `fields` are (key, already-a-string value).
    pub(crate) fn line(&mut self, t: u64, actor: &str, kind: &str, fields: &[(&str, &str)]) -> u64 {
        let mut s = format!("{{\"t\":{t},\"actor\":\"{actor}\",\"kind\":\"{kind}\"");
        for (k, v) in fields {
            let _ = write!(s, ",\"{k}\":{}", escape(v));
        }
        s.push('}');
        self.push(s)
    }

    /// An input and the core's verdict.
    pub(crate) fn input(&mut self, t: u64, actor: &str, input: &Input, verdict: &Verdict) -> u64 {
        let name = match input {
            Input::Resume { .. } => "resume",
            Input::Prompt { .. } => "prompt",
            Input::Cancel { .. } => "cancel",
            Input::Bound { .. } => "bound",
            Input::Callback(cb) => cb.event.name(),
            Input::Perform { .. } => "perform",
            Input::Stopped { .. } => "stopped",
            Input::DismissFailure { .. } => "dismiss_failure",
        };
        let verdict_s = match verdict {
            Verdict::Reject(r) => format!("reject:{r:?}"),
            v => serde_json::to_string(v).unwrap_or_default(),
        };
        let input_json = serde_json::to_string(input).unwrap_or_default();
        let s = format!(
            "{{\"t\":{t},\"actor\":\"{actor}\",\"to\":\"core\",\"kind\":\"{name}\",\"input\":{input_json},\"verdict\":{}}}",
            escape(&verdict_s)
        );
        self.push(s)
    }

    /// An effect of the core.
    pub(crate) fn effect(&mut self, t: u64, effect: &Effect) -> u64 {
        let to = match effect {
            Effect::TurnEnded { .. }
            | Effect::Deliver { .. }
            | Effect::AttemptSettled { .. }
            | Effect::JoinTimedOut { .. }
            | Effect::RecoveryStarted { .. }
            | Effect::RecoveryExhausted { .. }
            | Effect::FailureReported { .. } => "client",
            _ => "provider",
        };
        let json = serde_json::to_string(effect).unwrap_or_default();
        let s = format!(
            "{{\"t\":{t},\"actor\":\"core\",\"to\":\"{to}\",\"kind\":\"{}\",\"effect\":{json}}}",
            effect.name()
        );
        self.push(s)
    }
}
