//! The machine: physical memory, CPUs, the knobs, and [`OnCpu`], the handle
//! through which a thread runs code on one CPU.

use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

use crate::cpu::{self, Cpu, MAX_CPUS};
use crate::errno::{Errno, KResult};
use crate::mm::Mm;
use crate::phys::{pg, Folio, NodeConfig, Pfn, PhysMem, Tier};
use crate::sync::{Arc, AtomicBool, AtomicU8, Mutex, Ordering};
use crate::util::Overcommit;
use crate::vmstat::{Event, VmStat};

/// How the machine is built.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MachineConfig {
    pub nodes: Vec<NodeConfig>,
    /// The node of each CPU.
    pub cpus: Vec<usize>,
}

impl Default for MachineConfig {
    /// One 4 GiB DRAM node with four CPUs.
    fn default() -> Self {
        MachineConfig::single_node(4 << 30, 4)
    }
}

impl MachineConfig {
    /// One DRAM node of `bytes` with `nr_cpus` CPUs.
    pub fn single_node(bytes: u64, nr_cpus: usize) -> MachineConfig {
        MachineConfig {
            nodes: vec![NodeConfig {
                size_bytes: bytes,
                tier: Tier::Dram,
                has_cpus: true,
            }],
            cpus: vec![0; nr_cpus],
        }
    }

    /// The tiered machine (`--machine tiered`): node 0, 512 MiB of DRAM
    /// with four CPUs; node 1, 2 GiB of slow (CXL-like) memory without
    /// CPUs. The experiments' default region (1 GiB) overflows the fast
    /// tier.
    pub fn tiered() -> MachineConfig {
        MachineConfig::two_tiers(512 << 20, 2 << 30, 4)
    }

    /// Two tiers: node 0, `dram` bytes of DRAM with `nr_cpus` CPUs; node 1,
    /// `slow` bytes of slow memory without CPUs.
    pub fn two_tiers(dram: u64, slow: u64, nr_cpus: usize) -> MachineConfig {
        MachineConfig {
            nodes: vec![
                NodeConfig {
                    size_bytes: dram,
                    tier: Tier::Dram,
                    has_cpus: true,
                },
                NodeConfig {
                    size_bytes: slow,
                    tier: Tier::Slow,
                    has_cpus: false,
                },
            ],
            cpus: vec![0; nr_cpus],
        }
    }

