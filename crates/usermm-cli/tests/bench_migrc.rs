//! `usermm bench migrc` end to end, briefly: every arm's loads and result
//! read-backs agree with what was stored (no stale read, no lost write);
//! only MIGRC keeps sources, and only when migrated pages come back clean
//! (`migration_entry_ad` off): with the host's A/D bits carried, a page
//! written once stays dirty and is never eligible. LUF keeps nothing, and
//! defers (then flushes) only when pages come back clean.

mod common;

/// The bench's earlier default machine, about a tenth of today's (16 MiB
/// of DRAM with two CPUs beside 64 MiB of slow memory), written into the
/// test's folder: a grid of 24 MiB, which a test builds in a second,
/// scanned 1 MB at a time.
fn small_machine(dir: &std::path::Path) -> Vec<String> {
    let f = dir.join("small.toml");
    std::fs::write(
        &f,
        "[[node]]\nsize = \"16M\"\ncpus = 2\n[[node]]\nsize = \"64M\"\ntier = \"slow\"\n",
    )
    .expect("a machine file");
    vec!["--machine".into(), f.display().to_string()]
}

#[test]
fn migrc_keeps_sources_only_when_pages_come_back_clean() {
    // Warmed up long enough that, on two CPUs, pages the build wrote have
    // been demoted and promoted back clean before the measured part.
    let v = common::bench_json(
        "migrc",
        &[
            "--runs",
            "1",
            "--lookups",
            "50000",
            "--warmup",
            "300000",
            "--scan-size-mb",
            "1",
            "--migration-entry-ad",
            "both",
        ],
        small_machine,
    );
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 6, "{v}");
    for r in rows {
        assert_eq!(r["stale_reads"], 0, "{r}");
        assert_eq!(r["lost_writes"], 0, "{r}");
        assert!(r["pgmigrate_success"].as_u64().unwrap() > 0, "{r}");
        // One round: its samples are the medians.
        assert_eq!(
            r["samples_pgmigrate_success"][0], r["pgmigrate_success"],
            "{r}"
        );
        assert_eq!(
            r["samples_nr_tlb_remote_flush"][0], r["nr_tlb_remote_flush"],
            "{r}"
        );
        // The scan's shootdowns are some of them, and the scan ran.
        let scan = r["usermm_numa_scan_remote_flush"].as_u64().unwrap();
        assert!(scan > 0, "{r}");
        assert!(scan <= r["nr_tlb_remote_flush"].as_u64().unwrap(), "{r}");
        // The shootdowns told apart are some of them, each counted once
        // (an inner account takes a flush from an outer one); MIGRC's
        // counts are nothing in the other arms.
        let part = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k}: {r}"));
        let forced = [
            "usermm_migrc_flush_wp_fault",
            "usermm_migrc_flush_watermark",
            "usermm_migrc_flush_pressure",
            "usermm_migrc_flush_refused",
        ];
        let told: u64 = scan
            + part("usermm_mr_demotion_remote_flush")
            + part("usermm_mr_numa_misplaced_remote_flush")
            + forced.iter().map(|k| part(k)).sum::<u64>();
        assert!(told <= r["nr_tlb_remote_flush"].as_u64().unwrap(), "{r}");
        if r["arm"] != "migrc" {
            assert_eq!(forced.iter().map(|k| part(k)).sum::<u64>(), 0, "{r}");
        }
        if r["arm"] == "off" {
            assert_eq!(part("usermm_migrc_can_migrc_fail"), 0, "{r}");
        }
        // The tiering path: promotions come from hinting faults on the
        // slow node's pages, hot enough (or with room to spare) and not
        // refused; a fault counts all of these in the thread that takes
        // it, so within the measured part. (kswapd's counts are not
        // checked: a round this short may promote into room the warm-up
        // left, with no kswapd run in it, and a run may straddle the
        // round's start.)
        let remote = part("numa_hint_faults");
        let promoted = part("pgpromote_success");
        assert!(
            promoted + part("usermm_numa_promote_refused")
                <= part("pgpromote_candidate") + part("pgpromote_candidate_nrl"),
            "{r}"
        );
        assert!(
            part("pgpromote_candidate") + part("pgpromote_candidate_nrl") <= remote,
            "{r}"
        );
        let kept = r["kept_peak"].as_u64().unwrap();
        let clean = r["migration_entry_ad"] == false;
        if r["arm"] == "migrc" && clean {
            assert!(kept > 0, "{r}");
        } else {
            assert_eq!(kept, 0, "{r}");
        }
        // LUF's deferrals and flushes over the whole run, as kept_peak
        // is: in a round this short the measured part may hold none, and
        // a deferred flush may still be owed at the end (no page it
        // stamped taken off the free lists again, no forced flush yet),
        // so only the deferrals are required.
        let luf =
            r["luf_takeoff_flushes"].as_u64().unwrap() + r["luf_forced_flushes"].as_u64().unwrap();
        let luf_run = part("luf_flushes_whole_run");
        let deferred = part("luf_deferred_whole_run");
        assert!(luf <= luf_run, "{r}");
        if r["arm"] == "luf" && clean {
            assert!(deferred > 0, "{r}");
        } else {
            assert_eq!(deferred, 0, "{r}");
            assert_eq!(luf_run, 0, "{r}");
        }
    }
}

/// One brief round on [`small_machine`], with `extra` arguments: its
/// rows.
fn brief_rows(extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec![
        "--runs",
        "1",
        "--lookups",
        "5000",
        "--warmup",
        "5000",
        "--scan-size-mb",
        "1",
    ];
    args.extend_from_slice(extra);
    let v = common::bench_json("migrc", &args, small_machine);
    v["rows"].as_array().expect("rows").clone()
}

/// `--arms` and `--migration-entry-ad` choose the rows: here `off` and
/// `migrc` with migrated pages coming back clean, and nothing else.
#[test]
fn arms_and_ad_settings_can_be_chosen() {
    let rows = brief_rows(&["--arms", "migrc,off", "--migration-entry-ad", "off"]);
    let arms: Vec<(&str, bool)> = rows
        .iter()
        .map(|r| {
            (
                r["arm"].as_str().unwrap(),
                r["migration_entry_ad"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(arms, [("off", false), ("migrc", false)], "{rows:?}");
    assert!(
        rows[1]["ratio"].is_number(),
        "migrc is compared with off: {rows:?}"
    );
}

/// `--arms off` alone runs: one row, with nothing to compare it with.
#[test]
fn the_baseline_alone_runs() {
    let rows = brief_rows(&["--arms", "off"]);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["arm"], "off", "{rows:?}");
    assert!(rows[0]["ratio"].is_null(), "{rows:?}");
}
