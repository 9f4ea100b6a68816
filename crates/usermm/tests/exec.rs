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
    file_in("usermm-exec", name, bytes, mode)
}

/// A file with `mode` in the folder `folder`-PID of the temporary folder.
fn file_in(folder: &str, name: &str, bytes: &[u8], mode: u32) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("{folder}-{}", std::process::id()));
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

/// A file in a folder of the script test's own (the other tests remove
/// theirs when they end).
fn script_file(name: &str, bytes: &[u8], mode: u32) -> std::path::PathBuf {
    file_in("usermm-scripts", name, bytes, mode)
}

/// `#!` scripts, each answered as the host kernel answers the same
/// files (checked with execve(2) on the host): a line with no name or a
/// name that may be cut off is ENOEXEC, so is an interpreter that is no
/// program; a missing one is ENOENT; five scripts deep run, six are
/// ELOOP. A script that runs gets its interpreter's name, its one
/// argument (the rest of the line) and its own path as argv, before the
/// arguments after argv[0]; AT_EXECFN still names the script.
#[test]
fn scripts_run_their_interpreter() {
    if !std::path::Path::new(TRUE).exists() {
        return;
    }
    let m = machine();
    let c = m.bind(0).unwrap();
    let mm = c.new_mm().unwrap();
    let plain = script_file("script-plain", b"just text\n", 0o755);
    let refused = [
        (script_file("script-noname", b"#!\n", 0o755), Errno::ENOEXEC),
        (
            script_file("script-spaces", b"#!   \t \n", 0o755),
            Errno::ENOEXEC,
        ),
        (
            script_file("script-missing", b"#!/nonexistent/interp\n", 0o755),
            Errno::ENOENT,
        ),
        (
            script_file(
                "script-text",
                format!("#!{}\n", plain.display()).as_bytes(),
                0o755,
            ),
            Errno::ENOEXEC,
        ),
        (
            script_file(
                "script-long",
                &[b"#!/".as_slice(), &[b'a'; 300]].concat(),
                0o755,
            ),
            Errno::ENOEXEC,
        ),
    ];
    for (path, want) in &refused {
        let p = path.to_str().unwrap();
        assert_eq!(c.execve(p, &[p], &[]).err(), Some(*want), "{p}");
        assert_eq!(c.mm().unwrap().id, mm.id, "{p}: the mm changed");
    }
    let mut chain = TRUE.to_string();
    for i in 1..=6 {
        let s = script_file(
            &format!("script-chain{i}"),
            format!("#!{chain}\n").as_bytes(),
            0o755,
        );
        chain = s.to_str().unwrap().to_string();
        // A run leaves the CPU on the new mm, the old one given up.
        let r = c.execve(&chain, &[&chain], &[]).map(|_| ());
        let want = if i <= 5 { Ok(()) } else { Err(Errno::ELOOP) };
        assert_eq!(r, want, "{i} scripts deep");
    }
    let script = script_file(
        "script-args",
        format!("#!{TRUE}  arg1 arg2  \nrest\n").as_bytes(),
        0o755,
    );
    let s = script.to_str().unwrap();
    let new = c.execve(s, &["zero", "one"], &[]).unwrap();
    c.switch_mm(&new);
    let sp = new.layout().start_stack;
    let string_at = |p: u64| {
        let bytes: Vec<u8> = (p..)
            .map(|a| c.load_u8(a).unwrap())
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8(bytes).unwrap()
    };
    assert_eq!(c.load_u64(sp).unwrap(), 4);
    let argv: Vec<String> = (0..4)
        .map(|i| string_at(c.load_u64(sp + 8 + 8 * i).unwrap()))
        .collect();
    assert_eq!(argv, [TRUE, "arg1 arg2", s, "one"]);
    let execfn = (0..40)
        .map(|i| {
            (
                c.load_u64(sp + 8 * (7 + 2 * i)).unwrap(),
                c.load_u64(sp + 8 * (8 + 2 * i)).unwrap(),
            )
        })
        .find(|&(k, _)| k == 31)
        .map(|(_, v)| string_at(v));
    assert_eq!(execfn.as_deref(), Some(s), "AT_EXECFN");
    c.exit_mm().unwrap();
    let _ = std::fs::remove_dir_all(plain.parent().unwrap());
}

