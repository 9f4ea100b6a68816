//! madvise (mm/madvise.c): MADV_DONTNEED, MADV_FREE, MADV_HUGEPAGE and
//! MADV_NOHUGEPAGE.
//!
//! DONTNEED and FREE run under mmap_lock for reading, so two of them may run
//! on one mm at once; their gathers then end in a full flush
//! (`mm_tlb_flush_nested`). HUGEPAGE and NOHUGEPAGE change VMA flags and take
//! it for writing.

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::memory::{self, vm_normal_page};
use crate::mm::vma::*;
use crate::mm::{Mm, Vma};
use crate::mmap::{merge_around, split_range};
use crate::mmu_gather::MmuGather;
use crate::pgtable::{self, addr_end, entry_get, entry_set, Pte, PMD_SIZE};
use crate::phys::memmap::pg;
use crate::phys::{PAGE_MASK, PAGE_SIZE};
use crate::sync::Arc;
use crate::vmstat::Event;

pub const MADV_NORMAL: i32 = 0;
pub const MADV_DONTNEED: i32 = 4;
pub const MADV_FREE: i32 = 8;
pub const MADV_HUGEPAGE: i32 = 14;
pub const MADV_NOHUGEPAGE: i32 = 15;

/// `madvise(2)`.
pub fn do_madvise(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    start: u64,
    len_in: u64,
    advice: i32,
) -> KResult<()> {
    if ![
        MADV_NORMAL,
        MADV_DONTNEED,
        MADV_FREE,
        MADV_HUGEPAGE,
        MADV_NOHUGEPAGE,
    ]
    .contains(&advice)
    {
        return Err(Errno::EINVAL);
    }
    if start & !PAGE_MASK != 0 {
        return Err(Errno::EINVAL);
    }
    let len = len_in
        .checked_add(PAGE_SIZE - 1)
        .map(|l| l & PAGE_MASK)
        .ok_or(Errno::EINVAL)?;
    if len_in != 0 && len == 0 {
        return Err(Errno::EINVAL);
    }
    let end = start.checked_add(len).ok_or(Errno::EINVAL)?;
    if end == start {
        return Ok(());
    }
    match advice {
        MADV_DONTNEED | MADV_FREE => {
            let _g = mm.mmap_lock.read();
            let vmas: Vec<Arc<Vma>> = {
                let guard = crossbeam_epoch::pin();
                let t = mm.vma_tree(&guard);
                t.vmas[t.range(start, end)].to_vec()
            };
            let unmapped = has_hole(&vmas, start, end);
            for vma in &vmas {
                if vma.flags() & VM_LOCKED != 0 {
                    return Err(Errno::EINVAL);
                }
                let s = start.max(vma.start());
                let e = end.min(vma.end());
                if advice == MADV_DONTNEED {
                    zap_page_range_single(oncpu, mm, s, e);
                } else {
                    madvise_free_single_vma(oncpu, mm, s, e);
                }
            }
            if unmapped {
                Err(Errno::ENOMEM)
            } else {
                Ok(())
            }
        }
        _ => {
            let _g = mm.mmap_lock.write();
            let mut tree = mm.vma_tree_clone();
            let mut addr = start;
            let mut result = Ok(());
            while addr < end {
                let Some(vma) = tree.find_vma(addr).cloned().filter(|v| v.start() < end) else {
                    result = Err(Errno::ENOMEM);
                    break;
                };
                if vma.start() > addr {
                    result = Err(Errno::ENOMEM);
                }
                let s = addr.max(vma.start());
                let e = end.min(vma.end());
                let flags = match advice {
                    MADV_HUGEPAGE => (vma.flags() & !VM_NOHUGEPAGE) | VM_HUGEPAGE,
                    MADV_NOHUGEPAGE => (vma.flags() & !VM_HUGEPAGE) | VM_NOHUGEPAGE,
                    _ => vma.flags(),
                };
                if flags != vma.flags() {
                    let r = split_range(oncpu, mm, &mut tree, s, e)?;
                    tree.vmas[r.start].set_flags(flags);
                    merge_around(&mut tree, r.start);
                }
                addr = e;
            }
            mm.vma_tree_publish(tree, &crossbeam_epoch::pin());
            result
        }
    }
}

fn has_hole(vmas: &[Arc<Vma>], start: u64, end: u64) -> bool {
    let mut at = start;
    for v in vmas {
        if v.start() > at {
            return true;
        }
        at = v.end();
    }
    at < end
}

/// `zap_page_range_single`.
pub fn zap_page_range_single(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, end: u64) {
    let mut tlb = MmuGather::new(mm);
    memory::unmap_page_range(oncpu, &mut tlb, start, end);
    tlb.finish(oncpu);
}

/// `madvise_free_single_vma`: mark exclusively mapped anon pages clean and
/// lazily freeable. Without reclaim they are never discarded, so contents
/// stay readable, as on a host with no memory pressure. Large folios that the
/// range covers only in part would be split by the kernel; the model leaves
/// them untouched.
fn madvise_free_single_vma(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, end: u64) {
    let mem = oncpu.mem();
    let mut tlb = MmuGather::new(mm);
    let mut addr = start;
    while addr < end {
        let next = addr_end(addr, end, PMD_SIZE);
        if let Some(slot) = mm.pmd_lookup(addr) {
            if !mm.pmd_get(slot).trans_huge() {
                if let Some(locked) = mm.pte_offset_map_lock(slot) {
                    let mut a = addr;
                    while a < next {
                        let idx = pgtable::pte_index(a);
                        let pte = Pte(entry_get(mem, locked.table, idx));
                        if let Some(page) = vm_normal_page(pte).filter(|_| pte.present()) {
                            let f = mem.page_folio(page);
                            let fstart = a - (page - f.pfn()) * PAGE_SIZE;
                            let covered =
                                fstart >= start && fstart + f.nr_pages(mem) * PAGE_SIZE <= end;
                            if covered && f.mapcount(mem) == 1 {
                                if pte.dirty() || pte.young() {
                                    entry_set(mem, locked.table, idx, pte.mkold().mkclean().0);
                                    tlb.remove_tlb_entries(a, 1);
                                }
                                let head = f.head(mem);
                                if head.test(pg::SWAPBACKED) {
                                    head.clear(pg::SWAPBACKED);
                                    head.set(pg::LAZYFREE);
                                    oncpu.vmstat().count(
                                        oncpu.id(),
                                        Event::PGLAZYFREE,
                                        f.nr_pages(mem),
                                    );
                                }
                            }
                        }
                        a += PAGE_SIZE;
                    }
                }
            }
        }
        addr = next;
    }
    tlb.finish(oncpu);
}
