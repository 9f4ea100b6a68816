//! Automatic NUMA balancing in its memory-tiering mode (`numa_balancing =
//! 2`, v5.18+): what moves hot pages from a slow tier back to DRAM.
//!
//! * The scanner (`task_numa_work`, kernel/sched/fair.c) runs on a CPU
//!   returning to its process, every scan period: from where the last scan
//!   stopped, it makes the process's present PTEs PROT_NONE hinting
//!   entries (`change_prot_numa`, `numa_pte_updates`), a huge-page-aligned
//!   range at a time, until it has covered `scan_size_mb` of address space
//!   in ranges where it hinted something, or eight times that in all. In
//!   tiering mode alone it leaves pages on the top tier alone (mode 3,
//!   normal balancing too, hints them), and it notes when it scanned each
//!   folio below the top tier (`folio_xchg_access_time`).
//! * An access to such an entry faults (`do_numa_page`,
//!   `numa_hint_faults`, `numa_hint_faults_local`). A folio on a slow tier
//!   whose fault came within `hot_threshold_ms` of its scan is hot
//!   (`should_numa_migrate_memory`, with the promotion rate limit, which
//!   counts `pgpromote_candidate`; any folio is, while the fast node has a
//!   GiB to spare: `pgdat_free_space_enough`, `pgpromote_candidate_nrl`)
//!   and, where the VMA's policy lets it go
//!   (`mpol_misplaced`: the default policy anywhere, `MPOL_BIND` or
//!   `MPOL_PREFERRED_MANY` with `MPOL_F_NUMA_BALANCING` only to one of its
//!   nodes), is promoted to the faulting CPU's node
//!   (`migrate_misplaced_folio`, `MR_NUMA_MISPLACED`:
//!   `numa_pages_migrated`, `pgpromote_success`) if that node has room
//!   above its high watermark (`migrate_balanced_pgdat`); if not, its
//!   kswapd is woken, to demote cold pages and make room, and the entry is
//!   restored. A migration of a hinting entry needs no TLB flush: the entry
//!   was flushed when it was made PROT_NONE (the `pte_accessible` filter).
//! * The scan period starts at [`task_scan_min`] (`scan_period_min_ms`
//!   shared among the scans a pass over the resident pages takes) and
//!   adapts after each pass to the faults the task recorded
//!   ([`task_numa_fault`], [`update_task_scan_period`]). In tiering mode
//!   those are the promotions that succeeded, private and remote: the
//!   period doubles, up to [`task_scan_max`], at the first promotion of
//!   each pass after the first (a pass that promotes nothing leaves it).
//!
//! A PMD-mapped THP is hinted by its PMD (`change_huge_pmd` with
//! `MM_CP_PROT_NUMA`, 512 `numa_pte_updates`) and its fault is
//! `do_huge_pmd_numa_page`, which promotes the folio whole through a PMD
//! migration entry; a THP the scan range covers in part is split first.
//! The scan changes migration entries as mprotect does (a writable one
//! becomes readable: `change_pte_range` and `change_huge_pmd` treat them
//! alike whatever the caller), and counts the PTE ones it changes.
//!
//! The scan visits only the VMAs whose policy lets NUMA balancing move
//! their pages (`vma_policy_mof`): those with no policy of their own or
//! the process's, and those bound with `MPOL_F_NUMA_BALANCING`; a plain
//! `mbind(MPOL_BIND)` takes a VMA out of the scan.
//!
//! The model keeps the hot threshold at its default (the kernel adjusts it to the rate limit,
//! `numa_promotion_adjust_threshold`). Times are milliseconds since the
//! machine was made. Not modelled:
//! * the scan's timing per thread: the kernel starts a scan from the
//!   scheduler tick once the thread has run its `numa_scan_period` (of
//!   run time, with the scan's own time charged 32-fold), each thread with
//!   its own period and fault statistics (the first thread of a process
//!   starts at `task_scan_start`, the others at `scan_delay_ms`); the
//!   model keeps one of each per process, as for its first thread, counts
//!   wall time, and scans from whichever CPU of the process gets there
//!   first. The period adapts at the first recorded fault of a pass, not
//!   held off by `numa_migrate_retry` as the kernel's may be (for a
//!   sixteenth of a period, at most a second, once the task has a
//!   preferred node);
//! * `last_cpupid`: every recorded fault is private, as all are in
//!   tiering mode and for a process of one thread; and in normal mode a
//!   fault on a folio below the top tier is recorded even where the
//!   kernel's would not be, its `last_cpupid` not yet valid (the first
//!   after tiering mode used the field for the scan time);
//! * the per-VMA state of 6.x (`vma->numab_state`): a VMA first seen after
//!   the first full pass waits `scan_delay_ms`, a VMA is scanned once per
//!   pass (`prev_scan_seq`), and after two passes only if the scanning
//!   thread has taken hinting faults in it lately (`vma_is_accessed`);
//! * `prot_numa_skip`'s rule for a process of one thread (the pages on the
//!   node it runs on are left alone): the model has no threads to count,
//!   and scans as for a process of several.

