//! khugepaged (mm/khugepaged.c): collapsing a PMD's worth of anonymous
//! small pages into one THP, as MADV_COLLAPSE asks for it
//! (`madvise_collapse`).
//!
//! For each whole PMD of the range, `hpage_collapse_scan_pmd` looks at
//! its 512 PTEs under mmap_lock (for reading) and the table's lock: each
//! must be none, map the zero page, or map an anonymous page that sits on
//! the LRU, unlocked, with no reference beyond its mappings
//! (`folio_expected_ref_count`). MADV_COLLAPSE sets none of khugepaged's
//! own limits (`max_ptes_none`, `max_ptes_shared`, the young bits): an
//! empty or shared page does not stop it. Then `collapse_huge_page`
//! allocates the THP with mmap_lock dropped (`GFP_TRANSHUGE`, on the node
//! that held most of the pages), and, with it taken for writing, copies
//! the pages into it and maps it by the PMD in place of the PTE table,
//! which is deposited under the new PMD.
//!
//! # Locking
//!
//! The collapse holds mmap_lock for writing and write-locks the VMA, so
//! that no fault runs in the range (faults under the VMA's lock wait,
//! speculative ones abort on the sequence count); it takes the VMA's
//! anon_vma for writing, so that no rmap walk is inside the table, then
//! clears the PMD and flushes the range (`pmdp_collapse_flush`): from
//! there on no CPU, nor its hardware walker, reaches the PTE table, whose
//! pages are then isolated (locked, off the LRU) with the table out of
//! sight, under the table's own lock, as the kernel does: a speculative
//! fault (`fault_lock=spf`) that locked the table before the PMD was
//! cleared commits under that lock, so the isolation waits for it and
//! sees its page; one that comes later aborts on the changed PMD or on
//! `mm_lock_seq`. If a page cannot be isolated, the table goes back. The
//! copy is made from pages nobody can write any more; their PTEs are
//! cleared in the detached table, which is then deposited, and the PMD set
//! under the PMD lock.
//!
//! Not modelled: the khugepaged thread and its scan of the mms that asked
//! for THPs (with its `max_ptes_*` limits and the young-page test), swap
//! entries and their swap-in (the model has no swap: a PTE that is not
//! present, a migration entry or a guard marker, fails the PMD with
//! `SCAN_PTE_NON_PRESENT`), userfaultfd, and the collapse of file and
//! shmem pages in the page cache (`collapse_file`): a regular file's
//! mapping is EINVAL as on a kernel without CONFIG_READ_ONLY_THP_FOR_FS
//! (the host's), and shmem's is EINVAL too where the kernel would collapse
//! its page cache. A PTE table with the seed's `pte_ref` count is not
//! collapsed (`SCAN_FAIL`): that design frees a table by its count alone.

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::mm::vma::*;
use crate::mm::{Mm, MmCounter, Vma};
use crate::pgtable::{Pmd, PmdSlot, Ptdesc, Pte, PteRead, PMD_MASK, PMD_SIZE};
use crate::phys::memmap::pg;
use crate::phys::{AllocFlags, Folio, Pfn, PhysMem, HPAGE_PMD_NR, HPAGE_PMD_ORDER};
use crate::rmap::{self, RmapFlags};
use crate::sync::Arc;
use crate::vmstat::{Event, NodeStat};

/// `enum scan_result`: what a scan or a collapse of one PMD found (the
/// ones the model can reach).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanResult {
    Fail,
    Succeed,
    /// No PMD table, or no PTE table under the entry.
    PmdNull,
    /// The PMD entry is none: nothing was ever mapped there.
    PmdNone,
    /// Already a THP (or one under migration).
    PmdMapped,
    PteNonPresent,
    PageNull,
    PageAnon,
    PageLock,
    PageLru,
    PageCount,
    DelPageLru,
    AllocHugePageFail,
    VmaNull,
    VmaCheck,
    AddressRange,
}

