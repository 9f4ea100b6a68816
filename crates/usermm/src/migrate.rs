//! Page migration (mm/migrate.c), with the two rmap walks it is made of
//! (mm/rmap.c's `try_to_migrate_one`, and `remove_migration_pte`), and
//! `move_pages(2)`.
//!
//! `migrate_pages` moves isolated folios to a target node in batches of up
//! to 512 pages, as v6.3+ does (`migrate_pages_batch`):
//!
//! 1. *Unmap* every folio of the batch: lock it, allocate its destination,
//!    and replace each PTE that maps it by a migration entry
//!    (`try_to_migrate`). In the batch's first, asynchronous pass, the TLB
//!    flush of each cleared PTE is queued on a [`TlbflushUnmapBatch`]
//!    (`TTU_BATCH_FLUSH`) rather than done.
//! 2. *Flush* once for the batch (`try_to_unmap_flush`): from here no CPU
//!    can reach a source page.
//! 3. *Move* each folio: copy it, check that only the isolation still
//!    holds it, give the destination its identity, and put PTEs to the
//!    destination where the migration entries stand
//!    (`remove_migration_ptes`); the source is freed.
//!
//! A folio that cannot be unmapped or moved is retried in later passes and
//! finally given back, its migration entries restored to it. A synchronous
//! migration (move_pages) tries the whole batch asynchronously first and
//! then each folio that failed on its own, without batching its flushes
//! (`migrate_pages_sync`). With the tunable `migrate_batch_flush` off, no
//! pass batches: each cleared PTE is flushed at once (`ptep_clear_flush`),
//! as before v6.3.
//!
//! A fault on a migration entry waits until the entry is gone
//! (`migration_entry_wait`). The rmap walks hold the anon_vma's lock for
//! reading throughout, so that no VMA they find can be unlinked and have
//! its page tables freed under them, and the migration holds a reference
//! to the anon_vma from isolation to the end, so that the walk that puts
//! the PTEs back still can run after the process has unmapped or exited.
//!
//! A PMD-mapped THP is unmapped by a PMD migration entry
//! (`set_pmd_migration_entry`, flushed at once, never batched) and mapped
//! again by a PMD (`remove_migration_pmd`); one whose PMD was split
//! meanwhile (by mprotect, munmap or madvise of part of it) has PTE
//! migration entries by then, and is remapped page by page.
//!
//! A large folio whose destination cannot be allocated is split, unless
//! NUMA balancing moves it, and its pieces migrate after the rest
//! (`try_split_folio`: `thp_migration_split`, counted as one failure).

use crate::errno::{Errno, KResult};
use crate::huge_memory;
use crate::machine::OnCpu;
use crate::migrc::{BatchDeferral, Deferred};
use crate::mm::{AnonVma, Mm, Vma};
use crate::pgtable::swapops::{Migration, MigrationBits, SwpEntry, SwpKind};
use crate::pgtable::{self, Pte, PteLocked, PteRead};
use crate::phys::memmap::pg;
use crate::phys::{AllocFlags, Folio, PhysMem, HPAGE_PMD_NR, HPAGE_PMD_ORDER};
use crate::rmap::{self, RmapFlags};
use crate::rmap_walk::{page_vma_mapped_walk, rmap_walk_anon, AtPmd, PteRun};
use crate::sync::{Arc, Ordering};
use crate::tlbbatch::{TlbflushUnmapBatch, Ttu, TtuFlags};
use crate::vmstat::{Event, MthpStat, NodeStat};

/// `NR_MAX_BATCHED_MIGRATION`: pages unmapped before one flush.
pub const NR_MAX_BATCHED_MIGRATION: u64 = HPAGE_PMD_NR;
/// `NR_MAX_MIGRATE_PAGES_RETRY`: passes of an asynchronous migration.
const NR_MAX_MIGRATE_PAGES_RETRY: usize = 10;
/// `NR_MAX_MIGRATE_ASYNC_RETRY`: passes of a synchronous migration's
/// batched try.
const NR_MAX_MIGRATE_ASYNC_RETRY: usize = 3;
/// `NR_MAX_MIGRATE_SYNC_RETRY`: passes for each folio it then retries.
const NR_MAX_MIGRATE_SYNC_RETRY: usize = 7;

/// `enum migrate_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrateMode {
    /// `MIGRATE_ASYNC`: give up on a folio someone else has locked.
    Async,
    /// `MIGRATE_SYNC`: wait for it.
    Sync,
}

/// `enum migrate_reason`, those the model has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrateReason {
    /// `MR_SYSCALL`: move_pages, mbind.
    Syscall,
    /// `MR_DEMOTION`: reclaim moves a cold folio to a slower tier.
    Demotion,
    /// `MR_NUMA_MISPLACED`: NUMA balancing moves a hot folio closer.
    NumaMisplaced,
}

/// `struct migration_target_control`: where destinations are allocated.
#[derive(Clone, Copy, Debug)]
pub struct MigrationTarget {
    pub nid: usize,
    /// `__GFP_THISNODE`: that node or nothing.
    pub this_node: bool,
    /// `GFP_NOWAIT | __GFP_NOMEMALLOC` (demotion's `alloc_demote_folio`):
    /// no reclaim for the destination, and no reserves.
    pub nowait: bool,
}

/// A folio isolated for migration: off the LRU, with the isolation's
/// reference, and a reference to its anon_vma.
pub struct Isolated {
    pub folio: Folio,
    anon_vma: Arc<AnonVma>,
    /// Whether this isolation counted the folio in `nr_isolated_*` (reclaim
    /// counts its own, and demotion leaves them to it).
    counted: bool,
}

impl Isolated {
    /// A folio reclaim isolated (off the LRU, with the isolation's
    /// reference), for demotion; None if it is no longer mapped.
    pub fn from_lru_isolated(mem: &PhysMem, folio: Folio) -> Option<Isolated> {
        let anon_vma = rmap::folio_get_anon_vma(mem, folio)?;
        Some(Isolated {
            folio,
            anon_vma,
            counted: false,
        })
    }

