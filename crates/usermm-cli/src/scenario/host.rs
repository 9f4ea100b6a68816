//! Scenarios on the host kernel, through libc.
//!
//! Every scenario process is a real process: a *server* that reads one
//! request a line from a FIFO and answers on another. This process only
//! coordinates. `fork` asks the current server to fork(2): the child is a
//! copy-on-write copy of it, as the scenario means, and serves on a new pair
//! of FIFOs. Loads and stores are made by the server on its own memory,
//! after checking /proc/self/maps as the MMU would (no VMA, or no
//! permission, is EFAULT rather than a SIGSEGV). Figures come from the
//! server's /proc/self/status and smaps_rollup. `exec` makes the server
//! the tracer of a child that execs the program and stays stopped at its
//! first instruction; the server then makes the scenario's calls as that
//! process ([`traced`]), and the figures are its.
//!
//! THP knobs are set only when this process can write them (root), are
//! restored when the run ends (by a guardian process when the run is
//! killed: see [`crate::knob_guard`]), and a lock file serialises runs
//! that might change them; when they cannot be set the scenario is
//! reported skipped.
//!
//! No server outlives this process, nor keeps what is its own:
//! * the first server closes its copy of the lock file and points its
//!   standard streams at /dev/null as soon as it is forked, so that a run
//!   that dies frees the lock for the next, and whoever reads this
//!   process's output sees it end (the servers of `fork` inherit that);
//! * the servers form a process group of their own, which gets SIGIO, and
//!   dies of it, when this process's end of a *lifeline* pipe closes: when
//!   this process exits or is killed, even in the middle of a request (the
//!   first server exits at once if this process died before it set that
//!   up);
//! * a server gives up after [`CONNECT_TIMEOUT_S`] if this process never
//!   opens its FIFOs.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::PathBuf;

use usermm::Errno;

use super::parse::{MlockCall, Rlimit};
use super::Backend;

mod traced;

const THP: &str = "/sys/kernel/mm/transparent_hugepage";

/// The start of a run's FIFO folder's name, which goes on with the run's
/// process id.
const SCENARIO_DIR_PREFIX: &str = "usermm-scenario-";

/// Remove the FIFO folders (and tmpfs folders) of runs that were killed
/// (their process is gone): a run removes its own as it ends, which a
/// killed one cannot. Called under the runs' lock, so no live run is
/// setting one up.
fn remove_stale_dirs() {
    let dirs = [std::env::temp_dir(), PathBuf::from("/dev/shm")];
    for e in dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|rd| rd.flatten())
    {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCENARIO_DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0 && errno_now().0 == libc::ESRCH;
        if gone {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// How long a new server waits for this process to open its FIFOs.
const CONNECT_TIMEOUT_S: u32 = 10;

struct Server {
    to: File,
    from: BufReader<File>,
    pid: i32,
    /// A thread of the server `pid` (`thread`), not a process of its own.
    thread: bool,
    /// A vfork child, whose parent waits for it (until it execs).
    vforked: bool,
}

pub struct HostBackend {
    dir: PathBuf,
    /// The scenario's files by name: the path, and whether its descriptor
    /// is open for writing (the scenario's own files) or not (host files).
    files: HashMap<String, (PathBuf, bool)>,
    /// The scenario's memfds, open here; servers reach each through
    /// `/proc/<this process>/fd/<fd>`.
    memfds: Vec<File>,
    /// The folder on tmpfs of the scenario's tmpfs files, made at the
    /// first (removed with the run's folder).
    shm_dir: Option<PathBuf>,
    procs: HashMap<String, Server>,
    cur: String,
    fifo_seq: usize,
    saved_knobs: Vec<(String, String)>,
    /// The host's reserve from before the first knob changed.
    min_free_kbytes: Option<crate::native::MinFreeKbytes>,
    _lock: File,
    /// The write end of the lifeline pipe: dropped last, when every server
    /// has exited; its close sends the servers' group SIGIO.
    _lifeline: File,
}

/// `move_pages(2)` on this process for the pages of `[start, start+len)`:
/// to `node`, or (node -1) only where they are. The reply is `ok N
/// STATUS...` or `err ERRNO`.
fn move_pages_here(start: u64, len: u64, node: i32) -> String {
    let pages: Vec<*mut libc::c_void> = (0..len.div_ceil(4096))
        .map(|i| (start + i * 4096) as *mut libc::c_void)
        .collect();
    let nodes = vec![node; pages.len()];
    let mut status = vec![0i32; pages.len()];
    const MPOL_MF_MOVE: libc::c_int = 1 << 1;
    // SAFETY: move_pages on this process (pid 0) with arrays of
    // `pages.len()` entries each, alive for the call; the kernel checks
    // the addresses.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            pages.len() as libc::c_ulong,
            pages.as_ptr(),
            if node < 0 {
                std::ptr::null()
            } else {
                nodes.as_ptr()
            },
            status.as_mut_ptr(),
            MPOL_MF_MOVE,
        )
    };
    if r < 0 {
        return format!("err {}", errno_now().0);
    }
    let s: Vec<String> = status.iter().map(|s| s.to_string()).collect();
    format!("ok {r} {}", s.join(" "))
}

/// How many CPUs or nodes a list such as `0-1,4` names.
fn count_cpulist(s: &str) -> usize {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap_or(0) + 1 - a.parse::<usize>().unwrap_or(0),
            None => 1,
        })
        .sum()
}

