#!/usr/bin/env bash
# Refreshes the console's screenshots in docs/console/ by running its browser tests with
# CANOPY_CONSOLE_SHOTS set (headless Chromium, 1280 px wide, and 390 px for the `-phone` shots).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-nats.sh
scripts/install-bwrap.sh
browser="$(scripts/install-chromium.sh)"
eval "$browser"
export CANOPY_TEST_CHROMIUM CANOPY_TEST_CHROMEDRIVER
CANOPY_CONSOLE_SHOTS="$PWD/docs/console" cargo test -p canopy-e2e --test e2e --locked -- \
  console::the_console_shows_the_tree_live_and_decides_what_waits_in_a_real_browser \
  console::the_issues_board_files_assigns_comments_and_moves_a_card_live_in_a_real_browser \
  pictures::the_tree_the_spend_and_a_timeline_are_pictures_in_a_real_browser \
  pictures::every_page_fits_a_phone_with_its_decision_buttons_in_reach
ls -l docs/console/*.png
