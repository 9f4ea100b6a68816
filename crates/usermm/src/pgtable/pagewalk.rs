//! One page-table walker for every software walk that visits
//! (mm/pagewalk.c's `walk_page_range` with `struct mm_walk_ops`).
//!
//! The walker descends from the PGD over `[start, end)` and calls the
//! caller's [`MmWalkOps`] at each level: [`MmWalkOps::table`] for every
//! table it enters (and every PTE table deposited under a PMD table's huge
//! entries), [`MmWalkOps::pmd_entry`] for every PMD entry that is not none,
//! and, when that callback asks for the subtree, [`MmWalkOps::pte_entry`] for
//! every PTE that is not none. A callback's error ends the walk, as a
//! non-zero return of a kernel walk op does.
//!
//! # Locking
//!
//! The caller holds mmap_lock (or otherwise keeps the upper tables alive:
//! they are freed only over detached VMAs). PTE tables are mapped as the
//! caller asks ([`WalkLock`]): with the PTE lock held, as `walk_pte_range`
//! does, or locklessly under an epoch pin (`pte_offset_map`), for readers
//! that tolerate entries changing under them. If the PMD stops pointing to
//! a table between `pmd_entry` and the mapping, the walker reads the PMD
//! again and calls `pmd_entry` again (`ACTION_AGAIN`).
//!
//! A callback that wants to change entries takes the locks itself from the
//! [`PmdSlot`] it is given, as the kernel's `pmd_entry` walkers do
//! (`madvise_free_pte_range`, `smaps_pte_range`).
//!
//! The kernel's walker also iterates the VMAs of the range and splits a
//! huge PMD when only `pte_entry` is given; this one walks page tables
//! only (the caller restricts the range to a VMA where it matters) and
//! leaves huge PMDs to `pmd_entry`.

use std::ops::ControlFlow;

use super::entry::{Pmd, Pte, _PAGE_PRESENT};
use super::generic::{next_table, Pgd, PmdSlot, PteRead};
use super::{addr_end, entry_get, pgd_index, pmd_index, pud_index, PGDIR_SIZE, PMD_SIZE, PUD_SIZE};
use crate::phys::{Pfn, PhysMem, PAGE_SIZE};
use crate::sync::Ordering;

/// How the walker maps PTE tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkLock {
    /// `pte_offset_map_lock`: each PTE table's lock is held while its
    /// entries are visited.
    Ptl,
    /// `pte_offset_map`: no lock, an epoch pin; entries may change.
    Lockless,
}

/// What the walker does after `pmd_entry` (`walk->action`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkAction {
    /// Walk the PTE table under the entry, if it points to one
    /// (`ACTION_SUBTREE`).
    Subtree,
    /// The callback dealt with the entry: go on to the next
    /// (`ACTION_CONTINUE`).
    Continue,
}

/// The level of a table the walk enters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableLevel {
    Pud,
    Pmd,
    Pte,
    /// A PTE table deposited under a huge PMD of the PMD table just
    /// entered (reported with that table's address).
    Deposited,
}

/// A page-table frame, as an identity (to count tables and to tell them
/// from free frames); its entries are reached only through the walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableId(Pfn);

impl TableId {
    #[inline]
    pub fn frame(self) -> Pfn {
        self.0
    }

    /// For the invariant checker, with no other walker running: whether a
    /// tracked PTE table's count (`pte_ref`) equals its non-none entries
    /// plus the `held` references of the checker's own walk. None when it
    /// does, or the table is not tracked.
    pub fn pte_ref_mismatch(self, mem: &PhysMem, held: i64) -> Option<String> {
        let r = super::pte_ref_of(mem, self.0)?;
        let entries = (0..super::PTRS_PER_TABLE)
            .filter(|&i| super::entry_get(mem, self.0, i) != 0)
            .count() as i64;
        let count = r.quiescent_count() - held;
        (count != entries).then(|| {
            format!(
                "PTE table {:#x}: pte_ref {count} (atomic: {}), {entries} entries",
                self.0,
                r.is_atomic()
            )
        })
    }
}

/// The callbacks of a walk (`struct mm_walk_ops`). Each has a default
/// that does nothing and lets the walk go on down.
pub trait MmWalkOps {
    /// Returned by a callback to end the walk.
    type Break;

    /// A table the walk enters, covering from `addr`.
    fn table(
        &mut self,
        _level: TableLevel,
        _table: TableId,
        _addr: u64,
    ) -> ControlFlow<Self::Break> {
        ControlFlow::Continue(())
    }

    /// A PMD entry that is not none, over `[addr, next)`.
    fn pmd_entry(
        &mut self,
        _slot: PmdSlot,
        _pmd: Pmd,
        _addr: u64,
        _next: u64,
    ) -> ControlFlow<Self::Break, WalkAction> {
        ControlFlow::Continue(WalkAction::Subtree)
    }

