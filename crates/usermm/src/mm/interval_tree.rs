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
//! The tree is guarded by the anon_vma's own rwsem (`rb_root`'s lock): rmap
//! walks read it, linking and unlinking write it. The kernel takes the
//! *root* anon_vma's rwsem for a whole family; the model's lock per anon_vma
//! is finer, and nothing here needs the family held at once.

use std::sync::Weak;

use crate::mm::vma::Vma;
use crate::sync::{Arc, AtomicU64, Ordering, RwLock};
use crate::tree::{Entry, NodeRef, Tree};

static ANON_VMA_ID: AtomicU64 = AtomicU64::new(1);

/// One slot of an interval's slab.
#[derive(Clone)]
enum AvcSlot {
    Used(Weak<Vma>),
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
}

impl Avcs {
    fn new((start_pgoff, last_pgoff): (u64, u64)) -> Avcs {
        Avcs {
            start_pgoff,
            last_pgoff,
            slots: Vec::new(),
            free: NO_SLOT,
            live: 0,
        }
    }

    /// Put `vma` in a free slot, or a new one at the end; returns its index.
    fn link(&mut self, vma: Weak<Vma>) -> u32 {
        self.live += 1;
        if self.free != NO_SLOT {
            let i = self.free;
            let AvcSlot::Free(next) = self.slots[i as usize] else {
                unreachable!("the free list holds only free slots");
            };
            self.free = next;
            self.slots[i as usize] = AvcSlot::Used(vma);
            return i;
        }
        self.slots.push(AvcSlot::Used(vma));
        u32::try_from(self.slots.len() - 1).unwrap_or_else(|_| unreachable!("2^32 VMAs"))
    }

    /// Free slot `i`, which must hold `vma`; returns whether it did.
    fn unlink(&mut self, i: u32, vma: &Vma) -> bool {
        match self.slots.get(i as usize) {
            Some(AvcSlot::Used(w)) if std::ptr::eq(w.as_ptr(), vma) => {}
            _ => return false,
        }
        self.live -= 1;
        if i as usize == self.slots.len() - 1 {
            self.slots.pop();
        } else {
            self.slots[i as usize] = AvcSlot::Free(self.free);
            self.free = i;
        }
        true
    }

    fn holds(&self, i: u32, vma: &Vma) -> bool {
        matches!(self.slots.get(i as usize), Some(AvcSlot::Used(w)) if std::ptr::eq(w.as_ptr(), vma))
    }

    fn vmas(&self) -> impl Iterator<Item = Arc<Vma>> + '_ {
        self.slots.iter().filter_map(|s| match s {
            AvcSlot::Used(w) => w.upgrade(),
            AvcSlot::Free(_) => None,
        })
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
    /// `anon_vma_interval_tree_remove`: take `vma`, whose link this is, out
    /// of the anon_vma's tree; returns whether it was there.
    pub fn unlink(self, vma: &Vma) -> bool {
        let key = vma_key(vma);
        let mut t = self.anon_vma.rb_root.write();
        let Some(avcs) = t.get_mut(key) else {
            return false;
        };
        if !avcs.unlink(self.slot, vma) {
            return false;
        }
        if avcs.live == 0 {
            t.remove(key);
        }
        true
    }
}

/// `struct anon_vma`: the set of VMAs whose pages an anonymous folio may be
/// mapped in.
pub struct AnonVma {
    pub id: u64,
    /// The anon_vma of the VMA this one's VMA was forked from.
    pub parent: Option<Arc<AnonVma>>,
    /// `rb_root`: every VMA chained to this anon_vma (its own, its splits'
    /// and its forked descendants'), by page-offset interval.
    rb_root: RwLock<Tree<Avcs>>,
}

impl AnonVma {
    pub fn new(parent: Option<Arc<AnonVma>>) -> Arc<AnonVma> {
        Arc::new(AnonVma {
            id: ANON_VMA_ID.fetch_add(1, Ordering::Relaxed),
            parent,
            rb_root: RwLock::new(Tree::new()),
        })
    }

    /// `anon_vma_interval_tree_insert`: returns the VMA's link, for
    /// [`AnonVmaChain::unlink`].
    pub fn interval_tree_insert(self: &Arc<Self>, vma: &Arc<Vma>) -> AnonVmaChain {
        let key = vma_key(vma);
        let mut t = self.rb_root.write();
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
        let t = self.rb_root.read();
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
        self.rb_root
            .read()
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
        let avc = av.interval_tree_insert(v);
        v.anon_vma_chain.lock().push(avc);
    }

    fn unlink(v: &Vma) -> bool {
        let avc = v.anon_vma_chain.lock().pop();
        avc.is_some_and(|c| c.unlink(v))
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
    fn freed_slots_are_reused_and_walks_keep_slot_order() {
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
        // The last freed slot is taken first.
        let late: Vec<Arc<Vma>> = (8..10)
            .map(|i| Arc::new(Vma::new(i, 0x10000, 0x20000, VM_READ, 0x10)))
            .collect();
        link(&av, &late[0]);
        link(&av, &late[1]);
        assert_eq!(ids(&av), [0, 1, 9, 3, 4, 8, 6, 7]);
        // Unlinking from the end shrinks the slab; the interval goes with
        // its last VMA.
        for v in vmas.iter().chain(&late) {
            unlink(v);
        }
        assert!(av.rb_root.read().is_empty());
    }
}
