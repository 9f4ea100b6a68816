//! Reclaim (mm/vmscan.c), on a machine without swap: what it can free is
//! clean lazyfree folios, which it discards, and what it can move is anon
//! folios on a node with a slower tier below it, which it demotes there
//! (`demote_folio_list`, when `demotion_enabled`). kswapd reclaims a node
//! in the background until its free pages are above the high watermark
//! (`balance_pgdat`); an allocation that finds every node it may use below
//! its low watermark wakes the kswapds, and reclaims itself
//! (`try_to_free_pages`) if that is not enough. Reclaim ages the lists as
//! the kernel's two-list LRU does (the host runs it, not MGLRU): an active
//! list is refilled into the inactive one when the inactive one is low,
//! and a folio at the inactive tail is kept, activated or reclaimed by its
//! references (`folio_check_references`).
//!
//! Below that, the part of `shrink_folio_list` that MADV_PAGEOUT reaches
//! for the folios of one page table:
//!
//! The kernel isolates each folio from its LRU, then `reclaim_pages` walks
//! its rmap to unmap it everywhere. MADV_PAGEOUT collects only folios that
//! this process alone maps, so that walk finds exactly the PTEs the madvise
//! walker holds under its lock: the model unmaps them there, and frees the
//! folio through the caller's mmu_gather, after the TLB flush, as
//! `try_to_unmap_flush` orders it before the free. There is no swap, so a
//! swap-backed anonymous folio cannot be paged out and stays mapped
//! (`add_to_swap` fails and reclaim keeps it).

pub(crate) mod kswapd;

use crate::machine::OnCpu;
use crate::mm::vma::VM_LOCKED;
use crate::mm::MmCounter;
use crate::mmu_gather::MmuGather;
use crate::pgtable::PteLocked;
use crate::phys::memmap::pg;
use crate::phys::{Folio, Pfn, PAGE_SIZE};
use crate::rmap;
use crate::vmstat::Event;

/// What [`shrink_lazyfree_ptes`] did with a folio.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discard {
    /// Discarded: its PTEs are clear and it is queued in the gather.
    Freed,
    /// Freed, and the gather is full: flush it before queueing more.
    FreedGatherFull,
    /// Kept: it is swap-backed, was written to since MADV_FREE, or someone
    /// else holds a reference.
    Kept,
}

/// The PTEs that map one folio, all in one locked table: `nr` from index
/// `idx` (user address `addr`), the first mapping `page`.
#[derive(Clone, Copy, Debug)]
pub struct FolioPtes {
    pub folio: Folio,
    pub page: Pfn,
    pub idx: usize,
    pub nr: usize,
    pub addr: u64,
}

/// `shrink_folio_list` + `try_to_unmap_one` for a folio mapped only by
/// `ptes` in the locked table `pt`:
/// a lazyfree folio that is still clean and that nobody else references
/// is unmapped and freed (`pglazyfreed`); one written to again becomes
/// swap-backed again (`folio_set_swapbacked`) and stays mapped.
pub fn shrink_lazyfree_ptes(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    pt: &mut PteLocked<'_>,
    ptes: FolioPtes,
) -> Discard {
    let FolioPtes {
        folio,
        page,
        idx,
        nr,
        addr,
    } = ptes;
    let mem = oncpu.mem();
    let head = folio.head(mem);
    if !folio.test_anon(mem) || head.test(pg::SWAPBACKED) {
        return Discard::Kept;
    }
    // Isolation (`folio_isolate_lru`): a folio on no list (still in a
    // CPU's batch, or taken by someone else) is left alone. The model
    // takes no isolation reference: the folio goes from here to the
    // gather's free, or back onto a list, under the page-table lock.
    if !head.test_and_clear(pg::LRU) {
        return Discard::Kept;
    }
    mem.folio_lruvec_lock(folio).del_folio(folio);
    // Clear the PTEs first and read their dirty bits from the values
    // cleared (`folio_mark_dirty` in try_to_unmap_one): once an entry is
    // clear no CPU can set its dirty bit any more, so a write that lands
    // before this is seen, and one after it faults.
    let old: Vec<_> = (idx..idx + nr).map(|i| pt.get_and_clear(i)).collect();
    // folio_mark_dirty of each dirty PTE, then folio_test_dirty.
    let dirty = old.iter().any(|p| p.dirty()) || head.test(pg::DIRTY);
    // The references are the mappings alone (the kernel counts one more,
    // its isolation reference; an LRU batch holding the folio is one
    // more, and keeps it).
    if dirty || folio.ref_count(mem) != folio.mapcount(mem) {
        for (i, p) in (idx..).zip(old) {
            pt.set(i, p);
        }
        // Written again: swap-backed once more (a folio someone else holds
        // stays lazyfree). Either way activate_locked, then back onto its
        // active list (`move_folios_to_lru`).
        if dirty {
            head.clear(pg::LAZYFREE);
            head.set(pg::SWAPBACKED);
        }
        head.set(pg::ACTIVE);
        oncpu
            .vmstat()
            .count(oncpu.id(), Event::PGACTIVATE, nr as u64);
        mem.folio_lruvec_lock(folio).add_folio(folio);
        head.set(pg::LRU);
        return Discard::Kept;
    }
    tlb.remove_tlb_entries(addr, nr as u64);
    tlb.mm.add_rss(MmCounter::AnonPages, -(nr as i64));
    rmap::folio_remove_rmap_ptes(mem, folio, page, nr as u64, tlb.mm.id, oncpu.id());
    oncpu
        .vmstat()
        .count(oncpu.id(), Event::PGLAZYFREED, nr as u64);
    debug_assert_eq!(addr % PAGE_SIZE, 0);
    if tlb.remove_folio_pages(page, nr as u64, false) {
        Discard::FreedGatherFull
    } else {
        Discard::Freed
    }
}

