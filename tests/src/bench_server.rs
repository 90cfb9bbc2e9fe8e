//! The loopback HTTP server of the HTTP benchmarks, in a child process (the
//! benchmark binary run again with `--serve`), so the benchmark's own CPU
//! time is hopper's side alone; and that CPU time.

use crate::http_server::TestServer;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The child process: a test server, answering `stats` on stdin with its
/// connection and request counts, until stdin closes.
pub fn serve() {
    let server = TestServer::start_with_threads(1);
    println!("{}", server.addr);
    for line in std::io::stdin().lock().lines() {
        match line.as_deref() {
            Ok("stats") => println!("{} {}", server.connections(), server.requests()),
            _ => break,
        }
    }
}

/// The server child, seen from here.
pub struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// `http://127.0.0.1:PORT`, for `allowed_hosts`.
    pub origin: String,
    /// What each request GETs.
    pub url: String,
}

impl Server {
    /// Starts the server process; requests go to a path answered after
    /// `service_ms` milliseconds (at once for 0).
    pub fn start(service_ms: u64) -> Server {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the server process starts");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut addr = String::new();
        stdout.read_line(&mut addr).unwrap();
        let origin = format!("http://{}", addr.trim());
        let url = match service_ms {
            0 => format!("{origin}/hello"),
            ms => format!("{origin}/slow/{ms}"),
        };
        Server {
            child,
            stdin,
            stdout,
            origin,
            url,
        }
    }

    /// (connections accepted, requests answered) so far.
    pub fn stats(&mut self) -> (u64, u64) {
        writeln!(self.stdin, "stats").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let mut parts = line.split_whitespace().map(|n| n.parse::<u64>().unwrap());
        (parts.next().unwrap(), parts.next().unwrap())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds used so far by this process (user + system).
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}
