//! MIGRC, the F3 seed (Byungchul Park, "Migration Read Copy", v8,
//! February 2024; not merged), selected by the tunable `migrc`.
//!
//! A demotion (`MR_DEMOTION`) or promotion (`MR_NUMA_MISPLACED`) of an
//! order-0 folio (with `migrc_large`, beyond the seed, of a large folio
//! mapped by PTEs too) that only clean, read-only PTEs mapped skips its TLB
//! flush. The source is kept, pinned by an extra reference, until some
//! later batched flush has covered every CPU that may still cache it: a
//! stale translation to the source reads the same bytes as the
//! destination, since no one could write either (the argument I1-I4 of
//! the seed: no CPU holds a writable translation; the destination was
//! copied after the PTEs were cleared; the only way to write it is a write
//! fault, which flushes first; and a path that removes or downgrades the
//! destination's PTE flushes its address, which removes the stale entry
//! too).
//!
//! The state is global, as in the seed: the CPUs whose flush is owed
//! (`migrc_ubc`) and the kept sources (`migrc_folios`), under one lock,
//! with the count of batched flushes in progress (`migrc_flushing`), which
//! makes a publication racing with a flush fall back to flushing now, and
//! a pause count for memory pressure. Each kept source counts in its
//! zone's `migrc_pending` and as free in watermark checks.
//!
//! Where the flush is forced: `do_wp_page` before any PTE can become
//! writable ([`migrc_flush_free_folios`]), an allocation from a zone short
//! of its watermark that holds kept sources, and the allocator's slow path
//! (which also pauses MIGRC). Any batched flush that covers the pending
//! CPUs releases the sources ([`Migrc::flush_end`]).
//!
//! Its successor LUF (the tunable's value `luf`) frees the source instead,
//! stamped with what it owes ([`crate::phys::luf`]); the forced flushes it
//! adds above the allocator are here ([`luf_flush_mm`]: after a fault in a
//! writable VMA, and at `tlb_end_vma`), and the weakened variants that
//! remove them are [`Weakened`]'s too.
//!
//! # Locking
//!
//! `state` is `migrc_lock`: the pending mask and the kept list change only
//! under it. `flushing` is raised (SeqCst, then a fence) before a batched
//! flush sends its IPIs and lowered under the lock after it is done. A
//! publication, after its PTE clears, fences and reads `flushing` under
//! the lock: either it sees the flush in progress and flushes now itself,
//! or that flush's IPIs come after the clears (the two SeqCst store-load
//! pairs cannot both miss), so that its end may rightly count the CPUs it
//! covered. Otherwise a flush sent before the clears, which a CPU
//! outlived by caching the PTE again, would release a source that CPU can
//! still read. `nr_kept` and `owed` mirror the state for a look without
//! the lock. Model-checked in `tests/loom_migrc.rs`, with the check
//! removed ([`Weakened::NoFlushingCheck`]) caught.

use crate::machine::OnCpu;

pub use crate::phys::migrc::{migrc_keep, migrc_release, Migrc, Weakened};

/// `migrc_flush_free_folios`: flush what is owed now and release every
/// kept source; whether any was kept. The shootdowns it sends are counted
/// under `why` as well (a model-only event: which point forced them).
pub fn migrc_flush_free_folios(oncpu: &OnCpu, why: crate::vmstat::Event) -> bool {
    let m = &oncpu.mem().migrc;
    if !m.pending() {
        return false;
    }
    let _account = crate::cpu::RemoteFlushAccount::enter(why);
    let (folios, cpumask) = m.take_for_flush();
    // A batched flush, bracketed (something is pending): its end clears
    // the CPUs it covered and releases what was kept meanwhile, if no
    // flush is owed any more.
    let mut ubc = crate::tlbbatch::TlbflushUnmapBatch::new();
    ubc.add_cpumask(cpumask);
    ubc.flush(oncpu);
    let any = !folios.is_empty();
    migrc_release(oncpu.mem(), folios, oncpu.id());
    any
}

/// LUF's forced flush for `mm` (v12's flush after a fault in a writable
/// VMA, and at `tlb_end_vma`): the CPUs its migrations left with stale
/// translations that have not flushed since are flushed now. Nothing is
/// sent when every one of them has (v12 skips flushes already done per
/// mm). Whether a flush was sent.
pub fn luf_flush_mm(oncpu: &OnCpu, mm: &crate::mm::Mm) -> bool {
    // Relaxed: a hint. The batch of a migration that this CPU must see is
    // ordered before its fault by the page-table lock under which the
    // migration put the new PTE in place.
    if !oncpu.mem().luf.used() {
        return false;
    }
    let batch = *mm.luf_batch.lock();
    if batch.ugen == 0 {
        return false;
    }
    let pending = oncpu.mem().luf.pending(batch);
    if pending == 0 {
        return false;
    }
    oncpu
        .vmstat()
        .count(oncpu.id(), crate::vmstat::Event::LUF_FORCED_FLUSH, 1);
    luf_flush_cpus(oncpu, pending);
    true
}

/// A full flush of `cpumask`'s TLBs, as a batched flush (which records
/// the generation it covered on each).
pub fn luf_flush_cpus(oncpu: &OnCpu, cpumask: u64) {
    let mut ubc = crate::tlbbatch::TlbflushUnmapBatch::new();
    ubc.add_cpumask(cpumask);
    ubc.flush(oncpu);
}
