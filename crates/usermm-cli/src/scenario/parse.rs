//! The scenario language: one statement a line, `#` starts a comment.
//! See docs/scenarios.md for the language; this is its parser. Errors carry
//! the line and column of the offending word.

use std::fmt;

/// A parse error at a 1-based line and column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub msg: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.col, self.msg)
    }
}

/// An address: a region's start plus an offset, or an absolute number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    Abs(u64),
    Region { name: String, off: i64 },
}

/// One of the mlock family of calls, on addresses of type `A`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MlockCall<A> {
    /// `mlock2(ADDR, LEN, FLAGS)` (`mlock` when FLAGS is 0).
    Mlock {
        addr: A,
        len: u64,
        flags: u32,
    },
    Munlock {
        addr: A,
        len: u64,
    },
    Mlockall {
        flags: u32,
    },
    Munlockall,
}

/// Where `brk` asks the break to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrkTo {
    /// `brk(0)`: where it is.
    Query,
    /// The break plus (or minus) this many bytes.
    By(i64),
    /// This address.
    At(Addr),
}

/// A figure of `/proc/<pid>/status` or `smaps_rollup`, in kB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    VmRss,
    RssAnon,
    VmPte,
    AnonHugePages,
    /// The number of VMAs (lines of `/proc/<pid>/maps`); a count, not kB.
    Vmas,
    RssFile,
    RssShmem,
    /// `VmLck` of status: the size of the locked VMAs.
    VmLck,
    /// `Locked` of smaps_rollup: the PSS of the locked VMAs.
    Locked,
}

/// How many figures a backend reports.
pub const NR_FIGURES: usize = 9;

impl Figure {
    pub const ALL: [Figure; NR_FIGURES] = [
        Figure::VmRss,
        Figure::RssAnon,
        Figure::VmPte,
        Figure::AnonHugePages,
        Figure::Vmas,
        Figure::RssFile,
        Figure::RssShmem,
        Figure::VmLck,
        Figure::Locked,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Figure::VmRss => "VmRSS",
            Figure::RssAnon => "RssAnon",
            Figure::VmPte => "VmPTE",
            Figure::AnonHugePages => "AnonHugePages",
            Figure::Vmas => "VMAs",
            Figure::RssFile => "RssFile",
            Figure::RssShmem => "RssShmem",
            Figure::VmLck => "VmLck",
            Figure::Locked => "Locked",
        }
    }
    fn parse(s: &str) -> Option<Figure> {
        Figure::ALL.into_iter().find(|f| f.name() == s)
    }
}

/// What a `check` expects each page's first word to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    Zero,
    Seed(u64),
}

