#!/usr/bin/env python3
"""Two items-service instances on one Postgres: keys written through either
instance or by plain SQL reach both; killed connections and rebuilds during
writes lose no key; concurrent rebuild calls run one rebuild.

    cargo build --release -p items-service
    python3 examples/items-service/scripts/check_two_instances.py

Needs psql and a Postgres server at $PG (default postgres://postgres@127.0.0.1:5432);
creates the database items_two.
"""
import concurrent.futures, http.client, json, os, subprocess, threading, time, urllib.parse

SERVER = os.environ.get("PG", "postgres://postgres@127.0.0.1:5432")
DB = SERVER + "/items_two"
BIN = os.path.join(os.path.dirname(__file__), "../../../target/release/items-service")
TOKEN = "secret"

def psql(url, sql):
    return subprocess.run(["psql", url, "-Atqc", sql], check=True, capture_output=True, text=True).stdout.strip()

psql(SERVER + "/postgres", "drop database if exists items_two with (force)")
psql(SERVER + "/postgres", "create database items_two")

def start(port):
    env = dict(os.environ, DATABASE_URL=DB, ADMIN_TOKEN=TOKEN, BIND_ADDR=f"127.0.0.1:{port}",
               ADMIN_ADDR=f"127.0.0.1:{port + 1}", RUST_LOG="info")
    return subprocess.Popen([BIN], env=env, stdout=open(f"instance-{port}.log", "w"), stderr=subprocess.STDOUT)

def request(port, method, path, body=None, token=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"content-type": "application/json"} if body is not None else {}
    if token:
        headers["authorization"] = "Bearer " + token
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data

def get(port, key):
    try:
        return request(port, "GET", "/items/" + urllib.parse.quote(key, safe=""))[0]
    except OSError:
        return None

A, B = 3200, 3300
instances = [start(A), start(B)]
for port in (A, B):
    while True:
        try:
            if request(port, "GET", "/readyz")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.05)
print("both instances ready")

def stats(port):
    return json.loads(request(port + 1, "GET", "/admin/bloom/items", token=TOKEN)[1])

# 1. Keys through either instance and through plain SQL reach both within a second.
request(A, "POST", "/items", {"key": "via-a"})
request(B, "POST", "/items", {"key": "via-b"})
psql(DB, "insert into items (key) values ('via-psql')")
started = time.time()
pending = {(port, key) for port in (A, B) for key in ("via-a", "via-b", "via-psql")}
while pending and time.time() - started < 1.0:
    pending = {(port, key) for port, key in pending if get(port, key) != 200}
print("keys from A, B and psql on both instances:", "all within 1 s" if not pending else f"MISSING {pending}",
      f"({(time.time() - started) * 1000:.0f} ms)")

# 2. Every database connection of both instances killed 3 times during inserts.
written, lock, stop = [], threading.Lock(), threading.Event()
def writer(port, name):
    i = 0
    while not stop.is_set():
        key = f"{name}-{i}"
        i += 1
        try:
            status, _ = request(port, "POST", "/items", {"key": key})
        except OSError:
            continue
        if status == 201:
            with lock:
                written.append(key)
def sql_writer():
    i = 0
    while not stop.is_set():
        keys = ",".join(f"('sql-{i}-{j}')" for j in range(50))
        i += 1
        try:
            psql(DB, f"insert into items (key) values {keys}")
            with lock:
                written.extend(f"sql-{i - 1}-{j}" for j in range(50))
        except subprocess.CalledProcessError:
            pass
threads = [threading.Thread(target=writer, args=(A, "a")), threading.Thread(target=writer, args=(B, "b")),
           threading.Thread(target=sql_writer)]
for t in threads:
    t.start()
killed = 0
for _ in range(3):
    time.sleep(1.5)
    killed += int(psql(SERVER + "/postgres", "select count(*) from (select pg_terminate_backend(pid) from pg_stat_activity "
                       "where datname = 'items_two' and pid <> pg_backend_pid()) k"))
time.sleep(1.0)
stop.set()
for t in threads:
    t.join()
print(f"killed {killed} connections in 3 rounds while {len(written)} keys were written")
time.sleep(30)
missing = [(port, k) for port in (A, B) for k in written if get(port, k) != 200]
print("30 s later, keys not answered 200:", len(missing), missing[:5])

# 3. A rebuild during continuous writes loses none of them.
written.clear()
stop.clear()
threads = [threading.Thread(target=writer, args=(B, "during-rebuild")), threading.Thread(target=sql_writer)]
for t in threads:
    t.start()
time.sleep(0.5)
generation = stats(A)["generation"]
status, _ = request(A + 1, "POST", "/admin/bloom/items/rebuild", token=TOKEN)
time.sleep(0.5)
stop.set()
for t in threads:
    t.join()
missing = [(port, k) for port in (A, B) for k in written if get(port, k) != 200]
print(f"rebuild during writes: status {status}, generation {generation} -> {stats(A)['generation']}, "
      f"{len(written)} keys written, not answered 200: {len(missing)}")

# 4. Ten concurrent rebuild calls run one rebuild.
time.sleep(6)  # past the cool-down
generation = stats(A)["generation"]
with concurrent.futures.ThreadPoolExecutor(10) as pool:
    statuses = list(pool.map(lambda _: request(A + 1, "POST", "/admin/bloom/items/rebuild", token=TOKEN)[0], range(10)))
print(f"10 concurrent rebuild calls: statuses {sorted(set(statuses))}, generation {generation} -> {stats(A)['generation']}")

for p in instances:
    p.terminate()
    p.wait()
