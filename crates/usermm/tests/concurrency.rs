//! Threads playing CPUs race on one address space.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use usermm::check::check_invariants;
use usermm::check::shadow::Shadow;
use usermm::madvise::MADV_DONTNEED;
use usermm::mmap::*;
use usermm::pgtable::walk::hw_walk;
use usermm::{Errno, Machine, MachineConfig};

mod common;
use common::StopOnDrop;

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

/// Two CPUs store to and load from the same words, racing with each other,
/// while a third munmaps and remaps, mprotects read-only and back, and
/// MADV_DONTNEEDs the same ranges. Every load is checked by the shadow memory.
#[test]
fn stress_access_against_munmap_mprotect_dontneed() {
    let m = Machine::new(MachineConfig::single_node(128 << 20, 3)).unwrap();
    let shadow = Shadow::new();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    const LEN: u64 = 64 * 4096;
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
                    // Half the words are shared by both CPUs, half are each
                    // CPU's own; a few hot words make the races frequent.
                    let word = if rng.gen_bool(0.2) {
                        rng.gen_range(0..4)
                    } else {
                        rng.gen_range(0..LEN / 8)
                    };
                    let addr = a + word * 8;
                    if rng.gen_bool(0.5) {
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
        // At least 300 operations, and keep going until the CPUs have made
        // 40 000 accesses between them (threads may start late).
        let mut i = 0u64;
        while i < 300 || accesses.load(Ordering::Relaxed) < 40_000 {
            i += 1;
            let off = (i % 8) * 8 * 4096;
            let (start, end) = (a + off, a + off + 8 * 4096);
            match i % 3 {
                0 => shadow.zap(&c0, mm.id, start, end, || {
                    c0.munmap(start, 8 * 4096).unwrap();
                    c0.mmap(start, 8 * 4096, RW, ANON | MAP_FIXED).unwrap();
                }),
                1 => {
                    c0.mprotect(start, 8 * 4096, PROT_READ).unwrap();
                    c0.mprotect(start, 8 * 4096, RW).unwrap();
                }
                _ => shadow.zap(&c0, mm.id, start, end, || {
                    c0.madvise(start, 8 * 4096, MADV_DONTNEED).unwrap();
                }),
            }
        }
        stop.store(true, Ordering::Relaxed);
        c0.idle();
    });
    shadow.verdict().unwrap();
    assert!(shadow.loads_checked() > 10_000, "too few loads checked");
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

/// The shadow memory reports a write that disappears behind the model's back
/// (here: the frame is overwritten directly, as a page freed too early and
/// reused would be), with the address, the CPU and the history.
#[test]
fn shadow_memory_reports_a_lost_write() {
    let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
    let shadow = Shadow::new();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 4096, RW, ANON).unwrap();
    shadow.store_u64(&c, a + 8, 0xabcd).unwrap();
    assert_eq!(shadow.load_u64(&c, a + 8).unwrap(), 0xabcd);
    shadow.verdict().unwrap();
    let t = hw_walk(&m.mem, mm.pgd.cr3(), a, false).unwrap();
    let (pfn, _) = t.frame_of(a);
    // SAFETY: the frame is live and mapped; no other thread runs.
    unsafe { m.mem.frame_ptr(pfn).add(8).cast::<u64>().write(0) };
    assert_eq!(shadow.load_u64(&c, a + 8).unwrap(), 0);
    let v = shadow.violations();
    assert_eq!(v.len(), 1);
    assert_eq!(
        (v[0].addr, v[0].cpu, v[0].got, v[0].stale),
        (a + 8, 0, 0, true)
    );
    assert!(v[0].to_string().contains("0xabcd"), "{}", v[0]);
}

