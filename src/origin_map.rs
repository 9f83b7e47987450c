//! The per-[`Origin`] map of the three registries (breakers, concurrency limits, rate
//! limits): bounded, sharded, forgetting the least recently used entry nothing depends on.
//!
//! # Layout
//!
//! Up to [`MAX_SHARDS`] shards (one per 256 origins of the bound, so a shard rarely runs
//! out of entries it can forget while another has plenty), each a `RwLock` over a map
//! from [`Origin`] to `Arc<E>`. An origin picks its shard by the high half of its keyed
//! hash (computed once with the origin; the map inside places entries by the low bits of
//! the same hash). A known origin costs one read lock of its shard; a new one takes the
//! shard's write lock once. No lock covers the whole map.
//!
//! # Bounds and eviction
//!
//! At most `max` entries in the map as a whole (an exact bound, kept by one atomic count
//! in which a new origin reserves its place; any shard may hold any share of it). When a
//! new origin finds the map full, its shard forgets its least recently used entry that
//! nothing depends on: no one else holds its `Arc` (the shard's write lock keeps new
//! clones out, so a strong count of 1 means only the map does) and the entry itself says
//! it is idle ([`Evict::idle_since`]). When its shard has none, another shard is tried
//! (`try_write` only: waiting for a second shard while holding one could deadlock). When
//! no entry anywhere can be forgotten, [`insert`](BoundedOriginMap::insert) stores
//! nothing, returns `None` and counts it in [`overflowed`](BoundedOriginMap::overflowed);
//! the registry decides what serves that origin.
//!
//! Victims are chosen an eighth of a shard per scan and kept, oldest last, with the last
//! use seen then: a victim used since it was chosen is passed over. So a steady stream of
//! new origins costs amortised O(1) each, and the order of eviction is the least recently
//! used one (exactly, for shards of up to 15 entries, where a scan chooses one victim).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, RwLock};

use crate::origin::{Origin, OriginMap};
use crate::sync::{read, write};

/// The most shards a map has.
pub(crate) const MAX_SHARDS: usize = 16;

/// What the map asks an entry before forgetting it.
pub(crate) trait Evict {
    /// When the entry was last used, ordered (earlier is smaller).
    type Stamp: Ord + Copy;
    /// What the decision needs besides the entry (the time, say).
    type Now: Copy;

    /// The entry's last use when it may be forgotten at `now`, else `None`. Called under
    /// the shard's write lock with the map holding the only `Arc` of the entry: it must
    /// not block (`try_lock`, not `lock`).
    fn idle_since(&self, now: Self::Now) -> Option<Self::Stamp>;
}

/// A bounded, sharded map from [`Origin`] to `Arc<E>`; see the [module](self).
pub(crate) struct BoundedOriginMap<E: Evict> {
    shards: Box<[RwLock<Shard<E>>]>,
    max: usize,
    len: AtomicUsize,
    overflowed: AtomicU64,
}

struct Shard<E: Evict> {
    map: OriginMap<Arc<E>>,
    // The next entries to forget, oldest last, with their last use when chosen.
    victims: Vec<(E::Stamp, Origin)>,
}

impl<E: Evict> Default for Shard<E> {
    fn default() -> Self {
        Shard {
            map: OriginMap::default(),
            victims: Vec::new(),
        }
    }
}

