//! Structured logs for programs built on Palisade (`palisade-supervise` uses it): the
//! library emits `tracing` events, in spans that carry the session, attempt and execution
//! (an agent's stderr lines are logged in its execution's span); [`init`] prints them on
//! stderr, filtered like `RUST_LOG`, as text or as JSON lines.
//!
//! A service that embeds the library installs its own subscriber instead and never calls
//! [`init`].

use std::fmt;
use std::str::FromStr;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event, its spans' fields before the message.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (with
    /// `message`), `span` (the innermost) and `spans` (outermost first).
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("not a log format: {other:?} (text or json)")),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

/// The filter when `RUST_LOG` is unset or empty: info and above (agents' stderr lines
/// are info).
pub const DEFAULT_FILTER: &str = "info";

/// The filter `directives` (`RUST_LOG`'s syntax; `None` or empty: [`DEFAULT_FILTER`]),
/// checked.
///
/// # Errors
/// A directive that does not parse, with the reason.
pub fn filter(directives: Option<&str>) -> Result<EnvFilter, String> {
    let directives = directives
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .unwrap_or(DEFAULT_FILTER);
    EnvFilter::builder()
        .parse(directives)
        .map_err(|error| format!("RUST_LOG {directives:?}: {error}"))
}

/// Installs the process-wide subscriber: events that pass `RUST_LOG` (see [`filter`]) go
/// to stderr in `format`.
///
/// # Errors
/// `RUST_LOG` does not parse, or a subscriber is already installed.
pub fn init(format: LogFormat) -> Result<(), String> {
    init_with(format, std::env::var("RUST_LOG").ok().as_deref())
}

/// Installs the process-wide subscriber with the filter `directives` (see [`filter`])
/// instead of `RUST_LOG`'s.
///
/// # Errors
/// `directives` do not parse, or a subscriber is already installed.
pub fn init_with(format: LogFormat, directives: Option<&str>) -> Result<(), String> {
    let filter = filter(directives)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
    installed.map_err(|error| format!("cannot install the logger: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_print_alike() {
        for format in [LogFormat::Text, LogFormat::Json] {
            assert_eq!(format.to_string().parse::<LogFormat>(), Ok(format));
        }
        assert!("xml".parse::<LogFormat>().is_err());
    }

    #[test]
    fn a_bad_filter_is_refused_and_an_empty_one_is_the_default() {
        assert!(filter(Some("palisade_embed=loud")).is_err());
        assert!(filter(Some("")).is_ok());
        assert!(filter(None).is_ok());
        assert!(filter(Some("warn,palisade_embed::agent=debug")).is_ok());
    }
}
