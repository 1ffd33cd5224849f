//! Building what goes over the wire from the session: the `DecisionRequest` of the live
//! decision and the `LlmRequest` of an LLM call.

use std::num::NonZeroUsize;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Session;
use super::context::ViewOptions;
use super::records::{CallRecord, CallSpec, PathRef};
use crate::ids::TurnId;
use crate::protocol::*;

/// How much of the conversation a `DecisionRequest` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transcript {
    /// The protocol's request: the whole active path as `messages`, every recorded node as
    /// `message_tree`.
    #[default]
    Whole,
    /// The last messages of the active path (at most this many), and their nodes as the tree.
    Last(NonZeroUsize),
}

impl Transcript {
    pub fn is_whole(&self) -> bool {
        *self == Transcript::Whole
    }
}

impl Session {
    /// The `DecisionRequest` for the live decision, as it is delivered now.
    pub fn decision_request(&self) -> Option<DecisionRequest> {
        self.decision_request_with(Transcript::Whole)
    }

    /// [`Session::decision_request`] carrying `transcript` of the conversation: the whole of it
    /// as the protocol says, or the end of the active path for a worker that asked for no more
    /// (so a step's request does not grow with the session). The window applies wherever the
    /// request spells out recorded messages: `messages`, `message_tree`, and the recorded
    /// part of a `client.messages` view in the trigger and the proposal (the news is whole).
    pub fn decision_request_with(&self, transcript: Transcript) -> Option<DecisionRequest> {
        let d = self.decision.as_ref()?;
        let (messages, message_tree) = match transcript {
            Transcript::Whole => {
                (self.tree.active_path().into_iter().cloned().collect(), self.tree.to_wire())
            }
            Transcript::Last(n) => self.last_messages(n.get()),
        };
        Some(DecisionRequest {
            session_id: self.id.clone(),
            decision_id: d.id.clone(),
            agent_id: self.agent_id().to_owned(),
            identity: self.identity(),
            trigger: d.wire_trigger(&self.tree, transcript),
            proposed: d.wire_proposal(&self.tree, transcript),
            state: self.current_state(),
            agent: self.layered_agent(d.turn_id.as_ref()),
            calls: self.calls.iter().map(|c| self.wire_call(c)).collect(),
            pending_calls: self.pending_calls(),
            messages,
            message_tree,
            ancestry: self.ancestry(),
            attempts: d.attempts,
            deadline: d.deadline.map(|t| t.to_rfc3339()),
            turn_id: d.turn_id.clone(),
        })
    }

    /// Where a worker's answer to a request carrying `transcript` reads from (`None`: the
    /// root, as the protocol's whole-conversation answer does). An answer to a window reads
    /// from the recorded parent of its first message when that message is a recorded one (an
    /// echo of the window, or of a client view's), else from where the window starts: so an
    /// echo continues at the head as the whole path's would, and never forks the
    /// conversation for lack of the messages the worker was not sent.
    pub fn answer_base(&self, response: &DecisionResponse, transcript: Transcript) -> Option<PathRef> {
        let Transcript::Last(n) = transcript else { return None };
        let first = response.messages.as_deref()?.iter().find(|m| m.role != Role::System)?;
        let head = match first.id.as_ref().and_then(|id| self.tree.get(id)) {
            Some(recorded) => recorded.parent_id.clone(),
            None => self
                .tree
                .path_end(self.tree.head(), n.get())
                .0
                .first()
                .and_then(|node| node.parent_id.clone()),
        };
        Some(PathRef { head })
    }

    /// The last `n` messages of the active path, and the tree of just their nodes (the first
    /// one's `parent_id` names the message before them): costs `n`, not the transcript.
    fn last_messages(&self, n: usize) -> (Vec<Message>, MessageTree) {
        let (end, _) = self.tree.path_end(self.tree.head(), n);
        let nodes: Vec<TreeNode> = end.into_iter().cloned().collect();
        let messages = nodes.iter().map(|node| node.message.clone()).collect();
        (messages, MessageTree { nodes, head_id: self.tree.head().cloned() })
    }

