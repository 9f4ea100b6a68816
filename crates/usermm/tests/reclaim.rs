//! Reclaim with demotion: a process bound to a small DRAM node that writes
//! more than the node holds has its cold pages demoted to the slow tier by
//! kswapd and direct reclaim, with nothing lost; without demotion the
//! same writes run out of memory. Reclaim also discards clean lazyfree
//! folios under pressure. The invariant checker runs once kswapd is idle.

use std::sync::Arc;

use usermm::check::check_invariants;
use usermm::madvise::MADV_FREE;
use usermm::mempolicy::MPOL_BIND;
use usermm::mmap::*;
use usermm::vmstat::Event;
use usermm::{Errno, Machine, MachineConfig, OnCpu};

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;

fn tiered(fast_mib: u64) -> Arc<Machine> {
    Machine::new(MachineConfig::two_tiers(fast_mib << 20, 256 << 20, 2)).unwrap()
}

fn nodes_of(c: &OnCpu, a: u64, len: u64) -> [usize; 2] {
    let pages: Vec<u64> = (a..a + len).step_by(PAGE as usize).collect();
    let mut status = vec![0; pages.len()];
    c.move_pages(&pages, None, &mut status).unwrap();
    let mut n = [0; 2];
    for s in status {
        n[s as usize] += 1;
    }
    n
}

/// Write `len` bytes bound to node 0, page by page; the first error.
fn write_bound(c: &OnCpu, len: u64) -> Result<u64, Errno> {
    let a = c.mmap(0, len, RW, ANON).unwrap();
    c.mbind(a, len, MPOL_BIND, &[1], 64, 0).unwrap();
    for p in (a..a + len).step_by(PAGE as usize) {
        c.store_u64(p, p)?;
    }
    Ok(a)
}

#[test]
fn demotion_makes_room_on_the_fast_node() {
    let m = tiered(32);
    m.set_demotion_enabled(true);
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let len = 48 << 20;
    let a = write_bound(&c, len).expect("demotion makes room");
    // Idle first: kswapd's shootdowns wait for CPUs in user mode.
    c.idle();
    m.kswapd_quiesce();
    for p in (a..a + len).step_by(PAGE as usize) {
        assert_eq!(c.load_u64(p).unwrap(), p, "page {p:#x}");
    }
    let [fast, slow] = nodes_of(&c, a, len);
    assert!(slow > 0 && fast > 0, "fast {fast}, slow {slow}");
    let v = m.vmstat();
    let demoted = v.event(Event::PGDEMOTE_KSWAPD) + v.event(Event::PGDEMOTE_DIRECT);
    assert_eq!(
        demoted, slow as u64,
        "every page on the slow node was demoted"
    );
    assert!(v.event(Event::PGSCAN_ANON) >= demoted);
    assert!(v.event(Event::PGSTEAL_ANON) >= demoted);
    c.idle();
    m.kswapd_quiesce();
    check_invariants(&m).unwrap();
}

#[test]
fn without_demotion_the_bound_writes_run_out() {
    let m = tiered(32);
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    assert!(write_bound(&c, 48 << 20).is_err());
    assert_eq!(m.vmstat().event(Event::PGDEMOTE_KSWAPD), 0);
    c.idle();
    m.kswapd_quiesce();
    check_invariants(&m).unwrap();
}

#[test]
fn reclaim_discards_clean_lazyfree_folios() {
    let m = tiered(32);
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let len = 16 << 20;
    let a = c.mmap(0, len, RW, ANON).unwrap();
    c.mbind(a, len, MPOL_BIND, &[1], 64, 0).unwrap();
    for p in (a..a + len).step_by(PAGE as usize) {
        c.store_u64(p, p).unwrap();
    }
    c.madvise(a, len, MADV_FREE).unwrap();
    // More bound memory than is left: reclaim drops the lazyfree pages.
    write_bound(&c, 24 << 20).expect("the lazyfree pages make room");
    c.idle();
    m.kswapd_quiesce();
    let freed = m.vmstat().event(Event::PGLAZYFREED);
    assert!(freed > 0, "reclaim discarded lazyfree pages");
    assert!(m.vmstat().event(Event::PGSTEAL_FILE) >= freed);
    // Discarded pages read back as zeroes, the others as written.
    for p in (a..a + len).step_by(PAGE as usize) {
        let v = c.load_u64(p).unwrap();
        assert!(v == p || v == 0, "page {p:#x}: {v:#x}");
    }
    c.idle();
    m.kswapd_quiesce();
    check_invariants(&m).unwrap();
}

