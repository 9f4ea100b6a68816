//! Page faults, zapping and freeing page tables (mm/memory.c).
//!
//! # Faults
//!
//! [`handle_mm_fault`] runs under the lock [`crate::fault`] chose (mmap_lock
//! for reading today). It allocates the upper tables, tries the PMD path for
//! a THP-eligible empty PMD, and otherwise handles the PTE: an empty one
//! gets the zero page (read) or a new folio whose order the mTHP knobs
//! choose (write, `alloc_anon_folio`); a present read-only one under a write
//! gets COW or reuse (`do_wp_page`). The handlers carry their state in a
//! [`VmFault`] and say how they ended with a [`VmFaultResult`]. Every PTE
//! change is made under the PTE lock after re-reading the entry; if it
//! changed, the handler returns `Raced` and the access is retried.
//!
//! # Zapping
//!
//! [`unmap_vmas`] walks the range level by level into [`zap_pte_range`],
//! which clears present PTEs under the PTE lock, records the TLB range, drops
//! the rmap, and queues the page in the mmu_gather. This is the kernel's
//! pre-v6.9 algorithm: one PTE, one rmap removal, one gather entry at a time.
//! When the gather fills, the TLB is flushed before the PTE lock is dropped
//! and the pages are freed after.
//!
//! With the `zap_batch` tunable on (v6.9's F2), a run of PTEs that map
//! consecutive pages of one large folio ([`folio_pte_batch`]) is zapped as a
//! unit: one TLB-range record, one rmap removal, one reference drop, and one
//! two-slot folio fragment in the gather.
//!
//! # Fork
//!
//! [`copy_page_range`] copies a VMA's page tables into a fork child:
//! present PTEs are shared and, for COW mappings, write-protected in both.
//! With the `fork_batch` tunable on (v6.9's F1), `copy_present_ptes` copies
//! a run of PTEs of one large folio with one reference and one rmap
//! duplication; off, it is the pre-v6.9 per-PTE `copy_present_pte`.

use crate::errno::{Errno, KResult};
use crate::huge_memory;
use crate::machine::{OnCpu, ThpMode};
use crate::mm::mmap_lock::MmLockSeq;
use crate::mm::vma::{VM_HUGEPAGE, VM_MAYSHARE, VM_MAYWRITE, VM_NOHUGEPAGE, VM_SHARED, VM_WRITE};
use crate::mm::{Mm, MmCounter, Vma, NR_MM_COUNTERS};
use crate::mmu_gather::MmuGather;
use crate::pgtable::swapops::{Migration, SwpEntry, SwpKind};
use crate::pgtable::{
    self, addr_end, Pmd, PmdSlot, Ptdesc, Pte, PteLocked, PteRead, PMD_SIZE, PUD_SIZE,
};
use crate::phys::AllocFlags;
use crate::phys::{folio, Folio, Pfn, PhysMem, HPAGE_PMD_ORDER, PAGE_SHIFT, PAGE_SIZE};
use crate::pt_reclaim::{ReclaimPath, ReclaimPt};
use crate::rmap;
use crate::rmap::{anon_vma_prepare, RmapFlags};
use crate::sync::Arc;
use crate::vmstat::{Event, MthpStat};

/// `FAULT_FLAG_*`: what a fault needs to know about the access.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultFlags(u32);

impl FaultFlags {
    /// `FAULT_FLAG_WRITE`: the access was a store.
    pub const WRITE: FaultFlags = FaultFlags(1 << 0);
    /// `FAULT_FLAG_TRIED`: the fault was given up once already
    /// (`VM_FAULT_RETRY`) and is being taken again.
    pub const TRIED: FaultFlags = FaultFlags(1 << 5);
    /// `FAULT_FLAG_USER`: the access came from user mode.
    pub const USER: FaultFlags = FaultFlags(1 << 6);
    /// `FAULT_FLAG_VMA_LOCK`: the fault holds its VMA's read lock, not
    /// mmap_lock (v6.4).
    pub const VMA_LOCK: FaultFlags = FaultFlags(1 << 12);
    /// `FAULT_FLAG_SPECULATIVE` (the seed): the fault holds no lock; what
    /// it read is valid only if `mm_lock_seq` still equals `vmf.seq` once
    /// the PTE lock is held.
    pub const SPECULATIVE: FaultFlags = FaultFlags(1 << 13);

    #[inline]
    pub const fn empty() -> FaultFlags {
        FaultFlags(0)
    }
    #[inline]
    pub const fn contains(self, other: FaultFlags) -> bool {
        self.0 & other.0 == other.0
    }
    #[inline]
    pub fn write(self) -> bool {
        self.contains(FaultFlags::WRITE)
    }
}

impl std::ops::BitOr for FaultFlags {
    type Output = FaultFlags;
    fn bitor(self, rhs: FaultFlags) -> FaultFlags {
        FaultFlags(self.0 | rhs.0)
    }
}

/// `vm_fault_t`: how a fault handler ended.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmFaultResult {
    /// The fault mapped, upgraded or marked what it was asked to.
    Done,
    /// The entry changed under the handler (another CPU faulted it, a zap
    /// or a split ran): nothing was done and the access is simply retried.
    /// The kernel returns 0 for these too; the model tells them apart.
    Raced,
    /// The huge path declined (`VM_FAULT_FALLBACK`): the caller tries the
    /// PTE level.
    Fallback,
    /// The handler gave up the lock it ran under (`VM_FAULT_RETRY`): the
    /// fault is taken again with mmap_lock.
    Retry,
    /// No memory (`VM_FAULT_OOM`).
    Oom,
    /// No mapping allows the access (`VM_FAULT_SIGSEGV`).
    Sigsegv,
    /// The page lies at or past the end of its file (`VM_FAULT_SIGBUS`).
    Sigbus,
}

impl VmFaultResult {
    /// Whether the access may be retried now: done or raced.
    #[inline]
    pub fn handled(self) -> bool {
        matches!(self, VmFaultResult::Done | VmFaultResult::Raced)
    }
}

impl From<Errno> for VmFaultResult {
    /// `vmf_error`: ENOMEM is OOM, anything else SIGSEGV (SIGBUS in the
    /// kernel for some; there is no such error in the model).
    fn from(e: Errno) -> Self {
        if e == Errno::ENOMEM {
            VmFaultResult::Oom
        } else if e == Errno::SIGBUS {
            VmFaultResult::Sigbus
        } else {
            VmFaultResult::Sigsegv
        }
    }
}

/// `struct vm_fault`: the state one fault carries down its handlers.
pub struct VmFault<'a> {
    pub oncpu: &'a OnCpu<'a>,
    pub mm: &'a Arc<Mm>,
    /// The VMA the fault is in (today under mmap_lock; a snapshot when the
    /// fault runs without it).
    pub vma: &'a Arc<Vma>,
    /// The faulting address, rounded down to its page.
    pub address: u64,
    /// The faulting address as the CPU reported it.
    pub real_address: u64,
    pub flags: FaultFlags,
    /// The PMD entry over the address (`vmf->pmd`).
    pub pmd: PmdSlot,
    /// The PMD as the handler first saw it (`vmf->orig_pmd`).
    pub orig_pmd: Pmd,
    /// The PTE as the handler first saw it (`vmf->orig_pte`), none until
    /// the PTE level reads it.
    pub orig_pte: Pte,
    /// `vmf->seq` (the seed): `mm_lock_seq` when a speculative fault began.
    pub seq: u32,
}

impl<'a> VmFault<'a> {
    /// A fault at `addr` in `vma`, under the PMD entry `pmd`; the levels
    /// below fill in what they read.
    fn new(
        oncpu: &'a OnCpu<'a>,
        mm: &'a Arc<Mm>,
        vma: &'a Arc<Vma>,
        addr: u64,
        flags: FaultFlags,
        pmd: PmdSlot,
    ) -> VmFault<'a> {
        VmFault {
            oncpu,
            mm,
            vma,
            address: addr & !(PAGE_SIZE - 1),
            real_address: addr,
            flags,
            pmd,
            orig_pmd: Pmd(0),
            orig_pte: Pte(0),
            seq: 0,
        }
    }

    #[inline]
    fn write(&self) -> bool {
        self.flags.write()
    }
    #[inline]
    pub fn speculative(&self) -> bool {
        self.flags.contains(FaultFlags::SPECULATIVE)
    }

    /// Count why a speculative fault gives up, and give up: the fault is
    /// taken again under mmap_lock.
    pub(crate) fn spf_abort(&self, why: Event) -> VmFaultResult {
        self.oncpu.vmstat().count(self.oncpu.id(), why, 1);
        VmFaultResult::Retry
    }

    /// `pte_offset_map_lock` for a fault; for a speculative one, the seed's
    /// `pte_map_lock` ([`SpfCommit::pte_map_lock`]), its aborts counted.
    /// Err(Raced) if the table went (non-speculative), Err(Retry) on abort.
    pub(crate) fn pte_map_lock(&self) -> Result<PteLocked<'a>, VmFaultResult> {
        let mm: &'a Arc<Mm> = self.mm;
        if !self.speculative() {
            return mm.pte_offset_map_lock(self.pmd).ok_or(VmFaultResult::Raced);
        }
        let commit = SpfCommit::new(&mm.mmap_lock.seq, self.seq);
        commit
            .pte_map_lock(&mm.mem, self.pmd, self.orig_pmd)
            .map_err(|why| self.spf_abort(why.event()))
    }
    #[inline]
    fn pte_idx(&self) -> usize {
        pgtable::pte_index(self.address)
    }
}

/// Why a speculative fault could not commit (the seed's
/// `SPF_ABORT_PTE_MAP_LOCK_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpfAbort {
    /// An mmap writer began before the lock was tried.
    Seq1,
    /// The PMD no longer holds the table the walk read.
    Pmd,
    /// The PTE lock was held. (The seed never waits for it: a zap may hold
    /// it while it waits for a flush the speculating CPU, IRQs off, cannot
    /// take. A model CPU in a fault takes no flush and makes no flusher wait,
    /// so the trylock is kept for the seed's behaviour, not for safety.)
    Ptl,
    /// An mmap writer began while the lock was being taken.
    Seq2,
}

impl SpfAbort {
    /// Its vmstat counter.
    pub fn event(self) -> Event {
        match self {
            SpfAbort::Seq1 => Event::SPF_ABORT_PTE_MAP_LOCK_SEQ1,
            SpfAbort::Pmd => Event::SPF_ABORT_PTE_MAP_LOCK_PMD,
            SpfAbort::Ptl => Event::SPF_ABORT_PTE_MAP_LOCK_PTL,
            SpfAbort::Seq2 => Event::SPF_ABORT_PTE_MAP_LOCK_SEQ2,
        }
    }
}

/// The commit of a speculative fault: the `mm_lock_seq` section it began
/// in. Model-checked in `tests/loom_spf.rs`.
pub struct SpfCommit<'s> {
    seq: &'s MmLockSeq,
    start: u32,
    /// Model checking only: skip the check after the lock is taken, to show
    /// that the checker catches a commit into a range a writer unmapped.
    #[cfg(loom)]
    pub broken_skip_seq2: bool,
}

impl<'s> SpfCommit<'s> {
    pub fn new(seq: &'s MmLockSeq, start: u32) -> SpfCommit<'s> {
        SpfCommit {
            seq,
            start,
            #[cfg(loom)]
            broken_skip_seq2: false,
        }
    }

    /// The seed's `pte_map_lock` (and `pte_spinlock`): lock the PTE table
    /// under `pmd` only if no mmap writer began since the fault did
    /// (`..._SEQ1`), the PMD is still `orig_pmd` (`..._PMD`, checked again
    /// under the lock, as `__pte_offset_map_lock` does since PT reclaim
    /// frees tables under mmap_lock for reading), the PTE lock can be had
    /// without waiting (`..._PTL`), and again no writer (`..._SEQ2`). Once this returns the lock, a writer that
    /// changes the range must take it too, after the fault is done.
    pub fn pte_map_lock<'m>(
        &self,
        mem: &'m PhysMem,
        pmd: PmdSlot,
        orig_pmd: Pmd,
    ) -> Result<PteLocked<'m>, SpfAbort> {
        if !self.seq.read_check(self.start) {
            return Err(SpfAbort::Seq1);
        }
        let pt = pmd.pte_map_trylock(mem, orig_pmd).map_err(|e| match e {
            pgtable::TrylockFail::PmdChanged => SpfAbort::Pmd,
            pgtable::TrylockFail::Contended => SpfAbort::Ptl,
        })?;
        #[cfg(loom)]
        if self.broken_skip_seq2 {
            return Ok(pt);
        }
        if !self.seq.read_check(self.start) {
            return Err(SpfAbort::Seq2);
        }
        Ok(pt)
    }
}