/// `shrink_folio_list` + `try_to_unmap_one` for a page-cache folio mapped
/// only by `ptes` in the locked table `pt`, as MADV_PAGEOUT reclaims it
/// (references ignored): its PTEs go, their dirty bits to the folio. A
/// clean folio that nobody else holds then leaves the page cache
/// (`__remove_mapping`) and is freed after the flush; a dirty one stays
/// cached, unmapped, since only kswapd writes file folios back (the
/// kernel also activates it; the model leaves it on its list), and so
/// does one held elsewhere.
pub fn shrink_file_ptes(
    oncpu: &OnCpu,
    tlb: &mut MmuGather,
    pt: &mut PteLocked<'_>,
    ptes: FolioPtes,
) -> Discard {
    let FolioPtes {
        folio,
        page,
        idx,
        nr,
        addr,
    } = ptes;
    let mem = oncpu.mem();
    let head = folio.head(mem);
    debug_assert!(!folio.test_anon(mem));
    if !folio.trylock(mem) {
        return Discard::Kept;
    }
    let mut dirty = false;
    for i in idx..idx + nr {
        dirty |= pt.get_and_clear(i).dirty();
    }
    if dirty {
        crate::filemap::folio_mark_dirty(mem, folio);
    }
    tlb.remove_tlb_entries(addr, nr as u64);
    tlb.mm
        .add_rss(crate::mm::mm_counter_file(mem, folio), -(nr as i64));
    rmap::folio_remove_rmap_ptes(mem, folio, page, nr as u64, tlb.mm.id, oncpu.id());
    // A dirty one is left for writeback, marked `PG_reclaim` (the bit of
    // `PG_readahead`, which fault-around therefore skips, and whose next
    // fault starts readahead, as in the kernel).
    // (shmem's, always dirty, fails its writeout for want of swap and is
    // activated without it.)
    if head.test(pg::DIRTY) && !head.test(pg::SWAPBACKED) {
        head.set(pg::READAHEAD);
    }
    // The gather holds the PTEs' references until the flush.
    let removed = !head.test(pg::DIRTY) && remove_mapping(oncpu, folio, nr as i32);
    folio.unlock(mem);
    if removed {
        folio.put(mem, oncpu.id());
    }
    if tlb.remove_folio_pages(page, nr as u64, false) {
        Discard::FreedGatherFull
    } else {
        Discard::Freed
    }
}

/// `__remove_mapping` of a locked, unmapped page-cache folio: if nothing
/// but the cache and `held` references of the caller's (and no LRU batch)
/// holds it, take it off its LRU list and out of the page cache. True:
/// removed, with one more reference for the caller, to put once it has
/// unlocked the folio (the kernel frees it after `folio_unlock` too);
/// its other references then free it. False: kept.
pub fn remove_mapping(oncpu: &OnCpu, folio: Folio, held: i32) -> bool {
    let mem = oncpu.mem();
    let head = folio.head(mem);
    let nr = folio.nr_pages(mem) as i32;
    if folio.mapped(mem) || folio.ref_count(mem) != nr + held {
        return false;
    }
    // SAFETY: the folio is locked and still cached (its mapping word is
    // checked below), so its address space is alive: eviction takes each
    // folio's lock before it lets the inode go.
    let Some(mapping) = (unsafe { crate::fs::address_space::folio_mapping(mem, folio) }) else {
        return false;
    };
    let index = head.index.load(crate::sync::Ordering::Relaxed);
    if mapping.lookup(mem, index).map(|c| c.folio) != Some(folio) {
        return false;
    }
    if head.test_and_clear(pg::LRU) {
        mem.folio_lruvec_lock(folio).del_folio(folio);
    }
    folio.get(mem);
    mapping.remove_folio(mem, crate::fs::CachedFolio { folio, index }, oncpu.id());
    true
}

// ---------------------------------------------------------------------------
// Reclaim of a node: kswapd and direct reclaim.

use crate::pgtable::PteRead;
use crate::phys::mm_inline::LruList;
use crate::phys::page_alloc::{WMARK_HIGH, WMARK_LOW};
use crate::phys::Tier;
use crate::rmap_walk::{page_vma_mapped_walk, rmap_walk_anon, AtPmd, PteRun};
use crate::tlbbatch::{TlbflushUnmapBatch, Ttu, TtuFlags};

/// `DEF_PRIORITY`: a pass scans a list's size shifted right by the
/// priority, from this down to 0.
const DEF_PRIORITY: u32 = 12;
/// `SWAP_CLUSTER_MAX`: folios isolated at a time.
const SWAP_CLUSTER_MAX: u64 = 32;
/// `struct scan_control`.
pub struct ScanControl {
    /// Pages wanted.
    pub nr_to_reclaim: u64,
    pub priority: u32,
    /// kswapd (or direct reclaim): which counters count.
    pub kswapd: bool,
    pub nr_scanned: u64,
    pub nr_reclaimed: u64,
    pub nr_demoted: u64,
}

impl ScanControl {
    pub fn new(nr_to_reclaim: u64, kswapd: bool) -> ScanControl {
        ScanControl {
            nr_to_reclaim,
            priority: DEF_PRIORITY,
            kswapd,
            nr_scanned: 0,
            nr_reclaimed: 0,
            nr_demoted: 0,
        }
    }

    fn count(&self, oncpu: &OnCpu, kswapd: Event, direct: Event, n: u64) {
        let e = if self.kswapd { kswapd } else { direct };
        oncpu.vmstat().count(oncpu.id(), e, n);
    }
}

/// `next_demotion_node`: the node a folio of `nid` is demoted to: the
/// first node of a slower tier, if demotion is enabled.
pub fn next_demotion_node(oncpu: &OnCpu, nid: usize) -> Option<usize> {
    let mem = oncpu.mem();
    if !oncpu.m.demotion_enabled() || mem.nodes[nid].tier == Tier::Slow {
        return None;
    }
    mem.nodes
        .iter()
        .find(|n| n.tier == Tier::Slow)
        .map(|n| n.id)
}

/// `can_reclaim_anon_pages`: with no swap, only if they can be demoted.
fn can_reclaim_anon(oncpu: &OnCpu, nid: usize) -> bool {
    next_demotion_node(oncpu, nid).is_some()
}

/// `pgdat_balanced`: the node's free pages are above its high watermark,
/// or in NUMA balancing's tiering mode above the promotion watermark (one
/// step higher: room for promotions, `WMARK_PROMO`).
pub fn pgdat_balanced(oncpu: &OnCpu, nid: usize) -> bool {
    pgdat_balanced_on(oncpu.m, nid)
}

/// [`pgdat_balanced`] for a machine.
pub fn pgdat_balanced_on(m: &crate::machine::Machine, nid: usize) -> bool {
    let z = &m.mem.nodes[nid].zone;
    if !m.numa.tiering() {
        return z.above(WMARK_HIGH);
    }
    z.nr_free_for_watermark() > z.promo_wmark_pages()
}

/// `zone_watermark_ok` against the low watermark: does the node need
/// kswapd?
pub fn pgdat_below_low(oncpu: &OnCpu, nid: usize) -> bool {
    !oncpu.mem().nodes[nid].zone.above(WMARK_LOW)
}

