//! Model-checked PT reclaim (upstream design) against a racing page fault,
//! running the engine's own page-table code.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p usermm --test
//! loom_pt_reclaim` (`.ci/run` does). Built so, every page-table lock
//! (`SpinLock`) is loom's, and loom runs the model under every
//! interleaving of the two threads at those locks (up to a preemption
//! bound).
//!
//! The model: one PTE table maps three pages. CPU 0 runs the shape of
//! `zap_pte_range` with PT reclaim over the table's whole range, using the
//! engine's guards (`pte_offset_map_lock`, `get_and_clear`) and its
//! [`ReclaimPt`]: it zaps two entries, drops the PTE lock as a full gather
//! makes it do (`force_break`), retakes it and zaps the rest, then frees the
//! table by the fast or the slow path. CPU 1 faults on the first page, as
//! `do_anonymous_page` does: `pte_alloc`, `pte_offset_map_lock` (which
//! rechecks the PMD under the lock and fails if the table went), and an
//! entry set if it is still none. This is the interleaving fixed in Feb
//! 2025: the fault refills an entry already zapped while the zap's lock is
//! dropped. The properties: a table that the zap frees maps nothing, and
//! the fault's page is mapped afterwards through the table the PMD points
//! to. The same model with the old rule (the fast path after a dropped
//! lock) must be caught. The zap's loop is the test's own, in
//! `zap_pte_range`'s shape; the reclaim decisions and every table access
//! are the engine's.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use loom::thread;
use usermm::pgtable::{Pgprot, PmdSlot, Pte, PteRead, Tracking, PTRS_PER_TABLE};
use usermm::phys::PhysMem;
use usermm::pt_reclaim::{ReclaimPath, ReclaimPt};

#[path = "common/one_table.rs"]
mod one_table;
use one_table::one_pte_table;

const ADDR: u64 = 0x7f00_0000_0000;
/// Entries the table maps before the zap.
const MAPPED: usize = 3;
/// Where the zap drops the PTE lock: after this many entries.
const BREAK_AT: usize = 2;
/// The page the fault maps at index 0.
const FAULT_PFN: u64 = 900;

fn mapped_pte(pfn: u64) -> Pte {
    Pte::new(pfn, Pgprot::READONLY)
}

/// A machine's memory with one PTE table mapping `MAPPED` pages at `ADDR`.
fn world() -> (Arc<PhysMem>, PmdSlot) {
    let (mem, slot) = one_pte_table(ADDR);
    {
        let mut pt = slot.pte_offset_map_lock(&mem).expect("table");
        for i in 0..MAPPED {
            pt.set(i, mapped_pte(100 + i as u64));
        }
    }
    (mem, slot)
}

/// CPU 0: the zap of the table's whole range with PT reclaim, breaking
/// once after `break_at` entries if asked. Returns how it freed the table,
/// if it did, and asserts that what it freed maps nothing.
fn zap(mem: &PhysMem, slot: PmdSlot, break_at: Option<usize>, broken: bool) -> Option<ReclaimPath> {
    let mut reclaim = ReclaimPt::new(true);
    if broken {
        reclaim.break_lock_drop_rule();
    }
    let mut idx = 0;
    let mut broke = false;
    loop {
        let mut pt = slot.pte_offset_map_lock(mem)?;
        while idx < PTRS_PER_TABLE {
            if !pt.pte(idx).none() {
                pt.get_and_clear(idx);
            }
            idx += 1;
            if Some(idx) == break_at && !broke {
                // The gather filled: flush, and drop the lock to do it.
                broke = true;
                reclaim.lock_dropped();
                break;
            }
        }
        if idx == PTRS_PER_TABLE {
            reclaim.table_done(&pt, slot);
        }
        drop(pt);
        if idx == PTRS_PER_TABLE {
            break;
        }
    }
    let (table, path) = reclaim.finish(mem, slot)?;
    for i in 0..PTRS_PER_TABLE {
        let pte = table.pte(mem, i);
        assert!(
            pte.none(),
            "PT reclaim ({path:?} path) freed a table that still maps {pte:?} at {i}"
        );
    }
    table.free(mem, 0);
    Some(path)
}

