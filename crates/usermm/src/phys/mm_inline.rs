//! The LRU lists of a node (`struct lruvec`, and the helpers of
//! include/linux/mm_inline.h that put folios on them and take them off).
//!
//! The model has no memory cgroups, so each node has one lruvec, the
//! node's own (`mem_cgroup_lruvec` with memcg disabled). Its lists link
//! folios through their head page's `lru_next`/`lru_prev`, as offsets in
//! the node, the fields the free lists use: a folio is never free and on
//! an LRU list at once. PG_lru says that a folio is on a list; PG_active
//! and PG_swapbacked say which ([`folio_lru_list`]).
//!
//! The unevictable "list" is a count, as in the kernel since 5.18: reclaim
//! never scans it, so its folios are not linked, and `lru_prev` holds
//! the folio's `mlock_count` instead (how many `VM_LOCKED` VMAs mlocked
//! it, which may undercount; see [`crate::mlock`]).
//!
//! The per-CPU folio batches of mm/swap.c (`cpu_fbatches`) are kept here
//! too, beside the lists they feed, so that the invariant checker sees the
//! references they hold; [`crate::swap`] fills and drains them.
//!
//! # Locking
//!
//! `lru_lock` guards a lruvec's lists and their sizes. Whoever puts a
//! folio on a list sets PG_lru with the lock held. Whoever takes a live
//! folio off clears PG_lru first, atomically, and only then takes the
//! lock (`folio_test_clear_lru` is the claim: of an isolation and a batch
//! move racing for one folio, exactly one wins, and only the winner may
//! unlink it). A folio whose last reference goes with PG_lru still set is
//! unlinked by whoever frees it (`__page_cache_release`), as nobody else
//! can reach it then. Lock order: a CPU's folio batches, then `lru_lock`,
//! then the zone and pcp locks (a batch move frees folios).

use super::memmap::{pg, LIST_NONE};
use super::{Folio, Node, Pfn, PhysMem};
use crate::cacheline::LineWriters;
use crate::sync::{CachePadded, Mutex, MutexGuard, Ordering};
use crate::vmstat::NodeStat;

/// `enum lru_list`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum LruList {
    InactiveAnon,
    ActiveAnon,
    InactiveFile,
    ActiveFile,
    Unevictable,
}

/// `NR_LRU_LISTS`.
pub const NR_LRU_LISTS: usize = 5;

impl LruList {
    pub const ALL: [LruList; NR_LRU_LISTS] = [
        LruList::InactiveAnon,
        LruList::ActiveAnon,
        LruList::InactiveFile,
        LruList::ActiveFile,
        LruList::Unevictable,
    ];

    /// `is_active_lru`.
    pub fn is_active(self) -> bool {
        matches!(self, LruList::ActiveAnon | LruList::ActiveFile)
    }

    /// The node statistic that counts this list's pages
    /// (`NR_LRU_BASE + lru`).
    pub fn stat(self) -> NodeStat {
        match self {
            LruList::InactiveAnon => NodeStat::NR_INACTIVE_ANON,
            LruList::ActiveAnon => NodeStat::NR_ACTIVE_ANON,
            LruList::InactiveFile => NodeStat::NR_INACTIVE_FILE,
            LruList::ActiveFile => NodeStat::NR_ACTIVE_FILE,
            LruList::Unevictable => NodeStat::NR_UNEVICTABLE,
        }
    }
}

/// `folio_lru_list`: the list a folio belongs on. A folio that is not
/// swap-backed (a lazyfree anon folio) is reclaimed as file pages are,
/// without swap, so it sits on the file lists (`folio_is_file_lru`).
pub fn folio_lru_list(mem: &PhysMem, folio: Folio) -> LruList {
    let flags = folio.head(mem).flags.load(Ordering::Relaxed);
    if flags & pg::UNEVICTABLE != 0 {
        return LruList::Unevictable;
    }
    let active = flags & pg::ACTIVE != 0;
    match (flags & pg::SWAPBACKED != 0, active) {
        (true, false) => LruList::InactiveAnon,
        (true, true) => LruList::ActiveAnon,
        (false, false) => LruList::InactiveFile,
        (false, true) => LruList::ActiveFile,
    }
}

