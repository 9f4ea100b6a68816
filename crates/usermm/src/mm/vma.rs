//! `struct vm_area_struct`, its flags, and the VMA tree.
//!
//! # The tree and its readers
//!
//! The kernel keeps VMAs in a maple tree whose readers need no lock (RCU).
//! The model keeps them in a persistent search tree ([`crate::tree`]),
//! published through an epoch-protected pointer (`Mm::vma_tree`): a writer,
//! holding mmap_lock for writing, edits a private version (O(log n) per
//! change, sharing every untouched node with the published one) and swaps it
//! in whole; the old version is freed only after every reader pinned at the
//! time is done.
//!
//! A published VMA is never edited: a split, a merge or a change of flags
//! makes new VMAs (`vm_area_dup`) and detaches the old ones, which readers
//! still holding the old tree go on seeing, whole and consistent. The kernel
//! instead edits a VMA in place after write-locking it (`vma_start_write`),
//! which makes per-VMA-lock readers fall back to mmap_lock. Here, a draft
//! write-locks every VMA it takes out or puts in ([`super::mmap_lock`]), so
//! that a fault under a VMA's lock is never at work in a range a writer is
//! changing; a reader that finds a VMA marked [`Vma::is_detached`] knows it
//! lost such a race.
//!
//! # Who keeps a VMA alive
//!
//! The tree's nodes hold VMAs as [`TreeVma`]: copies of an `Arc<Vma>` that
//! own no count, so that copying a node on the write path, and freeing an
//! old version, touch only the node and never the VMAs it names (with the
//! counts in the nodes, each update touched the 16 VMAs of its leaf twice,
//! and at 65,000 VMAs those cache misses were most of an mmap). Instead,
//! every VMA in the published tree holds one count on behalf of every
//! version that names it, as the kernel's maple tree holds bare pointers
//! and frees a VMA by RCU once it has left the tree (`vm_area_free`):
//!
//! * a writer edits a draft ([`crate::mm::Mm::vma_tree_draft`], with
//!   mmap_lock held for writing, so that no other draft is published
//!   meanwhile); the draft keeps the count of each VMA it inserts, and
//!   notes each VMA it takes out;
//! * publishing hands the inserted counts to the published tree, and gives
//!   back the counts of the VMAs taken out one grace period later, when no
//!   reader can still hold a version that names them;
//! * a draft dropped unpublished gives back the counts it took and leaves
//!   the rest alone: the published tree still names those VMAs.
//!
//! Anyone who needs a VMA beyond an epoch pin or mmap_lock clones the
//! `Arc<Vma>` the tree lends.

use std::mem::ManuallyDrop;

use crate::sync::OnceLock;
use smallvec::SmallVec;

use crate::pgtable::Pgprot;
use crate::phys::PAGE_SHIFT;
use crate::sync::{Arc, CachePadded, Mutex};

use super::mmap_lock::VmaLock;
use crate::tree::{Entry, NodeRef, Retired, Tree};

pub use crate::mm::interval_tree::{AnonVma, AnonVmaChain};

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
/// `stack_guard_gap`: the room kept free below a `VM_GROWSDOWN` VMA, into
/// which no other mapping is placed and past which it does not grow (256
/// pages, the kernel's default).
pub const STACK_GUARD_GAP: u64 = 256 << PAGE_SHIFT;
/// `VM_PFNMAP`: raw page frames, no `struct page` behind them (vvar).
pub const VM_PFNMAP: VmFlags = 0x400;
pub const VM_LOCKED: VmFlags = 0x2000;
/// `VM_IO`: memory-mapped I/O or the like; never dumped, locked or merged.
pub const VM_IO: VmFlags = 0x4000;
/// Lock pages as they are faulted in (`mlock2(MLOCK_ONFAULT)`), not at once.
pub const VM_LOCKONFAULT: VmFlags = 0x80000;
pub const VM_LOCKED_MASK: VmFlags = VM_LOCKED | VM_LOCKONFAULT;
pub const VM_DONTCOPY: VmFlags = 0x20000;
/// `VM_DONTEXPAND`: mremap may not grow it (special mappings).
pub const VM_DONTEXPAND: VmFlags = 0x40000;
pub const VM_ACCOUNT: VmFlags = 0x100000;
pub const VM_NORESERVE: VmFlags = 0x200000;
/// `VM_WIPEONFORK`: the child of a fork gets this range empty.
pub const VM_WIPEONFORK: VmFlags = 0x02000000;
/// `VM_DONTDUMP`: left out of core dumps.
pub const VM_DONTDUMP: VmFlags = 0x04000000;

