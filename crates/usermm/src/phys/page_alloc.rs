//! The buddy allocator (mm/page_alloc.c), one zone per node.
//!
//! Free blocks of order 0..=[`MAX_PAGE_ORDER`] sit on per-order lists linked
//! through the descriptors' `lru_next`/`lru_prev` (offsets within the node); a
//! free block's head carries `PG_buddy` and its order in `private`, so that
//! freeing can find and merge its buddy in O(1). Per-CPU page lists (pcp)
//! cache blocks of order 0..=3 and the PMD order, refilled and drained in
//! batches, as the kernel's `rmqueue_pcplist` / `free_unref_page` do, with
//! v6.7's auto-tuning: a CPU that keeps allocating refills `batch << n`
//! pages at a time (`alloc_factor`, up to 5; the batch is the zone's
//! [`zone_batchsize`], 63 from 688 MiB, 1 at 16 MiB) and raises its list's
//! `high` toward an eighth of the zone split between the CPUs; frees drain
//! as many pages as were freed lately (`free_count`); a zone found at or
//! below its high watermark (`ZONE_BELOW_HIGH`) lowers `high` again on its
//! frees, and while kswapd reclaims (`ZONE_RECLAIM_ACTIVE`) a free drains
//! the list once it holds four batches. (kswapd's own frees go to the
//! buddy lists directly in the model, as every thread's that plays no
//! CPU; the kernel's go through its CPU's list, which the flag keeps
//! short.) The periodic `decay_pcp_high` of the vmstat worker
//! and the heavy-freeing rule for orders 1..=3 are not modelled.
//!
//! Under LUF ([`super::luf`]) each order has two lists, as v12 has: the
//! free list, and the pend list of blocks whose pages still owe a TLB
//! shootdown. Which one an allocation tries first, and whether it may use
//! the pend list at all, depend on the zone's reserve of pages without
//! keys and on the allocation's [`AllocContext`].
//!
//! # Locking
//!
//! The free lists and every `PG_buddy` descriptor are guarded by the zone lock
//! (`zone->lock`); a pcp list by its own lock (the kernel disables preemption
//! and takes `pcp->lock`). Lock order: pcp lock, then zone lock. The
//! reserve's lock (`min_free_kbytes`) is taken only by a change of the THP
//! knobs, never inside the allocator, and before the pcp locks, whose
//! `high` it clamps to the new limits.
//!
//! The zone lock and the free count (`NR_FREE_PAGES`) each sit on a cache
//! line of their own, away from the read-mostly watermarks, as the kernel
//! pads `struct zone`. Every allocation's fast path reads the free count;
//! a locked section changes it once, by all the pages it moved (the
//! kernel's count moves through per-CPU diffs folded past a threshold), so
//! a refill of many pages does not pull that line from every reader once
//! per page.
//!
//! # Watermarks
//!
//! `calculate_min_free_kbytes` sizes one reserve for the whole machine,
//! `int_sqrt(16 * lowmem_kbytes)` clamped to [128 KiB, 256 MiB], and
//! `__setup_per_zone_wmarks` gives each zone the share of it that its pages
//! are of all the pages ([`zone_watermarks`]): `min` is that share, and
//! `low`, `high` and `promo` each one step more, a step being a quarter of
//! `min` or `watermark_scale_factor` (10 per 10,000) of the zone's pages,
//! whichever is larger. So a small node beside a large one gets a small
//! reserve, as on the host, not the reserve a machine of its size alone
//! would have. While 2 MiB THPs are enabled (the default knobs on a
//! machine of 512 MiB or more, `madvise` with 2 MiB `inherit`), khugepaged
//! raises the reserve to what it recommends for them
//! ([`recommended_min_free_kbytes`]: 11 pageblocks a zone, at most 5% of
//! the pages above the high watermarks), and every change of the THP knobs
//! sets it again: once they are disabled it is computed afresh, from the
//! pages above the (raised) high watermarks, which lands a little below
//! the boot value. Every zone here is `ZONE_NORMAL` (the highmem and movable
//! zones' own minimum is not modelled); the sysctls `vm.min_free_kbytes`
//! and `vm.watermark_scale_factor` are not modelled. An allocation that
//! would take the zone below `low` goes to the slow path, which wakes
//! kswapd and may reclaim (see [`PhysMem::alloc_pages`]).

use super::memmap::{pg, LIST_NONE};
use super::{Node, Pfn, PhysMem, MAX_PAGE_ORDER, NODE_PFN_SHIFT};
use crate::cacheline::LineWriters;
use crate::sync::{AtomicU64, CachePadded, Mutex, Ordering};
use crate::vmstat::Event;
use std::collections::VecDeque;

const NR_ORDERS: usize = MAX_PAGE_ORDER as usize + 1;
/// pcp lists: orders 0..=PAGE_ALLOC_COSTLY_ORDER, then the PMD order.
const NR_PCP_LISTS: usize = 5;
/// `zone_batchsize`'s cap: a MiB of pages, before the quarter.
const PCP_BATCH_MAX_PAGES: u64 = (1 << 20) >> super::PAGE_SHIFT;
/// `CONFIG_PCP_BATCH_SCALE_MAX`: a refill or a drain moves at most
/// `batch << 5` pages.
const PCP_BATCH_SCALE_MAX: u8 = 5;

#[derive(Clone, Copy, Debug, Default)]
pub struct AllocFlags {
    /// `__GFP_ZERO`.
    pub zero: bool,
    /// `__GFP_THISNODE`: no fallback to other nodes.
    pub this_node: bool,
    /// `__GFP_COMP`: make a compound page (folio) of a high-order block.
    pub comp: bool,
    /// No `__GFP_DIRECT_RECLAIM`: never reclaim in the allocating thread
    /// (`GFP_NOWAIT`, as demotion and migration targets allocate); kswapd
    /// is still woken.
    pub no_direct_reclaim: bool,
    /// The nodes allowed (a policy's nodemask); 0 for all.
    pub nodes: u64,
    /// `__GFP_NOMEMALLOC`: no reserves below the min watermark, even for a
    /// thread that is reclaiming (demotion targets).
    pub no_memalloc: bool,
    /// No `__GFP_KSWAPD_RECLAIM`: do not wake kswapd either
    /// (`GFP_TRANSHUGE_LIGHT`, a THP fault's outside `MADV_HUGEPAGE`).
    pub no_kswapd: bool,
    /// The context the allocation runs in, as LUF's takeoff asks of it:
    /// whether it may send the TLB shootdown a block freed under LUF
    /// still needs before it is handed out.
    pub context: AllocContext,
}

/// Where an allocation runs, for LUF's takeoff (v12's
/// `no_shootdown_context`). Every allocation the model's own paths make
/// runs in a task that may sleep (`Task`); the other two are the
/// allocator's contract for callers that cannot send IPIs, and its tests
/// use them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllocContext {
    /// A preemptible task: may shoot down.
    #[default]
    Task,
    /// Not preemptible (a spinlock held): avoids shooting down while the
    /// zone has enough free pages without LUF keys, may when it has not
    /// (v12: "should be allowed under heavy memory pressure").
    Atomic,
    /// Interrupts off, or not in a task: never shoots down (the IPI could
    /// deadlock); takes only blocks without keys.
    IrqsOff,
}

impl AllocContext {
    /// Whether a takeoff in this context may shoot down, the zone's
    /// reserve of pages without keys being `non_luf_ok`.
    fn can_shootdown(self, non_luf_ok: bool) -> bool {
        match self {
            AllocContext::Task => true,
            AllocContext::Atomic => !non_luf_ok,
            AllocContext::IrqsOff => false,
        }
    }
}

impl AllocFlags {
    /// `GFP_TRANSHUGE_LIGHT` (`vma_thp_gfp_mask` with the default
    /// `defrag=madvise`, outside MADV_HUGEPAGE): a large folio only if one
    /// is free, no reclaim for it; the fault falls back to a smaller one.
    pub const fn transhuge_light(self) -> AllocFlags {
        AllocFlags {
            no_direct_reclaim: true,
            no_kswapd: true,
            no_memalloc: true,
            ..self
        }
    }
}

impl AllocFlags {
    /// No flag: whatever memory, from any node.
    pub const NONE: AllocFlags = AllocFlags {
        zero: false,
        this_node: false,
        comp: false,
        no_direct_reclaim: false,
        nodes: 0,
        no_memalloc: false,
        no_kswapd: false,
        context: AllocContext::Task,
    };
    /// `__GFP_ZERO`.
    pub const ZERO: AllocFlags = AllocFlags {
        zero: true,
        ..AllocFlags::NONE
    };

    /// These flags, and `__GFP_ZERO` too if `zero`.
    pub const fn zeroed_if(self, zero: bool) -> AllocFlags {
        AllocFlags {
            zero: self.zero || zero,
            ..self
        }
    }
}

struct FreeArea {
    /// `free_list`: blocks none of whose pages carries a LUF key.
    free: [FreeList; NR_ORDERS],
    /// `pend_list` (LUF v12): blocks some page of which was freed with its
    /// TLB flush deferred, kept apart so that an allocation can prefer
    /// blocks that need no shootdown, and one that cannot send IPIs can
    /// find them.
    pend: [FreeList; NR_ORDERS],
    /// Blocks of each order on both lists.
    nr_free: [u64; NR_ORDERS],
}

impl FreeArea {
    /// The list of `order` a block is filed on: the pend list if it owes a
    /// LUF shootdown, else the free list.
    fn list(&mut self, order: u32, owes: bool) -> &mut FreeList {
        match owes {
            true => &mut self.pend[order as usize],
            false => &mut self.free[order as usize],
        }
    }
}

/// One list of free blocks, linked through their heads' `lru_next` /
/// `lru_prev`; taken from the head.
#[derive(Clone, Copy)]
struct FreeList {
    head: u32,
    tail: u32,
}

impl FreeList {
    const EMPTY: FreeList = FreeList {
        head: LIST_NONE,
        tail: LIST_NONE,
    };

    fn is_empty(&self) -> bool {
        self.head == LIST_NONE
    }
}

#[derive(Default)]
struct PerCpuPages {
    /// Newest at the back: allocation and freeing use the back (LIFO, cache
    /// hot), a bulk free returns the front (the oldest) first.
    lists: [VecDeque<u32>; NR_PCP_LISTS],
    /// Pages (not blocks) on all lists.
    count: u64,
    /// `pcp->high`: past it a free drains to the zone. Tuned between the
    /// zone's `pcp_high` bounds by the allocations and frees themselves
    /// (v6.7's auto-tuning): a CPU that keeps allocating raises it, a zone
    /// short of free pages lowers it.
    high: u64,
    /// `alloc_factor`: refills grow to `batch << alloc_factor` while a
    /// CPU allocates without freeing; each free halves it.
    alloc_factor: u8,
    /// `free_count`: pages freed lately without allocations between, so
    /// that a drain moves as many as were freed; each allocation halves it.
    free_count: u64,
}

