//! mmap, munmap and exit (mm/mmap.c, mm/vma.c): creating, splitting,
//! merging and removing VMAs, and tearing down what they mapped.
//!
//! Every function here takes mmap_lock for writing; the VMA tree is edited
//! as a private copy and published once ([`Mm::vma_tree_publish`]).

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::memory;
use crate::mm::vma::*;
use crate::mm::{Mm, Vma, VmaTree, MAX_MAP_COUNT, MMAP_MIN_ADDR, TASK_SIZE};
use crate::mmu_gather::MmuGather;
use crate::pgtable::{PMD_MASK, PMD_SIZE};
use crate::phys::{PAGE_MASK, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::{Arc, Ordering};
use crate::util::OvercommitMode;

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
pub const MAP_GROWSDOWN: u32 = 0x100;
pub const MAP_LOCKED: u32 = 0x2000;
pub const MAP_NORESERVE: u32 = 0x4000;
pub const MAP_POPULATE: u32 = 0x8000;
pub const MAP_NONBLOCK: u32 = 0x10000;
pub const MAP_STACK: u32 = 0x20000;
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

/// `calc_vm_flag_bits`: the VMA flags some mmap flags ask for. MAP_STACK
/// keeps THPs out of a stack (v6.7+): most of one would never be touched.
fn calc_vm_flag_bits(flags: u32) -> VmFlags {
    let mut f = 0;
    if flags & MAP_GROWSDOWN != 0 {
        f |= VM_GROWSDOWN;
    }
    if flags & MAP_LOCKED != 0 {
        f |= VM_LOCKED;
    }
    if flags & MAP_STACK != 0 {
        f |= VM_NOHUGEPAGE;
    }
    f
}

/// A hint's range is free: no VMA in it, nor in the guard gap of a stack
/// just above it (`vm_start_gap`; x86 stacks do not grow up, so the VMA
/// below keeps no gap).
fn hint_is_free(tree: &VmaTree, a: u64, len: u64) -> bool {
    tree.find_vma(a)
        .is_none_or(|v| v.start() >= a + len && a + len <= v.start_gap())
}

/// `get_unmapped_area` for an anonymous private mapping.
pub(crate) fn get_unmapped_area(
    tree: &VmaTree,
    mmap_base: u64,
    addr: u64,
    len: u64,
    flags: u32,
) -> KResult<u64> {
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
        if a <= TASK_SIZE - len && a >= MMAP_MIN_ADDR && hint_is_free(tree, a, len) {
            return Ok(a);
        }
    }
    // Since v6.7 (limited to PMD-multiple lengths in v6.12), anonymous
    // mappings asked for with no hint that can hold whole PMDs are placed
    // PMD-aligned: room for a PMD more is found, and the mapping put as
    // high in it as alignment allows (`__thp_get_unmapped_area` with a
    // page offset of 0, top-down: room that starts aligned gives its top
    // PMD-worth, so that the mapping ends where the room does, as an
    // unaligned search would have put it). A hint that was not free gets a
    // plain search.
    if addr == 0 && len.is_multiple_of(PMD_SIZE) {
        if let Some(a) = tree.unmapped_area_topdown(len + PMD_SIZE, MMAP_MIN_ADDR, mmap_base) {
            return Ok(if a.is_multiple_of(PMD_SIZE) {
                a + PMD_SIZE
            } else {
                (a + PMD_SIZE - 1) & PMD_MASK
            });
        }
    }
    tree.unmapped_area_topdown(len, MMAP_MIN_ADDR, mmap_base)
        .ok_or(Errno::ENOMEM)
}

/// `vma_merge_struct`: a range about to become a VMA, or part of one, with
/// what decides whether it may merge with the VMAs on either side: its
/// bounds, page offset, flags, policy and anon_vma. `middle` is the VMA the
/// range is carved from (a change of flags or policy), or None (a new
/// mapping).
pub(crate) struct VmaMergeStruct<'a> {
    pub(crate) prev: Option<&'a Arc<Vma>>,
    pub(crate) middle: Option<&'a Arc<Vma>>,
    pub(crate) next: Option<&'a Arc<Vma>>,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) pgoff: u64,
    pub(crate) flags: VmFlags,
    pub(crate) policy: Option<&'a Arc<crate::mempolicy::Mempolicy>>,
    pub(crate) anon_vma: Option<&'a Arc<AnonVma>>,
    /// The VMA a range is a copy of (`copy_vma`, for mremap): its anon_vma
    /// goes to the VMA that takes the range in.
    pub(crate) copied_from: Option<&'a Arc<Vma>>,
    pub(crate) file: Option<&'a Arc<crate::fs::File>>,
}

impl VmaMergeStruct<'_> {
    fn pages(&self) -> u64 {
        (self.end - self.start) >> PAGE_SHIFT
    }
}

/// `vma_had_uncowed_parents`: a VMA whose anon_vma chain holds more than
/// its own anon_vma (forked, and never written since) is not merged with
/// one that has no anon_vma, which would chain that one to all its
/// parents' anon_vmas too (the `list_is_singular` test).
fn vma_had_uncowed_parents(vma: Option<&Arc<Vma>>) -> bool {
    vma.is_some_and(|v| v.anon_vma().is_some() && v.anon_vma_chain.lock().len() != 1)
}

/// `is_mergeable_vma`: the same flags, the same file and the same NUMA
/// policy, and not a special mapping (whose `vm_ops` have a `close`).
fn is_mergeable_vma(vmg: &VmaMergeStruct<'_>, tgt: &Vma) -> bool {
    tgt.flags() == vmg.flags
        && tgt.special().is_none()
        && vmg.flags & VM_SPECIAL == 0
        && tgt.file().map(Arc::as_ptr) == vmg.file.map(Arc::as_ptr)
        && tgt.policy().map(|p| &**p) == vmg.policy.map(|p| &**p)
}

/// `is_mergeable_anon_vma`: the range may join `tgt` if one of them has no
/// anon_vma and the other had no uncowed parents (the one without takes the
/// other's, `dup_anon_vma`), or both have the same one.
fn is_mergeable_anon_vma(vmg: &VmaMergeStruct<'_>, tgt: &Arc<Vma>) -> bool {
    match (tgt.anon_vma(), vmg.anon_vma) {
        (None, Some(_)) => {
            !vma_had_uncowed_parents(vmg.middle) && !vma_had_uncowed_parents(vmg.copied_from)
        }
        (Some(_), None) => !vma_had_uncowed_parents(Some(tgt)),
        (t, s) => t.map(Arc::as_ptr) == s.map(Arc::as_ptr),
    }
}

/// `can_vma_merge_left`: `prev` ends where the range starts and may take
/// it, its page offsets continuing into the range's.
fn can_vma_merge_left(vmg: &VmaMergeStruct<'_>) -> bool {
    vmg.prev.is_some_and(|p| {
        p.end() == vmg.start
            && is_mergeable_vma(vmg, p)
            && is_mergeable_anon_vma(vmg, p)
            && p.pgoff() + p.pages() == vmg.pgoff
    })
}