/// NUMA balancing in tiering mode with demotion: a working set larger
/// than the fast node spills to the slow one; the part of it that keeps
/// being used is found by the scanner's hinting faults and promoted, and
/// kswapd demotes the cold part to make room for it.
#[test]
fn hot_pages_are_promoted_and_cold_ones_demoted() {
    use std::sync::atomic::Ordering::Relaxed;
    let m = tiered(32);
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
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let len = 48 << 20;
    let a = c.mmap(0, len, RW, ANON).unwrap();
    for p in (a..a + len).step_by(PAGE as usize) {
        c.store_u64(p, p).unwrap();
    }
    // The last 4 MiB were placed last: on the slow node.
    let hot = a + len - (4 << 20);
    let hot_len = 4 << 20;
    let before = nodes_of(&c, hot, hot_len);
    assert!(
        before[1] > 0,
        "the hot part starts on the slow node: {before:?}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while nodes_of(&c, hot, hot_len)[0] < (hot_len / PAGE) as usize * 9 / 10
        && std::time::Instant::now() < deadline
    {
        for p in (hot..hot + hot_len).step_by(PAGE as usize) {
            assert_eq!(c.load_u64(p).unwrap(), p);
        }
    }
    c.idle();
    m.kswapd_quiesce();
    let after = nodes_of(&c, hot, hot_len);
    let v = m.vmstat();
    let promoted = v.node(usermm::vmstat::NodeStat::PGPROMOTE_SUCCESS);
    eprintln!("hot part {before:?} -> {after:?}; pte updates {}, hint faults {}, promoted {promoted}, demoted {}", v.event(Event::NUMA_PTE_UPDATES), v.event(Event::NUMA_HINT_FAULTS), v.event(Event::PGDEMOTE_KSWAPD));
    assert!(v.event(Event::NUMA_PTE_UPDATES) > 0);
    assert!(v.event(Event::NUMA_HINT_FAULTS) > 0);
    assert!(promoted > 0, "promoted {promoted}");
    assert!(v.event(Event::PGDEMOTE_KSWAPD) > 0, "kswapd made room");
    assert!(after[0] > before[0], "{before:?} -> {after:?}");
    for p in (a..a + len).step_by(PAGE as usize) {
        assert_eq!(c.load_u64(p).unwrap(), p, "page {p:#x}");
    }
    c.idle();
    m.kswapd_quiesce();
    check_invariants(&m).unwrap();
}

/// A PMD-mapped THP on the slow node is hinted by its PMD (512 PTE
/// updates) and promoted whole by its hinting fault
/// (`do_huge_pmd_numa_page`): it arrives PMD-mapped, its contents intact,
/// with no PMD split on the way.
#[test]
fn a_hot_thp_is_promoted_whole_by_its_pmd() {
    use std::sync::atomic::Ordering::Relaxed;
    let m = tiered(64);
    m.thp.set_enabled(usermm::ThpMode::Always).unwrap();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let huge = 2u64 << 20;
    let raw = c.mmap(0, 2 * huge, RW, ANON).unwrap();
    let a = (raw + huge - 1) & !(huge - 1);
    // Placed on the slow node, then left free to move.
    c.mbind(a, huge, MPOL_BIND, &[0b10], 3, 0).unwrap();
    for p in (a..a + huge).step_by(PAGE as usize) {
        c.store_u64(p, p).unwrap();
    }
    assert_eq!(nodes_of(&c, a, huge), [0, 512]);
    c.mbind(a, huge, usermm::mempolicy::MPOL_DEFAULT, &[], 0, 0)
        .unwrap();
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
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while nodes_of(&c, a, huge)[0] < 512 && std::time::Instant::now() < deadline {
        for p in (a..a + huge).step_by(PAGE as usize) {
            assert_eq!(c.load_u64(p).unwrap(), p);
        }
    }
    m.numa.mode.store(0, Relaxed);
    c.idle();
    m.kswapd_quiesce();
    let v = m.vmstat();
    assert_eq!(nodes_of(&c, a, huge), [512, 0], "promoted");
    assert_eq!(v.node(usermm::vmstat::NodeStat::PGPROMOTE_SUCCESS), 512);
    assert_eq!(v.event(Event::THP_MIGRATION_SUCCESS), 1);
    assert_eq!(v.event(Event::THP_SPLIT_PMD), 0, "no PMD split");
    assert!(v.event(Event::NUMA_PTE_UPDATES) >= 512);
    let thp = usermm::proc::smaps_rollup(&mm).anon_huge_pages;
    assert_eq!(thp, huge >> 10, "mapped by a PMD again");
    for p in (a..a + huge).step_by(PAGE as usize) {
        assert_eq!(c.load_u64(p).unwrap(), p);
    }
    c.idle();
    m.kswapd_quiesce();
    check_invariants(&m).unwrap();
}

/// A hinting fault moves a folio only where the VMA's policy lets it go
/// (`mpol_misplaced`): with no policy, to the faulting CPU's node; bound
/// with `MPOL_F_NUMA_BALANCING`, only to one of the bound nodes; under a
/// policy made without it, nowhere (such a VMA is not scanned, but an
/// entry hinted before the policy was set still faults).
#[test]
fn a_hinting_fault_promotes_only_where_the_policy_allows() {
    use std::sync::atomic::Ordering::Relaxed;
    use usermm::mempolicy::{MPOL_DEFAULT, MPOL_F_NUMA_BALANCING};
    use usermm::numa_balancing::{task_numa_work, NUMA_BALANCING_MEMORY_TIERING};
    let m = tiered(64);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let len = 16 * PAGE;
    // Four regions written on the slow node.
    let regions: Vec<u64> = (0..4)
        .map(|_| {
            let a = c.mmap(0, len, RW, ANON).unwrap();
            c.mbind(a, len, MPOL_BIND, &[0b10], 3, 0).unwrap();
            for p in (a..a + len).step_by(PAGE as usize) {
                c.store_u64(p, p).unwrap();
            }
            assert_eq!(nodes_of(&c, a, len), [0, 16]);
            a
        })
        .collect();
    let [free, slow_only, both, plain] = regions[..] else {
        unreachable!()
    };
    let balancing = MPOL_BIND | MPOL_F_NUMA_BALANCING;
    c.mbind(free, len, MPOL_DEFAULT, &[], 0, 0).unwrap();
    c.mbind(slow_only, len, balancing, &[0b10], 3, 0).unwrap();
    c.mbind(both, len, balancing, &[0b11], 3, 0).unwrap();
    c.mbind(plain, len, MPOL_DEFAULT, &[], 0, 0).unwrap();
    // One scan hints all four (the first call only sets when it is due).
    m.numa.scan_delay_ms.store(0, Relaxed);
    m.numa.mode.store(NUMA_BALANCING_MEMORY_TIERING, Relaxed);
    task_numa_work(&c, &mm);
    std::thread::sleep(std::time::Duration::from_millis(2));
    task_numa_work(&c, &mm);
    assert_eq!(m.vmstat().event(Event::NUMA_PTE_UPDATES), 4 * 16);
    // Bound plainly after it was hinted.
    c.mbind(plain, len, MPOL_BIND, &[0b11], 3, 0).unwrap();
    for &a in &regions {
        for p in (a..a + len).step_by(PAGE as usize) {
            assert_eq!(c.load_u64(p).unwrap(), p);
        }
    }
    m.numa.mode.store(0, Relaxed);
    assert_eq!(m.vmstat().event(Event::NUMA_HINT_FAULTS), 4 * 16);
    assert_eq!(nodes_of(&c, free, len), [16, 0], "no policy: promoted");
    assert_eq!(
        nodes_of(&c, slow_only, len),
        [0, 16],
        "bound to the slow node"
    );
    assert_eq!(nodes_of(&c, both, len), [16, 0], "bound to both");
    assert_eq!(nodes_of(&c, plain, len), [0, 16], "bound without balancing");
    c.idle();
    m.kswapd_quiesce();
    check_invariants(&m).unwrap();
}

/// A fast node with a GiB free above its promotion watermark takes a
/// folio up whatever its hint latency (`pgdat_free_space_enough`),
/// counted in `pgpromote_candidate_nrl` and not against the rate limit;
/// a smaller one, only a hot folio. With the hot threshold at 0, no
/// folio is hot.
#[test]
fn a_fast_node_with_room_to_spare_promotes_whatever_the_latency() {
    use std::sync::atomic::Ordering::Relaxed;
    use usermm::mempolicy::MPOL_DEFAULT;
    use usermm::numa_balancing::{task_numa_work, NUMA_BALANCING_MEMORY_TIERING};
    use usermm::vmstat::NodeStat;
    for (fast_mib, promoted) in [(2048, 16), (512, 0)] {
        let m = tiered(fast_mib);
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let len = 16 * PAGE;
        let a = c.mmap(0, len, RW, ANON).unwrap();
        c.mbind(a, len, MPOL_BIND, &[0b10], 3, 0).unwrap();
        for p in (a..a + len).step_by(PAGE as usize) {
            c.store_u64(p, p).unwrap();
        }
        c.mbind(a, len, MPOL_DEFAULT, &[], 0, 0).unwrap();
        // Off the per-CPU batch, onto the LRU a migration isolates from.
        usermm::swap::lru_add_drain(c.mem(), c.id());
        m.numa.hot_threshold_ms.store(0, Relaxed);
        m.numa.scan_delay_ms.store(0, Relaxed);
        m.numa.mode.store(NUMA_BALANCING_MEMORY_TIERING, Relaxed);
        task_numa_work(&c, &mm);
        std::thread::sleep(std::time::Duration::from_millis(2));
        task_numa_work(&c, &mm);
        for p in (a..a + len).step_by(PAGE as usize) {
            assert_eq!(c.load_u64(p).unwrap(), p);
        }
        m.numa.mode.store(0, Relaxed);
        let v = m.vmstat();
        assert_eq!(v.event(Event::NUMA_HINT_FAULTS), 16, "{fast_mib} MiB");
        assert_eq!(nodes_of(&c, a, len)[0], promoted, "{fast_mib} MiB");
        assert_eq!(v.node(NodeStat::PGPROMOTE_CANDIDATE_NRL), promoted as i64);
        c.idle();
        m.kswapd_quiesce();
        check_invariants(&m).unwrap();
    }
}
