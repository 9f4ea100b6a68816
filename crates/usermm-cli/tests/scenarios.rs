//! The differential corpus: every scenario under tests/scenarios runs in
//! usermm and natively on the host kernel, and the two must agree on every
//! errno, every value read and every change of a figure. A scenario whose
//! host knobs cannot be set here (not root) is counted as skipped natively,
//! and the count is printed.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/scenarios");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "scn"))
        .collect();
    v.sort();
    v
}

/// Run `usermm run [--native] --json FILE`: (exit status, report).
fn run(file: &Path, native: bool) -> (i32, Value, String) {
    run_with(file, native, &[])
}

/// The values of `fault_lock` the corpus runs under in the engine, each
/// compared with the one native run: every one must agree with the host.
const FAULT_LOCKS: [&str; 3] = ["vma_lock", "spf", "mmap_lock"];

/// [`run`] with more arguments (`--tunable` ones).
fn run_with(file: &Path, native: bool, args: &[String]) -> (i32, Value, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_usermm"));
    c.arg("run").arg("--json").args(args);
    if native {
        c.arg("--native");
    }
    let out = c.arg(file).output().expect("run usermm");
    let code = out.status.code().unwrap_or(-1);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let report = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (
        code,
        report,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn lines(report: &Value) -> Vec<(u64, String, Value, Value)> {
    report["outcomes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|o| {
                    (
                        o["line"].as_u64().unwrap_or(0),
                        o["text"].as_str().unwrap_or("").to_string(),
                        o["compare"].clone(),
                        o["failed"].clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn side_by_side(eng: &Value, nat: &Value) -> String {
    let (e, n) = (lines(eng), lines(nat));
    let mut s = String::new();
    for i in 0..e.len().max(n.len()) {
        let show = |x: Option<&(u64, String, Value, Value)>| {
            x.map_or("-".to_string(), |(_, _, c, f)| {
                if f.is_null() {
                    c.to_string()
                } else {
                    format!("{c} FAILED {f}")
                }
            })
        };
        let (a, b) = (e.get(i), n.get(i));
        let text = a.or(b).map_or("", |x| x.1.as_str());
        let mark = if a.map(|x| &x.2) == b.map(|x| &x.2) {
            " "
        } else {
            "≠"
        };
        s += &format!(
            "  {mark} {text:<48} usermm: {:<24} host: {}\n",
            show(a),
            show(b)
        );
    }
    s
}

/// Held by each test that runs scenarios natively, for its whole run: the
/// host's THP knobs and counters are system-wide, so one test's runs in
/// usermm (host memory faulted in while the other's scenario has set, say,
/// every 64K folio size to `always`) would move the other's counters.
static HOST: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn host_to_ourselves() -> std::sync::MutexGuard<'static, ()> {
    HOST.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a native report's outcomes are usermm's, statement by statement.
fn outcomes_agree(eng: &Value, nat: &Value) -> bool {
    lines(eng)
        .iter()
        .map(|x| &x.2)
        .eq(lines(nat).iter().map(|x| &x.2))
}

/// After a disagreement (or a native failure), whether one of five more
/// native runs of `f` agrees with usermm and passes as it did: then the
/// first was the host's own noise (about 1 scenario in 2,000 gets an
/// extra page table in the server process between a mark and an expect,
/// or, with an mTHP size enabled, a folio of that size that another
/// process faulted into a system-wide counter), not a divergence, which
/// repeats on every run. The runs wait a little longer each time (0.1,
/// 0.2, 0.4, 0.8, 1.6 s), so that a burst of activity elsewhere on the
/// host does not spoil them all (one of a second, with 16K folios enabled,
/// spoiled the first run and three more).
fn host_noise(f: &Path, eng: &Value, ecode: i32) -> bool {
    (0..5).any(|i| {
        std::thread::sleep(std::time::Duration::from_millis(100 << i));
        let (code, nat, _) = run(f, true);
        code == ecode && outcomes_agree(eng, &nat)
    })
}

#[test]
fn corpus_runs_alike_in_usermm_and_on_the_host() {
    let _host = host_to_ourselves();
    let files = corpus();
    assert!(
        files.len() >= 20,
        "the corpus has {} scenarios",
        files.len()
    );
    let (mut skipped, mut failures, mut noise) = (vec![], vec![], vec![]);
    for f in &files {
        let base = f.file_name().unwrap().to_string_lossy().to_string();
        // A scenario that needs more than one node runs on the tiered
        // machine (natively, a host with fewer nodes skips it).
        let tiered = std::fs::read_to_string(f).is_ok_and(|s| s.contains("require nodes"));
        let engines: Vec<(String, (i32, Value, String))> = FAULT_LOCKS
            .iter()
            .map(|lock| {
                let mut arg = vec!["--tunable".to_string(), format!("fault_lock={lock}")];
                if tiered {
                    arg.extend(["--machine".to_string(), "tiered".to_string()]);
                }
                (
                    format!("{base} (fault_lock={lock})"),
                    run_with(f, false, &arg),
                )
            })
            .collect();
        let mut engine_failed = false;
        for (name, (ecode, eng, eerr)) in &engines {
            if *ecode != 0 {
                failures.push(format!(
                    "{name}: usermm exited {ecode}\n{eerr}{}",
                    side_by_side(eng, &Value::Null)
                ));
                engine_failed = true;
            }
        }
        if engine_failed {
            continue;
        }
        let (ncode, nat, nerr) = run(f, true);
        if ncode == 3 {
            skipped.push(format!(
                "{base}: {}",
                nat["skipped"].as_str().unwrap_or("?")
            ));
            continue;
        }
        for (name, (_, eng, _)) in &engines {
            let agree = outcomes_agree(eng, &nat);
            if (ncode != 0 || !agree) && host_noise(f, eng, 0) {
                noise.push(name.clone());
                continue;
            }
            if ncode != 0 || !agree {
                failures.push(format!(
                    "{name}: host exited {ncode}{}\n{nerr}{}",
                    if agree { "" } else { ", outcomes differ" },
                    side_by_side(eng, &nat)
                ));
            }
        }
    }
    // Written to stderr directly, so that it shows although the test
    // harness captures the print macros of passing tests.
    use std::io::Write;
    let skipped_list: String = skipped.iter().map(|s| format!("\n  {s}")).collect();
    let _ = writeln!(
        std::io::stderr(),
        "differential corpus: {} scenarios (each under fault_lock={FAULT_LOCKS:?}), {} skipped natively, {} disagreed once and \
         agreed when run again (host noise: {noise:?}){skipped_list}",
        files.len(),
        skipped.len(),
        noise.len(),
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn malformed_file_exits_2_with_line_and_column() {
    let dir = std::env::temp_dir().join(format!("usermm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("bad.scn");
    std::fs::write(&f, "map A 2M rw\nmunmap A 4X\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .arg("run")
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.scn:2:10:"), "{err}");
    // A failing expectation exits 1 and shows both values.
    std::fs::write(&f, "map A 4K rw\nwrite A 5\nexpect A == 6\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .arg("run")
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("expected 0x6, read 0x5"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The address range of a maps line.
fn maps_range(line: &str) -> (u64, u64) {
    let range = line.split(' ').next().unwrap_or("");
    let (s, e) = range.split_once('-').unwrap_or(("0", "0"));
    (
        u64::from_str_radix(s, 16).unwrap_or(0),
        u64::from_str_radix(e, 16).unwrap_or(0),
    )
}

/// What an exec left: its maps lines and its break (a scenario's `maps`
/// then `brk`, as the last two outcomes of `report`).
fn exec_layout(report: &Value) -> Option<(Vec<String>, u64)> {
    let l = lines(report);
    let [.., maps, brk] = l.as_slice() else {
        return None;
    };
    let maps: Vec<String> = maps.2.as_str()?.lines().map(String::from).collect();
    let brk = u64::from_str_radix(brk.2.as_str()?.trim_start_matches("0x"), 16).ok()?;
    Some((maps, brk))
}

/// The stack's end and `mmap_base` (the end of the highest mapping below
/// the stack: the interpreter's, or a static program's, placed first
/// from the top) of an exec's maps.
fn stack_and_mmap_base(maps: &[String]) -> (u64, u64) {
    let stack = maps
        .iter()
        .find(|l| l.ends_with("[stack]"))
        .map_or((0, 0), |l| maps_range(l));
    let base = maps
        .iter()
        .map(|l| maps_range(l))
        .filter(|&(s, _)| s < stack.0)
        .map(|(_, e)| e)
        .max()
        .unwrap_or(0);
    (stack.1, base)
}

/// With randomisation on, the host draws its own numbers. Read them back
/// from where its exec put things, against usermm's exec with all five
/// at zero: a PIE program's first mapping, the stack's end, `mmap_base`,
/// the break. Then usermm's exec with those numbers must lay out every
/// maps line as the host did, and put the break where it did, for a PIE
/// program, a static PIE one (ld.so run alone, its break at
/// ELF_ET_DYN_BASE) and a non-PIE one. (The stack pointer's own cut,
/// `arch_align_stack` in `create_elf_tables`, moves no mapping: left at
/// zero, and RssAnon not compared.)
#[test]
fn exec_with_randomisation_lays_out_as_the_host_given_its_numbers() {
    let _host = host_to_ourselves();
    let dir = std::env::temp_dir().join(format!("usermm-aslr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let programs = [
        "/usr/bin/true",
        "/lib64/ld-linux-x86-64.so.2",
        "/usr/bin/python3.11",
    ];
    let mut compared = 0;
    for prog in programs {
        if !Path::new(prog).exists() {
            continue;
        }
        let scenario = |aslr: &str| {
            let f = dir.join("aslr.scn");
            std::fs::write(&f, format!("exec aslr={aslr} {prog}\nmaps\nbrk\n")).unwrap();
            f
        };
        let f = scenario("0,0,0,0,0");
        let (_, nat, err) = run(&f, true);
        if let Some(why) = nat["skipped"].as_str() {
            eprintln!("{prog}: skipped natively: {why}");
            continue;
        }
        let (host_maps, host_brk) = exec_layout(&nat).unwrap_or_else(|| panic!("{prog}: {err}"));
        let (_, eng0, err) = run(&f, false);
        let (maps0, brk0) = exec_layout(&eng0).unwrap_or_else(|| panic!("{prog}: {err}"));
        let first = |m: &[String]| maps_range(&m[0]).0;
        let pie = if first(&maps0) == 0x5555_5555_4000 {
            first(&host_maps) - first(&maps0)
        } else {
            0
        };
        let ((stack0, base0), (stack, base)) =
            (stack_and_mmap_base(&maps0), stack_and_mmap_base(&host_maps));
        let brk_shift = if brk0 == 0x5555_5555_4000 { 0 } else { pie };
        let numbers = format!(
            "{:#x},{pie:#x},{:#x},0,{:#x}",
            base0 - base,
            stack0 - stack,
            host_brk - brk0 - brk_shift
        );
        let (_, eng, err) = run(&scenario(&numbers), false);
        let (maps, brk) =
            exec_layout(&eng).unwrap_or_else(|| panic!("{prog}: aslr={numbers}: {err}\n{eng}"));
        assert_eq!(
            maps, host_maps,
            "{prog}: usermm's maps with aslr={numbers} differ from the host's"
        );
        assert_eq!(brk, host_brk, "{prog}: the break, aslr={numbers}");
        compared += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("exec with randomisation: {compared} programs laid out as on the host");
}

/// A small deterministic generator (xorshift64*), so that a failing
/// scenario is reproduced by its seed alone.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// Where region `i` of a random scenario lives: 64 MiB apart in an area
/// that nothing else of the host's process uses.
fn slot(i: u64) -> u64 {
    0x6000_0000_0000 + i * (64 << 20)
}

/// A random scenario: a THP size, up to three regions at fixed addresses
/// (now and then populated, without reserve, locked, or stacks that grow
/// down), then operations on page-aligned (now and then unaligned) parts
/// of them, mremaps, accesses below them, forks, threads of the first
/// process (on the next CPU), a vfork child of it that loads and stores
/// and exits, switches and exits, THP knob changes, and marks with every figure but VmRSS and
/// the PMD-sized THP counters of /proc/vmstat compared. A quarter of them
/// first exec /usr/bin/true and work in its address space (natively the
/// server makes the calls as that program): with a heap `H` that brk
/// grows and shrinks, `maps` compared line by line, and no files, forks,
/// stacks that grow down or mincore, which are not made natively for an
/// exec'd program. Every statement's outcome is comparable: the
/// expectations are arbitrary (they may fail on both sides alike); what
/// must agree is what each side saw.
fn random_scenario(seed: u64) -> String {
    // Drawn apart, so that the scenarios that do not exec are those the
    // seeds gave before exec was drawn.
    let exec = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1).below(4) == 0;
    // Whether a fork from main makes a thread instead, drawn apart too.
    let mut threads_rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555);
    let mut threads = 0;
    let mut vforked = false;
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut s = format!("# random scenario, seed {seed}\n");
    let sizes = ["4K", "16K", "64K", "2M"];
    s += &format!("knob only {}\n", r.pick(&sizes));
    if r.below(4) == 0 {
        s += "knob use_zero_page 0\n";
    }
    // A third give shmem large folios, drawn apart (the other draws stay
    // as the seeds gave them before shmem had them).
    let mut shmem_rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x7777);
    if shmem_rng.below(3) == 0 {
        let knob = shmem_rng.pick(&[
            "shmem 16K always",
            "shmem 64K always",
            "shmem 64K within_size",
            "shmem_enabled always",
            "shmem_enabled advise",
        ]);
        s += &format!("knob {knob}\n");
    }
    if exec {
        s += "require file /usr/bin/true\nexec /usr/bin/true\nbrk +256K as=H\n";
    }
    let lens = [64 << 10, 256 << 10, 2 << 20, 4 << 20];
    // Half the scenarios have a file: written whole (large folios) or in
    // pages, its size a few pages past a size that folios fill.
    let file_size =
        (!exec && r.below(2) == 0).then(|| lens[r.below(4) as usize] + r.below(3) * 4096);
    let mut file_is_shmem = false;
    if let Some(size) = file_size {
        // An ext4 file, a tmpfs one or a memfd (both shmem).
        let seed = 1 + r.below(9);
        let kind = r.below(4);
        file_is_shmem = kind < 2;
        s += &match kind {
            0 => format!("file F {size} seed={seed} fs=tmpfs\n"),
            1 => format!("memfd F {size} seed={seed}\n"),
            _ => format!("file F {size} seed={seed}{}\n", r.pick(&["", " chunk=4K"])),
        };
    }
    let regions = 1 + r.below(3);
    let mut len = vec![0u64; regions as usize];
    // Which regions are shmem (shared anonymous, tmpfs, memfd), whose
    // MADV_COLLAPSE (`collapse_file`) usermm does not model: none is drawn.
    let mut shmem = vec![false; regions as usize];
    for i in 0..regions {
        len[i as usize] = lens[r.below(4) as usize];
        let prot = r.pick(&["rw", "rw", "rw", "r", "none"]);
        if file_size.is_some() && r.below(2) == 0 {
            // A mapping of the file, shared or private, from its start or
            // a few pages in.
            let flags = r.pick(&["private", "shared", "private,populate"]);
            let off = r.pick(&["0", "0", "16K"]);
            shmem[i as usize] = file_is_shmem;
            s += &format!(
                "map R{i} {}K {prot} at={:#x} file=F off={off} flags={flags}\n",
                len[i as usize] >> 10,
                slot(i)
            );
            continue;
        }
        let flags = r.pick(&[
            "",
            "",
            "",
            "",
            " flags=private,anonymous,populate",
            " flags=private,anonymous,noreserve",
            " flags=shared,anonymous",
            " flags=private,anonymous,locked",
            " flags=private,anonymous,growsdown",
            " flags=private,anonymous,stack",
        ]);
        shmem[i as usize] = flags.contains("shared");
        let flags = if exec && flags.contains("growsdown") {
            ""
        } else {
            flags
        };
        s += &format!(
            "map R{i} {}K {prot} at={:#x}{flags}\n",
            len[i as usize] >> 10,
            slot(i)
        );
    }
    s += "mark m\n";
    let mut procs = vec!["main".to_string()];
    let mut cur = 0usize;
    let mut children = 0;
    for _ in 0..8 + r.below(20) {
        let i = r.below(regions) as usize;
        let pages = len[i] >> 12;
        let first = r.below(pages);
        let n = 1 + r.below(pages - first);
        let mut off = first << 12;
        if r.below(16) == 0 {
            off += 8; // unaligned: EINVAL for the syscalls
        }
        let at = format!("R{i}+{off:#x}");
        let bytes = format!("{}K", n << 2);
        s += &match r.below(23) {
            // The heap of an exec'd program: the break moved, its pages
            // written and read, the whole address space compared.
            15 | 20 if exec => match r.below(6) {
                0 => format!("brk +{}K\n", 4 * (1 + r.below(128))),
                1 => format!("brk -{}K\n", 4 * (1 + r.below(128))),
                2 => format!("brk H+{:#x}\n", r.below(1 << 19)),
                3 => format!("fill H {}K {}\n", 4 * (1 + r.below(64)), 1 + r.below(9)),
                4 => format!("check H+{:#x} 4K zero\n", r.below(64) << 12),
                _ => "maps\n".to_string(),
            },
            0..=3 => format!("fill {at} {bytes} {}\n", 1 + r.below(9)),
            4 => format!("check {at} {bytes} {}\n", 1 + r.below(9)),
            5 => format!("check {at} {bytes} zero\n"),
            6 => format!("write {at} {}\n", r.below(1000)),
            7 => format!("read {at}\n"),
            8 => format!("munmap {at} {bytes}\n"),
            9 | 10 => format!("mprotect {at} {bytes} {}\n", r.pick(&["rw", "r", "none"])),
            12 if file_size.is_some() && r.below(4) == 0 => {
                format!(
                    "msync {at} {bytes} {}\n",
                    r.pick(&["sync", "async", "sync invalidate"])
                )
            }
            13 if file_size.is_some() && r.below(8) == 0 => {
                format!("truncate F {}\n", r.below(4) * (64 << 10))
            }
            11..=13 => format!("madvise {at} {bytes} {}\n", {
                let advice = r.pick(&[
                    "dontneed",
                    "free",
                    "pageout",
                    "willneed",
                    "hugepage",
                    "nohugepage",
                    "dontfork",
                    "dofork",
                    "wipeonfork",
                    "keeponfork",
                    "populate_read",
                    "populate_write",
                    "collapse",
                    "remove",
                ]);
                if advice == "collapse" && shmem[i] {
                    "hugepage"
                } else {
                    advice
                }
            }),
            19 => format!("mlock {at} {bytes}{}\n", r.pick(&["", "", " onfault"])),
            20 if r.below(2) == 0 => format!("munlock {at} {bytes}\n"),
            20 => format!("mincore {at} {bytes}\n"),
            14 => {
                shmem[i] = false;
                format!(
                    "map R{i} {}K {} at={:#x} flags=private,anonymous,fixed\n",
                    len[i] >> 10,
                    r.pick(&["rw", "r"]),
                    slot(i as u64)
                )
            }
            // A vfork child of main: it loads and stores on main's memory,
            // then exits, main waiting meanwhile. (Not exec: natively the
            // child execs the usermm binary first, whose start drains the
            // CPU's LRU and mlock batches as the program's exec does not.)
            15 if !exec && cur == 0 && !vforked && threads_rng.below(4) == 0 => {
                vforked = true;
                let mut b = String::from("vfork v1\nswitch v1\n");
                for _ in 0..1 + threads_rng.below(3) {
                    let at = format!("R{i}+{:#x}", threads_rng.below(pages) << 12);
                    b += &match threads_rng.below(3) {
                        0 => format!("fill {at} {bytes} {}\n", 1 + threads_rng.below(9)),
                        1 => format!("write {at} {}\n", threads_rng.below(1000)),
                        _ => format!("read {at}\n"),
                    };
                }
                b + "exit v1\nswitch main\n"
            }
            // A thread of main, on the next CPU.
            15 if !exec && cur == 0 && threads < 2 && threads_rng.below(3) == 0 => {
                threads += 1;
                let t = format!("t{threads}");
                procs.push(t.clone());
                format!("thread {t}\n")
            }
            15 if children < 2 => {
                children += 1;
                let c = format!("c{children}");
                procs.push(c.clone());
                format!("fork {c}\n")
            }
            16 => {
                cur = r.below(procs.len() as u64) as usize;
                format!("switch {}\n", procs[cur])
            }
            17 if cur != 0 => {
                let gone = procs.remove(cur);
                cur = 0;
                format!("exit {gone}\nswitch main\n")
            }
            18 if r.below(3) == 0 => format!("knob only {}\n", r.pick(&sizes)),
            18 => "mark m\n".to_string(),
            // mremap: in place (shrinking, or growing where there is room),
            // or moved to one of two areas of their own, whole PMDs apart
            // or not, the old range unmapped or left empty.
            22 => {
                let new_len = lens[r.below(4) as usize] >> 10;
                let target = slot(3 + r.below(2)) + [0, 0x1000, 0x20_0000][r.below(3) as usize];
                match r.below(4) {
                    0 | 1 => format!("mremap {at} {bytes} {new_len}K\n"),
                    2 => format!("mremap {at} {bytes} {new_len}K maymove fixed={target:#x}\n"),
                    _ => {
                        format!("mremap {at} {bytes} {bytes} maymove dontunmap fixed={target:#x}\n")
                    }
                }
            }
            // Below a region: a stack grows down there (as far as
            // RLIMIT_STACK lets it), anything else is a SIGSEGV.
            21 if r.below(2) == 0 => {
                let below = (1 + r.below(2560)) << 12;
                match r.below(2) {
                    0 => format!("write R{i}-{below:#x} {}\n", r.below(1000)),
                    _ => format!("read R{i}-{below:#x}\n"),
                }
            }
            _ if r.below(3) == 0 => {
                format!("expect vmstat {} since m == 0\n", r.pick(&VMSTAT_COMPARED))
            }
            _ => format!(
                "expect {} since m == 0\n",
                r.pick(&[
                    "RssAnon",
                    "RssFile",
                    "RssShmem",
                    "VmPTE",
                    "AnonHugePages",
                    "VMAs",
                    "VmLck",
                    "Locked"
                ])
            ),
        };
    }
    for f in [
        "RssAnon",
        "RssFile",
        "RssShmem",
        "VmPTE",
        "AnonHugePages",
        "VMAs",
        "VmLck",
        "Locked",
    ] {
        s += &format!("expect {f} since m == 0\n");
    }
    for v in VMSTAT_COMPARED {
        s += &format!("expect vmstat {v} since m == 0\n");
    }
    s
}

/// The /proc/vmstat counters the random scenarios compare. Not the mTHP
/// sizes' fault counters: with a size set to `always`, every process of
/// the host that faults (the test harness too) counts there.
const VMSTAT_COMPARED: [&str; 3] = ["thp_fault_alloc", "thp_split_pmd", "nr_mlock"];

/// Random scenarios run in usermm and natively must see the same thing at
/// every statement: errno, values read, placement, and the changes of
/// every figure but VmRSS. `USERMM_RANDOM_SCENARIOS=N` runs N (default 200;
/// `USERMM_RANDOM_SEED` moves the first seed; `USERMM_RANDOM_KEEP=DIR`
/// keeps the files). Prints how many ran, and each disagreement with its
/// scenario's text. A disagreement is run natively twice more: one that
/// does not repeat is the host's noise, counted and printed apart.
#[test]
fn random_scenarios_run_alike_in_usermm_and_on_the_host() {
    let _host = host_to_ourselves();
    let count: u64 = std::env::var("USERMM_RANDOM_SCENARIOS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let first: u64 = std::env::var("USERMM_RANDOM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    // USERMM_RANDOM_KEEP=DIR keeps the generated files there.
    let keep = std::env::var_os("USERMM_RANDOM_KEEP").map(PathBuf::from);
    let dir = keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("usermm-random-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).unwrap();
    let (mut ran, mut skipped, mut failures, mut host_noise_seeds) = (0, 0, vec![], vec![]);
    for seed in first..first + count {
        let f = dir.join(format!("random_{seed}.scn"));
        std::fs::write(&f, random_scenario(seed)).unwrap();
        let (ecode, eng, eerr) = run(&f, false);
        if ecode > 1 {
            failures.push(format!("seed {seed}: usermm exited {ecode}\n{eerr}"));
            continue;
        }
        let (ncode, nat, nerr) = run(&f, true);
        if ncode == 3 {
            skipped += 1;
            continue;
        }
        ran += 1;
        let mut agree = outcomes_agree(&eng, &nat);
        if ncode <= 1 && !agree && host_noise(&f, &eng, ecode) {
            host_noise_seeds.push(seed);
            agree = true;
        }
        if ncode > 1 || !agree {
            failures.push(format!(
                "seed {seed}: host exited {ncode}\n{nerr}{}the scenario:\n{}",
                side_by_side(&eng, &nat),
                random_scenario(seed)
            ));
        }
    }
    if keep.is_none() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "random differential scenarios: {ran} compared, {skipped} skipped natively, {} disagreed; \
         {} disagreed once and agreed when run again (host noise; seeds {host_noise_seeds:?})",
        failures.len(),
        host_noise_seeds.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
