//! `usermm trace record`: run a program on the host kernel and write what
//! its memory management did.
//!
//! Two observers, each doing what it does best:
//!
//! * `perf record` takes the stream: the `syscalls:sys_enter_*` and
//!   `sys_exit_*` tracepoints of the memory calls, `exceptions:page_fault_user`
//!   and `page_fault_kernel` (user addresses only), `sched:sched_process_fork`,
//!   `_exec` and `_exit`, and (`-d`) a `PERF_RECORD_MMAP2` for every mapping,
//!   which names its file. Following children is perf's inheritance.
//! * This process, as the ptrace tracer of everything the program starts
//!   (`PTRACE_SEIZE` with the fork, vfork, clone, exec and exit events, and
//!   never a system-call stop, so the program runs at its own speed
//!   between them), reads what perf cannot: at each exec the arguments, the
//!   environment and /proc/PID/maps (the address space `execve` built); at
//!   each clone whether it made a thread, a process or a vfork child; at
//!   each thread's exit the process's figures from /proc/PID/status.
//!
//! perf's workload is this binary's hidden `trace-stub`, which writes its
//! pid to the recorder, waits until it is seized, turns address-space
//! randomisation off (`setarch -R`) and execs the program. The two
//! observers' records are joined by process and order (the k-th exec of a
//! pid in perf's stream is the k-th the tracer saw), never by clock.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use super::format::{Access, Call, Event, Figures, Sys, Trace, TraceFile, What};

/// The whole environment of a program recorded with `--clean-env`.
const CLEAN_PATH: &str = "/usr/bin:/bin";

/// The highest user address on x86-64 (4-level paging), for the filter on
/// kernel-mode faults.
const TASK_SIZE: u64 = 0x7fff_ffff_f000;

/// The tracepoints recorded, those of the memory calls filtered to the
/// ones this kernel has.
fn events() -> Vec<String> {
    let have = |sys: &str| {
        Path::new("/sys/kernel/tracing/events/syscalls")
            .join(format!("sys_enter_{sys}"))
            .exists()
            || Path::new("/sys/kernel/debug/tracing/events/syscalls")
                .join(format!("sys_enter_{sys}"))
                .exists()
    };
    let mut ev = vec![
        "exceptions:page_fault_user".to_string(),
        "exceptions:page_fault_kernel".to_string(),
        format!("--filter=address < {TASK_SIZE:#x}"),
        "sched:sched_process_fork".into(),
        "sched:sched_process_exec".into(),
        "sched:sched_process_exit".into(),
    ];
    for sys in Sys::ALL {
        if have(sys.name()) {
            ev.push(format!("syscalls:sys_enter_{}", sys.name()));
            ev.push(format!("syscalls:sys_exit_{}", sys.name()));
        }
    }
    ev
}

/// Why this host cannot record, if it cannot.
pub fn unavailable() -> Option<String> {
    match Command::new("perf").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => return Some("`perf` is not installed (the linux-perf package)".into()),
    }
    let tp = [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ];
    if !tp
        .iter()
        .any(|p| Path::new(p).join("exceptions/page_fault_user").exists())
    {
        return Some("the kernel's tracepoints are not readable (tracefs, root)".into());
    }
    None
}

/// What the tracer read at an exec stop: argv, env, /proc/PID/maps lines.
type ExecNotes = (Vec<String>, Vec<String>, Vec<String>);

/// Each VMA's start, end and resident kB.
type VmaRss = Vec<(u64, u64, u64)>;

/// What the tracer learnt about the processes and threads.
#[derive(Default)]
struct Tracer {
    /// Each pid's execs, in order.
    execs: HashMap<i32, VecDeque<ExecNotes>>,
    /// What made each new task.
    children: HashMap<i32, ChildKind>,
    /// The latest figures of each thread group, and its VMAs' resident
    /// sizes, read at a thread's exit.
    figures: HashMap<i32, (Figures, VmaRss)>,
}