/// `folio_evictable`: not mlocked. (The kernel also keeps the pages of an
/// unevictable mapping, ramfs or SHM_LOCK, off the evictable lists; the
/// model has neither.)
#[inline]
pub fn folio_evictable(mem: &PhysMem, folio: Folio) -> bool {
    !folio.head(mem).test(pg::MLOCKED)
}

/// One lruvec's lists: heads and tails as node offsets, and their sizes
/// in pages (`lruvec->lists`, and the `lru_zone_size` the kernel keeps).
struct LruLists {
    head: [u32; NR_LRU_LISTS],
    tail: [u32; NR_LRU_LISTS],
    nr_pages: [u64; NR_LRU_LISTS],
}

/// `struct lruvec`.
pub struct Lruvec {
    /// On a cache line of its own, away from the node's read-mostly
    /// fields, as `pglist_data` pads its reclaim section.
    lru_lock: CachePadded<Mutex<LruLists>>,
    /// Who takes `lru_lock` (a fault does, every batch of new folios).
    line: LineWriters,
}

impl Default for Lruvec {
    fn default() -> Self {
        Lruvec {
            lru_lock: CachePadded::new(Mutex::new(LruLists {
                head: [LIST_NONE; NR_LRU_LISTS],
                tail: [LIST_NONE; NR_LRU_LISTS],
                nr_pages: [0; NR_LRU_LISTS],
            })),
            line: LineWriters::new(),
        }
    }
}

/// A node's lruvec, locked (`folio_lruvec_lock`); the proof that its lists
/// may be changed.
pub struct LruvecGuard<'a> {
    mem: &'a PhysMem,
    node: &'a Node,
    lists: MutexGuard<'a, LruLists>,
}

impl Drop for LruvecGuard<'_> {
    fn drop(&mut self) {
        // The unlock (the lock was counted when taken).
        self.node.lruvec.line.write();
    }
}

impl PhysMem {
    /// `folio_lruvec_lock`: the lruvec of the folio's node, locked.
    pub fn folio_lruvec_lock(&self, folio: Folio) -> LruvecGuard<'_> {
        self.node_lruvec_lock(PhysMem::nid(folio.pfn()))
    }

    /// `mem_cgroup_lruvec(NULL, pgdat)`, locked.
    pub fn node_lruvec_lock(&self, nid: usize) -> LruvecGuard<'_> {
        let node = &self.nodes[nid];
        let lists = node.lruvec.lru_lock.lock();
        node.lruvec.line.write();
        LruvecGuard {
            mem: self,
            node,
            lists,
        }
    }

    /// `folio_lruvec_relock_irqsave`: hold the lock of the folio's lruvec,
    /// keeping the one `held` if it is that one (a batch of folios of one
    /// node takes the lock once).
    pub fn folio_lruvec_relock<'a, 'g>(
        &'a self,
        held: &'g mut Option<LruvecGuard<'a>>,
        folio: Folio,
    ) -> &'g mut LruvecGuard<'a> {
        let nid = PhysMem::nid(folio.pfn());
        if held.as_ref().is_none_or(|g| g.node.id != nid) {
            *held = None;
            *held = Some(self.node_lruvec_lock(nid));
        }
        held.get_or_insert_with(|| unreachable!("locked above"))
    }

    /// `__page_cache_release`, for a folio whose last reference is gone:
    /// if it is on an LRU list, take it off (locking its lruvec, or keeping
    /// the lock `held` across a batch).
    pub fn page_cache_release<'a>(&'a self, held: &mut Option<LruvecGuard<'a>>, folio: Folio) {
        let head = folio.head(self);
        if head.test(pg::LRU) {
            let lruvec = self.folio_lruvec_relock(held, folio);
            lruvec.del_folio(folio);
            head.clear(pg::LRU | pg::ACTIVE | pg::UNEVICTABLE);
        }
    }

    /// Pages on the LRU lists of every node, per list, as the lists count
    /// them (for the invariant checker).
    pub fn lru_sizes(&self) -> [u64; NR_LRU_LISTS] {
        let mut sizes = [0; NR_LRU_LISTS];
        for n in &self.nodes {
            let lists = n.lruvec.lru_lock.lock();
            for (s, n) in sizes.iter_mut().zip(lists.nr_pages) {
                *s += n;
            }
        }
        sizes
    }

    /// Call `f(folio, list)` for every folio on an LRU list, walking each
    /// list from its head (for the invariant checker; takes each lruvec's
    /// lock in turn).
    pub fn for_each_lru_folio(&self, mut f: impl FnMut(Folio, LruList)) {
        for node in &self.nodes {
            let lists = node.lruvec.lru_lock.lock();
            for lru in LruList::ALL {
                let mut off = lists.head[lru as usize];
                while off != LIST_NONE {
                    let pfn = node.start_pfn() + off as u64;
                    f(Folio(pfn), lru);
                    off = self.page(pfn).lru_next.load(Ordering::Relaxed);
                }
            }
        }
    }
}