    /// The folio, still isolated, without the anon_vma reference.
    pub fn into_folio(self) -> Folio {
        self.folio
    }
}

/// `struct migrate_pages_stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MigrateStats {
    /// Pages migrated.
    pub nr_succeeded: u64,
    /// Pages that could not be.
    pub nr_failed_pages: u64,
    pub nr_thp_succeeded: u64,
    pub nr_thp_failed: u64,
    /// THPs split because their destination could not be allocated.
    pub nr_thp_split: u64,
    /// Large folios of any order split so.
    pub nr_split: u64,
}

/// What one [`migrate_pages`] carries through its batches: the counts,
/// whether a large folio whose destination cannot be allocated may be
/// split (not for NUMA balancing: `nosplit`), and the pieces of those
/// split (`split_folios`), migrated after the rest.
struct MigrateRun {
    stats: MigrateStats,
    nosplit: bool,
    split_folios: Vec<Isolated>,
    /// MIGRC may defer this migration's read-only flushes (`do_migrc`: the
    /// tunable, and a demotion or promotion).
    do_migrc: bool,
    reason: MigrateReason,
}

impl MigrateRun {
    /// The model-only event that the shootdowns this migration sends are
    /// counted under as well, by its reason.
    fn flush_account(&self) -> Option<crate::cpu::RemoteFlushAccount> {
        let event = match self.reason {
            MigrateReason::Demotion => Event::MR_DEMOTION_REMOTE_FLUSH,
            MigrateReason::NumaMisplaced => Event::MR_NUMA_MISPLACED_REMOTE_FLUSH,
            MigrateReason::Syscall => return None,
        };
        Some(crate::cpu::RemoteFlushAccount::enter(event))
    }
}

/// What [`migrate_pages`] did: its counts, and the folios it could not
/// migrate (still isolated: the caller puts them back).
pub struct MigrateOutcome {
    pub stats: MigrateStats,
    /// `migrate_pages`' count of failures: the folios in `failed` that were
    /// tried before the pieces of split folios, and each split folio once
    /// (its pieces' own failures are not counted, though they are in
    /// `failed`), as the kernel counts.
    pub nr_failed: usize,
    pub failed: Vec<Isolated>,
    /// A destination could not be allocated (`-ENOMEM`).
    pub nomem: bool,
}

/// A folio unmapped, with its destination (`__migrate_folio_record`).
struct Unmapped {
    src: Isolated,
    dst: Folio,
    was_mapped: bool,
    /// `PAGE_WAS_MLOCKED`: the source was mlocked before it was unmapped.
    was_mlocked: bool,
    /// MIGRC and LUF: whether the flush of its PTEs is owed, and what
    /// becomes of the source once it has moved.
    deferred: Deferred,
}

/// Isolate a mapped `folio` for migration (`folio_isolate_lru`, with the
/// anon_vma reference the migration holds); None if it is on no LRU list
/// (someone else has it, or it waits in a batch) or no longer mapped.
pub fn isolate_for_migration(mem: &PhysMem, folio: Folio) -> Option<Isolated> {
    let anon_vma = rmap::folio_get_anon_vma(mem, folio)?;
    if !crate::swap::folio_isolate_lru(mem, folio) {
        return None;
    }
    mod_isolated(mem, folio, 1);
    Some(Isolated {
        folio,
        anon_vma,
        counted: true,
    })
}

/// `node_stat_mod_folio(NR_ISOLATED_ANON + folio_is_file_lru(folio))`: a
/// lazyfree folio counts as isolated file pages.
fn mod_isolated(mem: &PhysMem, folio: Folio, sign: i64) {
    let item = if folio.head(mem).test(pg::SWAPBACKED) {
        NodeStat::NR_ISOLATED_ANON
    } else {
        NodeStat::NR_ISOLATED_FILE
    };
    mem.mod_node_state(item, sign * folio.nr_pages(mem) as i64);
}

/// `putback_movable_pages`: folios that were not migrated go back onto the
/// LRU, their isolation over.
pub fn putback_movable_pages(oncpu: &OnCpu, folios: Vec<Isolated>) {
    let mem = oncpu.mem();
    for iso in folios {
        let f = iso.folio;
        if iso.counted {
            mod_isolated(mem, f, -1);
        }
        drop(iso.anon_vma);
        crate::swap::folio_putback_lru(mem, f, oncpu.id());
    }
}

/// `migrate_pages`: migrate isolated folios to `target`. If a destination
/// cannot be allocated, a large folio is split and its pieces migrated
/// after the rest (`thp_migration_split`; not for NUMA balancing); if a
/// small one's cannot, the migration stops there (`-ENOMEM`): what was
/// not tried comes back with the failures, uncounted, and the outcome says
/// so.
pub fn migrate_pages(
    oncpu: &OnCpu,
    mut from: Vec<Isolated>,
    target: MigrationTarget,
    mode: MigrateMode,
    reason: MigrateReason,
) -> MigrateOutcome {
    let mem = oncpu.mem();
    let mut run = MigrateRun {
        stats: MigrateStats::default(),
        nosplit: reason == MigrateReason::NumaMisplaced,
        split_folios: Vec::new(),
        do_migrc: (oncpu.m.tunables.migrc() || oncpu.m.tunables.luf())
            && matches!(
                reason,
                MigrateReason::Demotion | MigrateReason::NumaMisplaced
            ),
        reason,
    };
    // Every shootdown the migration sends, counted by its reason as well
    // (a forced MIGRC flush within it, by its own).
    let _account = run.flush_account();
    let mut failed = Vec::new();
    let mut nomem = false;
    let mut counted_failures = None;
    from.reverse();
    loop {
        if from.is_empty() && !nomem && !run.split_folios.is_empty() {
            // The pieces of the folios split for want of memory, their
            // failures not counted (each split folio counts once).
            counted_failures.get_or_insert(failed.len());
            from = std::mem::take(&mut run.split_folios);
            from.reverse();
        }
        if from.is_empty() || nomem {
            break;
        }
        // Up to NR_MAX_BATCHED_MIGRATION pages, and at least one folio.
        let mut batch = Vec::new();
        let mut pages = 0;
        while let Some(iso) = from.pop() {
            pages += iso.folio.nr_pages(mem);
            batch.push(iso);
            if pages >= NR_MAX_BATCHED_MIGRATION {
                break;
            }
        }
        let left = match mode {
            MigrateMode::Async => migrate_pages_batch(
                oncpu,
                batch,
                target,
                MigrateMode::Async,
                NR_MAX_MIGRATE_PAGES_RETRY,
                &mut run,
            ),
            MigrateMode::Sync => migrate_pages_sync(oncpu, batch, target, mode, &mut run),
        };
        nomem = left.nomem;
        failed.extend(left.failed);
        failed.extend(left.untried);
    }
    failed.extend(from);
    let nr_failed = counted_failures.unwrap_or(failed.len()) + run.stats.nr_split as usize;
    failed.append(&mut run.split_folios);
    let stats = run.stats;
    let v = oncpu.vmstat();
    v.count(oncpu.id(), Event::THP_MIGRATION_SPLIT, stats.nr_thp_split);
    v.count(oncpu.id(), Event::PGMIGRATE_SUCCESS, stats.nr_succeeded);
    v.count(oncpu.id(), Event::PGMIGRATE_FAIL, stats.nr_failed_pages);
    v.count(
        oncpu.id(),
        Event::THP_MIGRATION_SUCCESS,
        stats.nr_thp_succeeded,
    );
    v.count(oncpu.id(), Event::THP_MIGRATION_FAIL, stats.nr_thp_failed);
    MigrateOutcome {
        stats,
        nr_failed,
        failed,
        nomem,
    }
}

