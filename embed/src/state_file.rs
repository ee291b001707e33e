//! The state file on disk: written atomically and durably, through the file operations of
//! a [`StateFs`] (the real filesystem, [`RealFs`], in production; a simulated disk that
//! fails, delays and tears writes in the simulator). What the file holds is the engine's
//! state image (`palisade_engine::state`).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use palisade_engine::state::StateError;

/// The file operations the state file needs. Blocking: the supervisor runs a write on
/// its platform's blocking pool ([`crate::platform::Platform::blocking`]).
pub trait StateFs: Send + Sync + std::fmt::Debug {
    /// The whole file; an error of kind `NotFound` if there is none.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Creates or truncates `path`, writes `bytes` and fsyncs the file.
    fn write_synced(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Renames `from` over `to` (atomic on POSIX filesystems).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Fsyncs the directory `dir`, so that a rename in it survives a power loss.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The real filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

impl StateFs for RealFs {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn write_synced(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.write_all(bytes)?;
        file.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// Where a supervisor keeps its state: a path on a [`StateFs`].
#[derive(Debug, Clone)]
pub struct StateFile {
    /// The filesystem.
    pub fs: Arc<dyn StateFs>,
    /// The file.
    pub path: PathBuf,
}

impl StateFile {
    /// `path` on the real filesystem.
    #[must_use]
    pub fn real(path: impl Into<PathBuf>) -> StateFile {
        StateFile {
            fs: Arc::new(RealFs),
            path: path.into(),
        }
    }

    /// Reads the state; `Ok(None)` if there is none yet.
    pub fn read(&self) -> Result<Option<Vec<u8>>, StateError> {
        read_on(&*self.fs, &self.path)
    }

    /// Replaces the state with `bytes`, atomically and durably ([`write_atomically_on`]).
    pub fn write(&self, bytes: &[u8]) -> io::Result<()> {
        write_atomically_on(&*self.fs, &self.path, bytes)
    }
}

/// Reads a state file; `Ok(None)` if there is none yet.
pub fn read_on(fs: &dyn StateFs, path: &Path) -> Result<Option<Vec<u8>>, StateError> {
    match fs.read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(StateError::Io(error)),
    }
}

/// Reads a state file on the real filesystem; `Ok(None)` if there is none yet.
#[cfg(test)]
pub(crate) fn read(path: &Path) -> Result<Option<Vec<u8>>, StateError> {
    read_on(&RealFs, path)
}

/// The temporary file a write goes through: `<name>.tmp` beside the state file.
#[must_use]
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Replaces `path` with `bytes` atomically and durably, on `fs`: write a temporary file
/// beside it and fsync it, rename it over `path`, fsync the directory (so the rename itself
/// survives a power loss). A crash at any point leaves `path` holding the old state or the
/// new one, never a mix; a leftover temporary file is never read.
pub fn write_atomically_on(fs: &dyn StateFs, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temp = temp_path(path);
    fs.write_synced(&temp, bytes)?;
    fs.rename(&temp, path)?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    fs.sync_dir(dir)
}

/// [`write_atomically_on`] the real filesystem.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomically_on(&RealFs, path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_the_file_and_leaves_no_temp() {
        let dir = std::env::temp_dir().join(format!("palisade-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.bin");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert!(!temp_path(&path).exists());
        assert_eq!(read(&dir.join("missing")).unwrap(), None);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
