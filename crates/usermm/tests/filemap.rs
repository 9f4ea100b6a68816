//! File mappings and the page cache: the folios a write makes, read faults
//! with fault-around and PMD mappings, private COW and shared writes,
//! SIGBUS past the end, fork, msync-style writeback and truncation. Each
//! case ends with the invariant checker. The figures asserted are the
//! host kernel's (6.18 on ext4), as `usermm scenario --native` measures
//! them; see tests/scenarios/file_*.scn for the same cases run on both.

use std::sync::Arc;

use usermm::check::check_invariants;
use usermm::errno::Errno;
use usermm::fs::{FMode, File, FsKind};
use usermm::mm::MmCounter;
use usermm::mmap::*;
use usermm::vmstat::Event;
use usermm::{Machine, MachineConfig, OnCpu};

const PAGE: u64 = 4096;
const RW: FMode = FMode {
    read: true,
    write: true,
};

fn machine() -> Arc<Machine> {
    Machine::new(MachineConfig::single_node(256 << 20, 2)).unwrap()
}

fn check(m: &Machine, what: &str) {
    m.rcu_barrier();
    if let Err(e) = check_invariants(m) {
        panic!("{what}: {e}");
    }
}

/// A file of `size` bytes whose page i starts with word `i + 1`, written
/// in `chunk`-byte writes, then written back (`fsync`).
fn make_file(c: &OnCpu, kind: FsKind, size: u64, chunk: u64) -> Arc<File> {
    let inode = c.m.create_file(kind, 0);
    let file = File::open(&inode, RW).unwrap();
    let mut buf = vec![0u8; size as usize];
    for (i, page) in buf.chunks_mut(PAGE as usize).enumerate() {
        let w = (i as u64 + 1).to_le_bytes();
        let n = page.len().min(8);
        page[..n].copy_from_slice(&w[..n]);
    }
    let mut pos = 0;
    while pos < size {
        let n = chunk.min(size - pos);
        let done = usermm::filemap::generic_perform_write(
            c,
            &file,
            pos,
            &buf[pos as usize..(pos + n) as usize],
        )
        .unwrap();
        assert_eq!(done as u64, n);
        pos += n;
    }
    usermm::filemap::filemap_write_and_wait_range(c, &inode, 0, u64::MAX >> 12);
    file
}

fn rss_kb(c: &OnCpu, counter: MmCounter) -> i64 {
    c.mm().unwrap().get_rss(counter) * 4
}

fn folio_orders(c: &OnCpu, file: &File) -> Vec<u32> {
    let mem = &c.m.mem;
    file.mapping()
        .folios()
        .into_iter()
        .map(|(_, f)| f.order(mem))
        .collect()
}

#[test]
fn one_write_makes_pmd_sized_folios_and_a_read_maps_one_by_its_pmd() {
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let file = make_file(&c, FsKind::Ext4, 4 << 20, 4 << 20);
    assert_eq!(folio_orders(&c, &file), vec![9, 9]);
    let a = c
        .mmap_file(0, 4 << 20, PROT_READ, MAP_PRIVATE, Some(&file), 0)
        .unwrap();
    assert_eq!(a % (2 << 20), 0, "ext4 places it PMD-aligned");
    let before = m.vmstat().event(Event::THP_FILE_MAPPED);
    assert_eq!(c.load_u64(a).unwrap(), 1);
    assert_eq!(m.vmstat().event(Event::THP_FILE_MAPPED) - before, 1);
    assert_eq!(rss_kb(&c, MmCounter::FilePages), 2048);
    // The last folio holds the file's last page: fault-around leaves it,
    // and the fault maps it by its PMD after all (finish_fault).
    assert_eq!(c.load_u64(a + (3 << 20)).unwrap(), 769);
    assert_eq!(rss_kb(&c, MmCounter::FilePages), 4096);
    assert_eq!(m.vmstat().event(Event::THP_FILE_MAPPED) - before, 2);
    check(&m, "two PMDs");
    c.munmap(a, 4 << 20).unwrap();
    assert_eq!(rss_kb(&c, MmCounter::FilePages), 0);
    check(&m, "after munmap");
    c.exit_mm().unwrap();
    drop(file);
    check(&m, "after the file went");
}

