//! `usermm trace replay`: run a recorded program's memory management in
//! the engine and compare it with what the host kernel did.
//!
//! The replay drives the scenario engine's backend (one machine, every
//! process an mm, every thread a CPU), one event at a time in the
//! recorded order: an exec execs the same program with the same
//! arguments and environment (so the stack holds the same strings), each
//! call is made with its recorded arguments, each fault becomes the
//! access that took it (a store for a write fault, a load otherwise, at
//! the faulting address). What is compared:
//!
//! * each call's result against the kernel's (an mmap the engine places
//!   elsewhere is counted, then moved to the kernel's address with
//!   `MAP_FIXED`, so that the program's later addresses still mean the
//!   same mapping);
//! * the address space each exec built, line by line with /proc/PID/maps;
//! * the faults: the engine's `pgfault` count over the replay against the
//!   faults recorded (the kernel's `exceptions:page_fault_*` fire only on
//!   hardware faults, so the faults `execve` and other get-user-pages
//!   paths take for the process are counted by the engine alone);
//! * each process's figures as its last thread exits (VmRSS, RssAnon,
//!   RssFile, RssShmem, VmPTE, the number of VMAs).
//!
//! Not replayed (counted): `memfd_create`, `mbind`, `set_mempolicy` and
//! `move_pages` (their arguments point into memory the recorder does not
//! read), and mappings of files the trace could not identify.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::Serialize;
use usermm::Errno;

use super::format::{Access, Call, Event, Figures, Sys, Trace, What};
use crate::scenario::engine::EngineBackend;
use crate::scenario::parse::{Figure, MlockCall};
use crate::scenario::Backend;

/// The most divergences listed one by one.
const MAX_NOTES: usize = 20;

const MAP_FIXED: u32 = 0x10;
const MAP_ANONYMOUS: u32 = 0x20;

/// The figures compared at a process's exit.
pub const COMPARED: [&str; 6] = ["VmRSS", "RssAnon", "RssFile", "RssShmem", "VmPTE", "VMAs"];

#[derive(Debug, Default, Serialize)]
pub struct CallTally {
    pub replayed: u64,
    /// Same result as the kernel's (an errno, or an address).
    pub agreed: u64,
    /// Not made in the engine (see the module doc).
    pub skipped: u64,
}

#[derive(Debug, Serialize)]
pub struct ProcessReport {
    pub pid: i32,
    pub program: String,
    /// (figure, kernel's, usermm's), kB or a count.
    pub figures: Vec<(String, i64, i64)>,
}

#[derive(Debug, Default, Serialize)]
pub struct ReplayReport {
    pub events: u64,
    pub seconds: f64,
    pub calls: BTreeMap<&'static str, CallTally>,
    /// mmaps that succeeded in both at different addresses.
    pub placed_elsewhere: u64,
    pub faults_recorded: u64,
    /// Accesses the engine refused (no mapping there, or SIGBUS).
    pub faults_refused: u64,
    /// The engine's `pgfault` over the replay.
    pub engine_faults: u64,
    pub execs: u64,
    /// maps lines after exec: alike, and in all.
    pub exec_maps_alike: u64,
    pub exec_maps_lines: u64,
    pub processes: Vec<ProcessReport>,
    /// Events of threads the trace never introduced (skipped).
    pub orphan_events: u64,
    /// Mapped files whose bytes are not those the program mapped (changed
    /// or missing since the recording): the replay cannot be expected to
    /// agree where they matter.
    pub files_changed: Vec<String>,
    /// The first divergences, one line each.
    pub notes: Vec<String>,
    /// The events around the first call whose result differed, that one
    /// marked `>`.
    pub first_disagreement: Vec<String>,
    /// The engine's tunables, each `name=value`.
    pub tunables: Vec<String>,
    /// Machine-wide counters over the replay (/proc/vmstat names).
    pub counters: BTreeMap<&'static str, i64>,
}

/// The counters a replay reports.
const COUNTERS: [&str; 8] = [
    "pgfault",
    "pgmajfault",
    "thp_fault_alloc",
    "thp_split_pmd",
    "pgfree",
    "nr_tlb_remote_flush",
    "nr_tlb_remote_flush_received",
    "workingset_refault_file",
];

