//! Layer 3: address spaces (`struct mm_struct`) and their VMAs.
//!
//! # Locking
//!
//! * `mmap_lock` (a reader-writer semaphore, [`mmap_lock`]) guards the VMA
//!   tree's layout and the VMAs' fields: written by mmap, munmap, mprotect,
//!   taken for reading by madvise and by faults under `fault_lock=mmap_lock`.
//!   The tree is also readable with no lock at all, under an epoch guard
//!   (see [`vma`]); faults under `fault_lock=vma_lock` read-lock just their
//!   VMA, and those under `fault_lock=spf` lock nothing and validate against
//!   `mm_lock_seq` ([`mmap_lock`] says how).
//! * `page_table_lock` guards populating the PGD and PUD levels.
//! * The PMD lock (in the PMD table frame's descriptor) guards a PMD table's
//!   entries; the PTE lock (in the PTE table frame's descriptor) guards a PTE
//!   table's entries. Order: mmap_lock, then PMD lock, then PTE lock.
//! * RSS counters are per-CPU counters folded into a global part past a
//!   batch (`percpu_counter`, v6.2+); `pgtables_bytes` is an atomic; the
//!   walkers batch RSS changes per PTE table, as the kernel's
//!   `add_mm_rss_vec` does.

pub mod interval_tree;
pub mod mmap_lock;
pub mod numa_scan;
pub mod pgalloc;
pub mod policy;
pub mod vma;

pub use mmap_lock::MmapLock;

use crate::sync::epoch::{self, Atomic, Guard, Owned, Shared};

pub use vma::{AnonVma, Vma, VmaTree};

use crate::cacheline::LineWriters;
use crate::errno::{Errno, KResult};
use crate::phys::{PhysMem, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::{Arc, AtomicI32, AtomicI64, AtomicU64, CachePadded, Ordering, SpinLock};

/// `TASK_SIZE` for 47-bit user addresses (the top page is never mapped).
pub const TASK_SIZE: u64 = (1 << 47) - PAGE_SIZE;

/// The default `RLIMIT_MEMLOCK` (`MLOCK_LIMIT`, 8 MiB since 5.16). A
/// task starts with `CAP_IPC_LOCK`, as a root one does, which lifts it.
pub const DEFAULT_MEMLOCK_LIMIT: u64 = 8 << 20;
/// `RLIMIT_STACK` of a task that never set it (`_STK_LIM`, 8 MiB): how far
/// a `VM_GROWSDOWN` VMA may grow (`acct_stack_growth`).
pub const DEFAULT_STACK_LIMIT: u64 = 8 << 20;
/// `vm.mmap_min_addr`'s usual value.
pub const MMAP_MIN_ADDR: u64 = 65536;
/// Where top-down placement starts: below the stack and its guard gap (the
/// kernel randomises it; the model does not, so runs are deterministic).
pub const MMAP_BASE: u64 = 0x7f00_0000_0000;
/// `mmap_base` of a process that execs with ASLR off and the default
/// `RLIMIT_STACK` on x86-64: `TASK_SIZE` less the smallest gap the kernel
/// keeps for the stack (128 MiB).
pub const EXEC_MMAP_BASE: u64 = 0x7fff_f7ff_f000;
/// `vm.max_map_count`.
pub const MAX_MAP_COUNT: usize = 65530;

/// `enum { MM_FILEPAGES, MM_ANONPAGES, MM_SWAPENTS, MM_SHMEMPAGES }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum MmCounter {
    FilePages,
    AnonPages,
    SwapEnts,
    ShmemPages,
}
pub const NR_MM_COUNTERS: usize = 4;

/// `mm_counter_file`: the RSS counter of a page-cache folio: shmem's
/// (swap-backed) count as `MM_SHMEMPAGES`, other files' as
/// `MM_FILEPAGES`.
#[inline]
pub fn mm_counter_file(mem: &crate::phys::PhysMem, folio: crate::phys::Folio) -> MmCounter {
    if folio.head(mem).test(crate::phys::pg::SWAPBACKED) {
        MmCounter::ShmemPages
    } else {
        MmCounter::FilePages
    }
}

static MM_ID: AtomicU64 = AtomicU64::new(1);

/// `mm->rss_stat`: one `percpu_counter` per [`MmCounter`] (v6.2+), so that
/// a fault writes its own CPU's line and touches the shared one only when
/// its part passes the batch.
struct RssStat {
    /// The global parts (`fbc->count`), and who folds into them.
    global: CachePadded<([AtomicI64; NR_MM_COUNTERS], LineWriters)>,
    /// Each CPU's part, written only by the thread playing that CPU.
    pcpu: Box<[CachePadded<[AtomicI64; NR_MM_COUNTERS]>]>,
    /// `percpu_counter_batch`: max(32, 2 * CPUs).
    batch: i64,
}

