//! usermm: the Linux memory-management core, executable in user space.
//!
//! Layers, bottom up; each module uses only those of its own layer and of
//! the layers beneath it (`tests/layers.rs` reads every `crate::` path of
//! the engine against this list, so that it stays true):
//!
//! 0. Foundations: [`sync`] (atomics and locks, swappable for the model
//!    checker), [`cacheline`], [`errno`], [`page_types`], [`rcu`],
//!    [`tree`] (the maple tree), [`tunable`] (the named run-time switches
//!    that select an algorithm: the kernel's before and after a series),
//!    [`vmstat`] (the counters).
//! 1. Physical memory: [`phys`] (nodes, frames with real bytes, page
//!    descriptors, folios, buddy, the LRU lists of each node, and the
//!    allocator's side of MIGRC and LUF), [`util`] (overcommit accounting).
//! 2. Page tables: [`pgtable`] (x86-64 four-level tables held in frames,
//!    the guards that reach their entries, the page walker).
//! 3. Address spaces: [`mm`] (mm_struct, VMAs, mmap_lock, and the policy
//!    and NUMA-scan state they carry), [`fs`] (inodes, the page cache's
//!    index and mappings of each, open files).
//! 4. Reverse mapping: [`rmap`] (anon_vma and the folio rmap counters).
//! 5. CPUs: [`cpu`] (software TLBs and shootdowns), [`sched`] (kernel
//!    threads on those CPUs).
//! 6. The machine: [`machine`] (a machine's data and knobs, and the
//!    handle through which a thread runs as one of its CPUs).
//! 7. Operations: [`fault`] (the fault entry), [`memory`] (faults, zap,
//!    copy), [`filemap`] (the page cache: reads, readahead, fault-around,
//!    writeback, truncation), [`shmem`] (tmpfs, shared anonymous memory,
//!    memfds), [`huge_memory`], [`mmu_gather`], [`mmap`], [`fork`],
//!    [`mprotect`], [`mremap`], [`msync`], [`madvise`], [`khugepaged`]
//!    (MADV_COLLAPSE), [`mlock`], [`gup`] (populating
//!    a range), [`exec`] with [`binfmt_elf`] and [`vdso`] (a program's
//!    new address space), [`mincore`], [`swap`] (the LRU batches, lazyfree, isolation), [`migrate`] (page migration, `move_pages`) with
//!    [`rmap_walk`] and [`tlbbatch`] (the batched unmap flush),
//!    [`mempolicy`] (`mbind`, `set_mempolicy`), [`numa_balancing`],
//!    [`pt_reclaim`], [`migrc`], [`vmscan`] (reclaim: kswapd, direct
//!    reclaim, demotion, discarding lazyfree folios), [`uaccess`] (loads
//!    and stores), [`syscalls`], and [`init`] (booting a machine, which
//!    installs the hooks through which the allocator reaches up to reclaim
//!    and to the deferred flushes).
//! 8. Statistics and oracles: [`proc`] (status and smaps), [`inspect`],
//!    [`check`] (the invariant checker and the shadow memory).

pub mod cacheline;
pub mod errno;
pub mod page_types;
pub mod phys;
pub mod rcu;
pub mod sync;
pub mod tree;
pub mod tunable;
pub mod vmstat;

pub use errno::{Errno, KResult};
pub mod cpu;
pub mod fs;
pub mod machine;
pub mod mm;
pub mod pgtable;
pub mod rmap;
pub mod rmap_walk;
pub mod sched;
pub use machine::{Machine, MachineConfig, OnCpu, ThpMode};
pub mod binfmt_elf;
pub mod check;
pub mod exec;
pub mod fault;
pub mod filemap;
pub mod fork;
pub mod gup;
pub mod huge_memory;
pub mod init;
pub mod inspect;
pub mod khugepaged;
pub mod madvise;
pub mod memory;
pub mod mempolicy;
pub mod migrate;
pub mod migrc;
pub mod mincore;
pub mod mlock;
pub mod mmap;
pub mod mmu_gather;
pub mod mprotect;
pub mod mremap;
pub mod msync;
pub mod numa_balancing;
pub mod proc;
pub mod pt_reclaim;
pub mod shmem;
pub mod swap;
pub mod syscalls;
pub mod tlbbatch;
pub mod uaccess;
pub mod util;
pub mod vdso;
pub mod vmscan;
