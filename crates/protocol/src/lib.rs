//! The OpenAI wire format as slotgate speaks it: requests, responses, streamed chunks,
//! the error envelope, validation, and the engine's slot-status document.
//!
//! Pure types and functions; no I/O. Requests accept what the official SDKs send,
//! unknown fields included (they are ignored); responses are what they parse.

pub mod anthropic;
pub mod chat;
pub mod common;
pub mod completions;
pub mod embeddings;
pub mod error;
pub mod logit_bias;
pub mod logprobs;
pub mod models;
pub mod native;
pub mod parse;
pub mod responses;
pub mod resume;
pub mod slots;
pub mod sse;
pub mod tokens;
pub mod tools;
pub mod validate;

pub use chat::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
    ChatMessage, ChunkChoice, ContentPart, Delta, MessageContent, ResponseFormat, Role,
};
pub use common::{
    FinishReason, PromptTokensDetails, Sampling, Stop, StopReason, StreamOptions, Usage,
};
pub use completions::{
    Completion, CompletionChoice, CompletionRequest, Prompt, PromptItem, PromptObject, PromptPiece,
    SubPrompt,
};
pub use embeddings::{
    Embedding, EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage,
    EmbeddingVector, EncodingFormat,
};
pub use error::{ApiError, ContextSize, ErrorEnvelope, ErrorType, SLOT_UNAVAILABLE};
pub use logprobs::{ChoiceLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob};
pub use models::{Model, ModelList};
pub use parse::parse_json;
pub use responses::OWNER_HEADER;
pub use slots::{
    ModelSlots, SlotCounts, SlotPhase, SlotState, SlotStatus, REPLICA_HEADER, SLOTS_SEQ_HEADER,
};
pub use sse::{SseDecoder, SseEvent};
pub use tokens::{
    ApplyTemplateResponse, DetokenizeRequest, DetokenizeResponse, TokenOut, TokenizeRequest,
    TokenizeResponse,
};
pub use tools::{
    FunctionCall, FunctionCallDelta, FunctionDef, Tool, ToolCall, ToolCallDelta, ToolChoice,
};
