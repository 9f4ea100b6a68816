//! `struct anon_vma` and its interval tree of VMAs (mm/interval_tree.c,
//! `anon_vma_interval_tree_*`).
//!
//! Every VMA chained to an anon_vma sits in the anon_vma's tree, found by
//! the page-offset interval it covers; the tree is augmented with the
//! largest last page offset of each subtree, so that an rmap walk for one
//! page visits only the VMAs whose range covers that page's offset.
//!
//! The kernel's tree holds one node per anon_vma_chain, and unlinking is an
//! `rb_erase` of that node, with no search. The model keeps one node per
//! distinct interval (the VMAs of a forked family usually all cover the
//! same one), holding the VMAs that cover it in a slab; each VMA's
//! [`AnonVmaChain`] remembers its slot. Linking is a search among the
//! distinct intervals, O(log n), and a slot taken from the slab's free list;
//! unlinking the same search and the slot put back: O(log n) however many
//! VMAs share the anon_vma (a long chain of forks), with no hashing. An rmap
//! walk reads the slots in order and skips the free ones: it costs what
//! the interval's largest population was, where the kernel's costs what it
//! is (a slab only shrinks from its end).
//!
//! # Locking
//!
//! As in the kernel, the anon_vmas of a family (a root and every anon_vma
//! forked from it, `anon_vma->root`) share one rwsem, the root's: rmap walks
//! take it for reading, linking and unlinking for writing. A write guard,
//! [`AnonVmaWriteGuard`], is the proof that a tree may be changed: a tree is
//! reached only through the guard of its family's lock, mutably through a
//! mutable guard, so that two trees are never changed at once through one.
//! Linking or unlinking a VMA along its whole chain takes the lock once, as
//! the kernel's `lock_anon_vma_root` does, and unlinking drops the
//! references the links held (to the anon_vmas and, here, the weak ones to
//! the VMA) after unlocking, as the kernel frees its chains and puts its
//! anon_vmas after `unlock_anon_vma_root`.

use crate::sync::Weak;
use std::cell::UnsafeCell;

use crate::sync::RawRwLock;
use crate::sync::{ArcRwLockReadGuard, ArcRwLockWriteGuard};

use crate::mm::vma::Vma;
use crate::sync::{Arc, AtomicU64, Ordering, RwLock};
use crate::tree::{Entry, NodeRef, Tree};

static ANON_VMA_ID: AtomicU64 = AtomicU64::new(1);

/// One slot of an interval's slab: a VMA, with when it was linked.
#[derive(Clone)]
enum AvcSlot {
    Used(Weak<Vma>, u64),
    /// Free, with the next free slot ([`NO_SLOT`] ends the list).
    Free(u32),
}

const NO_SLOT: u32 = u32::MAX;

/// The anon_vma_chains of one page-offset interval `[start, last]`: the
/// VMAs that cover exactly it, each in its slot.
#[derive(Clone)]
pub struct Avcs {
    start_pgoff: u64,
    last_pgoff: u64,
    slots: Vec<AvcSlot>,
    /// The first free slot below `slots.len()`.
    free: u32,
    live: u32,
    /// Links made so far: the order the VMAs are walked in.
    linked: u64,
    /// No slot was reused: slot order is link order (a walk need not sort).
    in_link_order: bool,
}

impl Avcs {
    fn new((start_pgoff, last_pgoff): (u64, u64)) -> Avcs {
        Avcs {
            start_pgoff,
            last_pgoff,
            slots: Vec::new(),
            free: NO_SLOT,
            live: 0,
            linked: 0,
            in_link_order: true,
        }
    }

    /// Put `vma` in a free slot, or a new one at the end; returns its index.
    fn link(&mut self, vma: Weak<Vma>) -> u32 {
        self.live += 1;
        self.linked += 1;
        let seq = self.linked;
        if self.free != NO_SLOT {
            let i = self.free;
            let AvcSlot::Free(next) = self.slots[i as usize] else {
                unreachable!("the free list holds only free slots");
            };
            self.free = next;
            self.in_link_order = false;
            self.slots[i as usize] = AvcSlot::Used(vma, seq);
            return i;
        }
        self.slots.push(AvcSlot::Used(vma, seq));
        u32::try_from(self.slots.len() - 1).unwrap_or_else(|_| unreachable!("2^32 VMAs"))
    }

