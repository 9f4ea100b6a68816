//! Reaching page-table entries: the tables of one address space, the PMD
//! and PTE locks, and mapping a PTE table with or without its lock
//! (`pmd_lock`, `pte_offset_map_lock` and `pte_offset_map` of
//! include/linux/mm.h and mm/pgtable-generic.c, `__pud_alloc` /
//! `__pmd_alloc` / `__pte_alloc` of mm/memory.c).
//!
//! # Protocol
//!
//! Only the page-table layer turns a table's frame into entries. Everything
//! above it holds a value that proves its right to the entries it touches:
//!
//! * [`PmdSlot`] (the kernel's `pmd_t *`) names one PMD entry. Reading it
//!   needs no lock ([`PmdSlot::get`], `pmdp_get_lockless`): PMD tables are
//!   freed only by `free_pgtables`, over VMAs already detached from the
//!   tree, and every reader holds mmap_lock or a VMA that covers the entry.
//! * [`PmdLocked`] (from [`PmdSlot::lock`], `pmd_lock`) holds the split PMD
//!   lock of the table the entry lives in. Only it writes a PMD entry that
//!   others can reach, and it alone deposits and withdraws the PTE table of
//!   a huge PMD.
//! * [`PteLocked`] (from [`PmdSlot::pte_offset_map_lock`]) holds the PTE
//!   table's lock and, as the kernel has since v6.5, an epoch pin (RCU read
//!   side) taken before the PMD was read: the table cannot be freed while it
//!   lives, and the PMD was seen to point at it once the lock was held. It
//!   reads and writes that table's entries.
//! * [`PteMapped`] (from [`PmdSlot::pte_offset_map`]) holds only the pin: it
//!   reads entries that may change under it, and it is refused (None) when
//!   the PMD holds no table. A lockless reader must recheck under the lock
//!   before it acts on what it saw.
//! * [`Ptdesc`] owns a table that no entry points to (just allocated,
//!   withdrawn from a deposit, or unhooked): its entries may be written
//!   without a lock until it is installed or handed to the mmu_gather.
//!
//! Lock order: mmap_lock, then the PMD lock, then PTE locks (the child's
//! before the parent's in fork). `page_table_lock` guards populating the
//! PGD and PUD levels and nests inside nothing here.

use crate::sync::epoch::{self, Guard};

use super::entry::{Pmd, Pte, _PAGE_PRESENT, _PAGE_PROTNONE, _PAGE_PSE, _PAGE_RW, _PAGE_TABLE};
use super::pte_ref::PteRef;
use super::{
    entry_clear_bits, entry_get, entry_get_and_clear, entry_set, pgd_index, pmd_index,
    pte_ref_init, pte_ref_of, pud_index, table_alloc, table_free, Tracking, PTRS_PER_TABLE,
};
use crate::phys::{Pfn, PhysMem, PAGE_SHIFT};
use crate::sync::{Ordering, SpinGuard, SpinLock};

#[inline]
pub(super) fn next_table(entry: u64) -> Pfn {
    (entry & super::entry::PTE_PFN_MASK) >> PAGE_SHIFT
}

// ---------------------------------------------------------------------------
// Detached tables

/// A page-table page that no entry points to (`struct ptdesc`), owned by
/// its holder: filled without a lock, then installed under the lock that
/// guards its parent entry, deposited, or handed to the mmu_gather to be
/// freed after the flush. Dropping one without doing any of these leaks
/// its frame.
#[must_use = "a detached table must be installed, deposited or freed"]
#[derive(Debug, PartialEq, Eq)]
pub struct Ptdesc(Pfn);

impl Ptdesc {
    /// `pagetable_alloc` + the constructor: a zeroed table frame.
    pub fn alloc(mem: &PhysMem, nid: usize, cpu: usize) -> Option<Ptdesc> {
        table_alloc(mem, nid, cpu).map(Ptdesc)
    }

    /// `pte_alloc_one`: a zeroed PTE table, with a reference count when
    /// `tracking` asks for one.
    pub fn alloc_pte(mem: &PhysMem, nid: usize, cpu: usize, tracking: Tracking) -> Option<Ptdesc> {
        let pfn = table_alloc(mem, nid, cpu)?;
        if tracking == Tracking::PteRef {
            pte_ref_init(mem, pfn);
        }
        Some(Ptdesc(pfn))
    }

    /// `pagetable_free`: give back a table that no walker can reach any
    /// more (never installed, or unhooked, flushed and past a grace period).
    pub fn free(self, mem: &PhysMem, cpu: usize) {
        table_free(mem, self.0, cpu)
    }

    /// A table just unhooked from its parent entry by this layer.
    pub(super) fn unhooked(pfn: Pfn) -> Ptdesc {
        Ptdesc(pfn)
    }

    /// The split lock of a PTE table taken from its PMD
    /// ([`PmdLocked::take_pte_table`]): a speculative fault that locked
    /// the table before the PMD was cleared commits under it, so once
    /// this is held none is left inside (a later one aborts on the PMD or
    /// on `mm_lock_seq`).
    pub(crate) fn lock<'a>(&self, mem: &'a PhysMem) -> PtlGuard<'a> {
        ptl_lock(mem, self.0)
    }

    /// Entry `idx` of a table nobody else can see.
    #[inline]
    pub fn pte(&self, mem: &PhysMem, idx: usize) -> Pte {
        Pte(entry_get(mem, self.0, idx))
    }

    /// Set entry `idx` of a table nobody else can see.
    #[inline]
    pub fn set_pte(&mut self, mem: &PhysMem, idx: usize, pte: Pte) {
        let Some(pte_ref) = pte_ref_of(mem, self.0) else {
            return entry_set(mem, self.0, idx, pte.0);
        };
        let old = Pte(entry_get(mem, self.0, idx));
        entry_set(mem, self.0, idx, pte.0);
        // Nobody can see the table, so its count stays per-CPU and the
        // put cannot be the last.
        let released = track_pte(Some(pte_ref), old, pte);
        debug_assert!(!released);
    }

    /// The frame, as an identity (for the invariant checker's accounting of
    /// table frames, never to reach entries through).
    #[inline]
    pub fn frame(&self) -> Pfn {
        self.0
    }
}

