//! The THP knobs (`/sys/kernel/mm/transparent_hugepage/`, mm/huge_memory.c's
//! sysfs side): the top-level and per-size `enabled` settings, and the
//! reserve that khugepaged's `set_recommended_min_free_kbytes` keeps while
//! PMD-sized THPs are enabled.

use serde::{Deserialize, Serialize};

use crate::errno::{Errno, KResult};
use crate::phys::PhysMem;
use crate::sync::{Arc, AtomicBool, AtomicU8, Mutex, Ordering};

/// A THP knob's value, as the sysfs files spell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThpMode {
    Always,
    Inherit,
    Madvise,
    Never,
}

impl ThpMode {
    pub fn parse(s: &str) -> Option<ThpMode> {
        match s {
            "always" => Some(ThpMode::Always),
            "inherit" => Some(ThpMode::Inherit),
            "madvise" => Some(ThpMode::Madvise),
            "never" => Some(ThpMode::Never),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ThpMode::Always => "always",
            ThpMode::Inherit => "inherit",
            ThpMode::Madvise => "madvise",
            ThpMode::Never => "never",
        }
    }
    fn from_u8(v: u8) -> ThpMode {
        [
            ThpMode::Always,
            ThpMode::Inherit,
            ThpMode::Madvise,
            ThpMode::Never,
        ][v as usize]
    }
}

/// `transparent_hugepage/shmem_enabled` (`shmem_huge`), and a tmpfs
/// mount's `huge=` (the first four): which shmem files may have large
/// folios.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShmemHuge {
    Always,
    WithinSize,
    Advise,
    Never,
    /// Top level only: no mount has large folios (for emergencies).
    Deny,
    /// Top level only: every mount has PMD-sized ones (for testing).
    Force,
}

impl ShmemHuge {
    const ALL: [ShmemHuge; 6] = [
        ShmemHuge::Always,
        ShmemHuge::WithinSize,
        ShmemHuge::Advise,
        ShmemHuge::Never,
        ShmemHuge::Deny,
        ShmemHuge::Force,
    ];
    pub fn parse(s: &str) -> Option<ShmemHuge> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }
    pub fn name(self) -> &'static str {
        match self {
            ShmemHuge::Always => "always",
            ShmemHuge::WithinSize => "within_size",
            ShmemHuge::Advise => "advise",
            ShmemHuge::Never => "never",
            ShmemHuge::Deny => "deny",
            ShmemHuge::Force => "force",
        }
    }
    fn from_u8(v: u8) -> ShmemHuge {
        Self::ALL[v as usize]
    }
}

/// A size's `hugepages-<size>kB/shmem_enabled`: which of the four order
/// masks (`huge_shmem_orders_always`, `_inherit`, `_within_size`,
/// `_madvise`) holds its order, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShmemOrderMode {
    Always,
    Inherit,
    WithinSize,
    Advise,
    Never,
}

impl ShmemOrderMode {
    const ALL: [ShmemOrderMode; 5] = [
        ShmemOrderMode::Always,
        ShmemOrderMode::Inherit,
        ShmemOrderMode::WithinSize,
        ShmemOrderMode::Advise,
        ShmemOrderMode::Never,
    ];
    pub fn parse(s: &str) -> Option<ShmemOrderMode> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }
    pub fn name(self) -> &'static str {
        match self {
            ShmemOrderMode::Always => "always",
            ShmemOrderMode::Inherit => "inherit",
            ShmemOrderMode::WithinSize => "within_size",
            ShmemOrderMode::Advise => "advise",
            ShmemOrderMode::Never => "never",
        }
    }
    fn from_u8(v: u8) -> ShmemOrderMode {
        Self::ALL[v as usize]
    }
}

/// `/sys/kernel/mm/transparent_hugepage/enabled` and the per-size
/// `hugepages-<size>kB/enabled` files, changeable while the machine runs.
/// Each store is followed, as sysfs's is, by `start_stop_khugepaged`,
/// whose part the model keeps is the reserve: while 2 MiB THPs are
/// enabled the machine keeps the larger one khugepaged recommends
/// ([`PhysMem::set_recommended_min_free_kbytes`]).
pub struct ThpKnobs {
    enabled: AtomicU8,
    per_order: [AtomicU8; 10],
    /// `transparent_hugepage/use_zero_page`: read faults in THP-eligible
    /// ranges map the huge zero page.
    pub use_zero_page: AtomicBool,
    /// `shmem_enabled` (`shmem_huge`).
    shmem_huge: AtomicU8,
    /// The `huge` of the internal mount of shared anonymous memory and
    /// memfds (`SHMEM_SB(shm_mnt)->huge`): the last top-level value
    /// other than `deny` and `force`.
    shm_mnt_huge: AtomicU8,
    /// Each order's `shmem_enabled`.
    shmem_per_order: [AtomicU8; 10],
    /// The memory whose reserve follows the knobs.
    mem: Arc<PhysMem>,
    /// `khugepaged_mutex`: the knobs are read, and the reserve set from
    /// them, under it, so that of two stores the last one's reserve is
    /// the one that stays.
    khugepaged_mutex: Mutex<()>,
}

