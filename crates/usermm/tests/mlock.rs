//! Locked memory end to end: what reclaim, demotion and migration do to
//! mlocked folios, `mlockall`, and the limits, with the invariant checker
//! after each case. The host-comparable cases are the scenarios
//! tests/scenarios/mlock*.scn.

use usermm::check::check_invariants;
use usermm::errno::Errno;
use usermm::fs::{FMode, File, FsKind};
use usermm::mempolicy::MPOL_BIND;
use usermm::mlock::{MCL_CURRENT, MCL_FUTURE, MLOCK_ONFAULT};
use usermm::mm::MmCounter;
use usermm::mmap::*;
use usermm::vmstat::NodeStat;
use usermm::{Machine, MachineConfig, OnCpu};

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;

fn check(m: &Machine, what: &str) {
    m.rcu_barrier();
    if let Err(e) = check_invariants(m) {
        panic!("{what}: {e}");
    }
}

fn nr_mlock(m: &Machine) -> i64 {
    m.mem.vmstat.node(NodeStat::NR_MLOCK)
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

#[test]
fn demotion_passes_over_mlocked_pages() {
    let m = Machine::new(MachineConfig::two_tiers(32 << 20, 256 << 20, 2)).unwrap();
    m.set_demotion_enabled(true);
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    // 8 MiB locked on the fast node, then 40 MiB more bound to it: reclaim
    // must demote the unlocked pages only.
    let locked = c.mmap(0, 8 << 20, RW, ANON).unwrap();
    c.mbind(locked, 8 << 20, MPOL_BIND, &[1], 64, 0).unwrap();
    c.mlock(locked, 8 << 20).unwrap();
    assert_eq!(nr_mlock(&m), 2048);
    let len = 40 << 20;
    let a = c.mmap(0, len, RW, ANON).unwrap();
    c.mbind(a, len, MPOL_BIND, &[1], 64, 0).unwrap();
    for p in (a..a + len).step_by(PAGE as usize) {
        c.store_u64(p, p).expect("demotion makes room");
    }
    c.idle();
    m.kswapd_quiesce();
    assert_eq!(
        nodes_of(&c, locked, 8 << 20),
        [2048, 0],
        "locked pages stay"
    );
    let [_, slow] = nodes_of(&c, a, len);
    assert!(slow > 0, "the unlocked pages were demoted");
    assert_eq!(nr_mlock(&m), 2048);
    check(&m, "after demotion");
    c.exit_mm().unwrap();
}

#[test]
fn move_pages_migrates_mlocked_folios_and_keeps_them_locked() {
    let m = Machine::new(MachineConfig::two_tiers(64 << 20, 64 << 20, 2)).unwrap();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let len = 256 << 10;
    let a = c.mmap(0, len, RW, ANON).unwrap();
    for p in (a..a + len).step_by(PAGE as usize) {
        c.store_u64(p, p ^ 0x5a).unwrap();
    }
    c.mlock(a, len).unwrap();
    let pages: Vec<u64> = (a..a + len).step_by(PAGE as usize).collect();
    let mut status = vec![0; pages.len()];
    c.move_pages(&pages, Some(&vec![1; pages.len()]), &mut status)
        .unwrap();
    assert!(status.iter().all(|&s| s == 1), "all moved: {status:?}");
    for p in (a..a + len).step_by(PAGE as usize) {
        assert_eq!(c.load_u64(p).unwrap(), p ^ 0x5a);
    }
    usermm::swap::lru_add_drain(&m.mem, 0);
    assert_eq!(nr_mlock(&m), (len / PAGE) as i64, "the copies are mlocked");
    assert_eq!(
        m.mem.vmstat.node(NodeStat::NR_UNEVICTABLE),
        (len / PAGE) as i64
    );
    check(&m, "after move_pages");
    c.munlock(a, len).unwrap();
    assert_eq!(nr_mlock(&m), 0);
    check(&m, "after munlock");
}

#[test]
fn reclaim_keeps_a_locked_file_mapping() {
    let m = Machine::new(MachineConfig::single_node(128 << 20, 2)).unwrap();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let rw = FMode {
        read: true,
        write: true,
    };
    let file = |size: u64| {
        let inode = m.create_file(FsKind::Ext4, 0);
        let f = File::open(&inode, rw).unwrap();
        c.pwrite(&f, 0, &vec![7u8; size as usize]).unwrap();
        c.fsync(&f).unwrap();
        f
    };
    let (fa, fb) = (file(4 << 20), file(4 << 20));
    let a = c
        .mmap_file(0, 4 << 20, PROT_READ, MAP_SHARED, Some(&fa), 0)
        .unwrap();
    let b = c
        .mmap_file(0, 4 << 20, PROT_READ, MAP_SHARED, Some(&fb), 0)
        .unwrap();
    c.mlock(a, 4 << 20).unwrap();
    for p in (b..b + (4 << 20)).step_by(PAGE as usize) {
        c.load_u64(p).unwrap();
    }
    let before = c.mm().unwrap().get_rss(MmCounter::FilePages);
    assert_eq!(before, 2048);
    for _ in 0..8 {
        usermm::vmscan::try_to_free_pages(&c, 0, 0);
    }
    let mm = c.mm().unwrap();
    let smaps = usermm::proc::smaps(&mm);
    let rss_of = |start| smaps.iter().find(|s| s.start == start).unwrap().rss;
    assert_eq!(rss_of(a), 4 << 10, "the locked mapping stays whole");
    assert!(rss_of(b) < 4 << 10, "the unlocked one was reclaimed");
    check(&m, "after reclaim");
    // Torn down here: a mm left to the machine's drop gives its files up
    // in a grace period's callback, which another test's thread may run
    // while the pages are still mapped.
    drop(mm);
    c.exit_mm().unwrap();
}

#[test]
fn mlockall_current_populates_what_can_be_and_exit_frees_everything() {
    let m = Machine::new(MachineConfig::single_node(256 << 20, 2)).unwrap();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let free0 = m.mem.nr_free_pages();
    let rw = c.mmap(0, 64 << 10, RW, ANON).unwrap();
    c.mmap(0, 64 << 10, PROT_READ, ANON).unwrap();
    c.mmap(0, 64 << 10, PROT_NONE, ANON).unwrap();
    c.mlockall(MCL_CURRENT).unwrap();
    assert_eq!(usermm::proc::status(&mm).vm_lck, 192);
    // The writable range is written in (16 pages), the read-only one maps
    // the zero page, the inaccessible one nothing.
    assert_eq!(mm.get_rss(MmCounter::AnonPages), 16);
    assert_eq!(nr_mlock(&m), 16);
    check(&m, "after mlockall");
    // MCL_FUTURE: the next mapping is locked and populated; MLOCK_ONFAULT
    // changes an existing lock without a second count.
    c.mlockall(MCL_CURRENT | MCL_FUTURE).unwrap();
    let f = c.mmap(0, 32 << 10, RW, ANON).unwrap();
    assert_eq!(mm.get_rss(MmCounter::AnonPages), 24);
    c.mlock2(rw, 64 << 10, MLOCK_ONFAULT).unwrap();
    assert_eq!(usermm::proc::status(&mm).vm_lck, 224);
    assert_eq!(nr_mlock(&m), 24);
    c.munlock(f, 32 << 10).unwrap();
    check(&m, "after munlock");
    c.exit_mm().unwrap();
    usermm::swap::lru_add_drain(&m.mem, 0);
    m.rcu_barrier();
    assert_eq!(nr_mlock(&m), 0);
    assert_eq!(m.mem.nr_free_pages(), free0, "everything returned");
    check(&m, "after exit");
}

#[test]
fn limits_and_bad_arguments() {
    let m = Machine::new(MachineConfig::single_node(64 << 20, 2)).unwrap();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 1 << 20, RW, ANON).unwrap();
    // As root: no limit binds. A range that wraps is EINVAL; a length
    // that wraps to 0 when page-aligned does nothing (as on the host).
    c.mlock(a, 1 << 20).unwrap();
    c.munlock(a, 1 << 20).unwrap();
    assert_eq!(c.mlock(u64::MAX - 4095, 8192), Err(Errno::EINVAL));
    assert_eq!(c.mlock(a, u64::MAX), Ok(()));
    assert_eq!(c.munlock(a, u64::MAX), Ok(()));
    // The hole after the VMA is ENOMEM, the VMA itself locked by then.
    assert_eq!(c.mlock(a, 1 << 63), Err(Errno::ENOMEM));
    assert_eq!(usermm::proc::status(&mm).vm_lck, 1024);
    c.munlock(a, 1 << 20).unwrap();
    mm.set_cap_ipc_lock(false);
    mm.set_memlock_limit(64 << 10);
    assert_eq!(c.mlock(a, 128 << 10), Err(Errno::ENOMEM));
    c.mlock(a, 64 << 10).unwrap();
    assert_eq!(c.mlockall(MCL_CURRENT), Err(Errno::ENOMEM));
    assert_eq!(c.mmap(0, 4096, RW, ANON | MAP_LOCKED), Err(Errno::EAGAIN));
    assert_eq!(c.mlock2(a, 4096, 2), Err(Errno::EINVAL));
    assert_eq!(c.mlockall(0), Err(Errno::EINVAL));
    // Past the limit, the limit is checked first.
    assert_eq!(c.mlock(u64::MAX - 4095, 8192), Err(Errno::ENOMEM));
    mm.set_memlock_limit(0);
    assert_eq!(c.mlock(a, 4096), Err(Errno::EPERM));
    assert_eq!(c.mlockall(MCL_FUTURE), Err(Errno::EPERM));
    check(&m, "after the refusals");
}