#[derive(Clone, Copy, Debug)]
enum ChildKind {
    Fork,
    Vfork,
    Thread,
}

fn pipe() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe(2) to fill.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: pipe(2) returned two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn set_cloexec(fd: &OwnedFd) {
    // SAFETY: fcntl on a descriptor this process owns.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// `usermm trace record -o OUT -- CMD...`.
pub fn record(out: &Path, cmd: &[String], clean_env: bool) -> anyhow::Result<Trace> {
    if let Some(why) = unavailable() {
        bail!("cannot record here: {why}");
    }
    if cmd.is_empty() {
        bail!("no program given: usermm trace record -- CMD [ARGS]");
    }
    let dir = std::env::temp_dir().join(format!("usermm-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
    let res = record_in(&dir, cmd, clean_env);
    let _ = std::fs::remove_dir_all(&dir);
    let trace = res?;
    trace.save(out)?;
    Ok(trace)
}

fn record_in(dir: &Path, cmd: &[String], clean_env: bool) -> anyhow::Result<Trace> {
    let data = dir.join("perf.data");
    // The stub's ends are inherited through perf; ours close on exec.
    let (pid_r, pid_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    set_cloexec(&pid_r);
    set_cloexec(&go_w);
    let exe = std::env::current_exe().context("this program's path")?;
    let mut perf = Command::new("perf");
    perf.args(["record", "-q", "-d", "-m", "16M", "-o"])
        .arg(&data)
        .args(events().iter().flat_map(|e| {
            if e.starts_with("--") {
                vec![e.clone()]
            } else {
                vec!["-e".to_string(), e.clone()]
            }
        }))
        .arg("--")
        .arg(&exe)
        .arg("trace-stub")
        .arg(pid_w.as_raw_fd().to_string())
        .arg(go_r.as_raw_fd().to_string())
        .args(clean_env.then_some("--clean-env"))
        .arg("--")
        .args(cmd);
    // Ctrl-C reaches the program and perf (its process group): the
    // program ends, perf writes what it has, and the recorder, which
    // only notes the signal, writes the partial trace.
    // SAFETY: installing a handler that does nothing (async-signal-safe);
    // a handler, unlike SIG_IGN, is not inherited across exec.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
    let child = perf.spawn().context("starting perf")?;
    drop(pid_w);
    drop(go_r);
    let perf_pid = child.id() as i32;
    // One line, not to the end: perf holds the write end open too.
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(std::fs::File::from(pid_r)),
        &mut line,
    )
    .ok();
    let stub: i32 = match line.trim().parse() {
        Ok(p) => p,
        Err(_) => {
            let status = wait_pid(perf_pid);
            bail!("perf record did not start the program (perf exit status {status})");
        }
    };
    let mut tracer = Tracer::default();
    let opts = libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACECLONE
        | libc::PTRACE_O_TRACEEXEC
        | libc::PTRACE_O_TRACEEXIT
        | libc::PTRACE_O_EXITKILL;
    // SAFETY: PTRACE_SEIZE of a process this one started (through perf);
    // the options word is the data argument, as ptrace(2) defines it.
    let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, stub, 0, opts as libc::c_long) };
    let mut go = std::fs::File::from(go_w);
    if r != 0 {
        let e = std::io::Error::last_os_error();
        drop(go);
        wait_pid(perf_pid);
        bail!("ptrace of the program: {e}");
    }
    go.write_all(b"g").ok();
    drop(go);
    // perf exits with the program's status: a program that fails is
    // still recorded; only a missing perf.data is perf's own failure.
    let perf_status = trace_loop(&mut tracer, stub, perf_pid)?;
    if !data.exists() {
        bail!("perf record failed (exit status {perf_status})");
    }
    let script = Command::new("perf")
        .args(["script", "-F", "pid,tid,time,event,trace"])
        .args(["--show-mmap-events", "--show-lost-events", "-i"])
        .arg(&data)
        .output()
        .context("perf script")?;
    if !script.status.success() {
        bail!(
            "perf script: {}",
            String::from_utf8_lossy(&script.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&script.stdout);
    let mut trace = assemble(&text, stub, tracer)?;
    trace.cmd = cmd.to_vec();
    trace.knobs = thp_knobs();
    trace.kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    Ok(trace)
}

/// The host's THP settings, each the word /sys shows in brackets (or the
/// number).
pub fn thp_knobs() -> Vec<(String, String)> {
    let dir = Path::new("/sys/kernel/mm/transparent_hugepage");
    let read = |name: &str| -> Option<String> {
        let s = std::fs::read_to_string(dir.join(name)).ok()?;
        let s = s.trim();
        Some(match (s.find('['), s.find(']')) {
            (Some(a), Some(b)) if a < b => s[a + 1..b].to_string(),
            _ => s.to_string(),
        })
    };
    let mut names: Vec<String> = vec![
        "enabled".into(),
        "shmem_enabled".into(),
        "use_zero_page".into(),
    ];
    let mut sizes: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()
        })
        .collect();
    sizes.sort_unstable();
    for kb in sizes {
        names.push(format!("hugepages-{kb}kB/enabled"));
        names.push(format!("hugepages-{kb}kB/shmem_enabled"));
    }
    names
        .into_iter()
        .filter_map(|n| Some((n.clone(), read(&n)?)))
        .collect()
}

extern "C" fn on_sigint(_: libc::c_int) {}

/// waitpid for `pid`: its exit status (128 + signal if killed).
fn wait_pid(pid: i32) -> i32 {
    let mut st = 0;
    // SAFETY: waitpid on a child of this process with a valid status
    // pointer.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    decode_exit(st)
}

fn decode_exit(st: i32) -> i32 {
    if libc::WIFEXITED(st) {
        libc::WEXITSTATUS(st)
    } else {
        128 + libc::WTERMSIG(st)
    }
}

/// Follow the tracees until every one has gone and perf has exited: perf's
/// exit status.
fn trace_loop(tracer: &mut Tracer, stub: i32, perf_pid: i32) -> anyhow::Result<i32> {
    let mut live: std::collections::HashSet<i32> = [stub].into();
    let mut perf_status = None;
    while perf_status.is_none() || !live.is_empty() {
        let mut st = 0;
        // SAFETY: waitpid with a valid status pointer; __WALL takes the
        // tracees (which are not this process's children) and perf.
        let pid = unsafe { libc::waitpid(-1, &mut st, libc::__WALL) };
        if pid < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            if e.raw_os_error() == Some(libc::ECHILD) {
                break;
            }
            bail!("waitpid: {e}");
        }
        if pid == perf_pid && !libc::WIFSTOPPED(st) {
            perf_status = Some(decode_exit(st));
            continue;
        }
        if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
            live.remove(&pid);
            continue;
        }
        if !libc::WIFSTOPPED(st) {
            continue;
        }
        live.insert(pid);
        let sig = libc::WSTOPSIG(st);
        let event = (st >> 16) & 0xff;
        let mut deliver = 0;
        match event {
            libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE => {
                let child = event_msg(pid) as i32;
                live.insert(child);
                let kind = match event {
                    libc::PTRACE_EVENT_FORK => ChildKind::Fork,
                    libc::PTRACE_EVENT_VFORK => ChildKind::Vfork,
                    _ if tgid(child) == tgid(pid) => ChildKind::Thread,
                    _ => ChildKind::Fork,
                };
                tracer.children.insert(child, kind);
            }
            libc::PTRACE_EVENT_EXEC => {
                let argv = proc_strings(pid, "cmdline");
                let env = proc_strings(pid, "environ");
                let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
                    .unwrap_or_default()
                    .lines()
                    .map(normalise_maps_line)
                    .collect();
                tracer
                    .execs
                    .entry(pid)
                    .or_default()
                    .push_back((argv, env, maps));
            }
            libc::PTRACE_EVENT_EXIT => {
                if let Some((g, fig)) = read_figures(pid) {
                    tracer.figures.insert(g, (fig, read_vma_rss(pid)));
                }
            }
            libc::PTRACE_EVENT_STOP => {
                if sig != libc::SIGTRAP {
                    // A group stop: stay stopped until SIGCONT, as without
                    // a tracer.
                    // SAFETY: PTRACE_LISTEN on a seized tracee in a group
                    // stop.
                    unsafe { libc::ptrace(libc::PTRACE_LISTEN, pid, 0, 0) };
                    continue;
                }
            }
            _ => deliver = sig,
        }
        // SAFETY: PTRACE_CONT on a tracee in a ptrace stop, delivering
        // the signal it stopped for (0 for an event stop).
        unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, deliver as libc::c_long) };
    }
    Ok(perf_status.unwrap_or(0))
}

