//! The LRU lists and the per-CPU folio batches that feed them: new folios
//! wait in a batch (holding a reference) until it fills or drains, large
//! folios go at once, freed folios come off, MADV_FREE moves folios to the
//! lazyfree list through a batch of its own, and isolation claims a folio
//! by its PG_lru. The invariant checker runs after each step, and a test
//! breaks the lists by hand to see it object.

use usermm::check::check_invariants;
use usermm::madvise::*;
use usermm::mmap::*;
use usermm::phys::mm_inline::FOLIO_BATCH_SIZE;
use usermm::phys::pg;
use usermm::swap::{folio_isolate_lru, folio_putback_lru, lru_add_drain, lru_add_drain_all};
use usermm::vmstat::{Event, NodeStat};
use usermm::{Machine, MachineConfig};

fn machine() -> std::sync::Arc<Machine> {
    Machine::new(MachineConfig::single_node(256 << 20, 2)).unwrap()
}

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;

fn inactive_anon(m: &Machine) -> i64 {
    m.vmstat().node(NodeStat::NR_INACTIVE_ANON)
}

fn folio_at(m: &Machine, mm: &usermm::mm::Mm, addr: u64) -> usermm::phys::Folio {
    let t = usermm::pgtable::walk::hw_walk(&m.mem, mm.pgd.cr3(), addr, false).unwrap();
    m.mem.page_folio(t.pfn)
}

#[test]
fn new_folios_wait_in_the_batch_until_it_fills() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let n = FOLIO_BATCH_SIZE as u64;
    let a = c.mmap(0, (n + 1) * 4096, RW, ANON).unwrap();
    for i in 0..n - 1 {
        c.store_u64(a + i * 4096, i).unwrap();
    }
    assert_eq!(inactive_anon(&m), 0, "30 new folios wait in the batch");
    let f = folio_at(&m, &mm, a);
    assert!(!f.head(&m.mem).test(pg::LRU));
    assert_eq!(f.ref_count(&m.mem), 2, "the mapping's and the batch's");
    check_invariants(&m).unwrap();
    c.store_u64(a + (n - 1) * 4096, 0).unwrap();
    assert_eq!(inactive_anon(&m), n as i64, "the 31st fills the batch");
    assert!(f.head(&m.mem).test(pg::LRU));
    assert_eq!(f.ref_count(&m.mem), 1);
    c.store_u64(a + n * 4096, 0).unwrap();
    assert_eq!(inactive_anon(&m), n as i64);
    lru_add_drain(&m.mem, c.id());
    assert_eq!(inactive_anon(&m), n as i64 + 1);
    check_invariants(&m).unwrap();
    c.munmap(a, (n + 1) * 4096).unwrap();
    assert_eq!(inactive_anon(&m), 0, "freed folios come off the list");
    check_invariants(&m).unwrap();
}

#[test]
fn large_folios_go_onto_the_list_at_once() {
    let m = machine();
    m.thp.only_order(4);
    let c = m.bind(0).unwrap();
    let _mm = c.new_mm().unwrap();
    let a = c.mmap(0, 256 << 10, RW, ANON).unwrap();
    c.store_u64(a, 1).unwrap();
    assert_eq!(inactive_anon(&m), 16);
    check_invariants(&m).unwrap();
    c.exit_mm().unwrap();
    assert_eq!(inactive_anon(&m), 0);
    check_invariants(&m).unwrap();
}

/// A folio whose last mapping goes while another CPU's batch holds it is
/// freed when that batch drains, and comes off the list then.
#[test]
fn a_remote_batch_keeps_an_unmapped_folio_until_it_drains() {
    let m = machine();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    let a = c0.mmap(0, 4096, RW, ANON).unwrap();
    c0.store_u64(a, 7).unwrap();
    c0.idle();
    let c1 = m.bind(1).unwrap();
    c1.switch_mm(&mm);
    let free = m.mem.nr_free_pages();
    c1.madvise(a, 4096, MADV_DONTNEED).unwrap();
    assert_eq!(m.mem.nr_free_pages(), free, "CPU 0's batch still holds it");
    check_invariants(&m).unwrap();
    lru_add_drain_all(&m.mem, c1.id());
    assert_eq!(m.mem.nr_free_pages(), free + 1);
    assert_eq!(inactive_anon(&m), 0);
    check_invariants(&m).unwrap();
}