/// `vm_normal_page`: the page behind a present PTE, or None for special
/// mappings (the zero page).
#[inline]
pub fn vm_normal_page(pte: Pte) -> Option<Pfn> {
    (!pte.special()).then(|| pte.pfn())
}

/// `thp_vma_allowable_orders`: the orders in `mask` that the knobs and the
/// VMA's flags allow (bit n set = order n allowed).
pub fn thp_vma_allowable_orders(oncpu: &OnCpu, vma: &Vma, mask: u32) -> u32 {
    let flags = vma.flags();
    if flags & VM_NOHUGEPAGE != 0 {
        return 0;
    }
    let knobs = &oncpu.m.thp;
    let global = knobs.enabled();
    let madv = flags & VM_HUGEPAGE != 0;
    let mut orders = 0;
    for order in 2..=HPAGE_PMD_ORDER {
        let ok = match knobs.order(order) {
            ThpMode::Always => true,
            ThpMode::Madvise => madv,
            ThpMode::Inherit => global == ThpMode::Always || (global == ThpMode::Madvise && madv),
            ThpMode::Never => false,
        };
        if ok {
            orders |= 1 << order;
        }
    }
    orders & mask
}

/// `thp_vma_suitable_order`: the naturally aligned block around `addr` lies
/// inside the VMA (and, in a file VMA, maps a naturally aligned block of
/// the file).
#[inline]
pub fn thp_vma_suitable_order(vma: &Vma, addr: u64, order: u32) -> bool {
    let size = PAGE_SIZE << order;
    // A file VMA's offsets must agree with its addresses modulo the size.
    if !vma.is_anonymous()
        && !((vma.start() >> PAGE_SHIFT) - vma.pgoff()).is_multiple_of(1 << order)
    {
        return false;
    }
    let start = addr & !(size - 1);
    start >= vma.start() && start + size <= vma.end()
}

/// `handle_mm_fault`: the VMA contains `addr` and permits the access; the
/// caller holds what keeps the VMA stable (mmap_lock for reading, or the
/// VMA's read lock with [`FaultFlags::VMA_LOCK`]).
pub fn handle_mm_fault<'a>(
    oncpu: &'a OnCpu<'a>,
    mm: &'a Arc<Mm>,
    vma: &'a Arc<Vma>,
    addr: u64,
    flags: FaultFlags,
) -> VmFaultResult {
    let vvar = vma
        .special()
        .is_some_and(|sm| !std::ptr::eq(sm, &crate::vdso::VDSO_MAPPING));
    let pmd = match mm.pmd_alloc(addr, oncpu.id()) {
        Ok(slot) => slot,
        Err(e) => return mm_account_fault(oncpu, e.into()),
    };
    let mut vmf = VmFault::new(oncpu, mm, vma, addr, flags, pmd);
    if vvar {
        return mm_account_fault(oncpu, crate::vdso::vvar_fault(&mut vmf));
    }
    let r = mm_account_fault(oncpu, __handle_mm_fault(&mut vmf));
    luf_flush_after_fault(oncpu, mm, vma, flags);
    r
}

/// LUF's forced flush at the end of `handle_mm_fault` (v12): after a write
/// fault, or any fault in a VMA that is or may become writable, no CPU may
/// keep a stale translation that this mm's migrations left, since a page
/// of the VMA may now be written (or be about to be, by a CPU that walks
/// the new PTE). v12 flushes after the fault is handled, not before the
/// PTE changes; every CPU that writes the page faults first (its
/// translation was read-only or absent) and makes this flush too before
/// it returns, save one that walks the new PTE before the flush is done.
fn luf_flush_after_fault(oncpu: &OnCpu, mm: &Mm, vma: &Vma, flags: FaultFlags) {
    use crate::migrc::Weakened;
    if !flags.write() && vma.flags() & (VM_WRITE | VM_MAYWRITE) == 0 {
        return;
    }
    if matches!(
        oncpu.mem().migrc.weakened(),
        Weakened::LufNoFaultFlush | Weakened::LufNoMmFlush
    ) {
        return;
    }
    crate::migrc::luf_flush_mm(oncpu, mm);
}

/// `mm_account_fault`: a fault that was not given up for a retry counts
/// in `pgfault`, once however many tries it took, and whether it
/// succeeded or failed (OOM, SIGSEGV): the kernel keeps `pgfault` as older
/// kernels counted it, where a task's `min_flt`/`maj_flt` (which the model
/// does not keep) count only the faults that succeeded.
fn mm_account_fault(oncpu: &OnCpu, r: VmFaultResult) -> VmFaultResult {
    debug_assert!(
        r != VmFaultResult::Fallback,
        "a fallback is the handler's own"
    );
    if r != VmFaultResult::Retry {
        oncpu.vmstat().count(oncpu.id(), Event::PGFAULT, 1);
    }
    r
}

/// `handle_mm_fault` with `FAULT_FLAG_SPECULATIVE` (the seed): no lock is
/// held, `vma` was read under the caller's epoch pin in the section `seq`
/// of `mm_lock_seq`. The walk allocates nothing and reads each level once,
/// aborting where a table is missing or a PMD is huge; the PTE level runs
/// the usual handlers, which commit through [`VmFault::pte_map_lock`].
/// Retry: aborted (the reason counted), redo under mmap_lock.
pub fn handle_mm_fault_speculative<'a>(
    oncpu: &'a OnCpu<'a>,
    mm: &'a Arc<Mm>,
    vma: &'a Arc<Vma>,
    addr: u64,
    flags: FaultFlags,
    seq: u32,
) -> VmFaultResult {
    let mem = oncpu.mem();
    let Some(pmd) = mm.pgd.pmd_lookup(mem, addr) else {
        oncpu.vmstat().count(oncpu.id(), Event::SPF_ABORT_PUD, 1);
        return VmFaultResult::Retry;
    };
    let mut vmf = VmFault::new(oncpu, mm, vma, addr, flags | FaultFlags::SPECULATIVE, pmd);
    vmf.orig_pmd = pmd.get(mem);
    vmf.seq = seq;
    // No table allocation, no huge PMD path: a PMD that is not a PTE table
    // sends the fault the classic way.
    if !pgtable::pmd_is_table(vmf.orig_pmd) {
        return vmf.spf_abort(Event::SPF_ABORT_PMD);
    }
    let r = mm_account_fault(oncpu, handle_pte_fault(&mut vmf));
    if r.handled() {
        luf_flush_after_fault(oncpu, mm, vma, flags);
    }
    r
}

/// `__handle_mm_fault` below the PMD allocation: the huge paths, then the
/// PTE level.
fn __handle_mm_fault(vmf: &mut VmFault<'_>) -> VmFaultResult {
    let (oncpu, vma) = (vmf.oncpu, vmf.vma);
    vmf.orig_pmd = vmf.mm.pmd_get(vmf.pmd);
    if vmf.orig_pmd.is_swap() {
        // pmd_migration_entry_wait: the access is retried once the
        // migration has put the new PMD in place.
        pmd_migration_entry_wait(vmf);
        return VmFaultResult::Raced;
    }
    if vmf.orig_pmd.none()
        && vma.is_anonymous()
        && thp_vma_allowable_orders(oncpu, vma, 1 << HPAGE_PMD_ORDER) != 0
        && thp_vma_suitable_order(vma, vmf.address, HPAGE_PMD_ORDER)
    {
        // create_huge_pmd
        let r = huge_memory::do_huge_pmd_anonymous_page(vmf);
        if r != VmFaultResult::Fallback {
            return r;
        }
        vmf.orig_pmd = vmf.mm.pmd_get(vmf.pmd);
    }
    if vmf.orig_pmd.trans_huge() {
        if vmf.orig_pmd.protnone() && vma.flags() & crate::mm::vma::VM_ACCESS_FLAGS != 0 {
            return huge_memory::do_huge_pmd_numa_page(vmf);
        }
        if vmf.write() && !vmf.orig_pmd.write() {
            // wp_huge_pmd
            if vma.is_anonymous() {
                let r = huge_memory::do_huge_pmd_wp_page(vmf);
                if r != VmFaultResult::Fallback {
                    return r;
                }
            } else {
                // COW or write-notify is handled at the PTE level: the
                // file PMD goes, and the fault maps again.
                huge_memory::split_huge_pmd(oncpu, vmf.mm, vmf.pmd, vmf.address);
            }
            // Split: the PTE level handles the write.
        } else {
            return huge_pmd_set_accessed(vmf);
        }
        vmf.orig_pmd = vmf.mm.pmd_get(vmf.pmd);
    }
    if !vma.is_anonymous() && vmf.orig_pmd.none() {
        // do_pte_missing with no PTE table: the file fault allocates one
        // only if it maps by PTEs.
        vmf.orig_pte = Pte(0);
        return do_fault(vmf);
    }
    if let Err(e) = vmf.mm.pte_alloc(
        vmf.pmd,
        oncpu.id(),
        crate::pt_reclaim::new_pte_tracking(oncpu),
    ) {
        return e.into();
    }
    handle_pte_fault(vmf)
}

/// `huge_pmd_set_accessed`: a huge PMD that allows the access was not in
/// the TLB (or lacked the accessed or dirty bit): mark it.
fn huge_pmd_set_accessed(vmf: &mut VmFault<'_>) -> VmFaultResult {
    let mut ptl = vmf.mm.pmd_lock(vmf.pmd);
    let pmd = ptl.get();
    if pmd != vmf.orig_pmd {
        return VmFaultResult::Raced;
    }
    // touch_pmd.
    let new = if vmf.write() && pmd.write() {
        pmd.mkyoung().mkdirty()
    } else {
        pmd.mkyoung()
    };
    ptl.set_access_flags(new, vmf.write());
    VmFaultResult::Done
}

/// `handle_pte_fault`.
fn handle_pte_fault(vmf: &mut VmFault<'_>) -> VmFaultResult {
    if vmf.speculative() {
        return handle_pte_fault_speculative(vmf);
    }
    let Some(pt) = vmf.mm.pte_offset_map_lock(vmf.pmd) else {
        // The table went away or became huge under us: retry the access.
        // A dead tracked table (`pte_ref`) is freed first, so that the
        // retry can allocate a new one.
        if vmf.pmd.pte_table_is_dead(vmf.oncpu.mem()) {
            crate::pt_reclaim::free_dead_user_ptes(vmf.oncpu, vmf.mm, vmf.address, vmf.address + 1);
        }
        return VmFaultResult::Raced;
    };
    let idx = vmf.pte_idx();
    vmf.orig_pte = pt.pte(idx);
    if vmf.orig_pte.none() {
        drop(pt);
        // do_pte_missing
        if vmf.vma.is_anonymous() {
            return do_anonymous_page(vmf);
        }
        return do_fault(vmf);
    }
    if !vmf.orig_pte.present() {
        drop(pt);
        return do_swap_page(vmf);
    }
    if vmf.orig_pte.protnone() {
        // The VMA is accessible (the access was checked): a NUMA hinting
        // entry.
        return do_numa_page(vmf, pt);
    }
    handle_present_pte(vmf, pt)
}

