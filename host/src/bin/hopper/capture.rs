//! Log lines held back per thread, so that `hopper plugin test` can print a
//! case's log lines under the case instead of between the result lines.
//!
//! The text log writer ([`Stderr`]) writes to stderr unless the thread that
//! logs is capturing ([`Capture::start`]); then the line is kept until
//! [`Capture::take`]. A suite runs on a thread of its own with a
//! single-threaded runtime, so what its thread logs is what its cases
//! caused, whatever else the process runs meanwhile.

use std::cell::RefCell;

thread_local! {
    static CAPTURED: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// The log writer: stderr, or this thread's capture when it has one.
pub struct Stderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = Writer;
    fn make_writer(&'a self) -> Writer {
        Writer
    }
}

pub struct Writer;

impl std::io::Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let kept = CAPTURED.with_borrow_mut(|captured| match captured {
            Some(lines) => {
                lines.extend_from_slice(buf);
                true
            }
            None => false,
        });
        if !kept {
            std::io::Write::write_all(&mut std::io::stderr(), buf)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::Write::flush(&mut std::io::stderr())
    }
}

/// Captures this thread's log lines until dropped.
pub struct Capture(());

impl Capture {
    pub fn start() -> Capture {
        CAPTURED.set(Some(Vec::new()));
        Capture(())
    }

    /// The lines logged since the last take, without colour codes.
    pub fn take(&self) -> Vec<String> {
        let bytes =
            CAPTURED.with_borrow_mut(|c| c.as_mut().map(std::mem::take).unwrap_or_default());
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(plain)
            .filter(|l| !l.trim().is_empty())
            .collect()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        CAPTURED.set(None);
    }
}

/// `line` without ANSI escape sequences (the colours of a terminal).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, ended by a letter.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn a_capturing_thread_keeps_its_lines_and_others_do_not_see_them() {
        let capture = Capture::start();
        Writer.write_all(b"\x1b[33mWARN\x1b[0m one\ntwo\n").unwrap();
        let other = std::thread::spawn(|| CAPTURED.with_borrow(Option::is_some))
            .join()
            .unwrap();
        assert!(!other, "another thread captures too");
        assert_eq!(capture.take(), ["WARN one", "two"]);
        assert!(capture.take().is_empty());
        drop(capture);
        assert!(CAPTURED.with_borrow(Option::is_none));
    }
}
