//! Non-present entries: migration entries and PTE markers met by fork,
//! mprotect, MADV_DONTNEED, munmap, faults, smaps, inspect and the
//! invariant checker, as the kernel handles each.
//!
//! Nothing in the model migrates pages or installs markers yet, so the
//! tests make the entries themselves, through the page-table guards: a
//! migration entry as `try_to_migrate_one` leaves it (the PTE cleared and
//! flushed, the rmap and the mapping's reference dropped, the migration
//! holding a reference of its own), a guard marker as MADV_GUARD_INSTALL
//! would.

use std::sync::Arc;

use usermm::check::check_invariants;
use usermm::madvise::MADV_DONTNEED;
use usermm::mm::{Mm, MmCounter};
use usermm::mmap::*;
use usermm::pgtable::swapops::{Migration, SwpEntry, SwpKind, PTE_MARKER_GUARD};
use usermm::pgtable::{pte_index, Pte, PteRead};
use usermm::phys::{Folio, PAGE_SHIFT};
use usermm::{Errno, Machine, MachineConfig, OnCpu};

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;

fn machine() -> Arc<Machine> {
    let m = Machine::new(MachineConfig::single_node(64 << 20, 2)).unwrap();
    m.thp.only_order(0);
    m
}

fn pte_at(mm: &Mm, addr: u64) -> Pte {
    let slot = mm.pmd_lookup(addr).unwrap();
    mm.pte_offset_map(slot).unwrap().pte(pte_index(addr))
}

fn set_pte(mm: &Mm, addr: u64, pte: Pte) {
    let slot = mm.pmd_lookup(addr).unwrap();
    mm.pte_offset_map_lock(slot)
        .unwrap()
        .set(pte_index(addr), pte);
}

/// Unmap the page at `addr` for migration, as `try_to_migrate_one` does;
/// returns its folio, on which the caller holds a reference.
fn unmap_for_migration(c: &OnCpu, mm: &Arc<Mm>, addr: u64) -> Folio {
    let mem = c.mem();
    let slot = mm.pmd_lookup(addr).unwrap();
    let mut pt = mm.pte_offset_map_lock(slot).unwrap();
    let idx = pte_index(addr);
    let old = pt.get_and_clear(idx);
    assert!(old.present() && old.write());
    c.flush_tlb_range(mm, addr, addr + PAGE, PAGE_SHIFT);
    let folio = mem.page_folio(old.pfn());
    folio.get(mem); // the migration's own reference (isolation)
    let mut e = SwpEntry::migration(Migration::Write, old.pfn());
    if old.young() {
        e = e.mkyoung();
    }
    if old.dirty() {
        e = e.mkdirty();
    }
    pt.set(idx, e.to_pte());
    usermm::rmap::folio_remove_rmap_ptes(mem, folio, old.pfn(), 1, mm.id, c.id());
    drop(pt);
    folio.put(mem, c.id()); // the mapping's reference
    folio
}

fn migration_kind(pte: Pte) -> Migration {
    match pte.swp_entry().kind() {
        SwpKind::Migration { kind, .. } => kind,
        other => panic!("not a migration entry: {other:?}"),
    }
}

