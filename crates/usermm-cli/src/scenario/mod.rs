//! Scenarios: the same sequence of memory operations, run in usermm
//! ([`engine::EngineBackend`]) or on the host kernel ([`host::HostBackend`]).
//!
//! The interpreter here owns everything both sides share: regions by name,
//! the current process, marks, patterns, and the checking of `expect` and
//! `fails`. A backend only performs system calls and accesses. Each
//! statement yields an [`Outcome`]; the outcomes that do not depend on where
//! the kernel placed things (errno, values read, changes of figures) are
//! what a differential run compares.

pub mod engine;
pub mod host;
pub mod parse;

use std::collections::HashMap;

use serde::Serialize;
use usermm::Errno;

use parse::{Addr, BrkTo, Figure, MlockCall, Op, Pattern, Rlimit, Stmt, NR_FIGURES};

/// How long `await_numa_hint` waits for a scan: the host's first comes
/// after a second of the process's run time (`scan_delay_ms`), the next a
/// second after (`scan_period_min_ms`).
pub const AWAIT_NUMA_HINT_S: u64 = 5;

/// The most loads one `expect faults reading` makes.
pub const MAX_READ_FAULT_LOADS: u64 = 1 << 16;

/// The addresses `expect faults reading ADDR LEN every=EVERY` loads from:
/// None when they would be more than [`MAX_READ_FAULT_LOADS`] or run past
/// the top of the address space (EINVAL).
pub fn load_addrs(addr: u64, len: u64, every: u64) -> Option<Vec<u64>> {
    let n = len.div_ceil(every.max(1));
    if n > MAX_READ_FAULT_LOADS {
        return None;
    }
    (0..n).map(|i| addr.checked_add(i * every)).collect()
}

/// What a backend does for the interpreter.
pub trait Backend {
    /// `mmap(2)`: anonymous memory, or the scenario's file `file` (by its
    /// name) from byte `off`.
    fn mmap(
        &mut self,
        addr: u64,
        len: u64,
        prot: u32,
        flags: u32,
        file: Option<&str>,
        off: u64,
    ) -> Result<u64, Errno>;
    /// Create the file `name`: `size` bytes on a filesystem of kind `fs`,
    /// written in `chunk`-byte writes (page i starting with the pattern
    /// of `seed`, or all zero), then `fsync`ed. Err: this side cannot
    /// make such a file (the scenario is skipped).
    fn create_file(
        &mut self,
        name: &str,
        size: u64,
        seed: Option<u64>,
        fs: &str,
        chunk: u64,
    ) -> Result<Result<(), Errno>, String>;
    /// `memfd_create(2)` as the scenario's file `name`, `ftruncate`d to
    /// `size` and written with `seed`'s pattern.
    fn memfd(
        &mut self,
        name: &str,
        size: u64,
        seed: Option<u64>,
    ) -> Result<Result<(), Errno>, String>;
    /// Open the host file `path` read-only as the scenario's file `name`.
    fn open_file(&mut self, name: &str, path: &str) -> Result<(), Errno>;
    /// `ftruncate(2)` of the scenario's file `name`.
    fn truncate(&mut self, name: &str, size: u64) -> Result<(), Errno>;
    /// `msync(2)`.
    fn msync(&mut self, addr: u64, len: u64, flags: u32) -> Result<(), Errno>;
    fn munmap(&mut self, addr: u64, len: u64) -> Result<(), Errno>;
    fn mprotect(&mut self, addr: u64, len: u64, prot: u32) -> Result<(), Errno>;
    /// `mremap(2)`: the mapping's address.
    fn mremap(
        &mut self,
        addr: u64,
        old_len: u64,
        new_len: u64,
        flags: u32,
        new_addr: u64,
    ) -> Result<u64, Errno>;
    fn madvise(&mut self, addr: u64, len: u64, advice: i32) -> Result<(), Errno>;
    /// `mincore(2)`: one byte per page.
    fn mincore(&mut self, addr: u64, len: u64) -> Result<Vec<u8>, Errno>;
    /// One call of the mlock family.
    fn mlock(&mut self, call: &MlockCall<u64>) -> Result<(), Errno>;
    /// `setrlimit` of the current process (soft and hard).
    fn setrlimit(&mut self, resource: Rlimit, bytes: u64) -> Result<(), Errno>;
    /// The current process drops `CAP_IPC_LOCK`.
    fn capdrop_ipc_lock(&mut self) -> Result<(), Errno>;
    fn store(&mut self, addr: u64, v: u64) -> Result<(), Errno>;
    fn load(&mut self, addr: u64) -> Result<u64, Errno>;
    /// Fork the current process into a new one called `child`: the
    /// fork's own errno inside, or, outside, why no process could be made
    /// at all (the host out of file descriptors or processes), which fails
    /// the statement with that message.
    fn fork(&mut self, child: &str) -> Result<Result<(), Errno>, String>;
    /// `execve(2)` of the current process with `argv` and no environment,
    /// randomisation off, or on with `rnd` (natively the host draws its
    /// own numbers); it stops at its first instruction.
    fn exec(
        &mut self,
        path: &str,
        argv: &[String],
        rnd: Option<usermm::exec::ExecRandom>,
    ) -> Result<Result<(), Errno>, String>;
    /// The current process's /proc/PID/maps, a line a mapping, fields
    /// separated by single spaces.
    fn maps(&mut self) -> Result<Vec<String>, String>;
    /// `brk(2)` of the current process, which must have exec'd a program
    /// (it has no heap otherwise): the new break, or the old one.
    fn brk(&mut self, brk: u64) -> Result<u64, String>;
    /// `vfork(2)`: a child `child` that runs the current process's mm
    /// until it execs (`exec` then gives the mm back) or exits (which
    /// leaves the mm to the parent); Err as for `fork`.
    fn vfork(&mut self, child: &str) -> Result<Result<(), Errno>, String>;
    /// A thread `name` of the current process, on the next CPU; Err as
    /// for `fork`.
    fn thread(&mut self, name: &str) -> Result<Result<(), Errno>, String>;
    /// Run the next statements in the thread `name`.
    fn switch(&mut self, name: &str) -> Result<(), String>;
    /// The thread `name`, not its process's first, exits.
    fn exit_thread(&mut self, name: &str) -> Result<(), String>;
    /// The process whose first thread is `name` exits (its other threads
    /// have).
    fn exit(&mut self, name: &str) -> Result<(), String>;
    /// VmRSS, RssAnon, VmPTE, AnonHugePages (kB), the number of VMAs,
    /// RssFile, RssShmem, VmLck and Locked (kB) of the current process, in
    /// the order of [`Figure::ALL`].
    fn figures(&mut self) -> Result<[i64; NR_FIGURES], String>;
    /// Set a THP knob; Err says why it cannot be (the scenario is skipped).
    fn knob(&mut self, size_kb: Option<u64>, mode: &str) -> Result<(), String>;
    /// Set shmem's `transparent_hugepage/shmem_enabled` (no size) or
    /// `hugepages-<size>kB/shmem_enabled`; Err as for `knob`.
    fn knob_shmem(&mut self, size_kb: Option<u64>, mode: &str) -> Result<(), String>;
    /// Set `transparent_hugepage/use_zero_page`; Err as for `knob`.
    fn knob_use_zero_page(&mut self, on: bool) -> Result<(), String>;
    /// Set one of the engine's tunables (checked when parsed); Err when it
    /// cannot take that value here (the scenario is skipped).
    fn tunable(&mut self, name: &str, value: &str) -> Result<(), String>;
    /// Write `/proc/sys/vm/NAME`: Ok(Err(errno)) when the value is refused,
    /// Err when it cannot be written here (the scenario is skipped).
    fn sysctl(&mut self, name: &str, value: u64) -> Result<Result<(), Errno>, String>;
    /// The machine-wide counter `name` (checked when parsed: see
    /// [`parse::vmstat_name_known`]); Err when this side has no such
    /// counter (the scenario is skipped).
    fn vmstat(&mut self, name: &str) -> Result<i64, String>;
    /// A description of the current process's state, for `dump`.
    fn dump(&mut self) -> String;
    /// `move_pages(2)` of the pages of `[start, start+len)` to `node`, or
    /// (None) where they are: the pages not moved, and each page's status.
    fn move_pages(
        &mut self,
        start: u64,
        len: u64,
        node: Option<i32>,
    ) -> Result<(usize, Vec<i32>), Errno>;
    /// The memory nodes this side has.
    fn nr_nodes(&mut self) -> usize;
    /// Set `demotion_enabled`; Err says why it cannot be (the scenario is
    /// skipped).
    fn demotion(&mut self, on: bool) -> Result<(), String>;
    /// Set `numa_balancing`; Err says why it cannot be (skipped).
    fn numa_balancing(&mut self, mode: u8) -> Result<(), String>;
    /// Run the current process, loading the byte at `addr` (faulting it in
    /// first), until a load faults: the NUMA scan has made its PTE a
    /// hinting entry. EFAULT where nothing readable is mapped, ETIMEDOUT
    /// after [`AWAIT_NUMA_HINT_S`].
    fn await_numa_hint(&mut self, addr: u64) -> Result<(), Errno>;
    /// Load one byte of every `every` bytes of `[addr, addr + len)` in the
    /// current process: the page faults those loads took (the process's
    /// own work around them left out). EFAULT, before any load, where
    /// nothing readable is mapped at one of them; EINVAL where
    /// [`load_addrs`] gives none.
    fn read_faults(&mut self, addr: u64, len: u64, every: u64) -> Result<u64, Errno>;
    /// `mbind(2)` with a 64-node mask.
    fn mbind(
        &mut self,
        start: u64,
        len: u64,
        mode: i32,
        nodes: u64,
        flags: u32,
    ) -> Result<(), Errno>;
    /// The machine it runs on, for reports.
    fn machine(&self) -> String;
}

