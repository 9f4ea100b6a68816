//! PMD-mapped transparent huge pages (mm/huge_memory.c).
//!
//! A 2 MiB anonymous folio mapped by one PMD entry. As in the kernel, a PTE
//! table is allocated with it and *deposited* under the PMD (and counted in
//! `pgtables_bytes`), so that splitting the PMD later never needs to
//! allocate.
//!
//! A read fault in such a range maps the *huge zero page* the same way,
//! read-only and special (no reference, no RSS). A write to it gets a THP in
//! place (`do_huge_zero_wp_pmd`, v6.12), or, failing that, the PMD is split
//! into 512 entries of the small zero page and the write is retried there.
//!
//! The deposit list hangs off the PMD table's descriptor (`pmd_huge_pte`),
//! kept by the page-table layer ([`PmdLocked::deposit`]).
//!
//! While a PMD-mapped THP migrates, its PMD holds a *PMD migration entry*
//! (`set_pmd_migration_entry`, `remove_migration_pmd`): not present, with
//! the deposited table still under it and the RSS still counted, and no
//! rmap or reference of its own. Every path that meets a huge PMD meets
//! that entry too ([`pmd_is_huge`]): a zap clears it, fork copies it (made
//! readable in both, as a writable PTE migration entry is), mprotect makes
//! a writable one readable, and a split turns it into 512 PTE migration
//! entries, which the migration then resolves one page at a time.

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::memory::{VmFault, VmFaultResult};
use crate::mm::vma::VM_LOCKED;
use crate::mm::{Mm, MmCounter, Vma};
use crate::mmu_gather::MmuGather;
use crate::pgtable::swapops::{Migration, MigrationBits, SwpEntry, SwpKind};
use crate::pgtable::{
    Pmd, PmdLocked, PmdSlot, Ptdesc, Pte, PteLocked, PteRead, PMD_MASK, PMD_SIZE, PTRS_PER_TABLE,
};
use crate::phys::memmap::pg;
use crate::phys::AllocFlags;
use crate::phys::{Folio, Pfn, PhysMem, HPAGE_PMD_NR, HPAGE_PMD_ORDER};
use crate::pt_reclaim::new_pte_tracking;
use crate::rmap::{self, RmapFlags};
use crate::sync::{Arc, Ordering};
use crate::vmstat::{Event, MthpStat};

/// Whether a PMD is a huge leaf or a PMD migration entry: what the
/// kernel's walkers test as `is_swap_pmd(pmd) || pmd_trans_huge(pmd)`
/// before they lock it (`pmd_trans_huge_lock`), split it or handle it
/// whole. The model makes no other swap PMD.
#[inline]
pub fn pmd_is_huge(pmd: Pmd) -> bool {
    pmd.trans_huge() || pmd.is_swap()
}

/// `vma_thp_gfp_mask` with the default `defrag=madvise`: a THP fault in a
/// MADV_HUGEPAGE range may reclaim for its folio; elsewhere it takes one
/// only if it is free (`GFP_TRANSHUGE_LIGHT`), and falls back.
pub fn vma_thp_gfp_mask(vma: &crate::mm::Vma) -> AllocFlags {
    if vma.flags() & crate::mm::vma::VM_HUGEPAGE != 0 {
        AllocFlags::ZERO
    } else {
        AllocFlags::ZERO.transhuge_light()
    }
}

/// `vma_alloc_anon_folio_pmd`: a PMD-sized folio for an anonymous fault,
/// by the VMA's policy; None after counting the fallback (the event and
/// the PMD size's mTHP counter), for both of its callers: the first fault
/// and the write to the huge zero page.
fn vma_alloc_anon_folio_pmd(vmf: &VmFault<'_>) -> Option<Folio> {
    let oncpu = vmf.oncpu;
    let folio = crate::mempolicy::vma_alloc_folio(
        oncpu,
        vmf.mm,
        vmf.vma,
        vmf.address & PMD_MASK,
        HPAGE_PMD_ORDER,
        vma_thp_gfp_mask(vmf.vma),
    );
    if folio.is_none() {
        oncpu
            .vmstat()
            .count(oncpu.id(), Event::THP_FAULT_FALLBACK, 1);
        oncpu
            .mem()
            .vmstat
            .mod_mthp(HPAGE_PMD_ORDER, MthpStat::ANON_FAULT_FALLBACK, 1);
    }
    folio
}

/// `do_huge_pmd_anonymous_page`: a fault on an empty PMD of a THP-eligible
/// range. A read maps the huge zero page; a write allocates a THP.
pub fn do_huge_pmd_anonymous_page(vmf: &mut VmFault<'_>) -> VmFaultResult {
    let (oncpu, mm, vma) = (vmf.oncpu, vmf.mm, vmf.vma);
    let mem = oncpu.mem();
    let haddr = vmf.address & PMD_MASK;
    // vmf_anon_prepare before either branch: a VMA that maps only the huge
    // zero page has an anon_vma too, so fork copies its PMDs
    // (vma_needs_copy) and merges see it.
    if let Err(r) = crate::memory::vmf_anon_prepare(vmf) {
        return r;
    }
    if !vmf.flags.write() && oncpu.m.thp.use_zero_page.load(Ordering::Relaxed) {
        return do_huge_zero_pmd(vmf);
    }
    let Some(folio) = vma_alloc_anon_folio_pmd(vmf) else {
        return VmFaultResult::Fallback;
    };
    let Some(pgtable) = Ptdesc::alloc_pte(mem, oncpu.cpu.node, oncpu.id(), new_pte_tracking(oncpu))
    else {
        folio.put(mem, oncpu.id());
        return VmFaultResult::Oom;
    };
    let mut ptl = mm.pmd_lock(vmf.pmd);
    if !ptl.get().none() {
        drop(ptl);
        pgtable.free(mem, oncpu.id());
        folio.put(mem, oncpu.id());
        return VmFaultResult::Raced;
    }
    rmap::folio_add_new_anon_rmap(mem, folio, vma, haddr, RmapFlags::EXCLUSIVE);
    crate::swap::folio_add_lru_vma(mem, folio, vma, oncpu.id());
    ptl.deposit(pgtable);
    let mut pmd = Pmd::huge(folio.pfn(), vma.page_prot()).mkdirty();
    if vma.flags() & crate::mm::vma::VM_WRITE != 0 {
        pmd = pmd.mkwrite();
    }
    ptl.set(pmd);
    mm.add_rss(MmCounter::AnonPages, HPAGE_PMD_NR as i64);
    mm.inc_nr_tables();
    drop(ptl);
    oncpu.vmstat().count(oncpu.id(), Event::THP_FAULT_ALLOC, 1);
    mem.vmstat
        .mod_mthp(HPAGE_PMD_ORDER, MthpStat::ANON_FAULT_ALLOC, 1);
    VmFaultResult::Done
}

