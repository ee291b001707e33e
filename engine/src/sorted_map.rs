//! [`SortedMap`]: the engine's small per-execution and per-session tables as one sorted
//! vector instead of a B-tree.
//!
//! The engine holds a handful of runtimes and delivery outlets at a time (one or two per
//! live session) and walks all of them on every [`Engine::poll_timeout`] and
//! `Engine::pump_outlets` (every `Engine::poll_output`); a B-tree's node-by-node
//! walk cost more there than the work it walked to. Executions are numbered upwards, so
//! an insertion is nearly always a push at the end. Iteration is in ascending key order,
//! exactly as the `BTreeMap`s it replaces iterated, so nothing the engine decides from an
//! iteration changes.
//!
//! [`Engine::poll_timeout`]: crate::engine::Engine::poll_timeout

/// An ordered map kept as a vector of entries sorted by key, without duplicates.
/// Lookups are binary searches; insertion and removal shift the entries after the key,
/// which is cheap for the few entries it is meant for.
#[derive(Debug, Clone)]
pub(crate) struct SortedMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for SortedMap<K, V> {
    fn default() -> Self {
        SortedMap {
            entries: Vec::new(),
        }
    }
}

impl<K: Ord + Copy, V> SortedMap<K, V> {
    /// Where `key` is (`Ok`) or would go (`Err`). A key above the last one, the common
    /// case for new executions, is decided by one comparison.
    fn find(&self, key: &K) -> Result<usize, usize> {
        match self.entries.last() {
            None => Err(0),
            Some((last, _)) if last < key => Err(self.entries.len()),
            Some(_) => self.entries.binary_search_by(|(k, _)| k.cmp(key)),
        }
    }

    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The value at `key`.
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        let i = self.find(key).ok()?;
        Some(&self.entries[i].1)
    }

    /// The value at `key`, to change.
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let i = self.find(key).ok()?;
        Some(&mut self.entries[i].1)
    }

    /// Puts `value` at `key`; returns the value it replaced.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            Err(i) => {
                self.entries.insert(i, (key, value));
                None
            }
        }
    }

    /// The value at `key`, inserted from `make` first if there is none.
    pub(crate) fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let i = match self.find(&key) {
            Ok(i) => i,
            Err(i) => {
                self.entries.insert(i, (key, make()));
                i
            }
        };
        &mut self.entries[i].1
    }

    /// Takes the value at `key` out.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.find(key).ok()?;
        Some(self.entries.remove(i).1)
    }

    /// The entries in ascending key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// The entries in ascending key order, values to change.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.entries.iter_mut().map(|(k, v)| (&*k, v))
    }

    /// The keys in ascending order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.iter().map(|(k, _)| k)
    }

    /// The values in ascending key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    /// The values in ascending key order, to change.
    #[cfg(test)]
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries.iter_mut().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::SortedMap;

    #[derive(Debug, Clone, Copy)]
    enum Op {
        Insert(u8, u32),
        Entry(u8, u32),
        Remove(u8),
        Bump(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (any::<u8>(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            (any::<u8>(), any::<u32>()).prop_map(|(k, v)| Op::Entry(k, v)),
            any::<u8>().prop_map(Op::Remove),
            any::<u8>().prop_map(Op::Bump),
        ]
    }

    fn same(map: &SortedMap<u8, u32>, reference: &BTreeMap<u8, u32>) {
        assert_eq!(map.len(), reference.len());
        let got: Vec<(u8, u32)> = map.iter().map(|(k, v)| (*k, *v)).collect();
        let want: Vec<(u8, u32)> = reference.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(got, want);
        assert!(map.keys().copied().eq(reference.keys().copied()));
        assert!(map.values().copied().eq(reference.values().copied()));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Every operation answers as the `BTreeMap` it replaces, and iteration is in the
        /// same order after every step.
        #[test]
        fn answers_as_a_btree_map(ops in proptest::collection::vec(op(), 0..200)) {
            let mut map = SortedMap::default();
            let mut reference = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(map.insert(k, v), reference.insert(k, v)),
                    Op::Entry(k, v) => {
                        let got = *map.get_or_insert_with(k, || v);
                        prop_assert_eq!(got, *reference.entry(k).or_insert(v));
                    }
                    Op::Remove(k) => prop_assert_eq!(map.remove(&k), reference.remove(&k)),
                    Op::Bump(k) => {
                        if let Some(v) = map.get_mut(&k) {
                            *v = v.wrapping_add(1);
                        }
                        if let Some(v) = reference.get_mut(&k) {
                            *v = v.wrapping_add(1);
                        }
                        for v in map.values_mut() {
                            *v ^= 1;
                        }
                        for (_, v) in map.iter_mut() {
                            *v ^= 2;
                        }
                        for v in reference.values_mut() {
                            *v ^= 3;
                        }
                    }
                }
                prop_assert_eq!(map.get(&op_key(&op)), reference.get(&op_key(&op)));
                same(&map, &reference);
            }
        }
    }

    fn op_key(op: &Op) -> u8 {
        match op {
            Op::Insert(k, _) | Op::Entry(k, _) | Op::Bump(k) => *k,
            Op::Remove(k) => *k,
        }
    }
}