    /// Free slot `i`, which must hold `vma`; returns the weak reference it
    /// held, or `None` if it did not hold `vma`.
    fn unlink(&mut self, i: u32, vma: &Vma) -> Option<Weak<Vma>> {
        if !self.holds(i, vma) {
            return None;
        }
        self.live -= 1;
        let was = if i as usize == self.slots.len() - 1 {
            self.slots.pop()
        } else {
            let was = std::mem::replace(&mut self.slots[i as usize], AvcSlot::Free(self.free));
            self.free = i;
            Some(was)
        };
        match was {
            Some(AvcSlot::Used(w, _)) => Some(w),
            _ => unreachable!("slot {i} held the VMA"),
        }
    }

    fn holds(&self, i: u32, vma: &Vma) -> bool {
        matches!(self.slots.get(i as usize), Some(AvcSlot::Used(w, _)) if std::ptr::eq(w.as_ptr(), vma))
    }

    /// The VMAs in the order they were linked, as the kernel's interval
    /// tree walks equal intervals (an equal key goes to the right): a fork
    /// child's after its parent's, so that an rmap walk that restores
    /// migration entries reaches a child after the parent it may copy an
    /// entry from (slots are reused, so their order is not enough).
    fn vmas(&self) -> impl Iterator<Item = Arc<Vma>> + '_ {
        let used = self.slots.iter().filter_map(|s| match s {
            AvcSlot::Used(w, seq) => Some((*seq, w)),
            AvcSlot::Free(_) => None,
        });
        // Sorted only once a slot was reused; else slot order is link order.
        let (direct, sorted) = if self.in_link_order {
            (Some(used), None)
        } else {
            let mut v: Vec<_> = used.collect();
            v.sort_unstable_by_key(|&(seq, _)| seq);
            (None, Some(v))
        };
        direct
            .into_iter()
            .flatten()
            .chain(sorted.into_iter().flatten())
            .filter_map(|(_, w)| w.upgrade())
    }
}

impl Entry for Avcs {
    type Key = (u64, u64);
    /// `rb_subtree_last`: the largest last page offset in the subtree.
    type Summary = u64;

    fn key(&self) -> (u64, u64) {
        (self.start_pgoff, self.last_pgoff)
    }
    fn summary(&self) -> u64 {
        self.last_pgoff
    }
    fn combine(l: &u64, r: &u64) -> u64 {
        *l.max(r)
    }
}

#[inline]
fn vma_key(vma: &Vma) -> (u64, u64) {
    (vma.pgoff(), vma.last_pgoff())
}

/// `struct anon_vma_chain`: a VMA's link to one anon_vma it is chained to,
/// with the VMA's slot there.
pub struct AnonVmaChain {
    pub anon_vma: Arc<AnonVma>,
    slot: u32,
}

impl AnonVmaChain {
    /// The prefetches of [`Self::unlink`]'s memory, a stage each, for an
    /// unlink of a VMA from many anon_vmas (as a long fork chain's exit
    /// does), which otherwise misses the cache two or three times per
    /// anon_vma, one miss waiting for the other. Each stage reads only what
    /// the one before fetched. First: the anon_vma's tree handle.
    pub fn prefetch_anon_vma(&self) {
        crate::cacheline::prefetch(self.anon_vma.rb_root.get());
    }

    /// Second: the tree's root node (the leaf that holds the VMA's
    /// interval, when the anon_vma has one interval).
    pub fn prefetch_tree(&self, g: &AnonVmaWriteGuard) {
        if self.anon_vma.is_locked_by(g) {
            // SAFETY: the family lock is held for writing (checked above)
            // and borrowed for this call: no one changes the tree meanwhile.
            unsafe { &*self.anon_vma.rb_root.get() }.prefetch_root();
        }
    }

