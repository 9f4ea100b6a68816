//! `bench fault`: populate a region by write faults, then munmap it, per
//! folio size, in the engine and on the host kernel.

use std::time::Instant;

use serde::Serialize;
use usermm::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use usermm::Machine;

use super::stats::{self, Estimate, Rounds};
use super::{experiment_machine, progress, region_machine_bytes, BenchArgs, SIZES_KB};
use crate::{native, plot};

pub const EXPERIMENT: super::Experiment = super::Experiment {
    name: "fault",
    description: "populate a region by write faults, then munmap it, per folio size; engine against the host kernel",
    run,
    budget_s: 10,
    full_budget_s: 20,
};

#[derive(Serialize)]
struct Row {
    op: &'static str,
    folio_kb: u64,
    /// Medians over the rounds.
    engine_s: f64,
    host_s: Option<f64>,
    /// engine / host: the median of the per-round ratios and its 95%
    /// interval.
    ratio: Option<f64>,
    ci_low: Option<f64>,
    ci_high: Option<f64>,
    runs: usize,
    host_note: Option<String>,
    samples: Samples,
}

/// Every round's seconds.
#[derive(Serialize, Default, Clone)]
struct Samples {
    engine_s: Vec<f64>,
    host_s: Vec<f64>,
}

/// A size's rounds: the two operations timed, each with its samples, and
/// what befell the host.
#[derive(Default, Clone)]
struct SizeSamples {
    populate: Samples,
    munmap: Samples,
    /// The host cannot run this size (its knobs cannot be set): it is not
    /// asked again.
    host_refused: bool,
    /// What the row says of the host (why it did not run, or that it gave
    /// other folios than the size's).
    note: Option<String>,
}

impl SizeSamples {
    /// The wider spread of the two ratios, when the host ran every round.
    fn spread(&self) -> f64 {
        [&self.populate, &self.munmap]
            .iter()
            .filter(|s| s.host_s.len() == s.engine_s.len())
            .map(|s| Estimate::ratio(&s.engine_s, &s.host_s).spread())
            .fold(0.0, f64::max)
    }
}

/// `bench fault`: populate by write faults, then munmap, per folio size
/// (with `--backing file`: by read faults of a cached file's mapping).
fn run(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let len = a.size_mb << 20;
    let file = a.backing == "file";
    let m = experiment_machine(a, region_machine_bytes(a.size_mb))?;
    // CPU 0's thread (this one) on host CPU 0, the host's loop beside it
    // (after the machine is made: its own threads float).
    let _pinned = native::pin_thread(0);
    m.prefault();
    let sizes: Vec<u64> = SIZES_KB
        .into_iter()
        .filter(|k| a.sizes.is_empty() || a.sizes.contains(k))
        .collect();
    let pb = progress("fault", (sizes.len() * Rounds::expected(a.runs())) as u64);
    let mut state: Vec<SizeSamples> = sizes
        .iter()
        .map(|_| SizeSamples {
            host_refused: a.no_host,
            note: a.no_host.then(|| "not run".to_string()),
            ..SizeSamples::default()
        })
        .collect();
    let mut knobs = native::KnobsBySize::default();
    let round = |r: &mut SizeSamples, i: usize, k: usize| {
        let kb = sizes[i];
        pb.set_message(format!("{kb}K"));
        // Order 0 leaves every size at never.
        m.thp.only_order((kb / 4).trailing_zeros());
        // The host first in every other round.
        let host_first = k.is_multiple_of(2);
        for engine in [!host_first, host_first] {
            if engine {
                let (p, u) = if file {
                    engine_read_file_munmap(&m, kb, len)?
                } else {
                    engine_populate_munmap(&m, len)?
                };
                r.populate.engine_s.push(p);
                r.munmap.engine_s.push(u);
            } else if !r.host_refused {
                match knobs.only_size(kb, false) {
                    Ok(()) if file => match host_read_file_munmap(kb, len) {
                        Ok((p, u)) => {
                            r.populate.host_s.push(p);
                            r.munmap.host_s.push(u);
                        }
                        Err(e) => {
                            r.host_refused = true;
                            r.note = Some(e);
                        }
                    },
                    Ok(()) => {
                        let (p, u) = host_populate_munmap(kb, len, &mut r.note);
                        r.populate.host_s.push(p);
                        r.munmap.host_s.push(u);
                    }
                    Err(e) => {
                        r.host_refused = true;
                        r.note = Some(e);
                    }
                }
            }
        }
        anyhow::Ok(())
    };
    stats::rounds_by_row(
        a.runs(),
        a.budget(),
        &pb,
        &mut state,
        round,
        SizeSamples::spread,
    )?;
    let mut rows = vec![];
    for (kb, r) in sizes.into_iter().zip(state) {
        for (op, s) in [("populate", r.populate), ("munmap", r.munmap)] {
            let q = (!s.host_s.is_empty() && s.host_s.len() == s.engine_s.len())
                .then(|| Estimate::ratio(&s.engine_s, &s.host_s));
            rows.push(Row {
                op,
                folio_kb: kb,
                engine_s: stats::median(&s.engine_s),
                host_s: (!s.host_s.is_empty()).then(|| stats::median(&s.host_s)),
                ratio: q.map(|q| q.value),
                ci_low: q.map(|q| q.ci_low),
                ci_high: q.map(|q| q.ci_high),
                runs: s.engine_s.len(),
                host_note: r.note.clone(),
                samples: s,
            });
        }
    }
    pb.finish_and_clear();
    if !a.json {
        let how = if file {
            "read faults of a private mapping of a cached file (written in writes of the folio size: its page-cache folios)"
        } else {
            "write faults"
        };
        outln!(
            "bench fault: populate {} MiB by {how}, then munmap; engine and host interleaved; medians of the rounds (runs {})",
            a.size_mb,
            a.runs()
        );
        outln!(
            "{:<9} {:>8} {:>12} {:>12} {:>22}",
            "op",
            "folio",
            "engine (s)",
            "host (s)",
            "eng/host [95% CI]"
        );
        for r in &rows {
            let h = r.host_s.map_or("-".into(), |h| format!("{h:.6}"));
            let q = r.estimate().map_or("-".into(), |e| e.ratio_text());
            outln!(
                "{:<9} {:>7}K {:>12.6} {:>12} {:>22}  {}",
                r.op,
                r.folio_kb,
                r.engine_s,
                h,
                q,
                r.host_note.clone().unwrap_or_default()
            );
        }
        let n: Vec<usize> = rows.iter().map(|r| r.runs).collect();
        outln!(
            "{}",
            stats::footnote(&format!(
                "{}-{} rounds",
                n.iter().min().unwrap_or(&0),
                n.iter().max().unwrap_or(&0)
            ))
        );
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
        serde_json::json!({ "experiment": "fault", "backing": a.backing, "machine": m.config.to_string(), "size_mb": a.size_mb, "runs": a.runs().to_string(), "rows": rows }),
    )
}

