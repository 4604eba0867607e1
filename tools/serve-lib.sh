# Sourced by the scripts that start `tandem serve --port 0` in the background.
# wait_for_port NAME LOG PID TIMEOUT_S: sets PORT from the server's "ready on" line; on an early exit
# or a timeout prints the log and exits 1.
wait_for_port() {
  local name=$1 log=$2 pid=$3 timeout=$4
  PORT=""
  for _ in $(seq 1 "$timeout"); do
    PORT=$(sed -n 's#^tandem serve: ready on http://127.0.0.1:\([0-9]*\)$#\1#p' "$log" | head -1)
    [[ -n "$PORT" ]] && return 0
    kill -0 "$pid" 2>/dev/null || { echo "$name: server exited during start-up"; cat "$log"; exit 1; }
    sleep 1
  done
  echo "$name: server not ready"
  cat "$log"
  exit 1
}
