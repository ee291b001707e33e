//! Which seeds a sweep runs: a range of them (`--seed-range A..B`, `--seeds N`), and a
//! shard of that range (`--shard I/N`). Shards are a pure function of the range, so the
//! shards of a sweep add up to the whole.

use std::fmt;
use std::str::FromStr;

/// Shards a sweep may be split into: a CI matrix has tens of jobs, and `merge` reads one
/// summary per shard.
pub const MAX_SHARDS: u64 = 4_096;

/// A half-open range of seeds, `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SeedRange {
    /// The first seed.
    pub start: u64,
    /// One past the last seed.
    pub end: u64,
}

impl SeedRange {
    /// Seeds `0..count`.
    pub const fn first(count: u64) -> Self {
        SeedRange {
            start: 0,
            end: count,
        }
    }

    /// How many seeds.
    pub const fn len(self) -> u64 {
        self.end - self.start
    }

    /// Whether the range is empty (never, once parsed).
    pub const fn is_empty(self) -> bool {
        self.end == self.start
    }
}

impl fmt::Display for SeedRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

impl FromStr for SeedRange {
    type Err = String;

    /// `A..B` (B excluded) or `A..=B` (B included); A < B.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("bad seed range {s:?}: expected A..B (B excluded) or A..=B");
        let (a, b, inclusive) = if let Some((a, b)) = s.split_once("..=") {
            (a, b, true)
        } else if let Some((a, b)) = s.split_once("..") {
            (a, b, false)
        } else {
            return Err(bad());
        };
        let start: u64 = a.trim().parse().map_err(|_| bad())?;
        let last: u64 = b.trim().parse().map_err(|_| bad())?;
        let end = if inclusive {
            last.checked_add(1).ok_or_else(bad)?
        } else {
            last
        };
        if end <= start {
            return Err(format!(
                "bad seed range {s:?}: it holds no seed (the end must be past the start)"
            ));
        }
        Ok(SeedRange { start, end })
    }
}

/// Shard `index` of `count`: the seeds at positions `p` with `p % count == index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    /// This shard, from 0.
    pub index: u64,
    /// How many shards.
    pub count: u64,
}

impl Shard {
    /// Whether the seed at `position` in its range belongs to this shard.
    pub const fn holds(self, position: u64) -> bool {
        position % self.count == self.index
    }
}

/// How many seeds of `range` a sweep runs with `shard` (all of them without one).
pub const fn seeds_in(range: SeedRange, shard: Option<Shard>) -> u64 {
    let len = range.len();
    match shard {
        None => len,
        Some(s) if s.index >= len => 0,
        Some(s) => (len - 1 - s.index) / s.count + 1,
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("bad shard {s:?}: expected I/N with 0 <= I < N <= {MAX_SHARDS}");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u64 = i.trim().parse().map_err(|_| bad())?;
        let count: u64 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count || count > MAX_SHARDS {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_ranges_parse() {
        assert_eq!("3..7".parse(), Ok(SeedRange { start: 3, end: 7 }));
        assert_eq!("3..=7".parse(), Ok(SeedRange { start: 3, end: 8 }));
        assert!("7..3".parse::<SeedRange>().is_err());
        assert!("5..5".parse::<SeedRange>().is_err());
        assert!("a..b".parse::<SeedRange>().is_err());
        assert!("12".parse::<SeedRange>().is_err());
    }

    #[test]
    fn shards_parse_and_partition() {
        assert_eq!("1/3".parse(), Ok(Shard { index: 1, count: 3 }));
        for bad in ["3/3", "0/0", "x/2", "1", "-1/2", "0/4097"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        let shards: Vec<Shard> = (0..3).map(|i| Shard { index: i, count: 3 }).collect();
        for p in 0..30 {
            assert_eq!(shards.iter().filter(|s| s.holds(p)).count(), 1);
        }
        for len in 1..12u64 {
            let range = SeedRange {
                start: 5,
                end: 5 + len,
            };
            for s in &shards {
                let held = (0..len).filter(|&p| s.holds(p)).count() as u64;
                assert_eq!(seeds_in(range, Some(*s)), held, "{len} {s}");
            }
            assert_eq!(seeds_in(range, None), len);
        }
    }
}
