//! A persistent, augmented B+ tree: the model's stand-in for the kernel's
//! maple tree (lib/maple_tree.c) and its augmented rbtrees
//! (include/linux/interval_tree_generic.h).
//!
//! Entries live in leaves of up to [`NODE_SLOTS`] entries; a branch holds up
//! to as many slots, each naming a child with the child's smallest key (its
//! pivot), its number of entries and a [`Entry::Summary`] of it. Like the
//! maple tree, which keeps 16 slots per node and the largest gap of each
//! child in its parent, the tree is wide and shallow: 65,536 entries are
//! four levels deep, and a search reads one node per level.
//!
//! Nodes are shared between versions through `Arc`. An update walks one
//! root-to-leaf path, copying the nodes on it that another version still
//! shares (`Arc::make_mut`) and changing the others in place, so the old
//! version stays intact. That is what lets the VMA tree be read with no lock
//! at all: a writer builds the new version beside the old one and publishes
//! its root with one pointer swap (under an epoch, as the maple tree is
//! published under RCU); a reader holding the old root sees the old tree
//! whole, never a half-changed one. The kernel's maple tree copies the nodes
//! it changes for the same reason (`mas_wr_node_store` builds a new node and
//! replaces the old one under RCU).
//!
//! Summaries let searches skip whole subtrees: the VMA tree keeps the largest
//! gap between VMAs (as the maple tree keeps its gaps), the anon_vma interval
//! tree the largest last page offset (as `ITSUBTREE` does). A summary is a
//! monoid: [`Entry::summary`] of one entry, and [`Entry::combine`] of two
//! adjacent runs, left then right.

use arrayvec::ArrayVec;

use crate::sync::Arc;

/// Slots per node, as the maple tree's `MAPLE_RANGE64_SLOTS`.
pub const NODE_SLOTS: usize = 16;
/// The fewest slots of a node other than the root.
const MIN_SLOTS: usize = NODE_SLOTS / 2;

/// What a [`Tree`] holds.
pub trait Entry: Clone {
    type Key: Ord + Copy;
    /// A value computed over a run of entries.
    type Summary: Copy;

    fn key(&self) -> Self::Key;
    /// The summary of this entry alone.
    fn summary(&self) -> Self::Summary;
    /// The summary of a run made of `left` followed by `right`; must be
    /// associative.
    fn combine(left: &Self::Summary, right: &Self::Summary) -> Self::Summary;
}

/// One child of a branch, with what the branch knows of it.
pub struct Slot<T: Entry> {
    /// The smallest key in the child (the pivot).
    key: T::Key,
    summary: T::Summary,
    count: usize,
    child: Arc<Node<T>>,
}

impl<T: Entry> Clone for Slot<T> {
    fn clone(&self) -> Self {
        Slot {
            key: self.key,
            summary: self.summary,
            count: self.count,
            child: self.child.clone(),
        }
    }
}

impl<T: Entry> Slot<T> {
    fn of(child: Arc<Node<T>>) -> Self {
        Slot {
            key: child.first_key(),
            summary: child.summary(),
            count: child.count(),
            child,
        }
    }

    /// Recompute what the branch knows after the child changed.
    fn refresh(&mut self) {
        self.key = self.child.first_key();
        self.summary = self.child.summary();
        self.count = self.child.count();
    }

    pub fn key(&self) -> T::Key {
        self.key
    }
    pub fn summary(&self) -> &T::Summary {
        &self.summary
    }
    pub fn node(&self) -> NodeRef<'_, T> {
        self.child.as_ref_view()
    }
}

type Slots<T> = ArrayVec<Slot<T>, NODE_SLOTS>;
type Leaf<T> = ArrayVec<Keyed<T>, NODE_SLOTS>;

/// An entry in a leaf, beside its key and summary: searches and summary
/// updates read the leaf alone, as the maple tree reads its pivots and
/// gaps, and touch only the entry they find (an entry may live elsewhere,
/// as a VMA does).
pub struct Keyed<T: Entry> {
    pub key: T::Key,
    pub summary: T::Summary,
    pub item: T,
}

