//! Round trips of fixtures shaped exactly like the OpenAI API reference examples.
//!
//! Requests must come back identical. Responses carry fields this crate does not
//! model (`refusal`, `service_tier`, ...): what it writes back must be a subset of the
//! fixture with equal values, and must keep every field the SDKs require.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use slotgate_protocol::*;

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Parses and writes back as text, as a server would send it (f32 fields print
/// their shortest form only through the text writer).
fn reserialize<T: DeserializeOwned + Serialize>(json: &str) -> (T, Value) {
    let parsed: T = serde_json::from_str(json).unwrap();
    let value = serde_json::from_str(&serde_json::to_string(&parsed).unwrap()).unwrap();
    (parsed, value)
}

/// The same JSON document, where numbers compare by value and an absent key equals
/// an explicit null.
fn assert_same(ours: &Value, theirs: &Value, what: &str) {
    assert_subset(ours, theirs, what);
    assert_subset(theirs, ours, what);
}

/// Every field of `ours` is in `theirs` with the same value.
fn assert_subset(ours: &Value, theirs: &Value, path: &str) {
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(other) => assert_subset(v, other, &format!("{path}.{k}")),
                    None => assert!(v.is_null(), "{path}.{k} is not in the other document"),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path}");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_subset(x, y, &format!("{path}[{i}]"));
            }
        }
        (Value::Number(a), Value::Number(b)) => {
            assert_eq!(a.as_f64(), b.as_f64(), "{path}");
        }
        _ => assert_eq!(ours, theirs, "{path}"),
    }
}

fn assert_keys(value: &Value, keys: &[&str]) {
    for key in keys {
        assert!(value.get(key).is_some(), "missing `{key}` in {value}");
    }
}

#[test]
fn chat_request_round_trips_exactly() {
    for name in ["chat_request.json", "chat_request_full.json"] {
        let text = fixture(name);
        let (req, value): (ChatCompletionRequest, _) = reserialize(&text);
        assert_same(&value, &serde_json::from_str::<Value>(&text).unwrap(), name);
        req.validate().unwrap();
    }
}

#[test]
fn full_chat_request_reads_every_field() {
    let (req, _): (ChatCompletionRequest, _) = reserialize(&fixture("chat_request_full.json"));
    assert_eq!(req.messages.len(), 4);
    assert_eq!(req.messages[1].text(), "What is the weather like in Boston today?");
    assert_eq!(req.messages[3].role, Role::Tool);
    assert_eq!(req.max_tokens(), Some(100));
    assert_eq!(req.sampling.n(), 2);
    assert!(req.sampling.is_stream() && req.sampling.include_usage());
    assert_eq!(req.sampling.stop_strings(), vec!["\n\n".to_owned(), "END".to_owned()]);
    assert_eq!(req.sampling.seed, Some(42));
    assert_eq!(req.sampling.logit_bias_pairs(), vec![(50256, -100.0)]);
}

#[test]
fn unknown_request_fields_are_ignored() {
    let req: ChatCompletionRequest = parse_json(
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"store":true,"metadata":{"a":"b"},"parallel_tool_calls":false}"#,
    )
    .unwrap();
    req.validate().unwrap();
}

#[test]
fn chat_response_is_what_sdks_parse() {
    let text = fixture("chat_response.json");
    let (resp, value): (ChatCompletion, _) = reserialize(&text);
    assert_subset(&value, &serde_json::from_str(&text).unwrap(), "$");
    assert_keys(&value, &["id", "object", "created", "model", "choices", "usage"]);
    assert_keys(&value["choices"][0], &["index", "message", "logprobs", "finish_reason"]);
    assert_eq!(resp.choices[0].finish_reason, Some(FinishReason::Stop));
    assert_eq!(resp.usage.unwrap().prompt_tokens_details.unwrap().cached_tokens, 0);
}

#[test]
fn chat_stream_decodes_and_reencodes() {
    let text = fixture("chat_stream.txt");
    let mut decoder = SseDecoder::new();
    let events = decoder.push(text.as_bytes());
    assert_eq!(events.len(), 5);
    assert!(events[4].is_done());
    let mut rebuilt = String::new();
    for event in &events[..4] {
        let chunk: ChatCompletionChunk = serde_json::from_str(&event.data).unwrap();
        assert_eq!(chunk.object, "chat.completion.chunk");
        assert_subset(
            &serde_json::from_str(&serde_json::to_string(&chunk).unwrap()).unwrap(),
            &serde_json::from_str(&event.data).unwrap(),
            "$",
        );
        rebuilt.push_str(&slotgate_protocol::sse::encode(&chunk));
    }
    rebuilt.push_str(slotgate_protocol::sse::DONE_EVENT);
    let again = SseDecoder::new().push(rebuilt.as_bytes());
    assert_eq!(again.len(), 5);
    let first: ChatCompletionChunk = serde_json::from_str(&again[0].data).unwrap();
    assert_eq!(first.choices[0].delta.role, Some(Role::Assistant));
    let last: ChatCompletionChunk = serde_json::from_str(&again[3].data).unwrap();
    assert!(last.choices.is_empty());
    assert_eq!(last.usage.map(|u| u.total_tokens), Some(11));
    // The finish chunk keeps an explicit null-free empty delta and its reason.
    let stop: Value = serde_json::from_str(&again[2].data).unwrap();
    assert_eq!(stop["choices"][0]["delta"], serde_json::json!({}));
    assert_eq!(stop["choices"][0]["finish_reason"], "stop");
    assert_eq!(stop["choices"][0]["logprobs"], Value::Null);
}

