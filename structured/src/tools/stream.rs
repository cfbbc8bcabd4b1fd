//! Reading a model's output as it streams: text is passed on as content unless it may
//! begin a call marker (then it is held until the next characters tell), calls are
//! announced once their name is known, and their arguments are passed on as they come.
//!
//! The output is read one character at a time, whatever the deltas it arrives in, so the
//! same text gives the same content and calls however it is split. Text that opens a call
//! but turns out not to be one (before any call in it began) is content after all; a call
//! that breaks off after it began keeps the arguments streamed so far (`complete: false`)
//! and the rest of it is dropped up to the format's end marker (Hermes, DeepSeek) or next
//! start marker (Llama, Mistral). Whitespace between calls, and between a call and the
//! output's start or end, is not content; whitespace between a call and text is.

use std::collections::VecDeque;

use super::format::ToolCallFormat;
use super::readers::{self, Resume};
use super::region::{Flow, Found, Place, Region};
use super::types::{ParsedOutput, ToolCall, ToolDelta};

/// The most text a region may hold back before a call in it begins: past it, the region
/// is text (a call's name and the start of its arguments come long before).
const MAX_UNSTARTED: usize = 32 * 1024;

/// A region being read.
struct OpenRegion {
    reader: Box<dyn Region + Send>,
    /// The region's text so far, its marker first.
    text: String,
    marker_len: usize,
    /// The whitespace held before the marker.
    before: String,
    /// Whether a call began in it.
    started: bool,
    /// The call whose arguments are being read.
    call: Option<usize>,
}

enum Mode {
    /// Text, with the end that may begin a marker held back.
    Text {
        held: String,
    },
    Region(Box<OpenRegion>),
    /// The rest of a call that broke off, dropped up to where reading resumes.
    Skip {
        resume: Resume,
        held: String,
    },
}

/// One request's output read as it streams. Feed it each piece of detokenized text (with
/// special tokens kept, as the markers may be special tokens) with
/// [`ToolCallStream::push`], then call [`ToolCallStream::finish`] once.
pub struct ToolCallStream {
    format: ToolCallFormat,
    mode: Mode,
    queue: VecDeque<char>,
    deltas: Vec<ToolDelta>,
    content: String,
    calls: Vec<ToolCall>,
    /// The whitespace held since the output's start or the last region, while nothing else
    /// came after it.
    boundary: Option<String>,
    after_region: bool,
    finished: bool,
}