// ---------------------------------------------------------------------------
// The root

/// The PGD of one address space (`mm->pgd`). The PGD and PUD levels are
/// populated under the address space's `page_table_lock`, which the caller
/// passes.
#[derive(Debug)]
pub struct Pgd(Pfn);

impl Pgd {
    /// `mm_alloc_pgd`.
    pub fn alloc(mem: &PhysMem, nid: usize, cpu: usize) -> Option<Pgd> {
        table_alloc(mem, nid, cpu).map(Pgd)
    }

    /// `mm_free_pgd`.
    ///
    /// # Safety
    ///
    /// The PGD is empty (its lower tables are gone), no CPU has it loaded,
    /// and it is never used again.
    pub unsafe fn free(&self, mem: &PhysMem, cpu: usize) {
        table_free(mem, self.0, cpu)
    }

    /// What a CPU loads into CR3 for its hardware walker.
    #[inline]
    pub fn cr3(&self) -> Pfn {
        self.0
    }

    /// Whether a PUD table covers `addr` (`pgd_none` inverted).
    pub fn pud_present(&self, mem: &PhysMem, addr: u64) -> bool {
        entry_get(mem, self.0, pgd_index(addr)) & _PAGE_PRESENT != 0
    }

    /// The PMD entry covering `addr`, without allocating (`mm_find_pmd`).
    pub fn pmd_lookup(&self, mem: &PhysMem, addr: u64) -> Option<PmdSlot> {
        let e = entry_get(mem, self.0, pgd_index(addr));
        if e & _PAGE_PRESENT == 0 {
            return None;
        }
        let e = entry_get(mem, next_table(e), pud_index(addr));
        if e & _PAGE_PRESENT == 0 {
            return None;
        }
        Some(PmdSlot {
            table: next_table(e),
            idx: pmd_index(addr),
        })
    }

    /// Unhook the PMD table covering `addr` if all its 512 entries are none
    /// (`pt_reclaim_pmd`, usermm's own extension of PT reclaim), under the
    /// PUD lock (`page_table_lock`) and the table's own PMD lock. The
    /// caller frees the table after a TLB flush of its range (paging-
    /// structure caches included) and a grace period, for hardware walkers.
    ///
    /// # Safety
    ///
    /// No software walker may hold an entry of the table (a [`PmdSlot`]):
    /// the caller holds mmap_lock for writing, as `free_pgtables` does for
    /// the tables above the PTE level, so no fault or walk is under way.
    pub unsafe fn try_unhook_empty_pmd_table(
        &self,
        mem: &PhysMem,
        page_table_lock: &SpinLock,
        addr: u64,
    ) -> Option<Ptdesc> {
        let _pud = page_table_lock.lock();
        let pgde = entry_get(mem, self.0, pgd_index(addr));
        if pgde & _PAGE_PRESENT == 0 {
            return None;
        }
        let pud_table = next_table(pgde);
        let pude = entry_get(mem, pud_table, pud_index(addr));
        if pude & _PAGE_PRESENT == 0 {
            return None;
        }
        let pmd_table = next_table(pude);
        let _pml = ptl_lock(mem, pmd_table);
        if !pmd_table_is_empty(mem, pmd_table) {
            return None;
        }
        // Tables are deposited only under huge PMDs, which are entries.
        let deposits = mem.page(pmd_table).private.load(Ordering::Relaxed);
        debug_assert_eq!(deposits, 0, "an empty PMD table with deposited tables");
        if deposits != 0 {
            return None;
        }
        entry_set(mem, pud_table, pud_index(addr), 0);
        Some(Ptdesc::unhooked(pmd_table))
    }

    /// `move_normal_pud` under the PUD lock (`page_table_lock`, x86's
    /// `pud_lockptr`): the PMD table under `old_addr`'s PUD entry hangs
    /// from `new_addr`'s instead, with every table below it, and the old
    /// entry is cleared. Refused (false) where the old entry holds no
    /// table, the new one is not empty (or has no PUD table to live in),
    /// or a PTE table below keeps a `pte_ref` count (that design's
    /// tables move their entries one by one, as
    /// [`PmdPairLocked::move_table`] refuses them).
    ///
    /// # Safety
    ///
    /// The caller holds mmap_lock for writing and the PUD entry's 1 GiB
    /// lies in the one VMA being moved, whose faults and walks are
    /// excluded (`vma_start_write`): no software walker holds a PMD slot
    /// of the table while it moves. Hardware walkers may: the caller
    /// flushes the old range after.
    pub unsafe fn move_pud_entry(
        &self,
        mem: &PhysMem,
        page_table_lock: &SpinLock,
        old_addr: u64,
        new_addr: u64,
    ) -> bool {
        let _pud = page_table_lock.lock();
        let (old_pgde, new_pgde) = (
            entry_get(mem, self.0, pgd_index(old_addr)),
            entry_get(mem, self.0, pgd_index(new_addr)),
        );
        if old_pgde & _PAGE_PRESENT == 0 || new_pgde & _PAGE_PRESENT == 0 {
            return false;
        }
        let (old_pud, new_pud) = (next_table(old_pgde), next_table(new_pgde));
        let (oi, ni) = (pud_index(old_addr), pud_index(new_addr));
        let old = entry_get(mem, old_pud, oi);
        if old & _PAGE_PRESENT == 0 || entry_get(mem, new_pud, ni) != 0 {
            return false;
        }
        let pmd_table = next_table(old);
        let counted = (0..PTRS_PER_TABLE).any(|i| {
            let pmd = Pmd(entry_get(mem, pmd_table, i));
            pmd_is_table(pmd) && pte_ref_of(mem, pmd.table_pfn()).is_some()
        });
        if counted {
            return false;
        }
        let e = entry_get_and_clear(mem, old_pud, oi);
        entry_set(mem, new_pud, ni, e);
        true
    }