    /// Whether the model can build this machine; the error says what is
    /// wrong, for people.
    pub fn validate(&self) -> Result<(), String> {
        use crate::phys::{MAX_PAGE_ORDER, NODE_PFN_SHIFT, PAGE_SIZE};
        if self.nodes.is_empty() {
            return Err("a machine needs at least one node".into());
        }
        if self.cpus.is_empty() || self.cpus.len() > MAX_CPUS {
            return Err(format!(
                "a machine has 1 to {MAX_CPUS} CPUs, not {}",
                self.cpus.len()
            ));
        }
        for (id, n) in self.nodes.iter().enumerate() {
            let min = PAGE_SIZE << MAX_PAGE_ORDER;
            let max = (PAGE_SIZE << NODE_PFN_SHIFT) - PAGE_SIZE;
            if n.size_bytes < min || n.size_bytes > max {
                return Err(format!(
                    "node {id}: {} bytes; a node holds at least {} MiB and less than {} GiB",
                    n.size_bytes,
                    min >> 20,
                    (max >> 30) + 1
                ));
            }
            if n.size_bytes % PAGE_SIZE != 0 {
                return Err(format!(
                    "node {id}: {} bytes is not a whole number of {} KiB pages",
                    n.size_bytes,
                    PAGE_SIZE >> 10
                ));
            }
        }
        for (cpu, &node) in self.cpus.iter().enumerate() {
            match self.nodes.get(node) {
                None => return Err(format!("CPU {cpu} is on node {node}, which does not exist")),
                Some(n) if !n.has_cpus => {
                    return Err(format!("CPU {cpu} is on node {node}, a node without CPUs"))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Total memory of all nodes, in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.nodes.iter().map(|n| n.size_bytes).sum()
    }
}

/// `1 node: node 0 1024 MiB dram, CPUs 0-1`, for reports.
impl std::fmt::Display for MachineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.nodes.len() == 1 { "" } else { "s" };
        write!(f, "{} node{s}", self.nodes.len())?;
        for (id, n) in self.nodes.iter().enumerate() {
            let cpus: Vec<usize> = (0..self.cpus.len())
                .filter(|&c| self.cpus[c] == id)
                .collect();
            let tier = match n.tier {
                Tier::Dram => "DRAM",
                Tier::Slow => "slow",
            };
            let size = if n.size_bytes % (1 << 30) == 0 {
                format!("{} GiB", n.size_bytes >> 30)
            } else {
                format!("{} MiB", n.size_bytes >> 20)
            };
            write!(
                f,
                "{} node {id} {size} {tier}",
                if id == 0 { ":" } else { ";" }
            )?;
            match (cpus.first(), cpus.last()) {
                (Some(a), Some(b)) if cpus.len() == b - a + 1 && a != b => {
                    write!(f, ", CPUs {a}-{b}")?
                }
                (Some(_), _) => write!(
                    f,
                    ", CPU{} {}",
                    if cpus.len() == 1 { "" } else { "s" },
                    cpus.iter()
                        .map(|c| c.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                )?,
                (None, _) => write!(f, ", no CPUs")?,
            }
        }
        Ok(())
    }
}

/// A THP knob's value, as the sysfs files spell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThpMode {
    Always,
    Inherit,
    Madvise,
    Never,
}

impl ThpMode {
    pub fn parse(s: &str) -> Option<ThpMode> {
        match s {
            "always" => Some(ThpMode::Always),
            "inherit" => Some(ThpMode::Inherit),
            "madvise" => Some(ThpMode::Madvise),
            "never" => Some(ThpMode::Never),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ThpMode::Always => "always",
            ThpMode::Inherit => "inherit",
            ThpMode::Madvise => "madvise",
            ThpMode::Never => "never",
        }
    }
    fn from_u8(v: u8) -> ThpMode {
        [
            ThpMode::Always,
            ThpMode::Inherit,
            ThpMode::Madvise,
            ThpMode::Never,
        ][v as usize]
    }
}

/// `/sys/kernel/mm/transparent_hugepage/enabled` and the per-size
/// `hugepages-<size>kB/enabled` files, changeable while the machine runs.
/// Each store is followed, as sysfs's is, by `start_stop_khugepaged`,
/// whose part the model keeps is the reserve: while 2 MiB THPs are
/// enabled the machine keeps the larger one khugepaged recommends
/// ([`PhysMem::set_recommended_min_free_kbytes`]).
pub struct ThpKnobs {
    enabled: AtomicU8,
    per_order: [AtomicU8; 10],
    /// `transparent_hugepage/use_zero_page`: read faults in THP-eligible
    /// ranges map the huge zero page.
    pub use_zero_page: AtomicBool,
    /// The memory whose reserve follows the knobs.
    mem: Arc<PhysMem>,
    /// `khugepaged_mutex`: the knobs are read, and the reserve set from
    /// them, under it, so that of two stores the last one's reserve is
    /// the one that stays.
    khugepaged_mutex: Mutex<()>,
}

/// `hugepage_init`: a machine with less memory than this boots with THPs
/// disabled, "where the extra memory used could hurt more than TLB
/// overhead is likely to save".
const THP_MIN_TOTALRAM: u64 = 512 << 20;

impl ThpKnobs {
    /// The kernel's defaults with `CONFIG_TRANSPARENT_HUGEPAGE_MADVISE`:
    /// top level `madvise`, 2 MiB `inherit`, the other sizes `never`; and
    /// the reserve set for them, as `hugepage_init` starts khugepaged at
    /// boot. A machine of less than 512 MiB boots as `hugepage_init`
    /// leaves it: every flag clear (top level `never`, no huge zero page)
    /// and khugepaged not started, so with the machine's own reserve.
    fn new(mem: Arc<PhysMem>) -> Self {
        let k = ThpKnobs {
            enabled: AtomicU8::new(ThpMode::Madvise as u8),
            per_order: std::array::from_fn(|_| AtomicU8::new(ThpMode::Never as u8)),
            use_zero_page: AtomicBool::new(true),
            mem,
            khugepaged_mutex: Mutex::new(()),
        };
        k.per_order[crate::phys::HPAGE_PMD_ORDER as usize]
            .store(ThpMode::Inherit as u8, Ordering::Relaxed);
        if k.mem.nr_pages() << crate::phys::PAGE_SHIFT < THP_MIN_TOTALRAM {
            k.enabled.store(ThpMode::Never as u8, Ordering::Relaxed);
            k.use_zero_page.store(false, Ordering::Relaxed);
            return k;
        }
        k.start_stop_khugepaged();
        k
    }

    /// `hugepage_pmd_enabled`: 2 MiB anonymous THPs may be made, by
    /// their own knob or by the top level's through `inherit`. (The
    /// kernel also counts shmem's and read-only file THPs, which the
    /// model has not.)
    pub fn hugepage_pmd_enabled(&self) -> bool {
        match self.order(crate::phys::HPAGE_PMD_ORDER) {
            ThpMode::Always | ThpMode::Madvise => true,
            ThpMode::Inherit => self.enabled() != ThpMode::Never,
            ThpMode::Never => false,
        }
    }