    /// Third: the slot [`Self::unlink`] will free.
    pub fn prefetch_slot(&self, vma: &Vma, g: &AnonVmaWriteGuard) {
        if !self.anon_vma.is_locked_by(g) {
            return;
        }
        // SAFETY: the family lock is held for writing (checked above) and
        // borrowed for this call: no one changes the tree meanwhile.
        let t = unsafe { &*self.anon_vma.rb_root.get() };
        if let Some(slot) = t
            .get(vma_key(vma))
            .and_then(|a| a.slots.get(self.slot as usize))
        {
            crate::cacheline::prefetch(slot);
        }
    }

    /// `anon_vma_interval_tree_remove`: take `vma`, whose link this is, out
    /// of the anon_vma's tree, under its family's lock; returns the weak
    /// reference the tree held, for the caller to drop after unlocking
    /// (`None` if the VMA was not there).
    pub fn unlink(&self, vma: &Vma, g: &mut AnonVmaWriteGuard) -> Option<Weak<Vma>> {
        let key = vma_key(vma);
        let t = self.anon_vma.tree_mut(g);
        let avcs = t.get_mut(key)?;
        let weak = avcs.unlink(self.slot, vma)?;
        if avcs.live == 0 {
            t.remove(key);
        }
        Some(weak)
    }
}

/// A family's lock, held for writing (`anon_vma_lock_write` of the root).
pub struct AnonVmaWriteGuard(ArcRwLockWriteGuard<RawRwLock, ()>);

/// A family's lock, held for reading (`anon_vma_lock_read`).
pub struct AnonVmaReadGuard(ArcRwLockReadGuard<RawRwLock, ()>);

/// `struct anon_vma`: the set of VMAs whose pages an anonymous folio may be
/// mapped in.
pub struct AnonVma {
    pub id: u64,
    /// The anon_vma of the VMA this one's VMA was forked from.
    pub parent: Option<Arc<AnonVma>>,
    /// `anon_vma->root->rwsem`: the lock of the family, shared with the
    /// root and every anon_vma forked from it.
    root_rwsem: Arc<RwLock<()>>,
    /// `rb_root`: every VMA chained to this anon_vma (its own, its splits'
    /// and its forked descendants'), by page-offset interval. Guarded by
    /// `root_rwsem`: reached only through a guard of it.
    rb_root: UnsafeCell<Tree<Avcs>>,
}

// SAFETY: `rb_root` is read only with the family lock held for reading or
// writing, and changed only with it held for writing, through guards that
// prove it (`tree`, `tree_mut`); the other fields are Sync.
unsafe impl Sync for AnonVma {}

impl AnonVma {
    /// An anon_vma forked from `parent`, in its family, or the root of a new
    /// family.
    pub fn new(parent: Option<Arc<AnonVma>>) -> Arc<AnonVma> {
        let root_rwsem = parent
            .as_ref()
            .map_or_else(|| Arc::new(RwLock::new(())), |p| p.root_rwsem.clone());
        Arc::new(AnonVma {
            id: ANON_VMA_ID.fetch_add(1, Ordering::Relaxed),
            parent,
            root_rwsem,
            rb_root: UnsafeCell::new(Tree::new()),
        })
    }

    /// `anon_vma_lock_write`: the family's lock, for writing.
    pub fn lock_write(&self) -> AnonVmaWriteGuard {
        AnonVmaWriteGuard(self.root_rwsem.write_arc())
    }

    /// `anon_vma_lock_read`: the family's lock, for reading.
    pub fn lock_read(&self) -> AnonVmaReadGuard {
        AnonVmaReadGuard(self.root_rwsem.read_arc())
    }

    /// Whether `g` holds this anon_vma's family lock.
    pub fn is_locked_by(&self, g: &AnonVmaWriteGuard) -> bool {
        Arc::ptr_eq(ArcRwLockWriteGuard::rwlock(&g.0), &self.root_rwsem)
    }

