//! The issues area (`Issues`): the work ledger's methods (`issues.list`, `.show`, `.create`,
//! `.assign`, `.update`, `.comment`, and the operators' `.budget`, `.import`, `.export`), and
//! carrying out what a committed change did: its notices delivered in the issue's topic (a
//! comment's with its mentions steering), and its `evt.issue.<n>` events published.
//!
//! Parses requests at the edge; the rules are `canopy_core::issues`' and the store checks them
//! against the tree in the change's transaction. Uses the store, delivery, the wire and the
//! budgets area (an issue budget changes the holds). Does not start runs or land merges: the
//! runs and merges areas link issues in their own writes, then `announce` or `publish` them.

use canopy_core::acl::Caller;
use canopy_core::issues::{self as rules, Blocker, Issue, check_number};
use canopy_core::{Error, Handle};
use canopy_proto::Subjects;
use canopy_proto::api::*;
use canopy_store::{Imported, IssueChange, IssueQuery, IssuesChanged, NewIssue, Owners, Store, ops};
use std::sync::Arc;

use crate::budgets::Budgets;
use crate::delivery::Delivery;
use crate::edge::encode;
use crate::wire::Wire;

/// Default and largest page of `issues.list`.
const LIST_PAGE: (u32, u32) = (50, 200);
/// Default and largest page of `issues.export`.
const EXPORT_PAGE: (u32, u32) = (200, 1000);
/// Most issues in one `issues.import`.
const MAX_IMPORT: usize = 1000;

/// The issues area. Cheap to clone.
#[derive(Clone)]
pub struct Issues {
    store: Store,
    delivery: Delivery,
    wire: Arc<dyn Wire>,
    subjects: Subjects,
    budgets: Budgets,
}

fn handle(field: &'static str, text: &str) -> Result<Handle, Error> {
    Handle::parse(text.trim().trim_start_matches('@')).map_err(|e| Error::name(field, e))
}

/// Checks issue numbers from the wire (`field` names them).
pub(crate) fn numbers(field: &'static str, numbers: &[u64]) -> Result<(), Error> {
    numbers.iter().try_for_each(|n| check_number(field, *n).map(drop))
}

fn page(limit: Option<u32>, (default, max): (u32, u32)) -> Result<usize, Error> {
    match limit {
        None => Ok(default as usize),
        Some(n) if n >= 1 && n <= max => Ok(n as usize),
        Some(_) => Err(Error::invalid("limit", format!("between 1 and {max}"))),
    }
}

impl Issues {
    pub fn new(store: Store, delivery: Delivery, wire: Arc<dyn Wire>, subjects: Subjects, budgets: Budgets) -> Self {
        Issues { store, delivery, wire, subjects, budgets }
    }

    /// Carries out what `by`'s committed change did: delivers its notices (a comment's as
    /// `by`'s words) and publishes its events.
    pub async fn publish(&self, changed: IssuesChanged, by: &Caller) {
        for (issue, event) in changed.changes {
            let subject = self.subjects.issue_event(issue.number);
            if let Err(e) = self.wire.publish(&subject, encode(&IssueChanged { issue, event })).await {
                tracing::warn!(error = %e, %subject, "publishing an issue event failed");
            }
        }
        self.delivery.deliver_notices(changed.notices).await;
        self.delivery.deliver_words(changed.mentioning, by).await;
    }

    /// Publishes the newest event of each issue a run or merge request just linked.
    pub async fn announce(&self, numbers: Vec<u64>, by: &Caller) {
        match self.store.read(move |conn| ops::latest_changes(conn, &numbers)).await {
            Ok(changes) => self.publish(IssuesChanged { changes, ..IssuesChanged::default() }, by).await,
            Err(e) => tracing::warn!(error = %e, "reading linked issues for their events failed"),
        }
    }

