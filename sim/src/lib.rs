//! palisade-sim: the deterministic madsim world that drives palisade-core, and the
//! `palisade` command line around it.
//!
//! - [`runner`]: [`runner::run_seed`] runs one seed in its world; seeds on threads that carry
//!   nothing from one to the next, panics caught, many seeds in parallel.
//! - the two worlds, side by side: the engine world (`world/`: the production engine among
//!   simulated agents, pipes and clients) and the stack world (`stack/`: the whole
//!   production supervisor on simulated seams).
//! - what both worlds share: [`plan`] (what a seed runs with: faults, configuration,
//!   environment, the agents' behaviour), the logbook of a seed (`logbook/`: its trace,
//!   coverage marks and the core-belief checker) and [`oracle`] (violations, who caught
//!   them, which checks run).
//! - [`scenario`]: scenario files (TOML) and where they are found.
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
pub(crate) mod logbook;
pub mod memory;
pub mod minimize;
pub mod mix;
pub mod oracle;
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
pub(crate) mod world;