    fn tree<'g>(&'g self, g: &'g AnonVmaReadGuard) -> &'g Tree<Avcs> {
        assert!(
            Arc::ptr_eq(ArcRwLockReadGuard::rwlock(&g.0), &self.root_rwsem),
            "anon_vma {} read under another family's lock",
            self.id
        );
        // SAFETY: the family lock is held for reading for 'g (checked
        // above): no writer changes the tree meanwhile.
        unsafe { &*self.rb_root.get() }
    }

    fn tree_mut<'g>(&'g self, g: &'g mut AnonVmaWriteGuard) -> &'g mut Tree<Avcs> {
        assert!(
            self.is_locked_by(g),
            "anon_vma {} changed under another family's lock",
            self.id
        );
        // SAFETY: the family lock is held for writing (checked above), so
        // no one else reads or writes the tree, and the guard is borrowed
        // mutably for 'g, so this is the only reference made through it.
        unsafe { &mut *self.rb_root.get() }
    }

    /// `anon_vma_interval_tree_insert`, under the family's lock: returns
    /// the VMA's link, for [`AnonVmaChain::unlink`].
    pub fn interval_tree_insert(
        self: &Arc<Self>,
        vma: &Arc<Vma>,
        g: &mut AnonVmaWriteGuard,
    ) -> AnonVmaChain {
        let key = vma_key(vma);
        let t = self.tree_mut(g);
        let weak = Arc::downgrade(vma);
        let slot = match t.get_mut(key) {
            Some(avcs) => avcs.link(weak),
            None => {
                let mut avcs = Avcs::new(key);
                let slot = avcs.link(weak);
                t.insert(avcs);
                slot
            }
        };
        AnonVmaChain {
            anon_vma: self.clone(),
            slot,
        }
    }

    /// `anon_vma_interval_tree_foreach` over `[first, last]`: the live VMAs
    /// whose page-offset range meets it.
    pub fn vmas_in(&self, first: u64, last: u64) -> Vec<Arc<Vma>> {
        let g = self.lock_read();
        self.vmas_in_locked(&g, first, last)
    }

    /// [`AnonVma::vmas_in`] with the family's lock already held (an rmap
    /// walk holds it throughout, so that no VMA it finds can be unlinked
    /// and have its page tables freed under it).
    pub fn vmas_in_locked(&self, g: &AnonVmaReadGuard, first: u64, last: u64) -> Vec<Arc<Vma>> {
        let t = self.tree(g);
        let mut out = Vec::new();
        if let Some(root) = t.root() {
            overlapping(root, first, last, &mut out);
        }
        out
    }

    /// Does the tree hold `vma`, in the slot its chain says?
    pub fn has_vma(&self, vma: &Vma) -> bool {
        let chain = vma.anon_vma_chain.lock();
        let Some(link) = chain
            .iter()
            .find(|c| std::ptr::eq(Arc::as_ptr(&c.anon_vma), self))
        else {
            return false;
        };
        let g = self.lock_read();
        self.tree(&g)
            .get(vma_key(vma))
            .is_some_and(|a| a.holds(link.slot, vma))
    }
}

