//! What a host did, counted from the events it commits: turns started and ended, steps,
//! decision deliveries and their outcomes, model and tool call latency, compactions, tokens and
//! cost (a compaction's summarizing call's included). Every commit passes through
//! [`App`](crate::app::App), so counting there sees every commit this process makes, whichever
//! path made it, and needs no hook in the dispatcher.
//!
//! Two renderings of one set of numbers: the Prometheus text format for `GET /metrics` on the
//! local host ([`Metrics::prometheus`]), and CloudWatch Embedded Metric Format lines on Lambda
//! ([`Metrics::drain_emf`], the increments since the last drain, printed to the log, where
//! CloudWatch turns them into metrics). A client library would give one of the two; both
//! formats are a few lines of text, so the counters are kept here.
//!
//! A call's latency is the time from the commit that started its attempt to the commit that
//! ended it, as this process saw them (an attempt started by another process is counted without
//! a latency).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::{Map, Value, json};
use turnstone_engine::ids::CallId;
use turnstone_engine::llm_format::usage::TokenCounts;
use turnstone_engine::protocol::{CompactionKind, LlmResponse};
use turnstone_engine::session::{CallSpec, CallValue, Event, Session};
use turnstone_engine::time::Timestamp;

/// Upper bounds (seconds) of the latency histogram's buckets.
const BUCKETS: [f64; 14] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];
/// Attempts in flight remembered for their latency (cleared when full: a lost start only
/// loses that attempt's latency).
const STARTS: usize = 10_000;
/// Latencies kept for the next EMF drain (the rest are counted in the histogram only).
const EMF_VALUES: usize = 1_000;
/// The most values one metric of one EMF line may carry (the EMF specification: a metric's
/// value array holds at most 100 values); more go out on further lines of the same labels.
const EMF_VALUES_PER_LINE: usize = 100;
/// The CloudWatch namespace of the EMF lines where the deployment names none (the template
/// names one per stage, `Turnstone/<stage>`, so two stages' metrics never add up).
pub const EMF_NAMESPACE: &str = "Turnstone";

