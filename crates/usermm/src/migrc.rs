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
use crate::mm::Mm;
use crate::phys::luf::LufBatch;
use crate::phys::Folio;
use crate::sync::Arc;
use crate::tlbbatch::TlbflushUnmapBatch;
use crate::tunable::MigrcMode;
use crate::vmstat::Event;

pub use crate::phys::migrc::{migrc_keep, migrc_release, Migrc, Weakened};

/// What one migration batch defers: the seam through which MIGRC and LUF
/// hook the kernel's unmap, flush, move sequence (`migrate_pages_batch`),
/// one value per setting of the tunable `migrc`, read once a batch. Four
/// hooks: before and after each folio's unmap ([`Self::unmap_begin`],
/// [`Self::unmap_end`]), before the batch's one flush ([`Self::settle`]),
/// and as each source is done with ([`source_moved`]) and the sources kept
/// are handed over ([`migrc_add_pending_folios`]). With `off`, the kernel,
/// none does anything.
pub(crate) enum BatchDeferral {
    /// Every PTE the batch clears is flushed with it (the kernel).
    Off,
    /// MIGRC (`migrc`; `migrc_large` with `large`): the CPUs whose flush
    /// the batch owes (`pending_ubc`).
    Migrc { pending: u64, large: bool },
    /// LUF: the same, and the address spaces the PTEs were cleared from.
    Luf { pending: u64, mms: Vec<Arc<Mm>> },
}

/// What the batch does about one unmapped folio's flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deferred {
    /// Nothing: its PTEs are flushed with the batch.
    No,
    /// Owed, until [`BatchDeferral::settle`] decides how.
    Owed,
    /// MIGRC: the source is kept until the owed flush is done.
    Keep,
    /// LUF: the source is freed, its pages stamped with this batch.
    Stamp(LufBatch),
}

impl BatchDeferral {
    /// The deferral of a batch of a migration that may defer (`do_migrc`:
    /// the tunable, and a demotion or promotion) and that batches its
    /// flush; the kernel's otherwise.
    pub(crate) fn new(
        oncpu: &OnCpu,
        do_migrc: bool,
        batch_flush: bool,
        ubc: &mut TlbflushUnmapBatch,
    ) -> BatchDeferral {
        ubc.set_ro_uncounted(oncpu.mem().migrc.weakened() == Weakened::LufNoMmFlush);
        if !do_migrc || !batch_flush {
            return BatchDeferral::Off;
        }
        match oncpu.m.tunables.migrc_mode() {
            MigrcMode::Off => BatchDeferral::Off,
            MigrcMode::Migrc => BatchDeferral::Migrc {
                pending: 0,
                large: false,
            },
            MigrcMode::MigrcLarge => BatchDeferral::Migrc {
                pending: 0,
                large: true,
            },
            MigrcMode::Luf => BatchDeferral::Luf {
                pending: 0,
                mms: Vec::new(),
            },
        }
    }

    /// Before `folio` is unmapped (`can_migrc_init`): whether its clean
    /// read-only PTEs are queued apart, to be owed rather than flushed. The
    /// seed's order-0 rule (any order with `migrc_large`), and for MIGRC
    /// not while it is paused.
    pub(crate) fn unmap_begin(&self, oncpu: &OnCpu, ubc: &mut TlbflushUnmapBatch, folio: Folio) {
        let small = || folio.order(oncpu.mem()) == 0;
        let may = match self {
            BatchDeferral::Off => false,
            BatchDeferral::Migrc { large, .. } => {
                !oncpu.mem().migrc.paused() && (*large || small())
            }
            BatchDeferral::Luf { .. } => small(),
        };
        ubc.can_migrc_init(may);
    }

    /// After the unmap: whether the folio's flush is owed (it was
    /// unmapped, and only clean read-only PTEs mapped it), its CPUs (and
    /// for LUF its address spaces) joining the batch's; a folio that was
    /// tracked but had a dirty or writable PTE counts `can_migrc_fail`.
    pub(crate) fn unmap_end(
        &mut self,
        oncpu: &OnCpu,
        ubc: &mut TlbflushUnmapBatch,
        unmapped: bool,
    ) -> Deferred {
        let owed = unmapped && ubc.can_migrc();
        if unmapped && ubc.can_migrc_failed() {
            oncpu
                .vmstat()
                .count(oncpu.id(), Event::MIGRC_CAN_MIGRC_FAIL, 1);
        }
        if owed {
            let (cpus, cleared_from) = ubc.take_ro_mms();
            match self {
                BatchDeferral::Off => debug_assert!(false, "nothing is tracked with migrc off"),
                BatchDeferral::Migrc { pending, .. } => *pending |= cpus,
                BatchDeferral::Luf { pending, mms } => {
                    *pending |= cpus;
                    mms.extend(cleared_from);
                }
            }
        }
        ubc.can_migrc_init(false);
        if owed {
            Deferred::Owed
        } else {
            Deferred::No
        }
    }