fn event_msg(pid: i32) -> u64 {
    let mut msg: libc::c_ulong = 0;
    // SAFETY: PTRACE_GETEVENTMSG stores one unsigned long at the pointer.
    unsafe {
        libc::ptrace(
            libc::PTRACE_GETEVENTMSG,
            pid,
            0,
            &mut msg as *mut libc::c_ulong,
        )
    };
    msg as u64
}

fn status_field(status: &str, name: &str) -> Option<i64> {
    status.lines().find_map(|l| {
        let v = l.strip_prefix(name)?.strip_prefix(':')?;
        v.split_whitespace().next()?.parse().ok()
    })
}

fn tgid(pid: i32) -> i32 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status_field(&s, "Tgid").unwrap_or(pid as i64) as i32
}

fn proc_strings(pid: i32, file: &str) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// A maps line with its fields separated by single spaces.
pub fn normalise_maps_line(l: &str) -> String {
    l.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The thread group's figures, read at one of its threads' exit stops.
fn read_figures(pid: i32) -> Option<(i32, Figures)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let g = status_field(&status, "Tgid")? as i32;
    let vmas = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .ok()?
        .lines()
        .count() as i64;
    let mut v: Vec<(String, i64)> = Figures::NAMES[..7]
        .iter()
        .map(|n| (n.to_string(), status_field(&status, n).unwrap_or(0)))
        .collect();
    // A kernel thread or a process whose mm has gone has no Vm lines.
    status_field(&status, "VmSize")?;
    v.push(("VMAs".into(), vmas));
    Some((g, Figures(v)))
}

