"""Helpers shared by the end-to-end check scripts (run by tests/serve_e2e.rs).

Each script gets the server's base URL (`--base http://127.0.0.1:PORT`) and the served model
name, talks to the server through the official `openai` client and through raw HTTP from
the standard library, and exits 0 when every check holds. A failed check prints `FAIL:` and
why, and exits 1.
"""

import argparse
import http.client
import json
import re
import selectors
import socket
import sys
import time
import traceback
import urllib.parse

try:
    import openai
except ImportError as err:  # pragma: no cover - exercised on bare machines only
    sys.stderr.write(
        "FAIL: the official `openai` Python client is not importable (%s).\n"
        "Install it with `python3 -m pip install openai` (.ci/run does).\n" % err
    )
    sys.exit(3)


class CheckFailed(Exception):
    """A check that did not hold."""


def expect(condition, message):
    """Fails the script with `message` unless `condition` holds."""
    if not condition:
        raise CheckFailed(message)


def expect_eq(got, want, what):
    expect(got == want, "%s: got %r, expected %r" % (what, got, want))


def log(*parts):
    print(*parts, flush=True)


def parser(description):
    """An argument parser with the arguments every script gets."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--base", required=True, help="the server, as http://HOST:PORT")
    p.add_argument("--model", required=True, help="the served model name")
    return p


def run(main):
    """Runs `main()`, turning a failed check or an unexpected error into exit status 1."""
    try:
        main()
    except CheckFailed as err:
        log("FAIL: %s" % err)
        sys.exit(1)
    except Exception:  # noqa: BLE001 - any surprise fails the check, with its trace
        log("FAIL: unexpected error")
        traceback.print_exc()
        sys.exit(1)
    log("OK")


def client(base, api_key="no-key", timeout=120.0):
    """The official client for the server, without retries (a failure should show)."""
    return openai.OpenAI(
        base_url=base + "/v1", api_key=api_key, max_retries=0, timeout=timeout
    )


# ---------------------------------------------------------------------------------------
# Raw HTTP
# ---------------------------------------------------------------------------------------


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            raise CheckFailed("the body is not JSON (status %d): %r" % (self.status, self.body[:500]))

    def __repr__(self):
        return "HTTP %d %s" % (self.status, self.body[:500])


def _host_port(base):
    url = urllib.parse.urlsplit(base)
    return url.hostname, url.port


def connection(base, timeout=60.0):
    host, port = _host_port(base)
    return http.client.HTTPConnection(host, port, timeout=timeout)


def request(base, method, path, body=None, token=None, raw=None, headers=None, timeout=60.0):
    """One request on its own connection: `body` is sent as JSON, `raw` as given."""
    conn = connection(base, timeout)
    all_headers = {"Content-Type": "application/json"}
    if token is not None:
        all_headers["Authorization"] = "Bearer %s" % token
    all_headers.update(headers or {})
    data = raw if raw is not None else (None if body is None else json.dumps(body))
    if isinstance(data, str):
        data = data.encode()
    try:
        conn.request(method, path, body=data, headers=all_headers)
        resp = conn.getresponse()
        return Response(resp.status, dict(resp.getheaders()), resp.read().decode("utf-8", "replace"))
    finally:
        conn.close()


def post(base, path, body=None, **kw):
    return request(base, "POST", path, body=body, **kw)


def get(base, path, **kw):
    return request(base, "GET", path, **kw)


def tokenize(base, model, token=None, **what):
    """The /tokenize count of a prompt (`prompt=`) or a chat (`messages=`)."""
    resp = post(base, "/tokenize", dict(model=model, **what), token=token)
    expect_eq(resp.status, 200, "POST /tokenize status (%r)" % resp)
    body = resp.json()
    expect_eq(body["count"], len(body["tokens"]), "/tokenize count vs tokens")
    return body["count"]


def expect_error(resp, status, mentions=(), param=None, what=""):
    """`resp` is an OpenAI-shaped error with `status`, whose message contains every string
    of `mentions` and whose `param` is `param` (when given)."""
    expect_eq(resp.status, status, "%s: status (body %r)" % (what, resp.body[:400]))
    body = resp.json()
    expect("error" in body and isinstance(body["error"], dict), "%s: no `error` object in %r" % (what, body))
    err = body["error"]
    for key in ("message", "type", "param", "code"):
        expect(key in err, "%s: the error has no `%s`: %r" % (what, key, err))
    expect(isinstance(err["message"], str) and err["message"], "%s: empty message %r" % (what, err))
    expect_eq(err["code"], status, "%s: error.code" % what)
    for word in mentions:
        expect(
            str(word) in err["message"],
            "%s: the message does not mention %r: %r" % (what, word, err["message"]),
        )
    if param is not None:
        expect_eq(err["param"], param, "%s: error.param (message %r)" % (what, err["message"]))
    log("  %s -> %d %s (param %r)" % (what, status, err["message"], err["param"]))
    return err


# ---------------------------------------------------------------------------------------
# Raw sockets: requests http.client will not send (a stalled body, a malformed request line,
# a header block too big), and answers read byte by byte with their timing
# ---------------------------------------------------------------------------------------


def raw_socket(base, timeout=10.0):
    """A plain TCP connection to the server."""
    return socket.create_connection(_host_port(base), timeout=timeout)


def host_header(base):
    """The server's HOST:PORT, as a Host header names it."""
    return "%s:%d" % _host_port(base)