    /// `start_stop_khugepaged`, after every store to a knob: the model
    /// has no khugepaged thread to start or stop, only its reserve.
    fn start_stop_khugepaged(&self) {
        let _khugepaged = self.khugepaged_mutex.lock();
        self.mem
            .set_recommended_min_free_kbytes(self.hugepage_pmd_enabled());
    }

    pub fn enabled(&self) -> ThpMode {
        ThpMode::from_u8(self.enabled.load(Ordering::Relaxed))
    }
    /// Top level: always, madvise or never (inherit is refused, as by sysfs).
    pub fn set_enabled(&self, mode: ThpMode) -> KResult<()> {
        if mode == ThpMode::Inherit {
            return Err(Errno::EINVAL);
        }
        self.enabled.store(mode as u8, Ordering::Relaxed);
        self.start_stop_khugepaged();
        Ok(())
    }
    pub fn order(&self, order: u32) -> ThpMode {
        ThpMode::from_u8(self.per_order[order as usize].load(Ordering::Relaxed))
    }
    /// `hugepages-<size>kB/enabled`; anonymous mTHP orders are 2..=9.
    pub fn set_order(&self, order: u32, mode: ThpMode) -> KResult<()> {
        if !(2..=crate::phys::HPAGE_PMD_ORDER).contains(&order) {
            return Err(Errno::EINVAL);
        }
        self.per_order[order as usize].store(mode as u8, Ordering::Relaxed);
        self.start_stop_khugepaged();
        Ok(())
    }
    /// Set one size to `always` and every other to `never`, the top level to
    /// `never`: the state the folio-size benchmarks want. The reserve is
    /// set once, for the end state (through sysfs each of the writes would
    /// set it, each from the watermarks the last left).
    pub fn only_order(&self, order: u32) {
        self.enabled.store(ThpMode::Never as u8, Ordering::Relaxed);
        for o in 2..=crate::phys::HPAGE_PMD_ORDER {
            self.per_order[o as usize].store(
                if o == order {
                    ThpMode::Always
                } else {
                    ThpMode::Never
                } as u8,
                Ordering::Relaxed,
            );
        }
        self.start_stop_khugepaged();
    }
}

pub use crate::tunable::Tunables;

pub struct Machine {
    pub mem: Arc<PhysMem>,
    pub cpus: Box<[Cpu]>,
    pub thp: ThpKnobs,
    pub tunables: Tunables,
    /// `vm.overcommit_*` and the commitment (`vm_committed_as`).
    pub overcommit: Overcommit,
    /// The shared zero page (`ZERO_PAGE(0)`).
    pub zero_pfn: Pfn,
    /// The huge zero folio, allocated on first use (`get_huge_zero_folio`);
    /// None inside if that allocation failed.
    huge_zero: crate::sync::OnceLock<Option<Pfn>>,
    mms: Mutex<Vec<crate::sync::Weak<Mm>>>,
    pub config: MachineConfig,
    /// `/sys/kernel/mm/numa/demotion_enabled` (off by default, as in the
    /// kernel).
    demotion_enabled: AtomicBool,
    /// One kswapd per node, started on its first wakeup.
    kswapd: Box<[Kswapd]>,
    /// Which CPU each kernel thread runs on ([`crate::sched`]).
    pub sched: crate::sched::Runqueues,
    /// The host CPUs of the thread that made the machine, which its
    /// kswapds run on.
    host_cpus: crate::sched::HostCpus,
    /// This machine, for the threads it starts.
    me: crate::sync::OnceLock<std::sync::Weak<Machine>>,
    /// NUMA balancing's knobs.
    pub numa: crate::numa_balancing::NumaKnobs,
    /// MIGRC's deferred flushes and kept sources (tunable `migrc`).
    pub migrc: crate::migrc::Migrc,
    /// Each node's promotion rate-limit window.
    promote_rl: Box<[crate::numa_balancing::PromoteRateLimit]>,
    /// When the machine was made (the model's jiffies).
    born: std::time::Instant,
}

/// A node's kswapd (`pgdat->kswapd`): a host thread of its own, which
/// runs each of its passes on a CPU of its node taken from the user thread
/// there ([`crate::sched`]), or beside the CPUs when none runs user code.
/// It sends its shootdowns from a CPU structure of its own, which never
/// runs user code, so that they reach every user CPU but the one it took,
/// which is lazy meanwhile (as the kernel's kswapd, a kernel thread,
/// leaves the CPU it runs on).
struct Kswapd {
    cpu: Cpu,
    started: std::sync::Once,
    wait: Arc<KswapdWait>,
    /// A run is in progress.
    running: AtomicBool,
}

/// `kswapd_wait`, shared with the thread, which sleeps on it without
/// holding the machine (so that the machine can go, and wake it to end).
#[derive(Default)]
struct KswapdWait {
    state: std::sync::Mutex<KswapdState>,
    cond: std::sync::Condvar,
}

#[derive(Default)]
struct KswapdState {
    woken: bool,
    stop: bool,
}

impl Machine {
    pub fn new(config: MachineConfig) -> KResult<Arc<Machine>> {
        if config.validate().is_err() {
            return Err(Errno::EINVAL);
        }
        let mem = Arc::new(PhysMem::new(&config.nodes, &config.cpus)?);
        let zero_pfn = mem
            .alloc_pages(
                0,
                0,
                0,
                crate::phys::AllocFlags {
                    zero: true,
                    ..Default::default()
                },
            )
            .ok_or(Errno::ENOMEM)?;
        mem.page(zero_pfn).set(pg::ZERO);
        let overcommit = Overcommit::new(mem.nr_pages());
        let cpus = config
            .cpus
            .iter()
            .enumerate()
            .map(|(id, &node)| Cpu::new(id, node))
            .collect();
        let nr_cpus = config.cpus.len();
        let nr_nodes = config.nodes.len();
        let kswapd: Box<[Kswapd]> = (0..nr_nodes)
            .map(|nid| Kswapd {
                cpu: Cpu::new(nr_cpus, nid),
                started: std::sync::Once::new(),
                wait: Arc::new(KswapdWait::default()),
                running: AtomicBool::new(false),
            })
            .collect();
        let m = Arc::new(Machine {
            thp: ThpKnobs::new(mem.clone()),
            mem,
            cpus,
            tunables: Tunables::default(),
            overcommit,
            zero_pfn,
            huge_zero: crate::sync::OnceLock::new(),
            mms: Mutex::new(Vec::new()),
            config,
            demotion_enabled: AtomicBool::new(false),
            promote_rl: (0..nr_nodes).map(|_| Default::default()).collect(),
            kswapd,
            sched: crate::sched::Runqueues::new(nr_cpus),
            host_cpus: crate::sched::HostCpus::of_this_thread(),
            me: crate::sync::OnceLock::new(),
            numa: Default::default(),
            migrc: Default::default(),
            born: std::time::Instant::now(),
        });
        let _ = m.me.set(Arc::downgrade(&m));
        let weak: std::sync::Weak<dyn crate::phys::page_alloc::Reclaimer> =
            Arc::downgrade(&m) as std::sync::Weak<Machine>;
        m.mem.set_reclaimer(weak);
        Ok(m)
    }

