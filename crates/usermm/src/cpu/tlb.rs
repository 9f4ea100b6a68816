//! A CPU's software TLB: set-associative arrays for 4 KiB and 2 MiB
//! translations, tagged by address-space slot (x86 PCID), and the
//! paging-structure caches beside them.
//!
//! The paging-structure caches hold what a walk read above the leaf, as
//! x86's do: the PDE cache maps a 2 MiB region to its PTE table, the PDPTE
//! cache a 1 GiB region to its PMD table, so that the next walk in the
//! region starts there. They are why a table may be freed only after a
//! flush that reached every CPU that may cache it (`freed_tables`): a walk
//! that starts at a freed table stops the model
//! ([`crate::pgtable::walk::hw_walk_from`]). As on Intel, `INVLPG` drops
//! every paging-structure entry of the slot whatever its address (the
//! slot's `psc_gen` is bumped), and so does a full flush of the slot.
//!
//! Each CPU keeps [`NR_DYN_ASIDS`] address-space slots, as x86 keeps
//! `TLB_NR_DYN_ASIDS` PCIDs: switching back to an address space whose slot
//! is still cached keeps its entries, and the slot's `tlb_gen` says whether a
//! flush happened meanwhile. A full flush of a slot bumps the slot's
//! generation, which invalidates all its entries at once, as `INVPCID`
//! single-context does.
//!
//! # Who reads and writes it
//!
//! Like a hardware TLB, it belongs to its CPU: only the thread that plays
//! the CPU fills, flushes or looks it up (the access path, the mailbox, a
//! local flush, `switch_mm`). That thread reads it with plain relaxed
//! loads, takes no lock and makes no read-modify-write: a user access that
//! hits costs a few loads. Every word is an atomic all the same, so that
//! other threads (the invariant checker, `inspect`) may read it at any
//! time; they read a consistent picture by a sequence count, as the
//! kernel's `seqcount_t` readers do:
//!
//! - the owner opens a write section ([`Tlb::write`]) around each change:
//!   it stores the count + 1 (odd), a Release fence orders that store before
//!   the section's stores, and closing stores the count + 2 with Release.
//!   The owner is the only writer, so a load and a store suffice;
//! - a reader ([`Tlb::entries`]) loads the count (Acquire), reads the
//!   entries, issues an Acquire fence and loads the count again: if it was
//!   odd or moved, a write overlapped and it reads again. The fence orders
//!   the entry loads before the second load, and pairs with the writer's
//!   fence: a reader that saw a section's store saw its odd count too.
//!
//! `tests/loom_tlb.rs` model-checks the reader against the owner's fills
//! and flushes, on this very code, with a reader that skips the second
//! look caught reading a torn entry.

use crate::pgtable::walk::Translation;
use crate::phys::{Pfn, PAGE_SHIFT};
use crate::sync::checked::{fence, AtomicU32, AtomicU64};
use crate::sync::Ordering::{Acquire, Relaxed, Release};

#[cfg(not(loom))]
pub const NR_DYN_ASIDS: usize = 6;
/// Under the model checker, one slot (every word is a checked atomic).
#[cfg(loom)]
pub const NR_DYN_ASIDS: usize = 1;
#[cfg(not(loom))]
mod geometry {
    pub const SETS_4K: usize = 256;
    pub const WAYS_4K: usize = 8;
    pub const SETS_2M: usize = 16;
    pub const WAYS_2M: usize = 4;
    /// Intel's PDE cache holds 32 entries, its PDPTE cache 4.
    pub const PDE_ENTRIES: usize = 32;
    pub const PDPTE_ENTRIES: usize = 4;
}
/// Under the model checker, the smallest TLB (every word of it is a
/// checked atomic): each fill replaces the last.
#[cfg(loom)]
mod geometry {
    pub const SETS_4K: usize = 1;
    pub const WAYS_4K: usize = 1;
    pub const SETS_2M: usize = 1;
    pub const WAYS_2M: usize = 1;
    pub const PDE_ENTRIES: usize = 1;
    pub const PDPTE_ENTRIES: usize = 1;
}
use geometry::*;

/// A translation found in the TLB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlbEntry {
    pub pfn: Pfn,
    pub writable: bool,
    pub dirty: bool,
}

