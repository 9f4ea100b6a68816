//! MADV_COLLAPSE under CPUs that fault, load and store in the PMDs it
//! collapses, under each `fault_lock` mode.
//!
//! Two CPUs store to and load from a 4 MiB range of small pages while a
//! third collapses its PMDs into THPs, now the whole range, now one PMD,
//! and zaps parts of it (MADV_DONTNEED, which splits a THP it covers in
//! part). Checked: the shadow memory finds no value that was lost, stale
//! or never stored (a store racing a collapse lands in the old page before
//! the copy or in the THP after it, never in a page the copy has passed);
//! the invariant checker finds the page tables, rmap, RSS, deposited
//! tables and LRU agree; and collapses did happen.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use usermm::check::check_invariants;
use usermm::check::shadow::Shadow;
use usermm::madvise::{MADV_COLLAPSE, MADV_DONTNEED};
use usermm::mmap::*;
use usermm::tunable::FaultLock;
use usermm::vmstat::Event;
use usermm::{Errno, Machine, MachineConfig, ThpMode};

mod common;
use common::StopOnDrop;

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const HOME: u64 = 0x6000_0000_0000;
const LEN: u64 = 4 << 20;
const PMD: u64 = 2 << 20;

fn race_accesses_with_collapse(lock: FaultLock, rounds: u64) {
    let m = Machine::new(MachineConfig::single_node(128 << 20, 3)).unwrap();
    m.tunables.set_fault_lock(lock);
    // Faults make small pages; only the collapses make THPs.
    m.thp.set_enabled(ThpMode::Never).unwrap();
    let shadow = Shadow::new();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    c0.mmap(HOME, LEN, RW, ANON | MAP_FIXED).unwrap();
    // Written once, so that the VMA has an anon_vma and no PMD is empty.
    for p in (0..LEN).step_by(4096) {
        shadow.store_u64(&c0, HOME + p, p + 1).unwrap();
    }
    let stop = AtomicBool::new(false);
    let accesses = AtomicU64::new(0);
    let (mut collapsed, mut refused) = (0u64, 0u64);
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
                    let addr = HOME + rng.gen_range(0..LEN / 8) * 8;
                    let r = if rng.gen_bool(0.6) {
                        seq += 1;
                        shadow.store_u64(&c, addr, (id << 56) | seq)
                    } else {
                        shadow.load_u64(&c, addr).map(|_| ())
                    };
                    r.unwrap();
                    accesses.fetch_add(1, Ordering::Relaxed);
                }
                c.idle();
            });
        }
        let mut rng = SmallRng::seed_from_u64(5);
        let mut i = 0u64;
        while (i < rounds || accesses.load(Ordering::Relaxed) < 20_000)
            && !stop.load(Ordering::Relaxed)
        {
            i += 1;
            let r = match i % 3 {
                0 => c0.madvise(HOME, LEN, MADV_COLLAPSE),
                1 => {
                    let at = HOME + rng.gen_range(0..2) * PMD;
                    c0.madvise(at, PMD, MADV_COLLAPSE)
                }
                _ => {
                    let len = rng.gen_range(1..=256u64) * 4096;
                    let at = HOME + rng.gen_range(0..(LEN - len) / 4096) * 4096;
                    shadow.zap(&c0, mm.id, at, at + len, || {
                        c0.madvise(at, len, MADV_DONTNEED).unwrap()
                    });
                    continue;
                }
            };
            // A page a CPU holds (a fault or a store under way) makes the
            // collapse refuse the PMD for now (EAGAIN).
            match r {
                Ok(()) => collapsed += 1,
                Err(Errno::EAGAIN) => refused += 1,
                Err(e) => panic!("{lock:?}: MADV_COLLAPSE: {e:?}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        c0.idle();
    });
    shadow.verdict().unwrap();
    assert!(
        m.vmstat().event(Event::THP_COLLAPSE_ALLOC) > 0 && collapsed > 0,
        "{lock:?}: nothing collapsed ({refused} refused)"
    );
    c0.exit_mm().unwrap();
    drop(c0);
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

#[test]
fn collapse_races_accesses_under_vma_lock() {
    race_accesses_with_collapse(FaultLock::VmaLock, 1000);
}

#[test]
fn collapse_races_accesses_under_spf() {
    race_accesses_with_collapse(FaultLock::Spf, 1000);
}

#[test]
fn collapse_races_accesses_under_mmap_lock() {
    race_accesses_with_collapse(FaultLock::MmapLock, 1000);
}