/// `can_vma_merge_right`: `next` starts where the range ends and may take
/// it; when `prev` takes it too, their anon_vmas must also agree with each
/// other (each agreeing with the range's does not make them agree).
fn can_vma_merge_right(vmg: &VmaMergeStruct<'_>, merge_left: bool) -> bool {
    let Some(n) = vmg.next else { return false };
    let before = n.start() == vmg.end
        && is_mergeable_vma(vmg, n)
        && is_mergeable_anon_vma(vmg, n)
        && vmg.pgoff + vmg.pages() == n.pgoff();
    before
        && (!merge_left
            || match (vmg.prev.and_then(|p| p.anon_vma()), n.anon_vma()) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => true,
            })
}

/// `vm_area_dup` + `anon_vma_clone`: a new VMA over `[start, end)` with
/// `flags`, otherwise as `old` (the same linear page offsets, chained to the
/// same anon_vmas). The caller puts it in the tree in `old`'s place.
fn vma_dup(old: &Arc<Vma>, start: u64, end: u64, flags: VmFlags) -> Arc<Vma> {
    vma_dup_policy(old, start, end, flags, old.policy().cloned())
}

/// [`vma_dup`] with a NUMA policy of its own (`vma_dup_policy`, or mbind's
/// new one).
fn vma_dup_policy(
    old: &Arc<Vma>,
    start: u64,
    end: u64,
    flags: VmFlags,
    pol: Option<Arc<crate::mempolicy::Mempolicy>>,
) -> Arc<Vma> {
    // `start` may lie below `old` (a VMA that grows down over a merged
    // range): the offsets continue downwards.
    let pgoff = if start >= old.start() {
        old.linear_page_index(start)
    } else {
        let below = (old.start() - start) >> PAGE_SHIFT;
        debug_assert!(below <= old.pgoff(), "{old:?} grown below page offset 0");
        old.pgoff() - below
    };
    vma_like(old, (start, end, pgoff), flags, pol, true)
}

/// A new VMA over `[start, end)` at page offset `pgoff`, with `flags` and
/// policy `pol`, mapping `old`'s file (linked into its `i_mmap`) and, with
/// `anon`, chained to `old`'s anon_vmas (`anon_vma_clone`).
fn vma_like(
    old: &Arc<Vma>,
    (start, end, pgoff): (u64, u64, u64),
    flags: VmFlags,
    pol: Option<Arc<crate::mempolicy::Mempolicy>>,
    anon: bool,
) -> Arc<Vma> {
    let vma = Arc::new(
        Vma::new(old.mm_id, start, end, flags, pgoff)
            .with_policy(pol)
            .with_file(old.file().cloned())
            .with_special(old.special()),
    );
    if anon {
        crate::rmap::anon_vma_clone(&vma, old);
    }
    crate::fs::vma_link_file(&vma);
    vma
}

/// A VMA left the tree for good (replaced, merged away or unmapped):
/// `unlink_anon_vmas` + `unlink_file_vma` + `vma_mark_detached`.
pub(crate) fn vma_retire(vma: &Vma) {
    crate::rmap::unlink_anon_vmas(vma);
    crate::fs::unlink_file_vma(vma);
    vma.mark_detached();
}

/// `commit_merge`: `target` grows over `[start, end)`; the VMAs of `gone`
/// and `target` leave the tree for the grown VMA, beside `rest` (what is
/// left of a middle VMA merged only in part). A grown VMA with no anon_vma
/// takes the first one of `anon_from` (`dup_anon_vma`).
fn commit_merge(
    tree: &mut VmaTree,
    target: &Arc<Vma>,
    std::ops::Range { start, end }: std::ops::Range<u64>,
    gone: &[&Arc<Vma>],
    anon_from: &[Option<&Arc<Vma>>],
    rest: Option<Arc<Vma>>,
) -> Arc<Vma> {
    let merged = vma_dup(target, start, end, target.flags());
    if merged.anon_vma().is_none() {
        if let Some(src) = anon_from.iter().flatten().find(|v| v.anon_vma().is_some()) {
            crate::rmap::anon_vma_clone(&merged, src);
        }
    }
    let old: Vec<Arc<Vma>> = std::iter::once(target)
        .chain(gone.iter().copied())
        .cloned()
        .collect();
    let mut new: Vec<Arc<Vma>> = rest.into_iter().chain([merged.clone()]).collect();
    new.sort_by_key(|v| v.start());
    tree.replace(&old, new);
    old.iter().for_each(|v| vma_retire(v));
    merged
}

/// `vma_merge_new_range`: a new mapping joins whichever neighbour can take
/// it, before any VMA is made for it. Left first: when both could take it
/// but their anon_vmas differ, only `prev` does. Returns the merged VMA,
/// now in the tree, or None: the caller inserts a VMA of its own.
pub(crate) fn vma_merge_new_range(
    tree: &mut VmaTree,
    vmg: &VmaMergeStruct<'_>,
) -> Option<Arc<Vma>> {
    debug_assert!(vmg.middle.is_none());
    let merge_left = can_vma_merge_left(vmg);
    let merge_right = can_vma_merge_right(vmg, merge_left);
    let (prev, next) = (
        vmg.prev.filter(|_| merge_left),
        vmg.next.filter(|_| merge_right),
    );
    match (prev, next) {
        (None, None) => None,
        // `vma_expand` of prev, over next too if it merges.
        (Some(p), next) => {
            let end = next.map_or(vmg.end, |n| n.end());
            let gone: Vec<_> = next.into_iter().collect();
            Some(commit_merge(
                tree,
                p,
                p.start()..end,
                &gone,
                &[next, vmg.copied_from],
                None,
            ))
        }
        // next grows down over the new range.
        (None, Some(n)) => Some(commit_merge(
            tree,
            n,
            vmg.start..n.end(),
            &[],
            &[vmg.copied_from],
            None,
        )),
    }
}

/// `vma_merge_existing_range`: `[start, end)` of the VMA `middle`, about to
/// get new flags or a new policy, joins a neighbour that already has them
/// instead of being split off. Only a side the range reaches can merge: the
/// previous VMA when it starts where `middle` does, the next when it ends
/// where `middle` does; left first, both only if their anon_vmas agree.
/// What the range leaves of `middle` stays a VMA with its old flags.
/// Returns the merged VMA, or None: the caller splits.
fn vma_merge_existing_range(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    vmg: &VmaMergeStruct<'_>,
) -> Option<Arc<Vma>> {
    let middle = vmg.middle.expect("an existing range has a middle VMA");
    let left_side = vmg.start == middle.start();
    let right_side = vmg.end == middle.end();
    let merge_left = left_side && can_vma_merge_left(vmg);
    let merge_right = right_side && can_vma_merge_right(vmg, merge_left);
    if !merge_left && !merge_right {
        return None;
    }
    tree.start_write(middle);
    match (
        vmg.prev.filter(|_| merge_left),
        vmg.next.filter(|_| merge_right),
    ) {
        // Both neighbours and all of middle become one VMA.
        (Some(p), Some(n)) => Some(commit_merge(
            tree,
            p,
            p.start()..n.end(),
            &[middle, n],
            &[Some(n), Some(middle)],
            None,
        )),
        // prev grows over the range; middle keeps what lies above it.
        (Some(p), None) => {
            let rest = (!right_side).then(|| {
                vma_adjust_trans_huge(oncpu, mm, vmg.end);
                vma_dup(middle, vmg.end, middle.end(), middle.flags())
            });
            Some(commit_merge(
                tree,
                p,
                p.start()..vmg.end,
                &[middle],
                &[Some(middle)],
                rest,
            ))
        }
        // next grows down over the range; middle keeps what lies below it.
        (None, Some(n)) => {
            let rest = (!left_side).then(|| {
                vma_adjust_trans_huge(oncpu, mm, vmg.start);
                vma_dup(middle, middle.start(), vmg.start, middle.flags())
            });
            Some(commit_merge(
                tree,
                n,
                vmg.start..n.end(),
                &[middle],
                &[Some(middle)],
                rest,
            ))
        }
        (None, None) => unreachable!(),
    }
}