#[test]
fn small_folios_are_mapped_sixteen_around_a_read() {
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let file = make_file(&c, FsKind::Ext4, 4 << 20, PAGE);
    assert!(folio_orders(&c, &file).iter().all(|&o| o == 0));
    let a = c
        .mmap_file(0, 4 << 20, PROT_READ, MAP_PRIVATE, Some(&file), 0)
        .unwrap();
    assert_eq!(c.load_u64(a + 0x80000).unwrap(), 129);
    assert_eq!(rss_kb(&c, MmCounter::FilePages), 64);
    let faults = m.vmstat().event(Event::PGFAULT);
    for p in 0..1024 {
        assert_eq!(c.load_u64(a + p * PAGE).unwrap(), p + 1);
    }
    assert_eq!(m.vmstat().event(Event::PGFAULT) - faults, 63);
    assert_eq!(rss_kb(&c, MmCounter::FilePages), 4096);
    check(&m, "all mapped");
    c.exit_mm().unwrap();
    check(&m, "exited");
}

#[test]
fn a_private_write_copies_one_page_and_a_pmd_mapping_goes() {
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let file = make_file(&c, FsKind::Ext4, 4 << 20, 4 << 20);
    let a = c
        .mmap_file(
            0,
            4 << 20,
            PROT_READ | PROT_WRITE,
            MAP_PRIVATE,
            Some(&file),
            0,
        )
        .unwrap();
    c.store_u64(a, 99).unwrap();
    assert_eq!(rss_kb(&c, MmCounter::FilePages), 0);
    assert_eq!(rss_kb(&c, MmCounter::AnonPages), 4);
    // The PMD holds a table now: the next read maps the rest of the folio
    // by PTEs, whole (it ends before the file's last page).
    assert_eq!(c.load_u64(a + PAGE).unwrap(), 2);
    assert_eq!(rss_kb(&c, MmCounter::FilePages), 2044);
    check(&m, "cow then read");
    // A write to a PMD-mapped folio leaves one anon page.
    let b = c
        .mmap_file(
            0,
            4 << 20,
            PROT_READ | PROT_WRITE,
            MAP_PRIVATE,
            Some(&file),
            0,
        )
        .unwrap();
    assert_eq!(c.load_u64(b).unwrap(), 1);
    assert_eq!(rss_kb(&c, MmCounter::FilePages), 2044 + 2048);
    c.store_u64(b, 7).unwrap();
    assert_eq!(rss_kb(&c, MmCounter::FilePages), 2044);
    assert_eq!(rss_kb(&c, MmCounter::AnonPages), 8);
    assert_eq!(c.load_u64(b).unwrap(), 7);
    check(&m, "cow of a PMD-mapped page");
    c.exit_mm().unwrap();
    check(&m, "exited");
    // The file itself never changed.
    let inode = file.inode.clone();
    assert_eq!(inode.size(), 4 << 20);
}

#[test]
fn shared_writes_dirty_the_file_and_reach_it_on_writeback() {
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let file = make_file(&c, FsKind::Ext4, 64 * PAGE, PAGE);
    let a = c
        .mmap_file(
            0,
            64 * PAGE,
            PROT_READ | PROT_WRITE,
            MAP_SHARED,
            Some(&file),
            0,
        )
        .unwrap();
    // Read first: fault-around maps 16 clean, read-only (write-notify).
    let faults = m.vmstat().event(Event::PGFAULT);
    assert_eq!(c.load_u64(a).unwrap(), 1);
    c.store_u64(a, 1000).unwrap();
    assert_eq!(m.vmstat().event(Event::PGFAULT) - faults, 2);
    // A neighbour mapped read-only by fault-around needs its own fault.
    c.store_u64(a + PAGE, 1001).unwrap();
    assert_eq!(m.vmstat().event(Event::PGFAULT) - faults, 3);
    check(&m, "dirty");
    let inode = file.inode.clone();
    let written = usermm::filemap::filemap_write_and_wait_range(&c, &inode, 0, 63);
    assert_eq!(written, 2);
    // Cleaned and write-protected: the next store faults again.
    c.store_u64(a, 2000).unwrap();
    assert_eq!(m.vmstat().event(Event::PGFAULT) - faults, 4);
    check(&m, "after writeback");
    c.exit_mm().unwrap();
    // A new mapping reads what was written.
    c.new_mm().unwrap();
    let b = c
        .mmap_file(0, 64 * PAGE, PROT_READ, MAP_SHARED, Some(&file), 0)
        .unwrap();
    assert_eq!(c.load_u64(b).unwrap(), 2000);
    assert_eq!(c.load_u64(b + PAGE).unwrap(), 1001);
    c.exit_mm().unwrap();
    check(&m, "exited");
}

