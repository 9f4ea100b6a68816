//! A persistent, augmented search tree: the model's stand-in for the
//! kernel's maple tree (lib/maple_tree.c) and its augmented rbtrees
//! (include/linux/interval_tree_generic.h).
//!
//! The tree is a treap whose nodes are shared between versions through
//! `Arc`: an update walks one path (O(log n) expected), copying the nodes on
//! it that another version still shares and changing the others in place
//! (`Arc::make_mut`), so the old version stays intact. That is what lets the VMA
//! tree be read with no lock at all: a writer builds the new version beside
//! the old one and publishes its root with one pointer swap (under an epoch,
//! as the maple tree is published under RCU); a reader holding the old root
//! sees the old tree whole, never a half-changed one.
//!
//! Each node caches the size of its subtree and a [`Entry::Summary`] of it
//! (the VMA tree keeps the largest gap between VMAs, as the maple tree keeps
//! its gap per node; the anon_vma interval tree keeps the largest last page
//! offset, as `ITSUBTREE` does), so that searches can skip whole subtrees.
//!
//! Priorities come from each entry ([`Entry::prio`]), hashed from its key,
//! so that the same contents always give the same shape: runs are
//! reproducible.

use crate::sync::Arc;

/// What a [`Tree`] holds.
pub trait Entry: Clone {
    type Key: Ord + Copy;
    /// A value computed over a subtree from its entries, bottom up.
    type Summary: Copy;

    fn key(&self) -> Self::Key;
    /// The treap priority; derive it from the key with [`hash_prio`].
    fn prio(&self) -> u64;
    /// The summary of a subtree: its left part's, this entry, its right
    /// part's.
    fn summarize(
        left: Option<&Self::Summary>,
        this: &Self,
        right: Option<&Self::Summary>,
    ) -> Self::Summary;
}