/// What one batch left: the folios that failed (counted), those never
/// tried because a destination could not be allocated (not counted), and
/// whether that happened.
struct BatchLeft {
    failed: Vec<Isolated>,
    untried: Vec<Isolated>,
    nomem: bool,
}

/// `migrate_pages_sync`: the batch asynchronously first (its flushes
/// batched), then each folio that failed alone, synchronously; an
/// allocation failure ends it.
fn migrate_pages_sync(
    oncpu: &OnCpu,
    batch: Vec<Isolated>,
    target: MigrationTarget,
    mode: MigrateMode,
    run: &mut MigrateRun,
) -> BatchLeft {
    // The asynchronous pass counts its failures apart: those it leaves are
    // tried again below, and count there.
    let mut arun = MigrateRun {
        stats: MigrateStats::default(),
        nosplit: run.nosplit,
        split_folios: Vec::new(),
        do_migrc: run.do_migrc,
        reason: run.reason,
    };
    let mut left = migrate_pages_batch(
        oncpu,
        batch,
        target,
        MigrateMode::Async,
        NR_MAX_MIGRATE_ASYNC_RETRY,
        &mut arun,
    );
    run.split_folios.append(&mut arun.split_folios);
    let (stats, astats) = (&mut run.stats, arun.stats);
    stats.nr_succeeded += astats.nr_succeeded;
    stats.nr_thp_succeeded += astats.nr_thp_succeeded;
    stats.nr_thp_split += astats.nr_thp_split;
    stats.nr_split += astats.nr_split;
    if left.nomem {
        stats.nr_failed_pages += astats.nr_failed_pages;
        stats.nr_thp_failed += astats.nr_thp_failed;
        return left;
    }
    // The folios it split count as failed THPs here; the others are tried
    // again below, and count there.
    stats.nr_thp_failed += astats.nr_thp_split;
    let mut out = BatchLeft {
        failed: Vec::new(),
        untried: Vec::new(),
        nomem: false,
    };
    let mut todo = std::mem::take(&mut left.failed).into_iter();
    while let Some(iso) = todo.next() {
        let one = migrate_pages_batch(
            oncpu,
            vec![iso],
            target,
            mode,
            NR_MAX_MIGRATE_SYNC_RETRY,
            run,
        );
        out.failed.extend(one.failed);
        out.untried.extend(one.untried);
        if one.nomem {
            out.nomem = true;
            out.untried.extend(todo);
            break;
        }
    }
    out
}

