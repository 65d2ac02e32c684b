//! Writes a job's events as an OpenAI answer: collected into one JSON body, or
//! streamed as server-sent events. The job is the same either way.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{self, Stream, StreamExt};
use slotgate_protocol::native::Timings;
use slotgate_protocol::{sse, ApiError, FinishReason, TokenLogprob, Usage};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::scheduler::{ChoiceIndex, ChoiceUsage, Event};

/// The shape of a job's answer: how many choices (prompts × n); which prompt
/// and sample each is, its [`ChoiceIndex`] says.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Choices in all.
    pub choices: u32,
}

/// Sums the usage of finished choices; a prompt's tokens count once, not once per
/// sample. Choices run side by side, so the times are the longest choice's.
#[derive(Debug, Default)]
pub struct UsageSum {
    prompt: u32,
    cached: u32,
    completion: u32,
    /// Decode steps of generation: a choice's first token needs none.
    steps: u32,
    prompt_time: Duration,
    generation_time: Duration,
}

impl UsageSum {
    /// Adds choice `index`.
    pub fn add(&mut self, index: ChoiceIndex, usage: ChoiceUsage) {
        if index.sample == 0 {
            self.prompt += usage.prompt_tokens;
            self.cached += usage.cached_tokens;
        }
        self.completion += usage.completion_tokens;
        self.steps += usage.completion_tokens.saturating_sub(1);
        self.prompt_time = self.prompt_time.max(usage.prompt_time);
        self.generation_time = self.generation_time.max(usage.generation_time);
    }

    /// The OpenAI usage object.
    pub fn usage(&self) -> Usage {
        Usage::new(self.prompt, self.completion, self.cached)
    }

    /// llama-server's `timings` of the whole answer.
    pub fn timings(&self) -> Timings {
        let read = self.prompt.saturating_sub(self.cached);
        Timings::new(
            self.cached,
            (read, self.prompt_time.as_secs_f64() * 1e3),
            (self.completion, self.steps, self.generation_time.as_secs_f64() * 1e3),
        )
    }
}

/// llama-server's `timings` of one finished choice.
pub fn timings(usage: &ChoiceUsage) -> Timings {
    let mut one = UsageSum::default();
    one.add(ChoiceIndex::default(), *usage);
    one.timings()
}

/// Every choice's text and finish reason, in index order.
#[derive(Debug)]
pub struct Collected {
    /// Text per choice.
    pub texts: Vec<String>,
    /// Finish reason per choice.
    pub reasons: Vec<FinishReason>,
    /// Per choice, the stop string that ended it, if one did.
    pub stops: Vec<Option<String>>,
    /// Per choice, the ids of its tokens.
    pub tokens: Vec<Vec<i32>>,
    /// Per choice, its slot, token counts and times.
    pub usages: Vec<ChoiceUsage>,
    /// Log probabilities per choice (empty unless asked for).
    pub logprobs: Vec<Vec<TokenLogprob>>,
    /// Token counts.
    pub usage: Usage,
    /// llama-server's `timings` of the whole answer.
    pub timings: Timings,
}

impl Collected {
    /// Each choice, in index order.
    pub fn choices(self) -> impl Iterator<Item = Choice> {
        let each = self.texts.into_iter().zip(self.reasons).zip(self.stops);
        let more = self.logprobs.into_iter().zip(self.tokens).zip(self.usages);
        (0u32..).zip(each.zip(more)).map(
            |(index, (((text, reason), stop), ((logprobs, tokens), usage)))| Choice {
                index,
                text,
                reason,
                stop,
                logprobs,
                tokens,
                usage,
            },
        )
    }
}

/// One choice of a collected answer.
#[derive(Debug)]
pub struct Choice {
    /// Its place among the choices.
    pub index: u32,
    /// Its text.
    pub text: String,
    /// Why it stopped.
    pub reason: FinishReason,
    /// The stop string that stopped it, if one did.
    pub stop: Option<String>,
    /// Its log probabilities (empty unless asked for).
    pub logprobs: Vec<TokenLogprob>,
    /// The ids of its tokens.
    pub tokens: Vec<i32>,
    /// Its slot, token counts and times.
    pub usage: ChoiceUsage,
}

