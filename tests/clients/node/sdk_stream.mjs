// One streamed call through each official Node SDK, unchanged: OpenAI's
// Responses API and Anthropic's Messages API, each checked against what the
// SDK itself assembles from the events.
// Usage: node sdk_stream.mjs BASE_URL MODEL [KEY]
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, model, key = "unused"] = process.argv.slice(2);

const openai = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: key, maxRetries: 0 });
let deltas = "";
const stream = openai.responses.stream({
  model, input: "Count to five.", max_output_tokens: 12, temperature: 0,
});
stream.on("response.output_text.delta", (event) => { deltas += event.delta; });
const response = await stream.finalResponse();
assert.ok(deltas.length > 0, "no text streamed");
assert.equal(response.output_text, deltas);
assert.ok(["completed", "incomplete"].includes(response.status), response.status);

const anthropic = new Anthropic({ baseURL, apiKey: key, maxRetries: 0 });
let text = "";
const messages = anthropic.messages.stream({
  model, max_tokens: 12, temperature: 0, messages: [{ role: "user", content: "Count to five." }],
});
messages.on("text", (piece) => { text += piece; });
const message = await messages.finalMessage();
assert.ok(text.length > 0, "no text streamed");
assert.equal(message.content[0].text, text);
assert.ok(message.usage.output_tokens > 0);
console.log("node sdks: ok");
