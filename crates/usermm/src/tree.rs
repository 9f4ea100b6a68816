//! A persistent, augmented B+ tree: the model's stand-in for the kernel's
//! maple tree (lib/maple_tree.c) and its augmented rbtrees
//! (include/linux/interval_tree_generic.h).
//!
//! Entries live in leaves of up to [`NODE_SLOTS`] entries, each beside its
//! key and summary; a branch holds up to as many slots, each naming a child
//! with the child's smallest key (its pivot), its number of entries and a
//! [`Entry::Summary`] of it. Like the maple tree, which keeps 16 slots per
//! node and the largest gap of each child in its parent, the tree is wide
//! and shallow: 65,536 entries are four levels deep, and a search reads one
//! node per level and no entry but the one it finds.
//!
//! Summaries let searches skip whole subtrees: the VMA tree keeps the largest
//! gap between VMAs (as the maple tree keeps its gaps), the anon_vma interval
//! tree the largest last page offset (as `ITSUBTREE` does). A summary is a
//! monoid: [`Entry::summary`] of one entry, and [`Entry::combine`] of two
//! adjacent runs, left then right.
//!
//! # Versions, and who frees a node
//!
//! A tree may be read with no lock while a writer changes it, as the maple
//! tree is under RCU: the writer works on a *draft* ([`Tree::draft`]) that
//! shares every node with the published version, copies each node it
//! changes (copy on write, one root-to-leaf path per update) and swaps the
//! result in whole ([`Tree::publish`]); a reader holding the old version
//! sees it whole, never half changed. The kernel's maple tree replaces the
//! nodes it changes in the same way (`mas_wr_node_store` builds a new node,
//! `mas_replace_node` swaps it in and frees the old one by RCU).
//!
//! Nodes carry no reference count (counting them made every copy of a branch
//! touch its 16 children, and freeing an old version touch them again);
//! instead each node carries the *generation* of the tree that allocated
//! it, and ownership follows the maple tree's:
//!
//! * A tree changes in place only the nodes of its own generation, which
//!   nothing else can reach: a draft allocated them and has not published
//!   them. Any other node it changes, it copies, and *retires* the original.
//! * Publishing hands a draft's nodes to the published version (a read-only
//!   view that owns no node) and gives the draft a new generation, so that it
//!   copies them too from then on; the retired nodes are freed one grace
//!   period later ([`Retired::free`]), when no reader can still hold a
//!   version that names them.
//! * A tree dropped frees the nodes of its own generation (an unpublished
//!   draft's copies, or all of a tree that was never published, such as an
//!   anon_vma's interval tree) and no other.
//!
//! Every node pointer stored in a live tree therefore names a live node for
//! as long as the tree is borrowed: that is what the `unsafe` blocks below
//! rely on.

use std::alloc::Layout;
use std::ptr::NonNull;

use arrayvec::ArrayVec;
use smallvec::SmallVec;

use crate::sync::{AtomicU64, Ordering};

/// Slots per node, as the maple tree's `MAPLE_RANGE64_SLOTS`.
pub const NODE_SLOTS: usize = 16;
/// The fewest slots of a node other than the root.
const MIN_SLOTS: usize = NODE_SLOTS / 2;
/// Deeper than any tree can grow: with half-full nodes, 2^64 entries need
/// 22 levels.
const MAX_DEPTH: usize = 24;

/// What a [`Tree`] holds.
pub trait Entry: Clone {
    type Key: Ord + Copy;
    /// A value computed over a run of entries.
    type Summary: Copy;

    /// Whether a search asks for each node's every line before it reads
    /// the node: worth it for a tree searched one key at a time among cold
    /// nodes (the VMA tree); a tree walked in bulk (an anon_vma's interval
    /// tree in a fork chain's teardown, which prefetches its own way)
    /// would spend the bandwidth on lines it never reads.
    const PREFETCH_NODES: bool = false;

    fn key(&self) -> Self::Key;
    /// The summary of this entry alone.
    fn summary(&self) -> Self::Summary;
    /// The summary of a run made of `left` followed by `right`; must be
    /// associative.
    fn combine(left: &Self::Summary, right: &Self::Summary) -> Self::Summary;
}

/// A node, owned by the rules of the module doc.
struct NodePtr<T: Entry>(NonNull<Node<T>>);

impl<T: Entry> Clone for NodePtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Entry> Copy for NodePtr<T> {}

impl<T: Entry> NodePtr<T> {
    fn alloc(gen: u64, body: Body<T>) -> Self {
        let p = sheaf::alloc(Layout::new::<Node<T>>()).cast::<Node<T>>();
        // SAFETY: a fresh block of the node's layout, which nothing else
        // names.
        unsafe { p.as_ptr().write(Node { gen, body }) };
        NodePtr(p)
    }