impl std::fmt::Debug for ToolCallStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolCallStream")
            .field("format", &self.format)
            .field("content", &self.content)
            .field("calls", &self.calls)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl ToolCallStream {
    /// A stream of output in `format`, nothing read yet.
    pub fn new(format: ToolCallFormat) -> ToolCallStream {
        ToolCallStream {
            format,
            mode: Mode::Text {
                held: String::new(),
            },
            queue: VecDeque::new(),
            deltas: Vec::new(),
            content: String::new(),
            calls: Vec::new(),
            boundary: Some(String::new()),
            after_region: false,
            finished: false,
        }
    }

    /// Reads the next piece of output; returns what it adds to the message (nothing after
    /// [`ToolCallStream::finish`]).
    pub fn push(&mut self, text: &str) -> Vec<ToolDelta> {
        if !self.finished {
            self.queue.extend(text.chars());
            self.drain();
        }
        std::mem::take(&mut self.deltas)
    }

    /// Ends the output: passes on what was held back. Returns the last deltas.
    pub fn finish(&mut self) -> Vec<ToolDelta> {
        if self.finished {
            return Vec::new();
        }
        self.finished = true;
        loop {
            self.drain();
            match std::mem::replace(
                &mut self.mode,
                Mode::Text {
                    held: String::new(),
                },
            ) {
                Mode::Text { held } => {
                    held.chars().for_each(|c| self.text_char(c));
                    if let Some(spaces) = self.boundary.take() {
                        if !self.after_region {
                            self.emit_content(&spaces);
                        }
                    }
                    break;
                }
                Mode::Region(mut region) => {
                    let mut found = Vec::new();
                    let flow = region.reader.finish(&mut found);
                    self.apply(&mut region, found);
                    match flow {
                        Flow::End { unused } => self.end_region(&region, unused),
                        _ if region.started => break,
                        _ => self.roll_back(*region),
                    }
                }
                Mode::Skip { .. } => break,
            }
        }
        std::mem::take(&mut self.deltas)
    }

    /// The content and calls read so far (all of them after [`ToolCallStream::finish`]).
    pub fn parsed(&self) -> ParsedOutput {
        ParsedOutput {
            content: (!self.content.is_empty()).then(|| self.content.clone()),
            calls: self.calls.clone(),
        }
    }

    fn drain(&mut self) {
        while let Some(c) = self.queue.pop_front() {
            self.step(c);
        }
    }

    /// Reads `text` before the rest of the queue.
    fn read_again(&mut self, text: &str) {
        for c in text.chars().rev() {
            self.queue.push_front(c);
        }
    }

    fn step(&mut self, c: char) {
        match std::mem::replace(
            &mut self.mode,
            Mode::Text {
                held: String::new(),
            },
        ) {
            Mode::Text { mut held } => {
                held.push(c);
                self.text(held);
            }
            Mode::Region(mut region) => {
                region.text.push(c);
                let mut found = Vec::new();
                let flow = region.reader.feed(c, &mut found);
                self.apply(&mut region, found);
                match flow {
                    Flow::More if region.started || region.text.len() <= MAX_UNSTARTED => {
                        self.mode = Mode::Region(region)
                    }
                    Flow::More => self.roll_back(*region),
                    Flow::End { unused } => self.end_region(&region, unused),
                    Flow::Fail if region.started => {
                        self.mode = Mode::Skip {
                            resume: readers::resume(self.format),
                            held: String::new(),
                        };
                        self.read_again(&c.to_string());
                    }
                    Flow::Fail => self.roll_back(*region),
                }
            }
            Mode::Skip { resume, mut held } => {
                held.push(c);
                while !resume.text.starts_with(held.as_str()) {
                    held.remove(0);
                }
                if held == resume.text {
                    self.boundary = Some(String::new());
                    self.after_region = true;
                    if !resume.dropped {
                        self.read_again(&held);
                    }
                } else {
                    self.mode = Mode::Skip { resume, held };
                }
            }
        }
    }

    /// Text mode with `held` unread: passes on what cannot begin a marker, and opens a
    /// region at a whole one.
    fn text(&mut self, mut held: String) {
        while !held.is_empty() {
            let (boundary, after_region) = (self.boundary.is_some(), self.after_region);
            let markers =
                readers::markers(self.format)
                    .iter()
                    .filter(|marker| match marker.place {
                        Place::Anywhere => true,
                        Place::Boundary => boundary,
                        Place::AfterRegion => boundary && after_region,
                    });
            let mut prefix = false;
            for marker in markers {
                if marker.text == held {
                    let before = self.boundary.take().unwrap_or_default();
                    self.mode = Mode::Region(Box::new(OpenRegion {
                        reader: readers::open(self.format, marker.text),
                        marker_len: held.len(),
                        text: held,
                        before,
                        started: false,
                        call: None,
                    }));
                    return;
                }
                prefix |= marker.text.starts_with(held.as_str());
            }
            if prefix {
                break;
            }
            let first = held.remove(0);
            self.text_char(first);
        }
        self.mode = Mode::Text { held };
    }

    /// Passes on one character of text, holding whitespace at a boundary.
    fn text_char(&mut self, c: char) {
        if let Some(spaces) = &mut self.boundary {
            if c.is_whitespace() {
                spaces.push(c);
                return;
            }
            let spaces = std::mem::take(spaces);
            self.boundary = None;
            self.emit_content(&spaces);
        }
        let mut buf = [0; 4];
        self.emit_content(c.encode_utf8(&mut buf));
    }

    /// The region ended; its last `unused` bytes are read again as text.
    fn end_region(&mut self, region: &OpenRegion, unused: usize) {
        self.mode = Mode::Text {
            held: String::new(),
        };
        self.boundary = Some(String::new());
        self.after_region = true;
        let tail = region.text.len().saturating_sub(unused);
        match region.text.get(tail..) {
            Some(rest) => self.read_again(rest),
            None => self.read_again(&region.text),
        }
    }

    /// The region held no call: its marker is text, and what followed is read again.
    fn roll_back(&mut self, region: OpenRegion) {
        self.mode = Mode::Text {
            held: String::new(),
        };
        self.boundary = None;
        self.emit_content(&region.before);
        let (marker, rest) = region.text.split_at(region.marker_len);
        self.emit_content(marker);
        self.read_again(rest);
    }

    /// Records what a region's reader found, as calls and deltas.
    fn apply(&mut self, region: &mut OpenRegion, found: Vec<Found>) {
        for found in found {
            match found {
                Found::Start(name) => {
                    region.started = true;
                    let index = self.calls.len();
                    region.call = Some(index);
                    self.calls.push(ToolCall {
                        name: name.clone(),
                        arguments: String::new(),
                        complete: false,
                    });
                    self.deltas.push(ToolDelta::CallStart { index, name });
                }
                Found::Args(text) => {
                    let Some(index) = region.call else { continue };
                    if text.is_empty() {
                        continue;
                    }
                    self.calls[index].arguments.push_str(&text);
                    match self.deltas.last_mut() {
                        Some(ToolDelta::Arguments {
                            index: last,
                            fragment,
                        }) if *last == index => fragment.push_str(&text),
                        _ => self.deltas.push(ToolDelta::Arguments {
                            index,
                            fragment: text,
                        }),
                    }
                }
                Found::CallDone => {
                    if let Some(index) = region.call.take() {
                        self.calls[index].complete = true;
                    }
                }
            }
        }
    }

    fn emit_content(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.content.push_str(text);
        match self.deltas.last_mut() {
            Some(ToolDelta::Content(content)) => content.push_str(text),
            _ => self.deltas.push(ToolDelta::Content(text.to_owned())),
        }
    }
}
