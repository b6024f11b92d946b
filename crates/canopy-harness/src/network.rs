//! A confined session's network under `[sandbox] network = "proxy"`: the session runs in a
//! network namespace of its own (nothing but loopback: no UDP out, no DNS, no raw sockets), and
//! what it may reach is served by this process on listeners made inside that namespace.
//!
//! - Its MCP endpoint and each model endpoint are relayed: a listener on the endpoint's own
//!   loopback address and port (a named endpoint gets a loopback address of its own, written
//!   into the session's `/etc/hosts`) that connects to exactly that endpoint. Codex's model
//!   client ignores the proxy variables, and pi's ignores them for plain-HTTP endpoints
//!   (`docs/harnesses/proxy.md`), so every harness reaches its model this way.
//! - Everything else goes through the egress proxy (`egress`), named by `HTTPS_PROXY` and
//!   `HTTP_PROXY`, which allows only the session's allow-list: its model endpoints and
//!   `[sandbox] allow_hosts`. Each refusal becomes a `HarnessEvent::EgressRefused`.
//!
//! Owns the plan (which listeners, which variables, which hosts lines) and the tasks that serve
//! it. Does not make the namespace (bubblewrap does) nor the sockets inside it
//! (`canopy_sys::namespace`), and decides nothing about what a session may read.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use crate::HarnessKind;
use crate::egress::{self, AllowList, Allowed, Counters};
use crate::event::HarnessEvent;
use crate::launch::LaunchSpec;
use crate::sandbox::{self, Unconfinable};

/// Where a listener inside the namespace leads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lead {
    /// Bytes both ways to exactly this host and port (resolved here, by the runner).
    Relay(Allowed),
    /// The egress proxy with the session's allow-list.
    Proxy,
}

/// What a session's namespace gets: its listeners, the variables that point the harness at
/// the proxy, its `/etc/hosts`, and the proxy's allow-list.
#[derive(Debug, Clone)]
pub struct Plan {
    listeners: Vec<(SocketAddr, Lead)>,
    pub env: Vec<(String, String)>,
    pub hosts: String,
    allow: Arc<AllowList>,
}

impl Plan {
    /// The ports of its listeners (the only ones a connect inside can reach).
    pub fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.listeners.iter().map(|(addr, _)| addr.port())
    }
}

/// Model hosts a harness reaches when its settings name no base URL.
fn default_model_hosts(kind: HarnessKind) -> &'static [&'static str] {
    match kind {
        HarnessKind::Claude => &["api.anthropic.com"],
        HarnessKind::Codex => &["api.openai.com", "chatgpt.com"],
        HarnessKind::Omp | HarnessKind::Pi => &["api.anthropic.com", "api.openai.com"],
        HarnessKind::Scripted => &[],
    }
}

/// The ports tried for the proxy's listener, the first one no endpoint uses.
const PROXY_PORTS: [u16; 4] = [3128, 3129, 8118, 18128];

