//! A native run's processes (the scenario's servers) never outlive it: a run
//! killed in the middle of a long request leaves no process behind, lets
//! whoever reads its output see the output end, and does not keep the lock
//! that serialises native runs.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A folder of the test's own in the temp dir, removed when it is
/// dropped, also when an assertion fails first (a failed run left them
/// behind otherwise).
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("usermm-native-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The processes whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // The parent is the second field after the parenthesised name.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// Whether `pid` still runs (a zombie has exited: its memory and
/// descriptors are gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !matches!(
            s.rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next()),
            Some('Z' | 'X')
        )
    })
}

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

#[test]
fn a_killed_native_run_leaves_nothing_behind() {
    let dir = ScratchDir::new("kill");
    // Populating 2 GiB takes the host seconds: the run is killed inside
    // that one request, which a forked process serves, its parent waiting
    // for requests beside.
    let long = dir.join("long.scn");
    std::fs::write(
        &long,
        "map A 4K rw at=0x600000000000\nfork child\nswitch child\n\
         map B 2G rw flags=private,anonymous,populate\n",
    )
    .unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["run", "--native"])
        .arg(&long)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, err) = (run.stdout.take().unwrap(), run.stderr.take().unwrap());
    // The main server and the child it forked (the run prints nothing
    // before it ends), not the guardian that puts the host's settings back
    // (every native run holds khugepaged asleep).
    let guardian = |p: &u32| {
        std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
            c.windows(b"restore-host-settings".len())
                .any(|w| w == b"restore-host-settings")
        })
    };
    let servers = || -> Vec<u32> {
        children_of(run.id())
            .into_iter()
            .filter(|p| !guardian(p))
            .flat_map(|s| std::iter::once(s).chain(children_of(s)))
            .collect()
    };
    assert!(
        wait_until(Duration::from_secs(20), || servers().len() == 2),
        "the scenario's two processes did not appear: {:?}",
        servers()
    );
    let servers = servers();
    let killed = run.id();
    // Into the populate.
    std::thread::sleep(Duration::from_millis(300));
    run.kill().unwrap();
    run.wait().unwrap();
    // Whoever reads the output sees it end: no server holds it.
    let (tx, rx) = mpsc::channel();
    for mut stream in [Box::new(out) as Box<dyn Read + Send>, Box::new(err)] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest);
            let _ = tx.send(());
        });
    }
    for _ in 0..2 {
        assert!(
            rx.recv_timeout(Duration::from_millis(1500)).is_ok(),
            "the killed run's output did not end: a server keeps it open"
        );
    }
    assert!(
        wait_until(Duration::from_millis(1500), || !servers
            .iter()
            .any(|&p| alive(p))),
        "servers outlived the killed run: {:?}",
        servers.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
    );
    // The next native run gets the lock at once.
    let short = dir.join("short.scn");
    std::fs::write(
        &short,
        "map A 4K rw at=0x600000000000\nwrite A 1\nexpect A == 1\n",
    )
    .unwrap();
    let mut next = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["run", "--native"])
        .arg(&short)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let ended = wait_until(Duration::from_secs(10), || {
        next.try_wait().unwrap().is_some()
    });
    if !ended {
        next.kill().unwrap();
    }
    assert!(
        ended,
        "the next native run waited for the killed run's lock"
    );
    assert!(next.wait().unwrap().success());
    // Nor does the killed run's FIFO folder outlive the next run.
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("usermm-scenario-{killed}-")))
        .collect();
    assert!(left.is_empty(), "the killed run's folder is left: {left:?}");
}

/// A native run killed in the middle puts back the THP knobs it changed:
/// its guardian does, once the run is gone (skipped where this process
/// cannot write the knobs).
#[test]
fn a_killed_native_run_puts_the_host_knobs_back() {
    let knob = "/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled";
    let Ok(before) = std::fs::read_to_string(knob) else {
        return;
    };
    if std::fs::OpenOptions::new().write(true).open(knob).is_err() {
        return;
    }
    let dir = ScratchDir::new("knobs");
    let long = dir.join("long.scn");
    std::fs::write(
        &long,
        "knob only 64K\nmap A 4K rw at=0x600000000000\n\
         map B 2G rw flags=private,anonymous,populate\n",
    )
    .unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["run", "--native"])
        .arg(&long)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let set = wait_until(Duration::from_secs(20), || {
        std::fs::read_to_string(knob).is_ok_and(|s| s.contains("[always]"))
    });
    std::thread::sleep(Duration::from_millis(200));
    run.kill().unwrap();
    run.wait().unwrap();
    assert!(set, "the run did not set {knob}");
    assert!(
        wait_until(Duration::from_secs(3), || {
            std::fs::read_to_string(knob).is_ok_and(|s| s == before)
        }),
        "{knob} was left at {:?}, not put back to {before:?}",
        std::fs::read_to_string(knob)
    );
}

/// A native run that runs out of file descriptors while it makes the
/// scenario's processes says so, on the statement that could not be run,
/// and leaves no process behind.
#[test]
fn running_out_of_file_descriptors_is_a_clear_error() {
    let dir = ScratchDir::new("nofile");
    let forks = dir.join("forks.scn");
    let text: String = (0..40).map(|i| format!("fork c{i}\n")).collect();
    std::fs::write(&forks, format!("map A 4K rw at=0x600000000000\n{text}")).unwrap();
    // Room for the run's own files and a few processes' FIFOs, not 40.
    let run = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 24 && exec {} run --native {}",
            env!("CARGO_BIN_EXE_usermm"),
            forks.display()
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = run.id();
    let out = run.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL") && l.contains("fork c") && !l.contains("unexpected")),
        "no clear failure of a fork: {text}"
    );
    assert!(
        text.contains("Too many open files") || text.contains("FIFO"),
        "the failure does not say what ran out: {text}"
    );
    // Its servers are forks of it: they run with its command line.
    let left = || -> Vec<u32> {
        let mut v = vec![];
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            if p != pid && alive(p) && String::from_utf8_lossy(&cmd).contains("forks.scn") {
                v.push(p);
            }
        }
        v
    };
    assert!(
        wait_until(Duration::from_secs(3), || left().is_empty()),
        "processes outlived the run: {:?}",
        left()
    );
}
