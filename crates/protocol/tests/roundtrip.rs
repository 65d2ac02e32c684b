//! Property: any valid request survives serialize and deserialize unchanged.

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use slotgate_protocol::logit_bias::{Bias, LogitBias};
use slotgate_protocol::*;

fn text() -> impl Strategy<Value = String> {
    // Any Unicode, quotes and control characters included.
    any::<String>()
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![
        Just(Role::System),
        Just(Role::Developer),
        Just(Role::User),
        Just(Role::Assistant),
        Just(Role::Tool)
    ]
}

fn content() -> impl Strategy<Value = MessageContent> {
    prop_oneof![
        text().prop_map(MessageContent::Text),
        vec(text().prop_map(ContentPart::text), 1..4).prop_map(MessageContent::Parts),
    ]
}

fn message() -> impl Strategy<Value = ChatMessage> {
    (role(), content(), option::of("[a-z]{1,8}")).prop_map(|(role, content, name)| {
        let mut m = ChatMessage::new(role, "");
        m.content = Some(content);
        // A tool message answers a call, by its id.
        m.tool_call_id = (role == Role::Tool).then(|| "call_1".to_owned());
        m.name = name;
        m
    })
}

fn unit(max: f32) -> impl Strategy<Value = f32> {
    (0u32..=1000).prop_map(move |k| k as f32 / 1000.0 * max)
}

fn sampling() -> impl Strategy<Value = Sampling> {
    let stop = prop_oneof![
        "[a-z\\n]{1,5}".prop_map(Stop::One),
        vec("[a-z\\n]{1,5}", 0..=4).prop_map(Stop::Many),
    ];
    (
        (
            option::of(unit(2.0)),
            option::of(unit(1.0)),
            option::of(0i32..100),
            option::of(unit(1.0)),
        ),
        (option::of(1u32..=128), any::<bool>(), option::of(any::<bool>())),
        (option::of(stop), option::of(any::<i64>())),
        (option::of(unit(2.0)), option::of(unit(2.0))),
        option::of(btree_map((0u32..300_000).prop_map(|t| t.to_string()), -100i32..=100, 0..4)),
        option::of(text()),
    )
        .prop_map(|(t, n, s, p, bias, user)| {
            let (stream, include_usage) = (n.1, n.2);
            Sampling {
                temperature: t.0,
                top_p: t.1,
                top_k: t.2,
                min_p: t.3,
                n: n.0,
                stream: Some(stream),
                stream_options: if stream {
                    include_usage.map(|u| StreamOptions { include_usage: Some(u) })
                } else {
                    None
                },
                stop: s.0,
                seed: s.1,
                presence_penalty: p.0.map(|v| v - 1.0),
                frequency_penalty: p.1.map(|v| v - 1.0),
                logit_bias: bias.map(|m| {
                    LogitBias::Map(m.into_iter().map(|(k, v)| (k, Bias::Value(v as f32))).collect())
                }),
                prompt_cache_key: user.clone(),
                cache_salt: user.clone().filter(|u| !u.is_empty() && u.len() <= 1024),
                user,
                cache_prompt: None,
                grammar: None,
                json_schema: None,
                n_probs: None,
                ignore_eos: None,
                verbose: None,
                return_progress: None,
                post_sampling_probs: None,
                timings_per_token: None,
                slotgate_resume: None,
            }
        })
}

fn chat_request() -> impl Strategy<Value = ChatCompletionRequest> {
    (
        "[a-z0-9.-]{1,20}",
        vec(message(), 1..6),
        option::of(1u32..4096),
        option::of(1u32..4096),
        sampling(),
    )
        .prop_map(|(model, messages, max_tokens, max_completion_tokens, sampling)| {
            let mut req = ChatCompletionRequest::new(model, messages);
            req.max_tokens = max_tokens;
            req.max_completion_tokens = max_completion_tokens;
            req.sampling = sampling;
            req
        })
}

fn prompt() -> impl Strategy<Value = Prompt> {
    prop_oneof![
        text().prop_map(Prompt::Text),
        vec(text(), 1..4).prop_map(Prompt::Texts),
        vec(0u32..262_144, 1..16).prop_map(Prompt::Tokens),
        vec(vec(0u32..262_144, 1..8), 1..4).prop_map(Prompt::TokenArrays),
    ]
}

fn completion_request() -> impl Strategy<Value = CompletionRequest> {
    ("[a-z0-9.-]{1,20}", prompt(), option::of(1u32..4096), option::of(any::<bool>()), sampling())
        .prop_map(|(model, prompt, max_tokens, echo, sampling)| {
            let mut req = CompletionRequest::new(model, prompt);
            req.max_tokens = max_tokens;
            req.echo = echo;
            req.sampling = sampling;
            req
        })
}

proptest! {
    #[test]
    fn valid_chat_requests_round_trip(req in chat_request()) {
        prop_assert!(req.validate().is_ok(), "{:?}", req.validate());
        let json = serde_json::to_vec(&req).unwrap();
        let again: ChatCompletionRequest = parse_json(&json).unwrap();
        prop_assert_eq!(again, req);
    }

    #[test]
    fn valid_completion_requests_round_trip(req in completion_request()) {
        prop_assert!(req.validate().is_ok(), "{:?}", req.validate());
        let json = serde_json::to_vec(&req).unwrap();
        let again: CompletionRequest = parse_json(&json).unwrap();
        prop_assert_eq!(again, req);
    }

    #[test]
    fn sse_decoding_survives_any_split(texts in vec(text(), 1..5), split in any::<prop::sample::Index>()) {
        let mut stream = String::new();
        for t in &texts {
            stream.push_str(&slotgate_protocol::sse::encode(t));
        }
        stream.push_str(slotgate_protocol::sse::DONE_EVENT);
        let at = split.index(stream.len() + 1);
        let mut dec = SseDecoder::new();
        let mut events = dec.push(&stream.as_bytes()[..at]);
        events.extend(dec.push(&stream.as_bytes()[at..]));
        prop_assert_eq!(events.len(), texts.len() + 1);
        for (event, t) in events.iter().zip(&texts) {
            prop_assert_eq!(&serde_json::from_str::<String>(&event.data).unwrap(), t);
        }
        prop_assert!(events[texts.len()].is_done());
    }
}