/// While CPU 0 forks the process again and again (checking each child's
/// snapshot through the shadow memory, then writing to it and exiting it)
/// and munmaps and remaps part of it, two CPUs keep storing to and loading
/// from the parent's memory. No load in the parent or in any child may
/// return a value it could not have; with fork and zap batching off and on,
/// and with memory in 64K folios and PMD-mapped THPs.
#[test]
fn fork_and_munmap_while_other_cpus_write() {
    for (batch, order) in [(false, 4), (true, 4), (false, 9), (true, 9)] {
        let m = Machine::new(MachineConfig::single_node(256 << 20, 3)).unwrap();
        m.tunables.set_fork_batch(batch);
        m.tunables.set_zap_batch(batch);
        m.thp.only_order(order);
        let shadow = Shadow::new();
        let c0 = m.bind(0).unwrap();
        let parent = c0.new_mm().unwrap();
        const LEN: u64 = 4 << 20;
        let a = c0.mmap(0, LEN, RW, ANON).unwrap();
        assert_eq!(a % (2 << 20), 0);
        // Populate through words the test never checks.
        for p in (a..a + LEN).step_by(4096) {
            c0.store_u64(p + 2048, 1).unwrap();
        }
        let stop = AtomicBool::new(false);
        let accesses = AtomicU64::new(0);
        std::thread::scope(|s| {
            let _stop = StopOnDrop(&stop);
            for id in 1..3u64 {
                let (m, mm, stop, shadow, accesses) =
                    (&m, parent.clone(), &stop, &shadow, &accesses);
                s.spawn(move || {
                    let c = m.bind(id as usize).unwrap();
                    c.switch_mm(&mm);
                    let mut rng = SmallRng::seed_from_u64(id);
                    let mut seq = 1u64;
                    while !stop.load(Ordering::Relaxed) {
                        // A few hot words per 64K, so that forks and munmaps
                        // cut through runs of writes.
                        let addr =
                            a + rng.gen_range(0..LEN / 65536) * 65536 + rng.gen_range(0..4) * 8;
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
            let mut i = 0u64;
            while i < 40 || accesses.load(Ordering::Relaxed) < 30_000 {
                i += 1;
                if i % 4 == 3 {
                    let off = (i % 2) * (2 << 20);
                    shadow.zap(&c0, parent.id, a + off, a + off + (1 << 20), || {
                        c0.munmap(a + off, 1 << 20).unwrap();
                        c0.mmap(a + off, 1 << 20, RW, ANON | MAP_FIXED).unwrap();
                    });
                    continue;
                }
                let child = shadow
                    .fork(&c0, parent.id, || c0.fork().map(|ch| (ch.clone(), ch.id)))
                    .unwrap();
                c0.switch_mm(&child);
                for w in 0..LEN / 65536 {
                    for k in 0..4 {
                        shadow.load_u64(&c0, a + w * 65536 + k * 8).unwrap();
                    }
                }
                // The child's writes must stay in the child.
                for w in 0..LEN / 65536 {
                    shadow
                        .store_u64(&c0, a + w * 65536, 0xc0de_0000 | w)
                        .unwrap();
                }
                c0.exit_mm().unwrap();
                shadow.exit(child.id);
                c0.switch_mm(&parent);
            }
            stop.store(true, Ordering::Relaxed);
            c0.idle();
        });
        if let Err(e) = shadow.verdict() {
            panic!("batch={batch} order={order}: {e}");
        }
        m.rcu_barrier();
        check_invariants(&m).unwrap();
    }
}

/// A write fault on a PMD-mapped THP shared with a child splits the PMD
/// (`do_huge_pmd_wp_page` falls back to PTEs) while another CPU runs
/// MADV_DONTNEED over it under the same read mmap_lock. The split must never
/// leave the PMD none for the zap to skip (`pmdp_invalidate`): once the
/// DONTNEED has returned, no word may read what was there before it.
///
/// The split is held open on purpose: its TLB flush waits for CPU 2, which
/// runs the process in user mode without touching memory for 30 ms, while
/// CPU 0's DONTNEED reads the PMD 10 ms in.
#[test]
fn dontneed_while_a_cow_fault_splits_the_pmd() {
    let m = Machine::new(MachineConfig::single_node(256 << 20, 3)).unwrap();
    m.thp.set_enabled(usermm::ThpMode::Always).unwrap();
    let shadow = Shadow::new();
    let c0 = m.bind(0).unwrap();
    let parent = c0.new_mm().unwrap();
    const LEN: u64 = 2 << 20;
    let a = c0.mmap(0, LEN, RW, ANON).unwrap();
    let b = c0.mmap(0, 4096, RW, ANON).unwrap();
    let round = AtomicU64::new(0);
    let done = [AtomicU64::new(0), AtomicU64::new(0)];
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for cpu in 1..3usize {
            let (m, mm, shadow, round, done, stop) =
                (&m, parent.clone(), &shadow, &round, &done, &stop);
            s.spawn(move || {
                let c = m.bind(cpu).unwrap();
                c.switch_mm(&mm);
                let mut seen = 0;
                while !stop.load(Ordering::Relaxed) {
                    let r = round.load(Ordering::Acquire);
                    if r == seen {
                        // Waiting is blocking: out of user mode.
                        c.idle();
                        std::hint::spin_loop();
                        continue;
                    }
                    seen = r;
                    if cpu == 1 {
                        // The write that splits the shared PMD.
                        shadow.store_u64(&c, a + 8, r).unwrap();
                    } else {
                        // In user mode, silent: flushes wait for this CPU.
                        c.load_u64(b).unwrap();
                        std::thread::sleep(std::time::Duration::from_millis(30));
                        c.load_u64(b).unwrap();
                    }
                    done[cpu - 1].store(r, Ordering::Release);
                }
                c.idle();
            });
        }
        for r in 1..=10u64 {
            // A fresh PMD-mapped THP with data in most of its pages.
            shadow.zap(&c0, parent.id, a, a + LEN, || {
                c0.munmap(a, LEN).unwrap();
                c0.mmap(a, LEN, RW, ANON | MAP_FIXED).unwrap();
            });
            for p in (0..LEN).step_by(64 << 10) {
                shadow.store_u64(&c0, a + p + 16, (r << 32) | p).unwrap();
            }
            let child = shadow
                .fork(&c0, parent.id, || c0.fork().map(|ch| (ch.clone(), ch.id)))
                .unwrap();
            round.store(r, Ordering::Release);
            std::thread::sleep(std::time::Duration::from_millis(10));
            shadow.zap(&c0, parent.id, a, a + LEN, || {
                c0.madvise(a, LEN, MADV_DONTNEED).unwrap()
            });
            for p in (0..LEN).step_by(64 << 10) {
                shadow.load_u64(&c0, a + p + 16).unwrap();
            }
            while done.iter().any(|d| d.load(Ordering::Acquire) != r) {
                c0.idle();
                std::hint::spin_loop();
            }
            c0.switch_mm(&child);
            c0.exit_mm().unwrap();
            shadow.exit(child.id);
            c0.switch_mm(&parent);
        }
        stop.store(true, Ordering::Relaxed);
        c0.idle();
    });
    shadow.verdict().unwrap();
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

/// No dirty bit is lost: one CPU writes pages that MADV_FREE made clean
/// while another changes their protection back and forth, which rewrites
/// every entry (`change_pte_range`). An entry read and then stored whole
/// would drop a dirty bit that the writer's MMU set in between, and reclaim
/// would then discard the written page as clean (it is lazily freed).
#[test]
fn mprotect_keeps_the_dirty_bits_a_racing_cpu_sets() {
    dirty_bits_survive_mprotect(64, 4096, false, 400);
}

/// As [`mprotect_keeps_the_dirty_bits_a_racing_cpu_sets`], for huge PMDs
/// (`change_huge_pmd`, which invalidates the entry before changing it).
#[test]
fn mprotect_keeps_the_dirty_bit_of_a_huge_pmd() {
    dirty_bits_survive_mprotect(16, 2 << 20, true, 8000);
}

/// `mappings` mappings of `size` bytes, written once per round by one CPU
/// after MADV_FREE cleaned them, while another CPU changes their protection;
/// then every one must be dirty. (Rounds enough that an entry stored from
/// a stale read is caught in every run tried: a handful of rounds for 4 KiB
/// pages, some hundreds for huge PMDs, whose writer is done sooner.)
fn dirty_bits_survive_mprotect(mappings: u64, size: u64, thp: bool, rounds: u64) {
    use usermm::madvise::MADV_FREE;
    let len = mappings * size;
    let m = Machine::new(MachineConfig::single_node(64 << 20, 2)).unwrap();
    if thp {
        m.thp.set_enabled(usermm::ThpMode::Always).unwrap();
    }
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    let a = c0.mmap(0, len, RW, ANON).unwrap();
    c0.touch_pages(a, a + len, 1).unwrap();
    if thp {
        let t = hw_walk(&m.mem, mm.pgd.cr3(), a, false).unwrap();
        assert_eq!(t.size, size, "not mapped by a huge PMD");
    }
    let (round, written) = (AtomicU64::new(0), AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    let mut toggles = 0u64;
    std::thread::scope(|s| {
        // A failed check must not leave the writer waiting for its round.
        let _stop = StopOnDrop(&stop);
        let (m, writer_mm, round, written, stop) = (&m, mm.clone(), &round, &written, &stop);
        s.spawn(move || {
            let c1 = m.bind(1).unwrap();
            c1.switch_mm(&writer_mm);
            for r in 1..=rounds {
                // Waiting is not running user code: flushes skip this CPU.
                c1.idle();
                while round.load(Ordering::Acquire) != r {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::hint::spin_loop();
                }
                for i in 0..mappings {
                    c1.store_u64(a + i * size, r).unwrap();
                }
                written.store(r, Ordering::Release);
            }
            c1.idle();
        });
        for r in 1..=rounds {
            c0.madvise(a, len, MADV_FREE).unwrap();
            round.store(r, Ordering::Release);
            while written.load(Ordering::Acquire) != r {
                c0.mprotect(a, len, RW | PROT_EXEC).unwrap();
                c0.mprotect(a, len, RW).unwrap();
                toggles += 1;
            }
            for i in 0..mappings {
                let t = hw_walk(&m.mem, mm.pgd.cr3(), a + i * size, false).unwrap();
                assert_eq!(t.size, size, "round {r}: mapping {i} was split");
                assert!(
                    t.dirty,
                    "round {r}: mapping {i} was written, its entry is clean"
                );
            }
        }
        c0.idle();
    });
    eprintln!("{rounds} rounds, {toggles} protection changes raced the writer");
    assert!(toggles > 0, "no change raced the writes");
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

/// x86's lazy TLB: a CPU whose thread sleeps keeps the mm loaded and is
/// sent no flush unless page tables were freed (it compares generations
/// when it runs again); a CPU running kernel code for the mm is sent every
/// flush, and takes it at its next kernel entry. Every request sent is
/// received.
#[test]
fn lazy_cpus_are_sent_flushes_only_when_tables_are_freed() {
    use usermm::vmstat::Event::{NR_TLB_REMOTE_FLUSH_RECEIVED, TLB_IPI_SENT, TLB_LAZY_FLUSH};
    let m = Machine::new(MachineConfig::single_node(64 << 20, 2)).unwrap();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    let r = 0x4000_0000;
    c0.mmap(
        r,
        4 << 20,
        PROT_READ | PROT_WRITE,
        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
    )
    .unwrap();
    c0.store_u64(r + (2 << 20), 1).unwrap();
    let step = AtomicU64::new(0);
    let wait = |s: u64| {
        while step.load(Ordering::Acquire) != s {
            std::hint::spin_loop();
        }
    };
    let sent = || m.vmstat().event_on(0, TLB_IPI_SENT);
    let received = || m.vmstat().event_on(1, NR_TLB_REMOTE_FLUSH_RECEIVED);
    std::thread::scope(|s| {
        s.spawn(|| {
            let c1 = m.bind(1).unwrap();
            c1.switch_mm(&mm);
            c1.store_u64(r, 1).unwrap();
            c1.idle();
            step.store(1, Ordering::Release);
            wait(2);
            // A system call: back from lazy mode, then in the kernel.
            c1.madvise(r, 4096, usermm::madvise::MADV_NORMAL).unwrap();
            step.store(3, Ordering::Release);
            wait(4);
            c1.madvise(r, 4096, usermm::madvise::MADV_NORMAL).unwrap();
            step.store(5, Ordering::Release);
            wait(6);
            c1.idle();
        });
        wait(1);
        assert!(m.cpus[1].is_lazy());
        // A protection change frees no table: the lazy CPU is skipped.
        c0.mprotect(r, 4096, PROT_READ).unwrap();
        assert_eq!((sent(), m.cpus[1].nr_posted()), (0, 0));
        // Unmapping a whole PTE table's range frees it: sent, not waited for.
        c0.munmap(r + (2 << 20), 2 << 20).unwrap();
        assert_eq!((sent(), m.cpus[1].nr_posted()), (1, 1));
        step.store(2, Ordering::Release);
        wait(3);
        // Back from lazy mode, CPU 1 counted what it was sent and caught up
        // with both flushes in full.
        assert_eq!(received(), 1);
        assert_eq!(m.vmstat().event_on(1, TLB_LAZY_FLUSH), 1);
        // In the kernel, CPU 1 is sent every flush.
        c0.mprotect(r, 4096, PROT_READ | PROT_WRITE).unwrap();
        assert_eq!((sent(), m.cpus[1].nr_posted()), (2, 1));
        step.store(4, Ordering::Release);
        wait(5);
        assert_eq!((received(), m.cpus[1].nr_posted()), (2, 0));
        step.store(6, Ordering::Release);
    });
    c0.idle();
    check_invariants(&m).unwrap();
}

/// A sender counts the time it waits for its shootdowns to be
/// acknowledged (`usermm_tlb_shootdown_wait_us`, model-only): a target in
/// user mode whose thread is slow to take the request (here it sleeps
/// 20 ms once the request is posted, as a thread waiting for a host core
/// would) costs the whole wait; a lazy target, sent nothing, costs
/// nothing.
#[test]
fn a_sender_counts_its_wait_for_acknowledgements() {
    use usermm::vmstat::Event::TLB_SHOOTDOWN_WAIT_US;
    let m = Machine::new(MachineConfig::single_node(64 << 20, 2)).unwrap();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    let r = 0x4000_0000;
    c0.mmap(r, 2 * 4096, RW, ANON | MAP_FIXED).unwrap();
    c0.touch_pages(r, r + 2 * 4096, 1).unwrap();
    let waited = || m.vmstat().event_on(0, TLB_SHOOTDOWN_WAIT_US);
    let step = AtomicU64::new(0);
    let wait = |s: u64| {
        while step.load(Ordering::Acquire) != s {
            std::hint::spin_loop();
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            let c1 = m.bind(1).unwrap();
            c1.switch_mm(&mm);
            c1.load_u64(r).unwrap();
            step.store(1, Ordering::Release);
            // Slow from the moment the request is posted.
            while !m.cpus[1].mail_waiting() {
                std::hint::spin_loop();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            // The next access takes the request.
            c1.load_u64(r + 4096).unwrap();
            c1.idle();
            step.store(2, Ordering::Release);
        });
        wait(1);
        let before = waited();
        c0.mprotect(r, 4096, PROT_READ).unwrap();
        let slow = waited() - before;
        assert!(slow >= 15_000, "waited {slow} us for a target asleep 20 ms");
        wait(2);
        assert!(m.cpus[1].is_lazy());
        let before = waited();
        c0.mprotect(r, 4096, PROT_READ | PROT_WRITE).unwrap();
        assert_eq!(waited(), before, "a lazy target is not waited for");
    });
    c0.idle();
    check_invariants(&m).unwrap();
}

/// Three CPUs of one process fault and store in a mapping and in the
/// heap while a fourth, under each `fault_lock`, moves parts of the
/// mapping away and back (mremap), locks and unlocks them (mlock2, with
/// and without MLOCK_ONFAULT, populating under the faults), and grows and
/// shrinks the heap (brk). Every load is checked by the shadow memory;
/// the invariant checker runs after each round.
#[test]
fn mremap_mlock_brk_under_faulting_cpus() {
    use usermm::mlock::MLOCK_ONFAULT;
    use usermm::mremap::{MREMAP_FIXED, MREMAP_MAYMOVE};
    use usermm::tunable::FaultLock;
    const LEN: u64 = 64 * 4096;
    const CHUNK: u64 = 8 * 4096;
    const HEAP: u64 = 0x5000_0000_0000;
    const HEAP_LEN: u64 = 32 * 4096;
    for lock in [FaultLock::MmapLock, FaultLock::Spf, FaultLock::VmaLock] {
        let m = Machine::new(MachineConfig::single_node(128 << 20, 4)).unwrap();
        m.tunables.set_fault_lock(lock);
        let shadow = Shadow::new();
        let c0 = m.bind(0).unwrap();
        let mm = c0.new_mm().unwrap();
        {
            let g = mm.mmap_lock.write();
            mm.set_layout(&g, |l| (l.start_brk, l.brk) = (HEAP, HEAP));
        }
        let a = c0
            .mmap(0x4000_0000_0000, LEN, RW, ANON | MAP_FIXED)
            .unwrap();
        // Where chunks are moved to, and back from.
        let away = a + (1 << 30);
        let stop = AtomicBool::new(false);
        let accesses = AtomicU64::new(0);
        std::thread::scope(|s| {
            let _stop = StopOnDrop(&stop);
            for id in 1..4u64 {
                let (m, mm, stop, shadow, accesses) = (&m, mm.clone(), &stop, &shadow, &accesses);
                s.spawn(move || {
                    let c = m.bind(id as usize).unwrap();
                    c.switch_mm(&mm);
                    let mut rng = SmallRng::seed_from_u64(id);
                    let mut seq = 1u64;
                    while !stop.load(Ordering::Relaxed) {
                        let addr = if rng.gen_bool(0.7) {
                            a + rng.gen_range(0..LEN / 8) * 8
                        } else {
                            HEAP + rng.gen_range(0..HEAP_LEN / 8) * 8
                        };
                        let r = if rng.gen_bool(0.5) {
                            seq += 1;
                            shadow.store_u64(&c, addr, (id << 56) | seq)
                        } else {
                            shadow.load_u64(&c, addr).map(|_| ())
                        };
                        assert!(matches!(r, Ok(()) | Err(Errno::EFAULT)), "{lock:?}: {r:?}");
                        accesses.fetch_add(1, Ordering::Relaxed);
                    }
                    c.idle();
                });
            }
            let mut rng = SmallRng::seed_from_u64(99);
            let mut i = 0u64;
            while i < 300 || accesses.load(Ordering::Relaxed) < 30_000 {
                i += 1;
                let start = a + rng.gen_range(0..LEN / CHUNK) * CHUNK;
                match i % 3 {
                    0 => {
                        let flags = MREMAP_MAYMOVE | MREMAP_FIXED;
                        shadow
                            .remap(&c0, mm.id, start, away, CHUNK, || {
                                c0.mremap(start, CHUNK, CHUNK, flags, away)
                            })
                            .unwrap();
                        shadow
                            .remap(&c0, mm.id, away, start, CHUNK, || {
                                c0.mremap(away, CHUNK, CHUNK, flags, start)
                            })
                            .unwrap();
                    }
                    1 => {
                        let flags = if rng.gen_bool(0.5) { MLOCK_ONFAULT } else { 0 };
                        c0.mlock2(start, CHUNK, flags).unwrap();
                        c0.munlock(start, CHUNK).unwrap();
                    }
                    _ => {
                        let want = HEAP + rng.gen_range(0..=HEAP_LEN / 4096) * 4096;
                        let old = mm.layout().brk;
                        let (lo, hi) = (old.min(want), old.max(want));
                        if lo == hi {
                            continue;
                        }
                        // The pages between the old and the new break read
                        // as zero from now on: unmapped, or mapped anew.
                        let got = shadow.zap(&c0, mm.id, lo, hi, || c0.brk(want).unwrap());
                        assert_eq!(got, want, "{lock:?}: brk refused");
                    }
                }
            }
            stop.store(true, Ordering::Relaxed);
            c0.idle();
        });
        shadow.verdict().unwrap_or_else(|e| panic!("{lock:?}: {e}"));
        assert!(
            shadow.loads_checked() > 5_000,
            "{lock:?}: too few loads checked"
        );
        c0.exit_mm().unwrap();
        drop(c0);
        m.rcu_barrier();
        check_invariants(&m).unwrap_or_else(|e| panic!("{lock:?}: {e}"));
    }
}
