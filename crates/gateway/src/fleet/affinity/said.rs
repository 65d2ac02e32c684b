//! What a request body says that its affinity key is derived from, read in the
//! same pass as the fields routing needs. The opening messages are read into
//! borrowed text, not built as JSON values: building them was the largest part
//! of the gateway's own time per chat request (see BENCHMARKS.md).
//!
//! What is read is what [`super::key`] has always hashed, so that keys stay the
//! same across versions of the gateway (a replica of an older version keeps
//! sending a conversation where a newer one does): a string content as it is,
//! any other content as its compact JSON text, a role that is no string as none.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, value::MapAccessDeserializer, value::SeqAccessDeserializer, IgnoredAny};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Most bytes of chat content hashed; a longer opening is cut here.
pub const CHAT_PREFIX_BYTES: usize = 4096;

/// The fields of a body that the key is derived from. The gateway reads them in
/// the one pass that reads the routing fields (`proxy::peek`); read alone, as
/// the tests do, they deserialize the same way.
#[derive(Debug, Default, Deserialize)]
pub struct Said<'a> {
    /// OpenAI's `prompt_cache_key`.
    pub prompt_cache_key: Option<Value>,
    /// The opening of `messages`.
    #[serde(borrow)]
    pub messages: Option<Opening<'a>>,
    /// The start of `prompt`, for text completions.
    pub prompt: Option<super::prompt_head::PromptHead>,
}

/// The messages of a chat that the key reads: those up to the first user
/// message, or up to [`CHAT_PREFIX_BYTES`] of content; `None` when `messages`
/// is no list. The later turns that a long conversation resends are checked to
/// be JSON and skipped, not built.
#[derive(Debug, Default)]
pub struct Opening<'a>(pub Option<Vec<Turn<'a>>>);

/// One message of the opening, as the key reads it. A message that is no
/// object has neither role nor content.
#[derive(Debug, Default)]
pub struct Turn<'a> {
    role: Option<Text<'a>>,
    /// The content: its text, or the compact JSON of anything else.
    pub content: Option<Text<'a>>,
}

impl Turn<'_> {
    /// The role, when it is a string.
    pub fn role(&self) -> Option<&str> {
        match &self.role {
            Some(Text::Str(role)) => Some(role),
            _ => None,
        }
    }
}

/// A field's value: a string (borrowed from the body unless it had escapes), or
/// the compact JSON text of anything else.
#[derive(Debug)]
pub enum Text<'a> {
    Str(Cow<'a, str>),
    Json(String),
}

impl Text<'_> {
    /// What is hashed of it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Str(text) => text,
            Self::Json(json) => json,
        }
    }
}

/// A visitor's answer to a JSON scalar where it wants a list or an object: the
/// value's default (no opening, a message with neither role nor content).
macro_rules! nothing_of_scalars {
    () => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Self::Value::default())
        }
    };
}

impl<'de: 'a, 'a> Deserialize<'de> for Opening<'a> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        de.deserialize_any(OpeningVisitor)
    }
}

struct OpeningVisitor;

impl<'de> de::Visitor<'de> for OpeningVisitor {
    type Value = Opening<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of messages")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut kept = Vec::new();
        let mut budget = CHAT_PREFIX_BYTES;
        let mut reading = true;
        while reading {
            let Some(turn) = seq.next_element::<Turn>()? else {
                return Ok(Opening(Some(kept)));
            };
            let content = turn.content.as_ref().map_or(0, |c| c.as_str().len());
            budget = budget.saturating_sub(content);
            reading = budget > 0 && turn.role() != Some("user");
            kept.push(turn);
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Opening(Some(kept)))
    }

    // Anything else is not a chat: no opening, as when `messages` is absent (the
    // key then falls back to `prompt`); the engine judges the field itself.
    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        IgnoredAny::deserialize(MapAccessDeserializer::new(map))?;
        Ok(Opening::default())
    }
    nothing_of_scalars!();
}

/// The two keys of a message that the key reads.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Field {
    Role,
    Content,
    #[serde(other)]
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Turn<'a> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        de.deserialize_any(TurnVisitor)
    }
}

struct TurnVisitor;

impl<'de> de::Visitor<'de> for TurnVisitor {
    type Value = Turn<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a message")
    }

    // A key given twice counts as given last, as in a JSON object built whole.
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut turn = Turn::default();
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Role => turn.role = Some(map.next_value()?),
                Field::Content => turn.content = Some(map.next_value()?),
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(turn)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        IgnoredAny::deserialize(SeqAccessDeserializer::new(seq))?;
        Ok(Turn::default())
    }
    nothing_of_scalars!();
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        de.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl TextVisitor {
    fn json<E>(value: Value) -> Result<Text<'static>, E> {
        Ok(Text::Json(value.to_string()))
    }
}

impl<'de> de::Visitor<'de> for TextVisitor {
    type Value = Text<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(Text::Str(Cow::Borrowed(text)))
    }
    fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Text::Str(Cow::Owned(text.to_owned())))
    }
    fn visit_string<E>(self, text: String) -> Result<Self::Value, E> {
        Ok(Text::Str(Cow::Owned(text)))
    }
    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Self::json(Value::from(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
        Self::json(Value::from(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
        Self::json(Value::from(n))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Self::Value, E> {
        Self::json(Value::from(n))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Self::json(Value::Null)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Self::json(Value::deserialize(SeqAccessDeserializer::new(seq))?)
    }
    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Self::json(Value::deserialize(MapAccessDeserializer::new(map))?)
    }
}