/// `copy_vma`: a VMA over `[addr, addr + len)` with `vma`'s flags, file,
/// policy and anon_vma and the page offset `pgoff`, for mremap to move
/// `vma`'s pages into: a neighbour there grows over the range where it
/// can (`vma_merge_copied_range`), otherwise a new VMA is inserted. An
/// anonymous VMA never faulted takes the offset of its new address, which
/// may let it merge with `vma` itself (which then leaves the tree). Returns
/// the VMA that covers the range and the VMA that now covers `vma`'s old
/// start (`vma`, or the merged one); None if the range is not free.
pub(crate) fn copy_vma(
    tree: &mut VmaTree,
    vma: &Arc<Vma>,
    addr: u64,
    len: u64,
    pgoff: u64,
) -> Option<(Arc<Vma>, Arc<Vma>)> {
    let pgoff = if vma.is_anonymous() && vma.anon_vma().is_none() {
        addr >> PAGE_SHIFT
    } else {
        pgoff
    };
    let (found, prev) = tree.find_vma_prev(addr);
    if found.is_some_and(|v| v.start() < addr + len) {
        return None;
    }
    let (next, prev) = (found.cloned(), prev.cloned());
    let vmg = VmaMergeStruct {
        prev: prev.as_ref(),
        middle: None,
        next: next.as_ref(),
        start: addr,
        end: addr + len,
        pgoff,
        flags: vma.flags(),
        policy: vma.policy(),
        anon_vma: vma.anon_vma(),
        copied_from: Some(vma),
        file: vma.file(),
    };
    if let Some(merged) = vma_merge_new_range(tree, &vmg) {
        let source = if (merged.start()..merged.end()).contains(&vma.start()) {
            debug_assert!(
                vma.anon_vma().is_none(),
                "a faulted VMA merged with its copy"
            );
            merged.clone()
        } else {
            vma.clone()
        };
        return Some((merged, source));
    }
    let range = (addr, addr + len, pgoff);
    let new = vma_like(vma, range, vma.flags(), vma.policy().cloned(), true);
    tree.insert(new.clone());
    Some((new, vma.clone()))
}

/// `vma_merge_extend`: `vma` grows by `delta` at its end, over free
/// space, merging with the next VMA where that becomes adjacent and
/// compatible. Returns the grown VMA.
pub(crate) fn vma_merge_extend(tree: &mut VmaTree, vma: &Arc<Vma>, delta: u64) -> Arc<Vma> {
    let next = tree.next_vma(vma.end()).cloned();
    let vmg = VmaMergeStruct {
        prev: Some(vma),
        middle: None,
        next: next.as_ref(),
        start: vma.end(),
        end: vma.end() + delta,
        pgoff: vma.pgoff() + vma.pages(),
        flags: vma.flags(),
        policy: vma.policy(),
        anon_vma: vma.anon_vma(),
        copied_from: None,
        file: vma.file(),
    };
    vma_merge_new_range(tree, &vmg).expect("a VMA merges with its own extension")
}

/// A VMA's flags change in place (`vm_flags_clear`, where the kernel
/// neither splits nor merges): the tree gets a copy with `flags`. With
/// `unlink_anon`, the copy has no anon_vma (`unlink_anon_vmas` of a VMA
/// whose pages have all moved away).
pub(crate) fn vma_set_flags(
    tree: &mut VmaTree,
    vma: &Arc<Vma>,
    flags: VmFlags,
    unlink_anon: bool,
) -> Arc<Vma> {
    let range = (vma.start(), vma.end(), vma.pgoff());
    let new = vma_like(vma, range, flags, vma.policy().cloned(), !unlink_anon);
    tree.replace(std::slice::from_ref(vma), vec![new.clone()]);
    vma_retire(vma);
    new
}

/// `split_vma`: [`__split_vma`], refused (ENOMEM, changing nothing) when
/// the address space already has `max_map_count` VMAs.
pub(crate) fn split_vma(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    vma: &Arc<Vma>,
    addr: u64,
) -> KResult<(Arc<Vma>, Arc<Vma>)> {
    if tree.len() >= MAX_MAP_COUNT {
        return Err(Errno::ENOMEM);
    }
    Ok(__split_vma(oncpu, mm, tree, vma, addr))
}

/// `__split_vma`: split `vma` at `addr` into two new VMAs, which take its
/// place in the tree; returns them. Huge PMDs straddling `addr` are split
/// first (`vma_adjust_trans_huge`).
fn __split_vma(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    vma: &Arc<Vma>,
    addr: u64,
) -> (Arc<Vma>, Arc<Vma>) {
    debug_assert!(vma.start() < addr && addr < vma.end());
    // Locked before the huge PMD across the split point is split
    // (`__split_vma`: vma_start_write, then vma_adjust_trans_huge).
    tree.start_write(vma);
    vma_adjust_trans_huge(oncpu, mm, addr);
    let lower = vma_dup(vma, vma.start(), addr, vma.flags());
    let upper = vma_dup(vma, addr, vma.end(), vma.flags());
    tree.replace(
        std::slice::from_ref(vma),
        vec![lower.clone(), upper.clone()],
    );
    vma_retire(vma);
    (lower, upper)
}

/// `vma_adjust_trans_huge` at one new VMA boundary: a huge PMD that
/// straddles `addr` is split, since no PMD may map across two VMAs.
fn vma_adjust_trans_huge(oncpu: &OnCpu, mm: &Arc<Mm>, addr: u64) {
    if addr & !PMD_MASK != 0 {
        if let Some(slot) = mm.pmd_lookup(addr) {
            if crate::huge_memory::pmd_is_huge(mm.pmd_get(slot)) {
                crate::huge_memory::split_huge_pmd(oncpu, mm, slot, addr);
            }
        }
    }
}

/// munmap's splits (`vms_gather_munmap_vmas`): split so that `[start,
/// end)` is covered by whole VMAs; returns them. A munmap ends with no more
/// VMAs than it found unless it cuts a hole inside one VMA: only that is
/// refused at `max_map_count`, before anything is split. The splits
/// themselves are not (`__split_vma`): the count may pass the limit by one
/// until the range's VMAs are removed.
fn munmap_split_range(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    start: u64,
    end: u64,
) -> KResult<Vec<Arc<Vma>>> {
    if let Some(first) = tree.find_vma_intersection(start, end).cloned() {
        if first.start() < start {
            if end < first.end() && tree.len() >= MAX_MAP_COUNT {
                return Err(Errno::ENOMEM);
            }
            __split_vma(oncpu, mm, tree, &first, start);
        }
    }
    if let Some(last) = tree.vma_lookup(end - 1).cloned() {
        if last.end() > end {
            __split_vma(oncpu, mm, tree, &last, end);
        }
    }
    Ok(tree.range(start, end).cloned().collect())
}

