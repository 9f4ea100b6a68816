//! Model-checked faults without mmap_lock, running the engine's own lock
//! code: the per-VMA lock (`vma_start_read` against `vma_start_write` and
//! `vma_mark_detached`, with the lookup's retry) and the seed's speculative
//! commit (sequence read, lookup, `pte_map_lock`, commit) against an
//! munmap.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p usermm --test
//! loom_fault_lock` (`.ci/run` does). Built so, `mm_lock_seq`, `vm_refcnt`,
//! `vm_lock_seq` and every page-table lock are loom's, and loom runs each
//! model under every interleaving of its threads (up to a preemption
//! bound). Each protocol has a broken variant that must be caught: a reader
//! that does not check `vm_lock_seq` again once it holds its reference, and
//! a speculative commit that does not check the sequence count again once it
//! holds the PTE lock; and a reader whose increment takes a count of 0, so
//! revives a VMA that a replace detached.
#![cfg(loom)]

use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;
use usermm::memory::SpfCommit;
use usermm::mm::mmap_lock::{MmLockSeq, StartReadError, VmaLock};
use usermm::pgtable::{Pgprot, PmdSlot, Pte, PteRead};
use usermm::phys::PhysMem;

#[path = "common/one_table.rs"]
mod one_table;
use one_table::one_pte_table;

/// The VMA tree reduced to what the protocol needs: two VMAs, and which of
/// them the tree holds; flags that say who is inside its critical section.
struct VmaWorld {
    seq: MmLockSeq,
    vmas: [VmaLock; 2],
    current: AtomicUsize,
    reading: AtomicBool,
    writing: AtomicBool,
    /// Which VMAs the writer has detached (set once `vma_mark_detached`
    /// returned).
    detached: [AtomicBool; 2],
}

/// A fault's `lock_vma_under_rcu`: look up, read-lock, look again on a miss
/// (a bounded number of times: the model's lookups are finite). While it
/// holds the lock, no writer may be inside its section, and the VMA is
/// attached.
fn vma_reader(w: &VmaWorld) {
    for _ in 0..3 {
        let i = w.current.load(Ordering::Acquire);
        let vma = &w.vmas[i];
        match vma.start_read(&w.seq) {
            Ok(locked) => {
                w.reading.store(true, Ordering::SeqCst);
                assert!(
                    !w.writing.load(Ordering::SeqCst),
                    "a fault holds a VMA lock inside a write section"
                );
                assert!(
                    !vma.is_detached() && !w.detached[i].load(Ordering::SeqCst),
                    "a fault holds a detached VMA"
                );
                w.reading.store(false, Ordering::SeqCst);
                drop(locked);
                return;
            }
            Err(StartReadError::Detached) => continue,
            // The fault takes mmap_lock instead.
            Err(StartReadError::Locked) => return,
        }
    }
}

/// An mmap writer: write-lock VMA 0, and with `replace`, put VMA 1 in its
/// place and detach it, as a split or an mprotect does.
fn vma_writer(w: &VmaWorld, replace: bool) {
    w.seq.write_begin();
    let s = w.seq.raw();
    w.vmas[0].start_write(s);
    w.writing.store(true, Ordering::SeqCst);
    assert!(
        !w.reading.load(Ordering::SeqCst),
        "a write section began over a fault's VMA lock"
    );
    if replace {
        w.vmas[1].start_write(s);
        w.vmas[1].mark_attached();
        w.current.store(1, Ordering::Release);
        w.vmas[0].mark_detached();
        w.detached[0].store(true, Ordering::SeqCst);
    }
    w.writing.store(false, Ordering::SeqCst);
    w.seq.write_end();
}

/// How [`run_vma_lock`]'s VMA 0 is broken, if it is.
#[derive(Clone, Copy, PartialEq)]
enum VmaBreak {
    None,
    NoRecheck,
    IncFromZero,
}

fn run_vma_lock(replace: bool, broken: VmaBreak, bound: usize) -> usize {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    b.check(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut vmas = [VmaLock::new(), VmaLock::new()];
        vmas[0].broken_no_recheck = broken == VmaBreak::NoRecheck;
        vmas[0].broken_inc_from_zero = broken == VmaBreak::IncFromZero;
        vmas[0].mark_attached();
        let w = loom::sync::Arc::new(VmaWorld {
            seq: MmLockSeq::new(),
            vmas,
            current: AtomicUsize::new(0),
            reading: AtomicBool::new(false),
            writing: AtomicBool::new(false),
            detached: [AtomicBool::new(false), AtomicBool::new(false)],
        });
        let r = {
            let w = w.clone();
            thread::spawn(move || vma_reader(&w))
        };
        vma_writer(&w, replace);
        r.join().unwrap();
    });
    runs.load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn vma_read_lock_against_a_write_section() {
    let runs = run_vma_lock(false, VmaBreak::None, 3);
    eprintln!("{runs} executions");
}

