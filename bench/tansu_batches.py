"""Per-batch stage times on Tansu with small batches (2,500 records per
partition): shows planning and fetch time of every batch, for passthrough
and company -> SQLite. Usage: python3 bench/tansu_batches.py (after
bench/run.sh has built everything; SLUICE_HOST picks the binary)."""
import sys, os, subprocess, time, json, tempfile, statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R
work = tempfile.mkdtemp(prefix="td-")
with R.Tansu() as b:
    subprocess.run([os.path.join(R.REL, "produce"), b.bootstrap, "maxwell", str(R.PARTS), str(R.EVENTS), work + "/exp.json"], check=True, capture_output=True)
    for plugin in ("passthrough", "company"):
        args = [R.HOST, "run", "--brokers", b.bootstrap, "--topic", "maxwell", "--checkpoint", f"{work}/ck{plugin}", "--plugin", f"{R.WASM}/{plugin}.wasm", "--until-caught-up", "--progress", "json", "--max-records-per-partition", "2500", "--trigger-interval", "10ms"]
        if plugin == "company": args += ["--sink-db", f"sqlite:{work}/db.db"]
        t0 = time.perf_counter()
        p = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, RUST_LOG="warn"))
        print(plugin, "wall", round(time.perf_counter() - t0, 3))
        for l in p.stdout.splitlines():
            e = json.loads(l); d = e["durations_ms"]
            print(e["batch_id"], e["total_ms"], {k: round(v) for k, v in d.items()})