impl<T: Entry> Keyed<T> {
    fn new(item: T) -> Self {
        Keyed {
            key: item.key(),
            summary: item.summary(),
            item,
        }
    }
}

impl<T: Entry> Clone for Keyed<T> {
    fn clone(&self) -> Self {
        Keyed {
            key: self.key,
            summary: self.summary,
            item: self.item.clone(),
        }
    }
}

/// A node: a leaf of entries or a branch of slots, never empty unless it
/// is the root of an empty tree (which is then dropped).
pub enum Node<T: Entry> {
    Leaf(Leaf<T>),
    Branch(Slots<T>),
}

/// A copy for a path that is being changed while another version still
/// shares the node; children stay shared.
impl<T: Entry> Clone for Node<T> {
    fn clone(&self) -> Self {
        match self {
            Node::Leaf(v) => Node::Leaf(v.clone()),
            Node::Branch(s) => Node::Branch(s.clone()),
        }
    }
}

/// A read-only view of a node, for searches that prune by summary
/// (`unmapped_area_topdown`, the interval tree's overlap walk).
pub enum NodeRef<'a, T: Entry> {
    Leaf(&'a [Keyed<T>]),
    Branch(&'a [Slot<T>]),
}

fn fold<T: Entry>(mut it: impl Iterator<Item = T::Summary>) -> T::Summary {
    let Some(first) = it.next() else {
        unreachable!("summary of an empty node");
    };
    it.fold(first, |acc, s| T::combine(&acc, &s))
}

impl<T: Entry> Node<T> {
    fn len(&self) -> usize {
        match self {
            Node::Leaf(v) => v.len(),
            Node::Branch(s) => s.len(),
        }
    }

    fn first_key(&self) -> T::Key {
        match self {
            Node::Leaf(v) => v[0].key,
            Node::Branch(s) => s[0].key,
        }
    }

    fn summary(&self) -> T::Summary {
        match self {
            Node::Leaf(v) => fold::<T>(v.iter().map(|e| e.summary)),
            Node::Branch(s) => fold::<T>(s.iter().map(|s| s.summary)),
        }
    }

    fn count(&self) -> usize {
        match self {
            Node::Leaf(v) => v.len(),
            Node::Branch(s) => s.iter().map(|s| s.count).sum(),
        }
    }

    fn as_ref_view(&self) -> NodeRef<'_, T> {
        match self {
            Node::Leaf(v) => NodeRef::Leaf(v),
            Node::Branch(s) => NodeRef::Branch(s),
        }
    }
}

/// The slot of a branch whose child holds `key`, or would: the last whose
/// pivot is at or below it (the first if none is).
#[inline]
fn child_index<T: Entry>(slots: &[Slot<T>], key: T::Key) -> usize {
    slots.partition_point(|s| s.key <= key).saturating_sub(1)
}

/// Insert `x` at `i` of a node's array; if the node is full, split it in
/// two halves first and return the right one.
fn insert_split<X>(
    v: &mut ArrayVec<X, NODE_SLOTS>,
    i: usize,
    x: X,
) -> Option<ArrayVec<X, NODE_SLOTS>> {
    if !v.is_full() {
        v.insert(i, x);
        return None;
    }
    let mut right: ArrayVec<X, NODE_SLOTS> = v.drain(MIN_SLOTS..).collect();
    if i <= MIN_SLOTS {
        v.insert(i, x);
    } else {
        right.insert(i - MIN_SLOTS, x);
    }
    Some(right)
}

/// Insert `item` below `node`; returns the new right sibling if the node
/// split.
fn insert<T: Entry>(node: &mut Arc<Node<T>>, item: T) -> Option<Arc<Node<T>>> {
    match Arc::make_mut(node) {
        Node::Leaf(v) => {
            let key = item.key();
            let i = v.partition_point(|e| e.key < key);
            debug_assert!(v.get(i).is_none_or(|e| e.key != key), "duplicate key");
            insert_split(v, i, Keyed::new(item)).map(|r| Arc::new(Node::Leaf(r)))
        }
        Node::Branch(s) => {
            let i = child_index(s, item.key());
            let split = insert(&mut s[i].child, item);
            s[i].refresh();
            let right = Slot::of(split?);
            insert_split(s, i + 1, right).map(|r| Arc::new(Node::Branch(r)))
        }
    }
}

