"""Drive a server with wrk over keep-alive HTTPS and read back its numbers.

Each run gets a generated Lua script holding the mix's requests (sent round-robin per
connection thread). For latency at a fixed offered load, plain wrk has no ``-R`` (that
is wrk2, not packaged by Debian), so the script paces requests itself: each thread
keeps an absolute schedule (one slot every ``threads/rate`` seconds, read from
CLOCK_MONOTONIC through LuaJIT's FFI) and ``delay()`` holds each request until its
slot. Unlike wrk2 this does not correct coordinated omission: when the server falls
behind, the requests that would have queued are sent late rather than timed from their
slot, so percentiles under overload read low. At half the baseline's maximum, the
load used here, the server keeps up and the two agree closely.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.mix import Item

LUA = r"""
local items = {
%(items)s
}
local rate = %(rate)s          -- requests/s for the whole run, 0 = as fast as possible
local threads = %(threads)d
local i = 0
local interval, next_at, now_ms

if rate > 0 then
  local ffi = require("ffi")
  ffi.cdef[[
    typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
    int clock_gettime(int clk, bench_timespec *ts);
  ]]
  local ts = ffi.new("bench_timespec")
  now_ms = function()
    ffi.C.clock_gettime(1, ts)
    return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
  end
  interval = 1000 * threads / rate
  delay = function()
    if next_at == nil then next_at = now_ms() end
    next_at = next_at + interval
    local d = next_at - now_ms()
    if d < 0 then return 0 end
    return d
  end
end

init = function(args)
  for k, it in ipairs(items) do
    items[k] = wrk.format("POST", it[1], {["Content-Type"] = "application/json"}, it[2])
  end
end

request = function()
  i = i + 1
  if i > #items then i = 1 end
  return items[i]
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests": %%d, "duration_us": %%d, "bytes": %%d, ' ..
    '"errors": {"connect": %%d, "read": %%d, "write": %%d, "status": %%d, "timeout": %%d}, ' ..
    '"latency_us": {"mean": %%.1f, "max": %%d, "p50": %%d, "p75": %%d, "p90": %%d, ' ..
    '"p99": %%d, "p99.9": %%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.max, latency:percentile(50), latency:percentile(75),
    latency:percentile(90), latency:percentile(99), latency:percentile(99.9)))
end
"""


def wrk_binary() -> str | None:
    return shutil.which("wrk")


def _lua_string(b: bytes) -> str:
    level = "=" * 4
    text = b.decode()
    assert f"]{level}]" not in text
    return f"[{level}[{text}]{level}]"


@dataclass
class Result:
    requests: int
    seconds: float
    rps: float
    errors: dict[str, int]
    latency_us: dict[str, float]

    def to_json(self) -> dict[str, object]:
        return {"requests": self.requests, "seconds": round(self.seconds, 3),
                "rps": round(self.rps, 1), "errors": self.errors,
                "latency_us": self.latency_us}


def run(url: str, items: list[Item], seconds: float, *, connections: int = 8,
        threads: int = 1, rate: float = 0.0) -> Result:
    """One wrk run against ``url`` (https://host:port) with the mix ``items``."""
    binary = wrk_binary()
    if binary is None:
        raise RuntimeError("wrk is not installed (apt-get install wrk)")
    entries = ",\n".join(f"  {{{json.dumps(i.path)}, {_lua_string(i.body)}}}" for i in items)
    script = LUA % {"items": entries, "rate": repr(float(rate)), "threads": threads}
    with tempfile.TemporaryDirectory(prefix="gpu-webhook-bench-") as d:
        path = Path(d) / "mix.lua"
        path.write_text(script)
        cmd = [binary, "-t", str(threads), "-c", str(connections), "-d", f"{seconds:g}s",
               "--timeout", "5s", "-s", str(path), url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}")
    data = json.loads(line[6:])
    secs = data["duration_us"] / 1e6
    errors = {k: int(v) for k, v in data["errors"].items()}
    if data["requests"] == 0 or sum(errors.values()) > 0:
        raise RuntimeError(f"wrk saw errors against {url}: {errors}, "
                           f"{data['requests']} requests\n{proc.stdout}")
    return Result(data["requests"], secs, data["requests"] / secs, errors,
                  {k: float(v) for k, v in data["latency_us"].items()})
