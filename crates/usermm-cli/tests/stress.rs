//! The stress driver for a minute (`USERMM_STRESS_SECONDS` to change it),
//! with debug assertions on: random operations on CPU 0 while the other
//! CPUs load and store through the shadow memory, invariant checks at
//! quiescent points, a watchdog, and no frame or commitment left at the end.

use std::process::Command;

#[test]
fn stress_runs_clean() {
    let secs = std::env::var("USERMM_STRESS_SECONDS").unwrap_or_else(|_| "60".into());
    let out = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["stress", "--seconds", &secs, "--seed", "7"])
        .output()
        .expect("run usermm stress");
    let text = String::from_utf8_lossy(&out.stdout);
    // Written to stderr directly, so that the figures show in CI's log.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{text}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "usermm stress failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("violations: 0, leaked frames: 0"), "{text}");
}