/// The result of one statement.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Outcome {
    pub line: usize,
    pub text: String,
    /// What happened, in a form both backends agree on when they agree
    /// ("ok", "EINVAL", "0x2a", "VmRSS +64"), or None when the statement's
    /// result depends on the backend (an address, an absolute figure).
    pub compare: Option<String>,
    /// What to print.
    pub shown: String,
    /// An `expect` or `fails` that did not hold, or an unexpected error.
    pub failed: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub backend: &'static str,
    /// The machine the scenario ran on.
    pub machine: String,
    pub outcomes: Vec<Outcome>,
    pub passed: usize,
    pub failed: usize,
    /// Why the scenario could not run here (host knobs not settable).
    pub skipped: Option<String>,
}

impl Report {
    pub fn exit_code(&self) -> i32 {
        if self.skipped.is_some() {
            3
        } else if self.failed > 0 {
            1
        } else {
            0
        }
    }

    /// Print the outcomes and the summary line. A closed stdout (`| head`)
    /// ends the printing quietly rather than in a panic.
    pub fn print(&self) {
        let _ = self.write_to(&mut std::io::stdout().lock());
    }

    fn write_to(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        for o in &self.outcomes {
            let mark = if o.failed.is_some() { "FAIL" } else { "  ok" };
            writeln!(out, "{mark} {:>4}: {:<44} {}", o.line, o.text, o.shown)?;
            if let Some(f) = &o.failed {
                writeln!(out, "          {f}")?;
            }
        }
        writeln!(out, "machine: {}", self.machine)?;
        match &self.skipped {
            Some(why) => writeln!(out, "{}: SKIPPED: {why}", self.backend),
            None => writeln!(
                out,
                "{}: {} statements, {} failed: {}",
                self.backend,
                self.outcomes.len(),
                self.failed,
                if self.failed == 0 { "PASS" } else { "FAIL" }
            ),
        }
    }
}

/// The pattern `fill` writes and `check` expects in the first word of the
/// page at byte offset `rel` of a region.
pub fn pattern(seed: u64, rel: u64) -> u64 {
    (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (rel >> 12).wrapping_mul(0xff51_afd7_ed55_8ccd)) | 1
}

/// A new file's contents: `size` bytes, page i starting with the
/// pattern of `seed` for offset `i << 12` (as `fill` writes a region), the
/// rest zero; all zero without a seed. Both sides write these bytes.
pub fn file_bytes(size: u64, seed: Option<u64>) -> Vec<u8> {
    let mut buf = vec![0u8; size as usize];
    fill_file_bytes(&mut buf, seed);
    buf
}

/// [`file_bytes`] into `buf`, which is zero.
pub fn fill_file_bytes(buf: &mut [u8], seed: Option<u64>) {
    if let Some(seed) = seed {
        for (i, page) in buf.chunks_mut(4096).enumerate() {
            let w = pattern(seed, (i as u64) << 12).to_le_bytes();
            let n = page.len().min(8);
            page[..n].copy_from_slice(&w[..n]);
        }
    }
}

