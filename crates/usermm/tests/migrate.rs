//! Page migration between nodes (move_pages): folios of every size move
//! with their contents, mappings and flags; a fork's shared folio is
//! refused; the batched unmap flush sends one shootdown per batch where
//! one per page was sent before v6.3; and CPUs that keep loading and
//! storing while their pages migrate back and forth lose nothing. The
//! invariant checker runs after each step.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use usermm::check::check_invariants;
use usermm::madvise::MADV_HUGEPAGE;
use usermm::mmap::*;
use usermm::vmstat::Event;
use usermm::{Errno, Machine, MachineConfig, OnCpu};

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;

/// Node 0: DRAM with the CPUs; node 1: a slow tier without CPUs.
fn tiered() -> Arc<Machine> {
    Machine::new(MachineConfig::two_tiers(128 << 20, 128 << 20, 2)).unwrap()
}

fn pages_of(a: u64, len: u64) -> Vec<u64> {
    (a..a + len).step_by(PAGE as usize).collect()
}

/// Move `[a, a+len)` to `node`; returns the pages not moved and the
/// statuses.
fn move_to(c: &OnCpu, a: u64, len: u64, node: i32) -> (usize, Vec<i32>) {
    let pages = pages_of(a, len);
    let nodes = vec![node; pages.len()];
    let mut status = vec![0; pages.len()];
    let n = c.move_pages(&pages, Some(&nodes), &mut status).unwrap();
    (n, status)
}

fn where_is(c: &OnCpu, a: u64, len: u64) -> Vec<i32> {
    let pages = pages_of(a, len);
    let mut status = vec![0; pages.len()];
    c.move_pages(&pages, None, &mut status).unwrap();
    status
}

fn fill(c: &OnCpu, a: u64, len: u64, seed: u64) {
    for p in pages_of(a, len) {
        c.store_u64(p + 8, p ^ seed).unwrap();
    }
}

fn check(c: &OnCpu, a: u64, len: u64, seed: u64) {
    for p in pages_of(a, len) {
        assert_eq!(c.load_u64(p + 8).unwrap(), p ^ seed, "page {p:#x}");
    }
}

#[test]
fn small_folios_move_with_their_contents() {
    let m = tiered();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let len = 64 * PAGE;
    let a = c.mmap(0, len, RW, ANON).unwrap();
    fill(&c, a, len, 1);
    assert!(where_is(&c, a, len).iter().all(|&n| n == 0));
    let (failed, status) = move_to(&c, a, len, 1);
    assert_eq!(failed, 0);
    assert!(status.iter().all(|&s| s == 1), "{status:?}");
    assert!(where_is(&c, a, len).iter().all(|&n| n == 1));
    assert_eq!(m.vmstat().event(Event::PGMIGRATE_SUCCESS), 64);
    check_invariants(&m).unwrap();
    check(&c, a, len, 1);
    // Written again (the entries kept the write permission), and back.
    fill(&c, a, len, 2);
    assert_eq!(move_to(&c, a, len, 0).0, 0);
    check(&c, a, len, 2);
    check_invariants(&m).unwrap();
    c.exit_mm().unwrap();
    check_invariants(&m).unwrap();
}

#[test]
fn large_folios_move_whole() {
    let m = tiered();
    m.thp.only_order(4);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let len = 256 << 10;
    let a = c.mmap(0, len, RW, ANON).unwrap();
    fill(&c, a, len, 3);
    assert_eq!(move_to(&c, a, len, 1).0, 0);
    let t = usermm::pgtable::walk::hw_walk(&m.mem, mm.pgd.cr3(), a, false).unwrap();
    let f = m.mem.page_folio(t.pfn);
    assert_eq!(f.nid(), 1);
    assert_eq!(f.order(&m.mem), 4, "the destination is a 64K folio too");
    check(&c, a, len, 3);
    check_invariants(&m).unwrap();
}