/// `do_numa_page`: a fault on a NUMA hinting entry. Count it; a hot folio
/// on a slow tier is promoted to this CPU's node (its migration puts a
/// normal entry back); otherwise the entry is restored where it is.
fn do_numa_page<'a>(vmf: &mut VmFault<'a>, mut pt: PteLocked<'a>) -> VmFaultResult {
    use crate::numa_balancing::{numa_migrate_check, task_numa_fault, NumaHint, TaskNumaFault};
    let oncpu = vmf.oncpu;
    let mem = oncpu.mem();
    let idx = vmf.pte_idx();
    let old = vmf.orig_pte;
    let folio = mem.page_folio(old.pfn());
    let mut fault = TaskNumaFault::new(oncpu, folio);
    match numa_migrate_check(oncpu, vmf.mm, vmf.vma, folio) {
        NumaHint::Migrate(dst) => {
            // migrate_misplaced_folio_prepare: isolated under the PTE lock.
            let Some(iso) = crate::migrate::isolate_for_migration(mem, folio) else {
                return numa_restore_and_record(
                    vmf,
                    pt,
                    TaskNumaFault {
                        migrate_fail: true,
                        ..fault
                    },
                );
            };
            drop(pt);
            if crate::migrate::migrate_misplaced_folio(oncpu, iso, dst) {
                task_numa_fault(oncpu, vmf.mm, TaskNumaFault { nid: dst, ..fault });
                return VmFaultResult::Done;
            }
            fault.migrate_fail = true;
            // Not migrated: restore the entry, if it is still ours (if not,
            // the fault is not recorded either).
            pt = match vmf.pte_map_lock() {
                Ok(pt) => pt,
                Err(r) => return r,
            };
            if pt.pte(idx) != old {
                return VmFaultResult::Raced;
            }
        }
        NumaHint::Refused => fault.migrate_fail = true,
        NumaHint::Stay => {}
    }
    numa_restore_and_record(vmf, pt, fault)
}

/// The end of [`do_numa_page`] for a folio left where it is: the entry
/// restored, and the fault recorded (`task_numa_fault`) once the lock is
/// dropped.
fn numa_restore_and_record<'a>(
    vmf: &mut VmFault<'a>,
    mut pt: PteLocked<'a>,
    fault: crate::numa_balancing::TaskNumaFault,
) -> VmFaultResult {
    use crate::numa_balancing::{numa_restore_pte, task_numa_fault};
    let idx = vmf.pte_idx();
    // Keep an accessed or dirty bit set by a racing walker.
    let cur = pt.modify_prot_start(idx);
    pt.modify_prot_commit(idx, numa_restore_pte(vmf.oncpu, vmf.vma, cur));
    drop(pt);
    task_numa_fault(vmf.oncpu, vmf.mm, fault);
    VmFaultResult::Done
}

/// `handle_pte_fault` of a speculative fault: the PTE is read without a
/// lock (the seed's walk), then handled as usual, the lock taken by
/// [`VmFault::pte_map_lock`]. Non-present entries (migration entries and
/// markers: the model has no swap) abort.
fn handle_pte_fault_speculative(vmf: &mut VmFault<'_>) -> VmFaultResult {
    let vmstat = vmf.oncpu.vmstat();
    let Some(pt) = vmf.mm.pte_offset_map(vmf.pmd) else {
        return vmf.spf_abort(Event::SPF_ABORT_PMD);
    };
    vmf.orig_pte = pt.pte(vmf.pte_idx());
    drop(pt);
    if vmf.orig_pte.none() {
        vmstat.count(vmf.oncpu.id(), Event::SPF_ATTEMPT_ANON, 1);
        return do_anonymous_page(vmf);
    }
    if !vmf.orig_pte.present() || vmf.orig_pte.protnone() {
        // A NUMA hinting entry is handled under a lock (the seed aborts
        // on what it does not handle).
        return vmf.spf_abort(Event::SPF_ABORT_NON_SWAP_ENTRY);
    }
    let event = if vmf.write() && !vmf.orig_pte.write() {
        Event::SPF_ATTEMPT_WP
    } else {
        Event::SPF_ATTEMPT_PTE
    };
    vmstat.count(vmf.oncpu.id(), event, 1);
    let pt = match vmf.pte_map_lock() {
        Ok(pt) => pt,
        Err(r) => return r,
    };
    if pt.pte(vmf.pte_idx()) != vmf.orig_pte {
        return VmFaultResult::Raced;
    }
    handle_present_pte(vmf, pt)
}

/// The present-PTE end of `handle_pte_fault`, the PTE lock held: COW or
/// reuse for a write to a read-only entry, else the accessed and dirty
/// bits.
fn handle_present_pte(vmf: &mut VmFault<'_>, mut pt: PteLocked<'_>) -> VmFaultResult {
    let idx = vmf.pte_idx();
    if vmf.write() && !vmf.orig_pte.write() {
        return do_wp_page(vmf, pt);
    }
    let pte = vmf.orig_pte;
    let entry = if vmf.write() {
        pte.mkyoung().mkdirty()
    } else {
        pte.mkyoung()
    };
    if !pt.set_access_flags(idx, entry, vmf.write()) && vmf.write() {
        // A spurious write fault: the entry allowed the write already, and
        // the CPU faulted on a stale read-only TLB entry (Intel's MMU does
        // not walk again first). `flush_tlb_fix_spurious_fault`, which x86
        // leaves to the generic `flush_tlb_page`: every CPU of the mm
        // forgets the page, not only this one (whose fault dropped it).
        drop(pt);
        let a = vmf.address;
        vmf.oncpu.flush_tlb_page(vmf.mm, a);
    }
    VmFaultResult::Done
}

/// `do_swap_page`, for the non-present entries the model makes: a
/// migration entry waits for the migration to end (`migration_entry_wait`:
/// the access is retried); a guard marker is SIGSEGV, a poisoned one SIGBUS
/// (SIGSEGV here too: the model has no SIGBUS). (An uffd-wp marker alone
/// would read as an empty entry; nothing makes one without userfaultfd.)
fn do_swap_page(vmf: &mut VmFault<'_>) -> VmFaultResult {
    use pgtable::swapops::{PTE_MARKER_GUARD, PTE_MARKER_POISONED};
    match vmf.orig_pte.swp_entry().kind() {
        SwpKind::Migration { .. } => {
            migration_entry_wait(vmf);
            VmFaultResult::Raced
        }
        SwpKind::Marker(bits) if bits & (PTE_MARKER_GUARD | PTE_MARKER_POISONED) != 0 => {
            VmFaultResult::Sigsegv
        }
        other => unreachable!("{other:?}: swap, device memory and userfaultfd are not modelled"),
    }
}

/// `migration_entry_wait`: the kernel sleeps on the folio's lock, which
/// the migration holds until the entry is replaced; the model yields until
/// the entry has changed (or its table has gone), then the access is
/// retried.
fn migration_entry_wait(vmf: &VmFault<'_>) {
    let idx = vmf.pte_idx();
    loop {
        std::thread::yield_now();
        let Some(pt) = vmf.mm.pte_offset_map(vmf.pmd) else {
            return;
        };
        if pt.pte(idx) != vmf.orig_pte {
            return;
        }
    }
}

/// `pmd_migration_entry_wait`: as [`migration_entry_wait`], for a PMD
/// migration entry.
fn pmd_migration_entry_wait(vmf: &VmFault<'_>) {
    while vmf.mm.pmd_get(vmf.pmd) == vmf.orig_pmd {
        std::thread::yield_now();
    }
}

/// `vmf_anon_prepare`: the VMA's anon_vma, made if it has none yet. Making
/// one looks at the neighbouring VMAs, which a fault under a VMA lock has
/// not locked: it takes mmap_lock for reading too if it can without
/// waiting, else it gives up and is taken again under mmap_lock
/// (`VM_FAULT_RETRY`; v6.10+, before which it always gave up). A
/// speculative fault aborts (the seed's `SPF_ABORT_ANON_VMA`).
pub(crate) fn vmf_anon_prepare(vmf: &VmFault<'_>) -> Result<(), VmFaultResult> {
    if vmf.vma.anon_vma().is_some() {
        return Ok(());
    }
    if vmf.speculative() {
        return Err(vmf.spf_abort(Event::SPF_ABORT_ANON_VMA));
    }
    let _mmap = if vmf.flags.contains(FaultFlags::VMA_LOCK) {
        Some(vmf.mm.mmap_lock.try_read().ok_or(VmFaultResult::Retry)?)
    } else {
        None
    };
    anon_vma_prepare(vmf.mm, vmf.vma);
    Ok(())
}

/// `alloc_anon_folio`: the largest allowed, suitable order whose PTEs are all
/// empty, falling back order by order; order 0 last. Returns the folio and
/// the address of its first page; Raced if the PTE table went away under
/// the lockless look (the kernel's `-EAGAIN`).
fn alloc_anon_folio(vmf: &VmFault<'_>) -> Result<(Folio, u64), VmFaultResult> {
    let (oncpu, vma, addr) = (vmf.oncpu, vmf.vma, vmf.address);
    let mem = oncpu.mem();
    let mut orders = thp_vma_allowable_orders(oncpu, vma, (1 << HPAGE_PMD_ORDER) - 1);
    orders &= (0..HPAGE_PMD_ORDER)
        .filter(|&o| thp_vma_suitable_order(vma, addr, o))
        .fold(0, |m, o| m | 1 << o);
    if orders != 0 {
        // Drop orders whose range is not all empty (a lockless look, as the
        // kernel's; rechecked under the PTL when mapping).
        let Some(pt) = vmf.mm.pte_offset_map(vmf.pmd) else {
            return Err(VmFaultResult::Raced);
        };
        let mut o = 31 - orders.leading_zeros();
        while orders != 0 {
            let start = addr & !((PAGE_SIZE << o) - 1);
            let i0 = pgtable::pte_index(start);
            if pt.range_none(i0..i0 + (1 << o)) {
                break;
            }
            orders &= !(1 << o);
            o = if orders == 0 {
                0
            } else {
                31 - orders.leading_zeros()
            };
        }
        drop(pt);
        while orders != 0 {
            let o = 31 - orders.leading_zeros();
            if let Some(f) = crate::mempolicy::vma_alloc_folio(
                oncpu,
                vmf.mm,
                vmf.vma,
                vmf.address & !((PAGE_SIZE << o) - 1),
                o,
                crate::huge_memory::vma_thp_gfp_mask(vmf.vma),
            ) {
                mem.vmstat.mod_mthp(o, MthpStat::ANON_FAULT_ALLOC, 1);
                return Ok((f, addr & !((PAGE_SIZE << o) - 1)));
            }
            mem.vmstat.mod_mthp(o, MthpStat::ANON_FAULT_FALLBACK, 1);
            orders &= !(1 << o);
        }
    }
    let f =
        crate::mempolicy::vma_alloc_folio(oncpu, vmf.mm, vmf.vma, vmf.address, 0, AllocFlags::ZERO)
            .ok_or(VmFaultResult::Oom)?;
    Ok((f, addr))
}

/// Map the zero page, read-only and special (no reference, no RSS), at
/// the fault's address: Raced where something is mapped there already.
pub(crate) fn map_zero_page_special(vmf: &mut VmFault<'_>) -> VmFaultResult {
    if let Err(e) = vmf.mm.pte_alloc(
        vmf.pmd,
        vmf.oncpu.id(),
        crate::pt_reclaim::new_pte_tracking(vmf.oncpu),
    ) {
        return e.into();
    }
    set_zero_page_pte(vmf)
}

/// Map the shared zero page read-only at the fault's address, its PTE
/// table there already; no RSS, no reference. Raced where the entry is
/// no longer empty.
fn set_zero_page_pte(vmf: &mut VmFault<'_>) -> VmFaultResult {
    let pte = Pte::new(vmf.oncpu.m.zero_pfn, vmf.vma.page_prot()).mkspecial();
    let mut pt = match vmf.pte_map_lock() {
        Ok(pt) => pt,
        Err(r) => return r,
    };
    let idx = vmf.pte_idx();
    if !pt.pte(idx).none() {
        return VmFaultResult::Raced;
    }
    pt.set(idx, pte);
    VmFaultResult::Done
}

