//! User loads and stores: the CPU side of an access (TLB, page walk, fault).
//!
//! An access enters user mode, polls the CPU's mailbox (taking any pending
//! shootdown), looks the address up in the TLB, walks the page tables on a
//! miss and caches the result, and on a walk failure raises a page fault
//! (`exc_page_fault` → [`crate::fault`]).
//! A fault the kernel would answer with SIGSEGV returns `EFAULT`.
//!
//! Bytes are read and written with relaxed atomics of the access's size, so
//! that CPUs racing on the same word behave as on x86 (no tearing of an
//! aligned word) without undefined behaviour in the host program.

use crate::cpu::tlb::{PscLevel, Tlb};
use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::memory::FaultFlags;
use crate::pgtable::walk::{hw_walk_from, WalkFault, WalkStart};
use crate::phys::{copy_from_frame, copy_to_frame};
use crate::phys::{Pfn, PAGE_MASK, PAGE_SIZE};
use crate::sync::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use crate::vmstat::Event;

/// Accesses between two looks at NUMA balancing's clock.
const NUMA_TICK_ACCESSES: u32 = 1024;

/// Where the MMU starts a walk for `addr`: at the lowest table its
/// paging-structure caches hold for the address, else at the root.
#[inline]
fn walk_start(tlb: &Tlb, slot: usize, pgd: Pfn, addr: u64) -> WalkStart {
    if let Some(t) = tlb.lookup_table(slot, PscLevel::Pde, addr) {
        WalkStart::PteTable(t)
    } else if let Some(t) = tlb.lookup_table(slot, PscLevel::Pdpte, addr) {
        WalkStart::PmdTable(t)
    } else {
        WalkStart::Pgd(pgd)
    }
}