    async fn commit<F>(&self, caller: Caller, work: F) -> Result<Issue, Error>
    where
        F: FnOnce(&canopy_store::Db<'_>, &Caller) -> Result<(Issue, IssuesChanged), Error> + Send + 'static,
    {
        let by = caller.clone();
        let (issue, changed) = self.store.write(move |conn| work(conn, &by)).await?;
        self.publish(changed, &caller).await;
        Ok(issue)
    }

    pub(crate) async fn issues_list(
        &self,
        caller: Caller,
        req: IssuesListRequest,
    ) -> Result<IssuesListResponse, Error> {
        let owners = match (req.owner.as_deref().map(str::trim), &req.subtree) {
            (Some(_), Some(_)) => return Err(Error::invalid("subtree", "give an owner or a subtree, not both")),
            (None, Some(h)) => Owners::SubtreeOf(handle("subtree", h)?),
            (None, None) if caller.is_operator() => Owners::Everyone,
            (None | Some("me"), None) => Owners::Of(caller.handle.clone()),
            (Some("reports"), None) => Owners::ReportsOf(caller.handle.clone()),
            (Some("subtree"), None) => Owners::SubtreeOf(caller.handle.clone()),
            (Some("nobody"), None) => Owners::Nobody,
            (Some(h), None) => Owners::Of(handle("owner", h)?),
        };
        let label = req.label.map(|l| rules::check_label("label", &l)).transpose()?;
        let after = req.after.map(|n| check_number("after", n)).transpose()?;
        let before = req.before.map(|n| check_number("before", n)).transpose()?;
        let query = IssueQuery {
            owners,
            state: req.state,
            include_closed: req.include_closed,
            label,
            after: after.unwrap_or(0),
            before,
            newest: req.newest,
            limit: page(req.limit, LIST_PAGE)?,
        };
        let (issues, next_after) = self.store.read(move |conn| ops::list_issues(conn, &query)).await?;
        Ok(IssuesListResponse { issues, next_after })
    }

    pub(crate) async fn issues_show(&self, _caller: Caller, req: IssuesShowRequest) -> Result<IssueDetail, Error> {
        let number = check_number("issue", req.issue)?;
        let view = self.store.read(move |conn| ops::issue_view(conn, number)).await?;
        Ok(IssueDetail {
            issue: view.issue,
            events: view.events,
            subissues: view.subissues,
            runs: view.runs.iter().map(|r| format!("run-{r}")).collect(),
            merges: view.merges.iter().map(|m| format!("merge-{m}")).collect(),
            spend: view.spend,
            topic: view.topic,
        })
    }

    pub(crate) async fn issues_create(&self, caller: Caller, req: IssuesCreateRequest) -> Result<Issue, Error> {
        let owner = match &req.owner {
            Some(h) => Some(handle("owner", h)?),
            None => None,
        };
        if let Some(parent) = req.parent {
            check_number("parent", parent)?;
        }
        numbers("depends_on", &req.depends_on)?;
        crate::edge::idempotency_key(req.idempotency_key.as_deref())?;
        let spec = NewIssue {
            title: req.title,
            body: req.body,
            owner,
            parent: req.parent,
            labels: req.labels,
            depends_on: req.depends_on,
            idempotency_key: req.idempotency_key,
        };
        self.commit(caller, move |conn, caller| ops::file_issue(conn, caller, &spec)).await
    }

    pub(crate) async fn issues_assign(&self, caller: Caller, req: IssuesAssignRequest) -> Result<Issue, Error> {
        let issue = check_number("issue", req.issue)?;
        let to = handle("owner", &req.owner)?;
        self.commit(caller, move |conn, caller| ops::assign_issue(conn, caller, issue, &to, req.note.as_deref())).await
    }

    pub(crate) async fn issues_update(&self, caller: Caller, req: IssuesUpdateRequest) -> Result<Issue, Error> {
        let issue = check_number("issue", req.issue)?;
        numbers("blocked_by", &req.blocked_by)?;
        numbers("depends_on", req.depends_on.as_deref().unwrap_or_default())?;
        let blocker = match (req.blocked_by.is_empty(), req.question) {
            (false, Some(_)) => {
                return Err(Error::invalid("question", "a block waits for issues or for the operator, not both"));
            }
            (false, None) => Some(Blocker::Issues(req.blocked_by)),
            (true, Some(question)) => Some(Blocker::Operator { question }),
            (true, None) => None,
        };
        let change = IssueChange {
            state: req.state,
            note: req.note,
            blocker,
            resolution: req.resolution,
            labels: req.labels,
            depends_on: req.depends_on,
            body: req.body,
            title: req.title,
        };
        self.commit(caller, move |conn, caller| ops::update_issue(conn, caller, issue, &change)).await
    }

    pub(crate) async fn issues_comment(&self, caller: Caller, req: IssuesCommentRequest) -> Result<Issue, Error> {
        let issue = check_number("issue", req.issue)?;
        self.commit(caller, move |conn, caller| ops::comment_issue(conn, caller, issue, &req.text)).await
    }

    pub(crate) async fn issues_budget(&self, caller: Caller, req: IssuesBudgetRequest) -> Result<Issue, Error> {
        let number = check_number("issue", req.issue)?;
        let issue =
            self.commit(caller, move |conn, caller| ops::set_issue_budget(conn, caller, number, req.usd)).await?;
        self.budgets.refresh_budgets().await;
        Ok(issue)
    }

    pub(crate) async fn issues_import(
        &self,
        caller: Caller,
        req: IssuesImportRequest,
    ) -> Result<IssuesImportResponse, Error> {
        let source = req.source.trim().to_owned();
        let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/');
        if source.is_empty() || source.len() > 200 || !source.chars().all(fine) {
            return Err(Error::invalid("source", "1-200 letters, digits, - _ . : / (e.g. github:owner/repo)"));
        }
        if req.issues.len() > MAX_IMPORT {
            return Err(Error::invalid("issues", format!("at most {MAX_IMPORT} per call")));
        }
        let mut batch = Vec::with_capacity(req.issues.len());
        for (index, imported) in req.issues.into_iter().enumerate() {
            let Some(closed) = imported.closed() else {
                let state = &imported.state;
                return Err(Error::invalid("issues", format!("item {index}: state {state:?} is not OPEN or CLOSED")));
            };
            check_number("issues", imported.number)?;
            batch.push(Imported {
                source: format!("{source}#{}", imported.number),
                title: rules::imported_title(&imported.title),
                body: rules::imported_body(&imported.body),
                labels: rules::imported_labels(imported.labels.iter().map(|l| l.name.as_str())),
                closed,
            });
        }
        let by = caller.clone();
        let (created, skipped, changed) = self.store.write(move |conn| ops::import_issues(conn, &by, &batch)).await?;
        self.publish(changed, &caller).await;
        Ok(IssuesImportResponse { created, skipped })
    }

    pub(crate) async fn issues_export(
        &self,
        _operator: Caller,
        req: IssuesExportRequest,
    ) -> Result<IssuesExportResponse, Error> {
        let limit = page(req.limit, EXPORT_PAGE)?;
        let after = req.after.map(|n| check_number("after", n)).transpose()?.unwrap_or(0);
        let (issues, next_after) = self.store.read(move |conn| ops::export_issues(conn, after, limit)).await?;
        Ok(IssuesExportResponse { issues, next_after })
    }
}
