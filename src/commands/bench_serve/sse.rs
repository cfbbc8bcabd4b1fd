//! Server-sent events: turns the bytes of a streamed response into `data:` payloads.

/// One dispatched server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// A `data:` payload (several `data:` lines of one event joined by newlines).
    Data(String),
    /// The OpenAI end-of-stream marker, `data: [DONE]`.
    Done,
}

/// Splits a byte stream into events. Network reads may end anywhere, even inside a
/// line or a UTF-8 character; the unfinished tail waits for the next read.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes after the last complete line.
    pending: Vec<u8>,
    /// The `data:` lines of the event being read.
    data: Vec<String>,
}

impl SseParser {
    /// Feeds one network read and returns the events it completes, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if let Some(event) = self.dispatch() {
                    events.push(event);
                }
            } else if let Some(value) = line.strip_prefix("data:") {
                self.data
                    .push(value.strip_prefix(' ').unwrap_or(value).to_owned());
            }
            // Comments (`:`) and other fields (`event:`, `id:`, `retry:`) carry no data.
        }
        events
    }

    /// Ends the current event at a blank line.
    fn dispatch(&mut self) -> Option<SseEvent> {
        if self.data.is_empty() {
            return None;
        }
        let payload = std::mem::take(&mut self.data).join("\n");
        Some(if payload == "[DONE]" {
            SseEvent::Done
        } else {
            SseEvent::Data(payload)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(s: &str) -> SseEvent {
        SseEvent::Data(s.to_owned())
    }

    #[test]
    fn whole_events_and_done() {
        let mut parser = SseParser::default();
        let events = parser.push(b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n");
        assert_eq!(
            events,
            vec![data("{\"a\":1}"), data("{\"b\":2}"), SseEvent::Done]
        );
    }

    #[test]
    fn events_split_across_reads() {
        let stream = "data: {\"text\":\"h\u{e9}llo\"}\n\n: keep-alive\n\ndata: {\"usage\":{}}\n\ndata: [DONE]\n\n";
        let bytes = stream.as_bytes();
        // Every split point, including inside the two-byte 'é'.
        for cut in 0..bytes.len() {
            let mut parser = SseParser::default();
            let mut events = parser.push(&bytes[..cut]);
            events.extend(parser.push(&bytes[cut..]));
            assert_eq!(
                events,
                vec![
                    data("{\"text\":\"h\u{e9}llo\"}"),
                    data("{\"usage\":{}}"),
                    SseEvent::Done
                ],
                "split at byte {cut}"
            );
        }
        // And one byte at a time.
        let mut parser = SseParser::default();
        let events: Vec<_> = bytes.iter().flat_map(|b| parser.push(&[*b])).collect();
        assert_eq!(events.len(), 3);
    }

    #[test]
    fn unfinished_event_is_held_back() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"data: {\"a\"").is_empty());
        assert!(parser.push(b":1}\n").is_empty());
        assert_eq!(parser.push(b"\n"), vec![data("{\"a\":1}")]);
    }

    #[test]
    fn multi_line_data_and_other_fields() {
        let mut parser = SseParser::default();
        let events = parser.push(b"event: message\nid: 7\ndata:one\ndata: two\n\n");
        assert_eq!(events, vec![data("one\ntwo")]);
    }
}
