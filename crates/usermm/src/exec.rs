//! exec (fs/exec.c): a process's new address space.
//!
//! `do_execve` opens the program (a host file, read-only, as `open` in a
//! scenario reads one) and its interpreter, checks both before anything
//! is changed, then builds the new mm as the kernel does: a stack VMA of
//! one page at the top of the user window into which the file name, the
//! environment and the arguments are copied (`bprm_mm_init`,
//! `copy_strings`), the switch to it (`exec_mmap`, the old mm torn down),
//! then `load_elf_binary` ([`crate::binfmt_elf`]): `setup_arg_pages`
//! grows the stack by 128 KiB, the segments are mapped, the vDSO
//! installed, and `create_elf_tables` writes the argument pointers and the
//! auxiliary vector below the strings. Everything is written through the
//! new mm's own page tables, so the pages the host's exec touches are the
//! ones the model's touches.
//!
//! Addresses are those of a process run with randomisation off (`setarch
//! -R`): the stack at `STACK_TOP`, `mmap_base` 128 MiB below it (or the
//! stack limit and its guard gap, if larger). With randomisation on, the
//! kernel draws five numbers, which the caller gives ([`ExecRandom`]):
//! `mmap_base`'s offset (and its gap then keeps room for the stack's
//! largest offset), a position-independent program's offset from
//! `ELF_ET_DYN_BASE`, the stack top's offset (`randomize_stack_top` and
//! `setup_arg_pages`'s `arch_align_stack`), the stack pointer's
//! (`create_elf_tables`' `arch_align_stack`), and brk's from a page past
//! the bss (`arch_randomize_brk`). The kernel builds the stack at
//! `STACK_TOP` and moves it down (`shift_arg_pages`, its tables freed
//! behind it); the model builds it at its final place, which leaves the
//! same pages and tables.
//!
//! A `#!` script runs its interpreter (`load_script`, fs/binfmt_script.c):
//! argv[0] is taken off the stack and the interpreter's name, its one
//! optional argument and the script's path put on in its place, up to
//! five scripts deep (ELOOP past them); `AT_EXECFN` still names the
//! script.
//!
//! The model's simplifications: every file is opened and checked before
//! the strings are copied (the kernel copies them first, so a script whose
//! interpreter is missing and whose arguments are too long is ENOENT here
//! and E2BIG there; a `#!` line that is not UTF-8 is ENOEXEC); a failure
//! after the old mm would be
//! gone (out of memory while loading) leaves the process on its old mm
//! with the error, where the kernel kills it; the temporary stack takes
//! THPs like any anonymous VMA (the kernel's `VM_STACK_INCOMPLETE_SETUP`
//! keeps them off it until `setup_arg_pages`).

use crate::binfmt_elf::{ElfImage, ElfLoaded};
use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::mm::vma::*;
use crate::mm::{Mm, TASK_SIZE};
use crate::phys::{PAGE_MASK, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::{Arc, Ordering};

/// `STACK_TOP` (and `STACK_TOP_MAX`) on x86-64 with 4-level tables: the
/// top of the user window, where the stack ends.
pub const STACK_TOP: u64 = TASK_SIZE;
/// How far `setup_arg_pages` grows the stack past what the strings took
/// (`stack_expand`, 128 KiB).
const STACK_EXPAND: u64 = 128 << 10;
/// `ARG_MAX`-like floor on the room for the strings (32 pages).
const ARG_MAX: u64 = 32 * PAGE_SIZE;
/// `MAX_ARG_STRLEN`: the longest single argument or environment string.
const MAX_ARG_STRLEN: u64 = 32 * PAGE_SIZE;
/// `_STK_LIM`: the default stack limit, which caps the strings' room at
/// three quarters of it.
const STK_LIM: u64 = 8 << 20;
/// The platform string the auxiliary vector points to (`ELF_PLATFORM`).
const ELF_PLATFORM: &[u8] = b"x86_64\0";
/// `BINPRM_BUF_SIZE`: the bytes of a program's start read to tell its
/// format, and all a `#!` line may take.
const BINPRM_BUF_SIZE: usize = 256;
/// How many interpreters deep an exec may go (`exec_binprm`'s depth).
const MAX_INTERP_DEPTH: usize = 5;

/// The random numbers of an exec with randomisation on, in bytes; each a
/// multiple of the page size but `stack_align`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecRandom {
    /// `arch_mmap_rnd()` for `mmap_base` (below 2^28 pages).
    pub mmap: u64,
    /// The second `arch_mmap_rnd()`: a position-independent program's
    /// load bias above `ELF_ET_DYN_BASE` (below 2^28 pages).
    pub pie: u64,
    /// How far below `STACK_TOP` the stack ends (`STACK_RND_MASK`: below
    /// 2^22 pages, plus a page from the alignment).
    pub stack: u64,
    /// What `create_elf_tables`' `arch_align_stack` takes off the stack
    /// pointer before rounding it to 16 (below 8192).
    pub stack_align: u64,
    /// `arch_randomize_brk`: the heap's offset from a page past the bss
    /// (below 1 GiB for a 64-bit task).
    pub brk: u64,
}

