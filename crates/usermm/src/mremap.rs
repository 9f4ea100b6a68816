//! mremap (mm/mremap.c): resize a mapping in place, or move it elsewhere,
//! its page tables with it.
//!
//! A move makes the destination VMA first (`copy_vma`: a neighbour grows
//! over the range where it can), then moves what the source maps, a page
//! table level at a time where the kernel does (`move_page_tables`): a
//! whole PMD table, with everything under it, where both ranges cover its
//! GiB (`move_normal_pud`); a huge PMD whole, with its deposited table
//! (`move_huge_pmd`); a whole PTE table where both ranges cover its PMD
//! (`move_normal_pmd`); otherwise
//! entry by entry (`move_ptes`), large folios staying whole. A folio's rmap
//! needs no change: the destination VMA has the source's anon_vma and page
//! offsets (or the same file offsets), so the same index finds it at its
//! new address. Then the source range is unmapped, its commitment handed
//! to the destination (MREMAP_DONTUNMAP leaves it mapped, empty).
//!
//! # Locking
//!
//! mmap_lock is held for writing throughout, and the VMAs of both ranges
//! are write-locked by the tree's draft, so that faults there wait for it
//! (per-VMA locks) or abort (speculative ones, on the odd sequence count).
//! Each move of entries holds the locks of the page tables moved from and
//! to (one lock where they are the same table), taken in either order: no
//! other path holds two of them. The kernel also takes the source VMA's
//! rmap locks (its anon_vma's and its file's `i_mmap`) around a move only
//! where an rmap walk could otherwise visit the new VMA before the old
//! one and miss an entry on its way across (`need_rmap_locks`); the model
//! takes them around every move, which an rmap walk cannot tell from the
//! kernel's ordering argument, and which keeps the model from depending on
//! the order of its interval trees.
//!
//! Not modelled: sealed VMAs, userfaultfd, hugetlb and `VM_DONTEXPAND`/`VM_PFNMAP`
//! mappings, none of which the model has.

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::mm::vma::*;
use crate::mm::{Mm, Vma, VmaTree, MAX_MAP_COUNT, TASK_SIZE};
use crate::mmap::{
    copy_vma, do_vmi_munmap, get_unmapped_area, get_unmapped_area_plain, thp_get_unmapped_area,
    vma_merge_extend, vma_set_flags, MAP_FIXED, MAP_SHARED,
};
use crate::pgtable::{Pmd, PmdSlot, Pte, PteLocked, PteRead, PMD_MASK, PMD_SHIFT, PMD_SIZE};
use crate::phys::{PAGE_MASK, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::{Arc, Ordering};

pub const MREMAP_MAYMOVE: u32 = 1;
pub const MREMAP_FIXED: u32 = 2;
pub const MREMAP_DONTUNMAP: u32 = 4;

/// `enum mremap_type`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum RemapType {
    NoResize,
    Shrink,
    Expand,
}

/// `struct vma_remap_struct`: one mremap's request and progress.
struct VmaRemap {
    addr: u64,
    old_len: u64,
    new_len: u64,
    flags: u32,
    new_addr: u64,
    /// The VMA at `addr`; None once an unmap has made it stale.
    vma: Option<Arc<Vma>>,
    delta: u64,
    remap_type: RemapType,
    /// Pages charged to the commitment for the destination.
    charged: u64,
    /// A locked VMA grew: its new part is populated after the lock is
    /// dropped.
    populate_expand: bool,
}

impl VmaRemap {
    /// `vrm_implies_new_addr`: MREMAP_FIXED or MREMAP_DONTUNMAP.
    fn implies_new_addr(&self) -> bool {
        self.flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0
    }

    /// `vrm_will_map_new`.
    fn will_map_new(&self) -> bool {
        self.remap_type == RemapType::Expand || self.implies_new_addr()
    }

    /// `vrm_move_only`: MREMAP_FIXED without a change of size, which may
    /// move several VMAs at once.
    fn move_only(&self) -> bool {
        self.flags & MREMAP_FIXED != 0 && self.old_len == self.new_len
    }

    /// `vrm_overlaps`.
    fn overlaps(&self) -> bool {
        let end_old = self.addr.wrapping_add(self.old_len);
        let end_new = self.new_addr.wrapping_add(self.new_len);
        end_old > self.new_addr && end_new > self.addr
    }