    /// Whether the PMD table covering `addr` exists and maps nothing: a
    /// lockless look for [`Self::try_unhook_empty_pmd_table`] to confirm.
    /// The caller holds mmap_lock, which keeps the PMD table from going.
    pub fn pmd_table_is_empty(&self, mem: &PhysMem, addr: u64) -> bool {
        self.pmd_lookup(mem, addr)
            .is_some_and(|slot| pmd_table_is_empty(mem, slot.table))
    }

    /// `pud_alloc`: populate the PUD level for `addr`. Returns how many
    /// tables it installed (0 or 1).
    pub fn pud_alloc(
        &self,
        mem: &PhysMem,
        page_table_lock: &SpinLock,
        addr: u64,
        cpu: usize,
    ) -> Option<u32> {
        let mut installed = 0;
        populate(
            mem,
            self.0,
            pgd_index(addr),
            page_table_lock,
            cpu,
            &mut installed,
        )?;
        Some(installed)
    }

    /// `pmd_alloc` (with `pud_alloc`): the PMD entry covering `addr`,
    /// populating the PUD and PMD levels as needed. Returns the slot and how
    /// many tables it installed (for `pgtables_bytes`).
    pub fn pmd_alloc(
        &self,
        mem: &PhysMem,
        page_table_lock: &SpinLock,
        addr: u64,
        cpu: usize,
    ) -> Option<(PmdSlot, u32)> {
        let mut installed = 0;
        let pud = populate(
            mem,
            self.0,
            pgd_index(addr),
            page_table_lock,
            cpu,
            &mut installed,
        )?;
        let pmd = populate(
            mem,
            pud,
            pud_index(addr),
            page_table_lock,
            cpu,
            &mut installed,
        )?;
        let slot = PmdSlot {
            table: pmd,
            idx: pmd_index(addr),
        };
        Some((slot, installed))
    }
}

/// `__pud_alloc` / `__pmd_alloc`: the table entry `(parent, idx)` points
/// to, installing a new one under `lock` unless a racer did first (then
/// ours is freed).
fn populate(
    mem: &PhysMem,
    parent: Pfn,
    idx: usize,
    lock: &SpinLock,
    cpu: usize,
    installed: &mut u32,
) -> Option<Pfn> {
    let e = entry_get(mem, parent, idx);
    if e & _PAGE_PRESENT != 0 {
        return Some(next_table(e));
    }
    let new = Ptdesc::alloc(mem, mem.cpu_to_node(cpu), cpu)?;
    let g = lock.lock();
    let cur = entry_get(mem, parent, idx);
    if cur != 0 {
        drop(g);
        new.free(mem, cpu);
        return Some(next_table(cur));
    }
    *installed += 1;
    // Release (in entry_set): the zeroed table is visible to any walker
    // that sees the pointer.
    entry_set(mem, parent, idx, (new.0 << PAGE_SHIFT) | _PAGE_TABLE);
    Some(new.0)
}

/// Whether all 512 entries of the PMD table `table` are none.
fn pmd_table_is_empty(mem: &PhysMem, table: Pfn) -> bool {
    (0..PTRS_PER_TABLE).all(|i| entry_get(mem, table, i) == 0)
}

// ---------------------------------------------------------------------------
// Split page-table locks

/// A table frame's split lock held. Taking it and dropping it each write
/// the lock's cache line, which every CPU that takes it shares: both are
/// noted for the shared-line measure ([`crate::cacheline`]), in the set the
/// frame's descriptor keeps in `index` (unused by table frames).
pub(crate) struct PtlGuard<'a> {
    _held: SpinGuard<'a>,
    writers: &'a crate::sync::AtomicU64,
}

impl Drop for PtlGuard<'_> {
    fn drop(&mut self) {
        crate::cacheline::note_write(self.writers);
    }
}

/// `ptlock_ptr` + `spin_lock`.
fn ptl_lock(mem: &PhysMem, table: Pfn) -> PtlGuard<'_> {
    let page = mem.page(table);
    let held = page.ptl.lock();
    crate::cacheline::note_write(&page.index);
    PtlGuard {
        _held: held,
        writers: &page.index,
    }
}

/// `spin_trylock` of a table's split lock.
fn ptl_try_lock(mem: &PhysMem, table: Pfn) -> Option<PtlGuard<'_>> {
    let page = mem.page(table);
    let held = page.ptl.try_lock()?;
    crate::cacheline::note_write(&page.index);
    Some(PtlGuard {
        _held: held,
        writers: &page.index,
    })
}

// ---------------------------------------------------------------------------
// PMD entries

/// Why [`PmdSlot::pte_map_trylock`] did not lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrylockFail {
    /// The PMD no longer holds the table the walk read.
    PmdChanged,
    /// The PTE lock is held by someone else.
    Contended,
}

/// Where a PMD entry lives (`pmd_t *`): its table and its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PmdSlot {
    table: Pfn,
    idx: usize,
}

impl PmdSlot {
    /// Entry `idx` of the PMD table `table` (for this layer's walkers).
    #[inline]
    pub(super) fn at(table: Pfn, idx: usize) -> PmdSlot {
        PmdSlot { table, idx }
    }