/// `vma_modify_flags`: give `[start, end)`, which lies inside one VMA,
/// the flags `flags`, merging with a neighbour or splitting; returns the
/// VMA that now covers `[start, end)`.
pub(crate) fn vma_modify_flags(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    start: u64,
    end: u64,
    flags: VmFlags,
) -> KResult<Arc<Vma>> {
    let vma = tree
        .vma_lookup(start)
        .cloned()
        .expect("vma_modify_flags inside a VMA");
    let pol = vma.policy().cloned();
    vma_modify(oncpu, mm, tree, &vma, start..end, flags, pol)
}

/// `mbind_range`: give every VMA of `[start, end)` the policy `pol`,
/// splitting at the ends and merging with neighbours of the same policy
/// (`vma_modify_policy`). EFAULT, changing nothing, if a hole lies in the
/// range (`queue_pages_range` runs first in the kernel).
pub(crate) fn mbind_range(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    start: u64,
    end: u64,
    pol: Option<Arc<crate::mempolicy::Mempolicy>>,
) -> KResult<()> {
    let _g = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_draft();
    let result = (|| {
        // queue_pages_range refuses a range with a hole before changing any.
        let mut addr = start;
        while addr < end {
            let vma = tree.vma_lookup(addr).ok_or(Errno::EFAULT)?;
            addr = vma.end();
        }
        let mut addr = start;
        while addr < end {
            let vma = tree.vma_lookup(addr).cloned().ok_or(Errno::EFAULT)?;
            let to = vma.end().min(end);
            if vma.policy().map(|p| &**p) != pol.as_deref() {
                vma_modify_policy(oncpu, mm, &mut tree, addr, to, pol.clone())?;
            }
            addr = to;
        }
        Ok(())
    })();
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    result
}

/// `vma_modify_policy`: `[start, end)`, inside one VMA, gets `pol`.
fn vma_modify_policy(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    start: u64,
    end: u64,
    pol: Option<Arc<crate::mempolicy::Mempolicy>>,
) -> KResult<Arc<Vma>> {
    let vma = tree.vma_lookup(start).cloned().ok_or(Errno::EFAULT)?;
    let flags = vma.flags();
    vma_modify(oncpu, mm, tree, &vma, start..end, flags, pol)
}

/// `vma_modify`: `[start, end)` of `vma` gets `flags` and `pol`. The range
/// joins a neighbour that has them already where it can
/// ([`vma_merge_existing_range`], which splits nothing); otherwise the old
/// VMA is replaced by its up to three pieces at once, each made once.
/// Returns the VMA that now covers the range.
fn vma_modify(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    vma: &Arc<Vma>,
    std::ops::Range { start, end }: std::ops::Range<u64>,
    flags: VmFlags,
    pol: Option<Arc<crate::mempolicy::Mempolicy>>,
) -> KResult<Arc<Vma>> {
    debug_assert!(end <= vma.end(), "[{start:#x}, {end:#x}) leaves {vma:?}");
    // Only a side the range reaches can merge: the neighbours of the others
    // are not looked up.
    let prev = (start == vma.start())
        .then(|| tree.prev_vma(start).cloned())
        .flatten();
    let next = (end == vma.end())
        .then(|| tree.next_vma(end).cloned())
        .flatten();
    let vmg = VmaMergeStruct {
        prev: prev.as_ref(),
        middle: Some(vma),
        next: next.as_ref(),
        start,
        end,
        pgoff: vma.linear_page_index(start),
        flags,
        policy: pol.as_ref(),
        anon_vma: vma.anon_vma(),
        copied_from: None,
        file: vma.file(),
    };
    if let Some(merged) = vma_merge_existing_range(oncpu, mm, tree, &vmg) {
        return Ok(merged);
    }
    let (lower, upper) = (start > vma.start(), end < vma.end());
    // The kernel splits one side at a time (`__split_vma`), each refused at
    // max_map_count: a refused upper split leaves the lower one done.
    if lower && upper && tree.len() + 1 >= MAX_MAP_COUNT {
        split_vma(oncpu, mm, tree, vma, start)?;
        return Err(Errno::ENOMEM);
    }
    if (lower || upper) && tree.len() >= MAX_MAP_COUNT {
        return Err(Errno::ENOMEM);
    }
    let mut pieces = Vec::with_capacity(3);
    tree.start_write(vma);
    if lower {
        vma_adjust_trans_huge(oncpu, mm, start);
        pieces.push(vma_dup(vma, vma.start(), start, vma.flags()));
    }
    let new = vma_dup_policy(vma, start, end, flags, pol);
    pieces.push(new.clone());
    if upper {
        vma_adjust_trans_huge(oncpu, mm, end);
        pieces.push(vma_dup(vma, end, vma.end(), vma.flags()));
    }
    tree.replace(std::slice::from_ref(vma), pieces);
    vma_retire(vma);
    Ok(new)
}

/// What `mmap(2)` maps: anonymous memory, or `file` from byte `off`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MmapSource<'a> {
    pub file: Option<&'a Arc<crate::fs::File>>,
    /// The offset in the file, in bytes (page-aligned).
    pub off: u64,
}