    fn vma(&self) -> KResult<&Arc<Vma>> {
        self.vma.as_ref().ok_or(Errno::EFAULT)
    }
}

/// `PAGE_ALIGN`, which wraps as the kernel's does (a length within a page
/// of the top becomes 0).
fn page_align_wrapping(len: u64) -> u64 {
    len.wrapping_add(PAGE_SIZE - 1) & PAGE_MASK
}

/// `mremap(2)`. Returns the address of the mapping.
pub fn do_mremap(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    addr: u64,
    old_len: u64,
    new_len: u64,
    flags: u32,
    new_addr: u64,
) -> KResult<u64> {
    let mut vrm = VmaRemap {
        addr,
        old_len: page_align_wrapping(old_len),
        new_len: page_align_wrapping(new_len),
        flags,
        new_addr,
        vma: None,
        delta: 0,
        remap_type: RemapType::NoResize,
        charged: 0,
        populate_expand: false,
    };
    check_mremap_params(mm, &vrm)?;
    let guard = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_draft();
    let res = if vrm.move_only() {
        remap_move(oncpu, mm, &mut tree, &mut vrm)
    } else {
        vrm.vma = tree.vma_lookup(addr).cloned();
        check_prep_vma(mm, &mut vrm).and_then(|()| {
            if vrm.implies_new_addr() {
                mremap_to(oncpu, mm, &mut tree, &mut vrm)
            } else {
                mremap_at(oncpu, mm, &mut tree, &mut vrm)
            }
        })
    };
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    drop(guard);
    // A locked VMA that grew has its new part faulted in (`mm_populate`,
    // errors ignored).
    if res.is_ok() && vrm.populate_expand {
        let _ = crate::gup::mm_populate(oncpu, mm, vrm.new_addr + vrm.old_len, vrm.delta, true);
    }
    res
}

/// `check_mremap_params`: the checks that need no VMA, in the kernel's
/// order.
fn check_mremap_params(mm: &Mm, vrm: &VmaRemap) -> KResult<()> {
    if vrm.flags & !(MREMAP_FIXED | MREMAP_MAYMOVE | MREMAP_DONTUNMAP) != 0 {
        return Err(Errno::EINVAL);
    }
    if vrm.addr & !PAGE_MASK != 0 {
        return Err(Errno::EINVAL);
    }
    // A zero old length asks for a second mapping of shared memory; a
    // zero new length makes no sense.
    if vrm.new_len == 0 || vrm.new_len > TASK_SIZE {
        return Err(Errno::EINVAL);
    }
    if !vrm.implies_new_addr() {
        return Ok(());
    }
    if vrm.new_addr > TASK_SIZE - vrm.new_len || vrm.new_addr & !PAGE_MASK != 0 {
        return Err(Errno::EINVAL);
    }
    if vrm.flags & MREMAP_MAYMOVE == 0 {
        return Err(Errno::EINVAL);
    }
    if vrm.flags & MREMAP_DONTUNMAP != 0 && vrm.old_len != vrm.new_len {
        return Err(Errno::EINVAL);
    }
    if vrm.overlaps() {
        return Err(Errno::EINVAL);
    }
    // Room for both ranges' VMAs to be split in three.
    let map_count = mm.vma_tree(&crate::sync::epoch::pin()).len();
    if map_count + 2 >= MAX_MAP_COUNT - 3 {
        return Err(Errno::ENOMEM);
    }
    Ok(())
}