pub const VM_HUGEPAGE: VmFlags = 0x20000000;
pub const VM_NOHUGEPAGE: VmFlags = 0x40000000;
pub const VM_ACCESS_FLAGS: VmFlags = VM_READ | VM_WRITE | VM_EXEC;
/// `VM_DATA_DEFAULT_FLAGS` on x86-64 (no `READ_IMPLIES_EXEC`): brk's and
/// bss's flags, and the stack's before `VM_GROWSDOWN`.
pub const VM_DATA_DEFAULT_FLAGS: VmFlags =
    VM_READ | VM_WRITE | VM_MAYREAD | VM_MAYWRITE | VM_MAYEXEC;
/// `VM_SPECIAL`: VMAs that mlock, merging and mremap's growth leave
/// alone (the kernel's also has `VM_MIXEDMAP`, which nothing here makes).
pub const VM_SPECIAL: VmFlags = VM_IO | VM_DONTEXPAND | VM_PFNMAP;

/// `struct vm_special_mapping`: a mapping of the kernel's own pages that
/// exec installs (the vDSO and its data), named in /proc by `name`.
#[derive(Debug, PartialEq, Eq)]
pub struct SpecialMapping {
    pub name: &'static str,
}

/// `vm_get_page_prot` for private mappings: a private writable mapping gets
/// read-only entries; the write fault makes them writable (COW).
pub fn vm_get_page_prot(flags: VmFlags) -> Pgprot {
    let exec = flags & VM_EXEC != 0;
    if flags & VM_ACCESS_FLAGS == 0 {
        // PROT_NONE, shared or not.
        return Pgprot::NONE;
    }
    match (flags & (VM_READ | VM_WRITE | VM_EXEC | VM_SHARED), exec) {
        (f, true) if f & VM_SHARED != 0 && f & VM_WRITE != 0 => Pgprot::SHARED_EXEC,
        (f, false) if f & VM_SHARED != 0 && f & VM_WRITE != 0 => Pgprot::SHARED,
        (_, true) => Pgprot::READONLY_EXEC,
        (_, false) => Pgprot::READONLY,
    }
}

