//! mremap under CPUs that fault, load and store in the ranges it moves,
//! under each `fault_lock` mode.
//!
//! Two CPUs store to and load from a range and the range it is moved to,
//! while a third moves it back and forth (MREMAP_FIXED, some moves leaving
//! the old range mapped and empty), shrinks it and grows it back in place,
//! and locks and unlocks parts of it. Checked: once a move returns, the
//! hardware walker finds nothing mapped in the old range; the shadow
//! memory finds no value that was lost, stale or never stored (a moved
//! word reads as it was, at its new address); the invariant checker finds
//! the page tables, rmap, RSS, deposited tables and locked counts agree.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use usermm::check::check_invariants;
use usermm::check::shadow::Shadow;
use usermm::mmap::*;
use usermm::mremap::{MREMAP_DONTUNMAP, MREMAP_FIXED, MREMAP_MAYMOVE};
use usermm::pgtable::walk::hw_walk;
use usermm::tunable::FaultLock;
use usermm::{Errno, Machine, MachineConfig, OnCpu, ThpMode};

mod common;
use common::StopOnDrop;

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;
/// The range moved: two PMDs' worth, so that PMD-mapped THPs and whole
/// PTE tables move as well as single entries.
const LEN: u64 = 4 << 20;
/// Where it lives and where it goes: PMD-aligned, and one page off.
const HOME: u64 = 0x6000_0000_0000;
const AWAY: [u64; 2] = [0x6000_4000_0000, 0x6000_8000_1000];

/// The pages of `[start, end)` the hardware walker finds mapped.
fn mapped_pages(m: &Machine, c: &OnCpu, start: u64, end: u64) -> Vec<u64> {
    let pgd = c.mm().unwrap().pgd.cr3();
    (start..end)
        .step_by(PAGE as usize)
        .filter(|&a| hw_walk(&m.mem, pgd, a, false).is_ok())
        .collect()
}

