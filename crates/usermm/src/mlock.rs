//! Locking memory (mm/mlock.c): `mlock`, `mlock2`, `munlock`, `mlockall`
//! and `munlockall` give a range's VMAs `VM_LOCKED` (and
//! `VM_LOCKONFAULT`) and account them in `mm->locked_vm`; the folios they
//! map are PG_mlocked, counted in `nr_mlock`, and kept on the unevictable
//! list, which reclaim never scans.
//!
//! Which folios are mlocked follows 6.18:
//! * a new folio of a fault in a locked VMA (`folio_add_lru_vma` calls
//!   [`mlock_new_folio`]);
//! * a folio a single rmap call maps whole into a locked VMA (the end of
//!   `folio_add_{anon,file}_rmap_*` calls [`mlock_vma_folio`]); a large
//!   folio mapped in part stays evictable, since reclaim may split it and
//!   free the part outside the VMA;
//! * every folio the mlock walk finds in the range, a large one only if
//!   the range maps all of it (`mlock_pte_range`);
//! * a folio that reclaim finds mapped whole by a locked VMA
//!   (`folio_referenced`: "restore the mlock which got missed").
//!
//! Each mapping a locked VMA loses munlocks (`folio_remove_rmap_*` calls
//! [`munlock_vma_folio`]). `mlock_count`, kept while the folio is on the
//! unevictable list, counts the locked VMAs that mlocked it; the folio
//! goes back to an evictable list when the count drops to zero. The count
//! may undercount (a folio mlocked while off the LRU is not counted), in
//! which case the folio leaves early and reclaim mlocks it again.
//!
//! # What the model does differently
//!
//! As in the kernel, the list moves wait in a per-CPU batch
//! (`mlock_fbatch`) until it fills or `lru_add_drain` drains it; PG_mlocked
//! and `nr_mlock` rise at once, but a munlock's fall only at the drain
//! (until then the batch holds a reference to the folio).
//!
//! The kernel raises `VM_IO` on a VMA while its mlock walk runs, so that a
//! reclaim rmap walk does not mlock a folio the walk is about to count.
//! The model's VMA flags are fixed for a VMA's life, so such a race may
//! count one mlock twice; the folio then stays unevictable until it is
//! freed, whose path clears PG_mlocked (`unevictable_pgs_cleared`).
//!
//! `RLIMIT_MEMLOCK` and `CAP_IPC_LOCK`, a task's in the kernel, are kept
//! in the mm: the model has no tasks apart from their mm.
//!
//! # Locking
//!
//! `mlock_fixup` and its walk run under mmap_lock held for writing; each
//! PTE table is walked under its lock, a huge PMD under the PMD lock. A
//! list move claims the folio by clearing PG_lru before it takes the
//! lruvec lock (see [`crate::phys::mm_inline`]); a folio someone else
//! holds off the LRU (isolated, or in an LRU batch) is left where it is,
//! and goes to the unevictable list when it is put back
//! ([`crate::swap`]'s `lru_add` sees PG_mlocked).

