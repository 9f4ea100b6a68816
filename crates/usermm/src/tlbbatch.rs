//! The batched unmap flush of mm/rmap.c (`struct tlbflush_unmap_batch`,
//! CONFIG_ARCH_WANT_BATCHED_UNMAP_TLB_FLUSH): an rmap walk that clears
//! PTEs of several folios, in several address spaces, queues their TLB
//! flush instead of flushing each, and flushes once for the batch
//! (`try_to_unmap_flush`) before anything may depend on it (copying the
//! pages, freeing them).
//!
//! A queued flush is the set of CPUs that may cache one of the address
//! spaces ([`crate::cpu::arch_tlbbatch_add_pending`]); the flush is a full
//! one on each. A PTE that no CPU can cache (`pte_accessible`: not present,
//! and not a PROT_NONE entry of an mm with a flush in progress) queues
//! nothing (4d4b6d66db, v6.4): NUMA hinting PTEs, already flushed when
//! they were made PROT_NONE, migrate without a flush.
//!
//! # Ordering against other PTE changes
//!
//! Until the batch is flushed, a CPU may still use a translation of a PTE
//! the batch cleared. Paths that change PTEs and decide from what they see
//! whether to flush (zap, mprotect, madvise) would see the entry already
//! gone and flush nothing; so each mm counts the batched flushes queued
//! for it and those completed (`tlb_flush_batched`), and those paths call
//! [`flush_tlb_batched_pending`] under the page-table lock first: if any
//! is outstanding, the whole mm is flushed there and then.

use crate::cpu;
use crate::machine::OnCpu;
use crate::mm::Mm;
use crate::pgtable::Pte;
use crate::sync::{Arc, Ordering};

/// `TLB_FLUSH_BATCH_FLUSHED_SHIFT`: the completed count's half.
const FLUSHED_SHIFT: u32 = 16;
/// `TLB_FLUSH_BATCH_PENDING_MASK`.
const PENDING_MASK: u32 = (1 << FLUSHED_SHIFT) - 1;
/// `TLB_FLUSH_BATCH_PENDING_LARGE`: past this, both counts restart (so
/// that the queued count never wraps onto the completed one).
const PENDING_LARGE: u32 = PENDING_MASK / 2;

/// `enum ttu_flags`, the one the model uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TtuFlags {
    /// `TTU_BATCH_FLUSH`: queue the flushes on the caller's batch.
    pub batch_flush: bool,
    /// `TTU_SPLIT_HUGE_PMD`: split a PMD that maps the folio and unmap its
    /// PTEs, rather than install a PMD migration entry (a folio about to
    /// be split).
    pub split_huge_pmd: bool,
}

/// An unmap's flush context: its `ttu_flags` and the calling task's batch
/// (`current->tlb_ubc`).
pub struct Ttu<'u> {
    pub flags: TtuFlags,
    pub ubc: &'u mut TlbflushUnmapBatch,
}

impl Ttu<'_> {
    /// The flush of a PTE just cleared from `mm` at `addr`: queued on the
    /// batch (`set_tlb_ubc_flush_pending`) if the unmap batches and another
    /// CPU may cache it, else done now if any CPU may (`ptep_clear_flush`).
    pub fn flush_cleared_pte(&mut self, oncpu: &OnCpu, mm: &Arc<Mm>, pteval: Pte, addr: u64) {
        if should_defer_flush(oncpu, mm, self.flags) {
            self.ubc.set_flush_pending(mm, pteval);
        } else if pte_accessible(mm, pteval) {
            oncpu.flush_tlb_page(mm, addr);
        }
    }
}