use crate::machine::OnCpu;
use crate::mm::vma::{VM_ACCESS_FLAGS, VM_WRITE};
use crate::mm::{Mm, Vma};
use crate::mmu_gather::MmuGather;
use crate::pgtable::entry::Pgprot;
use crate::pgtable::{self, Pte, PteLocked, PteRead};
use crate::phys::folio::page_anon_exclusive;
use crate::phys::{Folio, Tier, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::{Arc, Ordering};
use crate::vmstat::{Event, NodeStat};

pub use crate::machine::numa::*;
pub use crate::mm::numa_scan::MmNumaScan;
use crate::mm::numa_scan::TaskNumaFaults;

/// `NUMA_PERIOD_SLOTS` and `NUMA_PERIOD_THRESHOLD`: the ratios of
/// [`update_task_scan_period`] are in tenths, and seven is "most".
const NUMA_PERIOD_SLOTS: u64 = 10;
const NUMA_PERIOD_THRESHOLD: i64 = 7;

/// The scan never covers more than this many MB a second, whatever the
/// knobs say (`MAX_SCAN_WINDOW`).
const MAX_SCAN_WINDOW: u64 = 2560;

/// `task_nr_scan_windows`: the scans of `scan_size_mb` it takes to cover
/// the process's resident pages (at least one). Resident rather than
/// mapped: the scan skips what is not present, and only what is present
/// takes hinting faults.
fn task_nr_scan_windows(mm: &Mm, scan_size_mb: u64) -> u64 {
    let nr_scan_pages = scan_size_mb << (20 - PAGE_SHIFT);
    let rss = match mm.rss_pages() {
        r if r > 0 => r as u64,
        _ => nr_scan_pages,
    };
    // round_up is the kernel's power-of-two mask: for a scan size that is
    // not a power of two it rounds as the kernel's does, not up to a
    // multiple.
    (((rss - 1) | (nr_scan_pages - 1)) + 1) / nr_scan_pages
}

/// `task_scan_min`: the shortest time between two scans, in ms:
/// `scan_period_min_ms` shared among the scans a pass over the resident
/// pages takes, but never so short that more than [`MAX_SCAN_WINDOW`] MB
/// a second would be scanned (in whole ms, as the kernel's integer
/// arithmetic has it: a scan of 2 MB or less has no floor). 0 while
/// `scan_size_mb` is 0 (no scans).
pub fn task_scan_min(knobs: &NumaKnobs, mm: &Mm) -> u64 {
    task_scan_bounds(knobs, mm).map_or(0, |(min, _)| min)
}

/// `task_scan_max`: the longest time between two scans, in ms:
/// `scan_period_max_ms` shared as [`task_scan_min`] shares its knob, and
/// never under that minimum.
pub fn task_scan_max(knobs: &NumaKnobs, mm: &Mm) -> u64 {
    task_scan_bounds(knobs, mm).map_or(0, |(_, max)| max)
}

/// [`task_scan_min`] and [`task_scan_max`] from one look at the knobs and
/// the resident pages, so that the minimum is never above the maximum;
/// None while `scan_size_mb` is 0 (the kernel would divide by it).
fn task_scan_bounds(knobs: &NumaKnobs, mm: &Mm) -> Option<(u64, u64)> {
    let scan_size = knobs.scan_size_mb.load(Ordering::Relaxed);
    if scan_size == 0 {
        return None;
    }
    let nr_windows = task_nr_scan_windows(mm, scan_size);
    let windows = if scan_size < MAX_SCAN_WINDOW {
        MAX_SCAN_WINDOW / scan_size
    } else {
        1
    };
    let floor = 1000 / windows;
    let min = floor.max(knobs.scan_period_min_ms.load(Ordering::Relaxed) / nr_windows);
    let max = min.max(knobs.scan_period_max_ms.load(Ordering::Relaxed) / nr_windows);
    Some((min, max))
}

/// `task_scan_start`: the period a thread starts with, at its first
/// scheduler tick past `scan_delay_ms` ([`task_scan_min`]; the kernel
/// lengthens it for a task in a NUMA group that shares memory, which the
/// model has not).
fn task_scan_start(knobs: &NumaKnobs, mm: &Mm) -> u64 {
    task_scan_min(knobs, mm)
}

/// `node_is_toptier`: a node of the fastest tier.
fn node_is_toptier(oncpu: &OnCpu, nid: usize) -> bool {
    oncpu.mem().nodes[nid].tier == Tier::Dram
}

/// `task_tick_numa` + `task_numa_work`: if the process is due, scan the
/// next part of it. Called as the CPU returns to user mode.
pub fn task_numa_work(oncpu: &OnCpu, mm: &Arc<Mm>) {
    let knobs = &oncpu.m.numa;
    if !knobs.enabled() {
        return;
    }
    let now = oncpu.m.jiffies_ms();
    let next = mm.numa_scan.next_scan.load(Ordering::Relaxed);
    if next == 0 {
        // The first look: wait scan_delay from now.
        let first = now + knobs.scan_delay_ms.load(Ordering::Relaxed);
        let _ = mm.numa_scan.next_scan.compare_exchange(
            0,
            first.max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        return;
    }
    if now < next {
        return;
    }
    let scan_size_mb = knobs.scan_size_mb.load(Ordering::Relaxed);
    if scan_size_mb == 0 {
        // Nothing to scan (the kernel, working out the period, would
        // divide by this debugfs knob first).
        return;
    }
    let period = scan_period(knobs, mm);
    // One CPU of the process scans (the cmpxchg on numa_next_scan). Never
    // 0, which means not looked at yet.
    let due = (now + period).max(1);
    if mm
        .numa_scan
        .next_scan
        .compare_exchange(next, due, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let pages = scan_size_mb << (20 - PAGE_SHIFT);
    let Some(_g) = mm.mmap_lock.try_read() else {
        return;
    };
    // The scan's own shootdowns (its range flushes, and the batched
    // flushes it finds pending), told apart for experiments.
    let _account = crate::cpu::RemoteFlushAccount::enter(Event::NUMA_SCAN_REMOTE_FLUSH);
    let mut budget = pages;
    let mut virt = pages * 8;
    let guard = crate::sync::epoch::pin();
    let vmas: Vec<Arc<Vma>> = mm.vma_tree(&guard).iter().cloned().collect();
    drop(guard);
    let mut start = mm.numa_scan.offset.load(Ordering::Relaxed);
    if !vmas.iter().any(|v| v.end() > start) {
        // Nothing past where the last scan stopped: start over now.
        reset_ptenuma_scan(mm);
        start = 0;
    }
    for vma in vmas.iter().filter(|v| v.end() > start) {
        // `vma_is_accessible`, and `vma_policy_mof`: a VMA under a policy
        // made without MPOL_F_NUMA_BALANCING is never scanned.
        if vma.flags() & VM_ACCESS_FLAGS == 0 || !crate::mempolicy::vma_policy_mof(mm, vma) {
            continue;
        }
        let mut a = vma.start().max(start);
        while a < vma.end() {
            // Ends on a huge-page boundary, as the kernel's does: a scan
            // never covers a THP in part (which would split it).
            let huge = crate::pgtable::PMD_SIZE;
            let end = (a + (budget << PAGE_SHIFT))
                .next_multiple_of(huge)
                .min(vma.end());
            let cow = crate::memory::is_cow_mapping(vma.flags());
            let updated = change_prot_numa(oncpu, mm, a, end, cow);
            // The budget is of address space in which something was
            // hinted, not of entries hinted: a sparse range counts whole
            // once it had one (and `virt` bounds the empty ones).
            let range = (end - a) >> PAGE_SHIFT;
            if updated > 0 {
                budget = budget.saturating_sub(range);
            }
            virt = virt.saturating_sub(range);
            a = end;
            if budget == 0 || virt == 0 {
                // Done for this period: the next scan goes on from here.
                mm.numa_scan.offset.store(a, Ordering::Relaxed);
                return;
            }
        }
    }
    // Past the last VMA: the next scan starts over.
    reset_ptenuma_scan(mm);
}

/// `reset_ptenuma_scan`: a pass is over; the next starts at the bottom.
fn reset_ptenuma_scan(mm: &Mm) {
    mm.numa_scan.seq.fetch_add(1, Ordering::Relaxed);
    mm.numa_scan.offset.store(0, Ordering::Relaxed);
}

/// The process's time between scans: set once, from its resident pages
/// when its first scan is due ([`task_scan_start`]), and kept (see the
/// module doc on its adaptation).
fn scan_period(knobs: &NumaKnobs, mm: &Mm) -> u64 {
    let set = mm.numa_scan.period_ms.load(Ordering::Relaxed);
    if set != 0 {
        return set;
    }
    // Racing CPUs of the process work out the same period, give or take
    // the pages faulted meanwhile: either may stand. A period of 0 (no
    // floor, and fewer ms than scans) stays unset and is worked out again
    // each time, as the kernel's `numa_scan_period == 0` is.
    let start = task_scan_start(knobs, mm);
    match mm
        .numa_scan
        .period_ms
        .compare_exchange(0, start, Ordering::Relaxed, Ordering::Relaxed)
    {
        Ok(_) => start,
        Err(other) => other,
    }
}

/// What a scan's `change_pte_range` with `MM_CP_PROT_NUMA` decides per
/// folio: its mode and clock, and whether the VMA is a copy-on-write one.
#[derive(Clone, Copy)]
struct ProtNuma {
    mode: u8,
    now: u64,
    cow: bool,
}

impl ProtNuma {
    /// Whether `folio` is to be hinted: not on the top tier unless normal
    /// balancing is on too (mode 3 hints it). In tiering mode a folio
    /// below the top tier notes when it was scanned
    /// (`folio_use_access_time`, `folio_xchg_access_time`).
    fn hint(self, oncpu: &OnCpu, folio: Folio) -> bool {
        let top = node_is_toptier(oncpu, folio.nid());
        if top && self.mode & NUMA_BALANCING_NORMAL == 0 {
            return false;
        }
        if !top && self.mode & NUMA_BALANCING_MEMORY_TIERING != 0 {
            folio
                .head(oncpu.mem())
                .private
                .store(self.now, Ordering::Relaxed);
        }
        true
    }
}

/// `change_prot_numa`: make the present PTEs of `[start, end)` that map
/// folios worth hinting PROT_NONE; returns how many were changed. Without
/// normal balancing, those on the top tier are left alone; in tiering mode
/// each folio below it notes the time (`folio_xchg_access_time`).
fn change_prot_numa(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, end: u64, cow: bool) -> u64 {
    let scan = ProtNuma {
        mode: oncpu.m.numa.mode.load(Ordering::Relaxed),
        now: oncpu.m.jiffies_ms(),
        cow,
    };
    let mut tlb = MmuGather::new(mm);
    let mut updated = 0;
    let mut a = start;
    while a < end {
        let table_end = ((a >> pgtable::PMD_SHIFT) + 1) << pgtable::PMD_SHIFT;
        let next = table_end.min(end);
        if let Some(slot) = mm.pmd_lookup(a) {
            // A huge PMD or a PMD migration entry (change_pmd_range).
            if crate::huge_memory::pmd_is_huge(mm.pmd_get(slot)) {
                if next - a == pgtable::PMD_SIZE {
                    if prot_numa_huge_pmd(oncpu, mm, slot, scan) {
                        tlb.remove_pmd_tlb_entry(a);
                        updated += crate::phys::HPAGE_PMD_NR;
                    }
                    a = next;
                    continue;
                }
                crate::huge_memory::split_huge_pmd(oncpu, mm, slot, a);
            }
            if !crate::huge_memory::pmd_is_huge(mm.pmd_get(slot)) {
                if let Some(mut pt) = mm.pte_offset_map_lock(slot) {
                    crate::tlbbatch::flush_tlb_batched_pending(oncpu, mm);
                    let mut p = a;
                    while p < next {
                        match prot_numa_one(oncpu, &mut pt, p, scan) {
                            ProtNumaPte::Hinted => {
                                tlb.remove_tlb_entries(p, 1);
                                updated += 1;
                            }
                            ProtNumaPte::NonPresentChanged => updated += 1,
                            ProtNumaPte::Unchanged => {}
                        }
                        p += PAGE_SIZE;
                    }
                }
            }
        }
        a = next;
    }
    tlb.finish(oncpu);
    oncpu
        .vmstat()
        .count(oncpu.id(), Event::NUMA_PTE_UPDATES, updated);
    updated
}

/// A whole huge PMD of [`change_prot_numa`] (`change_huge_pmd` with
/// `MM_CP_PROT_NUMA`): the same rules as for a PTE, for the THP it maps.
/// Returns whether it was made a hinting entry. A PMD migration entry is
/// changed as mprotect changes it, and not counted (`change_huge_pmd`
/// returns 1 for it, not `HPAGE_PMD_NR`).
fn prot_numa_huge_pmd(oncpu: &OnCpu, mm: &Mm, slot: pgtable::PmdSlot, scan: ProtNuma) -> bool {
    let mut ptl = mm.pmd_lock(slot);
    let pmd = ptl.get();
    if pmd.is_migration() {
        crate::huge_memory::change_non_present_huge_pmd(&mut ptl);
        return false;
    }
    if !pmd.trans_huge() || pmd.protnone() || pmd.special() {
        return false;
    }
    if !scan.hint(oncpu, Folio(pmd.pfn())) {
        return false;
    }
    // pmdp_invalidate_ad: an accessed or dirty bit set meanwhile is kept.
    let old = ptl.invalidate();
    ptl.set(old.modify(Pgprot::NONE));
    true
}

/// What [`prot_numa_one`] did to an entry.
enum ProtNumaPte {
    Unchanged,
    /// Made a hinting (PROT_NONE) entry: the TLBs must forget it.
    Hinted,
    /// A writable migration entry made readable, as mprotect makes it
    /// (counted as updated; nothing to flush).
    NonPresentChanged,
}

/// One PTE of [`change_prot_numa`], the table locked.
fn prot_numa_one(oncpu: &OnCpu, pt: &mut PteLocked<'_>, addr: u64, scan: ProtNuma) -> ProtNumaPte {
    let mem = oncpu.mem();
    let idx = pgtable::pte_index(addr);
    let pte = pt.pte(idx);
    if pte.is_swap() {
        return if crate::mprotect::change_non_present_pte(pt, idx, pte) {
            ProtNumaPte::NonPresentChanged
        } else {
            ProtNumaPte::Unchanged
        };
    }
    if !pte.present() || pte.protnone() || pte.special() {
        return ProtNumaPte::Unchanged;
    }
    let folio = mem.page_folio(pte.pfn());
    if !folio.test_anon(mem) {
        return ProtNumaPte::Unchanged;
    }
    // prot_numa_skip: a copy-on-write page that fork shared is left alone
    // (the hint fault could not migrate it: another process maps it).
    if scan.cow && crate::rmap::folio_maybe_mapped_shared(mem, folio) {
        return ProtNumaPte::Unchanged;
    }
    if !scan.hint(oncpu, folio) {
        return ProtNumaPte::Unchanged;
    }
    // An accessed or dirty bit set by a racing walker is kept.
    let old = pt.modify_prot_start(idx);
    pt.modify_prot_commit(idx, old.modify(Pgprot::NONE));
    ProtNumaPte::Hinted
}

/// `numa_hint_fault_latency`: milliseconds since the folio was scanned.
fn numa_hint_fault_latency(oncpu: &OnCpu, folio: Folio) -> u64 {
    let scanned = folio.head(oncpu.mem()).private.load(Ordering::Relaxed);
    oncpu.m.jiffies_ms().saturating_sub(scanned)
}

/// `should_numa_migrate_memory` in tiering mode, for a folio on a slow
/// node faulted from `dst_nid`: at once if that node has room to spare
/// ([`pgdat_free_space_enough`]: a workload that has changed, counted in
/// `pgpromote_candidate_nrl`, outside the rate limit); else if hot
/// (faulted soon after its scan) and within the promotion rate limit.
fn should_promote(oncpu: &OnCpu, folio: Folio, dst_nid: usize) -> bool {
    let knobs = &oncpu.m.numa;
    let mem = oncpu.mem();
    let nr = folio.nr_pages(mem);
    if pgdat_free_space_enough(oncpu, dst_nid) {
        mem.mod_node_state(NodeStat::PGPROMOTE_CANDIDATE_NRL, nr as i64);
        return true;
    }
    let th = knobs.hot_threshold_ms.load(Ordering::Relaxed);
    if numa_hint_fault_latency(oncpu, folio) >= th {
        return false;
    }
    // numa_promotion_rate_limit: candidates per second against the limit.
    let limit = knobs.promote_rate_limit_mbps.load(Ordering::Relaxed) << (20 - PAGE_SHIFT);
    mem.mod_node_state(NodeStat::PGPROMOTE_CANDIDATE, nr as i64);
    let now = oncpu.m.jiffies_ms();
    let mut w = oncpu.mem().nodes[dst_nid.min(oncpu.mem().nodes.len() - 1)]
        .nbp_rl
        .window
        .lock();
    if now.saturating_sub(w.0) >= 1000 {
        *w = (now, 0);
    }
    w.1 += nr;
    w.1 <= limit
}

/// `pgdat_free_space_enough`: node `nid` has free, above its promotion
/// watermark, a GiB or a sixteenth of its pages, whichever is more. (The
/// kernel then also resets the hot threshold it adjusts, which the model
/// keeps at its default.)
fn pgdat_free_space_enough(oncpu: &OnCpu, nid: usize) -> bool {
    let node = &oncpu.mem().nodes[nid];
    let enough = (1u64 << (30 - PAGE_SHIFT)).max(node.nr_pages >> 4);
    node.zone.nr_free_for_watermark() > node.zone.promo_wmark_pages() + enough
}

/// `migrate_balanced_pgdat`: room on `nid` for `nr` more pages above its
/// high watermark.
fn migrate_balanced_pgdat(oncpu: &OnCpu, nid: usize, nr: u64) -> bool {
    let z = &oncpu.mem().nodes[nid].zone;
    z.nr_free_for_watermark() > z.wmark(2) + nr
}

/// What [`do_numa_page`] decided for a hinting fault's folio.
pub enum NumaHint {
    /// Leave it where it is: restore the entry.
    Stay,
    /// It was to move, but its node has no room
    /// (`migrate_misplaced_folio_prepare` fails): restore the entry, a
    /// failed migration.
    Refused,
    /// Promote it to this node (the entry's lock must be dropped first).
    Migrate(usize),
}

/// `numa_migrate_check` + `migrate_misplaced_folio_prepare`'s checks:
/// count the hint fault on `vma`, and decide: where the VMA's policy lets
/// the folio go (`mpol_misplaced`), if it is hot. Called with the page
/// table lock held.
pub fn numa_migrate_check(oncpu: &OnCpu, mm: &Mm, vma: &Vma, folio: Folio) -> NumaHint {
    let v = oncpu.vmstat();
    v.count(oncpu.id(), Event::NUMA_HINT_FAULTS, 1);
    let src = folio.nid();
    let this_nid = oncpu.cpu.node;
    if src == this_nid {
        v.count(oncpu.id(), Event::NUMA_HINT_FAULTS_LOCAL, 1);
    }
    let Some(dst) = crate::mempolicy::mpol_misplaced(mm, vma, this_nid) else {
        return NumaHint::Stay;
    };
    let knobs = &oncpu.m.numa;
    if !knobs.tiering() || src == dst || node_is_toptier(oncpu, src) {
        return NumaHint::Stay;
    }
    if !should_promote(oncpu, folio, dst) {
        return NumaHint::Stay;
    }
    let nr = folio.nr_pages(oncpu.mem());
    if !migrate_balanced_pgdat(oncpu, dst, nr) {
        // No room: kswapd demotes to make some (tiering mode), and the
        // folio stays this time. The kernel counts nothing here but the
        // task's failed migration (`TNF_MIGRATE_FAIL`); the model counts
        // the pages too, to tell a promotion the watermark refused from
        // one the hot threshold or the rate limit did.
        v.count(oncpu.id(), Event::NUMA_PROMOTE_REFUSED, nr);
        let order = folio.order(oncpu.mem());
        crate::phys::page_alloc::Reclaimer::wakeup_kswapd(oncpu.m, dst, order);
        return NumaHint::Refused;
    }
    NumaHint::Migrate(dst)
}

/// A hinting fault as [`task_numa_fault`] records it: the node its folio
/// ended on, its pages, and its `TNF_*` flags.
#[derive(Clone, Copy)]
pub struct TaskNumaFault {
    pub nid: usize,
    pub pages: u64,
    /// `TNF_FAULT_LOCAL`: the folio was on the faulting CPU's node.
    pub local: bool,
    /// `TNF_MIGRATE_FAIL`: it was to move and did not.
    pub migrate_fail: bool,
}

impl TaskNumaFault {
    /// A hinting fault on `folio`, where it is, taken on this CPU.
    pub fn new(oncpu: &OnCpu, folio: Folio) -> TaskNumaFault {
        TaskNumaFault {
            nid: folio.nid(),
            pages: folio.nr_pages(oncpu.mem()),
            local: folio.nid() == oncpu.cpu.node,
            migrate_fail: false,
        }
    }
}

/// `task_numa_fault`: record a hinting fault the task took, for the scan
/// period's adaptation. In tiering mode a folio that ends below the top
/// tier is not recorded, so the faults recorded there are the promotions
/// that succeeded. At the first recorded fault of a new pass
/// (`task_numa_placement`, seeing `mm->numa_scan_seq` moved) the period
/// adapts to those of the last ([`update_task_scan_period`]).
///
/// The kernel's faults are private or shared by the task that touched the
/// folio last (`last_cpupid`); in tiering mode it takes every one as
/// private, and the model, which keeps no `last_cpupid`, does so in
/// normal mode too, as for a process of one thread.
pub fn task_numa_fault(oncpu: &OnCpu, mm: &Mm, fault: TaskNumaFault) {
    let knobs = &oncpu.m.numa;
    if !knobs.enabled() || (knobs.tiering() && !node_is_toptier(oncpu, fault.nid)) {
        return;
    }
    let mut f = mm.numa_scan.faults.lock();
    let seq = mm.numa_scan.seq.load(Ordering::Relaxed);
    if f.seq != seq {
        f.seq = seq;
        update_task_scan_period(oncpu, mm, &mut f);
        f.private = 0;
    }
    if fault.migrate_fail {
        f.locality[2] += fault.pages;
    }
    f.private += fault.pages;
    f.locality[usize::from(fault.local)] += fault.pages;
}

/// `update_task_scan_period`: after a pass, scan slower or faster (in the
/// model, whose faults are all private, only slower: the last two
/// branches below never run).
/// * No local or shared faults recorded (in tiering mode, promotions
///   alone: private, and remote before they moved), or any failed
///   migration since the ratios last ran: twice as slow, up to
///   [`task_scan_max`], and the next scan put off by the new period. The
///   counts are kept, so this repeats every pass until the ratios run.
/// * Otherwise by the ratios, in tenths: mostly private faults, or mostly
///   local ones, slow it by a tenth of the period per tenth above seven
///   (at least one); else speed it up by as much below seven, within
///   [`task_scan_min`] and [`task_scan_max`]; the counts start over.
fn update_task_scan_period(oncpu: &OnCpu, mm: &Mm, f: &mut TaskNumaFaults) {
    let Some((min, max)) = task_scan_bounds(&oncpu.m.numa, mm) else {
        // No scans, and no windows to share the periods among.
        return;
    };
    let scan = &mm.numa_scan;
    let period = scan.period_ms.load(Ordering::Relaxed);
    let [remote, local, failed] = f.locality;
    // Every recorded fault is private (see task_numa_fault).
    let (private, shared) = (f.private, 0);
    if local + shared == 0 || failed != 0 {
        let slower = (period << 1).min(max);
        scan.period_ms.store(slower, Ordering::Relaxed);
        let next = (oncpu.m.jiffies_ms() + slower).max(1);
        scan.next_scan.store(next, Ordering::Relaxed);
        return;
    }
    let slot = period.div_ceil(NUMA_PERIOD_SLOTS) as i64;
    let lr_ratio = (local * NUMA_PERIOD_SLOTS / (local + remote)) as i64;
    // Not 0 over 0: local faults were recorded since the counts started
    // over, each with its private or shared one.
    let ps_ratio = (private * NUMA_PERIOD_SLOTS / (private + shared).max(1)) as i64;
    let diff = if ps_ratio >= NUMA_PERIOD_THRESHOLD {
        (ps_ratio - NUMA_PERIOD_THRESHOLD).max(1) * slot
    } else if lr_ratio >= NUMA_PERIOD_THRESHOLD {
        (lr_ratio - NUMA_PERIOD_THRESHOLD).max(1) * slot
    } else {
        -(NUMA_PERIOD_THRESHOLD - lr_ratio.max(ps_ratio)) * slot
    };
    let adapted = (period as i64 + diff).clamp(min as i64, max as i64) as u64;
    scan.period_ms.store(adapted, Ordering::Relaxed);
    f.locality = [0; 3];
}

/// The PMD a hinting fault restores (`pmd_modify` with the VMA's
/// protection, young; writable again as [`numa_restore_pte`] would make
/// the PTE: `can_change_pmd_writable`).
pub fn numa_restore_pmd(oncpu: &OnCpu, vma: &Vma, old: pgtable::Pmd) -> pgtable::Pmd {
    let mut pmd = old.modify(vma.page_prot()).mkyoung();
    if vma.flags() & VM_WRITE != 0 && page_anon_exclusive(oncpu.mem(), old.pfn()) {
        pmd = pmd.mkwrite();
    }
    pmd
}

/// The entry a hinting fault restores (`pte_modify` with the VMA's
/// protection, young; writable again where a write fault could make it so
/// without copying: an exclusive anon page of a writable VMA).
pub fn numa_restore_pte(oncpu: &OnCpu, vma: &Vma, old: Pte) -> Pte {
    let mut pte = old.modify(vma.page_prot()).mkyoung();
    if vma.flags() & VM_WRITE != 0 && page_anon_exclusive(oncpu.mem(), old.pfn()) {
        pte = pte.mkwrite();
    }
    pte
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmap::{MAP_ANONYMOUS, MAP_FIXED_NOREPLACE, MAP_NORESERVE, MAP_PRIVATE};
    use crate::mmap::{PROT_READ, PROT_WRITE};
    use crate::{Machine, MachineConfig};

    /// The scan's budget is address space, counted whole for each
    /// huge-page range in which it hinted anything. A 1 GiB mapping with
    /// one page present per 2 MiB is hinted 128 pages a scan (256 MB of
    /// ranges) in four scans, then the scan starts over. The host (6.18,
    /// normal balancing, the default 256 MB `scan_size_mb`, a process of
    /// two threads so that its own node's pages are not skipped) counted
    /// `numa_pte_updates` +128 at each of its first four scans of this
    /// mapping.
    #[test]
    fn a_scan_counts_the_ranges_it_hinted_in_not_the_entries() {
        const GIB: u64 = 1 << 30;
        const CHUNK: u64 = 2 << 20;
        let m = Machine::new(MachineConfig::single_node(16 << 20, 1)).unwrap();
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let rw = PROT_READ | PROT_WRITE;
        // Larger than the machine: not accounted, as on a small host.
        let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | MAP_NORESERVE;
        let a = c.mmap(4 * GIB, GIB, rw, flags).unwrap();
        for p in (a..a + GIB).step_by(CHUNK as usize) {
            c.store_u8(p, 1).unwrap();
        }
        m.numa.scan_delay_ms.store(0, Ordering::Relaxed);
        m.numa.scan_period_min_ms.store(0, Ordering::Relaxed);
        m.numa.mode.store(NUMA_BALANCING_NORMAL, Ordering::Relaxed);
        // The first call only sets when the first scan is due: now, or the
        // first millisecond of the machine.
        task_numa_work(&c, &mm);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let updates = || m.vmstat().event(Event::NUMA_PTE_UPDATES);
        let mut seen = Vec::new();
        for _ in 0..5 {
            let before = updates();
            task_numa_work(&c, &mm);
            seen.push(updates() - before);
            // 256 MB scans come at most ten times a second (the floor).
            std::thread::sleep(std::time::Duration::from_millis(101));
        }
        m.numa.mode.store(0, Ordering::Relaxed);
        // The fifth finds the mapping hinted already (and the offset back
        // at its start): nothing more to change.
        assert_eq!(seen, [128, 128, 128, 128, 0]);
        crate::check::check_invariants(&m).unwrap();
    }

    /// `task_scan_min`: `scan_period_min_ms` shared among the scans a pass
    /// over the resident pages takes, but no shorter than 2560 MB a second
    /// allows, in whole ms.
    #[test]
    fn the_scan_period_is_shared_among_the_scans_of_the_resident_pages() {
        let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let knobs = &m.numa;
        let period = |size_mb: u64, min_ms: u64| {
            knobs.scan_size_mb.store(size_mb, Ordering::Relaxed);
            knobs.scan_period_min_ms.store(min_ms, Ordering::Relaxed);
            task_scan_min(knobs, &mm)
        };
        // Nothing resident counts as one scan's worth.
        assert_eq!(period(1, 1000), 1000);
        let len = 24 << 20;
        let a = c
            .mmap(
                0,
                len + PAGE_SIZE,
                PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS,
            )
            .unwrap();
        for p in (a..a + len).step_by(PAGE_SIZE as usize) {
            c.store_u8(p, 1).unwrap();
        }
        // 24 MiB resident: 24 scans of 1 MB, 1000 / 24 ms apart.
        assert_eq!(period(1, 1000), 41);
        // A page more takes a 25th.
        c.store_u8(a + len, 1).unwrap();
        assert_eq!(period(1, 1000), 40);
        // The default 256 MB covers it in one: a second apart, and at
        // most ten a second (1000 / (2560 / 256)) however short the knob.
        assert_eq!(period(256, 1000), 1000);
        assert_eq!(period(256, 0), 100);
        // 2 MB or less: 1000 / 1280 rounds the floor to nothing.
        assert_eq!(period(2, 0), 0);
        assert_eq!(period(2560, 0), 1000);
        assert_eq!(period(4096, 0), 1000);
    }

    /// The period is set when the process's first scan is due, from what
    /// is resident then, and kept while no fault is recorded to adapt it
    /// (none is here: the scan hints nothing on the top tier in tiering
    /// mode), however much more becomes resident.
    #[test]
    fn the_scan_period_is_set_at_the_first_scan_and_kept() {
        let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let rw = PROT_READ | PROT_WRITE;
        let a = c.mmap(0, 8 << 20, rw, MAP_PRIVATE | MAP_ANONYMOUS).unwrap();
        let touch = |from: u64, to: u64| {
            for p in (from..to).step_by(PAGE_SIZE as usize) {
                c.store_u8(p, 1).unwrap();
            }
        };
        touch(a, a + (4 << 20));
        m.numa.scan_delay_ms.store(0, Ordering::Relaxed);
        m.numa.scan_size_mb.store(1, Ordering::Relaxed);
        m.numa
            .mode
            .store(NUMA_BALANCING_MEMORY_TIERING, Ordering::Relaxed);
        // Not due yet: unset.
        task_numa_work(&c, &mm);
        assert_eq!(mm.numa_scan.period_ms.load(Ordering::Relaxed), 0);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let before = m.jiffies_ms();
        task_numa_work(&c, &mm);
        let after = m.jiffies_ms();
        // 4 MiB resident in scans of 1 MB; the next is due a period on.
        assert_eq!(mm.numa_scan.period_ms.load(Ordering::Relaxed), 250);
        let next = mm.numa_scan.next_scan.load(Ordering::Relaxed);
        assert!((before + 250..=after + 250).contains(&next), "{next}");
        touch(a + (4 << 20), a + (8 << 20));
        m.numa.mode.store(0, Ordering::Relaxed);
        assert_eq!(task_scan_min(&m.numa, &mm), 125);
        assert_eq!(mm.numa_scan.period_ms.load(Ordering::Relaxed), 250);
        crate::check::check_invariants(&m).unwrap();
    }

    /// One scan, due now: the pass it makes, and the faults of loading
    /// `len` bytes at `a` after it.
    fn scan_and_load(c: &OnCpu, mm: &Arc<Mm>, a: u64, len: u64) {
        mm.numa_scan.next_scan.store(1, Ordering::Relaxed);
        task_numa_work(c, mm);
        for p in (a..a + len).step_by(PAGE_SIZE as usize) {
            c.load_u8(p).unwrap();
        }
    }

    /// In tiering mode the faults recorded are the promotions that
    /// succeeded, private and remote: after each pass that promoted, the
    /// period doubles, up to `task_scan_max`, and the next scan is put off
    /// by it. In normal mode local private faults slow it by the ratios: a
    /// tenth of the period for each tenth of private faults above seven
    /// (at least one).
    #[test]
    fn the_scan_period_adapts_to_the_faults_of_each_pass() {
        use crate::mempolicy::{MPOL_BIND, MPOL_DEFAULT, MPOL_MF_MOVE};
        let m = Machine::new(MachineConfig::two_tiers(32 << 20, 64 << 20, 1)).unwrap();
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let len = 16 * PAGE_SIZE;
        let rw = PROT_READ | PROT_WRITE;
        let a = c.mmap(0, len, rw, MAP_PRIVATE | MAP_ANONYMOUS).unwrap();
        let to_slow = || {
            c.mbind(a, len, MPOL_BIND, &[0b10], 3, MPOL_MF_MOVE)
                .unwrap();
            c.mbind(a, len, MPOL_DEFAULT, &[], 0, 0).unwrap();
        };
        c.mbind(a, len, MPOL_BIND, &[0b10], 3, 0).unwrap();
        for p in (a..a + len).step_by(PAGE_SIZE as usize) {
            c.store_u8(p, 1).unwrap();
        }
        c.mbind(a, len, MPOL_DEFAULT, &[], 0, 0).unwrap();
        // On the LRU, where a migration isolates them from.
        crate::swap::lru_add_drain(c.mem(), c.id());
        let knobs = &m.numa;
        knobs.scan_delay_ms.store(0, Ordering::Relaxed);
        knobs.scan_size_mb.store(1, Ordering::Relaxed);
        knobs.scan_period_min_ms.store(100, Ordering::Relaxed);
        knobs.scan_period_max_ms.store(1000, Ordering::Relaxed);
        knobs
            .mode
            .store(NUMA_BALANCING_MEMORY_TIERING, Ordering::Relaxed);
        let period = || mm.numa_scan.period_ms.load(Ordering::Relaxed);
        // The first look only sets when the first scan is due (now, or the
        // first millisecond of the machine).
        task_numa_work(&c, &mm);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let promoted = || m.vmstat().event(Event::NUMA_PAGE_MIGRATE);
        let mut seen = Vec::new();
        for pass in 0..5 {
            scan_and_load(&c, &mm, a, len);
            assert_eq!(promoted(), 16 * (pass + 1), "pass {pass} promoted all");
            seen.push(period());
            to_slow();
        }
        // One scan covers the 16 pages resident, 100 ms apart at first.
        assert_eq!(seen, [200, 400, 800, 1000, 1000]);
        let next = mm.numa_scan.next_scan.load(Ordering::Relaxed);
        assert!(next >= m.jiffies_ms() + 900, "put off by the period");
        // Normal mode, from 100 ms as a fresh process: the first update
        // finds no faults recorded before it and doubles; the second has
        // a pass of local private faults, three tenths slower.
        knobs.mode.store(NUMA_BALANCING_NORMAL, Ordering::Relaxed);
        knobs.scan_period_max_ms.store(60000, Ordering::Relaxed);
        c.mbind(a, len, MPOL_BIND, &[0b01], 3, MPOL_MF_MOVE)
            .unwrap();
        c.mbind(a, len, MPOL_DEFAULT, &[], 0, 0).unwrap();
        mm.numa_scan.period_ms.store(100, Ordering::Relaxed);
        *mm.numa_scan.faults.lock() = TaskNumaFaults {
            seq: mm.numa_scan.seq.load(Ordering::Relaxed),
            ..Default::default()
        };
        let two_passes = [(), ()].map(|()| {
            scan_and_load(&c, &mm, a, len);
            period()
        });
        assert_eq!(two_passes, [200, 260]);
        knobs.mode.store(0, Ordering::Relaxed);
        crate::check::check_invariants(&m).unwrap();
    }
}
