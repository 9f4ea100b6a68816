//! Experiments: one file each, listed in [`EXPERIMENTS`]. Each runs in the
//! engine and natively in the same invocation, prints its table, writes its
//! plot, and returns its JSON object (with a `rows` array).

mod access;
mod batching;
mod fault;
mod migrate;
mod migrc;
mod pft;
mod pt_reclaim;
mod replay;
pub mod stats;
pub mod summary;
mod tiering;
mod vma;

use std::path::PathBuf;

use anyhow::Context;

use usermm::{Machine, MachineConfig};

#[derive(clap::Args, Clone)]
pub struct BenchArgs {
    /// Experiment: access, fault, munmap, dontneed, fork, cow, vma,
    /// pt_reclaim, pft, migrate, tiering, migrc or replay
    /// (see --list). All when omitted.
    pub name: Option<String>,
    /// List the experiments with what each measures, and stop.
    #[arg(long)]
    pub list: bool,
    /// Rounds per row (each runs every arm once, interleaved): a count,
    /// or `auto`, which runs 6 and then more until every ratio's 95%
    /// interval is within ±5% or the experiment's budget is spent.
    /// Medians are reported.
    /// (Parsed by [`BenchArgs::runs`], once [`validate`] has checked it, so
    /// that a bad value is one line of error like every other option's.)
    #[arg(long = "runs", default_value = "auto")]
    pub runs_arg: String,
    /// Run every experiment at its patch series' own scale (1 GiB regions,
    /// the seed's 50 GiB loop, MIGRC's ten-times-scale grid) with the
    /// larger budgets: some twenty-five minutes on two cores. Without it
    /// each experiment runs at a reduced scale that it names in its table
    /// (256 MiB regions, a 6.25 GiB loop, MIGRC's small grid), the whole
    /// bench in under ten minutes.
    #[arg(long)]
    pub full: bool,
    /// Seconds an experiment's rounds may take under `--runs auto`, the
    /// minimum six included: after those, further rounds go to the rows
    /// whose intervals are widest. By default each experiment's own
    /// (`--list` shows them, with and without `--full`).
    #[arg(long = "budget-s")]
    pub budget_arg: Option<u64>,
    /// The budget in force: `--budget-s`, or the experiment's own (set by
    /// [`run`] before the experiment runs).
    #[arg(skip)]
    pub budget_s: u64,
    /// Region size in MiB (default 256, or 1024 with `--full`).
    #[arg(long = "size-mb", value_name = "SIZE_MB")]
    pub size_mb_arg: Option<u64>,
    /// The region size in force ([`BenchArgs::resolve_scale`]).
    #[arg(skip)]
    pub size_mb: u64,
    /// Chunks of the pt_reclaim loop (default 25 x 128, 6.25 GiB; with
    /// `--full` the seed's 25 x 1024, 50 GiB).
    #[arg(long = "iterations", value_name = "ITERATIONS")]
    pub iterations_arg: Option<usize>,
    /// The chunks in force ([`BenchArgs::resolve_scale`]).
    #[arg(skip)]
    pub iterations: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only these folio sizes, in KiB (comma-separated); all when omitted.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<u64>,
    /// Skip the runs on the host kernel.
    #[arg(long)]
    pub no_host: bool,
    /// fault, munmap, dontneed: what backs the region: `anon` (private
    /// anonymous memory), `file` (a file written in writes of the folio
    /// size, so that the page cache holds folios of that size, mapped
    /// private and read-faulted; natively a file in the temporary folder,
    /// which must be on a filesystem with large folios, as ext4 is since
    /// 6.16), or `shmem` (munmap and dontneed: shared anonymous memory
    /// write-faulted with that size's `shmem_enabled` always, its file
    /// held open meanwhile).
    #[arg(long, default_value = "anon")]
    pub backing: String,
    /// pft: the fault-thread counts (comma-separated); by default 1, 2 and
    /// the powers of two that leave the host a core for the writer.
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// migrc: lookups per CPU, measured (after the warm-up); by default
    /// the scale's ([`migrc::Scale`]).
    #[arg(long = "lookups", value_name = "LOOKUPS")]
    pub lookups_arg: Option<u64>,
    #[arg(skip)]
    pub lookups: u64,
    /// migrc: lookups per CPU before the measured ones, so that the pages
    /// the build left writable and dirty have cycled through the tiers; by
    /// default the scale's.
    #[arg(long = "warmup", value_name = "WARMUP")]
    pub warmup_arg: Option<u64>,
    #[arg(skip)]
    pub warmup: u64,
    /// migrc: NUMA balancing's scan size in MB (`scan_size_mb`; with
    /// `--full` the kernel's 256, the whole grid, else 1), and with it the
    /// period (`task_scan_min`).
    #[arg(long = "scan-size-mb", value_name = "SCAN_SIZE_MB")]
    pub scan_size_mb_arg: Option<u64>,
    #[arg(skip)]
    pub scan_size_mb: u64,
    /// migrc: the shootdown cost model: `off` (the default: an IPI costs
    /// what the model's mailbox costs), `host` (the median of seven
    /// calibrations on this host first), or `SEND_NS,RECV_NS`.
    #[arg(long, default_value = "off")]
    pub ipi_cost: String,
    /// migrc: the arms to run (comma-separated: `off`, `migrc`, `luf`;
    /// `off`, the baseline, among them); all three when omitted.
    #[arg(long, value_delimiter = ',')]
    pub arms: Vec<String>,
    /// migrc: the `migration_entry_ad` settings to run the arms with:
    /// `off` (the default: migrated pages come back clean, as the seed's
    /// figures imply), `on` (the host's: a page once written stays dirty,
    /// and MIGRC and LUF defer nothing), or `both`.
    #[arg(long, default_value = "off")]
    pub migration_entry_ad: String,
    /// migrc: THP's top-level mode (`transparent_hugepage/enabled`, with
    /// 2 MiB at `inherit`): `madvise` (as a machine of the seed's size
    /// boots on most distributions: the grid, not madvised, is in 4 KiB
    /// folios, and while 2 MiB THPs are enabled khugepaged's larger
    /// reserve sets the watermarks), `never` (the machine's own, smaller
    /// reserve) or `always` (the grid in THPs, which MIGRC does not
    /// defer).
    #[arg(long, default_value = "madvise")]
    pub thp: String,
    /// replay: the traces to replay (docs/traces.md); by default the
    /// corpus in tests/traces.
    #[arg(long)]
    pub trace: Vec<PathBuf>,
    /// Folder for the results (JSON and SVG per experiment).
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// The machine every experiment runs on; by default each gets one DRAM
    /// node just large enough for it, with two CPUs, except `migrate`,
    /// `tiering` and `migrc`, which get a DRAM node with the CPUs beside a
    /// slow node without (each experiment's doc gives the sizes).
    #[command(flatten)]
    pub machine: crate::machine_args::MachineArgs,
    /// Tunables of every experiment's machine; an experiment sets the one it
    /// compares itself, arm by arm.
    #[command(flatten)]
    pub tunables: crate::tunable_args::TunableArgs,
}