use std::ops::ControlFlow;

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::mm::vma::{VmFlags, Vma, VmaTree, VM_LOCKED, VM_LOCKED_MASK, VM_LOCKONFAULT};
use crate::mm::Mm;
use crate::pgtable::pagewalk::{walk_page_range, MmWalkOps, WalkAction, WalkLock};
use crate::pgtable::{self, Pmd, PmdSlot, PteRead};
use crate::phys::memmap::pg;
use crate::phys::mm_inline::{folio_evictable, LruvecGuard, MlockFbatch, MlockOp};
use crate::phys::{Folio, PhysMem, PAGE_MASK, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::{Arc, Ordering};
use crate::vmstat::{Event, NodeStat};

/// `mlock2`'s flag: lock pages as they are faulted in, not now.
pub const MLOCK_ONFAULT: u32 = 0x01;
/// `mlockall` flags.
pub const MCL_CURRENT: u32 = 1;
pub const MCL_FUTURE: u32 = 2;
pub const MCL_ONFAULT: u32 = 4;

/// `mlock_folio`: mlock a folio already on (or for now off) the LRU;
/// PG_mlocked and `nr_mlock` at once, the list move when this CPU's mlock
/// batch drains.
pub fn mlock_folio(mem: &PhysMem, folio: Folio, cpu: usize) {
    let head = folio.head(mem);
    if head.flags.fetch_or(pg::MLOCKED, Ordering::Relaxed) & pg::MLOCKED == 0 {
        let nr = folio.nr_pages(mem);
        mem.mod_node_state(NodeStat::NR_MLOCK, nr as i64);
        mem.vmstat.count(cpu, Event::UNEVICTABLE_PGMLOCKED, nr);
    }
    mlock_fbatch_add(mem, cpu, folio, MlockOp::Lru);
}

/// `mlock_new_folio`: a folio a fault just allocated for a locked VMA,
/// not yet on any list; the batch puts it on the unevictable list.
pub fn mlock_new_folio(mem: &PhysMem, folio: Folio, cpu: usize) {
    let head = folio.head(mem);
    debug_assert!(
        !head.test(pg::LRU),
        "new folio {:#x} on the LRU",
        folio.pfn()
    );
    let nr = folio.nr_pages(mem);
    head.set(pg::MLOCKED);
    mem.mod_node_state(NodeStat::NR_MLOCK, nr as i64);
    mem.vmstat.count(cpu, Event::UNEVICTABLE_PGMLOCKED, nr);
    mlock_fbatch_add(mem, cpu, folio, MlockOp::New);
}

/// `munlock_folio`: one locked VMA fewer maps the folio. Whether it was
/// the last is decided when the batch drains ([`__munlock_folio`]).
pub fn munlock_folio(mem: &PhysMem, folio: Folio, cpu: usize) {
    mlock_fbatch_add(mem, cpu, folio, MlockOp::Munlock);
}

/// Queue `folio` on this CPU's mlock batch, with a reference; drain the
/// batch when it is full, for a large folio (`folio_may_be_lru_cached`),
/// or while the LRU caches are disabled.
fn mlock_fbatch_add(mem: &PhysMem, cpu: usize, folio: Folio, op: MlockOp) {
    folio.get(mem);
    let mut fb = mem.cpu_fbatches[cpu].lock();
    if fb.mlock.add(folio, op) == 0 || folio.is_large(mem) || crate::swap::lru_cache_disabled(mem) {
        let batch = fb.mlock.take();
        mlock_folio_batch(mem, cpu, &batch);
    }
}

/// `mlock_drain_local`: drain this CPU's mlock batch.
pub fn mlock_drain_local(mem: &PhysMem, cpu: usize) {
    let mut fb = mem.cpu_fbatches[cpu].lock();
    let batch = fb.mlock.take();
    if !batch.folios.is_empty() {
        mlock_folio_batch(mem, cpu, &batch);
    }
}

/// `mlock_folio_batch`: apply each queued op under the lruvec lock (taken
/// once per run of one node's folios), then drop the batch's references.
pub(crate) fn mlock_folio_batch(mem: &PhysMem, cpu: usize, batch: &MlockFbatch) {
    let mut held = None;
    for (folio, op) in batch.iter() {
        match op {
            MlockOp::Lru => __mlock_folio(mem, cpu, &mut held, folio),
            MlockOp::New => __mlock_new_folio(mem, cpu, &mut held, folio),
            MlockOp::Munlock => __munlock_folio(mem, cpu, &mut held, folio),
        }
    }
    drop(held);
    crate::swap::folios_put_refs(mem, batch.folios.iter().map(|f| (f, 1)), cpu);
}

/// `__mlock_folio`: move a folio on the LRU to the unevictable list, or
/// count one more mlock of a folio already there.
fn __mlock_folio<'a>(
    mem: &'a PhysMem,
    cpu: usize,
    held: &mut Option<LruvecGuard<'a>>,
    folio: Folio,
) {
    let head = folio.head(mem);
    // Off the LRU: whoever holds it puts it back where its flags say.
    if !head.test_and_clear(pg::LRU) {
        return;
    }
    let nr = folio.nr_pages(mem);
    let lruvec = mem.folio_lruvec_relock(held, folio);
    if folio_evictable(mem, folio) {
        // PG_mlocked went meanwhile (a munlock ahead of this in the batch).
        if head.test(pg::UNEVICTABLE) {
            lruvec.del_folio(folio);
            head.clear(pg::UNEVICTABLE);
            lruvec.add_folio(folio);
            mem.vmstat.count(cpu, Event::UNEVICTABLE_PGRESCUED, nr);
        }
    } else if head.test(pg::UNEVICTABLE) {
        let count = lruvec.mlock_count(folio);
        lruvec.set_mlock_count(folio, count + 1);
    } else {
        lruvec.del_folio(folio);
        head.clear(pg::ACTIVE);
        head.set(pg::UNEVICTABLE);
        lruvec.add_folio(folio);
        lruvec.set_mlock_count(folio, 1);
        mem.vmstat.count(cpu, Event::UNEVICTABLE_PGCULLED, nr);
    }
    head.set(pg::LRU);
}

