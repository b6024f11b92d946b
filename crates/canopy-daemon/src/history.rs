//! The history area (`History`): `history.search` (and its text index, filled in the
//! background), `sessions.continuity`, `usage`, and the retention pass. Uses the store and
//! the data directory's `sessions/`.
//!
//! The daemon builds the continuity block because it has the facts (identity, checkpoints,
//! open spawn requests, pins, subagent runs still out); the runner only asks for it at a
//! session start and after a reported compaction, and puts it at the head of that input.
//! Does not hold SQL (the store gathers the facts) or render text (`canopy_core::continuity`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use canopy_config::Config;
use canopy_core::acl::Caller;
use canopy_core::continuity::{DEFAULT_HISTORY_LIMIT, HistoryCursor, MAX_HISTORY_LIMIT, continuity_block};
use canopy_core::{Error, Incarnation};
use canopy_proto::api::*;
use canopy_store::{HistoryQuery, PRUNE_BATCH, Pruned, SeriesScope, Store, ops};

/// The history area. Cheap to clone.
#[derive(Clone)]
pub struct History {
    store: Store,
    config: Arc<Config>,
    data_dir: PathBuf,
}

/// Longest `history_search` query, in bytes.
pub const MAX_QUERY_BYTES: usize = 500;

/// Most messages one text-index job adds: a few milliseconds of the writer's time.
const INDEX_BATCH: usize = 200;
/// How often the text index looks for messages once it has caught up, or while the writer
/// has posts queued.
const INDEX_EVERY: Duration = Duration::from_millis(250);
/// Longest the text index gives way to a busy writer before it takes its batch anyway.
const INDEX_YIELDS_AT_MOST: Duration = Duration::from_secs(5);

impl History {
    pub fn new(store: Store, config: Arc<Config>, data_dir: PathBuf) -> Self {
        History { store, config, data_dir }
    }

    /// Fills `history_search`'s text index behind the post path, forever: a batch at a time
    /// through the writer, only while no other write is queued (or after giving way for
    /// `INDEX_YIELDS_AT_MOST`), resting after each batch at least as long as it took, and
    /// `INDEX_EVERY` once it has caught up. A failure is logged and retried; the search reads
    /// what is not indexed yet from the history, so a lagging index is slower, never wrong.
    pub async fn fill_text_index(&self) {
        let mut waited_since = None;
        loop {
            let waited = *waited_since.get_or_insert_with(tokio::time::Instant::now);
            if self.store.writes_waiting() > 0 && waited.elapsed() < INDEX_YIELDS_AT_MOST {
                tokio::time::sleep(INDEX_EVERY).await;
                continue;
            }
            waited_since = None;
            let started = tokio::time::Instant::now();
            let rest = match self.store.write(|c| ops::index_text(c, INDEX_BATCH)).await {
                Ok(added) if added == INDEX_BATCH => started.elapsed().max(Duration::from_millis(5)),
                Ok(_) => INDEX_EVERY,
                Err(e) => {
                    tracing::warn!(error = %e, "indexing message text failed; retrying");
                    INDEX_EVERY * 4
                }
            };
            tokio::time::sleep(rest).await;
        }
    }

    pub(crate) async fn history_search(
        &self,
        caller: Caller,
        req: HistorySearchRequest,
    ) -> Result<HistorySearchResponse, Error> {
        let limit = match req.limit.unwrap_or(DEFAULT_HISTORY_LIMIT) {
            0 => return Err(Error::invalid("limit", "must be at least 1")),
            n if n > MAX_HISTORY_LIMIT => {
                return Err(Error::invalid("limit", format!("{n} is above the maximum of {MAX_HISTORY_LIMIT}")));
            }
            n => n,
        };
        if let Some(text) = &req.query
            && text.len() > MAX_QUERY_BYTES
        {
            return Err(Error::TooLarge { field: "query", len: text.len(), max: MAX_QUERY_BYTES });
        }
        let before = req.before.as_deref().map(HistoryCursor::parse).transpose()?.unwrap_or(HistoryCursor::NEWEST);
        let query = HistoryQuery { text: req.query, before, limit, include_tool_events: req.include_tool_events };
        let page = self.store.read(move |conn| ops::history_search(conn, &caller, &query)).await?;
        Ok(HistorySearchResponse { items: page.items, next_before: page.next_before.map(|c| c.to_string()) })
    }