/// `migrate_pages_batch`: unmap the batch, flush once, move each folio.
fn migrate_pages_batch(
    oncpu: &OnCpu,
    mut from: Vec<Isolated>,
    target: MigrationTarget,
    mode: MigrateMode,
    nr_pass: usize,
    run: &mut MigrateRun,
) -> BatchLeft {
    let mem = oncpu.mem();
    let flags = TtuFlags {
        batch_flush: mode == MigrateMode::Async && oncpu.m.tunables.migrate_batch_flush(),
        split_huge_pmd: false,
    };
    let mut ubc = TlbflushUnmapBatch::new();
    // MIGRC and LUF: which of the batch's flushes are owed rather than made.
    let mut defer = BatchDeferral::new(oncpu, run.do_migrc, flags.batch_flush, &mut ubc);
    let mut failed = Vec::new();
    let mut untried = Vec::new();
    let mut nomem = false;
    let mut unmapped: Vec<Unmapped> = Vec::new();
    'unmap: for _ in 0..nr_pass {
        let mut retry = Vec::new();
        let mut todo = std::mem::take(&mut from).into_iter();
        while let Some(iso) = todo.next() {
            defer.unmap_begin(oncpu, &mut ubc, iso.folio);
            let r = migrate_folio_unmap(oncpu, iso, target, mode, flags, &mut ubc);
            let deferred = defer.unmap_end(oncpu, &mut ubc, matches!(r, Unmap::Unmapped(_)));
            match r {
                Unmap::Unmapped(mut u) => {
                    u.deferred = deferred;
                    unmapped.push(u);
                }
                Unmap::Done { nr, thp } => {
                    run.stats.nr_succeeded += nr;
                    run.stats.nr_thp_succeeded += thp as u64;
                }
                Unmap::Again(iso) => retry.push(iso),
                Unmap::NoMem(iso) => {
                    let thp = iso.folio.order(mem) == HPAGE_PMD_ORDER;
                    let iso = if iso.folio.is_large(mem) && !run.nosplit {
                        // Counted as one failure, and its pieces tried
                        // after the rest.
                        match try_split_folio(oncpu, iso, mode) {
                            Ok(mut pieces) => {
                                run.stats.nr_thp_failed += thp as u64;
                                run.stats.nr_thp_split += thp as u64;
                                run.stats.nr_split += 1;
                                run.split_folios.append(&mut pieces);
                                continue;
                            }
                            Err(iso) => iso,
                        }
                    } else {
                        iso
                    };
                    // No destination: this one and those waiting for
                    // another pass fail; the rest are not tried. What is
                    // unmapped already still moves.
                    failed.push(iso);
                    failed.append(&mut retry);
                    untried.extend(todo);
                    nomem = true;
                    break 'unmap;
                }
            }
        }
        from = retry;
        if from.is_empty() {
            break;
        }
    }
    failed.append(&mut from);
    defer.settle(
        oncpu,
        &mut ubc,
        unmapped.iter_mut().map(|u| &mut u.deferred),
    );
    // One flush for every PTE the batch cleared (but those owed): no CPU
    // may write a source page once its copy has begun.
    ubc.flush(oncpu);
    let mut kept = Vec::new();
    for _ in 0..nr_pass {
        let mut retry = Vec::new();
        for u in unmapped {
            let nr = u.src.folio.nr_pages(mem);
            let thp = u.src.folio.order(mem) == HPAGE_PMD_ORDER;
            match migrate_folio_move(oncpu, u) {
                Ok(k) => {
                    kept.extend(k);
                    run.stats.nr_succeeded += nr;
                    run.stats.nr_thp_succeeded += thp as u64;
                }
                Err(u) => retry.push(u),
            }
        }
        unmapped = retry;
        if unmapped.is_empty() {
            break;
        }
    }
    crate::migrc::migrc_add_pending_folios(oncpu, kept);
    for u in unmapped {
        failed.push(migrate_folio_undo(oncpu, u));
    }
    for iso in &failed {
        run.stats.nr_failed_pages += iso.folio.nr_pages(mem);
        run.stats.nr_thp_failed += (iso.folio.order(mem) == HPAGE_PMD_ORDER) as u64;
    }
    BatchLeft {
        failed,
        untried,
        nomem,
    }
}

/// What unmapping one folio came to.
enum Unmap {
    Unmapped(Unmapped),
    /// Freed from under the migration (its pages count as migrated).
    Done {
        nr: u64,
        thp: bool,
    },
    /// Locked by someone else, or still mapped somewhere: try again.
    Again(Isolated),
    /// No destination could be allocated.
    NoMem(Isolated),
}

/// `migrate_folio_unmap`.
fn migrate_folio_unmap(
    oncpu: &OnCpu,
    iso: Isolated,
    target: MigrationTarget,
    mode: MigrateMode,
    flags: TtuFlags,
    ubc: &mut TlbflushUnmapBatch,
) -> Unmap {
    let mem = oncpu.mem();
    let src = iso.folio;
    let nr = src.nr_pages(mem);
    if src.ref_count(mem) == 1 {
        // Only the isolation holds it: it was unmapped meanwhile.
        let thp = src.order(mem) == HPAGE_PMD_ORDER;
        src.head(mem).clear(pg::ACTIVE);
        migrate_folio_done(oncpu, iso);
        return Unmap::Done { nr, thp };
    }
    let gfp = AllocFlags {
        this_node: target.this_node,
        no_direct_reclaim: target.nowait,
        no_memalloc: target.nowait,
        ..AllocFlags::NONE
    };
    let Some(dst) = mem.folio_alloc(target.nid, src.order(mem), oncpu.id(), gfp) else {
        return Unmap::NoMem(iso);
    };
    // Locked until its PTEs are in place: once on the LRU it could be
    // isolated by another migration, which must wait (or give up).
    let locked = dst.trylock(mem);
    debug_assert!(locked, "a new folio is locked");
    if !src.trylock(mem) {
        if mode == MigrateMode::Async {
            dst.unlock(mem);
            dst.put(mem, oncpu.id());
            return Unmap::Again(iso);
        }
        while !src.trylock(mem) {
            std::thread::yield_now();
        }
    }
    let was_mlocked = src.head(mem).test(pg::MLOCKED);
    let was_mapped = src.mapped(mem);
    if was_mapped {
        try_to_migrate(oncpu, &iso, flags, ubc);
    }
    if !src.mapped(mem) {
        return Unmap::Unmapped(Unmapped {
            src: iso,
            dst,
            was_mapped,
            was_mlocked,
            deferred: Deferred::No,
        });
    }
    // Some mapping could not be replaced: put back what was.
    if was_mapped {
        // The queued flushes of the PTEs restored stay queued: a stale
        // translation to the same page is harmless.
        remove_migration_ptes(oncpu, &iso, src, false);
    }
    src.unlock(mem);
    dst.unlock(mem);
    dst.put(mem, oncpu.id());
    Unmap::Again(iso)
}

/// `migrate_folio_move`: copy, hand over, remap; the source is freed, or,
/// with its flush owed (MIGRC), kept and returned. On failure (someone
/// still holds a reference to the source) the folio stays unmapped for
/// another pass.
fn migrate_folio_move(oncpu: &OnCpu, u: Unmapped) -> Result<Option<Folio>, Unmapped> {
    let mem = oncpu.mem();
    let (src, dst) = (u.src.folio, u.dst);
    if move_to_new_folio(mem, dst, src).is_err() {
        return Err(u);
    }
    crate::swap::folio_add_lru(mem, dst, oncpu.id());
    // The destination on the LRU now, so that the mlocks of its mappings
    // (remove_migration_pte) count up its mlock_count again.
    if u.was_mlocked {
        crate::swap::lru_add_drain(mem, oncpu.id());
    }
    if u.was_mapped {
        remove_migration_ptes(oncpu, &u.src, dst, false);
    }
    dst.unlock(mem);
    // The allocation's reference: the PTEs hold their own.
    dst.put(mem, oncpu.id());
    src.unlock(mem);
    // MIGRC keeps the source until the owed flush is done; LUF frees it
    // stamped with that flush.
    let kept = crate::migrc::source_moved(oncpu, src, u.deferred);
    migrate_folio_done(oncpu, u.src);
    Ok(kept)
}