/// The read-fault half of `do_huge_pmd_anonymous_page` (with
/// `use_zero_page` on): map the huge zero page read-only with a deposited
/// table (`set_huge_zero_folio`). No RSS, no reference: the zero folio
/// belongs to no one. With it off, a read fault allocates a THP as a write
/// does.
fn do_huge_zero_pmd(vmf: &mut VmFault<'_>) -> VmFaultResult {
    let (oncpu, mm, vma) = (vmf.oncpu, vmf.mm, vmf.vma);
    let mem = oncpu.mem();
    let Some(pgtable) = Ptdesc::alloc_pte(mem, oncpu.cpu.node, oncpu.id(), new_pte_tracking(oncpu))
    else {
        return VmFaultResult::Oom;
    };
    let Some(zero) = oncpu.m.huge_zero_pfn(oncpu.id()) else {
        pgtable.free(mem, oncpu.id());
        oncpu
            .vmstat()
            .count(oncpu.id(), Event::THP_FAULT_FALLBACK, 1);
        return VmFaultResult::Fallback;
    };
    let mut ptl = mm.pmd_lock(vmf.pmd);
    if !ptl.get().none() {
        drop(ptl);
        pgtable.free(mem, oncpu.id());
        return VmFaultResult::Raced;
    }
    set_huge_zero_pmd(mm, &mut ptl, pgtable, zero, vma.page_prot());
    VmFaultResult::Done
}

/// `set_huge_zero_folio`.
fn set_huge_zero_pmd(
    mm: &Mm,
    ptl: &mut PmdLocked<'_>,
    pgtable: Ptdesc,
    zero: Pfn,
    prot: crate::pgtable::Pgprot,
) {
    ptl.deposit(pgtable);
    ptl.set(Pmd::huge(zero, prot).wrprotect().mkspecial());
    mm.inc_nr_tables();
}

/// `is_huge_zero_pmd`.
#[inline]
pub fn is_huge_zero_pmd(oncpu: &OnCpu, pmd: Pmd) -> bool {
    pmd.trans_huge() && pmd.special() && oncpu.m.is_huge_zero_pfn(pmd.pfn())
}

/// `do_huge_zero_wp_pmd` (v6.12): a write to the huge zero page gets a THP
/// of its own in place, reusing the deposited table; Fallback if none can
/// be had (the caller splits the PMD into zero-page PTEs and retries).
fn do_huge_zero_wp_pmd(vmf: &mut VmFault<'_>) -> VmFaultResult {
    let (oncpu, mm, vma) = (vmf.oncpu, vmf.mm, vmf.vma);
    let mem = oncpu.mem();
    let haddr = vmf.address & PMD_MASK;
    if let Err(r) = crate::memory::vmf_anon_prepare(vmf) {
        return r;
    }
    let Some(folio) = vma_alloc_anon_folio_pmd(vmf) else {
        return VmFaultResult::Fallback;
    };
    let mut ptl = mm.pmd_lock(vmf.pmd);
    if ptl.get() != vmf.orig_pmd {
        drop(ptl);
        folio.put(mem, oncpu.id());
        return VmFaultResult::Raced;
    }
    // pmdp_huge_clear_flush: nobody may keep reading zeros through the old
    // translation once the new folio is written.
    ptl.get_and_clear();
    oncpu.flush_tlb_range(mm, haddr, haddr + PMD_SIZE, crate::pgtable::PMD_SHIFT);
    rmap::folio_add_new_anon_rmap(mem, folio, vma, haddr, RmapFlags::EXCLUSIVE);
    crate::swap::folio_add_lru_vma(mem, folio, vma, oncpu.id());
    let mut new = Pmd::huge(folio.pfn(), vma.page_prot()).mkdirty().mkyoung();
    if vma.flags() & crate::mm::vma::VM_WRITE != 0 {
        new = new.mkwrite();
    }
    ptl.set(new);
    mm.add_rss(MmCounter::AnonPages, HPAGE_PMD_NR as i64);
    drop(ptl);
    oncpu.vmstat().count(oncpu.id(), Event::THP_FAULT_ALLOC, 1);
    mem.vmstat
        .mod_mthp(HPAGE_PMD_ORDER, MthpStat::ANON_FAULT_ALLOC, 1);
    VmFaultResult::Done
}

/// `do_huge_pmd_wp_page`: a write to a read-only huge PMD. Reuse the folio
/// if this mapping is exclusive, else split the PMD and return Fallback,
/// for the PTE-level COW to handle the page (the kernel's fallback).
pub fn do_huge_pmd_wp_page(vmf: &mut VmFault<'_>) -> VmFaultResult {
    let (oncpu, mm, vma) = (vmf.oncpu, vmf.mm, vmf.vma);
    let mem = oncpu.mem();
    if is_huge_zero_pmd(oncpu, vmf.orig_pmd) {
        let r = do_huge_zero_wp_pmd(vmf);
        if r != VmFaultResult::Fallback {
            return r;
        }
        split_huge_pmd(oncpu, mm, vmf.pmd, vmf.address);
        return VmFaultResult::Fallback;
    }
    let mut ptl = mm.pmd_lock(vmf.pmd);
    let pmd = ptl.get();
    if pmd != vmf.orig_pmd {
        return VmFaultResult::Raced;
    }
    let folio = Folio(pmd.pfn());
    let exclusive = crate::phys::folio::page_anon_exclusive(mem, folio.pfn());
    // Not exclusive, but nothing else holds the folio (the process it was
    // shared with by fork has unmapped it, or exited): it is this
    // mapping's again, as do_wp_page reuses a page. The PMD mapping holds
    // the one reference; the kernel also locks the folio, which nothing
    // here could hold against a fault under mmap_lock.
    if !exclusive && folio.ref_count(mem) == 1 {
        rmap::folio_move_anon_rmap(mem, folio, vma);
        crate::phys::folio::set_page_anon_exclusive(mem, folio.pfn());
    }
    if exclusive || folio.ref_count(mem) == 1 {
        // Permission upgrade: no flush needed (x86 re-walks on the fault).
        ptl.set(pmd.mkyoung().mkdirty().mkwrite());
        oncpu.vmstat().count(oncpu.id(), Event::WP_REUSE, 1);
        return VmFaultResult::Done;
    }
    drop(ptl);
    split_huge_pmd(oncpu, mm, vmf.pmd, vmf.address);
    VmFaultResult::Fallback
}