/// `struct vm_area_struct`. Bounds, offset and flags are fixed for the
/// VMA's life: a change makes a new VMA (see the module doc).
pub struct Vma {
    /// `vm_mm`, by id.
    pub mm_id: u64,
    vm_start: u64,
    vm_end: u64,
    /// For anonymous VMAs, `vm_start >> PAGE_SHIFT` at creation; kept across
    /// splits so that a folio's index stays valid. For file VMAs, the
    /// file page mapped at `vm_start`.
    vm_pgoff: u64,
    vm_flags: VmFlags,
    /// The anon_vma new folios of this VMA attach to; set once, by
    /// `anon_vma_prepare` on the first fault, or by fork or a split.
    pub anon_vma: OnceLock<Arc<AnonVma>>,
    /// `anon_vma_chain`: every anon_vma this VMA is chained to (its own and
    /// its ancestors'), so that it can be unlinked from them all.
    pub anon_vma_chain: Mutex<Vec<AnonVmaChain>>,
    /// `vm_policy`: the NUMA policy `mbind` gave the range; None for the
    /// process's (see [`crate::mempolicy`]).
    vm_policy: Option<Arc<crate::mm::policy::Mempolicy>>,
    /// `vm_file`: the file mapped, None for anonymous memory. Its page
    /// `vm_pgoff` is mapped at `vm_start`.
    vm_file: Option<Arc<crate::fs::File>>,
    /// `vm_ops` of a special mapping (`special_mapping_vmops` with its
    /// `vm_special_mapping`); None for every other VMA.
    vm_special: Option<&'static SpecialMapping>,
    /// `vm_refcnt` and `vm_lock_seq`: the per-VMA lock, whose count is 0
    /// while the VMA is out of the tree. On a cache line of its own, as the
    /// kernel's `vm_refcnt` is (`____cacheline_aligned_in_smp`): faults in
    /// the VMA write it and read the fields above.
    pub vm_lock: CachePadded<VmaLock>,
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
        debug_assert!(start < end, "empty VMA {start:#x}-{end:#x}");
        Vma {
            mm_id,
            vm_start: start,
            vm_end: end,
            vm_pgoff: pgoff,
            vm_flags: flags,
            anon_vma: OnceLock::new(),
            anon_vma_chain: Mutex::new(Vec::new()),
            vm_policy: None,
            vm_file: None,
            vm_special: None,
            vm_lock: CachePadded::new(VmaLock::new()),
        }
    }

    /// This VMA with a NUMA policy (before it is published).
    pub fn with_policy(mut self, pol: Option<Arc<crate::mm::policy::Mempolicy>>) -> Vma {
        self.vm_policy = pol;
        self
    }

    /// This VMA mapping `file` (before it is published; the caller links
    /// it into the file's `i_mmap` once it is an `Arc`).
    pub fn with_file(mut self, file: Option<Arc<crate::fs::File>>) -> Vma {
        self.vm_file = file;
        self
    }

    /// This VMA as the special mapping `sm` (before it is published).
    pub fn with_special(mut self, sm: Option<&'static SpecialMapping>) -> Vma {
        self.vm_special = sm;
        self
    }

    /// The special mapping this VMA is, if it is one.
    #[inline]
    pub fn special(&self) -> Option<&'static SpecialMapping> {
        self.vm_special
    }

    /// `vm_file`.
    #[inline]
    pub fn file(&self) -> Option<&Arc<crate::fs::File>> {
        self.vm_file.as_ref()
    }

    /// `vma_is_anonymous`: no `vm_ops`, neither a file nor a special
    /// mapping behind it.
    #[inline]
    pub fn is_anonymous(&self) -> bool {
        self.vm_file.is_none() && self.vm_special.is_none()
    }

    /// `vma_policy`.
    pub fn policy(&self) -> Option<&Arc<crate::mm::policy::Mempolicy>> {
        self.vm_policy.as_ref()
    }

    #[inline]
    pub fn start(&self) -> u64 {
        self.vm_start
    }
    #[inline]
    pub fn end(&self) -> u64 {
        self.vm_end
    }
    #[inline]
    pub fn pgoff(&self) -> u64 {
        self.vm_pgoff
    }
    /// `vm_start_gap`: where the room this VMA keeps below it starts (its
    /// start, less the guard gap for a stack that grows down; 0 where that
    /// would wrap).
    pub fn start_gap(&self) -> u64 {
        if self.flags() & VM_GROWSDOWN != 0 {
            self.vm_start.saturating_sub(STACK_GUARD_GAP)
        } else {
            self.vm_start
        }
    }
    /// `vma_last_pgoff`: the page offset of the VMA's last page.
    #[inline]
    pub fn last_pgoff(&self) -> u64 {
        self.vm_pgoff + ((self.vm_end - self.vm_start) >> PAGE_SHIFT) - 1
    }
    #[inline]
    pub fn flags(&self) -> VmFlags {
        self.vm_flags
    }
    #[inline]
    pub fn pages(&self) -> u64 {
        (self.vm_end - self.vm_start) >> PAGE_SHIFT
    }
    /// `vm_page_prot`, as `vma_set_page_prot` sets it: a shared writable
    /// mapping that wants write notification gets read-only entries, as
    /// a private one does.
    #[inline]
    pub fn page_prot(&self) -> Pgprot {
        if self.wants_writenotify() {
            vm_get_page_prot(self.flags() & !VM_SHARED)
        } else {
            vm_get_page_prot(self.flags())
        }
    }

    /// `vma_wants_writenotify`: a shared writable mapping of a file whose
    /// filesystem must see the first write to each clean page
    /// (`page_mkwrite`, or dirty accounting for writeback).
    #[inline]
    pub fn wants_writenotify(&self) -> bool {
        self.flags() & (VM_WRITE | VM_SHARED) == (VM_WRITE | VM_SHARED)
            && self
                .vm_file
                .as_ref()
                .is_some_and(|f| f.inode.kind.writenotify())
    }
    #[inline]
    pub fn contains(&self, addr: u64) -> bool {
        self.start() <= addr && addr < self.end()
    }
    pub fn anon_vma(&self) -> Option<&Arc<AnonVma>> {
        self.anon_vma.get()
    }

    /// `vma_mark_detached`: called once, when the VMA, write-locked, leaves
    /// the tree; waits for readers that had just found it.
    pub fn mark_detached(&self) {
        self.vm_lock.mark_detached();
    }

    /// Whether the VMA is out of the tree: not yet in it, or left it.
    pub fn is_detached(&self) -> bool {
        self.vm_lock.is_detached()
    }

    /// The address of page `pgoff` of this VMA's linear mapping
    /// (`vma_address`), if it falls inside the VMA.
    pub fn address_of(&self, pgoff: u64) -> Option<u64> {
        let addr = self
            .start()
            .checked_add(pgoff.checked_sub(self.pgoff())? << PAGE_SHIFT)?;
        (addr < self.end()).then_some(addr)
    }

    /// `linear_page_index`.
    #[inline]
    pub fn linear_page_index(&self, addr: u64) -> u64 {
        ((addr - self.start()) >> PAGE_SHIFT) + self.pgoff()
    }
}

