//! `usermm bench migrc` end to end, briefly: every arm's loads and result
//! read-backs agree with what was stored (no stale read, no lost write);
//! only MIGRC keeps sources, and only when migrated pages come back clean
//! (`migration_entry_ad` off): with the host's A/D bits carried, a page
//! written once stays dirty and is never eligible. LUF keeps nothing, and
//! defers (then flushes) only when pages come back clean.

mod common;

#[test]
fn migrc_keeps_sources_only_when_pages_come_back_clean() {
    // Warmed up long enough that, on two CPUs, pages the build wrote have
    // been demoted and promoted back clean before the measured part.
    let v = common::bench_json(
        "migrc",
        &["--runs", "1", "--lookups", "50000", "--warmup", "300000"],
        |_| Vec::new(),
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
        // LUF's flushes over the whole run, as kept_peak is: in a round
        // this short the measured part may hold none.
        let luf =
            r["luf_takeoff_flushes"].as_u64().unwrap() + r["luf_forced_flushes"].as_u64().unwrap();
        let luf_run = part("luf_flushes_whole_run");
        assert!(luf <= luf_run, "{r}");
        if r["arm"] == "luf" && clean {
            assert!(luf_run > 0, "{r}");
        } else {
            assert_eq!(luf_run, 0, "{r}");
        }
    }
}