    /// A dead PTE table covering from `addr` (`pte_ref`: its count reached
    /// zero, so walkers are refused it until it is unhooked and freed). It
    /// maps nothing; only an accounting of tables needs to see it.
    fn dead_pte_table(&mut self, _table: TableId, _addr: u64) -> ControlFlow<Self::Break> {
        ControlFlow::Continue(())
    }

    /// A PTE that is not none, at `addr`: present, or a non-present entry
    /// ([`super::swapops`]).
    fn pte_entry(&mut self, _pte: Pte, _addr: u64) -> ControlFlow<Self::Break> {
        ControlFlow::Continue(())
    }
}

/// `walk_page_range` over the tables of `pgd`.
pub fn walk_page_range<O: MmWalkOps>(
    mem: &PhysMem,
    pgd: &Pgd,
    start: u64,
    end: u64,
    lock: WalkLock,
    ops: &mut O,
) -> ControlFlow<O::Break> {
    let walk = Walk { mem, lock };
    let mut addr = start;
    while addr < end {
        let next = addr_end(addr, end, PGDIR_SIZE);
        let e = entry_get(mem, pgd.cr3(), pgd_index(addr));
        if e & _PAGE_PRESENT != 0 {
            walk.pud_range(next_table(e), addr, next, ops)?;
        }
        addr = next;
    }
    ControlFlow::Continue(())
}

struct Walk<'a> {
    mem: &'a PhysMem,
    lock: WalkLock,
}

