//! The agent RPC endpoint: decodes the eight verbs and hands them to
//! [`Daemon`]. Authentication happened before any body byte was read (the
//! router's `admit`, from the request head, which also refused any method
//! but POST), and the body was read within the verb's cap ([`max_body`]).

use choir_common::rpc::{
    Ack, ApprovalRequest, FetchDynamicConfigRequest, GetSecretsRequest, GetSecretsResponse, HeartbeatRequest,
    InitHelloRequest, ReportStatusRequest, TerminateSelfRequest, Verb,
};

use crate::daemon::Daemon;
use crate::error::Error;
use crate::http::{Caller, Request, Response};

/// Largest HEARTBEAT body: agents split their replication batches well below
/// it (see `choir_common::rpc::MAX_BATCH_BYTES`).
pub const MAX_RPC_BODY: usize = 8 * 1024 * 1024;

/// The largest body each verb takes.
pub fn max_body(verb: Verb) -> usize {
    match verb {
        Verb::Heartbeat => MAX_RPC_BODY,
        Verb::RequestApproval | Verb::ExecuteHostTool => 2 * 1024 * 1024,
        Verb::ReportStatus => choir_common::rpc::MAX_STATUS_BYTES,
        Verb::InitHello | Verb::GetSecrets | Verb::TerminateSelf | Verb::FetchDynamicConfig => 64 * 1024,
    }
}

/// Answers `POST /rpc/v1/<VERB>` for `who`, authenticated at admission.
pub fn handle(d: &Daemon, verb: Verb, who: &Caller, req: &Request) -> Result<Response, Error> {
    match verb {
        Verb::InitHello => Ok(Response::ok(&d.init_hello(who, &req.json::<InitHelloRequest>()?)?)),
        Verb::GetSecrets => {
            let r: GetSecretsRequest = req.json()?;
            Ok(Response::ok(&GetSecretsResponse { secrets: d.get_secrets(who, &r.names)? }))
        }
        Verb::Heartbeat => Ok(Response::ok(&d.heartbeat(who, &req.json::<HeartbeatRequest>()?)?)),
        Verb::ReportStatus => {
            d.report_status(who, req.json::<ReportStatusRequest>()?);
            Ok(Response::ok(&Ack { ok: true }))
        }
        Verb::TerminateSelf => {
            let r: TerminateSelfRequest = req.json()?;
            d.terminate_self(who, &r.reason)?;
            Ok(Response::ok(&Ack { ok: true }))
        }
        Verb::FetchDynamicConfig => {
            let _: FetchDynamicConfigRequest = req.json()?;
            Ok(Response::ok(&d.dynamic_config(&who.agent)))
        }
        Verb::RequestApproval => Ok(Response::ok(&d.request_approval(who, &req.json::<ApprovalRequest>()?)?)),
        Verb::ExecuteHostTool => {
            Ok(Response::ok(&d.execute_host_tool(who, &req.json::<choir_common::rpc::ExecuteHostToolRequest>()?)?))
        }
    }
}