    /// A call as a decision sees it.
    pub fn wire_call(&self, c: &CallRecord) -> Call {
        let mut call = Call {
            id: c.id.clone(),
            kind: c.kind(),
            status: c.status,
            attempt: c.attempt,
            deadline: c.deadline.map(|t| t.to_rfc3339()),
            anchor: c.anchor.clone(),
            name: None,
            arguments: None,
            handler: None,
            stream: None,
            agent_id: None,
            session_id: None,
        };
        match &c.spec {
            CallSpec::ToolCall { name, arguments, handler } => {
                call.name = Some(name.clone());
                call.arguments = Some(arguments.clone());
                call.handler = Some((*handler).into());
            }
            CallSpec::LlmCall { handler, stream, .. } => {
                call.handler = Some((*handler).into());
                call.stream = Some(*stream);
            }
            CallSpec::SubAgent { agent_id, session_id } => {
                call.agent_id = Some(agent_id.clone());
                call.session_id = Some(session_id.clone());
            }
        }
        call
    }

    /// The request of an LLM call's next attempt: explicit messages as given, otherwise the
    /// system prompt and the model's view of the conversation from the root to the call's
    /// anchor (compaction markers applied, [`Session::model_view`]).
    pub fn llm_request(&self, call: &CallRecord) -> Option<LlmRequest> {
        self.llm_request_with(call, &ViewOptions::default())
    }

    /// [`Session::llm_request`] with the view's tool results cut as `view` says.
    pub fn llm_request_with(&self, call: &CallRecord, view: &ViewOptions) -> Option<LlmRequest> {
        let CallSpec::LlmCall { action, system, agent, .. } = &call.spec else { return None };
        // The config the call refers to: without a worker the declared one for good, with one
        // the version it names (records written before kept copies, which are equal).
        let config = match agent {
            _ if !self.has_worker() => Some(self.current_agent()),
            Some(version) => Some(self.agent_version(*version)),
            None => None,
        };
        let (system, tools) = match config {
            Some(config) => (
                config.and_then(|c| c.system.clone()),
                action.tools.clone().or_else(|| self.tools_offered_by(config, call.turn_id.as_ref())),
            ),
            None => (system.clone(), action.tools.clone()),
        };
        let messages = match &action.messages {
            Some(explicit) => explicit.iter().cloned().map(Arc::new).collect(),
            None => {
                let mut messages: Vec<Arc<DraftMessage>> =
                    system.into_iter().map(|s| Arc::new(DraftMessage::text(Role::System, s))).collect();
                messages.extend(self.model_view(call.anchor.as_ref(), view));
                messages
            }
        };
        Some(LlmRequest {
            model: action.model.clone()?,
            messages,
            tools,
            temperature: action.temperature,
            max_completion_tokens: action.max_completion_tokens,
            reasoning: action.reasoning.clone(),
            cache: None,
            thinking_form: None,
        })
    }

    /// The tools a model call offers when its action names none: the agent's tools, one tool
    /// per sub-agent (taking a `message`), and the client tools the turn brought.
    pub fn offered_tools(&self, turn_id: Option<&TurnId>) -> Option<Vec<LlmTool>> {
        self.tools_offered_by(self.current_agent(), turn_id)
    }

    /// [`Session::offered_tools`] with the tools and sub-agents of `agent`.
    fn tools_offered_by(
        &self,
        agent: Option<&AgentConfig>,
        turn_id: Option<&TurnId>,
    ) -> Option<Vec<LlmTool>> {
        let mut tools = Vec::new();
        let client_tools = self.client_tools(turn_id);
        let declared = agent.map(AgentConfig::tools).unwrap_or_default();
        for tool in
            declared.iter().chain(client_tools.iter().filter(|c| !declared.iter().any(|d| d.name == c.name)))
        {
            tools.push(LlmTool {
                name: tool.name.clone(),
                description: tool.description.clone().unwrap_or_default(),
                input: tool.input.clone(),
                output: tool.output.clone(),
            });
        }
        for sub in agent.map(AgentConfig::sub_agents).unwrap_or_default() {
            tools.push(LlmTool {
                name: sub.id.clone(),
                description: sub
                    .description
                    .clone()
                    .unwrap_or_else(|| format!("Delegate a task to the {} agent.", sub.id)),
                input: Some(json!({
                    "type": "object",
                    "properties": {"message": {"type": "string", "description": "The task for the agent."}},
                    "required": ["message"]
                })),
                output: None,
            });
        }
        (!tools.is_empty()).then_some(tools)
    }
}