/// `do_anonymous_page`.
fn do_anonymous_page(vmf: &mut VmFault<'_>) -> VmFaultResult {
    let (oncpu, mm, vma) = (vmf.oncpu, vmf.mm, vmf.vma);
    let mem = oncpu.mem();
    if !vmf.write() {
        return set_zero_page_pte(vmf);
    }
    if let Err(r) = vmf_anon_prepare(vmf) {
        return r;
    }
    let (folio, start) = match alloc_anon_folio(vmf) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let nr = folio.nr_pages(mem);
    let mut pt = match vmf.pte_map_lock() {
        Ok(pt) => pt,
        Err(r) => {
            folio.put(mem, oncpu.id());
            return r;
        }
    };
    let i0 = pgtable::pte_index(start);
    if (i0..i0 + nr as usize).any(|i| !pt.pte(i).none()) {
        // Someone else faulted part of the range in: retry.
        drop(pt);
        folio.put(mem, oncpu.id());
        return VmFaultResult::Raced;
    }
    rmap::folio_add_new_anon_rmap(mem, folio, vma, start, RmapFlags::EXCLUSIVE);
    crate::swap::folio_add_lru_vma(mem, folio, vma, oncpu.id());
    folio.ref_add(mem, nr as i32 - 1);
    mm.add_rss(MmCounter::AnonPages, nr as i64);
    let mut pte = Pte::new(folio.pfn(), vma.page_prot()).mkdirty();
    if vma.flags() & VM_WRITE != 0 {
        pte = pte.mkwrite();
    }
    pt.set_ptes(i0, pte, nr as usize);
    VmFaultResult::Done
}

/// `do_wp_page`: a write to a present read-only PTE of a writable VMA,
/// with the PTE lock held.
fn do_wp_page(vmf: &mut VmFault<'_>, mut pt: PteLocked<'_>) -> VmFaultResult {
    let oncpu = vmf.oncpu;
    let mem = oncpu.mem();
    let orig = vmf.orig_pte;
    let page = vm_normal_page(orig);
    if page.is_some() && oncpu.mem().migrc.weakened() != crate::migrc::Weakened::NoWpFlush {
        // MIGRC: before any PTE can become writable, no CPU may keep a
        // stale translation of a kept source (the seed flushes whatever
        // is owed, on any write-protect fault).
        crate::migrc::migrc_flush_free_folios(oncpu, crate::vmstat::Event::MIGRC_FLUSH_WP_FAULT);
    }
    if vmf.vma.flags() & (VM_SHARED | VM_MAYSHARE) != 0 {
        if let Some(page) = page {
            return wp_page_shared(vmf, pt, mem.page_folio(page));
        }
    }
    if let Some(page) = page.filter(|&p| mem.page_folio(p).test_anon(mem)) {
        let f = mem.page_folio(page);
        let reuse =
            folio::page_anon_exclusive(mem, page) || wp_can_reuse_anon_folio(oncpu, f, vmf.vma);
        if reuse {
            // wp_page_reuse: an upgrade, no flush needed.
            folio::set_page_anon_exclusive(mem, page);
            pt.set(vmf.pte_idx(), orig.mkyoung().mkdirty().mkwrite());
            oncpu.vmstat().count(oncpu.id(), Event::WP_REUSE, 1);
            return VmFaultResult::Done;
        }
    }
    // The copy is made outside the PTE lock: hold the old folio (the
    // kernel's folio_get), so that a zap running meanwhile (MADV_DONTNEED
    // takes mmap_lock for reading too) cannot free it under the copy.
    let held = page.map(|p| {
        let f = mem.page_folio(p);
        f.ref_add(mem, 1);
        f
    });
    drop(pt);
    let r = wp_page_copy(vmf, page);
    if let Some(f) = held {
        f.put(mem, oncpu.id());
    }
    r
}

/// `wp_can_reuse_anon_folio`: a small folio that this mapping alone
/// holds may be written in place. A folio not yet on the LRU may sit in
/// this CPU's batch, whose reference is not a user's: drain it first (a
/// remote CPU's batch still counts, as in the kernel). The last check is
/// made under the folio lock (one that migration or reclaim holds makes
/// the fault copy), and the folio then moves to this VMA's own anon_vma
/// (`folio_move_anon_rmap`), so that rmap walks need not look beyond it.
fn wp_can_reuse_anon_folio(oncpu: &OnCpu, f: Folio, vma: &Vma) -> bool {
    let mem = oncpu.mem();
    if f.is_large(mem) {
        // Before v6.15 (tunable wp_reuse_large off) a large folio was never
        // reused: the page is copied, and the folio given back sooner.
        return oncpu.m.tunables.wp_reuse_large() && wp_can_reuse_large_anon_folio(mem, f);
    }
    if f.ref_count(mem) > 3 {
        return false;
    }
    if !f.head(mem).test(crate::phys::pg::LRU) {
        crate::swap::lru_add_drain(mem, oncpu.id());
    }
    if f.ref_count(mem) > 1 || !f.trylock(mem) {
        return false;
    }
    let reuse = f.ref_count(mem) == 1;
    if reuse {
        rmap::folio_move_anon_rmap(mem, f, vma);
    }
    f.unlock(mem);
    reuse
}

/// `__wp_can_reuse_large_anon_folio` (v6.15): a large folio that only
/// this address space maps (its MM-owner slots say "mapped exclusively")
/// and that nothing but its mappings references may be written in place,
/// one page at a time; a folio mapped by one PTE alone is copied instead,
/// so that the rest of it can be freed. Large folios never wait in an LRU
/// batch, so there is none to drain.
fn wp_can_reuse_large_anon_folio(mem: &PhysMem, f: Folio) -> bool {
    if f.mapcount(mem) <= 1 {
        return false;
    }
    if f.counters(mem).maybe_mapped_shared_bit() || f.mapcount(mem) != f.ref_count(mem) {
        return false;
    }
    // Again, with the mapcount stable: an rmap change could have slipped
    // between the two reads (a reference is taken before a mapping is
    // added, and dropped after one is removed).
    rmap::with_large_mapcount_locked(mem, f, |shared, mapcount| {
        !shared && mapcount == f.ref_count(mem)
    })
}

/// `wp_page_copy`: give this mapping its own copy of the page (of zeroes
/// when it mapped the zero page).
fn wp_page_copy(vmf: &mut VmFault<'_>, old: Option<Pfn>) -> VmFaultResult {
    let (oncpu, mm, vma) = (vmf.oncpu, vmf.mm, vmf.vma);
    let mem = oncpu.mem();
    if let Err(r) = vmf_anon_prepare(vmf) {
        return r;
    }
    // A copy of the zero page is a zeroed page; any other is overwritten.
    let gfp = AllocFlags::NONE.zeroed_if(old.is_none());
    let Some(new) = crate::mempolicy::vma_alloc_folio(oncpu, mm, vma, vmf.address, 0, gfp) else {
        return VmFaultResult::Oom;
    };
    if let Some(old) = old {
        mem.copy_page(new.pfn(), old);
    }
    let mut pt = match vmf.pte_map_lock() {
        Ok(pt) => pt,
        Err(r) => {
            new.put(mem, oncpu.id());
            return r;
        }
    };
    let idx = vmf.pte_idx();
    if pt.pte(idx) != vmf.orig_pte {
        drop(pt);
        new.put(mem, oncpu.id());
        return VmFaultResult::Raced;
    }
    let mut pte = Pte::new(new.pfn(), vma.page_prot()).mkdirty();
    if vma.flags() & VM_WRITE != 0 {
        pte = pte.mkwrite();
    }
    // ptep_clear_flush: no CPU may keep writing... reading the old page
    // through a stale entry once the new one is in place.
    pt.get_and_clear(idx);
    let page_addr = vmf.address;
    oncpu.flush_tlb_page(mm, page_addr);
    rmap::folio_add_new_anon_rmap(mem, new, vma, page_addr, RmapFlags::EXCLUSIVE);
    crate::swap::folio_add_lru_vma(mem, new, vma, oncpu.id());
    pt.set(idx, pte);
    match old {
        Some(old) => {
            let f = mem.page_folio(old);
            if !f.test_anon(mem) {
                // A private copy of a file page: the page leaves the file
                // count for the anon one.
                mm.add_rss(crate::mm::mm_counter_file(mem, f), -1);
                mm.add_rss(MmCounter::AnonPages, 1);
            }
            rmap::folio_remove_rmap_ptes(mem, f, old, 1, mm.id, oncpu.id());
            crate::mlock::munlock_vma_folio(mem, f, vma.flags(), oncpu.id());
            drop(pt);
            f.put(mem, oncpu.id());
        }
        None => {
            mm.add_rss(MmCounter::AnonPages, 1);
            drop(pt);
        }
    }
    oncpu.vmstat().count(oncpu.id(), Event::COW_FAULT, 1);
    VmFaultResult::Done
}

// ---------------------------------------------------------------------------
// File faults

/// `fault_around_bytes` (64 KiB by default): how much a read fault maps
/// around itself of what the page cache holds.
pub const FAULT_AROUND_PAGES: u64 = 16;

/// `do_fault`: a fault on an empty PTE of a file mapping. A read maps
/// what the cache holds around it; a write to a private mapping copies
/// the file page into an anon one; a write to a shared one dirties the
/// file page.
fn do_fault(vmf: &mut VmFault<'_>) -> VmFaultResult {
    if !vmf.write() {
        do_read_fault(vmf)
    } else if vmf.vma.flags() & VM_SHARED == 0 {
        do_cow_fault(vmf)
    } else {
        do_shared_fault(vmf)
    }
}

/// `vmf->pgoff`: the file page the faulting address maps.
#[inline]
fn vmf_pgoff(vmf: &VmFault<'_>) -> u64 {
    vmf.vma.linear_page_index(vmf.address)
}

/// `do_fault_around`: map up to [`FAULT_AROUND_PAGES`] cached pages of
/// the aligned window around the fault, inside the VMA and this PTE
/// table. Returns whether the faulting page got mapped.
fn do_fault_around(vmf: &mut VmFault<'_>) -> bool {
    let nr = FAULT_AROUND_PAGES;
    let pte_off = pgtable::pte_index(vmf.address) as u64;
    let pgoff = vmf_pgoff(vmf);
    // The fault's page in the VMA.
    let vma_off = pgoff - vmf.vma.pgoff();
    let from_pte = (pte_off & !(nr - 1)).max(pte_off - pte_off.min(vma_off));
    let to_pte = (from_pte + nr)
        .min(pgtable::PTRS_PER_TABLE as u64)
        .min(pte_off + vmf.vma.pages() - vma_off)
        - 1;
    crate::filemap::filemap_map_pages(vmf, pgoff + from_pte - pte_off, pgoff + to_pte - pte_off)
}

/// `do_read_fault`.
fn do_read_fault(vmf: &mut VmFault<'_>) -> VmFaultResult {
    // Only a file's `vm_ops` have `map_pages` (a special mapping's have
    // not).
    if FAULT_AROUND_PAGES > 1 && vmf.vma.file().is_some() && do_fault_around(vmf) {
        return VmFaultResult::Done;
    }
    let ff = match __do_fault(vmf) {
        Ok(ff) => ff,
        Err(r) => return r,
    };
    let r = finish_fault(vmf, ff.folio, ff.page, None);
    let mem = vmf.oncpu.mem();
    ff.folio.unlock(mem);
    if r != VmFaultResult::Done {
        ff.folio.put(mem, vmf.oncpu.id());
    }
    r
}

/// `__do_fault`: the file page of the fault (`vm_ops->fault`: shmem's or
/// the page cache's), locked, with a reference.
fn __do_fault(vmf: &VmFault<'_>) -> Result<crate::filemap::FileFault, VmFaultResult> {
    if vmf.vma.special().is_some() {
        return vdso_fault(vmf);
    }
    let file = vmf.vma.file().expect("a file fault");
    if file.mapping().is_shmem() {
        return crate::shmem::shmem_fault(vmf.oncpu, vmf.vma, vmf.address, vmf_pgoff(vmf));
    }
    let tried = vmf.flags.contains(FaultFlags::TRIED);
    crate::filemap::filemap_fault(vmf.oncpu, vmf.vma, vmf_pgoff(vmf), tried)
}

/// `special_mapping_fault` of `[vdso]` (`vdso_fault`): the image's page
/// at the fault's offset, with a reference, locked as `__do_fault` locks
/// a page a fault handler returns unlocked; SIGBUS past the image.
fn vdso_fault(vmf: &VmFault<'_>) -> Result<crate::filemap::FileFault, VmFaultResult> {
    let mem = vmf.oncpu.mem();
    let pgoff = (vmf.address - vmf.vma.start()) >> PAGE_SHIFT;
    let Some(&page) = vmf.oncpu.m.vdso_pages.get(pgoff as usize) else {
        return Err(VmFaultResult::Sigbus);
    };
    let folio = Folio(page);
    folio.get(mem);
    crate::filemap::folio_lock(mem, folio);
    Ok(crate::filemap::FileFault {
        folio,
        page,
        index: pgoff,
        major: false,
    })
}

