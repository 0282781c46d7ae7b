#!/usr/bin/env python3
"""Block until the vLLM server can serve: /health answers 200 AND a one-token completion with the
served model name succeeds. Used as the unit's ExecStartPost, so `systemctl start` returns only
then. vLLM has no sd_notify and /health alone is not proof (the engine can die at the first request).

Standard library only: it runs on the bundle's python or the system's; `rocmdoctor serve` loads
this same file for its own readiness test. VLLM_API_KEY, when the unit's
environment file sets it, is sent as the bearer token.

systemd does not stop ExecStartPost when the main process dies, so the wait also ends when the
process in $MAINPID (set by systemd for control processes) is gone.

Every request ends by the overall deadline (connect, status line, headers and body, wall clock),
every body is capped, and any answer that is not a completion is "not ready" with the reason:
this script never ends in a traceback, so systemd fails the start with a message, not a crash.

usage: wait-ready URL MODEL TIMEOUT_S
exit 0 ready, 1 not ready in time, the server exited, or the completion failed; 2 bad arguments.
"""

import http.client
import json
import math
import os
import socket
import sys
import threading
import time
import urllib.parse

POLL_S = 2.0
HEALTH_TIMEOUT_S = 5.0
COMPLETION_TIMEOUT_S = 120.0
HEALTH_BYTES = 64 * 1024
# A one-token completion is a few hundred bytes; an error page a few kB.
COMPLETION_BYTES = 1024 * 1024


class NotReady(Exception):
    """The request did not give an answer that can be judged; the message says why."""


def request(url, body=None, timeout=30.0, key=None, cap=COMPLETION_BYTES):
    """(status, body) within `timeout` seconds in all, at most `cap` bytes; NotReady otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotReady("%r is not an http(s) URL" % url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    if key:
        headers["Authorization"] = "Bearer " + key
    data = None if body is None else json.dumps(body).encode()
    timeout = max(timeout, 0.001)
    connection = connection_class(parts.hostname, parts.port, timeout=timeout)
    # The socket timeout bounds each wait; this timer bounds them all: at the deadline it shuts the
    # socket, which ends a read of a server that sends one byte a second.
    expired = threading.Event()

    def expire():
        expired.set()
        sock = connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        connection.request("GET" if body is None else "POST", parts.path or "/", body=data, headers=headers)
        reply = connection.getresponse()
        length = reply.getheader("Content-Length")
        if (
            length
            and (length.strip().isascii() and length.strip().isdecimal() and len(length.strip()) < 20)
            and int(length) > cap
        ):
            raise NotReady("%s answered %s bytes, more than %d" % (parts.path, length.strip(), cap))
        payload = reply.read(cap + 1)
        if len(payload) > cap:
            raise NotReady("%s answered more than %d bytes" % (parts.path, cap))
        if expired.is_set():
            raise NotReady("%s did not answer in full in the %.3g s left" % (parts.path, timeout))
        return reply.status, payload
    except NotReady:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if expired.is_set() or isinstance(exc, socket.timeout):
            raise NotReady("%s did not answer in full in the %.3g s left" % (parts.path, timeout)) from None
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, http.client.HTTPException):
            reason = "not a valid HTTP answer (%s: %s)" % (type(exc).__name__, reason)
        raise NotReady("%s: %s" % (parts.path, reason[:300])) from None
    finally:
        timer.cancel()
        connection.close()


def healthy(base, timeout=HEALTH_TIMEOUT_S):
    try:
        return request(base + "/health", timeout=min(timeout, HEALTH_TIMEOUT_S), cap=HEALTH_BYTES)[0] == 200
    except NotReady:
        return False


def _text_of(document):
    """The first choice's text, or why the answer is not a completion."""
    if not isinstance(document, dict):
        kinds = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
        return None, "the completion answer is %s, not a JSON object" % kinds.get(type(document), "null")
    choices = document.get("choices")
    if not isinstance(choices, list) or not choices:
        return None, "the completion answer has no choices list (choices=%.80r)" % (choices,)
    if not isinstance(choices[0], dict) or not isinstance(choices[0].get("text"), str):
        return None, "choices[0] of the completion answer carries no text (%.80r)" % (choices[0],)
    return choices[0]["text"], None


def completion(base, model, key=None, timeout=COMPLETION_TIMEOUT_S):
    """None when a token came back, else why not."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    try:
        status, raw = request(base + "/v1/completions", body, timeout=timeout, key=key)
    except NotReady as exc:
        return str(exc)
    if status != 200:
        return "HTTP %d: %s" % (status, raw[:300].decode(errors="replace"))
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return "the completion answer is not JSON: %.80r" % raw[:80]
    return _text_of(document)[1]


def alive(pid):
    """False once the process has exited (gone, or a zombie systemd has not reaped yet)."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read(4096).rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _arguments(argv):
    if len(argv) != 4:
        raise ValueError("expected URL MODEL TIMEOUT_S")
    try:
        timeout = float(argv[3])
    except ValueError:
        raise ValueError("TIMEOUT_S %r is not a number of seconds" % argv[3]) from None
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError("TIMEOUT_S %r is not a positive number of seconds" % argv[3])
    try:
        main_pid = int(os.environ.get("MAINPID") or 0)
    except ValueError:
        main_pid = 0
    return argv[1].rstrip("/"), argv[2], timeout, main_pid


def wait(base, model, timeout, main_pid, key):
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    while time.monotonic() < deadline:
        if main_pid and not alive(main_pid):
            print("the server (pid %d) exited while loading; see its log above" % main_pid, file=sys.stderr)
            return 1
        if healthy(base, deadline - time.monotonic()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            problem = completion(base, model, key, min(left, COMPLETION_TIMEOUT_S))
            if problem is None:
                print("ready after %.0f s: %s serves %s" % (time.monotonic() - started, base, model))
                return 0
            print("healthy but the completion failed: %s" % problem, file=sys.stderr)
            return 1
        time.sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))
    print("not ready after %.0f s: %s/health never answered 200" % (timeout, base), file=sys.stderr)
    return 1


def main(argv):
    try:
        base, model, timeout, main_pid = _arguments(argv)
    except ValueError as exc:
        print("wait-ready: %s\n%s" % (exc, __doc__.strip().splitlines()[-2]), file=sys.stderr)
        return 2
    try:
        return wait(base, model, timeout, main_pid, os.environ.get("VLLM_API_KEY"))
    except KeyboardInterrupt:
        print("not ready: interrupted", file=sys.stderr)
        return 1
    except Exception as exc:
        print(
            "not ready: the readiness test failed unexpectedly: %s: %s" % (type(exc).__name__, exc),
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
