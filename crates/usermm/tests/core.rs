//! End-to-end tests of the engine core: mmap, faults, munmap, mprotect,
//! madvise, exit, with the invariant checker after every operation.

use usermm::check::check_invariants;
use usermm::madvise::*;
use usermm::mmap::*;
use usermm::{Errno, Machine, MachineConfig, ThpMode};

fn machine() -> std::sync::Arc<Machine> {
    Machine::new(MachineConfig::single_node(256 << 20, 4)).unwrap()
}

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;

#[test]
fn write_then_read_back_and_munmap_frees_everything() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let free0 = m.mem.nr_free_pages();
    let a = c.mmap(0, 64 << 10, RW, ANON).unwrap();
    for i in 0..16u64 {
        c.store_u64(a + i * 4096 + 8, i * 7).unwrap();
    }
    for i in 0..16u64 {
        assert_eq!(c.load_u64(a + i * 4096 + 8).unwrap(), i * 7);
    }
    assert_eq!(mm.get_rss(usermm::mm::MmCounter::AnonPages), 16);
    check_invariants(&m).unwrap();
    c.munmap(a, 64 << 10).unwrap();
    assert_eq!(mm.get_rss(usermm::mm::MmCounter::AnonPages), 0);
    assert_eq!(c.load_u64(a), Err(Errno::EFAULT));
    m.rcu_barrier();
    check_invariants(&m).unwrap();
    // The last new folios still wait in CPU 0's LRU batch, which holds a
    // reference to each until it drains (munmap drains nothing, as 6.18's).
    usermm::swap::lru_add_drain(&m.mem, 0);
    assert_eq!(
        m.mem.nr_free_pages(),
        free0,
        "pages and page tables all returned"
    );
}

#[test]
fn read_fault_maps_the_zero_page() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 8192, RW, ANON).unwrap();
    assert_eq!(c.load_u64(a).unwrap(), 0);
    assert_eq!(mm.rss_pages(), 0);
    c.store_u8(a + 5, 9).unwrap();
    assert_eq!(c.load_u8(a + 5).unwrap(), 9);
    assert_eq!(mm.rss_pages(), 1);
    check_invariants(&m).unwrap();
}

#[test]
fn mthp_orders_follow_the_knobs() {
    for order in [2u32, 4, 6, 9] {
        let m = machine();
        m.thp.only_order(order);
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let a = c.mmap(0, 4 << 20, RW, ANON).unwrap();
        c.store_u8(a, 1).unwrap();
        assert_eq!(mm.rss_pages(), 1 << order, "order {order}");
        c.touch_pages(a, a + (4 << 20), 2).unwrap();
        assert_eq!(mm.rss_pages(), 1024);
        check_invariants(&m).unwrap();
        // Partial munmap of large folios.
        c.munmap(a + 4096, 3 * 4096).unwrap();
        check_invariants(&m).unwrap();
        assert_eq!(c.load_u8(a).unwrap(), 2);
        assert_eq!(c.load_u8(a + 4096), Err(Errno::EFAULT));
        c.exit_mm().unwrap();
        m.rcu_barrier();
        check_invariants(&m).unwrap();
        assert_eq!(
            mm.pgtables_bytes.load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }
}

#[test]
fn pmd_thp_maps_with_one_entry_and_deposits_a_table() {
    let m = machine();
    m.thp.set_enabled(ThpMode::Always).unwrap();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 4 << 20, RW, ANON).unwrap();
    assert_eq!(
        a % (2 << 20),
        0,
        "PMD-multiple anonymous mappings are PMD-aligned"
    );
    c.store_u64(a, 5).unwrap();
    assert_eq!(mm.rss_pages(), 512);
    // PUD + PMD tables + the deposited PTE table.
    assert_eq!(
        mm.pgtables_bytes.load(std::sync::atomic::Ordering::Relaxed),
        3 * 4096
    );
    check_invariants(&m).unwrap();
    // Partial mprotect splits the PMD.
    c.mprotect(a, 4096, PROT_READ).unwrap();
    assert_eq!(c.store_u64(a, 1), Err(Errno::EFAULT));
    c.store_u64(a + 4096, 6).unwrap();
    assert_eq!(c.load_u64(a).unwrap(), 5);
    check_invariants(&m).unwrap();
    c.exit_mm().unwrap();
    check_invariants(&m).unwrap();
}

