//! The merge figures (issue 35): the conflict scan after a base move with 50 live branches on
//! a repository of 3,000 files, through `canopy_git::Git::conflict_scan` exactly as the branch
//! watcher calls it, beside one `git merge-tree` of one branch in the same run; and the merge
//! queue's throughput with a check that takes 1 s, through a real daemon (Managers with
//! checkouts ask over the API, the operator approves them all, the queue lands them one by
//! one), beside the same check run back to back with no queue around it.
//!
//! Owns only the setup and the timing; the scan and the queue are the product's.

use std::path::Path;
use std::time::{Duration, Instant};

use canopy_git::Git;
use canopy_harness::SandboxSettings;
use canopy_proto::api::*;
use canopy_proto::method;

use crate::figure::{Figure, percentile};
use crate::setup::Bench;

/// Files in the benchmark repository, and live branches the scan test-merges.
const FILES: usize = 3_000;
const BRANCHES: usize = 50;

fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    canopy_cli::sandbox::operator_git(dir, args)
}

/// A repository of `FILES` files in `source`, on `main`.
fn make_repository(source: &Path) -> Result<(), String> {
    for n in 0..FILES {
        let sub = source.join(format!("src/m{}", n % 30));
        std::fs::create_dir_all(&sub).map_err(|e| e.to_string())?;
        std::fs::write(sub.join(format!("f{n}.rs")), format!("pub fn f{n}() -> usize {{\n    {n}\n}}\n"))
            .map_err(|e| e.to_string())?;
    }
    git(source, &["init", "-q", "-b", "main"])?;
    git(source, &["add", "-A"])?;
    git(source, &["commit", "-qm", "start"]).map(|_| ())
}

fn file(n: usize) -> String {
    format!("src/m{}/f{n}.rs", n % 30)
}

/// The two figures.
pub async fn figures(quick: bool) -> Result<Vec<Figure>, String> {
    let mut figures = vec![conflict_scan(quick).await?];
    figures.push(queue_throughput(quick).await?);
    Ok(figures)
}

/// `BRANCHES` branches, each changing three files of its own and every fifth also one file
/// the base then changes too (a conflict with the base) and every seventh a file another
/// branch changes (a pair to test-merge); then the base moves, and the scan runs.
async fn conflict_scan(quick: bool) -> Result<Figure, String> {
    let samples = if quick { 3 } else { 10 };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let source = dir.path().join("app");
    make_repository(&source)?;
    let mut branches = Vec::new();
    for b in 0..BRANCHES {
        git(&source, &["checkout", "-q", "-b", &format!("canopy/m{b}"), "main"])?;
        let mut touched: Vec<usize> = (0..3).map(|k| 100 + b * 3 + k).collect();
        if b % 5 == 0 {
            touched.push(0);
        }
        if b % 7 == 0 {
            touched.push(1);
        }
        for n in &touched {
            std::fs::write(source.join(file(*n)), format!("pub fn f{n}() -> usize {{\n    {b}\n}}\n"))
                .map_err(|e| e.to_string())?;
        }
        git(&source, &["commit", "-qam", &format!("branch {b}")])?;
        branches.push((format!("canopy/m{b}"), git(&source, &["rev-parse", "HEAD"])?));
    }
    git(&source, &["checkout", "-q", "main"])?;
    std::fs::write(source.join(file(0)), "pub fn f0() -> usize {\n    999\n}\n").map_err(|e| e.to_string())?;
    git(&source, &["commit", "-qam", "the base moves"])?;
    let base = git(&source, &["rev-parse", "HEAD"])?;
    let data = dir.path().join("data");
    let git_ops = Git::new("git", SandboxSettings::required(&data), Duration::from_secs(60));
    let (mut scans, mut singles) = (Vec::new(), Vec::new());
    let mut found = 0;
    for _ in 0..samples {
        let started = Instant::now();
        let conflicts = git_ops.conflict_scan(&source, "main", &base, &branches).await.map_err(|e| e.to_string())?;
        scans.push(started.elapsed());
        found = conflicts.len();
        let started = Instant::now();
        git_ops.conflicts(&source, &base, &branches[1].1).await.map_err(|e| e.to_string())?;
        singles.push(started.elapsed());
    }
    scans.sort();
    singles.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (value, baseline) = (ms(percentile(&scans, 0.5)), ms(percentile(&singles, 0.5)));
    Ok(Figure {
        figure: format!("the conflict scan after a base move, {BRANCHES} live branches, {FILES} files, p50"),
        value,
        unit: "ms".into(),
        baseline,
        baseline_name: "one `git merge-tree --write-tree` of one branch p50 (ms)".into(),
        ratio: value / baseline,
        target: "< 2000 ms".into(),
        met: value < 2000.0,
        note: format!(
            "{samples} scans; {found} conflicts found (with the base and between branches); max {:.0} ms",
            ms(scans[scans.len() - 1])
        ),
    })
}