    /// `pmdp_get_lockless`: the entry now, with no lock (it may change at
    /// once; a writer rechecks under the PMD lock).
    #[inline]
    pub fn get(self, mem: &PhysMem) -> Pmd {
        Pmd(entry_get(mem, self.table, self.idx))
    }

    /// `pmd_lock`: the split PMD lock of the table holding this entry.
    #[inline]
    pub fn lock(self, mem: &PhysMem) -> PmdLocked<'_> {
        let ptl = ptl_lock(mem, self.table);
        PmdLocked {
            mem,
            slot: self,
            _ptl: ptl,
        }
    }

    /// `pte_offset_map`: map the PTE table this entry points to for a
    /// lockless reader, or None if it holds none (empty, huge, or being
    /// split) or a dead one. The pin keeps the table from being freed; its
    /// entries may change under the reader. A tracked table is held by a
    /// reference too (`pte_tryget_map`).
    pub fn pte_offset_map(self, mem: &PhysMem) -> Option<PteMapped<'_>> {
        let guard = epoch::pin();
        let (_, table, pte_ref) = self.map_pte_table(mem)?;
        Some(PteMapped {
            mem,
            table,
            pte_ref,
            _pin: guard,
        })
    }

    /// `pte_offset_map_lock`: lock the PTE table this entry points to, or
    /// None if it holds none. The PMD is read under an epoch pin, the
    /// table's lock taken, and the PMD read again: if it changed meanwhile
    /// (the table was replaced or freed) the lock is dropped and the walk
    /// retried, as `__pte_offset_map_lock` does.
    ///
    /// A tracked table is held by a reference as well (`pte_tryget_map_lock`),
    /// taken before the lock; a dead one is refused like an empty entry.
    pub fn pte_offset_map_lock(self, mem: &PhysMem) -> Option<PteLocked<'_>> {
        let guard = epoch::pin();
        loop {
            let (pmd, table, pte_ref) = self.map_pte_table(mem)?;
            let ptl = ptl_lock(mem, table);
            if self.get(mem) == pmd {
                return Some(PteLocked {
                    mem,
                    table,
                    pte_ref,
                    ptl: Some(ptl),
                    _pin: guard,
                });
            }
            drop(ptl);
            if let Some(r) = pte_ref {
                // The table was unhooked meanwhile: whoever did it frees
                // it, dead or not.
                let _unhooked_anyway = r.put();
            }
        }
    }

    /// The locking half of the seed's `pte_map_lock`: lock the PTE table
    /// this entry points to if the entry still equals `expected` (what a
    /// lockless walk read), without waiting for the lock, and check the
    /// entry again under it. The caller checks its sequence count around
    /// this (see `VmFault::pte_map_lock`).
    pub fn pte_map_trylock(
        self,
        mem: &PhysMem,
        expected: Pmd,
    ) -> Result<PteLocked<'_>, TrylockFail> {
        let guard = epoch::pin();
        let (pmd, table, pte_ref) = self.map_pte_table(mem).ok_or(TrylockFail::PmdChanged)?;
        let put = |r: Option<&PteRef>| {
            if let Some(r) = r {
                // If the table was unhooked, whoever did frees it; if it is
                // still hooked (the lock was contended) and this was its
                // last reference, it is dead and the next walker of its
                // range frees it (here, the fault redone under mmap_lock).
                let _freed_by_another = r.put();
            }
        };
        if pmd != expected {
            put(pte_ref);
            return Err(TrylockFail::PmdChanged);
        }
        let Some(ptl) = ptl_try_lock(mem, table) else {
            put(pte_ref);
            return Err(TrylockFail::Contended);
        };
        if self.get(mem) != expected {
            drop(ptl);
            put(pte_ref);
            return Err(TrylockFail::PmdChanged);
        }
        Ok(PteLocked {
            mem,
            table,
            pte_ref,
            ptl: Some(ptl),
            _pin: guard,
        })
    }

    /// `__pte_offset_map`: the PMD value read, the PTE table it points to
    /// and, for a tracked table, its count with a reference taken
    /// (`pte_tryget`); None if the entry holds no table (empty, huge, a
    /// migration entry) or a dead one. The caller holds an epoch pin from
    /// before this call for as long as it uses the table.
    fn map_pte_table(self, mem: &PhysMem) -> Option<(Pmd, Pfn, Option<&PteRef>)> {
        let pmd = self.get(mem);
        if !pmd_is_table(pmd) {
            return None;
        }
        let table = pmd.table_pfn();
        let pte_ref = pte_ref_of(mem, table);
        if pte_ref.is_some_and(|r| !r.tryget()) {
            return None;
        }
        Some((pmd, table, pte_ref))
    }

    /// Whether this entry points to a dead tracked table: one whose count
    /// reached zero, which walkers are refused and which is waiting for
    /// someone to unhook and free it.
    pub fn pte_table_is_dead(self, mem: &PhysMem) -> bool {
        self.dead_pte_table(mem).is_some()
    }

    /// The dead tracked table this entry points to, if it does (see
    /// [`Self::pte_table_is_dead`]): its frame, as an identity only.
    pub fn dead_pte_table(self, mem: &PhysMem) -> Option<Pfn> {
        let _pin = epoch::pin();
        let pmd = self.get(mem);
        if !pmd_is_table(pmd) {
            return None;
        }
        let table = pmd.table_pfn();
        pte_ref_of(mem, table)
            .is_some_and(|r| r.is_dead())
            .then_some(table)
    }

    /// The count of the tracked table this entry points to, held by a
    /// reference (`pte_tryget`), for `try_to_free_user_pte`; None if the
    /// entry holds no table, an untracked one or a dead one.
    ///
    /// The reference keeps the table hooked but not its memory: the caller
    /// holds mmap_lock and stays inside a VMA, so that `free_pgtables`
    /// cannot free the table while the reference lives.
    pub(crate) fn pte_tryget(self, mem: &PhysMem) -> Option<PteRefHeld<'_>> {
        let _pin = epoch::pin();
        let pmd = self.get(mem);
        if !pmd_is_table(pmd) {
            return None;
        }
        let r = pte_ref_of(mem, pmd.table_pfn())?;
        // Not `then_some`: a held value made on failure would put a
        // reference it never got when dropped.
        if r.tryget() {
            Some(PteRefHeld { pte_ref: r })
        } else {
            None
        }
    }

    /// `__pte_alloc`: give this entry a PTE table unless it has one (or a
    /// huge leaf, which the caller must handle). Returns whether it
    /// installed one (for `pgtables_bytes`).
    pub fn pte_alloc(self, mem: &PhysMem, cpu: usize, tracking: Tracking) -> Option<bool> {
        if !self.get(mem).none() {
            return Some(false);
        }
        let new = Ptdesc::alloc_pte(mem, mem.cpu_to_node(cpu), cpu, tracking)?;
        let mut pmd = self.lock(mem);
        if pmd.get().none() {
            pmd.populate(new);
            return Some(true);
        }
        drop(pmd);
        new.free(mem, cpu);
        Some(false)
    }
}