pub struct Zone {
    /// The zone lock with the free lists.
    free_area: CachePadded<Mutex<FreeArea>>,
    /// `NR_FREE_PAGES`: pages in the buddy lists (pcp pages excluded),
    /// changed once per locked section ([`Zone::account_freepages`]).
    nr_free: CachePadded<AtomicU64>,
    /// Each CPU's lists, on a cache line of its own (the kernel's are
    /// per-CPU memory): a fault takes its page from here without touching
    /// a line another CPU writes, save when a refill takes the zone lock.
    pcp: Box<[CachePadded<Mutex<PerCpuPages>>]>,
    /// Who takes the zone lock (the pcp refills and drains do).
    line: LineWriters,
    /// `_watermark[WMARK_MIN..=WMARK_PROMO]`, in pages: set again whenever
    /// the reserve changes, and read without a lock, as the kernel's
    /// `READ_ONCE`s do (a check may see the old marks or the new).
    watermark: [AtomicU64; NR_WMARK],
    /// `pcp->high_min` and `high_max` (`zone_highsize`): the zone's low
    /// watermark, and an eighth of its pages, split between the CPUs;
    /// set with the watermarks.
    pcp_high: [AtomicU64; 2],
    /// `pcp->batch` ([`zone_batchsize`]), set with the limits.
    pcp_batch: AtomicU64,
    /// How many CPUs share the pcp limits: the node's own, or every CPU
    /// of the machine where the node has none.
    pcp_split: u64,
    /// `ZONE_BELOW_HIGH`: an allocation found the zone at or below its high
    /// watermark; the pcp lists shrink on their frees until a drain finds
    /// it above again.
    below_high: std::sync::atomic::AtomicBool,
    /// `ZONE_RECLAIM_ACTIVE`: kswapd is balancing the node
    /// ([`Zone::set_reclaim_active`]); a free then drains the pcp list
    /// once it holds four batches, so that pages freed meanwhile (by
    /// munmap, direct reclaim, a migration's sources) reach the buddy
    /// lists, where the watermark checks count them, rather than wait on
    /// the lists of the CPU that freed them.
    reclaim_active: std::sync::atomic::AtomicBool,
    /// `migrc_pending_nr` (MIGRC): pages of sources kept after a migration
    /// whose flush was deferred; free to the watermark checks, since a
    /// forced flush frees them on demand.
    pub migrc_pending: AtomicU64,
    /// `zone->nr_luf_pages` (LUF v12): pages in blocks on the pend lists.
    /// Changed under the zone lock; read without it to decide which list
    /// an allocation tries first.
    nr_luf_pages: AtomicU64,
}

pub const WMARK_MIN: Option<usize> = Some(0);
pub const WMARK_LOW: Option<usize> = Some(1);
pub const WMARK_HIGH: Option<usize> = Some(2);
/// `NR_WMARK`: min, low, high and promo.
const NR_WMARK: usize = 4;
/// `watermark_scale_factor`'s default: a step between watermarks is at
/// least this many ten-thousandths of the zone.
const WATERMARK_SCALE_FACTOR: u64 = 10;

/// The reserve `calculate_min_free_kbytes` gives a machine of
/// `lowmem_pages`: `int_sqrt(16 * kB)`, clamped.
pub fn min_free_kbytes_for(lowmem_pages: u64) -> u64 {
    let lowmem_kbytes = lowmem_pages * (super::PAGE_SIZE >> 10);
    (lowmem_kbytes * 16).isqrt().clamp(128, 262_144)
}

/// `zone_batchsize`: how many pages a pcp refill or drain moves at its
/// least (`pcp->batch`), for a zone of `managed` pages: about 0.1% of the
/// zone or a MiB, whichever is less, quartered (the auto-tuning scales it
/// up to 32 times), then made one less than a power of two, so that two
/// CPUs taking batches in turn do not split the cache colours between
/// them; at least 1 (`zone_set_pageset_high_and_batch`). 63 from 688 MiB,
/// 15 at 256 MiB, 3 at 64 MiB, 1 at 16 MiB.
pub fn zone_batchsize(managed: u64) -> u64 {
    let batch = ((managed >> 10).min(PCP_BATCH_MAX_PAGES) / 4).max(1);
    let batch = batch + batch / 2;
    // rounddown_pow_of_two(batch) - 1
    ((1u64 << batch.ilog2()) - 1).max(1)
}

/// `MIGRATE_PCPTYPES`: unmovable, movable and reclaimable.
const MIGRATE_PCPTYPES: u64 = 3;

/// The reserve khugepaged recommends (`set_recommended_min_free_kbytes`)
/// for `nr_zones` zones of `lowmem_pages` above their high watermarks:
/// two free pageblocks a zone, and a pageblock a zone for each pair of
/// the three migrate types, so that fallbacks between types find blocks
/// nearly free; never more than 5% of those pages. A pageblock is a PMD's
/// worth on x86-64.
pub fn recommended_min_free_kbytes(nr_zones: u64, lowmem_pages: u64) -> u64 {
    let pageblock = 1u64 << super::HPAGE_PMD_ORDER;
    let pages =
        pageblock * nr_zones * 2 + pageblock * nr_zones * MIGRATE_PCPTYPES * MIGRATE_PCPTYPES;
    pages.min(lowmem_pages / 20) << (super::PAGE_SHIFT - 10)
}

/// `__setup_per_zone_wmarks` for one `ZONE_NORMAL` zone of `managed` pages
/// among `lowmem_pages`: its `_watermark[]`, min to promo. The kernel's
/// step is computed with `mult_frac`, which this equals.
pub fn zone_watermarks(
    min_free_kbytes: u64,
    managed: u64,
    lowmem_pages: u64,
    watermark_scale_factor: u64,
) -> [u64; NR_WMARK] {
    let pages_min = min_free_kbytes >> (super::PAGE_SHIFT - 10);
    let min = pages_min * managed / lowmem_pages.max(1);
    let step = (min >> 2).max(managed * watermark_scale_factor / 10_000);
    [min, min + step, min + 2 * step, min + 3 * step]
}

impl PhysMem {
    /// `min_free_kbytes`: the reserve the watermarks are set from now.
    pub fn min_free_kbytes(&self) -> u64 {
        *self.min_free_kbytes.lock()
    }

    /// `nr_free_buffer_pages`: the pages of every zone above its high
    /// watermark (all of them at boot, before the watermarks are set).
    pub fn nr_free_buffer_pages(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| n.nr_pages.saturating_sub(n.zone.wmark(2)))
            .sum()
    }

    /// `calculate_min_free_kbytes` and `setup_per_zone_wmarks`: the
    /// reserve for the machine's size (there is no `vm.min_free_kbytes`
    /// sysctl here to have set another).
    pub(super) fn calculate_min_free_kbytes(&self) {
        let mut kb = self.min_free_kbytes.lock();
        *kb = min_free_kbytes_for(self.nr_free_buffer_pages());
        self.setup_per_zone_wmarks(*kb);
    }

    /// `set_recommended_min_free_kbytes`, whenever the THP knobs change:
    /// while 2 MiB THPs are enabled (`pmd_enabled`) the reserve is raised
    /// to khugepaged's recommendation where that is larger; otherwise it
    /// is computed afresh for the machine's size, which lowers a raised
    /// one. Either way the watermarks are set again.
    pub fn set_recommended_min_free_kbytes(&self, pmd_enabled: bool) {
        if !pmd_enabled {
            return self.calculate_min_free_kbytes();
        }
        let mut kb = self.min_free_kbytes.lock();
        let recommended =
            recommended_min_free_kbytes(self.nodes.len() as u64, self.nr_free_buffer_pages());
        *kb = (*kb).max(recommended);
        self.setup_per_zone_wmarks(*kb);
    }

    /// `setup_per_zone_wmarks`: every zone's watermarks from the reserve
    /// (every zone here is `ZONE_NORMAL`, so all of memory is low memory),
    /// and then its pcp limits, which follow the low watermark
    /// (`zone_pcp_update`).
    fn setup_per_zone_wmarks(&self, min_free_kbytes: u64) {
        let lowmem_pages = self.nr_pages();
        for n in &self.nodes {
            let marks = zone_watermarks(
                min_free_kbytes,
                n.nr_pages,
                lowmem_pages,
                WATERMARK_SCALE_FACTOR,
            );
            n.zone.set_watermarks(marks, n.nr_pages);
        }
    }
}

/// MIGRC paused for as long as the slow path runs (`migrc_resume` as it
/// drops).
struct MigrcPaused<'a>(&'a super::migrc::Migrc);