/// One statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `map NAME LEN PROT [at=ADDR] [align=SIZE] [flags=a,b,...]
    /// [file=F] [off=OFFSET]`: anonymous memory, or the file `F` (then
    /// `MAP_ANONYMOUS` is not set) from byte `OFFSET`.
    Map {
        name: String,
        len: u64,
        prot: u32,
        at: Option<Addr>,
        align: u64,
        flags: u32,
        file: Option<String>,
        off: u64,
    },
    /// `file F SIZE [seed=S] [fs=KIND] [chunk=SIZE]`: a new file of SIZE
    /// bytes, written in `chunk`-byte `write(2)`s (one by default), then
    /// `fsync`ed; the first word of page i is the pattern of seed S (zero
    /// bytes without a seed).
    CreateFile {
        name: String,
        size: u64,
        seed: Option<u64>,
        fs: String,
        chunk: u64,
    },
    /// `memfd F SIZE [seed=S]`: `memfd_create(2)`, `ftruncate` to SIZE,
    /// and the pattern of seed S written as `file` writes it.
    Memfd {
        name: String,
        size: u64,
        seed: Option<u64>,
    },
    /// `open F PATH`: a host file, read-only.
    OpenFile {
        name: String,
        path: String,
    },
    /// `truncate F SIZE`: `ftruncate(2)`.
    Truncate {
        name: String,
        size: u64,
    },
    /// `msync ADDR LEN [async|sync] [invalidate]`.
    Msync {
        addr: Addr,
        len: u64,
        flags: u32,
    },
    Munmap {
        addr: Addr,
        len: Option<u64>,
    },
    Mprotect {
        addr: Addr,
        len: u64,
        prot: u32,
    },
    /// `mremap ADDR OLD_LEN NEW_LEN [maymove] [fixed=ADDR] [dontunmap]
    /// [hint=ADDR] [as=NAME]`: the region `NAME` (or the region `ADDR`
    /// names, if it is a region's start) is the result.
    Mremap {
        addr: Addr,
        old_len: u64,
        new_len: u64,
        flags: u32,
        new_addr: Option<Addr>,
        name: Option<String>,
    },
    Madvise {
        addr: Addr,
        len: u64,
        advice: i32,
    },
    /// `mlock ADDR LEN [onfault]` (`mlock2(MLOCK_ONFAULT)`), `munlock ADDR
    /// LEN`, `mlockall current,future,onfault`, `munlockall`.
    Mlock(MlockCall<Addr>),
    /// `mincore ADDR LEN [== BITS]`: the residency of each page, as a
    /// string of 0 and 1 (expected to be BITS if given).
    Mincore {
        addr: Addr,
        len: u64,
        expect: Option<String>,
    },
    /// `setrlimit memlock|stack SIZE|unlimited`.
    Setrlimit {
        resource: Rlimit,
        bytes: u64,
    },
    /// `capdrop ipc_lock`: the process loses `CAP_IPC_LOCK`.
    CapdropIpcLock,
    /// `exec [aslr=MMAP,PIE,STACK,ALIGN,BRK] PATH [ARGS...]`: the process
    /// execs the host program `PATH` (its arguments `PATH ARGS...`, no
    /// environment) and stops at its first instruction; address-space
    /// randomisation off, or on with those random numbers (the host draws
    /// its own).
    Exec {
        path: String,
        args: Vec<String>,
        rnd: Option<usermm::exec::ExecRandom>,
    },
    /// `maps`: the process's /proc/PID/maps, compared line by line.
    Maps,
    /// `brk [+SIZE|-SIZE|ADDR] [as=NAME]`: brk(2) of an exec'd process,
    /// the break moved by SIZE or set to ADDR (queried when neither); the
    /// region NAME is from the old break to the new.
    Brk {
        to: BrkTo,
        name: Option<String>,
    },
    /// `fill ADDR LEN SEED [every=SIZE]`: the first word of every page
    /// (or of one page every SIZE) gets the pattern.
    Fill {
        addr: Addr,
        len: u64,
        seed: u64,
        every: u64,
    },
    /// `check ADDR LEN SEED|zero [every=SIZE]`
    Check {
        addr: Addr,
        len: u64,
        pattern: Pattern,
        every: u64,
    },
    Write {
        addr: Addr,
        value: u64,
    },
    Read {
        addr: Addr,
    },
    /// `expect ADDR == VALUE`
    ExpectValue {
        addr: Addr,
        value: u64,
    },
    Fork {
        child: String,
    },
    /// `thread NAME`: the current process starts a thread (clone with
    /// CLONE_VM and CLONE_THREAD, on a stack it already has), which runs
    /// on the next CPU; `switch NAME` runs statements in it, `exit NAME`
    /// ends it.
    Thread {
        name: String,
    },
    /// `vfork NAME`: the current process vforks (clone with CLONE_VM and
    /// CLONE_VFORK): the child `NAME` runs the parent's address space,
    /// and the parent waits until the child execs or exits.
    Vfork {
        child: String,
    },
    Switch {
        proc_name: String,
    },
    Exit {
        proc_name: Option<String>,
    },
    /// `knob enabled MODE` or `knob SIZE MODE`
    Knob {
        size_kb: Option<u64>,
        mode: String,
    },
    /// `knob only SIZE`: that size `always`, every other size and the top
    /// level `never` (`only 4K`: all never).
    KnobOnly {
        size_kb: u64,
    },
    /// `knob shmem_enabled MODE` (`size_kb` None) or `knob shmem SIZE
    /// MODE`: shmem's THP knobs.
    KnobShmem {
        size_kb: Option<u64>,
        mode: String,
    },
    /// `knob use_zero_page 0|1`: `transparent_hugepage/use_zero_page`.
    KnobUseZeroPage {
        on: bool,
    },
    /// `tunable NAME VALUE`: one of the engine's run-time switches
    /// (`usermm::tunable`); natively, only the host kernel's own value.
    Tunable {
        name: String,
        value: String,
    },
    /// `sysctl NAME VALUE`: `/proc/sys/vm/NAME`, one of [`SYSCTLS`].
    Sysctl {
        name: String,
        value: u64,
    },
    Mark {
        name: String,
    },
    Print {
        fig: Figure,
    },
    /// `expect FIG [since MARK] == SIZE`
    ExpectFigure {
        fig: Figure,
        since: Option<String>,
        value: i64,
    },
    /// `expect vmstat NAME since MARK == N`: a machine-wide counter of
    /// `/proc/vmstat`, or a per-size mTHP statistic
    /// (`hugepages-64kB/anon_fault_alloc`), changed by N since the mark.
    ExpectVmstat {
        name: String,
        since: String,
        value: i64,
    },
    /// `fails ERRNO: STATEMENT`
    Fails {
        errno: String,
        op: Box<Op>,
    },
    Dump,
    /// `migrate ADDR LEN NODE`: `move_pages(2)` of every page of the range
    /// to the node.
    Migrate {
        addr: Addr,
        len: u64,
        node: u64,
    },
    /// `expect node ADDR == N`: `move_pages(2)` without nodes says where
    /// the page is.
    ExpectNode {
        addr: Addr,
        node: u64,
    },
    /// `mbind ADDR LEN POLICY NODES [move] [strict]`: `mbind(2)`.
    Mbind {
        addr: Addr,
        len: u64,
        mode: i32,
        nodes: u64,
        flags: u32,
    },
    /// `numa_balancing MODE`: `/proc/sys/kernel/numa_balancing` (0..=3).
    NumaBalancing {
        mode: u8,
    },
    /// `expect faults reading ADDR LEN [every=SIZE] == N`: a load of one
    /// byte of every page of the range (or one every SIZE) takes N page
    /// faults, counted around the loads alone.
    ExpectReadFaults {
        addr: Addr,
        len: u64,
        every: u64,
        value: u64,
    },
    /// `await_numa_hint ADDR`: the process runs, loading the byte at ADDR
    /// (which must be present), until that load takes a fault: NUMA
    /// balancing's scan has made its PTE a hinting entry. ETIMEDOUT after
    /// [`super::AWAIT_NUMA_HINT_S`] seconds.
    AwaitNumaHint {
        addr: Addr,
    },
    /// `demotion on|off`: `/sys/kernel/mm/numa/demotion_enabled`.
    Demotion {
        on: bool,
    },
    /// `require nodes N`: a machine with fewer memory nodes skips the
    /// scenario.
    RequireNodes {
        n: u64,
    },
    /// `require file PATH`: a host without the file skips the scenario
    /// (both sides read the same host files).
    RequireFile {
        path: String,
    },
}

/// Whether usermm keeps the counter `name`: a /proc/vmstat event or node
/// statistic, or `hugepages-<size>kB/<stat>` for an mTHP size.
pub fn vmstat_name_known(name: &str) -> bool {
    usermm::vmstat::VmStat::new(0)
        .snapshot()
        .get(name)
        .is_some()
}

#[derive(Debug, Clone)]
pub struct Stmt {
    pub line: usize,
    pub text: String,
    pub op: Op,
}

/// The UAPI values a scenario's `map` spells by name: the engine's, which
/// are the kernel's (both runners pass them on as numbers).
pub use usermm::mmap::{
    MAP_ANONYMOUS, MAP_FIXED, MAP_FIXED_NOREPLACE, MAP_NORESERVE, MAP_POPULATE, MAP_PRIVATE,
    MAP_SHARED, MAP_SHARED_VALIDATE, PROT_EXEC, PROT_READ, PROT_WRITE,
};

struct Words<'a> {
    line: usize,
    words: Vec<(usize, &'a str)>,
    at: usize,
}

impl<'a> Words<'a> {
    fn new(line: usize, text: &'a str) -> Self {
        let mut words = vec![];
        let mut start = None;
        for (i, c) in text.char_indices() {
            if c.is_whitespace() {
                if let Some(s) = start.take() {
                    words.push((s + 1, &text[s..i]));
                }
            } else if start.is_none() {
                start = Some(i);
            }
        }
        if let Some(s) = start {
            words.push((s + 1, &text[s..]));
        }
        Words { line, words, at: 0 }
    }

