//! One page of a text file, read without holding the file: `read_file` streams through it
//! in fixed chunks, keeps only the lines of the page it returns (at most `MAX_PAGE_BYTES` of
//! them), and counts the rest. A file of any size costs a few hundred kilobytes.

use std::io::Read;

/// Bytes of one page at most; a page that would be longer is cut with a note.
pub(crate) const MAX_PAGE_BYTES: usize = 256 * 1024;
const CHUNK: usize = 64 * 1024;
/// Bytes looked at to tell a binary file.
const SNIFF: usize = 8192;

/// What was read.
pub(crate) struct Page {
    /// The lines `first..=last` (1-based), or their first `MAX_PAGE_BYTES`.
    pub(crate) text: String,
    /// Lines in the whole file (a last line without `\n` counts).
    pub(crate) total: usize,
    /// The page was cut at `MAX_PAGE_BYTES`.
    pub(crate) cut: bool,
    /// A NUL byte in the first 8 KB: a binary file (nothing else is read).
    pub(crate) binary: bool,
    /// Bytes in the file.
    pub(crate) size: u64,
}

/// Read lines `first..first + limit` of an open file (`first` from 1).
pub(crate) fn read_page(
    mut file: std::fs::File,
    first: usize,
    limit: usize,
) -> std::io::Result<Page> {
    let size = file.metadata()?.len();
    let last = first.saturating_add(limit).saturating_sub(1);
    let mut page = Vec::new();
    let mut cut = false;
    let mut line = 1usize;
    let mut total = 0usize;
    let mut ends_open = false;
    // A small file is read with a buffer its size (a 64 KB one zeroed per call was most
    // of a small read's cost); one that says 0 (`/proc`) is read in small chunks.
    let mut buf =
        vec![0; usize::try_from(size).map_or(CHUNK, |s| s.saturating_add(1).clamp(512, CHUNK))];
    let mut seen = 0usize;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let chunk = &buf[..n];
        if seen < SNIFF && chunk[..n.min(SNIFF - seen)].contains(&0) {
            return Ok(Page {
                text: String::new(),
                total: 0,
                cut: false,
                binary: true,
                size,
            });
        }
        seen = seen.saturating_add(n);
        let mut start = 0;
        for i in memchr::memchr_iter(b'\n', chunk) {
            if (first..=last).contains(&line) {
                keep(&mut page, &chunk[start..=i], &mut cut);
            }
            line = line.saturating_add(1);
            total = total.saturating_add(1);
            start = i + 1;
        }
        if start < n {
            if (first..=last).contains(&line) {
                keep(&mut page, &chunk[start..], &mut cut);
            }
            ends_open = true;
        } else {
            ends_open = false;
        }
    }
    if ends_open {
        total = total.saturating_add(1);
    }
    Ok(Page {
        // Valid UTF-8, nearly always: checked fast and kept as it is.
        text: String::from_utf8(page)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        total,
        cut,
        binary: false,
        size,
    })
}

fn keep(page: &mut Vec<u8>, bytes: &[u8], cut: &mut bool) {
    let room = MAX_PAGE_BYTES.saturating_sub(page.len());
    if bytes.len() > room {
        *cut = true;
    }
    page.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(text: &[u8], first: usize, limit: usize) -> Page {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, text).unwrap();
        read_page(std::fs::File::open(&path).unwrap(), first, limit).unwrap()
    }

    #[test]
    fn pages_and_counts() {
        let p = page(b"a\nb\nc", 2, 1);
        assert_eq!((p.text.as_str(), p.total), ("b\n", 3));
        let p = page(b"a\nb\nc\n", 3, 5);
        assert_eq!((p.text.as_str(), p.total), ("c\n", 3));
        assert_eq!(page(b"", 1, 5).total, 0);
        assert!(page(b"x\0y", 1, 5).binary);
        let long = vec![b'x'; MAX_PAGE_BYTES * 2];
        let p = page(&long, 1, 1);
        assert!(p.cut && p.text.len() == MAX_PAGE_BYTES && p.total == 1);
    }
}
