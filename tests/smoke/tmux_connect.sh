#!/usr/bin/env bash
# Smoke test of `tinychat serve` and `tinychat --connect` in a real terminal: starts the
# server (with an API key) in the background, drives `tinychat --connect URL` inside tmux:
# the status bar shows the endpoint, a question gets its answer streamed over HTTP, Escape
# stops a long reply, quit; then `tinychat history` lists the chat, and the server stops on
# Ctrl+C (SIGINT). The server keeps its engine in-process (--no-engine-process): what runs
# here is the command line and HTTP, and the engine core's own start costs CI a process.
#
# Environment (all optional):
#   TINYCHAT       how to run tinychat            (default: tinychat)
#   SERVE_ARGS     extra arguments of `tinychat serve`, e.g. "--model /path/to/model"
#   TINYCHAT_HOME  where the history goes         (default: a fresh temporary folder)
#   SMOKE_TIMEOUT  seconds to wait for each step  (default: 180)
set -euo pipefail

TINYCHAT=${TINYCHAT:-tinychat}
SERVE_ARGS=${SERVE_ARGS:-}
export TINYCHAT_HOME=${TINYCHAT_HOME:-$(mktemp -d)}
TIMEOUT=${SMOKE_TIMEOUT:-180}
SESSION="tinychat-connect-$$"
KEY="smoke-key"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT/v1"
SERVER_LOG=$(mktemp)
SERVER_PID=""

command -v tmux >/dev/null || { echo "tmux is not installed" >&2; exit 2; }
# A tmux server of its own (-L): a running one would start the pane with its own environment.
tmux() { command tmux -L "$SESSION" "$@"; }

cleanup() {
    tmux kill-server 2>/dev/null || true
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; fi
}
trap cleanup EXIT

screen() { tmux capture-pane -p -t "$SESSION"; }

fail() {
    echo "FAIL: $*" >&2
    echo "----- screen -----" >&2
    screen >&2 || true
    echo "----- server log -----" >&2
    tail -20 "$SERVER_LOG" >&2 || true
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

# 1. The server: up once /health answers.
# shellcheck disable=SC2086
$TINYCHAT serve --device cpu --port "$PORT" --api-key "$KEY" --max-model-len 1024 --no-engine-process $SERVE_ARGS \
    >"$SERVER_LOG" 2>&1 &
SERVER_PID=$!
deadline=$((SECONDS + TIMEOUT))
until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health')" 2>/dev/null; do
    kill -0 "$SERVER_PID" 2>/dev/null || fail "tinychat serve exited"
    [ $SECONDS -lt $deadline ] || fail "tinychat serve did not start"
    sleep 0.5
done
grep -qF "at $URL (API key required)" "$SERVER_LOG" || fail "the server's banner"

# 2. The app, connected: the status bar shows the model and the endpoint.
STATUS_FILE=$(mktemp -u)
tmux new-session -d -s "$SESSION" -x 120 -y 36 \
    "TINYCHAT_HOME=$TINYCHAT_HOME $TINYCHAT --connect $URL --api-key $KEY --fresh --temperature 0 --max-tokens 200;
     echo \$? >$STATUS_FILE; sleep 600"
wait_for "Ask anything" "the empty first tab"
wait_for "· $URL" "the endpoint in the status bar"

# 3. A question, answered over HTTP.
type_line "What is the capital of France?"
wait_for "Paris" "the answer streamed from the server"
wait_gone "esc Stop" "the answer to finish"

# 4. A long reply, stopped with Escape (the server aborts it: the connection closed).
type_line "Tell me a long story about a dragon who learns to bake bread."
wait_for "esc Stop" "the story streaming"
tmux send-keys -t "$SESSION" Escape
wait_gone "esc Stop" "the stop"
echo "----- after Escape -----"
screen

# 5. Quit, then the history holds the chat.
tmux send-keys -t "$SESSION" C-q
deadline=$((SECONDS + 30))
until [ -s "$STATUS_FILE" ]; do
    [ $SECONDS -lt $deadline ] || fail "tinychat did not quit"
    sleep 0.2
done
status=$(cat "$STATUS_FILE")
rm -f "$STATUS_FILE"
[ "$status" = 0 ] || fail "tinychat exited with status $status"
# (into a file first: with pipefail, `grep -q` leaving early would fail the pipeline)
HISTORY_OUT=$(mktemp)
$TINYCHAT history >"$HISTORY_OUT" || fail "tinychat history failed"
grep -qF "What is the capital of France?" "$HISTORY_OUT" || fail "the chat is not in the history"
rm -f "$HISTORY_OUT"

# 6. The server stops on Ctrl+C, its engine core with it.
kill -INT "$SERVER_PID"
deadline=$((SECONDS + 30))
while kill -0 "$SERVER_PID" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "tinychat serve did not stop on SIGINT"
    sleep 0.2
done
SERVER_PID=""
grep -qF "Finished server process" "$SERVER_LOG" || fail "the server did not shut down cleanly"
grep -qF '"POST /v1/chat/completions HTTP/1.1" 200' "$SERVER_LOG" || fail "no chat request served"
echo "PASS: tmux connect smoke test"
