#!/usr/bin/env python3
"""Robustness measurements on the CPU with the built-in model (issue 14's closing note):

  1. time from a client's disconnect to its request being freed (engine running + waiting back to 0
     on /metrics), for a streaming and a non-streaming request;
  2. first-token delay of a short request sent while a long prompt prefills, with the long prefill
     uncapped (--long-prefill-token-threshold = --max-num-batched-tokens, the behaviour before the
     fix) and with the default cap;
  3. strict-JSON validity over N requests at temperature 1 (response_format json_schema, strict).

Starts `tandem serve` on 127.0.0.1:PORT (one server per configuration, killed at the end) and writes
bench/results/robustness-builtin-<date>.json with date, commit, cpu, cores and load (the machine is
shared: the load explains slow numbers).

  python3 tools/robustness_bench.py [--build build] [--model models/builtin] [--port 18150]
"""
import argparse
import datetime
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd=ROOT).stdout.strip().splitlines()[0]
    except (IndexError, OSError):
        return ""


def run_info():
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": os.environ.get("TANDEM_COMMIT") or sh("git rev-parse --short HEAD"),
        "cpu": sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'"),
        "cpu_cores": sh("nproc"),
        "loadavg": sh("cut -d' ' -f1-3 /proc/loadavg"),
    }


class Server:
    def __init__(self, binary, model, port, extra):
        self.port = port
        self.log = open(f"/tmp/tandem-robustness-{port}.log", "w")
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", model, "--served-model-name", "builtin", "--host", "127.0.0.1",
             "--port", str(port)] + extra, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited during start-up; see {self.log.name}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit("server not ready after 600 s")

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()

    def post(self, path, body, timeout=600):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode()

    def active(self):
        """Requests the engine holds (running + waiting), from /metrics."""
        n = 0
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                n += int(float(line.rsplit(" ", 1)[1]))
        return n

    def raw(self, path, body):
        s = socket.create_connection(("127.0.0.1", self.port))
        b = json.dumps(body).encode()
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(b)}\r\n\r\n".encode() + b)
        return s

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def wait_until(pred, timeout, step=0.01):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return False


def disconnect_to_freed(srv, stream, reps):
    times = []
    body = {"model": "builtin", "messages": [{"role": "user", "content": "Write a long story about a robot."}],
            "max_tokens": 4000, "temperature": 0, "ignore_eos": True, "stream": stream}
    for _ in range(reps):
        s = srv.raw("/v1/chat/completions", body)
        if stream:
            s.recv(4096)  # headers and the first events: it is decoding
        else:
            wait_until(lambda: srv.active() == 1, 60)
        time.sleep(1.0)  # well into its decode
        t0 = time.time()
        s.close()
        freed = wait_until(lambda: srv.active() == 0, 120)
        times.append(time.time() - t0 if freed else float("inf"))
    return times


def first_token_delay(srv, long_tokens, reps):
    rng = random.Random(7)
    out = []
    for rep in range(reps):
        long_prompt = [rng.randrange(100, 8000) for _ in range(long_tokens)]
        result = {}

        def long_req():
            t = time.time()
            srv.post("/v1/completions", {"model": "builtin", "prompt": long_prompt, "max_tokens": 1, "temperature": 0})
            result["long_s"] = time.time() - t

        th = threading.Thread(target=long_req)
        th.start()
        wait_until(lambda: srv.active() >= 1, 30)
        time.sleep(1.0)  # the long prefill is under way
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=600)
        t0 = time.time()
        c.request("POST", "/v1/completions",
                  json.dumps({"model": "builtin", "prompt": f"Hello {rep}", "max_tokens": 2, "temperature": 0,
                              "stream": True}), {"Content-Type": "application/json"})
        r = c.getresponse()
        ttft = None
        while True:
            line = r.fp.readline()
            if not line:
                break
            if line.startswith(b"data: {") and b'"text":""' not in line:
                ttft = time.time() - t0
                break
        c.close()  # the first token is all we wait for (closing cancels the rest)
        th.join()
        out.append({"short_first_token_s": ttft, "long_request_s": result.get("long_s")})
    return out


