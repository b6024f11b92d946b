//! The console's pictures, drawn on the server as SVG (no chart library, no script): the tree
//! as a diagram, spend over time with budget lines, and an agent's timeline. Pure: each takes
//! what the API returned and returns markup; colours are SVG attributes (the page's CSP allows
//! no inline style), and every mark carries `data-*` values a test or a user script can read.
//! Does not fetch anything or decide what waits (the caller says).

use std::collections::HashSet;

use canopy_core::timeline::{Timeline, TurnSpan};
use canopy_core::{Presence, RosterEntry, TreeNode};
use canopy_proto::api::{SeriesBucket, UsageResponse, UsageSeriesResponse};
use maud::{Markup, html};

/// The colour of a presence: working blue, idle green, held amber, failing and crashed red,
/// asleep grey.
pub fn colour(presence: Presence) -> &'static str {
    match presence {
        Presence::Working | Presence::Starting | Presence::Compacting => "#0b5cad",
        Presence::Idle => "#1b6b34",
        Presence::WaitingApproval | Presence::PausedBudget => "#8a5100",
        Presence::Failing | Presence::Stalled | Presence::Crashed => "#a4161a",
        Presence::Offline | Presence::Despawned => "#6b7280",
    }
}

/// Rows of the tree diagram: (depth, node), depth first.
fn rows<'a>(node: &'a TreeNode, depth: usize, out: &mut Vec<(usize, &'a TreeNode)>) {
    out.push((depth, node));
    for child in &node.children {
        rows(child, depth + 1, out);
    }
}

/// Where a row's dot is drawn.
type Dot = (usize, usize);

const ROW: usize = 40;
const INDENT: usize = 22;

/// The tree as a diagram: a row per agent, indented under its parent with an elbow line, a
/// dot in its presence's colour, its handle, presence and spend, and a mark when something of
/// its waits for the operator (`waiting`); each row links to the agent's page.
pub fn tree(root: &TreeNode, roster: &[RosterEntry], usage: &UsageResponse, waiting: &HashSet<&str>) -> Markup {
    let mut all = Vec::new();
    rows(root, 0, &mut all);
    let depth = all.iter().map(|(d, _)| *d).max().unwrap_or(0);
    let width = depth * INDENT + 360;
    let height = all.len() * ROW + 8;
    // Each row's dot, and its parent's, to draw the elbow between them.
    let mut stack: Vec<Dot> = Vec::new();
    let placed: Vec<(&TreeNode, usize, usize, Option<Dot>)> = all
        .iter()
        .enumerate()
        .map(|(i, (d, n))| {
            let (x, y) = (d * INDENT + 12, i * ROW + 20);
            stack.truncate(*d);
            let parent = stack.last().copied();
            stack.push((x, y));
            (*n, x, y, parent)
        })
        .collect();
    // Attributes SVG children inherit are set once on the root (the page's weight counts).
    html! {
        svg.diagram role="img" aria-label="The agent tree" viewBox=(format!("0 0 {width} {height}")) width=(width)
            font-size="14" fill="#16181d" {
            g stroke="#b3bac5" fill="none" {
                @for (_, x, y, parent) in &placed {
                    @if let Some((px, py)) = parent {
                        path d=(format!("M{px} {}V{y}H{}", py + 7, x - 8)) {}
                    }
                }
            }
            @for (n, x, y, _) in &placed {
                @let (x, y) = (*x, *y);
                @let entry = roster.iter().find(|a| a.handle == n.handle);
                @let presence = entry.map_or(Presence::Offline, |a| a.presence);
                @let spent = usage.agents.iter().find(|u| u.agent == n.handle).and_then(|u| u.totals.cost_usd);
                @let waits = waiting.contains(n.handle.as_str());
                a href=(format!("/agents/{}", n.handle.as_str())) {
                    g.node data-agent=(n.handle.as_str()) data-presence=(presence.as_str()) data-waits=[waits.then_some("1")] {
                        @if let Some(r) = entry.and_then(|a| a.reason.as_ref()) { title { (r) } }
                        circle cx=(x) cy=(y) r="7" fill=(colour(presence)) {}
                        text x=(x + 14) y=(y + 5) {
                            tspan font-weight="700" { (n.handle.as_str()) }
                            tspan fill=(colour(presence)) { " " (presence.as_str()) }
                            @if let Some(usd) = spent { tspan fill="#4d5562" { " $" (format!("{usd:.2}")) } }
                            @if waits { tspan fill="#8a5100" font-weight="700" { " ● waits for you" } }
                            @for mark in entry.map(marks).unwrap_or_default() { tspan fill="#a4161a" { " · " (mark) } }
                        }
                        @if let Some(activity) = entry.and_then(|a| a.activity.as_ref()) {
                            text x=(x + 14) y=(y + 19) font-size="11" fill="#4d5562" { (cut(activity, 60)) }
                        }
                    }
                }
                @if n.omitted > 0 {
                    text x=(x + 14 + INDENT) y=(y + 19) font-size="11" fill="#4d5562" { (n.omitted) " more not shown" }
                }
            }
        }
    }
}

