//! `turnstone smoke`, the check a user runs after `sam deploy` (README "Deploy to AWS"): the
//! real binary against `turnstone serve`, and against the template's functions under their IAM
//! roles (`turnstone_tests::topology`), the nearest this machine has to a deployed stack; and
//! a step that fails is named.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use turnstone_tests::topology::Deployed;
use turnstone_tests::topology::template::Template;

/// `turnstone smoke` with `args`, run off the test's runtime (which serves the stack).
async fn smoke(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_turnstone"))
            .arg("smoke")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn passed(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "smoke failed: {stdout}\n{stderr}");
    for step in [
        "healthz",
        "create session",
        "open the event stream",
        "submit a message",
        "the stream shows the turn end",
        "the turn completed",
        "dispose the session",
        "smoke test passed",
    ] {
        assert!(stdout.contains(step), "no step {step:?} in: {stdout}");
    }
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_passes_against_turnstone_serve_and_names_the_step_that_fails() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_turnstone"))
        .args(["serve", "--addr", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir.path().join("data"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(started.elapsed() < Duration::from_secs(30), "serve did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    passed(&smoke(&["--url", &url]).await);

    let failed = smoke(&["--url", &url, "--agent", "no-such-agent"]).await;
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success());
    assert!(stderr.contains("step `create session`") && stderr.contains("no-such-agent"), "{stderr}");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_passes_against_the_templates_functions() {
    let config = "[llm.s]\ntype = \"scripted\"\n\n[agent.demo]\nmodel = \"scripted\"\nllm = \"s\"\n";
    let deployed = Deployed::start(config, |_| None, &Template::load().unwrap()).await.unwrap();
    let (url, stream_url) = (deployed.url().to_owned(), deployed.stream_url().to_owned());
    // As README "Deploy to AWS" runs it: the stream at the stream function's URL.
    passed(&smoke(&["--url", &url, "--stream-url", &stream_url]).await);
    // And with the stream on the HTTP API, which answers it as long-polls: each response
    // ends once it carries news, and the stream step resumes after its last event.
    passed(&smoke(&["--url", &url]).await);
    let refused = deployed.refused();
    assert!(refused.is_empty(), "{refused:#?}");
}
