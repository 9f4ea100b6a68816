//! Scenarios in usermm: one machine, the scenario's processes as address
//! spaces, all run by CPU 0 (switching between them as a scheduler would).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use usermm::mm::vma::VM_ACCESS_FLAGS;
use usermm::mm::Mm;
use usermm::vmstat::Event;
use usermm::{Errno, Machine, MachineConfig, ThpMode};

use super::parse::{MlockCall, Rlimit};
use super::Backend;

pub struct EngineBackend {
    m: Arc<Machine>,
    /// Every thread's mm, by the thread's name.
    procs: HashMap<String, Arc<Mm>>,
    /// The CPU of each thread a `thread` statement made; a process's
    /// first thread runs on CPU 0.
    cpus: HashMap<String, usize>,
    /// The vfork children still running their parent's mm.
    vforked: std::collections::HashSet<String>,
    cur: String,
    /// The scenario's files by name: each as an open file, read-write for
    /// those it made, read-only for host files (as the native run opens
    /// them).
    files: HashMap<String, Arc<usermm::fs::File>>,
}

impl EngineBackend {
    /// The machine scenarios run on unless told otherwise: one 1 GiB node
    /// with two CPUs (the scenarios run on CPU 0).
    pub fn default_machine() -> MachineConfig {
        MachineConfig::single_node(1 << 30, 2)
    }

    /// A machine with one process, `main`.
    pub fn new(config: MachineConfig) -> anyhow::Result<EngineBackend> {
        let m = Machine::new(config).map_err(|e| anyhow::anyhow!("machine: {e}"))?;
        let mm = {
            let c = m.bind(0).map_err(|e| anyhow::anyhow!("{e}"))?;
            c.new_mm().map_err(|e| anyhow::anyhow!("{e}"))?
        };
        Ok(EngineBackend {
            m,
            procs: HashMap::from([("main".to_string(), mm)]),
            cpus: HashMap::new(),
            vforked: Default::default(),
            cur: "main".into(),
            files: HashMap::new(),
        })
    }

    /// The machine's tunables, to set before the scenario runs.
    pub fn tunables(&self) -> &usermm::tunable::Tunables {
        &self.m.tunables
    }

    /// The whole machine, as `usermm inspect` shows it.
    pub fn inspection(&self) -> usermm::inspect::Inspection {
        self.m.rcu_barrier();
        usermm::inspect::inspect(&self.m)
    }

    /// The invariant checker over the whole machine.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        self.m.rcu_barrier();
        usermm::check::check_invariants(&self.m)
    }

    /// `execve(2)` of the current process with `argv` and the
    /// environment `env` (a replayed program's stack starts with the
    /// strings the recorded one had).
    pub fn exec_env(
        &mut self,
        path: &str,
        argv: &[String],
        env: &[String],
        rnd: Option<usermm::exec::ExecRandom>,
    ) -> Result<(), Errno> {
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let env: Vec<&str> = env.iter().map(String::as_str).collect();
        let vforked = self.vforked.contains(&self.cur);
        let r = self.on(|c| match rnd {
            _ if vforked => c.execve_vfork_child(path, &args, &env),
            Some(rnd) => c.execve_randomized(path, &args, &env, rnd),
            None => c.execve(path, &args, &env),
        });
        r.map(|mm| {
            self.vforked.remove(&self.cur);
            self.procs.insert(self.cur.clone(), mm);
        })
    }

    /// Read the file `name` into the page cache (the page ranges given,
    /// or all of it), as
    /// `POSIX_FADV_WILLNEED` reads (small folios, a readahead window at a
    /// time): a file a recorded program mapped was most likely cached on
    /// the host already, and read through long before, so no folio keeps
    /// the `PG_readahead` mark a read consumes (fault-around skips marked
    /// folios).
    pub fn warm_file(&mut self, name: &str, ranges: Option<&[(u64, u64)]>) -> Result<(), Errno> {
        let file = self.files.get(name).cloned().ok_or(Errno::EBADF)?;
        let c = self.m.bind(0).map_err(|_| Errno::EBUSY)?;
        let whole = [(0, file.inode.size_pages())];
        let window = file.f_ra.lock().ra_pages.max(1);
        for &(start, end) in ranges.unwrap_or(&whole) {
            let mut at = start;
            while at < end {
                let n = window.min(end - at);
                usermm::filemap::force_page_cache_readahead(&c, &file, at, n);
                at += n;
            }
        }
        let mem = c.mem();
        for (_, folio) in file.mapping().folios() {
            folio.head(mem).clear(usermm::phys::pg::READAHEAD);
        }
        Ok(())
    }

    /// Each VMA of the current process with resident pages: its start,
    /// end and `Rss` in kB, as /proc/PID/smaps shows them.
    pub fn vma_rss(&self) -> Vec<(u64, u64, u64)> {
        self.m.rcu_barrier();
        usermm::proc::smaps(&self.procs[&self.cur])
            .into_iter()
            .filter(|s| s.rss > 0)
            .map(|s| (s.start, s.end, s.rss))
            .collect()
    }

    /// The scenario's process names and their mm ids.
    pub fn process_ids(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .procs
            .iter()
            .filter(|(n, _)| !self.cpus.contains_key(*n))
            .map(|(n, mm)| (n.clone(), mm.id))
            .collect();
        v.sort_by_key(|x| x.1);
        v
    }

    /// `processes: main = mm 1, child = mm 2`, for people.
    pub fn processes_line(&self) -> String {
        let names: Vec<String> = self
            .process_ids()
            .into_iter()
            .map(|(n, id)| format!("{n} = mm {id}"))
            .collect();
        format!("processes: {}", names.join(", "))
    }

    /// Run `f` on the current thread's CPU with its process loaded.
    fn on<R>(&self, f: impl FnOnce(&usermm::OnCpu) -> R) -> R {
        let cpu = self.cpus.get(&self.cur).copied().unwrap_or(0);
        let c = self
            .m
            .bind(cpu)
            .expect("the CPUs are free between statements");
        let mm = &self.procs[&self.cur];
        // A context switch only when another process ran last: a `fill`
        // makes one access per page, all in the same process.
        if c.mm().map_or(true, |cur| cur.id != mm.id) {
            c.switch_mm(mm);
        }
        let r = f(&c);
        c.idle();
        r
    }
}