/// One way of a set, in three words:
/// - `key`: (page number + 1) << 3 | ASID slot (0: invalid), of the 4 KiB
///   or 2 MiB page;
/// - `val`: pfn << 2 | writable << 1 | dirty;
/// - `gen`: the slot generation it was filled under.
struct Way {
    key: AtomicU64,
    val: AtomicU64,
    gen: AtomicU32,
}

impl Default for Way {
    fn default() -> Self {
        Way {
            key: AtomicU64::new(0),
            val: AtomicU64::new(0),
            gen: AtomicU32::new(0),
        }
    }
}

const ASID_BITS: u32 = 3;
const _: () = assert!(NR_DYN_ASIDS <= 1 << ASID_BITS);

#[inline]
fn key_of(page_number: u64, asid: usize) -> u64 {
    ((page_number + 1) << ASID_BITS) | asid as u64
}

/// The way a fill takes among `ways`: the one that holds `key` already,
/// else one that holds nothing `live`, else the next of the round-robin
/// `victim` pointer (which it advances). Owner only.
#[inline]
fn choose_way(ways: &[Way], key: u64, live: impl Fn(&Way) -> bool, victim: &AtomicU32) -> usize {
    ways.iter()
        .position(|w| w.key.load(Relaxed) == key)
        .or_else(|| ways.iter().position(|w| !live(w)))
        .unwrap_or_else(|| {
            let v = victim.load(Relaxed);
            victim.store(v.wrapping_add(1), Relaxed);
            v as usize % ways.len()
        })
}

/// Within a write section: a new stamp, dropping what the old one marked.
#[inline]
fn bump(g: &AtomicU32) {
    g.store(g.load(Relaxed).wrapping_add(1), Relaxed);
}

#[inline]
fn asid_of(key: u64) -> usize {
    (key & ((1 << ASID_BITS) - 1)) as usize
}

#[inline]
fn val_of(pfn: Pfn, writable: bool, dirty: bool) -> u64 {
    (pfn << 2) | (writable as u64) << 1 | dirty as u64
}

#[inline]
fn entry_of(val: u64) -> TlbEntry {
    TlbEntry {
        pfn: val >> 2,
        writable: val & 2 != 0,
        dirty: val & 1 != 0,
    }
}

/// `cpu_tlbstate.ctxs[]`: which address space a slot holds and up to which
/// flush generation its entries are known to be current.
#[derive(Clone, Copy, Default, Debug)]
pub struct AsidSlot {
    pub mm_id: u64,
    pub tlb_gen: u64,
}

struct Slot {
    mm_id: AtomicU64,
    tlb_gen: AtomicU64,
    /// Stamped into the entries filled for the slot; bumping it flushes
    /// the slot.
    gen: AtomicU32,
    /// Stamped into the slot's paging-structure entries; bumping it drops
    /// them all.
    psc_gen: AtomicU32,
}

/// The level of a paging-structure cache entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PscLevel {
    /// A PDE cache entry: the PTE table of a 2 MiB region.
    Pde,
    /// A PDPTE cache entry: the PMD table of a 1 GiB region.
    Pdpte,
}

impl PscLevel {
    #[inline]
    fn shift(self) -> u32 {
        match self {
            PscLevel::Pde => 21,
            PscLevel::Pdpte => 30,
        }
    }
}

/// One paging-structure cache entry, as the invariant checker sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedTable {
    pub mm_id: u64,
    pub slot_tlb_gen: u64,
    pub level: PscLevel,
    /// The start of the region it covers.
    pub vaddr: u64,
    pub table: Pfn,
}

pub struct Tlb {
    small: Box<[[Way; WAYS_4K]]>,
    huge: Box<[[Way; WAYS_2M]]>,
    /// Each set's next victim (round-robin within the set), 4 KiB sets
    /// then 2 MiB sets. Owner only.
    victims: Box<[AtomicU32]>,
    /// The paging-structure caches, fully associative, each with its
    /// round-robin victim (owner only). `val` holds the table's PFN.
    pde: Box<[Way]>,
    pdpte: Box<[Way]>,
    psc_victims: [AtomicU32; 2],
    slots: [Slot; NR_DYN_ASIDS],
    next_slot: AtomicU32,
    /// The sequence count of the readers' protocol (see the module doc).
    seq: AtomicU64,
    /// Model checking only: a reader that does not look at the count again.
    #[cfg(loom)]
    broken_reader: bool,
}

/// One cached translation, as the invariant checker sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedTranslation {
    pub mm_id: u64,
    pub slot_tlb_gen: u64,
    pub vaddr: u64,
    pub size: u64,
    pub pfn: Pfn,
    pub writable: bool,
}

