//! The state file on disk: written atomically and durably, through the file operations of
//! a [`StateFs`] (the real filesystem, [`RealFs`], in production; a simulated disk that
//! fails, delays and tears writes in the simulator). What the file holds is the engine's
//! state image (`palisade_engine::state`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{FlockOperation, Mode, OFlags};

pub use palisade_engine::state::StateError;

/// The largest state file read or written: 256 MiB (268,435,456 bytes).
///
/// What a state image may hold is bounded in count, not in bytes: per session the text of
/// its turn in flight (at most `palisade_engine::config::MAX_PROMPT_BYTES`, 1 MiB; at most
/// 6 MiB as escaped JSON), the output the core admitted and the caller has not taken yet
/// (at most `delivery_queue_capacity` events, 1,024 by default, each as long as an agent's
/// line), and the events handed out and not yet acknowledged. No bound on its bytes follows
/// from the engine's limits alone, so the shell sets one: room for a session's largest turn
/// text and a full default queue of updates of up to 244 KiB each. It holds on both sides:
/// a larger state is never written (the supervisor stops as on a full disk, and the file
/// keeps the last state written), so every state file a supervisor writes, one can read
/// back; and a larger file is refused before it is read.
pub const MAX_STATE_FILE_BYTES: u64 = 256 << 20;

const _: () = assert!(
    MAX_STATE_FILE_BYTES
        >= 6 * palisade_engine::config::MAX_PROMPT_BYTES as u64
            + palisade_core::delivery::DEFAULT_QUEUE_CAPACITY as u64 * (244 << 10)
);

/// The file operations the state file needs. Blocking: the supervisor runs a write on
/// its platform's blocking pool ([`crate::platform::Platform::blocking`]).
pub trait StateFs: Send + Sync + std::fmt::Debug {
    /// The whole file, if it is a regular file of at most `max_bytes`; an error of kind
    /// `NotFound` if there is none. Anything else (a FIFO, a device, a directory, a larger
    /// file) is refused with an error that says so, without blocking and without reading
    /// it.
    fn read(&self, path: &Path, max_bytes: u64) -> io::Result<Vec<u8>>;
    /// Creates or truncates `path`, writes `bytes` and fsyncs the file.
    fn write_synced(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Renames `from` over `to` (atomic on POSIX filesystems).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Fsyncs the directory `dir`, so that a rename in it survives a power loss.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes the exclusive lock of the state file `path` for as long as the returned
    /// [`StateLock`] lives, and at most for the process's life. An error of kind
    /// `WouldBlock` if another process holds it (the message says which, when it can); any
    /// other error if it cannot be taken (and then nothing was created). [`RealFs`] waits
    /// up to [`LOCK_WAIT`] for a lock released that moment before it refuses.
    fn lock(&self, path: &Path) -> io::Result<StateLock>;
}

/// An exclusive hold on a state file ([`StateFs::lock`]): released when dropped, or when
/// the process that holds it dies.
#[derive(Debug)]
pub struct StateLock {
    _held: Box<dyn std::fmt::Debug + Send + Sync>,
}

impl StateLock {
    /// A lock that `held` keeps (an open file description, a guard), released when it is
    /// dropped.
    pub fn new(held: impl std::fmt::Debug + Send + Sync + 'static) -> StateLock {
        StateLock {
            _held: Box::new(held),
        }
    }
}

/// The real filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

/// What kind of file `kind` is, for a message.
fn kind_name(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

fn not_regular(path: &Path, kind: std::fs::FileType) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is not a regular file ({})",
            path.display(),
            kind_name(kind)
        ),
    )
}

fn too_large(path: &Path, bytes: u64, max_bytes: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "{} is {bytes} bytes; a state file is at most {max_bytes} bytes",
            path.display(),
        ),
    )
}

/// Opens `path` with `flags` and `O_NONBLOCK` (opening a FIFO never waits for its other
/// end) and checks that what it opened is a regular file: the check is on the opened file,
/// so nothing can be swapped in between.
fn open_regular(path: &Path, flags: OFlags, mode: Mode) -> io::Result<File> {
    let fd = rustix::fs::open(path, flags | OFlags::NONBLOCK | OFlags::CLOEXEC, mode)?;
    let file = File::from(fd);
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(not_regular(path, kind));
    }
    Ok(file)
}