/// `copy_huge_pmd` (fork): share a PMD-mapped THP with the child, both
/// sides read-only. The child gets its own deposited PTE table. Returns
/// false if the source PMD is no longer huge (split meanwhile): the caller
/// copies its PTE table instead. Both mmap_locks held for writing.
pub fn copy_huge_pmd(
    oncpu: &OnCpu,
    dst_mm: &Mm,
    src_mm: &Mm,
    dst_slot: PmdSlot,
    src_slot: PmdSlot,
) -> KResult<bool> {
    let mem = oncpu.mem();
    let pgtable = Ptdesc::alloc_pte(mem, oncpu.cpu.node, oncpu.id(), new_pte_tracking(oncpu))
        .ok_or(Errno::ENOMEM)?;
    // The kernel's order: the child's PMD lock, then the parent's, nested.
    let mut dst_ptl = dst_mm.pmd_lock(dst_slot);
    let mut src_ptl = src_mm.pmd_lock(src_slot);
    let pmd = src_ptl.get();
    if pmd.is_migration() {
        copy_pmd_migration_entry(&mut src_ptl, &mut dst_ptl, dst_mm, pgtable);
        return Ok(true);
    }
    if !pmd.trans_huge() {
        drop((src_ptl, dst_ptl));
        pgtable.free(mem, oncpu.id());
        return Ok(false);
    }
    debug_assert!(dst_ptl.get().none(), "fork into a populated PMD");
    if is_huge_zero_pmd(oncpu, pmd) {
        // The child maps the huge zero page too; the parent's entry is
        // read-only already.
        dst_ptl.deposit(pgtable);
        dst_ptl.set(pmd.mkold());
        dst_mm.inc_nr_tables();
        return Ok(true);
    }
    let folio = Folio(pmd.pfn());
    folio.get(mem);
    rmap::folio_dup_anon_rmap_pmd(mem, folio, dst_mm.id);
    dst_mm.add_rss(MmCounter::AnonPages, HPAGE_PMD_NR as i64);
    dst_mm.inc_nr_tables();
    dst_ptl.deposit(pgtable);
    src_ptl.set_wrprotect();
    dst_ptl.set(pmd.wrprotect().mkold());
    Ok(true)
}

/// The migration-entry half of `copy_huge_pmd`: the child gets the same
/// entry (and its own deposited table, and the RSS), made readable in both
/// first if it was writable, so that the migration maps the page
/// read-only in both and the first write copies it. No reference and no
/// rmap: a migration entry holds neither.
fn copy_pmd_migration_entry(
    src_ptl: &mut PmdLocked<'_>,
    dst_ptl: &mut PmdLocked<'_>,
    dst_mm: &Mm,
    pgtable: Ptdesc,
) {
    let mut pmd = src_ptl.get();
    let entry = pmd.swp_entry();
    if !matches!(
        entry.kind(),
        SwpKind::Migration {
            kind: Migration::Read,
            ..
        }
    ) {
        let mut readable = entry.with_migration_kind(Migration::Read).to_pmd();
        if pmd.swp_soft_dirty() {
            readable = readable.swp_mksoft_dirty();
        }
        src_ptl.set(readable);
        pmd = readable;
    }
    dst_mm.add_rss(MmCounter::AnonPages, HPAGE_PMD_NR as i64);
    dst_mm.inc_nr_tables();
    dst_ptl.deposit(pgtable);
    dst_ptl.set(pmd);
}

/// `zap_huge_pmd`: unmap a whole PMD-mapped folio, or clear a PMD
/// migration entry. Returns false if the PMD is no longer huge (the caller
/// walks its PTE table instead).
pub fn zap_huge_pmd(oncpu: &OnCpu, tlb: &mut MmuGather, mm: &Mm, slot: PmdSlot, addr: u64) -> bool {
    let mem = oncpu.mem();
    let mut ptl = mm.pmd_lock(slot);
    if !pmd_is_huge(ptl.get()) {
        // Split meanwhile: let the caller walk the table.
        return false;
    }
    let pmd = ptl.get_and_clear();
    tlb.remove_pmd_tlb_entry(addr);
    if pmd.present() && !is_huge_zero_pmd(oncpu, pmd) && !Folio(pmd.pfn()).test_anon(mem) {
        // A page-cache folio: no deposited table (x86 deposits none for
        // file PMDs).
        let folio = Folio(pmd.pfn());
        if pmd.young() {
            crate::swap::folio_mark_accessed(mem, folio);
        }
        rmap::folio_remove_rmap_pmd(mem, folio, mm.id, oncpu.id());
        crate::mlock::munlock_vma_folio(mem, folio, tlb.vm_flags, oncpu.id());
        mm.add_rss(
            crate::mm::mm_counter_file(mem, folio),
            -(HPAGE_PMD_NR as i64),
        );
        drop(ptl);
        if tlb.remove_folio_pages(folio.pfn(), 1, false) {
            tlb.flush_mmu(oncpu);
        }
        return true;
    }
    // zap_deposited_table: the deposited table was never reachable by a
    // walker, so it is freed at once (`pte_free`), not after the flush and
    // a grace period as the tables a walker may be reading.
    ptl.withdraw().free(mem, oncpu.id());
    mm.dec_nr_tables();
    if pmd.is_swap() {
        // A migration entry: its folio was unmapped (rmap and reference)
        // when the entry was made; only the RSS remains.
        debug_assert!(pmd.is_migration(), "swap PMD {pmd:?}");
        mm.add_rss(MmCounter::AnonPages, -(HPAGE_PMD_NR as i64));
        return true;
    }
    if is_huge_zero_pmd(oncpu, pmd) {
        // Nothing mapped to count or free.
        return true;
    }
    let folio = Folio(pmd.pfn());
    rmap::folio_remove_rmap_pmd(mem, folio, mm.id, oncpu.id());
    crate::mlock::munlock_vma_folio(mem, folio, tlb.vm_flags, oncpu.id());
    mm.add_rss(MmCounter::AnonPages, -(HPAGE_PMD_NR as i64));
    drop(ptl);
    if tlb.remove_folio_pages(folio.pfn(), 1, false) {
        tlb.flush_mmu(oncpu);
    }
    true
}

/// `madvise_free_huge_pmd`: MADV_FREE of `[addr, next)` under a huge PMD.
/// The huge zero page and a folio that another process may map are left
/// alone (it could not be discarded unless they all freed it); an unshared
/// folio covered in part has its PMD split, for the caller's PTE walk to
/// split the folio and free only those pages; one covered whole is marked
/// lazyfree in place, its PMD made clean and old. Returns true if the PMD
/// is done with (the caller skips the PTE walk).
pub fn madvise_free_huge_pmd(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    mm: &Arc<Mm>,
    slot: PmdSlot,
    addr: u64,
    next: u64,
) -> bool {
    let mem = oncpu.mem();
    let mut ptl = mm.pmd_lock(slot);
    let pmd = ptl.get();
    if !pmd.trans_huge() || is_huge_zero_pmd(oncpu, pmd) {
        return false;
    }
    let folio = Folio(pmd.pfn());
    if rmap::folio_maybe_mapped_shared(mem, folio) {
        return false;
    }
    if next - addr != PMD_SIZE {
        drop(ptl);
        split_huge_pmd(oncpu, mm, slot, addr);
        return false;
    }
    folio.head(mem).clear(pg::DIRTY);
    if pmd.young() || pmd.dirty() {
        let old = ptl.invalidate();
        ptl.set(old.mkold().mkclean());
        tlb.remove_pmd_tlb_entry(addr);
    }
    crate::swap::folio_mark_lazyfree(mem, folio, oncpu.id());
    true
}