    /// The node, read.
    ///
    /// # Safety
    ///
    /// The node must stay live for `'a`: it is reachable from a tree that is
    /// borrowed for `'a` (module doc).
    unsafe fn get<'a>(self) -> &'a Node<T> {
        // SAFETY: the caller's promise.
        unsafe { &*self.0.as_ptr() }
    }

    /// Free the node (not its children).
    ///
    /// # Safety
    ///
    /// Nothing may reach the node any more: it was never published, or a
    /// grace period has passed since the version that replaced it was.
    unsafe fn free(self) {
        // SAFETY: allocated by `alloc`, with this layout, and initialised;
        // unreachable by the caller's promise, so this is the only owner.
        unsafe {
            std::ptr::drop_in_place(self.0.as_ptr());
            sheaf::free(self.0.cast(), Layout::new::<Node<T>>());
        }
    }
}

/// Where nodes come from: the kernel's `maple_node_cache`, a slab whose
/// CPUs keep sheaves of free objects (6.18), so that a node freed after a
/// grace period goes back to the freeing CPU's sheaf and the next update
/// takes it from there, without the general allocator (whose free of a
/// long-unused block reads its cold neighbours to merge them). Here each
/// thread keeps at most [`sheaf::CAPACITY`] free blocks per node layout and
/// gives the rest, and all of them when it exits, back to the allocator.
mod sheaf {
    use std::alloc::Layout;
    use std::cell::RefCell;
    use std::ptr::NonNull;

    pub const CAPACITY: usize = 256;

    /// Free blocks by layout (a tree type has one node layout; a thread
    /// sees a handful of types).
    struct Sheaves(Vec<(Layout, Vec<NonNull<u8>>)>);

    impl Drop for Sheaves {
        fn drop(&mut self) {
            for (layout, blocks) in &mut self.0 {
                for p in blocks.drain(..) {
                    // SAFETY: each block came from `std::alloc::alloc` with
                    // this layout and is no node any more.
                    unsafe { std::alloc::dealloc(p.as_ptr(), *layout) };
                }
            }
        }
    }

    thread_local! {
        static SHEAVES: RefCell<Sheaves> = const { RefCell::new(Sheaves(Vec::new())) };
    }

    /// A block of `layout`: from this thread's sheaf, else the allocator.
    pub fn alloc(layout: Layout) -> NonNull<u8> {
        let cached = if cfg!(loom) {
            None
        } else {
            SHEAVES
                .try_with(|s| {
                    let mut s = s.borrow_mut();
                    s.0.iter_mut()
                        .find(|(l, _)| *l == layout)
                        .and_then(|(_, v)| v.pop())
                })
                .ok()
                .flatten()
        };
        cached.unwrap_or_else(|| {
            // SAFETY: a node's layout has a non-zero size.
            let p = unsafe { std::alloc::alloc(layout) };
            NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
        })
    }

    /// Give back a block that [`alloc`] returned for `layout`.
    ///
    /// # Safety
    ///
    /// `p` came from [`alloc`] with `layout`, holds nothing that still
    /// needs dropping, and nothing will use it again.
    pub unsafe fn free(p: NonNull<u8>, layout: Layout) {
        let kept = !cfg!(loom)
            && SHEAVES
                .try_with(|s| {
                    let mut s = s.borrow_mut();
                    let i = match s.0.iter().position(|(l, _)| *l == layout) {
                        Some(i) => i,
                        None => {
                            s.0.push((layout, Vec::with_capacity(CAPACITY)));
                            s.0.len() - 1
                        }
                    };
                    let blocks = &mut s.0[i].1;
                    (blocks.len() < CAPACITY).then(|| blocks.push(p)).is_some()
                })
                .unwrap_or(false);
        if !kept {
            // SAFETY: the caller's promise: an allocator block of `layout`.
            unsafe { std::alloc::dealloc(p.as_ptr(), layout) };
        }
    }
}

/// One child of a branch, with what the branch knows of it.
pub struct Slot<T: Entry> {
    /// The smallest key in the child (the pivot).
    key: T::Key,
    summary: T::Summary,
    count: usize,
    child: NodePtr<T>,
}

impl<T: Entry> Clone for Slot<T> {
    fn clone(&self) -> Self {
        Slot {
            key: self.key,
            summary: self.summary,
            count: self.count,
            child: self.child,
        }
    }
}

