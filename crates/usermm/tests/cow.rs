//! Copy-on-write after fork, ported from the kernel's
//! tools/testing/selftests/mm/cow.c (its anonymous-memory cases), for every
//! folio size: 4K, each mTHP size, a PMD-sized THP mapped by PTEs and one
//! mapped by a PMD. Each case runs with fork and zap batching off (the
//! pre-v6.9 paths) and on, and ends with the invariant checker and the
//! values read back on both sides.

use std::sync::Arc;

use usermm::check::check_invariants;
use usermm::mm::{Mm, MmCounter};
use usermm::mmap::*;
use usermm::vmstat::MthpStat;
use usermm::{Machine, MachineConfig, OnCpu};

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;

/// How the test memory is backed (cow.c's `thp_run`s, and the mTHP sizes).
#[derive(Clone, Copy, Debug)]
enum Backing {
    /// Folios of this order mapped by PTEs (order 0 = small pages).
    Pte(u32),
    /// A PMD-sized THP, split into PTEs before the test (cow.c THP_RUN_PTE).
    PteMappedThp,
    /// A PMD-sized THP mapped by its PMD (cow.c THP_RUN_PMD).
    Pmd,
}

const BACKINGS: [Backing; 11] = [
    Backing::Pte(0),
    Backing::Pte(2),
    Backing::Pte(3),
    Backing::Pte(4),
    Backing::Pte(5),
    Backing::Pte(6),
    Backing::Pte(7),
    Backing::Pte(8),
    Backing::PteMappedThp,
    Backing::Pmd,
    Backing::Pte(9),
];

impl Backing {
    fn order(self) -> u32 {
        match self {
            Backing::Pte(o) => o,
            Backing::PteMappedThp | Backing::Pmd => 9,
        }
    }
    fn size(self) -> u64 {
        PAGE << self.order()
    }
}

struct Setup {
    m: Arc<Machine>,
}

impl Setup {
    fn new(batch: bool) -> Setup {
        let m = Machine::new(MachineConfig::single_node(256 << 20, 2)).unwrap();
        m.tunables.set_fork_batch(batch);
        m.tunables.set_zap_batch(batch);
        Setup { m }
    }
}

fn pattern(addr: u64, gen: u64) -> u64 {
    addr.rotate_left(17) ^ gen.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5a5a
}

/// Map two folios' worth of memory, folio-aligned, populate it with folios of
/// the backing's size (checked through the mTHP counters) and fill each
/// page's words 0 and 511 with the generation-0 pattern.
fn populate(c: &OnCpu, b: Backing) -> (u64, u64) {
    let m = c.m;
    let size = b.size();
    let len = 2 * size;
    m.thp.only_order(b.order());
    let raw = c.mmap(0, len + size, RW, ANON).unwrap();
    let a = (raw + size - 1) & !(size - 1);
    if a > raw {
        c.munmap(raw, a - raw).unwrap();
    }
    if raw + len + size > a + len {
        c.munmap(a + len, raw + len + size - (a + len)).unwrap();
    }
    let before = m.vmstat().mthp(b.order(), MthpStat::ANON_FAULT_ALLOC);
    write_all(c, a, len, 0);
    if b.order() >= 2 {
        let got = m.vmstat().mthp(b.order(), MthpStat::ANON_FAULT_ALLOC) - before;
        assert_eq!(got, 2, "{b:?}: expected two folios of order {}", b.order());
    }
    if let Backing::PteMappedThp = b {
        // cow.c: mprotect one page to split the PMD, then restore it.
        c.mprotect(a + PAGE, PAGE, PROT_READ).unwrap();
        c.mprotect(a + PAGE, PAGE, RW).unwrap();
    }
    (a, len)
}

fn write_all(c: &OnCpu, a: u64, len: u64, gen: u64) {
    for p in (a..a + len).step_by(PAGE as usize) {
        c.store_u64(p, pattern(p, gen)).unwrap();
        c.store_u64(p + PAGE - 8, pattern(p + 1, gen)).unwrap();
    }
}