/// `hugepage_init`: a machine with less memory than this boots with THPs
/// disabled, "where the extra memory used could hurt more than TLB
/// overhead is likely to save".
const THP_MIN_TOTALRAM: u64 = 512 << 20;

impl ThpKnobs {
    /// The kernel's defaults with `CONFIG_TRANSPARENT_HUGEPAGE_MADVISE`:
    /// top level `madvise`, 2 MiB `inherit`, the other sizes `never`; and
    /// the reserve set for them, as `hugepage_init` starts khugepaged at
    /// boot. A machine of less than 512 MiB boots as `hugepage_init`
    /// leaves it: every flag clear (top level `never`, no huge zero page)
    /// and khugepaged not started, so with the machine's own reserve.
    pub(super) fn new(mem: Arc<PhysMem>) -> Self {
        let k = ThpKnobs {
            enabled: AtomicU8::new(ThpMode::Madvise as u8),
            per_order: std::array::from_fn(|_| AtomicU8::new(ThpMode::Never as u8)),
            use_zero_page: AtomicBool::new(true),
            shmem_huge: AtomicU8::new(ShmemHuge::Never as u8),
            shm_mnt_huge: AtomicU8::new(ShmemHuge::Never as u8),
            // `shmem_init`: PMD-sized inherits the top level, the other
            // sizes never.
            shmem_per_order: std::array::from_fn(|o| {
                AtomicU8::new(if o == crate::phys::HPAGE_PMD_ORDER as usize {
                    ShmemOrderMode::Inherit
                } else {
                    ShmemOrderMode::Never
                } as u8)
            }),
            mem,
            khugepaged_mutex: Mutex::new(()),
        };
        k.per_order[crate::phys::HPAGE_PMD_ORDER as usize]
            .store(ThpMode::Inherit as u8, Ordering::Relaxed);
        if k.mem.nr_pages() << crate::phys::PAGE_SHIFT < THP_MIN_TOTALRAM {
            k.enabled.store(ThpMode::Never as u8, Ordering::Relaxed);
            k.use_zero_page.store(false, Ordering::Relaxed);
            return k;
        }
        k.start_stop_khugepaged();
        k
    }

    /// `hugepage_pmd_enabled`: 2 MiB anonymous THPs may be made, by
    /// their own knob or by the top level's through `inherit`, or shmem
    /// ones (`shmem_hpage_pmd_enabled`). (The kernel also counts
    /// read-only file THPs, `CONFIG_READ_ONLY_THP_FOR_FS`, which the
    /// model has not.)
    pub fn hugepage_pmd_enabled(&self) -> bool {
        let anon = match self.order(crate::phys::HPAGE_PMD_ORDER) {
            ThpMode::Always | ThpMode::Madvise => true,
            ThpMode::Inherit => self.enabled() != ThpMode::Never,
            ThpMode::Never => false,
        };
        anon || self.shmem_hpage_pmd_enabled()
    }

    /// `shmem_hpage_pmd_enabled`: PMD-sized shmem folios may be made.
    pub fn shmem_hpage_pmd_enabled(&self) -> bool {
        let top = self.shmem_enabled();
        if top == ShmemHuge::Deny {
            return false;
        }
        match self.shmem_order(crate::phys::HPAGE_PMD_ORDER) {
            ShmemOrderMode::Always | ShmemOrderMode::Advise | ShmemOrderMode::WithinSize => true,
            ShmemOrderMode::Inherit => top != ShmemHuge::Never,
            ShmemOrderMode::Never => false,
        }
    }

    /// `shmem_enabled` (`shmem_huge`).
    pub fn shmem_enabled(&self) -> ShmemHuge {
        ShmemHuge::from_u8(self.shmem_huge.load(Ordering::Relaxed))
    }

    /// `shmem_enabled_store`: the top level, and the internal mount's
    /// `huge` with it unless `deny` or `force`.
    pub fn set_shmem_enabled(&self, huge: ShmemHuge) {
        self.shmem_huge.store(huge as u8, Ordering::Relaxed);
        if !matches!(huge, ShmemHuge::Deny | ShmemHuge::Force) {
            self.shm_mnt_huge.store(huge as u8, Ordering::Relaxed);
        }
        self.start_stop_khugepaged();
    }

