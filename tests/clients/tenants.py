"""API keys as OpenAI's Python SDK meets them, through the gateway on the real
model: no key or a wrong one is an AuthenticationError, a model the key may not
use a PermissionDeniedError (and it is not listed), a limit a RateLimitError
whose Retry-After the SDK waits out before it retries, tokens counted from
streams too (with the usage chunk the gateway asked for taken out again), the
admin API closed to client keys, and CORS answered only to the allowed origin.
Usage: tenants.py GATEWAY_URL MODEL ADMIN_KEY"""

import sys
import threading
import time

import httpx
import openai
from openai import OpenAI

base, model, admin_key = sys.argv[1], sys.argv[2], sys.argv[3]


def client(key, retries=0):
    return OpenAI(base_url=base + "/v1", api_key=key, max_retries=retries, timeout=60)


def expect(error, call):
    try:
        call()
    except error as e:
        return e
    raise AssertionError(f"expected {error.__name__}")


def complete(key, **kw):
    args = {"model": model, "prompt": "The capital of France is", "max_tokens": 4}
    args.update(kw)
    return client(key).completions.create(**args)


# A wrong key, and none at all.
for key in ["sk-nobody"]:
    e = expect(openai.AuthenticationError, lambda: complete(key))
    assert e.status_code == 401 and e.code == "invalid_api_key", e
r = httpx.post(base + "/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 1})
assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text

# A model the key may not use: refused, and not listed for it.
e = expect(openai.PermissionDeniedError, lambda: complete("sk-team-b"))
assert e.status_code == 403 and e.code == "model_not_allowed", e
assert [m.id for m in client("sk-team-b").models.list()] == [], "team-b sees no model"
assert model in [m.id for m in client("sk-team-a").models.list()]
# x-api-key works as well as Authorization.
r = httpx.post(base + "/v1/completions", headers={"x-api-key": "sk-team-a"},
               json={"model": model, "prompt": "x", "max_tokens": 1})
assert r.status_code == 200, r.text

# team-a may have one request in flight: a second one while a stream runs gets
# 429 with Retry-After: 1; with retries the SDK waits that out and succeeds.
stream = complete("sk-team-a", prompt="Once upon a time", max_tokens=40, stream=True)
chunks = iter(stream)
next(chunks)
e = expect(openai.RateLimitError, lambda: complete("sk-team-a"))
assert e.code == "rate_limit_exceeded" and e.response.headers["retry-after"] == "1", e
result = {}


def retrying():
    started = time.monotonic()
    result["answer"] = client("sk-team-a", retries=4).completions.create(
        model=model, prompt="Hello", max_tokens=2)
    result["elapsed"] = time.monotonic() - started


worker = threading.Thread(target=retrying)
worker.start()
time.sleep(0.2)
rest = list(chunks)
worker.join(60)
assert result.get("answer") is not None, "the SDK's retry succeeded"
assert result["elapsed"] >= 0.9, f"retried after {result['elapsed']:.2f} s, before Retry-After"
assert rest[-1].choices[0].finish_reason is not None

# team-c: 60 tokens a minute, counted from streams. Stay inside one minute.
second = time.time() % 60
if second > 40:
    time.sleep(61 - second)
pieces = list(complete("sk-team-c", max_tokens=16, stream=True))
assert all(len(p.choices) == 1 for p in pieces), "the usage chunk the client did not ask for is gone"
assert all(p.usage is None for p in pieces)
admin = {"Authorization": f"Bearer {admin_key}"}


def usage_of(name):
    keys = httpx.get(base + "/admin/keys", headers=admin).json()["keys"]
    return next(k for k in keys if k["name"] == name)["usage"]


assert usage_of("team-c")["completion_tokens"] > 0, "a stream's tokens are counted, unasked"
asked = list(complete("sk-team-c", max_tokens=16, stream=True, stream_options={"include_usage": True}))
assert asked[-1].choices == [] and asked[-1].usage.completion_tokens > 0, "asked for: kept"
used = asked[-1].usage.total_tokens
e = None
for _ in range(4):
    try:
        complete("sk-team-c", max_tokens=16)
    except openai.RateLimitError as err:
        e = err
        break
assert e is not None, "60 tokens a minute were exceeded without a refusal"
assert e.code == "rate_limit_exceeded" and 1 <= int(e.response.headers["retry-after"]) <= 60, e

# The admin API: the admin key only; usage per key, and never a secret.
r = httpx.get(base + "/admin/keys", headers={"Authorization": "Bearer sk-team-a"})
assert r.status_code == 403, r.text
r = httpx.get(base + "/admin/keys")
assert r.status_code == 401, r.text
r = httpx.get(base + "/admin/keys", headers=admin)
assert r.status_code == 200 and "sk-team" not in r.text, r.text
keys = {k["name"]: k for k in r.json()["keys"]}
c = keys["team-c"]["usage"]
assert c["completion_tokens"] >= 32 and c["this_minute"]["tokens"] >= 60 - 1 and used > 0, c
assert c["refusals"]["tokens_per_minute"] >= 1, c
assert keys["team-a"]["usage"]["refusals"]["max_concurrent"] >= 1, keys["team-a"]
metrics = httpx.get(base + "/metrics")
assert metrics.status_code == 200, "metrics stay open"
assert 'slotgate_key_requests_total{key="team-a"}' in metrics.text, "usage per key name"
assert 'slotgate_key_refusals_total{key="team-c",reason="tokens_per_minute"}' in metrics.text
assert "sk-team" not in metrics.text, "a secret in a label"
assert httpx.get(base + "/health").status_code == 200, "health stays open"

# CORS: the allowed origin gets its preflight answered; another gets nothing.
pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
r = httpx.options(base + "/v1/completions", headers={"Origin": "http://127.0.0.1:3000", **pre})
assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://127.0.0.1:3000", r
r = httpx.options(base + "/v1/completions", headers={"Origin": "http://evil.example", **pre})
assert r.status_code == 200 and "access-control-allow-origin" not in r.headers, r.headers
r = httpx.get(base + "/v1/models", headers={"Origin": "http://evil.example", "Authorization": "Bearer sk-team-a"})
assert "access-control-allow-origin" not in r.headers and "access-control-allow-credentials" not in r.headers

print("tenants: ok")
