//! Oracles: the invariant checker, and the shadow memory ([`shadow`]).
//!
//! [`check_invariants`] walks every address space and asserts what the
//! kernel's accounting promises: each folio's refcount and mapcounts equal
//! what the page tables say, RSS equals the mapped pages, `pgtables_bytes`
//! equals the table frames, no free frame is mapped or cached in a TLB, and
//! every TLB entry whose address space has no flush pending agrees with the
//! page tables, the reverse map finds every mapping of an anon page
//! (its folio's anon_vma chains the VMA that maps it, at that address), and
//! the page cache's index names its folios and counts them, and every file
//! VMA is in its file's `i_mmap` (with the file rmap leading back to each
//! mapping of a page-cache page), the overcommit commitment is the size of the charged VMAs, the LRU
//! lists hold exactly the folios flagged PG_lru and count them, and every
//! frame is free or held by something named (no leak). It
//! needs a quiescent machine: no operation in flight.

pub mod shadow;

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;

use crate::machine::Machine;
use crate::mm::{Mm, MmCounter, VmaTree};
use crate::pgtable::entry::*;
use crate::pgtable::pagewalk::{
    walk_page_range, MmWalkOps, TableId, TableLevel, WalkAction, WalkLock,
};
use crate::pgtable::PmdSlot;
use crate::phys::{Folio, Pfn, HPAGE_PMD_ORDER, PAGE_SIZE};
use crate::sync::{Arc, Ordering};
use crate::vmstat::NodeStat;

#[derive(Default)]
struct Expect {
    refs: HashMap<Pfn, i64>,
    page_maps: HashMap<Pfn, i64>,
    entire: HashMap<Pfn, i64>,
    mapped: HashSet<Pfn>,
    tables: HashSet<Pfn>,
    /// Folios (heads) that a migration entry stands for: the migration
    /// holds references of its own, so their refcount exceeds the mappings.
    migrating: HashSet<Pfn>,
    /// References the CPUs' LRU batches hold, per folio.
    batched: HashMap<Pfn, i64>,
    /// Mappings per (folio head, mm id), for the MM-owner slots.
    mm_maps: HashMap<(Pfn, u64), i64>,
    /// Page-cache folios (heads), each holding one reference per page.
    cached: HashSet<Pfn>,
}

/// A leaf translation in the page tables: (pfn, writable) by 4 KiB address.
type Leaves = HashMap<u64, (Pfn, bool)>;