/// `do_mmap`. Returns the address of the mapping.
pub fn do_mmap(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    addr: u64,
    len: u64,
    prot: u32,
    flags: u32,
    src: MmapSource<'_>,
) -> KResult<u64> {
    // The x86 entry refuses an offset within a page before anything else;
    // ksys_mmap_pgoff then looks the file up before do_mmap looks at the
    // length.
    if src.off & !PAGE_MASK != 0 {
        return Err(Errno::EINVAL);
    }
    let mut file = if flags & MAP_ANONYMOUS != 0 {
        None
    } else {
        Some(src.file.ok_or(Errno::EBADF)?)
    };
    // An anonymous mapping's offset is its address (set below).
    let pgoff = src.off >> PAGE_SHIFT;
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
    // The page offset must not wrap.
    if file.is_some() && pgoff.checked_add(len >> PAGE_SHIFT).is_none() {
        return Err(Errno::EOVERFLOW);
    }
    let guard = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_draft();
    // Tested before the mapping is made, which may merge: an address space
    // may pass `max_map_count` by one.
    if tree.len() > MAX_MAP_COUNT {
        return Err(Errno::ENOMEM);
    }
    // Shared memory, anonymous or a tmpfs file, is placed by shmem's own
    // rule (`shmem_get_unmapped_area`), which aligns nothing while shmem
    // THPs are off (the model has none); other files by the THP rule of
    // ext4's.
    let base = mm.mmap_base();
    let addr = match file {
        Some(f) if f.mapping().is_shmem() => {
            get_unmapped_area_plain(&tree, base, addr, len, flags)?
        }
        Some(_) => thp_get_unmapped_area(&tree, base, addr, len, src.off, flags)?,
        None if flags & MAP_SHARED != 0 => get_unmapped_area_plain(&tree, base, addr, len, flags)?,
        None => get_unmapped_area(&tree, base, addr, len, flags)?,
    };
    let (found, prev) = tree.find_vma_prev(addr);
    let overlaps = found.is_some_and(|v| v.start() < addr + len);
    let (mut next, mut prev) = (found.cloned(), prev.cloned());
    if flags & MAP_FIXED_NOREPLACE != 0 && overlaps {
        return Err(Errno::EEXIST);
    }
    let mut vm_flags = calc_vm_prot_bits(prot)
        | calc_vm_flag_bits(flags)
        | mm.def_flags.load(Ordering::Relaxed)
        | VM_MAYREAD
        | VM_MAYWRITE
        | VM_MAYEXEC;
    if flags & MAP_LOCKED != 0 {
        // can_do_mlock.
        if mm.memlock_limit() == 0 && !mm.cap_ipc_lock() {
            return Err(Errno::EPERM);
        }
    }
    if !crate::mlock::mlock_future_ok(mm, vm_flags, len) {
        return Err(Errno::EAGAIN);
    }
    match file {
        Some(f) => vm_flags = mmap_file_flags(f, prot, flags, vm_flags)?,
        // The mapping type of anonymous memory, after the collision check
        // as in do_mmap: MAP_SHARED_VALIDATE and unknown types are EINVAL
        // there too.
        None => match flags & MAP_TYPE {
            MAP_PRIVATE => {}
            // Shared memory cannot grow as a stack.
            MAP_SHARED if vm_flags & VM_GROWSDOWN != 0 => return Err(Errno::EINVAL),
            MAP_SHARED => vm_flags |= VM_SHARED | VM_MAYSHARE,
            _ => return Err(Errno::EINVAL),
        },
    }
    let oc = &oncpu.m.overcommit;
    // MAP_NORESERVE is honoured only where overcommit is allowed.
    if flags & MAP_NORESERVE != 0 && oc.mode() != OvercommitMode::Never {
        vm_flags |= VM_NORESERVE;
    }
    // Shared anonymous memory is a shmem file of the mapping's size, from
    // its start (`shmem_zero_setup`; do_mmap ignores the offset).
    let zero_file;
    let pgoff = if file.is_some() {
        pgoff
    } else if vm_flags & VM_SHARED != 0 {
        zero_file = crate::shmem::shmem_zero_setup(oncpu, mm, len, vm_flags)?;
        file = Some(&zero_file);
        0
    } else {
        addr >> PAGE_SHIFT
    };
    // What MAP_FIXED replaces was charged already: the new mapping takes
    // those pages over and is charged only for the rest (`__mmap_prepare`).
    let replaced = if overlaps {
        nr_accounted(&tree, addr, addr + len)
    } else {
        0
    };
    let accountable = accountable_mapping(vm_flags);
    let charged = if accountable {
        (len >> PAGE_SHIFT) - replaced
    } else {
        0
    };
    if charged != 0 {
        oc.vm_enough_memory(Some(mm.total_vm.load(Ordering::Relaxed)), charged)?;
    }
    if accountable {
        vm_flags |= VM_ACCOUNT;
    }
    // MAP_FIXED over existing mappings: unmap them first (mmap_region).
    if overlaps {
        match do_vmi_munmap(oncpu, mm, &mut tree, addr, addr + len) {
            Ok(unmapped) => {
                debug_assert_eq!(unmapped, replaced);
                if !accountable {
                    oc.vm_unacct_memory(unmapped);
                }
            }
            Err(e) => {
                oc.vm_unacct_memory(charged);
                return Err(e);
            }
        }
        // The gap the unmap left (`vms->prev`, `vms->next`).
        let (found, before) = tree.find_vma_prev(addr);
        (next, prev) = (found.cloned(), before.cloned());
    }
    let vmg = VmaMergeStruct {
        prev: prev.as_ref(),
        middle: None,
        next: next.as_ref(),
        start: addr,
        end: addr + len,
        pgoff,
        flags: vm_flags,
        policy: None,
        anon_vma: None,
        copied_from: None,
        file,
    };
    if vma_merge_new_range(&mut tree, &vmg).is_none() {
        let new =
            Arc::new(Vma::new(mm.id, addr, addr + len, vm_flags, pgoff).with_file(file.cloned()));
        crate::fs::vma_link_file(&new);
        tree.insert(new);
    }
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    mm.total_vm.fetch_add(len >> PAGE_SHIFT, Ordering::Relaxed);
    if vm_flags & VM_LOCKED != 0 {
        mm.locked_vm.fetch_add(len >> PAGE_SHIFT, Ordering::Relaxed);
    }
    drop(guard);
    // mm_populate: fault everything in (a VM_LOCKONFAULT VMA has nothing
    // to do), errors ignored; MAP_NONBLOCK turns MAP_POPULATE off.
    if vm_flags & VM_LOCKED != 0 || flags & (MAP_POPULATE | MAP_NONBLOCK) == MAP_POPULATE {
        let _ = crate::gup::mm_populate(oncpu, mm, addr, len, true);
    }
    Ok(addr)
}

/// The flags of a file mapping, as `do_mmap` checks the mapping type
/// against how the file was opened: a shared mapping that may be written
/// needs a file open for writing (EACCES), and one of a file that is not
/// is made private in all but name (no `VM_SHARED`, no `VM_MAYWRITE`);
/// every mapping needs the file open for reading.
fn mmap_file_flags(
    file: &crate::fs::File,
    prot: u32,
    flags: u32,
    mut vm_flags: VmFlags,
) -> KResult<VmFlags> {
    // LEGACY_MAP_MASK: what MAP_SHARED_VALIDATE accepts (no MAP_SYNC: the
    // model's filesystems have no DAX).
    const LEGACY_MAP_MASK: u32 = MAP_SHARED
        | MAP_PRIVATE
        | MAP_FIXED
        | MAP_ANONYMOUS
        | 0x0800 // MAP_DENYWRITE
        | 0x1000 // MAP_EXECUTABLE
        | MAP_GROWSDOWN
        | MAP_LOCKED
        | MAP_NORESERVE
        | MAP_POPULATE
        | MAP_NONBLOCK
        | MAP_STACK
        | 0x40000; // MAP_HUGETLB
    let shared = match flags & MAP_TYPE {
        MAP_SHARED => true,
        MAP_SHARED_VALIDATE => {
            if flags & !(LEGACY_MAP_MASK | MAP_FIXED_NOREPLACE | MAP_SHARED_VALIDATE) != 0 {
                return Err(Errno::EOPNOTSUPP);
            }
            true
        }
        MAP_PRIVATE => false,
        _ => return Err(Errno::EINVAL),
    };
    if shared {
        if prot & PROT_WRITE != 0 && !file.f_mode.write {
            return Err(Errno::EACCES);
        }
        vm_flags |= VM_SHARED | VM_MAYSHARE;
        if !file.f_mode.write {
            vm_flags &= !(VM_MAYWRITE | VM_SHARED);
        }
    }
    if !file.f_mode.read {
        return Err(Errno::EACCES);
    }
    // A file mapping cannot grow as a stack.
    if vm_flags & VM_GROWSDOWN != 0 {
        return Err(Errno::EINVAL);
    }
    Ok(vm_flags)
}

