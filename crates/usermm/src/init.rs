//! Booting a machine (init/main.c's `mm_core_init` and the `*_init` calls
//! that follow it): the machine's data ([`Machine::alloc`]), then the hooks
//! through which the allocator, the lowest layer, reaches the layers above
//! it: kswapd and direct reclaim ([`crate::vmscan`]), and the flushes that
//! MIGRC and LUF deferred ([`crate::migrc`]). The kernel calls up from
//! mm/page_alloc.c directly; here the allocator knows only the trait
//! [`Reclaimer`], and this table is its one implementation.

use crate::errno::KResult;
use crate::machine::{Machine, MachineConfig};
use crate::phys::page_alloc::Reclaimer;
use crate::sync::Arc;
use crate::vmstat::Event;

impl Machine {
    /// Boot a machine as `config` describes it; EINVAL for a configuration
    /// that [`MachineConfig::validate`] refuses, ENOMEM where the host
    /// cannot reserve its memory.
    pub fn new(config: MachineConfig) -> KResult<Arc<Machine>> {
        let m = Machine::alloc(config)?;
        let weak: std::sync::Weak<dyn Reclaimer> = Arc::downgrade(&m) as std::sync::Weak<Machine>;
        m.mem.set_reclaimer(weak);
        Ok(m)
    }
}

impl Reclaimer for Machine {
    fn wakeup_kswapd(&self, nid: usize, order: u32) {
        crate::vmscan::kswapd::wakeup_kswapd(self, nid, order);
    }

    fn try_to_free_pages(&self, nid: usize, order: u32, cpu: usize) -> u64 {
        // The allocating thread plays `cpu` (it holds its OnCpu): it
        // reclaims as that CPU.
        let Some(oncpu) = self.on_this_cpu(cpu) else {
            return 0;
        };
        let r = crate::vmscan::try_to_free_pages(&oncpu, nid, order);
        // shrink_node: progress revives a hopeless kswapd.
        if r > 0 {
            self.mem.nodes[nid].kswapd_clear_hopeless();
        }
        r
    }

    fn migrc_flush_free(&self, cpu: usize, why: Event) -> bool {
        if !self.mem.migrc.pending() {
            return false;
        }
        // As for reclaim: only the thread that plays `cpu` flushes as it.
        match self.on_this_cpu(cpu) {
            Some(oncpu) => crate::migrc::migrc_flush_free_folios(&oncpu, why),
            None => false,
        }
    }

    fn lru_add_drain(&self, cpu: usize) {
        crate::swap::lru_add_drain(&self.mem, cpu);
    }

    fn luf_flush(&self, cpu: usize, cpumask: u64) {
        // The thread that plays `cpu` flushes as it; any other (a kernel
        // thread: kswapd's slot is shared by the nodes' threads) sends as
        // a kswapd CPU, which no user mm is loaded on and no mask names.
        if let Some(oncpu) = self.on_this_cpu(cpu) {
            crate::migrc::luf_flush_cpus(&oncpu, cpumask);
        } else if let Some(k) = self.kswapd.first() {
            crate::migrc::luf_flush_cpus(&self.on_kthread_cpu(&k.cpu), cpumask);
        }
    }
}