    pub fn vmstat(&self) -> &VmStat {
        &self.mem.vmstat
    }

    /// Milliseconds since the machine was made (`jiffies_to_msecs(jiffies)`).
    pub fn jiffies_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// Node `nid`'s promotion rate-limit window.
    pub(crate) fn promote_rate_limit(
        &self,
        nid: usize,
    ) -> &crate::numa_balancing::PromoteRateLimit {
        &self.promote_rl[nid.min(self.promote_rl.len() - 1)]
    }

    /// `demotion_enabled`: may reclaim demote anon folios to a slower tier?
    pub fn demotion_enabled(&self) -> bool {
        self.demotion_enabled.load(Ordering::Relaxed)
    }

    /// The shootdown cost model on every CPU (see [`crate::cpu::Cpu::set_ipi_cost`]);
    /// `(0, 0)`, the default, is off.
    pub fn set_ipi_cost(&self, send_ns: u64, recv_ns: u64) {
        for c in self.cpus.iter() {
            c.set_ipi_cost(send_ns, recv_ns);
        }
    }

    /// Whether kswapd runs on a CPU of its node, which stops running user
    /// code meanwhile (on, the default: the kernel's scheduler does so), or
    /// on a host thread beside the CPUs (off: every CPU keeps running user
    /// code while kswapd runs, which a test of concurrency may want, and
    /// where the host has no core to spare, kswapd's shootdowns wait for
    /// their targets' threads to get one back). See [`crate::sched`].
    pub fn set_kswapd_on_cpus(&self, on: bool) {
        self.sched.set_on_cpus(on);
    }