/// `do_cow_fault`: a write to a missing page of a private file mapping
/// gets an anon copy of the file page; the file page is not mapped.
fn do_cow_fault(vmf: &mut VmFault<'_>) -> VmFaultResult {
    let (oncpu, mm, vma) = (vmf.oncpu, vmf.mm, vmf.vma);
    let mem = oncpu.mem();
    if let Err(r) = vmf_anon_prepare(vmf) {
        return r;
    }
    let Some(cow) =
        crate::mempolicy::vma_alloc_folio(oncpu, mm, vma, vmf.address, 0, AllocFlags::NONE)
    else {
        return VmFaultResult::Oom;
    };
    let ff = match __do_fault(vmf) {
        Ok(ff) => ff,
        Err(r) => {
            cow.put(mem, oncpu.id());
            return r;
        }
    };
    mem.copy_page(cow.pfn(), ff.page);
    let r = finish_fault(vmf, cow, cow.pfn(), Some(()));
    ff.folio.unlock(mem);
    ff.folio.put(mem, oncpu.id());
    if r != VmFaultResult::Done {
        cow.put(mem, oncpu.id());
    }
    r
}

/// `do_shared_fault`: a write to a missing page of a shared file mapping
/// maps the file page writable and dirty (`page_mkwrite`, then
/// `fault_dirty_shared_page`).
fn do_shared_fault(vmf: &mut VmFault<'_>) -> VmFaultResult {
    let mem = vmf.oncpu.mem();
    let ff = match __do_fault(vmf) {
        Ok(ff) => ff,
        Err(r) => return r,
    };
    // page_mkwrite (ext4's, through filemap_page_mkwrite): the folio is
    // dirtied before it can be written.
    crate::filemap::folio_mark_dirty(mem, ff.folio);
    let r = finish_fault(vmf, ff.folio, ff.page, None);
    ff.folio.unlock(mem);
    if r != VmFaultResult::Done {
        ff.folio.put(mem, vmf.oncpu.id());
    }
    r
}

/// `finish_fault`: map `page` of `folio` at the fault (the file page, or
/// with `cow` the anon copy a private write made), consuming the fault's
/// reference to it. A file folio that does not reach past the file's
/// last page may be mapped whole: by the PMD if it is PMD-sized and the
/// PMD empty (`do_set_pmd`), else by PTEs if it lies inside the VMA and
/// this page table and all its PTEs are empty (6.18); otherwise one PTE.
fn finish_fault(vmf: &mut VmFault<'_>, folio: Folio, page: Pfn, cow: Option<()>) -> VmFaultResult {
    let (oncpu, mm, vma) = (vmf.oncpu, vmf.mm, vmf.vma);
    let mem = oncpu.mem();
    if vmf.speculative() {
        return vmf.spf_abort(Event::SPF_ABORT_NO_SPECULATE);
    }
    let nr_folio = folio.nr_pages(mem);
    let mut needs_fallback = cow.is_some();
    if !needs_fallback {
        // A folio that passes the file's last page is mapped a page at a
        // time, shmem's excepted.
        let file = vma.file().filter(|f| !f.mapping().is_shmem());
        let size_pages = file.map_or(u64::MAX, |f| f.inode.size_pages());
        let index = mem
            .page(folio.pfn())
            .index
            .load(crate::sync::Ordering::Relaxed);
        needs_fallback = size_pages < index + nr_folio;
    }
    if mm.pmd_get(vmf.pmd).none() {
        if !needs_fallback && folio.order(mem) == HPAGE_PMD_ORDER {
            let r = huge_memory::do_set_pmd(vmf, folio);
            if r != VmFaultResult::Fallback {
                return r;
            }
        }
        if let Err(e) = mm.pte_alloc(
            vmf.pmd,
            oncpu.id(),
            crate::pt_reclaim::new_pte_tracking(oncpu),
        ) {
            return e.into();
        }
    }
    // The whole folio, or the one page.
    let idx_in_folio = page - folio.pfn();
    let (mut nr, mut first_page, mut addr) = (1u64, page, vmf.address);
    if !needs_fallback && nr_folio > 1 {
        let vma_off = vma.linear_page_index(vmf.address) - vma.pgoff();
        let pte_off = pgtable::pte_index(vmf.address) as u64;
        if vma_off >= idx_in_folio
            && vma_off + (nr_folio - idx_in_folio) <= vma.pages()
            && pte_off >= idx_in_folio
            && pte_off + (nr_folio - idx_in_folio) <= pgtable::PTRS_PER_TABLE as u64
        {
            nr = nr_folio;
            first_page = folio.pfn();
            addr = vmf.address - (idx_in_folio << PAGE_SHIFT);
        }
    }
    let mut pt = match vmf.pte_map_lock() {
        Ok(pt) => pt,
        Err(r) => return r,
    };
    let i0 = pgtable::pte_index(addr);
    if nr > 1 && !(i0..i0 + nr as usize).all(|i| pt.pte(i).none()) {
        // Someone mapped part of it: one page after all.
        (nr, first_page, addr) = (1, page, vmf.address);
    }
    if nr == 1 && !pt.pte(vmf.pte_idx()).none() {
        return VmFaultResult::Raced;
    }
    folio.ref_add(mem, nr as i32 - 1);
    set_pte_range(
        vmf,
        &mut pt,
        folio,
        first_page,
        nr as usize,
        addr,
        cow.is_some(),
    );
    let counter = if cow.is_some() {
        MmCounter::AnonPages
    } else {
        crate::mm::mm_counter_file(mem, folio)
    };
    mm.add_rss(counter, nr as i64);
    VmFaultResult::Done
}

/// `set_pte_range`: map `nr` pages of `folio` from `page` at `addr`
/// (the PTE lock held, the entries empty; the caller accounts RSS and
/// has taken the references). A write maps writable and dirty; a read of
/// a dirty folio through a writable shared entry maps it dirty; a `cow`
/// page becomes a new anon folio of the VMA.
fn set_pte_range(
    vmf: &VmFault<'_>,
    pt: &mut PteLocked<'_>,
    folio: Folio,
    page: Pfn,
    nr: usize,
    addr: u64,
    cow: bool,
) {
    let (oncpu, vma) = (vmf.oncpu, vmf.vma);
    let mem = oncpu.mem();
    let mut entry = Pte::new(page, vma.page_prot());
    if vmf.write() {
        entry = entry.mkdirty();
        if vma.flags() & VM_WRITE != 0 {
            entry = entry.mkwrite();
        }
    } else if entry.write() && folio.head(mem).test(crate::phys::pg::DIRTY) {
        entry = entry.mkdirty();
    }
    if cow {
        debug_assert_eq!(nr, 1);
        rmap::folio_add_new_anon_rmap(mem, folio, vma, addr, RmapFlags::EXCLUSIVE);
        crate::swap::folio_add_lru_vma(mem, folio, vma, oncpu.id());
    } else {
        rmap::folio_add_file_rmap_ptes(mem, folio, page, nr as u64, vmf.mm.id);
        // Mapped whole: mlocked if the VMA is locked.
        if nr as u64 == folio.nr_pages(mem) {
            crate::mlock::mlock_vma_folio(mem, folio, vma.flags(), oncpu.id());
        }
    }
    pt.set_ptes(pgtable::pte_index(addr), entry, nr);
}

/// What [`filemap_map_folio_range`] did with one folio.
pub struct MapRange {
    /// Pages looked at (the miss count's hits).
    pub looked: u64,
    /// The faulting page got mapped.
    pub mapped_fault: bool,
    /// The PMD holds no PTE table: nothing more can be mapped.
    pub table_gone: bool,
}

