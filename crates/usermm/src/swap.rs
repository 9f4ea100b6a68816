//! The LRU side of mm/swap.c: new folios go onto the LRU lists through
//! per-CPU batches (`folio_add_lru`), MADV_FREE moves folios to the
//! lazyfree list the same way (`folio_mark_lazyfree`), the batches drain
//! (`lru_add_drain`, `lru_add_drain_all`, `lru_cache_disable`), and batches
//! of folios are released under one lruvec lock (`folios_put_refs`).
//!
//! A folio in a CPU's batch holds a reference and is not yet (or, for a
//! move between lists, still) where the batch will put it: a new folio
//! has no PG_lru until its batch drains, which is why the kernel's
//! `wp_can_reuse_anon_folio` drains this CPU's batches before it counts
//! references, and why isolation fails for a folio still in a batch. A
//! batch drains when it is full (`FOLIO_BATCH_SIZE`, 31 folios), at once for a large
//! folio or while the batches are disabled, and where the kernel calls
//! `lru_add_drain` (before each zap, MADV_FREE and MADV_PAGEOUT).
//!
//! The kernel drains another CPU's batches by running work on that CPU
//! (`lru_add_drain_all` queues it and waits); the model's CPU threads
//! cannot be interrupted, so the drainer takes that CPU's batch lock (the
//! kernel's `local_lock`) and drains them itself.

use crate::mm::vma::Vma;
use crate::phys::memmap::pg;
use crate::phys::mm_inline::{folio_evictable, CpuFbatches, FolioBatch, LruvecGuard};
use crate::phys::{Folio, PhysMem};
use crate::sync::Ordering;
use crate::vmstat::Event;

/// The batch a folio goes through, and what its drain does to it
/// (`move_fn_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LruMove {
    /// `lru_add`: onto the list its flags say.
    Add,
    /// `lru_lazyfree`: to the inactive file list, no longer swap-backed.
    Lazyfree,
}

impl LruMove {
    fn batch(self, fb: &mut CpuFbatches) -> &mut FolioBatch {
        match self {
            LruMove::Add => &mut fb.lru_add,
            LruMove::Lazyfree => &mut fb.lru_lazyfree,
        }
    }

    fn apply(self, mem: &PhysMem, cpu: usize, lruvec: &mut LruvecGuard<'_>, folio: Folio) {
        match self {
            LruMove::Add => lru_add(mem, cpu, lruvec, folio),
            LruMove::Lazyfree => lru_lazyfree(mem, cpu, lruvec, folio),
        }
    }
}

/// `lru_add`: a folio onto the list its flags say, or, if it is mlocked,
/// onto the unevictable list (with no mlock count: the mlocks made while
/// it was off the LRU were not counted).
pub(crate) fn lru_add(mem: &PhysMem, cpu: usize, lruvec: &mut LruvecGuard<'_>, folio: Folio) {
    let head = folio.head(mem);
    let was_unevictable = head.test_and_clear(pg::UNEVICTABLE);
    let nr = folio.nr_pages(mem);
    if folio_evictable(mem, folio) {
        if was_unevictable {
            mem.vmstat.count(cpu, Event::UNEVICTABLE_PGRESCUED, nr);
        }
        lruvec.add_folio(folio);
    } else {
        head.clear(pg::ACTIVE);
        head.set(pg::UNEVICTABLE);
        lruvec.add_folio(folio);
        lruvec.set_mlock_count(folio, 0);
        if !was_unevictable {
            mem.vmstat.count(cpu, Event::UNEVICTABLE_PGCULLED, nr);
        }
    }
}

/// `lru_lazyfree`: a swap-backed anon folio becomes lazyfree: off its
/// anon list, inactive, unreferenced and no longer swap-backed, onto the
/// inactive file list, where reclaim may discard it while it is clean.
fn lru_lazyfree(mem: &PhysMem, cpu: usize, lruvec: &mut LruvecGuard<'_>, folio: Folio) {
    let head = folio.head(mem);
    if !folio.test_anon(mem) || !head.test(pg::SWAPBACKED) || head.test(pg::UNEVICTABLE) {
        return;
    }
    lruvec.del_folio(folio);
    head.clear(pg::ACTIVE | pg::REFERENCED | pg::SWAPBACKED);
    head.set(pg::LAZYFREE);
    lruvec.add_folio(folio);
    mem.vmstat
        .count(cpu, Event::PGLAZYFREE, folio.nr_pages(mem));
}