fn race_accesses_with_mremap(lock: FaultLock, rounds: u64) {
    let m = Machine::new(MachineConfig::single_node(256 << 20, 3)).unwrap();
    m.tunables.set_fault_lock(lock);
    m.thp.set_enabled(ThpMode::Always).unwrap();
    let shadow = Shadow::new();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    c0.mmap(HOME, LEN, RW, ANON | MAP_FIXED).unwrap();
    let stop = AtomicBool::new(false);
    let accesses = AtomicU64::new(0);
    let ranges = [HOME, AWAY[0], AWAY[1]];
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for id in 1..3u64 {
            let (m, mm, stop, shadow, accesses) = (&m, mm.clone(), &stop, &shadow, &accesses);
            s.spawn(move || {
                // A failing accessor stops the operator too.
                let _stop = StopOnDrop(stop);
                let c = m.bind(id as usize).unwrap();
                c.switch_mm(&mm);
                let mut rng = SmallRng::seed_from_u64(id);
                let mut seq = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    let base = ranges[rng.gen_range(0..ranges.len())];
                    let addr = base + rng.gen_range(0..LEN / 8) * 8;
                    let r = if rng.gen_bool(0.6) {
                        seq += 1;
                        shadow.store_u64(&c, addr, (id << 56) | seq)
                    } else {
                        shadow.load_u64(&c, addr).map(|_| ())
                    };
                    assert!(matches!(r, Ok(()) | Err(Errno::EFAULT)), "{r:?}");
                    accesses.fetch_add(1, Ordering::Relaxed);
                }
                c.idle();
            });
        }
        let mut rng = SmallRng::seed_from_u64(99);
        let mut at = HOME;
        // The operator's calls on the shadow's clock, printed if a load
        // went wrong.
        let mut log: Vec<String> = Vec::new();
        let mut i = 0u64;
        while (i < rounds || accesses.load(Ordering::Relaxed) < 20_000)
            && !stop.load(Ordering::Relaxed)
        {
            i += 1;
            let (t, at0) = (shadow.now(), at);
            match i % 4 {
                0 | 1 => {
                    let to = *ranges
                        .iter()
                        .filter(|&&r| r != at)
                        .nth(rng.gen_range(0..2))
                        .unwrap();
                    let mut flags = MREMAP_MAYMOVE | MREMAP_FIXED;
                    if rng.gen_bool(0.3) {
                        flags |= MREMAP_DONTUNMAP;
                    }
                    let got = shadow
                        .remap(&c0, mm.id, at, to, LEN, || {
                            c0.mremap(at, LEN, LEN, flags, to)
                        })
                        .unwrap();
                    assert_eq!(got, to);
                    log.push(format!(
                        "[{t}, {}] move {at0:#x} to {to:#x} flags {flags}",
                        shadow.now()
                    ));
                    if flags & MREMAP_DONTUNMAP != 0 {
                        // The empty VMA left behind (which the CPUs fault
                        // into again at once) goes.
                        shadow.zap(&c0, mm.id, at, at + LEN, || c0.munmap(at, LEN).unwrap());
                    }
                    let left = mapped_pages(&m, &c0, at, at + LEN);
                    assert!(
                        left.is_empty(),
                        "{lock:?}: mapped after the move: {left:#x?}"
                    );
                    at = to;
                }
                2 => {
                    // Shrink the VMA that holds the middle to end there,
                    // then grow it back in place over zeroes (a resize
                    // must lie in one VMA; mlock may have split the range).
                    let half = at + LEN / 2;
                    let start = {
                        let guard = usermm::sync::epoch::pin();
                        mm.vma_tree(&guard).vma_lookup(half).unwrap().start()
                    };
                    shadow.zap(&c0, mm.id, half, at + LEN, || {
                        c0.mremap(start, at + LEN - start, half - start, 0, 0)
                            .unwrap()
                    });
                    log.push(format!(
                        "[{t}, {}] shrink {start:#x}..{half:#x}",
                        shadow.now()
                    ));
                    let grown = c0.mremap(start, half - start, at + LEN - start, 0, 0);
                    assert_eq!(grown, Ok(start));
                }
                _ => {
                    let off = rng.gen_range(0..LEN / PAGE) * PAGE;
                    log.push(format!(
                        "[{t}, {}] mlock or munlock at {:#x}",
                        shadow.now(),
                        at0 + off
                    ));
                    let len = (rng.gen_range(1..=512) * PAGE).min(LEN - off);
                    if rng.gen_bool(0.5) {
                        c0.mlock(at + off, len).unwrap();
                    } else {
                        c0.munlock(at + off, len).unwrap();
                    }
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        c0.idle();
        if shadow.verdict().is_err() {
            for l in &log {
                eprintln!("{lock:?}: {l}");
            }
        }
    });
    shadow.verdict().unwrap();
    c0.exit_mm().unwrap();
    drop(c0);
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

#[test]
fn mremap_races_accesses_under_vma_lock() {
    race_accesses_with_mremap(FaultLock::VmaLock, 120);
}

#[test]
fn mremap_races_accesses_under_spf() {
    race_accesses_with_mremap(FaultLock::Spf, 120);
}

#[test]
fn mremap_races_accesses_under_mmap_lock() {
    race_accesses_with_mremap(FaultLock::MmapLock, 120);
}

/// A THP and a PTE table move whole between PMD-aligned addresses; the
/// checker confirms the deposited table went with the huge PMD and that
/// the page-table count did not change.
#[test]
fn pmd_sized_moves_keep_folios_and_tables_whole() {
    let m = Machine::new(MachineConfig::single_node(128 << 20, 1)).unwrap();
    m.thp.set_enabled(ThpMode::Always).unwrap();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    c.mmap(HOME, LEN, RW, ANON | MAP_FIXED).unwrap();
    for p in (0..LEN).step_by(PAGE as usize) {
        c.store_u64(HOME + p, p).unwrap();
    }
    let tables = mm.pgtables_bytes.load(Ordering::Relaxed);
    let split = m.vmstat().event(usermm::vmstat::Event::THP_SPLIT_PMD);
    let to = AWAY[0];
    assert_eq!(
        c.mremap(HOME, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, to)
            .unwrap(),
        to
    );
    assert_eq!(
        m.vmstat().event(usermm::vmstat::Event::THP_SPLIT_PMD),
        split
    );
    assert_eq!(mm.pgtables_bytes.load(Ordering::Relaxed), tables);
    for p in (0..LEN).step_by(PAGE as usize) {
        assert_eq!(c.load_u64(to + p).unwrap(), p);
    }
    assert_eq!(c.load_u64(HOME), Err(Errno::EFAULT));
    check_invariants(&m).unwrap();
    c.exit_mm().unwrap();
}

/// Where a GiB lives and moves to: GiB-aligned, one in the same PGD
/// entry, one in another.
const GIB_RANGES: [u64; 3] = [0x6000_0000_0000, 0x6000_4000_0000, 0x6400_0000_0000];
/// The parts of the GiB the CPUs touch: its start, its middle, its end
/// (each in a PMD of its own, faulted as a THP or by PTEs).
const GIB_WINDOWS: [u64; 3] = [0, 1 << 29, (1 << 30) - WINDOW];
const WINDOW: u64 = 64 << 10;

/// A GiB moved whole between GiB-aligned addresses (its PMD table hangs
/// from another PUD entry: `move_normal_pud`) while two CPUs store and
/// load in three windows of it and of the ranges it moves between; the
/// operator also zaps a window (MADV_DONTNEED) and flips THPs on and off,
/// so that PMD-mapped THPs and PTE tables both move.
fn race_accesses_with_pud_moves(lock: FaultLock, rounds: u64) {
    const GIB: u64 = 1 << 30;
    let m = Machine::new(MachineConfig::single_node(256 << 20, 3)).unwrap();
    m.tunables.set_fault_lock(lock);
    m.thp.set_enabled(ThpMode::Always).unwrap();
    let shadow = Shadow::new();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    // A GiB on a smaller machine: not charged (heuristic overcommit).
    c0.mmap(GIB_RANGES[0], GIB, RW, ANON | MAP_NORESERVE | MAP_FIXED)
        .unwrap();
    let stop = AtomicBool::new(false);
    let accesses = AtomicU64::new(0);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for id in 1..3u64 {
            let (m, mm, stop, shadow, accesses) = (&m, mm.clone(), &stop, &shadow, &accesses);
            s.spawn(move || {
                // A failing accessor stops the operator too.
                let _stop = StopOnDrop(stop);
                let c = m.bind(id as usize).unwrap();
                c.switch_mm(&mm);
                let mut rng = SmallRng::seed_from_u64(id);
                let mut seq = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    let base = GIB_RANGES[rng.gen_range(0..3)] + GIB_WINDOWS[rng.gen_range(0..3)];
                    let addr = base + rng.gen_range(0..WINDOW / 8) * 8;
                    let r = if rng.gen_bool(0.6) {
                        seq += 1;
                        shadow.store_u64(&c, addr, (id << 56) | seq)
                    } else {
                        shadow.load_u64(&c, addr).map(|_| ())
                    };
                    assert!(matches!(r, Ok(()) | Err(Errno::EFAULT)), "{r:?}");
                    accesses.fetch_add(1, Ordering::Relaxed);
                }
                c.idle();
            });
        }
        let mut rng = SmallRng::seed_from_u64(7);
        let mut at = GIB_RANGES[0];
        let mut i = 0u64;
        while (i < rounds || accesses.load(Ordering::Relaxed) < 20_000)
            && !stop.load(Ordering::Relaxed)
        {
            i += 1;
            match i % 4 {
                0 | 1 => {
                    let to = *GIB_RANGES
                        .iter()
                        .filter(|&&r| r != at)
                        .nth(rng.gen_range(0..2))
                        .unwrap();
                    let mut flags = MREMAP_MAYMOVE | MREMAP_FIXED;
                    if rng.gen_bool(0.3) {
                        flags |= MREMAP_DONTUNMAP;
                    }
                    // A VMA never written (its pages all zero pages) has
                    // no anon_vma: moved next to itself, it merges with
                    // its copy, as the kernel's copy_vma lets it, and
                    // nothing is moved whole.
                    let written = {
                        let guard = usermm::sync::epoch::pin();
                        let tree = mm.vma_tree(&guard);
                        tree.vma_lookup(at).unwrap().anon_vma().is_some()
                    };
                    let pmd_table = mm.pmd_lookup(at).filter(|_| written);
                    let got = shadow
                        .remap(&c0, mm.id, at, to, GIB, || {
                            c0.mremap(at, GIB, GIB, flags, to)
                        })
                        .unwrap();
                    assert_eq!(got, to);
                    // The PMD table itself moved, rather than its
                    // entries into a new one.
                    if let Some(slot) = pmd_table {
                        assert_eq!(mm.pmd_lookup(to), Some(slot), "{lock:?}: not moved whole");
                    }
                    if flags & MREMAP_DONTUNMAP != 0 {
                        shadow.zap(&c0, mm.id, at, at + GIB, || c0.munmap(at, GIB).unwrap());
                    }
                    for w in GIB_WINDOWS {
                        let left = mapped_pages(&m, &c0, at + w, at + w + WINDOW);
                        assert!(
                            left.is_empty(),
                            "{lock:?}: mapped after the move: {left:#x?}"
                        );
                    }
                    at = to;
                }
                2 => {
                    let w = at + GIB_WINDOWS[rng.gen_range(0..3)];
                    shadow.zap(&c0, mm.id, w, w + WINDOW, || {
                        c0.madvise(w, WINDOW, usermm::madvise::MADV_DONTNEED)
                            .unwrap()
                    });
                }
                _ => {
                    let mode = if rng.gen_bool(0.5) {
                        ThpMode::Always
                    } else {
                        ThpMode::Never
                    };
                    m.thp.set_enabled(mode).unwrap();
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        c0.idle();
    });
    shadow.verdict().unwrap();
    c0.exit_mm().unwrap();
    drop(c0);
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

#[test]
fn pud_moves_race_accesses_under_vma_lock() {
    race_accesses_with_pud_moves(FaultLock::VmaLock, 300);
}

#[test]
fn pud_moves_race_accesses_under_spf() {
    race_accesses_with_pud_moves(FaultLock::Spf, 300);
}

#[test]
fn pud_moves_race_accesses_under_mmap_lock() {
    race_accesses_with_pud_moves(FaultLock::MmapLock, 300);
}