def strict_json_validity(srv, n, concurrency):
    body = {"model": "builtin", "temperature": 1.0, "max_tokens": 128,
            "messages": [{"role": "user", "content": "Describe a person as JSON with name, age and tags."}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "strict": True, "schema": SCHEMA}}}
    results = []
    lock = threading.Lock()
    idx = iter(range(n))

    def worker():
        while True:
            with lock:
                i = next(idx, None)
            if i is None:
                return
            b = dict(body, seed=1000 + i)
            status, text = srv.post("/v1/chat/completions", b)
            ok, tokens, finish, ws = False, 0, None, 0
            if status == 200:
                j = json.loads(text)
                content = j["choices"][0]["message"]["content"] or ""
                finish = j["choices"][0]["finish_reason"]
                tokens = j["usage"]["completion_tokens"]
                ws = sum(content.count(c) for c in " \n\t\r")
                try:
                    v = json.loads(content)
                    ok = (isinstance(v, dict) and set(v) == {"name", "age", "tags"} and isinstance(v["name"], str)
                          and isinstance(v["age"], int) and isinstance(v["tags"], list))
                except ValueError:
                    ok = False
            with lock:
                results.append({"valid": ok, "tokens": tokens, "finish": finish, "whitespace_chars": ws})

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    valid = sum(r["valid"] for r in results)
    return {"requests": n, "valid": valid, "valid_fraction": valid / max(n, 1),
            "finish_length": sum(r["finish"] == "length" for r in results),
            "mean_completion_tokens": statistics.mean(r["tokens"] for r in results) if results else 0,
            "mean_whitespace_chars": statistics.mean(r["whitespace_chars"] for r in results) if results else 0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="models/builtin")
    ap.add_argument("--port", type=int, default=18150)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--long-tokens", type=int, default=12000)
    ap.add_argument("--json-requests", type=int, default=100)
    ap.add_argument("--only", default="disconnect,prefill,json")
    a = ap.parse_args()
    binary = os.path.join(ROOT, a.build, "tandem")
    only = set(a.only.split(","))
    out = run_info()
    out["model"] = a.model
    out["load_before_" + a.only.replace(",", "_")] = out.pop("loadavg")
    common = ["--max-num-batched-tokens", "2048", "--max-model-len", str(a.long_tokens + 4096), "--kv-cache-memory", "1G"]

    if "disconnect" in only or "json" in only:
        srv = Server(binary, a.model, a.port, common)
        try:
            if "disconnect" in only:
                for stream in (True, False):
                    t = disconnect_to_freed(srv, stream, a.reps)
                    key = "disconnect_to_freed_s_" + ("stream" if stream else "unary")
                    out[key] = {"each": [round(x, 3) for x in t], "median": round(statistics.median(t), 3),
                                "max": round(max(t), 3)}
                    print(key, out[key], flush=True)
            if "json" in only:
                out["strict_json_temperature_1"] = strict_json_validity(srv, a.json_requests, 4)
                print("strict_json", out["strict_json_temperature_1"], flush=True)
        finally:
            srv.stop()

    if "prefill" in only:
        for name, extra in (("uncapped_before", ["--long-prefill-token-threshold", "2048"]), ("default_after", [])):
            srv = Server(binary, a.model, a.port, common + extra)
            try:
                runs = first_token_delay(srv, a.long_tokens, a.reps)
            finally:
                srv.stop()
            ttfts = [r["short_first_token_s"] for r in runs if r["short_first_token_s"] is not None]
            out["short_first_token_during_long_prefill_" + name] = {
                "long_prompt_tokens": a.long_tokens, "flags": extra, "runs": runs,
                "median_s": round(statistics.median(ttfts), 3) if ttfts else None}
            print(name, out["short_first_token_during_long_prefill_" + name], flush=True)

    out["load_after_" + a.only.replace(",", "_")] = sh("cut -d' ' -f1-3 /proc/loadavg")
    path = os.path.join(ROOT, "bench", "results", f"robustness-builtin-{out['date']}.json")
    if os.path.exists(path):  # a partial run (--only) updates that day's file
        with open(path) as f:
            merged = json.load(f)
        merged.update(out)
        out = merged
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    sys.exit(main())
