//! Deterministic mixing (splitmix64): decisions keyed by what they concern, the same in
//! every process and on every platform. A decision keyed by its own subject (a session,
//! a message, a seed) does not move when something else is added or removed: a fault
//! from a plan, a seed from a sweep.

/// A cheap deterministic mix (splitmix64) for workload and per-message decisions: keyed by
/// what they concern, so removing a fault does not shift them.
pub fn mix(seed: u64, a: u64, b: u64, c: u64) -> u64 {
    let mut z = seed
        ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ b.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ c.wrapping_mul(0x1656_67b1_9e37_79f9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A value in `lo..=hi` from a mixed key.
pub fn pick(key: u64, lo: u64, hi: u64) -> u64 {
    if hi <= lo {
        lo
    } else {
        lo + key % (hi - lo + 1)
    }
}

/// A probability test from a mixed key.
pub fn chance(key: u64, p: f64) -> bool {
    ((key >> 11) as f64 / (1u64 << 53) as f64) < p
}

/// A well-mixed 64-bit hash (splitmix64's finaliser).
pub const fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