    fn err(&self, col: usize, msg: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            col,
            msg: msg.into(),
        }
    }

    /// The column just past the last word (for "missing ..." errors).
    fn end_col(&self) -> usize {
        self.words.last().map_or(1, |(c, w)| c + w.len())
    }

    fn next(&mut self, what: &str) -> Result<(usize, &'a str), ParseError> {
        let w = self
            .words
            .get(self.at)
            .copied()
            .ok_or_else(|| self.err(self.end_col(), format!("expected {what}")))?;
        self.at += 1;
        Ok(w)
    }

    fn peek(&self) -> Option<&'a str> {
        self.words.get(self.at).map(|w| w.1)
    }

    fn done(&self) -> Result<(), ParseError> {
        match self.words.get(self.at) {
            None => Ok(()),
            Some((c, w)) => Err(self.err(*c, format!("unexpected {w:?}"))),
        }
    }

    fn number(&mut self, what: &str) -> Result<u64, ParseError> {
        let (c, w) = self.next(what)?;
        parse_size(w).ok_or_else(|| self.err(c, format!("expected {what}, found {w:?}")))
    }

    fn name(&mut self, what: &str) -> Result<String, ParseError> {
        let (c, w) = self.next(what)?;
        if w.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
            && w.chars().next().is_some_and(|ch| ch.is_ascii_alphabetic())
        {
            Ok(w.to_string())
        } else {
            Err(self.err(c, format!("expected {what} (a name), found {w:?}")))
        }
    }

    fn addr(&mut self) -> Result<Addr, ParseError> {
        let (c, w) = self.next("an address")?;
        parse_addr(w).ok_or_else(|| self.err(c, format!("expected an address, found {w:?}")))
    }

    /// `==`, before an `expect`'s value.
    fn eq(&mut self) -> Result<(), ParseError> {
        let (c, w) = self.next("==")?;
        if w == "==" {
            Ok(())
        } else {
            Err(self.err(c, format!("expected ==, found {w:?}")))
        }
    }

    /// A plain count, without a size's suffix.
    fn count<T: std::str::FromStr>(&mut self) -> Result<T, ParseError> {
        let (c, v) = self.next("a count")?;
        v.parse()
            .map_err(|_| self.err(c, format!("expected a count, found {v:?}")))
    }

    /// An optional `every=SIZE` (a multiple of 4K): the stride of a
    /// `fill`, `check` or `expect faults reading`, a page if not given.
    fn every(&mut self) -> Result<u64, ParseError> {
        let Some(word) = self.peek().filter(|w| w.starts_with("every=")) else {
            return Ok(4096);
        };
        let (c, _) = self.next("every=SIZE")?;
        word.strip_prefix("every=")
            .and_then(parse_size)
            .filter(|&n| n > 0 && n % 4096 == 0)
            .ok_or_else(|| {
                self.err(
                    c,
                    format!("expected every=SIZE, a multiple of 4K, found {word:?}"),
                )
            })
    }

    fn prot(&mut self) -> Result<u32, ParseError> {
        let (c, w) = self.next("a protection (r, rw, rwx, none)")?;
        parse_prot(w).ok_or_else(|| self.err(c, format!("bad protection {w:?}")))
    }
}

/// The NUMA policies by their mode numbers (`MPOL_DEFAULT` ...).
pub const MPOL_NAMES: [&str; 7] = [
    "default",
    "preferred",
    "bind",
    "interleave",
    "local",
    "preferred_many",
    "weighted_interleave",
];

/// `0,1,3` as a node mask; `-` for none. Nodes below 64.
fn parse_nodes(w: &str) -> Option<u64> {
    if w == "-" {
        return Some(0);
    }
    w.split(',').try_fold(0u64, |m, n| {
        let n: u32 = n.parse().ok()?;
        (n < 64).then(|| m | 1 << n)
    })
}

/// `4096`, `0x1000`, `4K`, `2M`, `1G`.
pub fn parse_size(w: &str) -> Option<u64> {
    let (num, mult) = match w.chars().last()? {
        'K' | 'k' => (&w[..w.len() - 1], 1u64 << 10),
        'M' => (&w[..w.len() - 1], 1 << 20),
        'G' => (&w[..w.len() - 1], 1 << 30),
        _ => (w, 1),
    };
    let v = if let Some(h) = num.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()?
    } else {
        num.parse().ok()?
    };
    v.checked_mul(mult)
}

/// Bytes as kB, only when they are a whole number of kB (`16K`, `16384`,
/// but not `16385`, which would otherwise round down to a valid size).
fn whole_kb(bytes: u64) -> Option<u64> {
    bytes.is_multiple_of(1024).then_some(bytes >> 10)
}

fn parse_signed_size(w: &str) -> Option<i64> {
    match w.strip_prefix('-') {
        Some(rest) => parse_size(rest)
            .and_then(|v| i64::try_from(v).ok())
            .map(|v| -v),
        None => parse_size(w.strip_prefix('+').unwrap_or(w)).and_then(|v| i64::try_from(v).ok()),
    }
}

