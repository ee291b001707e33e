//! What one seed holds in memory, and the budget every scenario and plan must fit in.
//!
//! Each count and size of a scenario has its own bound (`scenario.rs`, "Input bounds" in
//! the README), but memory goes with their product: `notifications_per_turn = [10000,
//! 10000]` with `notification_bytes = [1048576, 1048576]` passed every bound one by one and
//! aborted with an allocation failure (issue 28). So the product is bounded too, against
//! one budget, [`MAX_SEED_MEMORY_BYTES`], by the estimate [`SeedMemory::bytes`].
//!
//! What a seed holds, measured (peak resident memory of `palisade sweep` over one seed,
//! the release binary, events of 16 bytes to 1 MiB):
//!
//! - **The events in flight.** An agent writes a prompt's events as fast as its think time
//!   allows: when the turn has more events than milliseconds to think, all at once. Each is
//!   a line reserved at its drawn size (`palisade_embed::agent_model`), held until the
//!   engine read it and the client got it (backpressure keeps the rest at the agent). 1,000
//!   events of 64 KiB to 1 MiB took 1.1 to 1.4 times their sizes, events of 16 bytes about
//!   1.8 KiB each. Turns one after another do not add up (four took what one did); sessions
//!   streaming at once do, and a burst replaces a prompt's stream. An orchestrator
//!   crash-restart copies the queued output into the state image and back, and the
//!   recovery streams again: three crashes took up to 3.4 times the sizes.
//! - **The trace.** A failing seed (and `run`, `replay`, `--check-determinism`) keeps its
//!   whole trace, in which every event delivered to a client carries its text; the sweep
//!   then writes it out once more as the failure file. A delivered event takes at least two
//!   trace lines (the core's `stream` input and its `deliver` effect), so a run of
//!   `limits.max_events` lines delivers at most half as many events.
//! - **The oracle's records**: a few dozen bytes per event, within the per-event overhead.

/// The most memory one seed may hold, by [`SeedMemory::bytes`]: 2 GiB. A sweep runs
/// `--jobs` seeds at once, so a CI runner of 7 GiB and two cores keeps room to spare;
/// the shipped scenarios' largest draw (`swarm`'s) is estimated at about 1.45 GB.
pub const MAX_SEED_MEMORY_BYTES: u64 = 2 << 30;

/// Each event in flight is counted this many times its size: the line, the allocator's
/// rounding and the client's copy (1.1–1.4 measured), and the copies of an orchestrator
/// crash-restart (up to 3.4 measured).
pub const IN_FLIGHT_COPIES: u64 = 4;

/// What an event in flight takes besides its text: its line's envelope, the agent's and
/// the oracle's records of it (about 1.8 KiB measured for events of 16 bytes).
pub const EVENT_OVERHEAD_BYTES: u64 = 2 << 10;

/// What a trace line takes besides an event's text (most lines are 100 to 250 bytes).
pub const TRACE_LINE_BYTES: u64 = 256;

/// A failing seed's trace is held twice: kept, and written out as its failure file.
pub const TRACE_COPIES: u64 = 2;

/// The factors of a seed's memory: the most of each a run of a scenario (or of one plan)
/// may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeedMemory {
    /// Sessions, each with an agent that may stream at the same time as the others.
    pub sessions: u64,
    /// The most events one prompt writes: its stream's most, or a burst's count.
    pub events_per_prompt: u64,
    /// The most bytes one event has.
    pub event_bytes: u64,
    /// Trace lines a run may record (`limits.max_events`).
    pub max_events: u64,
}

impl SeedMemory {
    /// The events in flight at once: every session's prompt, each event with its copies.
    pub fn in_flight(&self) -> u64 {
        self.sessions
            .saturating_mul(self.events_per_prompt)
            .saturating_mul(
                self.event_bytes
                    .saturating_mul(IN_FLIGHT_COPIES)
                    .saturating_add(EVENT_OVERHEAD_BYTES),
            )
    }

    /// The trace a failing seed holds: its lines, and the text of every event it delivers,
    /// [`TRACE_COPIES`] times.
    pub fn trace(&self) -> u64 {
        let lines = self.max_events.saturating_mul(TRACE_LINE_BYTES);
        let texts =
            (self.max_events / 2).saturating_mul(self.event_bytes.saturating_add(TRACE_LINE_BYTES));
        TRACE_COPIES.saturating_mul(lines.saturating_add(texts))
    }