impl Default for Tlb {
    fn default() -> Self {
        Tlb {
            small: (0..SETS_4K).map(|_| Default::default()).collect(),
            huge: (0..SETS_2M).map(|_| Default::default()).collect(),
            victims: (0..SETS_4K + SETS_2M).map(|_| AtomicU32::new(0)).collect(),
            pde: (0..PDE_ENTRIES).map(|_| Way::default()).collect(),
            pdpte: (0..PDPTE_ENTRIES).map(|_| Way::default()).collect(),
            psc_victims: [AtomicU32::new(0), AtomicU32::new(0)],
            slots: std::array::from_fn(|_| Slot {
                mm_id: AtomicU64::new(0),
                tlb_gen: AtomicU64::new(0),
                gen: AtomicU32::new(1),
                psc_gen: AtomicU32::new(1),
            }),
            next_slot: AtomicU32::new(0),
            seq: AtomicU64::new(0),
            #[cfg(loom)]
            broken_reader: false,
        }
    }
}

/// The owner's writers: private to the crate, whose only callers run on
/// the thread that plays the CPU; public only to the model checker's
/// tests, which play the owner themselves. (Two writers could leave the
/// sequence count odd for good, and a reader waiting forever.)
macro_rules! owner_fn {
    ($(#[$m:meta])* fn $name:ident($($args:tt)*) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        #[cfg(loom)]
        pub fn $name($($args)*) $(-> $ret)? $body
        $(#[$m])*
        #[cfg(not(loom))]
        pub(crate) fn $name($($args)*) $(-> $ret)? $body
    };
}

/// An open write section of the owner ([`Tlb::write`]); closes on drop.
#[must_use = "the section closes as soon as the guard is dropped"]
pub struct TlbWrite<'a> {
    tlb: &'a Tlb,
    seq: u64,
}

impl Drop for TlbWrite<'_> {
    #[inline]
    fn drop(&mut self) {
        // Release: the section's stores before the even count.
        self.tlb.seq.store(self.seq + 2, Release);
    }
}

