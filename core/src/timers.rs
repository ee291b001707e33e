//! The core's timers: what each one waits for ([`Timer`]) and the set that orders them
//! (`(deadline, timer)` pairs in order, with exact removal).
//!
//! A core usually has a handful of pending timers (a resume's start deadline, a lease's
//! deadline), and a `BTreeSet` spends more on its node bookkeeping than on the handful of
//! comparisons. So the set is a sorted `Vec` while small, and moves into a `BTreeSet` once
//! it grows past [`SMALL`] (then back, once it drains to [`SMALL`] / 4). Both keep the
//! same total order, so which one holds the timers never changes what fires when.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::ids::{AttemptId, ExecutionId, LeaseId, SessionId, TurnId};
use crate::time::Timestamp;

/// One pending timer of the core; the set orders them by deadline, then by this key.
/// Each fires into the rule that armed it (`Core::handle_timeout` dispatches).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum Timer {
    /// Rule 1: the joiners of a live attempt are answered by then.
    Join(SessionId, AttemptId),
    /// Rule 1: a live attempt fails if its conversation is not ready by then.
    Start(SessionId, AttemptId),
    /// Rule 5: a teardown that takes longer is given up and the process killed.
    Stop(ExecutionId),
    /// Rule 4: a lease not performed by then is revoked.
    Lease(LeaseId),
    /// Rule 8: a turn's recovery step starts its replacement runtime.
    Recovery(SessionId, TurnId),
    /// Rule 7: a performed prompt the provider has not accepted yet is rolled back.
    Accept(SessionId, TurnId),
    /// Rule 8: an accepted turn whose runtime stayed silent this long loses its runtime.
    Idle(SessionId, TurnId),
}

/// Timers kept in the sorted vector; beyond this, in the tree.
const SMALL: usize = 32;

type Key = (Timestamp, Timer);

/// An ordered set of pending timers. At most one of the two stores is non-empty.
#[derive(Clone, Debug, Default)]
pub(crate) struct Timers {
    small: Vec<Key>,
    big: BTreeSet<Key>,
}

impl Timers {
    /// Adds `key`; false if it was already there.
    pub(crate) fn insert(&mut self, key: Key) -> bool {
        if !self.big.is_empty() {
            return self.big.insert(key);
        }
        match self.small.binary_search(&key) {
            Ok(_) => false,
            Err(at) if self.small.len() < SMALL => {
                self.small.insert(at, key);
                true
            }
            Err(_) => {
                self.big.extend(self.small.drain(..));
                self.big.insert(key)
            }
        }
    }

    /// Removes `key`; false if it was not there.
    pub(crate) fn remove(&mut self, key: &Key) -> bool {
        if self.big.is_empty() {
            return match self.small.binary_search(key) {
                Ok(at) => {
                    self.small.remove(at);
                    true
                }
                Err(_) => false,
            };
        }
        let removed = self.big.remove(key);
        if self.big.len() <= SMALL / 4 {
            // Sorted already, and the vector is empty while the tree holds the timers.
            self.small.extend(std::mem::take(&mut self.big));
        }
        removed
    }

    /// The earliest timer.
    pub(crate) fn first(&self) -> Option<&Key> {
        if self.big.is_empty() {
            self.small.first()
        } else {
            self.big.first()
        }
    }

    /// Whether `key` is pending.
    pub(crate) fn contains(&self, key: &Key) -> bool {
        if self.big.is_empty() {
            self.small.binary_search(key).is_ok()
        } else {
            self.big.contains(key)
        }
    }

    /// Every pending timer, in order (at most one of the two stores is non-empty).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Key> {
        self.small.iter().chain(self.big.iter())
    }

    /// Pending timers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.small.len() + self.big.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(n: u64) -> Timer {
        Timer::Lease(LeaseId::new(n).unwrap())
    }

    /// The set agrees with a `BTreeSet` through growth past the threshold and back, under
    /// a deterministic mix of inserts, duplicate inserts and removals.
    #[test]
    fn agrees_with_a_btreeset_across_the_threshold() {
        let mut ours = Timers::default();
        let mut model = BTreeSet::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for step in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Grow for a while, then shrink, then grow again.
            let phase = (step / 2_000) % 2;
            let key = (
                Timestamp::from_millis(x % 50),
                if x.is_multiple_of(3) {
                    Timer::Stop(ExecutionId::new(1 + (x >> 8) % 40).unwrap())
                } else {
                    lease(1 + (x >> 8) % 60)
                },
            );
            if (x >> 20) % 4 < 2 + phase {
                assert_eq!(ours.insert(key), model.insert(key), "step {step}");
            } else {
                assert_eq!(ours.remove(&key), model.remove(&key), "step {step}");
            }
            assert_eq!(ours.first(), model.first(), "step {step}");
            assert_eq!(ours.len(), model.len(), "step {step}");
            assert!(ours.small.is_empty() || ours.big.is_empty());
            let probe = (Timestamp::from_millis(x % 50), lease(1 + (x >> 30) % 60));
            assert_eq!(ours.contains(&probe), model.contains(&probe));
        }
        assert!(model.len() > SMALL, "the test must cross the threshold");
    }
}
