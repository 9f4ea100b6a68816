//! The experiments' statistics: how many rounds to run, medians, and the
//! confidence interval of a ratio between two interleaved arms.
//!
//! An experiment that compares arms runs them in *rounds*: each round takes
//! one sample of every arm, back to back, in an order that alternates from
//! round to round. The ratio of two arms within one round cancels whatever
//! both shared (another process on the host, the CPU's clock, the state the
//! allocator was left in), so the statistic is the **median of the per-round
//! ratios**.
//!
//! Its 95% confidence interval is the distribution-free one for a median:
//! the order statistics `r(k)` and `r(n+1-k)` of the `n` ratios, with `k`
//! the largest rank such that `P(Binomial(n, 1/2) < k) <= 2.5%`. It holds
//! whatever the distribution of the ratios (skewed, as times are, by the
//! occasional preempted run), needs no resampling, and for a fixed number
//! of rounds it is exact: a bootstrap of a median over a handful of
//! samples is known to cover less than it claims. It exists from 6 rounds
//! on (`k = 1`: the extremes cover 96.9%); below that a row carries its
//! extremes and is marked as too few. Under `--runs auto` the number of
//! rounds depends on the samples (it stops once the interval is narrow),
//! so the coverage is then about 95%, not exactly.
//!
//! `--runs auto` (the default) runs [`MIN_AUTO_RUNS`] rounds, then more
//! until every interval lies within ±[`NARROW`] of its ratio, or the
//! experiment's time budget or [`MAX_AUTO_RUNS`] is reached: an experiment
//! whose rounds cover all its rows at once loops with [`Rounds`]; one whose
//! rows run apart gives each its minimum, then the widest row the next
//! round ([`rounds_by_row`]).

use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::Serialize;

/// The fewest rounds whose median has a 95% interval.
pub const MIN_AUTO_RUNS: usize = 6;
/// The most rounds `--runs auto` runs.
pub const MAX_AUTO_RUNS: usize = 40;
/// A ratio's interval is narrow within this fraction of the ratio.
pub const NARROW: f64 = 0.05;

/// `--runs`: a fixed number of rounds, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs {
    Auto,
    Fixed(usize),
}

impl FromStr for Runs {
    type Err = String;
    fn from_str(s: &str) -> Result<Runs, String> {
        if s == "auto" {
            return Ok(Runs::Auto);
        }
        match s.parse::<usize>() {
            Ok(0) => Err("--runs must be at least 1 (or auto)".into()),
            Ok(n) => Ok(Runs::Fixed(n)),
            Err(_) => Err(format!("--runs: {s:?} is neither a count nor auto")),
        }
    }
}

impl std::fmt::Display for Runs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Runs::Auto => f.write_str("auto"),
            Runs::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// The loop over rounds: `while rounds.more(|| narrow) { ...; }`.
pub struct Rounds {
    runs: Runs,
    budget: Duration,
    started: Instant,
    done: usize,
}

impl Rounds {
    /// Rounds for `runs`, with `budget` for the adaptive ones.
    pub fn new(runs: Runs, budget: Duration) -> Rounds {
        Rounds {
            runs,
            budget,
            started: Instant::now(),
            done: 0,
        }
    }

    /// Whether to run another round; `narrow` says whether every interval
    /// is narrow already (asked only when it matters). Counts the round.
    pub fn more(&mut self, narrow: impl FnOnce() -> bool) -> bool {
        let go = match self.runs {
            Runs::Fixed(n) => self.done < n,
            Runs::Auto => {
                self.done < MIN_AUTO_RUNS
                    || (self.done < MAX_AUTO_RUNS
                        && self.started.elapsed() < self.budget
                        && !narrow())
            }
        };
        if go {
            self.done += 1;
        }
        go
    }

    /// Rounds run so far (the current one included).
    pub fn done(&self) -> usize {
        self.done
    }

    /// Lengthen `pb` by the round just begun's `steps` if it is past the
    /// bar's length ([`Rounds::expected`]).
    pub fn lengthen(&self, pb: &indicatif::ProgressBar, steps: u64) {
        if self.done > Rounds::expected(self.runs) {
            pb.inc_length(steps);
        }
    }

    /// The progress bar's length: the fixed count, or the minimum.
    pub fn expected(runs: Runs) -> usize {
        match runs {
            Runs::Auto => MIN_AUTO_RUNS,
            Runs::Fixed(n) => n,
        }
    }
}

