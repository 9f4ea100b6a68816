//! `usermm bench access` end to end, briefly: every loop runs in the
//! engine and on the host, and the rows say so in the documented shape.

mod common;

#[test]
fn access_rows_pair_the_engine_with_the_host() {
    let v = common::bench_json("access", &["--runs", "1", "--size-mb", "16"], |_| vec![]);
    let rows = v["rows"].as_array().expect("rows");
    let ops = [
        "load_tlb_hit",
        "store_tlb_hit",
        "load_tlb_miss",
        "byte_copy",
    ];
    assert_eq!(rows.len(), ops.len() * 2 * 2, "{rows:?}");
    for op in ops {
        for cpus in [1, 2] {
            for native in [false, true] {
                let r = rows
                    .iter()
                    .find(|r| r["op"] == op && r["cpus"] == cpus && r["native"] == native)
                    .unwrap_or_else(|| panic!("no row {op} x{cpus} native={native}"));
                let unit = if op == "byte_copy" { "gbps" } else { "per_s" };
                let rate = r[unit].as_f64().expect("a rate");
                assert!(rate > 0.0 && rate.is_finite(), "{r}");
                assert_eq!(r["samples"].as_array().map(Vec::len), Some(1));
                if native {
                    assert!(r["ratio"].is_null());
                } else {
                    let q = r["ratio"].as_f64().expect("engine / host");
                    assert!(r["ci_low"].as_f64() <= Some(q) && Some(q) <= r["ci_high"].as_f64());
                }
            }
        }
    }
}