/// `check_prep_vma`: the checks on the VMA at `addr`; sets the kind of
/// remap and its size change.
fn check_prep_vma(mm: &Mm, vrm: &mut VmaRemap) -> KResult<()> {
    let vma = vrm.vma()?.clone();
    vrm.delta = vrm.old_len.abs_diff(vrm.new_len);
    vrm.remap_type = if vrm.delta == 0 {
        RemapType::NoResize
    } else if vrm.old_len > vrm.new_len {
        RemapType::Shrink
    } else {
        RemapType::Expand
    };
    if !vrm.implies_new_addr() {
        vrm.new_addr = vrm.addr;
    }
    if !vrm.will_map_new() {
        return Ok(());
    }
    // A zero old length duplicates shared memory only.
    if vrm.old_len == 0 && vma.flags() & (VM_SHARED | VM_MAYSHARE) == 0 {
        return Err(Errno::EINVAL);
    }
    // A shrink may cross VMA boundaries in what it unmaps; what stays
    // must lie in this VMA.
    let old_len = if vrm.remap_type == RemapType::Shrink {
        vrm.new_len
    } else {
        vrm.old_len
    };
    if old_len > vma.end() - vrm.addr {
        return Err(Errno::EFAULT);
    }
    if vrm.new_len == old_len {
        return Ok(());
    }
    if vma.flags() & VM_LOCKED != 0 {
        vrm.populate_expand = true;
    }
    let pgoff = vma.linear_page_index(vrm.addr);
    if pgoff.checked_add(vrm.new_len >> PAGE_SHIFT).is_none() {
        return Err(Errno::EINVAL);
    }
    if !crate::mlock::mlock_future_ok(mm, vma.flags(), vrm.delta) {
        return Err(Errno::EAGAIN);
    }
    Ok(())
}

/// `remap_move`: MREMAP_FIXED without a change of size moves every VMA of
/// `[addr, addr + old_len)` (split where the range cuts one), keeping the
/// gaps between them. No gap may open the range.
fn remap_move(oncpu: &OnCpu, mm: &Arc<Mm>, tree: &mut VmaTree, vrm: &mut VmaRemap) -> KResult<u64> {
    let (start, end) = (vrm.addr, vrm.addr + vrm.old_len);
    let mut target = vrm.new_addr;
    let mut res = Err(Errno::EFAULT);
    let mut last_end = None;
    let mut cur = start;
    while let Some(vma) = tree.find_vma(cur).filter(|v| v.start() < end).cloned() {
        if last_end.is_none() && start < vma.start() {
            return Err(Errno::EFAULT);
        }
        let addr = vma.start().max(start);
        let len = end.min(vma.end()) - addr;
        // Unsigned, as the kernel's: a VMA that merged with its own copy
        // (moved next to itself) is found again, starting before the last
        // one ended, and the offset wraps.
        let offset = last_end.map_or(0, |e| vma.start().wrapping_sub(e));
        last_end = Some(vma.end());
        cur = vma.end();
        vrm.vma = Some(vma);
        vrm.addr = addr;
        vrm.new_addr = target.wrapping_add(offset);
        vrm.old_len = len;
        vrm.new_len = len;
        check_prep_vma(mm, vrm)?;
        let moved = mremap_to(oncpu, mm, tree, vrm)?;
        if res.is_err() {
            res = Ok(moved);
        }
        target = moved + len;
    }
    res
}

/// `mremap_to`: move to the address asked for (MREMAP_FIXED: what is
/// there is unmapped first), or to one found (MREMAP_DONTUNMAP alone, the
/// address a hint), shrinking first if asked.
fn mremap_to(oncpu: &OnCpu, mm: &Arc<Mm>, tree: &mut VmaTree, vrm: &mut VmaRemap) -> KResult<u64> {
    if vrm.flags & MREMAP_FIXED != 0 {
        let unmapped = do_vmi_munmap(oncpu, mm, tree, vrm.new_addr, vrm.new_addr + vrm.new_len)?;
        oncpu.m.overcommit.vm_unacct_memory(unmapped);
        // The source VMA may have been split by that unmap.
        vrm.vma = Some(tree.vma_lookup(vrm.addr).ok_or(Errno::EFAULT)?.clone());
    }
    if vrm.remap_type == RemapType::Shrink {
        shrink_vma(oncpu, mm, tree, vrm)?;
        vrm.old_len = vrm.new_len;
    }
    set_new_addr(tree, mm.mmap_base(), vrm)?;
    move_vma(oncpu, mm, tree, vrm)
}

/// `mremap_at`: resize where the mapping is, moving it if it must grow and
/// cannot in place (MREMAP_MAYMOVE).
fn mremap_at(oncpu: &OnCpu, mm: &Arc<Mm>, tree: &mut VmaTree, vrm: &mut VmaRemap) -> KResult<u64> {
    match vrm.remap_type {
        RemapType::NoResize => Ok(vrm.addr),
        RemapType::Shrink => {
            shrink_vma(oncpu, mm, tree, vrm)?;
            Ok(vrm.addr)
        }
        RemapType::Expand => expand_vma(oncpu, mm, tree, vrm),
    }
}