fn expect_all(c: &OnCpu, a: u64, len: u64, gen: u64, who: &str) {
    for p in (a..a + len).step_by(PAGE as usize) {
        assert_eq!(c.load_u64(p).unwrap(), pattern(p, gen), "{who}: {p:#x}");
        assert_eq!(
            c.load_u64(p + PAGE - 8).unwrap(),
            pattern(p + 1, gen),
            "{who}: {p:#x}+4088"
        );
    }
}

fn check(m: &Machine, what: &str) {
    m.rcu_barrier();
    if let Err(e) = check_invariants(m) {
        panic!("{what}: {e}");
    }
}

/// Run `f` for every backing, with batching off and on.
fn for_each_config(f: impl Fn(&Setup, Backing)) {
    for batch in [false, true] {
        for b in BACKINGS {
            let s = Setup::new(batch);
            f(&s, b);
            check(&s.m, &format!("{b:?} batch={batch} at the end"));
            assert!(s.m.mms().is_empty(), "every process exited");
        }
    }
}

fn exit(c: &OnCpu, mm: &Arc<Mm>) {
    c.switch_mm(mm);
    c.exit_mm().unwrap();
}

/// cow.c "Basic COW after fork()": the child writes; the parent must not
/// see it. Then the parent writes; the child must not see that.
#[test]
fn cow_after_fork_is_private_both_ways() {
    for_each_config(|s, b| {
        let c = s.m.bind(0).unwrap();
        let parent = c.new_mm().unwrap();
        let (a, len) = populate(&c, b);
        let child = c.fork().unwrap();
        assert_eq!(
            child.get_rss(MmCounter::AnonPages),
            parent.get_rss(MmCounter::AnonPages),
            "{b:?}: the child maps what the parent maps"
        );
        assert_eq!(
            child
                .pgtables_bytes
                .load(std::sync::atomic::Ordering::Relaxed),
            parent
                .pgtables_bytes
                .load(std::sync::atomic::Ordering::Relaxed),
            "{b:?}: the child has the parent's page-table shape"
        );
        check(&s.m, &format!("{b:?} after fork"));

        c.switch_mm(&child);
        expect_all(&c, a, len, 0, "child before writing");
        write_all(&c, a, len, 1);
        check(&s.m, &format!("{b:?} after the child's writes"));
        c.switch_mm(&parent);
        expect_all(&c, a, len, 0, "parent after the child wrote");
        write_all(&c, a, len, 2);
        c.switch_mm(&child);
        expect_all(&c, a, len, 1, "child after the parent wrote");
        check(&s.m, &format!("{b:?} after both wrote"));
        exit(&c, &child);
        check(&s.m, &format!("{b:?} after the child exited"));
        c.switch_mm(&parent);
        expect_all(&c, a, len, 2, "parent after the child exited");
        exit(&c, &parent);
    });
}

/// The parent exits first: the child keeps every page, intact, and owns it
/// exclusively enough to write without copying what the parent freed.
#[test]
fn parent_exits_first() {
    for_each_config(|s, b| {
        let c = s.m.bind(0).unwrap();
        let parent = c.new_mm().unwrap();
        let (a, len) = populate(&c, b);
        let child = c.fork().unwrap();
        exit(&c, &parent);
        check(&s.m, &format!("{b:?} after the parent exited"));
        c.switch_mm(&child);
        expect_all(&c, a, len, 0, "child after the parent exited");
        write_all(&c, a, len, 3);
        expect_all(&c, a, len, 3, "child after writing");
        exit(&c, &child);
    });
}