#[test]
fn vma_read_lock_against_a_replace_and_detach() {
    let runs = run_vma_lock(true, VmaBreak::None, 3);
    eprintln!("{runs} executions");
}

/// A reader that takes its reference and does not look at `vm_lock_seq`
/// again is let in by a writer that locked the VMA between its first look
/// and its increment: loom must find it.
#[test]
fn broken_reader_without_recheck_is_caught() {
    let r = std::panic::catch_unwind(|| run_vma_lock(false, VmaBreak::NoRecheck, 3));
    let e = r.expect_err("loom should find a reader inside a write section");
    let msg = panic_message(&*e);
    assert!(msg.contains("write section"), "{msg}");
}

/// A reader whose increment does not refuse a count of 0 takes a VMA that
/// a replace detached (found through a lookup made before the replace) and
/// holds it as if it were in the tree: loom must find it.
#[test]
fn broken_reader_reviving_a_detached_vma_is_caught() {
    let r = std::panic::catch_unwind(|| run_vma_lock(true, VmaBreak::IncFromZero, 3));
    let e = r.expect_err("loom should find a reader holding a detached VMA");
    let msg = panic_message(&*e);
    assert!(msg.contains("detached VMA"), "{msg}");
}

fn panic_message(e: &(dyn std::any::Any + Send)) -> &str {
    e.downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| e.downcast_ref::<&str>().copied())
        .unwrap_or_default()
}

const ADDR: u64 = 0x7f00_0000_0000;
const FAULT_PFN: u64 = 900;

/// The seed's fault: sequence read, lookup (is the VMA there?), the copy's
/// check, the walk (the PMD once), then `pte_map_lock` and the commit of a
/// new page into the empty entry. Returns whether it committed.
fn speculative_fault(
    mem: &PhysMem,
    slot: PmdSlot,
    seq: &MmLockSeq,
    mapped: &AtomicBool,
    broken: bool,
) -> bool {
    let Some(start) = seq.read_start() else {
        return false;
    };
    if !mapped.load(Ordering::Acquire) || !seq.read_check(start) {
        return false;
    }
    let orig_pmd = slot.get(mem);
    #[allow(unused_mut)]
    let mut commit = SpfCommit::new(seq, start);
    commit.broken_skip_seq2 = broken;
    let Ok(mut pt) = commit.pte_map_lock(mem, slot, orig_pmd) else {
        return false;
    };
    if !pt.pte(0).none() {
        return false;
    }
    pt.set(0, Pte::new(FAULT_PFN, Pgprot::READONLY));
    true
}

/// munmap of the page: the write section takes the VMA out of the tree and
/// downgrades; the zap clears the entry under the PTE lock.
fn munmap(mem: &PhysMem, slot: PmdSlot, seq: &MmLockSeq, mapped: &AtomicBool) {
    seq.write_begin();
    mapped.store(false, Ordering::Release);
    seq.write_end();
    let mut pt = slot.pte_offset_map_lock(mem).expect("the table");
    if !pt.pte(0).none() {
        pt.get_and_clear(0);
    }
}

fn run_spf(broken: bool, bound: usize) -> (usize, usize) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let committed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (r2, c2) = (runs.clone(), committed.clone());
    b.check(move || {
        r2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (mem, slot) = one_pte_table(ADDR);
        let seq = loom::sync::Arc::new(MmLockSeq::new());
        let mapped = loom::sync::Arc::new(AtomicBool::new(true));
        let f = {
            let (mem, seq, mapped) = (mem.clone(), seq.clone(), mapped.clone());
            thread::spawn(move || speculative_fault(&mem, slot, &seq, &mapped, broken))
        };
        munmap(&mem, slot, &seq, &mapped);
        if f.join().unwrap() {
            c2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let pt = slot.pte_offset_map_lock(&mem).expect("the table");
        assert!(
            pt.pte(0).none(),
            "a speculative fault committed into a range munmap had unmapped"
        );
    });
    (
        runs.load(std::sync::atomic::Ordering::Relaxed),
        committed.load(std::sync::atomic::Ordering::Relaxed),
    )
}

#[test]
fn speculative_commit_against_munmap() {
    let (runs, committed) = run_spf(false, 3);
    eprintln!("{runs} executions, {committed} committed before the zap");
    assert!(
        committed > 0,
        "the commit that the zap then clears was explored"
    );
}

/// Without the check after the PTE lock, a fault that passed its first
/// check before munmap began commits after munmap's zap: loom must find it.
#[test]
fn broken_commit_without_second_check_is_caught() {
    let r = std::panic::catch_unwind(|| run_spf(true, 3));
    let e = r.expect_err("loom should find a commit into an unmapped range");
    let msg = panic_message(&*e);
    assert!(msg.contains("unmapped"), "{msg}");
}
