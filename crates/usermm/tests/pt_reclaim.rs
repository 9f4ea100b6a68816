//! Freeing the PTE tables that MADV_DONTNEED empties (`pt_reclaim`):
//! which tables go and which stay, both of the upstream design's paths, the
//! accounting, and tables freed while other CPUs fault in the same range.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use usermm::check::check_invariants;
use usermm::check::shadow::Shadow;
use usermm::madvise::{MADV_DONTNEED, MADV_FREE};
use usermm::mm::Mm;
use usermm::mmap::*;
use usermm::pgtable::swapops::{SwpEntry, PTE_MARKER_GUARD};
use usermm::pgtable::{pte_index, PMD_SIZE};
use usermm::tunable::PtReclaim;
use usermm::vmstat::Event;
use usermm::{Errno, Machine, MachineConfig, OnCpu};

mod common;
use common::StopOnDrop;

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;

fn machine(bytes: u64, cpus: usize, design: PtReclaim) -> Arc<Machine> {
    let m = Machine::new(MachineConfig::single_node(bytes, cpus)).unwrap();
    m.thp.only_order(0);
    m.tunables.set_pt_reclaim(design);
    m
}

/// Map `len` bytes starting on a PMD boundary (map more, trim the rest).
fn mmap_pmd_aligned(c: &OnCpu, len: u64) -> u64 {
    let raw = c.mmap(0, len + PMD_SIZE, RW, ANON).unwrap();
    let a = (raw + PMD_SIZE - 1) & !(PMD_SIZE - 1);
    if a > raw {
        c.munmap(raw, a - raw).unwrap();
    }
    if raw + PMD_SIZE > a {
        c.munmap(a + len, raw + PMD_SIZE - a).unwrap();
    }
    a
}

fn vm_pte_kb(mm: &Mm) -> u64 {
    usermm::proc::status(mm).vm_pte
}

fn reclaimed(m: &Machine) -> (u64, u64) {
    let v = m.vmstat();
    (
        v.event(Event::PT_RECLAIM_UPSTREAM),
        v.event(Event::PT_RECLAIM_UPSTREAM_SLOW),
    )
}

/// One MADV_DONTNEED over a table's whole range frees it (the fast path);
/// the table is freed for real after the grace period, and the next fault
/// allocates a new one.
#[test]
fn dontneed_of_a_whole_table_frees_it() {
    let m = machine(64 << 20, 1, PtReclaim::Upstream);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = mmap_pmd_aligned(&c, 2 * PMD_SIZE);
    c.touch_pages(a, a + 2 * PMD_SIZE, 1).unwrap();
    let before = vm_pte_kb(&mm);
    let tables_before = m.vmstat().node(usermm::vmstat::NodeStat::NR_PAGETABLE);
    c.madvise(a, PMD_SIZE, MADV_DONTNEED).unwrap();
    assert_eq!(vm_pte_kb(&mm), before - 4, "VmPTE drops by one table");
    assert_eq!(reclaimed(&m), (1, 0), "one table, by the fast path");
    assert!(mm.pmd_get(mm.pmd_lookup(a).unwrap()).none());
    m.rcu_barrier();
    assert_eq!(
        m.vmstat().node(usermm::vmstat::NodeStat::NR_PAGETABLE),
        tables_before - 1,
        "the table's frame went back to the allocator"
    );
    check_invariants(&m).unwrap();
    // The other table, and the data in it, are untouched; the emptied
    // range reads zeroes through a new table.
    assert_eq!(c.load_u8(a + PMD_SIZE).unwrap(), 1);
    assert_eq!(c.load_u8(a).unwrap(), 0);
    assert_eq!(vm_pte_kb(&mm), before);
    check_invariants(&m).unwrap();
}