/// `balance_pgdat`: kswapd's run on node `nid`, from the lowest priority
/// (`DEF_PRIORITY`) down to 1, until the node is balanced; returns the
/// pages reclaimed, or None if a pass found the node balanced before
/// kswapd had reclaimed anything (at once, or by others' frees meanwhile:
/// not a failure, as the kernel's `goto out` skips `kswapd_failures`).
/// A pass that scanned less than its target ([`kswapd_shrink_node`]), or
/// reclaimed nothing, raises the priority: on a small node the first
/// passes scan a page or two (a list's size shifted by 12), and kswapd
/// reaches within a few passes the priority at which one pass scans the
/// high watermark's worth, in batches of `SWAP_CLUSTER_MAX`, each with its
/// one TLB flush. While it runs the zone is marked `ZONE_RECLAIM_ACTIVE`,
/// so that the CPUs' frees meanwhile drain their pcp lists once they hold
/// four batches. Its own LRU batch is drained at the end (the demoted
/// folios' way onto their lists). Not modelled: watermark boosting.
pub fn balance_pgdat(oncpu: &OnCpu, nid: usize) -> Option<u64> {
    // Counted for every run, balanced already or not.
    oncpu.vmstat().count(oncpu.id(), Event::PAGEOUTRUN, 1);
    let _memalloc = crate::phys::page_alloc::ReclaimGuard::enter();
    let _active = ReclaimActive::set(&oncpu.mem().nodes[nid].zone);
    let mut sc = ScanControl::new(0, true);
    let mut balanced = false;
    while sc.priority >= 1 {
        if pgdat_balanced(oncpu, nid) {
            balanced = true;
            break;
        }
        let before = sc.nr_reclaimed;
        // kswapd_age_node
        age_active_anon(oncpu, nid, &mut sc);
        sc.nr_scanned = 0;
        let raise_priority = !kswapd_shrink_node(oncpu, nid, &mut sc);
        if raise_priority || sc.nr_reclaimed == before {
            sc.priority -= 1;
        }
    }
    crate::swap::lru_add_drain(oncpu.mem(), oncpu.id());
    if sc.nr_reclaimed == 0 && balanced {
        return None;
    }
    Some(sc.nr_reclaimed)
}

/// `set_reclaim_active` .. `clear_reclaim_active`: the zone is marked
/// while the guard lives (one kswapd per node sets it, so no count is
/// needed).
struct ReclaimActive<'a>(&'a crate::phys::page_alloc::Zone);

impl<'a> ReclaimActive<'a> {
    fn set(zone: &'a crate::phys::page_alloc::Zone) -> Self {
        zone.set_reclaim_active(true);
        ReclaimActive(zone)
    }
}

impl Drop for ReclaimActive<'_> {
    fn drop(&mut self) {
        self.0.set_reclaim_active(false);
    }
}

/// `kswapd_shrink_node`: one pass of kswapd over the node, aiming at the
/// high watermark's worth of pages (at least `SWAP_CLUSTER_MAX`); whether
/// it scanned (or reclaimed) that many, so that the priority may stay.
fn kswapd_shrink_node(oncpu: &OnCpu, nid: usize, sc: &mut ScanControl) -> bool {
    let before = sc.nr_reclaimed;
    let high = oncpu.mem().nodes[nid].zone.wmark(2);
    sc.nr_to_reclaim = high.max(SWAP_CLUSTER_MAX);
    shrink_node(oncpu, nid, sc);
    sc.nr_scanned.max(sc.nr_reclaimed - before) >= sc.nr_to_reclaim
}

/// `try_to_free_pages`: direct reclaim by an allocation short of memory on
/// node `nid`: priorities from the lowest up, until it has reclaimed a
/// cluster of pages. Not modelled: the kernel's second try, when nothing
/// was reclaimed and active lists were passed over, with their
/// deactivation forced (`force_deactivate`).
pub fn try_to_free_pages(oncpu: &OnCpu, nid: usize, order: u32) -> u64 {
    let mut sc = ScanControl::new(SWAP_CLUSTER_MAX.max(1 << order), false);
    oncpu.vmstat().count(oncpu.id(), Event::ALLOCSTALL, 1);
    loop {
        shrink_node(oncpu, nid, &mut sc);
        if sc.nr_reclaimed >= sc.nr_to_reclaim || sc.priority == 0 {
            return sc.nr_reclaimed;
        }
        sc.priority -= 1;
    }
}

/// `shrink_node` / `shrink_lruvec` / `get_scan_count`: scan each
/// evictable list by its size shifted by the priority, a cluster of each
/// in turn, until they are scanned or this call has reclaimed
/// `nr_to_reclaim` (kswapd and direct reclaim below the lowest priority
/// stop there: the kernel then scans the type with more left on, in
/// proportion, and the model stops). An active list's turns deactivate
/// its folios only if its inactive list was low when the call began
/// (`prepare_scan_control`'s `may_deactivate`; they pass otherwise), and
/// the active anon list's turns alone do not keep the loop going. The
/// anon lists are scanned only if their folios can be demoted (there is
/// no swap); the file lists hold the lazyfree folios. Not modelled:
/// `get_scan_count`'s balance of anon against file (swappiness, the
/// costs, `cache_trim_mode`, `file_is_tiny`): both are scanned in full.
pub fn shrink_node(oncpu: &OnCpu, nid: usize, sc: &mut ScanControl) {
    use LruList::{ActiveAnon, ActiveFile, InactiveAnon, InactiveFile};
    let mem = oncpu.mem();
    // shrink_lruvec's target is of this call's reclaim, not the caller's
    // total; direct reclaim at the lowest priority scans its lists whole
    // (`proportional_reclaim`).
    let start = sc.nr_reclaimed;
    let proportional = !sc.kswapd && sc.priority == DEF_PRIORITY;
    let anon = can_reclaim_anon(oncpu, nid);
    let sizes = {
        let l = mem.node_lruvec_lock(nid);
        LruList::ALL.map(|lru| l.size(lru))
    };
    let size = |lru: LruList| sizes[lru as usize];
    let scan = |lru: LruList, on: bool| if on { size(lru) >> sc.priority } else { 0 };
    let deactivate_anon = inactive_is_low(size(InactiveAnon), size(ActiveAnon));
    let deactivate_file = inactive_is_low(size(InactiveFile), size(ActiveFile));
    let may_deactivate = |lru: LruList| match lru {
        ActiveAnon => deactivate_anon,
        _ => deactivate_file,
    };
    // In the kernel's order of the lists.
    let mut nr = [
        (InactiveAnon, scan(InactiveAnon, anon)),
        (ActiveAnon, scan(ActiveAnon, anon)),
        (InactiveFile, scan(InactiveFile, true)),
        (ActiveFile, scan(ActiveFile, true)),
    ];
    while nr.iter().any(|&(lru, n)| n > 0 && lru != ActiveAnon) {
        for (lru, n) in nr.iter_mut() {
            if *n == 0 {
                continue;
            }
            let chunk = (*n).min(SWAP_CLUSTER_MAX);
            *n -= chunk;
            if !lru.is_active() {
                shrink_inactive_list(oncpu, nid, *lru, chunk, sc);
            } else if may_deactivate(*lru) {
                shrink_active_list(oncpu, nid, *lru, chunk, sc);
            }
        }
        // kswapd shares the CPU it runs on (direct reclaim runs on its
        // own CPU's thread, for which this is nothing).
        oncpu.cond_resched();
        if sc.nr_reclaimed - start >= sc.nr_to_reclaim && !proportional {
            break;
        }
    }
    // Whether or not anon was scanned, its lists are kept in proportion.
    age_active_anon(oncpu, nid, sc);
}

