//! What a run measures and how big it is: `Figure` (one figure beside its baseline), the
//! groups `--only` selects (`PARTS`, `Parts`), `Options`, and the percentile every figure
//! takes of its samples.
//!
//! Measures nothing itself; every figure file builds on it, and it imports none of them.

use std::time::{Duration, Instant};

use serde::Serialize;

/// How big a run is.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Smaller counts, for CI and a first look (about half a minute).
    pub quick: bool,
    /// Only the history figures (`large.rs`): 0, 1,000,000 and 10,000,000 messages (with
    /// `quick`, 0 and 100,000).
    pub large: bool,
    /// Which groups of figures to measure (all by default).
    pub only: Parts,
}

/// The groups of figures `canopy-bench --only` selects, by name.
/// The last three are `--large`'s.
pub const PARTS: &[&str] = &[
    "post",
    "steer",
    "mcp",
    "broadcast",
    "budget",
    "restart",
    "prompt",
    "sandbox",
    "checkout",
    "issues",
    "merges",
    "history",
    "posters",
    "agents",
];

/// A set of `PARTS`, as bits in their order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts(u16);

impl Parts {
    pub const ALL: Parts = Parts(u16::MAX);

    /// The parts named, or an error naming the unknown one and the known ones.
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Parts, String> {
        let mut bits = 0;
        for name in names {
            let index = PARTS
                .iter()
                .position(|p| *p == name)
                .ok_or_else(|| format!("no figure group {name:?} (known: {})", PARTS.join(", ")))?;
            bits |= 1 << index;
        }
        Ok(if bits == 0 { Parts::ALL } else { Parts(bits) })
    }

    pub fn has(self, name: &str) -> bool {
        PARTS.iter().position(|p| *p == name).is_some_and(|i| self.0 & (1 << i) != 0)
    }
}

/// One measured figure beside its baseline.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub figure: String,
    pub value: f64,
    pub unit: String,
    pub baseline: f64,
    pub baseline_name: String,
    /// For throughput, value / baseline (higher is better); for times, value / baseline
    /// (lower is better). `target` says which.
    pub ratio: f64,
    pub target: String,
    pub met: bool,
    /// Extra facts (rows written, counts).
    pub note: String,
}

/// The `p` quantile (0 to 1) of sorted samples; zero when there are none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// p99 of `samples` calls of `call`, in microseconds.
pub async fn p99_of<F, Fut>(samples: usize, mut call: F) -> Result<f64, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let at = Instant::now();
        call().await?;
        times.push(at.elapsed());
    }
    times.sort();
    Ok(percentile(&times, 0.99).as_secs_f64() * 1e6)
}
