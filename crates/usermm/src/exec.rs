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
//! stack limit and its guard gap, if larger).
//!
//! The model's simplifications: only ELF programs (no `#!` scripts: a
//! file that is not ELF is ENOEXEC); a failure after the old mm would be
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

/// `struct linux_binprm`: the program being exec'd and the strings that
/// go on its stack.
pub struct LinuxBinprm {
    /// The path as exec was given it (what `AT_EXECFN` names).
    pub filename: String,
    pub argv: Vec<String>,
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

/// The program and its interpreter, opened and checked: everything that
/// can fail before the old address space is given up.
fn prepare_binprm(oncpu: &OnCpu, path: &str, argv: &[&str], envp: &[&str]) -> KResult<LinuxBinprm> {
    let (file, host) = open_exec(oncpu, path)?;
    let elf = ElfImage::parse(&host, Errno::ENOEXEC)?;
    let interp = match elf.interpreter(&host)? {
        Some(ipath) => {
            let (ifile, ihost) = open_exec(oncpu, &ipath)?;
            Some((ElfImage::parse(&ihost, Errno::ELIBBAD)?, ifile))
        }
        None => None,
    };
    // With no arguments at all, the kernel passes one empty one (5.18+).
    let mut argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    if argv.is_empty() {
        argv.push(String::new());
    }
    Ok(LinuxBinprm {
        filename: path.to_string(),
        argv,
        envp: envp.iter().map(|s| s.to_string()).collect(),
        file,
        elf,
        interp,
        p: 0,
        exec: 0,
        argmin: 0,
    })
}

/// `mmap_base` with randomisation off (arch/x86/mm/mmap.c): the stack's
/// limit and its guard gap below the top, kept between 128 MiB and five
/// sixths of the window.
pub fn mmap_base(stack_limit: u64) -> u64 {
    let gap = stack_limit.saturating_add(STACK_GUARD_GAP);
    let gap = gap.clamp(128 << 20, TASK_SIZE / 6 * 5);
    (TASK_SIZE - gap) & PAGE_MASK
}

/// `bprm_mm_init`: the new mm's one VMA, a page of stack at the top
/// (accounted, as `insert_vm_struct` charges a `VM_ACCOUNT` VMA), and the
/// strings' limits (`bprm_stack_limits`).
fn bprm_mm_init(oncpu: &OnCpu, mm: &Arc<Mm>, bprm: &mut LinuxBinprm) -> KResult<()> {
    let flags = VM_GROWSDOWN | VM_DATA_DEFAULT_FLAGS | VM_ACCOUNT;
    let start = STACK_TOP - PAGE_SIZE;
    let vma = Vma::new(mm.id, start, STACK_TOP, flags, start >> PAGE_SHIFT);
    crate::mmap::insert_vm_struct(oncpu, mm, vma)?;
    bprm.p = STACK_TOP - 8;
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
    let mut p = bprm.p & !0xf;
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
) -> KResult<Arc<Mm>> {
    let old = oncpu.mm()?;
    let mut bprm = prepare_binprm(oncpu, path, argv, envp)?;
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
        mm.set_layout(&g, |l| l.mmap_base = mmap_base(mm.stack_limit()));
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
    let argv = bprm.argv.clone();
    copy_strings(oncpu, bprm, &argv)?;
    crate::binfmt_elf::load_elf_binary(oncpu, mm, bprm)
}