/// A zapped huge PMD's deposited table goes back to the allocator at once
/// (`zap_deposited_table`: no walker ever saw it), not after the TLB flush
/// and a grace period as the tables walkers may be reading.
#[test]
fn zapping_a_huge_pmd_frees_its_deposited_table_at_once() {
    use usermm::vmstat::NodeStat::NR_PAGETABLE;
    let m = machine();
    m.thp.set_enabled(ThpMode::Always).unwrap();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let a = c.mmap(0, 2 << 20, RW, ANON).unwrap();
    c.store_u64(a, 5).unwrap();
    let tables = m.vmstat().node(NR_PAGETABLE);
    c.madvise(a, 2 << 20, MADV_DONTNEED).unwrap();
    assert_eq!(m.vmstat().node(NR_PAGETABLE), tables - 1);
    assert_eq!(c.load_u64(a).unwrap(), 0);
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

/// `pgfault` counts a fault that fails as well as one that succeeds, as
/// the kernel's `mm_account_fault` does: stores into a mapping larger than
/// memory count one fault a page until the one that runs out.
#[test]
fn pgfault_counts_the_fault_that_runs_out_of_memory_too() {
    use usermm::vmstat::Event;
    let m = Machine::new(MachineConfig::single_node(4 << 20, 1)).unwrap();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let len = 8 << 20;
    let a = c.mmap(0, len, RW, ANON | MAP_NORESERVE).unwrap();
    let before = m.vmstat().event(Event::PGFAULT);
    let mut stored = 0;
    let err = (a..a + len)
        .step_by(4096)
        .find_map(|p| match c.store_u64(p, p) {
            Ok(()) => {
                stored += 1;
                None
            }
            Err(e) => Some(e),
        });
    assert_eq!(err, Some(Errno::ENOMEM));
    assert_eq!(m.vmstat().event(Event::PGFAULT) - before, stored + 1);
    c.munmap(a, len).unwrap();
    check_invariants(&m).unwrap();
}

/// A store through a stale read-only TLB entry faults, as on Intel's MMU,
/// which does not walk again first: here the entry is stale because
/// another CPU reused the page after fork (`wp_page_reuse` flushes no
/// other CPU). The fault finds the PTE writable already, a spurious fault,
/// and flushes the page from every CPU of the mm
/// (`flush_tlb_fix_spurious_fault`).
#[test]
fn a_store_through_a_stale_read_only_entry_is_a_spurious_fault() {
    use usermm::vmstat::Event;
    let m = machine();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    let a = c0.mmap(0, 4096, RW, ANON).unwrap();
    c0.store_u64(a, 1).unwrap();
    let child = c0.fork().unwrap();
    c0.switch_mm(&child);
    c0.exit_mm().unwrap();
    c0.switch_mm(&mm);
    drop(child);
    let phase = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let (m, mm, phase) = (&m, mm.clone(), &phase);
        s.spawn(move || {
            let c1 = m.bind(1).unwrap();
            c1.switch_mm(&mm);
            // A read-only TLB entry: the PTE is write-protected since fork.
            assert_eq!(c1.load_u64(a).unwrap(), 1);
            c1.idle();
            phase.wait();
            phase.wait();
            let faults = m.vmstat().event_on(1, Event::PGFAULT);
            c1.store_u64(a, 3).unwrap();
            assert_eq!(
                m.vmstat().event_on(1, Event::PGFAULT),
                faults + 1,
                "spurious fault"
            );
            assert_eq!(c1.load_u64(a).unwrap(), 3);
            c1.idle();
        });
        phase.wait();
        let reused = m.vmstat().event(Event::WP_REUSE);
        c0.store_u64(a, 2).unwrap();
        assert_eq!(m.vmstat().event(Event::WP_REUSE), reused + 1);
        c0.idle();
        phase.wait();
    });
    assert_eq!(c0.load_u64(a).unwrap(), 3);
    check_invariants(&m).unwrap();
}

#[test]
fn mmap_errors_are_the_kernels() {
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    assert_eq!(c.mmap(0, 0, RW, ANON), Err(Errno::EINVAL));
    assert_eq!(
        c.mmap(0x10001, 4096, RW, ANON | MAP_FIXED),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        c.mmap(0x1000, 4096, RW, ANON | MAP_FIXED),
        Err(Errno::EPERM)
    );
    assert_eq!(c.mmap(0, u64::MAX - 10, RW, ANON), Err(Errno::ENOMEM));
    assert_eq!(c.mmap(0, 4096, RW, MAP_ANONYMOUS), Err(Errno::EINVAL));
    let a = c.mmap(0, 8192, RW, ANON).unwrap();
    assert_eq!(
        c.mmap(a, 4096, RW, ANON | MAP_FIXED_NOREPLACE),
        Err(Errno::EEXIST)
    );
    assert_eq!(c.munmap(a + 1, 4096), Err(Errno::EINVAL));
    assert_eq!(c.munmap(a, 0), Err(Errno::EINVAL));
    assert_eq!(c.mprotect(a + 1, 4096, PROT_READ), Err(Errno::EINVAL));
    assert_eq!(c.mprotect(a, 4096, 0x40), Err(Errno::EINVAL));
    assert_eq!(c.mprotect(a, 3 * 4096, PROT_READ), Err(Errno::ENOMEM));
    assert_eq!(c.madvise(a, 4096, 99), Err(Errno::EINVAL));
    assert_eq!(c.madvise(a, 4 * 4096, MADV_DONTNEED), Err(Errno::ENOMEM));
    check_invariants(&m).unwrap();
}

