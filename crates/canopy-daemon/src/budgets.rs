//! The budgets area (`Budgets`): `agents.budget`, keeping the holds snapshot (`BudgetGate`)
//! current, renewal on the daemon's timer, role defaults from `[budgets.roles]`, and delivery
//! of what a hold kept once it lifts.
//!
//! The store is the truth (spend is charged in the writer as usage is recorded) and the
//! snapshot is re-read after every charge that crossed a limit, every budget change, every
//! tree change and every renewal. Uses the store, delivery and the gate. Does not charge or
//! sum spend (`canopy_store::budgets`) or word anything (`canopy_core::budget::say`).

use std::collections::BTreeMap;
use std::sync::Arc;

use canopy_core::Error;
use canopy_core::acl::Caller;
use canopy_core::budget::{Amount, Scope};
use canopy_proto::api::{AgentsBudgetRequest, AgentsBudgetResponse};
use canopy_store::{RoleBudget, Store, ops};

use crate::delivery::Delivery;
use crate::holds::BudgetGate;

/// The budgets area. Cheap to clone.
#[derive(Clone)]
pub struct Budgets {
    store: Store,
    delivery: Delivery,
    gate: Arc<BudgetGate>,
    /// `[budgets.roles]`, as the store applies it.
    role_budgets: Arc<Vec<RoleBudget>>,
}

/// `[budgets.roles]` as the store takes it.
pub fn role_budgets(config: &canopy_config::Config) -> Vec<RoleBudget> {
    config
        .budgets
        .roles
        .iter()
        .map(|(role, b)| RoleBudget {
            role: role.clone(),
            scope: if b.subtree { Scope::Subtree } else { Scope::Agent },
            amount: Amount { usd: b.usd, tokens: b.tokens },
            period_ms: b.period.map(|p| p.as_millis() as i64),
        })
        .collect()
}

/// Parses a budget period: a humantime duration or `lifetime`.
fn period(text: Option<&str>) -> Result<Option<i64>, Error> {
    match text.map(str::trim) {
        None | Some("lifetime") => Ok(None),
        Some(text) => {
            let d = humantime::parse_duration(text).map_err(|e| {
                Error::invalid("period", format!("{text:?} is not a period like \"1day\" or \"lifetime\": {e}"))
            })?;
            let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
            canopy_core::budget::check_period(ms)?;
            Ok(Some(ms))
        }
    }
}

impl Budgets {
    pub fn new(store: Store, delivery: Delivery, gate: Arc<BudgetGate>, config: &canopy_config::Config) -> Self {
        Budgets { store, delivery, gate, role_budgets: Arc::new(role_budgets(config)) }
    }

    /// The holds snapshot every delivery and start consults.
    pub fn gate(&self) -> &BudgetGate {
        &self.gate
    }

    pub(crate) async fn agents_budget(
        &self,
        caller: Caller,
        req: AgentsBudgetRequest,
    ) -> Result<AgentsBudgetResponse, Error> {
        let handle = canopy_core::Handle::parse(&req.handle).map_err(|e| Error::name("handle", e))?;
        let amount = Amount { usd: req.usd, tokens: req.tokens };
        if req.clear && !amount.is_empty() {
            return Err(Error::invalid("clear", "clears a budget: give no amount with it"));
        }
        let scope = if req.subtree { Scope::Subtree } else { Scope::Agent };
        let period = period(req.period.as_deref())?;
        let change = req.clear || !amount.is_empty();
        let name = handle.to_string();
        let budget = match change {
            true => {
                self.store.write(move |conn| ops::set_budget(conn, &caller, &handle, scope, amount, period)).await?
            }
            false => {
                self.store.read(move |conn| ops::account(conn, "handle", handle.as_str())).await?;
                None
            }
        };
        let released = match change {
            true => self.refresh_budgets().await,
            false => Vec::new(),
        };
        let covering = self.store.read(move |conn| ops::covering_budgets(conn, &name)).await?;
        Ok(AgentsBudgetResponse { budget, covering, released })
    }