impl ScanResult {
    /// `madvise_collapse_errno`.
    fn errno(self) -> Errno {
        match self {
            ScanResult::AllocHugePageFail => Errno::ENOMEM,
            ScanResult::PageCount
            | ScanResult::PageLock
            | ScanResult::PageLru
            | ScanResult::DelPageLru => Errno::EAGAIN,
            _ => Errno::EINVAL,
        }
    }

    /// The results after which MADV_COLLAPSE goes on to the next PMD; any
    /// other ends it.
    fn may_go_on(self) -> bool {
        matches!(
            self,
            ScanResult::PmdNull
                | ScanResult::PteNonPresent
                | ScanResult::PageNull
                | ScanResult::PageCount
                | ScanResult::PageLock
                | ScanResult::PageLru
                | ScanResult::DelPageLru
        )
    }
}

/// `thp_vma_allowable_order(vma, TVA_FORCED_COLLAPSE, PMD_ORDER)`: may
/// MADV_COLLAPSE make a THP in this VMA at all? The sysfs knobs do not
/// matter (a forced collapse counts as MADV_HUGEPAGE); MADV_NOHUGEPAGE
/// does, a VMA never written (no anon_vma yet) has nothing to collapse,
/// and the VMA must hold a whole aligned PMD below its end.
pub fn collapse_allowed(vma: &Vma) -> bool {
    if vma.flags() & VM_NOHUGEPAGE != 0 || !vma.is_anonymous() || vma.anon_vma().is_none() {
        return false;
    }
    vma.end()
        .checked_sub(PMD_SIZE)
        .is_some_and(|a| crate::memory::thp_vma_suitable_order(vma, a, HPAGE_PMD_ORDER))
}

/// `madvise_collapse` over `[start, end)`, which lies in `vma`: collapse
/// every whole PMD of it; Ok if every one is a THP after. The caller holds
/// no lock of `mm` (each step takes what it needs, as the kernel drops and
/// retakes mmap_lock around each collapse).
pub fn madvise_collapse(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    vma: &Vma,
    start: u64,
    end: u64,
) -> KResult<()> {
    if !collapse_allowed(vma) {
        return Err(Errno::EINVAL);
    }
    crate::swap::lru_add_drain_all(oncpu.mem(), oncpu.id());
    let hstart = (start + PMD_SIZE - 1) & PMD_MASK;
    let mut hend = end & PMD_MASK;
    // A range inside one PMD asks for none, and gets EINVAL: the kernel's
    // count of PMDs wraps there.
    if hend < hstart {
        return Err(Errno::EINVAL);
    }
    let wanted = (hend - hstart) / PMD_SIZE;
    let (mut thps, mut last_fail) = (0, ScanResult::Fail);
    let mut addr = hstart;
    while addr < hend {
        let result = {
            let _g = mm.mmap_lock.read();
            match hugepage_vma_revalidate(mm, addr) {
                Err(r) => {
                    last_fail = r;
                    break;
                }
                Ok(vma) => {
                    hend = hend.min(vma.end() & PMD_MASK);
                    hpage_collapse_scan_pmd(oncpu, mm, addr)
                }
            }
        };
        // The scan found the PMD collapsible: the collapse runs with the
        // read lock dropped, as the kernel's.
        let result = match result {
            Ok(nid) => collapse_huge_page(oncpu, mm, addr, nid),
            Err(r) => r,
        };
        match result {
            ScanResult::Succeed | ScanResult::PmdMapped => thps += 1,
            r if r.may_go_on() => last_fail = r,
            r => {
                last_fail = r;
                break;
            }
        }
        addr += PMD_SIZE;
    }
    if thps == wanted {
        Ok(())
    } else {
        Err(last_fail.errno())
    }
}