/// `filemap_map_folio_range` (and `filemap_map_order0_folio`): map the
/// pages of the locked, cached folio `c` that fall in `[start, end]` of
/// the file and whose PTEs are empty, by the fault's PMD's PTE table,
/// read-only (or as `set_pte_range` says). A large folio that ends before
/// the file's last page (`file_end`) and lies whole inside the VMA and
/// one page table is mapped whole, beyond the window (6.18). One
/// reference per PTE.
pub fn filemap_map_folio_range(
    vmf: &mut VmFault<'_>,
    c: crate::fs::CachedFolio,
    start: u64,
    end: u64,
    file_end: u64,
) -> MapRange {
    let (oncpu, vma, mm) = (vmf.oncpu, vmf.vma, vmf.mm);
    let mem = oncpu.mem();
    let (folio, index) = (c.folio, c.index);
    let nr_folio = folio.nr_pages(mem);
    let mut first = index.max(start);
    let last_in_window = (index + nr_folio - 1).min(end);
    let mut last = last_in_window;
    let mut out = MapRange {
        looked: 0,
        mapped_fault: false,
        table_gone: false,
    };
    if !pgtable::pmd_is_table(mm.pmd_get(vmf.pmd)) {
        out.table_gone = true;
        return out;
    }
    let shmem = vma.file().is_some_and(|f| f.mapping().is_shmem());
    if nr_folio > 1 && (shmem || file_end >= index + nr_folio) {
        if let (Some(a0), Some(a1)) = (vma.address_of(index), vma.address_of(index + nr_folio - 1))
        {
            if a0 & PMD_MASK_ == a1 & PMD_MASK_ {
                first = index;
                last = index + nr_folio - 1;
            }
        }
    }
    if first > last {
        return out;
    }
    let Ok(mut pt) = vmf.pte_map_lock() else {
        out.table_gone = true;
        return out;
    };
    let fault_pgoff = vma.linear_page_index(vmf.address);
    let mut mapped = 0u64;
    let mut run_start: Option<u64> = None;
    let mut map_run = |pt: &mut PteLocked<'_>, from: u64, to: u64| {
        let n = to - from;
        let addr = vma.address_of(from).expect("inside the VMA");
        folio.ref_add(mem, n as i32);
        set_pte_range(
            vmf,
            pt,
            folio,
            folio.pfn() + (from - index),
            n as usize,
            addr,
            false,
        );
        mapped += n;
        if (from..to).contains(&fault_pgoff) {
            out.mapped_fault = true;
        }
    };
    for pgoff in first..=last {
        out.looked += 1;
        let addr = vma.address_of(pgoff).expect("inside the VMA");
        let empty = pt.pte(pgtable::pte_index(addr)).none();
        match (empty, run_start) {
            (true, None) => run_start = Some(pgoff),
            (false, Some(s)) => {
                map_run(&mut pt, s, pgoff);
                run_start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = run_start {
        map_run(&mut pt, s, last + 1);
    }
    drop(pt);
    mm.add_rss(crate::mm::mm_counter_file(mem, folio), mapped as i64);
    out
}

const PMD_MASK_: u64 = !(PMD_SIZE - 1);

/// `wp_page_shared`: a write to a present, write-protected page of a
/// shared file mapping (its first since the folio was last cleaned):
/// dirty the folio (`page_mkwrite`) and make the entry writable and dirty
/// in place (`wp_page_reuse`).
fn wp_page_shared(vmf: &mut VmFault<'_>, mut pt: PteLocked<'_>, folio: Folio) -> VmFaultResult {
    let mem = vmf.oncpu.mem();
    crate::filemap::folio_mark_dirty(mem, folio);
    let orig = vmf.orig_pte;
    pt.set_access_flags(vmf.pte_idx(), orig.mkyoung().mkdirty().mkwrite(), true);
    VmFaultResult::Done
}

/// `unmap_mapping_range`: zap the pages `[first, last]` of a file in
/// every VMA that maps them (`i_mmap`); with `even_cows`, private COW
/// copies go too (truncation), else only the file's own pages.
pub fn unmap_mapping_range(
    oncpu: &OnCpu,
    mapping: &crate::fs::AddressSpace,
    first: u64,
    last: u64,
    even_cows: bool,
) {
    // Under `i_mmap_lock_read` throughout: a VMA it finds may be out of
    // its tree already (munmap detaches, then zaps), but cannot be
    // unlinked, nor have its tables freed, until the zap is done.
    mapping.for_each_vma_in(first, last, |vma| {
        let Some(mm) = oncpu.m.mm_by_id(vma.mm_id) else {
            return true;
        };
        let s = vma
            .address_of(first.max(vma.pgoff()))
            .unwrap_or(vma.start());
        let e = if last >= vma.last_pgoff() {
            vma.end()
        } else {
            vma.address_of(last + 1).unwrap_or(vma.end())
        };
        if s >= e {
            return true;
        }
        let details = ZapDetails {
            drop_markers: false,
            reclaim_pt: false,
            mapping: (!even_cows).then_some(mapping.as_mapping_word()),
        };
        crate::swap::lru_add_drain(oncpu.mem(), oncpu.id());
        let mut tlb = MmuGather::new(&mm);
        tlb.vm_flags = vma.flags();
        unmap_page_range(oncpu, &mut tlb, s, e, &details);
        tlb.finish(oncpu);
        true
    });
}

// ---------------------------------------------------------------------------
// Zapping

/// `struct zap_details`: what a zap removes besides the pages mapped.
///
/// The kernel's `even_cows` is false only when a file's pages are unmapped
/// from under private COW copies ([`ZapDetails::mapping`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct ZapDetails {
    /// `ZAP_FLAG_DROP_MARKER`: PTE markers go too. munmap and exit set it;
    /// MADV_DONTNEED does not, so guard regions survive it.
    pub drop_markers: bool,
    /// `reclaim_pt`: free each PTE table that this zap empties over its
    /// whole range (MADV_DONTNEED, when `pt_reclaim` is `upstream`; the
    /// kernel sets it there whenever it is built with `CONFIG_PT_RECLAIM`).
    pub reclaim_pt: bool,
    /// `zap_details->mapping` without `even_cows`: only the pages of this
    /// file's page cache (its mapping word) are zapped, and private anon
    /// copies stay (`unmap_mapping_range` but for truncation).
    pub mapping: Option<u64>,
}

impl ZapDetails {
    /// `reclaim_pt_is_enabled`: may the zap of `[start, end)`, inside one
    /// PTE table, free that table? Only when it covers the table's whole
    /// range: a range cut by a VMA boundary, or zapped in pieces, never
    /// qualifies.
    #[inline]
    fn reclaim_pt_is_enabled(&self, start: u64, end: u64) -> bool {
        self.reclaim_pt && end - start >= PMD_SIZE
    }
}

/// `unmap_vmas`: zap every page of `vmas` inside `[start, end)`, markers
/// included (the range is going away).
pub fn unmap_vmas(oncpu: &OnCpu, tlb: &mut MmuGather, vmas: &[Arc<Vma>], start: u64, end: u64) {
    let details = ZapDetails {
        drop_markers: true,
        reclaim_pt: false,
        mapping: None,
    };
    for vma in vmas {
        let s = start.max(vma.start());
        let e = end.min(vma.end());
        if s < e {
            tlb.vm_flags = vma.flags();
            unmap_page_range(oncpu, tlb, s, e, &details);
        }
    }
}

/// `unmap_page_range` (and `zap_page_range_single` for one VMA's range).
pub fn unmap_page_range(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    start: u64,
    end: u64,
    details: &ZapDetails,
) {
    let mm = tlb.mm;
    let mut addr = start;
    while addr < end {
        let next = addr_end(addr, end, PMD_SIZE);
        if let Some(slot) = mm.pmd_lookup(addr) {
            zap_pmd(oncpu, tlb, slot, addr, next, details);
            addr = next;
        } else {
            // No PUD table here: skip to the next PUD boundary.
            addr = addr_end(addr, end, PUD_SIZE);
        }
    }
    tlb_end_vma_luf(oncpu, tlb);
}

/// LUF's forced flush in `tlb_end_vma` (v12): an unmapped range leaves no
/// stale translation behind that a new mapping at the same addresses
/// could be read through. A whole-mm teardown (`fullmm`) skips it, as
/// `tlb_end_vma` does: nothing can be mapped in the mm again.
fn tlb_end_vma_luf(oncpu: &OnCpu, tlb: &MmuGather) {
    use crate::migrc::Weakened;
    if tlb.fullmm
        || matches!(
            oncpu.mem().migrc.weakened(),
            Weakened::LufNoEndVmaFlush | Weakened::LufNoMmFlush
        )
    {
        return;
    }
    crate::migrc::luf_flush_mm(oncpu, tlb.mm);
}

/// One step of `zap_pmd_range`.
fn zap_pmd(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    slot: PmdSlot,
    addr: u64,
    next: u64,
    details: &ZapDetails,
) {
    let mm = tlb.mm;
    let pmd = mm.pmd_get(slot);
    if huge_memory::pmd_is_huge(pmd) {
        if next - addr == PMD_SIZE && huge_memory::zap_huge_pmd(oncpu, tlb, mm, slot, addr) {
            return;
        }
        if huge_memory::pmd_is_huge(mm.pmd_get(slot)) {
            huge_memory::split_huge_pmd(oncpu, mm, slot, addr);
        }
    }
    if !mm.pmd_get(slot).none() {
        zap_pte_range(oncpu, tlb, slot, addr, next, details);
    }
}

/// What `zap_pte_range` carries for the PTE table whose lock it holds (the
/// kernel keeps it in locals and `struct zap_details`): the gather, what
/// to zap, the RSS changes batched per table, whether the gather filled
/// (so that it must be flushed before the lock is dropped), and whether
/// some entry was left in place.
struct ZapPteTable<'a, 'g> {
    oncpu: &'a OnCpu<'a>,
    tlb: &'a mut MmuGather<'g>,
    details: &'a ZapDetails,
    pt: PteLocked<'a>,
    rss: [i64; NR_MM_COUNTERS],
    force_flush: bool,
    /// The gather filled: the table is left before it is done, to flush.
    force_break: bool,
    /// `any_skipped`: an entry of the range stays (a marker this zap may
    /// not drop), so the table is not empty afterwards.
    any_skipped: bool,
}

/// `zap_pte_range`: clear the entries of `[addr, end)` in one PTE table,
/// and with `reclaim_pt` free the table if that empties it (PT reclaim,
/// v6.14).
///
/// PT reclaim's state for the table is a [`ReclaimPt`]: the fast path only
/// when the PTE lock was held from the first entry to the last, else the
/// slow path that looks at every entry again (see [`crate::pt_reclaim`]).
/// The kernel also breaks for `need_resched`; the model's CPUs are never
/// preempted in the kernel.
pub fn zap_pte_range(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    slot: PmdSlot,
    mut addr: u64,
    end: u64,
    details: &ZapDetails,
) {
    let mm = tlb.mm;
    let start = addr;
    let mut reclaim = ReclaimPt::new(details.reclaim_pt_is_enabled(start, end));
    let mut tracked = false;
    loop {
        let Some(pt) = mm.pte_offset_map_lock(slot) else {
            // Gone, or dead: this zap's own put may have killed it when the
            // gather broke the loop.
            if tracked {
                free_killed_pte_table(oncpu, tlb, slot, start);
            }
            return;
        };
        crate::tlbbatch::flush_tlb_batched_pending(oncpu, mm);
        tracked = pt.is_tracked();
        let mut z = ZapPteTable {
            oncpu,
            tlb: &mut *tlb,
            details,
            pt,
            rss: [0; NR_MM_COUNTERS],
            force_flush: false,
            force_break: false,
            any_skipped: false,
        };
        while addr != end {
            let idx = pgtable::pte_index(addr);
            let pte = z.pt.pte(idx);
            if pte.none() {
                addr += PAGE_SIZE;
                continue;
            }
            if !pte.present() {
                z.zap_nonpresent_pte(idx, pte);
                addr += PAGE_SIZE;
                continue;
            }
            let max_nr = ((end - addr) >> PAGE_SHIFT) as usize;
            addr += z.zap_present_ptes(idx, pte, max_nr, addr) << PAGE_SHIFT;
            if z.force_break {
                // force_break: the PTE lock is dropped before the table
                // is done.
                reclaim.lock_dropped();
                break;
            }
        }
        if z.any_skipped {
            reclaim.skipped();
        }
        if addr == end {
            reclaim.table_done(&z.pt, slot);
        }
        mm.add_rss_vec(&z.rss);
        let force_flush = z.force_flush;
        if force_flush {
            // The flush and the delayed rmaps must complete before the PTL
            // is dropped.
            z.tlb.flush_mmu_tlbonly(oncpu);
            z.tlb.flush_rmaps(oncpu);
        }
        drop(z);
        debug_assert!(
            !tlb.delayed_rmap,
            "PTE lock dropped with rmap removals still delayed"
        );
        if force_flush {
            oncpu
                .vmstat()
                .count(oncpu.id(), Event::GATHER_FORCE_FLUSH, 1);
            tlb.flush_mmu(oncpu);
        }
        if addr == end {
            break;
        }
    }
    if let Some((table, path)) = reclaim.finish(&mm.mem, slot) {
        if path == ReclaimPath::Slow {
            oncpu
                .vmstat()
                .count(oncpu.id(), Event::PT_RECLAIM_UPSTREAM_SLOW, 1);
        }
        free_pte(oncpu, tlb, table, start);
    }
    if tracked {
        free_killed_pte_table(oncpu, tlb, slot, start);
    }
}

/// `pte_ref`: if the put of the zap's guard was the table's last (MADV_FREE
/// left its count atomic), free it, as the seed does in that put's release.
fn free_killed_pte_table(oncpu: &OnCpu, tlb: &mut MmuGather, slot: PmdSlot, addr: u64) {
    if slot.pte_table_is_dead(&tlb.mm.mem) {
        crate::pt_reclaim::free_user_pte(oncpu, tlb, slot, addr);
    }
}

/// `free_pte`: a reclaimed PTE table goes to the gather (`pte_free_tlb`,
/// which sets `freed_tables`), to be freed after the TLB flush and a grace
/// period, and leaves `pgtables_bytes` (`mm_dec_nr_ptes`).
fn free_pte(oncpu: &OnCpu, tlb: &mut MmuGather, table: Ptdesc, addr: u64) {
    oncpu
        .vmstat()
        .count(oncpu.id(), Event::PT_RECLAIM_UPSTREAM, 1);
    pt_free_tlb(oncpu, tlb, table, addr);
}

impl ZapPteTable<'_, '_> {
    /// `zap_nonpresent_ptes` for one entry: a migration entry goes (its
    /// page is counted out of RSS; the migration holds the page), a marker
    /// only when the zap drops markers. No TLB entry can exist for a
    /// non-present PTE, so nothing is flushed.
    fn zap_nonpresent_pte(&mut self, idx: usize, pte: Pte) {
        match pte.swp_entry().kind() {
            // should_zap_folio: without even_cows, an anon folio's entry
            // (a COW copy under migration) stays. (Only anon folios
            // migrate in the model.)
            SwpKind::Migration { .. } if self.details.mapping.is_some() => {
                self.any_skipped = true;
                return;
            }
            SwpKind::Migration { .. } => {
                // mm_counter of an anon folio: the model has no other kind.
                self.rss[MmCounter::AnonPages as usize] -= 1;
            }
            SwpKind::Marker(_) if !self.details.drop_markers => {
                self.any_skipped = true;
                return;
            }
            SwpKind::Marker(_) => {}
            other => {
                unreachable!("{other:?} at index {idx}: swap and device memory are not modelled")
            }
        }
        // clear_not_present_full_ptes
        self.pt.get_and_clear(idx);
    }

    /// `zap_present_ptes`: zap the present PTE at `idx` and, when zap
    /// batching is on and it maps part of a large folio, the PTEs that
    /// follow it mapping the rest of that folio. Returns the number of PTEs
    /// zapped.
    ///
    /// With batching off this is the pre-v6.9 loop body, one PTE at a time;
    /// a small folio takes the same single-PTE path in both settings.
    #[inline]
    fn zap_present_ptes(&mut self, idx: usize, pte: Pte, max_nr: usize, addr: u64) -> u64 {
        let mem = self.oncpu.mem();
        let Some(page) = vm_normal_page(pte) else {
            // The zero page: nothing to free, nothing to count.
            self.pt.get_and_clear(idx);
            self.tlb.remove_tlb_entries(addr, 1);
            return 1;
        };
        let folio = mem.page_folio(page);
        // should_zap_folio: without even_cows, only the file's own pages.
        if self.details.mapping.is_some() && folio.test_anon(mem) {
            self.any_skipped = true;
            return 1;
        }
        let mut nr = 1;
        if max_nr != 1 && folio.is_large(mem) && self.oncpu.m.tunables.zap_batch() {
            let flags = FPB_IGNORE_DIRTY | FPB_IGNORE_SOFT_DIRTY;
            nr = folio_pte_batch(mem, folio, &self.pt, idx, pte, max_nr, flags).nr;
        }
        self.zap_present_folio_ptes(folio, page, idx, nr, addr);
        nr as u64
    }

    /// `zap_present_folio_ptes`: clear `nr` PTEs mapping consecutive pages
    /// of one folio, record one TLB range, remove the rmap once and queue
    /// one folio fragment. A file folio collects the entries' dirty bits
    /// (a dirty one is marked dirty, and its rmap removal waits for the
    /// TLB flush, so that no CPU can still write it once it may be
    /// written back) and accessed bits; an anon folio needs neither.
    #[inline]
    fn zap_present_folio_ptes(
        &mut self,
        folio: Folio,
        page: Pfn,
        idx: usize,
        nr: usize,
        addr: u64,
    ) {
        let (oncpu, mem) = (self.oncpu, self.oncpu.mem());
        let mut delay_rmap = false;
        if folio.test_anon(mem) {
            self.pt.clear_full_ptes(idx, nr);
            self.rss[MmCounter::AnonPages as usize] -= nr as i64;
        } else {
            // get_and_clear_full_ptes: the bits of the whole batch.
            let (mut dirty, mut young) = (false, false);
            for i in idx..idx + nr {
                let old = self.pt.get_and_clear(i);
                dirty |= old.dirty();
                young |= old.young();
            }
            if dirty {
                crate::filemap::folio_mark_dirty(mem, folio);
                // tlb_delay_rmap
                delay_rmap = true;
                self.force_flush = true;
            }
            if young {
                crate::swap::folio_mark_accessed(mem, folio);
            }
            self.rss[crate::mm::mm_counter_file(mem, folio) as usize] -= nr as i64;
        }
        self.tlb.remove_tlb_entries(addr, nr as u64);
        if !delay_rmap {
            rmap::folio_remove_rmap_ptes(mem, folio, page, nr as u64, self.tlb.mm.id, oncpu.id());
            crate::mlock::munlock_vma_folio(mem, folio, self.tlb.vm_flags, oncpu.id());
        }
        if self.tlb.remove_folio_pages(page, nr as u64, delay_rmap) {
            self.force_flush = true;
            self.force_break = true;
        }
    }
}

// ---------------------------------------------------------------------------
// PTE batches (mm/internal.h)

/// `folio_pte_batch` flag: dirty may differ within a batch.
pub const FPB_IGNORE_DIRTY: u32 = 1;
/// `folio_pte_batch` flag: soft-dirty may differ within a batch.
pub const FPB_IGNORE_SOFT_DIRTY: u32 = 2;

/// `__pte_batch_clear_ignored`: the bits a batch may disagree on, cleared.
/// Accessed and writable always; dirty and soft-dirty when asked.
#[inline]
fn pte_batch_clear_ignored(pte: Pte, flags: u32) -> Pte {
    let mut pte = pte.mkold().wrprotect();
    if flags & FPB_IGNORE_DIRTY != 0 {
        pte = pte.mkclean();
    }
    if flags & FPB_IGNORE_SOFT_DIRTY != 0 {
        pte = pte.clear_soft_dirty();
    }
    pte
}

/// What [`folio_pte_batch`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PteBatch {
    pub nr: usize,
    /// Some PTE after the first was writable / young / dirty.
    pub any_writable: bool,
    pub any_young: bool,
    pub any_dirty: bool,
}

