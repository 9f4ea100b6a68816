//! shmem's large folios (6.18's huge shmem): the sizes shared anonymous
//! memory, memfds and write(2) take under the knobs, and the checker's
//! shmem THP statistics, each shown to catch its error. The same cases
//! run against the host kernel as tests/scenarios/shmem_thp_*.scn.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use usermm::check::check_invariants;
use usermm::machine::{ShmemHuge, ShmemOrderMode};
use usermm::mm::MmCounter;
use usermm::mmap::*;
use usermm::vmstat::{Event, MthpStat, NodeStat};
use usermm::{Errno, Machine, MachineConfig};

mod common;
use common::StopOnDrop;

const PAGE: u64 = 4096;

fn machine() -> Arc<Machine> {
    Machine::new(MachineConfig::single_node(256 << 20, 2)).unwrap()
}

fn check(m: &Machine, what: &str) {
    m.rcu_barrier();
    if let Err(e) = check_invariants(m) {
        panic!("{what}: {e}");
    }
}

/// The boot state gives shmem small folios; each size's own knob gives
/// shared anonymous memory that size where its block fits the VMA, and a
/// memfd (the internal mount) takes only what the top level gives it.
#[test]
fn shmem_folio_sizes_follow_their_knobs() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let shared = PROT_READ | PROT_WRITE;
    let a = c
        .mmap(0, 1 << 20, shared, MAP_SHARED | MAP_ANONYMOUS)
        .unwrap();
    c.touch_pages(a, a + (1 << 20), 1).unwrap();
    assert_eq!(m.vmstat().mthp(4, MthpStat::SHMEM_ALLOC), 0);
    m.thp.set_shmem_order(4, ShmemOrderMode::Always).unwrap();
    let b = c
        .mmap(0, 1 << 20, shared, MAP_SHARED | MAP_ANONYMOUS)
        .unwrap();
    c.touch_pages(b, b + (1 << 20), 1).unwrap();
    assert_eq!(m.vmstat().mthp(4, MthpStat::SHMEM_ALLOC), 16);
    assert_eq!(mm.get_rss(MmCounter::ShmemPages), 512);
    check(&m, "64K shared anonymous");
    // A memfd's fault ignores the sizes' knobs; with the top level
    // `always` its fault takes the PMD size.
    let f = usermm::shmem::memfd_create(&c).unwrap();
    usermm::filemap::do_truncate(&c, &f, 4 << 20).unwrap();
    let fa = c
        .mmap_file(
            0x6000_0000_0000,
            4 << 20,
            shared,
            MAP_SHARED | MAP_FIXED,
            Some(&f),
            0,
        )
        .unwrap();
    c.touch_pages(fa, fa + (2 << 20), 1).unwrap();
    assert_eq!(m.vmstat().event(Event::THP_FILE_ALLOC), 0);
    m.thp.set_shmem_enabled(ShmemHuge::Always);
    c.load_u64(fa + (4 << 20) - PAGE).unwrap();
    assert_eq!(m.vmstat().event(Event::THP_FILE_ALLOC), 1);
    assert_eq!(m.vmstat().node(NodeStat::NR_SHMEM_PMDMAPPED), 512);
    check(&m, "memfd");
    // `deny` turns every size off, `inherit` of a small size is refused
    // under `force`.
    m.thp.set_shmem_enabled(ShmemHuge::Force);
    assert!(m.thp.set_shmem_order(4, ShmemOrderMode::Inherit).is_err());
    m.thp.set_shmem_enabled(ShmemHuge::Deny);
    let before = m.vmstat().mthp(4, MthpStat::SHMEM_ALLOC);
    let d = c
        .mmap(0, 1 << 20, shared, MAP_SHARED | MAP_ANONYMOUS)
        .unwrap();
    c.touch_pages(d, d + (1 << 20), 1).unwrap();
    assert_eq!(m.vmstat().mthp(4, MthpStat::SHMEM_ALLOC), before);
    check(&m, "deny");
    c.exit_mm().unwrap();
    check(&m, "exited");
}

