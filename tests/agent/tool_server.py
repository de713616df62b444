#!/usr/bin/env python3
"""A tool service for tests of the HTTP tool (worker/agent/tools.h MakeHttpTool).

    tool_server.py PORT

POST {"name": NAME, "arguments": {...}} answers by arguments["mode"]:
  echo   200, the request's name and arguments as JSON text
  slow   sleeps 5 s, then 200 "late"
  fail   500 "internal trouble"
  big    200 with 2 MiB of "x"
Prints "serving" once listening.
"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, text):
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode = request["arguments"].get("mode", "echo")
        if mode == "slow":
            time.sleep(5)
            self.reply(200, "late")
        elif mode == "fail":
            self.reply(500, "internal trouble")
        elif mode == "big":
            self.reply(200, "x" * (2 << 20))
        else:
            self.reply(200, json.dumps(request, sort_keys=True, ensure_ascii=False))


server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("serving", flush=True)
server.serve_forever()
