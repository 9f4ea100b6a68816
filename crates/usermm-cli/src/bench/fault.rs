//! `bench fault`: populate a region by write faults, then munmap it, per
//! folio size, in the engine and on the host kernel.

use std::time::Instant;

use serde::Serialize;
use usermm::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use usermm::Machine;

use super::{experiment_machine, median, progress, region_machine_bytes, BenchArgs, SIZES_KB};
use crate::{native, plot};

pub const EXPERIMENT: super::Experiment = super::Experiment {
    name: "fault",
    description: "populate a region by write faults, then munmap it, per folio size; engine against the host kernel",
    run,
};

#[derive(Serialize)]
struct Row {
    op: &'static str,
    folio_kb: u64,
    engine_s: f64,
    host_s: Option<f64>,
    ratio: Option<f64>,
    host_note: Option<String>,
}

/// `bench fault`: populate by write faults, then munmap, per folio size.
fn run(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let len = a.size_mb << 20;
    let runs = a.runs().fixed();
    let m = experiment_machine(a, region_machine_bytes(a.size_mb))?;
    m.prefault();
    let mut rows = vec![];
    let nsizes = SIZES_KB
        .iter()
        .filter(|k| a.sizes.is_empty() || a.sizes.contains(k))
        .count();
    let pb = progress("fault", (nsizes * runs) as u64);
    for &kb in SIZES_KB
        .iter()
        .filter(|k| a.sizes.is_empty() || a.sizes.contains(k))
    {
        let order = (kb / 4).trailing_zeros();
        // Order 0 leaves every size at never.
        m.thp.only_order(order);
        let (mut pe, mut me, mut ph, mut mh) = (vec![], vec![], vec![], vec![]);
        let host = if a.no_host {
            Err("not run".to_string())
        } else {
            native::HostKnobs::only_size(kb).map_err(|e| e.to_string())
        };
        let mut note = host.as_ref().err().cloned();
        pb.set_message(format!("{kb}K"));
        for _ in 0..runs {
            pb.inc(1);
            let (p, u) = engine_populate_munmap(&m, len)?;
            pe.push(p);
            me.push(u);
            if host.is_ok() {
                let before = if kb > 4 {
                    native::anon_fault_alloc(kb)
                } else {
                    0
                };
                let (p, u) = native::populate_munmap(len as usize);
                if kb > 4 && native::anon_fault_alloc(kb) - before < (len / (kb << 10)) * 9 / 10 {
                    note = Some(format!("host did not give {kb}K folios"));
                }
                ph.push(p);
                mh.push(u);
            }
        }
        drop(host);
        for (op, e, h) in [("populate", pe, ph), ("munmap", me, mh)] {
            let engine_s = median(e);
            let host_s = (!h.is_empty()).then(|| median(h));
            rows.push(Row {
                op,
                folio_kb: kb,
                engine_s,
                host_s,
                ratio: host_s.map(|h| engine_s / h),
                host_note: note.clone(),
            });
        }
    }
    pb.finish_and_clear();
    if !a.json {
        outln!(
            "bench fault: populate {} MiB by write faults, then munmap; medians of {runs} runs",
            a.size_mb
        );
        outln!(
            "{:<9} {:>8} {:>12} {:>12} {:>8}",
            "op",
            "folio",
            "engine (s)",
            "host (s)",
            "eng/host"
        );
        for r in &rows {
            let h = r.host_s.map_or("-".into(), |h| format!("{h:.6}"));
            let q = r.ratio.map_or("-".into(), |q| format!("{q:.2}"));
            outln!(
                "{:<9} {:>7}K {:>12.6} {:>12} {:>8}  {}",
                r.op,
                r.folio_kb,
                r.engine_s,
                h,
                q,
                r.host_note.clone().unwrap_or_default()
            );
        }
        outln!("machine: {}", m.config);
        outln!();
    }
    let labels: Vec<String> = rows
        .iter()
        .filter(|r| r.op == "populate")
        .map(|r| format!("{}K", r.folio_kb))
        .collect();
    let series: Vec<plot::Series> = ["populate", "munmap"]
        .iter()
        .map(|op| plot::Series {
            label: format!("{op}: usermm vs host kernel"),
            points: rows
                .iter()
                .filter(|r| r.op == *op)
                .enumerate()
                .filter_map(|(i, r)| r.ratio.map(|q| (i, (q - 1.0) * 100.0)))
                .collect(),
            dashed: *op == "munmap",
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    if !series.is_empty() {
        plot::change_plot(
            &a.out.join("fault.svg"),
            &format!("fault: usermm time vs host kernel time, {} MiB", a.size_mb),
            &labels,
            ("folio size", "usermm vs host (%)"),
            &series,
        )?;
    }
    Ok(
        serde_json::json!({ "experiment": "fault", "machine": m.config.to_string(), "size_mb": a.size_mb, "runs": runs, "rows": rows }),
    )
}

fn engine_populate_munmap(m: &Machine, len: u64) -> anyhow::Result<(f64, f64)> {
    let c = m.bind(0).map_err(|e| anyhow::anyhow!("bind: {e}"))?;
    c.new_mm().map_err(|e| anyhow::anyhow!("mm: {e}"))?;
    let addr = c
        .mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
        .map_err(|e| anyhow::anyhow!("mmap: {e}"))?;
    let t = Instant::now();
    c.touch_pages(addr, addr + len, 1)
        .map_err(|e| anyhow::anyhow!("populate: {e}"))?;
    let populate = t.elapsed().as_secs_f64();
    let t = Instant::now();
    c.munmap(addr, len)
        .map_err(|e| anyhow::anyhow!("munmap: {e}"))?;
    let unmap = t.elapsed().as_secs_f64();
    c.exit_mm().map_err(|e| anyhow::anyhow!("exit: {e}"))?;
    m.rcu_barrier();
    Ok((populate, unmap))
}
