//! `usermm trace scenario`: a trace as a scenario file (docs/scenarios.md),
//! to read, cut down and edit by hand, or run with `usermm run`.
//!
//! Each event becomes the statement that does it: an exec `exec` (the
//! scenario's exec has no environment, so the stack holds fewer strings
//! than the recorded one), a call its statement with the recorded
//! arguments (addresses as numbers), a write fault `write`, any other
//! fault `read`, a new process or thread `fork`, `vfork` or `thread`, an
//! exit `exit`; a change of thread is a `switch`. What the kernel answered
//! and its figures at each exit are comments. Calls the language has no
//! statement for (`memfd_create`, `set_mempolicy`, `move_pages`, `mbind`
//! with its node mask in memory) are comments too.

use std::collections::HashMap;
use std::fmt::Write;

use super::format::{Access, Call, Sys, Trace, What};

/// `mmap` flags the scenario language names.
const MAP_FLAGS: [(u64, &str); 11] = [
    (0x20, "anonymous"),
    (0x10, "fixed"),
    (0x10_0000, "noreplace"),
    (0x4000, "noreserve"),
    (0x8000, "populate"),
    (0x2000, "locked"),
    (0x1_0000, "nonblock"),
    (0x100, "growsdown"),
    (0x2_0000, "stack"),
    (0x1, "shared"),
    (0x2, "private"),
];

/// madvise advice by number, as the language names it.
const ADVICE: [(u64, &str); 15] = [
    (0, "normal"),
    (3, "willneed"),
    (4, "dontneed"),
    (8, "free"),
    (9, "remove"),
    (10, "dontfork"),
    (11, "dofork"),
    (14, "hugepage"),
    (15, "nohugepage"),
    (18, "wipeonfork"),
    (19, "keeponfork"),
    (21, "pageout"),
    (22, "populate_read"),
    (23, "populate_write"),
    (25, "collapse"),
];

fn prot(p: u64) -> String {
    let s: String = [(1, 'r'), (2, 'w'), (4, 'x')]
        .iter()
        .filter(|(b, _)| p & b != 0)
        .map(|&(_, c)| c)
        .collect();
    if s.is_empty() {
        "none".into()
    } else {
        s
    }
}

fn map_flags(f: u64) -> String {
    let shared_validate = f & 3 == 3;
    let mut names: Vec<&str> = MAP_FLAGS
        .iter()
        .filter(|(b, n)| f & b != 0 && !(shared_validate && (*n == "shared" || *n == "private")))
        .map(|&(_, n)| n)
        .collect();
    if shared_validate {
        names.push("shared_validate");
    }
    names.join(",")
}

/// The scenario text of `t`.
pub fn to_scenario(t: &Trace) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# `{}`, recorded on Linux {}", t.cmd.join(" "), t.kernel);
    let _ = writeln!(s, "# made by `usermm trace scenario` (docs/traces.md)");
    let mut names: HashMap<i32, String> = HashMap::new();
    let mut opened: HashMap<u32, String> = HashMap::new();
    let mut cur = String::new();
    let mut regions = 0;
    if let Some(first) = t.events.first() {
        names.insert(first.pid, "main".into());
        cur = "main".into();
    }
    for ev in &t.events {
        let Some(name) = names.get(&ev.tid).cloned() else {
            continue;
        };
        if matches!(ev.what, What::Vma(_) | What::Rss { .. }) {
            continue;
        }
        if name != cur {
            let _ = writeln!(s, "switch {name}");
            cur = name.clone();
        }
        let line = match &ev.what {
            What::Exec { path, argv, .. } => {
                let args: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
                if args
                    .iter()
                    .any(|a| a.is_empty() || a.contains(char::is_whitespace))
                {
                    format!("# exec {path} with arguments a scenario cannot write: {argv:?}")
                } else {
                    format!("exec {path} {}", args.join(" "))
                        .trim_end()
                        .to_string()
                }
            }
            What::Fork { child } | What::Vfork { child } | What::Thread { child } => {
                let (verb, child_name) = match ev.what {
                    What::Thread { .. } => ("thread", format!("t{child}")),
                    What::Vfork { .. } => ("vfork", format!("p{child}")),
                    _ => ("fork", format!("p{child}")),
                };
                names.insert(*child, child_name.clone());
                format!("{verb} {child_name}")
            }
            What::Exit { group } => {
                if ev.tid != ev.pid {
                    names.remove(&ev.tid);
                    format!("exit {name}")
                } else if *group {
                    names.retain(|_, n| !n.starts_with('t') || n == &name);
                    names.remove(&ev.tid);
                    format!("exit {name}")
                } else {
                    "# the first thread exits before the others".into()
                }
            }
            What::Figures(f) => {
                let v: Vec<String> = f.0.iter().map(|(n, v)| format!("{n}={v}")).collect();
                format!("# the kernel's figures at exit: {}", v.join(" "))
            }
            What::Fault { addr, access, .. } => match access {
                Access::Write => format!("write {:#x} 1", addr & !7),
                Access::Read | Access::Exec => format!("read {:#x}", addr & !7),
            },
            What::Call(c) => call(c, &mut opened, &mut regions, t),
            What::Vma(_) | What::Rss { .. } => unreachable!("skipped above"),
        };
        let _ = writeln!(s, "{line}");
    }
    s
}

