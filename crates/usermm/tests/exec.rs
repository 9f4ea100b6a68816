//! execve of host programs and brk on the heap it leaves: the errors
//! that keep the old mm, the stack create_elf_tables writes, and the
//! break's moves and refusals. (The layouts themselves are compared with
//! the host's, line by line, by the scenario corpus.)

use std::os::unix::fs::PermissionsExt;

use usermm::mmap::*;
use usermm::{Errno, Machine, MachineConfig};

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;
const TRUE: &str = "/usr/bin/true";

fn machine() -> std::sync::Arc<Machine> {
    Machine::new(MachineConfig::single_node(64 << 20, 1)).unwrap()
}

/// A file in a folder of this test's own, with `mode`.
fn host_file(name: &str, bytes: &[u8], mode: u32) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("usermm-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

#[test]
fn failed_exec_keeps_the_old_mm() {
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let a = c.mmap(0, 4 * PAGE, RW, ANON).unwrap();
    c.store_u64(a, 7).unwrap();
    let text = host_file("text", b"no ELF here\n", 0o755);
    let plain = host_file("plain", b"\x7fELF", 0o644);
    let cases = [
        ("/nonexistent/program", Errno::ENOENT),
        ("/usr/bin", Errno::EACCES),
        (plain.to_str().unwrap(), Errno::EACCES),
        (text.to_str().unwrap(), Errno::ENOEXEC),
    ];
    for (path, want) in cases {
        assert_eq!(c.execve(path, &[path], &[]).err(), Some(want), "{path}");
        assert_eq!(c.mm().unwrap().id, mm.id, "{path}: the mm changed");
        assert_eq!(c.load_u64(a).unwrap(), 7, "{path}");
    }
    // Over MAX_ARG_STRLEN (32 pages), one string is E2BIG.
    if std::path::Path::new(TRUE).exists() {
        let long = "x".repeat(32 * 4096);
        assert_eq!(
            c.execve(TRUE, &[TRUE, &long], &[]).err(),
            Some(Errno::E2BIG)
        );
        assert_eq!(c.load_u64(a).unwrap(), 7);
    }
    c.exit_mm().unwrap();
    let _ = std::fs::remove_dir_all(text.parent().unwrap());
}

#[test]
fn exec_writes_argc_argv_and_envp_on_the_new_stack() {
    if !std::path::Path::new(TRUE).exists() {
        return;
    }
    let m = machine();
    let c = m.bind(0).unwrap();
    let old = c.new_mm().unwrap();
    let mm = c.execve(TRUE, &[TRUE, "one", "two"], &["K=V"]).unwrap();
    assert_ne!(mm.id, old.id);
    c.switch_mm(&mm);
    let l = mm.layout();
    // The stack pointer the program starts with: argc, then argv's
    // pointers and a NULL, then envp's and a NULL.
    let sp = l.start_stack;
    assert_eq!(c.load_u64(sp).unwrap(), 3);
    let string_at = |p: u64| {
        let bytes: Vec<u8> = (p..)
            .map(|a| c.load_u8(a).unwrap())
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8(bytes).unwrap()
    };
    let argv: Vec<String> = (0..3)
        .map(|i| string_at(c.load_u64(sp + 8 + 8 * i).unwrap()))
        .collect();
    assert_eq!(argv, [TRUE, "one", "two"]);
    assert_eq!(c.load_u64(sp + 8 * 4).unwrap(), 0);
    assert_eq!(string_at(c.load_u64(sp + 8 * 5).unwrap()), "K=V");
    assert_eq!(c.load_u64(sp + 8 * 6).unwrap(), 0);
    assert!(l.arg_start < l.arg_end && l.arg_end <= l.env_start);
    // The auxiliary vector follows: AT_PAGESZ (6) is 4096.
    let auxv = sp + 8 * 7;
    let pagesz = (0..30)
        .map(|i| {
            (
                c.load_u64(auxv + 16 * i).unwrap(),
                c.load_u64(auxv + 16 * i + 8).unwrap(),
            )
        })
        .find(|&(k, _)| k == 6);
    assert_eq!(pagesz, Some((6, 4096)));
    c.exit_mm().unwrap();
}

#[test]
fn brk_grows_shrinks_and_refuses_as_the_kernel() {
    if !std::path::Path::new(TRUE).exists() {
        return;
    }
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let mm = c.execve(TRUE, &[TRUE], &[]).unwrap();
    c.switch_mm(&mm);
    let start = mm.layout().start_brk;
    assert_eq!(c.brk(0).unwrap(), start, "the query form");
    // Below start_brk: refused, the old break returned.
    assert_eq!(c.brk(start - PAGE).unwrap(), start);
    // Growth makes the heap; its pages are zero and writable.
    assert_eq!(c.brk(start + 16 * PAGE).unwrap(), start + 16 * PAGE);
    let vmas = mm.map_count();
    c.store_u64(start + 15 * PAGE, 5).unwrap();
    // Within the same page: only the break moves.
    assert_eq!(c.brk(start + 16 * PAGE - 8).unwrap(), start + 16 * PAGE - 8);
    assert_eq!(c.load_u64(start + 15 * PAGE).unwrap(), 5);
    // Growth again expands the heap VMA in place.
    assert_eq!(c.brk(start + 32 * PAGE).unwrap(), start + 32 * PAGE);
    assert_eq!(mm.map_count(), vmas);
    // Shrinking unmaps the tail.
    assert_eq!(c.brk(start + 8 * PAGE).unwrap(), start + 8 * PAGE);
    assert_eq!(c.load_u64(start + 15 * PAGE), Err(Errno::EFAULT));
    // A mapping above the break: a break that would leave no page free
    // below it is refused; a page short of it is not.
    let x = start + 24 * PAGE;
    c.mmap(x, 4 * PAGE, RW, ANON | MAP_FIXED).unwrap();
    assert_eq!(c.brk(x).unwrap(), start + 8 * PAGE);
    assert_eq!(c.brk(x - PAGE + 1).unwrap(), start + 8 * PAGE);
    assert_eq!(c.brk(x - PAGE).unwrap(), x - PAGE);
    // A shrink over a range with nothing mapped is refused.
    c.munmap(start, x - PAGE - start).unwrap();
    assert_eq!(c.brk(start + PAGE).unwrap(), x - PAGE);
    c.exit_mm().unwrap();
    m.rcu_barrier();
    usermm::check::check_invariants(&m).unwrap();
}