/// `folio_batch_move_lru`: apply `op` to every folio of a drained batch
/// under its lruvec's lock (taken once per run of one node's folios), then
/// drop the batch's references. A move between lists claims each folio by
/// clearing PG_lru first, and skips one that someone else took off
/// (isolated, or freed) meanwhile.
fn folio_batch_move_lru(mem: &PhysMem, cpu: usize, batch: &FolioBatch, op: LruMove) {
    let mut held = None;
    for folio in batch.iter() {
        let head = folio.head(mem);
        if op != LruMove::Add && !head.test_and_clear(pg::LRU) {
            continue;
        }
        let lruvec = mem.folio_lruvec_relock(&mut held, folio);
        op.apply(mem, cpu, lruvec, folio);
        head.set(pg::LRU);
    }
    drop(held);
    folios_put_refs(mem, batch.iter().map(|f| (f, 1)), cpu);
}

/// `folio_batch_add_and_move`: hold the folio in this CPU's batch for
/// `op`, and drain the batch if it is full, if the folio is large (large
/// folios are not cached, `folio_may_be_lru_cached`), or while the
/// batches are disabled.
fn folio_batch_add_and_move(mem: &PhysMem, cpu: usize, folio: Folio, op: LruMove) {
    folio.get(mem);
    let mut fb = mem.cpu_fbatches[cpu].lock();
    let batch = op.batch(&mut fb);
    if batch.add(folio) == 0 || folio.is_large(mem) || lru_cache_disabled(mem) {
        let full = batch.take();
        folio_batch_move_lru(mem, cpu, &full, op);
    }
}

/// `folio_add_lru`: a new folio, not yet on any list, goes onto one
/// through this CPU's batch.
pub fn folio_add_lru(mem: &PhysMem, folio: Folio, cpu: usize) {
    debug_assert!(
        !folio.head(mem).test(pg::LRU),
        "folio {:#x} added to the LRU twice",
        folio.pfn()
    );
    folio_batch_add_and_move(mem, cpu, folio, LruMove::Add);
}

/// `folio_add_lru_vma`: a new folio of a fault, for `vma`; a locked
/// VMA's goes to the unevictable list ([`crate::mlock`]).
pub fn folio_add_lru_vma(mem: &PhysMem, folio: Folio, vma: &Vma, cpu: usize) {
    if vma.flags() & crate::mm::vma::VM_LOCKED != 0 {
        crate::mlock::mlock_new_folio(mem, folio, cpu);
    } else {
        folio_add_lru(mem, folio, cpu);
    }
}

/// `folio_mark_accessed`: a folio seen used (a young entry zapped, a
/// page-cache lookup): referenced the first time. (The kernel activates
/// an inactive folio seen referenced twice; the model leaves that to
/// reclaim's look at the flag.)
pub fn folio_mark_accessed(mem: &PhysMem, folio: Folio) {
    let head = folio.head(mem);
    if !head.test(pg::REFERENCED) {
        head.set(pg::REFERENCED);
    }
}

/// `folio_mark_lazyfree` (MADV_FREE): an anon, swap-backed folio is moved
/// to the lazyfree list through this CPU's batch; `pglazyfree` counts it
/// when the batch drains.
pub fn folio_mark_lazyfree(mem: &PhysMem, folio: Folio, cpu: usize) {
    let head = folio.head(mem);
    if folio.test_anon(mem)
        && head.test(pg::SWAPBACKED)
        && head.test(pg::LRU)
        && !head.test(pg::UNEVICTABLE)
    {
        folio_batch_add_and_move(mem, cpu, folio, LruMove::Lazyfree);
    }
}

/// `lru_add_drain_cpu`: drain CPU `target`'s batches, in the kernel's
/// order, from CPU `cpu` (whose counters the moves count in).
fn lru_add_drain_cpu(mem: &PhysMem, target: usize, cpu: usize) {
    let mut fb = mem.cpu_fbatches[target].lock();
    for op in [LruMove::Add, LruMove::Lazyfree] {
        let batch = op.batch(&mut fb).take();
        if !batch.is_empty() {
            folio_batch_move_lru(mem, cpu, &batch, op);
        }
    }
    // mlock_drain_local / mlock_drain_remote.
    let batch = fb.mlock.take();
    if !batch.folios.is_empty() {
        crate::mlock::mlock_folio_batch(mem, cpu, &batch);
    }
}