/// The plan for `spec`'s session: `allow_hosts` are `[sandbox] allow_hosts` (checked at
/// config load; an entry that does not parse is refused here too).
pub fn plan(spec: &LaunchSpec) -> Result<Plan, Unconfinable> {
    let mut listeners: Vec<(SocketAddr, Lead)> = Vec::new();
    let mut allowed: Vec<String> = spec.sandbox.allow_hosts.clone();
    let mut hosts = String::from("127.0.0.1 localhost canopy-session\n::1 localhost\n");
    let mut named: Vec<String> = Vec::new();
    let (mcp_host, mcp_port) = sandbox::url_host_port(&spec.mcp_url)
        .ok_or_else(|| Unconfinable(format!("the MCP endpoint {:?} names no host and port", spec.mcp_url)))?;
    let mcp_ip = loopback_ip(&mcp_host)
        .ok_or_else(|| Unconfinable(format!("the MCP endpoint {:?} is not on loopback", spec.mcp_url)))?;
    listeners.push((SocketAddr::new(mcp_ip, mcp_port), Lead::Relay(Allowed { host: mcp_host, port: Some(mcp_port) })));
    let mut endpoints = model_endpoints(spec);
    if endpoints.is_empty() {
        endpoints = default_model_hosts(spec.kind).iter().map(|h| (h.to_string(), 443)).collect();
    }
    for (host, port) in endpoints {
        allowed.push(match host.contains(':') {
            true => format!("[{host}]:{port}"),
            false => format!("{host}:{port}"),
        });
        let lead = Lead::Relay(Allowed { host: host.clone(), port: Some(port) });
        let inside = match (loopback_ip(&host), host.parse::<IpAddr>()) {
            (Some(ip), _) => SocketAddr::new(ip, port),
            // An address elsewhere cannot be bound inside: only the proxy reaches it.
            (None, Ok(_)) => continue,
            (None, Err(_)) => {
                let index = match named.iter().position(|n| *n == host) {
                    Some(i) => i,
                    None => {
                        named.push(host.clone());
                        hosts.push_str(&format!("127.0.1.{} {host}\n", named.len()));
                        named.len() - 1
                    }
                };
                SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 1, index as u8 + 1)), port)
            }
        };
        if !listeners.iter().any(|(addr, _)| *addr == inside) {
            listeners.push((inside, lead));
        }
    }
    let proxy_port = PROXY_PORTS
        .into_iter()
        .find(|p| !listeners.iter().any(|(addr, _)| addr.port() == *p))
        .unwrap_or(PROXY_PORTS[3]);
    let proxy = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), proxy_port);
    listeners.push((proxy, Lead::Proxy));
    if listeners.len() > canopy_sys::namespace::MAX_LISTENERS || named.len() > 250 {
        return Err(Unconfinable("a session's namespace takes at most 32 endpoints".into()));
    }
    let allow = AllowList::parse(&allowed).map_err(|e| Unconfinable(format!("sandbox.allow_hosts: {e}")))?;
    let url = format!("http://{proxy}");
    let no_proxy = ["localhost", "127.0.0.1", "::1"].into_iter().map(str::to_owned).chain(named).collect::<Vec<_>>();
    let no_proxy = no_proxy.join(",");
    let env = [
        ("HTTPS_PROXY", &url),
        ("https_proxy", &url),
        ("HTTP_PROXY", &url),
        ("http_proxy", &url),
        ("NO_PROXY", &no_proxy),
        ("no_proxy", &no_proxy),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.clone()))
    .collect();
    Ok(Plan { listeners, env, hosts, allow: Arc::new(allow) })
}

/// The model endpoints `spec`'s harness is configured for: every `*_BASE_URL` in its
/// environment and its provider's base URL, as (host, port); none for the scripted harness.
fn model_endpoints(spec: &LaunchSpec) -> Vec<(String, u16)> {
    if spec.kind == HarnessKind::Scripted {
        return Vec::new();
    }
    let provider = spec.provider.as_ref().map(|p| p.base_url.as_str());
    let urls = spec.env.iter().filter(|(k, _)| k.ends_with("BASE_URL")).map(|(_, v)| v.as_str()).chain(provider);
    let mut endpoints: Vec<(String, u16)> = urls.filter_map(sandbox::url_host_port).collect();
    endpoints.sort();
    endpoints.dedup();
    endpoints
}

