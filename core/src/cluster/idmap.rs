//! [`IdMap`]: the core's records by id, found by hash and walked in id order.

use std::collections::BTreeMap;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::types::Id;

/// A record that carries its own id: the hash table holds only slot numbers, and finds a
/// record's id in the record.
pub trait Keyed {
    /// The record's id.
    fn key(&self) -> &Id;
}

/// Records by id: found by hash, walked in id order.
///
/// Every agent report looks its worker and its jobs up by id. In a B-tree of 100,000 jobs that
/// search loaded about five nodes and compared the id with a dozen keys, each comparison
/// reading another key's text: each load a likely cache miss, and together the largest part of
/// the core's time at 10,000 workers (the profile in `docs/performance.md`, "Simulator
/// speed"). A hash lookup reads one table entry and then the record it names (its slot, its box
/// and its id's text), which the caller reads next anyway. Decisions walk the records in id order
/// (sums of floats and ties depend on the order), which the ordered index keeps, and a walk
/// reads the records by slot number without hashing. Boxed, as the B-tree's jobs were: slots
/// and tables move as they grow, and a ~700-byte job should not move with them.
///
/// Memory: the hash table holds 4-byte slot numbers and compares ids in the records (which a
/// lookup reads next anyway), so the map costs a live job about ten bytes more than the
/// B-tree of boxed jobs it replaced (`cargo run --release -p converge-core --example
/// job_heap`), where a hash map of ids beside an ordered index took fifty. Slots and the
/// table do not shrink when records leave: they keep room for the most records held at once,
/// and new records reuse it (a manager's live jobs come and go; finished ones are archived).
#[derive(Clone)]
pub struct IdMap<V> {
    /// The records by slot; `None` is a free slot (in `free`).
    slots: Vec<Option<Box<V>>>,
    free: Vec<u32>,
    /// Slots, found by the hash of their record's id.
    by_id: HashTable<u32>,
    /// Foldhash rather than SipHash, which was a tenth of a lookup's time. Seeded at random per
    /// process (its `std` feature); unlike SipHash it promises nothing against ids chosen to
    /// collide, and the ids it holds are not chosen by strangers: jobs' are UUIDs the manager
    /// draws, workers' are names the cluster's CA certified (issue 15).
    hasher: foldhash::fast::RandomState,
    /// Slot by id in id order, for walks.
    order: BTreeMap<Id, u32>,
}

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        IdMap {
            slots: Vec::new(),
            free: Vec::new(),
            by_id: HashTable::new(),
            hasher: Default::default(),
            order: BTreeMap::new(),
        }
    }
}

impl<V: Keyed> IdMap<V> {
    /// Empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// The slot of `id`'s record, by `id`'s hash.
    fn find(&self, hash: u64, id: &str) -> Option<u32> {
        let slots = &self.slots;
        self.by_id
            .find(hash, |&k| held(slots, k).key() == id)
            .copied()
    }

    fn hash(&self, id: &str) -> u64 {
        self.hasher.hash_one(id)
    }

    /// The record of `id`.
    pub fn get(&self, id: &str) -> Option<&V> {
        self.find(self.hash(id), id).map(|k| held(&self.slots, k))
    }

    /// The record of `id` with the record's own id (shared, not copied).
    pub fn get_key_value(&self, id: &str) -> Option<(&Id, &V)> {
        self.get(id).map(|v| (v.key(), v))
    }

    /// The record of `id`, to change.
    pub fn get_mut(&mut self, id: &str) -> Option<&mut V> {
        let k = self.find(self.hash(id), id)?;
        self.slots[k as usize].as_deref_mut()
    }