/// `__mlock_new_folio`: a new folio onto the unevictable list with one
/// mlock counted (or onto its evictable list, if a munlock came first).
fn __mlock_new_folio<'a>(
    mem: &'a PhysMem,
    cpu: usize,
    held: &mut Option<LruvecGuard<'a>>,
    folio: Folio,
) {
    let head = folio.head(mem);
    debug_assert!(
        !head.test(pg::LRU),
        "new folio {:#x} on the LRU",
        folio.pfn()
    );
    let lruvec = mem.folio_lruvec_relock(held, folio);
    if folio_evictable(mem, folio) {
        lruvec.add_folio(folio);
    } else {
        head.set(pg::UNEVICTABLE);
        lruvec.add_folio(folio);
        lruvec.set_mlock_count(folio, 1);
        mem.vmstat
            .count(cpu, Event::UNEVICTABLE_PGCULLED, folio.nr_pages(mem));
    }
    head.set(pg::LRU);
}

/// `__munlock_folio`: the last munlock (the count dropping to zero, or a
/// folio off the LRU) clears PG_mlocked and puts the folio back on an
/// evictable list.
fn __munlock_folio<'a>(
    mem: &'a PhysMem,
    cpu: usize,
    held: &mut Option<LruvecGuard<'a>>,
    folio: Folio,
) {
    let head = folio.head(mem);
    let nr = folio.nr_pages(mem);
    let isolated = head.test_and_clear(pg::LRU);
    if isolated {
        let lruvec = mem.folio_lruvec_relock(held, folio);
        if head.test(pg::UNEVICTABLE) {
            // The count may undercount: a zero is taken as the last.
            let count = lruvec.mlock_count(folio).saturating_sub(1);
            lruvec.set_mlock_count(folio, count);
            if count > 0 {
                head.set(pg::LRU);
                return;
            }
        }
    }
    if head.test_and_clear(pg::MLOCKED) {
        mem.mod_node_state(NodeStat::NR_MLOCK, -(nr as i64));
        let event = if isolated || !head.test(pg::UNEVICTABLE) {
            Event::UNEVICTABLE_PGMUNLOCKED
        } else {
            Event::UNEVICTABLE_PGSTRANDED
        };
        mem.vmstat.count(cpu, event, nr);
    }
    if isolated {
        let lruvec = mem.folio_lruvec_relock(held, folio);
        // Evictable is decided after PG_mlocked is cleared.
        if head.test(pg::UNEVICTABLE) && folio_evictable(mem, folio) {
            lruvec.del_folio(folio);
            head.clear(pg::UNEVICTABLE);
            lruvec.add_folio(folio);
            mem.vmstat.count(cpu, Event::UNEVICTABLE_PGRESCUED, nr);
        }
        head.set(pg::LRU);
    }
}