#[derive(Default, Clone)]
struct ProcState {
    regions: HashMap<String, (u64, u64)>,
    marks: HashMap<String, Mark>,
}

/// What a mark remembers: the process's figures, and the counters that
/// the scenario's `expect vmstat` statements name.
#[derive(Default, Clone)]
struct Mark {
    figures: [i64; NR_FIGURES],
    vmstat: HashMap<String, i64>,
}

struct Interp<'b> {
    b: &'b mut dyn Backend,
    /// The processes, by the name of their first thread.
    procs: HashMap<String, ProcState>,
    /// Every thread, with the name of its process.
    tasks: HashMap<String, String>,
    /// The thread that runs the statements.
    cur: String,
    /// Each vfork child that has neither exec'd nor exited, with the
    /// process that waits for it.
    vforked: HashMap<String, String>,
    /// The counters the scenario's `expect vmstat` statements name.
    vmstat_names: Vec<String>,
}

const MAIN: &str = "main";

/// A line of `maps` as it is compared: a file of shmem's internal mount
/// (shared anonymous memory is `/dev/zero (deleted)`) shows that mount's
/// device and an inode number from the kernel's running count, which the
/// two sides cannot share; those two fields are left out.
fn maps_line_compared(line: &str) -> String {
    if !line.ends_with(" (deleted)") {
        return line.to_string();
    }
    let f: Vec<&str> = line.splitn(6, ' ').collect();
    match f.as_slice() {
        [range, perms, off, _dev, _ino, path] => format!("{range} {perms} {off} - - {path}"),
        _ => line.to_string(),
    }
}

/// Why `brk` fails in a process that has exec'd nothing.
const NO_HEAP: &str = "brk needs a program's heap: exec one first";

enum Res {
    /// Comparable result, shown text.
    Ok(Option<String>, String),
    Fail(String, Option<String>),
    Skip(String),
}

fn ok(s: impl Into<String>) -> Res {
    let s = s.into();
    Res::Ok(Some(s.clone()), s)
}

