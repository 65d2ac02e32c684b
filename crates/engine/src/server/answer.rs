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
use slotgate_protocol::{resume, sse, ApiError, FinishReason, TokenLogprob, Usage};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::scheduler::{ChoiceUsage, Event, PromptProgress};

pub use super::collected::{collect, timings, Choice, Collected, Shape, UsageSum};

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
    /// The choice's `timings` so far, when asked for (`timings_per_token`).
    pub timings: Option<Timings>,
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
    /// How far choice `index` has read its prompt (`return_progress`); nothing
    /// in a format without such an event.
    fn progress(&self, _index: u32, _progress: &PromptProgress) -> String {
        String::new()
    }
}

/// How a stream is written, apart from its chunks.
#[derive(Debug, Clone, Copy)]
pub struct Streamed {
    /// Until the first event, an SSE comment this often.
    pub keepalive: Option<Duration>,
    /// A last chunk with the usage (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Each write ends with a mark of the tokens it carries, for a gateway
    /// that may resume the stream elsewhere ([`slotgate_protocol::resume`]).
    pub mark: bool,
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
    mark: bool,
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
        mark: options.mark,
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
            return Some((s.keepalive(), s));
        }
        let event = match s.pending.take() {
            Some(e) => Some(e),
            None => match s.keepalive.filter(|_| !s.opened.iter().any(|o| *o) && s.done == 0) {
                Some(wait) => match tokio::time::timeout(wait, s.rx.recv()).await {
                    Ok(event) => event,
                    Err(_) => return Some((s.keepalive(), s)),
                },
                None => s.rx.recv().await,
            },
        };
        let out = s.write(event);
        Some((out, s))
    })
    .map(|chunk: String| Ok::<_, Infallible>(Bytes::from(chunk)));
    let mut response = sse_response(body);
    if options.mark {
        // Says that the marks asked for come: a gateway follows them only then.
        let name = axum::http::HeaderName::from_static(resume::MARK_HEADER);
        response.headers_mut().insert(name, axum::http::HeaderValue::from_static("1"));
    }
    response
}

impl<W: ChunkWriter> StreamState<W> {
    /// A keep-alive comment, marked as carrying no tokens.
    fn keepalive(&self) -> String {
        let mut out = KEEPALIVE.to_owned();
        if self.mark {
            out.push_str(resume::NOTHING_MARK);
        }
        out
    }

    /// The chunks of one event, then its mark when the stream is marked.
    fn write(&mut self, event: Option<Event>) -> String {
        let mark = match &event {
            Some(Event::Text { index, tokens, .. }) => resume::mark(index.flat(), tokens),
            Some(Event::Done { index, .. }) => resume::end_mark(index.flat()),
            _ => resume::NOTHING_MARK.to_owned(),
        };
        let mut out = self.chunks(event);
        if self.mark {
            out.push_str(&mark);
        }
        out
    }

    fn chunks(&mut self, event: Option<Event>) -> String {
        let mut out = String::new();
        match event {
            Some(Event::Replayed { index: choice, text }) => {
                // What the client has already: read, so that the writer stands
                // where the first engine's did, and not sent.
                let index = choice.flat();
                self.open(index, &mut String::new());
                if let Some(sent) = self.sent.get_mut(index as usize) {
                    *sent += text.chars().count() as u32;
                }
                let _ = self.writer.text(index, Piece { text, ..Piece::default() });
            }
            Some(Event::Text { index: choice, text, logprobs, tokens, so_far }) => {
                let index = choice.flat();
                self.open(index, &mut out);
                let sent = self.sent.get_mut(index as usize);
                let offset = sent.as_deref().copied().unwrap_or(0);
                let chars = text.chars().count() as u32;
                if let Some(sent) = sent {
                    *sent += chars;
                }
                let timings = so_far.as_ref().map(timings);
                let piece = Piece { text, offset, logprobs, tokens, timings };
                out.push_str(&self.writer.text(index, piece));
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
            Some(Event::Progress { index, progress }) => {
                out.push_str(&self.writer.progress(index.flat(), &progress));
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
