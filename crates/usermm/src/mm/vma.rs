//! `struct vm_area_struct`, its flags, and the VMA tree.
//!
//! # The tree and its readers
//!
//! The kernel keeps VMAs in a maple tree whose readers need no lock (RCU).
//! The model keeps a sorted array of VMAs, published through an
//! epoch-protected pointer ([`VmaTree`] behind `crossbeam_epoch::Atomic`):
//! writers, holding mmap_lock for writing, build a new array and swap it in;
//! the old one is freed only after every reader pinned at the time is done.
//! Lookups are binary searches. A reader without mmap_lock may see a VMA
//! whose bounds are being changed (a split adjusts `vm_start`/`vm_end` in
//! place, as `vma_adjust` does), so such readers must revalidate under a lock
//! or a sequence count, exactly as in the kernel.

use std::sync::{OnceLock, Weak};

use crate::pgtable::Pgprot;
use crate::sync::{Arc, AtomicU64, Mutex, Ordering, RwLock};

pub type VmFlags = u64;
pub const VM_NONE: VmFlags = 0;
pub const VM_READ: VmFlags = 0x1;
pub const VM_WRITE: VmFlags = 0x2;
pub const VM_EXEC: VmFlags = 0x4;
pub const VM_SHARED: VmFlags = 0x8;
pub const VM_MAYREAD: VmFlags = 0x10;
pub const VM_MAYWRITE: VmFlags = 0x20;
pub const VM_MAYEXEC: VmFlags = 0x40;
pub const VM_MAYSHARE: VmFlags = 0x80;
pub const VM_GROWSDOWN: VmFlags = 0x100;
pub const VM_LOCKED: VmFlags = 0x2000;
pub const VM_DONTCOPY: VmFlags = 0x20000;
pub const VM_ACCOUNT: VmFlags = 0x100000;
pub const VM_NORESERVE: VmFlags = 0x200000;
pub const VM_HUGEPAGE: VmFlags = 0x20000000;
pub const VM_NOHUGEPAGE: VmFlags = 0x40000000;
pub const VM_ACCESS_FLAGS: VmFlags = VM_READ | VM_WRITE | VM_EXEC;

/// `vm_get_page_prot` for private mappings: a private writable mapping gets
/// read-only entries; the write fault makes them writable (COW).
pub fn vm_get_page_prot(flags: VmFlags) -> Pgprot {
    let exec = flags & VM_EXEC != 0;
    match (flags & (VM_READ | VM_WRITE | VM_EXEC | VM_SHARED), exec) {
        (0, _) => Pgprot::NONE,
        (f, true) if f & VM_SHARED != 0 && f & VM_WRITE != 0 => Pgprot::SHARED_EXEC,
        (f, false) if f & VM_SHARED != 0 && f & VM_WRITE != 0 => Pgprot::SHARED,
        (_, true) => Pgprot::READONLY_EXEC,
        (_, false) => Pgprot::READONLY,
    }
}

static ANON_VMA_ID: AtomicU64 = AtomicU64::new(1);

/// `struct anon_vma`: the set of VMAs whose pages an anonymous folio may be
/// mapped in. The model keeps the interval tree of anon_vma_chains (the
/// `rb_root`) as a list of VMAs, guarded by the anon_vma's rwsem (the kernel
/// uses the root anon_vma's lock for the whole family).
pub struct AnonVma {
    pub id: u64,
    /// The anon_vma of the VMA this one's VMA was forked from.
    pub parent: Option<Arc<AnonVma>>,
    /// Every VMA chained to this anon_vma: its own, its splits and its
    /// forked descendants'.
    pub vmas: RwLock<Vec<Weak<Vma>>>,
}

impl AnonVma {
    pub fn new(parent: Option<Arc<AnonVma>>) -> Arc<AnonVma> {
        Arc::new(AnonVma {
            id: ANON_VMA_ID.fetch_add(1, Ordering::Relaxed),
            parent,
            vmas: RwLock::new(Vec::new()),
        })
    }

    /// Does the chain hold `vma`?
    pub fn has_vma(&self, vma: &Vma) -> bool {
        self.vmas
            .read()
            .iter()
            .any(|w| std::ptr::eq(w.as_ptr(), vma))
    }
}

/// `struct vm_area_struct`. Bounds and flags are atomics: writers change
/// them only with mmap_lock held for writing, but lockless readers (the
/// hardware walker never, speculative faults later) may read them at any time.
pub struct Vma {
    /// `vm_mm`, by id.
    pub mm_id: u64,
    vm_start: AtomicU64,
    vm_end: AtomicU64,
    /// For anonymous VMAs, `vm_start >> PAGE_SHIFT` at creation; kept across
    /// splits so that a folio's index stays valid.
    vm_pgoff: AtomicU64,
    vm_flags: AtomicU64,
    /// The anon_vma new folios of this VMA attach to; set once, by
    /// `anon_vma_prepare` on the first fault, or by fork or a split.
    pub anon_vma: OnceLock<Arc<AnonVma>>,
    /// `anon_vma_chain`: every anon_vma this VMA is chained to (its own and
    /// its ancestors'), so that it can be unlinked from them all.
    pub anon_vma_chain: Mutex<Vec<Arc<AnonVma>>>,
}

