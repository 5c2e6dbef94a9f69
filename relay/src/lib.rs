//! The gateway's native pump: while a stream carries only plain token chunks, the engine's
//! socket is read here and each read's chunks are written to the client's socket, with no
//! Python object made per chunk. The first chunk that is not plain (a finish, usage, an error,
//! `[DONE]`, the end of the chunked body), a chunk split across reads, a read error or a client
//! that cannot take a write ends the pump's turn: what it did not relay goes back to the
//! gateway's Python relay, which goes on from there.
//!
//! "Plain" is defined in Python, by `gateway/exchange.py: is_plain` (a chunk's payload also ends
//! in the stream's separator: whole events, as the Python relay's splitter requires); this is its
//! port, which `tests/test_relay_pump.py` checks against that function.

use std::cell::RefCell;

use memchr::memmem;
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

const READ_SIZE: usize = 256 * 1024;

thread_local! {
    /// One read buffer for every pump of the event loop's thread: a pump's read is relayed or
    /// handed back before the next pump reads.
    static READ: RefCell<Vec<u8>> = RefCell::new(vec![0; READ_SIZE]);
}

#[pyclass(module = "specfleet_relay")]
struct Pump {
    engine: i32,
    client: i32,
    separator: Vec<u8>,
    framed: Vec<u8>,
    /// When the engine's socket last gave bytes (CLOCK_MONOTONIC seconds: `time.perf_counter`).
    #[pyo3(get)]
    last_read: f64,
    /// When the last plain token chunk was relayed (0.0 before the first).
    #[pyo3(get)]
    last_token: f64,
    /// Token chunks relayed.
    #[pyo3(get)]
    chunks: u64,
}

/// What a pump's turn left for the Python relay: bytes framed for the client that it did not
/// take, and engine bytes (from a chunk's start) that were not relayed.
type Handback<'py> = (Bound<'py, PyBytes>, Bound<'py, PyBytes>);

#[pymethods]
impl Pump {
    /// Duplicates both sockets' descriptors: the pump owns its copies, the transports theirs.
    #[new]
    fn new(engine_fd: i32, client_fd: i32, separator: &[u8]) -> PyResult<Self> {
        if separator.is_empty() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "separator must not be empty",
            ));
        }
        let engine = dup(engine_fd)?;
        let client = match dup(client_fd) {
            Ok(fd) => fd,
            Err(err) => {
                unsafe { libc::close(engine) };
                return Err(err);
            }
        };
        Ok(Pump {
            engine,
            client,
            separator: separator.to_vec(),
            framed: Vec::with_capacity(4096),
            last_read: 0.0,
            last_token: 0.0,
            chunks: 0,
        })
    }

    /// The descriptor to watch for readability.
    #[getter]
    fn engine_fd(&self) -> i32 {
        self.engine
    }

    /// One read of the engine's socket, relayed. None: the pump goes on. Otherwise its turn is
    /// over, and the pair is what the Python relay takes back.
    fn pump<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Handback<'py>>> {
        if self.engine < 0 {
            return Err(PyOSError::new_err("the pump is closed"));
        }
        READ.with_borrow_mut(|read| self.relay(py, read))
    }

    /// Closes the pump's copies of both descriptors (the sockets stay open in their transports).
    fn close(&mut self) {
        for fd in [&mut self.engine, &mut self.client] {
            if *fd >= 0 {
                unsafe { libc::close(*fd) };
                *fd = -1;
            }
        }
    }
}

impl Pump {
    fn relay<'py>(&mut self, py: Python<'py>, read: &mut [u8]) -> PyResult<Option<Handback<'py>>> {
        let n = unsafe {
            libc::recv(
                self.engine,
                read.as_mut_ptr().cast(),
                read.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 && would_block() {
            return Ok(None);
        }
        if n <= 0 {
            // The end or an error: the transport, reading again, sees it for itself.
            return Ok(Some(handback(py, &[], &[])));
        }
        let now = monotonic();
        self.last_read = now;
        let data = &read[..n as usize];
        let (relayed, body) = plain_chunks(data, &self.separator);
        let mut sent = 0;
        if body.chunks() > 0 {
            self.last_token = now;
            self.chunks += body.chunks();
            frame(&mut self.framed, data, &body.ranges);
            sent = send_all(self.client, &self.framed);
        }
        let unsent: &[u8] = if body.chunks() > 0 {
            &self.framed[sent..]
        } else {
            &[]
        };
        let unread = &data[relayed..];
        if unsent.is_empty() && unread.is_empty() {
            return Ok(None);
        }
        Ok(Some(handback(py, unsent, unread)))
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.close();
    }
}

/// The payloads of the plain chunks a read starts with, as (start, end) in the read.
struct Body {
    ranges: Vec<(usize, usize)>,
}

impl Body {
    fn chunks(&self) -> u64 {
        self.ranges.len() as u64
    }
}

/// The whole chunks at the start of `data` that are plain token chunks: how many bytes of
/// `data` they span, and their payloads.
fn plain_chunks(data: &[u8], separator: &[u8]) -> (usize, Body) {
    let mut body = Body { ranges: Vec::new() };
    let mut at = 0;
    while let Some((start, end)) = next_chunk(data, at) {
        if !is_plain(&data[start..end], separator) {
            break;
        }
        body.ranges.push((start, end));
        at = end + 2;
    }
    (at, body)
}