impl<E: Evict> BoundedOriginMap<E> {
    /// An empty map of at most `max` entries.
    pub(crate) fn new(max: usize) -> Self {
        let shards = (max / 256).clamp(1, MAX_SHARDS);
        BoundedOriginMap {
            shards: (0..shards).map(|_| RwLock::default()).collect(),
            max,
            len: AtomicUsize::new(0),
            overflowed: AtomicU64::new(0),
        }
    }

    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// How many times [`insert`](Self::insert) found the map full of entries that could
    /// not be forgotten.
    pub(crate) fn overflowed(&self) -> u64 {
        self.overflowed.load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn shard_index(&self, origin: &Origin) -> usize {
        // The high half: the map inside places entries by the low bits of the same hash.
        ((origin.keyed_hash() >> 32) % self.shards.len() as u64) as usize
    }

    /// Runs `f` on `origin`'s entry under its shard's read lock (no `Arc` cloned), or,
    /// when the origin has none, on what `missing` returns (outside the lock). Inlined in
    /// its callers: it is the registries' success path (one lookup per request).
    #[inline(always)]
    pub(crate) fn with<R>(
        &self,
        origin: &Origin,
        f: impl FnOnce(&Arc<E>) -> R,
        missing: impl FnOnce() -> Arc<E>,
    ) -> R {
        if let Some(entry) = read(&self.shards[self.shard_index(origin)]).map.get(origin) {
            return f(entry);
        }
        f(&missing())
    }

    /// `origin`'s entry, if it has one.
    pub(crate) fn get(&self, origin: &Origin) -> Option<Arc<E>> {
        read(&self.shards[self.shard_index(origin)])
            .map
            .get(origin)
            .cloned()
    }

    /// `origin`'s entry, made by `make` and stored when the origin has none, after
    /// forgetting an idle one (at `now`) if the map is full. `None` (`make` not called,
    /// counted in [`overflowed`](Self::overflowed)) when the map is full and nothing in it
    /// can be forgotten.
    pub(crate) fn insert(
        &self,
        origin: &Origin,
        now: E::Now,
        make: impl FnOnce() -> E,
    ) -> Option<Arc<E>> {
        let index = self.shard_index(origin);
        let mut shard = write(&self.shards[index]);
        if let Some(entry) = shard.map.get(origin) {
            return Some(entry.clone());
        }
        // A place reserved in the map's count keeps the bound exact under races.
        let room = self
            .len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| {
                (l < self.max).then_some(l + 1)
            })
            .is_ok()
            || shard.evict_one(now)
            || self.evict_elsewhere(index, now);
        if !room {
            self.overflowed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let entry = Arc::new(make());
        shard.map.insert(origin.clone(), entry.clone());
        Some(entry)
    }

    /// Frees a place in another shard than `skip`. `try_write` only: waiting for a second
    /// shard while holding one could deadlock.
    fn evict_elsewhere(&self, skip: usize, now: E::Now) -> bool {
        self.shards
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != skip)
            .any(|(_, shard)| shard.try_write().is_ok_and(|mut s| s.evict_one(now)))
    }

    /// Every entry with its origin, shard by shard (each shard's read lock held only while
    /// its entries are copied out).
    pub(crate) fn entries(&self) -> Vec<(Origin, Arc<E>)> {
        let mut out = Vec::with_capacity(self.len());
        for shard in self.shards.iter() {
            out.extend(
                read(shard)
                    .map
                    .iter()
                    .map(|(origin, entry)| (origin.clone(), entry.clone())),
            );
        }
        out
    }

    /// The number of shards.
    #[cfg(test)]
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The slots of the shards' tables (items and free ones).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.shards.iter().map(|s| read(s).map.capacity()).sum()
    }
}

/// `entry`'s last use, if nothing depends on it at `now`: no one holds it (the shard's
/// write lock keeps new clones out, so one holder is the map) and it says it is idle.
fn idle<E: Evict>(entry: &Arc<E>, now: E::Now) -> Option<E::Stamp> {
    if Arc::strong_count(entry) != 1 {
        return None;
    }
    // Pairs with the release decrement of the last other holder's `Arc`: what it stored
    // in the entry before letting go (its last use) is seen below.
    fence(Ordering::Acquire);
    entry.idle_since(now)
}

impl<E: Evict> Shard<E> {
    /// Forgets the least recently used entry of the shard that nothing depends on.
    fn evict_one(&mut self, now: E::Now) -> bool {
        let mut refilled = false;
        loop {
            let Some((seen, origin)) = self.victims.pop() else {
                if refilled {
                    return false;
                }
                self.refill_victims(now);
                refilled = true;
                continue;
            };
            let gone = match self.map.get(&origin) {
                // Used since it was chosen: no longer among the least recently used.
                Some(entry) => idle(entry, now).is_some_and(|last| last <= seen),
                None => false,
            };
            if gone {
                self.map.remove(&origin);
                return true;
            }
        }
    }

