//! The trace format, version 1 (docs/traces.md): text, one event a line,
//! gzip-compressed on disk.
//!
//! ```text
//! usermm-trace 1
//! kernel "6.18.3"
//! cmd ["ls","/"]
//! lost 0
//! file 1 fe:00 326279 2125328 "/usr/lib/x86_64-linux-gnu/libc.so.6"
//! 0 4711/4711 exec "/usr/bin/ls" argv=["ls","/"] env=["PATH=/usr/bin"]
//! 0 4711/4711 vma "555555554000-555555558000 r--p 00000000 fe:00 247756 /usr/bin/ls"
//! 31 4711/4711 fault 0x7ffff7fc3b70 x
//! 52 4711/4711 mmap addr=0x0 len=0x2000 prot=0x3 flags=0x22 fd=0xffffffff off=0x0 = 0x7ffff7fbd000
//! 60 4711/4711 mmap addr=0x0 len=0x1e1f50 prot=0x1 flags=0x802 fd=0x3 off=0x0 = 0x7ffff7dbb000 file=1
//! 75 4711/4711 fault 0x7ffff7fbd008 w
//! 80 4711/4711 fork 4712
//! 990 4711/4711 figures VmRSS=2816 RssAnon=256 RssFile=2560 RssShmem=0 VmPTE=48 VmSize=8412 VmSwap=0 VMAs=25
//! 990 4711/4711 exit group
//! ```
//!
//! An event line is the time in microseconds from the start, the process
//! (thread group) and thread ids, the kind and its fields. Strings are JSON
//! strings; numbers are `0x` hexadecimal or decimal. The header lines come
//! first, each once except `file`.

use std::io::{BufRead, Write};

/// The version this build writes and reads.
pub const VERSION: u32 = 1;

const MAGIC: &str = "usermm-trace";

/// A recorded run: its header and its events in time order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// `uname -r` of the kernel it was recorded on.
    pub kernel: String,
    /// The command line recorded.
    pub cmd: Vec<String>,
    /// Events the recorder's buffers dropped (0 for a complete trace).
    pub lost: u64,
    /// The host's THP settings while it ran
    /// (/sys/kernel/mm/transparent_hugepage: `enabled`, `shmem_enabled`,
    /// `use_zero_page`, `hugepages-<size>kB/enabled` and `/shmem_enabled`),
    /// each the value selected.
    pub knobs: Vec<(String, String)>,
    /// The files its mappings map, by id.
    pub files: Vec<TraceFile>,
    pub events: Vec<Event>,
}

/// A mapped file: its path when recorded, its identity (device and inode),
/// and its size and contents' hash when the recording ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceFile {
    pub id: u32,
    /// `major:minor` in hexadecimal, as /proc/PID/maps writes it.
    pub dev: String,
    pub ino: u64,
    pub size: u64,
    /// [`content_hash`] of the file's bytes (0 where it could not be read).
    pub hash: u64,
    pub path: String,
    /// The file's pages in the host's page cache as the recording ended
    /// (`mincore`), as page ranges `[start, end)`: what a replay caches
    /// first. None where unknown (the whole file is cached then).
    pub cached: Option<Vec<(u64, u64)>>,
}

/// FNV-1a (64-bit) of a file's bytes: whether a replay maps the bytes the
/// program mapped. None where it cannot be read.
pub fn content_hash(path: &std::path::Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    Some(bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }))
}

#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Microseconds since the first event.
    pub t_us: u64,
    /// The thread group (process).
    pub pid: i32,
    /// The thread.
    pub tid: i32,
    pub what: What,
}

