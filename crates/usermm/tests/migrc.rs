//! MIGRC (tunable `migrc`): a demotion or promotion of pages that only
//! clean read-only PTEs map skips its TLB flush and keeps the sources;
//! stale translations to them read what the destinations hold, until a
//! forced flush (a write fault, an allocation short of its watermark, the
//! allocator's slow path) or any batched flush that covers the CPUs owed
//! releases them. The shadow memory checks every load; each weakened
//! variant of MIGRC (a rule of the seed's argument removed) must be caught
//! by it.
//!
//! The scenes are staged so that the stale entries really are used: a
//! reader CPU caches the pages, then spins in user mode (its loads poll
//! for IPIs, so flushes reach it, but it never passes through the kernel,
//! whose exit would catch up with the mm's TLB generation and drop them),
//! while another CPU migrates and writes; its TLB misses are counted to
//! show that its later loads went through the entries it had.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering, Ordering::Relaxed};
use std::sync::Arc;

use usermm::check::check_invariants;
use usermm::check::shadow::Shadow;
use usermm::mempolicy::MPOL_BIND;
use usermm::migrate::{
    isolate_for_migration, migrate_pages, MigrateMode, MigrateReason, MigrationTarget,
};
use usermm::migrc::Weakened;
use usermm::mm::Mm;
use usermm::mmap::*;
use usermm::pgtable::walk::hw_walk;
use usermm::tunable::MigrcMode;
use usermm::vmstat::Event;
use usermm::{Machine, MachineConfig, OnCpu};

mod common;
use common::StopOnDrop;

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;
const NR: u64 = 8;

fn machine() -> Arc<Machine> {
    let m = Machine::new(MachineConfig::two_tiers(64 << 20, 64 << 20, 3)).unwrap();
    m.tunables.set_migrc(true);
    // A/D bits not carried across migration: a promoted or migrated page
    // comes back clean, and read-only pages are eligible.
    m.tunables.set_migration_entry_ad(false);
    m
}

/// [`machine`] with the tunable at `mode`, weakened as `w` says.
fn machine_in(mode: MigrcMode, w: Weakened) -> Arc<Machine> {
    let m = machine();
    m.tunables.set_migrc_mode(mode);
    m.mem.migrc.set_weakened(w);
    m
}

fn pages(a: u64) -> impl Iterator<Item = u64> {
    (a..a + NR * PAGE).step_by(PAGE as usize)
}

/// The page-table view of `addr`: its frame and whether it is writable.
fn pte_of(c: &OnCpu, mm: &Mm, addr: u64) -> (u64, bool) {
    let t = hw_walk(c.mem(), mm.pgd.cr3(), addr, false).expect("mapped");
    (t.frame_of(addr).0, t.writable)
}

/// `NR` pages on node 0, written once, then mapped read-only and clean:
/// fork write-protects them, the child exits, and a round trip through
/// node 1 (move_pages, which MIGRC leaves alone) drops the dirty bits.
fn read_only_clean_pages(c: &OnCpu, shadow: &Shadow) -> (Arc<Mm>, u64) {
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, NR * PAGE, RW, ANON).unwrap();
    for p in pages(a) {
        shadow.store_u64(c, p, p | 1).unwrap();
    }
    let child = c.fork().unwrap();
    c.switch_mm(&child);
    c.exit_mm().unwrap();
    c.switch_mm(&mm);
    for node in [1, 0] {
        let addrs: Vec<u64> = pages(a).collect();
        let mut status = vec![0; addrs.len()];
        let nodes = vec![node; addrs.len()];
        c.move_pages(&addrs, Some(&nodes), &mut status).unwrap();
        assert!(status.iter().all(|&s| s == node), "{status:?}");
    }
    for p in pages(a) {
        assert!(!pte_of(c, &mm, p).1, "{p:#x} is read-only");
    }
    (mm, a)
}

/// CPU 1 runs `mm` and loads `addrs`, caching them, then idles (no flush
/// looked at it: it keeps its entries); the values it loaded.
fn cache_on_cpu1(m: &Machine, mm: &Arc<Mm>, addrs: impl Iterator<Item = u64> + Send) -> Vec<u64> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let c = m.bind(1).unwrap();
            c.switch_mm(mm);
            let values = addrs.map(|p| c.load_u64(p).unwrap()).collect();
            c.idle();
            values
        })
        .join()
        .unwrap()
    })
}

