//! Host tools (R-TOOL-5b): tools that choird runs on the agent's behalf
//! (memory, web, browser, mail, Notion, speech), reached with EXECUTE_HOST_TOOL. The
//! arbiter treats them like any other tool — schema, allowlist, locks, commit
//! — and only the execution step crosses to the host.

use std::sync::Arc;
use std::time::Instant;

use choir_common::rpc::{ExecuteHostToolRequest, ExecuteHostToolResponse, Verb};
use serde_json::Value;

use super::tool::{ExecContext, Tool, ToolError};
use crate::rpc::{Rpc, RpcError};

/// Runs a host tool (choird, in production).
pub trait HostCaller: Send + Sync {
    /// Calls `tool` with validated `input` for `lane` (call `call_id`), by `deadline`.
    fn call(&self, tool: &str, input: &Value, lane: &str, call_id: &str, deadline: Instant)
        -> Result<Value, ToolError>;
}

impl HostCaller for Rpc {
    fn call(
        &self,
        tool: &str,
        input: &Value,
        lane: &str,
        call_id: &str,
        deadline: Instant,
    ) -> Result<Value, ToolError> {
        let req = ExecuteHostToolRequest {
            tool: tool.to_owned(),
            input: input.clone(),
            lane: lane.to_owned(),
            call_id: Some(call_id.to_owned()),
        };
        let timeout = deadline.saturating_duration_since(Instant::now()).max(std::time::Duration::from_millis(100));
        match Rpc::call::<_, ExecuteHostToolResponse>(self, Verb::ExecuteHostTool, &req, timeout) {
            Ok(r) => Ok(r.result),
            Err(RpcError::Refused { code, message, .. }) => Err(ToolError::new(&code, message)),
            Err(e) => Err(ToolError::new("host_unavailable", e.to_string())),
        }
    }
}

/// A host tool in the registry.
pub struct HostTool {
    name: String,
    caller: Arc<dyn HostCaller>,
}

impl HostTool {
    /// The tool `name`, run through `caller`.
    pub fn new(name: &str, caller: Arc<dyn HostCaller>) -> HostTool {
        HostTool { name: name.to_owned(), caller }
    }
}

impl Tool for HostTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        self.caller.call(&self.name, input, ctx.lane, ctx.call_id, ctx.deadline)
    }
}

/// Stands in for choird where there is none (tests, benchmarks): every call
/// fails, clearly.
pub struct NoHost;

impl HostCaller for NoHost {
    fn call(&self, tool: &str, _: &Value, _: &str, _: &str, _: Instant) -> Result<Value, ToolError> {
        Err(ToolError::new("host_unavailable", format!("{tool} runs on the host, and there is no host here")))
    }
}