/// `hugepage_vma_revalidate`: the VMA at `addr` still holds the whole PMD
/// and still allows a collapse (an anonymous VMA that does has an
/// anon_vma, which `expect_anon` asks of it in the kernel). The caller
/// holds mmap_lock.
fn hugepage_vma_revalidate(mm: &Mm, addr: u64) -> Result<Arc<Vma>, ScanResult> {
    let guard = crate::sync::epoch::pin();
    let vma = mm
        .vma_tree(&guard)
        .find_vma(addr)
        .cloned()
        .ok_or(ScanResult::VmaNull)?;
    if !crate::memory::thp_vma_suitable_order(&vma, addr, HPAGE_PMD_ORDER) {
        return Err(ScanResult::AddressRange);
    }
    if !collapse_allowed(&vma) {
        return Err(ScanResult::VmaCheck);
    }
    Ok(vma)
}

/// `find_pmd_or_thp_or_none` + `check_pmd_state`: the PMD entry of `addr`
/// if it points to a PTE table.
fn find_pmd_or_thp_or_none(mm: &Mm, addr: u64) -> Result<PmdSlot, ScanResult> {
    let slot = mm.pmd_lookup(addr).ok_or(ScanResult::PmdNull)?;
    let pmd = mm.pmd_get(slot);
    if pmd.none() {
        return Err(ScanResult::PmdNone);
    }
    if crate::huge_memory::pmd_is_huge(pmd) {
        return Err(ScanResult::PmdMapped);
    }
    if !crate::pgtable::pmd_is_table(pmd) {
        return Err(ScanResult::PmdNull);
    }
    Ok(slot)
}

/// What one PTE holds, for a collapse.
enum PteKind {
    /// None, or the zero page: the THP's page is zeroed.
    NoneOrZero,
    /// A page of an anonymous folio.
    Page(Folio),
}

/// Classify the PTE `pte` of a PMD being scanned or collapsed.
fn pte_kind(oncpu: &OnCpu, pte: Pte) -> Result<PteKind, ScanResult> {
    if pte.none() || (pte.present() && pte.pfn() == oncpu.m.zero_pfn) {
        return Ok(PteKind::NoneOrZero);
    }
    if !pte.present() {
        return Err(ScanResult::PteNonPresent);
    }
    let page = crate::memory::vm_normal_page(pte).ok_or(ScanResult::PageNull)?;
    let folio = oncpu.mem().page_folio(page);
    if !folio.test_anon(oncpu.mem()) {
        return Err(ScanResult::PageAnon);
    }
    Ok(PteKind::Page(folio))
}

/// `folio_expected_ref_count` of an anonymous folio (no swap cache): one
/// reference per mapping.
fn refs_as_expected(mem: &PhysMem, folio: Folio) -> bool {
    folio.mapcount(mem) == folio.ref_count(mem)
}

/// `hpage_collapse_scan_pmd` (MADV_COLLAPSE's: no limit on empty or
/// shared PTEs, no young test): whether the PMD of `addr` can be
/// collapsed, and if so the node for its THP
/// (`hpage_collapse_find_target_node`: the one that held most of its
/// pages, the first of equals). The caller holds mmap_lock for reading.
fn hpage_collapse_scan_pmd(oncpu: &OnCpu, mm: &Mm, addr: u64) -> Result<usize, ScanResult> {
    let mem = oncpu.mem();
    let slot = find_pmd_or_thp_or_none(mm, addr)?;
    let pt = mm.pte_offset_map_lock(slot).ok_or(ScanResult::PmdNull)?;
    let mut node_load = vec![0u32; mem.nodes.len()];
    for idx in 0..HPAGE_PMD_NR as usize {
        let PteKind::Page(folio) = pte_kind(oncpu, pt.pte(idx))? else {
            continue;
        };
        node_load[folio.nid()] += 1;
        let head = folio.head(mem);
        if !head.test(pg::LRU) {
            return Err(ScanResult::PageLru);
        }
        if head.test(pg::LOCKED) {
            return Err(ScanResult::PageLock);
        }
        if !refs_as_expected(mem, folio) {
            return Err(ScanResult::PageCount);
        }
    }
    let max = node_load.iter().copied().max().unwrap_or(0);
    Ok(node_load
        .iter()
        .position(|&l| l == max && max > 0)
        .unwrap_or(oncpu.cpu.node))
}

