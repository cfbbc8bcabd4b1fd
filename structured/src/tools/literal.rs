//! Matching fixed texts (markers, fences) one character at a time.

/// What one character does to a match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Match {
    /// The text so far starts one of the alternatives.
    Partial,
    /// The text so far is alternative `i`.
    Full(usize),
    /// The text so far (this many bytes, the character included) starts none of them.
    Miss(usize),
}

/// A match against one of a few texts, none a prefix of another.
#[derive(Clone, Debug)]
pub(super) struct Literals {
    alternatives: &'static [&'static str],
    read: String,
}

impl Literals {
    /// A match against `alternatives`, nothing read yet.
    pub(super) fn new(alternatives: &'static [&'static str]) -> Literals {
        Literals {
            alternatives,
            read: String::new(),
        }
    }

    /// The bytes read so far (a prefix of an alternative).
    pub(super) fn read_len(&self) -> usize {
        self.read.len()
    }

    /// Reads `c`.
    pub(super) fn feed(&mut self, c: char) -> Match {
        self.read.push(c);
        if let Some(i) = self.alternatives.iter().position(|alt| *alt == self.read) {
            return Match::Full(i);
        }
        if self
            .alternatives
            .iter()
            .any(|alt| alt.starts_with(&self.read))
        {
            Match::Partial
        } else {
            Match::Miss(self.read.len())
        }
    }
}
