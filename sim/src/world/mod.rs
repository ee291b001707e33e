//! The engine world: the production orchestrator (`palisade-engine`'s `Engine`) in a
//! discrete-event world of simulated agent processes, pipes, clients and faults
//! (`run.rs`), judged by its oracle on what the environment recorded (`oracle.rs`).
//!
//! It stands beside the stack world (`crate::stack`), which runs the whole supervisor;
//! both run a seed's plan (`crate::plan`) and keep its logbook (`crate::logbook`), and
//! the runner (`crate::runner::run_seed`) picks one by the scenario's `[world] kind`.

mod agenda;
mod dense;
pub(crate) mod oracle;
mod run;

pub(crate) use run::run;