/// `shrink_vma`: unmap what lies past the new length.
fn shrink_vma(oncpu: &OnCpu, mm: &Arc<Mm>, tree: &mut VmaTree, vrm: &mut VmaRemap) -> KResult<()> {
    let start = vrm.addr + vrm.new_len;
    let unmapped = do_vmi_munmap(oncpu, mm, tree, start, start + vrm.delta)?;
    oncpu.m.overcommit.vm_unacct_memory(unmapped);
    vrm.vma = Some(tree.vma_lookup(vrm.addr).ok_or(Errno::EFAULT)?.clone());
    Ok(())
}

/// `expand_vma`: grow in place where the range ends the VMA and free
/// space follows it (`vma_expandable`), otherwise move (MREMAP_MAYMOVE),
/// otherwise ENOMEM.
fn expand_vma(oncpu: &OnCpu, mm: &Arc<Mm>, tree: &mut VmaTree, vrm: &mut VmaRemap) -> KResult<u64> {
    let vma = vrm.vma()?.clone();
    if vma.end() - vrm.addr == vrm.old_len && vma_expandable(tree, &vma, vrm.delta) {
        calc_charge(oncpu, mm, vrm)?;
        let grown = vma_merge_extend(tree, &vma, vrm.delta);
        vrm.vma = Some(grown);
        stat_account(mm, vrm, vrm.delta);
        return Ok(vrm.addr);
    }
    if vrm.flags & MREMAP_MAYMOVE == 0 {
        return Err(Errno::ENOMEM);
    }
    set_new_addr(tree, mm.mmap_base(), vrm)?;
    move_vma(oncpu, mm, tree, vrm)
}

/// `vma_expandable`: nothing in the `delta` bytes after the VMA, and the
/// grown VMA still fits below the top.
fn vma_expandable(tree: &VmaTree, vma: &Vma, delta: u64) -> bool {
    let Some(end) = vma.end().checked_add(delta) else {
        return false;
    };
    tree.find_vma_intersection(vma.end(), end).is_none()
        && get_unmapped_area(tree, 0, vma.start(), end - vma.start(), MAP_FIXED).is_ok()
}

/// `vrm_set_new_addr`: where the mapping goes, found as mmap finds room:
/// at the address asked for (MREMAP_FIXED), or near the hint
/// (MREMAP_DONTUNMAP), or anywhere; an anonymous one whose length is whole
/// PMDs and that has no hint PMD-aligned (its page offset taken as 0, as
/// `__get_unmapped_area` takes it), a file mapping so that its file
/// offsets keep their alignment to PMDs.
fn set_new_addr(tree: &VmaTree, mmap_base: u64, vrm: &mut VmaRemap) -> KResult<()> {
    let vma = vrm.vma()?;
    let pgoff = vma.linear_page_index(vrm.addr);
    let hint = if vrm.implies_new_addr() {
        vrm.new_addr
    } else {
        0
    };
    let mut map_flags = 0;
    if vrm.flags & MREMAP_FIXED != 0 {
        map_flags |= MAP_FIXED;
    }
    if vma.flags() & VM_MAYSHARE != 0 {
        map_flags |= MAP_SHARED;
    }
    let len = vrm.new_len;
    let off = pgoff << PAGE_SHIFT;
    vrm.new_addr = if vma.is_anonymous() {
        get_unmapped_area(tree, mmap_base, hint, len, map_flags)?
    } else if vma.file().is_some_and(|f| f.mapping().is_shmem()) {
        // Shared memory: shmem's own placement, which aligns nothing
        // while shmem THPs are off.
        get_unmapped_area_plain(tree, mmap_base, hint, len, map_flags)?
    } else {
        thp_get_unmapped_area(tree, mmap_base, hint, len, off, map_flags)?
    };
    Ok(())
}