def raw_bytes(base, method, path, body=b"", headers=(), length=None):
    """An HTTP/1.1 request as bytes: the request line, Host, `headers` (name, value pairs),
    Content-Length (`length`, else the body's when there is one) and `body`."""
    if isinstance(body, str):
        body = body.encode()
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: %s" % host_header(base)]
    lines += ["%s: %s" % pair for pair in headers]
    if length is not None or body:
        lines.append("Content-Length: %d" % (len(body) if length is None else length))
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def send_raw(sock, data, deadline):
    """Sends `data` until it is all sent, the peer answers or hangs up first (a server may
    refuse a big body before reading it all), or time.monotonic() passes `deadline`: the
    number of bytes sent."""
    sent = 0
    view = memoryview(data)
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while sent < len(data):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready = selector.select(remaining)
            if not ready:
                continue
            if ready[0][1] & selectors.EVENT_READ:
                break
            sock.settimeout(max(remaining, 0.001))
            try:
                sent += sock.send(view[sent : sent + 65536])
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:  # a broken pipe, a reset, a timeout: the peer stopped reading
                break
    return sent


def read_raw(sock, deadline, until_response=False):
    """Reads what the peer sends until it closes the connection (a reset counts as a close),
    time.monotonic() passes `deadline`, or, with `until_response`, a whole response has
    come: (the bytes, when the first of them came or None, when the close came or None)."""
    data = b""
    first_at = closed_at = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        except OSError:
            closed_at = time.monotonic()
            break
        if not chunk:
            closed_at = time.monotonic()
            break
        if first_at is None:
            first_at = time.monotonic()
        data += chunk
        if until_response and parse_raw(data, closed=False) is not None:
            break
    return data, first_at, closed_at


def parse_raw(data, closed=True):
    """The response at the start of `data` (bytes read from a socket) as a Response, or None
    while it is incomplete. `closed`: the peer has closed the connection, so a body with
    neither a length nor chunks ends where the data does."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise CheckFailed("not an HTTP response: %r" % data[:300])
    status = int(parts[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip()] = value.strip()
    length = header(headers, "Content-Length")
    if status in (204, 304):
        body = b""
    elif "chunked" in (header(headers, "Transfer-Encoding") or "").lower():
        body = _dechunk(rest)
        if body is None:
            return None
    elif length is not None:
        if len(rest) < int(length):
            return None
        body = rest[: int(length)]
    elif closed:
        body = rest
    else:
        return None
    return Response(status, headers, body.decode("utf-8", "replace"))


def _dechunk(data):
    """A chunked body's bytes, or None while it is incomplete."""
    body = b""
    while True:
        line, sep, data = data.partition(b"\r\n")
        if not sep:
            return None
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return body
        if len(data) < size + 2:
            return None
        body += data[:size]
        data = data[size + 2 :]


def raw_exchange(base, data, timeout=10.0, until_response=True):
    """Sends the bytes `data` on a connection of its own and reads the answer: (the
    Response or None, the bytes sent, seconds from the start to the close or None)."""
    start = time.monotonic()
    deadline = start + timeout
    sock = raw_socket(base, timeout=timeout)
    try:
        sent = send_raw(sock, data, deadline)
        got, _, closed_at = read_raw(sock, deadline, until_response=until_response)
    finally:
        sock.close()
    response = parse_raw(got, closed=closed_at is not None) if got else None
    return response, sent, None if closed_at is None else closed_at - start