pub fn check_invariants(m: &Machine) -> Result<(), String> {
    let mem = &m.mem;
    let mut ex = Expect::default();
    let mut leaves_by_mm: HashMap<u64, Leaves> = HashMap::new();
    let mms = m.mms();
    for mm in &mms {
        let mut leaves = Leaves::new();
        check_mm(m, mm, &mut ex, &mut leaves)?;
        leaves_by_mm.insert(mm.id, leaves);
    }
    ex.batched = crate::swap::lru_batch_refs(mem);
    check_page_cache(m, &mms, &mut ex)?;
    let heads: HashSet<Pfn> = ex
        .refs
        .keys()
        .chain(&ex.migrating)
        .chain(ex.batched.keys())
        .chain(&ex.cached)
        .copied()
        .collect();
    // NR_ANON_MAPPED and NR_ANON_THPS as the page tables say them: the
    // pages of anon folios mapped at least once, and the pages of anon
    // folios a PMD maps.
    let (mut anon_mapped, mut anon_thps) = (0i64, 0i64);
    let (mut file_mapped, mut file_pmdmapped, mut shmem_pmdmapped) = (0i64, 0i64, 0i64);
    let mut mms_of: HashMap<Pfn, usize> = HashMap::new();
    for (head, _) in ex.mm_maps.keys() {
        *mms_of.entry(*head).or_default() += 1;
    }
    for &head in &heads {
        let f = Folio(head);
        let cache_refs = if ex.cached.contains(&head) {
            f.nr_pages(mem) as i64
        } else {
            0
        };
        // The machine's own reference to a vDSO image page.
        let image_ref = i64::from(m.vdso_pages.contains(&head));
        let refs = ex.refs.get(&head).copied().unwrap_or(0)
            + ex.batched.get(&head).copied().unwrap_or(0)
            + cache_refs
            + image_ref;
        let got = f.ref_count(mem) as i64;
        if ex.migrating.contains(&head) {
            if got <= refs {
                return Err(format!(
                    "folio {head:#x} under migration: refcount {got}, no more than its {refs} mappings"
                ));
            }
        } else if got != refs {
            return Err(format!(
                "folio {head:#x}: refcount {got}, page tables, the page cache and LRU batches hold {refs} ({} by the LRU batches, {cache_refs} by the page cache; flags {:#x}, mapcount {})",
                ex.batched.get(&head).copied().unwrap_or(0),
                f.head(mem).flags.load(Ordering::Relaxed),
                f.mapcount(mem)
            ));
        }
        let nr = f.nr_pages(mem);
        let entire = ex.entire.get(&head).copied().unwrap_or(0);
        let mut total = entire;
        let mut pages_mapped = 0;
        for p in head..head + nr {
            let want = ex.page_maps.get(&p).copied().unwrap_or(0);
            let got = mem.page(p).mapcount.load(Ordering::Relaxed) as i64 + 1;
            if got != want {
                return Err(format!("page {p:#x} (folio {head:#x}): mapcount {got}, page tables map it {want} times"));
            }
            total += want;
            pages_mapped += i64::from(want > 0);
            // PageAnonExclusive: no other mapping can exist, so a page
            // flagged is mapped once at most (a PMD mapping's flag is the
            // head's, counted with the PMD mappings).
            let maps = want + if p == head { entire } else { 0 };
            if maps > 1 && crate::phys::folio::page_anon_exclusive(mem, p) {
                return Err(format!(
                    "page {p:#x} (folio {head:#x}) is PageAnonExclusive but mapped {maps} times"
                ));
            }
        }
        if f.test_anon(mem) {
            anon_mapped += if entire > 0 { nr as i64 } else { pages_mapped };
            anon_thps += if entire > 0 { nr as i64 } else { 0 };
        } else {
            file_mapped += if entire > 0 { nr as i64 } else { pages_mapped };
            let pmdmapped = if entire > 0 { nr as i64 } else { 0 };
            if f.head(mem).test(crate::phys::pg::SWAPBACKED) {
                shmem_pmdmapped += pmdmapped;
            } else {
                file_pmdmapped += pmdmapped;
            }
        }
        if f.is_large(mem) {
            let lm = f.counters(mem).large_mapcount.load(Ordering::Relaxed) as i64 + 1;
            if lm != total {
                return Err(format!(
                    "folio {head:#x}: large_mapcount {lm}, mappings {total}"
                ));
            }
            let mms = mms_of.get(&head).copied().unwrap_or(0);
            check_mm_owner_slots(mem, f, &ex.mm_maps, mms, total)?;
            let em = f.entire_mapcount(mem) as i64;
            if em != entire {
                return Err(format!(
                    "folio {head:#x}: entire_mapcount {em}, PMD mappings {entire}"
                ));
            }
            // `_nr_pages_mapped`: the pages some PTE maps, plus
            // ENTIRELY_MAPPED while a PMD maps the folio.
            let npm = f.counters(mem).nr_pages_mapped.load(Ordering::Relaxed);
            let want = pages_mapped
                + if entire > 0 {
                    crate::rmap::ENTIRELY_MAPPED
                } else {
                    0
                };
            if npm != want {
                return Err(format!(
                    "folio {head:#x}: _nr_pages_mapped {npm:#x}, page tables say {want:#x} ({pages_mapped} pages by PTEs, {entire} PMD mappings)"
                ));
            }
        }
    }
    for (stat, want) in [
        (NodeStat::NR_ANON_MAPPED, anon_mapped),
        (NodeStat::NR_ANON_THPS, anon_thps),
        (NodeStat::NR_FILE_MAPPED, file_mapped),
        (NodeStat::NR_FILE_PMDMAPPED, file_pmdmapped),
        (NodeStat::NR_SHMEM_PMDMAPPED, shmem_pmdmapped),
    ] {
        let got = mem.vmstat.node(stat);
        if got != want {
            return Err(format!(
                "{}: {got} pages, page tables map {want}",
                stat.name()
            ));
        }
    }
    // Frames still waiting for a grace period, counted before the free
    // lists are read: a deferred free can run while they are (the epoch
    // collects inside any pin, this checker's own included) and put its
    // frame on a list already read.
    let waiting = mem.rcu_pending() as usize;
    let mut free = HashSet::new();
    mem.for_each_free_block(|head, order| {
        for i in 0..1u64 << order {
            free.insert(head + i);
        }
    });
    mem.check_luf_lists()?;
    if let Some(p) = ex.mapped.iter().find(|p| free.contains(p)) {
        return Err(format!("frame {p:#x} is free but mapped"));
    }
    if let Some(h) = ex.migrating.iter().find(|h| free.contains(h)) {
        return Err(format!("folio {h:#x} is free but under migration"));
    }
    if let Some(p) = ex.tables.iter().find(|p| free.contains(p)) {
        return Err(format!("frame {p:#x} is free but used as a page table"));
    }
    check_lru(m, &ex, &free)?;
    check_no_leak(m, &ex, &free, waiting)?;
    check_tlbs(m, &mms, &leaves_by_mm, &free)?;
    check_committed(m, &mms)
}

/// Every frame is accounted for: free, a page table (PGDs and deposited
/// tables included), part of a mapped folio, the zero page or the huge zero
/// folio; only frames still waiting for a grace period may be none of these.
fn check_no_leak(
    m: &Machine,
    ex: &Expect,
    free: &HashSet<Pfn>,
    waiting: usize,
) -> Result<(), String> {
    let mem = &m.mem;
    let mut held: HashSet<Pfn> = ex.tables.clone();
    for &head in ex
        .refs
        .keys()
        .chain(&ex.migrating)
        .chain(ex.batched.keys())
        .chain(&ex.cached)
    {
        held.extend(head..head + Folio(head).nr_pages(mem));
    }
    held.insert(m.zero_pfn);
    held.extend(m.vdso_pages);
    // MIGRC's kept sources: pinned by its reference alone.
    for f in m.mem.migrc.kept() {
        if f.ref_count(mem) != 1 || f.mapped(mem) {
            return Err(format!(
                "MIGRC source {:#x}: refcount {}, mapped {}: it should be held by MIGRC alone",
                f.pfn(),
                f.ref_count(mem),
                f.mapped(mem)
            ));
        }
        held.extend(f.pfn()..f.pfn() + f.nr_pages(mem));
    }
    held.extend(m.mms_referenced().iter().map(|mm| mm.pgd.cr3()));
    if let Some(hz) = m.huge_zero_pfn_if_allocated() {
        held.extend(hz..hz + crate::phys::HPAGE_PMD_NR);
    }
    let mut leaked = vec![];
    for node in &mem.nodes {
        for pfn in node.start_pfn()..node.start_pfn() + node.nr_pages {
            if !free.contains(&pfn) && !held.contains(&pfn) {
                leaked.push(pfn);
            }
        }
    }
    if leaked.len() > waiting {
        let flags = mem.page(leaked[0]).flags.load(Ordering::Relaxed);
        return Err(format!(
            "{} frames are neither free, a table, mapped nor a zero page ({waiting} wait for a grace period); the first is {:#x}, flags {flags:#x}",
            leaked.len(),
            leaked[0]
        ));
    }
    Ok(())
}

