"""Asks llama-server and slotgate-engine (same model, same chat template) the
same questions on llama-server's own endpoints, its OpenAI Responses and its
Anthropic Messages routes included, and compares the shapes of the answers:
which fields each has, and of which JSON type; for a stream, the events of each
type (and kind of block or item) the same way. Prints a Markdown report; exits 1
when a field that llama-server answers is missing from slotgate's answer, or has
another type, unless it is listed in KNOWN with the reason.
Usage: compare_llama_server.py LLAMA_SERVER_URL SLOTGATE_URL MODEL"""

import json
import sys

import httpx

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
WEATHER_ANTHROPIC = {"name": "get_weather", "description": "The weather in a city.",
                     "input_schema": WEATHER["parameters"]}
HELLO = [{"role": "user", "content": "Say hello."}]

def cases(model):
    """(method, path, body); a body with "stream": true is answered with events."""
    return [
        ("POST", "/tokenize", {"content": "Hello world"}),
        ("POST", "/tokenize", {"content": "Hello world", "with_pieces": True}),
        ("POST", "/tokenize", {"content": "<bos>Hi", "add_special": True}),
        ("POST", "/detokenize", {"tokens": [9259, 1902]}),
        ("POST", "/apply-template", {"messages": [{"role": "user", "content": "Hi"}]}),
        ("GET", "/props", None),
        ("GET", "/health", None),
        ("GET", "/v1/models", None),
        ("POST", "/v1/responses", {"model": model, "input": "Say hello.", "max_output_tokens": 8}),
        ("POST", "/v1/responses", {"model": model, "input": "Say hello.", "instructions": "Be brief.",
                                   "max_output_tokens": 8, "stream": True}),
        ("POST", "/v1/responses", {"model": model, "input": "Weather in Paris?", "tools": [WEATHER],
                                   "tool_choice": "required", "max_output_tokens": 60}),
        ("POST", "/v1/responses", {"model": model, "input": "Weather in Paris?", "tools": [WEATHER],
                                   "tool_choice": "required", "max_output_tokens": 60, "stream": True}),
        ("POST", "/v1/responses/input_tokens", {"model": model, "input": "Say hello."}),
        ("POST", "/v1/messages", {"model": model, "max_tokens": 8, "messages": HELLO}),
        ("POST", "/v1/messages", {"model": model, "max_tokens": 8, "system": "Be brief.",
                                  "messages": HELLO, "stream": True}),
        ("POST", "/v1/messages", {"model": model, "max_tokens": 40, "messages": HELLO,
                                  "stop_sequences": [" ", "e", "\n", "."]}),
        ("POST", "/v1/messages", {"model": model, "max_tokens": 60, "tools": [WEATHER_ANTHROPIC],
                                  "tool_choice": {"type": "any"},
                                  "messages": [{"role": "user", "content": "Weather in Paris?"}]}),
        ("POST", "/v1/messages", {"model": model, "max_tokens": 60, "tools": [WEATHER_ANTHROPIC],
                                  "tool_choice": {"type": "any"}, "stream": True,
                                  "messages": [{"role": "user", "content": "Weather in Paris?"}]}),
        ("POST", "/v1/messages/count_tokens", {"model": model, "messages": HELLO}),
        ("POST", "/v1/messages", {"model": model, "messages": HELLO}),
    ]

# Fields of llama-server's answers that slotgate does not claim to have: its
# own build, web UI and multimodal settings, and the Ollama-style model list its
# web UI reads.
IGNORED = {"/props": {"build_info", "webui", "modalities", "bos_token", "eos_token",
                      "model_alias", "is_sleeping", "endpoint_slots", "endpoint_props",
                      "endpoint_metrics", "webui_settings", "media_marker", "ui_settings",
                      "ui", "cors_proxy_enabled"},
           "/v1/models": {"models"}}

# Differences that are slotgate's choice, by route: the start of the difference
# as reported, and why. Listed in the report, not counted as a failure.
TEXT_NOT_CALL = ("llama-server answered with text: its tool grammar waits for the model to open a "
                 "call, while slotgate's forces the call that `required`/`any` asks for")
KNOWN = {
    "/v1/responses": {
        "events missing: `response.completed`":
            "an answer cut off by `max_output_tokens` ends with `response.incomplete`, as OpenAI's does",
        "(item message)": TEXT_NOT_CALL,
        "`output.[].content` missing": TEXT_NOT_CALL,
        "`output.[].role` missing": TEXT_NOT_CALL,
        "`response.completed: response.output.[].content` missing": TEXT_NOT_CALL,
        "`response.completed: response.output.[].role` missing": TEXT_NOT_CALL,
        "`response.completed: timings` missing": "llama-server's own `timings`, not in OpenAI's events",
    },
    "/v1/messages": {
        "status differs": "`max_tokens` is required by Anthropic's API, which answers 400 too; "
                          "llama-server defaults it",
        "`content.[].text` missing": TEXT_NOT_CALL,
        "(content_block text)": TEXT_NOT_CALL,
    },
}