/// Does this PMD point to a PTE table (not none, not a huge leaf, not a
/// non-present entry)?
#[inline]
pub fn pmd_is_table(pmd: Pmd) -> bool {
    !pmd.none() && pmd.0 & _PAGE_PSE == 0 && pmd.0 & _PAGE_PRESENT != 0
}

/// A PMD entry with its table's split lock held (`pmd_lock`).
#[must_use = "the PMD lock is released as soon as the guard is dropped"]
pub struct PmdLocked<'a> {
    mem: &'a PhysMem,
    slot: PmdSlot,
    _ptl: PtlGuard<'a>,
}

impl PmdLocked<'_> {
    /// `pmdp_get`.
    #[inline]
    pub fn get(&self) -> Pmd {
        self.slot.get(self.mem)
    }

    /// `set_pmd_at`.
    #[inline]
    pub fn set(&mut self, pmd: Pmd) {
        entry_set(self.mem, self.slot.table, self.slot.idx, pmd.0)
    }

    /// `pmdp_huge_get_and_clear`: one atomic exchange, so an accessed or
    /// dirty bit the MMU set meanwhile is in the value returned.
    #[inline]
    pub fn get_and_clear(&mut self) -> Pmd {
        Pmd(entry_get_and_clear(
            self.mem,
            self.slot.table,
            self.slot.idx,
        ))
    }

    /// x86's `pmdp_set_access_flags`: as
    /// [`PteLocked::set_access_flags`], for a huge PMD.
    #[inline]
    pub fn set_access_flags(&mut self, entry: Pmd, dirty: bool) -> bool {
        let changed = self.get() != entry;
        if changed && dirty {
            self.set(entry);
        }
        changed
    }

    /// `pmdp_test_and_clear_young`: one atomic, keeping a racing walker's
    /// dirty bit; returns whether the entry was young.
    #[inline]
    pub fn test_and_clear_young(&mut self) -> bool {
        let old = entry_clear_bits(
            self.mem,
            self.slot.table,
            self.slot.idx,
            super::entry::_PAGE_ACCESSED,
        );
        Pmd(old).young()
    }

    /// `pmdp_set_wrprotect`: one atomic, keeping a racing walker's A/D
    /// update.
    #[inline]
    pub fn set_wrprotect(&mut self) {
        entry_clear_bits(self.mem, self.slot.table, self.slot.idx, _PAGE_RW);
    }

    /// `pmdp_invalidate` without its flush, which is x86's
    /// `pmdp_invalidate_ad`: make a huge PMD invalid ([`Pmd::mkinvalid`]) in
    /// one atomic step, so that an accessed or dirty bit the MMU sets
    /// meanwhile is in the value returned, and none can be set after.
    #[inline]
    pub fn invalidate(&mut self) -> Pmd {
        let bits = _PAGE_PRESENT | _PAGE_PROTNONE;
        Pmd(entry_clear_bits(
            self.mem,
            self.slot.table,
            self.slot.idx,
            bits,
        ))
    }

    /// `pmd_populate`: point the entry at a PTE table. Release (in the
    /// store): a walker that sees the pointer sees the table's entries.
    #[inline]
    pub fn populate(&mut self, table: Ptdesc) {
        self.set(Pmd::table(table.0));
    }

    /// The body of `try_to_free_pte`, PT reclaim's slow path: with the PMD
    /// lock held, lock the PTE table the entry points to (nested: the lock
    /// order allows it), and if all its entries are none, clear the entry and
    /// take the table. None if the entry holds no table or the table maps
    /// something (a fault refilled it after the zap dropped its lock).
    pub fn try_unhook_empty_pte_table(&mut self) -> Option<Ptdesc> {
        let pmd = self.get();
        if !pmd_is_table(pmd) {
            return None;
        }
        let table = pmd.table_pfn();
        let _ptl = ptl_lock(self.mem, table);
        // A tracked table is freed by its count alone (see `try_unhook_from`).
        if pte_ref_of(self.mem, table).is_some()
            || (0..PTRS_PER_TABLE).any(|i| !Pte(entry_get(self.mem, table, i)).none())
        {
            return None;
        }
        entry_set(self.mem, self.slot.table, self.slot.idx, 0);
        Some(Ptdesc::unhooked(table))
    }

    /// The PMD half of the seed's `free_user_pte`: with the PMD lock held,
    /// if the entry still points to a dead tracked table, clear it and take
    /// the table (empty: its count, which its entries hold, is zero).
    pub fn unhook_dead_pte_table(&mut self) -> Option<Ptdesc> {
        let pmd = self.get();
        if !pmd_is_table(pmd) {
            return None;
        }
        let table = pmd.table_pfn();
        let _pin = epoch::pin();
        if !pte_ref_of(self.mem, table).is_some_and(|r| r.is_dead()) {
            return None;
        }
        debug_assert!(
            (0..PTRS_PER_TABLE).all(|i| Pte(entry_get(self.mem, table, i)).none()),
            "a dead table {table:#x} maps something"
        );
        entry_set(self.mem, self.slot.table, self.slot.idx, 0);
        Some(Ptdesc::unhooked(table))
    }

    /// The clear of `pmdp_collapse_flush` (the caller flushes): take the
    /// PTE table the entry points to, leaving the entry none, for a
    /// collapse to work on out of every walker's sight and then deposit
    /// (or put back with [`Self::populate`]). None if the entry holds no
    /// table, or a table with a `pte_ref` count (freed by its count
    /// alone, it cannot be deposited).
    pub fn take_pte_table(&mut self) -> Option<Ptdesc> {
        let pmd = self.get();
        if !pmd_is_table(pmd) || pte_ref_of(self.mem, pmd.table_pfn()).is_some() {
            return None;
        }
        entry_set(self.mem, self.slot.table, self.slot.idx, 0);
        Some(Ptdesc::unhooked(pmd.table_pfn()))
    }

    /// `pgtable_trans_huge_deposit`: keep a PTE table under a huge PMD, so
    /// that splitting it never needs to allocate. The list hangs off the
    /// PMD table's descriptor (`pmd_huge_pte`), linked through the deposited
    /// tables' `private`.
    pub fn deposit(&mut self, table: Ptdesc) {
        deposit_table(self.mem, self.slot.table, table)
    }

    /// `pgtable_trans_huge_withdraw`.
    pub fn withdraw(&mut self) -> Ptdesc {
        withdraw_table(self.mem, self.slot.table)
    }
}