    /// The CPUs node `nid`'s kswapd may run on: the node's, or all if it
    /// has none (the kthread core's affinity for a kthread created on a
    /// node, since 6.14; `kswapd`'s `cpumask_of_node`, when not empty,
    /// before).
    fn kswapd_cpus_allowed(&self, nid: usize) -> u64 {
        let mask_of = |pick: &dyn Fn(usize) -> bool| {
            (0..self.cpus.len().min(cpu::MAX_CPUS))
                .filter(|&id| pick(id))
                .fold(0u64, |m, id| m | (1 << id))
        };
        match mask_of(&|id| self.config.cpus[id] == nid) {
            0 => mask_of(&|_| true),
            node => node,
        }
    }

    /// `/sys/kernel/mm/numa/demotion_enabled`.
    pub fn set_demotion_enabled(&self, on: bool) {
        let before = self.demotion_enabled.swap(on, Ordering::Relaxed);
        // `demotion_enabled_store`: kswapd's failures may not hold under
        // the new policy, so switching demotion on revives every node's.
        if on && !before {
            for node in &self.mem.nodes {
                node.kswapd_clear_hopeless();
            }
        }
    }

    /// Wait until no kswapd is running or has a wakeup pending: the
    /// machine is quiescent for the invariant checker once its CPUs are
    /// too. The caller's CPU must be idle ([`OnCpu::idle`]): kswapd's
    /// shootdowns wait for CPUs in user mode. Panics after ten seconds.
    pub fn kswapd_quiesce(&self) {
        if !self.kswapd_wait_idle(std::time::Duration::from_secs(10)) {
            panic!(
                "kswapd still busy after ten seconds (a CPU left in user mode blocks its shootdowns)"
            );
        }
    }

