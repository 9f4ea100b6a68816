//! One line per experiment, from its JSON: what it shows, the published
//! figure where a patch series published one, usermm's figure with its
//! interval, and the host kernel's. The report opens with these lines, the
//! bench ends with them, and `summary.json` holds them.
//!
//! Each figure is read from the rows the experiment wrote, so that a
//! report made later from a results folder says the same as the run did;
//! an experiment whose rows lack the row a line needs (a `--sizes` that
//! left it out) gets no line.

use serde::Serialize;
use serde_json::Value;

/// The summary line of one experiment.
#[derive(Clone, Debug, Serialize)]
pub struct Headline {
    pub experiment: &'static str,
    /// What the line measures, in a few words.
    pub what: String,
    /// The patch series' own published figure, where there is one.
    pub published: Option<String>,
    /// usermm's figure, with its interval where it has one.
    pub usermm: String,
    /// The host kernel's figure in the same run, where it has one.
    pub host: Option<String>,
}

/// The headline of experiment `name` from its JSON object.
pub fn headline(name: &'static str, v: &Value) -> Option<Headline> {
    let rows = v["rows"].as_array()?;
    // Over a file's page cache or shmem (`--backing`), or anonymous
    // memory: said after the figure's name.
    let of_backing = match v["backing"].as_str() {
        Some("file") => ", of a file's page cache",
        Some("shmem") => ", of shared anonymous memory",
        _ => "",
    };
    let line = |what: String, published: Option<String>, usermm: String, host: Option<String>| {
        Some(Headline {
            experiment: name,
            what,
            published,
            usermm,
            host,
        })
    };
    match name {
        "munmap" | "dontneed" | "fork" | "cow" => {
            let r = find(
                rows,
                &[("folio_kb", 2048.into()), ("mapping", "pte".into())],
            )?;
            let what = match name {
                "munmap" => "zap batching: munmap of 2 MiB folios mapped by PTEs",
                "dontneed" => "zap batching: MADV_DONTNEED of the same",
                "fork" => "fork batching: fork with 2 MiB folios mapped by PTEs",
                _ => "large-folio reuse (v6.15): writes after fork and the child's exit",
            };
            let what = format!("{what}{of_backing}");
            let host = beside(r, "host_s", "batched_s");
            let published = f(r, "seed_change_pct").map(|c| format!("{c:+.0}%").replace('-', "−"));
            line(what, published, change(r, "ratio")?, host)
        }
        "pt_reclaim" => {
            let whole = |design: &str| {
                find(
                    rows,
                    &[
                        ("design", design.into()),
                        ("mode", "whole".into()),
                        ("pt_reclaim_pmd", false.into()),
                    ],
                )
            };
            let (off, up) = (whole("off")?, whole("upstream")?);
            let kb = |r: &Value, k: &str| f(r, k).map(|x| format!("{} kB", thousands(x)));
            let usermm = format!(
                "{} → {}",
                kb(off, "vmpte_after_kb")?,
                kb(up, "vmpte_after_kb")?
            );
            let published = match (
                kb(off, "seed_vmpte_after_kb"),
                kb(up, "seed_vmpte_after_kb"),
            ) {
                (Some(a), Some(b)) => Some(format!("{a} → {b}")),
                _ => None,
            };
            let iterations = v["iterations"].as_u64().unwrap_or(0);
            let what = format!(
                "PTE-table reclaim: VmPTE after {} × (write 2 MiB, MADV_DONTNEED)",
                thousands(iterations as f64)
            );
            line(what, published, usermm, kb(up, "host_vmpte_after_kb"))
        }
        "pft" => {
            // The most fault threads run, beside the writer that touches.
            let threads = rows.iter().filter_map(|r| r["threads"].as_u64()).max()?;
            let at = |mode: &str| {
                find(
                    rows,
                    &[
                        ("threads", threads.into()),
                        ("writer", "touch".into()),
                        ("mode", mode.into()),
                    ],
                )
            };
            let usermm = format!(
                "per-VMA {}, SPF {} mmap_lock's",
                times(at("vma_lock")?)?,
                times(at("spf")?)?
            );
            let host = f(at("host")?, "faults_per_s").map(|h| {
                let vma = f(at("vma_lock").unwrap_or(&Value::Null), "faults_per_s");
                match vma {
                    Some(u) => format!("{} faults/s (usermm {})", si(h), si(u)),
                    None => format!("{} faults/s", si(h)),
                }
            });
            let what = format!("fault scalability: {threads} threads beside an mmap/munmap writer");
            line(
                what,
                Some("SPF: 3.7× the baseline, 48 threads".into()),
                usermm,
                host,
            )
        }
        "migrc" => {
            let arm = |a: &str| find(rows, &[("arm", a.into())]);
            let (off, migrc) = (arm("off")?, arm("migrc")?);
            let shootdowns = f(migrc, "nr_tlb_remote_flush")? / f(off, "nr_tlb_remote_flush")?;
            let usermm = format!(
                "shootdowns {shootdowns:.2}×, runtime {}",
                times(migrc).unwrap_or_else(|| "-".into())
            );
            line(
                "MIGRC: deferred flushes of migrations between tiers".into(),
                Some("shootdowns 0.065×, runtime 0.964×".into()),
                usermm,
                Some("not merged".into()),
            )
        }
        "access" => {
            let at = |native: bool| {
                find(
                    rows,
                    &[
                        ("op", "load_tlb_miss".into()),
                        ("cpus", 1.into()),
                        ("native", native.into()),
                    ],
                )
            };
            let (engine, host) = (f(at(false)?, "per_s")?, f(at(true)?, "per_s")?);
            line(
                "the engine's speed: loads that miss the TLB, per CPU".into(),
                None,
                format!("{} loads/s", si(engine)),
                Some(format!("{} loads/s on host memory", si(host))),
            )
        }
        "fault" => {
            let r = find(rows, &[("op", "populate".into()), ("folio_kb", 4.into())])?;
            let what = if !of_backing.is_empty() {
                "the engine's speed: read faults of a cached file in 4 KiB folios"
            } else {
                "the engine's speed: write faults in 4 KiB folios"
            };
            line(
                what.into(),
                None,
                format!("{} the host's time", times(r)?),
                beside(r, "host_s", "engine_s"),
            )
        }
        "vma" => {
            let n = rows.iter().filter_map(|r| r["n"].as_u64()).max()?;
            let r = find(rows, &[("op", "mmap".into()), ("n", n.into())])?;
            line(
                format!(
                    "the engine's speed: mmap among {} VMAs",
                    thousands(n as f64)
                ),
                None,
                format!("{} the host's time", times(r)?),
                beside(r, "host_s", "engine_s"),
            )
        }
        "migrate" => {
            let at = |batch: bool| {
                find(
                    rows,
                    &[
                        ("folio_kb", 4.into()),
                        ("cpus", 2.into()),
                        ("batch_flush", batch.into()),
                    ],
                )
            };
            let (per_pte, batched) = (at(false)?, at(true)?);
            let usermm = format!(
                "{} → {} shootdowns, time {}",
                thousands(f(per_pte, "nr_tlb_remote_flush")?),
                thousands(f(batched, "nr_tlb_remote_flush")?),
                times(batched)?
            );
            line(
                "migration's batched flush (v6.3): move_pages of 4 KiB folios".into(),
                None,
                usermm,
                None,
            )
        }
        "tiering" => {
            let last = rows.last()?;
            line(
                "tiering: hot set on the fast node, at the end".into(),
                None,
                format!(
                    "{:.0}% after {:.1} s",
                    f(last, "hot_fast")? * 100.0,
                    f(last, "t_s")?
                ),
                None,
            )
        }
        "replay" => {
            // Traces whose every changed arm agreed with the kernel.
            let mut traces: Vec<(&str, bool)> = Vec::new();
            for r in rows {
                let (t, ok) = (r["trace"].as_str()?, r["arm_agrees"].as_bool()?);
                match traces.iter_mut().find(|(n, _)| *n == t) {
                    Some(e) => e.1 &= ok,
                    None => traces.push((t, ok)),
                }
            }
            let agree = traces.iter().filter(|(_, ok)| *ok).count();
            line(
                "real programs replayed: traces agreeing with the kernel on every call and figure"
                    .into(),
                None,
                format!("{agree} of {}", traces.len()),
                None,
            )
        }
        _ => None,
    }
}

