//! The machine: physical memory, CPUs, the knobs, and [`OnCpu`], the handle
//! through which a thread runs code on one CPU (the model's `current` and
//! `smp_processor_id()`).
//!
//! This is the layer the operations stand on: it holds the machine's data
//! and its knobs, and it alone makes an [`OnCpu`] ([`Machine::bind`] for a
//! thread that takes a CPU, [`Machine::on_this_cpu`] and
//! [`Machine::on_kthread_cpu`] for code that already runs as one). It calls
//! nothing above it: [`Machine::new`] is the operations' (`init.rs`), since
//! booting installs the hooks through which the allocator reaches up to
//! reclaim and to the deferred flushes; kswapd's thread is vmscan's
//! (`vmscan/kswapd.rs`), and only its state sits here.

use std::marker::PhantomData;

use crate::cpu::{self, Cpu};
use crate::errno::{Errno, KResult};
use crate::mm::Mm;
use crate::phys::{pg, Folio, Pfn, PhysMem};
use crate::sync::{Arc, AtomicBool, Mutex, Ordering};
use crate::util::Overcommit;
use crate::vmstat::VmStat;

mod config;
pub mod numa;
mod thp;

pub use crate::tunable::Tunables;
pub use config::MachineConfig;
mod vdso_image;
pub use thp::{ShmemHuge, ShmemOrderMode, ThpKnobs, ThpMode};
pub use vdso_image::VDSO_IMAGE_PAGES;

pub struct Machine {
    pub mem: Arc<PhysMem>,
    pub cpus: Box<[Cpu]>,
    pub thp: ThpKnobs,
    pub tunables: Tunables,
    /// `vm.overcommit_*` and the commitment (`vm_committed_as`).
    pub overcommit: Overcommit,
    /// The shared zero page (`ZERO_PAGE(0)`).
    pub zero_pfn: Pfn,
    /// The vDSO image's pages (`vdso_image_64.data`), which every
    /// process's `[vdso]` maps: the host's own image, read from this
    /// process's vDSO at boot. The machine holds a reference to each, as
    /// the kernel's image is never freed.
    pub vdso_pages: [Pfn; VDSO_IMAGE_PAGES as usize],
    /// The huge zero folio, allocated on first use (`get_huge_zero_folio`);
    /// None inside if that allocation failed.
    huge_zero: crate::sync::OnceLock<Option<Pfn>>,
    mms: Mutex<Vec<crate::sync::Weak<Mm>>>,
    /// Every inode of the machine's filesystems (`sb->s_inodes`), held
    /// weakly: an inode lives while a name, an open file or a mapping
    /// holds it.
    inodes: Mutex<Vec<crate::sync::Weak<crate::fs::Inode>>>,
    pub config: MachineConfig,
    /// `/sys/kernel/mm/numa/demotion_enabled` (off by default, as in the
    /// kernel).
    demotion_enabled: AtomicBool,
    /// One kswapd per node, started on its first wakeup.
    pub(crate) kswapd: Box<[Kswapd]>,
    /// Which CPU each kernel thread runs on ([`crate::sched`]).
    pub sched: crate::sched::Runqueues,
    /// The host CPUs of the thread that made the machine, which its
    /// kswapds run on.
    pub(crate) host_cpus: crate::sched::HostCpus,
    /// This machine, for the threads it starts.
    pub(crate) me: crate::sync::OnceLock<std::sync::Weak<Machine>>,
    /// NUMA balancing's knobs.
    pub numa: numa::NumaKnobs,
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
pub(crate) struct Kswapd {
    pub(crate) cpu: Cpu,
    pub(crate) started: std::sync::Once,
    pub(crate) wait: Arc<KswapdWait>,
    /// A run is in progress.
    pub(crate) running: AtomicBool,
}

/// `kswapd_wait`, shared with the thread, which sleeps on it without
/// holding the machine (so that the machine can go, and wake it to end).
#[derive(Default)]
pub(crate) struct KswapdWait {
    pub(crate) state: std::sync::Mutex<KswapdState>,
    pub(crate) cond: std::sync::Condvar,
}

#[derive(Default)]
pub(crate) struct KswapdState {
    pub(crate) woken: bool,
    pub(crate) stop: bool,
}

impl Machine {
    /// The machine's data, as [`Machine::new`] boots it before it installs
    /// the hooks above this layer.
    pub(crate) fn alloc(config: MachineConfig) -> KResult<Arc<Machine>> {
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
        let vdso_pages = vdso_image::alloc_vdso_image(&mem)?;
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
            vdso_pages,
            huge_zero: crate::sync::OnceLock::new(),
            mms: Mutex::new(Vec::new()),
            inodes: Mutex::new(Vec::new()),
            config,
            demotion_enabled: AtomicBool::new(false),
            kswapd,
            sched: crate::sched::Runqueues::new(nr_cpus),
            host_cpus: crate::sched::HostCpus::of_this_thread(),
            me: crate::sync::OnceLock::new(),
            numa: Default::default(),
            born: std::time::Instant::now(),
        });
        let _ = m.me.set(Arc::downgrade(&m));
        Ok(m)
    }

    pub fn vmstat(&self) -> &VmStat {
        &self.mem.vmstat
    }

    /// Milliseconds since the machine was made (`jiffies_to_msecs(jiffies)`).
    pub fn jiffies_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
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
    pub(crate) fn kswapd_cpus_allowed(&self, nid: usize) -> u64 {
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
        Ok(OnCpu::new(self, cpu))
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

    /// A new, empty regular file of `size` bytes on a filesystem of `kind`
    /// (every block a hole until written).
    pub fn create_file(&self, kind: crate::fs::FsKind, size: u64) -> Arc<crate::fs::Inode> {
        let inode = crate::fs::Inode::create(&self.mem, kind, size);
        self.inodes.lock().push(Arc::downgrade(&inode));
        inode
    }

    /// A host file, read-only, as an inode of this machine.
    pub fn open_host_file(&self, path: &std::path::Path) -> std::io::Result<Arc<crate::fs::Inode>> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        let id = Some((meta.dev(), meta.ino()));
        if let Some(open) = self.inodes().into_iter().find(|i| i.host_id == id) {
            return Ok(open);
        }
        let inode = crate::fs::Inode::open_host(&self.mem, path)?;
        self.inodes.lock().push(Arc::downgrade(&inode));
        Ok(inode)
    }

    /// Every live inode.
    pub fn inodes(&self) -> Vec<Arc<crate::fs::Inode>> {
        let mut v = self.inodes.lock();
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(|w| w.upgrade()).collect()
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

/// An [`OnCpu`] for code that already runs as a CPU: the thread that plays
/// it, called back from below (the allocator's reclaim and flushes), or a
/// kernel thread on its own CPU. Dropping it leaves the binding alone,
/// which belongs to whoever made the CPU's [`OnCpu`] (or to no one, for a
/// kernel thread's CPU).
pub(crate) struct BorrowedCpu<'m>(std::mem::ManuallyDrop<OnCpu<'m>>);