    pub(crate) async fn sessions_continuity(
        &self,
        runner: canopy_core::RunnerId,
        req: SessionsContinuityRequest,
    ) -> Result<SessionsContinuityResponse, Error> {
        crate::edge::as_runner(&runner, &req.runner_id)?;
        let compaction = req.when == ContinuityWhen::Compaction;
        let mut facts = self
            .store
            .read(move |conn| {
                ops::live_agent(conn, &req.agent, req.incarnation, &req.runner_id)?;
                ops::continuity_facts(conn, &req.agent, req.incarnation, compaction)
            })
            .await?;
        facts.runs_out = self.runs_out(&facts.agent).await;
        Ok(SessionsContinuityResponse { block: continuity_block(&facts) })
    }

    /// Subagent runs an agent started that have not reported back, one line each.
    async fn runs_out(&self, agent: &str) -> Vec<String> {
        let agent = agent.to_owned();
        let runs = self.store.read(move |conn| ops::list_runs(conn, &agent, true)).await.unwrap_or_default();
        runs.into_iter().map(|r| format!("run {} ({}, started {})", r.id, r.definition, r.started_at)).collect()
    }

    pub(crate) async fn usage(&self, _operator: Caller, req: UsageRequest) -> Result<UsageResponse, Error> {
        let agent = req
            .agent
            .as_deref()
            .map(|h| canopy_core::Handle::parse(h).map_err(|e| Error::name("agent", e)))
            .transpose()?;
        let since_ms = match req.since_secs {
            None => 0,
            Some(secs) => {
                self.store.clock().now_ms().saturating_sub(i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX))
            }
        };
        let (view, budgets) = self
            .store
            .read(move |conn| {
                let view = ops::usage(conn, agent.as_ref(), since_ms)?;
                let budgets = match &agent {
                    Some(agent) => ops::covering_budgets(conn, agent.as_str())?,
                    None => ops::budgets(conn)?,
                };
                Ok((view, budgets))
            })
            .await?;
        Ok(UsageResponse {
            total: view.total,
            agents: view.agents,
            sessions: view.sessions,
            turns: view.turns,
            budgets,
        })
    }

    /// `usage.series`: spend per UTC hour (24) or day (30) for the workspace, an agent, its
    /// subtree or an issue, and the budgets covering it.
    pub(crate) async fn usage_series(
        &self,
        _operator: Caller,
        req: UsageSeriesRequest,
    ) -> Result<UsageSeriesResponse, Error> {
        let agent = req
            .agent
            .as_deref()
            .map(|h| canopy_core::Handle::parse(h).map_err(|e| Error::name("agent", e)))
            .transpose()?;
        if req.subtree && agent.is_none() {
            return Err(Error::invalid("subtree", "a subtree needs an `agent` at its top"));
        }
        if req.issue.is_some() && agent.is_some() {
            return Err(Error::invalid("issue", "a series is an agent's or an issue's, not both"));
        }
        let (width, buckets) = match req.bucket {
            SeriesBucket::Hour => (3_600_000, 24),
            SeriesBucket::Day => (86_400_000, 30),
        };
        let (points, budgets) = self
            .store
            .read(move |conn| {
                let scope = match (&agent, req.issue) {
                    (Some(agent), _) if req.subtree => SeriesScope::Subtree(agent),
                    (Some(agent), _) => SeriesScope::Agent(agent),
                    (None, Some(number)) => SeriesScope::Issue(number),
                    (None, None) => SeriesScope::Workspace,
                };
                let points = ops::usage_series(conn, scope, width, buckets)?;
                let budgets = match (&agent, req.issue) {
                    (Some(agent), _) => ops::covering_budgets(conn, agent.as_str())?,
                    (None, Some(_)) => Vec::new(),
                    (None, None) => ops::budgets(conn)?,
                };
                Ok((points, budgets))
            })
            .await?;
        let points = points
            .into_iter()
            .map(|(start, usd, tokens, reports)| SeriesPoint { start, usd, tokens, reports })
            .collect();
        Ok(UsageSeriesResponse { bucket: req.bucket, points, budgets })
    }

    /// Deletes runtime records past their retention: activity, checkpoints and usage in
    /// bounded batches, then the directories of ended sessions nobody touched for long.
    pub async fn prune_records(&self) {
        let retention = &self.config.retention;
        let now = self.store.clock().now_ms();
        let activity_before = now.saturating_sub(retention.activity.as_millis() as i64);
        let usage_before = now.saturating_sub(retention.usage.as_millis() as i64);
        let mut total = Pruned::default();
        // Bounded: a backlog is worked off over later passes rather than in one long one.
        for _ in 0..20 {
            match self.store.write(move |conn| ops::prune(conn, activity_before, usage_before)).await {
                Ok(pruned) => {
                    total.activity += pruned.activity;
                    total.compactions += pruned.compactions;
                    total.usage += pruned.usage;
                    let full = PRUNE_BATCH as u64;
                    if pruned.activity < full && pruned.compactions < full && pruned.usage < full {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pruning old records failed; the next pass tries again");
                    return;
                }
            }
        }
        let live = match self.store.read(ops::live_sessions).await {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!(error = %e, "listing live sessions failed; transcripts are pruned next time");
                return;
            }
        };
        let sessions = canopy_config::DataDir::new(self.data_dir.clone()).sessions();
        let keep_for = retention.transcripts;
        let removed =
            tokio::task::spawn_blocking(move || prune_session_dirs(&sessions, &live, keep_for, SystemTime::now()))
                .await
                .unwrap_or(0);
        if total != Pruned::default() || removed > 0 {
            tracing::info!(
                activity = total.activity,
                checkpoints = total.compactions,
                usage = total.usage,
                session_dirs = removed,
                "pruned records past retention"
            );
        }
    }
}