/// The huge-PMD half of `madvise_cold_or_pageout_pte_range` for pageout:
/// a THP this process alone maps is split at the PMD, for the PTE half to
/// go on with its folio. When the range covers it in part the kernel
/// splits it here (`split_folio`); when it covers it whole the kernel
/// isolates it, and reclaim (`try_to_unmap_one` with `TTU_SPLIT_HUGE_PMD`)
/// splits the PMD and unmaps the PTEs: a clean lazyfree folio is
/// discarded, a written one kept and swap-backed again, and, with no swap,
/// a swap-backed one split. The huge zero page and a THP another process
/// maps are left alone.
pub fn pageout_huge_pmd(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    slot: PmdSlot,
    addr: u64,
    next: u64,
) -> PmdPageout {
    let mem = oncpu.mem();
    let ptl = mm.pmd_lock(slot);
    let pmd = ptl.get();
    if !pmd.trans_huge() || is_huge_zero_pmd(oncpu, pmd) {
        return PmdPageout::Skip;
    }
    let folio = Folio(pmd.pfn());
    if rmap::folio_maybe_mapped_shared(mem, folio) {
        return PmdPageout::Skip;
    }
    if !folio.test_anon(mem) {
        // Held across the unmap, which drops the PMD's reference, or for
        // the caller's split.
        folio.get(mem);
        drop(ptl);
        if next - addr != PMD_SIZE {
            return PmdPageout::SplitFile(folio);
        }
        pageout_file_pmd(oncpu, mm, slot, addr, folio);
        return PmdPageout::Ptes;
    }
    drop(ptl);
    split_huge_pmd(oncpu, mm, slot, addr);
    PmdPageout::Ptes
}

/// What MADV_PAGEOUT goes on with after [`pageout_huge_pmd`].
pub enum PmdPageout {
    /// The PMD was split (or was never huge): the PTE half walks its table.
    Ptes,
    /// The PMD is left as it is.
    Skip,
    /// A PMD-mapped page-cache folio the range covers in part, held for
    /// the caller: the kernel splits it (`split_folio`, the PMD's lock
    /// dropped), which unmaps it everywhere; its pieces are left to
    /// faults. If it cannot be split (a dirty folio of a disk
    /// filesystem), the PMD stays.
    SplitFile(Folio),
}

/// MADV_PAGEOUT of a PMD-mapped page-cache folio this process alone maps,
/// covered whole, held by the caller: reclaim unmaps it
/// (`TTU_SPLIT_HUGE_PMD` zaps a file PMD), and, if it is clean and
/// nobody else holds it, it leaves the page cache.
fn pageout_file_pmd(oncpu: &OnCpu, mm: &Arc<Mm>, slot: PmdSlot, addr: u64, folio: Folio) {
    let mem = oncpu.mem();
    split_huge_pmd(oncpu, mm, slot, addr);
    if folio.trylock(mem) {
        let dirty = folio.head(mem).test(pg::DIRTY);
        if dirty && !folio.head(mem).test(pg::SWAPBACKED) {
            // PG_reclaim, as for a dirty folio of a PTE range.
            folio.head(mem).set(pg::READAHEAD);
        }
        let removed = !dirty && crate::vmscan::remove_mapping(oncpu, folio, 1);
        folio.unlock(mem);
        if removed {
            folio.put(mem, oncpu.id());
        }
    }
    folio.put(mem, oncpu.id());
}

/// `__split_huge_pmd`: replace a huge PMD by the deposited PTE table filled
/// with 512 entries mapping the same pages with the same bits.
pub fn split_huge_pmd(oncpu: &OnCpu, mm: &Arc<Mm>, slot: PmdSlot, addr: u64) {
    let mem = oncpu.mem();
    let haddr = addr & PMD_MASK;
    let mut ptl = mm.pmd_lock(slot);
    let pmd = ptl.get();
    if pmd.is_migration() {
        split_huge_pmd_migration(oncpu, &mut ptl);
        return;
    }
    if !pmd.trans_huge() {
        return;
    }
    // pmdp_invalidate: make the PMD fault for the MMU, flush, then
    // repopulate (x86 needs the flush so that no CPU holds the 2M
    // translation and a 4K one at once). The entry is never none meanwhile:
    // a zap that reads it without the PMD lock (MADV_DONTNEED runs beside
    // faults under the read mmap_lock) would take none for "nothing mapped
    // here" and skip the 512 pages that the split is about to map again.
    if !is_huge_zero_pmd(oncpu, pmd) && !Folio(pmd.pfn()).test_anon(mem) {
        split_huge_pmd_file(oncpu, mm, &mut ptl, haddr);
        return;
    }
    let old = ptl.invalidate();
    debug_assert_eq!(old.pfn(), pmd.pfn());
    oncpu.flush_tlb_range(mm, haddr, haddr + PMD_SIZE, crate::pgtable::PMD_SHIFT);
    let mut table = ptl.withdraw();
    if is_huge_zero_pmd(oncpu, old) {
        // __split_huge_zero_page_pmd: 512 entries of the small zero page.
        let zero = old.leaf_pte(oncpu.m.zero_pfn);
        for i in 0..HPAGE_PMD_NR as usize {
            table.set_pte(mem, i, zero);
        }
        ptl.populate(table);
        drop(ptl);
        oncpu.vmstat().count(oncpu.id(), Event::THP_SPLIT_PMD, 1);
        return;
    }
    let folio = Folio(old.pfn());
    // A dirty PMD makes the folio dirty (folio_set_dirty), as its PTEs
    // are: the folio's flag is what MADV_FREE and reclaim read.
    if old.dirty() {
        folio.head(mem).set(pg::DIRTY);
    }
    // A NUMA hinting PMD's restriction is not handed on: its PTEs take the
    // VMA's protection (read-only: the hint took the write bit).
    let hint_prot = old.protnone().then(|| {
        let guard = crate::sync::epoch::pin();
        mm.vma_tree(&guard)
            .vma_lookup(haddr)
            .map_or(crate::pgtable::Pgprot::READONLY, |v| v.page_prot())
    });
    for i in 0..HPAGE_PMD_NR {
        let mut pte = old.leaf_pte(folio.pfn() + i);
        if let Some(prot) = hint_prot {
            pte = pte.modify(prot).wrprotect();
        }
        table.set_pte(mem, i as usize, pte);
    }
    // Each PTE holds a reference: the PMD's one plus 511 more.
    folio.ref_add(mem, (HPAGE_PMD_NR - 1) as i32);
    rmap::folio_split_pmd_mapping(mem, folio, mm.id, oncpu.id());
    // The PTE mappings' rmap mlocks a locked VMA's folio, the PMD's going
    // munlocks it: the count is as it was, but each step drains the CPU's
    // mlock batch (a large folio is never left in it).
    let vm_flags = mm
        .vma_tree(&crate::sync::epoch::pin())
        .vma_lookup(haddr)
        .map_or(0, |v| v.flags());
    crate::mlock::mlock_vma_folio(mem, folio, vm_flags, oncpu.id());
    crate::mlock::munlock_vma_folio(mem, folio, vm_flags, oncpu.id());
    ptl.populate(table);
    drop(ptl);
    oncpu.vmstat().count(oncpu.id(), Event::THP_SPLIT_PMD, 1);
}

