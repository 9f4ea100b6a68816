//! `usermm bench munmap` end to end, small: the rounds, the ratio's
//! interval and the samples it came from are in every row.

mod common;

#[test]
fn munmap_rows_carry_their_interval_and_samples() {
    let v = common::bench_json(
        "munmap",
        &[
            "--runs",
            "6",
            "--size-mb",
            "8",
            "--sizes",
            "4,64",
            "--no-host",
        ],
        |_| vec![],
    );
    assert_eq!(v["runs"], "6");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r["runs"], 6, "{r}");
        let s = &r["samples"];
        assert_eq!(s["baseline_s"].as_array().map(Vec::len), Some(6));
        assert_eq!(s["batched_s"].as_array().map(Vec::len), Some(6));
        assert_eq!(s["host_s"].as_array().map(Vec::len), Some(0));
        // The median of the per-round ratios, between the extremes (the
        // interval of 6 rounds).
        let ratios: Vec<f64> = s["batched_s"]
            .as_array()
            .unwrap()
            .iter()
            .zip(s["baseline_s"].as_array().unwrap())
            .map(|(p, b)| p.as_f64().unwrap() / b.as_f64().unwrap())
            .collect();
        let lo = ratios.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().cloned().fold(0.0, f64::max);
        // (JSON's decimal floats come back within an ulp.)
        let near = |x: &serde_json::Value, y: f64| (x.as_f64().unwrap() - y).abs() <= 1e-12 * y;
        assert!(near(&r["ci_low"], lo), "{r}: low {lo}");
        assert!(near(&r["ci_high"], hi), "{r}: high {hi}");
        let q = r["ratio"].as_f64().unwrap();
        assert!(lo * (1.0 - 1e-12) <= q && q <= hi * (1.0 + 1e-12), "{r}");
    }
}

/// `--backing shmem`: shared anonymous memory of each size, the engine's
/// own checks (every folio of the size, PMD-mapped exactly for the PMD
/// row) passing, the zap batching arm faster where folios are large.
#[test]
fn munmap_of_shmem_runs_every_size_it_is_asked() {
    let v = common::bench_json(
        "munmap",
        &[
            "--runs",
            "2",
            "--size-mb",
            "8",
            "--sizes",
            "4,64,2048",
            "--backing",
            "shmem",
            "--no-host",
        ],
        |_| vec![],
    );
    assert_eq!(v["backing"], "shmem");
    let rows = v["rows"].as_array().expect("rows");
    let labels: Vec<(u64, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["folio_kb"].as_u64().unwrap(),
                r["mapping"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        labels,
        [(4, "pte"), (64, "pte"), (2048, "pte"), (2048, "pmd")]
    );
    for r in rows {
        assert!(r["baseline_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["batched_s"].as_f64().unwrap() > 0.0, "{r}");
    }
}