/// A metric's labels, in order.
type Labels = Vec<(&'static str, String)>;
/// The labels of a commit's session (its agent) with more after them.
type Label<'a> = &'a dyn Fn(&[(&'static str, String)]) -> Labels;

/// The counters, by metric and labels.
#[derive(Default)]
struct Counts {
    counters: BTreeMap<(&'static str, Labels), u64>,
    /// Cost in pico-dollars, by agent and model.
    cost: BTreeMap<Labels, i128>,
    latency: BTreeMap<Labels, Histogram>,
}

#[derive(Debug, Clone, Default)]
struct Histogram {
    /// Observations at or below each bound of [`BUCKETS`] (not cumulative).
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|b| seconds <= *b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }
}

/// A call attempt this process saw start.
struct Started {
    kind: &'static str,
    at: Timestamp,
}

/// The token kinds, in the engine's one vocabulary ([`TokenCounts`]) whichever provider
/// counted them: the only `kind` labels (a reply is not trusted to name metrics, so labels
/// stay bounded).
fn token_kinds(counts: &TokenCounts) -> [(&'static str, u64); 5] {
    [
        ("input", counts.input),
        ("output", counts.output),
        ("cache_read", counts.cache_read),
        ("cache_write", counts.cache_write),
        ("reasoning", counts.reasoning),
    ]
}

/// The model label of a call whose model is not one the configuration names.
const OTHER_MODEL: &str = "other";

/// The host's counters. Cheap to update (one lock per commit).
#[derive(Default)]
pub struct Metrics {
    /// The model names the configuration gives its agents: the only `model` labels, besides
    /// [`OTHER_MODEL`] (a reply's `model` and a worker's choice are not trusted to name one).
    models: std::collections::BTreeSet<String>,
    /// Since the process started (Prometheus).
    total: Mutex<Counts>,
    /// Since the last EMF drain, with the latencies themselves.
    pending: Mutex<(Counts, BTreeMap<Labels, Vec<f64>>)>,
    /// Whether anything drains EMF lines (a Lambda function does; the local host serves
    /// Prometheus only): until then a commit keeps one set of counters, not two.
    emf: std::sync::atomic::AtomicBool,
    started: Mutex<HashMap<(String, CallId, u32), Started>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Counters only: a panic elsewhere leaves them usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What one commit adds.
#[derive(Default)]
struct Delta {
    counters: Vec<(&'static str, Labels)>,
    tokens: Vec<(Labels, u64)>,
    cost: Vec<(Labels, i128)>,
    latency: Vec<(Labels, f64)>,
}

impl Metrics {
    /// Counters whose `model` labels are among `models` (the configured agents' models).
    pub fn for_models(models: impl IntoIterator<Item = String>) -> Self {
        Metrics { models: models.into_iter().collect(), ..Metrics::default() }
    }

    /// Keeps the increments for [`Metrics::drain_emf`] from now on (a host that writes EMF
    /// lines says so before its first commit).
    pub fn collect_emf(&self) {
        self.emf.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The `model` label of LLM call `call_id` of `session`: the model it asked for, if the
    /// configuration names it.
    fn model_label(&self, session: &Session, call_id: &CallId) -> String {
        let asked = session.call(call_id).and_then(|call| match &call.spec {
            CallSpec::LlmCall { action, .. } => action.model.clone(),
            _ => None,
        });
        let asked = asked.or_else(|| session.current_agent().map(|agent| agent.model.clone()));
        asked.filter(|model| self.models.contains(model)).unwrap_or_else(|| OTHER_MODEL.to_owned())
    }

    /// Counts the events of one commit of `session`, committed at `now`.
    pub fn observe(&self, session: &Session, events: &[Event], now: Timestamp) {
        let agent = session.agent_id().to_owned();
        let label = |extra: &[(&'static str, String)]| -> Labels {
            let mut labels = vec![("agent", agent.clone())];
            labels.extend(extra.iter().cloned());
            labels
        };
        let mut delta = Delta::default();
        for event in events {
            match event {
                Event::TurnStarted { .. } | Event::TurnActivated { .. } => {
                    delta.counters.push(("turnstone_turns_started_total", label(&[])));
                }
                Event::TurnEnded { status, .. } => {
                    let status =
                        serde_json::to_value(status).ok().and_then(|v| v.as_str().map(str::to_owned));
                    let status = status.unwrap_or_else(|| "unknown".to_owned());
                    delta.counters.push(("turnstone_turns_ended_total", label(&[("status", status)])));
                }
                // A step of the loop: a decision for a worker, or in a session without one, a
                // model call the engine makes (its steps write no decision).
                Event::DecisionOpened { .. } if session.has_worker() => {
                    delta.counters.push(("turnstone_steps_total", label(&[])));
                }
                Event::CallCreated { call }
                    if !session.has_worker() && matches!(call.spec, CallSpec::LlmCall { .. }) =>
                {
                    delta.counters.push(("turnstone_steps_total", label(&[])));
                }
                Event::DecisionDispatched { .. } => {
                    delta.counters.push(("turnstone_decision_deliveries_total", label(&[])));
                }
                Event::DecisionRetryScheduled { .. } => delta.counters.push(decided(&label, "retried")),
                Event::DecisionResolved { .. } => delta.counters.push(decided(&label, "resolved")),
                Event::DecisionFailed { .. } => delta.counters.push(decided(&label, "failed")),
                Event::CallDispatched { call_id, attempt, .. } => {
                    let kind = session.call(call_id).map_or("unknown", |c| kind_of(&c.spec));
                    let mut started = lock(&self.started);
                    if started.len() >= STARTS {
                        started.clear();
                    }
                    started.insert(
                        (session.id().to_string(), call_id.clone(), *attempt),
                        Started { kind, at: now },
                    );
                }
                Event::CallRetryScheduled { call_id, attempt, .. } => {
                    self.attempt_ended(session, call_id, *attempt, None, "retried", now, &label, &mut delta);
                }
                Event::CallSettled { call_id, attempt, outcome, .. } => {
                    let result = if outcome.is_ok() { "ok" } else { "error" };
                    let value = outcome.as_ref().ok();
                    self.attempt_ended(session, call_id, *attempt, value, result, now, &label, &mut delta);
                    if let Some(CallValue::Llm(response)) = value {
                        let labels = label(&[("model", self.model_label(session, call_id))]);
                        model_usage(labels, response, &mut delta);
                    }
                }
                // A summary's model call is recorded on the compaction, not settled as a call:
                // its tokens and cost count as a model call's do, under the reply's model if the
                // configuration names it, else the model of the call it was made for (which
                // summarizes unless `[agent.<id>.compaction] model` names another).
                Event::ContextCompacted { call_id, kind, response, reason, .. } => {
                    // Labels stay bounded: the engine writes one of two reasons.
                    let reason = if matches!(reason.as_str(), "threshold" | "refused") {
                        reason.as_str()
                    } else {
                        "other"
                    };
                    let labels =
                        label(&[("kind", compaction_kind(*kind).to_owned()), ("reason", reason.to_owned())]);
                    delta.counters.push(("turnstone_compactions_total", labels));
                    if let Some(response) = response {
                        let model = Some(&response.model)
                            .filter(|model| self.models.contains(*model))
                            .cloned()
                            .unwrap_or_else(|| self.model_label(session, call_id));
                        model_usage(label(&[("model", model)]), response, &mut delta);
                    }
                }
                _ => {}
            }
        }
        if delta.counters.is_empty() {
            return;
        }
        apply(&mut lock(&self.total), &delta);
        if !self.emf.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut pending = lock(&self.pending);
        apply(&mut pending.0, &delta);
        for (labels, seconds) in delta.latency {
            let values = pending.1.entry(labels).or_default();
            if values.len() < EMF_VALUES {
                values.push(seconds);
            }
        }
    }

    /// One attempt of a call ended (`result`: ok, error, retried).
    #[allow(clippy::too_many_arguments)] // the parts of one observation, all needed
    fn attempt_ended(
        &self,
        session: &Session,
        call_id: &CallId,
        attempt: u32,
        value: Option<&CallValue>,
        result: &str,
        now: Timestamp,
        label: Label<'_>,
        delta: &mut Delta,
    ) {
        let started = lock(&self.started).remove(&(session.id().to_string(), call_id.clone(), attempt));
        let kind = match (&started, value) {
            (Some(s), _) => s.kind,
            (None, Some(CallValue::Llm(_))) => "llm",
            (None, _) => session.call(call_id).map_or("unknown", |c| kind_of(&c.spec)),
        };
        let labels = label(&[("kind", kind.to_owned()), ("result", result.to_owned())]);
        delta.counters.push(("turnstone_call_attempts_total", labels));
        if let Some(started) = started {
            let seconds = (now.0 - started.at.0).max(0) as f64 / 1000.0;
            delta.latency.push((label(&[("kind", kind.to_owned())]), seconds));
        }
    }

    /// The counters in the Prometheus text format, with the gauge of sessions with work due
    /// (`due`, read from the store by the caller).
    pub fn prometheus(&self, due: usize) -> String {
        let counts = lock(&self.total);
        let mut out = String::new();
        let mut last = "";
        // Tokens are among the counters but rendered apart, below (once: a family's lines
        // must not repeat).
        for ((name, labels), n) in counts.counters.iter().filter(|((name, _), _)| *name != TOKENS) {
            if *name != last {
                let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} counter", help(name));
                last = name;
            }
            let _ = writeln!(out, "{name}{} {n}", render(labels));
        }
        if !counts.tokens_empty() {
            let name = "turnstone_tokens_total";
            let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} counter", help(name));
            for (labels, n) in counts.tokens() {
                let _ = writeln!(out, "{name}{} {n}", render(labels));
            }
        }
        if !counts.cost.is_empty() {
            let name = "turnstone_cost_dollars_total";
            let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} counter", help(name));
            for (labels, picodollars) in &counts.cost {
                let _ = writeln!(out, "{name}{} {}", render(labels), *picodollars as f64 / 1e12);
            }
        }
        if !counts.latency.is_empty() {
            let name = "turnstone_call_seconds";
            let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} histogram", help(name));
            for (labels, h) in &counts.latency {
                let mut cumulative = 0;
                for (bound, n) in BUCKETS.iter().zip(h.buckets) {
                    cumulative += n;
                    let mut labels = labels.clone();
                    labels.push(("le", bound.to_string()));
                    let _ = writeln!(out, "{name}_bucket{} {cumulative}", render(&labels));
                }
                let mut labels_inf = labels.clone();
                labels_inf.push(("le", "+Inf".to_owned()));
                let _ = writeln!(out, "{name}_bucket{} {}", render(&labels_inf), h.count);
                let _ = writeln!(out, "{name}_sum{} {}", render(labels), h.sum);
                let _ = writeln!(out, "{name}_count{} {}", render(labels), h.count);
            }
        }
        let name = "turnstone_sessions_due";
        let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} gauge\n{name} {due}", help(name));
        out
    }

    /// The increments since the last drain as CloudWatch Embedded Metric Format lines (one
    /// JSON object per set of dimensions), and resets them.
    pub fn drain_emf(&self, namespace: &str, now: Timestamp) -> Vec<String> {
        let (counts, latencies) = std::mem::take(&mut *lock(&self.pending));
        // One line per set of labels, each metric of that set a field of it.
        let mut lines: BTreeMap<Labels, Map<String, Value>> = BTreeMap::new();
        let mut units: BTreeMap<Labels, Vec<(String, &'static str)>> = BTreeMap::new();
        let mut put = |labels: &Labels, name: String, value: Value, unit: &'static str| {
            lines.entry(labels.clone()).or_default().insert(name.clone(), value);
            units.entry(labels.clone()).or_default().push((name, unit));
        };
        for ((name, labels), n) in counts.counters.iter().filter(|((name, _), _)| *name != TOKENS) {
            put(labels, emf_name(name), json!(n), "Count");
        }
        for (labels, n) in counts.tokens() {
            put(labels, "Tokens".to_owned(), json!(n), "Count");
        }
        for (labels, picodollars) in &counts.cost {
            put(labels, "CostDollars".to_owned(), json!(*picodollars as f64 / 1e12), "None");
        }
        // Latencies past a line's share: lines of their own, with only them.
        let mut more: Vec<(Labels, Value)> = Vec::new();
        for (labels, values) in &latencies {
            let mut chunks = values.chunks(EMF_VALUES_PER_LINE);
            if let Some(first) = chunks.next() {
                put(labels, "CallSeconds".to_owned(), json!(first), "Seconds");
            }
            more.extend(chunks.map(|chunk| (labels.clone(), json!(chunk))));
        }
        let line = |labels: Labels, mut fields: Map<String, Value>, units: &[(String, &'static str)]| {
            let metrics: Vec<Value> =
                units.iter().map(|(name, unit)| json!({"Name": name, "Unit": unit})).collect();
            let dimensions: Vec<&str> = labels.iter().map(|(k, _)| *k).collect();
            for (k, v) in &labels {
                fields.insert((*k).to_owned(), json!(v));
            }
            fields.insert(
                "_aws".to_owned(),
                json!({"Timestamp": now.0, "CloudWatchMetrics": [{
                    "Namespace": namespace, "Dimensions": [dimensions], "Metrics": metrics,
                }]}),
            );
            Value::Object(fields).to_string()
        };
        let mut out: Vec<String> = lines
            .into_iter()
            .map(|(labels, fields)| {
                let units = units.get(&labels).cloned().unwrap_or_default();
                line(labels, fields, &units)
            })
            .collect();
        let seconds = [("CallSeconds".to_owned(), "Seconds")];
        out.extend(more.into_iter().map(|(labels, values)| {
            line(labels, Map::from_iter([("CallSeconds".to_owned(), values)]), &seconds)
        }));
        out
    }
}

impl Counts {
    fn tokens_empty(&self) -> bool {
        !self.counters.keys().any(|(name, _)| *name == TOKENS)
    }

    /// Tokens are kept among the counters under [`TOKENS`]; rendered apart.
    fn tokens(&self) -> impl Iterator<Item = (&Labels, &u64)> {
        self.counters.iter().filter(|((name, _), _)| *name == TOKENS).map(|((_, labels), n)| (labels, n))
    }
}

const TOKENS: &str = "turnstone_tokens_total";

fn apply(counts: &mut Counts, delta: &Delta) {
    for key in &delta.counters {
        *counts.counters.entry(key.clone()).or_default() += 1;
    }
    for (labels, n) in &delta.tokens {
        *counts.counters.entry((TOKENS, labels.clone())).or_default() += n;
    }
    for (labels, picodollars) in &delta.cost {
        *counts.cost.entry(labels.clone()).or_default() += picodollars;
    }
    for (labels, seconds) in &delta.latency {
        counts.latency.entry(labels.clone()).or_default().observe(*seconds);
    }
}

/// The tokens and cost of a model's reply, under `labels` (its agent and model).
fn model_usage(labels: Labels, response: &LlmResponse, delta: &mut Delta) {
    let counts = response.usage.as_ref().map(TokenCounts::of).unwrap_or_default();
    // Input and output always, once anything was counted; the others where the provider
    // reports them.
    for (kind, n) in token_kinds(&counts) {
        if !counts.is_empty() && (n > 0 || matches!(kind, "input" | "output")) {
            let mut labels = labels.clone();
            labels.push(("kind", kind.to_owned()));
            delta.tokens.push((labels, n));
        }
    }
    let mut usage = turnstone_engine::session::Usage::default();
    usage.add(None, response.cost.as_deref());
    if usage.cost_picodollars != 0 {
        delta.cost.push((labels, usage.cost_picodollars));
    }
}

/// The `kind` label of a compaction: the protocol's name of its kind.
fn compaction_kind(kind: CompactionKind) -> &'static str {
    match kind {
        CompactionKind::Summary => "summary",
        CompactionKind::ClearedToolResults => "cleared_tool_results",
    }
}

fn decided(label: Label<'_>, outcome: &str) -> (&'static str, Labels) {
    ("turnstone_decision_outcomes_total", label(&[("outcome", outcome.to_owned())]))
}

fn kind_of(spec: &CallSpec) -> &'static str {
    match spec {
        CallSpec::LlmCall { .. } => "llm",
        CallSpec::ToolCall { .. } => "tool",
        CallSpec::SubAgent { .. } => "sub_agent",
    }
}

fn help(name: &str) -> &'static str {
    match name {
        "turnstone_turns_started_total" => "Turns started (queued turns when they start).",
        "turnstone_turns_ended_total" => "Turns ended, by status.",
        "turnstone_steps_total" => {
            "Steps of the agent loop: decisions for a worker, or the engine's model calls."
        }
        "turnstone_decision_deliveries_total" => "Deliveries of decisions to workers (attempts).",
        "turnstone_decision_outcomes_total" => "Outcomes of delivered decisions: resolved, retried, failed.",
        "turnstone_call_attempts_total" => "Ended attempts of model, tool and sub-agent calls, by result.",
        "turnstone_compactions_total" => {
            "Compactions of a model's view of the conversation, by kind (summary, \
             cleared_tool_results) and reason (threshold, refused)."
        }
        "turnstone_tokens_total" => "Model tokens, by agent, model and the provider's usage field.",
        "turnstone_cost_dollars_total" => {
            "Model cost in dollars, by agent and model (where prices are known)."
        }
        "turnstone_call_seconds" => {
            "Call attempt latency, from the commit that started it to the one that ended it."
        }
        "turnstone_sessions_due" => "Sessions whose wake time has passed (work due now).",
        _ => "",
    }
}

/// `turnstone_turns_started_total` -> `TurnsStarted`.
fn emf_name(name: &str) -> String {
    let base = name.trim_start_matches("turnstone_").trim_end_matches("_total");
    base.split('_')
        .map(|w| {
            let mut chars = w.chars();
            chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
        })
        .collect()
}

/// `{agent="demo",status="completed"}`, values escaped as the text format says.
fn render(labels: &Labels) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
        })
        .collect();
    format!("{{{}}}", parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstone_engine::protocol::CompactionKind;

    /// A model's reply from `model`: 900 prompt and 100 completion tokens, one cent.
    fn response(model: &str) -> LlmResponse {
        serde_json::from_value(json!({
            "model": model,
            "content": "the summary",
            "usage": {"prompt_tokens": 900, "completion_tokens": 100},
            "cost": "0.01",
        }))
        .unwrap()
    }

    fn compacted(kind: CompactionKind, response: Option<LlmResponse>, reason: &str) -> Event {
        Event::ContextCompacted {
            call_id: "llm_1".into(),
            attempt: 1,
            marker_id: "msg_marker".into(),
            kind,
            through: "msg_1".into(),
            response,
            tokens_before: 12_000,
            tokens_after: 3_000,
            reason: reason.into(),
            at: Timestamp(0),
        }
    }

    /// The lines of `text` naming `metric`, without the comments.
    fn lines<'a>(text: &'a str, metric: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(metric)).collect()
    }

    #[test]
    fn a_compaction_counts_by_kind_and_its_summary_counts_tokens_and_cost_as_a_model_call_does() {
        let session = Session::new("s");
        let compactions = Metrics::for_models(["summarizer".to_owned()]);
        compactions.collect_emf();
        compactions.observe(
            &session,
            &[
                compacted(CompactionKind::Summary, Some(response("summarizer")), "threshold"),
                compacted(CompactionKind::ClearedToolResults, None, "refused"),
                compacted(CompactionKind::Summary, Some(response("unconfigured")), "whatever"),
            ],
            Timestamp(0),
        );
        let text = compactions.prometheus(0);
        assert_eq!(
            lines(&text, "turnstone_compactions_total"),
            [
                r#"turnstone_compactions_total{agent="",kind="cleared_tool_results",reason="refused"} 1"#,
                r#"turnstone_compactions_total{agent="",kind="summary",reason="other"} 1"#,
                r#"turnstone_compactions_total{agent="",kind="summary",reason="threshold"} 1"#,
            ]
        );
        for family in
            ["turnstone_compactions_total", "turnstone_tokens_total", "turnstone_cost_dollars_total"]
        {
            let typed = format!("# TYPE {family} counter");
            assert_eq!(text.lines().filter(|l| *l == typed).count(), 1, "{family} is typed once: {text}");
        }
        // Under the configured model its reply names, else the call's (here unknown: `other`).
        assert_eq!(
            lines(&text, "turnstone_tokens_total"),
            [
                r#"turnstone_tokens_total{agent="",model="other",kind="input"} 900"#,
                r#"turnstone_tokens_total{agent="",model="other",kind="output"} 100"#,
                r#"turnstone_tokens_total{agent="",model="summarizer",kind="input"} 900"#,
                r#"turnstone_tokens_total{agent="",model="summarizer",kind="output"} 100"#,
            ]
        );
        assert_eq!(
            lines(&text, "turnstone_cost_dollars_total"),
            [
                r#"turnstone_cost_dollars_total{agent="",model="other"} 0.01"#,
                r#"turnstone_cost_dollars_total{agent="",model="summarizer"} 0.01"#,
            ]
        );
        // The same reply settling a model call counts the same tokens and cost.
        let calls = Metrics::for_models(["summarizer".to_owned()]);
        let settled = Event::CallSettled {
            call_id: "llm_2".into(),
            attempt: 1,
            outcome: Ok(CallValue::Llm(response("unconfigured"))),
            at: None,
        };
        calls.observe(&session, &[settled], Timestamp(0));
        let called = calls.prometheus(0);
        for metric in ["turnstone_tokens_total", "turnstone_cost_dollars_total"] {
            let other =
                |text| lines(text, metric).into_iter().filter(|l| l.contains("other")).collect::<Vec<_>>();
            assert_eq!(other(&called), other(&text), "{metric}");
        }
        // No attempt of a call ended: a compaction is none.
        assert!(lines(&text, "turnstone_call_attempts_total").is_empty());
        let emf: Vec<Value> = compactions
            .drain_emf(EMF_NAMESPACE, Timestamp(0))
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(
            emf.iter().any(|l| l["Compactions"] == 1 && l["kind"] == "summary" && l["reason"] == "threshold")
        );
        for line in &emf {
            let metrics = line["_aws"]["CloudWatchMetrics"][0]["Metrics"].as_array().unwrap();
            let mut names: Vec<String> = metrics.iter().map(|m| m["Name"].to_string()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), metrics.len(), "a metric is named once a line: {line}");
        }
    }

    #[test]
    fn no_emf_line_carries_more_than_100_values_of_a_metric() {
        let metrics = Metrics::default();
        {
            let mut pending = lock(&metrics.pending);
            let labels: Labels = vec![("agent", "a".to_owned()), ("kind", "llm".to_owned())];
            pending.1.insert(labels, (0..250).map(f64::from).collect());
        }
        let lines: Vec<Value> = metrics
            .drain_emf(EMF_NAMESPACE, Timestamp(0))
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let counts: Vec<usize> = lines.iter().map(|l| l["CallSeconds"].as_array().unwrap().len()).collect();
        assert_eq!(counts, [100, 100, 50]);
        assert!(
            lines.iter().all(|l| l["agent"] == "a"
                && l["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"] == "CallSeconds")
        );
    }
}