impl<'a> MigrcPaused<'a> {
    fn enter(m: &'a super::migrc::Migrc) -> MigrcPaused<'a> {
        m.pause();
        MigrcPaused(m)
    }
}

impl Drop for MigrcPaused<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// What the allocator asks of reclaim (mm/vmscan.c, above this layer): the
/// machine registers itself ([`PhysMem::set_reclaimer`]).
pub trait Reclaimer: Send + Sync {
    /// `wakeup_kswapd`: node `nid` is short of free pages.
    fn wakeup_kswapd(&self, nid: usize, order: u32);
    /// `try_to_free_pages`: reclaim from `nid` in the calling thread, which
    /// plays CPU `cpu`; returns the pages reclaimed.
    fn try_to_free_pages(&self, nid: usize, order: u32, cpu: usize) -> u64;
    /// `migrc_flush_free_folios` from the calling thread, CPU `cpu`:
    /// whether any kept MIGRC source was freed. `why` is the model-only
    /// event its shootdowns are counted under as well.
    fn migrc_flush_free(&self, cpu: usize, why: Event) -> bool;
    /// LUF: flush the TLBs of `cpumask` in full, from the calling thread,
    /// CPU `cpu` (a block about to be handed out needs it).
    fn luf_flush(&self, cpu: usize, cpumask: u64);
    /// `lru_add_drain` of CPU `cpu`'s folio batches, from the thread that
    /// plays it (where code below the LRU releases a batch of folios:
    /// `__folio_batch_release`).
    fn lru_add_drain(&self, _cpu: usize) {}
}

std::thread_local! {
    /// `PF_MEMALLOC`: this thread is reclaiming.
    static IN_RECLAIM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is reclaiming (`current->flags & PF_MEMALLOC`).
pub fn in_reclaim() -> bool {
    IN_RECLAIM.with(|r| r.get())
}

/// `memalloc_noreclaim_save` .. `_restore`: held while a thread reclaims.
pub struct ReclaimGuard(bool);

impl ReclaimGuard {
    pub fn enter() -> ReclaimGuard {
        ReclaimGuard(IN_RECLAIM.with(|r| r.replace(true)))
    }
}

impl Drop for ReclaimGuard {
    fn drop(&mut self) {
        IN_RECLAIM.with(|r| r.set(self.0));
    }
}

/// LUF v12: how many pcp blocks an allocation that may not shoot down
/// tries before it turns to the buddy lists.
const PCP_TAKEOFF_TRIES: usize = 3;

fn pcp_index(order: u32) -> Option<usize> {
    match order {
        0..=3 => Some(order as usize),
        super::HPAGE_PMD_ORDER => Some(4),
        _ => None,
    }
}

impl Zone {
    /// A zone on a machine of `nr_cpus` CPUs, `node_cpus` of them on this
    /// node. Its watermarks are zero until the machine's reserve sets them
    /// ([`PhysMem::setup_per_zone_wmarks`]).
    pub(super) fn new(nr_cpus: usize, node_cpus: usize) -> Zone {
        // zone_highsize: split across the node's CPUs (its `cpu_online`
        // is a CPU being brought up, none here), or all of them if it has
        // none.
        let pcp_split = if node_cpus > 0 { node_cpus } else { nr_cpus }.max(1) as u64;
        // Until the watermarks set them (in `PhysMem::new`, before any
        // allocation): the least batch, and the least `high` for it. The
        // kernel's boot pageset has the lists off (`high` 0) instead.
        let pcp_high = [1 << 2; 2];
        Zone {
            free_area: CachePadded::new(Mutex::new(FreeArea {
                free: [FreeList::EMPTY; NR_ORDERS],
                pend: [FreeList::EMPTY; NR_ORDERS],
                nr_free: [0; NR_ORDERS],
            })),
            nr_luf_pages: AtomicU64::new(0),
            nr_free: CachePadded::new(AtomicU64::new(0)),
            pcp: (0..=nr_cpus)
                .map(|_| {
                    CachePadded::new(Mutex::new(PerCpuPages {
                        high: pcp_high[0],
                        ..Default::default()
                    }))
                })
                .collect(),
            line: LineWriters::new(),
            watermark: Default::default(),
            pcp_high: pcp_high.map(AtomicU64::new),
            pcp_batch: AtomicU64::new(1),
            pcp_split,
            below_high: Default::default(),
            reclaim_active: Default::default(),
            migrc_pending: AtomicU64::new(0),
        }
    }

    /// `_watermark[mark]`.
    pub fn wmark(&self, mark: usize) -> u64 {
        self.watermark[mark].load(Ordering::Relaxed)
    }

    /// The watermarks, min to promo.
    pub fn watermarks(&self) -> [u64; NR_WMARK] {
        std::array::from_fn(|i| self.wmark(i))
    }

    /// Set the watermarks of this zone of `managed` pages, and the pcp
    /// batch and limits (`zone_pcp_update`): the batch by the zone's size,
    /// the limits following the low watermark (`zone_highsize`: a share
    /// of it, and of an eighth of the zone, for each CPU that may use the
    /// lists, at least four batches).
    fn set_watermarks(&self, marks: [u64; NR_WMARK], managed: u64) {
        for (w, m) in self.watermark.iter().zip(marks) {
            w.store(m, Ordering::Relaxed);
        }
        let batch = zone_batchsize(managed);
        self.pcp_batch.store(batch, Ordering::Relaxed);
        let highsize = |total: u64| (total / self.pcp_split).max(batch << 2);
        let [high_min, high_max] = [highsize(marks[1]), highsize(managed / 8)];
        self.pcp_high[0].store(high_min, Ordering::Relaxed);
        self.pcp_high[1].store(high_max, Ordering::Relaxed);
        // Each list's tuned `high` stays within the new limits.
        for pcp in self.pcp.iter() {
            let mut pcp = pcp.lock();
            pcp.high = pcp.high.clamp(high_min, high_max);
        }
    }

    /// `pcp->high_min` and `high_max`.
    fn pcp_high(&self) -> [u64; 2] {
        self.pcp_high.each_ref().map(|h| h.load(Ordering::Relaxed))
    }

    /// `pcp->batch`.
    pub fn pcp_batch(&self) -> u64 {
        self.pcp_batch.load(Ordering::Relaxed)
    }

    /// `set_reclaim_active` / `clear_reclaim_active`: kswapd's
    /// `balance_pgdat` marks the zone while it reclaims.
    pub fn set_reclaim_active(&self, active: bool) {
        self.reclaim_active.store(active, Ordering::Relaxed);
    }

    /// `nr_pcp_alloc`: how many pages a refill of an `order` list takes.
    /// Order 0 scales with `alloc_factor` and raises `high` toward its
    /// maximum, unless the zone is below its high watermark.
    fn nr_pcp_alloc(&self, pcp: &mut PerCpuPages, order: u32) -> u64 {
        let [high_min, high_max] = self.pcp_high();
        let base = self.pcp_batch();
        // The kernel's `high < batch` test (lists off, the boot pageset)
        // cannot pass here: `high_min` is at least four batches.
        debug_assert!(high_min >= base << 2, "{high_min} {base}");
        let batch = if order == 0 {
            base << pcp.alloc_factor
        } else {
            base
        };
        if high_min != high_max && !self.below_high.load(Ordering::Relaxed) {
            pcp.high = (pcp.high + batch).min(high_max);
        }
        let batch = if order == 0 {
            let max_nr_alloc = pcp.high.saturating_sub(pcp.count + base).max(base);
            if batch <= max_nr_alloc && pcp.alloc_factor < PCP_BATCH_SCALE_MAX {
                pcp.alloc_factor += 1;
            }
            batch.min(max_nr_alloc)
        } else {
            batch
        };
        // A batch of one (a small zone's) stays one at every order.
        if batch > 1 {
            (batch >> order).max(2)
        } else {
            batch
        }
    }

    /// `nr_pcp_high`: the count past which a free drains, after tuning
    /// `high`: lowered by what was freed lately while kswapd reclaims
    /// (the count then four batches at most) or the zone is below its
    /// high watermark, raised to hold a batch of frees otherwise.
    fn nr_pcp_high(&self, pcp: &mut PerCpuPages, batch: u64) -> u64 {
        let [high_min, high_max] = self.pcp_high();
        pcp.high = pcp.high.clamp(high_min, high_max);
        let high = pcp.high;
        let lowered = high.saturating_sub(pcp.free_count.max(batch)).max(high_min);
        if self.reclaim_active.load(Ordering::Relaxed) {
            pcp.high = lowered;
            return (batch << 2).min(pcp.high);
        }
        if high_min == high_max {
            return high;
        }
        if self.below_high.load(Ordering::Relaxed) {
            pcp.high = lowered;
            pcp.count.max(high_min)
        } else {
            if pcp.count >= high {
                let need = pcp.free_count + batch;
                if pcp.high < need {
                    pcp.high = need.clamp(high_min, high_max);
                }
            }
            high
        }
    }

    /// `nr_pcp_free`: a drain moves as many pages as were freed lately,
    /// leaving at least a batch on the lists.
    fn nr_pcp_free(pcp: &PerCpuPages, batch: u64, high: u64) -> u64 {
        pcp.free_count
            .clamp(batch, high.saturating_sub(batch).max(batch))
    }

    pub fn nr_free_pages(&self) -> u64 {
        self.nr_free.load(Ordering::Relaxed) + self.pcp.iter().map(|p| p.lock().count).sum::<u64>()
    }

    /// `promo_wmark_pages`: `WMARK_PROMO`, one step above the high
    /// watermark, to which kswapd reclaims in NUMA balancing's tiering
    /// mode (room for promotions).
    pub fn promo_wmark_pages(&self) -> u64 {
        self.wmark(3)
    }

    /// Whether the zone's free pages are above watermark `mark`
    /// (`zone_watermark_ok_safe` for an order-0 request).
    pub fn above(&self, mark: Option<usize>) -> bool {
        let area = self.free_area.lock();
        self.watermark_ok(&area, 0, mark)
    }

    /// Pages in the buddy lists only (`NR_FREE_PAGES`).
    pub fn nr_free_buddy(&self) -> u64 {
        self.nr_free.load(Ordering::Relaxed)
    }

    /// The free pages a watermark check counts: the buddy lists' and, with
    /// MIGRC, the kept sources a forced flush would free.
    pub fn nr_free_for_watermark(&self) -> u64 {
        self.nr_free.load(Ordering::Relaxed) + self.migrc_pending.load(Ordering::Relaxed)
    }

    /// `get_page_from_freelist`'s look at the high watermark: a zone at or
    /// below it is marked `ZONE_BELOW_HIGH` (a fast test of the free count,
    /// made only while the flag is clear).
    fn note_below_high(&self, order: u32) {
        if !self.below_high.load(Ordering::Relaxed) && !self.watermark_fast(order, 2) {
            self.below_high.store(true, Ordering::Relaxed);
        }
    }

    /// `zone_watermark_fast`: whether a block of `order` leaves the free
    /// count above watermark `mark`, from that count alone (a read of one
    /// shared word, no lock).
    fn watermark_fast(&self, order: u32, mark: usize) -> bool {
        let free = self.nr_free_for_watermark() as i64 - ((1i64 << order) - 1);
        free > self.wmark(mark) as i64
    }

    /// `__zone_watermark_ok` against `mark` (None: any free block will do),
    /// for a block of `order`.
    fn watermark_ok(&self, area: &FreeArea, order: u32, mark: Option<usize>) -> bool {
        self.watermark_ok_taken(area, order, mark, 0)
    }

    /// [`Zone::watermark_ok`] with `taken` pages already off the lists in
    /// this locked section but not yet accounted.
    fn watermark_ok_taken(
        &self,
        area: &FreeArea,
        order: u32,
        mark: Option<usize>,
        taken: u64,
    ) -> bool {
        let free = self.nr_free_for_watermark() as i64 - taken as i64 - ((1i64 << order) - 1);
        let Some(mark) = mark else {
            return (order as usize..NR_ORDERS).any(|o| area.nr_free[o] > 0);
        };
        if free <= self.wmark(mark) as i64 {
            return false;
        }
        order == 0 || (order as usize..NR_ORDERS).any(|o| area.nr_free[o] > 0)
    }

    /// `non_luf_pages_ok`: the zone's free pages without LUF keys stay
    /// above its min watermark, the reserve for contexts that cannot
    /// shoot down. (v12 subtracts unsigned and may wrap; the model
    /// saturates.)
    fn non_luf_pages_ok(&self) -> bool {
        let free = self.nr_free.load(Ordering::Relaxed);
        let luf = self.nr_luf_pages.load(Ordering::Relaxed);
        free.saturating_sub(luf) > self.wmark(0)
    }

    /// `account_freepages`: `NR_FREE_PAGES` moves by `pages`, once for a
    /// whole locked section (zone lock held, or the zone private).
    fn account_freepages(&self, pages: i64) {
        if pages >= 0 {
            self.nr_free.fetch_add(pages as u64, Ordering::Relaxed);
        } else {
            self.nr_free
                .fetch_sub(pages.unsigned_abs(), Ordering::Relaxed);
        }
    }
}

/// Build the free lists of a new node: the largest aligned blocks that fit.
pub(super) fn init_free_area(mem: &PhysMem, node: &Node) {
    let mut area = node.zone.free_area.lock();
    let mut off = 0u64;
    while off < node.nr_pages {
        let mut order = MAX_PAGE_ORDER;
        while off & ((1 << order) - 1) != 0 || off + (1 << order) > node.nr_pages {
            order -= 1;
        }
        add_to_free_list(mem, node, &mut area, off as u32, order);
        off += 1 << order;
    }
    node.zone.account_freepages(node.nr_pages as i64);
}

/// Whether a free block is filed as owing a LUF shootdown: its head was
/// freed with a key, or a merge marked it ([`pg::LUF_PEND`]). A block some
/// page of which carries a key is always so filed, and so is every part of
/// it a merge once headed (each merge marks the head it makes): a split
/// files each half by its own head. A mark may be stale the other way (a
/// part that owes nothing, under a head a merge marked), which costs at
/// most a takeoff that finds nothing to flush.
fn block_owes_flush(mem: &PhysMem, node: &Node, off: u32) -> bool {
    let head = mem.page(node.start_pfn() + off as u64);
    head.luf_key.load(Ordering::Relaxed) != 0 || head.test(pg::LUF_PEND)
}

/// The list the block at `off` of `order` is filed on, and whether it is
/// a pend list; `nr_luf_pages` counts the block in as it is `added`, out
/// as it is taken off.
fn filed_list<'a>(
    mem: &PhysMem,
    node: &Node,
    area: &'a mut FreeArea,
    off: u32,
    order: u32,
    added: bool,
) -> (&'a mut FreeList, bool) {
    let luf = block_owes_flush(mem, node, off);
    if luf {
        let count = &node.zone.nr_luf_pages;
        match added {
            true => count.fetch_add(1 << order, Ordering::Relaxed),
            false => count.fetch_sub(1 << order, Ordering::Relaxed),
        };
    }
    (area.list(order, luf), luf)
}

/// `__add_to_free_list`: a block with a LUF key goes to the tail of its
/// pend list (the oldest is taken first, likeliest to have been flushed
/// meanwhile), any other to the head of its free list.
fn add_to_free_list(mem: &PhysMem, node: &Node, area: &mut FreeArea, off: u32, order: u32) {
    let page = mem.page(node.start_pfn() + off as u64);
    page.set(pg::BUDDY);
    page.private.store(order as u64, Ordering::Relaxed);
    let (list, luf) = filed_list(mem, node, area, off, order, true);
    let link = |o: u32| &mem.page(node.start_pfn() + o as u64).lru_next;
    let back = |o: u32| &mem.page(node.start_pfn() + o as u64).lru_prev;
    if list.is_empty() {
        page.lru_next.store(LIST_NONE, Ordering::Relaxed);
        page.lru_prev.store(LIST_NONE, Ordering::Relaxed);
        *list = FreeList {
            head: off,
            tail: off,
        };
    } else if luf {
        page.lru_next.store(LIST_NONE, Ordering::Relaxed);
        page.lru_prev.store(list.tail, Ordering::Relaxed);
        link(list.tail).store(off, Ordering::Relaxed);
        list.tail = off;
    } else {
        page.lru_next.store(list.head, Ordering::Relaxed);
        page.lru_prev.store(LIST_NONE, Ordering::Relaxed);
        back(list.head).store(off, Ordering::Relaxed);
        list.head = off;
    }
    area.nr_free[order as usize] += 1;
}

fn del_from_free_list(mem: &PhysMem, node: &Node, area: &mut FreeArea, off: u32, order: u32) {
    let page = mem.page(node.start_pfn() + off as u64);
    let (list, _) = filed_list(mem, node, area, off, order, false);
    let next = page.lru_next.load(Ordering::Relaxed);
    let prev = page.lru_prev.load(Ordering::Relaxed);
    if prev == LIST_NONE {
        debug_assert_eq!(list.head, off, "block {off:#x} not at its list's head");
        list.head = next;
    } else {
        mem.page(node.start_pfn() + prev as u64)
            .lru_next
            .store(next, Ordering::Relaxed);
    }
    if next == LIST_NONE {
        debug_assert_eq!(list.tail, off, "block {off:#x} not at its list's tail");
        list.tail = prev;
    } else {
        mem.page(node.start_pfn() + next as u64)
            .lru_prev
            .store(prev, Ordering::Relaxed);
    }
    // __ClearPageBuddy + set_page_private(page, 0): the order must not
    // outlive the free list (a PMD table reads `private` as its deposit
    // list, page[1] of a folio as a counter).
    page.clear(pg::BUDDY);
    page.private.store(0, Ordering::Relaxed);
    page.lru_next.store(LIST_NONE, Ordering::Relaxed);
    page.lru_prev.store(LIST_NONE, Ordering::Relaxed);
    area.nr_free[order as usize] -= 1;
}

/// What a takeoff from the buddy lists may take (LUF v12's
/// `get_page_from_free_area`).
#[derive(Clone, Copy)]
struct Takeoff {
    /// The context may shoot down: a block from a pend list will do.
    can_shootdown: bool,
    /// The zone is short of pages without keys: try the pend list first,
    /// so that the rest stay for contexts that cannot shoot down.
    pend_first: bool,
}

impl Takeoff {
    /// The list of `order` to take from, if either has a block this
    /// takeoff may have.
    fn pick(self, area: &FreeArea, order: u32) -> Option<u32> {
        let free = area.free[order as usize];
        let pend = area.pend[order as usize];
        let pend = (self.can_shootdown && !pend.is_empty()).then_some(pend.head);
        let free = (!free.is_empty()).then_some(free.head);
        if self.pend_first {
            pend.or(free)
        } else {
            free.or(pend)
        }
    }
}

/// `__rmqueue_smallest` + `expand`: take the smallest block of at least
/// `order` that `takeoff` allows and give back the halves not needed.
/// Zone lock held; the caller accounts the pages taken.
fn rmqueue_smallest(
    mem: &PhysMem,
    node: &Node,
    area: &mut FreeArea,
    order: u32,
    takeoff: Takeoff,
) -> Option<u32> {
    let (found, off) =
        (order..=MAX_PAGE_ORDER).find_map(|o| takeoff.pick(area, o).map(|off| (o, off)))?;
    del_from_free_list(mem, node, area, off, found);
    let mut high = found;
    while high > order {
        high -= 1;
        add_to_free_list(mem, node, area, off + (1 << high), high);
    }
    Some(off)
}

/// `__free_one_page`: merge with free buddies while possible. Zone lock
/// held; the caller accounts the pages freed. Each head a merge makes is
/// marked [`pg::LUF_PEND`] if either part owed a shootdown (v12 writes the
/// folded key on it at each step).
fn free_one_page(mem: &PhysMem, node: &Node, area: &mut FreeArea, mut off: u32, mut order: u32) {
    let mut owes = block_owes_flush(mem, node, off);
    while order < MAX_PAGE_ORDER {
        let buddy = off ^ (1 << order);
        if buddy as u64 >= node.nr_pages {
            break;
        }
        let bp = mem.page(node.start_pfn() + buddy as u64);
        if !bp.test(pg::BUDDY) || bp.private.load(Ordering::Relaxed) != order as u64 {
            break;
        }
        del_from_free_list(mem, node, area, buddy, order);
        owes |= block_owes_flush(mem, node, buddy);
        off &= buddy;
        order += 1;
        if owes {
            mem.page(node.start_pfn() + off as u64).set(pg::LUF_PEND);
        }
    }
    add_to_free_list(mem, node, area, off, order);
}

impl PhysMem {
    /// `__alloc_pages`: a block of `2^order` frames, preferring `nid` and then
    /// falling back along the zonelist (same tier first). `cpu` picks the pcp
    /// lists. Returns the head PFN with a refcount of 1.
    ///
    /// The fast path takes from the first zone above its low watermark
    /// (`get_page_from_freelist` with `ALLOC_WMARK_LOW`). If none is, the
    /// slow path (`__alloc_pages_slowpath`) wakes the kswapd of each node
    /// it may use, tries again down to the min watermark, then reclaims
    /// in the allocating thread (`__alloc_pages_direct_reclaim`, unless
    /// `no_direct_reclaim`) and tries once more. A thread that is itself
    /// reclaiming (`PF_MEMALLOC`) may dip below the min watermark and
    /// never reclaims again. There is no compaction and no OOM killer: the
    /// allocation then fails.
    pub fn alloc_pages(
        &self,
        nid: usize,
        order: u32,
        cpu: usize,
        flags: AllocFlags,
    ) -> Option<Pfn> {
        debug_assert!(order <= MAX_PAGE_ORDER);
        let pfn = self
            .get_page_from_freelist(nid, order, cpu, flags, WMARK_LOW)
            .or_else(|| self.alloc_pages_slowpath(nid, order, cpu, flags))?;
        self.luf_takeoff(pfn, order, cpu, flags.context);
        self.prep_new_page(pfn, order, flags);
        self.vmstat.count(cpu, Event::PGALLOC, 1 << order);
        Some(pfn)
    }

