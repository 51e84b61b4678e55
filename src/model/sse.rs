//! A small incremental Server-Sent Events parser: bytes in, complete events out. Handles
//! `\n`, `\r\n` and `\r` line ends, multi-line `data`, comments, and events split anywhere
//! across chunks.

/// One event: its `event:` name (if any) and its `data:` lines joined with `\n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// A line longer than the parser's limit: the stream is not one to hold in memory.
#[derive(Debug, PartialEq, Eq)]
pub struct TooLong;

pub struct SseParser {
    /// The longest line (and event) held; `usize::MAX` when unbounded.
    max_line: usize,
    /// Bytes of `data` held for the event being read.
    held: usize,
    buf: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
    has_data: bool,
    /// The last byte seen was `\r`: a following `\n` belongs to the same line end.
    after_cr: bool,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::with_max_line(usize::MAX)
    }
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser that holds at most `max` bytes of one line or one event's data.
    pub fn with_max_line(max: usize) -> Self {
        SseParser {
            max_line: max,
            held: 0,
            buf: Vec::new(),
            event: None,
            data: Vec::new(),
            has_data: false,
            after_cr: false,
        }
    }

    /// Feed a chunk; complete events are pushed onto `out`. `Err` when a line or an event
    /// outgrows the limit (what was parsed before is in `out`).
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), TooLong> {
        let mut start = 0;
        for (i, &b) in chunk.iter().enumerate() {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    start = i + 1;
                    continue;
                }
            }
            if b == b'\n' || b == b'\r' {
                self.buf.extend_from_slice(&chunk[start..i]);
                let line = std::mem::take(&mut self.buf);
                self.line(&line, out);
                self.after_cr = b == b'\r';
                start = i + 1;
            }
        }
        self.buf.extend_from_slice(&chunk[start..]);
        if self.buf.len() > self.max_line || self.held > self.max_line {
            return Err(TooLong);
        }
        Ok(())
    }

    /// The end of the stream: an event not yet ended by a blank line is dispatched.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) {
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            self.line(&line, out);
        }
        self.dispatch(out);
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(p) => {
                let v = &line[p + 1..];
                (&line[..p], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value).into_owned();
        match field {
            b"data" => {
                self.held = self.held.saturating_add(value.len());
                self.data.push(value);
                self.has_data = true;
            }
            b"event" => self.event = Some(value),
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = self.event.take();
        if self.has_data {
            out.push(SseEvent {
                event,
                data: self.data.join("\n"),
            });
        }
        self.data.clear();
        self.held = 0;
        self.has_data = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(text: &str, size: usize) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for chunk in text.as_bytes().chunks(size) {
            p.feed(chunk, &mut out).unwrap();
        }
        p.finish(&mut out);
        out
    }

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let text = ": comment\nevent: message_start\ndata: {\"a\":1}\n\ndata: line1\ndata: line2\n\n\
                    data: [DONE]\n\n";
        for size in 1..text.len() {
            let events = parse_in_pieces(text, size);
            assert_eq!(
                events,
                vec![
                    SseEvent {
                        event: Some("message_start".into()),
                        data: "{\"a\":1}".into()
                    },
                    SseEvent {
                        event: None,
                        data: "line1\nline2".into()
                    },
                    SseEvent {
                        event: None,
                        data: "[DONE]".into()
                    },
                ],
                "chunk size {size}"
            );
        }
    }

    #[test]
    fn crlf_and_cr_line_ends() {
        for size in 1..20 {
            let events = parse_in_pieces("data: a\r\n\r\ndata:b\r\rdata: c\n\n", size);
            let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
            assert_eq!(data, ["a", "b", "c"], "chunk size {size}");
        }
    }

    #[test]
    fn an_unterminated_last_event_is_kept_at_the_end() {
        let events = parse_in_pieces("data: tail", 3);
        assert_eq!(events[0].data, "tail");
    }

    #[test]
    fn a_line_past_the_limit_is_an_error_not_a_heap() {
        let mut p = SseParser::with_max_line(16);
        let mut out = Vec::new();
        assert_eq!(p.feed(b"data: ok\n\n", &mut out), Ok(()));
        assert_eq!(p.feed(&[b'x'; 64], &mut out), Err(TooLong));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn multibyte_text_split_across_chunks() {
        let events = parse_in_pieces("data: 循环\n\n", 1);
        assert_eq!(events[0].data, "循环");
    }
}