/// `kswapd_age_node`, and the end of `shrink_lruvec`: a cluster of the
/// active anon list deactivated if the inactive one is low (and its
/// folios can be demoted at all); kswapd does it before each pass too.
fn age_active_anon(oncpu: &OnCpu, nid: usize, sc: &mut ScanControl) {
    if !can_reclaim_anon(oncpu, nid) {
        return;
    }
    let (inactive, active) = {
        let l = oncpu.mem().node_lruvec_lock(nid);
        (l.size(LruList::InactiveAnon), l.size(LruList::ActiveAnon))
    };
    if inactive_is_low(inactive, active) {
        shrink_active_list(oncpu, nid, LruList::ActiveAnon, SWAP_CLUSTER_MAX, sc);
    }
}

/// `inactive_is_low`: the inactive list is smaller than the active one
/// over the ratio `int_sqrt(10 * GiB)` of the two (1 below a GiB).
fn inactive_is_low(inactive: u64, active: u64) -> bool {
    let gb = (inactive + active) >> (30 - crate::phys::PAGE_SHIFT);
    let ratio = if gb > 0 {
        ((10 * gb) as f64).sqrt() as u64
    } else {
        1
    };
    inactive * ratio < active
}

/// `shrink_active_list`: take folios off the active list's tail, clear
/// their references, and move them to the inactive list's head
/// (`pgrefill`, `pgdeactivate`). The kernel keeps referenced executable
/// file folios active; the model has none.
fn shrink_active_list(oncpu: &OnCpu, nid: usize, lru: LruList, nr: u64, sc: &mut ScanControl) {
    let mem = oncpu.mem();
    crate::swap::lru_add_drain(mem, oncpu.id());
    let (taken, scanned) = mem
        .node_lruvec_lock(nid)
        .isolate_lru_folios(lru, nr, oncpu.id());
    let (item, isolated) = isolated_pages(mem, lru, &taken);
    mem.mod_node_state(item, isolated as i64);
    oncpu.vmstat().count(oncpu.id(), Event::PGREFILL, scanned);
    let mut deactivated = 0;
    for &f in &taken {
        // An mlocked folio goes back as it is, to the unevictable list.
        if !crate::phys::mm_inline::folio_evictable(mem, f) {
            continue;
        }
        folio_referenced(oncpu, f);
        f.head(mem).clear(pg::ACTIVE);
        // Mlocked by the walk (a locked VMA maps it whole): not counted.
        if crate::phys::mm_inline::folio_evictable(mem, f) {
            deactivated += f.nr_pages(mem);
        }
    }
    oncpu
        .vmstat()
        .count(oncpu.id(), Event::PGDEACTIVATE, deactivated);
    mem.mod_node_state(item, -(isolated as i64));
    move_folios_to_lru(oncpu, taken);
    let _ = sc;
}

/// The `nr_isolated_*` item of folios isolated from `lru`, and their pages.
fn isolated_pages(
    mem: &crate::phys::PhysMem,
    lru: LruList,
    taken: &[Folio],
) -> (crate::vmstat::NodeStat, u64) {
    let item = match lru {
        LruList::InactiveAnon | LruList::ActiveAnon => crate::vmstat::NodeStat::NR_ISOLATED_ANON,
        _ => crate::vmstat::NodeStat::NR_ISOLATED_FILE,
    };
    (item, taken.iter().map(|f| f.nr_pages(mem)).sum())
}

/// `move_folios_to_lru`: isolated folios back onto the lists their flags
/// say, and the isolation's references dropped.
fn move_folios_to_lru(oncpu: &OnCpu, folios: Vec<Folio>) {
    let mem = oncpu.mem();
    let mut held = None;
    for &f in &folios {
        let l = mem.folio_lruvec_relock(&mut held, f);
        crate::swap::lru_add(mem, oncpu.id(), l, f);
        f.head(mem).set(pg::LRU);
    }
    drop(held);
    crate::swap::folios_put_refs(mem, folios.into_iter().map(|f| (f, 1)), oncpu.id());
}

/// `shrink_inactive_list`: isolate a cluster from the list's tail and
/// reclaim what can be (`pgscan_*`, `pgsteal_*`).
fn shrink_inactive_list(oncpu: &OnCpu, nid: usize, lru: LruList, nr: u64, sc: &mut ScanControl) {
    let mem = oncpu.mem();
    crate::swap::lru_add_drain(mem, oncpu.id());
    let (taken, scanned) = mem
        .node_lruvec_lock(nid)
        .isolate_lru_folios(lru, nr, oncpu.id());
    sc.nr_scanned += scanned;
    sc.count(oncpu, Event::PGSCAN_KSWAPD, Event::PGSCAN_DIRECT, scanned);
    let anon = lru == LruList::InactiveAnon;
    oncpu.vmstat().count(
        oncpu.id(),
        if anon {
            Event::PGSCAN_ANON
        } else {
            Event::PGSCAN_FILE
        },
        scanned,
    );
    let (item, isolated) = isolated_pages(mem, lru, &taken);
    mem.mod_node_state(item, isolated as i64);
    let (reclaimed, keep) = shrink_folio_list(oncpu, nid, taken, sc);
    mem.mod_node_state(item, -(isolated as i64));
    move_folios_to_lru(oncpu, keep);
    sc.nr_reclaimed += reclaimed;
    sc.count(
        oncpu,
        Event::PGSTEAL_KSWAPD,
        Event::PGSTEAL_DIRECT,
        reclaimed,
    );
    oncpu.vmstat().count(
        oncpu.id(),
        if anon {
            Event::PGSTEAL_ANON
        } else {
            Event::PGSTEAL_FILE
        },
        reclaimed,
    );
}

/// What `folio_check_references` decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FolioReferences {
    Activate,
    Keep,
    Reclaim,
}

/// `folio_check_references`: a folio referenced through its PTEs since
/// reclaim last looked is kept for another trip (marked referenced), and
/// activated if it was referenced before too, or through several PTEs.
fn folio_check_references(oncpu: &OnCpu, folio: Folio) -> FolioReferences {
    let head = folio.head(oncpu.mem());
    // The caller holds the folio's lock.
    let (referenced_ptes, locked) = folio_referenced_locked(oncpu, folio, true);
    // Found in a locked VMA, and mlocked now: off to the unevictable list
    // (PG_referenced left as it is).
    if locked {
        return FolioReferences::Activate;
    }
    let referenced_folio = head.test_and_clear(pg::REFERENCED);
    if referenced_ptes > 0 {
        head.set(pg::REFERENCED);
        if referenced_folio || referenced_ptes > 1 {
            return FolioReferences::Activate;
        }
        return FolioReferences::Keep;
    }
    FolioReferences::Reclaim
}