/// The file half of `__split_huge_pmd_locked`: a page-cache folio's PMD
/// is not split into PTEs but zapped (`pmdp_huge_clear_flush`); faults
/// map it again, by PTEs or a PMD. Its dirty and accessed bits go to the
/// folio.
fn split_huge_pmd_file(oncpu: &OnCpu, mm: &Arc<Mm>, ptl: &mut PmdLocked<'_>, haddr: u64) {
    let mem = oncpu.mem();
    oncpu.vmstat().count(oncpu.id(), Event::THP_SPLIT_PMD, 1);
    let old = ptl.get_and_clear();
    oncpu.flush_tlb_range(mm, haddr, haddr + PMD_SIZE, crate::pgtable::PMD_SHIFT);
    let folio = Folio(old.pfn());
    if old.dirty() {
        crate::filemap::folio_mark_dirty(mem, folio);
    }
    if old.young() {
        folio.head(mem).set(pg::REFERENCED);
    }
    rmap::folio_remove_rmap_pmd(mem, folio, mm.id, oncpu.id());
    // The VMA the PMD lies in (callers hold its lock, or mmap_lock).
    let vm_flags = mm
        .vma_tree(&crate::sync::epoch::pin())
        .vma_lookup(haddr)
        .map_or(0, |v| v.flags());
    crate::mlock::munlock_vma_folio(mem, folio, vm_flags, oncpu.id());
    // The counter is read before the mapping's reference goes: with its
    // rmap gone, a truncation racing this split may already have taken the
    // folio out of the page cache, and then this put frees it, and a freed
    // folio is not SWAPBACKED any more (shmem's pages would come off
    // RssFile). The kernel reads it after `folio_put`, the window too
    // short to matter there.
    let counter = crate::mm::mm_counter_file(mem, folio);
    folio.put(mem, oncpu.id());
    mm.add_rss(counter, -(HPAGE_PMD_NR as i64));
}

/// `do_set_pmd`: map a PMD-sized page-cache folio by the fault's empty
/// PMD, if the VMA may (no `MADV_NOHUGEPAGE`; the THP knobs do not
/// matter: the folio is there already) and the folio's offset agrees
/// with the address modulo PMD_SIZE. Consumes the caller's reference.
/// Fallback: map by PTEs instead. (The kernel also takes the faulting
/// page, for its rmap call; a PMD maps the folio from its head.)
pub fn do_set_pmd(vmf: &mut VmFault<'_>, folio: Folio) -> VmFaultResult {
    let (oncpu, mm, vma) = (vmf.oncpu, vmf.mm, vmf.vma);
    let mem = oncpu.mem();
    let haddr = vmf.address & PMD_MASK;
    if vma.flags() & crate::mm::vma::VM_NOHUGEPAGE != 0 {
        return VmFaultResult::Fallback;
    }
    if !crate::memory::thp_vma_suitable_order(vma, haddr, HPAGE_PMD_ORDER)
        || folio.order(mem) != HPAGE_PMD_ORDER
    {
        return VmFaultResult::Fallback;
    }
    // The folio's first page must be the one mapped at haddr.
    if vma.address_of(mem.page(folio.pfn()).index.load(Ordering::Relaxed)) != Some(haddr) {
        return VmFaultResult::Fallback;
    }
    let mut ptl = mm.pmd_lock(vmf.pmd);
    if !ptl.get().none() {
        return VmFaultResult::Raced;
    }
    let mut pmd = Pmd::huge(folio.pfn(), vma.page_prot());
    if vmf.flags.write() {
        pmd = pmd.mkdirty();
        if vma.flags() & crate::mm::vma::VM_WRITE != 0 {
            pmd = pmd.mkwrite();
        }
    }
    mm.add_rss(crate::mm::mm_counter_file(mem, folio), HPAGE_PMD_NR as i64);
    rmap::folio_add_file_rmap_pmd(mem, folio, mm.id);
    crate::mlock::mlock_vma_folio(mem, folio, vma.flags(), oncpu.id());
    ptl.set(pmd);
    drop(ptl);
    oncpu.vmstat().count(oncpu.id(), Event::THP_FILE_MAPPED, 1);
    VmFaultResult::Done
}

/// What [`filemap_map_pmd`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapPmd {
    /// The PMD maps a folio now (this one, or another a racing fault
    /// mapped): the fault is done.
    Mapped,
    /// Map by PTEs: the PMD holds a PTE table if it can.
    Ptes,
}

/// `filemap_map_pmd`: fault-around's first folio over an empty PMD: a
/// PMD-sized one is mapped by the PMD (with a reference of its own);
/// otherwise the PMD gets its PTE table (`pmd_install` of the table
/// `do_fault_around` preallocated).
pub fn filemap_map_pmd(vmf: &mut VmFault<'_>, folio: Folio) -> MapPmd {
    let (oncpu, mm) = (vmf.oncpu, vmf.mm);
    let mem = oncpu.mem();
    let pmd = mm.pmd_get(vmf.pmd);
    if pmd.trans_huge() {
        return MapPmd::Mapped;
    }
    if pmd.none() && folio.order(mem) == HPAGE_PMD_ORDER {
        folio.get(mem);
        if do_set_pmd(vmf, folio) == VmFaultResult::Done {
            return MapPmd::Mapped;
        }
        folio.put(mem, oncpu.id());
    }
    if mm.pmd_get(vmf.pmd).none() {
        // A failed allocation leaves the PMD empty: nothing is mapped.
        let _ = mm.pte_alloc(vmf.pmd, oncpu.id(), new_pte_tracking(oncpu));
    }
    MapPmd::Ptes
}

/// The migration-entry half of `__split_huge_pmd_locked`: the deposited
/// table gets 512 PTE migration entries with the PMD entry's kind, young
/// and dirty bits and soft-dirty. Nothing was present: no flush, and no
/// rmap or reference changes hands.
fn split_huge_pmd_migration(oncpu: &OnCpu, ptl: &mut PmdLocked<'_>) {
    let mem = oncpu.mem();
    let old = ptl.get();
    let SwpKind::Migration {
        kind,
        pfn,
        young,
        dirty,
    } = old.swp_entry().kind()
    else {
        unreachable!("a PMD migration entry");
    };
    let mut table = ptl.withdraw();
    for i in 0..HPAGE_PMD_NR {
        let mut entry = SwpEntry::migration(kind, pfn + i);
        if young {
            entry = entry.mkyoung();
        }
        if dirty {
            entry = entry.mkdirty();
        }
        let mut pte = entry.to_pte();
        if old.swp_soft_dirty() {
            pte = pte.swp_mksoft_dirty();
        }
        table.set_pte(mem, i as usize, pte);
    }
    ptl.populate(table);
    oncpu.vmstat().count(oncpu.id(), Event::THP_SPLIT_PMD, 1);
}