/// cow.c THP_RUN_SINGLE_PTE and partial mprotect: before the fork, all of
/// the first folio but one page is unmapped, and half of the second is made
/// read-only. The fork must copy the remnants faithfully.
#[test]
fn partial_munmap_and_mprotect_before_fork() {
    for_each_config(|s, b| {
        let c = s.m.bind(0).unwrap();
        let parent = c.new_mm().unwrap();
        let (a, len) = populate(&c, b);
        let size = b.size();
        if size > PAGE {
            c.munmap(a + PAGE, size - PAGE).unwrap();
            c.mprotect(a + size, size / 2, PROT_READ).unwrap();
        }
        check(&s.m, &format!("{b:?} after partial munmap/mprotect"));
        let child = c.fork().unwrap();
        check(&s.m, &format!("{b:?} after fork"));
        c.switch_mm(&child);
        expect_all(&c, a, PAGE, 0, "child, kept page");
        expect_all(&c, a + size, size, 0, "child, second folio");
        c.store_u64(a, 77).unwrap();
        if size > PAGE {
            assert_eq!(c.store_u64(a + size, 1), Err(usermm::Errno::EFAULT));
            write_all(&c, a + size + size / 2, size / 2, 4);
        }
        c.switch_mm(&parent);
        expect_all(&c, a, PAGE, 0, "parent, kept page");
        expect_all(&c, a + size, size, 0, "parent, second folio");
        let _ = len;
        check(&s.m, &format!("{b:?} after the child's writes"));
        exit(&c, &child);
        exit(&c, &parent);
    });
}

/// Partial munmap and mprotect of shared large folios after the fork, on
/// each side: the other side keeps its view, and the folios end up partly
/// mapped without losing a page.
#[test]
fn partial_munmap_and_mprotect_after_fork() {
    for_each_config(|s, b| {
        let c = s.m.bind(0).unwrap();
        let parent = c.new_mm().unwrap();
        let (a, len) = populate(&c, b);
        let size = b.size();
        let child = c.fork().unwrap();
        let half = (size / 2).max(PAGE);
        // The parent drops the first half of folio 0 and protects part of folio 1.
        c.munmap(a, half).unwrap();
        c.mprotect(a + size, half, PROT_READ).unwrap();
        check(
            &s.m,
            &format!("{b:?} after the parent's partial munmap/mprotect"),
        );
        c.switch_mm(&child);
        expect_all(&c, a, len, 0, "child after the parent's munmap");
        // The child drops the second half of folio 1 and writes folio 0.
        if size > PAGE {
            c.munmap(a + size + half, size - half).unwrap();
        }
        write_all(&c, a, size, 5);
        check(&s.m, &format!("{b:?} after the child's partial munmap"));
        c.switch_mm(&parent);
        if size > PAGE {
            expect_all(&c, a + half, size - half, 0, "parent, rest of folio 0");
        }
        expect_all(&c, a + size, size, 0, "parent, folio 1");
        assert_eq!(c.store_u64(a + size, 9), Err(usermm::Errno::EFAULT));
        exit(&c, &parent);
        c.switch_mm(&child);
        expect_all(&c, a, size, 5, "child after the parent exited");
        expect_all(&c, a + size, half, 0, "child, folio 1");
        exit(&c, &child);
    });
}

/// Repeated forks: a chain of children, each forked from the last, each
/// writing its own generation; every process keeps its own view.
#[test]
fn repeated_forks() {
    for_each_config(|s, b| {
        let c = s.m.bind(0).unwrap();
        let first = c.new_mm().unwrap();
        let (a, len) = populate(&c, b);
        let mut procs = vec![first];
        for gen in 1..=4u64 {
            // Fork from the newest process, then let it write.
            c.switch_mm(procs.last().unwrap());
            let child = c.fork().unwrap();
            procs.push(child.clone());
            c.switch_mm(&child);
            expect_all(&c, a, len, gen - 1, "new child");
            write_all(&c, a, len, gen);
            check(&s.m, &format!("{b:?} after fork {gen}"));
        }
        for (gen, mm) in procs.iter().enumerate() {
            c.switch_mm(mm);
            expect_all(&c, a, len, gen as u64, "process of the chain");
        }
        // Exit in an order that is neither forward nor backward.
        for i in [2, 0, 4, 1, 3] {
            exit(&c, &procs[i]);
            check(&s.m, &format!("{b:?} after process {i} exited"));
        }
    });
}
