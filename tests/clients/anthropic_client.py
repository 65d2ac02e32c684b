"""Talks to a slotgate server through Anthropic's official Python SDK, unchanged:
messages created and streamed, a tool called and its result sent back (whole and
streamed), tokens counted, and bad requests raising the SDK's own exceptions.
Usage: anthropic_client.py BASE_URL MODEL [KEY]"""

import json
import sys

import anthropic
import httpx
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def main() -> None:
    base_url, model = sys.argv[1], sys.argv[2]
    key = sys.argv[3] if len(sys.argv) > 3 else "unused"
    client = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    hello = [{"role": "user", "content": "Say hello."}]

    msg = client.messages.create(
        model=model, max_tokens=12, system="Be brief.", messages=hello, temperature=0
    )
    assert msg.type == "message" and msg.role == "assistant", msg
    assert msg.id.startswith("msg_"), msg
    assert msg.content and msg.content[0].type == "text" and msg.content[0].text, msg
    assert msg.stop_reason in ("end_turn", "max_tokens"), msg
    assert msg.usage.output_tokens > 0, msg
    prompt = msg.usage.input_tokens + msg.usage.cache_read_input_tokens
    assert prompt > 0, msg

    # Stop sequences the answer cannot miss in 60 tokens: it ends at the first
    # one it writes, and says which, whole and streamed.
    stops = ["\n", " ", "e", "."]
    cut = client.messages.create(
        model=model, max_tokens=60, messages=hello, temperature=0, stop_sequences=stops
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence in stops, cut
    assert not any(s in b.text for b in cut.content for s in stops), cut
    with client.messages.stream(
        model=model, max_tokens=60, messages=hello, temperature=0.7, stop_sequences=stops
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence in stops, final
    assert not any(s in text for s in stops), (text, final)

    # The prompt that request makes, counted alone.
    count = client.messages.count_tokens(model=model, system="Be brief.", messages=hello)
    assert count.input_tokens == prompt, (count, msg.usage)

    with client.messages.stream(
        model=model, max_tokens=12, messages=[{"role": "user", "content": "Count to five."}], temperature=0
    ) as stream:
        started = None
        for event in stream:
            if event.type == "message_start":
                started = event.message.usage
        final = stream.get_final_message()
    text = "".join(b.text for b in final.content if b.type == "text")
    assert text, final
    # message_start counts the prompt, as Anthropic's does (clients show it
    # before the answer ends); message_delta then splits off the cached part.
    assert started is not None and started.input_tokens == (
        final.usage.input_tokens + final.usage.cache_read_input_tokens), (started, final.usage)
    assert final.stop_reason in ("end_turn", "max_tokens"), final
    assert final.usage.output_tokens > 0 and final.usage.input_tokens + final.usage.cache_read_input_tokens > 0, final

    # A call it must make (`any`), then its result sent back.
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = client.messages.create(
        model=model, max_tokens=80, tools=[WEATHER], tool_choice={"type": "any"}, messages=ask, temperature=0
    )
    assert call.stop_reason == "tool_use", call
    uses = [b for b in call.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather", call
    assert isinstance(uses[0].input.get("city"), str), uses[0]
    result = [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 21 degrees."}]
    answer = client.messages.create(
        model=model,
        max_tokens=16,
        tools=[WEATHER],
        messages=ask + [{"role": "assistant", "content": call.content}, {"role": "user", "content": result}],
        temperature=0,
    )
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use"), answer
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens > prompt, answer

    # The same call streamed: the SDK assembles the input from its JSON pieces.
    with client.messages.stream(
        model=model, max_tokens=80, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
        messages=ask, temperature=0,
    ) as stream:
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and uses, final
    assert isinstance(uses[0].input.get("city"), str), uses[0]

    try:
        client.messages.create(model=model, max_tokens=0, messages=hello)
        raise AssertionError("max_tokens 0 was accepted")
    except anthropic.BadRequestError as err:
        assert err.status_code == 400 and err.body["type"] == "error", err.body
        assert err.body["error"]["type"] == "invalid_request_error", err.body
    try:
        client.messages.create(
            model=model, max_tokens=5, messages=[{"role": "user", "content": [{"type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}],
        )
        raise AssertionError("an image was accepted")
    except anthropic.BadRequestError as err:
        assert "messages.0.content.0" in err.body["error"]["message"], err.body
    try:
        client.messages.create(model="no-such-model", max_tokens=5, messages=hello)
        raise AssertionError("an unknown model was served")
    except anthropic.NotFoundError as err:
        assert err.body["type"] == "error" and err.body["error"]["type"] == "not_found_error", err.body
    # Every answer and streamed event, validated against the SDK's own types
    # (pydantic, strictly: the SDK's parsing alone forgives missing fields).
    body = {"model": model, "max_tokens": 60, "messages": ask, "tools": [WEATHER], "tool_choice": {"type": "any"}}
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    for extra in ({}, {"tool_choice": {"type": "auto"}, "max_tokens": 8}):
        r = httpx.post(f"{base_url}/v1/messages", json={**body, **extra}, headers=headers, timeout=120)
        Message.model_validate(r.json(), strict=False)
        assert set(Message.model_fields) >= set(r.json()), r.json()
        events = TypeAdapter(RawMessageStreamEvent)
        with httpx.stream("POST", f"{base_url}/v1/messages", json={**body, **extra, "stream": True},
                          headers=headers, timeout=120) as s:
            for line in s.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[len("data: "):])
                    if event["type"] != "ping":
                        events.validate_python(event)
    print("anthropic sdk: ok")


if __name__ == "__main__":
    main()
