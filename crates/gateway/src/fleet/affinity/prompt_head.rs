//! What an affinity key reads of a text completion's `prompt`: the start of a
//! text, or the first tokens of a token list, read in the same pass as the
//! routing fields; the rest is checked to be JSON and skipped, not built.

use std::fmt;

use serde::de::{self, value::MapAccessDeserializer, value::SeqAccessDeserializer, IgnoredAny};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// What the key reads of `prompt`: a text's first [`PROMPT_PREFIX_BYTES`]
/// bytes, or a token list's first [`PROMPT_TOKENS`] tokens (of a batch, its
/// first prompt's). The rest is checked to be JSON and skipped, not built: an
/// 8-million-token prompt built as JSON values took two gigabytes.
///
/// [`PROMPT_PREFIX_BYTES`]: super::PROMPT_PREFIX_BYTES
#[derive(Debug, Default, Clone, PartialEq)]
pub enum PromptHead {
    /// The start of a text prompt.
    Text(String),
    /// The first tokens, each as its compact JSON text.
    Tokens(Vec<String>),
    /// Nothing a key is made of (an empty list, an object, a number...).
    #[default]
    Nothing,
}

/// Tokens of a token-list prompt that the key reads.
pub const PROMPT_TOKENS: usize = super::PROMPT_PREFIX_BYTES / 4;

impl<'de> Deserialize<'de> for PromptHead {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(HeadVisitor { outer: true })
    }
}

/// Reads a prompt (`outer`: the whole field, whose list may be a batch) or a
/// batch's first prompt.
struct HeadVisitor {
    outer: bool,
}

impl<'de> de::Visitor<'de> for HeadVisitor {
    type Value = PromptHead;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a prompt")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<PromptHead, E> {
        Ok(PromptHead::Text(super::cut(v, super::PROMPT_PREFIX_BYTES).to_owned()))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<PromptHead, A::Error> {
        let mut tokens = Vec::new();
        if self.outer {
            // A list whose first item is no number is a batch: its first prompt.
            match seq.next_element::<Item>()? {
                None => return Ok(PromptHead::Nothing),
                Some(Item::Head(head)) => {
                    while seq.next_element::<IgnoredAny>()?.is_some() {}
                    return Ok(head);
                }
                Some(Item::Number(n)) => tokens.push(n),
            }
        }
        while let Some(token) = seq.next_element::<Small>()? {
            if tokens.len() < PROMPT_TOKENS {
                tokens.push(token.0);
            }
        }
        Ok(if tokens.is_empty() { PromptHead::Nothing } else { PromptHead::Tokens(tokens) })
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<PromptHead, A::Error> {
        IgnoredAny::deserialize(MapAccessDeserializer::new(map))?;
        Ok(PromptHead::Nothing)
    }

    fn visit_bool<E>(self, _: bool) -> Result<PromptHead, E> {
        Ok(PromptHead::Nothing)
    }
    fn visit_i64<E>(self, _: i64) -> Result<PromptHead, E> {
        Ok(PromptHead::Nothing)
    }
    fn visit_u64<E>(self, _: u64) -> Result<PromptHead, E> {
        Ok(PromptHead::Nothing)
    }
    fn visit_f64<E>(self, _: f64) -> Result<PromptHead, E> {
        Ok(PromptHead::Nothing)
    }
    fn visit_unit<E>(self) -> Result<PromptHead, E> {
        Ok(PromptHead::Nothing)
    }
}

/// The first item of a prompt list: a number (the list is one token prompt), or
/// the first prompt of a batch.
enum Item {
    Number(String),
    Head(PromptHead),
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Item;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a prompt or a token")
            }
            fn visit_i64<E>(self, v: i64) -> Result<Item, E> {
                Ok(Item::Number(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Item, E> {
                Ok(Item::Number(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Item, E> {
                Ok(Item::Number(Value::from(v).to_string()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Item, E> {
                HeadVisitor { outer: false }.visit_str(v).map(Item::Head)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Item, A::Error> {
                HeadVisitor { outer: false }.visit_seq(seq).map(Item::Head)
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Item, A::Error> {
                HeadVisitor { outer: false }.visit_map(map).map(Item::Head)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Item, E> {
                Ok(Item::Head(PromptHead::Nothing))
            }
            fn visit_unit<E>(self) -> Result<Item, E> {
                Ok(Item::Head(PromptHead::Nothing))
            }
        }
        d.deserialize_any(V)
    }
}

/// One item of a token list as its compact JSON text, as the key has always
/// hashed it; a list or object item (never a token) is skipped, not built.
struct Small(String);

impl<'de> Deserialize<'de> for Small {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Small;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a token")
            }
            fn visit_i64<E>(self, v: i64) -> Result<Small, E> {
                Ok(Small(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Small, E> {
                Ok(Small(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Small, E> {
                Ok(Small(Value::from(v).to_string()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Small, E> {
                Ok(Small(Value::from(super::cut(v, super::PROMPT_PREFIX_BYTES)).to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Small, E> {
                Ok(Small(v.to_string()))
            }
            fn visit_unit<E>(self) -> Result<Small, E> {
                Ok(Small("null".into()))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Small, A::Error> {
                IgnoredAny::deserialize(SeqAccessDeserializer::new(seq))?;
                Ok(Small("[]".into()))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Small, A::Error> {
                IgnoredAny::deserialize(MapAccessDeserializer::new(map))?;
                Ok(Small("{}".into()))
            }
        }
        d.deserialize_any(V)
    }
}