/// Demote the pages at `a` to node 1 as kswapd does (`MR_DEMOTION`,
/// asynchronous, `GFP_NOWAIT | __GFP_THISNODE`); the pages moved.
fn demote(c: &OnCpu, mm: &Mm, a: u64) -> u64 {
    let mem = c.mem();
    let isolated = pages(a)
        .map(|p| isolate_for_migration(mem, mem.page_folio(pte_of(c, mm, p).0)).unwrap())
        .collect();
    let out = migrate_pages(
        c,
        isolated,
        MigrationTarget {
            nid: 1,
            this_node: true,
            nowait: true,
        },
        MigrateMode::Async,
        MigrateReason::Demotion,
    );
    assert!(out.failed.is_empty());
    out.stats.nr_succeeded
}

/// The reader of the staged scenes, on CPU 1: it loads the pages at `a`
/// (caching them) and says so (`step` 1), spins in user mode on `spin`
/// until `step` reaches 2, then loads the pages again through the shadow
/// memory; the TLB misses of that second pass.
fn spinning_reader(
    m: &Machine,
    mm: &Arc<Mm>,
    a: u64,
    spin: u64,
    step: &AtomicU32,
    stop: &AtomicBool,
    shadow: &Shadow,
) -> u64 {
    let c = m.bind(1).unwrap();
    c.switch_mm(mm);
    for p in pages(a) {
        shadow.load_u64(&c, p).unwrap();
    }
    step.store(1, Relaxed);
    // Spin in user mode: loads poll for IPIs, no kernel entry.
    while step.load(Relaxed) < 2 && !stop.load(Relaxed) {
        c.load_u64(spin).unwrap();
    }
    let misses = m.vmstat().event_on(1, Event::TLB_MISS);
    for p in pages(a) {
        shadow.load_u64(&c, p).unwrap();
    }
    let misses = m.vmstat().event_on(1, Event::TLB_MISS) - misses;
    c.idle();
    misses
}

/// What the staged scene does once the pages are demoted and CPU 1
/// still caches their sources.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Then {
    /// CPU 0 writes each page (a write fault on a read-only PTE).
    Write,
    /// CPU 0 faults in fresh pages on node 0, which would reuse the
    /// sources were they freed.
    Reuse,
    /// As `Reuse`, in an address space of its own (whose faults owe no
    /// flush for the first).
    ReuseElsewhere,
}

struct Scene {
    violations: usize,
    kept: usize,
    /// CPU 1's TLB misses over its second pass.
    reader_misses: u64,
    remote_flushes: u64,
    /// LUF's flushes at takeoff, and forced ones.
    takeoff_flushes: u64,
    forced_flushes: u64,
    /// Shootdowns MIGRC's flushes forced by write faults sent.
    wp_fault_flushes: u64,
}

/// CPU 1 reads the pages (caching them), CPU 0 demotes them and does
/// `then`, CPU 1 reads them again: what the shadow memory saw. MIGRC as
/// `arm` has it, or off (None).
fn scene(arm: Option<Weakened>, then: Then) -> Scene {
    let mode = if arm.is_some() {
        MigrcMode::Migrc
    } else {
        MigrcMode::Off
    };
    scene_in(mode, arm.unwrap_or(Weakened::None), then)
}

