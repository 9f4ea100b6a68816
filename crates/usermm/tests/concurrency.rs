//! Threads playing CPUs race on one address space.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use usermm::check::check_invariants;
use usermm::madvise::MADV_DONTNEED;
use usermm::mmap::*;
use usermm::{Errno, Machine, MachineConfig};

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;

/// Once munmap has returned, no CPU may read through a stale TLB entry.
#[test]
fn no_stale_read_after_munmap_returns() {
    let m = Machine::new(MachineConfig::single_node(128 << 20, 3)).unwrap();
    for round in 0..20 {
        let c0 = m.bind(0).unwrap();
        let mm = c0.new_mm().unwrap();
        let a = c0.mmap(0, 16 * 4096, RW, ANON).unwrap();
        c0.touch_pages(a, a + 16 * 4096, 7).unwrap();
        let unmapped = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicU64::new(0));
        std::thread::scope(|s| {
            for id in 1..3 {
                let (m, mm, unmapped, started) =
                    (&m, mm.clone(), unmapped.clone(), started.clone());
                s.spawn(move || {
                    let c = m.bind(id).unwrap();
                    c.switch_mm(&mm);
                    let mut i = 0u64;
                    loop {
                        let was_unmapped = unmapped.load(Ordering::Acquire);
                        let r = c.load_u8(a + (i % 16) * 4096);
                        started.fetch_add(1, Ordering::Relaxed);
                        if was_unmapped {
                            assert_eq!(
                                r,
                                Err(Errno::EFAULT),
                                "round {round}: CPU {id} read a page after munmap returned"
                            );
                            break;
                        }
                        i += 1;
                    }
                    c.idle();
                });
            }
            while started.load(Ordering::Relaxed) < 1000 {
                std::thread::yield_now();
            }
            c0.munmap(a, 16 * 4096).unwrap();
            unmapped.store(true, Ordering::Release);
        });
        c0.exit_mm().unwrap();
        drop(c0);
        m.rcu_barrier();
        check_invariants(&m).unwrap();
    }
    assert!(m.vmstat().event(usermm::vmstat::Event::NR_TLB_REMOTE_FLUSH) > 0);
}

/// Writers and readers on two CPUs while a third munmaps and remaps,
/// mprotects read-only and back, and MADV_DONTNEEDs the same range. Each
/// writer owns its slots, so every value it reads back must be the last it
/// wrote, or zero after a DONTNEED/munmap it may have raced with.
#[test]
fn stress_access_against_munmap_mprotect_dontneed() {
    let m = Machine::new(MachineConfig::single_node(128 << 20, 3)).unwrap();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    const LEN: u64 = 64 * 4096;
    let a = c0.mmap(0, LEN, RW, ANON).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Generation of destructive operations: a writer's value may legally be
    // lost only if a zap completed in between.
    let zaps = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for id in 1..3u64 {
            let (m, mm, stop, zaps) = (&m, mm.clone(), stop.clone(), zaps.clone());
            s.spawn(move || {
                let c = m.bind(id as usize).unwrap();
                c.switch_mm(&mm);
                let mut seq = 1u64;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let slot = a + ((n * 8 + id * 4096) % LEN & !7);
                    n = n.wrapping_add(4097);
                    let z0 = zaps.load(Ordering::Acquire);
                    let v = (id << 56) | seq;
                    if c.store_u64(slot, v).is_ok() {
                        match c.load_u64(slot) {
                            Ok(got) => {
                                let z1 = zaps.load(Ordering::Acquire);
                                assert!(got == v || (z1 != z0 || got == 0), "CPU {id}: lost write at {slot:#x}: wrote {v:#x}, read {got:#x}");
                            }
                            Err(e) => assert_eq!(e, Errno::EFAULT),
                        }
                        seq += 1;
                    }
                }
                c.idle();
            });
        }
        for i in 0..300u64 {
            let off = (i % 8) * 8 * 4096;
            match i % 3 {
                0 => {
                    zaps.fetch_add(1, Ordering::AcqRel);
                    c0.munmap(a + off, 8 * 4096).unwrap();
                    c0.mmap(a + off, 8 * 4096, RW, ANON | MAP_FIXED).unwrap();
                    zaps.fetch_add(1, Ordering::AcqRel);
                }
                1 => {
                    c0.mprotect(a + off, 8 * 4096, PROT_READ).unwrap();
                    c0.mprotect(a + off, 8 * 4096, RW).unwrap();
                }
                _ => {
                    zaps.fetch_add(1, Ordering::AcqRel);
                    c0.madvise(a + off, 8 * 4096, MADV_DONTNEED).unwrap();
                    zaps.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        c0.idle();
    });
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}