    /// The estimate: the events in flight and the trace.
    pub fn bytes(&self) -> u64 {
        self.in_flight().saturating_add(self.trace())
    }

    /// Whether the estimate is within [`MAX_SEED_MEMORY_BYTES`].
    pub fn fits(&self) -> bool {
        self.bytes() <= MAX_SEED_MEMORY_BYTES
    }

    /// Whether the events in flight alone are past the budget (else the trace tips it).
    pub fn in_flight_alone_too_much(&self) -> bool {
        self.in_flight() > MAX_SEED_MEMORY_BYTES
    }

    /// The largest event size, at most `self.event_bytes`, with which these counts fit;
    /// `None` when even empty events do not.
    pub fn largest_fitting_event_bytes(&self) -> Option<u64> {
        let with = |event_bytes| SeedMemory {
            event_bytes,
            ..*self
        };
        if !with(0).fits() {
            return None;
        }
        // The estimate grows with the size: the largest that fits, by bisection.
        let (mut fits, mut past) = (0, self.event_bytes.saturating_add(1));
        while past - fits > 1 {
            let mid = fits + (past - fits) / 2;
            if with(mid).fits() {
                fits = mid;
            } else {
                past = mid;
            }
        }
        Some(fits)
    }

    /// Why it does not fit, naming where its factors come from: `count` (the most events a
    /// prompt writes), `bytes` (the largest event) and `events` (the trace's lines).
    pub fn explain(&self, count: &str, bytes: &str, events: &str) -> String {
        format!(
            "a seed would hold about {} bytes, more than it may (MAX_SEED_MEMORY_BYTES, {} \
             bytes): {} for the events in flight at once ({} sessions × {} events a prompt may \
             write ({count}) × ({} bytes ({bytes}) × {IN_FLIGHT_COPIES} + {EVENT_OVERHEAD_BYTES})) \
             and {} for the trace a failing seed keeps ({} lines ({events}) with the text of \
             every event they deliver, held {TRACE_COPIES} times); lower one of them",
            self.bytes(),
            MAX_SEED_MEMORY_BYTES,
            self.in_flight(),
            self.sessions,
            self.events_per_prompt,
            self.event_bytes,
            self.trace(),
            self.max_events,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scenario: every value within its own bound, their product far past the
    /// budget (measured: 11.2 GiB resident before it was refused).
    #[test]
    fn ten_thousand_events_of_a_mebibyte_do_not_fit() {
        let m = SeedMemory {
            sessions: 1,
            events_per_prompt: 10_000,
            event_bytes: 1 << 20,
            max_events: 200_000,
        };
        assert!(!m.fits());
        assert!(m.in_flight_alone_too_much());
        assert!(m.explain("a", "b", "c").contains("MAX_SEED_MEMORY_BYTES"));
    }

    #[test]
    fn the_largest_fitting_size_fits_and_one_more_byte_does_not() {
        let m = SeedMemory {
            sessions: 8,
            events_per_prompt: 1_100,
            event_bytes: 1 << 20,
            max_events: 50_000,
        };
        let b = m.largest_fitting_event_bytes().expect("empty events fit");
        assert!(SeedMemory {
            event_bytes: b,
            ..m
        }
        .fits());
        assert!(!SeedMemory {
            event_bytes: b + 1,
            ..m
        }
        .fits());
        let small = SeedMemory {
            event_bytes: 100,
            ..m
        };
        assert_eq!(small.largest_fitting_event_bytes(), Some(100));
        let crowded = SeedMemory {
            sessions: 64,
            events_per_prompt: 16_384,
            ..m
        };
        assert_eq!(crowded.largest_fitting_event_bytes(), None);
    }

    /// Saturating, never wrapping: the largest values of every factor do not fit.
    #[test]
    fn the_estimate_saturates() {
        let m = SeedMemory {
            sessions: u64::MAX,
            events_per_prompt: u64::MAX,
            event_bytes: u64::MAX,
            max_events: u64::MAX,
        };
        assert_eq!(m.bytes(), u64::MAX);
        assert!(!m.fits());
    }
}