#[derive(Clone, Debug, PartialEq)]
pub enum What {
    /// `execve(2)` succeeded: the program and the strings its stack
    /// starts with. `Vma` events follow with the address space it built.
    Exec {
        path: String,
        argv: Vec<String>,
        env: Vec<String>,
    },
    /// One line of /proc/PID/maps right after an exec.
    Vma(String),
    /// A new process (fork, or clone without `CLONE_VM`).
    Fork { child: i32 },
    /// A child that runs this process's mm until it execs or exits.
    Vfork { child: i32 },
    /// A new thread of this process.
    Thread { child: i32 },
    /// The kernel's own figures of the process as its last thread exits.
    Figures(Figures),
    /// One VMA's resident size (kB) as the process's last thread exits
    /// (/proc/PID/smaps' `Rss`; VMAs with none are not written).
    Rss { start: u64, end: u64, kb: u64 },
    /// A thread exits; `group`: the last of its process.
    Exit { group: bool },
    /// A memory-management system call and its result.
    Call(Call),
    /// A page fault on a user address.
    Fault {
        addr: u64,
        access: Access,
        /// Taken in kernel mode (a system call copying to or from user
        /// memory).
        kernel: bool,
    },
}

/// What a faulting access did (x86's error code: write bit, instruction
/// fetch bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    Write,
    Exec,
}

impl Access {
    /// From an x86 page-fault error code.
    pub fn from_error_code(code: u64) -> Access {
        if code & (1 << 4) != 0 {
            Access::Exec
        } else if code & (1 << 1) != 0 {
            Access::Write
        } else {
            Access::Read
        }
    }

    fn letter(self) -> &'static str {
        match self {
            Access::Read => "r",
            Access::Write => "w",
            Access::Exec => "x",
        }
    }
}

/// /proc/PID/status figures (kB) and the number of VMAs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Figures(pub Vec<(String, i64)>);

impl Figures {
    /// The names a recorder writes, in order.
    pub const NAMES: [&'static str; 8] = [
        "VmRSS", "RssAnon", "RssFile", "RssShmem", "VmPTE", "VmSize", "VmSwap", "VMAs",
    ];

    pub fn get(&self, name: &str) -> Option<i64> {
        self.0.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
}

/// The system calls a trace records, with their arguments in the order
/// and under the names of the kernel's `syscalls:sys_enter_*` tracepoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Sys {
    Mmap,
    Munmap,
    Mprotect,
    Madvise,
    Brk,
    Mremap,
    Mlock,
    Mlock2,
    Munlock,
    Mlockall,
    Munlockall,
    Msync,
    MemfdCreate,
    Mbind,
    SetMempolicy,
    MovePages,
}

impl Sys {
    pub const ALL: [Sys; 16] = [
        Sys::Mmap,
        Sys::Munmap,
        Sys::Mprotect,
        Sys::Madvise,
        Sys::Brk,
        Sys::Mremap,
        Sys::Mlock,
        Sys::Mlock2,
        Sys::Munlock,
        Sys::Mlockall,
        Sys::Munlockall,
        Sys::Msync,
        Sys::MemfdCreate,
        Sys::Mbind,
        Sys::SetMempolicy,
        Sys::MovePages,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Sys::Mmap => "mmap",
            Sys::Munmap => "munmap",
            Sys::Mprotect => "mprotect",
            Sys::Madvise => "madvise",
            Sys::Brk => "brk",
            Sys::Mremap => "mremap",
            Sys::Mlock => "mlock",
            Sys::Mlock2 => "mlock2",
            Sys::Munlock => "munlock",
            Sys::Mlockall => "mlockall",
            Sys::Munlockall => "munlockall",
            Sys::Msync => "msync",
            Sys::MemfdCreate => "memfd_create",
            Sys::Mbind => "mbind",
            Sys::SetMempolicy => "set_mempolicy",
            Sys::MovePages => "move_pages",
        }
    }

    /// The argument names, as the tracepoint has them.
    pub fn arg_names(self) -> &'static [&'static str] {
        match self {
            Sys::Mmap => &["addr", "len", "prot", "flags", "fd", "off"],
            Sys::Munmap => &["addr", "len"],
            Sys::Mprotect => &["start", "len", "prot"],
            Sys::Madvise => &["start", "len_in", "behavior"],
            Sys::Brk => &["brk"],
            Sys::Mremap => &["addr", "old_len", "new_len", "flags", "new_addr"],
            Sys::Mlock | Sys::Munlock => &["start", "len"],
            Sys::Mlock2 => &["start", "len", "flags"],
            Sys::Mlockall => &["flags"],
            Sys::Munlockall => &[],
            Sys::Msync => &["start", "len", "flags"],
            Sys::MemfdCreate => &["uname", "flags"],
            Sys::Mbind => &["start", "len", "mode", "nmask", "maxnode", "flags"],
            Sys::SetMempolicy => &["mode", "nmask", "maxnode"],
            Sys::MovePages => &["pid", "nr_pages", "pages", "nodes", "status", "flags"],
        }
    }

    pub fn from_name(s: &str) -> Option<Sys> {
        Sys::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// One system call: its arguments (in [`Sys::arg_names`]' order), its
/// result (a negative errno on failure), and for an `mmap` of a file the
/// file's id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub sys: Sys,
    pub args: Vec<u64>,
    pub ret: i64,
    pub file: Option<u32>,
}

