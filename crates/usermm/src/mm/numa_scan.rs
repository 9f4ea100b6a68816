//! An address space's NUMA-balancing scan state (include/linux/mm_types.h's
//! `numa_next_scan`, `numa_scan_offset`, `numa_scan_seq`, and the task's
//! fields the model keeps per mm): data only; the scan and the hinting
//! faults that use it are [`crate::numa_balancing`]'s.

use crate::sync::{AtomicU64, Mutex};

/// Per address space: when it is next scanned, where the scan resumes and
/// how many passes it has made (`mm->numa_next_scan`,
/// `mm->numa_scan_offset`, `mm->numa_scan_seq`); and the task's side,
/// which the kernel keeps per thread: the time between scans
/// (`p->numa_scan_period`; 0 until the first scan is due) and the hinting
/// faults it records ([`task_numa_fault`](crate::numa_balancing::task_numa_fault)).
#[derive(Default)]
pub struct MmNumaScan {
    pub next_scan: AtomicU64,
    pub offset: AtomicU64,
    pub seq: AtomicU64,
    pub period_ms: AtomicU64,
    pub(crate) faults: Mutex<TaskNumaFaults>,
}

/// A task's hinting-fault statistics: the pass it last looked at them in
/// (`p->numa_scan_seq`), the locality of the faults since its period last
/// moved by their ratio (`numa_faults_locality`: remote, local, failed
/// migrations), and its private faults since it last looked
/// (`task_numa_placement`'s fault types, from `numa_faults`' buffers; the
/// model records no shared ones).
#[derive(Default)]
pub(crate) struct TaskNumaFaults {
    pub(crate) seq: u64,
    pub(crate) locality: [u64; 3],
    pub(crate) private: u64,
}