#[test]
fn past_the_end_of_the_file_is_sigbus() {
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let file = make_file(&c, FsKind::Ext4, 5000, 5000);
    let a = c
        .mmap_file(0, 3 * PAGE, PROT_READ, MAP_PRIVATE, Some(&file), 0)
        .unwrap();
    assert_eq!(c.load_u64(a).unwrap(), 1);
    // The page holding EOF reads zeroes past it.
    assert_eq!(c.load_u8(a + 4999).unwrap(), 0);
    assert_eq!(c.load_u8(a + 5000).unwrap(), 0);
    assert_eq!(c.load_u64(a + 2 * PAGE), Err(Errno::SIGBUS));
    assert_eq!(rss_kb(&c, MmCounter::FilePages), 8);
    check(&m, "after SIGBUS");
    c.exit_mm().unwrap();
}

#[test]
fn fork_copies_file_ptes_only_with_an_anon_vma() {
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let file = make_file(&c, FsKind::Ext4, 64 * PAGE, PAGE);
    let a = c
        .mmap_file(
            0,
            64 * PAGE,
            PROT_READ | PROT_WRITE,
            MAP_PRIVATE,
            Some(&file),
            0,
        )
        .unwrap();
    assert_eq!(c.load_u64(a).unwrap(), 1);
    let child = c.fork().unwrap();
    assert_eq!(
        child.get_rss(MmCounter::FilePages),
        0,
        "no anon_vma: nothing copied"
    );
    c.store_u64(a + PAGE, 5).unwrap();
    let child2 = c.fork().unwrap();
    assert_eq!(child2.get_rss(MmCounter::FilePages), 15);
    assert_eq!(child2.get_rss(MmCounter::AnonPages), 1);
    check(&m, "after forks");
    let parent = c.mm().unwrap();
    c.switch_mm(&child2);
    assert_eq!(c.load_u64(a + PAGE).unwrap(), 5);
    c.exit_mm().unwrap();
    c.switch_mm(&child);
    c.exit_mm().unwrap();
    c.switch_mm(&parent);
    c.exit_mm().unwrap();
    check(&m, "all exited");
}

#[test]
fn truncation_unmaps_and_frees_what_lies_past_the_end() {
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let file = make_file(&c, FsKind::Ext4, 64 * PAGE, PAGE);
    let a = c
        .mmap_file(
            0,
            64 * PAGE,
            PROT_READ | PROT_WRITE,
            MAP_PRIVATE,
            Some(&file),
            0,
        )
        .unwrap();
    for p in 0..64 {
        c.load_u64(a + p * PAGE).unwrap();
    }
    c.store_u64(a + 40 * PAGE, 9).unwrap();
    usermm::filemap::do_truncate(&c, &file, 32 * PAGE).unwrap();
    assert_eq!(file.mapping().nrpages(), 32);
    // Private copies past the end go too (even_cows).
    assert_eq!(c.load_u64(a + 40 * PAGE), Err(Errno::SIGBUS));
    assert_eq!(c.load_u64(a + 31 * PAGE).unwrap(), 32);
    check(&m, "after truncate");
    c.exit_mm().unwrap();
    check(&m, "exited");
}