impl<'m> std::ops::Deref for BorrowedCpu<'m> {
    type Target = OnCpu<'m>;
    fn deref(&self) -> &OnCpu<'m> {
        &self.0
    }
}

impl Machine {
    /// The calling thread's CPU `cpu`, if it plays it (an [`OnCpu`] of it
    /// is further up its stack); None from any other thread.
    pub(crate) fn on_this_cpu(&self, cpu: usize) -> Option<BorrowedCpu<'_>> {
        let c = self.cpus.get(cpu)?;
        if crate::sync::this_cpu(self.mem.machine_id()) != cpu {
            return None;
        }
        Some(BorrowedCpu(std::mem::ManuallyDrop::new(OnCpu::new(
            self, c,
        ))))
    }

    /// A kernel thread's own CPU (kswapd's), which no user thread binds and
    /// no mm is loaded on.
    pub(crate) fn on_kthread_cpu<'m>(&'m self, cpu: &'m Cpu) -> BorrowedCpu<'m> {
        debug_assert!(
            cpu.id >= self.cpus.len(),
            "CPU {} is a user CPU, not a kernel thread's",
            cpu.id
        );
        BorrowedCpu(std::mem::ManuallyDrop::new(OnCpu::new(self, cpu)))
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
    /// Made only here: by [`Machine::bind`], which binds the CPU, and for a
    /// [`BorrowedCpu`].
    fn new(m: &'m Machine, cpu: &'m Cpu) -> OnCpu<'m> {
        OnCpu {
            m,
            cpu,
            _not_send: PhantomData,
            numa_tick: std::cell::Cell::new(0),
        }
    }

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
