//! Experiments: each runs in the engine and natively in the same invocation.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use serde::Serialize;
use usermm::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use usermm::{Machine, MachineConfig};

use crate::{batching, native, plot};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Experiment: fault, munmap, dontneed, fork or vma. All when omitted.
    pub name: Option<String>,
    /// Runs per size; medians are reported.
    #[arg(long, default_value_t = 7)]
    pub runs: usize,
    /// Region size in MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mb: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only these folio sizes, in KiB (comma-separated); all when omitted.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<u64>,
    /// Skip the runs on the host kernel.
    #[arg(long)]
    pub no_host: bool,
    /// Folder for the results (JSON and SVG per experiment).
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// The machine every experiment runs on; by default each gets one DRAM
    /// node just large enough for it, with two CPUs.
    #[command(flatten)]
    pub machine: crate::machine_args::MachineArgs,
    /// Tunables of every experiment's machine; an experiment sets the one it
    /// compares itself, arm by arm.
    #[command(flatten)]
    pub tunables: crate::tunable_args::TunableArgs,
}

/// Memory an experiment over `size_mb` needs on node 0: the region, its
/// page tables (twice, for fork) and slack. Checked by [`validate`] not to
/// overflow.
pub fn region_machine_bytes(size_mb: u64) -> u64 {
    checked_region_machine_bytes(size_mb).expect("validated")
}

fn checked_region_machine_bytes(size_mb: u64) -> Option<u64> {
    size_mb.checked_mul(3 << 19)?.checked_add(64 << 20)
}

/// The machine of an experiment that needs `need` bytes on node 0: the
/// user's, or the default. Experiments run on CPUs 0 and 1 of node 0.
pub fn experiment_machine(a: &BenchArgs, need: u64) -> anyhow::Result<std::sync::Arc<Machine>> {
    let config = a.machine.config(MachineConfig::single_node(need, 2))?;
    if config.nodes[0].size_bytes < need {
        anyhow::bail!(
            "machine: this experiment needs {} MiB on node 0, which has {} MiB",
            need >> 20,
            config.nodes[0].size_bytes >> 20
        );
    }
    if config.cpus.iter().take_while(|&&n| n == 0).count() < 2 {
        anyhow::bail!("machine: experiments run on CPUs 0 and 1, both on node 0");
    }
    let m = Machine::new(config).map_err(|e| anyhow::anyhow!("machine: {e}"))?;
    a.tunables.apply(&m.tunables)?;
    Ok(m)
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

/// A progress bar on stderr for `n` steps of experiment `name` (hidden when
/// stderr is not a terminal).
pub fn progress(name: &str, n: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(n);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{prefix:>9} [{bar:30}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    pb.set_prefix(name.to_string());
    pb
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

const EXPERIMENTS: [&str; 5] = ["fault", "munmap", "dontneed", "fork", "vma"];

/// Check the options before anything is allocated: each experiment's
/// machine holds the region and half as much again, in host memory.
fn validate(a: &BenchArgs) -> anyhow::Result<()> {
    if a.runs == 0 {
        anyhow::bail!("--runs must be at least 1");
    }
    a.tunables.parsed()?;
    if let Some(kb) = a.sizes.iter().find(|k| !SIZES_KB.contains(k)) {
        anyhow::bail!(
            "--sizes: {kb} KiB is not a folio size (known: {})",
            SIZES_KB.map(|k| k.to_string()).join(", ")
        );
    }
    if a.size_mb == 0 {
        anyhow::bail!("--size-mb must be at least 1");
    }
    let need = checked_region_machine_bytes(a.size_mb)
        .ok_or_else(|| anyhow::anyhow!("--size-mb {} overflows", a.size_mb))?;
    // The experiments back every frame with host memory before timing.
    let host = crate::host_memory_bytes();
    let total = a
        .machine
        .config(MachineConfig::single_node(need, 2))?
        .total_bytes();
    if host > 0 && need.max(total) > host {
        anyhow::bail!(
            "--size-mb {} on this machine needs {} MiB of host memory for the model; this host has {} MiB",
            a.size_mb,
            need.max(total) >> 20,
            host >> 20
        );
    }
    Ok(())
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    let names: Vec<&str> = match a.name.as_deref() {
        None => EXPERIMENTS.to_vec(),
        Some(n) if EXPERIMENTS.contains(&n) => vec![n],
        Some(other) => anyhow::bail!(
            "unknown experiment {other:?} (known: {})",
            EXPERIMENTS.join(", ")
        ),
    };
    validate(&a)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut all = serde_json::Map::new();
    for name in names {
        if crate::out::closed() {
            // Nobody reads the tables any more: stop between experiments.
            return Ok(());
        }
        let v = match name {
            "fault" => bench_fault(&a)?,
            "vma" => crate::vma_bench::run(&a)?,
            op => bench_batching(&a, op)?,
        };
        std::fs::write(
            a.out.join(format!("{name}.json")),
            serde_json::to_string_pretty(&v)?,
        )?;
        all.insert(name.to_string(), v);
    }
    if a.json {
        // One experiment: its object; several: one object keyed by name.
        let v = if all.len() == 1 {
            all.into_iter().next().unwrap().1
        } else {
            serde_json::Value::Object(all)
        };
        outln!("{v}");
    } else {
        outln!("results in {}/", a.out.display());
    }
    Ok(())
}

fn bench_batching(a: &BenchArgs, name: &str) -> anyhow::Result<serde_json::Value> {
    let op = match name {
        "munmap" => batching::Op::Munmap,
        "dontneed" => batching::Op::Dontneed,
        _ => batching::Op::Fork,
    };
    let (rows, machine) = batching::run(a, op)?;
    if !a.json {
        batching::print_table(op, &rows, a);
        outln!("machine: {machine}");
        outln!();
    }
    let labels: Vec<String> = rows.iter().map(|r| r.label()).collect();
    let mut series = vec![plot::Series {
        label: "usermm: batched vs baseline".into(),
        points: rows
            .iter()
            .enumerate()
            .map(|(i, r)| (i, (r.ratio - 1.0) * 100.0))
            .collect(),
        dashed: false,
    }];
    let seed: Vec<(usize, f64)> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.seed_change_pct.map(|c| (i, c)))
        .collect();
    if !seed.is_empty() {
        series.push(plot::Series {
            label: "seed (v6.9 series, Xeon 4210R)".into(),
            points: seed,
            dashed: true,
        });
    }
    plot::change_plot(
        &a.out.join(format!("{name}.svg")),
        &format!("{name}: change with PTE batching, {} MiB", a.size_mb),
        &labels,
        "change (%)",
        &series,
    )?;
    Ok(serde_json::json!({
        "experiment": name,
        "machine": machine,
        "size_mb": a.size_mb,
        "runs": a.runs.max(1),
        "rows": rows,
    }))
}

/// `bench fault`: populate by write faults, then munmap, per folio size.
fn bench_fault(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let len = a.size_mb << 20;
    let runs = a.runs.max(1);
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
            "usermm vs host (%)",
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