/// Even out two neighbouring nodes' arrays after `left` or `right` fell
/// below the minimum: merge them into `left` if they fit in one node (and
/// return true), else move one entry to the short side.
fn rebalance_pair<X>(
    left: &mut ArrayVec<X, NODE_SLOTS>,
    right: &mut ArrayVec<X, NODE_SLOTS>,
) -> bool {
    if left.len() + right.len() <= NODE_SLOTS {
        left.extend(right.drain(..));
        return true;
    }
    if left.len() < MIN_SLOTS {
        left.push(right.remove(0));
    } else {
        let Some(x) = left.pop() else {
            unreachable!("a node over the minimum is not empty");
        };
        right.insert(0, x);
    }
    false
}

/// Child `i` of a branch fell below the minimum: merge it with a
/// neighbour, or take an entry from one.
fn rebalance<T: Entry>(slots: &mut Slots<T>, i: usize) {
    debug_assert!(slots.len() >= 2, "a branch has two children or more");
    let l = if i + 1 < slots.len() { i } else { i - 1 };
    let (a, b) = slots.split_at_mut(l + 1);
    let (left, right) = (&mut a[l], &mut b[0]);
    let merged = match (
        Arc::make_mut(&mut left.child),
        Arc::make_mut(&mut right.child),
    ) {
        (Node::Leaf(x), Node::Leaf(y)) => rebalance_pair(x, y),
        (Node::Branch(x), Node::Branch(y)) => rebalance_pair(x, y),
        _ => unreachable!("siblings are at the same level"),
    };
    left.refresh();
    if merged {
        slots.remove(l + 1);
    } else {
        right.refresh();
    }
}

/// Remove the entry with `key`, which the tree holds.
fn remove<T: Entry>(node: &mut Arc<Node<T>>, key: T::Key) -> Option<T> {
    match Arc::make_mut(node) {
        Node::Leaf(v) => {
            let i = v.binary_search_by(|e| e.key.cmp(&key)).ok()?;
            Some(v.remove(i).item)
        }
        Node::Branch(s) => {
            let i = child_index(s, key);
            let gone = remove(&mut s[i].child, key)?;
            if s[i].child.len() < MIN_SLOTS {
                rebalance(s, i);
            } else {
                s[i].refresh();
            }
            Some(gone)
        }
    }
}

fn replace_at<T: Entry>(node: &mut Arc<Node<T>>, item: T) -> Option<T> {
    match Arc::make_mut(node) {
        Node::Leaf(v) => {
            let i = v.binary_search_by(|e| e.key.cmp(&item.key())).ok()?;
            Some(std::mem::replace(&mut v[i], Keyed::new(item)).item)
        }
        Node::Branch(s) => {
            let i = child_index(s, item.key());
            let old = replace_at(&mut s[i].child, item)?;
            s[i].refresh();
            Some(old)
        }
    }
}

/// The entry with `key`, made unique to this version for changing in place
/// (the caller must not change its key or what its summary depends on).
fn get_mut<T: Entry>(node: &mut Arc<Node<T>>, key: T::Key) -> Option<&mut T> {
    match Arc::make_mut(node) {
        Node::Leaf(v) => {
            let i = v.binary_search_by(|e| e.key.cmp(&key)).ok()?;
            Some(&mut v[i].item)
        }
        Node::Branch(s) => {
            let i = child_index(s, key);
            get_mut(&mut s[i].child, key)
        }
    }
}

/// Cut `n` things into runs of at most [`NODE_SLOTS`], none below
/// [`MIN_SLOTS`] unless there is only one: the sizes of a level built
/// bottom up.
fn run_sizes(n: usize) -> impl Iterator<Item = usize> {
    let runs = n.div_ceil(NODE_SLOTS).max(1);
    (0..runs).map(move |i| n / runs + usize::from(i < n % runs))
}

