//! Rule 3's memory: the bounded ring of a session's retired attempts (tombstones), and what
//! it remembers of an attempt ID.
//!
//! A session remembers its last [`TOMBSTONES_PER_SESSION`] retired attempts, each with the
//! execution it had and how it ended; the oldest is evicted when a new one comes, and the
//! session's watermark keeps the newest ID ever evicted. [`remember`] reads the two: a
//! tombstone, an evicted ID, or one never seen. What a callback of such an attempt is told
//! (rule 2, failing closed) is decided in `attempt.rs`, as is retiring (rule 3: at most one
//! tombstone per attempt, `Core::retire_live`).

use serde::{Deserialize, Serialize};

use crate::config::TOMBSTONES_PER_SESSION;
use crate::ids::{AttemptId, ExecutionId};

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

/// One ring slot: a retired attempt and the execution it had; `None` never written.
type Slot = Option<(AttemptId, Option<ExecutionId>)>;

/// The bounded ring of tombstones, outcomes packed two bits per slot.
///
/// The slots live in a `Vec` that grows with the ring (1, 2, 4, 8, then
/// [`TOMBSTONES_PER_SESSION`] slots of 16 bytes) and never beyond: most sessions retire a
/// few attempts, and a session at rest should pay for the tombstones it has, not for
/// sixteen (issue 2: at most 512 bytes per session at rest). Indexing is exactly that of
/// a fixed array of [`TOMBSTONES_PER_SESSION`] slots, of which `slots` holds the prefix up
/// to the last one ever written; snapshots encode that prefix as it is (a decoded ring is
/// checked by [`Ring::is_well_formed`] before use).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ring {
    /// Slots `0..slots.len()` of the array; never ends with `None`, so equal rings are
    /// equal `Vec`s.
    slots: Vec<Slot>,
    outcomes: u32,
    /// Index of the oldest entry.
    head: u8,
    len: u8,
}

const _: () = assert!(
    TOMBSTONES_PER_SESSION * 2 <= 32,
    "outcomes are 2 bits per slot in a u32"
);

/// Storage for `used` slots: the next power of two, at most [`TOMBSTONES_PER_SESSION`].
fn ring_capacity(used: usize) -> usize {
    if used == 0 {
        0
    } else {
        used.next_power_of_two().min(TOMBSTONES_PER_SESSION)
    }
}

impl Ring {
    pub(crate) fn len(&self) -> usize {
        usize::from(self.len)
    }

    fn slot(&self, i: usize) -> Option<Tombstone> {
        let (attempt, execution) = self.slots.get(i).copied().flatten()?;
        let outcome = Retired::from_bits((self.outcomes >> (2 * i)) & 0b11)?;
        Some(Tombstone {
            attempt,
            execution,
            outcome,
        })
    }

    /// Whether the ring has a shape that pushes can produce, so that pushing onto it can
    /// never overflow its length: at most [`TOMBSTONES_PER_SESSION`] entries and `head`
    /// inside the array; until the ring first fills, `head` is 0 and exactly the slots
    /// `0..len` were written; once full, all of them were. Every written slot holds a
    /// tombstone whose outcome decodes, and the outcome bits of unwritten slots are 0.
    /// (A decoded snapshot may claim anything; `restore` asks this before the first push.)
    pub(crate) fn is_well_formed(&self) -> bool {
        let len = self.len();
        let written = self.slots.len();
        let shape = if len == TOMBSTONES_PER_SESSION {
            written == TOMBSTONES_PER_SESSION && usize::from(self.head) < TOMBSTONES_PER_SESSION
        } else {
            len < TOMBSTONES_PER_SESSION && self.head == 0 && written == len
        };
        shape
            && (0..TOMBSTONES_PER_SESSION).all(|i| {
                let bits = (self.outcomes >> (2 * i)) & 0b11;
                if i < written {
                    self.slots[i].is_some() && Retired::from_bits(bits).is_some()
                } else {
                    bits == 0
                }
            })
    }

