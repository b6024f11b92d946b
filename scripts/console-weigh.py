#!/usr/bin/env python3
"""Weighs the operator console and times a post until it is visible, for one or two `canopy`
binaries on the same machine, run after run, so a change is read as a ratio to its baseline:

    scripts/console-weigh.py NEW [BASELINE] [--runs 20]

For each binary: a fresh workspace (nats-server from scripts/install-nats.sh), a scripted
Manager with a pending spawn request, ten posts; then the bytes of each page's HTML (the
script and the style sheet once), and the post-to-visible latency: from sending the console's
own post form until the live feed has announced the message and the channel page, fetched
again as the page's script does, shows it (the median and p90 of --runs posts). Everything
stays on loopback.
"""

import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

PAGES = ["/", "/tree", "/channels", "/channels/announcements", "/agents/lead", "/issues", "/audit"]
QUICK = [('sync_interval = "2s"', 'sync_interval = "200ms"'), ('quiet_window = "2s"', 'quiet_window = "100ms"')]
REQUESTER = """[[rule]]
match = { kind = "start" }
actions = [{ call = "agents_spawn_peer", args = { handle = "flaky", name = "Flaky", charter = "Hunt the flaky tests", reason = "CI is red" } }]
[[rule]]
match = { kind = "message" }
actions = [{ say = "noted" }]
"""


def canopy(binary, data, *args, check=True):
    out = subprocess.run([binary, "--dir", data, "--json", *args], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        if check:
            raise SystemExit(f"canopy {' '.join(args)} failed: {out.stdout}{out.stderr}")
        return None
    return json.loads(out.stdout) if out.stdout.strip() else None


class Console:
    def __init__(self, link):
        parsed = urllib.parse.urlparse(link)
        self.host, self.port = parsed.hostname, parsed.port
        status, headers, _ = self.request("GET", parsed.path)
        assert status == 200, status
        self.cookie = headers["set-cookie"].split(";")[0]
        _, _, page = self.request("GET", "/")
        self.csrf = re.search(r'name="csrf" content="([^"]+)"', page).group(1)

    def request(self, method, path, body=None, extra=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        headers = {"Host": f"{self.host}:{self.port}"}
        if getattr(self, "cookie", None):
            headers["Cookie"] = self.cookie
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        headers.update(extra or {})
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read().decode()
        result = (response.status, {k.lower(): v for k, v in response.getheaders()}, data)
        conn.close()
        return result


def feed(console, seen, ready):
    """Reads the live feed, recording when each message sequence was announced."""
    conn = http.client.HTTPConnection(console.host, console.port, timeout=600)
    conn.request("GET", "/events", headers={"Host": f"{console.host}:{console.port}", "Cookie": console.cookie})
    response = conn.getresponse()
    ready.set()
    event = None
    while True:
        line = response.fp.readline()
        if not line:
            return
        line = line.decode().rstrip("\n")
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event == "message":
            seq = json.loads(line.split(":", 1)[1])["seq"]
            seen[seq] = time.perf_counter()


def weigh(binary, runs):
    work = tempfile.mkdtemp(prefix="canopy-weigh-")
    data = os.path.join(work, "data")
    daemon = None
    try:
        canopy(binary, data, "init", "--operator", "ops")
        path = os.path.join(data, "canopy.toml")
        text = open(path).read()
        for old, new in QUICK:
            text = text.replace(old, new, 1)
        open(path, "w").write(text)
        log = open(os.path.join(work, "daemon.log"), "w")
        daemon = subprocess.Popen([binary, "--dir", data, "daemon"], stdout=log, stderr=log)
        for _ in range(300):
            if canopy(binary, data, "whoami", check=False):
                break
            time.sleep(0.1)
        script = os.path.join(work, "lead.toml")
        open(script, "w").write(REQUESTER)
        canopy(binary, data, "agents", "create", "--handle", "lead", "--name", "Lead", "--script", script)
        for _ in range(300):
            if canopy(binary, data, "requests")["requests"]:
                break
            time.sleep(0.1)
        for i in range(10):
            canopy(binary, data, "post", "--channel", "announcements", "--topic", "news", "--create-topic", f"news {i}")
        console = Console(canopy(binary, data, "web", "--no-open")["link"])
        weights = {}
        for page in PAGES + ["/assets/console.js", "/assets/console.css"]:
            status, _, body = console.request("GET", page)
            assert status == 200, (page, status)
            weights[page] = len(body.encode())
        seen, ready = {}, threading.Event()
        threading.Thread(target=feed, args=(console, seen, ready), daemon=True).start()
        ready.wait(10)
        time.sleep(0.5)
        latencies = []
        for i in range(runs):
            body = f"visible {i} {time.time()}"
            form = urllib.parse.urlencode({"channel": "announcements", "topic": "news", "body": body, "csrf": console.csrf})
            start = time.perf_counter()
            status, _, answer = console.request("POST", "/post", form, {"x-canopy-csrf": console.csrf})
            assert status == 200, (status, answer[:200])
            seq = int(re.search(r"#(\d+)", answer).group(1)) if re.search(r"#(\d+)", answer) else None
            while True:
                if seq is None:
                    seq = max(seen) if seen else None
                if seq is not None and seq in seen:
                    _, _, page = console.request("GET", "/channels/announcements?topic=news", extra={"x-canopy-part": "1"})
                    if body in page:
                        break
                if time.perf_counter() - start > 10:
                    raise SystemExit(f"post {i} never became visible")
                time.sleep(0.001)
            latencies.append((time.perf_counter() - start) * 1000)
        return weights, latencies
    finally:
        if daemon:
            daemon.terminate()
            daemon.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 20
    args = [a for a in args if a != str(runs)]
    if not args:
        raise SystemExit(__doc__)
    results = [weigh(os.path.abspath(b), runs) for b in args]
    new = results[0]
    base = results[1] if len(results) > 1 else None
    print(f"{'page':32} {'bytes':>8}" + (f" {'baseline':>9} {'ratio':>6}" if base else ""))
    for page, size in new[0].items():
        line = f"{page:32} {size:>8}"
        if base:
            line += f" {base[0][page]:>9} {size / base[0][page]:>6.2f}"
        print(line)
    def figures(lat):
        lat = sorted(lat)
        return statistics.median(lat), lat[int(len(lat) * 0.9) - 1]
    p50, p90 = figures(new[1])
    line = f"post-to-visible p50 {p50:.1f} ms, p90 {p90:.1f} ms ({runs} posts)"
    if base:
        b50, b90 = figures(base[1])
        line += f"; baseline p50 {b50:.1f} ms, p90 {b90:.1f} ms; ratio p50 {p50 / b50:.2f}, p90 {p90 / b90:.2f}"
    print(line)


if __name__ == "__main__":
    main()