/// `folio_pte_batch`: how many PTEs from `idx` (whose value is `pte`, mapping
/// a page of `folio`) map consecutive pages of that folio with the same bits
/// but the ignored ones, up to `max_nr` (which the caller bounds by its range,
/// the VMA and this PTE table). With the optional outputs: whether any PTE
/// after the first was writable, young or dirty. Always at least 1. PTE lock held.
pub fn folio_pte_batch(
    mem: &crate::phys::PhysMem,
    folio: Folio,
    pt: &impl PteRead,
    idx: usize,
    pte: Pte,
    max_nr: usize,
    flags: u32,
) -> PteBatch {
    debug_assert!(
        idx + max_nr <= pgtable::PTRS_PER_TABLE,
        "batch crosses its PTE table"
    );
    // Clamp to the folio first: never look past its last page.
    let folio_end = folio.pfn() + folio.nr_pages(mem);
    debug_assert!(pte.pfn() >= folio.pfn() && pte.pfn() < folio_end);
    let max_nr = max_nr.min((folio_end - pte.pfn()) as usize);
    let mut expected = pte_batch_clear_ignored(pte.advance_pfn(1), flags);
    let mut b = PteBatch {
        nr: 1,
        any_writable: false,
        any_young: false,
        any_dirty: false,
    };
    while b.nr < max_nr {
        let next = pt.pte(idx + b.nr);
        if pte_batch_clear_ignored(next, flags) != expected {
            break;
        }
        b.any_writable |= next.write();
        b.any_young |= next.young();
        b.any_dirty |= next.dirty();
        expected = expected.advance_pfn(1);
        b.nr += 1;
    }
    b
}

// ---------------------------------------------------------------------------
// Copying page tables (fork)

/// `is_cow_mapping`: private and may become writable.
#[inline]
pub fn is_cow_mapping(flags: u64) -> bool {
    flags & (VM_SHARED | VM_MAYWRITE) == VM_MAYWRITE
}

/// `vma_needs_copy`: a VMA without an anon_vma has no page that faults
/// could not bring back: anonymous memory never written (zero-page
/// entries) and file pages never copied are refaulted in the child.
pub fn vma_needs_copy(src_vma: &Vma) -> bool {
    src_vma.anon_vma().is_some()
}

/// `copy_page_range`: give `dst_vma` (in `dst_mm`, a fork child) the
/// mappings of `src_vma`. Both mms' mmap_locks are held for writing. For a
/// COW mapping the parent's entries are write-protected; the caller flushes
/// the parent's TLB once when every VMA is copied.
pub fn copy_page_range(
    oncpu: &OnCpu,
    dst_mm: &Mm,
    src_mm: &Mm,
    _dst_vma: &Vma,
    src_vma: &Vma,
) -> KResult<()> {
    // The child's VMA matters to the kernel's copy only for what the model
    // leaves out (uffd-wp registration, device-exclusive entries).
    let c = CopyRange {
        oncpu,
        dst_mm,
        src_mm,
        src_vma,
    };
    let end = src_vma.end();
    let mut addr = src_vma.start();
    while addr < end {
        let next = addr_end(addr, end, pgtable::PGDIR_SIZE);
        // pgd_none_or_clear_bad: nothing below this PGD entry.
        if src_mm.pud_present(addr) {
            c.copy_pud_range(addr, next)?;
        }
        addr = next;
    }
    Ok(())
}

/// What `copy_page_range`'s levels share: both sides of the fork.
#[derive(Clone, Copy)]
struct CopyRange<'a> {
    oncpu: &'a OnCpu<'a>,
    dst_mm: &'a Mm,
    src_mm: &'a Mm,
    src_vma: &'a Vma,
}

impl CopyRange<'_> {
    /// `copy_pud_range`: the child's PUD table is allocated before the
    /// source's entries are looked at, as the kernel's `pud_alloc` is, so
    /// the child gets one wherever the parent has one (VmPTE agrees).
    fn copy_pud_range(self, mut addr: u64, end: u64) -> KResult<()> {
        self.dst_mm.pud_alloc(addr, self.oncpu.id())?;
        while addr < end {
            let next = addr_end(addr, end, PUD_SIZE);
            if self.src_mm.pmd_lookup(addr).is_some() {
                self.copy_pmd_range(addr, next)?;
            }
            addr = next;
        }
        Ok(())
    }

    /// `copy_pmd_range`: the child's PMD table likewise, then each entry.
    fn copy_pmd_range(self, mut addr: u64, end: u64) -> KResult<()> {
        self.dst_mm.pmd_alloc(addr, self.oncpu.id())?;
        while addr < end {
            let next = addr_end(addr, end, PMD_SIZE);
            let Some(src_slot) = self.src_mm.pmd_lookup(addr) else {
                unreachable!("the caller found the source's PMD table");
            };
            if !self.src_mm.pmd_get(src_slot).none() {
                let dst_slot = self.dst_mm.pmd_alloc(addr, self.oncpu.id())?;
                self.copy_pmd(dst_slot, src_slot, addr, next)?;
            }
            addr = next;
        }
        Ok(())
    }

    /// One step of `copy_pmd_range`.
    fn copy_pmd(self, dst_slot: PmdSlot, src_slot: PmdSlot, addr: u64, next: u64) -> KResult<()> {
        let CopyRange {
            oncpu,
            dst_mm,
            src_mm,
            ..
        } = self;
        if huge_memory::pmd_is_huge(src_mm.pmd_get(src_slot)) {
            // A file VMA's huge PMDs are left to the child's faults.
            if !self.src_vma.is_anonymous() {
                return Ok(());
            }
            if huge_memory::copy_huge_pmd(oncpu, dst_mm, src_mm, dst_slot, src_slot)? {
                return Ok(());
            }
        }
        if src_mm.pmd_get(src_slot).none() {
            return Ok(());
        }
        self.copy_pte_range(dst_slot, src_slot, addr, next)
    }

    /// `copy_pte_range`: copy the present PTEs of `[addr, end)`, one PTE
    /// table, with both PTE locks held (the child's first).
    fn copy_pte_range(
        self,
        dst_slot: PmdSlot,
        src_slot: PmdSlot,
        mut addr: u64,
        end: u64,
    ) -> KResult<()> {
        self.dst_mm.pte_alloc(
            dst_slot,
            self.oncpu.id(),
            crate::pt_reclaim::new_pte_tracking(self.oncpu),
        )?;
        let dst = self
            .dst_mm
            .pte_offset_map_lock(dst_slot)
            .expect("the child's PMD holds the table just allocated");
        let Some(src) = self.src_mm.pte_offset_map_lock(src_slot) else {
            return Ok(());
        };
        let mut c = CopyPteTable {
            range: self,
            dst,
            src,
            rss: [0; NR_MM_COUNTERS],
        };
        while addr != end {
            let idx = pgtable::pte_index(addr);
            let pte = c.src.pte(idx);
            if pte.none() {
                addr += PAGE_SIZE;
                continue;
            }
            if !pte.present() {
                c.copy_nonpresent_pte(idx, pte);
                addr += PAGE_SIZE;
                continue;
            }
            let max_nr = ((end - addr) >> PAGE_SHIFT) as usize;
            let nr = c.copy_present_ptes(idx, pte, max_nr);
            addr += (nr as u64) << PAGE_SHIFT;
        }
        let rss = c.rss;
        drop(c);
        self.dst_mm.add_rss_vec(&rss);
        Ok(())
    }
}

/// One PTE table being copied: both locked tables and the child's RSS
/// changes, batched per table.
struct CopyPteTable<'a> {
    range: CopyRange<'a>,
    dst: PteLocked<'a>,
    src: PteLocked<'a>,
    rss: [i64; NR_MM_COUNTERS],
}

