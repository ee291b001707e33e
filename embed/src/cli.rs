//! What the shipped binaries share about their command lines: clap reads the flags (as
//! `OsString`, so an argument that is not UTF-8 is refused by name, never a panic), and
//! [`usage_exit`] reports what it refused.

/// Prints what clap refused (or the help it was asked for) and returns the exit code: the
/// help on stdout and 0, or the message on stderr after `program`'s name and 2 (bad usage).
#[must_use]
pub fn usage_exit(program: &str, error: &clap::Error) -> u8 {
    let text = error.render().to_string();
    match error.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
            print!("{text}");
            0
        }
        _ => {
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            eprint!("{program}: {text}");
            2
        }
    }
}