/// The loopback address `host` names (`localhost` is 127.0.0.1), if it names one.
fn loopback_ip(host: &str) -> Option<IpAddr> {
    if host.eq_ignore_ascii_case("localhost") {
        return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    host.parse::<IpAddr>().ok().filter(IpAddr::is_loopback)
}

/// The tasks serving a session's namespace; dropping it stops them.
pub(crate) struct Serving {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Makes `plan`'s listeners inside the namespace of the sandbox process `pid` and serves them;
/// each refusal reaches `events`. The session's connections together are bounded by
/// `egress::MAX_CONNECTIONS`.
pub(crate) async fn serve(pid: u32, plan: &Plan, events: mpsc::Sender<HarnessEvent>) -> Result<Serving, Unconfinable> {
    let addrs: Vec<SocketAddr> = plan.listeners.iter().map(|(addr, _)| *addr).collect();
    let made = tokio::task::spawn_blocking(move || canopy_sys::namespace::listen_in_namespace(pid, &addrs))
        .await
        .map_err(|e| Unconfinable(format!("making the session's listeners: {e}")))?
        .map_err(|e| Unconfinable(format!("making the session's listeners: {e}")))?;
    let counters = Arc::new(Counters::default());
    let slots = Arc::new(Semaphore::new(egress::MAX_CONNECTIONS));
    let (refusals_tx, mut refusals) = mpsc::channel::<egress::Refusal>(64);
    // Built as it goes, so a failure part way stops what already runs.
    let mut serving = Serving { tasks: Vec::with_capacity(made.len() + 1) };
    for (listener, (_, lead)) in made.into_iter().zip(&plan.listeners) {
        let listener = listener
            .set_nonblocking(true)
            .and_then(|()| TcpListener::from_std(listener))
            .map_err(|e| Unconfinable(format!("serving the session's listeners: {e}")))?;
        serving.tasks.push(match lead {
            Lead::Proxy => tokio::spawn(egress::serve(
                listener,
                plan.allow.clone(),
                counters.clone(),
                refusals_tx.clone(),
                slots.clone(),
            )),
            Lead::Relay(target) => tokio::spawn(relay(listener, target.clone(), slots.clone())),
        });
    }
    serving.tasks.push(tokio::spawn(async move {
        while let Some(refusal) = refusals.recv().await {
            let event = HarnessEvent::EgressRefused { host: refusal.host, port: refusal.port, reason: refusal.reason };
            if events.send(event).await.is_err() {
                return;
            }
        }
    }));
    Ok(serving)
}

/// Accepts on `listener` and joins each connection to `target` (a name is resolved here, and
/// may not lead to a local address unless it names one), holding one of `slots` each. Public
/// for the benchmark that measures a tool call through it.
pub async fn relay(listener: TcpListener, target: Allowed, slots: Arc<Semaphore>) {
    egress::accept_each(listener, slots, move |mut inside| {
        let target = target.clone();
        async move {
            let port = target.port.unwrap_or_default();
            match egress::connect(&target, &target.host, port).await {
                Ok(mut outside) => {
                    let _ = inside.set_nodelay(true);
                    let _ = outside.set_nodelay(true);
                    // Either side closing ends the relay; nothing to report.
                    let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
                }
                Err(why) => tracing::debug!(host = %target.host, port, %why, "relaying a session's connection failed"),
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]
    use super::*;

    fn spec(kind: HarnessKind, env: &[(&str, &str)], allow: &[&str]) -> LaunchSpec {
        let mut spec = crate::launch::test_spec(kind, std::path::Path::new("/nonexistent"));
        spec.mcp_url = "http://127.0.0.1:4100/mcp".into();
        spec.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        spec.sandbox.allow_hosts = allow.iter().map(|h| h.to_string()).collect();
        spec
    }

    #[test]
    fn endpoints_are_relayed_on_their_own_addresses_and_the_rest_goes_to_the_proxy() {
        let env = [("ANTHROPIC_BASE_URL", "http://127.0.0.1:9001"), ("X_BASE_URL", "https://models.example.com")];
        let plan = plan(&spec(HarnessKind::Claude, &env, &["registry.npmjs.org"])).unwrap();
        let addrs: Vec<String> = plan.listeners.iter().map(|(a, _)| a.to_string()).collect();
        assert_eq!(addrs, ["127.0.0.1:4100", "127.0.0.1:9001", "127.0.1.1:443", "127.0.0.1:3128"]);
        assert!(plan.hosts.contains("127.0.1.1 models.example.com\n"), "{}", plan.hosts);
        assert!(plan.allow.allows("registry.npmjs.org", 443) && plan.allow.allows("models.example.com", 443));
        assert!(plan.allow.allows("127.0.0.1", 9001) && !plan.allow.allows("127.0.0.1", 4100));
        let no_proxy = plan.env.iter().find(|(k, _)| k == "NO_PROXY").unwrap();
        assert_eq!(no_proxy.1, "localhost,127.0.0.1,::1,models.example.com");
        let proxy = plan.env.iter().find(|(k, _)| k == "HTTPS_PROXY").unwrap();
        assert_eq!(proxy.1, "http://127.0.0.1:3128");
    }

    #[test]
    fn a_harness_without_a_base_url_reaches_its_default_model_hosts_and_bad_entries_are_refused() {
        let plan = plan(&spec(HarnessKind::Codex, &[], &[])).unwrap();
        assert!(plan.allow.allows("api.openai.com", 443) && plan.allow.allows("chatgpt.com", 443));
        assert!(!plan.allow.allows("github.com", 443));
        let scripted = super::plan(&spec(HarnessKind::Scripted, &[("A_BASE_URL", "http://127.0.0.1:9")], &[])).unwrap();
        assert_eq!(scripted.listeners.len(), 2, "the MCP endpoint and the proxy only");
        let refused = super::plan(&spec(HarnessKind::Claude, &[], &["a b"])).unwrap_err();
        assert!(refused.0.contains("allow_hosts"), "{refused}");
        let mut remote = spec(HarnessKind::Claude, &[], &[]);
        remote.mcp_url = "http://10.1.2.3:4100/mcp".into();
        assert!(super::plan(&remote).unwrap_err().0.contains("not on loopback"));
    }
}