/// [`scene`] with the tunable at `mode`, weakened as `w` says.
fn scene_in(mode: MigrcMode, w: Weakened, then: Then) -> Scene {
    let m = machine_in(mode, w);
    let shadow = Shadow::new();
    let c0 = m.bind(0).unwrap();
    let (mm, a) = read_only_clean_pages(&c0, &shadow);
    let spin = c0.mmap(0, PAGE, RW, ANON).unwrap();
    c0.store_u64(spin, 0).unwrap();
    // 0: start; 1: CPU 1 cached the pages; 2: CPU 0 is done.
    let step = AtomicU32::new(0);
    let stop = AtomicBool::new(false);
    let mut out = Scene {
        violations: 0,
        kept: 0,
        reader_misses: 0,
        remote_flushes: 0,
        takeoff_flushes: 0,
        forced_flushes: 0,
        wp_fault_flushes: 0,
    };
    // The address space of `Then::ReuseElsewhere`, torn down at the end.
    let mut other = None;
    std::thread::scope(|s| {
        let (mm1, step1, shadow1, m1, stop1) = (mm.clone(), &step, &shadow, &m, &stop);
        let reader = s.spawn(move || spinning_reader(m1, &mm1, a, spin, step1, stop1, shadow1));
        let _stop = StopOnDrop(&stop);
        while step.load(Relaxed) < 1 {
            std::hint::spin_loop();
        }
        let before = m.vmstat().event(Event::NR_TLB_REMOTE_FLUSH);
        assert_eq!(demote(&c0, &mm, a), NR);
        out.remote_flushes = m.vmstat().event(Event::NR_TLB_REMOTE_FLUSH) - before;
        out.kept = m.mem.migrc.kept().len();
        match then {
            Then::Write => {
                for p in pages(a) {
                    shadow.store_u64(&c0, p, p | 2).unwrap();
                }
            }
            Then::ReuseElsewhere => {
                // LUF files the freed sources apart and hands them out
                // only once the node is short of other free pages (v12's
                // reserve): another address space, bound to node 0, fills
                // it until a takeoff has to flush.
                other = Some(c0.new_mm().unwrap());
                let len = 64 << 20;
                let fill = c0.mmap(0, len, RW, ANON).unwrap();
                c0.mbind(fill, len, MPOL_BIND, &[0b1], 64, 0).unwrap();
                for p in (fill..fill + len).step_by(PAGE as usize) {
                    if m.vmstat().event(Event::LUF_TAKEOFF_FLUSH) > 0 || c0.store_u64(p, p).is_err()
                    {
                        break;
                    }
                }
            }
            Then::Reuse => {
                let fresh = c0.mmap(0, 4 * NR * PAGE, RW, ANON).unwrap();
                for (i, p) in (fresh..fresh + 4 * NR * PAGE)
                    .step_by(PAGE as usize)
                    .enumerate()
                {
                    for w in (0..PAGE).step_by(8) {
                        c0.store_u64(p + w, 0xdead_0000 + i as u64).unwrap();
                    }
                }
            }
        }
        // Leave user mode before waiting, or CPU 1's flushes would wait
        // for this CPU.
        c0.idle();
        step.store(2, Relaxed);
        out.reader_misses = reader.join().unwrap();
    });
    out.violations = shadow.violations().len();
    out.takeoff_flushes = m.vmstat().event(Event::LUF_TAKEOFF_FLUSH);
    out.forced_flushes = m.vmstat().event(Event::LUF_FORCED_FLUSH);
    out.wp_fault_flushes = m.vmstat().event(Event::MIGRC_FLUSH_WP_FAULT);
    if w != Weakened::None {
        // A weakened run leaves stale entries behind, which the checker
        // reports (as its own test shows): flushed, to check the rest.
        usermm::migrc::luf_flush_cpus(&c0, 0b111);
    }
    if let Some(other) = other {
        c0.switch_mm(&other);
        c0.exit_mm().unwrap();
    }
    // Whatever is still kept goes with the next forced flush.
    c0.switch_mm(&mm);
    usermm::migrc::migrc_flush_free_folios(&c0, usermm::vmstat::Event::MIGRC_FLUSH_WATERMARK);
    c0.idle();
    m.kswapd_quiesce();
    check_invariants(&m).unwrap();
    out
}

/// The seed's case: a demotion of read-only clean pages that another CPU
/// caches sends no IPI and keeps every source; the other CPU goes on
/// reading through its stale entries (no TLB miss) and sees the right
/// bytes; a fault-in of fresh pages cannot reuse the sources.
#[test]
fn a_read_only_demotion_defers_its_flush_and_keeps_the_sources() {
    let s = scene(Some(Weakened::None), Then::Reuse);
    assert_eq!(s.kept, NR as usize, "every source kept");
    assert_eq!(s.remote_flushes, 0, "no IPI sent");
    assert_eq!(s.reader_misses, 0, "the reader used its stale entries");
    assert_eq!(s.violations, 0);
}

/// A write fault forces the owed flush before the page becomes writable:
/// the reader misses and reads the new bytes. The first fault's flush
/// covers everything owed, so it is the only one.
#[test]
fn a_write_fault_flushes_what_is_owed_first() {
    let s = scene(Some(Weakened::None), Then::Write);
    assert_eq!(s.kept, NR as usize);
    assert_eq!(
        s.wp_fault_flushes, 1,
        "one shootdown, forced by a write fault"
    );
    assert!(s.reader_misses >= NR, "the reader's stale entries went");
    assert_eq!(s.violations, 0);
}

/// With MIGRC off the same demotion flushes at once: an IPI, and the
/// reader misses.
#[test]
fn without_migrc_the_demotion_flushes() {
    let s = scene(None, Then::Reuse);
    assert_eq!(s.kept, 0);
    assert_eq!(s.wp_fault_flushes, 0);
    assert!(s.remote_flushes >= 1, "an IPI");
    assert!(s.reader_misses >= NR);
    assert_eq!(s.violations, 0);
}