fn errno_now() -> Errno {
    Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

fn mkfifo(path: &std::path::Path) -> anyhow::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        anyhow::bail!(
            "mkfifo {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

impl HostBackend {
    /// Have the current server write `size` bytes of `seed`'s pattern to
    /// `path` (made or emptied first when `create`), in `chunk`-byte
    /// writes, then fsync it.
    fn write_file_in_server(
        &mut self,
        path: &std::path::Path,
        size: u64,
        seed: Option<u64>,
        chunk: u64,
        create: bool,
    ) -> Result<(), Errno> {
        let seed = seed.map_or("-".to_string(), |s| s.to_string());
        self.call_errno(&format!(
            "write_file {size} {seed} {chunk} {} {}",
            u8::from(create),
            path.display()
        ))
        .map(|_| ())
    }

    /// The run's folder on tmpfs, for its tmpfs files.
    fn shm_dir(&mut self) -> Result<PathBuf, String> {
        if let Some(d) = &self.shm_dir {
            return Ok(d.clone());
        }
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        let d = PathBuf::from("/dev/shm").join(name);
        std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        self.shm_dir = Some(d.clone());
        Ok(d)
    }

    pub fn new() -> anyhow::Result<HostBackend> {
        let lock_path = std::env::temp_dir().join("usermm-native-scenarios.lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)?;
        // SAFETY: flock on an fd we own.
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        remove_stale_dirs();
        let dir = std::env::temp_dir().join(format!(
            "{SCENARIO_DIR_PREFIX}{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&dir)?;
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors, which the Files own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            anyhow::bail!("pipe: {}", std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just made, owned by nothing else.
        let (life_r, life_w) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        let mut b = HostBackend {
            dir,
            files: HashMap::new(),
            memfds: Vec::new(),
            shm_dir: None,
            procs: HashMap::new(),
            cur: "main".into(),
            fifo_seq: 0,
            saved_knobs: vec![],
            min_free_kbytes: None,
            _lock: lock,
            _lifeline: life_w,
        };
        b.hold_khugepaged_asleep();
        let (inp, out) = b.fifos()?;
        // SAFETY: getpid has no preconditions.
        let caller = unsafe { libc::getpid() };
        // SAFETY: this process is single-threaded here (the command runs one
        // scenario); the child only runs the server loop and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            server_detach(&b, life_r.as_raw_fd(), caller);
            serve_at(&inp, &out);
        }
        drop(life_r);
        anyhow::ensure!(
            pid > 0,
            "fork of the scenario's process: {}",
            std::io::Error::last_os_error()
        );
        let s = b.connect(&inp, &out, pid)?;
        b.procs.insert("main".into(), s);
        Ok(b)
    }

    /// A new server that the current one makes (`VERB IN OUT`: `fork`,
    /// `vfork` or `thread`), serving on FIFOs of its own, named `name`.
    /// The host running out of file descriptors (for the FIFOs), of
    /// processes, or of the server's prewritten stacks (EAGAIN) is no
    /// answer of the mm: it fails the statement with what ran out, and
    /// the half-made server, if any, is killed and reaped
    /// ([`HostBackend::connect`]).
    fn spawn(&mut self, verb: &str, name: &str) -> Result<Result<(), Errno>, String> {
        let (i, o) = self
            .fifos()
            .map_err(|e| format!("cannot make the FIFOs of {name:?} on the host: {e:#}"))?;
        let here = self.procs.get(&self.cur).ok_or("no current process")?.pid;
        let pid = match self.call_errno(&format!("{verb} {} {}", i.display(), o.display())) {
            // A thread's pid is its process's.
            Ok(_) if verb == "thread" => here,
            Ok(pid) => pid as i32,
            Err(Errno::EAGAIN) => {
                return Err(format!(
                    "the host refused to {verb} {name:?}: EAGAIN (out of processes, or of \
                     the four stacks a server writes for its threads and vfork children)"
                ))
            }
            Err(e) => return Ok(Err(e)),
        };
        let mut s = self.connect(&i, &o, pid).map_err(|e| format!("{e:#}"))?;
        s.thread = verb == "thread";
        s.vforked = verb == "vfork";
        self.procs.insert(name.to_string(), s);
        Ok(Ok(()))
    }

    fn fifos(&mut self) -> anyhow::Result<(PathBuf, PathBuf)> {
        self.fifo_seq += 1;
        let i = self.dir.join(format!("{}.in", self.fifo_seq));
        let o = self.dir.join(format!("{}.out", self.fifo_seq));
        mkfifo(&i)?;
        mkfifo(&o)?;
        Ok((i, o))
    }

    /// Open the FIFOs of the new server `pid`. On failure (out of file
    /// descriptors, or the server died before it opened its end) the
    /// server is killed and reaped: nothing is left.
    fn connect(&self, inp: &PathBuf, out: &PathBuf, pid: i32) -> anyhow::Result<Server> {
        let open = || -> std::io::Result<Server> {
            let to = open_fifo_writer(inp, pid)?;
            // The server opens this one right after the other.
            let from = BufReader::new(File::open(out)?);
            Ok(Server {
                to,
                from,
                pid,
                thread: false,
                vforked: false,
            })
        };
        open().map_err(|e| {
            // SAFETY: signalling a server this process made, and reaping it
            // if it is this process's child (a server's children are reaped
            // by the kernel: servers ignore SIGCHLD).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                if libc::waitpid(pid, std::ptr::null_mut(), 0) != pid {
                    let _ = wait_gone(pid);
                }
            }
            anyhow::anyhow!("connecting to the scenario's process {pid}: {e}")
        })
    }

    fn call(&mut self, req: &str) -> Result<String, String> {
        let s = self.procs.get_mut(&self.cur).ok_or("no current process")?;
        writeln!(s.to, "{req}").map_err(|e| format!("server: {e}"))?;
        let mut line = String::new();
        s.from
            .read_line(&mut line)
            .map_err(|e| format!("server: {e}"))?;
        if line.is_empty() {
            return Err("server died".into());
        }
        Ok(line.trim_end().to_string())
    }

    fn call_errno(&mut self, req: &str) -> Result<u64, Errno> {
        let r = self.call(req).map_err(|_| Errno::EIO)?;
        let mut w = r.split_whitespace();
        match (w.next(), w.next()) {
            (Some("ok"), v) => Ok(v.and_then(|v| v.parse().ok()).unwrap_or(0)),
            (Some("err"), Some(e)) => Err(Errno(e.parse().unwrap_or(0))),
            _ => Err(Errno::EIO),
        }
    }

    fn set_knob_file(&mut self, path: String, mode: &str) -> Result<(), String> {
        let cur = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        let old = cur
            .split('[')
            .nth(1)
            .and_then(|s| s.split(']').next())
            .ok_or(format!("{path}: unreadable"))?
            .to_string();
        // Remembered first, so that a run killed just after the write
        // still has it put back.
        self.remember(path.clone(), old);
        std::fs::write(&path, mode).map_err(|e| format!("cannot set {path}: {e}"))?;
        Ok(())
    }

    /// khugepaged, once a scenario has enabled PMD-sized THPs, scans every
    /// `scan_sleep_millisecs` (10 s): each scan drains every CPU's LRU and
    /// mlock batches (`lru_add_drain_all`) and may collapse a server's
    /// small folios into a THP, at moments no scenario can foresee (usermm
    /// runs no khugepaged). Held asleep for the run (where the knob can be
    /// set); the write wakes it for one scan now, before the server starts,
    /// which the short wait lets finish. It still wakes at once when it
    /// starts (PMD THPs enabled again) or when an mm joins its empty list:
    /// [`khugepaged_decoy`] keeps those scans away from the servers.
    fn hold_khugepaged_asleep(&mut self) {
        khugepaged_decoy();
        const ASLEEP_MS: &str = "3600000";
        let path = format!("{THP}/khugepaged/scan_sleep_millisecs");
        let Ok(old) = std::fs::read_to_string(&path) else {
            return;
        };
        let old = old.trim().to_string();
        if old == ASLEEP_MS {
            return;
        }
        self.remember(path.clone(), old);
        if std::fs::write(&path, ASLEEP_MS).is_ok() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Keep a setting's value from before the run's first change to it; the
    /// settings are restored in reverse order when the run ends.
    fn remember(&mut self, path: String, old: String) {
        if !self.saved_knobs.iter().any(|(p, _)| p == &path) {
            self.min_free_kbytes
                .get_or_insert_with(crate::native::MinFreeKbytes::read);
            crate::knob_guard::changing(&path, &old);
            self.saved_knobs.push((path, old));
        }
    }
}

/// Register, once for this process, an mm with khugepaged ahead of every
/// server, whose scans it then absorbs. khugepaged scans the mms on its
/// list in order, `pages_to_scan` (4096) a pass, each PMD-sized range of an
/// eligible VMA costing 512 whether or not anything is mapped there
/// (`khugepaged_scan_mm_slot`), and stays on one mm until it has scanned
/// all of it. A 64 GiB eligible reservation that is never touched lasts
/// 4096 passes, far more than a test run's knob flips wake; and with an mm
/// on its list, a server that joins it does not wake it
/// (`__khugepaged_enter` wakes only an empty list). The reservation is
/// MADV_DONTFORK, so servers forked from this process do not inherit it
/// (they join the list behind it, by `khugepaged_fork`). It joins the list
/// only while PMD-sized THPs are enabled (`khugepaged_enter_vma`), so this
/// is called again after each knob a scenario sets, until it has joined (a
/// server cannot join before PMD THPs are enabled either); it needs an
/// `anon_vma` too (`__thp_vma_allowable_orders` refuses khugepaged a VMA
/// without one), so the last byte is written and its PMD-sized range
/// emptied again first: nothing stays there to collapse, and khugepaged
/// would reach that range last.
fn khugepaged_decoy() {
    const LEN: usize = 64 << 30;
    /// The reservation's address (0: not made yet, or it could not be),
    /// and whether it has joined khugepaged's list.
    static DECOY: std::sync::Mutex<(usize, bool)> = std::sync::Mutex::new((0, false));
    let mut decoy = DECOY.lock().unwrap_or_else(|e| e.into_inner());
    if decoy.1 || !pmd_thp_enabled() {
        return;
    }
    if decoy.0 == 0 {
        // SAFETY: a fresh anonymous mapping at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return;
        }
        let end = p as usize + LEN;
        let last_pmd = (end - 1) & !((2 << 20) - 1);
        // SAFETY: the mapping just made, which is this function's own
        // (leaked for the process's life on purpose): a write to its last
        // byte, then advice on ranges inside it.
        let made = unsafe {
            ((end - 1) as *mut u8).write_volatile(1);
            libc::madvise(
                last_pmd as *mut libc::c_void,
                end - last_pmd,
                libc::MADV_DONTNEED,
            ) == 0
                && libc::madvise(p, LEN, libc::MADV_DONTFORK) == 0
        };
        if !made {
            return;
        }
        decoy.0 = p as usize;
    }
    // SAFETY: advice on the reservation made above, this function's own.
    decoy.1 = unsafe { libc::madvise(decoy.0 as *mut libc::c_void, LEN, libc::MADV_HUGEPAGE) } == 0;
}

/// `hugepage_pmd_enabled` for anonymous memory, as the knobs say now.
fn pmd_thp_enabled() -> bool {
    let read = |p: String| std::fs::read_to_string(p).unwrap_or_default();
    let pmd = read(format!("{THP}/hugepages-2048kB/enabled"));
    let on = |s: &str| s.contains("[always]") || s.contains("[madvise]");
    on(&pmd) || (pmd.contains("[inherit]") && on(&read(format!("{THP}/enabled"))))
}

impl Backend for HostBackend {
    fn mmap(
        &mut self,
        addr: u64,
        len: u64,
        prot: u32,
        flags: u32,
        file: Option<&str>,
        off: u64,
    ) -> Result<u64, Errno> {
        let Some(name) = file else {
            return self.call_errno(&format!("mmap {addr} {len} {prot} {flags}"));
        };
        let (path, writable) = self.files.get(name).cloned().ok_or(Errno::EBADF)?;
        // The server opens the file as the scenario's descriptor is open
        // (read-write for its own files, read-only for host files), maps
        // it and closes the descriptor; the mapping keeps the file.
        self.call_errno(&format!(
            "mmap {addr} {len} {prot} {flags} {off} {} {}",
            u8::from(writable),
            path.display()
        ))
    }
    fn create_file(
        &mut self,
        name: &str,
        size: u64,
        seed: Option<u64>,
        fs: &str,
        chunk: u64,
    ) -> Result<Result<(), Errno>, String> {
        if fs == "tmpfs" {
            shmem_knobs_as_model(&self.saved_knobs)?;
        }
        let dir = if fs == "tmpfs" {
            self.shm_dir()?
        } else {
            self.dir.clone()
        };
        let dir = &dir;
        let have = fs_type_of(dir)?;
        if have != fs {
            return Err(format!(
                "needs a file on {fs}; the scenario's folder {} is on {have}",
                dir.display()
            ));
        }
        let path = dir.join(format!("file-{name}"));
        // The current process writes it (its page cache then sits in that
        // process's CPU's LRU batch, as the model's does).
        let r = self.write_file_in_server(&path, size, seed, chunk, true);
        if r.is_ok() {
            self.files.insert(name.to_string(), (path, true));
        }
        Ok(r)
    }
    fn memfd(
        &mut self,
        name: &str,
        size: u64,
        seed: Option<u64>,
    ) -> Result<Result<(), Errno>, String> {
        shmem_knobs_as_model(&self.saved_knobs)?;
        let cname = std::ffi::CString::new(format!("usermm-{name}")).map_err(|e| e.to_string())?;
        // SAFETY: memfd_create with a NUL-terminated name; the descriptor
        // is owned by the File made of it below.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), 0) };
        if fd < 0 {
            return Ok(Err(errno_now()));
        }
        // SAFETY: `fd` is a new descriptor of ours, owned from here on.
        let f = unsafe { File::from_raw_fd(fd) };
        if let Err(e) = f.set_len(size) {
            return Ok(Err(Errno(e.raw_os_error().unwrap_or(Errno::EIO.0))));
        }
        let path = PathBuf::from(format!("/proc/{}/fd/{fd}", std::process::id()));
        self.memfds.push(f);
        if seed.is_some() {
            // Written by the current process, as `file` is.
            if let Err(e) = self.write_file_in_server(&path, size, seed, size.max(1), false) {
                return Ok(Err(e));
            }
        }
        self.files.insert(name.to_string(), (path, true));
        Ok(Ok(()))
    }
    fn open_file(&mut self, name: &str, path: &str) -> Result<(), Errno> {
        let p = PathBuf::from(path);
        std::fs::File::open(&p).map_err(|e| Errno(e.raw_os_error().unwrap_or(Errno::EIO.0)))?;
        self.files.insert(name.to_string(), (p, false));
        Ok(())
    }
    fn truncate(&mut self, name: &str, size: u64) -> Result<(), Errno> {
        let (path, writable) = self.files.get(name).cloned().ok_or(Errno::EBADF)?;
        // Made by the current process, on its CPU, as in usermm: a
        // truncation drains the CPU's LRU and mlock batches.
        self.call_errno(&format!(
            "truncate {size} {} {}",
            u8::from(writable),
            path.display()
        ))
        .map(|_| ())
    }
    fn msync(&mut self, addr: u64, len: u64, flags: u32) -> Result<(), Errno> {
        self.call_errno(&format!("msync {addr} {len} {flags}"))
            .map(|_| ())
    }
    fn munmap(&mut self, addr: u64, len: u64) -> Result<(), Errno> {
        self.call_errno(&format!("munmap {addr} {len}")).map(|_| ())
    }
    fn mremap(
        &mut self,
        addr: u64,
        old_len: u64,
        new_len: u64,
        flags: u32,
        new_addr: u64,
    ) -> Result<u64, Errno> {
        self.call_errno(&format!(
            "mremap {addr} {old_len} {new_len} {flags} {new_addr}"
        ))
    }
    fn mprotect(&mut self, addr: u64, len: u64, prot: u32) -> Result<(), Errno> {
        self.call_errno(&format!("mprotect {addr} {len} {prot}"))
            .map(|_| ())
    }
    fn madvise(&mut self, addr: u64, len: u64, advice: i32) -> Result<(), Errno> {
        self.call_errno(&format!("madvise {addr} {len} {advice}"))
            .map(|_| ())
    }
    fn mlock(&mut self, call: &MlockCall<u64>) -> Result<(), Errno> {
        let req = match *call {
            MlockCall::Mlock { addr, len, flags } => format!("mlock2 {addr} {len} {flags}"),
            MlockCall::Munlock { addr, len } => format!("munlock {addr} {len}"),
            MlockCall::Mlockall { flags } => format!("mlockall {flags}"),
            MlockCall::Munlockall => "munlockall".to_string(),
        };
        self.call_errno(&req).map(|_| ())
    }
    fn mincore(&mut self, addr: u64, len: u64) -> Result<Vec<u8>, Errno> {
        let r = self
            .call(&format!("mincore {addr} {len}"))
            .map_err(|_| Errno::EIO)?;
        let mut w = r.split_whitespace();
        match (w.next(), w.next()) {
            (Some("ok"), bits) => Ok(bits.unwrap_or("").bytes().map(|b| b - b'0').collect()),
            (Some("err"), Some(e)) => Err(Errno(e.parse().unwrap_or(0))),
            _ => Err(Errno::EIO),
        }
    }
    fn setrlimit(&mut self, resource: Rlimit, bytes: u64) -> Result<(), Errno> {
        let r = match resource {
            Rlimit::Memlock => libc::RLIMIT_MEMLOCK,
            Rlimit::Stack => libc::RLIMIT_STACK,
        };
        self.call_errno(&format!("setrlimit {r} {bytes}"))
            .map(|_| ())
    }
    fn capdrop_ipc_lock(&mut self) -> Result<(), Errno> {
        self.call_errno("capdrop_ipc_lock").map(|_| ())
    }
    fn store(&mut self, addr: u64, v: u64) -> Result<(), Errno> {
        self.call_errno(&format!("store {addr} {v}")).map(|_| ())
    }
    fn load(&mut self, addr: u64) -> Result<u64, Errno> {
        self.call_errno(&format!("load {addr}"))
    }
    fn fork(&mut self, child: &str) -> Result<Result<(), Errno>, String> {
        self.spawn("fork", child)
    }
    fn exec(
        &mut self,
        path: &str,
        argv: &[String],
        rnd: Option<usermm::exec::ExecRandom>,
    ) -> Result<Result<(), Errno>, String> {
        if argv.iter().any(|a| a.contains(char::is_whitespace)) {
            return Err("natively an argument may not hold spaces".into());
        }
        // With randomisation on, the host draws its own numbers.
        let verb = if rnd.is_some() { "exec_aslr" } else { "exec" };
        let r = self.call_errno(&format!("{verb} {path} {}", argv[1..].join(" ")));
        if r.is_ok() {
            if let Some(s) = self.procs.get_mut(&self.cur) {
                s.vforked = false;
            }
        }
        Ok(r.map(|_| ()))
    }
    fn brk(&mut self, brk: u64) -> Result<u64, String> {
        let r = self.call(&format!("brk {brk}"))?;
        match r.split_once(' ') {
            Some(("ok", v)) => v.parse().map_err(|_| format!("brk: {r}")),
            _ if r == format!("err {}", Errno::ENOSYS.0) => Err(super::NO_HEAP.into()),
            _ => Err(format!("brk: {r}")),
        }
    }
    fn maps(&mut self) -> Result<Vec<String>, String> {
        let r = self.call("maps")?;
        let body = r
            .strip_prefix("ok ")
            .or(r.strip_prefix("ok"))
            .ok_or(format!("maps: {r}"))?;
        Ok(body.split('\u{1f}').map(String::from).collect())
    }
    /// A vfork child of the current server: it answers the request
    /// itself, and serves on FIFOs of its own.
    fn vfork(&mut self, child: &str) -> Result<Result<(), Errno>, String> {
        self.spawn("vfork", child)
    }
    /// A thread of the current server: it serves on FIFOs of its own.
    fn thread(&mut self, name: &str) -> Result<Result<(), Errno>, String> {
        self.spawn("thread", name)
    }
    fn switch(&mut self, name: &str) -> Result<(), String> {
        if !self.procs.contains_key(name) {
            return Err(format!("no process {name:?}"));
        }
        self.cur = name.to_string();
        Ok(())
    }
    fn exit_thread(&mut self, name: &str) -> Result<(), String> {
        let prev = std::mem::replace(&mut self.cur, name.to_string());
        let r = self.call("exit");
        self.procs.remove(name);
        self.cur = prev;
        r.map(|_| ())
    }
    fn exit(&mut self, name: &str) -> Result<(), String> {
        let prev = std::mem::replace(&mut self.cur, name.to_string());
        let _ = self.call("exit");
        let s = self.procs.remove(name);
        self.cur = if prev == name {
            self.procs.keys().min().cloned().unwrap_or_default()
        } else {
            prev
        };
        if let Some(s) = s {
            if name == "main" {
                let mut st = 0;
                // SAFETY: reaping our own child.
                unsafe { libc::waitpid(s.pid, &mut st, 0) };
            } else {
                wait_gone(s.pid)?;
            }
        }
        Ok(())
    }
    fn figures(&mut self) -> Result<[i64; super::parse::NR_FIGURES], String> {
        let r = self.call("figures")?;
        let v: Vec<i64> = r
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        v.try_into().map_err(|_| format!("bad figures reply {r:?}"))
    }
    /// Read from `/proc/vmstat`, or from the mTHP size's `stats` folder,
    /// by this process (the counters are system-wide).
    fn vmstat(&mut self, name: &str) -> Result<i64, String> {
        let text = match name.split_once('/') {
            Some((size, stat)) => std::fs::read_to_string(format!("{THP}/{size}/stats/{stat}"))
                .map_err(|e| format!("{THP}/{size}/stats/{stat}: {e}"))?,
            None => {
                // A node or zone statistic keeps per-CPU differences below
                // a threshold out of /proc/vmstat until they are folded;
                // fold them all first (root only; an event counter is
                // summed over the CPUs when read).
                if name.starts_with("nr_") {
                    let _ = std::fs::write("/proc/sys/vm/stat_refresh", "1");
                }
                let all = std::fs::read_to_string("/proc/vmstat")
                    .map_err(|e| format!("/proc/vmstat: {e}"))?;
                all.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ').map(str::to_string))
                    .ok_or_else(|| format!("the host kernel has no vmstat counter {name}"))?
            }
        };
        text.trim()
            .parse()
            .map_err(|_| format!("{name}: not a number: {text:?}"))
    }
    fn knob(&mut self, size_kb: Option<u64>, mode: &str) -> Result<(), String> {
        let path = match size_kb {
            None => format!("{THP}/enabled"),
            Some(kb) => format!("{THP}/hugepages-{kb}kB/enabled"),
        };
        self.set_knob_file(path, mode)?;
        khugepaged_decoy();
        Ok(())
    }
    /// The host kernel runs one algorithm of each tunable: its own value
    /// is a no-op, any other cannot be had here.
    fn tunable(&mut self, name: &str, value: &str) -> Result<(), String> {
        let (_, info) = usermm::tunable::Tunables::info(name).expect("checked when parsed");
        if value == info.default_name() {
            Ok(())
        } else {
            Err(format!(
                "tunable {name} {value}: the host kernel's {name} is {}",
                info.default_name()
            ))
        }
    }

    fn knob_shmem(&mut self, size_kb: Option<u64>, mode: &str) -> Result<(), String> {
        let path = match size_kb {
            None => format!("{THP}/shmem_enabled"),
            Some(kb) => format!("{THP}/hugepages-{kb}kB/shmem_enabled"),
        };
        self.set_knob_file(path, mode)?;
        khugepaged_decoy();
        Ok(())
    }
    fn knob_use_zero_page(&mut self, on: bool) -> Result<(), String> {
        let path = format!("{THP}/use_zero_page");
        let old = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        std::fs::write(&path, if on { "1" } else { "0" })
            .map_err(|e| format!("cannot set {path}: {e}"))?;
        self.remember(path, old.trim().to_string());
        Ok(())
    }
    fn sysctl(&mut self, name: &str, value: u64) -> Result<Result<(), Errno>, String> {
        let read = |p: &str| std::fs::read_to_string(p).map(|v| v.trim().to_string());
        let path = format!("/proc/sys/vm/{name}");
        let old = read(&path).map_err(|e| format!("{path}: {e}"))?;
        // overcommit_ratio and overcommit_kbytes zero each other when
        // written: keep the other's value from before this write too, so
        // that restoring both in reverse order puts back the one that was
        // set (a zero would clear its partner again, so it is not kept).
        let partner = match name {
            "overcommit_ratio" => Some("overcommit_kbytes"),
            "overcommit_kbytes" => Some("overcommit_ratio"),
            _ => None,
        }
        .map(|other| format!("/proc/sys/vm/{other}"))
        .and_then(|p| read(&p).ok().filter(|v| v != "0").map(|v| (p, v)));
        match std::fs::write(&path, value.to_string()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(Err(Errno::EINVAL)),
            Err(e) => return Err(format!("cannot set {path}: {e}")),
        }
        if let Some((p, v)) = partner {
            self.remember(p, v);
        }
        self.remember(path, old);
        Ok(Ok(()))
    }
    fn machine(&self) -> String {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string();
        format!("this host, Linux {release}")
    }
    fn move_pages(
        &mut self,
        start: u64,
        len: u64,
        node: Option<i32>,
    ) -> Result<(usize, Vec<i32>), Errno> {
        let r = self
            .call(&format!("move_pages {start} {len} {}", node.unwrap_or(-1)))
            .map_err(|_| Errno::EIO)?;
        let mut w = r.split_whitespace();
        match w.next() {
            Some("ok") => {
                let n = w.next().and_then(|v| v.parse().ok()).ok_or(Errno::EIO)?;
                let status = w.map(|v| v.parse().unwrap_or(i32::MIN)).collect();
                Ok((n, status))
            }
            Some("err") => Err(Errno(w.next().and_then(|e| e.parse().ok()).unwrap_or(0))),
            _ => Err(Errno::EIO),
        }
    }
    fn mbind(
        &mut self,
        start: u64,
        len: u64,
        mode: i32,
        nodes: u64,
        flags: u32,
    ) -> Result<(), Errno> {
        self.call_errno(&format!("mbind {start} {len} {mode} {nodes} {flags}"))
            .map(|_| ())
    }
    fn demotion(&mut self, on: bool) -> Result<(), String> {
        let path = "/sys/kernel/mm/numa/demotion_enabled".to_string();
        let old = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        std::fs::write(&path, if on { "true" } else { "false" })
            .map_err(|e| format!("cannot set {path}: {e}"))?;
        self.remember(path, old.trim().to_string());
        Ok(())
    }
    fn numa_balancing(&mut self, mode: u8) -> Result<(), String> {
        let path = "/proc/sys/kernel/numa_balancing".to_string();
        let old = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        std::fs::write(&path, mode.to_string()).map_err(|e| format!("cannot set {path}: {e}"))?;
        self.remember(path, old.trim().to_string());
        // The second thread the scan needs (see `start_numa_helper_thread`),
        // now rather than at the first wait, so that the figures between a
        // mark and an expect do not take in its stack.
        if mode != 0 {
            let r = self.call("numa_helper")?;
            if r != "ok" {
                return Err(format!("the scenario's process: {r}"));
            }
        }
        Ok(())
    }
    fn read_faults(&mut self, addr: u64, len: u64, every: u64) -> Result<u64, Errno> {
        self.call_errno(&format!("read_faults {addr} {len} {every}"))
    }
    fn await_numa_hint(&mut self, addr: u64) -> Result<(), Errno> {
        self.call_errno(&format!("await_numa_hint {addr}"))
            .map(|_| ())
    }
    fn nr_nodes(&mut self) -> usize {
        // Nodes with memory, as /sys lists them (N_MEMORY).
        std::fs::read_to_string("/sys/devices/system/node/has_memory")
            .ok()
            .map_or(1, |s| count_cpulist(s.trim()))
    }
    fn dump(&mut self) -> String {
        self.call("dump")
            .map(|s| s.trim_start_matches("ok ").replace('\u{1f}', "\n"))
            .unwrap_or_else(|e| e)
    }
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        // The threads first (a process's exit ends them, and waits until
        // it is gone), then the vfork children (their parents wait for
        // them), then the other processes.
        let mut names: Vec<(u8, String)> = self
            .procs
            .iter()
            .map(|(n, s)| {
                (
                    if s.thread {
                        0
                    } else if s.vforked {
                        1
                    } else {
                        2
                    },
                    n.clone(),
                )
            })
            .collect();
        names.sort();
        for (kind, n) in names {
            let _ = if kind == 0 {
                self.exit_thread(&n)
            } else {
                self.exit(&n)
            };
        }
        for (p, v) in self.saved_knobs.drain(..).rev() {
            if std::fs::write(&p, v).is_ok() {
                crate::knob_guard::restored(&p);
            }
        }
        if let Some(m) = self.min_free_kbytes.take() {
            m.put_back();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(d) = self.shm_dir.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Open the FIFO `path` for writing once server `pid` has opened it for
/// reading. A plain open would wait for ever for a server that died first;
/// a non-blocking one fails (ENXIO) while no reader is there, and is tried
/// again as long as the server lives, for up to [`CONNECT_TIMEOUT_S`].
fn open_fifo_writer(path: &PathBuf, pid: libc::pid_t) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let start = std::time::Instant::now();
    loop {
        match OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
        {
            Ok(f) => {
                // SAFETY: fcntl on a descriptor the File owns.
                unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, 0) };
                return Ok(f);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                let waited = start.elapsed().as_secs() >= u64::from(CONNECT_TIMEOUT_S);
                if wait_gone_for(pid, std::time::Duration::ZERO).is_ok() || waited {
                    return Err(std::io::Error::other(format!(
                        "process {pid} never opened its requests' FIFO"
                    )));
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            Err(e) => return Err(e),
        }
    }
}

// ---------------------------------------------------------------------------
/// Wait until process `pid` (another server's child, reaped by the kernel)
/// has exited: its address space is gone once it is a zombie or gone, so
/// figures taken after the `exit` statement compare exactly.
fn wait_gone(pid: libc::pid_t) -> Result<(), String> {
    wait_gone_for(pid, std::time::Duration::from_secs(10))
}

/// [`wait_gone`], for at most `limit`.
fn wait_gone_for(pid: libc::pid_t, limit: std::time::Duration) -> Result<(), String> {
    let start = std::time::Instant::now();
    loop {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return Ok(());
        };
        // The state follows the parenthesised command name.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if matches!(state, Some('Z' | 'X')) {
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(format!("process {pid} did not exit within {limit:?}"));
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

// The server side, in the scenario's processes.

/// In the first server, just forked from `caller`: close the lock file and
/// the lifeline's write end (descriptors that would outlive `caller` here),
/// stop writing to the caller's standard streams, and die with the caller,
/// in a process group of servers that the lifeline's read end `lifeline`
/// signals (`O_ASYNC`: SIGIO, whose default action ends a process) once no
/// write end is left. A caller that died before the signal was set up is
/// seen here, as this server's parent no more.
fn server_detach(b: &HostBackend, lifeline: std::os::unix::io::RawFd, caller: libc::pid_t) {
    // SAFETY: closing and duplicating descriptors of this (single-threaded)
    // child; setpgid, fcntl and getppid have no memory arguments.
    unsafe {
        libc::close(b._lock.as_raw_fd());
        libc::close(b._lifeline.as_raw_fd());
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in [libc::STDIN_FILENO, libc::STDOUT_FILENO, libc::STDERR_FILENO] {
                libc::dup2(null, fd);
            }
            libc::close(null);
        }
        libc::setpgid(0, 0);
        libc::fcntl(lifeline, libc::F_SETOWN, -libc::getpid());
        libc::fcntl(lifeline, libc::F_SETFL, libc::O_ASYNC);
        // The caller may have died before the signal was set up.
        if libc::getppid() != caller {
            libc::_exit(1);
        }
    }
}

/// Open this server's FIFOs and serve. Opening blocks until the caller
/// opens the other ends: a caller that never does (it died) leaves the
/// server to SIGALRM's default action after [`CONNECT_TIMEOUT_S`].
fn serve_at(inp: &PathBuf, out: &PathBuf) -> ! {
    // SAFETY: alarm has no memory arguments; the server is single-threaded.
    unsafe { libc::alarm(CONNECT_TIMEOUT_S) };
    let r = File::open(inp);
    let w = OpenOptions::new().write(true).open(out);
    // SAFETY: as above.
    unsafe { libc::alarm(0) };
    match (r, w) {
        (Ok(r), Ok(w)) => serve(r, w),
        // SAFETY: leave without running the parent's destructors.
        _ => unsafe { libc::_exit(1) },
    }
}

/// The buffer the server's threads read /proc files into, made once at
/// the start (1 MiB, so that reading never grows the heap between a
/// mark and an expect). One request is served at a time.
fn proc_buf() -> std::sync::MutexGuard<'static, String> {
    static PROC_BUF: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
    PROC_BUF.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many threads a server may start (`thread`), over its life.
const NR_THREAD_STACKS: usize = 4;
/// Each one's stack: glibc puts the thread's descriptor and TLS at its
/// top, and the thread touches 128K of it before it serves.
const THREAD_STACK_SIZE: usize = 256 << 10;

/// The threads' stacks, in this server's bss and written through at its
/// start ([`touch_thread_stacks`]): a thread started later maps nothing
/// and faults nothing in, so that the scenario's figures see only what
/// the scenario's `thread` means (a clone on a stack the process has),
/// not pthread_create's stack mapping.
#[repr(C, align(4096))]
struct ThreadStacks([[u8; THREAD_STACK_SIZE]; NR_THREAD_STACKS]);

static mut THREAD_STACKS: ThreadStacks = ThreadStacks([[0; THREAD_STACK_SIZE]; NR_THREAD_STACKS]);

/// Threads this server started.
static THREADS_MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Write every page of the threads' stacks (a forked server makes them
/// its own before it serves), and start counting threads from none.
fn touch_thread_stacks() {
    let base = std::ptr::addr_of_mut!(THREAD_STACKS).cast::<u8>();
    for off in (0..NR_THREAD_STACKS * THREAD_STACK_SIZE).step_by(4096) {
        // SAFETY: within the static, which is writable; no thread of this
        // server runs on the stacks yet (a forked server has the forking
        // thread only, and it is this one).
        unsafe { base.add(off).write_volatile(0) };
    }
    THREADS_MADE.store(0, std::sync::atomic::Ordering::Relaxed);
}

/// The next of the prewritten stacks, each used once; None when all are.
fn take_stack_slot() -> Option<usize> {
    let slot = THREADS_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (slot < NR_THREAD_STACKS).then_some(slot)
}

/// The lowest byte of stack `slot`.
fn stack_of_slot(slot: usize) -> *mut u8 {
    debug_assert!(slot < NR_THREAD_STACKS);
    // The pointer is formed, not dereferenced: in bounds of the static.
    std::ptr::addr_of_mut!(THREAD_STACKS)
        .cast::<u8>()
        .wrapping_add(slot * THREAD_STACK_SIZE)
}

/// `thread IN OUT`: a thread of this server, on one of the stacks made
/// at its start, serving on the FIFOs `IN` and `OUT`, on the next CPU.
fn thread_here(words: &[&str]) -> String {
    let Some(slot) = take_stack_slot().filter(|_| words.len() >= 3) else {
        return format!("err {}", Errno::EAGAIN.0);
    };
    let arg = Box::into_raw(Box::new((
        PathBuf::from(words[1]),
        PathBuf::from(words[2]),
        slot,
    )));
    // SAFETY: the stack is the slot's part of THREAD_STACKS, used by no
    // other thread (each slot once); attr is initialised before use and
    // destroyed after; `arg` is handed to the thread, which frees it.
    unsafe {
        let stack = stack_of_slot(slot);
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstack(&mut attr, stack.cast(), THREAD_STACK_SIZE);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        let mut tid: libc::pthread_t = 0;
        let r = libc::pthread_create(&mut tid, &attr, thread_main, arg.cast());
        libc::pthread_attr_destroy(&mut attr);
        if r != 0 {
            drop(Box::from_raw(arg));
            return format!("err {r}");
        }
    }
    "ok".into()
}

/// `vfork IN OUT`: clone with CLONE_VM and CLONE_VFORK, the child on one
/// of the thread stacks (written through at the start, as a thread's).
/// The child answers this request itself (on `reply_fd`) and serves on
/// the FIFOs `IN` and `OUT`; this server waits in clone until it execs or
/// exits. Some(reply): the clone failed; None: the child answered.
fn vfork_here(words: &[&str], reply_fd: std::os::unix::io::RawFd) -> Option<String> {
    let Some(slot) = take_stack_slot().filter(|_| words.len() >= 3) else {
        return Some(format!("err {}", Errno::EAGAIN.0));
    };
    let arg = Box::into_raw(Box::new(VforkArg {
        inp: PathBuf::from(words[1]),
        out: PathBuf::from(words[2]),
        reply_fd,
    }));
    // SAFETY: the child runs on the slot's stack, used by nothing else,
    // from its top (stacks grow down); it shares this process's memory
    // while this thread waits in clone, so nothing else runs on the
    // memory meanwhile; `arg` is freed here once it has returned (the
    // child only reads it).
    let pid = unsafe {
        let top = stack_of_slot(slot).add(THREAD_STACK_SIZE);
        let pid = libc::clone(
            vfork_child_main,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            arg.cast(),
        );
        drop(Box::from_raw(arg));
        pid
    };
    (pid < 0).then(|| format!("err {}", errno_now().0))
}

/// What a vfork child serves on, and where it answers the vfork.
struct VforkArg {
    inp: PathBuf,
    out: PathBuf,
    reply_fd: std::os::unix::io::RawFd,
}

/// The vfork child: it answers the vfork with its pid, then serves
/// requests on the parent's memory until `exit` (`_exit`) or `exec`
/// (this program again as `serve-exec`, the descriptors kept open,
/// which execs the scenario's program traced).
extern "C" fn vfork_child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's VforkArg, alive until clone returns
    // there, which is after this child's exec or exit.
    let a = unsafe { &*arg.cast::<VforkArg>() };
    // SAFETY: getpid has no preconditions.
    let reply = format!("ok {}\n", unsafe { libc::getpid() });
    // SAFETY: writing our bytes to the parent's reply descriptor, which
    // this child's copy of the descriptor table holds.
    unsafe { libc::write(a.reply_fd, reply.as_ptr().cast(), reply.len()) };
    serve_fifos(&a.inp, &a.out, |words, [r, w]| {
        match words.first().copied() {
            Some("exec") => Some(vfork_child_exec(&words[1..], r, w)),
            Some("fork" | "thread" | "vfork") => Some(format!("err {}", Errno::ENOSYS.0)),
            _ => None,
        }
    });
    // SAFETY: leave without running the parent's destructors.
    unsafe { libc::_exit(0) }
}

/// A vfork child's `exec PROGRAM ARGS`: the errors execve finds before it
/// lets go of the parent's mm (a missing file ENOENT, no execute
/// permission EACCES, no ELF ENOEXEC) are answered here; otherwise this
/// program is exec'd as `serve-exec`, which answers. Returns the answer
/// when nothing was exec'd.
fn vfork_child_exec(program: &[&str], inp: i32, out: i32) -> String {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = program.first() else {
        return format!("err {}", Errno::EINVAL.0);
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return format!("err {}", e.raw_os_error().unwrap_or(Errno::ENOENT.0)),
    };
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return format!("err {}", Errno::EACCES.0);
    }
    let mut magic = [0u8; 4];
    let elf = File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic));
    if elf.is_err() || magic != *b"\x7fELF" {
        return format!("err {}", Errno::ENOEXEC.0);
    }
    let Ok(exe) = std::env::current_exe() else {
        return format!("err {}", Errno::ENOENT.0);
    };
    let mut args = vec![
        exe.display().to_string(),
        "serve-exec".into(),
        inp.to_string(),
        out.to_string(),
    ];
    args.extend(program.iter().map(|s| s.to_string()));
    let cargs: Vec<std::ffi::CString> = match args
        .iter()
        .map(|a| std::ffi::CString::new(a.as_str()))
        .collect()
    {
        Ok(v) => v,
        Err(_) => return format!("err {}", Errno::EINVAL.0),
    };
    let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: the FIFOs' descriptors stay open across the exec (their
    // close-on-exec flag cleared); execv reads the NUL-terminated strings
    // and the NULL-terminated array, alive until it returns.
    unsafe {
        libc::fcntl(inp, libc::F_SETFD, 0);
        libc::fcntl(out, libc::F_SETFD, 0);
        libc::execv(cargs[0].as_ptr(), ptrs.as_ptr());
        libc::fcntl(inp, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(out, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    format!("err {}", errno_now().0)
}

/// A server thread: on the CPU after its process's (after its earlier
/// threads'), serving until `exit`.
extern "C" fn thread_main(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `arg` is the Box `thread_here` leaked for this thread.
    let (inp, out, slot) = *unsafe { Box::from_raw(arg.cast::<(PathBuf, PathBuf, usize)>()) };
    pin_to_next_cpu(slot + 1);
    touch_stack(128);
    serve_fifos(&inp, &out, |words, fds| match words.first().copied() {
        Some("fork") => Some(fork_here(words, &fds)),
        // Not made from a thread (the scenario refuses exec with threads;
        // a thread starts threads of its own process).
        Some("exec" | "thread" | "vfork") => Some(format!("err {}", Errno::ENOSYS.0)),
        _ => None,
    });
    std::ptr::null_mut()
}

/// The requests of a thread or a vfork child, on the FIFOs `inp` and
/// `out`, until `exit` (answered) or the caller hangs up: `own` answers
/// those peculiar to it (given the FIFOs' descriptors), [`serve_request`]
/// the others.
fn serve_fifos(
    inp: &PathBuf,
    out: &PathBuf,
    mut own: impl FnMut(&[&str], [std::os::unix::io::RawFd; 2]) -> Option<String>,
) {
    let (Ok(r), Ok(mut w)) = (File::open(inp), OpenOptions::new().write(true).open(out)) else {
        return;
    };
    let fds = [r.as_raw_fd(), w.as_raw_fd()];
    let mut r = BufReader::with_capacity(4096, r);
    let mut line = String::with_capacity(4096);
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"exit") {
            let _ = writeln!(w, "ok");
            return;
        }
        let reply = own(&words, fds)
            .unwrap_or_else(|| serve_request(&words, &mut proc_buf(), "/proc/self"));
        if writeln!(w, "{reply}").is_err() {
            return;
        }
    }
}

/// Pin the calling thread to the CPU `k` after the one its process's
/// first thread is pinned to, round the online CPUs (left where it is if
/// that one may not be used).
fn pin_to_next_cpu(k: usize) {
    // SAFETY: sched_getaffinity and sysconf fill or return plain values;
    // the cpu_set_t is zeroed and filled before sched_setaffinity reads it.
    unsafe {
        let mut cur: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut cur) != 0 {
            return;
        }
        let Some(first) = (0..libc::CPU_SETSIZE as usize).find(|&c| libc::CPU_ISSET(c, &cur))
        else {
            return;
        };
        let online = libc::sysconf(libc::_SC_NPROCESSORS_ONLN).max(1) as usize;
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET((first + k) % online, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Read a /proc file into `buf` (reused, so that answering requests does not
/// grow the server's own memory between a `mark` and an `expect`).
fn read_proc<'b>(path: &str, buf: &'b mut String) -> &'b str {
    use std::io::Read;
    buf.clear();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(buf);
    }
    buf
}

/// Keep this server (and the children it forks) on the CPU it runs on:
/// the kernel batches some work per CPU (the LRU's folio batches, which
/// MADV_FREE'd folios wait in until drained, and which MADV_PAGEOUT drains
/// only on its own CPU), so a scenario whose steps ran on different CPUs
/// could see different figures from run to run.
fn pin_to_this_cpu() {
    // SAFETY: sched_getcpu has no arguments; the cpu_set_t is zeroed and
    // filled by the libc helper before sched_setaffinity reads it.
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu < 0 {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Drain this CPU's LRU folio batches: `MADV_COLD` starts with
/// `lru_add_drain`. Folios an earlier run left queued on this CPU (the
/// lazyfree batch MADV_FREE fills) would otherwise be counted
/// (`pglazyfree`) in the middle of this run's figures. The advice itself
/// is given to one page of this server's stack, which it only ages.
fn drain_lru_batches() {
    let here = 0u8;
    let page = (&here as *const u8 as usize) & !4095;
    // SAFETY: advice on a page of this thread's own stack, mapped while it
    // runs; MADV_COLD changes no contents.
    unsafe {
        libc::madvise(page as *mut libc::c_void, 4096, libc::MADV_COLD);
    }
}

/// The server's own file mappings (its program and libraries), as the
/// first server found them: a forked server inherits the list, and
/// prefaults those alone, not the scenario's file mappings it inherits
/// too (fork copies no PTE of a file mapping without anon pages, and the
/// child's faults on the scenario's are the scenario's to count).
static OWN_FILE_MAPPINGS: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());

/// Fault in every page of the server's own file mappings, so that the
/// code a request runs for the first time does not add to `RssFile`
/// between a scenario's mark and its expect. Pages past the end of a file
/// (SIGBUS) are left.
fn prefault_file_mappings(buf: &mut String) {
    let mut own = OWN_FILE_MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
    if own.is_empty() {
        *own = own_file_mappings(buf);
    }
    for &(a, b) in own.iter() {
        let mut p = a;
        while p + 8 <= b {
            // SAFETY: a readable mapping of this process covers the word
            // (its maps line said so when the first server started, and
            // nothing of the server's own is unmapped since); a page past
            // the end of its file raises SIGBUS, which the probe turns
            // into an error.
            let _ = unsafe { probe::load_u64(p) };
            p += 4096;
        }
    }
}

/// The readable file mappings of this process now.
fn own_file_mappings(buf: &mut String) -> Vec<(u64, u64)> {
    let maps = read_proc("/proc/self/maps", buf).to_string();
    let mut v = vec![];
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(range), Some(perms), Some(path)) = (f.first(), f.get(1), f.get(5)) else {
            continue;
        };
        if !perms.starts_with('r') || !path.starts_with('/') {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
            v.push((a, b));
        }
    }
    v
}

