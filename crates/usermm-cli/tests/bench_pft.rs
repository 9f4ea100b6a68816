//! `usermm bench pft` end to end, small: every arm runs, and the shared
//! cache-line measure tells the three fault locks apart as their designs
//! say it must (a count, not a timing: it does not depend on the host).

mod common;

#[test]
fn pft_rows_and_the_shared_line_measure() {
    let v = common::bench_json(
        "pft",
        &["--size-mb", "16", "--runs", "1", "--no-host"],
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
    // Two fault threads: both write the mmap_lock word twice a fault, or
    // the VMA's vm_refcnt twice a fault; speculation writes neither.
    assert!(
        shared("mmap_lock") >= 1.9,
        "mmap_lock: {}",
        shared("mmap_lock")
    );
    let vma = shared("vma_lock");
    assert!((1.0..=3.0).contains(&vma), "vma_lock: {vma}");
    assert!(shared("spf") <= 0.3, "spf: {}", shared("spf"));
}