#[test]
fn a_pmd_mapped_thp_moves() {
    let m = tiered();
    m.thp.set_enabled(usermm::ThpMode::Always).unwrap();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let len = 4 << 20;
    let a = c.mmap(0, len, RW, ANON).unwrap();
    c.madvise(a, len, MADV_HUGEPAGE).unwrap();
    fill(&c, a, len, 4);
    assert_eq!(move_to(&c, a, len, 1).0, 0);
    assert_eq!(m.vmstat().event(Event::THP_MIGRATION_SUCCESS), 2);
    // Through a PMD migration entry: the destination is mapped by a PMD
    // again, and no PMD was split.
    assert_eq!(m.vmstat().event(Event::THP_SPLIT_PMD), 0);
    let thp = usermm::proc::smaps_rollup(&c.mm().unwrap()).anon_huge_pages;
    assert_eq!(thp, len >> 10, "AnonHugePages after the move");
    assert_eq!(where_is(&c, a, len), vec![1; (len / PAGE) as usize]);
    check(&c, a, len, 4);
    check_invariants(&m).unwrap();
}

/// PMD migration entries stand while other paths meet them: CPU 0 moves
/// PMD-mapped THPs back and forth while CPU 1, on each THP in turn, zaps
/// it whole with MADV_DONTNEED and faults it in again (a writable THP),
/// mprotects it read-only (a writable entry must become readable) and
/// back, mprotects half of it (the entry is split into PTE migration
/// entries), and forks (the child copies the entries, then exits). A THP
/// that is read-only once mprotect returns must refuse a store however
/// its migration ends, and the invariant checker must be clean.
#[test]
fn pmd_migration_entries_meet_fork_mprotect_split_and_zap() {
    let spin = |us| {
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_micros(us) {
            std::hint::spin_loop();
        }
    };
    use std::sync::atomic::Ordering::Relaxed;
    let m = tiered();
    m.thp.set_enabled(usermm::ThpMode::Always).unwrap();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    let huge = 2u64 << 20;
    let len = 8 * huge;
    let raw = c0.mmap(0, len + huge, RW, ANON).unwrap();
    let a = (raw + huge - 1) & !(huge - 1);
    c0.madvise(a, len, MADV_HUGEPAGE).unwrap();
    fill(&c0, a, len, 6);
    c0.idle();
    let stop = AtomicBool::new(false);
    let refused = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let c = m.bind(1).unwrap();
            c.switch_mm(&mm);
            let mut round = 0u64;
            while !stop.load(Relaxed) {
                // Each THP in turn meets each operation; the zap makes a
                // THP of one the half mprotect split.
                let chunk = a + (round / 4 % 8) * huge;
                match round % 4 {
                    0 => {
                        // A fresh THP, writable: its migration entries are.
                        c.madvise(chunk, huge, usermm::madvise::MADV_DONTNEED)
                            .unwrap();
                        c.store_u64(chunk, round).unwrap();
                        assert_eq!(c.load_u64(chunk).unwrap(), round);
                    }
                    1 => {
                        // Give the mover time to reach this THP while it
                        // is writable.
                        spin(100);
                        c.mprotect(chunk, huge, PROT_READ).unwrap();
                        assert_eq!(c.store_u8(chunk + 100, 1), Err(Errno::EFAULT));
                    }
                    2 => {
                        // Read-only still, after a migration may have put
                        // the THP back meanwhile.
                        spin(200);
                        assert_eq!(c.store_u8(chunk + 100, 1), Err(Errno::EFAULT));
                        refused.fetch_add(1, Relaxed);
                        c.mprotect(chunk, huge, RW).unwrap();
                        // Every other pass over the THPs, split it (until
                        // the next zap makes a new one).
                        if round / 32 % 2 == 1 {
                            let half = chunk + huge / 2;
                            c.mprotect(half, huge / 2, PROT_READ).unwrap();
                            assert_eq!(c.store_u8(half, 1), Err(Errno::EFAULT));
                            c.mprotect(half, huge / 2, RW).unwrap();
                        }
                    }
                    _ => {
                        let child = c.fork().unwrap();
                        c.switch_mm(&child);
                        c.exit_mm().unwrap();
                        c.switch_mm(&mm);
                    }
                }
                round += 1;
            }
            c.idle();
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(600);
        let mut node = 1;
        while std::time::Instant::now() < deadline {
            move_to(&c0, a, len, node);
            node = 1 - node;
        }
        stop.store(true, Relaxed);
    });
    c0.idle();
    m.rcu_barrier();
    check_invariants(&m).unwrap();
    let ev = m.vmstat();
    eprintln!(
        "thp migrated {}, split {}, PMD splits {}, read-only refusals {}",
        ev.event(Event::THP_MIGRATION_SUCCESS),
        ev.event(Event::THP_MIGRATION_SPLIT),
        ev.event(Event::THP_SPLIT_PMD),
        refused.load(Relaxed)
    );
    assert!(ev.event(Event::THP_MIGRATION_SUCCESS) > 0);
    assert!(refused.load(Relaxed) > 0);
}

