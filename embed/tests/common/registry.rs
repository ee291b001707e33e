//! What the tests that run real ACP programs share (`interop.rs`, `real_clients.rs`):
//! installing pinned packages from npm and PyPI into `target/interop/` (once, cached;
//! a missing tool or an unreachable registry is a [`Skip`], never a failure), scratch
//! directories, and ground truth about processes from `/proc` (descendants by parent
//! links, the agent trees a process marked, SIGKILL).
//!
//! Each test file that uses it says `mod common;` and `use common::registry::*` what it
//! needs; not every file uses every helper.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use palisade_embed::process::TREE_ENV;

/// Nothing of any agent tree may be alive this long after its owner's shutdown.
pub const GONE_WITHIN: Duration = Duration::from_secs(3);
/// How long `npm view` may take to tell whether the registry is reachable.
pub const REGISTRY_PROBE: Duration = Duration::from_secs(60);
/// How long one `npm install` may take (codex-acp's native package is about 200 MB).
pub const INSTALL_WITHIN: Duration = Duration::from_secs(240);

/// Says something on stderr, past the harness's capture, so a CI log shows it.
pub fn note(message: &str) {
    let _ = writeln!(std::io::stderr(), "{message}");
}
/// The cache of installed agents: `interop/` in the workspace's target directory.
pub fn cache_dir() -> PathBuf {
    palisade_testkit::shipped::target_dir()
        .parent()
        .expect("the shipped binaries live in <target>/shipped")
        .join("interop")
}

/// Where a tool built from source (`cargo install`, minutes) is cached: for the machine,
/// not the checkout, so that a clean clone (CI's) reuses it as cargo reuses its registry.
/// `PALISADE_INTEROP_CACHE` if set, else `$XDG_CACHE_HOME/palisade/interop`, else
/// `$HOME/.cache/palisade/interop`, else [`cache_dir`].
pub fn tool_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PALISADE_INTEROP_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")));
    match base {
        Some(base) if base.is_absolute() => base.join("palisade").join("interop"),
        _ => cache_dir(),
    }
}