/// What the roster says of a session's confinement and lane that an operator must see.
fn marks(a: &RosterEntry) -> Vec<String> {
    let mut out = Vec::new();
    if a.unconfined {
        out.push("unconfined".to_owned());
    }
    if a.host_network {
        out.push("host network".to_owned());
    }
    if a.egress_refused > 0 {
        out.push(format!("egress refused: {}", a.egress_refused));
    }
    if let Some(failover) = &a.failover {
        out.push(format!("on {} ({failover})", a.harness));
    }
    out
}

fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

const CHART_W: f64 = 720.0;
const CHART_H: f64 = 180.0;
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 22.0;

/// Spend over time: a bar per bucket (its dollars), the running total as a line, and each
/// budget's dollar limit as a dashed line on the running total's scale.
pub fn spend(series: &UsageSeriesResponse) -> Markup {
    let n = series.points.len().max(1);
    let plot_w = CHART_W - LEFT - 8.0;
    let plot_h = CHART_H - BOTTOM - 10.0;
    let slot = plot_w / n as f64;
    let total: f64 = series.points.iter().map(|p| p.usd).sum();
    let limits: Vec<(String, f64)> = series
        .budgets
        .iter()
        .filter_map(|b| b.limit.usd.map(|usd| (format!("@{}'s {} ${usd:.2}", b.owner.as_str(), b.scope), usd)))
        .collect();
    let top = limits.iter().map(|(_, l)| *l).fold(total, f64::max).max(0.0001);
    let bar_top = series.points.iter().map(|p| p.usd).fold(0.0_f64, f64::max).max(0.0001);
    let y_of = |usd: f64, scale: f64| 10.0 + plot_h - usd / scale * plot_h;
    let mut running = 0.0;
    let line: Vec<String> = series
        .points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            running += p.usd;
            format!("{:.1},{:.1}", LEFT + slot * (i as f64 + 0.5), y_of(running, top))
        })
        .collect();
    let every = match series.bucket {
        SeriesBucket::Hour => 6,
        SeriesBucket::Day => 5,
    };
    html! {
        svg.chart role="img" aria-label=(format!("Spend per {}: ${total:.2} in all", bucket_word(series.bucket)))
            viewBox=(format!("0 0 {CHART_W} {CHART_H}")) width=(CHART_W)
            data-total=(format!("{total:.6}")) {
            line x1=(LEFT) y1=(10.0 + plot_h) x2=(CHART_W - 8.0) y2=(10.0 + plot_h) stroke="#b3bac5" {}
            text x=(LEFT - 6.0) y="16" font-size="11" text-anchor="end" fill="#4d5562" { "$" (format!("{top:.2}")) }
            text x=(LEFT - 6.0) y=(10.0 + plot_h) font-size="11" text-anchor="end" fill="#4d5562" { "$0" }
            @for (i, p) in series.points.iter().enumerate() {
                @let h = p.usd / bar_top * plot_h * 0.5;
                rect.bar x=(format!("{:.1}", LEFT + slot * i as f64 + 1.0)) y=(format!("{:.1}", 10.0 + plot_h - h))
                    width=(format!("{:.1}", (slot - 2.0).max(1.0))) height=(format!("{h:.1}")) fill="#9ec1e6"
                    data-start=(p.start) data-usd=(format!("{:.6}", p.usd)) data-tokens=(p.tokens) {
                    title { (label(&p.start, series.bucket)) ": $" (format!("{:.4}", p.usd)) ", " (p.tokens) " tokens" }
                }
                @if i % every == 0 {
                    text x=(format!("{:.1}", LEFT + slot * i as f64)) y=(CHART_H - 6.0) font-size="11" fill="#4d5562" { (label(&p.start, series.bucket)) }
                }
            }
            polyline.running points=(line.join(" ")) fill="none" stroke="#0b5cad" stroke-width="2" {}
            @for (name, limit) in &limits {
                @let y = y_of(*limit, top);
                line.budget x1=(LEFT) y1=(format!("{y:.1}")) x2=(CHART_W - 8.0) y2=(format!("{y:.1}")) stroke="#a4161a" stroke-dasharray="5 4" data-usd=(limit) {}
                text x=(CHART_W - 10.0) y=(format!("{:.1}", y - 3.0)) font-size="11" text-anchor="end" fill="#a4161a" { (name) }
            }
        }
    }
}