/// `RLIMIT_STACK` as a process that never set it has it (`_STK_LIM`, 8
/// MiB), as usermm's processes do, whatever the shell that started the run
/// set: a stack that grows down grows as far as that.
fn default_stack_limit() {
    const STK_LIM: u64 = 8 << 20;
    // SAFETY: getrlimit fills the zeroed struct it is given; setrlimit
    // reads a valid one.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_STACK, &mut lim) == 0 {
            lim.rlim_cur = STK_LIM;
            lim.rlim_max = lim.rlim_max.max(STK_LIM);
            libc::setrlimit(libc::RLIMIT_STACK, &lim);
        }
    }
}

/// Touch `kb` KiB of stack, so that later requests use pages already
/// counted in RssAnon.
#[inline(never)]
fn touch_stack(kb: usize) {
    let mut a = [0u8; 1024];
    std::hint::black_box(&mut a);
    if kb > 1 {
        touch_stack(kb - 1);
    }
    // Used again after the call, which is then no tail call: a tail call
    // may reuse this frame, and the whole descent touched one KiB (a
    // request that went a page deeper than the others then added 4K of
    // RssAnon between a mark and an expect, on the runs whose environment
    // put the stack's top where that crossed a page).
    std::hint::black_box(&a);
}

fn serve(requests: File, w: File) -> ! {
    serve_with(requests, w, None)
}