/// The checker's shmem THP statistics: `nr_shmem_hugepages` against the
/// page cache's PMD-sized shmem folios, `nr_shmem_pmdmapped` against the
/// PMDs that map them; each off by one is caught.
#[test]
fn the_checker_catches_shmem_thp_errors() {
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    m.thp.set_shmem_enabled(ShmemHuge::Always);
    let a = c
        .mmap(
            0x6000_0000_0000,
            4 << 20,
            PROT_READ | PROT_WRITE,
            MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED,
        )
        .unwrap();
    c.touch_pages(a, a + (4 << 20), 1).unwrap();
    assert_eq!(m.vmstat().node(NodeStat::NR_SHMEM_THPS), 1024);
    assert_eq!(m.vmstat().node(NodeStat::NR_SHMEM_PMDMAPPED), 1024);
    check(&m, "before");
    for stat in [NodeStat::NR_SHMEM_THPS, NodeStat::NR_SHMEM_PMDMAPPED] {
        m.vmstat().mod_node(stat, 1);
        m.rcu_barrier();
        let err = check_invariants(&m).unwrap_err();
        assert!(err.contains(stat.name()), "expected {}: {err}", stat.name());
        m.vmstat().mod_node(stat, -1);
    }
    check(&m, "restored");
    c.munmap(a, 4 << 20).unwrap();
    m.rcu_barrier();
    assert_eq!(m.vmstat().node(NodeStat::NR_SHMEM_THPS), 0);
    check(&m, "unmapped");
    c.exit_mm().unwrap();
}

/// A truncation splits a large shmem folio while other CPUs fault on it
/// and so take references through the page cache: the split freezes the
/// folio's references under the index's lock, so that no lookup takes
/// one it would then lose (a lost one frees a folio still cached and
/// mapped, which the checker, or the next walk, finds).
#[test]
fn splits_by_truncation_race_with_faults_that_look_folios_up() {
    const HOME: u64 = 0x6000_0000_0000;
    let m = Machine::new(MachineConfig::single_node(256 << 20, 3)).unwrap();
    m.thp.set_shmem_enabled(ShmemHuge::Always);
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    let f = usermm::shmem::memfd_create(&c0).unwrap();
    usermm::filemap::do_truncate(&c0, &f, 2 << 20).unwrap();
    let rw = PROT_READ | PROT_WRITE;
    c0.mmap_file(HOME, 2 << 20, rw, MAP_SHARED | MAP_FIXED, Some(&f), 0)
        .unwrap();
    let stop = AtomicBool::new(false);
    let accesses = AtomicU64::new(0);
    let mut splits = 0i64;
    // A CPU caught in the engine (a lookup of a folio freed under it
    // loops) cannot be stopped: fail the run instead of hanging it.
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(120));
        if !watchdog.load(Ordering::Relaxed) {
            eprintln!(
                "splits_by_truncation_race_with_faults_that_look_folios_up: no end after 120 s"
            );
            std::process::exit(1);
        }
    });
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for id in 1..3u64 {
            let (m, mm, stop, accesses) = (&m, mm.clone(), &stop, &accesses);
            s.spawn(move || {
                let _stop = StopOnDrop(stop);
                let c = m.bind(id as usize).unwrap();
                c.switch_mm(&mm);
                let mut rng = SmallRng::seed_from_u64(id);
                while !stop.load(Ordering::Relaxed) {
                    let addr = HOME + rng.gen_range(0..512u64) * PAGE;
                    match c.load_u64(addr) {
                        Ok(_) | Err(Errno::SIGBUS) => {}
                        Err(e) => panic!("load at {addr:#x}: {e}"),
                    }
                    accesses.fetch_add(1, Ordering::Relaxed);
                }
                c.idle();
            });
        }
        let mut rng = SmallRng::seed_from_u64(9);
        let before = m.vmstat().mthp(9, MthpStat::SPLIT);
        for _ in 0..300 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            // One write of 2M makes one PMD-sized folio; a truncation into
            // it splits it.
            usermm::filemap::do_truncate(&c0, &f, 0).unwrap();
            c0.pwrite(&f, 0, &vec![1u8; 2 << 20]).unwrap();
            let size = rng.gen_range(1..512u64) * PAGE;
            usermm::filemap::do_truncate(&c0, &f, size).unwrap();
        }
        splits = m.vmstat().mthp(9, MthpStat::SPLIT) - before;
    });
    done.store(true, Ordering::Relaxed);
    assert!(splits > 0, "no PMD-sized folio was split");
    assert!(accesses.load(Ordering::Relaxed) > 0);
    check(&m, "after the race");
    c0.exit_mm().unwrap();
    check(&m, "exited");
}