/// A call's statement, with the kernel's answer as a comment.
fn call(c: &Call, opened: &mut HashMap<u32, String>, regions: &mut u32, t: &Trace) -> String {
    let a = |n| c.arg(n);
    let answer = match c.errno() {
        Some(e) => format!("  # the kernel: {}", usermm::Errno(e).name()),
        None if matches!(c.sys, Sys::Mmap | Sys::Mremap | Sys::Brk) => {
            format!("  # the kernel: {:#x}", c.ret)
        }
        None => String::new(),
    };
    let stmt = match c.sys {
        Sys::Mmap => {
            let mut pre = String::new();
            let file = if a("flags") & 0x20 == 0 {
                let Some(id) = c.file else {
                    return format!("# mmap of a file the trace does not name{answer}");
                };
                let name = opened.entry(id).or_insert_with(|| {
                    let path = t
                        .files
                        .iter()
                        .find(|f| f.id == id)
                        .map_or("", |f| f.path.as_str());
                    pre = format!("open f{id} {path}\n");
                    format!("f{id}")
                });
                format!(" file={name} off={:#x}", a("off"))
            } else {
                String::new()
            };
            *regions += 1;
            let at = if a("addr") != 0 {
                format!(" at={:#x}", a("addr"))
            } else {
                String::new()
            };
            format!(
                "{pre}map m{regions} {:#x} {}{at} flags={}{file}",
                a("len"),
                prot(a("prot")),
                map_flags(a("flags"))
            )
        }
        Sys::Munmap => format!("munmap {:#x} {:#x}", a("addr"), a("len")),
        Sys::Mprotect => format!(
            "mprotect {:#x} {:#x} {}",
            a("start"),
            a("len"),
            prot(a("prot"))
        ),
        Sys::Madvise => match ADVICE.iter().find(|(n, _)| *n == a("behavior")) {
            Some((_, adv)) => format!("madvise {:#x} {:#x} {adv}", a("start"), a("len_in")),
            None => format!("# madvise with advice {}", a("behavior")),
        },
        Sys::Brk => match a("brk") {
            0 => "brk".into(),
            b => format!("brk {b:#x}"),
        },
        Sys::Mremap => {
            let f = a("flags");
            let mut w = format!(
                "mremap {:#x} {:#x} {:#x}",
                a("addr"),
                a("old_len"),
                a("new_len")
            );
            if f & 1 != 0 {
                w += " maymove";
            }
            if f & 2 != 0 {
                let _ = write!(w, " fixed={:#x}", a("new_addr"));
            }
            if f & 4 != 0 {
                w += " dontunmap";
            }
            w
        }
        Sys::Mlock => format!("mlock {:#x} {:#x}", a("start"), a("len")),
        Sys::Mlock2 => format!(
            "mlock {:#x} {:#x}{}",
            a("start"),
            a("len"),
            if a("flags") & 1 != 0 { " onfault" } else { "" }
        ),
        Sys::Munlock => format!("munlock {:#x} {:#x}", a("start"), a("len")),
        Sys::Mlockall => format!("mlockall {}", a("flags")),
        Sys::Munlockall => "munlockall".into(),
        Sys::Msync => {
            let f = a("flags");
            let mut w = format!("msync {:#x} {:#x}", a("start"), a("len"));
            if f & 4 != 0 {
                w += " sync";
            } else if f & 1 != 0 {
                w += " async";
            }
            if f & 2 != 0 {
                w += " invalidate";
            }
            w
        }
        Sys::MemfdCreate | Sys::Mbind | Sys::SetMempolicy | Sys::MovePages => {
            format!("# {} (not written as a statement)", c.sys.name())
        }
    };
    format!("{stmt}{answer}")
}
