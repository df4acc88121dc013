# Sourced by serve_cpu.sh and serve_pair.sh: servers of `schedsvc bench serve` and wrk's POST of its row.

# ready_port LOG: wait (60 s at most) until the server logging to LOG printed "ready PORT"; print PORT.
ready_port() {
    for _ in $(seq 1 300); do
        grep -q '^ready ' "$1" && break
        sleep 0.2
    done
    awk '/^ready /{print $2}' "$1"
}

# write_post DIR MODEL PYTHON: DIR/post.lua, a wrk script that POSTs the bench's row of MODEL (DIR/body.json).
write_post() {
    "$3" -c "import json, sys; from schedsvc.cli.bench._serve_app import request_row
print(json.dumps({'x': request_row(sys.argv[1])}))" "$2" > "$1/body.json"
    cat > "$1/post.lua" <<LUA
wrk.method = "POST"
local f = io.open("$1/body.json"); wrk.body = f:read("*a"); f:close()
wrk.headers["Content-Type"] = "application/json"
LUA
}
