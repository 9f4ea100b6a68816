//! The process a scenario `exec`s, driven natively by its server.
//!
//! The program never runs: it stays stopped at its first instruction, so
//! that its address space is the one `execve` built and nothing else. The
//! server (its tracer) makes the scenario's calls *as* that process:
//!
//! * a system call is injected: the registers saved, `rip` pointed at a
//!   `syscall` instruction in the process's own `[vdso]` with the call's
//!   number and arguments, one instruction single-stepped, the result read
//!   from `rax`, the registers restored. Fetching that instruction maps
//!   the vDSO page (4K of RssFile, and a page table where the vDSO's was
//!   empty), which the program had not done: an injected
//!   `madvise(MADV_DONTNEED)` of that page takes the mapping back, and
//!   (6.18's PT reclaim) the page table with it where it empties, so the
//!   figures are the call's own;
//! * a load or a store is `process_vm_readv`/`writev`: the kernel faults
//!   the page in for the process as its own access would (a write fault
//!   for a store, a read fault for a load, fault-around and the zero page
//!   alike). It cannot grow a stack (GUP never expands one): an access to
//!   a hole below a VMA that grows down is refused with ENOSYS rather than
//!   answered differently from the program's own; below any other VMA it
//!   is the program's SIGSEGV, EFAULT;
//! * `setrlimit` is `prlimit` on the process.
//!
//! `fork` and file mappings are not made for it (ENOSYS): the process has
//! no descriptor of the scenario's files, and a child would run nothing.
//!
//! The process is pinned to the server's CPU before it execs, so that the
//! calls and the faults the server makes for it use one CPU's LRU batches,
//! as a scenario process does.

use usermm::Errno;

/// x86-64 system call numbers the injected calls use.
mod nr {
    pub const MMAP: u64 = 9;
    pub const MPROTECT: u64 = 10;
    pub const MUNMAP: u64 = 11;
    pub const BRK: u64 = 12;
    pub const MREMAP: u64 = 25;
    pub const MADVISE: u64 = 28;
    pub const MLOCK2: u64 = 325;
    pub const MUNLOCK: u64 = 150;
    pub const MLOCKALL: u64 = 151;
    pub const MUNLOCKALL: u64 = 152;
}

/// An exec'd process stopped under this server's trace.
pub(super) struct Traced {
    pub pid: libc::pid_t,
    /// The address of a `syscall` instruction (bytes 0f 05) in its vDSO.
    syscall_at: u64,
}

impl Traced {
    /// Take over `pid`, stopped at its first instruction after `execve`.
    /// The vDSO is the kernel's one image, mapped into every process: the
    /// offset of a `syscall` in this server's copy is the offset in the
    /// program's (read here, since reading the program's would fault its
    /// page in).
    pub fn new(pid: libc::pid_t) -> Result<Traced, Errno> {
        let own = vdso_range("/proc/self/maps").ok_or(Errno::EIO)?;
        let theirs = vdso_range(&format!("/proc/{pid}/maps")).ok_or(Errno::EIO)?;
        if own.1 - own.0 != theirs.1 - theirs.0 {
            return Err(Errno::EIO);
        }
        // SAFETY: [own.0, own.1) is this process's vDSO, mapped readable
        // for the process's life (maps says so; nothing unmaps it).
        let image =
            unsafe { std::slice::from_raw_parts(own.0 as *const u8, (own.1 - own.0) as usize) };
        let off = image
            .windows(2)
            .position(|w| w == [0x0f, 0x05])
            .ok_or(Errno::EIO)?;
        Ok(Traced {
            pid,
            syscall_at: theirs.0 + off as u64,
        })
    }

    /// The system call `nr(args)` made by the process; its result, a
    /// negative errno on failure. Err: the process could not be driven.
    fn syscall(&self, nr: u64, args: [u64; 6]) -> Result<i64, String> {
        let r = self.inject(nr, args)?;
        let page = self.syscall_at & !4095;
        let undo = self.inject(
            nr::MADVISE,
            [page, 4096, libc::MADV_DONTNEED as u64, 0, 0, 0],
        )?;
        if undo != 0 {
            return Err(format!("cannot unmap the vDSO page again: errno {}", -undo));
        }
        Ok(r)
    }

