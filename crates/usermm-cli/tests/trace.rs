//! `usermm trace`: a real program recorded on the host kernel and replayed
//! in usermm, the replay checked against what the kernel did; and the
//! commands against bad input.
//!
//! Recording needs `perf` and the rights to the kernel's tracepoints
//! (root) and a C compiler for the test program: where one is missing the
//! recording tests say so and pass without checking.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn usermm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_usermm"))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("usermm-trace-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compile tests/programs/NAME.c into `dir`, or None (with a message)
/// where this host cannot record it.
fn recordable(name: &str, dir: &Path) -> Option<PathBuf> {
    let probe = usermm()
        .args(["trace", "record", "-o"])
        .arg(dir.join("probe.trace.gz"))
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    if !probe.status.success() {
        let why = String::from_utf8_lossy(&probe.stderr);
        if why.contains("cannot record here") || why.contains("ptrace") {
            eprintln!("not checked: {}", why.trim());
            return None;
        }
        panic!("recording /bin/true failed: {why}");
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/programs/{name}.c"));
    let exe = dir.join(name);
    let cc = Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output();
    match cc {
        Ok(o) if o.status.success() => Some(exe),
        _ => {
            eprintln!("not checked: no C compiler to build {}", src.display());
            None
        }
    }
}

fn json(cmd: &mut Command) -> Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(1),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    })
}

/// Every call a replay made returned what the kernel's did.
fn assert_calls_agree(trace: &str, r: &Value) {
    for (call, c) in r["calls"].as_object().unwrap() {
        assert_eq!(
            c["agreed"].as_u64().unwrap() + c["skipped"].as_u64().unwrap(),
            c["replayed"].as_u64().unwrap(),
            "{trace}: {call}: {r}"
        );
    }
}