/// The payload of the whole, non-empty chunk that starts at `at`, as (start, end) in `data`.
fn next_chunk(data: &[u8], at: usize) -> Option<(usize, usize)> {
    let rest = &data[at..];
    let line_end = memmem::find(rest, b"\r\n")?;
    let line = &rest[..line_end];
    if line.is_empty() || line.len() > 8 || !line.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let size = usize::from_str_radix(std::str::from_utf8(line).ok()?, 16).ok()?;
    let start = at + line_end + 2;
    let end = start + size;
    if size == 0 || data.len() < end + 2 || &data[end..end + 2] != b"\r\n" {
        return None;
    }
    Some((start, end))
}

/// `gateway/exchange.py: is_plain`, for a chunk's payload of whole events (ending in `separator`).
fn is_plain(payload: &[u8], separator: &[u8]) -> bool {
    payload.starts_with(b"data:")
        && payload.ends_with(separator)
        && memmem::find(payload, b"[DONE]").is_none()
        && !worth_parsing(payload)
}

/// `gateway/exchange.py: worth_parsing`, byte for byte.
fn worth_parsing(payload: &[u8]) -> bool {
    if memmem::find(payload, b"\"usage\"").is_some()
        || memmem::find(payload, b"\"error\"").is_some()
    {
        return true;
    }
    let finishes = memmem::find_iter(payload, b"\"finish_reason\"").count();
    if finishes == 0 {
        return false;
    }
    let mut nulls = memmem::find_iter(payload, b"\"finish_reason\":null").count();
    if nulls < finishes {
        nulls += memmem::find_iter(payload, b"\"finish_reason\": null").count();
    }
    finishes > nulls
}

/// The payloads joined as one chunk of the client's chunked body, as the Python relay writes.
fn frame(framed: &mut Vec<u8>, data: &[u8], ranges: &[(usize, usize)]) {
    let size: usize = ranges.iter().map(|(start, end)| end - start).sum();
    framed.clear();
    framed.extend_from_slice(format!("{size:x}\r\n").as_bytes());
    for &(start, end) in ranges {
        framed.extend_from_slice(&data[start..end]);
    }
    framed.extend_from_slice(b"\r\n");
}

/// Writes what the client's socket takes now; returns how many bytes that was.
fn send_all(fd: i32, bytes: &[u8]) -> usize {
    let mut sent = 0;
    while sent < bytes.len() {
        let n = unsafe {
            libc::send(
                fd,
                bytes[sent..].as_ptr().cast(),
                bytes.len() - sent,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break; // full, or broken: the transport writes the rest and sees which
        }
        sent += n as usize;
    }
    sent
}

fn handback<'py>(py: Python<'py>, unsent: &[u8], unread: &[u8]) -> Handback<'py> {
    (PyBytes::new(py, unsent), PyBytes::new(py, unread))
}

fn would_block() -> bool {
    matches!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EAGAIN) | Some(libc::EINTR)
    )
}

fn dup(fd: i32) -> PyResult<i32> {
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if copy < 0 {
        return Err(PyOSError::new_err(
            std::io::Error::last_os_error().to_string(),
        ));
    }
    Ok(copy)
}

fn monotonic() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[pymodule]
fn specfleet_relay(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Pump>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(payload: &str) -> Vec<u8> {
        format!("{:x}\r\n{payload}\r\n", payload.len()).into_bytes()
    }

    const TOKEN: &str =
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n";
    const FINISH: &str = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";

    #[test]
    fn plain_chunks_stop_at_the_first_that_is_not() {
        let mut data = chunk(TOKEN);
        data.extend(chunk(TOKEN));
        let plain_end = data.len();
        data.extend(chunk(FINISH));
        data.extend(chunk(TOKEN));
        let (relayed, body) = plain_chunks(&data, b"\n\n");
        assert_eq!(relayed, plain_end);
        assert_eq!(body.chunks(), 2);
    }

    #[test]
    fn a_chunk_split_across_reads_is_not_relayed() {
        let data = chunk(TOKEN);
        let (relayed, body) = plain_chunks(&data[..data.len() - 1], b"\n\n");
        assert_eq!((relayed, body.chunks()), (0, 0));
    }

    #[test]
    fn the_last_chunk_and_odd_framing_are_not_relayed() {
        for data in [&b"0\r\n\r\n"[..], b"1a;ext=1\r\n", b"+1a\r\n", b"\r\n"] {
            assert_eq!(plain_chunks(data, b"\n\n").1.chunks(), 0);
        }
    }

    #[test]
    fn worth_parsing_matches_the_python_reader() {
        assert!(!worth_parsing(TOKEN.as_bytes()));
        assert!(worth_parsing(FINISH.as_bytes()));
        assert!(worth_parsing(b"data: {\"usage\":null}"));
        assert!(worth_parsing(b"data: {\"object\":\"error\"}"));
        assert!(worth_parsing(b"data: {\"error\":{}}"));
        let burst = format!("{TOKEN}{FINISH}");
        assert!(worth_parsing(burst.as_bytes()));
        assert!(!worth_parsing(b"\"finish_reason\": null"));
    }

    #[test]
    fn frames_the_payloads_as_one_chunk() {
        let mut data = chunk(TOKEN);
        data.extend(chunk(TOKEN));
        let (_, body) = plain_chunks(&data, b"\n\n");
        let mut framed = Vec::new();
        frame(&mut framed, &data, &body.ranges);
        let expected = chunk(&format!("{TOKEN}{TOKEN}"));
        assert_eq!(framed, expected);
    }
}
