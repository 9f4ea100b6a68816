//! `struct anon_vma` and its interval tree of VMAs (mm/interval_tree.c,
//! `anon_vma_interval_tree_*`).
//!
//! Every VMA chained to an anon_vma sits in the anon_vma's tree, found by
//! the page-offset interval it covers; the tree is augmented with the
//! largest last page offset of each subtree, so that an rmap walk for one
//! page visits only the VMAs whose range covers that page's offset.
//!
//! The kernel's tree holds one node per anon_vma_chain, and unlinking is an
//! `rb_erase` of that node, with no search. The model gets the same cost by
//! keeping one node per distinct interval, holding the set of VMAs that
//! cover it (the VMAs of a forked family usually all cover the same
//! interval): linking and unlinking a VMA is a search among the distinct
//! intervals, O(log n), and a hash-set insert or remove, however many VMAs
//! share the anon_vma (a long chain of forks).
//!
//! # Locking
//!
//! The tree is guarded by the anon_vma's own rwsem (`rb_root`'s lock): rmap
//! walks read it, linking and unlinking write it. The kernel takes the
//! *root* anon_vma's rwsem for a whole family; the model's lock per anon_vma
//! is finer, and nothing here needs the family held at once.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Weak;

use crate::mm::vma::Vma;
use crate::sync::{Arc, AtomicU64, Ordering, RwLock};
use crate::tree::{hash_prio, Entry, Tree};

static ANON_VMA_ID: AtomicU64 = AtomicU64::new(1);

/// The anon_vma_chains of one page-offset interval `[start, last]`: the
/// VMAs that cover exactly it, by address.
#[derive(Clone)]
pub struct Avcs {
    start_pgoff: u64,
    last_pgoff: u64,
    vmas: HashMap<usize, Weak<Vma>, BuildHasherDefault<PtrHasher>>,
}

impl Entry for Avcs {
    type Key = (u64, u64);
    /// `rb_subtree_last`: the largest last page offset in the subtree.
    type Summary = u64;

    fn key(&self) -> (u64, u64) {
        (self.start_pgoff, self.last_pgoff)
    }
    fn prio(&self) -> u64 {
        hash_prio(self.start_pgoff ^ hash_prio(self.last_pgoff))
    }
    fn summarize(left: Option<&u64>, this: &Avcs, right: Option<&u64>) -> u64 {
        this.last_pgoff
            .max(left.copied().unwrap_or(0))
            .max(right.copied().unwrap_or(0))
    }
}

/// Hashes a VMA's address: one multiply-and-mix, enough for pointers.
#[derive(Default)]
pub struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = hash_prio(self.0 ^ b as u64);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = hash_prio(n as u64);
    }
}

#[inline]
fn vma_key(vma: &Vma) -> ((u64, u64), usize) {
    ((vma.pgoff(), vma.last_pgoff()), vma as *const Vma as usize)
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

    /// `anon_vma_interval_tree_insert`.
    pub fn interval_tree_insert(&self, vma: &Arc<Vma>) {
        let (key, ptr) = vma_key(vma);
        let mut t = self.rb_root.write();
        let weak = Arc::downgrade(vma);
        if let Some(avcs) = t.get_mut(key) {
            let old = avcs.vmas.insert(ptr, weak);
            debug_assert!(old.is_none(), "{vma:?} linked twice");
        } else {
            let mut vmas = HashMap::default();
            vmas.insert(ptr, weak);
            t.insert(Avcs {
                start_pgoff: key.0,
                last_pgoff: key.1,
                vmas,
            });
        }
    }

    /// `anon_vma_interval_tree_remove`: returns whether the VMA was there.
    pub fn interval_tree_remove(&self, vma: &Vma) -> bool {
        let (key, ptr) = vma_key(vma);
        let mut t = self.rb_root.write();
        let Some(avcs) = t.get_mut(key) else {
            return false;
        };
        if avcs.vmas.remove(&ptr).is_none() {
            return false;
        }
        if avcs.vmas.is_empty() {
            t.remove(key);
        }
        true
    }

    /// `anon_vma_interval_tree_foreach` over `[first, last]`: the live VMAs
    /// whose page-offset range meets it.
    pub fn vmas_in(&self, first: u64, last: u64) -> Vec<Arc<Vma>> {
        let t = self.rb_root.read();
        let mut out = Vec::new();
        overlapping(t.root(), first, last, &mut out);
        out
    }

    /// Does the tree hold `vma`?
    pub fn has_vma(&self, vma: &Vma) -> bool {
        let (key, ptr) = vma_key(vma);
        self.rb_root
            .read()
            .get(key)
            .is_some_and(|a| a.vmas.contains_key(&ptr))
    }
}

/// The subtree's intervals that meet `[first, last]`, in order; subtrees
/// whose largest last offset is below `first` are skipped, and so is
/// everything right of a node that starts after `last`.
fn overlapping(
    n: Option<&crate::tree::Node<Avcs>>,
    first: u64,
    last: u64,
    out: &mut Vec<Arc<Vma>>,
) {
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
        out.extend(n.item.vmas.values().filter_map(Weak::upgrade));
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
        assert_eq!(av.vmas_in(0, u64::MAX).len(), 600);
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
