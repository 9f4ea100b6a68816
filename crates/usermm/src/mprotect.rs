//! mprotect (mm/mprotect.c): change VMA protections and the PTEs under them.
//!
//! Reducing permissions needs a TLB flush before mprotect returns; the PTEs
//! whose change needs one are gathered in an mmu_gather, as
//! `change_protection` does since v6.x. Making a private page writable
//! directly (without a write fault) is allowed only for an exclusive
//! anonymous page (`can_change_pte_writable`).

use std::ops::ControlFlow;

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::mm::vma::*;
use crate::mm::{Mm, Vma};
use crate::mmap::{calc_vm_prot_bits, vma_modify_flags, PROT_EXEC, PROT_READ, PROT_WRITE};
use crate::mmu_gather::MmuGather;
use crate::pgtable::entry::pte_needs_flush;
use crate::pgtable::pagewalk::{walk_page_range, MmWalkOps, WalkAction, WalkLock};
use crate::pgtable::swapops::{Migration, SwpKind};
use crate::pgtable::{self, Pgprot, Pmd, PmdSlot, Pte, PteLocked, PteRead, PMD_SIZE};
use crate::phys::{folio, PAGE_MASK, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::{Arc, Ordering};

pub const PROT_SEM: u32 = 0x8;
pub const PROT_GROWSDOWN: u32 = 0x0100_0000;
pub const PROT_GROWSUP: u32 = 0x0200_0000;

/// `mprotect(2)`.
pub fn do_mprotect(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, len: u64, prot: u32) -> KResult<()> {
    let grows = prot & (PROT_GROWSDOWN | PROT_GROWSUP);
    if grows == (PROT_GROWSDOWN | PROT_GROWSUP) {
        return Err(Errno::EINVAL);
    }
    let prot = prot & !(PROT_GROWSDOWN | PROT_GROWSUP);
    if start & !PAGE_MASK != 0 {
        return Err(Errno::EINVAL);
    }
    if len == 0 {
        return Ok(());
    }
    let len = len
        .checked_add(PAGE_SIZE - 1)
        .map(|l| l & PAGE_MASK)
        .ok_or(Errno::ENOMEM)?;
    let end = start.checked_add(len).ok_or(Errno::ENOMEM)?;
    if prot & !(PROT_READ | PROT_WRITE | PROT_EXEC | PROT_SEM) != 0 {
        return Err(Errno::EINVAL);
    }
    let _g = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_draft();
    let first = tree.find_vma(start).cloned();
    let mut populate = Vec::new();
    let result = match first {
        Some(v) if v.start() <= start => {
            mprotect_walk(oncpu, mm, &mut tree, (start, end), prot, &mut populate)
        }
        _ => Err(Errno::ENOMEM),
    };
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    // A private locked VMA made writable has its COW broken at once, to
    // spare a fault later (`populate_vma_page_range`, errors ignored); done
    // once its new flags are published, mmap_lock still held.
    let guard = crate::sync::epoch::pin();
    for (s, e) in populate {
        if let Some(vma) = mm.vma_tree(&guard).vma_lookup(s).cloned() {
            let _ = crate::gup::populate_vma_page_range(oncpu, mm, &vma, s, e);
        }
    }
    result
}

fn mprotect_walk(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut crate::mm::VmaTree,
    (start, end): (u64, u64),
    prot: u32,
    populate: &mut Vec<(u64, u64)>,
) -> KResult<()> {
    let mut addr = start;
    while addr < end {
        let Some(vma) = tree.vma_lookup(addr).cloned() else {
            return Err(Errno::ENOMEM);
        };
        let tmp = vma.end().min(end);
        let newflags = (vma.flags() & !VM_ACCESS_FLAGS) | calc_vm_prot_bits(prot);
        if newflags != vma.flags() {
            let oldflags = vma.flags();
            mprotect_fixup(oncpu, mm, tree, &vma, addr, tmp, newflags)?;
            if oldflags & (VM_WRITE | VM_SHARED | VM_LOCKED) == VM_LOCKED
                && newflags & VM_WRITE != 0
            {
                populate.push((addr, tmp));
            }
        }
        addr = tmp;
    }
    Ok(())
}

/// `mprotect_fixup`: charge or uncharge the commitment, merge or split
/// with the new flags set, change the PTEs.
fn mprotect_fixup(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    tree: &mut crate::mm::VmaTree,
    vma: &Arc<Vma>,
    start: u64,
    end: u64,
    newflags: VmFlags,
) -> KResult<()> {
    let oc = &oncpu.m.overcommit;
    let nrpages = (end - start) >> PAGE_SHIFT;
    let oldflags = vma.flags();
    let mut newflags = newflags;
    let mut charged = 0;
    if newflags & VM_WRITE != 0 {
        // A private mapping made writable for the first time is charged
        // (VM_ACCOUNT), as if it had been mapped writable: which also lets
        // it merge with neighbours that were.
        if oldflags & (VM_ACCOUNT | VM_WRITE | VM_SHARED | VM_NORESERVE) == 0 {
            charged = nrpages;
            oc.vm_enough_memory(Some(mm.total_vm.load(Ordering::Relaxed)), charged)?;
            newflags |= VM_ACCOUNT;
        }
    } else if oldflags & VM_ACCOUNT != 0 && vma.is_anonymous() && vma.anon_vma().is_none() {
        // Since v6.2, an anonymous mapping made read-only before it ever
        // faulted gives its charge back: it has no private pages to keep.
        // A file mapping keeps it (it may hold private copies of file
        // pages later, which the charge stands for).
        newflags &= !VM_ACCOUNT;
    }
    let vma = match vma_modify_flags(oncpu, mm, tree, start, end, newflags) {
        Ok(vma) => vma,
        Err(e) => {
            oc.vm_unacct_memory(charged);
            return Err(e);
        }
    };
    change_protection(oncpu, mm, &vma, start, end);
    if oldflags & VM_ACCOUNT != 0 && newflags & VM_ACCOUNT == 0 {
        oc.vm_unacct_memory(nrpages);
    }
    Ok(())
}

/// `change_protection` over `[start, end)` of one VMA.
pub fn change_protection(oncpu: &OnCpu, mm: &Arc<Mm>, vma: &Arc<Vma>, start: u64, end: u64) {
    let mut tlb = MmuGather::new(mm);
    let mut cp = ChangeProt {
        oncpu,
        tlb: &mut tlb,
        vma,
        newprot: vma.page_prot(),
    };
    let flow = walk_page_range(oncpu.mem(), &mm.pgd, start, end, WalkLock::Ptl, &mut cp);
    debug_assert!(flow.is_continue());
    tlb.finish(oncpu);
}

/// What `change_protection`'s levels share (the kernel passes them as
/// arguments down its `change_p*_range` functions).
struct ChangeProt<'a, 'g> {
    oncpu: &'a OnCpu<'a>,
    tlb: &'a mut MmuGather<'g>,
    vma: &'a Vma,
    newprot: Pgprot,
}

impl MmWalkOps for ChangeProt<'_, '_> {
    type Break = std::convert::Infallible;

    /// One step of `change_pmd_range`: the PTE table is changed by
    /// `change_pte_range` under its lock.
    fn pmd_entry(
        &mut self,
        slot: PmdSlot,
        _pmd: Pmd,
        addr: u64,
        next: u64,
    ) -> ControlFlow<Self::Break, WalkAction> {
        self.change_pmd(slot, addr, next);
        ControlFlow::Continue(WalkAction::Continue)
    }
}

impl ChangeProt<'_, '_> {
    /// One step of `change_pmd_range`: a whole huge PMD is changed in
    /// place, one covered in part is split first.
    fn change_pmd(&mut self, slot: PmdSlot, addr: u64, next: u64) {
        let mm = self.tlb.mm;
        if crate::huge_memory::pmd_is_huge(mm.pmd_get(slot)) {
            if next - addr == PMD_SIZE {
                let huge = crate::huge_memory::change_huge_pmd;
                // None: split meanwhile, the PTE level below.
                if let Some(flush) = huge(self.oncpu, mm, slot, self.vma, self.newprot) {
                    if flush {
                        self.tlb.remove_pmd_tlb_entry(addr);
                    }
                    return;
                }
            } else {
                crate::huge_memory::split_huge_pmd(self.oncpu, mm, slot, addr);
            }
        }
        self.change_pte_range(slot, addr, next);
    }

    /// `change_pte_range`.
    /// `can_change_pte_writable`: in a private mapping, an exclusive anon
    /// page; in a shared one (whose entries start read-only for
    /// write-notify), a page already dirty, whose write was seen.
    fn can_change_pte_writable(
        &self,
        mem: &crate::phys::PhysMem,
        pte: crate::pgtable::Pte,
    ) -> bool {
        if self.vma.flags() & crate::mm::vma::VM_SHARED != 0 {
            return pte.dirty();
        }
        folio::page_anon_exclusive(mem, pte.pfn())
    }

    fn change_pte_range(&mut self, slot: PmdSlot, start: u64, end: u64) {
        let mem = self.oncpu.mem();
        let Some(mut pt) = self.tlb.mm.pte_offset_map_lock(slot) else {
            return;
        };
        crate::tlbbatch::flush_tlb_batched_pending(self.oncpu, self.tlb.mm);
        let mut addr = start;
        while addr < end {
            let idx = pgtable::pte_index(addr);
            let old = pt.pte(idx);
            if old.is_swap() {
                change_non_present_pte(&mut pt, idx, old);
            } else if old.present() {
                // Taken out and put back changed, so that no accessed or
                // dirty bit a CPU sets meanwhile is lost.
                let old = pt.modify_prot_start(idx);
                let mut new = old.modify(self.newprot);
                if self.vma.flags() & VM_WRITE != 0
                    && !new.write()
                    && !old.special()
                    && !new.protnone()
                    && self.can_change_pte_writable(mem, old)
                {
                    new = new.mkwrite();
                }
                pt.modify_prot_commit(idx, new);
                if pte_needs_flush(old, new) {
                    self.tlb.remove_tlb_entries(addr, 1);
                }
            }
            addr += PAGE_SIZE;
        }
    }
}

/// `change_pte_range` for a non-present entry, mprotect's and the NUMA
/// scan's alike: a writable migration entry becomes readable
/// (readable-exclusive for an anon page: a protection check is difficult,
/// so the kernel just disables write); markers stay as they are (any
/// access faults anyway). The MMU never cached the entry: no flush. Returns
/// whether the entry changed.
pub(crate) fn change_non_present_pte(pt: &mut PteLocked<'_>, idx: usize, old: Pte) -> bool {
    let entry = old.swp_entry();
    let SwpKind::Migration {
        kind: Migration::Write,
        ..
    } = entry.kind()
    else {
        return false;
    };
    // Every folio of the model is anon.
    let readable = entry.with_migration_kind(Migration::ReadExclusive);
    let mut new = readable.to_pte();
    if old.swp_soft_dirty() {
        new = new.swp_mksoft_dirty();
    }
    pt.set(idx, new);
    true
}