    /// Chooses the next victims: the eighth of the shard (at least one) idle longest.
    fn refill_victims(&mut self, now: E::Now) {
        let target = (self.map.len() / 8).max(1);
        let mut candidates: Vec<(E::Stamp, Origin)> = self
            .map
            .iter()
            .filter_map(|(origin, entry)| Some((idle(entry, now)?, origin.clone())))
            .collect();
        if candidates.len() > target {
            candidates.select_nth_unstable_by_key(target, |c| c.0);
            candidates.truncate(target);
        }
        // Oldest last, for `pop`.
        candidates.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
        self.victims = candidates;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// An entry that is idle unless `busy`, last used at `used`.
    #[derive(Default)]
    struct Item {
        used: AtomicU64,
        busy: AtomicBool,
    }

    impl Item {
        fn at(used: u64) -> Item {
            Item {
                used: AtomicU64::new(used),
                busy: AtomicBool::new(false),
            }
        }
    }

    impl Evict for Item {
        type Stamp = u64;
        type Now = ();
        fn idle_since(&self, (): ()) -> Option<u64> {
            (!self.busy.load(Ordering::Relaxed)).then(|| self.used.load(Ordering::Relaxed))
        }
    }

    fn origin(i: usize) -> Origin {
        Origin::parse(&format!("http://h{i}.example:8080")).unwrap()
    }

    fn get_or_insert(map: &BoundedOriginMap<Item>, o: &Origin, used: u64) -> Option<Arc<Item>> {
        match map.get(o) {
            Some(e) => Some(e),
            None => map.insert(o, (), || Item::at(used)),
        }
    }

    #[test]
    fn one_shard_per_256_origins_of_the_bound_up_to_16() {
        let shards = |max| BoundedOriginMap::<Item>::new(max).shard_count();
        assert_eq!(
            [shards(1), shards(511), shards(512), shards(10_000)],
            [1, 1, 2, 16]
        );
        assert_eq!(shards(usize::MAX), MAX_SHARDS);
    }

    #[test]
    fn a_known_origin_is_found_and_not_made_again() {
        let map = BoundedOriginMap::new(10);
        let o = origin(1);
        assert!(map.get(&o).is_none());
        let a = map.insert(&o, (), || Item::at(1)).unwrap();
        let b = map.insert(&o, (), || panic!("made twice")).unwrap();
        assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&a, &map.get(&o).unwrap()));
        let used = |e: &Arc<Item>| e.used.load(Ordering::Relaxed);
        assert_eq!(map.with(&o, used, || panic!("known")), 1);
        assert_eq!(map.with(&origin(2), used, || Arc::new(Item::at(7))), 7);
        assert!(
            map.get(&origin(2)).is_none(),
            "`missing`'s entry is not stored"
        );
        assert_eq!((map.len(), map.overflowed()), (1, 0));
    }

    #[test]
    fn a_full_map_forgets_its_least_recently_used_entries_first() {
        let map = BoundedOriginMap::new(4);
        for i in 0..4 {
            get_or_insert(&map, &origin(i), [30, 10, 40, 20][i]);
        }
        // Last used: 1 (10), 3 (20), 0 (30), 2 (40): forgotten in that order.
        for (new, gone) in [(10, 1), (11, 3), (12, 0), (13, 2)] {
            get_or_insert(&map, &origin(new), 100 + new as u64);
            assert!(map.get(&origin(gone)).is_none(), "{gone}");
            assert_eq!(map.len(), 4);
        }
        assert!((10..14).all(|i| map.get(&origin(i)).is_some()));
        assert_eq!(map.overflowed(), 0);
    }

    #[test]
    fn a_victim_used_since_it_was_chosen_is_passed_over() {
        // 40 entries in one shard: a scan chooses 5 victims (0..5, the oldest).
        let map = BoundedOriginMap::new(40);
        for i in 0..40 {
            get_or_insert(&map, &origin(i), i as u64);
        }
        get_or_insert(&map, &origin(100), 100);
        assert!(map.get(&origin(0)).is_none());
        // 1 used again: the next victim is 2.
        map.get(&origin(1))
            .unwrap()
            .used
            .store(200, Ordering::Relaxed);
        get_or_insert(&map, &origin(101), 101);
        assert!(map.get(&origin(1)).is_some() && map.get(&origin(2)).is_none());
        assert_eq!(map.len(), 40);
    }

    #[test]
    fn held_or_busy_entries_are_never_forgotten_and_a_full_map_overflows() {
        let map = BoundedOriginMap::new(3);
        let held = get_or_insert(&map, &origin(0), 0).unwrap();
        let busy = get_or_insert(&map, &origin(1), 1).unwrap();
        busy.busy.store(true, Ordering::Relaxed);
        drop(busy);
        get_or_insert(&map, &origin(2), 2);
        // Only 2 can go.
        assert!(get_or_insert(&map, &origin(3), 3).is_some());
        assert!(map.get(&origin(2)).is_none());
        let pinned = map.get(&origin(3)).unwrap();
        assert!(
            map.insert(&origin(4), (), || panic!("not stored"))
                .is_none()
        );
        assert_eq!((map.len(), map.overflowed()), (3, 1));
        assert!(map.get(&origin(0)).is_some() && map.get(&origin(1)).is_some());
        drop((held, pinned));
        assert!(get_or_insert(&map, &origin(4), 4).is_some());
        assert!(
            map.get(&origin(0)).is_none(),
            "the least recently used idle one"
        );
    }

    #[test]
    fn a_full_shard_with_nothing_to_forget_makes_room_in_another() {
        let map = BoundedOriginMap::new(1024);
        assert_eq!(map.shard_count(), 4);
        let held: Vec<_> = (0..1024)
            .map(|i| get_or_insert(&map, &origin(i), i as u64).unwrap())
            .collect();
        let free = held
            .iter()
            .position(|e| e.used.load(Ordering::Relaxed) == 700)
            .unwrap();
        let mut held = held;
        held.swap_remove(free);
        // Whichever shard 700 and the new origin are in.
        let new = get_or_insert(&map, &origin(5_000), 5_000).expect("stored");
        assert!(map.get(&origin(700)).is_none());
        assert!(map.insert(&origin(5_001), (), || Item::at(0)).is_none());
        assert_eq!((map.len(), map.overflowed()), (1024, 1));
        assert_eq!(map.entries().len(), 1024);
        drop((held, new));
    }

    #[test]
    fn a_stream_of_new_origins_keeps_the_tables_flat() {
        let max = 2_000;
        let map = BoundedOriginMap::new(max);
        let mut peak = 0;
        for i in 0..50_000 {
            get_or_insert(&map, &origin(i), i as u64);
            assert!(map.len() <= max);
            if i % 500 == 0 {
                peak = peak.max(map.capacity());
            }
        }
        assert_eq!((map.len(), map.overflowed()), (max, 0));
        assert!(peak <= 4 * max, "{peak}");
        assert!(map.get(&origin(49_999)).is_some() && map.get(&origin(0)).is_none());
    }

    /// Threads racing to insert and find a small pool of origins in a small map, some
    /// holding their entries: the bound holds at every step, two callers of one origin
    /// present at once share one entry, and the count is the entries'.
    #[test]
    fn concurrent_inserts_and_gets_keep_the_bound_and_one_entry_per_origin() {
        for round in 0..20 {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .build()
                .unwrap();
            let map = Arc::new(BoundedOriginMap::<Item>::new(16));
            let origins: Arc<Vec<Origin>> = Arc::new((0..64).map(origin).collect());
            let clock = Arc::new(AtomicU64::new(0));
            rt.block_on(async {
                let tasks: Vec<_> = (0..8)
                    .map(|t| {
                        let (map, origins, clock) = (map.clone(), origins.clone(), clock.clone());
                        tokio::spawn(async move { race(&map, &origins, &clock, t + round) })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
            });
            let entries = map.entries();
            assert_eq!(entries.len(), map.len());
            assert!(map.len() <= 16);
            let mut seen: Vec<_> = entries.iter().map(|(o, _)| o.clone()).collect();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), entries.len());
        }
    }

    fn race(map: &BoundedOriginMap<Item>, origins: &[Origin], clock: &AtomicU64, seed: usize) {
        let mut held: Vec<(Origin, Arc<Item>)> = Vec::new();
        for i in 0..5_000usize {
            let o = &origins[(i * 7919 + seed * 104_729) % origins.len()];
            let now = clock.fetch_add(1, Ordering::Relaxed);
            let entry = match map.get(o) {
                Some(e) => Some(e),
                None => map.insert(o, (), || Item::at(now)),
            };
            assert!(map.len() <= 16);
            if let Some(e) = entry {
                e.used.fetch_max(now, Ordering::Relaxed);
                // An entry held is never forgotten: found again, it is the same one.
                for (o, h) in &held {
                    let found = map.get(o).expect("a held entry stays");
                    assert!(Arc::ptr_eq(&found, h));
                }
                if i % 3 == 0 {
                    held.push((o.clone(), e));
                }
            }
            if held.len() > 3 {
                held.remove(0);
            }
        }
    }
}