impl<T: Entry> Slot<T> {
    fn of(child: NodePtr<T>) -> Self {
        // SAFETY: a child being linked into the tree is live.
        let c = unsafe { child.get() };
        Slot {
            key: c.first_key(),
            summary: c.summary(),
            count: c.count(),
            child,
        }
    }

    /// Recompute what the branch knows after the child changed.
    fn refresh(&mut self) {
        *self = Slot::of(self.child);
    }

    pub fn key(&self) -> T::Key {
        self.key
    }
    pub fn summary(&self) -> &T::Summary {
        &self.summary
    }
    pub fn node(&self) -> NodeRef<'_, T> {
        // SAFETY: the slot is borrowed from a live tree, whose nodes live
        // as long (module doc).
        unsafe { self.child.get() }.view()
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

/// A node: the generation of the tree that allocated it, and a leaf of
/// entries or a branch of slots, never empty while it is in a tree.
struct Node<T: Entry> {
    gen: u64,
    body: Body<T>,
}

enum Body<T: Entry> {
    Leaf(Leaf<T>),
    Branch(Slots<T>),
}

/// A copy for a path that is being changed while another version still
/// names the node; the copy's slots name the same children.
impl<T: Entry> Clone for Body<T> {
    fn clone(&self) -> Self {
        match self {
            Body::Leaf(v) => Body::Leaf(v.clone()),
            Body::Branch(s) => Body::Branch(s.clone()),
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
    /// Ask for every cache line of the node at once, for a search about to
    /// read it, if the tree wants that ([`Entry::PREFETCH_NODES`]): a
    /// binary search's probes depend on each other, so on a cold node they
    /// would miss one after another (the maple tree's nodes are four lines
    /// with the pivots in the first two; these are larger).
    #[inline]
    fn prefetched(&self) -> &Self {
        if T::PREFETCH_NODES {
            // Every line the node touches, from the one its start is in.
            let start = self as *const Self as usize;
            let end = start + std::mem::size_of::<Self>();
            for line in (start & !63..end).step_by(64) {
                crate::cacheline::prefetch(line as *const u8);
            }
        }
        self
    }

    fn len(&self) -> usize {
        match &self.body {
            Body::Leaf(v) => v.len(),
            Body::Branch(s) => s.len(),
        }
    }

    fn first_key(&self) -> T::Key {
        match &self.body {
            Body::Leaf(v) => v[0].key,
            Body::Branch(s) => s[0].key,
        }
    }

    fn summary(&self) -> T::Summary {
        match &self.body {
            Body::Leaf(v) => fold::<T>(v.iter().map(|e| e.summary)),
            Body::Branch(s) => fold::<T>(s.iter().map(|s| s.summary)),
        }
    }

    fn count(&self) -> usize {
        match &self.body {
            Body::Leaf(v) => v.len(),
            Body::Branch(s) => s.iter().map(|s| s.count).sum(),
        }
    }

    fn view(&self) -> NodeRef<'_, T> {
        match &self.body {
            Body::Leaf(v) => NodeRef::Leaf(v),
            Body::Branch(s) => NodeRef::Branch(s),
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

/// A draft's write path: its generation, and where the nodes it replaces
/// go.
struct Writer<'t, T: Entry> {
    gen: u64,
    retired: &'t mut RetiredList<T>,
}

impl<T: Entry> Writer<'_, T> {
    fn alloc(&self, body: Body<T>) -> NodePtr<T> {
        NodePtr::alloc(self.gen, body)
    }

    /// The node `p` names, to change in place: the draft's own, or else a
    /// copy of it that takes its place (the original is retired).
    fn cow<'p>(&mut self, p: &'p mut NodePtr<T>) -> &'p mut Node<T> {
        // SAFETY: `p` is in the tree being written, so its node is live.
        let node = unsafe { p.get() };
        if node.gen != self.gen {
            let copy = self.alloc(node.body.clone());
            self.retired.push(std::mem::replace(p, copy));
        }
        // SAFETY: the node carries the draft's generation: the draft
        // allocated it and has not published it, so nothing else reaches
        // it, and the draft is borrowed mutably for 'p.
        unsafe { &mut *p.0.as_ptr() }
    }

    /// `p` has left the tree: free it if it is the draft's own, else retire
    /// it.
    fn discard(&mut self, p: NodePtr<T>) {
        // SAFETY: it was in the tree being written, so it is live.
        if unsafe { p.get() }.gen == self.gen {
            // SAFETY: the draft's own node, never published, now unlinked.
            unsafe { p.free() };
        } else {
            self.retired.push(p);
        }
    }

