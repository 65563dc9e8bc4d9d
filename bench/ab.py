"""Interleaved A/B of host binaries on the mock cluster: runs each binary's
`host run --until-caught-up --progress json` in turn, N rounds, and prints
medians of wall time, the stage times summed over all batches and CPU time
(ms), and of peak RSS (MiB).

Usage: N=7 PLUGIN=passthrough|company python3 bench/ab.py HOST_A HOST_B ...
(release helpers, plugins and Tansu as built by bench/run.sh; EVENTS and
PARTITIONS as in bench/run.py; BATCH is --max-records-per-partition,
default 20000; ARGS, split on spaces, is added to every `host run`). A
HOST given as `HOST@DIR` runs `DIR/<PLUGIN>.wasm` instead of the release build's, so a plugin can be
compared too (`old/host@old old/host@new` times two builds of one plugin
under one host)."""
import sys, os, subprocess, time, json, tempfile, statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R
plugin = os.environ.get("PLUGIN", "passthrough")
N = int(os.environ.get("N", "7"))
BATCH = os.environ.get("BATCH", "20000")
hosts = sys.argv[1:]
def split(h):
    b, _, d = h.partition("@")
    return b, (d or R.WASM)
work = tempfile.mkdtemp(prefix="ab2-")
res = {h: {"wall": [], "total": [], "fetch": [], "map": [], "sink": [], "cpu": [], "plan": [], "commit": [], "rss": []} for h in hosts}
with R.Mock() as b:
    subprocess.run([os.path.join(R.REL, "produce"), b.bootstrap, "maxwell", str(R.PARTS), str(R.EVENTS), work + "/exp.json"], check=True, capture_output=True)
    for i in range(N):
        for h in hosts:
            binary, wasm = split(h)
            tag = h.replace("/", "_")
            ck = f"{work}/ck{i}{tag}"
            args = [binary, "run", "--brokers", b.bootstrap, "--topic", "maxwell", "--checkpoint", ck, "--plugin", f"{wasm}/{plugin}.wasm", "--until-caught-up", "--progress", "json", "--max-records-per-partition", BATCH, "--trigger-interval", "10ms"]
            if plugin == "company": args += ["--sink-db", f"sqlite:{work}/db{i}{tag}.db"]
            args += os.environ.get("ARGS", "").split()
            t0 = time.perf_counter()
            r0 = os.times()
            p = subprocess.run(["/usr/bin/time", "-f", "TIME %M"] + args, capture_output=True, text=True, env=dict(os.environ, RUST_LOG="warn"))
            wall = time.perf_counter() - t0
            r1 = os.times()
            times = [l for l in p.stderr.splitlines() if l.startswith("TIME ")]
            if p.returncode != 0 or not times or not p.stdout.strip():
                sys.exit(f"{h} failed ({p.returncode}):\n{p.stderr[-2000:]}")
            evs = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
            d = {k: sum(e["durations_ms"][k] for e in evs) for k in evs[0]["durations_ms"]}
            r = res[h]
            r["wall"].append(wall * 1000); r["total"].append(sum(e["total_ms"] for e in evs))
            r["rss"].append(int(times[-1].split()[1]) / 1024)
            for k in ("fetch", "map", "sink", "plan", "commit"): r[k].append(d[k])
            r["cpu"].append(((r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)) * 1000)
print(f"{plugin}, {R.EVENTS} events, medians of {N} (ms)")
print(f"{'host':16} {'wall':>6} {'batch':>6} {'fetch':>6} {'map':>6} {'sink':>6} {'cpu':>6} {'plan':>6} {'commit':>6} {'rss':>6}")
for h in hosts:
    r = res[h]
    print(f"{h[-16:]:16} " + " ".join(f"{statistics.median(r[k]):6.0f}" for k in ("wall", "total", "fetch", "map", "sink", "cpu", "plan", "commit", "rss")))
for h in hosts:
    print(h, "plans", [round(x) for x in res[h]["plan"]], "walls", [round(x) for x in res[h]["wall"]])
