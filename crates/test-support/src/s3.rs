//! A real S3-compatible server for the object-store tests, and a fault proxy in front of it.
//!
//! [`Moto`] runs `moto_server` (PyPI `moto[server]`, installed by `.ci/run`) on a free loopback
//! port, creates a bucket, and stops the server on drop. moto implements the S3 REST API in
//! process memory, including multipart uploads and conditional puts (`If-Match`,
//! `If-None-Match`), which is what the tier needs; MinIO would be closer to production but is
//! not installable from the package registries this project may use.
//!
//! [`FaultProxy`] forwards TCP to the server and can, on command, answer every request with an
//! HTTP 503, delay every chunk, or cut and refuse connections.

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU8, Ordering},
    },
    time::{Duration, Instant},
};

/// The bucket every test uses.
pub const BUCKET: &str = "ckpt-test";

/// A running `moto_server` with [`BUCKET`] created. Killed on drop.
#[derive(Debug)]
pub struct Moto {
    child: Child,
    /// The loopback port it listens on.
    pub port: u16,
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Moto {
    /// Starts `moto_server` on a free port and creates [`BUCKET`]. Panics with how to install
    /// it when `moto_server` is missing.
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    /// Starts `moto_server` on `port` (a restart reuses the port) and creates [`BUCKET`].
    pub fn start_on(port: u16) -> Self {
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start moto_server ({e}); install it: pip install 'moto[server]'")
            });
        let moto = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(status) = http(port, "PUT", &format!("/{BUCKET}")) {
                assert!(status < 300, "creating the bucket: HTTP {status}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not start in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }

    /// The endpoint URL (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kills the server (its in-memory state is lost).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The environment the tier reads to reach `endpoint` (dummy credentials, plain HTTP).
pub fn s3_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT", endpoint.to_string()),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_REGION", "us-east-1".into()),
    ]
}

/// [`s3_env`] as `ckpt_remote::RemoteConfig::store_options` (object_store's config keys:
/// `endpoint`, `allow_http`, ...), for tests that must not share process environment.
pub fn store_options(endpoint: &str) -> Vec<(String, String)> {
    s3_env(endpoint)
        .into_iter()
        .map(|(k, v)| (k.trim_start_matches("AWS_").to_lowercase(), v))
        .collect()
}

/// Sets [`s3_env`] in this process (tests of the library, which read the environment).
pub fn set_s3_env(endpoint: &str) {
    for (k, v) in s3_env(endpoint) {
        // SAFETY: the object-store tests set these once, before any thread reads them.
        unsafe { std::env::set_var(k, v) };
    }
}

/// One plain HTTP request without a body; returns the status code.
fn http(port: u16, method: &str, path: &str) -> std::io::Result<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf)?;
    let head = String::from_utf8_lossy(&buf[..n]);
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {head:?}")))
}

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Forward everything.
    Pass = 0,
    /// Answer every new request with `503 Slow Down` and close.
    ServiceUnavailable = 1,
    /// Forward, sleeping 50 ms before every chunk.
    Slow = 2,
    /// Cut every connection and refuse new ones (the server is gone).
    Down = 3,
}

/// A TCP proxy on a free loopback port in front of `127.0.0.1:upstream`.
#[derive(Debug)]
pub struct FaultProxy {
    /// The port it listens on.
    pub port: u16,
    mode: Arc<AtomicU8>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// Starts forwarding to `upstream`.
    pub fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let mode = Arc::new(AtomicU8::new(Fault::Pass as u8));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (m, c, st) = (mode.clone(), conns.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if st.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = client else { continue };
                let fault = m.load(Ordering::Relaxed);
                if fault == Fault::Down as u8 {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                if fault == Fault::ServiceUnavailable as u8 {
                    std::thread::spawn(move || answer_503(client));
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                if let Ok(mut list) = c.lock() {
                    list.extend(client.try_clone().ok());
                }
                pipe(client.try_clone(), server.try_clone(), m.clone());
                pipe(server.try_clone(), client.try_clone(), m.clone());
            }
        });
        Self {
            port,
            mode,
            conns,
            stop,
        }
    }

    /// The endpoint URL through the proxy.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Switches the fault; any fault other than [`Fault::Slow`] also cuts open connections,
    /// so pooled keep-alive connections see it at once.
    pub fn set(&self, fault: Fault) {
        self.mode.store(fault as u8, Ordering::Relaxed);
        if fault != Fault::Pass
            && fault != Fault::Slow
            && let Ok(mut list) = self.conns.lock()
        {
            for s in list.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn pipe(from: std::io::Result<TcpStream>, to: std::io::Result<TcpStream>, mode: Arc<AtomicU8>) {
    let (Ok(mut from), Ok(mut to)) = (from, to) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if mode.load(Ordering::Relaxed) == Fault::Slow as u8 {
                std::thread::sleep(Duration::from_millis(50));
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Reads a request's head (the body is not needed) and answers 503.
fn answer_503(mut client: TcpStream) {
    let _ = client.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = [0u8; 8192];
    let _ = client.read(&mut buf);
    let body = "<Error><Code>SlowDown</Code><Message>injected by the test proxy</Message></Error>";
    let _ = write!(
        client,
        "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.shutdown(Shutdown::Both);
}
