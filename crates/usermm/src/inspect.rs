//! A picture of the machine for people and programs: each address space's
//! VMAs, its page tables (which exist and how full they are), the folios it
//! maps by size, every CPU's TLB, and the counters. [`inspect`] takes it
//! (the machine should be quiescent); `Display` prints it as tables and
//! `serde` serialises it.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::Serialize;

use crate::machine::Machine;
use crate::mm::Mm;
use crate::pgtable::entry::{Pmd, Pte, PTE_PFN_MASK};
use crate::pgtable::{entry_get, PGDIR_SIZE, PMD_SIZE, PTRS_PER_TABLE, PUD_SIZE};
use crate::phys::PAGE_SIZE;
use crate::proc::{self, Smaps, Status};
use crate::vmstat::VmStatSnapshot;

#[derive(Debug, Clone, Serialize)]
pub struct VmaInfo {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub flags: u64,
    pub anon_vma: Option<u64>,
    pub smaps: Smaps,
}

/// One PTE table: where, and how many of its 512 entries are used.
#[derive(Debug, Clone, Serialize)]
pub struct PteTableInfo {
    pub addr: u64,
    pub present: usize,
    pub zero_page: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PageTables {
    pub pud_tables: usize,
    pub pmd_tables: usize,
    pub pte_tables: Vec<PteTableInfo>,
    /// PMD entries mapping a 2 MiB folio (and the huge zero page).
    pub huge_pmds: usize,
    pub huge_zero_pmds: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct MmInfo {
    pub id: u64,
    pub status: Status,
    pub vmas: Vec<VmaInfo>,
    pub page_tables: PageTables,
    /// Distinct folios mapped, by size in kB ("2048 PMD" for PMD-mapped).
    pub folios: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TlbInfo {
    pub cpu: usize,
    pub loaded_mm: Option<u64>,
    /// Entries per address space and page size: (mm id, size kB) -> count.
    pub entries: Vec<(u64, u64, usize)>,
    pub misses: u64,
}

/// The machine-wide lines of /proc/meminfo the model keeps, in kB.
#[derive(Debug, Clone, Serialize)]
pub struct Meminfo {
    #[serde(rename = "MemTotal")]
    pub mem_total: u64,
    #[serde(rename = "MemFree")]
    pub mem_free: u64,
    #[serde(rename = "CommitLimit")]
    pub commit_limit: u64,
    #[serde(rename = "Committed_AS")]
    pub committed_as: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    /// How the machine is built.
    pub machine: crate::MachineConfig,
    pub meminfo: Meminfo,
    pub mms: Vec<MmInfo>,
    pub tlbs: Vec<TlbInfo>,
    pub free_pages: u64,
    pub counters: VmStatSnapshot,
}

/// Take a picture of every address space, TLB and counter.
pub fn inspect(m: &Machine) -> Inspection {
    let mms = m.mms().iter().map(|mm| inspect_mm(m, mm)).collect();
    let tlbs = m
        .cpus
        .iter()
        .map(|c| {
            let mut by: BTreeMap<(u64, u64), usize> = BTreeMap::new();
            for e in c.tlb.lock().entries() {
                *by.entry((e.mm_id, e.size >> 10)).or_default() += 1;
            }
            TlbInfo {
                cpu: c.id,
                loaded_mm: c.loaded_mm().map(|mm| mm.id),
                entries: by.into_iter().map(|((a, b), n)| (a, b, n)).collect(),
                misses: m.vmstat().event_on(c.id, crate::vmstat::Event::TLB_MISS),
            }
        })
        .collect();
    let kb = |pages: u64| pages << (crate::phys::PAGE_SHIFT - 10);
    Inspection {
        machine: m.config.clone(),
        meminfo: Meminfo {
            mem_total: kb(m.mem.nr_pages()),
            mem_free: kb(m.mem.nr_free_pages()),
            commit_limit: kb(m.overcommit.vm_commit_limit()),
            committed_as: kb(m.overcommit.vm_memory_committed()),
        },
        mms,
        tlbs,
        free_pages: m.mem.nr_free_pages(),
        counters: m.vmstat().snapshot(),
    }
}

fn inspect_mm(m: &Machine, mm: &Mm) -> MmInfo {
    let smaps = proc::smaps(mm);
    let vmas = {
        let guard = crossbeam_epoch::pin();
        mm.vma_tree(&guard)
            .iter()
            .zip(smaps)
            .map(|(v, s)| VmaInfo {
                start: v.start(),
                end: v.end(),
                perms: s.perms.clone(),
                flags: v.flags(),
                anon_vma: v.anon_vma().map(|a| a.id),
                smaps: s,
            })
            .collect()
    };
    let (page_tables, folios) = walk(m, mm);
    MmInfo {
        id: mm.id,
        status: proc::status(mm),
        vmas,
        page_tables,
        folios,
    }
}

fn walk(m: &Machine, mm: &Mm) -> (PageTables, BTreeMap<String, usize>) {
    let mem = &m.mem;
    let next = |e: u64| (e & PTE_PFN_MASK) >> 12;
    let mut pt = PageTables::default();
    let mut seen = HashSet::new();
    let mut folios: BTreeMap<String, usize> = BTreeMap::new();
    let _g = mm.mmap_lock.read();
    for gi in 0..256u64 {
        let g = entry_get(mem, mm.pgd, gi as usize);
        if g == 0 {
            continue;
        }
        pt.pud_tables += 1;
        for ui in 0..PTRS_PER_TABLE as u64 {
            let u = entry_get(mem, next(g), ui as usize);
            if u == 0 {
                continue;
            }
            pt.pmd_tables += 1;
            for mi in 0..PTRS_PER_TABLE as u64 {
                let base = gi * PGDIR_SIZE + ui * PUD_SIZE + mi * PMD_SIZE;
                let pmd = Pmd(entry_get(mem, next(u), mi as usize));
                if pmd.none() {
                    continue;
                }
                if pmd.trans_huge() {
                    if pmd.special() {
                        pt.huge_zero_pmds += 1;
                    } else {
                        pt.huge_pmds += 1;
                        *folios.entry("2048 PMD".into()).or_default() += 1;
                    }
                    continue;
                }
                let (mut present, mut zero) = (0, 0);
                for ti in 0..PTRS_PER_TABLE {
                    let pte = Pte(entry_get(mem, pmd.table_pfn(), ti));
                    if pte.none() {
                        continue;
                    }
                    present += 1;
                    if pte.special() {
                        zero += 1;
                        continue;
                    }
                    let f = mem.page_folio(pte.pfn());
                    if seen.insert(f.pfn()) {
                        let kb = (f.nr_pages(mem) * PAGE_SIZE) >> 10;
                        *folios.entry(kb.to_string()).or_default() += 1;
                    }
                }
                pt.pte_tables.push(PteTableInfo {
                    addr: base,
                    present,
                    zero_page: zero,
                });
            }
        }
    }
    (pt, folios)
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "== machine: {}", self.machine)?;
        let mi = &self.meminfo;
        writeln!(
            f,
            "MemTotal: {} kB, MemFree: {} kB, CommitLimit: {} kB, Committed_AS: {} kB",
            mi.mem_total, mi.mem_free, mi.commit_limit, mi.committed_as
        )?;
        for mm in &self.mms {
            writeln!(f, "== mm {}", mm.id)?;
            write!(f, "{}", mm.status)?;
            writeln!(
                f,
                "{:<29} {:<5} {:>9} {:>9} {:>9} {:>9} {:>8}",
                "VMA", "perm", "size kB", "Rss", "Pss", "AnonHuge", "anon_vma"
            )?;
            for v in &mm.vmas {
                writeln!(
                    f,
                    "{:#014x}-{:#014x} {:<5} {:>9} {:>9} {:>9} {:>9} {:>8}",
                    v.start,
                    v.end,
                    v.perms,
                    v.smaps.size,
                    v.smaps.rss,
                    v.smaps.pss,
                    v.smaps.anon_huge_pages,
                    v.anon_vma.map_or("-".into(), |a| a.to_string())
                )?;
            }
            let p = &mm.page_tables;
            writeln!(
                f,
                "page tables: {} PUD, {} PMD, {} PTE tables; {} huge PMDs, {} huge zero PMDs",
                p.pud_tables,
                p.pmd_tables,
                p.pte_tables.len(),
                p.huge_pmds,
                p.huge_zero_pmds
            )?;
            for t in &p.pte_tables {
                let bar = "#".repeat(t.present * 32 / PTRS_PER_TABLE);
                writeln!(
                    f,
                    "  PTE table {:#014x}: {:>3}/512 used ({} zero page) {bar}",
                    t.addr, t.present, t.zero_page
                )?;
            }
            let fs: Vec<String> = mm
                .folios
                .iter()
                .map(|(k, n)| format!("{k}K: {n}"))
                .collect();
            writeln!(
                f,
                "folios mapped: {}",
                if fs.is_empty() {
                    "none".into()
                } else {
                    fs.join(", ")
                }
            )?;
        }
        writeln!(f, "== TLBs")?;
        for t in &self.tlbs {
            let e: Vec<String> = t
                .entries
                .iter()
                .map(|(mm, kb, n)| format!("mm {mm}: {n} x {kb}K"))
                .collect();
            writeln!(
                f,
                "CPU {}: loaded mm {}, {} misses; {}",
                t.cpu,
                t.loaded_mm.map_or("-".into(), |m| m.to_string()),
                t.misses,
                if e.is_empty() {
                    "empty".into()
                } else {
                    e.join(", ")
                }
            )?;
        }
        writeln!(f, "== counters (non-zero); free pages {}", self.free_pages)?;
        for (n, v) in &self.counters.events {
            if *v != 0 {
                writeln!(f, "{n:<34} {v}")?;
            }
        }
        for (n, v) in &self.counters.node {
            if *v != 0 {
                writeln!(f, "{n:<34} {v}")?;
            }
        }
        for (size, stats) in &self.counters.mthp {
            for (n, v) in stats {
                if *v != 0 {
                    writeln!(f, "{:<34} {v}", format!("{size}/{n}"))?;
                }
            }
        }
        Ok(())
    }
}