/// A well-mixed priority from a 64-bit key (splitmix64's finaliser).
#[inline]
pub fn hash_prio(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

pub struct Node<T: Entry> {
    pub item: T,
    left: Link<T>,
    right: Link<T>,
    count: usize,
    summary: T::Summary,
}

type Link<T> = Option<Arc<Node<T>>>;

/// A copy for a path that is being changed while another version still
/// shares the node (`Arc::make_mut`); children stay shared.
impl<T: Entry> Clone for Node<T> {
    fn clone(&self) -> Self {
        Node {
            item: self.item.clone(),
            left: self.left.clone(),
            right: self.right.clone(),
            count: self.count,
            summary: self.summary,
        }
    }
}

impl<T: Entry> Node<T> {
    /// Recompute the cached size and summary after a child changed.
    fn update(&mut self) {
        self.count = 1 + count(&self.left) + count(&self.right);
        self.summary = T::summarize(
            self.left.as_deref().map(|n| &n.summary),
            &self.item,
            self.right.as_deref().map(|n| &n.summary),
        );
    }

    pub fn left(&self) -> Option<&Node<T>> {
        self.left.as_deref()
    }
    pub fn right(&self) -> Option<&Node<T>> {
        self.right.as_deref()
    }
    pub fn summary(&self) -> &T::Summary {
        &self.summary
    }
}

#[inline]
fn count<T: Entry>(l: &Link<T>) -> usize {
    l.as_ref().map_or(0, |n| n.count)
}

/// One version of the tree. Cloning is O(1): the versions share nodes.
pub struct Tree<T: Entry> {
    root: Link<T>,
}

impl<T: Entry> Clone for Tree<T> {
    fn clone(&self) -> Self {
        Tree {
            root: self.root.clone(),
        }
    }
}

impl<T: Entry> Default for Tree<T> {
    fn default() -> Self {
        Tree { root: None }
    }
}

/// Split `t` into the entries with keys below `key` and the rest. Nodes
/// that no other version shares are changed in place; shared ones are
/// copied (path copying), so other versions never change.
fn split<T: Entry>(t: Link<T>, key: T::Key) -> (Link<T>, Link<T>) {
    let Some(mut n) = t else {
        return (None, None);
    };
    let node = Arc::make_mut(&mut n);
    if node.item.key() < key {
        let (l, r) = split(node.right.take(), key);
        node.right = l;
        node.update();
        (Some(n), r)
    } else {
        let (l, r) = split(node.left.take(), key);
        node.left = r;
        node.update();
        (l, Some(n))
    }
}

/// Join two trees, every key of `l` below every key of `r`.
fn join<T: Entry>(l: Link<T>, r: Link<T>) -> Link<T> {
    match (l, r) {
        (None, r) => r,
        (l, None) => l,
        (Some(mut a), Some(mut b)) => {
            if a.item.prio() >= b.item.prio() {
                let node = Arc::make_mut(&mut a);
                node.right = join(node.right.take(), Some(b));
                node.update();
                Some(a)
            } else {
                let node = Arc::make_mut(&mut b);
                node.left = join(Some(a), node.left.take());
                node.update();
                Some(b)
            }
        }
    }
}

fn insert<T: Entry>(t: &mut Link<T>, item: T) {
    match t {
        Some(n) if n.item.prio() >= item.prio() => {
            let node = Arc::make_mut(n);
            debug_assert!(item.key() != node.item.key(), "duplicate key");
            if item.key() < node.item.key() {
                insert(&mut node.left, item);
            } else {
                insert(&mut node.right, item);
            }
            node.update();
        }
        _ => {
            let (left, right) = split(t.take(), item.key());
            debug_assert!(
                right.as_ref().is_none_or(|r| first(r).key() != item.key()),
                "duplicate key"
            );
            *t = Some(make(item, left, right));
        }
    }
}

fn replace_at<T: Entry>(t: &mut Link<T>, item: T) -> Option<T> {
    let node = Arc::make_mut(t.as_mut()?);
    let old = match item.key().cmp(&node.item.key()) {
        std::cmp::Ordering::Less => replace_at(&mut node.left, item),
        std::cmp::Ordering::Greater => replace_at(&mut node.right, item),
        std::cmp::Ordering::Equal => Some(std::mem::replace(&mut node.item, item)),
    };
    if old.is_some() {
        node.update();
    }
    old
}

fn remove<T: Entry>(t: &mut Link<T>, key: T::Key) -> Option<T> {
    let node = Arc::make_mut(t.as_mut()?);
    let removed = match key.cmp(&node.item.key()) {
        std::cmp::Ordering::Less => remove(&mut node.left, key),
        std::cmp::Ordering::Greater => remove(&mut node.right, key),
        std::cmp::Ordering::Equal => {
            let left = node.left.take();
            let right = node.right.take();
            let unique = t.take().and_then(|n| Arc::try_unwrap(n).ok());
            let Some(gone) = unique else {
                unreachable!("made unique above");
            };
            *t = join(left, right);
            return Some(gone.item);
        }
    };
    if removed.is_some() {
        node.update();
    }
    removed
}

/// The entry with `key`, made unique to this version for changing in place
/// (the caller must not change its key or what its summary depends on).
fn get_mut<T: Entry>(t: &mut Link<T>, key: T::Key) -> Option<&mut T> {
    let node = Arc::make_mut(t.as_mut()?);
    match key.cmp(&node.item.key()) {
        std::cmp::Ordering::Less => get_mut(&mut node.left, key),
        std::cmp::Ordering::Greater => get_mut(&mut node.right, key),
        std::cmp::Ordering::Equal => Some(&mut node.item),
    }
}

/// A treap of `items`, already sorted by key, in O(n) (the right spine is
/// kept on a stack, as a Cartesian tree is built).
fn build_sorted<T: Entry>(items: impl IntoIterator<Item = T>) -> Link<T> {
    // Build with owned, mutable nodes first; freeze them into Arcs at the
    // end. Each stack element is (item, left subtree) of a node on the
    // right spine, whose right subtree is the next element.
    let mut spine: Vec<(T, Link<T>)> = Vec::new();
    for item in items {
        let mut left: Link<T> = None;
        while let Some((top, _)) = spine.last() {
            if top.prio() >= item.prio() {
                break;
            }
            let (top, top_left) = spine.pop().unwrap();
            left = Some(make(top, top_left, left));
        }
        spine.push((item, left));
    }
    let mut right: Link<T> = None;
    while let Some((item, left)) = spine.pop() {
        right = Some(make(item, left, right));
    }
    right
}

fn make<T: Entry>(item: T, left: Link<T>, right: Link<T>) -> Arc<Node<T>> {
    let summary = T::summarize(
        left.as_deref().map(|n| &n.summary),
        &item,
        right.as_deref().map(|n| &n.summary),
    );
    Arc::new(Node {
        count: 1 + count(&left) + count(&right),
        summary,
        item,
        left,
        right,
    })
}

impl<T: Entry> Tree<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// A tree of `items`, which must be sorted by key with no duplicates.
    pub fn from_sorted(items: impl IntoIterator<Item = T>) -> Self {
        Tree {
            root: build_sorted(items),
        }
    }

    pub fn len(&self) -> usize {
        count(&self.root)
    }

    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }

    pub fn root(&self) -> Option<&Node<T>> {
        self.root.as_deref()
    }

    /// Insert `item`, whose key must not be in the tree yet: down the
    /// search path to the first node of lower priority, whose subtree is
    /// split under the new node (one path copied, as a treap inserts).
    pub fn insert(&mut self, item: T) {
        insert(&mut self.root, item);
    }

    /// Put `item` in the place of the entry with the same key, whose
    /// summary may differ; returns the entry it replaced.
    pub fn replace_at(&mut self, item: T) -> Option<T> {
        replace_at(&mut self.root, item)
    }

    /// The entry with exactly this key, to change in place: its key, and
    /// whatever its summary is computed from, must stay as they are.
    pub fn get_mut(&mut self, key: T::Key) -> Option<&mut T> {
        get_mut(&mut self.root, key)
    }

    /// The entry with exactly this key.
    pub fn get(&self, key: T::Key) -> Option<&T> {
        self.first_where(|e| e.key() >= key)
            .filter(|e| e.key() == key)
    }

    /// Remove the entry with exactly this key; returns it.
    pub fn remove(&mut self, key: T::Key) -> Option<T> {
        remove(&mut self.root, key)
    }

    /// The first entry (in key order) for which `pred` holds, where `pred`
    /// is false for a prefix of the entries and true after it.
    pub fn first_where(&self, mut pred: impl FnMut(&T) -> bool) -> Option<&T> {
        let mut n = self.root.as_deref();
        let mut found = None;
        while let Some(node) = n {
            if pred(&node.item) {
                found = Some(&node.item);
                n = node.left.as_deref();
            } else {
                n = node.right.as_deref();
            }
        }
        found
    }

    /// The last entry for which `pred` holds, where `pred` is true for a
    /// prefix of the entries and false after it.
    pub fn last_where(&self, mut pred: impl FnMut(&T) -> bool) -> Option<&T> {
        let mut n = self.root.as_deref();
        let mut found = None;
        while let Some(node) = n {
            if pred(&node.item) {
                found = Some(&node.item);
                n = node.right.as_deref();
            } else {
                n = node.left.as_deref();
            }
        }
        found
    }

    /// In-order iterator over the entries from the first for which `pred`
    /// holds (`pred` as for [`Tree::first_where`]).
    pub fn iter_from(&self, mut pred: impl FnMut(&T) -> bool) -> Iter<'_, T> {
        let mut stack = Vec::new();
        let mut n = self.root.as_deref();
        while let Some(node) = n {
            if pred(&node.item) {
                stack.push(node);
                n = node.left.as_deref();
            } else {
                n = node.right.as_deref();
            }
        }
        Iter { stack }
    }

    pub fn iter(&self) -> Iter<'_, T> {
        self.iter_from(|_| true)
    }
}