/// The subtree's intervals that meet `[first, last]`, in order; subtrees
/// whose largest last offset is below `first` are skipped, and so is
/// everything from the first that starts after `last`.
fn overlapping(n: NodeRef<'_, Avcs>, first: u64, last: u64, out: &mut Vec<Arc<Vma>>) {
    match n {
        NodeRef::Leaf(items) => {
            for a in items
                .iter()
                .map(|e| &e.item)
                .take_while(|a| a.start_pgoff <= last)
            {
                if a.last_pgoff >= first {
                    out.extend(a.vmas());
                }
            }
        }
        NodeRef::Branch(slots) => {
            for s in slots.iter().take_while(|s| s.key().0 <= last) {
                if *s.summary() >= first {
                    overlapping(s.node(), first, last, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm::vma::VM_READ;

    fn link(av: &Arc<AnonVma>, v: &Arc<Vma>) {
        let avc = av.interval_tree_insert(v, &mut av.lock_write());
        v.anon_vma_chain.lock().push(avc);
    }

    fn unlink(v: &Vma) -> bool {
        let avc = v.anon_vma_chain.lock().pop();
        avc.is_some_and(|c| c.unlink(v, &mut c.anon_vma.lock_write()).is_some())
    }

    #[test]
    fn walks_visit_only_covering_vmas_and_unlink_finds_each() {
        let av = AnonVma::new(None);
        // 300 processes map the same pages; 300 more map other offsets.
        let same: Vec<Arc<Vma>> = (0..300)
            .map(|i| Arc::new(Vma::new(i, 0x10000, 0x20000, VM_READ, 0x10)))
            .collect();
        let other: Vec<Arc<Vma>> = (0..300u64)
            .map(|i| Arc::new(Vma::new(i, 0x10000, 0x11000, VM_READ, 0x100 + i)))
            .collect();
        for v in same.iter().chain(&other) {
            link(&av, v);
        }
        assert_eq!(av.vmas_in(0, u64::MAX).len(), 600);
        assert_eq!(av.vmas_in(0x15, 0x15).len(), 300);
        assert_eq!(av.vmas_in(0x105, 0x105).len(), 1);
        assert_eq!(av.vmas_in(0x1f, 0x100).len(), 301);
        assert!(av.vmas_in(0x500, 0x600).is_empty());
        assert!(av.has_vma(&same[7]) && av.has_vma(&other[7]));
        for v in same.iter().step_by(2) {
            assert!(unlink(v));
            assert!(!unlink(v));
        }
        assert_eq!(av.vmas_in(0x15, 0x15).len(), 150);
        assert!(!av.has_vma(&same[0]) && av.has_vma(&same[1]));
    }

    #[test]
    fn a_family_shares_its_roots_lock() {
        let root = AnonVma::new(None);
        let child = AnonVma::new(Some(root.clone()));
        let grandchild = AnonVma::new(Some(child.clone()));
        let stranger = AnonVma::new(None);
        let g = grandchild.lock_write();
        assert!(root.is_locked_by(&g) && child.is_locked_by(&g));
        assert!(!stranger.is_locked_by(&g));
    }

    #[test]
    #[should_panic(expected = "changed under another family's lock")]
    fn another_familys_guard_cannot_change_a_tree() {
        let mine = AnonVma::new(None);
        let stranger = AnonVma::new(None);
        let v = Arc::new(Vma::new(1, 0x10000, 0x20000, VM_READ, 0x10));
        stranger.interval_tree_insert(&v, &mut mine.lock_write());
    }

    #[test]
    fn freed_slots_are_reused_and_walks_keep_link_order() {
        let av = AnonVma::new(None);
        let vmas: Vec<Arc<Vma>> = (0..8)
            .map(|i| Arc::new(Vma::new(i, 0x10000, 0x20000, VM_READ, 0x10)))
            .collect();
        for v in &vmas {
            link(&av, v);
        }
        let ids = |av: &AnonVma| {
            av.vmas_in(0x10, 0x10)
                .iter()
                .map(|v| v.mm_id)
                .collect::<Vec<_>>()
        };
        assert!(unlink(&vmas[2]) && unlink(&vmas[5]));
        assert_eq!(ids(&av), [0, 1, 3, 4, 6, 7]);
        // The freed slots are taken again, but a walk visits the VMAs in
        // the order they were linked (a fork child after its parent).
        let late: Vec<Arc<Vma>> = (8..10)
            .map(|i| Arc::new(Vma::new(i, 0x10000, 0x20000, VM_READ, 0x10)))
            .collect();
        link(&av, &late[0]);
        link(&av, &late[1]);
        assert_eq!(ids(&av), [0, 1, 3, 4, 6, 7, 8, 9]);
        let slab = av
            .tree(&av.lock_read())
            .iter()
            .map(|a| a.slots.len())
            .sum::<usize>();
        assert_eq!(slab, 8, "no slab growth: the freed slots were reused");
        // Unlinking from the end shrinks the slab; the interval goes with
        // its last VMA.
        for v in vmas.iter().chain(&late) {
            unlink(v);
        }
        assert!(av.tree(&av.lock_read()).is_empty());
    }
}