/// A zap that does not cover a table's whole range, or that leaves an entry
/// behind (a guard marker, which MADV_DONTNEED keeps), frees nothing; nor
/// does anything with `pt_reclaim` off.
#[test]
fn tables_stay_unless_one_zap_empties_all_of_them() {
    for design in [PtReclaim::Upstream, PtReclaim::Off] {
        let m = machine(64 << 20, 1, design);
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let a = mmap_pmd_aligned(&c, 3 * PMD_SIZE);
        c.touch_pages(a, a + 3 * PMD_SIZE, 1).unwrap();
        let before = vm_pte_kb(&mm);
        // Halves.
        c.madvise(a, PMD_SIZE / 2, MADV_DONTNEED).unwrap();
        c.madvise(a + PMD_SIZE / 2, PMD_SIZE / 2, MADV_DONTNEED)
            .unwrap();
        // Shifted by a page: parts of two tables.
        c.madvise(a + PMD_SIZE + PAGE, PMD_SIZE, MADV_DONTNEED)
            .unwrap();
        // A guard marker left in the third table.
        let g = a + 2 * PMD_SIZE + 7 * PAGE;
        c.madvise(g, PAGE, MADV_DONTNEED).unwrap();
        let slot = mm.pmd_lookup(g).unwrap();
        let marker = SwpEntry::marker(PTE_MARKER_GUARD).to_pte();
        mm.pte_offset_map_lock(slot)
            .unwrap()
            .set(pte_index(g), marker);
        c.madvise(a + 2 * PMD_SIZE, PMD_SIZE, MADV_DONTNEED)
            .unwrap();
        assert_eq!(c.load_u8(g), Err(Errno::EFAULT), "the guard stays");
        assert_eq!(vm_pte_kb(&mm), before, "{design:?}: every table stays");
        let whole = c.madvise(a, PMD_SIZE, MADV_DONTNEED);
        whole.unwrap();
        let want = if design == PtReclaim::Upstream { 4 } else { 0 };
        assert_eq!(
            vm_pte_kb(&mm),
            before - want,
            "{design:?}: a whole, empty, table goes only with PT reclaim"
        );
        c.munmap(a, 3 * PMD_SIZE).unwrap();
        check_invariants(&m).unwrap();
    }
}