impl BenchArgs {
    /// The sizes in force: each option given, else its default at the
    /// scale chosen (`--full` or not).
    pub fn resolve_scale(&mut self) {
        let full = self.full;
        let migrc = if full {
            migrc::Scale::FULL
        } else {
            migrc::Scale::REDUCED
        };
        self.size_mb =
            self.size_mb_arg
                .unwrap_or(if full { FULL_SIZE_MB } else { REDUCED_SIZE_MB });
        self.iterations = self.iterations_arg.unwrap_or(if full {
            FULL_ITERATIONS
        } else {
            REDUCED_ITERATIONS
        });
        self.lookups = self.lookups_arg.unwrap_or(migrc.lookups);
        self.warmup = self.warmup_arg.unwrap_or(migrc.warmup);
        self.scan_size_mb = self.scan_size_mb_arg.unwrap_or(migrc.scan_size_mb);
    }

    /// The name of the scale in force, for tables and JSON.
    pub fn scale(&self) -> &'static str {
        if self.full {
            "full"
        } else {
            "reduced"
        }
    }

    /// The time the experiment's rounds may take ([`BenchArgs::budget_s`]).
    pub fn budget(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.budget_s)
    }

    /// `--runs`, checked by [`validate`].
    pub fn runs(&self) -> stats::Runs {
        self.runs_arg.parse().expect("--runs is validated first")
    }
}