/// One version of the tree. Cloning is O(1): the versions share nodes.
pub struct Tree<T: Entry> {
    root: Option<Arc<Node<T>>>,
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

impl<T: Entry> Tree<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// A tree of `items`, which must be sorted by key with no duplicates,
    /// built bottom up in O(n) with every node at least half full.
    pub fn from_sorted(items: impl IntoIterator<Item = T>) -> Self {
        let items: Vec<T> = items.into_iter().collect();
        debug_assert!(
            items.windows(2).all(|w| w[0].key() < w[1].key()),
            "unsorted"
        );
        if items.is_empty() {
            return Tree::new();
        }
        let mut it = items.into_iter();
        let mut level: Vec<Arc<Node<T>>> = run_sizes(it.len())
            .map(|k| Arc::new(Node::Leaf(it.by_ref().take(k).map(Keyed::new).collect())))
            .collect();
        while level.len() > 1 {
            let mut it = level.into_iter();
            level = run_sizes(it.len())
                .map(|k| Arc::new(Node::Branch(it.by_ref().take(k).map(Slot::of).collect())))
                .collect();
        }
        Tree { root: level.pop() }
    }

    pub fn len(&self) -> usize {
        self.root.as_ref().map_or(0, |r| r.count())
    }

    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }

    /// The root, for searches that prune by summary.
    pub fn root(&self) -> Option<NodeRef<'_, T>> {
        self.root.as_deref().map(Node::as_ref_view)
    }

    /// The summary of the whole tree.
    pub fn summary(&self) -> Option<T::Summary> {
        self.root.as_deref().map(Node::summary)
    }

    /// Insert `item`, whose key must not be in the tree yet: down one path,
    /// splitting full nodes on the way back up (and the root, which makes
    /// the tree one level deeper).
    pub fn insert(&mut self, item: T) {
        let Some(root) = self.root.as_mut() else {
            self.root = Some(Arc::new(Node::Leaf(ArrayVec::from_iter([Keyed::new(
                item,
            )]))));
            return;
        };
        if let Some(right) = insert(root, item) {
            let left = self.root.take().unwrap_or_else(|| unreachable!());
            let slots = ArrayVec::from_iter([Slot::of(left), Slot::of(right)]);
            self.root = Some(Arc::new(Node::Branch(slots)));
        }
    }

    /// Put `item` in the place of the entry with the same key, whose
    /// summary may differ; returns the entry it replaced.
    pub fn replace_at(&mut self, item: T) -> Option<T> {
        self.get(item.key())?;
        replace_at(self.root.as_mut()?, item)
    }

    /// The entry with exactly this key, to change in place: its key, and
    /// whatever its summary is computed from, must stay as they are.
    pub fn get_mut(&mut self, key: T::Key) -> Option<&mut T> {
        self.get(key)?;
        get_mut(self.root.as_mut()?, key)
    }

    /// The entry with exactly this key.
    pub fn get(&self, key: T::Key) -> Option<&T> {
        self.first_from(key).filter(|e| e.key() == key)
    }

    /// Remove the entry with exactly this key; returns it. Nodes left below
    /// half full take from or merge with a neighbour; a root with one child
    /// gives way to it.
    pub fn remove(&mut self, key: T::Key) -> Option<T> {
        // Look first: a miss must not copy the path.
        self.get(key)?;
        let root = self.root.as_mut()?;
        let gone = remove(root, key)?;
        let shrunk = match root.as_ref() {
            Node::Leaf(v) if v.is_empty() => Some(None),
            Node::Branch(s) if s.len() == 1 => Some(Some(s[0].child.clone())),
            _ => None,
        };
        if let Some(new_root) = shrunk {
            self.root = new_root;
        }
        Some(gone)
    }

    /// The first entry whose key is `key` or above.
    pub fn first_from(&self, key: T::Key) -> Option<&T> {
        self.iter_from(key).next()
    }

    /// The last entry whose key is below `key`.
    pub fn last_before(&self, key: T::Key) -> Option<&T> {
        let mut n = self.root.as_deref()?;
        loop {
            match n {
                Node::Leaf(v) => {
                    let i = v.partition_point(|e| e.key < key);
                    return i.checked_sub(1).map(|i| &v[i].item);
                }
                Node::Branch(s) => {
                    // The last child whose smallest key is below `key`
                    // holds the answer, if any child does.
                    let i = s.partition_point(|s| s.key < key).checked_sub(1)?;
                    n = &s[i].child;
                }
            }
        }
    }

    /// In-order iterator over the entries from the first whose key is `key`
    /// or above.
    pub fn iter_from(&self, key: T::Key) -> Iter<'_, T> {
        let mut it = Iter {
            stack: Vec::new(),
            leaf: &[],
            pos: 0,
        };
        let Some(mut n) = self.root.as_deref() else {
            return it;
        };
        loop {
            match n {
                Node::Leaf(v) => {
                    it.leaf = v;
                    it.pos = v.partition_point(|e| e.key < key);
                    return it;
                }
                Node::Branch(s) => {
                    let i = child_index(s, key);
                    it.stack.push((s, i));
                    n = &s[i].child;
                }
            }
        }
    }

    pub fn iter(&self) -> Iter<'_, T> {
        let mut it = Iter {
            stack: Vec::new(),
            leaf: &[],
            pos: 0,
        };
        if let Some(r) = self.root.as_deref() {
            it.descend_first(r);
        }
        it
    }

    /// The tree's shape: keys in order, pivots, counts and summaries as
    /// the children say, every node but the root at least half full, all
    /// leaves at one depth. For tests and the invariant checker.
    pub fn check_shape(&self) -> Result<(), String>
    where
        T::Summary: PartialEq,
    {
        let Some(root) = self.root.as_deref() else {
            return Ok(());
        };
        check_node(root, true)?;
        let mut keys = self.iter().map(T::key);
        let mut prev = keys.next();
        for k in keys {
            if prev.is_some_and(|p| p >= k) {
                return Err("keys out of order".into());
            }
            prev = Some(k);
        }
        Ok(())
    }
}