impl StateFs for RealFs {
    fn read(&self, path: &Path, max_bytes: u64) -> io::Result<Vec<u8>> {
        let file = open_regular(path, OFlags::RDONLY | OFlags::NOCTTY, Mode::empty())?;
        let len = file.metadata()?.len();
        if len > max_bytes {
            return Err(too_large(path, len, max_bytes));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        // A file that grows while it is read is not read past the bound either.
        file.take(max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)?;
        let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        if read > max_bytes {
            return Err(too_large(path, read, max_bytes));
        }
        Ok(bytes)
    }

    fn write_synced(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        // Owner only: the state holds the client's prompts and its `initialize` and
        // `authenticate` params.
        let mut file = open_regular(
            path,
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
            Mode::from_raw_mode(0o600),
        )?;
        file.write_all(bytes)?;
        file.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    /// An exclusive `flock` on `<path>.lock` ([`lock_path`]), beside the state file (the
    /// state file itself is replaced by a rename on every write, so a lock on it would not
    /// outlive the first write). The lock file is created if need be and never removed:
    /// removing it would let a third process lock a new file while a second still holds
    /// the old one. The holder writes its pid into it, for the next one's message.
    fn lock(&self, path: &Path) -> io::Result<StateLock> {
        // A state path that names something other than a regular file (`/dev/zero`) is
        // refused before anything is created beside it. (The read checks the file it
        // opens again.)
        if let Ok(meta) = std::fs::metadata(path) {
            if !meta.is_file() {
                return Err(not_regular(path, meta.file_type()));
            }
        }
        let lock = lock_path(path);
        let file = open_regular(
            &lock,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOCTTY,
            Mode::from_raw_mode(0o666),
        )
        .map_err(|error| io::Error::new(error.kind(), format!("{}: {error}", lock.display())))?;
        match lock_within(&file, LOCK_WAIT) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut holder = String::new();
                let _ = (&file).take(32).read_to_string(&mut holder);
                let holder = match holder.trim().parse::<u32>() {
                    Ok(pid) => format!(" (process {pid})"),
                    Err(_) => String::new(),
                };
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} is in use by another supervisor{holder}, which holds {}",
                        path.display(),
                        lock.display()
                    ),
                ));
            }
            Err(error) => return Err(error.into()),
        }
        // Best effort: the pid only makes the next refusal's message clearer.
        let _ = file
            .set_len(0)
            .and_then(|()| (&file).write_all(format!("{}\n", std::process::id()).as_bytes()));
        Ok(StateLock::new(file))
    }
}

/// How long [`RealFs::lock`] waits for a held lock before it refuses: 500 ms.
///
/// A lock is an open file description's, and a child process shares its parent's until it
/// executes its program (the lock file is opened close-on-exec): a process that drops its
/// supervisor and at once starts the next one on the same state file, while another of its
/// threads is starting an agent, can find the released lock still held for the moment
/// between that fork and that exec. (The test suite, which runs supervisors side by side
/// in one process, did.) The wait covers that moment; a lock another supervisor really
/// holds is refused after it.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Takes `file`'s exclusive `flock`, trying again every few milliseconds for up to `wait`;
/// `WOULDBLOCK` if it is still held then.
fn lock_within(file: &File, wait: std::time::Duration) -> Result<(), rustix::io::Errno> {
    let until = std::time::Instant::now() + wait;
    loop {
        match rustix::fs::flock(file, FlockOperation::NonBlockingLockExclusive) {
            Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(rustix::io::Errno::INTR) => {}
            done => return done,
        }
    }
}

