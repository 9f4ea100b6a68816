//! `usermm report`: one self-contained HTML page from a results folder.
//!
//! `usermm bench` writes each experiment's JSON object and plots into the
//! folder, and `run.json` (the command, the date, the host); this page puts
//! them together: per experiment, its description, the machine it ran on,
//! its table (every scalar field of its rows; a ratio with its 95%
//! interval, a wide one marked; the seed's and the host kernel's figures
//! in the columns the rows give them) and its plots inline; then a
//! picture of the page tables a scenario leaves (which PTE tables exist
//! under each VMA, and how full they are, from `inspect`).
//!
//! The page needs nothing but itself: styles and plots are inline, and a
//! small script, once the page has loaded, counts the sections and the
//! plots that the browser laid out with a size and writes the counts into
//! the page (`data-rendered`), for the test that loads it in a headless
//! browser.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

use crate::bench::summary::{self, Headline};
use crate::bench::EXPERIMENTS;

#[derive(clap::Args)]
pub struct ReportArgs {
    /// The results folder (as `usermm bench --out`); the page is written
    /// into it as index.html.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// The scenario whose page tables the page pictures (by default a
    /// built-in one: a full heap, a sparse region, one partly given back,
    /// and one of PMD-mapped THPs).
    #[arg(long)]
    pub scenario: Option<PathBuf>,
}

/// The scenario pictured by default.
const DEFAULT_SCENARIO: &str = include_str!("report_scenario.scn");

pub fn run(a: ReportArgs) -> anyhow::Result<i32> {
    let path = write(&a.out, a.scenario.as_deref())?;
    outln!("report: {}", path.display());
    Ok(0)
}

/// What `usermm bench` records of its invocation, for the report.
pub fn write_run_info(dir: &Path) -> anyhow::Result<()> {
    let info = serde_json::json!({
        "command": command_line(),
        "date": utc_now(),
        "host": host_info(),
        "version": env!("CARGO_PKG_VERSION"),
    });
    std::fs::write(dir.join("run.json"), serde_json::to_string_pretty(&info)?)
        .with_context(|| format!("writing {}", dir.join("run.json").display()))
}

/// The command as typed, the program named by its file name.
pub fn command_line() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(prog) = args.first_mut() {
        if let Some(name) = Path::new(prog.as_str())
            .file_name()
            .and_then(|n| n.to_str())
        {
            *prog = name.to_string();
        }
    }
    args.join(" ")
}

/// Write `dir/index.html` from the results in `dir`; returns its path.
pub fn write(dir: &Path, scenario: Option<&Path>) -> anyhow::Result<PathBuf> {
    if !dir.is_dir() {
        anyhow::bail!(
            "{}: no results folder (run `usermm bench` first)",
            dir.display()
        );
    }
    let run: Option<Value> = read_json(&dir.join("run.json"))?;
    let found = experiments_in(dir)?;
    if found.is_empty() {
        anyhow::bail!(
            "{}: no experiment's results in it (run `usermm bench` first)",
            dir.display()
        );
    }
    let (scenario_name, src) = match scenario {
        Some(p) => (
            p.display().to_string(),
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        ),
        None => ("built in".to_string(), DEFAULT_SCENARIO.to_string()),
    };
    let tables = page_table_picture(&src).with_context(|| format!("scenario {scenario_name}"))?;

    let mut h = String::new();
    head(&mut h);
    let _ = writeln!(h, "<h1>usermm: results</h1>");
    let lines: Vec<Headline> = found
        .iter()
        .filter_map(|(e, v)| summary::headline(e.name, v))
        .collect();
    summary_section(&mut h, &lines);
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&lines)?,
    )
    .with_context(|| format!("writing {}", dir.join("summary.json").display()))?;
    run_section(&mut h, run.as_ref());
    let _ = writeln!(h, "<nav><ul>");
    for (e, _) in &found {
        let _ = writeln!(h, "<li><a href=\"#{0}\">{0}</a></li>", e.name);
    }
    let _ = writeln!(
        h,
        "<li><a href=\"#page-tables\">page tables</a></li></ul></nav>"
    );
    for (e, v) in &found {
        experiment_section(&mut h, dir, e.name, e.description, v)?;
    }
    let _ = writeln!(
        h,
        "<section id=\"page-tables\"><h2>Page tables</h2><p>Scenario: {}. Each row is a VMA; each cell a 2 MiB stretch of it, the PTE table that maps it, shaded by how many of its 512 entries are used (white: no table; a PMD-mapped THP needs none).</p>{tables}</section>",
        esc(&scenario_name)
    );
    tail(&mut h);
    let path = dir.join("index.html");
    std::fs::write(&path, h).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Every experiment whose results are in `dir`, in the bench's order.
