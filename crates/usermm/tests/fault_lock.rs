//! Faults under each `fault_lock` mode racing with the writers that change
//! VMAs: munmap, mprotect (with the splits and merges it makes), MAP_FIXED
//! over a mapping, and fork (which write-locks every parent VMA).
//!
//! The seed's correctness condition: no fault commits into a VMA that was
//! unmapped, or whose protection forbade the access, by the time the fault
//! returned. Checked directly — once munmap returns no page of the range is
//! mapped, once mprotect(PROT_READ) returns none is writable — and by the
//! shadow memory (no write lost, no stale read) and the invariant checker
//! (no PTE outside a VMA, RSS and mapcounts equal to the page tables).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use usermm::check::check_invariants;
use usermm::check::shadow::Shadow;
use usermm::mmap::*;
use usermm::pgtable::walk::hw_walk;
use usermm::tunable::FaultLock;
use usermm::vmstat::Event;
use usermm::{Errno, Machine, MachineConfig, OnCpu};

mod common;
use common::StopOnDrop;

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;
/// The range the faulting CPUs work in, and the chunks the writer changes.
const LEN: u64 = 64 * PAGE;
const CHUNK: u64 = 8 * PAGE;

/// The pages of `[start, end)` that the hardware walker finds mapped
/// (writable ones only, if `write`).
fn mapped_pages(m: &Machine, c: &OnCpu, start: u64, end: u64, write: bool) -> Vec<u64> {
    let pgd = c.mm().unwrap().pgd.cr3();
    (start..end)
        .step_by(PAGE as usize)
        .filter(|&a| hw_walk(&m.mem, pgd, a, write).is_ok())
        .collect()
}

