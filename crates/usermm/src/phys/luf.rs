//! LUF's bookkeeping in the allocator ("Lazy Unmap Flush", Byungchul Park,
//! RFC v12, February 2025; not merged), selected by the tunable `migrc`'s
//! value `luf`.
//!
//! LUF frees a migrated source at once while CPUs may still cache
//! read-only translations to it, and flushes them before the page is
//! handed out again. What must be flushed is counted in unmap generations
//! (`luf_ugen`, starting at 2, 0 meaning none):
//!
//! - an unmap that defers its flush draws a generation after its PTEs are
//!   cleared ([`Luf::new_ugen`]) and stamps each page it frees with a key
//!   ([`super::PhysMem::luf_stamp`]): an entry of a small table of
//!   batches (`luf_batch`: the CPUs to flush, the newest generation folded
//!   in), as v12 keeps a 16-bit `luf_key` in `struct page` while the page
//!   is free;
//! - every batched full flush reads the generation before it sends and,
//!   once done, records it as flushed on each CPU it covered
//!   ([`Luf::flush_done`], v12's per-CPU `ugen_done`);
//! - taking a block off the free lists or a per-CPU list ("takeoff") asks
//!   [`super::PhysMem::luf_takeoff_pending`] which of the stamped CPUs
//!   have not flushed up to their page's generation; the allocator has them flushed before it
//!   hands the block out ([`super::page_alloc::Reclaimer::luf_flush`]),
//!   then clears the keys.
//!
//! The keys stay on the pages through buddy merges and splits (per page,
//! not per block), so a block of any order checks each of its pages. A
//! batch entry never forgets: folding a newer generation into a key that
//! older pages carry only makes their check stricter.
//!
//! The allocator files a free block that owes a flush apart (v12's
//! `pend_list` beside each order's `free_list`, counted in
//! `nr_luf_pages`; see [`super::page_alloc`]): such a block goes to the
//! tail of its pend list, or the far end of a per-CPU list, and an
//! allocation takes a block that owes nothing first as long as the zone
//! keeps more than its min watermark of those (`non_luf_pages_ok`), so
//! that the flush is deferred as long as memory allows and the pages
//! owing nothing are kept for contexts that cannot send IPIs
//! ([`super::AllocContext`]). Short of them, the pend list comes first;
//! a context that may never shoot down then finds only what is left
//! below the watermark, and may fail.
//!
//! Where the model differs: generations are 64-bit and never wrap (v12's
//! wrap and compare with a signed difference); a merged block is marked
//! as owing ([`super::memmap::pg::LUF_PEND`] on the heads a merge makes)
//! where v12 folds the two parts' batches into the head's key, so each
//! page keeps the key its own free gave it; which list comes first, and
//! whether the context may shoot down, are decided once per allocation
//! from a zone where v12 asks again for each order and each block of a
//! per-CPU refill; a block that owes nothing goes to the head of its free
//! list (v12 may put it at the tail when a merge is likely, as the kernel
//! does). v12's per-zone generations (`zone_ugen`, which flush a whole
//! pend list at once) have no counterpart. Every allocation the model's own paths make runs
//! in a task that may send IPIs; the other contexts exist for the
//! allocator's callers, and its tests use them.
//!
//! # Ordering
//!
//! A stamp's generation is drawn (SeqCst RMW) after the PTE clears; a
//! flush reads the counter (SeqCst, after a SeqCst fence) before its IPIs.
//! If the flush read a value at or above the stamp's generation, it read
//! that RMW or a later one of the same counter, so the clears happened
//! before its IPIs: no CPU it covered can still cache what they cleared.
//! A flush that read less records less, and the page's check asks again.
//! The keys are written before the page is freed and read after it is
//! taken off a list, both under the list's lock.

use crate::sync::{AtomicU64, Mutex, Ordering};

/// `luf_batch` entries: keys hash generations onto this many.
const NR_LUF_BATCH: usize = 1024;

/// One `luf_batch`: the CPUs a page with this key needs flushed, and the
/// generation they must have flushed up to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LufBatch {
    pub cpumask: u64,
    pub ugen: u64,
}

impl LufBatch {
    /// Fold `other` in: more CPUs, the newer generation.
    pub fn fold(&mut self, other: LufBatch) {
        self.cpumask |= other.cpumask;
        self.ugen = self.ugen.max(other.ugen);
    }
}

/// The machine's LUF state below the CPUs.
pub struct Luf {
    /// `luf_ugen`: the last generation drawn.
    ugen: AtomicU64,
    /// `ugen_done` of each CPU: every translation cleared before this
    /// generation was drawn is gone from its TLB.
    done: Box<[AtomicU64]>,
    /// The batches the keys name (key `k` is entry `k - 1`).
    batches: Box<[Mutex<LufBatch>]>,
}

impl Luf {
    pub fn new(nr_cpus: usize) -> Luf {
        Luf {
            ugen: AtomicU64::new(1),
            done: (0..nr_cpus).map(|_| AtomicU64::new(0)).collect(),
            batches: (0..NR_LUF_BATCH).map(|_| Mutex::default()).collect(),
        }
    }

