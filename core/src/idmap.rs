//! Maps keyed by our IDs, with a fixed (unseeded) hasher.
//!
//! Lookups by ID dominate the hot path, so the core uses hash maps there; std's default
//! hasher is seeded per thread, which would make any iteration order differ between runs.
//! This hasher is fixed, and nothing the core decides iterates a map anyway: snapshots
//! sort, timers live in an ordered set (`timers.rs`). IDs are small integers chosen by us or the embedder;
//! the multiply-rotate mix spreads them over the table.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A fixed multiplicative hasher for integer keys.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// A hash map keyed by one of our IDs.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
