//! The stress driver for a minute (`USERMM_STRESS_SECONDS` to change it),
//! with debug assertions on: random operations on CPU 0 while the other
//! CPUs load and store through the shadow memory, invariant checks at
//! quiescent points, a watchdog, and no frame or commitment left at the end.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long past its own duration the run may take before the test kills
/// it: the driver's watchdog should end a stalled run long before.
const GRACE: Duration = Duration::from_secs(180);

#[test]
fn stress_runs_clean() {
    let secs = std::env::var("USERMM_STRESS_SECONDS").unwrap_or_else(|_| "60".into());
    let limit = Duration::from_secs(secs.parse().unwrap_or(60)) + GRACE;
    let mut child = Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["stress", "--seconds", &secs, "--seed", "7"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run usermm stress");
    // Drain both pipes on their own threads, so that a chatty run never
    // blocks on a full pipe while this thread waits.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for usermm stress") {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = out.join().unwrap_or_default();
    let errs = err.join().unwrap_or_default();
    // Written to stderr directly, so that the figures show in CI's log.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{text}");
    let Some(status) = status else {
        panic!("usermm stress ran past {limit:?} and was killed:\n{text}\n{errs}");
    };
    assert_eq!(
        status.code(),
        Some(0),
        "usermm stress failed:\n{text}\n{errs}"
    );
    assert!(text.contains("violations: 0, leaked frames: 0"), "{text}");
}