fn first<T: Entry>(mut n: &Node<T>) -> &T {
    while let Some(l) = n.left.as_deref() {
        n = l;
    }
    &n.item
}

/// In-order iterator: a stack of the nodes whose left part is done.
pub struct Iter<'a, T: Entry> {
    stack: Vec<&'a Node<T>>,
}

impl<'a, T: Entry> Iterator for Iter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        let node = self.stack.pop()?;
        let mut n = node.right.as_deref();
        while let Some(c) = n {
            self.stack.push(c);
            n = c.left.as_deref();
        }
        Some(&node.item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys with a summary of the largest key in the subtree.
    #[derive(Clone, Debug, PartialEq)]
    struct K(u64);

    impl Entry for K {
        type Key = u64;
        type Summary = (u64, u64); // (min, max)
        fn key(&self) -> u64 {
            self.0
        }
        fn prio(&self) -> u64 {
            hash_prio(self.0)
        }
        fn summarize(l: Option<&(u64, u64)>, this: &K, r: Option<&(u64, u64)>) -> (u64, u64) {
            (l.map_or(this.0, |s| s.0), r.map_or(this.0, |s| s.1))
        }
    }

    fn keys(t: &Tree<K>) -> Vec<u64> {
        t.iter().map(|k| k.0).collect()
    }

    fn depth(n: Option<&Node<K>>) -> usize {
        n.map_or(0, |n| 1 + depth(n.left()).max(depth(n.right())))
    }

    #[test]
    fn insert_remove_replace_keep_order_and_old_versions() {
        let mut t = Tree::from_sorted((0..100).map(|i| K(i * 10)));
        assert_eq!(t.len(), 100);
        let old = t.clone();
        t.insert(K(55));
        assert_eq!(t.remove(30), Some(K(30)));
        for k in (100..200).step_by(10) {
            assert_eq!(t.remove(k), Some(K(k)));
        }
        t.insert(K(101));
        t.insert(K(150));
        assert_eq!(t.replace_at(K(150)), Some(K(150)));
        assert_eq!(t.replace_at(K(151)), None);
        let mut want: Vec<u64> = (0..100)
            .map(|i| i * 10)
            .filter(|&k| k != 30 && !(100..200).contains(&k))
            .collect();
        want.extend([55, 101, 150]);
        want.sort();
        assert_eq!(keys(&t), want);
        assert_eq!(t.len(), want.len());
        assert_eq!(
            keys(&old),
            (0..100).map(|i| i * 10).collect::<Vec<_>>(),
            "the old version is untouched"
        );
        assert_eq!(t.root().unwrap().summary(), &(0, 990));
        assert_eq!(t.first_where(|k| k.0 > 52).unwrap().0, 55);
        assert_eq!(t.last_where(|k| k.0 < 52).unwrap().0, 50);
        assert_eq!(
            t.iter_from(|k| k.0 >= 140)
                .map(|k| k.0)
                .take(3)
                .collect::<Vec<_>>(),
            vec![150, 200, 210]
        );
    }

    #[test]
    fn depth_stays_logarithmic() {
        let mut t = Tree::new();
        for i in 0..65536u64 {
            t.insert(K(i << 12));
        }
        let d = depth(t.root());
        assert!(d < 60, "depth {d} for 65536 sequential inserts");
        let b = Tree::from_sorted((0..65536u64).map(|i| K(i << 12)));
        assert!(depth(b.root()) < 60);
        for i in (0..65536u64).step_by(2) {
            t.remove(i << 12);
        }
        assert_eq!(t.len(), 32768);
        assert!(depth(t.root()) < 60);
    }
}