/// `usermm serve-exec IN OUT PROGRAM...`: a vfork child's `exec`. The
/// child, which ran its parent's address space, execs this program (so
/// that the parent runs again, as at a vfork child's exec), which execs
/// `program` traced and serves the scenario's requests for it on the
/// child's descriptors, answering the `exec` first.
pub fn serve_exec(inp: i32, out: i32, program: &[String]) -> ! {
    // SAFETY: the descriptors the vfork child left open for this program
    // (their close-on-exec flag cleared), owned by nothing else here.
    let (r, w) = unsafe { (File::from_raw_fd(inp), File::from_raw_fd(out)) };
    serve_with(r, w, Some(program))
}

/// A server; `exec`: a program to exec first, answering for it.
fn serve_with(requests: File, mut w: File, exec: Option<&[String]>) -> ! {
    // Children this server forks are reaped by the kernel as they exit (no
    // zombies; the scenario's side waits for them to be gone).
    // SAFETY: setting a signal disposition; the server is single-threaded.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
    probe::install();
    default_stack_limit();
    pin_to_this_cpu();
    drain_lru_batches();
    // Settle the server's own footprint before the scenario measures it.
    // The heap gets 256K of room, written (so that its page tables exist)
    // and kept (never trimmed), for the requests' small allocations: where
    // the heap starts is random, and growing it later could cross a 2 MiB
    // boundary now and then and add a page table (4K of VmPTE) between a
    // mark and an expect. It stays under 2 MiB, so that a scenario that
    // sets a THP size to `always` gives khugepaged nothing of the server's
    // to collapse.
    // SAFETY: mallopt only sets malloc's parameters; nothing allocates
    // concurrently (the server is single-threaded).
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
    drop(std::hint::black_box(vec![1u8; 256 << 10]));
    // Several threads at most, and one at a time: the malloc arena of
    // the first serves them all (a thread's own would be a new mapping).
    // SAFETY: as above.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    let mut buf = String::with_capacity(1 << 20);
    buf.extend(std::iter::repeat_n('x', 1 << 20));
    touch_stack(128);
    touch_thread_stacks();
    prefault_file_mappings(&mut buf);
    *proc_buf() = buf;
    // The request reader's buffer, taken now from that room: taken before,
    // from wherever the heap's top was, a request longer than those before
    // it could reach into a page of it never touched (4K of RssAnon
    // between a mark and an expect, on the runs whose heap put the buffer
    // across a page boundary).
    let mut r = BufReader::with_capacity(4096, requests);
    let mut line = String::with_capacity(4096);
    // The program this server exec'd for the scenario's process, stopped
    // at its first instruction (`exec`): the requests are then made for
    // that process (see [`traced`]), the figures and maps are its own.
    let mut traced: Option<traced::Traced> = None;
    if let Some(program) = exec {
        let argv: Vec<&str> = program.iter().map(String::as_str).collect();
        let reply = match argv.first().map(|p| exec_traced(p, &argv, false)) {
            Some(Ok(pid)) => match traced::Traced::new(pid) {
                Ok(t) => {
                    traced = Some(t);
                    "ok".to_string()
                }
                Err(e) => {
                    kill_traced(pid);
                    format!("err {} cannot drive the exec'd process", e.0)
                }
            },
            Some(Err(e)) => format!("err {}", e.0),
            None => format!("err {}", Errno::EINVAL.0),
        };
        if writeln!(w, "{reply}").is_err() {
            // SAFETY: as above.
            unsafe { libc::_exit(1) };
        }
    }
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            if let Some(t) = &traced {
                t.kill();
            }
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let proc_dir = match &traced {
            Some(t) => format!("/proc/{}", t.pid),
            None => "/proc/self".to_string(),
        };
        let n = |i: usize| {
            words
                .get(i)
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if let Some(t) = &traced {
            if !matches!(
                words.first().copied(),
                Some("figures" | "maps" | "exit" | "exec" | "exec_aslr")
            ) {
                let reply = t.serve(&words, n, &mut proc_buf());
                if writeln!(w, "{reply}").is_err() {
                    // SAFETY: as above.
                    unsafe { libc::_exit(1) };
                }
                continue;
            }
        }
        let reply = match words.first().copied() {
            Some("fork") => fork_here(&words, &[r.get_ref().as_raw_fd(), w.as_raw_fd()]),
            Some(verb @ ("exec" | "exec_aslr")) => {
                match exec_traced(words[1], &words[1..], verb == "exec_aslr") {
                    Ok(pid) => match traced::Traced::new(pid) {
                        Ok(t) => {
                            // The process execs again: the program before
                            // goes with its address space.
                            if let Some(old) = traced.replace(t) {
                                old.kill();
                            }
                            "ok".to_string()
                        }
                        Err(e) => {
                            kill_traced(pid);
                            format!("err {} cannot drive the exec'd process", e.0)
                        }
                    },
                    Err(e) => format!("err {}", e.0),
                }
            }
            Some("exit") => {
                if let Some(t) = &traced {
                    t.kill();
                }
                let _ = writeln!(w, "ok");
                // SAFETY: as above.
                unsafe { libc::_exit(0) }
            }
            Some("thread") => thread_here(&words),
            Some("vfork") => match vfork_here(&words, w.as_raw_fd()) {
                Some(reply) => reply,
                // The child answered, and has exec'd or exited.
                None => continue,
            },
            _ => serve_request(&words, &mut proc_buf(), &proc_dir),
        };
        if writeln!(w, "{reply}").is_err() {
            // SAFETY: as above.
            unsafe { libc::_exit(1) };
        }
    }
}