/// `struct tlbflush_unmap_batch`: the calling task's queued flush.
///
/// With MIGRC tracking on ([`Self::can_migrc_init`]), the flushes of clean
/// read-only PTEs are queued apart (`tlb_ubc_ro`), so that a migration may
/// defer them ([`crate::migrc`]); anything else queued clears `can_migrc`.
#[derive(Debug, Default)]
pub struct TlbflushUnmapBatch {
    /// `arch.cpumask`: the CPUs to flush.
    cpumask: u64,
    /// Some PTE was queued.
    flush_required: bool,
    /// Some PTE queued was dirty: writeback must wait for the flush.
    writable: bool,
    /// `tlb_ubc_ro`: the CPUs that may cache a clean read-only PTE queued
    /// while tracking, and whether any was.
    ro_cpumask: u64,
    ro_flush_required: bool,
    /// Tracking for MIGRC (`can_migrc_init` was called).
    track_ro: bool,
    /// `can_migrc`: every PTE queued while tracking was clean and
    /// read-only.
    can_migrc: bool,
    /// The address spaces of the read-only queue (LUF records its
    /// generation in each).
    ro_mms: Vec<Arc<Mm>>,
    /// Tests only ([`crate::migrc::Weakened::LufNoMmFlush`]): the
    /// read-only queue does not count in `tlb_flush_batched`.
    ro_uncounted: bool,
}

