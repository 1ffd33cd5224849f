//! Real MCP servers for tests, as child processes: the Python SDK's (tests/mcp/server.py, in
//! the repository's .venv) and the reference `server-everything` (tests/mcp/node_modules).
//! Missing tools fail the test with the command that installs them; nothing is skipped. Used
//! by this crate's tests and by the end-to-end tests (feature `testing`).

// Test support: a failed expectation here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{ServerSpec, Transport};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The virtualenv's python, with the MCP SDK in it.
pub fn python() -> PathBuf {
    let python = repository().join(".venv/bin/python");
    let has_sdk = Command::new(&python)
        .args(["-c", "import mcp"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_sdk,
        "the tests need the MCP Python SDK in the repository's virtualenv ({}): run \
         `python3 -m venv .venv && .venv/bin/pip install 'mcp>=2.3,<3'` at the repository root \
         (scripts/test does)",
        python.display()
    );
    python
}

pub fn python_server() -> PathBuf {
    repository().join("tests/mcp/server.py")
}

/// server-everything's entry point.
pub fn everything() -> PathBuf {
    let entry =
        repository().join("tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        entry.exists(),
        "the tests need @modelcontextprotocol/server-everything ({}): run `npm ci` in tests/mcp \
         (scripts/test does)",
        entry.display()
    );
    entry
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

pub fn http_spec(name: &str, port: u16, timeout: Duration) -> ServerSpec {
    ServerSpec {
        name: name.to_owned(),
        transport: Transport::Http { url: format!("http://127.0.0.1:{port}/mcp"), headers: Vec::new() },
        timeout,
    }
}

pub fn stdio_spec(name: &str, command: Vec<String>) -> ServerSpec {
    ServerSpec {
        name: name.to_owned(),
        transport: Transport::Stdio { command },
        timeout: Duration::from_secs(20),
    }
}

pub fn python_stdio_command() -> Vec<String> {
    vec![python().display().to_string(), python_server().display().to_string(), "--stdio".to_owned()]
}

pub fn everything_stdio_command() -> Vec<String> {
    vec!["node".to_owned(), everything().display().to_string(), "stdio".to_owned()]
}

/// A server listening on a loopback port, killed when dropped.
pub struct HttpServer {
    child: Child,
    pub port: u16,
}

impl HttpServer {
    /// The Python server on `port`, requiring `token` when given, logging `slow` calls to `log`.
    pub fn python(port: u16, token: Option<&str>, log: Option<&Path>) -> HttpServer {
        let mut command = Command::new(python());
        command.arg(python_server()).args(["--http", &port.to_string()]);
        if let Some(token) = token {
            command.args(["--token", token]);
        }
        if let Some(log) = log {
            command.env("MCP_TEST_LOG", log);
        }
        HttpServer::start(command, port)
    }

    /// server-everything's Streamable HTTP mode (its port comes from $PORT; endpoint /mcp).
    pub fn everything(port: u16) -> HttpServer {
        let mut command = Command::new("node");
        command.arg(everything()).arg("streamableHttp").env("PORT", port.to_string());
        HttpServer::start(command, port)
    }

    fn start(mut command: Command, port: u16) -> HttpServer {
        // Quiet: its request log would bury the tests' output.
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let mut server = HttpServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("{command:?} exited ({status}) before listening on {port}");
            }
            assert!(Instant::now() < deadline, "{command:?} did not listen on {port} within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// Kills the server at once (SIGKILL: no goodbye to its clients) and waits for it to go.
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A temporary file for `slow`'s log, removed when dropped.
pub struct Log(pub PathBuf);

impl Log {
    pub fn new(name: &str) -> Log {
        let path = std::env::temp_dir().join(format!(
            "turnstone-mcp-{name}-{}-{}.log",
            std::process::id(),
            free_port()
        ));
        let _ = std::fs::remove_file(&path);
        Log(path)
    }

    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.0).unwrap_or_default().lines().map(str::to_owned).collect()
    }

    /// Waits up to `limit` for `line` to be in the log.
    pub async fn wait_for(&self, line: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.lines().iter().any(|l| l == line) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