/// `usermm trace VERB FILE`'s stderr, which must end it with status 1.
fn error_of(verb: &str, file: &Path) -> String {
    let out = usermm().args(["trace", verb]).arg(file).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{verb} {}", file.display());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// mm_mix (anonymous memory, MADV_DONTNEED, mprotect, mremap, a thread, a
/// fork, malloc) recorded, summarised and replayed: every call's result,
/// the address space exec built, and each process's anonymous memory,
/// page tables and VMAs as the kernel had them.
#[test]
fn a_recorded_program_replays_as_the_kernel_ran_it() {
    let dir = scratch("mix");
    let Some(exe) = recordable("mm_mix", &dir) else {
        return;
    };
    let trace = dir.join("mix.trace.gz");
    let rec = usermm()
        .args(["trace", "record", "--clean-env", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        rec.status.success(),
        "{}",
        String::from_utf8_lossy(&rec.stderr)
    );

    let show = json(usermm().args(["trace", "show", "--json"]).arg(&trace));
    assert_eq!(show["processes"], 2, "{show}");
    assert_eq!(show["threads"], 3, "{show}");
    assert_eq!(show["lost"], 0, "{show}");
    for call in ["mmap", "munmap", "mprotect", "madvise", "mremap", "brk"] {
        assert!(show["calls"][call].as_u64() >= Some(1), "{call}: {show}");
    }

    let r = json(usermm().args(["trace", "replay", "--json"]).arg(&trace));
    assert_calls_agree("mix", &r);
    assert_eq!(r["placed_elsewhere"], 0, "{r}");
    assert_eq!(r["faults_refused"], 0, "{r}");
    assert_eq!(r["exec_maps_alike"], r["exec_maps_lines"], "{r}");
    let procs = r["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "{r}");

    // The same trace as a scenario: it parses, and runs in usermm.
    let scn = usermm()
        .args(["trace", "scenario"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(scn.status.success());
    let file = dir.join("mix.scn");
    std::fs::write(&file, &scn.stdout).unwrap();
    let run = usermm().arg("run").arg(&file).output().unwrap();
    assert!(
        matches!(run.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let text = String::from_utf8_lossy(&scn.stdout);
    for stmt in [
        "exec ", "map m1 ", "mremap ", "thread t", "fork p", "write 0x", "exit ",
    ] {
        assert!(text.contains(stmt), "{stmt}: {text}");
    }
    for p in procs {
        for f in p["figures"].as_array().unwrap() {
            let (name, kernel, ours) = (f[0].as_str().unwrap(), f[1].as_i64(), f[2].as_i64());
            match name {
                // A page of fault-around at most: the host's page cache
                // holds the folios its own readahead made, the replay's
                // are 4 KiB.
                "VmRSS" | "RssFile" => {
                    let d = (ours.unwrap() - kernel.unwrap()).abs();
                    assert!(d <= 4, "{name} differs by {d} kB: {r}");
                }
                _ => assert_eq!(kernel, ours, "{name}: {r}"),
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_is_a_one_line_error() {
    let dir = scratch("bad");
    let err = error_of("replay", &dir.join("missing.trace.gz"));
    assert_eq!(err.lines().count(), 1, "{err}");

    let text = dir.join("not.trace");
    std::fs::write(&text, "hello\n").unwrap();
    let err = error_of("show", &text);
    assert!(err.contains("not a trace"), "{err}");

    let bad = dir.join("bad.trace");
    std::fs::write(&bad, "usermm-trace 1\n0 1/1 mmap addr=0x0 = 0x0\n").unwrap();
    let err = error_of("replay", &bad);
    assert!(err.contains(":2: mmap"), "{err}");

    let gz = dir.join("broken.trace.gz");
    std::fs::write(&gz, [0x1f, 0x8b, 0, 1, 2]).unwrap();
    assert!(error_of("show", &gz).contains("gzip"));

    let none = usermm().args(["trace", "record", "--"]).output().unwrap();
    assert_ne!(none.status.code(), Some(0));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The programs of tests/traces/record.sh, built where the corpus's
/// traces name them (a trace names the files its program maps).
const CORPUS_BUILD: &str = "/tmp/usermm-corpus";
const CORPUS_PROGRAMS: [&str; 6] = [
    "mm_mix",
    "threads",
    "allocator",
    "pft",
    "fork_large",
    "lookup",
];

fn build_corpus_programs() {
    std::fs::create_dir_all(CORPUS_BUILD).unwrap();
    for p in CORPUS_PROGRAMS {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/programs/{p}.c"));
        let tmp = Path::new(CORPUS_BUILD).join(format!(".{p}.{}", std::process::id()));
        let ok = Command::new("cc")
            .args(["-O1", "-pthread", "-o"])
            .arg(&tmp)
            .arg(&src)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            std::fs::rename(&tmp, Path::new(CORPUS_BUILD).join(p)).unwrap();
        }
    }
}

/// Every trace of tests/traces replays with each call's result, each
/// exec's address space and each process's anonymous memory, page tables
/// and VMAs as the kernel had them, and its file memory within 5% (16 kB
/// at least): the replay caches what the host's page cache held as the
/// recording ended, so a file first read during the run was cached in
/// part when the kernel faulted on it, and fault-around mapped less
/// (docs/traces.md). A trace whose files differ here (another libc,
/// another compiler) is skipped with a message.
#[test]
fn the_corpus_replays_as_the_kernel_ran_it() {
    build_corpus_programs();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/traces");
    let mut traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".trace.gz"))
        .collect();
    traces.sort();
    assert!(traces.len() >= 10, "{traces:?}");
    let mut replayed = 0;
    for t in &traces {
        let r = json(usermm().args(["trace", "replay", "--json"]).arg(t));
        let name = t.file_name().unwrap().to_string_lossy();
        if !r["files_changed"].as_array().unwrap().is_empty() {
            eprintln!(
                "{name} not checked: files differ here: {}",
                r["files_changed"]
            );
            continue;
        }
        replayed += 1;
        assert_calls_agree(&name, &r);
        for k in ["placed_elsewhere", "faults_refused", "orphan_events"] {
            assert_eq!(r[k], 0, "{name}: {k}: {r}");
        }
        assert_eq!(r["exec_maps_alike"], r["exec_maps_lines"], "{name}: {r}");
        assert!(!r["processes"].as_array().unwrap().is_empty(), "{name}");
        for p in r["processes"].as_array().unwrap() {
            for f in p["figures"].as_array().unwrap() {
                let (fig, kernel, ours) = (
                    f[0].as_str().unwrap(),
                    f[1].as_i64().unwrap(),
                    f[2].as_i64().unwrap(),
                );
                if fig == "VmRSS" || fig == "RssFile" {
                    let d = (ours - kernel).abs();
                    assert!(d <= (kernel / 20).max(16), "{name}: {fig} by {d} kB: {r}");
                } else {
                    assert_eq!(kernel, ours, "{name}: {fig}: {r}");
                }
            }
        }
    }
    eprintln!("{replayed} of {} corpus traces checked", traces.len());
}

/// A call whose result differs is counted, the replay goes on (a call the
/// engine does not make is skipped and listed), and the report shows the
/// events around the first difference; exit status 1.
#[test]
fn a_disagreement_is_shown_in_its_neighbourhood() {
    let dir = scratch("differ");
    let t = dir.join("by-hand.trace.txt");
    std::fs::write(
        &t,
        "usermm-trace 1\n\
         kernel \"by hand\"\n\
         cmd [\"by hand\"]\n\
         lost 0\n\
         0 7/7 mmap addr=0x600000000000 len=0x4000 prot=0x3 flags=0x32 fd=0xffffffff off=0x0 = 0x600000000000\n\
         1 7/7 fault 0x600000000000 w\n\
         2 7/7 memfd_create uname=0x7ffff000 flags=0x0 = 0x3\n\
         3 7/7 munmap addr=0x600000001000 len=0x1000 = -22\n\
         4 7/7 munmap addr=0x600000000000 len=0x1000 = 0x0\n\
         5 7/7 fault 0x600000002000 r\n",
    )
    .unwrap();
    let out = usermm()
        .args(["trace", "replay", "--json"])
        .arg(&t)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["calls"]["munmap"]["replayed"], 2, "{r}");
    assert_eq!(r["calls"]["munmap"]["agreed"], 1, "{r}");
    assert_eq!(r["calls"]["memfd_create"]["skipped"], 1, "{r}");
    let around: Vec<&str> = r["first_disagreement"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        around.iter().any(|l| l.starts_with("> 3 7/7 munmap")),
        "{around:?}"
    );
    assert!(
        around.iter().any(|l| l.starts_with("  5 7/7 fault")),
        "{around:?}"
    );
    assert!(
        r["notes"].to_string().contains("kernel EINVAL, usermm 0x0"),
        "{r}"
    );
    assert!(r["tunables"].to_string().contains("zap_batch="), "{r}");
    assert!(r["counters"]["pgfault"].as_i64() >= Some(2), "{r}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `bench replay` over one corpus trace: a row per series, both arms
/// timed, and the arms' agreement with the kernel.
#[test]
fn bench_replay_compares_each_series_on_a_trace() {
    build_corpus_programs();
    let dir = scratch("bench");
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/traces/mm_mix.trace.gz");
    let out = usermm()
        .args(["bench", "replay", "--runs", "2", "--json", "--trace"])
        .arg(&trace)
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    if rows.is_empty() {
        eprintln!("not checked: mm_mix's files differ here");
        return;
    }
    let tunables: Vec<&str> = rows
        .iter()
        .map(|r| r["tunable"].as_str().unwrap())
        .collect();
    assert_eq!(
        tunables,
        ["fork_batch", "zap_batch", "pt_reclaim", "fault_lock"]
    );
    for r in rows {
        assert!(
            r["base_ms"].as_f64() > Some(0.0) && r["arm_ms"].as_f64() > Some(0.0),
            "{r}"
        );
        assert_eq!(r["runs"], 2, "{r}");
        // The changed arm is the kernel's algorithm: it agrees.
        assert_eq!(r["arm_agrees"], true, "{r}");
    }
    // PT reclaim off keeps the page tables mm_mix emptied with DONTNEED.
    let ptr = &rows[2];
    assert!(
        ptr["base_vm_pte_kb"].as_i64() > ptr["arm_vm_pte_kb"].as_i64(),
        "{ptr}"
    );
    assert_eq!(ptr["base_agrees"], false, "{ptr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