/// What the tree keeps per run of VMAs: its span and its largest inner gap
/// (the maple tree keeps the largest gap per node, for `mas_empty_area_rev`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VmaSpan {
    first_start: u64,
    last_end: u64,
    /// The largest gap between two VMAs of the run.
    max_gap: u64,
}

/// A VMA as the tree's nodes hold it: a copy of an `Arc<Vma>` that owns no
/// count (see the module doc for who does).
pub struct TreeVma(ManuallyDrop<Arc<Vma>>);

impl TreeVma {
    /// A copy of `vma` that owns no count.
    ///
    /// # Safety
    ///
    /// The copy must not be used once the VMA's last count is gone: it may
    /// live only in versions of a tree that keep the VMA alive by the rule
    /// of the module doc.
    unsafe fn lend(vma: &Arc<Vma>) -> TreeVma {
        // SAFETY: a bitwise copy of the pointer, never dropped as an Arc
        // (ManuallyDrop), so the counts are untouched; liveness is the
        // caller's promise.
        TreeVma(ManuallyDrop::new(unsafe { std::ptr::read(vma) }))
    }

    /// Give back the count the published tree held for this VMA.
    ///
    /// # Safety
    ///
    /// The VMA must have left the published tree, no reader may still hold
    /// a version that names it (a grace period has passed), and no other
    /// copy may be given back for the same removal.
    unsafe fn give_back(self) {
        drop(ManuallyDrop::into_inner(self.0));
    }
}

impl Clone for TreeVma {
    fn clone(&self) -> Self {
        // SAFETY: the copy goes into a version of the same tree (a node
        // copied on the write path, or a draft's list of VMAs taken out),
        // which the VMA outlives by the module doc's rule.
        unsafe { TreeVma::lend(&self.0) }
    }
}

impl std::ops::Deref for TreeVma {
    type Target = Arc<Vma>;
    fn deref(&self) -> &Arc<Vma> {
        &self.0
    }
}

/// The tree keys a VMA by its last address, as the maple tree's pivot is
/// the last index of a range: the first key at or above `addr` is then
/// the VMA that contains `addr`, or the next one (`find_vma`).
impl Entry for TreeVma {
    type Key = u64;
    type Summary = VmaSpan;
    /// Faults and VMA operations look up one address at a time, and with
    /// tens of thousands of VMAs the nodes on the path are cold.
    const PREFETCH_NODES: bool = true;

    fn key(&self) -> u64 {
        self.end() - 1
    }
    fn summary(&self) -> VmaSpan {
        VmaSpan {
            first_start: self.start(),
            last_end: self.end(),
            max_gap: 0,
        }
    }
    fn combine(l: &VmaSpan, r: &VmaSpan) -> VmaSpan {
        VmaSpan {
            first_start: l.first_start,
            last_end: r.last_end,
            max_gap: l.max_gap.max(r.max_gap).max(r.first_start - l.last_end),
        }
    }
}