/// `vrm_calc_charge`: an accounted mapping is charged for the pages it
/// gains (all of the new length when the old stays, MREMAP_DONTUNMAP).
fn calc_charge(oncpu: &OnCpu, mm: &Mm, vrm: &mut VmaRemap) -> KResult<()> {
    let vma = vrm.vma()?;
    if vma.flags() & VM_ACCOUNT == 0 {
        return Ok(());
    }
    let charged = if vrm.flags & MREMAP_DONTUNMAP != 0 {
        vrm.new_len >> PAGE_SHIFT
    } else {
        vrm.delta >> PAGE_SHIFT
    };
    let total_vm = mm.total_vm.load(Ordering::Relaxed);
    oncpu
        .m
        .overcommit
        .vm_enough_memory(Some(total_vm), charged)?;
    vrm.charged = charged;
    Ok(())
}

/// `vrm_stat_account`: the mapping gained `bytes`.
fn stat_account(mm: &Mm, vrm: &VmaRemap, bytes: u64) {
    let pages = bytes >> PAGE_SHIFT;
    let Some(vma) = vrm.vma.as_ref() else { return };
    mm.total_vm.fetch_add(pages, Ordering::Relaxed);
    if vma.flags() & VM_LOCKED != 0 {
        mm.locked_vm.fetch_add(pages, Ordering::Relaxed);
    }
}

/// `move_vma`: make the destination VMA, move the page tables into it,
/// then unmap the source range (or, with MREMAP_DONTUNMAP, leave it
/// mapped and empty, unlocked).
fn move_vma(oncpu: &OnCpu, mm: &Arc<Mm>, tree: &mut VmaTree, vrm: &mut VmaRemap) -> KResult<u64> {
    // prep_move_vma: room for the splits of the unmap.
    if tree.len() >= MAX_MAP_COUNT - 3 {
        return Err(Errno::ENOMEM);
    }
    calc_charge(oncpu, mm, vrm)?;
    let vma = vrm.vma()?.clone();
    tree.start_write(&vma);
    let pgoff = vma.linear_page_index(vrm.addr);
    let Some((new_vma, source)) = copy_vma(tree, &vma, vrm.new_addr, vrm.new_len, pgoff) else {
        oncpu.m.overcommit.vm_unacct_memory(vrm.charged);
        return Err(Errno::ENOMEM);
    };
    vrm.vma = Some(source.clone());
    // Published before the move, as the kernel's tree has the new VMA:
    // a lockless reader finds both write-locked (or the count odd).
    mm.vma_tree_publish(tree, &crate::sync::epoch::pin());
    let mut pmc = PagetableMove {
        old: &source,
        new: &new_vma,
        old_addr: vrm.addr,
        new_addr: vrm.new_addr,
        old_end: vrm.addr + vrm.old_len,
        len_in: vrm.old_len,
    };
    let moved = move_page_tables(oncpu, mm, tree, &mut pmc);
    // The model allocates page tables from memory it never runs out of
    // while a process may still map memory: a short move (which the
    // kernel undoes) is a bug here.
    assert_eq!(
        moved, vrm.old_len,
        "mremap moved {moved:#x} of {:#x}",
        vrm.old_len
    );
    stat_account(mm, vrm, vrm.new_len);
    if vrm.flags & MREMAP_DONTUNMAP != 0 {
        dontunmap_complete(tree, vrm, &new_vma);
    } else {
        unmap_source_vma(oncpu, mm, tree, vrm);
    }
    Ok(vrm.new_addr)
}

/// `dontunmap_complete`: the source VMA stays, empty, and loses
/// VM_LOCKED (`locked_vm` keeps counting it, as the kernel's does); moved
/// whole, it leaves its anon_vmas, so that a fault there starts afresh.
fn dontunmap_complete(tree: &mut VmaTree, vrm: &VmaRemap, new_vma: &Arc<Vma>) {
    let Some(vma) = vrm.vma.as_ref() else { return };
    let whole = vrm.addr == vma.start() && vrm.addr + vrm.old_len == vma.end();
    let unlink = !Arc::ptr_eq(new_vma, vma) && whole;
    vma_set_flags(tree, vma, vma.flags() & !VM_LOCKED_MASK, unlink);
}

