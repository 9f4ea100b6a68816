//! MIGRC's state (the tunable `migrc`; see [`crate::migrc`] for the
//! design): the CPUs that owe a flush and the sources kept until it is
//! made, which the allocator counts free in its watermark checks and pauses
//! while it is short of memory. Data and its protocol only: the forced
//! flushes that send IPIs are [`crate::migrc`]'s, above this layer.
//!
//! # Locking
//!
//! See [`crate::migrc`]: `state` is `migrc_lock`; `flushing` is raised
//! before a batched flush's IPIs and lowered under the lock after.

use super::{Folio, PhysMem};
use crate::sync::checked::{AtomicU64, Mutex};
use crate::sync::Ordering;

/// A deliberately broken MIGRC, for the oracle's tests: each variant drops
/// one rule the seed's argument needs, and the shadow memory must report
/// what follows. Only a build with the feature `mutants` (which the
/// crate's tests enable) can set one; in any other [`Migrc::weakened`] is
/// `None` as a constant, and the checks on it compile away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Weakened {
    /// MIGRC as the seed has it.
    None = 0,
    /// `do_wp_page` does not flush what is owed (I4 broken): a page made
    /// writable is written while another CPU still reads its source.
    NoWpFlush = 1,
    /// The source is freed at once, not kept (I1 broken): a stale entry
    /// reads whatever the page's next owner stores.
    FreeSource = 2,
    /// A publication does not look at `migrc_flushing` (steps 3 and 7): a
    /// flush in flight may release what it never covered.
    NoFlushingCheck = 3,
    /// A forced flush clears the owed mask before its flush is done (as
    /// the seed's `migrc_flush_free_folios` does): meanwhile a refused
    /// publication or a write fault sees nothing owed.
    ForcedFlushForgets = 4,
    /// LUF frees the source without its stamp: the page is handed out
    /// again with no flush (the takeoff check sees nothing owed).
    LufNoTakeoffFlush = 5,
    /// LUF makes no forced flush after a fault in a writable VMA.
    LufNoFaultFlush = 6,
    /// LUF makes no forced flush at the end of a VMA's unmap
    /// (`tlb_end_vma`).
    LufNoEndVmaFlush = 7,
    /// LUF makes neither of those two forced flushes, and the unmaps that
    /// defer their flush do not count in `tlb_flush_batched` either (so
    /// that `flush_tlb_batched_pending` does not flush for them).
    LufNoMmFlush = 8,
}

/// The global MIGRC state of a machine.
///
/// Its lock and atomics are [`crate::sync::checked`]'s, so that
/// `tests/loom_migrc.rs` model-checks this very code.
#[derive(Default)]
pub struct Migrc {
    state: Mutex<MigrcState>,
    /// `migrc_flushing`: batched flushes in progress.
    flushing: AtomicU64,
    /// `migrc_pause_cnt`: allocations under pressure; no new deferral
    /// while it is above zero.
    pause: AtomicU64,
    /// The kept list's length and the owed mask, mirrored for a look
    /// without the lock (written under it).
    nr_kept: AtomicU64,
    owed: AtomicU64,
    /// The most sources kept at once.
    kept_peak: AtomicU64,
    /// Tests only: [`Weakened`]. A std atomic: set before the threads
    /// start, it is not part of the protocol the model checker explores.
    #[cfg(feature = "mutants")]
    weakened: std::sync::atomic::AtomicU8,
}

#[derive(Default)]
struct MigrcState {
    /// `migrc_ubc`: the CPUs that owe a flush for the kept sources.
    cpumask: u64,
    /// `migrc_folios`.
    folios: Vec<Folio>,
}

impl Migrc {
    /// Tests only: break MIGRC as `w` says.
    #[cfg(feature = "mutants")]
    pub fn set_weakened(&self, w: Weakened) {
        self.weakened.store(w as u8, Ordering::Relaxed);
    }

    /// The variant in force: always [`Weakened::None`] outside tests.
    #[inline(always)]
    pub fn weakened(&self) -> Weakened {
        #[cfg(feature = "mutants")]
        return match self.weakened.load(Ordering::Relaxed) {
            1 => Weakened::NoWpFlush,
            2 => Weakened::FreeSource,
            3 => Weakened::NoFlushingCheck,
            4 => Weakened::ForcedFlushForgets,
            5 => Weakened::LufNoTakeoffFlush,
            6 => Weakened::LufNoFaultFlush,
            7 => Weakened::LufNoEndVmaFlush,
            8 => Weakened::LufNoMmFlush,
            _ => Weakened::None,
        };
        #[cfg(not(feature = "mutants"))]
        Weakened::None
    }

    /// Whether a publication must be refused: a batched flush is in
    /// progress (the caller holds the lock).
    fn flush_in_progress(&self) -> bool {
        // SeqCst, after a SeqCst fence: the caller's PTE clears come before
        // this load, and flush_start's increment before its IPIs; of the
        // two store-load pairs one must see the other (Dekker), so either
        // the flush is seen here, or its IPIs come after those clears.
        crate::sync::checked::fence(Ordering::SeqCst);
        self.flushing.load(Ordering::SeqCst) > 0 && self.weakened() != Weakened::NoFlushingCheck
    }

