//! usermm: the Linux memory-management core, executable in user space.
//!
//! Layers, bottom up; each uses only those beneath it:
//!
//! 1. [`phys`]: nodes, frames with real bytes, page descriptors, folios, buddy,
//!    the LRU lists of each node.
//! 2. [`pgtable`]: x86-64 four-level page tables held in frames, the guards
//!    that reach their entries, and the page walker.
//! 3. [`mm`]: address spaces (mm_struct), VMAs, mmap_lock.
//! 4. [`rmap`]: anon_vma and the folio rmap counters.
//! 5. [`cpu`]: CPUs with software TLBs and shootdowns; [`sched`]: kernel
//!    threads (kswapd) on those CPUs.
//! 6. Operations: [`fault`] (the fault entry), [`memory`] (faults, zap, copy),
//!    [`mmu_gather`], [`mmap`], [`fork`],
//!    [`mprotect`], [`madvise`], [`huge_memory`], [`swap`] (the LRU batches,
//!    lazyfree, isolation), [`migrate`] (page migration, `move_pages`) with
//!    [`rmap_walk`] and [`tlbbatch`] (the batched unmap flush),
//!    [`mempolicy`] (`mbind`, `set_mempolicy`),
//!    [`vmscan`] (reclaim: kswapd, direct reclaim, demotion, and discarding
//!    lazyfree folios),
//!    [`uaccess`] (loads and stores), [`util`] (overcommit accounting).
//! 7. Statistics: [`vmstat`], [`proc`] (status and smaps), [`inspect`]; and
//!    the oracles in [`check`].
//!
//! Beside them, [`tunable`]: the named run-time switches that select an
//! algorithm (the kernel's before and after a series).

pub mod cacheline;
pub mod errno;
pub mod phys;
pub mod rcu;
pub mod sync;
pub mod tree;
pub mod tunable;
pub mod vmstat;

pub use errno::{Errno, KResult};
pub mod cpu;
pub mod machine;
pub mod mm;
pub mod pgtable;
pub mod rmap;
pub mod rmap_walk;
pub mod sched;
pub use machine::{Machine, MachineConfig, OnCpu, ThpMode};
pub mod check;
pub mod fault;
pub mod fork;
pub mod huge_memory;
pub mod inspect;
pub mod madvise;
pub mod memory;
pub mod mempolicy;
pub mod migrate;
pub mod migrc;
pub mod mmap;
pub mod mmu_gather;
pub mod mprotect;
pub mod numa_balancing;
pub mod proc;
pub mod pt_reclaim;
pub mod swap;
pub mod syscalls;
pub mod tlbbatch;
pub mod uaccess;
pub mod util;
pub mod vmscan;