/// The weakened variants: without `do_wp_page`'s flush the reader reads
/// the source after the destination was written (a stale read); with the
/// source freed at once it reads whatever the page's next owner stored.
#[test]
fn weakened_migrc_is_caught_by_the_shadow_memory() {
    let s = scene(Some(Weakened::NoWpFlush), Then::Write);
    assert_eq!(s.reader_misses, 0);
    assert!(s.violations > 0, "a write past a stale entry was caught");
    let s = scene(Some(Weakened::FreeSource), Then::Reuse);
    assert_eq!(s.kept, 0);
    assert!(s.violations > 0, "a read of a reused source was caught");
}

/// Kept sources count as free in the watermark checks, and an allocation
/// that finds its zone short flushes and frees them; the allocator's slow
/// path pauses MIGRC while it runs.
#[test]
fn kept_sources_count_as_free_and_go_under_pressure() {
    let m = machine();
    let shadow = Shadow::new();
    let c0 = m.bind(0).unwrap();
    let (mm, a) = read_only_clean_pages(&c0, &shadow);
    // Another CPU runs the mm, so the flush is owed to it.
    cache_on_cpu1(&m, &mm, std::iter::once(a));
    assert_eq!(demote(&c0, &mm, a), NR);
    assert_eq!(m.mem.migrc.kept().len(), NR as usize);
    let zone = &c0.mem().nodes[0].zone;
    assert_eq!(zone.migrc_pending.load(Relaxed), NR);
    // Fill node 0 until its watermark fails: the kept pages go first.
    c0.idle();
    let big = 64 << 20;
    let b = c0.mmap(0, big, RW, ANON).unwrap();
    c0.mbind(b, big, usermm::mempolicy::MPOL_PREFERRED, &[1], 64, 0)
        .unwrap();
    let mut p = b;
    while !m.mem.migrc.kept().is_empty() && p < b + big {
        c0.store_u64(p, p).unwrap();
        p += PAGE;
    }
    assert!(
        m.mem.migrc.kept().is_empty(),
        "pressure released the sources"
    );
    assert_eq!(
        m.vmstat().event(Event::MIGRC_FLUSH_WATERMARK),
        1,
        "one shootdown, forced by the watermark"
    );
    assert_eq!(m.vmstat().event(Event::MIGRC_FLUSH_WP_FAULT), 0);
    assert_eq!(zone.migrc_pending.load(Relaxed), 0);
    assert!(!m.mem.migrc.paused(), "resumed after the slow path");
    for q in pages(a) {
        assert_eq!(shadow.load_u64(&c0, q).unwrap(), q | 1);
    }
    c0.idle();
    m.kswapd_quiesce();
    check_invariants(&m).unwrap();
}

/// What a run of [`stress`] saw.
struct Stress {
    violations: Vec<usermm::check::shadow::Violation>,
    kept_peak: u64,
    loads: u64,
    /// LUF's flushes, at takeoff and forced.
    luf_flushes: u64,
}

