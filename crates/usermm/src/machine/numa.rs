//! NUMA balancing's knobs (kernel/sched/fair.c's sysctls and debugfs
//! files): data the machine holds; the scan and the hinting faults that
//! read them are [`crate::numa_balancing`]'s, which re-exports them.

use crate::sync::{AtomicU64, AtomicU8, Ordering};

/// `NUMA_BALANCING_NORMAL`.
pub const NUMA_BALANCING_NORMAL: u8 = 1;
/// `NUMA_BALANCING_MEMORY_TIERING`.
pub const NUMA_BALANCING_MEMORY_TIERING: u8 = 2;

/// The knobs: `/proc/sys/kernel/numa_balancing`, the debugfs scan knobs
/// (`/sys/kernel/debug/sched/numa_balancing/*`) and the tiering sysctls,
/// with the kernel's defaults.
pub struct NumaKnobs {
    /// `numa_balancing`: 0 off (the host's default), 1 normal, 2 memory
    /// tiering, 3 both. The model implements the tiering mode; normal mode
    /// scans and counts hint faults but migrates nothing.
    pub mode: AtomicU8,
    /// `scan_delay_ms`: before a process's first scan.
    pub scan_delay_ms: AtomicU64,
    /// `scan_period_min_ms`: the shortest time in which the scan is to
    /// cover the process's resident memory; divided among the scans that
    /// takes ([`task_scan_min`](crate::numa_balancing::task_scan_min)).
    pub scan_period_min_ms: AtomicU64,
    /// `scan_period_max_ms`: the longest, likewise ([`task_scan_max`](crate::numa_balancing::task_scan_max)).
    pub scan_period_max_ms: AtomicU64,
    /// `scan_size_mb`: how much of the address space one scan marks.
    pub scan_size_mb: AtomicU64,
    /// `numa_balancing_hot_threshold_ms`.
    pub hot_threshold_ms: AtomicU64,
    /// `numa_balancing_promote_rate_limit_MBps`.
    pub promote_rate_limit_mbps: AtomicU64,
}

impl Default for NumaKnobs {
    fn default() -> Self {
        NumaKnobs {
            mode: AtomicU8::new(0),
            scan_delay_ms: AtomicU64::new(1000),
            scan_period_min_ms: AtomicU64::new(1000),
            scan_period_max_ms: AtomicU64::new(60000),
            scan_size_mb: AtomicU64::new(256),
            hot_threshold_ms: AtomicU64::new(1000),
            promote_rate_limit_mbps: AtomicU64::new(65536),
        }
    }
}

impl NumaKnobs {
    pub fn tiering(&self) -> bool {
        self.mode.load(Ordering::Relaxed) & NUMA_BALANCING_MEMORY_TIERING != 0
    }

    pub fn enabled(&self) -> bool {
        self.mode.load(Ordering::Relaxed) != 0
    }
}