fn experiments_in(dir: &Path) -> anyhow::Result<Vec<(&'static crate::bench::Experiment, Value)>> {
    let mut found = vec![];
    for e in EXPERIMENTS.iter() {
        if let Some(v) = read_json(&dir.join(format!("{}.json", e.name)))? {
            found.push((e, v));
        }
    }
    Ok(found)
}

/// The summary lines of the results in `dir` ([`summary::headline`]).
pub fn summary(dir: &Path) -> anyhow::Result<Vec<Headline>> {
    Ok(experiments_in(dir)?
        .iter()
        .filter_map(|(e, v)| summary::headline(e.name, v))
        .collect())
}

/// The page's first section: one line per experiment, linking to its own.
fn summary_section(h: &mut String, lines: &[Headline]) {
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        h,
        "<section id=\"summary\"><h2>Summary</h2><p>Each experiment's headline: usermm's figure (a median, with its 95% interval where it has one), the patch series' own published figure where there is one, and the host kernel's in the same run.</p><table><tr><th>experiment</th><th>what</th><th>usermm</th><th>published</th><th>host kernel</th></tr>"
    );
    for l in lines {
        let _ = writeln!(
            h,
            "<tr><td><a href=\"#{0}\">{0}</a></td><td>{1}</td><td>{2}</td><td>{3}</td><td>{4}</td></tr>",
            l.experiment,
            esc(&l.what),
            esc(&l.usermm),
            esc(l.published.as_deref().unwrap_or("-")),
            esc(l.host.as_deref().unwrap_or("-")),
        );
    }
    let _ = writeln!(h, "</table></section>");
}