/// A zap long enough to fill the mmu_gather drops the PTE lock in the
/// middle of a table to flush; that table may have been refilled meanwhile,
/// so it goes by the slow path, which looks at every entry again. Every
/// table is still freed.
#[test]
fn a_zap_that_drops_the_lock_midway_takes_the_slow_path() {
    let m = machine(160 << 20, 1, PtReclaim::Upstream);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    const N: u64 = 48;
    let a = mmap_pmd_aligned(&c, N * PMD_SIZE);
    c.touch_pages(a, a + N * PMD_SIZE, 3).unwrap();
    let before = vm_pte_kb(&mm);
    c.madvise(a, N * PMD_SIZE, MADV_DONTNEED).unwrap();
    let (all, slow) = reclaimed(&m);
    assert_eq!(all, N, "every table");
    assert!(slow >= 1, "the gather filled mid-table at least once");
    assert!(slow < N, "most tables by the fast path");
    assert!(m.vmstat().event(Event::GATHER_FORCE_FLUSH) >= slow);
    assert_eq!(vm_pte_kb(&mm), before - 4 * N);
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

/// Two CPUs load and store all over 24 PTE tables while a third
/// MADV_DONTNEEDs single tables and the whole range (a zap long enough to
/// drop the PTE lock mid-table, where the CPUs' faults refill entries
/// already zapped) and MADV_FREEs parts, over and over. Every load is
/// checked by the shadow memory, the tables are really freed, and the
/// invariant checker finds no table freed while it maps something, and
/// none leaked.
#[test]
fn faults_race_with_table_reclaim() {
    let m = race_faults_with_reclaim(PtReclaim::Upstream);
    let (freed, slow) = reclaimed(&m);
    assert!(freed > 10, "tables were reclaimed ({freed})");
    assert!(slow > 0, "some by the slow path");
}

/// The same race with the seed's `pte_ref`, which also frees the tables
/// that two half-table MADV_DONTNEEDs empty.
#[test]
fn faults_race_with_pte_ref_reclaim() {
    let m = race_faults_with_reclaim(PtReclaim::PteRef);
    let freed = m.vmstat().event(Event::PT_RECLAIM_PTE_REF);
    assert!(freed > 10, "tables were reclaimed ({freed})");
}

fn race_faults_with_reclaim(design: PtReclaim) -> Arc<Machine> {
    race_faults_with_reclaim_at(design, false)
}

/// The race, with `pt_reclaim_pmd` as given: the range then lies alone in
/// its PMD table, so that a whole-range zap can empty it.
fn race_faults_with_reclaim_at(design: PtReclaim, pmd: bool) -> Arc<Machine> {
    let m = machine(256 << 20, 3, design);
    m.tunables.set_pt_reclaim_pmd(pmd);
    let shadow = Shadow::new();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    const TABLES: u64 = 24;
    const LEN: u64 = TABLES * PMD_SIZE;
    let a = if pmd {
        c0.mmap(PUD_AT, LEN, RW, ANON | MAP_FIXED).unwrap()
    } else {
        mmap_pmd_aligned(&c0, LEN)
    };
    let stop = AtomicBool::new(false);
    // While set, the accessors stay out of user mode (but keep their TLB
    // entries), so that a zap of the whole range can empty the PMD table.
    let quiet = AtomicBool::new(false);
    let accesses = AtomicU64::new(0);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for id in 1..3u64 {
            let (m, mm, stop, shadow, accesses) = (&m, mm.clone(), &stop, &shadow, &accesses);
            let quiet = &quiet;
            s.spawn(move || {
                let c = m.bind(id as usize).unwrap();
                c.switch_mm(&mm);
                let mut rng = SmallRng::seed_from_u64(id);
                let mut seq = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    if quiet.load(Ordering::Relaxed) {
                        c.idle();
                        std::thread::yield_now();
                        continue;
                    }
                    // Mostly the first pages of each table, so that faults
                    // often land in a table being reclaimed.
                    let table = rng.gen_range(0..TABLES);
                    let page = if rng.gen_bool(0.7) {
                        rng.gen_range(0..8)
                    } else {
                        rng.gen_range(0..512)
                    };
                    let addr = a + table * PMD_SIZE + page * PAGE + rng.gen_range(0..2) * 8;
                    if rng.gen_bool(0.5) {
                        shadow.store_u64(&c, addr, (id << 56) | seq).unwrap();
                        seq += 1;
                    } else {
                        shadow.load_u64(&c, addr).unwrap();
                    }
                    accesses.fetch_add(1, Ordering::Relaxed);
                }
                c.idle();
            });
        }
        let mut i = 0u64;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while i < 400 || accesses.load(Ordering::Relaxed) < 40_000 {
            assert!(
                std::time::Instant::now() < deadline,
                "stalled: {i} rounds, {} accesses",
                accesses.load(Ordering::Relaxed)
            );
            i += 1;
            let t = a + (i % TABLES) * PMD_SIZE;
            if i % 4 == 3 {
                // MADV_FREE keeps the data (no reclaim discards it here).
                c0.madvise(t + (i % 7) * 64 * PAGE, 64 * PAGE, MADV_FREE)
                    .unwrap();
            } else if i % 4 == 1 {
                // Two halves: only pte_ref frees the table they empty.
                for h in [t, t + PMD_SIZE / 2] {
                    shadow.zap(&c0, mm.id, h, h + PMD_SIZE / 2, || {
                        c0.madvise(h, PMD_SIZE / 2, MADV_DONTNEED).unwrap();
                    });
                }
            } else if pmd && i % 16 == 2 {
                // The accessors hold off: the whole range empties, and its
                // PMD table with it; they fault it all back afterwards.
                quiet.store(true, Ordering::Relaxed);
                shadow.zap(&c0, mm.id, a, a + LEN, || {
                    c0.madvise(a, LEN, MADV_DONTNEED).unwrap();
                });
                quiet.store(false, Ordering::Relaxed);
            } else if i.is_multiple_of(8) {
                // Refill most of the range, so that the zap fills the
                // gather, then zap it all.
                for p in (a..a + LEN).step_by(PAGE as usize) {
                    shadow.store_u64(&c0, p + 16, i).unwrap();
                }
                shadow.zap(&c0, mm.id, a, a + LEN, || {
                    c0.madvise(a, LEN, MADV_DONTNEED).unwrap();
                });
            } else {
                shadow.zap(&c0, mm.id, t, t + PMD_SIZE, || {
                    c0.madvise(t, PMD_SIZE, MADV_DONTNEED).unwrap();
                });
            }
        }
        c0.idle();
    });
    shadow.verdict().unwrap();
    m.rcu_barrier();
    check_invariants(&m).unwrap();
    drop(c0);
    m
}