impl ReplayReport {
    fn note(&mut self, s: String) {
        if self.notes.len() < MAX_NOTES {
            self.notes.push(s);
        }
    }

    /// Every call's result agreed, every exec built the same address
    /// space and every compared figure is equal.
    pub fn agrees(&self) -> bool {
        self.calls
            .values()
            .all(|c| c.agreed + c.skipped == c.replayed)
            && self.exec_maps_alike == self.exec_maps_lines
            && self
                .processes
                .iter()
                .all(|p| p.figures.iter().all(|(_, k, u)| k == u))
    }

    pub fn print(&self, trace: &Trace) {
        crate::outln!(
            "replayed {} events of `{}` (recorded on {}) in {:.2} s: {:.2} M events/s",
            self.events,
            trace.cmd.join(" "),
            trace.kernel,
            self.seconds,
            self.events as f64 / self.seconds.max(1e-9) / 1e6
        );
        crate::outln!(
            "{:<14} {:>9} {:>9} {:>9}",
            "call",
            "replayed",
            "agreed",
            "skipped"
        );
        for (name, c) in &self.calls {
            crate::outln!(
                "{name:<14} {:>9} {:>9} {:>9}",
                c.replayed,
                c.agreed,
                c.skipped
            );
        }
        crate::outln!(
            "mmaps placed elsewhere: {}; execs: {} (maps lines alike: {} of {})",
            self.placed_elsewhere,
            self.execs,
            self.exec_maps_alike,
            self.exec_maps_lines
        );
        crate::outln!(
            "faults: {} recorded, {} taken by usermm, {} accesses refused",
            self.faults_recorded,
            self.engine_faults,
            self.faults_refused
        );
        for p in &self.processes {
            crate::outln!("process {} ({}):", p.pid, p.program);
            crate::outln!(
                "  {:<10} {:>10} {:>10} {:>8}",
                "figure",
                "kernel",
                "usermm",
                "diff"
            );
            for (n, k, u) in &p.figures {
                let unit = if n == "VMAs" { "" } else { " kB" };
                crate::outln!("  {n:<10} {k:>10} {u:>10} {:>+8}{unit}", u - k);
            }
        }
        for f in &self.files_changed {
            crate::outln!("CHANGED since the recording (replayed as it is now): {f}");
        }
        if self.orphan_events > 0 {
            crate::outln!(
                "{} events of threads the trace did not introduce",
                self.orphan_events
            );
        }
        for n in &self.notes {
            crate::outln!("  {n}");
        }
        if !self.first_disagreement.is_empty() {
            crate::outln!("around the first call that differed:");
            for l in &self.first_disagreement {
                crate::outln!("  {l}");
            }
        }
        crate::outln!("tunables: {}", self.tunables.join(" "));
        let c: Vec<String> = self
            .counters
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        crate::outln!("counters: {}", c.join(", "));
        crate::outln!(
            "{}",
            if self.agrees() {
                "verdict: agrees with the host kernel"
            } else {
                "verdict: differs from the host kernel (see above)"
            }
        );
    }
}

struct Replay<'t> {
    b: EngineBackend,
    trace: &'t Trace,
    /// Each live thread's name in the backend, and its process.
    names: HashMap<i32, String>,
    /// The live threads of each process other than its first.
    threads: HashMap<i32, Vec<i32>>,
    /// Each process's program, for the report.
    programs: HashMap<i32, String>,
    /// The backend's name of each opened file, or None where it could not
    /// be opened.
    files: HashMap<u32, Option<String>>,
    /// maps lines recorded after the latest exec, compared at the next
    /// event.
    pending_maps: Option<(i32, Vec<String>)>,
    /// The VMAs' resident sizes recorded at each process's exit.
    vma_rss: HashMap<i32, Vec<(u64, u64, u64)>>,
    /// Files start uncached (else each is read whole when first mapped).
    cold_cache: bool,
    /// The thread the backend runs now (None: switch at the next event).
    on_tid: Option<i32>,
    /// The index of the event being replayed, and of the first call whose
    /// result differed.
    at: usize,
    first_bad: Option<usize>,
    r: ReplayReport,
}