/// [`PmdLocked::deposit`] on the PMD table `pmd_table`, its lock held.
fn deposit_table(mem: &PhysMem, pmd_table: Pfn, table: Ptdesc) {
    let head = &mem.page(pmd_table).private;
    mem.page(table.0)
        .private
        .store(head.load(Ordering::Relaxed), Ordering::Relaxed);
    head.store(table.0 + 1, Ordering::Relaxed);
}

/// [`PmdLocked::withdraw`] from the PMD table `pmd_table`, its lock held.
fn withdraw_table(mem: &PhysMem, pmd_table: Pfn) -> Ptdesc {
    let head = &mem.page(pmd_table).private;
    let t = head.load(Ordering::Relaxed);
    assert!(t != 0, "huge PMD without a deposited table");
    let table = t - 1;
    let next = mem.page(table).private.load(Ordering::Relaxed);
    head.store(next, Ordering::Relaxed);
    mem.page(table).private.store(0, Ordering::Relaxed);
    Ptdesc(table)
}

/// Two PMD entries with their tables' split locks held, one lock where
/// they share a table: what mremap moves a huge PMD or a whole PTE table
/// between (`move_huge_pmd`, `move_normal_pmd`). Taken with mmap_lock
/// held for writing: no other path holds two PMD locks, so the order of
/// the two cannot deadlock.
#[must_use = "the PMD locks are released as soon as the guard is dropped"]
pub struct PmdPairLocked<'a> {
    mem: &'a PhysMem,
    old: PmdSlot,
    new: PmdSlot,
    _old_ptl: PtlGuard<'a>,
    _new_ptl: Option<PtlGuard<'a>>,
}

impl PmdSlot {
    /// Lock this entry's table and `new`'s (`pmd_lock`, then
    /// `spin_lock_nested` of the other where it differs).
    pub fn lock_pair(self, new: PmdSlot, mem: &PhysMem) -> PmdPairLocked<'_> {
        let old_ptl = ptl_lock(mem, self.table);
        let new_ptl = (new.table != self.table).then(|| ptl_lock(mem, new.table));
        PmdPairLocked {
            mem,
            old: self,
            new,
            _old_ptl: old_ptl,
            _new_ptl: new_ptl,
        }
    }
}

impl PmdPairLocked<'_> {
    /// The entry moved from.
    pub fn old_entry(&self) -> Pmd {
        self.old.get(self.mem)
    }

    /// The entry moved to.
    pub fn new_entry(&self) -> Pmd {
        self.new.get(self.mem)
    }

    /// `pmdp_huge_get_and_clear` (or `pmd_clear` of a table) of the entry
    /// moved from: one atomic exchange, keeping the MMU's A/D bits.
    pub fn take_old(&mut self) -> Pmd {
        Pmd(entry_get_and_clear(self.mem, self.old.table, self.old.idx))
    }

    /// `set_pmd_at` (or `pmd_populate`) of the entry moved to.
    pub fn set_new(&mut self, pmd: Pmd) {
        entry_set(self.mem, self.new.table, self.new.idx, pmd.0)
    }

    /// `move_normal_pmd` under the locks: the old entry's PTE table hangs
    /// from the new entry instead, the old one cleared. Refused (false)
    /// where the old entry holds no table (made huge by a collapse, or
    /// emptied, meanwhile), the new one is not empty, or the table keeps a
    /// `pte_ref` count (that design frees a table by its count alone; its
    /// entries are moved one by one instead).
    pub fn move_table(&mut self) -> bool {
        let old = self.old_entry();
        if !pmd_is_table(old) || !self.new_entry().none() {
            return false;
        }
        if pte_ref_of(self.mem, old.table_pfn()).is_some() {
            return false;
        }
        let pmd = self.take_old();
        self.set_new(pmd);
        true
    }

    /// The PTE table deposited under the old huge PMD goes with it where
    /// the two entries are in different PMD tables (x86's
    /// `pmd_move_must_withdraw`: the deposit lists are per table).
    pub fn move_deposit(&mut self) {
        if self.old.table != self.new.table {
            let t = withdraw_table(self.mem, self.old.table);
            deposit_table(self.mem, self.new.table, t);
        }
    }
}