/// `set_pmd_migration_entry`: replace the huge PMD at `slot` (at `addr`),
/// which maps `folio`, by a PMD migration entry that keeps its write,
/// young and dirty bits, soft-dirty and the head page's exclusivity; the
/// mapping's rmap and reference go. The PMD is invalidated and flushed at
/// once (`pmdp_invalidate`): a PMD's flush is never deferred to the
/// migration's batch. False if the PMD no longer maps the folio.
pub fn set_pmd_migration_entry(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    vma: &Vma,
    slot: PmdSlot,
    addr: u64,
    folio: Folio,
) -> bool {
    let mem = oncpu.mem();
    let haddr = addr & PMD_MASK;
    let mut ptl = mm.pmd_lock(slot);
    let pmd = ptl.get();
    if !pmd.trans_huge() || is_huge_zero_pmd(oncpu, pmd) || pmd.pfn() != folio.pfn() {
        return false;
    }
    mm.update_hiwater_rss();
    let pmdval = ptl.invalidate();
    oncpu.flush_tlb_range(mm, haddr, haddr + PMD_SIZE, crate::pgtable::PMD_SHIFT);
    if pmdval.dirty() {
        folio.head(mem).set(pg::DIRTY);
    }
    let bits = MigrationBits {
        write: pmdval.write(),
        exclusive: rmap::folio_try_share_anon_rmap(mem, folio.pfn()),
        young: pmdval.young(),
        dirty: pmdval.dirty(),
    };
    let ad = oncpu.m.tunables.migration_entry_ad();
    let mut swp = SwpEntry::make_migration_entry(folio.pfn(), bits, ad).to_pmd();
    if pmdval.soft_dirty() {
        swp = swp.swp_mksoft_dirty();
    }
    ptl.set(swp);
    rmap::folio_remove_rmap_pmd(mem, folio, mm.id, oncpu.id());
    crate::mlock::munlock_vma_folio(mem, folio, vma.flags(), oncpu.id());
    drop(ptl);
    // The mapping's reference; the isolation's keeps the folio.
    folio.put(mem, oncpu.id());
    true
}

/// `remove_migration_pmd`: where a PMD migration entry of `old` (a head
/// PFN) stands at `slot`, map `new` (the destination, or the source when
/// a migration is undone) by a huge PMD with the entry's write, young and
/// dirty bits and exclusivity. No flush: the entry was not present.
pub fn remove_migration_pmd(
    oncpu: &OnCpu,
    mm: &Mm,
    slot: PmdSlot,
    vma: &Vma,
    old: Pfn,
    new: Folio,
) -> bool {
    let mem = oncpu.mem();
    let mut ptl = mm.pmd_lock(slot);
    let orig = ptl.get();
    if !orig.is_migration() {
        return false;
    }
    let SwpKind::Migration {
        kind,
        pfn,
        young,
        dirty,
    } = orig.swp_entry().kind()
    else {
        unreachable!("a PMD migration entry");
    };
    if pfn != old {
        return false;
    }
    new.get(mem);
    let mut pmde = Pmd::huge(new.pfn(), vma.page_prot());
    if orig.swp_soft_dirty() {
        pmde = pmde.mksoft_dirty();
    }
    if kind == Migration::Write {
        pmde = pmde.mkwrite();
    }
    if !young {
        pmde = pmde.mkold();
    }
    if dirty && new.head(mem).test(pg::DIRTY) {
        pmde = pmde.mkdirty();
    }
    let flags = if kind == Migration::Read {
        RmapFlags::NONE
    } else {
        RmapFlags::EXCLUSIVE
    };
    rmap::folio_add_anon_rmap_pmd(mem, new, vma.mm_id, flags);
    crate::mlock::mlock_vma_folio(mem, new, vma.flags(), oncpu.id());
    ptl.set(pmde);
    true
}

/// `do_huge_pmd_numa_page`: a fault on a NUMA hinting PMD. Count it; a
/// hot THP on a slow tier is promoted whole to this CPU's node (through a
/// PMD migration entry, whose removal maps it again); otherwise the PMD is
/// restored where it is.
pub fn do_huge_pmd_numa_page(vmf: &mut VmFault<'_>) -> VmFaultResult {
    use crate::numa_balancing::{numa_migrate_check, numa_restore_pmd, task_numa_fault};
    use crate::numa_balancing::{NumaHint, TaskNumaFault};
    let (oncpu, mm) = (vmf.oncpu, vmf.mm);
    let mem = oncpu.mem();
    let mut ptl = mm.pmd_lock(vmf.pmd);
    let old = ptl.get();
    if old != vmf.orig_pmd {
        return VmFaultResult::Raced;
    }
    let folio = Folio(old.pfn());
    // vm_normal_folio_pmd: the huge zero page is only restored, and its
    // fault not recorded.
    let zero = is_huge_zero_pmd(oncpu, old);
    let mut fault = TaskNumaFault::new(oncpu, folio);
    let hint = if zero {
        NumaHint::Stay
    } else {
        numa_migrate_check(oncpu, mm, vmf.vma, folio)
    };
    match hint {
        NumaHint::Migrate(dst) => {
            // migrate_misplaced_folio_prepare: isolated under the PMD lock.
            if let Some(iso) = crate::migrate::isolate_for_migration(mem, folio) {
                drop(ptl);
                if crate::migrate::migrate_misplaced_folio(oncpu, iso, dst) {
                    task_numa_fault(oncpu, mm, TaskNumaFault { nid: dst, ..fault });
                    return VmFaultResult::Done;
                }
                // Not migrated: restore the PMD, if it is still ours (if
                // not, the fault is not recorded either).
                ptl = mm.pmd_lock(vmf.pmd);
                if ptl.get() != old {
                    return VmFaultResult::Raced;
                }
            }
            fault.migrate_fail = true;
        }
        NumaHint::Refused => fault.migrate_fail = true,
        NumaHint::Stay => {}
    }
    let cur = ptl.invalidate();
    ptl.set(numa_restore_pmd(oncpu, vmf.vma, cur));
    drop(ptl);
    if !zero {
        task_numa_fault(oncpu, mm, fault);
    }
    VmFaultResult::Done
}

/// `change_non_present_huge_pmd`, mprotect's and the NUMA scan's alike: a
/// writable PMD migration entry becomes readable-exclusive (every folio of
/// the model is anon), as a PTE one does. No flush: the MMU never cached it.
pub fn change_non_present_huge_pmd(ptl: &mut PmdLocked<'_>) {
    let pmd = ptl.get();
    let entry = pmd.swp_entry();
    if let SwpKind::Migration {
        kind: Migration::Write,
        ..
    } = entry.kind()
    {
        let mut readable = entry.with_migration_kind(Migration::ReadExclusive).to_pmd();
        if pmd.swp_soft_dirty() {
            readable = readable.swp_mksoft_dirty();
        }
        ptl.set(readable);
    }
}

/// `change_huge_pmd`: apply a new protection to a whole huge PMD. Returns
/// None if the PMD is no longer huge (split meanwhile: the caller goes on
/// at the PTE level), else whether it needs a TLB flush
/// (`huge_pmd_needs_flush`). A writable PMD
/// migration entry becomes readable (readable-exclusive: every folio of
/// the model is anon), as a PTE one does.
pub fn change_huge_pmd(
    oncpu: &OnCpu,
    mm: &Mm,
    slot: PmdSlot,
    vma: &Vma,
    newprot: crate::pgtable::Pgprot,
) -> Option<bool> {
    let mem = oncpu.mem();
    let mut ptl = mm.pmd_lock(slot);
    let pmd = ptl.get();
    if pmd.is_migration() {
        change_non_present_huge_pmd(&mut ptl);
        return Some(false);
    }
    if !pmd.trans_huge() {
        return None;
    }
    // pmdp_invalidate_ad: the entry is changed from what it held when the
    // MMU could no longer set its accessed or dirty bit.
    let old = ptl.invalidate();
    let mut new = old.modify(newprot);
    // can_change_pmd_writable: an exclusive anon folio of a private
    // mapping (the model has no shared anon mappings).
    if vma.flags() & crate::mm::vma::VM_WRITE != 0
        && !new.protnone()
        && crate::phys::folio::page_anon_exclusive(mem, old.pfn())
    {
        new = new.mkwrite();
    }
    ptl.set(new);
    Some(crate::pgtable::entry::huge_pmd_needs_flush(old, new))
}