fn read_json(p: &Path) -> anyhow::Result<Option<Value>> {
    match std::fs::read(p) {
        Ok(b) => Ok(Some(
            serde_json::from_slice(&b).with_context(|| format!("{}: not JSON", p.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
    }
}

fn head(h: &mut String) {
    h.push_str(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>usermm results</title>
<style>
body { font-family: sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { border-bottom: 2px solid #333; }
h2 { margin-top: 2em; border-bottom: 1px solid #aaa; }
nav ul { columns: 4; list-style: none; padding: 0; }
table { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #eee; }
td.text { text-align: left; }
td.wide { background: #fff3cd; }
.plot svg { max-width: 100%; height: auto; border: 1px solid #eee; margin: 0.5em 0; }
.meta { color: #555; font-size: 0.9em; }
.legend { font-size: 0.85em; color: #555; }
</style></head>
<body data-rendered="pending">
"#,
    );
}

fn tail(h: &mut String) {
    // Once laid out: the sections, and the plots with a size.
    h.push_str(
        r#"<script>
window.addEventListener('load', function () {
  var sections = document.querySelectorAll('section').length;
  var plots = 0, empty = 0;
  document.querySelectorAll('svg').forEach(function (s) {
    var r = s.getBoundingClientRect();
    if (r.width > 10 && r.height > 10 && s.querySelector('*')) { plots++; } else { empty++; }
  });
  document.body.setAttribute('data-rendered', 'sections=' + sections + ' plots=' + plots + ' empty=' + empty);
});
</script>
</body></html>
"#,
    );
}

fn run_section(h: &mut String, run: Option<&Value>) {
    let _ = writeln!(h, "<section id=\"run\"><h2>This run</h2><table>");
    let row = |h: &mut String, k: &str, v: String| {
        let _ = writeln!(
            h,
            "<tr><th>{k}</th><td class=\"text\">{}</td></tr>",
            esc(&v)
        );
    };
    match run {
        Some(r) => {
            row(h, "command", text(&r["command"]));
            row(h, "date (UTC)", text(&r["date"]));
            row(h, "usermm", text(&r["version"]));
            let host = &r["host"];
            row(h, "host kernel", text(&host["kernel"]));
            row(h, "host CPU", text(&host["cpu"]));
            row(h, "host CPUs", text(&host["cpus"]));
            row(h, "host memory", text(&host["memory"]));
        }
        None => row(h, "run", "not recorded (no run.json)".into()),
    }
    let _ = writeln!(
        h,
        "<tr><th>report written</th><td class=\"text\">{}</td></tr></table>",
        utc_now()
    );
    let _ = writeln!(
        h,
        "<p class=\"legend\">Ratios are medians of per-round ratios, arms interleaved, with their 95% confidence interval in brackets; a shaded cell marks an interval wider than ±5% or from fewer than 6 rounds.</p></section>"
    );
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        v => v.to_string(),
    }
}

fn experiment_section(
    h: &mut String,
    dir: &Path,
    name: &str,
    description: &str,
    v: &Value,
) -> anyhow::Result<()> {
    let _ = writeln!(
        h,
        "<section id=\"{name}\"><h2>{name}</h2><p>{}</p>",
        esc(description)
    );
    let mut meta = vec![];
    for key in [
        "machine",
        "tunable",
        "size_mb",
        "region_mb",
        "runs",
        "date",
        "command",
    ] {
        if let Some(x) = v.get(key).filter(|x| !x.is_null()) {
            meta.push(format!("{key}: {}", text(x)));
        }
    }
    let _ = writeln!(h, "<p class=\"meta\">{}</p>", esc(&meta.join(" · ")));
    if let Some(rows) = v["rows"].as_array() {
        rows_table(h, rows);
    }
    for svg in plots_of(dir, name)? {
        let body =
            std::fs::read_to_string(&svg).with_context(|| format!("reading {}", svg.display()))?;
        let body = match body.find("<svg") {
            Some(i) => &body[i..],
            None => anyhow::bail!("{}: not an SVG", svg.display()),
        };
        let _ = writeln!(h, "<div class=\"plot\">{body}</div>");
    }
    let _ = writeln!(h, "</section>");
    Ok(())
}

/// `NAME.svg` and `NAME_*.svg` in the folder, by name.
fn plots_of(dir: &Path, name: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let f = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
            f == format!("{name}.svg")
                || (f.starts_with(&format!("{name}_")) && f.ends_with(".svg"))
        })
        .collect();
    v.sort();
    Ok(v)
}

/// The fields that hold the 95% interval of field `c`: `ci_low` and
/// `ci_high` for `ratio`, `c_ci_low` and `c_ci_high` for any other.
fn interval_fields(c: &str) -> (String, String) {
    if c == "ratio" {
        ("ci_low".into(), "ci_high".into())
    } else {
        (format!("{c}_ci_low"), format!("{c}_ci_high"))
    }
}

/// The rows as a table: every scalar field, in the rows' order; a value
/// with its interval's fields beside it ([`interval_fields`]) shown as one
/// cell with its interval.
fn rows_table(h: &mut String, rows: &[Value]) {
    let mut cols: Vec<String> = vec![];
    for r in rows {
        for (k, x) in r.as_object().into_iter().flatten() {
            let scalar = !(x.is_array() || x.is_object());
            let bound = k.ends_with("ci_low") || k.ends_with("ci_high");
            if scalar && !bound && !cols.contains(k) {
                cols.push(k.clone());
            }
        }
    }
    let _ = write!(h, "<table><tr>");
    for c in &cols {
        let _ = write!(h, "<th>{}</th>", esc(c));
    }
    let _ = writeln!(h, "</tr>");
    for r in rows {
        let _ = write!(h, "<tr>");
        for c in &cols {
            let x = &r[c.as_str()];
            let (lo, hi) = interval_fields(c);
            let (cell, class) = if r.get(&lo).is_some_and(|l| !l.is_null()) {
                ratio_cell(
                    x,
                    &r[&lo],
                    &r[&hi],
                    r["runs"].as_u64().unwrap_or(0) as usize,
                )
            } else {
                scalar_cell(x)
            };
            let _ = write!(h, "<td class=\"{class}\">{}</td>", esc(&cell));
        }
        let _ = writeln!(h, "</tr>");
    }
    let _ = writeln!(h, "</table>");
}

/// A value with its interval over `n` rounds, shaded when wide.
fn ratio_cell(value: &Value, low: &Value, high: &Value, n: usize) -> (String, &'static str) {
    let (q, lo, hi) = (
        value.as_f64().unwrap_or(f64::NAN),
        low.as_f64().unwrap_or(f64::NAN),
        high.as_f64().unwrap_or(f64::NAN),
    );
    let e = crate::bench::stats::Estimate {
        value: q,
        ci_low: lo,
        ci_high: hi,
        n,
    };
    let class = if e.wide() { "wide" } else { "" };
    (format!("{} [{}, {}]", num(q), num(lo), num(hi)), class)
}

fn scalar_cell(x: &Value) -> (String, &'static str) {
    match x {
        Value::Number(n) => (n.as_f64().map_or_else(|| n.to_string(), num), ""),
        Value::Null => ("-".into(), ""),
        Value::Bool(b) => (b.to_string(), "text"),
        Value::String(s) => (s.clone(), "text"),
        _ => (String::new(), ""),
    }
}

/// Four significant digits, without an exponent for everyday sizes.
fn num(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    if x == x.trunc() && x.abs() < 1e15 {
        return format!("{x:.0}");
    }
    let digits = (4 - 1 - x.abs().log10().floor() as i32).clamp(0, 9) as usize;
    format!("{x:.digits$}")
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Run the scenario in the engine and draw each VMA's PTE tables.
fn page_table_picture(src: &str) -> anyhow::Result<String> {
    use crate::scenario;
    let stmts = scenario::parse::parse(src).map_err(|e| anyhow::anyhow!("line {e}"))?;
    let mut b =
        scenario::engine::EngineBackend::new(scenario::engine::EngineBackend::default_machine())?;
    let report = scenario::run(&stmts, &mut b, "usermm");
    if let Some(o) = report.outcomes.iter().find(|o| o.failed.is_some()) {
        anyhow::bail!(
            "line {}: {}: {}",
            o.line,
            o.text,
            o.failed.as_deref().unwrap_or("")
        );
    }
    let ins = b.inspection();
    let mut svg = String::new();
    for mm in &ins.mms {
        let vmas: Vec<_> = mm.vmas.iter().collect();
        // Each PTE table's entries in use, by the address it maps from.
        let tables: std::collections::HashMap<u64, usize> = mm
            .page_tables
            .pte_tables
            .iter()
            .map(|t| (t.addr, t.present))
            .collect();
        const CELL: u64 = 2 << 20;
        let cells = |s: u64, e: u64| (e.div_ceil(CELL) - s / CELL) as usize;
        let width = vmas
            .iter()
            .map(|v| cells(v.start, v.end))
            .max()
            .unwrap_or(1)
            .min(64);
        let (cw, ch, label) = (24, 20, 260);
        let hgt = vmas.len() * (ch + 6) + 30;
        let _ = writeln!(
            svg,
            "<h3>process {} ({} PTE tables, {} PMD-mapped THPs)</h3>",
            mm.id,
            mm.page_tables.pte_tables.len(),
            mm.page_tables.huge_pmds
        );
        let _ = writeln!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{hgt}\" font-family=\"monospace\" font-size=\"11\">",
            label + width * cw + 10
        );
        for (i, v) in vmas.iter().enumerate() {
            let y = 20 + i * (ch + 6);
            let _ = writeln!(
                svg,
                "<text x=\"0\" y=\"{}\">{:#x}-{:#x} {}</text>",
                y + 14,
                v.start,
                v.end,
                esc(&v.perms)
            );
            for c in 0..cells(v.start, v.end).min(width) {
                let base = (v.start / CELL + c as u64) * CELL;
                let (fill, what) = match tables.get(&base) {
                    Some(&used) => {
                        let shade = (235.0 - 200.0 * used as f64 / 512.0) as u8;
                        (
                            format!("rgb({shade},{shade},255)"),
                            format!("PTE table, {used}/512 used"),
                        )
                    }
                    None => ("white".into(), "no PTE table".into()),
                };
                let _ = writeln!(
                    svg,
                    "<rect x=\"{}\" y=\"{y}\" width=\"{}\" height=\"{ch}\" fill=\"{fill}\" stroke=\"#888\"><title>{base:#x}: {}</title></rect>",
                    label + c * cw,
                    cw - 2,
                    what
                );
            }
        }
        let _ = writeln!(svg, "</svg>");
    }
    Ok(svg)
}

/// Now, as `YYYY-MM-DD HH:MM:SS`, UTC (civil from days: H. Hinnant's
/// algorithm).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The host: its kernel, CPU model and count, and memory.
fn host_info() -> Value {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cpus = crate::native::host_cpus();
    serde_json::json!({
        "kernel": format!("Linux {kernel}"),
        "cpu": cpu,
        "cpus": cpus,
        "memory": format!("{} MiB", crate::host_memory_bytes() >> 20),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_keep_four_digits() {
        assert_eq!(num(0.434_56), "0.4346");
        assert_eq!(num(12.3456), "12.35");
        assert_eq!(num(1024.0), "1024");
        assert_eq!(num(f64::NAN), "-");
    }

    #[test]
    fn utc_dates_are_civil() {
        let s = utc_now();
        assert_eq!(s.len(), 19, "{s}");
        assert!(s.starts_with("20"), "{s}");
    }

    #[test]
    fn the_default_scenario_draws_its_tables() {
        let svg = page_table_picture(DEFAULT_SCENARIO).expect("the built-in scenario runs");
        assert!(svg.contains("<svg"), "{svg}");
        assert!(
            svg.contains("PTE table, 512/512 used"),
            "a full table: {svg}"
        );
        assert!(svg.contains("no PTE table"), "the THP region: {svg}");
    }
}