impl Call {
    /// The argument `name` (0 if the call has none such).
    pub fn arg(&self, name: &str) -> u64 {
        let i = self.sys.arg_names().iter().position(|n| *n == name);
        i.and_then(|i| self.args.get(i).copied()).unwrap_or(0)
    }

    /// A failed call's errno.
    pub fn errno(&self) -> Option<i32> {
        (-4095..0).contains(&self.ret).then(|| (-self.ret) as i32)
    }
}

fn json(s: &impl serde::Serialize) -> String {
    serde_json::to_string(s).expect("strings serialise")
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{} ", self.t_us, self.pid, self.tid)?;
        match &self.what {
            What::Exec { path, argv, env } => {
                write!(
                    f,
                    "exec {} argv={} env={}",
                    json(path),
                    json(argv),
                    json(env)
                )
            }
            What::Vma(line) => write!(f, "vma {}", json(line)),
            What::Fork { child } => write!(f, "fork {child}"),
            What::Vfork { child } => write!(f, "vfork {child}"),
            What::Thread { child } => write!(f, "thread {child}"),
            What::Figures(fig) => {
                write!(f, "figures")?;
                for (n, v) in &fig.0 {
                    write!(f, " {n}={v}")?;
                }
                Ok(())
            }
            What::Exit { group } => write!(f, "exit{}", if *group { " group" } else { "" }),
            What::Rss { start, end, kb } => write!(f, "rss {start:#x}-{end:#x} {kb}"),
            What::Call(c) => {
                write!(f, "{}", c.sys.name())?;
                for (n, v) in c.sys.arg_names().iter().zip(&c.args) {
                    write!(f, " {n}={v:#x}")?;
                }
                if c.ret < 0 {
                    write!(f, " = {}", c.ret)?;
                } else {
                    write!(f, " = {:#x}", c.ret)?;
                }
                if let Some(id) = c.file {
                    write!(f, " file={id}")?;
                }
                Ok(())
            }
            What::Fault {
                addr,
                access,
                kernel,
            } => write!(
                f,
                "fault {addr:#x} {}{}",
                access.letter(),
                if *kernel { " k" } else { "" }
            ),
        }
    }
}

impl Trace {
    /// Write the trace as text (compress with [`Trace::save`]).
    pub fn write_text(&self, w: &mut dyn Write) -> std::io::Result<()> {
        writeln!(w, "{MAGIC} {VERSION}")?;
        writeln!(w, "kernel {}", json(&self.kernel))?;
        writeln!(w, "cmd {}", json(&self.cmd))?;
        writeln!(w, "lost {}", self.lost)?;
        for (k, v) in &self.knobs {
            writeln!(w, "knob {k} {v}")?;
        }
        for f in &self.files {
            writeln!(
                w,
                "file {} {} {} {} {:016x} {}",
                f.id,
                f.dev,
                f.ino,
                f.size,
                f.hash,
                json(&f.path)
            )?;
            if let Some(c) = &f.cached {
                let r: Vec<String> = c.iter().map(|(s, e)| format!("{s}-{e}")).collect();
                writeln!(w, "cached {} {}", f.id, r.join(","))?;
            }
        }
        for e in &self.events {
            writeln!(w, "{e}")?;
        }
        Ok(())
    }