/// The LRU lists: each folio on a list is an allocated folio's head with
/// PG_lru, on the list its flags name; the lists' sizes are their folios'
/// pages and the node statistics say the same; every folio with PG_lru is
/// on a list; and every mapped anon folio is on a list or in a CPU's
/// batch on its way to one (the model isolates nothing between
/// operations).
fn check_lru(m: &Machine, ex: &Expect, free: &HashSet<Pfn>) -> Result<(), String> {
    use crate::phys::mm_inline::{folio_lru_list, LruList, NR_LRU_LISTS};
    let mem = &m.mem;
    let mut on_lru = HashSet::new();
    let mut sizes = [0u64; NR_LRU_LISTS];
    let mut bad = None;
    mem.for_each_lru_folio(|f, lru| {
        if bad.is_some() {
            return;
        }
        let head = f.head(mem);
        if free.contains(&f.pfn()) || head.is_tail() {
            bad = Some(format!(
                "{:#x} is on LRU list {lru:?} but is no folio",
                f.pfn()
            ));
        } else if !head.test(crate::phys::pg::LRU) {
            bad = Some(format!("folio {:#x} is on {lru:?} without PG_lru", f.pfn()));
        } else if folio_lru_list(mem, f) != lru {
            bad = Some(format!(
                "folio {:#x} is on {lru:?}, its flags say {:?}",
                f.pfn(),
                folio_lru_list(mem, f)
            ));
        } else if !on_lru.insert(f.pfn()) {
            bad = Some(format!("folio {:#x} is on the LRU twice", f.pfn()));
        }
        sizes[lru as usize] += f.nr_pages(mem);
    });
    if let Some(e) = bad {
        return Err(e);
    }
    // The unevictable list links nothing: its folios are the mapped,
    // cached and batched ones flagged so (a munlock waiting in a batch
    // holds a folio nothing maps any more); the mlocked ones are what
    // nr_mlock counts.
    let mut mlocked = 0;
    let mut seen = HashSet::new();
    for &head in ex
        .refs
        .keys()
        .chain(ex.cached.iter())
        .chain(ex.batched.keys())
    {
        if !seen.insert(head) {
            continue;
        }
        let f = Folio(head);
        let flags = f.head(mem).flags.load(Ordering::Relaxed);
        let unevictable = crate::phys::pg::LRU | crate::phys::pg::UNEVICTABLE;
        if flags & unevictable == unevictable && on_lru.insert(head) {
            sizes[LruList::Unevictable as usize] += f.nr_pages(mem);
        }
        if flags & crate::phys::pg::MLOCKED != 0 {
            mlocked += f.nr_pages(mem) as i64;
        }
    }
    let nr_mlock = mem.vmstat.node(crate::vmstat::NodeStat::NR_MLOCK);
    if nr_mlock != mlocked {
        return Err(format!(
            "{mlocked} pages of folios are mlocked, nr_mlock says {nr_mlock}"
        ));
    }
    let counted = mem.lru_sizes();
    for lru in LruList::ALL {
        let (want, listed) = (sizes[lru as usize], counted[lru as usize]);
        let stat = mem.vmstat.node(lru.stat());
        if listed != want || stat != want as i64 {
            return Err(format!(
                "{lru:?}: {want} pages on the list, its size says {listed}, {} says {stat}",
                lru.stat().name()
            ));
        }
    }
    for &head in ex.refs.keys() {
        let f = Folio(head);
        let lru = f.head(mem).test(crate::phys::pg::LRU);
        if lru && !on_lru.contains(&head) {
            return Err(format!("folio {head:#x} has PG_lru but is on no list"));
        }
        if f.test_anon(mem)
            && !lru
            && !ex.batched.contains_key(&head)
            && !ex.migrating.contains(&head)
        {
            return Err(format!(
                "mapped anon folio {head:#x} is neither on an LRU list nor in a batch"
            ));
        }
    }
    for &head in &ex.cached {
        let lru = Folio(head).head(mem).test(crate::phys::pg::LRU);
        if !lru && !ex.batched.contains_key(&head) {
            return Err(format!(
                "page-cache folio {head:#x} is neither on an LRU list nor in a batch"
            ));
        }
    }
    Ok(())
}