/// Check `n`'s subtree; returns its depth.
fn check_node<T: Entry>(n: &Node<T>, is_root: bool) -> Result<usize, String>
where
    T::Summary: PartialEq,
{
    if n.len() == 0 || (!is_root && n.len() < MIN_SLOTS) {
        return Err(format!("node of {} slots", n.len()));
    }
    match n {
        Node::Leaf(v) => {
            if v.iter()
                .any(|e| e.key != e.item.key() || e.summary != e.item.summary())
            {
                return Err("a leaf's key or summary disagrees with its entry".into());
            }
            Ok(1)
        }
        Node::Branch(s) => {
            if is_root && s.len() < 2 {
                return Err("root branch with one child".into());
            }
            let mut depth = None;
            for (i, slot) in s.iter().enumerate() {
                let c = &slot.child;
                if slot.key != c.first_key()
                    || slot.count != c.count()
                    || slot.summary != c.summary()
                {
                    return Err(format!("slot {i} disagrees with its child"));
                }
                let d = check_node(c, false)?;
                if depth.is_some_and(|x| x != d) {
                    return Err("leaves at different depths".into());
                }
                depth = Some(d);
            }
            Ok(depth.unwrap_or(0) + 1)
        }
    }
}

/// In-order iterator: the branches on the path to the current leaf, each
/// with the index of the child being visited.
pub struct Iter<'a, T: Entry> {
    stack: Vec<(&'a [Slot<T>], usize)>,
    leaf: &'a [Keyed<T>],
    pos: usize,
}

impl<'a, T: Entry> Iter<'a, T> {
    fn descend_first(&mut self, mut n: &'a Node<T>) {
        loop {
            match n {
                Node::Leaf(v) => {
                    self.leaf = v;
                    self.pos = 0;
                    return;
                }
                Node::Branch(s) => {
                    self.stack.push((s, 0));
                    n = &s[0].child;
                }
            }
        }
    }
}