fn bucket_word(bucket: SeriesBucket) -> &'static str {
    match bucket {
        SeriesBucket::Hour => "hour",
        SeriesBucket::Day => "day",
    }
}

/// `08:00` for an hour, `12-05` for a day (UTC, as the buckets are).
fn label(start: &str, bucket: SeriesBucket) -> String {
    match bucket {
        SeriesBucket::Hour => start.get(11..16).unwrap_or(start).to_owned(),
        SeriesBucket::Day => start.get(5..10).unwrap_or(start).to_owned(),
    }
}

const LANE_W: f64 = 960.0;

/// An agent's timeline: turns as bars on a time axis (each a link that zooms to it), the tool
/// calls inside them as thinner bars, steers and deliveries as ticks above; the waits are the
/// gaps. `zoom` narrows the axis to one turn (`incarnation-turn`).
pub fn timeline(handle: &str, t: &Timeline, zoom: Option<&TurnSpan>) -> Markup {
    let (from, to) = match zoom {
        Some(turn) => {
            let end = turn.end_ms.unwrap_or(t.to_ms);
            let pad = ((end - turn.start_ms) / 10).max(200);
            (turn.start_ms - pad, end + pad)
        }
        // The day, from its first turn or mark: a day's axis would make minutes of work slivers.
        None => {
            let first = t.turns.iter().map(|turn| turn.start_ms).chain(t.marks.iter().map(|m| m.at_ms)).min();
            let from = first.map_or(t.from_ms, |first| (first - (t.to_ms - first) / 20).max(t.from_ms));
            (from, t.to_ms)
        }
    };
    let span = (to - from).max(1) as f64;
    let x = |ms: i64| 8.0 + (ms.clamp(from, to) - from) as f64 / span * (LANE_W - 16.0);
    let w = |a: i64, b: i64| (x(b) - x(a)).max(2.0);
    html! {
        svg.timeline role="img" aria-label=(format!("{handle}'s turns"))
            viewBox=(format!("0 0 {LANE_W} 92")) width=(LANE_W) data-from=(from) data-to=(to) {
            line x1="8" y1="74" x2=(LANE_W - 8.0) y2="74" stroke="#b3bac5" {}
            text x="8" y="88" font-size="11" fill="#4d5562" { (clock(from)) }
            text x=(LANE_W - 8.0) y="88" font-size="11" text-anchor="end" fill="#4d5562" { (clock(to)) }
            @for m in &t.marks {
                @if m.at_ms >= from && m.at_ms <= to {
                    line.mark x1=(format!("{:.1}", x(m.at_ms))) y1="4" x2=(format!("{:.1}", x(m.at_ms))) y2="20"
                        stroke=(if m.kind == "steer" { "#8a5100" } else { "#0b5cad" }) stroke-width="2" data-kind=(m.kind) data-at=(m.at_ms) {
                        title { (m.kind) ": " (m.summary) }
                    }
                }
            }
            @for turn in &t.turns {
                @let end = turn.end_ms.unwrap_or(t.to_ms);
                @if end >= from && turn.start_ms <= to {
                    a href=(format!("?turn={}-{}", turn.incarnation, turn.turn_id)) {
                        rect.turn x=(format!("{:.1}", x(turn.start_ms))) y="26" width=(format!("{:.1}", w(turn.start_ms, end))) height="22"
                            fill=(if turn.end_ms.is_none() { "#0b5cad" } else { "#9ec1e6" })
                            data-turn=(turn.turn_id) data-start=(turn.start_ms) data-end=(end) data-status=(turn.status.as_deref().unwrap_or("running")) {
                            title { "turn " (turn.turn_id) ": " (turn.tools.len()) " tool calls, " (turn.status.as_deref().unwrap_or("running")) }
                        }
                    }
                    @for tool in &turn.tools {
                        @let tool_end = tool.end_ms.unwrap_or(end);
                        rect.tool x=(format!("{:.1}", x(tool.start_ms))) y="52" width=(format!("{:.1}", w(tool.start_ms, tool_end))) height="12"
                            fill=(if tool.outcome.as_deref().is_some_and(|o| o != "result") { "#a4161a" } else { "#1b6b34" })
                            data-turn=(turn.turn_id) data-tool=(tool.name) {
                            title { (tool.name) ": " (tool.outcome.as_deref().unwrap_or("running")) }
                        }
                    }
                }
            }
        }
    }
}

/// `HH:MM:SS` UTC of a time in milliseconds.
fn clock(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    let text = humantime::format_rfc3339_seconds(t).to_string();
    format!("{} UTC", text.get(11..19).unwrap_or(&text))
}