#[test]
fn munmap_splits_and_mprotect_merges_vmas() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 10 * 4096, RW, ANON).unwrap();
    c.touch_pages(a, a + 10 * 4096, 1).unwrap();
    c.munmap(a + 4 * 4096, 2 * 4096).unwrap();
    assert_eq!(mm.map_count(), 2);
    c.mprotect(a + 4096, 4096, PROT_READ).unwrap();
    assert_eq!(mm.map_count(), 4);
    c.mprotect(a + 4096, 4096, RW).unwrap();
    assert_eq!(mm.map_count(), 2, "restoring the protection merges back");
    c.store_u8(a + 4096, 3).unwrap();
    check_invariants(&m).unwrap();
}

#[test]
fn dontneed_zero_fills_and_free_keeps_contents() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 8 * 4096, RW, ANON).unwrap();
    c.touch_pages(a, a + 8 * 4096, 0xab).unwrap();
    c.madvise(a, 4 * 4096, MADV_DONTNEED).unwrap();
    assert_eq!(c.load_u8(a).unwrap(), 0);
    assert_eq!(mm.rss_pages(), 4);
    c.madvise(a + 4 * 4096, 4 * 4096, MADV_FREE).unwrap();
    assert_eq!(c.load_u8(a + 4 * 4096).unwrap(), 0xab);
    assert_eq!(mm.rss_pages(), 4);
    check_invariants(&m).unwrap();
}

/// A read fault in a THP-eligible range maps the huge zero page: no RSS,
/// one deposited table; a write then gets a THP in place. Split by
/// mprotect, it becomes 512 entries of the small zero page; fork shares it.
#[test]
fn huge_zero_page() {
    use usermm::proc::{smaps_rollup, status};
    let m = machine();
    // A machine under 512 MiB boots with THPs and the huge zero page
    // disabled (`hugepage_init`): the administrator enables them.
    m.thp.set_enabled(usermm::ThpMode::Madvise).unwrap();
    m.thp
        .use_zero_page
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 6 << 20, RW, ANON).unwrap();
    c.madvise(a, 6 << 20, MADV_HUGEPAGE).unwrap();
    for i in 0..3u64 {
        assert_eq!(c.load_u64(a + i * (2 << 20) + 8).unwrap(), 0);
    }
    check_invariants(&m).unwrap();
    let s = status(&mm);
    // Three deposited tables, a PMD table and a PUD table; nothing resident.
    assert_eq!((s.vm_rss, s.vm_pte), (0, 20));
    assert_eq!(
        m.vmstat().event(usermm::vmstat::Event::THP_ZERO_PAGE_ALLOC),
        1
    );
    // A write to the first gets a THP of its own.
    c.store_u64(a + 16, 5).unwrap();
    assert_eq!(c.load_u64(a + 16).unwrap(), 5);
    assert_eq!(smaps_rollup(&mm).anon_huge_pages, 2048);
    check_invariants(&m).unwrap();
    // Split the second by mprotect: zero-page PTEs, still nothing resident.
    c.mprotect(a + (2 << 20) + 4096, 4096, PROT_READ).unwrap();
    assert_eq!(c.load_u64(a + (2 << 20) + 4096).unwrap(), 0);
    assert_eq!(status(&mm).vm_rss, 2048);
    check_invariants(&m).unwrap();
    // mprotect of a whole huge zero PMD keeps it the huge zero page.
    c.mprotect(a + (4 << 20), 2 << 20, PROT_READ).unwrap();
    c.mprotect(a + (4 << 20), 2 << 20, RW).unwrap();
    check_invariants(&m).unwrap();
    // Fork shares the third; the child's write is its own.
    let child = c.fork().unwrap();
    assert_eq!(status(&child).vm_pte, status(&mm).vm_pte);
    c.switch_mm(&child);
    c.store_u64(a + (4 << 20), 9).unwrap();
    c.exit_mm().unwrap();
    c.switch_mm(&mm);
    assert_eq!(c.load_u64(a + (4 << 20)).unwrap(), 0);
    m.rcu_barrier();
    check_invariants(&m).unwrap();
    c.munmap(a, 6 << 20).unwrap();
    m.rcu_barrier();
    check_invariants(&m).unwrap();
    assert_eq!(status(&mm).vm_pte, 0);
}