/// Each VMA's start, end and `Rss` (kB) from /proc/PID/smaps, where it
/// has any.
fn read_vma_rss(pid: i32) -> VmaRss {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut out = Vec::new();
    let mut range = None;
    for l in smaps.lines() {
        if let Some(kb) = l.strip_prefix("Rss:") {
            let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            if let Some((s, e)) = range.take() {
                if kb > 0 {
                    out.push((s, e, kb));
                }
            }
        } else if let Some((s, e)) = l
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'))
            .and_then(|(s, e)| Some((hex(s)?, hex(e)?)))
        {
            if !l.contains(':') || l.split_whitespace().count() >= 5 {
                range = Some((s, e));
            }
        }
    }
    out
}

/// One line of `perf script` output, split.
struct PerfLine<'a> {
    pid: i32,
    tid: i32,
    time_us: u64,
    event: &'a str,
    rest: &'a str,
}

fn parse_perf_line(l: &str) -> Option<PerfLine<'_>> {
    let l = l.trim_start();
    let (ids, r) = l.split_once(char::is_whitespace)?;
    let (pid, tid) = ids.split_once('/')?;
    let r = r.trim_start();
    let (time, r) = r.split_once(": ")?;
    let (secs, frac) = time.trim().split_once('.')?;
    let frac = format!("{frac:0<6}");
    let time_us = secs.parse::<u64>().ok()? * 1_000_000 + frac[..6].parse::<u64>().ok()?;
    let r = r.trim_start();
    let (event, rest) = r.split_once(' ').unwrap_or((r, ""));
    Some(PerfLine {
        pid: pid.parse().ok()?,
        tid: tid.parse().ok()?,
        time_us,
        event: event.trim_end_matches(':'),
        rest: rest.trim(),
    })
}