/// Replay `trace` on `b`.
pub fn replay(trace: &Trace, b: EngineBackend, cold_cache: bool) -> anyhow::Result<ReplayReport> {
    let mut rp = Replay {
        b,
        trace,
        names: HashMap::new(),
        threads: HashMap::new(),
        programs: HashMap::new(),
        files: HashMap::new(),
        pending_maps: None,
        vma_rss: HashMap::new(),
        cold_cache,
        on_tid: None,
        at: 0,
        first_bad: None,
        r: ReplayReport::default(),
    };
    let Some(first) = trace.events.first() else {
        anyhow::bail!("the trace has no events");
    };
    rp.names.insert(first.pid, "main".into());
    rp.r.files_changed = changed_files(trace);
    rp.set_knobs()?;
    if !cold_cache {
        rp.warm_exec_files();
    }
    let counters0: Vec<Option<i64>> = COUNTERS.iter().map(|c| rp.b.vmstat(c).ok()).collect();
    let start = Instant::now();
    for (i, ev) in trace.events.iter().enumerate() {
        rp.at = i;
        rp.event(ev)?;
    }
    rp.compare_maps()?;
    rp.r.seconds = start.elapsed().as_secs_f64();
    rp.r.events = trace.events.len() as u64;
    for (c, before) in COUNTERS.iter().zip(counters0) {
        if let (Some(b), Ok(a)) = (before, rp.b.vmstat(c)) {
            rp.r.counters.insert(c, a - b);
        }
    }
    rp.r.engine_faults = rp.r.counters.get("pgfault").copied().unwrap_or(0) as u64;
    rp.r.tunables =
        rp.b.tunables()
            .list()
            .into_iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
    if let Some(i) = rp.first_bad {
        let lo = i.saturating_sub(3);
        let hi = (i + 4).min(trace.events.len());
        rp.r.first_disagreement = (lo..hi)
            .map(|j| format!("{} {}", if j == i { ">" } else { " " }, trace.events[j]))
            .collect();
    }
    Ok(rp.r)
}

/// The trace's files whose contents here are not those recorded (changed,
/// or gone).
pub fn changed_files(trace: &Trace) -> Vec<String> {
    trace
        .files
        .iter()
        .filter(|f| {
            f.hash != 0
                && super::format::content_hash(std::path::Path::new(&f.path)) != Some(f.hash)
        })
        .map(|f| f.path.clone())
        .collect()
}

fn result(r: Result<u64, Errno>) -> i64 {
    match r {
        Ok(v) => v as i64,
        Err(e) => -(e.0 as i64),
    }
}

fn show(v: i64) -> String {
    if v < 0 {
        Errno(-v as i32).name().to_string()
    } else {
        format!("{v:#x}")
    }
}