impl OnCpu<'_> {
    /// `task_tick_numa`: every so many accesses, if NUMA balancing is on,
    /// the process's scan runs as the CPU returns to it
    /// ([`crate::numa_balancing::task_numa_work`]), in kernel mode.
    #[inline]
    fn numa_tick(&self) {
        let t = self.numa_tick.get().wrapping_add(1);
        self.numa_tick.set(t);
        if !t.is_multiple_of(NUMA_TICK_ACCESSES) || !self.m.numa.enabled() {
            return;
        }
        let Some(mm) = self.cpu.loaded_mm() else {
            return;
        };
        self.kernel_enter();
        crate::numa_balancing::task_numa_work(self, &mm);
    }

    /// Translate `addr` for a load or store, faulting as needed.
    #[inline(always)]
    fn translate(&self, addr: u64, write: bool) -> KResult<(Pfn, u64)> {
        match self.translate_hit(addr, write) {
            Some(hit) => Ok(hit),
            None => self.translate_slow(addr, write),
        }
    }

    /// The common case, inlined into every access: the CPU is in user mode
    /// already, no request waits in its mailbox, NUMA balancing's tick is
    /// not due, and the TLB holds a translation that allows the access.
    /// A few relaxed loads of the CPU's own state; no lock, no
    /// read-modify-write. Anything else goes the slow way, which does the
    /// same steps in full.
    #[inline(always)]
    fn translate_hit(&self, addr: u64, write: bool) -> Option<(Pfn, u64)> {
        let t = self.numa_tick.get().wrapping_add(1);
        if t.is_multiple_of(NUMA_TICK_ACCESSES) || !self.cpu.in_user() || self.cpu.mail_waiting() {
            return None;
        }
        let (_, slot) = self.cpu.loaded_pgd()?;
        let e = self.cpu.tlb.lookup(slot, addr)?;
        if write && !(e.writable && e.dirty) {
            return None;
        }
        self.numa_tick.set(t);
        Some((e.pfn, addr % PAGE_SIZE))
    }

    /// Every other access: tick, return to user mode, take the mailbox,
    /// look up, walk, fault.
    #[inline(never)]
    fn translate_slow(&self, addr: u64, write: bool) -> KResult<(Pfn, u64)> {
        let vmstat = self.vmstat();
        self.numa_tick();
        self.user_enter();
        let mut faults = 0;
        loop {
            self.cpu.poll(vmstat);
            // After the mailbox, whose flag a reschedule IPI raised: a
            // kernel thread that asked for the CPU runs now.
            if self.m.sched.kthread_waiting(self.id()) {
                self.schedule();
                self.user_enter();
                continue;
            }
            let (pgd, slot) = self.cpu.loaded_pgd().ok_or(Errno::EFAULT)?;
            let tlb = &self.cpu.tlb;
            match tlb.lookup(slot, addr) {
                Some(e) if !write || (e.writable && e.dirty) => {
                    return Ok((e.pfn, addr % PAGE_SIZE));
                }
                // A store through a read-only entry faults without a new
                // walk, as Intel's MMU does: the entry may be stale (the
                // PTE allows the write by now, and the fault is spurious).
                // The #PF drops the entry. (A writable entry that is not
                // dirty yet is walked again, to set the dirty bit.)
                Some(e) if !e.writable => tlb.flush_fault(slot, addr),
                _ => {
                    vmstat.count(self.id(), Event::TLB_MISS, 1);
                    if write {
                        vmstat.count(self.id(), Event::DTLB_STORE_MISS, 1);
                    }
                    let guard = crate::sync::epoch::pin();
                    match hw_walk_from(self.mem(), walk_start(tlb, slot, pgd, addr), addr, write) {
                        Ok((t, path)) => {
                            tlb.insert(slot, addr, &t);
                            if let Some(pmd_table) = path.pmd_table {
                                tlb.insert_table(slot, PscLevel::Pdpte, addr, pmd_table);
                            }
                            if let Some(pte_table) = path.pte_table {
                                tlb.insert_table(slot, PscLevel::Pde, addr, pte_table);
                            }
                            drop(guard);
                            return Ok(t.frame_of(addr));
                        }
                        // The #PF invalidates whatever the TLB had for addr.
                        Err(WalkFault::NotPresent | WalkFault::Protection) => {
                            tlb.flush_fault(slot, addr)
                        }
                    }
                }
            }
            faults += 1;
            debug_assert!(faults < 1000, "fault loop at {addr:#x}");
            let flags = if write {
                FaultFlags::WRITE
            } else {
                FaultFlags::empty()
            };
            self.do_user_addr_fault(addr, flags)?;
        }
    }

    #[inline(always)]
    fn byte_ptr(&self, pfn: Pfn, off: u64) -> *mut u8 {
        // SAFETY: off < PAGE_SIZE, inside the frame.
        unsafe { self.mem().frame_ptr(pfn).add(off as usize) }
    }

    /// Load `N` bytes from an address aligned to `N` (one page).
    #[inline(always)]
    fn load_aligned<const N: usize>(&self, addr: u64) -> KResult<u64> {
        let (pfn, off) = self.translate(addr, false)?;
        let p = self.byte_ptr(pfn, off);
        // SAFETY: p is N-aligned (addr is, and frames are page-aligned), N
        // bytes inside a live frame; all concurrent accesses are atomic.
        Ok(unsafe {
            match N {
                1 => AtomicU8::from_ptr(p).load(Ordering::Relaxed) as u64,
                2 => AtomicU16::from_ptr(p as *mut u16).load(Ordering::Relaxed) as u64,
                4 => AtomicU32::from_ptr(p as *mut u32).load(Ordering::Relaxed) as u64,
                _ => AtomicU64::from_ptr(p as *mut u64).load(Ordering::Relaxed),
            }
        })
    }

    #[inline(always)]
    fn store_aligned<const N: usize>(&self, addr: u64, v: u64) -> KResult<()> {
        let (pfn, off) = self.translate(addr, true)?;
        let p = self.byte_ptr(pfn, off);
        // SAFETY: as in load_aligned.
        unsafe {
            match N {
                1 => AtomicU8::from_ptr(p).store(v as u8, Ordering::Relaxed),
                2 => AtomicU16::from_ptr(p as *mut u16).store(v as u16, Ordering::Relaxed),
                4 => AtomicU32::from_ptr(p as *mut u32).store(v as u32, Ordering::Relaxed),
                _ => AtomicU64::from_ptr(p as *mut u64).store(v, Ordering::Relaxed),
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn load_n<const N: usize>(&self, addr: u64) -> KResult<u64> {
        if addr.is_multiple_of(N as u64) {
            return self.load_aligned::<N>(addr);
        }
        // An access that would wrap past the top of the address space
        // faults (no user page is mapped there).
        addr.checked_add(N as u64 - 1).ok_or(Errno::EFAULT)?;
        let mut v = 0u64;
        for i in 0..N as u64 {
            v |= self.load_aligned::<1>(addr + i)? << (8 * i);
        }
        Ok(v)
    }

    #[inline(always)]
    fn store_n<const N: usize>(&self, addr: u64, v: u64) -> KResult<()> {
        if addr.is_multiple_of(N as u64) {
            return self.store_aligned::<N>(addr, v);
        }
        let last = addr.checked_add(N as u64 - 1).ok_or(Errno::EFAULT)?;
        if last & PAGE_MASK != addr & PAGE_MASK {
            // A store split across two pages takes effect only if both may
            // be written (x86 checks both translations first): fault both
            // in before the first byte goes. (A mapping changed by another
            // CPU between this and the stores below could still leave the
            // first part written; the hardware has no such window.)
            self.translate(addr, true)?;
            self.translate(last, true)?;
        }
        for i in 0..N as u64 {
            self.store_aligned::<1>(addr + i, v >> (8 * i))?;
        }
        Ok(())
    }

    #[inline]
    pub fn load_u8(&self, addr: u64) -> KResult<u8> {
        self.load_n::<1>(addr).map(|v| v as u8)
    }
    #[inline]
    pub fn load_u16(&self, addr: u64) -> KResult<u16> {
        self.load_n::<2>(addr).map(|v| v as u16)
    }
    #[inline]
    pub fn load_u32(&self, addr: u64) -> KResult<u32> {
        self.load_n::<4>(addr).map(|v| v as u32)
    }
    #[inline]
    pub fn load_u64(&self, addr: u64) -> KResult<u64> {
        self.load_n::<8>(addr)
    }
    #[inline]
    pub fn store_u8(&self, addr: u64, v: u8) -> KResult<()> {
        self.store_n::<1>(addr, v as u64)
    }
    #[inline]
    pub fn store_u16(&self, addr: u64, v: u16) -> KResult<()> {
        self.store_n::<2>(addr, v as u64)
    }
    #[inline]
    pub fn store_u32(&self, addr: u64, v: u32) -> KResult<()> {
        self.store_n::<4>(addr, v as u64)
    }
    #[inline]
    pub fn store_u64(&self, addr: u64, v: u64) -> KResult<()> {
        self.store_n::<8>(addr, v)
    }

    /// Read `buf.len()` bytes from `addr` (`copy_from_user`): one
    /// translation per page, then the page's part copied word by word.
    pub fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> KResult<()> {
        self.for_each_page(addr, buf.len(), false, |p, at, n| {
            // SAFETY: `p` points at `n` bytes inside one live frame (a page's
            // part of the range, just translated).
            unsafe { copy_from_frame(p, &mut buf[at..at + n]) }
        })
    }

    /// Write `buf` at `addr` (`copy_to_user`): as [`OnCpu::read_bytes`].
    /// A fault on a later page leaves the earlier ones written, as the
    /// kernel's copy does.
    pub fn write_bytes(&self, addr: u64, buf: &[u8]) -> KResult<()> {
        self.for_each_page(addr, buf.len(), true, |p, at, n| {
            // SAFETY: as in read_bytes.
            unsafe { copy_to_frame(&buf[at..at + n], p) }
        })
    }

    /// Translate each page of `[addr, addr + len)` for a load or store and
    /// hand `f` the frame's bytes: (pointer, offset in the range, length).
    /// The mailbox is polled between pages, as an interrupt is taken
    /// between iterations of a string copy.
    fn for_each_page(
        &self,
        addr: u64,
        len: usize,
        write: bool,
        mut f: impl FnMut(*mut u8, usize, usize),
    ) -> KResult<()> {
        addr.checked_add(len as u64).ok_or(Errno::EFAULT)?;
        let mut done = 0;
        while done < len {
            let a = addr + done as u64;
            let n = ((PAGE_SIZE - a % PAGE_SIZE) as usize).min(len - done);
            let (pfn, off) = self.translate(a, write)?;
            f(self.byte_ptr(pfn, off), done, n);
            done += n;
        }
        Ok(())
    }

    /// Store one byte into every page of `[start, end)`: the write faults a
    /// program takes when it first touches a buffer.
    pub fn touch_pages(&self, start: u64, end: u64, v: u8) -> KResult<()> {
        let mut a = start;
        while a < end {
            self.store_u8(a, v)?;
            a += PAGE_SIZE;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::TlbMm;
    use crate::mmap::*;
    use crate::sync::{AtomicU32, Ordering};
    use crate::{Errno, Machine, MachineConfig};

    /// CPU 1 walks a page of a 2 MiB region (its PDE cache then holds the
    /// region's PTE table) and waits, in user mode, polling its mailbox.
    /// CPU 0 unmaps the region, which frees the table; if `flush_reaches`
    /// is false, CPU 1 is first taken out of the mm's CPU mask, so that the
    /// flush misses it as a broken lazy-TLB rule would. CPU 1 then touches
    /// another page of the region: it returns CPU 1's result.
    fn touch_after_the_table_is_freed(
        flush_reaches: bool,
    ) -> std::thread::Result<Result<u64, Errno>> {
        let m = Machine::new(MachineConfig::single_node(64 << 20, 2)).unwrap();
        let c0 = m.bind(0).unwrap();
        let mm = c0.new_mm().unwrap();
        let r = 0x4000_0000;
        let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
        c0.mmap(r, 4 << 20, PROT_READ | PROT_WRITE, flags).unwrap();
        c0.store_u64(r + (2 << 20), 1).unwrap();
        let step = AtomicU32::new(0);
        std::thread::scope(|s| {
            let cpu1 = s.spawn(|| {
                let c1 = m.bind(1).unwrap();
                c1.switch_mm(&mm);
                c1.store_u64(r, 1).unwrap();
                step.store(1, Ordering::Release);
                while step.load(Ordering::Acquire) != 2 {
                    c1.cpu.poll(c1.vmstat());
                    std::hint::spin_loop();
                }
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    c1.load_u64(r + 4096)
                }));
                c1.idle();
                r
            });
            while step.load(Ordering::Acquire) != 1 {
                std::hint::spin_loop();
            }
            if !flush_reaches {
                mm.cpumask()
                    .fetch_and(!c0.m.cpus[1].bit(), Ordering::SeqCst);
            }
            c0.munmap(r, 2 << 20).unwrap();
            m.rcu_barrier();
            step.store(2, Ordering::Release);
            cpu1.join().unwrap()
        })
    }

    #[test]
    fn a_flushed_paging_structure_cache_forgets_a_freed_table() {
        let r = touch_after_the_table_is_freed(true).expect("no walk through a freed table");
        assert_eq!(r, Err(Errno::EFAULT));
    }

    /// The deliberately broken variant: the walk starts at the freed table
    /// its PDE cache still names, and the model stops it.
    #[test]
    fn a_table_freed_behind_a_paging_structure_cache_is_caught() {
        let r = touch_after_the_table_is_freed(false);
        let msg = r.expect_err("the walk through the freed table must be caught");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("no page table any more"), "{msg}");
    }
}