/// One version of the VMA tree (`mm->mm_mt`): VMAs sorted by address,
/// disjoint. A draft is O(1) to make; edits are O(log n) and leave other
/// versions as they were.
#[derive(Default)]
pub struct VmaTree {
    tree: Tree<TreeVma>,
    /// The counts of the VMAs this draft inserted (its nodes' copies own
    /// none); publishing hands them to the published tree.
    inserted: SmallVec<[Arc<Vma>; 4]>,
    /// The VMAs this draft took out, whose counts publishing gives back.
    removed: SmallVec<[TreeVma; 4]>,
    /// A draft's write section (`mm_lock_seq`, odd): every VMA it takes out
    /// or puts in is write-locked for it first. None for a published
    /// version, and for the tree of a new mm that no one can fault in yet.
    lock_seq: Option<u32>,
}

/// What a publication leaves to free one grace period later, when no
/// reader can still hold the version before it: the tree nodes the draft
/// replaced, and the counts of the VMAs it took out.
pub struct TreeGarbage {
    nodes: Retired<TreeVma>,
    vmas: SmallVec<[TreeVma; 4]>,
}

impl TreeGarbage {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.vmas.is_empty()
    }

    /// Free the nodes and give the counts back.
    ///
    /// # Safety
    ///
    /// A grace period has passed since the version that left these behind
    /// was published, and this is the only garbage of that publication.
    pub unsafe fn free(self) {
        // SAFETY: the caller's promise, for both.
        unsafe { self.nodes.free() };
        for v in self.vmas {
            // SAFETY: as above.
            unsafe { v.give_back() };
        }
    }
}

impl Drop for VmaTree {
    /// A draft dropped unpublished gives back the counts it took (`inserted`
    /// drops: those VMAs were never visible); what it took out is still the
    /// published tree's, so `removed` is forgotten. A published version
    /// has neither.
    fn drop(&mut self) {
        self.removed.clear();
    }
}

impl VmaTree {
    /// A tree of `vmas`, sorted and disjoint, in O(n).
    pub fn from_sorted(vmas: Vec<Arc<Vma>>) -> VmaTree {
        // SAFETY: the draft keeps each VMA's count in `inserted`.
        let copies: Vec<TreeVma> = vmas.iter().map(|v| unsafe { TreeVma::lend(v) }).collect();
        for v in &vmas {
            v.vm_lock.mark_attached();
        }
        VmaTree {
            tree: Tree::from_sorted(copies),
            inserted: vmas.into(),
            removed: SmallVec::new(),
            lock_seq: None,
        }
    }

    /// A draft of this version, which must be the published one, for a
    /// writer holding mmap_lock for writing in the section `lock_seq` (None:
    /// no reader can reach the VMAs).
    pub(crate) fn draft(&self, lock_seq: Option<u32>) -> VmaTree {
        debug_assert!(
            self.inserted.is_empty() && self.removed.is_empty(),
            "a draft of a draft"
        );
        VmaTree {
            // SAFETY: drafts are made by the one writer (mmap_lock held for
            // writing), of the published version, whose nodes are freed
            // only by a later publication's garbage.
            tree: unsafe { self.tree.draft() },
            inserted: SmallVec::new(),
            removed: SmallVec::new(),
            lock_seq,
        }
    }

    /// Publication: a read-only version equal to this draft, to publish,
    /// and the garbage to free a grace period after it is. The published
    /// tree keeps the counts of what the draft inserted; the draft may go
    /// on being edited, as a draft of the new version.
    pub(crate) fn publishable(&mut self) -> (VmaTree, TreeGarbage) {
        for v in self.inserted.drain(..) {
            // The count is the published tree's now: its copies name the
            // VMA, and a later draft that takes the VMA out gives it back.
            std::mem::forget(v);
        }
        let (view, nodes) = self.tree.publish();
        let garbage = TreeGarbage {
            nodes,
            vmas: std::mem::take(&mut self.removed),
        };
        let version = VmaTree {
            tree: view,
            inserted: SmallVec::new(),
            removed: SmallVec::new(),
            lock_seq: None,
        };
        (version, garbage)
    }

    /// `vma_start_write` for this draft's write section, if it has one.
    pub fn start_write(&self, vma: &Vma) {
        if let Some(seq) = self.lock_seq {
            vma.vm_lock.start_write(seq);
        }
    }

