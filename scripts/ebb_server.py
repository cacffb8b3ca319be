"""An `ebb serve` child process for the scripts' benchmarks: started on a
free loopback port with an API key, JSON calls, stopped on request."""

import http.client
import json
import re
import subprocess
import sys

KEY = "bench-key"


class Server:
    def __init__(self, ebb, model, threads, extra=(), timeout=300):
        args = [ebb, "serve", "-m", model, "--port", "0", "--quiet", "--api-key", KEY, "-t", str(threads)]
        args += list(extra)
        self.timeout = timeout
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.p.stdout.readline()
        m = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not m:
            self.p.kill()
            sys.exit(f"ebb serve did not start: {line!r}")
        self.port = int(m.group(1))

    def headers(self):
        return {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}

    def call(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        c.request(method, path, None if body is None else json.dumps(body), self.headers())
        r = c.getresponse()
        data = r.read()
        c.close()
        if r.status != 200:
            sys.exit(f"{method} {path}: {r.status} {data[:300]!r}")
        return json.loads(data)

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=30)