/// `thp_get_unmapped_area` (ext4's `get_unmapped_area`): a mapping that can
/// hold a whole PMD-aligned extent of the file is placed so that file
/// offsets and addresses agree modulo PMD_SIZE, found by looking for the
/// length plus a PMD and moving up into that room
/// (`__thp_get_unmapped_area`); otherwise, or where no such room is, as
/// any mapping.
pub(crate) fn thp_get_unmapped_area(
    tree: &VmaTree,
    mmap_base: u64,
    addr: u64,
    len: u64,
    off: u64,
    flags: u32,
) -> KResult<u64> {
    if flags & MAP_FIXED == 0 {
        let off_end = off + len;
        let off_align = off.next_multiple_of(PMD_SIZE);
        if off_end > off_align && off_end - off_align >= PMD_SIZE {
            let len_pad = len + PMD_SIZE;
            if let Ok(ret) = get_unmapped_area_plain(tree, mmap_base, addr, len_pad, flags) {
                // A free hint is taken as it is.
                if ret == addr {
                    return Ok(addr);
                }
                let off_sub = off.wrapping_sub(ret) & (PMD_SIZE - 1);
                // Top-down: an aligned start moves up by a whole PMD.
                return Ok(if off_sub == 0 {
                    ret + PMD_SIZE
                } else {
                    ret + off_sub
                });
            }
        }
    }
    get_unmapped_area_plain(tree, mmap_base, addr, len, flags)
}

/// `mm_get_unmapped_area` without the anonymous THP alignment.
pub(crate) fn get_unmapped_area_plain(
    tree: &VmaTree,
    mmap_base: u64,
    addr: u64,
    len: u64,
    flags: u32,
) -> KResult<u64> {
    if len > TASK_SIZE {
        return Err(Errno::ENOMEM);
    }
    if flags & MAP_FIXED != 0 {
        return get_unmapped_area(tree, mmap_base, addr, len, flags);
    }
    if addr != 0 {
        let a = addr & PAGE_MASK;
        if a <= TASK_SIZE - len && a >= MMAP_MIN_ADDR && hint_is_free(tree, a, len) {
            return Ok(a);
        }
    }
    tree.unmapped_area_topdown(len, MMAP_MIN_ADDR, mmap_base)
        .ok_or(Errno::ENOMEM)
}

/// `accountable_mapping`: private writable memory that may not overcommit
/// is charged to `vm_committed_as` (see [`crate::util`]).
fn accountable_mapping(vm_flags: VmFlags) -> bool {
    vm_flags & (VM_NORESERVE | VM_SHARED | VM_WRITE) == VM_WRITE
}

/// The pages of `vmas` charged to `vm_committed_as` (their `VM_ACCOUNT`
/// ones), as munmap and exit give them back (`nr_accounted`).
pub(crate) fn vmas_accounted_pages<'a>(vmas: impl IntoIterator<Item = &'a Arc<Vma>>) -> u64 {
    vmas.into_iter()
        .filter(|v| v.flags() & VM_ACCOUNT != 0)
        .map(|v| v.pages())
        .sum()
}

/// The pages of `[start, end)` that `VM_ACCOUNT` VMAs map.
fn nr_accounted(tree: &VmaTree, start: u64, end: u64) -> u64 {
    tree.range(start, end)
        .filter(|v| v.flags() & VM_ACCOUNT != 0)
        .map(|v| (v.end().min(end) - v.start().max(start)) >> PAGE_SHIFT)
        .sum()
}

/// `do_vmi_munmap` on a tree being edited, with mmap_lock held for writing
/// throughout (a MAP_FIXED mapping replacing them): detach the VMAs, then
/// zap and free their tables. Returns the pages of the detached
/// `VM_ACCOUNT` VMAs, for the caller to uncharge or to hand on to the
/// mapping that replaces them.
pub(crate) fn do_vmi_munmap(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    start: u64,
    end: u64,
) -> KResult<u64> {
    Ok(vms_gather_munmap_vmas(oncpu, mm, tree, start, end)?.map_or(0, |d| d.complete(oncpu, mm)))
}

/// VMAs detached by a munmap and published gone, whose pages and tables are
/// still to be freed (the kernel's `struct vma_munmap_struct`).
struct DetachedVmas {
    vmas: Vec<Arc<Vma>>,
    floor: u64,
    ceiling: u64,
}

/// `vms_gather_munmap_vmas` + the tree update: split at the edges, take the
/// VMAs out and publish the tree without them, so that no new fault maps
/// into the range once mmap_lock is downgraded or dropped. `None` if
/// nothing was mapped there.
fn vms_gather_munmap_vmas(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    start: u64,
    end: u64,
) -> KResult<Option<DetachedVmas>> {
    let vmas = munmap_split_range(oncpu, mm, tree, start, end)?;
    if vmas.is_empty() {
        return Ok(None);
    }
    let floor = tree.prev_vma(start).map_or(0, |p| p.end());
    let ceiling = tree.next_vma(end).map_or(0, |n| n.start());
    tree.replace(&vmas, Vec::new());
    for v in &vmas {
        v.mark_detached();
    }
    mm.vma_tree_publish(tree, &crate::sync::epoch::pin());
    let pages: u64 = vmas.iter().map(|v| v.pages()).sum();
    mm.total_vm.fetch_sub(pages, Ordering::Relaxed);
    let locked: u64 = vmas
        .iter()
        .filter(|v| v.flags() & VM_LOCKED != 0)
        .map(|v| v.pages())
        .sum();
    mm.locked_vm.fetch_sub(locked, Ordering::Relaxed);
    Ok(Some(DetachedVmas {
        vmas,
        floor,
        ceiling,
    }))
}

impl DetachedVmas {
    /// `vms_complete_munmap_vmas`: zap the pages, unlink the anon_vmas and
    /// free the tables (`unmap_region`); mmap_lock held for reading or
    /// writing. Returns the pages the VMAs had charged.
    fn complete(self, oncpu: &OnCpu, mm: &Arc<Mm>) -> u64 {
        unmap_region(oncpu, mm, &self.vmas, self.floor, self.ceiling);
        vmas_accounted_pages(&self.vmas)
    }
}

/// `unmap_region`. (It drains no LRU batch: 6.18 does not; what the
/// batches hold stays there, references and all, until a drain.)
fn unmap_region(oncpu: &OnCpu, mm: &Arc<Mm>, vmas: &[Arc<Vma>], floor: u64, ceiling: u64) {
    let mut tlb = MmuGather::new(mm);
    let (start, end) = (vmas[0].start(), vmas[vmas.len() - 1].end());
    memory::unmap_vmas(oncpu, &mut tlb, vmas, start, end);
    memory::free_pgtables(oncpu, &mut tlb, vmas, floor, ceiling);
    tlb.finish(oncpu);
    fput_shared_anon(oncpu, vmas);
}

