//! `struct anon_vma` and its interval tree of VMAs (mm/interval_tree.c,
//! `anon_vma_interval_tree_*`).
//!
//! Every VMA chained to an anon_vma sits in the anon_vma's tree, keyed by the
//! VMA's first page offset and augmented with the largest last page offset
//! of each subtree, so that an rmap walk for one page visits only the VMAs
//! whose range covers that page's offset, and linking or unlinking a VMA is
//! O(log n) however many VMAs share the anon_vma (a long chain of forks).
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
use crate::tree::{hash_prio, Entry, Tree};

static ANON_VMA_ID: AtomicU64 = AtomicU64::new(1);

/// `struct anon_vma_chain`, as it sits in an anon_vma's tree: which VMA, and
/// the page-offset interval it covers (fixed, since VMAs are never resized
/// in place).
#[derive(Clone)]
pub struct Avc {
    vma: Weak<Vma>,
    start_pgoff: u64,
    last_pgoff: u64,
}

impl Avc {
    fn new(vma: &Arc<Vma>) -> Avc {
        Avc {
            vma: Arc::downgrade(vma),
            start_pgoff: vma.pgoff(),
            last_pgoff: vma.last_pgoff(),
        }
    }
}

impl Entry for Avc {
    /// The first page offset, then the VMA's address to tell apart VMAs
    /// (of other processes) that start at the same offset.
    type Key = (u64, usize);
    /// `rb_subtree_last`: the largest last page offset in the subtree.
    type Summary = u64;

    fn key(&self) -> (u64, usize) {
        (self.start_pgoff, self.vma.as_ptr() as usize)
    }
    fn prio(&self) -> u64 {
        hash_prio(self.start_pgoff ^ hash_prio(self.vma.as_ptr() as u64))
    }
    fn summarize(left: Option<&u64>, this: &Avc, right: Option<&u64>) -> u64 {
        this.last_pgoff
            .max(left.copied().unwrap_or(0))
            .max(right.copied().unwrap_or(0))
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
    rb_root: RwLock<Tree<Avc>>,
}

impl AnonVma {
    pub fn new(parent: Option<Arc<AnonVma>>) -> Arc<AnonVma> {
        Arc::new(AnonVma {
            id: ANON_VMA_ID.fetch_add(1, Ordering::Relaxed),
            parent,
            rb_root: RwLock::new(Tree::new()),
        })
    }

    /// `anon_vma_interval_tree_insert`.
    pub fn interval_tree_insert(&self, vma: &Arc<Vma>) {
        self.rb_root.write().insert(Avc::new(vma));
    }

    /// `anon_vma_interval_tree_remove`: returns whether the VMA was there.
    pub fn interval_tree_remove(&self, vma: &Vma) -> bool {
        let key = (vma.pgoff(), vma as *const Vma as usize);
        let mut t = self.rb_root.write();
        let removed = t.replace_range(key, (key.0, key.1 + 1), Vec::new());
        !removed.is_empty()
    }

    /// `anon_vma_interval_tree_foreach` over `[first, last]`: the live VMAs
    /// whose page-offset range meets it.
    pub fn vmas_in(&self, first: u64, last: u64) -> Vec<Arc<Vma>> {
        let t = self.rb_root.read();
        let mut out = Vec::new();
        overlapping(t.root(), first, last, &mut out);
        out
    }

    /// Number of VMAs chained.
    pub fn nr_vmas(&self) -> usize {
        self.rb_root.read().len()
    }

    /// Does the tree hold `vma`?
    pub fn has_vma(&self, vma: &Vma) -> bool {
        let key = (vma.pgoff(), vma as *const Vma as usize);
        self.rb_root
            .read()
            .first_where(|a| a.key() >= key)
            .is_some_and(|a| a.key() == key)
    }
}

/// The subtree's intervals that meet `[first, last]`, in order; subtrees
/// whose largest last offset is below `first` are skipped, and so is
/// everything right of a node that starts after `last`.
fn overlapping(n: Option<&crate::tree::Node<Avc>>, first: u64, last: u64, out: &mut Vec<Arc<Vma>>) {
    let Some(n) = n else {
        return;
    };
    if *n.summary() < first {
        return;
    }
    overlapping(n.left(), first, last, out);
    if n.item.start_pgoff > last {
        return;
    }
    if n.item.last_pgoff >= first {
        out.extend(n.item.vma.upgrade());
    }
    overlapping(n.right(), first, last, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm::vma::VM_READ;

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
            av.interval_tree_insert(v);
        }
        assert_eq!(av.nr_vmas(), 600);
        assert_eq!(av.vmas_in(0x15, 0x15).len(), 300);
        assert_eq!(av.vmas_in(0x105, 0x105).len(), 1);
        assert_eq!(av.vmas_in(0x1f, 0x100).len(), 301);
        assert!(av.vmas_in(0x500, 0x600).is_empty());
        assert!(av.has_vma(&same[7]) && av.has_vma(&other[7]));
        for v in same.iter().step_by(2) {
            assert!(av.interval_tree_remove(v));
            assert!(!av.interval_tree_remove(v));
        }
        assert_eq!(av.vmas_in(0x15, 0x15).len(), 150);
        assert!(!av.has_vma(&same[0]) && av.has_vma(&same[1]));
    }
}