/// Rounds of several rows that share one budget. With a fixed count,
/// each row gets that many, one row after another. Under `auto`, each row
/// first gets [`MIN_AUTO_RUNS`]; then each further round goes to the row
/// whose interval is widest ([`Estimate::spread`]), until every row is
/// narrow, has [`MAX_AUTO_RUNS`], or the budget (counted from the start,
/// minimum rounds included) is spent. So the budget goes where the noise
/// is, whatever the rows' order.
///
/// Before all of them, one round of the first row warms up (the caches,
/// the allocators' lists, the host's clock speed) and is thrown away, as
/// the reference programs throw away their first repetition.
///
/// `rows` holds each row's samples: `round(row, i, k)` runs round `k` of
/// row `i`, adding to them; `spread(row)` is the row's widest interval as
/// [`Estimate::spread`] gives it (0 for a row with nothing to narrow).
pub fn rounds_by_row<T: Clone>(
    runs: Runs,
    budget: Duration,
    pb: &indicatif::ProgressBar,
    rows: &mut [T],
    mut round: impl FnMut(&mut T, usize, usize) -> anyhow::Result<()>,
    spread: impl Fn(&T) -> f64,
) -> anyhow::Result<()> {
    let started = Instant::now();
    if let Some(first) = rows.first() {
        round(&mut first.clone(), 0, 0)?;
    }
    let first = Rounds::expected(runs);
    for (i, row) in rows.iter_mut().enumerate() {
        for k in 0..first {
            round(row, i, k)?;
            pb.inc(1);
        }
    }
    if runs != Runs::Auto {
        return Ok(());
    }
    let mut done = vec![first; rows.len()];
    while started.elapsed() < budget {
        let widest = (0..rows.len())
            .filter(|&i| done[i] < MAX_AUTO_RUNS)
            .map(|i| (i, spread(&rows[i])))
            .filter(|&(_, w)| w > NARROW)
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((i, _)) = widest else {
            break;
        };
        pb.inc_length(1);
        round(&mut rows[i], i, done[i])?;
        done[i] += 1;
        pb.inc(1);
    }
    Ok(())
}

/// The median of `v` (the mean of the two middle values for an even count).
pub fn median(v: &[f64]) -> f64 {
    assert!(!v.is_empty(), "median of no samples");
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The rank `k` (1-based) of the median's 95% interval over `n` samples:
/// the largest with `P(Bin(n, 1/2) <= k - 1) <= 0.025`; None below 6.
pub fn median_ci_rank(n: usize) -> Option<usize> {
    // P(Bin(n, 1/2) <= j), summed in f64: exact enough for n <= 1000.
    let mut k = 0;
    let mut cdf = 0.0;
    let mut term = 0.5f64.powi(n as i32); // C(n, 0) / 2^n
    for j in 0..n {
        cdf += term;
        if cdf > 0.025 {
            break;
        }
        k = j + 1;
        term *= (n - j) as f64 / (j + 1) as f64;
    }
    (k >= 1).then_some(k)
}

/// A median with its 95% interval, over `n` samples.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub n: usize,
}

impl Estimate {
    /// The median of `v` and its interval (the extremes, below 6 samples).
    pub fn of(v: &[f64]) -> Estimate {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let (lo, hi) = match median_ci_rank(n) {
            Some(k) => (s[k - 1], s[n - k]),
            None => (s[0], s[n - 1]),
        };
        Estimate {
            value: median(&s),
            ci_low: lo,
            ci_high: hi,
            n,
        }
    }

    /// A row's value and interval fields, back as an estimate over `n`
    /// rounds (None where the row has none).
    pub fn from_fields(
        value: Option<f64>,
        ci_low: Option<f64>,
        ci_high: Option<f64>,
        n: usize,
    ) -> Option<Estimate> {
        Some(Estimate {
            value: value?,
            ci_low: ci_low?,
            ci_high: ci_high?,
            n,
        })
    }

    /// The fields a row keeps of an estimate it may lack: value, `ci_low`,
    /// `ci_high`.
    pub fn fields(e: Option<Estimate>) -> (Option<f64>, Option<f64>, Option<f64>) {
        match e {
            Some(e) => (Some(e.value), Some(e.ci_low), Some(e.ci_high)),
            None => (None, None, None),
        }
    }

    /// The median of the per-round ratios `arm[i] / base[i]`.
    pub fn ratio(arm: &[f64], base: &[f64]) -> Estimate {
        assert_eq!(arm.len(), base.len(), "ratios need paired samples");
        let r: Vec<f64> = arm.iter().zip(base).map(|(a, b)| a / b).collect();
        Estimate::of(&r)
    }

    /// How far the interval reaches from the value, as a fraction of it
    /// (the larger side); infinite below 6 rounds, which have none.
    pub fn spread(&self) -> f64 {
        if median_ci_rank(self.n).is_none() {
            return f64::INFINITY;
        }
        (self.ci_high / self.value - 1.0).max(1.0 - self.ci_low / self.value)
    }

    /// Whether the interval is too wide to read (beyond ±[`NARROW`] of the
    /// value) or too few rounds were run to have one.
    pub fn wide(&self) -> bool {
        self.spread() > NARROW
    }

    /// Whether the interval holds `x`.
    #[cfg(test)]
    pub fn contains(&self, x: f64) -> bool {
        self.ci_low <= x && x <= self.ci_high
    }

    /// `-37% [-39, -35]`, the change a ratio stands for, with its interval;
    /// `*` marks a wide one.
    pub fn change_pct(&self) -> String {
        format!(
            "{:+.0}% [{:+.0},{:+.0}]{}",
            (self.value - 1.0) * 100.0,
            (self.ci_low - 1.0) * 100.0,
            (self.ci_high - 1.0) * 100.0,
            if self.wide() { "*" } else { "" }
        )
    }

