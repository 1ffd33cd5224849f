//! The open host (no `[auth]`, the README's loopback setup) is for this machine only, tried
//! against the real `turnstone serve` as a hostile web page and a rebound DNS name would: a
//! cross-site form post, a page of another origin driving the API or opening the AHP socket,
//! a request for another host name. And `serve` refuses to listen beyond loopback without
//! `[auth]` unless `[server] allow_anonymous = true` says so, and then warns.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::header::{CONTENT_TYPE, HOST, ORIGIN};
use serde_json::json;
use turnstone_runtime::api::SessionPage;
use turnstone_tests::ApiClient;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `turnstone serve` with `args`, its stderr in `log`.
fn serve(dir: &Path, args: &[&str], log: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_turnstone"))
        .arg("serve")
        .args(args)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start turnstone serve")
}

async fn wait_up(api: &ApiClient) {
    let started = Instant::now();
    while !matches!(api.http().get(format!("{}/healthz", api.url())).send().await, Ok(r) if r.status().is_success())
    {
        assert!(started.elapsed() < Duration::from_secs(30), "serve did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

const INPUT: &str = r#"{"type":"client.message","agent_id":"demo","message":{"role":"user","content":"hi"}}"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_open_host_refuses_other_sites_other_names_and_forms() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let child = serve(dir.path(), &["--addr", &addr], &dir.path().join("stderr.log"));
    let api = ApiClient::new(format!("http://{addr}"));
    wait_up(&api).await;
    let http = api.http();
    let inputs = |id: &str| format!("http://{addr}/v1/sessions/{id}/inputs");
    let code = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        (status, body["error"]["code"].as_str().unwrap_or_default().to_owned())
    };

    // A cross-site form: `text/plain` (or form-encoded) needs no preflight.
    for form in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let sent = http.post(inputs("form")).header(CONTENT_TYPE, form).body(INPUT).send().await.unwrap();
        assert_eq!(code(sent).await, (415, "unsupported_media_type".to_owned()), "{form}");
    }
    // A page of another origin, even with a JSON body (which it could send after a preflight).
    let sent = http
        .post(inputs("cross"))
        .header(CONTENT_TYPE, "application/json")
        .header(ORIGIN, "http://evil.example")
        .body(INPUT)
        .send()
        .await
        .unwrap();
    assert_eq!(code(sent).await, (403, "cross_origin".to_owned()));
    let sent = http
        .delete(format!("http://{addr}/v1/sessions/any"))
        .header(ORIGIN, "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(code(sent).await, (403, "cross_origin".to_owned()));
    // DNS rebinding: another name that resolves here.
    let sent = http
        .get(format!("http://{addr}/v1/sessions"))
        .header(HOST, format!("evil.example:{port}"))
        .send()
        .await;
    assert_eq!(code(sent.unwrap()).await, (421, "misdirected_request".to_owned()));
    // The AHP socket: another site's page may not open it; this host's own page may.
    let upgrade = |origin: &'static str| {
        http.get(format!("http://{addr}/v1/ahp"))
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header(ORIGIN, origin)
            .send()
    };
    assert_eq!(upgrade("http://evil.example").await.unwrap().status().as_u16(), 403);
    let own = format!("http://{addr}");
    let own: &'static str = Box::leak(own.into_boxed_str());
    assert_eq!(upgrade(own).await.unwrap().status().as_u16(), 101);

    // None of it reached a session; this machine's own JSON request does.
    let page: SessionPage = api.get_ok("/v1/sessions").await;
    assert!(page.sessions.is_empty(), "{page:?}");
    let sent = http
        .post(inputs("mine"))
        .header(CONTENT_TYPE, "application/json")
        .header(ORIGIN, own)
        .body(INPUT)
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status().as_u16(), 202);
    let turn = api.submit_ok("mine-too", &serde_json::from_str(INPUT).unwrap()).await;
    api.wait_turn("mine-too", &turn).await;
    let by_name = http.get(format!("http://localhost:{port}/v1/sessions/mine-too")).send().await.unwrap();
    assert_eq!(by_name.status().as_u16(), 200);
    stop(child);
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_listens_beyond_loopback_without_auth_only_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("refused.log");
    let port = free_port();
    let everywhere = format!("0.0.0.0:{port}");
    let mut child = serve(dir.path(), &["--addr", &everywhere], &log);
    let status = child.wait().unwrap();
    assert!(!status.success(), "{status:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("refusing to listen on 0.0.0.0") && text.contains("allow_anonymous"), "{text}");

    // Allowed: it starts and says what that means.
    let config = dir.path().join("turnstone.toml");
    let demo = turnstone_runtime::config::DEMO_TOML;
    let allowed = demo.replacen("[server]\n", "[server]\nallow_anonymous = true\n", 1);
    assert_ne!(allowed, demo, "the demo configuration has a [server] table");
    std::fs::write(&config, allowed).unwrap();
    let log = dir.path().join("allowed.log");
    let child = serve(dir.path(), &["--config", config.to_str().unwrap(), "--addr", &everywhere], &log);
    let api = ApiClient::new(format!("http://127.0.0.1:{port}"));
    wait_up(&api).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("no [auth]") && text.contains("anyone"), "{text}");
    // Any name reaches it, but still no other site's page.
    let response = api
        .http()
        .post(format!("http://127.0.0.1:{port}/v1/sessions/x/inputs"))
        .header(HOST, format!("box.lan:{port}"))
        .header(ORIGIN, "http://evil.example")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    stop(child);
}