    /// Write-lock every VMA of the tree (fork's parent: `dup_mmap` locks
    /// each VMA before it copies its page tables).
    pub fn start_write_all(&self) {
        for v in self.iter() {
            self.start_write(v);
        }
    }

    /// Write-lock the VMAs that intersect `[start, end)`.
    pub fn start_write_range(&self, start: u64, end: u64) {
        for v in self.range(start, end) {
            self.start_write(v);
        }
    }

    /// Whether every VMA this draft took out or put in is write-locked for
    /// its section (for the publication's assertion).
    pub(crate) fn edits_write_locked(&self) -> bool {
        let Some(seq) = self.lock_seq else {
            return true;
        };
        self.inserted
            .iter()
            .map(|v| &**v)
            .chain(self.removed.iter().map(|v| &***v))
            .all(|v| v.vm_lock.is_write_locked(seq))
    }

    /// Take every VMA out (exit_mmap, and the end of an mm).
    pub fn remove_all(&mut self) {
        self.start_write_all();
        self.removed.extend(self.tree.iter().cloned());
        self.tree.clear();
    }

    /// `mm->map_count`.
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Vma>> {
        self.tree.iter().map(|v| &**v)
    }

    /// `find_vma`: the first VMA with `vm_end > addr`.
    pub fn find_vma(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.tree.first_from(addr).map(|v| &**v)
    }

    /// `vma_lookup`: the VMA that contains `addr`.
    pub fn vma_lookup(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.find_vma(addr).filter(|v| v.start() <= addr)
    }

    /// `find_vma_intersection`.
    pub fn find_vma_intersection(&self, start: u64, end: u64) -> Option<&Arc<Vma>> {
        self.find_vma(start).filter(|v| v.start() < end)
    }

    /// `find_vma_prev`: [`Self::find_vma`] and the VMA before it (the last
    /// that ends at or below `addr`), from one descent, as `__mmap_prepare`
    /// has both from one iterator.
    pub fn find_vma_prev(&self, addr: u64) -> (Option<&Arc<Vma>>, Option<&Arc<Vma>>) {
        let (prev, vma) = self.tree.around(addr);
        (vma.map(|v| &**v), prev.map(|v| &**v))
    }

    /// The last VMA that ends at or below `addr` (`vma_prev` of a gap).
    pub fn prev_vma(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.tree.last_before(addr).map(|v| &**v)
    }

    /// The first VMA that starts at or above `addr` (`vma_next` of a gap).
    pub fn next_vma(&self, addr: u64) -> Option<&Arc<Vma>> {
        // The VMA found may contain `addr`; then the next one is it.
        self.iter_from(addr).find(|v| v.start() >= addr)
    }

    /// The VMAs that intersect `[start, end)`, in order.
    pub fn range(&self, start: u64, end: u64) -> impl Iterator<Item = &Arc<Vma>> {
        self.iter_from(start).take_while(move |v| v.start() < end)
    }

    /// The VMAs from the one that contains `addr`, or the next.
    fn iter_from(&self, addr: u64) -> impl Iterator<Item = &Arc<Vma>> {
        self.tree.iter_from(addr).map(|v| &**v)
    }

    /// Insert a VMA that overlaps none.
    pub fn insert(&mut self, vma: Arc<Vma>) {
        debug_assert!(
            self.find_vma_intersection(vma.start(), vma.end()).is_none(),
            "overlapping VMA {vma:?}"
        );
        self.start_write(&vma);
        vma.vm_lock.mark_attached();
        // SAFETY: the draft keeps the VMA's count in `inserted`.
        self.tree.insert(unsafe { TreeVma::lend(&vma) });
        self.inserted.push(vma);
    }