/// `mlock_vma_folio`: mlock the folio if the VMA (whose flags are given)
/// is locked. The kernel also refuses a `VM_SPECIAL` VMA, which the model
/// has none of.
#[inline]
pub fn mlock_vma_folio(mem: &PhysMem, folio: Folio, vm_flags: VmFlags, cpu: usize) {
    if vm_flags & VM_LOCKED != 0 {
        mlock_folio(mem, folio, cpu);
    }
}

/// `munlock_vma_folio`: a locked VMA (whose flags are given) no longer
/// maps the folio.
#[inline]
pub fn munlock_vma_folio(mem: &PhysMem, folio: Folio, vm_flags: VmFlags, cpu: usize) {
    if vm_flags & VM_LOCKED != 0 {
        munlock_folio(mem, folio, cpu);
    }
}

/// `folio_within_range`: does `[start, end)` of the VMA map the whole
/// folio, at the address its index says?
fn folio_within_range(mem: &PhysMem, folio: Folio, vma: &Vma, start: u64, end: u64) -> bool {
    let (start, end) = (start.max(vma.start()), end.min(vma.end()));
    let pgoff = folio.head(mem).index.load(Ordering::Relaxed);
    let Some(addr) = vma.address_of(pgoff) else {
        return false;
    };
    addr >= start && end.saturating_sub(addr) >= folio.nr_pages(mem) * PAGE_SIZE
}

/// `allow_mlock_munlock`: a munlock is always allowed; an mlock of a large
/// folio only where this walk's range maps all of it with `step` PTEs.
fn allow_mlock_munlock(
    mem: &PhysMem,
    folio: Folio,
    vma: &Vma,
    range: (u64, u64),
    step: u64,
) -> bool {
    vma.flags() & VM_LOCKED == 0
        || !folio.is_large(mem)
        || (folio_within_range(mem, folio, vma, range.0, range.1) && step == folio.nr_pages(mem))
}

/// `mlock_walk_ops`: mlock, or munlock, every folio mapped in the range,
/// as the VMA's new flags say.
struct MlockWalk<'a> {
    oncpu: &'a OnCpu<'a>,
    mm: &'a Arc<Mm>,
    vma: &'a Vma,
}

impl MlockWalk<'_> {
    fn apply(&self, folio: Folio) {
        let (mem, cpu) = (self.oncpu.mem(), self.oncpu.id());
        if self.vma.flags() & VM_LOCKED != 0 {
            mlock_folio(mem, folio, cpu);
        } else {
            munlock_folio(mem, folio, cpu);
        }
    }

    /// The PTE half of `mlock_pte_range`: a large folio is stepped over
    /// in one go, as far as its PTEs run on in this table.
    fn pte_range(&self, slot: PmdSlot, addr: u64, end: u64) {
        let mem = self.oncpu.mem();
        let Some(pt) = self.mm.pte_offset_map_lock(slot) else {
            return;
        };
        let mut a = addr;
        while a < end {
            let idx = pgtable::pte_index(a);
            let pte = pt.pte(idx);
            let page = pte
                .present()
                .then(|| crate::memory::vm_normal_page(pte))
                .flatten();
            let Some(page) = page else {
                a += PAGE_SIZE;
                continue;
            };
            let folio = mem.page_folio(page);
            let step = if folio.is_large(mem) {
                let max_nr = ((end - a) >> PAGE_SHIFT) as usize;
                let flags = crate::memory::FPB_IGNORE_DIRTY | crate::memory::FPB_IGNORE_SOFT_DIRTY;
                crate::memory::folio_pte_batch(mem, folio, &pt, idx, pte, max_nr, flags).nr as u64
            } else {
                1
            };
            if allow_mlock_munlock(mem, folio, self.vma, (addr, end), step) {
                self.apply(folio);
            }
            a += step * PAGE_SIZE;
        }
    }
}

