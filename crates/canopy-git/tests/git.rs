//! Canopy's git operations on real repositories in a temporary directory (the sandbox off,
//! which the end-to-end tests cover): conflicts found without a checkout, and a check's
//! output kept bounded, its timeout ending everything it started.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

use std::path::Path;
use std::time::Duration;

use canopy_git::Git;
use canopy_harness::sandbox::SandboxSettings;

fn sh(dir: &Path, script: &str) -> String {
    let out = std::process::Command::new("sh").arg("-c").arg(script).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A repository with `main` and branches `a`, `b` (both change `shared.txt`) and `c` (its own file).
fn repo(dir: &Path) {
    sh(
        dir,
        "git init -q -b main . && git config user.name t && git config user.email t@t && \
         printf 'one\\ntwo\\n' > shared.txt && git add . && git commit -qm base && \
         git checkout -qb a && echo A > shared.txt && git commit -qam a && \
         git checkout -q main && git checkout -qb b && echo B > shared.txt && git commit -qam b && \
         git checkout -q main && git checkout -qb c && echo C > c.txt && git add c.txt && git commit -qm c && \
         git checkout -q main",
    );
}

#[tokio::test]
async fn merge_tree_names_the_conflicting_files_and_changed_files_the_touched_ones() {
    let tmp = tempfile::tempdir().unwrap();
    repo(tmp.path());
    let git = Git::new("git", SandboxSettings::off(tmp.path().join("data")), Duration::from_secs(5));
    let rev = |r: &str| sh(tmp.path(), &format!("git rev-parse {r}"));
    assert_eq!(git.conflicts(tmp.path(), &rev("a"), &rev("b")).await.unwrap(), vec!["shared.txt"]);
    assert!(git.conflicts(tmp.path(), &rev("a"), &rev("c")).await.unwrap().is_empty());
    assert_eq!(git.changed_files(tmp.path(), &rev("main"), &rev("c")).await.unwrap(), vec!["c.txt"]);
    assert!(git.conflicts(tmp.path(), &rev("a"), "0000000000000000000000000000000000000000").await.is_err());
}

#[tokio::test]
async fn a_check_keeps_the_end_of_its_output_and_a_timeout_says_so_with_what_it_printed() {
    let tmp = tempfile::tempdir().unwrap();
    repo(tmp.path());
    let git = Git::new("git", SandboxSettings::off(tmp.path().join("data")), Duration::from_millis(1500));
    let loud = git.check(tmp.path(), tmp.path(), "seq 1 100000; echo oops >&2; exit 3", 1000).await;
    assert!(!loud.passed && !loud.timed_out, "{loud:?}");
    assert_eq!(loud.outcome, "exit 3");
    assert!(loud.log.len() <= 1000 && loud.log.ends_with("100000\noops\n"), "{:?}", loud.log);
    let started = std::time::Instant::now();
    let hung = git.check(tmp.path(), tmp.path(), "echo started; sleep 30 & sleep 30", 1000).await;
    assert!(hung.timed_out && !hung.passed, "{hung:?}");
    assert_eq!(hung.outcome, "timed out after 1.5s");
    assert_eq!(hung.log, "started\n");
    assert!(started.elapsed() < Duration::from_secs(10), "the timeout ended the check and what it started");
    let ok = git.check(tmp.path(), tmp.path(), "true", 1000).await;
    assert!(ok.passed && ok.outcome == "exit 0", "{ok:?}");
}

#[test]
fn a_branch_head_is_read_from_a_regular_ref_file_only() {
    let tmp = tempfile::tempdir().unwrap();
    repo(tmp.path());
    let a = sh(tmp.path(), "git rev-parse a");
    assert_eq!(Git::read_branch_head(tmp.path(), "a").as_deref(), Some(a.as_str()));
    // Packed refs are read too.
    sh(tmp.path(), "git pack-refs --all");
    assert_eq!(Git::read_branch_head(tmp.path(), "a").as_deref(), Some(a.as_str()));
    // A FIFO answers nothing (and does not block), a symlink is not followed, junk is no id.
    sh(tmp.path(), "mkfifo .git/refs/heads/fifo && ln -s ../../../shared.txt .git/refs/heads/link");
    sh(tmp.path(), "echo not-an-id > .git/refs/heads/junk");
    for branch in ["fifo", "link", "junk", "missing"] {
        assert_eq!(Git::read_branch_head(tmp.path(), branch), None, "{branch}");
    }
}

/// A check runs code a session wrote: a fork bomb in it is held to the session's process limit
/// by a cgroup of its own (where the machine offers one: this one, a root runner on cgroup v1)
/// and the check fails saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_is_held_to_a_session_s_process_limit() {
    if let canopy_harness::cgroup::Cgroups::Unavailable(why) = canopy_harness::cgroup::Cgroups::probed() {
        eprintln!("skipped: {why}");
        return;
    }
    let (tmp, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    repo(tmp.path());
    let mut sandbox = SandboxSettings::required(data.path());
    sandbox.limits.max_processes = 32;
    let git = Git::new("git", sandbox, Duration::from_secs(20));
    let bomb = git.check(tmp.path(), tmp.path(), "f() { f | f & }; f; sleep 2; echo survived", 4000).await;
    assert!(!bomb.passed, "{bomb:?}");
    assert!(bomb.log.contains("canopy: the check hit a [sandbox] limit: process limit 32 reached"), "{}", bomb.log);
    let fine = git.check(tmp.path(), tmp.path(), "true", 1000).await;
    assert!(fine.passed, "a check within its limits passes: {fine:?}");
}

/// The smart HTTP endpoint with the real `git http-backend` and a real git client: a runner's
/// cache is made and updated over it, a push to a ref the login may write lands, a push to
/// any other ref (or with another login, or none) is refused before git sees it and changes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_endpoint_serves_fetches_and_only_the_pushes_it_allows() {
    use canopy_git::http::{Access, Authorize, Refusal, basic_header, serve};
    let tmp = tempfile::tempdir().unwrap();
    repo(tmp.path());
    let daemon = Git::new("git", SandboxSettings::off(tmp.path().join("daemon")), Duration::from_secs(5));
    let mirror = daemon.mirror_path("r");
    daemon.create_mirror(tmp.path().to_str().unwrap(), &mirror, "main").await.unwrap();
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = asked.clone();
    let authorize: Authorize = std::sync::Arc::new(move |asked: canopy_git::http::Asked| {
        seen.lock().unwrap().push(asked.clone());
        Box::pin(async move {
            match asked.login {
                Some((user, password)) if user == "box1" && password == "secret" => match &asked.access {
                    Access::Fetch => Ok(user),
                    Access::Push(updates) if updates.iter().all(|u| u.name == "refs/canopy/agents/alice") => Ok(user),
                    Access::Push(updates) => Err(Refusal::Forbidden(format!("may not push {}", updates[0].name))),
                },
                _ => Err(Refusal::Unauthenticated),
            }
        })
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = serve(listener, "git".into(), mirror.parent().unwrap().to_owned(), authorize, None).unwrap();
    let url = format!("http://{}", endpoint.addr);
    let runner = Git::new("git", SandboxSettings::off(tmp.path().join("runner")), Duration::from_secs(5));
    let remote = canopy_git::Remote { url: url.clone(), authorization: basic_header("box1", "secret") };
    let cache = tmp.path().join("runner/cache/r.git");
    runner.fetch_remote(&remote, "r", &cache).await.unwrap();
    assert_eq!(runner.base_commit(&cache, "main").await.unwrap(), sh(tmp.path(), "git rev-parse main"));
    // A commit made on this machine, pushed as the agent's ref.
    let c = sh(tmp.path(), "git rev-parse c");
    sh(&cache, &format!("git fetch -q {} c:refs/canopy/local", tmp.path().display()));
    runner.push_remote(&remote, "r", &cache, ("refs/canopy/local", "refs/canopy/agents/alice"), None).await.unwrap();
    assert_eq!(daemon.rev(&mirror, "refs/canopy/agents/alice").await.unwrap().as_deref(), Some(c.as_str()));
    // Another ref, another login, no login: refused, and the daemon's refs stay as they were.
    let main_before = daemon.base_commit(&mirror, "main").await.unwrap();
    let refused =
        runner.push_remote(&remote, "r", &cache, ("refs/canopy/local", "refs/heads/main"), None).await.unwrap_err();
    assert!(refused.to_string().contains("403"), "{refused}");
    let stranger = canopy_git::Remote { url: url.clone(), authorization: basic_header("box1", "wrong") };
    assert!(
        runner
            .push_remote(&stranger, "r", &cache, ("refs/canopy/local", "refs/canopy/agents/alice"), None)
            .await
            .is_err()
    );
    // A rewrite with a lease: refused unless the daemon's ref is where the lease says.
    sh(&cache, &format!("git fetch -q {} b:refs/canopy/other", tmp.path().display()));
    let other = ("refs/canopy/other", "refs/canopy/agents/alice");
    let stale = sh(tmp.path(), "git rev-parse a");
    assert!(
        runner.push_remote(&remote, "r", &cache, other, Some(Some(&stale))).await.is_err(),
        "pushed over newer work"
    );
    assert_eq!(daemon.rev(&mirror, "refs/canopy/agents/alice").await.unwrap().as_deref(), Some(c.as_str()));
    runner.push_remote(&remote, "r", &cache, other, Some(Some(&c))).await.unwrap();
    let b = sh(tmp.path(), "git rev-parse b");
    assert_eq!(daemon.rev(&mirror, "refs/canopy/agents/alice").await.unwrap().as_deref(), Some(b.as_str()));
    assert!(runner.fetch_remote(&stranger, "r", &cache).await.is_err());
    assert_eq!(daemon.base_commit(&mirror, "main").await.unwrap(), main_before);
    let plain = std::process::Command::new("git")
        .args(["ls-remote", &format!("{url}/r.git")])
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .unwrap();
    assert!(!plain.status.success(), "no login, no listing");
    // Paths outside the smart protocol are not served at all.
    assert!(runner.fetch_remote(&remote, "missing", &tmp.path().join("m.git")).await.is_err());
    assert!(
        asked.lock().unwrap().iter().any(|a| matches!(&a.access, Access::Push(u) if u[0].name == "refs/heads/main"))
    );
}