impl Walk<'_> {
    /// `walk_pud_range`.
    fn pud_range<O: MmWalkOps>(
        &self,
        table: Pfn,
        mut addr: u64,
        end: u64,
        ops: &mut O,
    ) -> ControlFlow<O::Break> {
        ops.table(TableLevel::Pud, TableId(table), addr)?;
        while addr < end {
            let next = addr_end(addr, end, PUD_SIZE);
            let e = entry_get(self.mem, table, pud_index(addr));
            if e & _PAGE_PRESENT != 0 {
                self.pmd_range(next_table(e), addr, next, ops)?;
            }
            addr = next;
        }
        ControlFlow::Continue(())
    }

    /// `walk_pmd_range`.
    fn pmd_range<O: MmWalkOps>(
        &self,
        table: Pfn,
        mut addr: u64,
        end: u64,
        ops: &mut O,
    ) -> ControlFlow<O::Break> {
        ops.table(TableLevel::Pmd, TableId(table), addr)?;
        // The PTE tables deposited under this table's huge PMDs hang off
        // its descriptor (see PmdLocked::deposit).
        let mut dep = self.mem.page(table).private.load(Ordering::Relaxed);
        while dep != 0 {
            ops.table(TableLevel::Deposited, TableId(dep - 1), addr)?;
            dep = self.mem.page(dep - 1).private.load(Ordering::Relaxed);
        }
        while addr < end {
            let next = addr_end(addr, end, PMD_SIZE);
            let slot = PmdSlot::at(table, pmd_index(addr));
            self.pmd_entry(slot, addr, next, ops)?;
            addr = next;
        }
        ControlFlow::Continue(())
    }

    /// One PMD entry: the callback, then its PTE table if asked; again if
    /// the table went away in between.
    fn pmd_entry<O: MmWalkOps>(
        &self,
        slot: PmdSlot,
        addr: u64,
        next: u64,
        ops: &mut O,
    ) -> ControlFlow<O::Break> {
        loop {
            let pmd = slot.get(self.mem);
            if pmd.none() {
                return ControlFlow::Continue(());
            }
            if ops.pmd_entry(slot, pmd, addr, next)? == WalkAction::Continue {
                return ControlFlow::Continue(());
            }
            let pmd = slot.get(self.mem);
            if pmd.none() || pmd.trans_huge() || pmd.is_swap() {
                // Gone, huge, or a PMD migration entry: no PTE table below.
                return ControlFlow::Continue(());
            }
            let done = match self.lock {
                WalkLock::Ptl => slot
                    .pte_offset_map_lock(self.mem)
                    .map(|pt| self.pte_range(&pt, TableId(pt.frame()), addr, next, ops)),
                WalkLock::Lockless => slot
                    .pte_offset_map(self.mem)
                    .map(|pt| self.pte_range(&pt, TableId(pt.frame()), addr, next, ops)),
            };
            if let Some(flow) = done {
                return flow;
            }
            if let Some(dead) = slot.dead_pte_table(self.mem) {
                // A dead tracked table (`pte_ref`) maps nothing and is
                // refused to walkers until it is freed: nothing to visit.
                return ops.dead_pte_table(TableId(dead), addr);
            }
        }
    }

    /// `walk_pte_range`.
    fn pte_range<O: MmWalkOps>(
        &self,
        pt: &impl PteRead,
        table: TableId,
        addr: u64,
        end: u64,
        ops: &mut O,
    ) -> ControlFlow<O::Break> {
        ops.table(TableLevel::Pte, table, addr)?;
        let mut a = addr;
        while a < end {
            let pte = pt.pte(super::pte_index(a));
            if !pte.none() {
                ops.pte_entry(pte, a)?;
            }
            a += PAGE_SIZE;
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
    use crate::{Machine, MachineConfig};

    /// Counts what a walk saw.
    #[derive(Default)]
    struct Count {
        tables: Vec<(TableLevel, u64)>,
        huge: Vec<u64>,
        ptes: Vec<u64>,
        stop_at: Option<u64>,
    }

    impl MmWalkOps for Count {
        type Break = u64;

        fn table(&mut self, level: TableLevel, _t: TableId, addr: u64) -> ControlFlow<u64> {
            self.tables.push((level, addr));
            ControlFlow::Continue(())
        }

        fn pmd_entry(
            &mut self,
            _s: PmdSlot,
            pmd: Pmd,
            addr: u64,
            _n: u64,
        ) -> ControlFlow<u64, WalkAction> {
            if pmd.trans_huge() {
                self.huge.push(addr);
                return ControlFlow::Continue(WalkAction::Continue);
            }
            ControlFlow::Continue(WalkAction::Subtree)
        }

        fn pte_entry(&mut self, _pte: Pte, addr: u64) -> ControlFlow<u64> {
            if self.stop_at == Some(addr) {
                return ControlFlow::Break(addr);
            }
            self.ptes.push(addr);
            ControlFlow::Continue(())
        }
    }

    #[test]
    fn walks_every_level_once_and_stops_when_told() {
        let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let rw = PROT_READ | PROT_WRITE;
        let a = c.mmap(0, 8 << 20, rw, MAP_PRIVATE | MAP_ANONYMOUS).unwrap();
        let a2 = (a + PMD_SIZE - 1) & !(PMD_SIZE - 1);
        // A THP in the first aligned 2 MiB, then three small pages in the
        // next, one of them past the walked range.
        m.thp.only_order(crate::phys::HPAGE_PMD_ORDER);
        c.store_u8(a2, 1).unwrap();
        m.thp.only_order(0);
        for i in [0, 5, 300] {
            c.store_u8(a2 + PMD_SIZE + i * PAGE_SIZE, 1).unwrap();
        }
        let end = a2 + PMD_SIZE + 300 * PAGE_SIZE;
        for lock in [WalkLock::Ptl, WalkLock::Lockless] {
            let mut w = Count::default();
            let flow = walk_page_range(&m.mem, &mm.pgd, a2, end, lock, &mut w);
            assert!(flow.is_continue());
            assert_eq!(w.huge, [a2]);
            let small = a2 + PMD_SIZE;
            assert_eq!(w.ptes, [small, small + 5 * PAGE_SIZE]);
            let levels: Vec<_> = w.tables.iter().map(|t| t.0).collect();
            assert_eq!(
                levels,
                [
                    TableLevel::Pud,
                    TableLevel::Pmd,
                    TableLevel::Deposited,
                    TableLevel::Pte
                ]
            );
            assert_eq!(w.tables[3].1, small, "a PTE table is reported at its range");
        }
        let mut w = Count {
            stop_at: Some(a2 + PMD_SIZE + 5 * PAGE_SIZE),
            ..Count::default()
        };
        let flow = walk_page_range(&m.mem, &mm.pgd, a2, end, WalkLock::Ptl, &mut w);
        assert_eq!(flow, ControlFlow::Break(a2 + PMD_SIZE + 5 * PAGE_SIZE));
        assert_eq!(w.ptes.len(), 1, "nothing is visited after the break");
    }

    #[test]
    fn pte_offset_map_refuses_an_entry_without_a_table() {
        let m = Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap();
        let c = m.bind(0).unwrap();
        let mm = c.new_mm().unwrap();
        let rw = PROT_READ | PROT_WRITE;
        let a = c.mmap(0, 8 << 20, rw, MAP_PRIVATE | MAP_ANONYMOUS).unwrap();
        let a2 = (a + PMD_SIZE - 1) & !(PMD_SIZE - 1);
        m.thp.only_order(crate::phys::HPAGE_PMD_ORDER);
        c.store_u8(a2, 1).unwrap();
        let slot = mm.pmd_lookup(a2).unwrap();
        assert!(slot.get(&m.mem).trans_huge());
        assert!(slot.pte_offset_map(&m.mem).is_none(), "a huge PMD");
        assert!(slot.pte_offset_map_lock(&m.mem).is_none());
        let next = mm.pmd_lookup(a2 + PMD_SIZE).unwrap();
        assert!(next.get(&m.mem).none());
        assert!(next.pte_offset_map(&m.mem).is_none(), "an empty PMD");
        m.thp.only_order(0);
        c.store_u8(a2 + PMD_SIZE, 1).unwrap();
        let pt = next.pte_offset_map(&m.mem).expect("a table now");
        assert!(!pt.pte(0).none());
    }
}