/// `name=value` fields of a tracepoint line (`filename=/x pid=1`).
fn kv<'a>(rest: &'a str, key: &str) -> Option<&'a str> {
    rest.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// A `PERF_RECORD_MMAP2` line's start, device, inode and path:
/// `PID/TID: [0xADDR(0xLEN) @ PGOFF MAJ:MIN INO GEN]: PROT PATH`.
fn parse_mmap2(rest: &str) -> Option<(u64, String, u64, String)> {
    let (_, r) = rest.split_once('[')?;
    let (inner, r) = r.split_once("]: ")?;
    let addr = hex(inner.split('(').next()?)?;
    let mut w = inner.split_once(" @ ")?.1.split_whitespace();
    w.next()?;
    let dev = w.next()?.to_string();
    let ino = w.next()?.parse().ok()?;
    let (_, path) = r.split_once(' ')?;
    Some((addr, dev, ino, path.to_string()))
}

/// Build the trace from perf's stream and the tracer's notes.
fn assemble(text: &str, root: i32, mut tracer: Tracer) -> anyhow::Result<Trace> {
    let mut t = Trace::default();
    let mut started = false;
    let mut root_execs = 0;
    let mut t0 = None;
    // Each thread's system call in flight: its call and arguments, and
    // the file an mmap mapped.
    let mut pending: HashMap<i32, (Sys, Vec<u64>)> = HashMap::new();
    let mut mapped: HashMap<i32, (u64, u32)> = HashMap::new();
    let mut files: BTreeMap<(String, u64), TraceFile> = BTreeMap::new();
    // Each thread's kernel-mode faults since its last other event: those
    // that come right before an exec are the exec's own (clearing the
    // new program's bss, writing its stack) and belong after it, in the
    // new address space (sched_process_exec fires as exec ends).
    let mut kfaults: HashMap<i32, Vec<usize>> = HashMap::new();
    let mut moved: std::collections::HashSet<usize> = Default::default();
    for line in text.lines() {
        if line.contains("PERF_RECORD_LOST") {
            t.lost += 1;
            continue;
        }
        let Some(p) = parse_perf_line(line) else {
            continue;
        };
        if !started {
            // The stub's own exec comes first (perf enables the events at
            // it); the program's is the root's second.
            if p.event == "sched:sched_process_exec" && p.pid == root {
                root_execs += 1;
                started = root_execs == 2;
            }
            if !started {
                continue;
            }
        }
        let t_us = p.time_us - *t0.get_or_insert(p.time_us);
        let mut push = |what: What| {
            let k = kfaults.entry(p.tid).or_default();
            if matches!(what, What::Fault { kernel: true, .. }) {
                k.push(t.events.len());
            } else if matches!(what, What::Exec { .. }) {
                for &i in k.iter() {
                    moved.insert(i);
                }
            } else if !matches!(what, What::Vma(_)) {
                k.clear();
            }
            t.events.push(Event {
                t_us,
                pid: p.pid,
                tid: p.tid,
                what,
            })
        };
        match p.event {
            "exceptions:page_fault_user" | "exceptions:page_fault_kernel" => {
                let (Some(addr), Some(code)) = (
                    kv(p.rest, "address").and_then(hex),
                    kv(p.rest, "error_code").and_then(hex),
                ) else {
                    continue;
                };
                if addr >= TASK_SIZE {
                    continue;
                }
                push(What::Fault {
                    addr,
                    access: Access::from_error_code(code),
                    kernel: p.event.ends_with("kernel"),
                });
            }
            "sched:sched_process_exec" => {
                let (argv, env, maps) = tracer
                    .execs
                    .get_mut(&p.pid)
                    .and_then(VecDeque::pop_front)
                    .unwrap_or_default();
                let path = kv(p.rest, "filename").unwrap_or_default().to_string();
                push(What::Exec { path, argv, env });
                for m in maps {
                    push(What::Vma(m));
                }
                for i in kfaults.remove(&p.tid).unwrap_or_default() {
                    let e = Event {
                        t_us,
                        ..t.events[i].clone()
                    };
                    t.events.push(e);
                }
            }
            "sched:sched_process_fork" => {
                let Some(child) = kv(p.rest, "child_pid").and_then(|c| c.parse().ok()) else {
                    continue;
                };
                push(match tracer.children.get(&child) {
                    Some(ChildKind::Thread) => What::Thread { child },
                    Some(ChildKind::Vfork) => What::Vfork { child },
                    _ => What::Fork { child },
                });
            }
            "sched:sched_process_exit" => {
                let group = kv(p.rest, "group_dead") == Some("true");
                if group {
                    if let Some((f, rss)) = tracer.figures.remove(&p.pid) {
                        for (start, end, kb) in rss {
                            push(What::Rss { start, end, kb });
                        }
                        push(What::Figures(f));
                    }
                }
                push(What::Exit { group });
            }
            "PERF_RECORD_MMAP2" => {
                let Some((addr, dev, ino, path)) = parse_mmap2(p.rest) else {
                    continue;
                };
                if ino == 0 || !path.starts_with('/') {
                    continue;
                }
                let next = files.len() as u32 + 1;
                let f = files
                    .entry((dev.clone(), ino))
                    .or_insert_with(|| TraceFile {
                        id: next,
                        dev,
                        ino,
                        size: 0,
                        hash: 0,
                        path: path.trim_end_matches(" (deleted)").to_string(),
                        cached: None,
                    });
                mapped.insert(p.tid, (addr, f.id));
            }
            ev => {
                if let Some(name) = ev.strip_prefix("syscalls:sys_enter_") {
                    let Some(sys) = Sys::from_name(name) else {
                        continue;
                    };
                    let args = p
                        .rest
                        .split(", ")
                        .filter_map(|a| hex(a.split_once(": ")?.1))
                        .collect();
                    pending.insert(p.tid, (sys, args));
                    mapped.remove(&p.tid);
                } else if let Some(name) = ev.strip_prefix("syscalls:sys_exit_") {
                    let Some((sys, args)) = pending.remove(&p.tid) else {
                        continue;
                    };
                    if sys.name() != name || args.len() != sys.arg_names().len() {
                        continue;
                    }
                    let ret = hex(p.rest).unwrap_or(0) as i64;
                    let file = match mapped.remove(&p.tid) {
                        Some((addr, id)) if sys == Sys::Mmap && addr as i64 == ret => Some(id),
                        _ => None,
                    };
                    push(What::Call(Call {
                        sys,
                        args,
                        ret,
                        file,
                    }));
                }
            }
        }
    }
    if !started {
        bail!("the program did not start (perf recorded no exec of it)");
    }
    if !moved.is_empty() {
        let events = std::mem::take(&mut t.events);
        t.events = events
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !moved.contains(i))
            .map(|(_, e)| e)
            .collect();
    }
    for f in files.values_mut() {
        f.size = file_size(&f.path, &f.dev, f.ino);
        if f.size > 0 {
            f.hash = super::format::content_hash(Path::new(&f.path)).unwrap_or(0);
            f.cached = page_cache_residency(Path::new(&f.path), f.size);
        }
    }
    t.files = files.into_values().collect();
    t.files.sort_by_key(|f| f.id);
    Ok(t)
}