fn parse_addr(w: &str) -> Option<Addr> {
    let split = w.find(['+', '-']);
    if w.starts_with(|c: char| c.is_ascii_digit()) {
        return match split {
            Some(i) => {
                let base = parse_size(&w[..i])?;
                let off = parse_signed_size(&w[i..])?;
                Some(Addr::Abs(base.checked_add_signed(off)?))
            }
            None => parse_size(w).map(Addr::Abs),
        };
    }
    let (name, off) = match split {
        Some(i) => (&w[..i], parse_signed_size(&w[i..])?),
        None => (w, 0),
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    Some(Addr::Region {
        name: name.to_string(),
        off,
    })
}

fn parse_prot(w: &str) -> Option<u32> {
    if w == "none" {
        return Some(0);
    }
    let mut p = 0;
    for c in w.chars() {
        p |= match c {
            'r' => PROT_READ,
            'w' => PROT_WRITE,
            'x' => PROT_EXEC,
            _ => return None,
        };
    }
    Some(p)
}

fn parse_flags(w: &str) -> Option<u32> {
    let mut f = 0;
    for part in w.split(',') {
        f |= match part {
            "private" => MAP_PRIVATE,
            "shared" => MAP_SHARED,
            "shared_validate" => MAP_SHARED_VALIDATE,
            "anonymous" => MAP_ANONYMOUS,
            "fixed" => MAP_FIXED,
            "noreplace" => MAP_FIXED_NOREPLACE,
            "noreserve" => MAP_NORESERVE,
            "populate" => MAP_POPULATE,
            "locked" => usermm::mmap::MAP_LOCKED,
            "nonblock" => usermm::mmap::MAP_NONBLOCK,
            "growsdown" => usermm::mmap::MAP_GROWSDOWN,
            "stack" => usermm::mmap::MAP_STACK,
            _ => return None,
        };
    }
    Some(f)
}

fn parse_advice(w: &str) -> Option<i32> {
    Some(match w {
        "normal" => 0,
        "willneed" => 3,
        "dontneed" => 4,
        "dontfork" => 10,
        "dofork" => 11,
        "wipeonfork" => 18,
        "keeponfork" => 19,
        "free" => 8,
        "remove" => 9,
        "hugepage" => 14,
        "nohugepage" => 15,
        "pageout" => 21,
        "populate_read" => 22,
        "populate_write" => 23,
        "collapse" => 25,
        _ => return None,
    })
}

const KNOB_MODES: [&str; 4] = ["always", "inherit", "madvise", "never"];

/// The `vm.` sysctls a scenario may set.
pub const SYSCTLS: [&str; 5] = [
    "overcommit_memory",
    "overcommit_ratio",
    "overcommit_kbytes",
    "admin_reserve_kbytes",
    "user_reserve_kbytes",
];

/// The statements: each verb, and the function that parses the rest of
/// its line (docs/scenarios.md describes each).
type ParseStatement = fn(&mut Words) -> Result<Op, ParseError>;

const STATEMENTS: &[(&str, ParseStatement)] = &[
    ("map", parse_map),
    ("munmap", parse_munmap),
    ("mprotect", parse_mprotect),
    ("mremap", parse_mremap),
    ("madvise", parse_madvise),
    ("fill", parse_fill),
    ("check", parse_check),
    ("write", parse_write),
    ("read", parse_read),
    ("expect", parse_expect),
    ("fork", parse_fork),
    ("thread", parse_thread),
    ("vfork", parse_vfork),
    ("switch", parse_switch),
    ("exit", parse_exit),
    ("tunable", parse_tunable),
    ("knob", parse_knob),
    ("sysctl", parse_sysctl),
    ("mark", parse_mark),
    ("print", parse_print),
    ("fails", parse_fails),
    ("dump", parse_dump),
    ("migrate", parse_migrate),
    ("mbind", parse_mbind),
    ("await_numa_hint", parse_await_numa_hint),
    ("numa_balancing", parse_numa_balancing),
    ("demotion", parse_demotion),
    ("require", parse_require),
    ("file", parse_file),
    ("open", parse_open),
    ("memfd", parse_memfd),
    ("truncate", parse_truncate),
    ("msync", parse_msync),
    ("mlock", parse_mlock),
    ("mincore", parse_mincore),
    ("munlock", parse_munlock),
    ("mlockall", parse_mlockall),
    ("munlockall", parse_munlockall),
    ("setrlimit", parse_setrlimit),
    ("capdrop", parse_capdrop),
    ("exec", parse_exec),
    ("maps", parse_maps),
    ("brk", parse_brk),
];

/// One statement: its verb, then what [`STATEMENTS`] parses for it, then
/// nothing more on the line.
fn parse_op(w: &mut Words) -> Result<Op, ParseError> {
    let (c, verb) = w.next("a statement")?;
    let Some(&(_, parse)) = STATEMENTS.iter().find(|(v, _)| *v == verb) else {
        return Err(w.err(c, format!("unknown statement {verb:?}")));
    };
    let op = parse(w)?;
    w.done()?;
    Ok(op)
}

/// The statement `map`.
fn parse_map(w: &mut Words) -> Result<Op, ParseError> {
    let name = w.name("a region name")?;
    let len = w.number("a length")?;
    let prot = w.prot()?;
    let (mut at, mut align, mut flags) = (None, 0, None);
    let (mut file, mut off) = (None, 0);
    while w.peek().is_some() {
        let (col, word) = w.next("an option")?;
        if let Some(v) = word.strip_prefix("file=") {
            file = Some(v.to_string());
        } else if let Some(v) = word.strip_prefix("off=") {
            off = parse_size(v).ok_or_else(|| w.err(col, format!("bad offset {v:?}")))?;
        } else if let Some(v) = word.strip_prefix("at=") {
            at = Some(parse_addr(v).ok_or_else(|| w.err(col, format!("bad address {v:?}")))?);
        } else if let Some(v) = word.strip_prefix("align=") {
            align = parse_size(v)
                .filter(|a| a.is_power_of_two())
                .ok_or_else(|| w.err(col, format!("bad alignment {v:?}")))?;
        } else if let Some(v) = word.strip_prefix("flags=") {
            flags = Some(parse_flags(v).ok_or_else(|| w.err(col, format!("bad flags {v:?}")))?);
        } else {
            return Err(w.err(
                col,
                format!("unknown option {word:?} (at=, align=, flags=, file=, off=)"),
            ));
        }
    }
    // Private by default; anonymous unless a file is named.
    let default = if file.is_some() {
        MAP_PRIVATE
    } else {
        MAP_PRIVATE | MAP_ANONYMOUS
    };
    let mut flags = flags.unwrap_or(default);
    if file.is_some() && flags & (MAP_SHARED | MAP_PRIVATE) == 0 {
        flags |= MAP_PRIVATE;
    }
    Ok(Op::Map {
        name,
        len,
        prot,
        at,
        align,
        flags,
        file,
        off,
    })
}

/// The statement `file`.
fn parse_file(w: &mut Words) -> Result<Op, ParseError> {
    let name = w.name("a file name")?;
    let size = w.number("a size")?;
    let (mut seed, mut fs, mut chunk) = (None, "ext4".to_string(), 0);
    while w.peek().is_some() {
        let (col, word) = w.next("an option")?;
        if let Some(v) = word.strip_prefix("seed=") {
            seed = Some(parse_size(v).ok_or_else(|| w.err(col, format!("bad seed {v:?}")))?);
        } else if let Some(v) = word.strip_prefix("fs=") {
            if usermm::fs::FsKind::parse(v).is_none() {
                return Err(w.err(col, format!("unknown filesystem {v:?} (ext4, ext2, tmpfs)")));
            }
            fs = v.to_string();
        } else if let Some(v) = word.strip_prefix("chunk=") {
            chunk = parse_size(v)
                .filter(|&c| c > 0)
                .ok_or_else(|| w.err(col, format!("bad chunk {v:?}")))?;
        } else {
            return Err(w.err(col, format!("unknown option {word:?} (seed=, fs=, chunk=)")));
        }
    }
    Ok(Op::CreateFile {
        name,
        size,
        seed,
        fs,
        chunk: if chunk == 0 { size.max(1) } else { chunk },
    })
}

/// The statement `memfd`.
fn parse_memfd(w: &mut Words) -> Result<Op, ParseError> {
    let name = w.name("a file name")?;
    let size = w.number("a size")?;
    let mut seed = None;
    if let Some(word) = w.peek() {
        let (col, _) = w.next("seed=N")?;
        seed = Some(
            word.strip_prefix("seed=")
                .and_then(parse_size)
                .ok_or_else(|| w.err(col, format!("expected seed=N, found {word:?}")))?,
        );
    }
    Ok(Op::Memfd { name, size, seed })
}

/// The statement `open`.
fn parse_open(w: &mut Words) -> Result<Op, ParseError> {
    let name = w.name("a file name")?;
    let (_, path) = w.next("a host path")?;
    Ok(Op::OpenFile {
        name,
        path: path.to_string(),
    })
}

/// The statement `truncate`.
fn parse_truncate(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Truncate {
        name: w.name("a file name")?,
        size: w.number("a size")?,
    })
}