/// Runs a command with a deadline; its output, or why not.
pub fn run(command: &mut Command, within: Duration) -> Result<Output, String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    let until = Instant::now() + within;
    // Read both pipes on threads so a chatty command cannot block on a full pipe.
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let err = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        bytes
    });
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{command:?} took longer than {within:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// The last non-empty line of a tool's stderr: its conclusion.
pub fn last_line(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Why an agent's checks did not run.
#[derive(Debug)]
pub struct Skip(pub String);

/// Installs `package@version` with npm into its own directory of the cache (once).
pub fn npm_install(package: &str, version: &str) -> Result<PathBuf, Skip> {
    if std::env::var("PALISADE_INTEROP").as_deref() == Ok("skip") {
        return Err(Skip("PALISADE_INTEROP=skip".into()));
    }
    let dir = cache_dir()
        .join("npm")
        .join(format!("{}@{version}", package.replace('/', "+")));
    let done = dir.join(".installed");
    if done.is_file() {
        return Ok(dir);
    }
    match run(Command::new("npm").arg("--version"), REGISTRY_PROBE) {
        Ok(output) if output.status.success() => {}
        _ => return Err(Skip("npm is not installed".into())),
    }
    let spec = format!("{package}@{version}");
    match run(
        Command::new("npm").args(["view", &spec, "version"]),
        REGISTRY_PROBE,
    ) {
        Ok(output) if output.status.success() => {}
        Ok(output) => {
            return Err(Skip(format!(
                "the npm registry did not answer for {spec}: {}",
                last_line(&output.stderr)
            )))
        }
        Err(why) => return Err(Skip(format!("the npm registry is not reachable: {why}"))),
    }
    std::fs::create_dir_all(&dir).expect("the cache directory can be made");
    let started = Instant::now();
    let output = run(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--no-save"])
            .args(["--ignore-scripts", "--loglevel=error", "--prefix"])
            .arg(&dir)
            .arg(&spec),
        INSTALL_WITHIN,
    )
    .unwrap_or_else(|why| panic!("npm install {spec}: {why}"));
    assert!(
        output.status.success(),
        "the registry answered, but npm install {spec} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(&done, spec.as_bytes()).expect("the cache is writable");
    note(&format!(
        "registry: installed {spec} into {} in {:.1} s",
        dir.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(dir)
}

/// Makes a venv in the cache and installs `package==version` into it (once); its python.
pub fn pip_install(package: &str, version: &str) -> Result<PathBuf, Skip> {
    if std::env::var("PALISADE_INTEROP").as_deref() == Ok("skip") {
        return Err(Skip("PALISADE_INTEROP=skip".into()));
    }
    let dir = cache_dir()
        .join("pip")
        .join(format!("{package}=={version}"));
    let python = dir.join("bin").join("python");
    let done = dir.join(".installed");
    if done.is_file() {
        return Ok(python);
    }
    let spec = format!("{package}=={version}");
    let probe = cache_dir().join("pip").join("probe");
    let _ = std::fs::create_dir_all(&probe);
    match run(
        Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
            .arg(&probe)
            .arg(&spec),
        REGISTRY_PROBE,
    ) {
        Ok(output) if output.status.success() => {}
        Ok(output) => {
            return Err(Skip(format!(
                "python3 -m pip cannot fetch {spec} (PyPI not reachable?): {}",
                last_line(&output.stderr)
            )))
        }
        Err(why) => return Err(Skip(format!("PyPI is not reachable: {why}"))),
    }
    let started = Instant::now();
    let _ = std::fs::remove_dir_all(&dir);
    match run(
        Command::new("python3").args(["-m", "venv"]).arg(&dir),
        INSTALL_WITHIN,
    ) {
        Ok(output) if output.status.success() => {}
        _ => return Err(Skip("python3 cannot make a venv".into())),
    }
    let output = run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(&spec),
        INSTALL_WITHIN,
    )
    .unwrap_or_else(|why| panic!("pip install {spec}: {why}"));
    assert!(
        output.status.success(),
        "PyPI answered, but pip install {spec} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(&done, spec.as_bytes()).expect("the cache is writable");
    note(&format!(
        "registry: installed {spec} into {} in {:.1} s",
        dir.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(python)
}

/// How long one `cargo install` may take: a crate's whole dependency tree, built once.
pub const CARGO_INSTALL_WITHIN: Duration = Duration::from_secs(1500);

/// Builds `krate` `version`'s binaries with `cargo install --locked` into its own
/// directory of the cache (once, in a build directory of its own, removed after); the
/// directory holding the binaries.
pub fn cargo_install(krate: &str, version: &str) -> Result<PathBuf, Skip> {
    if std::env::var("PALISADE_INTEROP").as_deref() == Ok("skip") {
        return Err(Skip("PALISADE_INTEROP=skip".into()));
    }
    let dir = tool_cache_dir()
        .join("cargo")
        .join(format!("{krate}@{version}"));
    let done = dir.join(".installed");
    if done.is_file() {
        return Ok(dir.join("bin"));
    }
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
    let spec = format!("{krate}@{version}");
    match run(Command::new(&cargo).args(["info", &spec]), REGISTRY_PROBE) {
        Ok(output) if output.status.success() => {}
        Ok(output) => {
            return Err(Skip(format!(
                "crates.io did not answer for {spec}: {}",
                last_line(&output.stderr)
            )))
        }
        Err(why) => return Err(Skip(format!("crates.io is not reachable: {why}"))),
    }
    let started = Instant::now();
    let output = run(
        Command::new(&cargo)
            .args([
                "install",
                "--locked",
                "--quiet",
                "--version",
                version,
                "--root",
            ])
            .arg(&dir)
            .arg("--target-dir")
            .arg(dir.join("build"))
            .arg(krate),
        CARGO_INSTALL_WITHIN,
    )
    .unwrap_or_else(|why| panic!("cargo install {spec}: {why}"));
    assert!(
        output.status.success(),
        "crates.io answered, but cargo install {spec} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(dir.join("build"));
    std::fs::write(&done, spec.as_bytes()).expect("the cache is writable");
    note(&format!(
        "registry: installed {spec} into {} in {:.1} s",
        dir.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(dir.join("bin"))
}

/// The short name of a live process (`/proc/<pid>/comm`, at most 15 bytes).
pub fn process_name(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|name| name.trim_end().to_owned())
}

pub fn node_available() -> bool {
    run(Command::new("node").arg("--version"), REGISTRY_PROBE)
        .is_ok_and(|output| output.status.success())
}

/// A scratch directory for one run (its HOME, its workspace).
pub fn scratch(name: &str) -> PathBuf {
    let dir = cache_dir()
        .join("run")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("home")).unwrap();
    std::fs::create_dir_all(dir.join("work")).unwrap();
    dir
}
// ----- ground truth: the processes of this test's agent trees -----------------------------

/// Live processes whose environment carries a tree marker minted by the process `minter`
/// (markers start with the minting process's pid): this test process's own supervisors,
/// or a `palisade-proxy` it runs.
pub fn tree_processes(minter: u32) -> Vec<(u32, String)> {
    let needle = format!("{TREE_ENV}={minter}-");
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let zombie = stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'));
        if zombie {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|&b| b == 0)
            .any(|e| e.starts_with(needle.as_bytes()))
        {
            let name = stat
                .split_once(" (")
                .and_then(|(_, rest)| rest.rsplit_once(')'))
                .map_or(String::new(), |(name, _)| name.to_owned());
            found.push((pid, name));
        }
    }
    found
}

/// `pid` and its live descendants, by parent links in `/proc`: ground truth that does
/// not depend on the supervisor's own marker.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((child, ppid));
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parent_of
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(child, _)| *child),
        );
        i += 1;
    }
    tree
}

pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    })
}

/// Waits until no process of the trees `minter` marked is left, neither by marker nor
/// among `known` (pids seen in the agents' trees by parent links); panics after
/// [`GONE_WITHIN`].
pub fn assert_no_tree_left(what: &str, minter: u32, known: &[u32]) {
    let until = Instant::now() + GONE_WITHIN;
    loop {
        let mut left = tree_processes(minter);
        left.extend(
            known
                .iter()
                .filter(|pid| alive(**pid))
                .map(|pid| (*pid, "(seen in the tree)".to_owned())),
        );
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < until,
            "{what}: agent processes alive {GONE_WITHIN:?} later: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn sigkill(pid: u32) {
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -9 {pid}");
}