/// MADV_FREE over large folios: one covered whole is marked lazyfree as it
/// is; one covered in part is split first (exclusive) or left alone
/// (shared with a fork child). Contents stay (no reclaim runs).
#[test]
fn madv_free_splits_partly_covered_exclusive_folios() {
    use usermm::proc::smaps_rollup;
    use usermm::vmstat::MthpStat;
    let m = machine();
    m.thp.only_order(4);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 256 << 10, RW, ANON).unwrap();
    for p in (a..a + (256 << 10)).step_by(4096) {
        c.store_u64(p, p).unwrap();
    }
    // Folio 0 whole, and half of folio 1.
    c.madvise(a, 96 << 10, MADV_FREE).unwrap();
    assert_eq!(m.vmstat().mthp(4, MthpStat::SPLIT), 1);
    // The split's small folios wait in this CPU's lazyfree batch until it
    // drains; the whole folio, large, went at once.
    assert_eq!(smaps_rollup(&mm).lazy_free, 64);
    usermm::swap::lru_add_drain(&m.mem, c.id());
    assert_eq!(smaps_rollup(&mm).lazy_free, 96);
    check_invariants(&m).unwrap();
    for p in (a..a + (256 << 10)).step_by(4096) {
        assert_eq!(c.load_u64(p).unwrap(), p);
    }
    // Shared with a child: a partly covered folio is not split.
    let child = c.fork().unwrap();
    c.madvise(a + (128 << 10), 32 << 10, MADV_FREE).unwrap();
    assert_eq!(m.vmstat().mthp(4, MthpStat::SPLIT), 1);
    check_invariants(&m).unwrap();
    c.switch_mm(&child);
    c.exit_mm().unwrap();
    c.switch_mm(&mm);
    // Exclusive again: now it is split; unmapping half frees what it should.
    c.madvise(a + (128 << 10), 32 << 10, MADV_FREE).unwrap();
    assert_eq!(m.vmstat().mthp(4, MthpStat::SPLIT), 2);
    c.munmap(a + (128 << 10), 32 << 10).unwrap();
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

/// mprotect of the middle of a VMA needs two splits; at `max_map_count`
/// the kernel makes the first and refuses the second (ENOMEM), leaving the
/// address space consistent, with the first split in place.
#[test]
fn mprotect_at_max_map_count_splits_once_then_fails() {
    use usermm::mm::MAX_MAP_COUNT;
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let base = 0x1000_0000u64;
    let fixed = ANON | MAP_FIXED_NOREPLACE;
    let big = c.mmap(base, 3 * 4096, RW, fixed).unwrap();
    // One-page VMAs with holes between them, up to one below the limit.
    for i in 1..(MAX_MAP_COUNT - 1) as u64 {
        c.mmap(base + 2 * i * 4096 + 8192, 4096, RW, fixed).unwrap();
    }
    assert_eq!(mm.map_count(), MAX_MAP_COUNT - 1);
    c.store_u64(big + 4096, 7).unwrap();
    assert_eq!(c.mprotect(big + 4096, 4096, PROT_READ), Err(Errno::ENOMEM));
    assert_eq!(mm.map_count(), MAX_MAP_COUNT, "the lower split stays");
    assert_eq!(c.load_u64(big + 4096).unwrap(), 7);
    c.store_u64(big + 4096, 8).unwrap();
    check_invariants(&m).unwrap();
}

/// At `max_map_count` the kernel refuses what would leave more VMAs than
/// the limit, not what passes it on the way: mmap tests the count before
/// it maps, so an address space may hold one more; munmap refuses only a
/// hole inside one VMA, and splits for a moment past the limit otherwise;
/// mprotect merges with a neighbour before it would split. The host gives
/// the same result at every step (a C program ran this sequence).
#[test]
fn max_map_count_refuses_only_what_would_end_past_it() {
    use usermm::mm::MAX_MAP_COUNT as MAX;
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let page = 4096u64;
    let base = 0x1000_0000u64;
    let fixed = ANON | MAP_FIXED_NOREPLACE;
    let big = c.mmap(base, 4 * page, RW, fixed).unwrap();
    let big2 = c.mmap(base + 8 * page, 3 * page, RW, fixed).unwrap();
    let slot = |i: u64| base + (2 * i + 16) * page;
    let mut i = 1;
    while c.mmap(slot(i), page, RW, fixed).is_ok() {
        i += 1;
    }
    assert_eq!(mm.map_count(), MAX + 1, "mmap may pass the limit by one");
    c.store_u64(big + 2 * page, 7).unwrap();
    c.munmap(big, page).unwrap();
    assert_eq!(mm.map_count(), MAX + 1);
    assert_eq!(c.munmap(big2 + page, page), Err(Errno::ENOMEM));
    for i in 1..=3 {
        c.munmap(slot(i), page).unwrap();
    }
    c.munmap(big2 + page, page).unwrap();
    assert_eq!(mm.map_count(), MAX - 1);
    c.mprotect(big + page, page, PROT_READ).unwrap();
    assert_eq!(mm.map_count(), MAX);
    // The previous VMA takes the page over: nothing is split.
    c.mprotect(big + 2 * page, page, PROT_READ).unwrap();
    assert_eq!(mm.map_count(), MAX);
    c.mprotect(big + 3 * page, page, PROT_READ).unwrap();
    assert_eq!(mm.map_count(), MAX - 1);
    assert_eq!(c.load_u64(big + 2 * page).unwrap(), 7);
    assert_eq!(c.store_u64(big + 2 * page, 8), Err(Errno::EFAULT));
    check_invariants(&m).unwrap();
}