/// The answer to a request that every thread of a server makes alike:
/// the memory calls on its own address space, its loads and stores, the
/// figures and maps of `proc_dir` (/proc/self, or the exec'd program's).
fn serve_request(words: &[&str], proc_buf: &mut String, proc_dir: &str) -> String {
    let n = |i: usize| {
        words
            .get(i)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
    };
    match words.first().copied() {
        Some("mmap") => mmap_here(words, n),
        Some("write_file") => write_file_here(words, n),
        Some("truncate") => truncate_here(words, n),
        Some("msync") => {
            // SAFETY: as for munmap.
            rc(unsafe { libc::msync(n(1) as *mut _, n(2) as usize, n(3) as i32) })
        }
        Some("munmap") => {
            // SAFETY: a system call on this process's own address space;
            // the kernel checks the scenario's arguments.
            rc(unsafe { libc::munmap(n(1) as *mut _, n(2) as usize) })
        }
        Some("mremap") => {
            // SAFETY: as for munmap: the scenario's own mappings, or
            // addresses the kernel checks.
            let p = unsafe {
                libc::mremap(
                    n(1) as *mut _,
                    n(2) as usize,
                    n(3) as usize,
                    n(4) as i32,
                    n(5) as usize,
                )
            };
            if p == libc::MAP_FAILED {
                format!(
                    "err {}",
                    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
                )
            } else {
                format!("ok {}", p as u64)
            }
        }
        Some("mprotect") => {
            // SAFETY: as for munmap.
            rc(unsafe { libc::mprotect(n(1) as *mut _, n(2) as usize, n(3) as i32) })
        }
        Some("madvise") => {
            // SAFETY: as for munmap.
            rc(unsafe { libc::madvise(n(1) as *mut _, n(2) as usize, n(3) as i32) })
        }
        Some("mlock2") => {
            // SAFETY: mlock2 changes no memory contents; the kernel
            // checks the arguments.
            rc(unsafe { libc::mlock2(n(1) as *const _, n(2) as usize, n(3) as u32) })
        }
        Some("munlock") => {
            // SAFETY: as for mlock2.
            rc(unsafe { libc::munlock(n(1) as *const _, n(2) as usize) })
        }
        Some("mlockall") => {
            // SAFETY: as for mlock2.
            rc(unsafe { libc::mlockall(n(1) as i32) })
        }
        Some("munlockall") => {
            // SAFETY: as for mlock2.
            rc(unsafe { libc::munlockall() })
        }
        Some("setrlimit") => {
            let lim = libc::rlimit {
                rlim_cur: n(2),
                rlim_max: n(2),
            };
            // SAFETY: a valid rlimit, read by the call only.
            rc(unsafe { libc::setrlimit(n(1) as _, &lim) })
        }
        Some("capdrop_ipc_lock") => capdrop_ipc_lock_here(),
        Some("mincore") => {
            let len = n(2);
            let pages = (len / 4096 + u64::from(len % 4096 != 0)) as usize;
            if pages > 1 << 20 {
                // Past 4 GiB of range: no vector here could hold the
                // answer; the kernel's own check says whether the
                // range is one at all (ENOMEM past the address space).
                if n(1).checked_add(len).is_none_or(|e| e > (1 << 47) - 4096) {
                    "err 12".to_string()
                } else {
                    "err 7".to_string()
                }
            } else {
                let mut vec = vec![0u8; pages];
                // SAFETY: the kernel writes at most one byte per page
                // of the range into `vec`, which has room for them all.
                let r = unsafe { libc::mincore(n(1) as *mut _, len as usize, vec.as_mut_ptr()) };
                if r == 0 {
                    let bits: String = vec
                        .iter()
                        .map(|&b| if b & 1 != 0 { '1' } else { '0' })
                        .collect();
                    format!("ok {bits}")
                } else {
                    rc(r)
                }
            }
        }
        Some("mbind") => {
            let mask = [n(4)];
            // SAFETY: mbind on this process's own range, with a mask of
            // 64 bits (maxnode 65: the kernel reads maxnode - 1 bits).
            rc(unsafe {
                libc::syscall(
                    libc::SYS_mbind,
                    n(1),
                    n(2),
                    n(3) as libc::c_ulong,
                    mask.as_ptr(),
                    65 as libc::c_ulong,
                    n(5) as libc::c_ulong,
                ) as i32
            })
        }
        Some("move_pages") => {
            let node = words
                .get(3)
                .and_then(|s| s.parse::<i32>().ok())
                .unwrap_or(-1);
            move_pages_here(n(1), n(2), node)
        }
        Some("store") => {
            if access_check("/proc/self/maps", n(1), true, proc_buf) == Access::Refused {
                format!("err {}", Errno::EFAULT.0)
            } else {
                // SAFETY: /proc/self/maps says writable VMAs cover the
                // word's ends (which may be unaligned), or holes do (a
                // stack may grow into them; otherwise SIGSEGV); a page
                // past the end of a mapped file raises SIGBUS; the probe
                // turns either signal into an error.
                match unsafe { probe::store_u64(n(1), n(2)) } {
                    Ok(()) => "ok".to_string(),
                    Err(sig) => format!("err {}", probe::errno(sig).0),
                }
            }
        }
        Some("load") => {
            if access_check("/proc/self/maps", n(1), false, proc_buf) == Access::Refused {
                format!("err {}", Errno::EFAULT.0)
            } else {
                // SAFETY: readable VMAs or holes cover the word's ends;
                // signals as for a store.
                match unsafe { probe::load_u64(n(1)) } {
                    Ok(v) => format!("ok {v}"),
                    Err(sig) => format!("err {}", probe::errno(sig).0),
                }
            }
        }
        Some("await_numa_hint") => await_numa_hint_here(n(1), proc_buf),
        Some("numa_helper") => match start_numa_helper_thread() {
            Ok(()) => "ok".into(),
            Err(why) => format!("err {} {why}", Errno::EAGAIN.0),
        },
        Some("read_faults") => read_faults_here(&super::load_addrs(n(1), n(2), n(3)), proc_buf),
        Some("figures") => {
            let f = |s: &str, k: &str| {
                s.lines()
                    .find(|l| l.starts_with(k) && l[k.len()..].starts_with(':'))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0)
            };
            let st = read_proc(&format!("{proc_dir}/status"), proc_buf);
            let (a, b, c) = (f(st, "VmRSS"), f(st, "RssAnon"), f(st, "VmPTE"));
            let (rf, rs) = (f(st, "RssFile"), f(st, "RssShmem"));
            let lck = f(st, "VmLck");
            let rollup = read_proc(&format!("{proc_dir}/smaps_rollup"), proc_buf);
            let (d, locked) = (f(rollup, "AnonHugePages"), f(rollup, "Locked"));
            let e = read_proc(&format!("{proc_dir}/maps"), proc_buf)
                .lines()
                .count();
            format!("ok {a} {b} {c} {d} {e} {rf} {rs} {lck} {locked}")
        }
        Some("dump") => {
            let st = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let keep: Vec<&str> = st
                .lines()
                .filter(|l| {
                    ["VmSize", "VmRSS", "RssAnon", "VmPTE"]
                        .iter()
                        .any(|k| l.starts_with(k))
                })
                .collect();
            format!("ok {}", keep.join("\u{1f}"))
        }
        // The server's own heap is its allocator's: brk is made only
        // for an exec'd process.
        Some("brk") => format!("err {}", Errno::ENOSYS.0),
        Some("maps") => {
            let maps = read_proc(&format!("{proc_dir}/maps"), proc_buf);
            let lines: Vec<String> = maps
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            format!("ok {}", lines.join("\u{1f}"))
        }
        _ => "err 22".to_string(),
    }
}

