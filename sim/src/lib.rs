//! palisade-sim: the deterministic madsim world that drives palisade-core, and the
//! `palisade` command line around it.
//!
//! - [`world`]: the simulated world, fault plans and oracle; [`world::run_seed`] runs one seed.
//! - [`scenario`]: scenario files (TOML) and where they are found.
//! - [`runner`]: seeds on threads that carry nothing from one to the next, panics caught,
//!   many seeds in parallel.
//! - [`sweep`]: a sweep's seeds in parallel, determinism checks, progress; [`seeds`]: which
//!   seeds it runs (ranges and shards); [`record`]: what it keeps of each seed's run.
//! - [`report`]: summary.json/.md, junit.xml, atomic writes, merging shards.
//! - [`failure`]: failure files (replayable), [`minimize`]: shrinking them,
//!   [`diagram`]: mermaid sequence diagrams of their traces.
//! - [`scoreboard`]: the mutant scoreboard.
//! - [`search`]: search strategies (uniform, coverage-guided).
//! - [`input`]: reading the files a user names, every one with a size cap.
//! - [`mix`]: deterministic mixing (splitmix64) for decisions keyed by what they concern.
//! - [`memory`]: what a seed holds in memory, and the budget counts and sizes must fit
//!   together.
//! - [`cli`]: the command line.
#![forbid(unsafe_code)]
#[cfg(not(madsim))]
compile_error!(
    "palisade-sim must be built with `--cfg madsim` (set by .cargo/config.toml). \
     If you set RUSTFLAGS yourself, it replaces the config's flags: add `--cfg madsim` to it."
);
pub mod cli;
pub mod corpus;
pub mod diagram;
pub mod failure;
pub mod input;
pub mod memory;
pub mod minimize;
pub mod mix;
pub mod plan;
pub mod record;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod scoreboard;
pub mod search;
pub mod seeds;
pub(crate) mod stack;
pub mod sweep;
pub mod world;