/// Everything at once: two CPUs read and one writes (rarely) a working set
/// larger than the fast node, through the shadow memory, while NUMA
/// balancing promotes it and kswapd demotes it, and CPU 0 forks (the child
/// reads, then exits) and munmaps and maps again a region of its own.
/// Migrated pages come back clean (`migration_entry_ad` off), so that
/// MIGRC keeps sources throughout.
fn stress(mode: MigrcMode, run_for: std::time::Duration) -> Stress {
    use usermm::numa_balancing::NUMA_BALANCING_MEMORY_TIERING;
    let m = Machine::new(MachineConfig::two_tiers(16 << 20, 64 << 20, 4)).unwrap();
    m.tunables.set_migrc_mode(mode);
    m.tunables.set_migration_entry_ad(false);
    m.thp.only_order(0);
    m.set_demotion_enabled(true);
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
    let len = 24 << 20;
    let a = c0.mmap(0, len, RW, ANON).unwrap();
    for p in (a..a + len).step_by(PAGE as usize) {
        shadow.store_u64(&c0, p, p).unwrap();
    }
    let side_len = 1 << 20;
    let side = c0.mmap(0, side_len, RW, ANON).unwrap();
    c0.idle();
    m.numa.mode.store(NUMA_BALANCING_MEMORY_TIERING, Relaxed);
    let npages = len / PAGE;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for id in 1..4usize {
            let (m, mm, stop, shadow) = (&m, mm.clone(), &stop, &shadow);
            s.spawn(move || {
                let c = m.bind(id).unwrap();
                c.switch_mm(&mm);
                let mut rng = 0x2545_f491_4f6c_dd1du64 * id as u64;
                let mut seq = 0u64;
                while !stop.load(Relaxed) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let p = a + (rng % npages) * PAGE;
                    if id == 3 && rng.is_multiple_of(64) {
                        seq += 1;
                        shadow.store_u64(&c, p, (seq << 40) | 3).unwrap();
                    } else {
                        shadow.load_u64(&c, p).unwrap();
                    }
                }
                c.idle();
            });
        }
        let _stop = StopOnDrop(&stop);
        let deadline = std::time::Instant::now() + run_for;
        let mut round = 0u64;
        while std::time::Instant::now() < deadline {
            round += 1;
            // A fork whose child reads a few pages, then exits.
            let child = shadow
                .fork(&c0, mm.id, || {
                    let child = c0.fork()?;
                    let id = child.id;
                    Ok((child, id))
                })
                .unwrap();
            c0.switch_mm(&child);
            for i in 0..16 {
                shadow
                    .load_u64(&c0, a + ((round * 97 + i * 389) % npages) * PAGE)
                    .unwrap();
            }
            c0.exit_mm().unwrap();
            shadow.exit(child.id);
            c0.switch_mm(&mm);
            // The side region unmapped, mapped again at the same place, and
            // written.
            shadow.zap(&c0, mm.id, side, side + side_len, || {
                c0.munmap(side, side_len).unwrap();
                c0.mmap(side, side_len, RW, ANON | MAP_FIXED).unwrap();
            });
            for p in (side..side + side_len).step_by(16 * PAGE as usize) {
                shadow.store_u64(&c0, p, round).unwrap();
            }
            c0.idle();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    });
    m.numa.mode.store(0, Relaxed);
    c0.idle();
    m.kswapd_quiesce();
    let out = Stress {
        violations: shadow.violations(),
        kept_peak: m.mem.migrc.kept_peak(),
        loads: shadow.loads_checked(),
        luf_flushes: m.vmstat().event(Event::LUF_TAKEOFF_FLUSH)
            + m.vmstat().event(Event::LUF_FORCED_FLUSH),
    };
    usermm::migrc::migrc_flush_free_folios(&c0, usermm::vmstat::Event::MIGRC_FLUSH_WATERMARK);
    c0.idle();
    m.kswapd_quiesce();
    check_invariants(&m).unwrap();
    out
}

/// MIGRC under everything at once: sources kept throughout, no load ever
/// returns a value the program did not store last. (A weakened MIGRC is
/// rarely caught here: a stale entry is used only if its CPU reads the
/// page again before a flush reaches it and after another CPU wrote it;
/// the staged scenes above make that happen on purpose.)
#[test]
fn readers_and_writers_under_promotion_demotion_forks_and_munmaps() {
    let s = stress(MigrcMode::Migrc, std::time::Duration::from_millis(1500));
    eprintln!("kept at peak {}, loads checked {}", s.kept_peak, s.loads);
    assert!(s.kept_peak > 0, "MIGRC kept sources");
    assert_no_violation(&s);
}

fn assert_no_violation(s: &Stress) {
    assert!(
        s.violations.is_empty(),
        "{}",
        s.violations
            .iter()
            .take(3)
            .map(|v| v.to_string())
            .collect::<String>()
    );
}

/// CPU 1 runs `mm` and loads `addrs`, caching them, then stays in the
/// kernel (a long system call) while `f` runs beside it. Not idle: an idle
/// CPU is lazy, and compares the mm's TLB generation with its own when it
/// runs the mm again, dropping its entries; a CPU in the kernel goes back
/// to user mode with them unless a flush looked at it.
fn with_cpu1_cached_in_kernel<R>(
    m: &Machine,
    mm: &Arc<Mm>,
    addrs: impl Iterator<Item = u64> + Send,
    f: impl FnOnce() -> R,
) -> R {
    let (cached, done) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|s| {
        s.spawn(|| {
            let c = m.bind(1).unwrap();
            c.switch_mm(mm);
            let addrs: Vec<u64> = addrs.collect();
            for &p in &addrs {
                c.load_u64(p).unwrap();
            }
            c.madvise(addrs[0], PAGE, usermm::madvise::MADV_NORMAL)
                .unwrap();
            cached.store(true, Ordering::Release);
            while !done.load(Relaxed) {
                std::hint::spin_loop();
            }
        });
        let _stop = StopOnDrop(&done);
        while !cached.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        f()
    })
}