    /// Put `new` (sorted, disjoint, overlapping no VMA of the tree but
    /// those of `old`) in the place of `old`, VMAs of this tree: a new VMA
    /// that ends where an old one did takes its place, the other old ones
    /// are removed and the other new ones inserted. O((old + new) log n).
    pub fn replace(&mut self, old: &[Arc<Vma>], new: Vec<Arc<Vma>>) {
        // Removals first, so that the tree never holds overlapping VMAs
        // (its gap summaries assume none).
        let takes_place = |o: &Arc<Vma>| new.iter().any(|n| n.end() == o.end());
        for o in old {
            self.start_write(o);
        }
        for o in old.iter().filter(|o| !takes_place(o)) {
            let gone = self.tree.remove(o.end() - 1);
            debug_assert!(
                gone.as_ref().is_some_and(|g| Arc::ptr_eq(g, o)),
                "removed VMA {o:?} is not the tree's"
            );
            self.removed.extend(gone);
        }
        // Then the new VMAs that take an old one's place, so that the rest
        // go in without overlapping what they replace.
        let (in_place, others): (Vec<_>, Vec<_>) = new
            .into_iter()
            .partition(|n| old.iter().any(|o| o.end() == n.end()));
        for n in in_place {
            self.start_write(&n);
            n.vm_lock.mark_attached();
            // SAFETY: the draft keeps the VMA's count in `inserted`.
            let gone = self.tree.replace_at(unsafe { TreeVma::lend(&n) });
            debug_assert!(
                gone.as_ref()
                    .is_some_and(|g| old.iter().any(|o| Arc::ptr_eq(g, o))),
                "replaced VMA is not one of {old:?}"
            );
            self.removed.extend(gone);
            self.inserted.push(n);
        }
        for n in others {
            self.insert(n);
        }
    }

    /// `unmapped_area_topdown`: the highest `len` bytes in a gap between
    /// VMAs, inside `[low, high)`. O(log n): subtrees whose largest gap is
    /// too small are skipped, as the maple tree's gap search does.
    /// The room a stack keeps below it counts as taken: where the highest
    /// gap ends in it, the search is made again below it, as the kernel's
    /// does (`vm_start_gap` of the VMA above the gap).
    pub fn unmapped_area_topdown(&self, len: u64, low: u64, mut high: u64) -> Option<u64> {
        loop {
            let a = gap_topdown(self.tree.root(), 0, u64::MAX, &GapWanted { len, low, high })?;
            match self.next_vma(a + len) {
                Some(next) if next.start_gap() < a + len => high = next.start_gap(),
                _ => return Some(a),
            }
        }
    }

    /// The tree's invariants: VMAs non-empty, sorted, disjoint, attached,
    /// and the tree well formed (node sizes, pivots, gaps).
    pub fn check(&self) -> Result<(), String> {
        self.tree.check_shape()?;
        let mut prev_end = 0;
        for v in self.iter() {
            if v.start() >= v.end() {
                return Err(format!("empty VMA {v:?}"));
            }
            if prev_end > v.start() {
                return Err(format!("VMAs out of order at {v:?}"));
            }
            if v.is_detached() {
                return Err(format!("detached {v:?} in the tree"));
            }
            prev_end = v.end();
        }
        Ok(())
    }
}

/// The gaps of a subtree that lies between the end of the VMA before it
/// (`floor`) and the start of the one after it (`ceil`), searched from the
/// top; a gap counts only as far as it lies in `[low, high)`.
fn gap_topdown(
    n: Option<NodeRef<'_, TreeVma>>,
    floor: u64,
    ceil: u64,
    want: &GapWanted,
) -> Option<u64> {
    match n {
        None => want.fits(floor, ceil),
        Some(NodeRef::Leaf(vmas)) => {
            let mut hi = ceil;
            for v in vmas.iter().rev().map(|e| &e.summary) {
                if let Some(a) = want.fits(v.last_end, hi) {
                    return Some(a);
                }
                hi = v.first_start;
            }
            want.fits(floor, hi)
        }
        Some(NodeRef::Branch(slots)) => {
            for (i, slot) in slots.iter().enumerate().rev() {
                let hi = slots.get(i + 1).map_or(ceil, |s| s.summary().first_start);
                let lo = i
                    .checked_sub(1)
                    .map_or(floor, |j| slots[j].summary().last_end);
                if hi <= want.low {
                    return None;
                }
                if lo >= want.high {
                    continue;
                }
                let s = slot.summary();
                let widest = s.max_gap.max(s.first_start - lo).max(hi - s.last_end);
                if widest < want.len {
                    continue;
                }
                if let Some(a) = gap_topdown(Some(slot.node()), lo, hi, want) {
                    return Some(a);
                }
            }
            None
        }
    }
}

