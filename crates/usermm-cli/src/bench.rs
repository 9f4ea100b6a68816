//! Experiments: each runs in the engine and natively in the same invocation.

use std::time::Instant;

use serde::Serialize;
use usermm::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use usermm::{Machine, MachineConfig};

use crate::native;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Experiment: fault. All when omitted.
    pub name: Option<String>,
    /// Runs per size; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Region size in MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mb: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

const SIZES_KB: [u64; 9] = [4, 16, 32, 64, 128, 256, 512, 1024, 2048];

#[derive(Serialize)]
struct Row {
    op: &'static str,
    folio_kb: u64,
    engine_s: f64,
    host_s: Option<f64>,
    ratio: Option<f64>,
    host_note: Option<String>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    match a.name.as_deref() {
        None | Some("fault") => bench_fault(&a),
        Some(other) => anyhow::bail!("unknown experiment {other:?} (known: fault)"),
    }
}

/// `bench fault`: populate by write faults, then munmap, per folio size.
fn bench_fault(a: &BenchArgs) -> anyhow::Result<()> {
    let len = a.size_mb << 20;
    let runs = a.runs.max(1);
    let m = Machine::new(MachineConfig::single_node(len + len / 2 + (64 << 20), 2))
        .map_err(|e| anyhow::anyhow!("machine: {e}"))?;
    m.prefault();
    let mut rows = vec![];
    for &kb in &SIZES_KB {
        let order = (kb / 4).trailing_zeros();
        // Order 0 leaves every size at never.
        m.thp.only_order(order);
        let (mut pe, mut me, mut ph, mut mh) = (vec![], vec![], vec![], vec![]);
        let host = native::HostKnobs::only_size(kb).map_err(|e| e.to_string());
        let mut note = host.as_ref().err().cloned();
        for _ in 0..runs {
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
        if !a.json {
            eprintln!("  fault: {kb}K done");
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "experiment": "fault", "size_mb": a.size_mb, "runs": runs, "rows": rows })
        );
    } else {
        println!(
            "bench fault: populate {} MiB by write faults, then munmap; medians of {runs} runs",
            a.size_mb
        );
        println!(
            "{:<9} {:>8} {:>12} {:>12} {:>8}",
            "op", "folio", "engine (s)", "host (s)", "eng/host"
        );
        for r in &rows {
            let h = r.host_s.map_or("-".into(), |h| format!("{h:.6}"));
            let q = r.ratio.map_or("-".into(), |q| format!("{q:.2}"));
            println!(
                "{:<9} {:>7}K {:>12.6} {:>12} {:>8}  {}",
                r.op,
                r.folio_kb,
                r.engine_s,
                h,
                q,
                r.host_note.clone().unwrap_or_default()
            );
        }
    }
    Ok(())
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