    /// Whether any unmap has deferred its flush yet on this machine (the
    /// forced-flush points look no further until one has).
    pub fn used(&self) -> bool {
        self.ugen.load(Ordering::Relaxed) > 1
    }

    /// `new_luf_ugen`: a generation for PTEs already cleared.
    pub fn new_ugen(&self) -> u64 {
        // SeqCst RMW, after the clears (see the module doc).
        self.ugen.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The generation a flush about to be sent will have covered.
    pub fn flush_start(&self) -> u64 {
        // A fence, then SeqCst: ordered before the flush's IPIs.
        crate::sync::fence(Ordering::SeqCst);
        self.ugen.load(Ordering::SeqCst)
    }

    /// A full flush of `cpumask`, started at generation `ugen`
    /// ([`Luf::flush_start`]), is done.
    pub fn flush_done(&self, cpumask: u64, ugen: u64) {
        for (cpu, done) in self.done.iter().enumerate() {
            if cpumask & (1 << cpu) != 0 {
                // Release: a takeoff that reads it (Acquire) sees what the
                // flush's acknowledgements ordered.
                done.fetch_max(ugen, Ordering::Release);
            }
        }
    }

    /// The CPUs of `batch` that have not flushed up to its generation.
    pub fn pending(&self, batch: LufBatch) -> u64 {
        let mut mask = 0;
        for (cpu, done) in self.done.iter().enumerate() {
            let bit = 1u64 << cpu;
            if batch.cpumask & bit != 0 && done.load(Ordering::Acquire) < batch.ugen {
                mask |= bit;
            }
        }
        mask
    }

    /// The key for a page freed with `batch` pending, its entry folded.
    pub fn key_for(&self, batch: LufBatch) -> u32 {
        let idx = (batch.ugen % NR_LUF_BATCH as u64) as usize;
        self.batches[idx].lock().fold(batch);
        idx as u32 + 1
    }

    /// The batch key `key` names (0: none).
    pub fn batch(&self, key: u32) -> LufBatch {
        match key {
            0 => LufBatch::default(),
            k => *self.batches[k as usize - 1].lock(),
        }
    }
}

impl super::PhysMem {
    /// Stamp the pages of `[pfn, pfn + nr)`, about to be freed while
    /// `batch`'s flush is deferred.
    pub fn luf_stamp(&self, pfn: super::Pfn, nr: u64, batch: LufBatch) {
        let key = self.luf.key_for(batch);
        for p in self.pages(pfn, nr) {
            p.luf_key.store(key, Ordering::Relaxed);
        }
    }

    /// Takeoff: the CPUs the pages of a block just taken off a list still
    /// need flushed before it is handed out.
    pub fn luf_takeoff_pending(&self, pfn: super::Pfn, order: u32) -> u64 {
        let mut batch = LufBatch::default();
        let mut last = 0;
        for p in self.pages(pfn, 1 << order) {
            let key = p.luf_key.load(Ordering::Relaxed);
            if key != 0 && key != last {
                batch.fold(self.luf.batch(key));
                last = key;
            }
        }
        if batch.ugen == 0 {
            return 0;
        }
        self.luf.pending(batch)
    }

    /// Takeoff done (flushed, or nothing to flush): the block's keys go,
    /// and the marks merges left on its parts' heads.
    pub fn luf_takeoff_clear(&self, pfn: super::Pfn, order: u32) {
        for p in self.pages(pfn, 1 << order) {
            p.luf_key.store(0, Ordering::Relaxed);
            p.clear(super::memmap::pg::LUF_PEND);
        }
    }

    /// Whether any page of the block carries a key (the checker's view).
    pub fn luf_stamped(&self, pfn: super::Pfn) -> bool {
        self.page(pfn).luf_key.load(Ordering::Relaxed) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_started_after_the_stamp_covers_it() {
        let luf = Luf::new(4);
        let g = luf.new_ugen();
        let b = LufBatch {
            cpumask: 0b0110,
            ugen: g,
        };
        assert_eq!(luf.pending(b), 0b0110);
        // A flush that started before the generation was drawn does not.
        luf.flush_done(0b0110, g - 1);
        assert_eq!(luf.pending(b), 0b0110);
        let s = luf.flush_start();
        assert!(s >= g);
        luf.flush_done(0b0010, s);
        assert_eq!(luf.pending(b), 0b0100);
        luf.flush_done(0b1100, s);
        assert_eq!(luf.pending(b), 0);
    }

    #[test]
    fn a_shared_key_folds_to_the_stricter_batch() {
        let luf = Luf::new(4);
        let g1 = luf.new_ugen();
        let k1 = luf.key_for(LufBatch {
            cpumask: 0b01,
            ugen: g1,
        });
        let g2 = g1 + NR_LUF_BATCH as u64;
        let k2 = luf.key_for(LufBatch {
            cpumask: 0b10,
            ugen: g2,
        });
        assert_eq!(k1, k2);
        assert_eq!(
            luf.batch(k1),
            LufBatch {
                cpumask: 0b11,
                ugen: g2
            }
        );
        assert_eq!(luf.batch(0), LufBatch::default());
    }
}