/// Overcommit accounting end to end: what each path charges and gives
/// back, and fork refused under `overcommit_memory=2` once the child's copy
/// of the charged mappings would pass the commit limit (which the host
/// cannot show without exhausting its own).
#[test]
fn overcommit_accounting_follows_every_path() {
    let m = machine(); // 256 MiB: commit limit 128 MiB in mode 2
    let oc = &m.overcommit;
    let pages = |bytes: u64| bytes >> 12;
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 64 << 20, RW, ANON).unwrap();
    assert_eq!(oc.vm_memory_committed(), pages(64 << 20));
    // Read-only and MAP_NORESERVE mappings are not charged.
    let ro = c.mmap(0, 8 << 20, PROT_READ, ANON).unwrap();
    let nr = c.mmap(0, 8 << 20, RW, ANON | MAP_NORESERVE).unwrap();
    assert_eq!(oc.vm_memory_committed(), pages(64 << 20));
    // MAP_FIXED over half the charged mapping takes its charge over.
    c.mmap(a, 32 << 20, RW, ANON | MAP_FIXED).unwrap();
    assert_eq!(oc.vm_memory_committed(), pages(64 << 20));
    // ... and read-only over it gives that half back.
    c.mmap(a, 32 << 20, PROT_READ, ANON | MAP_FIXED).unwrap();
    assert_eq!(oc.vm_memory_committed(), pages(32 << 20));
    // Making a mapping writable charges it; an untouched one made read-only
    // gives it back, a touched one keeps it.
    c.mprotect(ro, 8 << 20, RW).unwrap();
    assert_eq!(oc.vm_memory_committed(), pages(40 << 20));
    c.mprotect(ro, 4 << 20, PROT_READ).unwrap();
    assert_eq!(oc.vm_memory_committed(), pages(36 << 20));
    c.store_u64(ro + (4 << 20), 1).unwrap();
    c.mprotect(ro + (4 << 20), 4 << 20, PROT_READ).unwrap();
    assert_eq!(oc.vm_memory_committed(), pages(36 << 20));
    check_invariants(&m).unwrap();
    // Mode 2: a fork that would double 100 MiB of charges is refused, and
    // leaves nothing charged behind.
    c.munmap(nr, 8 << 20).unwrap();
    c.mmap(0, 64 << 20, RW, ANON).unwrap();
    oc.set_sysctl("overcommit_memory", 2).unwrap();
    let before = oc.vm_memory_committed();
    assert_eq!(before, pages(100 << 20));
    assert_eq!(c.fork().err(), Some(Errno::ENOMEM));
    assert_eq!(oc.vm_memory_committed(), before);
    check_invariants(&m).unwrap();
    // A further 64 MiB would pass the limit; MAP_NORESERVE does not help.
    assert_eq!(c.mmap(0, 64 << 20, RW, ANON), Err(Errno::ENOMEM));
    assert_eq!(
        c.mmap(0, 64 << 20, RW, ANON | MAP_NORESERVE),
        Err(Errno::ENOMEM)
    );
    oc.set_sysctl("overcommit_memory", 0).unwrap();
    let child = c.fork().unwrap();
    assert_eq!(oc.vm_memory_committed(), 2 * before);
    c.switch_mm(&child);
    c.exit_mm().unwrap();
    c.switch_mm(&mm);
    c.exit_mm().unwrap();
    assert_eq!(oc.vm_memory_committed(), 0);
    check_invariants(&m).unwrap();
}

/// The default memory policy is local: a fault allocates its folio and its
/// page tables on the faulting CPU's node, whichever node the process
/// started on.
#[test]
fn faults_allocate_on_the_faulting_cpus_node() {
    use usermm::phys::{NodeConfig, Tier, NODE_PFN_SHIFT};
    let node = NodeConfig {
        size_bytes: 64 << 20,
        tier: Tier::Dram,
        has_cpus: true,
    };
    let m = Machine::new(MachineConfig {
        nodes: vec![node.clone(), node],
        cpus: vec![0, 1],
    })
    .unwrap();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    let a = c0.mmap(0, 4 << 20, RW, ANON).unwrap();
    c0.store_u64(a, 1).unwrap();
    c0.idle();
    drop(c0);
    let node_of = |pfn: u64| pfn >> NODE_PFN_SHIFT;
    let used = |n: usize| m.mem.nodes[n].nr_pages - m.mem.nodes[n].zone.nr_free_pages();
    let before = used(1);
    let c1 = m.bind(1).unwrap();
    c1.switch_mm(&mm);
    c1.store_u64(a + (2 << 20), 2).unwrap();
    let pfn = usermm::pgtable::walk::hw_walk(&m.mem, mm.pgd.cr3(), a + (2 << 20), false)
        .unwrap()
        .pfn;
    assert_eq!(node_of(pfn), 1, "the folio is on CPU 1's node");
    // The page and its PTE table (the PMD table is shared with CPU 0's).
    assert_eq!(used(1) - before, 2);
    assert_eq!(node_of(mm.pgd.cr3()), 0);
    c1.idle();
    check_invariants(&m).unwrap();
}