# Sampler settings llama-server has and slotgate does not (DRY, Mirostat, XTC,
# typical-p, ...): listed in the report, not counted as a failure.
SAMPLERS_LEFT_OUT = "default_generation_settings.params."


def shape(value):
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def diff(theirs, ours, path, ignored, out):
    if isinstance(theirs, dict):
        if not isinstance(ours, dict):
            out.append(f"`{path or '.'}`: an object there, `{type(ours).__name__}` here")
            return
        for key, sub in theirs.items():
            if key in ignored and not path:
                continue
            if key not in ours:
                out.append(f"`{path}{key}` missing")
            else:
                diff(sub, ours[key], f"{path}{key}.", set(), out)
    elif isinstance(theirs, list):
        if not isinstance(ours, list):
            out.append(f"`{path or '.'}`: an array there, `{type(ours).__name__}` here")
        elif theirs and ours:
            diff(theirs[0], ours[0], f"{path}[].", set(), out)
    elif theirs != ours and {theirs, ours} != {"int", "float"} and "NoneType" not in (theirs, ours):
        out.append(f"`{path.rstrip('.')}`: {theirs} there, {ours} here")


def events(text):
    """A stream's events by kind: the `type` of each event's data, with the type
    of the block, item, part or delta it carries, and the shape of the first of
    each kind."""
    kinds = {}
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        data = json.loads(line[len("data: "):])
        kind = data.get("type", "?")
        for inner in ("content_block", "delta", "item", "part"):
            if isinstance(data.get(inner), dict) and "type" in data[inner]:
                kind += f" ({inner} {data[inner]['type']})"
        kinds.setdefault(kind, shape(data))
    return kinds


def compare(theirs, ours, path, found):
    """Adds the differences of two answers (objects, or streams' events) to `found`."""
    if theirs.status_code != ours.status_code:
        return
    if theirs.headers.get("content-type", "").startswith("text/event-stream"):
        there, here = events(theirs.text), events(ours.text)
        only_there = [k for k in there if k not in here]
        only_here = [k for k in here if k not in there]
        if only_there:
            found.append("events missing: " + ", ".join(f"`{k}`" for k in only_there))
        if only_here:
            found.append("events only here: " + ", ".join(f"`{k}`" for k in only_here))
        for kind in there.keys() & here.keys():
            diff(there[kind], here[kind], f"{kind}: ", set(), found)
        return
    diff(shape(theirs.json()), shape(ours.json()), "", IGNORED.get(path, set()), found)


def main() -> None:
    theirs_url, ours_url, model = sys.argv[1], sys.argv[2], sys.argv[3]
    failed = False
    lines = ["| request | status (llama-server / slotgate) | differences |", "|---|---|---|"]
    with httpx.Client(timeout=120) as client:
        for method, path, body in cases(model):
            answers = [client.request(method, base + path, json=body) for base in (theirs_url, ours_url)]
            statuses = f"{answers[0].status_code} / {answers[1].status_code}"
            found = []
            if answers[0].status_code != answers[1].status_code:
                found.append("status differs")
            compare(answers[0], answers[1], path, found)
            # One model, one tokenizer: the tokens themselves must agree too.
            if path in ("/tokenize", "/detokenize") and answers[0].json() != answers[1].json():
                found.append(f"values differ: {answers[0].text} there, {answers[1].text} here")
            left_out = [f for f in found if f.startswith(f"`{SAMPLERS_LEFT_OUT}") and f.endswith("missing")]
            found = [f for f in found if f not in left_out]
            if left_out:
                names = ", ".join(f.split("`")[1].removeprefix(SAMPLERS_LEFT_OUT) for f in left_out)
                found.append(f"samplers left out: {names}")
            known = [f for f in found if reason(path, f)]
            failed |= any(f not in known and not f.startswith(("samplers left out", "events only here"))
                          for f in found)
            # Each reason once, after the differences.
            whys = "".join(f" Why: {why}." for why in dict.fromkeys(map(lambda f: reason(path, f), known)))
            shown = {k: v for k, v in (body or {}).items() if k not in ("tools", "model")}
            if body and "tools" in body:
                shown["tools"] = "[get_weather]"
            label = f"`{method} {path}`" + (f" `{json.dumps(shown)}`" if body else "")
            lines.append(f"| {label} | {statuses} | {'; '.join(found) or 'same fields and types'}{whys} |")
    print("\n".join(lines))
    sys.exit(1 if failed else 0)


def reason(path, found):
    """Why `found` is slotgate's choice, if it is."""
    return next((v for k, v in KNOWN.get(path, {}).items() if k in found), None)


if __name__ == "__main__":
    main()
