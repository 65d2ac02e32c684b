"""Asks llama-server and slotgate-engine (same model) the same questions on
llama-server's own endpoints and compares the shapes of the answers: which
fields each has, and of which JSON type. Prints a Markdown report; exits 1 when
a field that llama-server answers is missing from slotgate's answer, or has
another type. Usage: compare_llama_server.py LLAMA_SERVER_URL SLOTGATE_URL"""

import sys

import httpx

CASES = [
    ("POST", "/tokenize", {"content": "Hello world"}),
    ("POST", "/tokenize", {"content": "Hello world", "with_pieces": True}),
    ("POST", "/tokenize", {"content": "<bos>Hi", "add_special": True}),
    ("POST", "/detokenize", {"tokens": [9259, 1902]}),
    ("POST", "/apply-template", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("GET", "/props", None),
    ("GET", "/health", None),
    ("GET", "/v1/models", None),
]

# Fields of llama-server's answers that slotgate does not claim to have: its
# own build, web UI and multimodal settings, and the Ollama-style model list its
# web UI reads.
IGNORED = {"/props": {"build_info", "webui", "modalities", "bos_token", "eos_token",
                      "model_alias", "is_sleeping", "endpoint_slots", "endpoint_props",
                      "endpoint_metrics", "webui_settings", "media_marker", "ui_settings",
                      "ui", "cors_proxy_enabled"},
           "/v1/models": {"models"}}

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


def main() -> None:
    theirs_url, ours_url = sys.argv[1], sys.argv[2]
    failed = False
    lines = ["| request | status (llama-server / slotgate) | differences |", "|---|---|---|"]
    with httpx.Client(timeout=60) as client:
        for method, path, body in CASES:
            answers = [client.request(method, base + path, json=body) for base in (theirs_url, ours_url)]
            statuses = f"{answers[0].status_code} / {answers[1].status_code}"
            found = []
            if answers[0].status_code != answers[1].status_code:
                found.append("status differs")
            diff(shape(answers[0].json()), shape(answers[1].json()), "", IGNORED.get(path, set()), found)
            # One model, one tokenizer: the tokens themselves must agree too.
            if path in ("/tokenize", "/detokenize") and answers[0].json() != answers[1].json():
                found.append(f"values differ: {answers[0].text} there, {answers[1].text} here")
            left_out = [f for f in found if f.startswith(f"`{SAMPLERS_LEFT_OUT}") and f.endswith("missing")]
            found = [f for f in found if f not in left_out]
            if left_out:
                names = ", ".join(f.split("`")[1].removeprefix(SAMPLERS_LEFT_OUT) for f in left_out)
                found.append(f"samplers left out: {names}")
            failed |= any(not f.startswith("samplers left out") for f in found)
            label = f"`{method} {path}`" + (f" `{body}`" if body else "")
            lines.append(f"| {label} | {statuses} | {'; '.join(found) or 'same fields and types'} |")
    print("\n".join(lines))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