impl<'a> LruvecGuard<'a> {
    fn off(&self, folio: Folio) -> u32 {
        debug_assert!(self.node.contains(folio.pfn()));
        (folio.pfn() - self.node.start_pfn()) as u32
    }

    fn pfn(&self, off: u32) -> Pfn {
        self.node.start_pfn() + off as u64
    }

    /// `update_lru_size`.
    fn update_lru_size(&mut self, lru: LruList, nr: i64) {
        let n = &mut self.lists.nr_pages[lru as usize];
        *n = n.checked_add_signed(nr).expect("LRU list size underflow");
        self.mem.mod_node_state(lru.stat(), nr);
    }

    /// `lruvec_add_folio`: at the head of its list (the youngest end); an
    /// unevictable folio is only counted, its `mlock_count` left to the
    /// caller.
    pub fn add_folio(&mut self, folio: Folio) {
        let lru = folio_lru_list(self.mem, folio);
        if lru == LruList::Unevictable {
            self.update_lru_size(lru, folio.nr_pages(self.mem) as i64);
            return;
        }
        let off = self.off(folio);
        let head = folio.head(self.mem);
        let old = self.lists.head[lru as usize];
        head.lru_prev.store(LIST_NONE, Ordering::Relaxed);
        head.lru_next.store(old, Ordering::Relaxed);
        if old == LIST_NONE {
            self.lists.tail[lru as usize] = off;
        } else {
            self.mem
                .page(self.pfn(old))
                .lru_prev
                .store(off, Ordering::Relaxed);
        }
        self.lists.head[lru as usize] = off;
        self.update_lru_size(lru, folio.nr_pages(self.mem) as i64);
    }

    /// `list_add_tail(&new->lru, &folio->lru)` of a split: `new` goes just
    /// before `folio` (younger than it), on its list; the split's pieces
    /// end up in order, the head oldest. The list's size is left alone: a
    /// split keeps the pages on the list they were on.
    pub fn add_folio_before(&mut self, folio: Folio, new: Folio) {
        let lru = folio_lru_list(self.mem, folio);
        if lru == LruList::Unevictable {
            // `lru_add_split_folio`: a piece of an unevictable folio starts
            // with no mlock count (reclaim puts it right if need be).
            self.mem
                .page(new.pfn())
                .lru_prev
                .store(0, Ordering::Relaxed);
            return;
        }
        let prev = folio.head(self.mem).lru_prev.load(Ordering::Relaxed);
        let n = self.off(new);
        self.link_after(lru, prev, n);
    }

    /// Link `off` after `prev` (LIST_NONE: at the head) on `lru`.
    fn link_after(&mut self, lru: LruList, prev: u32, off: u32) {
        let page = self.mem.page(self.pfn(off));
        let next = if prev == LIST_NONE {
            self.lists.head[lru as usize]
        } else {
            self.mem
                .page(self.pfn(prev))
                .lru_next
                .load(Ordering::Relaxed)
        };
        page.lru_prev.store(prev, Ordering::Relaxed);
        page.lru_next.store(next, Ordering::Relaxed);
        if prev == LIST_NONE {
            self.lists.head[lru as usize] = off;
        } else {
            self.mem
                .page(self.pfn(prev))
                .lru_next
                .store(off, Ordering::Relaxed);
        }
        if next == LIST_NONE {
            self.lists.tail[lru as usize] = off;
        } else {
            self.mem
                .page(self.pfn(next))
                .lru_prev
                .store(off, Ordering::Relaxed);
        }
    }