/// `fork IN OUT`: this server forks; the child, with the calling thread
/// only, serves on the FIFOs `IN` and `OUT`, once it has closed the
/// parent's FIFOs, `fds`.
fn fork_here(words: &[&str], fds: &[std::os::unix::io::RawFd]) -> String {
    let (i, o) = (PathBuf::from(words[1]), PathBuf::from(words[2]));
    // SAFETY: the server's other threads, if it has any, are parked for
    // good or blocked reading their FIFOs, and hold no lock (see
    // `start_numa_helper_thread` and `thread_here`); the child has this
    // one only.
    let pid = unsafe { libc::fork() };
    // Both drain the CPU's LRU and mlock batches now, before either
    // answers: a server's own copy-on-write faults on its memory would
    // drain them at unforeseeable moments (`wp_can_reuse_anon_folio`
    // drains for a folio in a batch). The engine's `fork` drains as well.
    drain_lru_batches();
    if pid == 0 {
        for &fd in fds {
            // SAFETY: the child's copies of the parent's FIFOs, which
            // nothing in the child uses again (serve_at never returns).
            unsafe { libc::close(fd) };
        }
        serve_at(&i, &o);
    }
    if pid < 0 {
        format!("err {}", errno_now().0)
    } else {
        format!("ok {pid}")
    }
}