    /// Discard `p` and everything below it.
    fn discard_subtree(&mut self, p: NodePtr<T>) {
        // SAFETY: it was in the tree being written, so it is live.
        if let Body::Branch(s) = &unsafe { p.get() }.body {
            for slot in s.iter() {
                self.discard_subtree(slot.child);
            }
        }
        self.discard(p);
    }

    /// Insert `item` below `p`; returns the new right sibling if the node
    /// split.
    fn insert(&mut self, p: &mut NodePtr<T>, item: T) -> Option<NodePtr<T>> {
        match &mut self.cow(p).body {
            Body::Leaf(v) => {
                let key = item.key();
                let i = v.partition_point(|e| e.key < key);
                debug_assert!(v.get(i).is_none_or(|e| e.key != key), "duplicate key");
                insert_split(v, i, Keyed::new(item)).map(|r| self.alloc(Body::Leaf(r)))
            }
            Body::Branch(s) => {
                let i = child_index(s, item.key());
                let split = self.insert(&mut s[i].child, item);
                s[i].refresh();
                let right = Slot::of(split?);
                insert_split(s, i + 1, right).map(|r| self.alloc(Body::Branch(r)))
            }
        }
    }

    /// Child `i` of a branch fell below the minimum: merge it with a
    /// neighbour, or take an entry from one.
    fn rebalance(&mut self, slots: &mut Slots<T>, i: usize) {
        debug_assert!(slots.len() >= 2, "a branch has two children or more");
        let l = if i + 1 < slots.len() { i } else { i - 1 };
        let merged = {
            let (a, b) = slots.split_at_mut(l + 1);
            let left = &mut self.cow(&mut a[l].child).body;
            let right = &mut self.cow(&mut b[0].child).body;
            match (left, right) {
                (Body::Leaf(x), Body::Leaf(y)) => rebalance_pair(x, y),
                (Body::Branch(x), Body::Branch(y)) => rebalance_pair(x, y),
                _ => unreachable!("siblings are at the same level"),
            }
        };
        slots[l].refresh();
        if merged {
            let gone = slots.remove(l + 1);
            self.discard(gone.child);
        } else {
            slots[l + 1].refresh();
        }
    }

    /// Remove the entry with `key`, which the tree holds.
    fn remove(&mut self, p: &mut NodePtr<T>, key: T::Key) -> Option<T> {
        match &mut self.cow(p).body {
            Body::Leaf(v) => {
                let i = v.binary_search_by(|e| e.key.cmp(&key)).ok()?;
                Some(v.remove(i).item)
            }
            Body::Branch(s) => {
                let i = child_index(s, key);
                let gone = self.remove(&mut s[i].child, key)?;
                // SAFETY: the child is in the tree being written.
                if unsafe { s[i].child.get() }.len() < MIN_SLOTS {
                    self.rebalance(s, i);
                } else {
                    s[i].refresh();
                }
                Some(gone)
            }
        }
    }

    fn replace_at(&mut self, p: &mut NodePtr<T>, item: T) -> Option<T> {
        match &mut self.cow(p).body {
            Body::Leaf(v) => {
                let i = v.binary_search_by(|e| e.key.cmp(&item.key())).ok()?;
                Some(std::mem::replace(&mut v[i], Keyed::new(item)).item)
            }
            Body::Branch(s) => {
                let i = child_index(s, item.key());
                let old = self.replace_at(&mut s[i].child, item)?;
                s[i].refresh();
                Some(old)
            }
        }
    }

