//! What the CLI's experiment tests share.

use std::process::Command;

use serde_json::Value;

/// Run `usermm bench ARGS --json --out DIR` in a folder of its own (removed
/// afterwards), expect success, and return the experiment's JSON object.
/// `setup` may write files into the folder first and add arguments.
pub fn bench_json(
    name: &str,
    args: &[&str],
    setup: impl FnOnce(&std::path::Path) -> Vec<String>,
) -> Value {
    // One folder per call: the tests of one file run in parallel.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("usermm-{name}-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a results folder");
    let extra = setup(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["bench", name])
        .args(args)
        .args(extra)
        .args(["--json", "--out"])
        .arg(&dir)
        .output()
        .expect("run usermm");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}