/// The answer to a job: streamed through `writer` when `streamed` says how,
/// or else collected whole and made a body by `whole`.
pub async fn respond<W: ChunkWriter>(
    (first, rx): (Option<Event>, UnboundedReceiver<Event>),
    writer: W,
    shape: Shape,
    streamed: Option<Streamed>,
    whole: impl FnOnce(W, Collected) -> Response,
) -> Result<Response, ApiError> {
    if let Some(options) = streamed {
        return Ok(stream(first, rx, writer, shape, options));
    }
    // Without a stream, `run` waited for the first event.
    let Some(first) = first else { return Err(ApiError::internal()) };
    let done = collect(first, rx, shape).await?;
    Ok(whole(writer, done))
}

/// Waits for the first event, so that an error (a full queue, a prompt too long)
/// can still be sent with its own status instead of a 200.
pub async fn first_event(rx: &mut UnboundedReceiver<Event>) -> Result<Event, ApiError> {
    match rx.recv().await {
        Some(Event::Error(err)) => Err(err),
        Some(event) => Ok(event),
        None => Err(ApiError::internal()),
    }
}

/// Reads events until every choice is done.
pub async fn collect(
    first: Event,
    mut rx: UnboundedReceiver<Event>,
    shape: Shape,
) -> Result<Collected, ApiError> {
    let n = shape.choices as usize;
    let mut texts = vec![String::new(); n];
    let mut logprobs = vec![Vec::new(); n];
    let mut reasons = vec![None; n];
    let mut stops = vec![None; n];
    let mut tokens = vec![Vec::new(); n];
    let mut usages = vec![ChoiceUsage::default(); n];
    let mut usage = UsageSum::default();
    let mut done = 0;
    let mut next = Some(first);
    while done < n {
        let event = match next.take() {
            Some(e) => e,
            None => rx.recv().await.ok_or_else(ApiError::internal)?,
        };
        match event {
            Event::Text { index, text, logprobs: l, tokens: ids } => {
                let i = index.flat() as usize;
                texts[i].push_str(&text);
                logprobs[i].extend(l);
                tokens[i].extend(ids);
            }
            Event::Done { index, reason, stop, usage: u } => {
                let i = index.flat() as usize;
                reasons[i] = Some(reason);
                stops[i] = stop;
                usages[i] = u;
                usage.add(index, u);
                done += 1;
            }
            Event::Error(err) => return Err(err),
        }
    }
    Ok(Collected {
        texts,
        reasons: reasons.into_iter().map(|r| r.unwrap_or(FinishReason::Stop)).collect(),
        stops,
        tokens,
        usages,
        logprobs,
        usage: usage.usage(),
        timings: usage.timings(),
    })
}

/// New text of a choice, as a writer gets it.
#[derive(Debug, Default)]
pub struct Piece {
    /// The text.
    pub text: String,
    /// Where it starts in the choice's text, in characters.
    pub offset: u32,
    /// The log probabilities of the tokens sampled since the last piece.
    pub logprobs: Vec<TokenLogprob>,
    /// The ids of the tokens sampled since the last piece.
    pub tokens: Vec<i32>,
}

/// How a choice ended, as a writer gets it.
#[derive(Debug)]
pub struct Ending {
    /// Why.
    pub reason: FinishReason,
    /// The stop string that ended it, if one did.
    pub stop: Option<String>,
    /// Its slot, token counts and times.
    pub usage: ChoiceUsage,
}

/// How one kind of answer writes its chunks.
pub trait ChunkWriter: Send + 'static {
    /// The chunk that opens choice `index`, if this format has one.
    fn open(&self, index: u32) -> Option<String>;
    /// New text of choice `index`.
    fn text(&self, index: u32, piece: Piece) -> String;
    /// The last chunk of choice `index`.
    fn finish(&self, index: u32, ending: Ending) -> String;
    /// The final usage chunk, with the whole answer's timings.
    fn usage(&self, usage: Usage, timings: Timings) -> String;
    /// What ends the stream: OpenAI's `data: [DONE]`, unless the format has none.
    fn done(&self) -> &'static str {
        sse::DONE_EVENT
    }
}

/// How a stream is written, apart from its chunks.
#[derive(Debug, Clone, Copy)]
pub struct Streamed {
    /// Until the first event, an SSE comment this often.
    pub keepalive: Option<Duration>,
    /// A last chunk with the usage (`stream_options.include_usage`).
    pub include_usage: bool,
}