/// `unmap_source_vma`: unmap the source range. The pages of an accounted
/// mapping stay charged: the destination has them now.
fn unmap_source_vma(oncpu: &OnCpu, mm: &Arc<Mm>, tree: &mut VmaTree, vrm: &mut VmaRemap) {
    let Some(vma) = vrm.vma.take() else { return };
    if vrm.old_len == 0 {
        // A second mapping of shared memory: nothing to unmap (the
        // kernel's munmap of no length fails, and is ignored).
        return;
    }
    let accountable_move = vma.flags() & VM_ACCOUNT != 0 && vrm.flags & MREMAP_DONTUNMAP == 0;
    if let Ok(unmapped) = do_vmi_munmap(oncpu, mm, tree, vrm.addr, vrm.addr + vrm.old_len) {
        if !accountable_move {
            oncpu.m.overcommit.vm_unacct_memory(unmapped);
        }
    }
}

/// `struct pagetable_move_control`.
struct PagetableMove<'a> {
    old: &'a Arc<Vma>,
    new: &'a Arc<Vma>,
    old_addr: u64,
    new_addr: u64,
    old_end: u64,
    len_in: u64,
}

impl PagetableMove<'_> {
    /// `get_extent` for tables of `size` bytes (a PMD's or a PUD's): to the
    /// next such boundary of either address, or the end.
    fn extent(&self, size: u64) -> u64 {
        let to_boundary = |a: u64| ((a + size) & !(size - 1)).wrapping_sub(a);
        to_boundary(self.old_addr)
            .min(self.old_end - self.old_addr)
            .min(to_boundary(self.new_addr))
    }

    /// `pmc_next`.
    fn advance(&mut self, extent: u64) {
        self.old_addr += extent;
        self.new_addr += extent;
    }

    /// `pmc_progress`: how much of the range asked for has moved.
    fn progress(&self) -> u64 {
        let orig = self.old_end - self.len_in;
        self.old_addr.saturating_sub(orig)
    }
}

/// `move_page_tables`: move what `[old_addr, old_end)` maps to
/// `new_addr` on. Returns how much of the range it moved.
fn move_page_tables(oncpu: &OnCpu, mm: &Arc<Mm>, tree: &VmaTree, pmc: &mut PagetableMove) -> u64 {
    if pmc.len_in == 0 {
        return 0;
    }
    try_realign_addr(tree, pmc);
    const PUD_SIZE: u64 = crate::pgtable::PUD_SIZE;
    let cpu = oncpu.id();
    while pmc.old_addr < pmc.old_end {
        // The PUD level: nothing mapped under this PUD entry, nothing to
        // move (the destination's PUD table is made first, as the
        // kernel's `alloc_new_pud` makes it).
        let Some(old_slot) = mm.pmd_lookup(pmc.old_addr) else {
            pmc.advance(pmc.extent(PUD_SIZE));
            continue;
        };
        if mm.pud_alloc(pmc.new_addr, cpu).is_err() {
            break;
        }
        // A whole PUD entry's worth between PUD-aligned addresses: its
        // PMD table moves with everything under it (x86 has
        // CONFIG_HAVE_MOVE_PUD).
        if pmc.extent(PUD_SIZE) == PUD_SIZE && move_normal_pud(oncpu, mm, pmc) {
            pmc.advance(PUD_SIZE);
            continue;
        }
        let extent = pmc.extent(PMD_SIZE);
        if mm.pmd_get(old_slot).none() {
            pmc.advance(extent);
            continue;
        }
        let Ok(new_slot) = mm.pmd_alloc(pmc.new_addr, cpu) else {
            break;
        };
        if !move_pmd_range(oncpu, mm, pmc, extent, old_slot, new_slot) {
            break;
        }
        pmc.advance(extent);
    }
    pmc.progress()
}

/// One PMD entry's worth of `move_page_tables`: the huge PMD whole if the
/// extent covers it (else split), the PTE table whole if the extent
/// covers its PMD, else its entries. False: out of memory for a table.
fn move_pmd_range(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    pmc: &PagetableMove,
    extent: u64,
    old_slot: PmdSlot,
    new_slot: PmdSlot,
) -> bool {
    loop {
        let pmd = mm.pmd_get(old_slot);
        if crate::huge_memory::pmd_is_huge(pmd) {
            if extent == PMD_SIZE && move_huge_pmd(oncpu, mm, pmc, old_slot, new_slot) {
                return true;
            }
            crate::huge_memory::split_huge_pmd(oncpu, mm, old_slot, pmc.old_addr);
        } else if extent == PMD_SIZE && move_normal_pmd(oncpu, mm, pmc, old_slot, new_slot) {
            return true;
        }
        if mm.pmd_get(old_slot).none() {
            return true;
        }
        if mm
            .pte_alloc(
                new_slot,
                oncpu.id(),
                crate::pt_reclaim::new_pte_tracking(oncpu),
            )
            .is_err()
        {
            return false;
        }
        match move_ptes(oncpu, mm, pmc, extent, old_slot, new_slot) {
            Ok(()) => return true,
            // The old table went meanwhile (PT reclaim): look again.
            Err(()) => continue,
        }
    }
}

