//! The console beyond loopback: `canopy web --init-tls` makes a certificate, the daemon serves
//! the console over HTTPS on every address (`0.0.0.0`), and a client that checks the
//! certificate logs in through loopback (nothing here connects anywhere else); plain HTTP on
//! that port is refused; a Host the certificate does not name is refused; a revoked operator's
//! open session is refused at its next request; failed logins are limited and audited.
//!
//! Owns these scenarios; the browser-driven console is `console`'s.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;

use crate::env::TestEnv;

/// An answer: status, headers (lowercase names) and body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// A client that trusts `roots` and checks the certificate names `name`, as a browser does.
struct Client {
    config: Arc<rustls::ClientConfig>,
    port: u16,
}

impl Client {
    fn trusting(roots: &[CertificateDer<'static>], port: u16) -> Client {
        let mut store = rustls::RootCertStore::empty();
        for root in roots {
            store.add(root.clone()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(store)
            .with_no_client_auth();
        Client { config: Arc::new(config), port }
    }

    /// `METHOD path` to 127.0.0.1 with SNI and `Host` `name`; the connection only ever goes to
    /// loopback, whatever the name.
    fn send(&self, name: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> Result<Answer, String> {
        let server = ServerName::try_from(name.to_owned()).unwrap();
        let mut tls = rustls::ClientConnection::new(self.config.clone(), server).unwrap();
        let mut tcp = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let mut stream = rustls::Stream::new(&mut tls, &mut tcp);
        let mut request = format!("{method} {path} HTTP/1.1\r\nhost: {name}:{}\r\nconnection: close\r\n", self.port);
        for (k, v) in headers {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        request.push_str("content-length: 0\r\n\r\n");
        stream.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        // A peer closing without close_notify after the answer is not our concern here.
        if let Err(e) = stream.read_to_end(&mut raw)
            && raw.is_empty()
        {
            return Err(e.to_string());
        }
        Ok(parse(&raw))
    }
}

fn parse(raw: &[u8]) -> Answer {
    let (status, headers, body) = crate::webdriver::answer(raw);
    Answer { status, headers, body }
}

/// The session cookie a login answer sets, as a `Cookie` header value.
fn session_cookie(answer: &Answer) -> String {
    let set = answer.header("set-cookie").unwrap_or_else(|| panic!("no cookie: {}", answer.body));
    assert!(set.contains("Secure") && set.contains("HttpOnly"), "{set}");
    set.split(';').next().unwrap().to_owned()
}

/// The path of a login link.
fn path_of(link: &str) -> String {
    let rest = link.split_once("://").unwrap().1;
    rest[rest.find('/').unwrap()..].to_owned()
}

#[test]
fn the_console_serves_https_beyond_loopback_and_guards_its_logins() {
    let mut env = TestEnv::new();
    env.ok(&["init", "--operator", "ops"]);
    let made = env.json(&["web", "--init-tls", "--name", "canopy.test"]);
    let names: Vec<&str> = made["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(names.contains(&"canopy.test") && names.contains(&"127.0.0.1"), "{made}");
    let cert = CertificateDer::from_pem_file(made["cert"].as_str().unwrap()).unwrap();
    assert_eq!(made["sha256"].as_str().unwrap().len(), 32 * 3 - 1, "{made}");
    let again = env.run(&["web", "--init-tls"]);
    assert_eq!(again.status.code(), Some(1), "a second pair is not made over the first without --force");

    // Every address, over TLS: allowed only because the certificate is set.
    env.edit_config(&[("\nlisten = \"127.0.0.1:0\"", "\nlisten = \"0.0.0.0:0\"")]);
    let url = env.nats_url();
    let mut daemon =
        env.command(&["--json", "daemon", "--nats-url", &url]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let status = crate::env::wait_timeout(&mut daemon, std::time::Duration::from_secs(30));
    if status.is_none() {
        let _ = daemon.kill();
    }
    let out = daemon.wait_with_output().unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(64), "a console beyond loopback without TLS is refused");
    assert!(crate::env::text(&out.stdout).contains("web.listen"), "{}", crate::env::text(&out.stdout));
    env.edit_config(&[
        ("tls_cert = \"\"", "tls_cert = \"web/tls/cert.pem\""),
        ("tls_key = \"\"", "tls_key = \"web/tls/key.pem\""),
    ]);
    env.start_daemon();
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(env.data_dir().join("daemon.json")).unwrap()).unwrap();
    let url = info["web_url"].as_str().unwrap();
    assert!(url.starts_with("https://127.0.0.1:"), "clients here reach it through loopback: {url}");
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let listening = std::fs::read_to_string(format!("/proc/{}/net/tcp", std::process::id())).unwrap_or_default();
    let on_every_address = format!("00000000:{port:04X} 00000000:0000 0A");
    assert!(listening.contains(&on_every_address), "the console does not listen on 0.0.0.0:{port}");

    // `canopy web` gets a link over HTTPS (trusting exactly this certificate).
    let link = env.json(&["web", "--no-open"])["link"].as_str().unwrap().to_owned();
    assert!(link.starts_with("https://"), "{link}");
    let client = Client::trusting(std::slice::from_ref(&cert), port);
    let login = client.send("localhost", "GET", &path_of(&link), &[]).unwrap();
    assert_eq!(login.status, 200, "{}", login.body);
    let cookie = session_cookie(&login);
    let waiting = client.send("localhost", "GET", "/", &[("cookie", &cookie)]).unwrap();
    assert_eq!(waiting.status, 200);
    assert!(waiting.body.contains("Spawn requests"), "{}", waiting.body);
    // By the name the certificate carries, too; by another name, no.
    let named = client.send("canopy.test", "GET", "/", &[("cookie", &cookie)]).unwrap();
    assert_eq!(named.status, 200, "{}", named.body);
    let stranger = Client::trusting(std::slice::from_ref(&cert), port);
    assert!(stranger.send("other.test", "GET", "/", &[]).is_err(), "a name the certificate lacks fails the check");

    // A client that does not trust the certificate is refused by its own check.
    let untrusting = Client::trusting(&[], port);
    assert!(untrusting.send("localhost", "GET", "/", &[]).is_err());

    // Plain HTTP on that port: refused, with a word on what to use.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.write_all(format!("GET / HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\r\n").as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = plain.read_to_end(&mut raw);
    let answer = parse(&raw);
    assert_eq!(answer.status, 400);
    assert!(answer.body.contains("HTTPS only"), "{}", answer.body);

    // A second operator logs in; revoked, its open session is refused at its next request.
    let added = env.json(&["operators", "add", "guest"]);
    let token = added["token"].as_str().unwrap_or_else(|| panic!("{added}")).to_owned();
    let bearer = format!("Bearer {token}");
    let linked = client.send("localhost", "POST", "/link", &[("authorization", &bearer)]).unwrap();
    assert_eq!(linked.status, 200, "{}", linked.body);
    let path = serde_json::from_str::<Value>(&linked.body).unwrap()["path"].as_str().unwrap().to_owned();
    let guest = session_cookie(&client.send("localhost", "GET", &path, &[]).unwrap());
    assert_eq!(client.send("localhost", "GET", "/tree", &[("cookie", &guest)]).unwrap().status, 200);
    env.ok(&["operators", "revoke", "guest"]);
    let next = client.send("localhost", "GET", "/tree", &[("cookie", &guest)]).unwrap();
    assert_ne!(next.status, 200, "a revoked operator's session still reads: {}", next.body);
    let after = client.send("localhost", "GET", "/", &[("cookie", &guest)]).unwrap();
    assert_eq!(after.status, 401, "its session ended: {}", after.body);
    assert_eq!(client.send("localhost", "GET", "/", &[("cookie", &cookie)]).unwrap().status, 200, "ops stays in");

    // For a phone: the link as a QR code too, under it.
    let printed = env.ok(&["web", "--no-open", "--qr"]);
    let mut lines = printed.lines();
    assert!(lines.next().unwrap_or_default().starts_with("https://"), "{printed}");
    let code: Vec<&str> = lines.filter(|l| l.contains('█') || l.contains('▀') || l.contains('▄')).collect();
    assert!(code.len() >= 10, "no QR code under the link:\n{printed}");

    // Ten failed logins from one address: five are failures, then the address is held.
    let statuses: Vec<u16> =
        (0..10).map(|i| client.send("localhost", "GET", &format!("/login/{i:048x}"), &[]).unwrap().status).collect();
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429, 429, 429, 429, 429]);
    let held = env.run(&["web", "--no-open"]);
    assert_eq!(held.status.code(), Some(1), "even a good token waits out the window");
    assert!(crate::env::text(&held.stderr).contains("too many failed logins"), "{}", crate::env::text(&held.stderr));
    crate::assert_eventually!(
        {
            let audit = env.json(&["audit"]);
            let actions: Vec<String> = audit["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["action"].as_str().unwrap_or("").to_owned())
                .collect();
            actions.iter().filter(|a| *a == "console.login_failed").count() == 5
                && actions.iter().filter(|a| *a == "console.login_limited").count() == 1
        },
        "the failed logins were not audited: {}",
        env.json(&["audit"])
    );
}
