//! For the loom models of page-table code: a small machine's memory with
//! one empty PTE table.

use std::sync::Arc;

use usermm::pgtable::{Pgd, PmdSlot, Tracking};
use usermm::phys::{NodeConfig, PhysMem, Tier};
use usermm::sync::SpinLock;

/// 4 MiB of memory, and the PMD entry over `addr` pointing to an empty,
/// untracked PTE table.
pub fn one_pte_table(addr: u64) -> (Arc<PhysMem>, PmdSlot) {
    let node = NodeConfig {
        size_bytes: 4 << 20,
        tier: Tier::Dram,
        has_cpus: true,
    };
    let mem = Arc::new(PhysMem::new(&[node], &[0, 0]).expect("memory"));
    let pgd = Pgd::alloc(&mem, 0, 0).expect("pgd");
    let (slot, _) = pgd.pmd_alloc(&mem, &SpinLock::new(), addr, 0).expect("pmd");
    slot.pte_alloc(&mem, 0, Tracking::Untracked).expect("pte");
    (mem, slot)
}
