//! `usermm bench pft` end to end, small: every arm runs, and the shared
//! cache-line measure tells the three fault locks apart as their designs
//! say it must (a count, not a timing: it does not depend on the host).

mod common;

#[test]
fn pft_rows_and_the_shared_line_measure() {
    let v = common::bench_json(
        "pft",
        &[
            "--size-mb",
            "16",
            "--runs",
            "1",
            "--no-host",
            "--threads",
            "1,2",
        ],
        |_| vec![],
    );
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2 * 3 * 3, "threads x writers x modes");
    for r in rows {
        assert!(r["faults_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            r["p99_ns"].as_f64().unwrap() >= r["p50_ns"].as_f64().unwrap(),
            "{r}"
        );
    }
    let shared = |mode: &str| {
        rows.iter()
            .find(|r| r["mode"] == mode && r["threads"] == 2 && r["writer"] == "none")
            .and_then(|r| r["shared_writes_per_fault"].as_f64())
            .expect("a row")
    };
    // Two fault threads: each writes the mmap_lock word twice a fault, or
    // the VMA's vm_refcnt twice a fault; speculation writes neither. A
    // write counts once the other thread has written the line in the same
    // run, so a thread that ran its whole slice before the other began
    // (these slices are small, and the host may be busy) is charged none
    // and the pair at least half of two a fault.
    let mmap = shared("mmap_lock");
    assert!((0.99..=2.2).contains(&mmap), "mmap_lock: {mmap}");
    let vma = shared("vma_lock");
    assert!((0.99..=3.0).contains(&vma), "vma_lock: {vma}");
    assert!(shared("spf") <= 0.3, "spf: {}", shared("spf"));
}

#[test]
fn pft_thread_counts_are_chosen_and_checked() {
    let v = common::bench_json(
        "pft",
        &[
            "--size-mb",
            "8",
            "--runs",
            "1",
            "--no-host",
            "--threads",
            "3,1",
        ],
        |_| vec![],
    );
    let mut counts: Vec<u64> = v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["threads"].as_u64().expect("threads"))
        .collect();
    counts.dedup();
    assert_eq!(counts, [1, 3], "sorted, each count once per arm group");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_usermm"))
        .args(["bench", "pft", "--threads", "0"])
        .output()
        .expect("run usermm");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--threads: 0"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