/// The checker's page-cache checks, each shown to catch its error: a
/// cached folio's reference, its index, `RssFile`, the file node
/// statistics, a dirty flag not counted, and a file VMA missing from its
/// file's `i_mmap`.
#[test]
fn the_checker_catches_page_cache_errors() {
    use std::sync::atomic::Ordering;
    use usermm::vmstat::NodeStat;
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let file = make_file(&c, FsKind::Ext4, 4 << 20, 4 << 20);
    let a = c
        .mmap_file(0, 4 << 20, PROT_READ, MAP_SHARED, Some(&file), 0)
        .unwrap();
    c.load_u64(a).unwrap();
    c.load_u64(a + (2 << 20)).unwrap();
    check(&m, "before");
    let mem = &m.mem;
    let (index, folio) = file.mapping().folios()[0];
    let expect_err = |what: &str| {
        m.rcu_barrier();
        let err = check_invariants(&m).unwrap_err();
        assert!(err.contains(what), "expected {what:?}: {err}");
    };
    folio.get(mem);
    expect_err("refcount");
    folio.put(mem, c.id());
    let head = folio.head(mem);
    head.index.store(index + 512, Ordering::Relaxed);
    expect_err("file page 0x200");
    head.index.store(index, Ordering::Relaxed);
    // An unmapped file's folio is checked against its cache alone.
    let other = make_file(&c, FsKind::Ext4, 64 * PAGE, PAGE);
    let (oi, of) = other.mapping().folios()[3];
    of.head(mem).index.store(oi + 1, Ordering::Relaxed);
    expect_err("names another place");
    of.head(mem).index.store(oi, Ordering::Relaxed);
    mm.add_rss(MmCounter::FilePages, 1);
    expect_err("RssFile");
    mm.add_rss(MmCounter::FilePages, -1);
    for stat in [
        NodeStat::NR_FILE_PAGES,
        NodeStat::NR_FILE_MAPPED,
        NodeStat::NR_FILE_PMDMAPPED,
        NodeStat::NR_FILE_THPS,
        NodeStat::NR_FILE_DIRTY,
    ] {
        m.vmstat().mod_node(stat, 1);
        expect_err(stat.name());
        m.vmstat().mod_node(stat, -1);
    }
    head.set(usermm::phys::pg::DIRTY);
    expect_err("nr_dirty");
    head.clear(usermm::phys::pg::DIRTY);
    let vma = {
        let guard = usermm::sync::epoch::pin();
        mm.vma_tree(&guard).vma_lookup(a).cloned().unwrap()
    };
    file.mapping().i_mmap_remove(&vma);
    expect_err("i_mmap");
    file.mapping().i_mmap_insert(&vma);
    check(&m, "restored");
    c.exit_mm().unwrap();
}

/// Reclaim drops clean page-cache folios under memory pressure: a file
/// that fills most of a small machine, written back, then anonymous
/// memory that needs its room. The file's pages leave the cache
/// (`pgsteal_file`), its data comes back from below it on the next read,
/// and the checker finds everything in order.
#[test]
fn reclaim_drops_clean_page_cache_for_anonymous_memory() {
    let m = Machine::new(MachineConfig::single_node(64 << 20, 2)).unwrap();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let file = make_file(&c, FsKind::Ext4, 40 << 20, 1 << 20);
    let a = c
        .mmap_file(0, 40 << 20, PROT_READ, MAP_PRIVATE, Some(&file), 0)
        .unwrap();
    assert_eq!(c.load_u64(a).unwrap(), 1);
    let stolen = m.vmstat().event(Event::PGSTEAL_FILE);
    let anon = c
        .mmap(
            0,
            40 << 20,
            PROT_READ | PROT_WRITE,
            MAP_PRIVATE | MAP_ANONYMOUS,
        )
        .unwrap();
    c.touch_pages(anon, anon + (40 << 20), 1).unwrap();
    assert!(
        m.vmstat().event(Event::PGSTEAL_FILE) > stolen,
        "no page-cache folio was reclaimed"
    );
    assert!(
        file.mapping().nrpages() < 10240,
        "the whole file is still cached"
    );
    check(&m, "after reclaim");
    // The data is still the file's.
    for p in (0..10240u64).step_by(97) {
        assert_eq!(c.load_u64(a + p * PAGE).unwrap(), p + 1);
    }
    check(&m, "after reading back");
    c.exit_mm().unwrap();
}