/// The statement `msync`.
fn parse_msync(w: &mut Words) -> Result<Op, ParseError> {
    use usermm::msync::{MS_ASYNC, MS_INVALIDATE, MS_SYNC};
    let addr = w.addr()?;
    let len = w.number("a length")?;
    let mut flags = 0;
    while w.peek().is_some() {
        let (col, f) = w.next("a flag")?;
        flags |= match f {
            "async" => MS_ASYNC,
            "sync" => MS_SYNC,
            "invalidate" => MS_INVALIDATE,
            _ => {
                return Err(w.err(
                    col,
                    format!("unknown msync flag {f:?} (async, sync, invalidate)"),
                ))
            }
        };
    }
    Ok(Op::Msync { addr, len, flags })
}

/// The statement `munmap`.
fn parse_munmap(w: &mut Words) -> Result<Op, ParseError> {
    let addr = w.addr()?;
    let len = if w.peek().is_some() {
        Some(w.number("a length")?)
    } else {
        None
    };
    Ok(Op::Munmap { addr, len })
}

/// The statement `mprotect`.
fn parse_mprotect(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Mprotect {
        addr: w.addr()?,
        len: w.number("a length")?,
        prot: w.prot()?,
    })
}

/// The statement `mremap`.
fn parse_mremap(w: &mut Words) -> Result<Op, ParseError> {
    use usermm::mremap::{MREMAP_DONTUNMAP, MREMAP_FIXED, MREMAP_MAYMOVE};
    let addr = w.addr()?;
    let old_len = w.number("the old length")?;
    let new_len = w.number("the new length")?;
    let (mut flags, mut new_addr, mut name) = (0, None, None);
    while w.peek().is_some() {
        let (col, word) = w.next("an option")?;
        if word == "maymove" {
            flags |= MREMAP_MAYMOVE;
        } else if word == "dontunmap" {
            flags |= MREMAP_DONTUNMAP;
        } else if let Some(v) = word.strip_prefix("fixed=") {
            flags |= MREMAP_FIXED;
            new_addr = Some(parse_addr(v).ok_or_else(|| w.err(col, format!("bad address {v:?}")))?);
        } else if let Some(v) = word.strip_prefix("hint=") {
            new_addr = Some(parse_addr(v).ok_or_else(|| w.err(col, format!("bad address {v:?}")))?);
        } else if let Some(v) = word.strip_prefix("as=") {
            name = Some(v.to_string());
        } else {
            return Err(w.err(
                col,
                format!("unknown option {word:?} (maymove, dontunmap, fixed=, hint=, as=)"),
            ));
        }
    }
    Ok(Op::Mremap {
        addr,
        old_len,
        new_len,
        flags,
        new_addr,
        name,
    })
}

/// The statement `madvise`.
fn parse_madvise(w: &mut Words) -> Result<Op, ParseError> {
    let addr = w.addr()?;
    let len = w.number("a length")?;
    let (col, a) =
        w.next("an advice (dontneed, free, pageout, willneed, hugepage, nohugepage, normal)")?;
    let advice = parse_advice(a).ok_or_else(|| w.err(col, format!("unknown advice {a:?}")))?;
    Ok(Op::Madvise { addr, len, advice })
}

/// The statement `mincore`.
fn parse_mincore(w: &mut Words) -> Result<Op, ParseError> {
    let addr = w.addr()?;
    let len = w.number("a length")?;
    let expect = if w.peek() == Some("==") {
        w.next("==")?;
        let (col, bits) = w.next("a string of 0 and 1")?;
        if bits.is_empty() || !bits.chars().all(|c| c == '0' || c == '1') {
            return Err(w.err(col, format!("expected a string of 0 and 1, found {bits:?}")));
        }
        Some(bits.to_string())
    } else {
        None
    };
    Ok(Op::Mincore { addr, len, expect })
}

/// The statement `mlock`.
fn parse_mlock(w: &mut Words) -> Result<Op, ParseError> {
    let addr = w.addr()?;
    let len = w.number("a length")?;
    let mut flags = 0;
    if w.peek().is_some() {
        let (col, f) = w.next("onfault")?;
        if f != "onfault" {
            return Err(w.err(col, format!("unknown mlock flag {f:?} (onfault)")));
        }
        flags = usermm::mlock::MLOCK_ONFAULT;
    }
    Ok(Op::Mlock(MlockCall::Mlock { addr, len, flags }))
}

/// The statement `munlock`.
fn parse_munlock(w: &mut Words) -> Result<Op, ParseError> {
    let addr = w.addr()?;
    let len = w.number("a length")?;
    Ok(Op::Mlock(MlockCall::Munlock { addr, len }))
}

/// The statement `mlockall`: flags joined by commas, or a number.
fn parse_mlockall(w: &mut Words) -> Result<Op, ParseError> {
    use usermm::mlock::{MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT};
    let (col, list) = w.next("flags (current, future, onfault)")?;
    let mut flags = 0;
    for part in list.split(',') {
        flags |= match part {
            "current" => MCL_CURRENT,
            "future" => MCL_FUTURE,
            "onfault" => MCL_ONFAULT,
            n => n.parse::<u32>().map_err(|_| {
                w.err(
                    col,
                    format!("unknown mlockall flag {n:?} (current, future, onfault)"),
                )
            })?,
        };
    }
    Ok(Op::Mlock(MlockCall::Mlockall { flags }))
}

/// The statement `munlockall`.
fn parse_munlockall(_w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Mlock(MlockCall::Munlockall))
}

/// A resource limit a scenario may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rlimit {
    /// `RLIMIT_MEMLOCK`: how much a process may lock.
    Memlock,
    /// `RLIMIT_STACK`: how far a stack may grow down.
    Stack,
}

/// The statement `setrlimit memlock|stack SIZE|unlimited`.
fn parse_setrlimit(w: &mut Words) -> Result<Op, ParseError> {
    let (col, r) = w.next("a resource (memlock, stack)")?;
    let resource = match r {
        "memlock" => Rlimit::Memlock,
        "stack" => Rlimit::Stack,
        _ => return Err(w.err(col, format!("unknown resource {r:?} (memlock, stack)"))),
    };
    let bytes = if w.peek() == Some("unlimited") {
        w.next("unlimited")?;
        u64::MAX
    } else {
        w.number("a size or unlimited")?
    };
    Ok(Op::Setrlimit { resource, bytes })
}

/// The statement `capdrop ipc_lock`.
fn parse_capdrop(w: &mut Words) -> Result<Op, ParseError> {
    let (col, c) = w.next("a capability (ipc_lock)")?;
    if c != "ipc_lock" {
        return Err(w.err(col, format!("unknown capability {c:?} (ipc_lock)")));
    }
    Ok(Op::CapdropIpcLock)
}

/// The statement `fill`.
fn parse_fill(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Fill {
        addr: w.addr()?,
        len: w.number("a length")?,
        seed: w.number("a seed")?,
        every: w.every()?,
    })
}