/// `STACK_RND_MASK` for 64-bit tasks: the stack top moves down by up to
/// this many pages.
const STACK_RND_MASK: u64 = 0x3f_ffff;

impl ExecRandom {
    /// EINVAL unless every number is one the kernel can draw.
    pub fn check(&self) -> KResult<()> {
        let paged = [self.mmap, self.pie, self.stack, self.brk]
            .iter()
            .all(|v| v % PAGE_SIZE == 0);
        let in_range = self.mmap >> PAGE_SHIFT < 1 << 28
            && self.pie >> PAGE_SHIFT < 1 << 28
            && self.stack >> PAGE_SHIFT <= STACK_RND_MASK + 1
            && self.stack_align < 8192
            && self.brk < 1 << 30;
        if paged && in_range {
            Ok(())
        } else {
            Err(Errno::EINVAL)
        }
    }
}

/// `struct linux_binprm`: the program being exec'd and the strings that
/// go on its stack.
pub struct LinuxBinprm {
    /// The path as exec was given it (what `AT_EXECFN` names).
    pub filename: String,
    /// The arguments the program runs with (a script's rewritten).
    pub argv: Vec<String>,
    /// The arguments exec was given, copied first.
    argv_given: Vec<String>,
    /// What each `#!` script did to the strings, in order.
    scripts: Vec<ScriptLevel>,
    pub envp: Vec<String>,
    pub file: Arc<crate::fs::File>,
    pub elf: ElfImage,
    /// The interpreter's header and open file, if the program names one.
    pub interp: Option<(ElfImage, Arc<crate::fs::File>)>,
    /// The current top of the strings: where the next one goes below.
    pub p: u64,
    /// `bprm->exec`: the address of the file name on the stack.
    pub exec: u64,
    /// The lowest `p` the strings may reach (`bprm->argmin`).
    argmin: u64,
    /// Randomisation's numbers, if it is on.
    pub rnd: Option<ExecRandom>,
    /// Where the stack ends (`STACK_TOP`, less the random offset).
    pub stack_top: u64,
}

/// `open_exec` of a host file: a regular file with an execute bit (EACCES
/// otherwise, as `may_open` with `MAY_EXEC` answers even root), opened
/// read-only; ENOENT and the like as the host answers.
fn open_exec(oncpu: &OnCpu, path: &str) -> KResult<(Arc<crate::fs::File>, std::fs::File)> {
    use std::os::unix::fs::PermissionsExt;
    let host =
        std::fs::File::open(path).map_err(|e| Errno(e.raw_os_error().unwrap_or(Errno::EIO.0)))?;
    let meta = host.metadata().map_err(|_| Errno::EIO)?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(Errno::EACCES);
    }
    let inode = oncpu
        .m
        .open_host_file(std::path::Path::new(path))
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(Errno::EIO.0)))?;
    let mode = crate::fs::FMode {
        read: true,
        write: false,
    };
    Ok((crate::fs::File::open(&inode, mode)?, host))
}

/// One `#!` script's change to the strings on the new stack: argv[0]
/// (`removed` bytes with its NUL) taken off (`remove_arg_zero`), then
/// `pushed` put on, each below the one before (the script's path, the
/// interpreter's argument if any, the interpreter's name).
struct ScriptLevel {
    removed: u64,
    pushed: Vec<String>,
}