impl MmWalkOps for MlockWalk<'_> {
    type Break = std::convert::Infallible;

    /// `mlock_pte_range`: a huge PMD's folio is mlocked whole (the huge
    /// zero page and migration entries are skipped); a PTE table is
    /// walked under its lock.
    fn pmd_entry(
        &mut self,
        slot: PmdSlot,
        pmd: Pmd,
        addr: u64,
        next: u64,
    ) -> ControlFlow<Self::Break, WalkAction> {
        let huge = crate::huge_memory::pmd_is_huge;
        if huge(pmd) {
            let ptl = self.mm.pmd_lock(slot);
            let pmd = ptl.get();
            if huge(pmd) {
                if pmd.present() && !crate::huge_memory::is_huge_zero_pmd(self.oncpu, pmd) {
                    self.apply(Folio(pmd.pfn()));
                }
                return ControlFlow::Continue(WalkAction::Continue);
            }
        }
        if !self.mm.pmd_get(slot).none() {
            self.pte_range(slot, addr, next);
        }
        ControlFlow::Continue(WalkAction::Continue)
    }
}

/// `mlock_vma_pages_range`: mlock the folios already mapped in `[start,
/// end)` of `vma`, which has just been given `VM_LOCKED`, or munlock them
/// all if it has just lost it.
fn mlock_vma_pages_range(oncpu: &OnCpu, mm: &Arc<Mm>, vma: &Vma, start: u64, end: u64) {
    let mem = oncpu.mem();
    crate::swap::lru_add_drain(mem, oncpu.id());
    let mut walk = MlockWalk { oncpu, mm, vma };
    let flow = walk_page_range(mem, &mm.pgd, start, end, WalkLock::Ptl, &mut walk);
    debug_assert!(flow.is_continue());
    crate::swap::lru_add_drain(mem, oncpu.id());
}

/// `mlock_fixup`: give `[start, end)` of `vma` the flags `newflags`
/// (splitting or merging), account the change in `locked_vm`, and mlock or
/// munlock what is mapped there. Returns the VMA that covers the range
/// now. mmap_lock held for writing.
fn mlock_fixup(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    vma: &Arc<Vma>,
    range: (u64, u64),
    newflags: VmFlags,
) -> KResult<Arc<Vma>> {
    let (start, end) = range;
    let oldflags = vma.flags();
    if newflags == oldflags {
        return Ok(vma.clone());
    }
    let vma = crate::mmap::vma_modify_flags(oncpu, mm, tree, start, end, newflags)?;
    let nr_pages = (end - start) >> PAGE_SHIFT;
    if newflags & VM_LOCKED == 0 {
        mm.locked_vm.fetch_sub(nr_pages, Ordering::Relaxed);
    } else if oldflags & VM_LOCKED == 0 {
        mm.locked_vm.fetch_add(nr_pages, Ordering::Relaxed);
    }
    // Locked before and after (only VM_LOCKONFAULT changed): mlocking
    // twice would be wrong.
    if newflags & oldflags & VM_LOCKED == 0 {
        mlock_vma_pages_range(oncpu, mm, &vma, start, end);
    }
    Ok(vma)
}

/// `apply_vma_lock_flags`: the lock flags of every VMA in `[start, start +
/// len)` become `flags`. ENOMEM if the range begins outside a VMA or
/// crosses a hole; the VMAs before the hole keep their change.
fn apply_vma_lock_flags(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    start: u64,
    len: u64,
    flags: VmFlags,
) -> KResult<()> {
    let end = start.checked_add(len).ok_or(Errno::EINVAL)?;
    if end == start {
        return Ok(());
    }
    let Some(first) = tree.vma_lookup(start) else {
        return Err(Errno::ENOMEM);
    };
    let mut tmp = first.start();
    let mut nstart = start;
    while let Some(vma) = tree.find_vma(nstart).filter(|v| v.start() < end).cloned() {
        if vma.start() != tmp {
            return Err(Errno::ENOMEM);
        }
        let newflags = (vma.flags() & !VM_LOCKED_MASK) | flags;
        tmp = vma.end().min(end);
        let vma = mlock_fixup(oncpu, mm, tree, &vma, (nstart, tmp), newflags)?;
        tmp = vma.end();
        nstart = tmp;
    }
    if tmp < end {
        return Err(Errno::ENOMEM);
    }
    Ok(())
}