/// `entries` Managers on a repository whose one check sleeps 1 s: each commits and asks to
/// merge; the operator approves all at once; the figure is merges per minute from the first
/// approval to the last landing, beside the same check run `entries` times back to back.
async fn queue_throughput(quick: bool) -> Result<Figure, String> {
    let entries = if quick { 4 } else { 10 };
    let bench = Bench::start().await?;
    let source = bench.scratch().join("app");
    make_repository(&source)?;
    let add = ReposAddRequest {
        name: "app".into(),
        source: source.display().to_string(),
        base: Some("main".into()),
        check: None,
        checks: [("ci".to_owned(), "sleep 1".to_owned())].into_iter().collect(),
        review: None,
    };
    bench.api.send::<method::ReposAdd>(&bench.operator, &add).await.map_err(|e| e.to_string())?;
    let homes = bench.create_agents_on("q", entries, false, Some("app")).await?;
    let handles: Vec<String> = homes.iter().map(|h| h.trim_start_matches("home-").to_owned()).collect();
    let (sessions, heartbeat) = bench.fake_sessions_kept(1_000).await?;
    let answering = bench.answer_git_as_stand_in().await?;
    let measured = measure_queue(&bench, &sessions, &handles).await;
    answering.abort();
    heartbeat.abort();
    bench.stop().await;
    let (elapsed, baseline) = measured?;
    let per_minute = |d: Duration| entries as f64 / d.as_secs_f64() * 60.0;
    let (value, base) = (per_minute(elapsed), per_minute(baseline));
    Ok(Figure {
        figure: format!("merge queue throughput, {entries} approved requests, a check of 1 s"),
        value,
        unit: "merges/min".into(),
        baseline: base,
        baseline_name: "the same check run back to back, no queue (per min)".into(),
        ratio: value / base,
        target: "(reported; higher is better)".into(),
        met: true,
        note: format!(
            "{entries} landed one at a time, each merged onto the base as it was then and checked there, in {:.1} s",
            elapsed.as_secs_f64()
        ),
    })
}

/// Commits in each Manager's checkout, asks to merge as it, approves all as the operator and
/// times the queue; then times the bare check in a checkout, back to back.
async fn measure_queue(
    bench: &Bench,
    sessions: &[SessionAssignment],
    handles: &[String],
) -> Result<(Duration, Duration), String> {
    let entries = handles.len();
    for (i, handle) in handles.iter().enumerate() {
        let session = sessions.iter().find(|s| s.agent == *handle).ok_or(format!("{handle} got no session"))?;
        // The stand-in runner shares the daemon's directory: its checkouts are the daemon's.
        let work = &bench.data().sessions().join(handle).join("work");
        std::fs::write(work.join(format!("q{i}.txt")), format!("{i}\n")).map_err(|e| e.to_string())?;
        git(work, &["add", "-A"])?;
        git(work, &["commit", "-qm", &format!("entry {i}")])?;
        let ask = MergesRequestRequest {
            title: format!("Entry {i}"),
            summary: "One file.".into(),
            depends_on: Vec::new(),
            issues: Vec::new(),
        };
        bench.api.send::<method::MergesRequest>(&session.token, &ask).await.map_err(|e| e.to_string())?;
    }
    wait_merges(bench, entries, canopy_core::MergeState::Pending).await?;
    let started = Instant::now();
    for i in 1..=entries {
        let approve =
            MergesDecideRequest { id: format!("merge-{i}"), approve: true, reason: None, override_reason: None };
        bench.api.send::<method::MergesDecide>(&bench.operator, &approve).await.map_err(|e| e.to_string())?;
    }
    wait_merges(bench, entries, canopy_core::MergeState::Merged).await?;
    let elapsed = started.elapsed();
    let work = &bench.data().sessions().join(&handles[0]).join("work");
    let git_ops = Git::new("git", SandboxSettings::required(bench.data().root()), Duration::from_secs(60));
    let mirror = git_ops.mirror_path("app");
    let started = Instant::now();
    for _ in 0..entries {
        let check = git_ops.check(&mirror, work, "sleep 1", 1024).await;
        if !check.passed {
            return Err(format!("the bare check failed: {}", check.outcome));
        }
    }
    Ok((elapsed, started.elapsed()))
}

/// Waits (at most 5 minutes) until `n` merge requests are in `state`.
async fn wait_merges(bench: &Bench, n: usize, state: canopy_core::MergeState) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let listed = bench
            .api
            .send::<method::MergesList>(&bench.operator, &MergesListRequest { state: Some(state) })
            .await
            .map_err(|e| e.to_string())?;
        if listed.merges.len() >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            let all = bench
                .api
                .send::<method::MergesList>(&bench.operator, &MergesListRequest { state: None })
                .await
                .map_err(|e| e.to_string())?;
            let states: Vec<String> = all
                .merges
                .iter()
                .map(|m| format!("{} {} {}", m.id, m.state, m.note.clone().unwrap_or_default()))
                .collect();
            return Err(format!("{n} requests never reached {state}: {states:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