/// The checker's scene: CPU 1 caches clean read-only pages and stays in
/// the kernel, CPU 0 demotes them under `mode` and `w`; whether the
/// checker then accepts CPU 1's stale entries must be `clean` (a rejection
/// names them). Returns the machine, CPU 0 unbound, for what the caller
/// checks after.
fn checker_scene(mode: MigrcMode, w: Weakened, clean: bool) -> Arc<Machine> {
    let m = machine_in(mode, w);
    let shadow = Shadow::new();
    let r = {
        let c0 = m.bind(0).unwrap();
        let (mm, a) = read_only_clean_pages(&c0, &shadow);
        with_cpu1_cached_in_kernel(&m, &mm, pages(a), || {
            assert_eq!(demote(&c0, &mm, a), NR);
            c0.idle();
            check_invariants(&m)
        })
    };
    assert_eq!(r.is_ok(), clean, "{mode:?} {w:?}: {r:?}");
    if let Err(e) = r {
        assert!(e.contains("will be used without a flush"), "{e}");
    }
    m
}

/// The invariant checker accepts a stale entry that a CPU will use
/// without a flush only if it maps a source MIGRC keeps: CPU 1 caches the
/// pages and idles, CPU 0 demotes them. With the sources freed at once
/// (weakened), the checker reports CPU 1's entries.
#[test]
fn the_checker_accepts_stale_entries_to_kept_sources_only() {
    for (w, clean) in [(Weakened::None, true), (Weakened::FreeSource, false)] {
        let m = checker_scene(MigrcMode::Migrc, w, clean);
        let c0 = m.bind(0).unwrap();
        usermm::migrc::migrc_flush_free_folios(&c0, usermm::vmstat::Event::MIGRC_FLUSH_WATERMARK);
        c0.idle();
        if clean {
            check_invariants(&m).unwrap();
        }
    }
}

/// Beyond the seed (`migrc_large`): a 64 KiB folio that only clean
/// read-only PTEs map keeps its source too, whole, with another CPU's
/// stale entries to its 16 pages accepted by the checker; the seed's
/// `migrc` flushes it.
#[test]
fn a_large_folio_is_kept_only_with_migrc_large() {
    const LARGE: u64 = 64 << 10;
    for (mode, kept) in [(MigrcMode::Migrc, 0), (MigrcMode::MigrcLarge, 1)] {
        let m = machine();
        m.tunables.set_migrc_mode(mode);
        m.thp.only_order(4);
        let c0 = m.bind(0).unwrap();
        let mm = c0.new_mm().unwrap();
        let r = c0.mmap(0, 2 * LARGE, RW, ANON).unwrap();
        let a = (r + LARGE - 1) & !(LARGE - 1);
        for p in (a..a + LARGE).step_by(PAGE as usize) {
            c0.store_u64(p, p).unwrap();
        }
        let mem = c0.mem();
        assert_eq!(mem.page_folio(pte_of(&c0, &mm, a).0).nr_pages(mem), 16);
        // Read-only (fork, the child gone) and clean (a round trip).
        let child = c0.fork().unwrap();
        c0.switch_mm(&child);
        c0.exit_mm().unwrap();
        c0.switch_mm(&mm);
        for node in [1, 0] {
            let mut status = [0];
            c0.move_pages(&[a], Some(&[node]), &mut status).unwrap();
            assert_eq!(status, [node]);
        }
        let large = || (a..a + LARGE).step_by(PAGE as usize);
        assert!(cache_on_cpu1(&m, &mm, large()).into_iter().eq(large()));
        let folio = mem.page_folio(pte_of(&c0, &mm, a).0);
        assert_eq!(folio.nr_pages(mem), 16, "still one 64 KiB folio");
        let out = migrate_pages(
            &c0,
            vec![isolate_for_migration(mem, folio).unwrap()],
            MigrationTarget {
                nid: 1,
                this_node: true,
                nowait: true,
            },
            MigrateMode::Async,
            MigrateReason::Demotion,
        );
        assert_eq!(out.stats.nr_succeeded, 16, "{mode:?}");
        assert_eq!(m.mem.migrc.kept().len(), kept, "{mode:?}");
        assert_eq!(
            mem.nodes[0].zone.migrc_pending.load(Relaxed),
            16 * kept as u64
        );
        c0.idle();
        check_invariants(&m).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        usermm::migrc::migrc_flush_free_folios(&c0, usermm::vmstat::Event::MIGRC_FLUSH_WATERMARK);
        for p in (a..a + LARGE).step_by(PAGE as usize) {
            assert_eq!(c0.load_u64(p).unwrap(), p);
        }
        c0.idle();
        check_invariants(&m).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
    }
}