/// Where a PTE-mapped folio was found: the index of a PTE of `table` and
/// the page it maps.
#[derive(Clone, Copy, Debug)]
pub struct FolioPte {
    pub idx: usize,
    pub page: Pfn,
}

/// How many PTEs of `table` map pages of `folio`. Only the entries where
/// its pages sit at their linear positions are looked at (the folio's span
/// around `at`): anon pages are never mapped elsewhere in one mm, so a
/// mapping found nowhere else belongs to another table or process.
pub fn folio_ptes_in_table(mem: &PhysMem, folio: Folio, pt: &impl PteRead, at: FolioPte) -> i32 {
    let first = at.idx as i64 - (at.page - folio.pfn()) as i64;
    let lo = first.max(0) as usize;
    let hi = (first + folio.nr_pages(mem) as i64).min(PTRS_PER_TABLE as i64) as usize;
    (lo..hi)
        .map(|i| pt.pte(i))
        .filter(|p| p.present() && !p.special() && mem.page_folio(p.pfn()) == folio)
        .count() as i32
}

/// Where a folio being split is mapped: the mm (whose mmap_lock the caller
/// holds) and the PTE table, locked, with the address of the table's first
/// entry.
pub struct SplitAt<'a, 'p> {
    pub mm: &'a Arc<Mm>,
    pub pt: &'a mut PteLocked<'p>,
    pub table_addr: u64,
}

/// `split_folio` (`split_huge_page_to_list_to_order` to order 0) of an anon
/// folio mapped only by PTEs of one table, whose lock the caller holds. Every page becomes a folio of its own, keeping its mapping, its
/// PageAnonExclusive and its index; pages no PTE maps are freed, and pages
/// that hold only zeroes are mapped to the shared zero page instead and
/// freed too (`remap_page` with `RMP_USE_SHARED_ZEROPAGE`, v6.12).
///
/// The kernel unmaps the folio through the rmap (migration entries in every
/// mm), splits and remaps. The model splits in place, which is the same
/// once no one else can reach the folio: so it refuses (EAGAIN) unless
/// every reference is a mapping in this table, as `can_split_folio` refuses
/// when there are extra references.
pub fn split_folio_in_table(
    oncpu: &OnCpu,
    folio: Folio,
    where_: &mut SplitAt<'_, '_>,
    at: FolioPte,
) -> KResult<()> {
    let mem = oncpu.mem();
    let order = folio.order(mem);
    debug_assert!(order > 0);
    let nr = folio.nr_pages(mem);
    let in_table = folio_ptes_in_table(mem, folio, &*where_.pt, at);
    if folio.entire_mapcount(mem) != 0
        || folio.mapcount(mem) != in_table
        || folio.ref_count(mem) != in_table
    {
        mem.vmstat.mod_mthp(order, MthpStat::SPLIT_FAILED, 1);
        if order == HPAGE_PMD_ORDER {
            oncpu
                .vmstat()
                .count(oncpu.id(), Event::THP_SPLIT_PAGE_FAILED, 1);
        }
        return Err(Errno::EAGAIN);
    }
    // The pages a locked VMA maps: the kernel's unmap munlocks the large
    // folio there (draining the CPU's mlock batch, as for any large
    // folio), its remap mlocks each small folio (`remove_migration_pte`).
    let first = at.idx as i64 - (at.page - folio.pfn()) as i64;
    let locked = locked_ptes_of(oncpu, folio, where_, first);
    if !locked.is_empty() {
        crate::mlock::mlock_drain_local(mem, oncpu.id());
    }
    let unmapped = split_folio_pages(oncpu, folio);
    for &pfn in &locked {
        crate::mlock::mlock_vma_folio(mem, Folio(pfn), VM_LOCKED, oncpu.id());
    }
    if !locked.is_empty() {
        crate::mlock::mlock_drain_local(mem, oncpu.id());
    }
    // Pages no PTE maps go (`folio_put` of each: off the LRU, freed).
    for pfn in unmapped {
        mem.page(pfn).mapping.store(0, Ordering::Relaxed);
        mem.page(pfn).refcount.store(1, Ordering::Relaxed);
        Folio(pfn).put(mem, oncpu.id());
    }
    remap_zero_pages_to_zeropage(oncpu, where_, folio.pfn(), nr, first);
    Ok(())
}

/// The pages of `folio` that `where_`'s table maps in a `VM_LOCKED` VMA
/// (`first`: the table index of its first page, which may lie outside).
fn locked_ptes_of(oncpu: &OnCpu, folio: Folio, where_: &SplitAt<'_, '_>, first: i64) -> Vec<Pfn> {
    let mem = oncpu.mem();
    let guard = crate::sync::epoch::pin();
    let tree = where_.mm.vma_tree(&guard);
    (0..folio.nr_pages(mem))
        .filter_map(|i| {
            let idx = usize::try_from(first + i as i64)
                .ok()
                .filter(|&x| x < PTRS_PER_TABLE)?;
            let pte = where_.pt.pte(idx);
            let mapped = pte.present() && !pte.special() && pte.pfn() == folio.pfn() + i;
            let addr = where_.table_addr + (idx as u64) * crate::phys::PAGE_SIZE;
            let locked = tree
                .vma_lookup(addr)
                .is_some_and(|v| v.flags() & VM_LOCKED != 0);
            (mapped && locked).then_some(folio.pfn() + i)
        })
        .collect()
}

/// `__split_folio_to_order` to order 0: every page of `folio` becomes a
/// folio of its own, keeping the flags a folio passes on, its
/// PageAnonExclusive, the anon mapping and its index, with one reference
/// per mapping it has; the pieces take the folio's place on its LRU list.
/// Returns the pages no mapping holds (no reference either: the caller
/// frees or keeps them). Counts the split (`thp_split_page`, mTHP
/// `split`).
pub fn split_folio_pages(oncpu: &OnCpu, folio: Folio) -> Vec<Pfn> {
    let mem = oncpu.mem();
    let order = folio.order(mem);
    if folio.head(mem).test(pg::PARTIALLY_MAPPED) {
        mem.vmstat
            .mod_mthp(order, MthpStat::NR_ANON_PARTIALLY_MAPPED, -1);
    }
    mem.vmstat.mod_mthp(order, MthpStat::NR_ANON, -1);
    // One reference per mapping: each page is mapped at most once here.
    __split_folio(oncpu, folio, |_, maps| maps)
}

