#!/usr/bin/env python3
"""A scoring server in OpenRLHF's remote reward protocol, for tests of the remote reward client.

    reward_server.py PORT MODE

POST {"query": [...], "prompts": [...], "labels": [...], ...} answers {"rewards": [...]}: 1.0 where
the query ends with its label, else 0.0. MODE changes that:
  ok          as above
  slow        sleeps 5 s before answering
  malformed   answers "this is not json"
  wrong_count one reward too few
  not_number  a string among the rewards
  flaky       HTTP 503 to the first two requests, then as ok
  bad_request HTTP 400 {"error": "labels missing"}
  length      len(query) / 1000: a score that differs from response to response
The number of requests served is written to PORT.count, and the last request's body to
PORT.request.json, in this server's working directory.
"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, MODE = int(sys.argv[1]), sys.argv[2]
served = 0


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, text):
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        global served
        served += 1
        with open(f"{PORT}.count", "w") as out:
            out.write(str(served))
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        with open(f"{PORT}.request.json", "wb") as out:
            out.write(raw)
        body = json.loads(raw)
        rewards = [1.0 if q.endswith(str(label)) else 0.0 for q, label in zip(body["query"], body["labels"])]
        if MODE == "length":
            rewards = [len(q) / 1000.0 for q in body["query"]]
        if MODE == "slow":
            time.sleep(5)
        if MODE == "malformed":
            return self.reply(200, "this is not json")
        if MODE == "wrong_count":
            return self.reply(200, json.dumps({"rewards": rewards[:-1]}))
        if MODE == "not_number":
            return self.reply(200, json.dumps({"rewards": ["high"] + rewards[1:]}))
        if MODE == "flaky" and served <= 2:
            return self.reply(503, json.dumps({"error": "warming up"}))
        if MODE == "bad_request":
            return self.reply(400, json.dumps({"error": "labels missing"}))
        self.reply(200, json.dumps({"rewards": rewards}))


server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print("serving", flush=True)
server.serve_forever()