/// A folio unmapped but never moved: its migration entries point to it
/// again, and its destination goes.
fn migrate_folio_undo(oncpu: &OnCpu, u: Unmapped) -> Isolated {
    let mem = oncpu.mem();
    if u.was_mapped {
        remove_migration_ptes(oncpu, &u.src, u.src.folio, false);
    }
    u.src.folio.unlock(mem);
    u.dst.unlock(mem);
    u.dst.put(mem, oncpu.id());
    u.src
}

/// `migrate_folio_done`: the isolation is over; its reference is the
/// source's last.
fn migrate_folio_done(oncpu: &OnCpu, iso: Isolated) {
    let mem = oncpu.mem();
    let f = iso.folio;
    if iso.counted {
        mod_isolated(mem, f, -1);
    }
    drop(iso.anon_vma);
    f.put(mem, oncpu.id());
}

/// `try_split_folio` (`split_folio_to_list`): split an isolated large
/// folio whose destination could not be allocated into order-0 folios,
/// each isolated, for the caller to migrate after the rest. As the kernel
/// does, the folio is first unmapped through the rmap (PTE migration
/// entries, their flushes batched; a PMD mapping is split into PTEs first,
/// `TTU_SPLIT_HUGE_PMD`), split once only the isolation holds it
/// (`can_split_folio`), and each page mapped back as a folio of its own.
/// Err: locked by someone else (asynchronous mode), or held beyond its
/// mappings (then mapped back whole).
fn try_split_folio(
    oncpu: &OnCpu,
    iso: Isolated,
    mode: MigrateMode,
) -> Result<Vec<Isolated>, Isolated> {
    let mem = oncpu.mem();
    let folio = iso.folio;
    if !folio.trylock(mem) {
        if mode == MigrateMode::Async {
            return Err(iso);
        }
        while !folio.trylock(mem) {
            std::thread::yield_now();
        }
    }
    // unmap_folio: the flushes batched, one for the folio.
    let flags = TtuFlags {
        batch_flush: true,
        split_huge_pmd: true,
    };
    let mut ubc = TlbflushUnmapBatch::new();
    if folio.mapped(mem) {
        try_to_migrate(oncpu, &iso, flags, &mut ubc);
    }
    ubc.flush(oncpu);
    if folio.mapped(mem) || folio.ref_count(mem) != 1 {
        remove_migration_ptes(oncpu, &iso, folio, false);
        folio.unlock(mem);
        return Err(iso);
    }
    let nr = folio.nr_pages(mem);
    let unmapped = huge_memory::split_folio_pages(oncpu, folio);
    debug_assert_eq!(unmapped.len() as u64, nr, "an unmapped folio's pages");
    let pieces: Vec<Isolated> = unmapped
        .into_iter()
        .map(|pfn| {
            // The isolation's reference, one for each piece.
            mem.page(pfn).refcount.store(1, Ordering::Relaxed);
            Isolated {
                folio: Folio(pfn),
                anon_vma: iso.anon_vma.clone(),
                counted: iso.counted,
            }
        })
        .collect();
    for p in &pieces {
        remove_migration_ptes(oncpu, p, p.folio, true);
        p.folio.unlock(mem);
    }
    Ok(pieces)
}

/// `split_folio` of an anon folio wherever it is mapped (`__folio_split`
/// to order 0), as madvise asks for one it covers in part: the caller holds
/// the folio's lock and a reference, and no page-table lock. The folio is
/// unmapped through the rmap (PTE migration entries in every VMA that maps
/// it, a PMD split first), split once only the caller's reference holds
/// it (`can_split_folio`), and each page mapped back as a folio of its own,
/// or to the shared zero page if it holds only zeroes (`remap_page` with
/// `RMP_USE_SHARED_ZEROPAGE`, v6.12). The first page's folio stays locked
/// and held for the caller; the others are unlocked, and freed if nothing
/// maps them. Err (EAGAIN): held beyond its mappings (a per-CPU batch, a
/// pin), mapped back whole.
pub fn split_anon_folio(oncpu: &OnCpu, folio: Folio) -> KResult<()> {
    let mem = oncpu.mem();
    let order = folio.order(mem);
    debug_assert!(order > 0 && folio.test_anon(mem));
    let failed = || {
        mem.vmstat.mod_mthp(order, MthpStat::SPLIT_FAILED, 1);
        if order == HPAGE_PMD_ORDER {
            oncpu
                .vmstat()
                .count(oncpu.id(), Event::THP_SPLIT_PAGE_FAILED, 1);
        }
        Err(Errno::EAGAIN)
    };
    let Some(anon_vma) = rmap::folio_get_anon_vma(mem, folio) else {
        return failed();
    };
    let iso = Isolated {
        folio,
        anon_vma,
        counted: false,
    };
    // unmap_folio: the flushes batched, one for the folio.
    let flags = TtuFlags {
        batch_flush: true,
        split_huge_pmd: true,
    };
    let mut ubc = TlbflushUnmapBatch::new();
    try_to_migrate(oncpu, &iso, flags, &mut ubc);
    ubc.flush(oncpu);
    if folio.mapped(mem) || folio.ref_count(mem) != 1 {
        remove_migration_ptes(oncpu, &iso, folio, false);
        return failed();
    }
    let pieces = huge_memory::split_folio_pages(oncpu, folio);
    debug_assert_eq!(pieces.len() as u64, 1 << order, "an unmapped folio's pages");
    for &pfn in &pieces {
        // The caller's reference, one for each piece until it is mapped
        // back.
        mem.page(pfn).refcount.store(1, Ordering::Relaxed);
    }
    for &pfn in &pieces {
        let piece = Isolated {
            folio: Folio(pfn),
            anon_vma: iso.anon_vma.clone(),
            counted: false,
        };
        remove_migration_ptes(oncpu, &piece, piece.folio, true);
        if !piece.folio.mapped(mem) {
            // Freed when its last reference goes, as a page no one maps.
            mem.page(pfn).mapping.store(0, Ordering::Relaxed);
        }
    }
    for &pfn in &pieces[1..] {
        Folio(pfn).unlock(mem);
        Folio(pfn).put(mem, oncpu.id());
    }
    Ok(())
}