#[test]
fn a_migration_entry_is_counted_copied_write_protected_and_zapped() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 4 * PAGE, RW, ANON).unwrap();
    c.touch_pages(a, a + 4 * PAGE, 7).unwrap();
    let folio = unmap_for_migration(&c, &mm, a);
    let e = pte_at(&mm, a);
    assert!(matches!(
        e.swp_entry().kind(),
        SwpKind::Migration {
            kind: Migration::Write,
            young: true,
            dirty: true,
            ..
        }
    ));
    // Still resident: RSS and smaps count the page under migration.
    assert_eq!(mm.get_rss(MmCounter::AnonPages), 4);
    assert_eq!(usermm::proc::smaps_rollup(&mm).rss, 16);
    m.rcu_barrier();
    check_invariants(&m).unwrap();

    // fork: the child gets the entry, and both become readable.
    let child = c.fork().unwrap();
    assert_eq!(migration_kind(pte_at(&mm, a)), Migration::Read);
    assert_eq!(migration_kind(pte_at(&child, a)), Migration::Read);
    assert_eq!(child.get_rss(MmCounter::AnonPages), 4);
    m.rcu_barrier();
    check_invariants(&m).unwrap();

    // The child's copy goes with its mm.
    c.switch_mm(&child);
    c.exit_mm().unwrap();
    c.switch_mm(&mm);
    drop(child);

    // mprotect turns a writable entry into a readable-exclusive one (the
    // page is written first: fork left it write-protected).
    let b = a + PAGE;
    c.store_u8(b, 7).unwrap();
    let folio_b = unmap_for_migration(&c, &mm, b);
    c.mprotect(a, 4 * PAGE, PROT_READ).unwrap();
    assert_eq!(migration_kind(pte_at(&mm, b)), Migration::ReadExclusive);
    c.mprotect(a, 4 * PAGE, RW).unwrap();
    assert_eq!(
        migration_kind(pte_at(&mm, b)),
        Migration::ReadExclusive,
        "never made writable again by mprotect"
    );
    let ins = usermm::inspect::inspect(&m);
    let t = &ins.mms.iter().find(|i| i.id == mm.id).unwrap().page_tables;
    assert_eq!(t.pte_tables[0].migration, 2);
    m.rcu_barrier();
    check_invariants(&m).unwrap();

    // MADV_DONTNEED zaps a migration entry: it leaves RSS; the page stays
    // the migration's until it lets go.
    c.madvise(a, 2 * PAGE, MADV_DONTNEED).unwrap();
    assert!(pte_at(&mm, a).none() && pte_at(&mm, b).none());
    assert_eq!(mm.get_rss(MmCounter::AnonPages), 2);
    folio.put(c.mem(), c.id());
    folio_b.put(c.mem(), c.id());
    m.rcu_barrier();
    check_invariants(&m).unwrap();
    // The page is back: a fault maps a new zeroed one.
    assert_eq!(c.load_u8(a).unwrap(), 0);
    assert_eq!(c.load_u8(a + 2 * PAGE).unwrap(), 7);
    c.munmap(a, 4 * PAGE).unwrap();
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

/// The NUMA scan changes a writable migration entry as mprotect does
/// (`change_pte_range` is the same code for both): it becomes
/// readable-exclusive, and counts as a PTE updated, beside the present
/// entries the scan makes PROT_NONE.
#[test]
fn the_numa_scan_makes_a_writable_migration_entry_readable() {
    use std::sync::atomic::Ordering::Relaxed;
    use usermm::numa_balancing::{task_numa_work, NUMA_BALANCING_NORMAL};
    use usermm::vmstat::Event;
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 4 * PAGE, RW, ANON).unwrap();
    c.touch_pages(a, a + 4 * PAGE, 7).unwrap();
    let folio = unmap_for_migration(&c, &mm, a);
    m.numa.scan_delay_ms.store(0, Relaxed);
    m.numa.mode.store(NUMA_BALANCING_NORMAL, Relaxed);
    // The first call only sets when the first scan is due: now, or the
    // first millisecond of the machine.
    task_numa_work(&c, &mm);
    std::thread::sleep(std::time::Duration::from_millis(2));
    task_numa_work(&c, &mm);
    m.numa.mode.store(0, Relaxed);
    assert_eq!(migration_kind(pte_at(&mm, a)), Migration::ReadExclusive);
    for p in 1..4 {
        assert!(pte_at(&mm, a + p * PAGE).protnone(), "page {p} hinted");
    }
    assert_eq!(m.vmstat().event(Event::NUMA_PTE_UPDATES), 4);
    c.madvise(a, PAGE, MADV_DONTNEED).unwrap();
    folio.put(c.mem(), c.id());
    assert_eq!(c.load_u8(a + PAGE).unwrap(), 7);
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