impl Tlb {
    /// Open a write section. Owner only (the one writer, so no RMW).
    #[inline]
    fn write(&self) -> TlbWrite<'_> {
        let seq = self.seq.load(Relaxed);
        debug_assert!(seq.is_multiple_of(2), "TLB write sections do not nest");
        self.seq.store(seq + 1, Relaxed);
        // Orders the odd count before the section's stores (smp_wmb).
        fence(Release);
        TlbWrite { tlb: self, seq }
    }

    /// Model checking only: [`Tlb::entries`] without its second look at
    /// the count, for the test that must catch it.
    #[cfg(loom)]
    pub fn break_reader(&mut self) {
        self.broken_reader = true;
    }

    /// Find the slot caching `mm_id`. Owner only.
    pub fn slot_of(&self, mm_id: u64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.mm_id.load(Relaxed) == mm_id)
    }

    /// The generation up to which slot `slot` is current. Owner only.
    #[inline]
    pub fn slot_tlb_gen(&self, slot: usize) -> u64 {
        self.slots[slot].tlb_gen.load(Relaxed)
    }

    owner_fn! {
        /// Record that slot `slot` is current up to `gen`. Owner only.
        #[inline]
        fn set_slot_tlb_gen(&self, slot: usize, gen: u64) {
            let _w = self.write();
            self.slots[slot].tlb_gen.store(gen, Relaxed);
        }
    }

    owner_fn! {
        /// Give `mm_id` a slot, evicting round-robin (`choose_new_asid`). Returns
        /// the slot and whether it was newly assigned (and so flushed). Owner
        /// only.
        fn assign_slot(&self, mm_id: u64, tlb_gen: u64) -> (usize, bool) {
            if let Some(s) = self.slot_of(mm_id) {
                return (s, false);
            }
            let s = self.next_slot.load(Relaxed) as usize;
            self.next_slot
                .store(((s + 1) % NR_DYN_ASIDS) as u32, Relaxed);
            let _w = self.write();
            self.bump_slot_gen(s);
            self.slots[s].mm_id.store(mm_id, Relaxed);
            self.slots[s].tlb_gen.store(tlb_gen, Relaxed);
            (s, true)
        }
    }

    /// Look up `vaddr` in slot `asid`. Owner only.
    #[inline]
    pub fn lookup(&self, asid: usize, vaddr: u64) -> Option<TlbEntry> {
        let gen = self.slots[asid].gen.load(Relaxed);
        let vpn = vaddr >> PAGE_SHIFT;
        let key = key_of(vpn, asid);
        let set = &self.small[vpn as usize % SETS_4K];
        if let Some(w) = set
            .iter()
            .find(|w| w.key.load(Relaxed) == key && w.gen.load(Relaxed) == gen)
        {
            return Some(entry_of(w.val.load(Relaxed)));
        }
        let hpn = vaddr >> 21;
        let hkey = key_of(hpn, asid);
        self.huge[hpn as usize % SETS_2M]
            .iter()
            .find(|w| w.key.load(Relaxed) == hkey && w.gen.load(Relaxed) == gen)
            .map(|w| {
                let e = entry_of(w.val.load(Relaxed));
                TlbEntry {
                    pfn: e.pfn + (vpn & 511),
                    ..e
                }
            })
    }

    owner_fn! {
        /// Cache a translation for `vaddr`: over an entry for the same page and
        /// slot, else in a way that holds nothing live, else in the way the
        /// set's round-robin pointer names (a hardware TLB evicts by a
        /// pseudo-LRU per set; a pointer shared by all sets would make every
        /// sequential run of pages land in one way of each set). Owner only.
        fn insert(&self, asid: usize, vaddr: u64, t: &Translation) {
            let (set, key, victim): (&[Way], u64, &AtomicU32) = if t.size == crate::pgtable::PMD_SIZE {
                let i = (vaddr >> 21) as usize % SETS_2M;
                (&self.huge[i], key_of(vaddr >> 21, asid), &self.victims[SETS_4K + i])
            } else {
                let i = (vaddr >> PAGE_SHIFT) as usize % SETS_4K;
                (&self.small[i], key_of(vaddr >> PAGE_SHIFT, asid), &self.victims[i])
            };
            let way = choose_way(set, key, |w| self.live(w), victim);
            let _w = self.write();
            let w = &set[way];
            w.key.store(key, Relaxed);
            w.val.store(val_of(t.pfn, t.writable, t.dirty), Relaxed);
            w.gen.store(self.slots[asid].gen.load(Relaxed), Relaxed);
        }
    }

    fn psc(&self, level: PscLevel) -> &[Way] {
        match level {
            PscLevel::Pde => &self.pde,
            PscLevel::Pdpte => &self.pdpte,
        }
    }

    /// The table a paging-structure cache holds for `vaddr` in slot
    /// `asid` at `level`. Owner only.
    #[inline]
    pub fn lookup_table(&self, asid: usize, level: PscLevel, vaddr: u64) -> Option<Pfn> {
        let gen = self.slots[asid].psc_gen.load(Relaxed);
        let key = key_of(vaddr >> level.shift(), asid);
        self.psc(level)
            .iter()
            .find(|w| w.key.load(Relaxed) == key && w.gen.load(Relaxed) == gen)
            .map(|w| w.val.load(Relaxed))
    }

    owner_fn! {
        /// Cache `table` as the table at `level` for `vaddr`'s region: over
        /// an entry for the same region, else in a way that holds nothing
        /// live, else round-robin. Owner only.
        fn insert_table(&self, asid: usize, level: PscLevel, vaddr: u64, table: Pfn) {
            let gen = self.slots[asid].psc_gen.load(Relaxed);
            let key = key_of(vaddr >> level.shift(), asid);
            let ways = self.psc(level);
            let live = |w: &Way| {
                let k = w.key.load(Relaxed);
                k != 0 && w.gen.load(Relaxed) == self.slots[asid_of(k)].psc_gen.load(Relaxed)
            };
            let way = choose_way(ways, key, live, &self.psc_victims[level as usize]);
            let _w = self.write();
            let w = &ways[way];
            w.key.store(key, Relaxed);
            w.val.store(table, Relaxed);
            w.gen.store(gen, Relaxed);
        }
    }

    /// Whether a way holds a translation its slot still stands by. Owner
    /// only.
    #[inline]
    fn live(&self, w: &Way) -> bool {
        let key = w.key.load(Relaxed);
        key != 0 && w.gen.load(Relaxed) == self.slots[asid_of(key)].gen.load(Relaxed)
    }

    owner_fn! {
        /// `INVLPG`-like: drop whatever maps `vaddr` in slot `asid`, 4 KiB or
        /// 2 MiB, and every paging-structure entry of the slot (Intel's
        /// `INVLPG` drops those whatever their address). Owner only.
        fn flush_one(&self, asid: usize, vaddr: u64) {
            let vpn = vaddr >> PAGE_SHIFT;
            let hpn = vaddr >> 21;
            let _w = self.write();
            bump(&self.slots[asid].psc_gen);
            for (set, key) in [
                (&self.small[vpn as usize % SETS_4K][..], key_of(vpn, asid)),
                (&self.huge[hpn as usize % SETS_2M][..], key_of(hpn, asid)),
            ] {
                for w in set.iter().filter(|w| w.key.load(Relaxed) == key) {
                    w.key.store(0, Relaxed);
                }
            }
        }
    }

    owner_fn! {
        /// What a page fault on `vaddr` drops (the SDM's rule for a #PF):
        /// the translations of `vaddr` in slot `asid`, and the
        /// paging-structure entries that a walk for `vaddr` would use, not
        /// the rest of the slot's as [`Tlb::flush_one`] does. Owner only.
        fn flush_fault(&self, asid: usize, vaddr: u64) {
            let vpn = vaddr >> PAGE_SHIFT;
            let hpn = vaddr >> 21;
            let _w = self.write();
            for (set, key) in [
                (&self.small[vpn as usize % SETS_4K][..], key_of(vpn, asid)),
                (&self.huge[hpn as usize % SETS_2M][..], key_of(hpn, asid)),
                (&self.pde[..], key_of(vaddr >> PscLevel::Pde.shift(), asid)),
                (&self.pdpte[..], key_of(vaddr >> PscLevel::Pdpte.shift(), asid)),
            ] {
                for w in set.iter().filter(|w| w.key.load(Relaxed) == key) {
                    w.key.store(0, Relaxed);
                }
            }
        }
    }

    owner_fn! {
        /// Drop every entry of slot `asid`. Owner only.
        fn flush_slot(&self, asid: usize) {
            let _w = self.write();
            self.bump_slot_gen(asid);
        }
    }

    /// Within a write section: drop the slot's translations and
    /// paging-structure entries.
    fn bump_slot_gen(&self, asid: usize) {
        bump(&self.slots[asid].gen);
        bump(&self.slots[asid].psc_gen);
    }

    /// Every live entry, read by any thread (the invariant checker,
    /// `inspect`) by the sequence count's protocol (see the module doc).
    pub fn entries(&self) -> Vec<CachedTranslation> {
        self.read_consistent(Self::read_entries)
    }

    /// Every live paging-structure cache entry, read as [`Tlb::entries`]
    /// reads the translations.
    pub fn cached_tables(&self) -> Vec<CachedTable> {
        self.read_consistent(Self::read_tables)
    }

    /// `read` until no write section overlapped it.
    fn read_consistent<T>(&self, read: impl Fn(&Self) -> T) -> T {
        loop {
            let seq = self.seq.load(Acquire);
            if !seq.is_multiple_of(2) {
                crate::sync::spin_until(|| self.seq.load(Relaxed) != seq);
                continue;
            }
            let out = read(self);
            // Orders the entry loads before the second look (smp_rmb).
            fence(Acquire);
            #[cfg(loom)]
            if self.broken_reader {
                return out;
            }
            if self.seq.load(Relaxed) == seq {
                return out;
            }
        }
    }

    /// The paging-structure entries as they are read, torn if a write
    /// overlaps.
    fn read_tables(&self) -> Vec<CachedTable> {
        let mut out = vec![];
        for level in [PscLevel::Pde, PscLevel::Pdpte] {
            for w in self.psc(level) {
                let key = w.key.load(Relaxed);
                let (gen, table) = (w.gen.load(Relaxed), w.val.load(Relaxed));
                let a = asid_of(key);
                if key == 0 || a >= NR_DYN_ASIDS {
                    continue;
                }
                let s = &self.slots[a];
                if gen != s.psc_gen.load(Relaxed) {
                    continue;
                }
                out.push(CachedTable {
                    mm_id: s.mm_id.load(Relaxed),
                    slot_tlb_gen: s.tlb_gen.load(Relaxed),
                    level,
                    vaddr: ((key >> ASID_BITS) - 1) << level.shift(),
                    table,
                });
            }
        }
        out
    }

    /// The entries as they are read, torn if a write overlaps.
    fn read_entries(&self) -> Vec<CachedTranslation> {
        let slots: [(AsidSlot, u32); NR_DYN_ASIDS] = std::array::from_fn(|a| {
            let s = &self.slots[a];
            (
                AsidSlot {
                    mm_id: s.mm_id.load(Relaxed),
                    tlb_gen: s.tlb_gen.load(Relaxed),
                },
                s.gen.load(Relaxed),
            )
        });
        let mut out = vec![];
        let mut push = |w: &Way, size: u64, shift: u32| {
            let key = w.key.load(Relaxed);
            let (gen, val) = (w.gen.load(Relaxed), w.val.load(Relaxed));
            let a = asid_of(key);
            if key != 0 && a < NR_DYN_ASIDS && gen == slots[a].1 {
                let e = entry_of(val);
                out.push(CachedTranslation {
                    mm_id: slots[a].0.mm_id,
                    slot_tlb_gen: slots[a].0.tlb_gen,
                    vaddr: ((key >> ASID_BITS) - 1) << shift,
                    size,
                    pfn: e.pfn,
                    writable: e.writable,
                });
            }
        };
        self.small
            .iter()
            .flatten()
            .for_each(|w| push(w, 4096, PAGE_SHIFT));
        self.huge
            .iter()
            .flatten()
            .for_each(|w| push(w, 2 << 20, 21));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(pfn: Pfn, size: u64) -> Translation {
        Translation {
            pfn,
            size,
            writable: true,
            dirty: false,
        }
    }

    #[test]
    fn insert_lookup_flush() {
        let tlb = Tlb::default();
        let (a, new) = tlb.assign_slot(7, 1);
        assert!(new);
        tlb.insert(a, 0x1000, &t(42, 4096));
        assert_eq!(tlb.lookup(a, 0x1abc).unwrap().pfn, 42);
        assert!(tlb.lookup(a, 0x2000).is_none());
        tlb.flush_one(a, 0x1000);
        assert!(tlb.lookup(a, 0x1000).is_none());
        tlb.insert(a, 0x20_0000, &t(0x400, 2 << 20));
        assert_eq!(tlb.lookup(a, 0x20_3000).unwrap().pfn, 0x403);
        tlb.flush_one(a, 0x3f_f000);
        assert!(
            tlb.lookup(a, 0x20_0000).is_none(),
            "INVLPG of any address inside drops a 2M entry"
        );
        tlb.insert(a, 0x5000, &t(1, 4096));
        tlb.flush_slot(a);
        assert!(tlb.lookup(a, 0x5000).is_none());
        assert!(tlb.entries().is_empty());
    }

    #[test]
    fn a_sequential_run_fills_every_way() {
        // As many 4 KiB pages in a row as the TLB holds: each set takes
        // its share in all its ways, and every page then hits.
        let tlb = Tlb::default();
        let (a, _) = tlb.assign_slot(1, 1);
        let pages = (SETS_4K * WAYS_4K) as u64;
        for p in 0..pages {
            tlb.insert(a, p << PAGE_SHIFT, &t(100 + p, 4096));
        }
        let hits = (0..pages)
            .filter(|&p| tlb.lookup(a, p << PAGE_SHIFT).map(|e| e.pfn) == Some(100 + p))
            .count();
        assert_eq!(hits as u64, pages);
        // One more evicts one entry of its set, round-robin.
        tlb.insert(a, pages << PAGE_SHIFT, &t(1, 4096));
        assert_eq!(tlb.entries().len() as u64, pages);
    }

    #[test]
    fn slots_are_separate_address_spaces() {
        let tlb = Tlb::default();
        let (a, _) = tlb.assign_slot(1, 1);
        let (b, _) = tlb.assign_slot(2, 1);
        tlb.insert(a, 0x1000, &t(10, 4096));
        tlb.insert(b, 0x1000, &t(20, 4096));
        assert_eq!(tlb.lookup(a, 0x1000).unwrap().pfn, 10);
        assert_eq!(tlb.lookup(b, 0x1000).unwrap().pfn, 20);
        tlb.flush_slot(a);
        assert_eq!(tlb.lookup(b, 0x1000).unwrap().pfn, 20);
        for i in 0..NR_DYN_ASIDS as u64 {
            tlb.assign_slot(100 + i, 1);
        }
        assert!(
            tlb.slot_of(2).is_none(),
            "evicted after six newer address spaces"
        );
    }
}
