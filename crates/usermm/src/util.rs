//! The overcommit policy (mm/util.c): `vm.overcommit_memory` and its
//! sysctls, the machine-wide commitment `vm_committed_as`, and
//! `__vm_enough_memory`, which every path that commits private writable
//! memory asks first (mmap, mprotect making a mapping writable, fork).
//!
//! What is committed is the size of every VMA that carries `VM_ACCOUNT`: a
//! private writable mapping without `MAP_NORESERVE` (`accountable_mapping`).
//! It is charged when the VMA gets the flag and uncharged when the VMA goes
//! (munmap, exit) or loses it (mprotect of an anonymous mapping that never
//! faulted to read-only). Splits and merges move pages between VMAs and
//! leave the total alone.
//!
//! The kernel keeps `vm_committed_as` in a per-CPU counter read without
//! summing (`percpu_counter_read_positive`), so its checks may be off by the
//! counter's batch; the model's counter is one atomic and exact.
//!
//! The model has no swap and no hugetlb pages, and its processes run with
//! `CAP_SYS_ADMIN`, as the scenarios do natively (as root), so the admin
//! reserve is never taken off the limit.

use crate::errno::{Errno, KResult};
use crate::phys::PAGE_SHIFT;
use crate::sync::{AtomicI64, AtomicU64, AtomicU8, Ordering};

/// `vm.overcommit_memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OvercommitMode {
    /// 0, `OVERCOMMIT_GUESS` (the default): refuse only a single request
    /// larger than all of RAM and swap.
    Guess = 0,
    /// 1, `OVERCOMMIT_ALWAYS`: never refuse.
    Always = 1,
    /// 2, `OVERCOMMIT_NEVER`: refuse once the commitment would reach the
    /// commit limit; `MAP_NORESERVE` is ignored.
    Never = 2,
}

impl OvercommitMode {
    pub fn from_sysctl(v: u64) -> Option<OvercommitMode> {
        match v {
            0 => Some(OvercommitMode::Guess),
            1 => Some(OvercommitMode::Always),
            2 => Some(OvercommitMode::Never),
            _ => None,
        }
    }
}

/// Whether the calling process has `CAP_SYS_ADMIN` (see the module doc).
const CAP_SYS_ADMIN: bool = true;

/// The sysctls of overcommit accounting and the commitment.
pub struct Overcommit {
    mode: AtomicU8,
    /// `vm.overcommit_ratio`: percent of RAM in the commit limit.
    ratio: AtomicU64,
    /// `vm.overcommit_kbytes`: the limit's RAM part in kB, when not 0
    /// (writing one of ratio and kbytes zeroes the other, as sysctl does).
    kbytes: AtomicU64,
    /// `vm.admin_reserve_kbytes`.
    admin_reserve_kbytes: AtomicU64,
    /// `vm.user_reserve_kbytes`.
    user_reserve_kbytes: AtomicU64,
    /// `vm_committed_as`, in pages.
    committed: AtomicI64,
    /// `totalram_pages()`.
    totalram_pages: u64,
}

impl Overcommit {
    /// The kernel's defaults: mode 0, ratio 50, reserves of 8 MiB (admin)
    /// and 128 MiB (user), each capped at 3% of RAM as
    /// `init_admin_reserve` / `init_user_reserve` cap them.
    pub fn new(totalram_pages: u64) -> Overcommit {
        let free_kb = totalram_pages << (PAGE_SHIFT - 10);
        Overcommit {
            mode: AtomicU8::new(OvercommitMode::Guess as u8),
            ratio: AtomicU64::new(50),
            kbytes: AtomicU64::new(0),
            admin_reserve_kbytes: AtomicU64::new((free_kb / 32).min(1 << 13)),
            user_reserve_kbytes: AtomicU64::new((free_kb / 32).min(1 << 17)),
            committed: AtomicI64::new(0),
            totalram_pages,
        }
    }

    pub fn mode(&self) -> OvercommitMode {
        OvercommitMode::from_sysctl(self.mode.load(Ordering::Relaxed).into())
            .expect("only valid modes are stored")
    }

    /// Write one of the sysctls by its name under `/proc/sys/vm/`; EINVAL
    /// for an unknown name or a value the kernel's handler refuses.
    pub fn set_sysctl(&self, name: &str, value: u64) -> KResult<()> {
        match name {
            "overcommit_memory" => {
                let mode = OvercommitMode::from_sysctl(value).ok_or(Errno::EINVAL)?;
                self.mode.store(mode as u8, Ordering::Relaxed);
            }
            "overcommit_ratio" => {
                self.ratio.store(value, Ordering::Relaxed);
                self.kbytes.store(0, Ordering::Relaxed);
            }
            "overcommit_kbytes" => {
                self.kbytes.store(value, Ordering::Relaxed);
                self.ratio.store(0, Ordering::Relaxed);
            }
            "admin_reserve_kbytes" => self.admin_reserve_kbytes.store(value, Ordering::Relaxed),
            "user_reserve_kbytes" => self.user_reserve_kbytes.store(value, Ordering::Relaxed),
            _ => return Err(Errno::EINVAL),
        }
        Ok(())
    }

    /// Read one of the sysctls by name.
    pub fn sysctl(&self, name: &str) -> Option<u64> {
        Some(match name {
            "overcommit_memory" => self.mode() as u64,
            "overcommit_ratio" => self.ratio.load(Ordering::Relaxed),
            "overcommit_kbytes" => self.kbytes.load(Ordering::Relaxed),
            "admin_reserve_kbytes" => self.admin_reserve_kbytes.load(Ordering::Relaxed),
            "user_reserve_kbytes" => self.user_reserve_kbytes.load(Ordering::Relaxed),
            _ => return None,
        })
    }