/// `move_to_new_folio` for an anonymous folio (`migrate_folio`): copy the
/// pages, then check that only the isolation holds the source (the
/// kernel's `__folio_migrate_mapping` with no mapping: no freeze, as
/// nothing can take a new reference to an unmapped, isolated anon folio),
/// then give the destination the source's identity and flags.
fn move_to_new_folio(mem: &PhysMem, dst: Folio, src: Folio) -> KResult<()> {
    let nr = src.nr_pages(mem);
    for i in 0..nr {
        mem.copy_page(dst.pfn() + i, src.pfn() + i);
    }
    if src.ref_count(mem) != 1 {
        return Err(Errno::EAGAIN);
    }
    let (s, d) = (src.head(mem), dst.head(mem));
    d.mapping
        .store(s.mapping.load(Ordering::Relaxed), Ordering::Relaxed);
    d.index
        .store(s.index.load(Ordering::Relaxed), Ordering::Relaxed);
    // folio_migrate_flags.
    let kept = s.flags.load(Ordering::Relaxed)
        & (pg::SWAPBACKED | pg::LAZYFREE | pg::DIRTY | pg::REFERENCED);
    d.set(kept);
    if s.test_and_clear(pg::ACTIVE) {
        d.set(pg::ACTIVE);
    } else if s.test_and_clear(pg::UNEVICTABLE) {
        // lru_add rescues it (it is not mlocked until remapped).
        d.set(pg::UNEVICTABLE);
    }
    if src.test_anon(mem) && src.order(mem) > 1 {
        mem.vmstat.mod_mthp(src.order(mem), MthpStat::NR_ANON, 1);
    }
    Ok(())
}

/// `try_to_migrate`: replace every PTE that maps the folio by a migration
/// entry. Any that cannot be reached (a table being freed) stays, and the
/// caller sees the folio still mapped.
fn try_to_migrate(oncpu: &OnCpu, iso: &Isolated, flags: TtuFlags, ubc: &mut TlbflushUnmapBatch) {
    let mem = oncpu.mem();
    let folio = iso.folio;
    rmap_walk_anon(oncpu, folio, &iso.anon_vma, |mm, vma| {
        // A THP mapped by a PMD gets a PMD migration entry, or is split
        // first (TTU_SPLIT_HUGE_PMD) and migrated by its PTEs.
        let at_pmd = |slot, run: PteRun| {
            let pmd = mm.pmd_get(slot);
            if pmd.trans_huge() && pmd.pfn() == folio.pfn() {
                if flags.split_huge_pmd {
                    huge_memory::split_huge_pmd(oncpu, mm, slot, run.addr);
                } else if huge_memory::set_pmd_migration_entry(
                    oncpu, mm, vma, slot, run.addr, folio,
                ) {
                    return AtPmd::Done;
                }
            }
            AtPmd::Ptes
        };
        let mut ttu = Ttu {
            flags,
            ubc: &mut *ubc,
        };
        page_vma_mapped_walk(mem, mm, vma, folio, at_pmd, |pt, i, addr| {
            try_to_migrate_one(oncpu, (mm, vma), pt, folio, (i, addr), &mut ttu);
            true
        });
        folio.mapped(mem)
    });
}

/// `try_to_migrate_one` for page `i` of `folio`, which the locked table
/// `pt` of `mm` may map at `addr`.
fn try_to_migrate_one(
    oncpu: &OnCpu,
    (mm, vma): (&Arc<Mm>, &Vma),
    pt: &mut PteLocked<'_>,
    folio: Folio,
    (i, addr): (u64, u64),
    ttu: &mut Ttu<'_>,
) {
    let mem = oncpu.mem();
    let page = folio.pfn() + i;
    let idx = pgtable::pte_index(addr);
    let pte = pt.pte(idx);
    if !pte.present() || pte.special() || pte.pfn() != page {
        return;
    }
    // Nuke the entry: queue its flush, or flush it now.
    let pteval = pt.get_and_clear(idx);
    ttu.flush_cleared_pte(oncpu, mm, pteval, addr);
    if pteval.dirty() {
        folio.head(mem).set(pg::DIRTY);
    }
    mm.update_hiwater_rss();
    let bits = MigrationBits {
        write: pteval.write(),
        exclusive: rmap::folio_try_share_anon_rmap(mem, page),
        young: pteval.young(),
        dirty: pteval.dirty(),
    };
    let ad = oncpu.m.tunables.migration_entry_ad();
    let mut swp = SwpEntry::make_migration_entry(page, bits, ad).to_pte();
    if pteval.soft_dirty() {
        swp = swp.swp_mksoft_dirty();
    }
    pt.set(idx, swp);
    rmap::folio_remove_rmap_ptes(mem, folio, page, 1, mm.id, oncpu.id());
    crate::mlock::munlock_vma_folio(mem, folio, vma.flags(), oncpu.id());
    // The munlock must not leave the batch a reference that would fail
    // the migration's count.
    if vma.flags() & crate::mm::vma::VM_LOCKED != 0 {
        crate::mlock::mlock_drain_local(mem, oncpu.id());
    }
    // The mapping's reference; the isolation's keeps the folio.
    folio.put(mem, oncpu.id());
}