#[test]
fn completion_round_trips() {
    let text = fixture("completion_request.json");
    let (req, value): (CompletionRequest, _) = reserialize(&text);
    assert_same(&value, &serde_json::from_str::<Value>(&text).unwrap(), "$");
    req.validate().unwrap();
    for name in ["completion_response.json", "completion_chunk.json"] {
        let text = fixture(name);
        let (_, value): (Completion, _) = reserialize(&text);
        assert_same(&value, &serde_json::from_str::<Value>(&text).unwrap(), name);
    }
}

#[test]
fn every_prompt_form_is_read() {
    let forms = [
        (r#""one""#, 1),
        (r#"["a","b","c"]"#, 3),
        (r#"[1,2,3]"#, 1),
        (r#"[[1,2],[3],[4,5,6]]"#, 3),
    ];
    for (prompt, count) in forms {
        let body = format!(r#"{{"model":"m","prompt":{prompt}}}"#);
        let req: CompletionRequest = parse_json(body.as_bytes()).unwrap();
        assert_eq!(req.prompt.items().len(), count, "{prompt}");
        let again: CompletionRequest =
            serde_json::from_value(serde_json::to_value(&req).unwrap()).unwrap();
        assert_eq!(again, req);
    }
}

#[test]
fn embeddings_round_trip_in_both_encodings() {
    let text = fixture("embedding_request.json");
    let (req, value): (EmbeddingRequest, _) = reserialize(&text);
    assert_same(&value, &serde_json::from_str::<Value>(&text).unwrap(), "$");
    req.validate().unwrap();
    let text = fixture("embedding_response.json");
    let (resp, value): (EmbeddingResponse, _) = reserialize(&text);
    assert_same(&value, &serde_json::from_str::<Value>(&text).unwrap(), "$");
    let floats = resp.data[0].embedding.to_floats().unwrap();
    let b64 = EmbeddingVector::encode(floats.clone(), EncodingFormat::Base64);
    assert!(matches!(b64, EmbeddingVector::Base64(_)));
    assert_eq!(b64.to_floats().unwrap(), floats);
}

#[test]
fn models_and_errors_round_trip() {
    let text = fixture("models_response.json");
    let (list, value): (ModelList, _) = reserialize(&text);
    assert_same(&value, &serde_json::from_str::<Value>(&text).unwrap(), "$");
    assert_eq!(list.data.len(), 2);
    let text = fixture("error_response.json");
    let (err, value): (ErrorEnvelope, _) = reserialize(&text);
    assert_same(&value, &serde_json::from_str::<Value>(&text).unwrap(), "$");
    assert_eq!(err.error.kind, ErrorType::InvalidRequestError);
}

#[test]
fn slot_unavailable_envelope_has_every_field() {
    let value =
        serde_json::to_value(ApiError::slot_unavailable("all slots are busy").into_envelope())
            .unwrap();
    assert_eq!(
        value,
        serde_json::json!({"error": {"message": "all slots are busy", "type": "unavailable_error",
            "param": null, "code": "slot_unavailable"}})
    );
}

#[test]
fn llama_server_slots_are_read() {
    let slots: Vec<SlotStatus> = serde_json::from_str(&fixture("llama_server_slots.json")).unwrap();
    assert_eq!(slots[0].id_task, 12);
    assert!(slots[0].is_processing);
    assert_eq!(slots[1].n_ctx, 4096);
    assert_eq!(SlotCounts::of(&slots, Some("any")), SlotCounts { total: 2, busy: 1 });
}

#[test]
fn slot_counts_filter_by_model() {
    let slot = |id, model: &str, busy| SlotStatus {
        id,
        id_task: if busy { 1 } else { -1 },
        n_ctx: 512,
        is_processing: busy,
        model: Some(model.into()),
        n_cached: None,
        phase: None,
    };
    let slots = [slot(0, "a", true), slot(1, "a", false), slot(0, "b", true)];
    assert_eq!(SlotCounts::of(&slots, Some("a")), SlotCounts { total: 2, busy: 1 });
    assert_eq!(SlotCounts::of(&slots, None), SlotCounts { total: 3, busy: 2 });
}