/// `exec` in the server: a child that asks to be traced, turns
/// randomisation off (`setarch -R`) unless `randomize`, and execs `path` with `argv` and no
/// environment; the exec stops it with SIGTRAP before its first
/// instruction, and it dies with this server (`PTRACE_O_EXITKILL`).
/// Returns its pid, or the errno its execve failed with.
fn exec_traced(path: &str, argv: &[&str], randomize: bool) -> Result<libc::pid_t, Errno> {
    use std::ffi::CString;
    let cpath = CString::new(path).map_err(|_| Errno::ENOENT)?;
    let cargs: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(*a).map_err(|_| Errno::EINVAL))
        .collect::<Result<_, _>>()?;
    let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let mut pipe = [0i32; 2];
    // SAFETY: pipe2 fills the two descriptors of the array.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(errno_now());
    }
    // SAFETY: the child calls only async-signal-safe functions (ptrace,
    // personality, execve, write, _exit) on memory prepared before the
    // fork.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above; the pointers are alive in the child's copy.
        unsafe {
            libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
            let persona = if randomize {
                0
            } else {
                libc::ADDR_NO_RANDOMIZE
            };
            libc::personality(persona as libc::c_ulong);
            libc::execve(cpath.as_ptr(), ptrs.as_ptr(), envp.as_ptr());
            let e = *libc::__errno_location();
            libc::write(pipe[1], (&e as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    // SAFETY: closing this process's copy of the pipe's write end.
    unsafe { libc::close(pipe[1]) };
    let mut e = 0i32;
    // SAFETY: reading at most 4 bytes into `e`; the read ends when the
    // child's copy of the write end closes (at exec, or its exit).
    let got = unsafe { libc::read(pipe[0], (&mut e as *mut i32).cast(), 4) };
    // SAFETY: closing the read end, ours.
    unsafe { libc::close(pipe[0]) };
    if pid < 0 {
        return Err(errno_now());
    }
    if got == 4 {
        return Err(Errno(e));
    }
    let mut status = 0;
    // SAFETY: waiting for our own child's stop.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
    if r != pid || !libc::WIFSTOPPED(status) {
        return Err(Errno::EIO);
    }
    // SAFETY: the child is stopped under our trace.
    unsafe {
        libc::ptrace(
            libc::PTRACE_SETOPTIONS,
            pid,
            0,
            libc::PTRACE_O_EXITKILL as libc::c_ulong,
        )
    };
    Ok(pid)
}

/// End the exec'd process: killed, and waited for.
fn kill_traced(pid: libc::pid_t) {
    // SAFETY: our own traced child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), libc::__WALL);
    }
}

/// The files the scenario maps, open in this server: one open file per
/// scenario file, opened at its first mapping and kept, as a program
/// keeps its descriptor (mappings of one open file may merge; a forked
/// server inherits them, as fork shares descriptors).
static OPEN_FILES: std::sync::Mutex<Vec<(String, File)>> = std::sync::Mutex::new(Vec::new());

/// `write_file SIZE SEED|- CHUNK CREATE PATH` in the server: the file
/// written as [`super::file_bytes`] makes it, in `CHUNK`-byte writes, then
/// fsynced.
/// `truncate SIZE WRITABLE PATH`: open the file (for writing if
/// WRITABLE is 1) and `ftruncate(2)` it to SIZE.
fn truncate_here(words: &[&str], n: impl Fn(usize) -> u64) -> String {
    let Some(path) = words.get(3) else {
        return format!("err {}", Errno::EINVAL.0);
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(n(2) == 1)
        .open(path);
    match f {
        // SAFETY: ftruncate on a descriptor this function owns.
        Ok(f) => rc(unsafe { libc::ftruncate(f.as_raw_fd(), n(1) as libc::off_t) }),
        Err(e) => format!("err {}", e.raw_os_error().unwrap_or(Errno::EIO.0)),
    }
}

fn write_file_here(words: &[&str], n: impl Fn(usize) -> u64) -> String {
    use std::os::unix::fs::FileExt;
    let Some(path) = words.get(5) else {
        return format!("err {}", Errno::EINVAL.0);
    };
    let (size, chunk) = (n(1), n(3).max(1));
    let seed = words.get(2).and_then(|s| s.parse::<u64>().ok());
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(n(4) == 1)
        .truncate(n(4) == 1)
        .open(path);
    let f = match f {
        Ok(f) => f,
        Err(e) => return format!("err {}", e.raw_os_error().unwrap_or(Errno::EIO.0)),
    };
    // The bytes in a mapping of their own, unmapped after: the server's
    // heap, whose pages count in its figures, does not grow.
    let buf_len = size.max(1) as usize;
    // SAFETY: an anonymous private mapping of our own; checked below.
    let buf = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            buf_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if buf == libc::MAP_FAILED {
        return format!("err {}", errno_now().0);
    }
    // SAFETY: `buf_len` bytes just mapped, ours alone until unmapped below.
    let bytes = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, buf_len) };
    super::fill_file_bytes(bytes, seed);
    let mut pos = 0u64;
    let mut r = Ok(());
    while pos < size && r.is_ok() {
        let len = chunk.min(size - pos);
        r = f.write_all_at(&bytes[pos as usize..(pos + len) as usize], pos);
        pos += len;
    }
    // SAFETY: unmapping what was mapped above; `bytes` is not used after.
    unsafe { libc::munmap(buf, buf_len) };
    if let Err(e) = r {
        return format!("err {}", e.raw_os_error().unwrap_or(Errno::EIO.0));
    }
    match f.sync_all() {
        Ok(()) => "ok".into(),
        Err(e) => format!("err {}", e.raw_os_error().unwrap_or(Errno::EIO.0)),
    }
}

/// That shmem chooses its folio sizes here as the model's does: each of
/// shmem's THP knobs (`shmem_enabled`, top-level and per size) that the
/// scenario did not set (`set`: the knob files it wrote) at the model's
/// boot value (`never`; the PMD size `inherit`), and /dev/shm mounted
/// without `huge=`; Err says what differs (the scenario is skipped).
fn shmem_knobs_as_model(set: &[(String, String)]) -> Result<(), String> {
    let knob = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.split('[').nth(1)?.split(']').next().map(str::to_string))
    };
    let unset = |p: &str| !set.iter().any(|(q, _)| q == p);
    let top = format!("{THP}/shmem_enabled");
    if let Some(m) = knob(&top).filter(|m| m != "never" && unset(&top)) {
        return Err(format!(
            "shmem's knobs differ from the model's here ({top} is {m})"
        ));
    }
    if let Ok(rd) = std::fs::read_dir(THP) {
        for e in rd.flatten() {
            let p = e.path().join("shmem_enabled");
            let p = p.to_string_lossy();
            let default = if e.file_name() == "hugepages-2048kB" {
                "inherit"
            } else {
                "never"
            };
            if let Some(m) = knob(&p).filter(|m| m != default && unset(&p)) {
                return Err(format!(
                    "shmem's knobs differ from the model's here ({p} is {m})"
                ));
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if let Some(l) = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/dev/shm") && l.contains("huge="))
        .filter(|l| !l.contains("huge=never"))
    {
        return Err(format!("/dev/shm is mounted with large folios ({l})"));
    }
    Ok(())
}

/// `mmap` in the server: anonymous (`mmap ADDR LEN PROT FLAGS`), or a
/// file (`... OFF WRITABLE PATH`) through its open file.
fn mmap_here(words: &[&str], n: impl Fn(usize) -> u64) -> String {
    let mut fd = -1;
    let mut files = OPEN_FILES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = words.get(7) {
        match files.iter().find(|(p, _)| p == path) {
            Some((_, f)) => fd = f.as_raw_fd(),
            None => {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(n(6) == 1)
                    .open(path);
                match f {
                    Ok(f) => {
                        fd = f.as_raw_fd();
                        files.push((path.to_string(), f));
                    }
                    Err(e) => return format!("err {}", e.raw_os_error().unwrap_or(Errno::EIO.0)),
                }
            }
        }
    }
    // SAFETY: mmap with the scenario's arguments; the kernel checks them,
    // and only this process's memory is at stake.
    let p = unsafe {
        libc::mmap(
            n(1) as *mut libc::c_void,
            n(2) as usize,
            n(3) as i32,
            n(4) as i32,
            fd,
            n(5) as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        format!("err {}", errno_now().0)
    } else {
        format!("ok {}", p as u64)
    }
}

/// The filesystem type of the mount that holds `dir` (`ext4`, `tmpfs`),
/// from `/proc/self/mountinfo`: the longest mount point that contains it.
fn fs_type_of(dir: &std::path::Path) -> Result<String, String> {
    let dir = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let mut best: Option<(usize, String)> = None;
    for l in info.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(sep) = f.iter().position(|&x| x == "-") else {
            continue;
        };
        let (Some(mp), Some(ty)) = (f.get(4), f.get(sep + 1)) else {
            continue;
        };
        if dir.starts_with(mp) && best.as_ref().is_none_or(|(len, _)| mp.len() >= *len) {
            best = Some((mp.len(), ty.to_string()));
        }
    }
    best.map(|(_, t)| t)
        .ok_or_else(|| format!("no mount holds {}", dir.display()))
}

/// The server's loads and stores, which survive a SIGBUS or a SIGSEGV: a
/// page of a file mapping past the end of its file is the kernel's SIGBUS,
/// which the scenario expects as an outcome (`fails SIGBUS:`), not as the
/// end of the process; an access to a hole in the address space is tried
/// (it may grow a stack down into it) and its SIGSEGV reported as EFAULT.
/// Each access is one instruction whose recovery point is in a register;
/// the handler, while an access is under way, resumes there with the
/// signal's number in another, and otherwise restores the default action.
mod probe {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

    /// An access is under way (the server is single-threaded).
    static PROBING: AtomicBool = AtomicBool::new(false);

    extern "C" fn on_signal(sig: i32, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        if !PROBING.load(SeqCst) {
            // SAFETY: restoring the default action and re-raising: the
            // process dies of the signal, as it would have without us.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
            return;
        }
        // SAFETY: `ctx` is the ucontext the kernel passed to this
        // SA_SIGINFO handler; the access's asm put its recovery address in
        // rcx, and rdx is where it finds the signal.
        unsafe {
            let uc = ctx as *mut libc::ucontext_t;
            let g = &mut (*uc).uc_mcontext.gregs;
            g[libc::REG_RIP as usize] = g[libc::REG_RCX as usize];
            g[libc::REG_RDX as usize] = i64::from(sig);
        }
    }

    /// Signals are delivered on a stack of their own, written through once
    /// here: a signal frame pushed below the server's stack pointer could
    /// touch a page of stack never touched before and add 4K to RssAnon
    /// between a mark and an expect.
    fn alternate_stack() {
        const SIZE: usize = 64 << 10;
        let stack: &'static mut [u8] = Box::leak(vec![0u8; SIZE].into_boxed_slice());
        for b in stack.iter_mut().step_by(4096) {
            // SAFETY: a byte of the buffer just made.
            unsafe { std::ptr::write_volatile(b, 1) };
        }
        let ss = libc::stack_t {
            ss_sp: stack.as_mut_ptr().cast(),
            ss_flags: 0,
            ss_size: SIZE,
        };
        // SAFETY: the stack lives for the process's life (leaked), and this
        // thread is the server's only one taking signals.
        unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) };
    }

    /// Install the handler (once per server; a forked server inherits it
    /// and the alternate stack).
    pub fn install() {
        alternate_stack();
        // SAFETY: a zeroed sigaction with a handler of the SA_SIGINFO
        // signature; the handler touches only the atomic and the context.
        // SA_ONSTACK: a SIGSEGV of the server's own stack overflow runs
        // on the alternate stack Rust's runtime set up, if any.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
            libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
        }
    }

    /// Load 8 bytes at `addr`; Err(the signal) if it raised SIGBUS or
    /// SIGSEGV.
    ///
    /// # Safety
    ///
    /// Nothing of this process's own lies at `addr..addr + 8` that a load
    /// could disturb (a scenario's mapping, or a hole).
    pub unsafe fn load_u64(addr: u64) -> Result<u64, i32> {
        let (v, sig): (u64, u64);
        PROBING.store(true, SeqCst);
        // SAFETY: the caller's promise; a signal resumes at label 2.
        unsafe {
            std::arch::asm!(
                "lea rcx, [rip + 2f]",
                "xor edx, edx",
                "mov rax, qword ptr [rdi]",
                "2:",
                in("rdi") addr,
                out("rax") v,
                out("rcx") _,
                out("rdx") sig,
                options(nostack, readonly),
            );
        }
        PROBING.store(false, SeqCst);
        if sig != 0 {
            Err(sig as i32)
        } else {
            Ok(v)
        }
    }

    /// Store `v` at `addr`; Err(the signal) if it raised SIGBUS or SIGSEGV.
    ///
    /// # Safety
    ///
    /// Nothing of this process's own lies at `addr..addr + 8` (a
    /// scenario's mapping, or a hole).
    pub unsafe fn store_u64(addr: u64, v: u64) -> Result<(), i32> {
        let sig: u64;
        PROBING.store(true, SeqCst);
        // SAFETY: the caller's promise; a signal resumes at label 2.
        unsafe {
            std::arch::asm!(
                "lea rcx, [rip + 2f]",
                "xor edx, edx",
                "mov qword ptr [rdi], rsi",
                "2:",
                in("rdi") addr,
                in("rsi") v,
                out("rcx") _,
                out("rdx") sig,
                options(nostack),
            );
        }
        PROBING.store(false, SeqCst);
        if sig != 0 {
            Err(sig as i32)
        } else {
            Ok(())
        }
    }

    /// The errno a scenario sees for an access that raised `sig`.
    pub fn errno(sig: i32) -> usermm::Errno {
        if sig == libc::SIGBUS {
            usermm::Errno::SIGBUS
        } else {
            usermm::Errno::EFAULT
        }
    }
}