/// `remove_migration_ptes`: where a migration entry of `src` stands, map
/// the same page of `dst` (the destination, or `src` itself when a
/// migration is undone), with the entry's write, young and dirty bits and
/// its exclusivity.
///
/// After a split (`zeropage`), a page that holds only zeroes is mapped to
/// the shared zero page instead ([`try_to_map_unused_to_zeropage`]).
fn remove_migration_ptes(oncpu: &OnCpu, src: &Isolated, dst: Folio, zeropage: bool) {
    let mem = oncpu.mem();
    let from = src.folio;
    rmap_walk_anon(oncpu, from, &src.anon_vma, |mm, vma| {
        let at_pmd = |slot, _| {
            if mm.pmd_get(slot).is_migration()
                && huge_memory::remove_migration_pmd(oncpu, mm, slot, vma, from.pfn(), dst)
            {
                AtPmd::Done
            } else {
                AtPmd::Ptes
            }
        };
        page_vma_mapped_walk(mem, mm, vma, from, at_pmd, |pt, i, addr| {
            let (old, new) = (from.pfn() + i, dst.pfn() + i);
            if !(zeropage && try_to_map_unused_to_zeropage(oncpu, (mm, vma), pt, old, addr)) {
                remove_migration_pte(oncpu, pt, vma, old, new, addr);
            }
            true
        });
        true
    });
}

/// `try_to_map_unused_to_zeropage`: where a migration entry of `page`
/// stands at `addr` after a split, map the shared zero page instead if the
/// page holds only zeroes, neither it nor its VMA is locked; its RSS goes
/// (the page is freed when the split lets go of it).
fn try_to_map_unused_to_zeropage(
    oncpu: &OnCpu,
    (mm, vma): (&Arc<Mm>, &Vma),
    pt: &mut PteLocked<'_>,
    page: u64,
    addr: u64,
) -> bool {
    let mem = oncpu.mem();
    let idx = pgtable::pte_index(addr);
    let orig = pt.pte(idx);
    if !orig.is_swap() {
        return false;
    }
    let SwpKind::Migration { pfn, .. } = orig.swp_entry().kind() else {
        return false;
    };
    let folio = mem.page_folio(page);
    if pfn != page
        || folio.is_large(mem)
        || folio.head(mem).test(pg::MLOCKED)
        || vma.flags() & crate::mm::vma::VM_LOCKED != 0
        || !mem.page_is_zero(page)
    {
        return false;
    }
    let mut zero = Pte::new(oncpu.m.zero_pfn, vma.page_prot()).mkspecial();
    if orig.swp_soft_dirty() {
        zero = zero.mksoft_dirty();
    }
    // No flush: the entry was not present.
    pt.set(idx, zero);
    mm.add_rss(crate::mm::MmCounter::AnonPages, -1);
    true
}

/// `remove_migration_pte` for one address of the locked table `pt`.
fn remove_migration_pte(
    oncpu: &OnCpu,
    pt: &mut PteLocked<'_>,
    vma: &Vma,
    old: u64,
    new: u64,
    addr: u64,
) {
    let mem = oncpu.mem();
    let idx = pgtable::pte_index(addr);
    let orig = pt.pte(idx);
    if !orig.is_swap() {
        return;
    }
    let SwpKind::Migration {
        kind,
        pfn,
        young,
        dirty,
    } = orig.swp_entry().kind()
    else {
        return;
    };
    if pfn != old {
        return;
    }
    let folio = mem.page_folio(new);
    folio.get(mem);
    let mut pte = Pte::new(new, vma.page_prot());
    pte = if young { pte.mkyoung() } else { pte.mkold() };
    if dirty && folio.head(mem).test(pg::DIRTY) {
        pte = pte.mkdirty();
    }
    pte = if orig.swp_soft_dirty() {
        pte.mksoft_dirty()
    } else {
        pte.clear_soft_dirty()
    };
    if kind == Migration::Write {
        pte = pte.mkwrite();
    }
    let flags = if kind == Migration::Read {
        RmapFlags::NONE
    } else {
        RmapFlags::EXCLUSIVE
    };
    rmap::folio_add_anon_rmap_ptes(mem, folio, new, 1, vma.mm_id, flags);
    if !folio.is_large(mem) {
        crate::mlock::mlock_vma_folio(mem, folio, vma.flags(), oncpu.id());
    }
    if vma.flags() & crate::mm::vma::VM_LOCKED != 0 {
        crate::mlock::mlock_drain_local(mem, oncpu.id());
    }
    // No flush: the entry was not present.
    pt.set(idx, pte);
}

/// `migrate_misplaced_folio`: promote (or move) an isolated folio to
/// `nid` for NUMA balancing (`MR_NUMA_MISPLACED`, asynchronous, the
/// destination allocated without reclaim); counts `numa_pages_migrated`,
/// and `pgpromote_success` when it left a slower tier for the top one.
/// False if it stayed (put back on the LRU).
pub fn migrate_misplaced_folio(oncpu: &OnCpu, iso: Isolated, nid: usize) -> bool {
    let mem = oncpu.mem();
    let from = iso.folio.nid();
    let out = migrate_pages(
        oncpu,
        vec![iso],
        MigrationTarget {
            nid,
            this_node: true,
            nowait: true,
        },
        MigrateMode::Async,
        MigrateReason::NumaMisplaced,
    );
    let moved = out.stats.nr_succeeded;
    putback_movable_pages(oncpu, out.failed);
    if moved > 0 {
        oncpu
            .vmstat()
            .count(oncpu.id(), Event::NUMA_PAGE_MIGRATE, moved);
        if mem.nodes[from].tier != mem.nodes[nid].tier {
            mem.mod_node_state(NodeStat::PGPROMOTE_SUCCESS, moved as i64);
        }
    }
    moved > 0
}

/// What `move_pages(2)` found for one page.
pub type PageStatus = i32;

/// `move_pages(2)` for the calling process: with `nodes`, move each page
/// of `pages` to its node and return how many could not be moved, each
/// page's status (its node, or a negative errno) in `status`; without,
/// only report where each page is. A node that does not exist fails the
/// whole call (ENODEV), as one without memory does in the kernel. A page
/// another process maps too is refused (EACCES) unless `move_all`
/// (`MPOL_MF_MOVE_ALL`, which the kernel grants with CAP_SYS_NICE).
pub fn kernel_move_pages(
    oncpu: &OnCpu,
    pages: &[u64],
    nodes: Option<&[i32]>,
    status: &mut [PageStatus],
    move_all: bool,
) -> KResult<usize> {
    let mm = oncpu.mm()?;
    let mem = oncpu.mem();
    if status.len() != pages.len() || nodes.is_some_and(|n| n.len() != pages.len()) {
        return Err(Errno::EINVAL);
    }
    let Some(nodes) = nodes else {
        for (s, &addr) in status.iter_mut().zip(pages) {
            *s = match folio_at(oncpu, &mm, addr, |_, f, _| Ok(f.nid() as i32)) {
                Ok(n) => n,
                Err(e) => -e.0,
            };
        }
        return Ok(0);
    };
    let _batching_off = crate::swap::lru_cache_disable(mem, oncpu.id());
    do_pages_move(oncpu, &mm, pages, nodes, status, move_all)
}