/// `folio_referenced`: how many PTEs map the folio young, clearing each
/// one's accessed bit as it is counted (x86 does not flush for that: a
/// CPU that keeps the translation cached is not seen using it, as on
/// hardware).
pub fn folio_referenced(oncpu: &OnCpu, folio: Folio) -> u64 {
    folio_referenced_locked(oncpu, folio, false).0
}

/// [`folio_referenced`], the folio locked by the caller or not. A
/// page-cache folio's rmap walk needs its lock (which keeps its address
/// space alive): taken if the caller does not hold it, and a folio whose
/// lock is taken counts as referenced, as the kernel counts it. Also
/// returns whether a locked VMA maps the whole folio, which is mlocked
/// then (the walk stops there, `pra->vm_flags` gaining `VM_LOCKED`).
fn folio_referenced_locked(oncpu: &OnCpu, folio: Folio, locked: bool) -> (u64, bool) {
    let mem = oncpu.mem();
    let mut referenced = 0;
    let mut mlocked = false;
    let mut one = |mm: &crate::sync::Arc<crate::mm::Mm>, vma: &crate::mm::Vma| {
        if vma.flags() & VM_LOCKED != 0 {
            // Its entries are not looked at for young bits.
            mlocked = mlock_if_mapped_whole(oncpu, mm, vma, folio);
            return !mlocked;
        }
        referenced += referenced_one(oncpu, mm, vma, folio) as u64;
        true
    };
    if !folio.test_anon(mem) {
        if !folio.mapped(mem) {
            return (0, false);
        }
        if !locked && !folio.trylock(mem) {
            return (1, false);
        }
        // SAFETY: the folio is locked: if still cached, its address space
        // lives (eviction takes each folio's lock first).
        if let Some(mapping) = unsafe { crate::fs::address_space::folio_mapping(mem, folio) } {
            let index = folio.head(mem).index.load(crate::sync::Ordering::Relaxed);
            crate::rmap_walk::rmap_walk_file(oncpu, mapping, folio, index, &mut one);
        }
        if !locked {
            folio.unlock(mem);
        }
        return (referenced, mlocked);
    }
    let Some(anon_vma) = crate::rmap::folio_get_anon_vma(mem, folio) else {
        return (0, false);
    };
    // One per VMA in which some entry was young (`folio_referenced_one`
    // counts a VMA once, however many of its PTEs map the folio).
    rmap_walk_anon(oncpu, folio, &anon_vma, &mut one);
    (referenced, mlocked)
}

/// `folio_referenced_one` in a locked VMA: "restore the mlock which got
/// missed" if the VMA maps the whole folio (by a PMD, or by a PTE for
/// each page); returns whether it did.
fn mlock_if_mapped_whole(
    oncpu: &OnCpu,
    mm: &crate::sync::Arc<crate::mm::Mm>,
    vma: &crate::mm::Vma,
    folio: Folio,
) -> bool {
    let mem = oncpu.mem();
    let by_pmd = std::cell::Cell::new(false);
    let mut ptes = 0;
    let at_pmd = |slot, _run: PteRun| {
        if !mm.pmd_get(slot).trans_huge() {
            return AtPmd::Ptes;
        }
        let pmd = mm.pmd_lock(slot).get();
        if pmd.trans_huge() && pmd.pfn() == folio.pfn() {
            by_pmd.set(true);
        }
        AtPmd::Done
    };
    page_vma_mapped_walk(mem, mm, vma, folio, at_pmd, |pt, i, addr| {
        let pte = pt.pte(crate::pgtable::pte_index(addr));
        if pte.present() && !pte.special() && pte.pfn() == folio.pfn() + i {
            ptes += 1;
        }
        true
    });
    let whole = by_pmd.get() || ptes == folio.nr_pages(mem);
    if whole {
        crate::mlock::mlock_vma_folio(mem, folio, vma.flags(), oncpu.id());
    }
    whole
}

/// `folio_referenced_one`: whether some entry of `vma` mapping the folio
/// was young, clearing each one's accessed bit.
fn referenced_one(
    oncpu: &OnCpu,
    mm: &crate::sync::Arc<crate::mm::Mm>,
    vma: &crate::mm::Vma,
    folio: Folio,
) -> bool {
    use crate::pgtable::entry::_PAGE_ACCESSED;
    let mem = oncpu.mem();
    let young = std::cell::Cell::new(false);
    let at_pmd = |slot, run: PteRun| {
        if !mm.pmd_get(slot).trans_huge() {
            return AtPmd::Ptes;
        }
        let mut ptl = mm.pmd_lock(slot);
        let pmd = ptl.get();
        // pmdp_clear_flush_young: x86 flushes a PMD's.
        if pmd.trans_huge() && pmd.pfn() == folio.pfn() && run.i == 0 && ptl.test_and_clear_young()
        {
            young.set(true);
            drop(ptl);
            oncpu.flush_tlb_range(
                mm,
                run.addr,
                run.addr + crate::pgtable::PMD_SIZE,
                crate::pgtable::PMD_SHIFT,
            );
        }
        AtPmd::Done
    };
    page_vma_mapped_walk(mem, mm, vma, folio, at_pmd, |pt, i, addr| {
        let idx = crate::pgtable::pte_index(addr);
        let pte = pt.pte(idx);
        if pte.present()
            && !pte.special()
            && pte.pfn() == folio.pfn() + i
            && pt.clear_bits(idx, _PAGE_ACCESSED).young()
        {
            young.set(true);
        }
        true
    });
    young.get()
}

/// `shrink_folio_list`: for each isolated folio, keep, activate or
/// reclaim it. Reclaim first demotes anon folios a slower tier can take,
/// lazyfree ones included (`do_demote_pass`); those not demoted go through
/// the list again without demotion (`goto retry`): a clean lazyfree folio
/// is discarded (its flushes batched, `TTU_BATCH_FLUSH`), any other is
/// activated (there is no swap). Returns the pages reclaimed and the
/// folios to put back.
fn shrink_folio_list(
    oncpu: &OnCpu,
    nid: usize,
    folios: Vec<Folio>,
    sc: &mut ScanControl,
) -> (u64, Vec<Folio>) {
    let mem = oncpu.mem();
    let mut list = ShrinkList {
        kswapd: sc.kswapd,
        ..ShrinkList::default()
    };
    list.ubc
        .set_ro_uncounted(oncpu.mem().migrc.weakened() == crate::migrc::Weakened::LufNoMmFlush);
    let demotion_target = next_demotion_node(oncpu, nid);
    for folio in folios {
        shrink_one(oncpu, folio, demotion_target.is_some(), &mut list);
    }
    if let (Some(target), false) = (demotion_target, list.demote.is_empty()) {
        let (demoted, failed) = demote_folio_list(oncpu, target, std::mem::take(&mut list.demote));
        sc.nr_demoted += demoted;
        list.reclaimed += demoted;
        sc.count(
            oncpu,
            Event::PGDEMOTE_KSWAPD,
            Event::PGDEMOTE_DIRECT,
            demoted,
        );
        // The retry pass, without demotion.
        for f in failed {
            shrink_one(oncpu, f, false, &mut list);
        }
    }
    // LUF: the discarded folios that only clean read-only PTEs mapped
    // owe their flush from their free pages on.
    luf_defer_discards(oncpu, &mut list);
    // The discarded folios' PTEs are cleared; their TLB entries must go
    // before the pages do.
    list.ubc.flush(oncpu);
    for folio in std::mem::take(&mut list.discard) {
        let nr = folio.nr_pages(mem);
        folio.unlock(mem);
        oncpu.vmstat().count(oncpu.id(), Event::PGLAZYFREED, nr);
        list.reclaimed += nr;
        // The isolation's reference is the last.
        folio.put(mem, oncpu.id());
    }
    for folio in std::mem::take(&mut list.freed_file) {
        folio.unlock(mem);
        list.reclaimed += folio.nr_pages(mem);
        // `remove_mapping`'s reference, then the isolation's, the last.
        folio.put(mem, oncpu.id());
        folio.put(mem, oncpu.id());
    }
    oncpu
        .vmstat()
        .count(oncpu.id(), Event::PGACTIVATE, list.activated);
    (list.reclaimed, list.keep)
}