    /// [`Self::kswapd_quiesce`] for at most `timeout`: whether every
    /// kswapd is idle.
    pub fn kswapd_wait_idle(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let busy = self.kswapd.iter().any(|k| {
                k.running.load(Ordering::Acquire)
                    || k.wait.state.lock().map(|s| s.woken).unwrap_or(false)
            });
            if !busy {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Run the calling thread on CPU `id` until the handle is dropped.
    pub fn bind(&self, id: usize) -> KResult<OnCpu<'_>> {
        let cpu = self.cpus.get(id).ok_or(Errno::EINVAL)?;
        if !cpu.try_bind() {
            return Err(Errno::EBUSY);
        }
        crate::sync::set_this_cpu(self.mem.machine_id(), id);
        self.mem.rcu.bind(Some(id));
        Ok(OnCpu {
            m: self,
            cpu,
            _not_send: PhantomData,
            numa_tick: std::cell::Cell::new(0),
        })
    }

    /// `get_huge_zero_folio`: the PMD-sized zero folio, allocated and
    /// zeroed on first use; None if it cannot be allocated.
    pub fn huge_zero_pfn(&self, cpu: usize) -> Option<Pfn> {
        *self.huge_zero.get_or_init(|| {
            let order = crate::phys::HPAGE_PMD_ORDER;
            match self
                .mem
                .folio_alloc(0, order, cpu, crate::phys::AllocFlags::ZERO)
            {
                Some(f) => {
                    self.mem.page(f.pfn()).set(pg::ZERO);
                    self.vmstat()
                        .count(cpu, crate::vmstat::Event::THP_ZERO_PAGE_ALLOC, 1);
                    Some(f.pfn())
                }
                None => {
                    self.vmstat()
                        .count(cpu, crate::vmstat::Event::THP_ZERO_PAGE_ALLOC_FAILED, 1);
                    None
                }
            }
        })
    }

    /// The huge zero folio's PFN, if it has been allocated.
    pub fn huge_zero_pfn_if_allocated(&self) -> Option<Pfn> {
        self.huge_zero.get().copied().flatten()
    }

    /// `is_huge_zero_pfn`.
    pub fn is_huge_zero_pfn(&self, pfn: Pfn) -> bool {
        self.huge_zero_pfn_if_allocated() == Some(pfn)
    }

    /// Every live address space.
    pub fn mms(&self) -> Vec<Arc<Mm>> {
        let mut v = self.mms_referenced();
        v.retain(|m| !m.dead.load(Ordering::Relaxed));
        v
    }

    /// Every address space still referenced, exited ones included (an
    /// exited mm keeps its PGD until its last reference goes, as
    /// `__mmdrop` frees it).
    pub fn mms_referenced(&self) -> Vec<Arc<Mm>> {
        let mut v = self.mms.lock();
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(|w| w.upgrade()).collect()
    }

    /// The address space with id `id`, if it is still referenced (`vma->vm_mm`
    /// for an rmap walk, which finds VMAs by their anon_vma).
    pub fn mm_by_id(&self, id: u64) -> Option<Arc<Mm>> {
        let v = self.mms.lock();
        v.iter().filter_map(|w| w.upgrade()).find(|m| m.id == id)
    }

    pub(crate) fn register_mm(&self, mm: &Arc<Mm>) {
        self.mms.lock().push(Arc::downgrade(mm));
    }

    /// Back all frames with host memory now, so timed runs do not include
    /// the host's first-touch faults.
    pub fn prefault(&self) {
        self.mem.prefault();
    }

    /// Wait until page tables freed by earlier operations have gone back to
    /// the allocator (an `rcu_barrier`). The grace period ends when every
    /// thread of the process that holds an epoch pin (a fault holds one
    /// throughout) has dropped it; the wait gives up after ten seconds, as
    /// a pin held that long is a bug of its own. Callbacks that CPUs queued
    /// start their grace periods here, and those done are invoked here,
    /// whichever CPU queued them ([`crate::rcu::Rcu::barrier_step`]): an
    /// idle CPU would not come for them.
    pub fn rcu_barrier(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            self.mem.rcu.barrier_step();
            let g = crate::sync::epoch::pin();
            g.flush();
            drop(g);
            if self.mem.rcu_pending() == 0 {
                return;
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        // No CPU runs again: what they queued is invoked by whoever
        // collects it, never left in lists the memory owns.
        self.mem.rcu.offline();
        for k in self.kswapd.iter() {
            if let Ok(mut s) = k.wait.state.lock() {
                s.stop = true;
            }
            k.wait.cond.notify_all();
        }
    }
}

impl crate::phys::page_alloc::Reclaimer for Machine {
    /// `wakeup_kswapd`: start the node's kswapd if it has not run yet, and
    /// wake it, unless it has failed too often (`kswapd_failures`).
    fn wakeup_kswapd(&self, nid: usize, _order: u32) {
        let Some(k) = self.kswapd.get(nid) else {
            return;
        };
        if self.mem.nodes[nid].kswapd_hopeless() {
            // Model-only: the kernel traces nothing here.
            let v = &self.mem.vmstat;
            v.count(v.no_cpu(), Event::KSWAPD_WAKEUP_HOPELESS, 1);
            return;
        }
        if crate::vmscan::pgdat_balanced_on(self, nid) {
            return;
        }
        k.started.call_once(|| {
            if let Some(me) = self.me.get() {
                spawn_kswapd(me.clone(), k.wait.clone(), nid, self.host_cpus);
            }
        });
        if let Ok(mut s) = k.wait.state.lock() {
            s.woken = true;
        }
        k.wait.cond.notify_one();
    }

    fn try_to_free_pages(&self, nid: usize, order: u32, cpu: usize) -> u64 {
        let Some(c) = self.cpus.get(cpu) else {
            return 0;
        };
        // The allocating thread is this CPU's (it holds its OnCpu): it
        // reclaims as that CPU, through a handle that does not unbind it.
        if crate::sync::this_cpu(self.mem.machine_id()) != cpu {
            return 0;
        }
        let oncpu = std::mem::ManuallyDrop::new(OnCpu {
            m: self,
            cpu: c,
            _not_send: PhantomData,
            numa_tick: std::cell::Cell::new(0),
        });
        let r = crate::vmscan::try_to_free_pages(&oncpu, nid, order);
        // shrink_node: progress revives a hopeless kswapd.
        if r > 0 {
            self.mem.nodes[nid].kswapd_clear_hopeless();
        }
        r
    }

    fn migrc_flush_free(&self, cpu: usize, why: Event) -> bool {
        if !self.migrc.pending() {
            return false;
        }
        // As for reclaim: only the thread that plays `cpu` flushes as it.
        let Some(c) = self.cpus.get(cpu) else {
            return false;
        };
        if crate::sync::this_cpu(self.mem.machine_id()) != cpu {
            return false;
        }
        let oncpu = std::mem::ManuallyDrop::new(OnCpu {
            m: self,
            cpu: c,
            _not_send: PhantomData,
            numa_tick: std::cell::Cell::new(0),
        });
        crate::migrc::migrc_flush_free_folios(&oncpu, why)
    }

    fn luf_flush(&self, cpu: usize, cpumask: u64) {
        // The thread that plays `cpu` flushes as it; any other (a kernel
        // thread: kswapd's slot is shared by the nodes' threads) sends as
        // a kswapd CPU, which no user mm is loaded on and no mask names.
        let me = match self.cpus.get(cpu) {
            Some(c) if crate::sync::this_cpu(self.mem.machine_id()) == cpu => c,
            _ => match self.kswapd.first() {
                Some(k) => &k.cpu,
                None => return,
            },
        };
        let oncpu = std::mem::ManuallyDrop::new(OnCpu {
            m: self,
            cpu: me,
            _not_send: PhantomData,
            numa_tick: std::cell::Cell::new(0),
        });
        crate::migrc::luf_flush_cpus(&oncpu, cpumask);
    }

    fn migrc_pause(&self, pause: bool) {
        if pause {
            self.migrc.pause();
        } else {
            self.migrc.resume();
        }
    }
}

/// Start node `nid`'s kswapd: a thread that sleeps until woken, then runs
/// `balance_pgdat` on the kswapd CPU. It holds the machine only while it
/// runs, and ends when the machine goes.
fn spawn_kswapd(
    m: std::sync::Weak<Machine>,
    wait: Arc<KswapdWait>,
    nid: usize,
    on: crate::sched::HostCpus,
) {
    let spawned = std::thread::Builder::new()
        .name(format!("kswapd{nid}"))
        .spawn(move || {
            on.apply();
            kswapd_main(m, wait, nid)
        });
    debug_assert!(spawned.is_ok(), "kswapd{nid}: {spawned:?}");
}

/// `kswapd`: sleep, wake, balance the node, count the run.
fn kswapd_main(m: std::sync::Weak<Machine>, wait: Arc<KswapdWait>, nid: usize) {
    loop {
        {
            let Ok(mut s) = wait.state.lock() else {
                return;
            };
            while !s.woken && !s.stop {
                s = match wait.cond.wait(s) {
                    Ok(s) => s,
                    Err(_) => return,
                };
            }
            if s.stop {
                return;
            }
        }
        let Some(m) = m.upgrade() else {
            return;
        };
        let k = &m.kswapd[nid];
        // Running before the wakeup is taken, so that a waiter never sees
        // neither (Release: pairs with kswapd_quiesce's Acquire).
        k.running.store(true, Ordering::Release);
        if let Ok(mut s) = wait.state.lock() {
            s.woken = false;
        }
        let oncpu = std::mem::ManuallyDrop::new(OnCpu {
            m: &m,
            cpu: &k.cpu,
            _not_send: PhantomData,
            numa_tick: std::cell::Cell::new(0),
        });
        // A panic in the run must not leave the kswapd marked running.
        struct NotRunning<'a>(&'a AtomicBool);
        impl Drop for NotRunning<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _not_running = NotRunning(&k.running);
        // On a CPU of its node, or beside them; given back after the run.
        let run = m.sched.kthread_run(&m.cpus, m.kswapd_cpus_allowed(nid));
        if run.cpu().is_some() {
            // Model-only: a run begun in a user thread's place.
            oncpu
                .vmstat()
                .count(oncpu.id(), Event::KSWAPD_RUN_ON_CPU, 1);
        }
        match crate::vmscan::balance_pgdat(&oncpu, nid) {
            Some(0) => {
                m.mem.nodes[nid].kswapd_failed();
                // Model-only (later kernels trace it,
                // `mm_vmscan_kswapd_reclaim_fail`).
                oncpu.vmstat().count(oncpu.id(), Event::KSWAPD_FAILURE, 1);
            }
            Some(_) => m.mem.nodes[nid].kswapd_clear_hopeless(),
            None => {}
        }
    }
}

/// A thread running on one CPU: the model's `current` plus `smp_processor_id()`.
/// Not `Send`: the binding belongs to the thread that made it.
pub struct OnCpu<'m> {
    pub m: &'m Machine,
    pub cpu: &'m Cpu,
    _not_send: PhantomData<*const ()>,
    /// Accesses since NUMA balancing last looked at the clock (the
    /// scheduler tick's stand-in).
    pub(crate) numa_tick: std::cell::Cell<u32>,
}

impl Drop for OnCpu<'_> {
    /// The thread leaves the CPU, which goes idle: lazy, its mm loaded.
    fn drop(&mut self) {
        self.cpu.enter_lazy(self.m.vmstat());
        // What the thread queued starts its grace period now.
        self.m.mem.rcu.rcu_cpu_leave(self.id());
        self.m.mem.rcu.bind(None);
        crate::sync::set_this_cpu(self.m.mem.machine_id(), crate::sync::NO_CPU);
        self.cpu.unbind();
    }
}