/// Accesses at the top of the address space fault; none wraps around.
#[test]
fn accesses_that_would_wrap_fault() {
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    for addr in [u64::MAX, u64::MAX - 3, u64::MAX - 7, (1 << 47) - 4] {
        assert_eq!(c.load_u64(addr), Err(Errno::EFAULT), "{addr:#x}");
        assert_eq!(c.store_u64(addr, 1), Err(Errno::EFAULT), "{addr:#x}");
    }
    let mut buf = [0u8; 16];
    assert_eq!(c.read_bytes(u64::MAX - 7, &mut buf), Err(Errno::EFAULT));
    assert_eq!(c.write_bytes(u64::MAX - 7, &buf), Err(Errno::EFAULT));
}

/// The checker finds a frame that nothing holds.
#[test]
fn the_checker_finds_a_leaked_frame() {
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    check_invariants(&m).unwrap();
    let pfn = m.mem.alloc_pages(0, 0, 0, Default::default()).unwrap();
    let err = check_invariants(&m).unwrap_err();
    assert!(err.contains(&format!("the first is {pfn:#x}")), "{err}");
}

/// A PMD mapping's PageAnonExclusive is its head page's alone, as the
/// kernel keeps it; the checker catches a tail page that carries one.
#[test]
fn a_pmd_mappings_exclusive_flag_is_the_heads() {
    use usermm::phys::memmap::pg;
    let m = machine();
    m.thp.set_enabled(ThpMode::Always).unwrap();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let a = c.mmap(0, 2 << 20, RW, ANON).unwrap();
    c.store_u64(a, 5).unwrap();
    let flagged: Vec<u64> = m
        .mem
        .nodes
        .iter()
        .flat_map(|n| n.start_pfn()..n.start_pfn() + n.nr_pages)
        .filter(|&p| m.mem.page(p).test(pg::ANON_EXCLUSIVE))
        .collect();
    assert_eq!(flagged.len(), 1, "only the THP's head: {flagged:x?}");
    check_invariants(&m).unwrap();
    let head = flagged[0];
    m.mem.page(head + 7).set(pg::ANON_EXCLUSIVE);
    let err = check_invariants(&m).unwrap_err();
    assert!(err.contains("is PageAnonExclusive"), "{err}");
    m.mem.page(head + 7).clear(pg::ANON_EXCLUSIVE);
    // The PMD is writable: without the head's flag it would be writable
    // while maybe shared, which the checker reports too.
    m.mem.page(head).clear(pg::ANON_EXCLUSIVE);
    let err = check_invariants(&m).unwrap_err();
    assert!(err.contains("writable PMD"), "{err}");
    m.mem.page(head).set(pg::ANON_EXCLUSIVE);
    // Splitting hands the flag to every page: each may be written in place.
    c.mprotect(a, 4096, PROT_READ).unwrap();
    c.store_u64(a + 8192, 6).unwrap();
    assert!((head..head + 512).all(|p| m.mem.page(p).test(pg::ANON_EXCLUSIVE)));
    check_invariants(&m).unwrap();
    c.exit_mm().unwrap();
}

/// VmPTE (`pgtables_bytes`) counts the page tables reachable from the
/// PGD, which the checker walks; it catches a count off by one table.
#[test]
fn vmpte_counts_the_tables_walked() {
    use std::sync::atomic::Ordering;
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c
        .mmap(0x6000_0000_0000, 4 << 20, RW, ANON | MAP_FIXED)
        .unwrap();
    c.touch_pages(a, a + (4 << 20), 1).unwrap();
    check_invariants(&m).unwrap();
    // A PUD, a PMD and two PTE tables.
    assert_eq!(mm.pgtables_bytes.load(Ordering::Relaxed), 4 * 4096);
    mm.pgtables_bytes.fetch_add(4096, Ordering::Relaxed);
    let err = check_invariants(&m).unwrap_err();
    assert!(err.contains("pgtables_bytes"), "{err}");
    mm.pgtables_bytes.fetch_sub(4096, Ordering::Relaxed);
    check_invariants(&m).unwrap();
    c.exit_mm().unwrap();
}

/// The node statistics agree with the page tables: NR_ANON_MAPPED counts
/// the mapped pages of anon folios, NR_ANON_THPS those a PMD maps; the
/// checker catches either off by one page.
#[test]
fn node_statistics_match_the_tables() {
    use usermm::vmstat::NodeStat;
    let m = machine();
    m.thp.set_enabled(ThpMode::Always).unwrap();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let a = c.mmap(0, 4 << 20, RW, ANON).unwrap();
    c.touch_pages(a, a + (4 << 20), 1).unwrap();
    c.munmap(a + (3 << 20), 4096).unwrap();
    check_invariants(&m).unwrap();
    for stat in [NodeStat::NR_ANON_MAPPED, NodeStat::NR_ANON_THPS] {
        m.vmstat().mod_node(stat, 1);
        let err = check_invariants(&m).unwrap_err();
        assert!(err.contains(stat.name()), "{err}");
        m.vmstat().mod_node(stat, -1);
    }
    check_invariants(&m).unwrap();
    c.exit_mm().unwrap();
}