def hang_up(sock):
    """Closes a raw socket at once, as a client that goes away does."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def header(resp_or_headers, name, default=None):
    """A header of a Response (or of a dict of headers), by its name in any case."""
    headers = resp_or_headers.headers if isinstance(resp_or_headers, Response) else resp_or_headers
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return default


# ---------------------------------------------------------------------------------------
# Server-sent events
# ---------------------------------------------------------------------------------------


class RawStream:
    """A streamed generation read event by event over a raw connection, so that a test can
    stop reading, or close the socket, whenever it likes."""

    def __init__(self, base, path, body, token=None, timeout=120.0):
        self.conn = connection(base, timeout)
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if token is not None:
            headers["Authorization"] = "Bearer %s" % token
        self.conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        self.resp = self.conn.getresponse()
        self.status = self.resp.status

    def events(self):
        """Yields each `data:` payload: parsed JSON, or the string "[DONE]"."""
        data = []
        while True:
            line = self.resp.readline()
            if not line:
                if data:
                    yield _payload(data)
                return
            line = line.decode("utf-8").rstrip("\r\n")
            if line == "":
                if data:
                    yield _payload(data)
                    data = []
                continue
            if line.startswith("data:"):
                data.append(line[5:].lstrip(" "))

    def close(self):
        """Closes the connection at once (a client going away)."""
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conn.close()


def _payload(lines):
    text = "\n".join(lines)
    return text if text == "[DONE]" else json.loads(text)


# ---------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def greedy_completion(api, model, prompt, max_tokens=8):
    """(text, cached_tokens) of a greedy completion of `prompt` that ignores end-of-sequence."""
    out = api.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True}
    )
    details = out.usage.model_dump().get("prompt_tokens_details") or {}
    return out.choices[0].text, details.get("cached_tokens")


def other_prompts(count):
    """`count` prompts of 6 blocks of 16 tokens or more, no two alike, sharing no block with
    each other or with the tier scripts' main prompt: what pushes it out of a small pool."""
    return [("request %d asks about the colour %d of the sky at hour %d. " % (i, i * 7, i * 3)) * 5
            for i in range(count)]


def metrics(base):
    """Every sample of /metrics as {"name{labels}": value} (labels as exported)."""
    resp = get(base, "/metrics")
    expect_eq(resp.status, 200, "GET /metrics status")
    samples = {}
    for line in resp.body.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return samples


def metric(base_or_samples, name, default=0.0):
    """One sample (`name` may carry labels, as `x{a="b"}`); `default` when absent."""
    samples = metrics(base_or_samples) if isinstance(base_or_samples, str) else base_or_samples
    return samples.get(name, default)


IDLE = {
    "peregrine:num_requests_running": 0.0,
    "peregrine:num_requests_waiting": 0.0,
    "peregrine:kv_cache_usage_perc": 0.0,
    "peregrine:kv_block_id_max": -1.0,
}


def idle(samples):
    """`samples` if the KV and queue gauges show an idle server, else None."""
    if all(samples.get(name) == value for name, value in IDLE.items()):
        return samples
    return None


def wait_for(condition, timeout, what, interval=0.05):
    """Polls `condition()` until it returns a true value; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() > deadline:
            raise CheckFailed("%s did not happen within %.1fs" % (what, timeout))
        time.sleep(interval)


# ---------------------------------------------------------------------------------------
# Structured output and tool calls
# ---------------------------------------------------------------------------------------


def _no_duplicate_keys(pairs):
    keys = [key for key, _ in pairs]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise ValueError("duplicate keys %r in one object" % duplicates)
    return dict(pairs)


def parse_json(text, what):
    """`text` parsed as JSON; fails the check when it is not JSON, or when an object in it
    repeats a key (which JSON parsers resolve differently, and which hides a broken
    `minProperties` or `required` from a schema validator)."""
    expect(isinstance(text, str), "%s: the output is not a string: %r" % (what, text))
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except ValueError as err:
        raise CheckFailed("%s: the output is not JSON with unique keys (%s): %r" % (what, err, text))


def validate_json(text, schema, what):
    """`text` parsed as JSON and validated against the JSON schema `schema` with the
    `jsonschema` package (the schema's own draft, 2020-12 when it names none): the value."""
    import jsonschema

    value = parse_json(text, what)
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    errors = sorted(validator_class(schema).iter_errors(value), key=lambda e: list(e.path))
    expect(
        not errors,
        "%s: the output breaks its schema: %s\n  output: %r\n  schema: %s"
        % (what, "; ".join(e.message for e in errors[:5]), text, json.dumps(schema)),
    )
    return value


def expect_fullmatch(pattern, text, what):
    """The whole of `text` matches the regular expression `pattern`."""
    expect(isinstance(text, str), "%s: the output is not a string: %r" % (what, text))
    expect(
        re.fullmatch(pattern, text, flags=re.DOTALL) is not None,
        "%s: %r does not match /%s/ as a whole" % (what, text, pattern),
    )


def names_field(param, fields):
    """Whether an error's `param` names one of `fields`, or a part of one (`field.key`,
    `field[0]...`)."""
    if not isinstance(param, str):
        return False
    return any(param == f or param.startswith(f + ".") or param.startswith(f + "[") for f in fields)


def expect_param_error(resp, fields, what, status=400):
    """`resp` is an OpenAI-shaped error with `status` whose `param` names one of `fields` (a
    name or a list of names), or a part of it."""
    fields = [fields] if isinstance(fields, str) else list(fields)
    err = expect_error(resp, status, what=what)
    expect(
        names_field(err["param"], fields),
        "%s: error.param %r names none of %r (message %r)" % (what, err["param"], fields, err["message"]),
    )
    return err