    /// `get_page_from_freelist`: the first zone of the zonelist (within the
    /// allowed nodes) above `mark` gives the block.
    fn get_page_from_freelist(
        &self,
        nid: usize,
        order: u32,
        cpu: usize,
        flags: AllocFlags,
        mark: Option<usize>,
    ) -> Option<Pfn> {
        self.allowed_zonelist(nid, flags).find_map(|n| {
            let node = &self.nodes[n];
            node.zone.note_below_high(order);
            self.rmqueue(node, order, cpu, mark, flags.context)
                .or_else(|| {
                    // MIGRC: a zone short of its watermark that holds kept
                    // sources flushes and frees them, and is tried again
                    // (by a task: no other context may send the flush).
                    if node.zone.migrc_pending.load(Ordering::Relaxed) == 0
                        || flags.context != AllocContext::Task
                    {
                        return None;
                    }
                    let r = self.reclaimer.get().and_then(|w| w.upgrade())?;
                    r.migrc_flush_free(cpu, Event::MIGRC_FLUSH_WATERMARK)
                        .then(|| self.rmqueue(node, order, cpu, mark, flags.context))
                        .flatten()
                })
        })
    }

    fn allowed_zonelist(&self, nid: usize, flags: AllocFlags) -> impl Iterator<Item = usize> + '_ {
        self.zonelist(nid, flags.this_node)
            .filter(move |&n| flags.nodes == 0 || (n < 64 && flags.nodes & (1 << n) != 0))
    }

    /// `__alloc_pages_slowpath`.
    fn alloc_pages_slowpath(
        &self,
        nid: usize,
        order: u32,
        cpu: usize,
        flags: AllocFlags,
    ) -> Option<Pfn> {
        if in_reclaim() && !flags.no_memalloc {
            // PF_MEMALLOC: the reclaimer's own allocations (a table for a
            // split) may use the reserves.
            return self.get_page_from_freelist(nid, order, cpu, flags, None);
        }
        let reclaim = self.reclaimer.get().and_then(|w| w.upgrade());
        // Only a task may flush, or reclaim (`GFP_ATOMIC` has no
        // `__GFP_DIRECT_RECLAIM`; its `__GFP_HIGH` dip below the min
        // watermark is not modelled).
        let task = flags.context == AllocContext::Task;
        // MIGRC under pressure: no new deferral while in here, and what is
        // kept is flushed and freed once.
        let _paused = MigrcPaused::enter(&self.migrc);
        if let (Some(r), true) = (&reclaim, task) {
            r.migrc_flush_free(cpu, Event::MIGRC_FLUSH_PRESSURE);
        }
        if let (Some(r), false) = (&reclaim, flags.no_kswapd) {
            for n in self.allowed_zonelist(nid, flags) {
                r.wakeup_kswapd(n, order);
            }
        }
        if let Some(p) = self.get_page_from_freelist(nid, order, cpu, flags, WMARK_MIN) {
            return Some(p);
        }
        if flags.no_direct_reclaim || in_reclaim() || !task {
            return None;
        }
        let r = reclaim?;
        // __alloc_pages_direct_reclaim over every node the allocation may
        // use (`shrink_zones`), the pcp lists drained after it, retried
        // while reclaim makes progress (`should_reclaim_retry`).
        let mut drained = false;
        for _ in 0..super::MAX_RECLAIM_RETRIES {
            let _memalloc = ReclaimGuard::enter();
            let progress: u64 = self
                .allowed_zonelist(nid, flags)
                .collect::<Vec<_>>()
                .into_iter()
                .map(|n| r.try_to_free_pages(n, order, cpu))
                .sum();
            drop(_memalloc);
            let mut page = self.get_page_from_freelist(nid, order, cpu, flags, WMARK_MIN);
            if page.is_none() && !drained {
                // Pages freed to the pcp lists count once drained.
                self.drain_all_pages();
                drained = true;
                page = self.get_page_from_freelist(nid, order, cpu, flags, WMARK_MIN);
            }
            if page.is_some() || progress == 0 {
                return page;
            }
        }
        None
    }