/// The split of a locked, unmapped page-cache folio (`__folio_split` of a
/// file folio): every page becomes a small folio in the cache at its own
/// index, each with the cache's reference, the first also with the
/// caller's `held` ones; dirty and on the folio's LRU list as the folio
/// was. The caller holds the folio's lock, and keeps the first piece's.
/// No one else may hold a reference: the references are frozen at the
/// cache's and `held` under the index's lock, so that no lookup takes
/// one while the pieces get theirs (`folio_ref_freeze` under the
/// xarray's lock). False: someone else held one; nothing changed.
pub fn split_page_cache_folio(
    oncpu: &OnCpu,
    mapping: &crate::fs::AddressSpace,
    folio: Folio,
    index: u64,
    held: i32,
) -> bool {
    let mem = oncpu.mem();
    let nr = folio.nr_pages(mem);
    debug_assert!(!folio.mapped(mem), "splitting a mapped page-cache folio");
    let order = folio.order(mem);
    let split = mapping.split_entry_frozen(mem, folio, index, nr as i32 + held, || {
        __split_folio(oncpu, folio, |i, _| 1 + if i == 0 { held } else { 0 });
    });
    if !split {
        return false;
    }
    if order == HPAGE_PMD_ORDER {
        mem.mod_node_state(mapping.thps_stat(), -(nr as i64));
    }
    // The pieces after the first are the splitter's to unlock.
    for i in 1..nr {
        Folio(folio.pfn() + i).unlock(mem);
    }
    true
}

/// `__split_folio_to_order(0)`: the pages of `folio` become small folios
/// with its flags that survive a split, its mapping and consecutive
/// indices, on its LRU list after it; `refs(i, mapcount)` gives page i's
/// references. Returns the pages no entry maps.
fn __split_folio(oncpu: &OnCpu, folio: Folio, refs: impl Fn(usize, i32) -> i32) -> Vec<Pfn> {
    let mem = oncpu.mem();
    let order = folio.order(mem);
    let nr = folio.nr_pages(mem);
    let head = folio.head(mem);
    // The split pages stay on the folio's LRU list, each just after the
    // one before (`lru_add_split_folio`), under the lruvec lock that
    // `__split_huge_page` holds; the list's size does not change.
    let mut lruvec = head.test(pg::LRU).then(|| mem.folio_lruvec_lock(folio));
    let flags = head.flags.load(Ordering::Relaxed);
    // A locked folio's pieces are all locked (the splitter unlocks each).
    let keep = flags
        & (pg::SWAPBACKED
            | pg::LAZYFREE
            | pg::DIRTY
            | pg::LRU
            | pg::ACTIVE
            | pg::REFERENCED
            | pg::MLOCKED
            | pg::UNEVICTABLE
            | pg::LOCKED);
    let mapping = head.mapping.load(Ordering::Relaxed);
    let index = head.index.load(Ordering::Relaxed);
    // page[1]'s folio counters go back to free-list state.
    let p1 = mem.page(folio.pfn() + 1);
    p1.lru_next
        .store(crate::phys::memmap::LIST_NONE, Ordering::Relaxed);
    p1.lru_prev
        .store(crate::phys::memmap::LIST_NONE, Ordering::Relaxed);
    p1.private.store(0, Ordering::Relaxed);
    let mut unmapped = vec![];
    for (i, p) in mem.pages(folio.pfn(), nr).iter().enumerate() {
        let exclusive = p.test(pg::ANON_EXCLUSIVE);
        p.flags.store(
            keep | if exclusive { pg::ANON_EXCLUSIVE } else { 0 },
            Ordering::Relaxed,
        );
        p.compound_head.store(0, Ordering::Relaxed);
        p.mapping.store(mapping, Ordering::Relaxed);
        p.index.store(index + i as u64, Ordering::Relaxed);
        let maps = p.mapcount.load(Ordering::Relaxed) + 1;
        p.refcount.store(refs(i, maps), Ordering::Relaxed);
        if maps == 0 {
            unmapped.push(folio.pfn() + i as u64);
        }
        if let (Some(l), true) = (lruvec.as_mut(), i > 0) {
            l.add_folio_before(folio, Folio(folio.pfn() + i as u64));
        }
    }
    drop(lruvec);
    mem.vmstat.mod_mthp(order, MthpStat::SPLIT, 1);
    if order == HPAGE_PMD_ORDER {
        oncpu.vmstat().count(oncpu.id(), Event::THP_SPLIT_PAGE, 1);
    }
    unmapped
}

/// After a split, map the pages that hold only zeroes to the shared zero
/// page and free them (`try_to_map_unused_to_zeropage`). The kernel looks
/// at the pages while migration entries stand in for their PTEs; here the
/// PTEs are cleared and the TLBs flushed first, so that no store can land
/// while a page is read, and the others are put back as they were.
fn remap_zero_pages_to_zeropage(
    oncpu: &OnCpu,
    at: &mut SplitAt<'_, '_>,
    pfn: Pfn,
    nr: u64,
    first_idx: i64,
) {
    let mem = oncpu.mem();
    let idx_of = |i: u64| first_idx + i as i64;
    let in_table = |i: u64| (0..PTRS_PER_TABLE as i64).contains(&idx_of(i));
    let mut cleared = Vec::new();
    for i in (0..nr).filter(|&i| in_table(i)) {
        let idx = idx_of(i) as usize;
        let pte = at.pt.pte(idx);
        if pte.present() && !pte.special() && pte.pfn() == pfn + i {
            let old = at.pt.get_and_clear(idx);
            cleared.push((idx, pfn + i, old));
        }
    }
    let (Some(lo), Some(hi)) = (cleared.first(), cleared.last()) else {
        return;
    };
    use crate::phys::{PAGE_SHIFT, PAGE_SIZE};
    let addr = |idx: usize| at.table_addr + idx as u64 * PAGE_SIZE;
    oncpu.flush_tlb_range(at.mm, addr(lo.0), addr(hi.0) + PAGE_SIZE, PAGE_SHIFT);
    // The folio may straddle VMAs (an mprotect split it): each page's zero
    // PTE takes its own VMA's protection, as each rmap walk step uses its
    // VMA's vm_page_prot.
    let guard = crate::sync::epoch::pin();
    let tree = at.mm.vma_tree(&guard);
    let mut remapped = 0;
    for (idx, page, old) in cleared {
        let vma = tree.vma_lookup(addr(idx));
        // Not in a locked VMA, nor a page of an mlocked folio: those stay.
        let vma = vma.filter(|v| v.flags() & VM_LOCKED == 0);
        let mlocked = mem.page(page).test(pg::MLOCKED);
        let (Some(vma), true) = (vma, !mlocked && mem.page_is_zero(page)) else {
            at.pt.set(idx, old);
            continue;
        };
        let zero = Pte::new(oncpu.m.zero_pfn, vma.page_prot()).mkspecial();
        at.pt.set(idx, zero);
        let f = Folio(page);
        rmap::folio_remove_rmap_ptes(mem, f, page, 1, at.mm.id, oncpu.id());
        f.put(mem, oncpu.id());
        remapped += 1;
    }
    at.mm.add_rss(MmCounter::AnonPages, -remapped);
}
