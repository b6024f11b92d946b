#!/usr/bin/env bash
# Records the README's short tour on a terminal: a scratch workspace served by `canopy up`, the
# tour's commands typed into a tmux pane, and the pane captured after each into docs/tour/
# (plain text, as the terminal shows it). Run after a change to the CLI's output:
#   scripts/record-tour.sh            (builds target/debug/canopy first)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v tmux >/dev/null || { echo "record-tour: needs tmux (apt-get install tmux)" >&2; exit 69; }
scripts/install-nats.sh >/dev/null
scripts/install-bwrap.sh >/dev/null
cargo build -q -p canopy-cli
bin="$PWD/target/debug/canopy"
work="$(mktemp -d)"
out="$PWD/docs/tour"
mkdir -p "$out"
session="canopy-tour-$$"
cleanup() {
  tmux kill-session -t "$session" 2>/dev/null || true
  [ -n "${daemon:-}" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export CANOPY_DIR="$work/.canopy"
"$bin" init --operator ops --mission "Keep the web app shipping" >/dev/null
sed -i 's/^sync_interval = "2s"/sync_interval = "200ms"/; s/^quiet_window = "2s"/quiet_window = "100ms"/' "$CANOPY_DIR/canopy.toml"
"$bin" daemon >"$work/daemon.log" 2>&1 &
daemon=$!
until "$bin" whoami >/dev/null 2>&1; do sleep 0.2; done

tmux new-session -d -s "$session" -x 160 -y 40 "env CANOPY_DIR=$CANOPY_DIR PS1='$ ' bash --norc -i"
tmux send-keys -t "$session" "alias canopy=$bin" Enter
step() { # name, command, seconds to wait
  tmux send-keys -t "$session" "clear" Enter
  sleep 0.3
  tmux send-keys -t "$session" "$2" Enter
  sleep "$3"
  tmux capture-pane -p -t "$session" | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' >"$out/$1.txt"
  echo "recorded docs/tour/$1.txt"
}
step 01-status "canopy status" 1
step 02-post "canopy post --channel announcements --topic hello --create-topic 'hi everyone'" 1
step 03-create "canopy agents create --handle ci-manager --name 'CI Manager' --charter 'Keep CI green' && canopy tree" 2
# A Manager that asks for a child, so something waits for the operator.
cat >"$work/asker.toml" <<'TOML'
[[rule]]
match = { kind = "start" }
actions = [{ call = "agents_spawn_peer", args = { handle = "flaky-tests", name = "Flaky Tests Manager", charter = "Hunt down flaky tests", reason = "CI is red twice a day" } }]
TOML
"$bin" agents create --handle web-lead --name "Web Lead" --script "$work/asker.toml" >/dev/null
until "$bin" --json requests --state pending | grep -q flaky-tests; do sleep 0.2; done
step 04-roster "canopy roster" 1
step 05-requests "canopy requests" 1
step 06-status-waiting "canopy status" 1
step 07-budget "canopy agents budget web-lead --usd 20 --period 1day --subtree && canopy usage" 1
# `canopy top`, live, then `q`.
step 08-top "canopy top" 3
tmux send-keys -t "$session" q
