//! MADV_PAGEOUT on a machine without swap: clean lazyfree folios are
//! discarded at once, everything else stays (checked natively by the
//! scenario `madv_pageout_lazyfree.scn`).

use std::sync::Arc;

use usermm::check::check_invariants;
use usermm::madvise::{MADV_FREE, MADV_PAGEOUT};
use usermm::mm::Mm;
use usermm::mmap::*;
use usermm::pgtable::PMD_SIZE;
use usermm::vmstat::{Event, MthpStat};
use usermm::{Machine, MachineConfig, OnCpu};

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;

fn machine(order: u32) -> Arc<Machine> {
    let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
    m.thp.only_order(order);
    m
}

/// `len` bytes on a PMD boundary, written with `v`.
fn filled(c: &OnCpu, len: u64, v: u8) -> u64 {
    let raw = c.mmap(0, len + PMD_SIZE, RW, ANON).unwrap();
    let a = (raw + PMD_SIZE - 1) & !(PMD_SIZE - 1);
    c.touch_pages(a, a + len, v).unwrap();
    a
}

fn rss_kb(mm: &Mm) -> u64 {
    usermm::proc::status(mm).rss_anon
}

#[test]
fn clean_lazyfree_pages_are_discarded_and_read_back_zero() {
    let m = machine(0);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = filled(&c, 1 << 20, 7);
    let pte = usermm::proc::status(&mm).vm_pte;
    c.madvise(a, 1 << 20, MADV_FREE).unwrap();
    c.madvise(a, 1 << 20, MADV_PAGEOUT).unwrap();
    assert_eq!(rss_kb(&mm), 0);
    assert_eq!(m.vmstat().event(Event::PGLAZYFREED), 256);
    assert_eq!(usermm::proc::status(&mm).vm_pte, pte, "tables stay");
    check_invariants(&m).unwrap();
    assert_eq!(c.load_u8(a + 5 * PAGE).unwrap(), 0);
    m.rcu_barrier();
    check_invariants(&m).unwrap();
}

#[test]
fn written_and_swap_backed_pages_stay() {
    let m = machine(0);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = filled(&c, 1 << 20, 7);
    c.madvise(a, 512 << 10, MADV_FREE).unwrap();
    c.store_u8(a + PAGE, 9).unwrap();
    c.madvise(a, 1 << 20, MADV_PAGEOUT).unwrap();
    // 127 clean lazyfree pages went; the written one and the 128 never
    // freed stay.
    assert_eq!(rss_kb(&mm), 4 * 129);
    assert_eq!(m.vmstat().event(Event::PGLAZYFREED), 127);
    assert_eq!(c.load_u8(a + PAGE).unwrap(), 9);
    assert_eq!(c.load_u8(a + (600 << 10)).unwrap(), 7);
    // The written page is swap-backed again: a second pageout keeps it.
    c.madvise(a, 1 << 20, MADV_PAGEOUT).unwrap();
    assert_eq!(c.load_u8(a + PAGE).unwrap(), 9);
    assert_eq!(m.vmstat().event(Event::PGLAZYFREED), 127);
    check_invariants(&m).unwrap();
}

#[test]
fn pages_another_process_maps_stay() {
    let m = machine(0);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = filled(&c, 256 << 10, 7);
    let child = c.fork().unwrap();
    c.madvise(a, 256 << 10, MADV_FREE).unwrap();
    c.madvise(a, 256 << 10, MADV_PAGEOUT).unwrap();
    assert_eq!(m.vmstat().event(Event::PGLAZYFREED), 0);
    assert_eq!(rss_kb(&mm), 256);
    c.switch_mm(&child);
    assert_eq!(c.load_u8(a + PAGE).unwrap(), 7);
    check_invariants(&m).unwrap();
}

/// A 64K folio covered whole goes as one; one covered in part is split and
/// only the covered pages go.
#[test]
fn large_folios_go_whole_or_are_split() {
    let m = machine(4);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = filled(&c, 256 << 10, 7);
    c.madvise(a, 256 << 10, MADV_FREE).unwrap();
    c.madvise(a, 64 << 10, MADV_PAGEOUT).unwrap();
    assert_eq!(m.vmstat().event(Event::PGLAZYFREED), 16);
    assert_eq!(rss_kb(&mm), 192);
    let split = m.vmstat().mthp(4, MthpStat::SPLIT);
    c.madvise(a + (64 << 10), 8 << 10, MADV_PAGEOUT).unwrap();
    assert_eq!(m.vmstat().mthp(4, MthpStat::SPLIT), split + 1);
    assert_eq!(m.vmstat().event(Event::PGLAZYFREED), 18);
    assert_eq!(rss_kb(&mm), 184);
    assert_eq!(c.load_u8(a + (64 << 10)).unwrap(), 0);
    assert_eq!(c.load_u8(a + (80 << 10)).unwrap(), 7);
    check_invariants(&m).unwrap();
}