/// The page cache of every inode: each cached folio is a live folio's
/// head whose `mapping` and `index` name its address space and place,
/// aligned to its size, without overlap; `nrpages` and `nr_file_pages`
/// count them, `nr_dirty` their dirty ones; and every file VMA of every
/// address space is in its file's `i_mmap`, which holds no other live VMA.
fn check_page_cache(m: &Machine, mms: &[Arc<Mm>], ex: &mut Expect) -> Result<(), String> {
    let mem = &m.mem;
    let (mut file_pages, mut dirty, mut shmem) = (0i64, 0i64, 0i64);
    let (mut file_thps, mut shmem_thps) = (0i64, 0i64);
    let mut linked = 0usize;
    for inode in m.inodes() {
        let mapping = &inode.i_mapping;
        let mut end = 0u64;
        let mut pages = 0u64;
        for (index, folio) in mapping.folios() {
            let head = folio.head(mem);
            let nr = folio.nr_pages(mem);
            if head.is_tail() || folio.ref_count(mem) <= 0 {
                return Err(format!(
                    "{inode:?}: page {index} caches {:#x}, which is no live folio",
                    folio.pfn()
                ));
            }
            if head.mapping.load(Ordering::Relaxed) != mapping.as_mapping_word()
                || head.index.load(Ordering::Relaxed) != index
            {
                return Err(format!(
                    "{inode:?}: folio {:#x} cached at page {index} names another place",
                    folio.pfn()
                ));
            }
            if index % nr != 0 || index < end {
                return Err(format!(
                    "{inode:?}: folio {:#x} of {nr} pages at page {index} is misaligned or overlaps",
                    folio.pfn()
                ));
            }
            end = index + nr;
            pages += nr;
            if folio.order(mem) == crate::phys::HPAGE_PMD_ORDER {
                *if mapping.is_shmem() {
                    &mut shmem_thps
                } else {
                    &mut file_thps
                } += nr as i64;
            }
            if mapping.is_shmem() {
                shmem += nr as i64;
                if !head.test(crate::phys::pg::SWAPBACKED) {
                    return Err(format!(
                        "{inode:?}: shmem folio {:#x} is not swap-backed",
                        folio.pfn()
                    ));
                }
            } else if head.test(crate::phys::pg::DIRTY) {
                dirty += nr as i64;
            }
            ex.cached.insert(folio.pfn());
        }
        if pages != mapping.nrpages() {
            return Err(format!(
                "{inode:?}: nrpages {}, the cache holds {pages}",
                mapping.nrpages()
            ));
        }
        file_pages += pages as i64;
        linked += mapping.i_mmap_len();
    }
    let guard = crate::sync::epoch::pin();
    let mut file_vmas = 0usize;
    for mm in mms {
        for vma in mm.vma_tree(&guard).iter() {
            let Some(file) = vma.file() else { continue };
            file_vmas += 1;
            if !file.mapping().has_vma(vma) {
                return Err(format!(
                    "{mm:?}: {vma:?} maps a file but is not in its i_mmap"
                ));
            }
        }
    }
    if linked != file_vmas {
        return Err(format!(
            "i_mmap holds {linked} VMAs, the address spaces map files by {file_vmas}"
        ));
    }
    for (stat, want) in [
        (NodeStat::NR_FILE_PAGES, file_pages),
        (NodeStat::NR_FILE_DIRTY, dirty),
        (NodeStat::NR_SHMEM, shmem),
        (NodeStat::NR_FILE_THPS, file_thps),
        (NodeStat::NR_SHMEM_THPS, shmem_thps),
    ] {
        let got = mem.vmstat.node(stat);
        if got != want {
            return Err(format!(
                "{}: {got} pages, the page cache holds {want}",
                stat.name()
            ));
        }
    }
    Ok(())
}

/// A PMD mapping's PageAnonExclusive is its head page's (the kernel's
/// rule): a writable PMD needs it, and no tail page of a PMD-mapped folio
/// carries one (only a split hands it to the pages).
fn check_pmd_exclusive(
    m: &Machine,
    mm: &Mm,
    addr: u64,
    pmd: crate::pgtable::Pmd,
) -> Result<(), String> {
    let mem = &m.mem;
    let head = pmd.pfn();
    if pmd.write() && !crate::phys::folio::page_anon_exclusive(mem, head) {
        return Err(format!(
            "{mm:?} {addr:#x}: writable PMD of folio {head:#x}, whose head is not PageAnonExclusive"
        ));
    }
    if let Some(p) = (head + 1..head + crate::phys::HPAGE_PMD_NR)
        .find(|&p| crate::phys::folio::page_anon_exclusive(mem, p))
    {
        return Err(format!(
            "{mm:?} {addr:#x}: page {p:#x} of PMD-mapped folio {head:#x} is PageAnonExclusive"
        ));
    }
    Ok(())
}

/// `vm_committed_as` is the size of every `VM_ACCOUNT` VMA and of every
/// shared anonymous mapping's file.
fn check_committed(m: &Machine, mms: &[Arc<Mm>]) -> Result<(), String> {
    let guard = crate::sync::epoch::pin();
    let want =
        crate::mmap::vmas_accounted_pages(mms.iter().flat_map(|mm| mm.vma_tree(&guard).iter()))
            + m.inodes().iter().map(|i| i.accounted_pages()).sum::<u64>();
    let got = m.overcommit.vm_memory_committed();
    if got != want {
        return Err(format!(
            "Committed_AS is {got} pages, VM_ACCOUNT VMAs hold {want}"
        ));
    }
    Ok(())
}