/// The rmap locks of the VMA moved from (`take_rmap_locks`): its file's
/// `i_mmap` and its anon_vma's, for writing.
struct RmapLocks<'v> {
    _i_mmap: Option<crate::fs::IMmapWriteGuard<'v>>,
    _anon: Option<crate::mm::interval_tree::AnonVmaWriteGuard>,
}

fn take_rmap_locks(vma: &Vma) -> RmapLocks<'_> {
    let i_mmap = vma.file().map(|f| f.mapping().i_mmap_lock_write());
    let anon = vma.anon_vma().map(|av| av.lock_write());
    RmapLocks {
        _i_mmap: i_mmap,
        _anon: anon,
    }
}

/// `move_huge_pmd`: the huge PMD (or PMD migration entry) moves whole,
/// with the table deposited under it, soft-dirty; the old translation is
/// flushed before the locks go. False if the destination is not empty or
/// the entry is no longer huge.
fn move_huge_pmd(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    pmc: &PagetableMove,
    old_slot: PmdSlot,
    new_slot: PmdSlot,
) -> bool {
    let _rmap = take_rmap_locks(pmc.old);
    let mem = oncpu.mem();
    if !mm.pmd_get(new_slot).none() {
        return false;
    }
    let mut pair = old_slot.lock_pair(new_slot, mem);
    if !crate::huge_memory::pmd_is_huge(pair.old_entry()) {
        return false;
    }
    let pmd = pair.take_old();
    if pmc.old.is_anonymous() {
        pair.move_deposit();
    }
    pair.set_new(move_soft_dirty_pmd(pmd));
    if pmd.present() {
        oncpu.flush_tlb_range(mm, pmc.old_addr, pmc.old_addr + PMD_SIZE, PMD_SHIFT);
    }
    true
}

/// `move_soft_dirty_pmd`.
fn move_soft_dirty_pmd(pmd: Pmd) -> Pmd {
    if pmd.is_migration() {
        pmd.swp_mksoft_dirty()
    } else if pmd.present() {
        pmd.mksoft_dirty()
    } else {
        pmd
    }
}

/// `move_normal_pud`: the PMD table under the old PUD entry moves whole
/// to the destination's entry, which must be empty, the rmap locks held
/// (`should_take_rmap_locks` always takes them for a table move); the old
/// GiB is flushed, paging-structure caches with it.
fn move_normal_pud(oncpu: &OnCpu, mm: &Arc<Mm>, pmc: &PagetableMove) -> bool {
    const PUD_SIZE: u64 = crate::pgtable::PUD_SIZE;
    let _rmap = take_rmap_locks(pmc.old);
    // SAFETY: mremap holds mmap_lock for writing and the moved VMA's write
    // lock; the extent is a whole PUD entry inside it.
    if !unsafe { mm.move_pud_entry(pmc.old_addr, pmc.new_addr) } {
        return false;
    }
    oncpu.flush_tlb_range(mm, pmc.old_addr, pmc.old_addr + PUD_SIZE, PAGE_SHIFT);
    true
}

/// `move_normal_pmd`: the whole PTE table moves to the destination's PMD
/// entry, which must be empty; the old range's translations (and the
/// paging-structure caches that held the table) are flushed.
fn move_normal_pmd(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    pmc: &PagetableMove,
    old_slot: PmdSlot,
    new_slot: PmdSlot,
) -> bool {
    if !mm.pmd_get(new_slot).none() {
        return false;
    }
    let _rmap = take_rmap_locks(pmc.old);
    let mut pair = old_slot.lock_pair(new_slot, oncpu.mem());
    if !pair.move_table() {
        return false;
    }
    oncpu.flush_tlb_range(mm, pmc.old_addr, pmc.old_addr + PMD_SIZE, PAGE_SHIFT);
    true
}