/// The region of the experiments that map one, in MiB: the series' 1 GiB
/// with `--full`, a quarter of it by default.
const FULL_SIZE_MB: u64 = 1024;
const REDUCED_SIZE_MB: u64 = 256;
/// pt_reclaim's loop: the seed's 25 x 1024 chunks of 2 MiB (50 GiB) with
/// `--full`, an eighth of it by default.
const FULL_ITERATIONS: usize = 25 * 1024;
const REDUCED_ITERATIONS: usize = 25 * 128;

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

/// A progress bar on stderr for `n` steps of experiment `name` (hidden when
/// stderr is not a terminal).
pub fn progress(name: &str, n: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(n);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix:>9} [{bar:30}] {pos}/{len} {msg} (~{eta} left)",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    pb.set_prefix(name.to_string());
    pb
}

/// The median of `v` ([`stats::median`], for a vector built in place).
pub fn median(v: Vec<f64>) -> f64 {
    stats::median(&v)
}

/// One experiment of `usermm bench`.
pub struct Experiment {
    pub name: &'static str,
    pub description: &'static str,
    /// Seconds its rounds may take by default under `--runs auto`, at the
    /// reduced scale and with `--full`.
    pub budget_s: u64,
    pub full_budget_s: u64,
    /// Run it: print its table (unless `--json`), write its plot, and
    /// return its JSON object.
    pub run: fn(&BenchArgs) -> anyhow::Result<serde_json::Value>,
}

/// Every experiment, in the order `usermm bench` runs them.
pub const EXPERIMENTS: [Experiment; 13] = [
    access::EXPERIMENT,
    fault::EXPERIMENT,
    batching::MUNMAP,
    batching::DONTNEED,
    batching::FORK,
    batching::COW,
    vma::EXPERIMENT,
    pt_reclaim::EXPERIMENT,
    pft::EXPERIMENT,
    migrate::EXPERIMENT,
    tiering::EXPERIMENT,
    migrc::EXPERIMENT,
    replay::EXPERIMENT,
];

fn names() -> String {
    EXPERIMENTS.map(|e| e.name).join(", ")
}