impl RssStat {
    fn new(nr_cpus: usize) -> RssStat {
        RssStat {
            global: CachePadded::new((
                std::array::from_fn(|_| AtomicI64::new(0)),
                LineWriters::new(),
            )),
            pcpu: (0..nr_cpus)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicI64::new(0))))
                .collect(),
            batch: (2 * nr_cpus as i64).max(32),
        }
    }

    /// `percpu_counter_add_batch` on `cpu` ([`crate::sync::NO_CPU`]: the
    /// global part at once). The kernel folds under `fbc->lock`; here one
    /// atomic add does, counted as the lock's two writes of the shared line
    /// (taken and released, `fbc->count` stored meanwhile).
    #[inline]
    fn add(&self, c: MmCounter, delta: i64, cpu: usize) {
        let (global, line) = &*self.global;
        let Some(row) = self.pcpu.get(cpu) else {
            global[c as usize].fetch_add(delta, Ordering::Relaxed);
            line.write();
            line.write();
            return;
        };
        let slot = &row[c as usize];
        // Only this CPU writes its part: a load and a store, as this_cpu_add.
        let v = slot.load(Ordering::Relaxed) + delta;
        if v.abs() >= self.batch {
            global[c as usize].fetch_add(v, Ordering::Relaxed);
            line.write();
            line.write();
            slot.store(0, Ordering::Relaxed);
        } else {
            slot.store(v, Ordering::Relaxed);
        }
    }

    /// `percpu_counter_sum`.
    fn sum(&self, c: MmCounter) -> i64 {
        self.global.0[c as usize].load(Ordering::Relaxed)
            + self
                .pcpu
                .iter()
                .map(|r| r[c as usize].load(Ordering::Relaxed))
                .sum::<i64>()
    }
}

/// `struct mm_struct`.
pub struct Mm {
    /// Identifies the address space in TLB tags (an ASID/PCID stand-in).
    pub id: u64,
    pub mem: Arc<PhysMem>,
    /// The page-table root.
    pub pgd: crate::pgtable::Pgd,
    /// The node its PGD came from (its creating CPU's). Faults allocate on
    /// the faulting CPU's node instead (the default local policy).
    pub home_node: usize,
    /// On a cache line of its own: every lock and unlock writes it, and
    /// faults read the fields beside it.
    pub mmap_lock: CachePadded<MmapLock>,
    tree: Atomic<VmaTree>,
    pub page_table_lock: SpinLock,
    /// `mm->pgtables_bytes`: PTE, PMD and PUD tables (the PGD is not counted).
    pub pgtables_bytes: AtomicI64,
    rss: RssStat,
    /// `mm->hiwater_rss`, in pages.
    pub hiwater_rss: AtomicI64,
    /// `mm_cpumask`: CPUs that have this address space loaded.
    pub cpumask: crate::sync::checked::AtomicU64,
    /// `mm->context.tlb_gen`: bumped by every flush request (x86). Part of
    /// the model-checked shootdown handshake.
    pub tlb_gen: crate::sync::checked::AtomicU64,
    /// `mm->tlb_flush_pending`: mmu_gathers in progress.
    pub tlb_flush_pending: AtomicI32,
    /// The process's NUMA policy (`current->mempolicy`, per thread in the
    /// kernel).
    pub mempolicy: policy::TaskPolicy,
    /// NUMA balancing's scan state (`numa_next_scan`, `numa_scan_offset`).
    pub numa_scan: numa_scan::MmNumaScan,
    /// `mm->tlb_flush_batched`: batched unmap flushes queued for this mm
    /// (low half) and completed (high half); see [`crate::tlbbatch`].
    pub tlb_flush_batched: crate::sync::AtomicU32,
    /// `mm->luf_batch` (LUF): the CPUs that may still cache translations
    /// this mm's migrations cleared without a flush, and their unmap
    /// generation; the forced flushes of [`crate::migrc::luf_flush_mm`]
    /// flush what of it is not done.
    pub luf_batch: crate::sync::Mutex<crate::phys::luf::LufBatch>,
    /// `mm->total_vm`, in pages.
    pub total_vm: AtomicU64,
    /// `mm->locked_vm`: pages of `VM_LOCKED` VMAs.
    pub locked_vm: AtomicU64,
    /// `mm->def_flags`: flags every new VMA gets (`VM_LOCKED` after
    /// `mlockall(MCL_FUTURE)`).
    pub def_flags: AtomicU64,
    /// The task's `RLIMIT_MEMLOCK`, in bytes (`u64::MAX`: unlimited).
    memlock_limit: AtomicU64,
    /// The task's `RLIMIT_STACK`, in bytes (`u64::MAX`: unlimited).
    stack_limit: AtomicU64,
    /// Whether the task has `CAP_IPC_LOCK`, which lifts that limit.
    cap_ipc_lock: crate::sync::AtomicBool,
    /// Set by exit_mmap; no new faults.
    pub dead: crate::sync::AtomicBool,
    /// Where exec put the program's parts: `mmap_base`, brk, the stack's
    /// start. Written under mmap_lock for writing (exec, brk), read under
    /// it.
    layout: crate::sync::Mutex<MmLayout>,
}