    /// `0.52 [0.50,0.55]`, `*` marking a wide one.
    pub fn ratio_text(&self) -> String {
        format!(
            "{:.2} [{:.2},{:.2}]{}",
            self.value,
            self.ci_low,
            self.ci_high,
            if self.wide() { "*" } else { "" }
        )
    }
}

/// The footnote every table with intervals ends with.
pub fn footnote(rounds: &str) -> String {
    format!(
        "[a,b]: 95% confidence interval of the median ({rounds}); * marks one wider than ±{:.0}% or from fewer than {MIN_AUTO_RUNS} rounds",
        NARROW * 100.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_ranks_are_the_binomial_ones() {
        // Tables of the sign test: n = 6..8 use the extremes, 9..11 the
        // second, 12..14 the third, 20 the sixth.
        assert_eq!(median_ci_rank(5), None);
        assert_eq!(median_ci_rank(6), Some(1));
        assert_eq!(median_ci_rank(8), Some(1));
        assert_eq!(median_ci_rank(9), Some(2));
        assert_eq!(median_ci_rank(12), Some(3));
        assert_eq!(median_ci_rank(20), Some(6));
    }

    #[test]
    fn ratio_interval_pairs_the_rounds() {
        // A drift shared by both arms cancels in the per-round ratio.
        let base: Vec<f64> = (0..9).map(|i| 1.0 + i as f64).collect();
        let arm: Vec<f64> = base.iter().map(|b| b * 0.6).collect();
        let e = Estimate::ratio(&arm, &base);
        assert!((e.value - 0.6).abs() < 1e-12);
        assert!(!e.wide());
        assert!(!e.contains(1.0));
        // Unpaired, the same samples' medians would say nothing this sure.
        let spread = Estimate::of(&base);
        assert!(spread.wide());
    }

    #[test]
    fn few_rounds_are_marked() {
        let e = Estimate::of(&[1.0, 1.0, 1.0]);
        assert!(e.wide(), "3 rounds have no 95% interval");
        assert_eq!(Estimate::of(&[2.0, 1.0, 3.0, 4.0]).value, 2.5);
    }

    #[test]
    fn the_widest_row_gets_the_next_round() {
        let pb = indicatif::ProgressBar::hidden();
        // Each row: (its index, rounds run). Row 0 is narrow at once; row
        // 1 after 9 rounds; row 2 never.
        let spread = |&(r, n): &(usize, usize)| match r {
            0 => 0.01,
            1 if n >= 9 => 0.01,
            1 => 0.2,
            _ => 0.1,
        };
        let round = |(r, n): &mut (usize, usize), i: usize, k: usize| {
            assert_eq!((*r, *n), (i, k), "rounds of a row come in order");
            *n += 1;
            Ok(())
        };
        let counts = |rows: &[(usize, usize)]| rows.iter().map(|r| r.1).collect::<Vec<_>>();
        let hour = Duration::from_secs(3600);
        let mut rows = [(0, 0), (1, 0), (2, 0)];
        rounds_by_row(Runs::Auto, hour, &pb, &mut rows, round, spread).unwrap();
        assert_eq!(counts(&rows), vec![MIN_AUTO_RUNS, 9, MAX_AUTO_RUNS]);
        // No budget: the minimum each; a fixed count: that many.
        let mut rows = [(0, 0), (1, 0), (2, 0)];
        rounds_by_row(Runs::Auto, Duration::ZERO, &pb, &mut rows, round, spread).unwrap();
        assert_eq!(counts(&rows), vec![MIN_AUTO_RUNS; 3]);
        let mut rows = [(0, 0), (1, 0), (2, 0)];
        rounds_by_row(Runs::Fixed(2), hour, &pb, &mut rows, round, spread).unwrap();
        assert_eq!(counts(&rows), vec![2; 3]);
    }

    #[test]
    fn auto_runs_stop_when_narrow_or_out_of_budget() {
        let mut r = Rounds::new(Runs::Auto, Duration::from_secs(3600));
        let mut n = 0;
        while r.more(|| true) {
            n += 1;
        }
        assert_eq!(n, MIN_AUTO_RUNS);
        let mut r = Rounds::new(Runs::Auto, Duration::from_secs(3600));
        let mut n = 0;
        while r.more(|| false) {
            n += 1;
        }
        assert_eq!(n, MAX_AUTO_RUNS);
        let mut r = Rounds::new(Runs::Auto, Duration::ZERO);
        let mut n = 0;
        while r.more(|| false) {
            n += 1;
        }
        assert_eq!(n, MIN_AUTO_RUNS);
        let mut r = Rounds::new(Runs::Fixed(3), Duration::ZERO);
        let mut n = 0;
        while r.more(|| false) {
            n += 1;
        }
        assert_eq!(n, 3);
        assert_eq!("auto".parse::<Runs>(), Ok(Runs::Auto));
        assert!("0".parse::<Runs>().is_err());
        assert!("x".parse::<Runs>().is_err());
    }
}