    /// Whether there is a record of `id`.
    pub fn contains_key(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    /// Adds `record` under its own id, returning the record of that id it replaces.
    pub fn insert(&mut self, record: impl Into<Box<V>>) -> Option<Box<V>> {
        let record = record.into();
        let hash = self.hash(record.key());
        match self.find(hash, record.key()) {
            Some(k) => self.slots[k as usize].replace(record),
            None => {
                self.add(hash, record);
                None
            }
        }
    }

    /// The record of `id`, added by `new` if there is none.
    pub fn get_or_insert_with(&mut self, id: &str, new: impl FnOnce() -> V) -> &mut V {
        let hash = self.hash(id);
        let k = match self.find(hash, id) {
            Some(k) => k,
            None => self.add(hash, Box::new(new())),
        };
        self.slots[k as usize].as_deref_mut().expect(HELD)
    }

    /// Puts `record`, whose id the map does not hold and hashes to `hash`, in a slot; returns
    /// the slot.
    fn add(&mut self, hash: u64, record: Box<V>) -> u32 {
        let id = record.key().clone();
        let k = match self.free.pop() {
            Some(k) => {
                self.slots[k as usize] = Some(record);
                k
            }
            None => {
                self.slots.push(Some(record));
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 records")
            }
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.by_id
            .insert_unique(hash, k, |&k| hasher.hash_one(held(slots, k).key().as_str()));
        self.order.insert(id, k);
        k
    }

    /// Takes the record of `id` out.
    pub fn remove(&mut self, id: &str) -> Option<Box<V>> {
        let slots = &self.slots;
        let found = self
            .by_id
            .find_entry(self.hasher.hash_one(id), |&k| held(slots, k).key() == id);
        let (k, _) = found.ok()?.remove();
        self.order.remove(id);
        self.free.push(k);
        self.slots[k as usize].take()
    }
}

impl<V> IdMap<V> {
    /// How many records.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Every record with its id, in id order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&Id, &V)> + ExactSizeIterator + Clone {
        let slots = &self.slots;
        self.order.iter().map(move |(id, &k)| (id, held(slots, k)))
    }

    /// Every record, in id order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator + Clone {
        self.iter().map(|(_, v)| v)
    }

    /// Every id, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &Id> + ExactSizeIterator + Clone {
        self.order.keys()
    }
}

/// Why an indexed slot is never empty: `remove` frees a slot and unindexes it together.
const HELD: &str = "an indexed slot holds its record";

/// The record in indexed slot `k`.
fn held<V>(slots: &[Option<Box<V>>], k: u32) -> &V {
    slots[k as usize].as_deref().expect(HELD)
}

impl<Q: AsRef<str> + ?Sized, V: Keyed> std::ops::Index<&Q> for IdMap<V> {
    type Output = V;

    /// The record of `id`; panics if there is none (as a map's index does).
    fn index(&self, id: &Q) -> &V {
        let id = id.as_ref();
        self.get(id).unwrap_or_else(|| panic!("no record of {id}"))
    }
}

impl<V: std::fmt::Debug> std::fmt::Debug for IdMap<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct R(Id, u32);

    impl Keyed for R {
        fn key(&self) -> &Id {
            &self.0
        }
    }

    fn r(id: &str, v: u32) -> R {
        R(Id::from(id), v)
    }

    /// Records come back by id, in id order whatever the order of insertion, and a freed slot
    /// is reused without disturbing either.
    #[test]
    fn found_by_id_and_walked_in_id_order_across_removals() {
        let mut m: IdMap<R> = IdMap::new();
        for (id, v) in [("c", 3), ("a", 1), ("d", 4), ("b", 2)] {
            assert!(m.insert(r(id, v)).is_none());
        }
        assert_eq!(m.remove("d").map(|b| b.1), Some(4));
        assert!(m.remove("d").is_none(), "removed once");
        m.insert(r("aa", 11));
        assert_eq!(m.insert(r("b", 20)).map(|b| b.1), Some(2), "replaced");
        m.get_mut("c").unwrap().1 += 30;
        let walked: Vec<(&str, u32)> = m.iter().map(|(k, v)| (k.as_str(), v.1)).collect();
        assert_eq!(walked, [("a", 1), ("aa", 11), ("b", 20), ("c", 33)]);
        assert_eq!(m.iter().next_back().map(|(k, _)| k.as_str()), Some("c"));
        assert_eq!((m.len(), m["aa"].1, m.get("d")), (4, 11, None));
        assert_eq!(m.slots.len(), 4, "the slot \"d\" freed was taken by \"aa\"");
        assert_eq!(m.get_or_insert_with("e", || r("e", 5)).1, 5);
        assert_eq!(m.get_or_insert_with("e", || r("e", 6)).1, 5, "kept");
        assert_eq!(m.keys().len(), 5);
    }

    /// Enough records to make the table grow several times, some removed on the way: every one
    /// is still found (growth rehashes slot numbers through the records' ids).
    #[test]
    fn every_record_is_found_after_the_table_grows() {
        let mut m: IdMap<R> = IdMap::new();
        for i in 0..5000 {
            m.insert(r(&format!("job-{i}"), i));
        }
        for i in (0..5000).step_by(3) {
            assert!(m.remove(&format!("job-{i}")).is_some());
        }
        for i in 0..5000 {
            let found = m.get(&format!("job-{i}")).map(|x| x.1);
            assert_eq!(found, (i % 3 != 0).then_some(i), "job-{i}");
        }
    }
}