/// Two CPUs write-fault and read pages of one range while a third changes
/// its VMAs, under `lock`; returns the machine for the caller's counters.
fn race_faults_with_vma_writers(lock: FaultLock, rounds: u64) -> std::sync::Arc<Machine> {
    let m = Machine::new(MachineConfig::single_node(128 << 20, 3)).unwrap();
    m.tunables.set_fault_lock(lock);
    let shadow = Shadow::new();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    let a = c0.mmap(0, LEN, RW, ANON).unwrap();
    let stop = AtomicBool::new(false);
    let accesses = AtomicU64::new(0);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for id in 1..3u64 {
            let (m, mm, stop, shadow, accesses) = (&m, mm.clone(), &stop, &shadow, &accesses);
            s.spawn(move || {
                let c = m.bind(id as usize).unwrap();
                c.switch_mm(&mm);
                let mut rng = SmallRng::seed_from_u64(id);
                let mut seq = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    let addr = a + rng.gen_range(0..LEN / 8) * 8;
                    if rng.gen_bool(0.7) {
                        let r = shadow.store_u64(&c, addr, (id << 56) | seq);
                        assert!(matches!(r, Ok(()) | Err(Errno::EFAULT)), "{r:?}");
                        seq += 1;
                    } else {
                        let r = shadow.load_u64(&c, addr);
                        assert!(matches!(r, Ok(_) | Err(Errno::EFAULT)), "{r:?}");
                    }
                    accesses.fetch_add(1, Ordering::Relaxed);
                }
                c.idle();
            });
        }
        let mut i = 0u64;
        while i < rounds || accesses.load(Ordering::Relaxed) < 20_000 {
            i += 1;
            let start = a + (i % (LEN / CHUNK)) * CHUNK;
            let end = start + CHUNK;
            match i % 5 {
                0 => shadow.zap(&c0, mm.id, start, end, || {
                    c0.munmap(start, CHUNK).unwrap();
                    let left = mapped_pages(&m, &c0, start, end, false);
                    assert!(left.is_empty(), "{lock:?}: mapped after munmap: {left:#x?}");
                    c0.mmap(start, CHUNK, RW, ANON | MAP_FIXED).unwrap();
                }),
                1 => {
                    c0.mprotect(start, CHUNK, PROT_READ).unwrap();
                    let w = mapped_pages(&m, &c0, start, end, true);
                    assert!(w.is_empty(), "{lock:?}: writable after mprotect: {w:#x?}");
                    c0.mprotect(start, CHUNK, RW).unwrap();
                }
                2 => shadow.zap(&c0, mm.id, start, end, || {
                    c0.mmap(start, CHUNK, RW, ANON | MAP_FIXED).unwrap();
                }),
                4 => {
                    // fork write-protects the parent's pages under the
                    // faulting CPUs; the child reads what it inherited.
                    let child = shadow
                        .fork(&c0, mm.id, || c0.fork().map(|ch| (ch.clone(), ch.id)))
                        .unwrap();
                    c0.switch_mm(&child);
                    for w in (0..LEN).step_by(CHUNK as usize) {
                        let r = shadow.load_u64(&c0, a + w);
                        assert!(matches!(r, Ok(_) | Err(Errno::EFAULT)), "{r:?}");
                    }
                    c0.exit_mm().unwrap();
                    shadow.exit(child.id);
                    c0.switch_mm(&mm);
                }
                _ => {
                    // A split into three and the merge back.
                    let mid = start + 2 * PAGE;
                    c0.mprotect(mid, 2 * PAGE, PROT_NONE).unwrap();
                    let any = mapped_pages(&m, &c0, mid, mid + 2 * PAGE, false);
                    assert!(
                        any.is_empty(),
                        "{lock:?}: accessible after PROT_NONE: {any:#x?}"
                    );
                    c0.mprotect(mid, 2 * PAGE, RW).unwrap();
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
    let v = m.vmstat();
    eprintln!(
        "{lock:?}: {} faults; vma_lock success {} retry {} abort {} miss {}; spf attempt {} abort {}",
        v.event(Event::PGFAULT),
        v.event(Event::VMA_LOCK_SUCCESS),
        v.event(Event::VMA_LOCK_RETRY),
        v.event(Event::VMA_LOCK_ABORT),
        v.event(Event::VMA_LOCK_MISS),
        v.event(Event::SPF_ATTEMPT),
        v.event(Event::SPF_ABORT),
    );
    m
}

#[test]
fn faults_under_mmap_lock_race_with_vma_writers() {
    let m = race_faults_with_vma_writers(FaultLock::MmapLock, 2000);
    let v = m.vmstat();
    assert_eq!(
        v.event(Event::VMA_LOCK_SUCCESS) + v.event(Event::SPF_ATTEMPT),
        0
    );
}

#[test]
fn faults_under_vma_locks_race_with_vma_writers() {
    let m = race_faults_with_vma_writers(FaultLock::VmaLock, 2000);
    let v = m.vmstat();
    assert!(
        v.event(Event::VMA_LOCK_SUCCESS) > 0,
        "the VMA-lock path ran"
    );
    assert!(
        v.event(Event::VMA_LOCK_ABORT) > 0,
        "some faults found their VMA write-locked"
    );
    assert_eq!(v.event(Event::SPF_ATTEMPT), 0);
}

#[test]
fn speculative_faults_race_with_vma_writers() {
    let m = race_faults_with_vma_writers(FaultLock::Spf, 2000);
    let v = m.vmstat();
    let (attempts, aborts) = (v.event(Event::SPF_ATTEMPT), v.event(Event::SPF_ABORT));
    assert!(aborts < attempts, "{aborts} of {attempts} aborted");
    assert!(
        aborts > 0,
        "a writer in every other moment makes some abort"
    );
    assert_eq!(v.event(Event::VMA_LOCK_SUCCESS), 0);
}

/// A single thread's faults succeed on the lockless paths, and give the
/// same memory as under mmap_lock.
#[test]
fn each_mode_faults_alike_alone() {
    for lock in [FaultLock::MmapLock, FaultLock::Spf, FaultLock::VmaLock] {
        let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
        m.tunables.set_fault_lock(lock);
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let a = c.mmap(0, 1 << 20, RW, ANON).unwrap();
        c.touch_pages(a, a + (1 << 20), 5).unwrap();
        for p in (a..a + (1 << 20)).step_by(PAGE as usize) {
            assert_eq!(c.load_u8(p).unwrap(), 5);
        }
        assert_eq!(usermm::proc::status(&mm).vm_rss, 1024, "{lock:?}");
        let v = m.vmstat();
        assert_eq!(
            v.event(Event::PGFAULT),
            256,
            "{lock:?}: once per fault, retried or not"
        );
        match lock {
            FaultLock::VmaLock => {
                // The first write fault makes the anon_vma under mmap_lock
                // taken for reading beside the VMA lock (v6.10+): every
                // fault succeeds under the VMA lock.
                assert_eq!(v.event(Event::VMA_LOCK_RETRY), 0, "{lock:?}");
                assert_eq!(v.event(Event::VMA_LOCK_SUCCESS), 256, "{lock:?}");
            }
            FaultLock::Spf => {
                // The first fault has no PTE table and no anon_vma yet.
                assert_eq!(v.event(Event::SPF_ATTEMPT), 256, "{lock:?}");
                assert!(v.event(Event::SPF_ABORT) <= 2, "{lock:?}");
            }
            FaultLock::MmapLock => {}
        }
        c.exit_mm().unwrap();
        drop(c);
        m.rcu_barrier();
        check_invariants(&m).unwrap();
    }
}