/// The lock file of a state file: `<name>.lock` beside it.
#[must_use]
pub fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    path.with_file_name(name)
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

    /// Takes the state file's exclusive lock ([`StateFs::lock`]): hold it while reading
    /// and writing the state.
    pub fn lock(&self) -> io::Result<StateLock> {
        self.fs.lock(&self.path)
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

/// Reads a state file of at most [`MAX_STATE_FILE_BYTES`]; `Ok(None)` if there is none
/// yet.
pub fn read_on(fs: &dyn StateFs, path: &Path) -> Result<Option<Vec<u8>>, StateError> {
    match fs.read(path, MAX_STATE_FILE_BYTES) {
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
///
/// A state of more than [`MAX_STATE_FILE_BYTES`] is refused (nothing is written): no
/// supervisor could read it back.
pub fn write_atomically_on(fs: &dyn StateFs, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if len > MAX_STATE_FILE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "the state is {len} bytes; a state file is at most {MAX_STATE_FILE_BYTES} bytes \
                 ({} MiB)",
                MAX_STATE_FILE_BYTES >> 20
            ),
        ));
    }
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
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "the state is its owner's only: {mode:o}");
        }
        assert_eq!(read(&dir.join("missing")).unwrap(), None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn fresh_dir(test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("palisade-state-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Issue 28, item 7: only a regular file is read, never past the bound, and never by
    /// waiting on it (a FIFO's open would wait for a writer for ever).
    #[test]
    fn only_a_regular_file_within_the_bound_is_read() {
        let dir = fresh_dir("read");
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        for (path, kind) in [
            (fifo.as_path(), "a FIFO"),
            (Path::new("/dev/zero"), "a character device"),
            (dir.as_path(), "a directory"),
        ] {
            let error = RealFs.read(path, 1 << 20).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{path:?}");
            assert!(error.to_string().contains(kind), "{error}");
        }
        let file = dir.join("state");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(RealFs.read(&file, 5).unwrap(), b"12345");
        let error = RealFs.read(&file, 4).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::FileTooLarge);
        assert!(error.to_string().contains("5 bytes"), "{error}");
        // Nothing is written in the FIFO's place either: its open does not wait for a
        // reader (there is none: ENXIO).
        let error = RealFs.write_synced(&fifo, b"x").unwrap_err();
        assert_eq!(
            error.raw_os_error(),
            Some(rustix::io::Errno::NXIO.raw_os_error())
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Issue 28: the lock. One holder at a time (also two in one process: each lock is an
    /// open file description of its own), released when dropped; the lock file stays.
    #[test]
    fn a_state_file_is_locked_by_one_holder_at_a_time() {
        let dir = fresh_dir("lock");
        let state = dir.join("state");
        let held = RealFs.lock(&state).expect("a free state file locks");
        let busy = RealFs.lock(&state).expect_err("held");
        assert_eq!(busy.kind(), io::ErrorKind::WouldBlock);
        let said = busy.to_string();
        assert!(said.contains("in use"), "{said}");
        assert!(
            said.contains(&format!("process {}", std::process::id())),
            "{said}"
        );
        assert!(said.contains("state.lock"), "{said}");
        drop(held);
        let again = RealFs.lock(&state).expect("released when dropped");
        assert!(lock_path(&state).is_file());
        drop(again);
        // What is not a regular file is refused before anything is created beside it.
        let error = RealFs.lock(Path::new("/dev/null")).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(!Path::new("/dev/null.lock").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The CI run of 2026-12-02: a supervisor closed, and the next one started at once on
    /// the same state file in the same process was refused as "in use by another
    /// supervisor (process <its own pid>)": another test's agent, forked at that moment,
    /// still shared the lock until its exec. Here another process holds the lock for
    /// 100 ms; the next lock waits for it instead of refusing.
    #[test]
    fn a_lock_held_for_a_moment_is_waited_for() {
        let dir = fresh_dir("lock-moment");
        let state = dir.join("state");
        let lock = lock_path(&state);
        std::fs::write(&lock, b"").unwrap();
        let mut child = std::process::Command::new("flock")
            .arg(&lock)
            .args(["sleep", "0.1"])
            .spawn()
            .expect("flock(1) runs");
        // Until the child holds it.
        let probe = File::open(&lock).unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while rustix::fs::flock(&probe, FlockOperation::NonBlockingLockExclusive).is_ok() {
            rustix::fs::flock(&probe, FlockOperation::Unlock).unwrap();
            assert!(
                std::time::Instant::now() < until,
                "flock(1) never took the lock"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        drop(probe);
        let again = RealFs
            .lock(&state)
            .expect("a lock released within the wait is taken");
        drop(again);
        assert!(child.wait().unwrap().success());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_state_past_the_bound_is_not_written() {
        /// A disk on which nothing may happen.
        #[derive(Debug)]
        struct Untouched;
        impl StateFs for Untouched {
            fn read(&self, _: &Path, _: u64) -> io::Result<Vec<u8>> {
                unreachable!("nothing is read")
            }
            fn write_synced(&self, _: &Path, _: &[u8]) -> io::Result<()> {
                panic!("nothing may be written")
            }
            fn rename(&self, _: &Path, _: &Path) -> io::Result<()> {
                panic!("nothing may be renamed")
            }
            fn sync_dir(&self, _: &Path) -> io::Result<()> {
                panic!("nothing may be synced")
            }
            fn lock(&self, _: &Path) -> io::Result<StateLock> {
                unreachable!("nothing is locked")
            }
        }
        let too_big = vec![0u8; usize::try_from(MAX_STATE_FILE_BYTES).unwrap() + 1];
        let error = write_atomically_on(&Untouched, Path::new("state"), &too_big).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::FileTooLarge);
    }
}