/// The folios a collapse isolated: each locked, off the LRU (counted in
/// `nr_isolated_anon`), with the isolation's reference.
struct IsolatedFolios(Vec<Folio>);

impl IsolatedFolios {
    /// `release_pte_folio` for each: back onto the LRU, unlocked.
    fn release(self, oncpu: &OnCpu) {
        let mem = oncpu.mem();
        for f in self.0 {
            mem.mod_node_state(NodeStat::NR_ISOLATED_ANON, -(f.nr_pages(mem) as i64));
            f.unlock(mem);
            crate::swap::folio_putback_lru(mem, f, oncpu.id());
        }
    }
}

/// `__collapse_huge_page_isolate` over the detached `table`: lock and
/// isolate every folio it maps (a large one once). On failure, those
/// isolated so far go back.
fn collapse_isolate(oncpu: &OnCpu, table: &Ptdesc) -> Result<IsolatedFolios, ScanResult> {
    let mem = oncpu.mem();
    let mut done = IsolatedFolios(Vec::new());
    for idx in 0..HPAGE_PMD_NR as usize {
        let folio = match pte_kind(oncpu, table.pte(mem, idx)) {
            Ok(PteKind::NoneOrZero) => continue,
            Ok(PteKind::Page(f)) => f,
            Err(r) => {
                done.release(oncpu);
                return Err(r);
            }
        };
        if folio.is_large(mem) && done.0.contains(&folio) {
            continue;
        }
        let fail = if !folio.trylock(mem) {
            Some(ScanResult::PageLock)
        } else if !refs_as_expected(mem, folio) {
            folio.unlock(mem);
            Some(ScanResult::PageCount)
        } else if !crate::swap::folio_isolate_lru(mem, folio) {
            folio.unlock(mem);
            Some(ScanResult::DelPageLru)
        } else {
            None
        };
        if let Some(r) = fail {
            done.release(oncpu);
            return Err(r);
        }
        mem.mod_node_state(NodeStat::NR_ISOLATED_ANON, folio.nr_pages(mem) as i64);
        done.0.push(folio);
    }
    Ok(done)
}

/// `collapse_huge_page`: allocate the THP (mmap_lock not held), then,
/// with mmap_lock held for writing, take the PTE table out of sight,
/// isolate its folios, copy them into the THP and map it by the PMD.
fn collapse_huge_page(oncpu: &OnCpu, mm: &Arc<Mm>, addr: u64, nid: usize) -> ScanResult {
    let mem = oncpu.mem();
    let Some(folio) = alloc_charge_folio(oncpu, nid) else {
        return ScanResult::AllocHugePageFail;
    };
    let result = collapse_locked(oncpu, mm, addr, folio);
    if result != ScanResult::Succeed {
        folio.put(mem, oncpu.id());
    }
    result
}

/// `alloc_charge_folio`: a PMD-sized folio on `nid` (or another node) that
/// may reclaim for itself (`GFP_TRANSHUGE`).
fn alloc_charge_folio(oncpu: &OnCpu, nid: usize) -> Option<Folio> {
    let folio = oncpu
        .mem()
        .folio_alloc(nid, HPAGE_PMD_ORDER, oncpu.id(), AllocFlags::default());
    let event = if folio.is_some() {
        Event::THP_COLLAPSE_ALLOC
    } else {
        Event::THP_COLLAPSE_ALLOC_FAILED
    };
    oncpu.vmstat().count(oncpu.id(), event, 1);
    folio
}

