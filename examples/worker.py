#!/usr/bin/env python3
"""A Turnstone worker in plain Python (standard library only).

Turnstone POSTs a DecisionRequest to this endpoint for every decision of the agents that
name it as their `worker`; the worker answers with a DecisionResponse: the messages to record
and the actions to take. Here the worker accepts the engine's proposal for everything except
`tool.execute`, where it runs the tool and answers with a `tool.result` (or `tool.error`).

    TURNSTONE_WORKER_SECRET=dev-secret python3 examples/worker.py            # listens on :9000
    TURNSTONE_WORKER_SECRET=dev-secret turnstone serve --config examples/worker-agent.toml
    turnstone chat --agent assistant "/tool add {\"a\": 2, \"b\": 40}"

Run the worker's own checks with `python3 examples/worker.py --self-test`.
"""

import datetime
import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = os.environ.get("TURNSTONE_WORKER_SECRET", "")
PORT = int(os.environ.get("PORT", "9000"))
TOLERANCE_SECS = 300


def add(args):
    return args["a"] + args["b"]


def get_time(args):
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


TOOLS = {"add": add, "get_time": get_time}


def verify(header, body, secret, now=None):
    """Checks `X-Turnstone-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`."""
    if not secret:
        return True
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        t = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((now or time.time()) - t) > TOLERANCE_SECS:
        return False
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, v) for k, v in fields.items() if k == "v1")


def decide(request):
    """The DecisionResponse for a DecisionRequest."""
    trigger = request["trigger"]
    if trigger["type"] != "tool.execute":
        return request["proposed"]  # the engine's default: record, call the model, finish
    tool = TOOLS.get(trigger["name"])
    if tool is None or trigger["input"]["status"] != "valid":
        return request["proposed"]  # the engine proposes a terminal tool.error for these
    try:
        result = tool(trigger["input"]["value"])
    except Exception as e:  # a tool failure is the model's news, not the worker's crash
        return {"actions": [{"type": "tool.error", "error": f"{type(e).__name__}: {e}"}]}
    return {"actions": [{"type": "tool.result", "result": result}]}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not verify(self.headers.get("X-Turnstone-Signature", ""), body, SECRET):
            self.send_error(401, "bad signature")
            return
        answer = json.dumps(decide(json.loads(body))).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, fmt, *args):
        sys.stderr.write("worker: " + fmt % args + "\n")


def self_test():
    body = b'{"x":1}'
    t = int(time.time())
    sig = hmac.new(b"s", f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    assert verify(f"t={t},v1={sig}", body, "s")
    assert not verify(f"t={t},v1={sig}", body, "other")
    assert not verify(f"t={t - 3600},v1={sig}", body, "s")
    execute = {"type": "tool.execute", "id": "c1", "name": "add", "arguments": "{}", "attempt": 1,
               "input": {"status": "valid", "value": {"a": 2, "b": 40}}}
    assert decide({"trigger": execute, "proposed": {}}) == {"actions": [{"type": "tool.result", "result": 42}]}
    execute["input"]["value"] = {"a": 2}
    assert decide({"trigger": execute, "proposed": {}})["actions"][0]["type"] == "tool.error"
    assert decide({"trigger": {"type": "session.start"}, "proposed": {"agent": {"model": "m"}}}) == {"agent": {"model": "m"}}
    print("worker self-test: 6 passed, 0 failed")


if __name__ == "__main__":
    if "--self-test" in sys.argv:
        self_test()
    else:
        print(f"worker listening on http://127.0.0.1:{PORT}/decide", file=sys.stderr)
        ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