    /// The internal shmem mount's `huge`.
    pub fn shm_mnt_huge(&self) -> ShmemHuge {
        ShmemHuge::from_u8(self.shm_mnt_huge.load(Ordering::Relaxed))
    }

    /// A size's `shmem_enabled`.
    pub fn shmem_order(&self, order: u32) -> ShmemOrderMode {
        ShmemOrderMode::from_u8(self.shmem_per_order[order as usize].load(Ordering::Relaxed))
    }

    /// `thpsize_shmem_enabled_store`: shmem's sizes are the page cache's
    /// (orders 1..=9); `inherit` of a size other than PMD's is EINVAL
    /// while the top level is `force`.
    pub fn set_shmem_order(&self, order: u32, mode: ShmemOrderMode) -> KResult<()> {
        if !(1..=crate::phys::HPAGE_PMD_ORDER).contains(&order) {
            return Err(Errno::EINVAL);
        }
        if mode == ShmemOrderMode::Inherit
            && self.shmem_enabled() == ShmemHuge::Force
            && order != crate::phys::HPAGE_PMD_ORDER
        {
            return Err(Errno::EINVAL);
        }
        self.shmem_per_order[order as usize].store(mode as u8, Ordering::Relaxed);
        self.start_stop_khugepaged();
        Ok(())
    }

    /// The orders (bit n = order n) whose `shmem_enabled` is `mode`: the
    /// kernel's `huge_shmem_orders_<mode>` masks.
    pub fn shmem_orders(&self, mode: ShmemOrderMode) -> u32 {
        (1..=crate::phys::HPAGE_PMD_ORDER)
            .filter(|&o| self.shmem_order(o) == mode)
            .fold(0, |m, o| m | 1 << o)
    }

    /// `start_stop_khugepaged`, after every store to a knob: the model
    /// has no khugepaged thread to start or stop, only its reserve.
    fn start_stop_khugepaged(&self) {
        let _khugepaged = self.khugepaged_mutex.lock();
        self.mem
            .set_recommended_min_free_kbytes(self.hugepage_pmd_enabled());
    }

    pub fn enabled(&self) -> ThpMode {
        ThpMode::from_u8(self.enabled.load(Ordering::Relaxed))
    }
    /// Top level: always, madvise or never (inherit is refused, as by sysfs).
    pub fn set_enabled(&self, mode: ThpMode) -> KResult<()> {
        if mode == ThpMode::Inherit {
            return Err(Errno::EINVAL);
        }
        self.enabled.store(mode as u8, Ordering::Relaxed);
        self.start_stop_khugepaged();
        Ok(())
    }
    pub fn order(&self, order: u32) -> ThpMode {
        ThpMode::from_u8(self.per_order[order as usize].load(Ordering::Relaxed))
    }
    /// `hugepages-<size>kB/enabled`; anonymous mTHP orders are 2..=9.
    pub fn set_order(&self, order: u32, mode: ThpMode) -> KResult<()> {
        if !(2..=crate::phys::HPAGE_PMD_ORDER).contains(&order) {
            return Err(Errno::EINVAL);
        }
        self.per_order[order as usize].store(mode as u8, Ordering::Relaxed);
        self.start_stop_khugepaged();
        Ok(())
    }
    /// Set one size to `always` and every other to `never`, the top level to
    /// `never`: the state the folio-size benchmarks want. The reserve is
    /// set once, for the end state (through sysfs each of the writes would
    /// set it, each from the watermarks the last left).
    pub fn only_order(&self, order: u32) {
        self.enabled.store(ThpMode::Never as u8, Ordering::Relaxed);
        for o in 2..=crate::phys::HPAGE_PMD_ORDER {
            self.per_order[o as usize].store(
                if o == order {
                    ThpMode::Always
                } else {
                    ThpMode::Never
                } as u8,
                Ordering::Relaxed,
            );
        }
        self.start_stop_khugepaged();
    }

    /// [`Self::only_order`] for shmem: that size's `shmem_enabled`
    /// `always`, every other size's and the top level `never` (order 0:
    /// all never); the anonymous knobs are left as they are.
    pub fn only_shmem_order(&self, order: u32) {
        self.shmem_huge
            .store(ShmemHuge::Never as u8, Ordering::Relaxed);
        self.shm_mnt_huge
            .store(ShmemHuge::Never as u8, Ordering::Relaxed);
        for o in 1..=crate::phys::HPAGE_PMD_ORDER {
            let mode = if o == order {
                ShmemOrderMode::Always
            } else {
                ShmemOrderMode::Never
            };
            self.shmem_per_order[o as usize].store(mode as u8, Ordering::Relaxed);
        }
        self.start_stop_khugepaged();
    }
}
