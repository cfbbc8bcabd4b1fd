//! Stop strings over text that arrives in pieces: text is released as soon as it cannot
//! be the start of a stop string, and the output ends just before the first stop string
//! (which is not returned, as OpenAI).

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
        let found = self
            .stops
            .iter()
            .filter_map(|stop| Some((self.pending.find(stop.as_str())?, stop)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, stop)) = found {
            self.matched = Some(stop.clone());
            self.pending.truncate(at);
            return Matched::Stopped(std::mem::take(&mut self.pending));
        }
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
