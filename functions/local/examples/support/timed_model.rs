//! A model provider whose answers are timed, so that a benchmark can tell the model's own time
//! (the scripted model reads the whole conversation, as a real one does) from the engine's.
//! Shared by `bench` and `long_session`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use turnstone_engine::protocol::{LlmRequest, LlmResponse, StreamDelta};
use turnstone_runtime::llm::{ModelProvider, ProviderError};

/// What a timed answer is told to: the request, and how long the model took on it.
pub type OnAnswer = Arc<dyn Fn(&LlmRequest, Duration) + Send + Sync>;

/// `inner`, each answer timed and reported to `on_answer`.
pub struct TimedProvider {
    pub inner: Arc<dyn ModelProvider>,
    pub on_answer: OnAnswer,
}

#[async_trait]
impl ModelProvider for TimedProvider {
    async fn complete(
        &self,
        request: &LlmRequest,
        stream: bool,
        timeout: Option<Duration>,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<LlmResponse, ProviderError> {
        let started = Instant::now();
        let answer = self.inner.complete(request, stream, timeout, on_delta).await;
        (self.on_answer)(request, started.elapsed());
        answer
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}
