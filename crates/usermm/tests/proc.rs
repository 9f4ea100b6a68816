//! /proc/<pid>/status and smaps figures for sequences whose kernel figures
//! follow from task_mem and smaps_account.

use usermm::mmap::*;
use usermm::proc::{smaps, smaps_rollup, status};
use usermm::{Machine, MachineConfig};

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;

#[test]
fn status_counts_rss_and_page_tables() {
    let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 1 << 20, RW, ANON).unwrap();
    let s = status(&mm);
    assert_eq!((s.vm_size, s.vm_rss, s.vm_pte), (1024, 0, 0));
    c.touch_pages(a, a + (64 << 10), 1).unwrap();
    // Reads map the zero page: no RSS.
    c.load_u64(a + (128 << 10)).unwrap();
    let s = status(&mm);
    assert_eq!((s.vm_rss, s.rss_anon), (64, 64));
    // One PTE, one PMD and one PUD table.
    assert_eq!(s.vm_pte, 12);
    assert!(s.to_string().contains("RssAnon:"));
    let sm = smaps(&mm);
    assert_eq!(sm.len(), 1);
    assert_eq!((sm[0].size, sm[0].rss, sm[0].pss), (1024, 64, 64));
    assert_eq!(
        (sm[0].anonymous, sm[0].private_dirty, sm[0].anon_huge_pages),
        (64, 64, 0)
    );
    assert_eq!(sm[0].perms, "rw-p");
}

#[test]
fn smaps_after_fork_shares_and_splits_pss() {
    let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
    let c = m.bind(0).unwrap();
    let parent = c.new_mm().unwrap();
    let a = c.mmap(0, 64 << 10, RW, ANON).unwrap();
    c.touch_pages(a, a + (64 << 10), 1).unwrap();
    let child = c.fork().unwrap();
    let p = smaps_rollup(&parent);
    assert_eq!(
        (p.rss, p.pss, p.shared_dirty, p.private_dirty),
        (64, 32, 64, 0)
    );
    // The child writes one page: it gets its own copy.
    c.switch_mm(&child);
    c.store_u8(a, 2).unwrap();
    let ch = smaps_rollup(&child);
    assert_eq!((ch.rss, ch.private_dirty, ch.shared_dirty), (64, 4, 60));
    assert_eq!(ch.pss, 4 + 30);
    assert_eq!(status(&child).rss_anon, 64);
    c.exit_mm().unwrap();
    c.switch_mm(&parent);
    let p = smaps_rollup(&parent);
    assert_eq!((p.pss, p.private_dirty), (64, 64));
}

#[test]
fn anon_huge_pages_counts_pmd_mappings_only() {
    let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
    m.thp.only_order(9);
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 4 << 20, RW, ANON).unwrap();
    c.touch_pages(a, a + (4 << 20), 1).unwrap();
    let r = smaps_rollup(&mm);
    assert_eq!((r.rss, r.anon_huge_pages), (4096, 4096));
    // Splitting one PMD (mprotect of one page) keeps the RSS, not the PMD.
    c.mprotect(a + 4096, 4096, PROT_READ).unwrap();
    let r = smaps_rollup(&mm);
    assert_eq!((r.rss, r.anon_huge_pages), (4096, 2048));
    // Deposited tables count in VmPTE: two (one now in use), PMD, PUD.
    assert_eq!(status(&mm).vm_pte, 16);
}
