//! The schema and its append-only migrations, tracked by `PRAGMA user_version`.
//!
//! Never edit a released migration: add a new one at the end of `MIGRATIONS`.

use canopy_core::Error;
use rusqlite::Connection;

use crate::Db;

use crate::sql;

const MIGRATIONS: &[&str] = &[
    // 1: workspace, accounts, channels, topics, messages, subscriptions, audit.
    r#"
    CREATE TABLE workspace (
        id          TEXT PRIMARY KEY,
        name        TEXT NOT NULL,
        mission     TEXT NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE TABLE accounts (
        id               INTEGER PRIMARY KEY,
        handle           TEXT NOT NULL UNIQUE,
        display_name     TEXT NOT NULL,
        kind             TEXT NOT NULL CHECK (kind IN ('operator', 'agent', 'system')),
        role             TEXT,
        parent_id        INTEGER REFERENCES accounts(id),
        home_channel_id  INTEGER REFERENCES channels(id),
        charter          TEXT NOT NULL DEFAULT '',
        state            TEXT NOT NULL DEFAULT 'active',
        token_hash       TEXT UNIQUE,
        created_at       INTEGER NOT NULL
    );
    CREATE INDEX accounts_parent ON accounts(parent_id);
    CREATE TABLE channels (
        id                   INTEGER PRIMARY KEY,
        name                 TEXT NOT NULL UNIQUE,
        kind                 TEXT NOT NULL,
        post_policy          TEXT NOT NULL,
        subscription_policy  TEXT NOT NULL,
        owner_id             INTEGER REFERENCES accounts(id),
        created_at           INTEGER NOT NULL
    );
    CREATE TABLE channel_posters (
        channel_id  INTEGER NOT NULL REFERENCES channels(id),
        account_id  INTEGER NOT NULL REFERENCES accounts(id),
        PRIMARY KEY (channel_id, account_id)
    ) WITHOUT ROWID;
    CREATE TABLE topics (
        id                INTEGER PRIMARY KEY,
        channel_id        INTEGER NOT NULL REFERENCES channels(id),
        name              TEXT NOT NULL,
        created_by        INTEGER NOT NULL REFERENCES accounts(id),
        created_at        INTEGER NOT NULL,
        last_seq          INTEGER NOT NULL DEFAULT 0,
        last_activity_at  INTEGER NOT NULL,
        message_count     INTEGER NOT NULL DEFAULT 0,
        resolved          INTEGER NOT NULL DEFAULT 0,
        UNIQUE (channel_id, name)
    );
    -- No index on activity: a channel has few topics, and every post would pay to keep it.
    CREATE TABLE messages (
        seq              INTEGER PRIMARY KEY AUTOINCREMENT,
        channel_id       INTEGER NOT NULL REFERENCES channels(id),
        topic_id         INTEGER NOT NULL REFERENCES topics(id),
        sender_id        INTEGER NOT NULL REFERENCES accounts(id),
        body             TEXT NOT NULL,
        mentions         TEXT NOT NULL DEFAULT '[]',
        idempotency_key  TEXT,
        created_at       INTEGER NOT NULL
    );
    -- Partial: most posts carry no key, and should not pay for an index entry.
    CREATE UNIQUE INDEX messages_idempotency ON messages(sender_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    CREATE INDEX messages_channel ON messages(channel_id, seq);
    CREATE INDEX messages_topic ON messages(topic_id, seq);
    CREATE TABLE subscriptions (
        account_id  INTEGER NOT NULL REFERENCES accounts(id),
        channel_id  INTEGER NOT NULL REFERENCES channels(id),
        mandatory   INTEGER NOT NULL,
        cursor      INTEGER NOT NULL DEFAULT 0,
        created_at  INTEGER NOT NULL,
        PRIMARY KEY (account_id, channel_id)
    ) WITHOUT ROWID;
    CREATE INDEX subscriptions_channel ON subscriptions(channel_id);
    CREATE TABLE audit (
        id        INTEGER PRIMARY KEY,
        at        INTEGER NOT NULL,
        actor_id  INTEGER REFERENCES accounts(id),
        action    TEXT NOT NULL,
        target    TEXT NOT NULL,
        detail    TEXT NOT NULL DEFAULT ''
    );
    "#,
    // 2: sessions, runners, presence, activity; an agent's harness and desired state.
    r#"
    ALTER TABLE accounts ADD COLUMN harness TEXT NOT NULL DEFAULT '';
    ALTER TABLE accounts ADD COLUMN script_name TEXT;
    ALTER TABLE accounts ADD COLUMN script TEXT;
    ALTER TABLE accounts ADD COLUMN desired TEXT NOT NULL DEFAULT 'running';
    CREATE TABLE runners (
        id          TEXT PRIMARY KEY,
        name        TEXT NOT NULL,
        mcp_url     TEXT NOT NULL,
        capacity    INTEGER NOT NULL,
        started_at  INTEGER NOT NULL,
        last_seen   INTEGER NOT NULL
    );
    CREATE TABLE sessions (
        id           INTEGER PRIMARY KEY,
        agent_id     INTEGER NOT NULL REFERENCES accounts(id),
        incarnation  INTEGER NOT NULL,
        runner_id    TEXT NOT NULL,
        token_hash   TEXT NOT NULL UNIQUE,
        started_at   INTEGER NOT NULL,
        ended_at     INTEGER,
        end_reason   TEXT,
        UNIQUE (agent_id, incarnation)
    );
    CREATE INDEX sessions_live ON sessions(runner_id) WHERE ended_at IS NULL;
    CREATE TABLE presence (
        agent_id     INTEGER PRIMARY KEY REFERENCES accounts(id),
        state        TEXT NOT NULL,
        reason       TEXT,
        activity     TEXT,
        incarnation  INTEGER NOT NULL DEFAULT 0,
        last_seen    INTEGER,
        state_since  INTEGER NOT NULL
    );
    CREATE TABLE activity (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        agent_id     INTEGER NOT NULL REFERENCES accounts(id),
        incarnation  INTEGER NOT NULL,
        at           INTEGER NOT NULL,
        kind         TEXT NOT NULL,
        turn_id      TEXT,
        summary      TEXT NOT NULL,
        detail       TEXT NOT NULL
    );
    CREATE INDEX activity_agent ON activity(agent_id, incarnation, id);
    "#,
    // 3: delivery (sparse per-message states), acknowledgement-only posts, pins,
    // coordination channels, overflow notices.
    r#"
    CREATE TABLE deliveries (
        agent_id  INTEGER NOT NULL REFERENCES accounts(id),
        seq       INTEGER NOT NULL,
        state     TEXT NOT NULL CHECK (state IN ('injected', 'held')),
        at        INTEGER NOT NULL,
        PRIMARY KEY (agent_id, seq)
    ) WITHOUT ROWID;
    ALTER TABLE messages ADD COLUMN ack_only INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE pins (
        channel_id  INTEGER NOT NULL REFERENCES channels(id),
        seq         INTEGER NOT NULL REFERENCES messages(seq),
        pinned_by   INTEGER NOT NULL REFERENCES accounts(id),
        at          INTEGER NOT NULL,
        PRIMARY KEY (channel_id, seq)
    ) WITHOUT ROWID;
    ALTER TABLE accounts ADD COLUMN coord_channel_id INTEGER REFERENCES channels(id);
    CREATE INDEX channel_posters_account ON channel_posters(account_id);
    ALTER TABLE presence ADD COLUMN overflow INTEGER NOT NULL DEFAULT 0;
    "#,
    // 4: spawn requests.
    r#"
    CREATE TABLE spawn_requests (
        id               INTEGER PRIMARY KEY,
        requester_id     INTEGER NOT NULL REFERENCES accounts(id),
        handle           TEXT NOT NULL,
        display_name     TEXT NOT NULL,
        role             TEXT NOT NULL,
        charter          TEXT NOT NULL,
        reason           TEXT NOT NULL,
        idempotency_key  TEXT,
        state            TEXT NOT NULL,
        decided_by       INTEGER REFERENCES accounts(id),
        decision_note    TEXT,
        child_id         INTEGER REFERENCES accounts(id),
        created_at       INTEGER NOT NULL,
        decided_at       INTEGER,
        expires_at       INTEGER NOT NULL
    );
    CREATE UNIQUE INDEX spawn_requests_key ON spawn_requests(requester_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    CREATE INDEX spawn_requests_state ON spawn_requests(state, expires_at);
    "#,
    // 5: prompts (persona, the rendered hash per session) and subagent runs. A run is an
    // account (so it has a session, a token and activity like any agent) that is not a
    // tree node: `run_of` names the Manager it works for.
    r#"
    ALTER TABLE accounts ADD COLUMN persona TEXT;
    ALTER TABLE accounts ADD COLUMN run_of INTEGER REFERENCES accounts(id);
    ALTER TABLE sessions ADD COLUMN prompt_hash TEXT;
    CREATE TABLE runs (
        id          INTEGER PRIMARY KEY,
        account_id  INTEGER NOT NULL UNIQUE REFERENCES accounts(id),
        manager_id  INTEGER NOT NULL REFERENCES accounts(id),
        definition  TEXT NOT NULL,
        brief       TEXT NOT NULL,
        status      TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed', 'timed_out')),
        report      TEXT,
        started_at  INTEGER NOT NULL,
        deadline    INTEGER NOT NULL,
        ended_at    INTEGER
    );
    CREATE INDEX runs_open ON runs(manager_id) WHERE ended_at IS NULL;
    "#,
    // 6: runtime records: token usage per model turn, compaction checkpoints; indexes for
    // history search (an agent's sent messages) and retention (activity by age).
    r#"
    CREATE TABLE usage (
        id                  INTEGER PRIMARY KEY,
        agent_id            INTEGER NOT NULL REFERENCES accounts(id),
        incarnation         INTEGER NOT NULL,
        turn_id             TEXT,
        at                  INTEGER NOT NULL,
        input_tokens        INTEGER NOT NULL,
        output_tokens       INTEGER NOT NULL,
        cache_read_tokens   INTEGER NOT NULL,
        cache_write_tokens  INTEGER NOT NULL,
        cost_usd            REAL
    );
    CREATE INDEX usage_agent ON usage(agent_id, at);
    CREATE INDEX usage_at ON usage(at);
    CREATE TABLE compactions (
        id           INTEGER PRIMARY KEY,
        agent_id     INTEGER NOT NULL REFERENCES accounts(id),
        incarnation  INTEGER NOT NULL,
        at           INTEGER NOT NULL,
        seq          INTEGER NOT NULL
    );
    CREATE INDEX compactions_agent ON compactions(agent_id, id);
    CREATE INDEX activity_at ON activity(at);
    CREATE INDEX messages_sender ON messages(sender_id, seq);
    "#,
    // A runner's process: a runner id is its credential's and outlives a process, so each
    // start says which boot it is, and the sessions of an earlier boot end at once.
    r#"
    ALTER TABLE runners ADD COLUMN boot TEXT NOT NULL DEFAULT '';
    "#,
    // Repositories, a checkout per agent or run, merge requests.
    r#"
    CREATE TABLE repos (
        id             INTEGER PRIMARY KEY,
        name           TEXT NOT NULL UNIQUE,
        source         TEXT NOT NULL,
        base           TEXT NOT NULL,
        check_command  TEXT NOT NULL DEFAULT '',
        created_at     INTEGER NOT NULL
    );
    CREATE TABLE checkouts (
        account_id   INTEGER PRIMARY KEY REFERENCES accounts(id),
        repo_id      INTEGER NOT NULL REFERENCES repos(id),
        branch       TEXT NOT NULL,
        base_commit  TEXT NOT NULL DEFAULT '',
        start        TEXT NOT NULL DEFAULT '',
        state        TEXT NOT NULL CHECK (state IN ('preparing', 'ready', 'merged', 'discarded', 'removed', 'failed')),
        note         TEXT,
        created_at   INTEGER NOT NULL,
        updated_at   INTEGER NOT NULL
    );
    CREATE INDEX checkouts_state ON checkouts(state);
    ALTER TABLE spawn_requests ADD COLUMN repo_id INTEGER REFERENCES repos(id);
    CREATE TABLE merges (
        id             INTEGER PRIMARY KEY,
        requester_id   INTEGER NOT NULL REFERENCES accounts(id),
        repo_id        INTEGER NOT NULL REFERENCES repos(id),
        branch         TEXT NOT NULL,
        head           TEXT NOT NULL,
        base_commit    TEXT NOT NULL DEFAULT '',
        title          TEXT NOT NULL,
        summary        TEXT NOT NULL,
        depends_on     TEXT NOT NULL DEFAULT '',
        state          TEXT NOT NULL CHECK (state IN ('checking', 'pending', 'merging', 'merged', 'denied', 'refused')),
        commits        TEXT NOT NULL DEFAULT '',
        diffstat       TEXT NOT NULL DEFAULT '',
        check_result   TEXT NOT NULL DEFAULT '',
        check_passed   INTEGER NOT NULL DEFAULT 0,
        decided_by     INTEGER REFERENCES accounts(id),
        note           TEXT,
        merged_commit  TEXT,
        created_at     INTEGER NOT NULL,
        decided_at     INTEGER
    );
    CREATE INDEX merges_state ON merges(state);
    "#,
    // Wake policies: a channel's (NULL: its kind's default), and the one a message was posted
    // under ('all', 'mentioned', 'none'), which decides whom it wakes.
    r#"
    ALTER TABLE channels ADD COLUMN wake_policy TEXT;
    ALTER TABLE messages ADD COLUMN wake TEXT NOT NULL DEFAULT 'all';
    "#,
    // A cost computed from `[pricing]` (the harness reported tokens only), not reported.
    r#"
    ALTER TABLE usage ADD COLUMN cost_computed INTEGER NOT NULL DEFAULT 0;
    "#,
    // Budgets: an agent's own and its subtree's, each with its window and the spend charged
    // in it; usage rows that are a turn's estimate, and the dollars each row was charged at
    // (its cost, else the estimate); a spawn request's proposed budget.
    r#"
    CREATE TABLE budgets (
        id            INTEGER PRIMARY KEY,
        agent_id      INTEGER NOT NULL REFERENCES accounts(id),
        scope         TEXT NOT NULL CHECK (scope IN ('agent', 'subtree')),
        usd           REAL,
        tokens        INTEGER,
        period_ms     INTEGER,
        anchor_ms     INTEGER NOT NULL,
        window_start  INTEGER NOT NULL,
        spent_usd     REAL NOT NULL DEFAULT 0,
        spent_tokens  INTEGER NOT NULL DEFAULT 0,
        warned        INTEGER NOT NULL DEFAULT 0,
        source        TEXT NOT NULL CHECK (source IN ('operator', 'role', 'spawn')),
        set_at        INTEGER NOT NULL,
        UNIQUE (agent_id, scope)
    );
    ALTER TABLE usage ADD COLUMN estimated INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage ADD COLUMN charged_usd REAL NOT NULL DEFAULT 0;
    UPDATE usage SET charged_usd = COALESCE(cost_usd, 0);
    CREATE INDEX usage_session_estimates ON usage(agent_id, incarnation) WHERE estimated = 1;
    ALTER TABLE spawn_requests ADD COLUMN budget_usd REAL;
    ALTER TABLE spawn_requests ADD COLUMN budget_tokens INTEGER;
    "#,
    // Offers: a message handed to a session that has not confirmed it yet, with the session's
    // incarnation; handed to a later session, it is a redelivery and says so.
    r#"
    CREATE TABLE offers (
        agent_id     INTEGER NOT NULL REFERENCES accounts(id),
        seq          INTEGER NOT NULL,
        incarnation  INTEGER NOT NULL,
        PRIMARY KEY (agent_id, seq)
    ) WITHOUT ROWID;
    "#,
    // Redeliveries: a message handed to a later session after an earlier one was handed it
    // and ended unconfirmed. Kept after confirmation, so `history_search` can say so.
    r#"
    CREATE TABLE redeliveries (
        agent_id     INTEGER NOT NULL REFERENCES accounts(id),
        seq          INTEGER NOT NULL,
        PRIMARY KEY (agent_id, seq)
    ) WITHOUT ROWID;
    "#,
    // The text index of `history_search`: which messages hold each trigram of their body (a
    // substring query of three characters or more finds its candidates without reading the
    // history; no positions are kept, the candidates are checked against the text). An
    // external-content table over `messages` (no second copy of the text), filled behind the
    // post path in batches up to `indexed_through` (`history::index_text`).
    r#"
    CREATE VIRTUAL TABLE message_text USING fts5(body, content = 'messages', content_rowid = 'seq', tokenize = 'trigram', detail = 'none');
    CREATE TABLE text_index (
        id               INTEGER PRIMARY KEY CHECK (id = 1),
        indexed_through  INTEGER NOT NULL
    );
    INSERT INTO text_index (id, indexed_through) VALUES (1, 0);
    "#,
    // Creating an agent finds the operators and the broadcast channels by kind: without these
    // each creation read every account and every channel (quadratic at 100,000 agents).
    r#"
    CREATE INDEX accounts_kind ON accounts(kind);
    CREATE INDEX channels_kind ON channels(kind);
    "#,
    // The work ledger (issue 34): issues with their owner, parent, labels, dependencies,
    // blocker (JSON) and an append-only history; the runs and merge requests that link them;
    // usage attributed to an issue (a run's to its issue, a turn to its owner's one
    // `in_progress` issue). An imported issue keeps its source (`github#12`), unique.
    r#"
    CREATE TABLE issues (
        number       INTEGER PRIMARY KEY,
        title        TEXT NOT NULL,
        body         TEXT NOT NULL,
        state        TEXT NOT NULL CHECK (state IN ('open', 'in_progress', 'blocked', 'in_review', 'done', 'wontdo')),
        owner_id     INTEGER REFERENCES accounts(id),
        reporter_id  INTEGER NOT NULL REFERENCES accounts(id),
        parent       INTEGER REFERENCES issues(number),
        blocker      TEXT,
        resolution   TEXT,
        source       TEXT UNIQUE,
        budget_usd   REAL,
        topic        TEXT NOT NULL,
        created_at   INTEGER NOT NULL,
        updated_at   INTEGER NOT NULL
    );
    CREATE INDEX issues_owner ON issues(owner_id, state, number);
    CREATE INDEX issues_state ON issues(state, number);
    CREATE INDEX issues_parent ON issues(parent) WHERE parent IS NOT NULL;
    CREATE TABLE issue_labels (
        label   TEXT NOT NULL,
        issue   INTEGER NOT NULL REFERENCES issues(number),
        PRIMARY KEY (label, issue)
    ) WITHOUT ROWID;
    CREATE INDEX issue_labels_issue ON issue_labels(issue);
    CREATE TABLE issue_deps (
        issue     INTEGER NOT NULL REFERENCES issues(number),
        on_issue  INTEGER NOT NULL REFERENCES issues(number),
        PRIMARY KEY (issue, on_issue)
    ) WITHOUT ROWID;
    CREATE INDEX issue_deps_on ON issue_deps(on_issue);
    CREATE TABLE issue_events (
        id        INTEGER PRIMARY KEY,
        issue     INTEGER NOT NULL REFERENCES issues(number),
        at        INTEGER NOT NULL,
        actor_id  INTEGER NOT NULL REFERENCES accounts(id),
        kind      TEXT NOT NULL,
        text      TEXT NOT NULL
    );
    CREATE INDEX issue_events_issue ON issue_events(issue, id);
    CREATE TABLE issue_links (
        issue  INTEGER NOT NULL REFERENCES issues(number),
        kind   TEXT NOT NULL CHECK (kind IN ('run', 'merge')),
        ref    INTEGER NOT NULL,
        PRIMARY KEY (issue, kind, ref)
    ) WITHOUT ROWID;
    CREATE INDEX issue_links_ref ON issue_links(kind, ref);
    ALTER TABLE usage ADD COLUMN issue INTEGER;
    CREATE INDEX usage_issue ON usage(issue) WHERE issue IS NOT NULL;
    ALTER TABLE runs ADD COLUMN issue INTEGER REFERENCES issues(number);
    "#,
    // Whether any issue has a budget, asked after every usage write once the ledger changed:
    // answered off this index, not a scan of the ledger.
    r#"
    CREATE INDEX issues_budgeted ON issues(number) WHERE budget_usd IS NOT NULL;
    "#,
    // A filing retried with its idempotency key returns the issue it filed (per reporter).
    r#"
    ALTER TABLE issues ADD COLUMN idempotency_key TEXT;
    CREATE UNIQUE INDEX issues_idempotency ON issues(reporter_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
    "#,
    // Named checks per repository (JSON; the single check of old is `check`), every run of a check
    // with its log, the review policy and reviews with their verdicts, the merge queue's
    // states, and the conflicts found between live branches. `merges` is rebuilt for its
    // widened state list (SQLite cannot alter a CHECK).
    r#"
    ALTER TABLE repos ADD COLUMN checks TEXT NOT NULL DEFAULT '[]';
    UPDATE repos SET checks = json_array(json_object('name', 'check', 'command', check_command))
        WHERE check_command != '';
    ALTER TABLE repos ADD COLUMN review TEXT NOT NULL DEFAULT 'operator' CHECK (review IN ('operator', 'required'));
    CREATE TABLE check_runs (
        id           INTEGER PRIMARY KEY,
        repo_id      INTEGER NOT NULL REFERENCES repos(id),
        name         TEXT NOT NULL,
        command      TEXT NOT NULL,
        commit_sha   TEXT NOT NULL,
        trigger      TEXT NOT NULL CHECK (trigger IN ('run', 'branch', 'merge', 'queue')),
        subject      TEXT NOT NULL,
        state        TEXT NOT NULL CHECK (state IN ('running', 'passed', 'failed', 'timed_out', 'error')),
        outcome      TEXT NOT NULL DEFAULT '',
        duration_ms  INTEGER NOT NULL DEFAULT 0,
        log          TEXT,
        log_bytes    INTEGER NOT NULL DEFAULT 0,
        started_at   INTEGER NOT NULL,
        finished_at  INTEGER
    );
    CREATE INDEX check_runs_subject ON check_runs(repo_id, subject, id);
    CREATE INDEX check_runs_commit ON check_runs(repo_id, commit_sha);
    CREATE INDEX check_runs_state ON check_runs(state) WHERE state = 'running';
    CREATE TABLE merges_next (
        id             INTEGER PRIMARY KEY,
        requester_id   INTEGER NOT NULL REFERENCES accounts(id),
        repo_id        INTEGER NOT NULL REFERENCES repos(id),
        branch         TEXT NOT NULL,
        head           TEXT NOT NULL,
        base_commit    TEXT NOT NULL DEFAULT '',
        title          TEXT NOT NULL,
        summary        TEXT NOT NULL,
        depends_on     TEXT NOT NULL DEFAULT '',
        state          TEXT NOT NULL CHECK (state IN ('checking', 'in_review', 'pending', 'queued', 'merging', 'merged', 'denied', 'refused')),
        commits        TEXT NOT NULL DEFAULT '',
        diffstat       TEXT NOT NULL DEFAULT '',
        check_result   TEXT NOT NULL DEFAULT '',
        check_passed   INTEGER NOT NULL DEFAULT 0,
        decided_by     INTEGER REFERENCES accounts(id),
        note           TEXT,
        merged_commit  TEXT,
        created_at     INTEGER NOT NULL,
        decided_at     INTEGER,
        queued_at      INTEGER,
        override       TEXT
    );
    INSERT INTO merges_next (id, requester_id, repo_id, branch, head, base_commit, title, summary, depends_on,
        state, commits, diffstat, check_result, check_passed, decided_by, note, merged_commit, created_at, decided_at)
        SELECT id, requester_id, repo_id, branch, head, base_commit, title, summary, depends_on,
        state, commits, diffstat, check_result, check_passed, decided_by, note, merged_commit, created_at, decided_at
        FROM merges;
    DROP TABLE merges;
    ALTER TABLE merges_next RENAME TO merges;
    CREATE INDEX merges_state ON merges(state);
    CREATE INDEX merges_queue ON merges(repo_id, queued_at, id) WHERE state IN ('queued', 'merging');
    CREATE TABLE reviews (
        id           INTEGER PRIMARY KEY,
        merge_id     INTEGER NOT NULL REFERENCES merges(id),
        head         TEXT NOT NULL,
        reviewer_id  INTEGER NOT NULL REFERENCES accounts(id),
        run_id       INTEGER REFERENCES runs(id),
        focus        TEXT NOT NULL DEFAULT '',
        verdict      TEXT CHECK (verdict IN ('approve', 'changes_requested')),
        summary      TEXT NOT NULL DEFAULT '',
        comments     TEXT NOT NULL DEFAULT '[]',
        state        TEXT NOT NULL CHECK (state IN ('running', 'submitted', 'abandoned')),
        created_at   INTEGER NOT NULL,
        submitted_at INTEGER
    );
    CREATE INDEX reviews_merge ON reviews(merge_id, id);
    CREATE INDEX reviews_run ON reviews(run_id) WHERE run_id IS NOT NULL;
    CREATE TABLE conflicts (
        repo_id   INTEGER NOT NULL REFERENCES repos(id),
        branch    TEXT NOT NULL,
        other     TEXT NOT NULL,
        files     TEXT NOT NULL,
        found_at  INTEGER NOT NULL,
        PRIMARY KEY (repo_id, branch, other)
    ) WITHOUT ROWID;
    ALTER TABLE checkouts ADD COLUMN read_only INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE branch_heads (
        repo_id     INTEGER NOT NULL REFERENCES repos(id),
        branch      TEXT NOT NULL,
        head        TEXT NOT NULL,
        checked     TEXT NOT NULL DEFAULT '',
        failing     INTEGER NOT NULL DEFAULT 0,
        updated_at  INTEGER NOT NULL,
        PRIMARY KEY (repo_id, branch)
    ) WITHOUT ROWID;
    "#,
    // 20: connections a session's egress proxy refused (the roster's `egress refused: N`).
    r#"
    ALTER TABLE sessions ADD COLUMN egress_refused INTEGER NOT NULL DEFAULT 0;
    "#,
    // 21: placement by labels, runners' versions and drains (`canopy runners`); a lane's
    // harness chain (the harness it failed over from, why, when, and each session's harness).
    r#"
    ALTER TABLE runners ADD COLUMN labels TEXT NOT NULL DEFAULT '';
    ALTER TABLE runners ADD COLUMN version TEXT NOT NULL DEFAULT '';
    ALTER TABLE runners ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE accounts ADD COLUMN needs TEXT NOT NULL DEFAULT '';
    ALTER TABLE accounts ADD COLUMN home_harness TEXT NOT NULL DEFAULT '';
    ALTER TABLE accounts ADD COLUMN failover TEXT;
    ALTER TABLE accounts ADD COLUMN failed_over_at INTEGER;
    ALTER TABLE accounts ADD COLUMN failbacks INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN harness TEXT NOT NULL DEFAULT '';
    "#,
    // 22: the `[notify] remind_after` reminders sent, one per item and episode (`item` is
    // `req-1`, `merge-3@<pending since ms>`, or `lead@<since ms>` for an agent's failing
    // episode); when a merge request last began waiting for the operator.
    r#"
    CREATE TABLE reminders (
        item TEXT PRIMARY KEY,
        at   INTEGER NOT NULL
    );
    ALTER TABLE merges ADD COLUMN pending_since INTEGER;
    "#,
];

/// Brings the database up to the newest schema. Refuses a database newer than this build.
pub(crate) fn migrate(conn: &Connection) -> Result<(), Error> {
    let current: usize = conn
        .query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))
        .map_err(sql("reading the schema version"))? as usize;
    if current > MIGRATIONS.len() {
        return Err(Error::Unavailable(format!(
            "the database has schema version {current}, newer than this build ({}); upgrade canopy",
            MIGRATIONS.len()
        )));
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(current) {
        let version = index + 1;
        let script = format!("BEGIN IMMEDIATE; {migration} PRAGMA user_version = {version}; COMMIT;");
        conn.execute_batch(&script).map_err(|e| {
            // The migration's own error is the one returned; a failed ROLLBACK usually means
            // no transaction was open (SQLite already rolled it back, or BEGIN itself failed).
            if let Err(rollback) = conn.execute_batch("ROLLBACK") {
                tracing::debug!(error = %rollback, version, "rolling back a failed schema migration");
            }
            Error::Internal(format!("applying schema migration {version}: {e}"))
        })?;
        tracing::info!(version, "applied schema migration");
    }
    Ok(())
}

/// Appends one line to the audit log in the caller's transaction.
pub(crate) fn audit(
    conn: &Db<'_>,
    actor_id: Option<i64>,
    action: &str,
    target: &str,
    detail: &str,
) -> Result<(), Error> {
    conn.prepare_cached("INSERT INTO audit (at, actor_id, action, target, detail) VALUES (?1, ?2, ?3, ?4, ?5)")
        .and_then(|mut s| s.execute(rusqlite::params![conn.now_ms(), actor_id, action, target, detail]))
        .map_err(sql("writing the audit log"))?;
    Ok(())
}