/// `_nr_pages_mapped` of a large folio counts its pages that PTEs map,
/// plus ENTIRELY_MAPPED while a PMD maps it; the checker compares it with
/// the page tables and catches either half off.
#[test]
fn nr_pages_mapped_matches_the_tables() {
    use std::sync::atomic::Ordering;
    let m = machine();
    m.thp.set_enabled(ThpMode::Always).unwrap();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let huge = 2u64 << 20;
    let raw = c.mmap(0, 3 * huge, RW, ANON).unwrap();
    let a = (raw + huge - 1) & !(huge - 1);
    c.touch_pages(a, a + 2 * huge, 1).unwrap();
    // The first THP stays PMD-mapped; the second is split by a one-page
    // hole and stays a PTE-mapped large folio of 511 mapped pages.
    c.munmap(a + huge + (1 << 20), 4096).unwrap();
    check_invariants(&m).unwrap();
    for addr in [a, a + huge] {
        let pfn = usermm::pgtable::walk::hw_walk(&m.mem, mm.pgd.cr3(), addr, false)
            .unwrap()
            .pfn;
        let folio = m.mem.page_folio(pfn);
        assert!(folio.is_large(&m.mem), "{addr:#x}");
        let npm = &folio.counters(&m.mem).nr_pages_mapped;
        npm.fetch_add(1, Ordering::Relaxed);
        let err = check_invariants(&m).unwrap_err();
        assert!(err.contains("_nr_pages_mapped"), "{err}");
        npm.fetch_sub(1, Ordering::Relaxed);
    }
    check_invariants(&m).unwrap();
    c.exit_mm().unwrap();
}

/// A large folio's MM-owner slots (v6.15): fork gives the child the
/// second slot and marks the folio maybe shared; the child's exit frees
/// its slot and the parent's slot holds every mapping again, so the
/// parent's write reuses the folio in place (no copy, the same frame).
/// The checker compares the slots with the page tables and catches a
/// folio two processes map that is not marked shared, and a slot that
/// counts more mappings than its mm has.
#[test]
fn mm_owner_slots_follow_fork_and_exit() {
    use std::sync::atomic::Ordering;
    use usermm::phys::folio::FOLIO_MM_IDS_SHARED_BIT;
    use usermm::rmap::folio_maybe_mapped_shared;
    let m = machine();
    m.thp.only_order(4);
    let c = m.bind(0).unwrap();
    let parent = c.new_mm().unwrap();
    let a = c
        .mmap(0x6000_0000_0000, 64 << 10, RW, ANON | MAP_FIXED)
        .unwrap();
    c.touch_pages(a, a + (64 << 10), 1).unwrap();
    let frame = |mm: &usermm::mm::Mm, addr| {
        usermm::pgtable::walk::hw_walk(&m.mem, mm.pgd.cr3(), addr, false)
            .unwrap()
            .pfn
    };
    let folio = m.mem.page_folio(frame(&parent, a));
    assert_eq!(folio.nr_pages(&m.mem), 16);
    assert!(!folio_maybe_mapped_shared(&m.mem, folio));
    let child = c.fork().unwrap();
    assert!(folio_maybe_mapped_shared(&m.mem, folio));
    let c1 = folio.counters(&m.mem);
    assert_eq!(c1.mm_id_slot(0), (parent.id, 15));
    assert_eq!(c1.mm_id_slot(1), (child.id, 15));
    check_invariants(&m).unwrap();
    // Broken: the folio two processes map, said to be exclusive.
    c1.mm_ids
        .fetch_and(!FOLIO_MM_IDS_SHARED_BIT, Ordering::Relaxed);
    let err = check_invariants(&m).unwrap_err();
    assert!(err.contains("not marked maybe mapped shared"), "{err}");
    c1.mm_ids
        .fetch_or(FOLIO_MM_IDS_SHARED_BIT, Ordering::Relaxed);
    // Broken: a slot that counts a mapping its mm does not have.
    let counts = c1.mm_id_mapcount.load(Ordering::Relaxed);
    c1.mm_id_mapcount.store(counts + 1, Ordering::Relaxed);
    let err = check_invariants(&m).unwrap_err();
    assert!(err.contains("MM-owner slot 0"), "{err}");
    c1.mm_id_mapcount.store(counts, Ordering::Relaxed);
    c.switch_mm(&child);
    c.exit_mm().unwrap();
    c.switch_mm(&parent);
    assert!(!folio_maybe_mapped_shared(&m.mem, folio));
    assert_eq!(c1.mm_id_slot(1), (0, -1));
    c.store_u64(a + 4096, 7).unwrap();
    assert_eq!(frame(&parent, a + 4096), folio.pfn() + 1, "reused in place");
    check_invariants(&m).unwrap();
    c.exit_mm().unwrap();
}