/// `load_script`'s parse of a `#!` line in `buf` (the file's first
/// `BINPRM_BUF_SIZE` bytes, zero-padded): None if the file is no script;
/// else the interpreter's name and its optional argument, or ENOEXEC for
/// a line with no name, or whose name may be cut off.
fn parse_script_line(buf: &[u8; BINPRM_BUF_SIZE]) -> Option<KResult<(String, Option<String>)>> {
    if buf[0] != b'#' || buf[1] != b'!' {
        return None;
    }
    let spacetab = |c: u8| c == b' ' || c == b'\t';
    // Both bounds inclusive, as the kernel's helpers take them.
    let next_non_spacetab = |first: usize, last: usize| (first..=last).find(|&i| !spacetab(buf[i]));
    let next_terminator =
        |first: usize, last: usize| (first..=last).find(|&i| spacetab(buf[i]) || buf[i] == 0);
    let buf_end = BINPRM_BUF_SIZE - 1;
    // The line's end (exclusive): its newline, or, with none in the
    // buffer, its last byte if the name is certainly whole.
    let mut i_end = match buf.iter().position(|&c| c == b'\n') {
        Some(i) => i,
        None => {
            let Some(name) = next_non_spacetab(2, buf_end) else {
                return Some(Err(Errno::ENOEXEC));
            };
            if next_terminator(name, buf_end).is_none() {
                return Some(Err(Errno::ENOEXEC));
            }
            buf_end
        }
    };
    while spacetab(buf[i_end - 1]) {
        i_end -= 1;
    }
    let i_name = match next_non_spacetab(2, i_end) {
        Some(i) if i != i_end => i,
        _ => return Some(Err(Errno::ENOEXEC)),
    };
    let i_sep = next_terminator(i_name, i_end);
    let i_arg = i_sep
        .filter(|&s| buf[s] != 0)
        .and_then(|s| next_non_spacetab(s, i_end));
    // The strings end at the line's end, the name at its separator when
    // an argument follows it, and at any NUL.
    let text = |from: usize, to: usize| -> KResult<String> {
        let bytes = &buf[from..to];
        let bytes = &bytes[..bytes.iter().position(|&c| c == 0).unwrap_or(bytes.len())];
        String::from_utf8(bytes.to_vec()).map_err(|_| Errno::ENOEXEC)
    };
    let name_end = match (i_arg, i_sep) {
        (Some(_), Some(s)) => s,
        _ => i_end,
    };
    let parsed = text(i_name, name_end).and_then(|name| {
        let arg = i_arg.map(|a| text(a, i_end)).transpose()?;
        Ok((name, arg))
    });
    Some(parsed)
}

/// The first `BINPRM_BUF_SIZE` bytes of an open host file, zero-padded.
fn read_binprm_buf(host: &std::fs::File) -> KResult<[u8; BINPRM_BUF_SIZE]> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; BINPRM_BUF_SIZE];
    let mut got = 0;
    while got < buf.len() {
        match host.read_at(&mut buf[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(Errno(e.raw_os_error().unwrap_or(Errno::EIO.0))),
        }
    }
    Ok(buf)
}

/// The program and its interpreter, opened and checked: everything that
/// can fail before the old address space is given up. A `#!` script is
/// followed to the program that runs it (`exec_binprm`'s loop).
fn prepare_binprm(oncpu: &OnCpu, path: &str, argv: &[&str], envp: &[&str]) -> KResult<LinuxBinprm> {
    // With no arguments at all, the kernel passes one empty one (5.18+).
    let mut argv_given: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    if argv_given.is_empty() {
        argv_given.push(String::new());
    }
    let mut argv = argv_given.clone();
    let mut scripts = Vec::new();
    // `bprm->interp`: the name a script's interpreter is given as the
    // script's path.
    let mut interp_name = path.to_string();
    let (mut file, mut host) = open_exec(oncpu, path)?;
    for depth in 0.. {
        let buf = read_binprm_buf(&host)?;
        let Some(parsed) = parse_script_line(&buf) else {
            break;
        };
        let (i_name, i_arg) = parsed?;
        let removed = argv.remove(0).len() as u64 + 1;
        let mut pushed = vec![interp_name];
        pushed.extend(i_arg);
        pushed.push(i_name.clone());
        argv.splice(0..0, pushed.iter().rev().cloned());
        scripts.push(ScriptLevel { removed, pushed });
        interp_name = i_name.clone();
        (file, host) = open_exec(oncpu, &i_name)?;
        if depth + 1 > MAX_INTERP_DEPTH {
            return Err(Errno::ELOOP);
        }
    }
    let elf = ElfImage::parse(&host, Errno::ENOEXEC)?;
    let interp = match elf.interpreter(&host)? {
        Some(ipath) => {
            let (ifile, ihost) = open_exec(oncpu, &ipath)?;
            Some((ElfImage::parse(&ihost, Errno::ELIBBAD)?, ifile))
        }
        None => None,
    };
    Ok(LinuxBinprm {
        filename: path.to_string(),
        argv,
        argv_given,
        scripts,
        envp: envp.iter().map(|s| s.to_string()).collect(),
        file,
        elf,
        interp,
        p: 0,
        exec: 0,
        argmin: 0,
        rnd: None,
        stack_top: STACK_TOP,
    })
}

