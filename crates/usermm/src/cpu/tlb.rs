//! A CPU's software TLB: set-associative arrays for 4 KiB and 2 MiB
//! translations, tagged by address-space slot (x86 PCID).
//!
//! Each CPU keeps [`NR_DYN_ASIDS`] address-space slots, as x86 keeps
//! `TLB_NR_DYN_ASIDS` PCIDs: switching back to an address space whose slot
//! is still cached keeps its entries, and the slot's `tlb_gen` says whether a
//! flush happened meanwhile. A full flush of a slot bumps the slot's
//! generation, which invalidates all its entries at once, as `INVPCID`
//! single-context does.

use crate::pgtable::walk::Translation;
use crate::phys::{Pfn, PAGE_SHIFT};

pub const NR_DYN_ASIDS: usize = 6;
const SETS_4K: usize = 256;
const WAYS_4K: usize = 8;
const SETS_2M: usize = 16;
const WAYS_2M: usize = 4;

#[derive(Clone, Copy, Default)]
pub struct TlbEntry {
    /// Virtual page number + 1 (0 = invalid), of the 4 KiB or 2 MiB page.
    tag: u64,
    asid: u8,
    gen: u32,
    pub pfn: Pfn,
    pub writable: bool,
    pub dirty: bool,
}

/// `cpu_tlbstate.ctxs[]`: which address space a slot holds and up to which
/// flush generation its entries are known to be current.
#[derive(Clone, Copy, Default, Debug)]
pub struct AsidSlot {
    pub mm_id: u64,
    pub tlb_gen: u64,
}

pub struct Tlb {
    small: Box<[[TlbEntry; WAYS_4K]]>,
    huge: Box<[[TlbEntry; WAYS_2M]]>,
    /// Per-slot generation stamped into entries; bumping it flushes the slot.
    slot_gen: [u32; NR_DYN_ASIDS],
    pub slots: [AsidSlot; NR_DYN_ASIDS],
    next_slot: usize,
    victim: u32,
}

/// One cached translation, as the invariant checker sees it.
#[derive(Clone, Copy, Debug)]
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
            small: vec![[TlbEntry::default(); WAYS_4K]; SETS_4K].into_boxed_slice(),
            huge: vec![[TlbEntry::default(); WAYS_2M]; SETS_2M].into_boxed_slice(),
            slot_gen: [1; NR_DYN_ASIDS],
            slots: [AsidSlot::default(); NR_DYN_ASIDS],
            next_slot: 0,
            victim: 0,
        }
    }
}

/// Put `e` in its set: over an entry for the same page and slot, else in
/// the way `victim` picks.
#[inline]
fn fill_way(set: &mut [TlbEntry], e: TlbEntry, victim: u32) {
    let way = set
        .iter()
        .position(|x| x.tag == e.tag && x.asid == e.asid)
        .unwrap_or(victim as usize % set.len());
    set[way] = e;
}

impl Tlb {
    /// Find the slot caching `mm_id`.
    pub fn slot_of(&self, mm_id: u64) -> Option<usize> {
        self.slots.iter().position(|s| s.mm_id == mm_id)
    }

    /// Give `mm_id` a slot, evicting round-robin (`choose_new_asid`). Returns
    /// the slot and whether it was newly assigned (and so flushed).
    pub fn assign_slot(&mut self, mm_id: u64, tlb_gen: u64) -> (usize, bool) {
        if let Some(s) = self.slot_of(mm_id) {
            return (s, false);
        }
        let s = self.next_slot;
        self.next_slot = (s + 1) % NR_DYN_ASIDS;
        self.flush_slot(s);
        self.slots[s] = AsidSlot { mm_id, tlb_gen };
        (s, true)
    }

    #[inline]
    fn live(&self, e: &TlbEntry, tag: u64, asid: usize) -> bool {
        e.tag == tag && e.asid as usize == asid && e.gen == self.slot_gen[asid]
    }

    /// Look up `vaddr` in slot `asid`.
    #[inline]
    pub fn lookup(&self, asid: usize, vaddr: u64) -> Option<TlbEntry> {
        let vpn = vaddr >> PAGE_SHIFT;
        let tag = vpn + 1;
        let set = &self.small[vpn as usize % SETS_4K];
        if let Some(e) = set.iter().find(|e| self.live(e, tag, asid)) {
            return Some(*e);
        }
        let hpn = vaddr >> 21;
        let htag = hpn + 1;
        let hset = &self.huge[hpn as usize % SETS_2M];
        hset.iter()
            .find(|e| self.live(e, htag, asid))
            .map(|e| TlbEntry {
                pfn: e.pfn + (vpn & 511),
                ..*e
            })
    }

    /// Cache a translation for `vaddr`.
    pub fn insert(&mut self, asid: usize, vaddr: u64, t: &Translation) {
        self.victim = self.victim.wrapping_add(1);
        let mut e = TlbEntry {
            tag: 0,
            asid: asid as u8,
            gen: self.slot_gen[asid],
            pfn: t.pfn,
            writable: t.writable,
            dirty: t.dirty,
        };
        if t.size == crate::pgtable::PMD_SIZE {
            let hpn = vaddr >> 21;
            e.tag = hpn + 1;
            fill_way(&mut self.huge[hpn as usize % SETS_2M], e, self.victim);
        } else {
            let vpn = vaddr >> PAGE_SHIFT;
            e.tag = vpn + 1;
            fill_way(&mut self.small[vpn as usize % SETS_4K], e, self.victim);
        }
    }

    /// `INVLPG`-like: drop whatever maps `vaddr` in slot `asid`, 4 KiB or 2 MiB.
    pub fn flush_one(&mut self, asid: usize, vaddr: u64) {
        let vpn = vaddr >> PAGE_SHIFT;
        for e in self.small[vpn as usize % SETS_4K].iter_mut() {
            if e.tag == vpn + 1 && e.asid as usize == asid {
                e.tag = 0;
            }
        }
        let hpn = vaddr >> 21;
        for e in self.huge[hpn as usize % SETS_2M].iter_mut() {
            if e.tag == hpn + 1 && e.asid as usize == asid {
                e.tag = 0;
            }
        }
    }

    /// Drop every entry of slot `asid`.
    pub fn flush_slot(&mut self, asid: usize) {
        self.slot_gen[asid] = self.slot_gen[asid].wrapping_add(1);
    }

    /// Every live entry (for the invariant checker and `inspect`).
    pub fn entries(&self) -> Vec<CachedTranslation> {
        let mut out = vec![];
        let mut push = |e: &TlbEntry, size: u64, shift: u32| {
            let a = e.asid as usize;
            if e.tag != 0 && e.gen == self.slot_gen[a] {
                out.push(CachedTranslation {
                    mm_id: self.slots[a].mm_id,
                    slot_tlb_gen: self.slots[a].tlb_gen,
                    vaddr: (e.tag - 1) << shift,
                    size,
                    pfn: e.pfn,
                    writable: e.writable,
                });
            }
        };
        self.small
            .iter()
            .flatten()
            .for_each(|e| push(e, 4096, PAGE_SHIFT));
        self.huge
            .iter()
            .flatten()
            .for_each(|e| push(e, 2 << 20, 21));
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
        let mut tlb = Tlb::default();
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
    fn slots_are_separate_address_spaces() {
        let mut tlb = Tlb::default();
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