/// A small folio that a fork shared and that the writer alone maps again
/// is reused in place and moves to the writer's own anon_vma
/// (`folio_move_anon_rmap`, as `wp_can_reuse_anon_folio` does), so that
/// rmap walks find it there without the parent's.
#[test]
fn a_reused_folio_moves_to_the_writers_anon_vma() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let parent = c.new_mm().unwrap();
    let a = c
        .mmap(0x6000_0000_0000, 4096, RW, ANON | MAP_FIXED)
        .unwrap();
    c.store_u64(a, 5).unwrap();
    let child = c.fork().unwrap();
    c.exit_mm().unwrap();
    drop(parent);
    c.switch_mm(&child);
    let pfn = usermm::pgtable::walk::hw_walk(&m.mem, child.pgd.cr3(), a, false)
        .unwrap()
        .pfn;
    let folio = m.mem.page_folio(pfn);
    let guard = usermm::sync::epoch::pin();
    let vma = child.vma_tree(&guard).vma_lookup(a).unwrap().clone();
    let own = std::sync::Arc::as_ptr(vma.anon_vma().unwrap());
    let of_folio = || usermm::rmap::folio_anon_vma(&m.mem, folio).map(|av| av as *const _);
    assert_ne!(of_folio(), Some(own), "still the parent's");
    c.store_u64(a, 6).unwrap();
    let now = usermm::pgtable::walk::hw_walk(&m.mem, child.pgd.cr3(), a, false)
        .unwrap()
        .pfn;
    assert_eq!(now, pfn, "reused in place");
    assert_eq!(of_folio(), Some(own));
    drop(guard);
    check_invariants(&m).unwrap();
    c.exit_mm().unwrap();
}

/// A page that fork shares is not PageAnonExclusive; the checker catches
/// one that says it is while two processes map it.
#[test]
fn an_exclusive_page_is_mapped_once() {
    use usermm::phys::memmap::pg;
    let m = machine();
    let c = m.bind(0).unwrap();
    let parent = c.new_mm().unwrap();
    let a = c.mmap(0, 4096, RW, ANON).unwrap();
    c.store_u64(a, 5).unwrap();
    let page = usermm::pgtable::walk::hw_walk(&m.mem, parent.pgd.cr3(), a, false)
        .unwrap()
        .pfn;
    assert!(m.mem.page(page).test(pg::ANON_EXCLUSIVE));
    let _child = c.fork().unwrap();
    assert!(!m.mem.page(page).test(pg::ANON_EXCLUSIVE), "fork shares it");
    check_invariants(&m).unwrap();
    m.mem.page(page).set(pg::ANON_EXCLUSIVE);
    let err = check_invariants(&m).unwrap_err();
    assert!(
        err.contains("is PageAnonExclusive but mapped 2 times"),
        "{err}"
    );
    m.mem.page(page).clear(pg::ANON_EXCLUSIVE);
    check_invariants(&m).unwrap();
}

/// MADV_FREE of a whole PMD-mapped THP marks it lazyfree in place
/// (madvise_free_huge_pmd): 512 pages counted, the PMD kept; covering it in
/// part splits it and frees only those pages.
#[test]
fn madv_free_of_a_whole_thp_keeps_the_pmd() {
    use usermm::vmstat::Event;
    let m = machine();
    m.thp.set_enabled(ThpMode::Always).unwrap();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 4 << 20, RW, ANON).unwrap();
    c.touch_pages(a, a + (4 << 20), 1).unwrap();
    let thps = || usermm::proc::smaps_rollup(&mm).anon_huge_pages;
    assert_eq!(thps(), 4096);
    c.madvise(a, 2 << 20, MADV_FREE).unwrap();
    assert_eq!(m.vmstat().event(Event::PGLAZYFREE), 512);
    assert_eq!(thps(), 4096, "the PMD stays");
    c.madvise(a + (2 << 20), 1 << 20, MADV_FREE).unwrap();
    // The split's 256 small folios are counted as this CPU's lazyfree
    // batch fills (31 at a time): 8 full batches, and 8 waiting.
    assert_eq!(m.vmstat().event(Event::PGLAZYFREE), 512 + 248);
    usermm::swap::lru_add_drain(&m.mem, c.id());
    assert_eq!(m.vmstat().event(Event::PGLAZYFREE), 512 + 256);
    assert_eq!(thps(), 2048, "the part-covered THP is split");
    assert_eq!(c.load_u8(a + (3 << 20)).unwrap(), 1);
    check_invariants(&m).unwrap();
    c.exit_mm().unwrap();
}