/// `count_mm_mlocked_page_nr`: pages of `[start, start + len)` inside
/// locked VMAs, already counted in `locked_vm`. Computed as the kernel
/// does, in wrapping unsigned arithmetic.
fn count_mm_mlocked_page_nr(tree: &VmaTree, start: u64, len: u64) -> u64 {
    let end = start.saturating_add(len);
    let mut count: u64 = 0;
    for vma in tree.range(start, end) {
        if vma.flags() & VM_LOCKED == 0 {
            continue;
        }
        if start > vma.start() {
            count = count.wrapping_sub(start - vma.start());
        }
        if end < vma.end() {
            count = count.wrapping_add(end - vma.start());
            break;
        }
        count = count.wrapping_add(vma.end() - vma.start());
    }
    count >> PAGE_SHIFT
}

/// `can_do_mlock`: a non-zero `RLIMIT_MEMLOCK`, or `CAP_IPC_LOCK`.
fn can_do_mlock(mm: &Mm) -> bool {
    mm.memlock_limit() != 0 || mm.cap_ipc_lock()
}

/// `__mlock_posix_error_return`: GUP's errors as mlock reports them.
fn mlock_posix_error(e: Errno) -> Errno {
    match e {
        Errno::EFAULT => Errno::ENOMEM,
        Errno::ENOMEM => Errno::EAGAIN,
        e => e,
    }
}

/// `do_mlock`: `mlock(2)` and `mlock2(2)`.
pub fn do_mlock(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, len: u64, flags: VmFlags) -> KResult<()> {
    if !can_do_mlock(mm) {
        return Err(Errno::EPERM);
    }
    // PAGE_ALIGN(len + offset_in_page(start)), wrapping as the kernel's.
    let len = len
        .wrapping_add(start & !PAGE_MASK)
        .wrapping_add(PAGE_SIZE - 1)
        & PAGE_MASK;
    let start = start & PAGE_MASK;
    let lock_limit = mm.memlock_limit() >> PAGE_SHIFT;
    {
        let _g = mm.mmap_lock.write();
        let mut tree = mm.vma_tree_draft();
        let mut locked = (len >> PAGE_SHIFT) + mm.locked_vm.load(Ordering::Relaxed);
        let cap = mm.cap_ipc_lock();
        if locked > lock_limit && !cap {
            // What the range already has locked is not locked again.
            locked -= count_mm_mlocked_page_nr(&tree, start, len);
        }
        let result = if locked <= lock_limit || cap {
            apply_vma_lock_flags(oncpu, mm, &mut tree, start, len, flags)
        } else {
            Err(Errno::ENOMEM)
        };
        mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
        result?;
    }
    crate::gup::mm_populate(oncpu, mm, start, len, false).map_err(mlock_posix_error)
}

/// `mlock2(2)`'s flags: `MLOCK_ONFAULT` or none (EINVAL).
pub fn mlock2_flags(flags: u32) -> KResult<VmFlags> {
    if flags & !MLOCK_ONFAULT != 0 {
        return Err(Errno::EINVAL);
    }
    Ok(if flags & MLOCK_ONFAULT != 0 {
        VM_LOCKED | VM_LOCKONFAULT
    } else {
        VM_LOCKED
    })
}

