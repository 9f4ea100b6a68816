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
//! which makes per-VMA-lock readers fall back to mmap_lock; here a reader
//! that finds a VMA marked [`Vma::is_detached`] knows it lost such a race.

use std::sync::OnceLock;

use crate::pgtable::Pgprot;
use crate::phys::PAGE_SHIFT;
use crate::sync::{Arc, AtomicBool, Mutex, Ordering};
use crate::tree::{hash_prio, Entry, Tree};

pub use crate::mm::interval_tree::AnonVma;

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

/// `struct vm_area_struct`. Bounds, offset and flags are fixed for the
/// VMA's life: a change makes a new VMA (see the module doc).
pub struct Vma {
    /// `vm_mm`, by id.
    pub mm_id: u64,
    vm_start: u64,
    vm_end: u64,
    /// For anonymous VMAs, `vm_start >> PAGE_SHIFT` at creation; kept across
    /// splits so that a folio's index stays valid.
    vm_pgoff: u64,
    vm_flags: VmFlags,
    /// The anon_vma new folios of this VMA attach to; set once, by
    /// `anon_vma_prepare` on the first fault, or by fork or a split.
    pub anon_vma: OnceLock<Arc<AnonVma>>,
    /// `anon_vma_chain`: every anon_vma this VMA is chained to (its own and
    /// its ancestors'), so that it can be unlinked from them all.
    pub anon_vma_chain: Mutex<Vec<Arc<AnonVma>>>,
    /// `vma_mark_detached`: the VMA left the tree (removed or replaced).
    detached: AtomicBool,
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
            detached: AtomicBool::new(false),
        }
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

    /// `vma_mark_detached`: called once, when the VMA leaves the tree.
    pub fn mark_detached(&self) {
        let was = self.detached.swap(true, Ordering::Release);
        debug_assert!(!was, "{self:?} detached twice");
    }

    /// Whether the VMA has left the tree. Acquire: pairs with
    /// `mark_detached`, for lockless readers that found the VMA earlier.
    pub fn is_detached(&self) -> bool {
        self.detached.load(Ordering::Acquire)
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

/// What the tree keeps per subtree: its span and its largest inner gap
/// (the maple tree keeps the largest gap per node, for `mas_empty_area_rev`).
#[derive(Clone, Copy, Debug)]
pub struct VmaSpan {
    first_start: u64,
    last_end: u64,
    /// The largest gap between two VMAs of the subtree.
    max_gap: u64,
}

impl Entry for Arc<Vma> {
    type Key = u64;
    type Summary = VmaSpan;

    fn key(&self) -> u64 {
        self.start()
    }
    fn prio(&self) -> u64 {
        hash_prio(self.start())
    }
    fn summarize(left: Option<&VmaSpan>, this: &Arc<Vma>, right: Option<&VmaSpan>) -> VmaSpan {
        let mut max_gap = 0;
        if let Some(l) = left {
            max_gap = l.max_gap.max(this.start() - l.last_end);
        }
        if let Some(r) = right {
            max_gap = max_gap.max(r.max_gap).max(r.first_start - this.end());
        }
        VmaSpan {
            first_start: left.map_or(this.start(), |l| l.first_start),
            last_end: right.map_or(this.end(), |r| r.last_end),
            max_gap,
        }
    }
}

/// One version of the VMA tree (`mm->mm_mt`): VMAs sorted by address,
/// disjoint. Cloning is O(1); edits are O(log n) and leave other versions
/// as they were.
#[derive(Default, Clone)]
pub struct VmaTree {
    tree: Tree<Arc<Vma>>,
}

impl VmaTree {
    /// A tree of `vmas`, sorted and disjoint, in O(n).
    pub fn from_sorted(vmas: Vec<Arc<Vma>>) -> VmaTree {
        VmaTree {
            tree: Tree::from_sorted(vmas),
        }
    }

    /// `mm->map_count`.
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Vma>> {
        self.tree.iter()
    }

    /// `find_vma`: the first VMA with `vm_end > addr`.
    pub fn find_vma(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.tree.first_where(|v| v.end() > addr)
    }

    /// `vma_lookup`: the VMA that contains `addr`.
    pub fn vma_lookup(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.find_vma(addr).filter(|v| v.start() <= addr)
    }

    /// `find_vma_intersection`.
    pub fn find_vma_intersection(&self, start: u64, end: u64) -> Option<&Arc<Vma>> {
        self.find_vma(start).filter(|v| v.start() < end)
    }

    /// The last VMA that ends at or below `addr` (`vma_prev` of a gap).
    pub fn prev_vma(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.tree.last_where(|v| v.end() <= addr)
    }

    /// The first VMA that starts at or above `addr` (`vma_next` of a gap).
    pub fn next_vma(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.tree.first_where(|v| v.start() >= addr)
    }

    /// The VMAs that intersect `[start, end)`, in order.
    pub fn range(&self, start: u64, end: u64) -> impl Iterator<Item = &Arc<Vma>> {
        self.tree
            .iter_from(move |v| v.end() > start)
            .take_while(move |v| v.start() < end)
    }

    /// Insert a VMA that overlaps none.
    pub fn insert(&mut self, vma: Arc<Vma>) {
        debug_assert!(
            self.find_vma_intersection(vma.start(), vma.end()).is_none(),
            "overlapping VMA {vma:?}"
        );
        self.tree.insert(vma);
    }

    /// Put `new` (sorted, disjoint, inside the span of `old`) in the place
    /// of `old`, VMAs of this tree: a new VMA that starts where an old one
    /// did takes its node, the other old ones are removed and the other new
    /// ones inserted. O((old + new) log n).
    pub fn replace(&mut self, old: &[Arc<Vma>], new: Vec<Arc<Vma>>) {
        // Removals first, so that the tree never holds overlapping VMAs
        // (its gap summaries assume none).
        let takes_node = |o: &Arc<Vma>| new.iter().any(|n| n.start() == o.start());
        for o in old.iter().filter(|o| !takes_node(o)) {
            let gone = self.tree.remove(o.start());
            debug_assert!(
                gone.as_ref().is_some_and(|g| Arc::ptr_eq(g, o)),
                "removed VMA {o:?} is not the tree's {gone:?}"
            );
        }
        for n in new {
            match old.iter().find(|o| o.start() == n.start()) {
                Some(o) => {
                    let gone = self.tree.replace_at(n);
                    debug_assert!(
                        gone.as_ref().is_some_and(|g| Arc::ptr_eq(g, o)),
                        "replaced VMA {o:?} is not the tree's {gone:?}"
                    );
                }
                None => self.tree.insert(n),
            }
        }
    }

    /// `unmapped_area_topdown`: the highest `len` bytes in a gap between
    /// VMAs, inside `[low, high)`. O(log n): subtrees whose largest gap is
    /// too small are skipped, as the maple tree's gap search does.
    pub fn unmapped_area_topdown(&self, len: u64, low: u64, high: u64) -> Option<u64> {
        gap_topdown(self.tree.root(), 0, u64::MAX, len, low, high)
    }

    /// The tree's invariants: VMAs non-empty, sorted, disjoint, attached.
    pub fn check(&self) -> Result<(), String> {
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
    n: Option<&crate::tree::Node<Arc<Vma>>>,
    floor: u64,
    ceil: u64,
    len: u64,
    low: u64,
    high: u64,
) -> Option<u64> {
    let fits = |a: u64, b: u64| {
        let (a, b) = (a.max(low), b.min(high));
        (b > a && b - a >= len).then(|| b - len)
    };
    let Some(n) = n else {
        return fits(floor, ceil);
    };
    if floor >= high || ceil <= low {
        return None;
    }
    let s = n.summary();
    let widest = s
        .max_gap
        .max(s.first_start.saturating_sub(floor))
        .max(ceil.saturating_sub(s.last_end));
    if widest < len {
        return None;
    }
    gap_topdown(n.right(), n.item.end(), ceil, len, low, high)
        .or_else(|| gap_topdown(n.left(), floor, n.item.start(), len, low, high))
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
        let old = t.clone();
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