    /// Reads the holds again; what a lifted hold kept is delivered (its runner rung, and
    /// runners told to sync for sessions that were kept from starting).
    pub async fn refresh_budgets(&self) -> Vec<String> {
        let holds = match self.store.read(ops::holds).await {
            Ok(holds) => holds,
            Err(e) => {
                tracing::warn!(error = %e, "reading budget holds failed; the previous ones stay");
                return Vec::new();
            }
        };
        let released = self.gate.replace(holds);
        if !released.is_empty() {
            tracing::info!(agents = released.len(), "budget holds lifted");
            self.ring_agents(&released).await;
            self.delivery.poke_runners().await;
        }
        released
    }

    /// Renews budgets whose period passed, and reads the holds again (the timer's backstop
    /// for every change too).
    pub async fn check_budgets(&self) {
        match self.store.write(ops::renew_budgets).await {
            Ok(renewed) if renewed > 0 => tracing::info!(renewed, "budget periods renewed"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "renewing budgets failed"),
        }
        self.refresh_budgets().await;
    }

    /// After the tree changed (an agent, a child or a run is new, or moved): gives agents and
    /// runs of roles with a `[budgets.roles]` default the ones they lack, and reads the holds
    /// again, before any runner is told to start a session.
    pub async fn tree_changed(&self) {
        if !self.role_budgets.is_empty() {
            let defaults = self.role_budgets.clone();
            if let Err(e) = self.store.write(move |conn| ops::sync_role_budgets(conn, &defaults)).await {
                tracing::warn!(error = %e, "applying role budgets failed");
            }
        }
        self.refresh_budgets().await;
    }

    /// Rings the runners of these agents' live sessions.
    async fn ring_agents(&self, handles: &[String]) {
        let names = handles.to_vec();
        let entries = self
            .store
            .read(move |conn| Ok(names.iter().filter_map(|h| ops::roster_entry(conn, h).ok()).collect::<Vec<_>>()))
            .await;
        let entries = match entries {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(error = %e, "reading the runners of released agents failed; they resync on their timer");
                return;
            }
        };
        let mut by_runner: BTreeMap<canopy_core::RunnerId, Vec<String>> = BTreeMap::new();
        for entry in entries {
            if let Some(runner) = entry.runner {
                by_runner.entry(runner).or_default().push(entry.handle.to_string());
            }
        }
        self.delivery.ring(by_runner).await;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::testing::{Fixture, req};

    #[tokio::test]
    async fn a_budget_is_set_shown_and_cleared_and_a_bad_period_changes_nothing() {
        let fx = Fixture::new().await;
        fx.manager("m1").await;
        let bad = req(json!({ "handle": "m1", "usd": 5.0, "period": "fortnightly-ish" }));
        let refused = fx.api.budgets.agents_budget(fx.operator.clone(), bad).await;
        assert!(matches!(refused, Err(canopy_core::Error::InvalidArgument { field: "period", .. })), "{refused:?}");
        let shown = fx.api.budgets.agents_budget(fx.operator.clone(), req(json!({ "handle": "m1" }))).await;
        assert!(shown.unwrap_or_else(|e| panic!("{e}")).covering.is_empty());
        let set = req(json!({ "handle": "m1", "usd": 5.0, "period": "1day" }));
        let set = fx.api.budgets.agents_budget(fx.operator.clone(), set).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(set.budget.is_some() && set.covering.len() == 1, "{set:?}");
        assert!(fx.api.budgets.gate().require("m1", "turn").is_ok(), "nothing is spent yet");
        let clear = req(json!({ "handle": "m1", "clear": true }));
        let cleared = fx.api.budgets.agents_budget(fx.operator.clone(), clear).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(cleared.covering.is_empty());
    }
}