/// LUF in reclaim: a generation for the deferred flushes of the discarded
/// folios (drawn now that their PTEs are clear), recorded in the address
/// spaces they left and stamped on their pages, which are then freed with
/// the rest.
fn luf_defer_discards(oncpu: &OnCpu, list: &mut ShrinkList) {
    if list.luf.is_empty() {
        return;
    }
    let batch = crate::migrc::luf_owe(oncpu, list.luf_cpumask, &list.luf_mms);
    list.luf_mms.clear();
    for folio in list.luf.drain(..) {
        crate::migrc::luf_free_owed(oncpu, folio, batch);
    }
    list.luf_cpumask = 0;
}

/// Where [`shrink_folio_list`] sends its folios.
#[derive(Default)]
struct ShrinkList {
    keep: Vec<Folio>,
    demote: Vec<Folio>,
    /// Unmapped lazyfree folios, locked, freed once the flush is done.
    discard: Vec<Folio>,
    /// Page-cache folios out of the cache, locked, with one reference
    /// more than the isolation's, freed once the flush is done.
    freed_file: Vec<Folio>,
    /// kswapd's reclaim, which writes dirty file folios back.
    kswapd: bool,
    ubc: TlbflushUnmapBatch,
    /// LUF: the discarded folios whose flush is deferred, the CPUs that
    /// may cache them, and the address spaces they were mapped in.
    luf: Vec<Folio>,
    luf_cpumask: u64,
    luf_mms: Vec<crate::sync::Arc<crate::mm::Mm>>,
    activated: u64,
    reclaimed: u64,
}

/// One folio's step of [`shrink_folio_list`].
fn shrink_one(oncpu: &OnCpu, folio: Folio, demote: bool, list: &mut ShrinkList) {
    let mem = oncpu.mem();
    if !folio.trylock(mem) {
        list.keep.push(folio);
        return;
    }
    let head = folio.head(mem);
    // `if (unlikely(!folio_evictable(folio))) goto activate_locked`: an
    // mlocked folio (its move to the unevictable list still in a batch)
    // is put back without a look at its references.
    let refs = if crate::phys::mm_inline::folio_evictable(mem, folio) {
        folio_check_references(oncpu, folio)
    } else {
        FolioReferences::Activate
    };
    let anon = folio.test_anon(mem);
    let fate = match refs {
        FolioReferences::Reclaim if anon && demote => {
            folio.unlock(mem);
            list.demote.push(folio);
            return;
        }
        FolioReferences::Reclaim if anon && !head.test(pg::SWAPBACKED) => {
            // LUF (v10 on): an order-0 folio whose PTEs were all clean and
            // read-only may defer their flush.
            let luf = oncpu.m.tunables.luf() && folio.order(mem) == 0;
            list.ubc.can_migrc_init(luf);
            let unmapped = try_to_unmap_lazyfree(oncpu, folio, &mut list.ubc);
            if unmapped && list.ubc.can_migrc() {
                let (cpus, mms) = list.ubc.take_ro_mms();
                list.luf_cpumask |= cpus;
                list.luf_mms.extend(mms);
                list.luf.push(folio);
            }
            list.ubc.can_migrc_init(false);
            if unmapped {
                list.discard.push(folio);
                return;
            }
            // Written again, or held elsewhere: back, active.
            FolioReferences::Activate
        }
        // A page-cache folio (shmem's excepted, which would need swap).
        FolioReferences::Reclaim if !anon && !head.test(pg::SWAPBACKED) => {
            match reclaim_file_folio(oncpu, folio, list) {
                Some(fate) => fate,
                // Out of the cache: freed after the flush.
                None => return,
            }
        }
        // A swap-backed folio with nowhere to go (no swap).
        FolioReferences::Reclaim => FolioReferences::Activate,
        other => other,
    };
    // activate_locked: not a folio that is mlocked (now).
    if fate == FolioReferences::Activate && !head.test(pg::MLOCKED) {
        head.set(pg::ACTIVE);
        list.activated += folio.nr_pages(mem);
    }
    folio.unlock(mem);
    list.keep.push(folio);
}

/// `shrink_folio_list`'s steps for a locked page-cache folio to reclaim:
/// unmap it everywhere (`try_to_unmap`), then a clean one leaves the
/// page cache (`__remove_mapping`) and is queued to be freed after the
/// flush (None); a dirty one is written back if kswapd reclaims (the
/// model's write completes at once; the kernel's folio under writeback
/// waits for a later pass, as the model's, clean now, does too), or is
/// left for the flusher, marked `PG_reclaim`, and activated. The kernel
/// also remembers a reclaimed folio's eviction in its slot (a shadow
/// entry, for `workingset_refault_file`), which the model does not.
fn reclaim_file_folio(
    oncpu: &OnCpu,
    folio: Folio,
    list: &mut ShrinkList,
) -> Option<FolioReferences> {
    let mem = oncpu.mem();
    let head = folio.head(mem);
    // SAFETY: the folio is locked: if still cached, its address space
    // lives (eviction takes each folio's lock first).
    let Some(mapping) = (unsafe { crate::fs::address_space::folio_mapping(mem, folio) }) else {
        // Truncated meanwhile: its last references free it.
        return Some(FolioReferences::Keep);
    };
    let index = head.index.load(crate::sync::Ordering::Relaxed);
    if folio.mapped(mem) && !try_to_unmap_file(oncpu, folio, mapping, index, false, &mut list.ubc) {
        return Some(FolioReferences::Activate);
    }
    if head.test(pg::DIRTY) {
        if !list.kswapd {
            head.set(pg::READAHEAD);
            return Some(FolioReferences::Activate);
        }
        // pageout(): no CPU may write the folio through a stale entry
        // while it is written (`try_to_unmap_flush_dirty`).
        list.ubc.flush(oncpu);
        if let Some(inode) = mapping.host() {
            let c = crate::fs::CachedFolio { folio, index };
            crate::filemap::folio_writeback(oncpu, &inode, c);
        }
        return Some(FolioReferences::Keep);
    }
    if crate::vmscan::remove_mapping(oncpu, folio, 1) {
        list.freed_file.push(folio);
        return None;
    }
    Some(FolioReferences::Keep)
}

