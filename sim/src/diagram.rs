//! A mermaid sequence diagram of a trace: client, core and provider, with rejected
//! callbacks drawn as crossed arrows and the violating events marked.
//!
//! The diagram reads trace lines as JSON objects and uses only the fields it knows (`t`,
//! `actor`, `kind`, `verdict`, and if present `to`, `session`, `attempt`, `execution`,
//! `generation`, `turn`, `reason`); anything else is ignored, and a line that is not a
//! JSON object is skipped, so the trace format can grow without breaking it.

use serde_json::Value;
use std::fmt::Write as _;

/// Events shown when a trace is longer: GitHub renders a mermaid block only up to a size,
/// and the events just before the violation are the ones that explain it.
pub const DEFAULT_WINDOW: usize = 60;

/// The most events `diagram --all` draws: a mermaid diagram of more is neither rendered
/// nor read, and its text would be hundreds of megabytes for the longest traces.
pub const MAX_DIAGRAM_EVENTS: usize = 10_000;

/// The largest file `diagram` reads (a failure file or a JSONL trace): the same bound as
/// a failure file, which holds the longest trace a run may record.
pub const MAX_DIAGRAM_INPUT_BYTES: u64 = crate::failure::MAX_FAILURE_FILE_BYTES;

/// Events shown after the last violating one.
const EVENTS_AFTER_VIOLATION: usize = 3;

/// A label longer than this is cut: a diagram is read, not searched.
const MAX_LABEL_CHARS: usize = 90;

/// The participants always drawn, in this order.
const FIXED_ACTORS: [&str; 3] = ["client", "core", "provider"];

/// Fields copied into an arrow's label when present, in this order.
const LABEL_FIELDS: [&str; 6] = [
    "session",
    "attempt",
    "execution",
    "generation",
    "turn",
    "reason",
];

