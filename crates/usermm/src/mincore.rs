//! `mincore(2)` (mm/mincore.c): which pages of a range are resident. A
//! page mapped by a present entry is, as is one under migration (its
//! entry is "always uptodate"); a huge PMD answers for its whole range;
//! where nothing is mapped (or a PTE marker stands), a file mapping's page
//! is resident if it is in the page cache, an anonymous one's is not (the
//! model has no swap cache to look in).
//!
//! The kernel shows a file mapping's page cache only to a process that
//! could open the file for writing (`can_do_mincore`), and reports every
//! page resident otherwise; the model's processes are the file's owner.
//!
//! # Locking
//!
//! mmap_lock is held for reading; each PTE table is read under its lock, a
//! huge PMD under the PMD lock.

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::mm::{Mm, Vma, TASK_SIZE};
use crate::pgtable::PteRead;
use crate::phys::{PhysMem, PAGE_MASK, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::Arc;

/// `sys_mincore`: one byte per page of `[start, start + len)`, 1 where the
/// page is resident.
pub fn sys_mincore(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, len: u64) -> KResult<Vec<u8>> {
    if start & !PAGE_MASK != 0 {
        return Err(Errno::EINVAL);
    }
    // access_ok: the range must lie in the user address space.
    match start.checked_add(len) {
        Some(end) if end <= TASK_SIZE => {}
        _ => return Err(Errno::ENOMEM),
    }
    let pages = (len >> PAGE_SHIFT) + u64::from(len & !PAGE_MASK != 0);
    let mut vec = Vec::with_capacity(pages as usize);
    let _g = mm.mmap_lock.read();
    let guard = crate::sync::epoch::pin();
    let mut addr = start;
    let end = start + (pages << PAGE_SHIFT);
    while addr < end {
        // do_mincore: one VMA at a time; a hole ends it with ENOMEM.
        let Some(vma) = mm.vma_tree(&guard).vma_lookup(addr).cloned() else {
            return Err(Errno::ENOMEM);
        };
        let stop = vma.end().min(end);
        while addr < stop {
            vec.push(mincore_page_at(oncpu.mem(), mm, &vma, addr));
            addr += PAGE_SIZE;
        }
    }
    Ok(vec)
}

/// `mincore_pte_range` for the page at `addr` of `vma`.
fn mincore_page_at(mem: &PhysMem, mm: &Mm, vma: &Vma, addr: u64) -> u8 {
    let Some(slot) = mm.pmd_lookup(addr) else {
        return mincore_unmapped(mem, vma, addr);
    };
    let pmd = mm.pmd_lock(slot).get();
    if crate::huge_memory::pmd_is_huge(pmd) {
        return 1;
    }
    if pmd.none() {
        return mincore_unmapped(mem, vma, addr);
    }
    let Some(pt) = mm.pte_offset_map_lock(slot) else {
        return mincore_unmapped(mem, vma, addr);
    };
    let pte = pt.pte(crate::pgtable::pte_index(addr));
    if pte.present() {
        return 1;
    }
    let marker = pte.is_swap()
        && matches!(
            pte.swp_entry().kind(),
            crate::pgtable::swapops::SwpKind::Marker(_)
        );
    if pte.none() || marker {
        drop(pt);
        return mincore_unmapped(mem, vma, addr);
    }
    // A migration (or poison) entry: "always uptodate".
    1
}

/// `__mincore_unmapped_range` for one page: in a file's page cache, or
/// not resident.
fn mincore_unmapped(mem: &PhysMem, vma: &Vma, addr: u64) -> u8 {
    match vma.file() {
        Some(f) => u8::from(
            f.mapping()
                .lookup(mem, vma.linear_page_index(addr))
                .is_some(),
        ),
        None => 0,
    }
}
