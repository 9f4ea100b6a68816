//! `usermm bench migrate` end to end, small: every arm moves the whole
//! region, and the batched flush sends one shootdown per 512 pages where
//! the per-PTE flush sends one per page (counts, not timings: they do not
//! depend on the host).

mod common;

#[test]
fn migrate_rows_and_the_batched_flush() {
    let v = common::bench_json(
        "migrate",
        // The region moved is a quarter of --size-mb: 8 MiB.
        &["--size-mb", "32", "--runs", "1", "--sizes", "4,64"],
        |_| vec![],
    );
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2 * 2 * 2, "sizes x batch x CPUs");
    let pages = 8 << 20 >> 12;
    for r in rows {
        assert_eq!(r["pgmigrate_success"], pages, "{r}");
        let remote = r["nr_tlb_remote_flush"].as_u64().unwrap();
        let want = match (
            r["cpus"].as_u64().unwrap(),
            r["batch_flush"].as_bool().unwrap(),
        ) {
            (1, _) => 0,
            (_, false) => pages,
            (_, true) => pages / 512,
        };
        assert_eq!(remote, want, "{r}");
        // The batched rows carry their time over the unbatched arm's, one
        // round: the interval is the one ratio itself.
        let batched = r["batch_flush"].as_bool().unwrap();
        assert_eq!(r["ratio"].is_null(), !batched, "{r}");
        if batched {
            let samples = r["samples_time_s"].as_array().unwrap();
            assert_eq!(samples.len(), 1, "{r}");
            assert_eq!(r["ci_low"], r["ratio"], "{r}");
            assert_eq!(r["ci_high"], r["ratio"], "{r}");
        }
    }
}