/// The `fput` of VMAs that have left for good, as far as it shows: the
/// file of shared anonymous memory that no VMA maps any more is evicted
/// on this CPU (the task's `fput` runs at its return to user), and the
/// truncation of its pages drains this CPU's LRU batches
/// (`folio_batch_release`), which hold the folios the unmap just
/// munlocked or deactivated. (The model frees the inode itself later, when
/// the last version of the tree that names the VMAs goes.)
pub(crate) fn fput_shared_anon(oncpu: &OnCpu, vmas: &[Arc<Vma>]) {
    let evicted = vmas.iter().filter_map(|v| v.file()).any(|f| {
        let mapping = f.mapping();
        f.shared_anon && !mapping.mapped() && mapping.nrpages() > 0
    });
    if evicted {
        crate::swap::lru_add_drain(oncpu.mem(), oncpu.id());
    }
}

/// `expand_downwards`: the stack `vma` grows down to take in `addr`, which
/// lies below it, under mmap_lock held for writing. Refused where the
/// VMA does not grow down (EFAULT), below `mmap_min_addr` (EPERM), within
/// the guard gap of an accessible VMA below that is not a stack itself,
/// past `RLIMIT_STACK`, the mlock limit or the commit limit (ENOMEM).
/// The grown VMA's page offset moves down with its start, so that the
/// folios it maps keep their index. Returns the grown VMA, published.
///
/// The kernel charges the growth to `vm_committed_as` whatever the VMA's
/// `VM_ACCOUNT` (`acct_stack_growth`), and munmap gives back only what
/// `VM_ACCOUNT` VMAs hold: the model charges `VM_ACCOUNT` stacks alone,
/// so that the commitment stays the size of the accounted VMAs.
pub(crate) fn expand_downwards(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    vma: &Arc<Vma>,
    addr: u64,
) -> KResult<Arc<Vma>> {
    if vma.flags() & VM_GROWSDOWN == 0 {
        return Err(Errno::EFAULT);
    }
    let addr = addr & PAGE_MASK;
    if addr < MMAP_MIN_ADDR {
        return Err(Errno::EPERM);
    }
    debug_assert!(addr < vma.start());
    let mut tree = mm.vma_tree_draft();
    if let Some(prev) = tree.prev_vma(vma.start()) {
        if prev.flags() & VM_GROWSDOWN == 0
            && prev.flags() & VM_ACCESS_FLAGS != 0
            && addr - prev.end() < STACK_GUARD_GAP
        {
            return Err(Errno::ENOMEM);
        }
    }
    // The folios the grown range will map attach to the stack's anon_vma,
    // made now (the kernel makes it before it write-locks the VMA).
    crate::rmap::anon_vma_prepare(mm, vma);
    let size = vma.end() - addr;
    let grow = (vma.start() - addr) >> PAGE_SHIFT;
    if grow > vma.pgoff() {
        return Err(Errno::ENOMEM);
    }
    // acct_stack_growth.
    if size > mm.stack_limit()
        || !crate::mlock::mlock_future_ok(mm, vma.flags(), grow << PAGE_SHIFT)
    {
        return Err(Errno::ENOMEM);
    }
    if vma.flags() & VM_ACCOUNT != 0 {
        oncpu
            .m
            .overcommit
            .vm_enough_memory(Some(mm.total_vm.load(Ordering::Relaxed)), grow)?;
    }
    if vma.flags() & VM_LOCKED != 0 {
        mm.locked_vm.fetch_add(grow, Ordering::Relaxed);
    }
    mm.total_vm.fetch_add(grow, Ordering::Relaxed);
    let grown = vma_dup(vma, addr, vma.end(), vma.flags());
    tree.replace(std::slice::from_ref(vma), vec![grown.clone()]);
    vma_retire(vma);
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    Ok(grown)
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
    let g = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_draft();
    let Some(detached) = vms_gather_munmap_vmas(oncpu, mm, &mut tree, start, start + len)? else {
        return Ok(());
    };
    drop(tree);
    // mmap_write_downgrade: the VMAs are gone from the tree; faults
    // elsewhere may run while their pages and tables are freed.
    let _g = g.downgrade();
    let accounted = detached.complete(oncpu, mm);
    oncpu.m.overcommit.vm_unacct_memory(accounted);
    Ok(())
}

/// `insert_vm_struct`: a new VMA where nothing is mapped, charged to the
/// commitment if it is `VM_ACCOUNT` (exec's first stack page).
pub(crate) fn insert_vm_struct(oncpu: &OnCpu, mm: &Arc<Mm>, vma: Vma) -> KResult<()> {
    let _g = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_draft();
    if tree.find_vma_intersection(vma.start(), vma.end()).is_some() {
        return Err(Errno::ENOMEM);
    }
    if vma.flags() & VM_ACCOUNT != 0 {
        oncpu
            .m
            .overcommit
            .vm_enough_memory(Some(mm.total_vm.load(Ordering::Relaxed)), vma.pages())?;
    }
    mm.total_vm.fetch_add(vma.pages(), Ordering::Relaxed);
    tree.insert(Arc::new(vma));
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    Ok(())
}

/// `_install_special_mapping`: `[start, start + len)` as the special
/// mapping `sm` with `flags` (and `VM_DONTEXPAND`), into `tree`, which
/// the caller (holding mmap_lock for writing) publishes.
pub(crate) fn install_special_mapping(
    mm: &Arc<Mm>,
    tree: &mut VmaTree,
    (start, len): (u64, u64),
    flags: VmFlags,
    sm: &'static SpecialMapping,
) -> KResult<()> {
    if tree.find_vma_intersection(start, start + len).is_some() {
        return Err(Errno::ENOMEM);
    }
    let flags = flags | mm.def_flags.load(Ordering::Relaxed) | VM_DONTEXPAND;
    let vma = Vma::new(mm.id, start, start + len, flags, 0).with_special(Some(sm));
    tree.insert(Arc::new(vma));
    mm.total_vm.fetch_add(len >> PAGE_SHIFT, Ordering::Relaxed);
    Ok(())
}

/// `brk(2)`: move the end of the heap to `brk`, and return where it is
/// then (the old end when the move is refused, as the kernel answers;
/// `brk(0)` asks). Growth extends the VMA that ends at the old brk, or
/// makes one (`do_brk_flags`), refused where it would come within a page
/// and the stack guard gap of the next mapping; shrinking unmaps. The
/// model has no `RLIMIT_DATA` (`check_data_rlimit` always passes).
pub fn sys_brk(oncpu: &OnCpu, mm: &Arc<Mm>, brk: u64) -> u64 {
    let g = mm.mmap_lock.write();
    let layout = mm.layout();
    let origbrk = layout.brk;
    if brk < layout.start_brk {
        return origbrk;
    }
    let (Some(newbrk), Some(oldbrk)) = (page_align(brk), page_align(origbrk)) else {
        return origbrk;
    };
    if oldbrk == newbrk {
        mm.set_layout(&g, |l| l.brk = brk);
        return brk;
    }
    if brk <= origbrk {
        return brk_shrink(oncpu, mm, g, brk, newbrk, oldbrk);
    }
    let mut tree = mm.vma_tree_draft();
    if check_brk_limits(&tree, mm, oldbrk, newbrk - oldbrk).is_err() {
        return origbrk;
    }
    // The next mapping, with the page and the guard gap kept below it.
    let limit = newbrk.saturating_add(PAGE_SIZE + STACK_GUARD_GAP);
    if tree
        .find_vma_intersection(oldbrk, limit)
        .is_some_and(|next| newbrk + PAGE_SIZE > next.start_gap())
    {
        return origbrk;
    }
    // vma_prev_limit: the VMA below oldbrk, if it starts at start_brk or
    // above.
    let brkvma = tree
        .find_vma_prev(oldbrk)
        .1
        .filter(|v| v.end() > layout.start_brk)
        .cloned();
    if do_brk_flags(oncpu, mm, &mut tree, brkvma, oldbrk, newbrk - oldbrk, 0).is_err() {
        return origbrk;
    }
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    mm.set_layout(&g, |l| l.brk = brk);
    let populate = mm.def_flags.load(Ordering::Relaxed) & VM_LOCKED != 0;
    drop(g);
    if populate {
        let _ = crate::gup::mm_populate(oncpu, mm, oldbrk, newbrk - oldbrk, true);
    }
    brk
}