/// do_wp_page drains this CPU's batch before it counts references, so a
/// folio left with one mapping after fork is reused, not copied.
#[test]
fn write_fault_reuses_a_folio_its_own_batch_holds() {
    let m = machine();
    let c0 = m.bind(0).unwrap();
    let parent = c0.new_mm().unwrap();
    let a = c0.mmap(0, 4096, RW, ANON).unwrap();
    c0.store_u64(a, 1).unwrap();
    let child = c0.fork().unwrap();
    c0.idle();
    // The child exits on CPU 1, which drains only its own (empty) batch.
    let c1 = m.bind(1).unwrap();
    c1.switch_mm(&child);
    c1.exit_mm().unwrap();
    drop((c1, child));
    let f = folio_at(&m, &parent, a);
    assert!(!f.head(&m.mem).test(pg::LRU), "still in CPU 0's batch");
    let (reuse, cow) = (
        m.vmstat().event(Event::WP_REUSE),
        m.vmstat().event(Event::COW_FAULT),
    );
    c0.store_u64(a, 2).unwrap();
    assert_eq!(m.vmstat().event(Event::WP_REUSE), reuse + 1);
    assert_eq!(m.vmstat().event(Event::COW_FAULT), cow);
    check_invariants(&m).unwrap();
}

#[test]
fn madv_free_moves_folios_to_the_lazyfree_list_as_its_batch_drains() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let _mm = c.new_mm().unwrap();
    let a = c.mmap(0, 8 * 4096, RW, ANON).unwrap();
    for i in 0..8 {
        c.store_u64(a + i * 4096, i).unwrap();
    }
    c.madvise(a, 8 * 4096, MADV_FREE).unwrap();
    // MADV_FREE drained the add batch first; the 8 wait in the lazyfree
    // batch, still on the anon list.
    assert_eq!(inactive_anon(&m), 8);
    assert_eq!(m.vmstat().event(Event::PGLAZYFREE), 0);
    check_invariants(&m).unwrap();
    lru_add_drain(&m.mem, c.id());
    assert_eq!(inactive_anon(&m), 0);
    assert_eq!(m.vmstat().node(NodeStat::NR_INACTIVE_FILE), 8);
    assert_eq!(m.vmstat().event(Event::PGLAZYFREE), 8);
    check_invariants(&m).unwrap();
    // Pageout discards them (clean, lazyfree, on the list).
    c.madvise(a, 8 * 4096, MADV_PAGEOUT).unwrap();
    assert_eq!(m.vmstat().event(Event::PGLAZYFREED), 8);
    assert_eq!(m.vmstat().node(NodeStat::NR_INACTIVE_FILE), 0);
    check_invariants(&m).unwrap();
}

#[test]
fn isolation_claims_a_folio_on_a_list_only() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 4096, RW, ANON).unwrap();
    c.store_u64(a, 1).unwrap();
    let f = folio_at(&m, &mm, a);
    assert!(!folio_isolate_lru(&m.mem, f), "still in the batch");
    lru_add_drain(&m.mem, c.id());
    assert!(folio_isolate_lru(&m.mem, f));
    assert!(!folio_isolate_lru(&m.mem, f), "isolated once only");
    assert_eq!(inactive_anon(&m), 0);
    assert_eq!(f.ref_count(&m.mem), 2, "the mapping's and the isolation's");
    folio_putback_lru(&m.mem, f, c.id());
    lru_add_drain(&m.mem, c.id());
    assert_eq!(inactive_anon(&m), 1);
    assert_eq!(f.ref_count(&m.mem), 1);
    check_invariants(&m).unwrap();
}

/// The checker sees a folio whose PG_lru and list disagree.
#[test]
fn the_checker_catches_a_folio_off_its_list() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 4096, RW, ANON).unwrap();
    c.store_u64(a, 1).unwrap();
    lru_add_drain(&m.mem, c.id());
    check_invariants(&m).unwrap();
    let f = folio_at(&m, &mm, a);
    f.head(&m.mem).set(pg::ACTIVE);
    let e = check_invariants(&m).unwrap_err();
    assert!(e.contains("its flags say"), "{e}");
    f.head(&m.mem).clear(pg::ACTIVE);
    f.head(&m.mem).clear(pg::LRU);
    let e = check_invariants(&m).unwrap_err();
    assert!(e.contains("without PG_lru"), "{e}");
    f.head(&m.mem).set(pg::LRU);
    check_invariants(&m).unwrap();
}