/// The fields of `mm_struct` that say where exec put things.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmLayout {
    /// `mmap_base`: where top-down placement starts.
    pub mmap_base: u64,
    /// `start_brk` and `brk`: the heap's start and its current end (the
    /// VMA that holds them is the one /proc shows as `[heap]`).
    pub start_brk: u64,
    pub brk: u64,
    /// `start_stack`: the initial stack pointer (the VMA holding it is
    /// `[stack]`); 0 for a process that was never exec'd.
    pub start_stack: u64,
    /// `start_code`, `end_code`, `start_data`, `end_data`: the program's
    /// segments; `end_data` bounds brk's rlimit check.
    pub start_code: u64,
    pub end_code: u64,
    pub start_data: u64,
    pub end_data: u64,
    /// `arg_start` .. `env_end`: the argument and environment strings.
    pub arg_start: u64,
    pub arg_end: u64,
    pub env_start: u64,
    pub env_end: u64,
}

impl Default for MmLayout {
    /// A process that was never exec'd: no brk, no stack, placement from
    /// [`MMAP_BASE`].
    fn default() -> MmLayout {
        MmLayout {
            mmap_base: MMAP_BASE,
            start_brk: 0,
            brk: 0,
            start_stack: 0,
            start_code: 0,
            end_code: 0,
            start_data: 0,
            end_data: 0,
            arg_start: 0,
            arg_end: 0,
            env_start: 0,
            env_end: 0,
        }
    }
}

impl std::fmt::Debug for Mm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mm#{}", self.id)
    }
}

/// Free a VMA tree version that was unpublished, and what its draft
/// replaced or took out, after a grace period (`call_rcu`): readers that
/// still hold them are pinned, and the callback waits for them.
///
/// # Safety
///
/// `tree` came from the mm's `tree` pointer, no reader can find it or
/// `garbage` any longer, and each is retired once.
unsafe fn retire_tree(tree: *const VmaTree, garbage: vma::TreeGarbage) {
    // SAFETY: the caller's promise: nothing else frees them, and readers
    // that found them are pinned, which the grace period waits for.
    unsafe {
        crate::rcu::call_rcu_unchecked(move || {
            drop(Shared::from(tree).into_owned());
            garbage.free();
        })
    }
}

impl Drop for Mm {
    /// `__mmdrop` → `mm_free_pgd`: the last reference is gone (no CPU has
    /// the mm loaded: each holds one while it does). The lower tables went
    /// with exit_mmap; an mm dropped without it keeps them and its PGD (a
    /// leak of the caller's making, but never a frame freed while mapped).
    fn drop(&mut self) {
        // The last published tree still holds its VMAs' counts (an mm
        // that went through exit_mmap has none left): give them back after
        // a grace period, as a removal would, and free the tree with them.
        let guard = epoch::pin();
        let last = self.tree.swap(Shared::null(), Ordering::AcqRel, &guard);
        if !last.is_null() {
            // SAFETY: the pointer is non-null and still valid: it is freed
            // only below, deferred.
            let mut all = unsafe { last.deref() }.draft(None);
            all.remove_all();
            let (_, garbage) = all.publishable();
            // SAFETY: the tree is unreachable now, and this is its only
            // retirement.
            unsafe { retire_tree(last.as_raw(), garbage) };
        }
        if self.pgtables_bytes.load(Ordering::Relaxed) == 0 {
            // SAFETY: no lower table is left (none is counted), no CPU has
            // the mm loaded (each holds a reference while it does), and the
            // PGD goes with the mm.
            unsafe { self.pgd.free(&self.mem, self.mem.vmstat.no_cpu()) };
        }
    }
}

