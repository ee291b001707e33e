//! # palisade-reference
//!
//! Reference models of Palisade's rules for the checkers (the simulator's oracle, the
//! fuzzer), restated from `docs/design.md` and the tables of `docs/real-agents.md`. This
//! crate depends on nothing, `palisade-core` least of all: a checker that judges the core
//! with it cannot share a bug with the code it judges, by construction.
//!
//! - [`rule6`]: may a failed `session/load` be replaced by `session/new`?
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod rule6;