impl Backend for EngineBackend {
    fn mmap(
        &mut self,
        addr: u64,
        len: u64,
        prot: u32,
        flags: u32,
        file: Option<&str>,
        off: u64,
    ) -> Result<u64, Errno> {
        let file = match file {
            Some(name) => Some(self.files.get(name).cloned().ok_or(Errno::EBADF)?),
            None => None,
        };
        self.on(|c| c.mmap_file(addr, len, prot, flags, file.as_ref(), off))
    }
    fn create_file(
        &mut self,
        name: &str,
        size: u64,
        seed: Option<u64>,
        fs: &str,
        chunk: u64,
    ) -> Result<Result<(), Errno>, String> {
        let kind = usermm::fs::FsKind::parse(fs).ok_or(format!("unknown filesystem {fs:?}"))?;
        let inode = self.m.create_file(kind, 0);
        let mode = usermm::fs::FMode {
            read: true,
            write: true,
        };
        let file = usermm::fs::File::open(&inode, mode).map_err(|e| e.to_string())?;
        let bytes = super::file_bytes(size, seed);
        let c = self.m.bind(0).map_err(|e| e.to_string())?;
        let mut pos = 0;
        while pos < size {
            let n = chunk.min(size - pos);
            if let Err(e) = c.pwrite(&file, pos, &bytes[pos as usize..(pos + n) as usize]) {
                return Ok(Err(e));
            }
            pos += n;
        }
        let r = c.fsync(&file);
        drop(c);
        self.files.insert(name.to_string(), file);
        Ok(r)
    }
    fn memfd(
        &mut self,
        name: &str,
        size: u64,
        seed: Option<u64>,
    ) -> Result<Result<(), Errno>, String> {
        let c = self.m.bind(0).map_err(|e| e.to_string())?;
        let file = match c.memfd_create() {
            Ok(f) => f,
            Err(e) => return Ok(Err(e)),
        };
        let r = c.ftruncate(&file, size).and_then(|()| {
            if seed.is_some() {
                c.pwrite(&file, 0, &super::file_bytes(size, seed))
                    .map(|_| ())
            } else {
                Ok(())
            }
        });
        drop(c);
        self.files.insert(name.to_string(), file);
        Ok(r)
    }
    fn open_file(&mut self, name: &str, path: &str) -> Result<(), Errno> {
        let inode = self
            .m
            .open_host_file(std::path::Path::new(path))
            .map_err(|e| Errno(e.raw_os_error().unwrap_or(Errno::EIO.0)))?;
        let mode = usermm::fs::FMode {
            read: true,
            write: false,
        };
        self.files
            .insert(name.to_string(), usermm::fs::File::open(&inode, mode)?);
        Ok(())
    }
    fn truncate(&mut self, name: &str, size: u64) -> Result<(), Errno> {
        let file = self.files.get(name).cloned().ok_or(Errno::EBADF)?;
        let c = self.m.bind(0).map_err(|_| Errno::EBUSY)?;
        c.ftruncate(&file, size)
    }
    fn msync(&mut self, addr: u64, len: u64, flags: u32) -> Result<(), Errno> {
        self.on(|c| c.msync(addr, len, flags))
    }
    fn munmap(&mut self, addr: u64, len: u64) -> Result<(), Errno> {
        self.on(|c| c.munmap(addr, len))
    }
    fn mremap(
        &mut self,
        addr: u64,
        old_len: u64,
        new_len: u64,
        flags: u32,
        new_addr: u64,
    ) -> Result<u64, Errno> {
        self.on(|c| c.mremap(addr, old_len, new_len, flags, new_addr))
    }
    fn mprotect(&mut self, addr: u64, len: u64, prot: u32) -> Result<(), Errno> {
        self.on(|c| c.mprotect(addr, len, prot))
    }
    fn madvise(&mut self, addr: u64, len: u64, advice: i32) -> Result<(), Errno> {
        self.on(|c| c.madvise(addr, len, advice))
    }
    fn mlock(&mut self, call: &MlockCall<u64>) -> Result<(), Errno> {
        self.on(|c| match *call {
            MlockCall::Mlock { addr, len, flags } => c.mlock2(addr, len, flags),
            MlockCall::Munlock { addr, len } => c.munlock(addr, len),
            MlockCall::Mlockall { flags } => c.mlockall(flags),
            MlockCall::Munlockall => c.munlockall(),
        })
    }
    fn mincore(&mut self, addr: u64, len: u64) -> Result<Vec<u8>, Errno> {
        self.on(|c| c.mincore(addr, len))
    }
    fn setrlimit(&mut self, resource: Rlimit, bytes: u64) -> Result<(), Errno> {
        let mm = &self.procs[&self.cur];
        match resource {
            Rlimit::Memlock => mm.set_memlock_limit(bytes),
            Rlimit::Stack => mm.set_stack_limit(bytes),
        }
        Ok(())
    }
    fn capdrop_ipc_lock(&mut self) -> Result<(), Errno> {
        self.procs[&self.cur].set_cap_ipc_lock(false);
        Ok(())
    }
    fn store(&mut self, addr: u64, v: u64) -> Result<(), Errno> {
        self.on(|c| c.store_u64(addr, v))
    }
    fn load(&mut self, addr: u64) -> Result<u64, Errno> {
        self.on(|c| c.load_u64(addr))
    }
    /// The fork, then a drain of the CPU's LRU and mlock batches, as the
    /// native servers drain theirs after fork (see `host.rs`).
    fn fork(&mut self, child: &str) -> Result<Result<(), Errno>, String> {
        let r = self.on(|c| {
            let r = c.fork();
            usermm::swap::lru_add_drain(c.mem(), c.id());
            r
        });
        Ok(r.map(|mm| {
            self.procs.insert(child.to_string(), mm);
        }))
    }
    fn exec(
        &mut self,
        path: &str,
        argv: &[String],
        rnd: Option<usermm::exec::ExecRandom>,
    ) -> Result<Result<(), Errno>, String> {
        Ok(self.exec_env(path, argv, &[], rnd))
    }
    /// The child runs the parent's mm, on the parent's CPU (CPU 0).
    fn vfork(&mut self, child: &str) -> Result<Result<(), Errno>, String> {
        let mm = self.procs[&self.cur].clone();
        self.procs.insert(child.to_string(), mm);
        self.vforked.insert(child.to_string());
        Ok(Ok(()))
    }
    fn maps(&mut self) -> Result<Vec<String>, String> {
        Ok(usermm::proc::maps(&self.procs[&self.cur]))
    }
    fn brk(&mut self, brk: u64) -> Result<u64, String> {
        if self.procs[&self.cur].layout().start_brk == 0 {
            return Err(super::NO_HEAP.into());
        }
        self.on(|c| c.brk(brk))
            .map_err(|e| format!("brk: {}", e.name()))
    }
    /// The thread's CPU: the next after those of the process's threads,
    /// round the machine's CPUs (the first thread's is CPU 0). It loads
    /// the mm (a context switch to the new thread) and goes idle.
    fn thread(&mut self, name: &str) -> Result<Result<(), Errno>, String> {
        let mm = self.procs[&self.cur].clone();
        let siblings = self
            .procs
            .iter()
            .filter(|(n, m)| m.id == mm.id && self.cpus.contains_key(*n))
            .count();
        let cpu = (1 + siblings) % self.m.cpus.len();
        let c = self.m.bind(cpu).map_err(|e| e.to_string())?;
        c.switch_mm(&mm);
        c.idle();
        drop(c);
        self.procs.insert(name.to_string(), mm);
        self.cpus.insert(name.to_string(), cpu);
        Ok(Ok(()))
    }
    fn switch(&mut self, name: &str) -> Result<(), String> {
        if !self.procs.contains_key(name) {
            return Err(format!("no process {name:?}"));
        }
        self.cur = name.to_string();
        Ok(())
    }
    /// The thread's CPU stops running the mm (`exit_thread`); the mm
    /// stays with the process.
    fn exit_thread(&mut self, name: &str) -> Result<(), String> {
        let cpu = self
            .cpus
            .remove(name)
            .ok_or(format!("no thread {name:?}"))?;
        let mm = self
            .procs
            .remove(name)
            .ok_or(format!("no thread {name:?}"))?;
        let c = self.m.bind(cpu).map_err(|e| e.to_string())?;
        if c.mm().is_ok_and(|cur| cur.id == mm.id) {
            c.exit_thread();
        }
        Ok(())
    }
    fn exit(&mut self, name: &str) -> Result<(), String> {
        let mm = self
            .procs
            .remove(name)
            .ok_or(format!("no process {name:?}"))?;
        if self.vforked.remove(name) {
            // The mm is the parent's: the child's exit leaves it.
            if self.cur == name {
                self.cur = self.procs.keys().min().cloned().unwrap_or_default();
            }
            return Ok(());
        }
        let c = self.m.bind(0).map_err(|e| e.to_string())?;
        c.switch_mm(&mm);
        c.exit_mm().map_err(|e| e.to_string())?;
        drop(c);
        self.m.rcu_barrier();
        if self.cur == name {
            if let Some(n) = self.procs.keys().min().cloned() {
                self.cur = n;
            }
        }
        Ok(())
    }
    fn figures(&mut self) -> Result<[i64; super::parse::NR_FIGURES], String> {
        let mm = &self.procs[&self.cur];
        self.m.rcu_barrier();
        let s = usermm::proc::status(mm);
        let r = usermm::proc::smaps_rollup(mm);
        Ok([
            s.vm_rss as i64,
            s.rss_anon as i64,
            s.vm_pte as i64,
            r.anon_huge_pages as i64,
            // The lines of /proc/PID/maps: the VMAs and the vsyscall page.
            mm.map_count() as i64 + 1,
            s.rss_file as i64,
            s.rss_shmem as i64,
            s.vm_lck as i64,
            r.locked as i64,
        ])
    }
    fn vmstat(&mut self, name: &str) -> Result<i64, String> {
        // Page tables leave nr_page_table_pages a grace period after their
        // unhooking.
        self.m.rcu_barrier();
        let snap = self.m.vmstat().snapshot();
        snap.get(name)
            .ok_or_else(|| format!("usermm keeps no counter {name}"))
    }
    /// A THP knob. The model has no khugepaged: on the host, the knob
    /// that enables PMD-sized THPs starts it (`start_stop_khugepaged`),
    /// and its first scan drains every CPU's LRU and mlock batches
    /// (`khugepaged_do_scan`'s `lru_add_drain_all`), which this does then.
    fn knob(&mut self, size_kb: Option<u64>, mode: &str) -> Result<(), String> {
        let mode = ThpMode::parse(mode).ok_or(format!("bad mode {mode}"))?;
        let was_running = self.m.thp.hugepage_pmd_enabled();
        let r = match size_kb {
            None => self.m.thp.set_enabled(mode),
            Some(kb) => self.m.thp.set_order((kb / 4).trailing_zeros(), mode),
        };
        if !was_running && self.m.thp.hugepage_pmd_enabled() {
            let c = self.m.bind(0).map_err(|e| e.to_string())?;
            usermm::swap::lru_add_drain_all(c.mem(), c.id());
        }
        r.map_err(|e| format!("knob: {e}"))
    }
    fn tunable(&mut self, name: &str, value: &str) -> Result<(), String> {
        self.m.tunables.set(name, value).map_err(|e| e.to_string())
    }