/// brk's shrinking half: unmap `[newbrk, oldbrk)`, refused (the old brk
/// kept) where nothing is mapped there.
fn brk_shrink(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    g: crate::mm::mmap_lock::MmapWriteGuard<'_>,
    brk: u64,
    newbrk: u64,
    oldbrk: u64,
) -> u64 {
    let origbrk = mm.layout().brk;
    let mut tree = mm.vma_tree_draft();
    if tree.find_vma_intersection(newbrk, oldbrk).is_none() {
        return origbrk;
    }
    mm.set_layout(&g, |l| l.brk = brk);
    let detached = match vms_gather_munmap_vmas(oncpu, mm, &mut tree, newbrk, oldbrk) {
        Ok(d) => d,
        Err(_) => {
            mm.set_layout(&g, |l| l.brk = origbrk);
            return origbrk;
        }
    };
    drop(tree);
    let _g = g.downgrade();
    if let Some(detached) = detached {
        let accounted = detached.complete(oncpu, mm);
        oncpu.m.overcommit.vm_unacct_memory(accounted);
    }
    brk
}

/// `check_brk_limits`: the range fits in the address space (a fixed
/// `get_unmapped_area`), and a locked heap would not pass the mlock
/// limit.
fn check_brk_limits(tree: &VmaTree, mm: &Mm, addr: u64, len: u64) -> KResult<()> {
    get_unmapped_area(tree, mm.mmap_base(), addr, len, MAP_FIXED)?;
    if !crate::mlock::mlock_future_ok(mm, mm.def_flags.load(Ordering::Relaxed), len) {
        return Err(Errno::EAGAIN);
    }
    Ok(())
}

/// `do_brk_flags`: `[addr, addr + len)` as private anonymous memory of
/// the data's flags, charged to the commitment; it extends `vma` when
/// that ends at `addr` and may take it (only ever that VMA: brk never
/// merges with the mapping above), else it is a VMA of its own. The
/// caller holds mmap_lock for writing and publishes `tree`.
pub(crate) fn do_brk_flags(
    oncpu: &OnCpu,
    mm: &Mm,
    tree: &mut VmaTree,
    vma: Option<Arc<Vma>>,
    addr: u64,
    len: u64,
    flags: VmFlags,
) -> KResult<()> {
    let vm_flags =
        flags | VM_DATA_DEFAULT_FLAGS | VM_ACCOUNT | mm.def_flags.load(Ordering::Relaxed);
    if tree.len() > MAX_MAP_COUNT {
        return Err(Errno::ENOMEM);
    }
    let pages = len >> PAGE_SHIFT;
    oncpu
        .m
        .overcommit
        .vm_enough_memory(Some(mm.total_vm.load(Ordering::Relaxed)), pages)?;
    let expanded = vma.as_ref().filter(|v| v.end() == addr).and_then(|prev| {
        let vmg = VmaMergeStruct {
            prev: Some(prev),
            middle: None,
            next: None,
            start: addr,
            end: addr + len,
            pgoff: addr >> PAGE_SHIFT,
            flags: vm_flags,
            policy: None,
            anon_vma: None,
            copied_from: None,
            file: None,
        };
        vma_merge_new_range(tree, &vmg)
    });
    if expanded.is_none() {
        tree.insert(Arc::new(Vma::new(
            mm.id,
            addr,
            addr + len,
            vm_flags,
            addr >> PAGE_SHIFT,
        )));
    }
    mm.total_vm.fetch_add(pages, Ordering::Relaxed);
    if vm_flags & VM_LOCKED != 0 {
        mm.locked_vm.fetch_add(pages, Ordering::Relaxed);
    }
    Ok(())
}

/// `vm_brk_flags`: map `[addr, addr + request)` as brk memory, replacing
/// whatever was there (exec's bss). `flags` may only be `VM_EXEC`.
pub fn vm_brk_flags(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    addr: u64,
    request: u64,
    flags: VmFlags,
) -> KResult<()> {
    let len = page_align(request).ok_or(Errno::ENOMEM)?;
    if len == 0 {
        return Ok(());
    }
    if flags & !VM_EXEC != 0 {
        return Err(Errno::EINVAL);
    }
    let g = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_draft();
    check_brk_limits(&tree, mm, addr, len)?;
    let unmapped = do_vmi_munmap(oncpu, mm, &mut tree, addr, addr + len)?;
    oncpu.m.overcommit.vm_unacct_memory(unmapped);
    let prev = tree.find_vma_prev(addr).1.cloned();
    do_brk_flags(oncpu, mm, &mut tree, prev, addr, len, flags)?;
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    let populate = mm.def_flags.load(Ordering::Relaxed) & VM_LOCKED != 0;
    drop(g);
    if populate {
        let _ = crate::gup::mm_populate(oncpu, mm, addr, len, true);
    }
    Ok(())
}

/// `exit_mmap`: tear the whole address space down.
pub fn exit_mmap(oncpu: &OnCpu, mm: &Arc<Mm>) {
    let _g = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_draft();
    let vmas: Vec<Arc<Vma>> = tree.iter().cloned().collect();
    // Out of the draft (write-locked) first; the published tree keeps them
    // until the end.
    tree.remove_all();
    mm.dead.store(true, Ordering::Relaxed);
    if !vmas.is_empty() {
        let mut tlb = MmuGather::new_fullmm(mm);
        memory::unmap_vmas(oncpu, &mut tlb, &vmas, 0, u64::MAX);
        memory::free_pgtables(oncpu, &mut tlb, &vmas, 0, 0);
        tlb.finish(oncpu);
        fput_shared_anon(oncpu, &vmas);
    }
    // free_pgtables unlinked their anon_vmas.
    for v in &vmas {
        v.mark_detached();
    }
    oncpu
        .m
        .overcommit
        .vm_unacct_memory(vmas_accounted_pages(&vmas));
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    mm.total_vm.store(0, Ordering::Relaxed);
    debug_assert_eq!(
        mm.pgtables_bytes.load(Ordering::Relaxed),
        0,
        "{mm:?}: page tables left after exit_mmap"
    );
    debug_assert_eq!(mm.rss_pages(), 0, "{mm:?}: RSS left after exit_mmap");
}
