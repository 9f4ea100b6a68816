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
    /// their own knob or by the top level's through `inherit`. (The
    /// kernel also counts shmem's and read-only file THPs, which the
    /// model has not.)
    pub fn hugepage_pmd_enabled(&self) -> bool {
        match self.order(crate::phys::HPAGE_PMD_ORDER) {
            ThpMode::Always | ThpMode::Madvise => true,
            ThpMode::Inherit => self.enabled() != ThpMode::Never,
            ThpMode::Never => false,
        }
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
}
