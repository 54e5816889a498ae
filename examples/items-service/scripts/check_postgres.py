#!/usr/bin/env python3
"""End-to-end check on Postgres: 200 000 rows inserted by plain SQL, every
existing key answers 200, and random absent keys stay off Postgres.

    cargo build --release -p items-service
    createdb -h 127.0.0.1 -U postgres items_e2e
    python3 examples/items-service/scripts/check_postgres.py

Set BLOOM_GUARD=off in the environment to measure the unguarded service.
Postgres statistics are flushed lazily, hence the pauses around the counts.
"""
import http.client, json, os, random, string, subprocess, sys, time, urllib.parse
DB = os.environ.get("E2E_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/items_e2e")
BIN = os.path.join(os.path.dirname(__file__), "../../../target/release/items-service")
def psql(sql):
    return subprocess.run(["psql", DB, "-Atqc", sql], check=True, capture_output=True, text=True).stdout.strip()
env = dict(BLOOM_GUARD="on") | dict(os.environ) | dict(DATABASE_URL=DB, ADMIN_TOKEN="secret", BIND_ADDR="127.0.0.1:3100", ADMIN_ADDR="127.0.0.1:3101", RUST_LOG="info")
# Migrations come from the service: start it once on the empty database, then insert by plain SQL.
svc = subprocess.Popen([BIN], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
time.sleep(2); svc.terminate(); svc.wait()
psql("truncate items")
psql("insert into items (key) select 'key-' || g || case when g % 1000 = 0 then E'/tab\\there ü' else '' end from generate_series(1, 200000) g")
keys = psql("select key from items").split("\n")
print("rows", len(keys))
t0 = time.time()
svc = subprocess.Popen([BIN], env=env, stdout=open("items-service-e2e.log", "w"), stderr=subprocess.STDOUT)
conn = None
while True:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", 3100); conn.request("GET", "/readyz"); r = conn.getresponse(); r.read()
        if r.status == 200: break
    except OSError: time.sleep(0.05)
print("ready after %.2fs" % (time.time() - t0))
def get(key):
    conn.request("GET", "/items/" + urllib.parse.quote(key, safe=""))
    r = conn.getresponse(); r.read(); return r.status
bad = [k for k in keys if get(k) != 200]
print("existing keys not 200:", len(bad), bad[:5])
def scans(): return int(psql("select coalesce(idx_scan,0) + coalesce(seq_scan,0) from pg_stat_user_tables where relname = 'items'"))
time.sleep(11)
before = scans()
N = 100000
rnd = random.Random(7)
statuses = {}
for _ in range(N):
    k = "".join(rnd.choices(string.ascii_letters + string.digits, k=16))
    s = get(k); statuses[s] = statuses.get(s, 0) + 1
time.sleep(11)
after = scans()
if env["BLOOM_GUARD"] != "off":
    admin = http.client.HTTPConnection("127.0.0.1", 3101); admin.request("GET", "/admin/bloom/items", headers={"authorization": "Bearer secret"}); stats = json.loads(admin.getresponse().read())
print("absent statuses", statuses)
print("table scans during %d absent requests: %d (%.3f%% reached Postgres)" % (N, after - before, 100.0 * (after - before) / N))
    print("stats", stats)
svc.terminate(); svc.wait()