/// `try_to_unmap` of a locked page-cache folio, cached at `index` of
/// `mapping`: every PTE that maps it is cleared (its dirty bit to the
/// folio; its flush batched on `ubc`), a PMD that maps it zapped
/// (`TTU_SPLIT_HUGE_PMD` on a file PMD). A locked VMA keeps its mapping
/// unless `ignore_mlock` (`TTU_IGNORE_MLOCK`, as a split unmaps), when
/// the folio is munlocked there. True if no mapping is left.
pub fn try_to_unmap_file(
    oncpu: &OnCpu,
    folio: Folio,
    mapping: &crate::fs::AddressSpace,
    index: u64,
    ignore_mlock: bool,
    ubc: &mut TlbflushUnmapBatch,
) -> bool {
    let mem = oncpu.mem();
    let flags = TtuFlags {
        batch_flush: true,
        split_huge_pmd: true,
    };
    crate::rmap_walk::rmap_walk_file(oncpu, mapping, folio, index, |mm, vma| {
        // try_to_unmap_one: a locked VMA's pages stay (the mlock of a
        // folio it maps whole was restored by folio_referenced).
        let locked = vma.flags() & VM_LOCKED != 0;
        if locked && !ignore_mlock {
            return false;
        }
        let at_pmd = |slot, run: PteRun| {
            let pmd = mm.pmd_get(slot);
            if pmd.trans_huge() && pmd.pfn() == folio.pfn() {
                crate::huge_memory::split_huge_pmd(oncpu, mm, slot, run.addr);
                return AtPmd::Done;
            }
            AtPmd::Ptes
        };
        let mut ttu = Ttu {
            flags,
            ubc: &mut *ubc,
        };
        page_vma_mapped_walk(mem, mm, vma, folio, at_pmd, |pt, i, addr| {
            if unmap_file_pte(oncpu, mm, pt, folio, (i, addr), &mut ttu) {
                crate::mlock::munlock_vma_folio(mem, folio, vma.flags(), oncpu.id());
            }
            true
        });
        true
    });
    !folio.mapped(mem)
}

/// One PTE of [`try_to_unmap_file`], in the locked table `pt`: cleared if
/// it maps page `i` of the folio (then true).
fn unmap_file_pte(
    oncpu: &OnCpu,
    mm: &crate::sync::Arc<crate::mm::Mm>,
    pt: &mut PteLocked<'_>,
    folio: Folio,
    (i, addr): (u64, u64),
    ttu: &mut Ttu<'_>,
) -> bool {
    let mem = oncpu.mem();
    let idx = crate::pgtable::pte_index(addr);
    let pte = pt.pte(idx);
    if !pte.present() || pte.special() || pte.pfn() != folio.pfn() + i {
        return false;
    }
    let pteval = pt.get_and_clear(idx);
    ttu.flush_cleared_pte(oncpu, mm, pteval, addr);
    if pteval.dirty() {
        crate::filemap::folio_mark_dirty(mem, folio);
    }
    mm.update_hiwater_rss();
    mm.add_rss(crate::mm::mm_counter_file(mem, folio), -1);
    rmap::folio_remove_rmap_ptes(mem, folio, folio.pfn() + i, 1, mm.id, oncpu.id());
    folio.put(mem, oncpu.id());
    true
}

/// `demote_folio_list`: migrate the folios to `target` (`MR_DEMOTION`,
/// asynchronous, without reclaiming there: `GFP_NOWAIT | __GFP_THISNODE`);
/// returns the pages demoted and the folios that were not (still
/// isolated, their isolation's reference held).
fn demote_folio_list(oncpu: &OnCpu, target: usize, folios: Vec<Folio>) -> (u64, Vec<Folio>) {
    use crate::migrate::{migrate_pages, MigrateMode, MigrateReason, MigrationTarget};
    let mem = oncpu.mem();
    let mut isolated = Vec::new();
    let mut failed = Vec::new();
    for f in folios {
        match crate::migrate::Isolated::from_lru_isolated(mem, f) {
            Some(iso) => isolated.push(iso),
            None => failed.push(f),
        }
    }
    let out = migrate_pages(
        oncpu,
        isolated,
        MigrationTarget {
            nid: target,
            this_node: true,
            nowait: true,
        },
        MigrateMode::Async,
        MigrateReason::Demotion,
    );
    failed.extend(out.failed.into_iter().map(|iso| iso.into_folio()));
    (out.stats.nr_succeeded, failed)
}

/// `try_to_unmap` of a lazyfree folio: clear each PTE that maps it, its
/// flush queued on `ubc`; if the folio was written meanwhile, or someone
/// else holds a reference, the PTEs go back and it is swap-backed again
/// (if written). True if every mapping is gone (the folio may be freed
/// once `ubc` is flushed).
fn try_to_unmap_lazyfree(oncpu: &OnCpu, folio: Folio, ubc: &mut TlbflushUnmapBatch) -> bool {
    let mem = oncpu.mem();
    let Some(anon_vma) = crate::rmap::folio_get_anon_vma(mem, folio) else {
        // Unmapped meanwhile: only the isolation holds it.
        return folio.ref_count(mem) == 1;
    };
    let flags = TtuFlags {
        batch_flush: true,
        split_huge_pmd: false,
    };
    let mut ok = true;
    rmap_walk_anon(oncpu, folio, &anon_vma, |mm, vma| {
        if vma.flags() & VM_LOCKED != 0 {
            ok = false;
            return false;
        }
        // A PMD-mapped lazyfree THP is split first by the kernel; the
        // model leaves it mapped.
        let at_pmd = |slot, _| {
            if mm.pmd_get(slot).trans_huge() {
                AtPmd::Stop
            } else {
                AtPmd::Ptes
            }
        };
        let mut ttu = Ttu {
            flags,
            ubc: &mut *ubc,
        };
        ok = page_vma_mapped_walk(mem, mm, vma, folio, at_pmd, |pt, i, addr| {
            unmap_lazyfree_pte(oncpu, mm, pt, folio, (i, addr), &mut ttu)
        });
        ok
    });
    ok && !folio.mapped(mem)
}

