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
    let mut c = Command::new(env!("CARGO_BIN_EXE_usermm"));
    c.arg("run").arg("--json");
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

#[test]
fn corpus_runs_alike_in_usermm_and_on_the_host() {
    let files = corpus();
    assert!(
        files.len() >= 20,
        "the corpus has {} scenarios",
        files.len()
    );
    let (mut skipped, mut failures) = (vec![], vec![]);
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let (ecode, eng, eerr) = run(f, false);
        if ecode != 0 {
            failures.push(format!(
                "{name}: usermm exited {ecode}\n{eerr}{}",
                side_by_side(&eng, &Value::Null)
            ));
            continue;
        }
        let (ncode, nat, nerr) = run(f, true);
        if ncode == 3 {
            skipped.push(format!(
                "{name}: {}",
                nat["skipped"].as_str().unwrap_or("?")
            ));
            continue;
        }
        let agree = lines(&eng)
            .iter()
            .map(|x| &x.2)
            .eq(lines(&nat).iter().map(|x| &x.2));
        if ncode != 0 || !agree {
            failures.push(format!(
                "{name}: host exited {ncode}{}\n{nerr}{}",
                if agree { "" } else { ", outcomes differ" },
                side_by_side(&eng, &nat)
            ));
        }
    }
    // Written to stderr directly, so that it shows although the test
    // harness captures the print macros of passing tests.
    use std::io::Write;
    let skipped_list: String = skipped.iter().map(|s| format!("\n  {s}")).collect();
    let _ = writeln!(
        std::io::stderr(),
        "differential corpus: {} scenarios, {} skipped natively{skipped_list}",
        files.len(),
        skipped.len(),
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