/// `lru_add_drain`: drain this CPU's batches.
pub fn lru_add_drain(mem: &PhysMem, cpu: usize) {
    lru_add_drain_cpu(mem, cpu, cpu);
}

/// `lru_add_drain_all`: drain every CPU's batches, from CPU `cpu`.
pub fn lru_add_drain_all(mem: &PhysMem, cpu: usize) {
    for target in 0..mem.cpu_fbatches.len() {
        lru_add_drain_cpu(mem, target, cpu);
    }
}

/// `lru_cache_disabled`.
pub(crate) fn lru_cache_disabled(mem: &PhysMem) -> bool {
    mem.lru_disable_count.load(Ordering::Relaxed) > 0
}

/// While held, folios go straight onto the LRU lists (`lru_cache_disable`
/// to `lru_cache_enable`): migration holds it, so that no folio it wants
/// to isolate waits in a batch.
pub struct LruCacheDisabled<'a>(&'a PhysMem);

/// `lru_cache_disable`: stop batching, then drain every batch (the
/// kernel's synchronize_rcu between the two makes every CPU see the count
/// before the drain; here the batch locks order them).
pub fn lru_cache_disable(mem: &PhysMem, cpu: usize) -> LruCacheDisabled<'_> {
    mem.lru_disable_count.fetch_add(1, Ordering::Relaxed);
    lru_add_drain_all(mem, cpu);
    LruCacheDisabled(mem)
}

impl Drop for LruCacheDisabled<'_> {
    /// `lru_cache_enable`.
    fn drop(&mut self) {
        self.0.lru_disable_count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `folios_put_refs`: drop each folio's references; those that were the
/// last come off their LRU lists under one lruvec lock per run of one
/// node's folios, and then go back to the allocator
/// (`free_unref_folios`). The kernel works in chunks of a folio batch;
/// so does this.
pub fn folios_put_refs(mem: &PhysMem, folios: impl IntoIterator<Item = (Folio, i32)>, cpu: usize) {
    let mut freeing = FolioBatch::default();
    let mut held = None;
    for (folio, refs) in folios {
        if !folio.ref_sub_and_test(mem, refs) {
            continue;
        }
        mem.page_cache_release(&mut held, folio);
        if freeing.add(folio) == 0 {
            held = None;
            free_unref_folios(mem, &freeing.take(), cpu);
        }
    }
    drop(held);
    free_unref_folios(mem, &freeing, cpu);
}

/// `free_unref_folios`.
fn free_unref_folios(mem: &PhysMem, batch: &FolioBatch, cpu: usize) {
    for folio in batch.iter() {
        folio.free_frozen(mem, cpu);
    }
}

/// `folio_isolate_lru`: take a folio the caller holds off its LRU list,
/// with a reference for the isolation; false if it is on none (in a batch,
/// isolated by someone else, or being freed).
pub fn folio_isolate_lru(mem: &PhysMem, folio: Folio) -> bool {
    debug_assert!(folio.ref_count(mem) > 0, "isolating a free folio");
    if !folio.head(mem).test_and_clear(pg::LRU) {
        return false;
    }
    folio.get(mem);
    mem.folio_lruvec_lock(folio).del_folio(folio);
    true
}

/// `folio_putback_lru`: an isolated folio goes back onto the LRU (through
/// this CPU's batch), and the isolation's reference is dropped.
pub fn folio_putback_lru(mem: &PhysMem, folio: Folio, cpu: usize) {
    folio_add_lru(mem, folio, cpu);
    folio.put(mem, cpu);
}

/// The references the CPUs' batches hold, per folio (for the invariant
/// checker; takes each batch lock in turn).
pub fn lru_batch_refs(mem: &PhysMem) -> std::collections::HashMap<u64, i64> {
    let mut refs = std::collections::HashMap::new();
    for fb in mem.cpu_fbatches.iter() {
        for f in fb.lock().iter() {
            *refs.entry(f.pfn()).or_insert(0) += 1;
        }
    }
    refs
}