    /// The entry with `key`, in a node of the draft's own, to change in
    /// place (the caller must not change its key or what its summary
    /// depends on).
    fn get_mut<'p>(&mut self, p: &'p mut NodePtr<T>, key: T::Key) -> Option<&'p mut T> {
        match &mut self.cow(p).body {
            Body::Leaf(v) => {
                let i = v.binary_search_by(|e| e.key.cmp(&key)).ok()?;
                Some(&mut v[i].item)
            }
            Body::Branch(s) => {
                let i = child_index(s, key);
                self.get_mut(&mut s[i].child, key)
            }
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

/// A fresh generation for a tree or a draft. 0 is never one: it marks a
/// published view, which owns no node.
fn next_gen() -> u64 {
    static GEN: AtomicU64 = AtomicU64::new(1);
    GEN.fetch_add(1, Ordering::Relaxed)
}

/// Nodes a draft replaced, to be freed when no reader can reach them.
pub struct Retired<T: Entry>(RetiredList<T>);

/// Nodes retired by one publication: one path per update, usually few.
type RetiredList<T> = SmallVec<[NodePtr<T>; 8]>;

// SAFETY: the nodes are unreachable from any tree that is written; the one
// who frees them (after a grace period) is their only owner, on whatever
// thread, and dropping a node drops its entries, which are Send.
unsafe impl<T: Entry + Send> Send for Retired<T> {}

impl<T: Entry> Retired<T> {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Free the nodes (their entries are dropped; their children are not).
    ///
    /// # Safety
    ///
    /// A grace period has passed since the version that replaced them was
    /// published: no reader can hold a version that names them.
    pub unsafe fn free(self) {
        for p in self.0 {
            // SAFETY: the caller's promise; a node is retired once.
            unsafe { p.free() };
        }
    }
}

/// A version of the tree: a draft that owns the nodes of its generation, or
/// a published, read-only view that owns none (generation 0).
pub struct Tree<T: Entry> {
    root: Option<NodePtr<T>>,
    gen: u64,
    /// Nodes of the version this draft was made from that it replaced.
    retired: RetiredList<T>,
}

// SAFETY: a tree's nodes are reached only through it, by the rules of the
// module doc: readers share a published view (read-only) across threads as
// they would share an `Arc`, and only the draft's one writer changes nodes.
unsafe impl<T: Entry + Send + Sync> Send for Tree<T> {}
// SAFETY: as for Send; `&Tree` only reads.
unsafe impl<T: Entry + Send + Sync> Sync for Tree<T> {}

impl<T: Entry> Default for Tree<T> {
    fn default() -> Self {
        Tree {
            root: None,
            gen: next_gen(),
            retired: SmallVec::new(),
        }
    }
}

impl<T: Entry> Drop for Tree<T> {
    /// Free the nodes of this tree's own generation; they are reached only
    /// through nodes of the same generation (a draft copies a path from the
    /// root down). A published view frees nothing; nor does a draft's list of
    /// retired nodes, which still belong to the published version.
    fn drop(&mut self) {
        fn free_own<T: Entry>(p: NodePtr<T>, gen: u64) {
            // SAFETY: reachable from the tree being dropped, so live.
            let n = unsafe { p.get() };
            if n.gen != gen {
                return;
            }
            if let Body::Branch(s) = &n.body {
                for slot in s.iter() {
                    free_own(slot.child, gen);
                }
            }
            // SAFETY: this tree's own node: never published, and the tree
            // that reached it is going away.
            unsafe { p.free() };
        }
        // A published view owns no node, and must not even read one: its
        // nodes may be freed already, by the garbage of the publication that
        // replaced it, which a grace period frees in a deferred function of
        // its own that another thread may run before this drop.
        if self.gen == 0 {
            return;
        }
        if let Some(r) = self.root {
            free_own(r, self.gen);
        }
    }
}

impl<T: Entry> Tree<T> {
    pub fn new() -> Self {
        Self::default()
    }

    fn writer(&mut self) -> (Writer<'_, T>, &mut Option<NodePtr<T>>) {
        debug_assert!(self.gen != 0, "a published view is read-only");
        (
            Writer {
                gen: self.gen,
                retired: &mut self.retired,
            },
            &mut self.root,
        )
    }

    fn root_node(&self) -> Option<&Node<T>> {
        // SAFETY: the root of a tree borrowed for the returned lifetime.
        self.root.map(|r| unsafe { r.get() })
    }

    /// A tree of `items`, which must be sorted by key with no duplicates,
    /// built bottom up in O(n) with every node at least half full.
    pub fn from_sorted(items: impl IntoIterator<Item = T>) -> Self {
        let items: Vec<T> = items.into_iter().collect();
        debug_assert!(
            items.windows(2).all(|w| w[0].key() < w[1].key()),
            "unsorted"
        );
        let mut t = Tree::new();
        if items.is_empty() {
            return t;
        }
        let mut it = items.into_iter();
        let mut level: Vec<NodePtr<T>> = run_sizes(it.len())
            .map(|k| {
                NodePtr::alloc(
                    t.gen,
                    Body::Leaf(it.by_ref().take(k).map(Keyed::new).collect()),
                )
            })
            .collect();
        while level.len() > 1 {
            let mut it = level.into_iter();
            level = run_sizes(it.len())
                .map(|k| {
                    NodePtr::alloc(
                        t.gen,
                        Body::Branch(it.by_ref().take(k).map(Slot::of).collect()),
                    )
                })
                .collect();
        }
        t.root = level.pop();
        t
    }

    /// A draft of this version, sharing all its nodes, to change and then
    /// [publish](Tree::publish).
    ///
    /// # Safety
    ///
    /// Until the draft is published or dropped, it must be the only writer
    /// of the tree this version belongs to, and this version's nodes must
    /// stay live: they are freed only by a draft that retires them, after a
    /// grace period (so this version is a published view, or a tree that
    /// outlives the draft and is not changed meanwhile).
    pub unsafe fn draft(&self) -> Tree<T> {
        Tree {
            root: self.root,
            gen: next_gen(),
            retired: SmallVec::new(),
        }
    }

    /// Publication: a read-only view equal to this draft, to publish, and
    /// the nodes the draft replaced, to free one grace period later. The
    /// draft goes on as a draft of the view: it takes a new generation, so
    /// that it copies what it now shares with the view.
    pub fn publish(&mut self) -> (Tree<T>, Retired<T>) {
        let view = Tree {
            root: self.root,
            gen: 0,
            retired: SmallVec::new(),
        };
        self.gen = next_gen();
        (view, Retired(std::mem::take(&mut self.retired)))
    }

    pub fn len(&self) -> usize {
        self.root_node().map_or(0, Node::count)
    }

    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }

    /// The root, for searches that prune by summary.
    pub fn root(&self) -> Option<NodeRef<'_, T>> {
        self.root_node().map(Node::view)
    }