/// The comment sent while a stream waits for its first event: clients skip
/// lines that start with `:`, and proxies see traffic.
pub const KEEPALIVE: &str = ": keep-alive\n\n";

struct StreamState<W> {
    rx: UnboundedReceiver<Event>,
    pending: Option<Event>,
    /// Whether anything was sent: a first event, or the opening keep-alive.
    started: bool,
    keepalive: Option<Duration>,
    writer: W,
    shape: Shape,
    include_usage: bool,
    opened: Vec<bool>,
    /// Characters of text sent per choice.
    sent: Vec<u32>,
    done: u32,
    usage: UsageSum,
    ended: bool,
}

/// Streams the answer as server-sent events, ending with `data: [DONE]`. An error
/// after the stream began is sent as a final `{"error": ...}` event. Without a
/// `first` event yet, the stream opens with a keep-alive comment, and sends one
/// every interval until the first event arrives.
pub fn stream<W: ChunkWriter>(
    first: Option<Event>,
    rx: UnboundedReceiver<Event>,
    writer: W,
    shape: Shape,
    options: Streamed,
) -> Response {
    let state = StreamState {
        rx,
        started: first.is_some(),
        pending: first,
        keepalive: options.keepalive,
        writer,
        shape,
        include_usage: options.include_usage,
        opened: vec![false; shape.choices as usize],
        sent: vec![0; shape.choices as usize],
        done: 0,
        usage: UsageSum::default(),
        ended: false,
    };
    let body = stream::unfold(state, |mut s| async move {
        if s.ended {
            return None;
        }
        if !s.started {
            // Opened before the first event: say so at once, then every interval.
            s.started = true;
            return Some((KEEPALIVE.to_owned(), s));
        }
        let event = match s.pending.take() {
            Some(e) => Some(e),
            None => match s.keepalive.filter(|_| !s.opened.iter().any(|o| *o) && s.done == 0) {
                Some(wait) => match tokio::time::timeout(wait, s.rx.recv()).await {
                    Ok(event) => event,
                    Err(_) => return Some((KEEPALIVE.to_owned(), s)),
                },
                None => s.rx.recv().await,
            },
        };
        let out = s.write(event);
        Some((out, s))
    })
    .map(|chunk: String| Ok::<_, Infallible>(Bytes::from(chunk)));
    sse_response(body)
}

impl<W: ChunkWriter> StreamState<W> {
    fn write(&mut self, event: Option<Event>) -> String {
        let mut out = String::new();
        match event {
            Some(Event::Text { index: choice, text, logprobs, tokens }) => {
                let index = choice.flat();
                self.open(index, &mut out);
                let sent = self.sent.get_mut(index as usize);
                let offset = sent.as_deref().copied().unwrap_or(0);
                let chars = text.chars().count() as u32;
                if let Some(sent) = sent {
                    *sent += chars;
                }
                out.push_str(&self.writer.text(index, Piece { text, offset, logprobs, tokens }));
            }
            Some(Event::Done { index: choice, reason, stop, usage }) => {
                let index = choice.flat();
                self.open(index, &mut out);
                out.push_str(&self.writer.finish(index, Ending { reason, stop, usage }));
                self.usage.add(choice, usage);
                self.done += 1;
                if self.done == self.shape.choices {
                    if self.include_usage {
                        out.push_str(&self.writer.usage(self.usage.usage(), self.usage.timings()));
                    }
                    out.push_str(self.writer.done());
                    self.ended = true;
                }
            }
            Some(Event::Error(err)) => {
                out.push_str(&sse::encode(&err.into_envelope()));
                self.ended = true;
            }
            None => {
                out.push_str(&sse::encode(&ApiError::internal().into_envelope()));
                self.ended = true;
            }
        }
        out
    }

    fn open(&mut self, index: u32, out: &mut String) {
        if let Some(opened) = self.opened.get_mut(index as usize) {
            if !*opened {
                *opened = true;
                if let Some(chunk) = self.writer.open(index) {
                    out.push_str(&chunk);
                }
            }
        }
    }
}

fn sse_response<S>(body: S) -> Response
where
    S: Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
{
    let mut response = (StatusCode::OK, Body::from_stream(body)).into_response();
    slotgate_http::event_stream(&mut response);
    response
}