#[test]
fn a_guard_marker_survives_dontneed_and_fork_and_goes_with_munmap() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 4 * PAGE, RW, ANON).unwrap();
    c.touch_pages(a, a + 4 * PAGE, 1).unwrap();
    // A guard page at a + PAGE, as MADV_GUARD_INSTALL makes it: the page
    // zapped, the marker installed.
    c.madvise(a + PAGE, PAGE, MADV_DONTNEED).unwrap();
    set_pte(&mm, a + PAGE, SwpEntry::marker(PTE_MARKER_GUARD).to_pte());
    assert_eq!(c.load_u8(a + PAGE), Err(Errno::EFAULT), "SIGSEGV");
    assert_eq!(c.store_u8(a + PAGE, 1), Err(Errno::EFAULT));
    assert_eq!(c.load_u8(a).unwrap(), 1, "the neighbours are untouched");

    // MADV_DONTNEED over it keeps the marker; mprotect leaves it alone.
    c.madvise(a, 4 * PAGE, MADV_DONTNEED).unwrap();
    c.mprotect(a, 4 * PAGE, PROT_READ).unwrap();
    c.mprotect(a, 4 * PAGE, RW).unwrap();
    assert_eq!(
        pte_at(&mm, a + PAGE).swp_entry().kind(),
        SwpKind::Marker(PTE_MARKER_GUARD)
    );
    assert_eq!(c.load_u8(a + PAGE), Err(Errno::EFAULT));
    assert_eq!(mm.get_rss(MmCounter::AnonPages), 0, "markers are not RSS");

    // fork copies it (the VMA has an anon_vma from the faults).
    c.touch_pages(a, a + PAGE, 2).unwrap();
    let child = c.fork().unwrap();
    assert_eq!(
        pte_at(&child, a + PAGE).swp_entry().kind(),
        SwpKind::Marker(PTE_MARKER_GUARD)
    );
    c.switch_mm(&child);
    assert_eq!(c.load_u8(a + PAGE), Err(Errno::EFAULT));
    assert_eq!(c.load_u8(a).unwrap(), 2);
    c.exit_mm().unwrap();
    c.switch_mm(&mm);
    drop(child);
    let ins = usermm::inspect::inspect(&m);
    let t = &ins.mms.iter().find(|i| i.id == mm.id).unwrap().page_tables;
    assert_eq!(t.pte_tables[0].markers, 1);
    m.rcu_barrier();
    check_invariants(&m).unwrap();

    // munmap drops markers; the range can be mapped and used again.
    c.munmap(a, 4 * PAGE).unwrap();
    let b = c.mmap(a, 4 * PAGE, RW, ANON | MAP_FIXED_NOREPLACE).unwrap();
    assert_eq!(b, a);
    c.store_u8(a + PAGE, 3).unwrap();
    assert_eq!(c.load_u8(a + PAGE).unwrap(), 3);
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

#[test]
fn the_checker_catches_a_migration_entry_whose_page_was_freed() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, PAGE, RW, ANON).unwrap();
    c.store_u8(a, 1).unwrap();
    let folio = unmap_for_migration(&c, &mm, a);
    m.rcu_barrier();
    check_invariants(&m).unwrap();
    // The migration lets go while its entry still stands: a bug.
    folio.put(c.mem(), c.id());
    m.rcu_barrier();
    let e = check_invariants(&m).unwrap_err();
    assert!(e.contains("under migration"), "{e}");
    // Clear the entry so that the machine can be torn down.
    set_pte(&mm, a, Pte(0));
    mm.add_rss(MmCounter::AnonPages, -1);
}

/// The NUMA scan leaves a copy-on-write page that fork shared alone
/// (`prot_numa_skip`: its hint fault could not migrate it, another
/// process maps it); a page the parent alone maps again is hinted.
#[test]
fn the_numa_scan_skips_pages_fork_shared() {
    use std::sync::atomic::Ordering::Relaxed;
    use usermm::numa_balancing::{task_numa_work, NUMA_BALANCING_NORMAL};
    use usermm::vmstat::Event;
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 4 * PAGE, RW, ANON).unwrap();
    c.touch_pages(a, a + 4 * PAGE, 7).unwrap();
    let child = c.fork().unwrap();
    c.switch_mm(&child);
    // The child lets go of the first two pages: they are the parent's alone.
    c.munmap(a, 2 * PAGE).unwrap();
    c.switch_mm(&mm);
    m.numa.scan_delay_ms.store(0, Relaxed);
    m.numa.mode.store(NUMA_BALANCING_NORMAL, Relaxed);
    task_numa_work(&c, &mm);
    std::thread::sleep(std::time::Duration::from_millis(2));
    task_numa_work(&c, &mm);
    m.numa.mode.store(0, Relaxed);
    for p in 0..4 {
        assert_eq!(pte_at(&mm, a + p * PAGE).protnone(), p < 2, "page {p}");
    }
    assert_eq!(m.vmstat().event(Event::NUMA_PTE_UPDATES), 2);
    assert_eq!(c.load_u8(a).unwrap(), 7);
    c.switch_mm(&child);
    c.exit_mm().unwrap();
    c.switch_mm(&mm);
    check_invariants(&m).unwrap();
}
