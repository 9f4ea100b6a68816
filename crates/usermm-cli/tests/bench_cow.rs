//! `usermm bench cow` end to end, small: the worked example of
//! docs/extending.md. After fork and the child's exit, the parent's writes
//! copy every page of a large folio with `wp_reuse_large` off (the kernel
//! before v6.15) and none with it on; small folios and a PMD-mapped THP,
//! which both kernels reuse, allocate nothing either way.

mod common;

#[test]
fn reuse_of_large_folios_allocates_no_copies() {
    let v = common::bench_json(
        "cow",
        &[
            "--runs",
            "1",
            "--size-mb",
            "8",
            "--sizes",
            "4,64,2048",
            "--no-host",
        ],
        |_| vec![],
    );
    assert_eq!(v["tunable"], "wp_reuse_large", "{v}");
    let rows = v["rows"].as_array().expect("rows");
    let pages = |r: &serde_json::Value, arm: &str| {
        r["pages_allocated"][arm]
            .as_u64()
            .unwrap_or_else(|| panic!("{arm}: {r}"))
    };
    let got: Vec<(String, u64, u64)> = rows
        .iter()
        .map(|r| {
            let label = format!("{}K {}", r["folio_kb"], r["mapping"].as_str().unwrap());
            (label, pages(r, "baseline"), pages(r, "batched"))
        })
        .collect();
    let all = 8 << 8; // 8 MiB of 4 KiB pages
    assert_eq!(
        got,
        [
            ("4K pte".to_string(), 0, 0),
            ("64K pte".to_string(), all, 0),
            ("2048K pte".to_string(), all, 0),
            ("2048K pmd".to_string(), 0, 0),
        ],
        "{v}"
    );
}