/// CPU 1: a fault on the first page (`do_anonymous_page`'s table part).
/// Returns whether it mapped its page (else the entry was still there: a
/// spurious fault).
fn fault(mem: &PhysMem, slot: PmdSlot) -> bool {
    loop {
        slot.pte_alloc(mem, 1, Tracking::Untracked)
            .expect("a table for the fault");
        // None: the table went between the two steps; retry the fault.
        if let Some(mut pt) = slot.pte_offset_map_lock(mem) {
            let none = pt.pte(0).none();
            if none {
                pt.set(0, mapped_pte(FAULT_PFN));
            }
            return none;
        }
    }
}

/// What loom explored: executions, the paths that freed the table, and
/// the executions where the fault refilled the table and the zap kept it.
#[derive(Debug)]
struct Explored {
    runs: usize,
    paths: Vec<ReclaimPath>,
    kept_refilled: usize,
}

/// Runs the model.
fn run(break_at: Option<usize>, broken: bool, bound: usize) -> Explored {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    let runs = Arc::new(AtomicUsize::new(0));
    let kept = Arc::new(AtomicUsize::new(0));
    let paths = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (counted, seen, kept_counted) = (runs.clone(), paths.clone(), kept.clone());
    b.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        let (mem, slot) = world();
        let m = mem.clone();
        let faulter = thread::spawn(move || fault(&m, slot));
        let freed = zap(&mem, slot, break_at, broken);
        let mapped = faulter.join().unwrap();
        match freed {
            Some(path) => {
                let mut seen = seen.lock().unwrap();
                if !seen.contains(&path) {
                    seen.push(path);
                }
            }
            None if mapped => {
                kept_counted.fetch_add(1, Ordering::Relaxed);
            }
            None => {}
        }
        // The zap had cleared the first entry before the fault could map
        // it, so the fault's page stays mapped, through whichever table
        // the PMD points to now.
        if mapped {
            let pt = slot
                .pte_offset_map_lock(&mem)
                .expect("the fault's table is gone");
            assert_eq!(pt.pte(0), mapped_pte(FAULT_PFN), "the fault's page is lost");
        }
    });
    let paths = paths.lock().unwrap().clone();
    Explored {
        runs: runs.load(Ordering::Relaxed),
        paths,
        kept_refilled: kept.load(Ordering::Relaxed),
    }
}

/// A zap that keeps the lock frees the table by the fast path whenever
/// the fault comes before or after it, never with the fault's page in it.
#[test]
fn fast_path_against_a_racing_fault() {
    let e = run(None, false, 3);
    eprintln!(
        "{} executions, paths that freed the table: {:?}",
        e.runs, e.paths
    );
    assert_eq!(e.paths, [ReclaimPath::Fast]);
    assert_eq!(e.kept_refilled, 0, "nothing refills a table under its lock");
}

/// A zap that drops the lock midway, as a full gather makes it: the fault
/// may refill an entry already zapped, and the slow path, which looks at
/// every entry again, keeps such a table and frees only an empty one.
#[test]
fn dropped_lock_takes_the_slow_path() {
    let e = run(Some(BREAK_AT), false, 3);
    eprintln!(
        "{} executions, paths that freed the table: {:?}, refilled and kept: {}",
        e.runs, e.paths, e.kept_refilled
    );
    assert_eq!(e.paths, [ReclaimPath::Slow]);
    assert!(
        e.kept_refilled > 0,
        "the race the fix is about was explored"
    );
}

/// The rule before the fix of Feb 2025 (the fast path even after the lock
/// was dropped midway) frees the table the fault just refilled: loom must
/// find it.
#[test]
fn fast_path_after_a_dropped_lock_is_caught() {
    let r = std::panic::catch_unwind(|| run(Some(BREAK_AT), true, 3));
    let e = r.expect_err("loom should find the refilled table freed");
    let msg = e
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert!(msg.contains("freed a table that still maps"), "{msg}");
}