impl Mm {
    /// `mm_alloc` + `mm_init`: an empty address space with its PGD.
    pub fn new(mem: Arc<PhysMem>, home_node: usize, cpu: usize) -> KResult<Arc<Mm>> {
        let pgd = crate::pgtable::Pgd::alloc(&mem, home_node, cpu).ok_or(Errno::ENOMEM)?;
        let mem_cpus = mem.vmstat.no_cpu();
        Ok(Arc::new(Mm {
            id: MM_ID.fetch_add(1, Ordering::Relaxed),
            mem,
            pgd,
            home_node,
            mmap_lock: CachePadded::new(MmapLock::new()),
            tree: Atomic::new(VmaTree::default()),
            page_table_lock: SpinLock::new(),
            pgtables_bytes: AtomicI64::new(0),
            rss: RssStat::new(mem_cpus),
            hiwater_rss: AtomicI64::new(0),
            cpumask: crate::sync::checked::AtomicU64::new(0),
            tlb_gen: crate::sync::checked::AtomicU64::new(1),
            tlb_flush_pending: AtomicI32::new(0),
            tlb_flush_batched: crate::sync::AtomicU32::new(0),
            luf_batch: Default::default(),
            mempolicy: Default::default(),
            numa_scan: Default::default(),
            total_vm: AtomicU64::new(0),
            locked_vm: AtomicU64::new(0),
            def_flags: AtomicU64::new(0),
            memlock_limit: AtomicU64::new(DEFAULT_MEMLOCK_LIMIT),
            stack_limit: AtomicU64::new(DEFAULT_STACK_LIMIT),
            cap_ipc_lock: crate::sync::AtomicBool::new(true),
            dead: crate::sync::AtomicBool::new(false),
            layout: crate::sync::Mutex::new(MmLayout::default()),
        }))
    }

    /// `rlimit(RLIMIT_MEMLOCK)`, in bytes.
    pub fn memlock_limit(&self) -> u64 {
        self.memlock_limit.load(Ordering::Relaxed)
    }

    /// `capable(CAP_IPC_LOCK)`.
    pub fn cap_ipc_lock(&self) -> bool {
        self.cap_ipc_lock.load(Ordering::Relaxed)
    }

    /// `setrlimit(RLIMIT_MEMLOCK)`.
    pub fn set_memlock_limit(&self, bytes: u64) {
        self.memlock_limit.store(bytes, Ordering::Relaxed);
    }

    /// `rlimit(RLIMIT_STACK)`, in bytes.
    pub fn stack_limit(&self) -> u64 {
        self.stack_limit.load(Ordering::Relaxed)
    }

    /// `setrlimit(RLIMIT_STACK)`.
    pub fn set_stack_limit(&self, bytes: u64) {
        self.stack_limit.store(bytes, Ordering::Relaxed);
    }

    /// The process's layout (brk, stack, `mmap_base`).
    pub fn layout(&self) -> MmLayout {
        *self.layout.lock()
    }

    /// Change the layout, under mmap_lock held for writing.
    pub fn set_layout(&self, _held: &mmap_lock::MmapWriteGuard<'_>, f: impl FnOnce(&mut MmLayout)) {
        f(&mut self.layout.lock());
    }

    /// `dup_mm`'s copy of the parent's layout, into a child no one else
    /// sees yet.
    pub fn copy_layout_from(&self, parent: &Mm) {
        *self.layout.lock() = parent.layout();
    }

    /// `mm->mmap_base`.
    pub fn mmap_base(&self) -> u64 {
        self.layout.lock().mmap_base
    }

    /// Give the task `CAP_IPC_LOCK`, or drop it.
    pub fn set_cap_ipc_lock(&self, on: bool) {
        self.cap_ipc_lock.store(on, Ordering::Relaxed);
    }

