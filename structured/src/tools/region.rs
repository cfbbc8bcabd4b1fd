//! What the format readers share: a region is the stretch of output from a call marker to
//! the end of the calls it opens, read one character at a time by the format's reader.

/// What a reader found, in the order it found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// A call to this function begins: its name is known and its arguments have begun.
    Start(String),
    /// More of the current call's arguments, compact.
    Args(String),
    /// The current call's arguments are a whole object.
    CallDone,
}

/// Where a region stands after a character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Flow {
    /// The character belongs to the region, which goes on.
    More,
    /// The region is over; its last `unused` bytes read (the latest character's included)
    /// are not part of it and are read again as text.
    End { unused: usize },
    /// The text is not in the format: before any call began, the region is text after all;
    /// after, the region is cut there.
    Fail,
}

/// A format's reader of one region.
pub(super) trait Region {
    /// Reads `c`, adding what it completes to `found`.
    fn feed(&mut self, c: char, found: &mut Vec<Found>) -> Flow;

    /// The output ended: [`Flow::End`] where the region may end here, else [`Flow::Fail`].
    fn finish(&mut self, found: &mut Vec<Found>) -> Flow;
}

/// Where a marker may open a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// Anywhere in the text.
    Anywhere,
    /// Where nothing but whitespace came since the output's start or the last region.
    Boundary,
    /// Where nothing but whitespace came since the last region.
    AfterRegion,
}

/// A text that opens a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Marker {
    /// The marker's text.
    pub(super) text: &'static str,
    /// Where it opens a region.
    pub(super) place: Place,
}

/// Whether `c` may be part of a function name written bare (not as a JSON string), as the
/// newer Mistral form and DeepSeek V3 write them.
pub(super) fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')
}