struct Event {
    index: usize,
    t: Option<String>,
    actor: String,
    to: Option<String>,
    kind: String,
    verdict: Option<String>,
    details: String,
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Whether a line is a JSON object, checked without building it.
fn is_object(line: &str) -> bool {
    line.trim_start().starts_with('{')
        && serde_json::from_str::<serde::de::IgnoredAny>(line).is_ok()
}

/// How many lines of a trace are JSON objects (the events [`mermaid`] can draw).
pub fn count_events<S: AsRef<str>>(lines: &[S]) -> usize {
    lines.iter().filter(|l| is_object(l.as_ref())).count()
}

fn parse(index: usize, line: &str) -> Option<Event> {
    let Value::Object(obj) = serde_json::from_str::<Value>(line).ok()? else {
        return None;
    };
    let text = |key: &str| obj.get(key).map(scalar);
    let details = LABEL_FIELDS
        .iter()
        .filter_map(|k| obj.get(*k).map(|v| format!("{k}={}", scalar(v))))
        .collect::<Vec<_>>()
        .join(" ");
    Some(Event {
        index,
        t: text("t"),
        actor: text("actor").unwrap_or_else(|| "core".into()),
        to: text("to"),
        kind: text("kind").unwrap_or_else(|| "event".into()),
        verdict: obj.get("verdict").filter(|v| !v.is_null()).map(scalar),
        details,
    })
}

/// Whether a verdict is a rejection (`"reject…"`, or an object with a reject key).
fn is_rejection(verdict: &str) -> bool {
    verdict.to_ascii_lowercase().contains("reject")
}

/// A participant id mermaid accepts (keywords such as `end` are avoided by a prefix).
fn participant_id(actor: &str) -> String {
    if FIXED_ACTORS.contains(&actor) {
        return actor.to_string();
    }
    let clean: String = actor
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("a_{clean}")
}

/// Makes text safe inside a mermaid message: `;` ends a statement and `#` starts an
/// entity, `<` `>` would be read as HTML.
fn escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        match c {
            '#' => out.push_str("#35;"),
            ';' => out.push_str("#59;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

fn clip(text: &str) -> String {
    crate::sweep::clip(text, MAX_LABEL_CHARS)
}

/// The mermaid `sequenceDiagram` of `lines` (without the markdown fence). `violation`
/// lists the trace indices of the violating events; `invariant` names the broken rule.
/// With `window`, only that many events up to just after the violation are drawn.
pub fn mermaid<S: AsRef<str>>(
    lines: &[S],
    violation: &[u64],
    invariant: Option<&str>,
    window: Option<usize>,
) -> String {
    // Which lines are events, without building them: only the window's are parsed, so a
    // long trace costs its index, not its events.
    let objects: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| is_object(l.as_ref()))
        .map(|(i, _)| i)
        .collect();
    let skipped = lines.len() - objects.len();
    let last_violation = violation
        .iter()
        .filter_map(|&v| usize::try_from(v).ok())
        .filter(|&v| v < lines.len())
        .max();

    // Which events to draw: a window ending just after the last violating event.
    let total = objects.len();
    let (start, end) = match window {
        Some(w) if total > w => {
            let end = match last_violation {
                Some(v) => objects
                    .iter()
                    .position(|&i| i > v)
                    .map_or(total, |p| (p + EVENTS_AFTER_VIOLATION).min(total)),
                None => total,
            };
            (end.saturating_sub(w), end)
        }
        _ => (0, total),
    };
    let shown: Vec<Event> = objects[start..end]
        .iter()
        .filter_map(|&i| parse(i, lines[i].as_ref()))
        .collect();
    let shown = &shown[..];

    let mut actors: Vec<String> = FIXED_ACTORS.iter().map(|a| a.to_string()).collect();
    for e in shown {
        for a in std::iter::once(&e.actor).chain(e.to.iter()) {
            if !actors.contains(a) {
                actors.push(a.clone());
            }
        }
    }

    let mut out = String::from("sequenceDiagram\n");
    for a in &actors {
        let _ = writeln!(
            out,
            "    participant {} as {}",
            participant_id(a),
            escape(a)
        );
    }
    let span = format!(
        "{},{}",
        participant_id(&actors[0]),
        participant_id(actors.last().expect("three fixed actors"))
    );
    if start > 0 {
        let _ = writeln!(
            out,
            "    Note over {span}: … {start} earlier events not shown"
        );
    }
    if skipped > 0 {
        let _ = writeln!(
            out,
            "    Note over {span}: {skipped} trace lines were not JSON objects"
        );
    }
    for e in shown {
        let violating = violation.contains(&(e.index as u64));
        let rejected = e.verdict.as_deref().is_some_and(is_rejection);
        let mut label = format!("[{}]", e.index);
        if let Some(t) = &e.t {
            let _ = write!(label, " t={t}");
        }
        let _ = write!(label, " {}", e.kind);
        if !e.details.is_empty() {
            let _ = write!(label, " {}", e.details);
        }
        if let Some(v) = &e.verdict {
            let _ = write!(label, " → {v}");
        }
        let label = escape(&clip(&label));
        let from = participant_id(&e.actor);
        // Inputs go to the core; the core's own events go where they say, else are notes.
        let to = match (&e.to, e.actor.as_str()) {
            (Some(to), _) => Some(participant_id(to)),
            (None, "core") => None,
            (None, _) => Some("core".to_string()),
        };
        if violating {
            let _ = writeln!(out, "    rect rgb(255, 215, 215)");
        }
        match to {
            Some(to) if to != from => {
                let arrow = if rejected { "--x" } else { "->>" };
                let _ = writeln!(out, "    {from}{arrow}{to}: {label}");
            }
            _ => {
                let prefix = if rejected { "✗ " } else { "" };
                let _ = writeln!(out, "    Note over {from}: {prefix}{label}");
            }
        }
        if violating {
            let _ = writeln!(
                out,
                "    Note over {span}: VIOLATION{}",
                invariant
                    .map(|i| format!(" {}", escape(i)))
                    .unwrap_or_default()
            );
            let _ = writeln!(out, "    end");
        }
    }
    if end < total {
        let _ = writeln!(
            out,
            "    Note over {span}: … {} later events not shown",
            total - end
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arrows_rejections_and_violation_are_drawn() {
        let trace = lines(&[
            r#"{"t":0,"actor":"client","kind":"resume","session":1}"#,
            r#"{"t":5,"actor":"core","kind":"start_execution","to":"provider"}"#,
            r#"{"t":9,"actor":"provider","kind":"boot_ready","verdict":"reject(stale_generation)","extra":{"x":1}}"#,
            "not json",
            r#"{"t":12,"actor":"core","kind":"dispatch; prompt #1","verdict":"accept"}"#,
        ]);
        let d = mermaid(&trace, &[4], Some("R4-lease"), None);
        assert!(d.starts_with("sequenceDiagram\n"));
        assert!(d.contains("client->>core: [0] t=0 resume session=1"), "{d}");
        assert!(d.contains("core->>provider: [1]"), "{d}");
        assert!(d.contains("provider--xcore: [2]"), "{d}");
        assert!(d.contains("#59;") && d.contains("#35;1"), "{d}");
        assert!(d.contains("VIOLATION R4-lease"), "{d}");
        assert!(d.contains("1 trace lines were not JSON objects"), "{d}");
    }

    #[test]
    fn window_ends_just_after_the_violation() {
        let trace: Vec<String> = (0..100)
            .map(|i| format!(r#"{{"t":{i},"actor":"client","kind":"k{i}"}}"#))
            .collect();
        let d = mermaid(&trace, &[50], None, Some(10));
        assert!(
            d.contains("[53]") && !d.contains("[54]") && d.contains("[44]"),
            "{d}"
        );
        assert!(!d.contains("[43]"), "{d}");
        assert!(d.contains("44 earlier events not shown"), "{d}");
    }

    #[test]
    fn unknown_actors_become_participants() {
        let trace = lines(&[r#"{"actor":"store","kind":"write","to":"end"}"#]);
        let d = mermaid(&trace, &[], None, None);
        assert!(d.contains("participant a_store as store"), "{d}");
        assert!(d.contains("participant a_end as end"), "{d}");
    }
}