/// Removes `<sessions>/<agent>/<incarnation>/` directories of sessions that are not live and
/// whose newest entry is older than `keep_for`. Returns how many were removed.
fn prune_session_dirs(sessions: &Path, live: &[(String, Incarnation)], keep_for: Duration, now: SystemTime) -> usize {
    let Some(cutoff) = now.checked_sub(keep_for) else { return 0 };
    let mut removed = 0;
    let Ok(agents) = std::fs::read_dir(sessions) else { return 0 };
    for agent in agents.flatten() {
        let agent_name = agent.file_name().to_string_lossy().into_owned();
        let Ok(incarnations) = std::fs::read_dir(agent.path()) else { continue };
        let idle = !live.iter().any(|(a, _)| *a == agent_name);
        for entry in incarnations.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if idle && canopy_core::harness::CONVERSATION_STATE.contains(&name.as_str()) {
                // A resumable conversation of an agent with no live session, untouched this
                // long: its next session starts fresh (with its continuity block).
                let stale = newest_mtime(&entry.path()).or_else(|| entry.metadata().and_then(|m| m.modified()).ok());
                if stale.is_some_and(|t| t < cutoff) {
                    let gone = match entry.path().is_dir() {
                        true => std::fs::remove_dir_all(entry.path()),
                        false => std::fs::remove_file(entry.path()),
                    };
                    match gone {
                        Ok(()) => removed += 1,
                        Err(e) => {
                            tracing::warn!(path = %entry.path().display(), error = %e, "removing a conversation failed")
                        }
                    }
                }
                continue;
            }
            let Some(incarnation) = name.parse::<Incarnation>().ok() else {
                continue; // `work/` and anything else that is not a session directory stays.
            };
            if live.iter().any(|(a, i)| *a == agent_name && *i == incarnation) {
                continue;
            }
            if newest_mtime(&entry.path()).is_some_and(|t| t < cutoff) {
                match std::fs::remove_dir_all(entry.path()) {
                    Ok(()) => removed += 1,
                    Err(e) => {
                        tracing::warn!(path = %entry.path().display(), error = %e, "removing a session directory failed")
                    }
                }
            }
        }
    }
    removed
}

