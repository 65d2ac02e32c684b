"""Tool calling and log probabilities through OpenAI's Python SDK on the real
model: a required call parses and validates against the function's schema, the
streamed form reassembles to the same call, a named function is the one called,
a conversation carrying a call and its result is answered, and logprobs come per
token. Usage: tools.py BASE_URL MODEL"""

import json
import sys

import jsonschema
from openai import OpenAI

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 16}},
                                          "required": ["city"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def main() -> None:
    base_url, model = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    common = dict(model=model, messages=messages, tools=TOOLS, max_tokens=80, seed=7,
                  extra_body={"cache_prompt": False})

    reply = client.chat.completions.create(tool_choice="required", **common)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and len(calls) == 1, choice.message
    call = calls[0]
    assert call.id.startswith("call") and call.type == "function", call
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    print("call:", call.function.name, call.function.arguments)

    pieces, names, ids, reason = {}, {}, {}, None
    for chunk in client.chat.completions.create(tool_choice="required", stream=True, **common):
        for c in chunk.choices:
            reason = c.finish_reason or reason
            for d in c.delta.tool_calls or []:
                if d.id:
                    ids[d.index] = d.id
                if d.function and d.function.name:
                    names[d.index] = d.function.name
                if d.function and d.function.arguments:
                    pieces[d.index] = pieces.get(d.index, "") + d.function.arguments
    assert reason == "tool_calls", reason
    assert names == {0: call.function.name}, names
    assert json.loads(pieces[0]) == json.loads(call.function.arguments), (pieces, call)
    assert ids[0].startswith("call"), ids

    named = client.chat.completions.create(
        tool_choice={"type": "function", "function": {"name": "get_time"}}, **common)
    ncall = named.choices[0].message.tool_calls[0]
    assert ncall.function.name == "get_time", ncall
    jsonschema.validate(json.loads(ncall.function.arguments), SCHEMAS["get_time"])

    history = messages + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees."},
    ]
    after = client.chat.completions.create(model=model, messages=history, tools=TOOLS, max_tokens=40,
                                           seed=3)
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls"), after

    # With `auto` the model calls or replies; streamed or not, the same answer.
    kinds = []
    for seed in range(4):
        auto = dict(common, seed=seed, temperature=1.0, max_tokens=60)
        whole = client.chat.completions.create(**auto).choices[0]
        content, calls, reason = "", {}, None
        for chunk in client.chat.completions.create(stream=True, **auto):
            for c in chunk.choices:
                reason = c.finish_reason or reason
                content += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    name, args = calls.get(d.index, ("", ""))
                    calls[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
        assert reason == whole.finish_reason, (seed, reason, whole)
        if whole.message.tool_calls:
            kinds.append("call")
            assert [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls] \
                == [(n, json.loads(a)) for n, a in calls.values()], (seed, calls, whole)
        else:
            kinds.append("reply")
            assert content == (whole.message.content or ""), (seed, content, whole)
    print("auto:", kinds)

    lp = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                        logprobs=True, top_logprobs=3)
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens, lp
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content), content
    print("tools: ok")


if __name__ == "__main__":
    main()