/// The value of auxiliary-vector entry `key` in the vector at `auxv`
/// (among its first 40 entries).
fn auxv_value(c: &usermm::OnCpu, auxv: u64, key: u64) -> Option<u64> {
    (0..40)
        .map(|i| {
            (
                c.load_u64(auxv + 16 * i).unwrap(),
                c.load_u64(auxv + 16 * i + 8).unwrap(),
            )
        })
        .find(|&(k, _)| k == key)
        .map(|(_, v)| v)
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
    assert_eq!(auxv_value(&c, sp + 8 * 7, 6), Some(4096));
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

/// Randomisation's numbers move what they name, and nothing else: the
/// stack's end, `mmap_base` (the interpreter below it), a PIE program's
/// load address, the break (a page past the bss, then its offset); a
/// number the kernel cannot draw is EINVAL, the old mm kept.
#[test]
fn exec_randomized_moves_what_each_number_names() {
    use usermm::exec::{ExecRandom, STACK_TOP};
    if !std::path::Path::new(TRUE).exists() {
        return;
    }
    let m = machine();
    let c = m.bind(0).unwrap();
    let old = c.new_mm().unwrap();
    let bad = ExecRandom {
        brk: 1 << 30,
        ..Default::default()
    };
    assert_eq!(
        c.execve_randomized(TRUE, &[TRUE], &[], bad).err(),
        Some(Errno::EINVAL)
    );
    assert_eq!(c.mm().unwrap().id, old.id);
    let zero = c
        .execve_randomized(TRUE, &[TRUE], &[], ExecRandom::default())
        .unwrap();
    let l0 = zero.layout();
    let rnd = ExecRandom {
        mmap: 0x1234 << 12,
        pie: 0x567 << 12,
        stack: 0x89 << 12,
        stack_align: 0x123,
        brk: 0x45 << 12,
    };
    let new = c.execve_randomized(TRUE, &[TRUE], &[], rnd).unwrap();
    let l = new.layout();
    // arch/x86/mm/mmap.c: the gap below the top is the stack limit, the
    // guard gap and the stack's largest random offset.
    let gap = (8 << 20) + (256 << 12) + (0x3f_ffff << 12);
    assert_eq!(l0.mmap_base, usermm::mm::TASK_SIZE - gap);
    assert_eq!(l0.mmap_base - l.mmap_base, rnd.mmap);
    assert_eq!(l.start_code - l0.start_code, rnd.pie);
    assert_eq!(l.start_brk - l0.start_brk, rnd.pie + rnd.brk);
    let stack_end = |mm: &usermm::mm::Mm| {
        let g = usermm::sync::epoch::pin();
        mm.vma_tree(&g).find_vma(l.start_stack).map(|v| v.end())
    };
    assert_eq!(stack_end(&new), Some(STACK_TOP - rnd.stack));
    assert!(l.start_stack.is_multiple_of(16) && l.start_stack < STACK_TOP - rnd.stack);
    c.exit_mm().unwrap();
}

/// The vDSO's pages are the host's image, mapped a page at a time, each a
/// page of RssFile; `[vvar]` maps its time and random-state pages (no
/// RSS) and is SIGBUS elsewhere, as is `[vvar_vclock]` (checked on the
/// host: a program reading each page of its own).
#[test]
fn vdso_and_vvar_fault_as_the_kernel_maps_them() {
    if !std::path::Path::new(TRUE).exists() {
        return;
    }
    let m = machine();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let mm = c.execve(TRUE, &[TRUE], &[]).unwrap();
    c.switch_mm(&mm);
    let sp = mm.layout().start_stack;
    // AT_SYSINFO_EHDR (33) in the auxiliary vector, after argc, argv's
    // one pointer and NULL, envp's NULL.
    let vdso = auxv_value(&c, sp + 8 * 4, 33).expect("AT_SYSINFO_EHDR");
    let rss_file = || usermm::proc::status(&mm).rss_file;
    let before = rss_file();
    // "\x7fELF", 64-bit, little-endian, version 1.
    assert_eq!(c.load_u64(vdso).unwrap(), 0x0001_0102_464c_457f);
    assert_eq!(rss_file(), before + 4);
    c.load_u8(vdso + PAGE).unwrap();
    assert_eq!(rss_file(), before + 8);
    let vvar = vdso - 6 * PAGE;
    let vclock = vdso - 2 * PAGE;
    for (addr, ok) in [
        (vvar, true),
        (vvar + PAGE, false),
        (vvar + 2 * PAGE, true),
        (vvar + 3 * PAGE, false),
        (vclock, false),
        (vclock + PAGE, false),
    ] {
        let r = c.load_u8(addr);
        assert_eq!(r.is_ok(), ok, "{addr:#x}: {r:?}");
        if !ok {
            assert_eq!(r.err(), Some(Errno::SIGBUS), "{addr:#x}");
        }
    }
    assert_eq!(rss_file(), before + 8);
    c.exit_mm().unwrap();
}
