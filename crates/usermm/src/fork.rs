//! fork's address-space half (kernel/fork.c: `dup_mm`, `dup_mmap`).
//!
//! The child gets a copy of every VMA and, for those with anonymous pages,
//! of their page tables ([`memory::copy_page_range`]): pages are shared,
//! write-protected on both sides for COW, and no longer exclusive to either.
//! Both mms' mmap_locks are held for writing throughout, so no fault in the
//! parent can install a writable entry while the copy runs; other parent
//! CPUs may still write through writable entries cached in their TLBs until
//! the single `flush_tlb_mm` at the end. That is harmless because the child
//! has not run yet: its snapshot is the memory as it is at the flush.

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::memory;
use crate::mm::vma::{VM_ACCOUNT, VM_DONTCOPY, VM_LOCKED_MASK, VM_WIPEONFORK};
use crate::mm::{Mm, Vma, VmaTree};
use crate::rmap;
use crate::sync::{Arc, Ordering};

/// `dup_mm`: a new mm that is a copy of `oldmm`, registered with the
/// machine. On failure nothing of the child is left.
pub fn dup_mm(oncpu: &OnCpu, oldmm: &Arc<Mm>) -> KResult<Arc<Mm>> {
    if oldmm.dead.load(Ordering::Relaxed) {
        return Err(Errno::EINVAL);
    }
    let mm = Mm::new(oncpu.mem().clone(), oncpu.cpu.node, oncpu.id())?;
    // The child's task policy is a copy of the parent's (`mpol_dup`).
    mm.mempolicy.set(oldmm.mempolicy.get());
    // The task's limits and capabilities are inherited; `mlockall`'s
    // future locking is not (`def_flags & VM_INIT_DEF_MASK`).
    mm.set_memlock_limit(oldmm.memlock_limit());
    mm.set_stack_limit(oldmm.stack_limit());
    mm.copy_layout_from(oldmm);
    mm.set_cap_ipc_lock(oldmm.cap_ipc_lock());
    let def = oldmm.def_flags.load(Ordering::Relaxed) & crate::mm::vma::VM_NOHUGEPAGE;
    mm.def_flags.store(def, Ordering::Relaxed);
    // Known before its VMAs join the parent's anon_vmas: an rmap walk
    // (migration's) that finds one must reach its page tables, or a
    // migration entry copied into them would never be replaced.
    oncpu.m.register_mm(&mm);
    if let Err(e) = dup_mmap(oncpu, &mm, oldmm) {
        // What was copied before the failure is torn down as at exit.
        crate::mmap::exit_mmap(oncpu, &mm);
        return Err(e);
    }
    Ok(mm)
}

/// `dup_mmap`.
fn dup_mmap(oncpu: &OnCpu, mm: &Arc<Mm>, oldmm: &Arc<Mm>) -> KResult<()> {
    let _old = oldmm.mmap_lock.write();
    let _new = mm.mmap_lock.write();
    let src = oldmm.vma_tree_draft();
    // Every parent VMA is write-locked (`dup_mmap`, since the fix of July
    // 2023): a fault under a VMA lock must not COW a page fork is
    // write-protecting, nor give the VMA an anon_vma the child misses.
    src.start_write_all();
    let mut vmas = Vec::with_capacity(src.len());
    let mut total_vm = 0;
    let mut result = Ok(());
    for mpnt in src.iter() {
        if mpnt.flags() & VM_DONTCOPY != 0 {
            continue;
        }
        // The child's copy of a charged mapping is charged again, in the
        // parent's name (`security_vm_enough_memory_mm(oldmm, len)`).
        if mpnt.flags() & VM_ACCOUNT != 0 {
            let oc = &oncpu.m.overcommit;
            let total_vm = oldmm.total_vm.load(Ordering::Relaxed);
            if let Err(e) = oc.vm_enough_memory(Some(total_vm), mpnt.pages()) {
                result = Err(e);
                break;
            }
        }
        // Memory locks are not inherited (`vm_flags_clear(tmp,
        // VM_LOCKED_MASK)`).
        let flags = mpnt.flags() & !VM_LOCKED_MASK;
        let tmp = Arc::new(
            Vma::new(mm.id, mpnt.start(), mpnt.end(), flags, mpnt.pgoff())
                .with_policy(mpnt.policy().cloned())
                .with_file(mpnt.file().cloned())
                .with_special(mpnt.special()),
        );
        // A wipe-on-fork range starts empty in the child: no anon_vma
        // until its first fault, nothing copied.
        let wipe = mpnt.flags() & VM_WIPEONFORK != 0;
        if !wipe {
            rmap::anon_vma_fork(&tmp, mpnt);
        }
        crate::fs::vma_link_file(&tmp);
        vmas.push(tmp.clone());
        total_vm += mpnt.pages();
        if !wipe && memory::vma_needs_copy(mpnt) {
            result = memory::copy_page_range(oncpu, mm, oldmm, &tmp, mpnt);
            if result.is_err() {
                break;
            }
        }
    }
    mm.vma_tree_publish(&mut VmaTree::from_sorted(vmas), &crate::sync::epoch::pin());
    mm.total_vm.store(total_vm, Ordering::Relaxed);
    // One flush for every write-protect made in the parent, still under its
    // mmap_lock (so that no new writable entry can appear meanwhile).
    oncpu.flush_tlb_mm(oldmm);
    result
}