    /// Write to `path`, gzip-compressed unless it ends in `.txt`.
    pub fn save(&self, path: &std::path::Path) -> anyhow::Result<()> {
        use anyhow::Context;
        let file = std::fs::File::create(path).with_context(|| format!("{}", path.display()))?;
        let buf = std::io::BufWriter::new(file);
        if path.extension().is_some_and(|e| e == "txt") {
            let mut buf = buf;
            self.write_text(&mut buf)?;
            buf.flush()?;
        } else {
            let mut gz = flate2::write::GzEncoder::new(buf, flate2::Compression::default());
            self.write_text(&mut gz)?;
            gz.finish()?.flush()?;
        }
        Ok(())
    }

    /// Read a trace file, compressed or not.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Trace> {
        use anyhow::Context;
        let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
        let text = if bytes.starts_with(&[0x1f, 0x8b]) {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut s)
                .with_context(|| format!("{}: not a gzip-compressed trace", path.display()))?;
            s
        } else {
            String::from_utf8(bytes)
                .map_err(|_| anyhow::anyhow!("{}: not a trace (not text)", path.display()))?
        };
        Trace::parse(text.as_bytes()).map_err(|e| anyhow::anyhow!("{}:{e}", path.display()))
    }

    /// Parse the text form; the error names the line.
    pub fn parse(r: impl BufRead) -> Result<Trace, String> {
        let mut t = Trace::default();
        let mut lines = r.lines().enumerate();
        let first = match lines.next() {
            Some((_, Ok(l))) => l,
            _ => return Err("1: empty file, not a trace".into()),
        };
        match first.strip_prefix(MAGIC).map(str::trim) {
            Some(v) if v == VERSION.to_string() => {}
            Some(v) => return Err(format!("1: trace version {v}; this usermm reads {VERSION}")),
            None => return Err(format!("1: not a trace (it does not start with `{MAGIC}`)")),
        }
        for (i, line) in lines {
            let line = line.map_err(|e| format!("{}: {e}", i + 1))?;
            parse_line(&mut t, &line).map_err(|e| format!("{}: {e}", i + 1))?;
        }
        Ok(t)
    }
}

fn num(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("`{s}` is not a number"))
}

fn signed(s: &str) -> Result<i64, String> {
    match s.strip_prefix('-') {
        Some(d) => Ok(-(num(d)? as i64)),
        None => Ok(num(s)? as i64),
    }
}

/// One JSON value at the start of `s`, and the rest after it.
fn json_prefix<T: serde::de::DeserializeOwned>(s: &str) -> Result<(T, &str), String> {
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<T>();
    match it.next() {
        Some(Ok(v)) => Ok((v, &s[it.byte_offset()..])),
        Some(Err(e)) => Err(format!("bad string or list: {e}")),
        None => Err("a string or list is missing".into()),
    }
}

fn parse_line(t: &mut Trace, line: &str) -> Result<(), String> {
    if line.is_empty() || line.starts_with('#') {
        return Ok(());
    }
    let (head, rest) = line.split_once(' ').unwrap_or((line, ""));
    match head {
        "kernel" => t.kernel = json_prefix(rest)?.0,
        "cmd" => t.cmd = json_prefix(rest)?.0,
        "lost" => t.lost = num(rest.trim())?,
        "knob" => {
            let (k, v) = rest.split_once(' ').ok_or("knob: NAME VALUE expected")?;
            t.knobs.push((k.to_string(), v.trim().to_string()));
        }
        "file" => {
            let mut w = rest.splitn(6, ' ');
            let mut next = || w.next().ok_or("a `file` line has six fields");
            let id = num(next()?)? as u32;
            let dev = next()?.to_string();
            let ino = num(next()?)?;
            let size = num(next()?)?;
            let hash = u64::from_str_radix(next()?, 16).map_err(|_| "file: a hash expected")?;
            let path = json_prefix(next()?)?.0;
            t.files.push(TraceFile {
                id,
                dev,
                ino,
                size,
                hash,
                path,
                cached: None,
            });
        }
        "cached" => {
            let (id, ranges) = rest.split_once(' ').unwrap_or((rest, ""));
            let id = num(id)? as u32;
            let mut v = Vec::new();
            for r in ranges.split(',').filter(|r| !r.is_empty()) {
                let (s, e) = r.split_once('-').ok_or("cached: START-END expected")?;
                v.push((num(s)?, num(e)?));
            }
            let f = t
                .files
                .iter_mut()
                .find(|f| f.id == id)
                .ok_or_else(|| format!("cached: no file {id}"))?;
            f.cached = Some(v);
        }
        _ => t.events.push(parse_event(head, rest)?),
    }
    Ok(())
}

