//! A real headless Chromium for the console tests, driven over W3C WebDriver by Debian's
//! `chromedriver` (installed by `scripts/install-chromium.sh`), and a plain HTTP/1.1 client
//! for requests a browser would not make (forged ones). Only what the tests use.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// One HTTP/1.1 exchange (`Connection: close`): status, headers (lower-case names), body.
pub fn http(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> (u16, Vec<(String, String)>, String) {
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (authority, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")));
    let mut stream = TcpStream::connect(authority).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).unwrap();
    // Read the head, then exactly Content-Length bytes (a server may keep the connection);
    // without a length, to the end.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    let (head_len, length) = loop {
        let n = stream.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break (raw.len(), None);
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            break (at + 4, length);
        }
    };
    match length {
        Some(length) => {
            while raw.len() < head_len + length {
                let n = stream.read(&mut buf).unwrap_or(0);
                if n == 0 {
                    break;
                }
                raw.extend_from_slice(&buf[..n]);
            }
        }
        None => {
            let _ = stream.read_to_end(&mut raw);
        }
    }
    answer(&raw)
}

/// An HTTP/1.1 answer read whole: status, headers (lower-case names), body (de-chunked).
pub fn answer(raw: &[u8]) -> (u16, Vec<(String, String)>, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    (status, headers, if chunked { dechunk(body) } else { body.to_owned() })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `chromedriver` and one Chromium session; both end on drop.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    _profile: tempfile::TempDir,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    /// Starts chromedriver and a headless Chromium (`width` CSS pixels wide; below 500, a
    /// phone's viewport, emulated), with the flags this machine's closed network needs.
    pub fn start(width: u32) -> Browser {
        let chromium = std::env::var("CANOPY_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let chromedriver = std::env::var("CANOPY_TEST_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        assert!(
            std::path::Path::new(&chromedriver).exists(),
            "{chromedriver} is missing: run scripts/install-chromium.sh (scripts/test.sh does)"
        );
        let port = free_port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        crate::assert_eventually!(TcpStream::connect(("127.0.0.1", port)).is_ok(), "chromedriver did not start");
        let profile = tempfile::tempdir().unwrap();
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            format!("--window-size={width},900"),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        // A window narrower than Chromium's smallest (500 px) is a phone: its width is emulated.
        let mut options = json!({ "binary": chromium, "args": args });
        if width < 500 {
            options["mobileEmulation"] =
                json!({ "deviceMetrics": { "width": width, "height": 844, "pixelRatio": 1.0 } });
        }
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": options,
        } } });
        let (status, _, body) = http(
            "POST",
            &format!("{base}/session"),
            &[("Content-Type", "application/json")],
            &capabilities.to_string(),
        );
        let answer: Value = serde_json::from_str(&body).unwrap_or_default();
        assert_eq!(status, 200, "no browser session: {body}");
        let session = answer["value"]["sessionId"].as_str().unwrap().to_owned();
        Browser { driver, base, session, _profile: profile }
    }

    fn command(&self, method: &str, path: &str, body: Value) -> Value {
        self.try_command(method, path, body).unwrap_or_else(|text| panic!("webdriver {method} {path}: {text}"))
    }

    fn try_command(&self, method: &str, path: &str, body: Value) -> Result<Value, String> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let body = if body.is_null() { String::new() } else { body.to_string() };
        let (status, _, text) = http(method, &url, &[("Content-Type", "application/json")], &body);
        let answer: Value = serde_json::from_str(&text).unwrap_or_default();
        match status {
            200 => Ok(answer["value"].clone()),
            _ => Err(text),
        }
    }

    /// Acts on the element `css` finds; a live refresh may replace it between the finding
    /// and the act (a stale element), so it is found again.
    fn on_element(&self, css: &str, act: &str, body: Value) {
        for _ in 0..20 {
            let id = self.element(css);
            match self.try_command("POST", &format!("/element/{id}/{act}"), body.clone()) {
                Ok(_) => return,
                // Found again at once: the refresh that replaced it is over.
                Err(text) if text.contains("stale element") => {}
                Err(text) => panic!("webdriver {act} on {css}: {text}"),
            }
        }
        panic!("{css} kept going stale");
    }

    pub fn go(&self, url: &str) {
        self.command("POST", "/url", json!({ "url": url }));
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub fn eval(&self, script: &str) -> Value {
        self.command("POST", "/execute/sync", json!({ "script": script, "args": [] }))
    }

    /// The page's visible text.
    pub fn text(&self) -> String {
        self.eval("return document.body.innerText;").as_str().unwrap_or_default().to_owned()
    }

    fn element(&self, css: &str) -> String {
        let found = self.command("POST", "/element", json!({ "using": "css selector", "value": css }));
        found[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {css}: {found}")).to_owned()
    }

    pub fn click(&self, css: &str) {
        self.on_element(css, "click", json!({}));
    }

    pub fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, "value", json!({ "text": text }));
    }

    /// Replaces what a field holds with `text`.
    pub fn fill(&self, css: &str, text: &str) {
        self.on_element(css, "clear", json!({}));
        self.type_into(css, text);
    }

    /// A cookie's value, HttpOnly ones included (the browser's own store).
    pub fn cookie(&self, name: &str) -> String {
        self.command("GET", &format!("/cookie/{name}"), Value::Null)["value"].as_str().unwrap().to_owned()
    }

    /// Waits until the page's text contains `needle`.
    pub fn wait_text(&self, needle: &str) {
        crate::assert_eventually!(
            self.text().contains(needle),
            "the page never showed {needle:?}; it shows:\n{}",
            self.text()
        );
    }

    /// Waits until `script` returns true.
    pub fn wait_true(&self, script: &str, what: &str) {
        crate::assert_eventually!(self.eval(script) == Value::Bool(true), "{what}; the page shows:\n{}", self.text());
    }

    /// A PNG of the viewport, written to `path`.
    pub fn screenshot(&self, path: &std::path::Path) {
        let data = self.command("GET", "/screenshot", Value::Null);
        std::fs::write(path, base64(data.as_str().unwrap())).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            http("DELETE", &format!("{}/session/{}", self.base, self.session), &[], "");
        });
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Standard base64 decoding (WebDriver's screenshots).
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in text.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}
