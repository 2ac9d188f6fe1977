//! The agent RPC endpoint: decodes the eight verbs and hands them to
//! [`Daemon`]. Authentication happens before any body is looked at.

use choir_common::rpc::{
    Ack, ApprovalRequest, FetchDynamicConfigRequest, GetSecretsRequest, GetSecretsResponse, HeartbeatRequest,
    InitHelloRequest, ReportStatusRequest, TerminateSelfRequest, Verb,
};

use crate::daemon::{Daemon, RateClass};
use crate::http::{ApiError, ListenerKind, Request, Response};

/// Largest RPC body (HEARTBEATs carry batches of events).
pub const MAX_RPC_BODY: usize = 8 * 1024 * 1024;

/// Answers `POST /rpc/v1/<VERB>`.
pub fn handle(d: &Daemon, kind: &ListenerKind, verb: Verb, req: &Request) -> Result<Response, ApiError> {
    let who = d.authenticate(kind, req.bearer.as_deref(), verb.name(), RateClass::Verb)?;
    if req.method != "POST" {
        return Err(ApiError::BadRequest(format!("{} must be POSTed", verb.name())));
    }
    if req.body.len() > MAX_RPC_BODY {
        return Err(ApiError::PayloadTooLarge(format!("{} body over {MAX_RPC_BODY} bytes", verb.name())));
    }
    match verb {
        Verb::InitHello => Ok(Response::ok(&d.init_hello(&who, &req.json::<InitHelloRequest>()?)?)),
        Verb::GetSecrets => {
            let r: GetSecretsRequest = req.json()?;
            Ok(Response::ok(&GetSecretsResponse { secrets: d.get_secrets(&who, &r.names)? }))
        }
        Verb::Heartbeat => Ok(Response::ok(&d.heartbeat(&who, &req.json::<HeartbeatRequest>()?)?)),
        Verb::ReportStatus => {
            d.report_status(&who, req.json::<ReportStatusRequest>()?);
            Ok(Response::ok(&Ack { ok: true }))
        }
        Verb::TerminateSelf => {
            let r: TerminateSelfRequest = req.json()?;
            d.terminate_self(&who, &r.reason)?;
            Ok(Response::ok(&Ack { ok: true }))
        }
        Verb::FetchDynamicConfig => {
            let _: FetchDynamicConfigRequest = req.json()?;
            Ok(Response::ok(&d.dynamic_config(&who.agent)))
        }
        Verb::RequestApproval => Ok(Response::ok(&d.request_approval(&who, &req.json::<ApprovalRequest>()?)?)),
        Verb::ExecuteHostTool => {
            Ok(Response::ok(&d.execute_host_tool(&who, &req.json::<choir_common::rpc::ExecuteHostToolRequest>()?)?))
        }
    }
}
