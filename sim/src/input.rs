//! Reading what a user hands the command line: every file is read with a size cap, as a
//! regular file only, so a hostile or mistaken path (`/dev/zero`, a FIFO, a file that
//! grows while it is read, a directory) is an error that names it and the bound, never
//! an allocation until memory runs out or a read that never ends.

use std::io::Read;
use std::path::Path;

/// Reads `path` whole if it is a regular file of at most `max` bytes. `what` names the
/// kind of file in the message ("scenario", "failure file", ...).
pub fn read_capped(path: &Path, max: u64, what: &str) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "{shown}: not a regular file (a {what} is read from a plain file)"
        ));
    }
    if meta.len() > max {
        return Err(too_large(path, meta.len(), max, what));
    }
    let file = std::fs::File::open(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    // The file may have grown since its size was read: never take more than the bound.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{shown}: cannot read: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(too_large(path, bytes.len() as u64, max, what));
    }
    Ok(bytes)
}

/// [`read_capped`], as UTF-8 text.
pub fn read_text_capped(path: &Path, max: u64, what: &str) -> Result<String, String> {
    let bytes = read_capped(path, max, what)?;
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{}: not UTF-8 text (a {what} is UTF-8): invalid byte at offset {}",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

fn too_large(path: &Path, len: u64, max: u64, what: &str) -> String {
    format!(
        "{}: {len} bytes or more is larger than a {what} may be (at most {max} bytes)",
        path.display()
    )
}

/// Whether `name` is a plain file name: not empty, no separator, not `.` or `..`, no
/// leading dot, only letters, digits, `-`, `_` and `.`. Such a name, joined to a
/// directory, stays in that directory.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 255
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_stay_in_their_directory() {
        for ok in ["swarm-28.json", "a", "x_y.z"] {
            assert!(is_plain_name(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "a\\b",
            ".hidden",
            "/etc/passwd",
            "é",
        ] {
            assert!(!is_plain_name(bad), "{bad}");
        }
    }

    #[test]
    fn special_files_and_large_files_are_refused() {
        let e = read_capped(Path::new("/dev/zero"), 10, "summary").unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let dir = std::env::temp_dir().join(format!("palisade-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big");
        std::fs::write(&big, vec![b'x'; 11]).unwrap();
        let e = read_capped(&big, 10, "summary").unwrap_err();
        assert!(e.contains("at most 10 bytes"), "{e}");
        assert_eq!(read_capped(&big, 11, "summary").unwrap().len(), 11);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