#[test]
fn move_pages_reports_and_refuses() {
    let m = tiered();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let a = c.mmap(0, 4 * PAGE, RW, ANON).unwrap();
    c.store_u64(a, 1).unwrap();
    // Unpopulated page: ENOENT; unmapped address: EFAULT.
    let s = where_is(&c, a, 2 * PAGE);
    assert_eq!(s, vec![0, -Errno::ENOENT.0]);
    let mut st = [0];
    c.move_pages(&[0x1000], None, &mut st).unwrap();
    assert_eq!(st[0], -Errno::EFAULT.0);
    // A node that does not exist fails the call.
    assert_eq!(c.move_pages(&[a], Some(&[7]), &mut st), Err(Errno::ENODEV));
    // A page shared with a fork child is not moved without MPOL_MF_MOVE_ALL.
    let _child = c.fork().unwrap();
    let (failed, status) = move_to(&c, a, PAGE, 1);
    assert_eq!(failed, 0);
    assert_eq!(status, vec![-Errno::EACCES.0]);
    check_invariants(&m).unwrap();
}

/// With a second CPU running the mm, the unmap of each batch of 512 pages
/// sends one shootdown with `migrate_batch_flush` on, and one per page
/// with it off.
#[test]
fn the_batched_flush_sends_one_shootdown_per_batch() {
    let m = tiered();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    let len = 1024 * PAGE;
    let a = c0.mmap(0, len, RW, ANON).unwrap();
    fill(&c0, a, len, 5);
    let c1 = m.bind(1).unwrap();
    c1.switch_mm(&mm);
    c1.idle();
    let remote = || m.vmstat().event_on(0, Event::NR_TLB_REMOTE_FLUSH);
    let r0 = remote();
    assert_eq!(move_to(&c0, a, len, 1).0, 0);
    let batched = remote() - r0;
    assert_eq!(batched, 2, "1024 pages, two batches");
    m.tunables.set_migrate_batch_flush(false);
    let r1 = remote();
    assert_eq!(move_to(&c0, a, len, 0).0, 0);
    assert_eq!(remote() - r1, 1024, "one flush per PTE");
    check(&c0, a, len, 5);
    check_invariants(&m).unwrap();
}