    /// The summary of the whole tree.
    pub fn summary(&self) -> Option<T::Summary> {
        self.root_node().map(Node::summary)
    }

    /// Insert `item`, whose key must not be in the tree yet: down one path,
    /// splitting full nodes on the way back up (and the root, which makes
    /// the tree one level deeper).
    pub fn insert(&mut self, item: T) {
        let (mut w, root) = self.writer();
        let Some(r) = root.as_mut() else {
            *root = Some(w.alloc(Body::Leaf(ArrayVec::from_iter([Keyed::new(item)]))));
            return;
        };
        if let Some(right) = w.insert(r, item) {
            let slots = ArrayVec::from_iter([Slot::of(*r), Slot::of(right)]);
            *root = Some(w.alloc(Body::Branch(slots)));
        }
    }

    /// Put `item` in the place of the entry with the same key, whose
    /// summary may differ; returns the entry it replaced.
    pub fn replace_at(&mut self, item: T) -> Option<T> {
        self.get(item.key())?;
        let (mut w, root) = self.writer();
        w.replace_at(root.as_mut()?, item)
    }

    /// The entry with exactly this key, to change in place: its key, and
    /// whatever its summary is computed from, must stay as they are.
    pub fn get_mut(&mut self, key: T::Key) -> Option<&mut T> {
        self.get(key)?;
        let (mut w, root) = self.writer();
        w.get_mut(root.as_mut()?, key)
    }

    /// Ask the CPU to fetch the root node (a hint, for a caller about to
    /// look up several trees in turn).
    pub fn prefetch_root(&self) {
        if let Some(r) = self.root {
            // The header and the first entries: three lines.
            let p = r.0.as_ptr().cast::<u8>();
            for line in 0..3 {
                crate::cacheline::prefetch(p.wrapping_add(line * 64));
            }
        }
    }

    /// The entry with exactly this key: one descent to the only leaf that
    /// can hold it (no iterator, whose path stack a lookup does not need).
    pub fn get(&self, key: T::Key) -> Option<&T> {
        let mut n = self.root_node()?.prefetched();
        loop {
            match &n.body {
                Body::Leaf(v) => {
                    let i = v.partition_point(|e| e.key < key);
                    return v.get(i).filter(|e| e.key == key).map(|e| &e.item);
                }
                Body::Branch(s) => {
                    // SAFETY: as in last_before.
                    n = unsafe { s[child_index(s, key)].child.get() }.prefetched();
                }
            }
        }
    }

    /// Remove the entry with exactly this key; returns it. Nodes left below
    /// half full take from or merge with a neighbour; a root with one child
    /// gives way to it.
    pub fn remove(&mut self, key: T::Key) -> Option<T> {
        // Look first: a miss must not copy the path.
        self.get(key)?;
        let (mut w, root) = self.writer();
        let r = root.as_mut()?;
        let gone = w.remove(r, key)?;
        // SAFETY: the root of the tree being written.
        let shrunk = match &unsafe { r.get() }.body {
            Body::Leaf(v) if v.is_empty() => Some(None),
            Body::Branch(s) if s.len() == 1 => Some(Some(s[0].child)),
            _ => None,
        };
        if let Some(new_root) = shrunk {
            let old = std::mem::replace(root, new_root);
            if let Some(old) = old {
                w.discard(old);
            }
        }
        Some(gone)
    }

    /// Take every entry out: the tree's own nodes are freed, the others
    /// retired.
    pub fn clear(&mut self) {
        let (mut w, root) = self.writer();
        if let Some(r) = root.take() {
            w.discard_subtree(r);
        }
    }