// ---------------------------------------------------------------------------
// PTE tables

/// Reading the entries of a mapped PTE table, locked or not.
pub trait PteRead {
    /// `ptep_get`: entry `idx` of the table.
    fn pte(&self, idx: usize) -> Pte;
}

/// `track_pte_set` / `track_pte_clear`: an entry of a tracked table went
/// from none to something (a reference) or back (a put). Returns whether
/// the put was the last.
#[inline]
fn track_pte(pte_ref: Option<&PteRef>, old: Pte, new: Pte) -> bool {
    match pte_ref {
        Some(r) if old.none() && !new.none() => {
            r.get();
            false
        }
        Some(r) if !old.none() && new.none() => r.put(),
        _ => false,
    }
}

/// A reference on a tracked PTE table (`pte_tryget`), put when dropped.
pub struct PteRefHeld<'a> {
    pte_ref: &'a PteRef,
}

impl PteRefHeld<'_> {
    /// `percpu_ref_switch_to_atomic_sync`: make the count exact. The caller
    /// holds no epoch pin (this waits for a grace period).
    pub fn switch_to_atomic_sync(&self) {
        self.pte_ref.switch_to_atomic_sync();
    }

    /// `percpu_ref_switch_to_percpu`.
    pub fn switch_to_percpu(&self) {
        self.pte_ref.switch_to_percpu();
    }

    /// Put the reference. Returns true if it was the last: the table is
    /// dead, to be unhooked and freed by the caller.
    #[must_use = "a released table must be freed"]
    pub fn put(self) -> bool {
        let r = self.pte_ref;
        std::mem::forget(self);
        // Pinned: a per-CPU put must finish inside the grace period of a
        // concurrent switch to atomic mode, or the fold would miss it.
        let _pin = epoch::pin();
        r.put()
    }
}

impl Drop for PteRefHeld<'_> {
    fn drop(&mut self) {
        let _pin = epoch::pin();
        // A dead table is freed by the next walker that meets it.
        let _dead = self.pte_ref.put();
    }
}

/// A PTE table mapped with its lock held (`pte_offset_map_lock`).
#[must_use = "the PTE lock is released as soon as the guard is dropped"]
pub struct PteLocked<'a> {
    mem: &'a PhysMem,
    table: Pfn,
    /// The table's count, if it is tracked: held by this guard.
    pte_ref: Option<&'a PteRef>,
    /// Taken only in `drop`, to unlock before the put.
    ptl: Option<PtlGuard<'a>>,
    _pin: Guard,
}

impl Drop for PteLocked<'_> {
    /// `pte_unmap_unlock`, then `pte_put`; the pin goes last. A put that
    /// kills the table leaves it for the next walker that meets it
    /// (`try_to_free_user_pte` after a madvise, a fault, munmap).
    fn drop(&mut self) {
        drop(self.ptl.take());
        if let Some(r) = self.pte_ref {
            let _dead = r.put();
        }
    }
}

impl PteRead for PteLocked<'_> {
    #[inline]
    fn pte(&self, idx: usize) -> Pte {
        Pte(entry_get(self.mem, self.table, idx))
    }
}

