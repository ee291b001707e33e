//! `palisade-testkit`: what Palisade's simulator and tests use to stand in for the world,
//! and nothing a shipped binary links.
//!
//! - [`agent_model`]: the behaviour table of real ACP agents as a sans-IO model of one
//!   agent process (lines in, lines out with the time to write them, its exit). The
//!   simulator drives it in simulated time.
//! - `palisade-test-agent` (a binary of this crate): the same model on real stdio and the
//!   real clock, for the tests of the tokio shell against a real process.
//! - [`wire_text`]: the text real agents write (escapes, unicode, backslash runs, Windows
//!   paths, code, nested JSON), drawn into every string the simulated agents send.
//! - [`shipped`]: the shipped binaries built as a user builds them (their package alone,
//!   without the features the simulator turns on), for the tests that run them.

pub mod agent_model;
pub mod shipped;
pub mod wire_text;