/// The part of [`collapse_huge_page`] under mmap_lock held for writing.
fn collapse_locked(oncpu: &OnCpu, mm: &Arc<Mm>, addr: u64, folio: Folio) -> ScanResult {
    let mem = oncpu.mem();
    let _w = mm.mmap_lock.write();
    let vma = match hugepage_vma_revalidate(mm, addr) {
        Ok(v) => v,
        Err(r) => return r,
    };
    // vma_start_write: faults under the VMA's lock wait for mmap_lock
    // now, and speculative ones abort (held until mmap_lock is released).
    let tree = mm.vma_tree_draft();
    tree.start_write(&vma);
    let slot = match find_pmd_or_thp_or_none(mm, addr) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let anon_lock = vma.anon_vma().map(|av| av.lock_write());
    // pmdp_collapse_flush: the table leaves the PMD, and no CPU keeps a
    // translation through it.
    let Some(table) = mm.pmd_lock(slot).take_pte_table() else {
        return ScanResult::Fail;
    };
    oncpu.flush_tlb_range(mm, addr, addr + PMD_SIZE, crate::phys::PAGE_SHIFT);
    // Isolated under the table's lock, as the kernel's: a speculative
    // fault that took it before the PMD was cleared commits first.
    let ptl = table.lock(mem);
    let isolated = collapse_isolate(oncpu, &table);
    drop(ptl);
    let isolated = match isolated {
        Ok(i) => i,
        Err(r) => {
            mm.pmd_lock(slot).populate(table);
            return r;
        }
    };
    drop(anon_lock);
    let mut table = table;
    collapse_copy(oncpu, mm, &vma, &mut table, folio);
    isolated.release(oncpu);
    // The new PMD, the table deposited under it.
    let mut ptl = mm.pmd_lock(slot);
    debug_assert!(ptl.get().none(), "a PMD filled under a collapse");
    rmap::folio_add_new_anon_rmap(mem, folio, &vma, addr, RmapFlags::EXCLUSIVE);
    crate::swap::folio_add_lru_vma(mem, folio, &vma, oncpu.id());
    ptl.deposit(table);
    let mut pmd = Pmd::huge(folio.pfn(), vma.page_prot()).mkdirty();
    if vma.flags() & VM_WRITE != 0 {
        pmd = pmd.mkwrite();
    }
    ptl.set(pmd);
    ScanResult::Succeed
}

/// `__collapse_huge_page_copy` and its `_succeeded` half: each page of the
/// PMD into the THP (an empty or zero-page PTE gives a zeroed page, and
/// now counts in RssAnon), then each PTE cleared in the detached table,
/// its folio's rmap and reference dropped (a locked VMA munlocks it).
fn collapse_copy(oncpu: &OnCpu, mm: &Mm, vma: &Vma, table: &mut Ptdesc, folio: Folio) {
    let mem = oncpu.mem();
    let mut empty = 0i64;
    for idx in 0..HPAGE_PMD_NR as usize {
        let dst = folio.pfn() + idx as u64;
        match pte_kind(oncpu, table.pte(mem, idx)) {
            Ok(PteKind::Page(_)) => mem.copy_page(dst, table.pte(mem, idx).pfn()),
            _ => mem.clear_page(dst),
        }
    }
    let mut idx = 0usize;
    while idx < HPAGE_PMD_NR as usize {
        let pte = table.pte(mem, idx);
        let src = match pte_kind(oncpu, pte) {
            Ok(PteKind::Page(f)) => f,
            _ => {
                empty += 1;
                if !pte.none() {
                    table.set_pte(mem, idx, Pte::default());
                }
                idx += 1;
                continue;
            }
        };
        let page: Pfn = pte.pfn();
        // The run of PTEs that map consecutive pages of this folio.
        let mut nr = 1usize;
        while idx + nr < HPAGE_PMD_NR as usize {
            let next = table.pte(mem, idx + nr);
            if !next.present()
                || next.pfn() != page + nr as u64
                || mem.page_folio(next.pfn()) != src
            {
                break;
            }
            nr += 1;
        }
        for i in idx..idx + nr {
            table.set_pte(mem, i, Pte::default());
        }
        rmap::folio_remove_rmap_ptes(mem, src, page, nr as u64, mm.id, oncpu.id());
        crate::mlock::munlock_vma_folio(mem, src, vma.flags(), oncpu.id());
        src.put_refs(mem, nr as i32, oncpu.id());
        idx += nr;
    }
    mm.add_rss(MmCounter::AnonPages, empty);
}