/// CPUs store and load their pages while CPU 0 moves them back and forth
/// between the nodes: every load returns the last store.
#[test]
fn loads_and_stores_survive_migration() {
    for order in [0, 4] {
        let m = Machine::new(MachineConfig::two_tiers(64 << 20, 64 << 20, 3)).unwrap();
        m.thp.only_order(order);
        let c0 = m.bind(0).unwrap();
        let mm = c0.new_mm().unwrap();
        let len = 256 * PAGE;
        let a = c0.mmap(0, len, RW, ANON).unwrap();
        fill(&c0, a, len, 0);
        c0.idle();
        let stop = AtomicBool::new(false);
        let passes = [AtomicU64::new(0), AtomicU64::new(0)];
        let mut rounds = 0u64;
        std::thread::scope(|s| {
            for id in 1..3usize {
                let (m, mm, stop, done) = (&m, mm.clone(), &stop, &passes[id - 1]);
                s.spawn(move || {
                    let c = m.bind(id).unwrap();
                    c.switch_mm(&mm);
                    let half = len / 2;
                    let mine = a + (id as u64 - 1) * half;
                    let mut v = 1u64;
                    while !stop.load(Ordering::Relaxed) {
                        for p in pages_of(mine, half) {
                            c.store_u64(p, v).unwrap();
                        }
                        for p in pages_of(mine, half) {
                            assert_eq!(c.load_u64(p).unwrap(), v, "page {p:#x} lost a store");
                        }
                        v += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    c.idle();
                });
            }
            // At least 20 rounds, and until each CPU has stored and
            // checked its pages 20 times meanwhile.
            while rounds < 20 || passes.iter().any(|p| p.load(Ordering::Relaxed) < 20) {
                move_to(&c0, a, len, ((rounds % 2 + 1) % 2) as i32);
                rounds += 1;
                assert!(rounds < 100_000, "the writers made no progress");
            }
            stop.store(true, Ordering::Relaxed);
        });
        check_invariants(&m).unwrap();
        check(&c0, a, len, 0);
        let (ok, fail) = (
            m.vmstat().event(Event::PGMIGRATE_SUCCESS),
            m.vmstat().event(Event::PGMIGRATE_FAIL),
        );
        eprintln!("order {order}: {rounds} rounds, migrated {ok}, failed {fail}");
        assert!(ok >= rounds * 256 / 2, "most pages moved each round: {ok}");
    }
}

mod mempolicy {
    use super::*;
    use usermm::mempolicy::*;

    fn node_of(c: &OnCpu, a: u64) -> i32 {
        where_is(c, a, PAGE)[0]
    }

    #[test]
    fn bind_places_faults_and_move_migrates() {
        let m = tiered();
        let c = m.bind(0).unwrap();
        c.new_mm().unwrap();
        let a = c.mmap(0, 16 * PAGE, RW, ANON).unwrap();
        // The second half bound to node 1 before it is touched.
        c.mbind(a + 8 * PAGE, 8 * PAGE, MPOL_BIND, &[0b10], 64, 0)
            .unwrap();
        fill(&c, a, 16 * PAGE, 7);
        assert_eq!(node_of(&c, a), 0);
        assert_eq!(node_of(&c, a + 8 * PAGE), 1);
        let status = where_is(&c, a, 16 * PAGE);
        assert_eq!(status[..8], [0; 8]);
        assert_eq!(status[8..], [1; 8]);
        // Binding the first half too, with MPOL_MF_MOVE, moves its pages;
        // the VMAs merge again.
        c.mbind(
            a,
            8 * PAGE,
            MPOL_BIND,
            &[0b10],
            64,
            MPOL_MF_MOVE | MPOL_MF_STRICT,
        )
        .unwrap();
        assert!(where_is(&c, a, 16 * PAGE).iter().all(|&n| n == 1));
        check(&c, a, 16 * PAGE, 7);
        check_invariants(&m).unwrap();
        let mm = c.mm().unwrap();
        assert_eq!(mm.map_count(), 1, "one policy, one VMA");
    }

    /// A page another process maps is left where it is by
    /// `MPOL_MF_MOVE`, and that is no failure under `MPOL_MF_STRICT`
    /// (`migrate_folio_add`); `MPOL_MF_MOVE_ALL` moves it.
    #[test]
    fn move_leaves_shared_pages_and_move_all_moves_them() {
        let m = tiered();
        let c = m.bind(0).unwrap();
        let parent = c.new_mm().unwrap();
        let a = c.mmap(0, 4 * PAGE, RW, ANON).unwrap();
        fill(&c, a, 4 * PAGE, 3);
        let child = c.fork().unwrap();
        c.switch_mm(&child);
        // The child lets go of the first two pages.
        c.munmap(a, 2 * PAGE).unwrap();
        c.switch_mm(&parent);
        c.mbind(
            a,
            4 * PAGE,
            MPOL_BIND,
            &[0b10],
            64,
            MPOL_MF_MOVE | MPOL_MF_STRICT,
        )
        .unwrap();
        assert_eq!(where_is(&c, a, 4 * PAGE), [1, 1, 0, 0]);
        c.mbind(a, 4 * PAGE, MPOL_BIND, &[0b10], 64, MPOL_MF_MOVE_ALL)
            .unwrap();
        assert_eq!(where_is(&c, a, 4 * PAGE), [1, 1, 1, 1]);
        check(&c, a, 4 * PAGE, 3);
        c.switch_mm(&child);
        check(&c, a + 2 * PAGE, 2 * PAGE, 3);
        check_invariants(&m).unwrap();
    }

    #[test]
    fn preferred_and_interleave_and_the_process_policy() {
        let m = tiered();
        let c = m.bind(0).unwrap();
        c.new_mm().unwrap();
        c.set_mempolicy(MPOL_PREFERRED, &[0b10], 64).unwrap();
        let a = c.mmap(0, 4 * PAGE, RW, ANON).unwrap();
        fill(&c, a, 4 * PAGE, 1);
        assert_eq!(node_of(&c, a), 1, "the process prefers node 1");
        let b = c.mmap(0, 4 * PAGE, RW, ANON).unwrap();
        c.mbind(b, 4 * PAGE, MPOL_INTERLEAVE, &[0b11], 64, 0)
            .unwrap();
        fill(&c, b, 4 * PAGE, 2);
        let s = where_is(&c, b, 4 * PAGE);
        assert_eq!(s.iter().filter(|&&n| n == 0).count(), 2, "{s:?}");
        // A forked child keeps both.
        let child = c.fork().unwrap();
        assert_eq!(child.mempolicy.get(), c.mm().unwrap().mempolicy.get());
        check_invariants(&m).unwrap();
    }

    #[test]
    fn bad_policies_get_the_kernels_errno() {
        let m = tiered();
        let c = m.bind(0).unwrap();
        c.new_mm().unwrap();
        let a = c.mmap(0, 4 * PAGE, RW, ANON).unwrap();
        let e = |mode, mask: &[u64], flags| c.mbind(a, PAGE, mode, mask, 64, flags).unwrap_err();
        assert_eq!(e(MPOL_BIND, &[], 0), Errno::EINVAL, "no nodes");
        assert_eq!(
            e(MPOL_DEFAULT, &[1], 0),
            Errno::EINVAL,
            "default with nodes"
        );
        assert_eq!(e(MPOL_LOCAL, &[1], 0), Errno::EINVAL, "local with nodes");
        assert_eq!(e(9, &[1], 0), Errno::EINVAL, "no such mode");
        assert_eq!(e(MPOL_BIND, &[1 << 7], 0), Errno::EINVAL, "no such node");
        assert_eq!(e(MPOL_BIND, &[1], 1 << 3), Errno::EINVAL, "no such flag");
        assert_eq!(
            e(
                MPOL_BIND | MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES,
                &[1],
                0
            ),
            Errno::EINVAL
        );
        assert_eq!(
            c.mbind(a + 1, PAGE, MPOL_BIND, &[1], 64, 0),
            Err(Errno::EINVAL)
        );
        assert_eq!(
            c.mbind(a, 8 * PAGE, MPOL_BIND, &[1], 64, 0),
            Err(Errno::EFAULT),
            "a hole in the range"
        );
        assert_eq!(c.mbind(a, 0, MPOL_BIND, &[1], 64, 0), Ok(()));
        // MPOL_PREFERRED with no nodes is MPOL_LOCAL.
        assert_eq!(c.mbind(a, PAGE, MPOL_PREFERRED, &[], 64, 0), Ok(()));
        check_invariants(&m).unwrap();
    }
}

/// Everything at once, for 4 KiB, 64 KiB and PMD-mapped folios: two CPUs
/// store and load the same pages (through the shadow memory, which checks
/// every load against the stores) while a third moves them back and forth
/// between the nodes, on a machine whose fast node is too small for the
/// working set, with demotion on and NUMA balancing in tiering mode (so
/// that kswapd demotes and hint faults promote meanwhile). No load may
/// return a value that was not the last stored, and the invariant checker
/// must be clean afterwards.
#[test]
fn stores_survive_migration_demotion_and_promotion() {
    use std::sync::atomic::Ordering::Relaxed;
    use usermm::check::shadow::Shadow;
    for order in [0u32, 4, 9] {
        let m = Machine::new(MachineConfig::two_tiers(24 << 20, 96 << 20, 3)).unwrap();
        m.thp.only_order(order);
        m.set_demotion_enabled(true);
        m.numa.mode.store(
            usermm::numa_balancing::NUMA_BALANCING_MEMORY_TIERING,
            Relaxed,
        );
        m.numa.scan_delay_ms.store(0, Relaxed);
        // As often as the kernel scans at all, 16 MB each 6 ms (its cap of
        // 2560 MB a second, `task_scan_min`), and no slower after the passes
        // that promote (`scan_period_max_ms` 0: the period cannot grow).
        m.numa.scan_size_mb.store(16, Relaxed);
        m.numa.scan_period_min_ms.store(0, Relaxed);
        m.numa.scan_period_max_ms.store(0, Relaxed);
        let shadow = Shadow::new();
        let c0 = m.bind(0).unwrap();
        let mm = c0.new_mm().unwrap();
        // A cold working set larger than the fast node, then the shared
        // hot region the CPUs work on.
        let cold_len = 32 << 20;
        let cold = c0.mmap(0, cold_len, RW, ANON).unwrap();
        for p in (cold..cold + cold_len).step_by(PAGE as usize) {
            shadow.store_u64(&c0, p, p).unwrap();
        }
        let len = 4 << 20;
        let a = c0.mmap(0, len, RW, ANON).unwrap();
        for p in (a..a + len).step_by(PAGE as usize) {
            shadow.store_u64(&c0, p, 0).unwrap();
        }
        c0.idle();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for id in 1..3usize {
                let (m, mm, stop, shadow) = (&m, mm.clone(), &stop, &shadow);
                s.spawn(move || {
                    let c = m.bind(id).unwrap();
                    c.switch_mm(&mm);
                    let mut v = id as u64;
                    while !stop.load(Relaxed) {
                        for p in (a..a + len).step_by(PAGE as usize) {
                            // Both CPUs store to every page, at different
                            // words, and load each other's.
                            shadow.store_u64(&c, p + 8 * id as u64, v).unwrap();
                            shadow.load_u64(&c, p + 8 * (3 - id as u64)).unwrap();
                        }
                        v += 2;
                    }
                    c.idle();
                });
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_millis(800);
            let mut node = 1;
            while std::time::Instant::now() < deadline {
                move_to(&c0, a, len, node);
                node = 1 - node;
            }
            stop.store(true, Relaxed);
        });
        // Quiet from here: no more scans (the loads below would run them),
        // and kswapd done before the checker looks.
        m.numa.mode.store(0, Relaxed);
        c0.idle();
        m.kswapd_quiesce();
        let v = shadow.violations();
        assert!(v.is_empty(), "order {order}: {:?}", &v[..v.len().min(3)]);
        for p in (cold..cold + cold_len).step_by(PAGE as usize) {
            assert_eq!(shadow.load_u64(&c0, p).unwrap(), p);
        }
        c0.idle();
        m.kswapd_quiesce();
        check_invariants(&m).unwrap_or_else(|e| panic!("order {order}: {e}"));
        let ev = m.vmstat();
        eprintln!(
            "order {order}: migrated {}, demoted {}, promoted {}, hint faults {}, loads checked {}",
            ev.event(Event::PGMIGRATE_SUCCESS),
            ev.event(Event::PGDEMOTE_KSWAPD) + ev.event(Event::PGDEMOTE_DIRECT),
            ev.node(usermm::vmstat::NodeStat::PGPROMOTE_SUCCESS),
            ev.event(Event::NUMA_HINT_FAULTS),
            shadow.loads_checked()
        );
        assert!(ev.event(Event::PGMIGRATE_SUCCESS) > 0);
    }
}