    /// `vm_commit_limit`, in pages: /proc/meminfo's `CommitLimit`.
    pub fn vm_commit_limit(&self) -> u64 {
        let kbytes = self.kbytes.load(Ordering::Relaxed);
        if kbytes != 0 {
            kbytes >> (PAGE_SHIFT - 10)
        } else {
            self.totalram_pages * self.ratio.load(Ordering::Relaxed) / 100
        }
    }

    /// `vm_memory_committed`, in pages: /proc/meminfo's `Committed_AS`.
    pub fn vm_memory_committed(&self) -> u64 {
        self.committed.load(Ordering::Relaxed).max(0) as u64
    }

    /// `vm_acct_memory`.
    pub fn vm_acct_memory(&self, pages: u64) {
        self.committed.fetch_add(pages as i64, Ordering::Relaxed);
    }

    /// `vm_unacct_memory`.
    pub fn vm_unacct_memory(&self, pages: u64) {
        let before = self.committed.fetch_sub(pages as i64, Ordering::Relaxed);
        debug_assert!(before >= pages as i64, "vm_committed_as went negative");
    }

    /// `__vm_enough_memory`: charge `pages` to the commitment, or refuse
    /// with ENOMEM and charge nothing. `total_vm` is the asking process's
    /// size in pages (None for a request on no process's behalf).
    pub fn vm_enough_memory(&self, total_vm: Option<u64>, pages: u64) -> KResult<()> {
        self.vm_acct_memory(pages);
        match self.mode() {
            OvercommitMode::Always => return Ok(()),
            OvercommitMode::Guess => {
                // No swap in the model: RAM is all there is.
                if pages <= self.totalram_pages {
                    return Ok(());
                }
            }
            OvercommitMode::Never => {
                let mut allowed = self.vm_commit_limit() as i64;
                if !CAP_SYS_ADMIN {
                    allowed -= (self.admin_reserve_kbytes.load(Ordering::Relaxed)
                        >> (PAGE_SHIFT - 10)) as i64;
                }
                if let Some(total_vm) = total_vm {
                    // Keep enough back for a user to recover from one
                    // process grown too big.
                    let reserve =
                        self.user_reserve_kbytes.load(Ordering::Relaxed) >> (PAGE_SHIFT - 10);
                    allowed -= (total_vm / 32).min(reserve) as i64;
                }
                // The new pages are in the commitment already.
                if (self.vm_memory_committed() as i64) < allowed {
                    return Ok(());
                }
            }
        }
        self.vm_unacct_memory(pages);
        Err(Errno::ENOMEM)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1 GiB of RAM.
    fn oc() -> Overcommit {
        Overcommit::new(1 << 18)
    }

    #[test]
    fn guess_refuses_only_more_than_ram() {
        let o = oc();
        assert_eq!(o.vm_enough_memory(Some(0), 1 << 18), Ok(()));
        assert_eq!(o.vm_enough_memory(Some(0), 1 << 18), Ok(()));
        assert_eq!(o.vm_memory_committed(), 2 << 18);
        assert_eq!(
            o.vm_enough_memory(Some(0), (1 << 18) + 1),
            Err(Errno::ENOMEM)
        );
        assert_eq!(
            o.vm_memory_committed(),
            2 << 18,
            "a refusal charges nothing"
        );
    }

    #[test]
    fn always_refuses_nothing() {
        let o = oc();
        o.set_sysctl("overcommit_memory", 1).unwrap();
        assert_eq!(o.vm_enough_memory(Some(0), 1 << 40), Ok(()));
    }

    #[test]
    fn never_keeps_under_the_commit_limit() {
        let o = oc();
        o.set_sysctl("overcommit_memory", 2).unwrap();
        assert_eq!(o.vm_commit_limit(), 1 << 17, "50% of RAM");
        // The request itself counts: committed + pages must stay below.
        assert_eq!(o.vm_enough_memory(None, (1 << 17) - 1), Ok(()));
        assert_eq!(o.vm_enough_memory(None, 1), Err(Errno::ENOMEM));
        o.vm_unacct_memory((1 << 17) - 1);
        // A big process has part of the user reserve taken off its limit:
        // total_vm / 32 = 4096 pages, under the 8192-page reserve (3% cap).
        let total_vm = 1 << 17;
        assert_eq!(
            o.vm_enough_memory(Some(total_vm), (1 << 17) - 4096),
            Err(Errno::ENOMEM)
        );
        assert_eq!(o.vm_enough_memory(Some(total_vm), (1 << 17) - 4097), Ok(()));
        // overcommit_kbytes replaces the ratio.
        o.set_sysctl("overcommit_kbytes", 4 << 20).unwrap();
        assert_eq!(o.sysctl("overcommit_ratio"), Some(0));
        assert_eq!(o.vm_commit_limit(), 1 << 20);
    }

    #[test]
    fn bad_sysctls_are_einval() {
        let o = oc();
        assert_eq!(o.set_sysctl("overcommit_memory", 3), Err(Errno::EINVAL));
        assert_eq!(o.set_sysctl("nonsense", 0), Err(Errno::EINVAL));
        assert_eq!(o.mode(), OvercommitMode::Guess);
    }
}