impl Interp<'_> {
    fn st(&mut self) -> &mut ProcState {
        let p = &self.tasks[&self.cur];
        self.procs.get_mut(p).expect("current process exists")
    }

    /// The other threads of process `p` (not its vfork child, which
    /// shares its regions and marks too).
    fn threads_of(&self, p: &str) -> Vec<String> {
        let mut t: Vec<String> = self
            .tasks
            .iter()
            .filter(|(t, q)| *q == p && *t != p && !self.vforked.contains_key(*t))
            .map(|(t, _)| t.clone())
            .collect();
        t.sort();
        t
    }

    /// Resolve an address; the second value is the base for patterns.
    fn addr(&mut self, a: &Addr) -> Result<(u64, u64), String> {
        match a {
            Addr::Abs(v) => Ok((*v, 0)),
            Addr::Region { name, off } => {
                let cur = self.cur.clone();
                let (start, _) = *self
                    .st()
                    .regions
                    .get(name)
                    .ok_or_else(|| format!("no region {name:?} in process {cur}"))?;
                Ok((start.wrapping_add(*off as u64), start))
            }
        }
    }

    fn region_len(&mut self, a: &Addr) -> Option<u64> {
        match a {
            Addr::Region { name, off } => self
                .st()
                .regions
                .get(name)
                .map(|&(_, len)| len.saturating_sub(*off as u64)),
            Addr::Abs(_) => None,
        }
    }

    fn exec(&mut self, op: &Op) -> Res {
        match self.exec_inner(op) {
            Ok(r) => r,
            Err(e) => Res::Fail(e, None),
        }
    }

    fn errno_res(e: Errno) -> Res {
        Res::Fail(
            format!("unexpected {}", e.name()),
            Some(e.name().to_string()),
        )
    }

    /// One statement: each kind has its method below.
    fn exec_inner(&mut self, op: &Op) -> Result<Res, String> {
        let needs_process = !matches!(
            op,
            Op::Knob { .. }
                | Op::KnobShmem { .. }
                | Op::KnobOnly { .. }
                | Op::KnobUseZeroPage { .. }
                | Op::Demotion { .. }
                | Op::NumaBalancing { .. }
                | Op::RequireNodes { .. }
                | Op::RequireFile { .. }
                | Op::Tunable { .. }
                | Op::Sysctl { .. }
                | Op::Fails { .. }
                | Op::CreateFile { .. }
                | Op::OpenFile { .. }
                | Op::Memfd { .. }
                | Op::Truncate { .. }
        );
        if needs_process && !self.tasks.contains_key(&self.cur) {
            return Err("no process is running (every one exited)".into());
        }
        if let Some(c) = self.tasks.get(&self.cur).and_then(|p| self.waits_for(p)) {
            if *c != self.cur && !matches!(op, Op::Switch { .. }) {
                return Err(format!(
                    "{} waits until its vfork child {c} execs or exits: switch to it",
                    self.cur
                ));
            }
        }
        match op {
            Op::Map {
                name,
                len,
                prot,
                at,
                align,
                flags,
                file,
                off,
            } => {
                let src = (file.as_deref(), *off);
                self.map(name, *len, *prot, at.as_ref(), *align, *flags, src)
            }
            Op::CreateFile {
                name,
                size,
                seed,
                fs,
                chunk,
            } => Ok(match self.b.create_file(name, *size, *seed, fs, *chunk) {
                Ok(r) => Self::done(r),
                Err(why) => Res::Skip(why),
            }),
            Op::OpenFile { name, path } => Ok(Self::done(self.b.open_file(name, path))),
            Op::Memfd { name, size, seed } => Ok(match self.b.memfd(name, *size, *seed) {
                Ok(r) => Self::done(r),
                Err(why) => Res::Skip(why),
            }),
            Op::Truncate { name, size } => Ok(Self::done(self.b.truncate(name, *size))),
            Op::Msync { addr, len, flags } => {
                let (a, _) = self.addr(addr)?;
                Ok(Self::done(self.b.msync(a, *len, *flags)))
            }
            Op::Munmap { addr, len } => self.munmap(addr, *len),
            Op::Mprotect { addr, len, prot } => {
                let (a, _) = self.addr(addr)?;
                Ok(Self::done(self.b.mprotect(a, *len, *prot)))
            }
            Op::Mremap {
                addr,
                old_len,
                new_len,
                flags,
                new_addr,
                name,
            } => self.mremap(
                addr,
                *old_len,
                *new_len,
                *flags,
                new_addr.as_ref(),
                name.as_deref(),
            ),
            Op::Madvise { addr, len, advice } => {
                let (a, _) = self.addr(addr)?;
                Ok(Self::done(self.b.madvise(a, *len, *advice)))
            }
            Op::Mlock(call) => {
                let call = match call {
                    MlockCall::Mlock { addr, len, flags } => MlockCall::Mlock {
                        addr: self.addr(addr)?.0,
                        len: *len,
                        flags: *flags,
                    },
                    MlockCall::Munlock { addr, len } => MlockCall::Munlock {
                        addr: self.addr(addr)?.0,
                        len: *len,
                    },
                    MlockCall::Mlockall { flags } => MlockCall::Mlockall { flags: *flags },
                    MlockCall::Munlockall => MlockCall::Munlockall,
                };
                Ok(Self::done(self.b.mlock(&call)))
            }
            Op::Mincore { addr, len, expect } => {
                let (a, _) = self.addr(addr)?;
                Ok(match self.b.mincore(a, *len) {
                    Ok(v) => {
                        let bits: String = v
                            .iter()
                            .map(|&b| if b & 1 != 0 { '1' } else { '0' })
                            .collect();
                        match expect {
                            Some(want) if *want != bits => {
                                Res::Fail(format!("expected {want}, got {bits}"), Some(bits))
                            }
                            _ => ok(bits),
                        }
                    }
                    Err(e) => Self::errno_res(e),
                })
            }
            Op::Setrlimit { resource, bytes } => {
                Ok(Self::done(self.b.setrlimit(*resource, *bytes)))
            }
            Op::CapdropIpcLock => Ok(Self::done(self.b.capdrop_ipc_lock())),
            Op::Fill {
                addr,
                len,
                seed,
                every,
            } => self.fill(addr, *len, *seed, *every),
            Op::Check {
                addr,
                len,
                pattern,
                every,
            } => self.check(addr, *len, pattern, *every),
            Op::Write { addr, value } => {
                let (a, _) = self.addr(addr)?;
                Ok(Self::done(self.b.store(a, *value)))
            }
            Op::Read { addr } => {
                let (a, _) = self.addr(addr)?;
                Ok(match self.b.load(a) {
                    Ok(v) => ok(format!("{v:#x}")),
                    Err(e) => Self::errno_res(e),
                })
            }
            Op::ExpectValue { addr, value } => self.expect_value(addr, *value),
            Op::Fork { child } => self.fork(child),
            Op::Thread { name } => self.thread(name),
            Op::Vfork { child } => self.vfork(child),
            Op::Switch { proc_name } => self.switch(proc_name),
            Op::Exit { proc_name } => self.exit(proc_name.as_deref()),
            Op::Knob { size_kb, mode } => Ok(Self::settable(self.b.knob(*size_kb, mode))),
            Op::KnobShmem { size_kb, mode } => {
                Ok(Self::settable(self.b.knob_shmem(*size_kb, mode)))
            }
            Op::KnobUseZeroPage { on } => Ok(Self::settable(self.b.knob_use_zero_page(*on))),
            Op::KnobOnly { size_kb } => Ok(self.knob_only(*size_kb)),
            Op::Tunable { name, value } => Ok(Self::settable(self.b.tunable(name, value))),
            Op::Sysctl { name, value } => Ok(match self.b.sysctl(name, *value) {
                Ok(r) => Self::done(r),
                Err(why) => Res::Skip(why),
            }),
            Op::Mark { name } => self.mark(name),
            Op::Print { fig } => {
                let f = self.b.figures()?;
                Ok(Res::Ok(
                    None,
                    format!("{} {}", fig.name(), f[fig_index(*fig)]),
                ))
            }
            Op::ExpectFigure { fig, since, value } => {
                self.expect_figure(*fig, since.as_deref(), *value)
            }
            Op::ExpectVmstat { name, since, value } => self.expect_vmstat(name, since, *value),
            Op::Fails { errno, op } => self.fails(errno, op),
            Op::Dump => Ok(Res::Ok(None, format!("\n{}", self.b.dump()))),
            Op::Exec { path, args, rnd } => self.exec_program(path, args, *rnd),
            Op::Brk { to, name } => self.brk(to, name.as_deref()),
            Op::Maps => {
                let lines = self.b.maps()?;
                let text = lines.join("\n");
                let cmp: Vec<String> = lines.iter().map(|l| maps_line_compared(l)).collect();
                Ok(Res::Ok(Some(cmp.join("\n")), format!("\n{text}")))
            }
            Op::Migrate { addr, len, node } => {
                let (a, _) = self.addr(addr)?;
                let node = i32::try_from(*node).unwrap_or(i32::MAX);
                Ok(match self.b.move_pages(a, *len, Some(node)) {
                    // A page that did not move fails the statement with its
                    // status's errno.
                    Ok((_, status)) => match status.iter().find(|&&s| s < 0) {
                        Some(&s) => Self::errno_res(Errno(-s)),
                        None => ok("ok"),
                    },
                    Err(e) => Self::errno_res(e),
                })
            }
            Op::ExpectNode { addr, node } => {
                let (a, _) = self.addr(addr)?;
                Ok(match self.b.move_pages(a, 1, None) {
                    Ok((_, s)) if s.first().is_some_and(|&s| s < 0) => {
                        Self::errno_res(Errno(-s[0]))
                    }
                    Ok((_, s)) if s.first() == Some(&(*node as i32)) => ok(format!("node {node}")),
                    Ok((_, s)) => Res::Fail(
                        format!("expected node {node}, the page is on {:?}", s.first()),
                        s.first().map(|n| format!("node {n}")),
                    ),
                    Err(e) => Self::errno_res(e),
                })
            }
            Op::Mbind {
                addr,
                len,
                mode,
                nodes,
                flags,
            } => {
                let (a, _) = self.addr(addr)?;
                Ok(Self::done(self.b.mbind(a, *len, *mode, *nodes, *flags)))
            }
            Op::Demotion { on } => Ok(Self::settable(self.b.demotion(*on))),
            Op::NumaBalancing { mode } => Ok(Self::settable(self.b.numa_balancing(*mode))),
            Op::ExpectReadFaults {
                addr,
                len,
                every,
                value,
            } => {
                let (a, _) = self.addr(addr)?;
                Ok(match self.b.read_faults(a, *len, *every) {
                    Ok(n) if n == *value => ok(format!("{n} faults")),
                    Ok(n) => Res::Fail(
                        format!("expected {value} faults, the loads took {n}"),
                        Some(format!("{n} faults")),
                    ),
                    Err(e) => Self::errno_res(e),
                })
            }
            Op::AwaitNumaHint { addr } => {
                let (a, _) = self.addr(addr)?;
                Ok(Self::done(self.b.await_numa_hint(a)))
            }
            Op::RequireFile { path } => Ok(if std::path::Path::new(path).exists() {
                ok("ok")
            } else {
                Res::Skip(format!("needs the host file {path}"))
            }),
            Op::RequireNodes { n } => {
                let have = self.b.nr_nodes();
                Ok(if (have as u64) < *n {
                    Res::Skip(format!("needs {n} memory nodes; this machine has {have}"))
                } else {
                    ok("ok")
                })
            }
        }
    }

    /// An operation that succeeds or fails with an errno.
    fn done(r: Result<(), Errno>) -> Res {
        match r {
            Ok(()) => ok("ok"),
            Err(e) => Self::errno_res(e),
        }
    }

    /// A setting that the backend may be unable to make (the scenario is
    /// then skipped).
    fn settable(r: Result<(), String>) -> Res {
        match r {
            Ok(()) => ok("ok"),
            Err(why) => Res::Skip(why),
        }
    }

    /// `map NAME LEN PROT [at=A] [align=N] [flags=...]`.
    #[allow(clippy::too_many_arguments)]
    fn map(
        &mut self,
        name: &str,
        len: u64,
        prot: u32,
        at: Option<&Addr>,
        align: u64,
        flags: u32,
        src: (Option<&str>, u64),
    ) -> Result<Res, String> {
        let hint = match at {
            Some(a) => self.addr(a)?.0,
            None => 0,
        };
        let r = if align > 0 && at.is_none() {
            self.map_aligned(len, prot, flags, align, src)
        } else {
            self.b.mmap(hint, len, prot, flags, src.0, src.1)
        };
        let a = match r {
            Ok(a) => a,
            Err(e) => return Ok(Self::errno_res(e)),
        };
        self.st().regions.insert(name.to_string(), (a, len));
        if align != 0 && a % align != 0 {
            return Ok(Res::Fail(format!("{a:#x} not aligned to {align:#x}"), None));
        }
        let shown = format!("{name} at {a:#x}");
        // The address is the kernel's choice: comparable only when the
        // scenario asked for one.
        let cmp = at.map(|_| {
            if a == hint {
                "at hint".to_string()
            } else {
                "elsewhere".to_string()
            }
        });
        Ok(Res::Ok(cmp.or(Some("ok".into())), shown))
    }

    /// `mremap`: the outcome compared is where the mapping went, in the
    /// terms both sides share (in place, at the address asked for, or
    /// elsewhere), never the address the kernel chose.
    fn mremap(
        &mut self,
        addr: &Addr,
        old_len: u64,
        new_len: u64,
        flags: u32,
        new_addr: Option<&Addr>,
        name: Option<&str>,
    ) -> Result<Res, String> {
        let (a, start) = self.addr(addr)?;
        let target = match new_addr {
            Some(t) => self.addr(t)?.0,
            None => 0,
        };
        let got = match self.b.mremap(a, old_len, new_len, flags, target) {
            Ok(got) => got,
            Err(e) => return Ok(Self::errno_res(e)),
        };
        // The result names a region: the one asked for, or the one whose
        // start was remapped.
        let renamed = match (name, addr) {
            (Some(n), _) => Some(n.to_string()),
            (None, Addr::Region { name, off: 0 }) if a == start => Some(name.clone()),
            _ => None,
        };
        let len = (new_len + 4095) & !4095;
        if let Some(n) = &renamed {
            self.st().regions.insert(n.clone(), (got, len));
        }
        let cmp = if got == a {
            "in place"
        } else if new_addr.is_some() && got == target {
            "at target"
        } else {
            "moved"
        };
        let shown = match &renamed {
            Some(n) => format!("{n} at {got:#x}"),
            None => format!("at {got:#x}"),
        };
        Ok(Res::Ok(Some(cmp.into()), shown))
    }

    /// `munmap ADDR [LEN]` (a region's whole length when omitted).
    fn munmap(&mut self, addr: &Addr, len: Option<u64>) -> Result<Res, String> {
        let (a, _) = self.addr(addr)?;
        let len = match len {
            Some(l) => l,
            None => self
                .region_len(addr)
                .ok_or("munmap of an address needs a length")?,
        };
        Ok(Self::done(self.b.munmap(a, len)))
    }

    /// `fill ADDR LEN SEED [every=SIZE]`: one word of the pattern per page
    /// (or per SIZE).
    fn fill(&mut self, addr: &Addr, len: u64, seed: u64, every: u64) -> Result<Res, String> {
        let (a, base) = self.addr(addr)?;
        let end = a.checked_add(len).ok_or("the range wraps around")?;
        let mut p = a;
        while p < end {
            if let Err(e) = self.b.store(p, pattern(seed, p.wrapping_sub(base))) {
                return Ok(Self::errno_res(e));
            }
            p = match p.checked_add(every) {
                Some(n) => n,
                None => break,
            };
        }
        Ok(ok("ok"))
    }

    /// `check ADDR LEN SEED|zero [every=SIZE]`: the word of each page (or
    /// of one every SIZE).
    fn check(&mut self, addr: &Addr, len: u64, pat: &Pattern, every: u64) -> Result<Res, String> {
        let (a, base) = self.addr(addr)?;
        let end = a.checked_add(len).ok_or("the range wraps around")?;
        let mut p = a;
        while p < end {
            let want = match pat {
                Pattern::Zero => 0,
                Pattern::Seed(s) => pattern(*s, p.wrapping_sub(base)),
            };
            match self.b.load(p) {
                Ok(got) if got == want => {}
                Ok(got) => {
                    return Ok(Res::Fail(
                        format!("at +{:#x}: expected {want:#x}, read {got:#x}", p - a),
                        Some(format!("differs at +{:#x}", p - a)),
                    ))
                }
                Err(e) => return Ok(Self::errno_res(e)),
            }
            p = match p.checked_add(every) {
                Some(n) => n,
                None => break,
            };
        }
        Ok(ok("ok"))
    }

    /// `expect ADDR == VALUE`.
    fn expect_value(&mut self, addr: &Addr, value: u64) -> Result<Res, String> {
        let (a, _) = self.addr(addr)?;
        Ok(match self.b.load(a) {
            Ok(v) if v == value => ok(format!("{v:#x}")),
            Ok(v) => Res::Fail(
                format!("expected {value:#x}, read {v:#x}"),
                Some(format!("{v:#x}")),
            ),
            Err(e) => Self::errno_res(e),
        })
    }

    /// `fork CHILD`: the child starts with the parent's regions, no marks.
    /// `exec`: on success the process's regions are gone with its old
    /// address space.
    fn exec_program(
        &mut self,
        path: &str,
        args: &[String],
        rnd: Option<usermm::exec::ExecRandom>,
    ) -> Result<Res, String> {
        if rnd.is_some() && self.vforked.contains_key(&self.cur) {
            // Natively a vfork child execs through this program, with
            // randomisation off.
            return Err("exec aslr= by a vfork child is not made natively".into());
        }
        let process = self.tasks[&self.cur].clone();
        let threads = self.threads_of(&process);
        if !threads.is_empty() && self.cur != process {
            return Err(format!(
                "exec by a thread other than the process's first ({process}) is not modelled"
            ));
        }
        let mut argv = vec![path.to_string()];
        argv.extend(args.iter().cloned());
        Ok(match self.b.exec(path, &argv, rnd)? {
            Ok(()) => {
                // de_thread: past the point of no return, the process's
                // other threads end (a failed exec leaves them be).
                for t in threads {
                    self.b.exit_thread(&t)?;
                    self.tasks.remove(&t);
                }
                if self.vforked.remove(&self.cur).is_some() {
                    // A vfork child becomes a process of its own, and its
                    // parent runs again.
                    self.tasks.insert(self.cur.clone(), self.cur.clone());
                    self.procs.insert(self.cur.clone(), ProcState::default());
                } else {
                    *self.st() = ProcState::default();
                }
                ok("ok")
            }
            Err(e) => Self::errno_res(e),
        })
    }

    /// `brk`: the outcome compared is the break it returns (with
    /// randomisation off both kernels put the heap at the same place).
    fn brk(&mut self, to: &BrkTo, name: Option<&str>) -> Result<Res, String> {
        let old = self.b.brk(0)?;
        let want = match to {
            BrkTo::Query => 0,
            BrkTo::By(by) => old
                .checked_add_signed(*by)
                .ok_or("brk: the break would wrap")?,
            BrkTo::At(a) => self.addr(a)?.0,
        };
        let got = if want == 0 { old } else { self.b.brk(want)? };
        if let Some(n) = name {
            self.st()
                .regions
                .insert(n.to_string(), (old, got.saturating_sub(old)));
        }
        let shown = match name {
            Some(n) => format!("{n} at {old:#x}, brk {got:#x}"),
            None => format!("brk {got:#x}"),
        };
        Ok(Res::Ok(Some(format!("{got:#x}")), shown))
    }

    /// `fork CHILD` (from any thread: the child has that one thread).
    fn fork(&mut self, child: &str) -> Result<Res, String> {
        if self.tasks.contains_key(child) {
            return Err(format!("a thread {child:?} exists"));
        }
        if let Err(e) = self.b.fork(child)? {
            return Ok(Self::errno_res(e));
        }
        let st = self.st().clone();
        self.procs.insert(
            child.to_string(),
            ProcState {
                marks: HashMap::new(),
                ..st
            },
        );
        self.tasks.insert(child.to_string(), child.to_string());
        Ok(ok("ok"))
    }

    /// `vfork CHILD`: until it execs, the child runs the parent's address
    /// space, and shares its regions and marks as a thread does.
    fn vfork(&mut self, child: &str) -> Result<Res, String> {
        if self.tasks.contains_key(child) {
            return Err(format!("a thread {child:?} exists"));
        }
        if let Err(e) = self.b.vfork(child)? {
            return Ok(Self::errno_res(e));
        }
        let parent = self.tasks[&self.cur].clone();
        self.tasks.insert(child.to_string(), parent.clone());
        self.vforked.insert(child.to_string(), parent);
        Ok(ok("ok"))
    }

    /// The vfork child that process `p` waits for, if any.
    fn waits_for(&self, p: &str) -> Option<&String> {
        self.vforked.iter().find(|(_, q)| *q == p).map(|(c, _)| c)
    }

    /// `thread NAME`: a thread of the current process, which shares its
    /// regions and marks.
    fn thread(&mut self, name: &str) -> Result<Res, String> {
        if self.tasks.contains_key(name) {
            return Err(format!("a thread {name:?} exists"));
        }
        if let Err(e) = self.b.thread(name)? {
            return Ok(Self::errno_res(e));
        }
        let p = self.tasks[&self.cur].clone();
        self.tasks.insert(name.to_string(), p);
        Ok(ok("ok"))
    }

    /// `switch NAME`.
    fn switch(&mut self, name: &str) -> Result<Res, String> {
        if !self.tasks.contains_key(name) {
            return Err(format!("no thread {name:?}"));
        }
        if let Some(c) = self.waits_for(&self.tasks[name]) {
            if c != name {
                return Err(format!(
                    "{name} waits until its vfork child {c} execs or exits"
                ));
            }
        }
        self.b.switch(name)?;
        self.cur = name.to_string();
        Ok(ok("ok"))
    }

    /// `exit [NAME]`: a thread ends; a process's first thread ends the
    /// process (exit_group: its other threads first, then its mm).
    fn exit(&mut self, name: Option<&str>) -> Result<Res, String> {
        let name = name.map_or_else(|| self.cur.clone(), str::to_string);
        let Some(p) = self.tasks.get(&name).cloned() else {
            return Err(format!("no thread {name:?}"));
        };
        if self.vforked.remove(&name).is_some() {
            // A vfork child that has not exec'd: its exit leaves the mm
            // to its parent, which runs again.
            self.b.exit(&name)?;
            self.tasks.remove(&name);
            if !self.tasks.contains_key(&self.cur) {
                if let Some(n) = self.tasks.keys().min().cloned() {
                    self.b.switch(&n)?;
                    self.cur = n;
                }
            }
            return Ok(ok("ok"));
        }
        if let Some(c) = self.waits_for(&p) {
            return Err(format!(
                "{name} waits until its vfork child {c} execs or exits"
            ));
        }
        if p != name {
            self.b.exit_thread(&name)?;
        } else {
            for t in self.threads_of(&p) {
                self.b.exit_thread(&t)?;
                self.tasks.remove(&t);
            }
            self.b.exit(&name)?;
            self.procs.remove(&name);
        }
        self.tasks.remove(&name);
        if !self.tasks.contains_key(&self.cur) {
            // Back to any thread still alive (the interpreter needs one to
            // be current; the scenario should switch).
            if let Some(n) = self.tasks.keys().min().cloned() {
                self.b.switch(&n)?;
                self.cur = n;
            }
        }
        Ok(ok("ok"))
    }

    /// `knob only SIZE`.
    fn knob_only(&mut self, size_kb: u64) -> Res {
        let mut r = self.b.knob(None, "never");
        for kb in [16u64, 32, 64, 128, 256, 512, 1024, 2048] {
            if r.is_ok() {
                let mode = if kb == size_kb { "always" } else { "never" };
                r = self.b.knob(Some(kb), mode);
            }
        }
        Self::settable(r)
    }

    /// `expect FIGURE [since MARK] == VALUE`: only changes are compared
    /// between backends (absolute figures include what the host process
    /// itself uses).
    fn expect_figure(
        &mut self,
        fig: Figure,
        since: Option<&str>,
        value: i64,
    ) -> Result<Res, String> {
        let f = self.b.figures()?;
        let i = fig_index(fig);
        let (got, what) = match since {
            Some(m) => {
                let cur = self.cur.clone();
                let base = self
                    .st()
                    .marks
                    .get(m)
                    .ok_or_else(|| format!("no mark {m:?} in process {cur}"))?
                    .figures[i];
                (f[i] - base, format!("{} since {m}", fig.name()))
            }
            None => (f[i], fig.name().to_string()),
        };
        let cmp = since.map(|_| format!("{} {:+}", fig.name(), got));
        let unit = if fig == Figure::Vmas { "" } else { " kB" };
        Ok(if got == value {
            Res::Ok(cmp, format!("{what} {got:+}{unit}"))
        } else {
            Res::Fail(
                format!("{what}: expected {value:+}{unit}, got {got:+}{unit}"),
                cmp,
            )
        })
    }

    /// `mark NAME`: the figures now, and the counters named anywhere in
    /// the scenario. A counter this side lacks skips the scenario.
    fn mark(&mut self, name: &str) -> Result<Res, String> {
        let figures = self.b.figures()?;
        let mut vmstat = HashMap::new();
        for n in &self.vmstat_names {
            match self.b.vmstat(n) {
                Ok(v) => {
                    vmstat.insert(n.clone(), v);
                }
                Err(why) => return Ok(Res::Skip(why)),
            }
        }
        self.st()
            .marks
            .insert(name.to_string(), Mark { figures, vmstat });
        Ok(Res::Ok(None, "ok".into()))
    }

    /// `expect vmstat NAME since MARK == N`: counters are machine-wide
    /// (system-wide natively), so only their changes are compared.
    fn expect_vmstat(&mut self, name: &str, since: &str, value: i64) -> Result<Res, String> {
        let now = match self.b.vmstat(name) {
            Ok(v) => v,
            Err(why) => return Ok(Res::Skip(why)),
        };
        let cur = self.cur.clone();
        let mark = self
            .st()
            .marks
            .get(since)
            .ok_or_else(|| format!("no mark {since:?} in process {cur}"))?;
        let base = mark.vmstat[name];
        let got = now - base;
        let cmp = Some(format!("vmstat {name} {got:+}"));
        Ok(if got == value {
            Res::Ok(cmp, format!("{name} since {since} {got:+}"))
        } else {
            Res::Fail(
                format!("{name} since {since}: expected {value:+}, got {got:+}"),
                cmp,
            )
        })
    }

    /// `fails ERRNO: STATEMENT`.
    fn fails(&mut self, errno: &str, op: &Op) -> Result<Res, String> {
        Ok(match self.exec_inner(op)? {
            Res::Fail(_, Some(got)) if got == errno => ok(errno),
            Res::Fail(msg, cmp) => Res::Fail(format!("expected {errno}, got: {msg}"), cmp),
            Res::Ok(..) => Res::Fail(
                format!("expected {errno}, but it succeeded"),
                Some("ok".into()),
            ),
            Res::Skip(w) => Res::Skip(w),
        })
    }

    /// `map ... align=A`: map more and trim both ends.
    fn map_aligned(
        &mut self,
        len: u64,
        prot: u32,
        flags: u32,
        align: u64,
        src: (Option<&str>, u64),
    ) -> Result<u64, Errno> {
        let total = len.checked_add(align).ok_or(Errno::ENOMEM)?;
        if src.0.is_some() {
            // A file's offsets must start at the aligned address: reserve
            // the room, then map the file over its aligned part.
            const RESERVE: u32 = parse::MAP_PRIVATE | parse::MAP_ANONYMOUS | parse::MAP_NORESERVE;
            let raw = self.b.mmap(0, total, 0, RESERVE, None, 0)?;
            let a = (raw + align - 1) & !(align - 1);
            self.b
                .mmap(a, len, prot, flags | parse::MAP_FIXED, src.0, src.1)?;
            if a > raw {
                self.b.munmap(raw, a - raw)?;
            }
            if raw + total > a + len {
                self.b.munmap(a + len, raw + total - (a + len))?;
            }
            return Ok(a);
        }
        let raw = self.b.mmap(0, total, prot, flags, None, 0)?;
        let a = (raw + align - 1) & !(align - 1);
        if a > raw {
            self.b.munmap(raw, a - raw)?;
        }
        if raw + len + align > a + len {
            self.b.munmap(a + len, raw + len + align - (a + len))?;
        }
        Ok(a)
    }
}

