//! Stage 3, the route: the call checked against the *current* policy (a
//! reload that removed a route stops it at the next call, with tokens
//! already issued): the token's tool still uses this resource, one of its
//! routes matches the method and the raw path, the route allows the
//! token's step, and where the route binds variables to details, the
//! path's variables are the token's approved `authorization_details`.

use super::refusal::Refusal;
use super::Call;
use crate::derive::policy::RouteDenial;

/// Checks the call's route; names the route that matched in the call.
pub(super) fn check(call: &mut Call, parts: &http::request::Parts) -> Result<(), Refusal> {
    let rest = call.rest(parts);
    let step = call.who.step.as_deref().unwrap_or_default();
    let route = call
        .policy
        .proxy_route(
            &call.who.tool,
            step,
            &call.resource,
            parts.method.as_str(),
            rest,
        )
        .map_err(Refusal::Route)?;
    // Where the policy binds the route's variables to the approved
    // details, the path must be the approved one.
    let holds = route.details_hold(rest, call.who.authorization_details.as_ref());
    call.route = Some(route.text.clone());
    call.binds = route.bind_request;
    if !holds {
        return Err(Refusal::Route(RouteDenial::DetailsMismatch));
    }
    Ok(())
}
