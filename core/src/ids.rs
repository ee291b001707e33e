//! Newtype identifiers. Zero is never a valid ID: counters start at one.

use serde::{Deserialize, Serialize};
use std::num::NonZeroU64;

macro_rules! nonzero_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(NonZeroU64);

        impl $name {
            /// Wraps a raw value; `None` for zero, which is never a valid ID.
            pub const fn new(raw: u64) -> Option<Self> {
                match NonZeroU64::new(raw) {
                    Some(v) => Some($name(v)),
                    None => None,
                }
            }

            /// The raw value, for the wire and for traces.
            pub const fn get(self) -> u64 {
                self.0.get()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

nonzero_id!(
    /// A conversation the user sees. Chosen by the embedder.
    SessionId
);
nonzero_id!(
    /// One runtime process (agent controller + ACP agent). Chosen by the embedder; a
    /// replacement may reuse an execution ID.
    ExecutionId
);
nonzero_id!(
    /// One prompt turn. Chosen by the embedder, unique per session.
    TurnId
);
nonzero_id!(
    /// One startup of an execution. Allocated by the core from a core-wide counter, so a
    /// generation number is never reused, not even by a re-created execution record.
    Generation
);
nonzero_id!(
    /// An effect's lease: the right to perform that effect while the callback that caused
    /// it is still current.
    LeaseId
);
nonzero_id!(
    /// The identity of one error occurrence, as stamped by the runtime (or by the core for
    /// deadlines it enforces itself).
    ErrorStamp
);
nonzero_id!(
    /// The provider-side conversation (the ACP `sessionId`), as a handle the embedder maps.
    ConversationToken
);

/// The core's incarnation. Bumped on every restore, so IDs minted before a restart can
/// never be mistaken for new ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Epoch(u32);

/// Epochs fit in the top [`EPOCH_BITS`] bits of an [`AttemptId`].
pub const EPOCH_BITS: u32 = 20;
/// Attempt sequence numbers fit in the low bits; 2^44 attempts per epoch is more than a
/// core can mint in centuries at a million per second.
pub const ATTEMPT_SEQ_BITS: u32 = 64 - EPOCH_BITS;
/// The largest epoch: about a million restarts.
pub const MAX_EPOCH: u32 = (1 << EPOCH_BITS) - 1;
/// The largest attempt sequence number within an epoch.
pub const MAX_ATTEMPT_SEQ: u64 = (1 << ATTEMPT_SEQ_BITS) - 1;

impl Epoch {
    /// The first epoch.
    pub const FIRST: Epoch = Epoch(1);

    /// `None` for zero or for values above [`MAX_EPOCH`].
    pub const fn new(raw: u32) -> Option<Self> {
        if raw == 0 || raw > MAX_EPOCH {
            None
        } else {
            Some(Epoch(raw))
        }
    }

    /// The raw value.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The next epoch, `None` at [`MAX_EPOCH`].
    pub const fn next(self) -> Option<Epoch> {
        // A decoded epoch may hold any u32 (a corrupt snapshot): never overflow on it.
        match self.0.checked_add(1) {
            Some(raw) => Epoch::new(raw),
            None => None,
        }
    }
}

/// One try to resume or recover a session's runtime. Unique forever: the epoch sits in the
/// top bits, a per-epoch sequence in the rest, so IDs order by (epoch, sequence) and an ID
/// minted before a restart is always older than any minted after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AttemptId(NonZeroU64);

impl AttemptId {
    /// Builds an ID; `None` if `seq` is zero or too large.
    pub const fn new(epoch: Epoch, seq: u64) -> Option<Self> {
        if seq == 0 || seq > MAX_ATTEMPT_SEQ {
            return None;
        }
        match NonZeroU64::new(((epoch.0 as u64) << ATTEMPT_SEQ_BITS) | seq) {
            Some(v) => Some(AttemptId(v)),
            None => None,
        }
    }

    /// Decodes the wire form (as carried by a callback). `None` for values no core mints.
    pub const fn from_raw(raw: u64) -> Option<Self> {
        let epoch = (raw >> ATTEMPT_SEQ_BITS) as u32;
        let seq = raw & MAX_ATTEMPT_SEQ;
        match Epoch::new(epoch) {
            Some(e) => AttemptId::new(e, seq),
            None => None,
        }
    }

    /// The wire form.
    pub const fn raw(self) -> u64 {
        self.0.get()
    }

    /// The epoch that minted this ID.
    pub const fn epoch(self) -> Epoch {
        Epoch((self.0.get() >> ATTEMPT_SEQ_BITS) as u32)
    }

    /// The sequence number within its epoch.
    pub const fn seq(self) -> u64 {
        self.0.get() & MAX_ATTEMPT_SEQ
    }
}

impl std::fmt::Display for AttemptId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.epoch().0, self.seq())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_never_a_valid_id() {
        assert!(SessionId::new(0).is_none());
        assert!(Epoch::new(0).is_none());
        assert!(AttemptId::new(Epoch::FIRST, 0).is_none());
        assert!(AttemptId::from_raw(0).is_none());
    }

    #[test]
    fn attempt_ids_order_by_epoch_then_sequence() {
        let e1 = Epoch::FIRST;
        let e2 = e1.next().unwrap();
        let late_old = AttemptId::new(e1, MAX_ATTEMPT_SEQ).unwrap();
        let early_new = AttemptId::new(e2, 1).unwrap();
        assert!(late_old < early_new);
        assert_eq!(AttemptId::from_raw(early_new.raw()), Some(early_new));
        assert_eq!(early_new.epoch(), e2);
        assert_eq!(early_new.seq(), 1);
    }

    #[test]
    fn counters_at_their_bounds_are_rejected() {
        assert!(Epoch::new(MAX_EPOCH).unwrap().next().is_none());
        assert!(AttemptId::new(Epoch::FIRST, MAX_ATTEMPT_SEQ + 1).is_none());
        assert!(AttemptId::from_raw(u64::MAX).is_some());
        assert!(
            AttemptId::from_raw(MAX_ATTEMPT_SEQ).is_none(),
            "epoch 0 is invalid"
        );
    }
}