impl TlbflushUnmapBatch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a flush is queued.
    pub fn flush_required(&self) -> bool {
        self.flush_required
    }

    /// `set_tlb_ubc_flush_pending`: `pteval` was cleared from `mm`
    /// without a flush; queue one, if any CPU may cache it.
    pub fn set_flush_pending(&mut self, mm: &Arc<Mm>, pteval: Pte) {
        if !pte_accessible(mm, pteval) {
            return;
        }
        if self.track_ro && !pteval.write() && !pteval.dirty() {
            cpu::arch_tlbbatch_add_pending(&mut self.ro_cpumask, &**mm);
            self.ro_flush_required = true;
            if !self.ro_mms.iter().any(|m| Arc::ptr_eq(m, mm)) {
                self.ro_mms.push(mm.clone());
            }
            if self.ro_uncounted {
                return;
            }
        } else {
            cpu::arch_tlbbatch_add_pending(&mut self.cpumask, &**mm);
            self.flush_required = true;
            self.can_migrc = false;
        }
        // The queued count moves after the PTE was cleared (the kernel's
        // barrier()): a flush_tlb_batched_pending that sees the count also
        // sees the PTE gone. Relaxed RMWs on one word are ordered with each
        // other; the PTE store before them is ordered by the page-table lock
        // that both sides hold.
        let mut batch = mm.tlb_flush_batched.load(Ordering::Relaxed);
        loop {
            if batch & PENDING_MASK > PENDING_LARGE {
                match mm.tlb_flush_batched.compare_exchange(
                    batch,
                    1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(now) => batch = now,
                }
            } else {
                mm.tlb_flush_batched.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        if pteval.dirty() {
            self.writable = true;
        }
    }

    /// `can_migrc_init`: track the next folio's PTEs for MIGRC (`on`), or
    /// stop tracking.
    pub fn can_migrc_init(&mut self, on: bool) {
        self.fold_ro();
        self.track_ro = on;
        self.can_migrc = on;
    }

    /// Tests only: leave the read-only queue out of `tlb_flush_batched`.
    pub fn set_ro_uncounted(&mut self, on: bool) {
        self.ro_uncounted = on;
    }

    /// Whether the folio unmapped since [`Self::can_migrc_init`] may defer
    /// its flush: only clean read-only PTEs, and at least one of them.
    pub fn can_migrc(&self) -> bool {
        self.track_ro && self.can_migrc && self.ro_flush_required
    }

    /// Whether the folio unmapped since [`Self::can_migrc_init`] was
    /// tracked and a dirty or writable PTE of it queued a flush
    /// (`can_migrc_fail`).
    pub fn can_migrc_failed(&self) -> bool {
        self.track_ro && !self.can_migrc
    }

    /// Take the read-only queue's CPUs (for the caller to owe them).
    pub fn take_ro(&mut self) -> u64 {
        self.ro_flush_required = false;
        self.ro_mms.clear();
        std::mem::take(&mut self.ro_cpumask)
    }

    /// Take the read-only queue: its CPUs, and the address spaces whose
    /// PTEs it cleared.
    pub fn take_ro_mms(&mut self) -> (u64, Vec<Arc<Mm>>) {
        let mms = std::mem::take(&mut self.ro_mms);
        (self.take_ro(), mms)
    }

    /// `fold_ubc(tlb_ubc, tlb_ubc_ro)`: the read-only queue joins the main.
    pub fn fold_ro(&mut self) {
        if self.ro_flush_required {
            let cpus = self.take_ro();
            self.add_cpumask(cpus);
        }
    }

    /// Queue a flush of every CPU of `cpumask` (`arch_tlbbatch_fold`).
    pub fn add_cpumask(&mut self, cpumask: u64) {
        if cpumask != 0 {
            self.cpumask |= cpumask;
            self.flush_required = true;
        }
    }

    /// `try_to_unmap_flush`: flush what is queued, on every CPU at once.
    /// With MIGRC, the flush is bracketed (`migrc_flush_start`/`_end`) and
    /// releases the kept sources once no CPU owes a flush.
    pub fn flush(&mut self, oncpu: &OnCpu) {
        self.fold_ro();
        if !self.flush_required {
            return;
        }
        let migrc = &oncpu.mem().migrc;
        let bracket = oncpu.m.tunables.migrc() || migrc.pending();
        if bracket {
            migrc.flush_start();
        }
        // LUF: the generation this full flush covers, read before its
        // IPIs, recorded on its CPUs once they are done.
        let luf = oncpu
            .m
            .tunables
            .luf()
            .then(|| oncpu.mem().luf.flush_start());
        cpu::arch_tlbbatch_flush(&oncpu.m.cpus, oncpu.cpu, self.cpumask, oncpu.vmstat());
        if let Some(ugen) = luf {
            oncpu.mem().luf.flush_done(self.cpumask, ugen);
        }
        if bracket {
            let released = migrc.flush_end(self.cpumask);
            crate::migrc::migrc_release(oncpu.mem(), released, oncpu.id());
        }
        self.cpumask = 0;
        self.flush_required = false;
        self.writable = false;
    }

    /// `try_to_unmap_flush_dirty`: flush only if a dirty PTE is queued.
    pub fn flush_dirty(&mut self, oncpu: &OnCpu) {
        if self.writable {
            self.flush(oncpu);
        }
    }
}

impl Drop for TlbflushUnmapBatch {
    fn drop(&mut self) {
        debug_assert!(
            !(self.flush_required || self.ro_flush_required) || std::thread::panicking(),
            "a batched unmap flush was queued and never flushed"
        );
    }
}

/// `pte_accessible` (x86): may a CPU cache a translation of `pte`? A
/// present one, yes; a PROT_NONE one only while a flush of its mm is in
/// progress (it may just have been made PROT_NONE).
pub fn pte_accessible(mm: &Mm, pte: Pte) -> bool {
    if pte.present() && !pte.protnone() {
        return true;
    }
    pte.protnone() && mm.tlb_flush_pending.load(Ordering::Acquire) > 0
}

/// `should_defer_flush`: queue this mm's flush on the batch only if asked
/// to and another CPU may cache the mm; else flush at once (locally).
pub fn should_defer_flush(oncpu: &OnCpu, mm: &Mm, flags: TtuFlags) -> bool {
    flags.batch_flush && cpu::arch_tlbbatch_should_defer(oncpu.cpu, mm)
}

/// `flush_tlb_batched_pending`: called with a PTE lock of `mm` held by a
/// path about to change its PTEs: if a batched flush queued for `mm` has
/// not been done, flush the whole mm now and record it done (unless
/// another was queued meanwhile, which must then be flushed too).
pub fn flush_tlb_batched_pending(oncpu: &OnCpu, mm: &Arc<Mm>) {
    let batch = mm.tlb_flush_batched.load(Ordering::Acquire);
    let pending = batch & PENDING_MASK;
    let flushed = batch >> FLUSHED_SHIFT;
    if pending != flushed {
        oncpu.flush_tlb_mm(mm);
        let _ = mm.tlb_flush_batched.compare_exchange(
            batch,
            pending | (pending << FLUSHED_SHIFT),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}