    /// Before the batch's one flush, settle what is owed. LUF: the
    /// sources' pages and the address spaces owe it, under a generation
    /// drawn now that the PTEs are clear. MIGRC (`migrc_add_pending_ubc`):
    /// the CPUs owe it, unless MIGRC was paused meanwhile or a batched
    /// flush is under way; then it joins this flush and no source is kept.
    /// Where no CPU may cache the PTEs, nothing is owed.
    pub(crate) fn settle<'d>(
        &mut self,
        oncpu: &OnCpu,
        ubc: &mut TlbflushUnmapBatch,
        deferred: impl Iterator<Item = &'d mut Deferred>,
    ) {
        let owed = deferred.filter(|d| **d == Deferred::Owed);
        match self {
            BatchDeferral::Luf { pending, mms } if *pending != 0 => {
                let batch = luf_owe(oncpu, *pending, mms);
                owed.for_each(|d| *d = Deferred::Stamp(batch));
            }
            BatchDeferral::Migrc { pending, .. } if *pending != 0 => {
                let m = &oncpu.mem().migrc;
                let keep = !m.paused() && m.add_pending_ubc(*pending);
                if !keep {
                    ubc.add_cpumask(*pending);
                }
                let to = if keep { Deferred::Keep } else { Deferred::No };
                owed.for_each(|d| *d = to);
            }
            _ => owed.for_each(|d| *d = Deferred::No),
        }
    }
}

/// A moved folio's source, once its PTEs point to the destination: MIGRC
/// keeps it, pinned, until the owed flush is done (returned, for
/// [`migrc_add_pending_folios`]); LUF lets it be freed, its pages stamped
/// with the owed flush. (Each unless a test broke that rule on purpose.)
pub(crate) fn source_moved(oncpu: &OnCpu, src: Folio, deferred: Deferred) -> Option<Folio> {
    let mem = oncpu.mem();
    match deferred {
        Deferred::Keep if mem.migrc.weakened() != Weakened::FreeSource => {
            migrc_keep(mem, src);
            Some(src)
        }
        Deferred::Stamp(batch) => {
            luf_free_owed(oncpu, src, batch);
            None
        }
        _ => None,
    }
}

/// LUF: the batch that owes the flush of `cpumask`, under a generation
/// drawn now that the PTEs are clear, recorded in each address space they
/// were cleared from. Migration and reclaim's discards both owe so.
pub(crate) fn luf_owe(oncpu: &OnCpu, cpumask: u64, mms: &[Arc<Mm>]) -> LufBatch {
    let batch = LufBatch {
        cpumask,
        ugen: oncpu.mem().luf.new_ugen(),
    };
    for mm in mms {
        mm.luf_batch.lock().fold(batch);
    }
    batch
}

/// LUF: `folio` is freed with its flush owed, its pages stamped with
/// `batch`, so that no page of it is handed out again before the stamped
/// CPUs have flushed (unless a test broke that rule on purpose).
pub(crate) fn luf_free_owed(oncpu: &OnCpu, folio: Folio, batch: LufBatch) {
    let mem = oncpu.mem();
    // Model-only: a folio freed with its flush owed.
    oncpu.vmstat().count(oncpu.id(), Event::LUF_DEFERRED, 1);
    if mem.migrc.weakened() != Weakened::LufNoTakeoffFlush {
        mem.luf_stamp(folio.pfn(), folio.nr_pages(mem), batch);
    }
}

/// `migrc_add_pending_folios`: the batch's kept sources wait for the owed
/// flush; refused while a batched flush is under way, the owed flush is
/// made now and the sources go.
pub(crate) fn migrc_add_pending_folios(oncpu: &OnCpu, kept: Vec<Folio>) {
    if kept.is_empty() {
        return;
    }
    if let Err(kept) = oncpu.mem().migrc.add_pending_folios(kept) {
        migrc_flush_free_folios(oncpu, Event::MIGRC_FLUSH_REFUSED);
        migrc_release(oncpu.mem(), kept, oncpu.id());
    }
}

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
