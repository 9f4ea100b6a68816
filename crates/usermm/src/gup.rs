//! Populating a range (the part of mm/gup.c that `mlock`, `mlockall`,
//! `MAP_POPULATE` and `MAP_LOCKED` use): `__mm_populate` and
//! `populate_vma_page_range`, which fault in each page that is not yet
//! mapped as the VMA needs it.
//!
//! The kernel reaches the pages through `__get_user_pages`, which looks
//! each one up (`follow_page_mask`) and faults only those missing, or
//! mapped read-only where a write is wanted; the model does the same
//! look-up on the page tables and calls the fault handler for the rest.
//! It takes no page references: nothing here pins pages (`FOLL_PIN`).
//!
//! # Locking
//!
//! mmap_lock is held for reading across the walk, and each look-up reads
//! the entry under its table's lock; the fault handler is entered as from
//! the mmap_lock path (the fault then sees the VMA it was given).

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::memory::{self, FaultFlags, VmFaultResult};
use crate::mm::vma::{Vma, VM_EXEC, VM_LOCKONFAULT, VM_READ, VM_SHARED, VM_WRITE};
use crate::mm::Mm;
use crate::pgtable::PteRead;
use crate::phys::{Pfn, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::Arc;

/// `follow_page_mask`, in short: the page mapped at `addr` (writable if
/// `write`), if any; with `FOLL_TOUCH`, its folio is marked accessed. (A
/// huge PMD answers for its whole range.)
fn follow_page(mm: &Mm, addr: u64, write: bool) -> Option<Pfn> {
    let slot = mm.pmd_lookup(addr)?;
    let ptl = mm.pmd_lock(slot);
    let pmd = ptl.get();
    let pfn = if crate::huge_memory::pmd_is_huge(pmd) {
        (pmd.present() && (!write || pmd.write())).then(|| pmd.pfn())?
    } else {
        drop(ptl);
        if pmd.none() {
            return None;
        }
        let pt = mm.pte_offset_map_lock(slot)?;
        let pte = pt.pte(crate::pgtable::pte_index(addr));
        (pte.present() && (!write || pte.write())).then(|| pte.pfn())?
    };
    // The zero pages are no folios to mark.
    let mem = &mm.mem;
    if !mem.page(pfn).test(crate::phys::memmap::pg::ZERO) {
        crate::swap::folio_mark_accessed(mem, mem.page_folio(pfn));
    }
    Some(pfn)
}

/// The loop of `__get_user_pages` over `[start, end)` of one VMA: each
/// page looked up, faulted in where it is not mapped as asked, and looked
/// up again (`goto retry`); a page a fault leaves unmapped twice more is
/// passed over. The first fault that fails ends it: ENOMEM for OOM,
/// EFAULT for a signal.
fn get_user_pages_vma(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    vma: &Arc<Vma>,
    (start, end): (u64, u64),
    write: bool,
) -> KResult<()> {
    let flags = if write {
        FaultFlags::WRITE
    } else {
        FaultFlags::empty()
    };
    let mut addr = start;
    let mut tries = 0;
    while addr < end {
        if follow_page(mm, addr, write).is_some() || tries > 2 {
            addr += PAGE_SIZE;
            tries = 0;
            continue;
        }
        tries += 1;
        match memory::handle_mm_fault(oncpu, mm, vma, addr, flags) {
            VmFaultResult::Oom => return Err(Errno::ENOMEM),
            VmFaultResult::Sigsegv | VmFaultResult::Sigbus => return Err(Errno::EFAULT),
            _ => {}
        }
    }
    Ok(())
}

/// `populate_vma_page_range`: fault in `[start, end)` of `vma`, with write
/// faults for a private writable VMA (breaking COW) and read faults
/// otherwise. A `VM_LOCKONFAULT` VMA has nothing to do; an inaccessible one
/// is EFAULT. Returns the pages done.
pub fn populate_vma_page_range(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    vma: &Arc<Vma>,
    start: u64,
    end: u64,
) -> KResult<u64> {
    let nr_pages = (end - start) >> PAGE_SHIFT;
    if vma.flags() & VM_LOCKONFAULT != 0 {
        return Ok(nr_pages);
    }
    if vma.flags() & (VM_READ | VM_WRITE | VM_EXEC) == 0 {
        return Err(Errno::EFAULT);
    }
    let write = vma.flags() & (VM_WRITE | VM_SHARED) == VM_WRITE;
    let result = get_user_pages_vma(oncpu, mm, vma, (start, end), write).map(|()| nr_pages);
    // Drained whether the walk got through or not (the kernel drains
    // after `__get_user_pages` returns, error or not): the folios it
    // faulted in, and whatever the batches held, go to their lists.
    crate::swap::lru_add_drain(oncpu.mem(), oncpu.id());
    result
}

/// `faultin_page_range` (`MADV_POPULATE_READ` and `_WRITE`): fault in
/// `[start, end)` for reading or writing, without `FOLL_FORCE`. A hole is
/// ENOMEM, a VMA that does not allow the access EINVAL, a fault that
/// would signal EFAULT; the pages before stay populated.
pub fn faultin_page_range(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    start: u64,
    end: u64,
    write: bool,
) -> KResult<()> {
    let result = (|| {
        let _g = mm.mmap_lock.read();
        let guard = crate::sync::epoch::pin();
        let needed = if write { VM_WRITE } else { VM_READ };
        let mut addr = start;
        while addr < end {
            let Some(vma) = mm.vma_tree(&guard).vma_lookup(addr).cloned() else {
                return Err(Errno::ENOMEM);
            };
            if vma.flags() & needed == 0 {
                return Err(Errno::EINVAL);
            }
            let to = vma.end().min(end);
            get_user_pages_vma(oncpu, mm, &vma, (addr, to), write)?;
            addr = to;
        }
        Ok(())
    })();
    crate::swap::lru_add_drain(oncpu.mem(), oncpu.id());
    result
}

/// `__mm_populate`: populate every VMA of `[start, start + len)`. An
/// error ends the walk unless `ignore_errors` (`mm_populate`, of
/// `MAP_POPULATE` and `mlockall`), which goes on with the next VMA.
pub fn mm_populate(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    start: u64,
    len: u64,
    ignore_errors: bool,
) -> KResult<()> {
    let end = start.saturating_add(len);
    let _g = mm.mmap_lock.read();
    let guard = crate::sync::epoch::pin();
    let mut nstart = start;
    while nstart < end {
        let Some(vma) = mm
            .vma_tree(&guard)
            .find_vma_intersection(nstart, end)
            .cloned()
        else {
            break;
        };
        let nend = end.min(vma.end());
        let s = nstart.max(vma.start());
        match populate_vma_page_range(oncpu, mm, &vma, s, nend) {
            Ok(_) => {}
            Err(_) if ignore_errors => {}
            Err(e) => return Err(e),
        }
        nstart = nend;
    }
    Ok(())
}