/// `munlock(2)`.
pub fn do_munlock(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, len: u64) -> KResult<()> {
    let len = len
        .wrapping_add(start & !PAGE_MASK)
        .wrapping_add(PAGE_SIZE - 1)
        & PAGE_MASK;
    let start = start & PAGE_MASK;
    let _g = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_draft();
    let result = apply_vma_lock_flags(oncpu, mm, &mut tree, start, len, 0);
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    result
}

/// `apply_mlockall_flags`: `mm->def_flags` for future mappings, and the
/// lock flags of every VMA for `MCL_CURRENT` (cleared without it: a second
/// call does not stack on the first). Errors of single VMAs are ignored.
fn apply_mlockall_flags(oncpu: &OnCpu, mm: &Arc<Mm>, tree: &mut VmaTree, flags: u32) {
    let mut def = mm.def_flags.load(Ordering::Relaxed) & !VM_LOCKED_MASK;
    if flags & MCL_FUTURE != 0 {
        def |= VM_LOCKED;
        if flags & MCL_ONFAULT != 0 {
            def |= VM_LOCKONFAULT;
        }
    }
    mm.def_flags.store(def, Ordering::Relaxed);
    if flags & MCL_FUTURE != 0 && flags & MCL_CURRENT == 0 {
        return;
    }
    let mut to_add = 0;
    if flags & MCL_CURRENT != 0 {
        to_add = VM_LOCKED;
        if flags & MCL_ONFAULT != 0 {
            to_add |= VM_LOCKONFAULT;
        }
    }
    let ranges: Vec<(u64, u64)> = tree.iter().map(|v| (v.start(), v.end())).collect();
    for (start, end) in ranges {
        // A merge with the VMA before may have replaced this one.
        let Some(vma) = tree.vma_lookup(start).cloned() else {
            continue;
        };
        let newflags = (vma.flags() & !VM_LOCKED_MASK) | to_add;
        let _ = mlock_fixup(oncpu, mm, tree, &vma, (start, end), newflags);
    }
}

/// `mlockall(2)`.
pub fn do_mlockall(oncpu: &OnCpu, mm: &Arc<Mm>, flags: u32) -> KResult<()> {
    if flags == 0 || flags & !(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) != 0 || flags == MCL_ONFAULT
    {
        return Err(Errno::EINVAL);
    }
    if !can_do_mlock(mm) {
        return Err(Errno::EPERM);
    }
    let lock_limit = mm.memlock_limit() >> PAGE_SHIFT;
    {
        let _g = mm.mmap_lock.write();
        let total_vm = mm.total_vm.load(Ordering::Relaxed);
        if flags & MCL_CURRENT != 0 && total_vm > lock_limit && !mm.cap_ipc_lock() {
            return Err(Errno::ENOMEM);
        }
        let mut tree = mm.vma_tree_draft();
        apply_mlockall_flags(oncpu, mm, &mut tree, flags);
        mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    }
    if flags & MCL_CURRENT != 0 {
        let _ = crate::gup::mm_populate(oncpu, mm, 0, crate::mm::TASK_SIZE, true);
    }
    Ok(())
}

/// `munlockall(2)`.
pub fn do_munlockall(oncpu: &OnCpu, mm: &Arc<Mm>) -> KResult<()> {
    let _g = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_draft();
    apply_mlockall_flags(oncpu, mm, &mut tree, 0);
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    Ok(())
}

/// `mlock_future_ok`: may a new mapping of `len` bytes with `vm_flags`
/// be locked (`mmap` with `MAP_LOCKED`, or after `mlockall(MCL_FUTURE)`)?
pub fn mlock_future_ok(mm: &Mm, vm_flags: VmFlags, len: u64) -> bool {
    if vm_flags & VM_LOCKED == 0 || mm.cap_ipc_lock() {
        return true;
    }
    let locked = (len >> PAGE_SHIFT) + mm.locked_vm.load(Ordering::Relaxed);
    locked <= mm.memlock_limit() >> PAGE_SHIFT
}