impl PteLocked<'_> {
    /// The table's frame, for this layer's walker to report.
    pub(super) fn frame(&self) -> Pfn {
        self.table
    }

    /// `set_pte_at`, with `track_pte_set` / `track_pte_clear` on a
    /// tracked table. Under the lock the entry can change only in its
    /// accessed and dirty bits, never to or from none, so reading it first
    /// is exact for the count; a caller that stores a changed copy of a
    /// present entry goes through [`Self::modify_prot_start`] or
    /// [`Self::set_access_flags`] instead, which lose neither bit.
    #[inline]
    pub fn set(&mut self, idx: usize, pte: Pte) {
        // An untracked table (every design but `pte_ref`) pays nothing.
        if self.pte_ref.is_none() {
            return entry_set(self.mem, self.table, idx, pte.0);
        }
        let old = self.pte(idx);
        entry_set(self.mem, self.table, idx, pte.0);
        self.track(old, pte);
    }

    /// Whether the table keeps a `pte_ref` count (it was made while that
    /// design was selected).
    #[inline]
    pub fn is_tracked(&self) -> bool {
        self.pte_ref.is_some()
    }

    /// Count a change of entry, on a tracked table. This guard holds a
    /// reference, so a clear is never the last put.
    #[inline]
    fn track(&self, old: Pte, new: Pte) {
        let released = track_pte(self.pte_ref, old, new);
        debug_assert!(!released, "an entry held the last reference");
    }

    /// `set_ptes`: `nr` entries from `pte`, the PFN advancing by one each.
    #[inline]
    pub fn set_ptes(&mut self, idx: usize, pte: Pte, nr: usize) {
        for i in 0..nr {
            self.set(idx + i, pte.advance_pfn(i as u64));
        }
    }

    /// `ptep_get_and_clear`: one atomic exchange, so an accessed or dirty
    /// bit set by a racing walker is not lost.
    #[inline]
    pub fn get_and_clear(&mut self, idx: usize) -> Pte {
        let old = Pte(entry_get_and_clear(self.mem, self.table, idx));
        self.track(old, Pte(0));
        old
    }

    /// `ptep_modify_prot_start`: take a present entry out for a change of
    /// protection, in one atomic exchange that leaves it none. Once it is
    /// none the MMU can set neither its accessed nor its dirty bit, so the
    /// value returned is final: a read followed by a store would lose a bit
    /// that a CPU's walker set in between. A CPU that touches the page
    /// meanwhile faults and waits for this lock.
    #[inline]
    pub fn modify_prot_start(&mut self, idx: usize) -> Pte {
        self.get_and_clear(idx)
    }

    /// `ptep_modify_prot_commit`: put back the entry taken out by
    /// [`Self::modify_prot_start`], changed.
    #[inline]
    pub fn modify_prot_commit(&mut self, idx: usize, pte: Pte) {
        self.set(idx, pte)
    }

    /// x86's `ptep_set_access_flags` for a fault on a present entry:
    /// `entry` is the entry the fault found, made young (and dirty, for a
    /// write). It is stored only for a write: a read fault leaves the
    /// accessed bit to the MMU's walk on the retry, and a store would lose
    /// a dirty bit that another CPU's walker set since the entry was read.
    /// A write's entry carries both bits the MMU sets, so storing it loses
    /// neither. Returns whether the entry differed from `entry`.
    #[inline]
    pub fn set_access_flags(&mut self, idx: usize, entry: Pte, dirty: bool) -> bool {
        let changed = self.pte(idx) != entry;
        if changed && dirty {
            self.set(idx, entry);
        }
        changed
    }

    /// `clear_full_ptes`: clear `nr` consecutive entries, one atomic
    /// exchange each (x86 has no contiguous-PTE hint to do better).
    #[inline]
    pub fn clear_full_ptes(&mut self, idx: usize, nr: usize) {
        for i in idx..idx + nr {
            self.get_and_clear(i);
        }
    }

    /// Clear `bits` of entry `idx` in one atomic operation, returning the
    /// old value: a walker's concurrent accessed/dirty update is kept.
    #[inline]
    pub fn clear_bits(&mut self, idx: usize, bits: u64) -> Pte {
        Pte(entry_clear_bits(self.mem, self.table, idx, bits))
    }

    /// `wrprotect_ptes`: clear the writable bit of `nr` entries.
    #[inline]
    pub fn wrprotect_ptes(&mut self, idx: usize, nr: usize) {
        for i in idx..idx + nr {
            self.clear_bits(i, _PAGE_RW);
        }
    }

    /// `clear_young_dirty_ptes`.
    #[inline]
    pub fn clear_young_dirty_ptes(&mut self, idx: usize, nr: usize) {
        use super::entry::{_PAGE_ACCESSED, _PAGE_DIRTY};
        for i in idx..idx + nr {
            self.clear_bits(i, _PAGE_ACCESSED | _PAGE_DIRTY);
        }
    }

    /// Whether this is the table `other` maps (two guards on one table
    /// would be a self-deadlock; this is for assertions).
    pub fn same_table(&self, other: &PteLocked<'_>) -> bool {
        self.table == other.table
    }

    /// `try_get_and_clear_pmd`, PT reclaim's fast path: with this table's
    /// lock held, try the PMD lock of `slot` (the entry that points here)
    /// and, if it is free, clear the entry and take the table. The caller
    /// must know, without looking, that the table is empty: it zapped every
    /// entry under this lock, never dropped since.
    ///
    /// Only a trylock: the lock order is PMD lock before PTE lock, and this
    /// holds the PTE lock already. The PMD cannot point elsewhere while this
    /// lock is held: whoever replaces a PMD that points to a table holds
    /// that table's lock (PT reclaim) or mmap_lock for writing
    /// (`free_pgtables`), which a zap's caller excludes.
    ///
    /// A table tracked by `pte_ref` (made while that design was selected) is
    /// never taken here: its count may be held by a walker outside any epoch
    /// pin (`try_to_free_user_pte` waits for grace periods while it holds
    /// one), so only its count may free it.
    pub fn try_unhook_from(&self, slot: PmdSlot) -> Option<Ptdesc> {
        if self.pte_ref.is_some() {
            return None;
        }
        let _pml = ptl_try_lock(self.mem, slot.table)?;
        let pmd = slot.get(self.mem);
        debug_assert!(
            pmd_is_table(pmd) && pmd.table_pfn() == self.table,
            "the PMD {pmd:?} moved under the PTE lock of table {:#x}",
            self.table
        );
        entry_set(self.mem, slot.table, slot.idx, 0);
        Some(Ptdesc::unhooked(self.table))
    }
}

/// A PTE table mapped for a lockless reader (`pte_offset_map`).
pub struct PteMapped<'a> {
    mem: &'a PhysMem,
    table: Pfn,
    /// The table's count, if it is tracked: held by this guard.
    pte_ref: Option<&'a PteRef>,
    _pin: Guard,
}

impl Drop for PteMapped<'_> {
    /// `pte_unmap` (and `pte_put`), before the pin goes.
    fn drop(&mut self) {
        if let Some(r) = self.pte_ref {
            let _dead = r.put();
        }
    }
}

impl PteRead for PteMapped<'_> {
    #[inline]
    fn pte(&self, idx: usize) -> Pte {
        Pte(entry_get(self.mem, self.table, idx))
    }
}

impl PteMapped<'_> {
    /// The table's frame, for this layer's walker to report.
    pub(super) fn frame(&self) -> Pfn {
        self.table
    }

    /// Whether every entry of `range` is none (a lockless look, to be
    /// rechecked under the lock).
    pub fn range_none(&self, range: std::ops::Range<usize>) -> bool {
        debug_assert!(range.end <= PTRS_PER_TABLE);
        range.into_iter().all(|i| self.pte(i).none())
    }
}
