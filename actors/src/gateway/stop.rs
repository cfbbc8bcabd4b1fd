//! Stop strings over text that arrives in pieces: text is released as soon as it cannot
//! be the start of a stop string, and the output ends just before the first stop string
//! (which is not returned, as OpenAI). Text pushed unchecked (the tokens before vLLM's
//! `min_tokens`) never ends the output, but a stop string may begin in it and end in text
//! checked after it, as vLLM matches them.

/// What a piece of text released.
#[derive(Debug, PartialEq, Eq)]
pub enum Matched {
    /// No stop string yet: this text is final and may be sent.
    Released(String),
    /// A stop string was found: this is the rest of the output before it.
    Stopped(String),
}

/// Watches one request's text for its stop strings.
#[derive(Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text not released yet: a suffix that could still grow into a stop string.
    pending: String,
    /// Where the pending text pushed unchecked ends: a stop string must end past it.
    unchecked: usize,
    /// The stop string that ended the text, once one has.
    matched: Option<String>,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(mut stops: Vec<String>) -> Self {
        stops.retain(|stop| !stop.is_empty());
        Self {
            stops,
            pending: String::new(),
            unchecked: 0,
            matched: None,
        }
    }

    /// The stop string that ended the text, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Adds `text`. A stop string cannot start in text released earlier (that text was
    /// released because no stop string could start there), so only the pending text is
    /// searched.
    pub fn push(&mut self, text: &str) -> Matched {
        self.pending.push_str(text);
        let unchecked = std::mem::take(&mut self.unchecked);
        let found = self
            .stops
            .iter()
            .filter_map(|stop| {
                let at = self
                    .pending
                    .match_indices(stop.as_str())
                    .map(|(at, _)| at)
                    .find(|&at| at + stop.len() > unchecked)?;
                Some((at, stop))
            })
            .min_by_key(|&(at, _)| at);
        if let Some((at, stop)) = found {
            self.matched = Some(stop.clone());
            self.pending.truncate(at);
            return Matched::Stopped(std::mem::take(&mut self.pending));
        }
        self.release()
    }

    /// Adds `text` without looking for stop strings in it (a stop string may still begin
    /// in it and end in text pushed later); releases what no stop string can begin.
    pub fn push_unchecked(&mut self, text: &str) -> String {
        self.pending.push_str(text);
        match self.release() {
            Matched::Released(text) => {
                self.unchecked = self.pending.len();
                text
            }
            Matched::Stopped(_) => unreachable!("release never stops"),
        }
    }

    /// Releases the pending text up to the suffix that could begin a stop string.
    fn release(&mut self) -> Matched {
        let keep_from = self.undecided_from();
        Matched::Released(self.pending.drain(..keep_from).collect())
    }

    /// Ends the text: whatever was held back.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Where the longest suffix of the pending text that begins some stop string starts
    /// (the pending text's length if there is none).
    fn undecided_from(&self) -> usize {
        self.pending
            .char_indices()
            .map(|(at, _)| at)
            .find(|&at| {
                let tail = &self.pending[at..];
                self.stops.iter().any(|stop| stop.starts_with(tail))
            })
            .unwrap_or(self.pending.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(text: &str) -> Matched {
        Matched::Released(text.to_owned())
    }

    #[test]
    fn text_without_stops_passes_through() {
        let mut matcher = StopMatcher::new(vec![String::new()]);
        assert_eq!(matcher.push("abc"), released("abc"));
        assert_eq!(matcher.flush(), "");
    }

    #[test]
    fn unchecked_text_never_stops_but_a_stop_may_begin_in_it() {
        let mut matcher = StopMatcher::new(vec!["ab".into(), "xyz".into()]);
        // A whole stop string in unchecked text passes; its held tail is only a prefix.
        assert_eq!(matcher.push_unchecked("1ab2a"), "1ab2");
        // "ab" completed by checked text stops there.
        assert_eq!(matcher.push("b3"), Matched::Stopped(String::new()));

        let mut matcher = StopMatcher::new(vec!["ab".into()]);
        // The unchecked "ab" is held whole (it begins a stop string) but ends before the
        // checked text, so it does not stop the output.
        assert_eq!(matcher.push_unchecked("xab"), "x");
        assert_eq!(matcher.push("c"), released("abc"));
        assert_eq!(matcher.push("ab"), Matched::Stopped(String::new()));
    }

    #[test]
    fn a_stop_split_across_pieces_is_held_then_cut() {
        let mut matcher = StopMatcher::new(vec!["END".into(), "xyz".into()]);
        assert_eq!(matcher.push("hello E"), released("hello "));
        assert_eq!(matcher.push("N"), released(""));
        assert_eq!(matcher.matched(), None);
        assert_eq!(matcher.push("Dless"), Matched::Stopped(String::new()));
        assert_eq!(matcher.matched(), Some("END"));
    }

    #[test]
    fn a_false_start_is_released() {
        let mut matcher = StopMatcher::new(vec!["END".into()]);
        assert_eq!(matcher.push("E"), released(""));
        assert_eq!(matcher.push("Nx"), released("ENx"));
        assert_eq!(matcher.push("EN"), released(""));
        assert_eq!(matcher.flush(), "EN");
    }

    #[test]
    fn the_earliest_stop_wins_and_multibyte_text_is_safe() {
        let mut matcher = StopMatcher::new(vec!["wörx".into(), "rld".into(), "d".into()]);
        assert_eq!(matcher.push("hé wö"), released("hé "));
        assert_eq!(matcher.push("rld"), Matched::Stopped("wö".into()));
        assert_eq!(
            matcher.matched(),
            Some("rld"),
            "the earliest, not the first listed"
        );
        let mut matcher = StopMatcher::new(vec!["🦀!".into()]);
        assert_eq!(matcher.push("a🦀"), released("a"));
        assert_eq!(matcher.push("?"), released("🦀?"));
    }
}