/// Which pages of the file the host's page cache holds (`mincore` of a
/// mapping of it, which reads nothing), as ranges.
fn page_cache_residency(path: &Path, size: u64) -> Option<Vec<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).ok()?;
    let pages = size.div_ceil(4096);
    // SAFETY: a fresh read-only shared mapping of an open file, unmapped
    // below; nothing reads through it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let mut vec = vec![0u8; pages as usize];
    // SAFETY: `p` maps `size` bytes; `vec` has a byte per page.
    let r = unsafe { libc::mincore(p, size as usize, vec.as_mut_ptr()) };
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(p, size as usize) };
    if r != 0 {
        return None;
    }
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (i, b) in vec.iter().enumerate() {
        if b & 1 == 0 {
            continue;
        }
        let i = i as u64;
        match out.last_mut() {
            Some(last) if last.1 == i => last.1 = i + 1,
            _ => out.push((i, i + 1)),
        }
    }
    Some(out)
}

/// The file's size now, if the path still names that file.
fn file_size(path: &str, dev: &str, ino: u64) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(path) else {
        return 0;
    };
    let (maj, min) = (libc::major(m.dev()), libc::minor(m.dev()));
    if format!("{maj:02x}:{min:02x}") != dev || m.ino() != ino {
        return 0;
    }
    m.size()
}