// ---------------------------------------------------------------------------
// LUF (the tunable's value `luf`): the sources are freed at once, stamped;
// the stamped CPUs are flushed before a page is handed out again, after a
// fault in a writable VMA, and at the end of a VMA's unmap.

/// A demotion under LUF sends no IPI and keeps nothing; the reader goes on
/// through its stale entries to the free sources until another address
/// space's faults take the pages off the free lists: the takeoff flushes
/// the reader first, which then misses and reads the right bytes.
#[test]
fn luf_frees_the_sources_and_flushes_before_they_are_reused() {
    let s = scene_in(MigrcMode::Luf, Weakened::None, Then::ReuseElsewhere);
    assert_eq!(s.kept, 0, "nothing kept");
    assert_eq!(s.remote_flushes, 0, "no IPI at the demotion");
    assert!(s.takeoff_flushes >= 1, "a flush at takeoff");
    assert!(s.reader_misses >= NR, "the reader's stale entries went");
    assert_eq!(s.violations, 0);
}

/// A write fault on a destination under LUF flushes what the mm owes
/// once the fault is handled, before the writer returns to user mode.
#[test]
fn luf_flushes_after_a_write_fault() {
    let s = scene_in(MigrcMode::Luf, Weakened::None, Then::Write);
    assert!(s.forced_flushes >= 1, "a forced flush");
    assert!(s.reader_misses >= NR);
    assert_eq!(s.violations, 0);
}

/// The weakened LUFs: a source handed out again with no stamp is read
/// through the reader's stale entries after its next owner wrote it; with
/// no flush after the write fault, the reader reads the source after the
/// destination was written.
#[test]
fn weakened_luf_is_caught_by_the_shadow_memory() {
    let s = scene_in(
        MigrcMode::Luf,
        Weakened::LufNoTakeoffFlush,
        Then::ReuseElsewhere,
    );
    assert_eq!(s.takeoff_flushes, 0);
    assert_eq!(s.reader_misses, 0);
    assert!(s.violations > 0, "a read of a reused page was caught");
    let s = scene_in(MigrcMode::Luf, Weakened::LufNoFaultFlush, Then::Write);
    assert_eq!(s.reader_misses, 0);
    assert!(s.violations > 0, "a write past a stale entry was caught");
}

/// What [`reviewers_scene`] saw.
#[derive(Debug)]
struct Reviewers {
    violations: usize,
    reader_misses: u64,
    /// IPIs sent by the reclaim that discarded the pages.
    reclaim_flushes: u64,
    forced_flushes: u64,
}