/// The reverse map must lead from page `p` back to `addr` in `mm`: the VMA
/// that maps it is chained to the folio's anon_vma and maps the page's
/// index at `addr`.
fn check_rmap(m: &Machine, mm: &Mm, tree: &VmaTree, p: Pfn, addr: u64) -> Result<(), String> {
    let mem = &m.mem;
    let f = mem.page_folio(p);
    let Some(vma) = tree.vma_lookup(addr) else {
        return Err(format!(
            "{mm:?} {addr:#x}: page {p:#x} mapped outside any VMA"
        ));
    };
    if let Some(i) = m.vdso_pages.iter().position(|&v| v == p) {
        return check_vdso_page(mm, vma, i as u64, addr);
    }
    if !f.test_anon(mem) {
        return check_file_rmap(m, mm, vma, f, p, addr);
    }
    let Some(av) = crate::rmap::folio_anon_vma(mem, f) else {
        return Err(format!(
            "{mm:?} {addr:#x}: mapped folio {:#x} has no anon_vma",
            f.pfn()
        ));
    };
    if !av.has_vma(vma) {
        return Err(format!(
            "{mm:?} {addr:#x}: {vma:?} is not on the chain of folio {:#x}'s anon_vma {}",
            f.pfn(),
            av.id
        ));
    }
    let pgoff = crate::rmap::folio_page_pgoff(mem, f, p);
    if vma.address_of(pgoff) != Some(addr) {
        return Err(format!(
            "{mm:?} {addr:#x}: page {p:#x} has index {pgoff:#x}, which {vma:?} maps at {:?}",
            vma.address_of(pgoff)
        ));
    }
    Ok(())
}

/// The vDSO image's page `i` is mapped only by `[vdso]`, at its offset.
fn check_vdso_page(mm: &Mm, vma: &crate::mm::Vma, i: u64, addr: u64) -> Result<(), String> {
    let ok = vma
        .special()
        .is_some_and(|sm| std::ptr::eq(sm, &crate::vdso::VDSO_MAPPING))
        && vma.start() + i * PAGE_SIZE == addr;
    if !ok {
        return Err(format!(
            "{mm:?} {addr:#x}: the vDSO's page {i} mapped by {vma:?}"
        ));
    }
    Ok(())
}

/// The file rmap of page `p` of page-cache folio `f` mapped at `addr`:
/// the VMA maps the folio's file, is in its `i_mmap`, and maps the page's
/// file offset at `addr`.
fn check_file_rmap(
    m: &Machine,
    mm: &Mm,
    vma: &crate::mm::Vma,
    f: Folio,
    p: Pfn,
    addr: u64,
) -> Result<(), String> {
    let mem = &m.mem;
    let Some(file) = vma.file() else {
        return Err(format!(
            "{mm:?} {addr:#x}: page-cache folio {:#x} mapped in anonymous {vma:?}",
            f.pfn()
        ));
    };
    let word = f.head(mem).mapping.load(Ordering::Relaxed);
    if word != file.mapping().as_mapping_word() {
        return Err(format!(
            "{mm:?} {addr:#x}: folio {:#x} is not in the page cache of {vma:?}'s file",
            f.pfn()
        ));
    }
    if !file.mapping().has_vma(vma) {
        return Err(format!(
            "{mm:?} {addr:#x}: {vma:?} is not in its file's i_mmap"
        ));
    }
    let pgoff = crate::rmap::folio_page_pgoff(mem, f, p);
    if vma.address_of(pgoff) != Some(addr) {
        return Err(format!(
            "{mm:?} {addr:#x}: file page {pgoff:#x} ({p:#x}), which {vma:?} maps at {:?}",
            vma.address_of(pgoff)
        ));
    }
    Ok(())
}

fn check_mm(m: &Machine, mm: &Arc<Mm>, ex: &mut Expect, leaves: &mut Leaves) -> Result<(), String> {
    let guard = crate::sync::epoch::pin();
    let tree = mm.vma_tree(&guard);
    tree.check().map_err(|e| format!("{mm:?}: {e}"))?;
    ex.tables.insert(mm.pgd.cr3());
    let mut walk = CheckWalk {
        m,
        mm,
        tree,
        ex,
        leaves,
        tables: 0,
        anon: 0,
        file: 0,
        shmem: 0,
    };
    // The machine is quiescent: no lock is needed to read the tables.
    let top = 1u64 << 47;
    if let ControlFlow::Break(e) =
        walk_page_range(&m.mem, &mm.pgd, 0, top, WalkLock::Lockless, &mut walk)
    {
        return Err(e);
    }
    let (tables, anon, file, shmem) = (walk.tables, walk.anon, walk.file, walk.shmem);
    check_leaves_in_vmas(mm, tree, leaves)?;
    // Deposited tables under huge PMDs are counted as PTE tables.
    let bytes = mm.pgtables_bytes.load(Ordering::Relaxed);
    if bytes != tables * PAGE_SIZE as i64 {
        return Err(format!(
            "{mm:?}: pgtables_bytes {bytes}, tables in the tree {tables} (x4096)"
        ));
    }
    let rss = mm.get_rss(MmCounter::AnonPages);
    if rss != anon {
        return Err(format!(
            "{mm:?}: RssAnon {rss} pages, page tables map {anon}"
        ));
    }
    let rss = mm.get_rss(MmCounter::FilePages);
    if rss != file {
        return Err(format!(
            "{mm:?}: RssFile {rss} pages, page tables map {file}"
        ));
    }
    let rss = mm.get_rss(MmCounter::ShmemPages);
    if rss != shmem {
        return Err(format!(
            "{mm:?}: RssShmem {rss} pages, page tables map {shmem}"
        ));
    }
    Ok(())
}

/// Every present leaf lies in a VMA, and a writable one in a VMA that
/// allows writing: a zap or mprotect that missed an entry (or a migration
/// that put back a write bit mprotect had taken) leaves one that does not.
fn check_leaves_in_vmas(mm: &Mm, tree: &VmaTree, leaves: &Leaves) -> Result<(), String> {
    for (&addr, &(pfn, write)) in leaves {
        let Some(vma) = tree.vma_lookup(addr) else {
            return Err(format!(
                "{mm:?} {addr:#x}: pfn {pfn:#x} mapped outside every VMA"
            ));
        };
        if write && vma.flags() & crate::mm::vma::VM_WRITE == 0 {
            return Err(format!(
                "{mm:?} {addr:#x}: pfn {pfn:#x} mapped writable in a VMA without VM_WRITE ({vma:?})"
            ));
        }
    }
    Ok(())
}