impl CopyPteTable<'_> {
    /// `copy_nonpresent_pte`: a migration entry is copied and counted in
    /// the child's RSS (a writable or exclusive one becomes readable in
    /// both, as a COW page becomes read-only); a marker is copied if it is
    /// one the child keeps (poisoned, guard: uffd-wp only for a child VMA
    /// registered with userfaultfd, which the model has none of).
    fn copy_nonpresent_pte(&mut self, idx: usize, orig: Pte) {
        let mut pte = orig;
        match orig.swp_entry().kind() {
            SwpKind::Migration { kind, .. } => {
                self.rss[MmCounter::AnonPages as usize] += 1;
                let cow = is_cow_mapping(self.range.src_vma.flags());
                if kind != Migration::Read && cow {
                    let e = SwpEntry::new(
                        pgtable::swapops::SWP_MIGRATION_READ,
                        orig.swp_entry().offset(),
                    );
                    pte = e.to_pte();
                    if orig.swp_soft_dirty() {
                        pte = pte.swp_mksoft_dirty();
                    }
                    if orig.swp_uffd_wp() {
                        pte = Pte(pte.0 | pgtable::swapops::_PAGE_SWP_UFFD_WP);
                    }
                    self.src.set(idx, pte);
                }
            }
            SwpKind::Marker(bits) => {
                use pgtable::swapops::{PTE_MARKER_GUARD, PTE_MARKER_POISONED};
                let keep = bits & (PTE_MARKER_POISONED | PTE_MARKER_GUARD);
                if keep != 0 {
                    self.dst.set(idx, SwpEntry::marker(keep).to_pte());
                }
                return;
            }
            other => unreachable!("{other:?}: swap and device memory are not modelled"),
        }
        self.dst.set(idx, pte.swp_clear_uffd_wp());
    }

    /// `copy_present_ptes`: copy the present PTE at `idx` and, when fork
    /// batching is on and it maps part of a large folio, the PTEs after it
    /// that map the rest of that folio: one reference and one rmap dup for
    /// the batch. Returns the number of PTEs copied.
    ///
    /// With batching off this is the pre-v6.9 `copy_present_pte`, one PTE
    /// at a time; a small folio takes the same single-PTE path in both
    /// settings.
    #[inline]
    fn copy_present_ptes(&mut self, idx: usize, pte: Pte, max_nr: usize) -> usize {
        let CopyRange { oncpu, src_vma, .. } = self.range;
        let mem = oncpu.mem();
        let Some(page) = vm_normal_page(pte) else {
            // The zero page: no reference, no rmap, no RSS.
            self.__copy_present_ptes(idx, pte, 1);
            return 1;
        };
        let folio = mem.page_folio(page);
        if max_nr != 1 && folio.is_large(mem) && oncpu.m.tunables.fork_batch() {
            // Soft-dirty tracking is not modelled (never enabled on a VMA),
            // so the kernel's rule says to ignore it; dirty only for shared
            // VMAs.
            let mut flags = FPB_IGNORE_SOFT_DIRTY;
            if src_vma.flags() & VM_SHARED != 0 {
                flags |= FPB_IGNORE_DIRTY;
            }
            let PteBatch {
                nr, any_writable, ..
            } = folio_pte_batch(mem, folio, &self.src, idx, pte, max_nr, flags);
            folio.ref_add(mem, nr as i32);
            self.dup_rmap(folio, page, nr);
            let pte = if any_writable { pte.mkwrite() } else { pte };
            self.__copy_present_ptes(idx, pte, nr);
            return nr;
        }
        folio.get(mem);
        self.dup_rmap(folio, page, 1);
        self.__copy_present_ptes(idx, pte, 1);
        1
    }

    /// The child maps `nr` pages of `folio` from `page` too: the rmap
    /// dup of an anon or a page-cache folio, and the child's RSS.
    #[inline]
    fn dup_rmap(&mut self, folio: Folio, page: Pfn, nr: usize) {
        let mem = self.range.oncpu.mem();
        let dst = self.range.dst_mm.id;
        if folio.test_anon(mem) {
            rmap::folio_dup_anon_rmap_ptes(mem, folio, page, nr as u64, dst);
            self.rss[MmCounter::AnonPages as usize] += nr as i64;
        } else {
            rmap::folio_dup_file_rmap_ptes(mem, folio, page, nr as u64, dst);
            self.rss[crate::mm::mm_counter_file(mem, folio) as usize] += nr as i64;
        }
    }

    /// `__copy_present_ptes`: write-protect the parent's `nr` entries if the
    /// mapping is COW and `pte` (the batch's template) is writable, and set
    /// the child's `nr` entries from the template, old and (for COW)
    /// read-only.
    #[inline]
    fn __copy_present_ptes(&mut self, idx: usize, mut pte: Pte, nr: usize) {
        let src_flags = self.range.src_vma.flags();
        if is_cow_mapping(src_flags) && pte.write() {
            self.src.wrprotect_ptes(idx, nr);
            pte = pte.wrprotect();
        }
        if src_flags & VM_SHARED != 0 {
            pte = pte.mkclean();
        }
        pte = pte.mkold();
        // No VMA is registered with userfaultfd: the child never keeps
        // uffd-wp.
        pte = Pte(pte.0 & !pgtable::entry::_PAGE_UFFD_WP);
        self.dst.set_ptes(idx, pte, nr);
    }
}

// ---------------------------------------------------------------------------
// Freeing page tables

/// `free_pgtables`: free the tables that only `vmas` used. `floor` is the end
/// of the VMA below them (or 0), `ceiling` the start of the one above (or
/// the top of user space). The VMAs are detached from the tree, and
/// mmap_lock is held (for writing, or for reading after munmap's
/// downgrade), or the address space is being torn down.
pub fn free_pgtables(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    vmas: &[Arc<Vma>],
    floor: u64,
    ceiling: u64,
) {
    for (i, vma) in vmas.iter().enumerate() {
        // Hide the VMA from rmap walks before its tables go, as the
        // kernel's free_pgtables does.
        rmap::unlink_anon_vmas(vma);
        crate::fs::unlink_file_vma(vma);
        let next = vmas.get(i + 1).map_or(ceiling, |n| n.start());
        // SAFETY: the VMAs are out of the tree and now out of the rmap, and
        // the caller holds mmap_lock, so no fault, walk or rmap walk can
        // reach the tables between floor and ceiling: only the VMAs around
        // them remain, and their tables lie outside.
        unsafe { free_pgd_range(oncpu, tlb, vma.start(), vma.end(), floor, next) };
    }
}

/// `free_pgd_range`: free every table that lies wholly inside the PMD-aligned
/// span between `floor` and `ceiling` and is touched by `[addr, end)`; each
/// goes through the gather (`pte_free_tlb` & co.).
///
/// # Safety
///
/// As [`pgtable::free::free_pgd_range`]: no one else can reach the tables
/// of the range.
pub unsafe fn free_pgd_range(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    addr: u64,
    end: u64,
    floor: u64,
    ceiling: u64,
) {
    let mm = tlb.mm;
    let mut f = pgtable::free::FreePgtables {
        mem: oncpu.mem(),
        floor,
        ceiling,
        free_tlb: |table: Ptdesc, addr: u64| pt_free_tlb(oncpu, tlb, table, addr),
    };
    // SAFETY: the caller's promise.
    unsafe { pgtable::free::free_pgd_range(&mm.pgd, &mut f, addr, end) };
}

/// `pte_free_tlb` / `pmd_free_tlb` / `pud_free_tlb`: account and queue.
pub(crate) fn pt_free_tlb(oncpu: &OnCpu, tlb: &mut MmuGather, table: Ptdesc, addr: u64) {
    tlb.mm.dec_nr_tables();
    tlb.adjust_range(addr, PAGE_SIZE);
    tlb.cleared_pmds = true;
    tlb.remove_table(oncpu, table);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgtable::{entry::_PAGE_UFFD_WP, Pgprot};
    use crate::phys::PhysMem;
    use crate::{Machine, MachineConfig};

    /// A detached PTE table, read as a mapped one would be.
    struct Table<'a>(&'a PhysMem, Ptdesc);

    impl PteRead for Table<'_> {
        fn pte(&self, idx: usize) -> Pte {
            self.1.pte(self.0, idx)
        }
    }

    impl Table<'_> {
        fn set(&mut self, idx: usize, pte: Pte) {
            self.1.set_pte(self.0, idx, pte)
        }
    }

    /// A machine, and an order-4 folio whose 16 pages entries 100.. of a
    /// PTE table map, writable, dirty and young like a fresh fault's.
    fn setup() -> (crate::sync::Arc<Machine>, Folio) {
        let m = Machine::new(MachineConfig::single_node(16 << 20, 1)).unwrap();
        let folio = m.mem.folio_alloc(0, 4, 0, AllocFlags::NONE).unwrap();
        (m, folio)
    }

    fn table(mem: &PhysMem, folio: Folio) -> Table<'_> {
        let mut t = Table(mem, Ptdesc::alloc(mem, 0, 0).unwrap());
        let pte = Pte::new(folio.pfn(), Pgprot::READONLY)
            .mkwrite()
            .mkdirty()
            .mkyoung();
        for i in 0..16 {
            t.set(100 + i, pte.advance_pfn(i as u64));
        }
        t
    }

    #[test]
    fn fault_results_tell_done_from_oom() {
        use crate::mmap::{MAP_ANONYMOUS, MAP_NORESERVE, MAP_PRIVATE, PROT_READ, PROT_WRITE};
        let m = Machine::new(MachineConfig::single_node(8 << 20, 1)).unwrap();
        m.thp.only_order(0);
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
        let a = c.mmap(0, 64 << 20, PROT_READ | PROT_WRITE, flags).unwrap();
        let vma = {
            let g = crate::sync::epoch::pin();
            mm.vma_tree(&g).vma_lookup(a).cloned().unwrap()
        };
        let fault = |addr, f| handle_mm_fault(&c, &mm, &vma, addr, f);
        assert_eq!(fault(a, FaultFlags::WRITE), VmFaultResult::Done);
        // The entry is there now: a second fault only marks it.
        assert_eq!(fault(a, FaultFlags::WRITE), VmFaultResult::Done);
        assert_eq!(
            fault(a + PAGE_SIZE, FaultFlags::empty()),
            VmFaultResult::Done
        );
        // Use up the machine's memory: the fault that finds none is OOM.
        let mut addr = a + 2 * PAGE_SIZE;
        let last = loop {
            let r = fault(addr, FaultFlags::WRITE);
            if r != VmFaultResult::Done {
                break r;
            }
            addr += PAGE_SIZE;
        };
        assert_eq!(last, VmFaultResult::Oom);
        assert_eq!(c.store_u8(addr, 1), Err(Errno::ENOMEM));
    }

    #[test]
    fn folio_pte_batch_stops_at_the_folio_and_at_max_nr() {
        let (m, f) = setup();
        let mut t = table(&m.mem, f);
        // Two more entries after the folio map the next PFNs: never batched.
        let next = t.pte(115).advance_pfn(1);
        t.set(116, next);
        t.set(117, next.advance_pfn(1));
        let b = |idx, max| folio_pte_batch(&m.mem, f, &t, idx, t.pte(idx), max, 0).nr;
        // The caller's bound is the end of its range in this table.
        assert_eq!(b(100, 412), 16, "clamped to the folio's end");
        assert_eq!(b(104, 408), 12, "from the middle, to the end");
        assert_eq!(b(100, 5), 5, "bounded by the caller");
        assert_eq!(b(115, 397), 1);
    }

    #[test]
    fn folio_pte_batch_compares_all_bits_but_the_ignored() {
        let (m, f) = setup();
        let mem = &m.mem;
        let mut t = table(mem, f);
        // Accessed and writable may differ; writable is reported.
        t.set(103, t.pte(103).mkold().wrprotect());
        let first = t.pte(100).wrprotect();
        t.set(100, first);
        let b = folio_pte_batch(mem, f, &t, 100, first, 16, 0);
        let (nr, any_writable) = (b.nr, b.any_writable);
        assert_eq!((nr, any_writable), (16, true));
        // Dirty differs: a batch only when told to ignore it.
        t.set(106, t.pte(106).mkclean());
        assert_eq!(folio_pte_batch(mem, f, &t, 100, first, 16, 0).nr, 6);
        let flags = FPB_IGNORE_DIRTY | FPB_IGNORE_SOFT_DIRTY;
        assert_eq!(folio_pte_batch(mem, f, &t, 100, first, 16, flags).nr, 16);
        // uffd-wp must agree, whatever the flags.
        t.set(110, Pte(t.pte(110).0 | _PAGE_UFFD_WP));
        assert_eq!(folio_pte_batch(mem, f, &t, 100, first, 16, flags).nr, 10);
        // A none entry ends the batch.
        t.set(108, Pte(0));
        assert_eq!(folio_pte_batch(mem, f, &t, 100, first, 16, flags).nr, 8);
    }
}
