"""Structured output through OpenAI's Python SDK: `parse` with a Pydantic model,
then a JSON schema by hand, 20 seeds, streamed and not, several at once (each slot
keeps its own grammar state); every answer must validate against the schema.
Usage: structured_output.py BASE_URL MODEL"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jsonschema
from openai import OpenAI
from pydantic import BaseModel, Field

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 12},
        "population": {"type": "integer", "minimum": 0},
        "coastal": {"type": "boolean"},
        "climate": {"enum": ["dry", "wet", "cold"]},
        "rivers": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["city", "population", "coastal", "climate"],
    "additionalProperties": False,
}


class Pet(BaseModel):
    name: str = Field(max_length=10)
    kind: Literal["cat", "dog", "bird"]
    age: int = Field(ge=0)


def main() -> None:
    base_url, model = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "Describe a city as JSON."}]

    parsed = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Describe a pet as JSON."}],
        response_format=Pet,
        max_tokens=60,
        seed=1,
    )
    pet = parsed.choices[0].message.parsed
    assert isinstance(pet, Pet), parsed
    print("parsed:", pet)

    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}

    def one(seed: int) -> str:
        if seed % 2:
            stream = client.chat.completions.create(
                model=model, messages=messages, response_format=fmt, max_tokens=120,
                seed=seed, temperature=1.0, stream=True,
            )
            text, reason = "", None
            for chunk in stream:
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    reason = choice.finish_reason or reason
        else:
            reply = client.chat.completions.create(
                model=model, messages=messages, response_format=fmt, max_tokens=120,
                seed=seed, temperature=1.0,
            )
            text, reason = reply.choices[0].message.content, reply.choices[0].finish_reason
        if reason == "length":
            # Sampled at temperature 1, a seed may spend its tokens on the
            # schema's longest forms (16-digit numbers, runs of spaces): what
            # it wrote must still be the grammar's, as far as it went.
            assert text.startswith("{"), (seed, text)
            return None
        assert reason == "stop", (seed, reason, text)
        jsonschema.validate(json.loads(text), SCHEMA)
        return text

    with ThreadPoolExecutor(4) as pool:
        answers = [a for a in pool.map(one, range(20)) if a is not None]
    # Which seeds run out depends on batch shapes (logits are not bit-identical
    # across them); nearly all finish.
    assert len(answers) >= 16, f"only {len(answers)} of 20 seeds finished within 120 tokens"
    assert len(set(answers)) > 1, "20 seeds gave one answer: sampling ignored the seed"
    for a in answers[:3]:
        print("answer:", a)

    obj = client.chat.completions.create(
        model=model, messages=messages, response_format={"type": "json_object"},
        max_tokens=40, seed=5,
    )
    text = obj.choices[0].message.content
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
    else:
        assert text.startswith("{"), text
    print("structured output: ok")


if __name__ == "__main__":
    main()