/// `mmap_base` (arch/x86/mm/mmap.c): the stack's limit and its guard gap
/// below the top (and, with randomisation, room for the stack's largest
/// offset, then the random offset `rnd`), kept between 128 MiB and five
/// sixths of the window.
pub fn mmap_base(stack_limit: u64, rnd: Option<u64>) -> u64 {
    let pad = STACK_GUARD_GAP + rnd.map_or(0, |_| STACK_RND_MASK << PAGE_SHIFT);
    let gap = stack_limit.saturating_add(pad);
    let gap = gap.clamp(128 << 20, TASK_SIZE / 6 * 5);
    (TASK_SIZE - gap - rnd.unwrap_or(0)) & PAGE_MASK
}

/// `bprm_mm_init`: the new mm's one VMA, a page of stack at the top
/// (accounted, as `insert_vm_struct` charges a `VM_ACCOUNT` VMA), and the
/// strings' limits (`bprm_stack_limits`).
fn bprm_mm_init(oncpu: &OnCpu, mm: &Arc<Mm>, bprm: &mut LinuxBinprm) -> KResult<()> {
    let flags = VM_GROWSDOWN | VM_DATA_DEFAULT_FLAGS | VM_ACCOUNT;
    let top = bprm.stack_top;
    let start = top - PAGE_SIZE;
    let vma = Vma::new(mm.id, start, top, flags, start >> PAGE_SHIFT);
    crate::mmap::insert_vm_struct(oncpu, mm, vma)?;
    bprm.p = top - 8;
    // bprm_stack_limits: a quarter of the stack limit (at most three
    // quarters of the default), at least ARG_MAX, less the pointers.
    let limit = (STK_LIM / 4 * 3).min(mm.stack_limit() / 4).max(ARG_MAX);
    let ptr_size = (bprm.argv.len() as u64 + bprm.envp.len() as u64 + 2) * 8;
    if limit <= ptr_size {
        return Err(Errno::E2BIG);
    }
    bprm.argmin = bprm.p - (limit - ptr_size);
    Ok(())
}

/// `copy_strings`: each string, last first, below the one before, so that
/// they lie in order upwards; the pages are faulted in as they are
/// written, the stack growing down to take them.
fn copy_strings(oncpu: &OnCpu, bprm: &mut LinuxBinprm, strings: &[String]) -> KResult<()> {
    for s in strings.iter().rev() {
        let mut bytes = s.as_bytes().to_vec();
        bytes.push(0);
        let len = bytes.len() as u64;
        if len > MAX_ARG_STRLEN {
            return Err(Errno::E2BIG);
        }
        let p = bprm.p - len;
        if p < bprm.argmin {
            return Err(Errno::E2BIG);
        }
        oncpu.write_bytes(p, &bytes)?;
        bprm.p = p;
    }
    Ok(())
}

/// `setup_arg_pages`: the stack's final flags (executable only where the
/// program's `PT_GNU_STACK` asks), `arg_start`, and the stack grown by
/// `STACK_EXPAND` (or to the stack limit). With no randomisation
/// The new stack's VMA: the first that ends above `p` (the caller holds
/// mmap_lock).
fn stack_vma(mm: &Mm, p: u64) -> KResult<Arc<crate::mm::Vma>> {
    let guard = crate::sync::epoch::pin();
    mm.vma_tree(&guard)
        .find_vma(p)
        .cloned()
        .ok_or(Errno::EFAULT)
}