    /// One injected system call, the registers as they were afterwards.
    fn inject(&self, nr: u64, args: [u64; 6]) -> Result<i64, String> {
        let saved = self.regs()?;
        let mut r = saved;
        r.rip = self.syscall_at;
        r.rax = nr;
        // No system call to restart when the stop is left.
        r.orig_rax = u64::MAX;
        [r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9] = args;
        self.set_regs(&r)?;
        // SAFETY: our traced child, stopped; it runs one instruction.
        if unsafe { libc::ptrace(libc::PTRACE_SINGLESTEP, self.pid, 0, 0) } != 0 {
            return Err(format!(
                "PTRACE_SINGLESTEP: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mut status = 0;
        // SAFETY: waiting for our own traced child's stop.
        let w = unsafe { libc::waitpid(self.pid, &mut status, libc::__WALL) };
        if w != self.pid || !libc::WIFSTOPPED(status) || libc::WSTOPSIG(status) != libc::SIGTRAP {
            return Err(format!(
                "the exec'd process did not stop after its call (status {status:#x})"
            ));
        }
        let after = self.regs()?;
        self.set_regs(&saved)?;
        Ok(after.rax as i64)
    }

    fn regs(&self) -> Result<libc::user_regs_struct, String> {
        // SAFETY: user_regs_struct is plain integers; all-zero is valid.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: our traced child, stopped; the kernel fills `r`.
        if unsafe { libc::ptrace(libc::PTRACE_GETREGS, self.pid, 0, &mut r as *mut _) } != 0 {
            return Err(format!(
                "PTRACE_GETREGS: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(r)
    }

    fn set_regs(&self, r: &libc::user_regs_struct) -> Result<(), String> {
        // SAFETY: our traced child, stopped; the kernel reads `r`.
        if unsafe { libc::ptrace(libc::PTRACE_SETREGS, self.pid, 0, r as *const _) } != 0 {
            return Err(format!(
                "PTRACE_SETREGS: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// A call whose result is 0 or a negative errno, as the server replies.
    fn rc(&self, nr: u64, args: [u64; 6]) -> String {
        match self.syscall(nr, args) {
            Ok(0) => "ok".into(),
            Ok(r) if r < 0 => format!("err {}", -r),
            Ok(r) => format!("err {} unexpected result {r}", Errno::EIO.0),
            Err(why) => format!("err {} {why}", Errno::EIO.0),
        }
    }

    /// A call returning an address, or a negative errno.
    fn addr(&self, nr: u64, args: [u64; 6]) -> String {
        match self.syscall(nr, args) {
            Ok(r) if (-4095..0).contains(&r) => format!("err {}", -r),
            Ok(r) => format!("ok {}", r as u64),
            Err(why) => format!("err {} {why}", Errno::EIO.0),
        }
    }

    /// The server's answer to one request, made for this process; `n(i)`
    /// is the request's i-th word as a number.
    pub fn serve(&self, words: &[&str], n: impl Fn(usize) -> u64, buf: &mut String) -> String {
        match words.first().copied() {
            Some("mmap") if words.get(7).is_none() => {
                let fd = u64::MAX; // -1: anonymous
                self.addr(nr::MMAP, [n(1), n(2), n(3), n(4), fd, n(5)])
            }
            Some("munmap") => self.rc(nr::MUNMAP, [n(1), n(2), 0, 0, 0, 0]),
            Some("mprotect") => self.rc(nr::MPROTECT, [n(1), n(2), n(3), 0, 0, 0]),
            Some("madvise") => self.rc(nr::MADVISE, [n(1), n(2), n(3), 0, 0, 0]),
            Some("mremap") => self.addr(nr::MREMAP, [n(1), n(2), n(3), n(4), n(5), 0]),
            Some("mlock2") => self.rc(nr::MLOCK2, [n(1), n(2), n(3), 0, 0, 0]),
            Some("munlock") => self.rc(nr::MUNLOCK, [n(1), n(2), 0, 0, 0, 0]),
            Some("mlockall") => self.rc(nr::MLOCKALL, [n(1), 0, 0, 0, 0, 0]),
            Some("munlockall") => self.rc(nr::MUNLOCKALL, [0; 6]),
            Some("brk") => match self.syscall(nr::BRK, [n(1), 0, 0, 0, 0, 0]) {
                Ok(r) => format!("ok {}", r as u64),
                Err(why) => format!("err {} {why}", Errno::EIO.0),
            },
            Some("setrlimit") => {
                let lim = libc::rlimit {
                    rlim_cur: n(2),
                    rlim_max: n(2),
                };
                // SAFETY: a valid rlimit, read by the call only; the old
                // limit is not asked for.
                let r = unsafe { libc::prlimit(self.pid, n(1) as _, &lim, std::ptr::null_mut()) };
                if r == 0 {
                    "ok".into()
                } else {
                    format!("err {}", super::errno_now().0)
                }
            }
            Some("store") => self.store(n(1), n(2), buf),
            Some("load") => self.load(n(1), buf),
            _ => format!("err {}", Errno::ENOSYS.0),
        }
    }

    /// `store ADDR VALUE`: the process's 8-byte store, as its write fault.
    fn store(&self, addr: u64, v: u64, buf: &mut String) -> String {
        if let Err(e) = self.access(addr, true, buf) {
            return format!("err {}", e.0);
        }
        let bytes = v.to_ne_bytes();
        let local = libc::iovec {
            iov_base: bytes.as_ptr() as *mut _,
            iov_len: 8,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut _,
            iov_len: 8,
        };
        // SAFETY: `local` is 8 readable bytes of ours; the kernel checks
        // the remote range against the process's mappings.
        let done = unsafe { libc::process_vm_writev(self.pid, &local, 1, &remote, 1, 0) };
        if done == 8 {
            "ok".into()
        } else {
            format!("err {}", Errno::EFAULT.0)
        }
    }

    /// `load ADDR`: the process's 8-byte load, as its read fault.
    fn load(&self, addr: u64, buf: &mut String) -> String {
        if let Err(e) = self.access(addr, false, buf) {
            return format!("err {}", e.0);
        }
        let mut bytes = [0u8; 8];
        let local = libc::iovec {
            iov_base: bytes.as_mut_ptr().cast(),
            iov_len: 8,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut _,
            iov_len: 8,
        };
        // SAFETY: `local` is 8 writable bytes of ours; the kernel checks
        // the remote range.
        let done = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        if done == 8 {
            format!("ok {}", u64::from_ne_bytes(bytes))
        } else {
            format!("err {}", Errno::EFAULT.0)
        }
    }

    /// Whether the MMU would let the process make the access, as far as
    /// its maps tell: EFAULT for its SIGSEGV, ENOSYS where only the access
    /// itself could say (a hole that a stack might grow into: the first
    /// VMA above it grows down, `gd` among its smaps VmFlags).
    fn access(&self, addr: u64, write: bool, buf: &mut String) -> Result<(), Errno> {
        match super::access_check(&format!("/proc/{}/maps", self.pid), addr, write, buf) {
            super::Access::Allowed => Ok(()),
            super::Access::Refused => Err(Errno::EFAULT),
            super::Access::Hole if self.grows_down_above(addr, buf) => Err(Errno::ENOSYS),
            super::Access::Hole => Err(Errno::EFAULT),
        }
    }

    /// Whether the first VMA above `addr` grows down.
    fn grows_down_above(&self, addr: u64, buf: &mut String) -> bool {
        let smaps = super::read_proc(&format!("/proc/{}/smaps", self.pid), buf);
        let mut above = false;
        for l in smaps.lines() {
            // A VMA's first line starts with its range; its last is VmFlags.
            let end = l.split_whitespace().next().and_then(|r| r.split_once('-'));
            if let Some(hi) = end.and_then(|(_, hi)| u64::from_str_radix(hi, 16).ok()) {
                above = hi > addr;
            } else if above && l.starts_with("VmFlags:") {
                return l.split_whitespace().any(|f| f == "gd");
            }
        }
        false
    }

    /// End the process: killed, and waited for.
    pub fn kill(&self) {
        super::kill_traced(self.pid);
    }
}

/// The `[vdso]` line's range in a maps file.
fn vdso_range(maps_path: &str) -> Option<(u64, u64)> {
    let maps = std::fs::read_to_string(maps_path).ok()?;
    let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
    let (lo, hi) = line.split_whitespace().next()?.split_once('-')?;
    Some((
        u64::from_str_radix(lo, 16).ok()?,
        u64::from_str_radix(hi, 16).ok()?,
    ))
}