    /// The first entry whose key is `key` or above.
    pub fn first_from(&self, key: T::Key) -> Option<&T> {
        self.iter_from(key).next()
    }

    /// The last entry whose key is below `key`.
    pub fn last_before(&self, key: T::Key) -> Option<&T> {
        let mut n = self.root_node()?.prefetched();
        loop {
            match &n.body {
                Body::Leaf(v) => {
                    let i = v.partition_point(|e| e.key < key);
                    return i.checked_sub(1).map(|i| &v[i].item);
                }
                Body::Branch(s) => {
                    // The last child whose smallest key is below `key`
                    // holds the answer, if any child does.
                    let i = s.partition_point(|s| s.key < key).checked_sub(1)?;
                    // SAFETY: a child in a tree borrowed for the result's
                    // lifetime.
                    n = unsafe { s[i].child.get() }.prefetched();
                }
            }
        }
    }

    /// The entries on either side of `key`: the last below it and the
    /// first at or above it, from one descent (as `vma_prev` and `vma_next`
    /// of one maple state). The step back stays in the leaf found, or goes
    /// down the last path of the nearest earlier sibling on the path.
    pub fn around(&self, key: T::Key) -> (Option<&T>, Option<&T>) {
        let mut it = self.iter_from(key);
        (it.before(), it.next())
    }