    fn knob_shmem(&mut self, size_kb: Option<u64>, mode: &str) -> Result<(), String> {
        use usermm::machine::{ShmemHuge, ShmemOrderMode};
        let was_running = self.m.thp.hugepage_pmd_enabled();
        let r = match size_kb {
            None => {
                let m = ShmemHuge::parse(mode).ok_or(format!("bad mode {mode}"))?;
                self.m.thp.set_shmem_enabled(m);
                Ok(())
            }
            Some(kb) => {
                let m = ShmemOrderMode::parse(mode).ok_or(format!("bad mode {mode}"))?;
                self.m.thp.set_shmem_order((kb / 4).trailing_zeros(), m)
            }
        };
        if !was_running && self.m.thp.hugepage_pmd_enabled() {
            let c = self.m.bind(0).map_err(|e| e.to_string())?;
            usermm::swap::lru_add_drain_all(c.mem(), c.id());
        }
        r.map_err(|e| format!("knob: {e}"))
    }

    fn knob_use_zero_page(&mut self, on: bool) -> Result<(), String> {
        self.m
            .thp
            .use_zero_page
            .store(on, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn sysctl(&mut self, name: &str, value: u64) -> Result<Result<(), Errno>, String> {
        Ok(self.m.overcommit.set_sysctl(name, value))
    }
    fn move_pages(
        &mut self,
        start: u64,
        len: u64,
        node: Option<i32>,
    ) -> Result<(usize, Vec<i32>), Errno> {
        let pages: Vec<u64> = (0..len.div_ceil(4096)).map(|i| start + i * 4096).collect();
        let nodes = node.map(|n| vec![n; pages.len()]);
        let mut status = vec![0; pages.len()];
        let n = self.on(|c| c.move_pages(&pages, nodes.as_deref(), &mut status))?;
        Ok((n, status))
    }
    fn mbind(
        &mut self,
        start: u64,
        len: u64,
        mode: i32,
        nodes: u64,
        flags: u32,
    ) -> Result<(), Errno> {
        self.on(|c| c.mbind(start, len, mode, &[nodes], 65, flags))
    }
    fn demotion(&mut self, on: bool) -> Result<(), String> {
        self.m.set_demotion_enabled(on);
        Ok(())
    }
    fn numa_balancing(&mut self, mode: u8) -> Result<(), String> {
        self.m
            .numa
            .mode
            .store(mode, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn nr_nodes(&mut self) -> usize {
        self.m.mem.nodes.len()
    }
    fn read_faults(&mut self, addr: u64, len: u64, every: u64) -> Result<u64, Errno> {
        let addrs = super::load_addrs(addr, len, every).ok_or(Errno::EINVAL)?;
        // Nothing else runs here while CPU 0 does: the machine's faults are
        // the loads'.
        let mm = Arc::clone(&self.procs[&self.cur]);
        if !addrs.iter().all(|&a| readable(&mm, a)) {
            return Err(Errno::EFAULT);
        }
        self.on(|c| {
            let before = self.m.vmstat().event(Event::PGFAULT);
            for &a in &addrs {
                c.load_u8(a)?;
            }
            Ok(self.m.vmstat().event(Event::PGFAULT) - before)
        })
    }
    fn await_numa_hint(&mut self, addr: u64) -> Result<(), Errno> {
        self.on(|c| {
            c.load_u8(addr)?;
            let faults = || self.m.vmstat().event(Event::PGFAULT);
            let before = faults();
            let start = Instant::now();
            // Each load is an access of the process; every so many, the
            // scan runs when due (`task_tick_numa`), as the host's runs
            // off the tick while the process spins.
            while faults() == before {
                if start.elapsed() > Duration::from_secs(super::AWAIT_NUMA_HINT_S) {
                    return Err(Errno::ETIMEDOUT);
                }
                c.load_u8(addr)?;
            }
            Ok(())
        })
    }
    fn machine(&self) -> String {
        let changed = self.m.tunables.changed();
        if changed.is_empty() {
            return self.m.config.to_string();
        }
        let t: Vec<String> = changed.iter().map(|(n, v)| format!("{n}={v}")).collect();
        format!("{}; tunables {}", self.m.config, t.join(" "))
    }
    fn dump(&mut self) -> String {
        format!("{}\n{}", self.processes_line(), self.inspection())
    }
}

/// Whether a VMA of `mm` lets a load from `addr` through (on x86 a
/// writable or executable page is readable too).
fn readable(mm: &Mm, addr: u64) -> bool {
    let guard = usermm::sync::epoch::pin();
    mm.vma_tree(&guard)
        .vma_lookup(addr)
        .is_some_and(|v| v.flags() & VM_ACCESS_FLAGS != 0)
}

impl Drop for EngineBackend {
    fn drop(&mut self) {
        // The threads and vfork children first, then each process's mm,
        // once.
        let threads: Vec<String> = self.cpus.keys().cloned().collect();
        for t in threads {
            let _ = self.exit_thread(&t);
        }
        let children: Vec<String> = self.vforked.iter().cloned().collect();
        for c in children {
            let _ = self.exit(&c);
        }
        let names: Vec<String> = self.procs.keys().cloned().collect();
        for n in names {
            let _ = self.exit(&n);
        }
    }
}