/// The newest modification time of a directory and its direct entries.
fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let own = std::fs::metadata(dir).and_then(|m| m.modified()).ok()?;
    let entries = std::fs::read_dir(dir).ok()?;
    Some(entries.flatten().filter_map(|e| e.metadata().and_then(|m| m.modified()).ok()).fold(own, SystemTime::max))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on purpose")]

    use super::*;

    #[test]
    fn only_old_ended_session_directories_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        for path in ["a/1", "a/2", "a/work", "b/1"] {
            std::fs::create_dir_all(dir.path().join(path)).unwrap();
            std::fs::write(dir.path().join(path).join("transcript.jsonl"), "{}").unwrap();
        }
        let live = vec![("a".to_owned(), Incarnation(2))];
        // Nothing is old enough yet.
        let now = SystemTime::now();
        assert_eq!(prune_session_dirs(dir.path(), &live, Duration::from_secs(3600), now), 0);
        // An hour on, everything is old enough.
        let later = now + Duration::from_secs(7200);
        assert_eq!(prune_session_dirs(dir.path(), &live, Duration::from_secs(3600), later), 2);
        assert!(!dir.path().join("a/1").exists() && !dir.path().join("b/1").exists());
        assert!(dir.path().join("a/2").exists(), "a live session keeps its directory");
        assert!(dir.path().join("a/work").exists(), "the working directory is not a session");
    }

    #[test]
    fn conversations_go_only_when_their_agent_has_no_live_session() {
        let dir = tempfile::tempdir().unwrap();
        for agent in ["live", "idle"] {
            std::fs::create_dir_all(dir.path().join(agent).join("claude-config/projects")).unwrap();
            std::fs::write(dir.path().join(agent).join("claude-session"), "id").unwrap();
            std::fs::create_dir_all(dir.path().join(agent).join("work")).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("live/3")).unwrap();
        let live = vec![("live".to_owned(), Incarnation(3))];
        let later = SystemTime::now() + Duration::from_secs(7200);
        assert_eq!(prune_session_dirs(dir.path(), &live, Duration::from_secs(3600), later), 2);
        assert!(!dir.path().join("idle/claude-config").exists() && !dir.path().join("idle/claude-session").exists());
        assert!(dir.path().join("idle/work").exists(), "the working directory stays");
        assert!(dir.path().join("live/claude-config").exists() && dir.path().join("live/claude-session").exists());
    }
}

#[cfg(test)]
mod area_tests {
    use serde_json::json;

    use crate::testing::{Fixture, req};

    #[tokio::test]
    async fn an_agents_own_post_is_found_by_its_words_before_it_is_indexed() {
        let fx = Fixture::new().await;
        let m1 = fx.manager("m1").await;
        let post = req(json!({ "channel": "home-m1", "topic": "plan", "body": "the zebra parser is done",
            "create_topic": true }));
        fx.api.messages.messages_post(m1.clone(), post).await.unwrap_or_else(|e| panic!("{e}"));
        let search = || req(json!({ "query": "zebra" }));
        let found = fx.api.history.history_search(m1.clone(), search()).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(found.items.len(), 1, "its sender's history holds it, indexed or not");
        let operator = fx.api.history.history_search(fx.operator.clone(), search()).await;
        assert!(matches!(operator, Err(canopy_core::Error::InvalidArgument { field: "caller", .. })));
        let too_long = req(json!({ "query": "x".repeat(super::MAX_QUERY_BYTES + 1) }));
        assert!(fx.api.history.history_search(m1, too_long).await.is_err());
    }
}