/// Check the options before anything is allocated: each experiment's
/// machine holds the region and half as much again, in host memory.
fn validate(a: &BenchArgs) -> anyhow::Result<()> {
    a.runs_arg
        .parse::<stats::Runs>()
        .map_err(|e| anyhow::anyhow!(e))?;
    a.tunables.parsed()?;
    if let Some(kb) = a.sizes.iter().find(|k| !SIZES_KB.contains(k)) {
        anyhow::bail!(
            "--sizes: {kb} KiB is not a folio size (known: {})",
            SIZES_KB.map(|k| k.to_string()).join(", ")
        );
    }
    if a.iterations == 0 || a.iterations > 1 << 24 {
        anyhow::bail!("--iterations must be between 1 and {}", 1 << 24);
    }
    if a.lookups == 0 || a.lookups > 1 << 32 {
        anyhow::bail!("--lookups must be between 1 and {}", 1u64 << 32);
    }
    if a.warmup > 1 << 34 {
        anyhow::bail!("--warmup must be at most {}", 1u64 << 34);
    }
    match a.backing.as_str() {
        "anon" => {}
        "file" => match a.name.as_deref() {
            Some("munmap" | "dontneed" | "fault") => {}
            Some(n) => anyhow::bail!(
                "--backing file: only fault, munmap and dontneed take it ({n} maps anonymous memory)"
            ),
            None => anyhow::bail!("--backing file: name the experiment (fault, munmap or dontneed)"),
        },
        "shmem" => match a.name.as_deref() {
            Some("munmap" | "dontneed") => {}
            Some(n) => anyhow::bail!(
                "--backing shmem: only munmap and dontneed take it ({n} maps anonymous memory)"
            ),
            None => anyhow::bail!("--backing shmem: name the experiment (munmap or dontneed)"),
        },
        b => anyhow::bail!("--backing {b:?}: anon, file or shmem"),
    }
    migrc::parse_ipi_cost(&a.ipi_cost)?;
    migrc::parse_arms(&a.arms)?;
    migrc::parse_migration_entry_ad(&a.migration_entry_ad)?;
    migrc::parse_thp(&a.thp)?;
    if a.scan_size_mb == 0 || a.scan_size_mb > 1 << 20 {
        anyhow::bail!("--scan-size-mb must be between 1 and {}", 1 << 20);
    }
    if a.size_mb == 0 {
        anyhow::bail!("--size-mb must be at least 1");
    }
    if let Some(t) = a.threads.iter().find(|&&t| t == 0 || t > pft::MAX_THREADS) {
        anyhow::bail!("--threads: {t} is not between 1 and {}", pft::MAX_THREADS);
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

pub fn run(mut a: BenchArgs) -> anyhow::Result<()> {
    a.resolve_scale();
    if a.list {
        for e in &EXPERIMENTS {
            outln!(
                "{:<10} {:>4} s {:>4} s  {}",
                e.name,
                e.budget_s,
                e.full_budget_s,
                e.description
            );
        }
        outln!(
            "(the seconds: the experiment's budget for its rounds under --runs auto, by default and with --full)"
        );
        return Ok(());
    }
    let chosen: Vec<&Experiment> = match a.name.as_deref() {
        None => EXPERIMENTS.iter().collect(),
        Some(n) => match EXPERIMENTS.iter().find(|e| e.name == n) {
            Some(e) => vec![e],
            None => anyhow::bail!("unknown experiment {n:?} (known: {})", names()),
        },
    };
    validate(&a)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    crate::report::write_run_info(&a.out)?;
    if !a.json {
        let which = if a.full {
            "full, the patch series' own"
        } else {
            "reduced (--full runs the patch series' own)"
        };
        outln!(
            "scale: {which}: regions of {} MiB, pt_reclaim's loop over {} MiB, migrc's {} lookups after {} with scans of {} MB\n",
            a.size_mb,
            a.iterations as u64 * 2,
            a.lookups,
            a.warmup,
            a.scan_size_mb
        );
    }
    let mut all = serde_json::Map::new();
    for e in chosen {
        if crate::out::closed() {
            // Nobody reads the tables any more: stop between experiments.
            return Ok(());
        }
        let name = e.name;
        let mut own = a.clone();
        own.budget_s = a
            .budget_arg
            .unwrap_or(if a.full { e.full_budget_s } else { e.budget_s });
        let mut v = (e.run)(&own)?;
        // Which invocation made it, for a report of a folder that holds
        // several.
        if let Some(o) = v.as_object_mut() {
            o.insert("date".into(), crate::report::utc_now().into());
            o.insert("scale".into(), a.scale().into());
            o.insert("command".into(), crate::report::command_line().into());
        }
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
    }
    let page = crate::report::write(&a.out, None)?;
    if a.json {
        eprintln!("report: {}", page.display());
    } else {
        let lines = crate::report::summary(&a.out)?;
        if !lines.is_empty() {
            outln!("{}", summary::text_table(&lines));
        }
        outln!("results in {}/", a.out.display());
        outln!("report: {}", page.display());
    }
    Ok(())
}