/// The host's time beside usermm's: `5.7 ms (usermm 5.9 ms)`.
fn beside(r: &Value, host: &str, usermm: &str) -> Option<String> {
    let h = f(r, host)?;
    Some(match f(r, usermm) {
        Some(u) => format!("{} (usermm {})", secs(h), secs(u)),
        None => secs(h),
    })
}

/// The first row whose fields equal `want`.
fn find<'a>(rows: &'a [Value], want: &[(&str, Value)]) -> Option<&'a Value> {
    rows.iter().find(|r| want.iter().all(|(k, v)| &r[*k] == v))
}

fn f(r: &Value, k: &str) -> Option<f64> {
    r[k].as_f64()
}

/// A ratio as a change: `−68% [−70%, −66%]`.
fn change(r: &Value, k: &str) -> Option<String> {
    let pct = |x: f64| format!("{:+.0}%", (x - 1.0) * 100.0).replace('-', "−");
    let q = f(r, k)?;
    Some(match (f(r, "ci_low"), f(r, "ci_high")) {
        (Some(lo), Some(hi)) => format!("{} [{}, {}]", pct(q), pct(lo), pct(hi)),
        _ => pct(q),
    })
}

/// A ratio as a factor: `1.38× [1.22, 1.81]`.
fn times(r: &Value) -> Option<String> {
    let q = f(r, "ratio")?;
    Some(match (f(r, "ci_low"), f(r, "ci_high")) {
        (Some(lo), Some(hi)) => format!("{q:.2}× [{lo:.2}, {hi:.2}]"),
        _ => format!("{q:.2}×"),
    })
}