    /// In-order iterator over the entries from the first whose key is `key`
    /// or above.
    pub fn iter_from(&self, key: T::Key) -> Iter<'_, T> {
        let mut it = Iter {
            stack: ArrayVec::new(),
            leaf: &[],
            pos: 0,
        };
        let Some(mut n) = self.root_node().map(Node::prefetched) else {
            return it;
        };
        loop {
            match &n.body {
                Body::Leaf(v) => {
                    it.leaf = v;
                    it.pos = v.partition_point(|e| e.key < key);
                    return it;
                }
                Body::Branch(s) => {
                    let i = child_index(s, key);
                    it.stack.push((s, i));
                    // SAFETY: as in last_before.
                    n = unsafe { s[i].child.get() }.prefetched();
                }
            }
        }
    }

    pub fn iter(&self) -> Iter<'_, T> {
        let mut it = Iter {
            stack: ArrayVec::new(),
            leaf: &[],
            pos: 0,
        };
        if let Some(r) = self.root_node() {
            it.descend_first(r);
        }
        it
    }

    /// The tree's shape: keys in order, pivots, counts and summaries as
    /// the children say, every node but the root at least half full, all
    /// leaves at one depth, and a draft's own nodes only under its own. For
    /// tests and the invariant checker.
    pub fn check_shape(&self) -> Result<(), String>
    where
        T::Summary: PartialEq,
    {
        let Some(root) = self.root_node() else {
            return Ok(());
        };
        check_node(root, true, self.gen)?;
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
fn check_node<T: Entry>(n: &Node<T>, is_root: bool, gen: u64) -> Result<usize, String>
where
    T::Summary: PartialEq,
{
    if n.len() == 0 || (!is_root && n.len() < MIN_SLOTS) {
        return Err(format!("node of {} slots", n.len()));
    }
    match &n.body {
        Body::Leaf(v) => {
            if v.iter()
                .any(|e| e.key != e.item.key() || e.summary != e.item.summary())
            {
                return Err("a leaf's key or summary disagrees with its entry".into());
            }
            Ok(1)
        }
        Body::Branch(s) => {
            if is_root && s.len() < 2 {
                return Err("root branch with one child".into());
            }
            let mut depth = None;
            for (i, slot) in s.iter().enumerate() {
                // SAFETY: a child in the tree being checked.
                let c = unsafe { slot.child.get() };
                if slot.key != c.first_key()
                    || slot.count != c.count()
                    || slot.summary != c.summary()
                {
                    return Err(format!("slot {i} disagrees with its child"));
                }
                if c.gen == gen && n.gen != gen {
                    return Err("a draft's own node under a shared one".into());
                }
                let d = check_node(c, false, gen)?;
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
    stack: ArrayVec<(&'a [Slot<T>], usize), MAX_DEPTH>,
    leaf: &'a [Keyed<T>],
    pos: usize,
}

impl<T: Entry> Clone for Iter<'_, T> {
    fn clone(&self) -> Self {
        Iter {
            stack: self.stack.clone(),
            leaf: self.leaf,
            pos: self.pos,
        }
    }
}

impl<'a, T: Entry> Iter<'a, T> {
    /// The entry before the one the iterator yields next (`mas_prev`).
    fn before(&self) -> Option<&'a T> {
        if let Some(i) = self.pos.checked_sub(1) {
            return self.leaf.get(i).map(|e| &e.item);
        }
        // The first of its leaf: the nearest branch on the path with an
        // earlier child holds it, as the last entry of that child.
        let (s, i) = self.stack.iter().rev().find(|(_, i)| *i > 0)?;
        // SAFETY: as in descend_first.
        let mut n: &'a Node<T> = unsafe { s[*i - 1].child.get() };
        loop {
            match &n.body {
                Body::Leaf(v) => return v.last().map(|e| &e.item),
                // SAFETY: as in descend_first.
                Body::Branch(s) => n = unsafe { s.last()?.child.get() },
            }
        }
    }

    fn descend_first(&mut self, mut n: &'a Node<T>) {
        loop {
            match &n.body {
                Body::Leaf(v) => {
                    self.leaf = v;
                    self.pos = 0;
                    return;
                }
                Body::Branch(s) => {
                    self.stack.push((s, 0));
                    // SAFETY: a child in the tree the iterator borrows.
                    n = unsafe { s[0].child.get() };
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
                    // SAFETY: as in descend_first.
                    let child: &'a Node<T> = unsafe { s[*i].child.get() };
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

    /// The end of a lineage: with every view dropped, what the draft and
    /// the publications retired, and then the draft's whole last version,
    /// are freed.
    fn free_lineage(mut draft: Tree<K>, retired: Vec<Retired<K>>) {
        draft.clear();
        let (_, last) = draft.publish();
        for r in retired.into_iter().chain([last]) {
            // SAFETY: no view is left: nothing reaches these nodes.
            unsafe { r.free() };
        }
    }

    #[test]
    fn insert_remove_replace_keep_order_and_old_versions() {
        let mut t = Tree::from_sorted((0..100).map(|i| K(i * 10)));
        assert_eq!(t.len(), 100);
        let (old, r0) = t.publish();
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
        drop(old);
        free_lineage(t, vec![r0]);
    }

    #[test]
    fn a_draft_copies_only_the_paths_it_changes() {
        let mut t = Tree::from_sorted((0..4096u64).map(K));
        let (view, r0) = t.publish();
        assert!(r0.is_empty(), "a tree never published replaced nothing");
        t.insert(K(10_000));
        // One path: a leaf and the branches above it.
        let (view2, r1) = t.publish();
        assert_eq!(r1.0.len(), depth(&view));
        t.remove(5);
        t.remove(6);
        let (view3, r2) = t.publish();
        assert!(r2.0.len() <= 2 * depth(&view2), "{} nodes", r2.0.len());
        assert_eq!(view.len(), 4096);
        assert_eq!(view2.len(), 4097);
        assert_eq!(view3.len(), 4095);
        drop((view, view2, view3));
        free_lineage(t, vec![r0, r1, r2]);
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
            let mut versions = vec![];
            let mut retired = vec![];
            for (i, (add, k)) in ops.into_iter().enumerate() {
                if i % 50 == 0 {
                    let (view, r) = t.publish();
                    versions.push((view, model.clone()));
                    retired.push(r);
                }
                if add {
                    if model.insert(k) {
                        t.insert(K(k));
                    }
                } else {
                    prop_assert_eq!(t.remove(k).is_some(), model.remove(&k));
                }
            }
            prop_assert!(t.check_shape().is_ok());
            prop_assert_eq!(keys(&t), model.iter().copied().collect::<Vec<_>>());
            for (t, model) in versions.iter().map(|(a, b)| (a, b)).chain(std::iter::once((&t, &model))) {
                prop_assert!(t.check_shape().is_ok());
                prop_assert_eq!(keys(t), model.iter().copied().collect::<Vec<_>>());
                prop_assert_eq!(t.len(), model.len());
                // Fixed probes, and each key and the one after it: leaf
                // boundaries are among them.
                let probes = [0, 7, 999, 1999, 2500].into_iter().chain(model.iter().flat_map(|&k| [k, k + 1]));
                for probe in probes {
                    let next = model.range(probe..).next().copied();
                    let prev = model.range(..probe).next_back().copied();
                    prop_assert_eq!(t.first_from(probe).map(|k| k.0), next);
                    prop_assert_eq!(t.last_before(probe).map(|k| k.0), prev);
                    let (b, a) = t.around(probe);
                    prop_assert_eq!((b.map(|k| k.0), a.map(|k| k.0)), (prev, next));
                }
            }
            drop(versions);
            free_lineage(t, retired);
        }
    }
}