/// The checker's walk of one address space: what it expects of every
/// folio, the leaves it found, and the tables and anon pages it counted.
struct CheckWalk<'a> {
    m: &'a Machine,
    mm: &'a Arc<Mm>,
    tree: &'a VmaTree,
    ex: &'a mut Expect,
    leaves: &'a mut Leaves,
    /// Tables that `pgtables_bytes` counts: PUD, PMD and PTE tables, a
    /// huge PMD's deposited table standing for its PTE table.
    tables: i64,
    anon: i64,
    file: i64,
    shmem: i64,
}

impl MmWalkOps for CheckWalk<'_> {
    type Break = String;

    fn table(&mut self, level: TableLevel, table: TableId, _addr: u64) -> ControlFlow<String> {
        self.ex.tables.insert(table.frame());
        // The walk holds a PTE table it enters (`pte_tryget_map`).
        let held = i64::from(level == TableLevel::Pte);
        if let Some(e) = table.pte_ref_mismatch(&self.m.mem, held) {
            return ControlFlow::Break(format!("{:?}: {e}", self.mm));
        }
        if matches!(level, TableLevel::Pud | TableLevel::Pmd) {
            self.tables += 1;
        }
        ControlFlow::Continue(())
    }

    fn dead_pte_table(&mut self, table: TableId, _addr: u64) -> ControlFlow<String> {
        // Still hooked and counted in pgtables_bytes (by `pmd_entry`); its
        // count must be exactly zero with no entry left.
        self.ex.tables.insert(table.frame());
        match table.pte_ref_mismatch(&self.m.mem, 0) {
            Some(e) => ControlFlow::Break(format!("{:?}: dead {e}", self.mm)),
            None => ControlFlow::Continue(()),
        }
    }

    fn pmd_entry(
        &mut self,
        _slot: PmdSlot,
        pm: Pmd,
        base: u64,
        _next: u64,
    ) -> ControlFlow<String, WalkAction> {
        let (m, mm) = (self.m, self.mm);
        // A PTE table, or a huge PMD (or PMD migration entry) with its
        // deposited one.
        self.tables += 1;
        if pm.is_swap() {
            return match self.check_swap_pmd(pm, base) {
                Ok(()) => ControlFlow::Continue(WalkAction::Continue),
                Err(e) => ControlFlow::Break(e),
            };
        }
        if !pm.trans_huge() {
            return ControlFlow::Continue(WalkAction::Subtree);
        }
        if pm.special() {
            if !m.is_huge_zero_pfn(pm.pfn()) || pm.write() {
                return ControlFlow::Break(format!(
                    "{mm:?} {base:#x}: special huge PMD {pm:?} is not the read-only huge zero page"
                ));
            }
            for i in 0..512 {
                self.leaves
                    .insert(base + i * PAGE_SIZE, (pm.pfn() + i, false));
            }
            return ControlFlow::Continue(WalkAction::Continue);
        }
        let head = pm.pfn();
        let anon = Folio(head).test_anon(&m.mem);
        let checked = if anon {
            check_pmd_exclusive(m, mm, base, pm)
        } else {
            // A page-cache folio's PMD has no deposited table.
            self.tables -= 1;
            Ok(())
        };
        if let Err(e) = checked.and_then(|()| check_rmap(m, mm, self.tree, head, base)) {
            return ControlFlow::Break(e);
        }
        *self.ex.refs.entry(head).or_default() += 1;
        *self.ex.entire.entry(head).or_default() += 1;
        *self.ex.mm_maps.entry((head, mm.id)).or_default() += 1;
        for i in 0..512 {
            self.ex.mapped.insert(head + i);
            self.leaves
                .insert(base + i * PAGE_SIZE, (head + i, pm.write()));
        }
        self.count_rss(Folio(head), 512);
        ControlFlow::Continue(WalkAction::Continue)
    }

    fn pte_entry(&mut self, pte: Pte, addr: u64) -> ControlFlow<String> {
        match self.check_pte(pte, addr) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => ControlFlow::Break(e),
        }
    }
}