impl<'m> OnCpu<'m> {
    #[inline]
    pub fn id(&self) -> usize {
        self.cpu.id
    }
    #[inline]
    pub fn mem(&self) -> &'m Arc<PhysMem> {
        &self.m.mem
    }
    #[inline]
    pub fn vmstat(&self) -> &'m VmStat {
        &self.m.mem.vmstat
    }

    /// The address space this CPU runs.
    pub fn mm(&self) -> KResult<Arc<Mm>> {
        self.cpu.loaded_mm().ok_or(Errno::EINVAL)
    }

    /// The address space this CPU runs, lent to `f` without a count taken
    /// (for the fault path); None if it runs none. `f` must not switch mm
    /// (it is not handed this CPU's handle to do so).
    pub(crate) fn with_mm<R>(&self, f: impl FnOnce(&Arc<Mm>) -> R) -> Option<R> {
        // SAFETY: an OnCpu lives on the thread that plays its CPU (it is not
        // Send), and `f` gets no handle through which to switch the mm...
        // other than one it captured: the fault path, its only caller,
        // switches none.
        unsafe { self.cpu.with_loaded_mm(f) }
    }

    /// Create a new, empty process and run it here.
    pub fn new_mm(&self) -> KResult<Arc<Mm>> {
        let mm = Mm::new(self.m.mem.clone(), self.cpu.node, self.id())?;
        self.m.register_mm(&mm);
        self.switch_mm(&mm);
        Ok(mm)
    }

    /// Context-switch to a thread of `mm`.
    pub fn switch_mm(&self, mm: &Arc<Mm>) {
        self.cpu.enter_kernel_to_switch(self.m.vmstat());
        self.cpu.switch_mm(Some(mm));
    }

    /// Stop running user code: the thread is about to block or wait, and
    /// the CPU goes idle with the mm still loaded (lazy TLB mode, as the
    /// scheduler's switch to the idle task makes it). Flushers stop
    /// waiting for this CPU; it catches up when it next runs.
    pub fn idle(&self) {
        self.cpu.enter_lazy(self.m.vmstat());
    }

    /// `schedule()` at an access, for a kernel thread woken to run on this
    /// CPU ([`crate::sched`]): the thread stops running user code (the CPU
    /// goes lazy, the mm stays loaded) and waits until the kernel thread
    /// gives the CPU back. The caller then returns to user mode, catching
    /// up on the flushes that skipped the CPU meanwhile.
    #[cold]
    pub(crate) fn schedule(&self) {
        self.idle();
        self.m.sched.run_kthread(self.id());
    }

    /// `cond_resched()`: a kernel thread's run shares the CPU it took
    /// ([`crate::sched::cond_resched`]); nothing on a CPU's own thread.
    #[inline]
    pub(crate) fn cond_resched(&self) {
        crate::sched::cond_resched(&self.m.sched, &self.m.cpus);
    }

    #[inline]
    pub(crate) fn kernel_enter(&self) {
        self.cpu.enter_kernel(self.m.vmstat());
        // As RCU_SOFTIRQ on the way out of the interrupt that took it in.
        self.m.mem.rcu.rcu_core(self.id());
    }

    #[inline]
    pub(crate) fn user_enter(&self) {
        self.cpu.enter_user(self.m.vmstat());
    }

    /// `flush_tlb_range` from this CPU. x86's says that page tables may
    /// have been freed (`freed_tables`, so lazy CPUs are flushed too), as
    /// it has since "x86/mm: Fix flush_tlb_range() when used for zapping
    /// normal PMDs" (3ef938c35035): a caller that clears a PMD may have
    /// unhooked a PTE table.
    pub fn flush_tlb_range(&self, mm: &Arc<Mm>, start: u64, end: u64, stride_shift: u32) {
        let range = cpu::FlushRange {
            start,
            end,
            stride_shift,
            freed_tables: true,
        };
        self.flush_tlb_mm_range(mm, range);
    }

    /// `flush_tlb_page` from this CPU: one 4 KiB page, no page table freed.
    pub fn flush_tlb_page(&self, mm: &Arc<Mm>, addr: u64) {
        let range = cpu::FlushRange {
            start: addr,
            end: addr + crate::phys::PAGE_SIZE,
            stride_shift: crate::phys::PAGE_SHIFT,
            freed_tables: false,
        };
        self.flush_tlb_mm_range(mm, range);
    }

    /// `flush_tlb_mm_range` from this CPU.
    pub fn flush_tlb_mm_range(&self, mm: &Arc<Mm>, range: cpu::FlushRange) {
        cpu::flush_tlb_mm_range(&self.m.cpus, self.cpu, mm, range, self.vmstat());
    }

    pub fn flush_tlb_mm(&self, mm: &Arc<Mm>) {
        cpu::flush_tlb_mm(&self.m.cpus, self.cpu, mm, self.vmstat());
    }

    /// Free a folio reference from this CPU.
    pub fn folio_put_refs(&self, folio: Folio, nr: i32) {
        folio.put_refs(self.mem(), nr, self.id());
    }
}
