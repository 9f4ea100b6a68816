//! A picture of the machine for people and programs: each address space's
//! VMAs, its page tables (which exist and how full they are), the folios it
//! maps by size, every CPU's TLB, and the counters. [`inspect`] takes it
//! (the machine should be quiescent); `Display` prints it as tables and
//! `serde` serialises it.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::ops::ControlFlow;

use serde::Serialize;

use crate::machine::Machine;
use crate::mm::Mm;
use crate::pgtable::entry::{Pmd, Pte};
use crate::pgtable::pagewalk::{
    walk_page_range, MmWalkOps, TableId, TableLevel, WalkAction, WalkLock,
};
use crate::pgtable::{PmdSlot, PTRS_PER_TABLE};
use crate::phys::{Pfn, PAGE_SIZE};
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
    /// Entries that are not none: present ones and the others.
    pub present: usize,
    pub zero_page: usize,
    /// Non-present entries: migration entries.
    pub migration: usize,
    /// Non-present entries: PTE markers (guard regions, poisoned pages).
    pub markers: usize,
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
    /// Pages mapped on each node (`/proc/<pid>/numa_maps`' `N<node>=`
    /// figures, for the whole address space).
    pub pages_by_node: Vec<u64>,
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
    /// Every tunable and its value, by name.
    pub tunables: BTreeMap<&'static str, &'static str>,
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
            for e in c.tlb.entries() {
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
        tunables: m.tunables.list().into_iter().collect(),
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
        let guard = crate::sync::epoch::pin();
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
    let (page_tables, folios, pages_by_node) = walk(m, mm);
    MmInfo {
        id: mm.id,
        status: proc::status(mm),
        vmas,
        page_tables,
        folios,
        pages_by_node,
    }
}

fn walk(m: &Machine, mm: &Mm) -> (PageTables, BTreeMap<String, usize>, Vec<u64>) {
    let _g = mm.mmap_lock.read();
    let mut w = InspectWalk {
        m,
        pt: PageTables::default(),
        seen: HashSet::new(),
        folios: BTreeMap::new(),
        by_node: vec![0; m.mem.nodes.len()],
    };
    // A lockless walk, as a reader beside running CPUs: each figure is
    // what one atomic read of its entry saw.
    let top = 1u64 << 47;
    let flow = walk_page_range(&m.mem, &mm.pgd, 0, top, WalkLock::Lockless, &mut w);
    debug_assert!(flow.is_continue());
    (w.pt, w.folios, w.by_node)
}

/// What `inspect` counts in one address space's tables.
struct InspectWalk<'a> {
    m: &'a Machine,
    pt: PageTables,
    seen: HashSet<Pfn>,
    folios: BTreeMap<String, usize>,
    by_node: Vec<u64>,
}

impl MmWalkOps for InspectWalk<'_> {
    type Break = std::convert::Infallible;

    fn table(&mut self, level: TableLevel, _t: TableId, addr: u64) -> ControlFlow<Self::Break> {
        match level {
            TableLevel::Pud => self.pt.pud_tables += 1,
            TableLevel::Pmd => self.pt.pmd_tables += 1,
            TableLevel::Pte => self.pt.pte_tables.push(PteTableInfo {
                addr,
                present: 0,
                zero_page: 0,
                migration: 0,
                markers: 0,
            }),
            TableLevel::Deposited => {}
        }
        ControlFlow::Continue(())
    }

    fn pmd_entry(
        &mut self,
        _slot: PmdSlot,
        pmd: Pmd,
        _addr: u64,
        _next: u64,
    ) -> ControlFlow<Self::Break, WalkAction> {
        if !pmd.trans_huge() {
            return ControlFlow::Continue(WalkAction::Subtree);
        }
        if pmd.special() {
            self.pt.huge_zero_pmds += 1;
        } else {
            self.pt.huge_pmds += 1;
            *self.folios.entry("2048 PMD".into()).or_default() += 1;
            self.by_node[crate::phys::PhysMem::nid(pmd.pfn())] += crate::phys::HPAGE_PMD_NR;
        }
        ControlFlow::Continue(WalkAction::Continue)
    }

    fn pte_entry(&mut self, pte: Pte, _addr: u64) -> ControlFlow<Self::Break> {
        let mem = &self.m.mem;
        let table = self.pt.pte_tables.last_mut().expect("entered its table");
        table.present += 1;
        if pte.is_swap() {
            if pte.swp_entry().is_migration() {
                table.migration += 1;
            } else {
                table.markers += 1;
            }
            return ControlFlow::Continue(());
        }
        if pte.special() {
            table.zero_page += 1;
            return ControlFlow::Continue(());
        }
        self.by_node[crate::phys::PhysMem::nid(pte.pfn())] += 1;
        let f = mem.page_folio(pte.pfn());
        if self.seen.insert(f.pfn()) {
            let kb = (f.nr_pages(mem) * PAGE_SIZE) >> 10;
            *self.folios.entry(kb.to_string()).or_default() += 1;
        }
        ControlFlow::Continue(())
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "== machine: {}", self.machine)?;
        let t: Vec<String> = self
            .tunables
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        writeln!(f, "tunables: {}", t.join(" "))?;
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
                let mut extra = String::new();
                if t.migration != 0 {
                    extra += &format!(", {} migrating", t.migration);
                }
                if t.markers != 0 {
                    extra += &format!(", {} markers", t.markers);
                }
                writeln!(
                    f,
                    "  PTE table {:#014x}: {:>3}/512 used ({} zero page{extra}) {bar}",
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
            if mm.pages_by_node.len() > 1 {
                let n: Vec<String> = mm
                    .pages_by_node
                    .iter()
                    .enumerate()
                    .map(|(i, p)| format!("N{i}={p}"))
                    .collect();
                writeln!(f, "pages by node: {}", n.join(" "))?;
            }
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
