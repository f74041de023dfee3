#!/usr/bin/env bash
# Smoke test of tinychat in a real terminal: drives `tinychat --device cpu` inside tmux with
# send-keys and checks the screen with capture-pane at every step:
#   ask a question, open a second tab, ask there (both tabs stream at once), switch back,
#   reset, quit; then `tinychat history` lists both chats.
#
# Environment (all optional):
#   TINYCHAT       how to run tinychat            (default: tinychat)
#   TINYCHAT_ARGS  extra arguments, e.g. "--model /path/to/model"
#   TINYCHAT_HOME  where the history goes         (default: a fresh temporary folder)
#   SMOKE_OUT      a folder to keep every capture in (the two-tab capture is printed anyway)
#   SMOKE_TIMEOUT  seconds to wait for each step  (default: 180)
set -euo pipefail

TINYCHAT=${TINYCHAT:-tinychat}
TINYCHAT_ARGS=${TINYCHAT_ARGS:-}
export TINYCHAT_HOME=${TINYCHAT_HOME:-$(mktemp -d)}
SMOKE_OUT=${SMOKE_OUT:-}
TIMEOUT=${SMOKE_TIMEOUT:-180}
SESSION="tinychat-smoke-$$"
STEP=0

command -v tmux >/dev/null || { echo "tmux is not installed" >&2; exit 2; }
[ -n "$SMOKE_OUT" ] && mkdir -p "$SMOKE_OUT"

cleanup() { tmux kill-session -t "$SESSION" 2>/dev/null || true; }
trap cleanup EXIT

screen() { tmux capture-pane -p -t "$SESSION"; }

save() {  # save NAME: keep the current screen as NN-NAME.txt
    STEP=$((STEP + 1))
    if [ -n "$SMOKE_OUT" ]; then screen >"$SMOKE_OUT/$(printf %02d $STEP)-$1.txt"; fi
}

fail() {
    echo "FAIL: $*" >&2
    echo "----- screen -----" >&2
    screen >&2 || true
    exit 1
}

wait_for() {  # wait_for TEXT [WHAT]: until TEXT is on the screen
    local deadline=$((SECONDS + TIMEOUT))
    until screen | grep -qF -- "$1"; do
        [ $SECONDS -lt $deadline ] || fail "no '$1' on screen (${2:-})"
        sleep 0.2
    done
}

wait_gone() {  # wait_gone TEXT [WHAT]: until TEXT is no longer on the screen
    local deadline=$((SECONDS + TIMEOUT))
    while screen | grep -qF -- "$1"; do
        [ $SECONDS -lt $deadline ] || fail "'$1' still on screen (${2:-})"
        sleep 0.2
    done
}

type_line() {  # type_line TEXT: type it, check it is in the box, then press Enter
    tmux send-keys -t "$SESSION" -l -- "$1"
    wait_for "$1" "typed into the message box"
    tmux send-keys -t "$SESSION" Enter
}

command -v "${TINYCHAT%% *}" >/dev/null || { echo "cannot run: $TINYCHAT" >&2; exit 2; }
echo "tinychat home: $TINYCHAT_HOME"
STATUS_FILE=$(mktemp -u)
# The pane runs tinychat, then writes its exit status where this script can read it.
tmux new-session -d -s "$SESSION" -x 120 -y 36 \
    "$TINYCHAT --device cpu --fresh --temperature 0 --max-tokens 320 $TINYCHAT_ARGS;
     echo \$? >$STATUS_FILE; sleep 600"

# 1. Start-up: the UI opens at once, then shows the model, the device and the KV capacity.
wait_for "Ask anything" "the empty first tab"
wait_for "· cpu · KV " "the model loaded on the cpu backend"
save start

# 2. Ask a question in tab 1 (a long answer, so that it still streams in step 4).
type_line "Tell me a long story about a dragon who learns to bake bread."
wait_for "esc Stop" "a reply streaming in tab 1"
wait_for "1 Tell me a long story" "tab 1 titled after the question"
save tab1-streaming

# 3. Open a second tab.
tmux send-keys -t "$SESSION" C-n
wait_for "2 New chat" "a second tab"
wait_for "● 1 Tell me a long story" "tab 1 marked busy while it streams in the background"
save tab2-open

# 4. Ask there: both tabs now stream at once.
type_line "What is the capital of France?"
wait_for "2 What is the capital of" "tab 2 titled after its question"
wait_for "Paris" "the answer streaming into tab 2"
screen | grep -qF "● 1 Tell me a long story" || fail "tab 1 stopped streaming too early"
save two-tabs-streaming
echo "----- two tabs mid-stream (tab 2 shown) -----"
screen

# 5. Switch back to tab 1 (Alt+1): the story, still streaming. (Its question may have scrolled
# out of view: the chat follows the newest text, and by now the story can fill the screen.)
tmux send-keys -t "$SESSION" M-1
wait_gone "● 1 Tell me" "tab 1 shown: no busy marker on it"
wait_gone "The capital of France is Paris" "tab 2's chat no longer shown"
save tab1-back
echo "----- back on tab 1 -----"
screen
wait_gone "esc Stop" "the story to finish"
save tab1-done

# 6. Reset tab 1: cleared, with a way back.
tmux send-keys -t "$SESSION" C-r
wait_for "Chat cleared" "the reset notice"
wait_for "Ask anything" "the empty tab after reset"
screen | grep -qF "dragon who learns" && fail "tab 1's chat still shown after the reset"
save reset

# 7. Quit: tinychat exits cleanly.
tmux send-keys -t "$SESSION" C-q
deadline=$((SECONDS + 30))
until [ -s "$STATUS_FILE" ]; do
    [ $SECONDS -lt $deadline ] || fail "tinychat did not quit"
    sleep 0.2
done
status=$(cat "$STATUS_FILE")
rm -f "$STATUS_FILE"
[ "$status" = 0 ] || fail "tinychat exited with status $status"
save quit

# 8. The history kept both chats (tab 1's reset is final once the app quit).
history=$($TINYCHAT history)
echo "$history"
echo "$history" | grep -qF "What is the capital of France?" || fail "chat 2 not in the history"
echo "$history" | grep -qF "Tell me a long story" || fail "chat 1 not in the history"
echo "PASS: tmux smoke test"