impl CheckWalk<'_> {
    /// `nr` pages of `folio` mapped: the RSS counter they count in.
    fn count_rss(&mut self, folio: Folio, nr: i64) {
        match crate::mm::mm_counter_file(&self.m.mem, folio) {
            _ if folio.test_anon(&self.m.mem) => self.anon += nr,
            MmCounter::ShmemPages => self.shmem += nr,
            _ => self.file += nr,
        }
    }

    /// A PMD migration entry: a PMD-order folio's head, counted in RSS
    /// (512 anon pages) with no mapping or reference of its own.
    fn check_swap_pmd(&mut self, pmd: Pmd, addr: u64) -> Result<(), String> {
        use crate::pgtable::swapops::SwpKind;
        let (mm, mem) = (self.mm, &self.m.mem);
        let SwpKind::Migration { pfn, kind, .. } = pmd.swp_entry().kind() else {
            return Err(format!(
                "{mm:?} {addr:#x}: swap PMD {pmd:?} that is no migration entry"
            ));
        };
        self.check_migration_entry_vma(addr, kind)?;
        if !mem.pfn_valid(pfn) {
            return Err(format!(
                "{mm:?} {addr:#x}: PMD migration entry for invalid pfn {pfn:#x}"
            ));
        }
        let folio = mem.page_folio(pfn);
        if folio.pfn() != pfn || folio.order(mem) != HPAGE_PMD_ORDER {
            return Err(format!(
                "{mm:?} {addr:#x}: PMD migration entry for {pfn:#x}, not the head of a PMD-order folio"
            ));
        }
        self.ex.migrating.insert(pfn);
        self.anon += 512;
        Ok(())
    }

    /// A migration entry lies in a VMA, and a writable one (which the
    /// migration will map writable) in one that allows writing: mprotect
    /// makes writable entries readable.
    fn check_migration_entry_vma(
        &self,
        addr: u64,
        kind: crate::pgtable::swapops::Migration,
    ) -> Result<(), String> {
        let mm = self.mm;
        let Some(vma) = self.tree.vma_lookup(addr) else {
            return Err(format!(
                "{mm:?} {addr:#x}: migration entry outside every VMA"
            ));
        };
        if kind == crate::pgtable::swapops::Migration::Write
            && vma.flags() & crate::mm::vma::VM_WRITE == 0
        {
            return Err(format!(
                "{mm:?} {addr:#x}: writable migration entry in a VMA without VM_WRITE ({vma:?})"
            ));
        }
        Ok(())
    }

    /// A non-present entry: a migration entry counts in RSS and names a
    /// folio the migration holds; a marker has only known bits.
    fn check_swap_pte(&mut self, pte: Pte, addr: u64) -> Result<(), String> {
        use crate::pgtable::swapops::{SwpKind, PTE_MARKER_GUARD, PTE_MARKER_POISONED};
        let (mm, mem) = (self.mm, &self.m.mem);
        match pte.swp_entry().kind() {
            SwpKind::Migration { pfn, kind, .. } => {
                self.check_migration_entry_vma(addr, kind)?;
                if !mem.pfn_valid(pfn) {
                    return Err(format!(
                        "{mm:?} {addr:#x}: migration entry for invalid pfn {pfn:#x}"
                    ));
                }
                self.ex.migrating.insert(mem.page_folio(pfn).pfn());
                self.anon += 1;
                Ok(())
            }
            SwpKind::Marker(bits) if bits & !(PTE_MARKER_GUARD | PTE_MARKER_POISONED) == 0 => {
                Ok(())
            }
            other => Err(format!(
                "{mm:?} {addr:#x}: non-present entry {other:?}, which nothing in the model makes"
            )),
        }
    }

    fn check_pte(&mut self, pte: Pte, addr: u64) -> Result<(), String> {
        if pte.is_swap() {
            return self.check_swap_pte(pte, addr);
        }
        let (m, mm, mem) = (self.m, self.mm, &self.m.mem);
        if pte.0 & _PAGE_PRESENT != 0 {
            self.leaves.insert(addr, (pte.pfn(), pte.write()));
        }
        if pte.special() {
            if pte.pfn() != m.zero_pfn {
                return Err(format!(
                    "{mm:?} {addr:#x}: special PTE not mapping the zero page"
                ));
            }
            if pte.write() {
                return Err(format!("{mm:?} {addr:#x}: writable zero page"));
            }
            return Ok(());
        }
        let p = pte.pfn();
        if !mem.pfn_valid(p) {
            return Err(format!("{mm:?} {addr:#x}: PTE maps invalid pfn {p:#x}"));
        }
        let f = mem.page_folio(p);
        let anon = f.test_anon(mem);
        if anon && pte.write() && !crate::phys::folio::page_anon_exclusive(mem, p) {
            return Err(format!(
                "{mm:?} {addr:#x}: writable PTE of a page that is not PageAnonExclusive"
            ));
        }
        check_rmap(m, mm, self.tree, p, addr)?;
        *self.ex.refs.entry(f.pfn()).or_default() += 1;
        *self.ex.page_maps.entry(p).or_default() += 1;
        *self.ex.mm_maps.entry((f.pfn(), mm.id)).or_default() += 1;
        self.ex.mapped.insert(p);
        self.count_rss(f, 1);
        Ok(())
    }
}

/// The MM-owner slots of a large folio against the page tables: a slot
/// in use counts no more mappings than its mm has (fewer when some were
/// made while no slot was free), a free one counts none, and a folio that
/// two address spaces map is marked "maybe mapped shared".
fn check_mm_owner_slots(
    mem: &crate::phys::PhysMem,
    f: Folio,
    mm_maps: &HashMap<(Pfn, u64), i64>,
    mms: usize,
    total: i64,
) -> Result<(), String> {
    let c = f.counters(mem);
    let head = f.pfn();
    for i in 0..2 {
        let (id, count) = c.mm_id_slot(i);
        let has = mm_maps.get(&(head, id)).copied().unwrap_or(0);
        let bad = if id == crate::phys::folio::MM_ID_DUMMY {
            count != -1
        } else {
            count < 0 || count as i64 + 1 > has
        };
        if bad {
            return Err(format!(
                "folio {head:#x}: MM-owner slot {i} holds mm {id} with mapcount {}, the page tables map it {has} times in that mm",
                count + 1
            ));
        }
    }
    if mms > 1 && !c.maybe_mapped_shared_bit() {
        return Err(format!(
            "folio {head:#x}: {mms} address spaces map it ({total} mappings), but it is not marked maybe mapped shared"
        ));
    }
    Ok(())
}