/// The statement `check`.
fn parse_check(w: &mut Words) -> Result<Op, ParseError> {
    let addr = w.addr()?;
    let len = w.number("a length")?;
    let (col, p) = w.next("a seed or zero")?;
    let pattern = if p == "zero" {
        Pattern::Zero
    } else {
        Pattern::Seed(
            parse_size(p)
                .ok_or_else(|| w.err(col, format!("expected a seed or zero, found {p:?}")))?,
        )
    };
    Ok(Op::Check {
        addr,
        len,
        pattern,
        every: w.every()?,
    })
}

/// The statement `write`.
fn parse_write(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Write {
        addr: w.addr()?,
        value: w.number("a value")?,
    })
}

/// The statement `read`.
fn parse_read(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Read { addr: w.addr()? })
}

/// The statement `expect`.
fn parse_expect(w: &mut Words) -> Result<Op, ParseError> {
    let (col, first) = w.next("a figure or an address")?;
    Ok(if first == "node" {
        let addr = w.addr()?;
        w.eq()?;
        Op::ExpectNode {
            addr,
            node: w.number("a node")?,
        }
    } else if first == "faults" {
        let (col1, kw) = w.next("reading")?;
        if kw != "reading" {
            return Err(w.err(col1, format!("expected reading ADDR LEN, found {kw:?}")));
        }
        let addr = w.addr()?;
        let len = w.number("a length")?;
        let every = w.every()?;
        w.eq()?;
        let value = w.count()?;
        Op::ExpectReadFaults {
            addr,
            len,
            every,
            value,
        }
    } else if first == "vmstat" {
        let (col, name) = w.next("a counter name")?;
        if !vmstat_name_known(name) {
            return Err(w.err(
                col,
                format!("no counter {name:?} (a /proc/vmstat name usermm keeps, or hugepages-<size>kB/<stat>)"),
            ));
        }
        let (col1, kw) = w.next("since")?;
        if kw != "since" {
            return Err(w.err(
                col1,
                format!(
                    "expected since MARK (counters are compared by their change), found {kw:?}"
                ),
            ));
        }
        let since = w.name("a mark")?;
        w.eq()?;
        let value = w.count()?;
        Op::ExpectVmstat {
            name: name.to_string(),
            since,
            value,
        }
    } else if let Some(fig) = Figure::parse(first) {
        let mut since = None;
        if w.peek() == Some("since") {
            w.next("since")?;
            since = Some(w.name("a mark")?);
        }
        w.eq()?;
        let (col3, v) = w.next("a size")?;
        let value = parse_signed_size(v)
            .ok_or_else(|| w.err(col3, format!("expected a size, found {v:?}")))?;
        // Sizes are in kB, whole ones; the VMA count is a plain number.
        if fig != Figure::Vmas && value % 1024 != 0 {
            return Err(w.err(col3, format!("{v:?} is not a whole number of kB")));
        }
        Op::ExpectFigure {
            fig,
            since,
            value: if fig == Figure::Vmas {
                value
            } else {
                value >> 10
            },
        }
    } else {
        let addr = parse_addr(first).ok_or_else(|| {
            w.err(col, format!("expected a figure (VmRSS, RssAnon, VmPTE, AnonHugePages, VMAs), faults, vmstat, node or an address, found {first:?}"))
        })?;
        w.eq()?;
        Op::ExpectValue {
            addr,
            value: w.number("a value")?,
        }
    })
}

/// The statement `fork`.
fn parse_fork(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Fork {
        child: w.name("a process name")?,
    })
}

/// The statement `thread`.
fn parse_thread(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Thread {
        name: w.name("a thread name")?,
    })
}

/// The statement `vfork`.
fn parse_vfork(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Vfork {
        child: w.name("a process name")?,
    })
}

/// The statement `switch`.
fn parse_switch(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Switch {
        proc_name: w.name("a process name")?,
    })
}

/// The statement `exit`.
fn parse_exit(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Exit {
        proc_name: if w.peek().is_some() {
            Some(w.name("a process name")?)
        } else {
            None
        },
    })
}

/// The statement `tunable`.
fn parse_tunable(w: &mut Words) -> Result<Op, ParseError> {
    let (col, name) = w.next("a tunable's name")?;
    let (vcol, value) = w.next("a value")?;
    match usermm::tunable::Tunables::parse(name, value) {
        Ok(_) => {}
        Err(e @ usermm::tunable::TunableError::UnknownName(_)) => {
            return Err(w.err(col, e.to_string()))
        }
        Err(e) => return Err(w.err(vcol, e.to_string())),
    }
    let op = Op::Tunable {
        name: name.to_string(),
        value: value.to_string(),
    };
    w.done()?;
    Ok(op)
}

/// The statement `knob`.
fn parse_knob(w: &mut Words) -> Result<Op, ParseError> {
    let (col, which) = w.next("enabled, only, use_zero_page, shmem_enabled, shmem, or a size")?;
    if which == "use_zero_page" {
        let (col, v) = w.next("0 or 1")?;
        let on = match v {
            "0" => false,
            "1" => true,
            _ => return Err(w.err(col, format!("expected 0 or 1, found {v:?}"))),
        };
        w.done()?;
        return Ok(Op::KnobUseZeroPage { on });
    }
    if which == "shmem_enabled" {
        let (col, mode) = w.next("a mode")?;
        if usermm::machine::ShmemHuge::parse(mode).is_none() {
            return Err(w.err(
                col,
                format!("bad mode {mode:?} (always, within_size, advise, never, deny or force)"),
            ));
        }
        w.done()?;
        return Ok(Op::KnobShmem {
            size_kb: None,
            mode: mode.to_string(),
        });
    }
    if which == "shmem" {
        let (col, sz) = w.next("a folio size")?;
        let kb = parse_size(sz)
            .and_then(whole_kb)
            .filter(|kb| [8, 16, 32, 64, 128, 256, 512, 1024, 2048].contains(kb));
        let size_kb = kb.ok_or_else(|| {
            w.err(
                col,
                format!("expected a shmem folio size (8K..2M), found {sz:?}"),
            )
        })?;
        let (col, mode) = w.next("a mode")?;
        if usermm::machine::ShmemOrderMode::parse(mode).is_none() {
            return Err(w.err(
                col,
                format!("bad mode {mode:?} (always, inherit, within_size, advise or never)"),
            ));
        }
        w.done()?;
        return Ok(Op::KnobShmem {
            size_kb: Some(size_kb),
            mode: mode.to_string(),
        });
    }
    if which == "only" {
        let (col, sz) = w.next("a folio size")?;
        let kb = parse_size(sz)
            .and_then(whole_kb)
            .filter(|kb| [4, 16, 32, 64, 128, 256, 512, 1024, 2048].contains(kb));
        let size_kb =
            kb.ok_or_else(|| w.err(col, format!("expected a folio size (4K..2M), found {sz:?}")))?;
        w.done()?;
        return Ok(Op::KnobOnly { size_kb });
    }
    let size_kb = if which == "enabled" {
        None
    } else {
        let kb = parse_size(which)
            .and_then(whole_kb)
            .filter(|kb| [16, 32, 64, 128, 256, 512, 1024, 2048].contains(kb));
        Some(kb.ok_or_else(|| {
            w.err(
                col,
                format!("expected enabled or an mTHP size (16K..2M), found {which:?}"),
            )
        })?)
    };
    let (col, mode) = w.next("a mode")?;
    if !KNOB_MODES.contains(&mode) || (size_kb.is_none() && mode == "inherit") {
        return Err(w.err(col, format!("bad mode {mode:?}")));
    }
    Ok(Op::Knob {
        size_kb,
        mode: mode.to_string(),
    })
}