/// This thread's page faults so far (`min_flt` + `maj_flt`).
fn thread_faults() -> i64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
        u
    };
    u.ru_minflt + u.ru_majflt
}

/// Load one byte at each address: a function of its own, which
/// [`read_faults_here`] runs once on its own stack first, so that its code
/// is faulted in before the loads it counts.
#[inline(never)]
fn load_each(addrs: &[u64]) {
    for &a in addrs {
        // SAFETY: the caller checked that a readable VMA covers each
        // address (this server does one request at a time).
        unsafe { (a as *const u8).read_volatile() };
    }
}

/// `expect faults reading` in the server: see
/// [`super::Backend::read_faults`]. `None` addresses: too many loads, or a
/// range past the top.
fn read_faults_here(addrs: &Option<Vec<u64>>, buf: &mut String) -> String {
    let Some(addrs) = addrs else {
        return format!("err {}", Errno::EINVAL.0);
    };
    let maps = read_proc("/proc/self/maps", buf);
    if !addrs.iter().all(|&a| maps_allow(maps, a, false)) {
        return format!("err {}", Errno::EFAULT.0);
    }
    let here = 0u8;
    load_each(&[&here as *const u8 as u64]);
    let before = thread_faults();
    load_each(addrs);
    format!("ok {}", thread_faults() - before)
}

/// The process whose NUMA helper thread runs (a forked server has none).
static NUMA_HELPER_OF: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Give this server a second thread, parked for good, if it has none. The
/// kernel's scan leaves alone, in a process of one thread, the pages on the
/// node it runs on (`prot_numa_skip`'s target node), so that on a host of
/// one node it would hint nothing; two threads share the mm (`mm_users`
/// 2), as the model's CPUs may, which has no such rule. Returns once the
/// thread has started, its own faults (its stack) taken; Err says why it
/// could not be.
fn start_numa_helper_thread() -> Result<(), String> {
    use std::sync::atomic::Ordering::Relaxed;
    let me = std::process::id() as i32;
    if NUMA_HELPER_OF.load(Relaxed) == me {
        return Ok(());
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("numa-helper".into())
        .spawn(move || {
            let _ = tx.send(());
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| format!("no second thread for NUMA balancing: {e}"))?;
    rx.recv()
        .map_err(|_| "the NUMA helper thread ended".to_string())?;
    std::thread::sleep(std::time::Duration::from_millis(10));
    NUMA_HELPER_OF.store(me, Relaxed);
    Ok(())
}

/// `await_numa_hint ADDR` in the server: see
/// [`super::Backend::await_numa_hint`]. The loop is the process's run
/// time, whose ticks start the scan (`task_tick_numa`).
fn await_numa_hint_here(addr: u64, buf: &mut String) -> String {
    if !maps_allow(read_proc("/proc/self/maps", buf), addr, false) {
        return format!("err {}", Errno::EFAULT.0);
    }
    if let Err(why) = start_numa_helper_thread() {
        return format!("err {} {why}", Errno::EAGAIN.0);
    }
    let byte = addr as *const u8;
    // SAFETY: a readable VMA covers the byte (checked above; nothing
    // unmaps it meanwhile: this server does one request at a time).
    let load = || unsafe { byte.read_volatile() };
    // Everything the loop runs, once before it counts: a first read of the
    // clock may fault the vDSO's data page in, and a forked server faults
    // in each page of code the first time it runs it.
    let start = std::time::Instant::now();
    let limit = std::time::Duration::from_secs(super::AWAIT_NUMA_HINT_S);
    let _ = start.elapsed() > limit;
    load();
    let _ = thread_faults();
    // Only this thread's faults, and only those between the two counts
    // around a load: the loop's own work, and the helper, are left out.
    // The count is read twice before the load: the first read writes the
    // stack page the second writes to, so that a hinting fault on it (once
    // the scan has reached the server's own memory) falls before the
    // window.
    loop {
        let _ = thread_faults();
        let before = thread_faults();
        load();
        if thread_faults() != before {
            return "ok".into();
        }
        if start.elapsed() > limit {
            return format!("err {}", Errno::ETIMEDOUT.0);
        }
    }
}

/// Drop `CAP_IPC_LOCK` from this process's effective set (`capset`), so
/// that `RLIMIT_MEMLOCK` binds it; its children inherit the drop.
fn capdrop_ipc_lock_here() -> String {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut hdr = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes two `Data` words, as version 3 says, into the
    // array it is given.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    if r != 0 {
        return rc(-1);
    }
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    // SAFETY: as above; capset reads them.
    rc(unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) } as i32)
}

fn rc(r: i32) -> String {
    if r == 0 {
        "ok".into()
    } else {
        format!("err {}", errno_now().0)
    }
}

/// Would the MMU let this process load (or store) the word at `addr`?
/// What the MMU would make of an access, as far as /proc/self/maps tells.
#[derive(PartialEq, Eq)]
enum Access {
    /// VMAs cover the word and allow the access.
    Allowed,
    /// A VMA covers a byte of it and does not allow the access: SIGSEGV.
    Refused,
    /// Part of it lies in a hole, which the access itself must try: a
    /// stack that grows down may take the hole in, or it is a SIGSEGV.
    Hole,
}

/// [`Access`] for the 8-byte word at `addr` of the process whose maps
/// file is `maps_path`: its first and last bytes
/// (a word spans at most two pages, so at most two VMAs, and the MMU
/// checks each page). A word that would wrap past the top is never mapped.
fn access_check(maps_path: &str, addr: u64, write: bool, buf: &mut String) -> Access {
    let Some(last) = addr.checked_add(7) else {
        return Access::Refused;
    };
    let maps = read_proc(maps_path, buf);
    let ends = [maps_line(maps, addr), maps_line(maps, last)];
    if ends
        .iter()
        .all(|l| l.is_some_and(|l| line_allows(l, write)))
    {
        Access::Allowed
    } else if ends.iter().flatten().any(|l| !line_allows(l, write)) {
        Access::Refused
    } else {
        Access::Hole
    }
}

/// The line of `maps` (`/proc/self/maps`) whose range covers byte `a`.
fn maps_line(maps: &str, a: u64) -> Option<&str> {
    maps.lines().find(|l| {
        l.split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'))
            .and_then(|(lo, hi)| {
                Some((
                    u64::from_str_radix(lo, 16).ok()?,
                    u64::from_str_radix(hi, 16).ok()?,
                ))
            })
            .is_some_and(|(lo, hi)| lo <= a && a < hi)
    })
}

/// Whether a line of `maps` covers byte `a` with a protection that lets
/// the MMU load it (or store to it).
fn maps_allow(maps: &str, a: u64, write: bool) -> bool {
    maps_line(maps, a).is_some_and(|l| line_allows(l, write))
}

/// Whether the protection of a `maps` line lets the MMU load (or store).
fn line_allows(line: &str, write: bool) -> bool {
    let Some(p) = line.split_whitespace().nth(1).map(str::as_bytes) else {
        return false;
    };
    if p.len() < 3 {
        return false;
    }
    if write {
        p[1] == b'w'
    } else {
        // On x86 a writable or executable page is also readable. The
        // vsyscall page is execute-only unless the kernel was booted with
        // vsyscall=emulate: a load from it faults.
        let xonly_vsyscall = line.ends_with("[vsyscall]") && !vsyscall_emulated();
        p[0] == b'r' || p[1] == b'w' || (p[2] == b'x' && !xonly_vsyscall)
    }
}

/// Whether the host maps the vsyscall page readable (`vsyscall=emulate`).
fn vsyscall_emulated() -> bool {
    std::fs::read_to_string("/proc/cmdline")
        .is_ok_and(|c| c.split_whitespace().any(|w| w == "vsyscall=emulate"))
}