    /// The current VMA tree, for a reader that holds mmap_lock or an epoch
    /// guard; the guard keeps the returned version alive.
    pub fn vma_tree<'g>(&self, guard: &'g Guard) -> &'g VmaTree {
        let p = self.tree.load(Ordering::Acquire, guard);
        // SAFETY: the pointer is never null (set in new(), replaced only by
        // non-null values), and the version it names is destroyed only after
        // every guard pinned when it was unpublished has been dropped.
        unsafe { p.deref() }
    }

    /// Publish a draft of the VMA tree; the draft stays a draft of what
    /// was published. mmap_lock must be held for writing.
    pub fn vma_tree_publish(&self, draft: &mut VmaTree, guard: &Guard) {
        debug_assert!(
            self.mmap_lock.is_locked_exclusive(),
            "VMA tree changed without mmap_lock held for writing"
        );
        // The full check is O(n) per publish: debug builds make it while the
        // tree is small, so that address spaces grown to max_map_count stay
        // O(n log n) to build (the invariant checker still walks them all).
        debug_assert!(
            draft.edits_write_locked(),
            "{self:?}: a VMA changed without vma_start_write"
        );
        #[cfg(debug_assertions)]
        if draft.len() <= 4096 {
            if let Err(e) = draft.check() {
                panic!("{self:?}: publishing a broken VMA tree: {e}");
            }
        }
        let (tree, garbage) = draft.publishable();
        // Release: readers that load the new pointer see the tree's contents.
        let old = self.tree.swap(Owned::new(tree), Ordering::AcqRel, guard);
        // SAFETY: `old` is unreachable from now on for new readers, and so
        // are the nodes and VMAs the draft replaced or took out. This is
        // the only garbage of this publication.
        unsafe { retire_tree(old.as_raw(), garbage) };
    }

    /// A draft of the tree for a writer, which holds mmap_lock for writing,
    /// to edit and then publish (see [`vma`] for why the lock).
    pub fn vma_tree_draft(&self) -> VmaTree {
        debug_assert!(
            self.mmap_lock.is_locked_exclusive(),
            "VMA tree drafted without mmap_lock held for writing"
        );
        let guard = epoch::pin();
        self.vma_tree(&guard).draft(Some(self.mmap_lock.seq.raw()))
    }

    pub fn map_count(&self) -> usize {
        self.vma_tree(&epoch::pin()).len()
    }

    /// `get_mm_counter_sum`: the exact count (the global part and every
    /// CPU's); a snapshot while CPUs change it.
    #[inline]
    pub fn get_rss(&self, c: MmCounter) -> i64 {
        self.rss.sum(c)
    }

    /// `add_mm_counter`: on the calling CPU's part of the counter
    /// (`percpu_counter_add`), folded into the global part past the batch.
    #[inline]
    pub fn add_rss(&self, c: MmCounter, delta: i64) {
        if delta != 0 {
            let cpu = crate::sync::this_cpu(self.mem.machine_id());
            self.rss.add(c, delta, cpu);
        }
    }

    /// `update_hiwater_rss`: raise the high-water mark to the RSS now
    /// (before RSS is lowered: the mark is not kept on every fault).
    pub fn update_hiwater_rss(&self) {
        self.hiwater_rss
            .fetch_max(self.rss_pages(), Ordering::Relaxed);
    }

    /// `add_mm_rss_vec`.
    pub fn add_rss_vec(&self, rss: &[i64; NR_MM_COUNTERS]) {
        self.add_rss(MmCounter::FilePages, rss[0]);
        self.add_rss(MmCounter::AnonPages, rss[1]);
        self.add_rss(MmCounter::SwapEnts, rss[2]);
        self.add_rss(MmCounter::ShmemPages, rss[3]);
    }

    /// `get_mm_rss`.
    pub fn rss_pages(&self) -> i64 {
        self.get_rss(MmCounter::FilePages)
            + self.get_rss(MmCounter::AnonPages)
            + self.get_rss(MmCounter::ShmemPages)
    }

    /// `mm_inc_nr_ptes` and its PMD/PUD siblings: one table more.
    #[inline]
    pub fn inc_nr_tables(&self) {
        self.pgtables_bytes
            .fetch_add(PAGE_SIZE as i64, Ordering::Relaxed);
    }

    #[inline]
    pub fn dec_nr_tables(&self) {
        let old = self
            .pgtables_bytes
            .fetch_sub(PAGE_SIZE as i64, Ordering::Relaxed);
        debug_assert!(
            old >= PAGE_SIZE as i64,
            "{self:?}: pgtables_bytes underflow"
        );
    }

    /// `inc_tlb_flush_pending`.
    pub fn inc_tlb_flush_pending(&self) {
        self.tlb_flush_pending.fetch_add(1, Ordering::AcqRel);
    }

    pub fn dec_tlb_flush_pending(&self) {
        self.tlb_flush_pending.fetch_sub(1, Ordering::AcqRel);
    }

    /// `mm_tlb_flush_nested`: another gather runs on this mm as well.
    pub fn tlb_flush_nested(&self) -> bool {
        self.tlb_flush_pending.load(Ordering::Acquire) > 1
    }

    pub fn vm_pages_to_kb(pages: u64) -> u64 {
        pages << (PAGE_SHIFT - 10)
    }
}
