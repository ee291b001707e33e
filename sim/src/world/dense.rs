//! [`DenseMap`]: the world's tables keyed by small ids (execution ids, session numbers), as
//! vectors indexed by id instead of B-trees. Within a seed the engine numbers executions
//! 1, 2, 3, … and the scenario numbers sessions 1..=n, so a lookup is an index; iteration
//! is in ascending key order, as the `BTreeMap`s these replace iterated. (The core's
//! `palisade_core::idmap::IdMap` is another thing: a hash map with a fixed hasher.)

use std::collections::BTreeMap;

use palisade_core::ExecutionId;

/// Ids at or above this go to an ordered side map (after every dense one): the ids are
/// the engine's to choose, and a far one must not make the world allocate for it.
const DENSE_LIMIT: u64 = 1 << 16;

/// A key of a [`DenseMap`]: a copyable id with a position.
pub(crate) trait DenseKey: Copy + Ord {
    /// The id's position (its number).
    fn index(self) -> u64;
}

impl DenseKey for ExecutionId {
    fn index(self) -> u64 {
        self.get()
    }
}

impl DenseKey for u32 {
    fn index(self) -> u64 {
        u64::from(self)
    }
}

/// A map from ids to values, dense below [`DENSE_LIMIT`].
pub(crate) struct DenseMap<K, V> {
    slots: Vec<Option<(K, V)>>,
    far: BTreeMap<K, V>,
}

impl<K: DenseKey, V> Default for DenseMap<K, V> {
    fn default() -> Self {
        DenseMap {
            slots: Vec::new(),
            far: BTreeMap::new(),
        }
    }
}

impl<K: DenseKey, V> DenseMap<K, V> {
    fn slot(key: K) -> Option<usize> {
        let i = key.index();
        (i < DENSE_LIMIT).then_some(i as usize)
    }

    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        match Self::slot(*key) {
            Some(i) => self.slots.get(i)?.as_ref().map(|(_, v)| v),
            None => self.far.get(key),
        }
    }

    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        match Self::slot(*key) {
            Some(i) => self.slots.get_mut(i)?.as_mut().map(|(_, v)| v),
            None => self.far.get_mut(key),
        }
    }

    /// Sets `key`'s value (replacing any).
    pub(crate) fn insert(&mut self, key: K, value: V) {
        match Self::slot(key) {
            Some(i) => {
                if self.slots.len() <= i {
                    self.slots.resize_with(i + 1, || None);
                }
                self.slots[i] = Some((key, value));
            }
            None => {
                self.far.insert(key, value);
            }
        }
    }

    /// `key`'s value, a default one inserted first if it has none.
    pub(crate) fn or_default(&mut self, key: K) -> &mut V
    where
        V: Default,
    {
        match Self::slot(key) {
            Some(i) => {
                if self.slots.len() <= i {
                    self.slots.resize_with(i + 1, || None);
                }
                &mut self.slots[i].get_or_insert_with(|| (key, V::default())).1
            }
            None => self.far.entry(key).or_default(),
        }
    }

    /// Every entry in ascending key order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (K, &V)> {
        self.slots
            .iter()
            .filter_map(|s| s.as_ref().map(|(k, v)| (*k, v)))
            .chain(self.far.iter().map(|(k, v)| (*k, v)))
    }

    /// Every value in ascending key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// Every key in ascending order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.iter().map(|(k, _)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(n: u64) -> ExecutionId {
        ExecutionId::new(n).expect("a nonzero id")
    }

    /// The same operations on a `DenseMap` and a `BTreeMap` give the same lookups and the
    /// same iteration order, near ids and far ones alike.
    #[test]
    fn behaves_as_an_ordered_map() {
        let mut dense: DenseMap<ExecutionId, u64> = DenseMap::default();
        let mut tree: BTreeMap<ExecutionId, u64> = BTreeMap::new();
        let ids = [5, 1, DENSE_LIMIT + 3, 2, 5, DENSE_LIMIT, 9, u64::MAX, 1];
        for (n, id) in ids.into_iter().enumerate() {
            dense.insert(exec(id), n as u64);
            tree.insert(exec(id), n as u64);
            *dense.or_default(exec(id - id % 2 + 1)) += 10;
            *tree.entry(exec(id - id % 2 + 1)).or_default() += 10;
        }
        if let Some(v) = dense.get_mut(&exec(2)) {
            *v += 100;
        }
        if let Some(v) = tree.get_mut(&exec(2)) {
            *v += 100;
        }
        let got: Vec<(ExecutionId, u64)> = dense.iter().map(|(k, v)| (k, *v)).collect();
        let want: Vec<(ExecutionId, u64)> = tree.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(got, want);
        let back: Vec<ExecutionId> = dense.iter().rev().map(|(k, _)| k).collect();
        let tree_back: Vec<ExecutionId> = tree.keys().rev().copied().collect();
        assert_eq!(back, tree_back);
        assert_eq!(
            dense.keys().collect::<Vec<_>>(),
            tree.keys().copied().collect::<Vec<_>>()
        );
        for id in [1, 2, 3, 4, 6, DENSE_LIMIT, DENSE_LIMIT + 4, u64::MAX] {
            assert_eq!(dense.get(&exec(id)), tree.get(&exec(id)), "id {id}");
        }
        assert_eq!(dense.values().count(), tree.len());
    }
}
