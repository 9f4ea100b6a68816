//! The page-fault entry (arch/x86/mm/fault.c, `do_user_addr_fault`): find
//! the VMA, check the access, and call the handler under the lock that
//! keeps the VMA stable.
//!
//! This is the one place where that lock is chosen, by the `fault_lock`
//! tunable:
//!
//! * `vma_lock` (the default, v6.4+): `lock_vma_under_rcu` read-locks the
//!   faulting VMA alone; a handler that cannot go on under it (an anon_vma
//!   to make while mmap_lock cannot be had at once) returns
//!   [`VmFaultResult::Retry`] and the fault is taken again under mmap_lock
//!   (`vma_lock_retry`), as is one whose VMA is being changed
//!   (`vma_lock_abort`).
//! * `spf` (the seed): no lock at all. The fault reads `mm_lock_seq`, looks
//!   its VMA up under an epoch pin, checks the count again (the VMA it read
//!   is then the one a lock would have shown), walks the tables without
//!   allocating, and commits only through `pte_map_lock`, which checks the
//!   count once more under the PTE lock. Any abort redoes the fault under
//!   mmap_lock (`spf_abort`, with the reason). As in the seed, a writer
//!   that changes a VMA's flags without touching its PTEs (MADV_HUGEPAGE)
//!   does not stop a fault already past its last check from committing
//!   what the old flags chose; every writer that changes PTEs takes their
//!   lock after making the count odd, so none of its changes is lost.
//! * `mmap_lock` (before v6.4): every fault takes mmap_lock for reading and
//!   looks its VMA up under it (`lock_mm_and_find_vma`).
//!
//! In every mode the VMA is borrowed from the tree under an epoch pin held
//! for the fault: no count is taken on it (nor on the mm), as the kernel
//! takes none, so that the only shared cache lines a fault writes are those
//! its mode's lock needs. Those writes are counted per fault
//! (`usermm_shared_line_writes`, see [`crate::cacheline`]).

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::memory::{handle_mm_fault, handle_mm_fault_speculative, FaultFlags, VmFaultResult};
use crate::mm::mmap_lock::lock_vma_under_rcu;
use crate::mm::vma::{VM_EXEC, VM_GROWSDOWN, VM_READ, VM_WRITE};
use crate::mm::{Mm, Vma};
use crate::sync::{epoch, Arc};
use crate::tunable::FaultLock;
use crate::vmstat::Event;

/// `access_error`: may the VMA be accessed this way?
fn access_error(vma: &Vma, flags: FaultFlags) -> bool {
    let vm = vma.flags();
    if flags.write() {
        vm & VM_WRITE == 0
    } else {
        vm & (VM_READ | VM_WRITE | VM_EXEC) == 0
    }
}

