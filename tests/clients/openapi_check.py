"""Checks a slotgate server's answers against OpenAI's published OpenAPI document:
a chat answer, its streamed chunks, a text completion, the model list and an error
envelope, each validated against the schema the document gives for it.
Usage: openapi_check.py BASE_URL MODEL OPENAPI_YAML"""

import json
import sys

import httpx
import jsonschema
import yaml


def allow_null(node):
    """The document marks nullable fields with OpenAPI 3.0's `nullable: true`,
    which JSON Schema does not know: it becomes `null` among the allowed types
    (and values, for an enum)."""
    if isinstance(node, dict):
        if node.get("nullable") is True:
            if isinstance(node.get("type"), str):
                node["type"] = [node["type"], "null"]
            if isinstance(node.get("enum"), list) and None not in node["enum"]:
                node["enum"].append(None)
            if "$ref" in node or "allOf" in node or "anyOf" in node or "oneOf" in node:
                inner = {k: node.pop(k) for k in ("$ref", "allOf", "anyOf", "oneOf") if k in node}
                node["anyOf"] = [inner, {"type": "null"}]
        for value in node.values():
            allow_null(value)
    elif isinstance(node, list):
        for value in node:
            allow_null(value)


def main() -> None:
    base_url, model, spec_path = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(spec_path) as f:
        spec = yaml.safe_load(f)
    components = spec["components"]
    allow_null(components)

    def check(name: str, value) -> None:
        schema = {"$ref": f"#/components/schemas/{name}", "components": components}
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(value))
        assert not errors, f"{name}: " + "; ".join(
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]
        ) + f"\n{json.dumps(value)[:2000]}"

    client = httpx.Client(base_url=base_url, timeout=120)
    chat = {"model": model, "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 6, "temperature": 0}

    variants = {
        "plain": chat,
        "logprobs": {**chat, "logprobs": True, "top_logprobs": 3},
        "json_schema": {**chat, "response_format": {"type": "json_schema", "json_schema": {
            "name": "n", "schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                                    "required": ["n"]}}}, "max_tokens": 12},
        "tools": {**chat, "max_tokens": 60, "tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": "greet", "parameters": {
                "type": "object", "properties": {"tone": {"enum": ["warm", "formal"]}},
                "required": ["tone"]}}}]},
    }
    chunks = 0
    for name, body in variants.items():
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, (name, r.text)
        answer = r.json()
        check("CreateChatCompletionResponse", answer)
        if name == "tools":
            assert answer["choices"][0]["finish_reason"] == "tool_calls", answer
        if name == "logprobs":
            content = answer["choices"][0]["logprobs"]["content"]
            assert content and all(len(t["top_logprobs"]) == 3 for t in content), answer

        with client.stream("POST", "/v1/chat/completions",
                           json={**body, "stream": True, "stream_options": {"include_usage": True}}) as s:
            assert s.status_code == 200
            for line in s.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                check("CreateChatCompletionStreamResponse", json.loads(line[len("data: "):]))
                chunks += 1
    assert chunks >= 2 * len(variants), chunks

    for extra in ({}, {"logprobs": 2}):
        r = client.post("/v1/completions",
                        json={"model": model, "prompt": "One, two,", "max_tokens": 4, **extra})
        assert r.status_code == 200, r.text
        check("CreateCompletionResponse", r.json())

    r = client.get("/v1/models")
    check("ListModelsResponse", r.json())

    r = client.post("/v1/chat/completions", json={**chat, "temperature": 7})
    assert r.status_code == 400, r.text
    check("ErrorResponse", r.json())

    # The Responses API: whole answers and every streamed event.
    ask = {"model": model, "input": "Say hello.", "max_output_tokens": 6, "temperature": 0}
    responses = {
        "plain": ask,
        "instructions": {**ask, "instructions": "Be brief.", "metadata": {"team": "a"}},
        "json_schema": {**ask, "max_output_tokens": 12, "text": {"format": {"type": "json_schema", "name": "n",
            "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}},
        "tools": {**ask, "max_output_tokens": 60, "tool_choice": "required", "tools": [
            {"type": "function", "name": "greet", "strict": True, "parameters": {"type": "object",
                "properties": {"tone": {"enum": ["warm", "formal"]}}, "required": ["tone"],
                "additionalProperties": False}}]},
    }
    events = 0
    for name, body in responses.items():
        r = client.post("/v1/responses", json=body)
        assert r.status_code == 200, (name, r.text)
        check("Response", r.json())
        if name == "tools":
            assert r.json()["output"][0]["type"] == "function_call", r.json()
        with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as s:
            assert s.status_code == 200
            for line in s.iter_lines():
                if line.startswith("data: "):
                    check("ResponseStreamEvent", json.loads(line[len("data: "):]))
                    events += 1
    r = client.post("/v1/responses", json={**ask, "previous_response_id": "resp_gone"})
    assert r.status_code == 404, r.text
    check("ErrorResponse", r.json())
    print(f"valid: chat ({', '.join(variants)}), {chunks} chunks, completion, models, error, "
          f"responses ({', '.join(responses)}), {events} events")


if __name__ == "__main__":
    main()