impl Replay<'_> {
    /// The host's THP settings of the recording, so that the engine
    /// makes the folios the kernel could. A size the engine does not
    /// model is noted, unless it was off.
    fn set_knobs(&mut self) -> anyhow::Result<()> {
        for (k, v) in &self.trace.knobs {
            let size = k
                .strip_prefix("hugepages-")
                .and_then(|s| s.split_once("kB/"))
                .and_then(|(kb, what)| Some((kb.parse::<u64>().ok()?, what)));
            let r = match (k.as_str(), size) {
                ("enabled", _) => self.b.knob(None, v),
                ("shmem_enabled", _) => self.b.knob_shmem(None, v),
                ("use_zero_page", _) => self.b.knob_use_zero_page(v == "1"),
                (_, Some((kb, "enabled"))) => self.b.knob(Some(kb), v),
                (_, Some((kb, "shmem_enabled"))) => self.b.knob_shmem(Some(kb), v),
                _ => Err(format!("unknown knob {k}")),
            };
            if let Err(e) = r {
                if v != "never" {
                    self.r.note(format!("THP setting {k}={v} not applied: {e}"));
                }
            }
        }
        Ok(())
    }

    fn event(&mut self, ev: &Event) -> anyhow::Result<()> {
        if !matches!(ev.what, What::Vma(_)) {
            self.compare_maps()?;
        }
        let Some(name) = self.names.get(&ev.tid) else {
            self.r.orphan_events += 1;
            return Ok(());
        };
        if self.on_tid != Some(ev.tid) {
            self.b.switch(name).map_err(anyhow::Error::msg)?;
            self.on_tid = Some(ev.tid);
        }
        match &ev.what {
            What::Exec { path, argv, env } => {
                self.r.execs += 1;
                self.programs.insert(ev.pid, path.clone());
                if let Err(e) = self.b.exec_env(path, argv, env, None) {
                    self.r
                        .note(format!("{} {}: exec {path}: {e}", ev.t_us, ev.pid));
                }
                self.pending_maps = Some((ev.pid, Vec::new()));
            }
            What::Vma(line) => {
                if let Some((_, lines)) = &mut self.pending_maps {
                    lines.push(line.clone());
                }
            }
            What::Fork { child } | What::Vfork { child } | What::Thread { child } => {
                self.child(ev, *child)?;
            }
            What::Figures(f) => self.figures(ev.pid, f)?,
            &What::Rss { start, end, kb } => {
                self.vma_rss
                    .entry(ev.pid)
                    .or_default()
                    .push((start, end, kb));
            }
            What::Exit { group } => self.exit(ev, *group)?,
            What::Call(c) => self.call(ev, c)?,
            What::Fault { addr, access, .. } => {
                self.r.faults_recorded += 1;
                let a = addr & !7;
                let r = match access {
                    Access::Write => self.b.store(a, a),
                    Access::Read | Access::Exec => self.b.load(a).map(|_| ()),
                };
                if let Err(e) = r {
                    self.r.faults_refused += 1;
                    self.r
                        .note(format!("{} {}: fault at {addr:#x}: {e}", ev.t_us, ev.tid));
                }
            }
        }
        Ok(())
    }

    fn child(&mut self, ev: &Event, child: i32) -> anyhow::Result<()> {
        let (name, r) = match ev.what {
            What::Thread { .. } => {
                let name = format!("t{child}");
                self.threads.entry(ev.pid).or_default().push(child);
                let r = self.b.thread(&name);
                (name, r)
            }
            What::Vfork { .. } => {
                let name = format!("p{child}");
                (name.clone(), self.b.vfork(&name))
            }
            _ => {
                let name = format!("p{child}");
                (name.clone(), self.b.fork(&name))
            }
        };
        match r.map_err(anyhow::Error::msg)? {
            Ok(()) => {
                self.names.insert(child, name);
                if let Some(p) = self.programs.get(&ev.pid).cloned() {
                    self.programs.insert(child, p);
                }
            }
            Err(e) => self.r.note(format!("{} {}: {name}: {e}", ev.t_us, ev.pid)),
        }
        Ok(())
    }

    fn exit(&mut self, ev: &Event, group: bool) -> anyhow::Result<()> {
        // The backend's current thread may be the one that goes.
        self.on_tid = None;
        if ev.tid != ev.pid {
            // A thread other than the first: it leaves the mm to the rest.
            if let Some(name) = self.names.remove(&ev.tid) {
                self.b.exit_thread(&name).map_err(anyhow::Error::msg)?;
            }
            if let Some(v) = self.threads.get_mut(&ev.pid) {
                v.retain(|&t| t != ev.tid);
            }
        }
        if !group {
            // The first thread gone before the others: the process ends
            // with its last thread, at the group exit.
            return Ok(());
        }
        for t in self.threads.remove(&ev.pid).unwrap_or_default() {
            if let Some(name) = self.names.remove(&t) {
                self.b.exit_thread(&name).map_err(anyhow::Error::msg)?;
            }
        }
        if let Some(name) = self.names.remove(&ev.pid) {
            self.b.switch(&name).map_err(anyhow::Error::msg)?;
            self.b.exit(&name).map_err(anyhow::Error::msg)?;
        }
        Ok(())
    }

    fn figures(&mut self, pid: i32, recorded: &Figures) -> anyhow::Result<()> {
        let Some(name) = self.names.get(&pid).cloned() else {
            return Ok(());
        };
        self.b.switch(&name).map_err(anyhow::Error::msg)?;
        self.on_tid = None;
        let ours = self.b.figures().map_err(anyhow::Error::msg)?;
        // Which VMAs the resident sizes differ in.
        let recorded_rss = self.vma_rss.remove(&pid).unwrap_or_default();
        let our_rss = self.b.vma_rss();
        for &(s, e, kb) in &recorded_rss {
            let o = our_rss
                .iter()
                .find(|r| r.0 == s && r.1 == e)
                .map_or(0, |r| r.2);
            if o != kb {
                self.r.note(format!(
                    "{pid}: VMA {s:#x}-{e:#x}: Rss {kb} kB in the kernel, {o} kB in usermm"
                ));
            }
        }
        for &(s, e, o) in &our_rss {
            if !recorded_rss.iter().any(|r| r.0 == s && r.1 == e) {
                self.r.note(format!(
                    "{pid}: VMA {s:#x}-{e:#x}: Rss 0 kB in the kernel, {o} kB in usermm"
                ));
            }
        }
        let ours_of = |n: &str| {
            Figure::ALL
                .iter()
                .position(|f| f.name() == n)
                .map(|i| ours[i])
        };
        let figures = COMPARED
            .iter()
            .filter_map(|n| Some((n.to_string(), recorded.get(n)?, ours_of(n)?)))
            .collect();
        self.r.processes.push(ProcessReport {
            pid,
            program: self.programs.get(&pid).cloned().unwrap_or_default(),
            figures,
        });
        Ok(())
    }

    /// Compare the address space the latest exec built with the one
    /// recorded.
    fn compare_maps(&mut self) -> anyhow::Result<()> {
        let Some((pid, recorded)) = self.pending_maps.take() else {
            return Ok(());
        };
        let Some(name) = self.names.get(&pid).cloned() else {
            return Ok(());
        };
        self.b.switch(&name).map_err(anyhow::Error::msg)?;
        self.on_tid = None;
        // Device and inode left out: a file is the same by its contents
        // (the trace's hash), wherever it lies now.
        let key = |l: &str| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let mut k: Vec<&str> = w.iter().take(3).copied().collect();
            k.extend(w.iter().skip(5));
            k.join(" ")
        };
        let ours: Vec<String> = self
            .b
            .maps()
            .map_err(anyhow::Error::msg)?
            .iter()
            .map(|l| key(l))
            .collect();
        self.r.exec_maps_lines += recorded.len() as u64;
        for line in &recorded {
            if ours.contains(&key(line)) {
                self.r.exec_maps_alike += 1;
            } else {
                self.r
                    .note(format!("{pid}: after exec, no such VMA in usermm: {line}"));
            }
        }
        Ok(())
    }

    /// Read into the page cache every file an exec maps (the programs and
    /// their interpreters, which exec opens itself), as the host had them.
    fn warm_exec_files(&mut self) {
        let mut paths: Vec<&str> = self
            .trace
            .events
            .iter()
            .filter_map(|e| match &e.what {
                What::Vma(line) => line.split_whitespace().nth(5),
                _ => None,
            })
            .filter(|p| p.starts_with('/'))
            .collect();
        paths.sort_unstable();
        paths.dedup();
        for (i, path) in paths.into_iter().enumerate() {
            let name = format!("exec{i}");
            let cached = self
                .trace
                .files
                .iter()
                .find(|f| f.path == path)
                .and_then(|f| f.cached.as_deref());
            if self.b.open_file(&name, path).is_ok() {
                let _ = self.b.warm_file(&name, cached);
            }
        }
    }

    /// The backend's name of the trace's file `id`, opened on first use.
    fn file(&mut self, id: u32) -> Option<String> {
        if let Some(f) = self.files.get(&id) {
            return f.clone();
        }
        let tf = self.trace.files.iter().find(|f| f.id == id)?;
        let name = format!("f{id}");
        let opened = match self.b.open_file(&name, &tf.path) {
            Ok(()) => {
                if !self.cold_cache {
                    let _ = self.b.warm_file(&name, tf.cached.as_deref());
                }
                Some(name)
            }
            Err(e) => {
                self.r.note(format!("file {}: {e}", tf.path));
                None
            }
        };
        self.files.insert(id, opened.clone());
        opened
    }

    fn call(&mut self, ev: &Event, c: &Call) -> anyhow::Result<()> {
        let tally = self.r.calls.entry(c.sys.name()).or_default();
        tally.replayed += 1;
        let a = |n| c.arg(n);
        let got: i64 = match c.sys {
            Sys::Mmap => match self.mmap(ev, c) {
                Some(v) => v,
                None => {
                    self.r.calls.get_mut(c.sys.name()).expect("tallied").skipped += 1;
                    return Ok(());
                }
            },
            Sys::Munmap => result(self.b.munmap(a("addr"), a("len")).map(|()| 0)),
            Sys::Mprotect => result(
                self.b
                    .mprotect(a("start"), a("len"), a("prot") as u32)
                    .map(|()| 0),
            ),
            Sys::Madvise => result(
                self.b
                    .madvise(a("start"), a("len_in"), a("behavior") as i32)
                    .map(|()| 0),
            ),
            Sys::Brk => match self.b.brk(a("brk")) {
                Ok(v) => v as i64,
                Err(e) => {
                    self.r.note(format!("{} {}: brk: {e}", ev.t_us, ev.tid));
                    i64::MIN
                }
            },
            Sys::Mremap => result(self.b.mremap(
                a("addr"),
                a("old_len"),
                a("new_len"),
                a("flags") as u32,
                a("new_addr"),
            )),
            Sys::Mlock | Sys::Mlock2 => self.mlock(MlockCall::Mlock {
                addr: a("start"),
                len: a("len"),
                flags: a("flags") as u32,
            }),
            Sys::Munlock => self.mlock(MlockCall::Munlock {
                addr: a("start"),
                len: a("len"),
            }),
            Sys::Mlockall => self.mlock(MlockCall::Mlockall {
                flags: a("flags") as u32,
            }),
            Sys::Munlockall => self.mlock(MlockCall::Munlockall),
            Sys::Msync => result(
                self.b
                    .msync(a("start"), a("len"), a("flags") as u32)
                    .map(|()| 0),
            ),
            Sys::MemfdCreate | Sys::Mbind | Sys::SetMempolicy | Sys::MovePages => {
                self.r.calls.get_mut(c.sys.name()).expect("tallied").skipped += 1;
                return Ok(());
            }
        };
        if got == c.ret {
            self.r.calls.get_mut(c.sys.name()).expect("tallied").agreed += 1;
        } else {
            self.first_bad.get_or_insert(self.at);
            self.r.note(format!(
                "{} {}: {}: kernel {}, usermm {}",
                ev.t_us,
                ev.tid,
                ev.to_string().split_once(' ').map_or("", |x| x.1),
                show(c.ret),
                show(got)
            ));
        }
        Ok(())
    }

    fn mlock(&mut self, call: MlockCall<u64>) -> i64 {
        result(self.b.mlock(&call).map(|()| 0))
    }

    /// Make the mmap: its result, or None where it cannot be made here.
    /// One placed elsewhere is moved to the kernel's address.
    fn mmap(&mut self, ev: &Event, c: &Call) -> Option<i64> {
        let flags = c.arg("flags") as u32;
        let file = if flags & MAP_ANONYMOUS != 0 {
            None
        } else {
            let Some(f) = c.file.and_then(|id| self.file(id)) else {
                if c.errno().is_none() {
                    self.r.note(format!(
                        "{} {}: mmap of an unknown file skipped",
                        ev.t_us, ev.tid
                    ));
                }
                return None;
            };
            Some(f)
        };
        let (addr, len, prot, off) = (
            c.arg("addr"),
            c.arg("len"),
            c.arg("prot") as u32,
            c.arg("off"),
        );
        let got = result(self.b.mmap(addr, len, prot, flags, file.as_deref(), off));
        if got >= 0 && c.ret >= 0 && got != c.ret {
            self.r.placed_elsewhere += 1;
            self.r.note(format!(
                "{} {}: mmap placed at {got:#x}, the kernel's at {:#x}",
                ev.t_us, ev.tid, c.ret
            ));
            let _ = self.b.munmap(got as u64, len);
            let again = self.b.mmap(
                c.ret as u64,
                len,
                prot,
                flags | MAP_FIXED,
                file.as_deref(),
                off,
            );
            return Some(result(again));
        }
        Some(got)
    }
}