impl Row {
    /// engine / host with its interval, when the host ran.
    fn estimate(&self) -> Option<Estimate> {
        Estimate::from_fields(self.ratio, self.ci_low, self.ci_high, self.runs)
    }
}

/// One round on the host: populate then munmap; `note` says why the
/// timing is not the folio size's, if the host gave other folios.
fn host_populate_munmap(kb: u64, len: u64, note: &mut Option<String>) -> (f64, f64) {
    let before = if kb > 4 {
        native::anon_fault_alloc(kb)
    } else {
        0
    };
    let t = native::populate_munmap(len as usize);
    if kb > 4 && native::anon_fault_alloc(kb) - before < (len / (kb << 10)) * 9 / 10 {
        *note = Some(format!("host did not give {kb}K folios"));
    }
    t
}

/// One round of `--backing file` in the engine: a file of `len` bytes
/// written in `kb`-KiB writes (untimed), then timed: its private mapping
/// read a byte a page (fault-around, whole folios, PMDs), and its munmap.
/// The file stays open across the munmap, and goes with its page cache
/// after.
fn engine_read_file_munmap(m: &Machine, kb: u64, len: u64) -> anyhow::Result<(f64, f64)> {
    use usermm::fs::{FMode, File, FsKind};
    let c = m.bind(0).map_err(|e| anyhow::anyhow!("bind: {e}"))?;
    c.new_mm().map_err(|e| anyhow::anyhow!("mm: {e}"))?;
    let inode = m.create_file(FsKind::Ext4, 0);
    let mode = FMode {
        read: true,
        write: true,
    };
    let f = File::open(&inode, mode).map_err(|e| anyhow::anyhow!("open: {e}"))?;
    let chunk = kb << 10;
    let buf = vec![1u8; chunk as usize];
    for pos in (0..len).step_by(chunk as usize) {
        c.pwrite(&f, pos, &buf[..chunk.min(len - pos) as usize])
            .map_err(|e| anyhow::anyhow!("write: {e}"))?;
    }
    c.fsync(&f).map_err(|e| anyhow::anyhow!("fsync: {e}"))?;
    let addr = c
        .mmap_file(0, len, PROT_READ, MAP_PRIVATE, Some(&f), 0)
        .map_err(|e| anyhow::anyhow!("mmap: {e}"))?;
    let t = Instant::now();
    for p in (addr..addr + len).step_by(4096) {
        c.load_u8(p).map_err(|e| anyhow::anyhow!("read: {e}"))?;
    }
    let populate = t.elapsed().as_secs_f64();
    let t = Instant::now();
    c.munmap(addr, len)
        .map_err(|e| anyhow::anyhow!("munmap: {e}"))?;
    let unmap = t.elapsed().as_secs_f64();
    c.exit_mm().map_err(|e| anyhow::anyhow!("exit: {e}"))?;
    drop((f, inode));
    m.rcu_barrier();
    Ok((populate, unmap))
}

/// [`engine_read_file_munmap`] on the host: a file in the temporary
/// folder, kept open, unlinked.
fn host_read_file_munmap(kb: u64, len: u64) -> Result<(f64, f64), String> {
    native::file_read_munmap(len as usize, (kb << 10) as usize)
        .map_err(|e| format!("host file: {e}"))
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