/// A TLB entry a CPU will use without a flush, behind its mm's
/// generation (see [`check_tlbs`]).
fn check_owed_entry(
    cpu: usize,
    e: &crate::cpu::tlb::CachedTranslation,
    leaves: &Leaves,
    kept: &HashSet<Pfn>,
    luf_owed: impl Fn(Pfn) -> bool,
) -> Result<(), String> {
    for i in 0..e.size / PAGE_SIZE {
        let (a, pfn) = (e.vaddr + i * PAGE_SIZE, e.pfn + i);
        let agrees = matches!(leaves.get(&a), Some(&(p, w)) if p == pfn && (w || !e.writable));
        let kept_source = kept.contains(&pfn) && !e.writable;
        // LUF: a free frame whose key still owes this CPU's flush, which
        // its takeoff will make before anyone else may write it.
        let luf_source = !e.writable && luf_owed(pfn);
        if !(agrees || kept_source || luf_source) {
            return Err(format!(
                "CPU {cpu}: TLB entry {a:#x} -> {pfn:#x} (w={}) will be used without a flush, and neither the page tables ({:?}) nor MIGRC's kept sources nor LUF's owed free pages account for it",
                e.writable,
                leaves.get(&a)
            ));
        }
    }
    Ok(())
}

/// Every paging-structure cache entry a CPU may use without a flush names
/// the table the page tables hold for its region now: a table freed or
/// replaced was flushed from every CPU.
fn check_cached_tables(
    m: &Machine,
    cpu: &crate::cpu::Cpu,
    mms: &[Arc<Mm>],
    loaded: Option<u64>,
    catches_up: bool,
) -> Result<(), String> {
    use crate::cpu::tlb::PscLevel;
    for e in cpu.tlb.cached_tables() {
        let Some(mm) = mms.iter().find(|mm| mm.id == e.mm_id) else {
            continue;
        };
        let pending = e.slot_tlb_gen < mm.tlb_gen.load(Ordering::Acquire);
        if pending && (loaded != Some(mm.id) || catches_up) {
            continue;
        }
        let (pmd_table, pte_table) =
            crate::pgtable::walk::table_path(&m.mem, mm.pgd.cr3(), e.vaddr);
        let holds = match e.level {
            PscLevel::Pdpte => pmd_table,
            PscLevel::Pde => pte_table,
        };
        if holds != Some(e.table) {
            return Err(format!(
                "CPU {}: its {:?} cache names table {:#x} for {:#x}, the page tables hold {holds:x?}",
                cpu.id, e.level, e.table, e.vaddr
            ));
        }
    }
    Ok(())
}

fn check_tlbs(
    m: &Machine,
    mms: &[Arc<Mm>],
    leaves: &HashMap<u64, Leaves>,
    free: &HashSet<Pfn>,
) -> Result<(), String> {
    let mem = &m.mem;
    let kept: HashSet<Pfn> = mem
        .migrc
        .kept()
        .iter()
        .flat_map(|f| f.pfn()..f.pfn() + f.nr_pages(mem))
        .collect();
    // Every request sent was received, or waits in its target's mailbox.
    let sent = m.vmstat().event(crate::vmstat::Event::TLB_IPI_SENT);
    let received = m
        .vmstat()
        .event(crate::vmstat::Event::NR_TLB_REMOTE_FLUSH_RECEIVED);
    let posted: u64 = m.cpus.iter().map(|c| c.nr_posted() as u64).sum();
    if sent != received + posted {
        return Err(format!(
            "TLB shootdowns: {sent} requests sent, {received} received and {posted} waiting"
        ));
    }
    for cpu in m.cpus.iter() {
        let loaded = cpu.loaded_mm().map(|mm| mm.id);
        // A lazy CPU compares generations when it leaves lazy mode.
        let catches_up = cpu.catches_up_on_return() || cpu.is_lazy();
        check_cached_tables(m, cpu, mms, loaded, catches_up)?;
        for e in cpu.tlb.entries() {
            let Some(mm) = mms.iter().find(|mm| mm.id == e.mm_id) else {
                continue;
            };
            let pending = e.slot_tlb_gen < mm.tlb_gen.load(Ordering::Acquire);
            if pending {
                // Behind its mm: flushed before use if the CPU switches to
                // it, or catches up on its return to user mode. Otherwise
                // (the loaded mm, no flush looked at the CPU: a flush still
                // owed by MIGRC) it will be used as it is, so it must read
                // what the page tables map, or a source MIGRC keeps,
                // read-only.
                if loaded != Some(mm.id) || catches_up {
                    continue;
                }
                let luf_owed = |pfn: Pfn| {
                    free.contains(&pfn) && mem.luf_takeoff_pending(pfn, 0) & cpu.bit() != 0
                };
                check_owed_entry(cpu.id, &e, &leaves[&mm.id], &kept, luf_owed)?;
                continue;
            }
            for i in 0..e.size / PAGE_SIZE {
                let pfn = e.pfn + i;
                if free.contains(&pfn) {
                    return Err(format!(
                        "CPU {}: TLB maps free frame {pfn:#x} at {:#x}",
                        cpu.id,
                        e.vaddr + i * PAGE_SIZE
                    ));
                }
                let a = e.vaddr + i * PAGE_SIZE;
                match leaves[&mm.id].get(&a) {
                    Some(&(p, w)) if p == pfn && (w || !e.writable) => {}
                    other => {
                        return Err(format!("CPU {}: TLB entry {a:#x} -> {pfn:#x} (w={}) disagrees with page tables {other:?}", cpu.id, e.writable))
                    }
                }
            }
        }
    }
    Ok(())
}