/// `usermm trace-stub W R -- CMD...`: perf's workload. Write this pid to
/// W, wait for a byte on R (the recorder has seized it), turn
/// randomisation off and exec CMD. Only returns on failure.
pub fn stub(w: i32, r: i32, clean_env: bool, cmd: &[String]) -> anyhow::Result<i32> {
    // SAFETY: the descriptors were passed by the recorder for this use
    // and nothing else in this process owns them.
    let (mut w, mut r) = unsafe { (std::fs::File::from_raw_fd(w), std::fs::File::from_raw_fd(r)) };
    writeln!(w, "{}", std::process::id())?;
    drop(w);
    let mut b = [0u8];
    r.read_exact(&mut b).context("the recorder went away")?;
    drop(r);
    // SAFETY: personality(2) with the current persona plus
    // ADDR_NO_RANDOMIZE, as `setarch -R` sets it.
    unsafe {
        let cur = libc::personality(0xffff_ffff);
        libc::personality((cur | libc::ADDR_NO_RANDOMIZE) as libc::c_ulong);
    }
    let Some(prog) = cmd.first() else {
        bail!("no program");
    };
    let mut c = Command::new(prog);
    c.args(&cmd[1..]);
    if clean_env {
        c.env_clear().env("PATH", CLEAN_PATH);
    }
    let e = std::os::unix::process::CommandExt::exec(&mut c);
    eprintln!("usermm trace record: {prog}: {e}");
    Ok(127)
}

