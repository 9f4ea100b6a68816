//! Host settings put back however this process ends.
//!
//! Benchmarks and native scenarios change the host's THP knobs and put them
//! back when they finish; a process killed in the middle (Ctrl-C, SIGTERM,
//! SIGKILL) puts back nothing, and the host would keep its changes. So the
//! first change starts a guardian: this program again
//! (`usermm restore-host-settings`, hidden), whose standard input is a pipe
//! from this process. Each setting's value from before this process first
//! changed it is written there, and each one this process puts back itself
//! is struck off; when the pipe closes (this process is gone, however it
//! ended) the guardian writes back what is left, the latest change first.
//! It ignores SIGINT and SIGHUP, which a terminal sends to the whole
//! process group.

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Mutex;

struct Guardian {
    to: ChildStdin,
    /// The settings it holds a value of.
    held: HashSet<String>,
}

/// None until the first change; Some(None) if no guardian could be started.
static GUARDIAN: Mutex<Option<Option<Guardian>>> = Mutex::new(None);

fn start() -> Option<Guardian> {
    // A test harness is not this program: it has no guardian to run.
    if cfg!(test) {
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    let child = Command::new(exe)
        .arg("restore-host-settings")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    match child {
        Ok(mut c) => Some(Guardian {
            to: c.stdin.take()?,
            held: HashSet::new(),
        }),
        Err(e) => {
            eprintln!("usermm: host settings will not be put back if this run is killed: {e}");
            None
        }
    }
}

fn with_guardian(f: impl FnOnce(&mut Guardian)) {
    let mut g = GUARDIAN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(g) = g.get_or_insert_with(start) {
        f(g);
    }
}

/// `path` is about to change from `old`: the guardian keeps `old` unless it
/// holds a value for `path` already (the first is the host's own).
pub fn changing(path: &str, old: &str) {
    with_guardian(|g| {
        if g.held.insert(path.to_string()) {
            let _ = writeln!(g.to, "set\t{path}\t{old}");
        }
    });
}

/// `path` was put back: the guardian forgets it.
pub fn restored(path: &str) {
    with_guardian(|g| {
        if g.held.remove(path) {
            let _ = writeln!(g.to, "restored\t{path}");
        }
    });
}

/// The guardian: read the changes until the pipe closes, then write back
/// what was not restored.
pub fn main() -> anyhow::Result<i32> {
    // SAFETY: setting a signal's disposition to SIG_IGN has no other effect.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    let mut held: Vec<(String, String)> = vec![];
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut w = line.split('\t');
        match (w.next(), w.next(), w.next()) {
            (Some("set"), Some(path), Some(old)) => held.push((path.into(), old.into())),
            (Some("restored"), Some(path), None) => held.retain(|(p, _)| p != path),
            _ => {}
        }
    }
    for (path, old) in held.iter().rev() {
        let _ = std::fs::write(path, old);
    }
    Ok(0)
}