fn parse_event(time: &str, rest: &str) -> Result<Event, String> {
    let t_us = num(time)?;
    let (ids, rest) = rest.split_once(' ').ok_or("an event has a kind")?;
    let (pid, tid) = ids.split_once('/').ok_or("`PID/TID` expected")?;
    let pid = signed(pid)? as i32;
    let tid = signed(tid)? as i32;
    let (kind, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    let what = match kind {
        "exec" => {
            let (path, r) = json_prefix::<String>(rest)?;
            let r = r
                .trim_start()
                .strip_prefix("argv=")
                .ok_or("exec: argv= expected")?;
            let (argv, r) = json_prefix(r)?;
            let r = r
                .trim_start()
                .strip_prefix("env=")
                .ok_or("exec: env= expected")?;
            let (env, _) = json_prefix(r)?;
            What::Exec { path, argv, env }
        }
        "vma" => What::Vma(json_prefix(rest)?.0),
        "fork" => What::Fork {
            child: signed(rest.trim())? as i32,
        },
        "vfork" => What::Vfork {
            child: signed(rest.trim())? as i32,
        },
        "thread" => What::Thread {
            child: signed(rest.trim())? as i32,
        },
        "rss" => {
            let (range, kb) = rest.split_once(' ').ok_or("rss: START-END KB expected")?;
            let (start, end) = range.split_once('-').ok_or("rss: START-END expected")?;
            What::Rss {
                start: num(start)?,
                end: num(end)?,
                kb: num(kb.trim())?,
            }
        }
        "exit" => What::Exit {
            group: rest.trim() == "group",
        },
        "figures" => {
            let mut v = Vec::new();
            for kv in rest.split_whitespace() {
                let (k, val) = kv.split_once('=').ok_or("figures: NAME=VALUE expected")?;
                v.push((k.to_string(), signed(val)?));
            }
            What::Figures(Figures(v))
        }
        "fault" => {
            let mut w = rest.split_whitespace();
            let addr = num(w.next().ok_or("fault: an address expected")?)?;
            let access = match w.next() {
                Some("r") => Access::Read,
                Some("w") => Access::Write,
                Some("x") => Access::Exec,
                _ => return Err("fault: r, w or x expected".into()),
            };
            let kernel = w.next() == Some("k");
            What::Fault {
                addr,
                access,
                kernel,
            }
        }
        name => {
            let sys = Sys::from_name(name).ok_or_else(|| format!("unknown event `{name}`"))?;
            What::Call(parse_call(sys, rest)?)
        }
    };
    Ok(Event {
        t_us,
        pid,
        tid,
        what,
    })
}

fn parse_call(sys: Sys, rest: &str) -> Result<Call, String> {
    let (args, res) = rest
        .split_once("= ")
        .or_else(|| rest.strip_prefix("=").map(|r| ("", r)))
        .ok_or_else(|| format!("{}: `= RESULT` expected", sys.name()))?;
    let mut vals = Vec::new();
    for (kv, name) in args.split_whitespace().zip(sys.arg_names()) {
        let (k, v) = kv.split_once('=').ok_or("NAME=VALUE expected")?;
        if k != *name {
            return Err(format!("{}: `{name}` expected, not `{k}`", sys.name()));
        }
        vals.push(num(v)?);
    }
    if vals.len() != sys.arg_names().len() {
        return Err(format!(
            "{}: {} arguments expected",
            sys.name(),
            sys.arg_names().len()
        ));
    }
    let mut w = res.split_whitespace();
    let ret = signed(w.next().ok_or("a result expected")?)?;
    let file = match w.next() {
        Some(f) => Some(num(f.strip_prefix("file=").ok_or("file=ID expected")?)? as u32),
        None => None,
    };
    Ok(Call {
        sys,
        args: vals,
        ret,
        file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Trace {
        let ev = |t, what| Event {
            t_us: t,
            pid: 10,
            tid: 11,
            what,
        };
        Trace {
            kernel: "6.18.0".into(),
            cmd: vec!["sh".into(), "-c".into(), "a \"b\" c".into()],
            lost: 0,
            knobs: vec![
                ("enabled".into(), "madvise".into()),
                ("hugepages-64kB/enabled".into(), "never".into()),
            ],
            files: vec![TraceFile {
                id: 1,
                dev: "fe:00".into(),
                ino: 42,
                size: 8192,
                hash: 0x1234,
                path: "/a b/c\n".into(),
                cached: Some(vec![(0, 1), (3, 5)]),
            }],
            events: vec![
                ev(
                    0,
                    What::Exec {
                        path: "/bin/sh".into(),
                        argv: vec!["sh".into(), "x y".into()],
                        env: vec!["A=1 env=2".into()],
                    },
                ),
                ev(0, What::Vma("555-556 r--p 0 fe:00 42 /a b".into())),
                ev(
                    5,
                    What::Call(Call {
                        sys: Sys::Mmap,
                        args: vec![0, 0x2000, 3, 0x22, 0xffffffff, 0],
                        ret: 0x7fff0000,
                        file: Some(1),
                    }),
                ),
                ev(
                    6,
                    What::Call(Call {
                        sys: Sys::Munlockall,
                        args: vec![],
                        ret: -12,
                        file: None,
                    }),
                ),
                ev(
                    7,
                    What::Fault {
                        addr: 0x7fff0008,
                        access: Access::Write,
                        kernel: true,
                    },
                ),
                ev(8, What::Thread { child: 12 }),
                ev(
                    9,
                    What::Figures(Figures(vec![("VmRSS".into(), 100), ("VMAs".into(), 3)])),
                ),
                ev(
                    9,
                    What::Rss {
                        start: 0x1000,
                        end: 0x3000,
                        kb: 8,
                    },
                ),
                ev(9, What::Exit { group: true }),
            ],
        }
    }

    #[test]
    fn text_round_trips() {
        let t = sample();
        let mut out = Vec::new();
        t.write_text(&mut out).unwrap();
        assert_eq!(Trace::parse(&out[..]).unwrap(), t);
    }

    #[test]
    fn compressed_file_round_trips() {
        let dir = std::env::temp_dir().join(format!("usermm-trace-fmt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.trace.gz");
        sample().save(&p).unwrap();
        assert_eq!(std::fs::read(&p).unwrap()[..2], [0x1f, 0x8b]);
        assert_eq!(Trace::load(&p).unwrap(), sample());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_input_names_the_line() {
        assert!(Trace::parse(&b"hello\n"[..])
            .unwrap_err()
            .contains("not a trace"));
        assert!(Trace::parse(&b"usermm-trace 9\n"[..])
            .unwrap_err()
            .contains("version 9"));
        let e = Trace::parse(&b"usermm-trace 1\n3 1/1 mmap addr=0x0 = 0x0\n"[..]).unwrap_err();
        assert!(e.starts_with("2: mmap"), "{e}");
        let e = Trace::parse(&b"usermm-trace 1\n3 1/1 frob\n"[..]).unwrap_err();
        assert!(e.contains("unknown event `frob`"), "{e}");
        let e = Trace::parse(&b"usermm-trace 1\n3 1/1 fault 0x10 q\n"[..]).unwrap_err();
        assert!(e.contains("r, w or x"), "{e}");
    }
}