/// A THP whose destination node has no free 2 MiB block is split, and its
/// pages migrate one by one (`thp_migration_split`): the destination node
/// is filled by another process's 4 KiB pages, every other one of which is
/// then freed, so that it has room but no large block. The fill runs with
/// THPs disabled, so that what it leaves below the min watermark (the
/// machine's own reserve, some 250 pages on node 1) cannot hold a 2 MiB block,
/// as khugepaged's larger reserve for THPs (1,635 pages there) would.
#[test]
fn a_thp_without_a_destination_block_is_split_and_moves() {
    use usermm::madvise::{MADV_DONTNEED, MADV_NOHUGEPAGE};
    use usermm::mempolicy::MPOL_BIND;
    let m = tiered();
    m.thp.only_order(0);
    assert!(m.mem.nodes[1].zone.wmark(0) < 512);
    // The filler, bound to node 1, in 4 KiB pages until it is full.
    let c1 = m.bind(1).unwrap();
    c1.new_mm().unwrap();
    let fill_len = 128 << 20;
    let f = c1.mmap(0, fill_len, RW, ANON).unwrap();
    c1.madvise(f, fill_len, MADV_NOHUGEPAGE).unwrap();
    c1.mbind(f, fill_len, MPOL_BIND, &[0b10], 3, 0).unwrap();
    let mut end = f;
    while end < f + fill_len && c1.store_u64(end, 1).is_ok() {
        end += PAGE;
    }
    assert!(end < f + fill_len, "node 1 filled up");
    let holes = 4096.min((end - f) / PAGE / 2);
    for i in 0..holes {
        c1.madvise(end - (2 * i + 1) * PAGE, PAGE, MADV_DONTNEED)
            .unwrap();
    }
    c1.idle();
    // THPs enabled: the reserve is raised, and node 1 keeps its holes
    // above the new low watermark.
    m.thp.set_enabled(usermm::ThpMode::Always).unwrap();
    m.thp.set_order(9, usermm::ThpMode::Inherit).unwrap();
    let node1 = &m.mem.nodes[1].zone;
    assert!(node1.nr_free_pages() > node1.wmark(1) + 512);
    // The mover, with one PMD-mapped THP on node 0.
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let huge = 2u64 << 20;
    let raw = c.mmap(0, 2 * huge, RW, ANON).unwrap();
    let a = (raw + huge - 1) & !(huge - 1);
    fill(&c, a, huge, 7);
    assert_eq!(usermm::proc::smaps_rollup(&mm).anon_huge_pages, 2048);
    let (left, _) = move_to(&c, a, PAGE, 1);
    let v = m.vmstat();
    assert_eq!(v.event(Event::THP_MIGRATION_SPLIT), 1);
    assert_eq!(v.event(Event::THP_MIGRATION_FAIL), 1);
    assert_eq!(v.event(Event::PGMIGRATE_SUCCESS), 512);
    // As the kernel counts: the split THP is one failure, though every
    // piece moved.
    assert_eq!(left, 1);
    assert_eq!(where_is(&c, a, huge), vec![1; 512]);
    assert_eq!(usermm::proc::smaps_rollup(&mm).anon_huge_pages, 0);
    check(&c, a, huge, 7);
    c.idle();
    m.kswapd_quiesce();
    check_invariants(&m).unwrap();
}

/// `migration_entry_ad`: with it on (x86 with swap, the host), a written
/// page is mapped dirty again after it migrates; with it off (no swap, or
/// the L1TF limit), it comes back clean and old, and a later store dirties
/// it anew.
#[test]
fn migration_entries_carry_the_dirty_bit_only_where_the_kernel_can() {
    let m = tiered();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, PAGE, RW, ANON).unwrap();
    c.store_u64(a, 42).unwrap();
    let dirty = || {
        usermm::pgtable::walk::hw_walk(&m.mem, mm.pgd.cr3(), a, false)
            .unwrap()
            .dirty
    };
    assert!(dirty());
    assert_eq!(move_to(&c, a, PAGE, 1).0, 0);
    assert!(dirty(), "carried across with migration_entry_ad on");
    m.tunables.set_migration_entry_ad(false);
    assert_eq!(move_to(&c, a, PAGE, 0).0, 0);
    assert!(!dirty(), "mapped clean with it off");
    assert_eq!(c.load_u64(a).unwrap(), 42);
    c.store_u64(a, 43).unwrap();
    assert!(dirty());
    assert_eq!(c.load_u64(a).unwrap(), 43);
    check_invariants(&m).unwrap();
}