/// The reviewers' question (Dave Hansen on LUF v10): a read-only page is
/// unmapped under LUF and freed, and a new page is mapped at the same
/// address (MAP_FIXED) while another CPU still caches the old translation:
/// which one does that CPU read? Here: lazyfree pages made read-only,
/// which CPU 1 caches; CPU 2 reclaims them (discarded with their flush
/// deferred, freed to its own lists, so that no takeoff flushes); CPU 0
/// maps fresh memory over them with MAP_FIXED and writes it; CPU 1 reads.
fn reviewers_scene(mode: MigrcMode, w: Weakened) -> Reviewers {
    use usermm::madvise::MADV_FREE;
    let m = machine();
    m.tunables.set_migrc_mode(mode);
    m.mem.migrc.set_weakened(w);
    let shadow = Shadow::new();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    let a = c0.mmap(0, NR * PAGE, RW, ANON).unwrap();
    for p in pages(a) {
        shadow.store_u64(&c0, p, p | 1).unwrap();
    }
    c0.madvise(a, NR * PAGE, MADV_FREE).unwrap();
    c0.mprotect(a, NR * PAGE, PROT_READ).unwrap();
    // Onto the lazyfree list from this CPU's batch.
    usermm::swap::lru_add_drain(c0.mem(), 0);
    let spin = c0.mmap(0, PAGE, RW, ANON).unwrap();
    c0.store_u64(spin, 0).unwrap();
    c0.idle();
    let step = AtomicU32::new(0);
    let stop = AtomicBool::new(false);
    let mut out = Reviewers {
        violations: 0,
        reader_misses: 0,
        reclaim_flushes: 0,
        forced_flushes: 0,
    };
    std::thread::scope(|s| {
        let (mm1, step1, m1, stop1, shadow1) = (mm.clone(), &step, &m, &stop, &shadow);
        let reader = s.spawn(move || spinning_reader(m1, &mm1, a, spin, step1, stop1, shadow1));
        let _stop = StopOnDrop(&stop);
        while step.load(Relaxed) < 1 {
            std::hint::spin_loop();
        }
        let before = m.vmstat().event(Event::NR_TLB_REMOTE_FLUSH);
        s.spawn(|| {
            let c2 = m.bind(2).unwrap();
            for _ in 0..4 {
                if m.vmstat().event(Event::PGLAZYFREED) >= NR {
                    break;
                }
                usermm::vmscan::try_to_free_pages(&c2, 0, 0);
            }
            c2.idle();
        })
        .join()
        .unwrap();
        assert_eq!(m.vmstat().event(Event::PGLAZYFREED), NR, "discarded");
        out.reclaim_flushes = m.vmstat().event(Event::NR_TLB_REMOTE_FLUSH) - before;
        c0.switch_mm(&mm);
        shadow.zap(&c0, mm.id, a, a + NR * PAGE, || {
            c0.mmap(a, NR * PAGE, RW, ANON | MAP_FIXED).unwrap();
        });
        for p in pages(a) {
            shadow.store_u64(&c0, p, p | 2).unwrap();
        }
        c0.idle();
        step.store(2, Relaxed);
        out.reader_misses = reader.join().unwrap();
    });
    out.violations = shadow.violations().len();
    out.forced_flushes = m.vmstat().event(Event::LUF_FORCED_FLUSH);
    m.kswapd_quiesce();
    check_invariants(&m).unwrap();
    out
}

/// The answer, for anonymous memory: LUF as specified is safe here, three
/// times over. The MAP_FIXED unmap zaps the old range, and its
/// `flush_tlb_batched_pending` flushes the whole mm, since the deferred
/// unmap counted in `tlb_flush_batched` like any batched one; the end of
/// that VMA's unmap (`tlb_end_vma`) flushes what the mm owes; and the
/// write faults on the new pages flush after they are handled. Any one of
/// them alone covers the reader; with all three removed, the reader reads
/// the freed page through its stale entry after the new one was written,
/// and the shadow memory reports it.
#[test]
fn luf_and_the_reviewers_question_a_page_mapped_anew_over_a_stale_entry() {
    let off = reviewers_scene(MigrcMode::Off, Weakened::None);
    assert!(off.reclaim_flushes >= 1, "{off:?}");
    assert_eq!(off.violations, 0, "{off:?}");
    for w in [
        Weakened::None,
        Weakened::LufNoEndVmaFlush,
        Weakened::LufNoFaultFlush,
    ] {
        let r = reviewers_scene(MigrcMode::Luf, w);
        assert_eq!(
            r.reclaim_flushes, 0,
            "{w:?}: the discard deferred its flush"
        );
        assert!(r.reader_misses >= NR, "{w:?}: {r:?}");
        assert_eq!(r.violations, 0, "{w:?}: {r:?}");
    }
    let r = reviewers_scene(MigrcMode::Luf, Weakened::LufNoMmFlush);
    assert_eq!(r.reclaim_flushes, 0);
    assert_eq!(r.reader_misses, 0, "{r:?}");
    assert!(r.violations > 0, "the stale read was caught: {r:?}");
}

/// The checker accepts a stale entry to a free page only while the
/// page's LUF stamp still owes that CPU's flush; unstamped (weakened),
/// the same entry is reported.
#[test]
fn the_checker_accepts_stale_entries_to_stamped_free_pages_only() {
    for (w, clean) in [(Weakened::None, true), (Weakened::LufNoTakeoffFlush, false)] {
        checker_scene(MigrcMode::Luf, w, clean);
    }
}

/// LUF under everything at once: promotions and demotions free their
/// sources stamped throughout, forks and munmaps meanwhile; no load ever
/// returns a value the program did not store last.
#[test]
fn luf_readers_and_writers_under_promotion_demotion_forks_and_munmaps() {
    let s = stress(MigrcMode::Luf, std::time::Duration::from_millis(1500));
    eprintln!("LUF flushes {}, loads checked {}", s.luf_flushes, s.loads);
    assert_eq!(s.kept_peak, 0);
    assert!(s.luf_flushes > 0, "LUF deferred and then flushed");
    assert_no_violation(&s);
}