/// `stack_top` is where the stack already ends: nothing moves.
pub fn setup_arg_pages(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    bprm: &mut LinuxBinprm,
    stack_top: u64,
    executable_stack: bool,
) -> KResult<()> {
    let g = mm.mmap_lock.write();
    let vma = stack_vma(mm, bprm.p)?;
    debug_assert_eq!(vma.end(), stack_top, "no stack shift without randomisation");
    mm.set_layout(&g, |l| l.arg_start = bprm.p);
    let vma = if executable_stack {
        let mut tree = mm.vma_tree_draft();
        let v = crate::mmap::vma_set_flags(&mut tree, &vma, vma.flags() | VM_EXEC, false);
        mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
        v
    } else {
        vma
    };
    let stack_size = vma.end() - vma.start();
    let rlim = mm.stack_limit() & PAGE_MASK;
    let expand = rlim.min(stack_size + STACK_EXPAND);
    let base = vma.end() - expand;
    if base < vma.start() {
        crate::mmap::expand_downwards(oncpu, mm, &vma, base).map_err(|_| Errno::EFAULT)?;
    }
    Ok(())
}

/// `create_elf_tables`: below the strings, the platform string and 16
/// random bytes, then (16-byte aligned) `argc`, the argument and
/// environment pointers and the auxiliary vector: the 22 entries 6.18
/// gives an x86-64 program and `AT_NULL`. Written through the user's
/// mapping (`copy_to_user`), so the stack's pages are faulted in as the
/// kernel's writes fault them.
pub fn create_elf_tables(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    bprm: &mut LinuxBinprm,
    l: &ElfLoaded,
    vdso: u64,
) -> KResult<()> {
    // AT_* numbers (include/uapi/linux/auxvec.h and x86's).
    const AT_PHDR: u64 = 3;
    const AT_PHENT: u64 = 4;
    const AT_PHNUM: u64 = 5;
    const AT_PAGESZ: u64 = 6;
    const AT_BASE: u64 = 7;
    const AT_FLAGS: u64 = 8;
    const AT_ENTRY: u64 = 9;
    const AT_UID: u64 = 11;
    const AT_EUID: u64 = 12;
    const AT_GID: u64 = 13;
    const AT_EGID: u64 = 14;
    const AT_PLATFORM: u64 = 15;
    const AT_HWCAP: u64 = 16;
    const AT_CLKTCK: u64 = 17;
    const AT_SECURE: u64 = 23;
    const AT_RANDOM: u64 = 25;
    const AT_HWCAP2: u64 = 26;
    const AT_RSEQ_FEATURE_SIZE: u64 = 27;
    const AT_RSEQ_ALIGN: u64 = 28;
    const AT_EXECFN: u64 = 31;
    const AT_SYSINFO_EHDR: u64 = 33;
    const AT_MINSIGSTKSZ: u64 = 51;
    // arch_align_stack: a random cut with randomisation on.
    let mut p = (bprm.p - bprm.rnd.map_or(0, |r| r.stack_align)) & !0xf;
    p -= ELF_PLATFORM.len() as u64;
    let u_platform = p;
    oncpu.write_bytes(u_platform, ELF_PLATFORM)?;
    // The model's "random" bytes are fixed, so that runs repeat.
    p -= 16;
    let u_rand = p;
    oncpu.write_bytes(u_rand, &[0x5a; 16])?;
    let phnum = bprm.elf.phdrs.len() as u64;
    let auxv: [(u64, u64); 23] = [
        (AT_SYSINFO_EHDR, vdso),
        (AT_MINSIGSTKSZ, 2048),
        (AT_HWCAP, 0x178b_fbff),
        (AT_PAGESZ, PAGE_SIZE),
        (AT_CLKTCK, 100),
        (AT_PHDR, l.phdr_addr),
        (AT_PHENT, 56),
        (AT_PHNUM, phnum),
        (AT_BASE, l.interp_load_addr),
        (AT_FLAGS, 0),
        (AT_ENTRY, l.e_entry),
        (AT_UID, 0),
        (AT_EUID, 0),
        (AT_GID, 0),
        (AT_EGID, 0),
        (AT_SECURE, 0),
        (AT_RANDOM, u_rand),
        (AT_HWCAP2, 0x2),
        (AT_EXECFN, bprm.exec),
        (AT_PLATFORM, u_platform),
        (AT_RSEQ_FEATURE_SIZE, 32),
        (AT_RSEQ_ALIGN, 32),
        (0, 0),
    ];
    let ei_index = auxv.len() as u64 * 2;
    let sp = p - ei_index * 8;
    let (argc, envc) = (bprm.argv.len() as u64, bprm.envp.len() as u64);
    let items = (argc + 1) + (envc + 1) + 1;
    bprm.p = (sp - items * 8) & !0xf;
    // The stack may need to grow to take the tables (find_extend_vma).
    {
        let _g = mm.mmap_lock.write();
        let vma = stack_vma(mm, bprm.p)?;
        if bprm.p < vma.start() {
            crate::mmap::expand_downwards(oncpu, mm, &vma, bprm.p)?;
        }
    }
    let mut words = Vec::with_capacity((items + ei_index) as usize);
    words.push(argc);
    let layout = mm.layout();
    let mut s = layout.arg_start;
    for a in &bprm.argv {
        words.push(s);
        s += a.len() as u64 + 1;
    }
    words.push(0);
    let (arg_end, env_start) = (s, s);
    for e in &bprm.envp {
        words.push(s);
        s += e.len() as u64 + 1;
    }
    words.push(0);
    for (k, v) in auxv {
        words.push(k);
        words.push(v);
    }
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    oncpu.write_bytes(bprm.p, &bytes)?;
    let g = mm.mmap_lock.write();
    mm.set_layout(&g, |lay| {
        lay.arg_end = arg_end;
        lay.env_start = env_start;
        lay.env_end = s;
    });
    Ok(())
}