/// The default output file for a command: `NAME.trace.gz`.
pub fn default_out(cmd: &[String]) -> PathBuf {
    let name = cmd
        .first()
        .and_then(|c| Path::new(c).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "program".into());
    PathBuf::from(format!("{name}.trace.gz"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_lines_parse() {
        let p = parse_perf_line(
            "22660/22661 63028.923040:    syscalls:sys_enter_mmap: addr: 0x00000000, len: 0x00002000",
        )
        .unwrap();
        assert_eq!((p.pid, p.tid, p.time_us), (22660, 22661, 63028923040));
        assert_eq!(p.event, "syscalls:sys_enter_mmap");
        assert_eq!(p.rest, "addr: 0x00000000, len: 0x00002000");
        let m = parse_perf_line("22660/22660 63028.923095: PERF_RECORD_MMAP2 22660/22660: [0x7fa023bbb000(0x1e2000) @ 0 fe:00 326279 0]: r--p /usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        assert_eq!(
            parse_mmap2(m.rest).unwrap(),
            (
                0x7fa023bbb000,
                "fe:00".into(),
                326279,
                "/usr/lib/x86_64-linux-gnu/libc.so.6".into()
            )
        );
    }

    #[test]
    fn a_stream_assembles() {
        let text = "\
1/1 1.000000: sched:sched_process_exec: filename=/stub pid=1 old_pid=1
1/1 1.000010: exceptions:page_fault_user: address=0x1000 ip=0x1 error_code=0x6
1/1 2.000000: sched:sched_process_exec: filename=/bin/p pid=1 old_pid=1
1/1 2.000005: syscalls:sys_enter_mmap: addr: 0x00000000, len: 0x00001000, prot: 0x00000001, flags: 0x00000002, fd: 0x00000003, off: 0x00000000
1/1 2.000006: PERF_RECORD_MMAP2 1/1: [0x7000(0x1000) @ 0 fe:00 99 0]: r--p /etc/x
1/1 2.000007: syscalls:sys_exit_mmap: 0x7000
1/1 2.000008: exceptions:page_fault_user: address=0x7008 ip=0x1 error_code=0x4
1/1 2.000009: syscalls:sys_enter_munmap: addr: 0x00009000, len: 0x00001000
1/1 2.000010: syscalls:sys_exit_munmap: 0xffffffffffffffea
1/1 2.000020: sched:sched_process_fork: comm=p pid=1 child_comm=p child_pid=2
1/2 2.000030: sched:sched_process_exit: comm=p pid=2 prio=120 group_dead=false
1/1 2.000040: sched:sched_process_exit: comm=p pid=1 prio=120 group_dead=true
";
        let mut tr = Tracer::default();
        tr.execs.entry(1).or_default().push_back((
            vec!["p".into()],
            vec![],
            vec!["1000-2000 r--p 0 fe:00 98 /bin/p".into()],
        ));
        tr.children.insert(2, ChildKind::Thread);
        tr.figures.insert(
            1,
            (
                Figures(vec![("VmRSS".into(), 8)]),
                vec![(0x1000, 0x2000, 4)],
            ),
        );
        let t = assemble(text, 1, tr).unwrap();
        let shown: Vec<String> = t.events.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            shown,
            [
                "0 1/1 exec \"/bin/p\" argv=[\"p\"] env=[]",
                "0 1/1 vma \"1000-2000 r--p 0 fe:00 98 /bin/p\"",
                "7 1/1 mmap addr=0x0 len=0x1000 prot=0x1 flags=0x2 fd=0x3 off=0x0 = 0x7000 file=1",
                "8 1/1 fault 0x7008 r",
                "10 1/1 munmap addr=0x9000 len=0x1000 = -22",
                "20 1/1 thread 2",
                "30 1/2 exit",
                "40 1/1 rss 0x1000-0x2000 4",
                "40 1/1 figures VmRSS=8",
                "40 1/1 exit group",
            ]
        );
        assert_eq!(t.files[0].path, "/etc/x");
    }

    /// Kernel-mode faults just before an exec are the exec's own, made in
    /// the new address space: they move after it.
    #[test]
    fn an_execs_own_faults_follow_it() {
        let text = "\
1/1 1.000000: sched:sched_process_exec: filename=/stub pid=1 old_pid=1
1/1 2.000000: sched:sched_process_exec: filename=/bin/p pid=1 old_pid=1
1/1 2.000001: exceptions:page_fault_kernel: address=0x5000 ip=0x1 error_code=0x2
1/1 2.000002: exceptions:page_fault_user: address=0x6000 ip=0x1 error_code=0x4
1/1 2.000003: exceptions:page_fault_kernel: address=0x7000 ip=0x1 error_code=0x2
1/1 2.000004: sched:sched_process_exec: filename=/bin/q pid=1 old_pid=1
";
        let t = assemble(text, 1, Tracer::default()).unwrap();
        let shown: Vec<String> = t.events.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            shown,
            [
                "0 1/1 exec \"/bin/p\" argv=[] env=[]",
                "1 1/1 fault 0x5000 w k",
                "2 1/1 fault 0x6000 r",
                "4 1/1 exec \"/bin/q\" argv=[] env=[]",
                "4 1/1 fault 0x7000 w k",
            ]
        );
    }
}