/// One PTE of [`try_to_unmap_lazyfree`], in the locked table `pt`: cleared
/// if it maps page `i`; false (the entry put back) if the folio was
/// written, or someone else holds it.
fn unmap_lazyfree_pte(
    oncpu: &OnCpu,
    mm: &crate::sync::Arc<crate::mm::Mm>,
    pt: &mut PteLocked<'_>,
    folio: Folio,
    (i, addr): (u64, u64),
    ttu: &mut Ttu<'_>,
) -> bool {
    let mem = oncpu.mem();
    let idx = crate::pgtable::pte_index(addr);
    let pte = pt.pte(idx);
    if !pte.present() || pte.special() || pte.pfn() != folio.pfn() + i {
        return true;
    }
    let pteval = pt.get_and_clear(idx);
    ttu.flush_cleared_pte(oncpu, mm, pteval, addr);
    let head = folio.head(mem);
    if pteval.dirty() {
        head.set(pg::DIRTY);
    }
    mm.update_hiwater_rss();
    // One reference for the isolation, one per mapping.
    if folio.ref_count(mem) != 1 + folio.mapcount(mem) || head.test(pg::DIRTY) {
        pt.set(idx, pteval);
        if head.test(pg::DIRTY) {
            head.clear(pg::LAZYFREE);
            head.set(pg::SWAPBACKED);
        }
        return false;
    }
    mm.add_rss(MmCounter::AnonPages, -1);
    rmap::folio_remove_rmap_ptes(mem, folio, folio.pfn() + i, 1, mm.id, oncpu.id());
    folio.put(mem, oncpu.id());
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::madvise::MADV_FREE;
    use crate::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
    use crate::{Machine, MachineConfig};
    use std::sync::Arc;

    /// kswapd raises its priority after every pass that scanned less than
    /// the high watermark's worth (`kswapd_shrink_node`), not only after
    /// one that reclaimed nothing: on a 16 MiB node its passes scan 1, 2,
    /// 4, ... pages, so the dozen it discards to reach the high watermark
    /// go in a handful of batches, one TLB flush each, where a priority
    /// kept while each one-page pass succeeded took a flush a page.
    #[test]
    fn kswapd_raises_its_priority_until_a_pass_scans_its_target() {
        let m = Machine::new(MachineConfig::two_tiers(16 << 20, 64 << 20, 2)).unwrap();
        let (c, mm) = fill_fast_node_with_lazyfree(&m);
        // A second CPU that ran the mm: each batch's unmap is one
        // shootdown.
        let c1 = m.bind(1).unwrap();
        c1.switch_mm(&mm);
        c1.idle();
        assert!(!pgdat_balanced(&c, 0));
        let shootdowns = || m.vmstat().event_on(0, Event::NR_TLB_REMOTE_FLUSH);
        let before = shootdowns();
        let reclaimed = balance_pgdat(&c, 0).expect("not balanced");
        let batches = shootdowns() - before;
        assert!(pgdat_balanced(&c, 0));
        // The node short of its high watermark by a dozen pages (the
        // pcp lists hide few free pages: kswapd's run marks the zone
        // `ZONE_RECLAIM_ACTIVE`, and a batch is one page at this size):
        // passes of 1, 2, 4, 8 pages reach it in three or four batches,
        // where at one priority throughout it took a batch a page.
        assert!(reclaimed >= 8, "{reclaimed} reclaimed");
        assert!(
            batches <= 4 && reclaimed >= 2 * batches,
            "{reclaimed} pages in {batches} batches"
        );
        crate::check::check_invariants(&m).unwrap();
    }

    /// `pageoutrun` counts every run of kswapd: `balance_pgdat` counts it
    /// before its first look at the node, so a run that finds the node
    /// balanced and reclaims nothing counts as one that reclaims does.
    #[test]
    fn pageoutrun_counts_every_kswapd_run_balanced_or_not() {
        let m = Machine::new(MachineConfig::two_tiers(16 << 20, 64 << 20, 2)).unwrap();
        let runs = || m.vmstat().event(Event::PAGEOUTRUN);
        let (c, _mm) = fill_fast_node_with_lazyfree(&m);
        assert!(!pgdat_balanced(&c, 0));
        let before = runs();
        assert!(balance_pgdat(&c, 0).is_some_and(|n| n > 0));
        assert_eq!(runs() - before, 1, "a run that reclaimed");
        assert!(pgdat_balanced(&c, 0));
        assert_eq!(balance_pgdat(&c, 0), None);
        assert_eq!(balance_pgdat(&c, 0), None);
        assert_eq!(runs() - before, 3, "and two that found the node balanced");
        crate::check::check_invariants(&m).unwrap();
    }

    /// A hopeless node's kswapd is not woken, however short the node is;
    /// switching demotion on (from off) revives every node's, as the
    /// sysfs store does, and setting it on again does nothing.
    #[test]
    fn a_hopeless_kswapd_sleeps_until_demotion_is_switched_on() {
        use crate::phys::page_alloc::Reclaimer;
        use crate::phys::MAX_RECLAIM_RETRIES;
        let m = Machine::new(MachineConfig::two_tiers(16 << 20, 64 << 20, 2)).unwrap();
        let (c, _mm) = fill_fast_node_with_lazyfree(&m);
        assert!(!pgdat_balanced(&c, 0));
        let hopeless = || {
            m.mem
                .nodes
                .iter()
                .map(|n| n.kswapd_hopeless())
                .collect::<Vec<_>>()
        };
        let give_up = || {
            for n in &m.mem.nodes {
                n.kswapd_failures
                    .store(MAX_RECLAIM_RETRIES, crate::sync::Ordering::Relaxed);
            }
        };
        give_up();
        let runs = m.vmstat().event(Event::PAGEOUTRUN);
        c.idle();
        m.wakeup_kswapd(0, 0);
        m.kswapd_quiesce();
        assert_eq!(m.vmstat().event(Event::PAGEOUTRUN), runs);
        m.set_demotion_enabled(false);
        assert_eq!(hopeless(), [true, true]);
        m.set_demotion_enabled(true);
        assert_eq!(hopeless(), [false, false]);
        give_up();
        m.set_demotion_enabled(true);
        assert_eq!(hopeless(), [true, true]);
    }

    /// The fast node filled to its low watermark (the rest on the slow
    /// one) with anon pages kswapd cannot reclaim (no demotion), then
    /// made lazyfree: clean, old, on the inactive file list. kswapd is
    /// idle on return.
    fn fill_fast_node_with_lazyfree(m: &Machine) -> (OnCpu<'_>, Arc<crate::mm::Mm>) {
        m.thp.only_order(0);
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let len = 20 << 20;
        let a = c
            .mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
            .unwrap();
        for p in (a..a + len).step_by(crate::phys::PAGE_SIZE as usize) {
            c.store_u64(p, p).unwrap();
        }
        m.kswapd_quiesce();
        c.madvise(a, len, MADV_FREE).unwrap();
        (c, mm)
    }
}