impl std::fmt::Debug for Vma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Vma({:#x}-{:#x} flags={:#x})",
            self.start(),
            self.end(),
            self.flags()
        )
    }
}

impl Vma {
    pub fn new(mm_id: u64, start: u64, end: u64, flags: VmFlags, pgoff: u64) -> Vma {
        Vma {
            mm_id,
            vm_start: AtomicU64::new(start),
            vm_end: AtomicU64::new(end),
            vm_pgoff: AtomicU64::new(pgoff),
            vm_flags: AtomicU64::new(flags),
            anon_vma: OnceLock::new(),
            anon_vma_chain: Mutex::new(Vec::new()),
        }
    }

    #[inline]
    pub fn start(&self) -> u64 {
        self.vm_start.load(Ordering::Relaxed)
    }
    #[inline]
    pub fn end(&self) -> u64 {
        self.vm_end.load(Ordering::Relaxed)
    }
    #[inline]
    pub fn pgoff(&self) -> u64 {
        self.vm_pgoff.load(Ordering::Relaxed)
    }
    #[inline]
    pub fn flags(&self) -> VmFlags {
        self.vm_flags.load(Ordering::Relaxed)
    }
    #[inline]
    pub fn page_prot(&self) -> Pgprot {
        vm_get_page_prot(self.flags())
    }
    #[inline]
    pub fn contains(&self, addr: u64) -> bool {
        self.start() <= addr && addr < self.end()
    }
    pub fn anon_vma(&self) -> Option<&Arc<AnonVma>> {
        self.anon_vma.get()
    }

    /// Writers only (mmap_lock held for writing).
    pub fn set_start(&self, start: u64) {
        self.vm_start.store(start, Ordering::Relaxed)
    }
    pub fn set_end(&self, end: u64) {
        self.vm_end.store(end, Ordering::Relaxed)
    }
    pub fn set_pgoff(&self, pgoff: u64) {
        self.vm_pgoff.store(pgoff, Ordering::Relaxed)
    }
    pub fn set_flags(&self, flags: VmFlags) {
        self.vm_flags.store(flags, Ordering::Relaxed)
    }

    /// The address of page `pgoff` of this VMA's linear mapping
    /// (`vma_address`), if it falls inside the VMA.
    pub fn address_of(&self, pgoff: u64) -> Option<u64> {
        let addr = self
            .start()
            .checked_add(pgoff.checked_sub(self.pgoff())? << crate::phys::PAGE_SHIFT)?;
        (addr < self.end()).then_some(addr)
    }

    /// `linear_page_index`.
    #[inline]
    pub fn linear_page_index(&self, addr: u64) -> u64 {
        ((addr - self.start()) >> crate::phys::PAGE_SHIFT) + self.pgoff()
    }
}

/// One published version of the VMA tree: VMAs sorted by address, disjoint.
#[derive(Default, Clone)]
pub struct VmaTree {
    pub vmas: Vec<Arc<Vma>>,
}

impl VmaTree {
    /// Index of the first VMA that ends above `addr` (`find_vma`).
    pub fn find_index(&self, addr: u64) -> usize {
        self.vmas.partition_point(|v| v.end() <= addr)
    }

    /// `find_vma`: the first VMA with `vm_end > addr`.
    pub fn find_vma(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.vmas.get(self.find_index(addr))
    }

    /// `vma_lookup`: the VMA that contains `addr`.
    pub fn vma_lookup(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.find_vma(addr).filter(|v| v.start() <= addr)
    }

    /// `find_vma_intersection`.
    pub fn find_vma_intersection(&self, start: u64, end: u64) -> Option<&Arc<Vma>> {
        self.find_vma(start).filter(|v| v.start() < end)
    }

    /// VMAs that intersect `[start, end)`, as a range of indices.
    pub fn range(&self, start: u64, end: u64) -> std::ops::Range<usize> {
        let first = self.find_index(start);
        let last = self.vmas.partition_point(|v| v.start() < end);
        first..last.max(first)
    }

    /// The VMA just below `addr`'s VMA slot (`vma_prev`).
    pub fn prev_of(&self, idx: usize) -> Option<&Arc<Vma>> {
        idx.checked_sub(1).and_then(|i| self.vmas.get(i))
    }

    pub fn insert(&mut self, vma: Arc<Vma>) {
        let idx = self.vmas.partition_point(|v| v.start() < vma.start());
        debug_assert!(
            idx == 0 || self.vmas[idx - 1].end() <= vma.start(),
            "overlapping VMA {vma:?}"
        );
        debug_assert!(
            idx == self.vmas.len() || self.vmas[idx].start() >= vma.end(),
            "overlapping VMA {vma:?}"
        );
        self.vmas.insert(idx, vma);
    }

    pub fn check(&self) {
        for w in self.vmas.windows(2) {
            assert!(
                w[0].end() <= w[1].start(),
                "VMAs out of order: {:?} {:?}",
                w[0],
                w[1]
            );
        }
        for v in &self.vmas {
            assert!(v.start() < v.end(), "empty VMA {v:?}");
        }
    }
}
