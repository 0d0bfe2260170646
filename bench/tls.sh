#!/usr/bin/env bash
# tls.sh -- TLS next to plaintext in one run: one daemon with a tcp:// and a tls:// listener
# on loopback (certificates made here with openssl, thrown away after), then the 64 MiB
# upload/download (bench/transfer) and the small-op round trips (bench/latency) over each.
#
#   BUILD=build bash bench/tls.sh [MIB]
set -euo pipefail
BUILD=${BUILD:-build}
MIB=${1:-64}
dir=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
cd "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key \
    -out ca.pem -days 1 -subj /CN=bench-ca 2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key \
    -out server.csr -subj /CN=localhost 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
    -days 1 -extfile ext 2>/dev/null
cd - >/dev/null
"$BUILD/tensordd" --listen tcp://127.0.0.1:0 --listen tls://127.0.0.1:0 \
    --tls-cert "$dir/server.pem" --tls-key "$dir/server.key" --log-level warn >"$dir/out" &
pid=$!
for _ in $(seq 200); do [ "$(grep -c "listening on" "$dir/out")" = 2 ] && break; sleep 0.05; done
plain=$(sed -n 's/^listening on \(tcp:.*\)/\1/p' "$dir/out")
tls=$(sed -n 's/^listening on \(tls:.*\)/\1/p' "$dir/out")
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr), $(openssl version)"
for ep in "$plain" "$tls"; do
    echo
    echo "== $ep"
    TENSORDD_CA_FILE="$dir/ca.pem" "$BUILD/bench/transfer" "$ep" "$pid" "$MIB" --reps 3
    TENSORDD_CA_FILE="$dir/ca.pem" "$BUILD/bench/latency" "$ep"
done
kill -TERM "$pid"
wait "$pid"
pid=
