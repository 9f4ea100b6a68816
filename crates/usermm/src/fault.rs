//! The page-fault entry (arch/x86/mm/fault.c, `do_user_addr_fault`): find
//! the VMA, check the access, and call [`handle_mm_fault`] under the lock
//! that keeps the VMA stable.
//!
//! This is the one place where that lock is chosen. Every fault takes
//! mmap_lock for reading and looks its VMA up under it
//! (`lock_mm_and_find_vma`), as the kernel did before v6.4; a handler that
//! gives the lock up returns [`VmFaultResult::Retry`] and the fault is taken
//! again. The per-VMA-lock and speculative paths will be tried here first,
//! falling back to this one, as the kernel tries `lock_vma_under_rcu`.

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::memory::{handle_mm_fault, FaultFlags, VmFaultResult};
use crate::mm::vma::{VM_EXEC, VM_READ, VM_WRITE};
use crate::mm::Vma;

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
        let r = loop {
            match self.fault_under_mmap_lock(addr, flags) {
                VmFaultResult::Retry => continue,
                r => break r,
            }
        };
        self.user_enter();
        match r {
            VmFaultResult::Done | VmFaultResult::Raced => Ok(()),
            VmFaultResult::Oom => Err(Errno::ENOMEM),
            VmFaultResult::Sigsegv => Err(Errno::EFAULT),
            VmFaultResult::Fallback | VmFaultResult::Retry => {
                unreachable!("handle_mm_fault resolves {r:?} itself")
            }
        }
    }

    /// `lock_mm_and_find_vma`, the access check, and the fault.
    fn fault_under_mmap_lock(&self, addr: u64, flags: FaultFlags) -> VmFaultResult {
        let Ok(mm) = self.mm() else {
            return VmFaultResult::Sigsegv;
        };
        let _g = mm.mmap_lock.read();
        let vma = {
            let guard = crate::sync::epoch::pin();
            mm.vma_tree(&guard).vma_lookup(addr).cloned()
        };
        match vma {
            Some(vma) if !access_error(&vma, flags) => {
                handle_mm_fault(self, &mm, &vma, addr, flags | FaultFlags::USER)
            }
            _ => VmFaultResult::Sigsegv,
        }
    }
}