impl OnCpu<'_> {
    /// `do_user_addr_fault`: a user access at `addr` faulted. `EFAULT`
    /// stands for the SIGSEGV the kernel would send, `ENOMEM` for the OOM
    /// it would handle.
    pub(crate) fn do_user_addr_fault(&self, addr: u64, flags: FaultFlags) -> KResult<()> {
        self.kernel_enter();
        crate::cacheline::fault_begin();
        let r = self
            .with_mm(|mm| self.handle_user_fault(mm, addr, flags | FaultFlags::USER))
            .unwrap_or(VmFaultResult::Sigsegv);
        let shared = crate::cacheline::fault_end();
        self.vmstat()
            .count(self.id(), Event::SHARED_LINE_WRITES, shared);
        self.user_enter();
        match r {
            VmFaultResult::Done | VmFaultResult::Raced => Ok(()),
            VmFaultResult::Oom => Err(Errno::ENOMEM),
            VmFaultResult::Sigsegv => Err(Errno::EFAULT),
            VmFaultResult::Sigbus => Err(Errno::SIGBUS),
            VmFaultResult::Fallback | VmFaultResult::Retry => {
                unreachable!("handle_mm_fault resolves {r:?} itself")
            }
        }
    }

    /// The lockless path of the selected mode, then mmap_lock if it gave up.
    fn handle_user_fault(&self, mm: &Arc<Mm>, addr: u64, flags: FaultFlags) -> VmFaultResult {
        let mut tried = false;
        let first = match self.m.tunables.fault_lock() {
            FaultLock::MmapLock => None,
            FaultLock::VmaLock => self.fault_under_vma_lock(mm, addr, flags, &mut tried),
            FaultLock::Spf => self.fault_speculative(mm, addr, flags),
        };
        if let Some(r) = first {
            return r;
        }
        loop {
            // A fault given up once is taken again as such
            // (`FAULT_FLAG_TRIED`): it does not give up again.
            let flags = if tried {
                flags | FaultFlags::TRIED
            } else {
                flags
            };
            match self.fault_under_mmap_lock(mm, addr, flags) {
                VmFaultResult::Retry => tried = true,
                r => return r,
            }
        }
    }

    /// The per-VMA-lock attempt; None: take mmap_lock instead.
    fn fault_under_vma_lock(
        &self,
        mm: &Arc<Mm>,
        addr: u64,
        flags: FaultFlags,
        tried: &mut bool,
    ) -> Option<VmFaultResult> {
        let vmstat = self.vmstat();
        let guard = epoch::pin();
        let (vma, locked) = lock_vma_under_rcu(mm, addr, &guard, vmstat, self.id())?;
        if access_error(vma, flags) {
            // Reported from here, with only the VMA locked (v6.6+).
            drop(locked);
            vmstat.count(self.id(), Event::VMA_LOCK_SUCCESS, 1);
            return Some(VmFaultResult::Sigsegv);
        }
        let r = handle_mm_fault(self, mm, vma, addr, flags | FaultFlags::VMA_LOCK);
        // The kernel's handler drops the VMA lock itself before it returns
        // RETRY (it may sleep after); nothing here waits, so it is dropped
        // on the way out, in every case.
        drop(locked);
        if r == VmFaultResult::Retry {
            vmstat.count(self.id(), Event::VMA_LOCK_RETRY, 1);
            *tried = true;
            return None;
        }
        vmstat.count(self.id(), Event::VMA_LOCK_SUCCESS, 1);
        Some(r)
    }

    /// The seed's speculative attempt (its x86 fault entry); None: abort,
    /// take mmap_lock instead.
    fn fault_speculative(
        &self,
        mm: &Arc<Mm>,
        addr: u64,
        flags: FaultFlags,
    ) -> Option<VmFaultResult> {
        let vmstat = self.vmstat();
        let cpu = self.id();
        vmstat.count(cpu, Event::SPF_ATTEMPT, 1);
        let abort = |why: Option<Event>| {
            if let Some(why) = why {
                vmstat.count(cpu, why, 1);
            }
            vmstat.count(cpu, Event::SPF_ABORT, 1);
            None
        };
        let seq = &mm.mmap_lock.seq;
        let Some(start) = seq.read_start() else {
            return abort(Some(Event::SPF_ABORT_ODD));
        };
        let guard = epoch::pin();
        let Some(vma) = mm.vma_tree(&guard).vma_lookup(addr) else {
            return abort(Some(Event::SPF_ABORT_UNMAPPED));
        };
        // The seed copies the VMA here; a model VMA never changes, so the
        // one found is its own copy, if no writer ran meanwhile.
        if !seq.read_check(start) {
            return abort(Some(Event::SPF_ABORT_VMA_COPY));
        }
        if access_error(vma, flags) {
            // The classic path reports it.
            return abort(Some(Event::SPF_ABORT_ACCESS_ERROR));
        }
        if !vma.is_anonymous() {
            // The seed speculated on file read faults through fault-around
            // alone; the model takes every file fault the classic way.
            return abort(Some(Event::SPF_ABORT_NO_SPECULATE));
        }
        match handle_mm_fault_speculative(self, mm, vma, addr, flags, start) {
            // The reason was counted where the fault gave up.
            VmFaultResult::Retry => abort(None),
            r => Some(r),
        }
    }

    /// `lock_mm_and_find_vma`, the access check, and the fault.
    fn fault_under_mmap_lock(&self, mm: &Arc<Mm>, addr: u64, flags: FaultFlags) -> VmFaultResult {
        let Some(_g) = self.lock_mm_and_find_vma(mm, addr) else {
            return VmFaultResult::Sigsegv;
        };
        let guard = epoch::pin();
        match mm.vma_tree(&guard).vma_lookup(addr) {
            Some(vma) if !access_error(vma, flags) => handle_mm_fault(self, mm, vma, addr, flags),
            _ => VmFaultResult::Sigsegv,
        }
    }

    /// `lock_mm_and_find_vma`: mmap_lock held for reading over a VMA that
    /// contains `addr`, or None (SIGSEGV). An address below a stack that
    /// grows down grows it (`expand_stack_locked`), under the lock taken
    /// again for writing (x86 cannot upgrade it: it is dropped, and the
    /// VMA looked up again), then downgraded.
    fn lock_mm_and_find_vma<'m>(
        &self,
        mm: &'m Arc<Mm>,
        addr: u64,
    ) -> Option<crate::mm::mmap_lock::MmapReadGuard<'m>> {
        let g = mm.mmap_lock.read();
        let below_stack = {
            let guard = epoch::pin();
            match mm.vma_tree(&guard).find_vma(addr) {
                Some(v) if v.start() <= addr => return Some(g),
                Some(v) => v.flags() & VM_GROWSDOWN != 0,
                None => false,
            }
        };
        drop(g);
        if !below_stack {
            return None;
        }
        let w = mm.mmap_lock.write();
        let vma = {
            let guard = epoch::pin();
            mm.vma_tree(&guard).find_vma(addr).cloned()?
        };
        if vma.start() > addr {
            crate::mmap::expand_downwards(self, mm, &vma, addr).ok()?;
        }
        Some(w.downgrade())
    }
}