/// The statement `sysctl`.
fn parse_sysctl(w: &mut Words) -> Result<Op, ParseError> {
    let (col, name) = w.next("a sysctl name")?;
    if !SYSCTLS.contains(&name) {
        return Err(w.err(
            col,
            format!("unknown sysctl {name:?} (known: {})", SYSCTLS.join(", ")),
        ));
    }
    Ok(Op::Sysctl {
        name: name.to_string(),
        value: w.number("a value")?,
    })
}

/// The statement `mark`.
fn parse_mark(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Mark {
        name: w.name("a mark name")?,
    })
}

/// The statement `print`.
fn parse_print(w: &mut Words) -> Result<Op, ParseError> {
    let (col, f) = w.next("a figure")?;
    Ok(Op::Print {
        fig: Figure::parse(f).ok_or_else(|| w.err(col, format!("unknown figure {f:?}")))?,
    })
}

/// The statement `fails`.
fn parse_fails(w: &mut Words) -> Result<Op, ParseError> {
    let (col, e) = w.next("an errno")?;
    let Some(name) = e.strip_suffix(':') else {
        return Err(w.err(col, format!("expected ERRNO: (with a colon), found {e:?}")));
    };
    if usermm::Errno::from_name(name).is_none() {
        return Err(w.err(col, format!("unknown errno {name:?}")));
    }
    let inner = parse_op(w)?;
    if matches!(inner, Op::Fails { .. }) {
        return Err(w.err(col, "fails cannot be nested"));
    }
    Ok(Op::Fails {
        errno: name.to_string(),
        op: Box::new(inner),
    })
}

/// The statement `exec [aslr=MMAP,PIE,STACK,ALIGN,BRK] PATH [ARGS...]`.
fn parse_exec(w: &mut Words) -> Result<Op, ParseError> {
    let (mut col, mut path) = w.next("a program's path")?;
    let mut rnd = None;
    if let Some(list) = path.strip_prefix("aslr=") {
        let nums: Vec<Option<u64>> = list.split(',').map(parse_size).collect();
        let r = match nums.as_slice() {
            [Some(mmap), Some(pie), Some(stack), Some(stack_align), Some(brk)] => {
                usermm::exec::ExecRandom {
                    mmap: *mmap,
                    pie: *pie,
                    stack: *stack,
                    stack_align: *stack_align,
                    brk: *brk,
                }
            }
            _ => {
                return Err(w.err(
                    col,
                    format!(
                        "expected aslr=MMAP,PIE,STACK,ALIGN,BRK (five numbers), found {path:?}"
                    ),
                ))
            }
        };
        if r.check().is_err() {
            return Err(w.err(
                col,
                "aslr= numbers the kernel cannot draw: MMAP and PIE page multiples below 2^40, STACK one below 16 GiB, ALIGN below 8192, BRK a page multiple below 1 GiB".to_string(),
            ));
        }
        rnd = Some(r);
        (col, path) = w.next("a program's path")?;
    }
    if !path.starts_with('/') {
        return Err(w.err(col, format!("expected an absolute path, found {path:?}")));
    }
    let mut args = vec![];
    while w.peek().is_some() {
        args.push(w.next("an argument")?.1.to_string());
    }
    Ok(Op::Exec {
        path: path.to_string(),
        args,
        rnd,
    })
}

/// The statement `maps`.
fn parse_maps(_w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Maps)
}

/// The statement `brk [+SIZE|-SIZE|ADDR] [as=NAME]`.
fn parse_brk(w: &mut Words) -> Result<Op, ParseError> {
    let (mut to, mut name) = (BrkTo::Query, None);
    while w.peek().is_some() {
        let (col, word) = w.next("a size, an address or as=NAME")?;
        if let Some(v) = word.strip_prefix("as=") {
            name = Some(v.to_string());
        } else if to != BrkTo::Query {
            return Err(w.err(col, format!("unexpected {word:?} after the new break")));
        } else if word.starts_with(['+', '-']) {
            let by =
                parse_signed_size(word).ok_or_else(|| w.err(col, format!("bad size {word:?}")))?;
            to = BrkTo::By(by);
        } else {
            let a = parse_addr(word).ok_or_else(|| w.err(col, format!("bad address {word:?}")))?;
            to = BrkTo::At(a);
        }
    }
    Ok(Op::Brk { to, name })
}

/// The statement `dump`.
fn parse_dump(_w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Dump)
}

/// The statement `migrate`.
fn parse_migrate(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::Migrate {
        addr: w.addr()?,
        len: w.number("a length")?,
        node: w.number("a node")?,
    })
}

/// The statement `mbind`.
fn parse_mbind(w: &mut Words) -> Result<Op, ParseError> {
    let addr = w.addr()?;
    let len = w.number("a length")?;
    let (col, p) = w.next("a policy")?;
    let mode = MPOL_NAMES.iter().position(|&n| n == p).ok_or_else(|| {
        w.err(
            col,
            format!("unknown policy {p:?} (known: {})", MPOL_NAMES.join(", ")),
        )
    })? as i32;
    let (col, n) = w.next("nodes (0,1 or -)")?;
    let nodes = parse_nodes(n)
        .ok_or_else(|| w.err(col, format!("expected nodes such as 0,1 or -, found {n:?}")))?;
    let mut flags = 0;
    while w.peek().is_some() {
        let (col, f) = w.next("a flag")?;
        flags |= match f {
            "strict" => 1,
            "move" => 2,
            "move_all" => 4,
            _ => {
                return Err(w.err(
                    col,
                    format!("unknown mbind flag {f:?} (strict, move, move_all)"),
                ))
            }
        };
    }
    Ok(Op::Mbind {
        addr,
        len,
        mode,
        nodes,
        flags,
    })
}

/// The statement `await_numa_hint`.
fn parse_await_numa_hint(w: &mut Words) -> Result<Op, ParseError> {
    Ok(Op::AwaitNumaHint { addr: w.addr()? })
}

/// The statement `numa_balancing`.
fn parse_numa_balancing(w: &mut Words) -> Result<Op, ParseError> {
    let (col, v) = w.next("a mode (0 off, 1 normal, 2 memory tiering, 3 both)")?;
    Ok(Op::NumaBalancing {
        mode: v
            .parse()
            .ok()
            .filter(|&m: &u8| m <= 3)
            .ok_or_else(|| w.err(col, format!("expected a mode 0 to 3, found {v:?}")))?,
    })
}