    /// Node ids in fallback order: the preferred node, then same-tier nodes,
    /// then the rest (a stand-in for node distances).
    fn zonelist(&self, nid: usize, this_node: bool) -> impl Iterator<Item = usize> + '_ {
        let nid = nid.min(self.nodes.len() - 1);
        let tier = self.nodes[nid].tier;
        let same = self
            .nodes
            .iter()
            .filter(move |n| n.id != nid && n.tier == tier)
            .map(|n| n.id);
        let other = self
            .nodes
            .iter()
            .filter(move |n| n.tier != tier)
            .map(|n| n.id);
        std::iter::once(nid).chain(same.chain(other).filter(move |_| !this_node))
    }

    /// Take a block from `node` if it stays above `mark` (None: no
    /// watermark, `ALLOC_NO_WATERMARKS`), one that `context` may take.
    fn rmqueue(
        &self,
        node: &Node,
        order: u32,
        cpu: usize,
        mark: Option<usize>,
        context: AllocContext,
    ) -> Option<Pfn> {
        let zone = &node.zone;
        // Before any list is touched: the free count alone, the lists'
        // orders under the lock below.
        if mark.is_some_and(|m| !zone.watermark_fast(order, m)) {
            return None;
        }
        let takeoff = self.takeoff(zone, context);
        // Threads that play no CPU (kswapd, the last slot) use the buddy
        // lists directly: no CPU would ever take pages from their list.
        let kernel_thread = cpu >= zone.pcp.len() - 1;
        if let (Some(idx), false) = (pcp_index(order), kernel_thread) {
            let mut pcp = zone.pcp[cpu.min(zone.pcp.len() - 1)].lock();
            // `__rmqueue_pcplist`: an allocation ends a run of frees.
            pcp.free_count >>= 1;
            if pcp.lists[idx].is_empty()
                && !self.rmqueue_bulk(node, &mut pcp, idx, order, mark, takeoff)
            {
                return None;
            }
            if let Some(off) = self.pcp_takeoff(node, &mut pcp.lists[idx], takeoff) {
                pcp.count -= 1 << order;
                let pfn = node.start_pfn() + off as u64;
                self.page(pfn).clear(pg::PCP);
                return Some(pfn);
            }
            // Every block tried needs a shootdown this context may not
            // send: the buddy lists' free list may have one.
        }
        let mut area = zone.free_area.lock();
        // The lock and, as the guard drops, the unlock.
        zone.line.write();
        zone.line.write();
        if !zone.watermark_ok(&area, order, mark) {
            return None;
        }
        let off = rmqueue_smallest(self, node, &mut area, order, takeoff)?;
        zone.account_freepages(-(1i64 << order));
        Some(node.start_pfn() + off as u64)
    }

    /// What a takeoff from `zone` in `context` may take.
    fn takeoff(&self, zone: &Zone, context: AllocContext) -> Takeoff {
        // No shortcut while LUF is unused: a first stamp may be filed on a
        // pend list while this allocation decides (the pend lists are then
        // simply empty).
        let non_luf_ok = zone.non_luf_pages_ok();
        Takeoff {
            can_shootdown: context.can_shootdown(non_luf_ok),
            pend_first: !non_luf_ok,
        }
    }

    /// `__rmqueue_pcplist`'s pick: the newest block, or, for a context
    /// that may not shoot down, the newest of the last
    /// [`PCP_TAKEOFF_TRIES`] without a LUF key (v12 retries three times).
    fn pcp_takeoff(&self, node: &Node, list: &mut VecDeque<u32>, takeoff: Takeoff) -> Option<u32> {
        if takeoff.can_shootdown {
            return list.pop_back();
        }
        let len = list.len();
        let i = (0..len.min(PCP_TAKEOFF_TRIES))
            .map(|k| len - 1 - k)
            .find(|&i| !block_owes_flush(self, node, list[i]))?;
        list.remove(i)
    }

    /// `rmqueue_bulk`: refill pcp list `idx` with a batch of `order`
    /// blocks under one hold of the zone lock, never below `mark`. False
    /// if the zone was below it before any was taken. (Blocks owing a LUF
    /// shootdown keep their keys and take their turn, as in v12.)
    fn rmqueue_bulk(
        &self,
        node: &Node,
        pcp: &mut PerCpuPages,
        idx: usize,
        order: u32,
        mark: Option<usize>,
        takeoff: Takeoff,
    ) -> bool {
        let zone = &node.zone;
        let mut area = zone.free_area.lock();
        zone.line.write();
        if !zone.watermark_ok(&area, order, mark) {
            return false;
        }
        let mut taken = 0;
        for _ in 0..zone.nr_pcp_alloc(pcp, order) {
            if !zone.watermark_ok_taken(&area, order, mark, taken) {
                break;
            }
            let Some(off) = rmqueue_smallest(self, node, &mut area, order, takeoff) else {
                break;
            };
            self.page(node.start_pfn() + off as u64).set(pg::PCP);
            pcp.lists[idx].push_back(off);
            taken += 1 << order;
        }
        pcp.count += taken;
        zone.account_freepages(-(taken as i64));
        // The unlock, as the guard drops.
        zone.line.write();
        true
    }

    /// LUF's takeoff check: a block whose pages were freed with their
    /// flush deferred is handed out only once every CPU that may still
    /// cache them has flushed (v12 checks as pages leave the buddy and the
    /// per-CPU lists; the model checks once, as the block leaves either).
    fn luf_takeoff(&self, pfn: Pfn, order: u32, cpu: usize, context: AllocContext) {
        // No key exists before the first deferred unmap: no page to read
        // (a THP's block is 512).
        if !self.luf.used() {
            return;
        }
        let pending = self.luf_takeoff_pending(pfn, order);
        if pending != 0 {
            // Such a context takes only blocks filed without a key.
            debug_assert_ne!(
                context,
                AllocContext::IrqsOff,
                "a block owing a shootdown went to a context that cannot send one"
            );
            let r = self.reclaimer.get().and_then(|w| w.upgrade());
            // Keys exist only on a machine's memory, which registered
            // itself: the flush is always made.
            debug_assert!(r.is_some(), "a LUF key on memory with no machine");
            if let Some(r) = r {
                r.luf_flush(cpu, pending);
            }
            self.vmstat.count(cpu, Event::LUF_TAKEOFF_FLUSH, 1);
        }
        self.luf_takeoff_clear(pfn, order);
    }

    /// `prep_new_page` / `prep_compound_page`.
    fn prep_new_page(&self, pfn: Pfn, order: u32, flags: AllocFlags) {
        let head = self.page(pfn);
        debug_assert_eq!(
            head.refcount.load(Ordering::Relaxed),
            0,
            "allocating a referenced page {pfn:#x}"
        );
        head.refcount.store(1, Ordering::Relaxed);
        debug_assert_eq!(
            head.private.load(Ordering::Relaxed),
            0,
            "a new page {pfn:#x} with private set"
        );
        if flags.comp && order > 0 {
            head.flags.store(
                pg::HEAD | ((order as u64) << pg::ORDER_SHIFT),
                Ordering::Relaxed,
            );
            for i in 1..(1u64 << order) {
                let tail = self.page(pfn + i);
                tail.compound_head
                    .store(pfn | super::memmap::COMPOUND_TAIL, Ordering::Relaxed);
            }
            let c = super::Folio(pfn).counters(self);
            c.large_mapcount.store(-1, Ordering::Relaxed);
            c.entire_mapcount.store(-1, Ordering::Relaxed);
            c.nr_pages_mapped.store(0, Ordering::Relaxed);
            c.init_mm_ids();
        }
        if flags.zero {
            for i in 0..(1u64 << order) {
                self.clear_page(pfn + i);
            }
        }
    }

    /// `__free_pages` of a block whose references are gone: reset the
    /// descriptors (checking, as `free_pages_prepare` does, that nothing still
    /// maps them) and return the block to the pcp list or the buddy lists.
    pub fn free_pages(&self, pfn: Pfn, order: u32, cpu: usize) {
        self.free_pages_to(pfn, order, cpu, true)
    }

    /// [`PhysMem::free_pages`], or with `use_pcp` false straight to the
    /// buddy lists, bypassing the per-CPU lists (MIGRC frees its kept
    /// sources so: they are cold, and a zone short of free pages wants
    /// them counted at once).
    pub(crate) fn free_pages_to(&self, pfn: Pfn, order: u32, cpu: usize, use_pcp: bool) {
        for (i, p) in self.pages(pfn, 1 << order).iter().enumerate() {
            debug_assert_eq!(
                p.mapcount.load(Ordering::Relaxed),
                -1,
                "freeing mapped page {:#x}",
                pfn + i as u64
            );
            debug_assert!(
                !p.test(pg::BUDDY | pg::PCP),
                "double free of {:#x}",
                pfn + i as u64
            );
            debug_assert!(
                i == 0 || p.refcount.load(Ordering::Relaxed) == 0,
                "tail page {:#x} holds references",
                pfn + i as u64
            );
            p.flags.store(0, Ordering::Relaxed);
            p.compound_head.store(0, Ordering::Relaxed);
            p.mapping.store(0, Ordering::Relaxed);
            p.private.store(0, Ordering::Relaxed);
        }
        self.page(pfn).refcount.store(0, Ordering::Relaxed);
        if order > 0 {
            // page[1] held the folio-wide counters: back to free-list state.
            let p1 = self.page(pfn + 1);
            p1.lru_next.store(LIST_NONE, Ordering::Relaxed);
            p1.lru_prev.store(LIST_NONE, Ordering::Relaxed);
        }
        let head = self.page(pfn);
        self.vmstat.count(cpu, Event::PGFREE, 1 << order);

        let node = self.node(pfn);
        let off = (pfn & ((1 << NODE_PFN_SHIFT) - 1)) as u32;
        let zone = &node.zone;
        let kernel_thread = cpu >= zone.pcp.len() - 1;
        if let (Some(idx), false, true) = (pcp_index(order), kernel_thread, use_pcp) {
            // `free_frozen_page_commit` (the kernel's heavy-freeing rule
            // for orders 1..=3, `free_high`, is not modelled).
            let mut pcp = zone.pcp[cpu].lock();
            pcp.alloc_factor >>= 1;
            head.set(pg::PCP);
            // LUF v12: a block that owes a shootdown goes where it is
            // taken last (and drained first), to defer the flush longest.
            if block_owes_flush(self, node, off) {
                pcp.lists[idx].push_front(off);
            } else {
                pcp.lists[idx].push_back(off);
            }
            pcp.count += 1 << order;
            let batch = zone.pcp_batch();
            if pcp.free_count < batch << PCP_BATCH_SCALE_MAX {
                pcp.free_count += 1 << order;
            }
            let high = zone.nr_pcp_high(&mut pcp, batch);
            if pcp.count >= high {
                let n = Zone::nr_pcp_free(&pcp, batch, high);
                self.free_pcppages_bulk(node, &mut pcp, n);
                if zone.below_high.load(Ordering::Relaxed) && zone.watermark_fast(0, 2) {
                    zone.below_high.store(false, Ordering::Relaxed);
                    // 6.18: the pressure is gone. Where another node takes
                    // this one's fallbacks (the kernel asks for a node
                    // with memory numbered above it), no allocation here
                    // need reach direct reclaim to revive a hopeless
                    // kswapd, so the free does.
                    if node.kswapd_hopeless() && node.id + 1 < self.nodes.len() {
                        node.kswapd_clear_hopeless();
                    }
                }
            }
            return;
        }
        let mut area = zone.free_area.lock();
        free_one_page(self, node, &mut area, off, order);
        zone.account_freepages(1 << order);
    }

    /// Return at least `pages` pages from a pcp to the buddy lists, oldest first.
    fn free_pcppages_bulk(&self, node: &Node, pcp: &mut PerCpuPages, pages: u64) {
        let mut area = node.zone.free_area.lock();
        let mut freed = 0;
        'lists: for idx in 0..NR_PCP_LISTS {
            let order = if idx == 4 {
                super::HPAGE_PMD_ORDER
            } else {
                idx as u32
            };
            while !pcp.lists[idx].is_empty() {
                if freed >= pages {
                    break 'lists;
                }
                let Some(off) = pcp.lists[idx].pop_front() else {
                    break;
                };
                self.page(node.start_pfn() + off as u64).clear(pg::PCP);
                free_one_page(self, node, &mut area, off, order);
                pcp.count -= 1 << order;
                freed += 1 << order;
            }
        }
        node.zone.account_freepages(freed as i64);
    }

    /// Return every pcp page to the buddy lists (`drain_all_pages`).
    pub fn drain_all_pages(&self) {
        for node in &self.nodes {
            for pcp in node.zone.pcp.iter() {
                let mut pcp = pcp.lock();
                let n = pcp.count;
                self.free_pcppages_bulk(node, &mut pcp, n);
            }
        }
    }

    /// LUF's filing of the buddy lists (for the invariant checker): each
    /// list is linked both ways and ends at its tail, every block on a
    /// pend list is marked as owing a flush, no page of a block on a free
    /// list carries a key, and `nr_luf_pages` counts the pend lists' pages.
    pub fn check_luf_lists(&self) -> Result<(), String> {
        for node in &self.nodes {
            let area = node.zone.free_area.lock();
            let mut luf_pages = 0;
            for order in 0..=MAX_PAGE_ORDER {
                let lists = [
                    (false, area.free[order as usize]),
                    (true, area.pend[order as usize]),
                ];
                for (pend, list) in lists {
                    let what = if pend { "pend" } else { "free" };
                    let at = |o: u32| self.page(node.start_pfn() + o as u64);
                    let (mut prev, mut off) = (LIST_NONE, list.head);
                    while off != LIST_NONE {
                        let head = node.start_pfn() + off as u64;
                        if at(off).lru_prev.load(Ordering::Relaxed) != prev {
                            return Err(format!(
                                "{what} list of order {order}: {head:#x} links back wrong"
                            ));
                        }
                        if pend {
                            luf_pages += 1u64 << order;
                            if !block_owes_flush(self, node, off) {
                                return Err(format!(
                                    "block {head:#x} on a pend list owes no flush"
                                ));
                            }
                        } else if let Some(i) = self
                            .pages(head, 1 << order)
                            .iter()
                            .position(|p| p.luf_key.load(Ordering::Relaxed) != 0)
                        {
                            return Err(format!(
                                "frame {:#x} carries a LUF key in block {head:#x} on a free list",
                                head + i as u64
                            ));
                        }
                        prev = off;
                        off = at(off).lru_next.load(Ordering::Relaxed);
                    }
                    if list.tail != prev {
                        return Err(format!(
                            "{what} list of order {order}: its tail is not its last block"
                        ));
                    }
                }
            }
            let counted = node.zone.nr_luf_pages.load(Ordering::Relaxed);
            if counted != luf_pages {
                return Err(format!(
                    "node {}: nr_luf_pages {counted}, the pend lists hold {luf_pages}",
                    node.id
                ));
            }
        }
        Ok(())
    }

    /// Call `f(head, order)` for every free block, in the buddy lists and on
    /// the pcp lists (for the invariant checker; takes every lock in turn).
    pub fn for_each_free_block(&self, mut f: impl FnMut(Pfn, u32)) {
        for node in &self.nodes {
            for pcp in node.zone.pcp.iter() {
                let pcp = pcp.lock();
                for (idx, list) in pcp.lists.iter().enumerate() {
                    let order = if idx == 4 {
                        super::HPAGE_PMD_ORDER
                    } else {
                        idx as u32
                    };
                    list.iter()
                        .for_each(|&off| f(node.start_pfn() + off as u64, order));
                }
            }
            let area = node.zone.free_area.lock();
            for order in 0..=MAX_PAGE_ORDER {
                let lists = [area.free[order as usize], area.pend[order as usize]];
                for mut off in lists.map(|l| l.head) {
                    while off != LIST_NONE {
                        f(node.start_pfn() + off as u64, order);
                        off = self
                            .page(node.start_pfn() + off as u64)
                            .lru_next
                            .load(Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phys::{NodeConfig, Tier};

    fn mem(mib: u64) -> PhysMem {
        PhysMem::new(
            &[NodeConfig {
                size_bytes: mib << 20,
                tier: Tier::Dram,
                has_cpus: true,
            }],
            &[0, 0],
        )
        .unwrap()
    }

    #[test]
    fn alloc_free_round_trip_restores_free_count() {
        let m = mem(16);
        let before = m.nr_free_pages();
        let mut got = vec![];
        for order in [0, 1, 2, 3, 4, 9, 0, 9, 10] {
            got.push((
                m.alloc_pages(0, order, 0, AllocFlags::default()).unwrap(),
                order,
            ));
        }
        assert_eq!(
            m.nr_free_pages(),
            before - got.iter().map(|&(_, o)| 1u64 << o).sum::<u64>()
        );
        for (pfn, order) in got {
            m.page(pfn).refcount.store(0, Ordering::Relaxed);
            m.free_pages(pfn, order, 1);
        }
        m.drain_all_pages();
        assert_eq!(m.nr_free_pages(), before);
        // Everything merged back into max-order blocks.
        let area = m.nodes[0].zone.free_area.lock();
        assert_eq!(area.nr_free[MAX_PAGE_ORDER as usize], 16 << 20 >> 22);
    }

    /// The pcp auto-tuning: refills double while a CPU only allocates (up
    /// to `batch << 5`, within `high`), a free halves the factor, and a
    /// run of frees drains as many pages as it freed.
    #[test]
    fn pcp_refills_grow_while_a_cpu_only_allocates() {
        let m = mem(256);
        let zone = &m.nodes[0].zone;
        let [high_min, high_max] = zone.pcp_high();
        assert!(high_min < high_max, "{high_min} {high_max}");
        let pcp = |f: &dyn Fn(&PerCpuPages) -> u64| f(&zone.pcp[0].lock());
        let mut got = vec![];
        let mut refills = vec![];
        for _ in 0..8_000 {
            let before = pcp(&|p| p.count);
            got.push(m.alloc_pages(0, 0, 0, AllocFlags::default()).unwrap());
            let after = pcp(&|p| p.count);
            if after + 1 > before {
                refills.push(after + 1 - before);
            }
        }
        // The sixth is 480 pages unless a refill must leave room for a
        // batch under `high_max`.
        let b = zone.pcp_batch();
        assert_eq!(b, 15, "a 256 MiB zone's batch");
        let sixth = (b << 5).min(high_max - b);
        assert_eq!(
            &refills[..6],
            &[b, 2 * b, 4 * b, 8 * b, 16 * b, sixth],
            "{refills:?}"
        );
        assert!(refills[6..].iter().all(|&r| r <= b << PCP_BATCH_SCALE_MAX));
        assert_eq!(pcp(&|p| p.alloc_factor as u64), PCP_BATCH_SCALE_MAX as u64);
        assert!(pcp(&|p| p.high) > high_min);
        // Frees: the factor halves with each, and the list drains in one
        // go once past `high`, by about what was freed.
        let free = |pfn: Pfn| {
            m.page(pfn).refcount.store(0, Ordering::Relaxed);
            m.free_pages(pfn, 0, 0);
        };
        free(got.pop().unwrap());
        assert_eq!(pcp(&|p| p.alloc_factor as u64), 2);
        let mut drains = vec![];
        for pfn in got.drain(..) {
            let before = pcp(&|p| p.count);
            free(pfn);
            let after = pcp(&|p| p.count);
            if after < before {
                drains.push(before + 1 - after);
            }
        }
        assert!(!drains.is_empty());
        assert!(drains.iter().all(|&d| d >= b), "{drains:?}");
        assert!(pcp(&|p| p.count) <= high_max);
        m.drain_all_pages();
    }

    /// A zone found at or below its high watermark lowers `high` on frees,
    /// down to `high_min`.
    #[test]
    fn pcp_high_falls_below_the_high_watermark() {
        let m = mem(64);
        let zone = &m.nodes[0].zone;
        let [high_min, _] = zone.pcp_high();
        zone.pcp[0].lock().high = high_min * 4;
        let mut got = vec![];
        while let Some(pfn) = m.alloc_pages(0, 0, 0, AllocFlags::default()) {
            got.push(pfn);
        }
        assert!(zone.below_high.load(Ordering::Relaxed));
        for pfn in got.drain(..200) {
            m.page(pfn).refcount.store(0, Ordering::Relaxed);
            m.free_pages(pfn, 0, 0);
        }
        assert_eq!(zone.pcp[0].lock().high, high_min);
    }

    #[test]
    fn blocks_are_aligned_and_disjoint() {
        let m = mem(8);
        let mut seen = std::collections::HashSet::new();
        while let Some(pfn) = m.alloc_pages(0, 2, 0, AllocFlags::default()) {
            assert_eq!(pfn % 4, 0);
            for i in 0..4 {
                assert!(
                    seen.insert(pfn + i),
                    "frame {:#x} handed out twice",
                    pfn + i
                );
            }
        }
        let mut free_frames = 0;
        m.for_each_free_block(|head, order| {
            for i in 0..1u64 << order {
                assert!(
                    !seen.contains(&(head + i)),
                    "frame {:#x} both free and allocated",
                    head + i
                );
            }
            free_frames += 1u64 << order;
        });
        assert_eq!(free_frames, m.nr_free_pages());
        // Allocation stopped at the min watermark, not at zero.
        let free = m.nodes[0].zone.nr_free_buddy();
        assert!(free <= m.nodes[0].zone.wmark(0) + 4, "free {free}");
        assert!(free > 0);
    }

    #[test]
    fn zeroed_allocation_is_zero() {
        let m = mem(8);
        let pfn = m.alloc_pages(0, 0, 0, AllocFlags::default()).unwrap();
        // SAFETY: the frame was just allocated and is owned here.
        unsafe { std::ptr::write_bytes(m.frame_ptr(pfn), 0xaa, 4096) };
        m.page(pfn).refcount.store(0, Ordering::Relaxed);
        m.free_pages(pfn, 0, 0);
        let again = m
            .alloc_pages(
                0,
                0,
                0,
                AllocFlags {
                    zero: true,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(again, pfn, "pcp lists are LIFO");
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(m.frame_ptr(again), 4096) };
        assert!(bytes.iter().all(|&b| b == 0));
    }

    #[test]
    fn fallback_to_other_node_unless_thisnode() {
        let cfg = NodeConfig {
            size_bytes: 8 << 20,
            tier: Tier::Dram,
            has_cpus: true,
        };
        let m = PhysMem::new(
            &[
                cfg.clone(),
                NodeConfig {
                    has_cpus: false,
                    tier: Tier::Slow,
                    ..cfg
                },
            ],
            &[0],
        )
        .unwrap();
        while m
            .alloc_pages(
                0,
                0,
                0,
                AllocFlags {
                    this_node: true,
                    ..Default::default()
                },
            )
            .is_some()
        {}
        let pfn = m.alloc_pages(0, 0, 0, AllocFlags::default()).unwrap();
        assert_eq!(PhysMem::nid(pfn), 1);
    }

    /// A machine's stand-in for LUF's tests: counts the takeoff flushes
    /// asked of it, and records each as done.
    #[derive(Default)]
    struct LufFlushes {
        mem: std::sync::OnceLock<std::sync::Weak<PhysMem>>,
        asked: AtomicU64,
        /// MIGRC's forced flushes asked of it.
        migrc_asked: AtomicU64,
    }

    impl Reclaimer for LufFlushes {
        fn wakeup_kswapd(&self, _: usize, _: u32) {}
        fn try_to_free_pages(&self, _: usize, _: u32, _: usize) -> u64 {
            0
        }
        fn migrc_flush_free(&self, _: usize, _: Event) -> bool {
            self.migrc_asked.fetch_add(1, Ordering::Relaxed);
            false
        }
        fn luf_flush(&self, _: usize, cpumask: u64) {
            self.asked.fetch_add(1, Ordering::Relaxed);
            let m = self.mem.get().and_then(|w| w.upgrade()).unwrap();
            let ugen = m.luf.flush_start();
            m.luf.flush_done(cpumask, ugen);
        }
    }

    /// `mib` MiB on one node, with [`LufFlushes`] as its machine.
    fn luf_mem(mib: u64) -> (std::sync::Arc<PhysMem>, std::sync::Arc<LufFlushes>) {
        let m = std::sync::Arc::new(mem(mib));
        let r = std::sync::Arc::new(LufFlushes::default());
        r.mem.set(std::sync::Arc::downgrade(&m)).unwrap();
        let weak: std::sync::Weak<dyn Reclaimer> =
            std::sync::Arc::downgrade(&(r.clone() as std::sync::Arc<dyn Reclaimer>));
        m.set_reclaimer(weak);
        (m, r)
    }

    /// Free `pfns` (order 0) as LUF frees a source: stamped with a batch
    /// whose flush of CPU 1 is still owed.
    fn luf_free(m: &PhysMem, pfns: &[Pfn]) {
        let batch = crate::phys::luf::LufBatch {
            cpumask: 0b10,
            ugen: m.luf.new_ugen(),
        };
        for &pfn in pfns {
            m.luf_stamp(pfn, 1, batch);
            m.page(pfn).refcount.store(0, Ordering::Relaxed);
            m.free_pages(pfn, 0, 0);
        }
    }

    fn put(m: &PhysMem, pfn: Pfn, order: u32) {
        m.page(pfn).refcount.store(0, Ordering::Relaxed);
        m.free_pages(pfn, order, 0);
    }

    fn nr_luf_pages(m: &PhysMem) -> u64 {
        m.nodes[0].zone.nr_luf_pages.load(Ordering::Relaxed)
    }

    fn context(context: AllocContext) -> AllocFlags {
        AllocFlags {
            context,
            ..AllocFlags::NONE
        }
    }

    #[test]
    fn luf_pages_are_filed_apart_and_taken_last() {
        // Four max-order blocks: the one the LUF pages come from is filed
        // whole once they merge back into it, the others owe nothing.
        let (m, flushes) = luf_mem(16);
        let pfns: Vec<Pfn> = (0..64)
            .map(|_| m.alloc_pages(0, 0, 0, AllocFlags::NONE).unwrap())
            .collect();
        luf_free(&m, &pfns);
        // On the pcp list they wait behind every block that owes nothing.
        let next = m.alloc_pages(0, 0, 0, AllocFlags::NONE).unwrap();
        assert!(!pfns.contains(&next), "a LUF page was handed out first");
        put(&m, next, 0);
        m.drain_all_pages();
        m.check_luf_lists().unwrap();
        let filed = nr_luf_pages(&m);
        assert!(filed >= 64, "{filed} pages filed as LUF");
        // With plenty of pages owing nothing, no context takes from a pend
        // list, and none flushes.
        for ctx in [
            AllocContext::Task,
            AllocContext::Atomic,
            AllocContext::IrqsOff,
        ] {
            m.drain_all_pages();
            let pfn = m.alloc_pages(0, 0, 0, context(ctx)).unwrap();
            assert!(!pfns.contains(&pfn), "{ctx:?} got a LUF page");
            assert_eq!(nr_luf_pages(&m), filed, "{ctx:?} took from a pend list");
        }
        assert_eq!(flushes.asked.load(Ordering::Relaxed), 0);
        m.check_luf_lists().unwrap();
    }

    #[test]
    fn a_context_that_cannot_shoot_down_never_takes_a_block_that_owes() {
        let (m, flushes) = luf_mem(4);
        let mut pfns = vec![];
        while let Some(pfn) = m.alloc_pages(0, 0, 0, AllocFlags::NONE) {
            pfns.push(pfn);
        }
        // Everything free now owes a flush: the reserve is gone.
        luf_free(&m, &pfns);
        m.drain_all_pages();
        m.check_luf_lists().unwrap();
        assert!(!m.nodes[0].zone.non_luf_pages_ok());
        assert_eq!(m.alloc_pages(0, 0, 0, context(AllocContext::IrqsOff)), None);
        assert_eq!(
            flushes.asked.load(Ordering::Relaxed),
            0,
            "an IRQs-off context flushed"
        );
        // A non-preemptible context may shoot down under pressure, and the
        // pend list comes first: the takeoff flushes CPU 1.
        let pfn = m
            .alloc_pages(0, 0, 0, context(AllocContext::Atomic))
            .unwrap();
        assert!(pfns.contains(&pfn));
        assert_eq!(flushes.asked.load(Ordering::Relaxed), 1);
        // The same batch is done now: a task's takeoff finds nothing owed.
        m.drain_all_pages();
        let before = nr_luf_pages(&m);
        let pfn2 = m.alloc_pages(0, 0, 0, context(AllocContext::Task)).unwrap();
        assert!(pfns.contains(&pfn2));
        assert!(
            nr_luf_pages(&m) < before,
            "a task did not take a pend block"
        );
        assert_eq!(flushes.asked.load(Ordering::Relaxed), 1);
        m.check_luf_lists().unwrap();
        // A block freed owing nothing is one an IRQs-off context may have,
        // from the back of the pcp list, past blocks that owe.
        put(&m, pfn, 0);
        luf_free(&m, &[pfn2]);
        let off = |pfn: Pfn| (pfn & ((1 << NODE_PFN_SHIFT) - 1)) as u32;
        let pcp = m.nodes[0].zone.pcp[0].lock().lists[0].clone();
        assert_eq!(pcp.back(), Some(&off(pfn)));
        assert_eq!(pcp.front(), Some(&off(pfn2)));
        assert_eq!(
            m.alloc_pages(0, 0, 0, context(AllocContext::IrqsOff)),
            Some(pfn)
        );
    }

    #[test]
    fn luf_filing_survives_merges_and_splits() {
        let (m, _flushes) = luf_mem(4);
        let before = m.nr_free_pages();
        let mut got = vec![];
        for order in [0, 3, 0, 9, 1, 0, 2] {
            got.push((m.alloc_pages(0, order, 0, AllocFlags::NONE).unwrap(), order));
        }
        // The first two order-0 pages LUF-freed, the rest plainly.
        let luf: Vec<Pfn> = got
            .iter()
            .filter(|g| g.1 == 0)
            .map(|g| g.0)
            .take(2)
            .collect();
        luf_free(&m, &luf);
        for &(pfn, order) in got.iter().filter(|g| !luf.contains(&g.0)) {
            put(&m, pfn, order);
        }
        m.drain_all_pages();
        m.check_luf_lists().unwrap();
        assert!(nr_luf_pages(&m) > 0);
        // Take everything, below the watermarks too (as a reclaiming thread
        // may), at mixed orders that split the filed blocks; then give it
        // all back: what was taken owes nothing any more.
        let mut all = vec![];
        {
            let _memalloc = ReclaimGuard::enter();
            for order in [0, 2, 9, 0, 1, 10, 3].into_iter().cycle() {
                match m.alloc_pages(0, order, 0, AllocFlags::NONE) {
                    Some(pfn) => all.push((pfn, order)),
                    None if order == 0 => break,
                    None => {}
                }
                m.check_luf_lists().unwrap();
            }
            // What waits on the pcp lists of other orders, page by page.
            m.drain_all_pages();
            while let Some(pfn) = m.alloc_pages(0, 0, 0, AllocFlags::NONE) {
                all.push((pfn, 0));
            }
        }
        m.drain_all_pages();
        assert_eq!(m.nr_free_pages(), 0, "everything taken");
        for (pfn, order) in all {
            put(&m, pfn, order);
        }
        m.drain_all_pages();
        m.check_luf_lists().unwrap();
        assert_eq!(nr_luf_pages(&m), 0);
        assert_eq!(m.nr_free_pages(), before);
    }

    #[test]
    fn only_a_task_flushes_kept_migrc_sources() {
        let (m, r) = luf_mem(4);
        {
            // Everything, the reserves too.
            let _memalloc = ReclaimGuard::enter();
            while m.alloc_pages(0, 0, 0, AllocFlags::NONE).is_some() {}
            m.drain_all_pages();
            while m.alloc_pages(0, 0, 0, AllocFlags::NONE).is_some() {}
        }
        assert_eq!(m.nr_free_pages(), 0);
        // Sources kept by MIGRC, which only a forced flush would free.
        m.nodes[0].zone.migrc_pending.store(1, Ordering::Relaxed);
        for ctx in [AllocContext::IrqsOff, AllocContext::Atomic] {
            r.migrc_asked.store(0, Ordering::Relaxed);
            assert_eq!(m.alloc_pages(0, 0, 0, context(ctx)), None);
            assert_eq!(r.migrc_asked.load(Ordering::Relaxed), 0, "{ctx:?} flushed");
        }
        assert_eq!(m.alloc_pages(0, 0, 0, context(AllocContext::Task)), None);
        assert!(
            r.migrc_asked.load(Ordering::Relaxed) > 0,
            "a task did not flush"
        );
        m.nodes[0].zone.migrc_pending.store(0, Ordering::Relaxed);
    }

    #[test]
    fn the_reserve_is_sized_for_the_machine_and_shared_by_zone_size() {
        // A 4 GiB machine: int_sqrt(16 * 4 Mi kB) = 8192 kB; the clamps at
        // both ends.
        assert_eq!(min_free_kbytes_for(1 << 20), 8192);
        assert_eq!(min_free_kbytes_for(256), 128);
        assert_eq!(min_free_kbytes_for(1 << 40), 262_144);
        // Tiers of 16 MiB beside 64 MiB (bench migrc's before it was
        // scaled up): 1144 kB for both,
        // 286 pages, a fifth of them on the small node, whose step is a
        // quarter of that (its scale factor gives 4 pages).
        let m = PhysMem::new(
            &[
                NodeConfig {
                    size_bytes: 16 << 20,
                    tier: Tier::Dram,
                    has_cpus: true,
                },
                NodeConfig {
                    size_bytes: 64 << 20,
                    tier: Tier::Slow,
                    has_cpus: false,
                },
            ],
            &[0, 0],
        )
        .unwrap();
        assert_eq!(m.nodes[0].zone.watermarks(), [57, 71, 85, 99]);
        assert_eq!(m.nodes[1].zone.watermarks(), [228, 285, 342, 399]);
        assert_eq!(m.nodes[0].zone.promo_wmark_pages(), 99);
        // Alone, the small node keeps the reserve of a 16 MiB machine.
        assert_eq!(mem(16).nodes[0].zone.watermarks(), [128, 160, 192, 224]);
    }

    /// khugepaged's reserve follows the THP knobs, as the host's does (on
    /// the host, enabling 2 MiB THPs raised `min_free_kbytes` to 11
    /// pageblocks for each of its three zones, 67,584 kB, and disabling
    /// them brought the earlier value back).
    #[test]
    fn the_reserve_follows_the_thp_knobs() {
        use crate::machine::ThpMode;
        let m =
            crate::Machine::new(crate::MachineConfig::two_tiers(16 << 20, 64 << 20, 2)).unwrap();
        let marks = |nid: usize| m.mem.nodes[nid].zone.watermarks();
        // Under 512 MiB a machine boots with THPs disabled
        // (`hugepage_init`), and with its own reserve.
        assert_eq!(m.thp.enabled(), ThpMode::Never);
        assert!(!m.thp.hugepage_pmd_enabled());
        assert_eq!(m.mem.min_free_kbytes(), 1144);
        assert_eq!(marks(0), [57, 71, 85, 99]);
        // Enabled: khugepaged's reserve, 11 pageblocks for each of two
        // zones, capped at a twentieth of the 20,053 pages above the high
        // watermarks, 1002 pages.
        m.thp.set_enabled(ThpMode::Madvise).unwrap();
        assert!(m.thp.hugepage_pmd_enabled());
        assert_eq!(m.mem.min_free_kbytes(), 4008);
        assert_eq!(marks(0), [200, 250, 300, 350]);
        assert_eq!(marks(1), [801, 1001, 1201, 1401]);
        // Disabled: the machine's own reserve, from the pages above the
        // high watermarks now (18,979), so below the boot value.
        m.thp.only_order(0);
        assert!(!m.thp.hugepage_pmd_enabled());
        assert_eq!(m.mem.min_free_kbytes(), 1102);
        assert_eq!(marks(0), [55, 68, 81, 94]);
        // The top level alone does not enable them while 2 MiB is `never`
        // (the reserve is computed again, from the pages above the lower
        // marks).
        m.thp.set_enabled(ThpMode::Always).unwrap();
        assert!(!m.thp.hugepage_pmd_enabled());
        assert_eq!(m.mem.min_free_kbytes(), 1133);
        m.thp
            .set_order(crate::phys::HPAGE_PMD_ORDER, ThpMode::Inherit)
            .unwrap();
        assert_eq!(m.mem.min_free_kbytes(), 4008);
        // The pcp lists' limits follow the low watermark, shared by the
        // node's own CPUs, or by all of them where it has none.
        assert_eq!(m.mem.nodes[0].zone.pcp_high()[0], 250 / 2);
        assert_eq!(m.mem.nodes[1].zone.pcp_high()[0], 1001 / 2);
    }

    /// `hugepage_init`'s threshold: 512 MiB boots with THPs at the
    /// defaults and khugepaged's reserve (5,632 pages for one zone), a MiB
    /// less with THPs disabled and the machine's own.
    #[test]
    fn a_machine_under_512_mib_boots_with_thps_disabled() {
        use crate::machine::ThpMode;
        let boot = |mib: u64| crate::Machine::new(crate::MachineConfig::single_node(mib << 20, 1));
        let m = boot(512).unwrap();
        assert_eq!(m.thp.enabled(), ThpMode::Madvise);
        assert_eq!(m.mem.min_free_kbytes(), 22_528);
        let m = boot(511).unwrap();
        assert_eq!(m.thp.enabled(), ThpMode::Never);
        assert!(!m.thp.use_zero_page.load(Ordering::Relaxed));
        assert_eq!(m.mem.min_free_kbytes(), 2893);
    }

    /// The host's zones, from `/proc/zoneinfo`: name, min, low, high,
    /// promo and managed pages, and the first CPU's pcp batch.
    fn host_zones() -> Vec<(String, [u64; 6])> {
        let Ok(text) = std::fs::read_to_string("/proc/zoneinfo") else {
            return vec![];
        };
        let mut zones: Vec<(String, [u64; 6])> = vec![];
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("Node ") {
                let name = rest.rsplit(' ').next().unwrap_or("").to_string();
                zones.push((name, [u64::MAX; 6]));
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
                continue;
            };
            let i = match key {
                "min" => 0,
                "low" => 1,
                "high" => 2,
                "promo" => 3,
                "managed" => 4,
                "batch:" => 5,
                _ => continue,
            };
            if let (Some(z), Ok(v)) = (zones.last_mut(), value.parse()) {
                if z.1[i] == u64::MAX {
                    z.1[i] = v;
                }
            }
        }
        zones
    }

    /// The host kernel is the oracle: its watermarks, from its own
    /// `min_free_kbytes` and `watermark_scale_factor` (which the host may
    /// have raised from the boot value), are what [`zone_watermarks`]
    /// gives for each of its low-memory zones. A boosted zone
    /// (`watermark_boost`, after a fragmenting fallback) shows every
    /// mark raised by its boost, so the steps are compared exactly and
    /// `min` from below.
    #[test]
    fn zone_watermarks_agree_with_the_host_kernel() {
        let sysctl = |name: &str| -> Option<u64> {
            std::fs::read_to_string(format!("/proc/sys/vm/{name}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let (Some(min_free_kbytes), Some(scale)) =
            (sysctl("min_free_kbytes"), sysctl("watermark_scale_factor"))
        else {
            eprintln!("no /proc/sys/vm here: nothing to compare with");
            return;
        };
        let lowmem: Vec<_> = host_zones()
            .into_iter()
            .filter(|(name, v)| ["DMA", "DMA32", "Normal"].contains(&&**name) && v[4] > 0)
            .collect();
        assert!(
            lowmem
                .iter()
                .all(|(_, v)| v[..5].iter().all(|&x| x != u64::MAX)),
            "unreadable zoneinfo: {lowmem:?}"
        );
        let lowmem_pages = lowmem.iter().map(|(_, v)| v[4]).sum();
        for (name, host) in &lowmem {
            let model = zone_watermarks(min_free_kbytes, host[4], lowmem_pages, scale);
            let steps = |w: &[u64]| [w[1] - w[0], w[2] - w[1], w[3] - w[2]];
            assert_eq!(
                steps(host),
                steps(&model),
                "zone {name}: host {host:?}, model {model:?}"
            );
            assert!(
                host[0] >= model[0],
                "zone {name}: host {host:?}, model {model:?}"
            );
        }
    }

    /// `zone_batchsize` at the sizes the docs quote, and at sizes that
    /// tell its rounding apart; `zone_highsize`'s floor of four batches.
    #[test]
    fn a_small_zone_gets_a_small_pcp_batch() {
        let pages = |mib: u64| mib << (20 - crate::phys::PAGE_SHIFT);
        let got = [16, 48, 64, 96, 170, 256, 684, 688, 4096].map(|mib| zone_batchsize(pages(mib)));
        // 48, 96 and 684 MiB tell `batch + batch / 2` from `batch`.
        assert_eq!(got, [1, 3, 3, 7, 7, 15, 31, 63, 63]);
        assert_eq!(zone_batchsize(0), 1);
        let m = mem(64);
        assert_eq!(m.nodes[0].zone.pcp_batch(), 3);
        // high_min: the low watermark split between the node's two CPUs,
        // at least four batches.
        let zone = &m.nodes[0].zone;
        assert_eq!(zone.pcp_high()[0], zone.wmark(1) / 2);
        // A GiB shared by eight CPUs: the low watermark's share (1,286 /
        // 8) is below four batches, which `high_min` is then.
        let gib = PhysMem::new(
            &[NodeConfig {
                size_bytes: 1 << 30,
                tier: Tier::Dram,
                has_cpus: true,
            }],
            &[0; 8],
        )
        .unwrap();
        let zone = &gib.nodes[0].zone;
        assert_eq!(zone.pcp_batch(), 63);
        assert!(zone.wmark(1) / 8 < 63 << 2, "{}", zone.wmark(1));
        assert_eq!(zone.pcp_high()[0], 63 << 2);
    }

    /// The host kernel is the oracle: each of its populated zones has the
    /// pcp batch [`zone_batchsize`] gives for its managed pages. The
    /// kernel sized the batch when it last set the watermarks, and the
    /// managed count may have moved a little since (memory freed after
    /// boot, a balloon), so a zone within 1% of a step may show either
    /// side's batch.
    #[test]
    fn zone_batchsize_agrees_with_the_host_kernel() {
        // SAFETY: sysconf reads a system constant; it has no
        // preconditions.
        let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page_size != crate::phys::PAGE_SIZE as i64 {
            eprintln!("host pages of {page_size} bytes: nothing to compare with");
            return;
        }
        let zones: Vec<_> = host_zones()
            .into_iter()
            .filter(|(_, v)| v[4] > 0 && v[4] != u64::MAX && v[5] != u64::MAX)
            .collect();
        if zones.is_empty() {
            eprintln!("no /proc/zoneinfo here: nothing to compare with");
            return;
        }
        for (name, host) in zones {
            let managed = host[4];
            let near =
                [managed - managed / 100, managed, managed + managed / 100].map(zone_batchsize);
            assert!(
                near.contains(&host[5]),
                "zone {name}: {host:?}, model {near:?}"
            );
        }
    }

    /// While kswapd reclaims (`ZONE_RECLAIM_ACTIVE`) a free drains the
    /// list once it holds four batches, and lowers `high` toward
    /// `high_min`, where otherwise the list holds up to `high`.
    #[test]
    fn pcp_lists_drain_early_while_kswapd_reclaims() {
        let m = mem(256);
        let zone = &m.nodes[0].zone;
        let b = zone.pcp_batch();
        let [high_min, _] = zone.pcp_high();
        assert!(high_min > b << 2);
        zone.pcp[0].lock().high = high_min * 4;
        let mut got: Vec<_> = (0..2_000)
            .map(|_| m.alloc_pages(0, 0, 0, AllocFlags::default()).unwrap())
            .collect();
        m.drain_all_pages();
        let count = || zone.pcp[0].lock().count;
        let free = |pfn: Pfn| {
            m.page(pfn).refcount.store(0, Ordering::Relaxed);
            m.free_pages(pfn, 0, 0);
        };
        zone.set_reclaim_active(true);
        for pfn in got.drain(..1_000) {
            free(pfn);
            assert!(count() < b << 2, "{} with batch {b}", count());
        }
        // And `high` came down by what was freed, to `high_min`.
        assert_eq!(zone.pcp[0].lock().high, high_min);
        zone.set_reclaim_active(false);
        let mut most = 0;
        for pfn in got.drain(..) {
            free(pfn);
            most = most.max(count());
        }
        assert!(most > b << 2, "{most}");
        m.drain_all_pages();
    }

    /// 6.18's revival of a hopeless kswapd from the free path: frees that
    /// bring a zone found below its high watermark back above it clear
    /// the node's failures while a node numbered above it has memory
    /// (`next_memory_node`); the last node stays hopeless until reclaim
    /// makes progress there.
    #[test]
    fn a_free_above_high_revives_a_hopeless_kswapd_below_the_last_node() {
        let slow = NodeConfig {
            size_bytes: 16 << 20,
            tier: Tier::Slow,
            has_cpus: false,
        };
        let fast = NodeConfig {
            tier: Tier::Dram,
            has_cpus: true,
            ..slow
        };
        let m = PhysMem::new(&[fast, slow], &[0, 0]).unwrap();
        let this_node = AllocFlags {
            this_node: true,
            ..Default::default()
        };
        for nid in 0..2 {
            let node = &m.nodes[nid];
            let mut got = vec![];
            while let Some(pfn) = m.alloc_pages(nid, 0, 0, this_node) {
                got.push(pfn);
            }
            assert!(node.zone.below_high.load(Ordering::Relaxed));
            node.kswapd_failures
                .store(super::super::MAX_RECLAIM_RETRIES, Ordering::Relaxed);
            for pfn in got {
                m.page(pfn).refcount.store(0, Ordering::Relaxed);
                m.free_pages(pfn, 0, 0);
            }
            assert!(!node.zone.below_high.load(Ordering::Relaxed));
            assert_eq!(node.kswapd_hopeless(), nid == 1, "node {nid}");
            m.drain_all_pages();
        }
    }
}