/// `pte_ref` frees a table however it was emptied: in one zap or two
/// halves, by a zap shifted by a page, and by MADV_FREE once MADV_PAGEOUT
/// discards the lazyfree pages (the count left atomic dies with the last
/// entry). A table still mapping something, or with a walker on it, stays.
#[test]
fn pte_ref_frees_tables_however_emptied() {
    let m = machine(64 << 20, 1, PtReclaim::PteRef);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = mmap_pmd_aligned(&c, 4 * PMD_SIZE);
    c.touch_pages(a, a + 4 * PMD_SIZE, 1).unwrap();
    let before = vm_pte_kb(&mm);
    let freed = || m.vmstat().event(Event::PT_RECLAIM_PTE_REF);
    c.madvise(a, PMD_SIZE / 2, MADV_DONTNEED).unwrap();
    assert_eq!(
        (freed(), vm_pte_kb(&mm)),
        (0, before),
        "half a table maps on"
    );
    check_invariants(&m).unwrap();
    c.madvise(a + PMD_SIZE / 2, PMD_SIZE / 2, MADV_DONTNEED)
        .unwrap();
    assert_eq!(
        (freed(), vm_pte_kb(&mm)),
        (1, before - 4),
        "the second half"
    );
    // Shifted by a page: the second table empties but for its first page.
    c.madvise(a + PMD_SIZE + PAGE, PMD_SIZE, MADV_DONTNEED)
        .unwrap();
    assert_eq!(freed(), 1);
    c.madvise(a + PMD_SIZE, PAGE, MADV_DONTNEED).unwrap();
    assert_eq!((freed(), vm_pte_kb(&mm)), (2, before - 8));
    // MADV_FREE keeps the pages, and so the table, until they are discarded.
    let t = a + 3 * PMD_SIZE;
    c.madvise(t, PMD_SIZE, MADV_FREE).unwrap();
    assert_eq!(freed(), 2);
    check_invariants(&m).unwrap();
    c.madvise(t, PMD_SIZE, usermm::madvise::MADV_PAGEOUT)
        .unwrap();
    assert_eq!((freed(), vm_pte_kb(&mm)), (3, before - 12));
    m.rcu_barrier();
    check_invariants(&m).unwrap();
    // Every range faults in again through new tables.
    c.touch_pages(a, a + 4 * PMD_SIZE, 2).unwrap();
    assert_eq!(vm_pte_kb(&mm), before);
    check_invariants(&m).unwrap();
}

/// A table whose count MADV_FREE left atomic dies with the put of the zap
/// that clears its last entry: here a munmap of half its range, for which
/// `free_pgtables` keeps the table (the VMA's other half shares it). The
/// zap frees it, as the seed's release callback does.
#[test]
fn pte_ref_zap_frees_the_table_it_kills() {
    let m = machine(64 << 20, 1, PtReclaim::PteRef);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = mmap_pmd_aligned(&c, PMD_SIZE);
    let half = a + PMD_SIZE / 2;
    c.touch_pages(half, a + PMD_SIZE, 1).unwrap();
    c.madvise(a, PMD_SIZE, MADV_FREE).unwrap();
    let before = vm_pte_kb(&mm);
    let freed = m.vmstat().event(Event::PT_RECLAIM_PTE_REF);
    c.munmap(half, PMD_SIZE / 2).unwrap();
    assert_eq!(m.vmstat().event(Event::PT_RECLAIM_PTE_REF), freed + 1);
    assert_eq!(vm_pte_kb(&mm), before - 4, "the emptied table went");
    m.rcu_barrier();
    check_invariants(&m).unwrap();
    // The VMA's other half faults in through a new table.
    c.touch_pages(a, half, 2).unwrap();
    assert_eq!(vm_pte_kb(&mm), before);
    check_invariants(&m).unwrap();
}

