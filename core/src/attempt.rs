//! Rules 1–3: attempts, the bounded tombstone ring, and fail-closed admission by attempt.
//!
//! Attempt IDs are minted from one monotonic counter per core (with the epoch on top), so
//! a session only has to remember its live attempt, a ring of the last
//! [`TOMBSTONES_PER_SESSION`] retired ones, and a watermark: the newest ID the ring ever
//! evicted. An ID at or below the watermark that is not in the ring is an evicted one and
//! fails closed. Memory stays O(1) per session however many attempts it has had.

use serde::{Deserialize, Serialize};

use crate::config::TOMBSTONES_PER_SESSION;
use crate::ids::{AttemptId, ExecutionId, Generation};
use crate::io::NewConversationReason;
use crate::time::Timestamp;

/// Where a live attempt is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum AttemptState {
    /// Starting its runtime.
    Live,
    /// The provider accepted its prompt; it finishes in the same step (see `Core`), and
    /// cancelling no longer tears its runtime down.
    Accepted,
}

/// The session's live attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LiveAttempt {
    pub(crate) id: AttemptId,
    pub(crate) state: AttemptState,
    pub(crate) execution: Option<ExecutionId>,
    pub(crate) generation: Option<Generation>,
    /// The attempt fails if its conversation is not ready by then.
    pub(crate) start_deadline: Timestamp,
    /// Joiners are answered by then (the latest joiner's deadline).
    pub(crate) join_deadline: Option<Timestamp>,
    /// Where its conversation is: each answer is accepted only while it is awaited, so a
    /// duplicated or late `load_failed` cannot replace a conversation created since.
    pub(crate) conversation: ConvPhase,
    /// Started by automatic recovery rather than by a client.
    pub(crate) for_recovery: bool,
}

/// The conversation step of a live attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ConvPhase {
    /// Waiting for the agent to be ready.
    Pending,
    /// `session/load` requested.
    Loading,
    /// `session/new` requested, for this reason.
    Creating(NewConversationReason),
    /// The conversation is ready (a prompt may be in flight).
    Ready,
}

/// How a retired attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Retired {
    Cancelled = 1,
    Failed = 2,
    /// Finished successfully; it owns its execution until a later attempt exists.
    Finished = 3,
}

impl Retired {
    fn from_bits(bits: u32) -> Option<Retired> {
        match bits {
            1 => Some(Retired::Cancelled),
            2 => Some(Retired::Failed),
            3 => Some(Retired::Finished),
            _ => None,
        }
    }
}

/// One retired attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tombstone {
    pub(crate) attempt: AttemptId,
    pub(crate) execution: Option<ExecutionId>,
    pub(crate) outcome: Retired,
}

/// The bounded ring of tombstones: an inline array, outcomes packed two bits per slot so a
/// full ring costs 16 × 16 bytes + 8.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ring {
    slots: [Option<(AttemptId, Option<ExecutionId>)>; TOMBSTONES_PER_SESSION],
    outcomes: u32,
    /// Index of the oldest entry.
    head: u8,
    len: u8,
}

const _: () = assert!(
    TOMBSTONES_PER_SESSION * 2 <= 32,
    "outcomes are 2 bits per slot in a u32"
);

impl Ring {
    pub(crate) fn len(&self) -> usize {
        usize::from(self.len)
    }

    fn slot(&self, i: usize) -> Option<Tombstone> {
        let (attempt, execution) = self.slots[i]?;
        let outcome = Retired::from_bits((self.outcomes >> (2 * i)) & 0b11)?;
        Some(Tombstone {
            attempt,
            execution,
            outcome,
        })
    }

    /// Tombstones oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Tombstone> + '_ {
        (0..self.len())
            .filter_map(move |k| self.slot((usize::from(self.head) + k) % TOMBSTONES_PER_SESSION))
    }

    pub(crate) fn find(&self, attempt: AttemptId) -> Option<Tombstone> {
        self.iter().find(|t| t.attempt == attempt)
    }

    pub(crate) fn newest(&self) -> Option<Tombstone> {
        if self.len == 0 {
            return None;
        }
        self.slot((usize::from(self.head) + self.len() - 1) % TOMBSTONES_PER_SESSION)
    }

    /// Appends a tombstone; returns the evicted oldest one when the ring was full.
    /// Rule 3 (idempotent retire) is the caller's: it only retires an attempt that is live.
    pub(crate) fn push(&mut self, t: Tombstone) -> Option<Tombstone> {
        let mut evicted = None;
        if self.len() == TOMBSTONES_PER_SESSION {
            let head = usize::from(self.head);
            evicted = self.slot(head);
            self.head = ((head + 1) % TOMBSTONES_PER_SESSION) as u8;
            self.len -= 1;
        }
        let i = (usize::from(self.head) + self.len()) % TOMBSTONES_PER_SESSION;
        self.slots[i] = Some((t.attempt, t.execution));
        self.outcomes = (self.outcomes & !(0b11 << (2 * i))) | ((t.outcome as u32) << (2 * i));
        self.len += 1;
        evicted
    }
}

/// What the ring and watermark say about an attempt ID that is not the live one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Remembered {
    Tomb(Tombstone),
    Evicted,
    Unknown,
}

/// Looks up a non-live attempt ID.
pub(crate) fn remember(
    ring: &Ring,
    watermark: Option<AttemptId>,
    attempt: AttemptId,
) -> Remembered {
    if let Some(t) = ring.find(attempt) {
        return Remembered::Tomb(t);
    }
    match watermark {
        Some(w) if attempt <= w => Remembered::Evicted,
        _ => Remembered::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Epoch;

    fn id(n: u64) -> AttemptId {
        AttemptId::new(Epoch::FIRST, n).unwrap()
    }

    #[test]
    fn ring_keeps_the_newest_sixteen_and_reports_evictions() {
        let mut ring = Ring::default();
        let mut evicted = Vec::new();
        for n in 1..=40 {
            let outcome = if n % 2 == 0 {
                Retired::Finished
            } else {
                Retired::Cancelled
            };
            if let Some(e) = ring.push(Tombstone {
                attempt: id(n),
                execution: ExecutionId::new(n),
                outcome,
            }) {
                evicted.push(e.attempt.seq());
            }
        }
        assert_eq!(ring.len(), TOMBSTONES_PER_SESSION);
        assert_eq!(evicted, (1..=24).collect::<Vec<_>>());
        let kept: Vec<u64> = ring.iter().map(|t| t.attempt.seq()).collect();
        assert_eq!(kept, (25..=40).collect::<Vec<_>>());
        assert_eq!(ring.find(id(40)).unwrap().outcome, Retired::Finished);
        assert_eq!(ring.find(id(39)).unwrap().outcome, Retired::Cancelled);
        assert_eq!(ring.newest().unwrap().attempt, id(40));
    }

    #[test]
    fn evicted_ids_are_remembered_as_evicted_and_others_as_unknown() {
        let ring = Ring::default();
        assert_eq!(remember(&ring, Some(id(5)), id(3)), Remembered::Evicted);
        assert_eq!(remember(&ring, Some(id(5)), id(6)), Remembered::Unknown);
        assert_eq!(remember(&ring, None, id(1)), Remembered::Unknown);
    }
}