    /// The ring with its length field overwritten, as a corrupt snapshot could hold it.
    #[cfg(test)]
    pub(crate) fn with_len_for_test(mut self, len: u8) -> Ring {
        self.len = len;
        self
    }

    /// Tombstones oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Tombstone> + '_ {
        (0..self.len())
            .filter_map(move |k| self.slot((usize::from(self.head) + k) % TOMBSTONES_PER_SESSION))
    }

    /// Calls `f` with the attempt of every tombstone [`Ring::iter`] yields, in the same
    /// order, stopping at the first `Err`. `check_invariants` walks every ring every few
    /// steps and reads only the attempts: this walks the window as (at most) two runs of
    /// slots and builds no tombstone.
    pub(crate) fn try_for_each_attempt<E>(
        &self,
        mut f: impl FnMut(AttemptId) -> Result<(), E>,
    ) -> Result<(), E> {
        let len = self.len();
        if len > TOMBSTONES_PER_SESSION {
            // Only a corrupt ring (never pushed nor restored so) wraps more than once.
            return self.iter().try_for_each(|t| f(t.attempt));
        }
        let head = usize::from(self.head) % TOMBSTONES_PER_SESSION;
        let end = head + len;
        let runs = [
            head..end.min(TOMBSTONES_PER_SESSION),
            0..end.saturating_sub(TOMBSTONES_PER_SESSION),
        ];
        for run in runs {
            for i in run {
                // As `slot`: a slot never written, or whose outcome bits do not decode
                // (0, the only two-bit value `Retired::from_bits` refuses), is skipped.
                if let Some(&Some((attempt, _))) = self.slots.get(i) {
                    if (self.outcomes >> (2 * i)) & 0b11 != 0 {
                        f(attempt)?;
                    }
                }
            }
        }
        Ok(())
    }

    pub(crate) fn find(&self, attempt: AttemptId) -> Option<Tombstone> {
        // Admission asks this for every callback of a retired attempt, so scan the slots
        // directly rather than walking the ring in order. A slot counts only inside the
        // ring's window (`head`, `len` entries), exactly the slots `iter` yields; within
        // the window attempts are unique (strictly increasing, see `check_invariants`),
        // and a slot whose outcome bits do not decode is skipped as `iter` skips it.
        let head = usize::from(self.head) % TOMBSTONES_PER_SESSION;
        self.slots.iter().enumerate().find_map(|(i, slot)| {
            let (a, _) = (*slot)?;
            let in_window =
                (i + TOMBSTONES_PER_SESSION - head) % TOMBSTONES_PER_SESSION < self.len();
            if a == attempt && in_window {
                self.slot(i)
            } else {
                None
            }
        })
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
        assert!(self.len() <= TOMBSTONES_PER_SESSION);
        let mut evicted = None;
        if self.len() == TOMBSTONES_PER_SESSION {
            let head = usize::from(self.head);
            evicted = self.slot(head);
            self.head = ((head + 1) % TOMBSTONES_PER_SESSION) as u8;
            self.len -= 1;
        }
        let i = (usize::from(self.head) + self.len()) % TOMBSTONES_PER_SESSION;
        if i >= self.slots.len() {
            let want = ring_capacity(i + 1);
            if self.slots.capacity() < want {
                self.slots.reserve_exact(want - self.slots.len());
            }
            self.slots.resize(i + 1, None);
        }
        self.slots[i] = Some((t.attempt, t.execution));
        self.outcomes = (self.outcomes & !(0b11 << (2 * i))) | ((t.outcome as u32) << (2 * i));
        self.len += 1;
        // The bound holds, the newest is the one pushed, and what fell out is older.
        assert!(self.len() <= TOMBSTONES_PER_SESSION);
        debug_assert!(self.newest() == Some(t));
        assert!(evicted.is_none_or(|e: Tombstone| e.attempt < t.attempt));
        debug_assert!(self
            .iter()
            .zip(self.iter().skip(1))
            .all(|(a, b)| a.attempt < b.attempt));
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
    fn ring_storage_grows_with_its_tombstones_and_stops_at_the_bound() {
        let mut ring = Ring::default();
        assert_eq!(
            ring.slots.capacity(),
            0,
            "a session that never retired pays nothing"
        );
        let mut caps = Vec::new();
        for n in 1..=40 {
            ring.push(Tombstone {
                attempt: id(n),
                execution: None,
                outcome: Retired::Cancelled,
            });
            caps.push(ring.slots.capacity());
        }
        assert_eq!(&caps[..5], &[1, 2, 4, 4, 8]);
        assert!(caps[15..].iter().all(|&c| c == TOMBSTONES_PER_SESSION));
    }

    #[test]
    fn ring_round_trips_through_its_encoding() {
        let mut ring = Ring::default();
        for n in 0..=40 {
            if n > 0 {
                ring.push(Tombstone {
                    attempt: id(n),
                    execution: ExecutionId::new(n % 3),
                    outcome: if n % 2 == 0 {
                        Retired::Finished
                    } else {
                        Retired::Cancelled
                    },
                });
            }
            let bytes = postcard::to_allocvec(&ring).unwrap();
            let back: Ring = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(back, ring, "after {n} pushes");
            assert!(back.is_well_formed(), "after {n} pushes");
        }
    }
    /// `try_for_each_attempt` yields exactly what `iter` yields, for every ring pushes
    /// produce and for corrupt ones (lengths past the array, heads anywhere, holes, outcome
    /// bits that do not decode), and stops at the first error.
    #[test]
    fn the_attempt_walk_matches_iter_on_every_ring_shape() {
        let walk = |ring: &Ring| {
            let mut seen = Vec::new();
            let ok: Result<(), ()> = ring.try_for_each_attempt(|a| {
                seen.push(a);
                Ok(())
            });
            assert_eq!(ok, Ok(()));
            seen
        };
        let via_iter = |ring: &Ring| ring.iter().map(|t| t.attempt).collect::<Vec<_>>();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut ring = Ring::default();
        for n in 1..=40 {
            assert_eq!(walk(&ring), via_iter(&ring), "after {} pushes", n - 1);
            ring.push(Tombstone {
                attempt: id(n),
                execution: None,
                outcome: Retired::Failed,
            });
        }
        for round in 0..2_000 {
            let used = (next() % 17) as usize;
            let mut slots: Vec<Slot> = (0..used)
                .map(|k| {
                    (next() % 5 != 0).then(|| (id(1 + next() % 50), ExecutionId::new(k as u64)))
                })
                .collect();
            if next() % 2 == 0 {
                slots.truncate(used / 2);
            }
            let corrupt = Ring {
                slots,
                outcomes: next() as u32,
                head: (next() % 40) as u8,
                len: (next() % 40) as u8,
            };
            assert_eq!(
                walk(&corrupt),
                via_iter(&corrupt),
                "round {round}: {corrupt:?}"
            );
            // An error stops the walk where it happened.
            let all = via_iter(&corrupt);
            if let Some(&stop) = all.get(all.len() / 2) {
                let mut seen = Vec::new();
                let r = corrupt.try_for_each_attempt(|a| {
                    seen.push(a);
                    if a == stop {
                        Err(a)
                    } else {
                        Ok(())
                    }
                });
                assert_eq!(r, Err(stop));
                let at = all.iter().position(|&a| a == stop).unwrap();
                assert_eq!(seen, all[..=at]);
            }
        }
    }

    #[test]
    fn evicted_ids_are_remembered_as_evicted_and_others_as_unknown() {
        let ring = Ring::default();
        assert_eq!(remember(&ring, Some(id(5)), id(3)), Remembered::Evicted);
        assert_eq!(remember(&ring, Some(id(5)), id(6)), Remembered::Unknown);
        assert_eq!(remember(&ring, None, id(1)), Remembered::Unknown);
    }
}