/// `execve(2)` of the current process: `path` with `argv` and `envp`.
/// On success the CPU runs the new mm, the old one is given up (`mmput`:
/// torn down, unless `old_shared`: a vfork child's exec gives the mm back
/// to its parent), and the new one is returned; on failure nothing has
/// changed.
pub fn do_execve(
    oncpu: &OnCpu,
    path: &str,
    argv: &[&str],
    envp: &[&str],
    old_shared: bool,
    rnd: Option<ExecRandom>,
) -> KResult<Arc<Mm>> {
    let old = oncpu.mm()?;
    if let Some(r) = &rnd {
        r.check()?;
    }
    let mut bprm = prepare_binprm(oncpu, path, argv, envp)?;
    bprm.rnd = rnd;
    bprm.stack_top = STACK_TOP - rnd.map_or(0, |r| r.stack);
    let mm = Mm::new(oncpu.mem().clone(), oncpu.cpu.node, oncpu.id())?;
    // Limits and capabilities survive exec; mlockall's future locking
    // does not (`mm_init` keeps only `VM_NOHUGEPAGE` of def_flags).
    mm.set_memlock_limit(old.memlock_limit());
    mm.set_stack_limit(old.stack_limit());
    mm.set_cap_ipc_lock(old.cap_ipc_lock());
    mm.def_flags.store(
        old.def_flags.load(Ordering::Relaxed) & VM_NOHUGEPAGE,
        Ordering::Relaxed,
    );
    {
        let g = mm.mmap_lock.write();
        mm.set_layout(&g, |l| {
            l.mmap_base = mmap_base(mm.stack_limit(), rnd.map(|r| r.mmap));
        });
    }
    oncpu.m.register_mm(&mm);
    // The strings go in through the new mm's tables: run it now (the
    // kernel writes them through GUP on the new mm before `exec_mmap`).
    oncpu.switch_mm(&mm);
    let built = build_new_mm(oncpu, &mm, &mut bprm);
    match built {
        Ok(()) => {
            if !old_shared {
                crate::mmap::exit_mmap(oncpu, &old);
            }
            Ok(mm)
        }
        Err(e) => {
            crate::mmap::exit_mmap(oncpu, &mm);
            oncpu.switch_mm(&old);
            Err(e)
        }
    }
}

/// The new mm's stack and strings, then the program.
fn build_new_mm(oncpu: &OnCpu, mm: &Arc<Mm>, bprm: &mut LinuxBinprm) -> KResult<()> {
    bprm_mm_init(oncpu, mm, bprm)?;
    let filename = [bprm.filename.clone()];
    copy_strings(oncpu, bprm, &filename)?;
    bprm.exec = bprm.p;
    let envp = bprm.envp.clone();
    copy_strings(oncpu, bprm, &envp)?;
    let argv = bprm.argv_given.clone();
    copy_strings(oncpu, bprm, &argv)?;
    // Each script's `remove_arg_zero` and the strings it puts on.
    let scripts = std::mem::take(&mut bprm.scripts);
    for level in &scripts {
        bprm.p += level.removed;
        for s in &level.pushed {
            copy_strings(oncpu, bprm, std::slice::from_ref(s))?;
        }
    }
    crate::binfmt_elf::load_elf_binary(oncpu, mm, bprm)
}