    /// `lruvec_del_folio`.
    pub fn del_folio(&mut self, folio: Folio) {
        let lru = folio_lru_list(self.mem, folio);
        let head = folio.head(self.mem);
        if lru == LruList::Unevictable {
            // Its `mlock_count` goes: the fields are links again.
            head.lru_prev.store(LIST_NONE, Ordering::Relaxed);
            self.update_lru_size(lru, -(folio.nr_pages(self.mem) as i64));
            return;
        }
        let next = head.lru_next.load(Ordering::Relaxed);
        let prev = head.lru_prev.load(Ordering::Relaxed);
        if prev == LIST_NONE {
            debug_assert_eq!(self.lists.head[lru as usize], self.off(folio));
            self.lists.head[lru as usize] = next;
        } else {
            self.mem
                .page(self.pfn(prev))
                .lru_next
                .store(next, Ordering::Relaxed);
        }
        if next == LIST_NONE {
            debug_assert_eq!(self.lists.tail[lru as usize], self.off(folio));
            self.lists.tail[lru as usize] = prev;
        } else {
            self.mem
                .page(self.pfn(next))
                .lru_prev
                .store(prev, Ordering::Relaxed);
        }
        head.lru_next.store(LIST_NONE, Ordering::Relaxed);
        head.lru_prev.store(LIST_NONE, Ordering::Relaxed);
        self.update_lru_size(lru, -(folio.nr_pages(self.mem) as i64));
    }

    /// `folio->mlock_count` of a folio on the unevictable list.
    pub fn mlock_count(&self, folio: Folio) -> u32 {
        debug_assert_eq!(folio_lru_list(self.mem, folio), LruList::Unevictable);
        folio.head(self.mem).lru_prev.load(Ordering::Relaxed)
    }

    /// Set `folio->mlock_count` of a folio on the unevictable list.
    pub fn set_mlock_count(&mut self, folio: Folio, count: u32) {
        debug_assert_eq!(folio_lru_list(self.mem, folio), LruList::Unevictable);
        folio
            .head(self.mem)
            .lru_prev
            .store(count, Ordering::Relaxed);
    }

    /// The size of one list, in pages.
    pub fn size(&self, lru: LruList) -> u64 {
        self.lists.nr_pages[lru as usize]
    }

    /// The oldest folio on a list (its tail), if any.
    pub fn tail(&self, lru: LruList) -> Option<Folio> {
        let off = self.lists.tail[lru as usize];
        (off != LIST_NONE).then(|| Folio(self.pfn(off)))
    }

    /// `isolate_lru_folios`: take up to `nr` pages' worth of folios off the
    /// tail (the oldest end) of `lru`, each with a reference and PG_lru
    /// cleared; a folio being freed (no references left) or claimed by
    /// someone else is rotated to the head instead. Returns the folios and
    /// the pages scanned.
    pub fn isolate_lru_folios(&mut self, lru: LruList, nr: u64, cpu: usize) -> (Vec<Folio>, u64) {
        let mut taken = Vec::new();
        let (mut scanned, mut looked) = (0, 0);
        let len = self.size(lru);
        while scanned < nr && looked < len {
            let Some(folio) = self.tail(lru) else {
                break;
            };
            let pages = folio.nr_pages(self.mem);
            looked += pages;
            scanned += pages;
            let head = folio.head(self.mem);
            // folio_try_get, then folio_test_clear_lru.
            let got = head
                .refcount
                .fetch_update(Ordering::Acquire, Ordering::Relaxed, |r| {
                    (r > 0).then_some(r + 1)
                })
                .is_ok();
            if !got {
                self.del_folio(folio);
                self.add_folio(folio);
                continue;
            }
            if !head.test_and_clear(pg::LRU) {
                // Someone else is taking it off (and holds a reference to
                // do so, so this put is not the last).
                self.del_folio(folio);
                self.add_folio(folio);
                folio.put(self.mem, cpu);
                continue;
            }
            self.del_folio(folio);
            taken.push(folio);
        }
        (taken, scanned)
    }
}

