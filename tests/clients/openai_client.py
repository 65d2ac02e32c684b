"""Chats with a slotgate server through OpenAI's official Python SDK, streamed and
not, and checks what the SDK parsed. Usage: openai_client.py BASE_URL MODEL"""

import sys

from openai import OpenAI


def main() -> None:
    base_url, model = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)

    listed = [m.id for m in client.models.list()]
    assert model in listed, listed

    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}],
        max_tokens=12,
        temperature=0,
    )
    assert reply.object == "chat.completion", reply
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content, reply
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens

    pieces, reasons, usage = [], [], None
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert "".join(pieces), pieces
    assert reasons in (["stop"], ["length"]), reasons
    assert usage is not None and usage.completion_tokens > 0, usage

    completion = client.completions.create(model=model, prompt=["1, 2, 3,", "a, b, c,"], max_tokens=4, temperature=0)
    assert [c.index for c in completion.choices] == [0, 1], completion

    try:
        client.chat.completions.create(model=model, messages=[], max_tokens=4)
        raise AssertionError("empty messages were accepted")
    except Exception as err:  # the SDK raises BadRequestError with the parsed envelope
        assert getattr(err, "status_code", None) == 400, err
        assert "messages" in str(err), err
    print("openai sdk: ok")


if __name__ == "__main__":
    main()
