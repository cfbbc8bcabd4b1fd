"""Scenario 22: a server under a low open-file limit (`--files`) with the default
`--max-connections` keeps its open files below that limit while more idle connections
arrive than it may accept (each accepted connection holds two files: its socket and the
duplicate that notices a client leaving), and a fresh /health answers once the idle ones
have been dropped after the header timeout (2 s)."""

import os
import time

from check_front_door import probe_idle_connections
from e2e_common import expect, log, parser, raw_socket, run


def open_files(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def main():
    p = parser(__doc__)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--files", type=int, required=True)
    args = p.parse_args()
    idle_before = open_files(args.pid)
    cap = (args.files - 256) // 2
    # 100 past the cap: they wait in the listen backlog (128), where they hold no file of
    # the server's; under one file a connection all of them would have been accepted.
    wanted = cap + 100
    socks, failed, most = [], 0, idle_before
    try:
        for _ in range(wanted):
            try:
                socks.append(raw_socket(args.base, timeout=1.0))
            except OSError:
                failed += 1
            most = max(most, open_files(args.pid))
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            most = max(most, open_files(args.pid))
            time.sleep(0.05)
    finally:
        for sock in socks:
            sock.close()
    log("open files: %d idle, at most %d with %d idle connections, %d failed to open (limit %d, cap %d)"
        % (idle_before, most, len(socks), failed, args.files, cap))
    expect(len(socks) > cap, "only %d connections opened: not past the cap %d" % (len(socks), cap))
    expect(most < args.files - 64,
           "the server held %d open files, too near its limit of %d" % (most, args.files))
    expect(most >= idle_before + cap,
           "the server held only %d files: fewer connections than the cap %d were accepted" % (most, cap))
    # Once those are gone, a fresh flood of idle connections still leaves /health served.
    probe_idle_connections(args.base, 2.0, cap, n=cap + 50)


if __name__ == "__main__":
    run(main)