/// `do_pages_move`: pages bound for one node are queued together, and the
/// queue is migrated when the node changes or a page is not queued (it is
/// there already, or cannot be moved: its status says why). A migration
/// that leaves pages behind ends the call, which returns how many pages
/// were not moved, counting those not yet tried; a node without memory
/// ends it with ENODEV, once what was queued has moved.
fn do_pages_move(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    pages: &[u64],
    nodes: &[i32],
    status: &mut [PageStatus],
    move_all: bool,
) -> KResult<usize> {
    let nr_pages = pages.len();
    let mut queue = MoveQueue {
        node: None,
        start: 0,
        list: Vec::new(),
    };
    for i in 0..nr_pages {
        let Some(node) = usize::try_from(nodes[i])
            .ok()
            .filter(|&n| n < oncpu.mem().nodes.len())
        else {
            queue.flush(oncpu, status, i, nr_pages)?;
            return Err(Errno::ENODEV);
        };
        match queue.node {
            None => {
                queue.node = Some(node);
                queue.start = i;
            }
            Some(n) if n != node => {
                let left = queue.flush(oncpu, status, i, nr_pages)?;
                if left > 0 {
                    return Ok(left);
                }
                queue.node = Some(node);
                queue.start = i;
            }
            Some(_) => {}
        }
        match add_folio_for_migration(oncpu, mm, pages[i], node, move_all) {
            Ok(Some(iso)) => {
                queue.list.push(iso);
                continue;
            }
            Ok(None) => status[i] = node as i32,
            Err(e) => status[i] = -e.0,
        }
        let left = queue.flush(oncpu, status, i, nr_pages)?;
        if left > 0 {
            // Page i is counted already.
            return Ok(left - 1);
        }
        queue.node = None;
    }
    queue.flush(oncpu, status, nr_pages, nr_pages)
}

/// The pages queued for one node by [`do_pages_move`]: those of
/// `status[start..]`.
struct MoveQueue {
    node: Option<usize>,
    start: usize,
    list: Vec<Isolated>,
}

impl MoveQueue {
    /// `move_pages_and_store_status`: migrate the queue; if everything
    /// moved, pages `start..i` say the node, else the count of pages not
    /// moved, with those from `i` on not yet tried.
    fn flush(
        &mut self,
        oncpu: &OnCpu,
        status: &mut [PageStatus],
        i: usize,
        nr_pages: usize,
    ) -> KResult<usize> {
        let (Some(node), false) = (self.node, self.list.is_empty()) else {
            return Ok(0);
        };
        let target = MigrationTarget {
            nid: node,
            this_node: true,
            nowait: false,
        };
        let list = std::mem::take(&mut self.list);
        let out = migrate_pages(
            oncpu,
            list,
            target,
            MigrateMode::Sync,
            MigrateReason::Syscall,
        );
        let failed = out.nr_failed;
        putback_movable_pages(oncpu, out.failed);
        if failed > 0 {
            return Ok(failed + nr_pages - i);
        }
        for s in &mut status[self.start..i] {
            *s = node as i32;
        }
        Ok(0)
    }
}

/// `add_folio_for_migration`: the folio mapped at `addr`, isolated for
/// migration to `node`; None if it is there already.
fn add_folio_for_migration(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    addr: u64,
    node: usize,
    move_all: bool,
) -> KResult<Option<Isolated>> {
    let mem = oncpu.mem();
    folio_at(oncpu, mm, addr, |mem_, folio, _| {
        if folio.nid() == node {
            return Ok(None);
        }
        if !move_all && rmap::folio_maybe_mapped_shared(mem_, folio) {
            return Err(Errno::EACCES);
        }
        isolate_for_migration(mem, folio)
            .map(Some)
            .ok_or(Errno::EBUSY)
    })
}

/// `folio_walk_start` under mmap_lock for reading: call `f` with the
/// folio mapped at `addr`, the lock of its table held. EFAULT if no VMA
/// covers `addr`, ENOENT if nothing is mapped there, EFAULT if the zero
/// page is (both `do_pages_stat` and `add_folio_for_migration` find it
/// with `FW_ZEROPAGE` and refuse it, as the host does).
fn folio_at<R>(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    addr: u64,
    f: impl FnOnce(&PhysMem, Folio, u64) -> KResult<R>,
) -> KResult<R> {
    let mem = oncpu.mem();
    let _g = mm.mmap_lock.read();
    {
        let guard = crate::sync::epoch::pin();
        if mm.vma_tree(&guard).vma_lookup(addr).is_none() {
            return Err(Errno::EFAULT);
        }
    }
    let slot = mm.pmd_lookup(addr).ok_or(Errno::ENOENT)?;
    let pmd = mm.pmd_get(slot);
    if pmd.trans_huge() {
        let ptl = mm.pmd_lock(slot);
        let pmd = ptl.get();
        if !pmd.trans_huge() {
            return Err(Errno::ENOENT);
        }
        if oncpu.m.is_huge_zero_pfn(pmd.pfn()) {
            return Err(Errno::EFAULT);
        }
        let r = f(mem, Folio(pmd.pfn()), addr);
        drop(ptl);
        return r;
    }
    let pt = mm.pte_offset_map_lock(slot).ok_or(Errno::ENOENT)?;
    let pte = pt.pte(pgtable::pte_index(addr));
    if !pte.present() {
        return Err(Errno::ENOENT);
    }
    if pte.special() {
        return Err(Errno::EFAULT);
    }
    let r = f(mem, mem.page_folio(pte.pfn()), addr);
    drop(pt);
    r
}