    /// `migrc_paused`.
    pub fn paused(&self) -> bool {
        self.pause.load(Ordering::Relaxed) > 0
    }

    /// `migrc_pause` / `migrc_resume`.
    pub fn pause(&self) {
        self.pause.fetch_add(1, Ordering::Relaxed);
    }

    pub fn resume(&self) {
        self.pause.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether any source is kept or any flush owed.
    pub fn pending(&self) -> bool {
        // Relaxed: a hint for the forced-flush points, which run on the
        // CPU that would use what they look for: a publication by another
        // CPU is ordered before this CPU's next use of the migrated page
        // by the page-table lock of the migration entry's removal.
        self.nr_kept.load(Ordering::Relaxed) > 0 || self.owed.load(Ordering::Relaxed) != 0
    }

    /// The sources kept now.
    pub fn kept(&self) -> Vec<Folio> {
        self.state.lock().folios.clone()
    }

    /// The most sources kept at once.
    pub fn kept_peak(&self) -> u64 {
        self.kept_peak.load(Ordering::Relaxed)
    }

    /// The CPUs that owe a flush now.
    pub fn owed(&self) -> u64 {
        self.owed.load(Ordering::Relaxed)
    }

    /// `migrc_add_pending_ubc`: owe the flush of `cpumask`. Refused (false:
    /// the caller flushes now) while a batched flush is in progress, whose
    /// end might otherwise miss it.
    pub fn add_pending_ubc(&self, cpumask: u64) -> bool {
        let mut s = self.state.lock();
        if self.flush_in_progress() {
            return false;
        }
        s.cpumask |= cpumask;
        self.owed.store(s.cpumask, Ordering::Relaxed);
        true
    }

    /// `migrc_add_pending_folios`: keep `folios` until the owed flush is
    /// done. Refused (given back) while a batched flush is in progress.
    pub fn add_pending_folios(&self, folios: Vec<Folio>) -> Result<(), Vec<Folio>> {
        let mut s = self.state.lock();
        if self.flush_in_progress() {
            return Err(folios);
        }
        s.folios.extend(folios);
        let n = s.folios.len() as u64;
        self.nr_kept.store(n, Ordering::Relaxed);
        if n > self.kept_peak.load(Ordering::Relaxed) {
            self.kept_peak.store(n, Ordering::Relaxed);
        }
        Ok(())
    }

    /// `migrc_flush_start`: a batched flush is about to be sent.
    pub fn flush_start(&self) {
        // SeqCst, then a fence: before the IPIs (see flush_in_progress).
        self.flushing.fetch_add(1, Ordering::SeqCst);
        crate::sync::checked::fence(Ordering::SeqCst);
    }

    /// `migrc_flush_end`: the CPUs of `flushed` were flushed in full; if
    /// no CPU still owes a flush, every kept source is released (returned,
    /// for [`migrc_release`]).
    pub fn flush_end(&self, flushed: u64) -> Vec<Folio> {
        let mut s = self.state.lock();
        s.cpumask &= !flushed;
        self.owed.store(s.cpumask, Ordering::Relaxed);
        let released = if s.cpumask == 0 {
            self.nr_kept.store(0, Ordering::Relaxed);
            std::mem::take(&mut s.folios)
        } else {
            Vec::new()
        };
        // Under the lock: a publication that comes after sees it lowered.
        self.flushing.fetch_sub(1, Ordering::Release);
        released
    }

    /// For a forced flush: every kept source, taken, and the CPUs that owe
    /// a flush, read. The owed mask stays until the forced flush's own end
    /// ([`Migrc::flush_end`]) clears what it covered: a CPU that looks
    /// meanwhile (a write fault, a refused publication) must still see a
    /// flush owed and make one itself, or it would act as if no CPU could
    /// read a source that the forced flush has not reached yet.
    /// (Weakened to [`Weakened::ForcedFlushForgets`], the mask is cleared
    /// here, as the seed's `fold_ubc` into the caller's batch does.)
    pub fn take_for_flush(&self) -> (Vec<Folio>, u64) {
        let mut s = self.state.lock();
        self.nr_kept.store(0, Ordering::Relaxed);
        let folios = std::mem::take(&mut s.folios);
        if self.weakened() == Weakened::ForcedFlushForgets {
            self.owed.store(0, Ordering::Relaxed);
            return (folios, std::mem::take(&mut s.cpumask));
        }
        (folios, s.cpumask)
    }
}

/// Keep a migrated source: the extra reference that pins it, and its
/// zone's count. (Weakened to [`Weakened::FreeSource`], it is not kept.)
pub fn migrc_keep(mem: &PhysMem, folio: Folio) {
    folio.get(mem);
    mem.nodes[folio.nid()]
        .zone
        .migrc_pending
        .fetch_add(folio.nr_pages(mem), Ordering::Relaxed);
}

/// Release kept sources: their zones' counts, and the extra reference,
/// the last, which frees each straight to the buddy lists.
pub fn migrc_release(mem: &PhysMem, folios: Vec<Folio>, cpu: usize) {
    for f in folios {
        mem.nodes[f.nid()]
            .zone
            .migrc_pending
            .fetch_sub(f.nr_pages(mem), Ordering::Relaxed);
        f.put_nopcp(mem, cpu);
    }
}
