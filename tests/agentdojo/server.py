"""AgentDojo replay server for one suite, on a Unix socket.

    VENV/bin/python server.py --suite S --socket PATH --pairs DIR/S/pairs.json

One JSON request per line, one JSON reply per line; any number of connections
(served one request at a time). Prints `ready` on stdout once listening; exits on
EOF of stdin, SIGTERM or SIGINT, removing the socket. Ops (README.md has the
full interface):
  {"op": "reset", "user_task": U, "injection_task": I}  -> {"ok": true}
  {"op": "call", "function": F, "args": {...}}          -> {"ok": true, "result": "..."} | {"ok": false, "error": "..."}
  {"op": "executed"}                                     -> {"ok": true, "calls": [{"function", "args", "ok"}...]}
  {"op": "security"}                                     -> {"ok": true, "attacker_succeeded": bool}
  {"op": "utility"}                                      -> {"ok": true, "utility": bool}
  {"op": "ping"}                                         -> {"ok": true, "suite": S}
A request the harness itself cannot serve (bad JSON, unknown op, no reset yet)
gets {"ok": false, "error": "...", "harness": true}.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import dojo_lib as dl  # noqa: E402

MAX_LINE = 16 * 1024 * 1024


class HarnessError(Exception):
    pass


def _str_field(req: dict, key: str, required: bool = True) -> str | None:
    value = req.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise HarnessError(f"{key!r} must be a string")
    return value


def _model_output(req: dict) -> str:
    value = req.get("model_output", "")
    if not isinstance(value, str):
        raise HarnessError("'model_output' must be a string")
    return value


def handle(replay: dl.Replay, req) -> dict:
    if not isinstance(req, dict):
        raise HarnessError("a request is a JSON object")
    op = req.get("op")
    if op == "ping":
        return {"ok": True, "suite": replay.suite_name}
    if op == "reset":
        user_task = _str_field(req, "user_task")
        injection_task = _str_field(req, "injection_task", required=False)
        injections = req.get("injections")
        if injections is not None and not (
            isinstance(injections, dict) and all(isinstance(v, str) for v in injections.values())
        ):
            raise HarnessError("'injections' must be an object of strings")
        try:
            replay.reset(user_task, injection_task, injections)
        except ValueError as e:
            raise HarnessError(str(e)) from e
        return {"ok": True}
    if replay.env is None:
        raise HarnessError("no environment: send reset first")
    if op == "call":
        function = _str_field(req, "function")
        args = req.get("args", {})
        if not isinstance(args, dict):
            raise HarnessError("'args' must be an object")
        ok, text = replay.call(function, args)
        return {"ok": True, "result": text, "data": dl.structured(text)} if ok else {"ok": False, "error": text}
    if op == "executed":
        return {"ok": True, "calls": replay.log}
    if op == "security":
        if replay.injection_task is None:
            raise HarnessError("this reset had no injection task")
        return {"ok": True, "attacker_succeeded": replay.security(_model_output(req))}
    if op == "utility":
        return {"ok": True, "utility": replay.utility(_model_output(req))}
    raise HarnessError(f"unknown op {op!r}")


def answer(replay: dl.Replay, line: bytes) -> bytes:
    try:
        try:
            req = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise HarnessError(f"bad JSON: {e}") from e
        reply = handle(replay, req)
    except HarnessError as e:
        reply = {"ok": False, "error": str(e), "harness": True}
    except Exception as e:  # a bug here or in AgentDojo's checks: report, keep serving
        traceback.print_exc(file=sys.stderr)
        reply = {"ok": False, "error": f"internal error: {type(e).__name__}: {e}", "harness": True}
    return (json.dumps(reply) + "\n").encode("utf-8")


class Stop(Exception):
    pass


def serve(replay: dl.Replay, path: str, watch_stdin: bool) -> None:
    sock_path = Path(path)
    sock_path.parent.mkdir(parents=True, exist_ok=True)
    if sock_path.exists() or sock_path.is_symlink():
        sock_path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(16)
    listener.setblocking(False)

    def on_signal(signum, frame):
        raise Stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listen")
    if watch_stdin:
        sel.register(sys.stdin.buffer, selectors.EVENT_READ, "stdin")
    buffers: dict[socket.socket, bytearray] = {}
    try:
        print("ready", flush=True)
        while True:
            for key, _ in sel.select():
                if key.data == "listen":
                    try:
                        conn, _ = listener.accept()
                    except BlockingIOError:
                        continue
                    conn.setblocking(True)
                    conn.settimeout(30)
                    sel.register(conn, selectors.EVENT_READ, "conn")
                    buffers[conn] = bytearray()
                elif key.data == "stdin":
                    if not os.read(sys.stdin.fileno(), 65536):
                        raise Stop()
                else:
                    conn = key.fileobj
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        chunk = b""
                    buf = buffers[conn]
                    if chunk:
                        buf += chunk
                    closed = not chunk
                    try:
                        while b"\n" in buf:
                            line, _, rest = bytes(buf).partition(b"\n")
                            buf[:] = rest
                            if line.strip():
                                conn.sendall(answer(replay, line))
                        if closed and buf.strip():
                            conn.sendall(answer(replay, bytes(buf)))
                            buf.clear()
                        if len(buf) > MAX_LINE:
                            conn.sendall(answer(replay, b"\x00line too long"))
                            closed = True
                    except OSError:
                        closed = True
                    if closed:
                        sel.unregister(conn)
                        buffers.pop(conn, None)
                        conn.close()
    except Stop:
        pass
    finally:
        for conn in list(buffers):
            conn.close()
        listener.close()
        try:
            sock_path.unlink()
        except FileNotFoundError:
            pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", required=True, choices=dl.SUITES)
    p.add_argument("--socket", required=True)
    p.add_argument("--pairs", required=True, type=Path, help="DIR/<suite>/pairs.json written by export.py")
    p.add_argument(
        "--no-stdin", action="store_true", help="do not exit on EOF of stdin (for running by hand in the background)"
    )
    p.add_argument(
        "--exact-yaml",
        action="store_true",
        help="parse environments with PyYAML's pure-Python parser, as AgentDojo does "
        "(default: libyaml, which export.py checks gives the same environments; 4-6x faster resets)",
    )
    a = p.parse_args()
    dl.use_libyaml(not a.exact_yaml)
    try:
        pairs = json.loads(a.pairs.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"server.py: cannot read {a.pairs}: {e}", file=sys.stderr)
        return 1
    replay = dl.Replay(a.suite, pairs)
    serve(replay, os.path.abspath(a.socket), watch_stdin=not a.no_stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
