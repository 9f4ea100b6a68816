//! mmap, munmap and exit (mm/mmap.c, mm/vma.c): creating, splitting,
//! merging and removing VMAs, and tearing down what they mapped.
//!
//! Every function here takes mmap_lock for writing; the VMA tree is edited
//! as a private copy and published once ([`Mm::vma_tree_publish`]).

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::memory::{self, FaultFlags};
use crate::mm::vma::*;
use crate::mm::{Mm, Vma, VmaTree, MAX_MAP_COUNT, MMAP_BASE, MMAP_MIN_ADDR, TASK_SIZE};
use crate::mmu_gather::MmuGather;
use crate::pgtable::{PMD_MASK, PMD_SIZE};
use crate::phys::{PAGE_MASK, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::{Arc, Ordering};

pub const PROT_NONE: u32 = 0;
pub const PROT_READ: u32 = 1;
pub const PROT_WRITE: u32 = 2;
pub const PROT_EXEC: u32 = 4;
pub const MAP_SHARED: u32 = 0x01;
pub const MAP_PRIVATE: u32 = 0x02;
pub const MAP_SHARED_VALIDATE: u32 = 0x03;
pub const MAP_TYPE: u32 = 0x0f;
pub const MAP_FIXED: u32 = 0x10;
pub const MAP_ANONYMOUS: u32 = 0x20;
pub const MAP_NORESERVE: u32 = 0x4000;
pub const MAP_POPULATE: u32 = 0x8000;
pub const MAP_FIXED_NOREPLACE: u32 = 0x100000;

#[inline]
fn page_align(len: u64) -> Option<u64> {
    len.checked_add(PAGE_SIZE - 1).map(|l| l & PAGE_MASK)
}

/// `calc_vm_prot_bits`.
pub fn calc_vm_prot_bits(prot: u32) -> VmFlags {
    let mut f = 0;
    if prot & PROT_READ != 0 {
        f |= VM_READ;
    }
    if prot & PROT_WRITE != 0 {
        f |= VM_WRITE;
    }
    if prot & PROT_EXEC != 0 {
        f |= VM_EXEC;
    }
    f
}

/// `unmapped_area_topdown`: the highest gap below `high` that holds `len`.
fn unmapped_area_topdown(tree: &VmaTree, len: u64, low: u64, high: u64) -> Option<u64> {
    let mut gap_end = high;
    for v in tree.vmas.iter().rev() {
        if v.start() >= gap_end {
            continue;
        }
        if v.end() <= gap_end && gap_end - v.end() >= len {
            return Some(gap_end - len);
        }
        gap_end = gap_end.min(v.start());
    }
    (gap_end >= low + len).then(|| gap_end - len)
}

/// `get_unmapped_area` for an anonymous private mapping.
fn get_unmapped_area(tree: &VmaTree, addr: u64, len: u64, flags: u32) -> KResult<u64> {
    if len > TASK_SIZE {
        return Err(Errno::ENOMEM);
    }
    if flags & MAP_FIXED != 0 {
        if addr > TASK_SIZE - len {
            return Err(Errno::ENOMEM);
        }
        if addr & !PAGE_MASK != 0 {
            return Err(Errno::EINVAL);
        }
        if addr < MMAP_MIN_ADDR {
            return Err(Errno::EPERM);
        }
        return Ok(addr);
    }
    // A free, page-aligned hint is taken as it is.
    if addr != 0 {
        let a = addr & PAGE_MASK;
        if a <= TASK_SIZE - len
            && a >= MMAP_MIN_ADDR
            && tree.find_vma_intersection(a, a + len).is_none()
        {
            return Ok(a);
        }
    }
    // Since v6.7 (limited to PMD-multiple lengths in v6.12), anonymous
    // mappings that can hold whole PMDs are placed PMD-aligned.
    if len.is_multiple_of(PMD_SIZE) {
        if let Some(a) = unmapped_area_topdown(tree, len + PMD_SIZE, MMAP_MIN_ADDR, MMAP_BASE) {
            return Ok((a + PMD_SIZE - 1) & PMD_MASK);
        }
    }
    unmapped_area_topdown(tree, len, MMAP_MIN_ADDR, MMAP_BASE).ok_or(Errno::ENOMEM)
}

/// Whether `a` (below) and `b` (above, adjacent) may become one VMA
/// (`is_mergeable_vma` + `is_mergeable_anon_vma` + pgoff contiguity).
fn can_merge(a: &Vma, b: &Vma) -> bool {
    a.end() == b.start()
        && a.flags() == b.flags()
        && a.pgoff() + ((a.end() - a.start()) >> PAGE_SHIFT) == b.pgoff()
        && match (a.anon_vma(), b.anon_vma()) {
            (Some(x), Some(y)) => Arc::ptr_eq(x, y),
            _ => true,
        }
}

/// Merge the VMA at `idx` with its neighbours where possible (`vma_merge`).
/// Returns the index of the VMA now covering the original's range.
pub(crate) fn merge_around(tree: &mut VmaTree, mut idx: usize) -> usize {
    if idx + 1 < tree.vmas.len() && can_merge(&tree.vmas[idx], &tree.vmas[idx + 1]) {
        let next = tree.vmas.remove(idx + 1);
        absorb(&tree.vmas[idx], &next, next.end());
    }
    if idx > 0 && can_merge(&tree.vmas[idx - 1], &tree.vmas[idx]) {
        let cur = tree.vmas.remove(idx);
        idx -= 1;
        absorb(&tree.vmas[idx], &cur, cur.end());
    }
    idx
}

/// `keep` grows over `gone`, which leaves the tree (`vma_expand` +
/// `dup_anon_vma`, then `unlink_anon_vmas` of the removed VMA).
fn absorb(keep: &Arc<Vma>, gone: &Arc<Vma>, new_end: u64) {
    if keep.anon_vma().is_none() && gone.anon_vma().is_some() {
        crate::rmap::anon_vma_clone(keep, gone);
    }
    crate::rmap::unlink_anon_vmas(gone);
    keep.set_end(new_end);
}

/// `__split_vma`: split the VMA at `idx` at `addr`; the new VMA takes the
/// upper part. Huge PMDs straddling `addr` are split first
/// (`vma_adjust_trans_huge`).
pub(crate) fn split_vma(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    idx: usize,
    addr: u64,
) -> KResult<()> {
    if tree.vmas.len() >= MAX_MAP_COUNT {
        return Err(Errno::ENOMEM);
    }
    let vma = tree.vmas[idx].clone();
    debug_assert!(vma.start() < addr && addr < vma.end());
    if addr & !PMD_MASK != 0 {
        if let Some(slot) = mm.pmd_lookup(addr) {
            if mm.pmd_get(slot).trans_huge() {
                crate::huge_memory::split_huge_pmd(oncpu, mm, slot, addr);
            }
        }
    }
    let upper = Arc::new(Vma::new(
        mm.id,
        addr,
        vma.end(),
        vma.flags(),
        vma.linear_page_index(addr),
    ));
    crate::rmap::anon_vma_clone(&upper, &vma);
    vma.set_end(addr);
    tree.vmas.insert(idx + 1, upper);
    Ok(())
}

/// Split so that `[start, end)` is covered by whole VMAs; returns the range
/// of their indices.
pub(crate) fn split_range(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    start: u64,
    end: u64,
) -> KResult<std::ops::Range<usize>> {
    let r = tree.range(start, end);
    if r.is_empty() {
        return Ok(r);
    }
    let mut first = r.start;
    if tree.vmas[first].start() < start {
        split_vma(oncpu, mm, tree, first, start)?;
        first += 1;
    }
    let r = tree.range(start, end);
    let last = r.end - 1;
    if tree.vmas[last].end() > end {
        split_vma(oncpu, mm, tree, last, end)?;
    }
    Ok(first..tree.range(start, end).end)
}

/// `do_mmap` for anonymous memory. Returns the address of the mapping.
pub fn do_mmap(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    addr: u64,
    len: u64,
    prot: u32,
    flags: u32,
) -> KResult<u64> {
    if len == 0 {
        return Err(Errno::EINVAL);
    }
    let mut flags = flags;
    let mut addr = addr;
    if flags & MAP_FIXED_NOREPLACE != 0 {
        flags |= MAP_FIXED;
    }
    if flags & MAP_FIXED == 0 && addr != 0 && addr < MMAP_MIN_ADDR {
        // round_hint_to_min
        addr = MMAP_MIN_ADDR;
    }
    let len = page_align(len).filter(|&l| l != 0).ok_or(Errno::ENOMEM)?;
    if flags & MAP_ANONYMOUS == 0 {
        return Err(Errno::EBADF);
    }
    let guard = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_clone();
    if tree.vmas.len() >= MAX_MAP_COUNT {
        return Err(Errno::ENOMEM);
    }
    let addr = get_unmapped_area(&tree, addr, len, flags)?;
    match flags & MAP_TYPE {
        MAP_PRIVATE => {}
        MAP_SHARED | MAP_SHARED_VALIDATE => return Err(Errno::EOPNOTSUPP), // shared anonymous memory is not modelled
        _ => return Err(Errno::EINVAL),
    }
    if flags & MAP_FIXED_NOREPLACE != 0 && tree.find_vma_intersection(addr, addr + len).is_some() {
        return Err(Errno::EEXIST);
    }
    let mut vm_flags = calc_vm_prot_bits(prot) | VM_MAYREAD | VM_MAYWRITE | VM_MAYEXEC;
    if flags & MAP_NORESERVE != 0 {
        vm_flags |= VM_NORESERVE;
    } else if vm_flags & VM_WRITE != 0 {
        vm_flags |= VM_ACCOUNT;
    }
    // MAP_FIXED over existing mappings: unmap them first (mmap_region).
    if tree.find_vma_intersection(addr, addr + len).is_some() {
        do_vmi_munmap(oncpu, mm, &mut tree, addr, addr + len)?;
    }
    let vma = Arc::new(Vma::new(
        mm.id,
        addr,
        addr + len,
        vm_flags,
        addr >> PAGE_SHIFT,
    ));
    tree.insert(vma);
    let idx = tree.vmas.partition_point(|v| v.start() < addr);
    merge_around(&mut tree, idx);
    mm.vma_tree_publish(tree, &crossbeam_epoch::pin());
    mm.total_vm.fetch_add(len >> PAGE_SHIFT, Ordering::Relaxed);
    drop(guard);
    if flags & MAP_POPULATE != 0 {
        // mm_populate: fault everything in; write faults for private writable.
        let write = vm_flags & VM_WRITE != 0;
        let _ = populate_range(oncpu, mm, addr, addr + len, write);
    }
    Ok(addr)
}

/// `populate_vma_page_range` without GUP: fault each page that is not
/// mapped yet.
pub fn populate_range(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    start: u64,
    end: u64,
    write: bool,
) -> KResult<()> {
    let _g = mm.mmap_lock.read();
    let guard = crossbeam_epoch::pin();
    let mut addr = start;
    while addr < end {
        let Some(vma) = mm.vma_tree(&guard).vma_lookup(addr).cloned() else {
            return Err(Errno::ENOMEM);
        };
        memory::handle_mm_fault(oncpu, mm, &vma, addr, FaultFlags { write })?;
        addr += PAGE_SIZE;
    }
    Ok(())
}

/// `do_vmi_munmap` on a tree being edited: split at the edges, detach the
/// VMAs, zap what they mapped and free their page tables.
fn do_vmi_munmap(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    start: u64,
    end: u64,
) -> KResult<()> {
    let r = split_range(oncpu, mm, tree, start, end)?;
    if r.is_empty() {
        return Ok(());
    }
    let floor = tree.prev_of(r.start).map_or(0, |p| p.end());
    let ceiling = tree.vmas.get(r.end).map_or(0, |n| n.start());
    let detached: Vec<Arc<Vma>> = tree.vmas.drain(r).collect();
    for v in &detached {
        crate::rmap::unlink_anon_vmas(v);
    }
    // Publish the tree without them before zapping: no new fault can map
    // into the range once we drop the lock.
    mm.vma_tree_publish(tree.clone(), &crossbeam_epoch::pin());
    let pages: u64 = detached
        .iter()
        .map(|v| (v.end() - v.start()) >> PAGE_SHIFT)
        .sum();
    mm.total_vm.fetch_sub(pages, Ordering::Relaxed);
    unmap_region(oncpu, mm, &detached, floor, ceiling);
    Ok(())
}

/// `unmap_region`.
fn unmap_region(oncpu: &OnCpu, mm: &Arc<Mm>, vmas: &[Arc<Vma>], floor: u64, ceiling: u64) {
    let mut tlb = MmuGather::new(mm);
    let (start, end) = (vmas[0].start(), vmas[vmas.len() - 1].end());
    memory::unmap_vmas(oncpu, &mut tlb, vmas, start, end);
    memory::free_pgtables(oncpu, &mut tlb, vmas, floor, ceiling);
    tlb.finish(oncpu);
}

/// `munmap(2)`.
pub fn do_munmap(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, len: u64) -> KResult<()> {
    if start & !PAGE_MASK != 0 || start > TASK_SIZE || len > TASK_SIZE - start {
        return Err(Errno::EINVAL);
    }
    let len = page_align(len).ok_or(Errno::EINVAL)?;
    if len == 0 {
        return Err(Errno::EINVAL);
    }
    let _g = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_clone();
    do_vmi_munmap(oncpu, mm, &mut tree, start, start + len)
}

/// `exit_mmap`: tear the whole address space down.
pub fn exit_mmap(oncpu: &OnCpu, mm: &Arc<Mm>) {
    let _g = mm.mmap_lock.write();
    let vmas = mm.vma_tree_clone().vmas;
    mm.dead.store(true, Ordering::Relaxed);
    if !vmas.is_empty() {
        let mut tlb = MmuGather::new_fullmm(mm);
        memory::unmap_vmas(oncpu, &mut tlb, &vmas, 0, u64::MAX);
        memory::free_pgtables(oncpu, &mut tlb, &vmas, 0, 0);
        tlb.finish(oncpu);
    }
    for v in &vmas {
        crate::rmap::unlink_anon_vmas(v);
    }
    mm.vma_tree_publish(VmaTree::default(), &crossbeam_epoch::pin());
    mm.total_vm.store(0, Ordering::Relaxed);
    debug_assert_eq!(
        mm.pgtables_bytes.load(Ordering::Relaxed),
        0,
        "{mm:?}: page tables left after exit_mmap"
    );
    debug_assert_eq!(mm.rss_pages(), 0, "{mm:?}: RSS left after exit_mmap");
}
