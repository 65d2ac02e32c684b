"""Talks to a slotgate server through OpenAI's official Python SDK's Responses
API, unchanged: created whole and streamed, stored, retrieved, continued by
`previous_response_id` (warm), a function tool called and its output sent
back, input tokens counted, deleted, and bad requests raising the SDK's own
exceptions. Usage: responses_client.py BASE_URL MODEL [KEY]"""

import json
import sys

import openai
from openai import OpenAI

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def main() -> None:
    base_url, model = sys.argv[1], sys.argv[2]
    key = sys.argv[3] if len(sys.argv) > 3 else "unused"
    client = OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=120)

    first = client.responses.create(
        model=model, instructions="Be brief.", input="Say hello.", max_output_tokens=12, temperature=0
    )
    assert first.object == "response" and first.status in ("completed", "incomplete"), first
    assert first.output_text, first
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0, first
    counted = client.responses.input_tokens.count(model=model, instructions="Be brief.", input="Say hello.")
    assert counted.input_tokens == first.usage.input_tokens, (counted, first.usage)

    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text, got

    # The follow-up continues the stored conversation, warm on this engine.
    # Instructions are not carried on (as OpenAI's): a client sends them again.
    second = client.responses.create(
        model=model, instructions="Be brief.", previous_response_id=first.id, input="Once more.",
        max_output_tokens=8, temperature=0,
    )
    assert second.previous_response_id == first.id, second
    assert second.usage.input_tokens > first.usage.input_tokens, (first.usage, second.usage)
    assert second.usage.input_tokens_details.cached_tokens > 0, second.usage

    events = list(
        client.responses.create(model=model, input="Count to five.", max_output_tokens=12, temperature=0, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert [e.sequence_number for e in events] == list(range(len(events))), kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text, (text, events[-1])
    assert client.responses.retrieve(events[-1].response.id).output_text == text

    # A call it must make, then its output sent back by id.
    call = client.responses.create(
        model=model, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
        max_output_tokens=80, temperature=0,
    )
    calls = [o for o in call.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather", call
    assert isinstance(json.loads(calls[0].arguments)["city"], str), calls[0]
    answer = client.responses.create(
        model=model, previous_response_id=call.id, tools=[WEATHER], max_output_tokens=16, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 degrees."}],
    )
    assert answer.status in ("completed", "incomplete"), answer
    assert answer.usage.input_tokens > call.usage.input_tokens, answer.usage

    # The same call streamed, through the SDK's own accumulating helper.
    with client.responses.stream(
        model=model, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
        max_output_tokens=80, temperature=0,
    ) as stream:
        final = stream.get_final_response()
    calls = [o for o in final.output if o.type == "function_call"]
    assert calls and isinstance(json.loads(calls[0].arguments)["city"], str), final

    client.responses.delete(first.id)
    for gone in (lambda: client.responses.retrieve(first.id),
                 lambda: client.responses.create(model=model, previous_response_id=first.id, input="x")):
        try:
            gone()
            raise AssertionError("a deleted response was found")
        except openai.NotFoundError as err:
            assert err.status_code == 404, err
    try:
        client.responses.create(
            model=model, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]
        )
        raise AssertionError("an image was accepted")
    except openai.BadRequestError as err:
        error = err.body.get("error", err.body)  # the SDK hands on the envelope's inside
        assert error["param"] == "input[0].content[0]", err.body
    print("responses sdk: ok")


if __name__ == "__main__":
    main()