/// `FOLIO_BATCH_SIZE` (`PAGEVEC_SIZE`).
pub const FOLIO_BATCH_SIZE: usize = 31;

/// `struct folio_batch`: up to [`FOLIO_BATCH_SIZE`] folios.
#[derive(Clone, Copy)]
pub struct FolioBatch {
    nr: u8,
    folios: [Pfn; FOLIO_BATCH_SIZE],
}

impl Default for FolioBatch {
    fn default() -> Self {
        FolioBatch {
            nr: 0,
            folios: [0; FOLIO_BATCH_SIZE],
        }
    }
}

impl FolioBatch {
    /// `folio_batch_add`: returns the room left (0: full, drain it).
    pub fn add(&mut self, folio: Folio) -> usize {
        debug_assert!((self.nr as usize) < FOLIO_BATCH_SIZE);
        self.folios[self.nr as usize] = folio.pfn();
        self.nr += 1;
        FOLIO_BATCH_SIZE - self.nr as usize
    }

    pub fn len(&self) -> usize {
        self.nr as usize
    }

    pub fn is_empty(&self) -> bool {
        self.nr == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = Folio> + '_ {
        self.folios[..self.nr as usize].iter().map(|&p| Folio(p))
    }

    /// Take the folios out, leaving the batch empty (`folio_batch_reinit`).
    pub fn take(&mut self) -> FolioBatch {
        std::mem::take(self)
    }
}

/// What the mlock batch does to a folio when it drains (the low bits the
/// kernel keeps in each `mlock_fbatch` pointer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MlockOp {
    /// `LRU_FOLIO`: mlock a folio on (or for now off) the LRU.
    #[default]
    Lru,
    /// `NEW_FOLIO`: a new folio, onto the unevictable list.
    New,
    /// Neither bit: munlock.
    Munlock,
}

/// `mlock_fbatch`: one CPU's folios waiting to be mlocked or munlocked
/// (see [`crate::mlock`]).
#[derive(Clone, Copy, Default)]
pub struct MlockFbatch {
    pub folios: FolioBatch,
    ops: [MlockOp; FOLIO_BATCH_SIZE],
}

impl MlockFbatch {
    /// `folio_batch_add` of a folio with its op: returns the room left.
    pub fn add(&mut self, folio: Folio, op: MlockOp) -> usize {
        self.ops[self.folios.len()] = op;
        self.folios.add(folio)
    }

    /// The folios with their ops.
    pub fn iter(&self) -> impl Iterator<Item = (Folio, MlockOp)> + '_ {
        self.folios.iter().zip(self.ops.iter().copied())
    }

    /// Take the entries out, leaving the batch empty.
    pub fn take(&mut self) -> MlockFbatch {
        std::mem::take(self)
    }
}

/// `struct cpu_fbatches`: one CPU's batches of folios on their way to or
/// between LRU lists. Each folio in a batch holds a reference.
#[derive(Default)]
pub struct CpuFbatches {
    /// New folios on their way onto an LRU list (`lru_add`).
    pub lru_add: FolioBatch,
    /// Folios to move to the inactive file list as lazyfree
    /// (`lru_lazyfree`).
    pub lru_lazyfree: FolioBatch,
    /// `mlock_fbatch`, a per-CPU variable of its own in the kernel, with
    /// its own local lock; kept here under the same lock.
    pub mlock: MlockFbatch,
}

impl CpuFbatches {
    /// Every folio the batches hold.
    pub fn iter(&self) -> impl Iterator<Item = Folio> + '_ {
        self.lru_add
            .iter()
            .chain(self.lru_lazyfree.iter())
            .chain(self.mlock.folios.iter())
    }
}