/// The PTE tables of a move: one where source and destination share it.
enum MoveTables<'a, 'b> {
    One(&'b mut PteLocked<'a>),
    Two(&'b mut PteLocked<'a>, &'b mut PteLocked<'a>),
}

impl MoveTables<'_, '_> {
    fn old(&self, i: usize) -> Pte {
        match self {
            MoveTables::One(t) | MoveTables::Two(t, _) => t.pte(i),
        }
    }
    fn new_entry(&self, i: usize) -> Pte {
        match self {
            MoveTables::One(t) | MoveTables::Two(_, t) => t.pte(i),
        }
    }
    fn take_old(&mut self, i: usize) -> Pte {
        match self {
            MoveTables::One(t) | MoveTables::Two(t, _) => t.get_and_clear(i),
        }
    }
    fn set_new(&mut self, i: usize, pte: Pte) {
        match self {
            MoveTables::One(t) | MoveTables::Two(_, t) => t.set(i, pte),
        }
    }
}

/// `move_ptes`: move the entries of `[old_addr, old_addr + extent)`, which
/// lies in one PTE table, to the destination's table, soft-dirty; if any
/// was present, the old range is flushed before the locks go (the old
/// translation must not outlive the lock that lets the folio be freed
/// from the new one). Err: the old table went before it could be locked.
fn move_ptes(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    pmc: &PagetableMove,
    extent: u64,
    old_slot: PmdSlot,
    new_slot: PmdSlot,
) -> Result<(), ()> {
    let _rmap = take_rmap_locks(pmc.old);
    let mut old_pt = mm.pte_offset_map_lock(old_slot).ok_or(())?;
    let mut new_pt;
    let mut tables = if old_slot == new_slot {
        MoveTables::One(&mut old_pt)
    } else {
        new_pt = mm
            .pte_offset_map_lock(new_slot)
            .expect("the destination's PTE table was just made, under mmap_lock");
        MoveTables::Two(&mut old_pt, &mut new_pt)
    };
    crate::tlbbatch::flush_tlb_batched_pending(oncpu, mm);
    let pte_index = |a: u64| ((a >> PAGE_SHIFT) & 511) as usize;
    let (oi, ni) = (pte_index(pmc.old_addr), pte_index(pmc.new_addr));
    let nr = (extent >> PAGE_SHIFT) as usize;
    let mut force_flush = false;
    for k in 0..nr {
        debug_assert!(
            tables.new_entry(ni + k).none(),
            "mremap onto a mapped entry"
        );
        if tables.old(oi + k).none() {
            continue;
        }
        let pte = tables.take_old(oi + k);
        let pte = if pte.present() {
            force_flush = true;
            pte.mksoft_dirty()
        } else if pte.is_swap() {
            pte.swp_mksoft_dirty()
        } else {
            pte
        };
        tables.set_new(ni + k, pte);
    }
    if force_flush {
        oncpu.flush_tlb_range(mm, pmc.old_addr, pmc.old_addr + extent, PAGE_SHIFT);
    }
    Ok(())
}

/// `try_realign_addr` at the PMD level: where both addresses sit at the
/// same offset into their PMDs, the range reaches the next PMD boundary,
/// and nothing is mapped below either start in its PMD, the move starts
/// at the PMD boundary below, so that whole PTE tables move.
fn try_realign_addr(tree: &VmaTree, pmc: &mut PagetableMove) {
    let align = !PMD_MASK;
    let old_align = pmc.old_addr & align;
    let new_align = pmc.new_addr & align;
    if pmc.len_in < PMD_SIZE - old_align || old_align == 0 || old_align != new_align {
        return;
    }
    let can_align_down = |vma: &Vma, addr: u64| {
        vma.start() == addr
            && tree
                .find_vma_intersection(addr & PMD_MASK, vma.start())
                .is_none()
    };
    if !can_align_down(pmc.old, pmc.old_addr) || !can_align_down(pmc.new, pmc.new_addr) {
        return;
    }
    pmc.old_addr &= PMD_MASK;
    pmc.new_addr &= PMD_MASK;
}