impl<'a, T: Entry> Iterator for Iter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        loop {
            if let Some(e) = self.leaf.get(self.pos) {
                self.pos += 1;
                return Some(&e.item);
            }
            // This leaf is done: up to the nearest branch with a next child.
            loop {
                let (s, i) = self.stack.last_mut()?;
                if *i + 1 < s.len() {
                    *i += 1;
                    let child: &'a Node<T> = &s[*i].child;
                    self.descend_first(child);
                    break;
                }
                self.stack.pop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Keys with a summary of (smallest, largest) key.
    #[derive(Clone, Debug, PartialEq)]
    struct K(u64);

    impl Entry for K {
        type Key = u64;
        type Summary = (u64, u64);
        fn key(&self) -> u64 {
            self.0
        }
        fn summary(&self) -> (u64, u64) {
            (self.0, self.0)
        }
        fn combine(l: &(u64, u64), r: &(u64, u64)) -> (u64, u64) {
            (l.0, r.1)
        }
    }

    fn keys(t: &Tree<K>) -> Vec<u64> {
        t.iter().map(|k| k.0).collect()
    }

    fn depth(t: &Tree<K>) -> usize {
        let mut d = 0;
        let mut n = t.root();
        while let Some(r) = n {
            d += 1;
            n = match r {
                NodeRef::Leaf(_) => None,
                NodeRef::Branch(s) => Some(s[0].node()),
            };
        }
        d
    }

    #[test]
    fn insert_remove_replace_keep_order_and_old_versions() {
        let mut t = Tree::from_sorted((0..100).map(|i| K(i * 10)));
        assert_eq!(t.len(), 100);
        let old = t.clone();
        t.insert(K(55));
        assert_eq!(t.remove(30), Some(K(30)));
        assert_eq!(t.remove(31), None);
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
        old.check_shape().unwrap();
        t.check_shape().unwrap();
        assert_eq!(t.summary(), Some((0, 990)));
        assert_eq!(t.first_from(52).unwrap().0, 55);
        assert_eq!(t.last_before(52).unwrap().0, 50);
        assert_eq!(t.last_before(0), None);
        assert_eq!(t.first_from(991), None);
        assert_eq!(
            t.iter_from(140).map(|k| k.0).take(3).collect::<Vec<_>>(),
            vec![150, 200, 210]
        );
    }

    #[test]
    fn depth_stays_logarithmic() {
        let mut t = Tree::new();
        for i in 0..65536u64 {
            t.insert(K(i << 12));
        }
        // Half-full nodes at worst: log8(65536) rounded up, plus the root.
        assert!(
            depth(&t) <= 6,
            "depth {} for 65536 sequential inserts",
            depth(&t)
        );
        t.check_shape().unwrap();
        let b = Tree::from_sorted((0..65536u64).map(|i| K(i << 12)));
        assert!(depth(&b) <= 5);
        b.check_shape().unwrap();
        for i in (0..65536u64).step_by(2) {
            t.remove(i << 12);
        }
        assert_eq!(t.len(), 32768);
        assert!(depth(&t) <= 6);
        t.check_shape().unwrap();
    }

    proptest! {
        /// Any sequence of inserts and removes gives the same entries as a
        /// BTreeSet, a well-formed tree, and leaves every older version as
        /// it was.
        #[test]
        fn agrees_with_a_btreeset(
            start in proptest::collection::btree_set(0u64..2000, 0..300),
            ops in proptest::collection::vec((any::<bool>(), 0u64..2000), 0..600),
        ) {
            let mut t = Tree::from_sorted(start.iter().map(|&k| K(k)));
            let mut model = start.clone();
            let mut versions = vec![(t.clone(), model.clone())];
            for (i, (add, k)) in ops.into_iter().enumerate() {
                if add {
                    if model.insert(k) {
                        t.insert(K(k));
                    }
                } else {
                    prop_assert_eq!(t.remove(k).is_some(), model.remove(&k));
                }
                if i % 50 == 0 {
                    versions.push((t.clone(), model.clone()));
                }
            }
            versions.push((t, model));
            for (t, model) in &versions {
                prop_assert!(t.check_shape().is_ok());
                prop_assert_eq!(keys(t), model.iter().copied().collect::<Vec<_>>());
                prop_assert_eq!(t.len(), model.len());
                for probe in [0, 7, 999, 1999, 2500] {
                    prop_assert_eq!(t.first_from(probe).map(|k| k.0), model.range(probe..).next().copied());
                    prop_assert_eq!(t.last_before(probe).map(|k| k.0), model.range(..probe).next_back().copied());
                }
            }
        }
    }
}