/// The statement `demotion`.
fn parse_demotion(w: &mut Words) -> Result<Op, ParseError> {
    let (col, v) = w.next("on or off")?;
    Ok(Op::Demotion {
        on: match v {
            "on" => true,
            "off" => false,
            _ => return Err(w.err(col, format!("expected on or off, found {v:?}"))),
        },
    })
}

/// The statement `require`.
fn parse_require(w: &mut Words) -> Result<Op, ParseError> {
    let (col, what) = w.next("nodes or file")?;
    match what {
        "nodes" => Ok(Op::RequireNodes {
            n: w.number("a number of nodes")?,
        }),
        "file" => Ok(Op::RequireFile {
            path: w.next("a host file's path")?.1.to_string(),
        }),
        _ => Err(w.err(
            col,
            format!("expected require nodes N or require file PATH, found {what:?}"),
        )),
    }
}

/// Parse a whole scenario.
pub fn parse(src: &str) -> Result<Vec<Stmt>, ParseError> {
    let mut out = vec![];
    for (i, raw) in src.lines().enumerate() {
        let line = i + 1;
        let text = raw.split('#').next().unwrap_or("");
        if text.trim().is_empty() {
            continue;
        }
        let mut w = Words::new(line, text);
        let op = parse_op(&mut w)?;
        out.push(Stmt {
            line,
            text: text.trim().to_string(),
            op,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_statements() {
        let s = parse(
            "# a comment\nmap A 2M rw at=0x600000000000 align=2M flags=private,anonymous\n\
             fill A 64K 7   # trailing comment\ncheck A+0x1000 4K zero\nexpect VmRSS since m == 64K\n\
             fails EINVAL: munmap A+1 4K\nknob 64K always\nexpect A+8 == 0x10\n",
        )
        .unwrap();
        assert_eq!(s.len(), 7);
        assert!(
            matches!(&s[0].op, Op::Map { len, align, .. } if *len == 2 << 20 && *align == 2 << 20)
        );
        assert!(matches!(
            &s[2].op,
            Op::Check {
                pattern: Pattern::Zero,
                ..
            }
        ));
        assert!(matches!(&s[3].op, Op::ExpectFigure { value: 64, .. }));
        assert!(matches!(&s[4].op, Op::Fails { errno, .. } if errno == "EINVAL"));
        assert_eq!(s[4].line, 6);
    }

    #[test]
    fn errors_have_line_and_column() {
        let e = parse("map A 2M rw\nmunmap A zz\n").unwrap_err();
        assert_eq!((e.line, e.col), (2, 10));
        let e = parse("  frobnicate\n").unwrap_err();
        assert_eq!((e.line, e.col), (1, 3));
        let e = parse("map A\n").unwrap_err();
        assert_eq!((e.line, e.col), (1, 6));
        let e = parse("fails NOPE: munmap A\n").unwrap_err();
        assert_eq!((e.line, e.col), (1, 7));
    }

    #[test]
    fn tunables_are_checked_when_parsed() {
        let s = parse("tunable zap_batch off\n").unwrap();
        assert!(
            matches!(&s[0].op, Op::Tunable { name, value } if name == "zap_batch" && value == "off")
        );
        let e = parse("tunable zap off\n").unwrap_err();
        assert_eq!((e.line, e.col), (1, 9));
        assert!(e.to_string().contains("fork_batch, zap_batch"), "{e}");
        let e = parse("tunable zap_batch maybe\n").unwrap_err();
        assert_eq!((e.line, e.col), (1, 19));
        assert!(e.to_string().contains("off, on"), "{e}");
        assert!(parse("tunable zap_batch\n").is_err());
        assert!(parse("tunable zap_batch on extra\n").is_err());
    }

    #[test]
    fn hostile_input_never_panics() {
        for src in [
            "map",
            "map A 99999999999999999999G rw",
            "expect",
            "fails",
            "fails EINVAL:",
            "knob 3K always",
            "map A 4K rw at=",
            "check A 4K",
            "munmap -",
            "expect A+ == 1",
            "\u{0}\u{ffff}",
            "map A 4K rw align=3",
        ] {
            let _ = parse(src);
        }
    }

    #[test]
    fn sizes_in_kb_must_be_whole_kb() {
        for src in [
            "knob 16385 always",
            "knob only 4097",
            "expect VmRSS == 1000",
            "expect RssAnon since m == 4095",
        ] {
            assert!(parse(src).is_err(), "{src:?} parsed");
        }
        for src in [
            "knob 16384 always",
            "knob only 4096",
            "expect VmRSS == 8K",
            "expect VMAs == 3",
        ] {
            assert!(parse(src).is_ok(), "{src:?} refused");
        }
    }

    #[test]
    fn strides_and_fault_counts() {
        for src in [
            "fill A 1G 1 every=2M",
            "check A 1G zero every=8K",
            "check A 64K 3",
            "expect faults reading A 1G every=2M == 127",
            "expect faults reading A+4K 64K == 0",
            "await_numa_hint A+256M",
        ] {
            assert!(parse(src).is_ok(), "{src:?} refused");
        }
        for (src, why) in [
            ("fill A 1G 1 every=3K", "multiple of 4K"),
            ("fill A 1G 1 every=0", "multiple of 4K"),
            ("fill A 1G 1 junk", "unexpected"),
            ("expect faults A 4K == 1", "expected reading"),
            ("expect faults reading A 4K every=2M = 1", "expected =="),
            ("expect faults reading A 4K == 1K", "expected a count"),
            ("expect faults reading A 4K == -1", "expected a count"),
            ("await_numa_hint", "an address"),
        ] {
            let e = parse(src).unwrap_err().to_string();
            assert!(e.contains(why), "{src:?}: {e}");
        }
    }

    #[test]
    fn vmstat_counters_by_name_and_change() {
        for src in [
            "expect vmstat thp_fault_alloc since m == 1",
            "expect vmstat hugepages-64kB/split since m == 0",
            "expect vmstat nr_anon_transparent_hugepages since m == -1",
        ] {
            assert!(parse(src).is_ok(), "{src:?} refused");
        }
        for (src, why) in [
            ("expect vmstat no_such_counter since m == 1", "no counter"),
            (
                "expect vmstat hugepages-3kB/split since m == 1",
                "no counter",
            ),
            ("expect vmstat thp_fault_alloc == 1", "expected since"),
            (
                "expect vmstat thp_fault_alloc since m == 1K",
                "expected a count",
            ),
        ] {
            let e = parse(src).unwrap_err().to_string();
            assert!(e.contains(why), "{src:?}: {e}");
        }
    }
}