/// Seconds in the unit that reads best: `5.9 ms`.
fn secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else if s >= 1e-6 {
        format!("{:.1} µs", s * 1e6)
    } else {
        format!("{:.0} ns", s * 1e9)
    }
}

/// A rate with an SI prefix: `1.09 M`.
fn si(x: f64) -> String {
    if x >= 1e9 {
        format!("{:.2} G", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// A count with thousands separators: `102,608`.
fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 {
        format!("−{out}")
    } else {
        out
    }
}

/// The lines as a plain-text table, for the terminal.
pub fn text_table(lines: &[Headline]) -> String {
    let mut out =
        String::from("summary (usermm's figure; the series' published one; the host kernel's)\n");
    for l in lines {
        out += &format!("  {:<10} {}: {}", l.experiment, l.what, l.usermm);
        if let Some(p) = &l.published {
            out += &format!("; published {p}");
        }
        if let Some(h) = &l.host {
            out += &format!("; host {h}");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_people_read_them() {
        assert_eq!(thousands(102608.0), "102,608");
        assert_eq!(thousands(208.0), "208");
        assert_eq!(secs(0.005889), "5.9 ms");
        assert_eq!(si(1_090_465.0), "1.09 M");
        let r = serde_json::json!({"ratio": 0.32, "ci_low": 0.30, "ci_high": 0.34});
        assert_eq!(change(&r, "ratio").unwrap(), "−68% [−70%, −66%]");
        assert_eq!(times(&r).unwrap(), "0.32× [0.30, 0.34]");
    }

    #[test]
    fn a_batching_experiment_reads_its_2m_row() {
        let v = serde_json::json!({"rows": [
            {"folio_kb": 2048, "mapping": "pte", "ratio": 0.32, "ci_low": 0.30,
             "ci_high": 0.34, "seed_change_pct": -58.0, "host_s": 0.0057, "batched_s": 0.0059},
            {"folio_kb": 2048, "mapping": "pmd", "ratio": 1.0},
        ]});
        let h = headline("munmap", &v).unwrap();
        assert_eq!(h.usermm, "−68% [−70%, −66%]");
        assert_eq!(h.published.as_deref(), Some("−58%"));
        assert_eq!(h.host.as_deref(), Some("5.7 ms (usermm 5.9 ms)"));
        // Without the row, no line.
        let v = serde_json::json!({"rows": [{"folio_kb": 64, "mapping": "pte", "ratio": 0.4}]});
        assert!(headline("munmap", &v).is_none());
    }
}