/// With `pt_reclaim_pmd`, the PMD table goes with the last PTE table PT
/// reclaim frees from it, under either design; without it the PMD table
/// stays. Faults afterwards build both levels again.
#[test]
fn pmd_table_goes_with_its_last_pte_table() {
    for design in [PtReclaim::Upstream, PtReclaim::PteRef] {
        for pmd in [false, true] {
            let m = machine(64 << 20, 1, design);
            m.tunables.set_pt_reclaim_pmd(pmd);
            let c = m.bind(0).unwrap();
            let mm = c.new_mm().unwrap();
            // Alone in its PUD entry's GiB, so its PMD table maps nothing else.
            let a = c.mmap(PUD_AT, 4 * PMD_SIZE, RW, ANON | MAP_FIXED).unwrap();
            c.touch_pages(a, a + 4 * PMD_SIZE, 1).unwrap();
            let before = vm_pte_kb(&mm);
            let pmd_freed = || m.vmstat().event(Event::PT_RECLAIM_PMD);
            c.madvise(a, 2 * PMD_SIZE, MADV_DONTNEED).unwrap();
            assert_eq!(vm_pte_kb(&mm), before - 8, "{design:?}: two PTE tables");
            assert_eq!(pmd_freed(), 0, "{design:?}: the PMD table maps two more");
            c.madvise(a + 2 * PMD_SIZE, 2 * PMD_SIZE, MADV_DONTNEED)
                .unwrap();
            let want = if pmd { 20 } else { 16 };
            assert_eq!(vm_pte_kb(&mm), before - want, "{design:?} pmd={pmd}");
            assert_eq!(pmd_freed(), u64::from(pmd));
            m.rcu_barrier();
            check_invariants(&m).unwrap();
            c.touch_pages(a, a + 4 * PMD_SIZE, 2).unwrap();
            assert_eq!(vm_pte_kb(&mm), before);
            assert_eq!(c.load_u8(a + 3 * PMD_SIZE).unwrap(), 2);
            check_invariants(&m).unwrap();
            c.munmap(a, 4 * PMD_SIZE).unwrap();
            m.rcu_barrier();
            check_invariants(&m).unwrap();
        }
    }
}

/// A DONTNEED that frees exactly a table batch's worth of PTE tables (the
/// gather flushes, and forgets `freed_tables`, as the batch fills) still
/// frees the PMD table they leave empty.
#[test]
fn pmd_table_goes_after_a_full_table_batch() {
    const TABLES: u64 = 509;
    let m = machine(64 << 20, 1, PtReclaim::Upstream);
    m.tunables.set_pt_reclaim_pmd(true);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let len = TABLES * PMD_SIZE;
    let a = c
        .mmap(PUD_AT, len, RW, ANON | MAP_FIXED | MAP_NORESERVE)
        .unwrap();
    for t in 0..TABLES {
        c.store_u8(a + t * PMD_SIZE, 1).unwrap();
    }
    c.madvise(a, len, MADV_DONTNEED).unwrap();
    let v = m.vmstat();
    assert_eq!(v.event(Event::PT_RECLAIM_UPSTREAM), TABLES);
    assert_eq!(v.event(Event::PT_RECLAIM_PMD), 1);
    m.rcu_barrier();
    check_invariants(&m).unwrap();
    drop(mm);
}

/// A PUD-aligned address (1 GiB) in the middle of the user range.
const PUD_AT: u64 = 0x7e00_0000_0000;

/// The fault race with PMD tables reclaimed too, under both designs: the
/// whole-range zaps empty the PMD table now and then, and the faults that
/// follow must build it again.
#[test]
fn faults_race_with_pmd_reclaim() {
    for design in [PtReclaim::Upstream, PtReclaim::PteRef] {
        let m = race_faults_with_reclaim_at(design, true);
        assert!(m.vmstat().event(Event::PT_RECLAIM_PMD) > 0, "{design:?}");
    }
}

/// A table belongs to the design it was made under: tables made before
/// `pte_ref` was selected have no count and stay; tables made under it are
/// freed only by their count, whatever is selected later.
#[test]
fn tables_keep_the_design_they_were_made_under() {
    let m = machine(64 << 20, 1, PtReclaim::Off);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = mmap_pmd_aligned(&c, 2 * PMD_SIZE);
    c.touch_pages(a, a + PMD_SIZE, 1).unwrap();
    m.tunables.set_pt_reclaim(PtReclaim::PteRef);
    c.touch_pages(a + PMD_SIZE, a + 2 * PMD_SIZE, 1).unwrap();
    let before = vm_pte_kb(&mm);
    c.madvise(a, 2 * PMD_SIZE, MADV_DONTNEED).unwrap();
    assert_eq!(vm_pte_kb(&mm), before - 4, "only the tracked table");
    c.touch_pages(a + PMD_SIZE, a + 2 * PMD_SIZE, 1).unwrap();
    m.tunables.set_pt_reclaim(PtReclaim::Upstream);
    c.madvise(a, 2 * PMD_SIZE, MADV_DONTNEED).unwrap();
    assert_eq!(
        vm_pte_kb(&mm),
        before - 4,
        "upstream frees the untracked table, not the tracked one"
    );
    check_invariants(&m).unwrap();
    c.munmap(a, 2 * PMD_SIZE).unwrap();
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}