fn fig_index(f: Figure) -> usize {
    Figure::ALL.iter().position(|&x| x == f).unwrap()
}

/// Run a parsed scenario on a backend.
pub fn run(stmts: &[Stmt], b: &mut dyn Backend, backend: &'static str) -> Report {
    let mut vmstat_names: Vec<String> = stmts
        .iter()
        .filter_map(|s| match &s.op {
            Op::ExpectVmstat { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    vmstat_names.sort();
    vmstat_names.dedup();
    let mut it = Interp {
        b,
        procs: HashMap::from([(MAIN.to_string(), ProcState::default())]),
        tasks: HashMap::from([(MAIN.to_string(), MAIN.to_string())]),
        cur: MAIN.to_string(),
        vforked: HashMap::new(),
        vmstat_names,
    };
    let mut outcomes = vec![];
    let (mut passed, mut failed) = (0, 0);
    for s in stmts {
        let (compare, shown, fail) = match it.exec(&s.op) {
            Res::Ok(c, shown) => (c, shown, None),
            Res::Fail(msg, c) => (c, String::new(), Some(msg)),
            Res::Skip(why) => {
                return Report {
                    backend,
                    machine: it.b.machine(),
                    outcomes,
                    passed,
                    failed,
                    skipped: Some(format!("line {}: {why}", s.line)),
                }
            }
        };
        if fail.is_some() {
            failed += 1;
        } else {
            passed += 1;
        }
        outcomes.push(Outcome {
            line: s.line,
            text: s.text.clone(),
            compare,
            shown,
            failed: fail,
        });
    }
    Report {
        backend,
        machine: it.b.machine(),
        outcomes,
        passed,
        failed,
        skipped: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Lines made of the language's words and some that are not.
    fn line() -> impl Strategy<Value = String> {
        let word = prop_oneof![
            Just("map"),
            Just("munmap"),
            Just("mprotect"),
            Just("mremap"),
            Just("madvise"),
            Just("fill"),
            Just("check"),
            Just("write"),
            Just("read"),
            Just("expect"),
            Just("fork"),
            Just("switch"),
            Just("exit"),
            Just("knob"),
            Just("tunable"),
            Just("zap_batch"),
            Just("sysctl"),
            Just("overcommit_memory"),
            Just("mark"),
            Just("print"),
            Just("fails"),
            Just("EINVAL:"),
            Just("A"),
            Just("B"),
            Just("A+4K"),
            Just("A-8K"),
            Just("main"),
            Just("0"),
            Just("4K"),
            Just("2M"),
            Just("1G"),
            Just("0xffffffffffffffff"),
            Just("18446744073709551615"),
            Just("rw"),
            Just("r"),
            Just("none"),
            Just("zero"),
            Just("dontneed"),
            Just("free"),
            Just("hugepage"),
            Just("=="),
            Just("since"),
            Just("VmRSS"),
            Just("VMAs"),
            Just("faults"),
            Just("reading"),
            Just("every=2M"),
            Just("every=3K"),
            Just("await_numa_hint"),
            Just("only"),
            Just("64K"),
            Just("always"),
            Just("never"),
            Just("at=0x600000000000"),
            Just("align=2M"),
            Just("flags=private,anonymous"),
            Just("flags=private,anonymous,fixed"),
            Just("dump"),
            Just("#"),
            Just("\u{0}"),
        ];
        prop::collection::vec(word, 0..7).prop_map(|w| w.join(" "))
    }

    /// Well-formed statements with awkward arguments.
    fn stmt() -> impl Strategy<Value = String> {
        let addr = prop_oneof![
            Just("A"),
            Just("A+4K"),
            Just("A-4K"),
            Just("B+1"),
            Just("0x10"),
            Just("0xfffffffffffff000"),
            Just("0x600000000000")
        ];
        let len = prop_oneof![
            Just("0"),
            Just("4K"),
            Just("64K"),
            Just("2M"),
            Just("1G"),
            Just("0xfffffffffffff000"),
            Just("1")
        ];
        let prot = prop_oneof![Just("rw"), Just("r"), Just("none"), Just("rwx")];
        let adv = prop_oneof![
            Just("dontneed"),
            Just("free"),
            Just("hugepage"),
            Just("nohugepage"),
            Just("pageout")
        ];
        let name = prop_oneof![Just("A"), Just("B"), Just("main"), Just("c")];
        (0..20u8, addr, len, prot, adv, name).prop_map(|(k, a, l, p, v, n)| match k {
            0 => format!("map {n} {l} {p}"),
            1 => format!("map {n} {l} {p} at={a} flags=private,anonymous,fixed"),
            2 => format!("munmap {a} {l}"),
            3 => format!("mprotect {a} {l} {p}"),
            4 => format!("madvise {a} {l} {v}"),
            5 => format!("fill {a} {l} 3"),
            6 => format!("check {a} {l} 3 every=64K"),
            7 => format!("write {a} 5"),
            8 => format!("fork {n}"),
            9 => format!("switch {n}"),
            10 => format!("exit {n}"),
            11 => "knob only 64K".to_string(),
            12 => "mark m\nexpect VmRSS since m == 0".to_string(),
            13 => "tunable zap_batch off".to_string(),
            14 => "tunable fork_batch off".to_string(),
            15 => format!("mlock {a} {l}"),
            16 => format!("mlock {a} {l} onfault"),
            17 => format!("munlock {a} {l}"),
            18 => "mlockall current,future\nmunlockall".to_string(),
            _ => format!("fails EINVAL: munmap {a} {l}"),
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Well-formed scenarios with hostile arguments run in usermm
        /// without panicking, and the machine stays consistent.
        #[test]
        fn awkward_scenarios_run_without_panic(lines in prop::collection::vec(stmt(), 1..16)) {
            let src = format!("map A 64K rw\nmap B 2M rw\n{}", lines.join("\n"));
            let stmts = parse::parse(&src).unwrap();
            let mut b = engine::EngineBackend::new(engine::EngineBackend::default_machine()).unwrap();
            let _ = run(&stmts, &mut b, "usermm");
            b.check().map_err(|e| TestCaseError::fail(format!("{src}\n{e}")))?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Any text: the parser answers with statements or an error; the
        /// statements run in usermm without panicking.
        #[test]
        fn hostile_scenarios_never_panic(lines in prop::collection::vec(line(), 1..24)) {
            let src = lines.join("\n");
            if let Ok(stmts) = parse::parse(&src) {
                let mut b = engine::EngineBackend::new(engine::EngineBackend::default_machine()).unwrap();
                let r = run(&stmts, &mut b, "usermm");
                prop_assert!(r.outcomes.len() <= stmts.len());
            }
        }
    }
}
