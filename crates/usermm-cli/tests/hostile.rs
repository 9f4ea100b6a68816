//! The CLI against hostile input: every case ends with its documented exit
//! status, in bounded time, and nothing panics (exit status 101).
//!
//! `run` and `inspect`: 0 all held, 1 an expectation failed, 2 malformed
//! file, 4 unreadable file; `bench` option errors: 1 with one line on stderr.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn usermm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_usermm"))
}

/// Run `cmd` to the end within `limit`; returns its exit status and stderr.
fn finish(mut cmd: Command, limit: Duration) -> (i32, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn usermm");
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return (st.code().unwrap_or(-1), stderr_of(&mut child));
        }
        if t.elapsed() > limit {
            child.kill().unwrap();
            panic!("{cmd:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What an ended child wrote to its piped stderr.
fn stderr_of(child: &mut std::process::Child) -> String {
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut err)
        .unwrap();
    err
}

fn scenario_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("usermm-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// `run` and `inspect` on the file give `want`.
fn check_file(name: &str, bytes: &[u8], want: i32) {
    let p = scenario_file(name, bytes);
    for verb in ["run", "inspect"] {
        let mut c = usermm();
        c.arg(verb).arg(&p);
        let (code, err) = finish(c, Duration::from_secs(120));
        assert_ne!(code, 101, "{verb} {name} panicked: {err}");
        assert_eq!(code, want, "{verb} {name}: exit {code}, stderr: {err}");
    }
}

#[test]
fn hostile_scenario_files_get_their_documented_status() {
    check_file("empty.scn", b"", 0);
    let garbage: Vec<u8> = (0..64 * 1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    check_file("garbage.scn", &garbage, 2);
    check_file(
        "comments.scn",
        "# nothing\n".repeat(1_000_000).as_bytes(),
        0,
    );
    let mut late_error = "# fine\n".repeat(999_999);
    late_error.push_str("map A 4K rw bogus\n");
    check_file("late_error.scn", late_error.as_bytes(), 2);
    check_file("overflowing_len.scn", b"map A 99999999999999999K rw\n", 2);
    check_file(
        "huge_len.scn",
        b"fails ENOMEM: map A 1000000000000K rw\n",
        0,
    );
    check_file(
        "wrap_addr.scn",
        b"fails EFAULT: read 0xfffffffffffffff8\n",
        0,
    );
    check_file(
        "wrap_range.scn",
        b"fails EINVAL: munmap 0xfffffffffffff000 8K\n",
        0,
    );
    check_file(
        "bad_expect.scn",
        b"map A 4K rw at=0x600000000000\nexpect A == 1\n",
        1,
    );
    let mut forks = String::from("map A 64K rw at=0x600000000000\nfill A 64K 1\n");
    for i in 0..2000 {
        forks.push_str(&format!("fork p{i}\nswitch p{i}\n"));
    }
    forks.push_str("check A 64K 1\n");
    check_file("forks.scn", forks.as_bytes(), 0);
    // Threads, exec and brk: a one-line error (status 1) or the kernel's
    // errno, never a panic.
    check_file("thread_twice.scn", b"thread T\nthread T\n", 1);
    check_file("thread_after_exit.scn", b"thread T\nexit T\nswitch T\n", 1);
    check_file(
        "thread_of_an_exited_process.scn",
        b"fork c\nswitch c\nthread T\nswitch main\nexit c\nswitch T\n",
        1,
    );
    let mut threads = String::from("map A 64K rw at=0x600000000000\n");
    for i in 0..64 {
        threads.push_str(&format!(
            "thread t{i}\nswitch t{i}\nwrite A+{:#x} {i}\n",
            i * 8
        ));
    }
    threads.push_str("switch main\nexit main\n");
    check_file("threads.scn", threads.as_bytes(), 0);
    check_file(
        "exec_by_a_second_thread.scn",
        b"thread T\nswitch T\nexec /usr/bin/true\n",
        1,
    );
    check_file(
        "thread_after_exec.scn",
        b"thread T\nexec /usr/bin/true\nswitch T\n",
        1,
    );
    check_file("vfork_parent_waits.scn", b"vfork c\nswitch main\n", 1);
    check_file(
        "vfork_parent_runs_nothing.scn",
        b"vfork c\nmap A 4K rw\n",
        1,
    );
    check_file("vfork_parent_cannot_exit.scn", b"vfork c\nexit main\n", 1);
    check_file(
        "vfork_child_exits.scn",
        b"map A 4K rw\nvfork c\nswitch c\nwrite A 1\nexit c\nswitch main\nexpect A == 1\n",
        0,
    );
    check_file("exec_relative.scn", b"exec true\n", 2);
    check_file(
        "exec_errors.scn",
        b"fails ENOENT: exec /nonexistent/program\nfails EACCES: exec /etc/passwd\n",
        0,
    );
    check_file("brk_without_exec.scn", b"brk +4K\n", 1);
    check_file(
        "brk_out_of_range.scn",
        b"exec /usr/bin/true\nbrk as=H\nbrk 0xfffffffffffff000\nbrk -0x7fffffffffffffff\n",
        1,
    );
    let mut c = usermm();
    c.args(["run", "/nonexistent/usermm/scenario.scn"]);
    assert_eq!(finish(c, Duration::from_secs(10)).0, 4);
    let _ = std::fs::remove_dir_all(scenario_file("x", b"").parent().unwrap());
}

#[test]
fn bench_options_are_checked_before_anything_runs() {
    for args in [
        &["bench", "--runs", "0"][..],
        &["bench", "--sizes", "3"],
        &["bench", "--size-mb", "0"],
        &["bench", "--size-mb", "18446744073709551615"],
        &["bench", "--size-mb", "1000000000"],
        &["bench", "nosuch"],
        &["bench", "--tunable", "zap=on"],
        &["bench", "--tunable", "zap_batch=maybe"],
        &["bench", "--tunable", "zap_batch"],
        &["bench", "migrc", "--scan-size-mb", "0"],
        &["bench", "migrc", "--ipi-cost", "fast"],
        &["bench", "migrc", "--thp", "inherit"],
        &["bench", "migrc", "--thp", "sometimes"],
        &["bench", "migrc", "--arms", "migrc,luf"],
        &["bench", "migrc", "--arms", "off,mglru"],
        &["bench", "migrc", "--migration-entry-ad", "maybe"],
        &["bench", "fork", "--backing", "shmem"],
        &["bench", "--backing", "shmem"],
        &["bench", "munmap", "--backing", "hugetlb"],
    ] {
        let mut c = usermm();
        c.args(args);
        let (code, err) = finish(c, Duration::from_secs(10));
        assert_eq!(code, 1, "{args:?}: exit {code}, stderr: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line of error: {err}");
    }
}

/// Machines the model cannot build, or that do not fit this host, are one
/// line of error and status 1 on every command, before anything runs.
#[test]
fn bad_machines_are_refused_with_one_line() {
    let doc = scenario_file("doc.scn", b"map A 4K rw\nwrite A 1\n");
    let files = [
        ("tiny.toml", &b"[[node]]\nsize = \"1M\"\ncpus = 1\n"[..]),
        ("huge.toml", b"[[node]]\nsize = \"900G\"\ncpus = 1\n"),
        ("nocpu.toml", b"[[node]]\nsize = \"1G\"\n"),
        ("typo.toml", b"[[node]]\nsize = \"1G\"\ncpu = 2\n"),
        ("garbage.toml", b"\x00\xff[[[\n"),
        ("bad.json", b"{\"node\": [{\"size\": -1}]}"),
        ("empty.json", b"{}"),
    ];
    let mut cases: Vec<Vec<String>> = vec![];
    for (name, bytes) in files {
        let f = scenario_file(name, bytes).display().to_string();
        cases.push(vec!["--machine".into(), f]);
    }
    for mem in ["0", "1M", "5000000000000T", "1X", "-4G"] {
        cases.push(vec!["--mem".into(), mem.into()]);
    }
    for cpus in ["0", "65", "-1"] {
        cases.push(vec!["--cpus".into(), cpus.into()]);
    }
    for machine in &cases {
        for verb in ["run", "inspect", "bench"] {
            let mut c = usermm();
            c.arg(verb).args(machine);
            if verb == "bench" {
                c.args(["vma", "--no-host", "--runs", "1"]);
            } else {
                c.arg(&doc);
            }
            let (code, err) = finish(c, Duration::from_secs(10));
            let clap = err.starts_with("error:");
            assert!(
                code == 1 && err.lines().count() == 1 || clap && code == 2,
                "{verb} {machine:?}: exit {code}, stderr: {err}"
            );
        }
    }
}

/// A reader that stops early (`| head -c 10`) ends `inspect`, `run` and
/// `bench` quietly: no panic, no status 101.
#[test]
fn a_closed_stdout_ends_quietly() {
    let doc = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/scenarios/doc_example.scn"
    );
    // A short bench, its results in a folder of its own: its table comes
    // at the end of the experiment, and the lines after it (the results'
    // folder, the report) go to a closed pipe.
    let out = std::env::temp_dir().join(format!("usermm-hostile-bench-{}", std::process::id()));
    let out = out.to_str().unwrap();
    let bench = [
        "bench",
        "access",
        "--runs",
        "1",
        "--no-host",
        "--size-mb",
        "16",
        "--out",
        out,
    ];
    for args in [
        &["inspect", "--json", doc][..],
        &["run", "--json", doc],
        &["run", doc],
        &bench,
    ] {
        let mut child = usermm()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 10];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
        drop(child.stdout.take());
        let st = child.wait().unwrap();
        let err = stderr_of(&mut child);
        assert_ne!(st.code(), Some(101), "{args:?} panicked: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn tunables_on_the_command_line_are_checked_and_shown() {
    let doc = scenario_file("tun.scn", b"map A 64K rw\nfill A 64K 3\ncheck A 64K 3\n");
    for (args, want) in [
        (&["run", "--tunable", "zap_batch=off"][..], 0),
        (&["run", "--tunable", "nosuch=on"], 1),
        (&["run", "--tunable", "zap_batch=1"], 1),
        (&["inspect", "--tunable", "fork_batch"], 1),
        (&["run", "--native", "--tunable", "zap_batch=off"], 1),
    ] {
        let mut c = usermm();
        c.args(args).arg(&doc);
        let (code, err) = finish(c, Duration::from_secs(10));
        assert_eq!(code, want, "{args:?}: stderr {err}");
        if want == 1 {
            assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        }
    }
    let out = usermm()
        .args(["inspect", "--tunable", "zap_batch=off"])
        .arg(&doc)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "tunables: fault_lock=vma_lock fork_batch=on migrate_batch_flush=on migration_entry_ad=on migrc=off pt_reclaim=upstream pt_reclaim_pmd=off wp_reuse_large=on zap_batch=off"
        ),
        "{text}"
    );
}

/// A report of a folder that is not there, or holds no results, or holds
/// a file that is not JSON, is one line of error and status 1.
#[test]
fn report_of_no_results_is_one_line() {
    let dir = std::env::temp_dir().join(format!("usermm-report-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap().to_string();
    let missing = format!("{d}/missing");
    let cases: Vec<Vec<&str>> = vec![
        vec!["report", "--out", &missing],
        vec!["report", "--out", &d],
    ];
    for (i, args) in cases.iter().enumerate() {
        if i == 1 {
            std::fs::write(dir.join("munmap.json"), b"{ not json").unwrap();
        }
        let mut c = usermm();
        c.args(args);
        let (code, err) = finish(c, Duration::from_secs(10));
        assert_eq!(code, 1, "{args:?}: exit {code}, stderr: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line of error: {err}");
    }
    let mut c = usermm();
    c.args(["report", "--out", &d, "--scenario", &missing]);
    std::fs::remove_file(dir.join("munmap.json")).unwrap();
    std::fs::write(dir.join("munmap.json"), b"{\"rows\": []}").unwrap();
    let (code, err) = finish(c, Duration::from_secs(10));
    assert_eq!(code, 1, "a missing scenario: exit {code}, stderr: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}