/// What `unmapped_area_topdown` looks for: `len` bytes inside `[low, high)`.
struct GapWanted {
    len: u64,
    low: u64,
    high: u64,
}

impl GapWanted {
    /// The highest place for the request in the gap `[a, b)`.
    fn fits(&self, a: u64, b: u64) -> Option<u64> {
        let (a, b) = (a.max(self.low), b.min(self.high));
        (b > a && b - a >= self.len).then(|| b - self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tree_of(spans: &[(u64, u64)]) -> (VmaTree, Vec<Arc<Vma>>) {
        let vmas: Vec<Arc<Vma>> = spans
            .iter()
            .map(|&(s, e)| Arc::new(Vma::new(1, s << 12, e << 12, VM_READ, s)))
            .collect();
        (VmaTree::from_sorted(vmas.clone()), vmas)
    }

    /// The linear search the tree's gap search replaces.
    fn topdown_by_scan(vmas: &[Arc<Vma>], len: u64, low: u64, high: u64) -> Option<u64> {
        let mut bounds = vec![0];
        for v in vmas {
            bounds.push(v.start());
            bounds.push(v.end());
        }
        bounds.push(u64::MAX);
        bounds.chunks(2).rev().find_map(|g| {
            let (a, b) = (g[0].max(low), g[1].min(high));
            (b > a && b - a >= len).then(|| b - len)
        })
    }

    /// Sorted, disjoint spans (in pages) from arbitrary lengths and gaps.
    fn layout() -> impl Strategy<Value = Vec<(u64, u64)>> {
        prop::collection::vec((0u64..6, 1u64..6), 0..60).prop_map(|v| {
            let mut at = 16;
            v.into_iter()
                .map(|(gap, len)| {
                    at += gap;
                    let s = (at, at + len);
                    at += len;
                    s
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn lookups_and_gap_search_agree_with_a_scan(
            spans in layout(),
            len in 1u64..8,
            low in 0u64..40,
            width in 0u64..400,
            probe in 0u64..400,
        ) {
            let (t, vmas) = tree_of(&spans);
            t.check().unwrap();
            prop_assert_eq!(t.len(), vmas.len());
            let (len, low, high, addr) = (len << 12, low << 12, (low + width) << 12, probe << 12);
            prop_assert_eq!(
                t.unmapped_area_topdown(len, low, high),
                topdown_by_scan(&vmas, len, low, high)
            );
            let find = vmas.iter().find(|v| v.end() > addr);
            prop_assert_eq!(t.find_vma(addr).map(|v| v.start()), find.map(|v| v.start()));
            let prev = vmas.iter().rev().find(|v| v.end() <= addr);
            prop_assert_eq!(t.prev_vma(addr).map(|v| v.start()), prev.map(|v| v.start()));
            let next = vmas.iter().find(|v| v.start() >= addr);
            prop_assert_eq!(t.next_vma(addr).map(|v| v.start()), next.map(|v| v.start()));
            let end = addr + (8 << 12);
            let range: Vec<u64> = t.range(addr, end).map(|v| v.start()).collect();
            let want: Vec<u64> = vmas.iter().filter(|v| v.end() > addr && v.start() < end).map(|v| v.start()).collect();
            prop_assert_eq!(range, want);
        }
    }

    #[test]
    fn a_replaced_vma_stays_whole_in_the_old_version() {
        let (mut t, vmas) = tree_of(&[(16, 32), (40, 48)]);
        // As if published: the old version keeps its VMAs' counts (and,
        // never given back here, keeps them alive to the test's end).
        let (old, _) = t.publishable();
        let lower = Arc::new(Vma::new(1, 16 << 12, 20 << 12, VM_READ, 16));
        let upper = Arc::new(Vma::new(1, 20 << 12, 32 << 12, VM_READ | VM_WRITE, 20));
        t.replace(&vmas[..1], vec![lower, upper]);
        t.check().unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(old.len(), 2);
        let v = old.vma_lookup(24 << 12).unwrap();
        assert_eq!(
            (v.start(), v.end(), v.flags()),
            (16 << 12, 32 << 12, VM_READ)
        );
        assert_eq!(t.vma_lookup(24 << 12).unwrap().flags(), VM_READ | VM_WRITE);
    }
}
